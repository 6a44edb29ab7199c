//! chimed against real processes: a real chronyd to mirror, chronyd and `chime ntp` as clients.

mod common;

use std::time::{Duration, Instant};

use common::{
    Chimed, Chronyd, assert_offset_near, chime_ntp, chronyd_client_offset, count_in, exchange,
};

/// chimed on 127.0.0.1 port 0 mirroring `chronyd`, with 2 IPv4 threads unless `extra` says.
fn chimed_v4(chronyd: &Chronyd, extra: &[&str]) -> Chimed {
    let mut args = extra.to_vec();
    if !extra.contains(&"-4") {
        args.extend_from_slice(&["-4", "2"]);
    }
    let mut chimed = Chimed::mirroring(&chronyd.addr().to_string(), &args);
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    chimed
}

#[test]
fn clients_accept_mirrored_replies() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed_v4(&chronyd, &[]);
    // The default receive buffer, 4 MiB, which the kernel counts twice (as root, whatever
    // net.core.rmem_max says).
    let listening = chimed.wait_for("ntp listening on", Duration::from_secs(1));
    assert!(
        listening.contains(&format!("receive buffer {} bytes", 8 << 20)),
        "{listening}"
    );

    let r = chime_ntp(chimed.addr).unwrap();
    assert_eq!(r["synchronised"], true, "{r}");
    assert_eq!(r["leap"], 0);
    // Mirrored as chronyd states it: a local stratum 3 reference ("LOCL"), not incremented.
    assert_eq!(r["stratum"], 3);
    assert_eq!(r["reference_id_hex"], "7F7F0101", "{r}");
    assert_eq!(r["version"], 4);
    assert_offset_near(&r, 0.0);

    let offset = chronyd_client_offset(chimed.addr).unwrap();
    assert!(offset.abs() < 1e-3, "chronyd -Q offset {offset}");
}

#[test]
fn ipv6_loopback() {
    let chronyd = Chronyd::start();
    let upstream = chronyd.addr().to_string();
    let mut chimed = Chimed::mirroring(&upstream, &["-4", "0", "-6", "2", "-b", "[::1]:0"]);
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    assert!(chimed.addr.is_ipv6());

    let r = chime_ntp(chimed.addr).unwrap();
    assert_eq!(
        (r["stratum"].as_u64(), r["leap"].as_u64()),
        (Some(3), Some(0)),
        "{r}"
    );
    assert_offset_near(&r, 0.0);
    let offset = chronyd_client_offset(chimed.addr).unwrap();
    assert!(offset.abs() < 1e-3, "chronyd -Q offset {offset}");
    // Interleaved mode over IPv6: the looped reply comes back behind an IPv6 header.
    let r = chime_ntp_interleaved(chimed.addr);
    assert_eq!(interleaved_flags(&r), [false, false, true, true], "{r}");
}

#[test]
fn unsynchronised_within_stale_time_after_chronyd_stops() {
    let mut chronyd = Chronyd::start();
    let mut chimed = chimed_v4(&chronyd, &["--stale-after", "2", "--poll-interval", "0.5"]);
    assert_eq!(chime_ntp(chimed.addr).unwrap()["synchronised"], true);
    let check = common::run(
        std::process::Command::new(common::workspace_bin("chime"))
            .args(["ntp", "--require-synchronised", "--timeout", "1"])
            .arg(chimed.addr.to_string()),
    );
    assert!(check.status.success(), "{check:?}");

    chronyd.stop();
    let stopped = Instant::now();
    chimed.wait_for("not answering", Duration::from_secs(5));
    let mut seen_synchronised_late = false;
    let turned = loop {
        let r = chime_ntp(chimed.addr).unwrap();
        if r["leap"] == 3 && r["stratum"] == 0 {
            assert_eq!(r["synchronised"], false);
            break stopped.elapsed();
        }
        // Until the stale time runs out the last state is served, with growing dispersion.
        seen_synchronised_late |= stopped.elapsed() > Duration::from_millis(2600);
        assert!(
            stopped.elapsed() < Duration::from_secs(6),
            "still synchronised: {r}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!seen_synchronised_late, "synchronised past the stale time");
    // The stale time (2 s) is counted from the last good poll, at most one interval (0.5 s)
    // before the stop.
    assert!(
        turned >= Duration::from_millis(1400),
        "unsynchronised too soon: {turned:?}"
    );
    // The health check a fleet member runs before it announces its address fails now.
    let check = common::run(
        std::process::Command::new(common::workspace_bin("chime"))
            .args(["ntp", "--require-synchronised", "--timeout", "1"])
            .arg(chimed.addr.to_string()),
    );
    let said = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "{said}");
    assert!(said.contains("says it is unsynchronised"), "{said}");
}

#[test]
fn bad_packets_get_no_reply_and_are_counted_and_sigterm_exits_0() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed_v4(&chronyd, &[]);
    let wait = Duration::from_millis(300);

    let mut control = [0u8; 48];
    control[0] = 0x26; // v4 mode 6 (control)
    let mut private = [0u8; 48];
    private[0] = 0x27; // v4 mode 7 (private)
    let short = [0x23u8; 20]; // v4 client, but 20 bytes
    let mut version0 = [0u8; 48];
    version0[0] = 0x03; // v0 client
    for bad in [&control[..], &private[..], &short[..], &version0[..]] {
        assert_eq!(
            exchange(chimed.addr, bad, wait),
            None,
            "answered {:02x?}",
            &bad[..4]
        );
    }

    let mut good = [0u8; 48];
    good[0] = 0x23;
    good[40..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let reply = exchange(chimed.addr, &good, Duration::from_secs(2)).expect("no reply");
    assert_eq!(reply.len(), 48);
    assert_eq!(reply[0] & 0x07, 4, "mode 4");
    assert_eq!(&reply[24..32], &good[40..48], "origin = request's transmit");

    let status = chimed.terminate();
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        chimed.log()
    );
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    // One at a time, each waited for: five batches of one.
    for field in ["received=5", "batches=5", "answered=1", "dropped=4"] {
        assert!(totals.contains(field), "{field} missing: {totals}");
    }
}

