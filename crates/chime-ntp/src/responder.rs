//! The per-packet server: classify a request, and either write the reply or say why not.
//!
//! A worker calls [`respond`] for each datagram of a batch with the kernel's receive timestamp and
//! the batch's [`ServedHeader`], then [`stamp_transmit`] just before the send. Nothing here
//! allocates, reads a clock or panics, whatever the bytes: the length is checked once and every
//! other read is at a fixed offset within the first 48 bytes.

use crate::interleave::RX_MARK;
use crate::packet::{
    Header, Leap, Mode, check_extensions, first_byte, is_mac_only, offset, version_of,
};
use crate::state::ServedHeader;
use crate::time::NtpTimestamp;

/// The NTP port. NTPv1 had no mode field, so servers since (ntpd, chronyd) take a v1 packet from
/// this port for a symmetric peer and one from any other port for a client.
const NTP_PORT: u16 = 123;

/// Answers one NTP request, or says why it is dropped.
///
/// Accepted, with the request's version (1–4) in the reply:
/// - mode 3 (client) gets mode 4 (server);
/// - mode 1 (symmetric active) gets mode 2 (symmetric passive), for old Windows clients;
/// - NTPv1 "mode 0" from a source port other than 123 gets mode 4. NTPv1 (RFC 1059) had no mode
///   field, and those bits were zero; implementations since tell a v1 client from a v1 peer by
///   the source port. chronyd 4.3 (`NCR_ProcessRxUnknown`: "don't ever respond with a mode 0
///   packet") and rsntp both answer it with mode 4, and so do we: the captured chronyd reply is a
///   known-answer test.
///
/// Dropped: fewer than 48 bytes, a length that is not a multiple of 4, version 0 or 5–7, every
/// other mode, and bytes after the header that are not well-formed: for NTPv4 extension fields
/// and an optional MAC ([`check_extensions`]); for NTPv1–v3 nothing or a 20- or 24-byte MAC.
/// Unknown but well-formed extension fields are ignored and the request is answered, as chronyd
/// does. A MAC is not verified and the reply carries none (chime has no keys, as rsntp); chronyd
/// without the key drops such requests instead.
///
/// The reply is the 48-byte header in `reply[..48]`; the length, 48, is returned. Its server-clock
/// fields come from `served`, the poll is the request's, origin is the request's transmit
/// timestamp, receive is `rx_time`, and transmit is provisionally `rx_time` too, to be overwritten
/// with [`stamp_transmit`] as late as possible. The lowest bit of the receive timestamp's fraction
/// is set and that of the transmit timestamp cleared (a quarter of a nanosecond, as chronyd does),
/// which is how a later request in interleaved mode is recognised ([`crate::interleaved_origin`]).
/// When `served` says unsynchronised the reply still
/// goes out (leap 3, stratum 0), so that clients learn it.
///
/// The caller passes a `reply` buffer no longer than `request` (typically the same length), so
/// that a reply can never be larger than its request: amplification is impossible by
/// construction. It is `debug_assert`ed when a reply is written; in any case no more than 48 bytes
/// are written, which an accepted request always has. `src_port` is the request's UDP source port.
pub fn respond(
    request: &[u8],
    src_port: u16,
    rx_time: NtpTimestamp,
    served: &ServedHeader,
    reply: &mut [u8],
) -> Result<usize, DropReason> {
    let Some((head, after_header)) = request.split_first_chunk::<{ Header::LEN }>() else {
        return Err(DropReason::TooShort);
    };
    if !request.len().is_multiple_of(4) {
        return Err(DropReason::BadLength);
    }
    let version = version_of(head[offset::LVM]);
    if !(1..=4).contains(&version) {
        return Err(DropReason::BadVersion(version));
    }
    let reply_mode = match Mode::from_first_byte(head[offset::LVM]) {
        Mode::Client => Mode::Server,
        Mode::SymmetricActive => Mode::SymmetricPassive,
        Mode::Reserved if version == 1 && src_port != NTP_PORT => Mode::Server,
        Mode::Reserved if version == 1 => return Err(DropReason::V1SymmetricActive),
        other => return Err(DropReason::UnsupportedMode(other)),
    };
    let well_formed = if version == 4 {
        check_extensions(after_header).is_ok()
    } else {
        is_mac_only(after_header)
    };
    if !well_formed {
        return Err(DropReason::BadExtension);
    }
    // Checked here rather than on entry, so that a caller that hands every datagram the same
    // 48-byte buffer is not tripped by requests that are dropped as too short anyway.
    debug_assert!(
        reply.len() <= request.len(),
        "reply buffer ({} bytes) longer than the request ({} bytes)",
        reply.len(),
        request.len()
    );
    let Some(out) = reply.first_chunk_mut::<{ Header::LEN }>() else {
        return Err(DropReason::ReplyBufferTooSmall);
    };

    out[offset::LVM] = first_byte(served.leap, version, reply_mode);
    out[offset::STRATUM] = served.stratum;
    out[offset::POLL] = head[offset::POLL];
    out[offset::PRECISION] = served.precision as u8;
    out[offset::ROOT_DELAY..offset::ROOT_DISPERSION].copy_from_slice(&served.root_delay.to_bits());
    out[offset::ROOT_DISPERSION..offset::REFERENCE_ID]
        .copy_from_slice(&served.root_dispersion.to_bits());
    out[offset::REFERENCE_ID..offset::REFERENCE_TS].copy_from_slice(&served.reference_id);
    out[offset::REFERENCE_TS..offset::ORIGIN_TS].copy_from_slice(&served.reference_ts.to_bits());
    out[offset::ORIGIN_TS..offset::RECEIVE_TS]
        .copy_from_slice(&head[offset::TRANSMIT_TS..Header::LEN]);
    // The interleaved-mode marks (see `crate::interleave`): receive odd, transmit even.
    let receive = NtpTimestamp(rx_time.0 | RX_MARK);
    let transmit = NtpTimestamp(rx_time.0 & !RX_MARK);
    out[offset::RECEIVE_TS..offset::TRANSMIT_TS].copy_from_slice(&receive.to_bits());
    out[offset::TRANSMIT_TS..Header::LEN].copy_from_slice(&transmit.to_bits());
    Ok(Header::LEN)
}

