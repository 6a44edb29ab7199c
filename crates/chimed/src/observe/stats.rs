//! Per-thread counters, for both services. A worker counts in plain integers it owns (no atomics
//! on the hot path) and adds them into the shared totals at the stats interval and when it stops;
//! the totals are what the daemon logs at exit. `N` is the number of drop reasons of the service,
//! and a label per reason names it in the logs.
//!
//! With the metrics endpoint on, each worker also publishes its running counts once per batch
//! into a [`Published`] of its own: relaxed stores by its one writer, no read-modify-write, so
//! the hot path pays a few plain stores per batch.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chime_roughtime::Version;
use tracing::{info, warn};

use crate::daemon::notify::Beat;

/// Replies worth counting apart, beside `answered`: NTP's of note, and Roughtime's by the version
/// they speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    /// A Kiss-o'-Death RATE from rate limiting.
    Kod,
    /// An interleaved-mode reply, carrying the previous reply's transmit time.
    Interleaved,
    /// A kernel transmit timestamp received for interleaved mode.
    KernelTxTimestamp,
    /// An NTS-authenticated reply.
    Nts,
    /// An NTS NAK.
    NtsNak,
    /// A Roughtime reply in this version: an operator sees which versions clients still speak
    /// before dropping one.
    Roughtime(Version),
    /// A Roughtime reply made deliberately invalid (`--roughtime-grease`); also counted in its
    /// version.
    Greased,
}

/// The NTP notes, which come first.
pub(crate) const NTP_NOTES: usize = 5;
pub(crate) const NOTES: usize = NTP_NOTES + Version::COUNT + 1;

/// Which notes a service's lines carry at exit, zeros too: NTP's, or Roughtime's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Of {
    Ntp,
    Roughtime,
}

impl Of {
    fn notes(self) -> std::ops::Range<usize> {
        match self {
            Self::Ntp => 0..NTP_NOTES,
            Self::Roughtime => NTP_NOTES..NOTES,
        }
    }
}

impl Note {
    /// A dense index, for the counters' arrays and [`NOTE_LABELS`].
    pub(crate) const fn index(self) -> usize {
        match self {
            Self::Kod => 0,
            Self::Interleaved => 1,
            Self::KernelTxTimestamp => 2,
            Self::Nts => 3,
            Self::NtsNak => 4,
            Self::Roughtime(v) => NTP_NOTES + v.index(),
            Self::Greased => NTP_NOTES + Version::COUNT,
        }
    }
}

/// Each [`Note`]'s label in log lines, in [`Note::index`] order.
pub(crate) const NOTE_LABELS: [&str; NOTES] = [
    "kod",
    "interleaved",
    "kernel_tx_timestamps",
    "nts",
    "nts_nak",
    "version.google",
    "version.0x80000007",
    "version.0x80000008",
    "version.0x80000009",
    "version.0x8000000a",
    "version.0x8000000b",
    "version.0x8000000c",
    "version.1",
    "greased",
];

/// What one worker has seen since it last flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters<const N: usize> {
    pub(crate) received: u64,
    /// Receive batches handled: received / batches is the mean batch, which for Roughtime is
    /// the requests each signature covered.
    pub(crate) batches: u64,
    pub(crate) answered: u64,
    pub(crate) send_errors: u64,
    /// Requests the kernel dropped at the socket before the worker could receive them (its
    /// receive buffer was full): load the other counts never saw.
    pub(crate) kernel_drops: u64,
    /// Requests received but shed unanswered under a standing overload (`--shed-target`): they
    /// had waited in the queue longer than the target. Also in `received`.
    pub(crate) shed: u64,
    /// Replies of note (see [`Note`]), also in `answered` once sent.
    pub(crate) notes: [u64; NOTES],
    pub(crate) dropped: [u64; N],
}

impl<const N: usize> Default for Counters<N> {
    fn default() -> Self {
        Self {
            received: 0,
            batches: 0,
            answered: 0,
            send_errors: 0,
            kernel_drops: 0,
            shed: 0,
            notes: [0; NOTES],
            dropped: [0; N],
        }
    }
}

impl<const N: usize> Counters<N> {
    pub(crate) fn drop_at(&mut self, reason: usize) {
        self.dropped[reason] += 1;
    }

