//! NTS (RFC 8915) against a real client: chronyd with `nts` runs NTS-KE over TLS 1.3 to chimed,
//! takes its cookies, and synchronises from chimed's authenticated replies on the NTP port that
//! NTS-KE told it. Certificates are made with openssl for 127.0.0.1.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    CHRONYD, Chimed, Chronyd, ChronydClient, RKIK, certificate, chimed_nts, count_in, ke_connect,
    ke_tls, peer, run, try_ke_connect, try_ke_tls,
};

/// `chronyd -Q` as an NTS client of 127.0.0.1 with NTS-KE on `ke_port`, trusting `trusted`:
/// the offset it measured, or its output if it measured nothing. It gives up after 8 s, or 3 when
/// the test expects it to fail.
fn chronyd_nts_offset(ke_port: u16, trusted: &Path, trusted_is_right: bool) -> Result<f64, String> {
    let server = format!("server 127.0.0.1 iburst nts ntsport {ke_port} maxsamples 4");
    let trust = [format!("ntstrustedcerts {}", trusted.display())];
    common::chronyd_measure(&server, &trust, if trusted_is_right { 8 } else { 3 })
}

#[test]
fn chronyd_synchronises_over_nts_from_chimed() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let offset =
        chronyd_nts_offset(ke_port, &cert, true).expect("chronyd measured nothing over NTS");
    assert!(offset.abs() < 1e-3, "offset {offset}");
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "nts") > 0, "{totals}");
    assert_eq!(count_in(&totals, "nts_nak"), 0, "NAKs: {totals}");
    let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert!(ke.contains("agreed=1 refused=0"), "{ke}");
}

/// rkik 2.2.4 (crates.io), an NTS client of its own (rkik-nts, after ntpd-rs), against chimed:
/// trusting chimed's certificate (through `SSL_CERT_FILE`), it runs NTS-KE, takes the NTP port
/// chimed names there, and gets an authenticated reply near our clock; trusting another
/// certificate, it refuses the handshake and exits non-zero.
#[test]
fn rkik_queries_chimed_over_nts() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "chimed");
    let (other, _) = certificate(dir.path(), "other");
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let ntp_port = chimed.logged_addr("ntp listening on ").port();
    let rkik = |trusted: &Path| {
        run(Command::new(peer("RKIK", RKIK))
            .args([
                "ntp",
                "127.0.0.1",
                "--nts",
                "--nts-port",
                &ke_port.to_string(),
            ])
            .args(["--json", "--count", "1", "--timeout", "2", "--no-color"])
            .env("SSL_CERT_FILE", trusted))
    };
    let out = rkik(&cert);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "rkik: {said}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect(&said);
    let r = &json["results"][0];
    assert_eq!(r["authenticated"], true, "{said}");
    assert_eq!(r["port"], ntp_port, "the NTP port NTS-KE named: {said}");
    assert!(r["offset_ms"].as_f64().unwrap().abs() < 100.0, "{said}");

    let out = rkik(&other);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && said.contains("NTS-KE failed"),
        "rkik trusting another certificate: {said}"
    );
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(
        count_in(&totals, "nts") == 1,
        "one authenticated reply: {totals}"
    );
}

/// ntpd-rs 1.9.0's daemon, an NTS client of its own that offers AEAD_AES_SIV_CMAC_512 first, runs
/// NTS-KE with chimed, agrees on that algorithm, and polls it with authenticated requests: its
/// status shows the source with an offset and a full set of cookies, and chimed answered every
/// request, NAKing none. With one
/// source it never sets the clock (it needs three that agree, said explicitly here).
#[test]
fn ntpd_rs_gets_authenticated_time_from_chimed() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "chimed");
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let source = format!(
        "mode = \"nts\"\naddress = \"localhost:{ke_port}\"\n\
         certificate-authority = \"{}\"\n",
        cert.display()
    );
    // Its first poll follows NTS-KE within seconds; the status shows the offset from then on.
    let synced = |s: &str, _: &str| common::has_offset(s) && s.contains("[NTS]");
    let (seen, _) = common::ntpd_rs(dir.path(), &source, synced);
    assert!(seen.contains("NTS cookies:\t\t8/8"), "{seen}");
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "nts") >= 1, "{totals}");
    assert_eq!(count_in(&totals, "nts_nak"), 0, "{totals}");
    // ntpd-rs offers AEAD_AES_SIV_CMAC_512 first, and took it.
    let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert_eq!(
        count_in(&ke, "agreed.aead17"),
        count_in(&ke, "agreed"),
        "{ke}"
    );
    assert!(count_in(&ke, "agreed") >= 1, "{ke}");
}

#[test]
fn chronyd_refuses_a_server_it_does_not_trust() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let (other, _) = certificate(dir.path(), "other");
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let result = chronyd_nts_offset(ke_port, &other, false);
    assert!(
        result.is_err(),
        "chronyd trusted a certificate it was not given: {result:?}"
    );
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(
        count_in(&totals, "nts"),
        0,
        "NTS replies without NTS-KE: {totals}"
    );
    let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert!(ke.contains("agreed=0") && !ke.contains("failed=0"), "{ke}");
}

/// The files `bad_nts_settings_exit_2_naming_them` points chimed at, each a path as a string;
/// the directory holding them lives as long as this does.
struct BadNtsFiles {
    _dir: tempfile::TempDir,
    cert: String,
    key: String,
    garbage: String,
    /// A PEM certificate block whose bytes are not X.509, mode 0600.
    not_x509: String,
    /// The private key of another certificate.
    other_key: String,
    open_key: String,
    open_dump: String,
    open_fleet: String,
    short_fleet: String,
    missing_fleet: String,
}

