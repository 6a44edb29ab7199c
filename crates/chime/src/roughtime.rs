//! `chime roughtime`: query Roughtime servers and verify every signature and path. One server
//! prints its verified time; several are queried in turn as a chain (each nonce derived from the
//! previous reply) and the report says whether any server contradicted another.
//!
//! `--report FILE` saves the chain as an RFC 10049 §8.4.1 malfeasance report, the evidence a third
//! party can check; `--check-report FILE` checks one, written by chime or by another
//! implementation (roughly writes a bare list of the same entries).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
#[cfg(feature = "mldsa")]
use chime_roughtime::mldsa;
use chime_roughtime::{
    ChainReport, FrameReader, Link, Verified, VerifyPolicy, Version, build_request, next_nonce,
    srv_value, verify_chain, verify_reply,
};
use serde::{Deserialize, Serialize};

use crate::out::outln;

mod ecosystem;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Servers to query, in order: HOST[:PORT] (port 5319), or KEY@HOST[:PORT] to give each server
    /// of a chain its own public key
    #[arg(required_unless_present_any = ["check_report", "server_list"], value_name = "SERVER")]
    servers: Vec<String>,
    /// Measure as RFC 10049 §8 asks: choose servers at random from this server list (its JSON,
    /// keys in base64 or hex), ask them in sequence and then again, each nonce chained to the reply
    /// before; a server that does not answer is named and another takes its place. Exit 1 when
    /// fewer than three answered or two contradict each other
    #[arg(long = "servers", value_name = "FILE", conflicts_with_all = ["servers", "public_key", "check_report", "tcp"])]
    server_list: Option<PathBuf>,
    /// With --servers: how many servers to choose (at least 3)
    #[arg(long, value_name = "N", default_value_t = 3, requires = "server_list")]
    count: usize,
    /// The server's long-term public key (base64 or hex), for servers without KEY@. An ML-DSA-44
    /// key (1312 bytes, base64) asks for the experimental suite 0x90000001, over TCP
    #[arg(long, value_name = "KEY")]
    public_key: Option<String>,
    /// Protocol version to offer: 1 (RFC 10049), 0x8000000c (drafts 12-19), 0x80000008 to
    /// 0x8000000b (drafts 08-11), 0x80000007 (draft 07), or google [default: offer 1 and
    /// 0x8000000c; with --servers, a server whose entry names a version by number is offered
    /// that one, unless --version is given]
    #[arg(long = "version", value_name = "V", value_parser = parse_version)]
    version: Option<Version>,
    /// Seconds to wait for each reply
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    timeout: f64,
    /// Reject replies whose radius exceeds this many seconds (an absurd radius says nothing)
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    max_radius: f64,
    /// Accept version 1 replies signed with the drafts' "RoughTime" context spelling
    #[arg(long)]
    accept_draft_spelling: bool,
    /// Query over TCP (RFC 10049 §4): a connection per server, the request and reply framed as
    /// on UDP; the round trip is from sending the request to the reply's last byte, without the
    /// connection's setup. Not with --version google (it has no framing)
    #[arg(long)]
    tcp: bool,
    /// Print the result as JSON
    #[arg(long)]
    json: bool,
    /// Save the exchanges as an RFC 10049 malfeasance report (JSON) to FILE, which must not exist
    /// yet; it is written whether or not the servers agree
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// With --servers: when two servers contradict each other, send the report to the list's
    /// "reports" URL (an HTTP POST of application/roughtime-malfeasance+json, RFC 10049 §8.4) and
    /// say what the collector answered. Nothing is sent when the servers agree
    #[arg(long, requires = "server_list")]
    upload: bool,
    /// Check a malfeasance report instead of querying: every reply's signatures and path, every
    /// nonce derived from the reply before, and whether any two replies contradict each other
    #[arg(long, value_name = "FILE", conflicts_with_all = ["servers", "report", "public_key", "version"])]
    check_report: Option<PathBuf>,
}

/// A malfeasance report as RFC 10049 §8.4.1 lays it out: the exchanges in the order they were
/// made, each with the server's long-term key and, from the second on, the `rand` that derived
/// its nonce from the reply before. Everything binary is base64.
#[derive(Debug, Serialize, Deserialize)]
struct MalfeasanceReport {
    responses: Vec<ReportEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReportEntry {
    public_key: String,
    /// On the first entry chime writes the first nonce itself, as roughly does (its checker
    /// wants a `rand` on every entry); RFC 10049's example has none there, and checkers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rand: Option<String>,
    request: String,
    response: String,
}

/// The report forms read: RFC 10049's object, or roughly's bare list of entries.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum AnyReport {
    Rfc(MalfeasanceReport),
    Bare(Vec<ReportEntry>),
}

