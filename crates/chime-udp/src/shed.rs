//! Overload without a standing queue: which received datagrams to answer and which to shed, and
//! how deep to let the kernel queue them, decided from how long each waited in the socket's
//! receive queue.
//!
//! A worker's receive buffer is deep on purpose (tens of milliseconds of requests), so that a
//! burst, or a stall of the thread, is absorbed rather than dropped. Under a sustained overload
//! the same depth turns into a queue that never drains: every request waits the whole buffer
//! (20-25 ms at NTP's peak on one core), and a client that polls faster than that has moved on
//! before its reply comes. The reply is then useless however honest its timestamps are.
//!
//! [`Shedder`] tells the two apart the way CoDel (RFC 8289) manages a router's queue: it looks at
//! how long the oldest datagram of each batch waited (its kernel receive timestamp against the
//! time the batch was taken), and only once that wait has stayed above a target (a few
//! milliseconds) for a whole interval (about 100 ms) is the queue standing rather than a burst.
//! Then two things happen, until a receive no longer fills its batch (the socket's queue was
//! empty: the overload has passed):
//!
//! - Every datagram that waited longer than the target is shed: received, counted, and not
//!   answered; the younger ones are answered as usual. This clears the backlog at once, oldest
//!   first, which keeps the newest answered (as a sliding buffer would).
//! - The socket's receive buffer shrinks so that a full queue holds about half the target's worth
//!   of work, sized from what was measured (the buffer scaled by the half target over the wait),
//!   and is sized again every interval. The kernel then drops what the thread cannot serve in
//!   time as it arrives, before the thread spends anything on it: shedding in the thread costs a
//!   receive per datagram, which at twice the capacity is a fifth of the replies; a short kernel
//!   queue costs none. When the overload passes the buffer goes back to its full size, ready for
//!   the next burst.
//!
//! CoDel drops one packet at a time, at a rate that grows until the senders slow down; datagram
//! clients do not slow down, and a request that waited past the target has already lost most of
//! its worth, so every old one goes at once. Sans-IO: the caller reads the clock, passes the
//! times in and applies the buffer size; [`Shedder`] only decides.

use std::time::Duration;

use crate::Timestamp;

/// When to shed: the wait that is too long, and how long it must last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShedConfig {
    /// The longest a datagram may wait in the receive queue and still be answered once the queue
    /// is standing. CoDel's default is 5 ms.
    pub target: Duration,
    /// How long the oldest datagram's wait must stay above `target` before shedding starts: a
    /// burst or a stall that drains within it is answered in full. Also how often the receive
    /// buffer is sized again while shedding. CoDel's default is 100 ms; zero sheds at the first
    /// batch over the target.
    pub interval: Duration,
}

impl Default for ShedConfig {
    fn default() -> Self {
        Self {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
        }
    }
}

/// The smallest receive buffer shedding shrinks to, as the kernel counts it: room for a batch or
/// so of small datagrams, whatever the waits say.
pub const MIN_SHED_BUFFER: usize = 64 * 1024;

/// What to do with one received batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Shed the datagrams received before this; `None`: answer them all.
    pub cutoff: Option<Timestamp>,
    /// Resize the socket's receive buffer to this many bytes, as the kernel counts them, and
    /// report what it granted with [`Shedder::buffer_granted`]; `None`: leave it.
    pub recv_buffer: Option<usize>,
}

/// One worker's shedding state (see the module docs). A small value that lives on the worker
/// thread; it reads no clock of its own.
#[derive(Clone, Debug)]
pub struct Shedder {
    target_ns: i128,
    interval_ns: i128,
    /// Since when every batch's oldest datagram has waited longer than the target, while not
    /// shedding.
    above_since: Option<i128>,
    shedding: bool,
    /// The socket's receive buffer at its full size, and now (bytes, as the kernel counts them).
    full_buffer: usize,
    buffer: usize,
    /// While shedding: when the buffer was last sized, and the shortest wait of a batch's oldest
    /// datagram since then (the standing part of the queue).
    sized_at: i128,
    shortest_wait: i128,
}

