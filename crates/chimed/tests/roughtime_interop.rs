//! Roughtime against independent implementations, installed by `scripts/setup` from the
//! registries (crates.io, PyPI, the Go module proxy) at fixed paths, overridable by environment variables:
//!
//! * roughenough-client 2.2.0 (`ROUGHENOUGH_CLIENT`) and roughly 0.3.0 (`ROUGHLY`, the `roughly`
//!   script of its venv) query the real chimed, mirroring a real chronyd, with every protocol
//!   version each can offer;
//! * Google's original protocol, from two independent clients: Botan 2.19's `botan roughtime`
//!   (Debian's `botan` package; `BOTAN`), a C++ client that also chains its queries and re-checks
//!   the chain with `botan roughtime_check`, and pyroughtime 1.0.1 (PyPI; `PYROUGHTIME_PYTHON`, the
//!   python of its venv), whose headerless request carries a stray VER tag;
//! * draft 07 both ways with pyroughtime 1.0.1: its default client queries chimed, and
//!   `chime roughtime --version 0x80000007` verifies its server (which sends no ROUGHTIM header);
//! * `chime roughtime` verifies real independent servers, roughenough-server 2.2.0
//!   (`ROUGHENOUGH_SERVER`; version 1) and roughly 0.3.0's server (version 1, 0x8000000c, drafts
//!   10–11 and Google's protocol), and chimed itself, and refuses replies that do not verify with
//!   the key it was given; `chime perf` verifies every reply of a load on roughly's server, whose
//!   batches give replies with Merkle paths;
//! * Cloudflare's Go Roughtime (github.com/cloudflare/roughtime at a pinned commit, from the Go
//!   module proxy): its client (`CLOUDFLARE_GETROUGHTIME`) queries chimed offering drafts 11 and
//!   08, and Google's protocol, and `chime roughtime` verifies its test server
//!   (`CLOUDFLARE_TESTSERVER`) in drafts 11 and 08 and Google's protocol;
//! * malfeasance reports (RFC 10049 §8.4.1) both ways: roughly's checker confirms the reports
//!   `chime roughtime --report` writes, and `chime roughtime --check-report` checks roughly's;
//! * measurements from a server list (RFC 10049 §8, `chime roughtime --servers`): chimed over TCP,
//!   roughenough-server, roughly's server and Cloudflare's test server, each in the version its
//!   entry names, chained past a dead address; and roughenough-server under libfaketime
//!   (`FAKETIME_LIB`, Debian's `libfaketime`), an hour ahead, named as the liar in every run.
//!
//! A missing peer fails the test with a message naming `scripts/setup`; nothing is skipped.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{
    CLOUDFLARE_GETROUGHTIME, Chimed, Chronyd, PeerServer, ROUGHLY, RoughtimeKey, chime_keygen,
    count_in, peer, run, unix_now, wait_roughtime_ready, workspace_bin,
};

const ROUGHENOUGH_CLIENT: &str = "/opt/chime-peers/bin/roughenough_client";
const BOTAN: &str = "/usr/bin/botan";
const PYROUGHTIME_PYTHON: &str = "/opt/chime-peers/pyroughtime-venv/bin/python";

/// How far a signed midpoint may be from this machine's clock: chimed serves chronyd's time on the
/// same machine, and every peer prints whole seconds.
const NEAR: f64 = 5.0;

fn assert_near_now(unix_secs: f64, what: &str) {
    let off = unix_secs - unix_now();
    assert!(
        off.abs() <= NEAR,
        "{what}: time {unix_secs} is {off:+.1} s from ours"
    );
}

