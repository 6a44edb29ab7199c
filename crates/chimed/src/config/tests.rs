//! The schema, its layering and its rules, through `settings` as the daemon calls it.

use std::time::Duration;

use super::*;

/// The settings from `file` as the config file and `flags` on the command line.
pub(crate) fn resolve_with(file: &str, flags: &[&str]) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chimed.toml");
    std::fs::write(&path, file).unwrap();
    let mut argv = vec!["chimed", "--config", path.to_str().unwrap()];
    argv.extend_from_slice(flags);
    settings(&Args::parse_from(argv).unwrap())
}

#[test]
fn defaults_match_rsntp() {
    let s = settings(&Args::parse_from(["chimed"]).unwrap()).unwrap();
    assert_eq!((s.ntp.ipv4_threads.0, s.ntp.ipv6_threads.0), (1, 1));
    assert_eq!(s.ntp.ipv4_address.0, "0.0.0.0:123".parse().unwrap());
    assert_eq!(s.ntp.ipv6_address.0, "[::]:123".parse().unwrap());
    assert_eq!(
        s.upstream.server_address,
        "127.0.0.1:11123".parse().unwrap()
    );
    assert_eq!(s.upstream.stale_after.duration(), Duration::from_secs(8));
    assert_eq!(s.shed(), Some(ShedConfig::default()));
    assert!(s.roughtime_key().is_none() && s.nts_ke().is_none() && s.tz_offset().is_none());
}

#[test]
fn flags_override_the_file_and_the_file_the_defaults() {
    let s = resolve_with("[ntp]\nipv4-threads = 3\nipv6-threads = 2\n", &["-4", "5"]).unwrap();
    assert_eq!((s.ntp.ipv4_threads.0, s.ntp.ipv6_threads.0), (5, 2));
    let file = "[overload]\nshed-target = 0.01\nshed-interval = 0.25\n";
    let shed = resolve_with(file, &[]).unwrap().shed().unwrap();
    assert_eq!(
        (shed.target, shed.interval),
        (Duration::from_millis(10), Duration::from_millis(250))
    );
    // 0 turns shedding off.
    let s = resolve_with(file, &["--shed-target", "0"]).unwrap();
    assert_eq!(s.shed(), None);
}

#[test]
fn a_flag_turns_off_a_switch_the_file_turns_on() {
    let file = "[ratelimit]\nenabled = true\n[tz-offset]\nenabled = true\n";
    let s = resolve_with(file, &[]).unwrap();
    assert!(s.ntp_rate_limit().is_some() && s.tz_offset().is_some());
    let s = resolve_with(file, &["--ratelimit=false", "--tz-offset=false"]).unwrap();
    assert_eq!((s.ntp_rate_limit(), s.tz_offset()), (None, None));
    // A bare switch still means true.
    let s = resolve_with("", &["--ratelimit"]).unwrap();
    assert_eq!(s.ntp_rate_limit().unwrap().limit, RateLimit::DEFAULT);
}

