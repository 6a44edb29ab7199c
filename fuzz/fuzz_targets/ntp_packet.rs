//! The NTP header codec: whatever parses must encode back to the same 48 bytes, and the extension
//! walker must never panic.
#![no_main]

use chime_ntp::{Header, check_extensions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = Header::parse(data) {
        let mut out = [0u8; 48];
        header.encode(&mut out);
        assert_eq!(&out[..], &data[..48], "parse -> encode changed the header");
        let _ = check_extensions(&data[48..]);
    }
});
