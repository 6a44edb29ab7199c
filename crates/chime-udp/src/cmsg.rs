//! Typed encoding and iteration of socket control messages ("cmsgs").
//!
//! Each datagram that `recvmmsg` returns comes with a buffer of control messages: the address and
//! interface it was sent to (`IP_PKTINFO` / `IPV6_PKTINFO`) and the kernel's receive timestamp.
//! Each datagram handed to `sendmmsg` may carry one too, choosing its source address. This module
//! is the one place that knows how such a buffer is laid out (a `cmsghdr`, its payload, padding up
//! to the next aligned header), so [`crate::batch`] deals in typed values and never in pointer
//! arithmetic.
//!
//! Unlike the C `CMSG_*` macros, both directions work on byte slices with bounds checks and read
//! and write unaligned, so a truncated buffer (`MSG_CTRUNC`) or a bogus length yields fewer
//! messages, never a read past the end.

use std::mem::size_of;

use crate::sys::{Pod, read_pod, write_pod};

/// Rounds `len` up as `CMSG_ALIGN` does on Linux: to the size of `cmsghdr::cmsg_len` (a size_t).
const fn align(len: usize) -> usize {
    (len + size_of::<usize>() - 1) & !(size_of::<usize>() - 1)
}

/// Bytes from the start of a control message to its payload (`CMSG_LEN(0)`).
const HDR_LEN: usize = align(size_of::<libc::cmsghdr>());

/// Buffer space one control message with a payload of `payload` bytes takes (`CMSG_SPACE`).
pub(crate) const fn space(payload: usize) -> usize {
    HDR_LEN + align(payload)
}

/// The value of `cmsg_len` for a payload of `payload` bytes (`CMSG_LEN`).
const fn len(payload: usize) -> usize {
    HDR_LEN + payload
}

/// Storage for one datagram's control messages.
///
/// The kernel copies control data without caring about its alignment and this module reads and
/// writes unaligned, so nothing here needs it; aligning like a `cmsghdr` anyway costs nothing and
/// keeps the buffer valid for the C `CMSG_*` macros, which do assume it.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Buf<const N: usize>(pub(crate) [u8; N]);

impl<const N: usize> Buf<N> {
    pub(crate) const fn new() -> Self {
        Self([0; N])
    }
}

/// One control message found in a buffer: its level and type, and its payload bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cmsg<'a> {
    pub(crate) level: libc::c_int,
    pub(crate) ty: libc::c_int,
    pub(crate) data: &'a [u8],
}

impl Cmsg<'_> {
    /// The payload as a `T`, or `None` if the payload is shorter than `T` (a truncated message or
    /// one from a kernel that lays this type out differently).
    pub(crate) fn decode<T: Pod>(&self) -> Option<T> {
        read_pod(self.data)
    }
}

/// Iterates over the control messages in the filled part of a receive control buffer.
#[derive(Clone, Debug)]
pub(crate) struct Iter<'a> {
    rest: &'a [u8],
}

impl<'a> Iter<'a> {
    /// `buf` is the part of the control buffer the kernel filled: `msg_controllen` bytes.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { rest: buf }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = Cmsg<'a>;

    fn next(&mut self) -> Option<Cmsg<'a>> {
        let hdr: libc::cmsghdr = read_pod(self.rest)?;
        #[allow(
            clippy::unnecessary_cast,
            reason = "size_t on glibc, socklen_t on musl"
        )]
        let msg_len = hdr.cmsg_len as usize;
        if msg_len < HDR_LEN || msg_len > self.rest.len() {
            // A length the buffer cannot hold: the kernel truncated the buffer mid-message. Nothing
            // after it can be trusted.
            self.rest = &[];
            return None;
        }
        let item = Cmsg {
            level: hdr.cmsg_level,
            ty: hdr.cmsg_type,
            data: &self.rest[HDR_LEN..msg_len],
        };
        // The last message's padding may be missing from the filled length.
        self.rest = &self.rest[align(msg_len).min(self.rest.len())..];
        Some(item)
    }
}

