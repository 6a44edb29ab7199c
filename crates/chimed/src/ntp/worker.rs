//! The NTP worker: the data plane's handler for one socket. It reads the mirrored upstream state
//! once per batch, answers each request with the sans-IO responder, and stamps every reply's
//! transmit time in one clock read immediately before the batch is handed to `sendmmsg`. Every
//! time it reads (kernel receive and transmit timestamps, its own clock reads) is served as
//! chronyd serves it: through the state's followed [`ServedClock`], then the zone's shift in
//! timezone-offset mode ([`serve_time`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chime_ntp::nts::{self, CookieKeys};
use chime_ntp::v5::{self, BloomFilter};
use chime_ntp::{
    ClientLog, ClientTable, Coin, DropReason, Fate, NtpTimestamp, ServedClock, ServerState, Smear,
    TxLog, Verdict,
};
use chime_udp::{BatchHandler, RxBatch, TxBatch};

use crate::access::Rules;
use crate::clock;
use crate::clock::published::{Published, ReferenceFilter};
use crate::clock::tz::Zone;
use crate::nts::keys as nts_keys;
use crate::observe::counters::{self, Note};
use crate::observe::stats::{self, WorkerStats, Workers};
use crate::reply;
use crate::service::Beat;

/// Why an NTP request got no reply: the protocol's reasons, and the daemon's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NtpDrop {
    /// The responder's reason.
    Request(DropReason),
    /// An `--allow`/`--deny` rule.
    Denied,
    /// Over `--ratelimit`, neither leaked nor kissed.
    RateLimited,
    /// NTS fields that are not a valid request, or no room for the reply.
    NtsInvalid,
}

impl NtpDrop {
    const COUNT: usize = DropReason::COUNT + 3;

    /// The daemon's own reasons, each beside its label.
    const OWN: [(Self, &'static str); 3] = [
        (Self::Denied, "denied"),
        (Self::RateLimited, "rate_limited"),
        (Self::NtsInvalid, "nts_invalid"),
    ];

    /// Every label, by slot.
    const ALL_LABELS: [&'static str; Self::COUNT] =
        counters::drop_labels!(DropReason::COUNT, |i| DropReason::LABELS[i]);

    const fn slot(self) -> usize {
        match self {
            Self::Request(why) => why.index(),
            Self::Denied => DropReason::COUNT,
            Self::RateLimited => DropReason::COUNT + 1,
            Self::NtsInvalid => DropReason::COUNT + 2,
        }
    }
}

impl counters::Reason for NtpDrop {
    type Counts = [u64; Self::COUNT];
    const LABELS: &'static [&'static str] = &Self::ALL_LABELS;
    const NOTES: counters::Of = counters::Of::Ntp;

    fn index(self) -> usize {
        self.slot()
    }
}

/// What the NTP workers share: handles on the state its owners keep (the clock, the access
/// rules, the cookie keys), and the service's own (the rate limiter, the interleaved-mode log, the
/// workers' counts).
#[derive(Debug)]
pub(crate) struct Shared {
    /// The clock as the upstream poller publishes it.
    pub(crate) clock: Arc<Published>,
    /// Who is served, NTP and Roughtime alike; replaced on SIGHUP.
    pub(crate) access: Arc<Rules>,
    /// The NTS cookie keys (NTS-KE seals, the workers open); `None` when NTS is off.
    pub(crate) cookies: Option<nts_keys::InForce>,
    /// Every worker's counts, for the log's totals and the metrics.
    pub(crate) workers: Arc<Workers<NtpDrop>>,
    pub(crate) stats_interval: Option<Duration>,
    /// Per-client rate limiting, shared by every NTP worker so that a client is limited as one
    /// whichever threads its requests reach; `None` when off.
    pub(crate) ratelimit: Option<Arc<ClientTable>>,
    /// The start of the monotonic time the rate limiter and the client log count in.
    pub(crate) epoch: Instant,
    /// Every client's requests and their fates, for `chime clients`; `None` when off.
    pub(crate) clients: Option<ClientLog>,
    /// Transmit times of replies to interleaved-mode clients, shared by every NTP worker since a
    /// client's next request may reach another thread; `None` when interleaved mode is off.
    pub(crate) txlog: Option<TxLog>,
}

/// Per-reply marks for interleaved mode, by index in the batch being sent (batches hold at most
/// 1024 replies).
#[derive(Clone, Copy, Default)]
struct Marks {
    /// Carries the previous reply's transmit time already: not to be stamped.
    keep_transmit: [u64; 16],
    /// Its transmit time is to be saved for the client's next request.
    save: [u64; 16],
    any: bool,
}

impl Marks {
    fn set(bits: &mut [u64; 16], i: usize) {
        bits[i / 64] |= 1 << (i % 64);
    }

