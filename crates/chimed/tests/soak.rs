//! The soak: chimed serving NTP, NTS and Roughtime beside a chronyd under a steady load while a
//! fault schedule runs, every reply checked, and figures printed at the end. `SOAK_SECONDS`
//! (default 60, as CI runs it; `scripts/soak` runs 600 for the record in docs/RELIABILITY.adoc) and
//! `SOAK_NTP_RATE` (requests per second, default 1000) set it.
//!
//! `SOAK_CPU_SHARE=P` (percent of one core; the record uses it, CI does not) puts chimed in a CPU
//! cgroup with that quota, so that one generator can offer more than chimed can answer. chimed
//! runs with one NTP thread on CPU 0, and everything else, this test and the chronyds, on CPU 1.
//! The soak then finds chimed's capacity for its own NTP client, amid the Roughtime load, the NTS
//! client and the SIGHUPs: a ladder of 2 s steps, 10% apart, from half what `chime perf ntp`
//! finds, up to the first with 1% or more not answered; the capacity is the most accepted per
//! second in any step. The NTP load runs at 70% of it. Before each burst a short ladder (four
//! steps at most, from 90% of the last capacity) measures it again, and the burst, 3 s long,
//! offers three times that: this machine's cores drift between a slow and a fast state, so a
//! burst is set against the capacity of its own round. The soak reports each burst's goodput
//! (replies accepted within 1 s, per second) against it, and fails below 90% over all of them.
//!
//! Every cycle: 4 s normal; chronyd killed (4 s), restarted, 2 s; its port answering garbage
//! (3 s), chronyd again, 2 s; chronyd with no reference, answering unsynchronised (3 s),
//! synchronised again, 2 s; a burst at three times the NTP load (1 s), 3 s, or with
//! `SOAK_CPU_SHARE` the ladder and a burst at three times capacity (3 s), 1 s. Throughout: SIGHUP
//! every 2 s, online-key and NTS cookie-key rotations every 3 and 5 s. chimed runs with
//! `--stale-after 2 --poll-interval 0.5`.
//!
//! Checked: every NTP reply answers one of our requests in server mode, and claims to be
//! synchronised (leap not 3, stratum not 0) only with chronyd's stratum; every Roughtime reply
//! verifies; chronyd as an NTS client polls throughout and is never sent a NAK. Counted as false:
//! a synchronised NTP reply, or any Roughtime reply, sent while the upstream had been down or
//! garbage for longer than the stale time and a poll (3 s with margin) or unsynchronised for
//! longer than a poll (1.5 s). Figures: how long chimed took to turn unsynchronised and back,
//! the NTP answered share overall and during the bursts, resident memory and open descriptors
//! at the start and the end.

mod common;

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chime_roughtime::{VerifyPolicy, Version, build_request, verify_reply};
use common::{Chimed, Chronyd, ChronydClient, certificate, count_in};

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the upstream was doing from `start` to `end` (Unix seconds), when not serving
/// synchronised time.
#[derive(Clone, Copy, Debug)]
struct Fault {
    start: f64,
    end: f64,
    kind: &'static str,
    /// How long chimed may take to notice.
    grace: f64,
}

/// A run of NTP replies that all claimed synchronisation, or all did not, each within 50 ms of
/// the one before: when the first and the last came, and how many. (Runs, not replies, so that a
/// long soak at a high rate keeps little.)
#[derive(Clone, Copy)]
struct Seen {
    from: f64,
    to: f64,
    synced: bool,
    count: u64,
}

impl Seen {
    /// Whether the run has a reply in `window` (longer than the 50 ms that may separate two).
    fn meets(&self, window: &std::ops::Range<f64>) -> bool {
        self.to >= window.start && self.from < window.end
    }
}

/// The NTP generator's requests carry a tag in the origin's lowest bits: what the load was doing
/// when it sent them.
const TAGS: u64 = 32;
/// The steady load.
const STEADY: u64 = 0;
/// A burst.
const BURST: u64 = 1;
/// The capacity ladder's steps are tagged from here on.
const LADDER: u64 = 2;

/// What the generator is told to send: `per_s` requests a second, tagged `tag`.
fn load_of(per_s: u64, tag: u64) -> u64 {
    per_s * TAGS + tag
}

/// Requests sent, answered, and answered within 1 s (what a client accepts), for one tag.
#[derive(Default)]
struct Tagged {
    sent: AtomicU64,
    answered: AtomicU64,
    accepted: AtomicU64,
}

#[derive(Default)]
struct NtpCounts {
    wrong: AtomicU64,
    by_tag: [Tagged; TAGS as usize],
}

impl NtpCounts {
    fn get(&self, tag: u64) -> (u64, u64, u64) {
        let t = &self.by_tag[tag as usize];
        (
            t.sent.load(Relaxed),
            t.answered.load(Relaxed),
            t.accepted.load(Relaxed),
        )
    }
}

