//! The Roughtime worker: the data plane's handler for one socket. Every batch it receives becomes
//! one Merkle tree and one signature per version family (chime-roughtime's `Responder`), signed
//! with the online key the control plane published, at the time read right after the batch
//! arrived. A lone request is a batch of one and is answered at once.
//!
//! While the mirrored upstream is unsynchronised (or stale), the worker signs nothing: it would
//! rather not answer than vouch for a time it cannot stand behind. Roughtime is never shifted by
//! the timezone-offset mode.

use std::sync::Arc;

use chime_ntp::Coin;
use chime_roughtime::{Grease, Responder, ResponderConfig, Ticket, Version, VersionSet};
use chime_udp::{BatchHandler, RxBatch, TxBatch};

use crate::observe::counters::Note;
use crate::observe::stats::{self, WorkerStats};
use crate::reply;
use crate::roughtime::serve;
use crate::roughtime::state::{RoughtimeDrop, Shared};
use crate::service::Beat;

/// Picks the replies to grease (`--roughtime-grease`) and how: each reply independently with
/// the configured share, its kind uniformly among the configured kinds that apply to its
/// version (none apply: not greased).
#[derive(Debug)]
struct Greaser {
    /// A reply is greased when the coin's 64 bits are at most this: `share` × 2^64, saturating,
    /// so that a share of 1 greases every reply.
    threshold: u64,
    /// Per version (by [`Version::index`]), the configured kinds that apply to it.
    kinds: Vec<Vec<Grease>>,
    coin: Coin,
}

impl Greaser {
    /// `None` for a share of 0.
    fn new(share: f64, kinds: &[Grease], seed: u64) -> Option<Self> {
        let mut per_version = vec![Vec::new(); Version::COUNT];
        for v in Version::ALL {
            per_version[v.index()] = Grease::kinds(v)
                .iter()
                .copied()
                .filter(|k| kinds.contains(k))
                .collect();
        }
        (share > 0.0).then(|| Self {
            // An f64 to u64 cast saturates: 2^64 becomes u64::MAX.
            threshold: (share * 2f64.powi(64)) as u64,
            kinds: per_version,
            coin: Coin::new(seed),
        })
    }

    fn draw(&mut self, version: Version) -> Option<Grease> {
        let kinds = &self.kinds[version.index()];
        if kinds.is_empty() || self.coin.next_u64() > self.threshold {
            return None;
        }
        Some(kinds[(self.coin.next_u64() % kinds.len() as u64) as usize])
    }
}

pub(crate) struct RoughtimeWorker {
    shared: Arc<Shared>,
    stats: WorkerStats<RoughtimeDrop>,
    responder: Responder,
    /// Per datagram of the batch in hand, its ticket if the responder took it.
    tickets: Vec<Option<Ticket>>,
    greaser: Option<Greaser>,
}

impl RoughtimeWorker {
    /// Thread `thread` of those on one `family`'s socket (or on AF_XDP, `xdp`), signing batches
    /// of up to `batch_size`, its counts registered with the service's.
    pub(crate) fn new(
        shared: Arc<Shared>,
        batch_size: usize,
        (family, thread): (&'static str, usize),
    ) -> Self {
        let capacity = batch_size.min(chime_roughtime::MAX_BATCH_SIZE);
        let responder = Responder::new(ResponderConfig {
            versions: VersionSet::ALL,
            capacity,
        });
        Self {
            stats: WorkerStats::new(
                "roughtime",
                shared.stats_interval,
                (&shared.workers, family, thread),
            ),
            greaser: Greaser::new(shared.grease, &shared.grease_kinds, rand::random()),
            shared,
            responder,
            tickets: Vec::with_capacity(batch_size),
        }
    }

    /// A worker whose every batch and idle wake-up the watchdog sees.
    pub(crate) fn with_heartbeat(mut self, beat: Beat) -> Self {
        self.stats = self.stats.with_heartbeat(beat);
        self
    }
}

impl BatchHandler for RoughtimeWorker {
    fn handle(&mut self, rx: &RxBatch, tx: &mut TxBatch) {
        // Both ways out of the serve rule tick the stats, which the watchdog sees.
        let Some(serving) = serve::begin(&self.shared, &mut self.stats, rx.len()) else {
            return;
        };
        let delegation = self.shared.delegation.load();
        let params = serving.params(&delegation);
        let mut batch = self.responder.begin(params);
        self.tickets.clear();
        for (meta, request) in rx.iter() {
            let ticket = if !serving.admits(meta.src.ip(), &mut self.stats) {
                None
            } else if meta.truncated {
                self.stats.counts.drop(RoughtimeDrop::Truncated);
                None
            } else {
                match batch.add(request) {
                    Ok(t) => Some(t),
                    Err(why) => {
                        self.stats.counts.drop(RoughtimeDrop::Request(why));
                        None
                    }
                }
            };
            self.tickets.push(ticket);
        }
        if !batch.is_empty() {
            let signed = batch.sign();
            for ((meta, request), ticket) in rx.iter().zip(&self.tickets) {
                let Some(ticket) = *ticket else { continue };
                let grease = self.greaser.as_mut().and_then(|g| g.draw(ticket.version()));
                let queued = reply::queue(tx, meta, request, |buf| match grease {
                    Some(kind) => signed.write_greased_reply(ticket, buf, kind),
                    None => signed.write_reply(ticket, buf),
                });
                let counts = &mut self.stats.counts;
                counts.note(Note::Roughtime(ticket.version()), queued.is_ok());
                counts.note(Note::Greased, queued.is_ok() && grease.is_some());
                if let Err(Some(why)) = queued {
                    counts.drop(RoughtimeDrop::Request(why));
                }
            }
        }
        serving.finish(&mut self.stats);
    }

