//! A sending thread: it paces requests out on an absolute schedule, receives the replies on the
//! same sockets, and matches each reply to its request, all in one event loop.
//!
//! Sending and receiving share one thread so that the in-flight table, the counters and the
//! histograms are the thread's own: no locks, no atomics on the per-packet path (the progress
//! counters are bumped once per batch). The loop is open: request k of a step is due at
//! `start + k / rate` whatever has come back, and when the loop runs late it sends everything that
//! is due at once (up to a batch per `sendmmsg`), so a slow server cannot slow the load down. Between
//! due times the thread sleeps in `ppoll` on its sockets, waking for replies or for the next
//! request.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chime_udp::{RxBatch, TxBatch, UdpSocket};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

use super::inflight::{InFlight, Lookup, State, WARMUP};
use super::protocol::{LoadProtocol, ReplyMatch, Verdict};
use super::stats::{StepStats, record_ns};
use super::tcp::{TcpLinks, Trouble};

/// Replies received per `recvmmsg`.
const RX_BATCH: usize = 64;

/// How long past a step's end requests that are still due may go out, when the loop ran late at
/// the very end; anything left after that is counted unsent.
const LATE_SEND_GRACE: Duration = Duration::from_millis(20);

/// What the controller asks a worker to do next.
#[derive(Debug)]
pub(crate) enum Command {
    Run(Phase),
    Stop,
}

/// One stretch of load at one rate: a counted step, or the warm-up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Phase {
    /// The step's index, or [`WARMUP`].
    pub(crate) step: u16,
    /// Requests per second over all threads.
    pub(crate) rate: f64,
    pub(crate) start: Instant,
    pub(crate) duration: Duration,
    /// A client's poll interval at this rate: an answer with a longer round trip is stale.
    pub(crate) stale_after: Duration,
}

/// A worker's numbers for one finished step.
#[derive(Debug)]
pub(crate) struct StepDone {
    pub(crate) step: u16,
    pub(crate) stats: StepStats,
}

/// What a worker hands back when it stops: the late and duplicate replies per step, which keep
/// arriving after a step's other numbers are final.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) late: Vec<u64>,
    pub(crate) duplicate: Vec<u64>,
}

/// Counters the controller reads for the live progress line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Progress {
    pub(crate) sent: AtomicU64,
    pub(crate) answered: AtomicU64,
}

/// Everything a worker needs, built by the controller.
#[derive(Debug)]
pub(crate) struct Worker<P> {
    pub(crate) index: usize,
    pub(crate) threads: usize,
    pub(crate) target: SocketAddr,
    pub(crate) sockets: Vec<UdpSocket>,
    pub(crate) protocol: P,
    pub(crate) inflight: InFlight,
    pub(crate) batch_size: usize,
    pub(crate) timeout: Duration,
    pub(crate) steps: usize,
    pub(crate) progress: Arc<Progress>,
    /// Over TCP instead of the sockets (which are then none): connections to reuse, or 0 for a
    /// new connection per request.
    pub(crate) tcp: Option<usize>,
}

impl<P: LoadProtocol> Worker<P> {
    /// Runs phases as the controller sends them until it says stop (or goes away).
    pub(crate) fn run(self, commands: Receiver<Command>, results: Sender<StepDone>) -> Finished {
        // Sleeps until the next request are short; the default 50 µs of timer slack would bunch
        // requests up at high rates. Failure only makes pacing coarser.
        let _ = nix::sys::prctl::set_timerslack(1_000);
        let Worker {
            index,
            threads,
            target,
            sockets,
            protocol,
            inflight,
            batch_size,
            timeout,
            steps,
            progress,
            tcp,
        } = self;
        let mut fds: Vec<PollFd<'_>> = sockets
            .iter()
            .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN))
            .collect();
        let mut engine = Engine {
            index,
            threads,
            target,
            batch_size,
            progress,
            tx: TxBatch::new(batch_size, protocol.max_request_len()),
            rx: RxBatch::new(RX_BATCH, protocol.max_reply_len()),
            next_socket: 0,
            tcp: tcp.map(|reuse| TcpLinks::new(target, reuse)),
            scratch: vec![0; protocol.max_request_len()],
            book: Book {
                protocol,
                inflight,
                timeout_ns: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
                stale_ns: i64::MAX,
                current: None,
                late: vec![0; steps],
                duplicate: vec![0; steps],
            },
            timeout,
        };
        while let Ok(Command::Run(phase)) = commands.recv() {
            if let Some(stats) = engine.run_phase(&sockets, &mut fds, &phase) {
                let done = StepDone {
                    step: phase.step,
                    stats,
                };
                if results.send(done).is_err() {
                    break;
                }
            }
        }
        Finished {
            late: engine.book.late,
            duplicate: engine.book.duplicate,
        }
    }
}

