//! Timezone-offset mode: serving a zone's local wall-clock time as if it were UTC, for devices
//! that speak only NTP, cannot be given a timezone, and show whatever UTC they are told.
//!
//! This module is the whole of the mode's time arithmetic. It stays sans-IO: the zone's rules come
//! in as a function from a Unix instant to that instant's UTC offset (the daemon builds it from
//! the system tz database), and the time to shift comes in as an argument. Every timestamp a
//! reply carries (reference, receive, transmit) goes through [`ZoneShift::apply`] on its own, so a
//! DST transition changes served time by exactly the DST delta at exactly the transition instant.
//! The origin timestamp is the client's own value and is never shifted.

use std::fmt;

use crate::NtpTimestamp;

/// Shifts NTP timestamps by a zone's UTC offset at the instant each one names.
pub struct ZoneShift<F> {
    offset_at: F,
}

impl<F: Fn(i64) -> i32> ZoneShift<F> {
    /// `offset_at(unix_seconds)` is the zone's UTC offset in seconds at that instant (positive
    /// east of Greenwich). It is called with whole seconds: transitions fall on whole seconds,
    /// so the offset of an instant is the offset of the second it falls in.
    pub fn new(offset_at: F) -> Self {
        Self { offset_at }
    }

    /// The zone's local time at instant `utc`, labelled as UTC. `pivot_unix_secs` (any Unix time
    /// within 68 years, such as the current time) resolves the NTP era. A zero timestamp means
    /// "not set" on the wire and stays zero.
    pub fn apply(&self, utc: NtpTimestamp, pivot_unix_secs: i64) -> NtpTimestamp {
        if utc == NtpTimestamp::ZERO {
            return utc;
        }
        let (secs, _) = utc.to_unix_near(pivot_unix_secs);
        let offset = i64::from((self.offset_at)(secs));
        // Whole seconds live in the upper 32 bits; the fraction is untouched, so the shift is
        // exact to the last bit. Two's complement makes a negative offset a wrapping subtract.
        NtpTimestamp(utc.0.wrapping_add((offset as u64) << 32))
    }

    /// The offset, in seconds, at Unix second `unix_secs`.
    pub fn offset_at(&self, unix_secs: i64) -> i32 {
        (self.offset_at)(unix_secs)
    }
}

impl<F> fmt::Debug for ZoneShift<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZoneShift").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use jiff::tz::TimeZone;

    use super::*;

    fn zone(name: &str) -> ZoneShift<impl Fn(i64) -> i32> {
        let tz = TimeZone::get(name).unwrap();
        ZoneShift::new(move |s| tz.to_offset(Timestamp::from_second(s).unwrap()).seconds())
    }

    fn unix(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_second()
    }

    /// The served timestamp of the Unix instant (secs, nanos), as Unix (secs, nanos).
    fn served(z: &ZoneShift<impl Fn(i64) -> i32>, secs: i64, nanos: u32) -> (i64, u32) {
        let ts = NtpTimestamp::from_unix(secs, nanos);
        let out = z.apply(ts, secs);
        // The fraction is carried over bit for bit.
        assert_eq!(out.0 as u32, ts.0 as u32);
        out.to_unix_near(secs)
    }

    #[test]
    fn positive_half_hour_offset_kolkata() {
        let z = zone("Asia/Kolkata");
        let t = unix("2026-11-21T12:00:00Z");
        assert_eq!(served(&z, t, 123_456_789), (t + 19_800, 123_456_789));
        assert_eq!(served(&z, t, 999_999_999), (t + 19_800, 999_999_999));
    }

    #[test]
    fn negative_offset_new_york() {
        let z = zone("America/New_York");
        let winter = unix("2026-01-15T12:00:00Z");
        assert_eq!(served(&z, winter, 1), (winter - 5 * 3600, 1));
        let summer = unix("2026-07-15T12:00:00Z");
        assert_eq!(
            served(&z, summer, 500_000_000),
            (summer - 4 * 3600, 500_000_000)
        );
    }

    #[test]
    fn prague_spring_forward_at_the_exact_instant() {
        let z = zone("Europe/Prague");
        // CET (+1 h) to CEST (+2 h) at 01:00:00 UTC on the last Sunday of March.
        let t = unix("2026-03-29T01:00:00Z");
        assert_eq!(served(&z, t - 1, 999_999_999), (t - 1 + 3600, 999_999_999));
        assert_eq!(served(&z, t, 0), (t + 7200, 0));
        assert_eq!(served(&z, t, 1), (t + 7200, 1));
    }

    #[test]
    fn prague_fall_back_at_the_exact_instant() {
        let z = zone("Europe/Prague");
        // CEST (+2 h) to CET (+1 h) at 01:00:00 UTC on the last Sunday of October: served time
        // steps back by an hour, so clients see 02:59:59.999999999 then 02:00:00 local.
        let t = unix("2026-10-25T01:00:00Z");
        assert_eq!(served(&z, t - 1, 999_999_999), (t - 1 + 7200, 999_999_999));
        assert_eq!(served(&z, t, 0), (t + 3600, 0));
    }

    #[test]
    fn zero_stays_zero_and_eras_resolve() {
        let z = zone("Asia/Kolkata");
        assert_eq!(z.apply(NtpTimestamp::ZERO, 0), NtpTimestamp::ZERO);
        // Across the 2036 era boundary the shift wraps like the wire format does.
        let t = unix("2036-02-07T06:00:00Z");
        assert_eq!(served(&z, t, 7), (t + 19_800, 7));
    }
}