/// Writes the transmit timestamp (T3) into a reply made by [`respond`], at the last moment before
/// the send. A buffer shorter than a header is left alone (and is a bug, `debug_assert`ed): the
/// hot path does not panic.
pub fn stamp_transmit(reply: &mut [u8], t3: NtpTimestamp) {
    debug_assert!(
        reply.len() >= Header::LEN,
        "stamping a {}-byte reply",
        reply.len()
    );
    if let Some(slot) = reply.get_mut(offset::TRANSMIT_TS..Header::LEN) {
        slot.copy_from_slice(&NtpTimestamp(t3.0 & !RX_MARK).to_bits());
    }
}

/// Turns a reply made by [`respond`] into a Kiss-o'-Death (RFC 5905 §7.4) with the four-letter
/// `code`: leap 3 (alarm), stratum 0, the code as reference ID; the version, mode and every
/// timestamp stay, so the client can match it to its request by the origin timestamp, as a
/// chronyd client checks before it believes a kiss. Only `RATE` is sent today (see
/// [`crate::ClientTable`]). A buffer shorter than a header is left alone.
pub fn kiss_of_death(reply: &mut [u8], code: [u8; 4]) {
    if let Some(out) = reply.first_chunk_mut::<{ Header::LEN }>() {
        out[offset::LVM] = (out[offset::LVM] & 0x3f) | (Leap::Unsynchronised as u8) << 6;
        out[offset::STRATUM] = 0;
        out[offset::REFERENCE_ID..offset::REFERENCE_TS].copy_from_slice(&code);
    }
}

/// Raises a reply's poll exponent to at least `min_poll`: with rate limiting on, every reply tells
/// a client that polls faster than the limit's interval the interval it should use, as chronyd
/// does. A buffer shorter than a header is left alone.
pub fn suggest_poll(reply: &mut [u8], min_poll: i8) {
    if let Some(poll) = reply.get_mut(offset::POLL) {
        *poll = (*poll as i8).max(min_poll) as u8;
    }
}

