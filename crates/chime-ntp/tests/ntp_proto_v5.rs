//! NTPv5 against an independent implementation: ntpd-rs's own packet code (crates.io `ntp-proto`
//! 1.9.0, draft -08) writes the requests, chime's responder answers them, and ntp-proto reads and
//! checks the replies as ntpd-rs does before it uses one.

use std::io::Cursor;

use chime_ntp::{Leap, NtpShort, NtpTimestamp, ServedHeader, v5};
use ntp_proto::{NoCipher, NtpLeapIndicator, NtpPacket, PollInterval};

fn served() -> ServedHeader {
    ServedHeader {
        leap: Leap::NoWarning,
        stratum: 3,
        precision: -24,
        reference_id: [127, 0, 0, 1],
        reference_ts: NtpTimestamp(0xEEAC_6C47_24A8_0B7B),
        root_delay: NtpShort(0x0000_0800),
        root_dispersion: NtpShort(0x0000_1000),
    }
}

fn bytes_of(packet: &NtpPacket<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 1024];
    let mut cursor = Cursor::new(buf.as_mut_slice());
    packet.serialize(&mut cursor, &NoCipher, None).unwrap();
    let len = cursor.position() as usize;
    buf.truncate(len);
    buf
}

#[test]
fn ntp_proto_accepts_chimes_v5_reply() {
    let (request, id) = NtpPacket::poll_message_v5(PollInterval::default());
    let request = bytes_of(&request);
    let rx = NtpTimestamp(0xEEAC_6C48_F557_519E);
    let mut reply = vec![0u8; request.len()];
    let filter = v5::BloomFilter::new();
    let r = v5::respond(&request, rx, &served(), &filter, 0, &mut reply).unwrap();
    assert_eq!(r.draft, v5::Draft::D08);
    assert_eq!(r.len, request.len());
    chime_ntp::stamp_transmit(&mut reply, NtpTimestamp(rx.0 + 0x1000));

    let (packet, _) = NtpPacket::deserialize(&reply, &NoCipher).expect("ntp-proto parses it");
    assert!(
        packet.valid_server_response(id, false),
        "ntp-proto matches it to its request"
    );
    assert_eq!(packet.stratum(), 3);
    assert_eq!(packet.leap(), NtpLeapIndicator::NoWarning);
    assert!(!packet.is_kiss());
    // T3 - T2 as ntp-proto reads them: 0x1000 less the receive timestamp's mark bit, in 2^-32 s.
    let t3_t2 = packet.transmit_timestamp() - packet.receive_timestamp();
    assert!((t3_t2.to_seconds() - f64::from(0x1000 - 1) / 2f64.powi(32)).abs() < 1e-12);
    let era_seconds = (rx.0 >> 32) as u32;
    let at = ntp_proto::NtpTimestamp::from_seconds_nanos_since_ntp_era(era_seconds, 0);
    assert!((packet.receive_timestamp() - at).to_seconds() < 1.0);
    // 0x800 / 65536 s = 1/32 s of root delay, in ntp-proto's own units.
    assert!((packet.root_delay().to_seconds() - 1.0 / 32.0).abs() < 1e-9);
}

#[test]
fn ntp_proto_sees_a_v5_kiss_as_one() {
    let (request, id) = NtpPacket::poll_message_v5(PollInterval::default());
    let request = bytes_of(&request);
    let mut reply = vec![0u8; request.len()];
    let rx = NtpTimestamp(0xEEAC_6C48_F557_519E);
    v5::respond(
        &request,
        rx,
        &served(),
        &v5::BloomFilter::new(),
        0,
        &mut reply,
    )
    .unwrap();
    v5::kiss_of_death(&mut reply, *b"RATE");
    chime_ntp::suggest_poll(&mut reply, 10);
    let (packet, _) = NtpPacket::deserialize(&reply, &NoCipher).unwrap();
    assert!(packet.valid_server_response(id, false));
    assert!(packet.is_kiss());
    assert!(packet.is_kiss_rate(PollInterval::default()));
}

#[test]
fn ntp_proto_sees_the_upgrade_echoed() {
    let (request, _) = NtpPacket::poll_message_upgrade_request(PollInterval::default());
    let request = bytes_of(&request);
    let mut reply = vec![0u8; request.len()];
    let rx = NtpTimestamp(0xEEAC_6C48_F557_519E);
    chime_ntp::respond(&request, 40_000, rx, &served(), &mut reply).unwrap();
    let (plain, _) = NtpPacket::deserialize(&reply, &NoCipher).unwrap();
    assert!(!plain.is_upgrade());
    assert!(v5::mark_upgrade(&request, &mut reply));
    let (packet, _) = NtpPacket::deserialize(&reply, &NoCipher).unwrap();
    assert!(packet.is_upgrade());
}
