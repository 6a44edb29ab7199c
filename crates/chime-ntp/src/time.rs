//! NTP's two fixed-point time formats and their conversions to Unix time.
//!
//! Every timestamp the responder writes and the mirror compares is an [`NtpTimestamp`]; root delay
//! and root dispersion are [`NtpShort`]s. The caller reads its clocks and converts once, at the
//! edge ([`NtpTimestamp::from_unix`]); nothing in here reads a clock.

use std::fmt;
use std::time::Duration;

/// Seconds from the NTP epoch (1900-01-01) to the Unix epoch (1970-01-01): 2,208,988,800.
const UNIX_EPOCH_IN_NTP_SECONDS: i64 = 0x83AA_7E80;

const NANOS_PER_SECOND: u32 = 1_000_000_000;

/// 2^32, the scale of the timestamp fraction, as a float.
const FRACTION_SCALE: f64 = 4_294_967_296.0;

/// 2^16, the scale of the short format's fraction, as a float.
const SHORT_SCALE: f64 = 65_536.0;

/// An NTP timestamp: seconds since 1900-01-01 00:00:00 UTC in 32.32 fixed point.
///
/// The wire carries no era number, so the seconds wrap every 2^32 s (136 years; era 1 starts on
/// 2036-02-07 06:28:16 UTC). Conversions from Unix time wrap into the era; conversions back need a
/// pivot, a Unix time known to be within 68 years of the timestamp ([`Self::to_unix_near`]).
/// Ordering compares the raw bits and is meaningful only within one era; use
/// [`Self::wrapping_diff_seconds`] to compare times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NtpTimestamp(pub u64);

impl NtpTimestamp {
    /// The all-zero timestamp, which NTP uses for "unknown" (e.g. the reference timestamp of a
    /// server that was never synchronised).
    pub const ZERO: Self = Self(0);

    /// Builds a timestamp from its seconds (since 1900, within the era) and its fraction (units of
    /// 2^-32 s).
    pub const fn from_parts(seconds: u32, fraction: u32) -> Self {
        Self(((seconds as u64) << 32) | fraction as u64)
    }

