//! NTPv5 (`--ntpv5`, as drafted) against independent clients: ntpd-rs 1.9 (draft -08), which
//! starts in v4, asks to upgrade and moves to v5 when chimed echoes the mark, and ntpstats (PyPI,
//! draft -09). Counted by chimed as v5 replies and upgrades; without `--ntpv5` neither happens.
//! A request for TAI, which neither of them can make, through chime: answered in TAI with the
//! kernel's TAI - UTC, and in UTC while the kernel has none.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::{Chimed, Chronyd, chime_ntp_with, count_in, has_offset, ntpd_rs, peer, run};

const NTPSTATS_PYTHON: &str = "/opt/chime-peers/ntpstats-venv/bin/python";

fn chimed(chronyd: &Chronyd, extra: &[&str]) -> Chimed {
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), extra);
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    chimed
}

/// ntpd-rs's source: a plain server on `port` in `ntp_version` (`"auto"`, as it ships: v4, asking
/// to upgrade; or `5`).
fn server_source(port: u16, ntp_version: &str) -> String {
    format!("mode = \"server\"\naddress = \"127.0.0.1:{port}\"\nntp-version = {ntp_version}\n")
}

/// ntpd-rs as shipped asks to upgrade, sees chimed echo the mark, and moves to v5.
#[test]
fn ntpd_rs_asks_to_upgrade_and_moves_to_ntpv5() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed(&chronyd, &["--ntpv5"]);
    let dir = tempfile::tempdir().unwrap();
    let moved = |_: &str, log: &str| log.contains("switching to NTPv5");
    ntpd_rs(
        dir.path(),
        &server_source(chimed.addr.port(), "\"auto\""),
        moved,
    );
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "ntpv5_upgrade") >= 1, "{totals}");
}

/// ntpd-rs speaking v5 (draft -08) from its first poll takes chimed's time: every offset it shows
/// came from a v5 reply it accepted.
#[test]
fn ntpd_rs_syncs_from_chimed_over_ntpv5() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed(&chronyd, &["--ntpv5"]);
    let dir = tempfile::tempdir().unwrap();
    let (status, _) = ntpd_rs(
        dir.path(),
        &server_source(chimed.addr.port(), "5"),
        |s, _| has_offset(s),
    );
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "ntpv5") >= 1, "{totals}\n{status}");
    assert_eq!(
        count_in(&totals, "answered"),
        count_in(&totals, "ntpv5"),
        "{totals}"
    );
}

#[test]
fn ntpstats_queries_chimed_over_ntpv5_draft_09() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed(&chronyd, &["--ntpv5"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ntpstats_v5.py");
    let out = run(Command::new(peer("NTPSTATS_PYTHON", NTPSTATS_PYTHON))
        .arg(script)
        .arg("127.0.0.1")
        .arg(chimed.addr.port().to_string()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(r["upgrade"], true, "{r}");
    assert_eq!(r["version"], 5, "{r}");
    assert_eq!(r["draft"], "draft-ietf-ntp-ntpv5-09", "{r}");
    assert_eq!(
        (r["stratum"].as_u64(), r["leap"].as_u64()),
        (Some(3), Some(0)),
        "{r}"
    );
    assert_eq!(r["flags"], 1, "synchronised: {r}");
    assert_eq!(r["timescale"], "utc", "{r}");
    assert!(r["offset"].as_f64().unwrap().abs() < 0.01, "{r}");
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "ntpv5"), 1, "{totals}");
    assert_eq!(count_in(&totals, "ntpv5_upgrade"), 1, "{totals}");
}

/// Off by default: a v5 request is dropped as a version chimed does not speak, an upgrade probe
/// is answered in v4 without the mark, and ntpd-rs stays on v4.
#[test]
fn without_ntpv5_chimed_stays_v4() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed(&chronyd, &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ntpstats_v5.py");
    let out = run(Command::new(peer("NTPSTATS_PYTHON", NTPSTATS_PYTHON))
        .arg(script)
        .arg("127.0.0.1")
        .arg(chimed.addr.port().to_string()));
    assert!(!out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let gave_up = |s: &str, log: &str| has_offset(s) && log.contains("stopping the upgrade");
    ntpd_rs(
        dir.path(),
        &server_source(chimed.addr.port(), "\"auto\""),
        gave_up,
    );
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "ntpv5"), 0, "{totals}");
    assert_eq!(count_in(&totals, "ntpv5_upgrade"), 0, "{totals}");
    assert!(count_in(&totals, "dropped.bad_version") >= 1, "{totals}");
}