#[test]
fn symmetric_active_gets_passive_and_stats_are_logged_at_the_interval() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed_v4(&chronyd, &["-4", "1", "--stats-interval", "1"]);
    let mut req = [0u8; 48];
    req[0] = 0x19; // v3, mode 1
    req[40..].copy_from_slice(&[9; 8]);
    let reply = exchange(chimed.addr, &req, Duration::from_secs(2)).expect("no reply");
    assert_eq!(reply[0] & 0x3f, 0x1a, "v3 mode 2");
    assert_eq!(reply[1], 3, "stratum");
    // Periodic per-thread lines, not one per packet: a worker checks the interval when it has a
    // batch in hand (an idle worker sleeps in the kernel and has nothing new to say).
    std::thread::sleep(Duration::from_millis(1100));
    exchange(chimed.addr, &req, Duration::from_secs(2)).expect("no reply");
    let line = chimed.wait_for("ntp stats: received=2", Duration::from_secs(5));
    assert!(line.contains("ntp-ipv4-0"), "{line}");
}

#[test]
fn drops_privileges_after_binding_and_still_serves() {
    let chronyd = Chronyd::start();
    let root = tempfile::tempdir().unwrap();
    let upstream = chronyd.addr().to_string();
    let root_dir = root.path().to_str().unwrap();
    let mut chimed = Chimed::mirroring(&upstream, &["-u", "nobody", "-r", root_dir]);
    chimed.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let status = std::fs::read_to_string(format!("/proc/{}/status", chimed.pid())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|id| id == "65534"),
        "{uid}"
    );
    let chrooted = std::fs::read_link(format!("/proc/{}/root", chimed.pid())).unwrap();
    assert_eq!(chrooted, root.path());
    assert_eq!(chime_ntp(chimed.addr).unwrap()["stratum"], 3);
}

/// `--allow` and `--deny`: the most specific subnet decides, and a refused client gets nothing
/// and is counted. 127.0.0.2 is another loopback address a client can send from.
#[test]
fn allow_and_deny_decide_who_is_served() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed_v4(
        &chronyd,
        &["-4", "1", "--allow", "127.0.0.0/8", "--deny", "127.0.0.1"],
    );
    let request = {
        let mut p = [0u8; 48];
        p[0] = 0x23; // NTPv4, client
        p
    };
    let ask_from = |source: &str| {
        let sock = std::net::UdpSocket::bind((source, 0)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        sock.send_to(&request, chimed.addr).unwrap();
        let mut buf = [0u8; 64];
        sock.recv(&mut buf).ok()
    };
    assert_eq!(ask_from("127.0.0.1"), None, "a denied client was answered");
    assert_eq!(
        ask_from("127.0.0.2"),
        Some(48),
        "an allowed client was not answered"
    );
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    for field in ["received=2", "answered=1", "dropped.denied=1"] {
        assert!(totals.contains(field), "{field}: {totals}");
    }
}