    fn get(bits: &[u64; 16], i: usize) -> bool {
        bits[i / 64] & (1 << (i % 64)) != 0
    }
}

pub(crate) struct NtpWorker {
    shared: Arc<Shared>,
    stats: WorkerStats<NtpDrop>,
    /// The time served for the batch in hand, the zone (each loaded once per batch), and the
    /// Unix time that resolves NTP eras for it.
    time: TimeServed,
    zone: Option<Arc<Zone>>,
    pivot_unix: i64,
    /// The rate limiter's leak and KoD draws.
    coin: Coin,
    /// The interleaved replies of the batch in hand.
    marks: Marks,
    /// Whether this worker's path gives transmit timestamps, so that it may answer in
    /// interleaved mode (the AF_XDP path does not).
    interleaved: bool,
}

impl NtpWorker {
    /// Thread `thread` of those on one `family`'s socket (or on AF_XDP, `xdp`), its counts
    /// registered with the service's.
    pub(crate) fn new(shared: Arc<Shared>, family: &'static str, thread: usize) -> Self {
        let now_unix = clock::read().unix_secs();
        Self {
            stats: WorkerStats::new(
                "ntp",
                shared.stats_interval,
                (&shared.workers, family, thread),
            ),
            shared,
            time: TimeServed::LOCAL,
            zone: None,
            pivot_unix: now_unix,
            coin: Coin::new(rand::random()),
            marks: Marks::default(),
            interleaved: true,
        }
    }

    /// A worker whose every batch and idle wake-up the watchdog sees.
    pub(crate) fn with_heartbeat(mut self, beat: Beat) -> Self {
        self.stats = self.stats.with_heartbeat(beat);
        self
    }

