//! The schema, its layering and its checks, through `settings` as the daemon calls it.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::schema::Config;
use super::*;

fn resolve_with(file: &str, flags: &[&str]) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chimed.toml");
    std::fs::write(&path, file).unwrap();
    let mut argv = vec!["chimed", "--config", path.to_str().unwrap()];
    argv.extend_from_slice(flags);
    settings(&Args::try_parse_from(argv).unwrap())
}

#[test]
fn defaults_match_rsntp() {
    let s = settings(&Args::try_parse_from(["chimed"]).unwrap()).unwrap();
    assert_eq!((s.ipv4_threads, s.ipv6_threads), (1, 1));
    assert_eq!(s.ipv4_address, "0.0.0.0:123".parse().unwrap());
    assert_eq!(s.ipv6_address, "[::]:123".parse().unwrap());
    assert_eq!(s.server_address, "127.0.0.1:11123".parse().unwrap());
    assert_eq!(s.stale_after, Duration::from_secs(8));
}

#[test]
fn flags_override_the_file() {
    let s = resolve_with("[ntp]\nipv4-threads = 3\nipv6-threads = 2\n", &["-4", "5"]).unwrap();
    assert_eq!((s.ipv4_threads, s.ipv6_threads), (5, 2));
}

#[test]
fn unknown_key_names_file_and_line() {
    let e = resolve_with("[ntp]\nipv4-thread = 2\n", &[]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("line 2") && msg.contains("ipv4-thread"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "one line: {msg}");
}

#[test]
fn bad_value_names_the_key_in_the_file() {
    let e = resolve_with("ntp.ipv4-address = \"[::1]:123\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("ipv4-address") && e.to_string().contains("chimed.toml"));
    let e = resolve_with("[upstream]\nstale-after = 0.5\n", &[]).unwrap_err();
    assert!(e.to_string().contains("stale-after"), "{e}");
    let e = resolve_with("[ntp]\nipv4-threads = 0\nipv6-threads = 0\n", &[]).unwrap_err();
    assert!(e.to_string().contains("no NTP threads"), "{e}");
}

#[test]
fn timezone_needs_tz_offset_and_a_real_zone() {
    let e = resolve_with("[tz-offset]\ntimezone = \"Asia/Kolkata\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("tz-offset"), "{e}");
    let s = resolve_with(
        "[tz-offset]\nenabled = true\ntimezone = \"Asia/Kolkata\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(s.tz_offset, Some(Some("Asia/Kolkata".into())));
    let e = resolve_with("", &["--tz-offset", "--timezone", "Nowhere/Atlantis"]).unwrap_err();
    assert!(e.to_string().contains("Nowhere/Atlantis"), "{e}");
}

#[test]
fn xdp_options_need_an_interface_and_a_known_mode() {
    let e = resolve_with("[xdp]\nthreads = 2\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("xdp.threads") && e.contains("without xdp"),
        "{e}"
    );
    let e = resolve_with("", &["--xdp-fallback"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--xdp-fallback"), "{e}");
    let e = resolve_with("[xdp]\ninterface = \"eth0\"\n", &["--xdp-mode", "fast"]).unwrap_err();
    assert!(e.to_string().contains("\"fast\""), "{e}");
    let e = resolve_with("[xdp]\ninterface = \"eth0/1\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an interface name"), "{e}");
    let s = resolve_with(
        "[xdp]\ninterface = \"eth0\"\nmode = \"zero-copy\"\n",
        &["--xdp-threads", "4"],
    )
    .unwrap();
    assert_eq!(
        s.xdp,
        Some(Xdp {
            interface: "eth0".into(),
            threads: 4,
            mode: Some(chime_udp::xdp::XdpMode::ZeroCopy),
            fallback: false,
        })
    );
    let s = resolve_with("", &[]).unwrap();
    assert_eq!(s.xdp, None);
}

/// A Roughtime key file of seed [7; 32] in `dir`, with this mode.
fn key_file(dir: &tempfile::TempDir, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let key = dir.path().join("key");
    std::fs::write(&key, chime_roughtime::encode_key_file(&[7; 32]).as_bytes()).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
    key
}

#[test]
fn roughtime_key_file_is_checked() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(&dir, 0o644);
    let flag = ["--roughtime-key", key.to_str().unwrap()];
    let e = resolve_with("", &flag).unwrap_err().to_string();
    assert!(e.contains("--roughtime-key") && e.contains("0644"), "{e}");

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = resolve_with("", &flag).unwrap();
    let rt = s.roughtime.unwrap();
    let RoughtimeKeys::LongTerm { seed, .. } = &rt.keys else {
        panic!("not the long-term key");
    };
    assert_eq!(**seed, [7; 32]);
    assert_eq!(rt.ipv4_address, "0.0.0.0:5319".parse().unwrap());
    let tcp = rt.tcp.unwrap();
    assert_eq!((tcp.connections, tcp.per_address), (1024, 16));
    assert_eq!(tcp.idle, Duration::from_secs(10));
    let off = ["--roughtime-tcp-connections", "0"];
    let udp_only = resolve_with("", &[&flag[..], &off[..]].concat()).unwrap();
    assert_eq!(udp_only.roughtime.unwrap().tcp, None);
    assert!(
        !format!("{rt:?}").contains("07, 07"),
        "the seed must not be printed"
    );

    std::fs::write(&key, "not a key\n").unwrap();
    let e = resolve_with("", &flag).unwrap_err().to_string();
    assert!(e.contains("not a key file") && e.contains("line 1"), "{e}");
    let e = resolve_with("[roughtime]\nkey = \"/nonexistent/key\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/key"), "{e}");
}

#[test]
fn a_delegation_bundle_is_checked_and_not_with_a_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(&dir, 0o600);
    let long = chime_roughtime::LongTermKey::from_seed(&[7; 32]);
    let plan = chime_roughtime::BundlePlan {
        start_unix_s: 1_795_000_000,
        span_s: 86_400,
        step_s: 3600,
        window_s: 7200,
    };
    let bundle = chime_roughtime::make_bundle(&long, plan, || [9; 32]).unwrap();
    let file = dir.path().join("bundle");
    std::fs::write(&file, bundle.encode().as_bytes()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let f = file.to_str().unwrap();
    let s = resolve_with("", &["--roughtime-delegation", f]).unwrap();
    let RoughtimeKeys::Bundle { bundle: read, .. } = &s.roughtime.unwrap().keys else {
        panic!("not the bundle");
    };
    assert_eq!(read.windows().len(), bundle.windows().len());
    let both = [
        "--roughtime-delegation",
        f,
        "--roughtime-key",
        key.to_str().unwrap(),
    ];
    let e = resolve_with("", &both).unwrap_err().to_string();
    assert!(
        e.starts_with("--roughtime-delegation: not with --roughtime-key"),
        "{e}"
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = resolve_with("", &["--roughtime-delegation", f])
        .unwrap_err()
        .to_string();
    assert!(e.contains("readable by group or others (mode 0640)"), "{e}");
    std::fs::write(&file, "frob\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = resolve_with("", &["--roughtime-delegation", f])
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("bundle: line 1: expected long-term-public, window or cert"),
        "{e}"
    );
}

#[test]
fn each_service_has_its_own_receive_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(&dir, 0o600);
    let flag = ["--roughtime-key", key.to_str().unwrap()];

    let s = resolve_with("", &flag).unwrap();
    assert_eq!(s.recv_buffer, 4 << 20);
    assert_eq!(s.roughtime.unwrap().recv_buffer, 16 << 20);

    let s = resolve_with(
        "ntp.recv-buffer = 8192\nroughtime.recv-buffer = 65536\n",
        &flag,
    )
    .unwrap();
    assert_eq!(s.recv_buffer, 8192);
    assert_eq!(s.roughtime.unwrap().recv_buffer, 65536);

    let e = resolve_with("[roughtime]\nrecv-buffer = 100\n", &flag)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("chimed.toml") && e.contains("roughtime.recv-buffer") && e.contains("4096"),
        "{e}"
    );
    let e = resolve_with("[ntp]\nrecv-buffer = 2147483648\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("recv-buffer") && e.contains("outside"), "{e}");
}

#[test]
fn a_fleet_key_serves_nts_without_a_certificate_with_its_own_period() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet");
    std::fs::write(&file, format!("secret {}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let f = file.to_str().unwrap();
    let s = resolve_with("", &["--nts-fleet-key", f, "--nts-rotation", "3600"]).unwrap();
    assert!(s.nts.is_none(), "no certificate: no NTS-KE");
    let fleet = s.nts_fleet.unwrap();
    assert_eq!(fleet.period, Duration::from_secs(3600));
    assert!(fleet.secrets.1.is_none());
    // Without a fleet key, a rotation still needs a certificate.
    let e = resolve_with("", &["--nts-rotation", "3600"])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--nts-rotation: only takes effect"), "{e}");
}

#[test]
fn the_ntp_server_nts_ke_names_may_carry_a_port() {
    let ok = |v: &str| resolve::split_ntp_server(v).unwrap();
    assert_eq!(ok("ntp.example.net"), ("ntp.example.net".into(), None));
    assert_eq!(ok("192.0.2.1:4123"), ("192.0.2.1".into(), Some(4123)));
    assert_eq!(ok("2001:db8::1"), ("2001:db8::1".into(), None));
    assert_eq!(ok("[2001:db8::1]:123"), ("2001:db8::1".into(), Some(123)));
    assert_eq!(ok("[2001:db8::1]"), ("2001:db8::1".into(), None));
    for (bad, says) in [
        ("ntp example", "is not an IP address or a domain name"),
        ("host:0", "\"0\" is not a port"),
        ("host:99999", "\"99999\" is not a port"),
        ("[2001:db8::1", "no ] after the IPv6 address"),
        ("[2001:db8::1]x", "only :PORT may follow ]"),
    ] {
        let e = resolve::split_ntp_server(bad).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn shedding_is_on_by_default_and_its_settings_are_checked() {
    let s = resolve_with("", &[]).unwrap();
    assert_eq!(s.shed, Some(ShedConfig::default()));
    let s = resolve_with(
        "[overload]\nshed-target = 0.01\nshed-interval = 0.25\n",
        &[],
    )
    .unwrap();
    let shed = s.shed.unwrap();
    assert_eq!(
        (shed.target, shed.interval),
        (Duration::from_millis(10), Duration::from_millis(250))
    );
    // The flag wins over the file; 0 turns shedding off.
    let s = resolve_with("[overload]\nshed-target = 0.01\n", &["--shed-target", "0"]).unwrap();
    assert_eq!(s.shed, None);
    for (file, key) in [
        ("[overload]\nshed-target = 2.0\n", "overload.shed-target"),
        ("[overload]\nshed-target = -0.1\n", "overload.shed-target"),
        (
            "[overload]\nshed-interval = 11.0\n",
            "overload.shed-interval",
        ),
    ] {
        let e = resolve_with(file, &[]).unwrap_err().to_string();
        assert!(
            e.contains("chimed.toml") && e.contains(key) && e.contains("outside"),
            "{file}: {e}"
        );
    }
    // A flag out of range is refused as clap parses it (chimed prints `--shed-target: ...`).
    let e = Args::try_parse_from(["chimed", "--shed-target", "1.5"]).unwrap_err();
    assert!(
        e.to_string().contains("1.5 seconds is outside 0..=1"),
        "{e}"
    );
}

#[test]
fn roughtime_values_are_checked_while_roughtime_is_off() {
    for (file, key) in [
        ("roughtime.recv-buffer = 100\n", "roughtime.recv-buffer"),
        ("roughtime.batch-size = 300\n", "roughtime.batch-size"),
        ("roughtime.gather = 1.0\n", "roughtime.gather"),
        ("roughtime.grease = 1.5\n", "roughtime.grease"),
        ("roughtime.grease = -0.1\n", "roughtime.grease"),
        (
            "roughtime.grease-kinds = \"path,bogus\"\n",
            "roughtime.grease-kinds",
        ),
        (
            "roughtime.grease-kinds = \"nonce,nonce\"\n",
            "roughtime.grease-kinds",
        ),
        ("roughtime.grease-kinds = \"\"\n", "roughtime.grease-kinds"),
        (
            "roughtime.ipv4-address = \"[::1]:5319\"\n",
            "roughtime.ipv4-address",
        ),
        ("roughtime.rotation = 0.0\n", "roughtime.rotation"),
        (
            "roughtime.tcp.per-address = 0\n",
            "roughtime.tcp.per-address",
        ),
        (
            "roughtime.tcp.connections = 2000000\n",
            "roughtime.tcp.connections",
        ),
        ("roughtime.tcp.idle = 0.0\n", "roughtime.tcp.idle"),
        ("roughtime.tcp.lifetime = -1.0\n", "roughtime.tcp.lifetime"),
    ] {
        let e = resolve_with(file, &[]).unwrap_err().to_string();
        assert!(e.contains("chimed.toml") && e.contains(key), "{file}: {e}");
    }
    // Good values without a key are fine, and Roughtime stays off.
    let file = "[roughtime]\nbatch-size = 64\nipv4-threads = 0\nipv6-threads = 0\n";
    assert!(resolve_with(file, &[]).unwrap().roughtime.is_none());
}

#[test]
fn wrong_type_is_a_parse_error() {
    let e = resolve_with("ntp.ipv4-threads = \"two\"\n", &[]).unwrap_err();
    assert!(matches!(e, ConfigError::Parse { line: 1, .. }), "{e}");
}

#[test]
fn a_flag_turns_off_a_switch_the_file_turns_on() {
    let file = "[ratelimit]\nenabled = true\n[tz-offset]\nenabled = true\n";
    let s = resolve_with(file, &[]).unwrap();
    assert!(s.ratelimit.is_some() && s.tz_offset.is_some());
    let s = resolve_with(file, &["--ratelimit=false", "--tz-offset=false"]).unwrap();
    assert_eq!((s.ratelimit, s.tz_offset), (None, None));
    // A bare switch still means true.
    let s = resolve_with("", &["--ratelimit"]).unwrap();
    assert_eq!(s.ratelimit.unwrap().limit, RateLimit::DEFAULT);
}

#[test]
fn a_key_of_the_flat_file_is_named_with_its_section() {
    for (file, says) in [
        (
            "ipv4-threads = 2\n",
            "ipv4-threads is now [ntp] ipv4-threads",
        ),
        (
            "\nratelimit = true\n",
            "ratelimit is now [ratelimit] enabled",
        ),
        ("xdp = \"eth0\"\n", "xdp is now [xdp] interface"),
        (
            "roughtime-tcp-idle = 5\n",
            "roughtime-tcp-idle is now [roughtime.tcp] idle",
        ),
    ] {
        let e = resolve_with(file, &[]).unwrap_err().to_string();
        let line = if file.starts_with('\n') { 2 } else { 1 };
        assert!(
            e.ends_with(&format!("chimed.toml, line {line}: {says}")),
            "{e}"
        );
    }
}

#[test]
fn a_bad_value_names_its_line_or_its_flag() {
    let file = "[ntp]\nbatch-size = 8\n\n[ratelimit]\nenabled = true\nleak = 9\n";
    let e = resolve_with(file, &[]).unwrap_err().to_string();
    assert!(
        e.ends_with("chimed.toml, line 6: ratelimit.leak: must be 1 to 4, not 9"),
        "{e}"
    );
    let e = resolve_with(file, &["--ratelimit-leak", "0"])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "--ratelimit-leak: must be 1 to 4, not 0");
    // A default at fault is named as such.
    let e = resolve_with("upstream.poll-interval = 10\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("upstream.stale-after (not set, its default): 8 s"),
        "{e}"
    );
}

/// Each flag's id is the dotted path of a key the file takes: an error about a value finds its
/// flag through it, and chimed.toml(5) files the flag under that key.
#[test]
fn every_flag_is_a_key_of_the_file() {
    use clap::CommandFactory as _;
    let mut keys = 0;
    for arg in Args::command().get_arguments() {
        let Some((section, key)) = arg.get_id().as_str().rsplit_once('.') else {
            continue;
        };
        // A known key with a value of the wrong type, against an unknown key.
        let text = format!("[{section}]\n{key} = {{ x = 1 }}\n");
        let e = toml::from_str::<Config>(&text).unwrap_err().to_string();
        assert!(!e.contains("unknown field"), "{}: {e}", arg.get_id());
        keys += 1;
    }
    assert!(keys > 60, "{keys}");
    let e = toml::from_str::<Config>("[ntp]\nno-such-key = { x = 1 }\n").unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
}

#[test]
fn sighup_takes_the_access_rules_and_names_what_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chimed.toml");
    std::fs::write(
        &path,
        "[ntp]\nipv4-threads = 2\n[access]\ndeny = [\"192.0.2.0/24\"]\n",
    )
    .unwrap();
    let args = Args::try_parse_from(["chimed", "-c", path.to_str().unwrap(), "-6", "3"]).unwrap();
    let current = settings(&args).unwrap();
    let same = reload(&args, &current).unwrap().unwrap();
    assert_eq!((same.acl, same.restart), (current.acl.clone(), vec![]));
    assert_eq!(same.log_level, "info");

    let file = "[ntp]\nipv4-threads = 4\nipv6-threads = 1\n[observe]\nlog-level = \"debug\"\n\
                [access]\ndeny = [\"198.51.100.0/24\"]\n";
    std::fs::write(&path, file).unwrap();
    let new = reload(&args, &current).unwrap().unwrap();
    assert_eq!(new.acl, Acl::new(&[], &["198.51.100.0/24".into()]).unwrap());
    // ipv6-threads is the flag's, whatever the file says; the log level is put in force.
    assert_eq!(new.restart, ["ntp.ipv4-threads"]);
    assert_eq!(new.log_level, "debug");

    std::fs::write(&path, "[ntp]\nipv4-threads = 5000\n").unwrap();
    let e = reload(&args, &current).unwrap_err().to_string();
    assert!(e.contains("line 2: ntp.ipv4-threads"), "{e}");
    let no_file = Args::try_parse_from(["chimed"]).unwrap();
    assert!(reload(&no_file, &current).unwrap().is_none());
}

/// The default each flag's help states (`[default: 64]`, `[default: 4 MiB]`) is the one chimed
/// uses: giving that value changes nothing. Checked for every default that is a number or an
/// address, with every service on so that no value is ignored (resolving reads no key file).
#[test]
fn the_documented_defaults_are_the_defaults() {
    use clap::CommandFactory as _;
    let on = [
        "--ratelimit",
        "--nts-ratelimit",
        "--nts-certificate=/c",
        "--nts-private-key=/k",
        "--roughtime-key=/r",
        "--xdp=eth0",
        "--tz-offset",
    ];
    let resolved = |extra: &[String]| {
        let argv = ["chimed"].iter().chain(&on).map(|a| a.to_string());
        let args = Args::try_parse_from(argv.chain(extra.iter().cloned())).unwrap();
        let mut r = resolve::resolve(&args).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        r.settings.given = Given::default();
        format!(
            "{:?} {:?} {:?} {:?}",
            r.settings, r.nts, r.fleet, r.roughtime
        )
    };
    let plain = resolved(&[]);
    let mut checked = Vec::new();
    for arg in Args::command().get_arguments() {
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let Some(rest) = help.split("[default: ").nth(1) else {
            continue;
        };
        // `[::]:123` keeps its brackets; anything else ends at a space, comma or bracket.
        let value = match rest.strip_prefix('[') {
            Some(v6) => format!("[{}", v6.split_inclusive(']').take(2).collect::<String>()),
            None => rest.split([' ', ',', ']']).next().unwrap_or("").to_owned(),
        };
        let value = value.trim_end_matches(']').to_owned();
        let value = match rest.split([',', ']']).next() {
            Some(v) if v.ends_with(" MiB") => (value.parse::<usize>().unwrap() << 20).to_string(),
            _ => value,
        };
        let number = value.parse::<f64>().is_ok();
        if !number && value.parse::<std::net::SocketAddr>().is_err() {
            continue;
        }
        let flag = format!("--{}={value}", arg.get_long().unwrap());
        assert_eq!(
            resolved(std::slice::from_ref(&flag)),
            plain,
            "{flag} is not the default"
        );
        checked.push(flag);
    }
    assert!(checked.len() > 35, "{checked:?}");
}
