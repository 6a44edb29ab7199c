//! The answering XDP program, run by the kernel on crafted frames through `BPF_PROG_TEST_RUN`:
//! what it answers is answered as chime-ntp's socket path answers it, in a frame whose headers
//! and checksums hold (all checked here independently of the crate's own frame code); what it
//! does not answer goes exactly where the steering program sends it, untouched. Under allow/deny
//! rules, a request it would answer from a denied source is dropped, as chronyd's rules say
//! (a model of them here is the table's oracle).
//!
//! Needs root, to load XDP programs: in `scripts/test`'s system tier.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use chime_ntp::{
    ClientTable, Coin, Header, Leap, Mode, NtpShort, NtpTimestamp, RateLimit, ServedClock,
    ServedHeader, ServerState, StalePolicy, Verdict, ZoneShift,
};
use chime_xdp::prog_test_run::{Outcome, XdpProgram};
use chime_xdp::{
    ANSWER, DriverInput, DriverLimits, DriverOutcome, DriverRule, DriverState, DriverZone,
};
use proptest::prelude::*;
use proptest::sample;

const SERVER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 7);
const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// The TAI offset the tests' states hold: the program's clock is `CLOCK_TAI` less this, whatever
/// the kernel's own offset is.
const TAI_OFFSET: i64 = 37;

fn server(v6: bool, port: u16) -> SocketAddr {
    match v6 {
        false => SocketAddr::new(IpAddr::V4(SERVER_V4), port),
        true => SocketAddr::new(IpAddr::V6(SERVER_V6), port),
    }
}

fn client(v6: bool) -> SocketAddr {
    match v6 {
        false => SocketAddr::new(IpAddr::V4(CLIENT_V4), 40_123),
        true => SocketAddr::new(IpAddr::V6(CLIENT_V6), 40_123),
    }
}

/// NTP on both families' port 123, Roughtime on 2002 beside it.
fn targets() -> Vec<SocketAddr> {
    vec![server(false, 123), server(true, 123), server(false, 2002)]
}

fn ntp_targets() -> Vec<SocketAddr> {
    vec![server(false, 123), server(true, 123)]
}

fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests load XDP programs (CAP_BPF, CAP_NET_ADMIN): run them as root"
    );
}

/// Both programs, for the same targets.
struct Programs {
    steering: XdpProgram,
    answering: XdpProgram,
}

impl Programs {
    fn load(state: &DriverState) -> Self {
        assert_root();
        let answering = XdpProgram::answering(&targets(), &ntp_targets()).unwrap();
        answering.set_state(state).unwrap();
        Self {
            steering: XdpProgram::steering(&targets()).unwrap(),
            answering,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Frames, built and checked here without the crate's frame code.

/// The RFC 1071 sum of `data` as big-endian 16-bit words, folded, not complemented.
fn ones_sum(data: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    for pair in data.chunks(2) {
        acc += u64::from(pair[0]) << 8 | u64::from(*pair.get(1).unwrap_or(&0));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The UDP pseudo-header for `udp` between `src` and `dst`.
fn pseudo(src: IpAddr, dst: IpAddr, udp_len: usize) -> Vec<u8> {
    let mut p = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend(s.octets());
            p.extend(d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend(s.octets());
            p.extend(d.octets());
        }
        _ => unreachable!(),
    }
    p.extend([0, 17]);
    p.extend((udp_len as u16).to_be_bytes());
    p
}

/// A frame carrying `payload` from `src` to `dst`, with the IP fields a client's kernel might
/// set (TOS, identification, TTL, a flow label), and right checksums.
fn frame(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(SERVER_MAC);
    f.extend(CLIENT_MAC);
    let udp_len = 8 + payload.len();
    let ip_at = 14;
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend(0x0800u16.to_be_bytes());
            f.extend([0x45, 0xb8]);
            f.extend(((20 + udp_len) as u16).to_be_bytes());
            f.extend([0x12, 0x34, 0, 0, 57, 17, 0, 0]);
            f.extend(s.octets());
            f.extend(d.octets());
            let c = !ones_sum(&f[ip_at..ip_at + 20]);
            f[ip_at + 10..ip_at + 12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend(0x86ddu16.to_be_bytes());
            f.extend([0x6b, 0x81, 0x23, 0x45]);
            f.extend((udp_len as u16).to_be_bytes());
            f.extend([17, 57]);
            f.extend(s.octets());
            f.extend(d.octets());
        }
        _ => unreachable!(),
    }
    let udp_at = f.len();
    f.extend(src.port().to_be_bytes());
    f.extend(dst.port().to_be_bytes());
    f.extend((udp_len as u16).to_be_bytes());
    f.extend([0, 0]);
    f.extend(payload);
    let mut sum = pseudo(src.ip(), dst.ip(), udp_len);
    sum.extend(&f[udp_at..]);
    let c = match !ones_sum(&sum) {
        0 => 0xffff,
        c => c,
    };
    f[udp_at + 6..udp_at + 8].copy_from_slice(&c.to_be_bytes());
    f
}

/// The payload's offset in a frame of `v6` or not.
fn payload_at(v6: bool) -> usize {
    if v6 { 62 } else { 42 }
}

/// An NTP client request of `version` and `mode`, with every field the client may fill busy
/// (poll, precision, the other timestamps) and `origin` as its origin timestamp.
fn ntp_request(version: u8, mode: u8, origin: u64, transmit: u64) -> [u8; 48] {
    let mut h = Header::request(version, Mode::Client, NtpTimestamp(transmit));
    h.poll = 6;
    h.precision = -18;
    h.origin_ts = NtpTimestamp(origin);
    h.receive_ts = NtpTimestamp(0xE000_0000_1234_5678);
    let mut b = [0; 48];
    h.encode(&mut b);
    b[0] = (b[0] & 0xc0) | (version << 3) | mode;
    b
}

/// The reply the test expects for `request`, built here: the MACs, addresses and ports swapped,
/// the IP header as the AF_XDP path writes it (TOS 0, identification 0, DF, TTL / hop limit 64;
/// traffic class and flow label 0), `ntp` as the payload, and checksums made here.
fn expected_reply(request: &[u8], v6: bool, ntp: &[u8; 48]) -> Vec<u8> {
    let mut f = request.to_vec();
    f[0..6].copy_from_slice(&request[6..12]);
    f[6..12].copy_from_slice(&request[0..6]);
    let (src, dst, udp_at) = if v6 {
        f[14..18].copy_from_slice(&[0x60, 0, 0, 0]);
        f[21] = 64;
        let (s, d) = (request[22..38].to_vec(), request[38..54].to_vec());
        f[22..38].copy_from_slice(&d);
        f[38..54].copy_from_slice(&s);
        let ip = |b: &[u8]| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap()));
        (ip(&f[22..38]), ip(&f[38..54]), 54)
    } else {
        f[15] = 0;
        f[18..22].copy_from_slice(&[0, 0, 0x40, 0]);
        f[22] = 64;
        let (s, d) = (request[26..30].to_vec(), request[30..34].to_vec());
        f[26..30].copy_from_slice(&d);
        f[30..34].copy_from_slice(&s);
        f[24..26].fill(0);
        let c = !ones_sum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).unwrap()));
        (ip(&f[26..30]), ip(&f[30..34]), 34)
    };
    let (sport, dport) = (
        request[udp_at..udp_at + 2].to_vec(),
        request[udp_at + 2..udp_at + 4].to_vec(),
    );
    f[udp_at..udp_at + 2].copy_from_slice(&dport);
    f[udp_at + 2..udp_at + 4].copy_from_slice(&sport);
    f[udp_at + 8..].copy_from_slice(ntp);
    f[udp_at + 6..udp_at + 8].fill(0);
    let mut sum = pseudo(src, dst, 56);
    sum.extend(&f[udp_at..]);
    let c = match !ones_sum(&sum) {
        0 => 0xffff,
        c => c,
    };
    f[udp_at + 6..udp_at + 8].copy_from_slice(&c.to_be_bytes());
    f
}

/// A reply frame's checksums hold, as a receiver checks them.
fn checksums_hold(reply: &[u8], v6: bool) -> bool {
    let (src, dst, udp_at) = if v6 {
        let ip = |b: &[u8]| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap()));
        (ip(&reply[22..38]), ip(&reply[38..54]), 54)
    } else {
        if ones_sum(&reply[14..34]) != 0xffff {
            return false;
        }
        let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).unwrap()));
        (ip(&reply[26..30]), ip(&reply[30..34]), 34)
    };
    let mut sum = pseudo(src, dst, reply.len() - udp_at);
    sum.extend(&reply[udp_at..]);
    reply[udp_at + 6..udp_at + 8] != [0, 0] && ones_sum(&sum) == 0xffff
}