    /// A worker on a path without transmit timestamps (AF_XDP): interleaved requests get basic
    /// replies, which claim nothing about when the previous reply left.
    pub(crate) fn without_interleaved(mut self) -> Self {
        self.interleaved = false;
        self
    }
}

/// What every request of a batch is answered with.
struct Batch<'a> {
    served: &'a chime_ntp::ServedHeader,
    time: TimeServed,
    limiter: Option<(&'a ClientTable, u64, i8)>,
    txlog: Option<&'a TxLog>,
    cookie_keys: Option<&'a CookieKeys>,
    zone: Option<&'a Zone>,
    now_unix: i64,
    /// NTPv5's filter, if on, and the era of the batch's time.
    v5: Option<(&'a BloomFilter, u8)>,
    /// TAI − UTC, where replies may be in TAI (known, no leap second under way, no zone).
    tai: Option<u16>,
    /// `--leap-smear`: v5 replies say their timescale is leap-smeared UTC.
    smeared: bool,
}

/// What became of one reply, for the counters and the marks.
#[derive(Default)]
struct Notes {
    kissed: bool,
    /// Carries the previous reply's transmit time (interleaved mode).
    interleaved: bool,
    /// Its transmit timestamp is already written (interleaved, or stamped before NTS signed it).
    keep_transmit: bool,
    /// Its own transmit time is to be saved for the client's next interleaved request.
    save_transmit: bool,
    /// NTS: `Some(Ok(()))` authenticated, `Some(Err(why))` a NAK.
    nts: Option<Result<(), nts::NakReason>>,
    /// An NTPv5 reply.
    v5: bool,
    /// A v4 reply telling its client that v5 is spoken (`NTP5DRFT` echoed).
    upgrade: bool,
    /// An NTPv5 reply in TAI, this many seconds after UTC.
    tai: Option<u16>,
}

impl Notes {
    /// The reply just queued (the last in `tx`): counted by what it was, and marked for the send
    /// if interleaved mode keeps or saves its transmit time.
    fn queued(
        &self,
        counts: &mut counters::Counters<NtpDrop>,
        marks: &mut Marks,
        tx: &mut TxBatch,
    ) {
        counts.note(Note::Kod, self.kissed);
        counts.note(Note::Interleaved, self.interleaved);
        counts.note(Note::Nts, self.nts == Some(Ok(())));
        if let Some(Err(why)) = self.nts {
            counts.note(Note::NtsNak, true);
            counts.note(Note::NtsNakWhy(why), true);
        }
        counts.note(Note::V5, self.v5);
        counts.note(Note::Upgrade, self.upgrade);
        counts.note(Note::Tai, self.tai.is_some());
        let i = tx.len() - 1;
        if self.keep_transmit {
            Marks::set(&mut marks.keep_transmit, i);
            marks.any = true;
        }
        if self.save_transmit {
            Marks::set(&mut marks.save, i);
            marks.any = true;
            tx.request_tx_timestamp();
        }
    }
}

/// One request in hand: where it came from, its bytes, and when it arrived (T2).
struct Incoming<'r> {
    meta: &'r chime_udp::RecvMeta,
    bytes: &'r [u8],
    t2: chime_ntp::NtpTimestamp,
    /// The local clock's time of its arrival, which T2 is served for.
    local: NtpTimestamp,
}

/// Writes the reply to one request into `buf`: the responder's header, then rate limiting,
/// interleaved mode and NTS, each if on. Returns the reply's length or why there is none.
fn answer(
    b: &Batch<'_>,
    req: &Incoming<'_>,
    coin: &mut Coin,
    buf: &mut [u8],
    notes: &mut Notes,
) -> Result<usize, NtpDrop> {
    if let Some(v5_on) = b.v5
        && v5::is_v5(req.bytes)
    {
        return answer_v5(b, req, coin, buf, notes, v5_on);
    }
    let len = chime_ntp::respond(req.bytes, req.meta.src.port(), req.t2, b.served, buf)
        .map_err(NtpDrop::Request)?;
    if b.v5.is_some() {
        notes.upgrade = v5::mark_upgrade(req.bytes, buf);
    }
    limit(b, req, coin, buf, notes, chime_ntp::kiss_of_death)?;
    if !notes.kissed
        && let Some(log) = b.txlog
        && let Some(origin) = chime_ntp::interleaved_origin(req.bytes)
    {
        if let Some(previous_tx) = log.take(origin) {
            chime_ntp::make_interleaved(buf, req.bytes, previous_tx);
            notes.interleaved = true;
            notes.keep_transmit = true;
        }
        notes.save_transmit = true;
    }
    let Some(keys) = b.cookie_keys else {
        return Ok(len);
    };
    if req.bytes.len() <= chime_ntp::Header::LEN {
        return Ok(len);
    }
    match nts::check_request(req.bytes, keys) {
        nts::Check::NotNts => Ok(len),
        nts::Check::Malformed => Err(NtpDrop::NtsInvalid),
        nts::Check::Nak(uid, why) => {
            notes.nts = Some(Err(why));
            notes.save_transmit = false;
            notes.interleaved = false;
            nts::write_nak(buf, req.bytes, uid).ok_or(NtpDrop::NtsInvalid)
        }
        nts::Check::Verified(v) => {
            stamp_now(b, buf, notes);
            notes.nts = Some(Ok(()));
            let seal = || keys.seal(&v.keys, rand::random());
            nts::write_response(buf, req.bytes, &v, rand::random(), seal).ok_or(NtpDrop::NtsInvalid)
        }
    }
}

/// The authenticator covers the transmit timestamp: an NTS reply is stamped before it is sealed,
/// unless interleaved mode wrote one already.
fn stamp_now(b: &Batch<'_>, buf: &mut [u8], notes: &mut Notes) {
    if !notes.keep_transmit {
        let t3 = serve_time(&b.time, b.zone, b.now_unix, clock::now());
        chime_ntp::stamp_transmit(buf, t3);
        notes.keep_transmit = true;
    }
}

/// [`answer`] for an NTPv5 request, with v5 on: plain, or over NTS where NTS is on (dropped if
/// it is not). No interleaved mode.
fn answer_v5(
    b: &Batch<'_>,
    req: &Incoming<'_>,
    coin: &mut Coin,
    buf: &mut [u8],
    notes: &mut Notes,
    (filter, era): (&BloomFilter, u8),
) -> Result<usize, NtpDrop> {
    let accepted = v5::accept(req.bytes).map_err(NtpDrop::Request)?;
    let keys = match (accepted.nts, b.cookie_keys) {
        (false, _) => {
            let reply = v5::respond(req.bytes, req.t2, b.served, filter, era, buf);
            let len = reply.map_err(NtpDrop::Request)?.len;
            limit(b, req, coin, buf, notes, v5::kiss_of_death)?;
            notes.v5 = true;
            in_tai(b, req, buf, notes);
            return Ok(len);
        }
        (true, Some(keys)) => keys,
        (true, None) => return Err(NtpDrop::Request(DropReason::BadExtension)),
    };
    v5::write_header(req.bytes, req.t2, b.served, era, buf).map_err(NtpDrop::Request)?;
    limit(b, req, coin, buf, notes, v5::kiss_of_death)?;
    notes.v5 = true;
    in_tai(b, req, buf, notes);
    match nts::check_request_v5(req.bytes, keys) {
        nts::Check::NotNts | nts::Check::Malformed => Err(NtpDrop::NtsInvalid),
        nts::Check::Nak(uid, why) => {
            notes.nts = Some(Err(why));
            nts::write_nak_v5(buf, req.bytes, uid, accepted.draft).ok_or(NtpDrop::NtsInvalid)
        }
        nts::Check::Verified(v) => {
            stamp_now(b, buf, notes);
            notes.nts = Some(Ok(()));
            let seal = || keys.seal(&v.keys, rand::random());
            let nonce = rand::random();
            nts::write_response_v5(buf, req.bytes, &v, accepted.draft, nonce, seal)
                .ok_or(NtpDrop::NtsInvalid)
        }
    }
}

/// A v5 reply whose request asks for TAI, in TAI where it is known now (otherwise it stays in
/// UTC, which its timescale says, as the draft has a server answer in a timescale it serves),
/// both its times stamped here; any other reply, with `--leap-smear`, says it is in leap-smeared
/// UTC. A Kiss-o'-Death carries no time.
fn in_tai(b: &Batch<'_>, req: &Incoming<'_>, buf: &mut [u8], notes: &mut Notes) {
    if let (Some(tai), v5::timescale::TAI, false) =
        (b.tai, v5::requested_timescale(req.bytes), notes.kissed)
    {
        let era = v5::era(b.now_unix + i64::from(tai));
        // Unsmeared: TAI has no leap seconds to smear. (No zone either: TAI is off with one.)
        v5::move_to_tai(buf, b.time.utc(req.local), tai, era);
        let t3 = b.time.utc(clock::now());
        chime_ntp::stamp_transmit(buf, NtpTimestamp(t3.0.wrapping_add(u64::from(tai) << 32)));
        notes.keep_transmit = true;
        notes.tai = Some(tai);
    } else if b.smeared && !notes.kissed {
        v5::set_timescale(buf, v5::timescale::LEAP_SMEARED_UTC);
    }
}

/// Rate limiting, if on, for a reply already written: answered, kissed (with `kiss`, the reply's
/// version's), or dropped; and the poll it should use. Only a request that would be answered
/// costs its sender: a malformed one is dropped before it reaches the table.
fn limit(
    b: &Batch<'_>,
    req: &Incoming<'_>,
    coin: &mut Coin,
    buf: &mut [u8],
    notes: &mut Notes,
    kiss: fn(&mut [u8], [u8; 4]),
) -> Result<(), NtpDrop> {
    if let Some((table, mono, interval)) = b.limiter {
        match table.check(req.meta.src.ip(), mono, coin) {
            Verdict::Answer => {}
            Verdict::Kod => {
                kiss(buf, *b"RATE");
                notes.kissed = true;
            }
            Verdict::Drop => return Err(NtpDrop::RateLimited),
        }
        chime_ntp::suggest_poll(buf, interval);
    }
    Ok(())
}

impl BatchHandler for NtpWorker {
    fn handle(&mut self, rx: &RxBatch, tx: &mut TxBatch) {
        // One clock read and one snapshot load per batch: the fallback receive time for a
        // datagram without a kernel timestamp, and the header every reply in the batch carries.
        let reading = clock::read();
        let (now, now_unix) = (reading.ntp(), reading.unix_secs());
        let clock = &*self.shared.clock;
        let state = clock.load();
        let mut served = clock.served_at(&state, now);
        self.time = TimeServed::of(&state, reading, clock);
        self.zone = clock.zone();
        self.pivot_unix = now_unix;
        // chronyd's reference time is in its own served time already: only the zone shifts it.
        if let Some(zone) = &self.zone {
            served.reference_ts = zone.apply(served.reference_ts, now_unix);
        }
        self.stats.counts.batches += 1;
        let acl = self.shared.access.load();
        if self.marks.any {
            self.marks = Marks::default();
        }
        let txlog = self.shared.txlog.as_ref().filter(|_| self.interleaved);
        let cookie_keys = self.shared.cookies.as_ref().map(|k| k.load());
        let filter = clock.filter().map(ReferenceFilter::served);
        let zone = self.zone.clone();
        let mono = self.shared.epoch.elapsed().as_nanos() as u64;
        let limiter = (self.shared.ratelimit.as_deref()).map(|t| (t, mono, t.limit().interval()));
        let clients = self.shared.clients.as_ref().map(|log| (log, mono));
        let batch = Batch {
            served: &served,
            time: self.time,
            limiter,
            txlog,
            cookie_keys: cookie_keys.as_ref().map(|k| &***k),
            zone: zone.as_deref(),
            now_unix,
            v5: filter.as_deref().map(|f| (&**f, v5::era(now_unix))),
            tai: state.tai_offset_at(now).filter(|_| zone.is_none()),
            smeared: clock.smears(),
        };
        for (meta, request) in rx.iter() {
            self.stats.counts.received += 1;
            if !acl.serves(meta.src.ip()) {
                self.stats.counts.drop(NtpDrop::Denied);
                client_seen(clients, meta, Fate::Dropped);
                continue;
            }
            if meta.truncated {
                self.stats
                    .counts
                    .drop(NtpDrop::Request(DropReason::Truncated));
                client_seen(clients, meta, Fate::Dropped);
                continue;
            }
            let local = meta.timestamp.map_or(now, clock::from_kernel);
            let t2 = serve_time(&self.time, zone.as_deref(), now_unix, local);
            let coin = &mut self.coin;
            let mut notes = Notes::default();
            let req = Incoming {
                meta,
                bytes: request,
                t2,
                local,
            };
            let queued = reply::queue(tx, meta, request, |buf| {
                answer(&batch, &req, coin, buf, &mut notes)
            });
            if queued.is_ok() {
                notes.queued(&mut self.stats.counts, &mut self.marks, tx);
            }
            let fate = match queued {
                Ok(()) if notes.kissed => Fate::Kod,
                Ok(()) => Fate::Answered,
                Err(Some(NtpDrop::RateLimited)) => Fate::RateLimited,
                Err(_) => Fate::Dropped,
            };
            client_seen(clients, meta, fate);
            if let Err(Some(why)) = queued {
                self.stats.counts.drop(why);
            }
        }
        // The batch's one tick, which the watchdog sees.
        self.stats.tick(now_unix);
    }

