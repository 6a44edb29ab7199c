//! `chime perf ntp --nts`: authenticated NTP (RFC 8915) under load, NTPv4's or (with
//! `--ntp-version 5`) the NTPv5 draft's, whose NTS-KE agrees on the draft (next protocol 0x8001)
//! and whose requests carry their id in the client cookie, as `ntpv5`'s do.
//!
//! Before the run, NTS-KE gives a pool of sessions (`--nts-sessions`), each with its two keys and
//! the eight cookies the server handed out. The pool is shared out among the sending threads.
//! Each request spends one cookie of the next session in turn and asks for as many more as the
//! session is short of eight with placeholders, as chronyd and ntpd-rs do; its unique identifier
//! carries the request's id, the session and a tag of this run. Every reply is checked as a
//! client checks it: our identifier, the authenticator under the session's server-to-client key,
//! the header as for plain NTP, and the new cookies inside go back to the session for later
//! requests. A reply that does not verify is invalid.
//!
//! An NTS NAK (the server no longer opens the session's cookies, e.g. after its keys changed) is a
//! refusal. The session is then set aside and a helper thread runs NTS-KE again for it, as a
//! client would; meanwhile the thread's other sessions carry its requests. A session out of
//! cookies (its replies lost) reuses its last cookie, which the server cannot tell, and that is
//! counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chime_ntp::nts::{self, ClientReply, Keys};
use chime_ntp::v5::{self, Draft};
use chime_ntp::{Header, Mode, NtpTimestamp};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustls::ClientConfig;

use super::args::{NtsArgs, usage};
use super::ntp::{NtpLoad, RequestMode, server_times, times};
use super::ntpv5::V5Load;
use super::protocol::{LoadProtocol, ReplyMatch, ServerTimes, Verdict};
use crate::out::outln;

/// The cookies a session holds at most, as clients keep them (RFC 8915 §5.7).
const COOKIES: usize = 8;

/// The longest cookie accepted from a server (RFC 8915 leaves it open; servers use about 100).
const MAX_COOKIE: usize = 256;

/// NTS-KE sessions made at once before a run: under the per-address limits servers keep (chimed
/// allows 8 at once from one address).
const AT_ONCE: usize = 4;

/// Tries at one NTS-KE session before a run gives up.
const ATTEMPTS: usize = 3;

/// Replaced sessions kept per thread to check late replies with.
const RETIRED: usize = 64;

/// Offset of the transmit timestamp, which carries the id as for plain NTP.
const TRANSMIT_TS: usize = 40;

/// `chime perf ntp --nts`: NTS-KE for the pool of sessions, then the load; what NTS-KE and the
/// cookies went through is printed after the report.
pub(crate) fn run(a: &super::ntp::Args) -> Result<()> {
    let n = &a.nts;
    let spec = n.nts.as_deref().unwrap_or_default();
    if !matches!(a.ntp_version, 4 | 5) || a.mode != RequestMode::Client {
        usage("--nts: NTS is client mode of NTPv4 or NTPv5 only").exit();
    }
    let v5 = (a.ntp_version == 5).then(|| a.draft());
    if (n.nts_sessions as usize) < a.load.threads {
        usage(format!(
            "--nts-sessions {} is fewer than --threads {}: every thread needs one",
            n.nts_sessions, a.load.threads
        ))
        .exit();
    }
    let timeout = std::time::Duration::from_secs_f64(a.load.timeout.max(2.0));
    let protocol = match v5 {
        Some(_) => nts::Protocol::NtpV5Draft,
        None => nts::Protocol::NtpV4,
    };
    let ke = KeServer::new(n, spec, protocol, timeout)?;
    let started = std::time::Instant::now();
    let shared = Shared::establish(&ke, n.nts_sessions as usize, a.load.threads)?;
    outln!(
        "NTS-KE with {spec}: {} sessions in {:.2} s, cookies of {} bytes, NTP at {}",
        n.nts_sessions,
        started.elapsed().as_secs_f64(),
        shared.cookie_len,
        shared.ntp
    );
    let mut load = a.load.clone();
    load.target.get_or_insert(shared.ntp);
    let placeholders = n.nts_placeholders.map(usize::from);
    let request = serde_json::json!({
        "ntp_version": a.ntp_version,
        "ntpv5_draft": v5.map(Draft::id),
        "mode": 3,
        "nts": {
            "ke_server": spec,
            "sessions": n.nts_sessions,
            "placeholders": placeholders,
            "cookie_len": shared.cookie_len,
        },
    });
    let label = match v5 {
        Some(d) => format!("NTPv5 ({}) mode 3 with NTS", d.id()),
        None => "NTPv4 mode 3 with NTS".to_owned(),
    };
    let nts_load = NtsLoad::new(shared.clone(), placeholders, v5);
    super::load::run(&load, nts_load, request, &label, None)?;
    outln!(
        "NTS: {} NAKs (counted as refused), {} sessions made again after one, {} NTS-KE failures \
         doing so, {} requests reused a cookie (their session was out of them)",
        shared.naks.load(Relaxed),
        shared.rekeyed.load(Relaxed),
        shared.rekey_failures.load(Relaxed),
        shared.reused_cookies.load(Relaxed),
    );
    Ok(())
}

