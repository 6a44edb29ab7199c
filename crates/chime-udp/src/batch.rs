//! The preallocated receive and send batches a worker reuses for every `recvmmsg` / `sendmmsg`.
//!
//! A batch owns everything one syscall needs for up to `count` datagrams: one contiguous block of
//! payload buffers, and per datagram an address, a control-message buffer, an `iovec` and an
//! `mmsghdr`. All of it is allocated once, in `new`; [`crate::UdpSocket`] then only points the
//! headers at that storage before each call and decodes what the kernel wrote after it, so the
//! worker loop never allocates.
//!
//! [`RxBatch`] is what a handler reads (payloads and [`RecvMeta`]); [`TxBatch`] is where it writes
//! its replies, each to its own peer and from its own source address.

use std::{
    fmt,
    mem::size_of,
    net::{IpAddr, SocketAddr},
    ptr,
};

use crate::{
    cmsg::{self, Cmsg},
    meta::{RecvMeta, Timestamp},
    sockaddr,
    sys::{Zeroable, socklen_of},
};

/// Control-message room per received datagram: packet info (the IPv6 form is the larger) plus a
/// timestamp (`SO_TIMESTAMPING`'s three timespecs are the larger), rounded up to leave room for
/// a message we did not ask for rather than lose the ones we did to `MSG_CTRUNC`.
const RX_CMSG_SPACE: usize = 128;
const _: () = assert!(
    RX_CMSG_SPACE
        >= cmsg::space(size_of::<libc::in6_pktinfo>())
            + cmsg::space(size_of::<[libc::timespec; 3]>())
);

/// Control-message room per sent datagram: one packet-info message choosing the source address,
/// and one `SO_TIMESTAMPING` message asking for the datagram's kernel transmit timestamp.
const TX_CMSG_SPACE: usize =
    cmsg::space(size_of::<libc::in6_pktinfo>()) + cmsg::space(size_of::<u32>());
const _: () = assert!(
    TX_CMSG_SPACE >= cmsg::space(size_of::<libc::in_pktinfo>()) + cmsg::space(size_of::<u32>())
);

/// Also room for what the error queue delivers with a looped datagram: its transmit timestamp and
/// the `IP_RECVERR`/`IPV6_RECVERR` extended error (with the peer's address).
const _: () = assert!(
    RX_CMSG_SPACE
        >= cmsg::space(size_of::<[libc::timespec; 3]>())
            + cmsg::space(size_of::<libc::sock_extended_err>() + size_of::<libc::sockaddr_in6>())
);

/// A batch of received datagrams and their metadata, filled by [`crate::UdpSocket::recv_batch`].
///
/// Allocated once with room for `count` datagrams of up to `max_datagram` bytes each, and reused
/// for every receive: [`crate::UdpSocket::recv_batch`] replaces the previous contents,
/// [`crate::UdpSocket::recv_more`] adds to them.
pub struct RxBatch {
    max_datagram: usize,
    /// How many datagrams the last receive returned.
    len: usize,
    /// How many of them, from the front, were shed ([`Self::shed_received_before`]): the batch
    /// a handler sees starts after them.
    shed: usize,
    /// `count * max_datagram` bytes: datagram `i` is at `i * max_datagram`.
    bufs: Box<[u8]>,
    metas: Box<[RecvMeta]>,
    names: Box<[libc::sockaddr_storage]>,
    controls: Box<[cmsg::Buf<RX_CMSG_SPACE>]>,
    headers: Headers,
}

impl RxBatch {
    /// Allocates a batch for `count` datagrams of up to `max_datagram` bytes each.
    ///
    /// A datagram longer than `max_datagram` is received cut short, with
    /// [`RecvMeta::truncated`] set.
    ///
    /// # Panics
    /// If `count` or `max_datagram` is zero, or the buffers' total size overflows `usize`.
    pub fn new(count: usize, max_datagram: usize) -> Self {
        Self {
            max_datagram,
            len: 0,
            shed: 0,
            bufs: payload_buffers(count, max_datagram),
            metas: vec![RecvMeta::default(); count].into_boxed_slice(),
            names: zeroed_slice(count),
            controls: vec![cmsg::Buf::new(); count].into_boxed_slice(),
            headers: Headers::new(count),
        }
    }