    fn before_send(&mut self, tx: &mut TxBatch) {
        let t3 = self.serve_time(clock::now());
        if !self.marks.any {
            for reply in tx.payloads_mut() {
                chime_ntp::stamp_transmit(reply, t3);
            }
            return;
        }
        let log = self.shared.txlog.as_ref();
        for (i, reply) in tx.payloads_mut().enumerate() {
            if !Marks::get(&self.marks.keep_transmit, i) {
                chime_ntp::stamp_transmit(reply, t3);
            }
            // The daemon's transmit time, in case the kernel's does not come back.
            if Marks::get(&self.marks.save, i)
                && let (Some(log), Some(rx)) = (log, chime_ntp::reply_receive_timestamp(reply))
            {
                log.save(rx, t3);
            }
        }
    }

    fn tx_timestamps(&mut self, looped: &RxBatch) {
        let Some(log) = self.shared.txlog.as_ref() else {
            return;
        };
        for (meta, bytes) in looped.iter() {
            // The reply is the last 48 bytes, behind the headers the kernel loops back.
            let reply = bytes.get(bytes.len().saturating_sub(chime_ntp::Header::LEN)..);
            if let (Some(ts), Some(rx)) = (
                meta.timestamp,
                reply.and_then(chime_ntp::reply_receive_timestamp),
            ) {
                log.save(rx, self.serve_time(clock::from_kernel(ts)));
                self.stats.counts.note(Note::KernelTxTimestamp, true);
            }
        }
    }

