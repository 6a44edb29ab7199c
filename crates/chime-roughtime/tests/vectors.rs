//! Known-answer tests against the vectors captured from independent implementations
//! (testdata/README.md says where each comes from), checked in both directions: our parser and
//! verifier accept what they sent, and what our server sends verifies.

mod common;

use std::collections::BTreeMap;

use chime_roughtime::{
    BatchParams, ContextSpelling, DraftSpelling, DropReason, Exchange, Family, Link, LongTermKey,
    OnlineKey, Reply, Request, Responder, ResponderConfig, Signed, VerifyError, VerifyPolicy,
    Version, VersionSet, verify_chain, verify_reply,
};
use common::*;

/// Radius cap for replies from servers whose clock was unsynchronised (roughtimed sends
/// 0xffffffff seconds): the point of these tests is the cryptography, not the cap.
const ANY_RADIUS: u64 = u64::MAX;

fn all_captured_with_replies() -> Vec<Captured> {
    let mut all = json_exchanges();
    all.extend(fixture_exchanges());
    all.extend(pcap_exchanges().into_iter().filter(|c| c.reply.is_some()));
    all
}

#[test]
fn parser_accepts_every_captured_packet() {
    let mut requests = vec![read("rfc-request.SRV.417aa962")];
    let mut replies = vec![read("rfc-response.path8.index2.4c16c619")];
    let mut captured = json_exchanges();
    captured.extend(fixture_exchanges());
    captured.extend(pcap_exchanges());
    captured.extend(appendix_b().into_iter().map(|(c, _)| c));
    for c in captured {
        requests.push(c.request);
        replies.extend(c.reply);
    }
    for (i, r) in requests.iter().enumerate() {
        Request::parse(r).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    for (i, r) in replies.iter().enumerate() {
        Reply::parse(r).unwrap_or_else(|e| panic!("reply {i}: {e}"));
    }
    // 44 from the JSON captures, 35 from the pcap, 2 + 1 fixtures, 3 from Appendix B.
    assert_eq!(requests.len(), 85);
    // 44 + 19 + 2 + 1 + 3.
    assert_eq!(replies.len(), 69);
}

#[test]
fn verifier_verifies_every_captured_reply() {
    let policy = VerifyPolicy::new(ANY_RADIUS);
    let mut per_version = BTreeMap::new();
    for c in all_captured_with_replies() {
        let reply = c.reply.as_deref().unwrap();
        let pk = c.public_key.unwrap();
        let v = verify_reply(&c.request, reply, &pk, &policy)
            .unwrap_or_else(|e| panic!("{}: {e}", c.origin));
        assert!(v.spelling_conforms(), "{}", c.origin);
        *per_version.entry(v.version).or_insert(0) += 1;
    }
    // Google: tannerryan and Cloudflare's test server in the pcap. Draft 11: the same two.
    // 0x8000000c: 3 single captures, 24 burst replies, 1 fixture, 12 in the pcap. Version 1: 1
    // single capture, 16 burst replies, 1 fixture, 2 in the pcap.
    let expected = BTreeMap::from([
        (Version::Google, 2),
        (Version::Draft11, 3),
        (Version::Draft12, 40),
        (Version::Rfc10049, 20),
    ]);
    assert_eq!(per_version, expected);
}

#[test]
fn verified_values_match_the_documented_ones() {
    let policy = VerifyPolicy::new(ANY_RADIUS);
    for e in json("captured-single.json").as_array().unwrap() {
        let server = str_field(e, "server");
        let v = verify_reply(
            &hex(str_field(e, "request_hex")),
            &hex(str_field(e, "response_hex")),
            &hex32(str_field(e, "root_public_key_hex")),
            &policy,
        )
        .unwrap();
        assert_eq!(
            v.version.number(),
            Some(u32::from_str_radix(&str_field(e, "ver")[2..], 16).unwrap()),
            "{server}"
        );
        assert_eq!(v.midpoint_unix_us, u64_field(e, "midp") * 1_000_000);
        assert_eq!(v.radius_us, u64_field(e, "radi") * 1_000_000);
        assert_eq!(v.mint_unix_us, u64_field(e, "mint") * 1_000_000);
        assert_eq!(v.maxt_unix_us, u64_field(e, "maxt") * 1_000_000);
        assert_eq!(v.online_key.to_vec(), hex(str_field(e, "online_pubk")));
        let spelling = match str_field(e, "ctx") {
            "RoughTime" => ContextSpelling::RoughTime,
            "Roughtime" => ContextSpelling::Roughtime,
            other => panic!("{other}"),
        };
        assert_eq!((v.cert_spelling, v.srep_spelling), (spelling, spelling));
    }
}

#[test]
fn radius_cap_rejects_roughtimed_unsynchronised_reply() {
    let c = &json_exchanges()[0];
    assert!(c.origin.contains("roughtimed"));
    let err = verify_reply(
        &c.request,
        c.reply.as_deref().unwrap(),
        &c.public_key.unwrap(),
        &VerifyPolicy::new(10_000_000),
    )
    .unwrap_err();
    assert_eq!(
        err,
        VerifyError::RadiusTooLarge {
            radius_us: u64::from(u32::MAX) * 1_000_000,
            max_us: 10_000_000
        }
    );
}

#[test]
fn appendix_b_verifies_only_with_the_draft_spelling() {
    for (c, _) in appendix_b() {
        let reply = c.reply.as_deref().unwrap();
        let pk = c.public_key.unwrap();
        let strict = verify_reply(&c.request, reply, &pk, &VerifyPolicy::new(ANY_RADIUS));
        assert_eq!(
            strict,
            Err(VerifyError::DraftSpellingOnly {
                which: Signed::Cert
            }),
            "{}",
            c.origin
        );
        let message = strict.unwrap_err().to_string();
        assert!(message.contains("\"RoughTime v1"), "{message}");

        let lenient = VerifyPolicy::new(ANY_RADIUS).accepting_draft_spelling();
        assert_eq!(lenient.v1_draft_spelling, DraftSpelling::Accept);
        let v = verify_reply(&c.request, reply, &pk, &lenient).unwrap();
        assert_eq!(v.version, Version::Rfc10049);
        assert_eq!(v.cert_spelling, ContextSpelling::RoughTime);
        assert_eq!(v.srep_spelling, ContextSpelling::RoughTime);
        assert!(!v.spelling_conforms());
    }
}

#[test]
fn appendix_b_is_a_valid_chain_with_a_contradiction() {
    let b = appendix_b();
    let links: Vec<Link<'_>> = b
        .iter()
        .map(|(c, rand)| Link {
            public_key: c.public_key.unwrap(),
            rand: *rand,
            request: &c.request,
            reply: c.reply.as_deref().unwrap(),
        })
        .collect();
    let policy = VerifyPolicy::new(ANY_RADIUS).accepting_draft_spelling();
    let report = verify_chain(&links, &policy).unwrap();
    assert!(!report.is_consistent());
    // The first server's interval lies a day after the other two.
    let pairs: Vec<(usize, usize)> = report
        .contradictions
        .iter()
        .map(|c| (c.earlier, c.later))
        .collect();
    assert_eq!(pairs, [(0, 1), (0, 2)]);

    let mut tampered = links.clone();
    let mut rand = tampered[2].rand.unwrap();
    rand[0] ^= 1;
    tampered[2].rand = Some(rand);
    assert_eq!(
        verify_chain(&tampered, &policy).unwrap_err(),
        chime_roughtime::ChainError::BrokenLink {
            index: 2,
            previous: 1
        }
    );
}

/// roughtimed's exchange from its published key material: long-term seed, delegate seed, CERT,
/// MIDP and RADI. Ed25519 is deterministic, so our certificate and reply must equal its bytes.
#[test]
fn reproduces_roughtimed_byte_for_byte() {
    let entry = &json("captured-single.json")[0];
    assert!(str_field(entry, "server").starts_with("roughtimed"));
    let long = LongTermKey::from_seed(&hex32(str_field(entry, "root_seed_hex")));
    let online = OnlineKey::from_seed(&b64_32(str_field(entry, "online_private_key_b64")));
    let delegation = long
        .delegate(online, u64_field(entry, "mint"), u64_field(entry, "maxt"))
        .unwrap();
    assert_eq!(
        delegation.certificate(Family::Draft12).as_bytes().to_vec(),
        b64(str_field(entry, "cert_b64")),
        "CERT"
    );

    let mut exchanges = vec![(
        hex(str_field(entry, "request_hex")),
        hex(str_field(entry, "response_hex")),
        u64_field(entry, "midp"),
        u64_field(entry, "radi"),
    )];
    // The first reply of the burst was signed alone, so it is reproducible too.
    let burst_json = json("roughtimed-batch16-0x8000000c.json");
    let burst_all = burst_json.as_array().unwrap();
    let burst = &burst_all[0];
    exchanges.push((
        hex(str_field(burst, "request_hex")),
        hex(str_field(burst, "response_hex")),
        0x6b01_e0e5,
        u64::from(u32::MAX),
    ));

    // roughtimed speaks only 0x8000000c, so its VERS is [0x8000000c].
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::EMPTY.with(Version::Draft12),
        capacity: 1,
    });
    for (request, expected, midp, radi) in exchanges {
        let mut reply = [0u8; 1024];
        let mut ex = [Exchange::new(&request, &mut reply)];
        responder.respond(
            BatchParams {
                now_unix_us: midp * 1_000_000,
                radius_us: radi * 1_000_000,
                delegation: &delegation,
            },
            &mut ex,
        );
        assert_eq!(ex[0].reply_bytes(), Some(&expected[..]));
    }

    // The other 15 share one tree of 15 leaves, whose odd levels roughtimed pads with the zero
    // hash as we do: answered in one batch, in capture order, every reply is roughtimed's.
    let requests: Vec<Vec<u8>> = burst_all[1..]
        .iter()
        .map(|e| hex(str_field(e, "request_hex")))
        .collect();
    let mut buffers = vec![[0u8; 1024]; requests.len()];
    let mut batch: Vec<Exchange<'_>> = requests
        .iter()
        .zip(buffers.iter_mut())
        .map(|(r, b)| Exchange::new(r, b))
        .collect();
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::EMPTY.with(Version::Draft12),
        capacity: 16,
    });
    responder.respond(
        BatchParams {
            now_unix_us: 0x6b01_e0e5 * 1_000_000,
            radius_us: u64::from(u32::MAX) * 1_000_000,
            delegation: &delegation,
        },
        &mut batch,
    );
    for (i, (ex, entry)) in batch.iter().zip(&burst_all[1..]).enumerate() {
        let expected = hex(str_field(entry, "response_hex"));
        assert_eq!(
            ex.reply_bytes(),
            Some(&expected[..]),
            "burst reply {}",
            i + 1
        );
    }
}

