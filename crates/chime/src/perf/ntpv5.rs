//! `chime perf ntp --ntp-version 5`: NTPv5 requests as drafted, matched by client cookie.
//!
//! A v5 reply has no origin timestamp: it echoes the request's client cookie instead, so the cookie
//! carries the request's id as the transmit timestamp does in v4 (ids are unguessable across runs,
//! see `inflight`). A reply's cookie gives the id; the worker then checks that the id is one of
//! its requests in flight, which is checking that the cookie is that request's; and the reply is
//! accepted only as `v5::parse_response` accepts it with that cookie and the draft the requests
//! name. Nothing is allocated per request or reply, as for v4.

use chime_ntp::v5::{self, Draft};
use chime_ntp::{Leap, NtpTimestamp};

use super::ntp::{REFUSALS, times};
use super::protocol::{LoadProtocol, ReplyMatch, Verdict};

/// NTPv5 client requests naming one draft.
#[derive(Clone, Debug)]
pub(crate) struct V5Load {
    draft: Draft,
    /// The length of every request: the header and the Draft Identification.
    len: usize,
}

impl V5Load {
    pub(crate) fn new(draft: Draft) -> Self {
        let mut buf = [0u8; 128];
        // The header and a 23-byte draft name: 76 bytes.
        let len = v5::write_request(&mut buf, draft, 0, [0; 8], None)
            .expect("a request without a reference slice fits 128 bytes");
        Self { draft, len }
    }

    /// What a client makes of a reply it has read: a refusal (a kiss code in the server cookie),
    /// or an answer, whose timestamps a synchronised server must set.
    pub(super) fn judge(reply: &v5::Response<'_>) -> Verdict {
        let code = &reply.server_cookie[..4];
        if reply.stratum == 0 && REFUSALS.iter().any(|r| r == code) {
            return Verdict::Refused;
        }
        let unsynchronised = reply.stratum == 0
            || reply.leap == Leap::Unsynchronised
            || reply.flags & v5::flags::SYNCHRONISED == 0;
        if !unsynchronised
            && (reply.receive_ts == NtpTimestamp::ZERO || reply.transmit_ts == NtpTimestamp::ZERO)
        {
            return Verdict::Invalid;
        }
        Verdict::Valid
    }
}

impl LoadProtocol for V5Load {
    const NAME: &'static str = "ntp";

    fn max_request_len(&self) -> usize {
        self.len
    }

    fn max_reply_len(&self) -> usize {
        // As for v4: a reply is as long as its request, but a broken server's may be longer.
        512
    }

    fn fill_request(&mut self, id: u64, buf: &mut [u8]) -> usize {
        // The same request as in `new`, with the id as cookie, into the max_request_len bytes the
        // transport gives.
        v5::write_request(buf, self.draft, 0, id.to_be_bytes(), None)
            .expect("a buffer of max_request_len bytes holds the request")
    }

