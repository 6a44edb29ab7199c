//! The daemon's lifecycle as systemd sees it (`Type=notify`): READY=1 only once every socket is
//! bound, WATCHDOG=1 while serving, RELOADING=1 and READY=1 around SIGHUP, STOPPING=1 on SIGTERM,
//! read from a real notify socket, by a chimed that has changed root (`--root`).

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::{Chimed, Chronyd, chime_ntp};
use nix::sys::signal::{self, Signal};

/// The next message chimed sent to the notify socket, within `limit`.
fn next(socket: &UnixDatagram, limit: Duration) -> Option<String> {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Waits up to `limit` for a message with `state` as one of its lines, skipping watchdog
/// keep-alives; panics on any other message, or none.
fn expect(socket: &UnixDatagram, state: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = next(socket, left.max(Duration::from_millis(1)))
            .unwrap_or_else(|| panic!("no {state} within {limit:?}"));
        if msg.lines().any(|l| l == state) {
            return msg;
        }
        assert_eq!(msg.trim(), "WATCHDOG=1", "waiting for {state}");
    }
}

#[test]
fn systemd_hears_ready_watchdog_reloading_and_stopping() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let upstream = chronyd.addr().to_string();
    // A fixed port, so that the first query needs nothing from the log, which may lag.
    let ntp: std::net::SocketAddr = ([127, 0, 0, 1], common::free_udp_port()).into();
    let ntp_arg = ntp.to_string();
    // Changed root, as with --root: systemd's socket is out of reach from there, so chimed must
    // have connected to it before.
    let root = tempfile::tempdir().unwrap();
    // A watchdog of 4 s: fed every 2 s, while each worker wakes at least once a second.
    let mut chimed = Chimed::start_with_env(
        None,
        &[
            "-s",
            &upstream,
            "-4",
            "2",
            "-6",
            "0",
            "-a",
            &ntp_arg,
            "-r",
            root.path().to_str().unwrap(),
        ],
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "4000000"),
        ],
        "running:",
    );

    // READY=1 is the first message, sent after the sockets were bound: the NTP port answers at
    // once (an NTPv4 client request; unsynchronised or not, it gets a reply).
    let first = next(&socket, Duration::from_secs(5)).expect("no message from chimed");
    assert_eq!(first.trim(), "READY=1");
    let mut request = [0u8; 48];
    request[0] = 0x23;
    assert!(
        common::exchange(ntp, &request, Duration::from_secs(1)).is_some(),
        "no reply once READY"
    );
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    chime_ntp(ntp).expect("served while running");

    expect(&socket, "WATCHDOG=1", Duration::from_secs(5));
    expect(&socket, "WATCHDOG=1", Duration::from_secs(5));

    signal::kill(chimed.pid(), Signal::SIGHUP).unwrap();
    let reloading = expect(&socket, "RELOADING=1", Duration::from_secs(5));
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    expect(&socket, "READY=1", Duration::from_secs(5));

    // Every worker moved between any two feeds, the first (at once, before they could) skipped.
    assert!(!chimed.log().contains("has not moved"), "{}", chimed.log());

    signal::kill(chimed.pid(), Signal::SIGTERM).unwrap();
    expect(&socket, "STOPPING=1", Duration::from_secs(5));
    assert!(chimed.terminate().success(), "{}", chimed.log());
}

/// The watchdog watches the NTS-KE threads too: one held still for its first 5 s (its fail
/// point set to sleep, which blocks its thread and so its runtime) starves it, and it is fed again
/// once the thread moves.
#[cfg(feature = "failpoints")]
#[test]
fn a_stalled_nts_ke_thread_starves_the_watchdog() {
    a_stalled_thread_starves_the_watchdog("nts-ke");
}

/// And the Roughtime-over-TCP thread, the same way.
#[cfg(feature = "failpoints")]
#[test]
fn a_stalled_roughtime_tcp_thread_starves_the_watchdog() {
    a_stalled_thread_starves_the_watchdog("roughtime-tcp");
}

/// chimed with NTS-KE and Roughtime over TCP, the thread of fail point `point` asleep for 5 s
/// from its start, and a watchdog of 4 s (fed every 2 s): the feeds 2 s and 4 s after READY=1
/// find that thread still, so none is sent and the log says why; those after, once it wakes, are.
#[cfg(feature = "failpoints")]
fn a_stalled_thread_starves_the_watchdog(point: &str) {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let (cert, key) = common::certificate(dir.path(), "nts");
    let rt = common::chime_keygen();
    let upstream = chronyd.addr().to_string();
    let nts = common::nts_flags(&cert, &key);
    let mut args = vec!["-s", &upstream, "-4", "1", "-6", "0", "-a", "127.0.0.1:0"];
    args.extend(nts.iter().map(String::as_str));
    args.extend(common::roughtime_flags(rt.file.to_str().unwrap()));
    let failpoints = format!("{point}=sleep(5000)");
    let mut chimed = Chimed::start_with_env(
        None,
        &args,
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "4000000"),
            ("FAILPOINTS", &failpoints),
        ],
        "running:",
    );
    let first = next(&socket, Duration::from_secs(5)).expect("no message from chimed");
    assert_eq!(first.trim(), "READY=1");
    let starved = next(&socket, Duration::from_millis(4500));
    assert_eq!(starved, None, "{point} asleep, yet:\n{}", chimed.log());
    expect(&socket, "WATCHDOG=1", Duration::from_secs(3));
    expect(&socket, "WATCHDOG=1", Duration::from_secs(3));
    assert!(
        chimed
            .log()
            .contains("watchdog: a serving thread has not moved"),
        "{}",
        chimed.log()
    );
    signal::kill(chimed.pid(), Signal::SIGTERM).unwrap();
    expect(&socket, "STOPPING=1", Duration::from_secs(5));
    assert!(chimed.terminate().success(), "{}", chimed.log());
}
