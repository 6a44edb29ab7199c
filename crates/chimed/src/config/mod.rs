//! chimed's settings: one schema (`schema`), read from the config file and overlaid with flags
//! (`resolve`, which reads nothing but the file), then the keys, certificates and names the
//! settings point at loaded and checked (`secrets`), giving the `Settings` the daemon runs on.
//! On SIGHUP `reload` reads the file again and says what changed.

pub(crate) mod docs;
mod resolve;
pub(crate) mod schema;
pub(crate) mod secret_file;
mod secrets;
#[cfg(test)]
mod tests;
pub(crate) mod values;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use zeroize::Zeroizing;

use chime_ntp::RateLimit;
use chime_roughtime::Grease;
use chime_udp::ShedConfig;

pub(crate) use self::schema::Args;
pub(crate) use self::secrets::load_bundle;
use crate::access::acl::Acl;

/// The settings from the command line and the config file, every key and certificate they name
/// loaded: what the daemon starts with.
pub(crate) fn settings(args: &Args) -> Result<Settings, ConfigError> {
    secrets::load(resolve::resolve(args)?)
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
}

/// The keys SIGHUP puts in force.
const RELOADABLE: [&str; 3] = ["access.allow", "access.deny", "observe.log-level"];

/// SIGHUP: the config file read again, flags still over it, and every value checked as at start.
/// `Ok(None)` if there is no file. A broken file changes nothing.
pub(crate) fn reload(args: &Args, current: &Settings) -> Result<Option<Reloaded>, ConfigError> {
    if args.config.is_none() {
        return Ok(None);
    }
    let new = resolve::resolve(args)?.settings;
    let restart = current
        .given
        .changed(&new.given)
        .into_iter()
        .filter(|key| !RELOADABLE.contains(&key.as_str()))
        .collect();
    Ok(Some(Reloaded {
        acl: new.acl,
        log_level: new.log_level,
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
        line: Option<usize>,
    },
    /// Neither: the built-in default.
    Default,
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key;
        match &self.from {
            From::Flag(long) => write!(f, "--{long}"),
            From::File { path, line: None } => write!(f, "config file {}: {key}", path.display()),
            From::File {
                path,
                line: Some(n),
            } => write!(f, "config file {}, line {n}: {key}", path.display()),
            From::Default => write!(f, "{key} (not set, its default)"),
        }
    }
}

/// The values given in the file and by flags, as dotted keys: what SIGHUP compares, and what
/// --check-config shows of where the settings came from.
#[derive(Clone, Default)]
pub(crate) struct Given(Vec<(String, String)>);

impl Given {
    /// The keys whose value differs between `self` and `new`, either way.
    fn changed(&self, new: &Given) -> Vec<String> {
        let mut keys: Vec<String> = (self.0.iter())
            .filter(|kv| !new.0.contains(kv))
            .chain(new.0.iter().filter(|kv| !self.0.contains(kv)))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

impl fmt::Debug for Given {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As the file would write each: `ntp.ipv4-threads = 2`.
        struct Line<'a>(&'a str, &'a str);
        impl fmt::Debug for Line<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{} = {}", self.0, self.1)
            }
        }
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| Line(k, v)))
            .finish()
    }
}

/// Everything the daemon needs to start, validated.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) ipv4_threads: usize,
    pub(crate) ipv6_threads: usize,
    pub(crate) ipv4_address: SocketAddr,
    pub(crate) ipv6_address: SocketAddr,
    pub(crate) server_address: SocketAddr,
    pub(crate) user: Option<String>,
    pub(crate) root: Option<PathBuf>,
    pub(crate) poll_interval: Duration,
    pub(crate) stale_after: Duration,
    /// The receive buffer each NTP socket asks for, in bytes.
    pub(crate) recv_buffer: usize,
    pub(crate) batch_size: usize,
    /// Shedding under a standing overload, NTP and Roughtime alike; `None`: off.
    pub(crate) shed: Option<ShedConfig>,
    pub(crate) cpus: Vec<usize>,
    /// AF_XDP on an interface, if asked for.
    pub(crate) xdp: Option<Xdp>,
    pub(crate) stats_interval: Option<Duration>,
    /// Where the metrics endpoint listens; off if `None`.
    pub(crate) metrics_address: Option<SocketAddr>,
    /// Who is served (`allow` and `deny`).
    pub(crate) acl: Acl,
    /// Per-client NTP rate limiting, if on.
    pub(crate) ratelimit: Option<RateLimiting>,
    /// Transmit times kept for interleaved mode; 0: off.
    pub(crate) interleaved_log: usize,
    /// NTS-KE (and NTS), if a certificate was given.
    pub(crate) nts: Option<Nts>,
    /// `--nts-fleet-key`: NTS cookie keys derived from a fleet secret, with or without NTS-KE.
    pub(crate) nts_fleet: Option<Fleet>,
    pub(crate) log_level: String,
    /// Timezone-offset mode: `Some(None)` for the system zone, `Some(Some(name))` for a named one.
    pub(crate) tz_offset: Option<Option<String>>,
    /// Roughtime, if a key was given.
    pub(crate) roughtime: Option<Roughtime>,
    /// What the file and the flags set, for SIGHUP to compare against.
    pub(crate) given: Given,
}

/// The NTS settings, with the TLS configuration already loaded and checked; the values the
/// settings give are read through `Deref`.
#[derive(Debug, Clone)]
pub(crate) struct Nts {
    pub(crate) set: NtsSet,
    pub(crate) tls: std::sync::Arc<rustls::ServerConfig>,
    /// When the certificate expires, Unix seconds, if it could be read.
    pub(crate) not_after: Option<i64>,
    /// `--nts-dump-dir`'s key file, and the keys it held at start (`None`: no file yet).
    pub(crate) dump: Option<(PathBuf, Option<crate::nts::keys::Saved>)>,
}

