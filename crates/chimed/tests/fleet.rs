//! A fleet behind one anycast address, as the busiest public time services run: network
//! namespaces this test makes (and removes when it ends) for a client, a router and three
//! members. Every member holds the service address on its loopback and runs its own chronyd -x
//! and chimed; the router reaches the address through one Linux multipath (ECMP) route over the
//! three, hashing on ports as well as addresses (`fib_multipath_hash_policy=1`), so each flow
//! (source port) goes to one member and different flows to different members.
//!
//! The members share nothing at run time: one NTS fleet secret and one Roughtime long-term key
//! were handed to them as files (each its own delegation bundle; the third's has run out). The
//! test reads each member's counters from its metrics endpoint, inside its namespace.
//!
//! Fixed ports are fine here: each namespace has its own, with nothing else in it.

mod common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{
    Chimed, Chronyd, ChronydClient, RKIK, certificate_for, in_netns, ip, peer, run, workspace_bin,
};
use nix::sys::signal::{self, Signal};

/// The fleet's service address, on every member's loopback.
const SERVICE: &str = "10.99.0.1";
const ROUGHTIME_PORT: u16 = 2002;
/// Seconds in one NTS cookie key period (--nts-rotation); a short one, so the test sees one pass.
const PERIOD_S: u64 = 4;
const MEMBERS: usize = 3;

/// The namespaces and their links; removed on drop (after every process in them, which the
/// test declares later, so drops first).
struct Net {
    client: String,
    router: String,
    members: Vec<String>,
}

