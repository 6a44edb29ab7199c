//! From the command line and the config file to checked settings, reading nothing but the file.
//!
//! Three layers, merged by figment: the defaults, the file's values over them, then the flags
//! that were given (the flag layer holds only those, so an unset flag hides nothing). figment
//! keeps each value's provenance, so an error is reported against the flag that gave the value,
//! the file and line, or the default. Each value was checked as it was parsed (`values`); here
//! only the rules between keys are. A key that only takes effect with another is refused without
//! it, rather than ignored, and a key of a service that is off is checked all the same, so that a
//! bad value is found when the file is written, not the day the service is turned on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::schema::{Args, Config};
use super::{ConfigError, From, Input, Settings};
use crate::access::acl::Acl;

/// Where each value came from.
#[derive(Debug)]
pub(crate) struct Sources {
    figment: Figment,
    defaults: Value,
    file: Option<PathBuf>,
    /// Each key's line in the file, by dotted path.
    lines: HashMap<String, usize>,
}

const DEFAULTS: &str = "defaults";
const FILE: &str = "config file";
const FLAGS: &str = "flags";

impl Sources {
    /// The input that set `key` (its dotted path), or its default if none did.
    pub(crate) fn input(&self, key: &'static str) -> Input {
        let from = match (self.figment.find_metadata(key), &self.file) {
            (Some(m), _) if m.name == FLAGS => From::Flag(flag_of(key)),
            (Some(m), Some(path)) if m.name == FILE => From::File {
                path: path.clone(),
                line: self.lines.get(key).copied(),
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
        self.figment
            .find_metadata(key)
            .is_some_and(|m| m.name != DEFAULTS)
    }

    /// Whether the file or a flag gave `key` a value other than its default.
    fn changed(&self, key: &str) -> bool {
        let default = self.defaults.find_ref(key);
        self.given(key) && self.figment.find_value(key).ok().as_ref() != default
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

/// One layer for figment: a name for provenance and the values it gave.
struct Layer(&'static str, Dict);

impl Layer {
    /// The values of `config` at `keys` (dotted paths), or all of them.
    fn of(
        name: &'static str,
        config: &Config,
        keys: Option<&[String]>,
    ) -> Result<Self, ConfigError> {
        let value = Value::serialize(config).map_err(|e| ConfigError::Merge(e.to_string()))?;
        let mut dict = Dict::new();
        for key in keys.map_or_else(|| value_keys(&value), <[String]>::to_vec) {
            let leaf = |v: &&Value| !matches!(v, Value::Empty(..) | Value::Dict(..));
            if let Some(v) = value.find_ref(&key).filter(leaf) {
                nest(&mut dict, &key, v.clone());
            }
        }
        Ok(Self(name, dict))
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.0)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.1.clone()))
    }
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

/// Puts `value` at the dotted path `key` in `dict`, making the tables on the way.
fn nest(dict: &mut Dict, key: &str, value: Value) {
    match key.split_once('.') {
        None => {
            dict.insert(key.to_owned(), value);
        }
        Some((head, rest)) => {
            let inner = dict
                .entry(head.to_owned())
                .or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = inner {
                nest(inner, rest, value);
            }
        }
    }
}

/// Merges the defaults, the file and the flags, then checks the rules between keys.
pub(super) fn resolve(args: &Args) -> Result<Settings, ConfigError> {
    let (file, lines) = match &args.config {
        Some(path) => read(path)?,
        None => (Config::default(), HashMap::new()),
    };
    let in_file: Vec<String> = lines.keys().cloned().collect();
    let defaults =
        Value::serialize(Config::default()).map_err(|e| ConfigError::Merge(e.to_string()))?;
    let figment = Figment::new()
        .merge(Layer::of(DEFAULTS, &Config::default(), None)?)
        .merge(Layer::of(FILE, &file, Some(&in_file))?)
        .merge(Layer::of(FLAGS, &args.values, Some(&args.given))?);
    // Every layer holds the schema's own values already, so this cannot find a wrong type.
    let config: Config = figment
        .extract()
        .map_err(|e| ConfigError::Merge(e.to_string()))?;
    let sources = Sources {
        figment,
        defaults,
        file: args.config.clone(),
        lines,
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
const NEEDS: [(&[&str], &[&str]); 8] = [
    (
        &["ratelimit.enabled"],
        &[
            "ratelimit.interval",
            "ratelimit.burst",
            "ratelimit.leak",
            "ratelimit.kod",
        ],
    ),
    (&["ratelimit.enabled"], &["ratelimit.clients"]),
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
        &["xdp.threads", "xdp.mode", "xdp.fallback"],
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
    let on = |key: &str| (s.figment.find_value(key)).is_ok_and(|v| v.to_bool() != Some(false));
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
fn read(path: &Path) -> Result<(Config, HashMap<String, usize>), ConfigError> {
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
    let config: Config = toml::from_str(&text).map_err(|e| one_line(e, &lines))?;
    Ok((config, lines))
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
