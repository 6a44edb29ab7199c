//! The upstream poller, on the control plane: asks the local chronyd for its state about once per
//! poll interval, feeds the replies to the sans-IO [`Mirror`], and publishes the resulting
//! [`ServerState`] for the workers to read once per batch.
//!
//! The poller never decides what clients are told when chronyd goes quiet: it only stops
//! refreshing `updated`, and the workers' [`ServerState::served_at`] turns the state unsynchronised
//! once it is older than the stale time. So a wedged control plane cannot leave the workers
//! serving a confident old state either.

use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use chime_ntp::v5::{BloomFilter, Draft, FilterFetch};
use chime_ntp::{Leap, Mirror, NtpTimestamp, ServerState};
use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, SockaddrStorage, TimestampingFlag, recvmsg, setsockopt, sockopt,
};
use nix::sys::time::TimeSpec;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::time::{self, Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::clock;
use crate::clock::published::Published;
use crate::observe::metrics::single;
use crate::service::ServiceError;

/// How the upstream looked at the last poll, to log changes once rather than every poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Unknown,
    Synchronised,
    Unsynchronised,
    Unreachable,
}

/// Polls until stopped; returns only through a fail point (tests).
pub(crate) async fn run(
    upstream: SocketAddr,
    interval: Duration,
    (published, stats_interval): (Arc<Published>, Option<Duration>),
) -> Result<(), ServiceError> {
    let mut mirror = Mirror::new(upstream);
    // With v5 on, the upstream's reference-ID filter, a quarter a poll, if it speaks v5.
    let mut fetch = published.filter().map(|_| Filters {
        fetch: FilterFetch::new(Draft::D08),
        gathered: None,
        last: None,
    });
    let mut socket: Option<UdpSocket> = None;
    let mut health = Health::Unknown;
    let mut offset_log = OffsetLog::default();
    let mut stats_at = Instant::now();
    let mut ticks = time::interval(interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut steps = ClockSteps::default();
    loop {
        ticks.tick().await;
        fail::fail_point!("upstream", |_| Err(crate::service::fail_point_error(
            "upstream"
        )));
        let realtime_minus_monotonic = steps.note(&mut mirror, &published);
        // A poll waits at most one interval (and never more than a second, like rsntp) so that a
        // slow upstream cannot stretch the schedule.
        let deadline = Instant::now() + interval.min(Duration::from_secs(1));
        let result = poll_once(&mut mirror, &mut socket, upstream, deadline, &mut fetch).await;
        if let (Some(f), Some(v5)) = (&mut fetch, published.filter())
            && let Some(filter) = f.gathered.take()
            && f.last != Some(filter)
        {
            // Served first, then said: whoever reads the line finds it in force.
            v5.with_upstream(&filter);
            let bits = filter.bits().count();
            info!(
                "upstream {upstream} speaks NTPv5: its reference-ID filter ({bits} bits set) is \
                 served with chimed's own"
            );
            f.last = Some(filter);
        }
        let state = mirror.state();
        let now_health = match &result {
            Ok(()) if is_synchronised(&state) => Health::Synchronised,
            Ok(()) => Health::Unsynchronised,
            Err(_) => Health::Unreachable,
        };
        if let Ok(()) = result {
            let mut state = ServerState {
                tai_offset: clock::tai_offset(),
                ..state
            };
            state.leap_step.realtime_minus_monotonic = realtime_minus_monotonic;
            published.publish(state);
            offset_log.note(upstream, &state);
            if let Some(wait) = until_leap(&state, interval) {
                ticks.reset_after(wait);
            }
        }
        if let Some(every) = stats_interval
            && stats_at.elapsed() >= every
        {
            stats_line(&state, &published);
            stats_at = Instant::now();
        }
        if now_health != health {
            report(
                upstream,
                now_health,
                &state,
                result.as_ref().err(),
                &published,
            );
            health = now_health;
        }
    }
}

/// Steps of the system clock between polls, seen against the monotonic clock: the kernel's at a
/// leap second (`leapsecmode system`), or chronyd's `makestep`.
#[derive(Default)]
struct ClockSteps {
    last: Option<f64>,
}

impl ClockSteps {
    /// A step is more than this: the two clocks otherwise drift apart by the frequency
    /// corrections only, microseconds a second.
    const STEP: f64 = 1e-3;

    /// The system clock less the monotonic clock now; a step since the last poll is told to the
    /// mirror, whose followed clock moves with it.
    fn note(&mut self, mirror: &mut Mirror, published: &Published) -> f64 {
        let now = published.realtime_minus_monotonic(clock::read());
        if let Some(last) = self.last
            && (now - last).abs() > Self::STEP
        {
            info!("the system clock stepped by {:+.6} s", now - last);
            mirror.local_stepped(now - last);
        }
        self.last = Some(now);
        now
    }
}

/// With a leap second pending, how long until just after it starts, if that comes before the
/// next poll: a poll then shortens the time in which replies carry the leap's extra second of
/// dispersion (see [`ServerState::served_at`]) to about a round trip.
fn until_leap(state: &ServerState, interval: Duration) -> Option<Duration> {
    let announced = state.announced?;
    let served = state.clock.serve(clock::now());
    let to_start = announced.uncertain_from().wrapping_diff_seconds(served) + LEAP_POLL_DELAY;
    (0.0..interval.as_secs_f64())
        .contains(&to_start)
        .then(|| Duration::from_secs_f64(to_start))
}

/// How long after a leap second's start the poll after it is sent: 2 ms, past the step of the
/// clock by the kernel or of chronyd's served time, which come at the second's edge.
const LEAP_POLL_DELAY: f64 = 0.002;

/// Says when chronyd's served time is away from the system clock (chimed serves chronyd's): the
/// first time the offset followed is over a millisecond, and then each time it has moved by a
/// millisecond more, at most once a minute, so that a ramp or a slew is seen without a line a
/// poll.
#[derive(Default)]
struct OffsetLog {
    logged: Option<(f64, Instant)>,
}

impl OffsetLog {
    const MOVED: f64 = 1e-3;
    const EVERY: Duration = Duration::from_secs(60);

    fn note(&mut self, upstream: SocketAddr, state: &ServerState) {
        let clock = &state.clock;
        let offset = clock.offset;
        let due = match self.logged {
            None => offset.abs() > Self::MOVED,
            Some((last, when)) => {
                (offset - last).abs() > Self::MOVED && when.elapsed() >= Self::EVERY
            }
        };
        if due {
            info!(
                "upstream {upstream} serves {offset:+.6} s from the system clock (within \
                 {:.6} s, moving {:+.1} ppm); chimed serves its time",
                clock.error,
                clock.rate * 1e6
            );
            self.logged = Some((offset, Instant::now()));
        }
    }
}

/// The upstream's line every `--stats-interval`: what replies sent now say of the clock, and the
/// time they carry against the system clock (the offset followed, its error bound, its rate).
fn stats_line(state: &ServerState, published: &Published) {
    let reading = clock::read();
    let now = reading.ntp();
    let served = published.served_at(state, now);
    let smear = smear_offset(state, reading, published)
        .map_or(String::new(), |s| format!(" smear={s:+.6}"));
    let leap = match served.leap {
        Leap::NoWarning => "none",
        Leap::AddSecond => "insert",
        Leap::DelSecond => "delete",
        Leap::Unsynchronised => "unsynchronised",
    };
    let leap_in = state.announced.map_or(String::new(), |a| {
        let to = a.at.wrapping_diff_seconds(state.clock.serve(now));
        format!(" leap_in={to:.3}")
    });
    let tai = state
        .tai_offset_at(now)
        .map_or(String::new(), |tai| format!(" tai_offset={tai}"));
    info!(
        "upstream stats: stratum={} leap={leap}{leap_in}{smear} root_distance={:.6} \
         offset={:+.6} offset_error={:.6} offset_rate_ppm={:+.3}{tai}",
        served.stratum,
        served.root_distance(),
        state.clock.offset_at(now),
        state.clock.error_at(now),
        state.clock.rate * 1e6
    );
}

/// The upstream's reference-ID filter over NTPv5: the fetch, a filter it has just gathered, and
/// the one served now.
struct Filters {
    fetch: FilterFetch,
    gathered: Option<BloomFilter>,
    last: Option<BloomFilter>,
}

/// Why a poll got no state from the upstream; logged once when it starts failing.
#[derive(Debug, thiserror::Error)]
enum PollError {
    #[error("cannot open socket: {0}")]
    Socket(io::Error),
    #[error("send failed: {0}")]
    Send(io::Error),
    #[error("no reply")]
    NoReply,
    #[error("connection refused")]
    Refused,
    #[error("receive failed: {0}")]
    Receive(io::Error),
}

/// One poll: the v4 request whose reply the mirror takes and, with v5 on, first a v5 request for
/// a quarter of the upstream's reference-ID filter (an upstream that does not speak v5 drops it;
/// it is asked again only now and then). A v5 reply that comes in before the v4 one is taken
/// too; one that comes later is left for the next poll, which ignores it.
async fn poll_once(
    mirror: &mut Mirror,
    socket: &mut Option<UdpSocket>,
    upstream: SocketAddr,
    deadline: Instant,
    filters: &mut Option<Filters>,
) -> Result<(), PollError> {
    if socket.is_none() {
        let local: SocketAddr = match upstream {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let s = UdpSocket::bind(local).await.map_err(PollError::Socket)?;
        // The kernel's times of the request's send and the reply's arrival are the exchange's
        // T1 and T4, as chronyd's own client takes them; without them, clock reads around the
        // calls, early or late by the syscall and the scheduler, which biases the offset.
        let stamps = TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE
            | TimestampingFlag::SOF_TIMESTAMPING_RX_SOFTWARE
            | TimestampingFlag::SOF_TIMESTAMPING_TX_SOFTWARE
            | TimestampingFlag::SOF_TIMESTAMPING_OPT_TSONLY;
        if let Err(e) = setsockopt(&s, sockopt::Timestamping, &stamps) {
            debug!("upstream poll socket without kernel transmit timestamps: {e}");
            if let Err(e) = setsockopt(&s, sockopt::ReceiveTimestampns, &true) {
                debug!("upstream poll socket without kernel receive timestamps: {e}");
            }
        }
        *socket = Some(s);
    }
    let Some(sock) = socket.as_ref() else {
        unreachable!("opened above")
    };
    let mut v5_request = [0u8; 256];
    let v5_len = filters
        .as_mut()
        .and_then(|f| f.fetch.request(&mut v5_request, rand::random()));
    if let Some(len) = v5_len {
        // Best effort: the v4 poll below reports a broken socket.
        let _ = sock.send_to(&v5_request[..len], upstream).await;
    }
    // The request's time is the exchange's T1: read last, just before a send that goes straight
    // to the kernel (a UDP socket is all but always writable), so that it is not early by the
    // nonce's drawing or the runtime's turn; if it is not writable, the wait is the runtime's.
    let nonce = rand::random();
    // The v5 request's transmit time, if any, is not this exchange's.
    let _ = sent_stamp(sock);
    let request = mirror.request(clock::now(), nonce);
    let sent = match sock.try_send_to(&request, upstream) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => sock.send_to(&request, upstream).await,
        sent => sent,
    };
    if let Err(e) = sent {
        // Start afresh next time: the socket may be what is broken.
        *socket = None;
        return Err(PollError::Send(e));
    }
    // On loopback the kernel stamps the datagram as it sends it, before the call returns.
    if let Some(stamped) = sent_stamp(sock) {
        mirror.sent_at(stamped);
    }
    let mut buf = [0u8; 1024];
    loop {
        let received = time::timeout_at(deadline, recv_stamped(sock, &mut buf)).await;
        let (len, from, arrived) = match received {
            Err(_) => return Err(PollError::NoReply),
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(PollError::Refused);
            }
            Ok(Err(e)) => {
                *socket = None;
                return Err(PollError::Receive(e));
            }
            Ok(Ok(got)) => got,
        };
        if let Some(f) = filters.as_mut()
            && from == upstream
            && chime_ntp::v5::is_v5(&buf[..len])
        {
            if let Some(filter) = f.fetch.on_reply(&buf[..len]) {
                f.gathered = Some(filter);
            }
            continue;
        }
        // Anything that is not the answer to this poll (a stray or late datagram) is skipped and
        // the wait goes on until the deadline.
        match mirror.on_reply(from, &buf[..len], arrived) {
            Ok(()) => return Ok(()),
            Err(e) => debug!("ignored upstream datagram from {from}: {e}"),
        }
    }
}