    /// Counts one reply of note if `happened`.
    pub(crate) fn note(&mut self, note: Note, happened: bool) {
        self.notes[note.index()] += u64::from(happened);
    }

    pub(crate) fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    pub(crate) fn add(&mut self, other: &Self) {
        self.received += other.received;
        self.batches += other.batches;
        self.answered += other.answered;
        self.send_errors += other.send_errors;
        self.kernel_drops += other.kernel_drops;
        self.shed += other.shed;
        for (a, b) in self.notes.iter_mut().zip(other.notes) {
            *a += b;
        }
        for (a, b) in self.dropped.iter_mut().zip(other.dropped) {
            *a += b;
        }
    }

    /// The counters as one log line, with a `dropped.<label>=n` for each non-zero reason.
    pub(crate) fn display<'a>(&'a self, labels: &'a [&'static str; N]) -> impl fmt::Display + 'a {
        Line {
            counters: self,
            labels,
            zeros: None,
        }
    }

    /// The counters as one line with every drop reason and every note of the service `of`,
    /// zeros too: the line at exit, which whoever reads it (an operator, a test) can take as
    /// complete.
    pub(crate) fn display_all<'a>(
        &'a self,
        labels: &'a [&'static str; N],
        of: Of,
    ) -> impl fmt::Display + 'a {
        Line {
            counters: self,
            labels,
            zeros: Some(of),
        }
    }
}

struct Line<'a, const N: usize> {
    counters: &'a Counters<N>,
    labels: &'a [&'static str; N],
    /// Whether drop reasons that are zero are written too, and the notes of which service.
    zeros: Option<Of>,
}

impl<const N: usize> fmt::Display for Line<'_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.counters;
        write!(
            f,
            "received={} batches={} answered={} dropped={} shed={} send_errors={} kernel_drops={}",
            c.received,
            c.batches,
            c.answered,
            c.dropped_total(),
            c.shed,
            c.send_errors,
            c.kernel_drops
        )?;
        let notes = self.zeros.map_or(0..0, Of::notes);
        for (i, (n, label)) in c.notes.iter().zip(NOTE_LABELS).enumerate() {
            if *n > 0 || notes.contains(&i) {
                write!(f, " {label}={n}")?;
            }
        }
        for (n, label) in c.dropped.iter().zip(self.labels) {
            if *n > 0 || self.zeros.is_some() {
                write!(f, " dropped.{label}={n}")?;
            }
        }
        Ok(())
    }
}

/// Totals over every worker of one service, for the exit log.
#[derive(Debug)]
pub(crate) struct Totals<const N: usize> {
    received: AtomicU64,
    batches: AtomicU64,
    answered: AtomicU64,
    send_errors: AtomicU64,
    kernel_drops: AtomicU64,
    shed: AtomicU64,
    notes: [AtomicU64; NOTES],
    dropped: [AtomicU64; N],
}

