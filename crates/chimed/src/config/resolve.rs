//! From the command line and the config file to checked values, reading nothing but the file.
//!
//! Two layers, merged by figment: the file's values, then over them the flags that were given
//! (the flag layer holds only those, so an unset flag hides nothing). figment keeps each value's
//! provenance, so a value out of range is reported against the flag that gave it or against the
//! file and line. Built-in defaults fill what neither gave, here and nowhere else. Every value is
//! checked, also those of a service that is off, so that a bad one is found when the file is
//! written, not the day the service is turned on.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::CommandFactory;
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use chime_ntp::RateLimit;
use chime_roughtime::Grease;
use chime_udp::ShedConfig;

use super::schema::{self, Args, Config};
use super::{ConfigError, From, Given, Input, KeyFile, NtsSet, RateLimiting, RoughtimeSet};
use super::{Settings, TcpLimits, Xdp};
use crate::access::acl::Acl;

/// Settings checked, with the files they name not yet read: `secrets` reads them.
pub(super) struct Resolved {
    /// Everything but `nts`, `nts_fleet` and `roughtime`, which `secrets` fills.
    pub(super) settings: Settings,
    pub(super) nts: Option<NtsSet>,
    /// The fleet secret's file and the period of each key.
    pub(super) fleet: Option<(PathBuf, Duration)>,
    pub(super) roughtime: Option<RoughtimeSet>,
    pub(super) sources: Sources,
}

/// Where each value came from.
pub(super) struct Sources {
    figment: Figment,
    file: Option<PathBuf>,
    /// Each key's line in the file, by dotted path.
    lines: HashMap<String, usize>,
}

const FLAGS: &str = "flags";
const FILE: &str = "config file";

impl Sources {
    /// The input that set `key` (its dotted path), or its default if none did.
    pub(super) fn input(&self, key: &'static str) -> Input {
        let from = match (self.figment.find_metadata(key), &self.file) {
            (Some(m), _) if m.name == FLAGS => From::Flag(flag_of(key)),
            (Some(_), Some(path)) => From::File {
                path: path.clone(),
                line: self.lines.get(key).copied(),
            },
            _ => From::Default,
        };
        Input { key, from }
    }

    /// An error about `key`'s value, naming where it came from.
    pub(super) fn bad(&self, key: &'static str, reason: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            input: self.input(key),
            reason: reason.to_string(),
        }
    }

    /// An error about `key`, which is missing: named where `given`, its partner, was given.
    fn missing(&self, key: &'static str, given: &'static str, reason: String) -> ConfigError {
        let mut input = self.input(given);
        input.from = match input.from {
            From::Flag(_) => From::Flag(flag_of(key)),
            from => from,
        };
        input.key = key;
        ConfigError::Invalid { input, reason }
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

/// One layer for figment: a name for provenance and the values it gave, `None`s left out.
struct Layer(&'static str, Dict);

impl Layer {
    fn of(name: &'static str, config: &Config) -> Result<Self, ConfigError> {
        let value = Value::serialize(config).map_err(|e| ConfigError::Merge(e.to_string()))?;
        Ok(Self(name, prune(value).into_dict().unwrap_or_default()))
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

/// Drops what was not given (`None` serialises as empty) and tables left empty by that.
fn prune(value: Value) -> Value {
    match value {
        Value::Dict(tag, dict) => Value::Dict(
            tag,
            (dict.into_iter())
                .map(|(k, v)| (k, prune(v)))
                .filter(|(_, v)| !matches!(v, Value::Empty(..)))
                .filter(|(_, v)| !matches!(v, Value::Dict(_, d) if d.is_empty()))
                .collect(),
        ),
        other => other,
    }
}

/// Every dotted key `table` sets and its value, as TOML writes it.
fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, String)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(inner) => flatten(&key, inner, out),
            value => out.push((key, value.to_string())),
        }
    }
}

