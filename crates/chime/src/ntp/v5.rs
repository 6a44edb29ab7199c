//! `chime ntp --ntp-version 5`: one NTPv5 exchange as drafted (draft-ietf-ntp-ntpv5, revision -08
//! or -09), matched by a random client cookie, and with `--ntpv5-reference` the server's whole
//! reference-ID Bloom filter, read in four slices.
//!
//! A v5 reply carries no reference ID and no origin timestamp: the cookie names the request, the
//! Draft Identification the draft, and the era field places the server's timestamps, so the offset
//! is right however far apart the two clocks are.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use chime_ntp::nts;
use chime_ntp::v5::{self, BloomFilter, Draft, Response, ResponseError};
use chime_ntp::{Leap, NtpTimestamp};
use serde::Serialize;

use super::{Report, connect, refuse_kiss_or_blank};
use crate::out::outln;

/// `--ntpv5-draft`: the revision a v5 request names, and its reply must name too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DraftArg {
    /// draft-ietf-ntp-ntpv5-08, which ntpd-rs 1.9 speaks
    #[value(name = "08")]
    D08,
    /// draft-ietf-ntp-ntpv5-09
    #[value(name = "09")]
    D09,
}

/// `--ntpv5-timescale`: the timescale a v5 request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TimescaleArg {
    /// UTC
    Utc,
    /// TAI (UTC plus the leap seconds since 1972 and 10 s)
    Tai,
    /// UT1
    Ut1,
    /// UTC with leap seconds smeared out
    Smeared,
}

impl TimescaleArg {
    /// The timescale field's value, UTC's where none was given.
    pub(crate) fn or_utc(given: Option<Self>) -> u8 {
        match given {
            None | Some(Self::Utc) => v5::timescale::UTC,
            Some(Self::Tai) => v5::timescale::TAI,
            Some(Self::Ut1) => v5::timescale::UT1,
            Some(Self::Smeared) => v5::timescale::LEAP_SMEARED_UTC,
        }
    }
}

impl DraftArg {
    pub(crate) const fn draft(self) -> Draft {
        match self {
            Self::D08 => Draft::D08,
            Self::D09 => Draft::D09,
        }
    }

    /// The draft `--ntpv5-draft` names, or 08 (ntpd-rs 1.9's) where it was not given.
    pub(crate) fn or_default(given: Option<Self>) -> Draft {
        given.unwrap_or(Self::D08).draft()
    }
}

/// What a v5 reply adds to the report.
#[derive(Debug, Serialize)]
pub(super) struct V5Report {
    /// The draft the request and the reply named, as its Draft Identification.
    draft: &'static str,
    /// The timescale of the reply's timestamps: 0 UTC, 1 TAI, 2 UT1, 3 leap-smeared UTC. A server
    /// that does not serve the one asked for answers in one it does.
    timescale: u8,
    /// The timescale the request asked for.
    timescale_asked: u8,
    /// The NTP era of the server's timestamps (0 until 2036).
    era: u8,
    /// The flags byte: 0x1 synchronised, 0x2 interleaved, 0x4 NTS NAK.
    flags: u8,
    /// With `--ntpv5-reference`: how many of the filter's 4096 bits are set (ten per server in
    /// the server's own identity and those of its sources).
    #[serde(skip_serializing_if = "Option::is_none")]
    reference_bits_set: Option<u32>,
    /// With `--ntpv5-reference`: the 512-byte filter, in hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    reference_filter_hex: Option<String>,
}

/// The bytes of the filter each Reference ID Request asks for, as chimed's upstream poller asks:
/// four requests of 208 bytes read the whole 512, and no datagram is larger than that.
const SLICE: usize = v5::FilterFetch::SLICE;