#[derive(Debug, Serialize)]
struct ServerReport {
    /// Where it was queried; none for a reply read from a report.
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<SocketAddr>,
    public_key: String,
    version: String,
    midpoint_unix_us: u64,
    midpoint: String,
    radius_us: u64,
    mint_unix_us: u64,
    maxt_unix_us: u64,
    online_key: String,
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    round_trip_us: Option<u64>,
    /// The server's midpoint minus our clock halfway through the exchange.
    #[serde(skip_serializing_if = "Option::is_none")]
    local_offset_us: Option<i64>,
    spelling_conforms: bool,
}

#[derive(Debug, Serialize)]
struct ChainOut {
    servers: Vec<ServerReport>,
    consistent: bool,
    contradictions: Vec<(usize, usize)>,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let policy = policy(args)?;
    if let Some(path) = &args.check_report {
        return check_report(path, &policy, args.json);
    }
    // Refused before any query, so that a chain is not run only to find nowhere to keep it.
    if let Some(path) = &args.report
        && path.exists()
    {
        bail!(
            "--report {}: the file exists; a report is evidence and is never overwritten",
            path.display()
        );
    }
    if args.tcp && args.version == Some(Version::Google) {
        bail!("--tcp: Google's original protocol has no framing for a stream; it is UDP only");
    }
    // An ML-DSA-44 key (1312 bytes) asks for the experimental suite, over TCP.
    #[cfg(feature = "mldsa")]
    if let [spec] = &args.servers[..] {
        let (key, host) = match spec.split_once('@') {
            Some((k, h)) => (Some(k), h),
            None => (None, spec.as_str()),
        };
        if let Some(key) = key.or(args.public_key.as_deref()).and_then(mldsa_key) {
            return query_mldsa(resolve(host)?, &key, args);
        }
    }
    let versions: Vec<Version> = match args.version {
        Some(v) => vec![v],
        None => vec![Version::Draft12, Version::Rfc10049],
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    if let Some(file) = &args.server_list {
        return ecosystem::run(&ecosystem::Measure {
            file,
            count: args.count,
            versions,
            timeout,
            policy,
            report: args.report.as_deref(),
            upload: args.upload,
            offer_to_all: args.version.is_some(),
            json: args.json,
        });
    }
    let targets = targets(args)?;
    let (exchanges, reports) = query_chain(&targets, &versions, timeout, args.tcp, &policy)?;
    if let Some(path) = &args.report {
        let responses = exchanges
            .iter()
            .zip(&targets)
            .map(|((request, reply, rand), (_, key))| ReportEntry {
                public_key: BASE64.encode(key),
                rand: rand.map(|r| BASE64.encode(r)),
                request: BASE64.encode(request),
                response: BASE64.encode(reply),
            })
            .collect();
        write_report(path, &MalfeasanceReport { responses })?;
    }

    if targets.len() == 1 {
        let r = &reports[0];
        if args.json {
            outln!("{}", serde_json::to_string(r)?);
        } else {
            print_one(r);
        }
        return Ok(());
    }

    let links: Vec<Link<'_>> = exchanges
        .iter()
        .zip(&targets)
        .enumerate()
        .map(|(i, ((req, reply, rand), (_, key)))| Link {
            public_key: *key,
            rand: if i == 0 { None } else { *rand },
            request: req,
            reply,
        })
        .collect();
    let chain = verify_chain(&links, &policy).map_err(|e| anyhow::anyhow!("chain: {e}"))?;
    print_chain(reports, &chain, args.json)?;
    if !chain.contradictions.is_empty() {
        bail!("the servers contradict each other; the chain above is the proof");
    }
    Ok(())
}

/// One exchange of a chain: the request, the reply, and the `rand` a report gives it.
type Exchange = (Vec<u8>, Vec<u8>, Option<[u8; 32]>);

/// The verification policy `--max-radius` and `--accept-draft-spelling` ask for, once
/// `--timeout` and `--max-radius` are known to be in range.
fn policy(args: &Args) -> Result<VerifyPolicy> {
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 60.0) {
        bail!(
            "--timeout {}: must be between 0 and 60 seconds",
            args.timeout
        );
    }
    if !(args.max_radius.is_finite() && args.max_radius > 0.0) {
        bail!(
            "--max-radius {}: must be a positive number of seconds",
            args.max_radius
        );
    }
    let mut policy = VerifyPolicy::new((args.max_radius * 1e6) as u64);
    if args.accept_draft_spelling {
        policy = policy.accepting_draft_spelling();
    }
    Ok(policy)
}

