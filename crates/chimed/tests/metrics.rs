//! The metrics endpoint (`--metrics-address`) of a real chimed mirroring a real chronyd, read with
//! the Prometheus project's own text-format parser (prometheus-client, which `scripts/setup`
//! installs; `METRICS_PYTHON` points elsewhere), and poked with raw HTTP for what it must refuse.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    Chimed, Chronyd, chime_keygen, count_in, exchange, peer, roughtime_flags,
    roughtime_probe_request, run, unix_now,
};

const METRICS_PYTHON: &str = "/opt/chime-peers/metrics-venv/bin/python";

/// chimed serving NTP and Roughtime on loopback with the endpoint on, and where everything is.
struct Served {
    chimed: Chimed,
    chronyd: Chronyd,
    metrics: SocketAddr,
    ntp: SocketAddr,
    roughtime: SocketAddr,
    _key: common::RoughtimeKey,
}

fn serve(extra: &[&str]) -> Served {
    let key = chime_keygen();
    let chronyd = Chronyd::start();
    let mut args = vec!["--metrics-address", "127.0.0.1:0"];
    args.extend(roughtime_flags(key.file.to_str().unwrap()));
    args.extend_from_slice(extra);
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), &args);
    let roughtime = chimed.roughtime_addr();
    let metrics = chimed.logged_addr("metrics: http://");
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    Served {
        ntp: chimed.addr,
        chimed,
        chronyd,
        metrics,
        roughtime,
        _key: key,
    }
}

/// One scrape, parsed by prometheus-client.
fn scrape(metrics: SocketAddr) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/metrics_scrape.py");
    let out = run(Command::new(peer("METRICS_PYTHON", METRICS_PYTHON))
        .arg(script)
        .arg(format!("http://{metrics}/metrics")));
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "metrics_scrape.py printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success(),
        "prometheus-client rejected the page: {page}"
    );
    page
}

/// The value of the sample `name` whose labels include `labels`, if there is exactly one.
fn value(page: &serde_json::Value, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = page["samples"]
        .as_array()?
        .iter()
        .filter(|s| s["name"] == name)
        .filter(|s| labels.iter().all(|(k, v)| s["labels"][k] == *v))
        .filter_map(|s| s["value"].as_f64())
        .collect();
    match found[..] {
        [v] => Some(v),
        _ => None,
    }
}

