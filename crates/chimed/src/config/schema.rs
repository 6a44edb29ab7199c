//! The one definition of chimed's settings: each config-file section is a struct whose doc comments
//! are both the `--help` text of its flags and the chimed.toml(5) text of its keys.
//!
//! The same structs are read from the TOML file (serde, kebab-case keys, unknown keys refused) and
//! from the command line (clap, sections flattened into one parser). Every field is an `Option` so
//! that either layer can leave it out: a flag that was not given does not hide the file's value.
//! Each flag's clap id is its key's dotted path (`ntp.ipv4-threads`), which is how an error about
//! a value finds the flag that gave it, and how the man page files each flag under its section.
//! Flags keep the names operators know (rsntp's `-4`, `-a`, ...), so most differ from their key.
//!
//! A switch is `Option<bool>`: `--ratelimit` alone means true, `--ratelimit=false` turns off a
//! file's `enabled = true`. A value with a range of its own is of a type from `values`, which
//! checks it as it is parsed, from a flag or the file alike; `resolve` checks the rest.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use serde::{Deserialize, Serialize};

use super::values::{
    AtLeastOne, Clients, Gather, KeThreads, NtpBatch, Positive, RecvBuffer, RoughtimeBatch,
    Seconds, Share, ShedInterval, ShedTarget, TcpConnections, Threads, TxLogSize,
};

/// chimed: serves NTP from every core beside a local chronyd.
#[derive(Debug, Parser)]
#[command(name = "chimed", version, about, long_about = None)]
pub(crate) struct Args {
    /// Read settings from this TOML file (flags given here override it)
    #[arg(short = 'c', long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// Validate the flags and the config file, print the resolved settings and exit
    #[arg(long)]
    pub(crate) check_config: bool,

    /// Write the manual pages chimed(8) and chimed.toml(5) and the bash, zsh and fish completions
    /// into DIR and exit (for packaging)
    #[arg(long, value_name = "DIR", hide = true)]
    pub(crate) generate_docs: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) values: Config,
}

/// The config file's sections; the flags fill the same structure.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct Config {
    #[command(flatten)]
    pub(crate) ntp: Ntp,
    #[command(flatten)]
    pub(crate) upstream: Upstream,
    #[command(flatten)]
    pub(crate) overload: Overload,
    #[command(flatten)]
    pub(crate) access: Access,
    #[command(flatten)]
    pub(crate) ratelimit: RateLimit,
    #[command(flatten)]
    pub(crate) nts: Nts,
    #[command(flatten)]
    pub(crate) roughtime: Roughtime,
    #[command(flatten)]
    pub(crate) xdp: Xdp,
    #[command(flatten)]
    pub(crate) observe: Observe,
    #[command(flatten)]
    pub(crate) process: Process,
    #[command(flatten)]
    pub(crate) tz_offset: TzOffset,
}

/// `[ntp]`: the NTP service's sockets and threads.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "NTP [ntp]")]
pub(crate) struct Ntp {
    /// Number of NTP worker threads (one socket each) on the IPv4 address; 0 disables IPv4
    /// [default: 1]
    #[arg(id = "ntp.ipv4-threads", short = '4', long = "ipv4-threads")]
    #[arg(value_name = "N")]
    pub(crate) ipv4_threads: Option<Threads>,

    /// Number of NTP worker threads (one socket each) on the IPv6 address; 0 disables IPv6
    /// [default: 1]
    #[arg(id = "ntp.ipv6-threads", short = '6', long = "ipv6-threads")]
    #[arg(value_name = "N")]
    pub(crate) ipv6_threads: Option<Threads>,

    /// IPv4 address and port to serve NTP on [default: 0.0.0.0:123]
    #[arg(id = "ntp.ipv4-address", short = 'a', long = "ipv4-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) ipv4_address: Option<SocketAddr>,

    /// IPv6 address and port to serve NTP on [default: [::]:123]
    #[arg(id = "ntp.ipv6-address", short = 'b', long = "ipv6-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) ipv6_address: Option<SocketAddr>,

    /// NTP datagrams received and answered per system call, 1 to 1024 [default: 64]
    #[arg(id = "ntp.batch-size", long = "batch-size", value_name = "N")]
    pub(crate) batch_size: Option<NtpBatch>,

