//! chimed's Roughtime service against real processes: a real chronyd to mirror, `chime keygen`
//! for the key and `chime roughtime` (which verifies every signature and path) as the client.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

use chime_roughtime::{VerifyPolicy, Version, build_request, verify_reply};
use common::{Chimed, Chronyd, RoughtimeKey, chime_keygen, chime_ntp, exchange, workspace_bin};

struct Server {
    _chronyd: Option<Chronyd>,
    chimed: Chimed,
    roughtime: SocketAddr,
    public_key: String,
    _key: RoughtimeKey,
}

fn serve(upstream_alive: bool, extra: &[&str]) -> Server {
    let key = chime_keygen();
    let (chronyd, upstream) = if upstream_alive {
        let c = Chronyd::start();
        let a = c.addr().to_string();
        (Some(c), a)
    } else {
        (None, format!("127.0.0.1:{}", common::free_udp_port()))
    };
    let mut args = common::roughtime_flags(key.file.to_str().unwrap()).to_vec();
    args.extend_from_slice(extra);
    let mut chimed = Chimed::mirroring(&upstream, &args);
    let roughtime = chimed.roughtime_addr();
    let logged = chimed.wait_for("roughtime public key (base64): ", Duration::from_secs(1));
    assert!(
        logged.contains(&key.public_base64),
        "chimed logs the key it serves: {logged}"
    );
    let hashing = chimed.wait_for("roughtime: Merkle hashing on", Duration::from_secs(1));
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") {
        assert!(hashing.contains("AVX-512, eight"), "{hashing}");
    }
    if upstream_alive {
        chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    }
    Server {
        _chronyd: chronyd,
        chimed,
        roughtime,
        public_key: key.public_base64.clone(),
        _key: key,
    }
}

