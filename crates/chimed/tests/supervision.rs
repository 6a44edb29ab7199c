//! Every service of the real chimed, made to end unexpectedly through a fail point (the
//! `failpoints` feature; `FAILPOINTS=name=action`, TiKV's `fail` crate): a panic, or a return with
//! an error (tasks) or without one (threads). Each time chimed logs the service by name at error
//! level, stops the others and exits 1, within 2 s of starting to serve.

#![cfg(feature = "failpoints")]

mod common;

use std::path::Path;
use std::process::Command;

use common::{
    Chimed, Chronyd, certificate, chime_keygen, nts_flags, roughtime_flags, workspace_bin,
};

/// What each case needs besides NTP.
#[derive(Clone, Copy, Debug)]
enum Needs {
    Nothing,
    Roughtime,
    Nts,
    Fleet,
    Metrics,
}

/// (fail point, action, what chimed must serve, the log line that names the service)
const CASES: [(&str, &str, Needs, &str); 14] = [
    (
        "ntp-worker",
        "panic",
        Needs::Nothing,
        "service ntp-ipv4 panicked",
    ),
    (
        "upstream",
        "panic",
        Needs::Nothing,
        "service upstream panicked",
    ),
    (
        "upstream",
        "return",
        Needs::Nothing,
        "service upstream failed: fail point upstream",
    ),
    (
        "roughtime-worker",
        "panic",
        Needs::Roughtime,
        "service roughtime-ipv4 panicked",
    ),
    (
        "roughtime-tcp",
        "panic",
        Needs::Roughtime,
        "service roughtime-tcp panicked",
    ),
    (
        "roughtime-keys",
        "panic",
        Needs::Roughtime,
        "service roughtime-keys panicked",
    ),
    (
        "roughtime-keys",
        "return",
        Needs::Roughtime,
        "service roughtime-keys failed",
    ),
    ("nts-ke", "panic", Needs::Nts, "service nts-ke panicked"),
    (
        "nts-ke",
        "return",
        Needs::Nts,
        "service nts-ke ended without an error",
    ),
    (
        "nts-cookie-keys",
        "return",
        Needs::Nts,
        "service nts-cookie-keys failed",
    ),
    (
        "nts-fleet-keys",
        "panic",
        Needs::Fleet,
        "service nts-fleet-keys panicked",
    ),
    (
        "nts-fleet-keys",
        "return",
        Needs::Fleet,
        "service nts-fleet-keys failed",
    ),
    (
        "metrics",
        "panic",
        Needs::Metrics,
        "service metrics panicked",
    ),
    (
        "metrics",
        "return",
        Needs::Metrics,
        "service metrics failed: fail point metrics",
    ),
];

#[test]
fn every_service_that_ends_takes_chimed_down_naming_it() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "localhost");
    let rt = chime_keygen();
    let fleet = fleet_key(dir.path());
    let upstream = chronyd.addr().to_string();
    for (point, action, needs, named) in CASES {
        let mut args = vec!["-s", &upstream, "-4", "1", "-6", "0", "-a", "127.0.0.1:0"];
        let owned: Vec<String> = match needs {
            Needs::Nothing => vec![],
            Needs::Roughtime => roughtime_flags(rt.file.to_str().unwrap())
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            Needs::Nts => nts_flags(&cert, &key),
            Needs::Fleet => vec!["--nts-fleet-key".into(), fleet.clone()],
            Needs::Metrics => vec!["--metrics-address".into(), "127.0.0.1:0".into()],
        };
        args.extend(owned.iter().map(String::as_str));
        let failpoints = format!("{point}={action}");
        let mut chimed =
            Chimed::start_with_env(None, &args, &[("FAILPOINTS", &failpoints)], "running:");
        chimed.assert_fails_naming(&failpoints, named);
    }
}

/// A fleet secret made by `chime nts-fleet-key`.
fn fleet_key(dir: &Path) -> String {
    let path = dir.join("fleet.key");
    let out = Command::new(workspace_bin("chime"))
        .arg("nts-fleet-key")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    path.to_str().unwrap().to_owned()
}

/// The experimental ML-DSA-44 suite's key rotation, where the suite is built in.
#[cfg(feature = "mldsa")]
#[test]
fn the_mldsa_key_rotation_ending_takes_chimed_down_naming_it() {
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let rt = chime_keygen();
    let pq = dir.path().join("pq.key");
    let made = Command::new(workspace_bin("chime"))
        .args(["keygen", "--mldsa"])
        .arg(&pq)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let upstream = chronyd.addr().to_string();
    let mut args = vec!["-s", &upstream, "-4", "1", "-6", "0", "-a", "127.0.0.1:0"];
    args.extend(roughtime_flags(rt.file.to_str().unwrap()));
    args.extend(["--roughtime-mldsa-key", pq.to_str().unwrap()]);
    let failpoints = "roughtime-mldsa-keys=return";
    let mut chimed = Chimed::start_with_env(None, &args, &[("FAILPOINTS", failpoints)], "running:");
    chimed.assert_fails_naming(
        failpoints,
        "service roughtime-mldsa-keys failed: fail point",
    );
}
