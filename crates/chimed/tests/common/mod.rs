//! Real processes for the integration tests: a chronyd that never touches the clock (`-x`) on a
//! free loopback port, the real chimed binary, and the real chime client. Every process is ended
//! when its handle drops; every wait is bounded.

#![allow(dead_code, unreachable_pub)]

pub mod standin;

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
            let mut c = Self::spawn(None, free_udp_port(), true);
            if c.wait_ready(Duration::from_secs(10), true) {
                return c;
            }
            c.stop();
        }
        panic!("chronyd did not start on a free port after 5 tries");
    }

    /// Starts the same server inside network namespace `netns` on 127.0.0.1 `port` (the
    /// namespace's own loopback: nothing else there holds the port), without waiting: the test
    /// cannot reach it from here, so whoever uses it waits (chimed logs when it is synchronised).
    pub fn start_in(netns: &str, port: u16) -> Self {
        Self::spawn(Some(netns), port, true)
    }

    /// Starts chronyd on 127.0.0.1 `port` (one that a chronyd just stopped held), synchronised to
    /// its local reference or, with `synchronised` false, with no reference at all: it then
    /// answers every client as unsynchronised (leap 3, stratum 0). Waits until it answers so.
    pub fn start_on(port: u16, synchronised: bool) -> Self {
        let mut c = Self::spawn(None, port, synchronised);
        assert!(
            c.wait_ready(Duration::from_secs(10), synchronised),
            "chronyd did not answer on port {port}"
        );
        c
    }

    fn spawn(netns: Option<&str>, port: u16, local: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("chrony.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbindaddress 127.0.0.1\nallow 127.0.0.1\n{local}\
                 cmdport 0\npidfile {d}/chronyd.pid\ndriftfile {d}/drift\n",
                d = dir.path().display(),
                local = if local { "local stratum 3\n" } else { "" }
            ),
        )
        .unwrap();
        let child = in_netns(netns, CHRONYD)
            .args(["-x", "-d", "-u", "root", "-f"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chronyd must be installed (apt-get install chrony)");
        Chronyd {
            child,
            port,
            _dir: dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(&mut self, limit: Duration, synchronised: bool) -> bool {
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
                // Synchronised to its local reference: leap != 3 and stratum 3; or, asked for
                // no reference, answering as unsynchronised.
                let synced = buf[0] >> 6 != 3 && buf[1] == 3;
                if n >= 48 && synced == synchronised {
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

/// chronyd as a long-running NTP client (`-x`: it never touches the clock) with these
/// directives (its `server` line and any more), logging its measurements; killed when dropped.
pub struct ChronydClient {
    child: Child,
    logs: tempfile::TempDir,
}

impl ChronydClient {
    pub fn start(directives: &[String]) -> Self {
        Self::start_in(None, directives)
    }

    /// [`start`](Self::start) inside network namespace `netns`.
    pub fn start_in(netns: Option<&str>, directives: &[String]) -> Self {
        let logs = tempfile::tempdir().unwrap();
        let d = logs.path().display();
        let child = in_netns(netns, CHRONYD)
            .args(["-x", "-d", "-u", "root"])
            .args(directives)
            .arg(format!("pidfile {d}/pid"))
            .arg(format!("driftfile {d}/drift"))
            .arg(format!("logdir {d}"))
            .args(["log measurements", "cmdport 0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, logs }
    }

    /// The lines of measurements.log so far, split into columns (offset is 11, peer delay 12,
    /// mode 17, transmit and receive timestamp sources 18 and 19).
    pub fn measurements(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.logs.path().join("measurements.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// How many measurements it has logged so far.
    pub fn measured(&self) -> usize {
        self.measurements().len()
    }
}

impl Drop for ChronydClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Chimed {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    rx: Receiver<String>,
    pub addr: SocketAddr,
}

impl Chimed {
    /// Starts chimed mirroring `upstream`, with `extra` flags on top of loopback defaults (one
    /// IPv4 thread on 127.0.0.1 port 0, no IPv6), each default left out if `extra` sets it.
    pub fn mirroring(upstream: &str, extra: &[&str]) -> Self {
        let mut args = vec!["-s", upstream];
        for (flag, value) in [("-4", "1"), ("-6", "0"), ("-a", "127.0.0.1:0")] {
            if !extra.contains(&flag) {
                args.extend_from_slice(&[flag, value]);
            }
        }
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// Starts the real chimed with these flags and waits for its "ntp listening on" line.
    pub fn start(args: &[&str]) -> Self {
        let mut c = Self::start_until(args, "ntp listening on");
        let line = c.wait_for("ntp listening on", Duration::from_secs(1));
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

    /// Starts the real chimed with these flags and waits for a log line containing `ready`; for
    /// a chimed with no NTP threads (an NTS-KE-only member), whose `addr` stays unspecified.
    pub fn start_until(args: &[&str], ready: &str) -> Self {
        Self::start_in(None, args, ready)
    }

    /// [`start_until`](Self::start_until) inside network namespace `netns` (`ip netns exec`,
    /// which execs chimed: the child is chimed itself, and signals reach it).
    pub fn start_in(netns: Option<&str>, args: &[&str], ready: &str) -> Self {
        Self::start_with_env(netns, args, &[], ready)
    }

    /// [`start_in`](Self::start_in) with these environment variables set for chimed.
    pub fn start_with_env(
        netns: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
        ready: &str,
    ) -> Self {
        // Each test's chimed makes a control socket only where the test says: at the default
        // path, tests running side by side would meet.
        let control = if args.contains(&"--control-socket") {
            &[][..]
        } else {
            &["--control-socket", "none"][..]
        };
        let mut child = in_netns(netns, workspace_bin("chimed"))
            .args(args)
            .args(control)
            .envs(env.iter().copied())
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
        c.wait_for(ready, Duration::from_secs(10));
        c
    }

    /// Waits for the log line that gives an address right after `prefix` (such as
    /// "nts-ke listening on " or "metrics: http://") and returns that address.
    pub fn logged_addr(&mut self, prefix: &str) -> SocketAddr {
        let line = self.wait_for(prefix, Duration::from_secs(10));
        line.split(prefix)
            .nth(1)
            .and_then(|rest| rest.split([' ', '/']).next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address after {prefix:?} in {line:?}"))
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

    /// Stops chimed with SIGSTOP and returns once every one of its threads is stopped (the
    /// signal only asks: a worker could otherwise still take a datagram sent right after it), so
    /// that what is sent next waits queued in the sockets until [`resume`](Self::resume).
    pub fn pause(&self) {
        signal::kill(self.pid(), Signal::SIGSTOP).unwrap();
        let tasks = format!("/proc/{}/task", self.child.id());
        let stopped = || {
            std::fs::read_dir(&tasks).unwrap().all(|t| {
                let stat = std::fs::read_to_string(t.unwrap().path().join("stat"));
                // The state follows the parenthesised command name: "T" is stopped.
                stat.is_ok_and(|s| {
                    s.rsplit(')')
                        .next()
                        .is_some_and(|r| r.trim_start().starts_with('T'))
                })
            })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stopped() {
            assert!(Instant::now() < deadline, "chimed did not stop within 5 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Continues chimed after [`pause`](Self::pause).
    pub fn resume(&self) {
        signal::kill(self.pid(), Signal::SIGCONT).unwrap();
    }

    /// Waits up to `limit` for chimed to exit by itself; its status, or `None` if it still runs.
    pub fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asserts that chimed, made to fail through its fail points (`failpoints`, as FAILPOINTS
    /// gave them), exits 1 by itself within 2 s of now, with an error line containing `named`;
    /// prints that line and how long it took.
    pub fn assert_fails_naming(&mut self, failpoints: &str, named: &str) {
        let start = Instant::now();
        let status = self.exit_within(Duration::from_secs(2));
        let took = start.elapsed();
        let log = self.log();
        let status = status.unwrap_or_else(|| panic!("{failpoints}: still running:\n{log}"));
        assert_eq!(status.code(), Some(1), "{failpoints}: {status}\n{log}");
        let line = log
            .lines()
            .find(|l| l.contains(named))
            .unwrap_or_else(|| panic!("{failpoints}: no '{named}' in:\n{log}"));
        assert!(line.contains("ERROR"), "{failpoints}: {line}");
        eprintln!("{failpoints}: exit 1 after {took:?}: {line}");
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

/// A command for `program`, run inside network namespace `netns` if one is given (`ip netns
/// exec NS PROGRAM`: ip enters the namespace and execs the program in its own place).
pub fn in_netns(netns: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match netns {
        Some(ns) => {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Runs `ip ARGS` (iproute2), failing the test with its error output if it fails.
pub fn ip(args: &[&str]) {
    let out = run(Command::new("ip").args(args));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread that has entered network namespace `ns`: its sockets are made there.
pub fn within<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// `GET /metrics` from chimed's endpoint at `addr` inside network namespace `ns`: the page.
pub fn scrape_in(ns: &str, addr: SocketAddr) -> String {
    within(ns, move || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: chimed\r\n\r\n")
            .unwrap();
        let mut page = String::new();
        s.read_to_string(&mut page).unwrap();
        page
    })
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

/// `chime ntp --json ADDR`, parsed.
pub fn chime_ntp(addr: SocketAddr) -> Result<serde_json::Value, String> {
    chime_ntp_with(addr, &[])
}

/// [`chime_ntp`] with `extra` flags.
pub fn chime_ntp_with(addr: SocketAddr, extra: &[&str]) -> Result<serde_json::Value, String> {
    let out = run(Command::new(workspace_bin("chime"))
        .args(["ntp", "--json", "--timeout", "1"])
        .args(extra)
        .arg(addr.to_string()));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

/// The count after `key=` in one of chimed's counter lines. The lines at exit carry every
/// counter, zeros too, so a key that is missing is a counter chimed lost (or a misspelt key):
/// that fails the test, never reads as 0.
#[track_caller]
pub fn count_in(line: &str, key: &str) -> u64 {
    line.split([' ', ':', '|'])
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter {key} in {line:?}"))
}

/// Checks the offset of one `chime ntp` exchange (its JSON `r`) against `expected` seconds. chime
/// reads its own send and receive times in user space around blocking calls, so on a loaded machine
/// a stall on either side skews one exchange by up to half its round trip: the bound is a
/// millisecond plus that half. (chronyd as a client, which keeps the best of several, holds the
/// millisecond alone.)
#[track_caller]
pub fn assert_offset_near(r: &serde_json::Value, expected: f64) {
    let (offset, delay) = (r["offset"].as_f64().unwrap(), r["delay"].as_f64().unwrap());
    assert!(
        (offset - expected).abs() < 1e-3 + delay / 2.0,
        "offset {offset} s (expected {expected}), delay {delay} s: {r}"
    );
}

/// chronyd itself as a client: `chronyd -Q` measures the server's offset without touching the
/// clock. Returns the offset it printed.
pub fn chronyd_client_offset(addr: SocketAddr) -> Result<f64, String> {
    let host = match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => a.ip().to_string(),
    };
    let server = format!("server {host} port {} iburst maxsamples 4", addr.port());
    chronyd_measure(&server, &[], 10)
}

/// `chronyd -Q` with the `server` directive and `extra` directives, giving up after `limit_s`
/// seconds: the offset it printed, or its output if it measured nothing.
pub fn chronyd_measure(server: &str, extra: &[String], limit_s: u32) -> Result<f64, String> {
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(CHRONYD)
        .args(["-Q", "-t", &limit_s.to_string(), "-u", "root"])
        .arg(server)
        .args(extra)
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

impl Chimed {
    /// The Roughtime address from chimed's "roughtime listening on ADDR (...)" line.
    pub fn roughtime_addr(&mut self) -> SocketAddr {
        let line = self.wait_for("roughtime listening on ", Duration::from_secs(10));
        let addr = line
            .split("roughtime listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        addr.parse()
            .unwrap_or_else(|e| panic!("{addr:?} in {line:?}: {e}"))
    }
}

/// A long-term key made by `chime keygen` in a directory of its own.
pub struct RoughtimeKey {
    pub file: PathBuf,
    pub public_base64: String,
    pub public_hex: String,
    /// The 32-byte Ed25519 seed, in hex, as the file holds it.
    pub seed_hex: String,
    _dir: tempfile::TempDir,
}

/// `chime keygen` into a fresh temporary directory, with what it printed parsed.
/// chimed's flags for Roughtime with `key_file` on 127.0.0.1 port 0, one IPv4 thread, no IPv6.
pub fn roughtime_flags(key_file: &str) -> [&str; 8] {
    roughtime_flags_for("--roughtime-key", key_file)
}

/// [`roughtime_flags`] with `flag` (`--roughtime-key` or `--roughtime-delegation`) naming `file`.
pub fn roughtime_flags_for<'a>(flag: &'a str, file: &'a str) -> [&'a str; 8] {
    [
        flag,
        file,
        "--roughtime-ipv4-address",
        "127.0.0.1:0",
        "--roughtime-ipv4-threads",
        "1",
        "--roughtime-ipv6-threads",
        "0",
    ]
}

pub fn chime_keygen() -> RoughtimeKey {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("roughtime.key");
    let out = run(Command::new(workspace_bin("chime"))
        .arg("keygen")
        .arg(&file));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chime keygen failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' in chime keygen's output: {stdout}"))
            .trim()
            .to_owned()
    };
    let public_base64 = field("public key (base64): ");
    let public_hex = field("public key (hex): ");
    let text = std::fs::read_to_string(&file).unwrap();
    let seed_hex = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_else(|| panic!("no seed line in the key file: {text}"))
        .to_owned();
    assert!(
        seed_hex.len() == 64 && seed_hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "the key file's seed is not 64 hex digits: {text}"
    );
    RoughtimeKey {
        file,
        public_base64,
        public_hex,
        seed_hex,
        _dir: dir,
    }
}

/// An independent peer installed by `scripts/setup` at a fixed path, or where the environment
/// variable `var` points. Missing is a failure, never a skip: CI must run these tests.
pub fn peer(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup (it installs the Roughtime peers into /opt/chime-peers), \
         or point {var} at the binary",
        path.display()
    );
    path
}

/// A minimal RFC 10049 request (VER 1, NONC, TYPE 0, ZZZZ to 1024 bytes), built here by hand so
/// that readiness checks depend on neither chime's code nor a peer's.
pub fn roughtime_probe_request(nonce: [u8; 32]) -> Vec<u8> {
    roughtime_probe_request_in(1, nonce)
}

/// [`roughtime_probe_request`] offering version `ver` instead, for a server that does not speak
/// version 1 (a draft-11 server ignores the TYPE tag it does not know).
pub fn roughtime_probe_request_in(ver: u32, nonce: [u8; 32]) -> Vec<u8> {
    const TAGS: [u32; 4] = [0x0052_4556, 0x434e_4f4e, 0x4550_5954, 0x5a5a_5a5a]; // VER NONC TYPE ZZZZ
    let header = 4 + 4 * 3 + 4 * 4;
    let message_len = 1024 - 12;
    let pad = message_len - header - (4 + 32 + 4);
    let mut p = Vec::with_capacity(1024);
    p.extend_from_slice(b"ROUGHTIM");
    p.extend_from_slice(&(message_len as u32).to_le_bytes());
    p.extend_from_slice(&4u32.to_le_bytes());
    for offset in [4u32, 36, 40] {
        p.extend_from_slice(&offset.to_le_bytes());
    }
    for tag in TAGS {
        p.extend_from_slice(&tag.to_le_bytes());
    }
    p.extend_from_slice(&ver.to_le_bytes());
    p.extend_from_slice(&nonce);
    p.extend_from_slice(&0u32.to_le_bytes());
    p.resize(p.len() + pad, 0);
    assert_eq!(p.len(), 1024);
    p
}

/// Polls a Roughtime server with [`roughtime_probe_request`] until it answers anything, at most
/// `limit`; `alive` is asked between tries so a server that died is not waited for.
pub fn wait_roughtime_ready(
    addr: SocketAddr,
    limit: Duration,
    alive: impl FnMut() -> bool,
) -> bool {
    wait_roughtime_ready_in(1, addr, limit, alive)
}

/// [`wait_roughtime_ready`] with a probe offering version `ver`.
pub fn wait_roughtime_ready_in(
    ver: u32,
    addr: SocketAddr,
    limit: Duration,
    mut alive: impl FnMut() -> bool,
) -> bool {
    let request = roughtime_probe_request_in(ver, [0x5a; 32]);
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !alive() {
            return false;
        }
        if exchange(addr, &request, Duration::from_millis(200)).is_some() {
            return true;
        }
    }
    false
}

/// Seconds since 1970 by this machine's clock.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A real, independent Roughtime server on a free loopback port, with the long-term seed we give
/// it: roughenough-server 2.2.0 (crates.io), roughly 0.3.0's server (PyPI) or Cloudflare's Go test
/// server (Go module proxy).
///
/// None can bind port 0 and report the port, so each gets a port that was free a moment ago, and
/// another if that one was taken meanwhile; it is ready once it answers a request in a version it
/// serves (RFC 10049's, or draft 11 for Cloudflare's).
pub struct PeerServer {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

pub const ROUGHENOUGH_SERVER: &str = "/opt/chime-peers/bin/roughenough_server";
/// rkik 2.2.4, an NTS client of its own (scripts/setup).
pub const RKIK: &str = "/opt/chime-peers/bin/rkik";
/// ntpd-rs 1.9.0's daemon and its control tool (scripts/setup).
pub const NTP_DAEMON: &str = "/opt/chime-peers/bin/ntp-daemon";
pub const NTP_CTL: &str = "/opt/chime-peers/bin/ntp-ctl";
/// Our query program over beevik/ntp 1.4.3, a Go NTP client library (scripts/setup).
pub const BEEVIK_NTP: &str = "/opt/chime-peers/bin/beevik-ntp";
pub const ROUGHLY: &str = "/opt/chime-peers/roughly-venv/bin/roughly";
pub const CLOUDFLARE_TESTSERVER: &str = "/opt/chime-peers/cloudflare-roughtime/testserver";
pub const CLOUDFLARE_GETROUGHTIME: &str = "/opt/chime-peers/cloudflare-roughtime/getroughtime";
/// libfaketime's thread-safe library, from Debian's `libfaketime` (scripts/setup).
pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

impl PeerServer {
    /// roughenough-server 2.2.0 with this seed (64 hex digits). 2.2.0 has no grease
    /// (deliberately invalid replies) to turn off: it answers every version 1 request it accepts
    /// with a valid reply, and its only fault injection (worker panics) is the `test-utils` cargo
    /// feature, which `scripts/setup` does not enable. It serves version 1 only.
    pub fn roughenough(seed_hex: &str) -> Self {
        Self::roughenough_with(seed_hex, &[])
    }

    /// [`Self::roughenough`] with extra flags, e.g. `--fixed-offset=-3600` for a server that lies.
    pub fn roughenough_with(seed_hex: &str, extra: &[&str]) -> Self {
        Self::roughenough_under(seed_hex, extra, &[])
    }

    /// [`Self::roughenough`] run under libfaketime with this offset (`+1h`, `-30m`): a server
    /// whose own clock is off, as a misconfigured or compromised one's would be. The library is
    /// preloaded into the server itself, not through the `faketime` wrapper, which would leave
    /// the server running when killed. Debian's `libfaketime` (scripts/setup);
    /// `FAKETIME_LIB` overrides the path.
    pub fn roughenough_faked(seed_hex: &str, offset: &str) -> Self {
        let lib = peer("FAKETIME_LIB", FAKETIME_LIB);
        let env = [
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("FAKETIME", offset),
            // The offset is fixed: nothing to read again.
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ];
        Self::roughenough_under(seed_hex, &[], &env)
    }

    /// roughenough-server with `extra` flags and `env` added to its environment.
    fn roughenough_under(seed_hex: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;

        let bin = peer("ROUGHENOUGH_SERVER", ROUGHENOUGH_SERVER);
        Self::start("roughenough_server", |port, dir| {
            let seed_file = dir.join("seed");
            // roughenough refuses a seed file that group or others may read.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&seed_file)
                .unwrap();
            writeln!(f, "{seed_hex}").unwrap();
            drop(f);
            let mut cmd = Command::new(&bin);
            cmd.envs(env.iter().copied())
                .args(["-i", "127.0.0.1", "-p", &port.to_string(), "-j", "1"])
                .args(["--metrics-interval", "86400", "--seed-file"])
                .arg(&seed_file)
                .args(extra)
                .env("NO_COLOR", "1");
            cmd
        })
    }

    /// roughly 0.3.0's server with this seed (64 hex digits), grease (deliberately invalid
    /// replies, one in a thousand by default) off. It serves version 1, drafts 10–15 as
    /// 0x8000000a–0x8000000f, and Google's protocol, and batches what arrives within 5 ms into
    /// one tree.
    pub fn roughly(seed_hex: &str) -> Self {
        use base64::Engine as _;
        let roughly = peer("ROUGHLY", ROUGHLY);
        let seed: Vec<u8> = (0..seed_hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&seed_hex[i..i + 2], 16).unwrap())
            .collect();
        let seed = base64::engine::general_purpose::STANDARD.encode(seed);
        Self::start("roughly server", |port, _| {
            let mut cmd = Command::new(&roughly);
            cmd.args(["server", "run", "--host", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .args(["--private-key", &seed, "--no-grease"]);
            cmd
        })
    }

    /// Cloudflare's Go test server (github.com/cloudflare/roughtime's cmd/testserver) with this
    /// root seed (64 hex digits). It serves drafts 11 and 08 and Google's protocol, one request at
    /// a time, with an online key it makes at start; a request in any other version makes it exit,
    /// so its readiness probe offers draft 11.
    pub fn cloudflare(seed_hex: &str) -> Self {
        let bin = peer("CLOUDFLARE_TESTSERVER", CLOUDFLARE_TESTSERVER);
        Self::start_probing(0x8000_000b, "cloudflare testserver", |port, _| {
            let mut cmd = Command::new(&bin);
            cmd.arg("-addr")
                .arg(format!("127.0.0.1:{port}"))
                .args(["-root-key", seed_hex]);
            cmd
        })
    }

    fn start(what: &str, command: impl FnMut(u16, &Path) -> Command) -> Self {
        Self::start_probing(1, what, command)
    }

    fn start_probing(ver: u32, what: &str, mut command: impl FnMut(u16, &Path) -> Command) -> Self {
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_udp_port();
            let mut child = command(port, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let lines = Arc::new(Mutex::new(Vec::new()));
            for pipe in [
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
                Box::new(child.stderr.take().unwrap()),
            ] {
                let all = lines.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                        all.lock().unwrap().push(line);
                    }
                });
            }
            let mut server = PeerServer {
                child,
                lines,
                addr: ([127, 0, 0, 1], port).into(),
                _dir: dir,
            };
            let addr = server.addr;
            let ready = wait_roughtime_ready_in(ver, addr, Duration::from_secs(10), || {
                matches!(server.child.try_wait(), Ok(None))
            });
            if ready {
                return server;
            }
            server.stop();
            last_log = server.log();
        }
        panic!("{what} did not answer on a free port after 5 tries; last log:\n{last_log}");
    }

    /// What it printed so far (stdout and stderr).
    pub fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The long-term public key roughenough logged at start ("Long term public key: PUBK(HEX)"),
    /// in lowercase hex. It is logged before the workers bind, so it is there once the server
    /// answers (the reader thread is given a second to catch up).
    pub fn logged_public_key_hex(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let found = self.lines.lock().unwrap().iter().find_map(|l| {
                let rest = l.split("Long term public key: ").nth(1)?;
                let hex = rest.split_once('(')?.1.split(')').next()?;
                Some(hex.to_ascii_lowercase())
            });
            if let Some(hex) = found {
                return hex;
            }
            assert!(
                Instant::now() < deadline,
                "roughenough_server logged no public key; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // libfaketime, preloaded into a server (`roughenough_faked`), keeps a shared-memory
        // segment and a semaphore named after the process, which it removes only when the
        // process exits on its own: a killed server leaves them in /dev/shm.
        let pid = self.child.id();
        for name in [
            format!("faketime_shm_{pid}"),
            format!("sem.faketime_sem_{pid}"),
        ] {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
        }
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A self-signed certificate for 127.0.0.1 and its key (mode 0600) in `dir`, named `name`.
pub fn certificate(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    certificate_for(dir, name, "IP:127.0.0.1,DNS:localhost")
}

/// [`certificate`] for the subject alternative names `san` (openssl's syntax).
pub fn certificate_for(dir: &Path, name: &str, san: &str) -> (PathBuf, PathBuf) {
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    let out = run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", &format!("subjectAltName={san}")])
        // An end-entity certificate: rustls (chime ntp --nts) refuses a CA certificate as one.
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (cert, key)
}

/// chimed's flags for NTS with `cert` and `key`, NTS-KE on a free loopback port.
pub fn nts_flags(cert: &Path, key: &Path) -> Vec<String> {
    [
        "--nts-certificate",
        cert.to_str().unwrap(),
        "--nts-private-key",
        key.to_str().unwrap(),
        "--nts-ke-address",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// chimed mirroring `chronyd` with NTS (`cert`, `key`) on an ephemeral NTS-KE port, plus `extra`,
/// synchronised; and that port.
pub fn chimed_nts(chronyd: &Chronyd, cert: &Path, key: &Path, extra: &[&str]) -> (Chimed, u16) {
    let flags = nts_flags(cert, key);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), &args);
    let port = chimed.logged_addr("nts-ke listening on ").port();
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    (chimed, port)
}

/// User plus system CPU time, in clock ticks (USER_HZ), from the text of a `/proc` `stat` file, a
/// process's or a thread's: the 12th and 13th fields after the command's closing parenthesis.
pub fn stat_cpu_ticks(stat: &str) -> u64 {
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The resident memory of process `pid`, in KiB (VmRSS).
pub fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// `chime delegate --key KEY --out OUT` with `extra` flags (the plan: --days and the like): a
/// delegation bundle, or a panic with what chime said.
pub fn chime_delegate(key: &Path, out: &Path, extra: &[&str]) {
    let made = run(Command::new(workspace_bin("chime"))
        .arg("delegate")
        .args(extra)
        .arg("--key")
        .arg(key)
        .arg("--out")
        .arg(out));
    assert!(made.status.success(), "chime delegate {extra:?}: {made:?}");
}

/// A TCP connection to `ke` from `local`, saying nothing.
pub fn ke_connect(ke: std::net::SocketAddr, local: std::net::IpAddr) -> std::net::TcpStream {
    try_ke_connect(ke, local).unwrap()
}

pub fn try_ke_connect(
    ke: std::net::SocketAddr,
    local: std::net::IpAddr,
) -> std::io::Result<std::net::TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&std::net::SocketAddr::new(local, 0).into())?;
    sock.connect(&ke.into())?;
    Ok(sock.into())
}

/// A TLS 1.3 session with chimed's NTS-KE server at `ke` (ALPN ntske/1, trusting `cert`), from
/// `local`, handshake done.
pub fn ke_tls(
    ke: std::net::SocketAddr,
    local: std::net::IpAddr,
    cert: &Path,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    try_ke_tls(ke, local, cert).unwrap()
}

pub type KeTls = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

pub fn try_ke_tls(
    ke: std::net::SocketAddr,
    local: std::net::IpAddr,
    cert: &Path,
) -> std::io::Result<KeTls> {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"ntske/1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = try_ke_connect(ke, local)?;
    tcp.set_read_timeout(Some(Duration::from_secs(8)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// Runs ntpd-rs with its one `source` (the body of its `[[source]]` table), polling every 2 s,
/// until `done` says yes to its status and log; returns them, or panics with both after 40 s.
/// With one source it never sets the clock.
pub fn ntpd_rs(
    dir: &std::path::Path,
    source: &str,
    done: impl Fn(&str, &str) -> bool,
) -> (String, String) {
    ntpd_rs_in(None, dir, source, done)
}

/// [`ntpd_rs`] with its daemon in network namespace `netns` (its control tool reaches it through a
/// socket in `dir`, from any namespace).
pub fn ntpd_rs_in(
    netns: Option<&str>,
    dir: &std::path::Path,
    source: &str,
    done: impl Fn(&str, &str) -> bool,
) -> (String, String) {
    let conf = dir.join("ntp.toml");
    std::fs::write(
        &conf,
        format!(
            "[observability]\nlog-level = \"debug\"\nobservation-path = \"{d}/observe\"\n\n\
             [synchronization]\nminimum-agreeing-sources = 3\n\n\
             [source-defaults]\npoll-interval-limits = {{ min = 1, max = 1 }}\n\
             initial-poll-interval = 1\n\n\
             [[source]]\n{source}",
            d = dir.display()
        ),
    )
    .unwrap();
    let log_path = dir.join("ntpd.log");
    let log = std::fs::File::create(&log_path).unwrap();
    // Ended when this returns or panics: a daemon left behind would poll on after the test.
    let _daemon = Killed(
        in_netns(netns, peer("NTP_DAEMON", NTP_DAEMON))
            .arg("-c")
            .arg(&conf)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let status = || {
        let out = run(Command::new(peer("NTP_CTL", NTP_CTL))
            .args(["status", "-c"])
            .arg(&conf));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (now, log) = (
            status(),
            std::fs::read_to_string(&log_path).unwrap_or_default(),
        );
        if done(&now, &log) {
            break (now, log);
        }
        if Instant::now() > deadline {
            panic!("ntpd-rs never got there:\n{now}\n{log}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A child process killed and reaped when this drops.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether ntpd-rs's status shows a measurement from its source: it accepted a reply. Before
/// one, the source is listed with placeholders (an uncertainty of 2^31 s).
pub fn has_offset(status: &str) -> bool {
    let source = status.split("Sources:").nth(1).unwrap_or("");
    source.contains("Offset:") && !source.contains("2147483648")
}
