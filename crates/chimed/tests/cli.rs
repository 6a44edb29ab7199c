//! Bad input gets one clear line naming the input, and exit status 2; never a panic.

mod common;

use std::process::Command;

fn chimed(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_chimed"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    for (args, needle) in [
        (&["-4", "two"][..], "ipv4-threads"),
        (&["-4", "5000"][..], "ipv4-threads"),
        (&["-a", "not-an-address"][..], "ipv4-address"),
        (&["-a", "[::1]:123"][..], "--ipv4-address"),
        (&["-b", "127.0.0.1:123"][..], "--ipv6-address"),
        (&["--stale-after", "0.5"][..], "--stale-after"),
        (&["--batch-size", "0"][..], "batch-size"),
        (
            &["--roughtime-batch-size", "0"][..],
            "--roughtime-batch-size",
        ),
        (&["--roughtime-batch-size", "257"][..], "outside 1..=256"),
        (&["--recv-buffer", "100"][..], "outside 4096..="),
        (
            &["--roughtime-recv-buffer", "16M"][..],
            "--roughtime-recv-buffer",
        ),
        (&["--log-level", "loud=="][..], "--log-level"),
        (&["--no-such-flag"][..], "--no-such-flag"),
        (&["-u", "no-such-user-here"][..], "--user"),
        (&["-r", "/nonexistent/root"][..], "--root"),
        (&["-r", "relative/root"][..], "--root"),
        (&["--allow", "10.0.0.0/33"][..], "--allow: '10.0.0.0/33'"),
        (&["--deny", "example.net"][..], "--deny: 'example.net'"),
    ] {
        let (code, err) = chimed(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {args:?}: {err}");
    }
}

#[test]
fn bad_config_file_exit_2_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chimed.toml");
    std::fs::write(&path, "ipv4-threads = 2\nno-such-key = 1\n").unwrap();
    let (code, err) = chimed(&["--config", path.to_str().unwrap(), "--check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("chimed.toml") && err.contains("line 2") && err.contains("no-such-key"));
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    let (code, err) = chimed(&["--config", "/nonexistent/chimed.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/chimed.toml"), "{err}");
}

#[test]
fn shipped_configs_pass_check_config() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let out = Command::new(env!("CARGO_BIN_EXE_chimed"))
                .arg("--config")
                .arg(&path)
                .arg("--check-config")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no .toml files in configs/");
}

#[test]
fn rate_limit_options_are_checked() {
    for (args, needle) in [
        (
            &["--ratelimit-burst", "4"][..],
            "--ratelimit-burst: only takes effect with ratelimit",
        ),
        (
            &["--ratelimit", "--ratelimit-interval", "-20"][..],
            "--ratelimit-interval: must be -19 to 12, not -20",
        ),
        (
            &["--ratelimit", "--ratelimit-burst", "0"][..],
            "--ratelimit-burst: must be 1 to 255",
        ),
        (
            &["--ratelimit", "--ratelimit-leak", "0"][..],
            "--ratelimit-leak: must be 1 to 4",
        ),
        (
            &["--ratelimit", "--ratelimit-kod", "5"][..],
            "--ratelimit-kod: must be 0 to 4",
        ),
        (
            &["--ratelimit", "--ratelimit-clients", "2"][..],
            "--ratelimit-clients: 2 clients",
        ),
    ] {
        let (code, err) = chimed(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chimed.toml");
    std::fs::write(&path, "ratelimit = true\nratelimit-leak = 9\n").unwrap();
    let (code, err) = chimed(&["--config", path.to_str().unwrap(), "--check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("chimed.toml: ratelimit-leak: must be 1 to 4, not 9"),
        "{err}"
    );
    std::fs::write(
        &path,
        "ratelimit = true\nratelimit-interval = -4\nratelimit-kod = 2\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chimed"))
        .args(["--config", path.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("interval: -4") && shown.contains("kod: 2"),
        "{shown}"
    );
}

/// systemd hands a service its credentials (`LoadCredential=`) in a directory private to it,
/// each file readable by the service's user through an ACL, which `stat` shows as a group read
/// bit (mode 0440). There, and only there, chimed takes a secret file with that bit: the same
/// files elsewhere are refused, naming the file and what it holds.
#[test]
fn secrets_in_systemds_credentials_directory_may_carry_a_group_bit() {
    use std::os::unix::fs::PermissionsExt as _;
    let key = common::chime_keygen();
    let creds = tempfile::tempdir().unwrap();
    let fleet = creds.path().join("nts-fleet.key");
    let made = Command::new(common::workspace_bin("chime"))
        .arg("nts-fleet-key")
        .arg(&fleet)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let roughtime = creds.path().join("roughtime.key");
    std::fs::copy(&key.file, &roughtime).unwrap();
    for f in [&fleet, &roughtime] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o440)).unwrap();
    }
    let args = [
        "--check-config",
        "--nts-fleet-key",
        fleet.to_str().unwrap(),
        "--roughtime-key",
        roughtime.to_str().unwrap(),
    ];
    let run = |credentials: Option<&std::path::Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_chimed"));
        cmd.args(args).env_remove("CREDENTIALS_DIRECTORY");
        if let Some(dir) = credentials {
            cmd.env("CREDENTIALS_DIRECTORY", dir);
        }
        cmd.output().unwrap()
    };
    let out = run(Some(creds.path()));
    assert!(out.status.success(), "{out:?}");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = run(Some(elsewhere.path()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("readable by group or others (mode 0440)") && err.contains("it holds"),
        "{err}"
    );
    let out = run(None);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Others' read bit is refused even there.
    std::fs::set_permissions(&fleet, std::fs::Permissions::from_mode(0o444)).unwrap();
    let out = run(Some(creds.path()));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
