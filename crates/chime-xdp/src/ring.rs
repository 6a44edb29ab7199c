//! Memory shared with the kernel: a mapping, and the single-producer single-consumer rings of an
//! AF_XDP socket that live in it.
//!
//! A ring is laid out as the kernel lays it out: a producer index, a consumer index and a flags
//! word (each a `u32`, at offsets the kernel gives), then `size` descriptors. The indices run
//! freely and wrap at 2^32; an entry's slot is its index masked by `size - 1`. The producer
//! writes descriptors and then publishes them by advancing its index (release); the consumer
//! reads that index (acquire), then the descriptors, and hands the slots back by advancing its own
//! index (release), which the producer reads (acquire) before writing them again. Each side keeps
//! the other's index as last read and reads it anew only when that copy says the ring is full (or
//! empty), which saves an atomic read per operation.
//!
//! The tests at the bottom play the kernel's side over an anonymous mapping, with the kernel's
//! arithmetic rather than this module's, so the index arithmetic and the orderings run in
//! `cargo test` as any user (and under Miri, which sees a missing release as a data race).

use std::{
    io,
    mem::{align_of, size_of},
    os::fd::RawFd,
    ptr::{self, NonNull},
    sync::atomic::{AtomicU32, Ordering},
};

/// A region of memory mapped with `mmap`, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
}

impl Mapping {
    /// Maps `len` bytes: anonymous memory when `fd` is `None`, else the object at `offset` of
    /// `fd` (a ring of an AF_XDP socket), shared with the kernel either way.
    pub(crate) fn new(len: usize, fd: Option<RawFd>, offset: libc::off_t) -> io::Result<Self> {
        // MAP_POPULATE only faults the pages in ahead of their first use. Miri, which the ring
        // tests run under and which models no page faults, takes no flags but the other two.
        let populate = if cfg!(miri) { 0 } else { libc::MAP_POPULATE };
        let (flags, fd) = match fd {
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate, -1),
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
        };
        // SAFETY: a fresh mapping at an address of the kernel's choosing touches no existing
        // memory; failure is reported as MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: NonNull::new(p.cast()).expect("mmap does not return null on success"),
            len,
        })
    }
}

// SAFETY: the mapping is plain memory owned by this value; moving it to another thread moves the
// only handle to it.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are exactly a mapping this value made and nothing else unmaps;
        // every reference into it is borrowed from `self`, so none outlives this.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One ring of descriptors of type `T` (`u64` frame addresses for the fill and completion rings,
/// `xdp_desc` for RX and TX), with the cached other-side index that saves an atomic read per
/// operation.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    _map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    size: u32,
    /// Our own index (the producer's if we produce, the consumer's if we consume).
    mine: u32,
    /// The other side's index as last read.
    theirs: u32,
}

