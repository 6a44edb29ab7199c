//! The NTS tests: the server's checks against requests made here, the records, and the client's
//! side against the server's.

use aes_siv::KeyInit;
use aes_siv::siv::Aes128Siv;

use super::fields::fields;
use super::*;
use crate::packet::{Header, Mode};
use crate::time::NtpTimestamp;

const C2S: [u8; KEY_LEN] = [0x11; KEY_LEN];
const S2C: [u8; KEY_LEN] = [0x22; KEY_LEN];

/// The cookie length of AEAD_AES_SIV_CMAC_256, which most tests here use.
const COOKIE_LEN: usize = cookie_len(Aead::AesSivCmac256);

fn keys() -> Keys {
    Keys::new(Protocol::NtpV4, Aead::AesSivCmac256, &C2S, &S2C).unwrap()
}

/// NTPv4 keys under `aead`, every byte of the client-to-server key `c2s` and of the other `s2c`.
fn filled(aead: Aead, c2s: u8, s2c: u8) -> Keys {
    let len = aead.key_len();
    Keys::new(Protocol::NtpV4, aead, &vec![c2s; len], &vec![s2c; len]).unwrap()
}

/// [`keys`], exported for the NTPv5 draft.
fn keys_v5() -> Keys {
    Keys::new(Protocol::NtpV5Draft, Aead::AesSivCmac256, &C2S, &S2C).unwrap()
}

fn master() -> CookieKeys {
    CookieKeys::new(7, [0x33; KEY_LEN])
}

fn field(out: &mut Vec<u8>, ty: u16, body: &[u8]) {
    out.extend_from_slice(&ty.to_be_bytes());
    out.extend_from_slice(&((4 + body.len()) as u16).to_be_bytes());
    out.extend_from_slice(body);
}

/// A request as chronyd makes one: header, unique identifier, cookie, `placeholders`
/// placeholders, authenticator over all of it under `c2s`.
fn request(cookie: &[u8], placeholders: usize, c2s: &[u8; KEY_LEN]) -> Vec<u8> {
    let mut p = vec![0u8; 48];
    Header::request(4, Mode::Client, NtpTimestamp(0x0102_0304_0506_0708))
        .encode((&mut p[..48]).try_into().unwrap());
    field(&mut p, ef::UNIQUE_IDENTIFIER, &[0xAB; 32]);
    field(&mut p, ef::COOKIE, cookie);
    for _ in 0..placeholders {
        field(&mut p, ef::COOKIE_PLACEHOLDER, &vec![0; cookie.len()]);
    }
    authenticate(&mut p, c2s);
    p
}

/// Appends an authenticator over all of `p` under `c2s`, with no encrypted fields, as chronyd
/// and ntpd-rs make them (AES-SIV, the tag first).
fn authenticate(p: &mut Vec<u8>, c2s: &[u8; KEY_LEN]) {
    let nonce = [0x44u8; NONCE_LEN];
    let mut siv = Aes128Siv::new(c2s.into());
    let tag = siv
        .encrypt_in_place_detached([&p[..], &nonce[..]], &mut [])
        .unwrap();
    let mut body = Vec::new();
    body.extend_from_slice(&(NONCE_LEN as u16).to_be_bytes());
    body.extend_from_slice(&(TAG_LEN as u16).to_be_bytes());
    body.extend_from_slice(&nonce);
    body.extend_from_slice(&tag);
    field(p, ef::AUTHENTICATOR, &body);
}

/// What a client makes of the reply: the identifier must match, the authenticator verify
/// under `s2c`, and the cookies come out of its ciphertext.
fn client_reads(reply: &[u8], uid: &[u8]) -> Vec<Vec<u8>> {
    let fs: Vec<_> = fields(reply).collect();
    assert_eq!(fs.len(), 2, "identifier and authenticator");
    assert_eq!(fs[0].ty, ef::UNIQUE_IDENTIFIER);
    assert_eq!(&reply[fs[0].body.clone()], uid);
    let auth = &fs[1];
    assert_eq!((auth.ty, auth.body.end), (ef::AUTHENTICATOR, reply.len()));
    let uid: &[u8; 32] = uid.try_into().unwrap();
    match client_check_reply(reply, uid, &keys()) {
        Ok(ClientReply::Authentic(cookies)) => cookies,
        other => panic!("the reply does not verify as a client reads it: {other:?}"),
    }
}

fn reply_to(req: &[u8], m: &CookieKeys) -> (Vec<u8>, usize) {
    let Check::Verified(v) = check_request(req, m) else {
        panic!("not verified");
    };
    let mut reply = vec![0u8; req.len()];
    let mut server = Header::request(4, Mode::Server, NtpTimestamp(9));
    server.stratum = 2;
    server.encode((&mut reply[..48]).try_into().unwrap());
    let mut n = 0u8;
    let len = write_response(&mut reply, req, &v, [0x55; NONCE_LEN], || {
        n += 1;
        m.seal(&keys(), [n; NONCE_LEN])
    })
    .unwrap();
    (reply, len)
}

/// A cookie under `master()` as [`CookieKeys::seal`] lays one out, naming `protocol_id` in the
/// two bytes after the algorithm (zero, padding, in cookies made before NTPv5).
fn cookie_naming(protocol_id: u16) -> Vec<u8> {
    let (id, nonce) = (7u32.to_be_bytes(), [9u8; NONCE_LEN]);
    let mut body = Vec::new();
    body.extend_from_slice(&Aead::AesSivCmac256.id().to_be_bytes());
    body.extend_from_slice(&protocol_id.to_be_bytes());
    body.extend_from_slice(&C2S);
    body.extend_from_slice(&S2C);
    let mut siv = Aes128Siv::new((&[0x33; KEY_LEN]).into());
    let tag = siv
        .encrypt_in_place_detached([&id[..], &nonce[..]], &mut body)
        .unwrap();
    [&id[..], &nonce, &tag, &body].concat()
}

/// A cookie carries the protocol its keys were exported for (RFC 8915 §5.1 keeps them apart): a
/// request of the other protocol gets a NAK, as if the cookie had not opened. A cookie of before
/// NTPv5 (those bytes zero) opens as NTPv4's; one naming a protocol unknown here does not open.
#[test]
fn a_cookie_serves_only_the_protocol_its_keys_were_exported_for() {
    let m = master();
    let v4 = m.seal(&keys(), [1; NONCE_LEN]);
    let v5 = m.seal(&keys_v5(), [2; NONCE_LEN]);
    assert_eq!(m.open(&v4), Some(keys()));
    assert_eq!(m.open(&v5), Some(keys_v5()));
    assert_eq!(
        m.open(&cookie_naming(0)),
        Some(keys()),
        "a cookie of before"
    );
    assert_eq!(m.open(&cookie_naming(0x8001)), Some(keys_v5()));
    assert_eq!(m.open(&cookie_naming(1)), None, "no protocol 1 here");
    let verified = |c: &Check| matches!(c, Check::Verified(_));
    let nak = |c: &Check| matches!(c, Check::Nak(_, NakReason::OtherProtocol));
    assert!(verified(&check_request(&request(&v4, 0, &C2S), &m)));
    assert!(nak(&check_request(&request(&v5, 0, &C2S), &m)));
    assert!(verified(&check_request_v5(&request_v5(&v5, 0, &C2S), &m)));
    assert!(nak(&check_request_v5(&request_v5(&v4, 0, &C2S), &m)));
}

