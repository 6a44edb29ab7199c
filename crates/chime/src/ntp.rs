//! `chime ntp HOST[:PORT]`: one client-mode request, the four timestamps, and the server's header
//! printed the way chrony's `ntpdata` does, or as JSON for scripts.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use chime_ntp::{Header, Leap, Mode, NtpTimestamp};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Server to query: HOST, HOST:PORT, or [IPv6]:PORT (port 123 if omitted)
    server: String,
    /// Seconds to wait for the reply
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    timeout: f64,
    /// NTP version to send (1-4)
    #[arg(long = "ntp-version", default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=4))]
    ntp_version: u8,
    /// Print the result as one JSON object
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    server: SocketAddr,
    version: u8,
    mode: u8,
    leap: u8,
    synchronised: bool,
    stratum: u8,
    reference_id: String,
    reference_id_hex: String,
    precision: i8,
    poll: i8,
    root_delay: f64,
    root_dispersion: f64,
    offset: f64,
    delay: f64,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 60.0) {
        bail!(
            "--timeout {}: must be between 0 and 60 seconds",
            args.timeout
        );
    }
    let server = resolve(&args.server)?;
    let report = query(
        server,
        args.ntp_version,
        Duration::from_secs_f64(args.timeout),
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    Ok(())
}

fn resolve(server: &str) -> Result<SocketAddr> {
    if let Ok(addr) = server.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = server.parse::<IpAddr>() {
        return Ok((ip, 123).into());
    }
    let spec = if server.contains(':') {
        server.to_owned()
    } else {
        format!("{server}:123")
    };
    spec.to_socket_addrs()
        .with_context(|| format!("{server}: cannot resolve"))?
        .next()
        .with_context(|| format!("{server}: no address"))
}

fn query(server: SocketAddr, version: u8, timeout: Duration) -> Result<Report> {
    let local: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let sock = UdpSocket::bind(local).context("cannot open a UDP socket")?;
    sock.connect(server)
        .with_context(|| format!("{server}: cannot connect"))?;
    sock.set_read_timeout(Some(timeout))?;

    // The transmit timestamp is random, as chrony's client does: it is the nonce the server must
    // echo as origin, and it says nothing about our clock. T1 is kept locally.
    let nonce = NtpTimestamp(rand::random());
    let request = Header::request(version, Mode::Client, nonce);
    let mut packet = [0u8; 48];
    request.encode(&mut packet);

    let t1 = now();
    sock.send(&packet)
        .with_context(|| format!("{server}: send failed"))?;
    let mut buf = [0u8; 1024];
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let len = match sock.recv(&mut buf) {
            Ok(len) => len,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bail!("{server}: no reply within {:.1} s", timeout.as_secs_f64())
            }
            Err(e) => bail!("{server}: {e}"),
        };
        let t4 = now();
        let reply = match Header::parse(&buf[..len]) {
            Ok(h) => h,
            Err(e) => bail!("{server}: bad reply ({len} bytes): {e}"),
        };
        if reply.origin_ts != nonce {
            // Not the answer to this request (a late reply to someone else's); keep waiting.
            if std::time::Instant::now() >= deadline {
                bail!(
                    "{server}: no matching reply within {:.1} s",
                    timeout.as_secs_f64()
                );
            }
            continue;
        }
        if reply.mode != Mode::Server {
            bail!(
                "{server}: bad reply: mode {} instead of 4 (server)",
                reply.mode as u8
            );
        }
        if reply.version != version {
            bail!(
                "{server}: bad reply: version {} to a version {version} request",
                reply.version
            );
        }
        if let Some(code) = kiss_code(&reply) {
            let advice = match &code[..] {
                "RATE" => format!(
                    ": asks this client to poll less often (suggested poll interval 2^{} s)",
                    reply.poll
                ),
                "DENY" | "RSTR" => ": refuses to serve this client".into(),
                _ => String::new(),
            };
            bail!("{server}: Kiss-o'-Death {code}{advice}");
        }
        let t2 = reply.receive_ts;
        let t3 = reply.transmit_ts;
        if reply.stratum != 0 && (t2 == NtpTimestamp::ZERO || t3 == NtpTimestamp::ZERO) {
            bail!("{server}: bad reply: zero receive or transmit timestamp");
        }
        // Differences of NTP timestamps are era-safe as long as the clocks are within 68 years.
        let offset = (t2.wrapping_diff_seconds(t1) + t3.wrapping_diff_seconds(t4)) / 2.0;
        let delay = t4.wrapping_diff_seconds(t1) - t3.wrapping_diff_seconds(t2);
        return Ok(Report {
            server,
            version: reply.version,
            mode: reply.mode as u8,
            leap: reply.leap as u8,
            synchronised: reply.leap != Leap::Unsynchronised && reply.stratum != 0,
            stratum: reply.stratum,
            reference_id: refid_text(reply.stratum, reply.reference_id),
            reference_id_hex: reply
                .reference_id
                .iter()
                .map(|b| format!("{b:02X}"))
                .collect(),
            precision: reply.precision,
            poll: reply.poll,
            root_delay: reply.root_delay.seconds(),
            root_dispersion: reply.root_dispersion.seconds(),
            offset,
            delay,
        });
    }
}