impl Shedder {
    /// A shedder that has seen nothing yet, for a socket whose receive buffer is `buffer` bytes
    /// as the kernel counts them ([`crate::Capabilities::recv_buffer`]).
    pub fn new(cfg: ShedConfig, buffer: usize) -> Self {
        Self {
            target_ns: cfg.target.as_nanos() as i128,
            interval_ns: cfg.interval.as_nanos() as i128,
            above_since: None,
            shedding: false,
            full_buffer: buffer,
            buffer,
            sized_at: 0,
            shortest_wait: i128::MAX,
        }
    }

    /// Whether the queue is standing and datagrams older than the target are being shed.
    pub fn is_shedding(&self) -> bool {
        self.shedding
    }

    /// The receive buffer the socket should have now, as the kernel counts it.
    pub fn buffer(&self) -> usize {
        self.buffer
    }

    /// Records what the kernel granted after a [`Decision::recv_buffer`].
    pub fn buffer_granted(&mut self, bytes: usize) {
        self.buffer = bytes;
    }

    /// Decides for one received batch, taken at `now`, whose oldest (first) datagram the kernel
    /// received at `oldest` (`None` if it has no receive timestamp: then nothing is decided,
    /// since its wait is unknown); `full` says the receive filled the batch, so the queue may
    /// hold more, while a receive that did not fill it emptied the queue.
    pub fn decide(&mut self, now: Timestamp, oldest: Option<Timestamp>, full: bool) -> Decision {
        let Some(oldest) = oldest else {
            return Decision::default();
        };
        let now_ns = now.as_nanos();
        let waited = now_ns - oldest.as_nanos();
        let cutoff =
            (waited > self.target_ns).then(|| Timestamp::from_nanos(now_ns - self.target_ns));
        if self.shedding {
            if !full {
                // The queue emptied: the overload is over, after this batch's old ones go. A
                // batch whose oldest is young is not enough, since while shedding the oldest
                // left is always near the target.
                self.shedding = false;
                let restore = (self.buffer != self.full_buffer).then_some(self.full_buffer);
                return Decision {
                    cutoff,
                    recv_buffer: restore,
                };
            }
            self.shortest_wait = self.shortest_wait.min(waited);
            let mut recv_buffer = None;
            if now_ns - self.sized_at >= self.interval_ns.max(1) {
                recv_buffer = self.resize(self.shortest_wait);
                self.sized_at = now_ns;
                self.shortest_wait = i128::MAX;
            }
            return Decision {
                cutoff,
                recv_buffer,
            };
        }
        if cutoff.is_some() && full {
            let since = *self.above_since.get_or_insert(now_ns);
            if now_ns - since >= self.interval_ns {
                self.shedding = true;
                self.above_since = None;
                self.sized_at = now_ns;
                self.shortest_wait = i128::MAX;
                return Decision {
                    cutoff,
                    recv_buffer: self.resize(waited),
                };
            }
        } else {
            // Young, or the queue drained with this batch: a burst, absorbed.
            self.above_since = None;
        }
        Decision::default()
    }

