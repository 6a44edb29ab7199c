//! Command-line flags. Names and meanings follow rsntp (`-4`, `-6`, `-a`, `-b`, `-s`, `-u`, `-r`) so
//! that an operator can swap one daemon for the other; every flag may also be set in the config file
//! (same name, without the dashes), and a flag given on the command line wins.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// chimed: serves NTP from every core beside a local chronyd.
#[derive(Debug, Parser)]
#[command(name = "chimed", version, about, long_about = None)]
pub(crate) struct Args {
    /// Number of NTP worker threads (one socket each) on the IPv4 address; 0 disables IPv4
    /// [default: 1]
    #[arg(short = '4', long, value_name = "N", value_parser = parse_threads)]
    pub(crate) ipv4_threads: Option<usize>,

    /// Number of NTP worker threads (one socket each) on the IPv6 address; 0 disables IPv6
    /// [default: 1]
    #[arg(short = '6', long, value_name = "N", value_parser = parse_threads)]
    pub(crate) ipv6_threads: Option<usize>,

    /// IPv4 address and port to serve NTP on [default: 0.0.0.0:123]
    #[arg(short = 'a', long, value_name = "ADDR:PORT")]
    pub(crate) ipv4_address: Option<SocketAddr>,

    /// IPv6 address and port to serve NTP on [default: [::]:123]
    #[arg(short = 'b', long, value_name = "ADDR:PORT")]
    pub(crate) ipv6_address: Option<SocketAddr>,

    /// The local chronyd (or other NTP server) whose state is mirrored [default: 127.0.0.1:11123]
    #[arg(short = 's', long, value_name = "ADDR:PORT")]
    pub(crate) server_address: Option<SocketAddr>,

    /// Run as this user after the sockets are bound
    #[arg(short = 'u', long, value_name = "USER")]
    pub(crate) user: Option<String>,

    /// Change root to this directory after the sockets are bound
    #[arg(short = 'r', long, value_name = "DIR")]
    pub(crate) root: Option<PathBuf>,

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

    /// Seconds between polls of the upstream server [default: 1]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) poll_interval: Option<f64>,

    /// Seconds without a good upstream reply after which clients are told the server is
    /// unsynchronised (leap 3, stratum 0) [default: 8]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) stale_after: Option<f64>,

    /// NTP sockets' receive buffer in bytes (SO_RCVBUFFORCE, else SO_RCVBUF; the kernel counts
    /// twice this against it). Queued requests lose no accuracy: their receive time is the
    /// kernel's timestamp [default: 4 MiB]
    #[arg(long, value_name = "BYTES", value_parser = parse_recv_buffer)]
    pub(crate) recv_buffer: Option<usize>,

    /// NTP datagrams received and answered per system call [default: 64]
    #[arg(long, value_name = "N", value_parser = parse_batch)]
    pub(crate) batch_size: Option<usize>,

    /// Under a standing overload, answer only requests that waited in the receive queue less
    /// than this and shed the older ones unanswered (counted as `shed`), NTP and Roughtime
    /// alike, so that clients get fresh replies rather than all of them late. A burst is still
    /// queued and answered in full. Up to 1 s; 0 turns shedding off [default: 0.005]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds_or_zero)]
    pub(crate) shed_target: Option<f64>,

    /// --shed-target: how long the oldest queued request must keep waiting longer than the
    /// target before shedding starts (it stops once the queue empties). Up to 10 s [default: 0.1]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds_or_zero)]
    pub(crate) shed_interval: Option<f64>,

    /// Pin worker threads to these CPUs, round robin (e.g. 0,1) [default: no pinning]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub(crate) cpus: Option<Vec<usize>>,

    /// Serve NTP and Roughtime on this interface through AF_XDP: an XDP program hands their UDP
    /// to chimed before the kernel's network stack, everything else (ARP, ICMP, TCP, other
    /// ports) goes on to the kernel. Needs root or CAP_NET_ADMIN + CAP_BPF and a driver with
    /// native XDP. Bypasses the firewall and socket counters; no interleaved mode on this path.
    /// The sockets still serve what arrives elsewhere (see docs/XDP.md) [default: off]
    #[arg(long, value_name = "IFACE")]
    pub(crate) xdp: Option<String>,