/// Each server to query, resolved, with its public key: its own (`KEY@HOST`) or `--public-key`.
fn targets(args: &Args) -> Result<Vec<(SocketAddr, [u8; 32])>> {
    let mut targets = Vec::new();
    for spec in &args.servers {
        let (key, host) = match spec.split_once('@') {
            Some((k, h)) => (Some(k), h),
            None => (None, spec.as_str()),
        };
        let key = match (key, &args.public_key) {
            (Some(k), _) => parse_key(k).with_context(|| format!("{spec}: bad public key"))?,
            (None, Some(k)) => parse_key(k).context("--public-key")?,
            (None, None) => bail!("{spec}: no public key (use --public-key or KEY@{spec})"),
        };
        targets.push((resolve(host)?, key));
    }
    Ok(targets)
}

/// Queries the targets in turn, each nonce after the first derived from the reply before, and
/// verifies every reply. Returns each exchange and what its verified reply says.
fn query_chain(
    targets: &[(SocketAddr, [u8; 32])],
    versions: &[Version],
    timeout: Duration,
    tcp: bool,
    policy: &VerifyPolicy,
) -> Result<(Vec<Exchange>, Vec<ServerReport>)> {
    let mut exchanges = Vec::new();
    let mut reports = Vec::new();
    let mut previous: Option<Vec<u8>> = None;
    for (addr, key) in targets {
        let (nonce, rand) = match &previous {
            None => (rand::random::<[u8; 32]>(), None),
            Some(reply) => {
                let r: [u8; 32] = rand::random();
                (next_nonce(reply, &r), Some(r))
            }
        };
        // Google's original protocol takes a 64-byte nonce; the chained 32 bytes are extended
        // with randomness (it cannot be chained, and says so by failing verify_chain).
        let mut long_nonce = [0u8; 64];
        long_nonce[..32].copy_from_slice(&nonce);
        long_nonce[32..].copy_from_slice(&rand::random::<[u8; 32]>());
        let nonce: &[u8] = if versions == [Version::Google] {
            &long_nonce
        } else {
            &nonce
        };
        let mut request = vec![0u8; chime_roughtime::REQUEST_LEN];
        let srv = srv_value(key);
        let with_srv = versions.iter().any(|v| v.has_srv());
        let len = build_request(&mut request, versions, nonce, with_srv.then_some(&srv))
            .map_err(|e| anyhow::anyhow!("cannot build the request: {e}"))?;
        request.truncate(len);
        let (reply, rtt, local_mid) = if tcp {
            exchange_tcp(*addr, &request, timeout)?
        } else {
            exchange(*addr, &request, timeout)?
        };
        let verified = verify_reply(&request, &reply, key, policy)
            .map_err(|e| anyhow::anyhow!("{addr}: reply does not verify: {e}"))?;
        reports.push(report(Some((*addr, rtt, local_mid)), key, &verified));
        previous = Some(reply.clone());
        // The first entry's `rand` is its nonce (see `ReportEntry::rand`); Google's 64-byte
        // nonces do not chain and get none.
        let rand = rand.or_else(|| <[u8; 32]>::try_from(nonce).ok());
        exchanges.push((request, reply, rand));
    }
    Ok((exchanges, reports))
}

/// A chain's links as a malfeasance report. The first link has no `rand`; as for a chain given on
/// the command line, its entry carries the first nonce itself, which roughly's checker asks for
/// and RFC 10049's ignores.
fn report_of(links: &[Link<'_>]) -> MalfeasanceReport {
    let responses = links
        .iter()
        .map(|l| {
            let first_nonce = || {
                chime_roughtime::Request::parse(l.request)
                    .ok()
                    .map(|r| BASE64.encode(r.nonce))
            };
            ReportEntry {
                public_key: BASE64.encode(l.public_key),
                rand: l.rand.map(|r| BASE64.encode(r)).or_else(first_nonce),
                request: BASE64.encode(l.request),
                response: BASE64.encode(l.reply),
            }
        })
        .collect();
    MalfeasanceReport { responses }
}

fn write_report(path: &Path, report: &MalfeasanceReport) -> Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| {
            format!(
                "--report {}: cannot create it (a report is never overwritten)",
                path.display()
            )
        })?;
    let mut json = serde_json::to_string_pretty(report)?;
    json.push('\n');
    file.write_all(json.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("--report {}: cannot write it", path.display()))
}

