//! The whole responder on hostile input: never a panic, never a reply longer than the request,
//! and every reply it writes is a well-formed server or passive packet echoing the request, with
//! the interleaved-mode marks (receive odd, transmit even); turned interleaved, it echoes the
//! request's receive field instead and is still found under its receive timestamp.
#![no_main]

use chime_ntp::{
    Header, Mode, NtpTimestamp, ServerState, StalePolicy, TxLog, interleaved_origin,
    make_interleaved, reply_receive_timestamp, respond,
};
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
        assert_eq!((r.receive_ts.0 & 1, r.transmit_ts.0 & 1), (1, 0));
        if r.mode == Mode::Server {
            assert_eq!(reply_receive_timestamp(&reply[..len]), Some(r.receive_ts));
        }
        if let Some(origin) = interleaved_origin(request) {
            let log = TxLog::new(4);
            log.save(origin, NtpTimestamp(rx.0 ^ 0x5555));
            let previous = log.take(origin).expect("just saved");
            make_interleaved(&mut reply[..len], request, previous);
            let i = Header::parse(&reply[..len]).expect("still parses");
            assert_eq!(i.origin_ts.to_bits(), request[32..40]);
            assert_eq!(i.transmit_ts.0, previous.0 & !1);
            assert_eq!(reply_receive_timestamp(&reply[..len]), Some(r.receive_ts));
        }
    }
});