fn text(out: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A chronyd, and chimed serving Roughtime beside NTP with a key from `chime keygen`, answering.
struct RoughtimeChimed {
    addr: SocketAddr,
    key: RoughtimeKey,
    // Dropped in this order: chimed before the chronyd it mirrors.
    chimed: Chimed,
    _chronyd: Chronyd,
}

fn chimed_roughtime() -> RoughtimeChimed {
    chimed_roughtime_with(&[])
}

/// As [`chimed_roughtime`], with `extra` flags for chimed.
fn chimed_roughtime_with(extra: &[&str]) -> RoughtimeChimed {
    let key = chime_keygen();
    let chronyd = Chronyd::start();
    let upstream = chronyd.addr().to_string();
    let mut args = common::roughtime_flags(key.file.to_str().unwrap()).to_vec();
    args.extend_from_slice(extra);
    let mut chimed = Chimed::mirroring(&upstream, &args);
    let addr = chimed.roughtime_addr();
    let logged = chimed.wait_for("roughtime public key (base64): ", Duration::from_secs(5));
    assert!(
        logged.contains(&format!("(base64): {}", key.public_base64)),
        "chimed logged another public key than chime keygen printed ({}): {logged}",
        key.public_base64
    );
    // Roughtime is answered only while the mirrored chronyd is synchronised.
    chimed.wait_for("synchronised: stratum", Duration::from_secs(10));
    assert!(
        wait_roughtime_ready(addr, Duration::from_secs(5), || true),
        "chimed does not answer Roughtime on {addr}; log:\n{}",
        chimed.log()
    );
    RoughtimeChimed {
        addr,
        key,
        chimed,
        _chronyd: chronyd,
    }
}

// ---------------------------------------------------------------------------------------------
// roughenough-client 2.2.0 → chimed. It can offer [1] (`-P 1`, its default), [0x8000000c]
// (`-P 19`) or [1, 0x8000000c] (`-P both`), and exits 0 only for a reply that verified with `-k`.

fn roughenough_client_accepts(protocol: &str) {
    let client = peer("ROUGHENOUGH_CLIENT", ROUGHENOUGH_CLIENT);
    let s = chimed_roughtime();
    let out = run(Command::new(client)
        .arg(s.addr.ip().to_string())
        .arg(s.addr.port().to_string())
        .args(["-k", &s.key.public_base64, "-P", protocol, "--epoch"])
        .env("NO_COLOR", "1"));
    assert!(
        out.status.success(),
        "roughenough_client -P {protocol} did not accept chimed's reply:\n{}\nchimed log:\n{}",
        text(&out),
        s.chimed.log()
    );
    // "2026-11-21T19:37:26.306695Z  INFO roughenough_client: 1795289846"
    let stdout = String::from_utf8_lossy(&out.stdout);
    let secs: f64 = stdout
        .lines()
        .filter(|l| l.contains("roughenough_client:"))
        .find_map(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no time in roughenough_client's output:\n{}", text(&out)));
    assert_near_now(secs, &format!("roughenough_client -P {protocol}"));
}

#[test]
fn roughenough_client_offering_1() {
    roughenough_client_accepts("1");
}

#[test]
fn roughenough_client_offering_0x8000000c() {
    roughenough_client_accepts("19");
}

#[test]
fn roughenough_client_offering_1_and_0x8000000c() {
    roughenough_client_accepts("both");
}

// ---------------------------------------------------------------------------------------------
// roughly 0.3.0 → chimed. Its client offers 1 and 0x80000007..=0x8000000f (all of them by
// default). Its CLI cannot choose versions and exits 0 even on failure, so single versions are
// offered through its library by tests/roughly_query.py, run with the venv's python.

/// Grease: chimed sending nothing but deliberately invalid replies of the kinds roughenough-client
/// 2.2.0 checks, and it refuses every one. It does not compare NONC with its request (it accepts
/// a reply whose NONC is off by a bit: for version 1 the Merkle leaf is the whole request, so
/// the path still binds the reply to it), so `nonce` is left out.
#[test]
fn roughenough_client_refuses_greased_replies() {
    let client = peer("ROUGHENOUGH_CLIENT", ROUGHENOUGH_CLIENT);
    let kinds = "signature,certificate,path,index,time";
    let s = chimed_roughtime_with(&["--roughtime-grease", "1", "--roughtime-grease-kinds", kinds]);
    for i in 0..5 {
        let out = run(Command::new(&client)
            .arg(s.addr.ip().to_string())
            .arg(s.addr.port().to_string())
            .args(["-k", &s.key.public_base64, "-P", "1", "--epoch"])
            .env("NO_COLOR", "1"));
        let said = text(&out);
        assert!(
            !out.status.success() && said.contains("validation"),
            "query {i}: roughenough_client accepted a greased reply ({kinds}):\n{said}"
        );
    }
}

fn roughly_python() -> PathBuf {
    let python = peer("ROUGHLY", ROUGHLY).with_file_name("python");
    assert!(
        python.exists(),
        "{} is missing beside roughly: run scripts/setup",
        python.display()
    );
    python
}

/// roughly's verdict on one query offering exactly `versions` (comma-separated).
fn roughly_query(addr: SocketAddr, key_base64: &str, versions: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/roughly_query.py");
    let out = run(Command::new(roughly_python())
        .arg(script)
        .args([&addr.ip().to_string(), &addr.port().to_string()])
        .args([key_base64, versions, "1.5"]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("roughly_query.py printed no JSON ({e}):\n{}", text(&out)));
    assert_eq!(out.status.success(), r["ok"] == true, "{}", text(&out));
    r
}

fn roughly_accepts(version: u32) {
    roughly_python();
    let s = chimed_roughtime();
    let r = roughly_query(s.addr, &s.key.public_base64, &format!("{version:#x}"));
    assert_eq!(
        r["ok"],
        true,
        "roughly offering {version:#x} did not accept chimed's reply: {r}\nchimed log:\n{}",
        s.chimed.log()
    );
    assert_eq!(r["version"], version, "{r}");
    assert!(r["radius"].as_u64().is_some_and(|r| r > 0), "{r}");
    assert_near_now(
        r["midpoint"].as_f64().unwrap(),
        &format!("roughly {version:#x}"),
    );
}

/// Grease: roughly 0.3 refuses deliberately invalid replies of the kinds it checks. With a lone
/// request (a batch of one, no path) it does not check INDX, so `path` and `index` are left out.
#[test]
fn roughly_refuses_greased_replies() {
    roughly_python();
    let kinds = "signature,certificate,nonce,time";
    let s = chimed_roughtime_with(&["--roughtime-grease", "1", "--roughtime-grease-kinds", kinds]);
    for i in 0..5 {
        let r = roughly_query(s.addr, &s.key.public_base64, "0x1");
        assert!(
            r["ok"] == false && r["error"] != "timeout",
            "query {i}: roughly accepted a greased reply ({kinds}), or got none: {r}"
        );
    }
}

/// Versions chimed does not serve get no reply at all (no error replies exist in Roughtime).
/// roughly offering only `version`, which chimed does not speak, times out: chimed dropped the
/// request as having no common version (its drop counter says so), and goes on answering one
/// that offers a version it speaks.
fn roughly_gets_no_reply(version: u32) {
    roughly_python();
    let mut s = chimed_roughtime();
    let r = roughly_query(s.addr, &s.key.public_base64, &format!("{version:#x}"));
    assert_eq!(
        r["error"], "timeout",
        "chimed should drop a request offering only {version:#x}: {r}"
    );
    let r = roughly_query(s.addr, &s.key.public_base64, "0x1");
    assert_eq!(r["ok"], true, "chimed still serves: {r}");
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(2));
    assert_eq!(
        count_in(&totals, "dropped.no_common_version"),
        1,
        "{totals}"
    );
    // The readiness probe and the query that still works.
    assert_eq!(count_in(&totals, "answered"), 2, "{totals}");
}

#[test]
fn roughly_cli_default_offer() {
    let roughly = peer("ROUGHLY", ROUGHLY);
    let s = chimed_roughtime();
    let out = run(Command::new(roughly)
        .args([
            "query",
            &s.addr.ip().to_string(),
            &s.addr.port().to_string(),
        ])
        .args([&s.key.public_base64, "--timeout", "2"]));
    // "Current time: 1795289697 ± 3 seconds"
    let stdout = String::from_utf8_lossy(&out.stdout);
    let secs: f64 = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("Current time: ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "roughly query did not accept chimed's reply:\n{}\nchimed log:\n{}",
                text(&out),
                s.chimed.log()
            )
        });
    assert_near_now(secs, "roughly query");
}

#[test]
fn roughly_offering_1() {
    roughly_accepts(1);
}

#[test]
fn roughly_offering_0x8000000c() {
    roughly_accepts(0x8000_000c);
}

#[test]
fn roughly_offering_0x8000000b() {
    roughly_accepts(0x8000_000b);
}

#[test]
fn roughly_offering_0x8000000a() {
    roughly_accepts(0x8000_000a);
}

#[test]
fn roughly_offering_0x80000009() {
    roughly_accepts(0x8000_0009);
}

#[test]
fn roughly_offering_0x80000008() {
    roughly_accepts(0x8000_0008);
}

/// Draft 07: SHA-512/256 tree, MJD timestamps, RADI in microseconds.
#[test]
fn roughly_offering_0x80000007() {
    roughly_accepts(0x8000_0007);
}

/// roughly numbers 0x8000000d..=0x8000000f as drafts 13–15; the drafts froze 0x8000000c from 12
/// on, so these are unknown versions.
#[test]
fn roughly_offering_0x8000000d_gets_no_reply() {
    roughly_gets_no_reply(0x8000_000d);
}

