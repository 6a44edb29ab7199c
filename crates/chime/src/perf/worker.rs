//! The engine's event loop, one per sending thread: it paces requests out on an absolute
//! schedule through its transport, takes in what comes back, and matches each reply to its
//! request in the in-flight table and counts it, whatever the protocol and the transport.
//!
//! Sending and receiving share one thread so that the in-flight table, the counters and the
//! histograms are the thread's own: no locks, no atomics on the per-packet path (the progress
//! counters are bumped once per batch). The loop is open: request k of a step is due at
//! `start + k / rate` whatever has come back, and when the loop runs late it sends everything that
//! is due at once (up to a batch per send), so a slow server cannot slow the load down. Between
//! due times the thread waits in its transport's poll, waking for replies or for the next
//! request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use super::inflight::{InFlight, Lookup, State, WARMUP};
use super::protocol::{ReplyMatch, Verdict};
use super::stats::{StepStats, record_ns};
use super::transport::{Event, Reply, Request, Transport};

/// How long past a step's end requests that are still due may go out, when the loop ran late at
/// the very end; anything left after that is counted unsent.
const LATE_SEND_GRACE: Duration = Duration::from_millis(20);

/// What the engine asks a worker to do next.
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

/// Counters the engine reads for the live progress line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Progress {
    pub(crate) sent: AtomicU64,
    pub(crate) answered: AtomicU64,
}

/// Everything a worker needs but its transport, built by the engine.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) index: usize,
    pub(crate) threads: usize,
    pub(crate) inflight: InFlight,
    pub(crate) batch_size: usize,
    pub(crate) timeout: Duration,
    pub(crate) steps: usize,
    pub(crate) progress: Arc<Progress>,
    pub(crate) commands: Receiver<Command>,
    pub(crate) results: Sender<StepDone>,
}

