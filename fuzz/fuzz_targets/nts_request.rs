//! NTS on hostile requests: checking never panics, and whatever passes gets a reply (or a NAK)
//! no longer than the request. Half the inputs carry a genuine cookie and authenticator built
//! from the fuzz bytes, so the verified path is reached too; a reply to those must be exactly
//! as long as the request.
#![no_main]

use aes_siv::KeyInit;
use aes_siv::siv::Aes128Siv;
use chime_ntp::nts::{self, Check, CookieKeys, Keys};
use libfuzzer_sys::fuzz_target;

fn field(out: &mut Vec<u8>, ty: u16, body: &[u8]) {
    out.extend_from_slice(&ty.to_be_bytes());
    out.extend_from_slice(&((4 + body.len()) as u16).to_be_bytes());
    out.extend_from_slice(body);
}

fuzz_target!(|input: (bool, u8, Vec<u8>)| {
    let (genuine, placeholders, mut request) = input;
    let master = CookieKeys::new(1, [7; 32]);
    let keys = Keys { c2s: [1; 32], s2c: [2; 32] };
    if genuine {
        // A 48-byte header from the fuzz bytes, then a real NTS request around them.
        request.resize(48, 0);
        request[0] = 0x23;
        field(&mut request, 0x0104, &[9; 32]);
        field(&mut request, 0x0204, &master.seal(&keys, [3; 16]));
        for _ in 0..placeholders % 10 {
            field(&mut request, 0x0304, &[0; nts::COOKIE_LEN]);
        }
        let nonce = [4u8; 16];
        let tag = Aes128Siv::new((&keys.c2s).into())
            .encrypt_in_place_detached([&request[..], &nonce[..]], &mut [])
            .unwrap();
        let mut body = vec![0, 16, 0, 16];
        body.extend_from_slice(&nonce);
        body.extend_from_slice(&tag);
        field(&mut request, 0x0404, &body);
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
        Check::Nak(uid) => {
            if let Some(len) = nts::write_nak(&mut reply, &request, uid) {
                assert!(len <= request.len());
            }
            assert!(!genuine, "a genuine request was NAKed");
        }
        Check::NotNts | Check::Malformed => assert!(!genuine || request.len() % 4 != 0),
    }
});