/// Scrapes until `done` holds (workers publish after each batch, which may be a moment after
/// the client saw its reply), for up to `limit`; the last page either way.
fn scrape_until(
    metrics: SocketAddr,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let page = scrape(metrics);
        if done(&page) || Instant::now() > deadline {
            return page;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ntp_request(first_byte: u8, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[0] = first_byte;
    p
}

/// A sample's labels, as name and value.
type Labels = Vec<(&'static str, &'static str)>;

/// A worker's labels and one more: a drop's reason or a reply's version.
fn with(base: &[(&'static str, &'static str)], label: (&'static str, &'static str)) -> Labels {
    let mut l = base.to_vec();
    l.push(label);
    l
}

/// Sends what the counters are expected to have counted: NTPv4 client requests (LI 0, VN 4,
/// mode 3) are answered; mode 6 and a short packet are not; one Roughtime probe is answered and
/// a packet of zeros is not.
fn send_counted_traffic(s: &Served) {
    let wait = Duration::from_millis(300);
    for _ in 0..3 {
        assert!(exchange(s.ntp, &ntp_request(0x23, 48), Duration::from_secs(2)).is_some());
    }
    for _ in 0..2 {
        assert_eq!(exchange(s.ntp, &ntp_request(0x26, 48), wait), None);
    }
    assert_eq!(exchange(s.ntp, &ntp_request(0x23, 20), wait), None);
    assert!(
        exchange(
            s.roughtime,
            &roughtime_probe_request([7; 32]),
            Duration::from_secs(2)
        )
        .is_some()
    );
    assert_eq!(exchange(s.roughtime, &[0u8; 500], wait), None);
}

/// Each counter sample that traffic from `send_counted_traffic` must leave, with its value.
fn expected_counters() -> Vec<(&'static str, Labels, f64)> {
    let ntp = [("service", "ntp"), ("family", "ipv4"), ("thread", "0")];
    let rt = [
        ("service", "roughtime"),
        ("family", "ipv4"),
        ("thread", "0"),
    ];
    vec![
        ("chimed_requests_received_total", ntp.to_vec(), 6.0),
        ("chimed_replies_sent_total", ntp.to_vec(), 3.0),
        (
            "chimed_requests_dropped_total",
            with(&ntp, ("reason", "mode_control")),
            2.0,
        ),
        (
            "chimed_requests_dropped_total",
            with(&ntp, ("reason", "too_short")),
            1.0,
        ),
        (
            "chimed_requests_dropped_total",
            with(&ntp, ("reason", "mode_private")),
            0.0,
        ),
        ("chimed_send_errors_total", ntp.to_vec(), 0.0),
        ("chimed_kernel_receive_drops_total", ntp.to_vec(), 0.0),
        ("chimed_requests_shed_total", ntp.to_vec(), 0.0),
        // No NTS here: the NAK families are there, at zero, each reason its own series.
        ("chimed_nts_naks_total", ntp.to_vec(), 0.0),
        (
            "chimed_nts_nak_reasons_total",
            with(&ntp, ("reason", "unknown_key")),
            0.0,
        ),
        (
            "chimed_nts_nak_reasons_total",
            with(&ntp, ("reason", "forged")),
            0.0,
        ),
        ("chimed_requests_received_total", rt.to_vec(), 2.0),
        ("chimed_replies_sent_total", rt.to_vec(), 1.0),
        ("chimed_receive_batches_total", rt.to_vec(), 2.0),
        (
            "chimed_requests_dropped_total",
            with(&rt, ("reason", "too_short")),
            1.0,
        ),
        // The probe speaks RFC 10049: one reply in version 1, none in the others.
        (
            "chimed_roughtime_replies_total",
            with(&rt, ("version", "1")),
            1.0,
        ),
        (
            "chimed_roughtime_replies_total",
            with(&rt, ("version", "0x8000000c")),
            0.0,
        ),
        (
            "chimed_roughtime_replies_total",
            with(&rt, ("version", "google")),
            0.0,
        ),
        // No --roughtime-grease: the family is there, at zero.
        ("chimed_roughtime_greased_total", rt.to_vec(), 0.0),
    ]
}

/// The counter families are counters, and the upstream is chronyd as mirrored: stratum 3,
/// synchronised, a small root distance; the Roughtime key and start time are plausible, and the
/// page is OpenMetrics.
fn check_upstream_and_gauges(page: &serde_json::Value) {
    let kinds: Vec<_> = page["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "chimed_requests_received_total")
        .map(|s| s["type"].clone())
        .collect();
    assert!(kinds.iter().all(|k| k == "counter"), "{kinds:?}");
    // A service's own series carry its name, as its log lines' span does.
    let upstream = [("service", "upstream")];
    assert_eq!(value(page, "chimed_upstream_stratum", &upstream), Some(3.0));
    assert_eq!(value(page, "chimed_upstream_leap", &[]), Some(0.0));
    assert_eq!(value(page, "chimed_upstream_synchronised", &[]), Some(1.0));
    assert_eq!(value(page, "chimed_served_synchronised", &[]), Some(1.0));
    let distance = value(page, "chimed_served_root_distance_seconds", &[]).unwrap();
    assert!(distance > 0.0 && distance < 0.01, "{distance}");
    // chronyd -x serves the system clock here: the offset followed is within its bound, small.
    let offset = value(page, "chimed_served_offset_seconds", &upstream).unwrap();
    let error = value(page, "chimed_served_offset_error_seconds", &[]).unwrap();
    assert!(error > 0.0 && error < 0.005, "{error}");
    assert!(offset.abs() <= error + 100e-6, "{offset} beyond {error}");
    let rate = value(page, "chimed_served_offset_rate", &[]).unwrap();
    assert!(rate.abs() < 1e-3, "{rate}");
    let age = value(page, "chimed_upstream_last_reply_age_seconds", &[]).unwrap();
    assert!((0.0..3.0).contains(&age), "{age}");
    let now = unix_now();
    let keys = [("service", "roughtime-keys")];
    let not_before = value(
        page,
        "chimed_roughtime_online_key_not_before_seconds",
        &keys,
    )
    .unwrap();
    let not_after = value(page, "chimed_roughtime_online_key_not_after_seconds", &[]).unwrap();
    assert!(
        not_before < now && now + 86_400.0 < not_after,
        "{not_before} {not_after}"
    );
    let started = value(page, "chimed_start_time_seconds", &[]).unwrap();
    assert!((now - started).abs() < 60.0, "{started}");
    assert!(
        page["content_type"]
            .as_str()
            .is_some_and(|t| t.starts_with("application/openmetrics-text; version=1.0.0")),
        "{}",
        page["content_type"]
    );
}

#[test]
fn counters_and_upstream_follow_what_chimed_saw() {
    let s = serve(&[]);
    send_counted_traffic(&s);
    let expected = expected_counters();
    let matches = |page: &serde_json::Value| {
        expected
            .iter()
            .all(|(name, labels, v)| value(page, name, labels) == Some(*v))
    };
    let page = scrape_until(s.metrics, Duration::from_secs(3), matches);
    for (name, labels, v) in &expected {
        assert_eq!(value(&page, name, labels), Some(*v), "{name} {labels:?}");
    }
    check_upstream_and_gauges(&page);
}

/// Shedding under a standing queue shows in chimed_requests_shed_total, for NTP and Roughtime
/// alike: chimed stopped (SIGSTOP) while 40 requests of each wait 100 ms in its sockets, then
/// resumed with a 20 ms target and a zero interval, so that its first full batch finds a standing
/// queue. Every one of them is shed, received and not answered. The log's totals at exit, read
/// from the same counters, say what the metrics said.
#[test]
fn shed_requests_are_counted_for_both_services() {
    let mut s = serve(&[
        "--batch-size",
        "4",
        "--roughtime-batch-size",
        "4",
        "--roughtime-gather",
        "0",
        "--shed-target",
        "0.02",
        "--shed-interval",
        "0",
    ]);
    // Roughtime signs once the mirror is synchronised; an answered probe says it is.
    assert!(
        exchange(
            s.roughtime,
            &roughtime_probe_request([1; 32]),
            Duration::from_secs(2)
        )
        .is_some()
    );
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.chimed.pause();
    for i in 0..40u8 {
        sock.send_to(&ntp_request(0x23, 48), s.ntp).unwrap();
        sock.send_to(&roughtime_probe_request([i; 32]), s.roughtime)
            .unwrap();
    }
    // Not a wait for readiness: this is the stall under test, the time the requests queue.
    std::thread::sleep(Duration::from_millis(100));
    s.chimed.resume();
    let ntp = [("service", "ntp"), ("family", "ipv4"), ("thread", "0")];
    let rt = [
        ("service", "roughtime"),
        ("family", "ipv4"),
        ("thread", "0"),
    ];
    let expected = [
        ("chimed_requests_shed_total", &ntp, 40.0),
        ("chimed_requests_received_total", &ntp, 40.0),
        ("chimed_replies_sent_total", &ntp, 0.0),
        ("chimed_requests_shed_total", &rt, 40.0),
        ("chimed_requests_received_total", &rt, 41.0),
        ("chimed_replies_sent_total", &rt, 1.0),
    ];
    let matches = |page: &serde_json::Value| {
        expected
            .iter()
            .all(|(name, labels, v)| value(page, name, &labels[..]) == Some(*v))
    };
    let page = scrape_until(s.metrics, Duration::from_secs(3), matches);
    for (name, labels, v) in &expected {
        assert_eq!(
            value(&page, name, &labels[..]),
            Some(*v),
            "{name} {labels:?}"
        );
    }
    assert!(s.chimed.terminate().success());
    for (service, labels) in [("ntp", &ntp), ("roughtime", &rt)] {
        let totals =
            (s.chimed).wait_for(&format!("{service} totals at exit"), Duration::from_secs(1));
        for (key, name) in [
            ("received", "chimed_requests_received_total"),
            ("shed", "chimed_requests_shed_total"),
        ] {
            let metric = value(&page, name, &labels[..]);
            assert_eq!(
                Some(count_in(&totals, key) as f64),
                metric,
                "{key}: {totals}"
            );
        }
    }
}

#[test]
fn served_synchronised_turns_zero_when_chronyd_stops() {
    let mut s = serve(&["--stale-after", "2", "--poll-interval", "0.5"]);
    let page = scrape(s.metrics);
    assert_eq!(value(&page, "chimed_served_synchronised", &[]), Some(1.0));
    s.chronyd.stop();
    let page = scrape_until(s.metrics, Duration::from_secs(6), |p| {
        value(p, "chimed_served_synchronised", &[]) == Some(0.0)
    });
    assert_eq!(
        value(&page, "chimed_served_synchronised", &[]),
        Some(0.0),
        "still served as synchronised 6 s after chronyd stopped; log:\n{}",
        s.chimed.log()
    );
    // The mirrored state itself is still chronyd's last word; it is its age that ran out.
    assert_eq!(value(&page, "chimed_upstream_stratum", &[]), Some(3.0));
    let age = value(&page, "chimed_upstream_last_reply_age_seconds", &[]).unwrap();
    assert!(age >= 2.0, "{age}");
}

/// Sends `request` on a fresh connection and returns everything the endpoint answered.
fn http(metrics: SocketAddr, request: &[u8]) -> String {
    let mut c = TcpStream::connect(metrics).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The endpoint may answer and close before a long request is fully written.
    let _ = c.write_all(request);
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_endpoint_serves_get_and_head_of_metrics_only() {
    let s = serve(&[]);
    let m = s.metrics;
    // A client that connects and says nothing does not hold up the others.
    let _silent = TcpStream::connect(m).unwrap();

    let get = http(m, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{get}");
    assert!(get.contains("chimed_requests_received_total{"), "{get}");
    let head = http(m, b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
    let (head_head, head_body) = head.split_once("\r\n\r\n").unwrap();
    // An HTTP/1.0 request is answered in HTTP/1.0.
    assert!(head_head.starts_with("HTTP/1.0 200 OK"), "{head}");
    assert!(
        head_head.to_ascii_lowercase().contains("content-length: "),
        "{head}"
    );
    assert_eq!(head_body, "");

    for (request, status) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], "404"),
        (b"GET /metricsx HTTP/1.1\r\n\r\n", "404"),
        (
            b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            "405",
        ),
        (b"GET /metrics SPDY/3\r\n\r\n", "400"),
        (b"hello\r\n\r\n", "400"),
        // and then the client closes its side: nothing to answer, closed without a word
        (b"GET /metrics", ""),
    ] {
        let answer = if request.ends_with(b"\r\n\r\n") {
            http(m, request)
        } else {
            let mut c = TcpStream::connect(m).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.write_all(request).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            out
        };
        let expected = if status.is_empty() {
            String::new()
        } else {
            format!("HTTP/1.1 {status} ")
        };
        assert!(
            answer.starts_with(&expected) && (status.is_empty() == answer.is_empty()),
            "{:?} got {answer:?}",
            String::from_utf8_lossy(request)
        );
    }
    let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 9000));
    let answer = http(m, &huge);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}");
}

