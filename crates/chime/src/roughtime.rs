//! `chime roughtime`: query Roughtime servers and verify every signature and path. One server
//! prints its verified time; several are queried in turn as a chain (each nonce derived from the
//! previous reply) and the report says whether any server contradicted another.

use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_roughtime::{
    Link, Verified, VerifyPolicy, Version, build_request, next_nonce, srv_value, verify_chain,
    verify_reply,
};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Servers to query, in order: HOST[:PORT] (port 5319), or KEY@HOST[:PORT] to give each server
    /// of a chain its own public key
    #[arg(required = true, value_name = "SERVER")]
    servers: Vec<String>,
    /// The server's long-term public key (base64 or hex), for servers without KEY@
    #[arg(long, value_name = "KEY")]
    public_key: Option<String>,
    /// Protocol version to offer: 1 (RFC 10049), 0x8000000c (drafts 12-19), 0x80000008 to
    /// 0x8000000b (drafts 08-11), or google [default: offer 1 and 0x8000000c]
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
    /// Print the result as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct ServerReport {
    server: SocketAddr,
    version: String,
    midpoint_unix_us: u64,
    midpoint: String,
    radius_us: u64,
    mint_unix_us: u64,
    maxt_unix_us: u64,
    online_key: String,
    index: u32,
    round_trip_us: u64,
    /// The server's midpoint minus our clock halfway through the exchange.
    local_offset_us: i64,
    spelling_conforms: bool,
}

#[derive(Debug, Serialize)]
struct ChainOut {
    servers: Vec<ServerReport>,
    consistent: bool,
    contradictions: Vec<(usize, usize)>,
}

pub(crate) fn run(args: &Args) -> Result<()> {
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
    let versions: Vec<Version> = match args.version {
        Some(v) => vec![v],
        None => vec![Version::Draft12, Version::Rfc10049],
    };
    let timeout = Duration::from_secs_f64(args.timeout);

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

    // Each exchange: (request, reply, rand), and what its verified reply says.
    let mut exchanges = Vec::new();
    let mut reports = Vec::new();
    let mut previous: Option<Vec<u8>> = None;
    for (addr, key) in &targets {
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
        let len = build_request(&mut request, &versions, nonce, with_srv.then_some(&srv))
            .map_err(|e| anyhow::anyhow!("cannot build the request: {e}"))?;
        request.truncate(len);
        let (reply, rtt, local_mid) = exchange(*addr, &request, timeout)?;
        let verified = verify_reply(&request, &reply, key, &policy)
            .map_err(|e| anyhow::anyhow!("{addr}: reply does not verify: {e}"))?;
        reports.push(report(*addr, &verified, rtt, local_mid));
        previous = Some(reply.clone());
        exchanges.push((request, reply, rand));
    }

    if targets.len() == 1 {
        let r = &reports[0];
        if args.json {
            println!("{}", serde_json::to_string(r)?);
        } else {
            print_one(r);
        }
        return Ok(());
    }

    let links: Vec<Link<'_>> = exchanges
        .iter()
        .zip(&targets)
        .map(|((req, reply, rand), (_, key))| Link {
            public_key: *key,
            rand: *rand,
            request: req,
            reply,
        })
        .collect();
    let chain = verify_chain(&links, &policy).map_err(|e| anyhow::anyhow!("chain: {e}"))?;
    let out = ChainOut {
        consistent: chain.contradictions.is_empty(),
        contradictions: chain
            .contradictions
            .iter()
            .map(|c| (c.earlier, c.later))
            .collect(),
        servers: reports,
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        for (i, r) in out.servers.iter().enumerate() {
            println!("[{i}]");
            print_one(r);
        }
        if out.consistent {
            println!(
                "Chain: {} replies, all signed, no server contradicted another",
                out.servers.len()
            );
        }
        for c in &chain.contradictions {
            println!(
                "Chain: CONTRADICTION: server [{}] signed a time after server [{}]'s latest, \
                 though it answered first",
                c.earlier, c.later
            );
        }
    }
    if !out.consistent {
        bail!("the servers contradict each other; the chain above is the proof");
    }
    Ok(())
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
    let len = match sock.recv(&mut buf) {
        Ok(n) => n,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            bail!("{addr}: no reply within {:.1} s", timeout.as_secs_f64())
        }
        Err(e) => bail!("{addr}: {e}"),
    };
    let rtt = start.elapsed();
    buf.truncate(len);
    Ok((buf, rtt, sent_at + rtt.as_micros() as u64 / 2))
}

fn report(server: SocketAddr, v: &Verified, rtt: Duration, local_mid_us: u64) -> ServerReport {
    ServerReport {
        server,
        version: v.version.to_string(),
        midpoint_unix_us: v.midpoint_unix_us,
        midpoint: rfc3339(v.midpoint_unix_us),
        radius_us: v.radius_us,
        mint_unix_us: v.mint_unix_us,
        maxt_unix_us: v.maxt_unix_us,
        online_key: BASE64.encode(v.online_key),
        index: v.index,
        round_trip_us: rtt.as_micros() as u64,
        local_offset_us: v.midpoint_unix_us as i64 - local_mid_us as i64,
        spelling_conforms: v.spelling_conforms(),
    }
}

fn print_one(r: &ServerReport) {
    println!("Server      : {}", r.server);
    println!("Version     : {}", r.version);
    println!(
        "Midpoint    : {} ({} µs since 1970)",
        r.midpoint, r.midpoint_unix_us
    );
    println!("Radius      : {:.6} s", r.radius_us as f64 / 1e6);
    println!(
        "Valid       : {} .. {}",
        rfc3339(r.mint_unix_us),
        rfc3339(r.maxt_unix_us)
    );
    println!("Online key  : {}", r.online_key);
    println!("Round trip  : {:.6} s", r.round_trip_us as f64 / 1e6);
    println!(
        "Local clock : {:+.6} s from the server's midpoint",
        -(r.local_offset_us as f64) / 1e6
    );
    if !r.spelling_conforms {
        println!(
            "Note        : signed with the drafts' \"RoughTime\" context spelling, not RFC 10049's"
        );
    }
    println!("Verified    : certificate, signature, Merkle path and nonce");
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
    if let Ok(addr) = server.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = server.parse::<std::net::IpAddr>() {
        return Ok((ip, 5319).into());
    }
    let spec = if server.contains(':') {
        server.to_owned()
    } else {
        format!("{server}:5319")
    };
    spec.to_socket_addrs()
        .with_context(|| format!("{server}: cannot resolve"))?
        .next()
        .with_context(|| format!("{server}: no address"))
}

/// A public key in base64 (44 characters) or hex (64 digits).
pub(crate) fn parse_key(s: &str) -> Result<[u8; 32]> {
    let s = s.trim();
    let bytes = if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..32)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<_>, _>>()?
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
        format!("'{s}' is not a version (1, 0x8000000c, 0x80000008..0x8000000b, google)")
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