#[test]
fn cookies_open_under_the_current_and_previous_key_only() {
    let m = master();
    let sealed = m.seal(&keys(), [1; NONCE_LEN]);
    let cookie: [u8; COOKIE_LEN] = sealed.as_bytes().try_into().unwrap();
    assert_eq!(cookie.len() % 4, 0);
    assert_eq!(m.open(&cookie), Some(keys()));
    let r1 = m.rotated(8, [0x66; KEY_LEN], 1);
    assert_eq!(
        r1.open(&cookie),
        Some(keys()),
        "the previous key still opens"
    );
    assert_ne!(
        r1.seal(&keys(), [1; NONCE_LEN]).as_bytes()[..4],
        cookie[..4]
    );
    let r2 = r1.rotated(9, [0x77; KEY_LEN], 1);
    assert_eq!(r2.open(&cookie), None, "two rotations later it does not");
    for i in 0..COOKIE_LEN {
        let mut bad = cookie;
        bad[i] ^= 1;
        assert_eq!(m.open(&bad), None, "flipped byte {i} still opened");
    }
    assert_eq!(m.open(&cookie[1..]), None);
}

/// With `kept` earlier keys, a cookie opens for `kept` rotations after the one it was sealed in,
/// and not one more; the set never holds more than `kept` besides the current key.
#[test]
fn a_cookie_opens_for_as_many_rotations_as_keys_are_kept() {
    for kept in [1, 3, 21] {
        let mut m = master();
        let cookie = m.seal(&keys(), [2; NONCE_LEN]);
        for rotation in 1..=kept + 1 {
            m = m.rotated(100 + rotation as u32, [rotation as u8; KEY_LEN], kept);
            let opened = m.open(&cookie);
            assert_eq!(
                opened.is_some(),
                rotation <= kept,
                "kept {kept}, rotation {rotation}"
            );
            assert!(m.kept().len() <= kept);
        }
        let why = m.open_or_why(&cookie);
        assert_eq!(why.err(), Some(NakReason::UnknownKey), "kept {kept}");
    }
    // The most recent first, as a saved file lists them, and back.
    let m = master()
        .rotated(1, [1; KEY_LEN], 5)
        .rotated(2, [2; KEY_LEN], 5);
    let ids: Vec<u32> = m.kept().map(|(id, _)| id).collect();
    assert_eq!(ids, [1, master().current_id()]);
    let back = CookieKeys::from_parts(m.current(), m.kept());
    assert_eq!(back.open(&m.seal(&keys(), [3; NONCE_LEN])), Some(keys()));
}

fn secret(fill: u8) -> FleetSecret {
    FleetSecret([fill; FLEET_SECRET_LEN])
}

/// Known answers, computed apart from this code with Python's hmac and hashlib (RFC 5869's
/// HKDF-Extract and -Expand by hand): secret 00 01 02 .. 1f, periods 20415 and 0.
#[test]
fn fleet_keys_match_an_independent_hkdf() {
    let secret = FleetSecret(std::array::from_fn(|i| i as u8));
    let (id, key) = fleet_key(&secret, 20415);
    assert_eq!(id, 0x85c3_1154);
    assert_eq!(
        hex::encode(key),
        "d4001d5f606e5a1f95161924f8c5a32fde120906ad429fead320e13e7ced1902"
    );
    let (id, key) = fleet_key(&secret, 0);
    assert_eq!(id, 0x5382_5973);
    assert_eq!(
        hex::encode(key),
        "b262e57f85276692a13652e1691101588a04eb5a7d971f0c65299b843dd381e9"
    );
}

#[test]
fn members_derive_equal_keys_from_equal_secrets_and_periods_only() {
    let (a, b) = (secret(1), secret(1));
    assert_eq!(fleet_key(&a, 7), fleet_key(&b, 7));
    assert_ne!(fleet_key(&a, 7), fleet_key(&a, 8));
    assert_ne!(fleet_key(&a, 7), fleet_key(&secret(2), 7));
    let one = CookieKeys::for_fleet(&a, None, 100, 1);
    let other = CookieKeys::for_fleet(&b, None, 100, 1);
    assert_eq!(one.current(), other.current());
    assert_eq!(one.current(), fleet_key(&a, 100));
}

proptest::proptest! {
    /// Two members' keys agree exactly when their secrets and periods do (the second secret
    /// and period are the first's half the time, so that both sides are tried).
    #[test]
    fn fleet_keys_agree_exactly_when_secret_and_period_do(
        a: [u8; FLEET_SECRET_LEN],
        b: [u8; FLEET_SECRET_LEN],
        p: u64,
        q: u64,
        same_secret: bool,
        same_period: bool,
    ) {
        let b = if same_secret { a } else { b };
        let q = if same_period { p } else { q };
        let (ka, kb) = (fleet_key(&FleetSecret(a), p), fleet_key(&FleetSecret(b), q));
        proptest::prop_assert_eq!(ka == kb, a == b && p == q);
        proptest::prop_assert_eq!(ka.0 == kb.0, a == b && p == q);
    }
}

/// A cookie one member seals opens at any other member whose period is the same, one before,
/// or up to `kept` after; further apart, or under another secret, it does not.
#[test]
fn a_fleet_cookie_opens_across_members_for_the_kept_periods() {
    let s = secret(9);
    for kept in [1, 7] {
        let cookie = CookieKeys::for_fleet(&s, None, 1000, kept).seal(&keys(), [3; NONCE_LEN]);
        for period in 999..=1000 + kept as u64 {
            let member = CookieKeys::for_fleet(&s, None, period, kept);
            assert_eq!(
                member.open(&cookie),
                Some(keys()),
                "kept {kept}, period {period}"
            );
        }
        for period in [998, 1001 + kept as u64] {
            let member = CookieKeys::for_fleet(&s, None, period, kept);
            assert_eq!(member.open(&cookie), None, "kept {kept}, period {period}");
        }
        assert_eq!(
            CookieKeys::for_fleet(&secret(8), None, 1000, kept).open(&cookie),
            None
        );
    }
    // Period 0 has no period before it; it still opens its own and the next.
    let first = CookieKeys::for_fleet(&s, None, 0, 3);
    assert_eq!(
        first.open(&first.seal(&keys(), [4; NONCE_LEN])),
        Some(keys())
    );
}

/// Replacing the fleet secret: members holding the new one with the old beside it seal under
/// the new and open cookies of both, so a member still on the old secret, or a client's cookie
/// from before, is not cut off.
#[test]
fn a_new_fleet_secret_opens_the_old_ones_cookies_while_both_are_held() {
    let (old, new) = (secret(1), secret(2));
    let by_old = CookieKeys::for_fleet(&old, None, 50, 1).seal(&keys(), [5; NONCE_LEN]);
    let both = CookieKeys::for_fleet(&new, Some(&old), 50, 1);
    assert_eq!(both.current(), fleet_key(&new, 50));
    assert_eq!(both.open(&by_old), Some(keys()));
    let next_period_old = CookieKeys::for_fleet(&old, None, 51, 1).seal(&keys(), [6; NONCE_LEN]);
    assert_eq!(both.open(&next_period_old), Some(keys()));
    let by_new = both.seal(&keys(), [7; NONCE_LEN]);
    assert_eq!(
        CookieKeys::for_fleet(&new, None, 50, 1).open(&by_new),
        Some(keys())
    );
    // Once the old secret is dropped, its cookies no longer open.
    assert_eq!(CookieKeys::for_fleet(&new, None, 50, 1).open(&by_old), None);
}

