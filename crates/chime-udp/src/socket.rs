//! The UDP socket: binding with probe-and-degrade options, and batched receive and send.
//!
//! [`UdpSocket::bind`] turns on everything a time server wants from the kernel and records what
//! this kernel actually granted in [`Capabilities`]: receive timestamps (so T2 is when the
//! datagram arrived, not when a busy worker got round to it), packet info (so a reply leaves from
//! the address the request was sent to), a large receive buffer. A missing feature degrades the
//! service, it does not stop it.
//!
//! [`UdpSocket::recv_batch`] and [`UdpSocket::send_batch`] are one `recvmmsg` and (normally) one
//! `sendmmsg` over the preallocated batches of [`crate::batch`].

use std::{
    fmt, io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd},
    ptr,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use socket2::{Domain, Protocol, Socket, Type};

use crate::{
    RxBatch, TxBatch,
    error::ConfigError,
    sys::{getsockopt_int, retry_eintr, setsockopt_int, socket_drops},
};

/// How to bind one [`UdpSocket`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketConfig {
    /// The local address and port; port 0 lets the kernel choose.
    pub addr: SocketAddr,
    /// Set `SO_REUSEPORT`, so that several sockets (one per worker thread) can bind the same
    /// address and the kernel spreads clients over them. Default `true`.
    pub reuse_port: bool,
    /// The receive buffer to ask for, in bytes: `SO_RCVBUFFORCE` (which needs `CAP_NET_ADMIN`)
    /// falling back to `SO_RCVBUF` (capped by `net.core.rmem_max`). `None` keeps the system
    /// default. See [`Capabilities::recv_buffer`] for what was granted.
    pub recv_buffer: Option<usize>,
    /// How long [`UdpSocket::recv_batch`] waits before returning `Ok(0)`; must not be zero.
    ///
    /// `None` (the default) waits until a datagram arrives or the socket is shut down with
    /// [`UdpSocket::shutdown_read`], which is how workers are stopped. It also arms no timer for
    /// each wait: with `SO_RCVTIMEO` set, a worker that sleeps between lone requests spent about
    /// 1.5–2 µs more CPU per reply (measured at 40k requests/s on loopback).
    pub read_timeout: Option<Duration>,
    /// Ask the kernel for receive timestamps ([`crate::RecvMeta::timestamp`]). Default `true`; a
    /// protocol that never reads them (Roughtime stamps a batch, not a datagram) saves the
    /// kernel's per-datagram timestamp and control message by turning them off.
    pub rx_timestamps: bool,
}

impl SocketConfig {
    /// The defaults for `addr`: `SO_REUSEPORT`, the system's receive buffer, no read timeout,
    /// kernel receive timestamps.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            reuse_port: true,
            recv_buffer: None,
            read_timeout: None,
            rx_timestamps: true,
        }
    }
}

/// What the kernel granted when a socket was bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Kernel receive timestamps are on: [`crate::RecvMeta::timestamp`] is filled in.
    pub rx_timestamps: bool,
    /// Replies leave from the address the request was sent to, and [`crate::RecvMeta::dst_ip`]
    /// is filled in: by packet info (`IP_PKTINFO` / `IPV6_RECVPKTINFO`, which also gives
    /// `ifindex`) on a wildcard bind, by the bind itself on a socket bound to one address.
    pub pktinfo: bool,
    /// The effective receive buffer in bytes, as the kernel reports it (`SO_RCVBUF`, which counts
    /// the kernel's bookkeeping overhead too: twice what was set).
    pub recv_buffer: usize,
}

/// The outcome of one [`UdpSocket::send_batch`].
#[derive(Debug, Default)]
pub struct SendOutcome {
    /// Datagrams the kernel accepted.
    pub sent: usize,
    /// Datagrams that failed and were dropped.
    pub errors: usize,
    /// The error of the last datagram that failed.
    pub last_error: Option<io::Error>,
}

/// A UDP socket that receives and sends in batches.
pub struct UdpSocket {
    socket: Socket,
    caps: Capabilities,
    timestamping: TimestampMode,
    /// The address bound to, when it is one address rather than a wildcard: every datagram's
    /// destination, with no packet info needed to learn it.
    fixed_dst: Option<IpAddr>,
    /// Set by [`UdpSocket::shutdown_read`]: from then on receives report nothing.
    shut_down: AtomicBool,
}