#[test]
fn roughly_offering_0x8000000e_gets_no_reply() {
    roughly_gets_no_reply(0x8000_000e);
}

#[test]
fn roughly_offering_0x8000000f_gets_no_reply() {
    roughly_gets_no_reply(0x8000_000f);
}

// ---------------------------------------------------------------------------------------------
// Cloudflare's Go Roughtime (github.com/cloudflare/roughtime) → chimed. Its client offers drafts
// 11 and 08 ("IETF-Roughtime", so chimed must pick draft 11) or Google's protocol, verifies the
// reply with the key in its config, and prints how far the signed midpoint is from its own clock
// ("Delta: 108ms"). chimed's exit line says which version it answered in.

/// A Go duration as `time.Duration.String` prints one truncated to milliseconds ("0s", "108ms",
/// "-1.5s"), in seconds.
fn go_duration_secs(text: &str) -> Option<f64> {
    let (sign, text) = match text.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, text),
    };
    let value: f64 = if let Some(ms) = text.strip_suffix("ms") {
        ms.parse::<f64>().ok()? / 1e3
    } else {
        text.strip_suffix('s')?.parse().ok()?
    };
    Some(sign * value)
}

/// Runs Cloudflare's getroughtime against `addr` with `key` in its JSON server list, speaking
/// `version` ("IETF-Roughtime" or "Google-Roughtime"): its output and exit status.
fn cloudflare_getroughtime(addr: SocketAddr, key: &str, version: &str) -> Output {
    let client = peer("CLOUDFLARE_GETROUGHTIME", CLOUDFLARE_GETROUGHTIME);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("servers.json");
    let servers = serde_json::json!({"servers": [{
        "name": "under-test",
        "version": version,
        "publicKeyType": "ed25519",
        "publicKey": key,
        "addresses": [{"protocol": "udp", "address": addr.to_string()}],
    }]});
    std::fs::write(&config, servers.to_string()).unwrap();
    run(Command::new(client)
        .arg("-config")
        .arg(&config)
        .args(["-attempts", "2", "-timeout", "1s"]))
}

/// getroughtime speaking `version` accepts chimed's reply, which chimed made in `served` (a
/// `version.*` label of its stats), and the signed time is within `within` seconds of ours.
fn cloudflare_client_accepts(version: &str, served: &str, within: f64) {
    let mut s = chimed_roughtime();
    let out = cloudflare_getroughtime(s.addr, &s.key.public_base64, version);
    let all = text(&out);
    assert!(
        out.status.success(),
        "getroughtime ({version}) did not accept chimed's reply:\n{all}\nchimed log:\n{}",
        s.chimed.log()
    );
    let delta = all
        .lines()
        .find_map(|l| go_duration_secs(l.strip_prefix("Delta: ")?.trim()))
        .unwrap_or_else(|| panic!("no Delta in getroughtime's output:\n{all}"));
    assert!(
        delta.abs() < within,
        "getroughtime ({version}): delta {delta} s"
    );
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    // This client's one query, and the readiness probe's version 1 request: every other
    // version's count (the line at exit carries them all) is 0.
    let mut versions: Vec<&str> = totals
        .split_whitespace()
        .filter(|w| w.starts_with("version.") && !w.ends_with("=0"))
        .collect();
    versions.sort_unstable();
    let mut expected = [format!("{served}=1"), "version.1=1".to_owned()];
    expected.sort_unstable();
    assert_eq!(versions, expected, "{totals}");
}

#[test]
fn cloudflare_client_offering_drafts_11_and_08_gets_draft_11() {
    // Draft 11 signs whole seconds (and a radius of at least 3 s).
    cloudflare_client_accepts("IETF-Roughtime", "version.0x8000000b", 2.0);
}

#[test]
fn cloudflare_client_speaking_google_roughtime() {
    cloudflare_client_accepts("Google-Roughtime", "version.google", 1.0);
}

/// Grease: Cloudflare's getroughtime refuses greased replies of the kinds it checks, in both
/// protocols. It accepts a stray INDX bit on a lone request's reply (no path), so `index` (and
/// `path`, which breaks INDX the same way there) is left out.
#[test]
fn cloudflare_client_refuses_greased_replies() {
    let kinds = "signature,certificate,nonce,time";
    let s = chimed_roughtime_with(&["--roughtime-grease", "1", "--roughtime-grease-kinds", kinds]);
    for version in ["IETF-Roughtime", "Google-Roughtime"] {
        for i in 0..3 {
            let out = cloudflare_getroughtime(s.addr, &s.key.public_base64, version);
            let all = text(&out);
            assert!(
                !out.status.success() && all.contains("no valid responses"),
                "{version} query {i}: getroughtime accepted a greased reply ({kinds}):\n{all}"
            );
        }
    }
}

/// With another key in the client's config: speaking draft 11, the client names that key in SRV
/// and chimed, which holds another, drops the request (counted `unknown_server`); speaking Google's
/// protocol, which has no SRV, the client gets chimed's reply and refuses it, as it must.
#[test]
fn cloudflare_client_under_another_key_gets_nothing_it_accepts() {
    let mut s = chimed_roughtime();
    let other = chime_keygen();
    for version in ["IETF-Roughtime", "Google-Roughtime"] {
        let out = cloudflare_getroughtime(s.addr, &other.public_base64, version);
        assert!(!out.status.success(), "{version}: {}", text(&out));
        assert!(!text(&out).contains("Delta:"), "{version}: {}", text(&out));
    }
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "dropped.unknown_server") > 0, "{totals}");
    assert!(count_in(&totals, "version.google") > 0, "{totals}");
    assert_eq!(count_in(&totals, "version.0x8000000b"), 0, "{totals}");
}

// ---------------------------------------------------------------------------------------------
// chime roughtime → roughenough-server 2.2.0 (answers version 1 only) and → chimed.

/// `chime roughtime --json` against `addr` with this key; the parsed report, or why it failed.
fn chime_roughtime(
    addr: SocketAddr,
    key: &str,
    version: Option<&str>,
) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new(workspace_bin("chime"));
    cmd.args(["roughtime", "--json", "--timeout", "1", "--public-key", key]);
    if let Some(v) = version {
        cmd.args(["--version", v]);
    }
    let out = run(cmd.arg(addr.to_string()));
    if !out.status.success() {
        return Err(text(&out));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", text(&out)))
}

fn assert_verified(r: &serde_json::Value, version_mark: &str, what: &str) {
    let version = r["version"].as_str().unwrap_or_default();
    assert!(
        version.contains(version_mark),
        "{what}: version {version:?}, expected {version_mark}: {r}"
    );
    assert_near_now(r["midpoint_unix_us"].as_f64().unwrap() / 1e6, what);
    assert!(
        r["radius_us"].as_u64().is_some_and(|r| r > 0),
        "{what}: {r}"
    );
    assert_eq!(r["spelling_conforms"], true, "{what}: {r}");
}