#[test]
fn fleet_files_round_trip_and_bad_ones_name_the_line() {
    let s = FleetSecret(std::array::from_fn(|i| (i * 7) as u8));
    let text = encode_fleet_file(&s);
    assert_eq!(parse_fleet_file(&text), Ok((s.clone(), None)));
    let old = secret(0xAB);
    let both = format!("{}previous {}\n", &*text, "ab".repeat(32));
    assert_eq!(parse_fleet_file(&both), Ok((s.clone(), Some(old))));
    for (bad, says) in [
        ("", "empty: no key line, only blank lines and comments"),
        (
            "# comments only\n\n",
            "empty: no key line, only blank lines and comments",
        ),
        ("secret 00\n", "line 1: the secret is 2 hex digits, not 64"),
        (
            &format!("secret {}\n", "zz".repeat(32)),
            "line 1: the secret is not hex digits",
        ),
        (
            &format!("secret {} 00\n", "00".repeat(32)),
            "line 1: trailing junk after the secret",
        ),
        (
            &format!("\nsecret {h}\nsecret {h}\n", h = "00".repeat(32)),
            "line 3: a second `secret` line",
        ),
        (
            &format!("previous {}\n", "00".repeat(32)),
            "no `secret` line",
        ),
        (
            "key 00\n",
            "line 1: expected `secret HEX` or `previous HEX`",
        ),
        (
            &format!("secret {h}\nprevious {h}\n", h = "01".repeat(32)),
            "`previous` is the same as `secret`",
        ),
    ] {
        let e = parse_fleet_file(bad).map(|_| ()).unwrap_err();
        assert_eq!(e.to_string(), says, "{bad:?}");
    }
}

#[test]
fn a_request_gets_an_authentic_reply_as_long_as_itself_with_fresh_cookies() {
    let m = master();
    for placeholders in [0, 1, 3, 7, 9] {
        let req = request(&m.seal(&keys(), [2; NONCE_LEN]), placeholders, &C2S);
        let (reply, len) = reply_to(&req, &m);
        assert_eq!(len, req.len(), "exactly the request's length");
        let cookies = client_reads(&reply, &[0xAB; 32]);
        assert_eq!(cookies.len(), (1 + placeholders).min(8));
        for c in &cookies {
            assert_eq!(m.open(c), Some(keys()));
        }
    }
}

#[test]
fn a_short_request_gets_fewer_cookies_never_a_longer_reply() {
    let m = master();
    // A request whose placeholders are shorter than the cookies: they cannot all be replaced.
    let mut req = request(&m.seal(&keys(), [2; NONCE_LEN]), 0, &C2S);
    let (reply, len) = reply_to(&req, &m);
    assert_eq!(
        (len, client_reads(&reply, &[0xAB; 32]).len()),
        (req.len(), 1)
    );
    // Cut room: a reply buffer of 48 + identifier + a cookieless authenticator only.
    req.truncate(req.len());
    let Check::Verified(v) = check_request(&req, &m) else {
        panic!()
    };
    let mut small = vec![0u8; 48 + 36 + 40];
    let len = write_response(&mut small, &req, &v, [0; NONCE_LEN], || unreachable!()).unwrap();
    assert_eq!(len, small.len());
    let mut tiny = vec![0u8; 48 + 36 + 39];
    assert_eq!(
        write_response(&mut tiny, &req, &v, [0; NONCE_LEN], || unreachable!()),
        None
    );
}

#[test]
fn every_nak_reason_has_its_index_and_a_label_of_its_own() {
    for (i, why) in NakReason::ALL.into_iter().enumerate() {
        assert_eq!(why.index(), i, "{why:?}");
    }
    let labels: std::collections::BTreeSet<_> = NakReason::ALL.map(NakReason::label).into();
    assert_eq!(labels.len(), NakReason::ALL.len());
    for (i, protocol) in Protocol::ALL.into_iter().enumerate() {
        assert_eq!(protocol.index(), i, "{protocol:?}");
        assert_eq!(Protocol::from_id(protocol.id()), Some(protocol));
    }
}

#[test]
fn bad_cookies_and_forged_authenticators_get_a_nak() {
    let m = master();
    let other = CookieKeys::new(99, [0x99; KEY_LEN]);
    let req = request(&other.seal(&keys(), [2; NONCE_LEN]), 1, &C2S);
    let Check::Nak(uid, NakReason::UnknownKey) = check_request(&req, &m) else {
        panic!("foreign cookie")
    };
    let mut reply = vec![0u8; req.len()];
    Header::request(4, Mode::Server, NtpTimestamp(9))
        .encode((&mut reply[..48]).try_into().unwrap());
    let len = write_nak(&mut reply, &req, uid).unwrap();
    assert_eq!(len, 48 + 36);
    let h = Header::parse(&reply).unwrap();
    assert_eq!((h.stratum, h.reference_id), (0, *b"NTSN"));
    assert_eq!(&reply[52..len], &[0xAB; 32]);

    let forged = request(&m.seal(&keys(), [2; NONCE_LEN]), 1, &[0x12; KEY_LEN]);
    assert!(matches!(
        check_request(&forged, &m),
        Check::Nak(_, NakReason::Forged)
    ));
    // A cookie under a key held here, one byte of it changed: not a cookie sealed here.
    let mut changed = m.seal(&keys(), [2; NONCE_LEN]).to_vec();
    changed[COOKIE_LEN - 1] ^= 1;
    assert!(matches!(
        check_request(&request(&changed, 1, &C2S), &m),
        Check::Nak(_, NakReason::BadCookie)
    ));
}

#[test]
fn any_changed_byte_of_a_request_is_refused() {
    let m = master();
    let req = request(&m.seal(&keys(), [2; NONCE_LEN]), 1, &C2S);
    for i in 0..req.len() {
        for bit in [0x01, 0x80] {
            let mut bad = req.clone();
            bad[i] ^= bit;
            assert!(
                !matches!(check_request(&bad, &m), Check::Verified(_)),
                "byte {i} bit {bit:#x} changed and still verified"
            );
        }
    }
}

#[test]
fn malformed_nts_requests_and_plain_ones() {
    let m = master();
    let cookie = m.seal(&keys(), [2; NONCE_LEN]);
    let mut plain = vec![0u8; 48];
    Header::request(4, Mode::Client, NtpTimestamp(1))
        .encode((&mut plain[..48]).try_into().unwrap());
    assert!(matches!(check_request(&plain, &m), Check::NotNts));
    // An unknown field alone is not NTS either.
    let mut other = plain.clone();
    field(&mut other, 0x7777, &[0; 24]);
    assert!(matches!(check_request(&other, &m), Check::NotNts));
    // A cookie without identifier or authenticator.
    let mut half = plain.clone();
    field(&mut half, ef::COOKIE, &cookie);
    assert!(matches!(check_request(&half, &m), Check::Malformed));
    // Two cookies.
    let mut two = plain.clone();
    field(&mut two, ef::UNIQUE_IDENTIFIER, &[1; 32]);
    field(&mut two, ef::COOKIE, &cookie);
    field(&mut two, ef::COOKIE, &cookie);
    assert!(matches!(check_request(&two, &m), Check::Malformed));
    // A short identifier.
    let mut short = plain.clone();
    field(&mut short, ef::UNIQUE_IDENTIFIER, &[1; 16]);
    field(&mut short, ef::COOKIE, &cookie);
    assert!(matches!(check_request(&short, &m), Check::Malformed));
}