/// The event loop's state, apart from the sockets and their poll set (which borrow each other).
struct Engine<P> {
    index: usize,
    threads: usize,
    target: SocketAddr,
    batch_size: usize,
    timeout: Duration,
    progress: Arc<Progress>,
    tx: TxBatch,
    rx: RxBatch,
    /// Where the next batch goes: batches rotate over the sockets, so the server sees many
    /// source ports.
    next_socket: usize,
    /// TCP connections, when the load goes over TCP.
    tcp: Option<TcpLinks>,
    /// One request at a time, for TCP.
    scratch: Vec<u8>,
    book: Book<P>,
}

/// Matching replies to requests, and counting: everything a reply touches.
struct Book<P> {
    protocol: P,
    inflight: InFlight,
    timeout_ns: i64,
    /// The phase's client interval: answers with a longer round trip are stale.
    stale_ns: i64,
    /// The step being measured and its numbers so far; `None` during the warm-up.
    current: Option<(u16, StepStats)>,
    late: Vec<u64>,
    duplicate: Vec<u64>,
}

impl<P: LoadProtocol> Engine<P> {
    /// Sends this thread's share of a phase on schedule, then (for a counted step) waits for the
    /// outstanding replies up to the timeout. Returns the step's numbers; `None` for the warm-up.
    fn run_phase(
        &mut self,
        sockets: &[UdpSocket],
        fds: &mut [PollFd<'_>],
        phase: &Phase,
    ) -> Option<StepStats> {
        let counted = phase.step != WARMUP;
        self.book.current = counted.then(|| (phase.step, StepStats::new()));
        self.book.stale_ns = i64::try_from(phase.stale_after.as_nanos()).unwrap_or(i64::MAX);
        let schedule = Schedule::new(phase, self.index, self.threads);
        if let Some((_, stats)) = &mut self.book.current {
            stats.scheduled = schedule.total;
        }
        let hard_stop = phase.start + phase.duration + LATE_SEND_GRACE;
        let mut next = 0; // this thread's next request in the phase
        let mut last_send = phase.start;
        while next < schedule.total {
            let now = Instant::now();
            if now >= hard_stop {
                break;
            }
            let due = schedule.due_by(now);
            if due > next {
                let n = (due - next).min(self.batch_size as u64);
                let lag = now.saturating_duration_since(schedule.due_at(next));
                self.send(sockets, n, phase.step, lag);
                next += n;
                last_send = Instant::now();
            }
            // Take in what has arrived; sleep only if nothing more is due yet.
            let wait = if next < schedule.total {
                schedule
                    .due_at(next)
                    .saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            self.receive(sockets, fds, wait);
        }
        // The warm-up runs straight into the first step, without waiting for its replies.
        let (_, stats) = self.book.current.as_mut()?;
        stats.unsent = schedule.total - next;

        // Every request gets its full timeout, the last one included.
        let deadline = last_send + self.timeout;
        loop {
            let waiting = self
                .book
                .current
                .as_ref()
                .is_some_and(|(_, s)| s.lost() > 0);
            let now = Instant::now();
            if !waiting || now >= deadline {
                break;
            }
            self.receive(sockets, fds, deadline - now);
        }
        self.book.current.take().map(|(_, stats)| stats)
    }

    /// Sends the next `n` requests over TCP: queued on the connections, then written.
    fn send_tcp(&mut self, n: u64, step: u16, lag: Duration) {
        let Some(links) = &mut self.tcp else { return };
        let book = &mut self.book;
        let mut queued = 0;
        let mut failed = None;
        for i in 0..n {
            let id = book.inflight.peek_id(i);
            let len = book.protocol.fill_request(id, &mut self.scratch);
            match links.queue(&self.scratch[..len]) {
                Ok(()) => queued += 1,
                Err(e) => {
                    failed.get_or_insert(format!("connect: {e}"));
                }
            }
        }
        let before = realtime_ns();
        let mut trouble = Trouble::default();
        links.flush(&mut trouble);
        let after = if n > 1 { realtime_ns() } else { before };
        book.inflight.commit(n, before, after, step);
        self.progress.sent.fetch_add(queued, Ordering::Relaxed);
        if let Some((_, stats)) = &mut book.current {
            stats.sent += queued;
            stats.send_errors += n - queued + trouble.errors;
            if stats.first_error.is_none() {
                stats.first_error = failed.or(trouble.first);
            }
            let lag_ns = u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX).max(1);
            stats.send_lag.saturating_record_n(lag_ns, n);
        }
    }

    /// Waits up to `wait` on the TCP connections and takes in the replies.
    fn receive_tcp(&mut self, wait: Duration) {
        let Some(links) = &mut self.tcp else { return };
        let book = &mut self.book;
        let mut trouble = Trouble::default();
        let mut answered = 0;
        links.poll(wait, self.timeout, &mut trouble, |reply, t4| {
            answered += u64::from(book.on_reply(reply, t4));
        });
        self.progress
            .answered
            .fetch_add(answered, Ordering::Relaxed);
        if let Some(e) = trouble.first {
            book.count_error(e);
        }
    }

    /// Sends the next `n` requests in one batch from the next socket.
    fn send(&mut self, sockets: &[UdpSocket], n: u64, step: u16, lag: Duration) {
        if self.tcp.is_some() {
            return self.send_tcp(n, step, lag);
        }
        let (tx, book) = (&mut self.tx, &mut self.book);
        for i in 0..n {
            let id = book.inflight.peek_id(i);
            let protocol = &mut book.protocol;
            tx.push_with(self.target, None, |buf| {
                Some(protocol.fill_request(id, buf))
            });
        }
        let socket = &sockets[self.next_socket];
        self.next_socket = (self.next_socket + 1) % sockets.len();
        // T1: read as late as we can before the requests leave, and again when the call returns
        // to place the others within it.
        let before = realtime_ns();
        let outcome = socket.send_batch(tx);
        let after = if n > 1 { realtime_ns() } else { before };
        book.inflight.commit(n, before, after, step);
        self.progress
            .sent
            .fetch_add(outcome.sent as u64, Ordering::Relaxed);
        if let Some((_, stats)) = &mut book.current {
            stats.sent += outcome.sent as u64;
            stats.send_errors += outcome.errors as u64;
            if let (None, Some(e)) = (&stats.first_error, outcome.last_error) {
                stats.first_error = Some(format!("send: {e}"));
            }
            let lag_ns = u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX).max(1);
            stats.send_lag.saturating_record_n(lag_ns, n);
        }
    }

