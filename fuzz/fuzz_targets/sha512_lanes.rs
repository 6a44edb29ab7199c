//! The multi-lane SHA-512: the input is cut into up to eight messages of any lengths (each in up
//! to three parts), hashed together on every backend this CPU runs, and every digest must equal
//! sha2's of the same message. Messages too long for a lane must be refused, not truncated.
#![no_main]

use chime_sha512::{Backend, LANES, Lanes, MAX_MESSAGE_LEN, digest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&shape, mut rest)) = data.split_first() else {
        return;
    };
    // Message lengths come from the input's bytes, stretched so that multi-block and too-long
    // messages are reachable from short inputs.
    let count = usize::from(shape) % LANES + 1;
    let mut messages = Vec::new();
    for _ in 0..count {
        let Some((&len, tail)) = rest.split_first() else {
            break;
        };
        let want = usize::from(len) * 9;
        let (message, tail) = tail.split_at(want.min(tail.len()));
        messages.push(message);
        rest = tail;
    }
    for &backend in Backend::available() {
        let mut lanes = Lanes::with_backend(backend).expect("available");
        let mut staged = Vec::new();
        for message in &messages {
            let (a, b) = message.split_at(message.len() / 3);
            let (b, c) = b.split_at(b.len() / 2);
            match lanes.push(&[a, b, c]) {
                Some(lane) => staged.push((lane, *message)),
                None => assert!(
                    message.len() > MAX_MESSAGE_LEN,
                    "refused a {}-byte message",
                    message.len()
                ),
            }
        }
        lanes.finish(|lane, d| {
            let (_, message) = staged[lane];
            assert_eq!(
                *d,
                digest(&[message]),
                "{backend:?} lane {lane}, {} bytes",
                message.len()
            );
        });
    }
});