impl Net {
    /// client 10.200.0.2 -- 10.200.0.1 router 10.200.i.1 -- 10.200.i.2 member i (1 to 3), each
    /// member with SERVICE/32 on lo; the router's route to SERVICE: a nexthop per member.
    fn build() -> Self {
        let tag = format!("chime-fleet-{}", std::process::id());
        let net = Net {
            client: format!("{tag}-c"),
            router: format!("{tag}-r"),
            members: (1..=MEMBERS).map(|i| format!("{tag}-m{i}")).collect(),
        };
        let (c, r) = (net.client.as_str(), net.router.as_str());
        for ns in [c, r]
            .into_iter()
            .chain(net.members.iter().map(String::as_str))
        {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        ip(&[
            "link", "add", "c0", "netns", c, "type", "veth", "peer", "name", "r0", "netns", r,
        ]);
        ip(&["-n", c, "addr", "add", "10.200.0.2/24", "dev", "c0"]);
        ip(&["-n", c, "link", "set", "c0", "up"]);
        ip(&["-n", c, "route", "add", "default", "via", "10.200.0.1"]);
        ip(&["-n", r, "addr", "add", "10.200.0.1/24", "dev", "r0"]);
        ip(&["-n", r, "link", "set", "r0", "up"]);
        for (i, m) in net.members.iter().enumerate() {
            let (i, m) = (i + 1, m.as_str());
            let rdev = format!("r{i}");
            ip(&[
                "link", "add", "m0", "netns", m, "type", "veth", "peer", "name", &rdev, "netns", r,
            ]);
            ip(&[
                "-n",
                m,
                "addr",
                "add",
                &format!("10.200.{i}.2/24"),
                "dev",
                "m0",
            ]);
            ip(&["-n", m, "link", "set", "m0", "up"]);
            ip(&[
                "-n",
                m,
                "addr",
                "add",
                &format!("{SERVICE}/32"),
                "dev",
                "lo",
            ]);
            let gw = format!("10.200.{i}.1");
            ip(&["-n", m, "route", "add", "default", "via", &gw]);
            ip(&["-n", r, "addr", "add", &format!("{gw}/24"), "dev", &rdev]);
            ip(&["-n", r, "link", "set", &rdev, "up"]);
        }
        let out = run(in_netns(Some(r), "sysctl").args([
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv4.fib_multipath_hash_policy=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ]));
        assert!(out.status.success(), "sysctl in the router: {out:?}");
        net.route(&[1, 2, 3]);
        net
    }

    /// Points the router's ECMP route for SERVICE at these members (1-based) only: what a
    /// member's BGP session does when its health check withdraws the address.
    fn route(&self, members: &[usize]) {
        let mut args = vec![
            "-n".to_owned(),
            self.router.clone(),
            "route".to_owned(),
            "replace".to_owned(),
            format!("{SERVICE}/32"),
        ];
        for i in members {
            args.extend(["nexthop", "via"].map(str::to_owned));
            args.push(format!("10.200.{i}.2"));
        }
        ip(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in [&self.client, &self.router]
            .into_iter()
            .chain(&self.members)
        {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// One member: its chronyd, its chimed, and where its metrics are (inside its namespace).
struct Member {
    /// 1 to 3.
    number: usize,
    ns: String,
    chimed: Chimed,
    metrics: SocketAddr,
    _upstream: Chronyd,
}

/// What a member has counted so far.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Counts {
    ntp: u64,
    nts: u64,
    naks: u64,
    /// The NAKs by why: the cookie named a key not held, did not open, served the other
    /// protocol; the authenticator did not verify.
    nak_why: [u64; 4],
    ke: u64,
    roughtime: u64,
    outside: u64,
}

/// The sum of the samples of `name` whose labels contain `labels`.
fn sum(page: &str, name: &str, labels: &str) -> u64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

impl Member {
    fn counts(&self) -> Counts {
        let page = common::scrape_in(&self.ns, self.metrics);
        Counts {
            ntp: sum(&page, "chimed_replies_sent_total", "service=\"ntp\""),
            nts: sum(&page, "chimed_nts_replies_total", ""),
            naks: sum(&page, "chimed_nts_naks_total", ""),
            nak_why: ["unknown_key", "bad_cookie", "other_protocol", "forged"]
                .map(|why| sum(&page, "chimed_nts_nak_reasons_total", &format!("\"{why}\""))),
            ke: sum(&page, "chimed_nts_ke_sessions_total", "outcome=\"agreed\""),
            roughtime: sum(&page, "chimed_roughtime_replies_total", ""),
            outside: sum(
                &page,
                "chimed_requests_dropped_total",
                "reason=\"outside_delegation\"",
            ),
        }
    }
}

/// Every member's counts, polled (workers publish theirs between batches) until `done` holds or
/// 10 s have passed; the last reading either way.
fn counts_until(members: &[Member], done: impl Fn(&[Counts]) -> bool) -> Vec<Counts> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Vec<Counts> = members.iter().map(Member::counts).collect();
        if done(&now) || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn show(phase: &str, members: &[Member], counts: &[Counts]) {
    // Straight to the test's stderr, past libtest's capture: CI's log shows what was counted.
    let mut err = std::io::stderr();
    for (m, c) in members.iter().zip(counts) {
        let _ = writeln!(
            err,
            "fleet: {phase}: member {}: ntp={} nts={} nts_nak={} (unknown_key, bad_cookie, \
             other_protocol, forged: {:?}) nts_ke={} roughtime={} outside_delegation={}",
            m.number, c.ntp, c.nts, c.naks, c.nak_why, c.ke, c.roughtime, c.outside
        );
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `chime` run in the client's namespace with `args`: its JSON, or what it said on failure.
fn chime(net: &Net, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = run(in_netns(Some(&net.client), workspace_bin("chime")).args(args));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {out:?}"))
}

fn make(args: &[&str], file: &Path) -> String {
    let out = run(Command::new(workspace_bin("chime")).args(args).arg(file));
    assert!(out.status.success(), "chime {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the members are handed as files: one certificate and key, one NTS fleet secret, and a
/// delegation bundle each from one Roughtime long-term key.
struct FleetFiles {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    secret: std::path::PathBuf,
    public_key: String,
    bundles: Vec<std::path::PathBuf>,
    _rt_key: common::RoughtimeKey,
    _dir: tempfile::TempDir,
}

fn fleet_files() -> FleetFiles {
    let dir = tempfile::tempdir().unwrap();
    // Issued for the service address: every member presents the same certificate.
    let (cert, key) = certificate_for(dir.path(), "fleet", &format!("IP:{SERVICE}"));
    let secret = dir.path().join("fleet-secret");
    make(&["nts-fleet-key"], &secret);
    let rt_key = common::chime_keygen();
    let (long_term, public_key) = (rt_key.file.clone(), rt_key.public_base64.clone());
    // A bundle per member; the third's windows all closed two days ago.
    let long_term_arg = long_term.to_str().unwrap();
    let mut bundles = Vec::new();
    for i in 1..=MEMBERS {
        let bundle = dir.path().join(format!("member{i}.bundle"));
        let past = (unix_now() as u64 - 3 * 86_400).to_string();
        let mut args = vec!["delegate", "--key", long_term_arg];
        if i == MEMBERS {
            args.extend(["--start", &past, "--days", "1"]);
        } else {
            args.extend(["--days", "2"]);
        }
        args.push("--out");
        make(&args, &bundle);
        bundles.push(bundle);
    }
    FleetFiles {
        cert,
        key,
        secret,
        public_key,
        bundles,
        _rt_key: rt_key,
        _dir: dir,
    }
}

/// The running fleet. Fields drop in order: the members' processes before their namespaces.
struct Fleet {
    members: Vec<Member>,
    net: Net,
    rkik: std::path::PathBuf,
    files: FleetFiles,
}

/// Member `i` (0-based) in namespace `ns`: its chronyd, and its chimed serving everything from
/// the fleet's files and `bundle`.
fn start_member(i: usize, ns: &str, files: &FleetFiles, bundle: &Path) -> Member {
    let upstream = "127.0.0.1:11123";
    let ntp = format!("{SERVICE}:123");
    let ke = format!("{SERVICE}:4460");
    let roughtime = format!("{SERVICE}:{ROUGHTIME_PORT}");
    let period = PERIOD_S.to_string();
    let chronyd = Chronyd::start_in(ns, 11123);
    let args = [
        "-s",
        upstream,
        "-4",
        "1",
        "-6",
        "0",
        "-a",
        &ntp,
        "--nts-certificate",
        files.cert.to_str().unwrap(),
        "--nts-private-key",
        files.key.to_str().unwrap(),
        "--nts-ke-address",
        &ke,
        "--nts-fleet-key",
        files.secret.to_str().unwrap(),
        "--nts-rotation",
        &period,
        "--roughtime-delegation",
        bundle.to_str().unwrap(),
        "--roughtime-ipv4-address",
        &roughtime,
        "--roughtime-ipv4-threads",
        "1",
        "--roughtime-ipv6-threads",
        "0",
        "--metrics-address",
        "127.0.0.1:0",
    ];
    let mut chimed = Chimed::start_in(Some(ns), &args, "ntp listening on");
    let metrics = chimed.logged_addr("metrics: http://");
    Member {
        number: i + 1,
        ns: ns.to_owned(),
        chimed,
        metrics,
        _upstream: chronyd,
    }
}

/// The files, the namespaces, and every member started and synchronised (the third saying its
/// bundle covers no time now).
fn start_fleet() -> Fleet {
    let files = fleet_files();
    let net = Net::build();
    let rkik = peer("RKIK", RKIK);
    let mut members: Vec<Member> = net
        .members
        .iter()
        .zip(&files.bundles)
        .enumerate()
        .map(|(i, (ns, bundle))| start_member(i, ns, &files, bundle))
        .collect();
    for m in &mut members {
        m.chimed
            .wait_for("synchronised: stratum 3", Duration::from_secs(15));
    }
    members[MEMBERS - 1].chimed.wait_for(
        "no window of the delegation bundle covers now",
        Duration::from_secs(1),
    );
    Fleet {
        members,
        net,
        rkik,
        files,
    }
}

/// 1. Plain NTP from many source ports (a new chime process each): every member answers
///    some, every reply synchronised and on our clock.
fn plain_ntp_reaches_every_member(f: &Fleet) {
    let members = &f.members;
    let start = counts_until(members, |_| true);
    for _ in 0..36 {
        let r = chime(&f.net, &["ntp", "--json", "--timeout", "2", SERVICE])
            .expect("an NTP query through the router went unanswered");
        assert_ne!(r["leap"], 3, "{r}");
        assert_eq!(r["stratum"], 3, "chronyd's stratum, mirrored: {r}");
        common::assert_offset_near(&r, 0.0);
    }
    let after_ntp = counts_until(members, |c| {
        c.iter().map(|c| c.ntp).sum::<u64>() >= start.iter().map(|c| c.ntp).sum::<u64>() + 36
    });
    show("36 NTP queries", members, &after_ntp);
    for (i, (a, b)) in start.iter().zip(&after_ntp).enumerate() {
        assert!(b.ntp > a.ntp, "member {} answered no NTP query", i + 1);
    }
}

/// Waits up to 15 s for chronyd to measure `n` more times.
fn measured_more(client: &ChronydClient, n: usize) {
    let want = client.measured() + n;
    let deadline = Instant::now() + Duration::from_secs(15);
    while client.measured() < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        client.measured() >= want,
        "chronyd measured {} of {n} more times over NTS",
        n + client.measured() - want
    );
}

/// 2. chronyd as an NTS client polling 16 times a second, each request from a new source
///    port: one NTS-KE, then authenticated replies from all three members, each opening
///    cookies another sealed (two members made none of them). The client, and the index of
///    the member that ran its NTS-KE.
fn nts_reaches_every_member(f: &Fleet) -> (ChronydClient, usize) {
    let client = ChronydClient::start_in(
        Some(&f.net.client),
        &[
            format!("server {SERVICE} iburst nts minpoll -4 maxpoll -4"),
            format!("ntstrustedcerts {}", f.files.cert.display()),
        ],
    );
    measured_more(&client, 24);
    let nts = counts_until(&f.members, |c| c.iter().all(|c| c.nts > 0));
    show("chronyd over NTS", &f.members, &nts);
    assert_eq!(
        nts.iter().map(|c| c.ke).sum::<u64>(),
        1,
        "chronyd ran NTS-KE once"
    );
    for (i, c) in nts.iter().enumerate() {
        assert!(c.nts > 0, "member {} sent no authenticated reply", i + 1);
        assert_eq!(c.naks, 0, "member {} sent NAKs", i + 1);
    }
    let ke_member = nts.iter().position(|c| c.ke == 1).unwrap();
    (client, ke_member)
}

/// Each bundle's online public key for now, in base64; none for a bundle with no window now.
fn online_keys(bundles: &[std::path::PathBuf]) -> Vec<Option<String>> {
    bundles
        .iter()
        .map(|b| {
            let bundle =
                chime_roughtime::Bundle::parse(&std::fs::read_to_string(b).unwrap()).unwrap();
            bundle.current(unix_now() as u64).map(|d| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(d.online_public_key())
            })
        })
        .collect()
}

/// 3. Roughtime from many source ports: replies from the two members with a window verify
///    under the one long-term key, each with its own online key; the third signs nothing.
fn roughtime_is_signed_by_members_with_a_window(f: &Fleet) {
    let (members, roughtime) = (&f.members, format!("{SERVICE}:{ROUGHTIME_PORT}"));
    let keys = online_keys(&f.files.bundles);
    assert!(keys[MEMBERS - 1].is_none());
    let before_roughtime = counts_until(members, |_| true);
    // Until every member has had some (ECMP's hash spreads source ports evenly, not exactly),
    // at most 60.
    let (mut seen, mut unanswered, mut queries) = (BTreeSet::new(), 0, 0);
    while queries < 12 || (seen.len() < 2 || unanswered < 2) && queries < 60 {
        queries += 1;
        let args = [
            "roughtime",
            "--json",
            "--timeout",
            "0.5",
            "--public-key",
            &f.files.public_key,
            &roughtime,
        ];
        match chime(&f.net, &args) {
            Ok(r) => {
                let online = r["online_key"].as_str().unwrap().to_owned();
                assert!(
                    keys.contains(&Some(online.clone())),
                    "signed by an online key no member's bundle holds: {r}"
                );
                seen.insert(online);
            }
            Err(_) => unanswered += 1,
        }
    }
    let rt = counts_until(members, |c| {
        c[MEMBERS - 1].outside >= before_roughtime[MEMBERS - 1].outside + unanswered
    });
    let _ = writeln!(
        std::io::stderr(),
        "fleet: {queries} Roughtime queries, {unanswered} unanswered"
    );
    show("Roughtime", members, &rt);
    assert_eq!(seen.len(), 2, "online keys seen: {seen:?}");
    assert!(
        unanswered > 0,
        "no query went to the member whose bundle ran out"
    );
    assert_eq!(
        rt[MEMBERS - 1].outside - before_roughtime[MEMBERS - 1].outside,
        unanswered,
        "the member whose bundle ran out dropped and counted every query it got"
    );
    assert_eq!(rt[MEMBERS - 1].roughtime, 0);
}

/// Waits (up to two periods) until the phase within the rotation period is in [lo, lo + 0.1);
/// the number of that period.
fn wait_for_phase(lo: f64) -> f64 {
    let period = PERIOD_S as f64;
    let deadline = Instant::now() + Duration::from_secs(2 * PERIOD_S);
    loop {
        let phase = unix_now() % period / period;
        if (lo..lo + 0.1).contains(&phase) {
            return (unix_now() / period).floor();
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// 4. A rotation period passes while chronyd holds its cookies: stopped mid-period, resumed
///    mid-way through the next, it spends cookies sealed under the previous period's key.
///    They open, no NAK, no new NTS-KE.
fn cookies_outlive_a_rotation(f: &Fleet, client: &ChronydClient) {
    let period = PERIOD_S as f64;
    wait_for_phase(0.5);
    signal::kill(client.pid(), Signal::SIGSTOP).unwrap();
    let stopped_in = (unix_now() / period).floor();
    std::thread::sleep(Duration::from_secs_f64(period * 0.8));
    let resumed_in = wait_for_phase(0.4);
    signal::kill(client.pid(), Signal::SIGCONT).unwrap();
    assert_eq!(resumed_in, stopped_in + 1.0, "one period boundary passed");
    measured_more(client, 16);
    let rotated = counts_until(&f.members, |_| true);
    show("a period later", &f.members, &rotated);
    assert_eq!(
        rotated.iter().map(|c| c.ke).sum::<u64>(),
        1,
        "no new NTS-KE"
    );
    assert!(
        rotated.iter().all(|c| c.naks == 0),
        "NAKs after the rotation (nak_why: unknown_key, bad_cookie, other_protocol, forged): \
         {rotated:?}"
    );
}

/// 5. The member that ran chronyd's NTS-KE fails: its route is withdrawn and it stops. The
///    others go on answering chronyd with the cookies it holds: no new NTS-KE, no NAK. The
///    member gone, and the others' counts after.
fn the_others_serve_when_a_member_fails(
    f: &mut Fleet,
    client: &ChronydClient,
    ke_member: usize,
) -> (Member, Vec<Counts>) {
    let others: Vec<usize> = (1..=MEMBERS).filter(|&i| i != ke_member + 1).collect();
    f.net.route(&others);
    let mut gone = f.members.remove(ke_member);
    assert!(gone.chimed.terminate().success());
    let before_loss: Vec<Counts> = counts_until(&f.members, |_| true);
    measured_more(client, 16);
    let after_loss = counts_until(&f.members, |c| {
        c.iter().zip(&before_loss).all(|(a, b)| a.nts > b.nts)
    });
    show("member gone", &f.members, &after_loss);
    for (a, b) in after_loss.iter().zip(&before_loss) {
        assert!(a.nts > b.nts, "a remaining member answered no NTS request");
        assert_eq!((a.ke, a.naks), (b.ke, 0), "NTS-KE again or NAKs");
    }
    (gone, after_loss)
}

/// 6. The other NTS clients against what is left: chime (one NTS-KE and one query each
///    time) and rkik (three queries; it runs NTS-KE before each), all authenticated.
fn other_nts_clients_are_served(f: &Fleet, after_loss: &[Counts]) {
    let (cert, ntp) = (&f.files.cert, format!("{SERVICE}:123"));
    for _ in 0..4 {
        let r = chime(
            &f.net,
            &[
                "ntp",
                "--nts",
                "--json",
                "--timeout",
                "2",
                "--nts-ca",
                cert.to_str().unwrap(),
                SERVICE,
            ],
        )
        .expect("chime ntp --nts through the fleet");
        assert_eq!(r["server"], ntp, "{r}");
    }
    let out = run(in_netns(Some(&f.net.client), &f.rkik)
        .args(["ntp", SERVICE, "--nts", "--json", "--count", "3"])
        .args(["--interval", "0.2", "--timeout", "2", "--no-color"])
        .env("SSL_CERT_FILE", cert));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "rkik: {said}{out:?}");
    // One JSON object a line: a line per query, then one of statistics.
    let results: Vec<serde_json::Value> = said
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect(&said))
        .filter_map(|j| j["results"].get(0).cloned())
        .collect();
    assert_eq!(results.len(), 3, "{said}");
    assert!(results.iter().all(|r| r["authenticated"] == true), "{said}");
    let others = counts_until(&f.members, |_| true);
    show("chime ntp --nts and rkik", &f.members, &others);
    let _ = writeln!(
        std::io::stderr(),
        "fleet: NTS-KE sessions for 4 chime ntp --nts and rkik's 3 queries: {}",
        others.iter().map(|c| c.ke).sum::<u64>() - after_loss.iter().map(|c| c.ke).sum::<u64>()
    );
}

/// Every member's totals at exit (`gone`'s too): authenticated replies, and never a NAK.
fn check_totals_at_exit(gone: &mut Member, members: &mut [Member]) {
    for m in members.iter_mut() {
        assert!(m.chimed.terminate().success());
    }
    for m in std::iter::once(gone).chain(members) {
        let totals = m
            .chimed
            .wait_for("ntp totals at exit", Duration::from_secs(1));
        let _ = writeln!(std::io::stderr(), "fleet: member {}: {totals}", m.number);
        assert_eq!(common::count_in(&totals, "nts_nak"), 0, "NAKs: {totals}");
        assert!(common::count_in(&totals, "nts") > 0, "{totals}");
    }
}

#[test]
fn a_fleet_behind_ecmp_serves_every_client_from_any_member() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the fleet test makes network namespaces: run it as root"
    );
    let mut fleet = start_fleet();
    plain_ntp_reaches_every_member(&fleet);
    let (client, ke_member) = nts_reaches_every_member(&fleet);
    roughtime_is_signed_by_members_with_a_window(&fleet);
    cookies_outlive_a_rotation(&fleet, &client);
    let (mut gone, after_loss) =
        the_others_serve_when_a_member_fails(&mut fleet, &client, ke_member);
    drop(client);
    other_nts_clients_are_served(&fleet, &after_loss);
    check_totals_at_exit(&mut gone, &mut fleet.members);
}
