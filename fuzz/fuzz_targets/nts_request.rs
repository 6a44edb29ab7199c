//! NTS on hostile requests: checking never panics, and whatever passes gets a reply (or a NAK)
//! no longer than the request. Half the inputs are a genuine request under one of the AEAD
//! algorithms, its header from the fuzz bytes, so the verified path is reached too; a reply to
//! those must be exactly as long as the request.
#![no_main]

use chime_ntp::nts::{self, Check, CookieKeys, Keys};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (bool, u8, Vec<u8>)| {
    let (genuine, choice, mut request) = input;
    let master = CookieKeys::new(1, [7; 32]);
    let aead = nts::Aead::ALL[usize::from(choice / 16) % nts::Aead::ALL.len()];
    let len = aead.key_len();
    let keys = Keys::new(nts::Protocol::NtpV4, aead, &vec![1; len], &vec![2; len]).unwrap();
    if genuine {
        request.resize(48, 0);
        request[0] = 0x23;
        let header: [u8; 48] = request[..48].try_into().unwrap();
        let cookie = master.seal(&keys, [3; 16]);
        let placeholders = usize::from(choice % 16) % 10;
        request = nts::client_request(&header, &[9; 32], &cookie, placeholders, &keys, [4; 16]);
    }
    let mut reply = vec![0u8; request.len()];
    let n = reply.len().min(48);
    reply[..n].copy_from_slice(&request[..n]);
    match nts::check_request(&request, &master) {
        Check::Verified(v) => {
            let mut sealed = 0u8;
            let len = nts::write_response(&mut reply, &request, &v, [5; 16], || {
                sealed += 1;
                master.seal(&v.keys, [sealed; 16])
            });
            if let Some(len) = len {
                assert_eq!(len, request.len());
            }
        }
        Check::Nak(uid, _) => {
            if let Some(len) = nts::write_nak(&mut reply, &request, uid) {
                assert!(len <= request.len());
            }
            assert!(!genuine, "a genuine request was NAKed");
        }
        Check::NotNts | Check::Malformed => assert!(!genuine || request.len() % 4 != 0),
    }
});