/// ntpd-rs over NTS, as it ships (`ntp-version = "auto"`, which offers the NTPv5 draft before
/// NTPv4 in NTS-KE), and forced to v5: chimed agrees on the draft (keys exported for 0x8001) and
/// answers its NTS requests over v5, each authenticated, none NAKed; ntpd-rs takes measurements
/// and keeps a full set of cookies.
#[test]
fn ntpd_rs_syncs_from_chimed_over_nts_and_ntpv5() {
    for version in ["\"auto\"", "5"] {
        let chronyd = Chronyd::start();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = common::certificate(dir.path(), "chimed");
        let (mut chimed, ke_port) = common::chimed_nts(&chronyd, &cert, &key, &["--ntpv5"]);
        let source = format!(
            "mode = \"nts\"\naddress = \"localhost:{ke_port}\"\n\
             certificate-authority = \"{}\"\nntp-version = {version}\n",
            cert.display()
        );
        let synced = |s: &str, _: &str| has_offset(s) && s.contains("[NTS]");
        let (status, _) = ntpd_rs(dir.path(), &source, synced);
        assert!(status.contains("NTS cookies:\t\t8/8"), "{status}");
        assert!(chimed.terminate().success());
        let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
        assert!(count_in(&totals, "nts") >= 1, "{version}: {totals}");
        assert_eq!(
            count_in(&totals, "ntpv5"),
            count_in(&totals, "answered"),
            "{totals}"
        );
        assert_eq!(count_in(&totals, "nts_nak"), 0, "{totals}");
        let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
        assert!(count_in(&ke, "keys.ntpv5-draft") >= 1, "{ke}");
        assert_eq!(count_in(&ke, "keys.ntpv4"), 0, "{ke}");
    }
}

/// chime's own NTS client over v5 (`chime ntp --nts --ntp-version 5`), in both drafts: NTS-KE
/// agrees on the v5 draft, the reply is v5, names the draft, authenticates and carries the
/// cookie spent and the two asked for; chimed counts v5 keys, v5 replies and NTS replies alike.
/// Against a chimed without `--ntpv5`, NTS-KE offers no protocol in common: one line, exit 1.
#[test]
fn chime_ntp_gets_authenticated_ntpv5_time_from_chimed() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = common::certificate(dir.path(), "chimed");
    let query = |ke_port: u16, draft: &str| {
        run(Command::new(common::workspace_bin("chime"))
            .args(["ntp", "--nts", "--ntp-version", "5", "--ntpv5-draft", draft])
            .args(["--json", "--timeout", "2", "--nts-ca"])
            .arg(&cert)
            .arg(format!("127.0.0.1:{ke_port}")))
    };
    let (mut chimed, ke_port) = common::chimed_nts(&chronyd, &cert, &key, &["--ntpv5"]);
    for (draft, id) in [
        ("08", "draft-ietf-ntp-ntpv5-08"),
        ("09", "draft-ietf-ntp-ntpv5-09"),
    ] {
        let out = query(ke_port, draft);
        assert!(out.status.success(), "{out:?}");
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (r["version"].as_u64(), r["stratum"].as_u64()),
            (Some(5), Some(3)),
            "{r}"
        );
        assert_eq!(r["ntpv5"]["draft"], id, "{r}");
        assert_eq!(
            r["nts"]["cookies"], 3,
            "the spent one and two placeholders: {r}"
        );
        assert_eq!(r["nts"]["protocol"], "ntpv5-draft", "{r}");
        assert_eq!(r["synchronised"], true, "{r}");
    }
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    for counter in ["ntpv5", "nts", "answered"] {
        assert_eq!(count_in(&totals, counter), 2, "{counter}: {totals}");
    }
    assert_eq!(count_in(&totals, "nts_nak"), 0, "{totals}");
    let ke = chimed.wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&ke, "keys.ntpv5-draft"), 2, "{ke}");

    let (_plain, ke_port) = common::chimed_nts(&chronyd, &cert, &key, &[]);
    let out = query(ke_port, "08");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no protocol offered"),
        "{out:?}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// chime's NTS client over v5 against an independent server: ntpd-rs 1.9 serving NTS with NTPv5