/// Every captured request, answered by our server in one mixed-version batch; every reply
/// verifies with our verifier, and the requests naming other keys are dropped.
#[test]
fn our_replies_to_captured_requests_verify() {
    let long = LongTermKey::from_seed(&hex32(INTEROP_SEED_HEX));
    let now_s = 0x6b01_e0e5;
    let delegation = long
        .delegate(OnlineKey::from_seed(&[0x42; 32]), now_s - 60, now_s + 60)
        .unwrap();
    let mut captured = json_exchanges();
    captured.extend(pcap_exchanges());
    captured.extend(fixture_exchanges());
    captured.extend(appendix_b().into_iter().map(|(c, _)| c));
    captured.push(Captured {
        origin: "rfc-request.SRV.417aa962".into(),
        request: read("rfc-request.SRV.417aa962"),
        reply: None,
        public_key: None,
    });

    let mut buffers = vec![[0u8; 1500]; captured.len()];
    let mut exchanges: Vec<Exchange<'_>> = captured
        .iter()
        .zip(buffers.iter_mut())
        .map(|(c, buf)| Exchange::new(&c.request, buf))
        .collect();
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::ALL,
        capacity: 256,
    });
    responder.respond(
        BatchParams {
            now_unix_us: now_s * 1_000_000 + 123_456,
            radius_us: 1_500_000,
            delegation: &delegation,
        },
        &mut exchanges,
    );

    let policy = VerifyPolicy::new(5_000_000);
    let mut per_version = BTreeMap::new();
    let mut dropped = BTreeMap::new();
    for (c, ex) in captured.iter().zip(&exchanges) {
        match ex.outcome().unwrap() {
            Ok(len) => {
                assert!(
                    len <= c.request.len(),
                    "{}: reply longer than request",
                    c.origin
                );
                let v = verify_reply(
                    &c.request,
                    ex.reply_bytes().unwrap(),
                    &long.public_key(),
                    &policy,
                )
                .unwrap_or_else(|e| panic!("{}: {e}", c.origin));
                assert!(v.spelling_conforms());
                assert!(v.earliest_unix_us() <= now_s * 1_000_000 + 123_456);
                assert!(v.latest_unix_us() >= now_s * 1_000_000 + 123_456);
                *per_version.entry(v.version).or_insert(0) += 1;
            }
            Err(reason) => *dropped.entry(reason).or_insert(0) += 1,
        }
    }
    // Appendix B and the SRV fixture name keys we do not have.
    assert_eq!(dropped, BTreeMap::from([(DropReason::UnknownServer, 4)]));
    // The pcap has seven requests per server (five servers): tannerryan's drafts 01–12 list,
    // Cloudflare's [0x8000000b, 0x80000008], Google, pyroughtime's 1036-byte 0x8000000c, version
    // 1, plain 0x8000000c, and [1, 0x8000000c]. The JSON files add 27 at 0x8000000c and 17 at
    // version 1, the fixtures one of each.
    let expected = BTreeMap::from([
        (Version::Google, 5),
        (Version::Draft11, 5),
        (Version::Draft12, 43),
        (Version::Rfc10049, 28),
    ]);
    assert_eq!(per_version, expected);
}

/// The path-8 fixture comes without its request and its long-term key is undocumented, so only
/// its structure and the online key's SREP signature can be checked.
#[test]
fn path8_fixture_checks_what_can_be_checked() {
    use ed25519_dalek::{Signature, VerifyingKey};

    let reply = read("rfc-response.path8.index2.4c16c619");
    let r = Reply::parse(&reply).unwrap();
    assert_eq!((r.path.len(), r.index), (8 * 32, 2));
    let online = VerifyingKey::from_bytes(r.cert.online_key).unwrap();
    let context = Family::Draft12.srep_context(ContextSpelling::RoughTime);
    let signed = [context, r.srep.bytes].concat();
    online
        .verify_strict(&signed, &Signature::from_bytes(r.signature))
        .unwrap();
    // INDX 2 with 8 hashes is a well-formed path; where it leads cannot be confirmed.
    let leaf = chime_roughtime::merkle::hash_leaf::<32>(b"request not shipped");
    assert!(chime_roughtime::merkle::root_from_path(leaf, r.index, r.path).is_ok());
}
