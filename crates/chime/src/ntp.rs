//! `chime ntp HOST[:PORT]`: one client-mode request, the four timestamps, and the server's header
//! printed the way chrony's `ntpdata` does, or as JSON for scripts. NTPv5 (`--ntp-version 5`) is
//! in `v5`.

pub(crate) mod v5;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use chime_ntp::{Header, Leap, Mode, NtpTimestamp};
use serde::Serialize;

use crate::out::outln;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Server to query: HOST, HOST:PORT, or [IPv6]:PORT (port 123 if omitted)
    server: String,
    /// Seconds to wait for the reply
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    timeout: f64,
    /// NTP version to send (1-5). 5 is NTPv5 as drafted (draft-ietf-ntp-ntpv5): the request
    /// carries a random client cookie and names the draft, and the reply must echo both
    #[arg(long = "ntp-version", default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=5))]
    ntp_version: u8,
    /// With --ntp-version 5: the draft the request names, 08 (ntpd-rs 1.9's) or 09 [default: 08]
    #[arg(long = "ntpv5-draft", value_name = "DRAFT")]
    ntpv5_draft: Option<v5::DraftArg>,
    /// With --ntp-version 5: also read the server's reference-ID Bloom filter (512 bytes, in four
    /// more requests of 128 bytes) and report how many of its bits are set
    #[arg(long = "ntpv5-reference")]
    ntpv5_reference: bool,
    /// With --ntp-version 5: the timescale to ask for, utc, tai, ut1 or smeared (leap-smeared
    /// UTC) [default: utc]. A server that does not serve it answers in one it does, which the
    /// report names. The offset is from this machine's clock (UTC) whatever the reply's timescale
    #[arg(long = "ntpv5-timescale", value_name = "SCALE")]
    ntpv5_timescale: Option<v5::TimescaleArg>,
    /// Print the result as one JSON object
    #[arg(long)]
    json: bool,
    /// Ask in interleaved mode (RFC 9769, chronyd's `xleave`): --count exchanges, each after the
    /// first carrying the previous reply's timestamps, so that a server that supports it answers
    /// from the third on with the true transmit time of its previous reply. Prints each exchange;
    /// the result is the last one. NTPv4 only
    #[arg(long)]
    interleaved: bool,
    /// With --interleaved: how many exchanges, 3 to 64
    #[arg(long, default_value_t = 4, value_name = "N",
          value_parser = clap::value_parser!(u32).range(3..=64))]
    count: u32,
    /// With --interleaved: seconds between exchanges
    #[arg(long, default_value_t = 0.25, value_name = "SECS")]
    interval: f64,
    /// Authenticate with NTS (RFC 8915): run NTS-KE over TLS 1.3 with the server (then its port
    /// is the NTS-KE port, default 4460), and query the NTP server and port NTS-KE names with a
    /// cookie; the reply must carry our identifier and verify. With --ntp-version 5, NTS-KE asks
    /// for the NTPv5 draft and the query is v5
    #[arg(long, conflicts_with = "interleaved")]
    nts: bool,
    /// With --nts: trust the certificates in this PEM file [default: the system's store]
    #[arg(long, value_name = "FILE", requires = "nts")]
    nts_ca: Option<std::path::PathBuf>,
    /// With --nts: the AEAD algorithms to offer, in order of preference: 15 (siv-cmac-256, RFC
    /// 8915's mandatory one), 17 (siv-cmac-512) or 30 (gcm-siv, RFC 8452), comma-separated
    #[arg(long, value_name = "LIST", requires = "nts", default_value = "15",
          value_parser = crate::nts::parse_aeads)]
    nts_aead: crate::nts::AeadList,
    /// Fail (exit 1, after printing the reply) when the server says it is unsynchronised (leap 3
    /// or stratum 0): a health check, e.g. before a fleet member announces its address
    #[arg(long)]
    require_synchronised: bool,
}

