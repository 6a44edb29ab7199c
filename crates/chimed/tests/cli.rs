//! Bad input gets one clear line naming the input, and exit status 2; never a panic.

mod common;

use std::process::Command;

/// chimed's exit status and what it said. Bad input must end it at once: one that starts a
/// server instead (an input that should be refused but is not) is killed after 10 s, and the
/// status -1 fails the test rather than hanging it.
fn chimed(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chimed"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
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
            &["--shed-target", "1.5"][..],
            "chimed: --shed-target: 1.5 seconds is outside 0..=1",
        ),
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
    std::fs::write(&path, "[ntp]\nno-such-key = 1\n").unwrap();
    let (code, err) = chimed(&["--config", path.to_str().unwrap(), "--check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("chimed.toml") && err.contains("line 2") && err.contains("no-such-key"));
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    let (code, err) = chimed(&["--config", "/nonexistent/chimed.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/chimed.toml"), "{err}");

    // A key of the flat file that came before sections is named with its new place.
    std::fs::write(&path, "# chimed\nnts-ke-threads = 2\n").unwrap();
    let (code, err) = chimed(&["--config", path.to_str().unwrap(), "--check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.trim_end()
            .ends_with("chimed.toml, line 2: nts-ke-threads is now [nts] ke-threads"),
        "{err}"
    );
}

/// A switch the file turns on, a flag turns off: `--ratelimit=false`; `--ratelimit` alone is true.
#[test]
fn a_flag_turns_off_the_files_switch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chimed.toml");
    std::fs::write(&path, "[ratelimit]\nenabled = true\n").unwrap();
    let shown = |flags: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chimed"))
            .args(["--check-config", "--config", path.to_str().unwrap()])
            .args(flags)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(shown(&[]).contains("[ratelimit]\nenabled = true\n"));
    assert!(shown(&["--ratelimit=false"]).contains("[ratelimit]\nenabled = false\n"));
    assert!(shown(&["--ratelimit"]).contains("[ratelimit]\nenabled = true\n"));
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

/// A pool token file, mode 0600, for `[nts] pool-tokens`.
fn pool_token_file(dir: &std::path::Path) -> std::path::PathBuf {
    let pool = dir.join("pool-tokens");
    std::fs::write(&pool, "token an-example-pool-token\n").unwrap();
    std::fs::set_permissions(&pool, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    pool
}

/// Every key the example config shows commented out, uncommented, passes --check-config. A key
/// marked `# instead of KEY` excludes KEY: one run takes the first of each pair, one the other.
/// The files the keys name are made here and given by flag, which wins over the file's path.
#[test]
fn every_example_key_uncommented_passes_check_config() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../configs/chimed.toml"
    ))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = common::certificate(dir.path(), "localhost");
    let rt = common::chime_keygen();
    let bundle = dir.path().join("bundle");
    common::chime_delegate(&rt.file, &bundle, &[]);
    let mldsa = dir.path().join("mldsa.key");
    let fleet = dir.path().join("fleet.key");
    let pool = pool_token_file(dir.path());
    let mut makes = vec![
        Command::new(common::workspace_bin("chime"))
            .arg("nts-fleet-key")
            .arg(&fleet)
            .output(),
    ];
    // The experimental suite's key, where it is built in (`--features mldsa`); elsewhere its
    // line stays commented out (`mldsa_is_refused_where_it_is_not_built_in` covers that).
    if cfg!(feature = "mldsa") {
        makes.push(
            Command::new(common::workspace_bin("chime"))
                .args(["keygen", "--mldsa"])
                .arg(&mldsa)
                .output(),
        );
    }
    for made in makes {
        let made = made.unwrap();
        assert!(made.status.success(), "{made:?}");
    }
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap();
    let p = |f: &std::path::Path| f.to_str().unwrap().to_owned();
    // Each flag with the key it stands in for, so that a run leaves out the one it skips.
    let flags = [
        ("--nts-certificate", p(&cert), "[nts]", "certificate"),
        ("--nts-private-key", p(&key), "[nts]", "private-key"),
        ("--nts-dump-dir", p(dir.path()), "[nts]", "dump-dir"),
        ("--nts-fleet-key", p(&fleet), "[nts]", "fleet-key"),
        ("--nts-pool-tokens", p(&pool), "[nts]", "pool-tokens"),
        ("--roughtime-key", p(&rt.file), "[roughtime]", "key"),
        (
            "--roughtime-delegation",
            p(&bundle),
            "[roughtime]",
            "delegation",
        ),
        (
            "--roughtime-mldsa-key",
            p(&mldsa),
            "[roughtime]",
            "mldsa-key",
        ),
        ("--user", user.name, "[process]", "user"),
        ("--root", "/".to_owned(), "[process]", "root"),
    ];
    // (section, key) of each `# instead of KEY` line and of the KEY it replaces.
    let mut section = String::new();
    let (mut instead, mut replaced) = (Vec::new(), Vec::new());
    for line in text.lines() {
        if line.starts_with('[') {
            section = line.to_owned();
        } else if let Some((key_line, other)) = line.split_once("   # instead of ") {
            let key = key_line.trim_start_matches("# ").split(' ').next().unwrap();
            instead.push((section.clone(), key.to_owned()));
            replaced.push((section.clone(), other.trim().to_owned()));
        }
    }
    assert!(instead.len() >= 2, "{instead:?}");
    if !cfg!(feature = "mldsa") {
        let mldsa = ("[roughtime]".to_owned(), "mldsa-key".to_owned());
        instead.push(mldsa.clone());
        replaced.push(mldsa);
    }
    for (skip, run) in [(&instead, "first"), (&replaced, "second")] {
        let (out, uncommented) = uncomment(&text, skip);
        assert!(
            uncommented >= 40,
            "{run} run: {uncommented} keys uncommented"
        );
        let path = dir.path().join(format!("{run}.toml"));
        std::fs::write(&path, &out).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_chimed"));
        cmd.args(["--check-config", "--config", path.to_str().unwrap()]);
        for (flag, value, section, key) in &flags {
            if !skip.contains(&((*section).to_owned(), (*key).to_owned())) {
                cmd.args([flag, value.as_str()]);
            }
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{run} run: {err}\n{}", path.display());
    }
}

/// `text` with every commented-out key line (`# key = value`) uncommented but those in `skip`
/// (`[section]`, key), and how many it uncommented.
fn uncomment(text: &str, skip: &[(String, String)]) -> (String, usize) {
    let (mut section, mut out, mut uncommented) = (String::new(), String::new(), 0);
    for line in text.lines() {
        if line.starts_with('[') {
            section = line.to_owned();
        }
        let key = line
            .strip_prefix("# ")
            .and_then(|l| l.split_once(" = "))
            .map(|(k, _)| k);
        let is_key = key.is_some_and(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '-'));
        let skipped = key.is_some_and(|k| skip.contains(&(section.clone(), k.to_owned())));
        if is_key && !skipped {
            out.push_str(&line[2..]);
            uncommented += 1;
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    (out, uncommented)
}

#[test]
fn rate_limit_options_are_checked() {
    for (args, needle) in [
        (
            &["--ratelimit-burst", "4"][..],
            "--ratelimit-burst: only takes effect with --ratelimit",
        ),
        (
            &["--ratelimit-clients", "1024", "--check-config"][..],
            "--ratelimit-clients: only takes effect with --ratelimit",
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
    std::fs::write(&path, "[ratelimit]\nenabled = true\nleak = 9\n").unwrap();
    let (code, err) = chimed(&["--config", path.to_str().unwrap(), "--check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("chimed.toml, line 3: ratelimit.leak: must be 1 to 4, not 9"),
        "{err}"
    );
    std::fs::write(
        &path,
        "[ratelimit]\nenabled = true\ninterval = -4\nkod = 2\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chimed"))
        .args(["--config", path.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("interval = -4\n") && shown.contains("kod = 2\n"),
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

/// Without the `mldsa` feature the experimental suite's key is refused, naming the feature.
#[cfg(not(feature = "mldsa"))]
#[test]
fn mldsa_is_refused_where_it_is_not_built_in() {
    let (code, err) = chimed(&["--roughtime-mldsa-key", "/nonexistent", "--check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--roughtime-mldsa-key") && err.contains("--features mldsa"),
        "{err}"
    );
}

/// chime's report into a pipe whose reader has gone (`chime ... | head -1` once head is done)
/// ends chime with the status of a process SIGPIPE ends (141), saying nothing: not a panic.
#[test]
fn a_report_into_a_closed_pipe_ends_chime_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(common::workspace_bin("chime"))
        .arg("keygen")
        .arg(dir.path().join("key"))
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");

    // Its reader gone after the first line (`| head -1`): `chime perf`'s table, written after
    // the run, ends it the same way (30 requests to a closed loopback port).
    let port = common::free_udp_port();
    let mut perf = Command::new(common::workspace_bin("chime"))
        .args(["perf", "ntp", "--target", &format!("127.0.0.1:{port}")])
        .args([
            "--rate",
            "100",
            "--duration",
            "0.3",
            "--warmup",
            "0",
            "--timeout",
            "0.1",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut stdout = std::io::BufReader::new(perf.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
    drop(stdout);
    let out = perf.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(first.starts_with("chime perf ntp:"), "{first}");
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