/// configs/prometheus-alerts.yml names only metrics, and drop reasons, that chimed serves.
#[test]
fn the_example_alert_rules_name_what_chimed_serves() {
    // With NTS on, so that its metrics are there too.
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = common::certificate(dir.path(), "server");
    let flags = common::nts_flags(&cert, &key);
    let s = serve(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let page = scrape(s.metrics);
    // The certificate's expiry as openssl reads it ("notAfter=Nov 24 00:43:41 2026 GMT").
    let out = run(Command::new("openssl")
        .args(["x509", "-enddate", "-noout", "-in"])
        .arg(&cert));
    let text = String::from_utf8_lossy(&out.stdout);
    let end = text.trim().trim_start_matches("notAfter=");
    let openssl = jiff::fmt::strtime::parse(
        "%b %d %H:%M:%S %Y GMT",
        end.split_whitespace().collect::<Vec<_>>().join(" "),
    )
    .and_then(|t| t.to_datetime())
    .and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC))
    .unwrap_or_else(|e| panic!("{end}: {e}"))
    .timestamp()
    .as_second();
    let expiry = "chimed_nts_certificate_not_after_seconds";
    let nts_ke = [("service", "nts-ke")];
    assert_eq!(value(&page, expiry, &nts_ke), Some(openssl as f64));
    // And a chimed serving Roughtime from a delegation bundle, whose end is a metric of its own.
    let long = chime_roughtime::LongTermKey::from_seed(&[3; 32]);
    let now = unix_now() as u64;
    let plan = chime_roughtime::BundlePlan {
        start_unix_s: now - 60,
        span_s: 86_400,
        step_s: 3600,
        window_s: 7200,
    };
    let bundle = chime_roughtime::make_bundle(&long, plan, || [4; 32]).unwrap();
    let file = dir.path().join("server.bundle");
    std::fs::write(&file, bundle.encode().as_bytes()).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut from_bundle = Chimed::mirroring(
        &s.chronyd.addr().to_string(),
        &[
            "--metrics-address",
            "127.0.0.1:0",
            "--roughtime-delegation",
            file.to_str().unwrap(),
            "--roughtime-ipv4-address",
            "127.0.0.1:0",
            "--roughtime-ipv6-threads",
            "0",
        ],
    );
    let bundle_page = scrape(from_bundle.logged_addr("metrics: http://"));
    let end = bundle.windows().last().unwrap().maxt_unix_s();
    assert_eq!(
        value(&bundle_page, "chimed_roughtime_delegation_end_seconds", &[]),
        Some(end as f64)
    );
    assert_eq!(
        value(&page, "chimed_roughtime_delegation_end_seconds", &[]),
        None,
        "no bundle, no bundle metric"
    );
    rules_name_what_is_served(&page, &bundle_page);
}

