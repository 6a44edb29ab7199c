//! From the command line and the config file to checked settings, reading nothing but the file.
//!
//! Three layers, merged by figment: the defaults, the file as written over them, then the flags
//! that were given (the flag layer holds only those, so an unset flag hides nothing). The keys
//! each layer set are kept, so an error is reported against the flag that gave the value, the
//! file and line, or the default. Each value was checked as it was parsed (`values`); here
//! only the rules between keys are. A key that only takes effect with another is refused without
//! it, rather than ignored, and a key of a service that is off is checked all the same, so that a
//! bad value is found when the file is written, not the day the service is turned on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use figment::Figment;
use figment::providers::Serialized;
use figment::value::Value;

use super::schema::{Args, Config};
use super::{ConfigError, From, Input, Settings};
use crate::access::acl::Acl;

/// Where each value came from.
#[derive(Debug)]
pub(crate) struct Sources {
    /// The settings resolved, and as no file and no flag sets them.
    resolved: Value,
    defaults: Value,
    file: Option<PathBuf>,
    /// Each key's line in the file, by dotted path.
    lines: HashMap<String, usize>,
    /// The keys the command line set, by dotted path.
    flags: Vec<String>,
}

impl Sources {
    /// The input that set `key` (its dotted path), or its default if none did.
    pub(crate) fn input(&self, key: &'static str) -> Input {
        let from = match (&self.file, self.lines.get(key)) {
            _ if self.flags.iter().any(|k| k == key) => From::Flag(flag_of(key)),
            (Some(path), Some(&line)) => From::File {
                path: path.clone(),
                line,
            },
            _ => From::Default,
        };
        Input { key, from }
    }

    /// An error about `key`'s value, naming where it came from.
    pub(crate) fn bad(&self, key: &'static str, reason: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            input: self.input(key),
            reason: reason.to_string(),
        }
    }

    /// Whether the file or a flag gave `key`.
    fn given(&self, key: &str) -> bool {
        self.lines.contains_key(key) || self.flags.iter().any(|k| k == key)
    }

    /// Whether the file or a flag gave `key` a value other than its default.
    fn changed(&self, key: &str) -> bool {
        self.given(key) && self.resolved.find_ref(key) != self.defaults.find_ref(key)
    }

    /// `other` as the operator writes it where `at` was given: `--flag` on the command line, the
    /// dotted key in the file; so that a message names both the same way.
    fn like(&self, at: &'static str, other: &'static str) -> String {
        match self.input(at).from {
            From::Flag(_) => format!("--{}", flag_of(other)),
            _ => other.to_owned(),
        }
    }
}

/// The long flag whose clap id is `key`.
fn flag_of(key: &str) -> String {
    let cmd = Args::command();
    let arg = cmd.get_arguments().find(|a| a.get_id() == key);
    arg.and_then(|a| a.get_long()).unwrap_or(key).to_owned()
}

/// The dotted path of every value under `value`, a table.
pub(super) fn value_keys(value: &Value) -> Vec<String> {
    let Value::Dict(_, dict) = value else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for (k, v) in dict {
        match v {
            Value::Dict(..) => keys.extend(value_keys(v).into_iter().map(|i| format!("{k}.{i}"))),
            _ => keys.push(k.clone()),
        }
    }
    keys
}

/// Merges the defaults, the file as written and the flags that were given (each a layer holding
/// only what it set, so that an unset flag hides nothing), then checks the rules between keys.
pub(super) fn resolve(args: &Args) -> Result<Settings, ConfigError> {
    let (table, lines) = match &args.config {
        Some(path) => read(path)?,
        None => (toml::Table::new(), HashMap::new()),
    };
    let merge_error = |e: figment::Error| ConfigError::Merge(e.to_string());
    let defaults = Value::serialize(Config::default()).map_err(merge_error)?;
    let flags = Value::serialize(&args.values).map_err(merge_error)?;
    let mut figment =
        Figment::from(Serialized::defaults(Config::default())).merge(Serialized::defaults(table));
    for key in &args.given {
        if let Some(value) = flags.find_ref(key) {
            figment = figment.merge(Serialized::default(key, value.clone()));
        }
    }
    // Every layer holds values the schema has read already, so this cannot find a wrong type.
    let config: Config = figment.extract().map_err(merge_error)?;
    let sources = Sources {
        resolved: Value::serialize(&config).map_err(merge_error)?,
        defaults,
        file: args.config.clone(),
        lines,
        flags: args.given.clone(),
    };
    rules(&config, &sources)?;
    let access = &config.access;
    Acl::new(&access.allow, &[]).map_err(|r| sources.bad("access.allow", r))?;
    Acl::new(&[], &access.deny).map_err(|r| sources.bad("access.deny", r))?;
    // Together they cannot fail once each has parsed.
    let acl = Acl::new(&access.allow, &access.deny).map_err(|r| sources.bad("access.allow", r))?;
    Ok(Settings {
        config,
        acl,
        sources,
    })
}