    stats::bookkeeping!(stats, "ntp-worker");
}

impl Shared {
    /// The client log as `chime clients` shows it: the `top` busiest clients, the distinct ones
    /// of the last hour and day, and what the log holds; `None` when it is off.
    pub(crate) fn clients(&self, top: usize) -> Option<serde_json::Value> {
        let log = self.clients.as_ref()?;
        let now = self.epoch.elapsed().as_nanos() as u64;
        let clients: Vec<_> = (log.top(top).iter())
            .map(|c| {
                serde_json::json!({
                    "address": c.address.to_string(),
                    "requests": c.requests,
                    "dropped": c.dropped,
                    "rate_limited": c.rate_limited,
                    "kod": c.kod,
                    "interval_seconds": c.interval,
                    "last_seen_seconds_ago": now.saturating_sub(c.last_seen_ns) as f64 / 1e9,
                })
            })
            .collect();
        let distinct = log.distinct(now);
        Some(serde_json::json!({
            "clients": clients,
            "distinct": { "last_hour": distinct.last_hour, "last_day": distinct.last_day },
            "capacity": log.capacity(),
            "bytes": log.bytes(),
        }))
    }
}

/// Counts a request from `meta`'s source in the client log, if it is on (with the batch's
/// monotonic time).
fn client_seen(clients: Option<(&ClientLog, u64)>, meta: &chime_udp::RecvMeta, fate: Fate) {
    if let Some((log, mono)) = clients {
        log.record(meta.src.ip(), mono, fate);
    }
}

impl NtpWorker {
    /// [`serve_time`] with the batch in hand's time, zone and pivot.
    fn serve_time(&self, local: NtpTimestamp) -> NtpTimestamp {
        serve_time(&self.time, self.zone.as_deref(), self.pivot_unix, local)
    }
}

/// The time a batch serves: chronyd's (the offset followed), smeared through a leap second with
/// `--leap-smear`.
#[derive(Clone, Copy, Debug)]
struct TimeServed {
    clock: ServedClock,
    /// The leap second smeared now, if any, and whether the time served has taken its step.
    smear: Option<(Smear, bool)>,
}

impl TimeServed {
    /// The local clock, unsmeared: what is served before the first poll.
    const LOCAL: Self = Self {
        clock: ServedClock::LOCAL,
        smear: None,
    };

    /// For a batch read at `reading` from `state`: the smear is looked at only with
    /// `--leap-smear`, and the monotonic clock read only within seconds of a leap.
    fn of(state: &ServerState, reading: clock::Reading, published: &Published) -> Self {
        Self {
            clock: state.clock,
            smear: published.smear_at(state, reading),
        }
    }

