//! chimed as a member of an NTS pool. The pool's key-exchange front end is played by the test:
//! chime-ntp's pool requests over a real TLS 1.3 session with chimed's NTS-KE, as nts-pool-ke
//! sends them, then NTS requests to chimed's NTP port under the keys the "pool" gave, as its
//! client would send them. (nts-pool-ke itself, built from pendulum-project/nts-pool, was run
//! against chimed by hand: see docs/NTS.adoc.)

mod common;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chime_ntp::nts::{self, Aead, ClientReply, Keys};
use chime_ntp::{Header, Mode, NtpTimestamp};
use common::{Chimed, Chronyd, KeTls, certificate, chimed_nts, count_in, exchange, ke_tls};

const TOKEN: &str = "c680e5f1c4f161968dd9b72f271ca5e7d17b0fe2e71e20b7ba4002b9252dd751";

/// Sends one NTS-KE message on `tls` and reads the answer, up to its End of Message.
fn ask(tls: &mut KeTls, request: &[u8]) -> Vec<u8> {
    tls.write_all(request).unwrap();
    tls.flush().unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 2048];
    while nts::ke_message_len(&answer).is_none() {
        let n = tls.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before End of Message: {answer:?}");
        answer.extend_from_slice(&chunk[..n]);
    }
    answer
}

/// Whether chimed closed `tls` (after its answer) within a few seconds.
fn closed(tls: &mut KeTls) -> bool {
    let mut byte = [0u8; 1];
    matches!(tls.read(&mut byte), Ok(0) | Err(_))
}