    /// NTP sockets' receive buffer in bytes (SO_RCVBUFFORCE, else SO_RCVBUF; the kernel counts
    /// twice this against it). Queued requests lose no accuracy: their receive time is the
    /// kernel's timestamp [default: 4 MiB]
    #[arg(id = "ntp.recv-buffer", long = "recv-buffer", value_name = "BYTES")]
    pub(crate) recv_buffer: Option<RecvBuffer>,

    /// NTP interleaved mode (RFC 9769, chronyd's `xleave`): keep the transmit times of this many
    /// recent replies to interleaved clients, 16 bytes each, so that each client's next reply can
    /// carry the kernel's time of the last one; 0 turns interleaved mode off [default: 65536]
    #[arg(id = "ntp.interleaved-log", long = "interleaved-log", value_name = "N")]
    pub(crate) interleaved_log: Option<TxLogSize>,
}

/// `[upstream]`: the local chronyd whose state is served.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Upstream [upstream]")]
pub(crate) struct Upstream {
    /// The local chronyd (or other NTP server) whose state is mirrored [default: 127.0.0.1:11123]
    #[arg(id = "upstream.server-address", short = 's', long = "server-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) server_address: Option<SocketAddr>,

    /// Seconds between polls of the upstream server [default: 1]
    #[arg(id = "upstream.poll-interval", long = "poll-interval")]
    #[arg(value_name = "SECS")]
    pub(crate) poll_interval: Option<Positive>,

    /// Seconds without a good upstream reply after which clients are told the server is
    /// unsynchronised (leap 3, stratum 0) [default: 8]
    #[arg(id = "upstream.stale-after", long = "stale-after", value_name = "SECS")]
    pub(crate) stale_after: Option<Positive>,
}

/// `[overload]`: shedding requests that waited too long, NTP and Roughtime alike.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Overload [overload]")]
pub(crate) struct Overload {
    /// Under a standing overload, answer only requests that waited in the receive queue less
    /// than this and shed the older ones unanswered (counted as `shed`), NTP and Roughtime
    /// alike, so that clients get fresh replies rather than all of them late. A burst is still
    /// queued and answered in full. Up to 1 s; 0 turns shedding off [default: 0.005]
    #[arg(id = "overload.shed-target", long = "shed-target", value_name = "SECS")]
    pub(crate) shed_target: Option<ShedTarget>,

    /// How long the oldest queued request must keep waiting longer than shed-target before
    /// shedding starts (it stops once the queue empties). Up to 10 s [default: 0.1]
    #[arg(id = "overload.shed-interval", long = "shed-interval")]
    #[arg(value_name = "SECS")]
    pub(crate) shed_interval: Option<ShedInterval>,
}

/// `[access]`: who is served.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Access [access]")]
pub(crate) struct Access {
    /// Serve clients in this subnet (ADDR/PREFIX, ADDR or `all`); repeatable. Once any is given,
    /// clients no rule covers are not served. The most specific subnet decides; NTP and Roughtime
    /// alike [default: everyone is served]
    #[arg(id = "access.allow", long = "allow")]
    #[arg(value_name = "NET", action = clap::ArgAction::Append)]
    pub(crate) allow: Option<Vec<String>>,

    /// Do not serve clients in this subnet (ADDR/PREFIX, ADDR or `all`); repeatable. Wins over an
    /// allow of the same subnet. SIGHUP re-reads allow and deny from the config file
    #[arg(id = "access.deny", long = "deny")]
    #[arg(value_name = "NET", action = clap::ArgAction::Append)]
    pub(crate) deny: Option<Vec<String>>,
}

/// `[ratelimit]`: per-client NTP rate limiting, as chronyd's `ratelimit`.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "NTP rate limiting [ratelimit]")]
pub(crate) struct RateLimit {
    /// Limit NTP responses per client address, as chronyd's `ratelimit`: each address earns one
    /// response per 2^interval seconds and may save up a burst; over the limit one request in
    /// 2^leak is answered anyway, one in 2^kod of the rest gets a Kiss-o'-Death RATE, and the
    /// others are dropped and counted as `rate_limited`. --ratelimit=false turns off the file's
    /// `enabled = true` [default: off]
    #[arg(id = "ratelimit.enabled", long = "ratelimit")]
    #[arg(value_name = "BOOL", num_args = 0..=1, require_equals = true)]
    #[arg(default_missing_value = "true")]
    pub(crate) enabled: Option<bool>,

