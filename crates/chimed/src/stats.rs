//! Per-thread NTP counters. A worker counts in plain integers it owns (no atomics on the hot path)
//! and adds them into the shared totals at the stats interval and when it stops; the totals are
//! what the daemon logs at exit.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use chime_ntp::Drop;

/// What one worker has seen since it last flushed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) received: u64,
    pub(crate) answered: u64,
    pub(crate) send_errors: u64,
    pub(crate) dropped: [u64; Drop::COUNT],
}

impl Counters {
    pub(crate) fn drop(&mut self, why: Drop) {
        self.dropped[why.index()] += 1;
    }

    pub(crate) fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    pub(crate) fn add(&mut self, other: &Counters) {
        self.received += other.received;
        self.answered += other.answered;
        self.send_errors += other.send_errors;
        for (a, b) in self.dropped.iter_mut().zip(other.dropped) {
            *a += b;
        }
    }
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "received={} answered={} dropped={} send_errors={}",
            self.received,
            self.answered,
            self.dropped_total(),
            self.send_errors
        )?;
        for (n, reason) in self.dropped.iter().zip(Drop::ALL_REASONS) {
            if *n > 0 {
                write!(f, " dropped.{reason}={n}")?;
            }
        }
        Ok(())
    }
}

/// Totals over every worker of one service, for the exit log (and later a metrics endpoint).
#[derive(Debug, Default)]
pub(crate) struct Totals {
    received: AtomicU64,
    answered: AtomicU64,
    send_errors: AtomicU64,
    dropped: [AtomicU64; Drop::COUNT],
}

impl Totals {
    pub(crate) fn add(&self, c: &Counters) {
        self.received.fetch_add(c.received, Relaxed);
        self.answered.fetch_add(c.answered, Relaxed);
        self.send_errors.fetch_add(c.send_errors, Relaxed);
        for (a, b) in self.dropped.iter().zip(c.dropped) {
            a.fetch_add(b, Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> Counters {
        Counters {
            received: self.received.load(Relaxed),
            answered: self.answered.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            dropped: std::array::from_fn(|i| self.dropped[i].load(Relaxed)),
        }
    }
}