    /// The seconds since the start of the era.
    pub const fn seconds(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The fraction of a second, in units of 2^-32 s.
    pub const fn fraction(self) -> u32 {
        self.0 as u32
    }

    /// Converts a Unix time (seconds since 1970, and nanoseconds) into the NTP era it falls in.
    ///
    /// Any `secs` is accepted: times before 1900 or after 2036 wrap into the 32-bit seconds the way
    /// the wire format does. The nanoseconds are rounded to the nearest 2^-32 s, and `nanos` of a
    /// second or more carry into the seconds.
    pub fn from_unix(secs: i64, nanos: u32) -> Self {
        let secs = secs.wrapping_add(i64::from(nanos / NANOS_PER_SECOND));
        let nanos = nanos % NANOS_PER_SECOND;
        // Truncating to u32 is the reduction modulo 2^32 that drops the era.
        let seconds = secs.wrapping_add(UNIX_EPOCH_IN_NTP_SECONDS) as u32;
        Self::from_parts(seconds, nanos_to_fraction(nanos))
    }

    /// Converts back to Unix time, choosing the era that puts the result nearest `pivot_unix_secs`.
    ///
    /// The pivot is typically the local clock (a client reading a server's reply) or a build date;
    /// the answer is right whenever the true time is within 68 years of it. The fraction is rounded
    /// to the nearest nanosecond, so `from_unix` followed by `to_unix_near` returns the same
    /// nanoseconds.
    pub fn to_unix_near(self, pivot_unix_secs: i64) -> (i64, u32) {
        let pivot_ntp = pivot_unix_secs.wrapping_add(UNIX_EPOCH_IN_NTP_SECONDS);
        // The signed 32-bit distance from the pivot's position in its era picks the nearest era.
        let delta = i64::from(self.seconds().wrapping_sub(pivot_ntp as u32) as i32);
        let mut secs = pivot_unix_secs.wrapping_add(delta);
        let mut nanos = fraction_to_nanos(self.fraction());
        if nanos == NANOS_PER_SECOND {
            secs = secs.wrapping_add(1);
            nanos = 0;
        }
        (secs, nanos)
    }

    /// The timestamp as it appears on the wire (big-endian).
    pub const fn from_bits(bits: [u8; 8]) -> Self {
        Self(u64::from_be_bytes(bits))
    }

    /// The timestamp in wire order (big-endian).
    pub const fn to_bits(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    /// `self - earlier` in seconds, assuming the two are less than 68 years apart, so that the
    /// difference is right across an era boundary.
    pub fn wrapping_diff_seconds(self, earlier: Self) -> f64 {
        self.0.wrapping_sub(earlier.0) as i64 as f64 / FRACTION_SCALE
    }

    /// The timestamp `d` later, wrapping at the era boundary. Durations are taken modulo 2^32 s
    /// and rounded to the nearest 2^-32 s.
    pub fn add_duration(self, d: Duration) -> Self {
        Self(self.0.wrapping_add(duration_to_fixed(d)))
    }

    /// The timestamp `d` earlier, wrapping at the era boundary. Durations are taken modulo 2^32 s
    /// and rounded to the nearest 2^-32 s.
    pub fn sub_duration(self, d: Duration) -> Self {
        Self(self.0.wrapping_sub(duration_to_fixed(d)))
    }
}

impl fmt::LowerHex for NtpTimestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// NTP's short format: seconds in 16.16 fixed point, used for root delay and root dispersion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct NtpShort(pub u32);

impl NtpShort {
    /// The largest value, just under 65536 s.
    pub const MAX: Self = Self(u32::MAX);

    /// Converts seconds, saturating at 0 and [`Self::MAX`].
    ///
    /// Rounds up, as chronyd does (`UTI_DoubleToNtp32`): these fields are error bounds, and a bound
    /// rounded down would understate the error. For the same reason NaN becomes [`Self::MAX`].
    pub fn from_seconds(s: f64) -> Self {
        if s.is_nan() {
            return Self::MAX;
        }
        // `as` saturates: negative values become 0 and values past the range u32::MAX.
        Self((s * SHORT_SCALE).ceil() as u32)
    }

    /// The value in seconds (exact).
    pub fn seconds(self) -> f64 {
        f64::from(self.0) / SHORT_SCALE
    }

    /// The value as it appears on the wire (big-endian).
    pub const fn from_bits(bits: [u8; 4]) -> Self {
        Self(u32::from_be_bytes(bits))
    }

    /// The value in wire order (big-endian).
    pub const fn to_bits(self) -> [u8; 4] {
        self.0.to_be_bytes()
    }
}

/// Nanoseconds (below 10^9) to units of 2^-32 s, rounded to nearest. The largest input gives
/// 4,294,967,292, so the result always fits.
fn nanos_to_fraction(nanos: u32) -> u32 {
    debug_assert!(nanos < NANOS_PER_SECOND);
    let scaled = (u64::from(nanos) << 32) + u64::from(NANOS_PER_SECOND / 2);
    (scaled / u64::from(NANOS_PER_SECOND)) as u32
}

/// Units of 2^-32 s to nanoseconds, rounded to nearest (half up). May return exactly 10^9 for
/// fractions within half a nanosecond of a whole second; the caller carries it.
///
/// One nanosecond is 4.29 fraction units, so rounding nanoseconds to a fraction moves them by at
/// most 0.12 ns, and rounding back lands on the original nanosecond: the round trip is exact.
fn fraction_to_nanos(fraction: u32) -> u32 {
    let scaled = u64::from(fraction) * u64::from(NANOS_PER_SECOND) + (1 << 31);
    (scaled >> 32) as u32
}

fn duration_to_fixed(d: Duration) -> u64 {
    // Truncating the seconds to 32 bits is the documented modulo-2^32 wrap.
    ((d.as_secs() as u32 as u64) << 32) + u64::from(nanos_to_fraction(d.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 2036-02-07 06:28:16 UTC, where NTP era 0 ends and the 32-bit seconds wrap to zero.
    const ERA_1_START_UNIX: i64 = 0x1_0000_0000 - UNIX_EPOCH_IN_NTP_SECONDS;

    #[test]
    fn unix_epoch_and_known_dates() {
        assert_eq!(
            NtpTimestamp::from_unix(0, 0),
            NtpTimestamp::from_parts(0x83AA_7E80, 0)
        );
        // 2000-01-01 00:00:00 UTC is 0xBC17C200 seconds since 1900.
        assert_eq!(
            NtpTimestamp::from_unix(946_684_800, 500_000_000),
            NtpTimestamp::from_parts(0xBC17_C200, 0x8000_0000)
        );
        assert_eq!(ERA_1_START_UNIX, 2_085_978_496);
    }

    #[test]
    fn era_boundary_2036() {
        let start = NtpTimestamp::from_unix(ERA_1_START_UNIX, 0);
        assert_eq!(start, NtpTimestamp::ZERO);
        let before = NtpTimestamp::from_unix(ERA_1_START_UNIX - 1, 999_999_999);
        assert_eq!(before, NtpTimestamp::from_parts(0xFFFF_FFFF, 0xFFFF_FFFC));
        let after = NtpTimestamp::from_unix(ERA_1_START_UNIX + 1, 0);
        assert_eq!(after, NtpTimestamp::from_parts(1, 0));

        // Era resolution picks 2036 near 2036 and 1900 near 1970.
        for pivot in [
            ERA_1_START_UNIX - 86_400 * 365,
            ERA_1_START_UNIX,
            ERA_1_START_UNIX + 86_400,
        ] {
            assert_eq!(start.to_unix_near(pivot), (ERA_1_START_UNIX, 0));
            assert_eq!(
                before.to_unix_near(pivot),
                (ERA_1_START_UNIX - 1, 999_999_999)
            );
            assert_eq!(after.to_unix_near(pivot), (ERA_1_START_UNIX + 1, 0));
        }
        // Near 1920 the same bits mean 1900; near 1970, 2036 is nearer than 1900.
        let year_1920 = -UNIX_EPOCH_IN_NTP_SECONDS + 20 * 365 * 86_400;
        assert_eq!(
            start.to_unix_near(year_1920),
            (-UNIX_EPOCH_IN_NTP_SECONDS, 0)
        );
        assert_eq!(start.to_unix_near(0), (ERA_1_START_UNIX, 0));

        // Differences and arithmetic straddle the boundary.
        assert_eq!(
            after.wrapping_diff_seconds(before),
            1.0 + 4.0 / FRACTION_SCALE
        );
        assert_eq!(
            before.wrapping_diff_seconds(after),
            -after.wrapping_diff_seconds(before)
        );
        assert_eq!(
            start.sub_duration(Duration::from_secs(1)),
            NtpTimestamp::from_parts(0xFFFF_FFFF, 0)
        );
        assert_eq!(
            NtpTimestamp::from_parts(0xFFFF_FFFF, 0).add_duration(Duration::from_millis(1500)),
            NtpTimestamp::from_parts(0, 0x8000_0000)
        );
    }

    #[test]
    fn year_1900() {
        let epoch = -UNIX_EPOCH_IN_NTP_SECONDS;
        assert_eq!(NtpTimestamp::from_unix(epoch, 0), NtpTimestamp::ZERO);
        // A second before 1900 is the last second of era -1.
        assert_eq!(
            NtpTimestamp::from_unix(epoch - 1, 0),
            NtpTimestamp::from_parts(0xFFFF_FFFF, 0)
        );
        assert_eq!(NtpTimestamp::ZERO.to_unix_near(epoch), (epoch, 0));
        assert_eq!(
            NtpTimestamp::from_parts(0xFFFF_FFFF, 0).to_unix_near(epoch),
            (epoch - 1, 0)
        );
        // Near 1970, 0xFFFFFFFF seconds means 2036, not 1899.
        assert_eq!(
            NtpTimestamp::from_parts(0xFFFF_FFFF, 0).to_unix_near(0),
            (ERA_1_START_UNIX - 1, 0)
        );
    }

    #[test]
    fn nanos_carry_and_fraction_rounding() {
        assert_eq!(
            NtpTimestamp::from_unix(10, 1_500_000_000),
            NtpTimestamp::from_unix(11, 500_000_000)
        );
        // Fractions within half a nanosecond of the next second round up into it.
        let almost = NtpTimestamp::from_parts(0x83AA_7E80, 0xFFFF_FFFF);
        assert_eq!(almost.to_unix_near(0), (1, 0));
        assert_eq!(fraction_to_nanos(1), 0);
        assert_eq!(fraction_to_nanos(3), 1);
        assert_eq!(nanos_to_fraction(1), 4);
        assert_eq!(nanos_to_fraction(999_999_999), 0xFFFF_FFFC);
    }

    #[test]
    fn every_nanosecond_near_the_ends_round_trips() {
        for nanos in (0..100_000).chain(NANOS_PER_SECOND - 100_000..NANOS_PER_SECOND) {
            assert_eq!(fraction_to_nanos(nanos_to_fraction(nanos)), nanos);
        }
    }

    #[test]
    fn bits_are_big_endian() {
        let ts = NtpTimestamp(0x0102_0304_0506_0708);
        assert_eq!(ts.to_bits(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(NtpTimestamp::from_bits(ts.to_bits()), ts);
        assert_eq!(NtpShort(0x0001_8000).to_bits(), [0, 1, 0x80, 0]);
        assert_eq!(format!("{ts:#018x}"), "0x0102030405060708");
    }

    #[test]
    fn short_format() {
        assert_eq!(NtpShort::from_seconds(1.0), NtpShort(0x0001_0000));
        assert_eq!(NtpShort(0x0001_8000).seconds(), 1.5);
        // Rounds up: any positive amount is at least one unit.
        assert_eq!(NtpShort::from_seconds(1e-9), NtpShort(1));
        assert_eq!(NtpShort::from_seconds(0.0), NtpShort(0));
        assert_eq!(NtpShort::from_seconds(-3.0), NtpShort(0));
        assert_eq!(NtpShort::from_seconds(65_536.0), NtpShort::MAX);
        assert_eq!(NtpShort::from_seconds(f64::INFINITY), NtpShort::MAX);
        assert_eq!(NtpShort::from_seconds(f64::NAN), NtpShort::MAX);
    }

    proptest! {
        #[test]
        fn unix_round_trip_within_68_years_of_the_pivot(
            pivot in -4_000_000_000_i64..8_000_000_000,
            offset in -0x7FFF_FFFF_i64..0x7FFF_FFFF,
            nanos in 0..NANOS_PER_SECOND,
        ) {
            let secs = pivot + offset;
            let ts = NtpTimestamp::from_unix(secs, nanos);
            prop_assert_eq!(ts.to_unix_near(pivot), (secs, nanos));
        }

        #[test]
        fn fraction_round_trip(nanos in 0..NANOS_PER_SECOND) {
            prop_assert_eq!(fraction_to_nanos(nanos_to_fraction(nanos)), nanos);
        }

        #[test]
        fn fraction_to_nanos_is_nearest(fraction: u32) {
            let exact = f64::from(fraction) * 1e9 / FRACTION_SCALE;
            prop_assert!((f64::from(fraction_to_nanos(fraction)) - exact).abs() <= 0.5);
        }

        #[test]
        fn durations_add_and_subtract(
            raw: u64,
            secs in 0_u64..0x7FFF_FFFF,
            nanos in 0..NANOS_PER_SECOND,
        ) {
            let ts = NtpTimestamp(raw);
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(ts.add_duration(d).sub_duration(d), ts);
            let diff = ts.add_duration(d).wrapping_diff_seconds(ts);
            prop_assert!((diff - d.as_secs_f64()).abs() < 1e-6);
        }
    }
}