/// One v5 query of `server` naming `draft` and asking for `timescale`; with `reference`, four
/// more exchanges read the server's reference-ID filter.
pub(super) fn query(
    server: SocketAddr,
    draft: Draft,
    timescale: u8,
    reference: bool,
    timeout: Duration,
) -> Result<Report> {
    let cookie = rand::random();
    let sent = exchange(server, draft, timescale, cookie, None, timeout)?;
    let reply = check(server, &sent.reply, cookie, draft)?;
    let (offset, delay) = measure(&sent, &reply);
    let filter = match reference {
        true => Some(read_filter(server, draft, timeout)?),
        false => None,
    };
    let mut report = report(server, &reply, offset, delay, filter);
    if let Some(v5) = &mut report.ntpv5 {
        v5.timescale_asked = timescale;
    }
    Ok(report)
}

/// A request sent and its reply: our send time (T1) with the era of our clock then, the reply's
/// bytes and our receive time (T4).
struct Sent {
    t1: NtpTimestamp,
    era: u8,
    reply: Vec<u8>,
    t4: NtpTimestamp,
}

/// Sends one v5 request with `cookie` in `timescale`, asking for the `reference` slice of the
/// filter if given, from a socket of its own, and returns the first datagram the server sends
/// back.
fn exchange(
    server: SocketAddr,
    draft: Draft,
    timescale: u8,
    cookie: [u8; 8],
    reference: Option<(u16, u16)>,
    timeout: Duration,
) -> Result<Sent> {
    let mut request = [0u8; 256];
    // A 128-byte slice and the draft's name take 48 + 132 + 28 bytes: it fits.
    let len = v5::write_request(&mut request, draft, 0, cookie, reference)
        .context("an NTPv5 request that does not fit its buffer")?;
    v5::ask_timescale(&mut request, timescale);
    send(server, &request[..len], draft, timeout)
}

/// One v5 query authenticated with NTS, with what NTS-KE established (keys exported for the
/// NTPv5 draft): a cookie and two placeholders. The reply must carry our identifier and verify
/// before it is read as [`query`] reads one. Returns the report and how many new cookies came.
pub(super) fn query_nts(
    est: &crate::nts::Established,
    draft: Draft,
    timeout: Duration,
) -> Result<(Report, usize)> {
    let server = est.ntp;
    let cookie = rand::random();
    let unique_id: [u8; 32] = rand::random();
    let nts_cookie = &est.answer.cookies[0];
    let request = nts::client_request_v5(
        draft,
        cookie,
        &unique_id,
        nts_cookie,
        2,
        &est.keys,
        rand::random(),
    );
    let sent = send(server, &request, draft, timeout)?;
    let cookies = match nts::client_check_reply_v5(&sent.reply, &unique_id, &est.keys) {
        Ok(nts::ClientReply::Authentic(cookies)) => cookies.len(),
        Ok(nts::ClientReply::Nak) => {
            bail!("{server}: NTS NAK: the server refused the cookie NTS-KE gave a moment ago")
        }
        Err(e) => bail!("{server}: {e}"),
    };
    let reply = check(server, &sent.reply, cookie, draft)?;
    let (offset, delay) = measure(&sent, &reply);
    Ok((report(server, &reply, offset, delay, None), cookies))
}

/// Sends `request` (naming `draft`) from a socket of its own and returns the first datagram the
/// server sends back, with our send and receive times.
fn send(server: SocketAddr, request: &[u8], draft: Draft, timeout: Duration) -> Result<Sent> {
    let sock = connect(server, timeout)?;
    let (t1, era) = now_with_era();
    sock.send(request)
        .with_context(|| format!("{server}: send failed"))?;
    let mut buf = [0u8; 1024];
    let n = match sock.recv(&mut buf) {
        Ok(n) => n,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            bail!(
                "{server}: no reply within {:.1} s (a server that does not speak NTPv5 as {} \
                 drops the request)",
                timeout.as_secs_f64(),
                draft.id()
            )
        }
        Err(e) => bail!("{server}: {e}"),
    };
    let t4 = super::now();
    Ok(Sent {
        t1,
        era,
        reply: buf[..n].to_vec(),
        t4,
    })
}

