//! Mirroring the upstream chronyd: the client side of the poll that fills [`ServerState`].
//!
//! The control plane owns a [`Mirror`] and a socket connected to the upstream (127.0.0.1:11123 by
//! default). About once a second it sends [`Mirror::request`]'s bytes, feeds whatever comes back to
//! [`Mirror::on_reply`], and publishes [`Mirror::state`] to the workers. The mirror does the
//! checking, the way rsntp and chrony's own client do: the reply must come from the upstream, be a
//! server reply, and echo the random transmit timestamp of the request outstanding, once.

use std::net::SocketAddr;
use std::time::Duration;

use crate::follow::{Follower, Sample, ServedClock};
use crate::leap::{Announced, LeapStep};
use crate::packet::{Header, Leap, Mode};
use crate::state::{ServerState, UNSYNCHRONISED_ROOT};
use crate::time::NtpTimestamp;

/// RFC 5905's MAXDISP: an upstream whose root distance is this large or larger is unsynchronised
/// whatever its leap indicator says.
const MAX_ROOT_DISTANCE_SECONDS: f64 = 16.0;

/// The upstream poll's client state: the request outstanding and the state mirrored so far.
#[derive(Clone, Debug)]
pub struct Mirror {
    upstream: SocketAddr,
    reply_timeout: Duration,
    pending: Option<Pending>,
    state: ServerState,
    follower: Follower,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    nonce: NtpTimestamp,
    sent: NtpTimestamp,
}

impl Mirror {
    /// How long after its request a reply is still accepted, by default: 1 s, rsntp's receive
    /// timeout. A reply that took longer on loopback describes a state older than it claims.
    pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(1);

    /// A mirror of the chronyd at `upstream`, unsynchronised until its first good reply.
    pub fn new(upstream: SocketAddr) -> Self {
        Self {
            upstream,
            reply_timeout: Self::DEFAULT_REPLY_TIMEOUT,
            pending: None,
            state: ServerState::unsynchronised(),
            follower: Follower::new(),
        }
    }

    /// Sets how long after [`Self::request`] a reply is accepted (for poll intervals other than
    /// about a second).
    pub fn set_reply_timeout(&mut self, timeout: Duration) {
        self.reply_timeout = timeout;
    }

    /// The upstream's address.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Makes the next poll's request, sent at local time `now`: NTPv4, mode 3, poll 0 (about 1 s),
    /// every field zero except the transmit timestamp, which is `nonce`.
    ///
    /// A random transmit timestamp, as rsntp and chrony's client send, tells nothing about our
    /// clock and makes a spoofed reply a 64-bit guess; the reply must echo it as its origin.
    /// `nonce` should come from a CSPRNG. A new request replaces any outstanding one, whose reply
    /// will then be rejected.
    pub fn request(&mut self, now: NtpTimestamp, nonce: u64) -> [u8; 48] {
        let nonce = NtpTimestamp(nonce);
        self.pending = Some(Pending { nonce, sent: now });
        let header = Header::request(4, Mode::Client, nonce);
        let mut out = [0; 48];
        header.encode(&mut out);
        out
    }

    /// Sets the local time the outstanding request left at to `sent`, when a better reading than
    /// [`Self::request`]'s came afterwards (the kernel's transmit timestamp): the exchange's T1.
    /// Nothing if no request is outstanding.
    pub fn sent_at(&mut self, sent: NtpTimestamp) {
        if let Some(pending) = &mut self.pending {
            pending.sent = sent;
        }
    }

