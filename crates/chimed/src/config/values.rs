//! Values that are checked where they are parsed: by clap for a flag (so the error names the flag)
//! and by serde for the file (so it names the file and line). Each range or form and its message
//! is written once, here, beside what it accepts in words (`Accepts`), which the reference prints
//! (`docs`); `resolve` keeps only the rules between keys.

use std::any::TypeId;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use chime_ntp::RateLimit;
use chime_roughtime::Grease;
use clap::ValueEnum as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value out of its range, or not a value of its type at all. `daemon` prints the first as
/// `--flag: reason`, as it prints an error `resolve` finds, and leaves the second to clap.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Bad {
    #[error("{0}")]
    Range(String),
    #[error("{0}")]
    Parse(String),
}

/// What a setting accepts, in the words the reference (`docs`) prints beside its default.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Accepts {
    /// Whole numbers from `min` to `max`, or without limit above.
    Whole { min: i64, max: Option<i64> },
    /// Seconds, fractions too, from 0 (or from just above it) to `max`.
    Seconds { above_zero: bool, max: f64 },
    /// A share, from 0 to 1.
    Share,
    /// `true` or `false`.
    Switch,
    /// A string of a form said in words.
    Text(String),
    /// Any string (the help says what it is).
    AnyText,
}

impl Accepts {
    /// How a value is written in the config file: `a number`, `true or false`, `a string`.
    pub(crate) fn toml_type(&self) -> &'static str {
        match self {
            Self::Whole { .. } | Self::Seconds { .. } | Self::Share => "a number",
            Self::Switch => "true or false",
            Self::Text(_) | Self::AnyText => "a string",
        }
    }
}

impl fmt::Display for Accepts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Whole {
                min,
                max: Some(max),
            } => write!(f, "{min} to {max}"),
            Self::Whole { min, max: None } => write!(f, "{min} or more"),
            Self::Seconds {
                above_zero: false,
                max,
            } => write!(f, "0 to {max} s"),
            Self::Seconds {
                above_zero: true,
                max,
            } => write!(f, "more than 0, up to {max} s"),
            Self::Share => f.write_str("0 to 1"),
            Self::Switch => f.write_str("`true`, `false`"),
            Self::Text(words) => f.write_str(words),
            Self::AnyText => f.write_str("a string"),
        }
    }
}

/// What a flag parsed by `parsed_as` accepts, for every type the schema uses; `None` for a type
/// that has no words here yet (a unit test finds it).
pub(crate) fn accepts(parsed_as: &clap::builder::ValueParser) -> Option<Accepts> {
    let id = parsed_as.type_id();
    let words = if id == TypeId::of::<bool>() {
        Accepts::Switch
    } else if id == TypeId::of::<usize>() {
        Accepts::Whole { min: 0, max: None }
    } else if id == TypeId::of::<SocketAddr>() {
        text("an IP address and port (an IPv6 address in brackets)")
    } else if id == TypeId::of::<PathBuf>() {
        text("a path")
    } else if id == TypeId::of::<String>() {
        Accepts::AnyText
    } else if id == TypeId::of::<XdpMode>() {
        let names = XdpMode::value_variants()
            .iter()
            .filter_map(|m| m.to_possible_value());
        let names: Vec<_> = names.map(|v| format!("`{}`", v.get_name())).collect();
        text(&names.join(", "))
    } else {
        return accepts_checked(parsed_as);
    };
    Some(words)
}

/// Declares `Name(inner)`, valid where `check` gives `Ok`, readable from a flag and from the file,
/// and what it accepts in words (`Name::accepts`), for the reference. The two are written side by
/// side and a unit test holds them together at each range's ends.
macro_rules! checked {
    ($($(#[$doc:meta])* $name:ident($inner:ty) in $accepts:expr => |$v:ident| $check:expr;)*) => {
        $(
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq)]
        pub(crate) struct $name(pub(crate) $inner);

        impl $name {
            fn checked($v: $inner) -> Result<Self, String> {
                let checked: Result<(), String> = $check;
                checked.map(|()| Self($v))
            }

            /// The values it accepts, as the reference says them.
            pub(crate) fn accepts() -> Accepts {
                $accepts
            }
        }

        impl FromStr for $name {
            type Err = Bad;
            fn from_str(s: &str) -> Result<Self, Bad> {
                let v = s.parse::<$inner>().map_err(|e| Bad::Parse(e.to_string()))?;
                Self::checked(v).map_err(Bad::Range)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Self::checked(<$inner>::deserialize(d)?).map_err(serde::de::Error::custom)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.0.serialize(s)
            }
        }
        )*

        /// Each checked type by name, what it accepts, and whether a text parses as it: for the
        /// test that the words and the check agree.
        #[cfg(test)]
        pub(crate) fn checked_types() -> Vec<(&'static str, Accepts, fn(&str) -> bool)> {
            vec![$((stringify!($name), $name::accepts(), |s| s.parse::<$name>().is_ok())),*]
        }

        /// What a value parsed as `T` accepts, for the checked types.
        fn accepts_checked(parsed_as: &clap::builder::ValueParser) -> Option<Accepts> {
            $(if parsed_as.type_id() == TypeId::of::<$name>() {
                return Some($name::accepts());
            })*
            None
        }
    };
}

