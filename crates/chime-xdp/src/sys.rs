//! The libc helpers this crate shares between its modules: turning a `-1` return into an
//! `io::Error`, the size of a C struct as a `socklen_t`, and zeroed C structs.
//!
//! chime-udp has the same three for its sockets. They are repeated here rather than made part of
//! its public surface, and `Zeroable` cannot be shared anyway: this crate implements it for
//! libc's AF_XDP structs, which only the crate that declares the trait may do.

use std::{io, mem};

/// Converts the return value of a libc call into a result: `-1` means `errno` holds the error.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<usize> {
    // A negative return other than -1 does not happen for the calls made here; treating every
    // negative value as an error keeps the cast below lossless.
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
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
/// Ours, not bytemuck's `Zeroable` (nor chime-udp's, which is private to it): the types it is for
/// are `libc`'s AF_XDP structs, and the orphan rule lets a crate implement a trait for a type only
/// if the trait or the type is its own. zerocopy's `FromZeros` can only be derived, on the type's
/// own definition.
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
