//! What the server says about its own clock, and how that ages.
//!
//! The control plane keeps a [`ServerState`] (filled by the [`Mirror`](crate::Mirror) from the
//! upstream chronyd) and, once per batch, each worker turns it into a [`ServedHeader`] with
//! [`ServerState::served_at`]: the mirrored values with the root dispersion grown by the time since
//! the last good poll, or the unsynchronised values once that time passes the [`StalePolicy`].

use std::time::Duration;

use crate::follow::ServedClock;
use crate::leap::{Announced, LeapStep, Smear};
use crate::packet::Leap;
use crate::time::{NtpShort, NtpTimestamp};

/// The root delay and root dispersion of an unsynchronised server: one second each, the values
/// chronyd 4.3 sends (`REF_GetReferenceParams`). Clients ignore them once they see leap 3.
pub(crate) const UNSYNCHRONISED_ROOT: NtpShort = NtpShort(0x0001_0000);

/// The precision a [`ServerState::unsynchronised`] state claims before the upstream has told us its
/// own: 2^-20 s, about a microsecond, a conservative bound for reading a Linux clock with
/// `clock_gettime` or a kernel timestamp. The mirror replaces it with the upstream's value.
pub(crate) const DEFAULT_PRECISION: i8 = -20;

/// The upstream's view of the clock, as last mirrored, and when that was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServerState {
    /// Leap indicator; [`Leap::Unsynchronised`] when the upstream is.
    pub leap: Leap,
    /// Stratum as the upstream reported it (copied, not incremented: chimed serves the upstream's
    /// clock, it is not another hop). 0 when unsynchronised.
    pub stratum: u8,
    /// Precision of the clock, log2 seconds (the upstream's, which reads the same system clock).
    pub precision: i8,
    /// Reference ID; zero when unsynchronised.
    pub reference_id: [u8; 4],
    /// When the upstream's clock was last set or corrected; zero when unsynchronised.
    pub reference_ts: NtpTimestamp,
    /// Round-trip delay to the primary reference.
    pub root_delay: NtpShort,
    /// Error bound relative to the primary reference, as of `updated`.
    pub root_dispersion: NtpShort,
    /// Local time of the last good upstream reply; `None` if there never was one.
    pub updated: Option<NtpTimestamp>,
    /// The upstream's served time as a function of the local clock, followed from poll to poll:
    /// what every timestamp served is mapped through, and whose error bound the root dispersion
    /// carries.
    pub clock: ServedClock,
    /// The leap second `leap` announces, while it is pending: `None` when there is none, and
    /// once a poll has seen it done.
    pub announced: Option<Announced>,
    /// TAI − UTC, seconds, as the kernel has it (chronyd sets it from `leapsectz`); `None` when
    /// it is not known.
    pub tai_offset: Option<u16>,
    /// The latest leap second and whether the served time has taken its step, for a smear.
    pub leap_step: LeapStep,
}

impl ServerState {
    /// The state before any upstream reply: unsynchronised, never updated.
    pub const fn unsynchronised() -> Self {
        Self {
            leap: Leap::Unsynchronised,
            stratum: 0,
            precision: DEFAULT_PRECISION,
            reference_id: [0; 4],
            reference_ts: NtpTimestamp::ZERO,
            root_delay: UNSYNCHRONISED_ROOT,
            root_dispersion: UNSYNCHRONISED_ROOT,
            updated: None,
            clock: ServedClock::LOCAL,
            announced: None,
            tai_offset: None,
            leap_step: LeapStep::NONE,
        }
    }

    /// Whether the state itself claims synchronisation: a leap indicator other than 3 and a
    /// stratum from 1 to 15. Staleness is [`Self::served_at`]'s concern.
    pub const fn is_synchronised(&self) -> bool {
        !matches!(self.leap, Leap::Unsynchronised) && matches!(self.stratum, 1..=15)
    }