/// accepted (`accept-ntp-versions`, `[4, 5]` for NTS-KE and `[3, 4, 5]` for NTP). NTS-KE agrees
/// on the v5 draft, and the v5 reply (draft -08, ntpd-rs's) authenticates under both algorithms
/// ntpd-rs serves, with the spent cookie and two more.
#[test]
fn chime_ntp_gets_authenticated_ntpv5_time_from_ntpd_rs() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = common::certificate(dir.path(), "ntpd-rs");
    let ntp_port = common::free_udp_port();
    let ke_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let conf = dir.path().join("ntp.toml");
    let text = format!(
        "[[server]]\nlisten = \"127.0.0.1:{ntp_port}\"\naccept-ntp-versions = [3, 4, 5]\n\n\
         [[nts-ke-server]]\nlisten = \"127.0.0.1:{ke_port}\"\ncertificate-chain-path = \"{}\"\n\
         private-key-path = \"{}\"\nntp-server = \"127.0.0.1\"\nntp-port = {ntp_port}\n\
         accept-ntp-versions = [4, 5]\n",
        cert.display(),
        key.display()
    );
    std::fs::write(&conf, text).unwrap();
    let _server = common::Killed(
        Command::new(peer("NTP_DAEMON", common::NTP_DAEMON))
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for aead in ["15", "17"] {
        let query = || {
            run(Command::new(common::workspace_bin("chime"))
                .args(["ntp", "--nts", "--ntp-version", "5", "--nts-aead", aead])
                .args(["--json", "--timeout", "1", "--nts-ca"])
                .arg(&cert)
                .arg(format!("127.0.0.1:{ke_port}")))
        };
        // ntpd-rs takes a moment to listen.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut out = query();
        while !out.status.success() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            out = query();
        }
        assert!(out.status.success(), "{out:?}");
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["version"], 5, "{r}");
        assert_eq!(r["ntpv5"]["draft"], "draft-ietf-ntp-ntpv5-08", "{r}");
        assert_eq!(r["nts"]["aead"].to_string(), aead, "{r}");
        assert_eq!(r["nts"]["cookies"], 3, "{r}");
        assert_eq!(
            r["nts"]["protocol"], "ntpv5-draft",
            "keys exported for v5: {r}"
        );
    }
}

/// The bit numbers a chimed logged as its own identity ("server ID bits [...]").
fn server_id_bits(chimed: &mut Chimed) -> Vec<u16> {
    let line = chimed.wait_for("server ID bits", Duration::from_secs(1));
    let list = line.split("server ID bits [").nth(1).unwrap();
    let list = list.split(']').next().unwrap();
    list.split(", ").map(|b| b.parse().unwrap()).collect()
}

/// A chimed's served reference-ID filter, read over v5 as a client reads it, a quarter a request.
fn served_filter(addr: std::net::SocketAddr) -> chime_ntp::v5::BloomFilter {
    use chime_ntp::v5::{self, BloomFilter, Draft};
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut bytes = [0u8; BloomFilter::BYTES];
    for quarter in 0..4u16 {
        let mut request = [0u8; 256];
        let cookie = [quarter as u8 + 1; 8];
        let len = v5::write_request(
            &mut request,
            Draft::D09,
            0,
            cookie,
            Some((quarter * 128, 128)),
        )
        .unwrap();
        socket.send_to(&request[..len], addr).unwrap();
        let mut reply = [0u8; 512];
        let (n, _) = socket.recv_from(&mut reply).unwrap();
        let r = v5::parse_response(&reply[..n], cookie, Draft::D09).unwrap();
        let at = usize::from(quarter) * 128;
        bytes[at..at + 128].copy_from_slice(r.reference.unwrap());
    }
    BloomFilter::from_bytes(bytes)
}

