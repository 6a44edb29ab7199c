//! The signer invariant: for any batch of datagrams, whatever the responder answers is no larger
//! than its request and verifies against the exact bytes received, under the server's key; and
//! every kind of grease that applies turns that reply into one of the same length that does not.
#![no_main]

use chime_roughtime::{
    BatchParams, Exchange, Grease, LongTermKey, OnlineKey, Responder, ResponderConfig,
    VerifyPolicy, verify_reply,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u32, Vec<Vec<u8>>)| {
    let (radius_us, mut requests) = input;
    requests.truncate(16);
    let long_term = LongTermKey::from_seed(&[1; 32]);
    let now_s = 1_790_000_000;
    let delegation = long_term
        .delegate(OnlineKey::from_seed(&[2; 32]), now_s - 60, now_s + 3600)
        .unwrap();
    let mut responder = Responder::new(ResponderConfig {
        capacity: 16,
        ..Default::default()
    });
    let mut replies: Vec<Vec<u8>> = requests.iter().map(|r| vec![0u8; r.len()]).collect();
    let mut exchanges: Vec<Exchange<'_>> = requests
        .iter()
        .zip(replies.iter_mut())
        .map(|(req, reply)| Exchange::new(req, reply))
        .collect();
    let params = BatchParams {
        now_unix_us: now_s * 1_000_000 + 123_456,
        radius_us: u64::from(radius_us),
        delegation: &delegation,
    };
    responder.respond(params, &mut exchanges);
    let policy = VerifyPolicy::new(u64::MAX);
    for (req, ex) in requests.iter().zip(&exchanges) {
        if let Some(reply) = ex.reply_bytes() {
            assert!(reply.len() <= req.len(), "reply larger than request");
            verify_reply(req, reply, &long_term.public_key(), &policy)
                .expect("signed reply verifies");
        }
    }
    drop(exchanges);
    // Grease: the same batch again, each accepted request's reply written greased in every way.
    let mut batch = responder.begin(params);
    let tickets: Vec<_> = requests.iter().map(|r| batch.add(r).ok()).collect();
    let signed = batch.sign();
    for (req, ticket) in requests.iter().zip(tickets) {
        let Some(ticket) = ticket else { continue };
        let mut truth = vec![0u8; req.len()];
        let Ok(n) = signed.write_reply(ticket, &mut truth) else {
            continue;
        };
        for &kind in Grease::kinds(ticket.version()) {
            let mut greased = vec![0u8; req.len()];
            let m = signed
                .write_greased_reply(ticket, &mut greased, kind)
                .expect("greased reply");
            assert_eq!(m, n, "{kind:?}: greased reply of another length");
            let verified = verify_reply(req, &greased[..m], &long_term.public_key(), &policy);
            assert!(verified.is_err(), "{kind:?}: greased reply verifies");
        }
    }
});