/// SIGHUP re-reads `allow` and `deny` from the config file: a client denied at start is served
/// after the rule is removed, without a restart; the log level changes too; another key changed
/// is named as needing a restart; a file that no longer parses keeps the rules in force.
#[test]
fn sighup_reloads_allow_and_deny_from_the_config_file() {
    use nix::sys::signal::{Signal, kill};
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("chimed.toml");
    std::fs::write(&conf, "[access]\ndeny = [\"127.0.0.1\"]\n").unwrap();
    let mut chimed = chimed_v4(&chronyd, &["-4", "1", "--config", conf.to_str().unwrap()]);
    chimed.wait_for("SIGHUP reloads", Duration::from_secs(5));
    let request = {
        let mut p = [0u8; 48];
        p[0] = 0x23;
        p
    };
    let wait = Duration::from_millis(300);
    assert_eq!(
        exchange(chimed.addr, &request, wait),
        None,
        "denied at start"
    );

    // A key that needs a restart is named, and the access rules are taken all the same, as is
    // the log level.
    std::fs::write(
        &conf,
        "[access]\ndeny = [\"192.0.2.0/24\"]\n[upstream]\nstale-after = 9\n\
         [observe]\nlog-level = \"debug\"\n",
    )
    .unwrap();
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    chimed.wait_for(
        "SIGHUP: upstream.stale-after changed in the config file; it takes effect at a restart",
        Duration::from_secs(5),
    );
    chimed.wait_for("SIGHUP: log level now debug", Duration::from_secs(5));
    assert!(
        !chimed.log().contains("observe.log-level changed"),
        "{}",
        chimed.log()
    );
    chimed.wait_for(
        "access rules reloaded: [deny 192.0.2.0/24",
        Duration::from_secs(5),
    );
    assert!(exchange(chimed.addr, &request, Duration::from_secs(2)).is_some());

    std::fs::write(&conf, "[access]\ndeny = [\"127.0.0.1/40\"]\n").unwrap();
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    let warned = chimed.wait_for("keeping the access rules in force", Duration::from_secs(5));
    assert!(warned.contains("deny: '127.0.0.1/40'"), "{warned}");
    assert!(exchange(chimed.addr, &request, Duration::from_secs(2)).is_some());
}

/// SIGHUP puts new rate limits in force at once, for every client the table tracks: a client
/// that had spent its burst of 4 is answered in full once the burst is 255, keeping what it had
/// saved; shedding's target changes with it (as `chime status` reads it from what the workers
/// read); the limiter or shedding turned off waits for a restart, and says so.
#[test]
fn sighup_puts_new_rate_limits_and_shedding_in_force() {
    use std::os::unix::fs::PermissionsExt as _;

    use nix::sys::signal::{Signal, kill};
    let chronyd = Chronyd::start();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("chimed.toml");
    let limits = |burst: u32, target: &str| {
        format!(
            "[ratelimit]\nenabled = true\ninterval = 12\nburst = {burst}\nleak = 4\n\
             [overload]\nshed-target = {target}\n"
        )
    };
    std::fs::write(&conf, limits(4, "0.005")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("chimed.sock");
    let socket_flag = socket.to_str().unwrap();
    let mut chimed = chimed_v4(
        &chronyd,
        &[
            "-4",
            "1",
            "--recv-buffer",
            "4194304",
            "--config",
            conf.to_str().unwrap(),
            "--control-socket",
            socket_flag,
        ],
    );
    let shed_target = || {
        let out = common::run(
            std::process::Command::new(common::workspace_bin("chime")).args([
                "status",
                "--json",
                "--socket",
                socket_flag,
            ]),
        );
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s["overload"]["shed_target_seconds"]
            .as_f64()
            .expect("no overload.shed_target_seconds")
    };
    chimed.wait_for("SIGHUP reloads", Duration::from_secs(5));
    assert_eq!(shed_target(), 0.005);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // 4 + 96 / 16 = 10 expected.
    let before = flood(&sock, chimed.addr, 100).len();
    assert!(
        (4..=30).contains(&before),
        "{before} of 100 answered at burst 4"
    );

    std::fs::write(&conf, limits(255, "0.01")).unwrap();
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    chimed.wait_for(
        "SIGHUP: ratelimit interval 12 burst 255 leak 4 kod 0 in force",
        Duration::from_secs(5),
    );
    chimed.wait_for(
        "SIGHUP: shedding past 10 ms of queueing for 100 ms in force",
        Duration::from_secs(5),
    );
    assert_eq!(shed_target(), 0.01);
    let after = flood(&sock, chimed.addr, 100).len();
    assert_eq!(after, 100, "the new burst is not in force");

    std::fs::write(
        &conf,
        "[ratelimit]\nenabled = false\n[overload]\nshed-target = 0\n",
    )
    .unwrap();
    kill(chimed.pid(), Signal::SIGHUP).unwrap();
    for key in ["ratelimit.enabled", "overload.shed-target"] {
        chimed.wait_for(
            &format!("SIGHUP: {key} changed in the config file; it takes effect at a restart"),
            Duration::from_secs(5),
        );
    }
    assert_eq!(shed_target(), 0.01, "shedding turned off without a restart");
}

/// Sends `n` client requests from `sock`, each with its index as transmit timestamp, and returns
/// the replies that come back (by index) before replies stop for a short while.
fn flood(sock: &std::net::UdpSocket, to: std::net::SocketAddr, n: u64) -> Vec<(u64, [u8; 48])> {
    for i in 0..n {
        let mut p = [0u8; 48];
        p[0] = 0x23; // NTPv4, client
        p[2] = 6; // poll 2^6 s
        p[40..48].copy_from_slice(&(i + 1).to_be_bytes());
        sock.send_to(&p, to).unwrap();
    }
    collect_replies(&[sock], Duration::from_millis(300))
}

/// Replies on any of `socks` until none has come for `quiet`, as (transmit index, reply).
fn collect_replies(socks: &[&std::net::UdpSocket], quiet: Duration) -> Vec<(u64, [u8; 48])> {
    for s in socks {
        s.set_nonblocking(true).unwrap();
    }
    let mut got = Vec::new();
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        let mut any = false;
        for s in socks {
            let mut buf = [0u8; 48];
            while let Ok(48) = s.recv(&mut buf) {
                got.push((u64::from_be_bytes(buf[24..32].try_into().unwrap()) - 1, buf));
                any = true;
            }
        }
        if any {
            last = Instant::now();
        } else {
            std::thread::yield_now();
        }
    }
    got
}