fn record(out: &mut Vec<u8>, ty: u16, body: &[u8]) {
    out.extend_from_slice(&ty.to_be_bytes());
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(body);
}

const SIV_256: Agreement = Agreement {
    protocol: Protocol::NtpV4,
    aead: Aead::AesSivCmac256,
    compliant_export: true,
};

/// ntpd-rs offers the NTPv5 draft (0x8001) before NTPv4: a server speaking v5 takes it, in the
/// client's order, says so in its response and exports the keys with 0x8001 in the context; one
/// that does not speak v5 takes NTPv4, and with v5 alone offered, nothing.
#[test]
fn ke_agrees_on_the_ntpv5_draft_where_served_in_the_clients_order() {
    let request = |protocols: &[u8]| {
        let mut req = Vec::new();
        record(&mut req, 0x8001, protocols);
        record(&mut req, 0x8004, &[0, 15]);
        record(&mut req, 0x8000, &[]);
        req
    };
    let both = request(&[0x80, 0x01, 0, 0]);
    let v5 = Agreement {
        protocol: Protocol::NtpV5Draft,
        ..SIV_256
    };
    let none = PoolTokens::none();
    assert_eq!(ke_check(&both, &none, true), KeOutcome::Agreed(v5));
    assert_eq!(ke_check(&both, &none, false), KeOutcome::Agreed(SIV_256));
    let v4_first = request(&[0, 0, 0x80, 0x01]);
    assert_eq!(ke_check(&v4_first, &none, true), KeOutcome::Agreed(SIV_256));
    let v5_only = request(&[0x80, 0x01]);
    assert_eq!(ke_check(&v5_only, &none, false), KeOutcome::NoProtocol);
    assert_eq!(v5.exporter_context(false), [0x80, 0x01, 0, 15, 0]);
    assert_eq!(v5.exporter_context(true), [0x80, 0x01, 0, 15, 1]);
    assert_eq!(SIV_256.exporter_context(true), [0, 0, 0, 15, 1]);
    let mut out = Vec::new();
    let cookie = master().seal(&keys(), [3; NONCE_LEN]);
    ke_response(
        &KeOutcome::Agreed(v5),
        &NtpNegotiation::default(),
        [cookie],
        &mut out,
    );
    assert_eq!(&out[..6], &[0x80, 1, 0, 2, 0x80, 0x01]);
}

#[test]
fn ke_agrees_on_ntpv4_and_an_aead_and_refuses_the_rest() {
    // chronyd 4.3's request: next protocol NTPv4, AEAD 15, end.
    let mut req = Vec::new();
    record(&mut req, 0x8001, &[0, 0]);
    record(&mut req, 0x8004, &[0, 15]);
    assert_eq!(ke_message_len(&req), None, "no end yet");
    record(&mut req, 0x8000, &[]);
    assert_eq!(ke_message_len(&req), Some(req.len()));
    assert_eq!(ke_message_len(&req[..req.len() - 1]), None);
    assert_eq!(
        ke_check(&req, &PoolTokens::none(), false),
        KeOutcome::Agreed(SIV_256)
    );

    let mut out = Vec::new();
    let cookie = master().seal(&keys(), [3; NONCE_LEN]);
    let port_only = NtpNegotiation {
        server: None,
        port: Some(12345),
    };
    ke_response(
        &KeOutcome::Agreed(SIV_256),
        &port_only,
        std::iter::repeat_n(cookie, 9),
        &mut out,
    );
    assert_eq!(&out[..6], &[0x80, 1, 0, 2, 0, 0]);
    assert_eq!(&out[6..12], &[0x80, 4, 0, 2, 0, 15]);
    assert_eq!(&out[12..18], &[0x80, 7, 0, 2, 0x30, 0x39]);
    assert_eq!(&out[18..22], &[0, 5, 0, COOKIE_LEN as u8]);
    assert_eq!(out.len(), 18 + 8 * (4 + COOKIE_LEN) + 4, "eight cookies");
    assert_eq!(&out[out.len() - 4..], &[0x80, 0, 0, 0]);

    let refused = |body: &[(u16, &[u8])]| {
        let mut r = Vec::new();
        for (t, b) in body {
            record(&mut r, *t, b);
        }
        ke_check(&r, &PoolTokens::none(), false)
    };
    let eom: (u16, &[u8]) = (0x8000, &[]);
    assert_eq!(
        refused(&[(0x8004, &[0, 15]), eom]),
        KeOutcome::Error(1),
        "no protocol"
    );
    assert_eq!(
        refused(&[(0x8001, &[0, 1]), (0x8004, &[0, 15]), eom]),
        KeOutcome::NoProtocol,
        "a protocol not served"
    );
    assert_eq!(
        refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 16, 0, 1]), eom]),
        KeOutcome::NoAead(Protocol::NtpV4),
        "no algorithm served"
    );
    assert_eq!(
        refused(&[(0x8001, &[0, 0]), eom]),
        KeOutcome::Error(1),
        "NTPv4 with no AEAD record"
    );
    assert_eq!(
        refused(&[
            (0x8001, &[0, 0]),
            (0x8004, &[0, 15]),
            (0x8004, &[0, 15]),
            eom
        ]),
        KeOutcome::Error(1),
        "two algorithm records"
    );
    assert_eq!(
        refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 15]), (0x8123, &[]), eom]),
        KeOutcome::Error(0),
        "unknown critical record"
    );
    assert_eq!(
        refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 15]), (0x0123, &[1]), eom]),
        KeOutcome::Agreed(SIV_256),
        "unknown non-critical record"
    );
    assert_eq!(
        refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 15]), (0x0400, &[1]), eom]),
        KeOutcome::Error(1),
        "record 1024 with a body"
    );
    assert_eq!(
        refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 15])]),
        KeOutcome::Error(1)
    );
    let mut err = Vec::new();
    ke_response(&KeOutcome::Error(1), &port_only, [cookie], &mut err);
    assert_eq!(err, [0x80, 2, 0, 2, 0, 1, 0x80, 0, 0, 0]);
}

/// RFC 8915 §4.1.2 and §4.1.5: a server that serves none of the protocols or none of the AEAD
/// algorithms offered says so with that record empty, and hands out no cookies; the client's side
/// reads each so.
#[test]
fn ke_says_no_common_protocol_or_aead_with_an_empty_record() {
    let cookie = master().seal(&keys(), [3; NONCE_LEN]);
    let port_only = NtpNegotiation {
        server: None,
        port: Some(12345),
    };
    let mut none = Vec::new();
    ke_response(
        &KeOutcome::NoAead(Protocol::NtpV4),
        &port_only,
        [cookie],
        &mut none,
    );
    assert_eq!(none, [0x80, 1, 0, 2, 0, 0, 0x80, 4, 0, 0, 0x80, 0, 0, 0]);
    assert_eq!(
        parse_ke_response(&none, Protocol::NtpV4, &Aead::ALL),
        Err(KeAnswerError::NoAead)
    );
    none.clear();
    ke_response(&KeOutcome::NoProtocol, &port_only, [cookie], &mut none);
    assert_eq!(none, [0x80, 1, 0, 0, 0x80, 0, 0, 0]);
    assert_eq!(
        parse_ke_response(&none, Protocol::NtpV4, &Aead::ALL),
        Err(KeAnswerError::NoProtocol)
    );
}