    /// Takes a datagram that arrived from `from` at local time `now`.
    ///
    /// Checked in this order: the source is the upstream; the datagram holds a header; a request is
    /// outstanding; its origin timestamp is our nonce (a mismatch leaves the request outstanding,
    /// so that a stray or forged datagram cannot cancel the real reply). Then the request is
    /// answered, and any copy of the reply is rejected as a replay. Then: mode 4, version 4, and
    /// arrival within the reply timeout.
    ///
    /// On success the state becomes the reply's leap indicator, stratum (copied, not incremented,
    /// like rsntp), precision, reference ID and timestamp, root delay and dispersion, updated at
    /// `now`; and the exchange's four timestamps (our request's time, the reply's receive and
    /// transmit times, `now`) are a [`Sample`] of the upstream's served time, which the state's
    /// [`clock`](ServerState::clock) follows. An upstream that says it is unsynchronised (leap 3, stratum 0 or 16 and above, or a
    /// root distance of 16 s or more) is recorded as unsynchronised, with chronyd's values for
    /// that, and its precision: that is a success too, since it is the upstream's answer.
    ///
    /// A kiss-o'-death (stratum 0 with a leap indicator other than 3) is also recorded as
    /// unsynchronised, since the upstream refuses to give us time, and is returned as
    /// [`MirrorError::KissOfDeath`] so that the caller can log its code. On every other error the
    /// state is unchanged.
    pub fn on_reply(
        &mut self,
        from: SocketAddr,
        bytes: &[u8],
        now: NtpTimestamp,
    ) -> Result<(), MirrorError> {
        if from != self.upstream {
            return Err(MirrorError::WrongSource {
                from,
                expected: self.upstream,
            });
        }
        let reply = Header::parse(bytes).map_err(|_| MirrorError::TooShort { len: bytes.len() })?;
        let Some(pending) = self.pending else {
            return Err(MirrorError::NotPending {
                origin: reply.origin_ts,
            });
        };
        if reply.origin_ts != pending.nonce {
            return Err(MirrorError::WrongOrigin {
                expected: pending.nonce,
                got: reply.origin_ts,
            });
        }
        self.pending = None;
        if reply.mode != Mode::Server {
            return Err(MirrorError::WrongMode(reply.mode));
        }
        if reply.version != 4 {
            return Err(MirrorError::WrongVersion(reply.version));
        }
        let delay = now.wrapping_diff_seconds(pending.sent).abs();
        if delay > self.reply_timeout.as_secs_f64() {
            return Err(MirrorError::Late {
                delay: Duration::try_from_secs_f64(delay).unwrap_or(Duration::MAX),
                timeout: self.reply_timeout,
            });
        }

        let sample = Sample::from_exchange(pending.sent, reply.receive_ts, reply.transmit_ts, now);
        if reply.stratum == 0 && reply.leap != Leap::Unsynchronised {
            self.state = unsynchronised(reply.precision, now, self.follower.clock());
            return Err(MirrorError::KissOfDeath {
                code: reply.reference_id,
            });
        }
        let root_distance = reply.root_delay.seconds() / 2.0 + reply.root_dispersion.seconds();
        let synchronised = reply.leap != Leap::Unsynchronised
            && matches!(reply.stratum, 1..=15)
            && root_distance < MAX_ROOT_DISTANCE_SECONDS;
        let (clock, mut leap_step) = self.follow(sample);
        let announced = Announced::of(reply.leap, reply.transmit_ts);
        leap_step.note(announced, reply.transmit_ts);
        let leap = match reply.leap {
            Leap::AddSecond | Leap::DelSecond if announced.is_none() => Leap::NoWarning,
            leap => leap,
        };
        self.state = if synchronised {
            ServerState {
                leap,
                stratum: reply.stratum,
                precision: reply.precision,
                reference_id: reply.reference_id,
                reference_ts: reply.reference_ts,
                root_delay: reply.root_delay,
                root_dispersion: reply.root_dispersion,
                updated: Some(now),
                clock,
                announced,
                tai_offset: None,
                leap_step,
            }
        } else {
            ServerState {
                leap_step,
                ..unsynchronised(reply.precision, now, clock)
            }
        };
        Ok(())
    }

