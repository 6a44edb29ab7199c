//! Known answers from a real chronyd 4.3: the request/response pairs in testdata/chronyd-4.3/,
//! captured as testdata/README.md describes, checked in both directions. Our parser reads chronyd's
//! replies, our encoder reproduces them byte for byte, our responder given chronyd's requests
//! answers what chronyd answered (up to the transmit timestamp) and drops what chronyd dropped, and
//! our mirror takes chronyd's replies to the very request it makes.

use std::net::SocketAddr;
use std::time::Duration;

use chime_ntp::{
    DropReason, Header, Leap, Mirror, Mode, NtpShort, NtpTimestamp, ServedHeader, ServerState,
    respond,
};

/// The request and, if chronyd answered, the response of one captured case.
macro_rules! case {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!("../testdata/chronyd-4.3/", $name, ".request.bin")) as &[u8],
        )
    };
}

macro_rules! answered {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!("../testdata/chronyd-4.3/", $name, ".request.bin")) as &[u8],
            include_bytes!(concat!("../testdata/chronyd-4.3/", $name, ".response.bin")) as &[u8],
        )
    };
}

/// Cases chronyd answered, with the chronyd that answered them synchronised to its local clock
/// (`local stratum 3`) or unsynchronised.
const ANSWERED: [(&str, &[u8], &[u8]); 12] = [
    answered!("v4-client"),
    answered!("v4-client-unsync-leap"),
    answered!("v3-client"),
    answered!("v2-client"),
    answered!("v1-mode0"),
    answered!("v4-symmetric-active"),
    answered!("v3-symmetric-active"),
    answered!("v4-unknown-ef"),
    answered!("v4-two-efs"),
    answered!("mirror-request"),
    answered!("unsync-v4-client"),
    answered!("unsync-mirror-request"),
];

/// The captures' client used an ephemeral source port.
const EPHEMERAL_PORT: u16 = 40_000;

fn parse(bytes: &[u8]) -> Header {
    Header::parse(bytes).expect("a captured packet holds a header")
}

fn served_from(reply: &Header) -> ServedHeader {
    ServedHeader {
        leap: reply.leap,
        stratum: reply.stratum,
        precision: reply.precision,
        reference_id: reply.reference_id,
        reference_ts: reply.reference_ts,
        root_delay: reply.root_delay,
        root_dispersion: reply.root_dispersion,
    }
}

#[test]
fn parser_reads_chronyds_reply_field_by_field() {
    let (_, request, response) = ANSWERED[0];
    assert_eq!(response.len(), 48);
    let reply = parse(response);
    assert_eq!(reply.leap, Leap::NoWarning);
    assert_eq!(reply.version, 4);
    assert_eq!(reply.mode, Mode::Server);
    assert_eq!(reply.stratum, 3);
    assert_eq!(reply.poll, 6);
    assert_eq!(reply.precision, -25);
    assert_eq!(reply.root_delay, NtpShort(0));
    assert_eq!(reply.root_dispersion, NtpShort(0));
    // chronyd's `local` reference: 127.127.1.1.
    assert_eq!(reply.reference_id, [0x7F, 0x7F, 0x01, 0x01]);
    assert_eq!(reply.reference_ts, NtpTimestamp(0xEEAC_6C47_24A8_0B7B));
    assert_eq!(reply.origin_ts, parse(request).transmit_ts);
    assert_eq!(reply.receive_ts, NtpTimestamp(0xEEAC_6C48_F557_519F));
    assert_eq!(reply.transmit_ts, NtpTimestamp(0xEEAC_6C48_F55E_B28C));
    // 2026-11-21 19:15:20 UTC, when it was captured.
    assert_eq!(
        reply.receive_ts.to_unix_near(1_800_000_000).0,
        1_795_288_520
    );
}

#[test]
fn parser_reads_chronyds_unsynchronised_reply() {
    let (_, _, response) = answered!("unsync-v4-client");
    let reply = parse(response);
    assert_eq!(reply.leap, Leap::Unsynchronised);
    assert_eq!((reply.version, reply.mode), (4, Mode::Server));
    assert_eq!(reply.stratum, 0);
    assert_eq!(reply.reference_id, [0; 4]);
    assert_eq!(reply.reference_ts, NtpTimestamp::ZERO);
    assert_eq!(reply.root_delay, NtpShort(0x0001_0000));
    assert_eq!(reply.root_dispersion, NtpShort(0x0001_0000));
    // Our unsynchronised header is chronyd's.
    assert_eq!(
        served_from(&reply),
        ServedHeader::unsynchronised(reply.precision)
    );
}

#[test]
fn encoder_reproduces_chronyds_replies_byte_for_byte() {
    for (name, _, response) in ANSWERED {
        let mut out = [0; 48];
        parse(response).encode(&mut out);
        assert_eq!(&out[..], response, "{name}");
    }
}

#[test]
fn responder_answers_as_chronyd_did() {
    for (name, request, response) in ANSWERED {
        let chronyd = parse(response);
        let mut reply = vec![0; request.len()];
        let len = respond(
            request,
            EPHEMERAL_PORT,
            chronyd.receive_ts,
            &served_from(&chronyd),
            &mut reply,
        )
        .unwrap_or_else(|drop| panic!("{name}: dropped ({drop}) but chronyd answered"));
        assert_eq!(len, response.len(), "{name}");
        // Everything but the transmit timestamp, which chronyd reads after building the reply.
        assert_eq!(&reply[..40], &response[..40], "{name}");
        // Provisionally the receive time, without the receive mark.
        assert_eq!(
            parse(&reply).transmit_ts.0,
            chronyd.receive_ts.0 & !1,
            "{name}"
        );
        // chronyd marks its timestamps for interleaved mode as we do: receive odd, transmit even.
        assert_eq!(
            chronyd.receive_ts.0 & 1,
            1,
            "{name}: chronyd's receive mark"
        );
        assert_eq!(
            chronyd.transmit_ts.0 & 1,
            0,
            "{name}: chronyd's transmit mark"
        );
    }
}