    fn match_reply(&mut self, reply: &[u8], received_unix_secs: i64) -> ReplyMatch {
        let Some(cookie) = v5::client_cookie(reply) else {
            return ReplyMatch::Unmatched;
        };
        let id = u64::from_be_bytes(cookie);
        let (verdict, server) = match v5::parse_response(reply, cookie, self.draft) {
            Ok(r) => {
                let verdict = Self::judge(&r);
                let server = times(r.receive_ts, r.transmit_ts, verdict, received_unix_secs);
                (verdict, server)
            }
            Err(_) => (Verdict::Invalid, None),
        };
        ReplyMatch::Matched {
            id,
            verdict,
            server,
            signed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use chime_ntp::ServedHeader;
    use chime_ntp::v5::{BloomFilter, kiss_of_death, respond};
    use chime_udp::counting_alloc::allocations_in;

    use super::*;
    use crate::perf::ntp::tests::NOW;

    /// chime-ntp's responder's reply to `request`, from a synchronised stratum-2 server.
    fn answer(request: &[u8]) -> Vec<u8> {
        let mut served = ServedHeader::unsynchronised(-20);
        (served.leap, served.stratum) = (Leap::NoWarning, 2);
        let rx = NtpTimestamp::from_unix(NOW, 1_000);
        let mut reply = vec![0u8; request.len()];
        let r = respond(request, rx, &served, &BloomFilter::new(), 0, &mut reply).unwrap();
        assert_eq!(r.len, request.len());
        reply
    }

    fn verdict(m: ReplyMatch) -> (u64, Verdict) {
        m.id_and_verdict()
    }

    #[test]
    fn a_request_carries_its_id_as_cookie_and_the_reply_finds_it() {
        for draft in Draft::ALL {
            let mut p = V5Load::new(draft);
            let mut buf = [0xAA; 128];
            let n = p.fill_request(0x0123_4567_89AB_CDEF, &mut buf);
            assert_eq!(n, p.max_request_len());
            assert_eq!(n, 76);
            assert_eq!(
                v5::client_cookie(&buf[..n]),
                Some(0x0123_4567_89AB_CDEFu64.to_be_bytes())
            );
            let reply = answer(&buf[..n]);
            let ReplyMatch::Matched {
                id,
                verdict,
                server,
                ..
            } = p.match_reply(&reply, NOW)
            else {
                panic!("unmatched");
            };
            assert_eq!((id, verdict), (0x0123_4567_89AB_CDEF, Verdict::Valid));
            // The responder's transmit timestamp is provisional, its receive one marked.
            let server = server.unwrap();
            assert!(
                (server.receive_ns - server.transmit_ns).abs() < 10,
                "{server:?}"
            );
        }
    }

    #[test]
    fn replies_another_client_would_reject_are_invalid() {
        let mut p = V5Load::new(Draft::D08);
        let mut req = [0u8; 128];
        let n = p.fill_request(77, &mut req);
        let good = answer(&req[..n]);
        assert_eq!(verdict(p.match_reply(&good, NOW)), (77, Verdict::Valid));

        // Another draft named: the reply to a request naming -09.
        let mut other = [0u8; 128];
        let m = V5Load::new(Draft::D09).fill_request(77, &mut other);
        let wrong_draft = answer(&other[..m]);
        assert_eq!(
            verdict(p.match_reply(&wrong_draft, NOW)),
            (77, Verdict::Invalid)
        );
        // Not a server reply (the request itself), or fields that overrun.
        assert_eq!(
            verdict(p.match_reply(&req[..n], NOW)),
            (77, Verdict::Invalid)
        );
        let mut overrun = good.clone();
        overrun[50] = 0xFF;
        overrun[51] = 0xFF;
        assert_eq!(
            verdict(p.match_reply(&overrun, NOW)),
            (77, Verdict::Invalid)
        );
        // A synchronised server's reply without timestamps.
        let mut zero = good.clone();
        zero[32..48].fill(0);
        assert_eq!(verdict(p.match_reply(&zero, NOW)), (77, Verdict::Invalid));
        // Too short to carry a cookie: nothing to match.
        assert_eq!(p.match_reply(&good[..47], NOW), ReplyMatch::Unmatched);
        // A changed cookie names another request, which the worker does not find in flight.
        let mut foreign = good.clone();
        foreign[31] ^= 1;
        assert_eq!(verdict(p.match_reply(&foreign, NOW)).0, 77 ^ 1);
    }

    #[test]
    fn requests_and_replies_allocate_nothing() {
        let mut p = V5Load::new(Draft::D08);
        let mut req = [0u8; 128];
        let n = p.fill_request(1, &mut req);
        let reply = answer(&req[..n]);
        let (_, allocations) = allocations_in(|| {
            for id in 1..1000 {
                std::hint::black_box(p.fill_request(id, &mut req));
                std::hint::black_box(p.match_reply(&reply, NOW));
            }
        });
        assert_eq!(allocations, 0);
    }

    #[test]
    fn a_kiss_is_a_refusal() {
        let mut p = V5Load::new(Draft::D09);
        let mut req = [0u8; 128];
        let n = p.fill_request(5, &mut req);
        let mut kiss = answer(&req[..n]);
        kiss_of_death(&mut kiss, *b"RATE");
        assert_eq!(verdict(p.match_reply(&kiss, NOW)), (5, Verdict::Refused));
        // An unsynchronised server still answers.
        let mut unsync = answer(&req[..n]);
        kiss_of_death(&mut unsync, [0; 4]);
        assert_eq!(verdict(p.match_reply(&unsync, NOW)), (5, Verdict::Valid));
    }
}