/// Why a datagram got no reply. Every variant is counted by the caller: [`DropReason::index`]
/// gives a dense slot for a per-thread counter array and [`DropReason::label`] a label for logs
/// and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum DropReason {
    /// Shorter than the 48-byte header.
    #[error("shorter than the 48-byte NTP header")]
    TooShort,
    /// Length not a multiple of 4 (NTP is made of 32-bit words; chronyd drops these too).
    #[error("length not a multiple of 4")]
    BadLength,
    /// Version 0 or 5–7.
    #[error("unsupported NTP version {0}")]
    BadVersion(u8),
    /// A mode that is not a request to us: 0 (NTPv2–v4), 2, 4, 5, 6 and 7. [`respond`] never
    /// produces it for modes 1 and 3; they have counter slots so that [`DropReason::index`] is
    /// total.
    #[error("unsupported NTP mode {0:?}")]
    UnsupportedMode(Mode),
    /// An NTPv1 packet (no mode field) from source port 123: an NTPv1 symmetric peer, which
    /// chronyd and rsntp do not answer either.
    #[error("NTPv1 symmetric peer (mode 0 from port 123)")]
    V1SymmetricActive,
    /// Bytes after the header are not well-formed extension fields and MAC (NTPv4) or not a MAC
    /// (NTPv1–v3).
    #[error("malformed extension fields or MAC")]
    BadExtension,
    /// The datagram was larger than the receive buffer. [`respond`] never returns it; it is here
    /// so that a caller that sees `MSG_TRUNC` counts it with the rest rather than answering a
    /// request it has not seen whole.
    #[error("truncated by the receive buffer")]
    Truncated,
    /// The caller's reply buffer is shorter than the reply (48 bytes; an NTPv5 reply is as long
    /// as its request): a caller bug, counted rather than panicked on.
    #[error("reply buffer shorter than the reply")]
    ReplyBufferTooSmall,
    /// An NTPv5 request without a Draft Identification naming a draft [`crate::v5::Draft`]
    /// knows, exactly: the drafts differ, so an unknown one is not guessed at.
    #[error("NTPv5 request naming no draft this server speaks")]
    UnknownDraft,
}

impl DropReason {
    /// The number of counter slots: [`DropReason::index`] is always below it.
    pub const COUNT: usize = 16;

    /// The label of each slot, in [`DropReason::index`] order (a reason may carry data, so the
    /// slots are listed by label rather than as values).
    pub const LABELS: [&'static str; Self::COUNT] = [
        "too_short",
        "bad_length",
        "bad_version",
        "mode_reserved",
        "mode_symmetric_active",
        "mode_symmetric_passive",
        "mode_client",
        "mode_server",
        "mode_broadcast",
        "mode_control",
        "mode_private",
        "v1_symmetric_active",
        "bad_extension",
        "truncated",
        "reply_buffer_too_small",
        "unknown_draft",
    ];

    /// A dense index in `0..DropReason::COUNT`, for per-thread counter arrays. Each unsupported
    /// mode has its own slot, so that ntpq (6) and ntpdc/monlist (7) probes can be told apart.
    pub const fn index(self) -> usize {
        match self {
            Self::TooShort => 0,
            Self::BadLength => 1,
            Self::BadVersion(_) => 2,
            Self::UnsupportedMode(mode) => 3 + mode as usize,
            Self::V1SymmetricActive => 11,
            Self::BadExtension => 12,
            Self::Truncated => 13,
            Self::ReplyBufferTooSmall => 14,
            Self::UnknownDraft => 15,
        }
    }

    /// A short snake_case label for logs and metrics.
    pub const fn label(self) -> &'static str {
        Self::LABELS[self.index()]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::packet::Leap;
    use crate::time::NtpShort;
    use proptest::prelude::*;

    const RX: NtpTimestamp = NtpTimestamp(0xEEAC_6C48_F557_519F);
    const CLIENT_TX: [u8; 8] = [0xA3, 0x2A, 0xB2, 0x71, 0xE6, 0xB7, 0x2D, 0x57];

    /// A synchronised stratum-2 header with every field distinct, for the tests of this crate.
    pub(crate) fn served() -> ServedHeader {
        ServedHeader {
            leap: Leap::NoWarning,
            stratum: 2,
            precision: -25,
            reference_id: [192, 0, 2, 1],
            reference_ts: NtpTimestamp(0xEEAC_6C47_24A8_0B7B),
            root_delay: NtpShort(0x0000_0123),
            root_dispersion: NtpShort(0x0000_0456),
        }
    }