#[test]
fn responder_drops_what_chronyd_dropped() {
    let dropped = [
        (
            case!("drop-v1-mode0-port123"),
            123,
            DropReason::V1SymmetricActive,
        ),
        (
            case!("drop-v0-client"),
            EPHEMERAL_PORT,
            DropReason::BadVersion(0),
        ),
        (
            case!("drop-v5-client"),
            EPHEMERAL_PORT,
            DropReason::BadVersion(5),
        ),
        (
            case!("drop-v2-mode0"),
            EPHEMERAL_PORT,
            DropReason::UnsupportedMode(Mode::Reserved),
        ),
        (
            case!("drop-v4-passive"),
            EPHEMERAL_PORT,
            DropReason::UnsupportedMode(Mode::SymmetricPassive),
        ),
        (
            case!("drop-v4-server"),
            EPHEMERAL_PORT,
            DropReason::UnsupportedMode(Mode::Server),
        ),
        (
            case!("drop-v4-broadcast"),
            EPHEMERAL_PORT,
            DropReason::UnsupportedMode(Mode::Broadcast),
        ),
        (
            case!("drop-v2-control"),
            EPHEMERAL_PORT,
            DropReason::UnsupportedMode(Mode::Control),
        ),
        (
            case!("drop-v2-private"),
            EPHEMERAL_PORT,
            DropReason::UnsupportedMode(Mode::Private),
        ),
        (case!("drop-short-47"), EPHEMERAL_PORT, DropReason::TooShort),
        (
            case!("drop-length-50"),
            EPHEMERAL_PORT,
            DropReason::BadLength,
        ),
        (
            case!("drop-ef-length-12"),
            EPHEMERAL_PORT,
            DropReason::BadExtension,
        ),
        (
            case!("drop-ef-overrun"),
            EPHEMERAL_PORT,
            DropReason::BadExtension,
        ),
        (
            case!("drop-ef-last-16"),
            EPHEMERAL_PORT,
            DropReason::BadExtension,
        ),
    ];
    let served = ServedHeader::unsynchronised(-25);
    for ((name, request), port, expected) in dropped {
        let mut reply = vec![0; request.len()];
        let result = respond(request, port, NtpTimestamp(1), &served, &mut reply);
        assert_eq!(result, Err(expected), "{name}");
    }
}

/// chronyd drops requests with a MAC whose key it does not have; chime has no keys and answers
/// them unauthenticated, as rsntp does (a deliberate difference, see `respond`).
#[test]
fn responder_answers_mac_requests_that_chronyd_dropped() {
    let served = ServedHeader::unsynchronised(-25);
    for (name, request) in [
        case!("mac-v4-md5"),
        case!("mac-v3-sha1"),
        case!("mac-v4-ef-and-sha1"),
    ] {
        let mut reply = vec![0; request.len()];
        let result = respond(
            request,
            EPHEMERAL_PORT,
            NtpTimestamp(1),
            &served,
            &mut reply,
        );
        assert_eq!(result, Ok(48), "{name}");
    }
}

fn upstream() -> SocketAddr {
    "127.0.0.1:11123".parse().unwrap()
}

/// Feeds chronyd's reply to a mirror that made the captured request, at plausible local times.
fn mirror_of(response: &[u8]) -> (Mirror, Result<(), chime_ntp::MirrorError>, NtpTimestamp) {
    let (_, request, _) = answered!("mirror-request");
    let chronyd = parse(response);
    let sent = chronyd.receive_ts.sub_duration(Duration::from_micros(20));
    let now = chronyd.transmit_ts.add_duration(Duration::from_micros(20));
    let mut mirror = Mirror::new(upstream());
    assert_eq!(mirror.request(sent, 0x0123_4567_89AB_CDEF), request);
    let result = mirror.on_reply(upstream(), response, now);
    (mirror, result, now)
}

#[test]
fn mirror_takes_chronyds_reply_to_its_request() {
    let (_, _, response) = answered!("mirror-request");
    let (mirror, result, now) = mirror_of(response);
    assert_eq!(result, Ok(()));
    assert_eq!(
        mirror.state(),
        ServerState {
            leap: Leap::NoWarning,
            stratum: 3,
            precision: -25,
            reference_id: [0x7F, 0x7F, 0x01, 0x01],
            reference_ts: NtpTimestamp(0xEEAC_6C47_24A8_0B7B),
            root_delay: NtpShort(0),
            root_dispersion: NtpShort(0),
            updated: Some(now),
            clock: mirror.state().clock,
            announced: None,
            tai_offset: None,
            leap_step: chime_ntp::LeapStep::NONE,
        }
    );
    // Sent 20 µs before chronyd received it, answered 20 µs before now: no offset, known to
    // within half the 40 µs round trip.
    let clock = mirror.state().clock;
    assert!(clock.offset.abs() < 1e-9, "{clock:?}");
    assert!((clock.error - 20e-6).abs() < 1e-9, "{clock:?}");
}

#[test]
fn mirror_records_unsynchronised_chronyd() {
    let (_, _, response) = answered!("unsync-mirror-request");
    let (mirror, result, now) = mirror_of(response);
    assert_eq!(result, Ok(()));
    let state = mirror.state();
    assert!(!state.is_synchronised());
    assert_eq!(state.updated, Some(now));
    assert_eq!(
        state.served_at(now, &Default::default()),
        served_from(&parse(response)),
        "we serve what chronyd served"
    );
}
