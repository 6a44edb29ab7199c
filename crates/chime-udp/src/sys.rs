//! Thin wrappers over the libc calls and C types that the rest of the crate builds on.
//!
//! The syscall modules ([`crate::socket`], [`crate::affinity`]) and the buffer modules
//! ([`crate::batch`], [`crate::cmsg`], [`crate::sockaddr`]) share a few needs: turning a `-1`
//! return into an `io::Error`, retrying a call interrupted by a signal, setting and reading integer
//! socket options, and making zeroed or byte-copied values of plain C structs. Keeping them here
//! keeps the `unsafe` in those modules down to the one call or cast each is about.

use std::{io, mem, os::fd::RawFd, ptr};

/// Runs a syscall wrapper that returns `-1` and sets `errno` on failure, again for as long as it
/// fails with `EINTR`.
///
/// A signal that arrives while a worker blocks in `recvmmsg` (a profiler's SIGPROF, a debugger)
/// must not look like a socket error to the worker loop; the call is simply made again.
pub(crate) fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<usize> {
    loop {
        match cvt(call()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Converts the return value of a libc call into a result: `-1` means `errno` holds the error.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<usize> {
    // A negative return other than -1 does not happen for the calls made here; treating every
    // negative value as an error keeps the cast below lossless.
    if ret < 0 {
        // `last_os_error` stores only the error number, so this does not allocate: the worker loop
        // relies on that.
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// Sets an integer-valued socket option.
pub(crate) fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int for the duration of the call and the length passed is its
    // size, so the kernel reads exactly the bytes of `value`. An invalid `fd` or option is
    // reported through errno, not undefined behaviour.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            ptr::from_ref(&value).cast(),
            socklen_of::<libc::c_int>(),
        )
    };
    cvt(ret).map(drop)
}

/// Reads an integer-valued socket option.
pub(crate) fn getsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = socklen_of::<libc::c_int>();
    // SAFETY: `value` and `len` are live locals; `len` tells the kernel that `value` has room for
    // one c_int, and the kernel writes at most `len` bytes there.
    let ret =
        unsafe { libc::getsockopt(fd, level, name, ptr::from_mut(&mut value).cast(), &mut len) };
    cvt(ret).map(|_| value)
}

/// How many datagrams the kernel dropped at this socket since it was made, mostly because its
/// receive buffer was full: `SO_MEMINFO`'s `SK_MEMINFO_DROPS`, a 32-bit count that wraps.
pub(crate) fn socket_drops(fd: RawFd) -> io::Result<u32> {
    // include/uapi/linux/sock_diag.h: SK_MEMINFO_RMEM_ALLOC .. SK_MEMINFO_DROPS (8), and
    // SK_MEMINFO_VARS (9). Newer kernels may add more; the kernel copies at most `len` bytes.
    const SK_MEMINFO_DROPS: usize = 8;
    const SK_MEMINFO_VARS: usize = 9;
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = socklen_of::<[u32; SK_MEMINFO_VARS]>();
    // SAFETY: `info` and `len` are live locals; `len` is the size of `info`, and the kernel
    // writes at most `len` bytes into it (sock_getsockopt copies min(len, its own size)).
    let ret = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            ptr::from_mut(&mut info).cast(),
            &mut len,
        )
    };
    cvt(ret)?;
    if (len as usize) < (SK_MEMINFO_DROPS + 1) * mem::size_of::<u32>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "SO_MEMINFO without a drop count",
        ));
    }
    Ok(info[SK_MEMINFO_DROPS])
}

/// The CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`): time it ran, not
/// time it spent preempted, throttled or with its virtual CPU taken by the hypervisor. Zero if
/// the clock cannot be read (it always can on Linux).
pub(crate) fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec::zeroed();
    // SAFETY: `ts` is a live, writable timespec, and clock_gettime writes nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(ts.tv_nsec).unwrap_or(0);
    std::time::Duration::new(secs, nanos)
}

