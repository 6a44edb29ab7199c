//! Leap seconds as a server beside chronyd sees them: when an announced one takes effect, and the
//! window after it in which the upstream's served time is not known from what came before.
//!
//! An upstream announces a leap second with the leap indicator. chronyd sets it on the last day
//! of the month only (RFC 5905 reads it as "the last minute of this day", the NTPv5 draft as "the
//! end of this month", and on that day the two agree), so a warning is taken as announcing a leap
//! at the end of the UTC month the upstream's time is in, and only on that month's last day:
//! earlier, it is not passed on (chronyd would not send it yet either); after the month's end, it
//! is a leap already done.
//!
//! At the month's end `M`, an inserted second repeats the second before it, a deleted one skips
//! the second before it. What the upstream serves across the leap depends on how it handles it:
//! chronyd's `leapsecmode system` and `slew` serve UTC, whose second before `M` comes twice (in
//! `system` the kernel's clock steps back with it, in `slew` it does not and is slewed a second
//! afterwards), and `smoothtime … leaponly` serves time that runs on through `M` and is smoothed
//! a second over the hours after. So from the start of the leap ([`Announced::uncertain_from`])
//! until a poll after it, the offset followed may be a second out: replies in that window carry
//! a second more root dispersion, and the poller polls just after it starts.

use crate::packet::Leap;
use crate::time::NtpTimestamp;

/// Any Unix time of NTP era 0 (1900 to 2036), to resolve the era of the upstream's time. Leap
/// seconds end by 2035 (CGPM 2022, resolution 4), so every leap second there will be is in era 0.
const ERA_0_PIVOT_UNIX: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

/// A leap second announced by the upstream, pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Announced {
    /// Inserted ([`Leap::AddSecond`]) or deleted ([`Leap::DelSecond`]).
    pub leap: Leap,
    /// The end of the month, in served time: when the leap is over. Unix-like UTC, so the second
    /// inserted or deleted is the one before it.
    pub at: NtpTimestamp,
}

impl Announced {
    /// The leap the upstream's warning `leap`, sent with its time `served`, announces: `None` if
    /// `leap` announces none, or `served` is not on the last day of a UTC month, or is past the
    /// leap. A deleted second is past from the second it deletes on: a time in it says that the
    /// upstream's served time did not skip it (`leapsecmode ignore`, or smoothing).
    pub fn of(leap: Leap, served: NtpTimestamp) -> Option<Self> {
        if !matches!(leap, Leap::AddSecond | Leap::DelSecond) {
            return None;
        }
        let (unix, _) = served.to_unix_near(ERA_0_PIVOT_UNIX);
        let day = jiff::Timestamp::from_second(unix)
            .ok()?
            .to_zoned(jiff::tz::TimeZone::UTC)
            .date();
        if day != day.last_of_month() {
            return None;
        }
        let end = day
            .tomorrow()
            .ok()?
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()?
            .timestamp()
            .as_second();
        if leap == Leap::DelSecond && unix >= end - 1 {
            return None;
        }
        Some(Self {
            leap,
            at: NtpTimestamp::from_unix(end, 0),
        })
    }

    /// The served time from which what the upstream serves may have stepped by a second: the end
    /// of the month for an inserted second (the second before it comes again), a second before
    /// it for a deleted one (that second is skipped).
    pub fn uncertain_from(&self) -> NtpTimestamp {
        match self.leap {
            Leap::DelSecond => NtpTimestamp(self.at.0.wrapping_sub(1 << 32)),
            _ => self.at,
        }
    }

    /// The step in served time the leap makes, seconds: −1 for an inserted second, +1 deleted.
    pub fn step(&self) -> f64 {
        match self.leap {
            Leap::DelSecond => 1.0,
            _ => -1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> NtpTimestamp {
        let ts: jiff::Timestamp = s.parse().unwrap();
        NtpTimestamp::from_unix(ts.as_second(), ts.subsec_nanosecond() as u32)
    }

    #[test]
    fn a_warning_on_the_last_day_of_a_month_announces_its_end() {
        for (served, end) in [
            ("2016-12-31T00:00:00Z", "2017-01-01T00:00:00Z"),
            ("2016-12-31T23:59:58.999Z", "2017-01-01T00:00:00Z"),
            ("2015-06-30T12:00:00Z", "2015-07-01T00:00:00Z"),
            ("2028-02-29T08:00:00Z", "2028-03-01T00:00:00Z"),
            ("2026-11-30T23:00:00Z", "2026-12-01T00:00:00Z"),
        ] {
            let announced = Announced::of(Leap::AddSecond, at(served)).unwrap();
            assert_eq!(announced.at, at(end), "{served}");
            assert_eq!(announced.uncertain_from(), at(end));
            let deleted = Announced::of(Leap::DelSecond, at(served)).unwrap();
            assert_eq!(deleted.at, at(end));
            assert_eq!(
                deleted.uncertain_from().wrapping_diff_seconds(at(end)),
                -1.0
            );
        }
    }

    #[test]
    fn no_leap_before_the_last_day_after_the_month_or_without_a_warning() {
        for served in [
            "2016-12-30T23:59:59Z",
            "2017-01-01T00:00:00Z",
            "2028-02-28T12:00:00Z",
            "2015-06-15T00:00:00Z",
        ] {
            assert_eq!(Announced::of(Leap::AddSecond, at(served)), None, "{served}");
        }
        // A deleted second is over from the second it deletes, an inserted one only at the end.
        let last_second = at("2016-12-31T23:59:59.5Z");
        assert_eq!(Announced::of(Leap::DelSecond, last_second), None);
        assert!(Announced::of(Leap::AddSecond, last_second).is_some());
        for leap in [Leap::NoWarning, Leap::Unsynchronised] {
            assert_eq!(Announced::of(leap, at("2016-12-31T12:00:00Z")), None);
        }
    }

    #[test]
    fn the_step_is_back_for_an_insert_and_forward_for_a_delete() {
        let served = at("2016-12-31T12:00:00Z");
        assert_eq!(Announced::of(Leap::AddSecond, served).unwrap().step(), -1.0);
        assert_eq!(Announced::of(Leap::DelSecond, served).unwrap().step(), 1.0);
    }
}