/// Every metric configs/prometheus-alerts.yml names is among the samples of `page` or
/// `bundle_page`, every drop reason it matches is one of `page`'s, and every reason it names
/// exactly is one of `page`'s NTS NAK or drop reasons.
fn rules_name_what_is_served(page: &serde_json::Value, bundle_page: &serde_json::Value) {
    let samples = page["samples"].as_array().unwrap();
    let names: std::collections::HashSet<&str> = samples
        .iter()
        .chain(bundle_page["samples"].as_array().unwrap())
        .filter_map(|s| s["name"].as_str())
        .collect();
    let reasons: std::collections::HashSet<&str> = samples
        .iter()
        .filter(|s| s["name"] == "chimed_requests_dropped_total")
        .filter_map(|s| s["labels"]["reason"].as_str())
        .collect();
    let rules = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/prometheus-alerts.yml"),
    )
    .unwrap();
    let mut named = 0;
    for token in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if token.starts_with("chimed_") {
            assert!(
                names.contains(token),
                "{token} is not a metric chimed serves"
            );
            named += 1;
        }
    }
    assert!(named >= 5, "{named}");
    let matched = rules
        .split("reason=~\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a reason matcher");
    for reason in matched.split('|') {
        assert!(reasons.contains(reason), "{reason} is not a drop reason");
    }
    // Each reason a rule names exactly is one chimed counts, an NTS NAK's or a drop's.
    let nak_reasons: std::collections::HashSet<&str> = samples
        .iter()
        .filter(|s| s["name"] == "chimed_nts_nak_reasons_total")
        .filter_map(|s| s["labels"]["reason"].as_str())
        .collect();
    let exact: Vec<&str> = rules
        .split("reason=\"")
        .skip(1)
        .filter_map(|r| r.split('"').next())
        .collect();
    assert!(!exact.is_empty(), "no exact reason matcher");
    for reason in exact {
        assert!(
            nak_reasons.contains(reason) || reasons.contains(reason),
            "{reason} is not a reason chimed counts"
        );
    }
}

