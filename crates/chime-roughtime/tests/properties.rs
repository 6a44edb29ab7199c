//! Properties of the server and verifier together: every reply of every batch verifies, no
//! single bit of a reply can change without verification failing, and hostile bytes never make
//! either side panic.

use std::collections::BTreeSet;

use chime_roughtime::merkle::PathError;
use chime_roughtime::{
    BatchParams, Delegation, Exchange, Grease, LongTermKey, OnlineKey, REQUEST_LEN, Reply,
    Responder, ResponderConfig, Signed, VerifyError, VerifyPolicy, Version, VersionSet,
    build_request, verify_reply,
};
use proptest::prelude::*;

const NOW_S: u64 = 1_795_285_217;

struct Server {
    long: LongTermKey,
    delegation: Delegation,
}

fn server() -> Server {
    let long = LongTermKey::from_seed(&[0x11; 32]);
    let delegation = long
        .delegate(
            OnlineKey::from_seed(&[0x22; 32]),
            NOW_S - 86_400,
            NOW_S + 86_400,
        )
        .unwrap();
    Server { long, delegation }
}

fn params(d: &Delegation) -> BatchParams<'_> {
    BatchParams {
        now_unix_us: NOW_S * 1_000_000 + 250_000,
        radius_us: 1_000_000,
        delegation: d,
    }
}

fn policy() -> VerifyPolicy {
    VerifyPolicy::new(10_000_000)
}

/// A request offering `versions`, its nonce derived from `seed` so every request differs.
fn request(versions: &[Version], seed: u32, srv: Option<&[u8; 32]>) -> Vec<u8> {
    let len = versions[0].family().nonce_len();
    let nonce: Vec<u8> = (0..len)
        .map(|i| (seed as usize * 31 + i * 7) as u8 ^ (seed >> 8) as u8)
        .collect();
    let mut out = vec![0u8; REQUEST_LEN];
    build_request(&mut out, versions, &nonce, srv).unwrap();
    out
}

/// Answers `requests` in one batch; replies in order (`None` for drops).
fn answer(responder: &mut Responder, s: &Server, requests: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut buffers = vec![[0u8; 1100]; requests.len()];
    let mut exchanges: Vec<Exchange<'_>> = requests
        .iter()
        .zip(buffers.iter_mut())
        .map(|(r, b)| Exchange::new(r, b))
        .collect();
    responder.respond(params(&s.delegation), &mut exchanges);
    exchanges
        .iter()
        .map(|e| e.reply_bytes().map(<[u8]>::to_vec))
        .collect()
}

/// The SIG of a reply: the bytes after the header whose first tag is SIG.
fn sig_of(reply: &[u8]) -> Vec<u8> {
    let parsed = chime_roughtime::Reply::parse(reply).unwrap();
    parsed.signature.to_vec()
}

/// The claim of the brief, exhaustively: for every batch size up to 128 and every index in it,
/// the reply verifies, and the whole batch carries one signature.
#[test]
fn every_batch_size_and_index_verifies() {
    let s = server();
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::ALL,
        capacity: 128,
    });
    let pk = s.long.public_key();
    for n in 1..=128u32 {
        let requests: Vec<Vec<u8>> = (0..n)
            .map(|i| request(&[Version::Rfc10049], n * 1000 + i, Some(&s.long.srv())))
            .collect();
        let replies = answer(&mut responder, &s, &requests);
        let mut signatures = BTreeSet::new();
        for (i, (req, reply)) in requests.iter().zip(&replies).enumerate() {
            let reply = reply
                .as_ref()
                .unwrap_or_else(|| panic!("n={n} i={i} dropped"));
            let v = verify_reply(req, reply, &pk, &policy())
                .unwrap_or_else(|e| panic!("n={n} i={i}: {e}"));
            assert_eq!(v.index as usize, i);
            signatures.insert(sig_of(reply));
        }
        assert_eq!(signatures.len(), 1, "n={n}: one signature per batch");
    }
}