impl<const N: usize> Default for Totals<N> {
    fn default() -> Self {
        Self {
            received: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
            kernel_drops: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            notes: std::array::from_fn(|_| AtomicU64::new(0)),
            dropped: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl<const N: usize> Totals<N> {
    pub(crate) fn add(&self, c: &Counters<N>) {
        self.received.fetch_add(c.received, Relaxed);
        self.batches.fetch_add(c.batches, Relaxed);
        self.answered.fetch_add(c.answered, Relaxed);
        self.send_errors.fetch_add(c.send_errors, Relaxed);
        self.kernel_drops.fetch_add(c.kernel_drops, Relaxed);
        self.shed.fetch_add(c.shed, Relaxed);
        for (a, b) in self.notes.iter().zip(c.notes) {
            a.fetch_add(b, Relaxed);
        }
        for (a, b) in self.dropped.iter().zip(c.dropped) {
            a.fetch_add(b, Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> Counters<N> {
        Counters {
            received: self.received.load(Relaxed),
            batches: self.batches.load(Relaxed),
            answered: self.answered.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            kernel_drops: self.kernel_drops.load(Relaxed),
            shed: self.shed.load(Relaxed),
            notes: std::array::from_fn(|i| self.notes[i].load(Relaxed)),
            dropped: std::array::from_fn(|i| self.dropped[i].load(Relaxed)),
        }
    }
}

/// One worker's counts since it started, as the metrics endpoint reads them: written only by that
/// worker, after every batch.
#[derive(Debug)]
pub(crate) struct Published {
    pub(crate) service: &'static str,
    /// The address family of its socket: `ipv4` or `ipv6`.
    pub(crate) family: &'static str,
    /// Its index among the threads on that socket address.
    pub(crate) thread: usize,
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

/// A snapshot of a [`Published`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublishedCounts {
    pub(crate) received: u64,
    pub(crate) batches: u64,
    pub(crate) answered: u64,
    pub(crate) send_errors: u64,
    pub(crate) kernel_drops: u64,
    pub(crate) shed: u64,
    pub(crate) notes: [u64; NOTES],
    /// One per label, in the labels' order.
    pub(crate) dropped: Vec<u64>,
}

impl Published {
    fn store<const N: usize>(&self, c: &Counters<N>) {
        self.received.store(c.received, Relaxed);
        self.batches.store(c.batches, Relaxed);
        self.answered.store(c.answered, Relaxed);
        self.send_errors.store(c.send_errors, Relaxed);
        self.kernel_drops.store(c.kernel_drops, Relaxed);
        self.shed.store(c.shed, Relaxed);
        for (a, b) in self.notes.iter().zip(c.notes) {
            a.store(b, Relaxed);
        }
        for (a, b) in self.dropped.iter().zip(c.dropped) {
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

/// Every worker's [`Published`] counts, in the order the workers started.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    workers: Mutex<Vec<Arc<Published>>>,
}

impl Registry {
    /// A new worker's counts, registered (once, when the worker is made; never on the hot path).
    pub(crate) fn register(
        &self,
        service: &'static str,
        family: &'static str,
        thread: usize,
        labels: &'static [&'static str],
    ) -> Arc<Published> {
        let zero = || AtomicU64::new(0);
        let p = Arc::new(Published {
            service,
            family,
            thread,
            labels,
            received: zero(),
            batches: zero(),
            answered: zero(),
            send_errors: zero(),
            kernel_drops: zero(),
            shed: zero(),
            notes: std::array::from_fn(|_| zero()),
            dropped: labels.iter().map(|_| zero()).collect(),
        });
        self.workers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(p.clone());
        p
    }

    pub(crate) fn workers(&self) -> Vec<Arc<Published>> {
        self.workers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The bookkeeping every worker does around its batches: count, flush into the totals and log a
/// line at the stats interval and at exit, log send errors at most once per interval, and beat
/// the heartbeat the watchdog reads at every tick (every batch, and every idle wake-up).
#[derive(Debug)]
pub(crate) struct WorkerStats<const N: usize> {
    pub(crate) pending: Counters<N>,
    lifetime: Counters<N>,
    last_flush_unix: i64,
    send_error_logged: bool,
    service: &'static str,
    labels: &'static [&'static str; N],
    interval: Option<Duration>,
    totals: Arc<Totals<N>>,
    published: Option<Arc<Published>>,
    /// The socket's drop count when last read (the kernel's, cumulative, wrapping).
    kernel_drops_seen: u32,
    /// Advanced at every [`Self::tick`], for the watchdog; one no one watches until
    /// [`Self::with_heartbeat`].
    heartbeat: Beat,
}

impl<const N: usize> WorkerStats<N> {
    pub(crate) fn new(
        service: &'static str,
        labels: &'static [&'static str; N],
        interval: Option<Duration>,
        totals: Arc<Totals<N>>,
        published: Option<Arc<Published>>,
    ) -> Self {
        Self {
            pending: Counters::default(),
            lifetime: Counters::default(),
            last_flush_unix: crate::clock::read().unix_secs(),
            send_error_logged: false,
            service,
            labels,
            interval,
            totals,
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

    /// Publishes the counts so far for the metrics endpoint, if it is on.
    fn publish(&self) {
        if let Some(p) = &self.published {
            let mut now = self.lifetime;
            now.add(&self.pending);
            p.store(&now);
        }
    }

    /// One pass through the worker's loop, at `now_unix`: beats the heartbeat, publishes the
    /// counts, and flushes and logs them if the stats interval has passed and something was
    /// counted since the last line (an idle worker, which wakes now and then for the watchdog,
    /// logs nothing new).
    pub(crate) fn tick(&mut self, now_unix: i64) {
        self.heartbeat.beat();
        self.publish();
        let Some(interval) = self.interval else {
            return;
        };
        // The clock first: it is what a batch usually stops at, and costs less than comparing
        // every counter.
        if now_unix.saturating_sub(self.last_flush_unix) < interval.as_secs() as i64 {
            return;
        }
        if self.pending == Counters::default() {
            return;
        }
        self.send_error_logged = false;
        self.flush(now_unix);
        info!(
            "{} stats: {}",
            self.service,
            self.lifetime.display(self.labels)
        );
    }

    /// Takes the socket's cumulative drop count (see `BatchHandler::receive_drops`) into the
    /// counters as the drops since the last reading. A socket's count starts at zero when it is
    /// bound, before the worker starts.
    pub(crate) fn receive_drops(&mut self, total: u32) {
        let new = total.wrapping_sub(self.kernel_drops_seen);
        self.kernel_drops_seen = total;
        if new > 0 {
            self.pending.kernel_drops += u64::from(new);
            self.publish();
        }
    }

    /// Requests received and shed unanswered ([`chime_udp::BatchHandler::shed`]).
    pub(crate) fn shed(&mut self, count: usize) {
        self.pending.received += count as u64;
        self.pending.shed += count as u64;
    }

    /// Counts a send outcome; the first error of an interval is logged, the rest only counted.
    pub(crate) fn sent(&mut self, outcome: &chime_udp::SendOutcome) {
        self.pending.answered += outcome.sent as u64;
        self.pending.send_errors += outcome.errors as u64;
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

    /// Whose notes this worker's lines carry: `ntp`'s, or Roughtime's (every transport).
    fn of(&self) -> Of {
        if self.service == "ntp" {
            Of::Ntp
        } else {
            Of::Roughtime
        }
    }

    /// The last flush, when the worker stops.
    pub(crate) fn finish(&mut self) {
        self.flush(crate::clock::read().unix_secs());
        info!(
            "{} stats at exit: {}",
            self.service,
            self.lifetime.display_all(self.labels, self.of())
        );
    }

    fn flush(&mut self, now_unix: i64) {
        self.totals.add(&self.pending);
        self.lifetime.add(&self.pending);
        self.pending = Counters::default();
        self.last_flush_unix = now_unix;
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

    #[test]
    fn every_roughtime_version_has_its_own_note_and_label() {
        for v in Version::ALL {
            let i = Note::Roughtime(v).index();
            assert_eq!(NOTE_LABELS[i], format!("version.{}", v.label()));
        }
        assert_eq!(Note::Roughtime(Version::ALL[0]).index(), NTP_NOTES);
        assert_eq!(Note::NtsNak.index(), NTP_NOTES - 1);
    }

    #[test]
    fn the_log_line_names_the_versions_answered() {
        let mut c = Counters::<1> {
            answered: 3,
            ..Default::default()
        };
        c.note(Note::Roughtime(Version::Draft11), true);
        c.note(Note::Roughtime(Version::Draft11), true);
        c.note(Note::Roughtime(Version::Google), true);
        c.note(Note::Roughtime(Version::Rfc10049), false);
        let line = c.display(&["x"]).to_string();
        assert!(
            line.ends_with(" version.google=1 version.0x8000000b=2"),
            "{line}"
        );
        // At exit, every counter: a reader can tell a zero from a counter that is not kept.
        let ntp = c.display_all(&["x"], Of::Ntp).to_string();
        let roughtime = c.display_all(&["x"], Of::Roughtime).to_string();
        for (i, label) in NOTE_LABELS.iter().enumerate() {
            let (theirs, other) = if i < NTP_NOTES {
                (&ntp, &roughtime)
            } else {
                (&roughtime, &ntp)
            };
            assert!(theirs.contains(&format!(" {label}=")), "{label}: {theirs}");
            // Another service's notes only where they are not zero.
            let shown = other.contains(&format!(" {label}="));
            assert_eq!(shown, c.notes[i] > 0, "{label}: {other}");
        }
        assert!(ntp.ends_with(" dropped.x=0"), "{ntp}");
    }
}