checked! {
    /// Worker threads of one service on one address family; 0 turns that family off.
    Threads(usize) in whole(0, MAX_THREADS)
        => |n| at_most(n, MAX_THREADS, "threads is more than the limit of");
    /// `ntp.batch-size`.
    NtpBatch(usize) in whole(1, MAX_NTP_BATCH)
        => |n| within(n, 1, MAX_NTP_BATCH, format!("batch size {n}"));
    /// `roughtime.batch-size`: the most one signature covers.
    RoughtimeBatch(usize) in whole(1, chime_roughtime::MAX_BATCH_SIZE)
        => |n| within(n, 1, chime_roughtime::MAX_BATCH_SIZE, format!("batch size {n}"));
    /// A socket's receive buffer in bytes.
    RecvBuffer(usize) in whole(MIN_RECV_BUFFER, MAX_RECV_BUFFER)
        => |n| within(n, MIN_RECV_BUFFER, MAX_RECV_BUFFER, format!("{n} bytes"));
    /// `ntp.interleaved-log`: transmit times kept; 0 turns interleaved mode off.
    TxLogSize(usize) in whole(0, chime_ntp::TxLog::MAX_ENTRIES)
        => |n| at_most(n, chime_ntp::TxLog::MAX_ENTRIES, "is more than");
    /// `ratelimit.clients`: the addresses one rate limit tracks.
    Clients(usize) in whole(4, chime_ntp::ClientTable::MAX_CLIENTS)
        => |n| within(n, 4, chime_ntp::ClientTable::MAX_CLIENTS, format!("{n} clients"));
    /// `nts.kept-keys`: earlier cookie keys kept, at least one so that a rotation cuts no client
    /// off.
    KeptKeys(usize) in whole(1, chime_ntp::nts::CookieKeys::MAX_KEPT)
        => |n| within(n, 1, chime_ntp::nts::CookieKeys::MAX_KEPT, format!("{n} keys"));
    /// `observe.client-log`: clients counted for `chime clients`; 0 turns the log off.
    ClientLogSize(usize) in whole(0, chime_ntp::ClientLog::MAX_CLIENTS)
        => |n| at_most(n, chime_ntp::ClientLog::MAX_CLIENTS, "is more than");
    /// `nts.ke-threads`: past the cores of any machine chimed runs on, handshakes only contend.
    KeThreads(usize) in whole(1, MAX_KE_THREADS)
        => |n| within(n, 1, MAX_KE_THREADS, format!("{n} threads"));
    /// `roughtime.tcp.connections`; 0 serves Roughtime over UDP only.
    TcpConnections(usize) in whole(0, MAX_TCP_CONNECTIONS)
        => |n| at_most(n, MAX_TCP_CONNECTIONS, "is more than");
    /// A count that cannot be 0: `xdp.threads`, `roughtime.tcp.per-address`.
    AtLeastOne(usize) in Accepts::Whole { min: 1, max: None }
        => |n| if n == 0 { Err("must be at least 1".into()) } else { Ok(()) };
    /// An interval that must pass between two things, so more than 0 and up to a day.
    Positive(f64) in Accepts::Seconds { above_zero: true, max: MAX_SECONDS }
        => |v| seconds(v, MAX_SECONDS).and_then(|()| match v > 0.0 {
        true => Ok(()),
        false => Err("must be more than 0 seconds".into()),
    });
    /// `observe.stats-interval`; 0 logs the statistics only at exit.
    Seconds(f64) in Accepts::Seconds { above_zero: false, max: MAX_SECONDS }
        => |v| seconds(v, MAX_SECONDS);
    /// `overload.shed-target`: beyond a second a request is stale for any client; 0 turns
    /// shedding off.
    ShedTarget(f64) in Accepts::Seconds { above_zero: false, max: MAX_SHED_TARGET }
        => |v| seconds(v, MAX_SHED_TARGET);
    /// `overload.shed-interval`: beyond ten seconds "standing" means little.
    ShedInterval(f64) in Accepts::Seconds { above_zero: false, max: MAX_SHED_INTERVAL }
        => |v| seconds(v, MAX_SHED_INTERVAL);
    /// `roughtime.gather`: beyond a tenth of a second it only adds delay.
    Gather(f64) in Accepts::Seconds { above_zero: false, max: MAX_GATHER }
        => |v| seconds(v, MAX_GATHER);
    /// `roughtime.grease`: a share of replies.
    Share(f64) in Accepts::Share => |v| match v.is_finite() && (0.0..=1.0).contains(&v) {
        true => Ok(()),
        false => Err(format!("{v} is not a share of replies between 0 and 1")),
    };
    /// A rate limit's log2 of the seconds between responses, in chronyd's range.
    Interval(i64) in range_of(RateLimit::new(i64::MIN, 8, 2, 0))
        => |v| limit(RateLimit::new(v, 8, 2, 0));
    /// A rate limit's burst.
    Burst(i64) in range_of(RateLimit::new(3, i64::MIN, 2, 0))
        => |v| limit(RateLimit::new(3, v, 2, 0));
    /// A rate limit's leak: one in 2^leak over the limit is served anyway.
    Leak(i64) in range_of(RateLimit::new(3, 8, i64::MIN, 0))
        => |v| limit(RateLimit::new(3, 8, v, 0));
    /// A rate limit's Kiss-o'-Death share.
    Kod(i64) in range_of(RateLimit::new(3, 8, 2, i64::MIN))
        => |v| limit(RateLimit::new(3, 8, 2, v));
    /// An IPv4 address and port.
    V4(SocketAddr) in text("an IPv4 address and port") => |a| family(a, true);
    /// An IPv6 address and port.
    V6(SocketAddr) in text("an IPv6 address in brackets and port") => |a| family(a, false);
    /// A log level or tracing filter.
    LogLevel(String) in text("`error`, `warn`, `info`, `debug`, `trace`, or a tracing filter")
        => |l| match l.parse::<tracing_subscriber::EnvFilter>() {
        Ok(_) => Ok(()),
        Err(_) => Err(format!("'{l}' is not a log level or filter")),
    };
    /// A directory to change root to.
    Absolute(PathBuf) in text("an absolute path") => |p| match p.is_absolute() {
        true => Ok(()),
        false => Err(format!("{} is not an absolute path", p.display())),
    };
    /// `observe.control-socket`: an absolute path, or `none`.
    ControlSocket(PathBuf) in text("an absolute path, or `none`")
        => |p| match p.is_absolute() || p.as_os_str() == "none" {
        true => Ok(()),
        false => Err(format!("{} is not an absolute path (or none)", p.display())),
    };
    /// A network interface's name.
    Interface(String) in text("an interface name (1 to 15 bytes, no `/` or space)")
        => |i| match i.is_empty() || i.len() > 15 || i.contains(['/', ' ', '\0']) {
        true => Err(format!("{i:?} is not an interface name")),
        false => Ok(()),
    };
    /// `nts.ntp-server`: NAME[:PORT].
    NtpServer(String) in text(NTP_SERVER_FORM) => |s| split_ntp_server(&s).map(drop);
    /// `roughtime.grease-kinds`: comma-separated kinds of grease, at least one, no repeats.
    GreaseKinds(String) in grease_kinds_accepted() => |s| grease_kinds(&s).map(drop);
}

