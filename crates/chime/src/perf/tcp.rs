//! A sending thread's TCP connections, for protocols that run over a stream (Roughtime, RFC 10049
//! §4): either a fixed set of connections reused for every request, round robin, with requests
//! pipelined on each, or a new connection for every request, closed once its reply is in (the
//! "cold" case, where the handshake is part of every exchange).
//!
//! Everything is non-blocking and driven from the engine's one event loop, as its transport:
//! requests are queued on a connection and written as far as the kernel takes them, replies are
//! read as they come and cut into packets by chime-roughtime's [`FrameReader`], and the
//! protocol finds each one's id as it would in a datagram. A reused connection the server closes
//! is opened again (its unanswered requests are lost, as the engine's timeout counts them).

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd as _;
use std::time::{Duration, Instant};

use chime_roughtime::FrameReader;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

use super::protocol::LoadProtocol;
use super::transport::{Event, Reply, Request, Sent, Transport, realtime_ns};

/// The longest reply taken; longer announces are a broken stream.
const MAX_REPLY: usize = 1 << 16;
const READ_CHUNK: usize = 16 * 1024;

struct Conn {
    stream: TcpStream,
    frames: FrameReader,
    /// Bytes queued and not yet written.
    out: Vec<u8>,
    connected: bool,
    opened: Instant,
    /// Replies still owed on this connection.
    owed: usize,
}

/// One thread's requests over TCP: its connections and the protocol.
pub(crate) struct Streams<P> {
    links: TcpLinks,
    protocol: P,
    /// Per-request connections older than this are closed.
    timeout: Duration,
    /// One request at a time, before it is queued on its connection.
    scratch: Vec<u8>,
}

impl<P: LoadProtocol> Streams<P> {
    /// `reuse` connections to `target`, or (0) a new connection per request, closed after
    /// `timeout` at the latest.
    pub(crate) fn new(target: SocketAddr, reuse: usize, protocol: P, timeout: Duration) -> Self {
        Self {
            links: TcpLinks::new(target, reuse),
            scratch: vec![0; protocol.max_request_len()],
            protocol,
            timeout,
        }
    }
}

impl<P: LoadProtocol> Transport for Streams<P> {
    /// Queues the requests on the connections, then writes what the kernel takes.
    fn send(&mut self, requests: &[Request]) -> Sent {
        let mut sent = Sent::default();
        for r in requests {
            let len = self.protocol.fill_request(r.id, &mut self.scratch);
            match self.links.queue(&self.scratch[..len]) {
                Ok(()) => sent.sent += 1,
                Err(e) => {
                    sent.errors += 1;
                    sent.error.get_or_insert(format!("connect: {e}"));
                }
            }
        }
        let before = realtime_ns();
        let mut trouble = Trouble::default();
        self.links.flush(&mut trouble);
        let after = if requests.len() > 1 {
            realtime_ns()
        } else {
            before
        };
        sent.errors += trouble.errors;
        if sent.error.is_none() {
            sent.error = trouble.first;
        }
        sent.t1_ns = (before, after);
        sent
    }

    /// Waits up to `wait` on the connections and takes in the replies; what went wrong is one
    /// error, reported once.
    fn poll(&mut self, wait: Duration, on: &mut impl FnMut(Event)) {
        let protocol = &mut self.protocol;
        let mut trouble = Trouble::default();
        self.links
            .poll(wait, self.timeout, &mut trouble, |reply, t4| {
                let matched = protocol.match_reply(reply, t4.div_euclid(1_000_000_000));
                on(Event::Reply(Reply::arrived(matched, t4)));
            });
        if let Some(e) = trouble.first {
            on(Event::Error(e));
        }
    }
}

/// What [`TcpLinks::poll`] saw go wrong, to count and report once.
#[derive(Debug, Default)]
struct Trouble {
    errors: u64,
    first: Option<String>,
}

impl Trouble {
    fn note(&mut self, what: String) {
        self.errors += 1;
        self.first.get_or_insert(what);
    }
}

/// One thread's connections to the target.
struct TcpLinks {
    target: SocketAddr,
    /// Connections to keep open and reuse; 0: a new connection per request.
    reuse: usize,
    conns: Vec<Conn>,
    next: usize,
    buf: Vec<u8>,
    /// Connections opened (the first `reuse` included).
    opened: u64,
}

impl TcpLinks {
    /// `reuse` connections to `target`, or (0) a new connection per request.
    fn new(target: SocketAddr, reuse: usize) -> Self {
        Self {
            target,
            reuse,
            conns: Vec::new(),
            next: 0,
            buf: vec![0; READ_CHUNK],
            opened: 0,
        }
    }