/// Merges the file and the flags, then checks every value.
pub(super) fn resolve(args: &Args) -> Result<Resolved, ConfigError> {
    let (file, lines) = match &args.config {
        Some(path) => read(path)?,
        None => (Config::default(), HashMap::new()),
    };
    let figment = Figment::new()
        .merge(Layer::of(FILE, &file)?)
        .merge(Layer::of(FLAGS, &args.values)?);
    // Both layers are the schema's own values already, so this cannot find a wrong type.
    let c: Config = figment
        .extract()
        .map_err(|e| ConfigError::Merge(e.to_string()))?;
    let mut given = Vec::new();
    let table = toml::Table::try_from(&c).map_err(|e| ConfigError::Merge(e.to_string()))?;
    flatten("", &table, &mut given);
    let sources = Sources {
        figment,
        file: args.config.clone(),
        lines,
    };
    let nts = nts(&c.nts, &sources)?;
    let fleet = fleet(&c.nts, &sources)?;
    let roughtime = roughtime(&c.roughtime, &sources)?;
    let mut settings = base(&c, &sources, nts.as_ref())?;
    settings.given = Given(given);
    Ok(Resolved {
        settings,
        nts,
        fleet,
        roughtime,
        sources,
    })
}

/// The settings of no single service: NTP, upstream, process, access, logs.
fn base(c: &Config, s: &Sources, nts: Option<&NtsSet>) -> Result<Settings, ConfigError> {
    let ntp = &c.ntp;
    let (ipv4_threads, ipv6_threads) = (or(ntp.ipv4_threads, 1), or(ntp.ipv6_threads, 1));
    // A member may serve NTS-KE alone, sending clients to the fleet's NTP servers.
    let ke_only = nts.is_some_and(|n| n.ntp_server.is_some());
    if ipv4_threads + ipv6_threads == 0 && !ke_only {
        let r = "no NTP threads: set ipv4-threads or ipv6-threads (or serve NTS-KE only, with \
                 nts.ntp-server naming the NTP servers)";
        return Err(s.bad("ntp.ipv4-threads", r));
    }
    let (poll_interval, stale_after) = upstream(&c.upstream, s)?;
    let stats = or(c.observe.stats_interval, DEFAULT_STATS_INTERVAL);
    let log_level = c.observe.log_level.clone().unwrap_or_else(|| "info".into());
    if log_level.parse::<tracing_subscriber::EnvFilter>().is_err() {
        let r = format!("'{log_level}' is not a log level or filter");
        return Err(s.bad("observe.log-level", r));
    }
    if let Some(root) = c.process.root.as_ref().filter(|r| !r.is_absolute()) {
        let r = format!("{} is not an absolute path", root.display());
        return Err(s.bad("process.root", r));
    }
    let tz = &c.tz_offset;
    if tz.enabled != Some(true) && tz.timezone.is_some() {
        let on = s.like("tz-offset.timezone", "tz-offset.enabled");
        let r = format!("only takes effect with {on}; set both");
        return Err(s.bad("tz-offset.timezone", r));
    }
    let empty = Vec::new();
    Ok(Settings {
        ipv4_threads,
        ipv6_threads,
        ipv4_address: address(ntp.ipv4_address, NTP_V4, "ntp.ipv4-address", s)?,
        ipv6_address: address(ntp.ipv6_address, NTP_V6, "ntp.ipv6-address", s)?,
        server_address: (c.upstream.server_address).unwrap_or((Ipv4Addr::LOCALHOST, 11123).into()),
        user: c.process.user.clone(),
        root: c.process.root.clone(),
        poll_interval,
        stale_after,
        recv_buffer: or(ntp.recv_buffer, DEFAULT_NTP_RECV_BUFFER),
        batch_size: or(ntp.batch_size, DEFAULT_BATCH),
        shed: shed(&c.overload),
        cpus: c.process.cpus.clone().unwrap_or_default(),
        xdp: xdp(&c.xdp, s)?,
        stats_interval: (stats > 0.0).then(|| Duration::from_secs_f64(stats)),
        metrics_address: c.observe.metrics_address,
        acl: access(
            c.access.allow.as_ref().unwrap_or(&empty),
            c.access.deny.as_ref().unwrap_or(&empty),
            s,
        )?,
        ratelimit: ntp_rate_limit(&c.ratelimit, s)?,
        interleaved_log: or(ntp.interleaved_log, DEFAULT_INTERLEAVED_LOG),
        nts: None,
        nts_fleet: None,
        log_level,
        tz_offset: (tz.enabled == Some(true)).then(|| tz.timezone.clone()),
        roughtime: None,
        given: Given::default(),
    })
}