impl<T: Copy> Ring<T> {
    /// Maps ring `pgoff` of socket `fd`, laid out as `off` says, with `size` entries.
    pub(crate) fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: u64,
    ) -> io::Result<Self> {
        let len = off.desc as usize + size as usize * size_of::<T>();
        let map = Mapping::new(len, Some(fd), pgoff as libc::off_t)?;
        Ok(Self::over(map, off, size))
    }

    /// The ring of `size` entries (a power of two) that `map` holds, laid out as `off` says.
    ///
    /// # Panics
    /// If the layout does not fit in `map` or is misaligned: the kernel's never is, and a test's
    /// must not be either.
    fn over(map: Mapping, off: &libc::xdp_ring_offset, size: u32) -> Self {
        assert!(size.is_power_of_two(), "a ring of {size} entries");
        // A mapping starts on a page, so an offset aligned for a type is an address aligned
        // for it.
        let word = |at: u64| {
            (at as usize).is_multiple_of(align_of::<AtomicU32>()) && at as usize + 4 <= map.len
        };
        assert!(
            word(off.producer) && word(off.consumer) && word(off.flags),
            "ring indices outside the mapping or misaligned: {off:?}"
        );
        assert!(
            (off.desc as usize).is_multiple_of(align_of::<T>())
                && off.desc as usize + size as usize * size_of::<T>() <= map.len,
            "descriptors outside the mapping or misaligned: {off:?}"
        );
        let base = map.ptr.as_ptr();
        // SAFETY: the offsets lie within the mapping (the indices and flags with their four
        // bytes, the descriptors with all `size` of them: asserted above, and the kernel's always
        // do, as `map` sizes the mapping from them), and the indices and flags are aligned u32s,
        // which is what AtomicU32 needs.
        let (producer, consumer, flags, descs) = unsafe {
            (
                base.add(off.producer as usize).cast::<AtomicU32>(),
                base.add(off.consumer as usize).cast::<AtomicU32>(),
                base.add(off.flags as usize).cast::<AtomicU32>(),
                base.add(off.desc as usize).cast::<T>(),
            )
        };
        Self {
            _map: map,
            producer,
            consumer,
            flags,
            descs,
            size,
            mine: 0,
            theirs: 0,
        }
    }

    fn load(p: *const AtomicU32, order: Ordering) -> u32 {
        // SAFETY: `p` points into `self.map`, which lives as long as the ring, at an aligned u32
        // the kernel also accesses atomically.
        unsafe { (*p).load(order) }
    }

    fn store(p: *const AtomicU32, v: u32) {
        // SAFETY: as in `load`.
        unsafe { (*p).store(v, Ordering::Release) }
    }

    /// Whether the kernel asked to be woken to process this ring.
    pub(crate) fn needs_wakeup(&self) -> bool {
        Self::load(self.flags, Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY: `size` is a power of two and `descs` has `size` entries in the mapping.
        unsafe { self.descs.add((idx & (self.size - 1)) as usize) }
    }

    // Producer side.

    /// How many entries can be produced now.
    pub(crate) fn free(&mut self) -> u32 {
        let free = self.size - self.mine.wrapping_sub(self.theirs);
        if free > 0 {
            return free;
        }
        self.theirs = Self::load(self.consumer, Ordering::Acquire);
        self.size - self.mine.wrapping_sub(self.theirs)
    }

    /// Produces `items` (at most [`Self::free`]) and publishes them.
    pub(crate) fn produce(&mut self, items: impl Iterator<Item = T>) -> u32 {
        let room = self.free();
        let mut n = 0;
        for item in items.take(room as usize) {
            // SAFETY: the slot is one the consumer has released (it is within `free`), so the
            // kernel does not read it until the index below publishes it.
            unsafe { self.slot(self.mine.wrapping_add(n)).write(item) };
            n += 1;
        }
        if n > 0 {
            self.mine = self.mine.wrapping_add(n);
            Self::store(self.producer, self.mine);
        }
        n
    }

    /// Whether the consumer has taken everything produced.
    pub(crate) fn all_consumed(&self) -> bool {
        Self::load(self.consumer, Ordering::Acquire) == self.mine
    }

    // Consumer side.

    /// Consumes up to `max` entries, passing each to `f`, and releases them.
    pub(crate) fn consume(&mut self, max: u32, mut f: impl FnMut(T)) -> u32 {
        let mut avail = self.theirs.wrapping_sub(self.mine);
        if avail == 0 {
            self.theirs = Self::load(self.producer, Ordering::Acquire);
            avail = self.theirs.wrapping_sub(self.mine);
        }
        let n = avail.min(max);
        for i in 0..n {
            // SAFETY: the slot is published by the producer (below `theirs`, read with acquire)
            // and not yet released, so the kernel does not write it meanwhile.
            f(unsafe { self.slot(self.mine.wrapping_add(i)).read() });
        }
        if n > 0 {
            self.mine = self.mine.wrapping_add(n);
            Self::store(self.consumer, self.mine);
        }
        n
    }
}

// SAFETY: the raw pointers point into the ring's own mapping, which moves with it; a ring is used
// by one thread at a time (its worker), as AF_XDP's single-producer single-consumer rings require.
unsafe impl<T: Send> Send for Ring<T> {}

#[cfg(test)]
mod tests {
    use std::{sync::atomic::AtomicBool, thread};

    use super::*;

    /// Entries per test ring: small, so that the tests go round it many times.
    const SIZE: u32 = 8;