// ---------------------------------------------------------------------------------------------
// The clock and the state.

/// `clock` now, in nanoseconds.
fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one live timespec for the kernel to write.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// The program's local clock now: `CLOCK_TAI` less [`TAI_OFFSET`], as chime-ntp converts it.
fn program_clock() -> NtpTimestamp {
    let ns = clock_ns(libc::CLOCK_TAI) - i128::from(TAI_OFFSET) * 1_000_000_000;
    NtpTimestamp::from_unix((ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as u32)
}

/// A synchronised state, last updated `age` seconds ago, with every field distinct, served
/// through `clock`.
fn synced(age: f64, clock: ServedClock) -> ServerState {
    let now = program_clock();
    ServerState {
        leap: Leap::NoWarning,
        stratum: 2,
        precision: -23,
        reference_id: [192, 0, 2, 99],
        reference_ts: now.sub_duration(Duration::from_secs(300)),
        root_delay: NtpShort(0x0000_0345),
        root_dispersion: NtpShort(0x0000_0678),
        updated: Some(now.sub_duration(Duration::from_secs_f64(age))),
        clock,
        announced: None,
        tai_offset: Some(TAI_OFFSET as u16),
        leap_step: chime_ntp::LeapStep::NONE,
    }
}

/// A followed clock: `offset` seconds ahead, moving at `rate`, anchored `since` seconds ago (a
/// negative `since` is in the future: the clock stepped back since).
fn followed(offset: f64, rate: f64, since: f64) -> ServedClock {
    let now = program_clock();
    let anchor = if since >= 0.0 {
        now.sub_duration(Duration::from_secs_f64(since))
    } else {
        now.add_duration(Duration::from_secs_f64(-since))
    };
    ServedClock {
        anchor,
        offset,
        rate,
        error: 0.000_4,
        error_rate: 2e-6,
    }
}

/// What chimed will hand [`DriverState::new`]: its state and stale policy, as plain numbers.
fn input(state: &ServerState, policy: &StalePolicy) -> DriverInput {
    DriverInput {
        answer: true,
        leap: state.leap as u8,
        leap_announced: state.announced.is_some(),
        stratum: state.stratum,
        precision: state.precision,
        reference_id: state.reference_id,
        reference_ts: state.reference_ts.0,
        root_delay: state.root_delay.0,
        root_dispersion: state.root_dispersion.0,
        updated: state.updated.map(|t| t.0),
        stale_after_ns: policy.stale_after.as_nanos() as u64,
        dispersion_rate: policy.dispersion_rate,
        anchor: state.clock.anchor.0,
        offset: state.clock.offset,
        rate: state.clock.rate,
        error: state.clock.error,
        error_rate: state.clock.error_rate,
        tai_offset: TAI_OFFSET,
        zone: None,
        smear: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Running frames.

/// Runs `request` through both programs: if the answering one answers, checks the reply in full
/// against the socket path's for `state` and returns it; if not, checks that it went where the
/// steering program sends it, untouched, and returns that outcome.
fn run(
    p: &Programs,
    request: &[u8],
    state: &ServerState,
    policy: &StalePolicy,
) -> Result<Vec<u8>, Outcome> {
    let before = program_clock();
    let answered = p.answering.run(request).unwrap();
    let after = program_clock();
    let steered = p.steering.run(request).unwrap();
    assert_eq!(
        steered.frame, request,
        "the steering program changed a frame"
    );
    if answered.outcome != Outcome::Tx {
        assert_eq!(
            answered.outcome, steered.outcome,
            "not where the steering program sends it"
        );
        assert_eq!(answered.frame, request, "a frame handed on was changed");
        return Err(answered.outcome);
    }
    check_reply(request, &answered.frame, state, policy, (before, after));
    Ok(answered.frame)
}

/// Checks `reply` to `request`, made between the program clock's `before` and `after`:
/// the whole frame as [`expected_reply`] builds it from the socket path's NTP header for the same
/// request and state, with the program's timestamps, which must lie between the served times of
/// `before` and `after`.
fn check_reply(
    request: &[u8],
    reply: &[u8],
    state: &ServerState,
    policy: &StalePolicy,
    times: (NtpTimestamp, NtpTimestamp),
) {
    check_reply_as(request, reply, state, policy, times, &|_| {});
}

/// [`check_reply`], the socket path's header passed through `finish` as chimed's worker passes
/// it after `respond` (the rate limiter's KoD and suggested poll).
fn check_reply_as(
    request: &[u8],
    reply: &[u8],
    state: &ServerState,
    policy: &StalePolicy,
    (before, after): (NtpTimestamp, NtpTimestamp),
    finish: &dyn Fn(&mut [u8; 48]),
) {
    let v6 = request[12..14] == [0x86, 0xdd];
    assert!(
        answerable(request),
        "answered a request the socket path would not have"
    );
    assert_eq!(reply.len(), request.len(), "a reply the request's size");
    assert!(checksums_hold(reply, v6), "checksums");
    let at = payload_at(v6);
    let ntp: [u8; 48] = reply[at..].try_into().expect("48 bytes of NTP");
    let got = Header::parse(&ntp).unwrap();
    let (rx, tx) = (got.receive_ts, got.transmit_ts);
    let (lo, hi) = (state.clock.serve(before), state.clock.serve(after));
    // A unit of 2^-32 s either side: the receive mark, and rounding in the served offset.
    assert!(
        lo.0 <= rx.0 + 1 && rx.0 <= tx.0 + 1 && tx.0 <= hi.0 + 1,
        "times out of order: {lo:x} ≤ {rx:x} ≤ {tx:x} ≤ {hi:x}"
    );
    assert_eq!((rx.0 & 1, tx.0 & 1), (1, 0), "the interleaved-mode marks");
    // The socket path's header, at a time around the program's: where the two agree (the root
    // dispersion did not cross a unit between them), that is the one; else either.
    let port = u16::from_be_bytes([request[at - 8], request[at - 7]]);
    let socket = |now: NtpTimestamp| {
        let served: ServedHeader = state.served_at(now, policy);
        let mut out = [0u8; 48];
        chime_ntp::respond(&request[at..], port, rx, &served, &mut out).expect("answered");
        chime_ntp::stamp_transmit(&mut out, tx);
        finish(&mut out);
        out
    };
    let (early, late) = (socket(before), socket(after));
    let want = if ntp == late { late } else { early };
    assert_eq!(
        Header::parse(&ntp).unwrap(),
        Header::parse(&want).unwrap(),
        "the NTP header"
    );
    assert_eq!(reply, expected_reply(request, v6, &want), "the frame");
}

/// The request is one the AF_XDP worker and chime-ntp would answer and the program may: lengths
/// that match the frame, checksums that hold (or no UDP checksum, over IPv4), NTP version 1–4
/// mode 3, not in the interleaved form, not asking to upgrade.
fn answerable(request: &[u8]) -> bool {
    let v6 = request[12..14] == [0x86, 0xdd];
    let at = payload_at(v6);
    let lengths = if v6 {
        request.len() == 110 && request[18..20] == [0, 56] && request[58..60] == [0, 56]
    } else {
        request.len() == 90 && request[16..18] == [0, 76] && request[38..40] == [0, 56]
    };
    if !lengths {
        return false;
    }
    let udp_checksum = if v6 {
        &request[60..62]
    } else {
        &request[40..42]
    };
    let sums = if !v6 && udp_checksum == [0, 0] {
        ones_sum(&request[14..34]) == 0xffff
    } else {
        checksums_hold(request, v6)
    };
    let ntp = &request[at..];
    let version = (ntp[0] >> 3) & 7;
    sums && (1..=4).contains(&version)
        && ntp[0] & 7 == 3
        && ntp[31] & 1 == 0
        && ntp[16..24] != *b"NTP5DRFT"
}

fn policy() -> StalePolicy {
    StalePolicy::default()
}

fn loaded(state: &ServerState) -> Programs {
    Programs::load(&DriverState::new(&input(state, &policy())))
}

/// A request of `version` and mode 3 from the client to the NTP port of `v6`'s family.
fn request(v6: bool, version: u8, origin: u64) -> Vec<u8> {
    let ntp = ntp_request(version, 3, origin, 0xE111_2222_3333_4444);
    frame(client(v6), server(v6, 123), &ntp)
}

/// A server of one family only (chimed's `-6 0`, or IPv6 alone) gets a program the verifier
/// takes, which answers that family and hands the other's frames to the kernel untouched.
#[test]
fn a_program_for_one_family_loads_and_answers_it() {
    assert_root();
    let state = DriverState::new(&input(&synced(0.5, ServedClock::LOCAL), &policy()));
    for v6 in [false, true] {
        let ntp = [server(v6, 123)];
        let family = if v6 { "IPv6" } else { "IPv4" };
        let answering =
            XdpProgram::answering(&ntp, &ntp).unwrap_or_else(|e| panic!("{family} only: {e}"));
        answering.set_state(&state).unwrap();
        let ours = answering.run(&request(v6, 4, 0)).unwrap();
        assert_eq!(ours.outcome, Outcome::Tx, "{family} only");
        let other = answering.run(&request(!v6, 4, 0)).unwrap();
        assert_eq!(other.outcome, Outcome::Kernel, "{family} only");
        assert_eq!(other.frame, request(!v6, 4, 0), "{family} only");
    }
}

#[test]
fn client_requests_of_every_version_are_answered_as_the_socket_path_answers_them() {
    // 2.5 s old: 2.5 s at 15 ppm and the followed offset's error bound make 29.07 units of
    // 2^-16 s of growth, far from a whole unit.
    let state = synced(2.5, followed(0.25, 2e-5, 3.0));
    let p = loaded(&state);
    eprintln!(
        "the answering program: {} instructions (the steering one {})",
        p.answering.instructions(),
        p.steering.instructions()
    );
    for v6 in [false, true] {
        for version in 1..=4 {
            let req = request(v6, version, 0);
            let reply = run(&p, &req, &state, &policy()).expect("answered");
            let h = Header::parse(&reply[payload_at(v6)..]).unwrap();
            assert_eq!((h.version, h.mode), (version, Mode::Server));
            assert_eq!(h.origin_ts, NtpTimestamp(0xE111_2222_3333_4444));
            assert_eq!((h.leap, h.stratum, h.precision), (Leap::NoWarning, 2, -23));
            assert_eq!(h.reference_id, [192, 0, 2, 99]);
            assert_eq!(h.root_delay, NtpShort(0x0345));
            assert_eq!(h.root_dispersion, NtpShort(0x0678 + 30));
            assert_eq!(h.poll, 6, "the request's poll");
        }
    }
    // An old ntpd's request echoes our last transmit timestamp (even) as its origin: basic mode.
    let reply = run(
        &p,
        &request(false, 4, 0xE000_0001_0000_0002),
        &state,
        &policy(),
    );
    assert!(reply.is_ok());
}

#[test]
fn replies_carry_the_served_time() {
    // A second ahead and slewing, anchored 20 s ago (past the 16 s the rate is applied for), then
    // 2 s ago before and after the anchor.
    for (offset, rate, since) in [(1.0, 5e-4, 20.0), (-0.75, -3e-4, 2.0), (0.5, 1e-3, -2.0)] {
        let state = synced(1.0, followed(offset, rate, since));
        let p = loaded(&state);
        for v6 in [false, true] {
            run(&p, &request(v6, 4, 0), &state, &policy()).expect("answered");
        }
    }
}

#[test]
fn the_root_dispersion_saturates() {
    let mut state = synced(4.0, followed(0.0, 0.0, 0.0));
    state.root_dispersion = NtpShort(0xffff_fff0);
    let p = loaded(&state);
    let reply = run(&p, &request(false, 4, 0), &state, &policy()).expect("answered");
    assert_eq!(
        Header::parse(&reply[42..]).unwrap().root_dispersion,
        NtpShort::MAX
    );
}

#[test]
fn an_unsynchronised_server_is_answered_as_the_socket_path_answers_it() {
    let stale = synced(8.5, followed(0.0, 0.0, 0.0));
    let leap3 = ServerState {
        leap: Leap::Unsynchronised,
        ..synced(1.0, ServedClock::LOCAL)
    };
    let stratum16 = ServerState {
        stratum: 16,
        ..synced(1.0, ServedClock::LOCAL)
    };
    for state in [ServerState::unsynchronised(), stale, leap3, stratum16] {
        let p = loaded(&state);
        for v6 in [false, true] {
            let reply = run(&p, &request(v6, 4, 0), &state, &policy()).expect("answered");
            let h = Header::parse(&reply[payload_at(v6)..]).unwrap();
            assert_eq!((h.leap, h.stratum), (Leap::Unsynchronised, 0));
        }
    }
    // Just inside the stale time: synchronised still.
    let fresh = synced(7.5, followed(0.0, 0.0, 0.0));
    let reply = run(&loaded(&fresh), &request(false, 4, 0), &fresh, &policy()).unwrap();
    assert_eq!(Header::parse(&reply[42..]).unwrap().leap, Leap::NoWarning);
}

/// `request` goes where the steering program sends it (checked by [`run`]), which is `want`.
fn handed_on(p: &Programs, state: &ServerState, request: &[u8], want: Outcome) {
    assert_eq!(run(p, request, state, &policy()), Err(want));
}

#[test]
fn what_is_not_a_plain_client_request_goes_to_the_socket() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    for v6 in [false, true] {
        let ntp = ntp_request(4, 3, 0, 0xE111_2222_3333_4444);
        let to = |payload: &[u8]| frame(client(v6), server(v6, 123), payload);
        // Not 48 bytes: an extension field or a MAC, or not NTP.
        for len in [47, 49, 52, 68, 72] {
            let mut payload = ntp.to_vec();
            payload.resize(len, 0);
            handed_on(&p, &state, &to(&payload), Outcome::Socket);
        }
        for version in [0, 5, 6, 7] {
            handed_on(
                &p,
                &state,
                &to(&ntp_request(version, 3, 0, 1)),
                Outcome::Socket,
            );
        }
        for mode in [0, 1, 2, 4, 5, 6, 7] {
            handed_on(
                &p,
                &state,
                &to(&ntp_request(4, mode, 0, 1)),
                Outcome::Socket,
            );
        }
        // The interleaved form: the origin has the receive mark.
        handed_on(
            &p,
            &state,
            &to(&ntp_request(4, 3, 0xE000_0001_0000_0003, 1)),
            Outcome::Socket,
        );
        // Asking to upgrade to NTPv5.
        let mut upgrade = ntp;
        upgrade[16..24].copy_from_slice(b"NTP5DRFT");
        handed_on(&p, &state, &to(&upgrade), Outcome::Socket);
    }
    // Roughtime's port.
    let roughtime = frame(client(false), server(false, 2002), &ntp_request(4, 3, 0, 1));
    handed_on(&p, &state, &roughtime, Outcome::Socket);
}

#[test]
fn frames_the_worker_would_drop_go_to_the_socket_to_be_counted() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    for v6 in [false, true] {
        let good = request(v6, 4, 0);
        let udp_sum = if v6 { 60 } else { 40 };
        let mut bad = good.clone();
        bad[udp_sum + 1] ^= 1;
        handed_on(&p, &state, &bad, Outcome::Socket);
        // A payload byte changed under the checksum.
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 0x80;
        handed_on(&p, &state, &bad, Outcome::Socket);
        // Ethernet padding, or anything else after the datagram.
        handed_on(
            &p,
            &state,
            &[good.clone(), vec![0; 4]].concat(),
            Outcome::Socket,
        );
        if !v6 {
            let mut bad = good.clone();
            bad[24] ^= 1; // the IPv4 header checksum
            handed_on(&p, &state, &bad, Outcome::Socket);
            // No UDP checksum, which IPv4 allows: answered.
            let mut none = good.clone();
            none[40..42].fill(0);
            assert!(run(&p, &none, &state, &policy()).is_ok());
        }
    }
}

#[test]
fn other_traffic_goes_to_the_kernel() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    let ntp = ntp_request(4, 3, 0, 1);
    for v6 in [false, true] {
        // Another port, another address.
        handed_on(
            &p,
            &state,
            &frame(client(v6), server(v6, 124), &ntp),
            Outcome::Kernel,
        );
        let elsewhere = match v6 {
            false => SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)), 123),
            true => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 123),
        };
        handed_on(
            &p,
            &state,
            &frame(client(v6), elsewhere, &ntp),
            Outcome::Kernel,
        );
        // A VLAN tag.
        let good = request(v6, 4, 0);
        let tagged = [&good[..12], &[0x81, 0x00, 0x00, 0x07], &good[12..]].concat();
        handed_on(&p, &state, &tagged, Outcome::Kernel);
    }
    let good = request(false, 4, 0);
    // IPv4 options (a 24-byte header), a fragment (more fragments; an offset).
    let mut options = good.clone();
    options[14] = 0x46;
    handed_on(&p, &state, &options, Outcome::Kernel);
    for (at, bits) in [(20, 0x20), (21, 0x01)] {
        let mut fragment = good.clone();
        fragment[at] |= bits;
        handed_on(&p, &state, &fragment, Outcome::Kernel);
    }
    // An IPv6 extension header: hop-by-hop options, or a fragment header.
    for next in [0, 44] {
        let mut ext = request(true, 4, 0);
        ext[20] = next;
        handed_on(&p, &state, &ext, Outcome::Kernel);
    }
}