    /// The number of datagrams of the last receive, less any shed.
    pub fn len(&self) -> usize {
        self.len - self.shed
    }

    /// Whether the batch holds nothing: the last receive returned nothing (it timed out, or
    /// none happened yet), or everything it returned was shed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most datagrams one receive can return.
    pub fn capacity(&self) -> usize {
        self.metas.len()
    }

    /// The size of each datagram buffer: longer datagrams are truncated.
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    /// The metadata and payload of datagram `i` of the batch (not counting any shed).
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn get(&self, i: usize) -> (&RecvMeta, &[u8]) {
        assert!(i < self.len(), "datagram {i} of a batch of {}", self.len());
        let i = self.shed + i;
        let meta = &self.metas[i];
        let start = i * self.max_datagram;
        (meta, &self.bufs[start..start + meta.len])
    }

    /// The metadata and payload of every datagram of the batch (not counting any shed), in
    /// arrival order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&RecvMeta, &[u8])> {
        self.metas[self.shed..self.len]
            .iter()
            .zip(self.bufs[self.shed * self.max_datagram..].chunks_exact(self.max_datagram))
            .map(|(meta, buf)| (meta, &buf[..meta.len]))
    }

    /// Sheds the datagrams at the front of the batch that the kernel received before `cutoff`,
    /// up to the first that is younger or has no receive timestamp (the queue is in arrival
    /// order, so those after it are younger too). Returns how many; the batch is what is left.
    pub(crate) fn shed_received_before(&mut self, cutoff: Timestamp) -> usize {
        let old = self.metas[self.shed..self.len]
            .iter()
            .take_while(|m| m.timestamp.is_some_and(|t| t < cutoff))
            .count();
        self.shed += old;
        old
    }

    /// Points every header at this batch's storage and resets the lengths the kernel overwrites,
    /// returning the headers for `recvmmsg`. The previous contents are gone from here on.
    pub(crate) fn prepare_recv(&mut self) -> &mut [libc::mmsghdr] {
        self.len = 0;
        self.shed = 0;
        self.prepare_recv_after()
    }

    /// [`Self::prepare_recv`] for the free slots only, after the `len` datagrams already here,
    /// which stay: the headers returned are those of slots `len..`.
    pub(crate) fn prepare_recv_after(&mut self) -> &mut [libc::mmsghdr] {
        let start = self.len;
        let slots = self.headers.hdrs[start..]
            .iter_mut()
            .zip(self.headers.iovs[start..].iter_mut())
            .zip(self.names[start..].iter_mut())
            .zip(self.controls[start..].iter_mut())
            .zip(self.bufs[start * self.max_datagram..].chunks_exact_mut(self.max_datagram));
        // Each pointer is derived from its own element, and nothing touches the storage between
        // here and the syscall, so the kernel writes through pointers that are still valid.
        for ((((hdr, iov), name), control), buf) in slots {
            iov.iov_base = buf.as_mut_ptr().cast();
            iov.iov_len = buf.len();
            hdr.msg_len = 0;
            let m = &mut hdr.msg_hdr;
            m.msg_name = ptr::from_mut(name).cast();
            m.msg_namelen = socklen_of::<libc::sockaddr_storage>();
            m.msg_iov = ptr::from_mut(iov);
            m.msg_iovlen = 1;
            m.msg_control = control.0.as_mut_ptr().cast();
            m.msg_controllen = RX_CMSG_SPACE as _;
            m.msg_flags = 0;
        }
        &mut self.headers.hdrs[start..]
    }

    /// Empties the batch, for a backend that fills it datagram by datagram ([`Self::push`]):
    /// the AF_XDP backend, and tests that hand a [`crate::BatchHandler`] batches without a
    /// socket.
    pub fn reset(&mut self) {
        self.len = 0;
        self.shed = 0;
    }

    /// Adds one datagram received other than by `recvmmsg` (the AF_XDP backend, or a test): its
    /// metadata and payload, cut to `max_datagram` bytes (and marked truncated) if longer.
    /// Returns `false` if the batch is full.
    pub fn push(&mut self, mut meta: RecvMeta, payload: &[u8]) -> bool {
        let i = self.len;
        if i == self.capacity() {
            return false;
        }
        let n = payload.len().min(self.max_datagram);
        let start = i * self.max_datagram;
        self.bufs[start..start + n].copy_from_slice(&payload[..n]);
        meta.truncated = n < payload.len();
        meta.len = n;
        self.metas[i] = meta;
        self.len += 1;
        true
    }

    /// Decodes the `n` headers after the datagrams already here, which `recvmmsg` just filled,
    /// into metadata. `fixed_dst` is the socket's own address when it is bound to one: the
    /// destination of every datagram, for sockets that do not ask for packet info.
    pub(crate) fn complete_recv(&mut self, n: usize, fixed_dst: Option<IpAddr>) {
        let start = self.len;
        let end = (start + n).min(self.capacity());
        for i in start..end {
            let hdr = &self.headers.hdrs[i];
            #[allow(
                clippy::unnecessary_cast,
                reason = "size_t on glibc, socklen_t on musl"
            )]
            let control_len = (hdr.msg_hdr.msg_controllen as usize).min(RX_CMSG_SPACE);
            self.metas[i] = decode_meta(
                hdr,
                &self.names[i],
                &self.controls[i].0[..control_len],
                self.max_datagram,
            );
            if self.metas[i].dst_ip.is_none() {
                self.metas[i].dst_ip = fixed_dst;
            }
        }
        self.len = end;
    }
}