/// `[upstream]`'s poll interval and staleness limit.
fn upstream(u: &schema::Upstream, s: &Sources) -> Result<(Duration, Duration), ConfigError> {
    let poll = or(u.poll_interval, DEFAULT_POLL_INTERVAL);
    let stale = or(u.stale_after, DEFAULT_STALE_AFTER);
    if stale <= poll {
        let r = format!("{stale} s must be longer than the poll interval ({poll} s)");
        return Err(s.bad("upstream.stale-after", r));
    }
    Ok((
        Duration::from_secs_f64(poll),
        Duration::from_secs_f64(stale),
    ))
}

/// `[overload]`: shedding, on unless shed-target is 0.
fn shed(o: &schema::Overload) -> Option<ShedConfig> {
    let target = or(o.shed_target, DEFAULT_SHED_TARGET);
    (target > 0.0).then(|| ShedConfig {
        target: Duration::from_secs_f64(target),
        interval: Duration::from_secs_f64(or(o.shed_interval, DEFAULT_SHED_INTERVAL)),
    })
}

/// `[xdp]`. An option without an interface is an error rather than silently ignored.
fn xdp(x: &schema::Xdp, s: &Sources) -> Result<Option<Xdp>, ConfigError> {
    let Some(interface) = x.interface.clone() else {
        let given = [
            (x.threads.is_some(), "xdp.threads"),
            (x.mode.is_some(), "xdp.mode"),
            (x.fallback == Some(true), "xdp.fallback"),
        ];
        return match given.into_iter().find(|(set, _)| *set) {
            Some((_, key)) => {
                let r = format!("has no effect without {}", s.like(key, "xdp.interface"));
                Err(s.bad(key, r))
            }
            None => Ok(None),
        };
    };
    if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ', '\0']) {
        let r = format!("{interface:?} is not an interface name");
        return Err(s.bad("xdp.interface", r));
    }
    let mode = match x.mode.as_deref() {
        None | Some("auto") => None,
        Some("copy") => Some(chime_udp::xdp::XdpMode::Copy),
        Some("zero-copy") => Some(chime_udp::xdp::XdpMode::ZeroCopy),
        Some(other) => {
            let r = format!("{other:?} is not auto, copy or zero-copy");
            return Err(s.bad("xdp.mode", r));
        }
    };
    Ok(Some(Xdp {
        interface,
        threads: or(x.threads, 1),
        mode,
        fallback: x.fallback.unwrap_or(false),
    }))
}

/// The access rules. Each list is parsed alone, so that an error names the one at fault;
/// together they cannot fail once each has parsed.
fn access(allow: &[String], deny: &[String], s: &Sources) -> Result<Acl, ConfigError> {
    Acl::new(allow, &[]).map_err(|r| s.bad("access.allow", r))?;
    Acl::new(&[], deny).map_err(|r| s.bad("access.deny", r))?;
    Acl::new(allow, deny).map_err(|r| s.bad("access.allow", r))
}

/// `[ratelimit]`: chronyd's `ratelimit`.
fn ntp_rate_limit(r: &schema::RateLimit, s: &Sources) -> Result<Option<RateLimiting>, ConfigError> {
    let keys = [
        "ratelimit.interval",
        "ratelimit.burst",
        "ratelimit.leak",
        "ratelimit.kod",
    ];
    let values = [r.interval, r.burst, r.leak, r.kod];
    let on = (r.enabled, "ratelimit.enabled");
    let also = r.clients.map(|_| "ratelimit.clients");
    let limit = rate_limit(on, keys, values, also, RateLimit::DEFAULT, s)?;
    let clients = or(r.clients, DEFAULT_RATELIMIT_CLIENTS);
    Ok(limit.map(|limit| RateLimiting { limit, clients }))
}