    /// --xdp: worker threads, one per receive queue from queue 0 [default: 1]
    #[arg(long, value_name = "N")]
    pub(crate) xdp_threads: Option<usize>,

    /// --xdp: `zero-copy`, `copy`, or `auto` (zero-copy where the driver can, else copy)
    /// [default: auto]
    #[arg(long, value_name = "MODE")]
    pub(crate) xdp_mode: Option<String>,

    /// --xdp: if XDP cannot start, log why and serve through the sockets alone instead of
    /// exiting [default: exit]
    #[arg(long)]
    pub(crate) xdp_fallback: bool,

    /// Seconds between per-thread statistics log lines; 0 logs them only at exit [default: 60]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds_or_zero)]
    pub(crate) stats_interval: Option<f64>,

    /// Serve clients in this subnet (ADDR/PREFIX, ADDR or `all`); repeatable. Once any is given,
    /// clients no rule covers are not served. The most specific subnet decides; NTP and Roughtime
    /// alike [default: everyone is served]
    #[arg(long, value_name = "NET", action = clap::ArgAction::Append)]
    pub(crate) allow: Option<Vec<String>>,

    /// Do not serve clients in this subnet (ADDR/PREFIX, ADDR or `all`); repeatable. Wins over an
    /// --allow of the same subnet. SIGHUP re-reads allow and deny from the config file
    #[arg(long, value_name = "NET", action = clap::ArgAction::Append)]
    pub(crate) deny: Option<Vec<String>>,

    /// Limit NTP responses per client address, as chronyd's `ratelimit`: each address earns one
    /// response per 2^interval seconds and may save up a burst; over the limit one request in
    /// 2^leak is answered anyway, one in 2^kod of the rest gets a Kiss-o'-Death RATE, and the
    /// others are dropped and counted as `rate_limited` [default: off]
    #[arg(long)]
    pub(crate) ratelimit: bool,

    /// --ratelimit: log2 of the seconds between responses to one address, -19 to 12
    /// [default: 3, one per 8 s]
    #[arg(long, value_name = "LOG2", allow_negative_numbers = true)]
    pub(crate) ratelimit_interval: Option<i64>,

    /// --ratelimit: responses an address may take back to back after being quiet, 1 to 255
    /// [default: 8]
    #[arg(long, value_name = "N")]
    pub(crate) ratelimit_burst: Option<i64>,

    /// --ratelimit: answer one in 2^LOG2 requests over the limit anyway, so that a flood with a
    /// spoofed address cannot cut its owner off; 1 to 4 [default: 2, one in four]
    #[arg(long, value_name = "LOG2")]
    pub(crate) ratelimit_leak: Option<i64>,

    /// --ratelimit: send a Kiss-o'-Death RATE to one in 2^LOG2 of the requests over the limit
    /// that are not leaked; 0 (none) to 4 [default: 0]
    #[arg(long, value_name = "LOG2")]
    pub(crate) ratelimit_kod: Option<i64>,

    /// --ratelimit: client addresses tracked at once, rounded up to a power of two, 32 bytes
    /// each; 4 to 16777216 [default: 65536]
    #[arg(long, value_name = "N")]
    pub(crate) ratelimit_clients: Option<usize>,

    /// NTP interleaved mode (RFC 9769, chronyd's `xleave`): keep the transmit times of this many
    /// recent replies to interleaved clients, 16 bytes each, so that each client's next reply can
    /// carry the kernel's time of the last one; 0 turns interleaved mode off [default: 65536]
    #[arg(long, value_name = "N")]
    pub(crate) interleaved_log: Option<usize>,

    /// Serve NTS (RFC 8915): the TLS certificate chain (PEM) of the NTS-KE server. NTS is off
    /// without it; needs --nts-private-key
    #[arg(long, value_name = "FILE")]
    pub(crate) nts_certificate: Option<PathBuf>,