/// The reply read with `cookie` and `draft`, or why it is refused: not v5, not well formed,
/// another request's cookie, another draft, a Kiss-o'-Death, or no timestamps.
fn check<'r>(
    server: SocketAddr,
    bytes: &'r [u8],
    cookie: [u8; 8],
    draft: Draft,
) -> Result<Response<'r>> {
    let reply = match v5::parse_response(bytes, cookie, draft) {
        Ok(r) => r,
        Err(ResponseError::Version(v)) => {
            bail!("{server}: bad reply: version {v} to a version 5 request")
        }
        Err(ResponseError::WrongDraft) => {
            bail!("{server}: bad reply: {}", named_draft(bytes, draft))
        }
        Err(e) => bail!("{server}: bad reply ({} bytes): {e}", bytes.len()),
    };
    let stamps = (reply.receive_ts, reply.transmit_ts);
    refuse_kiss_or_blank(server, kiss_code(&reply), reply.poll, reply.stratum, stamps)?;
    Ok(reply)
}

/// What a reply that does not name `asked` names instead, for the error.
fn named_draft(reply: &[u8], asked: Draft) -> String {
    let named = v5::fields(reply)
        .into_iter()
        .flatten()
        .filter(|f| f.ty == v5::ef::DRAFT_ID)
        .last();
    match named {
        Some(f) => format!(
            "it names the draft {:?} where the request named {:?}",
            String::from_utf8_lossy(&f.value[..f.value.len().min(64)]),
            asked.id()
        ),
        None => format!("it names no draft where the request named {:?}", asked.id()),
    }
}

/// The kiss code of a v5 Kiss-o'-Death: leap 3, stratum 0, and four capitals at the start of the
/// server cookie, where v5 carries it.
fn kiss_code(reply: &Response<'_>) -> Option<String> {
    let code = &reply.server_cookie[..4];
    (reply.leap == Leap::Unsynchronised
        && reply.stratum == 0
        && code.iter().all(u8::is_ascii_uppercase))
    .then(|| code.iter().map(|&b| char::from(b)).collect())
}

/// Offset and round-trip delay, each timestamp placed in its era: ours by our clock when we sent,
/// the server's by the reply's era field (T2 as the one nearest T3, T4 nearest T1).
fn measure(sent: &Sent, reply: &Response<'_>) -> (f64, f64) {
    let t1 = in_era(sent.t1, sent.era);
    let t4 = t1 + after(sent.t4, sent.t1);
    let t3 = in_era(reply.transmit_ts, reply.era);
    let t2 = t3 + after(reply.receive_ts, reply.transmit_ts);
    let seconds = |units: i128| units as f64 / 4_294_967_296.0;
    let offset = seconds((t2 - t1) + (t3 - t4)) / 2.0;
    let delay = seconds((t4 - t1) - (t3 - t2));
    (offset, delay)
}

/// A timestamp in units of 2^-32 s since the start of era 0 (1900).
fn in_era(ts: NtpTimestamp, era: u8) -> i128 {
    (i128::from(era) << 64) | i128::from(ts.0)
}

/// How long after `earlier` `ts` is, in units of 2^-32 s, within 68 years either way.
fn after(ts: NtpTimestamp, earlier: NtpTimestamp) -> i128 {
    i128::from(ts.0.wrapping_sub(earlier.0) as i64)
}

/// Now as an NTP timestamp, and its era, from one reading of the clock.
fn now_with_era() -> (NtpTimestamp, u8) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    (
        NtpTimestamp::from_unix(secs, d.subsec_nanos()),
        v5::era(secs),
    )
}