/// What NTS added to a query.
#[derive(Debug, Serialize)]
struct NtsReport {
    /// The NTS-KE server.
    ke_server: String,
    /// The AEAD algorithm agreed, by IANA number.
    aead: u16,
    /// The protocol NTS-KE agreed on, which the keys were exported for: `ntpv4`, or
    /// `ntpv5-draft` with `--ntp-version 5`.
    protocol: &'static str,
    /// New cookies the authenticated reply carried.
    cookies: usize,
}

/// One exchange of an `--interleaved` series.
#[derive(Debug, Clone, Copy, Serialize)]
struct Exchange {
    /// The reply was in interleaved mode: its transmit timestamp is the true one of the previous
    /// reply, and offset and delay are those of the previous exchange, measured better.
    interleaved: bool,
    offset: f64,
    delay: f64,
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
    /// With `--interleaved`: every exchange, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    exchanges: Option<Vec<Exchange>>,
    /// With `--nts`: what the authentication showed.
    #[serde(skip_serializing_if = "Option::is_none")]
    nts: Option<NtsReport>,
    /// With `--ntp-version 5`: what the v5 header adds (`reference_id` is then empty: v5 has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    ntpv5: Option<v5::V5Report>,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 60.0) {
        bail!(
            "--timeout {}: must be between 0 and 60 seconds",
            args.timeout
        );
    }
    if args.nts && !matches!(args.ntp_version, 4 | 5) {
        bail!(
            "--nts: NTS is for NTPv4 and NTPv5 (--ntp-version 4 or 5), not --ntp-version {}",
            args.ntp_version
        );
    }
    if args.nts && args.ntpv5_reference {
        bail!("--ntpv5-reference: not with --nts (the filter is read unauthenticated)");
    }
    if args.nts && args.ntpv5_timescale.is_some() {
        bail!("--ntpv5-timescale: not with --nts (its requests ask for UTC)");
    }
    if args.interleaved && args.ntp_version != 4 {
        bail!(
            "--interleaved: interleaved mode is NTPv4 only, not --ntp-version {}",
            args.ntp_version
        );
    }
    for (given, flag) in [
        (args.ntpv5_draft.is_some(), "--ntpv5-draft"),
        (args.ntpv5_reference, "--ntpv5-reference"),
        (args.ntpv5_timescale.is_some(), "--ntpv5-timescale"),
    ] {
        if given && args.ntp_version != 5 {
            bail!(
                "{flag}: only with --ntp-version 5, not {}",
                args.ntp_version
            );
        }
    }
    if !(args.interval.is_finite() && (0.0..=60.0).contains(&args.interval)) {
        bail!(
            "--interval {}: must be between 0 and 60 seconds",
            args.interval
        );
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let draft = v5::DraftArg::or_default(args.ntpv5_draft);
    if args.nts {
        let ntpv5 = (args.ntp_version == 5).then_some(draft);
        let report = query_nts(
            &args.server,
            args.nts_ca.as_deref(),
            &args.nts_aead.0,
            ntpv5,
            timeout,
        )?;
        if args.json {
            outln!("{}", serde_json::to_string(&report)?);
        } else {
            print(&report);
        }
        return check_synchronised(args, &report);
    }
    let server = resolve(&args.server)?;
    let report = if args.interleaved {
        interleaved(
            server,
            args.count,
            Duration::from_secs_f64(args.interval),
            timeout,
        )?
    } else if args.ntp_version == 5 {
        let timescale = v5::TimescaleArg::or_utc(args.ntpv5_timescale);
        v5::query(server, draft, timescale, args.ntpv5_reference, timeout)?
    } else {
        query(server, args.ntp_version, timeout)?
    };
    if args.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    check_synchronised(args, &report)
}

/// `--require-synchronised`: an error if the reply says the server is unsynchronised.
fn check_synchronised(args: &Args, report: &Report) -> Result<()> {
    if args.require_synchronised && !report.synchronised {
        bail!(
            "{}: the server says it is unsynchronised (--require-synchronised)",
            args.server
        );
    }
    Ok(())
}

fn resolve(server: &str) -> Result<SocketAddr> {
    crate::addr::resolve(server, 123)
}