/// Keys that only take effect with another on (a switch that is true, a path that is given): each
/// of the second list is refused when given a value other than its default while every key of the
/// first is off.
const NEEDS: [(&[&str], &[&str]); 7] = [
    (
        &["ratelimit.enabled"],
        &[
            "ratelimit.interval",
            "ratelimit.burst",
            "ratelimit.leak",
            "ratelimit.kod",
            "ratelimit.clients",
        ],
    ),
    (
        &["nts.ratelimit.enabled"],
        &[
            "nts.ratelimit.interval",
            "nts.ratelimit.burst",
            "nts.ratelimit.leak",
        ],
    ),
    (
        &["nts.certificate"],
        &[
            "nts.ke-address",
            "nts.ke-threads",
            "nts.dump-dir",
            "nts.ntp-server",
            "nts.pool-tokens",
        ],
    ),
    (&["nts.certificate"], &["nts.ratelimit.enabled"]),
    (&["nts.certificate", "nts.fleet-key"], &["nts.rotation"]),
    (
        &["xdp.interface"],
        &["xdp.threads", "xdp.mode", "xdp.fallback", "xdp.in-driver"],
    ),
    (&["tz-offset.enabled"], &["tz-offset.timezone"]),
];

/// Keys that exclude each other, and why.
const EXCLUDES: [(&str, &str, &str); 2] = [
    (
        "nts.fleet-key",
        "nts.dump-dir",
        "fleet keys are derived from the secret whenever needed, never saved",
    ),
    (
        "roughtime.delegation",
        "roughtime.key",
        "a server holds the long-term key or a bundle of delegations from it, not both",
    ),
];

/// The rules between keys.
fn rules(c: &Config, s: &Sources) -> Result<(), ConfigError> {
    // On: a switch that is true, a value that is given.
    let on = |key: &str| {
        let off = |v: &Value| matches!(v, Value::Empty(..)) || v.to_bool() == Some(false);
        s.resolved.find_ref(key).is_some_and(|v| !off(v))
    };
    let (cert, key) = ("nts.certificate", "nts.private-key");
    for (given, missing) in [(cert, key), (key, cert)] {
        if s.given(given) && !s.given(missing) {
            let r = format!("missing: {} needs it", s.like(given, given));
            return Err(missing_at(s, missing, given, r));
        }
    }
    for (switches, keys) in NEEDS {
        if switches.iter().any(|k| on(k)) {
            continue;
        }
        if let Some(&key) = keys.iter().find(|k| s.changed(k)) {
            let with: Vec<_> = switches.iter().map(|w| s.like(key, w)).collect();
            let r = format!("only takes effect with {}; set both", with.join(" or "));
            return Err(s.bad(key, r));
        }
    }
    for (key, other, why) in EXCLUDES {
        if s.given(key) && s.given(other) {
            return Err(s.bad(key, format!("not with {}: {why}", s.like(key, other))));
        }
    }
    let rt = &c.roughtime;
    if rt.mldsa_key.is_some() {
        let at = "roughtime.mldsa-key";
        if !cfg!(feature = "mldsa") {
            let r = "the experimental ML-DSA-44 suite is not in this chimed: build it with \
                     `--features mldsa`";
            return Err(s.bad(at, r));
        }
        if rt.tcp.connections.0 == 0 {
            let tcp = s.like(at, "roughtime.tcp.connections");
            return Err(s.bad(
                at,
                format!("the ML-DSA-44 suite is TCP only, and {tcp} is 0"),
            ));
        }
        if rt.key.is_none() && rt.delegation.is_none() {
            let (k, d) = (
                s.like(at, "roughtime.key"),
                s.like(at, "roughtime.delegation"),
            );
            return Err(s.bad(
                at,
                format!("serves beside the Ed25519 suite: give {k} or {d}"),
            ));
        }
    }
    threads(c, s)
}