    /// Waits up to `wait` for replies on any socket, then drains every socket that has some.
    fn receive(&mut self, sockets: &[UdpSocket], fds: &mut [PollFd<'_>], wait: Duration) {
        if self.tcp.is_some() {
            return self.receive_tcp(wait);
        }
        match ppoll(fds, Some(TimeSpec::from_duration(wait)), None) {
            Ok(0) | Err(Errno::EINTR) => return,
            Ok(_) => {}
            Err(e) => {
                self.book.count_error(format!("poll: {e}"));
                // Do not spin on a persistent error.
                std::thread::sleep(wait.min(Duration::from_millis(1)));
                return;
            }
        }
        let ready = PollFlags::POLLIN | PollFlags::POLLERR;
        for (fd, socket) in fds.iter().zip(sockets) {
            if fd.revents().is_some_and(|r| r.intersects(ready)) {
                self.drain(socket);
            }
        }
    }

    /// Receives everything queued on one socket.
    fn drain(&mut self, socket: &UdpSocket) {
        loop {
            match socket.recv_batch(&mut self.rx) {
                Ok(0) => return,
                Ok(n) => {
                    let mut answered = 0;
                    // Without kernel timestamps, T4 is read once per batch, right after it.
                    let mut now_ns = None;
                    for (meta, payload) in self.rx.iter() {
                        let t4 = match meta.timestamp {
                            Some(ts) => ts.secs * 1_000_000_000 + i64::from(ts.nanos),
                            None => *now_ns.get_or_insert_with(realtime_ns),
                        };
                        answered += u64::from(self.book.on_reply(payload, t4));
                    }
                    self.progress
                        .answered
                        .fetch_add(answered, Ordering::Relaxed);
                    if n < self.rx.capacity() {
                        return;
                    }
                }
                Err(e) => {
                    self.book.count_error(format!("receive: {e}"));
                    return;
                }
            }
        }
    }
}

impl<P: LoadProtocol> Book<P> {
    /// Matches one reply to its request and counts it; `true` if it answered a request (of a
    /// step or of the warm-up, for the progress line).
    fn on_reply(&mut self, payload: &[u8], t4_ns: i64) -> bool {
        let matched = self
            .protocol
            .match_reply(payload, t4_ns.div_euclid(1_000_000_000));
        let ReplyMatch::Matched {
            id,
            verdict,
            server,
            signed,
        } = matched
        else {
            if let Some((_, stats)) = &mut self.current {
                stats.invalid_unmatched += 1;
            }
            return false;
        };
        let slot = match self.inflight.lookup(id) {
            Lookup::Found(slot) => slot,
            Lookup::Foreign => {
                if let Some((_, stats)) = &mut self.current {
                    stats.invalid_unmatched += 1;
                }
                return false;
            }
            // Its step is forgotten; it arrived during this one.
            Lookup::Expired => {
                if let Some((step, _)) = self.current {
                    self.late[usize::from(step)] += 1;
                }
                return false;
            }
        };
        if slot.step == WARMUP {
            // Not counted, but the progress line shows the warm-up being answered.
            let answered = slot.state == State::Pending && verdict == Verdict::Valid;
            if answered {
                slot.state = State::Answered;
            }
            return answered;
        }
        let step = usize::from(slot.step);
        let in_time = t4_ns.saturating_sub(slot.t1_ns) <= self.timeout_ns;
        let current = match &mut self.current {
            Some((s, stats)) if *s == slot.step => Some(stats),
            _ => None,
        };
        match (slot.state, current) {
            (State::Pending, Some(stats)) if in_time => {
                match verdict {
                    Verdict::Valid => {
                        slot.state = State::Answered;
                        stats.answered += 1;
                        let rtt = t4_ns - slot.t1_ns;
                        stats.stale += u64::from(rtt > self.stale_ns);
                        record_ns(&mut stats.rtt, rtt);
                        if stats.slowest.is_none_or(|(worst, _)| rtt > worst) {
                            stats.slowest = Some((rtt, slot.t1_ns));
                        }
                        if let Some(signed) = signed {
                            stats.record_signed(signed);
                        }
                        if let Some(server) = server {
                            record_ns(&mut stats.t3_t2, server.transmit_ns - server.receive_ns);
                            if slot.first_in_batch {
                                let t2_t1 = server.receive_ns - slot.t1_ns;
                                stats.t2_before_t1 += u64::from(t2_t1 < 0);
                                record_ns(&mut stats.t2_t1, t2_t1);
                            }
                        }
                        return true;
                    }
                    Verdict::Refused => stats.refused += 1,
                    Verdict::Invalid => stats.invalid_matched += 1,
                }
                slot.state = State::Settled;
            }
            // Past its timeout, or its step is already over.
            (State::Pending, _) => {
                slot.state = State::Late;
                self.late[step] += 1;
            }
            _ => self.duplicate[step] += 1,
        }
        false
    }