impl fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxBatch")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("max_datagram", &self.max_datagram)
            .finish_non_exhaustive()
    }
}

/// A batch of datagrams to send, each to its own destination and optionally from its own source
/// address, sent by [`crate::UdpSocket::send_batch`].
///
/// Allocated once with room for `count` datagrams of up to `max_datagram` bytes each; a handler
/// writes replies straight into its buffers with [`TxBatch::push_with`] or [`TxBatch::reply_to`].
pub struct TxBatch {
    max_datagram: usize,
    /// How many datagrams are queued.
    len: usize,
    /// `count * max_datagram` bytes: datagram `i` is at `i * max_datagram`.
    bufs: Box<[u8]>,
    lens: Box<[usize]>,
    dsts: Box<[SocketAddr]>,
    srcs: Box<[Option<(IpAddr, u32)>]>,
    /// Whether each queued datagram asks for its kernel transmit timestamp.
    tx_stamps: Box<[bool]>,
    names: Box<[libc::sockaddr_storage]>,
    controls: Box<[cmsg::Buf<TX_CMSG_SPACE>]>,
    headers: Headers,
}

impl TxBatch {
    /// Allocates a batch for `count` datagrams of up to `max_datagram` bytes each.
    ///
    /// # Panics
    /// If `count` or `max_datagram` is zero, or the buffers' total size overflows `usize`.
    pub fn new(count: usize, max_datagram: usize) -> Self {
        let unspecified = RecvMeta::default().src;
        Self {
            max_datagram,
            len: 0,
            bufs: payload_buffers(count, max_datagram),
            lens: vec![0; count].into_boxed_slice(),
            dsts: vec![unspecified; count].into_boxed_slice(),
            srcs: vec![None; count].into_boxed_slice(),
            tx_stamps: vec![false; count].into_boxed_slice(),
            names: zeroed_slice(count),
            controls: vec![cmsg::Buf::new(); count].into_boxed_slice(),
            headers: Headers::new(count),
        }
    }