    /// What a reply sent at local time `now` says about the server's clock.
    ///
    /// Unsynchronised ([`ServedHeader::unsynchronised`]) if the state never was updated, is
    /// itself unsynchronised, or is older than `policy.stale_after`. Otherwise the mirrored values,
    /// with the root dispersion grown by `policy.dispersion_rate` per second of age, because the
    /// clock has been running free of any correction we know of since, and by the bound on the
    /// error of the followed offset at `now` ([`ServedClock::error_at`]): saturating, rounded up.
    ///
    /// The age is taken as an absolute value, as chronyd does for its own dispersion: if the clock
    /// was stepped back past the stale time, the state counts as stale until the next good poll
    /// rather than as fresh for as long as the step was.
    ///
    /// From the start of an announced leap ([`Announced::uncertain_from`], in served time) until
    /// a poll after it, the leap is over as far as the reply says (no warning) and the root
    /// dispersion is a second more: the upstream may have stepped its served time by the leap
    /// second, or not (see the leap module).
    pub fn served_at(&self, now: NtpTimestamp, policy: &StalePolicy) -> ServedHeader {
        let unsynchronised = ServedHeader::unsynchronised(self.precision);
        let Some(updated) = self.updated else {
            return unsynchronised;
        };
        if !self.is_synchronised() {
            return unsynchronised;
        }
        let age = now.wrapping_diff_seconds(updated).abs();
        if age > policy.stale_after.as_secs_f64() {
            return unsynchronised;
        }
        let mut leap = self.leap;
        let mut growth = policy.dispersion_rate * age + self.clock.error_at(now);
        if let Some(announced) = self.announced
            && self.in_leap(now, &announced)
        {
            leap = Leap::NoWarning;
            growth += 1.0;
        }
        let root_dispersion = if growth > 0.0 {
            NtpShort::from_seconds(self.root_dispersion.seconds() + growth)
        } else {
            self.root_dispersion
        };
        ServedHeader {
            leap,
            stratum: self.stratum,
            precision: self.precision,
            reference_id: self.reference_id,
            reference_ts: self.reference_ts,
            root_delay: self.root_delay,
            root_dispersion,
        }
    }

    /// TAI − UTC for a reply sent at local time `now`: the kernel's, unless a leap second is
    /// pending and its last second before has begun (the offset steps at the leap, and UTC
    /// repeats or skips a second, so which side of it a time is on is not known until a poll
    /// after it).
    pub fn tai_offset_at(&self, now: NtpTimestamp) -> Option<u16> {
        let tai = self.tai_offset?;
        let Some(announced) = self.announced else {
            return Some(tai);
        };
        let to_leap = announced.at.wrapping_diff_seconds(self.clock.serve(now));
        (to_leap > 1.0).then_some(tai)
    }

    /// The smear of the latest leap second a reply sent at local time `now` is in (from noon
    /// before it to noon after, with a second's margin each side), with whether the time served
    /// then has taken the leap's step: a poll saw it, or, within two seconds of the leap, the
    /// kernel's clock has stepped by it since the last poll (`realtime_minus_monotonic` reads the
    /// system clock less the monotonic clock now; it is called only there).
    pub fn smear_at(
        &self,
        now: NtpTimestamp,
        realtime_minus_monotonic: impl FnOnce() -> f64,
    ) -> Option<(Smear, bool)> {
        let leap = self.leap_step.leap?;
        let smear = Smear { announced: leap };
        let from_leap = self.clock.serve(now).wrapping_diff_seconds(leap.at);
        let (start, end) = smear.window();
        if !(start - 1.0..=end + 1.0).contains(&from_leap) {
            return None;
        }
        let stepped = self.leap_step.stepped
            || (from_leap.abs() < 2.0
                && self
                    .leap_step
                    .kernel_step_since_poll(realtime_minus_monotonic()));
        Some((smear, stepped))
    }

    /// Whether the served time at local `now` is past the start of `announced`.
    fn in_leap(&self, now: NtpTimestamp, announced: &Announced) -> bool {
        self.clock
            .serve(now)
            .wrapping_diff_seconds(announced.uncertain_from())
            >= 0.0
    }
}

impl Default for ServerState {
    fn default() -> Self {
        Self::unsynchronised()
    }
}

/// How long a mirrored state may be served, and how fast its error bound grows meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct StalePolicy {
    /// After this long without a good upstream reply, replies say "unsynchronised" (leap 3,
    /// stratum 0). Default [`Self::DEFAULT_STALE_AFTER`].
    pub stale_after: Duration,
    /// Seconds of root dispersion added per second since the last good reply. Default
    /// [`Self::PHI`].
    pub dispersion_rate: f64,
}

