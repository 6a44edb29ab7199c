//! `chime perf ntp`: NTP requests of a chosen version and mode, matched by origin timestamp
//! (NTPv5's, matched by client cookie, are `ntpv5`'s).
//!
//! The transmit timestamp of each request is its id, not a time: the server copies it into the
//! reply's origin timestamp, which is how the reply finds its request (chrony's client also sends a
//! random transmit timestamp and keeps T1 to itself). T1 is the transport's clock read just before
//! `sendmmsg`; the reply's receive and transmit timestamps (T2, T3) give the server's receive
//! timestamp error T2 − T1 (measured on the first datagram of each `sendmmsg`, the one whose T1
//! is exact) and its processing time T3 − T2. Both need the server on this host, on our clock.

use chime_ntp::{Header, Leap, Mode, NtpTimestamp};

use super::args::LoadArgs;
use super::protocol::{LoadProtocol, ReplyMatch, ServerTimes, Verdict};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("server").required(true).multiple(true).args(["target", "nts"])))]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) load: LoadArgs,

    /// NTP version of the requests (1-5). 5 is NTPv5 as drafted (draft-ietf-ntp-ntpv5), client
    /// mode only: each request's client cookie is its id, and a reply counts only if it echoes
    /// the cookie and names the request's draft
    #[arg(long = "ntp-version", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u8).range(1..=5))]
    pub(crate) ntp_version: u8,

    /// With --ntp-version 5: the draft the requests name, 08 (ntpd-rs 1.9's) or 09 [default: 08]
    #[arg(long = "ntpv5-draft", value_name = "DRAFT")]
    pub(crate) ntpv5_draft: Option<crate::ntp::v5::DraftArg>,

    /// Association mode of the requests
    #[arg(long, value_name = "MODE", default_value = "3")]
    pub(crate) mode: RequestMode,

    #[command(flatten)]
    pub(crate) nts: super::args::NtsArgs,
}

impl Args {
    /// The NTPv5 draft requests name: `--ntpv5-draft`, or 08.
    pub(crate) fn draft(&self) -> chime_ntp::v5::Draft {
        crate::ntp::v5::DraftArg::or_default(self.ntpv5_draft)
    }
}

/// The request modes a server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RequestMode {
    /// Client (mode 3), answered in server mode (4)
    #[value(name = "3", alias = "client")]
    Client,
    /// Symmetric active (mode 1, as old Windows clients send), answered in symmetric passive (2)
    #[value(name = "1", alias = "symmetric-active")]
    SymmetricActive,
}

impl RequestMode {
    fn request(self) -> Mode {
        match self {
            Self::Client => Mode::Client,
            Self::SymmetricActive => Mode::SymmetricActive,
        }
    }

    fn reply(self) -> Mode {
        match self {
            Self::Client => Mode::Server,
            Self::SymmetricActive => Mode::SymmetricPassive,
        }
    }
}

/// Offset of the transmit timestamp in the header, where the id goes.
const TRANSMIT_TS: usize = 40;

/// Kiss codes (RFC 5905 §7.4) that refuse service, sent with stratum 0.
pub(super) const REFUSALS: [[u8; 4]; 3] = [*b"RATE", *b"DENY", *b"RSTR"];

/// NTP requests of one version and mode.
#[derive(Clone, Debug)]
pub(crate) struct NtpLoad {
    version: u8,
    mode: RequestMode,
    /// The request with a zero transmit timestamp; each request is this with the id patched in.
    template: [u8; Header::LEN],
}

impl NtpLoad {
    pub(crate) fn new(version: u8, mode: RequestMode) -> Self {
        let header = Header::request(version, mode.request(), NtpTimestamp::ZERO);
        let mut template = [0; Header::LEN];
        header.encode(&mut template);
        Self {
            version,
            mode,
            template,
        }
    }

