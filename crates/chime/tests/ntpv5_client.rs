//! chime as an NTPv5 client (as drafted, -08 and -09): `chime ntp --ntp-version 5` and `chime
//! perf ntp --ntp-version 5` against the real chimed with `--ntpv5` mirroring a real chronyd,
//! counted against chimed's own totals; against chimed without `--ntpv5`, which drops v5; and
//! against a responder in the test whose replies, written byte by byte there, carry another
//! request's cookie, name another draft, or kiss.

#[path = "../../chimed/tests/common/mod.rs"]
mod common;
mod servers;

use std::process::{Command, Output};
use std::time::Duration;

use common::{Chronyd, count_in};
use serde_json::Value;
use servers::{Policy, Responder, V5Reply, chime_perf, start_chimed, start_chimed_with};

const DRAFTS: [(&str, &str); 2] = [
    ("08", "draft-ietf-ntp-ntpv5-08"),
    ("09", "draft-ietf-ntp-ntpv5-09"),
];

/// `chime ntp --ntp-version 5 --timeout 1` with `extra` flags, to `addr`.
fn chime_ntp_v5(addr: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chime"))
        .args(["ntp", "--ntp-version", "5", "--timeout", "1"])
        .args(extra)
        .arg(addr)
        .output()
        .unwrap()
}