/// The pool token file, mode 0600.
fn token_file(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("pool-tokens");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A pool member: chimed with NTS (its certificate for 127.0.0.1 in `dir`), the pool tokens in
/// `tokens`, and `extra`, mirroring a chronyd of its own; synchronised.
struct Member {
    chronyd: Chronyd,
    chimed: Chimed,
    cert: PathBuf,
}

impl Member {
    fn start(dir: &Path, tokens: &Path, extra: &[&str]) -> (Self, std::net::SocketAddr) {
        let (cert, key) = certificate(dir, "server");
        let chronyd = Chronyd::start();
        let mut flags = vec!["--nts-pool-tokens", tokens.to_str().unwrap()];
        flags.extend_from_slice(extra);
        let (chimed, ke_port) = chimed_nts(&chronyd, &cert, &key, &flags);
        let member = Self {
            chronyd,
            chimed,
            cert,
        };
        (
            member,
            std::net::SocketAddr::from(([127, 0, 0, 1], ke_port)),
        )
    }

    /// A TLS session with its NTS-KE at `ke`, handshake done.
    fn session(&self, ke: std::net::SocketAddr) -> KeTls {
        ke_tls(ke, std::net::IpAddr::from([127, 0, 0, 1]), &self.cert)
    }
}

/// An NTS request under `keys` with `cookie` to chimed's NTP port: whether the reply is
/// authentic under them, with fresh cookies.
fn authenticated_time(ntp: std::net::SocketAddr, keys: &Keys, cookie: &[u8]) -> bool {
    matches!(
        nts_exchange(ntp, keys, cookie, false),
        Some(Ok(ClientReply::Authentic(cookies))) if !cookies.is_empty()
    )
}

/// Spends `cookie` in one NTS request under `keys`, NTPv4's or (`v5`) the NTPv5 draft -08's:
/// what the client makes of chimed's reply, if one came. No reply is longer than its request.
fn nts_exchange(
    ntp: std::net::SocketAddr,
    keys: &Keys,
    cookie: &[u8],
    v5: bool,
) -> Option<Result<ClientReply, nts::ClientReplyError>> {
    let uid: [u8; 32] = rand_bytes();
    let request = if v5 {
        let draft = chime_ntp::v5::Draft::D08;
        nts::client_request_v5(draft, rand_bytes(), &uid, cookie, 0, keys, rand_bytes())
    } else {
        let mut header = [0u8; 48];
        Header::request(4, Mode::Client, NtpTimestamp(1)).encode(&mut header);
        nts::client_request(&header, &uid, cookie, 0, keys, rand_bytes())
    };
    let reply = exchange(ntp, &request, Duration::from_secs(2))?;
    assert!(
        reply.len() <= request.len(),
        "a reply longer than its request"
    );
    Some(match v5 {
        true => nts::client_check_reply_v5(&reply, &uid, keys),
        false => nts::client_check_reply(&reply, &uid, keys),
    })
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b
}

/// A pool with its token asks, on one kept session, what chimed serves, then for cookies under
/// each algorithm for keys of its own; each set of cookies gets authenticated time from chimed's
/// NTP port under those keys, as the pool's client would. A wrong token, on a session of its own,
/// is answered Bad Request and closed; an ordinary client is served as ever. The counts at exit:
/// one pool session, three key requests, one support request, one refused.
#[test]
fn a_pool_with_its_token_gets_cookies_chimed_opens() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), &format!("# the test pool\ntoken {TOKEN}\n"));
    let (mut member, ke) = Member::start(dir.path(), &tokens, &[]);
    member
        .chimed
        .wait_for("a member of NTS pools: 1 token", Duration::from_secs(1));

    let mut pool = member.session(ke);
    let support = ask(
        &mut pool,
        &nts::pool_support_request(TOKEN.as_bytes(), true),
    );
    let support = nts::parse_pool_support(&support).unwrap();
    assert_eq!(support.algorithms, [(15, 32), (17, 64)]);
    assert_eq!(support.protocols, [0]);
    assert!(
        support.keep_alive,
        "the session is kept for the next request"
    );
    for (i, aead) in Aead::ALL.into_iter().enumerate() {
        let len = aead.key_len();
        let keys = Keys::new(
            nts::Protocol::NtpV4,
            aead,
            &rand_bytes::<64>()[..len],
            &rand_bytes::<64>()[..len],
        )
        .unwrap();
        let last = i + 1 == Aead::ALL.len();
        let v4 = nts::Protocol::NtpV4;
        let request = nts::pool_fixed_key_request(TOKEN.as_bytes(), &keys, v4, !last);
        let answer =
            nts::parse_ke_response(&ask(&mut pool, &request), nts::Protocol::NtpV4, &[aead])
                .unwrap();
        assert_eq!(answer.agreement.aead, aead);
        assert_eq!(answer.cookies.len(), 8, "{aead}");
        assert!(
            authenticated_time(member.chimed.addr, &keys, &answer.cookies[0]),
            "{aead}: no authentic reply under the pool's keys"
        );
    }
    assert!(
        closed(&mut pool),
        "closed after a request without Keep Alive"
    );

    let mut wrong = TOKEN.to_owned();
    wrong.replace_range(..1, "d");
    let mut guess = member.session(ke);
    let refused = ask(
        &mut guess,
        &nts::pool_support_request(wrong.as_bytes(), true),
    );
    assert_eq!(
        nts::parse_ke_response(&refused, nts::Protocol::NtpV4, &Aead::ALL),
        Err(nts::KeAnswerError::Refused(1)),
        "Bad Request"
    );
    assert!(closed(&mut guess), "a refused pool is not kept");

    let mut client = member.session(ke);
    let answer = ask(
        &mut client,
        &nts::ke_request(nts::Protocol::NtpV4, &[Aead::AesSivCmac256]),
    );
    assert_eq!(
        nts::parse_ke_response(&answer, nts::Protocol::NtpV4, &Aead::ALL)
            .unwrap()
            .cookies
            .len(),
        8
    );

    assert!(member.chimed.terminate().success());
    let totals = member
        .chimed
        .wait_for("nts-ke totals at exit", Duration::from_secs(1));
    for (counter, n) in [
        ("agreed", 1),
        ("refused", 1),
        ("pool", 1),
        ("pool.keys", 3),
        ("pool.support", 1),
        ("pool.refused", 1),
    ] {
        assert_eq!(count_in(&totals, counter), n, "{counter}: {totals}");
    }
}