/// The kernel's transmit timestamp of the datagram sent last, from the socket's error queue
/// (`SO_TIMESTAMPING`'s software transmit timestamp), if one is there; the queue is emptied.
fn sent_stamp(sock: &UdpSocket) -> Option<NtpTimestamp> {
    let mut last = None;
    let mut space = [0u8; 256];
    loop {
        let mut iov = [IoSliceMut::new(&mut [])];
        let flags = MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT;
        let Ok(msg) =
            recvmsg::<SockaddrStorage>(sock.as_raw_fd(), &mut iov, Some(&mut space), flags)
        else {
            return last;
        };
        let stamp = msg.cmsgs().ok()?.find_map(|c| match c {
            ControlMessageOwned::ScmTimestampsns(ts) => Some(ntp_time(&ts.system)),
            _ => None,
        });
        last = stamp.or(last);
    }
}

fn ntp_time(ts: &TimeSpec) -> NtpTimestamp {
    NtpTimestamp::from_unix(ts.tv_sec(), ts.tv_nsec() as u32)
}

/// Receives one datagram, with when it arrived: the kernel's receive timestamp, or the clock read
/// now if the kernel gave none.
async fn recv_stamped(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, NtpTimestamp)> {
    // Room for SO_TIMESTAMPING's three times (or SO_TIMESTAMPNS's one) and more.
    let mut space = [0u8; 256];
    sock.async_io(Interest::READABLE, || {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = recvmsg::<SockaddrStorage>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT,
        )?;
        let stamp = msg.cmsgs()?.find_map(|c| match c {
            ControlMessageOwned::ScmTimestampsns(ts) => Some(ntp_time(&ts.system)),
            ControlMessageOwned::ScmTimestampns(ts) => Some(ntp_time(&ts)),
            _ => None,
        });
        let from = msg
            .address
            .and_then(|a| match (a.as_sockaddr_in(), a.as_sockaddr_in6()) {
                (Some(v4), _) => Some(SocketAddr::from(SocketAddrV4::from(*v4))),
                (_, Some(v6)) => Some(SocketAddr::from(SocketAddrV6::from(*v6))),
                _ => None,
            })
            .ok_or_else(|| io::Error::other("datagram without a source address"))?;
        Ok((msg.bytes, from, stamp.unwrap_or_else(clock::now)))
    })
    .await
}