    /// Takes the exchange's sample, if any, into the followed clock, and returns it with what is
    /// known of the latest leap's step. A leap second pending at the last poll and stepped by the
    /// served time since (chronyd serving UTC while the kernel's clock runs on) moves the past
    /// with it, so that the rate carries over and the step is not taken for a jump.
    fn follow(&mut self, sample: Option<Sample>) -> (ServedClock, LeapStep) {
        let mut leap_step = self.state.leap_step;
        let Some(sample) = sample else {
            return (self.follower.clock(), leap_step);
        };
        if let Some(pending) = self.state.announced {
            let jump = sample.offset - self.follower.clock().offset_at(sample.at);
            if (jump - pending.step()).abs() < 0.5 {
                self.follower.step(pending.step());
                leap_step.stepped = true;
            }
        }
        (self.follower.add(sample), leap_step)
    }

    /// The local clock stepped by `by` seconds since the last poll, as the poller measures it
    /// against a monotonic clock: the followed clock moves to the new one (see
    /// [`Follower::local_step`]), and a step by the pending leap second is the kernel's clock
    /// taking it with the served time (`leapsecmode system`).
    pub fn local_stepped(&mut self, by: f64) {
        self.follower.local_step(by);
        self.state.clock = self.follower.clock();
        if let Some(updated) = &mut self.state.updated {
            *updated = NtpTimestamp(updated.0.wrapping_add((by * 4_294_967_296.0) as i64 as u64));
        }
        if self
            .state
            .announced
            .is_some_and(|pending| (by - pending.step()).abs() < 0.5)
        {
            self.state.leap_step.stepped = true;
        }
    }

    /// The state mirrored so far, for the workers ([`ServerState::served_at`] ages it).
    pub fn state(&self) -> ServerState {
        self.state
    }
}

/// The state recorded for an upstream that says it is unsynchronised: known (updated at `now`),
/// with chronyd's unsynchronised values, and its served time still followed.
fn unsynchronised(precision: i8, now: NtpTimestamp, clock: ServedClock) -> ServerState {
    ServerState {
        leap: Leap::Unsynchronised,
        stratum: 0,
        precision,
        reference_id: [0; 4],
        reference_ts: NtpTimestamp::ZERO,
        root_delay: UNSYNCHRONISED_ROOT,
        root_dispersion: UNSYNCHRONISED_ROOT,
        updated: Some(now),
        clock,
        announced: None,
        tai_offset: None,
        leap_step: LeapStep::NONE,
    }
}