    /// A ring of `SIZE` `u64`s over an anonymous mapping, laid out as the kernel lays out its
    /// rings (each index on a cache line of its own, then the descriptors), its indices and the
    /// ring's cached copies starting at `start`; and the kernel's side of it.
    fn new_ring(start: u32) -> (Ring<u64>, Kernel<u64>) {
        let off = libc::xdp_ring_offset {
            producer: 0,
            consumer: 64,
            flags: 128,
            desc: 192,
        };
        let len = off.desc as usize + SIZE as usize * size_of::<u64>();
        let mut ring = Ring::over(Mapping::new(len, None, 0).unwrap(), &off, SIZE);
        let kernel = Kernel {
            producer: ring.producer,
            consumer: ring.consumer,
            descs: ring.descs,
            size: SIZE,
        };
        kernel.set(start, start);
        (ring.mine, ring.theirs) = (start, start);
        (ring, kernel)
    }

    /// The kernel's side of a ring, as a test plays it: the same memory, but the kernel's own
    /// arithmetic (an index's slot is the index modulo the size), so that a mistake in `Ring`'s
    /// is not repeated here, and no cached indices.
    struct Kernel<T> {
        producer: *const AtomicU32,
        consumer: *const AtomicU32,
        descs: *mut T,
        size: u32,
    }

    // SAFETY: the pointers are into a ring's mapping, which every test keeps alive (the ring is
    // declared before, or outlives the scope of, any thread given its kernel side); the kernel's
    // side only produces on a ring the ring consumes, and the other way round.
    unsafe impl<T: Send> Send for Kernel<T> {}

    impl<T: Copy> Kernel<T> {
        fn at(&self, p: *const AtomicU32) -> &AtomicU32 {
            // SAFETY: `p` is one of this side's index pointers, an aligned u32 in a mapping that
            // outlives every use of the kernel's side (see `Send` above).
            unsafe { &*p }
        }

        fn set(&self, producer: u32, consumer: u32) {
            self.at(self.producer).store(producer, Ordering::Relaxed);
            self.at(self.consumer).store(consumer, Ordering::Relaxed);
        }

        fn indices(&self) -> (u32, u32) {
            let p = self.at(self.producer).load(Ordering::Relaxed);
            (p, self.at(self.consumer).load(Ordering::Relaxed))
        }

        fn slot(&self, idx: u32) -> *mut T {
            // SAFETY: `idx % size` is below `size`, the descriptors the mapping holds.
            unsafe { self.descs.add((idx % self.size) as usize) }
        }

        /// Produces as many of `items` as there is room for; returns how many.
        fn produce(&self, items: &[T]) -> usize {
            let cons = self.at(self.consumer).load(Ordering::Acquire);
            let prod = self.at(self.producer).load(Ordering::Relaxed);
            let room = self.size - prod.wrapping_sub(cons);
            let n = items.len().min(room as usize);
            for (i, &item) in items[..n].iter().enumerate() {
                // SAFETY: the slot is one the consumer has released (within `room`).
                unsafe { self.slot(prod.wrapping_add(i as u32)).write(item) };
            }
            self.at(self.producer)
                .store(prod.wrapping_add(n as u32), Ordering::Release);
            n
        }

        /// Consumes up to `max` entries into `out`; returns how many.
        fn consume(&self, max: usize, out: &mut Vec<T>) -> usize {
            let prod = self.at(self.producer).load(Ordering::Acquire);
            let cons = self.at(self.consumer).load(Ordering::Relaxed);
            let n = (prod.wrapping_sub(cons) as usize).min(max);
            for i in 0..n {
                // SAFETY: the slot is published (below the producer index, read with acquire).
                out.push(unsafe { self.slot(cons.wrapping_add(i as u32)).read() });
            }
            self.at(self.consumer)
                .store(cons.wrapping_add(n as u32), Ordering::Release);
            n
        }
    }

    fn taken(ring: &mut Ring<u64>, max: u32) -> Vec<u64> {
        let mut got = Vec::new();
        let n = ring.consume(max, |d| got.push(d));
        assert_eq!(n as usize, got.len());
        got
    }