/// Where NTS-KE runs: the server, its port, the trusted certificates.
#[derive(Clone)]
pub(crate) struct KeServer {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) config: Arc<ClientConfig>,
    /// The protocol asked for.
    pub(crate) protocol: nts::Protocol,
    /// The AEAD algorithms offered, in order of preference.
    pub(crate) aeads: Vec<nts::Aead>,
    pub(crate) timeout: Duration,
}

impl KeServer {
    pub(crate) fn new(
        args: &NtsArgs,
        spec: &str,
        protocol: nts::Protocol,
        timeout: Duration,
    ) -> Result<Self> {
        let (host, port) = crate::nts::split_host(spec, crate::nts::KE_PORT)?;
        Ok(Self {
            host,
            port,
            config: crate::nts::client_config(args.nts_ca.as_deref())?,
            protocol,
            aeads: args.nts_aead.0.clone(),
            timeout,
        })
    }

    fn establish(&self) -> Result<crate::nts::Established> {
        let (host, port) = (&self.host, self.port);
        crate::nts::establish_with(
            &self.config,
            host,
            port,
            self.protocol,
            &self.aeads,
            self.timeout,
        )
    }
}

/// One NTS association: its keys and the cookies it holds.
#[derive(Clone)]
struct Session {
    id: u32,
    keys: Keys,
    cookies: VecDeque<Vec<u8>>,
    /// The cookie spent last, reused when none is left.
    last: Vec<u8>,
    /// A NAK came back and NTS-KE is running again for it.
    rekeying: bool,
}

/// What every thread shares: the sessions not yet claimed, the helper that runs NTS-KE again,
/// and the counts reported at the end.
pub(crate) struct Shared {
    unclaimed: Mutex<Vec<Session>>,
    /// Threads that have not claimed their share yet.
    claimants: AtomicU32,
    next_session: AtomicU32,
    /// This run's mark in every unique identifier.
    tag: [u8; 20],
    rekey: Mutex<Sender<Rekey>>,
    pub(crate) naks: AtomicU64,
    pub(crate) rekeyed: AtomicU64,
    pub(crate) rekey_failures: AtomicU64,
    pub(crate) reused_cookies: AtomicU64,
    /// Where NTP goes, as NTS-KE named it.
    pub(crate) ntp: std::net::SocketAddr,
    /// The length of the first session's cookies.
    pub(crate) cookie_len: usize,
}

/// A request to the helper: run NTS-KE for session `old` and deliver the new one to `inbox`.
struct Rekey {
    old: u32,
    inbox: Arc<Mutex<Vec<(u32, Session)>>>,
}