fn query(server: SocketAddr, version: u8, timeout: Duration) -> Result<Report> {
    let sock = connect(server, timeout)?;
    // The transmit timestamp is random, as chrony's client does: it is the nonce the server must
    // echo as origin, and it says nothing about our clock. T1 is kept locally.
    let nonce = NtpTimestamp(rand::random());
    let request = Header::request(version, Mode::Client, nonce);
    let (reply, t1, t4) = exchange(&sock, server, &request, &[nonce], timeout)?;
    check(server, &reply, version)?;
    let (offset, delay) = measure(t1, reply.receive_ts, reply.transmit_ts, t4);
    Ok(report(server, &reply, offset, delay, None))
}

/// One query authenticated with NTS: NTS-KE with `spec` (`HOST[:KE-PORT]`) offering `aeads` and
/// NTPv4, or the NTPv5 draft if `ntpv5` names one, then one exchange with the NTP server it
/// named, carrying a cookie and two placeholders.
fn query_nts(
    spec: &str,
    ca: Option<&std::path::Path>,
    aeads: &[chime_ntp::nts::Aead],
    ntpv5: Option<chime_ntp::v5::Draft>,
    timeout: Duration,
) -> Result<Report> {
    use chime_ntp::nts::Protocol;
    let (host, ke_port) = crate::nts::split_host(spec, crate::nts::KE_PORT)?;
    let protocol = ntpv5.map_or(Protocol::NtpV4, |_| Protocol::NtpV5Draft);
    let est = crate::nts::establish(&host, ke_port, ca, protocol, aeads, timeout)?;
    let (mut r, cookies) = match ntpv5 {
        Some(draft) => v5::query_nts(&est, draft, timeout)?,
        None => exchange_nts_v4(&est, timeout)?,
    };
    r.nts = Some(NtsReport {
        ke_server: format!("{host}:{ke_port}"),
        aead: est.keys.aead().id(),
        protocol: match est.answer.agreement.protocol {
            Protocol::NtpV4 => "ntpv4",
            Protocol::NtpV5Draft => "ntpv5-draft",
        },
        cookies,
    });
    Ok(r)
}

/// One NTPv4 exchange authenticated with NTS `est` established: the report, and how many new
/// cookies the reply carried.
fn exchange_nts_v4(est: &crate::nts::Established, timeout: Duration) -> Result<(Report, usize)> {
    let server = est.ntp;
    let sock = connect(server, timeout)?;
    let nonce = NtpTimestamp(rand::random());
    let mut header = [0u8; 48];
    Header::request(4, Mode::Client, nonce).encode(&mut header);
    let unique_id: [u8; 32] = rand::random();
    let packet = chime_ntp::nts::client_request(
        &header,
        &unique_id,
        &est.answer.cookies[0],
        2,
        &est.keys,
        rand::random(),
    );
    let (reply, bytes, t1, t4) = exchange_bytes(&sock, server, &packet, &[nonce], timeout)?;
    let cookies = match chime_ntp::nts::client_check_reply(&bytes, &unique_id, &est.keys) {
        Ok(chime_ntp::nts::ClientReply::Authentic(cookies)) => cookies.len(),
        Ok(chime_ntp::nts::ClientReply::Nak) => {
            bail!("{server}: NTS NAK: the server refused the cookie NTS-KE gave a moment ago")
        }
        Err(e) => bail!("{server}: {e}"),
    };
    check(server, &reply, 4)?;
    let (offset, delay) = measure(t1, reply.receive_ts, reply.transmit_ts, t4);
    Ok((report(server, &reply, offset, delay, None), cookies))
}

/// What an interleaved series keeps of the exchange before: our send and receive times and the
/// server's receive timestamp.
#[derive(Clone, Copy)]
struct Previous {
    t1: NtpTimestamp,
    t2: NtpTimestamp,
    t4: NtpTimestamp,
}