#[test]
fn an_error_names_the_file_and_line_the_flag_or_the_default() {
    let e = resolve_with("[ntp]\nipv4-thread = 2\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("ipv4-thread"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    let file = "[ntp]\nbatch-size = 8\n\n[ratelimit]\nenabled = true\nleak = 9\n";
    let e = resolve_with(file, &[]).unwrap_err().to_string();
    assert!(
        e.ends_with("chimed.toml, line 6: ratelimit.leak: must be 1 to 4, not 9"),
        "{e}"
    );
    let e = Args::parse_from(["chimed", "--ratelimit-leak", "0"]).unwrap_err();
    assert!(e.to_string().contains("must be 1 to 4, not 0"), "{e}");
    // A rule broken by a default names the default.
    let e = resolve_with("upstream.poll-interval = 10\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("upstream.stale-after (not set, its default): 8 s"),
        "{e}"
    );
    let e = resolve_with("ntp.ipv4-threads = \"two\"\n", &[]).unwrap_err();
    assert!(matches!(e, ConfigError::Parse { line: 1, .. }), "{e}");
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
fn a_key_that_takes_effect_only_with_another_is_refused_alone() {
    for (file, flags, says) in [
        (
            "[xdp]\nthreads = 2\n",
            &[][..],
            "xdp.threads: only takes effect with xdp.interface",
        ),
        (
            "",
            &["--xdp-fallback"][..],
            "--xdp-fallback: only takes effect with --xdp",
        ),
        (
            "[tz-offset]\ntimezone = \"UTC\"\n",
            &[],
            "with tz-offset.enabled",
        ),
        (
            "",
            &["--nts-rotation", "3600"],
            "--nts-rotation: only takes effect with",
        ),
        (
            "[ratelimit]\nclients = 1024\n",
            &[],
            "ratelimit.clients: only takes effect",
        ),
        ("", &["--roughtime-tcp-connections", "0"], ""),
        // Its default, written as an integer: the value, not how it is written, is compared.
        ("[nts]\nrotation = 86400\n", &[], ""),
        (
            "[nts]\nrotation = 3600\n",
            &[],
            "nts.rotation: only takes effect",
        ),
    ] {
        match resolve_with(file, flags) {
            Err(e) => assert!(!says.is_empty() && e.to_string().contains(says), "{e}"),
            Ok(_) => assert!(says.is_empty(), "{file} {flags:?}: accepted"),
        }
    }
    let e = resolve_with(
        "",
        &["--roughtime-delegation", "/b", "--roughtime-key", "/k"],
    );
    let e = e.unwrap_err().to_string();
    assert!(
        e.starts_with("--roughtime-delegation: not with --roughtime-key"),
        "{e}"
    );
    let e = resolve_with("[ntp]\nipv4-threads = 0\nipv6-threads = 0\n", &[]).unwrap_err();
    assert!(e.to_string().contains("no NTP threads"), "{e}");
    let s = resolve_with(
        "[xdp]\ninterface = \"eth0\"\nmode = \"zero-copy\"\n",
        &["--xdp-threads", "4"],
    );
    let s = s.unwrap();
    assert_eq!(
        (s.xdp.threads.0, s.xdp.mode),
        (4, values::XdpMode::ZeroCopy)
    );
}

#[test]
fn every_value_is_checked_while_its_service_is_off() {
    for (file, key) in [
        ("roughtime.recv-buffer = 100\n", "roughtime.recv-buffer"),
        ("roughtime.batch-size = 300\n", "roughtime.batch-size"),
        ("roughtime.gather = 1.0\n", "roughtime.gather"),
        ("roughtime.grease = 1.5\n", "roughtime.grease"),
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
        ("roughtime.tcp.lifetime = -1.0\n", "roughtime.tcp.lifetime"),
        ("[overload]\nshed-target = 2.0\n", "overload.shed-target"),
        (
            "[overload]\nshed-interval = 11.0\n",
            "overload.shed-interval",
        ),
        ("[ntp]\nrecv-buffer = 2147483648\n", "ntp.recv-buffer"),
        ("[xdp]\ninterface = \"eth0/1\"\n", "xdp.interface"),
        ("[nts]\nntp-server = \"host:0\"\n", "nts.ntp-server"),
    ] {
        let e = resolve_with(file, &[]).unwrap_err().to_string();
        assert!(e.contains("chimed.toml") && e.contains(key), "{file}: {e}");
    }
    let file = "[roughtime]\nbatch-size = 64\nipv4-threads = 0\nipv6-threads = 0\n";
    assert!(resolve_with(file, &[]).unwrap().roughtime_key().is_none());
}

#[test]
fn the_ntp_server_nts_ke_names_may_carry_a_port() {
    let ok = |v: &str| v.parse::<values::NtpServer>().unwrap().parts();
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
        let e = bad.parse::<values::NtpServer>().unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
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
    let file = "[ntp]\nipv4-threads = 2\n[access]\ndeny = [\"192.0.2.0/24\"]\n";
    std::fs::write(&path, file).unwrap();
    let args = Args::parse_from(["chimed", "-c", path.to_str().unwrap(), "-6", "3"]).unwrap();
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
    let no_file = Args::parse_from(["chimed"]).unwrap();
    assert!(reload(&no_file, &current).unwrap().is_none());
}

/// What --check-config prints is a config file that gives the same settings.
#[test]
fn the_shown_settings_read_back_as_the_same() {
    let s = resolve_with(
        "[ratelimit]\nenabled = true\nkod = 2\n",
        &["-4", "3", "--allow", "all"],
    );
    let s = s.unwrap();
    let again = resolve_with(&s.show(), &[]).unwrap();
    assert_eq!(again.config, s.config);
    assert_ne!(again.config, Config::default());
}

/// What each checked type says it accepts (the reference prints it) is what its check accepts:
/// both ends of each range are taken, and a value past either end refused.
#[test]
fn each_range_said_is_the_range_checked() {
    use values::Accepts;
    let mut wrong = Vec::new();
    for (name, accepts, parses) in values::checked_types() {
        let (inside, outside): (Vec<String>, Vec<String>) = match accepts {
            Accepts::Whole { min, max } => {
                let mut inside = vec![min.to_string()];
                let mut outside = vec![(min - 1).to_string()];
                match max {
                    Some(max) => {
                        inside.push(max.to_string());
                        outside.push((max + 1).to_string());
                    }
                    None => inside.push((min + 1_000_000).to_string()),
                }
                (inside, outside)
            }
            Accepts::Seconds { above_zero, max } => {
                let (least, below) = match above_zero {
                    true => (max / 1e6, 0.0),
                    false => (0.0, -max / 1e6),
                };
                let past = max * (1.0 + 1e-6);
                let inside = vec![least.to_string(), max.to_string()];
                (inside, vec![below.to_string(), past.to_string()])
            }
            Accepts::Share => (
                vec!["0".into(), "1".into()],
                vec!["-0.01".into(), "1.01".into()],
            ),
            Accepts::Switch | Accepts::Text(_) | Accepts::AnyText => continue,
        };
        wrong.extend(
            inside
                .iter()
                .filter(|v| !parses(v))
                .map(|v| format!("{name}: {v} refused")),
        );
        wrong.extend(
            outside
                .iter()
                .filter(|v| parses(v))
                .map(|v| format!("{name}: {v} taken")),
        );
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

#[test]
fn answering_in_the_driver_goes_with_every_other_setting() {
    let on = ["--xdp", "eth0", "--xdp-in-driver"];
    assert!(resolve_with("", &on).unwrap().xdp.in_driver);
    assert!(!resolve_with("", &["--xdp", "eth0"]).unwrap().xdp.in_driver);
    let e = resolve_with("", &["--xdp-in-driver"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--xdp-in-driver: only takes effect with --xdp"),
        "{e}"
    );
    // Allow and deny are applied in the driver too.
    let rules = [&on[..], &["--allow", "192.0.2.0/24", "--deny", "192.0.2.1"]].concat();
    assert!(resolve_with("", &rules).unwrap().xdp.in_driver);
    // Around a smeared leap the program hands every request to the workers.
    let file = "[xdp]\ninterface = \"eth0\"\nin-driver = true\n[ntp]\nleap-smear = true\n";
    let smeared = resolve_with(file, &[]).unwrap();
    assert!(smeared.xdp.in_driver && smeared.ntp.leap_smear);
    // The zone's shift is applied in the driver too.
    let zoned = resolve_with(
        "",
        &[&on[..], &["--tz-offset", "--timezone", "UTC"]].concat(),
    );
    assert!(zoned.unwrap().xdp.in_driver);
    // NTPv5 and the requests to upgrade to it are the workers'; plain v4 is answered alike.
    let v5 = resolve_with("", &[&on[..], &["--ntpv5"]].concat()).unwrap();
    assert!(v5.xdp.in_driver && v5.ntp.v5);
    // The program rate-limits as the workers do.
    let limited = resolve_with("", &[&on[..], &["--ratelimit"]].concat()).unwrap();
    assert!(limited.xdp.in_driver && limited.ratelimit.enabled);
}
