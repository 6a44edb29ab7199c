//! chimed serves the time of the chronyd it mirrors, not only its header. Behind a real chronyd
//! (`-x`: it never touches the clock) whose served time is away from the system clock, chimed's
//! replies agree with chronyd's: chronyd following an upstream 0.3 s ahead (its correction stays
//! in the time it serves, since it may not slew the clock), and chronyd smoothing a 50 ms step of
//! its upstream with `smoothtime`. The upstream is a stand-in in this process that serves the
//! system clock moved by an offset the test sets. Independent clients (chronyd -Q, ntpdig, ntpd-rs)
//! and chime ntp measure the same offset from chronyd and from chimed.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chime_ntp::{Header, Leap, NtpTimestamp, ServedClock};
use common::standin::{StandIn, ntp_now};
use common::{Chimed, ChronydClient, chronyd_client_offset, free_udp_port};

/// Where chronyd and chimed serve in the test that ntpdig measures them in: port 123, on loopback
/// addresses of their own.
const NTPDIG_CHRONYD: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), 123);
const NTPDIG_CHIMED: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 123);

/// A stand-in serving the system clock plus an offset, and the offset, which the test may change.
fn offset_stand_in(offset: f64) -> (StandIn, Arc<AtomicU64>) {
    let bits = Arc::new(AtomicU64::new(offset.to_bits()));
    let read = bits.clone();
    let stand_in = StandIn::start(move |now| {
        let clock = ServedClock {
            offset: f64::from_bits(read.load(Ordering::Relaxed)),
            ..ServedClock::LOCAL
        };
        (clock.serve(now), Leap::NoWarning)
    });
    (stand_in, bits)
}

/// A real chronyd (`-x`) serving NTP on loopback while it follows `upstream` every 1/16 s, with
/// `extra` directives; and the address it serves on.
fn chronyd_following(upstream: SocketAddr, extra: &[&str]) -> (ChronydClient, SocketAddr) {
    chronyd_following_at(upstream, ([127, 0, 0, 1], free_udp_port()).into(), extra)
}

/// [`chronyd_following`] serving on `at`.
fn chronyd_following_at(
    upstream: SocketAddr,
    at: SocketAddr,
    extra: &[&str],
) -> (ChronydClient, SocketAddr) {
    let mut directives = vec![
        format!("port {}", at.port()),
        format!("bindaddress {}", at.ip()),
        "allow 127.0.0.0/8".to_owned(),
        format!(
            "server 127.0.0.1 port {} minpoll -4 maxpoll -4 iburst",
            upstream.port()
        ),
    ];
    directives.extend(extra.iter().map(|d| (*d).to_owned()));
    let chronyd = ChronydClient::start(&directives);
    (chronyd, at)
}

/// ntpdig's offset of the NTP server at `ip`, port 123 (it asks no other): one sample, in JSON.
fn ntpdig_offset(ip: IpAddr) -> f64 {
    let out = common::run(Command::new("ntpdig").args(["-j", "-t", "2", &ip.to_string()]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ntpdig {ip}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("ntpdig's output is not JSON ({e}): {stdout}"));
    r["offset"]
        .as_f64()
        .unwrap_or_else(|| panic!("no offset in ntpdig's output: {stdout}"))
}

/// One NTP exchange with `server`, timed by the system clock around blocking calls: the offset
/// of its served time from the system clock and the round trip, seconds, and its stratum.
fn measure(socket: &UdpSocket, server: SocketAddr) -> Option<(f64, f64, u8)> {
    let mut request = [0u8; 48];
    let nonce = NtpTimestamp(rand_nonce());
    Header::request(4, chime_ntp::Mode::Client, nonce).encode(&mut request);
    let t1 = ntp_now();
    socket.send_to(&request, server).ok()?;
    let mut buf = [0u8; 256];
    loop {
        let (n, from) = socket.recv_from(&mut buf).ok()?;
        let t4 = ntp_now();
        let Ok(reply) = Header::parse(&buf[..n]) else {
            continue;
        };
        if from != server || reply.origin_ts != nonce {
            continue;
        }
        let offset = (reply.receive_ts.wrapping_diff_seconds(t1)
            + reply.transmit_ts.wrapping_diff_seconds(t4))
            / 2.0;
        let delay = t4.wrapping_diff_seconds(t1)
            - reply.transmit_ts.wrapping_diff_seconds(reply.receive_ts);
        return Some((offset, delay, reply.stratum));
    }
}

fn rand_nonce() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    d.as_nanos() as u64 ^ 0x5DEE_CE66_D1CE_4E5B
}