    /// Log2 of the seconds between responses to one address, -19 to 12 [default: 3, one per 8 s]
    #[arg(id = "ratelimit.interval", long = "ratelimit-interval")]
    #[arg(value_name = "LOG2", allow_negative_numbers = true)]
    pub(crate) interval: Option<i64>,

    /// Responses an address may take back to back after being quiet, 1 to 255 [default: 8]
    #[arg(id = "ratelimit.burst", long = "ratelimit-burst", value_name = "N")]
    pub(crate) burst: Option<i64>,

    /// Answer one in 2^LOG2 requests over the limit anyway, so that a flood with a spoofed
    /// address cannot cut its owner off; 1 to 4 [default: 2, one in four]
    #[arg(id = "ratelimit.leak", long = "ratelimit-leak", value_name = "LOG2")]
    pub(crate) leak: Option<i64>,

    /// Send a Kiss-o'-Death RATE to one in 2^LOG2 of the requests over the limit that are not
    /// leaked; 0 (none) to 4 [default: 0]
    #[arg(id = "ratelimit.kod", long = "ratelimit-kod", value_name = "LOG2")]
    pub(crate) kod: Option<i64>,

    /// Client addresses tracked at once, rounded up to a power of two, 32 bytes each; 4 to
    /// 16777216 [default: 65536]
    #[arg(id = "ratelimit.clients", long = "ratelimit-clients", value_name = "N")]
    pub(crate) clients: Option<Clients>,
}

/// `[nts]`: NTS key exchange and cookie keys.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "NTS [nts]")]
pub(crate) struct Nts {
    /// Serve NTS (RFC 8915): the TLS certificate chain (PEM) of the NTS-KE server. NTS is off
    /// without it; needs private-key
    #[arg(id = "nts.certificate", long = "nts-certificate", value_name = "FILE")]
    pub(crate) certificate: Option<PathBuf>,

    /// The private key (PEM) of the certificate; must not be readable by everyone
    #[arg(id = "nts.private-key", long = "nts-private-key", value_name = "FILE")]
    pub(crate) private_key: Option<PathBuf>,

    /// Address and port of the NTS-KE server (TLS over TCP) [default: [::]:4460]
    #[arg(id = "nts.ke-address", long = "nts-ke-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) ke_address: Option<SocketAddr>,

    /// Threads that run NTS-KE sessions (the TLS handshakes), apart from the NTP and Roughtime
    /// workers; the session limits and the NTS-KE rate limit hold across them all, 1 to 64
    /// [default: 1]
    #[arg(id = "nts.ke-threads", long = "nts-ke-threads", value_name = "N")]
    pub(crate) ke_threads: Option<KeThreads>,

    /// Seconds between rotations of the key NTS cookies are sealed under; cookies sealed under
    /// the key before still work [default: 86400]
    #[arg(id = "nts.rotation", long = "nts-rotation", value_name = "SECS")]
    pub(crate) rotation: Option<Positive>,

    /// The NTP server NTS-KE sends clients to (an IP address or a domain name, and :PORT if not
    /// 123; an IPv6 address in brackets then), as chronyd's `ntsntpserver`, when it is not the
    /// NTS-KE server's own address. With it, NTP may be off (-4 0 -6 0): a member serving NTS-KE
    /// only, for a fleet's NTP servers [default: the same]
    #[arg(
        id = "nts.ntp-server",
        long = "nts-ntp-server",
        value_name = "NAME[:PORT]"
    )]
    pub(crate) ntp_server: Option<String>,

    /// Keep the NTS cookie keys in this directory (file `nts-cookie-keys`, mode 0600), as chronyd's
    /// `ntsdumpdir`: read at start and rewritten at every rotation, so clients' cookies outlive a
    /// restart [default: memory only]
    #[arg(id = "nts.dump-dir", long = "nts-dump-dir", value_name = "DIR")]
    pub(crate) dump_dir: Option<PathBuf>,

    /// Derive the NTS cookie keys from the fleet secret in this file (made by `chime
    /// nts-fleet-key`; must not be readable by group or others), so that every server holding it
    /// opens the cookies of every other: one key per rotation period of the Unix clock, the
    /// periods either side and a `previous` secret in the file opening too. Without a
    /// certificate, authenticated NTP only (cookies from the fleet's NTS-KE members). Re-read on
    /// SIGHUP; not with dump-dir [default: keys of this server alone]
    #[arg(id = "nts.fleet-key", long = "nts-fleet-key", value_name = "FILE")]
    pub(crate) fleet_key: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) ratelimit: NtsRateLimit,
}