    fn count_error(&mut self, error: String) {
        if let Some((_, stats)) = &mut self.current {
            stats.recv_errors += 1;
            stats.first_error.get_or_insert(error);
        }
    }
}

/// When each of one thread's requests in a phase is due.
///
/// The phase's requests are numbered over all threads, request g due at `start + g / rate`, and
/// thread i sends those with g ≡ i (mod threads): together the threads send one evenly spaced
/// stream.
#[derive(Debug)]
struct Schedule {
    start: Instant,
    /// Seconds from the start to this thread's first request.
    offset: f64,
    /// Seconds between this thread's requests.
    interval: f64,
    /// This thread's requests in the phase.
    total: u64,
}

impl Schedule {
    fn new(phase: &Phase, index: usize, threads: usize) -> Self {
        let all = (phase.rate * phase.duration.as_secs_f64()).round() as u64;
        let (index, threads) = (index as u64, threads as u64);
        let total = if all > index {
            (all - index - 1) / threads + 1
        } else {
            0
        };
        Self {
            start: phase.start,
            offset: index as f64 / phase.rate,
            interval: threads as f64 / phase.rate,
            total,
        }
    }

    /// When request `k` (of this thread, 0-based) is due.
    fn due_at(&self, k: u64) -> Instant {
        self.start + Duration::from_secs_f64(self.offset + k as f64 * self.interval)
    }

