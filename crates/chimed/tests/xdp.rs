//! chimed serving through AF_XDP (`--xdp`) on one end of a veth pair between two network
//! namespaces this test makes (and removes when it ends): the server's, holding chronyd -x (the
//! mirror, on its own loopback) and chimed, and the client's, from which real clients query.
//!
//! NTP (chronyd -Q, chime over IPv4 and IPv6, chronyd over NTS) and Roughtime (chime, which
//! verifies every signature) must be answered by the XDP workers, not the sockets; ICMP, NTS-KE
//! over TCP and another UDP port must still reach the kernel; frames with a bad checksum or length
//! sent to the served port must be dropped and counted; and no XDP program may be left on the
//! interface after chimed exits, on SIGTERM or SIGKILL.
//!
//! The client's veth sends complete UDP checksums (`ethtool -K tx off`), as a frame off a wire
//! has them: by default a veth leaves the checksum to be finished by hardware that is not there,
//! which the kernel's own receive path trusts and chimed's, seeing only the frame, cannot.
//!
//! With `--xdp-in-driver`, plain requests are answered in the driver with XDP_TX, which a veth
//! delivers only to a peer with an XDP program of its own: those tests give the client's end one.
//! Under `--allow`/`--deny`, a denied address's requests are dropped there as on the sockets.
//!
//! Fixed ports are fine here: each namespace has its own, with nothing else in it.

mod common;

use std::process::Command;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use common::{
    BEEVIK_NTP, Chimed, Chronyd, ChronydClient, certificate_for, count_in, has_offset, in_netns,
    ip, ntpd_rs_in, peer, run, workspace_bin,
};
use nix::sys::signal::{self, Signal};

const SERVER_V4: &str = "10.201.0.1";
const CLIENT_V4: &str = "10.201.0.2";
const SERVER_V6: &str = "fd01::1";
const CLIENT_V6: &str = "fd01::2";
const IFACE: &str = "xs0";
const MIRROR_PORT: u16 = 11123;

/// Held by every test's pair while it runs, shared, and alone by the one that compares clients'
/// offsets between paths: a few tens of microseconds are what it measures, and other tests
/// loading the two cores at the same time move the socket path's by about as much.
static LOAD: RwLock<()> = RwLock::new(());

/// A pair's hold on [`LOAD`].
enum Hold {
    Shared {
        _guard: RwLockReadGuard<'static, ()>,
    },
    Alone {
        _guard: RwLockWriteGuard<'static, ()>,
    },
}

/// The two namespaces and their veth pair; removed on drop.
struct Pair {
    server: String,
    client: String,
    _hold: Hold,
}

impl Pair {
    fn build(tag: &str) -> Self {
        Self::with_queues(tag, 1)
    }

    /// [`Self::build`] for a test that measures: no other test's pair exists while it does.
    fn alone(tag: &str) -> Self {
        let _guard = LOAD.write().unwrap_or_else(PoisonError::into_inner);
        let hold = Hold::Alone { _guard };
        Self::with_hold(tag, 1, hold)
    }

    /// The pair with `queues` receive and transmit queues on each end.
    fn with_queues(tag: &str, queues: usize) -> Self {
        let _guard = LOAD.read().unwrap_or_else(PoisonError::into_inner);
        let hold = Hold::Shared { _guard };
        Self::with_hold(tag, queues, hold)
    }

    fn with_hold(tag: &str, queues: usize, hold: Hold) -> Self {
        let q = queues.to_string();
        let tag = format!("chime-xdp-{tag}-{}", std::process::id());
        let p = Pair {
            server: format!("{tag}-s"),
            client: format!("{tag}-c"),
            _hold: hold,
        };
        let (s, c) = (p.server.as_str(), p.client.as_str());
        for ns in [s, c] {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        ip(&[
            "link",
            "add",
            IFACE,
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
            "netns",
            s,
            "type",
            "veth",
            "peer",
            "name",
            "xc0",
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
            "netns",
            c,
        ]);
        for (ns, dev, v4, v6) in [
            (s, IFACE, SERVER_V4, SERVER_V6),
            (c, "xc0", CLIENT_V4, CLIENT_V6),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", dev]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                dev,
                "nodad",
            ]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        let out = run(in_netns(Some(c), "ethtool").args(["-K", "xc0", "tx", "off"]));
        assert!(out.status.success(), "ethtool in the client: {out:?}");
        p
    }

    /// Whether the server's interface has an XDP program attached, as `ip link` shows it.
    fn has_xdp(&self) -> bool {
        let out = run(Command::new("ip").args(["-n", &self.server, "link", "show", IFACE]));
        // "prog/xdp id N name chimed_xdp": not just "xdp", which the namespace's name holds.
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    }

    fn in_client(&self, program: &str) -> Command {
        in_netns(Some(&self.client), program)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.server, &self.client] {
            let _ = run(Command::new("ip").args(["netns", "del", ns]));
        }
    }
}

fn assert_root() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the XDP tests make network namespaces and attach XDP programs: run them as root"
    );
}

/// chimed in the server's namespace, mirroring its chronyd, with `--xdp IFACE` and `extra`
/// flags; returns once it is synchronised.
fn chimed(pair: &Pair, extra: &[&str]) -> Chimed {
    chimed_on(pair, IFACE, extra)
}

/// [`chimed`] with `--xdp iface`.
fn chimed_on(pair: &Pair, iface: &str, extra: &[&str]) -> Chimed {
    let mut c = chimed_running(pair, iface, extra, &[]);
    c.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    c
}

/// chimed in the server's namespace as [`chimed_on`] starts it, with `env` set; returns once it
/// runs, synchronised or not.
fn chimed_running(pair: &Pair, iface: &str, extra: &[&str], env: &[(&str, &str)]) -> Chimed {
    let upstream = format!("127.0.0.1:{MIRROR_PORT}");
    let mut args = vec![
        "-s",
        &upstream,
        "-4",
        "1",
        "-a",
        "0.0.0.0:123",
        "--xdp",
        iface,
    ];
    args.extend_from_slice(extra);
    Chimed::start_with_env(Some(&pair.server), &args, env, "running:")
}