    #[test]
    fn ring_indices_wrap_at_u32_max() {
        for start in [u32::MAX - 2, u32::MAX - SIZE + 1, u32::MAX] {
            // We produce across the wrap, the kernel consumes.
            let (mut ring, kernel) = new_ring(start);
            assert_eq!(ring.free(), SIZE);
            assert_eq!(ring.produce(0..5), 5);
            assert_eq!(kernel.indices(), (start.wrapping_add(5), start));
            let mut got = Vec::new();
            assert_eq!(kernel.consume(usize::MAX, &mut got), 5);
            assert_eq!(got, [0, 1, 2, 3, 4]);
            // Its cached copy of the consumer index still says 5 taken of 8: room for 3. Only
            // when that is used up does it read the index again and find the rest.
            assert_eq!(ring.produce(10..20), 3);
            assert_eq!(ring.produce(13..20), 5);
            got.clear();
            kernel.consume(usize::MAX, &mut got);
            assert_eq!(got, Vec::from_iter(10..18));

            // The kernel produces across the wrap, we consume.
            let (mut ring, kernel) = new_ring(start);
            assert_eq!(kernel.produce(&[7, 8, 9, 10, 11]), 5);
            // Two first, so that (from u32::MAX - 2) the ring's cached producer index has wrapped
            // and its own index not yet.
            assert_eq!(taken(&mut ring, 2), [7, 8]);
            assert_eq!(taken(&mut ring, u32::MAX), [9, 10, 11]);
            assert_eq!(
                kernel.indices(),
                (start.wrapping_add(5), start.wrapping_add(5))
            );
            let batch = Vec::from_iter(100..100 + u64::from(SIZE));
            assert_eq!(kernel.produce(&batch), SIZE as usize);
            assert_eq!(taken(&mut ring, u32::MAX), batch);
            assert_eq!(
                kernel.indices(),
                (start.wrapping_add(13), start.wrapping_add(13))
            );
        }
    }

    #[test]
    fn ring_full_takes_only_what_fits() {
        let (mut ring, kernel) = new_ring(0);
        assert_eq!(ring.produce(0..100), SIZE);
        assert_eq!(ring.free(), 0);
        assert_eq!(ring.produce(100..101), 0, "a full ring takes nothing");
        // The kernel takes three: the ring reads the consumer index again, as its cached copy
        // says full, and finds room for exactly three.
        let mut got = Vec::new();
        assert_eq!(kernel.consume(3, &mut got), 3);
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(ring.produce(200..210), 3);
        assert_eq!(ring.free(), 0);
        got.clear();
        assert_eq!(kernel.consume(usize::MAX, &mut got), SIZE as usize);
        assert_eq!(got, [3, 4, 5, 6, 7, 200, 201, 202]);

        // And the kernel producing into a ring we do not consume from.
        let (mut ring, kernel) = new_ring(u32::MAX - 1);
        let many = Vec::from_iter(0..20);
        assert_eq!(kernel.produce(&many), SIZE as usize);
        assert_eq!(kernel.produce(&many), 0);
        assert_eq!(taken(&mut ring, 2), [0, 1]);
        assert_eq!(kernel.produce(&many[8..]), 2);
        // The ring takes what its cached copy of the producer index says is there, then reads
        // the index again for the two produced since.
        assert_eq!(taken(&mut ring, u32::MAX), [2, 3, 4, 5, 6, 7]);
        assert_eq!(taken(&mut ring, u32::MAX), [8, 9]);
    }

    #[test]
    fn ring_empty_gives_nothing() {
        for start in [0, u32::MAX] {
            let (mut ring, kernel) = new_ring(start);
            assert_eq!(
                ring.consume(u32::MAX, |_| panic!("an empty ring gave an entry")),
                0
            );
            assert_eq!(
                kernel.indices(),
                (start, start),
                "consuming nothing releases nothing"
            );
            kernel.produce(&[42]);
            assert_eq!(taken(&mut ring, u32::MAX), [42]);
            assert_eq!(
                ring.consume(u32::MAX, |_| panic!("a drained ring gave an entry")),
                0
            );
            // A ring we produce into is empty to the kernel until we produce.
            let (mut ring, kernel) = new_ring(start);
            let mut got = Vec::new();
            assert_eq!(kernel.consume(usize::MAX, &mut got), 0);
            assert!(ring.all_consumed());
            ring.produce([5].into_iter());
            assert!(!ring.all_consumed());
            kernel.consume(usize::MAX, &mut got);
            assert!(ring.all_consumed());
        }
    }