    /// A request with the given first-byte fields and busy other fields that must not be echoed.
    fn request(version: u8, mode: u8) -> Vec<u8> {
        let mut r = vec![0x5A; 48];
        r[0] = 0xC0 | (version << 3) | mode;
        r[2] = 6;
        r[40..48].copy_from_slice(&CLIENT_TX);
        r
    }

    fn answer(request: &[u8], src_port: u16) -> Result<Header, DropReason> {
        let mut reply = vec![0xEE; request.len()];
        let len = respond(request, src_port, RX, &served(), &mut reply)?;
        assert_eq!(len, 48);
        assert!(
            reply[48..].iter().all(|&b| b == 0xEE),
            "wrote past the reply"
        );
        Ok(Header::parse(&reply).unwrap())
    }

    fn expected(version: u8, mode: Mode) -> Header {
        Header {
            leap: Leap::NoWarning,
            version,
            mode,
            stratum: 2,
            poll: 6,
            precision: -25,
            root_delay: NtpShort(0x0000_0123),
            root_dispersion: NtpShort(0x0000_0456),
            reference_id: [192, 0, 2, 1],
            reference_ts: NtpTimestamp(0xEEAC_6C47_24A8_0B7B),
            origin_ts: NtpTimestamp::from_bits(CLIENT_TX),
            receive_ts: RX,
            // RX is odd: the transmit timestamp goes out with the lowest bit clear.
            transmit_ts: NtpTimestamp(RX.0 & !1),
        }
    }

    #[test]
    fn client_requests_of_every_version_get_server_replies() {
        for version in 1..=4 {
            assert_eq!(
                answer(&request(version, 3), 50_000),
                Ok(expected(version, Mode::Server))
            );
        }
    }

    #[test]
    fn kiss_of_death_keeps_version_mode_and_timestamps() {
        for version in 1..=4 {
            let req = request(version, 3);
            let mut reply = vec![0; 48];
            respond(&req, 50_000, RX, &served(), &mut reply).unwrap();
            kiss_of_death(&mut reply, *b"RATE");
            let kod = Header::parse(&reply).unwrap();
            let mut want = expected(version, Mode::Server);
            want.leap = Leap::Unsynchronised;
            want.stratum = 0;
            want.reference_id = *b"RATE";
            assert_eq!(kod, want);
        }
        let mut short = [0x11; 20];
        kiss_of_death(&mut short, *b"RATE");
        assert_eq!(short, [0x11; 20]);
    }

    #[test]
    fn suggest_poll_only_raises() {
        let mut reply = vec![0; 48];
        respond(&request(4, 3), 50_000, RX, &served(), &mut reply).unwrap();
        suggest_poll(&mut reply, 3); // the request said 6
        assert_eq!(reply[2], 6);
        suggest_poll(&mut reply, 10);
        assert_eq!(reply[2], 10);
        reply[2] = (-4i8) as u8; // a chronyd client with minpoll -4
        suggest_poll(&mut reply, -6);
        assert_eq!(reply[2] as i8, -4);
        suggest_poll(&mut reply, 0);
        assert_eq!(reply[2], 0);
    }

    #[test]
    fn symmetric_active_gets_symmetric_passive() {
        for version in 1..=4 {
            let reply = answer(&request(version, 1), 123);
            assert_eq!(reply, Ok(expected(version, Mode::SymmetricPassive)));
        }
    }

    #[test]
    fn v1_mode_0_is_a_client_unless_from_port_123() {
        assert_eq!(answer(&request(1, 0), 1023), Ok(expected(1, Mode::Server)));
        assert_eq!(answer(&request(1, 0), 124), Ok(expected(1, Mode::Server)));
        assert_eq!(
            answer(&request(1, 0), 123),
            Err(DropReason::V1SymmetricActive)
        );
    }

