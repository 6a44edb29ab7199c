//! The per-packet path allocates nothing: a counting global allocator, armed only around the calls
//! under test on this thread, sees no allocation while a worker's work for a batch is done.

use chime_ntp::{
    Leap, NtpShort, NtpTimestamp, ServerState, StalePolicy, check_extensions, respond,
    stamp_transmit,
};
use chime_udp::counting_alloc::{self, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations_in(f: impl FnOnce()) -> u64 {
    counting_alloc::allocations_in(f).1
}

#[test]
fn a_batch_allocates_nothing() {
    let state = ServerState {
        leap: Leap::NoWarning,
        stratum: 2,
        precision: -25,
        reference_id: [192, 0, 2, 1],
        reference_ts: NtpTimestamp(0xEEAC_6C00_0000_0000),
        root_delay: NtpShort(0x0800),
        root_dispersion: NtpShort(0x0400),
        updated: Some(NtpTimestamp(0xEEAC_6C47_0000_0000)),
    };
    let policy = StalePolicy::default();
    let mut requests: Vec<Vec<u8>> = Vec::new();
    for first in 0..=u8::MAX {
        let mut request = vec![0x5A; 48];
        request[0] = first;
        requests.push(request);
    }
    let mut with_fields = vec![0x23; 48];
    with_fields.extend([0x7A, 0x7A, 0, 28]);
    with_fields.extend([0; 24]);
    with_fields.extend([0; 20]);
    requests.push(with_fields);
    requests.push(vec![0x23; 47]);
    let mut replies: Vec<Vec<u8>> = requests.iter().map(|r| vec![0; r.len()]).collect();

    let mut answered = 0;
    let count = allocations_in(|| {
        let now = NtpTimestamp(0xEEAC_6C48_0000_0000);
        let served = state.served_at(now, &policy);
        for (request, reply) in requests.iter().zip(replies.iter_mut()) {
            let _ = check_extensions(&request[48.min(request.len())..]);
            if let Ok(len) = respond(request, 40_000, now, &served, reply) {
                stamp_transmit(&mut reply[..len], now);
                answered += 1;
            }
        }
    });
    assert_eq!(count, 0);
    // Modes 1 and 3 of versions 1–4 in each of the four leap values, v1 mode 0, and the request
    // with extension fields.
    assert_eq!(answered, 4 * 2 * 4 + 4 + 1);
}
