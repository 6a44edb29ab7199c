//! Requests as datagrams: a thread's share of the source sockets, `sendmmsg` a batch at a time
//! from each socket in turn (so that the server sees many source ports), and `recvmmsg` from
//! every socket `ppoll` finds ready, each reply stamped by the kernel on arrival where it can be.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{Context, Result};
use chime_udp::{RxBatch, SocketConfig, TxBatch, UdpSocket};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

use super::protocol::LoadProtocol;
use super::transport::{Event, Reply, Request, Sent, Transport, realtime_ns};

/// Receive buffer asked for on each source socket, so that replies arriving in a burst are not
/// dropped on our side and counted as the server's loss (drops are reported either way).
const RECV_BUFFER: usize = 4 << 20;

/// Replies received per `recvmmsg`.
const RX_BATCH: usize = 64;

/// One thread's datagrams: its sockets (borrowed from the thread, as the poll set is), batches
/// and protocol.
pub(crate) struct Datagrams<'s, P> {
    target: SocketAddr,
    sockets: &'s [UdpSocket],
    fds: Vec<PollFd<'s>>,
    protocol: P,
    tx: TxBatch,
    rx: RxBatch,
    /// Where the next batch goes.
    next_socket: usize,
}

impl<'s, P: LoadProtocol> Datagrams<'s, P> {
    pub(crate) fn new(
        target: SocketAddr,
        sockets: &'s [UdpSocket],
        protocol: P,
        batch_size: usize,
    ) -> Self {
        Self {
            target,
            fds: sockets
                .iter()
                .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN))
                .collect(),
            sockets,
            tx: TxBatch::new(batch_size, protocol.max_request_len()),
            rx: RxBatch::new(RX_BATCH, protocol.max_reply_len()),
            protocol,
            next_socket: 0,
        }
    }

    /// Receives everything queued on socket `i`.
    fn drain(&mut self, i: usize, on: &mut impl FnMut(Event)) {
        let socket = &self.sockets[i];
        loop {
            match socket.recv_batch(&mut self.rx) {
                Ok(0) => return,
                Ok(n) => {
                    // Without kernel timestamps, T4 is read once per batch, right after it.
                    let mut now_ns = None;
                    for (meta, payload) in self.rx.iter() {
                        let t4 = match meta.timestamp {
                            Some(ts) => ts.secs * 1_000_000_000 + i64::from(ts.nanos),
                            None => *now_ns.get_or_insert_with(realtime_ns),
                        };
                        let matched = self
                            .protocol
                            .match_reply(payload, t4.div_euclid(1_000_000_000));
                        on(Event::Reply(Reply::arrived(matched, t4)));
                    }
                    if n < self.rx.capacity() {
                        return;
                    }
                }
                Err(e) => {
                    on(Event::Error(format!("receive: {e}")));
                    return;
                }
            }
        }
    }
}

impl<P: LoadProtocol> Transport for Datagrams<'_, P> {
    /// One `sendmmsg` from the next socket.
    fn send(&mut self, requests: &[Request]) -> Sent {
        let protocol = &mut self.protocol;
        for r in requests {
            self.tx.push_with(self.target, None, |buf| {
                Some(protocol.fill_request(r.id, buf))
            });
        }
        let socket = &self.sockets[self.next_socket];
        self.next_socket = (self.next_socket + 1) % self.sockets.len();
        // T1: read as late as we can before the requests leave, and again when the call returns
        // to place the others within it.
        let before = realtime_ns();
        let outcome = socket.send_batch(&mut self.tx);
        let after = if requests.len() > 1 {
            realtime_ns()
        } else {
            before
        };
        Sent {
            sent: outcome.sent as u64,
            errors: outcome.errors as u64,
            error: outcome.last_error.map(|e| format!("send: {e}")),
            t1_ns: (before, after),
        }
    }

    /// Waits up to `wait` for replies on any socket, then drains every socket that has some.
    fn poll(&mut self, wait: Duration, on: &mut impl FnMut(Event)) {
        match ppoll(&mut self.fds, Some(TimeSpec::from_duration(wait)), None) {
            Ok(0) | Err(Errno::EINTR) => return,
            Ok(_) => {}
            Err(e) => {
                on(Event::Error(format!("poll: {e}")));
                // Do not spin on a persistent error.
                std::thread::sleep(wait.min(Duration::from_millis(1)));
                return;
            }
        }
        let ready = PollFlags::POLLIN | PollFlags::POLLERR;
        for i in 0..self.fds.len() {
            if self.fds[i].revents().is_some_and(|r| r.intersects(ready)) {
                self.drain(i, on);
            }
        }
    }
}

/// Binds the source sockets: any local address, kernel-chosen ports, non-blocking.
pub(crate) fn bind_sockets(target: SocketAddr, n: usize) -> Result<Vec<UdpSocket>> {
    let any: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    (0..n)
        .map(|_| {
            let mut cfg = SocketConfig::new(any);
            cfg.reuse_port = false;
            cfg.recv_buffer = Some(RECV_BUFFER);
            let socket = UdpSocket::bind(&cfg).context("cannot open a UDP socket")?;
            // The worker polls for readiness and must never block in a receive or a send: a
            // blocked send would stall the schedule, which is what an open loop must not do.
            let flags = OFlag::from_bits_truncate(fcntl(&socket, FcntlArg::F_GETFL)?);
            fcntl(&socket, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
            Ok(socket)
        })
        .collect()
}