/// chimed's CPU time so far, user and system, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // /proc counts in USER_HZ, 100 on every architecture Linux runs on today.
    common::stat_cpu_ticks(&stat) as f64 / 100.0
}

/// One burst: when it began and ended (Unix seconds), how many burst replies had been accepted
/// when it began, and the capacity measured just before it (held to a share of a core).
struct Burst {
    start: f64,
    end: f64,
    accepted_before: u64,
    capacity: Option<f64>,
}

/// Sends SIGHUP to chimed every 2 s while the test waits.
struct Hupper {
    pid: u32,
    last: Instant,
    sent: u32,
}

impl Hupper {
    fn sleep_until(&mut self, t: Instant) {
        while Instant::now() < t {
            if self.last.elapsed() >= Duration::from_secs(2) {
                nix::sys::signal::kill(chimed_pid(self.pid), nix::sys::signal::Signal::SIGHUP)
                    .unwrap();
                self.sent += 1;
                self.last = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What a capacity ladder found: the most replies accepted per second in any step, the last
/// one (past its 1%) included, so that bursts are held to the peak chimed showed; chimed's CPU
/// per reply in that step; and every step, said.
struct Climb {
    capacity: f64,
    cpu_per_reply: f64,
    said: String,
}

/// A ladder of 2 s steps of NTP requests from the generator, from `from` a second, 10% apart,
/// at most `most` of them, up to the first with 1% or more not answered. Each step has a tag of
/// its own (taken in turn from `next_tag`), and is counted from what that tag had before it.
fn climb(
    counts: &NtpCounts,
    load: &AtomicU64,
    hup: &mut Hupper,
    next_tag: &mut u64,
    from: f64,
    most: u64,
) -> Climb {
    let mut steps = Vec::new();
    let mut rate = from;
    for _ in 0..most {
        let tag = *next_tag;
        *next_tag = if tag + 1 < TAGS { tag + 1 } else { LADDER };
        let before = counts.get(tag);
        let (started, cpu) = (Instant::now(), cpu_seconds(hup.pid));
        load.store(load_of(rate as u64, tag), Relaxed);
        hup.sleep_until(started + Duration::from_secs(2));
        load.store(load_of(0, STEADY), Relaxed);
        let (seconds, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds(hup.pid) - cpu);
        hup.sleep_until(Instant::now() + Duration::from_millis(300));
        let (sent, answered, _) = counts.get(tag);
        steps.push((tag, rate, seconds, cpu, before));
        if ((answered - before.1) as f64) < 0.99 * (sent - before.0) as f64 {
            break;
        }
        rate *= 1.1;
    }
    // Every reply a client accepts is in by now.
    hup.sleep_until(Instant::now() + Duration::from_secs(1));
    let mut found = Climb {
        capacity: 0.0,
        cpu_per_reply: 0.0,
        said: String::new(),
    };
    for (tag, rate, seconds, cpu, (sent_before, _, accepted_before)) in steps {
        let (sent, _, accepted) = counts.get(tag);
        let (sent, accepted) = (sent - sent_before, accepted - accepted_before);
        let per_reply = cpu / accepted.max(1) as f64;
        if !found.said.is_empty() {
            found.said.push_str(", ");
        }
        found.said.push_str(&format!(
            "{rate:.0}/s {:.1}% ({:.2} µs)",
            100.0 * accepted as f64 / sent.max(1) as f64,
            1e6 * per_reply
        ));
        if accepted as f64 / seconds > found.capacity {
            (found.capacity, found.cpu_per_reply) = (accepted as f64 / seconds, per_reply);
        }
    }
    found
}

/// A CPU cgroup holding chimed to `share` percent of one core with a 1 ms quota (v2's `cpu.max`,
/// or v1's CFS files where the machine mounts v1, as this one does), removed on drop.
struct CpuCap(std::path::PathBuf);

impl CpuCap {
    fn hold(pid: u32, share: u64) -> Self {
        let root = std::path::Path::new("/sys/fs/cgroup");
        let v2 = root.join("cgroup.controllers").exists();
        let name = format!("chime-soak.{}", std::process::id());
        let dir = if v2 {
            root.join(name)
        } else {
            root.join("cpu").join(name)
        };
        std::fs::create_dir(&dir).unwrap();
        let period = 100_000_u64.div_ceil(share);
        let quota = period * share / 100;
        if v2 {
            std::fs::write(dir.join("cpu.max"), format!("{quota} {period}")).unwrap();
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string()).unwrap();
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()).unwrap();
        }
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        // chimed on CPU 0, every thread it has; this test and its children stay on CPU 1.
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let tid: i32 = task.unwrap().file_name().to_str().unwrap().parse().unwrap();
            pin(nix::unistd::Pid::from_raw(tid), 0);
        }
        Self(dir)
    }
}

/// Pins thread `tid` (0: the calling thread; threads and processes it starts later inherit it) to
/// `cpu`.
fn pin(tid: nix::unistd::Pid, cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap();
    nix::sched::sched_setaffinity(tid, &set).unwrap();
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // The process left when it exited; the group can go once it is empty.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// chimed's NTP capacity, as `chime perf ntp` finds it: the most accepted replies per second in
/// a step with under 1% lost or stale.
fn capacity(ntp: std::net::SocketAddr, pid: u32, dir: &std::path::Path) -> f64 {
    let json = dir.join("ladder.json");
    let out = common::run(
        std::process::Command::new(common::workspace_bin("chime")).args([
            "perf",
            "ntp",
            "--target",
            &ntp.to_string(),
            "--steps",
            "5000:1.15:40",
            "--duration",
            "2",
            "--max-loss",
            "5",
            "--server-pid",
            &pid.to_string(),
            "--json",
            json.to_str().unwrap(),
        ]),
    );
    assert!(
        out.status.success(),
        "chime perf: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["loss_pct"].as_f64().unwrap() + s["stale_pct"].as_f64().unwrap() < 1.0)
        .map(|s| s["accepted_rate"].as_f64().unwrap())
        .fold(0.0, f64::max)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The upstream's port answering 48 bytes of nonsense to every request, until `stop`.
fn garbage(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let sock = UdpSocket::bind(("127.0.0.1", port)).expect("the upstream's port, free again");
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        while !stop.load(Relaxed) {
            if let Ok((_, from)) = sock.recv_from(&mut buf) {
                let mut junk = [0u8; 48];
                for b in &mut junk {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *b = x as u8;
                }
                let _ = sock.send_to(&junk, from);
            }
        }
    })
}

/// chimed under soak, and what the test needs of it. Fields drop in order: chimed before the
/// CPU cgroup that holds it, and before the files it reads.
struct Soak {
    seconds: u64,
    share: u64,
    burst_secs: u64,
    chimed: Chimed,
    _cap: Option<CpuCap>,
    upstream_port: u16,
    ntp: std::net::SocketAddr,
    roughtime: std::net::SocketAddr,
    ke_port: u16,
    pid: u32,
    perf_capacity: Option<f64>,
    cert: std::path::PathBuf,
    rt_key: common::RoughtimeKey,
    _dir: tempfile::TempDir,
}

/// Starts chronyd and chimed mirroring it (held to `SOAK_CPU_SHARE` of a core if set, and its
/// capacity then measured with `chime perf`); the chronyd too, which the faults replace.
fn start_soak() -> (Soak, Chronyd) {
    let seconds = env("SOAK_SECONDS", 60);
    let share = env("SOAK_CPU_SHARE", 0);
    if share > 0 {
        pin(nix::unistd::Pid::from_raw(0), 1);
    }
    // Held to a share of one core, chimed gets one NTP thread, as a one-core server has.
    let ntp_threads = if share > 0 { "1" } else { "2" };
    // Bursts of 1 s; 3 s at three times capacity, long enough for the shedding to settle.
    let burst_secs = if share > 0 { 3 } else { 1 };
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "soak");
    let rt_key = common::chime_keygen();
    let first = Chronyd::start();
    let upstream_port = first.port;
    let flags = common::nts_flags(&cert, &key);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend(common::roughtime_flags(rt_key.file.to_str().unwrap()));
    args.extend([
        "-4",
        ntp_threads,
        "--stale-after",
        "2",
        "--poll-interval",
        "0.5",
        "--nts-rotation",
        "5",
        "--roughtime-rotation",
        "3",
        "--roughtime-gather",
        "0",
    ]);
    let mut chimed = Chimed::mirroring(&first.addr().to_string(), &args);
    let ke_port = chimed.logged_addr("nts-ke listening on ").port();
    let roughtime = chimed.roughtime_addr();
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let ntp = chimed.addr;
    let pid = chimed.pid().as_raw() as u32;
    let cap = (share > 0).then(|| CpuCap::hold(pid, share));
    let perf_capacity = cap.as_ref().map(|_| capacity(ntp, pid, dir.path()));
    let soak = Soak {
        seconds,
        share,
        burst_secs,
        chimed,
        _cap: cap,
        upstream_port,
        ntp,
        roughtime,
        ke_port,
        pid,
        perf_capacity,
        cert,
        rt_key,
        _dir: dir,
    };
    (soak, first)
}

/// The load's threads, and what they counted and saw.
struct Traffic {
    stop: Arc<AtomicBool>,
    /// What the NTP generator sends: requests per second, shifted past the tag it marks them with.
    load: Arc<AtomicU64>,
    counts: Arc<NtpCounts>,
    seen: Arc<Mutex<Vec<Seen>>>,
    rt: RoughtimeCounts,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What the Roughtime client counted: when each verified reply came, the wrong ones, and how
/// many requests it sent.
#[derive(Clone, Default)]
struct RoughtimeCounts {
    seen: Arc<Mutex<Vec<f64>>>,
    wrong: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
}

/// NTP: four sockets, requests paced every millisecond; the transmit timestamp carries the
/// send time (Unix ns), which the reply echoes as its origin.
fn ntp_sockets() -> Vec<UdpSocket> {
    (0..4)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            // Room for a burst's replies while our receiving threads wait for the CPU: a reply
            // dropped here would be counted against chimed.
            let _ = nix::sys::socket::setsockopt(
                &s,
                nix::sys::socket::sockopt::RcvBufForce,
                &(8 << 20),
            );
            s
        })
        .collect()
}