impl Shared {
    /// Runs NTS-KE `sessions` times ([`AT_ONCE`] at a time, each tried up to [`ATTEMPTS`]
    /// times) and starts the helper that runs it again after a NAK.
    pub(crate) fn establish(ke: &KeServer, sessions: usize, threads: usize) -> Result<Arc<Self>> {
        let next = AtomicU32::new(1);
        let made: Mutex<Vec<(Session, std::net::SocketAddr)>> = Mutex::default();
        let first_error: Mutex<Option<anyhow::Error>> = Mutex::default();
        std::thread::scope(|s| {
            for _ in 0..sessions.min(AT_ONCE) {
                s.spawn(|| {
                    while (next.load(Relaxed) as usize) <= sessions {
                        let id = next.fetch_add(1, Relaxed);
                        if id as usize > sessions {
                            break;
                        }
                        // A server may close a connection over its per-address limit (chimed's
                        // is 8 at once) before the one before has quite ended: try again.
                        let mut outcome = session(ke, id);
                        for _ in 1..ATTEMPTS {
                            if outcome.is_ok() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(50));
                            outcome = session(ke, id);
                        }
                        match outcome {
                            Ok(x) => made.lock().unwrap().push(x),
                            Err(e) => {
                                first_error.lock().unwrap().get_or_insert(e);
                                break;
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().unwrap() {
            return Err(e.context(format!("NTS-KE with {}:{}", ke.host, ke.port)));
        }
        let made = made.into_inner().unwrap();
        let ntp = made[0].1;
        if let Some((_, other)) = made.iter().find(|(_, a)| *a != ntp) {
            bail!("NTS-KE named two NTP servers, {ntp} and {other}: load one at a time");
        }
        let cookie_len = made[0].0.last.len();
        let (tx, rx) = mpsc::channel::<Rekey>();
        let shared = Arc::new(Self {
            unclaimed: Mutex::new(made.into_iter().map(|(s, _)| s).collect()),
            claimants: AtomicU32::new(u32::try_from(threads).unwrap_or(u32::MAX)),
            next_session: AtomicU32::new(u32::try_from(sessions).unwrap_or(u32::MAX) + 1),
            tag: rand::random(),
            rekey: Mutex::new(tx),
            naks: AtomicU64::new(0),
            rekeyed: AtomicU64::new(0),
            rekey_failures: AtomicU64::new(0),
            reused_cookies: AtomicU64::new(0),
            ntp,
            cookie_len,
        });
        let (helper, ke) = (Arc::downgrade(&shared), ke.clone());
        std::thread::Builder::new()
            .name("perf-nts-ke".into())
            .spawn(move || {
                // Ends when every sender is gone, with the last thread's clone.
                while let Ok(r) = rx.recv() {
                    let Some(shared) = helper.upgrade() else {
                        return;
                    };
                    let id = shared.next_session.fetch_add(1, Relaxed);
                    match session(&ke, id) {
                        Ok((s, _)) => {
                            shared.rekeyed.fetch_add(1, Relaxed);
                            r.inbox.lock().unwrap().push((r.old, s));
                        }
                        Err(_) => {
                            shared.rekey_failures.fetch_add(1, Relaxed);
                        }
                    }
                }
            })
            .context("cannot start the NTS-KE helper thread")?;
        Ok(shared)
    }
}

/// One NTS-KE exchange: a session numbered `id`, and the NTP server it names.
fn session(ke: &KeServer, id: u32) -> Result<(Session, std::net::SocketAddr)> {
    let est = ke.establish()?;
    let mut cookies: VecDeque<Vec<u8>> = est.answer.cookies.into_iter().collect();
    if let Some(c) = cookies.iter().find(|c| c.len() > MAX_COOKIE) {
        bail!(
            "a cookie of {} bytes, longer than {MAX_COOKIE}: not loaded",
            c.len()
        );
    }
    let last = cookies.front().cloned().unwrap_or_default();
    cookies.truncate(COOKIES);
    Ok((
        Session {
            id,
            keys: est.keys,
            cookies,
            last,
            rekeying: false,
        },
        est.ntp,
    ))
}

/// Authenticated client requests, NTPv4's or the NTPv5 draft's; one clone per sending thread,
/// each with its own share of the sessions, claimed at its first request.
#[derive(Clone)]
pub(crate) struct NtsLoad {
    shared: Arc<Shared>,
    ntp: NtpLoad,
    /// The draft of NTPv5 requests, or `None` for NTPv4's.
    v5: Option<Draft>,
    /// Fixed placeholders per request, or (`None`) as many as the session is short of eight.
    placeholders: Option<usize>,
    sessions: Vec<Session>,
    /// Sessions replaced after a NAK, kept to check the replies still on their way.
    retired: VecDeque<Session>,
    next: usize,
    inbox: Arc<Mutex<Vec<(u32, Session)>>>,
    rng: SmallRng,
    header: [u8; Header::LEN],
}

impl NtsLoad {
    pub(crate) fn new(shared: Arc<Shared>, placeholders: Option<usize>, v5: Option<Draft>) -> Self {
        let mut header = [0; Header::LEN];
        Header::request(4, Mode::Client, NtpTimestamp::ZERO).encode(&mut header);
        Self {
            shared,
            ntp: NtpLoad::new(4, RequestMode::Client),
            v5,
            placeholders,
            sessions: Vec::new(),
            retired: VecDeque::new(),
            next: 0,
            inbox: Arc::default(),
            rng: SmallRng::from_rng(&mut rand::rng()),
            header,
        }
    }

    /// Takes this thread's share of the unclaimed sessions: an equal part of what is left.
    fn claim(&mut self) {
        let mut left = self.shared.unclaimed.lock().unwrap();
        let claimants = self.shared.claimants.fetch_sub(1, Relaxed).max(1) as usize;
        let take = left.len().div_ceil(claimants).max(1).min(left.len());
        let at = left.len() - take;
        self.sessions = left.split_off(at);
        drop(left);
        // Clones share the parent's inbox and generator until here: each thread gets its own.
        self.inbox = Arc::default();
        self.rng = SmallRng::from_rng(&mut rand::rng());
    }

    /// Puts sessions the helper made in place of the ones that were refused.
    fn take_inbox(&mut self) {
        let Ok(mut inbox) = self.inbox.try_lock() else {
            return;
        };
        for (old, fresh) in inbox.drain(..) {
            match self.sessions.iter_mut().find(|s| s.id == old) {
                Some(s) => {
                    let old = std::mem::replace(s, fresh);
                    if self.retired.len() == RETIRED {
                        self.retired.pop_front();
                    }
                    self.retired.push_back(old);
                }
                None => self.sessions.push(fresh),
            }
        }
    }

    /// The next session to spend a cookie of: the next in turn not waiting for NTS-KE, or, if all
    /// are, the next in turn.
    fn pick(&mut self) -> usize {
        let n = self.sessions.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if !self.sessions[i].rekeying {
                self.next = i + 1;
                return i;
            }
        }
        self.next += 1;
        self.next % n
    }

    /// What a client makes of an authentic reply to request `id` as NTP (`ntp`'s for v4, or in
    /// the `v5` draft): its verdict and the server's times, or `None` if it does not answer that
    /// request (v4's origin timestamp, v5's client cookie and draft). Of the load's fields, not
    /// `self`, so that it can be called while a session is borrowed.
    fn judge(
        (ntp, v5): (&NtpLoad, Option<Draft>),
        reply: &[u8],
        id: u64,
        received_unix_secs: i64,
    ) -> Option<(Verdict, Option<ServerTimes>)> {
        if let Some(draft) = v5 {
            let r = v5::parse_response(reply, id.to_be_bytes(), draft).ok()?;
            let verdict = V5Load::judge(&r);
            let server = times(r.receive_ts, r.transmit_ts, verdict, received_unix_secs);
            return Some((verdict, server));
        }
        let header = Header::parse(reply).ok().filter(|h| h.origin_ts.0 == id)?;
        let verdict = ntp.judge(&header);
        Some((verdict, server_times(&header, verdict, received_unix_secs)))
    }

    /// The maximum request length with `placeholders` placeholders.
    fn request_len(&self, placeholders: usize) -> usize {
        let cookie_len = self.shared.cookie_len.max(MAX_COOKIE);
        match self.v5 {
            Some(draft) => nts::client_request_v5_len(draft, cookie_len, placeholders),
            None => nts::client_request_len(cookie_len, placeholders),
        }
    }
}

impl LoadProtocol for NtsLoad {
    const NAME: &'static str = "ntp";

    fn max_request_len(&self) -> usize {
        self.request_len(self.placeholders.unwrap_or(COOKIES - 1))
    }

    fn max_reply_len(&self) -> usize {
        // A reply is as long as its request; take twice that to see a broken server's whole.
        2 * self.max_request_len()
    }

    fn fill_request(&mut self, id: u64, buf: &mut [u8]) -> usize {
        if self.sessions.is_empty() {
            self.claim();
        }
        self.take_inbox();
        let i = self.pick();
        let s = &mut self.sessions[i];
        match s.cookies.pop_front() {
            Some(c) => s.last = c,
            None => {
                self.shared.reused_cookies.fetch_add(1, Relaxed);
            }
        }
        let placeholders = self
            .placeholders
            .unwrap_or(COOKIES - 1 - s.cookies.len().min(COOKIES - 1));
        let mut uid = [0u8; 32];
        uid[..8].copy_from_slice(&id.to_be_bytes());
        uid[8..12].copy_from_slice(&s.id.to_be_bytes());
        uid[12..].copy_from_slice(&self.shared.tag);
        let nonce: [u8; 16] = self.rng.random();
        if let Some(draft) = self.v5 {
            // The id as the client cookie, which the reply echoes.
            let nts = nts::NtsFields {
                unique_id: &uid,
                cookie: &s.last,
                placeholders,
                keys: &s.keys,
                nonce,
            };
            return nts::client_request_v5_into(buf, draft, id.to_be_bytes(), &nts);
        }
        let mut header = self.header;
        header[TRANSMIT_TS..].copy_from_slice(&id.to_be_bytes());
        nts::client_request_into(buf, &header, &uid, &s.last, placeholders, &s.keys, nonce)
    }

    fn match_reply(&mut self, reply: &[u8], received_unix_secs: i64) -> ReplyMatch {
        let uid = match self.v5 {
            Some(_) => nts::reply_unique_id_v5(reply),
            None => Header::parse(reply).ok().and(nts::reply_unique_id(reply)),
        };
        let Some(Ok(uid)) = uid.map(<[u8; 32]>::try_from) else {
            return ReplyMatch::Unmatched;
        };
        if uid[12..] != self.shared.tag {
            return ReplyMatch::Unmatched;
        }
        let id = u64::from_be_bytes(uid[..8].try_into().unwrap_or_default());
        let session = u32::from_be_bytes(uid[8..12].try_into().unwrap_or_default());
        let invalid = ReplyMatch::Matched {
            id,
            verdict: Verdict::Invalid,
            server: None,
            signed: None,
        };
        // A reply for a session replaced since (after a NAK) is checked with its keys, kept for
        // that; its cookies are of no more use.
        let (s, current) = match self.sessions.iter_mut().find(|s| s.id == session) {
            Some(s) => (s, true),
            None => match self.retired.iter_mut().find(|s| s.id == session) {
                Some(s) => (s, false),
                None => return invalid,
            },
        };
        let checked = match self.v5 {
            Some(_) => nts::client_check_reply_v5(reply, &uid, &s.keys),
            None => nts::client_check_reply(reply, &uid, &s.keys),
        };
        match checked {
            Ok(ClientReply::Authentic(cookies)) => {
                let judged = Self::judge((&self.ntp, self.v5), reply, id, received_unix_secs);
                let Some((verdict, server)) = judged else {
                    return invalid;
                };
                for c in cookies {
                    if current && s.cookies.len() < COOKIES && c.len() <= MAX_COOKIE {
                        s.cookies.push_back(c);
                    }
                }
                ReplyMatch::Matched {
                    id,
                    verdict,
                    server,
                    signed: None,
                }
            }
            Ok(ClientReply::Nak) => {
                self.shared.naks.fetch_add(1, Relaxed);
                if current && !s.rekeying {
                    s.rekeying = true;
                    let r = Rekey {
                        old: s.id,
                        inbox: self.inbox.clone(),
                    };
                    // The helper is gone only when the run is over.
                    let _ = self.shared.rekey.lock().unwrap().send(r);
                }
                ReplyMatch::Matched {
                    id,
                    verdict: Verdict::Refused,
                    server: None,
                    signed: None,
                }
            }
            Err(_) => invalid,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::perf::ntp::tests::{NOW, reply_to};
    use chime_ntp::nts::{Check, CookieKeys, check_request, write_nak, write_response};

    use super::*;

    const COOKIE_LEN: usize = nts::cookie_len(nts::Aead::AesSivCmac256);

    fn keys() -> Keys {
        keys_for(nts::Protocol::NtpV4)
    }

    fn keys_for(protocol: nts::Protocol) -> Keys {
        Keys::new(protocol, nts::Aead::AesSivCmac256, &[1; 32], &[2; 32]).unwrap()
    }

    /// One thread's load over one session holding `cookies` cookies sealed under `master`, and
    /// the helper's end of the re-key channel.
    fn load_with(master: &CookieKeys, cookies: u8) -> (NtsLoad, mpsc::Receiver<Rekey>) {
        load_of(master, cookies, None)
    }

    /// [`load_with`], of NTPv5 requests naming `v5`'s draft, if given.
    fn load_of(
        master: &CookieKeys,
        cookies: u8,
        v5: Option<Draft>,
    ) -> (NtsLoad, mpsc::Receiver<Rekey>) {
        let protocol = match v5 {
            Some(_) => nts::Protocol::NtpV5Draft,
            None => nts::Protocol::NtpV4,
        };
        let cookies: VecDeque<Vec<u8>> = (0..cookies)
            .map(|i| master.seal(&keys_for(protocol), [i; 16]).to_vec())
            .collect();
        let session = Session {
            id: 9,
            keys: keys_for(protocol),
            last: cookies[0].clone(),
            cookies,
            rekeying: false,
        };
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            unclaimed: Mutex::new(vec![session]),
            claimants: AtomicU32::new(1),
            next_session: AtomicU32::new(10),
            tag: [0x77; 20],
            rekey: Mutex::new(tx),
            naks: AtomicU64::new(0),
            rekeyed: AtomicU64::new(0),
            rekey_failures: AtomicU64::new(0),
            reused_cookies: AtomicU64::new(0),
            ntp: ([127, 0, 0, 1], 123).into(),
            cookie_len: COOKIE_LEN,
        });
        (NtsLoad::new(shared, None, v5), rx)
    }

    /// What chimed answers: the header of a synchronised server echoing the request's transmit
    /// timestamp, then the NTS fields.
    fn answer(request: &[u8], master: &CookieKeys) -> Vec<u8> {
        let mut reply = vec![0u8; request.len()];
        reply[..48].copy_from_slice(&reply_to(request, |_| {}));
        match check_request(request, master) {
            Check::Verified(v) => {
                let n = write_response(&mut reply, request, &v, [3; 16], || {
                    master.seal(&keys(), [4; 16])
                })
                .unwrap();
                reply.truncate(n);
            }
            Check::Nak(uid, _) => {
                let n = write_nak(&mut reply, request, uid).unwrap();
                reply.truncate(n);
            }
            other => panic!("{other:?}"),
        }
        reply
    }

    fn verdict(m: ReplyMatch) -> (u64, Verdict) {
        m.id_and_verdict()
    }

    #[test]
    fn a_request_opens_at_the_server_and_its_reply_is_checked_as_a_client_would() {
        let master = CookieKeys::new(5, [7; 32]);
        let (mut load, _rx) = load_with(&master, 8);
        let mut buf = vec![0u8; load.max_request_len()];
        let n = load.fill_request(42, &mut buf);
        // A cookie spent, seven held: no placeholder, as chronyd sends it.
        assert_eq!(n, nts::client_request_len(COOKIE_LEN, 0));
        let reply = answer(&buf[..n], &master);
        assert_eq!(verdict(load.match_reply(&reply, NOW)), (42, Verdict::Valid));
        // The new cookie went back to the session.
        assert_eq!(load.sessions[0].cookies.len(), 8);

        // Anything a client would reject: a changed byte under the authenticator, another
        // run's identifier.
        let mut forged = reply.clone();
        forged[47] ^= 1;
        assert_eq!(
            verdict(load.match_reply(&forged, NOW)),
            (42, Verdict::Invalid)
        );
        let mut foreign = reply.clone();
        let at = reply.windows(20).position(|w| w == [0x77; 20]).unwrap();
        foreign[at] ^= 1;
        assert_eq!(load.match_reply(&foreign, NOW), ReplyMatch::Unmatched);
    }

    #[test]
    fn a_short_session_asks_for_cookies_and_a_nak_sends_it_to_nts_ke_again() {
        let master = CookieKeys::new(5, [7; 32]);
        let (mut load, rx) = load_with(&master, 3);
        let mut buf = vec![0u8; load.max_request_len()];
        let n = load.fill_request(1, &mut buf);
        // Two held after this one: five placeholders bring it back to eight.
        assert_eq!(n, nts::client_request_len(COOKIE_LEN, 5));
        let reply = answer(&buf[..n], &master);
        assert_eq!(verdict(load.match_reply(&reply, NOW)).1, Verdict::Valid);
        assert_eq!(load.sessions[0].cookies.len(), 8);

        // The server's key changes: the next request gets a NAK.
        let other = CookieKeys::new(6, [8; 32]);
        let n = load.fill_request(2, &mut buf);
        let nak = answer(&buf[..n], &other);
        assert_eq!(verdict(load.match_reply(&nak, NOW)), (2, Verdict::Refused));
        assert_eq!(load.shared.naks.load(Relaxed), 1);
        let r = rx.try_recv().expect("a re-key asked for");
        assert_eq!(r.old, 9);
        // A second NAK for the same session asks for nothing more.
        let n = load.fill_request(3, &mut buf);
        let nak = answer(&buf[..n], &other);
        assert_eq!(verdict(load.match_reply(&nak, NOW)).1, Verdict::Refused);
        assert!(rx.try_recv().is_err());

        // The helper's new session takes the old one's place; a late reply for the old one is
        // still checked with the old keys.
        let fresh = Session {
            id: 10,
            keys: Keys::new(
                nts::Protocol::NtpV4,
                nts::Aead::AesSivCmac256,
                &[3; 32],
                &[4; 32],
            )
            .unwrap(),
            cookies: VecDeque::from([vec![0; COOKIE_LEN]]),
            last: Vec::new(),
            rekeying: false,
        };
        r.inbox.lock().unwrap().push((r.old, fresh));
        load.fill_request(4, &mut buf);
        assert_eq!(load.sessions[0].id, 10);
        assert_eq!(verdict(load.match_reply(&nak, NOW)).1, Verdict::Refused);
    }

    /// What chimed answers a v5 request: a synchronised stratum-2 header echoing its client
    /// cookie, then the NTS fields (or a v5 NAK).
    fn answer_v5(request: &[u8], master: &CookieKeys, draft: Draft) -> Vec<u8> {
        let mut served = chime_ntp::ServedHeader::unsynchronised(-20);
        (served.leap, served.stratum) = (chime_ntp::Leap::NoWarning, 2);
        let rx = NtpTimestamp::from_unix(NOW, 1_000);
        let mut reply = vec![0u8; request.len()];
        v5::write_header(request, rx, &served, 0, &mut reply).unwrap();
        let n = match nts::check_request_v5(request, master) {
            Check::Verified(v) => {
                nts::write_response_v5(&mut reply, request, &v, draft, [3; 16], || {
                    master.seal(&keys_for(nts::Protocol::NtpV5Draft), [4; 16])
                })
            }
            Check::Nak(uid, _) => nts::write_nak_v5(&mut reply, request, uid, draft),
            other => panic!("{other:?}"),
        };
        reply.truncate(n.unwrap());
        reply
    }

    /// Over the NTPv5 draft: the request carries its id as the client cookie and its draft among
    /// what the authenticator covers; the reply is checked as a v5 client checks it (the cookie
    /// echoed, the draft named, the authenticator), and its new cookie goes back to the session.
    /// A NAK is a refusal and sends the session to NTS-KE again.
    #[test]
    fn an_ntpv5_request_opens_at_the_server_and_its_reply_is_checked_as_a_client_would() {
        let master = CookieKeys::new(5, [7; 32]);
        for draft in Draft::ALL {
            let (mut load, rx) = load_of(&master, 8, Some(draft));
            let mut buf = vec![0u8; load.max_request_len()];
            let n = load.fill_request(42, &mut buf);
            assert_eq!(n, nts::client_request_v5_len(draft, COOKIE_LEN, 0));
            assert_eq!(v5::client_cookie(&buf[..n]), Some(42u64.to_be_bytes()));
            let reply = answer_v5(&buf[..n], &master, draft);
            assert_eq!(verdict(load.match_reply(&reply, NOW)), (42, Verdict::Valid));
            assert_eq!(load.sessions[0].cookies.len(), 8);

            // A changed byte under the authenticator, another request's cookie, another draft.
            let mut forged = reply.clone();
            forged[40] ^= 1;
            assert_eq!(verdict(load.match_reply(&forged, NOW)).1, Verdict::Invalid);
            let mut other_cookie = reply.clone();
            other_cookie[24] ^= 1;
            assert_eq!(
                verdict(load.match_reply(&other_cookie, NOW)).1,
                Verdict::Invalid
            );
            let other = Draft::ALL.into_iter().find(|&d| d != draft).unwrap();
            let (mut other_load, _rx) = load_of(&master, 8, Some(other));
            assert_eq!(
                verdict(other_load.match_reply(&reply, NOW)).1,
                Verdict::Invalid,
                "a reply naming {draft:?} to requests naming {other:?}"
            );

            // The server's key changes: a v5 NAK.
            let n = load.fill_request(43, &mut buf);
            let nak = answer_v5(&buf[..n], &CookieKeys::new(6, [8; 32]), draft);
            assert_eq!(verdict(load.match_reply(&nak, NOW)), (43, Verdict::Refused));
            assert_eq!(rx.try_recv().map(|r| r.old).ok(), Some(9));
        }
    }
}