    /// chronyd's served time at local time `local`: UTC.
    fn utc(&self, local: NtpTimestamp) -> NtpTimestamp {
        self.clock.serve(local)
    }

    /// What replies carry for local time `local`: [`Self::utc`], smeared where a smear is on.
    fn served(&self, local: NtpTimestamp) -> NtpTimestamp {
        let utc = self.utc(local);
        match self.smear {
            Some((smear, stepped)) => smear.serve(utc, stepped),
            None => utc,
        }
    }
}

/// The time served for local time `local`: [`TimeServed::served`], shifted by the zone's offset
/// in timezone-offset mode (`pivot_unix` resolves the NTP era).
fn serve_time(
    time: &TimeServed,
    zone: Option<&Zone>,
    pivot_unix: i64,
    local: NtpTimestamp,
) -> NtpTimestamp {
    let upstream = time.served(local);
    match zone {
        Some(zone) => zone.apply(upstream, pivot_unix),
        None => upstream,
    }
}

/// What tests of the services built on the NTP side's state need.
#[cfg(test)]
pub(crate) mod testing {
    use chime_ntp::StalePolicy;

    use super::*;
    use crate::access::acl::Acl;
    use crate::clock::published::testing::published;

    /// The NTP side's shared state with `state` mirrored and the subnets in `deny` refused.
    pub(crate) fn shared(state: ServerState, deny: &[&str]) -> Arc<Shared> {
        let deny: Vec<String> = deny.iter().map(|s| (*s).to_owned()).collect();
        with_clock(published(state), &deny)
    }

    /// `state` published with NTPv5 on, and the leap smear if `smear`.
    pub(crate) fn speaking_v5(state: ServerState, smear: bool) -> Arc<Published> {
        let filter = ReferenceFilter::new(rand::random);
        let policy = StalePolicy::default();
        Arc::new(Published::with(state, policy, smear, Some(filter)))
    }

    /// The NTP side's shared state around `clock`, with the subnets in `deny` refused.
    pub(crate) fn with_clock(clock: Arc<Published>, deny: &[String]) -> Arc<Shared> {
        Arc::new(Shared {
            clock,
            access: Arc::new(Rules::new(Acl::new(&[], deny).unwrap())),
            cookies: None,
            workers: Arc::new(Workers::new("ntp")),
            stats_interval: None,
            ratelimit: None,
            epoch: Instant::now(),
            clients: None,
            txlog: None,
        })
    }
}

/// The worker driven in process, without a socket: batches are filled by hand, and the replies
/// read from the batch the worker queued them in.
#[cfg(test)]
mod tests {
    use chime_ntp::{Header, Leap};

    use super::testing::{shared, speaking_v5, with_clock};
    use super::*;
    use crate::clock::published::testing::synchronised;
    use crate::reply::testing::exchange;

    /// An NTPv4 client request (mode 3) with a transmit timestamp to be echoed.
    fn request() -> [u8; 48] {
        let mut r = [0u8; 48];
        r[0] = 0x23;
        r[40..48].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        r
    }