    /// How many of this thread's requests are due by `now`.
    fn due_by(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64() - self.offset;
        if elapsed < 0.0 {
            return 0;
        }
        ((elapsed / self.interval).floor() as u64 + 1).min(self.total)
    }
}

/// The realtime clock in nanoseconds since the Unix epoch: the clock the kernel stamps received
/// datagrams with and the server reads for T2 and T3.
pub(super) fn realtime_ns() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(rate: f64, secs: f64) -> Phase {
        Phase {
            step: 0,
            rate,
            start: Instant::now(),
            duration: Duration::from_secs_f64(secs),
            stale_after: Duration::from_millis(100),
        }
    }

    #[test]
    fn threads_share_one_even_stream() {
        let p = phase(1000.0, 1.0);
        let s: Vec<Schedule> = (0..3).map(|i| Schedule::new(&p, i, 3)).collect();
        assert_eq!(s.iter().map(|s| s.total).sum::<u64>(), 1000);
        assert_eq!((s[0].total, s[1].total, s[2].total), (334, 333, 333));
        // Thread 1's first request is the stream's second, 1 ms in; its next 3 ms later.
        assert_eq!(s[1].due_at(0) - p.start, Duration::from_millis(1));
        assert_eq!(s[1].due_at(1) - p.start, Duration::from_millis(4));
        assert_eq!(s[1].due_by(p.start), 0);
        assert_eq!(s[1].due_by(p.start + Duration::from_micros(1_500)), 1);
        assert_eq!(s[1].due_by(p.start + Duration::from_millis(4)), 2);
        assert_eq!(s[1].due_by(p.start + Duration::from_secs(5)), 333);
        // The last request is due before the phase ends.
        assert!(s[0].due_at(s[0].total - 1) < p.start + p.duration);
    }

    #[test]
    fn tiny_phases_may_leave_threads_idle() {
        let p = phase(2.0, 1.0);
        assert_eq!(Schedule::new(&p, 0, 4).total, 1);
        assert_eq!(Schedule::new(&p, 1, 4).total, 1);
        assert_eq!(Schedule::new(&p, 2, 4).total, 0);
    }
}
