//! Roughtime request parsing on hostile input: never a panic.
#![no_main]

use chime_roughtime::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Request::parse(data);
});