#[test]
fn a_truncated_frame_is_never_answered() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    for v6 in [false, true] {
        let good = request(v6, 4, 0);
        for len in 0..good.len() {
            let cut = &good[..len];
            if len < 14 {
                // The kernel runs no program on less than an Ethernet header.
                for prog in [&p.answering, &p.steering] {
                    let e = prog.run(cut).expect_err("too short to run");
                    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{len} bytes");
                }
                continue;
            }
            let want = if len < 42 || (v6 && len < 62) {
                Outcome::Kernel
            } else {
                Outcome::Socket
            };
            handed_on(&p, &state, cut, want);
        }
        assert!(run(&p, &good, &state, &policy()).is_ok());
    }
}

#[test]
fn nothing_is_answered_unless_the_state_says_so() {
    let state = synced(1.0, ServedClock::LOCAL);
    let req = request(false, 4, 0);
    // No state written yet.
    assert_root();
    let answering = XdpProgram::answering(&targets(), &ntp_targets()).unwrap();
    assert_eq!(answering.run(&req).unwrap().outcome, Outcome::Socket);
    // chimed's flag off (rules, rate limiting, ...).
    let off = DriverInput {
        answer: false,
        ..input(&state, &policy())
    };
    handed_on(
        &Programs::load(&DriverState::new(&off)),
        &state,
        &req,
        Outcome::Socket,
    );
    // A leap second announced: the workers say what happens at it.
    let warning = ServerState {
        leap: Leap::AddSecond,
        ..state
    };
    let p = loaded(&warning);
    handed_on(&p, &warning, &req, Outcome::Socket);
    assert_eq!(
        DriverState::new(&input(&warning, &policy())).flags & ANSWER,
        0
    );
}

