//! The config file and the resolved settings.
//!
//! Settings come from three places, in order of precedence: a command-line flag, the TOML config
//! file (`--config`), the built-in default. The file uses the flags' long names as keys and rejects
//! any key it does not know, so a typo is an error rather than a silently ignored line.

pub(crate) mod cli;
pub(crate) mod docs;
pub(crate) mod secret_file;

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use zeroize::Zeroizing;

use chime_ntp::{ClientTable, RateLimit, TxLog};
use chime_roughtime::Grease;
use chime_udp::ShedConfig;

use self::cli::Args;
use crate::access::acl::Acl;

/// The config file, as written. Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct File {
    ipv4_threads: Option<usize>,
    ipv6_threads: Option<usize>,
    ipv4_address: Option<SocketAddr>,
    ipv6_address: Option<SocketAddr>,
    server_address: Option<SocketAddr>,
    user: Option<String>,
    root: Option<PathBuf>,
    poll_interval: Option<f64>,
    stale_after: Option<f64>,
    recv_buffer: Option<usize>,
    batch_size: Option<usize>,
    shed_target: Option<f64>,
    shed_interval: Option<f64>,
    cpus: Option<Vec<usize>>,
    xdp: Option<String>,
    xdp_threads: Option<usize>,
    xdp_mode: Option<String>,
    xdp_fallback: Option<bool>,
    stats_interval: Option<f64>,
    metrics_address: Option<SocketAddr>,
    allow: Option<Vec<String>>,
    deny: Option<Vec<String>>,
    ratelimit: Option<bool>,
    ratelimit_interval: Option<i64>,
    ratelimit_burst: Option<i64>,
    ratelimit_leak: Option<i64>,
    ratelimit_kod: Option<i64>,
    ratelimit_clients: Option<usize>,
    nts_ratelimit: Option<bool>,
    nts_ratelimit_interval: Option<i64>,
    nts_ratelimit_burst: Option<i64>,
    nts_ratelimit_leak: Option<i64>,
    interleaved_log: Option<usize>,
    nts_certificate: Option<PathBuf>,
    nts_private_key: Option<PathBuf>,
    nts_ke_address: Option<SocketAddr>,
    nts_ke_threads: Option<usize>,
    nts_rotation: Option<f64>,
    nts_dump_dir: Option<PathBuf>,
    nts_fleet_key: Option<PathBuf>,
    nts_ntp_server: Option<String>,
    log_level: Option<String>,
    tz_offset: Option<bool>,
    timezone: Option<String>,
    roughtime_key: Option<PathBuf>,
    roughtime_delegation: Option<PathBuf>,
    roughtime_mldsa_key: Option<PathBuf>,
    roughtime_ipv4_threads: Option<usize>,
    roughtime_ipv6_threads: Option<usize>,
    roughtime_ipv4_address: Option<SocketAddr>,
    roughtime_ipv6_address: Option<SocketAddr>,
    roughtime_rotation: Option<f64>,
    roughtime_batch_size: Option<usize>,
    roughtime_recv_buffer: Option<usize>,
    roughtime_gather: Option<f64>,
    roughtime_grease: Option<f64>,
    roughtime_grease_kinds: Option<String>,
    roughtime_tcp_connections: Option<usize>,
    roughtime_tcp_per_address: Option<usize>,
    roughtime_tcp_idle: Option<f64>,
    roughtime_tcp_lifetime: Option<f64>,
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
}

/// The NTS settings, with the TLS configuration already loaded and checked.
#[derive(Debug, Clone)]
pub(crate) struct Nts {
    pub(crate) certificate: PathBuf,
    pub(crate) private_key: PathBuf,
    pub(crate) tls: std::sync::Arc<rustls::ServerConfig>,
    /// When the certificate expires, Unix seconds, if it could be read.
    pub(crate) not_after: Option<i64>,
    pub(crate) ke_address: SocketAddr,
    /// `--nts-ke-threads`: the threads NTS-KE sessions run on.
    pub(crate) ke_threads: usize,
    pub(crate) rotation: Duration,
    /// `--nts-dump-dir`'s key file, and the keys it held at start (`None`: no file yet).
    pub(crate) dump: Option<(PathBuf, Option<crate::nts::keys::Saved>)>,
    /// `--nts-ratelimit`: NTS-KE connections per client address.
    pub(crate) ratelimit: Option<RateLimiting>,
    /// `--nts-ntp-server`: the NTP server NTS-KE names, if not its own address, and its port if
    /// given.
    pub(crate) ntp_server: Option<String>,
    pub(crate) ntp_port: Option<u16>,
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

/// `xdp` and its options. An option without `xdp` is an error rather than silently ignored.
fn xdp_settings(args: &Args, file: &File, path: Option<&Path>) -> Result<Option<Xdp>, ConfigError> {
    let from = |on_cli: bool, key| input(key, if on_cli { None } else { path });
    let iface = args.xdp.clone().or_else(|| file.xdp.clone());
    let threads = args.xdp_threads.or(file.xdp_threads);
    let mode = args.xdp_mode.clone().or_else(|| file.xdp_mode.clone());
    let fallback = args.xdp_fallback || file.xdp_fallback.unwrap_or(false);
    let Some(interface) = iface else {
        for (set, on_cli, key) in [
            (threads.is_some(), args.xdp_threads.is_some(), "xdp-threads"),
            (mode.is_some(), args.xdp_mode.is_some(), "xdp-mode"),
            (fallback, args.xdp_fallback, "xdp-fallback"),
        ] {
            if set {
                return Err(invalid(
                    &from(on_cli, key),
                    "has no effect without xdp (an interface)",
                ));
            }
        }
        return Ok(None);
    };
    let iface_in = from(args.xdp.is_some(), "xdp");
    if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ', '\0']) {
        return Err(invalid(
            &iface_in,
            format!("{interface:?} is not an interface name"),
        ));
    }
    let threads = threads.unwrap_or(1);
    if threads == 0 {
        return Err(invalid(
            &from(args.xdp_threads.is_some(), "xdp-threads"),
            "must be at least 1",
        ));
    }
    let mode = match mode.as_deref() {
        None | Some("auto") => None,
        Some("copy") => Some(chime_udp::xdp::XdpMode::Copy),
        Some("zero-copy") => Some(chime_udp::xdp::XdpMode::ZeroCopy),
        Some(other) => {
            return Err(invalid(
                &from(args.xdp_mode.is_some(), "xdp-mode"),
                format!("{other:?} is not auto, copy or zero-copy"),
            ));
        }
    };
    Ok(Some(Xdp {
        interface,
        threads,
        mode,
        fallback,
    }))
}