/// The JSON of a run that must have succeeded.
fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A run that must have failed with one line on stderr containing `says`, and nothing on stdout.
#[track_caller]
fn assert_fails_saying(out: &Output, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("chime: ") && err.contains(says), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Each draft gets chimed's time: stratum 3 and synchronised as chronyd serves it, the draft named,
/// the v5 header's fields reported, the offset within 10 ms (same host, same clock). The human
/// report names them too; `--ntpv5-reference` reads chimed's filter, which holds its own ten bits.
/// chimed counts every one of these exchanges as a v5 reply, and answered nothing else.
#[test]
fn chime_ntp_gets_chimeds_time_over_ntpv5_in_both_drafts() {
    let chronyd = Chronyd::start();
    let mut chimed = start_chimed_with(&chronyd, &["--ntpv5"]);
    let addr = chimed.addr.to_string();
    let era = chime_ntp::v5::era(common::unix_now() as i64);
    for (flag, id) in DRAFTS {
        let r = json_of(&chime_ntp_v5(&addr, &["--json", "--ntpv5-draft", flag]));
        assert_eq!(
            (r["version"].as_u64(), r["mode"].as_u64()),
            (Some(5), Some(4)),
            "{r}"
        );
        assert_eq!(
            (r["stratum"].as_u64(), r["leap"].as_u64()),
            (Some(3), Some(0)),
            "{r}"
        );
        assert_eq!(r["synchronised"], true, "{r}");
        let v5 = &r["ntpv5"];
        assert_eq!(v5["draft"], id, "{r}");
        assert_eq!(
            (v5["timescale"].as_u64(), v5["era"].as_u64()),
            (Some(0), Some(u64::from(era))),
            "{r}"
        );
        assert_eq!(v5["flags"], 1, "synchronised: {r}");
        assert!(v5.get("reference_bits_set").is_none(), "{r}");
        assert_eq!(r["reference_id"], "", "v5 has no reference ID: {r}");
        let offset = r["offset"].as_f64().unwrap();
        assert!(offset.abs() < 0.01, "{r}");
        assert!(r["delay"].as_f64().unwrap() >= 0.0, "{r}");
    }

    let out = chime_ntp_v5(&addr, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for line in [
        "Version         : 5",
        "Draft           : draft-ietf-ntp-ntpv5-08",
        "Timescale       : UTC (0)",
        "Flags           : 0x01 (synchronised)",
        "Stratum         : 3",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert!(!text.contains("Reference ID"), "{text}");

    let r = json_of(&chime_ntp_v5(&addr, &["--json", "--ntpv5-reference"]));
    assert_eq!(r["ntpv5"]["reference_bits_set"], 10, "{r}");
    assert_eq!(
        r["ntpv5"]["reference_filter_hex"].as_str().unwrap().len(),
        1024,
        "{r}"
    );

    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    // Two drafts, the default, and one exchange and four slices for the filter.
    assert_eq!(count_in(&totals, "ntpv5"), 2 + 1 + 5, "{totals}");
    assert_eq!(count_in(&totals, "answered"), 2 + 1 + 5, "{totals}");
}

/// Without `--ntpv5` chimed drops v5 requests as a version it does not speak: chime says there was
/// no reply and why that may be, and exits 1.
#[test]
fn chime_ntp_fails_against_chimed_without_ntpv5() {
    let chronyd = Chronyd::start();
    let mut chimed = start_chimed(&chronyd);
    let out = chime_ntp_v5(&chimed.addr.to_string(), &["--json"]);
    assert_fails_saying(&out, "no reply within 1.0 s");
    assert_fails_saying(&out, "does not speak NTPv5 as draft-ietf-ntp-ntpv5-08");
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "ntpv5"), 0, "{totals}");
    assert!(count_in(&totals, "dropped.bad_version") >= 1, "{totals}");
}

/// A reply to another request (another cookie), one naming another draft, and a Kiss-o'-Death are
/// each one line and exit status 1; the same responder's faithful reply is accepted, so it is the
/// cookie, the draft or the kiss that is refused.
#[test]
fn chime_ntp_refuses_another_cookie_another_draft_and_a_kiss() {
    let faithful = Responder::start(Policy::V5(V5Reply::Faithful));
    for (flag, id) in DRAFTS {
        let r = json_of(&chime_ntp_v5(
            &faithful.addr.to_string(),
            &["--json", "--ntpv5-draft", flag],
        ));
        assert_eq!(
            (r["stratum"].as_u64(), r["ntpv5"]["draft"].as_str()),
            (Some(2), Some(id))
        );
    }
    let cases = [
        (
            V5Reply::WrongCookie,
            "09",
            "bad reply (76 bytes): the client cookie is not the request's".to_owned(),
        ),
        (
            V5Reply::OtherDraft,
            "08",
            format!(
                "it names the draft \"{}\" where the request named \"{}\"",
                DRAFTS[1].1, DRAFTS[0].1
            ),
        ),
        (
            V5Reply::OtherDraft,
            "09",
            format!("it names the draft \"{}\"", DRAFTS[0].1),
        ),
        (
            V5Reply::Kiss,
            "08",
            "Kiss-o'-Death RATE: asks this client to poll less often".to_owned(),
        ),
    ];
    for (how, draft, says) in cases {
        let responder = Responder::start(Policy::V5(how));
        let out = chime_ntp_v5(
            &responder.addr.to_string(),
            &["--json", "--ntpv5-draft", draft],
        );
        assert_fails_saying(&out, &says);
        assert_eq!(responder.replied(), 1, "{how:?}");
    }
}

/// `--nts` is NTPv4's and NTPv5's, `--interleaved` NTPv4's; the v5 flags need `--ntp-version 5`,
/// and the filter is not read over NTS: one line naming the flag, and a non-zero exit, before
/// anything is sent.
#[test]
fn chime_ntp_refuses_v5_with_flags_that_do_not_apply() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--ntp-version", "3", "--nts"],
            "--nts: NTS is for NTPv4 and NTPv5 (--ntp-version 4 or 5), not --ntp-version 3",
        ),
        (
            &["--ntp-version", "5", "--nts", "--ntpv5-reference"],
            "--ntpv5-reference: not with --nts",
        ),
        (
            &["--ntp-version", "5", "--interleaved"],
            "--interleaved: interleaved mode is NTPv4 only, not --ntp-version 5",
        ),
        (
            &["--ntp-version", "4", "--ntpv5-draft", "09"],
            "--ntpv5-draft: only with --ntp-version 5, not 4",
        ),
        (
            &["--ntpv5-reference"],
            "--ntpv5-reference: only with --ntp-version 5, not 4",
        ),
        (
            &["--ntp-version", "5", "--ntpv5-draft", "10"],
            "--ntpv5-draft",
        ),
    ];
    for (flags, says) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_chime"))
            .arg("ntp")
            .args(flags)
            .arg("127.0.0.1:9")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: {err}");
        assert!(
            err.lines().next().unwrap_or("").contains(says),
            "{flags:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
}

