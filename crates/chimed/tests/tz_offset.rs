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
    let mut chimed = Chimed::start(&[
        "-4",
        "1",
        "-6",
        "0",
        "-a",
        "127.0.0.1:0",
        "-s",
        &upstream,
        "--tz-offset",
        "--timezone",
        "Asia/Kolkata",
    ]);
    let warning = chimed.wait_for("timezone-offset mode", Duration::from_secs(5));
    assert!(warning.contains("Asia/Kolkata, now UTC+05:30"), "{warning}");
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));

    let r = chime_ntp(chimed.addr).unwrap();
    let offset = r["offset"].as_f64().unwrap();
    assert!((offset - KOLKATA).abs() < 1e-3, "chime ntp offset {offset}");
    assert_eq!(r["stratum"], 3);

    // chronyd reports how wrong the local clock is relative to the server: the server is 5.5 h
    // ahead, so it is the same +19800 s the client sees.
    let offset = chronyd_client_offset(chimed.addr).unwrap();
    assert!(
        (offset.abs() - KOLKATA).abs() < 1e-3,
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
