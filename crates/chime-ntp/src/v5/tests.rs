use proptest::prelude::*;

use super::*;
use crate::responder::tests::served;
use crate::time::NtpShort;

const RX: NtpTimestamp = NtpTimestamp(0xEEAC_6C48_F557_519E);
const COOKIE: [u8; 8] = [0xA3, 0x2A, 0xB2, 0x71, 0xE6, 0xB7, 0x2D, 0x57];

fn filter() -> BloomFilter {
    let mut bytes = [0u8; BloomFilter::BYTES];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = i as u8 ^ 0x5A;
    }
    BloomFilter::from_bytes(bytes)
}

fn request(draft: Draft, reference: Option<(u16, u16)>) -> Vec<u8> {
    let mut buf = vec![0xEE; 1024];
    let len = write_request(&mut buf, draft, 6, COOKIE, reference).unwrap();
    buf.truncate(len);
    buf
}

fn answer(request: &[u8]) -> Result<(Vec<u8>, Reply), DropReason> {
    let mut reply = vec![0xEE; request.len()];
    let r = respond(request, RX, &served(), &filter(), 0, &mut reply)?;
    Ok((reply, r))
}

#[test]
fn each_draft_is_answered_in_kind_as_long_as_the_request() {
    for draft in Draft::ALL {
        let req = request(draft, None);
        assert_eq!(req.len(), 48 + 28, "a 23-byte draft name takes 28 bytes");
        let (reply, r) = answer(&req).unwrap();
        assert_eq!(
            r,
            Reply {
                len: req.len(),
                draft
            }
        );
        let resp = parse_response(&reply, COOKIE, draft).unwrap();
        assert_eq!(resp.leap, Leap::NoWarning);
        assert_eq!((resp.stratum, resp.poll, resp.precision), (2, 6, -25));
        assert_eq!((resp.timescale, resp.era), (timescale::UTC, 0));
        assert_eq!(resp.flags, flags::SYNCHRONISED);
        // 0x123 / 65536 s as 4.28: shifted by 12 bits, exactly.
        assert_eq!(resp.root_delay, f64::from(0x123u32) / 65536.0);
        assert_eq!(resp.root_dispersion, f64::from(0x456u32) / 65536.0);
        assert_eq!(resp.receive_ts, NtpTimestamp(RX.0 | 1));
        assert_eq!(resp.transmit_ts, RX);
        assert_eq!(resp.server_cookie, NtpTimestamp(RX.0 | 1).to_bits());
        assert_eq!(resp.reference, None);
    }
}

#[test]
fn a_request_naming_no_known_draft_exactly_is_dropped() {
    let named = |id: &[u8]| {
        let mut req = request(Draft::D08, None);
        req.truncate(48);
        let mut len = 48;
        req.resize(48 + 4 + id.len().next_multiple_of(4), 0);
        put_field(&mut req, &mut len, ef::DRAFT_ID, id).unwrap();
        answer(&req).map(|(_, r)| r.draft)
    };
    assert_eq!(named(b"draft-ietf-ntp-ntpv5-09"), Ok(Draft::D09));
    for id in [
        &b"draft-ietf-ntp-ntpv5-07"[..],
        b"draft-ietf-ntp-ntpv5-08\0",
        b"draft-ietf-ntp-ntpv5-0",
        b"",
    ] {
        assert_eq!(named(id), Err(DropReason::UnknownDraft), "{id:?}");
    }
    let mut bare = request(Draft::D08, None);
    bare.truncate(48);
    assert_eq!(answer(&bare).map(|_| ()), Err(DropReason::UnknownDraft));
}

#[test]
fn a_reference_id_request_gets_its_slice_of_the_filter() {
    for (offset, len) in [(0, 16), (496, 16), (128, 256), (0, 512)] {
        let req = request(Draft::D08, Some((offset, len)));
        let (reply, r) = answer(&req).unwrap();
        assert_eq!(r.len, req.len());
        let resp = parse_response(&reply, COOKIE, Draft::D08).unwrap();
        let (o, l) = (usize::from(offset), usize::from(len));
        assert_eq!(resp.reference, Some(&filter().as_bytes()[o..o + l]));
    }
    // Past the end of the filter: no slice, the room padded instead.
    let mut req = request(Draft::D08, Some((0, 16)));
    req[48 + 4..48 + 6].copy_from_slice(&500u16.to_be_bytes());
    let (reply, r) = answer(&req).unwrap();
    assert_eq!(r.len, req.len());
    let resp = parse_response(&reply, COOKIE, Draft::D08).unwrap();
    assert_eq!(resp.reference, None);
    let kinds: Vec<u16> = fields(&reply).unwrap().map(|f| f.ty).collect();
    assert_eq!(kinds, [ef::DRAFT_ID, ef::PADDING]);
}