fn bad_nts_files() -> BadNtsFiles {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let not_x509 = dir.path().join("not-x509.pem");
    let armoured = "-----BEGIN CERTIFICATE-----\nMIIBzz==\n-----END CERTIFICATE-----\n";
    std::fs::write(&not_x509, armoured).unwrap();
    std::fs::set_permissions(&not_x509, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (_, other_key) = certificate(dir.path(), "other");
    let open_key = dir.path().join("open.key");
    std::fs::copy(&key, &open_key).unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    // A dump directory whose key file others may read.
    let open_dump = dir.path().join("open-dump");
    std::fs::create_dir(&open_dump).unwrap();
    let keys = open_dump.join("nts-cookie-keys");
    std::fs::write(&keys, "made 1\n").unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Fleet secret files: one others may read, one with a short secret.
    let open_fleet = dir.path().join("open-fleet");
    std::fs::write(&open_fleet, format!("secret {}\n", "00".repeat(32))).unwrap();
    std::fs::set_permissions(&open_fleet, std::fs::Permissions::from_mode(0o644)).unwrap();
    let short_fleet = dir.path().join("short-fleet");
    std::fs::write(&short_fleet, "# a comment\nsecret 0123\n").unwrap();
    std::fs::set_permissions(&short_fleet, std::fs::Permissions::from_mode(0o600)).unwrap();
    let missing = dir.path().join("no-such-fleet");
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    BadNtsFiles {
        cert: s(&cert),
        key: s(&key),
        garbage: s(&garbage),
        not_x509: s(&not_x509),
        other_key: s(&other_key),
        open_key: s(&open_key),
        open_dump: s(&open_dump),
        open_fleet: s(&open_fleet),
        short_fleet: s(&short_fleet),
        missing_fleet: s(&missing),
        _dir: dir,
    }
}

/// Bad `--nts-fleet-key` settings, each with what chimed's one line of error must contain.
fn bad_fleet_key_cases(f: &BadNtsFiles) -> Vec<(Vec<&str>, String)> {
    let (c, k, od) = (f.cert.as_str(), f.key.as_str(), f.open_dump.as_str());
    let (of, sf, mf) = (
        f.open_fleet.as_str(),
        f.short_fleet.as_str(),
        f.missing_fleet.as_str(),
    );
    let short_without_certificate =
        format!("--nts-fleet-key: {sf}: line 2: the secret is 4 hex digits, not 64");
    [
        // Checked without a certificate too: a member may serve NTP only.
        (
            vec!["--nts-fleet-key", sf],
            short_without_certificate.as_str(),
        ),
        (
            vec![
                "--nts-certificate",
                c,
                "--nts-private-key",
                k,
                "--nts-fleet-key",
                of,
            ],
            "open-fleet: readable by group or others (mode 0644); it holds the NTS fleet secret",
        ),
        (
            vec![
                "--nts-certificate",
                c,
                "--nts-private-key",
                k,
                "--nts-fleet-key",
                sf,
            ],
            "short-fleet: line 2: the secret is 4 hex digits, not 64",
        ),
        (
            vec![
                "--nts-certificate",
                c,
                "--nts-private-key",
                k,
                "--nts-fleet-key",
                mf,
            ],
            "no-such-fleet: no such file (chime nts-fleet-key makes one)",
        ),
        (
            vec![
                "--nts-certificate",
                c,
                "--nts-private-key",
                k,
                "--nts-fleet-key",
                sf,
                "--nts-dump-dir",
                od,
            ],
            "--nts-fleet-key: not with --nts-dump-dir",
        ),
    ]
    .into_iter()
    .map(|(args, needle)| (args, needle.to_owned()))
    .collect()
}

/// Bad certificate, key, dump directory and rate-limit settings, each with what chimed's one
/// line of error must contain.
fn bad_nts_cases(f: &BadNtsFiles) -> Vec<(Vec<&str>, String)> {
    let (c, k, g, o) = (
        f.cert.as_str(),
        f.key.as_str(),
        f.garbage.as_str(),
        f.open_key.as_str(),
    );
    let (x, k2) = (f.not_x509.as_str(), f.other_key.as_str());
    // Each names the setting whose file is at fault, the file, and the problem.
    let open = format!("--nts-private-key: {o}: readable by everyone");
    let not_x509 = format!("--nts-certificate: {x}: certificate 1 of the chain is not X.509");
    let no_key = format!("--nts-private-key: {x}: no private key in it");
    let mismatch =
        format!("--nts-private-key: {k2}: the private key is not the certificate's ({c})");
    let (od, nd) = (f.open_dump.as_str(), f.garbage.as_str());
    [
        (vec!["--nts-certificate", c], "--nts-private-key: missing"),
        (vec!["--nts-private-key", k], "--nts-certificate: missing"),
        (
            vec!["--nts-certificate", g, "--nts-private-key", k],
            "garbage.pem: no certificate",
        ),
        (vec!["--nts-certificate", c, "--nts-private-key", o], &open),
        (
            vec!["--nts-certificate", x, "--nts-private-key", k],
            &not_x509,
        ),
        (
            vec!["--nts-certificate", c, "--nts-private-key", x],
            &no_key,
        ),
        (
            vec!["--nts-certificate", c, "--nts-private-key", k2],
            &mismatch,
        ),
        (
            vec!["--nts-ke-address", "127.0.0.1:4460"],
            "--nts-ke-address: only takes effect",
        ),
        (
            vec!["--nts-dump-dir", od],
            "--nts-dump-dir: only takes effect",
        ),
        (
            vec!["--nts-ratelimit"],
            "--nts-ratelimit: only takes effect",
        ),
        (
            vec!["--nts-ratelimit-burst", "3"],
            "--nts-ratelimit-burst: only takes effect with --nts-ratelimit",
        ),
        (
            vec![
                "--nts-certificate",
                c,
                "--nts-private-key",
                k,
                "--nts-ratelimit",
                "--nts-ratelimit-interval",
                "13",
            ],
            "--nts-ratelimit-interval: must be -19 to 12, not 13",
        ),
        (
            vec![
                "--nts-certificate",
                c,
                "--nts-private-key",
                k,
                "--nts-dump-dir",
                nd,
            ],
            "garbage.pem: not a directory",
        ),
        (
            vec![
                "--nts-certificate",
                c,
                "--nts-private-key",
                k,
                "--nts-dump-dir",
                od,
            ],
            "nts-cookie-keys: readable by group or others (mode 0644)",
        ),
    ]
    .into_iter()
    .map(|(args, needle)| (args, needle.to_owned()))
    .collect()
}

#[test]
fn bad_nts_settings_exit_2_naming_them() {
    let f = bad_nts_files();
    let mut cases = bad_fleet_key_cases(&f);
    cases.extend(bad_nts_cases(&f));
    for (args, needle) in cases {
        let mut argv = args.clone();
        argv.push("--check-config");
        let out = run(Command::new(common::workspace_bin("chimed")).args(&argv));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle.as_str()), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    }
    let (c, k) = (f.cert.as_str(), f.key.as_str());
    let out = run(Command::new(common::workspace_bin("chimed")).args([
        "--nts-certificate",
        c,
        "--nts-private-key",
        k,
        "--check-config",
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// chronyd as a long-running NTS client of 127.0.0.1 with NTS-KE on `ke_port`, trusting
/// `cert`, polling four times a second.
fn nts_client(ke_port: u16, cert: &Path) -> ChronydClient {
    ChronydClient::start(&[
        format!("server 127.0.0.1 nts ntsport {ke_port} minpoll -2 maxpoll -2"),
        format!("ntstrustedcerts {}", cert.display()),
    ])
}

/// With one key kept, cookies die two key rotations after they were sealed. A chronyd polling
/// four times a second against chimed rotating every second soon spends one that old, gets an
/// NTS NAK, runs NTS-KE again, and goes on measuring.
#[test]
fn a_nak_sends_chronyd_back_to_nts_ke_and_it_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let chronyd = Chronyd::start();
    let dump = dir.path().to_str().unwrap();
    let (mut chimed, ke_port) = chimed_nts(
        &chronyd,
        &cert,
        &key,
        &[
            "--nts-rotation",
            "1",
            "--nts-kept-keys",
            "1",
            "--nts-dump-dir",
            dump,
        ],
    );
    let client = nts_client(ke_port, &cert);
    // Four a second: 18 measurements take about 4.5 s, past two rotations of every cookie the
    // client started with. Bounded at 20 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client.measured() < 18 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let measured = client.measured();
    drop(client);
    assert!(measured >= 18, "chronyd stopped measuring: {measured}");
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "nts_nak") > 0, "no NAK: {totals}");
    // Each for a cookie whose key had rotated out.
    let unknown_key = count_in(&totals, "nts_nak.unknown_key");
    assert_eq!(unknown_key, count_in(&totals, "nts_nak"), "{totals}");
    let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    let agreed: u32 = ke
        .split("agreed=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        agreed >= 2,
        "chronyd did not come back for new cookies: {ke}"
    );
    // Every rotation was saved (--nts-dump-dir): the file holds the last key logged.
    let log = chimed.log();
    let last = log
        .lines()
        .rev()
        .find_map(|l| l.split("cookie key rotated (id ").nth(1))
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no rotation logged: {log}"));
    let saved = std::fs::read_to_string(dir.path().join("nts-cookie-keys")).unwrap();
    assert!(
        saved.contains(&format!("\ncurrent {last} ")),
        "the log's last rotation was to {last}, the saved file's current key is another"
    );
}

/// A chimed rotating its cookie key every 0.2 s (with `extra` flags) while a chronyd polls it
/// four times a second over NTS, for 24 measurements or at most `secs`: the measurements, and the
/// NTP and NTS-KE totals at exit. A cookie chronyd spends was handed out eight polls before (it
/// holds eight), so it is about 2 s, ten rotations, old.
fn spent_at_ten_rotations_old(extra: &[&str], secs: u64) -> (usize, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let chronyd = Chronyd::start();
    let mut flags = vec!["--nts-rotation", "0.2"];
    flags.extend_from_slice(extra);
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &flags);
    let client = nts_client(ke_port, &cert);
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while client.measured() < 24 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let measured = client.measured();
    drop(client);
    assert!(chimed.terminate().success());
    (
        measured,
        chimed.wait_for("ntp totals at exit", Duration::from_secs(1)),
        chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1)),
    )
}

