//! The NTPv5 responder and a client's parse on hostile input: never a panic; a reply exactly as
//! long as its request, made of well-formed fields, naming the request's draft, echoing its client
//! cookie, and read back by the client's own parser; NTS's checks over v5 never verify a forgery.
#![no_main]

use chime_ntp::v5::{self, BloomFilter};
use chime_ntp::{NtpTimestamp, ServerState, StalePolicy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u64, [u8; 16], &[u8])| {
    let (rx, seed, request) = input;
    let rx = NtpTimestamp(rx);
    let served = ServerState::unsynchronised().served_at(rx, &StalePolicy::default());
    let mut filter = [0u8; BloomFilter::BYTES];
    for (i, b) in filter.iter_mut().enumerate() {
        *b = seed[i % 16].rotate_left(i as u32);
    }
    let filter = BloomFilter::from_bytes(filter);
    let mut reply = vec![0u8; request.len()];
    if let Ok(r) = v5::respond(request, rx, &served, &filter, 0, &mut reply) {
        assert_eq!(r.len, request.len());
        assert!(v5::fields(&reply).is_some(), "our own reply's fields parse");
        let mut cookie = [0u8; 8];
        cookie.copy_from_slice(&request[24..32]);
        let parsed = v5::parse_response(&reply, cookie, r.draft).expect("our own reply parses");
        if let Some(slice) = parsed.reference {
            let at = filter
                .as_bytes()
                .windows(slice.len().max(1))
                .any(|w| w == slice);
            assert!(slice.is_empty() || at, "a slice of the filter");
        }
    }
    // NTS over v5: whatever the bytes, the checks neither panic nor verify a forgery, and a NAK
    // is never longer than the request.
    let keys = chime_ntp::nts::CookieKeys::new(7, [0x33; 32]);
    if let Ok(accepted) = v5::accept(request) {
        match chime_ntp::nts::check_request_v5(request, &keys) {
            chime_ntp::nts::Check::Verified(_) => panic!("a forged cookie verified"),
            chime_ntp::nts::Check::Nak(uid, _) => {
                let mut nak = vec![0u8; request.len()];
                if v5::write_header(request, rx, &served, 0, &mut nak).is_ok()
                    && let Some(len) =
                        chime_ntp::nts::write_nak_v5(&mut nak, request, uid, accepted.draft)
                {
                    assert!(len <= request.len());
                }
            }
            _ => {}
        }
    }
    // Whatever the bytes, the client's parser neither panics nor accepts a request.
    if let Ok(resp) = v5::parse_response(request, [0; 8], v5::Draft::D08) {
        assert_eq!(request[0] & 7, 4, "{resp:?}");
    }
});