/// `[nts.ratelimit]`: NTS-KE connections per client address, as chronyd's `ntsratelimit`.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "NTS-KE rate limiting [nts.ratelimit]")]
pub(crate) struct NtsRateLimit {
    /// Limit NTS-KE connections per client address, as chronyd's `ntsratelimit`: each address
    /// earns one connection per 2^interval seconds and may save up a burst; over the limit one in
    /// 2^leak is served anyway and the others are closed before the TLS handshake, counted as
    /// `rate_limited`. --nts-ratelimit=false turns off the file's `enabled = true` [default: off]
    #[arg(id = "nts.ratelimit.enabled", long = "nts-ratelimit")]
    #[arg(value_name = "BOOL", num_args = 0..=1, require_equals = true)]
    #[arg(default_missing_value = "true")]
    pub(crate) enabled: Option<bool>,

    /// Log2 of the seconds between connections from one address, -19 to 12
    /// [default: 6, one per 64 s]
    #[arg(id = "nts.ratelimit.interval", long = "nts-ratelimit-interval")]
    #[arg(value_name = "LOG2", allow_negative_numbers = true)]
    pub(crate) interval: Option<i64>,

    /// Connections an address may make back to back after being quiet, 1 to 255 [default: 8]
    #[arg(id = "nts.ratelimit.burst", long = "nts-ratelimit-burst")]
    #[arg(value_name = "N")]
    pub(crate) burst: Option<i64>,

    /// Serve one in 2^LOG2 connections over the limit anyway; 1 to 4 [default: 2, one in four]
    #[arg(id = "nts.ratelimit.leak", long = "nts-ratelimit-leak")]
    #[arg(value_name = "LOG2")]
    pub(crate) leak: Option<i64>,
}

/// `[roughtime]`: the Roughtime service, off without a key.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Roughtime [roughtime]")]
pub(crate) struct Roughtime {
    /// Serve Roughtime, signing with the long-term key in this file (made by `chime keygen`;
    /// must not be readable by group or others). Roughtime is off without it or a delegation
    #[arg(id = "roughtime.key", long = "roughtime-key", value_name = "FILE")]
    pub(crate) key: Option<PathBuf>,

    /// Serve Roughtime from this delegation bundle (made by `chime delegate` where the long-term
    /// key lives; must not be readable by group or others) instead of a long-term key: online
    /// keys certified window by window, used in turn as time passes; outside every window
    /// nothing is signed. Not with key
    #[arg(id = "roughtime.delegation", long = "roughtime-delegation")]
    #[arg(value_name = "FILE")]
    pub(crate) delegation: Option<PathBuf>,

    /// EXPERIMENTAL, part of no draft: also serve tannerryan's ML-DSA-44 suite (version
    /// 0x90000001, TCP only) with the long-term key in this file (`chime keygen --mldsa`; must
    /// not be readable by group or others), to clients that offer it. Needs Roughtime over TCP,
    /// and a chimed built with `--features mldsa` [default: off]
    #[arg(id = "roughtime.mldsa-key", long = "roughtime-mldsa-key")]
    #[arg(value_name = "FILE")]
    pub(crate) mldsa_key: Option<PathBuf>,

    /// Number of Roughtime worker threads on the IPv4 address; 0 disables it [default: 1]
    #[arg(id = "roughtime.ipv4-threads", long = "roughtime-ipv4-threads")]
    #[arg(value_name = "N")]
    pub(crate) ipv4_threads: Option<Threads>,

    /// Number of Roughtime worker threads on the IPv6 address; 0 disables it [default: 1]
    #[arg(id = "roughtime.ipv6-threads", long = "roughtime-ipv6-threads")]
    #[arg(value_name = "N")]
    pub(crate) ipv6_threads: Option<Threads>,

    /// IPv4 address and port to serve Roughtime on [default: 0.0.0.0:5319]
    #[arg(id = "roughtime.ipv4-address", long = "roughtime-ipv4-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) ipv4_address: Option<SocketAddr>,