/// `ratelimit` and its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimiting {
    pub(crate) limit: RateLimit,
    /// Client addresses tracked at once.
    pub(crate) clients: usize,
}

/// --interleaved-log's default: 65536 transmit times, 1 MiB, as many interleaved clients as
/// poll within one of their poll intervals.
const DEFAULT_INTERLEAVED_LOG: usize = 1 << 16;

/// --ratelimit-clients' default: 65536 addresses, 2 MiB.
const DEFAULT_RATELIMIT_CLIENTS: usize = 1 << 16;
/// How many addresses NTS-KE rate limiting tracks: 16384, 256 KiB. A client runs NTS-KE once
/// per association, so these are the addresses that connected in the last minutes.
const DEFAULT_NTS_RATELIMIT_CLIENTS: usize = 16_384;

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
/// loaded and checked.
#[derive(Clone)]
pub(crate) struct Roughtime {
    pub(crate) keys: RoughtimeKeys,
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
    pub(crate) tcp: Option<crate::roughtime::tcp::Limits>,
    /// The experimental ML-DSA-44 suite's long-term key file and seed (`--roughtime-mldsa-key`).
    pub(crate) mldsa: Option<(PathBuf, Zeroizing<[u8; 32]>)>,
}

impl fmt::Debug for Roughtime {
    // The seed is a secret: --check-config prints the settings, never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Roughtime")
            .field("key_file", &self.keys.file())
            .field("ipv4_threads", &self.ipv4_threads)
            .field("ipv6_threads", &self.ipv6_threads)
            .field("ipv4_address", &self.ipv4_address)
            .field("ipv6_address", &self.ipv6_address)
            .field("rotation", &self.rotation)
            .field("batch_size", &self.batch_size)
            .field("recv_buffer", &self.recv_buffer)
            .field("gather", &self.gather)
            .field("grease", &self.grease)
            .field("grease_kinds", &self.grease_kinds)
            .field("tcp", &self.tcp)
            .field("mldsa_key_file", &self.mldsa.as_ref().map(|(f, _)| f))
            .finish_non_exhaustive()
    }
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
}

/// Where a bad value came from, so the message can point at it.
#[derive(Debug, Clone)]
pub(crate) struct Input {
    key: &'static str,
    file: Option<PathBuf>,
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(path) => write!(f, "config file {}: {}", path.display(), self.key),
            None => write!(f, "--{}", self.key),
        }
    }
}

pub(crate) const DEFAULT_POLL_INTERVAL: f64 = 1.0;
pub(crate) const DEFAULT_STALE_AFTER: f64 = 8.0;
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
/// --nts-ke-threads: past the cores of any machine chimed runs on, handshakes only contend.
const MAX_NTS_KE_THREADS: usize = 64;
/// --shed-interval's default, CoDel's.
const DEFAULT_SHED_INTERVAL: f64 = 0.1;
/// Beyond a second a request is stale for any client; beyond ten seconds "standing" means little.
const MAX_SHED_TARGET: f64 = 1.0;
const MAX_SHED_INTERVAL: f64 = 10.0;
/// --roughtime-tcp-connections: a thousand clients at once is more than Roughtime's query pattern
/// (one connection, one or a few requests) brings to a server, and costs a few MiB at most.
const DEFAULT_TCP_CONNECTIONS: usize = 1024;
const MAX_TCP_CONNECTIONS: usize = 1 << 20;
/// --roughtime-tcp-per-address: room for clients behind one NAT, none for one host to hold all.
const DEFAULT_TCP_PER_ADDRESS: usize = 16;
/// --roughtime-tcp-idle and --roughtime-tcp-lifetime, in seconds.
const DEFAULT_TCP_IDLE: f64 = 10.0;
const DEFAULT_TCP_LIFETIME: f64 = 60.0;
/// The longest --roughtime-gather: beyond a tenth of a second it only adds delay.
const MAX_GATHER: f64 = 0.1;
/// --roughtime-gather's default: 2 ms gave batches of ~140 requests at 40k/s (mean Merkle path
/// 7.1 hashes, against 5.8 at 0.5 ms), and is nothing beside a radius of seconds. Against 0.5 ms (session 10, alternating, 3 rounds): CPU per reply
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

