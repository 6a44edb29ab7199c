//! The daemon's one window on the system clock. The protocol crates never read a clock; the
//! daemon reads CLOCK_REALTIME (through `SystemTime`, a vDSO call) and hands the time in.

use std::time::{SystemTime, UNIX_EPOCH};

use chime_ntp::NtpTimestamp;

/// The system clock now, as an NTP timestamp.
pub(crate) fn now() -> NtpTimestamp {
    // A clock before 1970 would be a broken host; serve the epoch rather than panic.
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    NtpTimestamp::from_unix(d.as_secs() as i64, d.subsec_nanos())
}

/// The system clock now, as an NTP timestamp and as Unix seconds from the same reading (the Unix
/// seconds resolve NTP eras, e.g. for the timezone-offset mode).
pub(crate) fn now_with_unix() -> (NtpTimestamp, i64) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    (NtpTimestamp::from_unix(secs, d.subsec_nanos()), secs)
}

/// A kernel receive timestamp (CLOCK_REALTIME) as an NTP timestamp.
pub(crate) fn from_kernel(ts: chime_udp::Timestamp) -> NtpTimestamp {
    NtpTimestamp::from_unix(ts.secs, ts.nanos)
}