    /// IPv6 address and port to serve Roughtime on [default: [::]:5319]
    #[arg(id = "roughtime.ipv6-address", long = "roughtime-ipv6-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) ipv6_address: Option<SocketAddr>,

    /// Seconds between online-key rotations; each online key is valid for twice this, so the
    /// one in use always has at least this long to run [default: 86400]
    #[arg(id = "roughtime.rotation", long = "roughtime-rotation")]
    #[arg(value_name = "SECS")]
    pub(crate) rotation: Option<Positive>,

    /// Roughtime requests received per system call, and the most one signature covers (up to
    /// 256). A full batch comes only under load, where a larger one costs less CPU per reply
    /// [default: 256]
    #[arg(id = "roughtime.batch-size", long = "roughtime-batch-size")]
    #[arg(value_name = "N")]
    pub(crate) batch_size: Option<RoughtimeBatch>,

    /// Roughtime sockets' receive buffer in bytes (SO_RCVBUFFORCE, else SO_RCVBUF; the kernel
    /// counts twice this against it). One 1 KiB request takes about 2.3 KiB of it, so the
    /// default holds some 14,000: a 70 ms stall of the thread at 200k requests/s [default: 16 MiB]
    #[arg(id = "roughtime.recv-buffer", long = "roughtime-recv-buffer")]
    #[arg(value_name = "BYTES")]
    pub(crate) recv_buffer: Option<RecvBuffer>,

    /// Under light load, gather Roughtime requests for this long before signing: when a receive
    /// returns two or more but under a quarter of a batch, wait and add what arrived meanwhile.
    /// A lone request is never held back, nor anything once the load nears the thread's
    /// capacity. Up to 0.1 s; 0 signs whatever arrived at once [default: 0.002]
    #[arg(id = "roughtime.gather", long = "roughtime-gather")]
    #[arg(value_name = "SECS")]
    pub(crate) gather: Option<Gather>,

    /// Make this share of Roughtime replies deliberately invalid ("grease"), each broken in one
    /// way a client must catch: a signature, the certificate, the Merkle path or index, the
    /// nonce, or the time under an unchanged signature. For test servers that clients are
    /// checked against; never a wrong time with a valid signature. 0 to 1 [default: 0]
    #[arg(id = "roughtime.grease", long = "roughtime-grease")]
    #[arg(value_name = "SHARE", allow_negative_numbers = true)]
    pub(crate) grease: Option<Share>,

    /// The kinds of grease to send, comma-separated: signature, certificate, path, index, nonce,
    /// time (nonce never in Google's replies, which carry none) [default: all]
    #[arg(id = "roughtime.grease-kinds", long = "roughtime-grease-kinds")]
    #[arg(value_name = "KINDS")]
    pub(crate) grease_kinds: Option<String>,

    #[command(flatten)]
    pub(crate) tcp: RoughtimeTcp,
}

/// `[roughtime.tcp]`: Roughtime over TCP on the same addresses and ports (RFC 10049 §4).
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Roughtime over TCP [roughtime.tcp]")]
pub(crate) struct RoughtimeTcp {
    /// Most Roughtime connections over TCP open at once, served on the same addresses and ports
    /// as UDP (RFC 10049 §4); 0 serves Roughtime over UDP only [default: 1024]
    #[arg(id = "roughtime.tcp.connections", long = "roughtime-tcp-connections")]
    #[arg(value_name = "N")]
    pub(crate) connections: Option<TcpConnections>,

    /// Most Roughtime TCP connections open at once from one client address; more are closed
    /// at once [default: 16]
    #[arg(id = "roughtime.tcp.per-address", long = "roughtime-tcp-per-address")]
    #[arg(value_name = "N")]
    pub(crate) per_address: Option<AtLeastOne>,

    /// Seconds a Roughtime TCP connection may wait for its next whole request before it is
    /// closed [default: 10]
    #[arg(id = "roughtime.tcp.idle", long = "roughtime-tcp-idle")]
    #[arg(value_name = "SECS")]
    pub(crate) idle: Option<Positive>,

    /// Seconds a Roughtime TCP connection may stay open, however busy [default: 60]
    #[arg(id = "roughtime.tcp.lifetime", long = "roughtime-tcp-lifetime")]
    #[arg(value_name = "SECS")]
    pub(crate) lifetime: Option<Positive>,
}