/// `chime ARGS` in the client's namespace, its JSON output parsed.
fn chime(pair: &Pair, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = run(in_netns(Some(&pair.client), workspace_bin("chime")).args(args));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {out:?}"))
}

/// `chime ntp` from the client to the server's IPv4 address.
fn ntp_v4(pair: &Pair) -> Result<serde_json::Value, String> {
    chime_ntp(pair, &format!("{SERVER_V4}:123"), &[])
}

/// `chime ntp --json ...` with `flags`, from the client to `server`.
fn chime_ntp(pair: &Pair, server: &str, flags: &[&str]) -> Result<serde_json::Value, String> {
    let mut args = vec!["ntp", "--json", "--timeout", "2"];
    args.extend_from_slice(flags);
    args.push(server);
    chime(pair, &args)
}

/// Sends raw Ethernet frames out of the client's veth (a Python AF_PACKET socket, as a capture
/// tool would): each hex string is one frame.
fn send_frames(pair: &Pair, frames: &[String]) {
    let script = "import socket,sys\n\
                  s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n\
                  s.bind(('xc0',0))\n\
                  for f in sys.argv[1:]: s.send(bytes.fromhex(f))\n";
    let out = run(pair.in_client("python3").args(["-c", script]).args(frames));
    assert!(out.status.success(), "sending raw frames: {out:?}");
}

/// One IPv4 UDP frame from the client to the server's port 123 carrying a 48-byte NTP request,
/// with a correct IPv4 header checksum and the UDP checksum and length given.
fn ntp_frame(server_mac: &str, client_mac: &str, udp_len: u16, udp_checksum: u16) -> String {
    let mut ip = vec![0x45, 0, 0, 76, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip.extend(SERVER_V4.parse::<std::net::Ipv4Addr>().unwrap().octets());
    // Client first, then server: the source, then the destination.
    ip.splice(
        12..12,
        CLIENT_V4.parse::<std::net::Ipv4Addr>().unwrap().octets(),
    );
    let sum = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let check = !((sum & 0xffff) + (sum >> 16)) as u16;
    ip[10..12].copy_from_slice(&check.to_be_bytes());
    let mut udp = vec![];
    udp.extend(40000u16.to_be_bytes());
    udp.extend(123u16.to_be_bytes());
    udp.extend(udp_len.to_be_bytes());
    udp.extend(udp_checksum.to_be_bytes());
    let mut ntp = [0u8; 48];
    ntp[0] = 0x23;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}{}0800{}{}{}",
        server_mac.replace(':', ""),
        client_mac.replace(':', ""),
        hex(&ip),
        hex(&udp),
        hex(&ntp)
    )
}