/// `count` exchanges in interleaved mode (RFC 9769). Each request after the first carries, as
/// origin, the receive timestamp of the server's previous reply and, as receive, when we got that
/// reply. A server in interleaved mode answers with our receive field as origin and the true
/// transmit time of its previous reply; the measurement is then of the previous exchange.
fn interleaved(
    server: SocketAddr,
    count: u32,
    interval: Duration,
    timeout: Duration,
) -> Result<Report> {
    let sock = connect(server, timeout)?;
    let mut previous: Option<Previous> = None;
    let mut exchanges = Vec::new();
    let mut last = None;
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(interval);
        }
        let nonce = NtpTimestamp(rand::random());
        let mut request = Header::request(4, Mode::Client, nonce);
        let mut expect = vec![nonce];
        if let Some(p) = previous {
            request.origin_ts = p.t2;
            request.receive_ts = p.t4;
            expect.push(p.t4);
        }
        let (reply, t1, t4) = exchange(&sock, server, &request, &expect, timeout)?;
        check(server, &reply, 4)?;
        let as_interleaved =
            previous.filter(|p| reply.origin_ts == p.t4 && reply.origin_ts != nonce);
        let (offset, delay) = match as_interleaved {
            Some(p) => measure(p.t1, p.t2, reply.transmit_ts, p.t4),
            None => measure(t1, reply.receive_ts, reply.transmit_ts, t4),
        };
        exchanges.push(Exchange {
            interleaved: as_interleaved.is_some(),
            offset,
            delay,
        });
        previous = Some(Previous {
            t1,
            t2: reply.receive_ts,
            t4,
        });
        last = Some(reply);
    }
    let (Some(reply), Some(e)) = (last, exchanges.last().copied()) else {
        bail!("{server}: no exchange");
    };
    Ok(report(server, &reply, e.offset, e.delay, Some(exchanges)))
}

/// A socket connected to `server`, with `timeout` for each receive.
fn connect(server: SocketAddr, timeout: Duration) -> Result<UdpSocket> {
    let local: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let sock = UdpSocket::bind(local).context("cannot open a UDP socket")?;
    sock.connect(server)
        .with_context(|| format!("{server}: cannot connect"))?;
    sock.set_read_timeout(Some(timeout))?;
    Ok(sock)
}

/// Sends `request` and returns the first reply whose origin timestamp is one of `expect`, with
/// our send (T1) and receive (T4) times. Replies to anything else are skipped until `timeout`.
fn exchange(
    sock: &UdpSocket,
    server: SocketAddr,
    request: &Header,
    expect: &[NtpTimestamp],
    timeout: Duration,
) -> Result<(Header, NtpTimestamp, NtpTimestamp)> {
    let mut packet = [0u8; 48];
    request.encode(&mut packet);
    exchange_bytes(sock, server, &packet, expect, timeout).map(|(h, _, t1, t4)| (h, t1, t4))
}

/// [`exchange`] for a request already in bytes (extension fields and all); also returns the
/// reply's bytes.
fn exchange_bytes(
    sock: &UdpSocket,
    server: SocketAddr,
    packet: &[u8],
    expect: &[NtpTimestamp],
    timeout: Duration,
) -> Result<(Header, Vec<u8>, NtpTimestamp, NtpTimestamp)> {
    let t1 = now();
    sock.send(packet)
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
        if expect.contains(&reply.origin_ts) {
            return Ok((reply, buf[..len].to_vec(), t1, t4));
        }
        // Not the answer to this request (a late reply to an earlier one); keep waiting.
        if std::time::Instant::now() >= deadline {
            bail!(
                "{server}: no matching reply within {:.1} s",
                timeout.as_secs_f64()
            );
        }
    }
}

/// Refuses a reply in the wrong mode or version, a Kiss-o'-Death, or one without timestamps.
fn check(server: SocketAddr, reply: &Header, version: u8) -> Result<()> {
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
    let stamps = (reply.receive_ts, reply.transmit_ts);
    refuse_kiss_or_blank(server, kiss_code(reply), reply.poll, reply.stratum, stamps)
}

