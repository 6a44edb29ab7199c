//! Per-thread counters, for both services. A worker counts in plain integers it owns (no atomics
//! on the hot path) and publishes them at every tick (once per batch, and at idle wake-ups) into
//! a [`Published`] of its own: relaxed stores by its one writer, no read-modify-write. Its
//! service's [`Workers`] holds every worker's [`Published`], and is what both the totals the
//! daemon logs at exit and the metrics endpoint read: one set of counters, two readers. Each
//! service's drop reasons are an enum that carries its own labels ([`Reason`]); the counters are
//! indexed by it.

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
    /// Every note, in [`Note::index`] order: NTP's, then Roughtime's versions, then `Greased`.
    pub(crate) const ALL: [Self; NOTES] = {
        let ntp = [
            Self::Kod,
            Self::Interleaved,
            Self::KernelTxTimestamp,
            Self::Nts,
            Self::NtsNak,
        ];
        let mut all = [Self::Greased; NOTES];
        let mut i = 0;
        while i < NTP_NOTES {
            all[i] = ntp[i];
            i += 1;
        }
        while i < NOTES - 1 {
            all[i] = Self::Roughtime(Version::ALL[i - NTP_NOTES]);
            i += 1;
        }
        all
    };

    /// A dense index, for the counters' arrays.
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

    /// Its label in log lines.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Kod => "kod",
            Self::Interleaved => "interleaved",
            Self::KernelTxTimestamp => "kernel_tx_timestamps",
            Self::Nts => "nts",
            Self::NtsNak => "nts_nak",
            Self::Roughtime(v) => match v {
                Version::Google => "version.google",
                Version::Draft07 => "version.0x80000007",
                Version::Draft08 => "version.0x80000008",
                Version::Draft09 => "version.0x80000009",
                Version::Draft10 => "version.0x8000000a",
                Version::Draft11 => "version.0x8000000b",
                Version::Draft12 => "version.0x8000000c",
                Version::Rfc10049 => "version.1",
            },
            Self::Greased => "greased",
        }
    }
}

/// A service's reasons for dropping a request: an enum whose every value has a dense index and a
/// label, so that the counters are indexed by the reason itself and a label cannot drift from
/// its reason.
pub(crate) trait Reason: Copy + fmt::Debug + PartialEq + 'static {
    /// A count per reason, by [`Reason::index`]: `[u64; N]` for `N` reasons.
    type Counts: Copy + Default + PartialEq + fmt::Debug + AsRef<[u64]> + AsMut<[u64]>;
    /// Every reason's label, in [`Reason::index`] order.
    const LABELS: &'static [&'static str];
    /// Whose notes its service's lines at exit carry, zeros too.
    const NOTES: Of;
    /// A dense index below `LABELS.len()`: its label is `LABELS[index]`.
    fn index(self) -> usize;
}

/// What one worker has seen since it last flushed, its drops by the service's [`Reason`] `R`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Counters<R: Reason> {
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
    dropped: R::Counts,
}

impl<R: Reason> Default for Counters<R> {
    fn default() -> Self {
        Self {
            received: 0,
            batches: 0,
            answered: 0,
            send_errors: 0,
            kernel_drops: 0,
            shed: 0,
            notes: [0; NOTES],
            dropped: R::Counts::default(),
        }
    }
}

impl<R: Reason> Counters<R> {
    /// Counts one request dropped for `why`.
    pub(crate) fn drop(&mut self, why: R) {
        self.drop_n(why, 1);
    }

    /// Counts `n` requests dropped for `why`.
    pub(crate) fn drop_n(&mut self, why: R, n: u64) {
        self.dropped.as_mut()[why.index()] += n;
    }

    /// The requests dropped for `why`.
    #[cfg(test)]
    pub(crate) fn dropped(&self, why: R) -> u64 {
        self.dropped.as_ref()[why.index()]
    }

    /// Counts one reply of note if `happened`.
    pub(crate) fn note(&mut self, note: Note, happened: bool) {
        self.notes[note.index()] += u64::from(happened);
    }

