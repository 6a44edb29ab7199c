//! Timezone-offset mode, the daemon's half: finding the zone's rules in the system tz database
//! and describing them to the operator. The arithmetic is chime-ntp's [`ZoneShift`].
//!
//! A bad idea for everyone but the devices it exists for: served NTP time stops being UTC.
//! Roughtime never uses it; a signed time must be true UTC.

use std::sync::Arc;

use chime_ntp::ZoneShift;
use chime_xdp::DriverZone;
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// A zone's offset function, shareable by every worker.
pub(crate) type Zone = ZoneShift<Box<dyn Fn(i64) -> i32 + Send + Sync>>;

/// Loads the zone: `name` from the tz database, else the system's own (`TZ`, else
/// `/etc/localtime`). The error names the zone.
pub(crate) fn load(name: Option<&str>) -> Result<(Arc<Zone>, String), ZoneError> {
    let tz = match name {
        Some(n) => TimeZone::get(n).map_err(|source| ZoneError::Unknown {
            name: n.to_owned(),
            source,
        })?,
        None => TimeZone::try_system().map_err(ZoneError::NoSystemZone)?,
    };
    let description = describe(&tz, name, Timestamp::now());
    let zone: Zone = ZoneShift::new(Box::new(move |secs| {
        // An instant outside jiff's range (years beyond ±9999) cannot come from a sane clock;
        // serve UTC rather than panic.
        Timestamp::from_second(secs).map_or(0, |t| tz.to_offset(t).seconds())
    }));
    Ok((Arc::new(zone), description))
}

/// [`load`] after dropping jiff's cache of the tz database (it otherwise serves zones it read in
/// the last five minutes), so that a SIGHUP after a tzdata update really reads the new rules.
pub(crate) fn reload(name: Option<&str>) -> Result<(Arc<Zone>, String), ZoneError> {
    jiff::tz::db().reset();
    load(name).map_err(|e| ZoneError::Reread(Box::new(e)))
}

/// Seconds from 1900 (NTP's era 0) to 1970.
const NTP_UNIX: i64 = 2_208_988_800;

/// The days ahead [`driver_zone`] looks for the zone's next change: more than a year, so that
/// every zone with changes has one within it.
const LOOK_AHEAD_DAYS: i64 = 400;

/// `zone` at Unix second `now_unix` as the program in the driver shifts by it: its offset now and
/// its next change within [`LOOK_AHEAD_DAYS`], found from the offset function alone (day by day,
/// then the second, by bisection). The state carrying it is written on every poll, so one change
/// ahead is all the program needs while chimed runs.
pub(crate) fn driver_zone(zone: &Zone, now_unix: i64) -> DriverZone {
    const DAY: i64 = 86_400;
    let offset = zone.offset_at(now_unix);
    let change = (1..=LOOK_AHEAD_DAYS)
        .map(|d| now_unix + d * DAY)
        .find(|&t| zone.offset_at(t) != offset)
        .map(|found| {
            // The first second whose offset is not `offset`: after `low`, at or before `high`.
            let (mut low, mut high) = (found - DAY, found);
            while high - low > 1 {
                let mid = low + (high - low) / 2;
                if zone.offset_at(mid) == offset {
                    low = mid;
                } else {
                    high = mid;
                }
            }
            // The NTP second modulo 2^32, as the program compares it.
            ((high + NTP_UNIX) as u32, zone.offset_at(high))
        });
    DriverZone { offset, change }
}

/// Why the zone could not be loaded. The messages name the zone, not the flag or key that gave it:
/// the caller says where it came from (`--timezone`, or the config file's line).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ZoneError {
    #[error("{name}: unknown zone ({source})")]
    Unknown { name: String, source: jiff::Error },
    #[error("cannot find the system timezone ({0})")]
    NoSystemZone(jiff::Error),
    #[error("cannot re-read the zone: {0}")]
    Reread(Box<ZoneError>),
}

/// "Asia/Kolkata, now UTC+05:30, no transitions ahead" and the like, for the start-up warning.
fn describe(tz: &TimeZone, name: Option<&str>, now: Timestamp) -> String {
    let zone_name = name
        .or(tz.iana_name())
        .unwrap_or("the system timezone")
        .to_owned();
    let offset = tz.to_offset(now);
    let next = match tz.following(now).next() {
        Some(t) => format!(
            "next transition {} to UTC{} ({})",
            t.timestamp(),
            t.offset(),
            t.abbreviation()
        ),
        None => "no transitions ahead".to_owned(),
    };
    format!("{zone_name}, now UTC{offset}, {next}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drivers_zone_has_the_next_change_jiff_knows() {
        let (zone, _) = load(Some("America/New_York")).unwrap();
        let tz = TimeZone::get("America/New_York").unwrap();
        // 2026-01-15 and 2026-06-15: the next change is March's, then November's.
        for now in [1_768_435_200, 1_781_481_600] {
            let at = Timestamp::from_second(now).unwrap();
            let next = tz.following(at).next().unwrap();
            let d = driver_zone(&zone, now);
            assert_eq!(d.offset, tz.to_offset(at).seconds());
            let change = (next.timestamp().as_second() + NTP_UNIX) as u32;
            assert_eq!(d.change, Some((change, next.offset().seconds())), "{now}");
        }
        // A zone without changes has none ahead.
        let (kolkata, _) = load(Some("Asia/Kolkata")).unwrap();
        let d = driver_zone(&kolkata, 1_768_435_200);
        assert_eq!(
            d,
            DriverZone {
                offset: 19_800,
                change: None
            }
        );
    }

    #[test]
    fn unknown_zone_is_named() {
        let e = load(Some("Mars/Olympus_Mons")).unwrap_err().to_string();
        assert!(e.contains("Mars/Olympus_Mons"), "{e}");
    }

    #[test]
    fn description_names_offset_and_next_transition() {
        let tz = TimeZone::get("Europe/Prague").unwrap();
        let now: Timestamp = "2026-11-21T12:00:00Z".parse().unwrap();
        let d = describe(&tz, Some("Europe/Prague"), now);
        assert!(d.starts_with("Europe/Prague, now UTC+01"), "{d}");
        assert!(
            d.contains("2027-03-28T01:00:00Z") && d.contains("CEST"),
            "{d}"
        );
        let tz = TimeZone::get("Asia/Kolkata").unwrap();
        let d = describe(&tz, Some("Asia/Kolkata"), now);
        assert!(
            d.contains("UTC+05:30") && d.contains("no transitions ahead"),
            "{d}"
        );
    }
}