/// Cookies last the rotations kept past their own: with the default 21 keys kept (three weeks of
/// daily rotations, scaled down here to 0.2 s ones), cookies ten rotations old all open and the
/// client never comes back to NTS-KE; with four kept, the same cookies name keys rotated out and
/// get NAKs, counted as such.
#[test]
fn cookies_open_for_the_rotations_kept() {
    let (measured, ntp, ke) = spent_at_ten_rotations_old(&[], 25);
    assert!(measured >= 24, "chronyd stopped measuring: {measured}");
    assert!(count_in(&ntp, "nts") >= 24, "{ntp}");
    assert_eq!(
        count_in(&ntp, "nts_nak"),
        0,
        "a kept key's cookie did not open: {ntp}"
    );
    assert_eq!(
        count_in(&ke, "agreed"),
        1,
        "chronyd came back for cookies: {ke}"
    );

    // Over 6 s, past twenty rotations.
    let (_, ntp, _) = spent_at_ten_rotations_old(&["--nts-kept-keys", "4"], 6);
    let naks = count_in(&ntp, "nts_nak");
    assert!(
        naks > 0,
        "no NAK for cookies older than the keys kept: {ntp}"
    );
    assert_eq!(count_in(&ntp, "nts_nak.unknown_key"), naks, "{ntp}");
}

/// chronyd as an NTS server (stratum 2, its own clock) on loopback ports of its own, its files in
/// `dir`: the process, its NTP port and its NTS-KE port. Its NTS-KE starts in a helper process a
/// moment later.
fn chronyd_nts_server(dir: &Path, cert: &Path, key: &Path) -> (std::process::Child, u16, u16) {
    let (ntp_port, ke_port) = (common::free_udp_port(), common::free_udp_port());
    let conf = dir.join("chrony-nts.conf");
    std::fs::write(
        &conf,
        format!(
            "port {ntp_port}\nbindaddress 127.0.0.1\nallow 127.0.0.1\nlocal stratum 2\ncmdport 0\n\
             ntsport {ke_port}\nntsservercert {}\nntsserverkey {}\npidfile {d}/nts.pid\n\
             ntsdumpdir {d}\n",
            cert.display(),
            key.display(),
            d = dir.display()
        ),
    )
    .unwrap();
    let child = Command::new(CHRONYD)
        .args(["-x", "-d", "-u", "root", "-f"])
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (child, ntp_port, ke_port)
}

/// `chime ntp --nts --json` against `spec` (HOST:KE-PORT) trusting `ca`: the report, or the error.
fn chime_ntp_nts(spec: &str, ca: &Path) -> Result<serde_json::Value, String> {
    chime_ntp_nts_offering(spec, ca, "15")
}