/// `[nts.ratelimit]`: chronyd's `ntsratelimit` (interval 6, one per 64 s, by default; no
/// Kiss-o'-Death on a TCP connection).
fn nts_rate_limit(
    r: &schema::NtsRateLimit,
    s: &Sources,
) -> Result<Option<RateLimiting>, ConfigError> {
    let keys = [
        "nts.ratelimit.interval",
        "nts.ratelimit.burst",
        "nts.ratelimit.leak",
        "nts.ratelimit.kod",
    ];
    let on = (r.enabled, "nts.ratelimit.enabled");
    let default = RateLimit::new(6, 8, 2, 0).expect("in range");
    let limit = rate_limit(
        on,
        keys,
        [r.interval, r.burst, r.leak, None],
        None,
        default,
        s,
    )?;
    let clients = DEFAULT_NTS_RATELIMIT_CLIENTS;
    Ok(limit.map(|limit| RateLimiting { limit, clients }))
}

/// A rate limit from its interval, burst, leak and kod (`keys`, `values`), if `on`. A value
/// without the limit itself on (or `also`, another key given) is an error rather than silently
/// ignored; one out of range names its key and the range.
fn rate_limit(
    (on, on_key): (Option<bool>, &'static str),
    keys: [&'static str; 4],
    values: [Option<i64>; 4],
    also: Option<&'static str>,
    d: RateLimit,
    s: &Sources,
) -> Result<Option<RateLimit>, ConfigError> {
    if on != Some(true) {
        let given = keys.into_iter().zip(values).find_map(|(k, v)| v.map(|_| k));
        return match given.or(also) {
            Some(key) => {
                let r = format!("only takes effect with {}; set both", s.like(key, on_key));
                Err(s.bad(key, r))
            }
            None => Ok(None),
        };
    }
    let defaults = [
        i64::from(d.interval()),
        d.burst().into(),
        d.leak().into(),
        d.kod().into(),
    ];
    let v: [i64; 4] = std::array::from_fn(|i| values[i].unwrap_or(defaults[i]));
    let limit = RateLimit::new(v[0], v[1], v[2], v[3]).map_err(|e| {
        let key = keys
            .into_iter()
            .find(|k| k.rsplit('.').next() == Some(e.option));
        let r = format!("must be {} to {}, not {}", e.min, e.max, e.value);
        s.bad(key.unwrap_or(keys[0]), r)
    })?;
    Ok(Some(limit))
}

/// `[nts]`, but its fleet key: NTS-KE and NTS if a certificate and key are given.
fn nts(n: &schema::Nts, s: &Sources) -> Result<Option<NtsSet>, ConfigError> {
    let rotation = or(n.rotation, DEFAULT_ROTATION);
    let ratelimit = nts_rate_limit(&n.ratelimit, s)?;
    let (ntp_server, ntp_port) = match n.ntp_server.as_deref().map(split_ntp_server) {
        None => (None, None),
        Some(Ok((server, port))) => (Some(server), port),
        Some(Err(r)) => return Err(s.bad("nts.ntp-server", r)),
    };
    let (c, k) = ("nts.certificate", "nts.private-key");
    let (certificate, private_key) = match (n.certificate.clone(), n.private_key.clone()) {
        (Some(c), Some(k)) => (c, k),
        (Some(_), None) => {
            let r = format!("missing: {} needs its private key", s.like(c, c));
            return Err(s.missing("nts.private-key", c, r));
        }
        (None, Some(_)) => {
            let r = format!("missing: {} needs its certificate", s.like(k, k));
            return Err(s.missing("nts.certificate", k, r));
        }
        (None, None) => {
            let given = [
                (n.ke_address.is_some(), "nts.ke-address"),
                (n.ke_threads.is_some(), "nts.ke-threads"),
                (
                    n.rotation.is_some() && n.fleet_key.is_none(),
                    "nts.rotation",
                ),
                (n.dump_dir.is_some(), "nts.dump-dir"),
                (n.ntp_server.is_some(), "nts.ntp-server"),
                (ratelimit.is_some(), "nts.ratelimit.enabled"),
            ];
            if let Some((_, key)) = given.into_iter().find(|(set, _)| *set) {
                let r = format!(
                    "only takes effect with {} and {}",
                    s.like(key, c),
                    s.like(key, k)
                );
                return Err(s.bad(key, r));
            }
            return Ok(None);
        }
    };
    Ok(Some(NtsSet {
        certificate,
        private_key,
        dump_dir: n.dump_dir.clone(),
        ke_address: n.ke_address.unwrap_or((Ipv6Addr::UNSPECIFIED, 4460).into()),
        ke_threads: or(n.ke_threads, 1),
        rotation: Duration::from_secs_f64(rotation),
        ratelimit,
        ntp_server,
        ntp_port,
    }))
}

/// `[nts] fleet-key`: cookie keys from a fleet secret, with or without NTS-KE (a member with no
/// certificate answers authenticated NTP with cookies other members handed out).
fn fleet(n: &schema::Nts, s: &Sources) -> Result<Option<(PathBuf, Duration)>, ConfigError> {
    let Some(path) = n.fleet_key.clone() else {
        return Ok(None);
    };
    if n.dump_dir.is_some() {
        let r = format!(
            "not with {}: fleet keys are derived from the secret whenever needed, never saved",
            s.like("nts.fleet-key", "nts.dump-dir")
        );
        return Err(s.bad("nts.fleet-key", r));
    }
    let rotation = or(n.rotation, DEFAULT_ROTATION);
    Ok(Some((path, Duration::from_secs_f64(rotation))))
}

/// `[roughtime]`: on with a long-term key or a delegation bundle.
fn roughtime(r: &schema::Roughtime, s: &Sources) -> Result<Option<RoughtimeSet>, ConfigError> {
    let (ipv4_threads, ipv6_threads) = (or(r.ipv4_threads, 1), or(r.ipv6_threads, 1));
    let ipv4_address = address(r.ipv4_address, ROUGHTIME_V4, "roughtime.ipv4-address", s)?;
    let ipv6_address = address(r.ipv6_address, ROUGHTIME_V6, "roughtime.ipv6-address", s)?;
    let gather = or(r.gather, DEFAULT_GATHER);
    let grease_kinds = match &r.grease_kinds {
        None => Grease::ALL.to_vec(),
        Some(list) => parse_grease_kinds(list).map_err(|e| s.bad("roughtime.grease-kinds", e))?,
    };
    let tcp = tcp_limits(&r.tcp);
    if r.mldsa_key.is_some() && !cfg!(feature = "mldsa") {
        let e = "the experimental ML-DSA-44 suite is not in this chimed: build it with \
                 `--features mldsa`";
        return Err(s.bad("roughtime.mldsa-key", e));
    }
    if r.mldsa_key.is_some() && tcp.is_none() {
        let tcp = s.like("roughtime.mldsa-key", "roughtime.tcp.connections");
        let e = format!("the ML-DSA-44 suite is TCP only, and {tcp} is 0");
        return Err(s.bad("roughtime.mldsa-key", e));
    }
    let key = match (r.key.clone(), r.delegation.clone()) {
        (Some(_), Some(_)) => {
            let e = format!(
                "not with {}: a server holds the long-term key or a bundle of delegations from \
                 it, not both",
                s.like("roughtime.delegation", "roughtime.key")
            );
            return Err(s.bad("roughtime.delegation", e));
        }
        (Some(file), None) => KeyFile::LongTerm(file),
        (None, Some(file)) => KeyFile::Bundle(file),
        (None, None) if r.mldsa_key.is_some() => {
            let at = "roughtime.mldsa-key";
            let (k, d) = (
                s.like(at, "roughtime.key"),
                s.like(at, "roughtime.delegation"),
            );
            let e = format!("serves beside the Ed25519 suite: give {k} or {d}");
            return Err(s.bad(at, e));
        }
        (None, None) => return Ok(None),
    };
    if ipv4_threads + ipv6_threads == 0 {
        return Err(s.bad("roughtime.ipv4-threads", "no Roughtime threads"));
    }
    Ok(Some(RoughtimeSet {
        key,
        mldsa_key: r.mldsa_key.clone(),
        ipv4_threads,
        ipv6_threads,
        ipv4_address,
        ipv6_address,
        rotation: Duration::from_secs_f64(or(r.rotation, DEFAULT_ROTATION)),
        batch_size: or(r.batch_size, DEFAULT_ROUGHTIME_BATCH),
        recv_buffer: or(r.recv_buffer, DEFAULT_ROUGHTIME_RECV_BUFFER),
        gather: (gather > 0.0).then(|| Duration::from_secs_f64(gather)),
        grease: or(r.grease, 0.0),
        grease_kinds,
        tcp,
    }))
}

/// `[roughtime.tcp]`; `None`: UDP only.
fn tcp_limits(t: &schema::RoughtimeTcp) -> Option<TcpLimits> {
    let connections = or(t.connections, DEFAULT_TCP_CONNECTIONS);
    (connections > 0).then(|| TcpLimits {
        connections,
        per_address: or(t.per_address, DEFAULT_TCP_PER_ADDRESS),
        idle: Duration::from_secs_f64(or(t.idle, DEFAULT_TCP_IDLE)),
        lifetime: Duration::from_secs_f64(or(t.lifetime, DEFAULT_TCP_LIFETIME)),
    })
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

/// The addresses served on by default: every address of the family, the service's port.
const NTP_V4: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 123);
const NTP_V6: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 123);
const ROUGHTIME_V4: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 5319);
const ROUGHTIME_V6: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 5319);