    #[test]
    fn other_modes_are_dropped() {
        for version in 2..=4 {
            assert_eq!(
                answer(&request(version, 0), 50_000),
                Err(DropReason::UnsupportedMode(Mode::Reserved))
            );
        }
        for (mode, expected) in [
            (2, Mode::SymmetricPassive),
            (4, Mode::Server),
            (5, Mode::Broadcast),
            (6, Mode::Control),
            (7, Mode::Private),
        ] {
            for version in 1..=4 {
                assert_eq!(
                    answer(&request(version, mode), 50_000),
                    Err(DropReason::UnsupportedMode(expected))
                );
            }
        }
    }

    #[test]
    fn bad_versions_and_lengths_are_dropped() {
        for version in [0, 5, 6, 7] {
            assert_eq!(
                answer(&request(version, 3), 50_000),
                Err(DropReason::BadVersion(version))
            );
        }
        let full = request(4, 3);
        assert_eq!(answer(&full[..47], 50_000), Err(DropReason::TooShort));
        assert_eq!(answer(&[], 50_000), Err(DropReason::TooShort));
        assert_eq!(
            answer(&[full.clone(), vec![0; 2]].concat(), 50_000),
            Err(DropReason::BadLength)
        );
        assert_eq!(
            answer(&[full, vec![0; 1]].concat(), 50_000),
            Err(DropReason::BadLength)
        );
    }

    fn ef(kind: u16, len: u16) -> Vec<u8> {
        let mut v = vec![0; usize::from(len)];
        v[..2].copy_from_slice(&kind.to_be_bytes());
        v[2..4].copy_from_slice(&len.to_be_bytes());
        v
    }

    #[test]
    fn v4_extension_fields_are_walked() {
        let v4 = request(4, 3);
        let ok = expected(4, Mode::Server);
        // Unknown but well-formed: answered, 48 bytes.
        assert_eq!(
            answer(&[v4.clone(), ef(0x7A7A, 28)].concat(), 50_000),
            Ok(ok)
        );
        assert_eq!(
            answer(
                &[v4.clone(), ef(0x0104, 36), ef(0x0404, 40)].concat(),
                50_000
            ),
            Ok(ok)
        );
        // A MAC alone or after fields: answered (unauthenticated).
        assert_eq!(answer(&[v4.clone(), vec![0; 20]].concat(), 50_000), Ok(ok));
        assert_eq!(
            answer(&[v4.clone(), ef(0x7A7A, 16), vec![0; 24]].concat(), 50_000),
            Ok(ok)
        );
        // Malformed: dropped.
        assert_eq!(
            answer(&[v4.clone(), ef(0x7A7A, 16)].concat(), 50_000),
            Err(DropReason::BadExtension)
        );
        assert_eq!(
            answer(
                &[v4.clone(), ef(0x7A7A, 12), ef(0x7A7A, 28)].concat(),
                50_000
            ),
            Err(DropReason::BadExtension)
        );
        assert_eq!(
            answer(&[v4.clone(), vec![0; 4]].concat(), 50_000),
            Err(DropReason::BadExtension)
        );
        let mut overrun = ef(0x7A7A, 28);
        overrun[3] = 32;
        assert_eq!(
            answer(&[v4, overrun].concat(), 50_000),
            Err(DropReason::BadExtension)
        );
    }

    #[test]
    fn older_versions_allow_only_a_mac() {
        for version in 1..=3 {
            let req = request(version, 3);
            let ok = Ok(expected(version, Mode::Server));
            assert_eq!(answer(&[req.clone(), vec![0; 20]].concat(), 50_000), ok);
            assert_eq!(answer(&[req.clone(), vec![0; 24]].concat(), 50_000), ok);
            assert_eq!(
                answer(&[req.clone(), ef(0x7A7A, 28)].concat(), 50_000),
                Err(DropReason::BadExtension)
            );
            assert_eq!(
                answer(&[req, vec![0; 12]].concat(), 50_000),
                Err(DropReason::BadExtension)
            );
        }
    }

    #[test]
    fn unsynchronised_state_is_still_served() {
        let mut reply = [0; 48];
        let unsync = ServedHeader::unsynchronised(-25);
        assert_eq!(
            respond(&request(4, 3), 50_000, RX, &unsync, &mut reply),
            Ok(48)
        );
        let h = Header::parse(&reply).unwrap();
        assert_eq!(
            (h.leap, h.stratum, h.reference_id),
            (Leap::Unsynchronised, 0, [0; 4])
        );
        assert_eq!(
            (h.root_delay, h.root_dispersion),
            (NtpShort(0x0001_0000), NtpShort(0x0001_0000))
        );
        assert_eq!(h.reference_ts, NtpTimestamp::ZERO);
    }