    #[test]
    fn ring_batches_straddle_the_end_of_the_descriptors() {
        for start in [SIZE - 3, u32::MAX - 2] {
            let (mut ring, kernel) = new_ring(start);
            assert_eq!(ring.produce(0..6), 6);
            let mut got = Vec::new();
            kernel.consume(usize::MAX, &mut got);
            assert_eq!(got, [0, 1, 2, 3, 4, 5]);

            let (mut ring, kernel) = new_ring(start);
            kernel.produce(&[10, 11, 12, 13, 14, 15]);
            assert_eq!(taken(&mut ring, 4), [10, 11, 12, 13]);
            kernel.produce(&[16, 17, 18, 19, 20, 21]);
            assert_eq!(taken(&mut ring, u32::MAX), [14, 15]);
            assert_eq!(taken(&mut ring, u32::MAX), [16, 17, 18, 19, 20, 21]);
        }
    }

    /// How many numbered entries the two-thread tests pass: fewer under Miri, which runs each
    /// step thousands of times slower.
    const PASSED: u64 = if cfg!(miri) { 300 } else { 1_000_000 };

    /// Set when this thread leaves a scope, done or panicking, so that the other stops waiting
    /// for entries that will not come and the panic is reported rather than the test hanging.
    struct Gone<'a>(&'a AtomicBool);

    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[test]
    fn ring_passes_a_sequence_to_a_consumer_on_another_thread() {
        // We produce in batches of 1 to 11 (some larger than the ring) from just before the
        // indices wrap; the kernel consumes on its own thread in batches of 1 to 5.
        let (mut ring, kernel) = new_ring(u32::MAX - 100);
        let gone = &AtomicBool::new(false);
        thread::scope(|s| {
            let consumer = s.spawn(move || {
                let (mut next, mut got, mut max) = (0, Vec::new(), 1);
                while next < PASSED {
                    got.clear();
                    if kernel.consume(max, &mut got) == 0 {
                        if gone.load(Ordering::Acquire) {
                            return; // The producer failed: its panic is the test's.
                        }
                        thread::yield_now();
                    }
                    for &d in &got {
                        assert_eq!(d, next, "lost, duplicated or out of order");
                        next += 1;
                    }
                    max = max % 5 + 1;
                }
            });
            let _gone = Gone(gone);
            let (mut next, mut batch) = (0, 1);
            while next < PASSED {
                let n = ring.produce(next..PASSED.min(next + batch));
                if n == 0 {
                    if consumer.is_finished() {
                        break; // It failed: the scope's end passes its panic on.
                    }
                    thread::yield_now();
                }
                next += u64::from(n);
                batch = batch % 11 + 1;
            }
        });
    }

    #[test]
    fn ring_takes_a_sequence_from_a_producer_on_another_thread() {
        // The kernel produces on this thread in batches of 1 to 11; we consume on another in
        // batches of 1 to 5.
        let (mut ring, kernel) = new_ring(u32::MAX - 100);
        let ring = &mut ring;
        thread::scope(|s| {
            let consumer = s.spawn(move || {
                let (mut next, mut max) = (0, 1);
                while next < PASSED {
                    let n = ring.consume(max, |d| {
                        assert_eq!(d, next, "lost, duplicated or out of order");
                        next += 1;
                    });
                    if n == 0 {
                        thread::yield_now();
                    }
                    max = max % 5 + 1;
                }
            });
            let (mut next, mut batch) = (0, 1);
            let mut items = Vec::new();
            while next < PASSED {
                items.clear();
                items.extend(next..PASSED.min(next + batch));
                let n = kernel.produce(&items);
                if n == 0 {
                    if consumer.is_finished() {
                        break; // It failed: the scope's end passes its panic on.
                    }
                    thread::yield_now();
                }
                next += n as u64;
                batch = batch % 11 + 1;
            }
        });
    }
}