#[test]
fn chime_verifies_roughenough_server() {
    let key = chime_keygen();
    let server = PeerServer::roughenough(&key.seed_hex);
    // The same seed gives the same public key in both implementations.
    assert_eq!(
        server.logged_public_key_hex(),
        key.public_hex.to_ascii_lowercase(),
        "roughenough derived another public key from chime keygen's seed"
    );
    for (version, mark) in [(None, "version 1"), (Some("1"), "version 1")] {
        let what = format!("chime roughtime --version {version:?} vs roughenough");
        let r = chime_roughtime(server.addr, &key.public_base64, version)
            .unwrap_or_else(|e| panic!("{what}: {e}\nroughenough log:\n{}", server.log()));
        assert_verified(&r, mark, &what);
        // The hex spelling of the key is accepted too.
        chime_roughtime(server.addr, &key.public_hex, version)
            .unwrap_or_else(|e| panic!("{what}, hex key: {e}"));
    }
}

/// roughly 0.3.0's server signs a VER inside SREP for drafts 10 and 11 as well as the top-level
/// one those drafts define; chime takes the signed one, and they must agree.
#[test]
fn chime_verifies_roughly_server_in_every_version_it_serves() {
    let key = chime_keygen();
    let server = PeerServer::roughly(&key.seed_hex);
    for (version, mark) in [
        ("1", "RFC 10049"),
        ("0x8000000c", "0x8000000c"),
        ("0x8000000b", "0x8000000b"),
        ("0x8000000a", "0x8000000a"),
        ("google", "Google"),
    ] {
        let r =
            chime_roughtime(server.addr, &key.public_base64, Some(version)).unwrap_or_else(|e| {
                panic!(
                    "--version {version}: {e}\nroughly server log:\n{}",
                    server.log()
                )
            });
        assert_verified(&r, mark, &format!("roughly server, --version {version}"));
    }
    // Drafts 08 and 09 it does not serve: no reply, not a wrong one.
    let err = chime_roughtime(server.addr, &key.public_base64, Some("0x80000008"))
        .expect_err("roughly's server answered draft 08");
    assert!(err.contains("no reply"), "{err}");
}

/// Cloudflare's Go test server, in each version it serves.
#[test]
fn chime_verifies_cloudflare_testserver_in_every_version_it_serves() {
    let key = chime_keygen();
    let server = PeerServer::cloudflare(&key.seed_hex);
    for (version, mark) in [
        ("0x8000000b", "0x8000000b"),
        ("0x80000008", "0x80000008"),
        ("google", "Google"),
    ] {
        let r =
            chime_roughtime(server.addr, &key.public_base64, Some(version)).unwrap_or_else(|e| {
                panic!(
                    "--version {version}: {e}\ncloudflare testserver log:\n{}",
                    server.log()
                )
            });
        assert_verified(
            &r,
            mark,
            &format!("cloudflare testserver, --version {version}"),
        );
    }
    // The same seed gave the same long-term key; with another key nothing verifies.
    let other = chime_keygen();
    let err = chime_roughtime(server.addr, &other.public_base64, Some("0x8000000b"))
        .expect_err("a reply verified under the wrong key");
    assert!(!err.is_empty());
}

/// A load on roughly's server, which batches what arrives within 5 ms: every reply verified
/// (`--verify-every 1`), Merkle paths included.
#[test]
fn chime_perf_verifies_every_reply_of_roughly_server() {
    let key = chime_keygen();
    let server = PeerServer::roughly(&key.seed_hex);
    let dir = tempfile::tempdir().unwrap();
    for version in ["1", "0x8000000b"] {
        let json = dir.path().join(format!("perf-{version}.json"));
        let out = run(Command::new(workspace_bin("chime"))
            .args(["perf", "roughtime", "--target", &server.addr.to_string()])
            .args(["--public-key", &key.public_base64, "--version", version])
            .args(["--rate", "400", "--duration", "1", "--warmup", "0"])
            .args(["--verify-every", "1", "--json"])
            .arg(&json));
        assert!(out.status.success(), "--version {version}: {}", text(&out));
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let step = &report["steps"][0];
        assert_eq!(step["invalid"], 0, "--version {version}: {step}");
        assert!(
            step["verified"].as_u64().unwrap() >= 300,
            "--version {version}: {step}"
        );
        assert!(
            step["merkle_path"]["max"].as_u64().unwrap() >= 1,
            "--version {version}: no reply came from a batch of two or more: {step}"
        );
    }
}

fn chime_verifies_chimed(version: &str, mark: &str) {
    let s = chimed_roughtime();
    let r = chime_roughtime(s.addr, &s.key.public_base64, Some(version)).unwrap_or_else(|e| {
        panic!(
            "chime roughtime --version {version} vs chimed: {e}\nchimed log:\n{}",
            s.chimed.log()
        )
    });
    assert_verified(&r, mark, &format!("chime --version {version} vs chimed"));
}

#[test]
fn chime_verifies_chimed_1() {
    chime_verifies_chimed("1", "version 1");
}

#[test]
fn chime_verifies_chimed_0x8000000c() {
    chime_verifies_chimed("0x8000000c", "0x8000000c");
}

#[test]
fn chime_verifies_chimed_0x8000000b() {
    chime_verifies_chimed("0x8000000b", "0x8000000b");
}

#[test]
fn chime_verifies_chimed_0x8000000a() {
    chime_verifies_chimed("0x8000000a", "0x8000000a");
}

#[test]
fn chime_verifies_chimed_0x80000009() {
    chime_verifies_chimed("0x80000009", "0x80000009");
}

#[test]
fn chime_verifies_chimed_0x80000008() {
    chime_verifies_chimed("0x80000008", "0x80000008");
}

#[test]
fn chime_verifies_chimed_google() {
    chime_verifies_chimed("google", "Google");
}

// ---------------------------------------------------------------------------------------------
// Botan 2.19 → chimed, Google's original protocol (Botan speaks nothing else). `botan roughtime`
// exits 0 only for a reply whose signatures and path verified with --pubkey, and prints
// "UTC <microseconds> (+-<radius>us)" with --raw-time. With --chain-file each query's nonce is
// derived from the previous reply, and `botan roughtime_check` re-verifies the whole chain.

fn botan_roughtime(addr: SocketAddr, key_base64: &str, extra: &[&str]) -> Output {
    let botan = peer("BOTAN", BOTAN);
    // Without --chain-file it appends to ./roughtime-chain: keep that out of the source tree.
    let cwd = tempfile::tempdir().unwrap();
    run(Command::new(botan)
        .current_dir(cwd.path())
        .arg("roughtime")
        .arg(format!("--host={addr}"))
        .arg(format!("--pubkey={key_base64}"))
        .args(["--raw-time", "--check-local-clock=0"])
        .args(extra))
}

