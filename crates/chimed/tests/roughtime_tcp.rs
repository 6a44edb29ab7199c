//! Roughtime over TCP (RFC 10049 §4) against the real chimed: `chime roughtime --tcp`, pipelined
//! requests on one connection with replies matched by nonce, a request cut into many segments,
//! unpadded requests, and every bound: frames that are not Roughtime or too long, idle, slow and
//! long-lived connections, and the per-address and total connection limits. Each way a connection
//! ends is read back from chimed's counters at exit.

mod common;

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use chime_roughtime::{FrameReader, VerifyPolicy, Version, build_request, verify_reply};
use common::{Chimed, Chronyd, RoughtimeKey, chime_keygen, count_in, workspace_bin};

struct Server {
    chimed: Chimed,
    /// The Roughtime address; TCP on the same port.
    addr: SocketAddr,
    key: RoughtimeKey,
    _chronyd: Chronyd,
}

fn serve(extra: &[&str]) -> Server {
    let chronyd = Chronyd::start();
    let key = chime_keygen();
    let mut args = common::roughtime_flags(key.file.to_str().unwrap()).to_vec();
    args.extend_from_slice(extra);
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), &args);
    let addr = chimed.roughtime_addr();
    let tcp = chimed.logged_addr("roughtime over tcp on ");
    assert_eq!(tcp, addr, "TCP on the UDP socket's address and port");
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    Server {
        chimed,
        addr,
        key,
        _chronyd: chronyd,
    }
}

impl Server {
    fn public_key(&self) -> [u8; 32] {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&self.key.public_base64)
            .unwrap()
            .try_into()
            .unwrap()
    }

    /// Stops chimed and returns its TCP line at exit: the totals, then the connections.
    fn stop(mut self) -> String {
        assert!(self.chimed.terminate().success());
        self.chimed
            .wait_for("roughtime-tcp totals at exit", Duration::from_secs(2))
    }
}

/// A padded RFC 10049 request with this nonce.
fn request(nonce: [u8; 32]) -> Vec<u8> {
    let mut out = vec![0u8; chime_roughtime::REQUEST_LEN];
    let len = build_request(&mut out, &[Version::Rfc10049], &nonce, None).unwrap();
    out.truncate(len);
    out
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads `n` replies from `stream`.
fn read_replies(stream: &mut TcpStream, n: usize) -> Vec<Vec<u8>> {
    let mut frames = FrameReader::new(1 << 16);
    let mut replies = Vec::new();
    let mut buf = [0u8; 4096];
    while replies.len() < n {
        let got = stream.read(&mut buf).expect("a reply within 5 s");
        assert!(got > 0, "closed after {} of {n} replies", replies.len());
        frames.push(&buf[..got]);
        while let Some(p) = frames.next_packet().unwrap() {
            replies.push(p.to_vec());
        }
    }
    replies
}

/// Whether chimed closed `stream` within `limit` (a read sees the end, or a reset).
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(_) => return Some(start.elapsed()),
        }
        if start.elapsed() > limit {
            return None;
        }
    }
}