/// The size of `T` as the `socklen_t` that socket calls take.
pub(crate) const fn socklen_of<T>() -> libc::socklen_t {
    // Every type passed here is a small C struct; the assertion makes the cast provably lossless.
    assert!(mem::size_of::<T>() <= u32::MAX as usize);
    mem::size_of::<T>() as libc::socklen_t
}

/// A type for which the all-zero byte pattern is a valid value, as it is for C structs made of
/// integers, arrays and raw pointers.
///
/// Ours, not bytemuck's `Zeroable` or zerocopy's `FromZeros`: the types it is for are `libc`'s,
/// and the orphan rule lets a crate implement a trait for a type only if the trait or the type is
/// its own; bytemuck's trait and libc's structs are neither (and zerocopy's traits can only be
/// derived, on the type's own definition). A newtype of ours around each struct would spread
/// conversions through the syscall code and still take one `unsafe impl` per struct, as here.
///
/// # Safety
/// An implementor must be valid when every one of its bytes is zero.
pub(crate) unsafe trait Zeroable: Sized {
    /// A value with every byte zero, the way C code `memset`s a struct before filling it in.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract is exactly that all-zero bytes are a valid `Self`.
        unsafe { mem::zeroed() }
    }
}

/// A type that can be copied to and from raw bytes: control-message payloads and headers.
///
/// Ours, not bytemuck's `Pod`, for the reason [`Zeroable`] gives: its implementors are `libc`'s.
///
/// # Safety
/// An implementor must be valid for every byte pattern of its size (no references, no enums, no
/// `bool`) and must have no padding bytes, so that copying a value into a byte buffer initialises
/// every byte of the destination.
pub(crate) unsafe trait Pod: Zeroable + Copy {}

/// Reads a `T` from the start of `src`, which need not be aligned. `None` if `src` is too short.
pub(crate) fn read_pod<T: Pod>(src: &[u8]) -> Option<T> {
    if src.len() < mem::size_of::<T>() {
        return None;
    }
    // SAFETY: `src` has at least size_of::<T>() initialised bytes (checked above); the read is
    // unaligned, so the buffer's alignment does not matter; and `T: Pod` makes any bytes a valid
    // `T`.
    Some(unsafe { ptr::read_unaligned(src.as_ptr().cast::<T>()) })
}

/// Writes `value` to the start of `dst`, which need not be aligned.
///
/// # Panics
/// If `dst` is shorter than `T`: callers size their buffers from the same constants.
pub(crate) fn write_pod<T: Pod>(dst: &mut [u8], value: T) {
    assert!(
        dst.len() >= mem::size_of::<T>(),
        "buffer too small for value"
    );
    // SAFETY: `dst` has at least size_of::<T>() writable bytes (checked above) and the write is
    // unaligned. `T: Pod` has no padding, so every byte written is initialised and `dst` stays a
    // valid `[u8]`.
    unsafe { ptr::write_unaligned(dst.as_mut_ptr().cast::<T>(), value) }
}

// The C structs below are made only of integers, integer arrays and (iovec, mmsghdr) raw
// pointers, for all of which zero is a valid value (null, for the pointers).

// SAFETY: integers and a byte array.
unsafe impl Zeroable for libc::sockaddr_storage {}
// SAFETY: integers and a byte array.
unsafe impl Zeroable for libc::sockaddr_in {}
// SAFETY: integers and a byte array.
unsafe impl Zeroable for libc::sockaddr_in6 {}
// SAFETY: a pointer (null is valid) and a length.
unsafe impl Zeroable for libc::iovec {}
// SAFETY: pointers (null is valid) and integers.
unsafe impl Zeroable for libc::mmsghdr {}
// SAFETY: an integer array.
unsafe impl Zeroable for libc::cpu_set_t {}
// SAFETY: integers.
unsafe impl Zeroable for libc::cmsghdr {}
// SAFETY: integers.
unsafe impl Zeroable for libc::in_pktinfo {}
// SAFETY: integers and a byte array.
unsafe impl Zeroable for libc::in6_pktinfo {}
// SAFETY: integers.
unsafe impl Zeroable for libc::timespec {}
// SAFETY: an integer.
unsafe impl Zeroable for libc::c_int {}
// SAFETY: an array of zeroable values is zero when all its elements are.
unsafe impl<T: Zeroable, const N: usize> Zeroable for [T; N] {}