    fn open(&mut self) -> std::io::Result<Conn> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(self.target),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_nonblocking(true)?;
        socket.set_tcp_nodelay(true)?;
        match socket.connect(&self.target.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(Errno::EINPROGRESS as i32) => {}
            Err(e) => return Err(e),
        }
        self.opened += 1;
        Ok(Conn {
            stream: socket.into(),
            frames: FrameReader::new(MAX_REPLY),
            out: Vec::new(),
            connected: false,
            opened: Instant::now(),
            owed: 0,
        })
    }

    /// Queues `request` on the next connection (opening one if need be). It leaves at the next
    /// [`flush`](Self::flush).
    fn queue(&mut self, request: &[u8]) -> std::io::Result<()> {
        let i = if self.reuse == 0 {
            let conn = self.open()?;
            self.conns.push(conn);
            self.conns.len() - 1
        } else {
            while self.conns.len() < self.reuse {
                let conn = self.open()?;
                self.conns.push(conn);
            }
            self.next = (self.next + 1) % self.conns.len();
            self.next
        };
        let conn = &mut self.conns[i];
        conn.out.extend_from_slice(request);
        conn.owed += 1;
        Ok(())
    }

    /// Writes what every connected connection has queued, as far as the kernel takes it.
    fn flush(&mut self, trouble: &mut Trouble) {
        let mut dead = Vec::new();
        for (i, conn) in self.conns.iter_mut().enumerate() {
            if conn.connected
                && let Err(e) = write_out(conn)
            {
                trouble.note(format!("write: {e}"));
                dead.push(i);
            }
        }
        self.bury(dead);
    }

    /// Waits up to `wait` for any connection to be ready, then connects, writes and reads what
    /// it can; `on_reply` gets each whole reply with the time it was read (ns since the epoch).
    /// Per-request connections older than `timeout` are closed.
    fn poll(
        &mut self,
        wait: Duration,
        timeout: Duration,
        trouble: &mut Trouble,
        mut on_reply: impl FnMut(&[u8], i64),
    ) {
        if self.reuse == 0 {
            let old: Vec<usize> = (0..self.conns.len())
                .filter(|&i| self.conns[i].opened.elapsed() > timeout)
                .collect();
            self.bury(old);
        }
        if self.conns.is_empty() {
            std::thread::sleep(wait);
            return;
        }
        let revents: Vec<PollFlags> = {
            let mut fds: Vec<PollFd<'_>> = self
                .conns
                .iter()
                .map(|c| {
                    let mut flags = PollFlags::POLLIN;
                    if !c.connected || !c.out.is_empty() {
                        flags |= PollFlags::POLLOUT;
                    }
                    PollFd::new(c.stream.as_fd(), flags)
                })
                .collect();
            match ppoll(&mut fds, Some(TimeSpec::from_duration(wait)), None) {
                Ok(0) | Err(Errno::EINTR) => return,
                Ok(_) => {}
                Err(e) => {
                    trouble.note(format!("poll: {e}"));
                    std::thread::sleep(wait.min(Duration::from_millis(1)));
                    return;
                }
            }
            fds.iter()
                .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                .collect()
        };
        let mut dead = Vec::new();
        for (i, ready) in revents.into_iter().enumerate() {
            if ready.is_empty() {
                continue;
            }
            let conn = &mut self.conns[i];
            if !conn.connected {
                if !ready.intersects(PollFlags::POLLOUT | PollFlags::POLLERR | PollFlags::POLLHUP) {
                    continue;
                }
                match conn.stream.take_error() {
                    Ok(None) => conn.connected = true,
                    Ok(Some(e)) | Err(e) => {
                        trouble.note(format!("connect: {e}"));
                        dead.push(i);
                        continue;
                    }
                }
            }
            if let Err(e) = write_out(conn) {
                trouble.note(format!("write: {e}"));
                dead.push(i);
                continue;
            }
            if ready.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                match read_in(conn, &mut self.buf, &mut on_reply) {
                    Ok(true) => {}
                    // Closed by the server: expected once a per-request connection is done.
                    Ok(false) => dead.push(i),
                    Err(e) => {
                        trouble.note(format!("read: {e}"));
                        dead.push(i);
                        continue;
                    }
                }
            }
            if self.reuse == 0 && conn.owed == 0 && !dead.contains(&i) {
                dead.push(i);
            }
        }
        self.bury(dead);
    }

    /// Closes the connections at `indices`; a reused one is opened again at the next request.
    fn bury(&mut self, mut indices: Vec<usize>) {
        indices.sort_unstable();
        indices.dedup();
        for i in indices.into_iter().rev() {
            self.conns.swap_remove(i);
        }
        if self.next >= self.conns.len() {
            self.next = 0;
        }
    }
}

fn write_out(conn: &mut Conn) -> std::io::Result<()> {
    while !conn.out.is_empty() {
        match conn.stream.write(&conn.out) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                conn.out.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads what has arrived; `Ok(false)` once the server has closed its side.
fn read_in(
    conn: &mut Conn,
    buf: &mut [u8],
    on_reply: &mut impl FnMut(&[u8], i64),
) -> std::io::Result<bool> {
    loop {
        match conn.stream.read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                let t4 = realtime_ns();
                conn.frames.push(&buf[..n]);
                loop {
                    match conn.frames.next_packet() {
                        Ok(Some(reply)) => {
                            conn.owed = conn.owed.saturating_sub(1);
                            on_reply(reply, t4);
                        }
                        Ok(None) => break,
                        Err(e) => return Err(std::io::Error::new(ErrorKind::InvalidData, e)),
                    }
                }
                if n < buf.len() {
                    return Ok(true);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(e),
        }
    }
}