/// The midpoint (µs since 1970) and radius (µs) in `botan roughtime --raw-time`'s output.
fn botan_time(out: &Output) -> (u64, u64) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed = stdout.lines().find_map(|l| {
        let rest = l.strip_prefix("UTC ")?;
        let (midpoint, radius) = rest.split_once(" (+-")?;
        Some((
            midpoint.trim().parse().ok()?,
            radius.strip_suffix("us)")?.parse().ok()?,
        ))
    });
    parsed.unwrap_or_else(|| panic!("no time in botan's output:\n{}", text(out)))
}

#[test]
fn botan_accepts_chimed_google() {
    let s = chimed_roughtime();
    let out = botan_roughtime(s.addr, &s.key.public_base64, &[]);
    assert!(
        out.status.success(),
        "botan roughtime did not accept chimed's reply:\n{}\nchimed log:\n{}",
        text(&out),
        s.chimed.log()
    );
    let (midpoint, radius) = botan_time(&out);
    assert!(radius > 0, "radius {radius} µs");
    assert_near_now(midpoint as f64 / 1e6, "botan roughtime");
}

#[test]
fn botan_chains_chimed_replies_and_rechecks_the_chain() {
    let s = chimed_roughtime();
    let dir = tempfile::tempdir().unwrap();
    let chain = dir.path().join("chain");
    let chain_arg = format!("--chain-file={}", chain.display());
    let mut previous = 0;
    for i in 0..3 {
        let out = botan_roughtime(s.addr, &s.key.public_base64, &[&chain_arg]);
        assert!(out.status.success(), "query {i}:\n{}", text(&out));
        let (midpoint, _) = botan_time(&out);
        assert!(midpoint >= previous, "query {i}: time went back");
        previous = midpoint;
    }
    let checked = run(Command::new(peer("BOTAN", BOTAN))
        .arg("roughtime_check")
        .arg(&chain));
    assert!(
        checked.status.success(),
        "botan roughtime_check refused the chain of chimed's replies:\n{}",
        text(&checked)
    );
    let verified = String::from_utf8_lossy(&checked.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .count();
    assert_eq!(verified, 3, "{}", text(&checked));

    // The check is not a formality: the same chain with one reply's byte changed is refused.
    // A chain line is "ed25519 <public key> <nonce or blind> <reply>", all base64.
    let lines = std::fs::read_to_string(&chain).unwrap();
    let mut lines: Vec<String> = lines.lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let fields: Vec<&str> = lines[1].split(' ').collect();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut reply = b64.decode(fields[3]).unwrap();
    let last = reply.len() - 1; // inside the last tag's value, whichever tag that is
    reply[last] ^= 0x01;
    lines[1] = format!(
        "{} {} {} {}",
        fields[0],
        fields[1],
        fields[2],
        b64.encode(&reply)
    );
    let tampered = dir.path().join("tampered");
    std::fs::write(&tampered, lines.join("\n") + "\n").unwrap();
    let refused = run(Command::new(peer("BOTAN", BOTAN))
        .arg("roughtime_check")
        .arg(&tampered));
    assert!(
        !refused.status.success(),
        "botan roughtime_check accepted a chain with a changed reply:\n{}",
        text(&refused)
    );
}

#[test]
fn botan_refuses_chimed_reply_with_another_key() {
    let mut s = chimed_roughtime();
    let other = chime_keygen();
    let out = botan_roughtime(s.addr, &other.public_base64, &[]);
    assert!(
        !out.status.success(),
        "botan roughtime accepted chimed's reply with the wrong key:\n{}",
        text(&out)
    );
    // Refused for the key, not for want of a reply: chimed answered it, and the same query with
    // the right key is accepted.
    let said = text(&out);
    assert!(
        said.to_lowercase().contains("public key does not match"),
        "botan's reason: {said}"
    );
    let good = botan_roughtime(s.addr, &s.key.public_base64, &[]);
    assert!(good.status.success(), "{}", text(&good));
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(2));
    // The readiness probe, the refused reply and the accepted one; nothing dropped.
    assert_eq!(count_in(&totals, "answered"), 3, "{totals}");
    assert_eq!(count_in(&totals, "dropped"), 0, "{totals}");
}

// ---------------------------------------------------------------------------------------------
// pyroughtime 1.0.1 → chimed, through tests/pyroughtime_query.py. Its Google mode sends a
// headerless request that still carries VER 0x80000007: chimed serves it as Google's protocol.
// Its default mode is draft 07 (SHA-512/256 hashes, MJD timestamps, RADI in microseconds).

fn pyroughtime_query(addr: SocketAddr, key_base64: &str, mode: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyroughtime_query.py");
    let out = run(Command::new(peer("PYROUGHTIME_PYTHON", PYROUGHTIME_PYTHON))
        .arg(script)
        .args([&addr.ip().to_string(), &addr.port().to_string()])
        .args([key_base64, mode, "1.5"]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "pyroughtime_query.py printed no JSON ({e}):\n{}",
            text(&out)
        )
    });
    assert_eq!(out.status.success(), r["ok"] == true, "{}", text(&out));
    r
}

/// Grease: pyroughtime 1.0.1 refuses every kind of greased reply, in both its modes (Google's
/// replies carry no nonce, so chimed never greases theirs that way).
#[test]
fn pyroughtime_refuses_greased_replies() {
    let s = chimed_roughtime_with(&["--roughtime-grease", "1"]);
    for mode in ["google", "draft07"] {
        for i in 0..4 {
            let r = pyroughtime_query(s.addr, &s.key.public_base64, mode);
            assert!(
                r["ok"] == false && r["error"] == "verification",
                "{mode} query {i}: pyroughtime accepted a greased reply, or got none: {r}"
            );
        }
    }
}

#[test]
fn pyroughtime_accepts_chimed_google() {
    let s = chimed_roughtime();
    let r = pyroughtime_query(s.addr, &s.key.public_base64, "google");
    assert_eq!(
        r["ok"],
        true,
        "pyroughtime (Google mode) did not accept chimed's reply: {r}\nchimed log:\n{}",
        s.chimed.log()
    );
    assert!(r["radius_us"].as_u64().is_some_and(|r| r > 0), "{r}");
    assert_near_now(
        r["midpoint_us"].as_f64().unwrap() / 1e6,
        "pyroughtime google",
    );
}