    #[test]
    fn transmit_is_stamped_late() {
        let mut reply = [0; 48];
        respond(&request(4, 3), 50_000, RX, &served(), &mut reply).unwrap();
        let t3 = NtpTimestamp(RX.0 + 0x1000);
        stamp_transmit(&mut reply, t3);
        let h = Header::parse(&reply).unwrap();
        assert_eq!((h.receive_ts, h.transmit_ts), (RX, NtpTimestamp(t3.0 & !1)));
        assert_eq!(
            Header {
                transmit_ts: NtpTimestamp(RX.0 & !1),
                ..h
            },
            expected(4, Mode::Server)
        );
    }

    #[test]
    fn a_short_reply_buffer_is_reported_not_written() {
        let mut reply = [0xEE; 40];
        assert_eq!(
            respond(&request(4, 3), 50_000, RX, &served(), &mut reply),
            Err(DropReason::ReplyBufferTooSmall)
        );
        assert_eq!(reply, [0xEE; 40]);
    }

    #[test]
    fn drop_slots_are_dense_and_labelled() {
        let modes = [0, 1, 2, 3, 4, 5, 6, 7].map(Mode::from_first_byte);
        let all: Vec<DropReason> = [
            DropReason::TooShort,
            DropReason::BadLength,
            DropReason::BadVersion(0),
        ]
        .into_iter()
        .chain(modes.map(DropReason::UnsupportedMode))
        .chain([
            DropReason::V1SymmetricActive,
            DropReason::BadExtension,
            DropReason::Truncated,
            DropReason::ReplyBufferTooSmall,
            DropReason::UnknownDraft,
        ])
        .collect();
        assert_eq!(all.len(), DropReason::COUNT);
        for (i, drop) in all.iter().enumerate() {
            assert_eq!(drop.index(), i);
            assert_eq!(drop.label(), DropReason::LABELS[i]);
        }
        assert_eq!(
            DropReason::BadVersion(7).index(),
            DropReason::BadVersion(0).index()
        );
        assert_eq!(
            DropReason::UnsupportedMode(Mode::Control).label(),
            "mode_control"
        );
        assert_eq!(
            DropReason::UnsupportedMode(Mode::Private).to_string(),
            "unsupported NTP mode Private"
        );
        for reason in DropReason::LABELS {
            assert!(
                reason
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit())
            );
        }
    }

    proptest! {
        #[test]
        fn never_longer_than_the_request_and_never_panics(
            request in proptest::collection::vec(any::<u8>(), 0..200),
            src_port: u16,
            rx: u64,
        ) {
            let mut reply = vec![0xEE_u8; request.len()];
            if let Ok(len) = respond(&request, src_port, NtpTimestamp(rx), &served(), &mut reply) {
                prop_assert!(len <= request.len());
                prop_assert_eq!(len, 48);
                prop_assert!(reply[48..].iter().all(|&b| b == 0xEE));
                stamp_transmit(&mut reply[..len], NtpTimestamp(rx));
            }
        }

        #[test]
        fn header_shaped_requests_never_panic(
            first: u8,
            rest in proptest::collection::vec(any::<u8>(), 47),
            tail in proptest::collection::vec(any::<u8>(), 0..40),
            src_port: u16,
        ) {
            // Steer the random input past the length check so the later checks get exercised.
            let mut request = [vec![first], rest, tail].concat();
            request.truncate(request.len() / 4 * 4);
            let mut reply = vec![0; request.len()];
            let result = respond(&request, src_port, RX, &served(), &mut reply);
            if let Ok(len) = result {
                prop_assert_eq!(len, 48);
                let h = Header::parse(&reply).unwrap();
                prop_assert_eq!(h.version, version_of(first));
                prop_assert!(matches!(h.mode, Mode::Server | Mode::SymmetricPassive));
                prop_assert_eq!(h.origin_ts, Header::parse(&request).unwrap().transmit_ts);
            }
        }
    }
}
