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

/// What a server that smears needs to know of the latest leap second beyond its announcement:
/// whether the time it serves has taken the leap's step yet, since UTC labels the second before a
/// leap twice (or never), and the smear must tell the two passes apart.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LeapStep {
    /// The latest leap second announced, kept until a day after it (when a smear of it is over).
    pub leap: Option<Announced>,
    /// A poll has seen the served time take the leap's step: the upstream's (chronyd serving UTC
    /// while the kernel's clock runs on), or the kernel's clock's with it.
    pub stepped: bool,
    /// The system clock less a monotonic clock, seconds, at the last poll: against it, the time
    /// served between polls is seen to step with the kernel's clock.
    pub realtime_minus_monotonic: f64,
}

impl LeapStep {
    /// Nothing known: no leap second.
    pub const NONE: Self = Self {
        leap: None,
        stepped: false,
        realtime_minus_monotonic: 0.0,
    };

    /// Takes a poll's announcement (of the upstream's time `served`): a new leap replaces the
    /// latest, not stepped yet; the latest is forgotten a day after it, its smear over.
    pub fn note(&mut self, announced: Option<Announced>, served: NtpTimestamp) {
        if announced.is_some() && self.leap != announced {
            self.leap = announced;
            self.stepped = false;
        }
        if let Some(latest) = self.leap
            && served.wrapping_diff_seconds(latest.at) > Smear::HALF + 2.0
        {
            self.leap = None;
            self.stepped = false;
        }
    }

    /// Whether the kernel's clock has taken the latest leap's step since the last poll, judged
    /// from the system clock less the monotonic clock now.
    pub fn kernel_step_since_poll(&self, realtime_minus_monotonic: f64) -> bool {
        let moved = realtime_minus_monotonic - self.realtime_minus_monotonic;
        self.leap
            .is_some_and(|leap| (moved - leap.step()).abs() < 0.5)
    }
}

/// The usual 24-hour linear smear of a leap second, noon to noon UTC: the second inserted (or
/// deleted) is spread over the day around the leap, so that time served never repeats or skips
/// a second, each second in those 24 hours being 1/86 400 longer (or shorter) than an SI second.
/// Smeared time is not UTC: the NTP pool forbids it, and clients that mix smeared and unsmeared
/// servers see them a second apart at the leap.
///
/// Times are in seconds from the leap's end `M` (the announced `at`). The smear is a function of
/// continuous time ([`Smear::at_elapsed`]), which counts every SI second and agrees with UTC
/// before the leap; UTC served across the leap repeats (or skips) a second, so the UTC form
/// ([`Smear::of_utc`]) needs to know whether the time given has taken the leap's step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Smear {
    /// The leap smeared.
    pub announced: Announced,
}

impl Smear {
    /// Half the smear: noon before the leap to its end, and its end to noon after.
    pub const HALF: f64 = 43_200.0;

    /// The continuous time the smear begins at, and the one it ends at, from `M`.
    pub fn window(&self) -> (f64, f64) {
        (-Self::HALF, Self::HALF - self.announced.step())
    }

    /// Smeared time minus continuous time at `elapsed` seconds of continuous time from `M`: 0
    /// before the smear, the leap's step (−1 s for an inserted second, +1 s deleted) after it,
    /// and a straight line between.
    pub fn offset(&self, elapsed: f64) -> f64 {
        let (start, end) = self.window();
        let done = ((elapsed - start) / (end - start)).clamp(0.0, 1.0);
        self.announced.step() * done
    }

    /// The smeared time at `elapsed` seconds of continuous time from `M`, from `M`.
    pub fn at_elapsed(&self, elapsed: f64) -> f64 {
        elapsed + self.offset(elapsed)
    }

    /// [`Self::of_utc`] for a timestamp: the served UTC time `utc`, smeared.
    pub fn serve(&self, utc: NtpTimestamp, stepped: bool) -> NtpTimestamp {
        let from = utc.wrapping_diff_seconds(self.announced.at);
        let smeared = self.of_utc(from, stepped);
        NtpTimestamp(
            self.announced
                .at
                .0
                .wrapping_add((smeared * 4_294_967_296.0).round() as i64 as u64),
        )
    }

