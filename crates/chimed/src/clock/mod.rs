//! The daemon's one window on the system clock. The protocol crates never read a clock; the
//! daemon reads CLOCK_REALTIME (through `SystemTime`, a vDSO call) and hands the time in.

pub(crate) mod published;
pub(crate) mod tz;
pub(crate) mod upstream;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chime_ntp::{NtpTimestamp, ServedClock};

/// One reading of the system clock, in the forms the workers need, so that a batch's NTP time,
/// Unix seconds (for eras and intervals) and Roughtime microseconds all agree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub(crate) since_epoch: Duration,
}

impl Reading {
    pub(crate) fn ntp(self) -> NtpTimestamp {
        NtpTimestamp::from_unix(self.unix_secs(), self.since_epoch.subsec_nanos())
    }

    pub(crate) fn unix_secs(self) -> i64 {
        self.since_epoch.as_secs() as i64
    }

    pub(crate) fn unix_micros(self) -> u64 {
        self.since_epoch.as_micros() as u64
    }

    /// The upstream's served time at this reading: the reading moved by the offset `clock`
    /// follows (for Roughtime, which takes its time in Unix form rather than as NTP's).
    pub(crate) fn served(self, clock: &ServedClock) -> Self {
        let offset = clock.offset_at(self.ntp());
        let by = Duration::try_from_secs_f64(offset.abs()).unwrap_or(Duration::MAX);
        let since_epoch = if offset >= 0.0 {
            self.since_epoch.saturating_add(by)
        } else {
            self.since_epoch.saturating_sub(by)
        };
        Self { since_epoch }
    }
}

/// The system clock now.
pub(crate) fn read() -> Reading {
    // A clock before 1970 would be a broken host; serve the epoch rather than panic.
    Reading {
        since_epoch: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    }
}

/// The system clock now, as an NTP timestamp.
pub(crate) fn now() -> NtpTimestamp {
    read().ntp()
}

/// TAI − UTC as the kernel has it (CLOCK_TAI less CLOCK_REALTIME, which chronyd sets from
/// `leapsectz`), or `None` while it is unset: the kernel's is 0 until something sets it, and
/// TAI has been at least 10 s ahead of UTC since 1972.
pub(crate) fn tai_offset() -> Option<u16> {
    let seconds = kernel_tai_offset();
    (10..=1000).contains(&seconds).then_some(seconds as u16)
}

/// CLOCK_TAI less CLOCK_REALTIME in whole seconds, as the kernel keeps it (the `tai` of
/// `adjtimex`), 0 while unset: what the program in the driver subtracts from CLOCK_TAI, the one
/// clock of the time of day it can read, to get chimed's. The two readings are nanoseconds
/// apart, and the kernel's offset is whole seconds, so rounding gives it exactly.
pub(crate) fn kernel_tai_offset() -> i64 {
    use nix::time::{ClockId, clock_gettime};
    let (Ok(utc), Ok(tai)) = (
        clock_gettime(ClockId::CLOCK_REALTIME),
        clock_gettime(ClockId::CLOCK_TAI),
    ) else {
        return 0;
    };
    let diff = (tai.tv_sec() - utc.tv_sec()) as f64 + (tai.tv_nsec() - utc.tv_nsec()) as f64 * 1e-9;
    diff.round() as i64
}

/// A kernel receive timestamp (CLOCK_REALTIME) as an NTP timestamp.
pub(crate) fn from_kernel(ts: chime_udp::Timestamp) -> NtpTimestamp {
    NtpTimestamp::from_unix(ts.secs, ts.nanos)
}
