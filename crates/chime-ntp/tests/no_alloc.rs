//! The per-packet path allocates nothing: a counting global allocator, armed only around the calls
//! under test on this thread, sees no allocation while a worker's work for a batch is done.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use chime_ntp::{
    Leap, NtpShort, NtpTimestamp, ServerState, StalePolicy, check_extensions, respond,
    stamp_transmit,
};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialised with no destructor, so reading it from the allocator does not allocate.
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees are ours; the counting touches only an atomic and a const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this `layout` (via `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    ARMED.with(|armed| armed.set(true));
    f();
    ARMED.with(|armed| armed.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
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