impl Settings {
    pub(crate) fn resolve(args: &Args) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => load(path)?,
            None => File::default(),
        };
        let path = args.config.as_deref();
        // Picks the flag if given, else the file's value, remembering which one it was so that a
        // later check can name the right input.
        macro_rules! pick {
            ($field:ident, $key:literal) => {
                match (&args.$field, &file.$field) {
                    (Some(v), _) => (Some(v.clone()), input($key, None)),
                    (None, Some(v)) => (Some(v.clone()), input($key, path)),
                    (None, None) => (None, input($key, None)),
                }
            };
        }

        let (v4_threads, v4_threads_in) = pick!(ipv4_threads, "ipv4-threads");
        let (v6_threads, v6_threads_in) = pick!(ipv6_threads, "ipv6-threads");
        let (v4_addr, v4_addr_in) = pick!(ipv4_address, "ipv4-address");
        let (v6_addr, v6_addr_in) = pick!(ipv6_address, "ipv6-address");
        let (upstream, _) = pick!(server_address, "server-address");
        let (user, user_in) = pick!(user, "user");
        let (root, root_in) = pick!(root, "root");
        let (poll, poll_in) = pick!(poll_interval, "poll-interval");
        let (stale, stale_in) = pick!(stale_after, "stale-after");
        let (recv_buffer, recv_buffer_in) = pick!(recv_buffer, "recv-buffer");
        let recv_buffer = recv_buffer.unwrap_or(DEFAULT_NTP_RECV_BUFFER);
        cli::check_recv_buffer(recv_buffer).map_err(|r| invalid(&recv_buffer_in, r))?;
        let (batch, batch_in) = pick!(batch_size, "batch-size");
        let (shed_target, shed_target_in) = pick!(shed_target, "shed-target");
        let (shed_interval, shed_interval_in) = pick!(shed_interval, "shed-interval");
        let shed_target = shed_target.unwrap_or(DEFAULT_SHED_TARGET);
        check_seconds_up_to(shed_target, MAX_SHED_TARGET)
            .map_err(|r| invalid(&shed_target_in, r))?;
        let shed_interval = shed_interval.unwrap_or(DEFAULT_SHED_INTERVAL);
        check_seconds_up_to(shed_interval, MAX_SHED_INTERVAL)
            .map_err(|r| invalid(&shed_interval_in, r))?;
        let shed = (shed_target > 0.0).then(|| ShedConfig {
            target: Duration::from_secs_f64(shed_target),
            interval: Duration::from_secs_f64(shed_interval),
        });
        let (cpus, _) = pick!(cpus, "cpus");
        let xdp = xdp_settings(args, &file, path)?;
        let (stats, stats_in) = pick!(stats_interval, "stats-interval");
        let (metrics_address, _) = pick!(metrics_address, "metrics-address");
        let (allow, allow_in) = pick!(allow, "allow");
        let (deny, deny_in) = pick!(deny, "deny");
        let acl = access_rules(
            &allow.unwrap_or_default(),
            &allow_in,
            &deny.unwrap_or_default(),
            &deny_in,
        )?;
        let ratelimit = rate_limiting(args, &file, path)?;
        let (nts_cert, nts_cert_in) = pick!(nts_certificate, "nts-certificate");
        let (nts_key, nts_key_in) = pick!(nts_private_key, "nts-private-key");
        let (nts_ke, nts_ke_in) = pick!(nts_ke_address, "nts-ke-address");
        let (nts_rotation, nts_rotation_in) = pick!(nts_rotation, "nts-rotation");
        let (nts_ke_threads, nts_ke_threads_in) = pick!(nts_ke_threads, "nts-ke-threads");
        if let Some(n) = nts_ke_threads
            && !(1..=MAX_NTS_KE_THREADS).contains(&n)
        {
            let r = format!("{n} is not between 1 and {MAX_NTS_KE_THREADS}");
            return Err(invalid(&nts_ke_threads_in, r));
        }
        let (nts_dump_dir, nts_dump_dir_in) = pick!(nts_dump_dir, "nts-dump-dir");
        let (nts_fleet_key, nts_fleet_key_in) = pick!(nts_fleet_key, "nts-fleet-key");
        let (nts_ntp_server, nts_ntp_server_in) = pick!(nts_ntp_server, "nts-ntp-server");
        let nts_ratelimit = nts_rate_limiting(args, &file, path)?;
        let nts_ratelimit_in = input("nts-ratelimit", path.filter(|_| !args.nts_ratelimit));
        let rotation = nts_rotation.unwrap_or(86_400.0);
        check_positive(rotation).map_err(|r| invalid(&nts_rotation_in, r))?;
        // A fleet secret serves NTS with or without NTS-KE: a member with no certificate answers
        // authenticated NTP with cookies other members handed out.
        let nts_fleet = match nts_fleet_key {
            None => None,
            Some(_) if nts_dump_dir.is_some() => {
                let r = "not with nts-dump-dir: fleet keys are derived from the secret whenever \
                         needed, never saved";
                return Err(invalid(&nts_fleet_key_in, r));
            }
            Some(path) => {
                let secrets = crate::nts::keys::load_fleet(&path)
                    .map_err(|r| invalid(&nts_fleet_key_in, r))?;
                Some(Fleet {
                    path,
                    secrets,
                    period: Duration::from_secs_f64(rotation),
                })
            }
        };
        let nts = match (nts_cert, nts_key) {
            (None, None) => {
                for (given, input) in [
                    (nts_ke.is_some(), &nts_ke_in),
                    (nts_ke_threads.is_some(), &nts_ke_threads_in),
                    (
                        nts_rotation.is_some() && nts_fleet.is_none(),
                        &nts_rotation_in,
                    ),
                    (nts_dump_dir.is_some(), &nts_dump_dir_in),
                    (nts_ntp_server.is_some(), &nts_ntp_server_in),
                    (nts_ratelimit.is_some(), &nts_ratelimit_in),
                ] {
                    if given {
                        let r = "only takes effect with nts-certificate and nts-private-key";
                        return Err(invalid(input, r));
                    }
                }
                None
            }
            (Some(_), None) => {
                return Err(invalid(
                    &nts_key_in,
                    "missing: nts-certificate needs its private key",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    &nts_cert_in,
                    "missing: nts-private-key needs its certificate",
                ));
            }
            (Some(certificate), Some(key)) => {
                let ntp_server = match nts_ntp_server.as_deref().map(split_ntp_server) {
                    None => (None, None),
                    Some(Ok((name, port))) => (Some(name), port),
                    Some(Err(r)) => return Err(invalid(&nts_ntp_server_in, r)),
                };
                let loaded = crate::nts::ke::load(&certificate, &key)
                    .map_err(|r| invalid(&nts_cert_in, r))?;
                let dump = match nts_dump_dir {
                    None => None,
                    Some(dir) => {
                        if !dir.is_dir() {
                            let r = format!("{}: not a directory", dir.display());
                            return Err(invalid(&nts_dump_dir_in, r));
                        }
                        let file = crate::nts::keys::path_in(&dir);
                        let saved = crate::nts::keys::load(&file)
                            .map_err(|r| invalid(&nts_dump_dir_in, r))?;
                        Some((file, saved))
                    }
                };
                Some(Nts {
                    certificate,
                    private_key: key,
                    tls: loaded.config,
                    not_after: loaded.not_after,
                    ke_address: nts_ke.unwrap_or((Ipv6Addr::UNSPECIFIED, 4460).into()),
                    ke_threads: nts_ke_threads.unwrap_or(1),
                    rotation: Duration::from_secs_f64(rotation),
                    dump,
                    ratelimit: nts_ratelimit,
                    ntp_server: ntp_server.0,
                    ntp_port: ntp_server.1,
                })
            }
        };
        let (interleaved_log, interleaved_log_in) = pick!(interleaved_log, "interleaved-log");
        let interleaved_log = interleaved_log.unwrap_or(DEFAULT_INTERLEAVED_LOG);
        if interleaved_log > TxLog::MAX_ENTRIES {
            let r = format!("{interleaved_log} is more than {}", TxLog::MAX_ENTRIES);
            return Err(invalid(&interleaved_log_in, r));
        }
        let (log_level, log_in) = pick!(log_level, "log-level");

        let tz_offset = args.tz_offset || file.tz_offset.unwrap_or(false);
        let (timezone, timezone_in) = pick!(timezone, "timezone");
        let tz_offset = match (tz_offset, timezone) {
            (false, Some(_)) => {
                return Err(invalid(
                    &timezone_in,
                    "only takes effect with tz-offset; set both",
                ));
            }
            (false, None) => None,
            (true, zone) => {
                crate::clock::tz::load(zone.as_deref()).map_err(|r| invalid(&timezone_in, r))?;
                Some(zone)
            }
        };

        let (rt_key, rt_key_in) = pick!(roughtime_key, "roughtime-key");
        let (rt_bundle, rt_bundle_in) = pick!(roughtime_delegation, "roughtime-delegation");
        let (rt_v4_threads, rt_v4_threads_in) =
            pick!(roughtime_ipv4_threads, "roughtime-ipv4-threads");
        let (rt_v6_threads, rt_v6_threads_in) =
            pick!(roughtime_ipv6_threads, "roughtime-ipv6-threads");
        let (rt_v4_addr, rt_v4_addr_in) = pick!(roughtime_ipv4_address, "roughtime-ipv4-address");
        let (rt_v6_addr, rt_v6_addr_in) = pick!(roughtime_ipv6_address, "roughtime-ipv6-address");
        let (rt_rotation, rt_rotation_in) = pick!(roughtime_rotation, "roughtime-rotation");
        let (rt_batch, rt_batch_in) = pick!(roughtime_batch_size, "roughtime-batch-size");
        let (rt_gather, rt_gather_in) = pick!(roughtime_gather, "roughtime-gather");
        let (rt_grease, rt_grease_in) = pick!(roughtime_grease, "roughtime-grease");
        let (rt_kinds, rt_kinds_in) = pick!(roughtime_grease_kinds, "roughtime-grease-kinds");
        let (rt_rcvbuf, rt_rcvbuf_in) = pick!(roughtime_recv_buffer, "roughtime-recv-buffer");
        // Every Roughtime value is checked even while Roughtime is off (no key), so that a bad one
        // is found when the config is written, not the day the key is added.
        let rt_ipv4_threads = rt_v4_threads.unwrap_or(1);
        cli::check_threads(rt_ipv4_threads).map_err(|r| invalid(&rt_v4_threads_in, r))?;
        let rt_ipv6_threads = rt_v6_threads.unwrap_or(1);
        cli::check_threads(rt_ipv6_threads).map_err(|r| invalid(&rt_v6_threads_in, r))?;
        let rt_ipv4_address = rt_v4_addr.unwrap_or((Ipv4Addr::UNSPECIFIED, 5319).into());
        if !rt_ipv4_address.is_ipv4() {
            let r = format!("{rt_ipv4_address} is not an IPv4 address");
            return Err(invalid(&rt_v4_addr_in, r));
        }
        let rt_ipv6_address = rt_v6_addr.unwrap_or((Ipv6Addr::UNSPECIFIED, 5319).into());
        if !rt_ipv6_address.is_ipv6() {
            let r = format!("{rt_ipv6_address} is not an IPv6 address");
            return Err(invalid(&rt_v6_addr_in, r));
        }
        let rotation = rt_rotation.unwrap_or(86_400.0);
        check_positive(rotation).map_err(|r| invalid(&rt_rotation_in, r))?;
        let rt_batch_size = rt_batch.unwrap_or(DEFAULT_ROUGHTIME_BATCH);
        cli::check_roughtime_batch(rt_batch_size).map_err(|r| invalid(&rt_batch_in, r))?;
        let rt_recv_buffer = rt_rcvbuf.unwrap_or(DEFAULT_ROUGHTIME_RECV_BUFFER);
        cli::check_recv_buffer(rt_recv_buffer).map_err(|r| invalid(&rt_rcvbuf_in, r))?;
        let gather = rt_gather.unwrap_or(DEFAULT_GATHER);
        if !gather.is_finite() || !(0.0..=MAX_GATHER).contains(&gather) {
            let r = format!("{gather} seconds is outside 0..={MAX_GATHER}");
            return Err(invalid(&rt_gather_in, r));
        }
        let grease = rt_grease.unwrap_or(0.0);
        if !grease.is_finite() || !(0.0..=1.0).contains(&grease) {
            let r = format!("{grease} is not a share of replies between 0 and 1");
            return Err(invalid(&rt_grease_in, r));
        }
        let grease_kinds = match rt_kinds {
            None => Grease::ALL.to_vec(),
            Some(list) => parse_grease_kinds(&list).map_err(|r| invalid(&rt_kinds_in, r))?,
        };
        let (tcp_conns, tcp_conns_in) =
            pick!(roughtime_tcp_connections, "roughtime-tcp-connections");
        let (tcp_per, tcp_per_in) = pick!(roughtime_tcp_per_address, "roughtime-tcp-per-address");
        let (tcp_idle, tcp_idle_in) = pick!(roughtime_tcp_idle, "roughtime-tcp-idle");
        let (tcp_life, tcp_life_in) = pick!(roughtime_tcp_lifetime, "roughtime-tcp-lifetime");
        let tcp_connections = tcp_conns.unwrap_or(DEFAULT_TCP_CONNECTIONS);
        if tcp_connections > MAX_TCP_CONNECTIONS {
            let r = format!("{tcp_connections} is more than {MAX_TCP_CONNECTIONS}");
            return Err(invalid(&tcp_conns_in, r));
        }
        let tcp_per_address = tcp_per.unwrap_or(DEFAULT_TCP_PER_ADDRESS);
        if tcp_per_address == 0 {
            return Err(invalid(&tcp_per_in, "must be at least 1"));
        }
        let tcp_idle = tcp_idle.unwrap_or(DEFAULT_TCP_IDLE);
        check_positive(tcp_idle).map_err(|r| invalid(&tcp_idle_in, r))?;
        let tcp_lifetime = tcp_life.unwrap_or(DEFAULT_TCP_LIFETIME);
        check_positive(tcp_lifetime).map_err(|r| invalid(&tcp_life_in, r))?;
        let tcp = (tcp_connections > 0).then(|| crate::roughtime::tcp::Limits {
            connections: tcp_connections,
            per_address: tcp_per_address,
            idle: Duration::from_secs_f64(tcp_idle),
            lifetime: Duration::from_secs_f64(tcp_lifetime),
        });
        let (rt_pq, rt_pq_in) = pick!(roughtime_mldsa_key, "roughtime-mldsa-key");
        let mldsa = match rt_pq {
            None => None,
            Some(file) => {
                if tcp.is_none() {
                    let r = "the ML-DSA-44 suite is TCP only, and roughtime-tcp-connections is 0";
                    return Err(invalid(&rt_pq_in, r));
                }
                let text =
                    crate::config::secret_file::read_existing(&file, "an ML-DSA-44 long-term key")
                        .map_err(|r| invalid(&rt_pq_in, r))?;
                let seed = chime_roughtime::mldsa::parse_key_file(&text)
                    .map_err(|e| invalid(&rt_pq_in, format!("{}: {e}", file.display())))?;
                Some((file, Zeroizing::new(seed)))
            }
        };
        let keys = match (rt_key, rt_bundle) {
            (None, None) => None,
            (Some(_), Some(_)) => {
                let r = "not with roughtime-key: a server holds the long-term key or a bundle of \
                         delegations from it, not both";
                return Err(invalid(&rt_bundle_in, r));
            }
            (Some(file), None) => {
                let seed = load_key(&file).map_err(|r| invalid(&rt_key_in, r))?;
                Some(RoughtimeKeys::LongTerm { file, seed })
            }
            (None, Some(file)) => {
                let bundle = load_bundle(&file).map_err(|r| invalid(&rt_bundle_in, r))?;
                Some(RoughtimeKeys::Bundle { file, bundle })
            }
        };
        let roughtime = match keys {
            None if mldsa.is_some() => {
                let r =
                    "serves beside the Ed25519 suite: give roughtime-key or roughtime-delegation";
                return Err(invalid(&rt_pq_in, r));
            }
            None => None,
            Some(keys) => {
                if rt_ipv4_threads + rt_ipv6_threads == 0 {
                    return Err(invalid(&rt_v4_threads_in, "no Roughtime threads"));
                }
                Some(Roughtime {
                    keys,
                    ipv4_threads: rt_ipv4_threads,
                    ipv6_threads: rt_ipv6_threads,
                    ipv4_address: rt_ipv4_address,
                    ipv6_address: rt_ipv6_address,
                    rotation: Duration::from_secs_f64(rotation),
                    batch_size: rt_batch_size,
                    recv_buffer: rt_recv_buffer,
                    gather: (gather > 0.0).then(|| Duration::from_secs_f64(gather)),
                    grease,
                    grease_kinds,
                    tcp,
                    mldsa,
                })
            }
        };

        let ipv4_threads = v4_threads.unwrap_or(1);
        cli::check_threads(ipv4_threads).map_err(|r| invalid(&v4_threads_in, r))?;
        let ipv6_threads = v6_threads.unwrap_or(1);
        cli::check_threads(ipv6_threads).map_err(|r| invalid(&v6_threads_in, r))?;
        // A member may serve NTS-KE alone, sending clients to the fleet's NTP servers.
        let ke_only = nts.as_ref().is_some_and(|n| n.ntp_server.is_some());
        if ipv4_threads + ipv6_threads == 0 && !ke_only {
            return Err(invalid(
                &v4_threads_in,
                "no NTP threads: set ipv4-threads or ipv6-threads (or serve NTS-KE only, with \
                 nts-ntp-server naming the NTP servers)",
            ));
        }

        let ipv4_address = v4_addr.unwrap_or((Ipv4Addr::UNSPECIFIED, 123).into());
        if !ipv4_address.is_ipv4() {
            return Err(invalid(
                &v4_addr_in,
                format!("{ipv4_address} is not an IPv4 address"),
            ));
        }
        let ipv6_address = v6_addr.unwrap_or((Ipv6Addr::UNSPECIFIED, 123).into());
        if !ipv6_address.is_ipv6() {
            return Err(invalid(
                &v6_addr_in,
                format!("{ipv6_address} is not an IPv6 address"),
            ));
        }
        let server_address = upstream.unwrap_or((Ipv4Addr::LOCALHOST, 11123).into());

        if let Some(u) = &user {
            match nix::unistd::User::from_name(u) {
                Ok(Some(_)) => {}
                Ok(None) => return Err(invalid(&user_in, format!("no such user '{u}'"))),
                Err(e) => return Err(invalid(&user_in, format!("cannot look up '{u}': {e}"))),
            }
        }
        if let Some(r) = &root {
            if !r.is_absolute() {
                return Err(invalid(
                    &root_in,
                    format!("{} is not an absolute path", r.display()),
                ));
            }
            if !r.is_dir() {
                return Err(invalid(
                    &root_in,
                    format!("{} is not a directory", r.display()),
                ));
            }
        }

        let poll = poll.unwrap_or(DEFAULT_POLL_INTERVAL);
        check_positive(poll).map_err(|r| invalid(&poll_in, r))?;
        let stale = stale.unwrap_or(DEFAULT_STALE_AFTER);
        check_positive(stale).map_err(|r| invalid(&stale_in, r))?;
        if stale <= poll {
            return Err(invalid(
                &stale_in,
                format!("{stale} s must be longer than the poll interval ({poll} s)"),
            ));
        }
        let batch_size = batch.unwrap_or(DEFAULT_BATCH);
        cli::check_batch(batch_size).map_err(|r| invalid(&batch_in, r))?;
        let stats = stats.unwrap_or(DEFAULT_STATS_INTERVAL);
        cli::check_seconds(stats).map_err(|r| invalid(&stats_in, r))?;
        let log_level = log_level.unwrap_or_else(|| "info".into());
        if log_level.parse::<tracing_subscriber::EnvFilter>().is_err() {
            return Err(invalid(
                &log_in,
                format!("'{log_level}' is not a log level or filter"),
            ));
        }

        Ok(Self {
            ipv4_threads,
            ipv6_threads,
            ipv4_address,
            ipv6_address,
            server_address,
            user,
            root,
            poll_interval: Duration::from_secs_f64(poll),
            stale_after: Duration::from_secs_f64(stale),
            recv_buffer,
            batch_size,
            shed,
            cpus: cpus.unwrap_or_default(),
            xdp,
            stats_interval: (stats > 0.0).then(|| Duration::from_secs_f64(stats)),
            metrics_address,
            acl,
            ratelimit,
            interleaved_log,
            nts,
            nts_fleet,
            log_level,
            tz_offset,
            roughtime,
        })
    }
}