/// The server takes the client's first algorithm that it serves; AES-128-GCM-SIV's keys are
/// exported with 30 in the context only when the client sent record 1024, which the response
/// then carries back (chrony 4.6.1 and later), and with 15 otherwise (chrony 4.4 to 4.6.0).
#[test]
fn ke_takes_the_clients_first_algorithm_and_chronys_record_1024() {
    let agree = |aeads: &[u16], compliant: bool| {
        let mut req = Vec::new();
        record(&mut req, 0x8001, &[0, 0]);
        let ids: Vec<u8> = aeads.iter().flat_map(|a| a.to_be_bytes()).collect();
        record(&mut req, 0x8004, &ids);
        if compliant {
            record(&mut req, 0x0400, &[]);
        }
        record(&mut req, 0x8000, &[]);
        match ke_check(&req, &PoolTokens::none(), false) {
            KeOutcome::Agreed(a) => a,
            other => panic!("{aeads:?}: {other:?}"),
        }
    };
    assert_eq!(agree(&[17, 15], false).aead, Aead::AesSivCmac512);
    assert_eq!(agree(&[15, 17], false).aead, Aead::AesSivCmac256);
    assert_eq!(agree(&[16, 30, 15], false).aead, Aead::Aes128GcmSiv);
    let old_chrony = agree(&[30, 15], false);
    assert_eq!(old_chrony.exporter_context(false), [0, 0, 0, 15, 0]);
    assert_eq!(old_chrony.exporter_context(true), [0, 0, 0, 15, 1]);
    // The keys come from the exporter under those contexts, the algorithm's length each.
    let mut asked = Vec::new();
    let exported = old_chrony.export_keys(|context, key| {
        asked.push(*context);
        key.fill(context[4] + 1);
        Ok::<_, ()>(())
    });
    let exported = exported.unwrap();
    assert_eq!(asked, [[0, 0, 0, 15, 0], [0, 0, 0, 15, 1]]);
    assert_eq!(
        (exported.aead(), exported.c2s(), exported.s2c()),
        (Aead::Aes128GcmSiv, &[1; 16][..], &[2; 16][..])
    );
    let new_chrony = agree(&[30, 15], true);
    assert_eq!(new_chrony.exporter_context(false), [0, 0, 0, 30, 0]);
    assert_eq!(agree(&[17], true).exporter_context(true), [0, 0, 0, 17, 1]);

    let response = |agreement: Agreement| {
        let mut out = Vec::new();
        let keys = Keys::new(Protocol::NtpV4, agreement.aead, &[1; 16], &[2; 16]);
        let cookies = keys.map(|k| master().seal(&k, [3; NONCE_LEN]));
        ke_response(
            &KeOutcome::Agreed(agreement),
            &NtpNegotiation::default(),
            cookies,
            &mut out,
        );
        out
    };
    let echoed = response(new_chrony);
    assert_eq!(&echoed[6..16], &[0x80, 4, 0, 2, 0, 30, 0x04, 0, 0, 0]);
    assert_eq!(&echoed[16..20], &[0, 5, 0, 72], "a GCM-SIV cookie");
    let not_echoed = response(old_chrony);
    assert_eq!(&not_echoed[6..16], &[0x80, 4, 0, 2, 0, 30, 0, 5, 0, 72]);

    // The client's side reads the same agreement back.
    for (offered, compliant) in [
        (vec![Aead::Aes128GcmSiv], true),
        (vec![Aead::AesSivCmac512], true),
    ] {
        let req = ke_request(Protocol::NtpV4, &offered);
        let KeOutcome::Agreed(agreement) = ke_check(&req, &PoolTokens::none(), false) else {
            panic!("{offered:?}");
        };
        assert_eq!(agreement.compliant_export, compliant);
        let mut out = Vec::new();
        let sealed = master().seal(&filled(agreement.aead, 1, 2), [3; NONCE_LEN]);
        ke_response(
            &KeOutcome::Agreed(agreement),
            &NtpNegotiation::default(),
            [sealed],
            &mut out,
        );
        let answer = parse_ke_response(&out, Protocol::NtpV4, &offered).unwrap();
        assert_eq!(answer.agreement, agreement);
        assert_eq!(answer.cookies, vec![sealed.to_vec()]);
    }
    // A server that answers with an algorithm the client did not offer is not used.
    let mut out = Vec::new();
    ke_response(
        &KeOutcome::Agreed(SIV_256),
        &NtpNegotiation::default(),
        [master().seal(&keys(), [3; NONCE_LEN])],
        &mut out,
    );
    assert!(parse_ke_response(&out, Protocol::NtpV4, &[Aead::AesSivCmac512]).is_err());
    assert!(
        parse_ke_response(
            &out,
            Protocol::NtpV4,
            &[Aead::AesSivCmac512, Aead::AesSivCmac256]
        )
        .is_ok()
    );
}

#[test]
fn server_names_for_the_negotiation_record() {
    for good in [
        "192.0.2.1",
        "2001:db8::1",
        "ntp.example.net",
        "ntp.example.net.",
        "a-b.c0",
    ] {
        assert!(valid_ntp_server(good), "{good}");
    }
    let long = ["a"; 130].join(".");
    for bad in [
        "",
        "fe80::1%eth0",
        "[2001:db8::1]",
        "ntp example",
        "-ntp.example",
        "ntp-.example",
        "ntp..example",
        "192.0.2.300",
        "ntp.example.net:123",
        long.as_str(),
    ] {
        assert!(!valid_ntp_server(bad), "{bad}");
    }
}

/// NTS-KE, then a request, its reply and a NAK, between the client's side and the server's,
/// under each algorithm.
#[test]
fn the_client_side_round_trips_with_the_server_side() {
    for aead in Aead::ALL {
        round_trip(aead);
    }
    let mut err = Vec::new();
    let nowhere = NtpNegotiation::default();
    ke_response(&KeOutcome::Error(1), &nowhere, [], &mut err);
    assert_eq!(
        parse_ke_response(&err, Protocol::NtpV4, &Aead::ALL),
        Err(KeAnswerError::Refused(1))
    );
}