    stats::bookkeeping!(stats, "roughtime-worker");
}

/// The worker driven in process, without a socket: the serve rule as UDP and XDP follow it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::testing::exchange;
    use crate::roughtime::serve::testing::{request, shared, verify};

    #[test]
    fn a_batch_is_signed_once_and_every_reply_verifies() {
        let mut worker = RoughtimeWorker::new(shared(true, &[]), 8, ("ipv4", 0));
        let requests: Vec<_> = (0..3).map(request).collect();
        let replies = exchange(&mut worker, "192.0.2.1:40000", &requests);
        assert_eq!(replies.len(), 3);
        for (req, reply) in requests.iter().zip(&replies) {
            assert!(reply.len() <= req.len());
            verify(req, reply);
        }
        let p = worker.stats.counts;
        assert_eq!((p.received, p.batches), (3, 1));
    }

    #[test]
    fn the_midpoint_is_the_upstreams_served_time_and_the_radius_covers_its_error() {
        let shared = shared(true, &[]);
        let mut state = **shared.clock.load();
        state.clock = chime_ntp::ServedClock {
            anchor: crate::clock::now(),
            offset: -0.25,
            error: 300e-6,
            ..chime_ntp::ServedClock::LOCAL
        };
        shared.clock.publish(state);
        let mut worker = RoughtimeWorker::new(shared, 8, ("ipv4", 0));
        let before = crate::clock::read().unix_micros() as i64;
        // Google's protocol, whose midpoint is in microseconds (RFC 10049's is in seconds).
        let mut req = vec![0u8; 2048];
        let n = chime_roughtime::build_request(
            &mut req,
            &[chime_roughtime::Version::Google],
            &[1; 64],
            None,
        )
        .unwrap();
        req.truncate(n);
        let replies = exchange(&mut worker, "192.0.2.1:40000", &[&req]);
        let after = crate::clock::read().unix_micros() as i64;
        let got = verify(&req, &replies[0]);
        let midpoint = got.midpoint_unix_us as i64;
        // 250 ms behind the clock read for the batch.
        assert!(
            (before - 250_000..=after - 250_000).contains(&midpoint),
            "{midpoint} not 250 ms behind {before}..{after}"
        );
        // The upstream's 0.5 ms + 2 ms root distance, and the offset's 0.3 ms bound.
        assert!(got.radius_us >= 2_800, "{}", got.radius_us);
    }

    /// RFC 10049 §5.2.5 has RADI at least 3 s because a timestamp that assumes 86 400 s a day
    /// cannot tell an inserted second from the one before it. From the start of a leap second
    /// until a poll after it, chimed's own bound holds that second too: Google's radius (in
    /// microseconds, with no minimum) grows by it, RFC 10049's stays at least 3 s.
    #[test]
    fn from_the_start_of_a_leap_second_until_a_poll_the_radius_covers_it() {
        use chime_roughtime::Version::{Google, Rfc10049};
        let radius = |version: chime_roughtime::Version, leap_in: f64| {
            let shared = shared(true, &[]);
            let now = crate::clock::now();
            let at = if leap_in >= 0.0 {
                now.add_duration(std::time::Duration::from_secs_f64(leap_in))
            } else {
                now.sub_duration(std::time::Duration::from_secs_f64(-leap_in))
            };
            let state = chime_ntp::ServerState {
                leap: chime_ntp::Leap::AddSecond,
                announced: Some(chime_ntp::Announced {
                    leap: chime_ntp::Leap::AddSecond,
                    at,
                }),
                ..**shared.clock.load()
            };
            shared.clock.publish(state);
            let mut worker = RoughtimeWorker::new(shared, 8, ("ipv4", 0));
            let mut req = vec![0u8; 2048];
            let nonce = [2; 64];
            let nonce = &nonce[..if version == Google { 64 } else { 32 }];
            let n = chime_roughtime::build_request(&mut req, &[version], nonce, None).unwrap();
            req.truncate(n);
            let replies = exchange(&mut worker, "192.0.2.1:40000", &[&req]);
            verify(&req, &replies[0]).radius_us
        };
        // Before the leap: the upstream's few milliseconds; RFC 10049's floor.
        assert!(radius(Google, 10.0) < 10_000);
        assert_eq!(radius(Rfc10049, 10.0), 3_000_000);
        // Past its start, with no poll since: a second more.
        assert!(radius(Google, -0.01) > 1_000_000);
        assert!(radius(Rfc10049, -0.01) >= 3_000_000);
    }

    #[test]
    fn nothing_is_signed_while_the_upstream_is_unsynchronised() {
        let mut hearts = crate::service::Heartbeats::default();
        let mut worker =
            RoughtimeWorker::new(shared(false, &[]), 8, ("ipv4", 0)).with_heartbeat(hearts.add());
        let replies = exchange(&mut worker, "192.0.2.1:40000", &[request(1), request(2)]);
        assert!(replies.is_empty());
        assert_eq!(
            worker.stats.counts.dropped(RoughtimeDrop::Unsynchronised),
            2
        );
        assert!(
            hearts.all_moved(),
            "a batch signed or not is a beat the watchdog sees"
        );
    }

    #[test]
    fn a_denied_sender_is_counted_and_not_answered() {
        let mut worker = RoughtimeWorker::new(shared(true, &["198.51.100.0/24"]), 8, ("ipv4", 0));
        let replies = exchange(&mut worker, "198.51.100.7:40000", &[request(1)]);
        assert!(replies.is_empty());
        assert_eq!(worker.stats.counts.dropped(RoughtimeDrop::Denied), 1);
    }
}