fn is_synchronised(state: &ServerState) -> bool {
    state.leap != Leap::Unsynchronised && state.stratum != 0
}

fn report(
    upstream: SocketAddr,
    health: Health,
    state: &ServerState,
    error: Option<&PollError>,
    published: &Published,
) {
    let stale = published.policy().stale_after.as_secs_f64();
    match health {
        Health::Synchronised => info!(
            "upstream {upstream} synchronised: stratum {} refid {} root delay {:.6} s root \
             dispersion {:.6} s; serves {:+.6} s from the system clock",
            state.stratum,
            refid(state),
            state.root_delay.seconds(),
            state.root_dispersion.seconds(),
            state.clock.offset
        ),
        Health::Unsynchronised => {
            warn!("upstream {upstream} reports itself unsynchronised; clients are told so")
        }
        Health::Unreachable => warn!(
            "upstream {upstream} not answering ({}); clients are told the server is unsynchronised \
             if it stays so for {stale} s",
            error.map_or_else(|| "?".to_owned(), PollError::to_string)
        ),
        Health::Unknown => {}
    }
}

/// A reference ID as chrony prints it: text for stratum 1 (a reference clock's name) when it is
/// printable, else the IPv4 address (or IPv6 hash) of the upstream's own source; chronyd's local
/// reference (127.127.1.1) is not text.
pub(crate) fn refid(state: &ServerState) -> String {
    let id = state.reference_id;
    let text: String = id
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| char::from(*b))
        .collect();
    if state.stratum <= 1 && !text.is_empty() && text.chars().all(|c| c.is_ascii_graphic()) {
        text
    } else {
        format!("{}.{}.{}.{}", id[0], id[1], id[2], id[3])
    }
}