/// Makes a frame's checksums hold over what it carries, whatever its length fields say: so that
/// a mutated frame reaches the checks after the checksums'.
fn refix_checksums(f: &mut [u8]) {
    let v6 = f.len() >= 62 && f[12..14] == [0x86, 0xdd];
    let v4 = f.len() >= 42 && f[12..14] == [0x08, 0x00] && f[14] == 0x45;
    let udp_at = match (v4, v6) {
        (true, _) => {
            f[24..26].fill(0);
            let c = !ones_sum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
            34
        }
        (_, true) => 54,
        _ => return,
    };
    let (src, dst) = if v6 {
        let ip = |b: &[u8]| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap()));
        (ip(&f[22..38]), ip(&f[38..54]))
    } else {
        let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).unwrap()));
        (ip(&f[26..30]), ip(&f[30..34]))
    };
    f[udp_at + 6..udp_at + 8].fill(0);
    let mut sum = pseudo(src, dst, f.len() - udp_at);
    sum.extend(&f[udp_at..]);
    let c = match !ones_sum(&sum) {
        0 => 0xffff,
        c => c,
    };
    f[udp_at + 6..udp_at + 8].copy_from_slice(&c.to_be_bytes());
}

/// A request as a client might send it, then perhaps damaged: another version, mode, origin or
/// port, another length, bytes flipped (with the checksums made to hold again, or not), cut
/// short, or with bytes after it.
fn requests() -> impl Strategy<Value = Vec<u8>> {
    // Weighted towards what is answered, so that both kinds are many.
    let header = (
        any::<bool>(),
        prop::sample::select(vec![4u8, 4, 4, 4, 3, 2, 1, 0, 5, 6, 7]),
        prop::sample::select(vec![3u8, 3, 3, 3, 3, 3, 3, 0, 1, 2, 4, 5, 6, 7]),
        any::<u64>(),
        any::<u64>(),
    );
    let shape = (
        prop::sample::select(vec![123u16, 123, 123, 123, 124, 2002]),
        prop::sample::select(vec![48usize, 48, 48, 48, 48, 47, 49, 52, 68]),
        any::<bool>(),
    );
    let flips = prop::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 1..3);
    let damage = (
        prop::option::weighted(0.4, flips).prop_map(Option::unwrap_or_default),
        any::<bool>(),
        prop::option::weighted(0.1, any::<prop::sample::Index>()),
        prop::sample::select(vec![0usize, 0, 0, 0, 0, 0, 0, 0, 1, 4]),
    );
    (header, shape, damage).prop_map(
        |(
            (v6, version, mode, origin, transmit),
            (port, len, zero_sum),
            (flips, refix, cut, tail),
        )| {
            // Half the origins even (basic mode's), half anything.
            let origin = if origin & 2 == 0 { origin & !1 } else { origin };
            let mut payload = ntp_request(version, mode, origin, transmit).to_vec();
            payload.resize(len, 0x5a);
            let mut f = frame(client(v6), server(v6, port), &payload);
            if zero_sum && !v6 {
                f[40..42].fill(0);
            }
            for (at, bits) in &flips {
                let at = at.index(f.len());
                f[at] ^= bits;
            }
            if refix && !flips.is_empty() {
                refix_checksums(&mut f);
            }
            if let Some(cut) = cut {
                f.truncate(cut.index(f.len() + 1).max(14));
            }
            f.extend(std::iter::repeat_n(0, tail));
            f
        },
    )
}

