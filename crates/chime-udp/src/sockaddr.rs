//! Conversion between [`SocketAddr`] and the `sockaddr_storage` the kernel reads and writes.
//!
//! The batches keep one preallocated `sockaddr_storage` per datagram: `recvmmsg` writes each
//! sender's address there and `sendmmsg` reads each destination from there. These two functions
//! are the only code that looks inside one.

use std::{
    mem::{align_of, size_of},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
    ptr,
};

use crate::sys::{Zeroable, socklen_of};

// The casts below rely on sockaddr_storage being at least as large and as aligned as each concrete
// address type; POSIX promises it, and these make the compiler check it.
const _: () = assert!(size_of::<libc::sockaddr_storage>() >= size_of::<libc::sockaddr_in6>());
const _: () = assert!(align_of::<libc::sockaddr_storage>() >= align_of::<libc::sockaddr_in6>());
const _: () = assert!(size_of::<libc::sockaddr_storage>() >= size_of::<libc::sockaddr_in>());
const _: () = assert!(align_of::<libc::sockaddr_storage>() >= align_of::<libc::sockaddr_in>());

/// Writes `addr` into `storage` and returns the length to pass as `msg_namelen`.
pub(crate) fn encode(addr: &SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            let mut sin = libc::sockaddr_in::zeroed();
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            // s_addr holds the address in network byte order, which is the octets' order.
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            // SAFETY: `storage` is a valid, exclusively borrowed sockaddr_storage, which is at
            // least as large and as aligned as sockaddr_in (asserted at compile time above).
            unsafe { ptr::write(ptr::from_mut(storage).cast::<libc::sockaddr_in>(), sin) };
            socklen_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let mut sin6 = libc::sockaddr_in6::zeroed();
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            // Flow info is passed through unconverted, as std's own conversion does.
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            // SAFETY: as for sockaddr_in: `storage` is large and aligned enough for sockaddr_in6.
            unsafe { ptr::write(ptr::from_mut(storage).cast::<libc::sockaddr_in6>(), sin6) };
            socklen_of::<libc::sockaddr_in6>()
        }
    }
}

/// Reads the address the kernel wrote into `storage`, `len` being the `msg_namelen` it reported.
///
/// `None` for a family other than IPv4 or IPv6, or a length too short for the family; neither
/// happens on a UDP/IP socket.
pub(crate) fn decode(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the storage is large and aligned enough for a sockaddr_in (asserted above),
            // all of its bytes are initialised (zeroed when allocated, then written by the kernel),
            // and sockaddr_in is made of integers, so any bytes are a valid value.
            let sin = unsafe { ptr::read(ptr::from_ref(storage).cast::<libc::sockaddr_in>()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)).into())
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { ptr::read(ptr::from_ref(storage).cast::<libc::sockaddr_in6>()) };
            Some(
                SocketAddrV6::new(
                    Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )
                .into(),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let addrs: [SocketAddr; 3] = [
            "192.0.2.7:123".parse().unwrap(),
            "[2001:db8::1]:5319".parse().unwrap(),
            SocketAddrV6::new("fe80::1".parse().unwrap(), 4460, 0, 2).into(),
        ];
        for addr in addrs {
            let mut storage = libc::sockaddr_storage::zeroed();
            let len = encode(&addr, &mut storage);
            assert_eq!(decode(&storage, len), Some(addr));
        }
    }

    /// The layout must agree with the kernel's, not just with itself: compare with socket2.
    #[test]
    fn matches_socket2() {
        let addr: SocketAddr = "198.51.100.9:4123".parse().unwrap();
        let mut storage = libc::sockaddr_storage::zeroed();
        let len = encode(&addr, &mut storage);
        let theirs = socket2::SockAddr::from(addr);
        assert_eq!(len, theirs.len());
        // SAFETY: both pointers refer to at least `len` initialised bytes.
        let (ours, theirs) = unsafe {
            (
                std::slice::from_raw_parts(ptr::from_ref(&storage).cast::<u8>(), len as usize),
                std::slice::from_raw_parts(theirs.as_ptr().cast::<u8>(), len as usize),
            )
        };
        assert_eq!(ours, theirs);
    }

    #[test]
    fn rejects_short_or_foreign() {
        let mut storage = libc::sockaddr_storage::zeroed();
        let len = encode(&"[::1]:1".parse().unwrap(), &mut storage);
        assert_eq!(decode(&storage, len - 1), None);
        storage.ss_family = libc::AF_UNIX as libc::sa_family_t;
        assert_eq!(decode(&storage, len), None);
    }
}
