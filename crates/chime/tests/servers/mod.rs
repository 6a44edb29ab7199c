//! Real processes for the integration tests: a chronyd that never touches the clock (`-x`) on a
//! free loopback port, the real chimed binary mirroring it, and a tiny NTP responder in the test
//! itself whose answers are chosen (every other request, wrong mode) and counted. Every process is
//! ended when its handle drops; every wait is bounded.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chime_ntp::{Header, Mode, NtpTimestamp};

pub const CHRONYD: &str = "/usr/sbin/chronyd";

/// A port that was free a moment ago. chronyd cannot bind port 0 (it means "no server"), so it
/// is the one process here that needs a port chosen for it.
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Chronyd {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Chronyd {
    /// Starts `chronyd -x -d` as a local stratum-3 server on 127.0.0.1 and waits until it answers.
    pub fn start() -> Self {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_udp_port();
            let conf = dir.path().join("chrony.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbindaddress 127.0.0.1\nallow 127.0.0.1\nlocal stratum 3\n\
                     cmdport 0\npidfile {d}/chronyd.pid\ndriftfile {d}/drift\n",
                    d = dir.path().display()
                ),
            )
            .unwrap();
            let child = Command::new(CHRONYD)
                .args(["-x", "-d", "-u", "root", "-f"])
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chronyd must be installed (apt-get install chrony)");
            let mut c = Chronyd {
                child,
                port,
                _dir: dir,
            };
            if c.wait_ready(Duration::from_secs(10)) {
                return c;
            }
            c.stop();
        }
        panic!("chronyd did not start on a free port after 5 tries");
    }

    pub fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let deadline = Instant::now() + limit;
        let mut req = [0u8; 48];
        req[0] = 0x23; // v4, client
        req[40..48].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            sock.send_to(&req, self.addr()).unwrap();
            let mut buf = [0u8; 256];
            if let Ok((n, _)) = sock.recv_from(&mut buf) {
                // Synchronised to its local reference: leap != 3 and stratum 3.
                if n >= 48 && buf[0] >> 6 != 3 && buf[1] == 3 {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Chronyd {
    fn drop(&mut self) {
        self.stop();
    }
}

pub struct Chimed {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    rx: Receiver<String>,
    pub addr: SocketAddr,
}

impl Chimed {
    /// Starts the workspace's chimed on 127.0.0.1 port 0 with two threads, mirroring `chronyd`,
    /// and waits until it serves chronyd's state.
    pub fn start(chronyd: &Chronyd) -> Self {
        let upstream = chronyd.addr().to_string();
        let mut child = Command::new(workspace_bin("chimed"))
            .args(["-4", "2", "-6", "0", "-a", "127.0.0.1:0", "-s", &upstream])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let all = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                all.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut c = Chimed {
            child,
            lines,
            rx,
            addr: ([0, 0, 0, 0], 0).into(),
        };
        let line = c.wait_for("ntp listening on", Duration::from_secs(10));
        let addr = line
            .split("ntp listening on ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        c.addr = addr.parse().unwrap();
        c.wait_for("synchronised: stratum 3", Duration::from_secs(10));
        c
    }

    /// Waits for a log line containing `needle`, returning it; panics with the log if none comes.
    pub fn wait_for(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        if let Some(l) = self
            .lines
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains(needle))
        {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "no '{needle}' from chimed within {limit:?}; log:\n{}",
                    self.lines.lock().unwrap().join("\n")
                ),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Chimed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sibling binary of the workspace (`chimed`), built by `cargo test --workspace` next to this
/// test's own package binaries.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (or `cargo build -p {name}` \
         first)",
        bin.display()
    );
    bin
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