/// The upstream as `chime status` shows it (chronyc's `tracking`): the state as last mirrored,
/// what a reply sent now says, the offset followed, and the leap second if one is pending. Replies
/// that say unsynchronised are a problem: clients are not being served time.
pub(crate) fn status(
    published: &Published,
    upstream: SocketAddr,
    health: &mut crate::control::Health,
) -> serde_json::Value {
    let reading = clock::read();
    let now = reading.ntp();
    let state = published.load();
    let served = published.served_at(&state, now);
    if !served.is_synchronised() {
        health.problems.push(match state.updated {
            None => {
                format!("upstream {upstream}: no good reply yet; clients are told unsynchronised")
            }
            Some(_) if state.is_synchronised() => format!(
                "upstream {upstream}: no good reply for over {} s; clients are told unsynchronised",
                published.policy().stale_after.as_secs()
            ),
            Some(_) => format!("upstream {upstream} is unsynchronised, and clients are told so"),
        });
    }
    let age = |t: Option<NtpTimestamp>| t.map(|t| now.wrapping_diff_seconds(t));
    serde_json::json!({
        "address": upstream.to_string(),
        "synchronised": state.is_synchronised(),
        "stratum": state.stratum,
        "reference_id": refid(&state),
        "reference_age_seconds": age((state.updated.is_some()).then_some(state.reference_ts)),
        "last_reply_age_seconds": age(state.updated),
        "root_delay_seconds": state.root_delay.seconds(),
        "root_dispersion_seconds": state.root_dispersion.seconds(),
        "served": {
            "synchronised": served.is_synchronised(),
            "stratum": served.stratum,
            "leap": leap_number(served.leap),
            "root_distance_seconds": served.root_distance(),
        },
        "offset_seconds": state.clock.offset_at(now),
        "offset_error_seconds": state.clock.error_at(now),
        "offset_rate": state.clock.rate,
        "leap_pending_seconds": state.announced
            .map(|a| a.at.wrapping_diff_seconds(state.clock.serve(now))),
        "leap_smear_offset_seconds": smear_offset(&state, reading, published),
        "tai_offset_seconds": state.tai_offset_at(now),
    })
}

