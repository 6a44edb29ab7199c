//! chimed's settings: one schema (`schema`) of checked values (`values`), read from the config
//! file and overlaid with flags (`resolve`, which reads nothing but the file), giving the
//! `Settings` the daemon runs on. Loading the keys and certificates they name is the daemon's
//! step, not this one's. On SIGHUP `reload` reads the file again and says what changed.

pub(crate) mod docs;
mod resolve;
pub(crate) mod schema;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod values;

use std::fmt;
use std::path::{Path, PathBuf};

use figment::value::Value;

use chime_ntp::RateLimit;
use chime_udp::ShedConfig;

pub(crate) use self::schema::{Args, Config};
use crate::access::acl::Acl;

/// The settings from the command line and the config file, every value and every rule between
/// them checked: what the daemon starts with.
pub(crate) fn settings(args: &Args) -> Result<Settings, ConfigError> {
    resolve::resolve(args)
}

/// What SIGHUP can change without a restart, and what it cannot.
#[derive(Debug)]
pub(crate) struct Reloaded {
    /// The access rules now in the file (flags still win over it).
    pub(crate) acl: Acl,
    /// The log level or filter now in force, the file's unless a flag gave it.
    pub(crate) log_level: String,
    /// The keys whose value changed but that take effect only at a restart (`ntp.ipv4-threads`).
    pub(crate) restart: Vec<String>,
    /// The rate limits now in the file, where on (a limiter off at start, or turned on or off,
    /// waits for a restart: `ratelimit.enabled` is not reloaded).
    pub(crate) ntp_rate_limit: Option<RateLimit>,
    pub(crate) nts_rate_limit: Option<RateLimit>,
    /// Shedding's settings now in the file, where on (turning it on or off waits for a restart).
    pub(crate) shed: Option<ShedConfig>,
}

/// Shedding's keys, which SIGHUP puts in force while shedding stays on.
const SHEDDING: [&str; 2] = ["overload.shed-target", "overload.shed-interval"];

/// The keys SIGHUP puts in force.
const RELOADABLE: [&str; 10] = [
    "access.allow",
    "access.deny",
    "observe.log-level",
    "ratelimit.interval",
    "ratelimit.burst",
    "ratelimit.leak",
    "ratelimit.kod",
    "nts.ratelimit.interval",
    "nts.ratelimit.burst",
    "nts.ratelimit.leak",
];

/// SIGHUP: the config file read again, flags still over it, and every value checked as at start.
/// `Ok(None)` if there is no file. A broken file changes nothing.
pub(crate) fn reload(args: &Args, current: &Settings) -> Result<Option<Reloaded>, ConfigError> {
    if args.config.is_none() {
        return Ok(None);
    }
    let new = resolve::resolve(args)?;
    let (was, now) = (current.values(), new.values());
    // Shedding's target and interval change while it stays on; on or off waits for a restart.
    let shedding = current.shed().is_some() && new.shed().is_some();
    let mut restart: Vec<String> = (was.iter().filter(|kv| !now.contains(kv)))
        .chain(now.iter().filter(|kv| !was.contains(kv)))
        .map(|(k, _)| k.clone())
        .filter(|key| !RELOADABLE.contains(&key.as_str()))
        .filter(|key| !(shedding && SHEDDING.contains(&key.as_str())))
        .collect();
    restart.sort();
    restart.dedup();
    Ok(Some(Reloaded {
        shed: new.shed(),
        ntp_rate_limit: new.ntp_rate_limit().map(|r| r.limit),
        nts_rate_limit: new.nts_rate_limit().map(|r| r.limit),
        acl: new.acl,
        log_level: new.config.observe.log_level.0,
        restart,
    }))
}

/// Why the settings could not be resolved: always names the input at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("config file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path}, line {line}: {reason}")]
    Parse {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{input}: {reason}")]
    Invalid { input: Input, reason: String },
    /// figment could not layer the file and the flags: a bug, since both are the schema's own.
    #[error("merging the config file and the flags: {0}")]
    Merge(String),
}

/// Where a value came from, so that a message about it can point there.
#[derive(Debug, Clone)]
pub(crate) struct Input {
    /// The key's dotted path, `ratelimit.leak`.
    key: &'static str,
    from: From,
}