    /// What a client makes of a reply's header: the mode and version it asked for, a refusal, or
    /// the timestamps a synchronised server must set.
    pub(super) fn judge(&self, reply: &Header) -> Verdict {
        if reply.mode != self.mode.reply() || reply.version != self.version {
            return Verdict::Invalid;
        }
        if reply.stratum == 0 && REFUSALS.contains(&reply.reference_id) {
            return Verdict::Refused;
        }
        // An unsynchronised server (leap 3, stratum 0) may leave its timestamps zero; a
        // synchronised one must not.
        let unsynchronised = reply.stratum == 0 || reply.leap == Leap::Unsynchronised;
        if !unsynchronised
            && (reply.receive_ts == NtpTimestamp::ZERO || reply.transmit_ts == NtpTimestamp::ZERO)
        {
            return Verdict::Invalid;
        }
        Verdict::Valid
    }
}

impl LoadProtocol for NtpLoad {
    const NAME: &'static str = "ntp";

    fn max_request_len(&self) -> usize {
        Header::LEN
    }

    fn max_reply_len(&self) -> usize {
        // A reply is never longer than its request, but a broken server's may be: take enough to
        // see it whole rather than judge a truncated datagram.
        512
    }

    fn fill_request(&mut self, id: u64, buf: &mut [u8]) -> usize {
        let out = &mut buf[..Header::LEN];
        out.copy_from_slice(&self.template);
        out[TRANSMIT_TS..].copy_from_slice(&id.to_be_bytes());
        Header::LEN
    }

    fn match_reply(&mut self, reply: &[u8], received_unix_secs: i64) -> ReplyMatch {
        let Ok(header) = Header::parse(reply) else {
            return ReplyMatch::Unmatched;
        };
        let verdict = self.judge(&header);
        ReplyMatch::Matched {
            id: header.origin_ts.0,
            verdict,
            server: server_times(&header, verdict, received_unix_secs),
            signed: None,
        }
    }
}

/// The server's receive and transmit timestamps of a valid reply that sets both.
pub(super) fn server_times(
    header: &Header,
    verdict: Verdict,
    received_unix_secs: i64,
) -> Option<ServerTimes> {
    times(
        header.receive_ts,
        header.transmit_ts,
        verdict,
        received_unix_secs,
    )
}

/// [`server_times`] from the two timestamps, wherever the version keeps them.
pub(super) fn times(
    receive_ts: NtpTimestamp,
    transmit_ts: NtpTimestamp,
    verdict: Verdict,
    received_unix_secs: i64,
) -> Option<ServerTimes> {
    (verdict == Verdict::Valid
        && receive_ts != NtpTimestamp::ZERO
        && transmit_ts != NtpTimestamp::ZERO)
        .then(|| ServerTimes {
            receive_ns: unix_nanos(receive_ts, received_unix_secs),
            transmit_ns: unix_nanos(transmit_ts, received_unix_secs),
        })
}

/// An NTP timestamp as nanoseconds since the Unix epoch, in the era nearest `pivot_secs`.
fn unix_nanos(ts: NtpTimestamp, pivot_secs: i64) -> i64 {
    let (secs, nanos) = ts.to_unix_near(pivot_secs);
    secs.saturating_mul(1_000_000_000)
        .saturating_add(i64::from(nanos))
}

#[cfg(test)]
pub(super) mod tests {
    use chime_ntp::NtpShort;

    use super::*;

    pub(in crate::perf) const NOW: i64 = 1_800_000_000;

    /// A synchronised server's reply header to `request`, changed by `edit`.
    pub(in crate::perf) fn reply_to(request: &[u8], edit: impl FnOnce(&mut Header)) -> [u8; 48] {
        let req = Header::parse(request).unwrap();
        let mut h = Header {
            leap: Leap::NoWarning,
            version: req.version,
            mode: Mode::Server,
            stratum: 3,
            poll: 0,
            precision: -24,
            root_delay: NtpShort(0),
            root_dispersion: NtpShort(0),
            reference_id: [127, 127, 1, 1],
            reference_ts: NtpTimestamp::from_unix(NOW - 10, 0),
            origin_ts: req.transmit_ts,
            receive_ts: NtpTimestamp::from_unix(NOW, 1_000),
            transmit_ts: NtpTimestamp::from_unix(NOW, 6_000),
        };
        edit(&mut h);
        let mut out = [0; 48];
        h.encode(&mut out);
        out
    }