impl StalePolicy {
    /// The default stale time: 8 s.
    ///
    /// chimed polls chronyd about once a second, so this is eight polls in a row lost or late.
    /// Shorter, and a chronyd busy for a moment (a restart, a burst of load on a shared core) would
    /// flip every client to "unsynchronised" and back, which NTP pool monitors and clients punish
    /// more than they should. Longer, and a dead or wedged chronyd goes unnoticed longer while the
    /// clock runs undisciplined. The root dispersion grows meanwhile, so the error bound stays
    /// honest until the cut-off: at [`Self::PHI`] it is 120 µs by 8 s, small against the
    /// milliseconds of network path a client sees. When chronyd itself loses synchronisation it
    /// says so in its next reply, within a poll; the stale time only covers silence.
    pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(8);

    /// RFC 5905's PHI, the frequency tolerance assumed for an undisciplined clock: 15 ppm.
    pub const PHI: f64 = 15e-6;
}

impl Default for StalePolicy {
    fn default() -> Self {
        Self {
            stale_after: Self::DEFAULT_STALE_AFTER,
            dispersion_rate: Self::PHI,
        }
    }
}

/// The server-clock fields of a reply, computed once per batch by [`ServerState::served_at`] and
/// copied into every reply by [`respond`](crate::respond).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServedHeader {
    /// Leap indicator.
    pub leap: Leap,
    /// Stratum.
    pub stratum: u8,
    /// Precision, log2 seconds.
    pub precision: i8,
    /// Reference ID.
    pub reference_id: [u8; 4],
    /// Reference timestamp.
    pub reference_ts: NtpTimestamp,
    /// Root delay.
    pub root_delay: NtpShort,
    /// Root dispersion, grown to the time of the batch.
    pub root_dispersion: NtpShort,
}

impl ServedHeader {
    /// What chronyd 4.3 sends when it is not synchronised: leap 3, stratum 0, reference ID and
    /// timestamp zero, root delay and dispersion 1 s; the precision is still the clock's.
    pub const fn unsynchronised(precision: i8) -> Self {
        Self {
            leap: Leap::Unsynchronised,
            stratum: 0,
            precision,
            reference_id: [0; 4],
            reference_ts: NtpTimestamp::ZERO,
            root_delay: UNSYNCHRONISED_ROOT,
            root_dispersion: UNSYNCHRONISED_ROOT,
        }
    }

    /// Whether replies with this header tell clients they may use the time.
    pub const fn is_synchronised(&self) -> bool {
        !matches!(self.leap, Leap::Unsynchronised) && matches!(self.stratum, 1..=15)
    }

