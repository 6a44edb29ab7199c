//! What `chime perf`'s tests need beyond chimed's shared test support (real chronyd and chimed,
//! included from crates/chimed/tests/common): a tiny NTP responder in the test itself whose
//! answers are chosen (every other request, wrong mode) and counted, and a runner for the tool.

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
    // A 4 MiB receive buffer: a loaded test machine can stall chimed for a few hundred ms, longer
    // than the kernel's default buffer holds requests at 2000/s.
    let mut chimed = Chimed::mirroring(
        &chronyd.addr().to_string(),
        &["-4", "2", "--recv-buffer", "4194304"],
    );
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
                    if sock.send_to(&out, from).is_ok() {
                        replied.fetch_add(1, Ordering::Relaxed);
                    }
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
        self.replied.load(Ordering::Relaxed)
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