/// [`chime_ntp_nts`] offering the AEAD algorithms `aeads` (`--nts-aead`).
fn chime_ntp_nts_offering(spec: &str, ca: &Path, aeads: &str) -> Result<serde_json::Value, String> {
    let out = run(Command::new(common::workspace_bin("chime"))
        .args([
            "ntp",
            "--nts",
            "--json",
            "--timeout",
            "2",
            "--nts-aead",
            aeads,
            "--nts-ca",
        ])
        .arg(ca)
        .arg(spec));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

/// `chime ntp --nts` against chimed and against chronyd's own NTS server, the reference for the
/// client side: both authenticate, return the cookie spent and the two asked for, and name the
/// NTP port NTS-KE gave. An untrusted certificate is refused before any NTP is sent.
#[test]
fn chime_ntp_nts_against_chimed_and_chronyd() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let (other, _) = certificate(dir.path(), "other");
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);

    let (mut nts_chronyd, ntp_port, chronyd_ke) = chronyd_nts_server(dir.path(), &cert, &key);

    let ours = chime_ntp_nts(&format!("127.0.0.1:{ke_port}"), &cert).unwrap();
    assert_eq!(ours["nts"]["cookies"], 3, "{ours}");
    assert_eq!(ours["stratum"], 3, "{ours}");
    assert_eq!(
        ours["server"],
        chimed.addr.to_string(),
        "the port NTS-KE named: {ours}"
    );
    common::assert_offset_near(&ours, 0.0);

    // chronyd's NTS-KE starts in a helper process: retry briefly until it answers.
    let spec = format!("127.0.0.1:{chronyd_ke}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let theirs = loop {
        match chime_ntp_nts(&spec, &cert) {
            Ok(r) => break r,
            Err(e) if std::time::Instant::now() > deadline => panic!("chronyd over NTS: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let _ = nts_chronyd.kill();
    let _ = nts_chronyd.wait();
    assert_eq!(theirs["nts"]["cookies"], 3, "{theirs}");
    assert_eq!(theirs["stratum"], 2, "{theirs}");
    assert_eq!(
        theirs["server"],
        format!("127.0.0.1:{ntp_port}"),
        "{theirs}"
    );

    let refused = chime_ntp_nts(&format!("127.0.0.1:{ke_port}"), &other).unwrap_err();
    assert!(refused.contains("certificate"), "{refused}");
    // Said so that the operator knows what to do: one line, naming the flag that trusts it.
    assert!(refused.contains("not trusted"), "{refused}");
    assert!(refused.contains("--nts-ca FILE"), "{refused}");
    assert_eq!(refused.trim_end().lines().count(), 1, "{refused}");
    assert!(chimed.terminate().success());
    let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert!(ke.contains("agreed=1 refused=0"), "{ke}");
}

/// chimed serves each AEAD algorithm, the client's first that it serves: AEAD_AES_SIV_CMAC_512
/// (17, ntpd-rs's first) and AEAD_AES_128_GCM_SIV (30, chrony's first) as well as the mandatory
/// 15; the reply authenticates under the keys of the one agreed. chronyd 4.3, an independent
/// server that serves 15 alone, takes 15 from the same offers, and refuses an offer without it.
#[test]
fn nts_agrees_on_the_clients_first_aead_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let spec = format!("127.0.0.1:{ke_port}");
    for (offer, agreed) in [
        ("17", 17),
        ("30", 30),
        ("gcm-siv,siv-cmac-256", 30),
        ("15,17,30", 15),
    ] {
        let report = chime_ntp_nts_offering(&spec, &cert, offer);
        let report = report.unwrap_or_else(|e| panic!("{offer}: {e}"));
        assert_eq!(report["nts"]["aead"], agreed, "{offer}: {report}");
        assert_eq!(report["nts"]["cookies"], 3, "{offer}: {report}");
    }

    let (mut nts_chronyd, _, chronyd_ke) = chronyd_nts_server(dir.path(), &cert, &key);
    let theirs = format!("127.0.0.1:{chronyd_ke}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let taken = loop {
        match chime_ntp_nts_offering(&theirs, &cert, "17,30,15") {
            Ok(r) => break r,
            Err(e) if std::time::Instant::now() > deadline => panic!("chronyd over NTS: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let refused = chime_ntp_nts_offering(&theirs, &cert, "17");
    let _ = nts_chronyd.kill();
    let _ = nts_chronyd.wait();
    assert_eq!(taken["nts"]["aead"], 15, "{taken}");
    let refused = refused.expect_err("chronyd 4.3 agreed on 17");
    // chronyd answers as RFC 8915 says, with the AEAD record empty, and chime reads it so.
    assert!(
        refused.contains("none of the AEAD algorithms offered"),
        "{refused}"
    );
    assert!(chimed.terminate().success());
    let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert!(ke.contains("agreed=4 refused=0"), "{ke}");
    let by_aead = [15, 17, 30].map(|a| count_in(&ke, &format!("agreed.aead{a}")));
    assert_eq!(by_aead, [1, 1, 2], "{ke}");
}

/// SIGHUP reloads the certificate and key, so a renewal needs no restart; a file that fails to
/// load is reported and the certificate in force is kept.
#[test]
fn sighup_reloads_the_nts_certificate() {
    use nix::sys::signal::{Signal, kill};
    let dir = tempfile::tempdir().unwrap();
    let (a_cert, a_key) = certificate(dir.path(), "a");
    let (b_cert, b_key) = certificate(dir.path(), "b");
    let (cert, key) = (dir.path().join("live.pem"), dir.path().join("live.key"));
    std::fs::copy(&a_cert, &cert).unwrap();
    std::fs::copy(&a_key, &key).unwrap();
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let spec = format!("127.0.0.1:{ke_port}");
    chime_ntp_nts(&spec, &a_cert).expect("the first certificate");

    std::fs::copy(&b_cert, &cert).unwrap();
    std::fs::copy(&b_key, &key).unwrap();
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    chimed.wait_for("SIGHUP: NTS certificate reloaded", Duration::from_secs(5));
    chime_ntp_nts(&spec, &b_cert).expect("the renewed certificate");
    assert!(
        chime_ntp_nts(&spec, &a_cert).is_err(),
        "the old certificate is still served"
    );

    std::fs::write(&cert, "not a certificate\n").unwrap();
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    let warned = chimed.wait_for("keeping the one in force", Duration::from_secs(5));
    assert!(warned.contains("live.pem"), "{warned}");
    chime_ntp_nts(&spec, &b_cert).expect("the certificate in force is kept");
}

/// A renewal after chimed has dropped root (`-u nobody`, whose group is `nogroup`), through the
/// certbot deploy hook this repository ships (`configs/certbot-deploy-chimed`): given certbot's
/// live directory, where the key is `root:root` 0600, it installs the pair as `root:nogroup`
/// (0644 and 0640) and sends the SIGHUP, and chimed serves the renewed certificate. A renewed key
/// left `root:root` 0600, as certbot writes it, cannot be read by the user chimed now runs as, so
/// SIGHUP says why and the pair in force is kept.
#[test]
fn a_renewed_key_reaches_chimed_after_it_dropped_root() {
    use nix::sys::signal::{Signal, kill};
    let dir = tempfile::tempdir().unwrap();
    // nobody must reach the files: the directory is searchable, the certificates readable.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A certbot live directory per certificate: fullchain.pem, and privkey.pem root-only.
    let lineage = |name: &str| {
        let (cert, key) = certificate(dir.path(), name);
        let live = dir.path().join(format!("live-{name}"));
        std::fs::create_dir(&live).unwrap();
        std::fs::copy(&cert, live.join("fullchain.pem")).unwrap();
        std::fs::copy(&key, live.join("privkey.pem")).unwrap();
        std::fs::set_permissions(
            live.join("privkey.pem"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        (cert, live)
    };
    let (a_cert, a_live) = lineage("a");
    let (b_cert, b_live) = lineage("b");
    let (_, c_live) = lineage("c");
    let nts = dir.path().join("nts");
    let (cert, key) = (nts.join("fullchain.pem"), nts.join("privkey.pem"));
    let hook = |live: &Path, reload: &str| {
        let out = common::run(
            Command::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/certbot-deploy-chimed"),
            )
            .env("RENEWED_LINEAGE", live)
            .env("CHIMED_NTS_DIR", &nts)
            .env("CHIMED_GROUP", "nogroup")
            .env("CHIMED_RELOAD", reload),
        );
        assert!(
            out.status.success(),
            "the deploy hook: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    hook(&a_live, "true");
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &["-u", "nobody"]);
    let spec = format!("127.0.0.1:{ke_port}");
    chime_ntp_nts(&spec, &a_cert).expect("the first certificate");
    let status = std::fs::read_to_string(format!("/proc/{}/status", chimed.pid())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        !uid.split_whitespace().skip(1).any(|u| u == "0"),
        "still root: {uid}"
    );

    hook(&b_live, &format!("kill -HUP {}", chimed.pid()));
    chimed.wait_for("SIGHUP: NTS certificate reloaded", Duration::from_secs(5));
    chime_ntp_nts(&spec, &b_cert).expect("the renewed certificate, read as nobody");

    // Renewed without the hook: certbot's root-only key copied over as it is.
    std::fs::copy(c_live.join("fullchain.pem"), &cert).unwrap();
    std::fs::copy(c_live.join("privkey.pem"), &key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    nix::unistd::chown(&key, None, Some(nix::unistd::Gid::from_raw(0))).unwrap();
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    let warned = chimed.wait_for("keeping the one in force", Duration::from_secs(5));
    assert!(
        warned.contains("privkey.pem") && warned.contains("ermission denied"),
        "{warned}"
    );
    chime_ntp_nts(&spec, &b_cert).expect("the pair in force is kept");
}

/// With `--nts-dump-dir`, a restarted chimed opens the cookies its predecessor handed out: a
/// chronyd polling four times a second across the restart gets authenticated replies from the
/// new process with no NAK and no new NTS-KE session. The same restart without the directory
/// costs it a NAK and a new session, which is what the directory is for.
#[test]
fn cookies_outlive_a_restart_with_nts_dump_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let dump = dir.path().join("state");
    std::fs::create_dir(&dump).unwrap();
    let chronyd = Chronyd::start();
    let dump_flags = ["--nts-dump-dir", dump.to_str().unwrap()];
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &dump_flags);
    let ntp_port = chimed.addr.port();
    use std::os::unix::fs::PermissionsExt;
    let saved = dump.join("nts-cookie-keys");
    let mode = std::fs::metadata(&saved).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", saved.display());

    let client = nts_client(ke_port, &cert);
    // Four measurements more than `from`, within 15 s.
    let measure_past = |from: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while client.measured() < from + 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(client.measured() >= from + 4, "chronyd stopped measuring");
        client.measured()
    };
    // A new chimed on the same ports, once the one before has exited: the client keeps the NTP
    // port NTS-KE named, and the address.
    let start_again = |extra: &[&str]| -> Chimed {
        let ntp_addr = format!("127.0.0.1:{ntp_port}");
        let ke_addr = format!("127.0.0.1:{ke_port}");
        let mut args = vec![
            "-a",
            &ntp_addr,
            "--nts-certificate",
            cert.to_str().unwrap(),
            "--nts-private-key",
            key.to_str().unwrap(),
            "--nts-ke-address",
            &ke_addr,
        ];
        args.extend_from_slice(extra);
        let mut next = Chimed::mirroring(&chronyd.addr().to_string(), &args);
        next.wait_for("synchronised: stratum 3", Duration::from_secs(10));
        next
    };
    let exit_totals = |chimed: &mut Chimed| {
        assert!(chimed.terminate().success());
        (
            chimed.wait_for("ntp totals at exit", Duration::from_secs(1)),
            chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1)),
        )
    };

    let n = measure_past(0);
    let (_, ke) = exit_totals(&mut chimed);
    assert_eq!(count_in(&ke, "agreed"), 1, "{ke}");
    let mut chimed = start_again(&dump_flags);
    let log = chimed.log();
    assert!(log.contains("cookie keys read from"), "{log}");
    let n = measure_past(n);
    let (ntp, ke) = exit_totals(&mut chimed);
    assert!(count_in(&ntp, "nts") >= 4, "{ntp}");
    assert_eq!(count_in(&ntp, "nts_nak"), 0, "a cookie did not open: {ntp}");
    assert_eq!(
        count_in(&ke, "agreed"),
        0,
        "chronyd came back for cookies: {ke}"
    );

    // Without the directory, the next process has new keys: a NAK, and a new session.
    let mut chimed = start_again(&[]);
    measure_past(n);
    let (ntp, ke) = exit_totals(&mut chimed);
    drop(client);
    assert!(count_in(&ntp, "nts_nak") >= 1, "{ntp}");
    // Each for a cookie naming a key this process never had.
    let unknown_key = count_in(&ntp, "nts_nak.unknown_key");
    assert_eq!(unknown_key, count_in(&ntp, "nts_nak"), "{ntp}");
    assert_eq!(count_in(&ke, "agreed"), 1, "{ke}");
}

/// Whether chimed's NTS-KE server kept `stream` open for a TLS handshake (`true`) or closed it
/// unserved (`false`), as `--nts-ratelimit` does over the limit at once: a connection still open
/// at `deadline` was kept. A served one stays open for our ClientHello until chimed's 2 s deadline
/// for it, so the deadline (a second) only has to outlast a loaded machine's stalls.
fn ke_kept_open(mut stream: std::net::TcpStream, deadline: std::time::Instant) -> bool {
    use std::io::Read as _;
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .unwrap();
    match stream.read(&mut [0u8; 16]) {
        // Closed (or reset) before we said a word: turned away.
        Ok(0) => false,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => false,
        // Still waiting for our ClientHello.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            true
        }
        other => panic!("unexpected from NTS-KE: {other:?}"),
    }
}

/// The access rules hold for NTS-KE as for NTP and Roughtime: a denied address's connection is
/// closed before any TLS and counted as `denied`, while an allowed one gets a whole NTS exchange.
#[test]
fn nts_ke_closes_a_denied_address_before_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &["--deny", "127.0.0.2"]);
    let ke: std::net::SocketAddr = ([127, 0, 0, 1], ke_port).into();
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    assert!(
        !ke_kept_open(ke_connect(ke, [127, 0, 0, 2].into()), deadline),
        "127.0.0.2 is denied, but its NTS-KE connection was kept open"
    );
    let r = chime_ntp_nts(&ke.to_string(), &cert).expect("chime ntp --nts from 127.0.0.1");
    assert!(r["nts"]["cookies"].as_u64() > Some(0), "{r}");
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "denied"), 1, "{totals}");
    assert_eq!(count_in(&totals, "agreed"), 1, "{totals}");
}