    #[test]
    fn request_carries_the_id_as_transmit_timestamp() {
        let mut p = NtpLoad::new(3, RequestMode::SymmetricActive);
        let mut buf = [0xAA; 64];
        assert_eq!(p.fill_request(0x0123_4567_89AB_CDEF, &mut buf), 48);
        let h = Header::parse(&buf).unwrap();
        assert_eq!(
            (h.version, h.mode, h.transmit_ts.0),
            (3, Mode::SymmetricActive, 0x0123_4567_89AB_CDEF)
        );
        assert_eq!(h.origin_ts, NtpTimestamp::ZERO);
    }

    #[test]
    fn replies_match_by_origin_and_are_judged() {
        let mut p = NtpLoad::new(4, RequestMode::Client);
        let mut req = [0; 48];
        p.fill_request(77, &mut req);

        let good = reply_to(&req, |_| {});
        let ReplyMatch::Matched {
            id,
            verdict,
            server,
            ..
        } = p.match_reply(&good, NOW)
        else {
            panic!("unmatched");
        };
        assert_eq!((id, verdict), (77, Verdict::Valid));
        let server = server.unwrap();
        assert_eq!(server.transmit_ns - server.receive_ns, 5_000);

        let wrong_mode = reply_to(&req, |h| h.mode = Mode::SymmetricPassive);
        let wrong_version = reply_to(&req, |h| h.version = 3);
        let zero_t2 = reply_to(&req, |h| h.receive_ts = NtpTimestamp::ZERO);
        for bad in [wrong_mode, wrong_version, zero_t2] {
            assert!(matches!(
                p.match_reply(&bad, NOW),
                ReplyMatch::Matched {
                    id: 77,
                    verdict: Verdict::Invalid,
                    server: None,
                    ..
                }
            ));
        }
        let kod = reply_to(&req, |h| {
            h.stratum = 0;
            h.leap = Leap::Unsynchronised;
            h.reference_id = *b"RATE";
        });
        assert!(matches!(
            p.match_reply(&kod, NOW),
            ReplyMatch::Matched {
                verdict: Verdict::Refused,
                ..
            }
        ));
        // An unsynchronised server still answers.
        let unsync = reply_to(&req, |h| {
            h.stratum = 0;
            h.leap = Leap::Unsynchronised;
            h.reference_id = [0; 4];
        });
        assert!(matches!(
            p.match_reply(&unsync, NOW),
            ReplyMatch::Matched {
                verdict: Verdict::Valid,
                ..
            }
        ));
        assert_eq!(p.match_reply(&good[..47], NOW), ReplyMatch::Unmatched);
    }

    #[test]
    fn requests_and_replies_allocate_nothing() {
        let mut p = NtpLoad::new(4, RequestMode::Client);
        let mut req = [0u8; 48];
        p.fill_request(1, &mut req);
        let reply = reply_to(&req, |_| {});
        let (_, allocations) = chime_udp::counting_alloc::allocations_in(|| {
            for id in 1..1000 {
                std::hint::black_box(p.fill_request(id, &mut req));
                std::hint::black_box(p.match_reply(&reply, NOW));
            }
        });
        assert_eq!(allocations, 0);
    }

    #[test]
    fn symmetric_active_expects_passive() {
        let mut p = NtpLoad::new(4, RequestMode::SymmetricActive);
        let mut req = [0; 48];
        p.fill_request(5, &mut req);
        let passive = reply_to(&req, |h| h.mode = Mode::SymmetricPassive);
        let server = reply_to(&req, |_| {});
        assert!(matches!(
            p.match_reply(&passive, NOW),
            ReplyMatch::Matched {
                verdict: Verdict::Valid,
                ..
            }
        ));
        assert!(matches!(
            p.match_reply(&server, NOW),
            ReplyMatch::Matched {
                verdict: Verdict::Invalid,
                ..
            }
        ));
    }
}