/// The `allow` and `deny` rules as they stand now, for SIGHUP: the config file is read again and
/// flags still win over it. `Ok(None)` if there is no config file to re-read. Only these keys are
/// taken; the rest of the file is parsed (a broken file is an error) but needs a restart.
pub(crate) fn reload_acl(args: &Args) -> Result<Option<Acl>, ConfigError> {
    let Some(path) = args.config.as_deref() else {
        return Ok(None);
    };
    let file = load(path)?;
    let list = |flag: &Option<Vec<String>>, from_file: Option<Vec<String>>, key: &'static str| {
        match flag {
            Some(v) => (v.clone(), input(key, None)),
            None => (from_file.unwrap_or_default(), input(key, Some(path))),
        }
    };
    let (allow, allow_in) = list(&args.allow, file.allow, "allow");
    let (deny, deny_in) = list(&args.deny, file.deny, "deny");
    access_rules(&allow, &allow_in, &deny, &deny_in).map(Some)
}

/// `ratelimit` and its options. An option without `ratelimit` itself is an error rather than
/// silently ignored (or silently turning limiting on); a value out of range names its option.
fn rate_limiting(
    args: &Args,
    file: &File,
    path: Option<&Path>,
) -> Result<Option<RateLimiting>, ConfigError> {
    rate_limit(
        LimitInputs {
            prefix: "ratelimit",
            on: args.ratelimit || file.ratelimit.unwrap_or(false),
            options: [
                (
                    args.ratelimit_interval,
                    file.ratelimit_interval,
                    "ratelimit-interval",
                ),
                (
                    args.ratelimit_burst,
                    file.ratelimit_burst,
                    "ratelimit-burst",
                ),
                (args.ratelimit_leak, file.ratelimit_leak, "ratelimit-leak"),
                (args.ratelimit_kod, file.ratelimit_kod, "ratelimit-kod"),
            ],
            clients: (
                args.ratelimit_clients.map(|n| n as i64),
                file.ratelimit_clients.map(|n| n as i64),
                "ratelimit-clients",
            ),
            default: RateLimit::DEFAULT,
            default_clients: DEFAULT_RATELIMIT_CLIENTS,
        },
        path,
    )
}