#[test]
fn pyroughtime_accepts_chimed_draft07() {
    let mut s = chimed_roughtime();
    let r = pyroughtime_query(s.addr, &s.key.public_base64, "draft07");
    assert_eq!(
        r["ok"],
        true,
        "pyroughtime (draft 07) did not accept chimed's reply: {r}\nchimed log:\n{}",
        s.chimed.log()
    );
    // RADI counts microseconds in draft 07: chimed's radius here is the mirrored chronyd's
    // root distance, well under a second, not the 3 s floor of the later drafts.
    let radius_us = r["radius_us"].as_u64().unwrap_or(0);
    assert!(radius_us > 0 && radius_us < 3_000_000, "{r}");
    assert_near_now(
        r["midpoint_us"].as_f64().unwrap() / 1e6,
        "pyroughtime draft 07",
    );
    assert!(s.chimed.terminate().success());
    let totals = s
        .chimed
        .wait_for("roughtime totals at exit", Duration::from_secs(1));
    assert!(totals.contains("version.0x80000007=1"), "{totals}");
}

/// pyroughtime's draft 07 server, run by tests/pyroughtime_server.py: its port and public key.
struct PyroughtimeServer {
    child: std::process::Child,
    addr: SocketAddr,
    public_key: String,
}

impl PyroughtimeServer {
    fn start() -> Self {
        use std::io::BufRead as _;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyroughtime_server.py");
        let mut child = Command::new(peer("PYROUGHTIME_PYTHON", PYROUGHTIME_PYTHON))
            .arg(script)
            // It takes MIDP and its delegation from the local time zone's clock.
            .env("TZ", "UTC")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("pyroughtime_server.py");
        // The line comes once the socket is bound, or the script exits and the pipe closes.
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            let _ = child.kill();
            panic!("pyroughtime_server.py printed {line:?}: {e}")
        });
        let port = v["port"].as_u64().and_then(|p| u16::try_from(p).ok());
        let port = port.unwrap_or_else(|| panic!("pyroughtime_server.py: {v}"));
        Self {
            child,
            addr: ([127, 0, 0, 1], port).into(),
            public_key: v["public_key"].as_str().unwrap().to_owned(),
        }
    }
}

impl Drop for PyroughtimeServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn chime_verifies_pyroughtime_server_draft07() {
    let server = PyroughtimeServer::start();
    let r = chime_roughtime(server.addr, &server.public_key, Some("0x80000007"))
        .unwrap_or_else(|e| panic!("chime roughtime against pyroughtime's draft 07 server: {e}"));
    assert_verified(&r, "0x80000007", "pyroughtime server draft 07");
    // pyroughtime's default radius, 100 ms, in draft 07's microseconds.
    assert_eq!(r["radius_us"], 100_000, "{r}");
    // Another key fails verification.
    let other = chime_keygen();
    let err = chime_roughtime(server.addr, &other.public_base64, Some("0x80000007"))
        .expect_err("chime accepted pyroughtime's reply with the wrong key");
    assert!(err.contains("verif") || err.contains("signature"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The wrong public key must fail, with a non-zero exit and a reason.

#[test]
fn chime_refuses_roughenough_server_with_wrong_key() {
    let key = chime_keygen();
    let other = chime_keygen();
    let server = PeerServer::roughenough(&key.seed_hex);
    // chime sends SRV = H(0xff ‖ key) with version 1, and roughenough drops a request whose SRV
    // names another key: what chime reports is no reply.
    let err = chime_roughtime(server.addr, &other.public_base64, None)
        .expect_err("chime roughtime accepted roughenough's reply with the wrong public key");
    assert!(err.contains("no reply"), "{err}");
    // The right key still works, so the failure above was the key's doing.
    chime_roughtime(server.addr, &key.public_base64, None)
        .unwrap_or_else(|e| panic!("right key: {e}\nroughenough log:\n{}", server.log()));
}

/// Drafts 08–09 and Google's protocol send no SRV, so chimed answers and the reply, signed by
/// chimed's key, must fail verification with the other key.
#[test]
fn chime_refuses_chimed_reply_signed_by_another_key() {
    let s = chimed_roughtime();
    let other = chime_keygen();
    for version in ["0x80000008", "google"] {
        let err = match chime_roughtime(s.addr, &other.public_base64, Some(version)) {
            Ok(r) => panic!("chime roughtime --version {version} accepted the wrong key: {r}"),
            Err(e) => e,
        };
        assert!(
            err.contains("does not verify"),
            "--version {version}: {err}"
        );
    }
    // With version 1 it sends SRV for the other key, and chimed drops the request.
    let err = chime_roughtime(s.addr, &other.public_base64, Some("1"))
        .expect_err("chime roughtime --version 1 accepted a reply with the wrong key");
    assert!(err.contains("no reply"), "--version 1: {err}");
}

// ---------------------------------------------------------------------------------------------
// chime roughtime's chained form across independent servers: each nonce derived from the previous
// reply, and a server whose signed time contradicts causal order reported as such.

fn chime_chain(servers: &[String]) -> (Option<i32>, serde_json::Value, String) {
    let out = run(Command::new(workspace_bin("chime"))
        .args(["roughtime", "--json", "--timeout", "2"])
        .args(servers));
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), json, text(&out))
}

#[test]
fn chime_chains_chimed_and_roughenough_and_catches_a_liar() {
    let s = chimed_roughtime();
    let honest_key = chime_keygen();
    let honest = PeerServer::roughenough(&honest_key.seed_hex);
    let chimed = format!("{}@{}", s.key.public_base64, s.addr);
    let roughenough = format!("{}@{}", honest_key.public_base64, honest.addr);

    let (code, json, all) = chime_chain(&[chimed.clone(), roughenough.clone(), chimed.clone()]);
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(json["consistent"], true, "{json}");
    assert_eq!(json["servers"].as_array().map(Vec::len), Some(3), "{json}");

    // An hour slow, answering after chimed: its latest possible time is before chimed's earliest.
    let liar_key = chime_keygen();
    let liar = PeerServer::roughenough_with(&liar_key.seed_hex, &["--fixed-offset=-3600"]);
    let liar = format!("{}@{}", liar_key.public_base64, liar.addr);
    let (code, json, all) = chime_chain(&[chimed, roughenough, liar]);
    assert_eq!(code, Some(1), "{all}");
    assert_eq!(json["consistent"], false, "{json}");
    let pairs = json["contradictions"].as_array().unwrap();
    assert!(
        pairs.iter().all(|p| p[1] == 2),
        "only the liar contradicts: {json}"
    );
    assert_eq!(pairs.len(), 2, "{json}");
}

// ---------------------------------------------------------------------------------------------
// Malfeasance reports (RFC 10049 §8.4.1) across implementations: chime writes them and roughly's
// checker (roughly.ecosystem.confirm_malfeasance, through tests/roughly_report.py) judges them;
// roughly writes them and chime checks them.

fn roughly_report(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/roughly_report.py");
    let out = run(Command::new(roughly_python()).arg(script).args(args));
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("roughly_report.py printed no JSON ({e}):\n{}", text(&out)))
}

