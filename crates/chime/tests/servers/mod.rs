//! What `chime perf`'s tests need beyond chimed's shared test support (real chronyd and chimed,
//! included from crates/chimed/tests/common): tiny NTP responders in the test itself whose
//! answers are chosen (every other request, wrong mode; for NTPv5 another cookie or draft) and
//! counted, and a runner for the tool.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chime_ntp::{Header, Mode, NtpTimestamp};

use crate::common::{Chimed, Chronyd};

/// chimed with two IPv4 threads on 127.0.0.1 port 0 mirroring `chronyd`, once it serves
/// chronyd's state.
pub fn start_chimed(chronyd: &Chronyd) -> Chimed {
    start_chimed_with(chronyd, &[])
}

/// [`start_chimed`] with `extra` flags (such as `--ntpv5`).
pub fn start_chimed_with(chronyd: &Chronyd, extra: &[&str]) -> Chimed {
    // A 4 MiB receive buffer: a loaded test machine can stall chimed for a few hundred ms, longer
    // than the kernel's default buffer holds requests at 2000/s.
    let mut args = vec!["-4", "2", "--recv-buffer", "4194304"];
    args.extend_from_slice(extra);
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), &args);
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    chimed
}

/// Which requests the [`Responder`] answers, and how.
#[derive(Clone, Copy, Debug)]
pub enum Policy {
    /// A valid server reply to every other request (the 1st, 3rd, 5th, ...).
    EveryOther,
    /// A reply to every request, in symmetric passive mode where server mode is due.
    WrongMode,
    /// NTPv5 requests only: a reply to each, made here byte by byte (not by chime-ntp), as
    /// [`V5Reply`] says.
    V5(V5Reply),
}

/// How the responder answers an NTPv5 request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V5Reply {
    /// As a synchronised stratum-2 server should: the request's cookie and draft echoed.
    Faithful,
    /// With the client cookie's first byte changed: the answer to another request.
    WrongCookie,
    /// Naming the other draft (-08 for -09 and the other way round).
    OtherDraft,
    /// A Kiss-o'-Death RATE, its code in the server cookie.
    Kiss,
}

/// A minimal NTP server in the test process: answers as its policy says and counts what it sent,
/// an independent count to check `chime perf` against.
pub struct Responder {
    pub addr: SocketAddr,
    received: Arc<AtomicU64>,
    replied: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Responder {
    pub fn start(policy: Policy) -> Self {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        // 4 MiB, as chimed gets in these tests: a loaded machine can stall this thread for a few
        // hundred ms. Refused without CAP_NET_ADMIN; the kernel's drop count then closes the books.
        let _ =
            nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBufForce, &(4 << 20));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let replied = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, replied, stop) = (received.clone(), replied.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = sock.recv_from(&mut buf) else {
                        continue;
                    };
                    let t2 = now();
                    let count = received.fetch_add(1, Ordering::Relaxed);
                    let Ok(request) = Header::parse(&buf[..n]) else {
                        continue;
                    };
                    let mode = match policy {
                        Policy::EveryOther if count % 2 == 1 => continue,
                        Policy::EveryOther => Mode::Server,
                        Policy::WrongMode => Mode::SymmetricPassive,
                        Policy::V5(how) => {
                            let reply = v5_reply(&buf[..n], t2, how);
                            send_counted(&sock, &reply, from, &replied);
                            continue;
                        }
                    };
                    let reply = Header {
                        mode,
                        stratum: 2,
                        reference_id: [192, 0, 2, 1],
                        reference_ts: t2,
                        origin_ts: request.transmit_ts,
                        receive_ts: t2,
                        transmit_ts: now(),
                        ..request
                    };
                    let mut out = [0u8; 48];
                    reply.encode(&mut out);
                    send_counted(&sock, &out, from, &replied);
                }
            })
        };
        Self {
            addr,
            received,
            replied,
            stop,
            thread: Some(thread),
        }
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    pub fn replied(&self) -> u64 {
        self.replied.load(Ordering::SeqCst)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A reply to an NTPv5 request, written from the draft's layout here rather than by chime-ntp's
/// responder: the request's bytes (its cookie and Draft Identification) with a server's header.
fn v5_reply(request: &[u8], t2: NtpTimestamp, how: V5Reply) -> Vec<u8> {
    let mut r = request.to_vec();
    if r.len() < 48 {
        return r;
    }
    r[0] = 5 << 3 | 4; // leap 0, version 5, mode 4 (server)
    (r[1], r[3]) = (2, -20i8 as u8); // stratum, precision
    r[4..16].fill(0); // root delay and dispersion, timescale UTC, era 0, flags
    r[15] = 0x01; // synchronised
    r[16..24].copy_from_slice(&t2.0.to_be_bytes()); // the server cookie
    r[32..40].copy_from_slice(&t2.0.to_be_bytes());
    r[40..48].copy_from_slice(&now().0.to_be_bytes());
    match how {
        V5Reply::Faithful => {}
        V5Reply::WrongCookie => r[24] ^= 0xFF,
        V5Reply::OtherDraft => {
            let name = b"draft-ietf-ntp-ntpv5-0";
            if let Some(at) = r.windows(name.len()).position(|w| w == name) {
                r[at + name.len()] ^= 1; // '8' <-> '9'
            }
        }
        V5Reply::Kiss => {
            r[0] = 3 << 6 | 5 << 3 | 4; // leap 3
            (r[1], r[15]) = (0, 0);
            r[16..20].copy_from_slice(b"RATE");
        }
    }
    r
}

fn now() -> NtpTimestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    NtpTimestamp::from_unix(d.as_secs() as i64, d.subsec_nanos())
}

/// Runs `chime perf ntp` with these flags plus `--json`, returning the exit status, stderr and
/// the parsed JSON (if it was written).
pub fn chime_perf(args: &[&str]) -> (i32, String, Option<serde_json::Value>) {
    // One load at a time: these runs check what the instrument reports, and several at once on a
    // two-core machine starve the servers under test into losses that are nobody's bug.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("perf.json");
    let out = Command::new(env!("CARGO_BIN_EXE_chime"))
        .args(["perf", "ntp"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let value = std::fs::read(&json)
        .ok()
        .filter(|b| !b.is_empty())
        .map(|b| serde_json::from_slice(&b).unwrap());
    let code = out.status.code().unwrap_or(-1);
    if code == 0 {
        // The table is what a person reads: show it in the test log.
        println!("{}", String::from_utf8_lossy(&out.stdout));
    }
    (code, stderr, value)
}

/// Sends `reply` to `to`, counted in `replied` before it leaves: a client that has its reply may
/// read the count at once, and finds it there (counted after the send, a test on two busy cores
/// read 0 for a reply its client had already taken).
fn send_counted(sock: &UdpSocket, reply: &[u8], to: SocketAddr, replied: &AtomicU64) {
    replied.fetch_add(1, Ordering::SeqCst);
    if sock.send_to(reply, to).is_err() {
        replied.fetch_sub(1, Ordering::SeqCst);
    }
}