/// Writes the upstream's metrics: the mirrored state as last polled, and what a reply sent now
/// says about the clock. Read afresh at each scrape.
pub(crate) fn encode(enc: &mut DescriptorEncoder, published: &Published) -> std::fmt::Result {
    let reading = clock::read();
    let now = reading.ntp();
    let state = published.load();
    let served = published.served_at(&state, now);
    let flags: [(&str, &str, i64); 5] = [
        (
            "chimed_upstream_synchronised",
            "1 if the upstream's last good reply said it was synchronised.",
            i64::from(state.is_synchronised()),
        ),
        (
            "chimed_upstream_stratum",
            "The upstream's stratum as last mirrored (0: unsynchronised).",
            i64::from(state.stratum),
        ),
        (
            "chimed_upstream_leap",
            "The upstream's leap indicator as last mirrored (3: unsynchronised).",
            i64::from(leap_number(state.leap)),
        ),
        (
            "chimed_served_leap",
            "The leap indicator replies sent now carry: the upstream's, on the last day of the \
             month only, and none once its leap second has begun (3: unsynchronised).",
            i64::from(leap_number(served.leap)),
        ),
        (
            "chimed_served_synchronised",
            "1 if replies sent now say synchronised: the upstream is, and its last good reply is \
             younger than --stale-after.",
            i64::from(served.is_synchronised()),
        ),
    ];
    for (name, help, value) in flags {
        single(enc, name, help, ConstGauge::new(value))?;
    }
    single(
        enc,
        "chimed_served_root_distance_seconds",
        "Root delay / 2 + root dispersion that replies sent now carry, the dispersion grown since \
         the last good poll.",
        ConstGauge::new(served.root_distance()),
    )?;
    let gauges: [(&str, &str, f64); 3] = [
        (
            "chimed_served_offset_seconds",
            "How far the time replies sent now carry is from the system clock: the upstream's \
             served time minus the system clock, as followed from poll to poll.",
            state.clock.offset_at(now),
        ),
        (
            "chimed_served_offset_error_seconds",
            "The bound on the error of chimed_served_offset_seconds now (included in the root \
             dispersion served).",
            state.clock.error_at(now),
        ),
        (
            "chimed_served_offset_rate",
            "How fast the served offset moves between polls, seconds per second (a slew or \
             smoothtime ramp being followed).",
            state.clock.rate,
        ),
    ];
    for (name, help, value) in gauges {
        single(enc, name, help, ConstGauge::new(value))?;
    }
    encode_leap(enc, &state, reading, published)?;
    if let Some(updated) = state.updated {
        single(
            enc,
            "chimed_upstream_last_reply_age_seconds",
            "Seconds since the upstream's last good reply.",
            ConstGauge::new(now.wrapping_diff_seconds(updated)),
        )?;
    }
    Ok(())
}