/// The example alert rules pass Prometheus' own checker and their unit tests: each alert fires
/// when it must and not before (`promtool test rules`, synthetic series).
#[test]
fn the_example_alert_rules_pass_promtool() {
    let promtool = peer("PROMTOOL", "/usr/bin/promtool");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    for args in [
        ["check", "rules", "../../configs/prometheus-alerts.yml"],
        ["test", "rules", "tests/prometheus_alerts_test.yml"],
    ] {
        let out = run(Command::new(&promtool).current_dir(dir).args(args));
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `chimed_kernel_receive_drops_total` seen above zero: chimed stopped behind an 8 KiB receive
/// buffer while a burst of 300 requests overflows it. The socket's drop count is read every 64
/// batches, so 70 more requests go one at a time after the resume; then the metric holds every
/// request of the burst that got no reply, exactly.
#[test]
fn kernel_drops_reach_the_metrics() {
    let s = serve(&["-4", "1", "--recv-buffer", "8192"]);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    const BURST: u64 = 300;
    s.chimed.pause();
    for _ in 0..BURST {
        sock.send_to(&ntp_request(0x23, 48), s.ntp).unwrap();
    }
    s.chimed.resume();
    let mut answered = 0u64;
    let mut buf = [0u8; 128];
    while sock.recv_from(&mut buf).is_ok() {
        answered += 1;
    }
    for _ in 0..70 {
        let reply = exchange(s.ntp, &ntp_request(0x23, 48), Duration::from_secs(2));
        assert!(reply.is_some(), "chimed answers after the burst");
    }
    let ntp = [("service", "ntp"), ("family", "ipv4"), ("thread", "0")];
    let dropped = BURST - answered;
    assert!(dropped > 0, "an 8 KiB buffer held all {BURST}");
    let page = scrape_until(s.metrics, Duration::from_secs(3), |p| {
        value(p, "chimed_kernel_receive_drops_total", &ntp) == Some(dropped as f64)
    });
    assert_eq!(
        value(&page, "chimed_kernel_receive_drops_total", &ntp),
        Some(dropped as f64),
        "{answered} of {BURST} answered"
    );
}