/// The address `key` gives, else `default`; either way of `default`'s family.
fn address(
    given: Option<SocketAddr>,
    default: SocketAddr,
    key: &'static str,
    s: &Sources,
) -> Result<SocketAddr, ConfigError> {
    let a = given.unwrap_or(default);
    if a.is_ipv4() != default.is_ipv4() {
        let family = if default.is_ipv4() { "IPv4" } else { "IPv6" };
        return Err(s.bad(key, format!("{a} is not an {family} address")));
    }
    Ok(a)
}

/// `[nts] ntp-server = "NAME[:PORT]"`: the name (an IP address or a domain name) and the port if
/// one follows; an IPv6 address takes brackets when it does (`[2001:db8::1]:123`).
pub(super) fn split_ntp_server(value: &str) -> Result<(String, Option<u16>), String> {
    let (name, port) = match value.strip_prefix('[') {
        Some(rest) => {
            let (name, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("{value:?}: no ] after the IPv6 address"))?;
            match after {
                "" => (name, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (name, Some(port)),
                    None => return Err(format!("{value:?}: only :PORT may follow ]")),
                },
            }
        }
        // One colon is a port; more are an IPv6 address without one.
        None => match value.split_once(':') {
            Some((name, port)) if !port.contains(':') => (name, Some(port)),
            _ => (value, None),
        },
    };
    if !chime_ntp::nts::valid_ntp_server(name) {
        return Err(format!(
            "{name:?} is not an IP address or a domain name (letters, digits, hyphens and dots)"
        ));
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("{p:?} is not a port (1 to 65535)"))?,
        ),
    };
    Ok((name.to_owned(), port))
}