impl UdpSocket {
    /// Creates a UDP socket, sets it up as `cfg` says, and binds it.
    ///
    /// Always: close-on-exec, `IPV6_V6ONLY` for IPv6 addresses (so an IPv4 and an IPv6 socket
    /// can share a port, and addresses are never IPv4-mapped), and don't-fragment on IPv4 (so a
    /// datagram larger than the path MTU fails with `EMSGSIZE` rather than going out in pieces). As configured: `SO_REUSEPORT`, the
    /// receive buffer, the read timeout. Probed, falling back without error: receive timestamps
    /// (`SO_TIMESTAMPING` software timestamps, else `SO_TIMESTAMPNS`, else none) and packet info
    /// (`IP_PKTINFO` / `IPV6_RECVPKTINFO`); see [`UdpSocket::capabilities`].
    ///
    /// Errors: the bind itself, an option that was asked for and failed, or an invalid
    /// configuration (a zero read timeout), as [`io::ErrorKind::InvalidInput`] wrapping a
    /// [`ConfigError`].
    pub fn bind(cfg: &SocketConfig) -> io::Result<Self> {
        if cfg.read_timeout.is_some_and(|t| t.is_zero()) {
            // SO_RCVTIMEO of zero means "block forever", which `None` already says; a zero here is
            // more likely a mistake for a short timeout.
            return Err(ConfigError::ZeroReadTimeout.into());
        }
        let socket = Socket::new(
            Domain::for_address(cfg.addr),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?;
        let fd = socket.as_raw_fd();
        if cfg.addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        // With port 0 the kernel skips, when it picks a port, only ports whose holders would refuse
        // to share: a port held by any same-user socket with SO_REUSEPORT (another chimed, a
        // chronyd) counts as free, and the two would then split each other's traffic. So a socket
        // asking for any port gets one nobody holds first, and joins a reuse group after.
        let pick_port = cfg.addr.port() == 0;
        if cfg.reuse_port && !pick_port {
            socket.set_reuse_port(true)?;
        }
        if let Some(bytes) = cfg.recv_buffer {
            set_recv_buffer(&socket, bytes)?;
        }
        if let Some(timeout) = cfg.read_timeout {
            socket.set_read_timeout(Some(timeout))?;
        }
        if cfg.addr.is_ipv4() {
            // Don't-fragment without path MTU discovery (IP_PMTUDISC_PROBE): chime never sends a
            // datagram larger than the one it answers, so what fitted the way in fits the way out.
            // With DF set the kernel leaves the IP ID zero instead of drawing one from its shared
            // hashed counters (`__ip_select_ident`, 3.4% of chimed's CPU per Roughtime reply at
            // 170k/s on loopback). Best effort: without it, datagrams go out as before.
            let _ = setsockopt_int(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_PROBE,
            );
        }
        let timestamping = if cfg.rx_timestamps {
            TimestampMode::enable(fd)
        } else {
            TimestampMode::None
        };
        // A socket bound to one address receives only what was sent to it and replies from it, so
        // packet info would only cost a control message each way per datagram (about 6% of the
        // CPU per reply, measured at 150k replies/s): it is asked for on wildcard binds only.
        let fixed_dst = (!cfg.addr.ip().is_unspecified()).then(|| cfg.addr.ip());
        let pktinfo = match fixed_dst {
            Some(_) => true,
            None => enable_pktinfo(fd, cfg.addr),
        };
        socket.bind(&cfg.addr.into())?;
        if cfg.reuse_port && pick_port {
            // Linux forms the reuse group when the next socket binds this port, so setting the
            // option after bind is enough for the worker sockets to join this one.
            socket.set_reuse_port(true)?;
        }

        let caps = Capabilities {
            rx_timestamps: timestamping != TimestampMode::None,
            pktinfo,
            recv_buffer: effective_recv_buffer(fd)?,
        };
        if let Some(asked) = cfg.recv_buffer {
            // The kernel doubles the value it was given, so half is what the cap allowed.
            if caps.recv_buffer / 2 < asked {
                tracing::warn!(
                    asked,
                    granted = caps.recv_buffer / 2,
                    "receive buffer capped: run with CAP_NET_ADMIN or raise net.core.rmem_max"
                );
            }
        }
        let sock = Self {
            socket,
            caps,
            timestamping,
            fixed_dst,
            shut_down: AtomicBool::new(false),
        };
        tracing::debug!(?sock, "bound");
        Ok(sock)
    }

    /// The address the socket is bound to, with the real port if it was bound to port 0.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()?.as_socket().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "socket has a non-IP local address",
            )
        })
    }

    /// What the kernel granted when the socket was bound.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// How many datagrams the kernel has dropped at this socket since it was bound, before anyone
    /// could receive them (its receive buffer was full): the load a server did not see. A 32-bit
    /// count that wraps; one `getsockopt`, so read it now and then, not per batch.
    pub fn receive_drops(&self) -> io::Result<u32> {
        socket_drops(self.socket.as_raw_fd())
    }

    /// Changes the receive buffer while the socket is in use, to `bytes` as the kernel counts
    /// them (what [`Capabilities::recv_buffer`] reports, twice what `setsockopt` is given), and
    /// returns what the kernel granted. A smaller buffer drops no datagram already queued; new
    /// ones are dropped (and counted in [`Self::receive_drops`]) until the queue is below it.
    /// Growing past `net.core.rmem_max` needs `CAP_NET_ADMIN`; without it the buffer grows only
    /// that far.
    pub fn resize_recv_buffer(&self, bytes: usize) -> io::Result<usize> {
        set_recv_buffer(&self.socket, bytes / 2)?;
        effective_recv_buffer(self.socket.as_raw_fd())
    }

    /// Shuts the socket down for reading: a thread blocked in [`Self::recv_batch`] wakes, and
    /// every later call returns `Ok(0)` at once. How a worker without a read timeout is stopped.
    pub fn shutdown_read(&self) {
        self.shut_down.store(true, Ordering::Release);
        // On an unconnected UDP socket Linux answers ENOTCONN, yet still marks the socket shut
        // down and wakes its waiters (inet_shutdown does so on purpose), which is all we need.
        let _ = self.socket.shutdown(std::net::Shutdown::Read);
    }

    /// Receives up to `rx.capacity()` datagrams with one `recvmmsg`, filling `rx`.
    ///
    /// Waits for the first datagram (up to the read timeout, if there is one), then takes whatever
    /// else is already queued without waiting (`MSG_WAITFORONE`), so a lone datagram is returned
    /// at once, never held back to fill a batch. Returns the number of datagrams received, `Ok(0)`
    /// if the timeout passed with none or the socket was shut down ([`Self::shutdown_read`]). A
    /// signal interrupting the wait does not end it early.
    pub fn recv_batch(&self, rx: &mut RxBatch) -> io::Result<usize> {
        let fd = self.socket.as_raw_fd();
        let hdrs = rx.prepare_recv();
        let vlen = vlen(hdrs.len());
        let msgvec = hdrs.as_mut_ptr();
        let result = retry_eintr(|| {
            // SAFETY: `msgvec` points to `vlen` initialised mmsghdrs, exclusively borrowed from
            // `rx` for this call. `prepare_recv` pointed each one at storage owned by `rx` (a
            // sockaddr_storage with msg_namelen its size, one iovec over a `max_datagram` buffer,
            // a control buffer with msg_controllen its size), so the kernel writes only within
            // those. A null timeout is allowed and means "use the socket's SO_RCVTIMEO".
            unsafe { libc::recvmmsg(fd, msgvec, vlen, libc::MSG_WAITFORONE, ptr::null_mut()) }
        });
        match result {
            // A socket shut down for reading "receives" empty messages with no sender; they are
            // the wake-up, not datagrams.
            Ok(_) if self.shut_down.load(Ordering::Acquire) => {
                rx.complete_recv(0, None);
                Ok(0)
            }
            Ok(n) => {
                rx.complete_recv(n, self.fixed_dst);
                Ok(n)
            }
            // SO_RCVTIMEO expired with nothing received.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Receives into the free slots of `rx`, after the datagrams already there, whatever is queued
    /// now, without waiting (`MSG_DONTWAIT`): a batch [`Self::recv_batch`] started grows by what
    /// arrived since. Returns how many were added, `Ok(0)` if none were queued, the batch was
    /// full, or the socket was shut down.
    pub fn recv_more(&self, rx: &mut RxBatch) -> io::Result<usize> {
        if rx.len() >= rx.capacity() {
            return Ok(0);
        }
        let fd = self.socket.as_raw_fd();
        let hdrs = rx.prepare_recv_after();
        let vlen = vlen(hdrs.len());
        let msgvec = hdrs.as_mut_ptr();
        let result = retry_eintr(|| {
            // SAFETY: as in `recv_batch`: `msgvec` points to the `vlen` initialised mmsghdrs of
            // the free slots, exclusively borrowed from `rx` for this call, each pointed by
            // `prepare_recv_after` at storage of its own slot; the datagrams already received
            // live in other slots and are not written.
            unsafe { libc::recvmmsg(fd, msgvec, vlen, libc::MSG_DONTWAIT, ptr::null_mut()) }
        });
        match result {
            Ok(_) if self.shut_down.load(Ordering::Acquire) => Ok(0),
            Ok(n) => {
                rx.complete_recv(n, self.fixed_dst);
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Receives from the socket's error queue, without waiting, the datagrams sent with
    /// [`TxBatch::request_tx_timestamp`] whose transmit timestamps have come back: each one's
    /// bytes as they left (the datagram at the end, after the link, IP and UDP headers the kernel
    /// loops back with it) and, in [`crate::RecvMeta::timestamp`], when the kernel handed it to the
    /// network device. Replaces the contents of `rx`; returns how many, `Ok(0)` if none are
    /// queued. On most devices the timestamp is taken within the `sendmmsg` call, so calling this
    /// right after the send collects them; one taken later waits for the next call.
    pub fn recv_tx_timestamps(&self, rx: &mut RxBatch) -> io::Result<usize> {
        let fd = self.socket.as_raw_fd();
        let hdrs = rx.prepare_recv();
        let vlen = vlen(hdrs.len());
        let msgvec = hdrs.as_mut_ptr();
        let flags = libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT;
        let result = retry_eintr(|| {
            // SAFETY: as in `recv_batch`: `msgvec` points to `vlen` initialised mmsghdrs,
            // exclusively borrowed from `rx`, each pointed by `prepare_recv` at storage of its own
            // slot with its size, so the kernel writes only within those.
            unsafe { libc::recvmmsg(fd, msgvec, vlen, flags, ptr::null_mut()) }
        });
        match result {
            Ok(n) => {
                rx.complete_recv(n, None);
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                rx.complete_recv(0, None);
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends every datagram queued in `tx`, each to its own destination and from its own source
    /// address if it has one, then clears `tx`.
    ///
    /// Usually one `sendmmsg`; if the kernel takes only part of the batch, the rest is sent with
    /// further calls. A datagram the kernel refuses is counted in [`SendOutcome::errors`] and
    /// skipped, and the ones after it are still sent.
    ///
    /// The socket blocks if its send buffer is full rather than dropping replies: the buffer
    /// drains at link speed, and a worker that waits here stops taking new requests off its
    /// receive queue, which is where excess load should be shed.
    pub fn send_batch(&self, tx: &mut TxBatch) -> SendOutcome {
        let mut outcome = SendOutcome::default();
        let fd = self.socket.as_raw_fd();
        let hdrs = tx.prepare_send();
        let mut next = 0;
        while next < hdrs.len() {
            let rest = &mut hdrs[next..];
            let vlen = vlen(rest.len());
            let msgvec = rest.as_mut_ptr();
            let result = retry_eintr(|| {
                // SAFETY: `msgvec` points to `vlen` initialised mmsghdrs, exclusively borrowed
                // from `tx` for this call. `prepare_send` pointed each one at storage owned by `tx`
                // (an encoded destination with its length, one iovec over the payload's queued
                // bytes, a control buffer with msg_controllen the bytes encoded or null and 0), so
                // the kernel reads only within those, and writes only each msg_len.
                unsafe { libc::sendmmsg(fd, msgvec, vlen, 0) }
            });
            match result {
                Ok(n) if n > 0 => {
                    outcome.sent += n;
                    next += n;
                }
                // Zero accepted of a non-empty batch does not happen, but skipping one datagram
                // keeps the loop finite whatever the kernel does.
                Ok(_) => {
                    outcome.errors += 1;
                    outcome.last_error = Some(io::ErrorKind::WriteZero.into());
                    next += 1;
                }
                // sendmmsg reports an error only when it sent nothing, so the error is the first
                // remaining datagram's: drop it and go on with the rest.
                Err(e) => {
                    outcome.errors += 1;
                    outcome.last_error = Some(e);
                    next += 1;
                }
            }
        }
        tx.clear();
        outcome
    }
}

impl fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpSocket")
            .field("fd", &self.socket.as_raw_fd())
            .field("local_addr", &self.local_addr().ok())
            .field("timestamping", &self.timestamping)
            .field("caps", &self.caps)
            .finish()
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// Which kind of kernel receive timestamp a socket gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimestampMode {
    /// `SO_TIMESTAMPING` with software receive timestamps: the kernel's newer interface, the one
    /// that later grows hardware and transmit timestamps.
    Timestamping,
    /// `SO_TIMESTAMPNS`: nanosecond software receive timestamps on older kernels.
    TimestampNs,
    /// Neither: handlers fall back to reading the clock themselves.
    None,
}

impl TimestampMode {
    /// Turns on the best receive timestamps the kernel offers.
    fn enable(fd: RawFd) -> Self {
        let flags = libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
        // The flags are small bit values, so the cast to the option's int type is lossless.
        let timestamping = setsockopt_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            flags as libc::c_int,
        );
        match timestamping {
            Ok(()) => return Self::Timestamping,
            Err(e) => tracing::debug!(error = %e, "SO_TIMESTAMPING unavailable"),
        }
        match setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1) {
            Ok(()) => Self::TimestampNs,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "no kernel receive timestamps: receive times will be read after the fact"
                );
                Self::None
            }
        }
    }
}

/// Asks for packet info on every received datagram; `false` if the kernel refused.
fn enable_pktinfo(fd: RawFd, addr: SocketAddr) -> bool {
    let (level, name) = match addr {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_PKTINFO),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
    };
    match setsockopt_int(fd, level, name, 1) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "no packet info: replies leave from the address routing picks"
            );
            false
        }
    }
}