// The control-message headers and payloads the crate reads and writes. Each is made of integers
// only, so every byte pattern is valid, and none has padding; the layout test at the bottom of this
// module checks that the sizes add up.

// SAFETY: size_t + int + int (musl spells its padding out as named fields).
unsafe impl Pod for libc::cmsghdr {}
// SAFETY: three 32-bit fields.
unsafe impl Pod for libc::in_pktinfo {}
// SAFETY: 16 bytes and a 32-bit field.
unsafe impl Pod for libc::in6_pktinfo {}
// SAFETY: time_t and long, two integers of the same width on 64-bit Linux (the test checks).
unsafe impl Pod for libc::timespec {}
// SAFETY: an integer.
unsafe impl Pod for libc::c_int {}
// SAFETY: arrays have no padding between elements, so an array of Pod values is Pod.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use super::*;

    /// The `Pod` impls claim "no padding": the struct sizes must equal the sums of their fields.
    #[test]
    fn pod_types_have_no_padding() {
        assert_eq!(size_of::<libc::in_pktinfo>(), 12);
        assert_eq!(size_of::<libc::in6_pktinfo>(), 20);
        assert_eq!(size_of::<libc::timespec>(), 2 * size_of::<libc::c_long>());
        assert_eq!(
            size_of::<libc::cmsghdr>(),
            size_of::<usize>() + 2 * size_of::<libc::c_int>()
        );
    }

    #[test]
    fn pod_round_trip_unaligned() {
        let mut buf = [0u8; 32];
        let mut ts = libc::timespec::zeroed();
        ts.tv_sec = 1_700_000_000;
        ts.tv_nsec = 123_456_789;
        write_pod(&mut buf[3..], ts);
        let back: libc::timespec = read_pod(&buf[3..]).unwrap();
        assert_eq!((back.tv_sec, back.tv_nsec), (ts.tv_sec, ts.tv_nsec));
        assert!(read_pod::<libc::timespec>(&buf[20..]).is_none());
    }

    #[test]
    fn retry_eintr_retries_only_interrupts() {
        let mut calls = 0;
        let n = retry_eintr(|| {
            calls += 1;
            if calls < 3 {
                set_errno(libc::EINTR);
                -1
            } else {
                7
            }
        })
        .unwrap();
        assert_eq!((n, calls), (7, 3));

        let err = retry_eintr(|| {
            set_errno(libc::EAGAIN);
            -1
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn thread_cpu_time_counts_running_not_sleeping() {
        use std::time::{Duration, Instant};
        let before = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(30));
        let slept = thread_cpu_time() - before;
        assert!(slept < Duration::from_millis(5), "{slept:?}");
        // Spin until the clock shows 10 ms of CPU (bounded in wall time): it advances while the
        // thread runs, and never faster than the wall clock, however loaded the machine.
        let start = Instant::now();
        let t1 = thread_cpu_time();
        let mut x = 0u64;
        while thread_cpu_time() - t1 < Duration::from_millis(10)
            && start.elapsed() < Duration::from_secs(5)
        {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spun = thread_cpu_time() - t1;
        let wall = start.elapsed();
        assert!(
            spun >= Duration::from_millis(10) && spun <= wall,
            "{spun:?} of CPU in {wall:?}"
        );
    }

    fn set_errno(value: libc::c_int) {
        // SAFETY: __errno_location returns a valid pointer to this thread's errno.
        unsafe { *libc::__errno_location() = value }
    }
}