#[test]
fn a_frame_is_answered_only_with_a_right_reply_and_otherwise_goes_where_it_went() {
    let state = synced(2.5, followed(0.25, 2e-5, 3.0));
    let p = loaded(&state);
    let config = proptest::test_runner::Config::with_cases(6000);
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let answered = std::cell::Cell::new(0);
    runner
        .run(&requests(), |f| {
            if run(&p, &f, &state, &policy()).is_ok() {
                answered.set(answered.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    // Random bytes: nearly all to the kernel.
    let random = prop::collection::vec(any::<u8>(), 14..200);
    runner
        .run(&random, |f| {
            run(&p, &f, &state, &policy()).ok();
            Ok(())
        })
        .unwrap();
    // Enough of each kind ran.
    assert!(answered.get() > 200, "{} answered", answered.get());
    assert!(answered.get() < 5800, "{} answered", answered.get());
}

/// A state of any age within (and past) its stale time, with a followed clock anywhere around its
/// anchor, and rates and bounds of every size chimed sees.
fn states() -> impl Strategy<Value = (ServerState, StalePolicy)> {
    let clock = (
        -5.0..5.0f64,
        -2e-3..2e-3f64,
        -30.0..30.0f64,
        0.0..0.05f64,
        0.0..1e-3f64,
    );
    let policy = (1.0..64.0f64, 0.0..1e-4f64);
    (clock, policy, 0.0..1.1f64, any::<u32>(), any::<bool>()).prop_map(
        |(
            (offset, rate, since, error, error_rate),
            (stale, dispersion_rate),
            age,
            dispersion,
            still,
        )| {
            let mut clock = followed(offset, rate, since);
            clock.error = error;
            clock.error_rate = error_rate;
            if still {
                clock.rate = 0.0;
                clock.error_rate = 0.0;
            }
            let mut state = synced(age * stale, clock);
            state.root_dispersion = NtpShort(dispersion >> 8);
            let policy = StalePolicy {
                stale_after: Duration::from_secs_f64(stale),
                dispersion_rate,
            };
            (state, policy)
        },
    )
}

#[test]
fn the_state_is_aged_and_the_time_served_as_the_socket_path_does() {
    let p = loaded(&synced(1.0, ServedClock::LOCAL));
    let config = proptest::test_runner::Config::with_cases(1000);
    let mut runner = proptest::test_runner::TestRunner::new(config);
    runner
        .run(&(states(), any::<bool>()), |((state, policy), v6)| {
            let driver = DriverState::new(&input(&state, &policy));
            prop_assert_eq!(driver.flags & ANSWER, ANSWER);
            p.answering.set_state(&driver).unwrap();
            run(&p, &request(v6, 4, 0), &state, &policy).expect("answered");
            Ok(())
        })
        .unwrap();
}

/// The answering program's counts, by name, those that are not zero.
fn counts(p: &Programs) -> Vec<(&'static str, u64)> {
    let all = p.answering.counts().unwrap();
    assert_eq!(
        all.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        DriverOutcome::ALL,
        "every outcome, in order"
    );
    (all.into_iter())
        .filter(|&(_, n)| n > 0)
        .map(|(o, n)| (o.name(), n))
        .collect()
}

#[test]
fn each_frame_to_a_served_address_is_counted_by_what_was_done_with_it() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    assert!(counts(&p).is_empty(), "counts before any frame");
    // NTP alone, as chimed without Roughtime serves it: loaded too.
    XdpProgram::answering(&ntp_targets(), &ntp_targets()).expect("NTP's targets alone");
    let go = |f: &[u8], want| assert_eq!(p.answering.run(f).unwrap().outcome, want);
    for v6 in [false, true, false] {
        go(&request(v6, 4, 0), Outcome::Tx);
    }
    let to = |payload: &[u8]| frame(client(false), server(false, 123), payload);
    let ntp = ntp_request(4, 3, 0, 0xE111_2222_3333_4444);
    go(
        &frame(client(false), server(false, 2002), &ntp),
        Outcome::Socket,
    );
    let mut long = ntp.to_vec();
    long.resize(68, 0);
    go(&to(&long), Outcome::Socket);
    go(&[request(true, 4, 0), vec![0; 4]].concat(), Outcome::Socket);
    let mut bad = request(false, 4, 0);
    bad[41] ^= 1;
    go(&bad, Outcome::Socket);
    go(&to(&ntp_request(4, 4, 0, 1)), Outcome::Socket);
    go(&to(&ntp_request(5, 3, 0, 1)), Outcome::Socket);
    go(&to(&ntp_request(0, 3, 0, 1)), Outcome::Socket);
    go(
        &to(&ntp_request(4, 3, 0xE000_0001_0000_0003, 1)),
        Outcome::Socket,
    );
    let mut upgrade = ntp;
    upgrade[16..24].copy_from_slice(b"NTP5DRFT");
    go(&to(&upgrade), Outcome::Socket);
    // Not to a served address and port: the kernel's, not counted.
    go(
        &frame(client(false), server(false, 124), &ntp),
        Outcome::Kernel,
    );
    let off = DriverInput {
        answer: false,
        ..input(&state, &policy())
    };
    p.answering.set_state(&DriverState::new(&off)).unwrap();
    go(&request(true, 4, 0), Outcome::Socket);
    assert_eq!(
        counts(&p),
        [
            ("answered", 3),
            ("not_ntp", 1),
            ("length", 2),
            ("malformed", 1),
            ("mode", 1),
            ("version", 2),
            ("interleaved", 1),
            ("upgrade", 1),
            ("off", 1),
        ]
    );
}

#[test]
fn no_reply_mixes_two_states_while_the_state_changes() {
    // Two states that differ in every field a reply carries, the served time by seconds.
    let a = synced(1.0, followed(0.25, 2e-5, 3.0));
    let b = ServerState {
        stratum: 3,
        precision: -20,
        reference_id: [198, 51, 100, 1],
        root_delay: NtpShort(0x0000_1000),
        root_dispersion: NtpShort(0x0000_2000),
        ..synced(3.0, followed(-4.5, -3e-5, 1.0))
    };
    let driver = |s: &ServerState| DriverState::new(&input(s, &policy()));
    let (da, db) = (driver(&a), driver(&b));
    let p = loaded(&a);
    // Each write waits for the programs reading the last state to finish (an RCU grace period,
    // milliseconds), so the frames go on until there have been enough writes.
    let writes = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (mut seen_a, mut seen_b, mut frames) = (0, 0, 0);
    std::thread::scope(|scope| {
        let maps = p.answering.driver_maps();
        // Stops the writer however the loop below ends, a failed check included.
        let _stop = StopOnDrop(&stop);
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                maps.set_state(&db).unwrap();
                maps.set_state(&da).unwrap();
                writes.fetch_add(2, Ordering::Relaxed);
            }
        });
        while frames < 20_000 || writes.load(Ordering::Relaxed) < 200 {
            let v6 = frames % 2 == 1;
            let req = request(v6, 4, 0);
            let before = program_clock();
            let answered = p.answering.run(&req).unwrap();
            let after = program_clock();
            assert_eq!(answered.outcome, Outcome::Tx);
            let stratum = answered.frame[payload_at(v6) + 1];
            let state = if stratum == 2 { &a } else { &b };
            if stratum == 2 {
                seen_a += 1;
            } else {
                seen_b += 1;
            }
            check_reply(&req, &answered.frame, state, &policy(), (before, after));
            frames += 1;
        }
    });
    let writes = writes.into_inner();
    eprintln!("{seen_a} replies from one state, {seen_b} from the other, {writes} writes");
    assert!(seen_a > 100 && seen_b > 100, "{seen_a} and {seen_b}");
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// Allow and deny.

/// A rule from text as chimed's `--allow`/`--deny` take it: `ADDR/PREFIX`.
fn rule(allow: bool, subnet: &str) -> DriverRule {
    let (addr, prefix) = subnet.split_once('/').expect("ADDR/PREFIX");
    let (v6, addr) = match addr.parse::<IpAddr>().unwrap() {
        IpAddr::V4(a) => (false, u128::from(u32::from(a))),
        IpAddr::V6(a) => (true, u128::from(a)),
    };
    DriverRule {
        v6,
        addr,
        prefix: prefix.parse().unwrap(),
        allow,
    }
}

fn rules(allow: &[&str], deny: &[&str]) -> Vec<DriverRule> {
    let allowed = allow.iter().map(|s| rule(true, s));
    allowed.chain(deny.iter().map(|s| rule(false, s))).collect()
}

/// chronyd's rules, as chimed's `Acl::permits` applies them, written here apart from both: of
/// the rules of the source's family that hold it (an IPv4-mapped source is IPv4), the longest
/// prefix decides, deny if any of that prefix denies; with none, the source is served only if no
/// rule allows.
fn permits(rules: &[DriverRule], source: IpAddr) -> bool {
    let (v6, addr) = match source {
        IpAddr::V4(a) => (false, u128::from(u32::from(a))),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(m) => (false, u128::from(u32::from(m))),
            None => (true, u128::from(a)),
        },
    };
    let width = if v6 { 128 } else { 32 };
    let holds = |r: &&DriverRule| {
        r.v6 == v6 && {
            let host = width - u32::from(r.prefix);
            r.prefix == 0 || addr >> host == r.addr >> host
        }
    };
    let longest = rules.iter().filter(holds).map(|r| r.prefix).max();
    match longest {
        None => !rules.iter().any(|r| r.allow),
        Some(p) => (rules.iter().filter(holds)).all(|r| r.prefix != p || r.allow),
    }
}

/// A request from `source` to the NTP address of its family (IPv4-mapped sources to IPv6's).
fn request_from(source: IpAddr) -> Vec<u8> {
    let ntp = ntp_request(4, 3, 0, 0xE111_2222_3333_4444);
    frame(
        SocketAddr::new(source, 40_123),
        server(source.is_ipv6(), 123),
        &ntp,
    )
}

/// Runs a request from `source`: answered (the reply checked in full) or dropped unchanged;
/// returns whether it was answered.
fn answered_from(p: &Programs, state: &ServerState, source: IpAddr) -> bool {
    let req = request_from(source);
    let before = program_clock();
    let answered = p.answering.run(&req).unwrap();
    let after = program_clock();
    match answered.outcome {
        Outcome::Drop => {
            assert_eq!(answered.frame, req, "a dropped frame was changed");
            false
        }
        Outcome::Tx => {
            check_reply(&req, &answered.frame, state, &policy(), (before, after));
            true
        }
        other => panic!("{source}: {other:?}"),
    }
}

/// One program, rule sets given in turn, and the requests sent and dropped.
struct Cases {
    state: ServerState,
    p: Programs,
    sent: u64,
    denied: u64,
}

impl Cases {
    fn new() -> Self {
        let state = synced(1.0, ServedClock::LOCAL);
        let p = loaded(&state);
        Self {
            state,
            p,
            sent: 0,
            denied: 0,
        }
    }

    /// Sets `rules` and checks each `(source, answered)` of `cases` against the program and
    /// against [`permits`].
    fn case(&mut self, rules: &[DriverRule], cases: &[(&str, bool)]) {
        self.p.answering.set_access(rules).unwrap();
        for &(source, want) in cases {
            let ip: IpAddr = source.parse().unwrap();
            assert_eq!(permits(rules, ip), want, "the table, for {source}");
            let got = answered_from(&self.p, &self.state, ip);
            assert_eq!(got, want, "the program, for {source} under {rules:?}");
            self.sent += 1;
            self.denied += u64::from(!want);
        }
    }