/// Why an upstream datagram was not taken as the reply to our poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    /// The datagram came from somewhere other than the upstream.
    #[error("NTP reply from {from}, but the upstream is {expected}")]
    WrongSource {
        /// Where it came from.
        from: SocketAddr,
        /// The upstream's address.
        expected: SocketAddr,
    },
    /// Shorter than an NTP header.
    #[error("NTP reply of {len} bytes is shorter than the 48-byte header")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// No request is outstanding: the reply is unsolicited, late after a new request, or a copy of
    /// one already taken.
    #[error("unexpected NTP reply (origin {origin:#018x}): no request outstanding, or a replay")]
    NotPending {
        /// The reply's origin timestamp.
        origin: NtpTimestamp,
    },
    /// The reply's origin timestamp is not our request's transmit timestamp.
    #[error("NTP reply origin {got:#018x} does not match our request's transmit {expected:#018x}")]
    WrongOrigin {
        /// Our request's transmit timestamp.
        expected: NtpTimestamp,
        /// The reply's origin timestamp.
        got: NtpTimestamp,
    },
    /// Not a server-mode (4) reply.
    #[error("NTP reply has mode {0:?}, expected Server (4)")]
    WrongMode(Mode),
    /// Not NTPv4, the version we asked in.
    #[error("NTP reply has version {0}, expected 4")]
    WrongVersion(u8),
    /// The reply came later than the reply timeout after the request.
    #[error("NTP reply arrived {delay:?} after the request, past the {timeout:?} timeout")]
    Late {
        /// How long after the request it came.
        delay: Duration,
        /// The timeout in force.
        timeout: Duration,
    },
    /// The upstream sent a kiss-o'-death; the state is now unsynchronised.
    #[error("upstream sent kiss-o'-death {}", .code.escape_ascii())]
    KissOfDeath {
        /// The kiss code (the reference ID), e.g. `RATE` or `DENY`.
        code: [u8; 4],
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NtpShort;

    const NONCE: u64 = 0x0123_4567_89AB_CDEF;
    const SENT: NtpTimestamp = NtpTimestamp::from_parts(0xEEAC_6C51, 0);

    fn upstream() -> SocketAddr {
        "127.0.0.1:11123".parse().unwrap()
    }

    fn at(millis: u64) -> NtpTimestamp {
        SENT.add_duration(Duration::from_millis(millis))
    }

    fn good_reply() -> Header {
        Header {
            leap: Leap::NoWarning,
            version: 4,
            mode: Mode::Server,
            stratum: 2,
            poll: 0,
            precision: -25,
            root_delay: NtpShort(0x0000_0800),
            root_dispersion: NtpShort(0x0000_0400),
            reference_id: [192, 0, 2, 1],
            reference_ts: NtpTimestamp::from_parts(0xEEAC_6C00, 0x1234_5678),
            origin_ts: NtpTimestamp(NONCE),
            receive_ts: at(1),
            transmit_ts: at(1),
        }
    }

    fn bytes(h: &Header) -> [u8; 48] {
        let mut out = [0; 48];
        h.encode(&mut out);
        out
    }

    fn polled() -> Mirror {
        let mut mirror = Mirror::new(upstream());
        mirror.request(SENT, NONCE);
        mirror
    }

    #[test]
    fn request_is_v4_client_with_the_nonce_as_transmit() {
        let mut mirror = Mirror::new(upstream());
        let request = mirror.request(SENT, NONCE);
        let mut expected = [0; 48];
        expected[0] = 0x23;
        expected[40..].copy_from_slice(&NONCE.to_be_bytes());
        assert_eq!(request, expected);
        assert_eq!(mirror.upstream(), upstream());
    }

    #[test]
    fn starts_unsynchronised() {
        assert_eq!(
            Mirror::new(upstream()).state(),
            ServerState::unsynchronised()
        );
    }

    #[test]
    fn good_reply_updates_the_state() {
        let mut mirror = polled();
        assert_eq!(
            mirror.on_reply(upstream(), &bytes(&good_reply()), at(2)),
            Ok(())
        );
        assert_eq!(
            mirror.state(),
            ServerState {
                leap: Leap::NoWarning,
                stratum: 2,
                precision: -25,
                reference_id: [192, 0, 2, 1],
                reference_ts: NtpTimestamp::from_parts(0xEEAC_6C00, 0x1234_5678),
                root_delay: NtpShort(0x0000_0800),
                root_dispersion: NtpShort(0x0000_0400),
                updated: Some(at(2)),
                clock: mirror.state().clock,
                announced: None,
                tai_offset: None,
                leap_step: LeapStep::NONE,
            }
        );
    }

    #[test]
    fn a_later_reading_of_the_send_time_is_the_exchanges_t1() {
        let mut mirror = Mirror::new(upstream());
        mirror.sent_at(at(5));
        mirror.request(SENT, NONCE);
        // The kernel stamped the request 1 ms after the time given with it.
        mirror.sent_at(at(1));
        let reply = Header {
            receive_ts: at(1),
            transmit_ts: at(1),
            ..good_reply()
        };
        mirror.on_reply(upstream(), &bytes(&reply), at(1)).unwrap();
        let clock = mirror.state().clock;
        assert!(
            clock.offset.abs() < 1e-9 && clock.error.abs() < 1e-9,
            "{clock:?}"
        );
    }

    #[test]
    fn each_exchange_is_a_sample_of_the_upstreams_served_time() {
        // The upstream serves 0.3 s ahead of our clock: it received and answered at 1 ms by ours.
        let ahead = |ms: u64| at(ms).add_duration(Duration::from_millis(300));
        let reply = Header {
            receive_ts: ahead(1),
            transmit_ts: ahead(1),
            ..good_reply()
        };
        let mut mirror = polled();
        mirror.on_reply(upstream(), &bytes(&reply), at(2)).unwrap();
        let clock = mirror.state().clock;
        assert!((clock.offset - 0.3).abs() < 1e-9, "{clock:?}");
        // 2 ms round trip: the offset is known to within 1 ms, measured half way through it.
        assert!((clock.error - 0.001).abs() < 1e-9, "{clock:?}");
        assert_eq!(clock.anchor, at(1));
        // An upstream that says it is unsynchronised is still followed.
        mirror.request(at(1000), NONCE + 1);
        let unsynchronised = Header {
            leap: Leap::Unsynchronised,
            origin_ts: NtpTimestamp(NONCE + 1),
            receive_ts: ahead(1001),
            transmit_ts: ahead(1001),
            ..good_reply()
        };
        mirror
            .on_reply(upstream(), &bytes(&unsynchronised), at(1002))
            .unwrap();
        assert!(!mirror.state().is_synchronised());
        assert_eq!(mirror.state().clock.anchor, at(1001));
        // A reply without times (a kiss) leaves the clock as it was.
        mirror.request(at(2000), NONCE + 2);
        let kiss = Header {
            stratum: 0,
            reference_id: *b"RATE",
            origin_ts: NtpTimestamp(NONCE + 2),
            receive_ts: NtpTimestamp::ZERO,
            transmit_ts: NtpTimestamp::ZERO,
            ..good_reply()
        };
        let before = mirror.state().clock;
        assert!(
            mirror
                .on_reply(upstream(), &bytes(&kiss), at(2002))
                .is_err()
        );
        assert_eq!(mirror.state().clock, before);
    }

    #[test]
    fn leap_warning_and_longer_replies_are_taken() {
        let mut mirror = polled();
        // On the last day of the month (SENT is 2026-11-21T19:15:29Z).
        let last_day = |ms: u64| at(ms).add_duration(Duration::from_secs(9 * 86_400));
        let reply = Header {
            leap: Leap::DelSecond,
            receive_ts: last_day(1),
            transmit_ts: last_day(1),
            ..good_reply()
        };
        let long = [&bytes(&reply)[..], &[0; 20]].concat();
        assert_eq!(mirror.on_reply(upstream(), &long, at(2)), Ok(()));
        assert_eq!(mirror.state().leap, Leap::DelSecond);
        let announced = mirror.state().announced.unwrap();
        assert_eq!(announced.leap, Leap::DelSecond);
        assert_eq!(announced.at.to_unix_near(0).0, 1_796_083_200); // 2026-12-01T00:00:00Z
    }

    /// Polls `mirror` at local `t1` (seconds after SENT) with an upstream serving `offset` seconds
    /// from the local clock and the warning `leap`, over a 1 ms round trip.
    fn poll_at(mirror: &mut Mirror, t1: f64, offset: f64, leap: Leap, nonce: u64) {
        let local = |s: f64| SENT.add_duration(Duration::from_secs_f64(s));
        let served = |s: f64| {
            NtpTimestamp(
                local(s)
                    .0
                    .wrapping_add((offset * 2f64.powi(32)) as i64 as u64),
            )
        };
        mirror.request(local(t1), nonce);
        let reply = Header {
            leap,
            origin_ts: NtpTimestamp(nonce),
            receive_ts: served(t1 + 0.0005),
            transmit_ts: served(t1 + 0.0005),
            ..good_reply()
        };
        mirror
            .on_reply(upstream(), &bytes(&reply), local(t1 + 0.001))
            .unwrap();
    }

    /// Seconds from SENT (2026-11-21T19:15:29Z) to the end of November.
    const TO_MONTH_END: f64 = 1_796_083_200.0 - 1_795_288_529.0;

    #[test]
    fn a_warning_is_passed_on_only_on_the_last_day_of_the_month() {
        let mut mirror = Mirror::new(upstream());
        // Nine days before the month's end: not yet.
        poll_at(&mut mirror, 0.0, 0.0, Leap::AddSecond, 1);
        assert_eq!(mirror.state().leap, Leap::NoWarning);
        assert_eq!(mirror.state().announced, None);
        // On its last day (the upstream's time counts, not ours): announced for its end.
        let offset = TO_MONTH_END - 3600.0;
        poll_at(&mut mirror, 1.0, offset, Leap::AddSecond, 2);
        assert_eq!(mirror.state().leap, Leap::AddSecond);
        let at = mirror.state().announced.unwrap().at;
        assert_eq!(at.to_unix_near(0).0, 1_796_083_200);
        // After it, a warning still sent is a leap done, not one a month on.
        poll_at(&mut mirror, 2.0, TO_MONTH_END + 10.0, Leap::AddSecond, 3);
        assert_eq!(mirror.state().leap, Leap::NoWarning);
        assert_eq!(mirror.state().announced, None);
    }

    #[test]
    fn the_leap_step_of_the_served_time_carries_the_followed_rate_over() {
        // The upstream's served time is 0.1 s before the leap and moving at 20 ppm; after it,
        // it has stepped back the inserted second, as chronyd serving UTC does while the
        // kernel's clock runs on.
        let base = TO_MONTH_END - 0.1 - 5.0;
        let offset = |t: f64| base + 20e-6 * t;
        let mut mirror = Mirror::new(upstream());
        for k in 0..5u64 {
            poll_at(&mut mirror, k as f64, offset(k as f64), Leap::AddSecond, k);
        }
        let before = mirror.state().clock;
        assert!((before.rate - 20e-6).abs() < 1e-7, "{before:?}");
        poll_at(&mut mirror, 5.0, offset(5.0) - 1.0, Leap::AddSecond, 5);
        let after = mirror.state().clock;
        assert!(
            (after.offset_at(after.anchor) - (offset(5.0005) - 1.0)).abs() < 1e-6,
            "{after:?}"
        );
        assert!((after.rate - 20e-6).abs() < 1e-7, "{after:?}");
        assert!(after.error_at(after.anchor) < 1e-3, "{after:?}");
        // The repeated second is still before the leap's end: the warning stands.
        assert_eq!(mirror.state().leap, Leap::AddSecond);

        // The kernel's clock stepping back with the served time (leapsecmode system): the
        // offset does not move, nothing is followed as a jump.
        let mut system = Mirror::new(upstream());
        let steady = TO_MONTH_END - 4.5;
        for (k, local) in [0.0, 1.0, 2.0, 3.0, 4.0, 3.502].into_iter().enumerate() {
            poll_at(&mut system, local, steady, Leap::AddSecond, 100 + k as u64);
        }
        let state = system.state();
        assert!((state.clock.offset - steady).abs() < 1e-6, "{state:?}");
        assert!(state.clock.error_at(state.clock.anchor) < 1e-3, "{state:?}");
        // In the repeated second: still before the leap's end.
        assert_eq!(state.leap, Leap::AddSecond);
        assert!(state.announced.is_some());
        poll_at(&mut system, 4.502, steady, Leap::AddSecond, 200);
        assert_eq!(system.state().leap, Leap::NoWarning);
        assert_eq!(system.state().announced, None);

        // The poller tells the mirror of the kernel's step (its clock against a monotonic one):
        // the followed clock moves with it, and the leap's step is known taken.
        let mut told = Mirror::new(upstream());
        for (k, local) in [0.0, 1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
            poll_at(&mut told, local, steady, Leap::AddSecond, 300 + k as u64);
        }
        assert!(!told.state().leap_step.stepped);
        let anchor = told.state().clock.anchor;
        told.local_stepped(-1.0);
        let state = told.state();
        assert!(state.leap_step.stepped);
        assert_eq!(state.clock.anchor.wrapping_diff_seconds(anchor), -1.0);
        poll_at(&mut told, 3.502, steady, Leap::AddSecond, 400);
        let state = told.state();
        assert!(state.leap_step.stepped, "{state:?}");
        assert!(state.clock.error_at(state.clock.anchor) < 1e-3, "{state:?}");
        // The smear's leap is kept a day after it, then forgotten.
        poll_at(&mut told, 4.502, steady, Leap::NoWarning, 401);
        assert_eq!(
            told.state().leap_step.leap.map(|l| l.leap),
            Some(Leap::AddSecond)
        );
        poll_at(&mut told, 5.0, steady + 43_210.0, Leap::NoWarning, 402);
        assert_eq!(told.state().leap_step, LeapStep::NONE);

        // Without a leap pending, the same step is a jump: its rate is not followed at once.
        let mut jumped = Mirror::new(upstream());
        for k in 0..5u64 {
            poll_at(&mut jumped, k as f64, offset(k as f64), Leap::NoWarning, k);
        }
        poll_at(&mut jumped, 5.0, offset(5.0) - 1.0, Leap::NoWarning, 5);
        let clock = jumped.state().clock;
        assert!(clock.error_rate > 0.5, "{clock:?}");
    }

    #[test]
    fn wrong_source_is_rejected_and_the_request_stays_outstanding() {
        let mut mirror = polled();
        let other: SocketAddr = "127.0.0.1:11124".parse().unwrap();
        assert_eq!(
            mirror.on_reply(other, &bytes(&good_reply()), at(2)),
            Err(MirrorError::WrongSource {
                from: other,
                expected: upstream()
            })
        );
        let v6: SocketAddr = "[::1]:11123".parse().unwrap();
        assert!(matches!(
            mirror.on_reply(v6, &bytes(&good_reply()), at(2)),
            Err(MirrorError::WrongSource { .. })
        ));
        assert_eq!(mirror.state(), ServerState::unsynchronised());
        assert_eq!(
            mirror.on_reply(upstream(), &bytes(&good_reply()), at(3)),
            Ok(())
        );
    }

    #[test]
    fn wrong_origin_is_rejected_and_the_request_stays_outstanding() {
        let mut mirror = polled();
        let forged = Header {
            origin_ts: NtpTimestamp(NONCE ^ 1),
            ..good_reply()
        };
        assert_eq!(
            mirror.on_reply(upstream(), &bytes(&forged), at(2)),
            Err(MirrorError::WrongOrigin {
                expected: NtpTimestamp(NONCE),
                got: NtpTimestamp(NONCE ^ 1)
            })
        );
        assert_eq!(mirror.state(), ServerState::unsynchronised());
        assert_eq!(
            mirror.on_reply(upstream(), &bytes(&good_reply()), at(3)),
            Ok(())
        );
    }

    #[test]
    fn replayed_reply_is_rejected() {
        let mut mirror = polled();
        let reply = bytes(&good_reply());
        assert_eq!(mirror.on_reply(upstream(), &reply, at(2)), Ok(()));
        let taken = mirror.state();
        assert_eq!(
            mirror.on_reply(upstream(), &reply, at(500)),
            Err(MirrorError::NotPending {
                origin: NtpTimestamp(NONCE)
            })
        );
        // After the next request, the old reply's origin no longer matches.
        mirror.request(at(1000), NONCE + 1);
        assert!(matches!(
            mirror.on_reply(upstream(), &reply, at(1001)),
            Err(MirrorError::WrongOrigin { .. })
        ));
        assert_eq!(mirror.state(), taken);
    }

    #[test]
    fn unsolicited_reply_is_rejected() {
        let mut mirror = Mirror::new(upstream());
        assert!(matches!(
            mirror.on_reply(upstream(), &bytes(&good_reply()), at(2)),
            Err(MirrorError::NotPending { .. })
        ));
    }

    #[test]
    fn short_reply_is_rejected() {
        let mut mirror = polled();
        let reply = bytes(&good_reply());
        assert_eq!(
            mirror.on_reply(upstream(), &reply[..47], at(2)),
            Err(MirrorError::TooShort { len: 47 })
        );
        assert_eq!(mirror.on_reply(upstream(), &reply, at(3)), Ok(()));
    }

    #[test]
    fn wrong_mode_or_version_is_rejected_and_uses_up_the_request() {
        for (reply, error) in [
            (
                Header {
                    mode: Mode::Client,
                    ..good_reply()
                },
                MirrorError::WrongMode(Mode::Client),
            ),
            (
                Header {
                    mode: Mode::SymmetricPassive,
                    ..good_reply()
                },
                MirrorError::WrongMode(Mode::SymmetricPassive),
            ),
            (
                Header {
                    version: 3,
                    ..good_reply()
                },
                MirrorError::WrongVersion(3),
            ),
        ] {
            let mut mirror = polled();
            assert_eq!(
                mirror.on_reply(upstream(), &bytes(&reply), at(2)),
                Err(error)
            );
            assert_eq!(mirror.state(), ServerState::unsynchronised());
            assert!(matches!(
                mirror.on_reply(upstream(), &bytes(&good_reply()), at(3)),
                Err(MirrorError::NotPending { .. })
            ));
        }
    }

    #[test]
    fn late_reply_is_rejected() {
        let mut mirror = polled();
        assert_eq!(
            mirror.on_reply(upstream(), &bytes(&good_reply()), at(1500)),
            Err(MirrorError::Late {
                delay: Duration::from_millis(1500),
                timeout: Duration::from_secs(1)
            })
        );
        let mut patient = Mirror::new(upstream());
        patient.set_reply_timeout(Duration::from_secs(2));
        patient.request(SENT, NONCE);
        assert_eq!(
            patient.on_reply(upstream(), &bytes(&good_reply()), at(1500)),
            Ok(())
        );
    }

    #[test]
    fn unsynchronised_upstream_is_recorded_as_such() {
        let expected = ServerState {
            leap: Leap::Unsynchronised,
            stratum: 0,
            precision: -25,
            reference_id: [0; 4],
            reference_ts: NtpTimestamp::ZERO,
            root_delay: NtpShort(0x0001_0000),
            root_dispersion: NtpShort(0x0001_0000),
            updated: Some(at(2)),
            clock: ServedClock::LOCAL,
            announced: None,
            tai_offset: None,
            leap_step: LeapStep::NONE,
        };
        for reply in [
            // chronyd's unsynchronised reply.
            Header {
                leap: Leap::Unsynchronised,
                stratum: 0,
                reference_id: [0; 4],
                reference_ts: NtpTimestamp::ZERO,
                root_delay: NtpShort(0x0001_0000),
                root_dispersion: NtpShort(0x0001_0000),
                ..good_reply()
            },
            Header {
                leap: Leap::Unsynchronised,
                ..good_reply()
            },
            Header {
                stratum: 16,
                ..good_reply()
            },
            Header {
                root_dispersion: NtpShort(16 << 16),
                ..good_reply()
            },
        ] {
            let mut mirror = polled();
            // Synchronised first, so that the change is visible.
            mirror
                .on_reply(upstream(), &bytes(&good_reply()), at(1))
                .unwrap();
            mirror.request(SENT, NONCE);
            assert_eq!(mirror.on_reply(upstream(), &bytes(&reply), at(2)), Ok(()));
            let state = ServerState {
                clock: ServedClock::LOCAL,
                ..mirror.state()
            };
            assert_eq!(state, expected);
        }
    }

    #[test]
    fn kiss_of_death_is_reported_and_recorded_unsynchronised() {
        let mut mirror = polled();
        mirror
            .on_reply(upstream(), &bytes(&good_reply()), at(1))
            .unwrap();
        mirror.request(SENT, NONCE);
        let kiss = Header {
            stratum: 0,
            reference_id: *b"RATE",
            ..good_reply()
        };
        let error = mirror
            .on_reply(upstream(), &bytes(&kiss), at(2))
            .unwrap_err();
        assert_eq!(error, MirrorError::KissOfDeath { code: *b"RATE" });
        assert_eq!(error.to_string(), "upstream sent kiss-o'-death RATE");
        assert!(!mirror.state().is_synchronised());
        assert_eq!(mirror.state().updated, Some(at(2)));
    }

    #[test]
    fn errors_name_the_offending_values() {
        let error = MirrorError::WrongOrigin {
            expected: NtpTimestamp(NONCE),
            got: NtpTimestamp(7),
        };
        assert_eq!(
            error.to_string(),
            "NTP reply origin 0x0000000000000007 does not match our request's transmit \
             0x0123456789abcdef"
        );
    }
}