    /// The smeared time for the UTC time `utc` (seconds from `M`, as a clock that repeats or
    /// skips the leap second labels it), which has (`stepped`) or has not yet taken the leap's
    /// step: the same instant, smeared.
    pub fn of_utc(&self, utc: f64, stepped: bool) -> f64 {
        let elapsed = if stepped {
            utc - self.announced.step()
        } else {
            utc
        };
        self.at_elapsed(elapsed)
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

    fn smears() -> [Smear; 2] {
        let at = at("2016-12-31T12:00:00Z");
        [Leap::AddSecond, Leap::DelSecond].map(|leap| Smear {
            announced: Announced::of(leap, at).unwrap(),
        })
    }

    #[test]
    fn the_smear_runs_noon_to_noon_and_takes_up_exactly_the_leap() {
        let [insert, delete] = smears();
        // Noon before: nothing yet; the leap's end: half; noon after (in UTC): all of it.
        assert_eq!(insert.of_utc(-43_200.0, false), -43_200.0);
        assert!((insert.at_elapsed(0.0) + 43_200.0 / 86_401.0).abs() < 1e-12);
        assert_eq!(insert.of_utc(43_200.0, true), 43_200.0);
        assert_eq!(insert.of_utc(50_000.0, true), 50_000.0);
        assert_eq!(delete.of_utc(-43_200.0, false), -43_200.0);
        assert_eq!(delete.of_utc(43_200.0, true), 43_200.0);
        assert_eq!(delete.of_utc(50_000.0, true), 50_000.0);
        // Continuous at its edges and at the leap itself, where UTC steps.
        for smear in [insert, delete] {
            let (start, end) = smear.window();
            for x in [start, 0.0, -1.0, end] {
                let h = 1e-6;
                let jump = smear.at_elapsed(x + h) - smear.at_elapsed(x - h);
                assert!(
                    (jump - 2.0 * h).abs() < 1e-9,
                    "{smear:?} jumps {jump} at {x}"
                );
            }
        }
        // The repeated second's two passes are a second apart once smeared, less 1/86 401.
        let twice = insert.of_utc(-0.5, true) - insert.of_utc(-0.5, false);
        assert!((twice - (1.0 - 1.0 / 86_401.0)).abs() < 1e-9, "{twice}");
    }

    proptest::proptest! {
        /// Continuous, monotonic and no faster or slower than 1/86 399 from the SI second,
        /// anywhere from a day before the leap to a day after, both kinds.
        #[test]
        fn the_smear_is_monotonic_with_a_bounded_rate(
            a in -2.0 * Smear::HALF..2.0 * Smear::HALF,
            gap in 1e-6f64..1e4,
            which in 0usize..2,
        ) {
            let smear = smears()[which];
            let (s1, s2) = (smear.at_elapsed(a), smear.at_elapsed(a + gap));
            let rate = (s2 - s1) / gap;
            proptest::prop_assert!(s2 > s1, "not monotonic at {a} + {gap}");
            proptest::prop_assert!(
                (rate - 1.0).abs() <= 1.0 / 86_399.0 + 1e-6,
                "rate {rate} at {a} + {gap}"
            );
        }

        /// Exactly the leap in all: the smeared time is UTC before the smear and after it, and
        /// never more than the leap second from it between.
        #[test]
        fn the_smear_takes_up_exactly_one_second(
            elapsed in -3.0 * Smear::HALF..3.0 * Smear::HALF,
            which in 0usize..2,
        ) {
            let smear = smears()[which];
            let step = smear.announced.step();
            let (start, end) = smear.window();
            let smeared = smear.at_elapsed(elapsed);
            if elapsed <= start {
                proptest::prop_assert_eq!(smeared, elapsed);
            } else if elapsed >= end {
                // UTC after the leap: continuous time moved by the step.
                proptest::prop_assert!((smeared - (elapsed + step)).abs() < 1e-9);
            } else {
                let off = smeared - elapsed;
                proptest::prop_assert!(off * step >= 0.0 && off.abs() <= 1.0, "{off}");
            }
        }
    }
}
