//! Timezone-offset mode end to end: chimed mirroring a real chronyd and serving Asia/Kolkata's
//! local time (UTC+05:30, no DST) as if it were UTC, checked by `chime ntp` and `chronyd -Q`.

mod common;

use std::time::Duration;

use common::{Chimed, Chronyd, chime_ntp, chronyd_client_offset};

const KOLKATA: f64 = 19_800.0;

#[test]
fn kolkata_offset_seen_by_chime_and_chronyd() {
    let chronyd = Chronyd::start();
    let upstream = chronyd.addr().to_string();
    let mut chimed = Chimed::mirroring(&upstream, &["--tz-offset", "--timezone", "Asia/Kolkata"]);
    let warning = chimed.wait_for("timezone-offset mode", Duration::from_secs(5));
    assert!(warning.contains("Asia/Kolkata, now UTC+05:30"), "{warning}");
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));

    let r = chime_ntp(chimed.addr).unwrap();
    common::assert_offset_near(&r, KOLKATA);
    assert_eq!(r["stratum"], 3);

    // chronyd reports how wrong the local clock is relative to the server: the server is 5.5 h
    // ahead, so it is the same +19800 s the client sees.
    let offset = chronyd_client_offset(chimed.addr).unwrap();
    assert!(
        (offset - KOLKATA).abs() < 1e-3,
        "chronyd -Q offset {offset}"
    );
}

#[test]
fn unknown_zone_exits_2_naming_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chimed"))
        .args([
            "--tz-offset",
            "--timezone",
            "Europe/Atlantis",
            "-a",
            "127.0.0.1:0",
            "-6",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Europe/Atlantis") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn sighup_rereads_the_zone_and_a_chroot_keeps_the_old_one() {
    use nix::sys::signal::{Signal, kill};

    // Upstream need not answer: the zone is loaded at start whatever it does.
    let upstream = format!("127.0.0.1:{}", common::free_udp_port());
    let mut chimed = Chimed::mirroring(&upstream, &["--tz-offset", "--timezone", "Europe/Prague"]);
    chimed.wait_for("SIGHUP reloads", Duration::from_secs(5));
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    chimed.wait_for("SIGHUP: re-reading the timezone", Duration::from_secs(5));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while chimed.log().matches("local time of Europe/Prague").count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no reload warning:\n{}",
            chimed.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Inside an empty chroot the tz database is gone: the reload fails and the zone stays.
    let root = tempfile::tempdir().unwrap();
    let root_dir = root.path().to_str().unwrap();
    let mut chimed = Chimed::mirroring(
        &upstream,
        &[
            "--tz-offset",
            "--timezone",
            "Europe/Prague",
            "-u",
            "nobody",
            "-r",
            root_dir,
        ],
    );
    chimed.wait_for("SIGHUP reloads", Duration::from_secs(5));
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    let line = chimed.wait_for("keeping the zone loaded before", Duration::from_secs(5));
    assert!(line.contains("cannot re-read the zone"), "{line}");
}