/// Refuses a Kiss-o'-Death (`kiss`, with the reply's `poll`), or a reply that is not one and
/// lacks a receive or transmit timestamp: for v4 and v5 replies alike.
fn refuse_kiss_or_blank(
    server: SocketAddr,
    kiss: Option<String>,
    poll: i8,
    stratum: u8,
    (receive, transmit): (NtpTimestamp, NtpTimestamp),
) -> Result<()> {
    if let Some(code) = kiss {
        bail!("{server}: Kiss-o'-Death {code}{}", kiss_advice(&code, poll));
    }
    if stratum != 0 && (receive == NtpTimestamp::ZERO || transmit == NtpTimestamp::ZERO) {
        bail!("{server}: bad reply: zero receive or transmit timestamp");
    }
    Ok(())
}

/// What a kiss code asks of the client, for the error that reports it.
fn kiss_advice(code: &str, poll: i8) -> String {
    match code {
        "RATE" => {
            format!(": asks this client to poll less often (suggested poll interval 2^{poll} s)")
        }
        "DENY" | "RSTR" => ": refuses to serve this client".into(),
        _ => String::new(),
    }
}

/// Offset and round-trip delay from the four timestamps. Differences of NTP timestamps are
/// era-safe as long as the clocks are within 68 years.
fn measure(t1: NtpTimestamp, t2: NtpTimestamp, t3: NtpTimestamp, t4: NtpTimestamp) -> (f64, f64) {
    let offset = (t2.wrapping_diff_seconds(t1) + t3.wrapping_diff_seconds(t4)) / 2.0;
    let delay = t4.wrapping_diff_seconds(t1) - t3.wrapping_diff_seconds(t2);
    (offset, delay)
}

fn report(
    server: SocketAddr,
    reply: &Header,
    offset: f64,
    delay: f64,
    exchanges: Option<Vec<Exchange>>,
) -> Report {
    Report {
        server,
        version: reply.version,
        mode: reply.mode as u8,
        leap: reply.leap as u8,
        synchronised: reply.leap != Leap::Unsynchronised && reply.stratum != 0,
        stratum: reply.stratum,
        reference_id: refid_text(reply.stratum, reply.reference_id),
        reference_id_hex: hex::encode_upper(reply.reference_id),
        precision: reply.precision,
        poll: reply.poll,
        root_delay: reply.root_delay.seconds(),
        root_dispersion: reply.root_dispersion.seconds(),
        offset,
        delay,
        exchanges,
        nts: None,
        ntpv5: None,
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
    outln!("Server          : {}", r.server);
    outln!("Version         : {}", r.version);
    outln!("Mode            : {}", r.mode);
    outln!("Leap status     : {leap} ({})", r.leap);
    outln!("Stratum         : {}", r.stratum);
    match &r.ntpv5 {
        Some(v) => v5::print(v),
        None => outln!(
            "Reference ID    : {} ({})",
            r.reference_id_hex,
            r.reference_id
        ),
    }
    outln!(
        "Precision       : {} ({:.9} s)",
        r.precision,
        2f64.powi(r.precision.into())
    );
    outln!("Root delay      : {:.6} s", r.root_delay);
    outln!("Root dispersion : {:.6} s", r.root_dispersion);
    if let Some(exchanges) = &r.exchanges {
        for (i, e) in exchanges.iter().enumerate() {
            outln!(
                "Exchange {:<2}     : {:<11} offset {:+.9} s, delay {:.9} s",
                i + 1,
                if e.interleaved {
                    "interleaved"
                } else {
                    "basic"
                },
                e.offset,
                e.delay
            );
        }
    }
    outln!("Offset          : {:+.9} s", r.offset);
    outln!("Delay           : {:.9} s", r.delay);
    if let Some(n) = &r.nts {
        let aead = chime_ntp::nts::Aead::from_id(n.aead).map_or("?", |a| a.name());
        outln!(
            "Authenticated   : NTS ({aead}), keys for {} from NTS-KE at {}, {} new cookies",
            n.protocol,
            n.ke_server,
            n.cookies
        );
    }
    match &r.exchanges {
        Some(e) if e.last().is_some_and(|e| e.interleaved) => {
            outln!("The server answers in interleaved mode (RFC 9769).");
        }
        Some(_) => outln!("The server answered in basic mode only: no interleaved mode."),
        None => {}
    }
    if !r.synchronised {
        outln!("The server says it is unsynchronised: its time must not be trusted.");
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