fn chime_check_report(report: &Path, extra: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = run(Command::new(workspace_bin("chime"))
        .args(["roughtime", "--json", "--check-report"])
        .arg(report)
        .args(extra));
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), json, text(&out))
}

/// chimed, an honest roughenough-server and one an hour slow, as KEY@ADDR specs.
struct ThreeServers {
    chimed: String,
    honest: String,
    liar: String,
    _servers: (RoughtimeChimed, PeerServer, PeerServer),
}

fn three_servers() -> ThreeServers {
    let s = chimed_roughtime();
    let honest_key = chime_keygen();
    let honest = PeerServer::roughenough(&honest_key.seed_hex);
    let liar_key = chime_keygen();
    let liar = PeerServer::roughenough_with(&liar_key.seed_hex, &["--fixed-offset=-3600"]);
    ThreeServers {
        chimed: format!("{}@{}", s.key.public_base64, s.addr),
        honest: format!("{}@{}", honest_key.public_base64, honest.addr),
        liar: format!("{}@{}", liar_key.public_base64, liar.addr),
        _servers: (s, honest, liar),
    }
}

#[test]
fn chime_reports_are_judged_alike_by_roughly_and_by_chime() {
    let t = three_servers();
    let dir = tempfile::tempdir().unwrap();

    let honest = dir.path().join("honest.json");
    let out = run(Command::new(workspace_bin("chime"))
        .args(["roughtime", "--timeout", "2", "--report"])
        .arg(&honest)
        .args([&t.chimed, &t.honest, &t.chimed]));
    assert!(out.status.success(), "{}", text(&out));
    let r = roughly_report(&["check".as_ref(), honest.as_os_str()]);
    assert_eq!(r, serde_json::json!({"valid": true, "malfeasance": false}));
    let (code, json, all) = chime_check_report(&honest, &[]);
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(json["consistent"], true, "{json}");
    assert_eq!(json["servers"].as_array().map(Vec::len), Some(3), "{json}");

    let lie = dir.path().join("lie.json");
    let out = run(Command::new(workspace_bin("chime"))
        .args(["roughtime", "--timeout", "2", "--report"])
        .arg(&lie)
        .args([&t.chimed, &t.honest, &t.liar]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = roughly_report(&["check".as_ref(), lie.as_os_str()]);
    assert_eq!(r, serde_json::json!({"valid": true, "malfeasance": true}));
    let (code, json, all) = chime_check_report(&lie, &[]);
    assert_eq!(code, Some(1), "{all}");
    assert!(all.contains("proves that servers contradict"), "{all}");
    assert_eq!(json["contradictions"], serde_json::json!([[0, 2], [1, 2]]));

    // A report is evidence: never overwritten, and refused before any query is made.
    let before = std::fs::read(&lie).unwrap();
    let out = run(Command::new(workspace_bin("chime"))
        .args(["roughtime", "--timeout", "2", "--report"])
        .arg(&lie)
        .arg(&t.chimed));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("never overwritten"), "{}", text(&out));
    assert_eq!(std::fs::read(&lie).unwrap(), before);

    // Another rand in the last entry breaks the chain, for both checkers.
    let mut report: serde_json::Value = serde_json::from_slice(&before).unwrap();
    report["responses"][2]["rand"] = serde_json::json!(base64_of(&[7u8; 32]));
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, serde_json::to_vec(&report).unwrap()).unwrap();
    let r = roughly_report(&["check".as_ref(), broken.as_os_str()]);
    assert_eq!(r["valid"], false, "{r}");
    let (code, _, all) = chime_check_report(&broken, &[]);
    assert_eq!(code, Some(1), "{all}");
    assert!(all.contains("not derived from reply 1"), "{all}");
}

#[test]
fn chime_checks_reports_roughly_wrote() {
    let t = three_servers();
    let dir = tempfile::tempdir().unwrap();
    for (name, chain, contradictions) in [
        (
            "honest",
            [&t.chimed, &t.honest, &t.chimed],
            serde_json::json!([]),
        ),
        (
            "lie",
            [&t.chimed, &t.honest, &t.liar],
            serde_json::json!([[0, 2], [1, 2]]),
        ),
    ] {
        let file = dir.path().join(format!("{name}.json"));
        let mut args: Vec<&std::ffi::OsStr> = vec!["make".as_ref(), file.as_os_str()];
        args.extend(chain.iter().map(|s| std::ffi::OsStr::new(s.as_str())));
        assert_eq!(roughly_report(&args)["written"], 3);
        let (code, json, all) = chime_check_report(&file, &[]);
        let expect_code = if name == "honest" { 0 } else { 1 };
        assert_eq!(code, Some(expect_code), "{name}: {all}");
        assert_eq!(json["contradictions"], contradictions, "{name}: {json}");
    }
}

/// RFC 10049 Appendix B (byte-identical to draft 19's): three servers, the first of which signed
/// a time after the other two's latest. Signed with the drafts' context spelling.
#[test]
fn chime_checks_the_rfc_appendix_b_report() {
    let vector = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../chime-roughtime/testdata/draft19-appendixB-malfeasance.json");
    let (code, _, all) = chime_check_report(&vector, &[]);
    assert_eq!(code, Some(1), "{all}");
    assert!(all.contains("drafts' context"), "{all}");
    let (code, json, all) = chime_check_report(&vector, &["--accept-draft-spelling"]);
    assert_eq!(code, Some(1), "{all}");
    assert!(all.contains("proves that servers contradict"), "{all}");
    assert_eq!(json["contradictions"], serde_json::json!([[0, 1], [0, 2]]));
    assert_eq!(
        json["servers"][0]["version"], "RFC 10049 (version 1)",
        "{json}"
    );
}

// ---------------------------------------------------------------------------------------------
// Server lists (RFC 10049 §8): `chime roughtime --servers` measuring across independent servers,
// each asked in the version and over the transport its entry names.

/// One server of a list: its name, `version` number, key as written (base64 or hex), and one
/// address with its protocol.
fn listed(name: &str, version: u32, key: &str, protocol: &str, addr: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "version": version,
        "publicKeyType": "ed25519",
        "publicKey": key,
        "addresses": [{ "protocol": protocol, "address": addr }],
    })
}