    pub(crate) fn dropped_total(&self) -> u64 {
        self.dropped.as_ref().iter().sum()
    }

    /// Each reason's label and count, in [`Reason::index`] order.
    pub(crate) fn drops(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        R::LABELS
            .iter()
            .copied()
            .zip(self.dropped.as_ref().iter().copied())
    }

    /// Adds a worker's published counts, of the same service.
    fn add_published(&mut self, p: &PublishedCounts) {
        self.received += p.received;
        self.batches += p.batches;
        self.answered += p.answered;
        self.send_errors += p.send_errors;
        self.kernel_drops += p.kernel_drops;
        self.shed += p.shed;
        for (a, b) in self.notes.iter_mut().zip(p.notes) {
            *a += b;
        }
        for (a, b) in self.dropped.as_mut().iter_mut().zip(&p.dropped) {
            *a += b;
        }
    }

    /// The counters as one log line, with a `dropped.<label>=n` for each non-zero reason.
    pub(crate) fn display(&self) -> impl fmt::Display + '_ {
        Line {
            counters: self,
            zeros: None,
        }
    }

    /// The counters as one line with every drop reason and every note of the service, zeros
    /// too: the line at exit, which whoever reads it (an operator, a test) can take as complete.
    pub(crate) fn display_all(&self) -> impl fmt::Display + '_ {
        self.display_all_of(R::NOTES)
    }

    /// [`Self::display_all`] with the notes of `of`.
    fn display_all_of(&self, of: Of) -> impl fmt::Display + '_ {
        Line {
            counters: self,
            zeros: Some(of),
        }
    }
}

struct Line<'a, R: Reason> {
    counters: &'a Counters<R>,
    /// Whether drop reasons that are zero are written too, and the notes of which service.
    zeros: Option<Of>,
}

impl<R: Reason> fmt::Display for Line<'_, R> {
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
        for (n, note) in c.notes.iter().zip(Note::ALL) {
            if *n > 0 || notes.contains(&note.index()) {
                write!(f, " {}={n}", note.label())?;
            }
        }
        for (label, n) in c.drops() {
            if n > 0 || self.zeros.is_some() {
                write!(f, " dropped.{label}={n}")?;
            }
        }
        Ok(())
    }
}

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
        for (a, b) in self.dropped.iter().zip(c.dropped.as_ref()) {
            a.store(*b, Relaxed);
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

    /// A service with one drop reason.
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct X;

    impl Reason for X {
        type Counts = [u64; 1];
        const LABELS: &'static [&'static str] = &["x"];
        const NOTES: Of = Of::Ntp;
        fn index(self) -> usize {
            0
        }
    }

    #[test]
    fn every_note_has_its_index_and_every_roughtime_version_its_label() {
        for (i, note) in Note::ALL.into_iter().enumerate() {
            assert_eq!(note.index(), i, "{note:?}");
        }
        for v in Version::ALL {
            let label = Note::Roughtime(v).label();
            assert_eq!(label, format!("version.{}", v.label()));
        }
        assert_eq!(Note::Roughtime(Version::ALL[0]).index(), NTP_NOTES);
        assert_eq!(Note::NtsNak.index(), NTP_NOTES - 1);
    }

    #[test]
    fn the_log_line_names_the_versions_answered() {
        let mut c = Counters::<X> {
            answered: 3,
            ..Default::default()
        };
        c.note(Note::Roughtime(Version::Draft11), true);
        c.note(Note::Roughtime(Version::Draft11), true);
        c.note(Note::Roughtime(Version::Google), true);
        c.note(Note::Roughtime(Version::Rfc10049), false);
        let line = c.display().to_string();
        assert!(
            line.ends_with(" version.google=1 version.0x8000000b=2"),
            "{line}"
        );
        // At exit, every counter: a reader can tell a zero from a counter that is not kept.
        let ntp = c.display_all().to_string();
        let roughtime = c.display_all_of(Of::Roughtime).to_string();
        for note in Note::ALL {
            let (i, label) = (note.index(), note.label());
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
        c.drop(X);
        assert!(c.display().to_string().ends_with(" dropped.x=1"));
    }

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