/// `[nts]` checked, before the certificate, key and saved cookie keys are read.
#[derive(Debug, Clone)]
pub(crate) struct NtsSet {
    pub(crate) certificate: PathBuf,
    pub(crate) private_key: PathBuf,
    pub(crate) dump_dir: Option<PathBuf>,
    pub(crate) ke_address: SocketAddr,
    /// `--nts-ke-threads`: the threads NTS-KE sessions run on.
    pub(crate) ke_threads: usize,
    pub(crate) rotation: Duration,
    /// `--nts-ratelimit`: NTS-KE connections per client address.
    pub(crate) ratelimit: Option<RateLimiting>,
    /// `--nts-ntp-server`: the NTP server NTS-KE names, if not its own address, and its port if
    /// given.
    pub(crate) ntp_server: Option<String>,
    pub(crate) ntp_port: Option<u16>,
}

impl std::ops::Deref for Nts {
    type Target = NtsSet;
    fn deref(&self) -> &NtsSet {
        &self.set
    }
}

/// `--nts-fleet-key`'s file, the secrets it held when last read, and the period each key is for
/// (`--nts-rotation`).
#[derive(Clone)]
pub(crate) struct Fleet {
    pub(crate) path: PathBuf,
    pub(crate) secrets: crate::nts::keys::FleetSecrets,
    pub(crate) period: Duration,
}

impl fmt::Debug for Fleet {
    // The secrets are secret: --check-config prints the settings, never a key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("path", &self.path)
            .field("previous_secret", &self.secrets.1.is_some())
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

/// `--xdp` and its options: serving through AF_XDP on one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Xdp {
    pub(crate) interface: String,
    pub(crate) threads: usize,
    /// `None`: zero-copy where the driver can, else copy.
    pub(crate) mode: Option<chime_udp::xdp::XdpMode>,
    /// Serve through the sockets alone if XDP cannot start, rather than exit.
    pub(crate) fallback: bool,
}

/// `ratelimit` and its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimiting {
    pub(crate) limit: RateLimit,
    /// Client addresses tracked at once.
    pub(crate) clients: usize,
}

/// What Roughtime signs with.
#[derive(Clone)]
pub(crate) enum RoughtimeKeys {
    /// The long-term key itself (`--roughtime-key`): online keys are made and rotated here.
    LongTerm {
        file: PathBuf,
        /// Wiped when the settings are dropped.
        seed: Zeroizing<[u8; 32]>,
    },
    /// Delegations made where the long-term key lives (`--roughtime-delegation`), every
    /// certificate already checked against the long-term public key.
    Bundle {
        file: PathBuf,
        bundle: chime_roughtime::Bundle,
    },
}

impl RoughtimeKeys {
    pub(crate) fn file(&self) -> &Path {
        match self {
            Self::LongTerm { file, .. } | Self::Bundle { file, .. } => file,
        }
    }
}

/// The Roughtime service's settings, with the long-term key or the delegation bundle already
/// loaded and checked; the values the settings give are read through `Deref`.
#[derive(Clone)]
pub(crate) struct Roughtime {
    pub(crate) set: RoughtimeSet,
    pub(crate) keys: RoughtimeKeys,
    /// The experimental ML-DSA-44 suite's long-term key file and seed (`--roughtime-mldsa-key`);
    /// only a chimed built with the suite serves it, and reads it.
    #[cfg_attr(not(feature = "mldsa"), allow(dead_code))]
    pub(crate) mldsa: Option<(PathBuf, Zeroizing<[u8; 32]>)>,
}

impl fmt::Debug for Roughtime {
    // The seeds are secrets: --check-config prints the settings, which name only their files.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.set.fmt(f)
    }
}

impl std::ops::Deref for Roughtime {
    type Target = RoughtimeSet;
    fn deref(&self) -> &RoughtimeSet {
        &self.set
    }
}

/// `[roughtime]` checked, before its keys are read.
#[derive(Debug, Clone)]
pub(crate) struct RoughtimeSet {
    pub(crate) key: KeyFile,
    pub(crate) mldsa_key: Option<PathBuf>,
    pub(crate) ipv4_threads: usize,
    pub(crate) ipv6_threads: usize,
    pub(crate) ipv4_address: SocketAddr,
    pub(crate) ipv6_address: SocketAddr,
    pub(crate) rotation: Duration,
    /// Requests per receive, and the most one signature covers.
    pub(crate) batch_size: usize,
    /// The receive buffer each Roughtime socket asks for, in bytes.
    pub(crate) recv_buffer: usize,
    /// How long to gather requests under load before signing; `None`: sign at once.
    pub(crate) gather: Option<Duration>,
    /// The share of replies made deliberately invalid (`--roughtime-grease`), 0 to 1.
    pub(crate) grease: f64,
    /// The ways to make them so (`--roughtime-grease-kinds`); all by default.
    pub(crate) grease_kinds: Vec<Grease>,
    /// Roughtime over TCP and its bounds; `None`: UDP only (`--roughtime-tcp-connections 0`).
    pub(crate) tcp: Option<TcpLimits>,
}

/// What Roughtime signs with, to be read.
#[derive(Debug, Clone)]
pub(crate) enum KeyFile {
    LongTerm(PathBuf),
    Bundle(PathBuf),
}

/// `[roughtime.tcp]`: the bounds on Roughtime's TCP connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpLimits {
    /// Connections open at once.
    pub(crate) connections: usize,
    /// Connections open at once from one client address.
    pub(crate) per_address: usize,
    /// Longest wait for the next request (or for a reply to be read).
    pub(crate) idle: Duration,
    /// Longest a connection stays open, however busy.
    pub(crate) lifetime: Duration,
}