    /// The root distance, root delay / 2 + root dispersion, in seconds: the bound on the served
    /// clock's error that RFC 5905 clients use (and a Roughtime radius can be derived from).
    pub fn root_distance(&self) -> f64 {
        self.root_delay.seconds() / 2.0 + self.root_dispersion.seconds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: NtpTimestamp = NtpTimestamp::from_parts(0xEEAC_6C47, 0);

    fn synced() -> ServerState {
        ServerState {
            leap: Leap::NoWarning,
            stratum: 2,
            precision: -25,
            reference_id: [192, 0, 2, 1],
            reference_ts: NtpTimestamp::from_parts(0xEEAC_6C00, 0x1234_5678),
            root_delay: NtpShort(0x0000_0800),
            root_dispersion: NtpShort(0x0000_0400),
            updated: Some(T0),
            clock: ServedClock::LOCAL,
            announced: None,
            tai_offset: None,
            leap_step: LeapStep::NONE,
        }
    }

    fn at(seconds: f64) -> NtpTimestamp {
        if seconds >= 0.0 {
            T0.add_duration(Duration::from_secs_f64(seconds))
        } else {
            T0.sub_duration(Duration::from_secs_f64(-seconds))
        }
    }

    #[test]
    fn fresh_state_is_served_as_mirrored() {
        let served = synced().served_at(T0, &StalePolicy::default());
        assert_eq!(
            served,
            ServedHeader {
                leap: Leap::NoWarning,
                stratum: 2,
                precision: -25,
                reference_id: [192, 0, 2, 1],
                reference_ts: NtpTimestamp::from_parts(0xEEAC_6C00, 0x1234_5678),
                root_delay: NtpShort(0x0000_0800),
                root_dispersion: NtpShort(0x0000_0400),
            }
        );
        assert!(served.is_synchronised());
        assert_eq!(served.root_distance(), 0x400 as f64 / 65536.0 * 2.0);
    }

    #[test]
    fn dispersion_grows_with_age() {
        let policy = StalePolicy::default();
        let state = synced();
        // 4 s at 15 ppm is 60 µs, 3.93 units of 2^-16 s, rounded up to 4.
        assert_eq!(
            state.served_at(at(4.0), &policy).root_dispersion,
            NtpShort(0x0404)
        );
        // 8 s: 120 µs, 7.86 units, rounded up to 8.
        assert_eq!(
            state.served_at(at(8.0), &policy).root_dispersion,
            NtpShort(0x0408)
        );
        // Any positive age adds at least one unit.
        assert_eq!(
            state.served_at(at(0.001), &policy).root_dispersion,
            NtpShort(0x0401)
        );
        // A steeper rate grows faster: 1e-3 s/s for 2 s is 2 ms, 131.07 units, rounded up to 132.
        let steep = StalePolicy {
            dispersion_rate: 1e-3,
            ..policy
        };
        assert_eq!(
            state.served_at(at(2.0), &steep).root_dispersion,
            NtpShort(0x0400 + 132)
        );
        // Saturates rather than wraps.
        let huge = ServerState {
            root_dispersion: NtpShort(0xFFFF_FFF0),
            ..state
        };
        assert_eq!(
            huge.served_at(at(8.0), &steep).root_dispersion,
            NtpShort::MAX
        );
    }

    #[test]
    fn the_followed_offsets_error_bound_is_in_the_root_dispersion() {
        let policy = StalePolicy {
            dispersion_rate: 0.0,
            ..StalePolicy::default()
        };
        let state = ServerState {
            clock: ServedClock {
                anchor: T0,
                offset: 0.3,
                rate: 0.0,
                error: 100e-6,
                error_rate: 50e-6,
            },
            ..synced()
        };
        // 0x400 units plus 100 µs (6.55 units, rounded up to 7) at the anchor...
        assert_eq!(
            state.served_at(T0, &policy).root_dispersion,
            NtpShort(0x0400 + 7)
        );
        // ...and 50 µs more a second on (100 + 200 µs: 19.66 units, rounded up to 20).
        assert_eq!(
            state.served_at(at(4.0), &policy).root_dispersion,
            NtpShort(0x0400 + 20)
        );
    }

    #[test]
    fn stale_state_is_served_unsynchronised() {
        let policy = StalePolicy::default();
        let state = synced();
        assert!(state.served_at(at(8.0), &policy).is_synchronised());
        let stale = state.served_at(at(8.001), &policy);
        assert_eq!(stale, ServedHeader::unsynchronised(-25));
        assert_eq!(stale.leap, Leap::Unsynchronised);
        assert_eq!(stale.stratum, 0);
        assert_eq!(stale.reference_id, [0; 4]);
        assert_eq!(stale.reference_ts, NtpTimestamp::ZERO);
        assert_eq!(stale.root_delay, NtpShort(0x0001_0000));
        assert_eq!(stale.root_dispersion, NtpShort(0x0001_0000));
        // A clock stepped back past the stale time counts as stale too.
        assert_eq!(
            state.served_at(at(-9.0), &policy),
            ServedHeader::unsynchronised(-25)
        );
        assert!(state.served_at(at(-1.0), &policy).is_synchronised());
        // A custom stale time.
        let short = StalePolicy {
            stale_after: Duration::from_secs(2),
            ..policy
        };
        assert!(!state.served_at(at(3.0), &short).is_synchronised());
    }

    #[test]
    fn never_updated_or_unsynchronised_upstream_is_served_unsynchronised() {
        let policy = StalePolicy::default();
        let never = ServerState::unsynchronised();
        assert_eq!(never.updated, None);
        assert_eq!(
            never.served_at(T0, &policy),
            ServedHeader::unsynchronised(DEFAULT_PRECISION)
        );
        assert_eq!(ServerState::default(), never);

        let no_time = ServerState {
            updated: None,
            ..synced()
        };
        assert_eq!(
            no_time.served_at(T0, &policy),
            ServedHeader::unsynchronised(-25)
        );
        let leap3 = ServerState {
            leap: Leap::Unsynchronised,
            ..synced()
        };
        assert_eq!(
            leap3.served_at(T0, &policy),
            ServedHeader::unsynchronised(-25)
        );
        let stratum16 = ServerState {
            stratum: 16,
            ..synced()
        };
        assert_eq!(
            stratum16.served_at(T0, &policy),
            ServedHeader::unsynchronised(-25)
        );
    }

    #[test]
    fn leap_warnings_are_passed_on() {
        let state = ServerState {
            leap: Leap::AddSecond,
            ..synced()
        };
        assert_eq!(
            state.served_at(T0, &StalePolicy::default()).leap,
            Leap::AddSecond
        );
    }

    /// A state 2 s after a poll, whose served time is `offset` from the local clock, with `leap`
    /// announced for local `T0 + 3 s` served.
    fn pending(leap: Leap, offset: f64) -> ServerState {
        ServerState {
            leap,
            updated: Some(at(-2.0)),
            clock: ServedClock {
                anchor: at(-2.0),
                offset,
                ..ServedClock::LOCAL
            },
            announced: Some(Announced {
                leap,
                at: NtpTimestamp(
                    at(3.0)
                        .0
                        .wrapping_add((offset * 2f64.powi(32)) as i64 as u64),
                ),
            }),
            tai_offset: Some(37),
            leap_step: LeapStep::NONE,
            ..synced()
        }
    }

    #[test]
    fn from_the_start_of_a_leap_until_a_poll_after_it_a_second_is_added_to_the_bound() {
        let policy = StalePolicy::default();
        let base = synced()
            .served_at(at(-2.0), &policy)
            .root_dispersion
            .seconds();
        for (leap, starts) in [(Leap::AddSecond, 3.0), (Leap::DelSecond, 2.0)] {
            let state = pending(leap, 1000.5);
            let before = state.served_at(at(starts - 0.001), &policy);
            assert_eq!(before.leap, leap);
            assert!(
                before.root_dispersion.seconds() < base + 0.001,
                "{before:?}"
            );
            for after in [starts, starts + 0.5, starts + 2.5] {
                let served = state.served_at(at(after), &policy);
                assert_eq!(served.leap, Leap::NoWarning, "{leap:?} at {after}");
                let grown = served.root_dispersion.seconds() - base;
                assert!(
                    (1.0..1.001).contains(&grown),
                    "{leap:?} at {after}: {served:?}"
                );
            }
        }
    }

    #[test]
    fn tai_is_told_except_from_the_last_second_before_a_leap_until_a_poll_after_it() {
        let state = pending(Leap::AddSecond, -3.25);
        assert_eq!(state.tai_offset_at(at(1.99)), Some(37));
        for t in [2.0, 2.5, 3.0, 4.0] {
            assert_eq!(state.tai_offset_at(at(t)), None, "at {t}");
        }
        let done = ServerState {
            announced: None,
            ..state
        };
        assert_eq!(done.tai_offset_at(at(2.5)), Some(37));
        let unknown = ServerState {
            tai_offset: None,
            leap_step: LeapStep::NONE,
            ..done
        };
        assert_eq!(unknown.tai_offset_at(at(0.0)), None);
    }

    #[test]
    fn a_smear_runs_from_noon_to_noon_and_knows_which_side_of_the_step_the_time_is() {
        // The leap 3 s after T0, served time = local time.
        let leap = Announced {
            leap: Leap::AddSecond,
            at: at(3.0),
        };
        let state = ServerState {
            leap_step: LeapStep {
                leap: Some(leap),
                stepped: false,
                realtime_minus_monotonic: 100.0,
            },
            ..synced()
        };
        let never = || -> f64 { panic!("the monotonic clock is read only near the leap") };
        // Outside the day around the leap: no smear, and no clock read.
        assert_eq!(state.smear_at(at(3.0 - 43_202.0), never), None);
        assert_eq!(state.smear_at(at(3.0 + 43_203.0), never), None);
        // Inside it, far from the leap: the smear, unstepped, without reading the monotonic clock.
        let (smear, stepped) = state.smear_at(at(3.0 - 600.0), never).unwrap();
        assert_eq!((smear.announced, stepped), (leap, false));
        // Near it, the kernel's clock stepped back a second since the poll: stepped.
        assert_eq!(state.smear_at(at(3.5), || 99.0).map(|s| s.1), Some(true));
        assert_eq!(state.smear_at(at(2.5), || 100.0).map(|s| s.1), Some(false));
        // A poll saw the step: stepped whatever the clocks say.
        let polled = ServerState {
            leap_step: LeapStep {
                stepped: true,
                ..state.leap_step
            },
            ..state
        };
        assert_eq!(polled.smear_at(at(2.5), || 100.0).map(|s| s.1), Some(true));
        assert_eq!(polled.smear_at(at(600.0), never).map(|s| s.1), Some(true));
    }
}