#[test]
fn chime_roughtime_tcp_verifies_every_version_with_framing() {
    let s = serve(&[]);
    for version in ["1", "0x8000000c", "0x8000000b", "0x80000007"] {
        let out = Command::new(workspace_bin("chime"))
            .args(["roughtime", "--tcp", "--json", "--version", version])
            .args(["--public-key", &s.key.public_base64])
            .arg(s.addr.to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{version}: {out:?}");
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(r["radius_us"].as_u64().unwrap() > 0, "{r}");
    }
    let google = Command::new(workspace_bin("chime"))
        .args(["roughtime", "--tcp", "--version", "google"])
        .args(["--public-key", &s.key.public_base64])
        .arg(s.addr.to_string())
        .output()
        .unwrap();
    assert_eq!(google.status.code(), Some(1), "{google:?}");
    let totals = s.stop();
    assert_eq!(count_in(&totals, "answered"), 4, "{totals}");
    assert_eq!(count_in(&totals, "closed_by_client"), 4, "{totals}");
}

/// Twenty requests written at once on one connection: twenty replies, each matched to its
/// request by nonce (the order is the server's to choose) and verified, the batch signed once or
/// a few times rather than twenty.
#[test]
fn pipelined_requests_on_one_connection_are_all_answered() {
    let s = serve(&[]);
    let requests: HashMap<[u8; 32], Vec<u8>> = (0..20u8)
        .map(|i| {
            let nonce = [i + 1; 32];
            (nonce, request(nonce))
        })
        .collect();
    let mut stream = connect(s.addr);
    let all: Vec<u8> = requests.values().flatten().copied().collect();
    stream.write_all(&all).unwrap();
    let key = s.public_key();
    let policy = VerifyPolicy::new(60_000_000);
    let mut seen = Vec::new();
    for reply in read_replies(&mut stream, 20) {
        let (nonce, _) = requests
            .iter()
            .find(|(_, req)| verify_reply(req, &reply, &key, &policy).is_ok())
            .expect("a reply that verifies for one of our requests");
        seen.push(*nonce);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 20);
    drop(stream);
    let totals = s.stop();
    assert_eq!(count_in(&totals, "answered"), 20, "{totals}");
    assert!(
        count_in(&totals, "batches") < 20,
        "signed in batches: {totals}"
    );
}

/// A request cut into 7-byte pieces sent apart, and one with no padding (pyroughtime sends
/// 116 bytes over TCP): both answered. On UDP the unpadded one is too short.
#[test]
fn split_and_unpadded_requests_are_answered() {
    let s = serve(&[]);
    let key = s.public_key();
    let policy = VerifyPolicy::new(60_000_000);
    let mut stream = connect(s.addr);
    let req = request([7; 32]);
    for piece in req.chunks(7) {
        stream.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_micros(300));
    }
    let reply = read_replies(&mut stream, 1).remove(0);
    verify_reply(&req, &reply, &key, &policy).unwrap();

    // VER, NONC and TYPE alone: the header says 64 bytes follow.
    let mut message = vec![];
    message.extend_from_slice(&3u32.to_le_bytes()); // three tags
    message.extend_from_slice(&4u32.to_le_bytes()); // NONC's offset
    message.extend_from_slice(&36u32.to_le_bytes()); // TYPE's offset
    message.extend_from_slice(b"VER\0NONCTYPE");
    message.extend_from_slice(&1u32.to_le_bytes());
    message.extend_from_slice(&[8; 32]);
    message.extend_from_slice(&0u32.to_le_bytes());
    let mut short = b"ROUGHTIM".to_vec();
    short.extend_from_slice(&(message.len() as u32).to_le_bytes());
    short.extend_from_slice(&message);
    stream.write_all(&short).unwrap();
    let reply = read_replies(&mut stream, 1).remove(0);
    assert!(reply.len() > short.len(), "over TCP a reply may be longer");
    verify_reply(&short, &reply, &key, &policy).unwrap();
    assert!(
        common::exchange(s.addr, &short, Duration::from_millis(300)).is_none(),
        "UDP still wants 1024 bytes"
    );
    drop(stream);
    let totals = s.stop();
    assert_eq!(count_in(&totals, "answered"), 2, "{totals}");
}

/// Bytes that are not Roughtime, a header announcing more than a request can be, and a framed
/// message that is not a request: the connection is closed at once, and counted.
#[test]
fn frames_that_are_not_requests_close_the_connection() {
    let s = serve(&[]);
    let mut http = connect(s.addr);
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(closed_within(&mut http, Duration::from_secs(2)).is_some());
    let mut huge = connect(s.addr);
    let mut header = b"ROUGHTIM".to_vec();
    header.extend_from_slice(&1_000_000u32.to_le_bytes());
    huge.write_all(&header).unwrap();
    assert!(closed_within(&mut huge, Duration::from_secs(2)).is_some());
    // A well-framed message that is not a request is dropped, and its connection closed: the
    // client learns at once. A request before it on the same connection is answered first.
    let mut junk = connect(s.addr);
    junk.write_all(&request([9; 32])).unwrap();
    assert_eq!(read_replies(&mut junk, 1).len(), 1);
    let mut frame = b"ROUGHTIM".to_vec();
    frame.extend_from_slice(&8u32.to_le_bytes());
    frame.extend_from_slice(&[0xff; 8]);
    junk.write_all(&frame).unwrap();
    assert!(closed_within(&mut junk, Duration::from_secs(2)).is_some());
    let totals = s.stop();
    assert_eq!(count_in(&totals, "closed_bad_frame"), 2, "{totals}");
    assert_eq!(count_in(&totals, "closed_unanswered"), 1, "{totals}");
    assert_eq!(count_in(&totals, "answered"), 1, "{totals}");
    assert_eq!(count_in(&totals, "dropped.malformed"), 1, "{totals}");
}