/// `--nts-ratelimit` (chronyd's `ntsratelimit`): a real client is served within its burst; a
/// flood of connections from one address is closed before any TLS, bar the few leaked; another
/// address keeps its own burst; chimed's count of what it turned away is ours exactly. NTS-KE
/// runs on four threads here: one limit holds across them.
#[test]
fn nts_ke_rate_limit_turns_a_flood_away_before_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let chronyd = Chronyd::start();
    let (mut chimed, ke_port) = chimed_nts(
        &chronyd,
        &cert,
        &key,
        &[
            "--nts-ratelimit",
            "--nts-ratelimit-burst",
            "3",
            "--nts-ratelimit-leak",
            "4",
            "--nts-ke-threads",
            "4",
        ],
    );
    chimed.wait_for(
        "nts-ke: rate limiting on: ntsratelimit interval 6 burst 3 leak 4",
        Duration::from_secs(1),
    );
    let ke: std::net::SocketAddr = ([127, 0, 0, 1], ke_port).into();
    // The first connection of 127.0.0.1: a whole NTS exchange.
    let r = chime_ntp_nts(&ke.to_string(), &cert).expect("chime ntp --nts within the burst");
    assert_eq!(r["nts"]["cookies"], 3, "{r}");

    let flood: Vec<_> = (0..30)
        .map(|_| ke_connect(ke, [127, 0, 0, 1].into()))
        .collect();
    let other = ke_connect(ke, [127, 0, 0, 2].into());
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    let flood: Vec<bool> = flood
        .into_iter()
        .map(|c| ke_kept_open(c, deadline))
        .collect();
    let served = flood.iter().filter(|s| **s).count();
    let turned_away = flood.len() - served;
    // Two left of the burst, then one in 16 of the 28 after it leaked: far fewer than half. The
    // burst's two go to the first two connections a thread checks, which with four threads
    // accepting need not be the first two made, but are among the first few.
    let early = flood[..8].iter().filter(|s| **s).count();
    assert!(early >= 2, "{early} of the first 8 served: {flood:?}");
    assert!(
        (2..=10).contains(&served),
        "{served} of 30 served: {flood:?}"
    );
    assert!(
        ke_kept_open(other, deadline),
        "127.0.0.2 was turned away with 127.0.0.1's limit"
    );

    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert_eq!(
        count_in(&totals, "rate_limited"),
        turned_away as u64,
        "{totals}"
    );
    assert_eq!(count_in(&totals, "agreed"), 1, "{totals}");
}

/// `--nts-ntp-server` (chronyd's `ntsntpserver`): NTS-KE on 127.0.0.1 sends clients to NTP on
/// 127.0.0.2, where alone chimed listens; chronyd and `chime ntp --nts` follow the record there.
#[test]
fn nts_ke_names_another_ntp_server() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let chronyd = Chronyd::start();
    let (chimed, ke_port) = chimed_nts(
        &chronyd,
        &cert,
        &key,
        &["-a", "127.0.0.2:0", "--nts-ntp-server", "127.0.0.2"],
    );
    assert_eq!(chimed.addr.ip(), std::net::IpAddr::from([127, 0, 0, 2]));
    let r = chime_ntp_nts(&format!("127.0.0.1:{ke_port}"), &cert).unwrap();
    assert_eq!(r["server"], chimed.addr.to_string(), "{r}");
    assert_eq!(r["nts"]["cookies"], 3, "{r}");
    let offset = chronyd_nts_offset(ke_port, &cert, true)
        .expect("chronyd measured nothing: it did not follow the server record");
    assert!(offset.abs() < 1e-3, "offset {offset}");

    let out = run(Command::new(common::workspace_bin("chimed"))
        .args(common::nts_flags(&cert, &key))
        .args(["--nts-ntp-server", "ntp example", "--check-config"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--nts-ntp-server: \"ntp example\" is not"),
        "{err}"
    );
}

