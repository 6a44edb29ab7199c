//! What a worker counts, as plain integers it owns: requests received, answered, shed and
//! dropped by reason, and replies of note. Each service's drop reasons are an enum that carries
//! its own labels ([`Reason`]), and the counters are indexed by it; the log line is written from
//! the same labels.

use std::fmt;

use chime_ntp::nts::NakReason;
use chime_roughtime::Version;

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
    /// An NTPv5 reply.
    V5,
    /// A v4 reply echoing the upgrade mark: its client may now speak v5.
    Upgrade,
    /// An NTPv5 reply in TAI, as its request asked.
    Tai,
    /// An NTS NAK, by why it was sent (also in `NtsNak`).
    NtsNakWhy(NakReason),
    /// A Roughtime reply in this version: an operator sees which versions clients still speak
    /// before dropping one.
    Roughtime(Version),
    /// A Roughtime reply made deliberately invalid (`--roughtime-grease`); also counted in its
    /// version.
    Greased,
    /// A Roughtime reply of the experimental ML-DSA-44 suite (version 0x90000001, over TCP),
    /// which is no [`Version`] of the protocol crate's.
    #[cfg(feature = "mldsa")]
    Mldsa44,
}

/// The NTP notes, which come first.
pub(crate) const NTP_NOTES: usize = 8 + NakReason::ALL.len();
pub(crate) const NOTES: usize = NTP_NOTES + Version::COUNT + 1 + cfg!(feature = "mldsa") as usize;

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
            Self::V5,
            Self::Upgrade,
            Self::Tai,
            Self::NtsNakWhy(NakReason::ALL[0]),
            Self::NtsNakWhy(NakReason::ALL[1]),
            Self::NtsNakWhy(NakReason::ALL[2]),
            Self::NtsNakWhy(NakReason::ALL[3]),
        ];
        let mut all = [Self::Greased; NOTES];
        let mut i = 0;
        while i < NTP_NOTES {
            all[i] = ntp[i];
            i += 1;
        }
        while i < NTP_NOTES + Version::COUNT {
            all[i] = Self::Roughtime(Version::ALL[i - NTP_NOTES]);
            i += 1;
        }
        #[cfg(feature = "mldsa")]
        {
            all[NOTES - 1] = Self::Mldsa44;
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
            Self::V5 => 5,
            Self::Upgrade => 6,
            Self::Tai => 7,
            Self::NtsNakWhy(why) => 8 + why.index(),
            Self::Roughtime(v) => NTP_NOTES + v.index(),
            Self::Greased => NTP_NOTES + Version::COUNT,
            #[cfg(feature = "mldsa")]
            Self::Mldsa44 => NTP_NOTES + Version::COUNT + 1,
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
            Self::V5 => "ntpv5",
            Self::Upgrade => "ntpv5_upgrade",
            Self::Tai => "ntpv5_tai",
            Self::NtsNakWhy(why) => match why {
                NakReason::UnknownKey => "nts_nak.unknown_key",
                NakReason::BadCookie => "nts_nak.bad_cookie",
                NakReason::OtherProtocol => "nts_nak.other_protocol",
                NakReason::Forged => "nts_nak.forged",
            },
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
            #[cfg(feature = "mldsa")]
            Self::Mldsa44 => "version.0x90000001",
        }
    }
}

/// Every label of a service's drop reasons, by slot, for a `const` in the reason's `impl`: the
/// protocol's reasons' labels first (`$label` for slot `$i`, below `$count`), then each of the
/// daemon's own (`Self::OWN`, each beside its label) at its `slot()`.
macro_rules! drop_labels {
    ($count:expr, |$i:ident| $label:expr) => {{
        let mut labels = [""; Self::COUNT];
        let mut $i = 0;
        while $i < $count {
            labels[$i] = $label;
            $i += 1;
        }
        let mut j = 0;
        while j < Self::OWN.len() {
            labels[Self::OWN[j].0.slot()] = Self::OWN[j].1;
            j += 1;
        }
        labels
    }};
}
pub(crate) use drop_labels;

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
    pub(crate) fn add_published(&mut self, p: &PublishedCounts) {
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

    /// The counters as the control socket's `status` gives them: the totals, `dropped` by reason
    /// and the service's notes, zeros too, under the labels the log line uses.
    pub(crate) fn as_json(&self) -> serde_json::Value {
        let notes: serde_json::Map<_, _> = Note::ALL[R::NOTES.notes()]
            .iter()
            .map(|note| (note.label().to_owned(), self.notes[note.index()].into()))
            .collect();
        let dropped: serde_json::Map<_, _> = self
            .drops()
            .map(|(label, n)| (label.to_owned(), n.into()))
            .collect();
        serde_json::json!({
            "received": self.received,
            "batches": self.batches,
            "answered": self.answered,
            "dropped": self.dropped_total(),
            "dropped_by_reason": dropped,
            "shed": self.shed,
            "send_errors": self.send_errors,
            "kernel_drops": self.kernel_drops,
            "replies": notes,
        })
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

/// A snapshot of one worker's published counts (`stats::Published`), its drops in its service's
/// [`Reason::index`] order.
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A service with one drop reason.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub(crate) struct X;

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
        assert_eq!(Note::NtsNakWhy(NakReason::Forged).index(), NTP_NOTES - 1);
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
}
