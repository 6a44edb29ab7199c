//! Bad input gets one clear line naming the input, and exit status 2; never a panic.

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