fn mac(ns: &str, dev: &str) -> String {
    let out = run(in_netns(Some(ns), "cat").arg(format!("/sys/class/net/{dev}/address")));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The serving scenario: chimed through XDP in the server's namespace with NTP over both
/// families, Roughtime, NTS and metrics. Fields drop in order: chimed first, the pair last.
struct Served {
    server: Chimed,
    rt_key: common::RoughtimeKey,
    cert: std::path::PathBuf,
    dir: tempfile::TempDir,
    _mirror: Chronyd,
    pair: Pair,
}

/// Builds the pair, starts the mirror and chimed, and checks chimed attached its XDP program
/// (in copy mode: a veth has no zero-copy).
fn serve_through_xdp() -> Served {
    let pair = Pair::build("serve");
    let mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate_for(dir.path(), "xdp", &format!("IP:{SERVER_V4}"));
    let rt_key = common::chime_keygen();
    let mut server = chimed(
        &pair,
        &[
            "-6",
            "1",
            "--ipv6-address",
            "[::]:123",
            "--roughtime-key",
            rt_key.file.to_str().unwrap(),
            "--roughtime-ipv4-address",
            "0.0.0.0:2002",
            "--roughtime-ipv4-threads",
            "1",
            "--roughtime-ipv6-threads",
            "0",
            "--nts-certificate",
            cert.to_str().unwrap(),
            "--nts-private-key",
            key.to_str().unwrap(),
            "--nts-ke-address",
            "0.0.0.0:4460",
            "--metrics-address",
            "127.0.0.1:9123",
            "--ntpv5",
        ],
    );
    let line = server.wait_for("xdp on xs0:", Duration::from_secs(1));
    assert!(line.contains("copy mode"), "veth has no zero-copy: {line}");
    assert!(
        pair.has_xdp(),
        "no XDP program on {IFACE} while chimed runs"
    );
    Served {
        server,
        rt_key,
        cert,
        dir,
        _mirror: mirror,
        pair,
    }
}

/// NTP over IPv4 (chronyd -Q) and IPv6 (chime), and Roughtime (chime and roughenough_client),
/// are answered through XDP.
fn check_ntp_and_roughtime_answered(s: &Served) {
    let pair = &s.pair;
    // NTP over IPv4, chronyd as the client.
    let out = run(pair.in_client(common::CHRONYD).args([
        "-Q",
        "-t",
        "10",
        "-u",
        "root",
        &format!("server {SERVER_V4} iburst maxsamples 4"),
        &format!("pidfile {}/q.pid", s.dir.path().display()),
        "cmdport 0",
    ]));
    let text = format!("{out:?}");
    assert!(
        text.contains("System clock wrong by"),
        "chronyd -Q through XDP: {text}"
    );
    // NTP over IPv6, and Roughtime, with chime.
    let r = chime_ntp(pair, &format!("[{SERVER_V6}]:123"), &[])
        .expect("chime ntp over IPv6 through XDP");
    assert_eq!(r["stratum"], 3, "{r}");
    // NTPv5 (the draft) through the same path, with the server's Bloom filter.
    let v5 = ["--ntp-version", "5", "--ntpv5-reference"];
    let r = chime_ntp(pair, &format!("{SERVER_V4}:123"), &v5)
        .expect("chime ntp --ntp-version 5 through XDP");
    assert_eq!(
        (r["version"].as_u64(), r["stratum"].as_u64()),
        (Some(5), Some(3)),
        "{r}"
    );
    assert_eq!(r["ntpv5"]["reference_bits_set"], 10, "{r}");
    let r = chime(
        pair,
        &[
            "roughtime",
            "--json",
            "--timeout",
            "2",
            "--public-key",
            &s.rt_key.public_base64,
            &format!("{SERVER_V4}:2002"),
        ],
    )
    .expect("chime roughtime through XDP");
    assert!(r["midpoint_unix_us"].is_number(), "{r}");
    // And an independent client, which exits 0 only for a reply that verified.
    let client = common::peer(
        "ROUGHENOUGH_CLIENT",
        "/opt/chime-peers/bin/roughenough_client",
    );
    let out = run(in_netns(Some(&pair.client), client)
        .args([SERVER_V4, "2002", "-k", &s.rt_key.public_base64, "-P", "1"])
        .env("NO_COLOR", "1"));
    assert!(
        out.status.success(),
        "roughenough_client through XDP: {out:?}"
    );
}

/// NTS: NTS-KE over TCP reaches the kernel's listener, NTS-authenticated NTP comes through
/// XDP. The client asks for interleaved mode too, which this path does not claim: every reply
/// must be basic (through the sockets the third on would be interleaved).
fn check_nts_basic_through_xdp(s: &Served) {
    let client = ChronydClient::start_in(
        Some(&s.pair.client),
        &[
            format!("server {SERVER_V4} iburst nts xleave minpoll -4 maxpoll -4"),
            format!("ntstrustedcerts {}", s.cert.display()),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while client.measured() < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let rows = client.measurements();
    assert!(
        rows.len() >= 5,
        "chronyd measured {} times over NTS",
        rows.len()
    );
    assert!(
        rows.iter().all(|r| r[17] == "4B"),
        "interleaved replies through XDP: {rows:?}"
    );
    drop(client);
}

/// ICMP over both families, and another UDP port, still reach the kernel.
fn check_the_rest_reaches_the_kernel(pair: &Pair) {
    for addr in [SERVER_V4, SERVER_V6] {
        let out = run(pair.in_client("ping").args(["-c", "1", "-W", "2", addr]));
        assert!(out.status.success(), "ping {addr}: {out:?}");
    }
    let mut echo = in_netns(Some(&pair.server), "python3")
        .args([
            "-c",
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.bind(('0.0.0.0',5353))\nprint('ready',flush=True)\n\
             d,a=s.recvfrom(100)\ns.sendto(d,a)\n",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(echo.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    let out = run(pair.in_client("python3").args([
        "-c",
        &format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.settimeout(2)\ns.sendto(b'kernel',('{SERVER_V4}',5353))\n\
             assert s.recv(100)==b'kernel'\n"
        ),
    ]));
    assert!(out.status.success(), "UDP to another port: {out:?}");
    // It exits after its one echo; killed in case the datagram never came.
    let _ = echo.kill();
    let _ = echo.wait();
}

/// Frames to the served port with a bad UDP checksum and a UDP length past the IP length:
/// through the program (plain IPv4 UDP to 123), then dropped and counted by the worker; the
/// metrics say so too, inside the server's namespace.
fn check_malformed_frames_are_counted(pair: &Pair) {
    let (smac, cmac) = (mac(&pair.server, IFACE), mac(&pair.client, "xc0"));
    send_frames(
        pair,
        &[
            ntp_frame(&smac, &cmac, 56, 0x1234),
            ntp_frame(&smac, &cmac, 200, 0),
        ],
    );
    // A well-formed one after them, so that the two were taken before chimed stops.
    ntp_v4(pair).expect("chime ntp after the bad frames");

    let page = common::scrape_in(&pair.server, "127.0.0.1:9123".parse().unwrap());
    for want in [
        "chimed_xdp_info{service=\"xdp\",interface=\"xs0\",mode=\"copy\"} 1",
        "chimed_xdp_frames_dropped_total{service=\"xdp\",reason=\"malformed\"} 2",
        "chimed_xdp_receive_times_total{service=\"xdp\",source=\"worker\"} 0",
    ] {
        assert!(page.contains(want), "no {want:?} in the metrics:\n{page}");
    }
    assert!(
        page.lines()
            .any(|l| l.starts_with("chimed_replies_sent_total{")
                && l.contains("family=\"xdp\"")
                && l.contains("service=\"roughtime\"")
                && l.ends_with(" 2")),
        "no Roughtime reply counted under family xdp:\n{page}"
    );
}

/// Stops chimed and checks its totals at exit: what the XDP worker answered and dropped, that
/// no NTP reached the sockets, and that no XDP program is left.
fn check_exit_totals(s: &mut Served) {
    let server = &mut s.server;
    server.terminate();
    server.wait_for("ntp totals at exit", Duration::from_secs(2));
    let log = server.log();
    let totals = log
        .lines()
        .find(|l| l.contains("xdp totals at exit"))
        .unwrap_or_else(|| panic!("no XDP totals: {log}"));
    assert_eq!(count_after(totals, "malformed "), 2, "{totals}");
    assert_eq!(count_after(totals, "from the worker "), 0, "{totals}");
    let xdp_ntp = log
        .lines()
        .find(|l| l.contains("worker{thread=xdp-0}") && l.contains("ntp stats at exit"))
        .unwrap_or_else(|| panic!("no XDP NTP stats: {log}"));
    let xdp_rt = log
        .lines()
        .find(|l| l.contains("worker{thread=xdp-0}") && l.contains("roughtime stats at exit"))
        .unwrap_or_else(|| panic!("no XDP Roughtime stats: {log}"));
    let socket_ntp: u64 = log
        .lines()
        .filter(|l| l.contains("worker{thread=ntp-ipv") && l.contains("stats at exit"))
        .map(|l| count_in(l, "received"))
        .sum();
    // chronyd -Q (up to 4), chime over IPv6 and the last one, chime over NTPv5 (a time request
    // and four for the filter), and chronyd over NTS (5 or more).
    assert!(count_in(xdp_ntp, "answered") >= 13, "{xdp_ntp}");
    assert_eq!(count_in(xdp_ntp, "ntpv5"), 5, "{xdp_ntp}");
    assert!(count_in(xdp_ntp, "nts") >= 5, "{xdp_ntp}");
    assert_eq!(count_in(xdp_rt, "answered"), 2, "{xdp_rt}");
    assert_eq!(socket_ntp, 0, "NTP reached the sockets, not XDP:\n{log}");
    assert!(!s.pair.has_xdp(), "the XDP program outlived chimed");
}

#[test]
fn ntp_and_roughtime_are_answered_through_xdp_and_the_rest_reaches_the_kernel() {
    assert_root();
    let mut s = serve_through_xdp();
    check_ntp_and_roughtime_answered(&s);
    check_nts_basic_through_xdp(&s);
    check_the_rest_reaches_the_kernel(&s.pair);
    check_malformed_frames_are_counted(&s.pair);
    check_exit_totals(&mut s);
}

/// The number after `label` in `line`.
fn count_after(line: &str, label: &str) -> u64 {
    line.split(label)
        .nth(1)
        .and_then(|r| r.split([',', ' ']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count after {label:?} in {line}"))
}

#[test]
fn a_killed_chimed_leaves_no_program_and_bad_setups_say_why() {
    assert_root();
    let pair = Pair::build("exit");
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let server = chimed(&pair, &[]);
    assert!(pair.has_xdp());
    signal::kill(server.pid(), Signal::SIGKILL).unwrap();
    drop(server);
    // The link's last descriptor closes as the kernel reaps the process.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pair.has_xdp() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pair.has_xdp(), "a SIGKILLed chimed left its XDP program");
    // And the next one starts at once; while it runs, a second chimed on the interface is
    // refused, saying why, and leaves the first's program in place.
    let mut again = chimed(&pair, &[]);
    let out = run(in_netns(Some(&pair.server), workspace_bin("chimed")).args([
        "-s",
        &format!("127.0.0.1:{MIRROR_PORT}"),
        "-4",
        "1",
        "-a",
        "0.0.0.0:1123",
        "--xdp",
        IFACE,
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("another AF_XDP socket holds the queue"),
        "{err}"
    );
    assert!(pair.has_xdp());
    ntp_v4(&pair).expect("the first chimed still serves");
    again.terminate();

    let upstream = format!("127.0.0.1:{MIRROR_PORT}");
    for (extra, want) in [
        (vec!["--xdp", "nosuch0"], "no interface named nosuch0"),
        (
            vec!["--xdp", IFACE, "--xdp-threads", "2"],
            "1 receive queue(s)",
        ),
    ] {
        let out = run(in_netns(Some(&pair.server), workspace_bin("chimed"))
            .args(["-s", &upstream, "-4", "1", "-a", "0.0.0.0:123"])
            .args(&extra));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.contains(want), "{extra:?}: {err}");
    }
    // Asked to, it serves through the sockets alone instead.
    let mut fallback = chimed_on(&pair, "nosuch0", &["--xdp-fallback"]);
    fallback.wait_for("serving through the sockets alone", Duration::from_secs(1));
    ntp_v4(&pair).expect("chime ntp through the sockets");
    fallback.terminate();
}

#[test]
fn each_queue_has_its_thread() {
    assert_root();
    let pair = Pair::with_queues("queues", 2);
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let mut server = chimed(&pair, &["--xdp-threads", "2"]);
    server.wait_for("xdp on xs0: 2 thread(s)", Duration::from_secs(1));
    // Each query from a new source port: the client's veth spreads flows over its two transmit
    // queues by hash, and a veth delivers transmit queue i to the peer's receive queue i.
    let mut answered = 0;
    for _ in 0..24 {
        if ntp_v4(&pair).is_ok() {
            answered += 1;
        }
    }
    assert_eq!(answered, 24);
    server.terminate();
    server.wait_for("ntp totals at exit", Duration::from_secs(2));
    let log = server.log();
    let per_thread: Vec<u64> = (0..2)
        .map(|i| {
            log.lines()
                .find(|l| {
                    l.contains(&format!("worker{{thread=xdp-{i}}}"))
                        && l.contains("ntp stats at exit")
                })
                .map_or(0, |l| count_in(l, "answered"))
        })
        .collect();
    assert_eq!(per_thread.iter().sum::<u64>(), 24, "{log}");
    assert!(
        per_thread.iter().all(|&n| n > 0),
        "one queue's thread answered nothing: {per_thread:?}\n{log}"
    );
}

/// The XDP workers are a service like the others (tests/supervision.rs makes each of those fail):
/// a worker that panics, or whose loop ends, through the `xdp-worker` fail point takes chimed
/// down within 2 s, exiting 1 with an error line naming the service.
#[cfg(feature = "failpoints")]
#[test]
fn an_xdp_worker_that_ends_takes_chimed_down_naming_it() {
    assert_root();
    let pair = Pair::build("fail");
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    for (action, named) in [
        ("panic", "service xdp panicked"),
        ("return", "service xdp ended without an error"),
    ] {
        let failpoints = format!("xdp-worker={action}");
        let env = [("FAILPOINTS", failpoints.as_str())];
        chimed_running(&pair, IFACE, &[], &env).assert_fails_naming(&failpoints, named);
    }
}

/// ntpdig's offset of the server's IPv4 address from the client and its synchronisation
/// distance, seconds: one request.
fn ntpdig_offset(pair: &Pair) -> (f64, f64) {
    let out = run(pair.in_client("ntpdig").args(["-j", "-t", "2", SERVER_V4]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ntpdig: {out:?}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("ntpdig's output is not JSON ({e}): {stdout}"));
    // ntpdig's "precision" is its synchronisation distance: half the round trip, and its
    // estimate of the clocks' imprecision, which is the same for every sample here.
    let number = |key: &str| {
        r[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key} from ntpdig: {stdout}"))
    };
    (number("offset"), number("precision"))
}

/// chronyd -Q's offset of the server's IPv4 address from the client, seconds, over `samples`
/// requests ("System clock wrong by X seconds").
fn chronyd_offset(pair: &Pair, dir: &std::path::Path, samples: u32) -> f64 {
    let out = run(pair.in_client(common::CHRONYD).args([
        "-Q",
        "-t",
        "10",
        "-u",
        "root",
        &format!("server {SERVER_V4} iburst maxsamples {samples}"),
        &format!("pidfile {}/q.pid", dir.display()),
        "cmdport 0",
    ]));
    let text = format!("{out:?}");
    text.split("System clock wrong by ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no offset from chronyd -Q: {text}"))
}

/// beevik/ntp's offset of the server's IPv4 address from the client over `n` queries, seconds,
/// as NTP's clock filter takes one: that of the query with the shortest round trip. The library
/// validated every reply (the program fails otherwise).
fn beevik_best(pair: &Pair, n: usize) -> f64 {
    let out = run(
        in_netns(Some(&pair.client), peer("BEEVIK_NTP", BEEVIK_NTP)).args([
            "-count",
            &n.to_string(),
            "-timeout",
            "2s",
            &format!("{SERVER_V4}:123"),
        ]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "beevik-ntp: {out:?}");
    let samples: Vec<(f64, f64)> = (stdout.lines())
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("beevik-ntp's line is not JSON ({e}): {l}"));
            assert_eq!(r["stratum"], 3, "{l}");
            let number = |key: &str| r[key].as_f64().unwrap_or_else(|| panic!("no {key}: {l}"));
            (number("offset"), number("rtt"))
        })
        .collect();
    assert_eq!(samples.len(), n, "{stdout}");
    (samples.into_iter())
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap()
        .0
}

/// ntpd-rs's offset of the server's IPv4 address, seconds: its daemon, as shipped but for one
/// source polled every 2 s, in the client's namespace, once it has measured for `polls` polls.
fn ntpd_rs_offset(pair: &Pair, polls: u32) -> f64 {
    let source = format!("mode = \"server\"\naddress = \"{SERVER_V4}:123\"\n");
    let dir = tempfile::tempdir().unwrap();
    let since = Instant::now();
    let long_enough = Duration::from_secs(2 * u64::from(polls));
    let (status, _) = ntpd_rs_in(Some(&pair.client), dir.path(), &source, |status, _| {
        has_offset(status) && since.elapsed() >= long_enough
    });
    let source = status.split("Sources:").nth(1).unwrap_or("");
    (source.lines())
        .find_map(|l| l.trim().strip_prefix("Offset:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no offset in ntpd-rs's status:\n{status}"))
}

/// ntpdig's offset from `n` requests as NTP's clock filter takes one: that of the request with
/// the shortest round trip (the least distance), the one queues on either side delayed least.
fn ntpdig_best(pair: &Pair, n: usize) -> f64 {
    let samples = (0..n).map(|_| ntpdig_offset(pair));
    samples.min_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0
}

/// The program in the driver's count of `outcome`, from the metrics in the server's namespace.
fn driver_count(pair: &Pair, outcome: &str) -> u64 {
    let page = common::scrape_in(&pair.server, "127.0.0.1:9123".parse().unwrap());
    let series =
        format!("chimed_xdp_driver_frames_total{{service=\"xdp\",outcome=\"{outcome}\"}} ");
    (page.lines())
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {series:?} in the metrics:\n{page}"))
}

/// The independent clients [`client_offsets`] runs, in its order.
const CLIENTS: [&str; 4] = ["ntpdig", "chronyd -Q", "beevik/ntp", "ntpd-rs"];
/// Requests ntpdig and beevik/ntp send, one after another, for one offset.
const SAMPLES: usize = 7;

/// Each of [`CLIENTS`]' offsets of the server's IPv4 address from the client's namespace, seconds,
/// with how far `answered` (a count the server keeps, or none) rose while that client ran.
fn client_offsets(
    pair: &Pair,
    dir: &std::path::Path,
    answered: impl Fn() -> u64,
) -> [(f64, u64); 4] {
    let measures: [&dyn Fn() -> f64; 4] = [
        &|| ntpdig_best(pair, SAMPLES),
        &|| chronyd_offset(pair, dir, 4),
        &|| beevik_best(pair, SAMPLES),
        &|| ntpd_rs_offset(pair, 4),
    ];
    measures.map(|measure| {
        let before = answered();
        let offset = measure();
        (offset, answered() - before)
    })
}

/// With `--xdp-in-driver`, plain client requests (ntpdig's, chronyd's, beevik/ntp's, ntpd-rs's)
/// are answered in the driver, not by the AF_XDP workers, and each client's offset agrees within
/// 50 µs with its own against chimed on its sockets; an NTS request still goes to the workers.
/// Each offset is the client's as it would take it (ntpdig's and beevik/ntp's from the shortest of
/// their round trips, chronyd's and ntpd-rs's through their own filters), with no other test of
/// this file running.
#[test]
fn plain_ntp_is_answered_in_the_driver_as_on_the_sockets() {
    assert_root();
    let pair = Pair::alone("driver");
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let dir = tempfile::tempdir().unwrap();
    let _peer = client_xdp_program(&pair);

    // chimed on its sockets alone: what the same clients measure there.
    let upstream = format!("127.0.0.1:{MIRROR_PORT}");
    let sockets_only = ["-s", &upstream, "-4", "1", "-a", "0.0.0.0:123"];
    let mut sockets = Chimed::start_with_env(Some(&pair.server), &sockets_only, &[], "running:");
    sockets.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let on_sockets = client_offsets(&pair, dir.path(), || 0);
    sockets.terminate();
    drop(sockets);

    let (cert, key) = certificate_for(dir.path(), "xdp", &format!("IP:{SERVER_V4}"));
    let mut server = chimed(
        &pair,
        &[
            "--xdp-in-driver",
            "--metrics-address",
            "127.0.0.1:9123",
            "--nts-certificate",
            cert.to_str().unwrap(),
            "--nts-private-key",
            key.to_str().unwrap(),
            "--nts-ke-address",
            "0.0.0.0:4460",
        ],
    );
    server.wait_for("answered in the driver", Duration::from_secs(1));
    let in_driver = client_offsets(&pair, dir.path(), || driver_count(&pair, "answered"));
    // How many of each client's requests the driver answers: all of ntpdig's and beevik/ntp's;
    // chronyd -Q's and ntpd-rs's depend on their polling.
    let expected = [
        SAMPLES as u64..=SAMPLES as u64,
        1..=8,
        SAMPLES as u64..=SAMPLES as u64,
        1..=u64::MAX,
    ];
    for (i, name) in CLIENTS.iter().enumerate() {
        let ((sockets, _), (driver, answered)) = (on_sockets[i], in_driver[i]);
        eprintln!(
            "{name}: offset {:.1} µs on the sockets, {:.1} µs in the driver, which answered \
             {answered} of its requests",
            sockets * 1e6,
            driver * 1e6
        );
        assert!(
            expected[i].contains(&answered),
            "{name}: {answered} answered in the driver, not {:?}",
            expected[i]
        );
        assert!(
            (driver - sockets).abs() < 50e-6,
            "{name}: offset {sockets} s on the sockets, {driver} s in the driver"
        );
    }

    // NTS: its request carries extension fields, so the program hands it on.
    let length = driver_count(&pair, "length");
    let ca = cert.to_str().unwrap();
    chime_ntp(&pair, SERVER_V4, &["--nts", "--nts-ca", ca]).expect("chime ntp --nts");
    assert_eq!(driver_count(&pair, "length"), length + 1);

    server.terminate();
    server.wait_for("ntp totals at exit", Duration::from_secs(2));
    let log = server.log();
    let xdp_ntp = (log.lines())
        .find(|l| l.contains("worker{thread=xdp-0}") && l.contains("ntp stats at exit"))
        .unwrap_or_else(|| panic!("no XDP NTP stats: {log}"));
    assert_eq!(count_in(xdp_ntp, "answered"), 1, "only NTS's: {xdp_ntp}");
    assert_eq!(count_in(xdp_ntp, "nts"), 1, "{xdp_ntp}");
}

/// A second address on the client's veth end, allowed where the first is denied.
const CLIENT_V4_ALLOWED: &str = "10.201.0.3";

/// Sends `n` plain client requests from `source` in the client's namespace to the server's IPv4
/// NTP port, one at a time, each waiting up to `wait_ms` for its reply; returns how many were
/// answered.
fn requests_from(pair: &Pair, source: &str, n: u32, wait_ms: u32) -> u32 {
    let script = "import socket,sys\n\
                  src,dst,n,t=sys.argv[1],sys.argv[2],int(sys.argv[3]),int(sys.argv[4])/1000\n\
                  s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
                  s.bind((src,0))\n\
                  s.settimeout(t)\n\
                  got=0\n\
                  for i in range(n):\n\
                  \x20   s.sendto(bytes([0x23])+bytes(39)+(0xe1112222_33334444+i).to_bytes(8,'big'),(dst,123))\n\
                  \x20   try:\n\
                  \x20       s.recv(100)\n\
                  \x20       got+=1\n\
                  \x20   except socket.timeout:\n\
                  \x20       pass\n\
                  print(got)\n";
    let (n, wait) = (n.to_string(), wait_ms.to_string());
    let out = run(pair
        .in_client("python3")
        .args(["-c", script, source, SERVER_V4, &n, &wait]));
    assert!(out.status.success(), "requests from {source}: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

/// The NTP requests chimed's workers (on sockets and AF_XDP alike) dropped as denied, from the
/// metrics in the server's namespace.
fn denied_by_workers(pair: &Pair) -> u64 {
    let page = common::scrape_in(&pair.server, "127.0.0.1:9123".parse().unwrap());
    (page.lines())
        .filter(|l| {
            l.starts_with("chimed_requests_dropped_total{")
                && l.contains("service=\"ntp\"")
                && l.contains("reason=\"denied\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A chimed on the client's veth end, serving another port, for the XDP program it attaches: a
/// veth takes the frames its peer sends with XDP_TX only while it has one (GRO on is not enough,
/// docs/XDP.adoc), and that program passes the replies on to the client's stack.
fn client_xdp_program(pair: &Pair) -> Chimed {
    let args = [
        "-s",
        "127.0.0.1:9",
        "-4",
        "1",
        "-a",
        "0.0.0.0:1123",
        "-6",
        "0",
        "--xdp",
        "xc0",
        "--control-socket",
        "none",
        "--client-log",
        "0",
    ];
    Chimed::start_with_env(Some(&pair.client), &args, &[], "running:")
}

/// `--allow` and `--deny` hold in the driver as on the sockets: the same requests from a denied
/// address are dropped unanswered and counted `denied` by each, one for one; an allowed address
/// is answered, in the driver; a SIGHUP that changes the rules changes them in the driver too.
#[test]
fn a_denied_address_is_dropped_in_the_driver_as_on_the_sockets() {
    const SENT: u32 = 10;
    assert_root();
    let pair = Pair::build("acl");
    ip(&[
        "-n",
        &pair.client,
        "addr",
        "add",
        &format!("{CLIENT_V4_ALLOWED}/24"),
        "dev",
        "xc0",
    ]);
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let _peer = client_xdp_program(&pair);
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("chimed.toml");
    let rules = |deny: &str| {
        let text = format!("[access]\nallow = [\"10.201.0.0/24\"]\ndeny = [\"{deny}\"]\n");
        std::fs::write(&conf, text).unwrap();
    };
    rules(CLIENT_V4);
    let config = ["--config", conf.to_str().unwrap()];
    let metrics = ["--metrics-address", "127.0.0.1:9123"];

    // On the sockets.
    let upstream = format!("127.0.0.1:{MIRROR_PORT}");
    let sockets_only = [
        &["-s", &upstream, "-4", "1", "-a", "0.0.0.0:123"][..],
        &config,
        &metrics,
    ];
    let mut sockets =
        Chimed::start_with_env(Some(&pair.server), &sockets_only.concat(), &[], "running:");
    sockets.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    assert_eq!(requests_from(&pair, CLIENT_V4_ALLOWED, 2, 2000), 2);
    let before = denied_by_workers(&pair);
    assert_eq!(requests_from(&pair, CLIENT_V4, SENT, 300), 0, "answered");
    let on_sockets = denied_by_workers(&pair) - before;
    assert_eq!(on_sockets, u64::from(SENT), "denied on the sockets");
    sockets.terminate();
    drop(sockets);

    // In the driver.
    let mut server = chimed(
        &pair,
        &[&["--xdp-in-driver"][..], &config, &metrics].concat(),
    );
    server.wait_for("answered in the driver", Duration::from_secs(1));
    let (answered, denied) = (
        driver_count(&pair, "answered"),
        driver_count(&pair, "denied"),
    );
    let by_workers = denied_by_workers(&pair);
    assert_eq!(requests_from(&pair, CLIENT_V4, SENT, 300), 0, "answered");
    assert_eq!(
        driver_count(&pair, "denied") - denied,
        on_sockets,
        "denied in the driver as on the sockets"
    );
    assert_eq!(requests_from(&pair, CLIENT_V4_ALLOWED, SENT, 2000), SENT);
    assert_eq!(
        driver_count(&pair, "answered") - answered,
        u64::from(SENT),
        "the allowed address answered in the driver"
    );
    assert_eq!(
        denied_by_workers(&pair),
        by_workers,
        "none reached the workers"
    );

    // Rules changed by SIGHUP are the driver's: the other address is now the denied one.
    rules(CLIENT_V4_ALLOWED);
    signal::kill(server.pid(), Signal::SIGHUP).unwrap();
    server.wait_for(
        "access rules reloaded: [deny 10.201.0.3/32",
        Duration::from_secs(5),
    );
    let (answered, denied) = (
        driver_count(&pair, "answered"),
        driver_count(&pair, "denied"),
    );
    assert_eq!(requests_from(&pair, CLIENT_V4_ALLOWED, SENT, 300), 0);
    assert_eq!(requests_from(&pair, CLIENT_V4, SENT, 2000), SENT);
    assert_eq!(driver_count(&pair, "denied") - denied, u64::from(SENT));
    assert_eq!(driver_count(&pair, "answered") - answered, u64::from(SENT));
    assert_eq!(
        denied_by_workers(&pair),
        by_workers,
        "none reached the workers"
    );
}

/// Sends `n` plain requests (poll 6) from the client's namespace to the server's IPv4 NTP port,
/// from one address and socket, in bursts of 25 with the replies read in between, then reads
/// replies until none has come for 300 ms: the plain replies and the KoD RATEs received. Every
/// reply must suggest poll `poll`.
fn flood_from_client(pair: &Pair, n: u64, poll: u8) -> (u64, u64) {
    common::within(&pair.client, move || {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        // Room for every reply at once: a frame passed up by the client's XDP program takes a
        // page of the receive buffer, and the default buffer holds about fifty.
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBufForce, &(8 << 20))
            .unwrap();
        let to: std::net::SocketAddr = format!("{SERVER_V4}:123").parse().unwrap();
        let (mut answered, mut kod) = (0, 0);
        let mut read = |sock: &std::net::UdpSocket| {
            let mut buf = [0u8; 64];
            while let Ok(48) = sock.recv(&mut buf) {
                assert_eq!(buf[2], poll, "the poll suggested: {buf:02x?}");
                if buf[1] == 0 && buf[12..16] == *b"RATE" {
                    assert_eq!(buf[0] >> 6, 3, "a KoD's leap: {buf:02x?}");
                    kod += 1;
                } else {
                    assert_eq!(buf[1], 3, "stratum: {buf:02x?}");
                    answered += 1;
                }
            }
        };
        sock.set_nonblocking(true).unwrap();
        for i in 0..n {
            let mut p = [0u8; 48];
            p[0] = 0x23;
            p[2] = 6;
            p[40..48].copy_from_slice(&(i + 1).to_be_bytes());
            sock.send_to(&p, to).unwrap();
            if i % 25 == 24 {
                read(&sock);
            }
        }
        sock.set_nonblocking(false).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        read(&sock);
        (answered, kod)
    })
}

/// With `--ratelimit` (burst 4, one response per 4096 s, leak 2, kod 1), one address that floods
/// chimed is treated in the driver as on the sockets: of its requests past the burst about 1/4
/// answered, 3/8 a KoD RATE, 3/8 dropped, on either path; the client receives what each path
/// counts; every reply suggests poll 12.
#[test]
fn a_flooding_address_is_rate_limited_in_the_driver_as_on_the_sockets() {
    const N: u64 = 400;
    const BURST: u64 = 4;
    assert_root();
    let pair = Pair::build("ratelimit");
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let _peer = client_xdp_program(&pair);
    let limits = [
        "--ratelimit",
        "--ratelimit-interval",
        "12",
        "--ratelimit-burst",
        "4",
        "--ratelimit-leak",
        "2",
        "--ratelimit-kod",
        "1",
    ];

    // On the sockets: what chimed counts at exit, and what the client received.
    let upstream = format!("127.0.0.1:{MIRROR_PORT}");
    let mut args = vec!["-s", &upstream, "-4", "1", "-a", "0.0.0.0:123"];
    args.extend_from_slice(&["--recv-buffer", "4194304"]);
    args.extend_from_slice(&limits);
    let mut sockets = Chimed::start_with_env(Some(&pair.server), &args, &[], "running:");
    sockets.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let (got, got_kod) = flood_from_client(&pair, N, 12);
    assert!(sockets.terminate().success());
    let totals = sockets.wait_for("ntp totals at exit", Duration::from_secs(2));
    let kod = count_in(&totals, "kod");
    let on_sockets = [
        count_in(&totals, "answered") - kod,
        kod,
        count_in(&totals, "dropped.rate_limited"),
    ];
    assert_eq!(count_in(&totals, "received"), N, "{totals}");
    assert_eq!([got, got_kod], on_sockets[..2], "received by the client");
    drop(sockets);

    // In the driver: its counts, and what the client received.
    let mut args = vec!["--xdp-in-driver", "--metrics-address", "127.0.0.1:9123"];
    args.extend_from_slice(&limits);
    let mut server = chimed(&pair, &args);
    server.wait_for("rate limiting in the driver too", Duration::from_secs(1));
    server.wait_for("answered in the driver", Duration::from_secs(1));
    let (got, got_kod) = flood_from_client(&pair, N, 12);
    let in_driver = ["answered", "kod", "rate_limited"].map(|o| driver_count(&pair, o));
    assert_eq!([got, got_kod], in_driver[..2], "received by the client");
    eprintln!(
        "answered, KoD, dropped of {N}: {on_sockets:?} on the sockets, {in_driver:?} in the \
         driver"
    );

    // Past the burst: binomial counts, within 6 standard deviations of their expectation, and
    // the two paths' within 5 of each other.
    let over = (N - BURST) as f64;
    for (i, (what, p)) in [("answered", 0.25), ("kod", 0.375), ("dropped", 0.375)]
        .into_iter()
        .enumerate()
    {
        let burst = if i == 0 { BURST as f64 } else { 0.0 };
        let (expect, sd) = (burst + over * p, (over * p * (1.0 - p)).sqrt());
        for (path, n) in [("sockets", on_sockets[i]), ("driver", in_driver[i])] {
            assert!(
                (n as f64 - expect).abs() < 6.0 * sd,
                "{what} on the {path}: {n}, expected {expect:.0} ± {:.0}",
                6.0 * sd
            );
        }
        let apart = (on_sockets[i] as f64 - in_driver[i] as f64).abs();
        assert!(
            apart < 5.0 * sd * 2f64.sqrt(),
            "{what}: {} on the sockets, {} in the driver",
            on_sockets[i],
            in_driver[i]
        );
    }
    assert_eq!(in_driver.iter().sum::<u64>(), N, "every request counted");
    server.terminate();
}

/// One plain v4 request from the client's namespace asking to upgrade to NTPv5 (reference
/// timestamp `NTP5DRFT`): the reply's reference timestamp, which echoes the mark where the server
/// speaks v5.
fn upgrade_reply_reference(pair: &Pair) -> [u8; 8] {
    common::within(&pair.client, || {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut p = [0u8; 48];
        p[0] = 0x23;
        p[16..24].copy_from_slice(b"NTP5DRFT");
        p[40..48].copy_from_slice(&0xe111_2222_3333_4444_u64.to_be_bytes());
        sock.send_to(&p, format!("{SERVER_V4}:123")).unwrap();
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf).expect("a reply to the upgrade request");
        assert_eq!(n, 48);
        buf[16..24].try_into().unwrap()
    })
}

/// With `--ntpv5` beside `--xdp-in-driver`, a plain v4 request is still answered in the driver,
/// while an NTPv5 request and a v4 request asking to upgrade go to the workers, which answer them
/// as on the sockets: the v5 reply from chime's v5 client, the upgrade mark echoed. `--leap-smear`
/// is on too: with no leap to smear it changes nothing the driver does.
#[test]
fn ntpv5_goes_to_the_workers_beside_the_driver() {
    assert_root();
    let pair = Pair::build("v5");
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let _peer = client_xdp_program(&pair);
    let args = [
        "--xdp-in-driver",
        "--ntpv5",
        "--leap-smear",
        "--metrics-address",
        "127.0.0.1:9123",
    ];
    let mut server = chimed(&pair, &args);
    server.wait_for("answered in the driver", Duration::from_secs(1));
    let count = |o| driver_count(&pair, o);
    let before = ["answered", "length", "upgrade"].map(count);

    let v4 = chime_ntp(&pair, SERVER_V4, &[]).expect("chime ntp");
    assert_eq!(v4["version"], 4, "{v4}");
    assert_eq!(
        count("answered"),
        before[0] + 1,
        "v4 answered in the driver"
    );

    let v5 = chime_ntp(&pair, SERVER_V4, &["--ntp-version", "5"]).expect("chime ntp v5");
    assert_eq!(v5["version"], 5, "{v5}");
    // Its draft's extension field makes it longer than a plain request.
    assert_eq!(count("length"), before[1] + 1, "v5 handed to the workers");

    assert_eq!(
        &upgrade_reply_reference(&pair),
        b"NTP5DRFT",
        "the mark echoed"
    );
    assert_eq!(
        count("upgrade"),
        before[2] + 1,
        "the upgrade request handed on"
    );
    assert_eq!(
        count("answered"),
        before[0] + 1,
        "nothing more answered in the driver"
    );

    server.terminate();
    let totals = server.wait_for("ntp totals at exit", Duration::from_secs(2));
    assert_eq!(count_in(&totals, "ntpv5"), 1, "{totals}");
}

/// In timezone-offset mode the program in the driver shifts the times it serves as the workers
/// do: chime's plain request, answered in the driver, and its NTS request, answered by the
/// workers, both see the zone's offset (Kolkata's, +5:30, which has no changes to straddle).
#[test]
fn the_zone_is_served_in_the_driver_as_by_the_workers() {
    const KOLKATA: f64 = 19_800.0;
    assert_root();
    let pair = Pair::build("tz");
    let _mirror = Chronyd::start_in(&pair.server, MIRROR_PORT);
    let _peer = client_xdp_program(&pair);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate_for(dir.path(), "xdp", &format!("IP:{SERVER_V4}"));
    let args = [
        "--xdp-in-driver",
        "--tz-offset",
        "--timezone",
        "Asia/Kolkata",
        "--metrics-address",
        "127.0.0.1:9123",
        "--nts-certificate",
        cert.to_str().unwrap(),
        "--nts-private-key",
        key.to_str().unwrap(),
        "--nts-ke-address",
        "0.0.0.0:4460",
    ];
    let mut server = chimed(&pair, &args);
    server.wait_for("answered in the driver", Duration::from_secs(1));
    let answered = driver_count(&pair, "answered");
    let plain = chime_ntp(&pair, SERVER_V4, &[]).expect("chime ntp");
    assert_eq!(
        driver_count(&pair, "answered"),
        answered + 1,
        "answered in the driver"
    );
    let ca = cert.to_str().unwrap();
    let nts = chime_ntp(&pair, SERVER_V4, &["--nts", "--nts-ca", ca]).expect("chime ntp --nts");
    assert_eq!(
        driver_count(&pair, "answered"),
        answered + 1,
        "NTS: the workers'"
    );
    for (path, r) in [("driver", &plain), ("workers", &nts)] {
        let offset = r["offset"].as_f64().unwrap();
        assert!(
            (offset - KOLKATA).abs() < 1e-3,
            "{path}: offset {offset} s, not Kolkata's {KOLKATA}: {r}"
        );
    }
    server.terminate();
}