/// Grease: for every version, batch size and index, each kind that applies to the version
/// breaks the reply in the way it names, at the true reply's length; the true reply verifies.
#[test]
fn every_kind_of_grease_fails_verification_as_named() {
    let s = server();
    let pk = s.long.public_key();
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::ALL,
        capacity: 8,
    });
    for version in Version::ALL {
        for size in [1u32, 2, 3, 8] {
            let requests: Vec<Vec<u8>> = (0..size)
                .map(|i| request(&[version], size * 10 + i, None))
                .collect();
            let mut batch = responder.begin(params(&s.delegation));
            let tickets: Vec<_> = requests.iter().map(|r| batch.add(r).unwrap()).collect();
            let signed = batch.sign();
            for (i, (req, ticket)) in requests.iter().zip(&tickets).enumerate() {
                let at = format!("{version} batch {size} index {i}");
                let mut truth = [0u8; 1100];
                let n = signed.write_reply(*ticket, &mut truth).unwrap();
                verify_reply(req, &truth[..n], &pk, &policy()).unwrap();
                for &kind in Grease::kinds(version) {
                    let mut greased = [0u8; 1100];
                    let m = signed
                        .write_greased_reply(*ticket, &mut greased, kind)
                        .unwrap();
                    assert_eq!(m, n, "{at} {kind:?}");
                    let diff = (0..n).filter(|&b| greased[b] != truth[b]).count();
                    assert_eq!(diff, 1, "{at} {kind:?}: {diff} bytes changed");
                    // The byte changed is in the value the kind names.
                    let (t, g) = (
                        Reply::parse(&truth[..n]).unwrap(),
                        Reply::parse(&greased[..m]),
                    );
                    let g = g.unwrap();
                    let changed = match kind {
                        Grease::Signature => t.signature != g.signature,
                        Grease::Certificate => t.cert.signature != g.cert.signature,
                        Grease::Path if size > 1 => t.path != g.path,
                        Grease::Path | Grease::Index => t.index != g.index,
                        Grease::Nonce => t.nonce != g.nonce,
                        Grease::Time => {
                            t.srep.midpoint.abs_diff(g.srep.midpoint) == 1 << 24
                                && t.srep.radius == g.srep.radius
                        }
                    };
                    assert!(changed, "{at} {kind:?}: not the value named");
                    let e = verify_reply(req, &greased[..m], &pk, &policy()).unwrap_err();
                    let named = match (kind, e) {
                        (Grease::Signature | Grease::Time, VerifyError::BadSignature { which }) => {
                            which == Signed::Srep
                        }
                        (Grease::Certificate, VerifyError::BadSignature { which }) => {
                            which == Signed::Cert
                        }
                        (Grease::Path, VerifyError::NotInTree { .. }) => size > 1,
                        (Grease::Path | Grease::Index, VerifyError::Path(e)) => {
                            matches!(e, PathError::IndexTooLarge { .. })
                                && (kind == Grease::Index || size == 1)
                        }
                        (Grease::Nonce, VerifyError::NonceMismatch) => true,
                        _ => false,
                    };
                    assert!(named, "{at} {kind:?}: rejected for another reason: {e}");
                }
            }
        }
    }
    assert!(!Grease::kinds(Version::Google).contains(&Grease::Nonce));
}

/// Requests of every version in one batch: one tree and one signature per family.
#[test]
fn mixed_batches_sign_once_per_family() {
    let s = server();
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::ALL,
        capacity: 64,
    });
    let offers: [&[Version]; 7] = [
        &[Version::Rfc10049],
        &[Version::Draft12],
        &[Version::Draft11, Version::Draft08],
        &[Version::Google],
        &[Version::Draft09],
        &[Version::Rfc10049, Version::Draft12],
        &[Version::Draft07],
    ];
    let pk = s.long.public_key();
    for n in 1..=64u32 {
        let requests: Vec<Vec<u8>> = (0..n)
            .map(|i| request(offers[i as usize % offers.len()], n * 100 + i, None))
            .collect();
        let replies = answer(&mut responder, &s, &requests);
        let mut signatures = BTreeSet::new();
        let mut families = BTreeSet::new();
        for (i, (req, reply)) in requests.iter().zip(&replies).enumerate() {
            let reply = reply.as_ref().unwrap();
            let v = verify_reply(req, reply, &pk, &policy())
                .unwrap_or_else(|e| panic!("n={n} i={i}: {e}"));
            let expected = *offers[i % offers.len()].iter().max().unwrap();
            assert_eq!(v.version, expected);
            signatures.insert(sig_of(reply));
            families.insert(v.version.family());
        }
        assert_eq!(signatures.len(), families.len(), "n={n}");
    }
}