#[derive(Debug, Clone)]
enum From {
    /// The flag's long name.
    Flag(String),
    File {
        path: PathBuf,
        line: usize,
    },
    /// Neither: the built-in default.
    Default,
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key;
        match &self.from {
            From::Flag(long) => write!(f, "--{long}"),
            From::File { path, line } => {
                write!(f, "config file {}, line {line}: {key}", path.display())
            }
            From::Default => write!(f, "{key} (not set, its default)"),
        }
    }
}

/// Everything the daemon needs to start, checked; the values are read through `Deref`.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) config: Config,
    /// Who is served (`allow` and `deny`).
    pub(crate) acl: Acl,
    sources: resolve::Sources,
}

impl std::ops::Deref for Settings {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.config
    }
}

impl Settings {
    /// An error about `key`'s value, naming where it came from: for the files the settings name,
    /// which the daemon reads.
    pub(crate) fn bad(&self, key: &'static str, reason: impl fmt::Display) -> ConfigError {
        self.sources.bad(key, reason)
    }

    /// Every value as a dotted key and its value: what SIGHUP compares.
    fn values(&self) -> Vec<(String, Value)> {
        let value = Value::serialize(&self.config).expect("the schema's own values serialise");
        let keys = resolve::value_keys(&value);
        let at = |k: String| value.find_ref(&k).map(|v| (k, v.clone()));
        keys.into_iter().filter_map(at).collect()
    }

    /// The settings as a config file would give them, for --check-config.
    pub(crate) fn show(&self) -> String {
        toml::to_string(&self.config).unwrap_or_else(|e| format!("cannot show: {e}"))
    }

    /// Shedding under a standing overload, NTP and Roughtime alike; `None`: off.
    pub(crate) fn shed(&self) -> Option<ShedConfig> {
        Some(ShedConfig {
            target: self.overload.shed_target.duration()?,
            interval: self.overload.shed_interval.duration(),
        })
    }

    /// Per-client NTP rate limiting, if on.
    pub(crate) fn ntp_rate_limit(&self) -> Option<RateLimiting> {
        let r = &self.ratelimit;
        let limit = RateLimit::new(r.interval.0, r.burst.0, r.leak.0, r.kod.0);
        let clients = r.clients.0;
        r.enabled.then(|| RateLimiting {
            limit: limit.expect("each value was checked"),
            clients,
        })
    }

    /// NTS-KE connections per client address, if limited (no Kiss-o'-Death on TCP).
    pub(crate) fn nts_rate_limit(&self) -> Option<RateLimiting> {
        let r = &self.nts.ratelimit;
        let limit = RateLimit::new(r.interval.0, r.burst.0, r.leak.0, 0);
        r.enabled.then(|| RateLimiting {
            limit: limit.expect("each value was checked"),
            clients: NTS_RATELIMIT_CLIENTS,
        })
    }

    /// NTS-KE's certificate and key, if it is on.
    pub(crate) fn nts_ke(&self) -> Option<(&Path, &Path)> {
        Some((
            self.nts.certificate.as_deref()?,
            self.nts.private_key.as_deref()?,
        ))
    }

    /// What Roughtime signs with; `None`: Roughtime is off.
    pub(crate) fn roughtime_key(&self) -> Option<KeyFile> {
        let rt = &self.roughtime;
        let bundle = || rt.delegation.clone().map(KeyFile::Bundle);
        rt.key.clone().map(KeyFile::LongTerm).or_else(bundle)
    }

    /// Timezone-offset mode: `Some(None)` for the system zone, `Some(Some(name))` for a named one.
    pub(crate) fn tz_offset(&self) -> Option<Option<&str>> {
        let tz = &self.tz_offset;
        tz.enabled.then_some(tz.timezone.as_deref())
    }
}

/// How many addresses NTS-KE rate limiting tracks: 16384, 256 KiB. A client runs NTS-KE once
/// per association, so these are the addresses that connected in the last minutes.
const NTS_RATELIMIT_CLIENTS: usize = 16_384;

/// A rate limit and the client addresses it tracks at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimiting {
    pub(crate) limit: RateLimit,
    pub(crate) clients: usize,
}

/// What Roughtime signs with, to be read.
#[derive(Debug, Clone)]
pub(crate) enum KeyFile {
    LongTerm(PathBuf),
    Bundle(PathBuf),
}