/// `--check-report FILE`: verifies every entry and the links between them, prints what each reply
/// says, and fails if two of them contradict each other (the report then proves it).
fn check_report(path: &Path, policy: &VerifyPolicy, json: bool) -> Result<()> {
    let what = || format!("--check-report {}", path.display());
    let text =
        std::fs::read_to_string(path).with_context(|| format!("{}: cannot read it", what()))?;
    let entries = match serde_json::from_str::<AnyReport>(&text) {
        Ok(AnyReport::Rfc(r)) => r.responses,
        Ok(AnyReport::Bare(entries)) => entries,
        Err(_) => bail!(
            "{}: not a malfeasance report (want {{\"responses\": [...]}} or a list of entries \
             with publicKey, request, response and rand)",
            what()
        ),
    };
    if entries.is_empty() {
        bail!("{}: the report has no responses", what());
    }
    let decode = |i: usize, field: &str, value: &str| {
        BASE64
            .decode(value.trim())
            .with_context(|| format!("{}: entry {i}: {field} is not base64", what()))
    };
    let mut decoded = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let key: [u8; 32] = decode(i, "publicKey", &e.public_key)?
            .try_into()
            .map_err(|_| anyhow::anyhow!("{}: entry {i}: publicKey is not 32 bytes", what()))?;
        let rand = match (i, &e.rand) {
            (0, _) => None,
            (_, None) => bail!(
                "{}: entry {i}: no rand tying it to the reply before",
                what()
            ),
            (_, Some(r)) => Some(
                <[u8; 32]>::try_from(decode(i, "rand", r)?)
                    .map_err(|_| anyhow::anyhow!("{}: entry {i}: rand is not 32 bytes", what()))?,
            ),
        };
        let request = decode(i, "request", &e.request)?;
        let reply = decode(i, "response", &e.response)?;
        decoded.push((key, rand, request, reply));
    }
    let links: Vec<Link<'_>> = decoded
        .iter()
        .map(|(key, rand, request, reply)| Link {
            public_key: *key,
            rand: *rand,
            request,
            reply,
        })
        .collect();
    let chain = verify_chain(&links, policy).map_err(|e| anyhow::anyhow!("{}: {e}", what()))?;
    let reports = chain
        .replies
        .iter()
        .zip(&decoded)
        .map(|(v, (key, ..))| report(None, key, v))
        .collect();
    print_chain(reports, &chain, json)?;
    if !chain.contradictions.is_empty() {
        bail!("the report proves that servers contradict each other");
    }
    Ok(())
}

fn print_chain(reports: Vec<ServerReport>, chain: &ChainReport, json: bool) -> Result<()> {
    let out = ChainOut {
        consistent: chain.contradictions.is_empty(),
        contradictions: chain
            .contradictions
            .iter()
            .map(|c| (c.earlier, c.later))
            .collect(),
        servers: reports,
    };
    if json {
        outln!("{}", serde_json::to_string(&out)?);
    } else {
        for (i, r) in out.servers.iter().enumerate() {
            outln!("[{i}]");
            print_one(r);
        }
        if out.consistent {
            outln!(
                "Chain: {} replies, all signed, no server contradicted another",
                out.servers.len()
            );
        }
        for c in &chain.contradictions {
            outln!(
                "Chain: CONTRADICTION: server [{}] signed a time after server [{}]'s latest, \
                 though it answered first",
                c.earlier,
                c.later
            );
        }
    }
    Ok(())
}

/// A failed receive from `addr`: a timeout says so, anything else as it is.
fn receive_failed(addr: SocketAddr, timeout: Duration, e: &std::io::Error) -> anyhow::Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            anyhow::anyhow!("{addr}: no reply within {:.1} s", timeout.as_secs_f64())
        }
        _ => anyhow::anyhow!("{addr}: {e}"),
    }
}

