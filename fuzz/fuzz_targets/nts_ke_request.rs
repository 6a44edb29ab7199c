//! NTS-KE requests from hostile clients and pools: checking never panics; a pool's request is
//! served only with the accepted token; the answer to whatever passes is well formed, and a
//! pool's keys come back sealed in cookies that open to them. A quarter of the inputs are a
//! pool's genuine request (support or fixed keys, under one of the AEAD algorithms, for NTPv4 or
//! the NTPv5 draft) with the fuzz bytes appended to the token or after End of Message, so the
//! pool's paths are reached too; the server serves NTPv5 or not.
#![no_main]

use chime_ntp::nts::{self, CookieKeys, KeOutcome, Keys, NtpNegotiation, PoolTokens, Protocol};
use libfuzzer_sys::fuzz_target;

const TOKEN: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fuzz_target!(|input: (u8, Vec<u8>)| {
    let (choice, bytes) = input;
    let pool = PoolTokens::new([TOKEN]);
    let aead = nts::Aead::ALL[usize::from(choice % 3)];
    let len = aead.key_len();
    let keys = Keys::new(Protocol::NtpV4, aead, &vec![1; len], &vec![2; len]).unwrap();
    let protocol = [Protocol::NtpV4, Protocol::NtpV5Draft][usize::from(choice & 16 != 0)];
    let ntpv5 = choice & 32 != 0;
    let request = match choice >> 6 {
        0 => nts::pool_fixed_key_request(TOKEN, &keys, protocol, choice & 8 != 0),
        1 => nts::pool_support_request(&[TOKEN, &bytes].concat(), false),
        _ => bytes.clone(),
    };
    let Some(end) = nts::ke_message_len(&request) else {
        return;
    };
    let outcome = nts::ke_check(&request[..end], &pool, ntpv5);
    if matches!(
        outcome,
        KeOutcome::PoolSupport { .. } | KeOutcome::PoolKeys { .. }
    ) {
        assert!(request.windows(TOKEN.len()).any(|w| w == TOKEN));
    }
    let master = CookieKeys::new(1, [7; 32]);
    let sealed = match &outcome {
        KeOutcome::Agreed(a) => Keys::new(
            a.protocol,
            a.aead,
            &vec![3; a.aead.key_len()],
            &vec![4; a.aead.key_len()],
        ),
        KeOutcome::PoolKeys { keys, .. } => Some(keys.clone()),
        _ => None,
    };
    let cookies = sealed.iter().map(|k| master.seal(k, [5; 16]));
    let mut out = Vec::new();
    nts::ke_response(&outcome, &NtpNegotiation::default(), cookies, &mut out);
    assert_eq!(nts::ke_message_len(&out), Some(out.len()));
    if let (
        KeOutcome::PoolKeys {
            keys,
            protocol: Protocol::NtpV4,
            ..
        },
        0,
    ) = (&outcome, choice >> 6)
    {
        let answer = nts::parse_ke_response(&out, Protocol::NtpV4, &nts::Aead::ALL).unwrap();
        assert_eq!(master.open(&answer.cookies[0]).as_ref(), Some(keys));
    }
});
