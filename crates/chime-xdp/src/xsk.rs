//! One AF_XDP socket: its UMEM (the frames shared with the kernel) and its four rings.
//!
//! The kernel fills frames the fill ring offers with received packets and reports them on the RX
//! ring; frames put on the TX ring are sent and come back on the completion ring. Each ring is a
//! single-producer single-consumer queue in memory shared with the kernel: the producer writes
//! descriptors and then publishes them by advancing its index (release), the consumer reads the
//! index (acquire) and then the descriptors. This module owns that memory and is where the
//! `unsafe` of AF_XDP's socket lives, the rings' own being in [`crate::ring`]; the worker sees
//! frames as byte slices and descriptors as numbers.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    ptr,
};

use crate::{
    ring::{Mapping, Ring},
    sys::{Zeroable, cvt, socklen_of},
};

/// The size of each UMEM frame: a page, the size every driver accepts.
pub(crate) const FRAME_SIZE: u32 = 4096;

/// Kicks of the TX ring per batch at most: with the default budget of 32 frames per kick, enough
/// for a batch of 256.
const MAX_KICKS: usize = 8;

/// `XDP_MAX_TX_SKB_BUDGET` (Linux 6.17): the most frames one copy-mode send kick sends.
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

/// Room the kernel leaves before each received packet, beyond its own: the XDP metadata sits in
/// it, just before the packet.
pub(crate) const FRAME_HEADROOM: u32 = 0;

/// Copy mode or zero-copy, as the driver granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// The driver moves frames into and out of the UMEM itself.
    ZeroCopy,
    /// The kernel copies each frame between the driver's buffers and the UMEM.
    Copy,
}

/// The cumulative counts `XDP_STATISTICS` gives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct XskStats {
    /// Frames dropped for want of a fill-ring frame or RX-ring room, or otherwise.
    pub(crate) rx_dropped: u64,
}

/// An AF_XDP socket bound to one queue of one interface, with its UMEM and rings.
#[derive(Debug)]
pub(crate) struct Xsk {
    fd: OwnedFd,
    umem: Mapping,
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    mode: XdpMode,
    /// Frames that are in none of the rings: ready for the fill ring.
    spare: Vec<u64>,
}

// SAFETY: a plain C struct of integers.
unsafe impl Zeroable for libc::xdp_mmap_offsets {}
// SAFETY: a plain C struct of integers.
unsafe impl Zeroable for libc::xdp_statistics {}
// SAFETY: a plain C struct of integers.
unsafe impl Zeroable for libc::sockaddr_xdp {}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live `T` and the length passed is its size, so the kernel reads
    // exactly its bytes.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            ptr::from_ref(value).cast(),
            socklen_of::<T>(),
        )
    };
    cvt(ret).map(drop)
}

