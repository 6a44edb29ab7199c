//! Roughtime reply parsing and verification on hostile input: never a panic, and nothing the
//! fuzzer makes up verifies under a key whose private half it does not have.
#![no_main]

use chime_roughtime::{Reply, VerifyPolicy, Version, build_request, verify_reply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Reply::parse(data);
    let mut request = [0u8; 1024];
    let n = build_request(&mut request, &[Version::Rfc10049], &[7; 32], None).unwrap();
    // The IETF interop harness's long-term public key: the fuzzer cannot sign for it.
    let key = [
        0x23, 0x1b, 0xbb, 0x82, 0xa8, 0xc9, 0xf5, 0x35, 0x3a, 0x23, 0x1b, 0x0e, 0xf3, 0x0c, 0x59,
        0xc4, 0x01, 0x53, 0xe6, 0xd7, 0xba, 0x15, 0xc6, 0x59, 0x42, 0xae, 0x6f, 0x5c, 0x59, 0x77,
        0xe4, 0x91,
    ];
    let verified = verify_reply(&request[..n], data, &key, &VerifyPolicy::new(u64::MAX));
    assert!(verified.is_err(), "a forged reply verified");
});