/// A thread receiving NTP replies on `s` until `stop`: each checked and counted under its
/// tag, and kept in runs of synchronised or not.
fn spawn_ntp_receiver(
    s: UdpSocket,
    stop: Arc<AtomicBool>,
    counts: Arc<NtpCounts>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 128];
        let mut mine = Vec::new();
        while !stop.load(Relaxed) {
            let Ok(n) = s.recv(&mut buf) else { continue };
            let at = now();
            let origin = u64::from_be_bytes(buf[24..32].try_into().unwrap());
            let sent_at = origin as f64 / 1e9;
            let ours = n == 48 && buf[0] & 7 == 4 && (0.0..=5.0).contains(&(at - sent_at));
            let synced = buf[0] >> 6 != 3 && buf[1] != 0;
            if !ours || (synced && buf[1] != 3) {
                counts.wrong.fetch_add(1, Relaxed);
                continue;
            }
            let tagged = &counts.by_tag[(origin % TAGS) as usize];
            tagged.answered.fetch_add(1, Relaxed);
            if at - sent_at < 1.0 {
                tagged.accepted.fetch_add(1, Relaxed);
            }
            match mine.last_mut() {
                Some(Seen {
                    to,
                    synced: was,
                    count,
                    ..
                }) if *was == synced && at - *to < 0.05 => {
                    *to = at;
                    *count += 1;
                }
                _ => mine.push(Seen {
                    from: at,
                    to: at,
                    synced,
                    count: 1,
                }),
            }
        }
        seen.lock().unwrap().extend(mine);
    })
}