/// --roughtime-tcp-idle 0.5: a connection that sends nothing, and one that sends a byte every
/// 100 ms (never a whole request), are closed after about half a second. --roughtime-tcp-lifetime
/// 1.5: one that keeps asking is closed after a second and a half, its answers given.
#[test]
fn idle_slow_and_old_connections_are_closed_on_time() {
    let s = serve(&[
        "--roughtime-tcp-idle",
        "0.5",
        "--roughtime-tcp-lifetime",
        "1.5",
    ]);
    let mut quiet = connect(s.addr);
    let took = closed_within(&mut quiet, Duration::from_secs(3)).expect("quiet one closed");
    assert!(
        (Duration::from_millis(400)..Duration::from_millis(1500)).contains(&took),
        "{took:?}"
    );
    let mut drip = connect(s.addr);
    let start = Instant::now();
    let req = request([3; 32]);
    let mut sent = 0;
    let closed = loop {
        if drip.write_all(&req[sent..sent + 1]).is_err() {
            break start.elapsed();
        }
        sent += 1;
        drip.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut b = [0u8; 16];
        match drip.read(&mut b) {
            Ok(0) => break start.elapsed(),
            Ok(_) => panic!("a reply to a third of a request"),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break start.elapsed(),
            Err(_) => {}
        }
        assert!(start.elapsed() < Duration::from_secs(3), "drip not closed");
    };
    assert!(
        (Duration::from_millis(400)..Duration::from_millis(1500)).contains(&closed),
        "{closed:?} after {sent} bytes"
    );
    let mut busy = connect(s.addr);
    let start = Instant::now();
    let mut answered = 0;
    let closed = loop {
        if busy.write_all(&request([answered as u8; 32])).is_err() {
            break start.elapsed();
        }
        let mut frames = FrameReader::new(1 << 16);
        let mut b = [0u8; 4096];
        match busy.read(&mut b) {
            Ok(0) | Err(_) => break start.elapsed(),
            Ok(n) => {
                frames.push(&b[..n]);
                answered += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(start.elapsed() < Duration::from_secs(4), "busy not closed");
    };
    assert!(
        (Duration::from_millis(1300)..Duration::from_millis(2500)).contains(&closed),
        "{closed:?}"
    );
    assert!(answered >= 5, "{answered}");
    let totals = s.stop();
    assert_eq!(count_in(&totals, "closed_idle"), 2, "{totals}");
    assert_eq!(count_in(&totals, "closed_lifetime"), 1, "{totals}");
}

fn connect_from(local: &str, to: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&local.parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.connect(&to.into()).unwrap();
    let s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s
}

/// --roughtime-tcp-connections 3 and --roughtime-tcp-per-address 2: a third connection from
/// 127.0.0.1 is closed at once while two are open; one from 127.0.0.2 is served; with three open
/// a fourth, from 127.0.0.3, is closed at once. A closed one frees its place.
#[test]
fn connection_limits_per_address_and_in_all() {
    let s = serve(&[
        "--roughtime-tcp-connections",
        "3",
        "--roughtime-tcp-per-address",
        "2",
    ]);
    let served = |stream: &mut TcpStream| {
        stream.write_all(&request([1; 32])).is_ok() && {
            let mut b = [0u8; 16];
            matches!(stream.read(&mut b), Ok(n) if n > 0)
        }
    };
    let mut a1 = connect_from("127.0.0.1:0", s.addr);
    let mut a2 = connect_from("127.0.0.1:0", s.addr);
    assert!(served(&mut a1) && served(&mut a2));
    let mut a3 = connect_from("127.0.0.1:0", s.addr);
    assert!(closed_within(&mut a3, Duration::from_secs(2)).is_some());
    let mut b1 = connect_from("127.0.0.2:0", s.addr);
    assert!(served(&mut b1));
    let mut c1 = connect_from("127.0.0.3:0", s.addr);
    assert!(closed_within(&mut c1, Duration::from_secs(2)).is_some());
    drop(a1);
    // The place is freed once chimed sees the end; a few tries cover the moment in between.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut again = connect_from("127.0.0.3:0", s.addr);
        if served(&mut again) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection's place was not freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop((a2, b1));
    let totals = s.stop();
    assert!(count_in(&totals, "refused_address") >= 1, "{totals}");
    assert!(count_in(&totals, "refused_full") >= 1, "{totals}");
}

/// `chime perf roughtime --tcp`, with connections reused (requests pipelined on each) and with
/// a new connection per request, at a modest rate: every request answered, every reply verified.
#[test]
fn chime_perf_over_tcp_reused_and_per_request() {
    let s = serve(&["--roughtime-tcp-per-address", "256"]);
    let dir = tempfile::tempdir().unwrap();
    for connections in ["4", "0"] {
        let json = dir.path().join(format!("perf-{connections}.json"));
        let out = Command::new(workspace_bin("chime"))
            .args(["perf", "roughtime", "--target", &s.addr.to_string()])
            .args(["--public-key", &s.key.public_base64, "--verify-every", "1"])
            .args(["--tcp", "--tcp-connections", connections])
            .args(["--rate", "300", "--duration", "1", "--warmup", "0.2"])
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let step = &v["steps"][0];
        assert_eq!(step["sent"], 300, "{connections}: {step:#}");
        assert_eq!(step["answered"], 300, "{connections}: {step:#}");
        assert_eq!(step["invalid"], 0, "{connections}: {step:#}");
        assert_eq!(v["request"]["transport"], "tcp", "{v:#}");
    }
    let totals = s.stop();
    // Reused: four connections for 360 requests, the warm-up's included; then one per request.
    assert!(count_in(&totals, "accepted") >= 360, "{totals}");
    assert_eq!(count_in(&totals, "closed_unanswered"), 0, "{totals}");
}

/// `chime keygen --mldsa` and the public key it prints.
#[cfg(feature = "mldsa")]
fn mldsa_keygen(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, String) {
    let file = dir.join(name);
    let out = Command::new(workspace_bin("chime"))
        .args(["keygen", "--mldsa"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    let public = said
        .split("): ")
        .nth(1)
        .expect("the public key")
        .trim()
        .to_owned();
    (file, public)
}

/// The experimental ML-DSA-44 suite (0x90000001): chimed serves it over TCP beside Ed25519 on
/// the same port, and `chime roughtime` with the 1312-byte key verifies both ML-DSA-44 signatures
/// and the path; a client naming another ML-DSA-44 key is not answered. Without TCP chimed
/// refuses the key file at start. The suite is built in with `--features mldsa`.
#[cfg(feature = "mldsa")]
#[test]
fn the_experimental_mldsa_suite_is_served_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let (pq, public) = mldsa_keygen(dir.path(), "pq.key");
    let (_, other) = mldsa_keygen(dir.path(), "other.key");
    let s = serve(&["--roughtime-mldsa-key", pq.to_str().unwrap()]);
    let query = |key: &str| {
        Command::new(workspace_bin("chime"))
            .args(["roughtime", "--json", "--public-key", key])
            .arg(s.addr.to_string())
            .output()
            .unwrap()
    };
    let out = query(&public);
    assert!(out.status.success(), "{out:?}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["transport"], "tcp", "{r}");
    assert!(r["radius_us"].as_u64().unwrap() >= 3_000_000, "{r}");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(
        (r["midpoint_unix_us"].as_i64().unwrap() - now_us).abs() < 5_000_000,
        "{r}"
    );
    assert!(!query(&other).status.success(), "answered for another key");
    let ed = Command::new(workspace_bin("chime"))
        .args(["roughtime", "--tcp", "--public-key", &s.key.public_base64])
        .arg(s.addr.to_string())
        .output()
        .unwrap();
    assert!(ed.status.success(), "Ed25519 beside it: {ed:?}");
    // Kept past the server (whose key directory goes with it) for the check below.
    let ed_key = dir.path().join("ed.key");
    std::fs::copy(&s.key.file, &ed_key).unwrap();
    let totals = s.stop();
    assert_eq!(count_in(&totals, "answered"), 2, "{totals}");
    assert_eq!(count_in(&totals, "dropped.unknown_server"), 1, "{totals}");
    // Each reply counted by its version: the suite's, and the Ed25519 one's.
    assert_eq!(count_in(&totals, "version.0x90000001"), 1, "{totals}");
    assert_eq!(count_in(&totals, "version.1"), 1, "{totals}");

    let out = Command::new(workspace_bin("chimed"))
        .args(["--check-config", "--roughtime-tcp-connections", "0"])
        .args(["--roughtime-mldsa-key", pq.to_str().unwrap()])
        .args(["--roughtime-key", ed_key.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("roughtime-mldsa-key") && err.contains("TCP only"),
        "{err}"
    );
}

/// A signer slower than its clients (a fail point makes it wait 30 ms before every batch, so
/// every queued request waits past the 5 ms shed target): once the queue has stood for the shed
/// interval, the requests that waited too long get no reply and are counted as shed, connections
/// with a run of them are closed, and the fresh requests are still answered.
#[cfg(feature = "failpoints")]
#[test]
fn a_standing_queue_is_shed_by_age() {
    let chronyd = Chronyd::start();
    let key = chime_keygen();
    let upstream = chronyd.addr().to_string();
    let mut args = common::roughtime_flags(key.file.to_str().unwrap()).to_vec();
    args.extend_from_slice(&["-s", &upstream, "-4", "1", "-6", "0", "-a", "127.0.0.1:0"]);
    args.extend_from_slice(&["--roughtime-tcp-per-address", "64"]);
    let slow = [("FAILPOINTS", "roughtime-tcp-signer=return(30)")];
    let mut chimed = Chimed::start_with_env(None, &args, &slow, "running:");
    let addr = chimed.logged_addr("roughtime over tcp on ");
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(2);
    // 24 connections of 16 requests each keep more than a batch (256) queued.
    let clients: Vec<_> = (0..24u8)
        .map(|c| std::thread::spawn(move || pipeline_until(addr, c, deadline)))
        .collect();
    let replies: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("roughtime-tcp totals at exit", Duration::from_secs(2));
    assert!(count_in(&totals, "shed") > 0, "{totals}");
    assert!(count_in(&totals, "closed_ageing") > 0, "{totals}");
    assert_eq!(count_in(&totals, "answered") as usize, replies, "{totals}");
    assert!(replies > 0, "{totals}");
}

/// Writes 16 requests at a time on a connection and reads what comes back within 50 ms, without
/// waiting for the rest (a shed request gets no reply), reconnecting when chimed closes it, until
/// `deadline`; the replies read.
#[cfg(feature = "failpoints")]
fn pipeline_until(addr: SocketAddr, client: u8, deadline: Instant) -> usize {
    let nonce = |i: u8| [client, i].repeat(16).try_into().unwrap();
    let batch: Vec<u8> = (0..16u8).flat_map(|i| request(nonce(i))).collect();
    let mut replies = 0;
    while Instant::now() < deadline {
        let mut stream = connect(addr);
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let (mut frames, mut buf) = (FrameReader::new(1 << 16), [0u8; 4096]);
        'connection: while Instant::now() < deadline {
            if stream.write_all(&batch).is_err() {
                break;
            }
            loop {
                match stream.read(&mut buf) {
                    Ok(0) => break 'connection,
                    Ok(n) => frames.push(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => break 'connection,
                }
                while frames.next_packet().unwrap().is_some() {
                    replies += 1;
                }
            }
        }
    }
    replies
}
