//! The signer invariant: for any batch of datagrams, whatever the responder answers is no larger
//! than its request and verifies against the exact bytes received, under the server's key; and
//! every kind of grease that applies turns that reply into one of the same length that does not.
#![no_main]

use chime_roughtime::{
    BatchParams, Exchange, Grease, LongTermKey, OnlineKey, REQUEST_LEN, Responder, ResponderConfig,
    VerifyPolicy, Version, build_request, verify_reply,
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
    // Grease. Fuzzed datagrams are seldom well-formed 1 KiB requests, so this part builds one
    // request per input, its version and nonce taken from the input's bytes, signs them as one
    // batch, and writes each reply greased in every way that applies.
    let built: Vec<Vec<u8>> = requests
        .iter()
        .map(|r| {
            let version =
                Version::ALL[usize::from(r.first().copied().unwrap_or(0)) % Version::ALL.len()];
            let nonce: Vec<u8> = (0..version.family().nonce_len())
                .map(|i| r.get(i + 1).copied().unwrap_or(i as u8))
                .collect();
            let mut out = vec![0u8; REQUEST_LEN];
            build_request(&mut out, &[version], &nonce, None).expect("a request");
            out
        })
        .collect();
    let mut batch = responder.begin(params);
    let tickets: Vec<_> = built
        .iter()
        .map(|r| batch.add(r).expect("a built request is taken"))
        .collect();
    let signed = batch.sign();
    for (req, ticket) in built.iter().zip(tickets) {
        let mut truth = vec![0u8; req.len()];
        let n = signed.write_reply(ticket, &mut truth).expect("a reply");
        verify_reply(req, &truth[..n], &long_term.public_key(), &policy)
            .expect("the true reply verifies");
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