fn round_trip(aead: Aead) {
    let m = master();
    let keys = filled(aead, 0x11, 0x22);
    // The other direction's key in the place of each: what a reflected packet would be under.
    let swapped = Keys::new(Protocol::NtpV4, aead, keys.s2c(), keys.c2s()).unwrap();
    let mut ke = Vec::new();
    let elsewhere = NtpNegotiation {
        server: Some("ntp.example.net".to_owned()),
        port: Some(4123),
    };
    let outcome = ke_check(
        &ke_request(Protocol::NtpV4, &[aead]),
        &PoolTokens::none(),
        false,
    );
    let cookies = std::iter::repeat_with(|| m.seal(&keys, [1; 16]));
    ke_response(&outcome, &elsewhere, cookies, &mut ke);
    let answer = parse_ke_response(&ke, Protocol::NtpV4, &[aead]).unwrap();
    assert_eq!(answer.agreement.aead, aead);
    assert_eq!(
        (answer.cookies.len(), answer.server.as_deref(), answer.port),
        (8, Some("ntp.example.net"), Some(4123))
    );
    assert_eq!(answer.cookies[0].len(), cookie_len(aead));

    let mut header = [0u8; 48];
    Header::request(4, Mode::Client, NtpTimestamp(5)).encode(&mut header);
    let uid = [0x5A; 32];
    let req = client_request(&header, &uid, &answer.cookies[0], 2, &keys, [8; 16]);
    assert!(
        req.len() <= client_request_len(cookie_len(aead), 2),
        "{aead}"
    );
    let Check::Verified(v) = check_request(&req, &m) else {
        panic!("{aead}")
    };
    assert_eq!(v.keys, keys);
    let mut reply = vec![0u8; req.len()];
    Header::request(4, Mode::Server, NtpTimestamp(9))
        .encode((&mut reply[..48]).try_into().unwrap());
    let written = write_response(&mut reply, &req, &v, [2; 16], || m.seal(&keys, [3; 16]));
    assert_eq!(written, Some(req.len()), "{aead}: as long as the request");
    let Ok(ClientReply::Authentic(cookies)) = client_check_reply(&reply, &uid, &keys) else {
        panic!("{aead}")
    };
    assert_eq!(cookies.len(), 3, "{aead}");
    assert!(
        cookies.iter().all(|c| m.open(c).as_ref() == Some(&keys)),
        "{aead}"
    );
    assert_eq!(
        client_check_reply(&reply, &[0; 32], &keys),
        Err(ClientReplyError::WrongIdentifier)
    );
    assert_eq!(
        client_check_reply(&reply, &uid, &swapped),
        Err(ClientReplyError::Forged),
        "{aead}"
    );
    let mut bad = reply.clone();
    bad[40] ^= 1; // the transmit timestamp is covered
    assert_eq!(
        client_check_reply(&bad, &uid, &keys),
        Err(ClientReplyError::Forged),
        "{aead}"
    );
    let mut bad_request = req.clone();
    bad_request[40] ^= 1;
    assert!(
        matches!(
            check_request(&bad_request, &m),
            Check::Nak(_, NakReason::Forged)
        ),
        "{aead}"
    );

    let foreign = client_request(&header, &uid, &vec![0; cookie_len(aead)], 0, &keys, [8; 16]);
    let Check::Nak(range, NakReason::UnknownKey) = check_request(&foreign, &m) else {
        panic!("{aead}")
    };
    let mut nak = vec![0u8; foreign.len()];
    Header::request(4, Mode::Server, NtpTimestamp(9)).encode((&mut nak[..48]).try_into().unwrap());
    let len = write_nak(&mut nak, &foreign, range).unwrap();
    assert_eq!(
        client_check_reply(&nak[..len], &uid, &keys),
        Ok(ClientReply::Nak)
    );
}

#[test]
fn client_request_is_what_chronyd_sends_and_the_reply_names_it() {
    let cookie = master().seal(&keys(), [1; 16]);
    for placeholders in [0, 1, 7] {
        let mut header = [0u8; 48];
        Header::request(4, Mode::Client, NtpTimestamp(0x0102_0304_0506_0708)).encode(&mut header);
        let ours = client_request(
            &header,
            &[0xAB; 32],
            &cookie,
            placeholders,
            &keys(),
            [0x44; 16],
        );
        assert_eq!(ours, request(&cookie, placeholders, &C2S));
        assert_eq!(ours.len(), client_request_len(cookie.len(), placeholders));
        assert_eq!(reply_unique_id(&ours), Some(&[0xAB; 32][..]));
    }
    assert_eq!(reply_unique_id(&[0; 48]), None);
}

/// The token a pool holds for this member, as nts-pool writes it: 64 hexadecimal digits.
const TOKEN: &[u8] = b"c680e5f1c4f161968dd9b72f271ca5e7d17b0fe2e71e20b7ba4002b9252dd751";

#[test]
fn a_pool_with_an_accepted_token_gets_cookies_sealing_the_keys_it_gives() {
    let pool = PoolTokens::new(["another-pool", std::str::from_utf8(TOKEN).unwrap()]);
    for aead in Aead::ALL {
        let keys = filled(aead, 0x31, 0x32);
        for keep_alive in [false, true] {
            let req = pool_fixed_key_request(TOKEN, &keys, Protocol::NtpV4, keep_alive);
            assert_eq!(ke_message_len(&req), Some(req.len()));
            let outcome = ke_check(&req, &pool, false);
            let KeOutcome::PoolKeys { keys: got, .. } = &outcome else {
                panic!("{aead}: {outcome:?}")
            };
            assert_eq!(got, &keys, "{aead}");
            assert_eq!(outcome.keep_alive(), keep_alive);
            let m = master();
            let mut out = Vec::new();
            let cookies = std::iter::repeat_with(|| m.seal(got, [4; NONCE_LEN]));
            let member = NtpNegotiation {
                server: Some("time-a.example".into()),
                port: Some(1231),
            };
            ke_response(&outcome, &member, cookies, &mut out);
            // What the pool reads, as a client of this server would: NTPv4, the algorithm, the
            // member's NTP server, eight cookies that open to the pool's keys.
            let answer = parse_ke_response(&out, Protocol::NtpV4, &[aead]).unwrap();
            assert_eq!(answer.agreement.aead, aead);
            assert_eq!(answer.server.as_deref(), Some("time-a.example"));
            assert_eq!(answer.cookies.len(), 8);
            assert!(
                answer
                    .cookies
                    .iter()
                    .all(|c| m.open(c) == Some(keys.clone()))
            );
            let kept = out.windows(4).any(|w| w == [0, 8, 0, 0]);
            assert_eq!(kept, keep_alive, "{aead}: Keep Alive echoed");
            // Record 1024 is the pool's business with its client, never echoed to the pool.
            assert!(!out.windows(4).any(|w| w == [4, 0, 0, 0]), "{aead}");
        }
    }
}

#[test]
fn a_pool_support_request_is_answered_with_each_algorithm_and_its_key_length() {
    let pool = PoolTokens::new([TOKEN]);
    for (ntpv5, protocols) in [(false, &[0][..]), (true, &[0, 0x8001])] {
        let outcome = ke_check(&pool_support_request(TOKEN, true), &pool, ntpv5);
        let keep_alive = true;
        assert_eq!(outcome, KeOutcome::PoolSupport { ntpv5, keep_alive });
        let mut out = Vec::new();
        ke_response(&outcome, &NtpNegotiation::default(), [], &mut out);
        let support = parse_pool_support(&out).unwrap();
        assert_eq!(support.algorithms, [(15, 32), (17, 64)]);
        assert_eq!(support.protocols, protocols);
        assert!(support.keep_alive);
    }
    let once = ke_check(&pool_support_request(TOKEN, false), &pool, false);
    assert!(!once.keep_alive());
}

