//! Roughtime over TCP: any bytes, cut into any pieces, through the stream framing and a stream
//! responder. The reader hands out only whole packets that start with ROUGHTIM and are no longer
//! than its limit, in the order they came, never buffering more than a packet and a piece; an
//! error is final; and whatever the responder answers verifies against the exact packet read.
#![no_main]

use chime_roughtime::{
    BatchParams, FrameReader, LongTermKey, OnlineKey, Responder, ResponderConfig, VerifyPolicy,
    verify_reply,
};
use libfuzzer_sys::fuzz_target;

const MAX_MESSAGE: usize = 2048;

fuzz_target!(|input: (Vec<u8>, Vec<u8>)| {
    let (stream, cuts) = input;
    let mut reader = FrameReader::new(MAX_MESSAGE);
    let mut packets: Vec<Vec<u8>> = Vec::new();
    let mut at = 0;
    let mut cuts = cuts.iter().map(|&c| usize::from(c).max(1)).cycle();
    let mut failed = false;
    while at < stream.len() && !failed {
        let piece = cuts.next().unwrap_or(stream.len()).min(stream.len() - at);
        reader.push(&stream[at..at + piece]);
        at += piece;
        loop {
            match reader.next_packet() {
                Ok(Some(p)) => {
                    assert_eq!(&p[..8], b"ROUGHTIM");
                    let declared = u32::from_le_bytes(p[8..12].try_into().unwrap()) as usize;
                    assert_eq!(p.len(), 12 + declared);
                    assert!(declared <= MAX_MESSAGE);
                    packets.push(p.to_vec());
                }
                Ok(None) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(
            reader.buffered() <= 12 + MAX_MESSAGE + 256,
            "buffered {}",
            reader.buffered()
        );
    }
    // The packets are the stream's first bytes, in order.
    let joined: Vec<u8> = packets.concat();
    assert_eq!(&stream[..joined.len()], &joined[..]);

    let long_term = LongTermKey::from_seed(&[1; 32]);
    let now_s = 1_790_000_000;
    let delegation = long_term
        .delegate(OnlineKey::from_seed(&[2; 32]), now_s - 60, now_s + 3600)
        .unwrap();
    let mut responder = Responder::new(ResponderConfig {
        capacity: 16,
        ..Default::default()
    })
    .over_stream();
    let params = BatchParams {
        now_unix_us: now_s * 1_000_000,
        radius_us: 1_000_000,
        delegation: &delegation,
    };
    packets.truncate(16);
    let mut batch = responder.begin(params);
    let tickets: Vec<_> = packets.iter().map(|p| batch.add(p).ok()).collect();
    if batch.is_empty() {
        return;
    }
    let signed = batch.sign();
    let policy = VerifyPolicy::new(u64::MAX);
    for (p, t) in packets.iter().zip(tickets) {
        let Some(t) = t else { continue };
        let mut out = vec![0u8; 4096];
        if let Ok(len) = signed.write_reply(t, &mut out) {
            verify_reply(p, &out[..len], &long_term.public_key(), &policy)
                .expect("a stream reply verifies");
        }
    }
});