/// Fleet NTS keys (`--nts-fleet-key`): two chimed members hold one fleet secret (made by `chime
/// nts-fleet-key`) and share one NTP port through SO_REUSEPORT, as anycast members share an
/// address; the second has no certificate, so serves NTP only. chronyd, an NTS client, runs
/// NTS-KE with the first member and polls the port; then
/// the first member is stopped, and every later poll reaches the second, which must open the
/// cookies the first sealed: chronyd cannot run NTS-KE again, since only the first served it.
/// Then the secret is replaced (the new one in the file, the old one as `previous`, SIGHUP), and
/// chronyd's cookies from before still open. The second member counts authenticated replies and
/// no NAK.
#[test]
fn a_fleet_member_opens_the_cookies_another_member_sealed() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "fleet");
    let secret = dir.path().join("fleet-secret");
    let made = run(Command::new(common::workspace_bin("chime"))
        .arg("nts-fleet-key")
        .arg(&secret));
    assert!(made.status.success(), "{made:?}");
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Never overwritten.
    let again = run(Command::new(common::workspace_bin("chime"))
        .arg("nts-fleet-key")
        .arg(&secret));
    assert!(!again.status.success());
    let fleet = ["--nts-fleet-key", secret.to_str().unwrap()];
    let (mut first, ke_port) = chimed_nts(&chronyd, &cert, &key, &fleet);
    first.wait_for("derived from the fleet secret", Duration::from_secs(1));
    let ntp = first.addr.to_string();
    // The second member has no certificate: NTP only, with the fleet's cookies.
    let mut joined = fleet.to_vec();
    joined.extend_from_slice(&["-a", &ntp]);
    let mut second = Chimed::mirroring(&chronyd.addr().to_string(), &joined);
    second.wait_for("no certificate, so no NTS-KE here", Duration::from_secs(1));
    second.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    assert_eq!(second.addr, first.addr, "one NTP address for both members");

    let client = ChronydClient::start(&[
        format!("server 127.0.0.1 iburst nts ntsport {ke_port} minpoll -4 maxpoll -4"),
        format!("ntstrustedcerts {}", cert.display()),
    ]);
    let measured_at_least = |n: usize| {
        // 16 polls a second once NTS-KE is done; bounded at 15 s.
        let deadline = Instant::now() + Duration::from_secs(15);
        while client.measured() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        client.measured()
    };
    let before = measured_at_least(3);
    assert!(before >= 3, "chronyd measured {before} times over NTS");
    assert!(first.terminate().success());
    let after = measured_at_least(before + 6);
    assert!(
        after >= before + 6,
        "after the first member stopped chronyd measured {} more times",
        after - before
    );

    // The fleet replaces its secret: the file gets a new one, with the old one as `previous`,
    // and SIGHUP reads it. The cookies chronyd holds were sealed under the old secret; they
    // still open, and the replies hand out cookies under the new one.
    let old_text = std::fs::read_to_string(&secret).unwrap();
    let old_hex = old_text
        .lines()
        .find_map(|l| l.strip_prefix("secret "))
        .unwrap()
        .to_owned();
    let new_secret = dir.path().join("fleet-secret-new");
    let made = run(Command::new(common::workspace_bin("chime"))
        .arg("nts-fleet-key")
        .arg(&new_secret));
    assert!(made.status.success(), "{made:?}");
    let new_text = std::fs::read_to_string(&new_secret).unwrap();
    std::fs::write(&secret, format!("{new_text}previous {old_hex}\n")).unwrap();
    nix::sys::signal::kill(second.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    second.wait_for("SIGHUP: NTS fleet secret reloaded", Duration::from_secs(5));
    let reloaded = client.measured();
    let last = measured_at_least(reloaded + 6);
    assert!(
        last >= reloaded + 6,
        "after the new secret chronyd measured {} more times",
        last - reloaded
    );
    drop(client);
    assert!(second.terminate().success());
    let totals = second.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "nts") >= 12, "{totals}");
    assert_eq!(count_in(&totals, "nts_nak"), 0, "NAKs: {totals}");
}

/// A fleet's two roles on separate members: one serves NTS-KE only (no NTP threads, a
/// certificate, `--nts-ntp-server` naming the other's address and port), the other serves
/// authenticated NTP only (no certificate). Both hold the fleet secret. chronyd runs NTS-KE with
/// the first, follows the server and port records to the second, and synchronises from its
/// replies, which open cookies the first sealed. `chime ntp --nts` is sent to the same place.
#[test]
fn an_nts_ke_member_sends_clients_to_an_ntp_member() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "ke");
    let secret = dir.path().join("fleet-secret");
    let made = run(Command::new(common::workspace_bin("chime"))
        .arg("nts-fleet-key")
        .arg(&secret));
    assert!(made.status.success(), "{made:?}");
    let secret = secret.to_str().unwrap();
    let mut ntp_member =
        Chimed::mirroring(&chronyd.addr().to_string(), &["--nts-fleet-key", secret]);
    ntp_member.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let named = ntp_member.addr.to_string();
    let flags = common::nts_flags(&cert, &key);
    let upstream = chronyd.addr().to_string();
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend_from_slice(&[
        "-s",
        &upstream,
        "-4",
        "0",
        "-6",
        "0",
        "--nts-fleet-key",
        secret,
        "--nts-ntp-server",
        &named,
    ]);
    let mut ke_member = Chimed::start_until(&args, "nts-ke listening on");
    let ke_port = ke_member.logged_addr("nts-ke listening on ").port();
    assert!(!ke_member.log().contains("ntp listening on"), "NTP is off");

    let r = chime_ntp_nts(&format!("127.0.0.1:{ke_port}"), &cert).unwrap();
    assert_eq!(r["server"], named, "{r}");
    let offset = chronyd_nts_offset(ke_port, &cert, true)
        .expect("chronyd measured nothing from the member NTS-KE named");
    assert!(offset.abs() < 1e-3, "offset {offset}");
    assert!(ke_member.terminate().success());
    assert!(ntp_member.terminate().success());
    let totals = ntp_member.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "nts") >= 2, "{totals}");
    assert_eq!(count_in(&totals, "nts_nak"), 0, "NAKs: {totals}");
}

/// `chime perf` with `args` against `target` for four seconds at 500/s, its JSON report in
/// `json`; started, not waited for.
fn perf_load(args: &[&str], target: std::net::SocketAddr, json: &Path) -> std::process::Child {
    Command::new(common::workspace_bin("chime"))
        .arg("perf")
        .args(args)
        .args(["--target", &target.to_string()])
        .args(["--rate", "500", "--duration", "4", "--warmup", "0.2"])
        .arg("--json")
        .arg(json)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `chime` with `args` and then `file`, which must succeed; its standard output.
fn chime_with_file(args: &[&str], file: &Path) -> String {
    let out = run(Command::new(common::workspace_bin("chime"))
        .args(args)
        .arg(file));
    assert!(out.status.success(), "chime {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Replaces `path` whole (written aside, renamed over), as an operator's tooling should.
fn put_whole(path: &Path, text: &str) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, text).unwrap();
    std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

/// A new NTS fleet secret from `chime nts-fleet-key`, in hex.
fn fleet_secret_hex() -> String {
    let file = tempfile::tempdir().unwrap();
    let path = file.path().join("s");
    chime_with_file(&["nts-fleet-key"], &path);
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("secret "))
        .unwrap()
        .to_owned()
}

/// chimed serving NTS, NTP and Roughtime from a delegation bundle (`live`, one of `bundles`)
/// and a fleet secret (`secret`, now `current`) that the test replaces before each SIGHUP.
struct ReloadScene {
    _chronyd: Chronyd,
    _rt_key: common::RoughtimeKey,
    dir: tempfile::TempDir,
    cert: std::path::PathBuf,
    chimed: Chimed,
    ke_port: u16,
    roughtime: std::net::SocketAddr,
    public_key: String,
    bundles: Vec<String>,
    live: std::path::PathBuf,
    secret: std::path::PathBuf,
    current: String,
}

fn reload_scene() -> ReloadScene {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let rt_key = common::chime_keygen();
    let (long_term, public_key) = (rt_key.file.clone(), rt_key.public_base64.clone());
    let bundles: Vec<String> = ["a", "b"]
        .iter()
        .map(|name| {
            let file = dir.path().join(format!("{name}.bundle"));
            let lt = long_term.to_str().unwrap();
            chime_with_file(&["delegate", "--key", lt, "--days", "2", "--out"], &file);
            std::fs::read_to_string(&file).unwrap()
        })
        .collect();
    let live = dir.path().join("live.bundle");
    put_whole(&live, &bundles[0]);
    let secret = dir.path().join("fleet-secret");
    let current = fleet_secret_hex();
    put_whole(&secret, &format!("secret {current}\n"));

    let mut rt =
        common::roughtime_flags_for("--roughtime-delegation", live.to_str().unwrap()).to_vec();
    rt.extend(["--nts-fleet-key", secret.to_str().unwrap()]);
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &rt);
    let roughtime = chimed.roughtime_addr();
    ReloadScene {
        _chronyd: chronyd,
        _rt_key: rt_key,
        dir,
        cert,
        chimed,
        ke_port,
        roughtime,
        public_key,
        bundles,
        live,
        secret,
        current,
    }
}

