//! The one definition of chimed's settings: each config-file section is a struct whose doc comments
//! are both the `--help` text of its flags and the chimed.toml(5) text of its keys, and whose
//! flags' defaults are the keys' defaults.
//!
//! The same structs are read from the TOML file (serde, kebab-case keys, unknown keys refused) and
//! from the command line (clap, sections flattened into one parser); `resolve` layers the flags
//! that were given over the file over the defaults. Each flag's clap id is its key's dotted path
//! (`ntp.ipv4-threads`), which is how an error about a value finds the flag that gave it, and how
//! the man page files each flag under its section. Flags keep the names operators know (rsntp's
//! `-4`, `-a`, ...), so most differ from their key.
//!
//! A switch is a `bool`: `--ratelimit` alone means true, `--ratelimit=false` turns off a file's
//! `enabled = true`. A value with a range or form of its own is of a type from `values`, which
//! checks it as it is parsed, from a flag or the file alike; `resolve` checks the rest.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use serde::{Deserialize, Serialize};

use super::values::{
    Absolute, AtLeastOne, Burst, ClientLogSize, Clients, ControlSocket, DEFAULT_CONTROL_SOCKET,
    Gather, GreaseKinds, Interface, Interval, KeThreads, KeptKeys, Kod, Leak, LogLevel, NtpBatch,
    NtpServer, Positive, RecvBuffer, RoughtimeBatch, Seconds, Share, ShedInterval, ShedTarget,
    TcpConnections, Threads, TxLogSize, V4, V6, XdpMode,
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

    /// Write the manual pages chimed(8) and chimed.toml(5), the bash, zsh and fish completions,
    /// and the AsciiDoc references of docs/ (FLAGS.adoc's table, CONFIG.adoc) into DIR and exit
    /// (for packaging and the reference test)
    #[arg(long, value_name = "DIR", hide = true)]
    pub(crate) generate_docs: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) values: Config,

    /// The keys the command line set, as dotted paths: the flag layer holds these alone.
    #[arg(skip)]
    pub(crate) given: Vec<String>,
}

