//! The control socket against the real binaries: `chime status` and `chime clients` ask a chimed
//! mirroring a real chronyd, after traffic from loopback addresses with known counts; the socket
//! refuses whoever is neither root nor in chimed's group; bad requests get an error each and
//! change nothing.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Chimed, Chronyd, run, workspace_bin};

/// A chimed mirroring `chronyd` with its control socket in a directory anyone may enter (so that
/// only the socket's own mode decides who may connect), and the socket's path.
fn chimed_with_socket(chronyd: &Chronyd, dir: &Path) -> (Chimed, std::path::PathBuf) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.join("chimed.sock");
    let chimed = Chimed::mirroring(
        &chronyd.addr().to_string(),
        &["--control-socket", socket.to_str().unwrap()],
    );
    (chimed, socket)
}

/// Sends `count` NTP client requests to `to` from `from` (a loopback address), one at a time,
/// each waiting for its reply: the replies that came.
fn requests_from(from: &str, to: SocketAddr, count: usize) -> usize {
    let sock = UdpSocket::bind((from, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut request = [0u8; 48];
    request[0] = 0x23;
    let mut buf = [0u8; 128];
    (0..count)
        .filter(|i| {
            request[40..48].copy_from_slice(&(*i as u64).to_be_bytes());
            sock.send_to(&request, to).unwrap();
            sock.recv_from(&mut buf).is_ok()
        })
        .count()
}

/// `chime status` (or `chime clients`) with `args` on `socket`: its exit code and its output.
fn chime(args: &[&str], socket: &Path) -> (i32, String, String) {
    let out = run(Command::new(workspace_bin("chime"))
        .args(args)
        .arg("--socket")
        .arg(socket));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status_json(socket: &Path) -> serde_json::Value {
    let (code, out, err) = chime(&["status", "--json"], socket);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

/// Polls `status` until `ntp.received` reaches `n` (the workers publish their counts after each
/// batch), for at most 5 s.
fn status_once_received(socket: &Path, n: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = status_json(socket);
        let received = s["ntp"]["received"].as_u64().expect("no ntp.received");
        if received >= n || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `chime clients --json --top N` on `socket`.
fn clients_json(socket: &Path, top: &str) -> serde_json::Value {
    let (code, out, err) = chime(&["clients", "--json", "--top", top], socket);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn chime_status_and_chime_clients_count_what_three_clients_sent() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut chimed, socket) = chimed_with_socket(&chronyd, dir.path());
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let sent = [("127.0.0.2", 300), ("127.0.0.3", 200), ("127.0.0.4", 100)];
    let answered: usize = sent
        .iter()
        .map(|(from, n)| requests_from(from, chimed.addr, *n))
        .sum();
    assert!(answered >= 594, "only {answered} of 600 answered");
    let s = status_once_received(&socket, 600);
    assert_eq!(s["ntp"]["received"], 600, "{s}");
    assert_eq!(s["ntp"]["answered"].as_u64(), Some(answered as u64), "{s}");
    assert_eq!(s["healthy"], true, "{s}");
    assert_eq!(s["upstream"]["stratum"], 3, "{s}");
    assert_eq!(s["upstream"]["address"], chronyd.addr().to_string());
    // For a person: the same counts.
    let (code, text, _) = chime(&["status"], &socket);
    assert_eq!(code, 0);
    assert!(text.contains("healthy"), "{text}");
    assert!(text.contains("received 600, answered"), "{text}");

    // Each client by its address, the busiest first, with its own count.
    let c = clients_json(&socket, "10");
    let listed: Vec<(String, u64)> = c["clients"]
        .as_array()
        .expect("no clients list")
        .iter()
        .map(|e| {
            (
                e["address"].as_str().unwrap().to_owned(),
                e["requests"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = sent
        .iter()
        .map(|(a, n)| ((*a).to_owned(), *n as u64))
        .collect();
    assert_eq!(listed, expected, "{c}");
    for e in c["clients"].as_array().unwrap() {
        assert_eq!(e["dropped"], 0, "{e}");
        let interval = e["interval_seconds"].as_f64().expect("no interval");
        assert!(interval > 0.0 && interval < 1.0, "{e}");
    }
    assert_eq!(c["distinct"]["last_hour"], 3, "{c}");
    assert_eq!(c["distinct"]["last_day"], 3, "{c}");
    assert_eq!(
        clients_json(&socket, "1")["clients"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let (code, text, _) = chime(&["clients"], &socket);
    assert_eq!(code, 0);
    assert!(text.contains("127.0.0.2") && text.contains("300"), "{text}");
    // In the requests column, under its heading.
    let row = text.lines().find(|l| l.starts_with("127.0.0.2")).unwrap();
    assert_eq!(row.get(41..51), Some("       300"), "{text}");
}

#[test]
fn an_unsynchronised_upstream_makes_chime_status_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("chimed.sock");
    // Nothing answers on the upstream's port: never synchronised.
    let upstream = format!("127.0.0.1:{}", common::free_udp_port());
    let _chimed = Chimed::mirroring(&upstream, &["--control-socket", socket.to_str().unwrap()]);
    let (code, text, _) = chime(&["status"], &socket);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("UNHEALTHY"), "{text}");
    assert!(text.contains("Problem: upstream"), "{text}");
    let (code, json, _) = chime(&["status", "--json"], &socket);
    assert_eq!(code, 2);
    let s: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(s["healthy"], false);
    assert_eq!(
        s["ntp"]["received"], 0,
        "a count of nothing is 0, and present"
    );
}

#[test]
fn the_socket_refuses_users_outside_chimeds_group() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (_chimed, socket) = chimed_with_socket(&chronyd, dir.path());
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "not for owner and group only");
    // nobody, in no group of chimed's: refused at connect.
    let out = run(Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(workspace_bin("chime"))
        .args(["status", "--socket"])
        .arg(&socket));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot connect") && err.contains("ermission denied"),
        "{err}"
    );
    // Root may.
    assert!(status_json(&socket)["healthy"].is_boolean());
}

/// Sends `bytes` on a new connection, then shuts its sending side if `close`, and reads what
/// comes back until chimed closes it.
fn raw(socket: &Path, bytes: &[u8], close: bool) -> serde_json::Value {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    if close {
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    serde_json::from_str(answer.trim_end()).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

#[test]
fn bad_requests_get_an_error_each_and_chimed_serves_on() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (chimed, socket) = chimed_with_socket(&chronyd, dir.path());
    let oversized = vec![b'{'; 4096];
    let cases: [(&[u8], bool, &str); 5] = [
        (b"garbage\n", false, "not a request"),
        (b"{\"command\":\"shutdown\"}\n", false, "not a request"),
        (&oversized, false, "longer than 1024 bytes"),
        (b"{\"command\":", true, "cut off"),
        (b"{\"command\":\"status\"", false, "within 2 s"),
    ];
    for (bytes, close, why) in cases {
        let answer = raw(&socket, bytes, close);
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{why}: {answer}");
    }
    // Nothing changed, and everything still answers.
    let s = status_json(&socket);
    assert_eq!(s["control"]["refused"], 5, "{s}");
    assert!(common::chime_ntp(chimed.addr).is_ok());
    let good = raw(&socket, b"{\"command\":\"status\"}\n", false);
    assert!(good["healthy"].is_boolean(), "{good}");
}