#[test]
fn unknown_fields_are_padded_over_and_a_unique_identifier_echoed() {
    let mut req = request(Draft::D09, None);
    let mut len = req.len();
    req.resize(len + 40 + 36, 0);
    put_field(&mut req, &mut len, 0x1234, &[7; 36]).unwrap();
    put_field(&mut req, &mut len, ef::UNIQUE_IDENTIFIER, &[9; 32]).unwrap();
    assert_eq!(len, req.len());
    let (reply, r) = answer(&req).unwrap();
    assert_eq!(r.len, req.len());
    let got: Vec<(u16, usize)> = (fields(&reply).unwrap())
        .map(|f| (f.ty, f.value.len()))
        .collect();
    assert_eq!(
        got,
        [
            (ef::UNIQUE_IDENTIFIER, 32),
            (ef::DRAFT_ID, 23),
            (ef::PADDING, 36)
        ]
    );
    let uid = fields(&reply).unwrap().next().unwrap();
    assert_eq!(uid.value, &[9; 32]);
}

#[test]
fn an_unsynchronised_server_says_so_in_leap_and_flags() {
    let req = request(Draft::D08, None);
    let mut reply = vec![0; req.len()];
    let unsync = ServedHeader::unsynchronised(-20);
    respond(&req, RX, &unsync, &filter(), 0, &mut reply).unwrap();
    let resp = parse_response(&reply, COOKIE, Draft::D08).unwrap();
    assert_eq!(
        (resp.leap, resp.flags, resp.stratum),
        (Leap::Unsynchronised, 0, 0)
    );
}

#[test]
fn root_fields_saturate_at_sixteen_seconds() {
    let mut s = served();
    s.root_delay = NtpShort(16 << 16);
    s.root_dispersion = NtpShort((16 << 16) - 1);
    let req = request(Draft::D08, None);
    let mut reply = vec![0; req.len()];
    respond(&req, RX, &s, &filter(), 0, &mut reply).unwrap();
    assert_eq!(reply[4..8], [0xFF; 4]);
    assert_eq!(reply[8..12], [0xFF, 0xFF, 0xF0, 0x00]);
}

#[test]
fn malformed_requests_are_dropped_each_for_its_reason() {
    let good = request(Draft::D08, None);
    let drop = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut r = good.clone();
        f(&mut r);
        answer(&r).map(|_| ()).unwrap_err()
    };
    assert_eq!(drop(&|r| r.truncate(47)), DropReason::TooShort);
    assert_eq!(drop(&|r| r.push(0)), DropReason::BadLength);
    assert_eq!(
        drop(&|r| r[0] = 0x2C),
        DropReason::UnsupportedMode(crate::Mode::Server)
    );
    // A field whose length overruns the packet, and one shorter than its own head.
    assert_eq!(
        drop(&|r| r[50..52].copy_from_slice(&[0, 32])),
        DropReason::BadExtension
    );
    assert_eq!(
        drop(&|r| r[50..52].copy_from_slice(&[0, 3])),
        DropReason::BadExtension
    );
    // Four stray bytes after the last field.
    assert_eq!(drop(&|r| r.extend([0; 4])), DropReason::BadExtension);
    // An NTS cookie: NTS over v5 is not served, and never answered unauthenticated.
    let nts = drop(&|r| {
        let mut len = r.len();
        r.resize(len + 20, 0);
        put_field(r, &mut len, 0x0204, &[1; 16]).unwrap();
    });
    assert_eq!(nts, DropReason::BadExtension);
    let mut short = vec![0; good.len() - 4];
    assert_eq!(
        respond(&good, RX, &served(), &filter(), 0, &mut short),
        Err(DropReason::ReplyBufferTooSmall)
    );
}

#[test]
fn eras_turn_in_2036() {
    assert_eq!(era(1_764_000_000), 0);
    assert_eq!(era(2_085_978_495), 0);
    assert_eq!(era(2_085_978_496), 1);
}

#[test]
fn a_kiss_carries_its_code_in_the_server_cookie() {
    let (mut reply, _) = answer(&request(Draft::D08, None)).unwrap();
    kiss_of_death(&mut reply, *b"RATE");
    let resp = parse_response(&reply, COOKIE, Draft::D08).unwrap();
    assert_eq!(
        (resp.stratum, resp.leap, resp.flags),
        (0, Leap::Unsynchronised, 0)
    );
    assert_eq!(&resp.server_cookie[..4], b"RATE");
}

#[test]
fn a_v4_request_asking_to_upgrade_sees_the_mark_echoed() {
    let mut req = [0u8; 48];
    req[0] = 0x23;
    req[16..24].copy_from_slice(&UPGRADE);
    let mut reply = [0u8; 48];
    crate::respond(&req, 40_000, RX, &served(), &mut reply).unwrap();
    assert_ne!(reply[16..24], UPGRADE);
    assert!(mark_upgrade(&req, &mut reply));
    assert_eq!(reply[16..24], UPGRADE);
    // Not asked, or asked by another version: left alone.
    req[16] = b'X';
    assert!(!mark_upgrade(&req, &mut reply));
    req[16] = b'N';
    req[0] = 0x1B;
    assert!(!mark_upgrade(&req, &mut reply));
}