/// nts-pool asks a member for keys of the protocol it agreed on with its client, the NTPv5 draft
/// when both speak it: a member serving v5 seals them and says v5, and its cookies open to keys
/// that authenticate the client's v5 requests; a member that does not says no protocol.
#[test]
fn a_pool_gets_cookies_for_ntpv5_from_a_member_that_serves_it() {
    let pool = PoolTokens::new([TOKEN]);
    let req = pool_fixed_key_request(TOKEN, &keys_v5(), Protocol::NtpV5Draft, false);
    assert_eq!(ke_check(&req, &pool, false), KeOutcome::NoProtocol);
    let outcome = ke_check(&req, &pool, true);
    let KeOutcome::PoolKeys {
        keys: got,
        protocol,
        ..
    } = &outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!((got, *protocol), (&keys_v5(), Protocol::NtpV5Draft));
    let m = master();
    let mut out = Vec::new();
    let mut nonce = 0;
    let cookies = std::iter::repeat_with(|| {
        nonce += 1;
        m.seal(got, [nonce; NONCE_LEN])
    });
    ke_response(&outcome, &NtpNegotiation::default(), cookies, &mut out);
    let records: Vec<_> = record::records(&out).map(Result::unwrap).collect();
    let next = records
        .iter()
        .find(|r| r.ty == record::NEXT_PROTOCOL)
        .unwrap();
    assert_eq!(next.body, [0x80, 0x01], "the v5 draft's id");
    let cookie = records.iter().find(|r| r.ty == record::NEW_COOKIE).unwrap();
    // The pool's client sends one in a v5 request under the client-to-server key it exported.
    let v5_request = request_v5(cookie.body, 0, &C2S);
    assert!(matches!(
        check_request_v5(&v5_request, &m),
        Check::Verified(_)
    ));
}

#[test]
fn a_pool_request_without_an_accepted_token_is_a_bad_request() {
    const V4: Protocol = Protocol::NtpV4;
    let keys = keys();
    let pool = PoolTokens::new([TOKEN]);
    let mut wrong = TOKEN.to_vec();
    wrong[63] ^= 1;
    for token in [&wrong[..], &TOKEN[..63], b"", TOKEN] {
        let for_pool = |p: &PoolTokens| {
            (
                ke_check(&pool_fixed_key_request(token, &keys, V4, false), p, false),
                ke_check(&pool_support_request(token, false), p, false),
            )
        };
        let bad = (KeOutcome::PoolRefused, KeOutcome::PoolRefused);
        // A server in no pool refuses every token, the right one too.
        assert_eq!(for_pool(&PoolTokens::none()), bad);
        if token != TOKEN {
            assert_eq!(for_pool(&pool), bad, "{:?}", String::from_utf8_lossy(token));
        }
    }
    // Without a token record at all.
    let mut req = pool_fixed_key_request(TOKEN, &keys, Protocol::NtpV4, false);
    req.drain(..4 + TOKEN.len());
    assert_eq!(ke_check(&req, &pool, false), KeOutcome::PoolRefused);
    let mut out = Vec::new();
    ke_response(
        &KeOutcome::PoolRefused,
        &NtpNegotiation::default(),
        [],
        &mut out,
    );
    assert_eq!(
        out,
        [0x80, 2, 0, 2, 0, 1, 0x80, 0, 0, 0],
        "Error Bad Request"
    );
    // An empty token is never accepted, even if configured.
    let empty = PoolTokens::new([""]);
    assert!(empty.is_empty() && !empty.accepts(b""));
    // A client's ordinary request with the token and Keep Alive is served as ever, and closed.
    let mut ordinary = Vec::new();
    record(&mut ordinary, 14, TOKEN);
    record(&mut ordinary, 0x8001, &[0, 0]);
    record(&mut ordinary, 0x8004, &[0, 15]);
    record(&mut ordinary, 8, &[]);
    record(&mut ordinary, 0x8000, &[]);
    assert_eq!(
        ke_check(&ordinary, &pool, false),
        KeOutcome::Agreed(SIV_256)
    );
}