/// Each service that is on has threads to run on, and polls upstream often enough.
fn threads(c: &Config, s: &Sources) -> Result<(), ConfigError> {
    let ntp = c.ntp.ipv4_threads.0 + c.ntp.ipv6_threads.0;
    // A member may serve NTS-KE alone, sending clients to the fleet's NTP servers.
    if ntp == 0 && c.nts.ntp_server.is_none() {
        let r = "no NTP threads: set ipv4-threads or ipv6-threads (or serve NTS-KE only, with \
                 nts.ntp-server naming the NTP servers)";
        return Err(s.bad("ntp.ipv4-threads", r));
    }
    let rt = &c.roughtime;
    let roughtime_on = rt.key.is_some() || rt.delegation.is_some();
    if roughtime_on && rt.ipv4_threads.0 + rt.ipv6_threads.0 == 0 {
        return Err(s.bad("roughtime.ipv4-threads", "no Roughtime threads"));
    }
    let (poll, stale) = (c.upstream.poll_interval.0, c.upstream.stale_after.0);
    if stale <= poll {
        let r = format!("{stale} s must be longer than the poll interval ({poll} s)");
        return Err(s.bad("upstream.stale-after", r));
    }
    Ok(())
}

/// An error about `key`, which is missing: named where `given`, its partner, was given.
fn missing_at(s: &Sources, key: &'static str, given: &'static str, reason: String) -> ConfigError {
    let mut input = s.input(given);
    if let From::Flag(_) = input.from {
        input.from = From::Flag(flag_of(key));
    }
    input.key = key;
    ConfigError::Invalid { input, reason }
}

/// Reads and parses the config file, keeping each key's line. An unknown key that was a key of
/// the flat file before sections is named with its new place.
fn read(path: &Path) -> Result<(toml::Table, HashMap<String, usize>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let line_at = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    let parse_error = |line, reason| ConfigError::Parse {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut lines = HashMap::new();
    // toml's own Display spans several lines with a snippet; the operator gets one. A value out
    // of range (its span the value's, not a key's) is named by its key, as resolve names one.
    let one_line = |e: toml::de::Error, lines: &HashMap<String, usize>| {
        let span = e.span().unwrap_or(0..0);
        let (at, line) = (text.get(span.clone()).unwrap_or(""), line_at(span.start));
        let of_value = |k: &String| k.rsplit('.').next() != Some(at.trim_matches('"'));
        let key = (lines.iter().filter(|&(k, l)| *l == line && of_value(k)))
            .map(|(k, _)| k)
            .max_by_key(|k| k.len());
        let reason = e.message().trim();
        let reason = key.map_or_else(|| reason.into(), |k| format!("{k}: {reason}"));
        parse_error(line, moved(at).unwrap_or(reason))
    };
    let table = toml::de::DeTable::parse(&text).map_err(|e| one_line(e, &lines))?;
    // Before serde: `ratelimit = true` at the top is a flat key, not a malformed section.
    for (key, value) in table.get_ref() {
        if !matches!(value.get_ref(), toml::de::DeValue::Table(_))
            && let Some(reason) = moved(key.get_ref())
        {
            return Err(parse_error(line_at(key.span().start), reason));
        }
    }
    index("", table.get_ref(), &line_at, &mut lines);
    // Read as the schema first, for its checks and their lines; the layer is the file as written.
    toml::from_str::<Config>(&text).map_err(|e| one_line(e, &lines))?;
    let written = toml::from_str(&text).map_err(|e| one_line(e, &lines))?;
    Ok((written, lines))
}

/// `ipv4-threads is now [ntp] ipv4-threads`, if `key` was a key of the flat file, whose keys were
/// the flags' names.
fn moved(key: &str) -> Option<String> {
    let key = key.trim().trim_matches('"');
    let cmd = Args::command();
    let arg = cmd.get_arguments().find(|a| a.get_long() == Some(key))?;
    let (section, new) = arg.get_id().as_str().rsplit_once('.')?;
    Some(format!("{key} is now [{section}] {new}"))
}

/// Notes the line of every key in `table`, by dotted path.
fn index(
    prefix: &str,
    table: &toml::de::DeTable<'_>,
    line_at: &dyn Fn(usize) -> usize,
    lines: &mut HashMap<String, usize>,
) {
    for (key, value) in table {
        let path = match prefix {
            "" => key.get_ref().to_string(),
            _ => format!("{prefix}.{}", key.get_ref()),
        };
        if let toml::de::DeValue::Table(inner) = value.get_ref() {
            index(&path, inner, line_at, lines);
        }
        lines.insert(path, line_at(key.span().start));
    }
}