#[test]
fn a_client_rejects_a_reply_to_another_request_or_draft() {
    let (reply, _) = answer(&request(Draft::D08, None)).unwrap();
    assert_eq!(
        parse_response(&reply, [0; 8], Draft::D08),
        Err(ResponseError::WrongCookie)
    );
    assert_eq!(
        parse_response(&reply, COOKIE, Draft::D09),
        Err(ResponseError::WrongDraft)
    );
    assert_eq!(
        parse_response(&request(Draft::D08, None), COOKIE, Draft::D08),
        Err(ResponseError::Malformed)
    );
    let mut v4 = reply.clone();
    v4[0] = (v4[0] & 0xC7) | 4 << 3;
    assert_eq!(
        parse_response(&v4, COOKIE, Draft::D08),
        Err(ResponseError::Version(4))
    );
}

#[test]
fn the_client_cookie_is_found_in_requests_and_replies() {
    let req = request(Draft::D09, None);
    assert_eq!(client_cookie(&req), Some(COOKIE));
    let (reply, _) = answer(&req).unwrap();
    assert_eq!(client_cookie(&reply), Some(COOKIE));
    assert_eq!(client_cookie(&reply[..47]), None);
}

#[test]
fn the_filter_holds_the_ids_added_and_its_sources() {
    let mut n = 0u16;
    let own = ServerId::new(|| {
        n = n.wrapping_add(977);
        n
    });
    let bits = own.bits();
    assert!(bits.windows(2).all(|w| w[0] < w[1] && w[1] < 4096));
    let mut filter = BloomFilter::new();
    assert!(!filter.contains(&own));
    filter.add_id(&own);
    assert!(filter.contains(&own));
    assert_eq!(filter.bits().collect::<Vec<_>>(), bits);
    let mut source = BloomFilter::new();
    let theirs = ServerId::new({
        let mut m = 1u16;
        move || {
            m = m.wrapping_mul(31).wrapping_add(7);
            m
        }
    });
    source.add_id(&theirs);
    filter.add(&source);
    assert!(filter.contains(&theirs) && filter.contains(&own));
}

/// A fetch gathers a server's whole filter in four polls answered by the responder, then starts
/// over; it ignores replies to other requests; and an upstream that never answers in v5 is asked
/// only now and then.
#[test]
fn a_fetch_gathers_the_upstreams_filter_a_quarter_a_poll() {
    let mut fetch = FilterFetch::new(Draft::D08);
    let served = served();
    let mut buf = [0u8; 256];
    let mut poll = |fetch: &mut FilterFetch, cookie: u8, answer: bool| {
        let len = fetch.request(&mut buf, [cookie; 8])?;
        assert_eq!(len, 48 + 132 + 28);
        let mut reply = vec![0u8; len];
        respond(&buf[..len], RX, &served, &filter(), 0, &mut reply).unwrap();
        // A stray reply to another request first: ignored.
        let mut stray = reply.clone();
        stray[24] ^= 1;
        assert_eq!(fetch.on_reply(&stray), None);
        Some(if answer { fetch.on_reply(&reply) } else { None })
    };
    for cookie in 1..4 {
        assert_eq!(poll(&mut fetch, cookie, true), Some(None));
    }
    assert_eq!(poll(&mut fetch, 4, true), Some(Some(filter())));
    // Again from the first quarter.
    assert_eq!(poll(&mut fetch, 5, true), Some(None));
    assert!(fetch.speaks_v5());

    let mut silent = FilterFetch::new(Draft::D08);
    for cookie in 0..FilterFetch::TRIES as u8 {
        assert_eq!(poll(&mut silent, cookie, false), Some(None));
    }
    assert!(silent.speaks_v5(), "the last request may still be answered");
    assert_eq!(silent.request(&mut [0u8; 256], [9; 8]), None);
    assert!(!silent.speaks_v5());
    let asked = (1..FilterFetch::RETRY_EVERY * 2)
        .filter(|_| poll(&mut silent, 9, false).is_some())
        .count();
    assert_eq!(
        asked,
        2,
        "asked once every {} polls",
        FilterFetch::RETRY_EVERY
    );
}

proptest! {
    /// Whatever the bytes, a reply is exactly as long as its request, or there is none.
    #[test]
    fn no_reply_is_longer_than_its_request(
        mut bytes in proptest::collection::vec(any::<u8>(), 0..700),
        draft_at in any::<bool>(),
    ) {
        if let Some(b) = bytes.first_mut() {
            *b = (*b & 0xC0) | 0x2B;
        }
        if draft_at && bytes.len() >= 48 + 28 {
            let mut len = 48;
            put_field(&mut bytes, &mut len, ef::DRAFT_ID, Draft::D08.id().as_bytes()).unwrap();
        }
        let mut reply = vec![0; bytes.len() + 64];
        if let Ok(r) = respond(&bytes, RX, &served(), &filter(), 0, &mut reply[..bytes.len()]) {
            prop_assert_eq!(r.len, bytes.len());
            prop_assert!(fields(&reply[..r.len]).is_some());
        }
        prop_assert!(reply[bytes.len()..].iter().all(|&b| b == 0));
    }
}
