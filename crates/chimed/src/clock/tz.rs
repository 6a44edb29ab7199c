//! Timezone-offset mode, the daemon's half: finding the zone's rules in the system tz database
//! and describing them to the operator. The arithmetic is chime-ntp's [`ZoneShift`].
//!
//! A bad idea for everyone but the devices it exists for: served NTP time stops being UTC.
//! Roughtime never uses it; a signed time must be true UTC.

use std::sync::Arc;

use chime_ntp::ZoneShift;
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
