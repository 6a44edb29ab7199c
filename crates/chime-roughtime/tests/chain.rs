//! Chained measurements across several of our own servers (RFC 10049 §8.2): honest servers
//! agree, a server whose clock is a minute slow is caught, and the chain proves the order.

use chime_roughtime::{
    BatchParams, Exchange, Link, LongTermKey, OnlineKey, REQUEST_LEN, Responder, ResponderConfig,
    VerifyPolicy, Version, build_request, next_nonce, verify_chain,
};

const NOW_US: u64 = 1_795_285_217_000_000;

/// One recorded exchange, owning its packets.
struct Recorded {
    public_key: [u8; 32],
    rand: Option<[u8; 32]>,
    request: Vec<u8>,
    reply: Vec<u8>,
}

/// Queries `servers` in order (each with its clock offset in seconds), chaining each nonce from
/// the reply before.
fn measure(servers: &[(u8, i64)]) -> Vec<Recorded> {
    let mut links: Vec<Recorded> = Vec::new();
    for (step, &(id, offset_s)) in servers.iter().enumerate() {
        let long = LongTermKey::from_seed(&[id; 32]);
        let now_us = NOW_US
            .checked_add_signed(offset_s * 1_000_000 + step as i64 * 10_000)
            .unwrap();
        let delegation = long
            .delegate(OnlineKey::from_seed(&[id ^ 0xff; 32]), 0, u64::MAX / 2)
            .unwrap();
        let (rand, nonce) = match links.last() {
            None => (None, rand::random::<[u8; 32]>()),
            Some(previous) => {
                let rand = rand::random::<[u8; 32]>();
                (Some(rand), next_nonce(&previous.reply, &rand))
            }
        };
        let mut request = vec![0u8; REQUEST_LEN];
        build_request(
            &mut request,
            &[Version::Rfc10049],
            &nonce,
            Some(&long.srv()),
        )
        .unwrap();
        let mut reply = vec![0u8; REQUEST_LEN];
        let mut responder = Responder::new(ResponderConfig::default());
        let mut ex = [Exchange::new(&request, &mut reply)];
        responder.respond(
            BatchParams {
                now_unix_us: now_us,
                radius_us: 1_000_000,
                delegation: &delegation,
            },
            &mut ex,
        );
        let len = ex[0].outcome().unwrap().unwrap();
        reply.truncate(len);
        links.push(Recorded {
            public_key: long.public_key(),
            rand,
            request,
            reply,
        });
    }
    links
}

fn as_links(raw: &[Recorded]) -> Vec<Link<'_>> {
    raw.iter()
        .map(|r| Link {
            public_key: r.public_key,
            rand: r.rand,
            request: &r.request,
            reply: &r.reply,
        })
        .collect()
}

#[test]
fn honest_servers_agree_over_two_rounds() {
    // Three servers, queried twice in the same order, as §8.2 asks.
    let raw = measure(&[(1, 0), (2, 0), (3, 1), (1, 0), (2, 0), (3, 1)]);
    let report = verify_chain(&as_links(&raw), &VerifyPolicy::new(10_000_000)).unwrap();
    assert!(report.is_consistent(), "{:?}", report.contradictions);
    assert_eq!(report.replies.len(), 6);
}

#[test]
fn a_slow_server_is_caught() {
    // Server 2 is a minute behind: after server 1 answered, its time is impossible.
    let raw = measure(&[(1, 0), (2, -60), (3, 0)]);
    let report = verify_chain(&as_links(&raw), &VerifyPolicy::new(10_000_000)).unwrap();
    let pairs: Vec<(usize, usize)> = report
        .contradictions
        .iter()
        .map(|c| (c.earlier, c.later))
        .collect();
    assert_eq!(pairs, [(0, 1)]);
    let c = report.contradictions[0];
    assert!(c.earlier_earliest_unix_us > c.later_latest_unix_us);
}

#[test]
fn links_out_of_order_are_not_a_chain() {
    let raw = measure(&[(1, 0), (2, 0), (3, 0)]);
    let mut links = as_links(&raw);
    links.swap(1, 2);
    assert!(verify_chain(&links, &VerifyPolicy::new(10_000_000)).is_err());
    let mut first_only = as_links(&raw);
    first_only[1].rand = None;
    assert_eq!(
        verify_chain(&first_only, &VerifyPolicy::new(10_000_000)).unwrap_err(),
        chime_roughtime::ChainError::MissingRand { index: 1 }
    );
}