fn client() -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    socket
}

/// Waits (up to `limit`) until `server` answers at stratum 2 with an offset within 1 ms of
/// `offset`.
fn wait_serving(server: SocketAddr, offset: f64, limit: Duration) {
    let socket = client();
    let deadline = Instant::now() + limit;
    let mut last = None;
    while Instant::now() < deadline {
        last = measure(&socket, server);
        if let Some((o, _, 2)) = last
            && (o - offset).abs() < 1e-3
        {
            return;
        }
        thread::sleep(Duration::from_millis(200));
    }
    panic!("{server} did not serve {offset} s from the clock at stratum 2 in {limit:?}: {last:?}");
}

/// chimed minus chronyd: a pair of queries back to back (chronyd first, then chimed, and the
/// other way round every other pair, so that the order cannot bias the difference), the best of
/// five pairs by their round trips. The client reads the clock around blocking calls: a stall of
/// this shared machine in one exchange skews it by half the stall, which the round trip shows.
fn difference(socket: &UdpSocket, chronyd: SocketAddr, chimed: SocketAddr, i: usize) -> f64 {
    let pair = |k: usize| {
        let chronyd_first = (i + k).is_multiple_of(2);
        let order = if chronyd_first {
            [chronyd, chimed]
        } else {
            [chimed, chronyd]
        };
        let [a, b] = order.map(|server| measure(socket, server).expect("no reply"));
        let (from_chronyd, from_chimed) = if chronyd_first { (a, b) } else { (b, a) };
        (
            from_chimed.0 - from_chronyd.0,
            from_chimed.1 + from_chronyd.1,
        )
    };
    let best = (0..5).map(pair).min_by(|x, y| x.1.total_cmp(&y.1)).unwrap();
    best.0
}