    /// The private key (PEM) of --nts-certificate; must not be readable by everyone
    #[arg(long, value_name = "FILE")]
    pub(crate) nts_private_key: Option<PathBuf>,

    /// Address and port of the NTS-KE server (TLS over TCP) [default: [::]:4460]
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) nts_ke_address: Option<SocketAddr>,

    /// Threads that run NTS-KE sessions (the TLS handshakes), apart from the NTP and Roughtime
    /// workers; the session limits and --nts-ratelimit hold across them all, 1 to 64 [default: 1]
    #[arg(long, value_name = "N")]
    pub(crate) nts_ke_threads: Option<usize>,

    /// Seconds between rotations of the key NTS cookies are sealed under; cookies sealed under
    /// the key before still work [default: 86400]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) nts_rotation: Option<f64>,

    /// The NTP server NTS-KE sends clients to (an IP address or a domain name, and :PORT if not
    /// 123; an IPv6 address in brackets then), as chronyd's `ntsntpserver`, when it is not the
    /// NTS-KE server's own address. With it, NTP may be off (-4 0 -6 0): a member serving NTS-KE
    /// only, for a fleet's NTP servers [default: the same]
    #[arg(long, value_name = "NAME[:PORT]")]
    pub(crate) nts_ntp_server: Option<String>,

    /// Limit NTS-KE connections per client address, as chronyd's `ntsratelimit`: each address
    /// earns one connection per 2^interval seconds and may save up a burst; over the limit one in
    /// 2^leak is served anyway and the others are closed before the TLS handshake, counted as
    /// `rate_limited` [default: off]
    #[arg(long)]
    pub(crate) nts_ratelimit: bool,

    /// --nts-ratelimit: log2 of the seconds between connections from one address, -19 to 12
    /// [default: 6, one per 64 s]
    #[arg(long, value_name = "LOG2", allow_negative_numbers = true)]
    pub(crate) nts_ratelimit_interval: Option<i64>,

    /// --nts-ratelimit: connections an address may make back to back after being quiet, 1 to 255
    /// [default: 8]
    #[arg(long, value_name = "N")]
    pub(crate) nts_ratelimit_burst: Option<i64>,

    /// --nts-ratelimit: serve one in 2^LOG2 connections over the limit anyway; 1 to 4
    /// [default: 2, one in four]
    #[arg(long, value_name = "LOG2")]
    pub(crate) nts_ratelimit_leak: Option<i64>,

    /// Keep the NTS cookie keys in this directory (file `nts-cookie-keys`, mode 0600), as chronyd's
    /// `ntsdumpdir`: read at start and rewritten at every rotation, so clients' cookies outlive a
    /// restart [default: memory only]
    #[arg(long, value_name = "DIR")]
    pub(crate) nts_dump_dir: Option<PathBuf>,

    /// Derive the NTS cookie keys from the fleet secret in this file (made by `chime
    /// nts-fleet-key`; must not be readable by group or others), so that every server holding it
    /// opens the cookies of every other: one key per --nts-rotation period of the Unix clock, the
    /// periods either side and a `previous` secret in the file opening too. Without
    /// --nts-certificate, authenticated NTP only (cookies from the fleet's NTS-KE members).
    /// Re-read on SIGHUP; not with --nts-dump-dir [default: keys of this server alone]
    #[arg(long, value_name = "FILE")]
    pub(crate) nts_fleet_key: Option<PathBuf>,

    /// Serve Prometheus metrics over HTTP at http://ADDR:PORT/metrics (port 0: any free port)
    /// [default: off]. Unauthenticated: bind it to loopback or a management network
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) metrics_address: Option<SocketAddr>,

    /// Serve Roughtime, signing with the long-term key in this file (made by `chime keygen`;
    /// must not be readable by group or others). Roughtime is off without it
    #[arg(long, value_name = "FILE")]
    pub(crate) roughtime_key: Option<PathBuf>,

    /// Serve Roughtime from this delegation bundle (made by `chime delegate` where the long-term
    /// key lives; must not be readable by group or others) instead of a long-term key: online
    /// keys certified window by window, used in turn as time passes; outside every window
    /// nothing is signed. Not with --roughtime-key
    #[arg(long, value_name = "FILE")]
    pub(crate) roughtime_delegation: Option<PathBuf>,

    /// EXPERIMENTAL, part of no draft: also serve tannerryan's ML-DSA-44 suite (version
    /// 0x90000001, TCP only) with the long-term key in this file (`chime keygen --mldsa`; must
    /// not be readable by group or others), to clients that offer it. Needs Roughtime over TCP
    /// [default: off]
    #[arg(long, value_name = "FILE")]
    pub(crate) roughtime_mldsa_key: Option<PathBuf>,

    /// Number of Roughtime worker threads on the IPv4 address; 0 disables it [default: 1]
    #[arg(long, value_name = "N", value_parser = parse_threads)]
    pub(crate) roughtime_ipv4_threads: Option<usize>,

    /// Number of Roughtime worker threads on the IPv6 address; 0 disables it [default: 1]
    #[arg(long, value_name = "N", value_parser = parse_threads)]
    pub(crate) roughtime_ipv6_threads: Option<usize>,

    /// IPv4 address and port to serve Roughtime on [default: 0.0.0.0:5319]
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) roughtime_ipv4_address: Option<SocketAddr>,

    /// IPv6 address and port to serve Roughtime on [default: [::]:5319]
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) roughtime_ipv6_address: Option<SocketAddr>,

    /// Seconds between online-key rotations; each online key is valid for twice this, so the
    /// one in use always has at least this long to run [default: 86400]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) roughtime_rotation: Option<f64>,

    /// Roughtime requests received per system call, and the most one signature covers (up to
    /// 256). A full batch comes only under load, where a larger one costs less CPU per reply
    /// [default: 256]
    #[arg(long, value_name = "N", value_parser = parse_roughtime_batch)]
    pub(crate) roughtime_batch_size: Option<usize>,

    /// Roughtime sockets' receive buffer in bytes (SO_RCVBUFFORCE, else SO_RCVBUF; the kernel
    /// counts twice this against it). One 1 KiB request takes about 2.3 KiB of it, so the
    /// default holds some 14,000: a 70 ms stall of the thread at 200k requests/s [default: 16 MiB]
    #[arg(long, value_name = "BYTES", value_parser = parse_recv_buffer)]
    pub(crate) roughtime_recv_buffer: Option<usize>,

    /// Under light load, gather Roughtime requests for this long before signing: when a receive
    /// returns two or more but under a quarter of a batch, wait and add what arrived meanwhile.
    /// A lone request is never held back, nor anything once the load nears the thread's
    /// capacity. Up to 0.1 s; 0 signs whatever arrived at once [default: 0.002]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds_or_zero)]
    pub(crate) roughtime_gather: Option<f64>,

    /// Make this share of Roughtime replies deliberately invalid ("grease"), each broken in one
    /// way a client must catch: a signature, the certificate, the Merkle path or index, the
    /// nonce, or the time under an unchanged signature. For test servers that clients are
    /// checked against; never a wrong time with a valid signature. 0 to 1 [default: 0]
    #[arg(long, value_name = "SHARE", allow_negative_numbers = true)]
    pub(crate) roughtime_grease: Option<f64>,

    /// The kinds of grease to send, comma-separated: signature, certificate, path, index, nonce,
    /// time (nonce never in Google's replies, which carry none) [default: all]
    #[arg(long, value_name = "KINDS")]
    pub(crate) roughtime_grease_kinds: Option<String>,

    /// Most Roughtime connections over TCP open at once, served on the same addresses and ports
    /// as UDP (RFC 10049 §4); 0 serves Roughtime over UDP only [default: 1024]
    #[arg(long, value_name = "N")]
    pub(crate) roughtime_tcp_connections: Option<usize>,

    /// Most Roughtime TCP connections open at once from one client address; more are closed
    /// at once [default: 16]
    #[arg(long, value_name = "N")]
    pub(crate) roughtime_tcp_per_address: Option<usize>,

    /// Seconds a Roughtime TCP connection may wait for its next whole request before it is
    /// closed [default: 10]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) roughtime_tcp_idle: Option<f64>,

    /// Seconds a Roughtime TCP connection may stay open, however busy [default: 60]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) roughtime_tcp_lifetime: Option<f64>,

    /// Serve a timezone's local time as if it were UTC, for devices that cannot be given a
    /// timezone. A bad idea for any other client; never applied to Roughtime
    #[arg(long)]
    pub(crate) tz_offset: bool,

    /// The IANA timezone for --tz-offset [default: TZ, else /etc/localtime]
    #[arg(long, value_name = "NAME")]
    pub(crate) timezone: Option<String>,

    /// Log level or tracing filter (error, warn, info, debug, trace) [default: info]
    #[arg(long, value_name = "LEVEL")]
    pub(crate) log_level: Option<String>,
}