    /// Offers the next free buffer (`max_datagram` bytes) to `fill`.
    ///
    /// If `fill` returns `Some(len)`, the first `len` bytes of the buffer are queued as a datagram
    /// to `dst`, sent from `src` (a local address and interface index, see
    /// [`TxBatch::reply_to`]) if given; if it returns `None`, nothing is queued. Returns `false`
    /// without calling `fill` if the batch is full.
    ///
    /// The buffer holds whatever an earlier datagram left there: `fill` must write every byte it
    /// returns.
    ///
    /// # Panics
    /// If `fill` returns a length longer than the buffer it was given.
    pub fn push_with(
        &mut self,
        dst: SocketAddr,
        src: Option<(IpAddr, u32)>,
        fill: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> bool {
        let i = self.len;
        if i == self.capacity() {
            return false;
        }
        let start = i * self.max_datagram;
        let buf = &mut self.bufs[start..start + self.max_datagram];
        if let Some(len) = fill(buf) {
            assert!(
                len <= self.max_datagram,
                "fill returned {len} bytes for a {}-byte buffer",
                self.max_datagram
            );
            self.lens[i] = len;
            self.dsts[i] = dst;
            self.srcs[i] = src;
            self.tx_stamps[i] = false;
            self.len += 1;
        }
        true
    }

    /// Like [`TxBatch::push_with`], addressed back to the sender of `meta` and sent from the local
    /// address and interface the datagram arrived on.
    ///
    /// On a host with several addresses this makes the reply come from the address the client
    /// asked, which a client checks. Without packet info (see [`crate::Capabilities::pktinfo`])
    /// the kernel picks the source by routing.
    pub fn reply_to(
        &mut self,
        meta: &RecvMeta,
        fill: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> bool {
        self.push_with(meta.src, meta.reply_source(), fill)
    }

    /// Asks for the kernel's software transmit timestamp of the datagram queued last (none is
    /// asked for by default); returns `false` if nothing is queued. After the send,
    /// [`crate::UdpSocket::recv_tx_timestamps`] returns each such datagram as it left, with the
    /// time it was handed to the network device. Each costs the kernel a copy of the datagram on
    /// the socket's error queue, so ask only where the time will be used (NTP's interleaved mode).
    pub fn request_tx_timestamp(&mut self) -> bool {
        match self.len.checked_sub(1) {
            Some(last) => {
                self.tx_stamps[last] = true;
                true
            }
            None => false,
        }
    }

    /// Whether any queued datagram asks for its transmit timestamp.
    pub fn wants_tx_timestamps(&self) -> bool {
        self.tx_stamps[..self.len].contains(&true)
    }

    /// The number of queued datagrams.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no datagram is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most datagrams the batch can queue.
    pub fn capacity(&self) -> usize {
        self.lens.len()
    }

    /// The size of each datagram buffer.
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    /// Discards every queued datagram.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The queued payloads, in the order they were queued, for last-moment edits such as stamping
    /// transmit times.
    pub fn payloads_mut(&mut self) -> impl ExactSizeIterator<Item = &mut [u8]> {
        self.bufs
            .chunks_exact_mut(self.max_datagram)
            .zip(&self.lens[..self.len])
            .map(|(buf, &len)| &mut buf[..len])
    }

    /// The destination and payload of every queued datagram, in the order they were queued.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (SocketAddr, &[u8])> {
        self.bufs
            .chunks_exact(self.max_datagram)
            .zip(&self.lens[..self.len])
            .zip(&self.dsts[..self.len])
            .map(|((buf, &len), &dst)| (dst, &buf[..len]))
    }

    /// Encodes each queued datagram's destination and source, points its header at this batch's
    /// storage, and returns the queued headers for `sendmmsg`.
    pub(crate) fn prepare_send(&mut self) -> &mut [libc::mmsghdr] {
        let slots = self
            .headers
            .hdrs
            .iter_mut()
            .zip(self.headers.iovs.iter_mut())
            .zip(self.names.iter_mut())
            .zip(self.controls.iter_mut())
            .zip(self.bufs.chunks_exact_mut(self.max_datagram))
            .zip(self.lens.iter().zip(self.dsts.iter().zip(self.srcs.iter())))
            .zip(self.tx_stamps.iter())
            .take(self.len);
        // As in `prepare_recv`, each pointer comes from its own element and stays valid until the
        // syscall, which reads through them.
        for ((((((hdr, iov), name), control), buf), (&len, (dst, &src))), &stamp) in slots {
            let name_len = sockaddr::encode(dst, name);
            let control_len = encode_control(src, stamp, &mut control.0);
            iov.iov_base = buf.as_mut_ptr().cast();
            iov.iov_len = len;
            hdr.msg_len = 0;
            let m = &mut hdr.msg_hdr;
            m.msg_name = ptr::from_mut(name).cast();
            m.msg_namelen = name_len;
            m.msg_iov = ptr::from_mut(iov);
            m.msg_iovlen = 1;
            m.msg_control = if control_len == 0 {
                ptr::null_mut()
            } else {
                control.0.as_mut_ptr().cast()
            };
            m.msg_controllen = control_len as _;
            m.msg_flags = 0;
        }
        &mut self.headers.hdrs[..self.len]
    }
}

impl fmt::Debug for TxBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxBatch")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("max_datagram", &self.max_datagram)
            .finish_non_exhaustive()
    }
}