/// Offers with one version each, so that the unsigned top-level VER of drafts 08–11 cannot be
/// flipped into another offered version: that field is malleable by design of those drafts, and
/// the only thing a client can check is that it was offered.
const SINGLE_OFFERS: [Version; 8] = [
    Version::Rfc10049,
    Version::Draft12,
    Version::Draft11,
    Version::Draft10,
    Version::Draft09,
    Version::Draft08,
    Version::Draft07,
    Version::Google,
];

/// Every bit of two replies per version, flipped in turn, fails verification: the middle one of
/// a batch of three, and the last, whose sibling at the first level is the padding of an odd
/// level (paired with itself, it let INDX's low bit flip unnoticed).
#[test]
fn every_flipped_bit_of_a_reply_fails() {
    let s = server();
    let mut responder = Responder::new(ResponderConfig::default());
    let pk = s.long.public_key();
    for version in SINGLE_OFFERS {
        // Three requests so that PATH is not empty and the first level is odd.
        let requests: Vec<Vec<u8>> = (0..3).map(|i| request(&[version], i, None)).collect();
        let replies = answer(&mut responder, &s, &requests);
        for i in [1, 2] {
            let reply = replies[i].as_ref().unwrap();
            verify_reply(&requests[i], reply, &pk, &policy()).unwrap();
            for bit in 0..reply.len() * 8 {
                let mut flipped = reply.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    verify_reply(&requests[i], &flipped, &pk, &policy()).is_err(),
                    "{version}, reply {i}: flipping bit {bit} still verifies"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any single flipped bit in any reply of a random batch fails verification.
    #[test]
    fn flipped_bit_fails(
        version in prop::sample::select(SINGLE_OFFERS.to_vec()),
        n in 1u32..=20,
        index in any::<prop::sample::Index>(),
        bit in any::<prop::sample::Index>(),
    ) {
        let s = server();
        let mut responder = Responder::new(ResponderConfig::default());
        let requests: Vec<Vec<u8>> = (0..n).map(|i| request(&[version], i, None)).collect();
        let replies = answer(&mut responder, &s, &requests);
        let i = index.index(n as usize);
        let reply = replies[i].as_ref().unwrap();
        let bit = bit.index(reply.len() * 8);
        let mut flipped = reply.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let pk = s.long.public_key();
        prop_assert!(verify_reply(&requests[i], &flipped, &pk, &policy()).is_err());
    }

    /// Random datagrams among valid requests: no panic, valid requests still answered, and any
    /// datagram that is answered gets a reply no longer than itself that verifies.
    #[test]
    fn hostile_requests_never_panic(
        noise in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..1400), 1..8),
    ) {
        let s = server();
        let mut responder = Responder::new(ResponderConfig::default());
        let mut requests = vec![request(&[Version::Rfc10049], 1, None)];
        requests.extend(noise);
        let replies = answer(&mut responder, &s, &requests);
        prop_assert!(replies[0].is_some());
        for (req, reply) in requests.iter().zip(&replies) {
            if let Some(reply) = reply {
                prop_assert!(reply.len() <= req.len());
                prop_assert!(verify_reply(req, reply, &s.long.public_key(), &policy()).is_ok());
            }
        }
    }

    /// Valid requests of every version with random bytes overwritten, cut or appended: no panic,
    /// and whatever is still answered verifies against the mutated request.
    #[test]
    fn mutated_requests_never_panic(
        version in prop::sample::select(SINGLE_OFFERS.to_vec()),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in prop::option::of(0usize..1100),
        extra in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let s = server();
        let mut responder = Responder::new(ResponderConfig::default());
        let mut req = request(&[version], 7, Some(&s.long.srv()));
        for (at, byte) in &edits {
            let i = at.index(req.len());
            req[i] = *byte;
        }
        if let Some(cut) = cut {
            req.truncate(cut);
        }
        req.extend_from_slice(&extra);
        let replies = answer(&mut responder, &s, std::slice::from_ref(&req));
        if let Some(reply) = &replies[0] {
            prop_assert!(reply.len() <= req.len());
            prop_assert!(verify_reply(&req, reply, &s.long.public_key(), &policy()).is_ok());
        }
    }

    /// Random bytes as a reply, and valid replies with random damage: the verifier never panics
    /// and never accepts damage.
    #[test]
    fn hostile_replies_never_panic(
        version in prop::sample::select(SINGLE_OFFERS.to_vec()),
        noise in prop::collection::vec(any::<u8>(), 0..700),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(0usize..700),
    ) {
        let s = server();
        let pk = s.long.public_key();
        let req = request(&[version], 3, None);
        prop_assert!(verify_reply(&req, &noise, &pk, &policy()).is_err());

        let mut responder = Responder::new(ResponderConfig::default());
        let reply = answer(&mut responder, &s, std::slice::from_ref(&req))[0].clone().unwrap();
        let mut damaged = reply.clone();
        for (at, byte) in &edits {
            let i = at.index(damaged.len());
            damaged[i] = *byte;
        }
        if let Some(cut) = cut {
            damaged.truncate(cut);
        }
        let result = verify_reply(&req, &damaged, &pk, &policy());
        if damaged != reply {
            prop_assert!(result.is_err());
        }
    }
}

/// A delegation bundle made where the long-term key lives, written out and read back as a server
/// would (no long-term private key): every window signs replies that verify under the long-term
/// public key in every version, each with the window's own online key.
#[test]
fn every_window_of_a_bundle_answers_every_version_verifiably() {
    let long = LongTermKey::from_seed(&[0x11; 32]);
    let plan = chime_roughtime::BundlePlan {
        start_unix_s: NOW_S - 86_400,
        span_s: 3 * 86_400,
        step_s: 86_400,
        window_s: 2 * 86_400,
    };
    let mut n = 0u8;
    let made = chime_roughtime::make_bundle(&long, plan, || {
        n += 1;
        [n; 32]
    })
    .unwrap();
    let bundle = chime_roughtime::Bundle::parse(&made.encode()).unwrap();
    let pk = long.public_key();
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::ALL,
        capacity: 8,
    });
    let mut online_keys = BTreeSet::new();
    for window in bundle.windows() {
        let s = Server {
            long: long.clone(),
            delegation: window.clone(),
        };
        // Each window answers at a time it covers.
        let at = window.mint_unix_s() + 3600;
        let mut p = params(&s.delegation);
        p.now_unix_us = at * 1_000_000;
        for (i, v) in Version::ALL.into_iter().enumerate() {
            let req = request(&[v], i as u32, None);
            let mut buf = [0u8; 1100];
            let mut exchanges = [Exchange::new(&req, &mut buf)];
            responder.respond(p, &mut exchanges);
            let reply = exchanges[0]
                .reply_bytes()
                .unwrap_or_else(|| panic!("{v:?} dropped"))
                .to_vec();
            let policy = VerifyPolicy::new(10_000_000);
            verify_reply(&req, &reply, &pk, &policy)
                .unwrap_or_else(|e| panic!("window from {}: {v:?}: {e}", window.mint_unix_s()));
        }
        online_keys.insert(window.online_public_key());
    }
    assert_eq!(online_keys.len(), bundle.windows().len());
}
