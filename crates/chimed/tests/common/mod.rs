//! Real processes for the integration tests: a chronyd that never touches the clock (`-x`) on a
//! free loopback port, the real chimed binary, and the real chime client. Every process is ended
//! when its handle drops; every wait is bounded.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

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
    /// Starts the real chimed with these flags and waits for its "ntp listening on" line.
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chimed"))
            .args(args)
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
                    self.log()
                ),
            }
        }
    }

    pub fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        signal::kill(self.pid(), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "chimed did not exit within 10 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Chimed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sibling binary of the workspace (`chime`), built by `cargo test --workspace` next to this
/// test's own package binaries.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        bin.display()
    );
    bin
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

/// `chime ntp --json ADDR`, parsed.
pub fn chime_ntp(addr: SocketAddr) -> Result<serde_json::Value, String> {
    let out = run(Command::new(workspace_bin("chime"))
        .args(["ntp", "--json", "--timeout", "1"])
        .arg(addr.to_string()));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

/// chronyd itself as a client: `chronyd -Q` measures the server's offset without touching the
/// clock. Returns the offset it printed.
pub fn chronyd_client_offset(addr: SocketAddr) -> Result<f64, String> {
    let dir = tempfile::tempdir().unwrap();
    let host = match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => a.ip().to_string(),
    };
    let out = run(Command::new(CHRONYD)
        .args(["-Q", "-t", "10", "-u", "root"])
        .arg(format!(
            "server {host} port {} iburst maxsamples 4",
            addr.port()
        ))
        .arg(format!("pidfile {}/pid", dir.path().display()))
        .arg(format!("driftfile {}/drift", dir.path().display()))
        .arg("cmdport 0"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // "System clock wrong by -0.000012 seconds (ignored)"
    let Some(rest) = text.split("System clock wrong by ").nth(1) else {
        return Err(format!("chronyd -Q accepted no reply: {text}"));
    };
    rest.split_whitespace()
        .next()
        .unwrap()
        .parse()
        .map_err(|e| format!("{e}: {text}"))
}

/// Sends `packet` and returns the reply if one comes within `wait`.
pub fn exchange(to: SocketAddr, packet: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let local = if to.is_ipv4() {
        "127.0.0.1:0"
    } else {
        "[::1]:0"
    };
    let sock = UdpSocket::bind(local).unwrap();
    sock.set_read_timeout(Some(wait)).unwrap();
    sock.send_to(packet, to).unwrap();
    let mut buf = [0u8; 2048];
    sock.recv_from(&mut buf)
        .ok()
        .map(|(n, _)| buf[..n].to_vec())
}