/// Appends control messages to a send control buffer.
#[derive(Debug)]
pub(crate) struct Encoder<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Encoder<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    /// Appends one control message with `value` as its payload.
    ///
    /// # Panics
    /// If the buffer has no room for it: buffers are sized at compile time for the messages the
    /// crate sends, so this is a bug, not an input error.
    pub(crate) fn push<T: Pod>(&mut self, level: libc::c_int, ty: libc::c_int, value: T) {
        let start = self.len;
        let end = start + space(size_of::<T>());
        assert!(
            end <= self.buf.len(),
            "control buffer too small: need {end} bytes, have {}",
            self.buf.len()
        );
        let mut hdr = <libc::cmsghdr as crate::sys::Zeroable>::zeroed();
        // `as _`: cmsg_len is size_t on glibc and socklen_t on musl.
        hdr.cmsg_len = len(size_of::<T>()) as _;
        hdr.cmsg_level = level;
        hdr.cmsg_type = ty;
        let msg = &mut self.buf[start..end];
        msg.fill(0);
        write_pod(msg, hdr);
        write_pod(&mut msg[HDR_LEN..], value);
        self.len = end;
    }

    /// The number of bytes written: the value for `msg_controllen`.
    pub(crate) fn finish(self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Zeroable;

    #[test]
    fn sizes_match_libc_macros() {
        for payload in [0usize, 1, 4, 12, 16, 20, 48] {
            let p = payload as libc::c_uint;
            // SAFETY: CMSG_SPACE and CMSG_LEN are pure arithmetic on their argument.
            let (c_space, c_len) = unsafe { (libc::CMSG_SPACE(p), libc::CMSG_LEN(p)) };
            assert_eq!(space(payload), c_space as usize, "space({payload})");
            assert_eq!(len(payload), c_len as usize, "len({payload})");
        }
    }

    #[test]
    fn encode_then_iterate() {
        let mut buf = Buf::<128>::new();
        let mut enc = Encoder::new(&mut buf.0);
        let mut info = libc::in_pktinfo::zeroed();
        info.ipi_ifindex = 3;
        info.ipi_spec_dst.s_addr = u32::from_ne_bytes([192, 0, 2, 1]);
        enc.push(libc::IPPROTO_IP, libc::IP_PKTINFO, info);
        enc.push(libc::SOL_SOCKET, 1234, 42 as libc::c_int);
        let used = enc.finish();
        assert_eq!(
            used,
            space(size_of::<libc::in_pktinfo>()) + space(size_of::<libc::c_int>())
        );

        let msgs: Vec<_> = Iter::new(&buf.0[..used]).collect();
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            (msgs[0].level, msgs[0].ty),
            (libc::IPPROTO_IP, libc::IP_PKTINFO)
        );
        let back: libc::in_pktinfo = msgs[0].decode().unwrap();
        assert_eq!(back.ipi_ifindex, 3);
        assert_eq!(back.ipi_spec_dst.s_addr.to_ne_bytes(), [192, 0, 2, 1]);
        assert_eq!(msgs[1].decode::<libc::c_int>(), Some(42));
        // A payload too short for the requested type is refused, not over-read.
        assert!(msgs[1].decode::<libc::in6_pktinfo>().is_none());
    }

    #[test]
    fn truncated_buffer_stops_iteration() {
        let mut buf = Buf::<64>::new();
        let mut enc = Encoder::new(&mut buf.0);
        enc.push(libc::SOL_SOCKET, 1, [libc::timespec::zeroed(); 2]);
        let used = enc.finish();
        // Cut inside the payload: the header claims more than is there.
        assert_eq!(Iter::new(&buf.0[..used - 8]).count(), 0);
        // Cut inside the header.
        assert_eq!(Iter::new(&buf.0[..4]).count(), 0);
        assert_eq!(Iter::new(&[]).count(), 0);
    }

    #[test]
    fn zero_length_header_does_not_loop() {
        let buf = [0u8; 64];
        assert_eq!(Iter::new(&buf).count(), 0);
    }

    #[test]
    #[should_panic(expected = "control buffer too small")]
    fn overfull_encoder_panics() {
        let mut buf = [0u8; 16];
        Encoder::new(&mut buf).push(libc::SOL_SOCKET, 1, 1 as libc::c_int);
    }
}