/// chimed with `threads` IPv4 threads and `--ratelimit`, each `(option, value)` as
/// `--ratelimit-<option> <value>`, and a 4 MiB receive buffer: the tests' floods arrive at once,
/// and need room however busy the machine.
fn ratelimited(chronyd: &Chronyd, threads: &str, options: &[(&str, &str)]) -> Chimed {
    let flags: Vec<String> = options
        .iter()
        .flat_map(|(o, v)| [format!("--ratelimit-{o}"), (*v).to_owned()])
        .collect();
    let mut args = vec!["-4", threads, "--ratelimit", "--recv-buffer", "4194304"];
    args.extend(flags.iter().map(String::as_str));
    chimed_v4(chronyd, &args)
}

/// A client at `from` that, for `run`, sends a request, waits up to `wait` for its reply, and then
/// pauses `after_answer` if it came, or goes again at once if not. Returns (answered, sent), where
/// answered counts every request the server replied to, a reply that came after the client gave
/// up on it included: on a slow machine a reply can take longer than `wait`, and it is the
/// server's answering that is measured, not the client's patience.
fn pacing_client(
    from: &str,
    to: std::net::SocketAddr,
    wait: Duration,
    after_answer: Duration,
    run: Duration,
) -> (u64, u64) {
    let sock = std::net::UdpSocket::bind(from).unwrap();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut replied = std::collections::HashSet::new();
    let mut take = |buf: &[u8; 48], sent: u64| {
        let id = u64::from_be_bytes(buf[24..32].try_into().unwrap());
        (1..=sent).contains(&id) && replied.insert(id)
    };
    while start.elapsed() < run {
        sent += 1;
        let mut p = [0u8; 48];
        p[0] = 0x23; // NTPv4, client
        p[40..48].copy_from_slice(&sent.to_be_bytes());
        sock.send_to(&p, to).unwrap();
        let deadline = Instant::now() + wait;
        let mut got = false;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            sock.set_read_timeout(Some(left.max(Duration::from_micros(100))))
                .unwrap();
            let mut buf = [0u8; 48];
            match sock.recv(&mut buf) {
                // The client goes on when the reply to this request comes; a late reply to an
                // earlier one is counted and does not.
                Ok(48) => {
                    take(&buf, sent);
                    if buf[24..32] == sent.to_be_bytes() {
                        got = true;
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if got {
            std::thread::sleep(after_answer);
        }
    }
    // Replies still on their way.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 48];
    while let Ok(48) = sock.recv(&mut buf) {
        take(&buf, sent);
    }
    (replied.len() as u64, sent)
}

/// chronyd's defence against clients that poll faster when they are not answered: one that
/// waits 30 ms after an answer but retries after 8 ms when dropped (a limit of one reply per
/// 62.5 ms, burst 1, leak 2) has most of its requests answered, while one that keeps an 8 ms pace
/// whatever happens is held to the limit. The two run at once from different addresses.
#[test]
fn a_client_retrying_faster_when_dropped_is_relented_to() {
    let chronyd = Chronyd::start();
    let chimed = ratelimited(&chronyd, "1", &[("interval", "-4"), ("burst", "1")]);
    let to = chimed.addr;
    // Long enough that the shares are measured over some 150 requests each.
    let run = Duration::from_millis(4000);
    let ms = Duration::from_millis;
    let retrier = std::thread::spawn(move || pacing_client("127.0.0.1:0", to, ms(8), ms(30), run));
    let steady = std::thread::spawn(move || pacing_client("127.0.0.2:0", to, ms(8), ms(8), run));
    let (r_answered, r_sent) = retrier.join().unwrap();
    let (s_answered, s_sent) = steady.join().unwrap();
    let share = |a: u64, n: u64| a as f64 / n as f64;
    eprintln!("retrier: {r_answered} of {r_sent}; steady: {s_answered} of {s_sent}");
    // Limited as usual, a client over the limit gets a quarter leaked plus what it earns (the
    // steady one: 0.34-0.38 here); the retrier, once its two rates are measured, gets three
    // quarters of the rest: 0.73-0.78 alone, 0.59-0.66 with the other tests running beside it on
    // two cores, whose delays stretch its 8 ms retries. So: well over half, and well over the
    // steady client's share.
    let (retrier, steady) = (share(r_answered, r_sent), share(s_answered, s_sent));
    assert!(
        retrier > 0.5 && retrier > steady + 0.15,
        "retrier: {r_answered} of {r_sent}; steady: {s_answered} of {s_sent}"
    );
    assert!(
        share(s_answered, s_sent) < 0.5,
        "steady: {s_answered} of {s_sent}; retrier: {r_answered} of {r_sent}"
    );
}

/// `--ratelimit`: a client gets its burst, then only the leaked share (one in four by default);
/// the rest are dropped and counted, every reply suggests the limit's interval as poll, and
/// another address is not held back by the first one's flood.
#[test]
fn rate_limiting_answers_the_burst_then_the_leak_and_counts_the_rest() {
    let chronyd = Chronyd::start();
    let mut chimed = ratelimited(&chronyd, "1", &[("interval", "12"), ("burst", "4")]);
    chimed.wait_for(
        "rate limiting on: ratelimit interval 12 burst 4 leak 2 kod 0",
        Duration::from_secs(1),
    );
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let n = 400;
    let replies = flood(&sock, chimed.addr, n);
    let answered = replies.len() as u64;
    for first in 0..4 {
        assert!(
            replies.iter().any(|(i, _)| *i == first),
            "request {first} is within the burst but was not answered"
        );
    }
    for (i, r) in &replies {
        assert_eq!(
            r[2], 12,
            "request {i}: poll not raised to the limit's interval"
        );
        assert_eq!(
            r[1], 3,
            "request {i}: a normal reply, not a kiss (kod is off)"
        );
    }
    // 4 + (400 − 4) / 4 = 103 expected; the binomial spread is about 9.
    assert!(
        (58..=148).contains(&answered),
        "{answered} of {n} answered, expected about 103"
    );

    // Another client starts with its own full burst.
    let other = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    assert_eq!(
        flood(&other, chimed.addr, 4).len(),
        4,
        "127.0.0.2 was limited"
    );

    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    for field in [
        format!("received={}", n + 4),
        format!("answered={}", answered + 4),
        format!("dropped.rate_limited={}", n - answered),
    ] {
        assert!(totals.contains(&field), "{field}: {totals}");
    }
}

/// The limit is per address across threads: requests from many ports spread over two workers
/// still share one burst. Two private tables would answer about 106 of these 200; one shared
/// table about 59.
#[test]
fn rate_limit_is_shared_by_every_thread() {
    let chronyd = Chronyd::start();
    let mut chimed = ratelimited(
        &chronyd,
        "2",
        &[("interval", "12"), ("burst", "50"), ("leak", "4")],
    );
    let socks: Vec<_> = (0..200)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    for (i, s) in socks.iter().enumerate() {
        let mut p = [0u8; 48];
        p[0] = 0x23;
        p[40..48].copy_from_slice(&(i as u64 + 1).to_be_bytes());
        s.send_to(&p, chimed.addr).unwrap();
    }
    let refs: Vec<_> = socks.iter().collect();
    let answered = collect_replies(&refs, Duration::from_millis(300)).len();
    assert!(
        (50..80).contains(&answered),
        "{answered} of 200 answered, expected about 59"
    );
    assert!(chimed.terminate().success());
    chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    let log = chimed.log();
    for thread in ["ntp-ipv4-0", "ntp-ipv4-1"] {
        let line = log
            .lines()
            .find(|l| l.contains(thread) && l.contains("stats at exit"))
            .unwrap_or_else(|| panic!("no exit stats for {thread}: {log}"));
        let received: u64 = line
            .split("received=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|r| r.parse().ok())
            .unwrap();
        assert!(
            received >= 20,
            "{thread} got only {received}: the test did not spread the load"
        );
    }
}

/// chronyd as a client sees chimed's Kiss-o'-Death RATE for what it is: it logs it and backs off.
/// The kiss must match its request (origin timestamp) for chronyd to believe it.
#[test]
fn chronyd_client_accepts_kod_rate() {
    use std::io::{BufRead, BufReader};
    let chronyd = Chronyd::start();
    let mut chimed = ratelimited(
        &chronyd,
        "1",
        &[
            ("interval", "12"),
            ("burst", "1"),
            ("leak", "1"),
            ("kod", "1"),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let mut client = std::process::Command::new(common::CHRONYD)
        .args(["-x", "-d", "-u", "root"])
        .arg(format!(
            "server 127.0.0.1 port {} minpoll -4 maxpoll -4",
            chimed.addr.port()
        ))
        .arg(format!("pidfile {}/pid", dir.path().display()))
        .arg(format!("driftfile {}/drift", dir.path().display()))
        .arg("cmdport 0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Over the limit from its second request on, a quarter of its requests are kissed: at 16
    // polls a second the first kiss comes within a second or so. Bounded by the client's own
    // lines: it is killed after 20 s whatever happens.
    let stderr = client.stderr.take().unwrap();
    let pid = client.id();
    let guard = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(20));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
    let seen = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("Received KoD RATE from 127.0.0.1"));
    let _ = client.kill();
    let _ = client.wait();
    drop(guard);
    assert!(seen.is_some(), "chronyd never reported a KoD RATE");
    // chime ntp names the kiss; a quarter of its requests get one now (a quarter are dropped).
    let kissed = (0..40).find_map(|_| {
        let out = common::run(
            std::process::Command::new(common::workspace_bin("chime"))
                .args(["ntp", "--timeout", "0.2"])
                .arg(chimed.addr.to_string()),
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        err.contains("Kiss-o'-Death RATE")
            .then_some((out.status.code(), err))
    });
    let (code, err) = kissed.expect("chime ntp never reported the kiss in 40 tries");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("suggested poll interval 2^12 s"), "{err}");
    assert!(chimed.terminate().success());
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert!(count_in(&totals, "kod") > 0, "{totals}");
}

/// chronyd as a client in interleaved mode (`xleave`, RFC 9769) against chimed with two threads:
/// from its third exchange on, chimed's replies carry the kernel's transmit time of the previous
/// reply, and chronyd's measurements log says so ("4I K K": interleaved, kernel transmit and
/// receive timestamps). The client's requests come from a new port each, so they reach both
/// threads and the saved times must be shared. Returns the log's measurement lines.
fn xleave_measurements(extra: &[&str], want_interleaved: usize) -> (Vec<Vec<String>>, String) {
    let chronyd = Chronyd::start();
    let mut args = vec!["-4", "2"];
    args.extend_from_slice(extra);
    let mut chimed = chimed_v4(&chronyd, &args);
    let client = common::ChronydClient::start(&[format!(
        "server 127.0.0.1 port {} minpoll -4 maxpoll -4 xleave",
        chimed.addr.port()
    )]);
    let read = || client.measurements();
    // 16 polls a second: 20 measurements take about 1.3 s. Bounded at 15 s.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut rows = read();
    while rows.len() < want_interleaved + 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        rows = read();
    }
    drop(client);
    assert!(chimed.terminate().success());
    chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    (rows, chimed.log())
}

#[test]
fn chronyd_xleave_client_gets_interleaved_replies_across_threads() {
    let (rows, log) = xleave_measurements(&[], 16);
    // Columns: ... offset (11), peer delay (12), ..., mode (17), TX source (18), RX source (19).
    let interleaved: Vec<_> = rows.iter().filter(|r| r[17] == "4I").collect();
    assert!(
        interleaved.len() >= 16,
        "{} of {} measurements interleaved: {rows:?}",
        interleaved.len(),
        rows.len()
    );
    assert!(
        rows.iter().take(2).all(|r| r[17] == "4B"),
        "the first two exchanges are basic: {rows:?}"
    );
    for r in &interleaved {
        assert_eq!(
            r[18], "K",
            "the server's transmit time is the kernel's: {r:?}"
        );
        // Kernel times at both ends: within 100 µs, plus half the round trip, which bounds any
        // exchange's error and which a loaded machine stretches to a millisecond now and then.
        let (offset, delay): (f64, f64) = (r[11].parse().unwrap(), r[12].parse().unwrap());
        assert!(
            offset.abs() < 100e-6 + delay / 2.0,
            "offset {offset}, delay {delay}: {r:?}"
        );
    }
    let totals = log
        .lines()
        .find(|l| l.contains("ntp totals at exit"))
        .unwrap();
    assert!(
        count_in(totals, "interleaved") > 0 && count_in(totals, "kernel_tx_timestamps") > 0,
        "{totals}"
    );
    for thread in ["ntp-ipv4-0", "ntp-ipv4-1"] {
        let line = log
            .lines()
            .find(|l| l.contains(thread) && l.contains("stats at exit"))
            .unwrap();
        assert!(
            !line.contains("received=0 "),
            "{thread} got nothing: {line}"
        );
    }
}

#[test]
fn interleaved_mode_off_answers_xleave_clients_in_basic_mode() {
    let (rows, log) = xleave_measurements(&["--interleaved-log", "0"], 8);
    assert!(rows.len() >= 8, "{rows:?}");
    assert!(rows.iter().all(|r| r[17] == "4B"), "{rows:?}");
    assert!(!log.contains("interleaved mode on"), "{log}");
}

/// `chime ntp --interleaved --json` against a server, parsed.
fn chime_ntp_interleaved(addr: std::net::SocketAddr) -> serde_json::Value {
    let out = common::run(
        std::process::Command::new(common::workspace_bin("chime"))
            .args([
                "ntp",
                "--interleaved",
                "--count",
                "4",
                "--interval",
                "0.05",
                "--json",
            ])
            .arg(addr.to_string()),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn interleaved_flags(r: &serde_json::Value) -> Vec<bool> {
    r["exchanges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["interleaved"].as_bool().unwrap())
        .collect()
}

/// `chime ntp --interleaved` as a client: chimed and chronyd itself both answer it in interleaved
/// mode from the third exchange on (chronyd is the reference for the client side), and chimed with
/// interleaved mode off answers it in basic mode.
#[test]
fn chime_ntp_interleaved_against_chimed_and_chronyd() {
    let chronyd = Chronyd::start();
    let chimed = chimed_v4(&chronyd, &[]);
    for (who, addr) in [("chimed", chimed.addr), ("chronyd", chronyd.addr())] {
        let r = chime_ntp_interleaved(addr);
        assert_eq!(
            interleaved_flags(&r),
            [false, false, true, true],
            "{who}: {r}"
        );
        assert_offset_near(&r, 0.0);
    }
    let basic_only = chimed_v4(&chronyd, &["--interleaved-log", "0"]);
    let r = chime_ntp_interleaved(basic_only.addr);
    assert_eq!(interleaved_flags(&r), [false; 4], "{r}");

    let out = common::run(
        std::process::Command::new(common::workspace_bin("chime"))
            .args(["ntp", "--interleaved", "--ntp-version", "3"])
            .arg(chimed.addr.to_string()),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NTPv4 only"));
}

/// Requests the kernel drops at chimed's socket because its receive buffer is full are counted,
/// not lost from view: chimed stopped (SIGSTOP) behind a small buffer, a burst of 300 requests
/// overflows it, and every request is either answered once chimed runs again or counted in
/// `kernel_drops` (also `chimed_kernel_receive_drops_total` in the metrics).
#[test]
fn requests_the_kernel_dropped_are_counted() {
    let chronyd = Chronyd::start();
    let mut chimed = chimed_v4(&chronyd, &["-4", "1", "--recv-buffer", "8192"]);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut request = [0u8; 48];
    request[0] = 0x23;
    const SENT: u64 = 300;
    chimed.pause();
    for i in 0..SENT {
        request[40..48].copy_from_slice(&(i + 1).to_be_bytes());
        sock.send_to(&request, chimed.addr).unwrap();
    }
    chimed.resume();
    let mut answered = 0;
    let mut buf = [0u8; 128];
    while sock.recv_from(&mut buf).is_ok() {
        answered += 1;
    }
    assert!(chimed.terminate().success());
    // Whatever a stalled machine delayed past that silence is in our socket by now.
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    while sock.recv_from(&mut buf).is_ok() {
        answered += 1;
    }
    let totals = chimed.wait_for("ntp totals at exit", Duration::from_secs(1));
    let dropped = count_in(&totals, "kernel_drops");
    assert!(
        dropped > 0,
        "an 8 KiB buffer held {SENT} requests: {totals}"
    );
    assert_eq!(count_in(&totals, "received"), answered, "{totals}");
    assert_eq!(answered + dropped, SENT, "{totals}");
}

/// Stops chimed (SIGSTOP) while `queued` requests (origin timestamps 1..=queued) wait in its
/// socket for `aged`, resumes it, sends one more request (origin 1000), and returns the origin
/// timestamps of the replies that came back.
fn stall_then_resume(chimed: &Chimed, queued: u64, aged: Duration) -> Vec<u64> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut request = [0u8; 48];
    request[0] = 0x23;
    chimed.pause();
    for i in 1..=queued {
        request[40..48].copy_from_slice(&i.to_be_bytes());
        sock.send_to(&request, chimed.addr).unwrap();
    }
    // Not a wait for readiness: this is the stall under test, the time the requests queue.
    std::thread::sleep(aged);
    chimed.resume();
    request[40..48].copy_from_slice(&1000u64.to_be_bytes());
    sock.send_to(&request, chimed.addr).unwrap();
    let mut origins = Vec::new();
    let mut buf = [0u8; 128];
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        assert_eq!(n, 48);
        origins.push(u64::from_be_bytes(buf[24..32].try_into().unwrap()));
    }
    origins.sort_unstable();
    origins
}

/// Overload without a standing queue (`--shed-target`): a stall shorter than the interval is a
/// burst, and every request queued through it is answered; a queue that has stood longer than
/// the interval (here an interval of 0, so at once) is shed, oldest first: requests that waited
/// longer than the target get no reply and are counted as `shed`, while the request sent after
/// them is answered. (metrics.rs checks chimed_requests_shed_total, for Roughtime too.)
#[test]
fn a_stall_is_absorbed_and_a_standing_queue_is_shed() {
    let chronyd = Chronyd::start();
    // 40 requests in batches of 4: ten full receives, so the queue looks standing to a zero
    // interval. With a 500 ms one the 100 ms stall is a burst, drained well within it even by a
    // debug build on a machine busy with the other tests.
    let mut absorbing = chimed_v4(
        &chronyd,
        &[
            "-4",
            "1",
            "--batch-size",
            "4",
            "--shed-target",
            "0.02",
            "--shed-interval",
            "0.5",
        ],
    );
    let answered = stall_then_resume(&absorbing, 40, Duration::from_millis(100));
    let all: Vec<u64> = (1..=40).chain([1000]).collect();
    assert_eq!(
        answered, all,
        "a stall of 100 ms under a 500 ms interval is absorbed"
    );
    assert!(absorbing.terminate().success());
    let totals = absorbing.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "shed"), 0, "{totals}");

    let mut shedding = chimed_v4(
        &chronyd,
        &[
            "-4",
            "1",
            "--batch-size",
            "4",
            "--shed-target",
            "0.02",
            "--shed-interval",
            "0",
        ],
    );
    let answered = stall_then_resume(&shedding, 40, Duration::from_millis(100));
    assert_eq!(
        answered,
        [1000],
        "only the request that did not wait is answered"
    );
    assert!(shedding.terminate().success());
    let totals = shedding.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "shed"), 40, "{totals}");
    assert_eq!(count_in(&totals, "received"), 41, "{totals}");
    assert_eq!(count_in(&totals, "answered"), 1, "{totals}");
}

/// An NTP timestamp (seconds since 1900 and a 32-bit fraction) as Unix seconds; valid in this
/// era.
fn ntp_to_unix(bytes: &[u8]) -> f64 {
    let secs = u32::from_be_bytes(bytes[..4].try_into().unwrap());
    let frac = u32::from_be_bytes(bytes[4..8].try_into().unwrap());
    f64::from(secs) - 2_208_988_800.0 + f64::from(frac) / 4_294_967_296.0
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// README's honesty claim: a request that waits in chimed's queue keeps its arrival time. chimed
/// is stopped (SIGSTOP) while five requests are sent, each with our clock read just before it
/// (T1), and resumed 300 ms later. Each reply's receive timestamp (T2) is the kernel's arrival
/// time, within a few milliseconds of T1 (same host, same clock), not the resume time; its
/// transmit timestamp (T3) is after the resume, so T3 − T2 carries the wait, which a client takes
/// out of the round trip. (Reading the clock after the receive instead, T2 would be 300 ms late.)
#[test]
fn a_queued_request_keeps_its_kernel_arrival_time() {
    let chronyd = Chronyd::start();
    let chimed = chimed_v4(&chronyd, &["-4", "1"]);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut request = [0u8; 48];
    request[0] = 0x23;
    chimed.pause();
    let mut sent = Vec::new();
    for i in 1..=5u64 {
        request[40..48].copy_from_slice(&i.to_be_bytes());
        sent.push(unix_now());
        sock.send_to(&request, chimed.addr).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    // Not a wait for readiness: this is the stall under test.
    std::thread::sleep(Duration::from_millis(300));
    let resumed = unix_now();
    chimed.resume();
    let mut buf = [0u8; 128];
    for _ in 0..5 {
        let (n, _) = sock
            .recv_from(&mut buf)
            .expect("every queued request answered");
        assert_eq!(n, 48);
        let i = u64::from_be_bytes(buf[24..32].try_into().unwrap());
        let t1 = sent[usize::try_from(i).unwrap() - 1];
        let (t2, t3) = (ntp_to_unix(&buf[32..40]), ntp_to_unix(&buf[40..48]));
        assert!(
            (t2 - t1).abs() < 0.005,
            "request {i}: T2 {:.6} s after T1, the resume {:.6} s after",
            t2 - t1,
            resumed - t1
        );
        assert!(
            t3 >= resumed - 0.001,
            "request {i}: T3 {:.6} s before the resume",
            resumed - t3
        );
    }
}