pub(crate) const MAX_THREADS: usize = 1024;

/// Parses a count for a flag: `what` names it in the error ("a thread count"), and `check` is the
/// same bound the config file's value gets.
fn parse_count(
    s: &str,
    what: &str,
    check: impl FnOnce(usize) -> Result<(), String>,
) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("'{s}' is not {what}"))?;
    check(n)?;
    Ok(n)
}

fn parse_threads(s: &str) -> Result<usize, String> {
    parse_count(s, "a thread count", check_threads)
}

pub(crate) fn check_threads(n: usize) -> Result<(), String> {
    if n > MAX_THREADS {
        return Err(format!(
            "{n} threads is more than the limit of {MAX_THREADS}"
        ));
    }
    Ok(())
}

/// The smallest receive buffer accepted: below it the kernel would round up anyway, and a buffer
/// that holds one or two datagrams drops every burst.
const MIN_RECV_BUFFER: usize = 4096;
/// The largest: the kernel takes an int and doubles it.
const MAX_RECV_BUFFER: usize = 1 << 30;

fn parse_recv_buffer(s: &str) -> Result<usize, String> {
    parse_count(s, "a size in bytes", check_recv_buffer)
}

pub(crate) fn check_recv_buffer(n: usize) -> Result<(), String> {
    if !(MIN_RECV_BUFFER..=MAX_RECV_BUFFER).contains(&n) {
        return Err(format!(
            "{n} bytes is outside {MIN_RECV_BUFFER}..={MAX_RECV_BUFFER}"
        ));
    }
    Ok(())
}