/// The NTP generator: sends to `ntp` from `sockets` in turn at the rate and tag `load` says,
/// until `stop`.
fn spawn_ntp_generator(
    sockets: Vec<UdpSocket>,
    ntp: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    counts: Arc<NtpCounts>,
    load: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut due = 0u64;
        let mut was = u64::MAX;
        let mut next_socket = 0;
        let mut request = [0u8; 48];
        request[0] = 0x23;
        while !stop.load(Relaxed) {
            let now_load = load.load(Relaxed);
            let (per_s, tag) = (now_load / TAGS, now_load % TAGS);
            let elapsed = start.elapsed().as_secs_f64();
            let target = (elapsed * per_s as f64) as u64;
            // A new rate or tag restarts the count from here.
            if now_load != was {
                (due, was) = (target, now_load);
            }
            while due < target {
                let t = (now() * 1e9) as u64 / TAGS * TAGS + tag;
                request[40..48].copy_from_slice(&t.to_be_bytes());
                if sockets[next_socket].send_to(&request, ntp).is_ok() {
                    counts.by_tag[tag as usize].sent.fetch_add(1, Relaxed);
                }
                next_socket = (next_socket + 1) % sockets.len();
                due += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// Roughtime: one request at a time to `roughtime`, each reply verified under `public`; when
/// each verified reply came.
fn spawn_roughtime_client(
    roughtime: std::net::SocketAddr,
    public: [u8; 32],
    stop: Arc<AtomicBool>,
    rt: RoughtimeCounts,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let policy = VerifyPolicy::new(10_000_000);
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            let mut nonce = [0u8; 32];
            nonce[..8].copy_from_slice(&n.to_le_bytes());
            let mut request = vec![0u8; chime_roughtime::REQUEST_LEN];
            let len = build_request(&mut request, &[Version::Rfc10049], &nonce, None).unwrap();
            request.truncate(len);
            rt.sent.fetch_add(1, Relaxed);
            let _ = sock.send_to(&request, roughtime);
            let mut buf = [0u8; 2048];
            let deadline = Instant::now() + Duration::from_millis(300);
            while Instant::now() < deadline {
                let Ok((len, _)) = sock.recv_from(&mut buf) else {
                    break;
                };
                match verify_reply(&request, &buf[..len], &public, &policy) {
                    Ok(_) => {
                        rt.seen.lock().unwrap().push(now());
                        break;
                    }
                    // A late reply to an earlier request is not this one's.
                    Err(_) if verify_any_earlier(&buf[..len]) => {}
                    Err(_) => {
                        rt.wrong.fetch_add(1, Relaxed);
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// Starts the NTP receivers and generator and the Roughtime client against chimed.
fn start_traffic(s: &Soak) -> Traffic {
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(AtomicU64::new(if s.share > 0 {
        load_of(0, STEADY)
    } else {
        load_of(env("SOAK_NTP_RATE", 1000), STEADY)
    }));
    let counts = Arc::new(NtpCounts::default());
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let sockets = ntp_sockets();
    let mut threads = Vec::new();
    for sock in &sockets {
        let sock = sock.try_clone().unwrap();
        threads.push(spawn_ntp_receiver(
            sock,
            stop.clone(),
            counts.clone(),
            seen.clone(),
        ));
    }
    let clones: Vec<UdpSocket> = sockets.iter().map(|s| s.try_clone().unwrap()).collect();
    threads.push(spawn_ntp_generator(
        clones,
        s.ntp,
        stop.clone(),
        counts.clone(),
        load.clone(),
    ));
    let public: [u8; 32] = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&s.rt_key.public_base64)
            .unwrap()
            .try_into()
            .unwrap()
    };
    let rt = RoughtimeCounts::default();
    threads.push(spawn_roughtime_client(
        s.roughtime,
        public,
        stop.clone(),
        rt.clone(),
    ));
    Traffic {
        stop,
        load,
        counts,
        seen,
        rt,
        threads,
    }
}

/// Held to a share of a core: chimed's capacity for this test's own client, amid the
/// Roughtime load, the NTS client and the SIGHUPs that also run during the bursts, from half
/// what `chime perf` found. This client costs chimed more per reply than `chime perf` does (a
/// wake-up of a blocked receiving thread every few replies, made on chimed's CPU over
/// loopback), so the two capacities differ, and the bursts must be set against this one.
/// The capacity (if held) and the NTP load's rate.
fn first_capacity(
    s: &Soak,
    t: &Traffic,
    hup: &mut Hupper,
    next_tag: &mut u64,
) -> (Option<f64>, u64) {
    let first_climb = s
        .perf_capacity
        .map(|pc| climb(&t.counts, &t.load, hup, next_tag, 0.5 * pc, TAGS - LADDER));
    let capacity = first_climb.as_ref().map(|c| c.capacity);
    let rate = match capacity {
        Some(c) => (0.7 * c) as u64,
        None => env("SOAK_NTP_RATE", 1000),
    };
    if let (Some(pc), Some(c)) = (s.perf_capacity, &first_climb) {
        eprintln!(
            "soak: the ladder, offered and accepted (chimed's CPU per reply): {}",
            c.said
        );
        eprintln!(
            "soak: chimed held to {}% of a core: capacity {:.0} replies/s for this client \
             ({:.2} µs of chimed's CPU each; `chime perf` found {pc:.0}/s); load {rate}/s; each \
             burst at three times the capacity found just before it",
            s.share,
            c.capacity,
            c.cpu_per_reply * 1e6,
        );
        assert!(
            c.capacity > 0.0,
            "no step of the capacity ladder was answered"
        );
    }
    (capacity, rate)
}

/// `s` seconds into the cycle that began at `cycle`.
fn at(cycle: Instant, s: u64) -> Instant {
    cycle + Duration::from_secs(s)
}

/// chronyd killed (4 s), restarted, 2 s.
fn fault_down(
    hup: &mut Hupper,
    upstream: &mut Option<Chronyd>,
    port: u16,
    cycle: Instant,
) -> Fault {
    let start = now();
    upstream.take().unwrap().stop();
    hup.sleep_until(at(cycle, 8));
    // The fault ends as chronyd starts again: it may answer before it is seen to.
    let fault = Fault {
        start,
        end: now(),
        kind: "down",
        grace: 3.0,
    };
    *upstream = Some(Chronyd::start_on(port, true));
    hup.sleep_until(at(cycle, 10));
    fault
}

/// chronyd's port answering garbage (3 s), chronyd again, 2 s.
fn fault_garbage(
    hup: &mut Hupper,
    upstream: &mut Option<Chronyd>,
    port: u16,
    cycle: Instant,
) -> Fault {
    let start = now();
    upstream.take().unwrap().stop();
    let quit = Arc::new(AtomicBool::new(false));
    let g = garbage(port, quit.clone());
    hup.sleep_until(at(cycle, 13));
    quit.store(true, Relaxed);
    g.join().unwrap();
    // The fault ends as chronyd starts again: it may answer before it is seen to.
    let fault = Fault {
        start,
        end: now(),
        kind: "garbage",
        grace: 3.0,
    };
    *upstream = Some(Chronyd::start_on(port, true));
    hup.sleep_until(at(cycle, 15));
    fault
}

/// chronyd with no reference, answering unsynchronised (3 s), synchronised again, 2 s.
fn fault_unsynchronised(
    hup: &mut Hupper,
    upstream: &mut Option<Chronyd>,
    port: u16,
    cycle: Instant,
) -> Fault {
    // Down for the moment chronyd restarts without a reference: counted from the
    // stop, with the down grace.
    let start = now();
    upstream.take().unwrap().stop();
    let unsynced = Chronyd::start_on(port, false);
    hup.sleep_until(at(cycle, 18));
    drop(unsynced);
    // The fault ends as chronyd starts again: it may answer before it is seen to.
    let fault = Fault {
        start,
        end: now(),
        kind: "unsynchronised",
        grace: 1.5,
    };
    *upstream = Some(Chronyd::start_on(port, true));
    hup.sleep_until(at(cycle, 20));
    fault
}

/// A burst at three times the NTP load, or held to a share of a core at three times the
/// capacity a short ladder finds just before it (around `round_capacity`, the last one found,
/// which it updates), so that the machine's drift between a slow and a fast state over a long
/// run is not taken for the shedding's doing. The burst, and chimed's CPU time during it.
fn burst(
    s: &Soak,
    t: &Traffic,
    hup: &mut Hupper,
    next_tag: &mut u64,
    round_capacity: &mut Option<f64>,
    rate: u64,
) -> (Burst, f64) {
    let round = round_capacity.map(|last| {
        let c = climb(&t.counts, &t.load, hup, next_tag, 0.9 * last, 4);
        assert!(c.capacity > 0.0, "no step of a round's ladder was answered");
        t.load.store(load_of(rate, STEADY), Relaxed);
        hup.sleep_until(Instant::now() + Duration::from_secs(1));
        c.capacity
    });
    *round_capacity = round.or(*round_capacity);
    let burst_rate = round.map_or(3 * rate, |c| (3.0 * c) as u64);
    let begun = Instant::now();
    let (start, cpu, (_, _, accepted)) = (now(), cpu_seconds(s.pid), t.counts.get(BURST));
    t.load.store(load_of(burst_rate, BURST), Relaxed);
    hup.sleep_until(begun + Duration::from_secs(s.burst_secs));
    t.load.store(load_of(rate, STEADY), Relaxed);
    let burst = Burst {
        start,
        end: now(),
        accepted_before: accepted,
        capacity: round,
    };
    let cpu = cpu_seconds(s.pid) - cpu;
    hup.sleep_until(begun + Duration::from_secs(s.burst_secs + 1));
    (burst, cpu)
}

/// What the fault schedule did, and how it left chimed.
struct Schedule {
    faults: Vec<Fault>,
    /// Each burst's start and end, and how many burst replies had been accepted when it began.
    bursts: Vec<Burst>,
    burst_cpu: f64,
    upstream: Option<Chronyd>,
    rss: (u64, u64),
    fds: (usize, usize),
}

/// The fault schedule, cycle after cycle until `SOAK_SECONDS` have passed: 4 s normal, then
/// each fault of the upstream in turn, then a burst.
fn run_schedule(
    s: &Soak,
    t: &Traffic,
    hup: &mut Hupper,
    next_tag: &mut u64,
    first: Chronyd,
    capacity: Option<f64>,
    rate: u64,
) -> Schedule {
    let warm = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let (rss_start, fds_start) = (common::resident_kib(s.pid), open_fds(s.pid));
    let (mut faults, mut bursts) = (Vec::new(), Vec::new());
    let mut round_capacity = capacity;
    let mut burst_cpu = 0.0;
    let mut upstream = Some(first);
    let end = warm + Duration::from_secs(s.seconds);
    let mut cycle_start = Instant::now();
    let mut step = 0;
    let port = s.upstream_port;
    while Instant::now() + Duration::from_secs(4) < end {
        match step % 5 {
            0 => hup.sleep_until(at(cycle_start, 4)),
            1 => faults.push(fault_down(hup, &mut upstream, port, cycle_start)),
            2 => faults.push(fault_garbage(hup, &mut upstream, port, cycle_start)),
            3 => faults.push(fault_unsynchronised(hup, &mut upstream, port, cycle_start)),
            _ => {
                let (b, cpu) = burst(s, t, hup, next_tag, &mut round_capacity, rate);
                bursts.push(b);
                burst_cpu += cpu;
                cycle_start = Instant::now();
            }
        }
        step += 1;
    }
    hup.sleep_until(end.max(Instant::now()));
    let (rss_end, fds_end) = (common::resident_kib(s.pid), open_fds(s.pid));
    Schedule {
        faults,
        bursts,
        burst_cpu,
        upstream,
        rss: (rss_start, rss_end),
        fds: (fds_start, fds_end),
    }
}

/// For each fault, a line of figures; the synchronised NTP replies and the Roughtime replies
/// sent while chimed should have known the upstream was not serving.
fn fault_figures(
    faults: &[Fault],
    seen: &[Seen],
    rt_seen: &[f64],
    out: &mut String,
) -> (u64, usize) {
    let (mut false_ntp, mut false_rt) = (0, 0);
    for f in faults {
        let blind = f.start + f.grace..f.end;
        let (fn_, fr) = (
            seen.iter()
                .filter(|r| r.synced && r.meets(&blind))
                .map(|r| r.count)
                .sum::<u64>(),
            rt_seen.iter().filter(|t| blind.contains(t)).count(),
        );
        false_ntp += fn_;
        false_rt += fr;
        let turned = seen
            .iter()
            .find(|r| r.to >= f.start && !r.synced)
            .map(|r| r.from.max(f.start) - f.start);
        let back = seen
            .iter()
            .find(|r| r.to >= f.end && r.synced)
            .map(|r| r.from.max(f.end) - f.end);
        out.push_str(&format!(
            "soak: upstream {} for {:.1} s: unsynchronised after {}, synchronised again {} \
             after; {fn_} NTP (at most: the runs that reach in) and {fr} Roughtime replies claimed \
             it after {:.1} s\n",
            f.kind,
            f.end - f.start,
            turned.map_or("never".into(), |s| format!("{s:.2} s")),
            back.map_or("never".into(), |s| format!("{s:.2} s")),
            f.grace,
        ));
    }
    (false_ntp, false_rt)
}

/// Each burst's goodput (its replies are all in before the next burst begins), and against
/// the capacity found just before it, sorted; over them all, the accepted replies against what
/// the capacities would have answered in the bursts' time. `baccepted`: every burst reply
/// accepted.
fn burst_shares(bursts: &[Burst], baccepted: u64) -> (Vec<f64>, Option<f64>) {
    let mut each: Vec<f64> = Vec::new();
    let mut held = 0.0;
    for (i, b) in bursts.iter().enumerate() {
        let to = bursts
            .get(i + 1)
            .map_or(baccepted, |next| next.accepted_before);
        if let Some(c) = b.capacity {
            each.push((to - b.accepted_before) as f64 / (b.end - b.start) / c);
            held += c * (b.end - b.start);
        }
    }
    each.sort_by(f64::total_cmp);
    let of_capacity = (held > 0.0).then(|| baccepted as f64 / held);
    (each, of_capacity)
}

/// The line on each burst's share of its round's capacity, if any burst had one.
fn burst_share_line(bursts: &[Burst], each: &[f64], out: &mut String) {
    if let (Some(low), Some(high)) = (each.first(), each.last()) {
        let rounds: Vec<String> = bursts
            .iter()
            .filter_map(|b| b.capacity.map(|c| format!("{c:.0}")))
            .collect();
        out.push_str(&format!(
            "soak: each burst's goodput, of its round's capacity: lowest {:.1}%, median {:.1}%, \
             highest {:.1}%, {} of {} at 90% or more; the rounds' capacities: {}\n",
            100.0 * low,
            100.0 * each[each.len() / 2],
            100.0 * high,
            each.iter().filter(|&&r| r >= 0.9).count(),
            each.len(),
            rounds.join(", "),
        ));
    }
}

/// How the soak ended: chimed's totals and log, and chronyd's NTS measurements.
struct Ended {
    nts_measured: usize,
    ntp_totals: String,
    log: String,
}

/// Stops the load and the NTS client, then chimed, which must exit cleanly.
fn wind_down(s: &mut Soak, t: &mut Traffic, nts_client: ChronydClient) -> Ended {
    t.stop.store(true, Relaxed);
    for th in std::mem::take(&mut t.threads) {
        th.join().unwrap();
    }
    let nts_measured = nts_client.measured();
    drop(nts_client);
    assert!(s.chimed.terminate().success(), "chimed exited badly");
    let ntp_totals = s
        .chimed
        .wait_for("ntp totals at exit", Duration::from_secs(2));
    let log = s.chimed.log();
    Ended {
        nts_measured,
        ntp_totals,
        log,
    }
}

/// The figures, printed, and what the checks need of them.
struct Figures {
    out: String,
    seen: Vec<Seen>,
    false_ntp: u64,
    false_rt: usize,
    steady: (u64, u64),
    of_capacity: Option<f64>,
}

/// The figures: for each fault, for the steady load and the bursts, for Roughtime and NTS, and
/// chimed's resources and totals; written to stderr.
fn figures(
    s: &Soak,
    t: &Traffic,
    sched: &Schedule,
    ended: &Ended,
    hups: u32,
    rate: u64,
    capacity: Option<f64>,
) -> Figures {
    let mut seen = std::mem::take(&mut *t.seen.lock().unwrap());
    seen.sort_by(|a, b| a.from.total_cmp(&b.from));
    let rt_seen = std::mem::take(&mut *t.rt.seen.lock().unwrap());
    let mut out = String::new();
    let (false_ntp, false_rt) = fault_figures(&sched.faults, &seen, &rt_seen, &mut out);
    let c = &t.counts;
    let (steady_sent, steady_answered, _) = c.get(STEADY);
    let (bsent, banswered, baccepted) = c.get(BURST);
    let bursts = &sched.bursts;
    let burst_seconds: f64 = bursts.iter().map(|b| b.end - b.start).sum();
    let goodput = baccepted as f64 / burst_seconds.max(1e-9);
    let (each, of_capacity) = burst_shares(bursts, baccepted);
    out.push_str(&format!(
        "soak: {} s, {} fault cycles, {hups} SIGHUPs; NTP {rate}/s: {steady_answered} of \
         {steady_sent} answered ({:.2}%), {} wrong, {false_ntp} synchronised while the upstream \
         was not; bursts at {}: {banswered} of {bsent} answered ({:.2}%), {goodput:.0} \
         accepted/s{}, {:.2} µs of chimed's CPU per accepted reply\n",
        s.seconds,
        bursts.len(),
        100.0 * steady_answered as f64 / steady_sent.max(1) as f64,
        c.wrong.load(Relaxed),
        if capacity.is_some() {
            "three times each round's capacity".to_string()
        } else {
            format!("{}/s", 3 * rate)
        },
        100.0 * banswered as f64 / bsent.max(1) as f64,
        of_capacity.map_or(String::new(), |r| format!(
            " ({:.1}% of the capacities found before them)",
            100.0 * r
        )),
        1e6 * sched.burst_cpu / baccepted.max(1) as f64,
    ));
    burst_share_line(bursts, &each, &mut out);
    let ((rss_start, rss_end), (fds_start, fds_end)) = (sched.rss, sched.fds);
    out.push_str(&format!(
        "soak: Roughtime: {} verified of {} sent, {} wrong, {false_rt} signed while the upstream \
         was not synchronised; NTS: chronyd measured {} times, NAKs {}; resident \
         {rss_start} -> {rss_end} KiB, descriptors {fds_start} -> {fds_end}\n",
        rt_seen.len(),
        t.rt.sent.load(Relaxed),
        t.rt.wrong.load(Relaxed),
        ended.nts_measured,
        count_in(&ended.ntp_totals, "nts_nak"),
    ));
    out.push_str(&format!("soak: chimed's {}\n", ended.ntp_totals.trim()));
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(out.as_bytes());
    Figures {
        out,
        seen,
        false_ntp,
        false_rt,
        steady: (steady_sent, steady_answered),
        of_capacity,
    }
}

/// What the soak holds chimed to (see the module's comment).
fn check(s: &Soak, t: &Traffic, sched: &Schedule, ended: &Ended, fig: &Figures) {
    let (out, seen, faults) = (&fig.out, &fig.seen, &sched.faults);
    let (steady_sent, steady_answered) = fig.steady;
    let ((rss_start, rss_end), (fds_start, fds_end)) = (sched.rss, sched.fds);
    assert!(!faults.is_empty(), "{out}");
    assert_eq!(t.counts.wrong.load(Relaxed), 0, "{out}");
    assert_eq!(fig.false_ntp, 0, "{out}");
    assert_eq!(fig.false_rt, 0, "{out}");
    assert_eq!(t.rt.wrong.load(Relaxed), 0, "{out}");
    assert_eq!(count_in(&ended.ntp_totals, "nts_nak"), 0, "{out}");
    assert!(ended.nts_measured > s.seconds as usize, "{out}");
    assert!(!ended.log.contains("panicked"), "{out}");
    for f in faults {
        let turned = seen.iter().any(|r| !r.synced && r.meets(&(f.start..f.end)));
        let back = seen
            .iter()
            .any(|r| r.synced && r.meets(&(f.end..f.end + 3.0)));
        assert!(turned && back, "{f:?}: {out}");
    }
    assert!(steady_answered as f64 >= 0.95 * steady_sent as f64, "{out}");
    // Goodput held at three times capacity, over all the bursts, each against its own round's
    // capacity; single bursts are reported, not held to it.
    if let Some(r) = fig.of_capacity {
        assert!(r >= 0.9, "{out}");
    }
    assert!(rss_end < rss_start + 32 * 1024, "{out}");
    assert!(fds_end <= fds_start + 8, "{out}");
}

#[test]
fn soak_under_faults() {
    let (mut s, first) = start_soak();
    let nts_client = ChronydClient::start(&[
        format!(
            "server 127.0.0.1 nts ntsport {} minpoll -2 maxpoll -2",
            s.ke_port
        ),
        format!("ntstrustedcerts {}", s.cert.display()),
    ]);
    let mut t = start_traffic(&s);
    // SIGHUP every 2 s, from here to the end.
    let mut hup = Hupper {
        pid: s.pid,
        last: Instant::now(),
        sent: 0,
    };
    let mut next_tag = LADDER;
    let (capacity, rate) = first_capacity(&s, &t, &mut hup, &mut next_tag);
    t.load.store(load_of(rate, STEADY), Relaxed);
    let mut sched = run_schedule(&s, &t, &mut hup, &mut next_tag, first, capacity, rate);
    let ended = wind_down(&mut s, &mut t, nts_client);
    drop(sched.upstream.take());
    let fig = figures(&s, &t, &sched, &ended, hup.sent, rate, capacity);
    check(&s, &t, &sched, &ended, &fig);
}

fn chimed_pid(pid: u32) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(pid as i32)
}

/// Whether `reply` parses as a Roughtime reply at all (a late answer to an earlier request of
/// ours is one; garbage is not).
fn verify_any_earlier(reply: &[u8]) -> bool {
    chime_roughtime::Reply::parse(reply).is_ok()
}
