//! The server's batch path allocates nothing once the responder exists (STYLE.md §5), shown with
//! a counting global allocator in the manner of roughenough's `alloc_tests.rs`.
//!
//! The allocator comes from chime-udp, the one crate with low-level code; it counts per
//! thread.

use chime_roughtime::{
    BatchParams, DropReason, LongTermKey, OnlineKey, REQUEST_LEN, Responder, ResponderConfig,
    Ticket, Version, VersionSet, build_request,
};
use chime_udp::counting_alloc::{CountingAlloc, assert_counting, thread_allocations};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn batch_path_does_not_allocate() {
    const NOW_S: u64 = 1_800_000_000;
    let long = LongTermKey::from_seed(&[5; 32]);
    let delegation = long
        .delegate(OnlineKey::from_seed(&[6; 32]), NOW_S - 60, NOW_S + 60)
        .unwrap();
    let offers: [&[Version]; 6] = [
        &[Version::Rfc10049],
        &[Version::Draft12],
        &[Version::Draft11, Version::Draft08],
        &[Version::Google],
        &[Version::Rfc10049, Version::Draft12],
        &[Version::Draft07],
    ];
    let requests: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            let versions = offers[i % offers.len()];
            let nonce = vec![i as u8; versions[0].family().nonce_len()];
            let mut out = vec![0u8; REQUEST_LEN];
            build_request(&mut out, versions, &nonce, Some(&long.srv())).unwrap();
            out
        })
        .collect();
    let garbage = vec![0xa5u8; 1200];
    let mut replies = vec![[0u8; 1500]; requests.len()];
    let mut tickets: Vec<Result<Ticket, DropReason>> = vec![Err(DropReason::TooShort); 65];
    let mut lengths = vec![0usize; 64];
    let mut counters = [0u64; DropReason::COUNT];
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::ALL,
        capacity: 64,
    });

    assert_counting();
    let before = thread_allocations();
    for round in 0..3u64 {
        let mut batch = responder.begin(BatchParams {
            now_unix_us: NOW_S * 1_000_000 + round,
            radius_us: 1_000_000,
            delegation: &delegation,
        });
        for (slot, request) in tickets.iter_mut().zip(&requests) {
            *slot = batch.add(request);
        }
        tickets[64] = batch.add(&garbage);
        let signed = batch.sign();
        for ((ticket, reply), len) in tickets.iter().zip(replies.iter_mut()).zip(&mut lengths) {
            match ticket.and_then(|t| signed.write_reply(t, reply)) {
                Ok(n) => *len = n,
                Err(reason) => counters[reason.index()] += 1,
            }
        }
        if let Err(reason) = tickets[64] {
            counters[reason.index()] += 1;
        }
    }
    let allocations = thread_allocations() - before;

    assert_eq!(allocations, 0, "the batch path allocated");
    assert!(lengths.iter().all(|&n| n > 0 && n <= REQUEST_LEN));
    assert_eq!(counters[DropReason::Malformed.index()], 3);
    assert_eq!(counters.iter().sum::<u64>(), 3);
}