/// The server's whole reference-ID filter, a [`SLICE`] at a time, each in an exchange of its own
/// with its own cookie and checked as the first was.
fn read_filter(server: SocketAddr, draft: Draft, timeout: Duration) -> Result<BloomFilter> {
    let mut bytes = [0u8; BloomFilter::BYTES];
    for (i, slice) in bytes.chunks_mut(SLICE).enumerate() {
        let offset = i * SLICE;
        let cookie = rand::random();
        let asked = (offset as u16, SLICE as u16);
        let sent = exchange(
            server,
            draft,
            v5::timescale::UTC,
            cookie,
            Some(asked),
            timeout,
        )?;
        match check(server, &sent.reply, cookie, draft)?.reference {
            Some(got) if got.len() == SLICE => slice.copy_from_slice(got),
            Some(got) => bail!(
                "{server}: bad reply: {} bytes of the reference-ID filter at offset {offset}, \
                 where {SLICE} were asked for",
                got.len()
            ),
            None => bail!(
                "{server}: the reply carries no reference-ID filter ({SLICE} bytes at offset \
                 {offset} were asked for)"
            ),
        }
    }
    Ok(BloomFilter::from_bytes(bytes))
}

fn report(
    server: SocketAddr,
    reply: &Response<'_>,
    offset: f64,
    delay: f64,
    filter: Option<BloomFilter>,
) -> Report {
    let synchronised = reply.leap != Leap::Unsynchronised
        && reply.stratum != 0
        && reply.flags & v5::flags::SYNCHRONISED != 0;
    Report {
        server,
        version: v5::VERSION,
        mode: 4,
        leap: reply.leap as u8,
        synchronised,
        stratum: reply.stratum,
        // v5 has no reference ID: the filter takes its place.
        reference_id: String::new(),
        reference_id_hex: String::new(),
        precision: reply.precision,
        poll: reply.poll,
        root_delay: reply.root_delay,
        root_dispersion: reply.root_dispersion,
        offset,
        delay,
        exchanges: None,
        nts: None,
        ntpv5: Some(V5Report {
            draft: reply.draft.id(),
            timescale: reply.timescale,
            timescale_asked: v5::timescale::UTC,
            era: reply.era,
            flags: reply.flags,
            reference_bits_set: filter.map(|f| f.bits().count() as u32),
            reference_filter_hex: filter.map(|f| hex::encode(f.as_bytes())),
        }),
    }
}

/// The lines of the human report that v5 has in place of the reference ID.
pub(super) fn print(v: &V5Report) {
    let name = |scale: u8| match scale {
        0 => "UTC",
        1 => "TAI",
        2 => "UT1",
        3 => "leap-smeared UTC",
        _ => "unknown",
    };
    let timescale = name(v.timescale);
    let flags: Vec<&str> = [
        (v5::flags::SYNCHRONISED, "synchronised"),
        (v5::flags::INTERLEAVED, "interleaved"),
        (v5::flags::AUTH_NAK, "NTS NAK"),
    ]
    .into_iter()
    .filter(|(bit, _)| v.flags & bit != 0)
    .map(|(_, name)| name)
    .collect();
    outln!("Draft           : {}", v.draft);
    if v.timescale == v.timescale_asked {
        outln!("Timescale       : {timescale} ({})", v.timescale);
    } else {
        outln!(
            "Timescale       : {timescale} ({}), where {} was asked for: the server does not \
             serve it now",
            v.timescale,
            name(v.timescale_asked)
        );
    }
    outln!("Era             : {}", v.era);
    outln!("Flags           : 0x{:02x} ({})", v.flags, flags.join(", "));
    if let Some(bits) = v.reference_bits_set {
        outln!("Reference IDs   : {bits} of 4096 bits set in the server's filter");
    }
}

#[cfg(test)]
mod tests {
    use chime_ntp::v5::{ServerId, flags, write_request};

    use super::*;

    /// A reply to a request with `cookie` naming `draft`, as chimed writes it with its own filter
    /// and an empty server state but for the timestamps, which `rx` gives.
    fn reply_to(request: &[u8], rx: NtpTimestamp, era: u8) -> Vec<u8> {
        let mut served = chime_ntp::ServedHeader::unsynchronised(-20);
        served.stratum = 2;
        served.leap = Leap::NoWarning;
        let mut filter = BloomFilter::new();
        let mut n = 0u16;
        filter.add_id(&ServerId::new(|| {
            n += 7;
            n
        }));
        let mut out = vec![0u8; request.len()];
        v5::respond(request, rx, &served, &filter, era, &mut out).unwrap();
        out
    }