/// `[xdp]`: serving through AF_XDP on one interface.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "AF_XDP [xdp]")]
pub(crate) struct Xdp {
    /// Serve NTP and Roughtime on this interface through AF_XDP: an XDP program hands their UDP
    /// to chimed before the kernel's network stack, everything else (ARP, ICMP, TCP, other
    /// ports) goes on to the kernel. Needs root or CAP_NET_ADMIN + CAP_BPF and a driver with
    /// native XDP. Bypasses the firewall and socket counters; no interleaved mode on this path.
    /// The sockets still serve what arrives elsewhere (see docs/XDP.md) [default: off]
    #[arg(id = "xdp.interface", long = "xdp", value_name = "IFACE")]
    pub(crate) interface: Option<String>,

    /// Worker threads, one per receive queue from queue 0 [default: 1]
    #[arg(id = "xdp.threads", long = "xdp-threads", value_name = "N")]
    pub(crate) threads: Option<AtLeastOne>,

    /// `zero-copy`, `copy`, or `auto` (zero-copy where the driver can, else copy) [default: auto]
    #[arg(id = "xdp.mode", long = "xdp-mode", value_name = "MODE")]
    pub(crate) mode: Option<String>,

    /// If XDP cannot start, log why and serve through the sockets alone instead of exiting
    /// [default: exit]
    #[arg(id = "xdp.fallback", long = "xdp-fallback")]
    #[arg(value_name = "BOOL", num_args = 0..=1, require_equals = true)]
    #[arg(default_missing_value = "true")]
    pub(crate) fallback: Option<bool>,
}

/// `[observe]`: logs, statistics and metrics.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Logs and metrics [observe]")]
pub(crate) struct Observe {
    /// Log level or tracing filter (error, warn, info, debug, trace); SIGHUP puts the file's in
    /// force [default: info]
    #[arg(id = "observe.log-level", long = "log-level", value_name = "LEVEL")]
    pub(crate) log_level: Option<String>,

    /// Seconds between per-thread statistics log lines; 0 logs them only at exit [default: 60]
    #[arg(id = "observe.stats-interval", long = "stats-interval")]
    #[arg(value_name = "SECS")]
    pub(crate) stats_interval: Option<Seconds>,

    /// Serve Prometheus metrics over HTTP at http://ADDR:PORT/metrics (port 0: any free port)
    /// [default: off]. Unauthenticated: bind it to loopback or a management network
    #[arg(id = "observe.metrics-address", long = "metrics-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) metrics_address: Option<SocketAddr>,
}

/// `[process]`: what the process becomes once its sockets are bound.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Process [process]")]
pub(crate) struct Process {
    /// Run as this user after the sockets are bound
    #[arg(id = "process.user", short = 'u', long = "user", value_name = "USER")]
    pub(crate) user: Option<String>,

    /// Change root to this directory after the sockets are bound
    #[arg(id = "process.root", short = 'r', long = "root", value_name = "DIR")]
    pub(crate) root: Option<PathBuf>,

    /// Pin worker threads to these CPUs, round robin (flag: 0,1; file: [0, 1])
    /// [default: no pinning]
    #[arg(id = "process.cpus", long = "cpus")]
    #[arg(value_name = "LIST", value_delimiter = ',')]
    pub(crate) cpus: Option<Vec<usize>>,
}

/// `[tz-offset]`: timezone-offset mode.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Timezone offset [tz-offset]")]
pub(crate) struct TzOffset {
    /// Serve a timezone's local time as if it were UTC, for devices that cannot be given a
    /// timezone. A bad idea for any other client; never applied to Roughtime.
    /// --tz-offset=false turns off the file's `enabled = true` [default: off]
    #[arg(id = "tz-offset.enabled", long = "tz-offset")]
    #[arg(value_name = "BOOL", num_args = 0..=1, require_equals = true)]
    #[arg(default_missing_value = "true")]
    pub(crate) enabled: Option<bool>,

    /// The IANA timezone for tz-offset [default: TZ, else /etc/localtime]
    #[arg(id = "tz-offset.timezone", long = "timezone", value_name = "NAME")]
    pub(crate) timezone: Option<String>,
}