/// The most NTP datagrams per receive and send.
const MAX_NTP_BATCH: usize = 1024;

fn parse_batch(s: &str) -> Result<usize, String> {
    parse_batch_up_to(s, MAX_NTP_BATCH)
}

pub(crate) fn check_batch(n: usize) -> Result<(), String> {
    check_batch_up_to(n, MAX_NTP_BATCH)
}

fn parse_roughtime_batch(s: &str) -> Result<usize, String> {
    parse_batch_up_to(s, chime_roughtime::MAX_BATCH_SIZE)
}

pub(crate) fn check_roughtime_batch(n: usize) -> Result<(), String> {
    check_batch_up_to(n, chime_roughtime::MAX_BATCH_SIZE)
}

fn parse_batch_up_to(s: &str, max: usize) -> Result<usize, String> {
    parse_count(s, "a batch size", |n| check_batch_up_to(n, max))
}

fn check_batch_up_to(n: usize, max: usize) -> Result<(), String> {
    if !(1..=max).contains(&n) {
        return Err(format!("batch size {n} is outside 1..={max}"));
    }
    Ok(())
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v = parse_seconds_or_zero(s)?;
    if v == 0.0 {
        return Err("must be more than 0 seconds".into());
    }
    Ok(v)
}

fn parse_seconds_or_zero(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    check_seconds(v)?;
    Ok(v)
}

pub(crate) fn check_seconds(v: f64) -> Result<(), String> {
    if !v.is_finite() || !(0.0..=86_400.0).contains(&v) {
        return Err(format!("{v} seconds is outside 0..=86400"));
    }
    Ok(())
}