impl Xsk {
    /// Makes a socket with `frames` UMEM frames and rings of `ring` entries (both powers of two),
    /// binds it to queue `queue` of interface `ifindex` in `mode`, and offers the kernel half the
    /// frames to receive into.
    pub(crate) fn new(
        ifindex: u32,
        queue: u32,
        frames: u32,
        ring: u32,
        mode: XdpMode,
    ) -> io::Result<Self> {
        assert!(frames.is_power_of_two() && ring.is_power_of_two() && ring <= frames);
        // SAFETY: socket() with constant arguments; the result is checked.
        let fd =
            cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let raw = fd.as_raw_fd();

        let umem = Mapping::new((frames * FRAME_SIZE) as usize, None, 0)?;
        let reg = libc::xdp_umem_reg {
            addr: umem.ptr.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: FRAME_SIZE,
            headroom: FRAME_HEADROOM,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
        for name in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            setsockopt(raw, name, &ring)?;
        }
        let mut off = libc::xdp_mmap_offsets::zeroed();
        let mut len = socklen_of::<libc::xdp_mmap_offsets>();
        // SAFETY: `off` and `len` are live; `len` is the room in `off`, which the kernel does not
        // exceed.
        cvt(unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                ptr::from_mut(&mut off).cast(),
                &mut len,
            )
        })?;
        let fill = Ring::map(raw, &off.fr, ring, libc::XDP_UMEM_PGOFF_FILL_RING)?;
        let comp = Ring::map(raw, &off.cr, ring, libc::XDP_UMEM_PGOFF_COMPLETION_RING)?;
        let rx = Ring::map(raw, &off.rx, ring, libc::XDP_PGOFF_RX_RING as u64)?;
        let tx = Ring::map(raw, &off.tx, ring, libc::XDP_PGOFF_TX_RING as u64)?;

        let mut sxdp = libc::sockaddr_xdp::zeroed();
        sxdp.sxdp_family = libc::AF_XDP as u16;
        sxdp.sxdp_flags = libc::XDP_USE_NEED_WAKEUP
            | match mode {
                XdpMode::ZeroCopy => libc::XDP_ZEROCOPY,
                XdpMode::Copy => libc::XDP_COPY,
            };
        sxdp.sxdp_ifindex = ifindex;
        sxdp.sxdp_queue_id = queue;
        // SAFETY: `sxdp` is a live sockaddr_xdp and the length passed is its size.
        cvt(unsafe {
            libc::bind(
                raw,
                ptr::from_ref(&sxdp).cast(),
                socklen_of::<libc::sockaddr_xdp>(),
            )
        })?;

        if mode == XdpMode::Copy {
            // A kick then sends a whole batch. Older kernels do not know the option and keep 32,
            // which `kick_tx` works around.
            if let Err(e) = setsockopt(raw, XDP_MAX_TX_SKB_BUDGET, &(ring as libc::c_int)) {
                tracing::debug!(error = %e, "XDP_MAX_TX_SKB_BUDGET refused: 32 frames per kick");
            }
        }
        let mut xsk = Self {
            fd,
            umem,
            fill,
            comp,
            rx,
            tx,
            mode,
            spare: (0..frames)
                .rev()
                .map(|i| u64::from(i * FRAME_SIZE))
                .collect(),
        };
        xsk.refill();
        Ok(xsk)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Offers spare frames to the kernel, as many as the fill ring takes, and wakes the driver if
    /// it asked to be.
    pub(crate) fn refill(&mut self) {
        let room = self.fill.free() as usize;
        let n = room.min(self.spare.len());
        let from = self.spare.len() - n;
        self.fill.produce(self.spare.drain(from..));
        if self.fill.needs_wakeup() {
            self.wake_rx();
        }
    }

    fn wake_rx(&self) {
        // SAFETY: a zero-length receive with no buffer: the kernel only runs the driver's poll.
        unsafe {
            libc::recvfrom(
                self.fd(),
                ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
    }

    /// Takes up to `max` received frames, each as its UMEM address and length.
    pub(crate) fn receive(&mut self, max: u32, mut f: impl FnMut(u64, usize)) -> u32 {
        self.rx.consume(max, |d| f(d.addr, d.len as usize))
    }

    /// Returns frames that were sent to the spare list.
    pub(crate) fn collect_completed(&mut self) {
        let spare = &mut self.spare;
        self.comp.consume(u32::MAX, |addr| {
            spare.push(addr & !u64::from(FRAME_SIZE - 1))
        });
    }

    /// Gives a frame that is done with back to the spare list.
    pub(crate) fn recycle(&mut self, addr: u64) {
        self.spare.push(addr & !u64::from(FRAME_SIZE - 1));
    }

    /// Puts the frames `(addr, len)` on the TX ring and asks the kernel to send them. Returns how
    /// many were queued; the caller recycles the rest.
    pub(crate) fn transmit(&mut self, frames: &[(u64, usize)]) -> usize {
        let n = self
            .tx
            .produce(frames.iter().map(|&(addr, len)| libc::xdp_desc {
                addr,
                len: len as u32,
                options: 0,
            })) as usize;
        if self.mode == XdpMode::Copy || self.tx.needs_wakeup() {
            self.kick_tx();
        }
        n
    }

    /// Has the kernel send what is on the TX ring. In copy mode each call sends at most the
    /// socket's budget (32 frames unless `XDP_MAX_TX_SKB_BUDGET` raised it) and says `EAGAIN`
    /// if more is left, so it is called again, a bounded number of times; `EBUSY` or `ENOBUFS`
    /// (the device is busy) leave the rest for the next batch's kick.
    fn kick_tx(&mut self) {
        for _ in 0..MAX_KICKS {
            if self.tx.all_consumed() {
                return;
            }
            // SAFETY: a zero-length send with no buffer: the kernel only drains the TX ring.
            let ret = unsafe {
                libc::sendto(
                    self.fd(),
                    ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    ptr::null(),
                    0,
                )
            };
            if ret < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN) {
                return;
            }
        }
    }

    /// The frame at UMEM address `addr`, from `before` bytes before it to `len` after it, or
    /// `None` if that range is not inside the address's own frame (a descriptor no kernel
    /// writes: the frame is then dropped, not read).
    pub(crate) fn frame_mut(&mut self, addr: u64, before: usize, len: usize) -> Option<&mut [u8]> {
        let base = addr & !u64::from(FRAME_SIZE - 1);
        let start = addr.checked_sub(before as u64).filter(|&s| s >= base)?;
        let end = addr.checked_add(len as u64)?;
        if end > base + u64::from(FRAME_SIZE) || end > self.umem.len as u64 {
            return None;
        }
        // SAFETY: the range lies within one frame of the UMEM mapping (checked above), and the
        // frame is the caller's: it was taken from the RX ring and not yet handed back to the
        // kernel, so nothing else reads or writes it while the borrow of `self` lasts.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.umem.ptr.as_ptr().add(start as usize),
                (end - start) as usize,
            )
        })
    }

    /// Room in a frame from address `addr` to its end.
    pub(crate) fn room(addr: u64) -> usize {
        FRAME_SIZE as usize - (addr & u64::from(FRAME_SIZE - 1)) as usize
    }

    /// Waits up to `timeout_ms` for frames to receive.
    pub(crate) fn wait(&self, timeout_ms: i32) {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, and the count says one.
        unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    }

    /// The socket's drop counts.
    pub(crate) fn stats(&self) -> io::Result<XskStats> {
        let mut s = libc::xdp_statistics::zeroed();
        let mut len = socklen_of::<libc::xdp_statistics>();
        // SAFETY: `s` and `len` are live; `len` is the room in `s`.
        cvt(unsafe {
            libc::getsockopt(
                self.fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                ptr::from_mut(&mut s).cast(),
                &mut len,
            )
        })?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped + s.rx_ring_full + s.rx_fill_ring_empty_descs,
        })
    }
}