/// ntpd-rs's offset of `server` (its status once it has a measurement; with one source it never
/// sets the clock).
fn ntpd_rs_offset(server: SocketAddr) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let source = format!("mode = \"server\"\naddress = \"{server}\"\n");
    let (status, _) = common::ntpd_rs(dir.path(), &source, |s, _| common::has_offset(s));
    let sources = status.split("Sources:").nth(1).unwrap_or("");
    sources
        .lines()
        .find_map(|l| l.trim().strip_prefix("Offset:"))
        .and_then(|o| o.trim().parse().ok())
        .unwrap_or_else(|| panic!("no offset in ntpd-rs's status:\n{status}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn behind_chronyd_x_following_an_upstream_ahead_chimed_serves_chronyds_time() {
    let (upstream, _) = offset_stand_in(0.3);
    // Both on port 123 (of addresses of their own), which is all ntpdig asks.
    let (_chronyd, chronyd) = chronyd_following_at(upstream.addr, NTPDIG_CHRONYD, &[]);
    wait_serving(chronyd, 0.3, Duration::from_secs(20));
    let mut chimed = Chimed::mirroring(
        &chronyd.to_string(),
        &["--stats-interval", "1", "-a", &NTPDIG_CHIMED.to_string()],
    );
    chimed.wait_for("synchronised: stratum 2", Duration::from_secs(10));
    // Three polls more, so that the offset has a rate.
    thread::sleep(Duration::from_secs(3));
    // The operator sees it: the upstream's stats line says what is served against the clock.
    let line = chimed.wait_for("upstream stats:", Duration::from_secs(2));
    let field = |key: &str| -> f64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            .parse()
            .unwrap()
    };
    assert!((field("offset") - 0.3).abs() < 1e-3, "{line}");
    assert!(field("offset_error") > 0.0, "{line}");

    let socket = client();
    let differences: Vec<f64> = (0..20)
        .map(|i| difference(&socket, chronyd, chimed.addr, i))
        .collect();
    let m = median(differences.clone());
    eprintln!("chimed - chronyd, 20 pairs: median {:+.1} us", m * 1e6);
    assert!(m.abs() < 100e-6, "median {m} s apart: {differences:?}");

    // Independent clients measure the same offset from both.
    let by_chronyd = [chronyd, chimed.addr].map(|a| chronyd_client_offset(a).unwrap());
    eprintln!(
        "chronyd -Q: chronyd {:+.6} s, chimed {:+.6} s",
        by_chronyd[0], by_chronyd[1]
    );
    // chronyd -Q prints how wrong the system clock is: by how much the server is ahead.
    for o in by_chronyd {
        assert!((o - 0.3).abs() < 1e-3, "chronyd -Q: {by_chronyd:?}");
    }
    assert!(
        (by_chronyd[0] - by_chronyd[1]).abs() < 200e-6,
        "{by_chronyd:?}"
    );
    for addr in [chronyd, chimed.addr] {
        common::assert_offset_near(&common::chime_ntp(addr).unwrap(), 0.3);
    }
    let by_ntpdig = [chronyd, chimed.addr].map(|a| ntpdig_offset(a.ip()));
    eprintln!(
        "ntpdig: chronyd {:+.6} s, chimed {:+.6} s",
        by_ntpdig[0], by_ntpdig[1]
    );
    for o in by_ntpdig {
        assert!((o - 0.3).abs() < 1e-3, "ntpdig: {by_ntpdig:?}");
    }
    let by_ntpd_rs = [chronyd, chimed.addr].map(ntpd_rs_offset);
    eprintln!(
        "ntpd-rs: chronyd {:+.6} s, chimed {:+.6} s",
        by_ntpd_rs[0], by_ntpd_rs[1]
    );
    for o in by_ntpd_rs {
        assert!((o - 0.3).abs() < 1e-3, "ntpd-rs: {by_ntpd_rs:?}");
    }
    chimed.wait_for("serves +0.300", Duration::from_secs(1));
}

#[test]
fn through_a_smoothtime_ramp_chimed_tracks_chronyd() {
    let (upstream, offset) = offset_stand_in(0.0);
    let (_chronyd, chronyd) = chronyd_following(upstream.addr, &["smoothtime 1000 100"]);
    wait_serving(chronyd, 0.0, Duration::from_secs(20));
    let mut chimed = Chimed::mirroring(&chronyd.to_string(), &[]);
    chimed.wait_for("synchronised: stratum 2", Duration::from_secs(10));
    thread::sleep(Duration::from_secs(3));

    // chronyd takes up the upstream's 50 ms step over about 50 s: served time ramps at up to
    // 1000 ppm, its rate changing by 100 ppm a second.
    offset.store(0.05f64.to_bits(), Ordering::Relaxed);
    let socket = client();
    let mut differences = Vec::new();
    let mut served = Vec::new();
    for i in 0..30 {
        thread::sleep(Duration::from_secs(2));
        differences.push(difference(&socket, chronyd, chimed.addr, i));
        served.push(measure(&socket, chronyd).unwrap().0);
    }
    eprintln!(
        "chronyd's served offset every 2 s: {:?} ms",
        served
            .iter()
            .map(|o| (o * 1e4).round() / 10.0)
            .collect::<Vec<_>>()
    );
    eprintln!(
        "chimed - chronyd: {:?} us",
        differences
            .iter()
            .map(|d| (d * 1e6).round())
            .collect::<Vec<_>>()
    );
    // The ramp happened: chronyd served time moved by most of the step within the samples.
    assert!(served[29] - served[0] > 0.03, "{served:?}");
    let worst = differences
        .iter()
        .copied()
        .map(f64::abs)
        .fold(0.0, f64::max);
    let m = median(differences.iter().copied().map(f64::abs).collect());
    assert!(m < 150e-6, "median {m}: {differences:?}");
    assert!(worst < 1e-3, "worst {worst}: {differences:?}");
}