/// [`exchange`] over TCP: connect, send the framed request, read one framed reply.
fn exchange_tcp(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, Duration, u64)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("{addr}: cannot connect over TCP"))?;
    stream.set_nodelay(true).ok();
    let deadline = Instant::now() + timeout;
    let sent_at = unix_us();
    let start = Instant::now();
    stream.set_write_timeout(Some(timeout))?;
    stream
        .write_all(request)
        .with_context(|| format!("{addr}: send failed"))?;
    // Replies are far smaller than this; a header announcing more is not a reply.
    let mut frames = FrameReader::new(1 << 16);
    let mut buf = vec![0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("{addr}: no reply within {:.1} s", timeout.as_secs_f64());
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut buf) {
            Ok(0) => bail!("{addr}: the server closed the connection without a reply"),
            Ok(n) => n,
            Err(e) => return Err(receive_failed(addr, timeout, &e)),
        };
        frames.push(&buf[..n]);
        match frames.next_packet() {
            Ok(Some(reply)) => {
                let rtt = start.elapsed();
                return Ok((reply.to_vec(), rtt, sent_at + rtt.as_micros() as u64 / 2));
            }
            Ok(None) => {}
            Err(e) => bail!("{addr}: not a Roughtime reply: {e}"),
        }
    }
}

fn exchange(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, Duration, u64)> {
    let local: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let sock = UdpSocket::bind(local).context("cannot open a UDP socket")?;
    sock.connect(addr)
        .with_context(|| format!("{addr}: cannot connect"))?;
    sock.set_read_timeout(Some(timeout))?;
    let sent_at = unix_us();
    let start = Instant::now();
    sock.send(request)
        .with_context(|| format!("{addr}: send failed"))?;
    let mut buf = vec![0u8; 4096];
    let len = sock
        .recv(&mut buf)
        .map_err(|e| receive_failed(addr, timeout, &e))?;
    let rtt = start.elapsed();
    buf.truncate(len);
    Ok((buf, rtt, sent_at + rtt.as_micros() as u64 / 2))
}

/// What one verified reply says; `exchange` is where and how it was queried (server, round trip,
/// our clock halfway through), none for a reply read from a report.
fn report(
    exchange: Option<(SocketAddr, Duration, u64)>,
    public_key: &[u8; 32],
    v: &Verified,
) -> ServerReport {
    ServerReport {
        server: exchange.map(|(addr, ..)| addr),
        public_key: BASE64.encode(public_key),
        version: v.version.to_string(),
        midpoint_unix_us: v.midpoint_unix_us,
        midpoint: rfc3339(v.midpoint_unix_us),
        radius_us: v.radius_us,
        mint_unix_us: v.mint_unix_us,
        maxt_unix_us: v.maxt_unix_us,
        online_key: BASE64.encode(v.online_key),
        index: v.index,
        round_trip_us: exchange.map(|(_, rtt, _)| rtt.as_micros() as u64),
        local_offset_us: exchange.map(|(.., mid)| v.midpoint_unix_us as i64 - mid as i64),
        spelling_conforms: v.spelling_conforms(),
    }
}

fn print_one(r: &ServerReport) {
    match r.server {
        Some(server) => outln!("Server      : {server}"),
        None => outln!("Public key  : {}", r.public_key),
    }
    outln!("Version     : {}", r.version);
    outln!(
        "Midpoint    : {} ({} µs since 1970)",
        r.midpoint,
        r.midpoint_unix_us
    );
    outln!("Radius      : {:.6} s", r.radius_us as f64 / 1e6);
    outln!(
        "Valid       : {} .. {}",
        rfc3339(r.mint_unix_us),
        rfc3339(r.maxt_unix_us)
    );
    outln!("Online key  : {}", r.online_key);
    if let (Some(rtt), Some(offset)) = (r.round_trip_us, r.local_offset_us) {
        outln!("Round trip  : {:.6} s", rtt as f64 / 1e6);
        outln!(
            "Local clock : {:+.6} s from the server's midpoint",
            -(offset as f64) / 1e6
        );
    }
    if !r.spelling_conforms {
        outln!(
            "Note        : signed with the drafts' \"RoughTime\" context spelling, not RFC 10049's"
        );
    }
    outln!("Verified    : certificate, signature, Merkle path and nonce");
}