#[test]
fn a_malformed_pool_request_is_a_bad_request() {
    let pool = PoolTokens::new([TOKEN]);
    let eom: (u16, &[u8]) = (0x8000, &[]);
    let token: (u16, &[u8]) = (14, TOKEN);
    let check = |records: &[(u16, &[u8])]| {
        let mut r = Vec::new();
        for (t, b) in records {
            record(&mut r, *t, b);
        }
        ke_check(&r, &pool, false)
    };
    let keys32 = [7u8; 64];
    let fixed: (u16, &[u8]) = (0x800C, &keys32);
    let ntpv4: (u16, &[u8]) = (0x8001, &[0, 0]);
    let siv: (u16, &[u8]) = (0x8004, &[0, 15]);
    assert!(matches!(
        check(&[token, fixed, ntpv4, siv, eom]),
        KeOutcome::PoolKeys { .. }
    ));
    type Records<'a> = &'a [(u16, &'a [u8])];
    let cases: [(Records, KeOutcome, &str); 9] = [
        (
            &[token, (0x800C, &keys32[..63]), ntpv4, siv, eom],
            KeOutcome::Error(1),
            "odd keys",
        ),
        (
            &[token, (0x800C, &keys32[..32]), ntpv4, siv, eom],
            KeOutcome::Error(1),
            "short keys",
        ),
        (
            &[token, fixed, ntpv4, (0x8004, &[0, 17]), eom],
            KeOutcome::Error(1),
            "keys for 15 as 17",
        ),
        (
            &[token, fixed, ntpv4, (0x8004, &[0, 15, 0, 17]), eom],
            KeOutcome::Error(1),
            "two algorithms",
        ),
        (
            &[token, fixed, ntpv4, eom],
            KeOutcome::Error(1),
            "no algorithm",
        ),
        (
            &[token, fixed, fixed, ntpv4, siv, eom],
            KeOutcome::Error(1),
            "two key records",
        ),
        (
            &[token, token, fixed, ntpv4, siv, eom],
            KeOutcome::Error(1),
            "two tokens",
        ),
        (
            &[token, fixed, (0x8001, &[0, 1]), siv, eom],
            KeOutcome::NoProtocol,
            "a protocol not served",
        ),
        (
            &[token, fixed, ntpv4, (0x8004, &[0, 16]), eom],
            KeOutcome::NoAead(Protocol::NtpV4),
            "an algorithm not served",
        ),
    ];
    for (records, want, why) in cases {
        assert_eq!(check(records), want, "{why}");
    }
    // A pool's deny list is the pool's business: ignored.
    assert!(matches!(
        check(&[token, fixed, ntpv4, siv, (13, b"time-b.example"), eom]),
        KeOutcome::PoolKeys { .. }
    ));
}

#[test]
fn the_pool_token_file_holds_one_token_a_line() {
    let text = "# pools this server serves\ntoken abc123\n\ntoken  def456  # ntppool.example\n";
    // A comment after the token is trailing junk: a token's file holds it alone.
    assert!(parse_pool_tokens(text).is_err());
    let tokens = parse_pool_tokens("# pools\ntoken abc123\n\ntoken def456\n").unwrap();
    assert_eq!(tokens.len(), 2);
    assert!(tokens.accepts(b"abc123") && tokens.accepts(b"def456"));
    assert!(!tokens.accepts(b"abc12") && !tokens.accepts(b"abc1234") && !tokens.accepts(b""));
    for (bad, says) in [
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("secret abc\n", "line 1: expected `token TOKEN`"),
        ("token\n", "line 1: the token is missing"),
        ("token a\ntoken a\n", "line 2"),
        ("token a b\n", "line 1: trailing junk"),
    ] {
        let e = parse_pool_tokens(bad).unwrap_err().to_string();
        assert!(e.starts_with(says), "{bad:?}: {e}");
    }
}

/// An NTPv5 request over NTS as ntpd-rs makes one (draft -08): the v5 header and Draft
/// Identification, then the identifier, the cookie and `placeholders` placeholders, and the
/// authenticator over all of it under `c2s`.
fn request_v5(cookie: &[u8], placeholders: usize, c2s: &[u8; KEY_LEN]) -> Vec<u8> {
    let mut p = vec![0u8; 76];
    let draft = crate::v5::Draft::D08;
    crate::v5::write_request(&mut p, draft, 4, [7; 8], None).unwrap();
    field(&mut p, ef::UNIQUE_IDENTIFIER, &[0xAB; 32]);
    field(&mut p, ef::COOKIE, cookie);
    for _ in 0..placeholders {
        field(&mut p, ef::COOKIE_PLACEHOLDER, &vec![0; cookie.len()]);
    }
    authenticate(&mut p, c2s);
    p
}

#[test]
fn an_ntpv5_request_over_nts_gets_an_authentic_v5_reply_as_long_as_itself() {
    use crate::v5::{self, Draft};
    let m = master();
    let cookie = m.seal(&keys_v5(), [1; NONCE_LEN]);
    let req = request_v5(cookie.as_bytes(), 2, &C2S);
    assert_eq!(
        v5::accept(&req),
        Ok(v5::Accepted {
            draft: Draft::D08,
            nts: true
        })
    );
    let Check::Verified(v) = check_request_v5(&req, &m) else {
        panic!("not verified");
    };
    let served = crate::responder::tests::served();
    let mut reply = vec![0xEE; req.len()];
    v5::write_header(&req, NtpTimestamp(0x1234 << 32), &served, 0, &mut reply).unwrap();
    let mut n = 0u8;
    let len = write_response_v5(&mut reply, &req, &v, Draft::D08, [0x55; NONCE_LEN], || {
        n += 1;
        m.seal(&keys_v5(), [n; NONCE_LEN])
    })
    .unwrap();
    assert_eq!(
        (len, n),
        (req.len(), 3),
        "the spent cookie and two placeholders"
    );
    let kinds: Vec<u16> = v5::fields(&reply).unwrap().map(|f| f.ty).collect();
    assert_eq!(
        kinds,
        [ef::UNIQUE_IDENTIFIER, v5::ef::DRAFT_ID, ef::AUTHENTICATOR]
    );
    let resp = v5::parse_response(&reply, [7; 8], Draft::D08).unwrap();
    assert_eq!((resp.stratum, resp.flags), (2, v5::flags::SYNCHRONISED));
    // The authenticator verifies under the server-to-client key over everything before it.
    let auth = v5::fields(&reply).unwrap().last().unwrap();
    let auth = fields::Field::from(auth);
    let mut plain = [0u8; 1024];
    let opened = fields::open_authenticator(
        &reply,
        &auth,
        (Aead::AesSivCmac256, &S2C),
        NONCE_LEN,
        &mut plain,
    );
    assert_eq!(opened, Ok(3 * (4 + COOKIE_LEN)), "three cookies inside");

    // Any byte changed before the authenticator: a v5 NAK, with the identifier and the draft.
    for at in [0, 30, 48 + 28 + 10, req.len() - 30] {
        let mut bad = req.clone();
        bad[at] ^= 0x10;
        let uid = match check_request_v5(&bad, &m) {
            Check::Nak(uid, _) => uid,
            other => panic!("byte {at}: {other:?}"),
        };
        let mut nak = vec![0; bad.len()];
        v5::write_header(&bad, NtpTimestamp(9), &served, 0, &mut nak).unwrap();
        let nak_len = write_nak_v5(&mut nak, &bad, uid, Draft::D08).unwrap();
        assert!(nak_len < bad.len());
        let resp = v5::parse_response(&nak[..nak_len], bad[24..32].try_into().unwrap(), Draft::D08)
            .unwrap();
        assert_eq!((resp.stratum, resp.flags), (0, v5::flags::AUTH_NAK));
    }
}

/// The client's side over v5: its request is the server's to verify (the Draft Identification
/// inside what the authenticator covers), and it reads the server's reply (the fresh cookies),
/// its NAK, a reply for another identifier, and a forged one, as over v4.
#[test]
fn a_v5_client_request_round_trips_and_its_reply_is_checked() {
    use crate::v5::{self, Draft};
    let m = master();
    let cookie = m.seal(&keys_v5(), [1; NONCE_LEN]);
    let uid = [0x5A; 32];
    for draft in Draft::ALL {
        let req = client_request_v5(
            draft,
            [7; 8],
            &uid,
            cookie.as_bytes(),
            1,
            &keys_v5(),
            [3; 16],
        );
        assert_eq!(v5::accept(&req), Ok(v5::Accepted { draft, nts: true }));
        let Check::Verified(v) = check_request_v5(&req, &m) else {
            panic!("{draft:?}: not verified");
        };
        let served = crate::responder::tests::served();
        let mut reply = vec![0; req.len()];
        v5::write_header(&req, NtpTimestamp(0x1234 << 32), &served, 0, &mut reply).unwrap();
        let mut n = 0u8;
        let len = write_response_v5(&mut reply, &req, &v, draft, [0x55; NONCE_LEN], || {
            n += 1;
            m.seal(&keys_v5(), [n; NONCE_LEN])
        })
        .unwrap();
        let reply = &reply[..len];
        assert!(v5::parse_response(reply, [7; 8], draft).is_ok());
        let Ok(ClientReply::Authentic(cookies)) = client_check_reply_v5(reply, &uid, &keys_v5())
        else {
            panic!("{draft:?}: not authentic");
        };
        assert_eq!(cookies.len(), 2, "the spent cookie and one placeholder");
        assert!(cookies.iter().all(|c| m.open(c) == Some(keys_v5())));
        assert_eq!(
            client_check_reply_v5(reply, &[0; 32], &keys_v5()),
            Err(ClientReplyError::WrongIdentifier)
        );
        let mut forged = reply.to_vec();
        forged[40] ^= 1;
        assert_eq!(
            client_check_reply_v5(&forged, &uid, &keys_v5()),
            Err(ClientReplyError::Forged)
        );
        // A cookie the server cannot open: its NAK, which the client reads as one.
        let stale = client_request_v5(draft, [7; 8], &uid, &[9; 104], 0, &keys_v5(), [3; 16]);
        let Check::Nak(at, NakReason::UnknownKey) = check_request_v5(&stale, &m) else {
            panic!("{draft:?}: not a NAK");
        };
        let mut nak = vec![0; stale.len()];
        v5::write_header(&stale, NtpTimestamp(9), &served, 0, &mut nak).unwrap();
        let nak_len = write_nak_v5(&mut nak, &stale, at, draft).unwrap();
        assert_eq!(
            client_check_reply_v5(&nak[..nak_len], &uid, &keys_v5()),
            Ok(ClientReply::Nak)
        );
    }
}