/// A chimed mirroring another over v5 serves the upstream's identity in its filter beside its own,
/// as a chain of v5 servers must for a client to see a loop; one mirroring chronyd (no v5) serves
/// its own alone.
#[test]
fn a_chimed_serves_its_upstreams_filter_with_its_own() {
    let chronyd = Chronyd::start();
    let mut upstream = chimed(&chronyd, &["--ntpv5"]);
    let upstream_bits = server_id_bits(&mut upstream);
    let mut downstream = Chimed::mirroring(&upstream.addr.to_string(), &["--ntpv5"]);
    downstream.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let own_bits = server_id_bits(&mut downstream);
    let gathered = downstream.wait_for("speaks NTPv5", Duration::from_secs(10));
    assert!(gathered.contains("(10 bits set)"), "{gathered}");
    let set = |bits: &[u16]| bits.iter().copied().collect::<BTreeSet<u16>>();
    let served: BTreeSet<u16> = served_filter(downstream.addr).bits().collect();
    let union = &set(&own_bits) | &set(&upstream_bits);
    assert_eq!(served, union, "both identities, nothing else");
    let alone: BTreeSet<u16> = served_filter(upstream.addr).bits().collect();
    assert_eq!(alone, set(&upstream_bits), "chronyd adds nothing");
    assert!(upstream.terminate().success());
    assert!(!upstream.log().contains("speaks NTPv5"));
}

/// The kernel's TAI - UTC, set for a test and put back when dropped: machine-wide, as chronyd
/// with `leapsectz` sets it (needs CAP_SYS_TIME, as the loopback tier's chronyd does), through
/// `kernel_tai.py` (adjtimex(2)).
struct KernelTai {
    before: i32,
}

impl KernelTai {
    /// Sets it to `tai` (or only reads it, with `None`) and returns what it is then.
    fn adjtimex(tai: Option<i32>) -> i32 {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernel_tai.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).args(tai.map(|t| t.to_string()));
        let out = run(&mut cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kernel_tai.py: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout.trim().parse().unwrap()
    }

    fn set(tai: i32) -> Self {
        let before = Self::adjtimex(None);
        Self::write(tai);
        Self { before }
    }

    fn write(tai: i32) {
        assert_eq!(Self::adjtimex(Some(tai)), tai);
    }
}

impl Drop for KernelTai {
    fn drop(&mut self) {
        Self::write(self.before);
    }
}

/// chime asking chimed over v5 for `timescale`: the reply's timescale and the offset it shows.
fn chime_v5(chimed: &Chimed, timescale: &str) -> (u64, u64, f64) {
    let flags = ["--ntp-version", "5", "--ntpv5-timescale", timescale];
    let r = chime_ntp_with(chimed.addr, &flags).unwrap();
    let v5 = &r["ntpv5"];
    (
        v5["timescale"].as_u64().unwrap(),
        v5["timescale_asked"].as_u64().unwrap(),
        r["offset"].as_f64().unwrap(),
    )
}

#[test]
fn tai_is_answered_with_the_kernels_offset_and_utc_without_one() {
    let chronyd = Chronyd::start();
    let tai = KernelTai::set(37);
    let mut chimed = chimed(&chronyd, &["--ntpv5"]);
    // The poller reads the kernel's offset at each poll: one since, so it is known.
    std::thread::sleep(Duration::from_millis(1100));
    let (timescale, asked, offset) = chime_v5(&chimed, "tai");
    assert_eq!((timescale, asked), (1, 1));
    assert!((offset - 37.0).abs() < 0.01, "TAI is UTC + 37 s: {offset}");
    // UTC when asked for it, and for a timescale chimed does not serve.
    for (scale, number) in [("utc", 0), ("ut1", 2)] {
        let (timescale, asked, offset) = chime_v5(&chimed, scale);
        assert_eq!((timescale, asked), (0, number));
        assert!(offset.abs() < 0.01, "{scale}: {offset}");
    }

    // Without the kernel's offset, a request for TAI is answered in UTC, which the reply says.
    KernelTai::write(0);
    std::thread::sleep(Duration::from_millis(1100));
    let (timescale, asked, offset) = chime_v5(&chimed, "tai");
    assert_eq!((timescale, asked), (0, 1));
    assert!(offset.abs() < 0.01, "{offset}");
    drop(tai);
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "ntpv5_tai"), 1, "{totals}");
    assert_eq!(count_in(&totals, "ntpv5"), 4, "{totals}");
}