    /// Every request dropped is counted `denied`, every other `answered`.
    fn counted(&self) {
        assert_eq!(
            counts(&self.p),
            [
                ("answered", self.sent - self.denied),
                ("denied", self.denied)
            ],
            "{} sent",
            self.sent
        );
    }
}

#[test]
fn the_longest_prefix_decides_and_deny_wins_for_the_same_subnet() {
    let mut c = Cases::new();
    // No rules: everyone, without a lookup.
    c.case(
        &[],
        &[
            ("198.51.100.7", true),
            ("2001:db8:c::7", true),
            ("::ffff:198.51.100.7", true),
        ],
    );
    // The longest prefix decides, both ways; what no rule covers is not served beside allows.
    let nested = rules(
        &[
            "10.0.0.0/8",
            "10.1.2.3/32",
            "2001:db8::/32",
            "2001:db8:c::7/128",
        ],
        &["10.1.0.0/16", "2001:db8:c::/48"],
    );
    c.case(
        &nested,
        &[
            ("10.9.9.9", true),
            ("10.1.9.9", false),
            ("10.1.2.3", true),
            ("10.1.2.4", false),
            ("198.51.100.7", false),
            ("2001:db8:1::5", true),
            ("2001:db8:c::8", false),
            ("2001:db8:c::7", true),
            ("2001:db9::1", false),
            ("::ffff:10.1.2.3", true),
            ("::ffff:10.1.9.9", false),
            ("::ffff:198.51.100.7", false),
        ],
    );
    // Only deny rules: everyone else is served.
    c.case(
        &rules(&[], &["198.51.100.0/24", "2001:db8:c::/48"]),
        &[
            ("198.51.100.7", false),
            ("198.51.101.7", true),
            ("2001:db8:c::7", false),
            ("2001:db8:d::7", true),
            ("::ffff:198.51.100.9", false),
        ],
    );
    // Deny wins for the same subnet, whatever the order given; a longer allow inside it wins.
    for same in [
        rules(&["198.51.100.0/24"], &["198.51.100.0/24"]),
        [
            rule(false, "198.51.100.0/24"),
            rule(true, "198.51.100.0/24"),
        ]
        .to_vec(),
    ] {
        c.case(&same, &[("198.51.100.7", false), ("198.51.100.200", false)]);
    }
    c.case(
        &rules(
            &["198.51.100.0/24", "198.51.100.7/32"],
            &["198.51.100.0/24"],
        ),
        &[("198.51.100.7", true), ("198.51.100.8", false)],
    );
    c.counted();
}

#[test]
fn families_stay_apart_and_rules_are_replaced_whole() {
    let mut c = Cases::new();
    // The families stay apart: IPv4 rules say nothing of IPv6 sources but IPv4-mapped ones, and
    // IPv6 rules nothing of those.
    c.case(
        &rules(&["0.0.0.0/0", "::/0"], &["0.0.0.0/0"]),
        &[
            ("198.51.100.7", false),
            ("::ffff:198.51.100.7", false),
            ("2001:db8:c::7", true),
        ],
    );
    c.case(
        &rules(&[], &["::/0"]),
        &[
            ("2001:db8:c::7", false),
            ("::ffff:198.51.100.7", true),
            ("198.51.100.7", true),
            ("::198.51.100.7", false),
        ],
    );
    c.case(
        &rules(&["::ffff:0:0/96"], &[]),
        &[("::ffff:198.51.100.7", false), ("::fffe:c633:6407", false)],
    );
    c.case(
        &rules(&[], &["::ffff:0:0/96"]),
        &[("::ffff:198.51.100.7", true), ("::fffe:c633:6407", true)],
    );
    // Replaced, and removed: the rules in force are the last set.
    c.case(
        &rules(&[], &["198.51.100.7/32"]),
        &[("198.51.100.7", false), ("198.51.100.8", true)],
    );
    c.case(&[], &[("198.51.100.7", true), ("2001:db8:c::8", true)]);
    c.counted();
}

#[test]
fn requests_the_program_hands_on_are_not_judged_by_it() {
    // The workers apply the rules to these; the program hands them on as without rules.
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    p.answering
        .set_access(&rules(&[], &["0.0.0.0/0", "::/0"]))
        .unwrap();
    let from = |v6| SocketAddr::new(client(v6).ip(), 40_123);
    for v6 in [false, true] {
        handed_on(
            &p,
            &state,
            &frame(from(v6), server(v6, 123), &ntp_request(4, 4, 0, 1)),
            Outcome::Socket,
        );
        handed_on(
            &p,
            &state,
            &frame(from(v6), server(v6, 123), &ntp_request(4, 3, 0, 1)[..40]),
            Outcome::Socket,
        );
    }
    handed_on(
        &p,
        &state,
        &frame(from(false), server(false, 2002), &[0; 48]),
        Outcome::Socket,
    );
    assert_eq!(
        counts(&p),
        [("not_ntp", 1), ("length", 2), ("mode", 2)],
        "none denied"
    );
}

/// Rules and sources near each other, so that subnets nest, overlap and repeat: IPv4 in
/// 198.51.100.0/24 and 10.0.0.0/8, IPv6 in 2001:db8:c::/48, with prefix lengths from a few, and
/// IPv4-mapped sources.
fn access_cases() -> impl Strategy<Value = (Vec<DriverRule>, Vec<IpAddr>)> {
    let v4 = prop_oneof![
        any::<u8>().prop_map(|b| u32::from_be_bytes([198, 51, 100, b])),
        any::<u8>().prop_map(|b| u32::from_be_bytes([10, b & 3, 0, b])),
    ];
    let v6 = any::<u16>().prop_map(|w| {
        let mut a = u128::from(Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 0));
        a |= u128::from(w & 0xff) | (u128::from(w >> 8) << 64);
        a
    });
    let rule = prop_oneof![
        (
            v4.clone(),
            sample::select(&[0u8, 8, 16, 24, 26, 28, 30, 31, 32][..]),
            any::<bool>()
        )
            .prop_map(|(a, prefix, allow)| DriverRule {
                v6: false,
                addr: u128::from(a),
                prefix,
                allow,
            }),
        (
            v6.clone(),
            sample::select(&[0u8, 32, 48, 56, 64, 72, 120, 126, 127, 128][..]),
            any::<bool>()
        )
            .prop_map(|(addr, prefix, allow)| DriverRule {
                v6: true,
                addr,
                prefix,
                allow,
            }),
    ];
    let source = prop_oneof![
        v4.clone().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        v4.prop_map(|a| IpAddr::V6(Ipv4Addr::from(a).to_ipv6_mapped())),
        v6.prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
    ];
    (
        proptest::collection::vec(rule, 0..8),
        proptest::collection::vec(source, 1..16),
    )
}

#[test]
fn any_rules_are_applied_to_any_source_as_chronyd_applies_them() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    let config = ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    };
    proptest::test_runner::TestRunner::new(config)
        .run(&access_cases(), |(rules, sources)| {
            p.answering.set_access(&rules).unwrap();
            for source in sources {
                prop_assert_eq!(
                    answered_from(&p, &state, source),
                    permits(&rules, source),
                    "{} under {:?}",
                    source,
                    rules
                );
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn no_frame_is_judged_by_two_rule_sets_while_they_change() {
    // Two rule sets under which one source is always answered and another always dropped, but
    // a mix of one's rules and the other's default for uncovered sources flips one of them.
    let (answered, dropped): (IpAddr, IpAddr) = (
        "198.51.100.7".parse().unwrap(),
        "198.51.100.9".parse().unwrap(),
    );
    let a = rules(&[], &["198.51.100.9/32"]);
    let b = rules(&["198.51.100.7/32"], &[]);
    for set in [&a, &b] {
        assert!(permits(set, answered) && !permits(set, dropped));
    }
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    p.answering.set_access(&a).unwrap();
    let writes = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let mut frames = 0;
    std::thread::scope(|scope| {
        let maps = p.answering.driver_maps();
        let _stop = StopOnDrop(&stop);
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                maps.set_access(&b).unwrap();
                maps.set_access(&a).unwrap();
                writes.fetch_add(2, Ordering::Relaxed);
            }
        });
        while frames < 20_000 || writes.load(Ordering::Relaxed) < 200 {
            let req = request_from(if frames % 2 == 0 { answered } else { dropped });
            let got = p.answering.run(&req).unwrap().outcome;
            let want = if frames % 2 == 0 {
                Outcome::Tx
            } else {
                Outcome::Drop
            };
            assert_eq!(got, want, "frame {frames}");
            frames += 1;
        }
    });
    eprintln!("{frames} frames, {} writes", writes.into_inner());
}