/// Seconds as a `Duration`; of those where 0 turns something off, `None` for 0.
macro_rules! durations {
    ($($name:ident),*; $($off:ident),*) => {
        $(impl $name {
            pub(crate) fn duration(&self) -> Duration {
                Duration::from_secs_f64(self.0)
            }
        })*
        $(impl $off {
            pub(crate) fn duration(&self) -> Option<Duration> {
                (self.0 > 0.0).then(|| Duration::from_secs_f64(self.0))
            }
        })*
    };
}
durations!(Positive, ShedInterval; Seconds, ShedTarget, Gather);

impl NtpServer {
    /// The name and, if one follows it, the port.
    pub(crate) fn parts(&self) -> (String, Option<u16>) {
        split_ntp_server(&self.0).expect("checked when parsed")
    }
}

impl GreaseKinds {
    pub(crate) fn kinds(&self) -> Vec<Grease> {
        grease_kinds(&self.0).expect("checked when parsed")
    }
}

/// `xdp.mode`.
#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum XdpMode {
    /// Zero-copy where the driver can, else copy.
    Auto,
    Copy,
    ZeroCopy,
}

fn whole(min: usize, max: usize) -> Accepts {
    let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    Accepts::Whole {
        min: int(min),
        max: Some(int(max)),
    }
}

/// A rate limit option's range, from the error `RateLimit::new` gives for a value below it.
fn range_of(below: Result<RateLimit, chime_ntp::RateLimitError>) -> Accepts {
    let e = below.expect_err("i64::MIN is in no option's range");
    Accepts::Whole {
        min: e.min,
        max: Some(e.max),
    }
}