/// Sets the receive buffer, forcing past `net.core.rmem_max` when the process may.
fn set_recv_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
    let fd = socket.as_raw_fd();
    // The kernel takes an int and doubles it; larger requests saturate rather than wrap.
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    match setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, value) {
        Ok(()) => Ok(()),
        // EPERM without CAP_NET_ADMIN: the unprivileged option still gets up to rmem_max.
        // Trace, not debug: a shedding worker resizes its buffer while it runs.
        Err(e) => {
            tracing::trace!(error = %e, "SO_RCVBUFFORCE refused, using SO_RCVBUF");
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, value)
        }
    }
}

/// The receive buffer the kernel reports (`SO_RCVBUF`).
fn effective_recv_buffer(fd: RawFd) -> io::Result<usize> {
    let value = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
    // Never negative; a kernel that said otherwise would be reporting no buffer.
    Ok(usize::try_from(value).unwrap_or(0))
}

/// A batch length as the `unsigned int` the mmsg calls take; the kernel caps it at `UIO_MAXIOV`
/// anyway, and the send loop goes on with whatever a call did not take.
fn vlen(len: usize) -> libc::c_uint {
    libc::c_uint::try_from(len).unwrap_or(libc::c_uint::MAX)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket as StdSocket};

    use super::*;

    fn loopback_v4() -> SocketConfig {
        SocketConfig::new((Ipv4Addr::LOCALHOST, 0).into())
    }

    #[test]
    fn binds_port_zero_and_reports_real_port() {
        let sock = UdpSocket::bind(&loopback_v4()).unwrap();
        let addr = sock.local_addr().unwrap();
        assert_eq!(addr.ip(), Ipv4Addr::LOCALHOST);
        assert_ne!(addr.port(), 0);
    }

    #[test]
    fn ipv6_sockets_are_v6_only() {
        let sock = UdpSocket::bind(&SocketConfig::new((Ipv6Addr::UNSPECIFIED, 0).into())).unwrap();
        let v6only = getsockopt_int(sock.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY);
        assert_eq!(v6only.unwrap(), 1);
    }

    #[test]
    fn reuse_port_lets_two_sockets_share_a_port() {
        let first = UdpSocket::bind(&loopback_v4()).unwrap();
        let second = UdpSocket::bind(&SocketConfig::new(first.local_addr().unwrap())).unwrap();
        assert_eq!(first.local_addr().unwrap(), second.local_addr().unwrap());

        let mut cfg = SocketConfig::new(first.local_addr().unwrap());
        cfg.reuse_port = false;
        assert_eq!(
            UdpSocket::bind(&cfg).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
    }

    /// A port-0 bind never lands on a port that a same-user `SO_REUSEPORT` socket already holds
    /// (the kernel counts such ports as free). With 500 ports held and 500 binds, about 9 would
    /// collide if the option were set before bind; the chance of none is under 1 in 10,000.
    #[test]
    fn port_zero_never_joins_a_port_someone_holds() {
        let held: Vec<UdpSocket> = (0..500)
            .map(|_| UdpSocket::bind(&loopback_v4()).unwrap())
            .collect();
        let ports: std::collections::HashSet<u16> = held
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        assert_eq!(ports.len(), held.len(), "the held sockets share ports");
        for _ in 0..500 {
            let sock = UdpSocket::bind(&loopback_v4()).unwrap();
            let port = sock.local_addr().unwrap().port();
            assert!(!ports.contains(&port), "port {port} is already held");
        }
    }

    #[test]
    fn recv_buffer_request_takes_effect() {
        let mut cfg = loopback_v4();
        cfg.recv_buffer = Some(64 * 1024);
        let sock = UdpSocket::bind(&cfg).unwrap();
        // The kernel doubles the value it was given.
        assert_eq!(sock.capabilities().recv_buffer, 128 * 1024);
        // And it can be changed in use, in the kernel's own count.
        assert_eq!(sock.resize_recv_buffer(32 * 1024).unwrap(), 32 * 1024);
        assert_eq!(sock.resize_recv_buffer(256 * 1024).unwrap(), 256 * 1024);
    }

    #[test]
    fn zero_read_timeout_is_refused() {
        let mut cfg = loopback_v4();
        cfg.read_timeout = Some(Duration::ZERO);
        let err = UdpSocket::bind(&cfg).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let inner = err.get_ref().and_then(|e| e.downcast_ref::<ConfigError>());
        assert!(matches!(inner, Some(ConfigError::ZeroReadTimeout)), "{err}");
    }

    #[test]
    fn recv_more_appends_what_arrived_since_without_waiting() {
        let mut cfg = loopback_v4();
        cfg.read_timeout = Some(Duration::from_secs(5));
        let sock = UdpSocket::bind(&cfg).unwrap();
        let to = sock.local_addr().unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut rx = RxBatch::new(4, 64);
        // Nothing queued: nothing added, and no wait.
        let start = std::time::Instant::now();
        assert_eq!(sock.recv_more(&mut rx).unwrap(), 0);
        assert!(start.elapsed() < Duration::from_secs(1));
        for p in [b"a", b"b"] {
            client.send_to(p, to).unwrap();
        }
        // Loopback delivers synchronously: both are queued by now.
        assert_eq!(sock.recv_batch(&mut rx).unwrap(), 2);
        for p in [b"c", b"d", b"e"] {
            client.send_to(p, to).unwrap();
        }
        // Room for two more of the three; the third waits for the next receive.
        assert_eq!(sock.recv_more(&mut rx).unwrap(), 2);
        let got: Vec<&[u8]> = rx.iter().map(|(_, p)| p).collect();
        assert_eq!(got, [b"a", b"b", b"c", b"d"]);
        assert!(
            rx.iter()
                .all(|(m, _)| m.src == client.local_addr().unwrap())
        );
        assert_eq!(sock.recv_more(&mut rx).unwrap(), 0, "full");
        assert_eq!(sock.recv_batch(&mut rx).unwrap(), 1);
        assert_eq!(rx.get(0).1, b"e");
    }

    #[test]
    fn recv_times_out_with_zero() {
        let mut cfg = loopback_v4();
        cfg.read_timeout = Some(Duration::from_millis(20));
        let sock = UdpSocket::bind(&cfg).unwrap();
        let mut rx = RxBatch::new(4, 64);
        assert_eq!(sock.recv_batch(&mut rx).unwrap(), 0);
        assert!(rx.is_empty());
    }

    #[test]
    fn send_error_is_counted_and_the_rest_still_go() {
        let sock = UdpSocket::bind(&loopback_v4()).unwrap();
        let peer = StdSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut tx = TxBatch::new(4, 16);
        let ok = peer.local_addr().unwrap();
        // An IPv6 destination on an IPv4 socket is refused by the kernel.
        let bad: SocketAddr = (Ipv6Addr::LOCALHOST, 9).into();
        for (dst, byte) in [(ok, 1u8), (bad, 2), (ok, 3)] {
            assert!(tx.push_with(dst, None, |b| {
                b[0] = byte;
                Some(1)
            }));
        }
        let outcome = sock.send_batch(&mut tx);
        assert_eq!((outcome.sent, outcome.errors), (2, 1), "{outcome:?}");
        assert!(outcome.last_error.is_some());
        assert!(tx.is_empty());
        let mut buf = [0u8; 4];
        assert_eq!(peer.recv(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], 1);
        assert_eq!(peer.recv(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], 3);
    }

    /// On the wire, an IPv4 reply has DF set and IP ID 0: the kernel skipped drawing an ID. Seen
    /// by a raw socket, so it needs CAP_NET_RAW (CI runs as root); without it only the socket
    /// option is checked.
    #[test]
    fn ipv4_datagrams_go_out_dont_fragment_with_no_ip_id() {
        let sock = UdpSocket::bind(&loopback_v4()).unwrap();
        let mode = getsockopt_int(sock.as_raw_fd(), libc::IPPROTO_IP, libc::IP_MTU_DISCOVER);
        assert_eq!(mode.unwrap(), libc::IP_PMTUDISC_PROBE);
        let raw = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)) {
            Ok(raw) => raw,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return,
            Err(e) => panic!("raw socket: {e}"),
        };
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let peer = StdSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let dst = peer.local_addr().unwrap();
        let src_port = sock.local_addr().unwrap().port();
        let mut tx = TxBatch::new(1, 16);
        assert!(tx.push_with(dst, None, |b| {
            b[..5].copy_from_slice(b"chime");
            Some(5)
        }));
        assert_eq!(sock.send_batch(&mut tx).sent, 1);
        // The raw socket sees every UDP datagram on the host; find ours by its ports.
        let mut buf = [0u8; 2048];
        loop {
            let n = std::io::Read::read(&mut &raw, &mut buf).unwrap();
            let ihl = usize::from(buf[0] & 0x0f) * 4;
            let ports = buf.get(ihl..ihl + 4).unwrap_or(&[]);
            if n < ihl + 8 || ports != [src_port.to_be_bytes(), dst.port().to_be_bytes()].concat() {
                continue;
            }
            let flags_fragment = u16::from_be_bytes([buf[6], buf[7]]);
            assert_eq!(flags_fragment, 0x4000, "DF set, no fragment offset");
            assert_eq!(&buf[4..6], &[0, 0], "IP ID");
            break;
        }
    }

    #[test]
    fn tx_timestamps_come_back_for_the_datagrams_that_asked() {
        let server = UdpSocket::bind(&loopback_v4()).unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = client.local_addr().unwrap();
        let mut tx = TxBatch::new(4, 64);
        for (i, stamp) in [(0u8, true), (1, false), (2, true)] {
            tx.push_with(dst, None, |buf| {
                buf[..8].fill(0xA0 + i);
                Some(8)
            });
            if stamp {
                tx.request_tx_timestamp();
            }
        }
        let before = std::time::SystemTime::now();
        assert_eq!(server.send_batch(&mut tx).sent, 3);
        let after = std::time::SystemTime::now();
        let mut looped = RxBatch::new(4, 256);
        let n = server.recv_tx_timestamps(&mut looped).unwrap();
        assert_eq!(n, 2, "one looped copy per datagram that asked");
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i128
        };
        for ((meta, bytes), tag) in looped.iter().zip([0xA0u8, 0xA2]) {
            assert!(
                bytes.len() >= 8 + 8 + 20,
                "headers come back too: {bytes:?}"
            );
            assert_eq!(
                &bytes[bytes.len() - 8..],
                &[tag; 8],
                "the datagram is at the end"
            );
            let ts = meta.timestamp.expect("a software transmit timestamp");
            let ns = i128::from(ts.secs) * 1_000_000_000 + i128::from(ts.nanos);
            assert!((unix(before)..=unix(after)).contains(&ns), "{ts:?}");
        }
        assert_eq!(
            server.recv_tx_timestamps(&mut looped).unwrap(),
            0,
            "drained"
        );
    }

    #[test]
    fn empty_send_is_a_no_op() {
        let sock = UdpSocket::bind(&loopback_v4()).unwrap();
        let outcome = sock.send_batch(&mut TxBatch::new(1, 1));
        assert_eq!((outcome.sent, outcome.errors), (0, 0));
    }
}