/// A member serving NTPv5 (`--ntpv5`) says so to its pool, and seals the keys of a pool's client
/// that agreed on v5 with the pool: the response names the v5 draft (0x8001) and carries eight
/// cookies, which get authenticated time over v5 and a NAK over v4 (their keys are v5's). Without
/// `--ntpv5` it lists NTPv4 alone and answers a v5 key request with no protocol. (ntpd-rs over v5
/// through nts-pool-ke, by hand, in docs/NTS.adoc.)
#[test]
fn a_member_serving_ntpv5_lists_it_and_seals_v5_keys_for_its_pool() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), &format!("token {TOKEN}\n"));
    let v5 = nts::Protocol::NtpV5Draft;
    let keys = Keys::new(
        v5,
        Aead::AesSivCmac256,
        &rand_bytes::<32>(),
        &rand_bytes::<32>(),
    )
    .unwrap();
    for (flags, protocols) in [(&["--ntpv5"][..], &[0, 0x8001][..]), (&[], &[0])] {
        let (mut member, ke) = Member::start(dir.path(), &tokens, flags);
        let mut pool = member.session(ke);
        let support = ask(
            &mut pool,
            &nts::pool_support_request(TOKEN.as_bytes(), true),
        );
        let support = nts::parse_pool_support(&support).unwrap();
        assert_eq!(support.protocols, protocols, "{flags:?}");
        let answer = ask(
            &mut pool,
            &nts::pool_fixed_key_request(TOKEN.as_bytes(), &keys, v5, false),
        );
        let answer = nts::parse_ke_response(&answer, v5, &[Aead::AesSivCmac256]);
        if flags.is_empty() {
            assert_eq!(answer, Err(nts::KeAnswerError::NoProtocol));
        } else {
            let answer = answer.unwrap();
            assert_eq!(answer.agreement.protocol, v5, "the v5 draft");
            assert_eq!(answer.cookies.len(), 8);
            // A v5 client's cookies get authenticated time over v5, and a NAK over v4: their
            // keys were exported for v5.
            let addr = member.chimed.addr;
            let over_v5 = nts_exchange(addr, &keys, &answer.cookies[0], true);
            assert!(
                matches!(&over_v5, Some(Ok(ClientReply::Authentic(c))) if !c.is_empty()),
                "no authentic v5 reply under the pool's keys: {over_v5:?}"
            );
            let over_v4 = nts_exchange(addr, &keys, &answer.cookies[1], false);
            assert_eq!(
                over_v4,
                Some(Ok(ClientReply::Nak)),
                "a v5 cookie spent over v4"
            );
        }
        assert!(member.chimed.terminate().success());
        let v5_keys = u64::from(!flags.is_empty());
        let ntp = member
            .chimed
            .wait_for("ntp totals at exit", Duration::from_secs(1));
        // The v5 cookie spent over v4: one NAK, for its protocol.
        assert_eq!(count_in(&ntp, "nts_nak.other_protocol"), v5_keys, "{ntp}");
        assert_eq!(count_in(&ntp, "nts_nak"), v5_keys, "{ntp}");
        let totals = member
            .chimed
            .wait_for("nts-ke totals at exit", Duration::from_secs(1));
        assert_eq!(count_in(&totals, "pool.keys"), v5_keys, "{totals}");
        assert_eq!(count_in(&totals, "keys.ntpv5-draft"), v5_keys, "{totals}");
        assert_eq!(count_in(&totals, "keys.ntpv4"), 0, "{totals}");
    }
}