fn rfc3339(unix_us: u64) -> String {
    jiff::Timestamp::from_microsecond(unix_us.min(i64::MAX as u64) as i64)
        .map_or_else(|_| format!("{unix_us} µs"), |t| t.to_string())
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

fn resolve(server: &str) -> Result<SocketAddr> {
    crate::addr::resolve(server, 5319)
}

/// An ML-DSA-44 public key (1312 bytes, base64), if `s` is one.
#[cfg(feature = "mldsa")]
fn mldsa_key(s: &str) -> Option<Vec<u8>> {
    BASE64
        .decode(s.trim())
        .ok()
        .filter(|k| k.len() == mldsa::PUBLIC_KEY_LEN)
}

/// The experimental ML-DSA-44 suite (0x90000001, part of no draft): one query over TCP, fully
/// verified.
#[cfg(feature = "mldsa")]
fn query_mldsa(addr: SocketAddr, key: &[u8], args: &Args) -> Result<()> {
    if args
        .version
        .is_some_and(|v| v.number() != Some(mldsa::VERSION))
    {
        bail!("--version: an ML-DSA-44 key is for version 0x90000001 only");
    }
    if args.report.is_some() {
        bail!("--report: not with the experimental ML-DSA-44 suite");
    }
    let request = mldsa::build_request(&rand::random(), key);
    let timeout = Duration::from_secs_f64(args.timeout);
    let (reply, rtt, local_mid) = exchange_tcp(addr, &request, timeout)?;
    let v = mldsa::verify_reply(&request, &reply, key)
        .map_err(|e| anyhow::anyhow!("{addr}: reply does not verify: {e}"))?;
    if u64::from(v.radius_s) * 1_000_000 > (args.max_radius * 1e6) as u64 {
        bail!("{addr}: radius {} s is over --max-radius", v.radius_s);
    }
    let midpoint_unix_us = v.midpoint_unix_s * 1_000_000;
    if args.json {
        let out = serde_json::json!({
            "server": addr,
            "version": "0x90000001 (experimental ML-DSA-44)",
            "transport": "tcp",
            "midpoint_unix_us": midpoint_unix_us,
            "midpoint": rfc3339(midpoint_unix_us),
            "radius_us": u64::from(v.radius_s) * 1_000_000,
            "mint_unix_us": v.mint_unix_s * 1_000_000,
            "maxt_unix_us": v.maxt_unix_s * 1_000_000,
            "index": v.index,
            "round_trip_us": rtt.as_micros() as u64,
            "local_offset_us": midpoint_unix_us as i64 - local_mid as i64,
        });
        outln!("{out}");
    } else {
        outln!("Server      : {addr} (over TCP)");
        outln!("Version     : 0x90000001, ML-DSA-44 (experimental, part of no draft)");
        outln!(
            "Midpoint    : {} ({midpoint_unix_us} µs since 1970)",
            rfc3339(midpoint_unix_us)
        );
        outln!("Radius      : {} s", v.radius_s);
        outln!(
            "Valid       : {} .. {}",
            rfc3339(v.mint_unix_s * 1_000_000),
            rfc3339(v.maxt_unix_s * 1_000_000)
        );
        outln!("Round trip  : {:.3} ms", rtt.as_secs_f64() * 1e3);
        outln!("Verified    : both ML-DSA-44 signatures, the nonce, the path to the root");
    }
    Ok(())
}

/// A public key in base64 (44 characters) or hex (64 digits).
pub(crate) fn parse_key(s: &str) -> Result<[u8; 32]> {
    let s = s.trim();
    let bytes = if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(s)?
    } else {
        BASE64
            .decode(s)
            .context("neither base64 nor 64 hex digits")?
    };
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| anyhow::anyhow!("{} bytes, not 32", b.len()))
}

pub(crate) fn parse_version(s: &str) -> Result<Version, String> {
    let lower = s.to_ascii_lowercase();
    if lower == "google" {
        return Ok(Version::Google);
    }
    let number = match lower.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => lower.parse(),
    }
    .map_err(|_| {
        format!("'{s}' is not a version (1, 0x8000000c, 0x80000007..0x8000000b, google)")
    })?;
    Version::from_number(number).ok_or_else(|| format!("{s}: not a version chime speaks"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_keys_parse() {
        assert_eq!(parse_version("1"), Ok(Version::Rfc10049));
        assert_eq!(parse_version("0x8000000C"), Ok(Version::Draft12));
        assert_eq!(parse_version("google"), Ok(Version::Google));
        assert!(parse_version("0x8000000d").is_err());
        let b64 = "Ixu7gqjJ9TU6IxsO8wxZxAFT5te6FcZZQq5vXFl35JE=";
        let hex = "231bbb82a8c9f5353a231b0ef30c59c40153e6d7ba15c65942ae6f5c5977e491";
        assert_eq!(parse_key(b64).unwrap(), parse_key(hex).unwrap());
        assert!(parse_key("AAAA").is_err());
    }
}
