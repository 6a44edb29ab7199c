//! A counting global allocator for the workspace's "the hot path does not allocate" tests, built
//! only with the `counting-alloc` feature, which only tests turn on (as dev-dependencies).
//!
//! It lives here because a `GlobalAlloc` implementation needs `unsafe`, and this crate and
//! chime-xdp are the only ones that may hold it: the four forwarding calls below, each with its
//! SAFETY comment. A test binary installs it with safe code:
//!
//! ```
//! use chime_udp::counting_alloc::{CountingAlloc, allocations_in};
//!
//! #[global_allocator]
//! static GLOBAL: CountingAlloc = CountingAlloc;
//!
//! let (_, n) = allocations_in(|| vec![1u8; 16]);
//! assert_eq!(n, 1);
//! ```
//!
//! Counts are kept per thread, so a test harness and other tests allocating concurrently do not
//! disturb a measurement. Nothing here is used unless a binary installs it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator and counts allocations (alloc, alloc_zeroed, realloc) per
/// thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

thread_local! {
    // Const-initialised and without a destructor, so reading it from inside the allocator neither
    // allocates nor fails during thread teardown.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

/// Allocations made so far by the calling thread (zero unless [`CountingAlloc`] is installed).
pub fn thread_allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Panics unless [`CountingAlloc`] is the binary's global allocator: a test measuring without it
/// would see no allocation, and pass for that. One allocation, counted on the calling thread (and
/// the allocator, once installed, counts on every thread).
pub fn assert_counting() {
    let before = thread_allocations();
    drop(std::hint::black_box(Box::new(0u64)));
    assert!(
        thread_allocations() > before,
        "the counting allocator is not installed (`#[global_allocator] static GLOBAL: \
         CountingAlloc = CountingAlloc;`): allocations cannot be counted"
    );
}

/// Runs `f` and returns its result with the allocations the calling thread made meanwhile,
/// having first shown that they are counted ([`assert_counting`]).
pub fn allocations_in<R>(f: impl FnOnce() -> R) -> (R, u64) {
    assert_counting();
    let before = thread_allocations();
    let r = f();
    (r, thread_allocations() - before)
}

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged,
// so the GlobalAlloc contract is the system allocator's; the counting touches only a thread-local
// integer.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged; the caller upholds alloc's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged; the caller upholds alloc_zeroed's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged; the caller upholds realloc's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; the caller upholds dealloc's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}