/// The `mmsghdr` and `iovec` arrays of a batch, handed to the kernel.
///
/// They hold raw pointers into the storage of the batch that owns them, rewritten by
/// `prepare_recv` / `prepare_send` before every call.
struct Headers {
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
}

impl Headers {
    fn new(count: usize) -> Self {
        Self {
            hdrs: zeroed_slice(count),
            iovs: zeroed_slice(count),
        }
    }
}

// SAFETY: the raw pointers make these arrays !Send and !Sync by default. They point only into heap
// storage owned by the same batch (moving the batch to another thread moves the boxes, not the
// storage, so they stay valid), they are rewritten before every syscall, and they are dereferenced
// only by the kernel during a syscall made through `&mut` access to the batch. Shared access never
// reads through them.
unsafe impl Send for Headers {}
// SAFETY: as above: `&Headers` gives no way to dereference the pointers.
unsafe impl Sync for Headers {}

fn payload_buffers(count: usize, max_datagram: usize) -> Box<[u8]> {
    assert!(count > 0, "a batch needs room for at least one datagram");
    assert!(
        max_datagram > 0,
        "a batch needs datagram buffers of at least one byte"
    );
    let total = count
        .checked_mul(max_datagram)
        .expect("batch size overflows usize");
    vec![0; total].into_boxed_slice()
}

fn zeroed_slice<T: Zeroable + Clone>(count: usize) -> Box<[T]> {
    vec![T::zeroed(); count].into_boxed_slice()
}

/// Decodes one received datagram's header, sender address and control messages.
fn decode_meta(
    hdr: &libc::mmsghdr,
    name: &libc::sockaddr_storage,
    control: &[u8],
    max_datagram: usize,
) -> RecvMeta {
    let mut meta = RecvMeta::default();
    if let Some(src) = sockaddr::decode(name, hdr.msg_hdr.msg_namelen) {
        meta.src = src;
    }
    meta.len = (hdr.msg_len as usize).min(max_datagram);
    meta.truncated = hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
    for msg in cmsg::Iter::new(control) {
        apply_cmsg(&mut meta, &msg);
    }
    meta
}

fn apply_cmsg(meta: &mut RecvMeta, msg: &Cmsg<'_>) {
    match (msg.level, msg.ty) {
        (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
            if let Some(info) = msg.decode::<libc::in_pktinfo>() {
                meta.dst_ip = Some(IpAddr::from(info.ipi_addr.s_addr.to_ne_bytes()));
                meta.reply_ip = Some(IpAddr::from(info.ipi_spec_dst.s_addr.to_ne_bytes()));
                meta.ifindex = u32::try_from(info.ipi_ifindex).unwrap_or(0);
            }
        }
        (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
            if let Some(info) = msg.decode::<libc::in6_pktinfo>() {
                let ip = IpAddr::from(info.ipi6_addr.s6_addr);
                meta.dst_ip = Some(ip);
                // A multicast address cannot be a source; let the kernel pick one.
                meta.reply_ip = (!ip.is_multicast()).then_some(ip);
                meta.ifindex = info.ipi6_ifindex;
            }
        }
        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPING) => {
            // Three timespecs: software, (deprecated) legacy, hardware. We ask for software only.
            if let Some(ts) = msg.decode::<[libc::timespec; 3]>() {
                meta.timestamp = Timestamp::from_timespec(&ts[0]);
            }
        }
        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
            if let Some(ts) = msg.decode::<libc::timespec>() {
                meta.timestamp = Timestamp::from_timespec(&ts);
            }
        }
        _ => {}
    }
}