/// Loads chimed with `chime perf` (plain NTP, and Roughtime with every reply verified) while
/// sending SIGHUP every 150 ms for four seconds, a new bundle each time and a new fleet secret
/// every second; checks that no reply was invalid or lost. How many bundles and secrets were
/// put in place.
fn reload_under_load(s: &mut ReloadScene) -> (usize, usize) {
    let dir = s.dir.path();
    let (ntp_json, rt_json) = (dir.join("ntp.json"), dir.join("rt.json"));
    let mut ntp_load = perf_load(&["ntp"], s.chimed.addr, &ntp_json);
    let rt_args = [
        "roughtime",
        "--public-key",
        &s.public_key,
        "--verify-every",
        "1",
    ];
    let mut rt_load = perf_load(&rt_args, s.roughtime, &rt_json);
    let (mut bundle_reloads, mut secret_reloads) = (0, 0);
    let started = Instant::now();
    let mut last_secret = started;
    while started.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(150));
        bundle_reloads += 1;
        put_whole(&s.live, &s.bundles[bundle_reloads % 2]);
        // chronyd holds cookies from the last half second: a second apart, a secret change
        // leaves them all under the new secret or its `previous`.
        if last_secret.elapsed() >= Duration::from_secs(1) {
            let next = fleet_secret_hex();
            put_whole(
                &s.secret,
                &format!("secret {next}\nprevious {}\n", s.current),
            );
            s.current = next;
            secret_reloads += 1;
            last_secret = Instant::now();
        }
        nix::sys::signal::kill(s.chimed.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    }
    for (load, json) in [(&mut ntp_load, &ntp_json), (&mut rt_load, &rt_json)] {
        let out = load.wait().unwrap();
        assert!(out.success(), "chime perf failed: {}", json.display());
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
        let step = &v["steps"][0];
        assert_eq!(step["invalid"], 0, "{step:#}");
        assert_eq!(step["lost"], 0, "{step:#}");
        assert_eq!(step["answered"], step["sent"], "{step:#}");
    }
    (bundle_reloads, secret_reloads)
}

/// SIGHUP under load, every 150 ms for four seconds, while `chime perf` loads plain NTP and
/// Roughtime (every Roughtime reply verified) and chronyd polls over NTS 16 times a second:
/// each SIGHUP reads a delegation bundle other than the one in force, and every second the fleet
/// secret moves on (the new one in the file, the one before as `previous`). Every reply is valid
/// and none is lost, chronyd gets no NAK, and chimed drops nothing.
#[test]
fn sighup_reloads_under_load_give_no_invalid_reply() {
    let mut s = reload_scene();
    let client = ChronydClient::start(&[
        format!(
            "server 127.0.0.1 nts ntsport {} minpoll -4 maxpoll -4",
            s.ke_port
        ),
        format!("ntstrustedcerts {}", s.cert.display()),
    ]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while client.measured() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(client.measured() >= 3, "chronyd measured nothing over NTS");
    let before = client.measured();

    let (bundle_reloads, secret_reloads) = reload_under_load(&mut s);
    let after = client.measured();
    drop(client);
    let chimed = &mut s.chimed;
    assert!(chimed.terminate().success());
    let log = chimed.log();
    let reloaded = log.matches("SIGHUP: delegation bundle reloaded").count();
    let rekeyed = log.matches("SIGHUP: NTS fleet secret reloaded").count();
    assert!(
        reloaded >= bundle_reloads - 2 && bundle_reloads >= 20,
        "{bundle_reloads} SIGHUPs, {reloaded} bundles reloaded"
    );
    assert!(
        rekeyed >= 3 && secret_reloads >= 3,
        "{secret_reloads} new secrets, {rekeyed} reloaded"
    );
    assert!(
        after >= before + 32,
        "chronyd measured {} times",
        after - before
    );
    let ntp = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&ntp, "nts_nak"), 0, "NAKs: {ntp}");
    assert!(ntp.contains(" dropped=0 "), "{ntp}");
    let rt = chimed.wait_for("roughtime totals at exit", Duration::from_secs(1));
    assert!(rt.contains(" dropped=0 "), "{rt}");
}

/// 127.0.c.d, the address a client connects from.
fn loopback(c: u8, d: u8) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, c, d))
}

/// The hostile clients without TLS, started against `ke` and held for up to `hold`:
/// slowloris, silent connections, half handshakes, plain bytes and floods.
fn spawn_hostile_plain(
    ke: std::net::SocketAddr,
    hold: Duration,
) -> Vec<std::thread::JoinHandle<()>> {
    use std::io::{Read as _, Write as _};
    let mut hostile = Vec::new();
    // Slowloris: 4 from 127.0.0.2, a byte of a ClientHello record every 200 ms.
    for _ in 0..4 {
        hostile.push(std::thread::spawn(move || {
            let mut s = ke_connect(ke, loopback(0, 2));
            let start = Instant::now();
            let hello = [
                0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
            ];
            for b in hello.iter().cycle() {
                if start.elapsed() > hold || s.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }));
    }
    // Silent connections: 12 from 127.0.0.3 (8 are served and time out, 4 are closed at once).
    for _ in 0..12 {
        hostile.push(std::thread::spawn(move || {
            let mut s = ke_connect(ke, loopback(0, 3));
            s.set_read_timeout(Some(hold)).unwrap();
            let _ = s.read(&mut [0u8; 16]);
        }));
    }
    // Half a handshake from 127.0.0.4.
    for _ in 0..4 {
        hostile.push(std::thread::spawn(move || {
            let mut s = ke_connect(ke, loopback(0, 4));
            let mut half = vec![
                0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03,
            ];
            half.extend_from_slice(&[0x42; 40]);
            let _ = s.write_all(&half);
            s.set_read_timeout(Some(hold)).unwrap();
            let _ = s.read(&mut [0u8; 16]);
        }));
    }
    // Plain bytes, and floods closed at once: from 127.0.0.5 and from 127.0.1.1-20.
    hostile.push(std::thread::spawn(move || {
        for _ in 0..4 {
            let mut s = ke_connect(ke, loopback(0, 5));
            let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = s.read(&mut [0u8; 64]);
        }
        for _ in 0..200 {
            drop(ke_connect(ke, loopback(0, 5)));
        }
        for i in 1..=20 {
            for _ in 0..10 {
                drop(ke_connect(ke, loopback(1, i)));
            }
        }
    }));
    hostile
}

/// Over TLS to `ke`, trusting `cert`: a request past 16 KiB (joined with the others), and a
/// malformed one, whose thread gives back chimed's answer.
fn spawn_hostile_tls(
    ke: std::net::SocketAddr,
    cert: &Path,
) -> (
    std::thread::JoinHandle<()>,
    std::thread::JoinHandle<Vec<u8>>,
) {
    use std::io::{Read as _, Write as _};
    let (cert_a, cert_b) = (cert.to_path_buf(), cert.to_path_buf());
    let oversized = std::thread::spawn(move || {
        let mut tls = ke_tls(ke, loopback(0, 6), &cert_a);
        // Records of type 0x4000 (not critical, unknown), 1 KiB each, never an End of Message.
        let mut record = vec![0x40, 0x00, 0x04, 0x00];
        record.extend_from_slice(&[0; 1024]);
        for _ in 0..20 {
            if tls.write_all(&record).is_err() {
                break;
            }
        }
        let _ = tls.read(&mut [0u8; 64]);
    });
    let refused = std::thread::spawn(move || {
        let mut tls = ke_tls(ke, loopback(0, 7), &cert_b);
        // A critical record of an unknown type, then End of Message.
        tls.write_all(&[0xff, 0xff, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00])
            .unwrap();
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer);
        answer
    });
    (oversized, refused)
}