/// Cookie keys and Roughtime online keys: rotated daily.
const DEFAULT_ROTATION: f64 = 86_400.0;
/// --interleaved-log's default: 65536 transmit times, 1 MiB, as many interleaved clients as
/// poll within one of their poll intervals.
const DEFAULT_INTERLEAVED_LOG: usize = 1 << 16;

/// --ratelimit-clients' default: 65536 addresses, 2 MiB.
const DEFAULT_RATELIMIT_CLIENTS: usize = 1 << 16;
/// How many addresses NTS-KE rate limiting tracks: 16384, 256 KiB. A client runs NTS-KE once
/// per association, so these are the addresses that connected in the last minutes.
const DEFAULT_NTS_RATELIMIT_CLIENTS: usize = 16_384;

const DEFAULT_POLL_INTERVAL: f64 = 1.0;
const DEFAULT_STALE_AFTER: f64 = 8.0;
const DEFAULT_BATCH: usize = 64;
/// --roughtime-batch-size's default: the most a tree may hold. Batches fill only under load,
/// where one signature over 256 requests instead of 64 saves about a sixth of the CPU per reply
/// (7.31 against 6.13-6.15 µs, loopback, one core, 130k requests/s); a full batch is about 1.5 ms
/// of work, nothing beside a radius of seconds.
const DEFAULT_ROUGHTIME_BATCH: usize = chime_roughtime::MAX_BATCH_SIZE;
/// --recv-buffer's default, 4 MiB (the kernel counts 8 against it). A 48-byte request takes
/// 832 bytes of socket buffer on loopback, so this holds some 10,000: 40 ms at 250k/s, where the
/// kernel's usual 208 KiB holds about 250, a millisecond. A request that waits in the queue loses
/// no accuracy: its receive time is the kernel's timestamp, taken on arrival, and the client takes
/// the wait out as the server's T3 - T2. A dropped one costs the client a poll. (rsntp reads the
/// clock after the queue, so a queue there would be an error.)
const DEFAULT_NTP_RECV_BUFFER: usize = 4 << 20;
/// --roughtime-recv-buffer's default, 16 MiB (the kernel counts 32 against it). A 1 KiB request
/// takes about 2.3 KiB of socket buffer, so this holds some 14,000 requests: 70 ms at 200k/s,
/// 150 ms at 100k/s. On a shared machine a thread falls behind for tens of milliseconds now and
/// then, even at half load: at 4 MiB chimed dropped 0.4-1.9% in 4 of 12 two-second steps at
/// 92-112k/s on a whole core it used only 50-70% of (p99 round trip 30-55 ms in those steps: the
/// queue at its limit); at 16 MiB, in none. A queued request waits, which costs a Roughtime client nothing beside a
/// radius of seconds; a dropped one costs it a retry. Under sustained overload the deeper queue
/// adds latency (replies ~130 ms late at half a core), not throughput: 78-95k/s answered either way.
const DEFAULT_ROUGHTIME_RECV_BUFFER: usize = 16 << 20;
const DEFAULT_STATS_INTERVAL: f64 = 60.0;
/// --shed-target's default, CoDel's: see DEFAULT_SHED_INTERVAL.
const DEFAULT_SHED_TARGET: f64 = 0.005;
/// --shed-interval's default, CoDel's.
const DEFAULT_SHED_INTERVAL: f64 = 0.1;
/// --roughtime-tcp-connections: a thousand clients at once is more than Roughtime's query pattern
/// (one connection, one or a few requests) brings to a server, and costs a few MiB at most.
const DEFAULT_TCP_CONNECTIONS: usize = 1024;
/// --roughtime-tcp-per-address: room for clients behind one NAT, none for one host to hold all.
const DEFAULT_TCP_PER_ADDRESS: usize = 16;
/// --roughtime-tcp-idle and --roughtime-tcp-lifetime, in seconds.
const DEFAULT_TCP_IDLE: f64 = 10.0;
const DEFAULT_TCP_LIFETIME: f64 = 60.0;
/// --roughtime-gather's default: 2 ms gave batches of ~140 requests at 40k/s (mean Merkle path
/// 7.1 hashes, against 5.8 at 0.5 ms), and is nothing beside a radius of seconds. Against 0.5 ms (alternating, 3 rounds): CPU per reply
/// 6.5-6.8 µs against 7.8-8.2 at 40k/s, 2-4% less at 80-120k/s, the same at 160k/s, where the
/// load check turns gathering off; median round trip ~1.9 ms against ~0.6 ms at 40k/s.
const DEFAULT_GATHER: f64 = 0.002;

/// --roughtime-grease-kinds: comma-separated [`Grease`] labels, at least one, no repeats.
fn parse_grease_kinds(list: &str) -> Result<Vec<Grease>, String> {
    let mut kinds = Vec::new();
    for name in list.split(',').map(str::trim) {
        let kind = Grease::ALL
            .into_iter()
            .find(|k| k.label() == name)
            .ok_or_else(|| {
                let known: Vec<_> = Grease::ALL.iter().map(|k| k.label()).collect();
                format!("{name:?} is not a kind of grease ({})", known.join(", "))
            })?;
        if kinds.contains(&kind) {
            return Err(format!("{name} is listed twice"));
        }
        kinds.push(kind);
    }
    Ok(kinds)
}

/// A checked value of the schema's, else `default`.
fn or<T: Into<I>, I>(value: Option<T>, default: I) -> I {
    value.map_or(default, Into::into)
}