/// The token file is a secret: one readable by others, or that does not parse, stops chimed at
/// start with one line naming it; SIGHUP puts a new token in force, and the old one is refused;
/// a file that does not load on SIGHUP leaves the tokens in force.
#[test]
fn pool_tokens_are_checked_at_start_and_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let tokens = token_file(dir.path(), "token first\n");
    let check = |extra: &[&str]| {
        let out = common::run(
            std::process::Command::new(common::workspace_bin("chimed"))
                .args(common::nts_flags(&cert, &key))
                .args(["--nts-pool-tokens", tokens.to_str().unwrap()])
                .args(extra)
                .arg("--check-config"),
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, err) = check(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--nts-pool-tokens") && err.contains("pool-tokens"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    token_file(dir.path(), "token first extra\n");
    let (code, err) = check(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 1: trailing junk"), "{err}");

    let tokens = token_file(dir.path(), "token first\n");
    let (mut member, ke) = Member::start(dir.path(), &tokens, &[]);
    let asks = |member: &Member, token: &str| {
        let mut tls = member.session(ke);
        nts::parse_pool_support(&ask(
            &mut tls,
            &nts::pool_support_request(token.as_bytes(), false),
        ))
    };
    assert!(asks(&member, "first").is_ok());
    assert_eq!(asks(&member, "second"), Err(nts::KeAnswerError::Refused(1)));
    token_file(dir.path(), "token second\n");
    let pid = member.chimed.pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let reloaded = "SIGHUP: NTS pool tokens reloaded";
    member.chimed.wait_for(reloaded, Duration::from_secs(5));
    assert!(asks(&member, "second").is_ok());
    assert_eq!(asks(&member, "first"), Err(nts::KeAnswerError::Refused(1)));
    // A file that does not load changes nothing: the tokens in force stay.
    token_file(dir.path(), "token\n");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let kept = "SIGHUP: NTS pool tokens: ";
    let line = member.chimed.wait_for(kept, Duration::from_secs(5));
    assert!(line.contains("keeping those in force"), "{line}");
    assert!(asks(&member, "second").is_ok());
    assert!(member.chimed.terminate().success());
    let totals = member
        .chimed
        .wait_for("nts-ke totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "pool.support"), 3, "{totals}");
    assert_eq!(count_in(&totals, "pool.refused"), 2, "{totals}");
}

/// A fleet serves a pool: the member the pool asks seals its cookies under the fleet's keys, so
/// another member, with the fleet secret and no certificate, answers the pool's client under the
/// keys the pool gave, with no NAK.
#[test]
fn a_fleet_member_opens_the_cookies_another_made_for_a_pool() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), &format!("token {TOKEN}\n"));
    let secret = dir.path().join("fleet.key");
    let made = common::run(
        std::process::Command::new(common::workspace_bin("chime"))
            .arg("nts-fleet-key")
            .arg(&secret),
    );
    assert!(made.status.success(), "{made:?}");
    let secret = secret.to_str().unwrap();
    let (asked, ke) = Member::start(dir.path(), &tokens, &["--nts-fleet-key", secret]);
    let upstream = asked.chronyd.addr().to_string();
    let mut other = Chimed::mirroring(&upstream, &["--nts-fleet-key", secret]);
    other.wait_for("synchronised: stratum 3", Duration::from_secs(10));
    let mut pool = asked.session(ke);
    let keys = Keys::new(
        nts::Protocol::NtpV4,
        Aead::AesSivCmac512,
        &rand_bytes::<64>(),
        &rand_bytes::<64>(),
    )
    .unwrap();
    let request = nts::pool_fixed_key_request(TOKEN.as_bytes(), &keys, nts::Protocol::NtpV4, false);
    let answer =
        nts::parse_ke_response(&ask(&mut pool, &request), nts::Protocol::NtpV4, &Aead::ALL)
            .unwrap();
    assert!(authenticated_time(
        asked.chimed.addr,
        &keys,
        &answer.cookies[0]
    ));
    assert!(
        authenticated_time(other.addr, &keys, &answer.cookies[1]),
        "the other member did not open the pool's cookie"
    );
    assert!(other.terminate().success());
    let totals = other.wait_for("ntp totals at exit", Duration::from_secs(1));
    assert_eq!(count_in(&totals, "nts"), 1, "{totals}");
    assert_eq!(count_in(&totals, "nts_nak"), 0, "{totals}");
}

/// Kept sessions are bounded: 16 at once, and each closed after 10 s without a request. The 17th
/// pool session asking for Keep Alive is answered without it and closed; once a kept one is
/// given up by the pool, there is room again; and an idle kept session is closed by chimed.
#[test]
fn kept_pool_sessions_are_bounded_in_number_and_idle_time() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), &format!("token {TOKEN}\n"));
    let (member, ke) = Member::start(dir.path(), &tokens, &[]);
    let support = || nts::pool_support_request(TOKEN.as_bytes(), true);
    let mut kept: Vec<KeTls> = (0..16)
        .map(|i| {
            let mut tls = member.session(ke);
            let answer = nts::parse_pool_support(&ask(&mut tls, &support())).unwrap();
            assert!(answer.keep_alive, "session {i} not kept");
            tls
        })
        .collect();
    let mut over = member.session(ke);
    let answer = nts::parse_pool_support(&ask(&mut over, &support())).unwrap();
    assert!(!answer.keep_alive, "a 17th session kept");
    assert!(closed(&mut over), "the 17th is closed after its answer");
    // A pool that closes a kept session makes room for another.
    drop(kept.pop());
    let started = std::time::Instant::now();
    let again = loop {
        let mut tls = member.session(ke);
        let answer = nts::parse_pool_support(&ask(&mut tls, &support())).unwrap();
        if answer.keep_alive || started.elapsed() > Duration::from_secs(3) {
            break answer.keep_alive;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(again, "no room made by a session the pool closed");
    // An idle kept session is closed after 10 s (the test's read timeout is 8 s, so it waits
    // for the rest first).
    let idle = &mut kept[0];
    std::thread::sleep(Duration::from_secs(9));
    let waited = std::time::Instant::now();
    assert!(closed(idle), "an idle kept session stays open");
    assert!(waited.elapsed() < Duration::from_secs(5), "closed late");
}