/// `chime perf ntp --ntp-version 5` at a few hundred requests per second against chimed with
/// `--ntpv5`, each draft in turn: replies accepted and none invalid; and chimed's own count of v5
/// replies is what chime perf counted back, in time or late.
#[test]
fn chime_perf_loads_chimed_over_ntpv5() {
    let chronyd = Chronyd::start();
    let mut chimed = start_chimed_with(&chronyd, &["--ntpv5"]);
    let target = chimed.addr.to_string();
    let mut counted = 0;
    for (flag, id) in DRAFTS {
        let (code, err, json) = chime_perf(&[
            "--target",
            &target,
            "--ntp-version",
            "5",
            "--ntpv5-draft",
            flag,
            "--rate",
            "300",
            "--duration",
            "1",
            "--warmup",
            "0",
        ]);
        assert_eq!(code, 0, "{err}");
        let json = json.unwrap();
        assert_eq!(json["request"]["ntp_version"], 5, "{json:#}");
        assert_eq!(json["request"]["ntpv5_draft"], id, "{json:#}");
        let step = &json["steps"][0];
        let n = |k: &str| step[k].as_u64().unwrap_or_else(|| panic!("{k}: {step:#}"));
        assert!(n("answered") > 0, "{step:#}");
        assert_eq!(n("invalid"), 0, "{step:#}");
        assert_eq!(n("refused"), 0, "{step:#}");
        // T2 read from the v5 reply's own place: chimed serves chronyd's time as it follows it,
        // microseconds from this host's clock either way, so some T2 may precede T1; a field
        // read from the wrong place would put all of them before T1, or far after.
        assert!(n("t2_before_t1") < n("answered"), "{step:#}");
        assert!(
            step["t2_t1_us"]["p99"].as_f64().unwrap() < 1000.0,
            "{step:#}"
        );
        counted += n("answered") + n("late");
    }
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "ntpv5"), counted, "{totals}");
    assert_eq!(count_in(&totals, "answered"), counted, "{totals}");
}

/// Replies that echo another cookie, or name another draft, are every one invalid and none
/// answered; the same responder's faithful replies are all answered.
#[test]
fn chime_perf_counts_replies_with_another_cookie_or_draft_invalid() {
    for how in [V5Reply::Faithful, V5Reply::WrongCookie, V5Reply::OtherDraft] {
        let responder = Responder::start(Policy::V5(how));
        let (code, err, json) = chime_perf(&[
            "--target",
            &responder.addr.to_string(),
            "--ntp-version",
            "5",
            "--rate",
            "300",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--timeout",
            "0.3",
        ]);
        assert_eq!(code, 0, "{err}");
        let json = json.unwrap();
        let step = &json["steps"][0];
        let n = |k: &str| step[k].as_u64().unwrap_or_else(|| panic!("{k}: {step:#}"));
        let replied = responder.replied();
        assert!(replied > 0, "{how:?}: {step:#}");
        let (answered, invalid) = match how {
            V5Reply::Faithful => (replied, 0),
            _ => (0, replied),
        };
        assert_eq!(
            (n("answered"), n("invalid")),
            (answered, invalid),
            "{how:?}: {step:#}"
        );
    }
}

/// `--mode 1` is v4's, `--nts` v4's and v5's, `--ntpv5-draft` needs `--ntp-version 5`, and there
/// is no version 6: exit 2, the flag named.
#[test]
fn chime_perf_refuses_v5_with_flags_that_do_not_apply() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--ntp-version", "5", "--mode", "1"],
            "--mode: NTPv5 has client mode (3) only",
        ),
        (
            &["--ntp-version", "3", "--nts", "127.0.0.1"],
            "--nts: NTS is client mode of NTPv4 or NTPv5 only",
        ),
        (
            &["--ntpv5-draft", "09"],
            "--ntpv5-draft: only with --ntp-version 5",
        ),
        (
            &["--ntp-version", "5", "--ntpv5-draft", "7"],
            "--ntpv5-draft",
        ),
        (&["--ntp-version", "6"], "--ntp-version"),
    ];
    for (flags, says) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_chime"))
            .args(["perf", "ntp", "--target", "127.0.0.1:9", "--rate", "100"])
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(
            err.starts_with("error:") && err.contains(says),
            "{flags:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{flags:?}");
    }
}