fn write_list(dir: &Path, servers: &[serde_json::Value]) -> PathBuf {
    let path = dir.join("servers.json");
    let list = serde_json::json!({ "servers": servers, "reports": "http://127.0.0.1:9/r" });
    std::fs::write(&path, list.to_string()).unwrap();
    path
}

/// `chime roughtime --json --servers LIST` with `extra` flags: exit code, outcome, all output.
fn measure_list(list: &Path, extra: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = run(Command::new(workspace_bin("chime"))
        .args(["roughtime", "--json", "--timeout", "1", "--servers"])
        .arg(list)
        .args(extra));
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), json, text(&out))
}

/// chimed (over TCP), roughenough-server (version 1, its key in hex), roughly's server (offered
/// 0x8000000c) and Cloudflare's test server (offered draft 11, the only versions it serves but
/// Google's), and an address where nothing answers, all five chosen: the chain runs through the
/// four across three versions and two transports, names the dead one, and its report passes
/// `chime roughtime --check-report` and roughly's checker.
#[test]
fn a_list_of_independent_servers_chains_past_a_dead_one() {
    let chimed = chimed_roughtime();
    let (rn_key, ry_key, cf_key) = (chime_keygen(), chime_keygen(), chime_keygen());
    let roughenough = PeerServer::roughenough(&rn_key.seed_hex);
    let roughly = PeerServer::roughly(&ry_key.seed_hex);
    let cloudflare = PeerServer::cloudflare(&cf_key.seed_hex);
    let dead = format!("127.0.0.1:{}", common::free_udp_port());
    let dir = tempfile::tempdir().unwrap();
    let at = |a: SocketAddr| a.to_string();
    let list = write_list(
        dir.path(),
        &[
            listed(
                "chimed",
                1,
                &chimed.key.public_base64,
                "tcp",
                &at(chimed.addr),
            ),
            listed(
                "roughenough",
                1,
                &rn_key.public_hex,
                "udp",
                &at(roughenough.addr),
            ),
            listed(
                "roughly",
                0x8000_000c,
                &ry_key.public_base64,
                "udp",
                &at(roughly.addr),
            ),
            listed(
                "cloudflare",
                0x8000_000b,
                &cf_key.public_hex,
                "udp",
                &at(cloudflare.addr),
            ),
            listed("gone", 1, &rn_key.public_base64, "udp", &dead),
        ],
    );
    let report = dir.path().join("report.json");
    let (code, json, all) = measure_list(
        &list,
        &["--count", "5", "--report", report.to_str().unwrap()],
    );
    let logs = || {
        format!(
            "roughly:\n{}\ncloudflare:\n{}",
            roughly.log(),
            cloudflare.log()
        )
    };
    assert_eq!(code, Some(0), "{all}\n{}", logs());
    assert_eq!(json["dead"], serde_json::json!(["gone"]), "{json}");
    assert_eq!(json["consistent"], true, "{json}");
    assert_eq!(json["enough"], true, "{json}");
    let answered = json["answered"].as_array().unwrap();
    for name in ["chimed", "roughenough", "roughly", "cloudflare"] {
        let mine: Vec<&serde_json::Value> =
            answered.iter().filter(|a| a["server"] == name).collect();
        assert_eq!(mine.len(), 2, "{name} is not in both passes: {json}");
        for a in mine {
            assert_near_now(a["midpoint_unix_us"].as_f64().unwrap() / 1e6, name);
        }
    }
    let over_tcp = answered.iter().find(|a| a["server"] == "chimed").unwrap();
    assert_eq!(
        over_tcp["address"],
        format!("tcp:{}", chimed.addr),
        "{json}"
    );

    let (code, checked, all) = chime_check_report(&report, &[]);
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(
        checked["servers"].as_array().map(Vec::len),
        Some(8),
        "{checked}"
    );
    let versions: std::collections::BTreeSet<&str> = checked["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["version"].as_str().unwrap())
        .collect();
    assert_eq!(
        versions.len(),
        3,
        "three versions in one chain: {versions:?}"
    );
    let r = roughly_report(&["check".as_ref(), report.as_os_str()]);
    assert_eq!(r, serde_json::json!({"valid": true, "malfeasance": false}));
}

/// An independent server whose clock is an hour ahead (roughenough-server under libfaketime, not
/// a flag of its own), in a list of three live servers with chimed and roughly's server: every
/// run, whatever order the servers are drawn in, exits 1 naming the liar alone as the server in
/// every contradiction, and the report it wrote proves the contradiction to chime's checker and
/// roughly's.
#[test]
fn a_server_an_hour_ahead_under_a_fake_clock_is_named_every_run() {
    let chimed = chimed_roughtime();
    let (ry_key, liar_key) = (chime_keygen(), chime_keygen());
    let roughly = PeerServer::roughly(&ry_key.seed_hex);
    let liar = PeerServer::roughenough_faked(&liar_key.seed_hex, "+1h");
    let dir = tempfile::tempdir().unwrap();
    let list = write_list(
        dir.path(),
        &[
            listed(
                "chimed",
                1,
                &chimed.key.public_base64,
                "udp",
                &chimed.addr.to_string(),
            ),
            listed(
                "roughly",
                1,
                &ry_key.public_base64,
                "udp",
                &roughly.addr.to_string(),
            ),
            listed(
                "liar",
                1,
                &liar_key.public_hex,
                "udp",
                &liar.addr.to_string(),
            ),
        ],
    );
    for run in 0..5 {
        let report = dir.path().join(format!("proof-{run}.json"));
        let (code, json, all) = measure_list(&list, &["--report", report.to_str().unwrap()]);
        assert_eq!(
            code,
            Some(1),
            "run {run}: an hour ahead went unnoticed: {all}"
        );
        assert_eq!(
            json["suspects"],
            serde_json::json!(["liar"]),
            "run {run}: {json}"
        );
        let contradictions = json["contradictions"].as_array().unwrap();
        assert!(
            contradictions
                .iter()
                .all(|c| c.as_str().unwrap().starts_with("liar (midpoint")),
            "run {run}: the liar answers first and claims the later time: {json}"
        );
        let liar_said = json["answered"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["server"] == "liar")
            .unwrap()["midpoint_unix_us"]
            .as_f64()
            .unwrap();
        let ahead = liar_said / 1e6 - unix_now();
        assert!(
            (3590.0..3610.0).contains(&ahead),
            "run {run}: {ahead} s ahead"
        );
        let (code, _, all) = chime_check_report(&report, &[]);
        assert_eq!(code, Some(1), "run {run}: {all}");
        assert!(all.contains("proves that servers contradict"), "{all}");
        let r = roughly_report(&["check".as_ref(), report.as_os_str()]);
        assert_eq!(
            r,
            serde_json::json!({"valid": true, "malfeasance": true}),
            "run {run}"
        );
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