/// A good client (`chime ntp --nts` against NTS-KE on `ke_port`) asking every 20 ms for `hold`:
/// how many exchanges succeeded within 6 s, the slowest, and how many were tried.
fn good_client_during(ke_port: u16, cert: &Path, hold: Duration) -> (u32, Duration, u32) {
    let started = Instant::now();
    let (mut good, mut slowest) = (0, Duration::ZERO);
    let mut tries = 0;
    while started.elapsed() < hold {
        tries += 1;
        let t = Instant::now();
        let r = chime_ntp_nts(&format!("127.0.0.1:{ke_port}"), cert);
        let took = t.elapsed();
        slowest = slowest.max(took);
        if r.is_ok() && took < Duration::from_secs(6) {
            good += 1;
        } else {
            eprintln!("good client {tries}: {r:?} in {took:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (good, slowest, tries)
}

/// NTS-KE against hostile clients, all at once for some six seconds, while a good client
/// (`chime ntp --nts`, a whole NTS-KE and an authenticated exchange) keeps asking:
///
/// * a byte every 200 ms of a ClientHello (slowloris), and connections that send nothing, held
///   to chimed's 2 s deadline for a ClientHello: `failed.timeout`; from one address, no more than 8 at once:
///   the rest are closed unserved, `address_limited`;
/// * half a handshake (a TLS record header and part of a ClientHello, then silence): timeout;
/// * plain bytes instead of TLS, and floods of connections closed at once, from one address and
///   from twenty: `failed.tls`;
/// * over TLS, a request past 16 KiB (`failed.request`) and a malformed one (an unknown critical
///   record: answered with an error record, `refused`).
///
/// Every good client's exchange succeeds within 6 s, chimed's resident memory grows by less
/// than 32 MiB, and each kind is counted.
#[test]
fn nts_ke_holds_up_against_hostile_clients() {
    use std::io::Write as _;
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let ke: std::net::SocketAddr = ([127, 0, 0, 1], ke_port).into();
    let pid = chimed.pid();
    let rss_before = common::resident_kib(pid.as_raw() as u32);
    let hold = Duration::from_secs(6);
    let mut hostile = spawn_hostile_plain(ke, hold);
    let (oversized, refused) = spawn_hostile_tls(ke, &cert);
    hostile.push(oversized);

    // Meanwhile, a good client.
    let (good, slowest, tries) = good_client_during(ke_port, &cert, hold);
    for h in hostile {
        h.join().unwrap();
    }
    let answer = refused.join().unwrap();
    // An Error record (type 2, critical) answers the malformed request.
    assert!(
        answer.windows(2).any(|w| w == [0x80, 0x02]),
        "no error record: {answer:?}"
    );
    let rss_after = common::resident_kib(pid.as_raw() as u32);
    assert!(chimed.terminate().success());
    let ke_line = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    let _ = writeln!(
        std::io::stderr(),
        "nts-ke under hostile clients: good client {good} of {tries} (slowest {slowest:?}); \
         resident {rss_before} -> {rss_after} KiB; {ke_line}"
    );
    assert_eq!(good, tries, "every good exchange succeeds: {ke_line}");
    assert!(tries >= 5, "{tries} good exchanges in 6 s");
    assert!(
        rss_after < rss_before + 32 * 1024,
        "resident {rss_before} -> {rss_after} KiB"
    );
    for (kind, least) in [
        ("failed.timeout", 8),
        ("failed.tls", 4),
        ("failed.request", 1),
        ("address_limited", 4),
        ("refused", 1),
    ] {
        assert!(count_in(&ke_line, kind) >= least, "{kind}: {ke_line}");
    }
}

/// How a hostile connection of [`distributed_attack`] holds its slot.
#[derive(Debug, Clone, Copy)]
enum Stall {
    /// Sends nothing.
    Silent,
    /// Sends a ClientHello's first bytes, one every 200 ms.
    Drip,
    /// Finishes the TLS handshake, then sends nothing.
    AfterHandshake,
}

/// One hostile connection from `from`, of kind `stall`, opened again as soon as chimed closes it,
/// until `until`: how many times it was opened.
fn hostile_until(
    ke: std::net::SocketAddr,
    from: std::net::IpAddr,
    stall: Stall,
    cert: &Path,
    until: Instant,
) -> u32 {
    use std::io::{Read as _, Write as _};
    let mut opened = 0;
    while Instant::now() < until {
        let left = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let held = match stall {
            Stall::Silent | Stall::Drip => try_ke_connect(ke, from).and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                let hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];
                for b in hello.iter().cycle() {
                    if matches!(stall, Stall::Drip) {
                        s.write_all(&[*b])?;
                    }
                    match s.read(&mut [0u8; 16]) {
                        Ok(_) => return Ok(()),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if Instant::now() >= until {
                        break;
                    }
                }
                Ok(())
            }),
            Stall::AfterHandshake => try_ke_tls(ke, from, cert).and_then(|mut tls| {
                tls.sock.set_read_timeout(Some(left))?;
                tls.read(&mut [0u8; 16]).map(drop)
            }),
        };
        opened += 1;
        if held.is_err() {
            // Refused or reset: come back after a moment, not in a tight loop.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    opened
}

/// A distributed attack on NTS-KE, as a cheap attacker mounts one: 480 connections from 60
/// addresses (eight each, the most chimed lets one address hold), a third sending nothing, a
/// third dripping a ClientHello a byte every 200 ms, a third finishing the TLS handshake and then
/// saying nothing, each opened again as soon as chimed closes it, for 8 s. Meanwhile a good client
/// from another address (`chime ntp --nts`: a whole NTS-KE session and an authenticated exchange)
/// keeps asking: every exchange succeeds, each within a second.
///
/// The attack holds more connections than chimed once had slots (256, each held up to 5 s and
/// taken by an idle thread): with those, good clients waited seconds or were never served.
#[test]
fn nts_ke_serves_good_clients_through_a_distributed_attack() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let (mut chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &[]);
    let ke: std::net::SocketAddr = ([127, 0, 0, 1], ke_port).into();
    let until = Instant::now() + Duration::from_secs(8);
    let stalls = [Stall::Silent, Stall::Drip, Stall::AfterHandshake];
    let hostile: Vec<_> = (0..480)
        .map(|i| {
            let (cert, from) = (cert.clone(), loopback(2, 1 + (i / 8) as u8));
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || hostile_until(ke, from, stalls[i % 3], &cert, until))
                .unwrap()
        })
        .collect();
    // Let the attack take hold before the good client starts.
    std::thread::sleep(Duration::from_secs(2));
    let mut slow = Vec::new();
    let mut tries = 0;
    while Instant::now() + Duration::from_secs(1) < until {
        tries += 1;
        let t = Instant::now();
        let r = chime_ntp_nts(&ke.to_string(), &cert);
        if r.is_err() || t.elapsed() > Duration::from_secs(1) {
            slow.push((tries, t.elapsed(), r.err()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let opened: u32 = hostile.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(chimed.terminate().success());
    let ke_line = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    eprintln!("{tries} good exchanges, {opened} hostile connections opened: {ke_line}");
    assert!(
        slow.is_empty(),
        "good exchanges failed or slow: {slow:?}; {ke_line}"
    );
    assert!(tries >= 10, "{tries} good exchanges");
    // The attack was what the test says: every kind held its slot to a deadline.
    assert!(opened >= 960, "{opened} hostile connections opened");
    assert!(count_in(&ke_line, "failed.timeout") >= 480, "{ke_line}");
}