// Rate limiting, against chime-ntp's `ClientTable` as chimed's NTP workers use it (relenting).

const SEED: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
const CLIENTS: usize = 4096;

/// The answering program serving `state`, its rate limiter's table for [`CLIENTS`] keyed by
/// [`SEED`], limited by `limit`.
fn limited(state: &ServerState, limit: RateLimit) -> XdpProgram {
    assert_root();
    let p = XdpProgram::answering_limited(&targets(), &ntp_targets(), CLIENTS, SEED).unwrap();
    p.set_state(&DriverState::new(&input(state, &policy())))
        .unwrap();
    let l = DriverLimits::new(limit.interval(), limit.burst(), limit.leak(), limit.kod());
    p.driver_maps().set_limits(&l).unwrap();
    p
}

/// The table chimed's workers check, for the same limits, size and seed.
fn table(limit: RateLimit) -> ClientTable {
    ClientTable::new(limit, CLIENTS, SEED).relenting()
}

/// `CLOCK_MONOTONIC`, the time both tables count in.
fn mono() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

/// Verdicts as counted here: answered, KoD, dropped.
fn slot(v: Verdict) -> usize {
    match v {
        Verdict::Answer => 0,
        Verdict::Kod => 1,
        Verdict::Drop => 2,
    }
}

/// Runs `request` through the limiting program `p`: a reply is checked in full against the
/// socket path's for `state` as chimed's worker finishes it for `limit` (`suggest_poll`, and
/// `kiss_of_death` for a KoD RATE); a drop must be `XDP_DROP`. Returns the verdict.
fn limited_run(p: &XdpProgram, request: &[u8], state: &ServerState, limit: RateLimit) -> Verdict {
    let before = program_clock();
    let run = p.run(request).unwrap();
    let after = program_clock();
    match run.outcome {
        Outcome::Drop => return Verdict::Drop,
        Outcome::Tx => {}
        other => panic!("neither answered nor dropped: {other:?}"),
    }
    let v6 = request[12..14] == [0x86, 0xdd];
    let at = payload_at(v6);
    let kod = run.frame[at + 12..at + 16] == *b"RATE";
    let finish = |out: &mut [u8; 48]| {
        if kod {
            chime_ntp::kiss_of_death(out, *b"RATE");
        }
        chime_ntp::suggest_poll(out, limit.interval());
    };
    check_reply_as(
        request,
        &run.frame,
        state,
        &policy(),
        (before, after),
        &finish,
    );
    if kod { Verdict::Kod } else { Verdict::Answer }
}

/// `p`'s counts, by name, those that are not zero.
fn named_counts(p: &XdpProgram) -> Vec<(&'static str, u64)> {
    (p.counts().unwrap().into_iter())
        .filter(|&(_, n)| n > 0)
        .map(|(o, n)| (o.name(), n))
        .collect()
}

/// `got` within `sds` standard deviations of `n` draws at probability `p`.
fn within_sd(what: &str, got: usize, n: usize, p: f64, sds: f64) {
    let (n, expect) = (n as f64, n as f64 * p);
    let sd = (n * p * (1.0 - p)).sqrt();
    assert!(
        (got as f64 - expect).abs() < sds * sd,
        "{what}: {got}, expected {expect:.0} ± {:.0}",
        sds * sd
    );
}

#[test]
fn a_flooding_address_is_limited_in_the_driver_as_by_chime_ntps_table() {
    // One response per 4096 s, a burst of 5; over the limit one in 4 leaked, half of the rest a
    // KoD: of the requests over the limit 1/4 answered, 3/8 KoD, 3/8 dropped.
    let limit = RateLimit::new(12, 5, 2, 1).unwrap();
    let state = synced(1.0, ServedClock::LOCAL);
    let p = limited(&state, limit);
    let t = table(limit);
    let mut coin = Coin::new(7);
    let flooder = IpAddr::V4(CLIENT_V4);
    let req = request_from(flooder);
    for i in 0..5 {
        let now = mono();
        assert_eq!(
            limited_run(&p, &req, &state, limit),
            Verdict::Answer,
            "request {i} of the burst, in the driver"
        );
        assert_eq!(t.check(flooder, now, &mut coin), Verdict::Answer);
    }
    // The flood: both tables see the same arrival times, so whatever the retry heuristic makes
    // of a pause between two requests, it makes of it in both.
    const N: usize = 4000;
    let (mut driver, mut user) = ([0usize; 3], [0usize; 3]);
    for _ in 0..N {
        let now = mono();
        driver[slot(limited_run(&p, &req, &state, limit))] += 1;
        user[slot(t.check(flooder, now, &mut coin))] += 1;
    }
    eprintln!("over the limit: in the driver {driver:?}, chime-ntp's table {user:?}");
    for (i, (what, share)) in [("answered", 0.25), ("kod", 0.375), ("dropped", 0.375)]
        .into_iter()
        .enumerate()
    {
        within_sd(&format!("{what} in the driver"), driver[i], N, share, 6.0);
        within_sd(&format!("{what} by chime-ntp"), user[i], N, share, 6.0);
        let sd = (N as f64 * share * (1.0 - share)).sqrt();
        assert!(
            (driver[i] as f64 - user[i] as f64).abs() < 5.0 * sd * 2f64.sqrt(),
            "{what}: {} in the driver, {} by chime-ntp",
            driver[i],
            user[i]
        );
    }
    // Other addresses start with their own burst.
    for other in [
        IpAddr::V4(Ipv4Addr::new(198, 51, 100, 8)),
        IpAddr::V6(CLIENT_V6),
    ] {
        for i in 0..5 {
            assert_eq!(
                limited_run(&p, &request_from(other), &state, limit),
                Verdict::Answer,
                "{other}'s request {i}"
            );
        }
    }
    let answered = (5 + driver[0] + 10) as u64;
    assert_eq!(
        named_counts(&p),
        [
            ("answered", answered),
            ("kod", driver[1] as u64),
            ("rate_limited", driver[2] as u64)
        ]
    );
    // Each address is filed where chime-ntp's table files it: in the set its hash's top bits
    // pick, under its hash with the lowest bit set.
    for ip in [flooder, IpAddr::V6(CLIENT_V6)] {
        let h = chime_ntp::address_hash(ip, SEED);
        let set = ((h >> 40) as usize & (CLIENTS / 4 - 1)) as u32;
        let slots = p.driver_maps().client_set(set).unwrap();
        assert!(
            slots.iter().any(|s| s[0] == h | 1),
            "{ip} not in set {set}: {slots:x?}"
        );
    }
}

#[test]
fn the_burst_is_exactly_as_long_in_the_driver_as_in_chime_ntps_table() {
    // 256 addresses, each sends its burst of 3 and one more: the burst is always answered, and
    // the request after it only when leaked (one in 4), in both tables.
    let limit = RateLimit::new(12, 3, 2, 0).unwrap();
    let state = synced(1.0, ServedClock::LOCAL);
    let p = limited(&state, limit);
    let t = table(limit);
    let mut coin = Coin::new(9);
    let (mut driver, mut user) = (0, 0);
    for k in 0..=255u8 {
        let ip = IpAddr::V4(Ipv4Addr::new(203, 0, 113, k));
        let req = request_from(ip);
        for i in 0..3 {
            let now = mono();
            assert_eq!(
                limited_run(&p, &req, &state, limit),
                Verdict::Answer,
                "{ip}: request {i} of the burst"
            );
            assert_eq!(t.check(ip, now, &mut coin), Verdict::Answer);
        }
        let now = mono();
        driver += usize::from(limited_run(&p, &req, &state, limit) == Verdict::Answer);
        user += usize::from(t.check(ip, now, &mut coin) == Verdict::Answer);
    }
    eprintln!("the request after the burst answered: {driver} in the driver, {user} by chime-ntp");
    within_sd("leaked in the driver", driver, 256, 0.25, 5.0);
    within_sd("leaked by chime-ntp", user, 256, 0.25, 5.0);
    assert_eq!(
        named_counts(&p),
        [
            ("answered", (3 * 256 + driver) as u64),
            ("rate_limited", (256 - driver) as u64)
        ]
    );
}