fn text(words: &str) -> Accepts {
    Accepts::Text(words.to_owned())
}

fn grease_kinds_accepted() -> Accepts {
    let kinds: Vec<_> = Grease::ALL
        .iter()
        .map(|k| format!("`{}`", k.label()))
        .collect();
    text(&format!(
        "comma-separated, each at most once: {}",
        kinds.join(", ")
    ))
}

const NTP_SERVER_FORM: &str =
    "an IP address or a domain name, then `:PORT` if not 123 (an IPv6 address in brackets then)";

fn at_most(n: usize, max: usize, says: &str) -> Result<(), String> {
    match n <= max {
        true => Ok(()),
        false => Err(format!("{n} {says} {max}")),
    }
}

fn within(n: usize, min: usize, max: usize, what: String) -> Result<(), String> {
    match (min..=max).contains(&n) {
        true => Ok(()),
        false => Err(format!("{what} is outside {min}..={max}")),
    }
}

fn seconds(v: f64, max: f64) -> Result<(), String> {
    match v.is_finite() && (0.0..=max).contains(&v) {
        true => Ok(()),
        false => Err(format!("{v} seconds is outside 0..={max}")),
    }
}

fn limit(checked: Result<RateLimit, chime_ntp::RateLimitError>) -> Result<(), String> {
    checked
        .map(drop)
        .map_err(|e| format!("must be {} to {}, not {}", e.min, e.max, e.value))
}

fn family(a: SocketAddr, v4: bool) -> Result<(), String> {
    match (a.is_ipv4(), v4) {
        (true, true) | (false, false) => Ok(()),
        (_, true) => Err(format!("{a} is not an IPv4 address")),
        (_, false) => Err(format!("{a} is not an IPv6 address")),
    }
}

/// `NAME[:PORT]`: the name (an IP address or a domain name) and the port if one follows; an IPv6
/// address takes brackets when it does (`[2001:db8::1]:123`).
fn split_ntp_server(value: &str) -> Result<(String, Option<u16>), String> {
    let (name, port) = match value.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            None => return Err(format!("{value:?}: no ] after the IPv6 address")),
            Some((name, "")) => (name, None),
            Some((name, after)) => match after.strip_prefix(':') {
                Some(port) => (name, Some(port)),
                None => return Err(format!("{value:?}: only :PORT may follow ]")),
            },
        },
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
    let port = port.map(|p| match p.parse::<u16>() {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(format!("{p:?} is not a port (1 to 65535)")),
    });
    Ok((name.to_owned(), port.transpose()?))
}

fn grease_kinds(list: &str) -> Result<Vec<Grease>, String> {
    let mut kinds = Vec::new();
    for name in list.split(',').map(str::trim) {
        let Some(kind) = Grease::ALL.into_iter().find(|k| k.label() == name) else {
            let known: Vec<_> = Grease::ALL.iter().map(|k| k.label()).collect();
            return Err(format!(
                "{name:?} is not a kind of grease ({})",
                known.join(", ")
            ));
        };
        if kinds.contains(&kind) {
            return Err(format!("{name} is listed twice"));
        }
        kinds.push(kind);
    }
    Ok(kinds)
}

const MAX_THREADS: usize = 1024;
/// The most NTS-KE threads.
const MAX_KE_THREADS: usize = 64;
/// The most Roughtime TCP connections open at once.
const MAX_TCP_CONNECTIONS: usize = 1 << 20;
/// The longest shedding target, interval and Roughtime gathering time.
const MAX_SHED_TARGET: f64 = 1.0;
const MAX_SHED_INTERVAL: f64 = 10.0;
const MAX_GATHER: f64 = 0.1;

/// Where the control socket is made unless told otherwise: in the unit's runtime directory.
pub(crate) const DEFAULT_CONTROL_SOCKET: &str = "/run/chimed/chimed.sock";

impl ControlSocket {
    /// Its path, or `None` when off.
    pub(crate) fn path(&self) -> Option<&std::path::Path> {
        (self.0.as_os_str() != "none").then_some(self.0.as_path())
    }

    /// Whether it is the default path, where failing to make it is only a warning.
    pub(crate) fn is_default(&self) -> bool {
        self.0.as_os_str() == DEFAULT_CONTROL_SOCKET
    }
}
/// The smallest receive buffer accepted: below it the kernel would round up anyway, and a buffer
/// that holds one or two datagrams drops every burst.
const MIN_RECV_BUFFER: usize = 4096;
/// The largest: the kernel takes an int and doubles it.
const MAX_RECV_BUFFER: usize = 1 << 30;
/// The most NTP datagrams per receive and send.
const MAX_NTP_BATCH: usize = 1024;
/// The longest interval of any kind: a day.
const MAX_SECONDS: f64 = 86_400.0;