/// `nts-ratelimit` and its options: chronyd's `ntsratelimit`, a limit on NTS-KE connections per
/// client address (interval 6, one per 64 s, by default; no Kiss-o'-Death).
fn nts_rate_limiting(
    args: &Args,
    file: &File,
    path: Option<&Path>,
) -> Result<Option<RateLimiting>, ConfigError> {
    let default = RateLimit::new(6, 8, 2, 0).expect("in range");
    rate_limit(
        LimitInputs {
            prefix: "nts-ratelimit",
            on: args.nts_ratelimit || file.nts_ratelimit.unwrap_or(false),
            options: [
                (
                    args.nts_ratelimit_interval,
                    file.nts_ratelimit_interval,
                    "nts-ratelimit-interval",
                ),
                (
                    args.nts_ratelimit_burst,
                    file.nts_ratelimit_burst,
                    "nts-ratelimit-burst",
                ),
                (
                    args.nts_ratelimit_leak,
                    file.nts_ratelimit_leak,
                    "nts-ratelimit-leak",
                ),
                (None, None, "nts-ratelimit-kod"),
            ],
            clients: (None, None, "nts-ratelimit-clients"),
            default,
            default_clients: DEFAULT_NTS_RATELIMIT_CLIENTS,
        },
        path,
    )
}