fn chime_roughtime(s: &Server, extra: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(workspace_bin("chime"))
        .args([
            "roughtime",
            "--json",
            "--timeout",
            "1",
            "--public-key",
            &s.public_key,
        ])
        .args(extra)
        .arg(s.roughtime.to_string())
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

#[test]
fn every_version_verifies_with_chime_roughtime() {
    let s = serve(true, &[]);
    for (flag, name) in [
        ("1", "RFC 10049"),
        ("0x8000000c", "0x8000000c"),
        ("0x8000000b", "0x8000000b"),
        ("0x8000000a", "0x8000000a"),
        ("0x80000009", "0x80000009"),
        ("0x80000008", "0x80000008"),
        ("google", "Google"),
    ] {
        let r = chime_roughtime(&s, &["--version", flag]).unwrap_or_else(|e| panic!("{flag}: {e}"));
        assert!(r["version"].as_str().unwrap().contains(name), "{flag}: {r}");
        let mid = r["midpoint_unix_us"].as_i64().unwrap();
        let radius = r["radius_us"].as_i64().unwrap();
        assert!(
            (mid - now_us()).abs() < radius + 2_000_000,
            "{flag}: midpoint {mid}"
        );
        assert!((1..=3_000_000).contains(&radius), "{flag}: radius {radius}");
        assert_eq!(r["spelling_conforms"], true);
    }
    // With no --version the client offers 1 and 0x8000000c and the server picks the best.
    assert!(
        chime_roughtime(&s, &[]).unwrap()["version"]
            .as_str()
            .unwrap()
            .contains("10049")
    );
}

#[test]
fn a_burst_is_answered_and_every_reply_verifies() {
    let s = serve(true, &[]);
    let key: [u8; 32] = base64_decode(&s.public_key);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut requests = Vec::new();
    for i in 0..48u8 {
        let mut req = vec![0u8; 1024];
        let n = build_request(&mut req, &[Version::Rfc10049], &[i; 32], None).unwrap();
        req.truncate(n);
        requests.push(req);
    }
    for r in &requests {
        sock.send_to(r, s.roughtime).unwrap();
    }
    let policy = VerifyPolicy::new(10_000_000);
    let mut buf = [0u8; 2048];
    for _ in 0..requests.len() {
        let (n, _) = sock.recv_from(&mut buf).expect("a reply for every request");
        assert!(n <= 1024, "reply larger than its request: {n}");
        // The nonce is the first byte repeated: find the request it answers.
        let verified = requests
            .iter()
            .find_map(|req| verify_reply(req, &buf[..n], &key, &policy).ok())
            .expect("every reply verifies against one of the requests");
        assert_eq!(verified.version, Version::Rfc10049);
    }
}

/// `--roughtime-gather`: a lone request is still answered at once; a burst is gathered into
/// fewer, larger batches (one signature each), and every reply verifies.
#[test]
fn gathering_batches_a_burst_and_never_holds_a_lone_request() {
    const GATHER: Duration = Duration::from_millis(100);
    let mut s = serve(true, &["--roughtime-gather", "0.1"]);
    s.chimed
        .wait_for("gathered for 100000 µs", Duration::from_secs(1));
    let key: [u8; 32] = base64_decode(&s.public_key);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = |i: u8| {
        let mut req = vec![0u8; 1024];
        let n = build_request(&mut req, &[Version::Rfc10049], &[i; 32], None).unwrap();
        req.truncate(n);
        req
    };
    let mut buf = [0u8; 2048];

    let lone = request(200);
    let sent = std::time::Instant::now();
    sock.send_to(&lone, s.roughtime).unwrap();
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    let took = sent.elapsed();
    assert!(took < GATHER / 2, "a lone request took {took:?}");
    let policy = VerifyPolicy::new(10_000_000);
    verify_reply(&lone, &buf[..n], &key, &policy).unwrap();

    // Six groups of eight, 10 ms apart: answered at once, that is six batches or more; gathered,
    // the first group waits 100 ms and the other five join it. chimed is stopped while the first
    // group is sent, so that its worker takes the eight in one receive however busy the machine
    // (a receive of one is never held back, and a loaded machine could otherwise deliver them
    // one at a time).
    const BURST: u8 = 48;
    let requests: Vec<Vec<u8>> = (0..BURST).map(request).collect();
    for (i, group) in requests.chunks(8).enumerate() {
        if i == 0 {
            s.chimed.pause();
        }
        for r in group {
            sock.send_to(r, s.roughtime).unwrap();
        }
        if i == 0 {
            s.chimed.resume();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..BURST {
        let (n, _) = sock.recv_from(&mut buf).expect("a reply for every request");
        requests
            .iter()
            .find_map(|req| verify_reply(req, &buf[..n], &key, &policy).ok())
            .expect("every reply verifies against one of the requests");
    }
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    let batches: u64 = totals
        .split("batches=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no batches= in {totals}"));
    // The lone request is one batch; the six groups one or two more, and one of a single request
    // if the worker woke for the first of a group before the second arrived. Answered at once,
    // they would be seven or more.
    assert!(
        totals.contains(&format!("received={}", u64::from(BURST) + 1)),
        "{totals}"
    );
    assert!((2..=4).contains(&batches), "{totals}");
}

/// A client socket on 127.0.0.1 with a 4 MiB receive buffer. One batch of 256 replies (~900 bytes
/// each) takes ~590 KB of socket buffer, more than the kernel's usual 208 KiB default: a client
/// reading replies one at a time lost some of a burst's with the default.
fn roomy_client_socket() -> UdpSocket {
    use nix::sys::socket::{setsockopt, sockopt::RcvBufForce};
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    // SO_RCVBUFFORCE: past net.core.rmem_max, which is 208 KiB on a fresh machine. The tests run
    // as root, which may.
    setsockopt(&sock, RcvBufForce, &(4 << 20)).expect("SO_RCVBUFFORCE (run as root)");
    sock
}

/// A queue of 200 requests is taken in one receive and signed once: one tree of 256 leaves (so
/// paths of eight hashes), one signature in every reply, every reply verified. With
/// `--roughtime-batch-size 64` the same queue takes four signatures.
#[test]
fn a_queue_is_one_tree_up_to_the_roughtime_batch_size() {
    const QUEUED: usize = 200;
    for (flags, signatures) in [(&[][..], 1), (&["--roughtime-batch-size", "64"][..], 4)] {
        let mut args = vec!["--roughtime-gather", "0"];
        args.extend_from_slice(flags);
        let s = serve(true, &args);
        let key: [u8; 32] = base64_decode(&s.public_key);
        let sock = roomy_client_socket();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut by_nonce = std::collections::HashMap::new();
        let requests: Vec<Vec<u8>> = (0..QUEUED)
            .map(|i| {
                let mut nonce = [0xa5; 32];
                nonce[..8].copy_from_slice(&(i as u64).to_le_bytes());
                by_nonce.insert(nonce, i);
                let mut req = vec![0u8; 1024];
                let n = build_request(&mut req, &[Version::Rfc10049], &nonce, None).unwrap();
                req.truncate(n);
                req
            })
            .collect();
        // Stopped while they are sent, so that the worker finds all of them queued.
        s.chimed.pause();
        for r in &requests {
            sock.send_to(r, s.roughtime).unwrap();
        }
        s.chimed.resume();
        let policy = VerifyPolicy::new(10_000_000);
        let mut sigs = std::collections::HashSet::new();
        let mut deepest = 0;
        let mut buf = [0u8; 2048];
        for _ in 0..QUEUED {
            let (n, _) = sock.recv_from(&mut buf).expect("a reply for every request");
            let reply = &buf[..n];
            assert!(n <= 1024, "reply larger than its request");
            let parsed = chime_roughtime::Reply::parse(reply).unwrap();
            let i = parsed
                .nonce
                .and_then(|n| by_nonce.get(n))
                .copied()
                .expect("a reply names one of our nonces");
            verify_reply(&requests[i], reply, &key, &policy).expect("verifies");
            sigs.insert(*parsed.signature);
            deepest = deepest.max(parsed.path.len() / 32);
        }
        assert_eq!(sigs.len(), signatures, "{flags:?}");
        let depth = if signatures == 1 { 8 } else { 6 };
        assert_eq!(deepest, depth, "{flags:?}: hashes in the longest PATH");
    }
}

/// A burst far larger than the kernel's default receive buffer holds (1000 requests of 1 KiB take
/// ~2.3 MB of socket buffer against the usual 208 KiB): chimed's own 16 MiB default for Roughtime
/// sockets absorbs it, and every reply verifies. As root (CI) chimed gets the buffer whatever
/// net.core.rmem_max says, and the kernel counts twice what was asked for.
///
/// The tests run the debug build beside a dozen others on two cores, where 1000 signed requests
/// can take longer than the default --shed-interval (100 ms) to drain: to shedding that is a
/// standing queue (a release build drains them in a few milliseconds). A 2 s interval keeps this
/// a test of the buffer.
#[test]
fn a_burst_beyond_the_kernel_default_buffer_is_absorbed() {
    const BURST: usize = 1000;
    let mut s = serve(true, &["--shed-interval", "2"]);
    let listening = s
        .chimed
        .wait_for("roughtime listening on", Duration::from_secs(1));
    assert!(
        listening.contains(&format!("receive buffer {} bytes", 32 << 20)),
        "{listening}"
    );
    let key: [u8; 32] = base64_decode(&s.public_key);
    let mut requests = Vec::new();
    let mut by_nonce = std::collections::HashMap::new();
    for i in 0..BURST {
        let mut nonce = [0x5a; 32];
        nonce[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let mut req = vec![0u8; 1024];
        let n = build_request(&mut req, &[Version::Rfc10049], &nonce, None).unwrap();
        req.truncate(n);
        by_nonce.insert(nonce, i);
        requests.push(req);
    }
    let sock = roomy_client_socket();
    sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    // Replies are read as they come, and the client's buffer holds a whole batch of them, so only
    // the server's buffer is put to the test.
    let reader = {
        let sock = sock.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut replies = Vec::new();
            let mut buf = [0u8; 2048];
            while let Ok((n, _)) = sock.recv_from(&mut buf) {
                replies.push(buf[..n].to_vec());
                if replies.len() == BURST {
                    break;
                }
            }
            replies
        })
    };
    for r in &requests {
        sock.send_to(r, s.roughtime).unwrap();
    }
    let replies = reader.join().unwrap();
    assert_eq!(
        replies.len(),
        BURST,
        "replies to a burst of {BURST}; {listening}"
    );
    let policy = VerifyPolicy::new(10_000_000);
    let mut seen = vec![false; BURST];
    for reply in &replies {
        assert!(reply.len() <= 1024, "reply larger than its request");
        // The reply carries its request's nonce: find it among the bytes.
        let i = reply
            .windows(32)
            .find_map(|w| by_nonce.get(w).copied())
            .expect("a reply names one of our nonces");
        verify_reply(&requests[i], reply, &key, &policy).expect("verifies");
        assert!(
            !std::mem::replace(&mut seen[i], true),
            "one reply per request"
        );
    }
}

/// Sends `count` RFC 10049 requests in a burst and returns, per reply, whether it verified
/// (`Err` with the reason if not); every reply must answer one of the requests by its nonce and
/// be no larger than it.
fn burst_outcomes(s: &Server, count: u8) -> Vec<Result<(), String>> {
    let key: [u8; 32] = base64_decode(&s.public_key);
    let sock = roomy_client_socket();
    let mut requests = Vec::new();
    for i in 0..count {
        let mut req = vec![0u8; 1024];
        let n = build_request(&mut req, &[Version::Rfc10049], &[i; 32], None).unwrap();
        req.truncate(n);
        sock.send_to(&req, s.roughtime).unwrap();
        requests.push(req);
    }
    let policy = VerifyPolicy::new(10_000_000);
    let mut buf = [0u8; 2048];
    (0..count)
        .map(|_| {
            let (n, _) = sock.recv_from(&mut buf).expect("a reply for every request");
            assert!(n <= 1024, "reply larger than its request: {n}");
            let reply = chime_roughtime::Reply::parse(&buf[..n]).expect("a reply that parses");
            // A greased nonce names no request; the request is then the one whose nonce is
            // one bit away.
            let request = requests
                .iter()
                .min_by_key(|r| {
                    let nonce = chime_roughtime::Request::parse(r).unwrap().nonce;
                    let theirs = reply.nonce.unwrap_or_default();
                    nonce
                        .iter()
                        .zip(theirs)
                        .map(|(a, b)| (a ^ b).count_ones())
                        .sum::<u32>()
                })
                .unwrap();
            verify_reply(request, &buf[..n], &key, &policy)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// `--roughtime-grease`: at a share of 1 every reply is deliberately invalid, in several ways,
/// each caught by the verifier and by `chime roughtime` in every version, none larger than its
/// request, all counted; at a share of 0.5 some replies are and some are not.
#[test]
fn greased_replies_fail_verification_and_are_counted() {
    let mut s = serve(true, &["--roughtime-grease", "1"]);
    s.chimed.wait_for(
        "of replies are deliberately invalid",
        Duration::from_secs(1),
    );
    let outcomes = burst_outcomes(&s, 48);
    let reasons: std::collections::BTreeSet<String> = outcomes
        .iter()
        .map(|o| {
            let e = o.as_ref().expect_err("every reply greased");
            e.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
        })
        .collect();
    assert!(reasons.len() >= 4, "several kinds of grease: {reasons:?}");
    for version in ["1", "0x8000000c", "0x80000008", "google"] {
        let e = chime_roughtime(&s, &["--version", version]).expect_err(version);
        assert!(
            !e.trim().is_empty() && e.lines().count() <= 2,
            "{version}: {e}"
        );
    }
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    assert!(totals.contains("greased=52"), "{totals}");

    let s = serve(true, &["--roughtime-grease", "0.5"]);
    let greased = burst_outcomes(&s, 64).iter().filter(|o| o.is_err()).count();
    assert!(
        (10..=54).contains(&greased),
        "{greased} of 64 greased at 0.5"
    );

    // Only the kinds asked for, and only where they apply: Google's replies carry no nonce.
    let s = serve(
        true,
        &[
            "--roughtime-grease",
            "1",
            "--roughtime-grease-kinds",
            "nonce",
        ],
    );
    let e = chime_roughtime(&s, &["--version", "1"]).expect_err("a greased nonce");
    assert!(e.contains("NONC is not the request's nonce"), "{e}");
    chime_roughtime(&s, &["--version", "google"]).expect("Google's replies are not greased");
}

#[test]
fn short_and_garbage_requests_get_nothing_and_are_counted() {
    let mut s = serve(true, &[]);
    let mut short = vec![0u8; 1024];
    let n = build_request(&mut short, &[Version::Rfc10049], &[1; 32], None).unwrap();
    short.truncate(n);
    short.truncate(1000); // framing now lies, and it is under 1024 bytes
    let wait = Duration::from_millis(300);
    assert_eq!(exchange(s.roughtime, &short, wait), None);
    assert_eq!(exchange(s.roughtime, &[0u8; 1200], wait), None);
    assert_eq!(exchange(s.roughtime, b"ROUGHTIM", wait), None);
    // The service still answers good requests.
    chime_roughtime(&s, &[]).unwrap();
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    for field in [
        "received=4",
        "batches=4",
        "answered=1",
        "dropped=3",
        "dropped.too_short=2",
    ] {
        assert!(totals.contains(field), "{field}: {totals}");
    }
}

#[test]
fn no_signature_while_upstream_is_unsynchronised() {
    let mut s = serve(false, &[]);
    let err = chime_roughtime(&s, &[]).unwrap_err();
    assert!(err.contains("no reply"), "{err}");
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    assert!(
        totals.contains("dropped.upstream_unsynchronised=1"),
        "{totals}"
    );
}

#[test]
fn online_keys_rotate_without_restart_and_certificates_stay_valid() {
    let mut s = serve(true, &["--roughtime-rotation", "1"]);
    let first = chime_roughtime(&s, &[]).unwrap();
    // Rotations come every second; one may already have passed before the first query (the
    // start waits for chronyd), so wait for the key the replies carry to change, not for a log
    // line. Bounded at 5 s, five rotations.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let second = loop {
        let r = chime_roughtime(&s, &[]).unwrap();
        if r["online_key"] != first["online_key"] || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(
        first["online_key"], second["online_key"],
        "the online key changed"
    );
    s.chimed
        .wait_for("roughtime: rotated to", Duration::from_secs(1));
    for r in [&first, &second] {
        let mid = r["midpoint_unix_us"].as_i64().unwrap();
        let (mint, maxt) = (
            r["mint_unix_us"].as_i64().unwrap(),
            r["maxt_unix_us"].as_i64().unwrap(),
        );
        assert!(
            mint <= mid && mid < maxt,
            "the certificate covers the signed time: {r}"
        );
    }
    // Valid for two rotation intervals, replaced after one: the old and new keys overlap, so
    // there is no instant without a valid certificate.
    assert!(first["maxt_unix_us"].as_i64() > second["mint_unix_us"].as_i64());
}

#[test]
fn roughtime_is_true_utc_in_timezone_offset_mode() {
    let s = serve(true, &["--tz-offset", "--timezone", "Asia/Kolkata"]);
    let ntp = chime_ntp(s.chimed.addr).unwrap();
    common::assert_offset_near(&ntp, 19_800.0);
    let rt = chime_roughtime(&s, &[]).unwrap();
    let mid = rt["midpoint_unix_us"].as_i64().unwrap();
    assert!(
        (mid - now_us()).abs() < 4_000_000,
        "Roughtime must be UTC: {rt}"
    );
}

#[test]
fn key_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let key = chime_keygen();
    let key = key.file.clone();
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chimed"))
        .args(["--roughtime-key", key.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("roughtime.key") && err.contains("0640"),
        "{err}"
    );

    // keygen never overwrites.
    let out = Command::new(workspace_bin("chime"))
        .arg("keygen")
        .arg(&key)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("never overwritten"));
}

fn base64_decode(s: &str) -> [u8; 32] {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap()
        .try_into()
        .unwrap()
}

#[test]
fn chime_perf_roughtime_at_a_modest_rate_verifies_every_reply() {
    let s = serve(true, &[]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("perf.json");
    for version in ["1", "0x8000000c"] {
        let out = Command::new(workspace_bin("chime"))
            .args(["perf", "roughtime", "--target", &s.roughtime.to_string()])
            .args([
                "--public-key",
                &s.public_key,
                "--version",
                version,
                "--verify-every",
                "1",
            ])
            .args([
                "--rate",
                "500",
                "--duration",
                "1",
                "--warmup",
                "0.2",
                "--json",
            ])
            .arg(&json)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let step = &v["steps"][0];
        assert_eq!(step["sent"], 500, "{step:#}");
        assert_eq!(step["answered"], 500, "{step:#}");
        assert_eq!(step["invalid"], 0, "{step:#}");
        assert_eq!(step["lost"], 0, "{step:#}");
    }
}

#[test]
fn roughtime_over_ipv6_loopback() {
    let chronyd = Chronyd::start();
    let key = chime_keygen();
    let upstream = chronyd.addr().to_string();
    let mut chimed = Chimed::mirroring(
        &upstream,
        &[
            "--roughtime-key",
            key.file.to_str().unwrap(),
            "--roughtime-ipv4-threads",
            "0",
            "--roughtime-ipv6-threads",
            "1",
            "--roughtime-ipv6-address",
            "[::1]:0",
        ],
    );
    let addr = chimed.roughtime_addr();
    assert!(addr.is_ipv6(), "{addr}");
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let out = Command::new(workspace_bin("chime"))
        .args(["roughtime", "--json", "--public-key", &key.public_base64])
        .arg(addr.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        (r["midpoint_unix_us"].as_i64().unwrap() - now_us()).abs() < 4_000_000,
        "{r}"
    );
}

/// A client `--deny` refuses gets no Roughtime reply either, and is counted.
#[test]
fn a_denied_client_gets_no_roughtime_reply() {
    let mut s = serve(true, &["--deny", "127.0.0.1/32"]);
    let probe = common::roughtime_probe_request([3; 32]);
    assert_eq!(
        exchange(s.roughtime, &probe, Duration::from_millis(300)),
        None
    );
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    assert!(totals.contains("dropped.denied=1"), "{totals}");
}

/// Roughtime with the long-term key offline (`--roughtime-delegation`): `chime delegate` makes a
/// bundle from the long-term key, and chimed, given only the bundle, answers with replies that
/// `chime roughtime` verifies under the long-term public key, signed by the bundle's window for
/// now; a new bundle is read on SIGHUP, a broken one refused. A bundle whose windows have all
/// closed signs nothing: requests are dropped and counted.
#[test]
fn a_delegation_bundle_serves_without_the_long_term_key() {
    let key = chime_keygen();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("server.bundle");
    common::chime_delegate(&key.file, &bundle, &["--days", "2"]);
    let chronyd = Chronyd::start();
    let flags = |file: &std::path::Path| {
        common::roughtime_flags_for("--roughtime-delegation", file.to_str().unwrap())
            .map(str::to_owned)
    };
    let args = flags(&bundle);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), &args);
    let roughtime = chimed.roughtime_addr();
    let logged = chimed.wait_for("roughtime public key (base64): ", Duration::from_secs(1));
    assert!(
        logged.contains(&key.public_base64) && logged.contains("server.bundle"),
        "{logged}"
    );
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let s = Server {
        _chronyd: None,
        chimed,
        roughtime,
        public_key: key.public_base64.clone(),
        _key: key,
    };
    let r = chime_roughtime(&s, &[]).expect("chime roughtime verified nothing");
    let parsed =
        chime_roughtime::Bundle::parse(&std::fs::read_to_string(&bundle).unwrap()).unwrap();
    let now = now_us() as u64 / 1_000_000;
    let window = parsed.current(now).unwrap();
    assert_eq!(
        r["online_key"],
        base64_encode(&window.online_public_key()),
        "signed by the bundle's current window: {r}"
    );

    // A new bundle for the same server, put in place and read on SIGHUP: the replies move to
    // its window at once. One that does not verify is refused and the one in force kept.
    let next = dir.path().join("next.bundle");
    common::chime_delegate(&s._key.file, &next, &["--days", "3"]);
    std::fs::rename(&next, &bundle).unwrap();
    let mut s = s;
    nix::sys::signal::kill(s.chimed.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    s.chimed
        .wait_for("SIGHUP: delegation bundle reloaded", Duration::from_secs(5));
    let reloaded = chime_roughtime::Bundle::parse(&std::fs::read_to_string(&bundle).unwrap())
        .unwrap()
        .current(now)
        .unwrap()
        .online_public_key();
    let r = chime_roughtime(&s, &[]).expect("chime roughtime verified nothing after SIGHUP");
    assert_eq!(r["online_key"], base64_encode(&reloaded), "{r}");
    std::fs::write(&bundle, "frob\n").unwrap();
    nix::sys::signal::kill(s.chimed.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    s.chimed
        .wait_for("SIGHUP: delegation bundle: ", Duration::from_secs(5));
    let r = chime_roughtime(&s, &[]).expect("a broken bundle file stopped the signing");
    assert_eq!(r["online_key"], base64_encode(&reloaded), "{r}");
    drop(s);

    // A bundle made an hour ago whose windows closed half an hour ago.
    let long = chime_roughtime::LongTermKey::from_seed(&[0x42; 32]);
    let plan = chime_roughtime::BundlePlan {
        start_unix_s: now - 3600,
        span_s: 600,
        step_s: 300,
        window_s: 600,
    };
    let old = chime_roughtime::make_bundle(&long, plan, || [0x43; 32]).unwrap();
    let expired = dir.path().join("expired.bundle");
    std::fs::write(&expired, old.encode().as_bytes()).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&expired, std::fs::Permissions::from_mode(0o600)).unwrap();
    let args = flags(&expired);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), &args);
    let roughtime = chimed.roughtime_addr();
    chimed.wait_for(
        "no window of the delegation bundle covers now",
        Duration::from_secs(1),
    );
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let probe = common::roughtime_probe_request([9; 32]);
    assert_eq!(
        exchange(roughtime, &probe, Duration::from_millis(500)),
        None
    );
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("roughtime totals at exit", Duration::from_secs(1));
    assert!(totals.contains("dropped.outside_delegation=1"), "{totals}");
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A bundle with less than two days left (`chime delegate --days 1 --step-hours 12
/// --window-hours 24`: its last window closes about 35 hours from now) is served, and chimed
/// warns at once that it runs out, naming what to do.
#[test]
fn a_bundle_running_low_is_served_with_a_warning() {
    let key = chime_keygen();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("short.bundle");
    let plan = ["--days", "1", "--step-hours", "12", "--window-hours", "24"];
    common::chime_delegate(&key.file, &bundle, &plan);
    let chronyd = Chronyd::start();
    let mut chimed = Chimed::mirroring(
        &chronyd.addr().to_string(),
        &common::roughtime_flags_for("--roughtime-delegation", bundle.to_str().unwrap()),
    );
    let warned = chimed.wait_for(
        "roughtime: the delegation bundle runs out in ",
        Duration::from_secs(5),
    );
    let left: u64 = warned
        .split("runs out in ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{warned}"));
    assert!(
        (34 * 3600..=36 * 3600).contains(&left),
        "{left} s left: {warned}"
    );
    assert!(warned.contains("SIGHUP"), "{warned}");
    let roughtime = chimed.roughtime_addr();
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let out = Command::new(workspace_bin("chime"))
        .args(["roughtime", "--json", "--public-key", &key.public_base64])
        .arg(roughtime.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A Roughtime request that waits in chimed's queue is signed with the time it is signed at, not
/// the time it arrived: the reply vouches for the moment of signing, which a client bounds by its
/// own send and receive times. chimed is stopped while a request (Google's version, whose MIDP
/// and RADI are in microseconds) is sent, and resumed 300 ms later: MIDP ± RADI contains a time
/// after the resume and before the reply came, so the wait does not need to be in the radius
/// (nor is it: RADI stays the upstream's error bound, a second or less here).
#[test]
fn a_queued_request_is_signed_at_signing_time() {
    let s = serve(true, &[]);
    let key: [u8; 32] = base64_decode(&s.public_key);
    let mut request = vec![0u8; chime_roughtime::REQUEST_LEN];
    let len = build_request(&mut request, &[Version::Google], &[7; 64], None).unwrap();
    request.truncate(len);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.chimed.pause();
    let sent = now_us();
    sock.send_to(&request, s.roughtime).unwrap();
    // Not a wait for readiness: this is the stall under test.
    std::thread::sleep(Duration::from_millis(300));
    let resumed = now_us();
    s.chimed.resume();
    let mut buf = [0u8; 2048];
    let (n, _) = sock
        .recv_from(&mut buf)
        .expect("the queued request answered");
    let received = now_us();
    let v = verify_reply(&request, &buf[..n], &key, &VerifyPolicy::new(10_000_000)).unwrap();
    let (midp, radi) = (v.midpoint_unix_us as i64, v.radius_us as i64);
    assert!(
        midp + radi >= resumed && midp - radi <= received,
        "MIDP {} µs after the send, RADI {radi} µs; resumed {} µs after, reply {} µs after",
        midp - sent,
        resumed - sent,
        received - sent
    );
    assert!(
        radi < 1_000_000,
        "the radius is the upstream's bound: {radi} µs"
    );
}

/// `chime delegate` reads the long-term key as chimed reads its keys: one that group or others may
/// read is refused in one line naming it, and no bundle is made; at mode 0600 it is used.
#[test]
fn chime_delegate_refuses_a_long_term_key_others_may_read() {
    use std::os::unix::fs::PermissionsExt as _;
    let rt = chime_keygen();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::set_permissions(&rt.file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = common::run(
        Command::new(workspace_bin("chime"))
            .arg("delegate")
            .arg("--key")
            .arg(&rt.file)
            .arg("--out")
            .arg(&bundle),
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    assert!(said.contains(&rt.file.display().to_string()), "{said}");
    assert!(said.contains("readable by group or others"), "{said}");
    assert!(
        !bundle.exists(),
        "a bundle was made from a key others may read"
    );
    std::fs::set_permissions(&rt.file, std::fs::Permissions::from_mode(0o600)).unwrap();
    common::chime_delegate(&rt.file, &bundle, &[]);
    assert!(bundle.exists());
}

/// A server list (RFC 10049 §8.3's JSON) of `servers`, each `(name, base64 key, udp address)`.
fn server_list(dir: &std::path::Path, servers: &[(&str, &str, String)]) -> std::path::PathBuf {
    server_list_reporting_to(dir, servers, "http://127.0.0.1:9/reports")
}

/// As [`server_list`], with reports going to `reports`.
fn server_list_reporting_to(
    dir: &std::path::Path,
    servers: &[(&str, &str, String)],
    reports: &str,
) -> std::path::PathBuf {
    let entries: Vec<serde_json::Value> = servers
        .iter()
        .map(|(name, key, addr)| {
            serde_json::json!({
                "name": name,
                "version": 1,
                "publicKeyType": "ed25519",
                "publicKey": key,
                "addresses": [{ "protocol": "udp", "address": addr }],
            })
        })
        .collect();
    let path = dir.join("servers.json");
    let list = serde_json::json!({ "servers": entries, "reports": reports });
    std::fs::write(&path, list.to_string()).unwrap();
    path
}

/// `chime roughtime --servers LIST` with `extra` flags: its exit status and its output.
fn measure(list: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(workspace_bin("chime"))
        .args(["roughtime", "--timeout", "0.5", "--servers"])
        .arg(list)
        .args(extra)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A measurement from a server list (RFC 10049 §8): three chimeds and an address where nothing
/// answers, all four chosen: the dead one is named, the three complete the chain, and the report
/// written passes `--check-report`. Then a chimed serving an upstream an hour ahead takes one
/// honest server's place: the chain names it in a contradiction, exits 1, and the report proves
/// it.
#[test]
fn a_server_list_measurement_names_the_dead_and_the_liar() {
    let honest: Vec<Server> = (0..3).map(|_| serve(true, &[])).collect();
    let dir = tempfile::tempdir().unwrap();
    let dead = format!("127.0.0.1:{}", common::free_udp_port());
    let mut servers: Vec<(&str, &str, String)> = ["alpha", "bravo", "charlie"]
        .iter()
        .zip(&honest)
        .map(|(name, s)| (*name, s.public_key.as_str(), s.roughtime.to_string()))
        .collect();
    servers.push(("gone", honest[0].public_key.as_str(), dead));
    let list = server_list(dir.path(), &servers);
    let report = dir.path().join("report.json");
    let (ok, text) = measure(
        &list,
        &["--count", "4", "--report", report.to_str().unwrap()],
    );
    assert!(ok, "{text}");
    assert!(text.contains("Did not answer: gone"), "{text}");
    assert!(text.contains("no server contradicted another"), "{text}");
    let check = Command::new(workspace_bin("chime"))
        .args(["roughtime", "--check-report"])
        .arg(&report)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");

    // An upstream an hour ahead: the chimed that follows it signs that time.
    let ahead = common::standin::StandIn::start(|now| {
        (
            now.add_duration(Duration::from_secs(3600)),
            chime_ntp::Leap::NoWarning,
        )
    });
    let key = chime_keygen();
    let mut liar = Chimed::mirroring(
        &ahead.addr.to_string(),
        &common::roughtime_flags(key.file.to_str().unwrap()),
    );
    let liar_addr = liar.roughtime_addr();
    liar.wait_for("synchronised: stratum 1", Duration::from_secs(10));
    let servers = [
        servers[0].clone(),
        servers[1].clone(),
        ("liar", key.public_base64.as_str(), liar_addr.to_string()),
    ];
    let collector = Collector::start(201, "thank you");
    let list = server_list_reporting_to(dir.path(), &servers, &collector.url);
    let proof = dir.path().join("proof.json");
    let (ok, text) = measure(&list, &["--report", proof.to_str().unwrap(), "--upload"]);
    assert!(!ok, "an hour out went unnoticed: {text}");
    let accused = text.lines().filter(|l| l.starts_with("CONTRADICTION:"));
    assert!(accused.clone().count() >= 2, "{text}");
    assert!(accused.clone().all(|l| l.contains("liar")), "{text}");
    assert!(
        text.contains("In every contradiction: liar\n"),
        "the liar is not singled out: {text}"
    );
    let check = Command::new(workspace_bin("chime"))
        .args(["roughtime", "--check-report"])
        .arg(&proof)
        .output()
        .unwrap();
    assert!(
        !check.status.success(),
        "the report does not prove it: {check:?}"
    );
    // The report went to the list's collector as RFC 10049 §8.4 registers it, and what the
    // collector said is shown.
    let (head, body) = collector.received();
    assert!(head.starts_with("POST /reports HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\ncontent-type: application/roughtime-malfeasance+json\r\n"),
        "{head}"
    );
    let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&proof).unwrap()).unwrap();
    assert_eq!(sent, kept, "the report sent is not the report kept");
    assert!(
        text.contains(&format!(
            "Report sent to {}: HTTP 201 thank you",
            collector.url
        )),
        "{text}"
    );
}

/// `--upload`: refused before any query when the list names no collector; nothing sent when the
/// servers agree; a collector's refusal is an error that says what it answered.
#[test]
fn upload_sends_only_proof_and_says_what_the_collector_answered() {
    let honest: Vec<Server> = (0..3).map(|_| serve(true, &[])).collect();
    let dir = tempfile::tempdir().unwrap();
    let servers: Vec<(&str, &str, String)> = ["alpha", "bravo", "charlie"]
        .iter()
        .zip(&honest)
        .map(|(name, s)| (*name, s.public_key.as_str(), s.roughtime.to_string()))
        .collect();

    let unlisted = dir.path().join("unlisted.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(server_list(dir.path(), &servers)).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("reports");
    std::fs::write(&unlisted, json.to_string()).unwrap();
    let (ok, text) = measure(&unlisted, &["--upload"]);
    assert!(!ok);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("--upload") && text.contains("unlisted.json") && text.contains("reports"),
        "{text}"
    );

    let collector = Collector::start(201, "thanks");
    let list = server_list_reporting_to(dir.path(), &servers, &collector.url);
    let (ok, text) = measure(&list, &["--upload"]);
    assert!(ok, "{text}");
    assert!(text.contains("Nothing sent"), "{text}");
    assert!(!collector.was_called(), "a consistent chain was uploaded");
}

/// A one-shot HTTP collector on loopback: answers the first request with `status` and `answer`
/// and keeps what it received.
struct Collector {
    url: String,
    received: std::sync::mpsc::Receiver<(String, Vec<u8>)>,
}

impl Collector {
    fn start(status: u16, answer: &'static str) -> Self {
        use std::io::{BufRead as _, Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/reports", listener.local_addr().unwrap());
        let (tx, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap();
                }
                head.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let mut stream = stream;
            write!(
                stream,
                "HTTP/1.1 {status} Whatever\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            )
            .unwrap();
            let _ = tx.send((head, body));
        });
        Self { url, received }
    }

    /// The request's head and body; fails if none came.
    fn received(&self) -> (String, Vec<u8>) {
        self.received
            .recv_timeout(Duration::from_secs(5))
            .expect("the collector received no report")
    }

    fn was_called(&self) -> bool {
        self.received
            .recv_timeout(Duration::from_millis(200))
            .is_ok()
    }
}

/// Malformed server lists: one line naming the list, the server and the field, exit 1.
#[test]
fn a_malformed_server_list_gets_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(
        &path,
        r#"{"servers":[{"name":"x","publicKeyType":"ed25519","publicKey":"AAAA","addresses":[{"protocol":"udp","address":"127.0.0.1:1"}]}]}"#,
    )
    .unwrap();
    let (ok, text) = measure(&path, &[]);
    assert!(!ok);
    let line = text.trim();
    assert_eq!(line.lines().count(), 1, "{text}");
    assert!(
        line.contains("bad.json") && line.contains("\"x\"") && line.contains("publicKey"),
        "{text}"
    );
}
