//! A worker's bookkeeping, for both services, and where its counts are read. A worker counts in
//! plain integers it owns ([`Counters`]; no atomics on the hot path) and publishes them at every
//! tick (once per batch, and at idle wake-ups) into a [`Published`] of its own: relaxed stores by
//! its one writer, no read-modify-write. Its service's [`Workers`] holds every worker's
//! [`Published`], and is what both the totals the daemon logs at exit and the metrics endpoint
//! read: one set of counters, two readers.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use crate::observe::counters::{Counters, NOTES, PublishedCounts, Reason};
use crate::service::Beat;

/// One worker's counts since it started, as the log's totals and the metrics read them: written
/// only by that worker, at every tick (every batch and idle wake-up) and when it stops.
#[derive(Debug)]
pub(crate) struct Published {
    /// The service its series are labelled with: `ntp` or `roughtime`.
    pub(crate) service: &'static str,
    /// The address family of its socket, `ipv4` or `ipv6`; or its path, `xdp` or `tcp`.
    pub(crate) family: &'static str,
    /// Its index among the threads on that socket address.
    pub(crate) thread: usize,
    /// Its service's drop reasons' labels, in [`Reason::index`] order.
    pub(crate) labels: &'static [&'static str],
    received: AtomicU64,
    batches: AtomicU64,
    answered: AtomicU64,
    send_errors: AtomicU64,
    kernel_drops: AtomicU64,
    shed: AtomicU64,
    notes: [AtomicU64; NOTES],
    dropped: Box<[AtomicU64]>,
}

impl Published {
    /// Relaxed stores by the one writer: no read-modify-write.
    fn store<R: Reason>(&self, c: &Counters<R>) {
        self.received.store(c.received, Relaxed);
        self.batches.store(c.batches, Relaxed);
        self.answered.store(c.answered, Relaxed);
        self.send_errors.store(c.send_errors, Relaxed);
        self.kernel_drops.store(c.kernel_drops, Relaxed);
        self.shed.store(c.shed, Relaxed);
        for (a, b) in self.notes.iter().zip(c.notes) {
            a.store(b, Relaxed);
        }
        for (a, (_, b)) in self.dropped.iter().zip(c.drops()) {
            a.store(b, Relaxed);
        }
    }

    pub(crate) fn load(&self) -> PublishedCounts {
        PublishedCounts {
            received: self.received.load(Relaxed),
            batches: self.batches.load(Relaxed),
            answered: self.answered.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            kernel_drops: self.kernel_drops.load(Relaxed),
            shed: self.shed.load(Relaxed),
            notes: std::array::from_fn(|i| self.notes[i].load(Relaxed)),
            dropped: self.dropped.iter().map(|d| d.load(Relaxed)).collect(),
        }
    }
}

/// Every worker of one service (or one transport of it), each with its [`Published`] counts, in
/// the order they started: the one place the exit log's totals and the metrics read.
#[derive(Debug)]
pub(crate) struct Workers<R: Reason> {
    service: &'static str,
    list: Mutex<Vec<Arc<Published>>>,
    reason: std::marker::PhantomData<R>,
}

impl<R: Reason> Workers<R> {
    /// No workers yet, of the service whose series are labelled `service`.
    pub(crate) fn new(service: &'static str) -> Self {
        Self {
            service,
            list: Mutex::default(),
            reason: std::marker::PhantomData,
        }
    }

    /// A new worker's counts, registered (once, when the worker is made; never on the hot path).
    pub(crate) fn register(&self, family: &'static str, thread: usize) -> Arc<Published> {
        let zero = || AtomicU64::new(0);
        let p = Arc::new(Published {
            service: self.service,
            family,
            thread,
            labels: R::LABELS,
            received: zero(),
            batches: zero(),
            answered: zero(),
            send_errors: zero(),
            kernel_drops: zero(),
            shed: zero(),
            notes: std::array::from_fn(|_| zero()),
            dropped: R::LABELS.iter().map(|_| zero()).collect(),
        });
        self.lock().push(p.clone());
        p
    }