/// The leap second's metrics, each present only while it means something: the time to a pending
/// leap, the smear under way, the kernel's TAI offset.
fn encode_leap(
    enc: &mut DescriptorEncoder,
    state: &ServerState,
    reading: clock::Reading,
    published: &Published,
) -> std::fmt::Result {
    let now = reading.ntp();
    if let Some(announced) = state.announced {
        single(
            enc,
            "chimed_leap_pending_seconds",
            "Seconds of served time until the leap second the upstream announces is over (the \
             end of the month), while it is pending; absent otherwise.",
            ConstGauge::new(announced.at.wrapping_diff_seconds(state.clock.serve(now))),
        )?;
    }
    if let Some(smeared) = smear_offset(state, reading, published) {
        single(
            enc,
            "chimed_leap_smear_offset_seconds",
            "With --leap-smear, from noon before a leap second to noon after: the time served \
             less UTC (0 to -1 s for an inserted second, 0 to +1 s for a deleted one); absent \
             otherwise.",
            ConstGauge::new(smeared),
        )?;
    }
    if let Some(tai) = state.tai_offset_at(now) {
        single(
            enc,
            "chimed_tai_offset_seconds",
            "TAI - UTC, the kernel's (chronyd sets it with leapsectz), as NTPv5 replies in TAI \
             use it; absent while unknown and around a leap second.",
            ConstGauge::new(i64::from(tai)),
        )?;
    }
    Ok(())
}

/// With `--leap-smear` and a smear under way at local time `now`: the time served less UTC.
fn smear_offset(state: &ServerState, now: clock::Reading, published: &Published) -> Option<f64> {
    let (smear, stepped) = published.smear_at(state, now)?;
    let utc = state.clock.serve(now.ntp());
    Some(smear.serve(utc, stepped).wrapping_diff_seconds(utc))
}

fn leap_number(leap: Leap) -> u8 {
    match leap {
        Leap::NoWarning => 0,
        Leap::AddSecond => 1,
        Leap::DelSecond => 2,
        Leap::Unsynchronised => 3,
    }
}

/// The poller against an upstream in the same process, on a loopback socket: the mirror's state
/// reaches the workers' snapshot, and an upstream that says it is unsynchronised is served so.
#[cfg(test)]
mod tests {
    use chime_ntp::StalePolicy;

    use super::*;
    use crate::clock::published::testing::{self, published};

    /// An upstream that answers every request with `state`, as chronyd would, until dropped.
    async fn upstream(state: ServerState) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let mut reply = [0u8; 48];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let served = state.served_at(clock::now(), &StalePolicy::default());
                let len =
                    chime_ntp::respond(&buf[..n], from.port(), clock::now(), &served, &mut reply)
                        .unwrap();
                chime_ntp::stamp_transmit(&mut reply[..len], clock::now());
                socket.send_to(&reply[..len], from).await.unwrap();
            }
        });
        (addr, task)
    }

    /// Polls `state`'s upstream every 10 ms until the snapshot holds a reply, for at most 2 s.
    fn mirrored(state: ServerState) -> ServerState {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (addr, server) = upstream(state).await;
            let ntp = published(ServerState::unsynchronised());
            let shared = (ntp.clone(), None);
            let poller = tokio::spawn(run(addr, Duration::from_millis(10), shared));
            let deadline = Instant::now() + Duration::from_secs(2);
            while ntp.load().updated.is_none() && Instant::now() < deadline {
                time::sleep(Duration::from_millis(5)).await;
            }
            poller.abort();
            server.abort();
            **ntp.load()
        })
    }

    #[test]
    fn a_synchronised_upstream_reaches_the_workers() {
        let state = mirrored(testing::synchronised());
        assert_eq!((state.leap, state.stratum), (Leap::NoWarning, 3));
        assert_eq!(state.reference_id, *b"LOCL");
        assert!(state.updated.is_some());
    }

    #[test]
    fn an_upstream_that_says_it_is_unsynchronised_is_mirrored_so() {
        let mut unsynchronised = testing::synchronised();
        unsynchronised.leap = Leap::Unsynchronised;
        let state = mirrored(unsynchronised);
        assert!(state.updated.is_some(), "no reply mirrored");
        assert!(!is_synchronised(&state));
        let served = state.served_at(clock::now(), &StalePolicy::default());
        assert!(!served.is_synchronised());
    }
}