impl Worker {
    /// Runs phases over `transport` as the engine sends them until it says stop (or goes
    /// away).
    pub(crate) fn run<T: Transport>(self, transport: T) -> Finished {
        // Sleeps until the next request are short; the default 50 µs of timer slack would bunch
        // requests up at high rates. Failure only makes pacing coarser.
        let _ = nix::sys::prctl::set_timerslack(1_000);
        let Worker {
            index,
            threads,
            inflight,
            batch_size,
            timeout,
            steps,
            progress,
            commands,
            results,
        } = self;
        let mut engine = Engine {
            index,
            threads,
            batch_size,
            timeout,
            progress,
            transport,
            requests: Vec::with_capacity(batch_size),
            book: Book {
                inflight,
                timeout_ns: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
                stale_ns: i64::MAX,
                ends_itself: T::ENDS_ITSELF,
                current: None,
                late: vec![0; steps],
                duplicate: vec![0; steps],
            },
        };
        while let Ok(Command::Run(phase)) = commands.recv() {
            if let Some(stats) = engine.run_phase(&phase) {
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

/// The event loop's state.
struct Engine<T> {
    index: usize,
    threads: usize,
    batch_size: usize,
    timeout: Duration,
    progress: Arc<Progress>,
    transport: T,
    /// The batch being sent, kept to reuse its room.
    requests: Vec<Request>,
    book: Book,
}

/// Matching replies to requests, and counting: everything a reply touches.
struct Book {
    inflight: InFlight,
    timeout_ns: i64,
    /// The phase's client interval: answers with a longer round trip are stale.
    stale_ns: i64,
    /// The transport ends its requests itself ([`Transport::ENDS_ITSELF`]).
    ends_itself: bool,
    /// The step being measured and its numbers so far; `None` during the warm-up.
    current: Option<(u16, StepStats)>,
    late: Vec<u64>,
    duplicate: Vec<u64>,
}

impl<T: Transport> Engine<T> {
    /// Sends this thread's share of a phase on schedule, then (for a counted step) waits for the
    /// outstanding replies up to the timeout. Returns the step's numbers; `None` for the warm-up.
    fn run_phase(&mut self, phase: &Phase) -> Option<StepStats> {
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
                self.send(&schedule, next, n, phase.step, now);
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
            self.receive(wait);
        }
        // The warm-up runs straight into the first step, without waiting for its replies.
        let (_, stats) = self.book.current.as_mut()?;
        stats.unsent = schedule.total - next;

        // Every request gets its full timeout, the last one included; a transport that ends its
        // requests itself gets another to report the last ends.
        let mut deadline = last_send + self.timeout;
        if T::ENDS_ITSELF {
            deadline += self.timeout;
        }
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
            self.receive(deadline - now);
        }
        self.book.current.take().map(|(_, stats)| stats)
    }

    /// Sends this thread's requests `next..next + n` of the schedule in one batch, at `now`.
    fn send(&mut self, schedule: &Schedule, next: u64, n: u64, step: u16, now: Instant) {
        let first_due = schedule.due_at(next);
        let lag = now.saturating_duration_since(first_due);
        self.requests.clear();
        let book = &mut self.book;
        self.requests.extend((0..n).map(|i| Request {
            id: book.inflight.peek_id(i),
            due: schedule.due_after(first_due, i),
        }));
        let sent = self.transport.send(&self.requests);
        let (before, after) = sent.t1_ns;
        book.inflight.commit(n, before, after, step);
        self.progress.sent.fetch_add(sent.sent, Ordering::Relaxed);
        if let Some((_, stats)) = &mut book.current {
            stats.sent += sent.sent;
            stats.send_errors += sent.errors;
            if stats.first_error.is_none() {
                stats.first_error = sent.error;
            }
            // A transport that queues its requests reports each one's wait when it ends.
            if !T::ENDS_ITSELF {
                let lag_ns = u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX).max(1);
                stats.send_lag.saturating_record_n(lag_ns, n);
            }
        }
    }

    /// Waits up to `wait` for replies, and takes in all that have come.
    fn receive(&mut self, wait: Duration) {
        let book = &mut self.book;
        let mut answered = 0;
        self.transport.poll(wait, &mut |event| match event {
            Event::Reply(reply) => answered += u64::from(book.on_reply(reply)),
            Event::Error(e) => book.count_error(e),
        });
        self.progress
            .answered
            .fetch_add(answered, Ordering::Relaxed);
    }
}

impl Book {
    /// Matches one reply to its request and counts it; `true` if it answered a request (of a
    /// step or of the warm-up, for the progress line).
    fn on_reply(&mut self, reply: Reply) -> bool {
        let ReplyMatch::Matched {
            id,
            verdict,
            server,
            signed,
        } = reply.matched
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
        let in_time = self.ends_itself || reply.t4_ns.saturating_sub(slot.t1_ns) <= self.timeout_ns;
        let current = match &mut self.current {
            Some((s, stats)) if *s == slot.step => Some(stats),
            _ => None,
        };
        match (slot.state, current) {
            (State::Pending, Some(stats)) if in_time => {
                slot.state = State::Settled;
                if let Some(began) = reply.began {
                    record_ns(&mut stats.send_lag, began.queued_ns);
                }
                match verdict {
                    Verdict::Valid => {
                        slot.state = State::Answered;
                        let t1_ns = reply.began.map_or(slot.t1_ns, |b| b.at_ns);
                        let exact_t1 = slot.first_in_batch && reply.began.is_none();
                        let rtt = reply.t4_ns - t1_ns;
                        stats.answer(rtt, rtt > self.stale_ns, (t1_ns, exact_t1), server, signed);
                        return true;
                    }
                    Verdict::Refused => stats.refused += 1,
                    Verdict::Invalid => stats.invalid_matched += 1,
                    Verdict::Failed(kind) => stats.fail(kind, reply.why),
                }
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
    /// The same, for placing a batch's requests after its first.
    spacing: Duration,
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
        let interval = threads as f64 / phase.rate;
        Self {
            start: phase.start,
            offset: index as f64 / phase.rate,
            interval,
            spacing: Duration::from_secs_f64(interval),
            total,
        }
    }

    /// When request `k` (of this thread, 0-based) is due.
    fn due_at(&self, k: u64) -> Instant {
        self.start + Duration::from_secs_f64(self.offset + k as f64 * self.interval)
    }

    /// When the request `i` after the one due at `first` is due (i is within a batch).
    fn due_after(&self, first: Instant, i: u64) -> Instant {
        first + self.spacing * u32::try_from(i).unwrap_or(u32::MAX)
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::super::inflight::thread_tags;
    use super::super::transport::{Began, Sent};
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
        assert_eq!(
            s[1].due_after(s[1].due_at(0), 1) - p.start,
            Duration::from_millis(4)
        );
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

    /// A server played in the test: what it does with the k-th request it is sent, the reply
    /// coming back at the next poll `rtt_ns` after the request's T1 (on a clock of the test's
    /// own, on which a batch leaves at once).
    type Policy = fn(k: u64, id: u64) -> Option<(Verdict, i64)>;

    /// A transport with no I/O: it records what it is sent and when, and answers by a policy.
    struct Fake<const ENDS: bool> {
        policy: Policy,
        /// Each request: its id, when it was due, and when it was sent.
        sent: Vec<(u64, Instant, Instant)>,
        replies: VecDeque<Reply>,
    }

    /// T1 of a batch whose first request is the k-th, on the test's clock: 1 ms a request, from
    /// an arbitrary epoch.
    fn t1(k: u64) -> i64 {
        1_800_000_000_000_000_000 + k as i64 * 1_000_000
    }

    impl<const ENDS: bool> Transport for Fake<ENDS> {
        const ENDS_ITSELF: bool = ENDS;

        fn send(&mut self, requests: &[Request]) -> Sent {
            let first = self.sent.len() as u64;
            for r in requests {
                let k = self.sent.len() as u64;
                self.sent.push((r.id, r.due, Instant::now()));
                let Some((verdict, rtt_ns)) = (self.policy)(k, r.id) else {
                    continue;
                };
                let matched = ReplyMatch::Matched {
                    id: r.id,
                    verdict,
                    server: None,
                    signed: None,
                };
                let mut reply = Reply::arrived(matched, t1(first) + rtt_ns);
                if ENDS {
                    // Began 10 µs after it was sent, having queued 7 µs.
                    reply.began = Some(Began {
                        at_ns: t1(first) + 10_000,
                        queued_ns: 7_000,
                    });
                    reply.why = Some(format!("request {k}"));
                }
                self.replies.push_back(reply);
            }
            // The whole batch left at its first request's T1.
            Sent {
                sent: requests.len() as u64,
                t1_ns: (t1(first), t1(first)),
                ..Sent::default()
            }
        }

        fn poll(&mut self, wait: Duration, on: &mut impl FnMut(Event)) {
            if self.replies.is_empty() {
                std::thread::sleep(wait);
            }
            while let Some(r) = self.replies.pop_front() {
                on(Event::Reply(r));
            }
        }
    }

    /// One thread's engine over a fake transport with `policy`, a 20 ms timeout and one step.
    fn engine<const ENDS: bool>(policy: Policy) -> Engine<Fake<ENDS>> {
        let timeout = Duration::from_millis(20);
        Engine {
            index: 0,
            threads: 1,
            batch_size: 8,
            timeout,
            progress: Arc::default(),
            transport: Fake {
                policy,
                sent: Vec::new(),
                replies: VecDeque::new(),
            },
            requests: Vec::new(),
            book: Book {
                inflight: InFlight::new(thread_tags(1)[0], 4096),
                timeout_ns: 20_000_000,
                stale_ns: i64::MAX,
                ends_itself: ENDS,
                current: None,
                late: vec![0; 1],
                duplicate: vec![0; 1],
            },
        }
    }

    /// Four kinds of answer in turn, and a reply past the timeout: each request ends in exactly
    /// one count, the ones never answered are lost, and the requests left on schedule.
    #[test]
    fn the_engine_sends_on_schedule_and_counts_every_kind_of_answer() {
        let mut e = engine::<false>(|k, _| match k % 5 {
            0 => Some((Verdict::Valid, 50_000)),
            1 => Some((Verdict::Refused, 50_000)),
            2 => Some((Verdict::Invalid, 50_000)),
            3 => None,
            _ => Some((Verdict::Valid, 30_000_000)),
        });
        let p = phase(2000.0, 0.05);
        let s = e.run_phase(&p).expect("a counted step");
        assert_eq!(
            (s.scheduled, s.sent, s.unsent, s.send_errors),
            (100, 100, 0, 0)
        );
        assert_eq!((s.answered, s.refused, s.invalid_matched), (20, 20, 20));
        // Never answered, and answered 30 ms late (past the 20 ms timeout): lost both.
        assert_eq!(s.lost(), 40);
        assert_eq!(e.book.late[0], 20);
        assert_eq!(s.rtt.len(), 20);
        assert!(s.rtt.equivalent(s.rtt.max(), 50_000), "{}", s.rtt.max());
        assert_eq!(s.send_lag.len(), 100);

        // Every request went out once, with its own id, at or after its due time, which are
        // 0.5 ms apart from the phase's start.
        let sent = &e.transport.sent;
        assert_eq!(sent.len(), 100);
        let mut ids: Vec<u64> = sent.iter().map(|r| r.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 100);
        for (k, (_, due, at)) in sent.iter().enumerate() {
            let expected = p.start + Duration::from_micros(500 * k as u64);
            let off = due.max(&expected).duration_since(*due.min(&expected));
            assert!(
                off < Duration::from_micros(2),
                "request {k} due {off:?} off"
            );
            // Within the rounding of the schedule's float arithmetic.
            assert!(
                *at + Duration::from_micros(1) >= *due,
                "request {k} sent early"
            );
        }
    }

    /// A reply that names no request of ours, or names one twice.
    #[test]
    fn foreign_and_duplicate_replies_change_no_request() {
        let mut e = engine::<false>(|_, _| Some((Verdict::Valid, 50_000)));
        let s = e.run_phase(&phase(1000.0, 0.01)).unwrap();
        assert_eq!(s.answered, 10);
        e.book.current = Some((0, StepStats::new()));
        let id = e.transport.sent[3].0;
        let again = |id| {
            Reply::arrived(
                ReplyMatch::Matched {
                    id,
                    verdict: Verdict::Valid,
                    server: None,
                    signed: None,
                },
                t1(3) + 60_000,
            )
        };
        assert!(!e.book.on_reply(again(id)));
        assert!(!e.book.on_reply(again(id ^ (1 << 63))));
        assert!(!e.book.on_reply(Reply::arrived(ReplyMatch::Unmatched, 0)));
        let (_, s) = e.book.current.take().unwrap();
        assert_eq!((s.answered, s.invalid_unmatched), (0, 2));
        assert_eq!(e.book.duplicate[0], 1);
    }

    /// A transport that ends its requests itself: a failure counts by kind with its first reason,
    /// the latency runs from when the exchange began, its queueing is the send lag, and an end
    /// later than the timeout still counts.
    #[test]
    fn exchanges_a_transport_ends_itself_count_by_kind() {
        let mut e = engine::<true>(|k, _| match k % 3 {
            0 => Some((Verdict::Valid, 1_010_000)),
            1 => Some((Verdict::Failed("tls"), 40_000_000)),
            _ => Some((Verdict::Failed("refused"), 50_000)),
        });
        let s = e.run_phase(&phase(1000.0, 0.03)).unwrap();
        assert_eq!((s.scheduled, s.sent, s.answered), (30, 30, 10));
        assert_eq!(s.failures.get("tls"), Some(&10));
        assert_eq!(s.failures.get("refused"), Some(&10));
        assert_eq!((s.failed, s.lost()), (20, 0));
        assert_eq!(s.first_error.as_deref(), Some("first failure: request 1"));
        // 1.01 ms after T1, having begun 10 µs after it: 1 ms.
        assert_eq!(s.rtt.len(), 10);
        assert!(s.rtt.equivalent(s.rtt.max(), 1_000_000), "{}", s.rtt.max());
        assert_eq!(s.send_lag.len(), 30);
        assert!(s.send_lag.equivalent(s.send_lag.max(), 7_000));
    }
}