/// A client that waits `answered` after a reply and `dropped` after a drop, against `check`,
/// for `run` from `start`: the share of its requests answered, and how many it sent.
fn retrying(
    mut check: impl FnMut(u64) -> Verdict,
    (answered, dropped): (u64, u64),
    (start, run): (u64, u64),
    mut wait: impl FnMut(u64) -> u64,
) -> (f64, u64) {
    let (mut now, mut sent, mut ok) = (start, 0u64, 0u64);
    while now < start + run {
        sent += 1;
        now = wait(if check(now) == Verdict::Drop {
            dropped
        } else {
            ok += 1;
            answered
        });
    }
    (ok as f64 / sent as f64, sent)
}

#[test]
fn a_client_that_retries_faster_when_dropped_is_mostly_answered_in_the_driver_too() {
    // chime-ntp's own case a thousand times faster: one response per 62.5 ms, burst 1, leak 2; the
    // client waits 16 ms when answered and 2 ms when not, for 2 s of real time in the driver and
    // of simulated time in chime-ntp's tables.
    const MS: u64 = 1_000_000;
    let limit = RateLimit::new(-4, 1, 2, 0).unwrap();
    let state = synced(1.0, ServedClock::LOCAL);
    let p = limited(&state, limit);
    let req = request_from(IpAddr::V4(CLIENT_V4));
    let pace = (16 * MS, 2 * MS);
    let (driver, sent) = retrying(
        |_| limited_run(&p, &req, &state, limit),
        pace,
        (mono(), 2000 * MS),
        |ns| {
            std::thread::sleep(Duration::from_nanos(ns));
            mono()
        },
    );
    let simulated = |t: ClientTable| {
        let mut coin = Coin::new(21);
        let ip = IpAddr::V4(CLIENT_V4);
        let mut now = 0;
        retrying(
            |at| t.check(ip, at, &mut coin),
            pace,
            (1_000 * MS, 2000 * MS),
            |ns| {
                now += ns;
                1_000 * MS + now
            },
        )
    };
    let (relenting, relenting_sent) = simulated(table(limit));
    let (plain, plain_sent) = simulated(ClientTable::new(limit, CLIENTS, SEED));
    eprintln!(
        "answered: {driver:.2} of {sent} in the driver, {relenting:.2} of {relenting_sent} by \
         chime-ntp's table as chimed's workers use it, {plain:.2} of {plain_sent} without the \
         retry heuristic"
    );
    assert!(plain < 0.4, "without the heuristic: {plain}");
    assert!(relenting > 0.6, "chime-ntp relenting: {relenting}");
    assert!(driver > 0.6, "in the driver: {driver} of {sent}");
}

#[test]
fn with_the_limits_off_nothing_is_limited_and_the_poll_is_the_requests() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = limited(&state, RateLimit::new(12, 1, 4, 4).unwrap());
    p.driver_maps().set_limits(&DriverLimits::OFF).unwrap();
    let req = request_from(IpAddr::V4(CLIENT_V4));
    for _ in 0..100 {
        let run = p.run(&req).unwrap();
        assert_eq!(run.outcome, Outcome::Tx);
        assert_eq!(run.frame[payload_at(false) + 2], 6, "the request's poll");
        assert_ne!(&run.frame[payload_at(false) + 12..][..4], b"RATE");
    }
    assert_eq!(named_counts(&p), [("answered", 100)]);
    // On again (what a reload does): the client's saved responses are kept, here none.
    let limit = RateLimit::new(12, 1, 4, 0).unwrap();
    let l = DriverLimits::new(limit.interval(), limit.burst(), limit.leak(), limit.kod());
    p.driver_maps().set_limits(&l).unwrap();
    let fates: Vec<Verdict> = (0..64)
        .map(|_| limited_run(&p, &req, &state, limit))
        .collect();
    let answered = fates.iter().filter(|&&v| v == Verdict::Answer).count();
    assert!(
        answered < 20,
        "{answered} of 64 answered with the limits on"
    );
}

#[test]
fn the_rules_come_before_the_rate_limit() {
    // A denied source's requests are dropped as denied and spend nothing of its burst: once the
    // rules are gone, its first two requests are answered, where a source that had sent ten
    // over a burst of 2 would get one in 16.
    let limit = RateLimit::new(12, 2, 4, 0).unwrap();
    let state = synced(1.0, ServedClock::LOCAL);
    let p = limited(&state, limit);
    let source: IpAddr = "198.51.100.9".parse().unwrap();
    p.set_access(&rules(&[], &["198.51.100.9/32"])).unwrap();
    let req = request_from(source);
    for i in 0..10 {
        assert_eq!(p.run(&req).unwrap().outcome, Outcome::Drop, "request {i}");
    }
    p.set_access(&[]).unwrap();
    for i in 0..2 {
        assert_eq!(
            limited_run(&p, &req, &state, limit),
            Verdict::Answer,
            "request {i} of the burst, after the rules"
        );
    }
    assert_eq!(named_counts(&p), [("answered", 2), ("denied", 10)]);
}

#[test]
fn in_timezone_offset_mode_the_times_are_shifted_as_by_chime_ntps_zone() {
    // Seconds from 1900 to 1970, to give chime-ntp's zone (which counts Unix seconds) the change.
    const NTP_UNIX: i64 = 2_208_988_800;
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    let now = (program_clock().0 >> 32) as u32;
    // Kolkata's offset, no change; a change to come; one just past; a zone west of Greenwich
    // whose change is as far ahead as a wrapping second can say.
    let cases = [
        DriverZone {
            offset: 19_800,
            change: None,
        },
        DriverZone {
            offset: 3600,
            change: Some((now.wrapping_add(1000), 7200)),
        },
        DriverZone {
            offset: 3600,
            change: Some((now.wrapping_sub(10), 7200)),
        },
        DriverZone {
            offset: -18_000,
            change: Some((now.wrapping_add(i32::MAX as u32), -14_400)),
        },
    ];
    for zone in cases {
        let mut given = input(&state, &policy());
        given.zone = Some(zone);
        p.answering.set_state(&DriverState::new(&given)).unwrap();
        // The same zone as chime-ntp's worker shifts by: the offset at each Unix second, the
        // change's second read as the one within 2^31 s of now.
        let now_unix = i64::from(now) - NTP_UNIX;
        let shift = ZoneShift::new(|unix: i64| match zone.change {
            Some((at, after)) if unix >= now_unix + i64::from(at.wrapping_sub(now) as i32) => after,
            _ => zone.offset,
        });
        let before = program_clock();
        let run = p.answering.run(&request(false, 4, 0)).unwrap();
        let after = program_clock();
        assert_eq!(run.outcome, Outcome::Tx, "{zone:?}");
        let ntp = &run.frame[payload_at(false)..];
        let (low, high) = (
            shift.apply(before, now_unix).0,
            shift.apply(after, now_unix).0,
        );
        for (what, at) in [("receive", 32), ("transmit", 40)] {
            let t = u64::from_be_bytes(ntp[at..at + 8].try_into().unwrap());
            assert!(
                (low & !1..=high | 1).contains(&t),
                "{what} under {zone:?}: {t:#x} not in {low:#x}..={high:#x}"
            );
        }
    }
    // Without the zone, nothing is shifted.
    p.answering
        .set_state(&DriverState::new(&input(&state, &policy())))
        .unwrap();
    let before = program_clock();
    let run = p.answering.run(&request(false, 4, 0)).unwrap();
    let t = u64::from_be_bytes(run.frame[payload_at(false) + 40..][..8].try_into().unwrap());
    assert!((before.0 & !1..=program_clock().0).contains(&t));
}

#[test]
fn within_a_leap_smears_window_every_request_goes_to_the_workers() {
    let state = synced(1.0, ServedClock::LOCAL);
    let p = loaded(&state);
    let now = program_clock().0;
    let minute = 60 << 32;
    // Open now, and past or still to come: only the first hands the request on.
    for (from, until, answered) in [
        (now - minute, now + minute, false),
        (now - 2 * minute, now - minute, true),
        (now + minute, now + 2 * minute, true),
    ] {
        let mut given = input(&state, &policy());
        given.smear = Some((from, until));
        p.answering.set_state(&DriverState::new(&given)).unwrap();
        let req = request(false, 4, 0);
        match run(&p, &req, &state, &policy()) {
            Ok(_) => assert!(answered, "answered within the window"),
            Err(outcome) => {
                assert!(!answered, "handed on outside the window");
                assert_eq!(outcome, Outcome::Socket);
            }
        }
    }
    assert_eq!(counts(&p), [("answered", 2), ("off", 1)]);
}