fn now() -> NtpTimestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    NtpTimestamp::from_unix(d.as_secs() as i64, d.subsec_nanos())
}

/// The kiss code of a Kiss-o'-Death (RFC 5905 §7.4): leap 3, stratum 0 and four ASCII capitals
/// as reference ID. An unsynchronised server's ordinary reply has stratum 0 too, but not such an
/// ID (chronyd and chimed send zeros).
fn kiss_code(reply: &Header) -> Option<String> {
    let id = reply.reference_id;
    (reply.leap == Leap::Unsynchronised
        && reply.stratum == 0
        && id.iter().all(u8::is_ascii_uppercase))
    .then(|| id.iter().map(|&b| char::from(b)).collect())
}

/// Stratum 0 carries a kiss code and stratum 1 a reference clock's name, both ASCII; above that
/// the ID is the upstream's IPv4 address (or a hash of its IPv6 address).
fn refid_text(stratum: u8, id: [u8; 4]) -> String {
    if stratum <= 1 {
        let text: String = id
            .iter()
            .take_while(|b| **b != 0)
            .map(|b| char::from(*b))
            .collect();
        if text.chars().all(|c| c.is_ascii_graphic()) {
            return text;
        }
    }
    format!("{}.{}.{}.{}", id[0], id[1], id[2], id[3])
}

fn print(r: &Report) {
    let leap = match r.leap {
        0 => "normal",
        1 => "insert second",
        2 => "delete second",
        _ => "unsynchronised",
    };
    println!("Server          : {}", r.server);
    println!("Version         : {}", r.version);
    println!("Mode            : {}", r.mode);
    println!("Leap status     : {leap} ({})", r.leap);
    println!("Stratum         : {}", r.stratum);
    println!(
        "Reference ID    : {} ({})",
        r.reference_id_hex, r.reference_id
    );
    println!(
        "Precision       : {} ({:.9} s)",
        r.precision,
        2f64.powi(r.precision.into())
    );
    println!("Root delay      : {:.6} s", r.root_delay);
    println!("Root dispersion : {:.6} s", r.root_dispersion);
    println!("Offset          : {:+.9} s", r.offset);
    println!("Delay           : {:.9} s", r.delay);
    if !r.synchronised {
        println!("The server says it is unsynchronised: its time must not be trusted.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_forms_get_port_123() {
        assert_eq!(
            resolve("127.0.0.1").unwrap(),
            "127.0.0.1:123".parse().unwrap()
        );
        assert_eq!(
            resolve("127.0.0.1:5123").unwrap(),
            "127.0.0.1:5123".parse().unwrap()
        );
        assert_eq!(resolve("::1").unwrap(), "[::1]:123".parse().unwrap());
        assert_eq!(
            resolve("[::1]:5123").unwrap(),
            "[::1]:5123".parse().unwrap()
        );
        assert_eq!(resolve("localhost:5123").unwrap().port(), 5123);
    }

    #[test]
    fn kiss_codes_are_told_from_unsynchronised_replies() {
        let mut h = Header::request(4, Mode::Server, NtpTimestamp(1));
        h.leap = Leap::Unsynchronised;
        h.reference_id = *b"RATE";
        assert_eq!(kiss_code(&h).as_deref(), Some("RATE"));
        h.reference_id = [0; 4];
        assert_eq!(kiss_code(&h), None, "chronyd's unsynchronised reply");
        h.reference_id = *b"RATE";
        h.leap = Leap::NoWarning;
        assert_eq!(kiss_code(&h), None);
        h.leap = Leap::Unsynchronised;
        h.stratum = 1;
        assert_eq!(kiss_code(&h), None, "a stratum-1 reference clock name");
    }

    #[test]
    fn refid_forms() {
        assert_eq!(refid_text(1, *b"GPS\0"), "GPS");
        assert_eq!(refid_text(0, *b"RATE"), "RATE");
        assert_eq!(refid_text(2, [192, 0, 2, 1]), "192.0.2.1");
    }
}