    /// The sum over every worker, for the log.
    pub(crate) fn total(&self) -> Counters<R> {
        let mut total = Counters::default();
        for w in self.lock().iter() {
            total.add_published(&w.load());
        }
        total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Published>>> {
        self.list
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A service's workers as the metrics read them, whatever its drop reasons.
pub(crate) trait Listed: fmt::Debug + Send + Sync {
    /// Every worker's counts, in the order they started.
    fn published(&self) -> Vec<Arc<Published>>;
}

impl<R: Reason + Send + Sync> Listed for Workers<R> {
    fn published(&self) -> Vec<Arc<Published>> {
        self.lock().clone()
    }
}

/// The bookkeeping every worker does around its batches: count, publish at every tick, log a
/// line at the stats interval and at exit, log send errors at most once per interval, and beat
/// the heartbeat the watchdog reads at every tick (every batch, and every idle wake-up).
#[derive(Debug)]
pub(crate) struct WorkerStats<R: Reason> {
    /// Everything counted since the worker started, in integers it alone writes.
    pub(crate) counts: Counters<R>,
    /// `counts` as the last stats line showed them.
    at_line: Counters<R>,
    last_line_unix: i64,
    send_error_logged: bool,
    service: &'static str,
    interval: Option<Duration>,
    published: Arc<Published>,
    /// The socket's drop count when last read (the kernel's, cumulative, wrapping).
    kernel_drops_seen: u32,
    /// Advanced at every [`Self::tick`], for the watchdog; one no one watches until
    /// [`Self::with_heartbeat`].
    heartbeat: Beat,
}

impl<R: Reason> WorkerStats<R> {
    /// The bookkeeping of a worker whose log lines name `service`, registered among `workers` as
    /// thread `thread` on `family`.
    pub(crate) fn new(
        service: &'static str,
        interval: Option<Duration>,
        (workers, family, thread): (&Workers<R>, &'static str, usize),
    ) -> Self {
        let published = workers.register(family, thread);
        Self {
            counts: Counters::default(),
            at_line: Counters::default(),
            last_line_unix: crate::clock::read().unix_secs(),
            send_error_logged: false,
            service,
            interval,
            published,
            kernel_drops_seen: 0,
            heartbeat: Beat::default(),
        }
    }

    /// The same bookkeeping, its ticks seen by the watchdog through `beat`.
    pub(crate) fn with_heartbeat(mut self, beat: Beat) -> Self {
        self.heartbeat = beat;
        self
    }

    /// Publishes the counts so far, for the metrics and the totals at exit.
    fn publish(&self) {
        self.published.store(&self.counts);
    }

    /// One pass through the worker's loop, at `now_unix`: beats the heartbeat, publishes the
    /// counts, and logs them if the stats interval has passed and something was counted since
    /// the last line (an idle worker, which wakes now and then for the watchdog, logs nothing
    /// new).
    pub(crate) fn tick(&mut self, now_unix: i64) {
        self.heartbeat.beat();
        self.publish();
        let Some(interval) = self.interval else {
            return;
        };
        // The clock first: it is what a batch usually stops at, and costs less than comparing
        // every counter.
        if now_unix.saturating_sub(self.last_line_unix) < interval.as_secs() as i64 {
            return;
        }
        if self.counts == self.at_line {
            return;
        }
        self.send_error_logged = false;
        self.at_line = self.counts;
        self.last_line_unix = now_unix;
        info!("{} stats: {}", self.service, self.counts.display());
    }

    /// Takes the socket's cumulative drop count (see `BatchHandler::receive_drops`) into the
    /// counters as the drops since the last reading. A socket's count starts at zero when it is
    /// bound, before the worker starts.
    pub(crate) fn receive_drops(&mut self, total: u32) {
        let new = total.wrapping_sub(self.kernel_drops_seen);
        self.kernel_drops_seen = total;
        if new > 0 {
            self.counts.kernel_drops += u64::from(new);
            self.publish();
        }
    }

    /// Requests received and shed unanswered ([`chime_udp::BatchHandler::shed`]).
    pub(crate) fn shed(&mut self, count: usize) {
        self.counts.received += count as u64;
        self.counts.shed += count as u64;
    }

    /// Counts a send outcome; the first error of an interval is logged, the rest only counted.
    pub(crate) fn sent(&mut self, outcome: &chime_udp::SendOutcome) {
        self.counts.answered += outcome.sent as u64;
        self.counts.send_errors += outcome.errors as u64;
        self.publish();
        if let Some(e) = &outcome.last_error
            && !self.send_error_logged
        {
            self.send_error_logged = true;
            warn!(
                "{} send failed: {e} (more this interval are only counted)",
                self.service
            );
        }
    }

    /// The last publication and line, when the worker stops.
    pub(crate) fn finish(&mut self) {
        self.publish();
        info!(
            "{} stats at exit: {}",
            self.service,
            self.counts.display_all()
        );
    }
}

/// The [`chime_udp::BatchHandler`] methods that are a worker's bookkeeping alone, written once
/// for every handler: inside its `impl BatchHandler`, `bookkeeping!(field, "fail-point")` names
/// the field holding its [`WorkerStats`] and the fail point its idle wake-ups pass (the tests'
/// `failpoints` feature). Sends are counted, each idle wake-up is a tick at the time read then
/// (the heartbeat the watchdog reads, and the stats line when due), the kernel's drops and shed
/// requests are counted, and the last flush is at the stop.
macro_rules! bookkeeping {
    ($stats:ident, $fail_point:literal) => {
        fn after_send(&mut self, outcome: &::chime_udp::SendOutcome) {
            self.$stats.sent(outcome);
        }

        fn idle(&mut self) {
            ::fail::fail_point!($fail_point);
            self.$stats.tick($crate::clock::read().unix_secs());
        }

        fn receive_drops(&mut self, total: u32) {
            self.$stats.receive_drops(total);
        }

        fn shed(&mut self, count: usize) {
            self.$stats.shed(count);
        }

        fn finish(&mut self) {
            self.$stats.finish();
        }
    };
}
pub(crate) use bookkeeping;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::counters::tests::X;

    /// The log's totals and the metrics read the same counts: what each worker last published.
    #[test]
    fn the_totals_and_the_metrics_read_what_each_worker_published() {
        let workers = Workers::<X>::new("ntp");
        let mut a = WorkerStats::new("ntp", None, (&workers, "ipv4", 0));
        let mut b = WorkerStats::new("ntp", None, (&workers, "ipv4", 1));
        a.counts.received = 3;
        a.counts.drop(X);
        b.counts.received = 2;
        assert_eq!(
            workers.total().received,
            0,
            "nothing published before a tick"
        );
        a.tick(0);
        b.finish();
        let total = workers.total();
        assert_eq!((total.received, total.dropped(X)), (5, 1));
        let each: Vec<_> = (workers.published().iter())
            .map(|w| (w.family, w.thread, w.load().received, w.load().dropped))
            .collect();
        assert_eq!(each, [("ipv4", 0, 3, vec![1]), ("ipv4", 1, 2, vec![0])]);
    }
}