    #[test]
    fn a_client_gets_the_mirrored_state_in_a_reply_no_longer_than_its_request() {
        let mut worker = NtpWorker::new(shared(synchronised(), &[]), "ipv4", 0);
        let replies = exchange(&mut worker, "192.0.2.1:40000", &[&request()]);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].len(), 48);
        let h = Header::parse(&replies[0]).unwrap();
        assert_eq!(
            (h.leap, h.stratum, h.reference_id),
            (Leap::NoWarning, 3, *b"LOCL")
        );
        assert_eq!(
            replies[0][24..32],
            request()[40..48],
            "origin is the client's transmit"
        );
        assert_eq!(worker.stats.counts.received, 1);
    }

    #[test]
    fn every_time_served_is_the_upstreams_served_time() {
        let mut state = synchronised();
        state.clock = ServedClock {
            anchor: clock::now(),
            offset: 0.3,
            error: 300e-6,
            ..ServedClock::LOCAL
        };
        let on = with_clock(speaking_v5(state, false), &[]);
        let mut worker = NtpWorker::new(on, "ipv4", 0);
        let draft = chime_ntp::v5::Draft::D08;
        let mut v5_request = [0u8; 76];
        v5::write_request(&mut v5_request, draft, 4, [9; 8], None).unwrap();
        let before = clock::now();
        let replies = exchange(
            &mut worker,
            "192.0.2.1:40000",
            &[&request()[..], &v5_request],
        );
        let after = clock::now();
        let v4 = Header::parse(&replies[0]).unwrap();
        let v5 = v5::parse_response(&replies[1], [9; 8], draft).unwrap();
        for t in [v4.receive_ts, v4.transmit_ts, v5.receive_ts, v5.transmit_ts] {
            let (from, to) = (
                t.wrapping_diff_seconds(before),
                t.wrapping_diff_seconds(after),
            );
            assert!(from >= 0.3 && to <= 0.3, "not 0.3 s ahead: {from} {to}");
        }
        // chronyd's 2 ms root dispersion with the offset's 0.3 ms bound, rounded up.
        let dispersion = v4.root_dispersion.seconds();
        assert!((0.0023..0.00232).contains(&dispersion), "{dispersion}");
    }

    /// The v5 replies to a request for TAI from a worker whose state is `state`, each with its
    /// times less the clock's around the exchange, seconds.
    fn asked_for_tai(state: ServerState) -> (v5::Response<'static>, f64, f64, u64) {
        let on = with_clock(speaking_v5(state, false), &[]);
        let mut worker = NtpWorker::new(on, "ipv4", 0);
        let draft = chime_ntp::v5::Draft::D09;
        let mut request = [0u8; 76];
        v5::write_request(&mut request, draft, 4, [7; 8], None).unwrap();
        v5::ask_timescale(&mut request, v5::timescale::TAI);
        let before = clock::now();
        let replies = exchange(&mut worker, "192.0.2.1:40000", &[&request[..]]);
        let after = clock::now();
        let bytes: &'static [u8] = replies[0].clone().leak();
        let r = v5::parse_response(bytes, [7; 8], draft).unwrap();
        let ahead = |t: NtpTimestamp| t.wrapping_diff_seconds(before);
        let behind = |t: NtpTimestamp| t.wrapping_diff_seconds(after);
        let from = ahead(r.receive_ts).min(ahead(r.transmit_ts));
        let to = behind(r.receive_ts).max(behind(r.transmit_ts));
        (r, from, to, worker.stats.counts.notes[Note::Tai.index()])
    }

    #[test]
    fn a_v5_request_for_tai_is_answered_in_tai_where_it_is_known() {
        let known = ServerState {
            tai_offset: Some(37),
            leap_step: chime_ntp::LeapStep::NONE,
            ..synchronised()
        };
        let (r, from, to, counted) = asked_for_tai(known);
        assert_eq!(r.timescale, v5::timescale::TAI);
        assert!(from >= 37.0 && to <= 37.0, "not 37 s ahead: {from} {to}");
        assert_eq!(counted, 1);

        // Unknown, or within a second of a leap: UTC, and the reply says so.
        let leap_now = ServerState {
            leap: Leap::AddSecond,
            announced: Some(chime_ntp::Announced {
                leap: Leap::AddSecond,
                at: clock::now().add_duration(std::time::Duration::from_millis(500)),
            }),
            ..known
        };
        for state in [synchronised(), leap_now] {
            let (r, from, to, counted) = asked_for_tai(state);
            assert_eq!(r.timescale, v5::timescale::UTC, "{state:?}");
            assert!(from >= 0.0 && to <= 0.0, "not UTC: {from} {to}");
            assert_eq!(counted, 0);
        }
    }

    #[test]
    fn with_leap_smear_the_time_is_smeared_and_no_leap_announced_but_tai_is_not_smeared() {
        let published = speaking_v5(ServerState::unsynchronised(), true);
        let read = clock::read();
        let leap = chime_ntp::Announced {
            leap: Leap::AddSecond,
            at: read.ntp().add_duration(Duration::from_secs(10)),
        };
        let state = ServerState {
            leap: Leap::AddSecond,
            announced: Some(leap),
            tai_offset: Some(37),
            leap_step: chime_ntp::LeapStep {
                leap: Some(leap),
                stepped: false,
                realtime_minus_monotonic: published.realtime_minus_monotonic(read),
            },
            ..synchronised()
        };
        published.publish(state);
        let mut worker = NtpWorker::new(with_clock(published, &[]), "ipv4", 0);
        let draft = chime_ntp::v5::Draft::D09;
        let mut utc = [0u8; 76];
        v5::write_request(&mut utc, draft, 4, [1; 8], None).unwrap();
        let mut tai = utc;
        tai[24..32].copy_from_slice(&[2; 8]);
        v5::ask_timescale(&mut tai, v5::timescale::TAI);
        let before = clock::now();
        let replies = exchange(
            &mut worker,
            "192.0.2.1:40000",
            &[&request()[..], &utc[..], &tai[..]],
        );
        let after = clock::now();
        let ahead = |t: NtpTimestamp| {
            (
                t.wrapping_diff_seconds(before),
                t.wrapping_diff_seconds(after),
            )
        };
        // Ten seconds before the leap, 43 190 s of the smear's 86 401 are over.
        let smeared = -(43_190.0 / 86_401.0);
        let v4 = Header::parse(&replies[0]).unwrap();
        assert_eq!(v4.leap, Leap::NoWarning);
        let v5_utc = v5::parse_response(&replies[1], [1; 8], draft).unwrap();
        assert_eq!(v5_utc.timescale, v5::timescale::LEAP_SMEARED_UTC);
        for t in [v4.receive_ts, v4.transmit_ts, v5_utc.transmit_ts] {
            let (from, to) = ahead(t);
            assert!(
                from >= smeared - 1e-6 && to <= smeared + 1e-6,
                "not smeared: {from} {to}"
            );
        }
        let v5_tai = v5::parse_response(&replies[2], [2; 8], draft).unwrap();
        assert_eq!(v5_tai.timescale, v5::timescale::TAI);
        for t in [v5_tai.receive_ts, v5_tai.transmit_ts] {
            let (from, to) = ahead(t);
            assert!(from >= 37.0 && to <= 37.0, "TAI smeared: {from} {to}");
        }
    }

    #[test]
    fn with_ntpv5_on_a_v5_request_is_answered_in_kind_and_an_upgrade_probe_echoed() {
        let draft = chime_ntp::v5::Draft::D08;
        let mut v5_request = [0u8; 76];
        let len = v5::write_request(&mut v5_request, draft, 4, [9; 8], None).unwrap();
        assert_eq!(len, v5_request.len());
        let mut probe = request();
        probe[16..24].copy_from_slice(&v5::UPGRADE);

        let mut off = NtpWorker::new(shared(synchronised(), &[]), "ipv4", 0);
        let replies = exchange(&mut off, "192.0.2.1:40000", &[&v5_request[..], &probe[..]]);
        assert_eq!(replies.len(), 1, "v5 is off: only the probe is answered");
        assert_ne!(replies[0][16..24], v5::UPGRADE);
        let bad_version = NtpDrop::Request(DropReason::BadVersion(5));
        assert_eq!(off.stats.counts.dropped(bad_version), 1);

        let on = with_clock(speaking_v5(synchronised(), false), &[]);
        let mut worker = NtpWorker::new(on, "ipv4", 0);
        let replies = exchange(
            &mut worker,
            "192.0.2.1:40000",
            &[&v5_request[..], &probe[..]],
        );
        assert_eq!(replies.len(), 2);
        assert_eq!(replies[0].len(), v5_request.len());
        let r = v5::parse_response(&replies[0], [9; 8], draft).unwrap();
        assert_eq!((r.stratum, r.leap, r.flags), (3, Leap::NoWarning, 1));
        assert!(r.transmit_ts.0 > r.receive_ts.0, "stamped before the send");
        assert_eq!(replies[1][16..24], v5::UPGRADE);
        let notes = worker.stats.counts.notes;
        assert_eq!(
            (notes[Note::V5.index()], notes[Note::Upgrade.index()]),
            (1, 1)
        );
    }

    #[test]
    fn an_unsynchronised_upstream_is_served_as_such() {
        let mut worker = NtpWorker::new(shared(ServerState::unsynchronised(), &[]), "ipv4", 0);
        let replies = exchange(&mut worker, "192.0.2.1:40000", &[&request()]);
        let h = Header::parse(&replies[0]).unwrap();
        assert_eq!((h.leap, h.stratum), (Leap::Unsynchronised, 0));
    }

    #[test]
    fn denied_and_malformed_requests_are_dropped_and_counted() {
        let mut worker = NtpWorker::new(shared(synchronised(), &["198.51.100.0/24"]), "ipv4", 0);
        let denied = exchange(&mut worker, "198.51.100.7:123", &[&request()]);
        let short = exchange(&mut worker, "192.0.2.1:40000", &[&request()[..47]]);
        assert!(denied.is_empty() && short.is_empty());
        let p = worker.stats.counts;
        assert_eq!(p.received, 2);
        assert_eq!(p.dropped(NtpDrop::Denied), 1);
        assert_eq!(p.dropped(NtpDrop::Request(DropReason::TooShort)), 1);
    }

    #[test]
    fn every_drop_reason_has_a_label_of_its_own() {
        use crate::observe::counters::Reason as _;
        let mut labels = NtpDrop::LABELS.to_vec();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), NtpDrop::COUNT);
        assert!(!labels.contains(&""));
        let label = |why: NtpDrop| NtpDrop::LABELS[why.index()];
        assert_eq!(label(NtpDrop::RateLimited), "rate_limited");
        assert_eq!(label(NtpDrop::Request(DropReason::TooShort)), "too_short");
    }

    #[test]
    fn the_watchdog_sees_every_batch_and_every_idle_wake_up() {
        let mut hearts = crate::service::Heartbeats::default();
        let mut worker =
            NtpWorker::new(shared(synchronised(), &[]), "ipv4", 0).with_heartbeat(hearts.add());
        assert!(!hearts.all_moved(), "nothing happened yet");
        exchange(&mut worker, "192.0.2.1:40000", &[&request()]);
        assert!(hearts.all_moved(), "a batch");
        worker.idle();
        assert!(hearts.all_moved(), "an idle wake-up");
        assert!(!hearts.all_moved(), "nothing since");
    }
}