/// Writes the packet-info message that makes a datagram leave from `src`, and with `tx_stamp` the
/// per-datagram `SO_TIMESTAMPING` request for its software transmit timestamp; returns the bytes
/// written (0 when there is neither).
fn encode_control(src: Option<(IpAddr, u32)>, tx_stamp: bool, control: &mut [u8]) -> usize {
    let mut enc = cmsg::Encoder::new(control);
    if tx_stamp {
        // Only the "record" flags may be set per datagram; reporting (SOF_TIMESTAMPING_SOFTWARE)
        // is the socket's, on since `bind`.
        // A small flag value: the cast to the kernel's __u32 (read as int here) is lossless.
        let record = libc::SOF_TIMESTAMPING_TX_SOFTWARE as libc::c_int;
        enc.push(libc::SOL_SOCKET, libc::SO_TIMESTAMPING, record);
    }
    match src {
        None => {}
        Some((IpAddr::V4(ip), ifindex)) => {
            let mut info = libc::in_pktinfo::zeroed();
            // The kernel takes `ipi_spec_dst` as the source address and `ipi_ifindex` as the
            // outgoing interface; `ipi_addr` is ignored on send.
            info.ipi_spec_dst.s_addr = u32::from_ne_bytes(ip.octets());
            info.ipi_ifindex = libc::c_int::try_from(ifindex).unwrap_or(0);
            enc.push(libc::IPPROTO_IP, libc::IP_PKTINFO, info);
        }
        Some((IpAddr::V6(ip), ifindex)) => {
            let mut info = libc::in6_pktinfo::zeroed();
            info.ipi6_addr.s6_addr = ip.octets();
            info.ipi6_ifindex = ifindex;
            enc.push(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info);
        }
    }
    enc.finish()
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn push_with_fills_queues_and_refuses_when_full() {
        let mut tx = TxBatch::new(2, 16);
        let dst: SocketAddr = "192.0.2.1:123".parse().unwrap();
        assert!(tx.push_with(dst, None, |buf| {
            assert_eq!(buf.len(), 16);
            buf[..3].copy_from_slice(b"abc");
            Some(3)
        }));
        // Declining to fill queues nothing but still reports room.
        assert!(tx.push_with(dst, None, |_| None));
        assert_eq!(tx.len(), 1);
        assert!(tx.push_with(dst, None, |buf| {
            buf[0] = b'x';
            Some(1)
        }));
        assert!(!tx.push_with(dst, None, |_| unreachable!("batch is full")));

        for p in tx.payloads_mut() {
            p[0] = p[0].to_ascii_uppercase();
        }
        let queued: Vec<_> = tx.iter().map(|(d, p)| (d, p.to_vec())).collect();
        assert_eq!(queued, vec![(dst, b"Abc".to_vec()), (dst, b"X".to_vec())]);

        tx.clear();
        assert!(tx.is_empty());
        assert_eq!(tx.payloads_mut().count(), 0);
    }

    #[test]
    #[should_panic(expected = "fill returned 9 bytes")]
    fn overlong_fill_panics() {
        TxBatch::new(1, 8).push_with("192.0.2.1:1".parse().unwrap(), None, |_| Some(9));
    }

    #[test]
    fn source_encoding_round_trips_through_decoder() {
        let mut buf = [0u8; TX_CMSG_SPACE];
        let len = encode_control(
            Some((Ipv4Addr::new(192, 0, 2, 9).into(), 4)),
            false,
            &mut buf,
        );
        let msg = cmsg::Iter::new(&buf[..len]).next().unwrap();
        let info: libc::in_pktinfo = msg.decode().unwrap();
        assert_eq!(info.ipi_spec_dst.s_addr.to_ne_bytes(), [192, 0, 2, 9]);
        assert_eq!(info.ipi_ifindex, 4);

        let len = encode_control(Some((Ipv6Addr::LOCALHOST.into(), 1)), false, &mut buf);
        let mut meta = RecvMeta::default();
        apply_cmsg(&mut meta, &cmsg::Iter::new(&buf[..len]).next().unwrap());
        assert_eq!(meta.dst_ip, Some(Ipv6Addr::LOCALHOST.into()));
        assert_eq!(meta.reply_source(), Some((Ipv6Addr::LOCALHOST.into(), 1)));

        assert_eq!(encode_control(None, false, &mut buf), 0);
    }

    #[test]
    fn tx_timestamp_request_rides_with_the_source() {
        let mut buf = [0u8; TX_CMSG_SPACE];
        let src = Some((Ipv6Addr::LOCALHOST.into(), 1));
        let len = encode_control(src, true, &mut buf);
        let msgs: Vec<_> = cmsg::Iter::new(&buf[..len])
            .map(|m| (m.level, m.ty, m.decode::<libc::c_int>()))
            .collect();
        assert_eq!(msgs.len(), 2);
        let flags = libc::SOF_TIMESTAMPING_TX_SOFTWARE as libc::c_int;
        assert_eq!(
            msgs[0],
            (libc::SOL_SOCKET, libc::SO_TIMESTAMPING, Some(flags))
        );
        assert_eq!(msgs[1].1, libc::IPV6_PKTINFO);

        let mut tx = TxBatch::new(2, 16);
        assert!(!tx.request_tx_timestamp(), "nothing queued yet");
        let dst: SocketAddr = "192.0.2.1:123".parse().unwrap();
        tx.push_with(dst, None, |_| Some(1));
        assert!(!tx.wants_tx_timestamps());
        assert!(tx.request_tx_timestamp());
        assert!(tx.wants_tx_timestamps());
        tx.clear();
        tx.push_with(dst, None, |_| Some(1));
        assert!(
            !tx.wants_tx_timestamps(),
            "a new datagram starts without the request"
        );
    }

    #[test]
    fn ipv6_multicast_destination_is_not_a_reply_source() {
        let mut buf = [0u8; TX_CMSG_SPACE];
        let group: Ipv6Addr = "ff02::101".parse().unwrap();
        let len = encode_control(Some((group.into(), 2)), false, &mut buf);
        let mut meta = RecvMeta::default();
        apply_cmsg(&mut meta, &cmsg::Iter::new(&buf[..len]).next().unwrap());
        assert_eq!(meta.dst_ip, Some(group.into()));
        assert_eq!(meta.reply_source(), None);
    }

    /// Both timestamp interfaces decode, so a kernel that only has the older one still gives T2.
    #[test]
    fn both_timestamp_forms_decode() {
        let mut ts = libc::timespec::zeroed();
        ts.tv_sec = 1_800_000_000;
        ts.tv_nsec = 42;
        let expected = Some(Timestamp {
            secs: 1_800_000_000,
            nanos: 42,
        });

        let mut buf = [0u8; RX_CMSG_SPACE];
        let mut enc = cmsg::Encoder::new(&mut buf);
        enc.push(libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS, ts);
        let len = enc.finish();
        let mut meta = RecvMeta::default();
        cmsg::Iter::new(&buf[..len]).for_each(|m| apply_cmsg(&mut meta, &m));
        assert_eq!(meta.timestamp, expected);

        // SO_TIMESTAMPING: the software stamp is the first of three; the others are zero here.
        let mut enc = cmsg::Encoder::new(&mut buf);
        enc.push(
            libc::SOL_SOCKET,
            libc::SCM_TIMESTAMPING,
            [ts, libc::timespec::zeroed(), libc::timespec::zeroed()],
        );
        let len = enc.finish();
        let mut meta = RecvMeta::default();
        cmsg::Iter::new(&buf[..len]).for_each(|m| apply_cmsg(&mut meta, &m));
        assert_eq!(meta.timestamp, expected);
    }

    #[test]
    fn batches_are_send() {
        fn is_send<T: Send>() {}
        is_send::<RxBatch>();
        is_send::<TxBatch>();
    }
}
