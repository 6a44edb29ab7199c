//! The whole responder on hostile input: never a panic, never a reply longer than the request,
//! and every reply it writes is a well-formed server or passive packet echoing the request.
#![no_main]

use chime_ntp::{Header, Mode, NtpTimestamp, ServerState, StalePolicy, respond};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u16, u64, &[u8])| {
    let (port, rx, request) = input;
    let rx = NtpTimestamp(rx);
    let served = ServerState::unsynchronised().served_at(rx, &StalePolicy::default());
    let mut reply = vec![0u8; request.len()];
    if let Ok(len) = respond(request, port, rx, &served, &mut reply) {
        assert!(len <= request.len());
        let r = Header::parse(&reply[..len]).expect("our own reply parses");
        assert!(matches!(r.mode, Mode::Server | Mode::SymmetricPassive));
        assert_eq!(r.origin_ts.to_bits(), request[40..48]);
    }
});