    /// The buffer that makes a full queue wait about half the target, from a full queue that
    /// made the oldest wait `waited`: the buffer scaled by the ratio, at most 8 times smaller
    /// or 2 times larger than now, between [`MIN_SHED_BUFFER`] and the full size, in whole KiB.
    /// `None` if that is within a tenth of the buffer now.
    fn resize(&self, waited: i128) -> Option<usize> {
        let now = self.buffer as f64;
        let ratio = (self.target_ns as f64 / 2.0) / waited.max(1) as f64;
        let floor = MIN_SHED_BUFFER.min(self.full_buffer) as f64;
        let want = (now * ratio.clamp(0.125, 2.0)).clamp(floor, self.full_buffer as f64);
        // Whole KiB: the kernel takes half and doubles it, so an odd size would come back one
        // byte short.
        ((want - now).abs() > now / 10.0).then_some(want as usize & !1023)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    const MS: i128 = 1_000_000;
    /// Receive-buffer bytes one simulated datagram takes, as the kernel counts them.
    const DATAGRAM: usize = 1000;

    fn at(ns: i128) -> Option<Timestamp> {
        Some(Timestamp::from_nanos(ns))
    }

    /// What a simulated worker did with each request, by arrival time.
    #[derive(Default)]
    struct Outcome {
        /// (arrival, wait) of every answered request.
        answered: Vec<(i128, i128)>,
        /// Shed by the worker.
        shed: Vec<i128>,
        /// Dropped by the kernel: the queue was at its buffer.
        dropped: Vec<i128>,
        /// The buffer when the run ended.
        buffer: usize,
    }

    /// A worker thread on a simulated clock: requests arrive at the given rates, one phase after
    /// another ((duration, per second)), evenly spaced, into a kernel queue that holds
    /// `buffer / DATAGRAM` of them and drops arrivals beyond; the worker takes batches of up to
    /// 64, spending `recv_ns` on each request it takes and `reply_ns` more on each it answers,
    /// and resizes the buffer when told. Runs until every request is answered, shed or dropped.
    fn simulate(
        cfg: ShedConfig,
        buffer: usize,
        phases: &[(i128, i128)],
        recv_ns: i128,
        reply_ns: i128,
    ) -> Outcome {
        let mut arrivals = VecDeque::new();
        let mut start = 0;
        for &(duration, rate) in phases {
            let gap = 1_000_000_000 / rate;
            arrivals.extend((0..duration / gap).map(|i| start + i * gap));
            start += duration;
        }
        let mut shedder = Shedder::new(cfg, buffer);
        let mut out = Outcome::default();
        let mut queue = VecDeque::new();
        let mut now = 0;
        let mut batch = Vec::with_capacity(64);
        while !(arrivals.is_empty() && queue.is_empty()) {
            if queue.is_empty() {
                now = now.max(arrivals[0]);
            }
            // What arrived while the worker was busy, as the kernel queues it.
            while arrivals.front().is_some_and(|&a| a <= now) {
                let a = arrivals.pop_front().unwrap();
                if queue.len() * DATAGRAM < shedder.buffer() {
                    queue.push_back(a);
                } else {
                    out.dropped.push(a);
                }
            }
            batch.clear();
            while batch.len() < 64
                && let Some(a) = queue.pop_front()
            {
                batch.push(a);
            }
            let full = batch.len() == 64;
            let d = shedder.decide(Timestamp::from_nanos(now), at(batch[0]), full);
            if let Some(bytes) = d.recv_buffer {
                shedder.buffer_granted(bytes);
            }
            let shed = d.cutoff.map_or(0, |c| {
                batch.iter().take_while(|&&a| a < c.as_nanos()).count()
            });
            out.shed.extend(&batch[..shed]);
            out.answered
                .extend(batch[shed..].iter().map(|&a| (a, now - a)));
            now += batch.len() as i128 * recv_ns + (batch.len() - shed) as i128 * reply_ns;
        }
        out.buffer = shedder.buffer();
        out
    }

    /// Answered requests per 10 ms of arrivals.
    fn answered_per_slot(out: &Outcome, slots: usize) -> Vec<usize> {
        let mut per_slot = vec![0; slots];
        for &(a, _) in &out.answered {
            per_slot[(a / (10 * MS)) as usize] += 1;
        }
        per_slot
    }

    #[test]
    fn a_burst_shorter_than_the_interval_is_absorbed_without_a_drop() {
        // 400k/s of capacity (0.7 µs to receive, 1.8 µs more to reply). 30 ms at twice that
        // builds a queue 30 ms deep, whose oldest waits far above the 5 ms target, but at a
        // quarter load after it the queue drains within the 100 ms interval: with a buffer deep
        // enough for it, every request is answered.
        let out = simulate(
            ShedConfig::default(),
            32 << 20,
            &[(30 * MS, 800_000), (200 * MS, 100_000)],
            700,
            1_800,
        );
        assert!(out.shed.is_empty(), "{} shed", out.shed.len());
        assert!(out.dropped.is_empty(), "{} dropped", out.dropped.len());
        assert_eq!(out.answered.len(), 24_000 + 20_000);
        let worst = out.answered.iter().map(|&(_, w)| w).max().unwrap();
        assert!(worst > 20 * MS, "the burst did queue: {worst} ns");
    }

    #[test]
    fn a_standing_overload_sheds_old_requests_and_keeps_new_ones_answered() {
        // Two seconds at 1.5 times the capacity, then a second at half of it, behind a buffer
        // of 8000 requests (20 ms at the capacity).
        let full = 8000 * DATAGRAM;
        let out = simulate(
            ShedConfig::default(),
            full,
            &[(2000 * MS, 600_000), (1000 * MS, 200_000)],
            700,
            1_800,
        );
        assert!(!out.shed.is_empty());
        // Once the interval has passed and the buffer has been sized, every request answered
        // waited at most the target plus the batch in hand (64 requests at 2.5 µs: 0.16 ms).
        let late = out
            .answered
            .iter()
            .filter(|&&(a, w)| a > 300 * MS && w > 5 * MS + MS / 5)
            .count();
        assert_eq!(late, 0, "answered after waiting more than the target");
        // The newest keep being answered all through the overload: every 10 ms of arrivals has
        // answers.
        let per_slot = answered_per_slot(&out, 300);
        for (slot, &n) in per_slot.iter().enumerate().take(200).skip(30) {
            assert!(
                n > 2000,
                "only {n} answered of those arriving in slot {slot} (10 ms each)"
            );
        }
        // And at the thread's full capacity, 400k/s: the kernel drops the excess before it costs
        // the thread a receive. (Shedding it all in the thread would leave 600k/s × 0.7 µs less:
        // 233k/s.)
        let during: usize = per_slot[50..200].iter().sum();
        assert!(during > 560_000, "{during} answered in 1.5 s");
        assert!(!out.dropped.is_empty());
        // After the overload the buffer is back to its full size, and nothing more is shed or
        // dropped.
        assert_eq!(out.buffer, full);
        assert!(out.shed.iter().all(|&a| a < 2050 * MS));
        assert!(out.dropped.iter().all(|&a| a < 2050 * MS));
        let after: usize = per_slot[210..300].iter().sum();
        assert_eq!(after, 180_000);
    }

    #[test]
    fn without_shedding_the_same_overload_waits_the_whole_buffer() {
        // The control for the test above: a target so long it never triggers. Answers come 20 ms
        // late for as long as the overload lasts.
        let cfg = ShedConfig {
            target: Duration::from_secs(1),
            interval: Duration::from_millis(100),
        };
        let out = simulate(cfg, 8000 * DATAGRAM, &[(2000 * MS, 600_000)], 700, 1_800);
        assert!(out.shed.is_empty());
        let late = out
            .answered
            .iter()
            .filter(|&&(a, w)| a > 300 * MS && w > 15 * MS)
            .count();
        assert!(late > 500_000, "{late} answered late");
    }

    #[test]
    fn the_state_follows_the_oldest_wait_and_the_emptied_queue() {
        let full = 8 << 20;
        let mut s = Shedder::new(ShedConfig::default(), full);
        let ts = |ns| Timestamp::from_nanos(ns);
        let none = Decision::default();
        // No receive timestamp: nothing is known, nothing is done.
        assert_eq!(s.decide(ts(1000 * MS), None, true), none);
        // Above the target in full batches, but for less than the interval.
        assert_eq!(s.decide(ts(1000 * MS), at(990 * MS), true), none);
        assert_eq!(s.decide(ts(1099 * MS), at(1090 * MS), true), none);
        assert!(!s.is_shedding());
        // A young batch in between starts the interval over.
        assert_eq!(s.decide(ts(1100 * MS), at(1099 * MS), true), none);
        assert_eq!(s.decide(ts(1150 * MS), at(1140 * MS), true), none);
        assert_eq!(s.decide(ts(1249 * MS), at(1240 * MS), true), none);
        // A whole interval above it: the old go, and the buffer shrinks so that a full queue
        // waits half the target: 10 ms waited, so a quarter of it.
        let d = s.decide(ts(1250 * MS), at(1240 * MS), true);
        assert_eq!(d.cutoff, Some(ts(1245 * MS)));
        assert_eq!(d.recv_buffer, Some(full / 4));
        s.buffer_granted(full / 4);
        assert!(s.is_shedding());
        // A young batch does not end it; nothing in it is old, and within the interval the
        // buffer stays.
        assert_eq!(s.decide(ts(1260 * MS), at(1257 * MS), true), none);
        assert!(s.is_shedding());
        // An interval later it is sized again from the shortest wait seen: 3 ms, so a little
        // smaller; a wait of 2.5 ms would have left it.
        let d = s.decide(ts(1350 * MS), at(1346 * MS), true);
        let sized = (full / 4 * 5 / 6) & !1023;
        assert_eq!((d.cutoff, d.recv_buffer), (None, Some(sized)));
        s.buffer_granted(sized);
        // A batch that empties the queue ends it, its own old ones still shed, and the buffer
        // goes back to its full size.
        let d = s.decide(ts(1370 * MS), at(1360 * MS), false);
        assert_eq!((d.cutoff, d.recv_buffer), (Some(ts(1365 * MS)), Some(full)));
        s.buffer_granted(full);
        assert!(!s.is_shedding());
        assert_eq!(s.decide(ts(1380 * MS), at(1370 * MS), true), none);
        // A burst that drains (a batch that does not fill) before the interval starts it over.
        assert_eq!(s.decide(ts(1400 * MS), at(1380 * MS), false), none);
        assert_eq!(s.decide(ts(1480 * MS), at(1470 * MS), true), none);
        assert!(!s.is_shedding());
    }

    #[test]
    fn the_buffer_stays_between_its_floor_and_its_full_size() {
        let cfg = ShedConfig {
            target: Duration::from_millis(2),
            interval: Duration::ZERO,
        };
        let full = 1 << 20;
        let mut s = Shedder::new(cfg, full);
        // A zero interval sheds at the first full batch over the target. 100 ms waited would
        // call for a buffer 1/100 the size: at most 8 times smaller per step.
        let d = s.decide(Timestamp::from_nanos(150 * MS), at(50 * MS), true);
        assert_eq!(d.cutoff, Some(Timestamp::from_nanos(148 * MS)));
        assert_eq!(d.recv_buffer, Some(full / 8));
        s.buffer_granted(full / 8);
        let d = s.decide(Timestamp::from_nanos(250 * MS), at(150 * MS), true);
        assert_eq!(d.recv_buffer, Some(MIN_SHED_BUFFER));
        s.buffer_granted(MIN_SHED_BUFFER);
        // Short waits grow it, at most twice per step, never past the full size.
        let d = s.decide(Timestamp::from_nanos(260 * MS), at(260 * MS - 1000), true);
        assert_eq!(d.recv_buffer, Some(2 * MIN_SHED_BUFFER));
        s.buffer_granted(full - 1000);
        let d = s.decide(Timestamp::from_nanos(270 * MS), at(270 * MS - 1000), true);
        assert_eq!(d.recv_buffer, None, "within a tenth of the full size");
    }
}