    fn request(draft: Draft, cookie: [u8; 8], reference: Option<(u16, u16)>) -> Vec<u8> {
        let mut buf = vec![0u8; 256];
        let len = write_request(&mut buf, draft, 0, cookie, reference).unwrap();
        buf.truncate(len);
        buf
    }

    fn server() -> SocketAddr {
        ([192, 0, 2, 1], 123).into()
    }

    #[test]
    fn a_reply_is_checked_against_the_cookie_and_the_draft() {
        let rx = NtpTimestamp::from_unix(1_800_000_000, 0);
        let reply = reply_to(&request(Draft::D08, [1; 8], None), rx, 0);
        let ok = check(server(), &reply, [1; 8], Draft::D08).unwrap();
        assert_eq!((ok.stratum, ok.flags), (2, flags::SYNCHRONISED));
        let err = check(server(), &reply, [2; 8], Draft::D08).unwrap_err();
        assert!(err.to_string().contains("cookie"), "{err}");
        let err = check(server(), &reply, [1; 8], Draft::D09).unwrap_err();
        assert_eq!(
            err.to_string(),
            "192.0.2.1:123: bad reply: it names the draft \"draft-ietf-ntp-ntpv5-08\" where \
             the request named \"draft-ietf-ntp-ntpv5-09\""
        );
        let mut v4 = reply.clone();
        v4[0] = 0x24;
        let err = check(server(), &v4, [1; 8], Draft::D08).unwrap_err();
        assert!(
            err.to_string().contains("version 4 to a version 5"),
            "{err}"
        );
    }

    #[test]
    fn a_kiss_is_told_by_its_code_in_the_server_cookie() {
        let rx = NtpTimestamp::from_unix(1_800_000_000, 0);
        let mut reply = reply_to(&request(Draft::D09, [1; 8], None), rx, 0);
        v5::kiss_of_death(&mut reply, *b"RATE");
        let err = check(server(), &reply, [1; 8], Draft::D09).unwrap_err();
        assert!(
            err.to_string()
                .contains("Kiss-o'-Death RATE: asks this client"),
            "{err}"
        );
    }

    #[test]
    fn the_era_places_the_servers_timestamps() {
        // We are in 2026 (era 0); the server says 2131, three billion seconds into era 1. The
        // clocks are more than 68 years apart, where timestamps without their era are ambiguous.
        let era1 = 4_294_967_296 - 2_208_988_800; // Unix time at the start of era 1
        let t1 = NtpTimestamp::from_unix(1_800_000_000, 0);
        let t2 = NtpTimestamp::from_unix(era1 + 3_000_000_000, 0);
        let t3 = NtpTimestamp::from_unix(era1 + 3_000_000_000, 1_000_000);
        let t4 = NtpTimestamp::from_unix(1_800_000_000, 3_000_000);
        let sent = Sent {
            t1,
            era: 0,
            reply: Vec::new(),
            t4,
        };
        let reply = reply_to(&request(Draft::D08, [1; 8], None), t2, 1);
        let mut reply = v5::parse_response(&reply, [1; 8], Draft::D08).unwrap();
        (reply.receive_ts, reply.transmit_ts) = (t2, t3);
        let (offset, delay) = measure(&sent, &reply);
        let expected = (era1 + 3_000_000_000 - 1_800_000_000) as f64 - 0.001;
        assert!((offset - expected).abs() < 1e-6, "{offset} vs {expected}");
        assert!((delay - 0.002).abs() < 1e-9, "{delay}");
        // Without the era, as v4 measures, the offset is 2^32 s off.
        let (v4, _) = crate::ntp::measure(t1, t2, t3, t4);
        assert!((v4 + 4_294_967_296.0 - expected).abs() < 1e-6, "{v4}");
        // And in era 0 the server's time is taken as 2^32 s earlier.
        reply.era = 0;
        let (offset, _) = measure(&sent, &reply);
        assert!(
            (offset + 4_294_967_296.0 - expected).abs() < 1e-6,
            "{offset}"
        );
    }
}