/// One rate limit's options as the command line and the file gave them (flag, file, key).
struct LimitInputs {
    prefix: &'static str,
    on: bool,
    /// interval, burst, leak, kod.
    options: [(Option<i64>, Option<i64>, &'static str); 4],
    clients: (Option<i64>, Option<i64>, &'static str),
    default: RateLimit,
    default_clients: usize,
}

/// A rate limit from its options. An option without the limit itself is an error rather than
/// silently ignored; an out-of-range value names its option and the range.
fn rate_limit(spec: LimitInputs, path: Option<&Path>) -> Result<Option<RateLimiting>, ConfigError> {
    let pick = |(flag, from_file, key): (Option<i64>, Option<i64>, &'static str)| match (
        flag, from_file,
    ) {
        (Some(v), _) => (Some(v), input(key, None)),
        (None, Some(v)) => (Some(v), input(key, path)),
        (None, None) => (None, input(key, None)),
    };
    let clients = pick(spec.clients);
    let options = spec.options.map(pick);
    if !spec.on {
        return match options.iter().chain([&clients]).find(|(v, _)| v.is_some()) {
            Some((_, given_in)) => Err(invalid(
                given_in,
                format!("only takes effect with {}; set both", spec.prefix),
            )),
            None => Ok(None),
        };
    }
    let d = spec.default;
    let [interval, burst, leak, kod] = &options;
    let limit = RateLimit::new(
        interval.0.unwrap_or(d.interval().into()),
        burst.0.unwrap_or(d.burst().into()),
        leak.0.unwrap_or(d.leak().into()),
        kod.0.unwrap_or(d.kod().into()),
    )
    .map_err(|e| {
        let at = options
            .iter()
            .find(|(_, i)| {
                i.key
                    .strip_prefix(spec.prefix)
                    .and_then(|k| k.strip_prefix('-'))
                    == Some(e.option)
            })
            .map_or(&interval.1, |(_, i)| i);
        invalid(
            at,
            format!("must be {} to {}, not {}", e.min, e.max, e.value),
        )
    })?;
    let n = clients.0.unwrap_or(spec.default_clients as i64);
    let max = ClientTable::MAX_CLIENTS as i64;
    if !(4..=max).contains(&n) {
        return Err(invalid(
            &clients.1,
            format!("{n} clients is outside 4..={max}"),
        ));
    }
    Ok(Some(RateLimiting {
        limit,
        clients: n as usize,
    }))
}

/// The access rules from the `allow` and `deny` lists. Each list is parsed alone, so that an
/// error names the input at fault; together they cannot fail once each has parsed.
fn access_rules(
    allow: &[String],
    allow_in: &Input,
    deny: &[String],
    deny_in: &Input,
) -> Result<Acl, ConfigError> {
    Acl::new(allow, &[]).map_err(|r| invalid(allow_in, r))?;
    Acl::new(&[], deny).map_err(|r| invalid(deny_in, r))?;
    Acl::new(allow, deny).map_err(|r| invalid(allow_in, r))
}

fn load(path: &Path) -> Result<File, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    toml::from_str(&text).map_err(|e| {
        // toml's own Display spans several lines with a snippet; the operator gets one line.
        let line = e
            .span()
            .map_or(1, |s| text[..s.start].matches('\n').count() + 1);
        ConfigError::Parse {
            path: path.to_owned(),
            line,
            reason: e.message().trim().to_owned(),
        }
    })
}

/// Reads a delegation bundle (`chime delegate`), refusing one that others may read (its online
/// keys sign as this server) and one whose certificates do not verify.
pub(crate) fn load_bundle(path: &Path) -> Result<chime_roughtime::Bundle, String> {
    let text =
        crate::config::secret_file::read_existing(path, "online keys that sign as this server")?;
    chime_roughtime::Bundle::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads the long-term key file, refusing one that others may read: a leaked long-term key lets
/// anyone sign times in this server's name.
fn load_key(path: &Path) -> Result<Zeroizing<[u8; 32]>, String> {
    let text = crate::config::secret_file::read_existing(path, "the Roughtime long-term key")?;
    chime_roughtime::parse_key_file(&text)
        .map(Zeroizing::new)
        .map_err(|e| format!("{}: not a key file: {e}", path.display()))
}

fn input(key: &'static str, file: Option<&Path>) -> Input {
    Input {
        key,
        file: file.map(Path::to_owned),
    }
}

fn invalid(input: &Input, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        input: input.clone(),
        reason: reason.into(),
    }
}

/// `--nts-ntp-server NAME[:PORT]`: the name (an IP address or a domain name) and the port if one
/// follows; an IPv6 address takes brackets when it does (`[2001:db8::1]:123`).
fn split_ntp_server(value: &str) -> Result<(String, Option<u16>), String> {
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

fn check_seconds_up_to(v: f64, max: f64) -> Result<(), String> {
    if !v.is_finite() || !(0.0..=max).contains(&v) {
        return Err(format!("{v} seconds is outside 0..={max}"));
    }
    Ok(())
}

fn check_positive(v: f64) -> Result<(), String> {
    cli::check_seconds(v)?;
    if v == 0.0 {
        return Err("must be more than 0 seconds".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn resolve_with(file: &str, flags: &[&str]) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chimed.toml");
        std::fs::write(&path, file).unwrap();
        let mut argv = vec!["chimed", "--config", path.to_str().unwrap()];
        argv.extend_from_slice(flags);
        Settings::resolve(&Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn defaults_match_rsntp() {
        let s = Settings::resolve(&Args::try_parse_from(["chimed"]).unwrap()).unwrap();
        assert_eq!((s.ipv4_threads, s.ipv6_threads), (1, 1));
        assert_eq!(s.ipv4_address, "0.0.0.0:123".parse().unwrap());
        assert_eq!(s.ipv6_address, "[::]:123".parse().unwrap());
        assert_eq!(s.server_address, "127.0.0.1:11123".parse().unwrap());
        assert_eq!(s.stale_after, Duration::from_secs(8));
    }

    #[test]
    fn flags_override_the_file() {
        let s = resolve_with("ipv4-threads = 3\nipv6-threads = 2\n", &["-4", "5"]).unwrap();
        assert_eq!((s.ipv4_threads, s.ipv6_threads), (5, 2));
    }

    #[test]
    fn unknown_key_names_file_and_line() {
        let e = resolve_with("ipv4-threads = 1\nipv4-thread = 2\n", &[]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("line 2") && msg.contains("ipv4-thread"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "one line: {msg}");
    }

    #[test]
    fn bad_value_names_the_key_in_the_file() {
        let e = resolve_with("ipv4-address = \"[::1]:123\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("ipv4-address") && e.to_string().contains("chimed.toml"));
        let e = resolve_with("stale-after = 0.5\n", &[]).unwrap_err();
        assert!(e.to_string().contains("stale-after"), "{e}");
        let e = resolve_with("ipv4-threads = 0\nipv6-threads = 0\n", &[]).unwrap_err();
        assert!(e.to_string().contains("no NTP threads"), "{e}");
    }

    #[test]
    fn timezone_needs_tz_offset_and_a_real_zone() {
        let e = resolve_with("timezone = \"Asia/Kolkata\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("tz-offset"), "{e}");
        let s = resolve_with("tz-offset = true\ntimezone = \"Asia/Kolkata\"\n", &[]).unwrap();
        assert_eq!(s.tz_offset, Some(Some("Asia/Kolkata".into())));
        let e = resolve_with("", &["--tz-offset", "--timezone", "Nowhere/Atlantis"]).unwrap_err();
        assert!(e.to_string().contains("Nowhere/Atlantis"), "{e}");
    }

    #[test]
    fn xdp_options_need_an_interface_and_a_known_mode() {
        let e = resolve_with("xdp-threads = 2\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("xdp-threads") && e.contains("without xdp"),
            "{e}"
        );
        let e = resolve_with("", &["--xdp-fallback"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--xdp-fallback"), "{e}");
        let e = resolve_with("xdp = \"eth0\"\n", &["--xdp-mode", "fast"]).unwrap_err();
        assert!(e.to_string().contains("\"fast\""), "{e}");
        let e = resolve_with("xdp = \"eth0/1\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an interface name"), "{e}");
        let s = resolve_with(
            "xdp = \"eth0\"\nxdp-mode = \"zero-copy\"\n",
            &["--xdp-threads", "4"],
        )
        .unwrap();
        assert_eq!(
            s.xdp,
            Some(Xdp {
                interface: "eth0".into(),
                threads: 4,
                mode: Some(chime_udp::xdp::XdpMode::ZeroCopy),
                fallback: false,
            })
        );
        let s = resolve_with("", &[]).unwrap();
        assert_eq!(s.xdp, None);
    }

    /// A Roughtime key file of seed [7; 32] in `dir`, with this mode.
    fn key_file(dir: &tempfile::TempDir, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let key = dir.path().join("key");
        std::fs::write(&key, chime_roughtime::encode_key_file(&[7; 32]).as_bytes()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        key
    }

    #[test]
    fn roughtime_key_file_is_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(&dir, 0o644);
        let flag = ["--roughtime-key", key.to_str().unwrap()];
        let e = resolve_with("", &flag).unwrap_err().to_string();
        assert!(e.contains("--roughtime-key") && e.contains("0644"), "{e}");

        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = resolve_with("", &flag).unwrap();
        let rt = s.roughtime.unwrap();
        let RoughtimeKeys::LongTerm { seed, .. } = &rt.keys else {
            panic!("not the long-term key");
        };
        assert_eq!(**seed, [7; 32]);
        assert_eq!(rt.ipv4_address, "0.0.0.0:5319".parse().unwrap());
        let tcp = rt.tcp.unwrap();
        assert_eq!((tcp.connections, tcp.per_address), (1024, 16));
        assert_eq!(tcp.idle, Duration::from_secs(10));
        let off = ["--roughtime-tcp-connections", "0"];
        let udp_only = resolve_with("", &[&flag[..], &off[..]].concat()).unwrap();
        assert_eq!(udp_only.roughtime.unwrap().tcp, None);
        assert!(
            !format!("{rt:?}").contains("07, 07"),
            "the seed must not be printed"
        );

        std::fs::write(&key, "not a key\n").unwrap();
        let e = resolve_with("", &flag).unwrap_err().to_string();
        assert!(e.contains("not a key file") && e.contains("line 1"), "{e}");
        let e = resolve_with("roughtime-key = \"/nonexistent/key\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/key"), "{e}");
    }

    #[test]
    fn a_delegation_bundle_is_checked_and_not_with_a_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(&dir, 0o600);
        let long = chime_roughtime::LongTermKey::from_seed(&[7; 32]);
        let plan = chime_roughtime::BundlePlan {
            start_unix_s: 1_795_000_000,
            span_s: 86_400,
            step_s: 3600,
            window_s: 7200,
        };
        let bundle = chime_roughtime::make_bundle(&long, plan, || [9; 32]).unwrap();
        let file = dir.path().join("bundle");
        std::fs::write(&file, bundle.encode().as_bytes()).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = file.to_str().unwrap();
        let s = resolve_with("", &["--roughtime-delegation", f]).unwrap();
        let RoughtimeKeys::Bundle { bundle: read, .. } = &s.roughtime.unwrap().keys else {
            panic!("not the bundle");
        };
        assert_eq!(read.windows().len(), bundle.windows().len());
        let both = [
            "--roughtime-delegation",
            f,
            "--roughtime-key",
            key.to_str().unwrap(),
        ];
        let e = resolve_with("", &both).unwrap_err().to_string();
        assert!(
            e.starts_with("--roughtime-delegation: not with roughtime-key"),
            "{e}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = resolve_with("", &["--roughtime-delegation", f])
            .unwrap_err()
            .to_string();
        assert!(e.contains("readable by group or others (mode 0640)"), "{e}");
        std::fs::write(&file, "frob\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = resolve_with("", &["--roughtime-delegation", f])
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("bundle: line 1: expected long-term-public, window or cert"),
            "{e}"
        );
    }

    #[test]
    fn each_service_has_its_own_receive_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(&dir, 0o600);
        let flag = ["--roughtime-key", key.to_str().unwrap()];

        let s = resolve_with("", &flag).unwrap();
        assert_eq!(s.recv_buffer, 4 << 20);
        assert_eq!(s.roughtime.unwrap().recv_buffer, 16 << 20);

        let s = resolve_with("recv-buffer = 8192\nroughtime-recv-buffer = 65536\n", &flag).unwrap();
        assert_eq!(s.recv_buffer, 8192);
        assert_eq!(s.roughtime.unwrap().recv_buffer, 65536);

        let e = resolve_with("roughtime-recv-buffer = 100\n", &flag)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("chimed.toml") && e.contains("roughtime-recv-buffer") && e.contains("4096"),
            "{e}"
        );
        let e = resolve_with("recv-buffer = 2147483648\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("recv-buffer") && e.contains("outside"), "{e}");
    }

    #[test]
    fn a_fleet_key_serves_nts_without_a_certificate_with_its_own_period() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fleet");
        std::fs::write(&file, format!("secret {}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = file.to_str().unwrap();
        let s = resolve_with("", &["--nts-fleet-key", f, "--nts-rotation", "3600"]).unwrap();
        assert!(s.nts.is_none(), "no certificate: no NTS-KE");
        let fleet = s.nts_fleet.unwrap();
        assert_eq!(fleet.period, Duration::from_secs(3600));
        assert!(fleet.secrets.1.is_none());
        // Without a fleet key, a rotation still needs a certificate.
        let e = resolve_with("", &["--nts-rotation", "3600"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--nts-rotation: only takes effect"), "{e}");
    }

    #[test]
    fn the_ntp_server_nts_ke_names_may_carry_a_port() {
        let ok = |v: &str| split_ntp_server(v).unwrap();
        assert_eq!(ok("ntp.example.net"), ("ntp.example.net".into(), None));
        assert_eq!(ok("192.0.2.1:4123"), ("192.0.2.1".into(), Some(4123)));
        assert_eq!(ok("2001:db8::1"), ("2001:db8::1".into(), None));
        assert_eq!(ok("[2001:db8::1]:123"), ("2001:db8::1".into(), Some(123)));
        assert_eq!(ok("[2001:db8::1]"), ("2001:db8::1".into(), None));
        for (bad, says) in [
            ("ntp example", "is not an IP address or a domain name"),
            ("host:0", "\"0\" is not a port"),
            ("host:99999", "\"99999\" is not a port"),
            ("[2001:db8::1", "no ] after the IPv6 address"),
            ("[2001:db8::1]x", "only :PORT may follow ]"),
        ] {
            let e = split_ntp_server(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn shedding_is_on_by_default_and_its_settings_are_checked() {
        let s = resolve_with("", &[]).unwrap();
        assert_eq!(s.shed, Some(ShedConfig::default()));
        let s = resolve_with("shed-target = 0.01\nshed-interval = 0.25\n", &[]).unwrap();
        let shed = s.shed.unwrap();
        assert_eq!(
            (shed.target, shed.interval),
            (Duration::from_millis(10), Duration::from_millis(250))
        );
        // The flag wins over the file; 0 turns shedding off.
        let s = resolve_with("shed-target = 0.01\n", &["--shed-target", "0"]).unwrap();
        assert_eq!(s.shed, None);
        for (file, key) in [
            ("shed-target = 2.0\n", "shed-target"),
            ("shed-target = -0.1\n", "shed-target"),
            ("shed-interval = 11.0\n", "shed-interval"),
        ] {
            let e = resolve_with(file, &[]).unwrap_err().to_string();
            assert!(
                e.contains("chimed.toml") && e.contains(key) && e.contains("outside"),
                "{file}: {e}"
            );
        }
        let e = resolve_with("", &["--shed-target", "1.5"])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--shed-target: 1.5 seconds is outside 0..=1"),
            "{e}"
        );
    }

    #[test]
    fn roughtime_values_are_checked_while_roughtime_is_off() {
        for (file, key) in [
            ("roughtime-recv-buffer = 100\n", "roughtime-recv-buffer"),
            ("roughtime-batch-size = 300\n", "roughtime-batch-size"),
            ("roughtime-gather = 1.0\n", "roughtime-gather"),
            ("roughtime-grease = 1.5\n", "roughtime-grease"),
            ("roughtime-grease = -0.1\n", "roughtime-grease"),
            (
                "roughtime-grease-kinds = \"path,bogus\"\n",
                "roughtime-grease-kinds",
            ),
            (
                "roughtime-grease-kinds = \"nonce,nonce\"\n",
                "roughtime-grease-kinds",
            ),
            ("roughtime-grease-kinds = \"\"\n", "roughtime-grease-kinds"),
            (
                "roughtime-ipv4-address = \"[::1]:5319\"\n",
                "roughtime-ipv4-address",
            ),
            ("roughtime-rotation = 0.0\n", "roughtime-rotation"),
            (
                "roughtime-tcp-per-address = 0\n",
                "roughtime-tcp-per-address",
            ),
            (
                "roughtime-tcp-connections = 2000000\n",
                "roughtime-tcp-connections",
            ),
            ("roughtime-tcp-idle = 0.0\n", "roughtime-tcp-idle"),
            ("roughtime-tcp-lifetime = -1.0\n", "roughtime-tcp-lifetime"),
        ] {
            let e = resolve_with(file, &[]).unwrap_err().to_string();
            assert!(e.contains("chimed.toml") && e.contains(key), "{file}: {e}");
        }
        // Good values without a key are fine, and Roughtime stays off.
        let file =
            "roughtime-batch-size = 64\nroughtime-ipv4-threads = 0\nroughtime-ipv6-threads = 0\n";
        assert!(resolve_with(file, &[]).unwrap().roughtime.is_none());
    }

    #[test]
    fn wrong_type_is_a_parse_error() {
        let e = resolve_with("ipv4-threads = \"two\"\n", &[]).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { line: 1, .. }), "{e}");
    }
}