impl Args {
    /// Parses a command line (`argv[0]` first), noting which keys its flags set.
    pub(crate) fn parse_from<T: Into<OsString> + Clone>(
        argv: impl IntoIterator<Item = T>,
    ) -> Result<Self, clap::Error> {
        let matches = Self::command().try_get_matches_from(argv)?;
        let mut args = Self::from_arg_matches(&matches)?;
        let ids = matches
            .ids()
            .map(|id| id.as_str())
            .filter(|id| id.contains('.'));
        let from_flags = |id: &&str| matches.value_source(id) == Some(ValueSource::CommandLine);
        args.given = ids.filter(from_flags).map(str::to_owned).collect();
        Ok(args)
    }
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

/// Declares the config file's sections: each a struct whose fields are its keys, read by serde
/// from the file and by clap from the flags, and whose defaults are the flags' defaults.
macro_rules! sections {
    ($($(#[$doc:meta])* $heading:literal struct $name:ident { $($body:tt)* })*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
        #[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
        #[command(next_help_heading = $heading)]
        pub(crate) struct $name { $($body)* }

        impl Default for $name {
            fn default() -> Self {
                defaults()
            }
        }
    )*};
}

/// A section as no flag and no file sets it: every key's default, from its flag's definition.
fn defaults<T: clap::Args + FromArgMatches>() -> T {
    let cmd = T::augment_args(clap::Command::new("chimed").no_binary_name(true));
    let none = cmd.try_get_matches_from(std::iter::empty::<String>());
    T::from_arg_matches(&none.expect("no flags")).expect("every key has a default or is optional")
}

sections! {
/// `[ntp]`: the NTP service's sockets and threads.
"NTP [ntp]" struct Ntp {
    /// Number of NTP worker threads (one socket each) on the IPv4 address; 0 disables IPv4
    #[arg(id = "ntp.ipv4-threads", short = '4', long = "ipv4-threads")]
    #[arg(value_name = "N", default_value = "1")]
    pub(crate) ipv4_threads: Threads,

    /// Number of NTP worker threads (one socket each) on the IPv6 address; 0 disables IPv6
    #[arg(id = "ntp.ipv6-threads", short = '6', long = "ipv6-threads")]
    #[arg(value_name = "N", default_value = "1")]
    pub(crate) ipv6_threads: Threads,

    /// IPv4 address and port to serve NTP on
    #[arg(id = "ntp.ipv4-address", short = 'a', long = "ipv4-address")]
    #[arg(value_name = "ADDR:PORT", default_value = "0.0.0.0:123")]
    pub(crate) ipv4_address: V4,

    /// IPv6 address and port to serve NTP on
    #[arg(id = "ntp.ipv6-address", short = 'b', long = "ipv6-address")]
    #[arg(value_name = "ADDR:PORT", default_value = "[::]:123")]
    pub(crate) ipv6_address: V6,

    /// NTP datagrams received and answered per system call, 1 to 1024
    #[arg(id = "ntp.batch-size", long = "batch-size", value_name = "N", default_value = "64")]
    pub(crate) batch_size: NtpBatch,

    /// NTP sockets' receive buffer in bytes (SO_RCVBUFFORCE, else SO_RCVBUF; the kernel counts
    /// twice this against it). A 48-byte request takes 832 bytes of it on loopback, so 4 MiB
    /// holds some 10,000: 40 ms at 250k/s. Queued requests lose no accuracy: their receive time
    /// is the kernel's timestamp, and the client takes the wait out as T3 - T2
    #[arg(id = "ntp.recv-buffer", long = "recv-buffer", value_name = "BYTES")]
    #[arg(default_value = "4194304")]
    pub(crate) recv_buffer: RecvBuffer,

    /// NTP interleaved mode (RFC 9769, chronyd's `xleave`): keep the transmit times of this many
    /// recent replies to interleaved clients, 16 bytes each, so that each client's next reply can
    /// carry the kernel's time of the last one; 0 turns interleaved mode off
    #[arg(id = "ntp.interleaved-log", long = "interleaved-log", value_name = "N")]
    #[arg(default_value = "65536")]
    pub(crate) interleaved_log: TxLogSize,

    /// Experimental: answer NTPv5 requests as drafted (draft-ietf-ntp-ntpv5, revisions -08 and
    /// -09, each named exactly) on the same sockets, and echo the upgrade mark (`NTP5DRFT`) of a
    /// v4 client asking whether the server speaks v5. Off, a v5 request is dropped as
    /// `bad_version`. With NTS on, NTS-KE agrees on v5 with a client that prefers it, and serves
    /// NTS over v5. --ntpv5=false turns off the file's `v5 = true`
    #[arg(id = "ntp.v5", long = "ntpv5", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(default_value = "false", action = clap::ArgAction::Set)]
    pub(crate) v5: bool,

    /// Smear leap seconds: spread an inserted or deleted second over the 24 hours from noon
    /// before it to noon after (UTC), so that the time served never repeats or skips a second,
    /// and announce none. Smeared time is not UTC, and the NTP pool forbids it: for clients that
    /// all take their time from smearing servers only. NTPv5 replies say leap-smeared UTC (TAI
    /// stays TAI). --leap-smear=false turns off the file's `leap-smear = true`
    #[arg(id = "ntp.leap-smear", long = "leap-smear", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(default_value = "false", action = clap::ArgAction::Set)]
    pub(crate) leap_smear: bool,
}

/// `[upstream]`: the local chronyd whose state is served.
"Upstream [upstream]" struct Upstream {
    /// The local chronyd (or other NTP server) whose state is mirrored
    #[arg(id = "upstream.server-address", short = 's', long = "server-address")]
    #[arg(value_name = "ADDR:PORT", default_value = "127.0.0.1:11123")]
    pub(crate) server_address: SocketAddr,

    /// Seconds between polls of the upstream server
    #[arg(id = "upstream.poll-interval", long = "poll-interval")]
    #[arg(value_name = "SECS", default_value = "1")]
    pub(crate) poll_interval: Positive,

    /// Seconds without a good upstream reply after which clients are told the server is
    /// unsynchronised (leap 3, stratum 0); longer than poll-interval
    #[arg(id = "upstream.stale-after", long = "stale-after", value_name = "SECS")]
    #[arg(default_value = "8")]
    pub(crate) stale_after: Positive,
}

/// `[overload]`: shedding requests that waited too long, NTP and Roughtime alike.
"Overload [overload]" struct Overload {
    /// Under a standing overload, answer only requests that waited in the receive queue less
    /// than this and shed the older ones unanswered (counted as `shed`), NTP and Roughtime
    /// alike, so that clients get fresh replies rather than all of them late. A burst is still
    /// queued and answered in full. Up to 1 s; 0 turns shedding off (CoDel's target)
    #[arg(id = "overload.shed-target", long = "shed-target", value_name = "SECS")]
    #[arg(default_value = "0.005")]
    pub(crate) shed_target: ShedTarget,

    /// How long the oldest queued request must keep waiting longer than shed-target before
    /// shedding starts (it stops once the queue empties). Up to 10 s (CoDel's interval)
    #[arg(id = "overload.shed-interval", long = "shed-interval")]
    #[arg(value_name = "SECS", default_value = "0.1")]
    pub(crate) shed_interval: ShedInterval,
}

/// `[access]`: who is served.
"Access [access]" struct Access {
    /// Serve clients in this subnet (ADDR/PREFIX, ADDR or `all`); repeatable. Once any is given,
    /// clients no rule covers are not served. The most specific subnet decides; NTP and Roughtime
    /// alike [default: everyone is served]
    #[arg(id = "access.allow", long = "allow", value_name = "NET")]
    pub(crate) allow: Vec<String>,

    /// Do not serve clients in this subnet (ADDR/PREFIX, ADDR or `all`); repeatable. Wins over an
    /// allow of the same subnet. SIGHUP re-reads allow and deny from the config file
    /// [default: none]
    #[arg(id = "access.deny", long = "deny", value_name = "NET")]
    pub(crate) deny: Vec<String>,
}

/// `[ratelimit]`: per-client NTP rate limiting, as chronyd's `ratelimit`.
"NTP rate limiting [ratelimit]" struct RateLimit {
    /// Limit NTP responses per client address, as chronyd's `ratelimit`: each address earns one
    /// response per 2^interval seconds and may save up a burst; over the limit one request in
    /// 2^leak is answered anyway, one in 2^kod of the rest gets a Kiss-o'-Death RATE, and the
    /// others are dropped and counted as `rate_limited`. --ratelimit=false turns off the file's
    /// `enabled = true`
    #[arg(id = "ratelimit.enabled", long = "ratelimit", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(default_value = "false", action = clap::ArgAction::Set)]
    pub(crate) enabled: bool,

    /// Log2 of the seconds between responses to one address, -19 to 12 (3: one per 8 s)
    #[arg(id = "ratelimit.interval", long = "ratelimit-interval", value_name = "LOG2")]
    #[arg(allow_negative_numbers = true, default_value = "3")]
    pub(crate) interval: Interval,

    /// Responses an address may take back to back after being quiet, 1 to 255
    #[arg(id = "ratelimit.burst", long = "ratelimit-burst", value_name = "N")]
    #[arg(default_value = "8")]
    pub(crate) burst: Burst,

    /// Answer one in 2^LOG2 requests over the limit anyway, so that a flood with a spoofed
    /// address cannot cut its owner off; 1 to 4 (2: one in four)
    #[arg(id = "ratelimit.leak", long = "ratelimit-leak", value_name = "LOG2")]
    #[arg(default_value = "2")]
    pub(crate) leak: Leak,

    /// Send a Kiss-o'-Death RATE to one in 2^LOG2 of the requests over the limit that are not
    /// leaked; 0 (none) to 4
    #[arg(id = "ratelimit.kod", long = "ratelimit-kod", value_name = "LOG2")]
    #[arg(default_value = "0")]
    pub(crate) kod: Kod,

    /// Client addresses tracked at once, rounded up to a power of two, 32 bytes each
    #[arg(id = "ratelimit.clients", long = "ratelimit-clients", value_name = "N")]
    #[arg(default_value = "65536")]
    pub(crate) clients: Clients,
}

/// `[nts]`: NTS key exchange and cookie keys.
"NTS [nts]" struct Nts {
    /// Serve NTS (RFC 8915): the TLS certificate chain (PEM) of the NTS-KE server. NTS is off
    /// without it; needs private-key [default: none]
    #[arg(id = "nts.certificate", long = "nts-certificate", value_name = "FILE")]
    pub(crate) certificate: Option<PathBuf>,

    /// The private key (PEM) of the certificate; must not be readable by everyone [default: none]
    #[arg(id = "nts.private-key", long = "nts-private-key", value_name = "FILE")]
    pub(crate) private_key: Option<PathBuf>,

    /// Address and port of the NTS-KE server (TLS over TCP)
    #[arg(id = "nts.ke-address", long = "nts-ke-address")]
    #[arg(value_name = "ADDR:PORT", default_value = "[::]:4460")]
    pub(crate) ke_address: SocketAddr,

    /// Threads that run NTS-KE sessions (the TLS handshakes), apart from the NTP and Roughtime
    /// workers; the session limits and the NTS-KE rate limit hold across them all, 1 to 64
    #[arg(id = "nts.ke-threads", long = "nts-ke-threads", value_name = "N")]
    #[arg(default_value = "1")]
    pub(crate) ke_threads: KeThreads,

    /// Seconds between rotations of the key NTS cookies are sealed under; cookies sealed under
    /// the keys kept before it (kept-keys) still work
    #[arg(id = "nts.rotation", long = "nts-rotation", value_name = "SECS")]
    #[arg(default_value = "86400")]
    pub(crate) rotation: Positive,

    /// Earlier NTS cookie keys kept, each still opening the cookies it sealed: a cookie lasts this
    /// many rotations past its own (21 daily rotations: three weeks, as chronyd's cookies last), so
    /// a client that sleeps over a weekend needs no new NTS-KE session. Saved in dump-dir; a
    /// fleet's members must agree on it. 1 to 400
    #[arg(id = "nts.kept-keys", long = "nts-kept-keys", value_name = "N")]
    #[arg(default_value = "21")]
    pub(crate) kept_keys: KeptKeys,

    /// The NTP server NTS-KE sends clients to (an IP address or a domain name, and :PORT if not
    /// 123; an IPv6 address in brackets then), as chronyd's `ntsntpserver`, when it is not the
    /// NTS-KE server's own address. With it, NTP may be off (-4 0 -6 0): a member serving NTS-KE
    /// only, for a fleet's NTP servers [default: the NTS-KE server's own address]
    #[arg(id = "nts.ntp-server", long = "nts-ntp-server", value_name = "NAME[:PORT]")]
    pub(crate) ntp_server: Option<NtpServer>,

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

    /// Serve as a member of NTS pools (draft-ietf-ntp-nts-keyexchange-pool, as
    /// pendulum-project/nts-pool runs them): a pool's key-exchange front end whose
    /// Authentication Token is in this file (one `token TOKEN` line per pool; must not be
    /// readable by group or others) may ask what NTS-KE serves and have cookies made for keys it
    /// gives, keeping its session open between requests. Everyone else's NTS-KE is as ever.
    /// Re-read on SIGHUP [default: in no pool]
    #[arg(id = "nts.pool-tokens", long = "nts-pool-tokens", value_name = "FILE")]
    pub(crate) pool_tokens: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) ratelimit: NtsRateLimit,
}

/// `[nts.ratelimit]`: NTS-KE connections per client address, as chronyd's `ntsratelimit`.
"NTS-KE rate limiting [nts.ratelimit]" struct NtsRateLimit {
    /// Limit NTS-KE connections per client address, as chronyd's `ntsratelimit`: each address
    /// earns one connection per 2^interval seconds and may save up a burst; over the limit one in
    /// 2^leak is served anyway and the others are closed before the TLS handshake, counted as
    /// `rate_limited`. --nts-ratelimit=false turns off the file's `enabled = true`
    #[arg(id = "nts.ratelimit.enabled", long = "nts-ratelimit", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(default_value = "false", action = clap::ArgAction::Set)]
    pub(crate) enabled: bool,

    /// Log2 of the seconds between connections from one address, -19 to 12 (6: one per 64 s)
    #[arg(id = "nts.ratelimit.interval", long = "nts-ratelimit-interval", value_name = "LOG2")]
    #[arg(allow_negative_numbers = true, default_value = "6")]
    pub(crate) interval: Interval,

    /// Connections an address may make back to back after being quiet, 1 to 255
    #[arg(id = "nts.ratelimit.burst", long = "nts-ratelimit-burst", value_name = "N")]
    #[arg(default_value = "8")]
    pub(crate) burst: Burst,

    /// Serve one in 2^LOG2 connections over the limit anyway; 1 to 4 (2: one in four)
    #[arg(id = "nts.ratelimit.leak", long = "nts-ratelimit-leak", value_name = "LOG2")]
    #[arg(default_value = "2")]
    pub(crate) leak: Leak,
}

/// `[roughtime]`: the Roughtime service, off without a key.
"Roughtime [roughtime]" struct Roughtime {
    /// Serve Roughtime, signing with the long-term key in this file (made by `chime keygen`;
    /// must not be readable by group or others). Roughtime is off without it or a delegation
    /// [default: none]
    #[arg(id = "roughtime.key", long = "roughtime-key", value_name = "FILE")]
    pub(crate) key: Option<PathBuf>,

    /// Serve Roughtime from this delegation bundle (made by `chime delegate` where the long-term
    /// key lives; must not be readable by group or others) instead of a long-term key: online
    /// keys certified window by window, used in turn as time passes; outside every window
    /// nothing is signed. Not with key [default: none]
    #[arg(id = "roughtime.delegation", long = "roughtime-delegation", value_name = "FILE")]
    pub(crate) delegation: Option<PathBuf>,

    /// EXPERIMENTAL, part of no draft: also serve tannerryan's ML-DSA-44 suite (version
    /// 0x90000001, TCP only) with the long-term key in this file (`chime keygen --mldsa`; must
    /// not be readable by group or others), to clients that offer it. Needs Roughtime over TCP,
    /// and a chimed built with `--features mldsa` [default: off]
    #[arg(id = "roughtime.mldsa-key", long = "roughtime-mldsa-key", value_name = "FILE")]
    pub(crate) mldsa_key: Option<PathBuf>,

    /// Number of Roughtime worker threads on the IPv4 address; 0 disables it
    #[arg(id = "roughtime.ipv4-threads", long = "roughtime-ipv4-threads")]
    #[arg(value_name = "N", default_value = "1")]
    pub(crate) ipv4_threads: Threads,

    /// Number of Roughtime worker threads on the IPv6 address; 0 disables it
    #[arg(id = "roughtime.ipv6-threads", long = "roughtime-ipv6-threads")]
    #[arg(value_name = "N", default_value = "1")]
    pub(crate) ipv6_threads: Threads,

    /// IPv4 address and port to serve Roughtime on
    #[arg(id = "roughtime.ipv4-address", long = "roughtime-ipv4-address")]
    #[arg(value_name = "ADDR:PORT", default_value = "0.0.0.0:5319")]
    pub(crate) ipv4_address: V4,

    /// IPv6 address and port to serve Roughtime on
    #[arg(id = "roughtime.ipv6-address", long = "roughtime-ipv6-address")]
    #[arg(value_name = "ADDR:PORT", default_value = "[::]:5319")]
    pub(crate) ipv6_address: V6,

    /// Seconds between online-key rotations; each online key is valid for twice this, so the
    /// one in use always has at least this long to run
    #[arg(id = "roughtime.rotation", long = "roughtime-rotation")]
    #[arg(value_name = "SECS", default_value = "86400")]
    pub(crate) rotation: Positive,

    /// Roughtime requests received per system call, and the most one signature covers (up to
    /// 256). A full batch comes only under load, where a larger one costs less CPU per reply:
    /// one signature over 256 requests instead of 64 saves about a sixth
    #[arg(id = "roughtime.batch-size", long = "roughtime-batch-size")]
    #[arg(value_name = "N", default_value = "256")]
    pub(crate) batch_size: RoughtimeBatch,

    /// Roughtime sockets' receive buffer in bytes (SO_RCVBUFFORCE, else SO_RCVBUF; the kernel
    /// counts twice this against it). One 1 KiB request takes about 2.3 KiB of it, so 16 MiB
    /// holds some 14,000: a 70 ms stall of the thread at 200k requests/s
    #[arg(id = "roughtime.recv-buffer", long = "roughtime-recv-buffer")]
    #[arg(value_name = "BYTES", default_value = "16777216")]
    pub(crate) recv_buffer: RecvBuffer,

    /// Under light load, gather Roughtime requests for this long before signing: when a receive
    /// returns two or more but under a quarter of a batch, wait and add what arrived meanwhile.
    /// A lone request is never held back, nor anything once the load nears the thread's
    /// capacity. Up to 0.1 s; 0 signs whatever arrived at once
    #[arg(id = "roughtime.gather", long = "roughtime-gather")]
    #[arg(value_name = "SECS", default_value = "0.002")]
    pub(crate) gather: Gather,

    /// Make this share of Roughtime replies deliberately invalid ("grease"), each broken in one
    /// way a client must catch: a signature, the certificate, the Merkle path or index, the
    /// nonce, or the time under an unchanged signature. For test servers that clients are
    /// checked against; never a wrong time with a valid signature. 0 to 1
    #[arg(id = "roughtime.grease", long = "roughtime-grease", value_name = "SHARE")]
    #[arg(allow_negative_numbers = true, default_value = "0")]
    pub(crate) grease: Share,

    /// The kinds of grease to send, comma-separated: signature, certificate, path, index, nonce,
    /// time (nonce never in Google's replies, which carry none)
    #[arg(id = "roughtime.grease-kinds", long = "roughtime-grease-kinds")]
    #[arg(value_name = "KINDS", default_value = "signature,certificate,path,index,nonce,time")]
    pub(crate) grease_kinds: GreaseKinds,

    #[command(flatten)]
    pub(crate) tcp: RoughtimeTcp,
}

/// `[roughtime.tcp]`: Roughtime over TCP on the same addresses and ports (RFC 10049 §4).
"Roughtime over TCP [roughtime.tcp]" struct RoughtimeTcp {
    /// Most Roughtime connections over TCP open at once, served on the same addresses and ports
    /// as UDP (RFC 10049 §4); 0 serves Roughtime over UDP only
    #[arg(id = "roughtime.tcp.connections", long = "roughtime-tcp-connections")]
    #[arg(value_name = "N", default_value = "1024")]
    pub(crate) connections: TcpConnections,

    /// Most Roughtime TCP connections open at once from one client address (an IPv6 client
    /// counted by its /64); more are closed at once
    #[arg(id = "roughtime.tcp.per-address", long = "roughtime-tcp-per-address")]
    #[arg(value_name = "N", default_value = "16")]
    pub(crate) per_address: AtLeastOne,

    /// Seconds a Roughtime TCP connection may wait for its next whole request before it is
    /// closed
    #[arg(id = "roughtime.tcp.idle", long = "roughtime-tcp-idle")]
    #[arg(value_name = "SECS", default_value = "10")]
    pub(crate) idle: Positive,

    /// Seconds a Roughtime TCP connection may stay open, however busy
    #[arg(id = "roughtime.tcp.lifetime", long = "roughtime-tcp-lifetime")]
    #[arg(value_name = "SECS", default_value = "60")]
    pub(crate) lifetime: Positive,
}

/// `[xdp]`: serving through AF_XDP on one interface.
"AF_XDP [xdp]" struct Xdp {
    /// Serve NTP and Roughtime on this interface through AF_XDP: an XDP program hands their UDP
    /// to chimed before the kernel's network stack, everything else (ARP, ICMP, TCP, other
    /// ports) goes on to the kernel. Needs root or CAP_NET_ADMIN + CAP_BPF and a driver with
    /// native XDP. Bypasses the firewall and socket counters; no interleaved mode on this path.
    /// The sockets still serve what arrives elsewhere (see docs/XDP.adoc) [default: off]
    #[arg(id = "xdp.interface", long = "xdp", value_name = "IFACE")]
    pub(crate) interface: Option<Interface>,

    /// Worker threads, one per receive queue from queue 0
    #[arg(id = "xdp.threads", long = "xdp-threads", value_name = "N", default_value = "1")]
    pub(crate) threads: AtLeastOne,

    /// `zero-copy`, `copy`, or `auto` (zero-copy where the driver can, else copy)
    #[arg(id = "xdp.mode", long = "xdp-mode", value_name = "MODE", default_value = "auto")]
    pub(crate) mode: XdpMode,

    /// If XDP cannot start, log why and serve through the sockets alone instead of exiting
    #[arg(id = "xdp.fallback", long = "xdp-fallback", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(default_value = "false", action = clap::ArgAction::Set)]
    pub(crate) fallback: bool,

    /// Answer plain NTP client requests (48 bytes, versions 1 to 4, not interleaved) in the
    /// driver, with XDP_TX, from the state chimed writes there after every poll, and drops
    /// those from sources --allow/--deny refuse; the rest still goes to the AF_XDP workers. With
    /// --ratelimit it limits each address as the workers do, in a table of its own (at most 2^20
    /// addresses), and with --tz-offset shifts the times by the zone's offset as the workers do.
    /// NTPv5 requests, and v4 requests asking to upgrade to it, go to the workers, as does every
    /// request around a leap second (and, with --leap-smear, through the day of its smear). Its
    /// answers and drops are counted in the metrics, not in `chime clients`
    #[arg(id = "xdp.in-driver", long = "xdp-in-driver", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(default_value = "false", action = clap::ArgAction::Set)]
    pub(crate) in_driver: bool,
}

/// `[observe]`: logs, statistics and metrics.
"Logs and metrics [observe]" struct Observe {
    /// Log level or tracing filter (error, warn, info, debug, trace); SIGHUP puts the file's in
    /// force
    #[arg(id = "observe.log-level", long = "log-level", value_name = "LEVEL")]
    #[arg(default_value = "info")]
    pub(crate) log_level: LogLevel,

    /// Seconds between per-thread statistics log lines; 0 logs them only at exit
    #[arg(id = "observe.stats-interval", long = "stats-interval")]
    #[arg(value_name = "SECS", default_value = "60")]
    pub(crate) stats_interval: Seconds,

    /// Serve Prometheus metrics over HTTP at http://ADDR:PORT/metrics (port 0: any free port)
    /// [default: off]. Unauthenticated: bind it to loopback or a management network
    #[arg(id = "observe.metrics-address", long = "metrics-address")]
    #[arg(value_name = "ADDR:PORT")]
    pub(crate) metrics_address: Option<SocketAddr>,

    /// Answer `chime status` and `chime clients` on this Unix socket, as chronyd's command socket:
    /// made before privileges are dropped, mode 0660 in chimed's group, read-only; `none` turns it
    /// off. At the default path a socket that cannot be made is a warning (no /run/chimed off the
    /// unit), elsewhere an error
    #[arg(id = "observe.control-socket", long = "control-socket", value_name = "PATH")]
    #[arg(default_value = DEFAULT_CONTROL_SOCKET)]
    pub(crate) control_socket: ControlSocket,

    /// NTP clients (IPv4 addresses, IPv6 /64s) whose requests are counted for `chime clients`,
    /// as chronyd's client log: 64 bytes each, fixed at start whatever the number of addresses
    /// (the busiest are kept), plus 122 KiB for the distinct-client estimates; 0 turns it off
    #[arg(id = "observe.client-log", long = "client-log", value_name = "N")]
    #[arg(default_value = "16384")]
    pub(crate) client_log: ClientLogSize,
}

/// `[process]`: what the process becomes once its sockets are bound.
"Process [process]" struct Process {
    /// Run as this user after the sockets are bound [default: the user chimed starts as]
    #[arg(id = "process.user", short = 'u', long = "user", value_name = "USER")]
    pub(crate) user: Option<String>,

    /// Change root to this directory after the sockets are bound [default: none]
    #[arg(id = "process.root", short = 'r', long = "root", value_name = "DIR")]
    pub(crate) root: Option<Absolute>,

    /// Pin worker threads to these CPUs, round robin (flag: 0,1; file: [0, 1])
    /// [default: no pinning]
    #[arg(id = "process.cpus", long = "cpus", value_name = "LIST", value_delimiter = ',')]
    pub(crate) cpus: Vec<usize>,
}

/// `[tz-offset]`: timezone-offset mode.
"Timezone offset [tz-offset]" struct TzOffset {
    /// Serve a timezone's local time as if it were UTC, for devices that cannot be given a
    /// timezone. A bad idea for any other client; never applied to Roughtime.
    /// --tz-offset=false turns off the file's `enabled = true`
    #[arg(id = "tz-offset.enabled", long = "tz-offset", value_name = "BOOL")]
    #[arg(num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    #[arg(default_value = "false", action = clap::ArgAction::Set)]
    pub(crate) enabled: bool,

    /// The IANA timezone for tz-offset [default: TZ, else /etc/localtime]
    #[arg(id = "tz-offset.timezone", long = "timezone", value_name = "NAME")]
    pub(crate) timezone: Option<String>,
}
}
