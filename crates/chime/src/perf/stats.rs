//! Counts and latency histograms of one step: filled per thread by the workers, merged by the
//! engine, and summarised into the per-step [`StepReport`] that every output is made from.
//!
//! Every request of a step ends in exactly one of: answered (a valid reply within the timeout),
//! refused (a kiss-o'-death or the like), settled invalid (a reply with its id that a client would
//! reject), failed (an exchange the transport ran itself, such as an NTS-KE session, ended in a
//! failure of a named kind), or lost (no such reply within the timeout). Late replies (after the timeout) and
//! duplicates are counted on top and change nothing; a late request is also lost. Loss is
//! everything not answered: `(sent − answered) / sent`.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::protocol::{ServerTimes, Signed};

/// Latencies are recorded in nanoseconds, from 1 ns up to a minute, to three significant digits.
const HIST_MAX_NS: u64 = 60_000_000_000;

/// One thread's counts and histograms for one step.
#[derive(Debug)]
pub(crate) struct StepStats {
    /// Requests due in the step's schedule.
    pub(crate) scheduled: u64,
    /// Requests the kernel accepted.
    pub(crate) sent: u64,
    /// Requests the kernel refused (counted here, not sent).
    pub(crate) send_errors: u64,
    /// Requests still unsent when the step's time ran out: the generator fell behind.
    pub(crate) unsent: u64,
    pub(crate) answered: u64,
    /// Answered requests whose round trip was longer than the client interval: the client had
    /// sent its next request by then (also in `answered`).
    pub(crate) stale: u64,
    pub(crate) refused: u64,
    /// Replies naming a request that a client would reject.
    pub(crate) invalid_matched: u64,
    /// Datagrams that name no request of ours (unparsable, unknown id).
    pub(crate) invalid_unmatched: u64,
    /// Exchanges that failed, by kind (NTS-KE sessions), and all of them together.
    pub(crate) failures: BTreeMap<&'static str, u64>,
    pub(crate) failed: u64,
    /// Receive errors other than "nothing queued".
    pub(crate) recv_errors: u64,
    /// The first send or receive error of the step, to report once rather than per packet.
    pub(crate) first_error: Option<String>,
    /// Replies whose T2 was before T1, recorded as zero: the server's clock is not ours.
    pub(crate) t2_before_t1: u64,
    /// Round-trip time T4 − T1.
    pub(crate) rtt: Histogram<u64>,
    /// The answered request with the longest round trip: (T4 − T1, T1), nanoseconds.
    pub(crate) slowest: Option<(i64, i64)>,
    /// The server's receive timestamp minus our send time, T2 − T1, for the first datagram of
    /// each `sendmmsg` only, whose T1 is exact (see `InFlight::commit`).
    pub(crate) t2_t1: Histogram<u64>,
    /// The server's processing time, T3 − T2.
    pub(crate) t3_t2: Histogram<u64>,
    /// How late requests left against the schedule (for exchanges a transport runs itself, how
    /// long each waited to begin).
    pub(crate) send_lag: Histogram<u64>,
    /// Answered requests whose reply was verified in full (signed protocols).
    pub(crate) verified: u64,
    /// Answered requests by the number of hashes in their reply's Merkle path (signed protocols;
    /// the last entry also counts longer paths).
    pub(crate) path_lens: [u64; PATH_LENS],
}

/// Merkle path lengths counted one by one: 0..=32 hashes, a tree of up to 2^32 leaves.
const PATH_LENS: usize = 33;

impl StepStats {
    pub(crate) fn new() -> Self {
        Self {
            scheduled: 0,
            sent: 0,
            send_errors: 0,
            unsent: 0,
            answered: 0,
            stale: 0,
            refused: 0,
            invalid_matched: 0,
            invalid_unmatched: 0,
            failures: BTreeMap::new(),
            failed: 0,
            recv_errors: 0,
            first_error: None,
            t2_before_t1: 0,
            rtt: histogram(),
            slowest: None,
            t2_t1: histogram(),
            t3_t2: histogram(),
            send_lag: histogram(),
            verified: 0,
            path_lens: [0; PATH_LENS],
        }
    }

    /// Counts an answered request: its round trip (and whether that was stale), when it was sent
    /// and whether that T1 is exact, and what the reply showed of the server's times and
    /// signature.
    pub(crate) fn answer(
        &mut self,
        rtt: i64,
        stale: bool,
        (t1_ns, exact_t1): (i64, bool),
        server: Option<ServerTimes>,
        signed: Option<Signed>,
    ) {
        self.answered += 1;
        self.stale += u64::from(stale);
        record_ns(&mut self.rtt, rtt);
        if self.slowest.is_none_or(|(worst, _)| rtt > worst) {
            self.slowest = Some((rtt, t1_ns));
        }
        if let Some(signed) = signed {
            self.record_signed(signed);
        }
        if let Some(server) = server {
            record_ns(&mut self.t3_t2, server.transmit_ns - server.receive_ns);
            if exact_t1 {
                let t2_t1 = server.receive_ns - t1_ns;
                self.t2_before_t1 += u64::from(t2_t1 < 0);
                record_ns(&mut self.t2_t1, t2_t1);
            }
        }
    }

    /// Counts an exchange that failed as `kind`; the first failure's reason is the step's to
    /// report.
    pub(crate) fn fail(&mut self, kind: &'static str, why: Option<String>) {
        *self.failures.entry(kind).or_insert(0) += 1;
        self.failed += 1;
        if let (None, Some(why)) = (&self.first_error, why) {
            self.first_error = Some(format!("first failure: {why}"));
        }
    }

    /// Counts what an answered reply of a signed protocol shows.
    pub(crate) fn record_signed(&mut self, signed: Signed) {
        self.verified += u64::from(signed.verified);
        self.path_lens[usize::from(signed.path_len).min(PATH_LENS - 1)] += 1;
    }

    /// Requests without a reply that settled them: while the step runs, the ones still waiting;
    /// once it is over, the lost ones.
    pub(crate) fn lost(&self) -> u64 {
        self.sent
            .saturating_sub(self.answered + self.refused + self.invalid_matched + self.failed)
    }

    /// Adds another thread's numbers for the same step.
    pub(crate) fn merge(&mut self, other: &Self) {
        self.scheduled += other.scheduled;
        self.sent += other.sent;
        self.send_errors += other.send_errors;
        self.unsent += other.unsent;
        self.answered += other.answered;
        self.stale += other.stale;
        self.refused += other.refused;
        self.invalid_matched += other.invalid_matched;
        self.invalid_unmatched += other.invalid_unmatched;
        for (kind, n) in &other.failures {
            *self.failures.entry(kind).or_insert(0) += n;
        }
        self.failed += other.failed;
        self.recv_errors += other.recv_errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.t2_before_t1 += other.t2_before_t1;
        if other.slowest.map(|o| o.0) > self.slowest.map(|m| m.0) {
            self.slowest = other.slowest;
        }
        self.verified += other.verified;
        for (mine, theirs) in self.path_lens.iter_mut().zip(other.path_lens) {
            *mine += theirs;
        }
        for (mine, theirs) in [
            (&mut self.rtt, &other.rtt),
            (&mut self.t2_t1, &other.t2_t1),
            (&mut self.t3_t2, &other.t3_t2),
            (&mut self.send_lag, &other.send_lag),
        ] {
            // Same bounds on both sides, so adding cannot fail.
            mine.add(theirs).expect("histograms with equal bounds");
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

/// Records a nanosecond interval, clamping what is below the histogram's range to its floor.
pub(crate) fn record_ns(h: &mut Histogram<u64>, ns: i64) {
    h.saturating_record(ns.max(1) as u64);
}

/// Percentiles of a latency distribution, in microseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Percentiles {
    pub(crate) count: u64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
}

impl Percentiles {
    /// `None` for an empty histogram: no reply, no latency.
    pub(crate) fn of(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let us = |ns: u64| ns as f64 / 1_000.0;
        Some(Self {
            count: h.len(),
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        })
    }
}

/// Upper bounds of the latency ranges the summary draws as bars, in microseconds; the last range
/// is everything above the last bound.
pub(crate) const RANGES_US: [f64; 12] = [
    25.0, 50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 10e3, 25e3, 100e3, 1e6,
];

/// How many round trips fell in each of [`RANGES_US`] (and one more, above the last).
pub(crate) fn distribution(h: &Histogram<u64>) -> Vec<u64> {
    let mut counts = Vec::with_capacity(RANGES_US.len() + 1);
    let mut below = 0;
    for upper in RANGES_US {
        let upto = h.count_between(0, (upper * 1e3) as u64);
        counts.push(upto - below);
        below = upto;
    }
    counts.push(h.len() - below);
    counts
}

/// The answered request with the longest round trip in a step, for the summary to name.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub(crate) struct Slowest {
    pub(crate) rtt_us: f64,
    /// When it was sent, Unix nanoseconds.
    pub(crate) sent_unix_ns: i64,
}

/// The Merkle paths of a step's answered replies (signed protocols): how wide the server's trees,
/// and so its batches, were.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub(crate) struct MerklePaths {
    /// Mean hashes per path.
    pub(crate) mean: f64,
    /// The longest path: some batch held more than 2^(max−1) requests.
    pub(crate) max: u8,
}

impl MerklePaths {
    fn of(counts: &[u64; PATH_LENS]) -> Option<Self> {
        let n: u64 = counts.iter().sum();
        if n == 0 {
            return None;
        }
        let hashes: u64 = (0u64..).zip(counts).map(|(len, c)| len * c).sum();
        let max = counts.iter().rposition(|&c| c > 0).unwrap_or(0);
        Some(Self {
            mean: hashes as f64 / n as f64,
            max: u8::try_from(max).unwrap_or(u8::MAX),
        })
    }
}

/// The server's CPU time over a step, from /proc.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct ServerCpu {
    /// CPU time (user + system) per answered request, microseconds.
    pub(crate) us_per_reply: Option<f64>,
    /// The part of that in the kernel (system time), microseconds: the cost of receiving and
    /// sending a datagram, much the same for any server, as against the server's own work.
    pub(crate) kernel_us_per_reply: Option<f64>,
    /// CPU time per second of sending, percent of one core.
    pub(crate) percent: f64,
    /// The busiest thread's CPU time per second of sending, percent of one core: near 100 means
    /// that thread is the bottleneck.
    pub(crate) busiest_thread_percent: f64,
}

/// Everything measured in one step, as the outputs show it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct StepReport {
    /// 1-based.
    pub(crate) step: usize,
    /// Requests per second asked for.
    pub(crate) offered_rate: f64,
    /// Seconds of sending.
    pub(crate) duration: f64,
    pub(crate) scheduled: u64,
    pub(crate) sent: u64,
    /// Requests per second actually sent.
    pub(crate) sent_rate: f64,
    pub(crate) unsent: u64,
    pub(crate) send_errors: u64,
    pub(crate) answered: u64,
    /// Answered requests per second of the step.
    pub(crate) answered_rate: f64,
    /// Percentage of sent requests not answered in time.
    pub(crate) loss_pct: f64,
    /// The client poll interval stale replies are counted against, seconds.
    pub(crate) client_interval: f64,
    /// Answered requests whose round trip was longer than the client interval.
    pub(crate) stale: u64,
    /// Percentage of sent requests answered stale: with `loss_pct`, what ntpperf calls lost and
    /// invalid.
    pub(crate) stale_pct: f64,
    /// Answers that were not stale, per second of the step: what clients accept.
    pub(crate) accepted_rate: f64,
    pub(crate) lost: u64,
    /// Invalid datagrams: replies a client would reject plus ones naming no request of ours.
    pub(crate) invalid: u64,
    pub(crate) refused: u64,
    /// Exchanges that failed, by kind (NTS-KE sessions); no field where there are none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) failures: BTreeMap<&'static str, u64>,
    pub(crate) late: u64,
    pub(crate) duplicate: u64,
    pub(crate) recv_errors: u64,
    /// Round-trip time T4 − T1.
    pub(crate) rtt_us: Option<Percentiles>,
    /// Round trips per latency range ([`RANGES_US`], then above the last).
    pub(crate) rtt_ranges: Vec<u64>,
    pub(crate) slowest: Option<Slowest>,
    /// The server's receive timestamp error T2 − T1, on the first datagram of each batch.
    pub(crate) t2_t1_us: Option<Percentiles>,
    /// The server's processing time T3 − T2.
    pub(crate) t3_t2_us: Option<Percentiles>,
    pub(crate) t2_before_t1: u64,
    /// How late requests left against the schedule.
    pub(crate) send_lag_us: Option<Percentiles>,
    /// Answered requests whose reply was verified in full (Roughtime: `--verify-every`).
    pub(crate) verified: u64,
    /// The Merkle paths of the answered replies (Roughtime).
    pub(crate) merkle_path: Option<MerklePaths>,
    pub(crate) server_cpu: Option<ServerCpu>,
    /// This process's CPU time per second of sending, percent of one core (all its threads).
    pub(crate) client_cpu_percent: f64,
    /// Datagrams the kernel dropped on our sockets' full receive queues: loss that is ours, not
    /// the server's. `None` if /proc/net/udp could not be read.
    pub(crate) client_rx_drops: Option<u64>,
    /// Datagrams dropped on the receive queues of this host's sockets bound to the target port.
    pub(crate) server_rx_drops: Option<u64>,
    /// Per CPU of this host, the share of the step's ticks the hypervisor took (steal), percent.
    /// On a shared virtual machine a server can lose requests to a stall that is not its own.
    pub(crate) steal_pct: Option<Vec<f64>>,
}

impl StepReport {
    /// The counts and distributions of a step; the engine adds the /proc figures.
    pub(crate) fn new(
        step: usize,
        offered_rate: f64,
        duration: f64,
        client_interval: f64,
        s: &StepStats,
    ) -> Self {
        let ratio = |n: u64| {
            if s.sent == 0 {
                0.0
            } else {
                n as f64 / s.sent as f64 * 100.0
            }
        };
        Self {
            step,
            offered_rate,
            duration,
            scheduled: s.scheduled,
            sent: s.sent,
            sent_rate: s.sent as f64 / duration,
            unsent: s.unsent,
            send_errors: s.send_errors,
            answered: s.answered,
            answered_rate: s.answered as f64 / duration,
            loss_pct: if s.sent == 0 {
                100.0
            } else {
                ratio(s.sent - s.answered)
            },
            client_interval,
            stale: s.stale,
            stale_pct: ratio(s.stale),
            accepted_rate: (s.answered - s.stale) as f64 / duration,
            lost: s.lost(),
            invalid: s.invalid_matched + s.invalid_unmatched,
            refused: s.refused,
            failures: s.failures.clone(),
            late: 0,
            duplicate: 0,
            recv_errors: s.recv_errors,
            rtt_us: Percentiles::of(&s.rtt),
            rtt_ranges: distribution(&s.rtt),
            slowest: s.slowest.map(|(rtt, t1)| Slowest {
                rtt_us: rtt as f64 / 1e3,
                sent_unix_ns: t1,
            }),
            t2_t1_us: Percentiles::of(&s.t2_t1),
            t3_t2_us: Percentiles::of(&s.t3_t2),
            t2_before_t1: s.t2_before_t1,
            send_lag_us: Percentiles::of(&s.send_lag),
            verified: s.verified,
            merkle_path: MerklePaths::of(&s.path_lens),
            server_cpu: None,
            client_cpu_percent: 0.0,
            client_rx_drops: None,
            server_rx_drops: None,
            steal_pct: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_counts_everything_unanswered() {
        let mut s = StepStats::new();
        s.sent = 100;
        s.answered = 90;
        s.refused = 3;
        s.invalid_matched = 2;
        s.invalid_unmatched = 4;
        assert_eq!(s.lost(), 5);
        let r = StepReport::new(1, 50.0, 2.0, 0.1, &s);
        assert_eq!(r.loss_pct, 10.0);
        assert_eq!(r.invalid, 6);
        assert_eq!((r.sent_rate, r.answered_rate), (50.0, 45.0));
        assert!(r.rtt_us.is_none());
    }

    #[test]
    fn round_trips_fall_in_their_ranges_and_the_slowest_survives_a_merge() {
        let mut a = StepStats::new();
        for ns in [10_000, 20_000, 30_000, 2_000_000_000] {
            record_ns(&mut a.rtt, ns);
        }
        let d = distribution(&a.rtt);
        assert_eq!(d.len(), RANGES_US.len() + 1);
        // 10 and 20 µs under 25 µs, 30 µs under 50 µs, 2 s above the last bound (1 s).
        assert_eq!((d[0], d[1], d[RANGES_US.len()]), (2, 1, 1));
        assert_eq!(d.iter().sum::<u64>(), 4);
        a.slowest = Some((30_000, 7));
        let mut b = StepStats::new();
        b.slowest = Some((90_000, 8));
        let mut c = StepStats::new();
        c.slowest = Some((5_000, 9));
        a.merge(&b);
        a.merge(&c);
        a.merge(&StepStats::new());
        assert_eq!(a.slowest, Some((90_000, 8)));
    }

    #[test]
    fn merge_adds_counts_and_distributions() {
        let mut a = StepStats::new();
        let mut b = StepStats::new();
        a.sent = 2;
        b.sent = 3;
        record_ns(&mut a.rtt, 10_000);
        record_ns(&mut b.rtt, 30_000);
        record_ns(&mut b.rtt, -5);
        a.merge(&b);
        assert_eq!(a.sent, 5);
        let p = Percentiles::of(&a.rtt).unwrap();
        assert_eq!(p.count, 3);
        assert!((p.max - 30.0).abs() < 0.1, "{p:?}");
        assert!((p.p50 - 10.0).abs() < 0.1, "{p:?}");
    }

    #[test]
    fn merkle_paths_summarise_the_answered_replies() {
        let mut a = StepStats::new();
        assert_eq!(StepReport::new(1, 1.0, 1.0, 0.1, &a).merkle_path, None);
        for path_len in [0, 3, 3] {
            a.record_signed(Signed {
                verified: path_len == 3,
                path_len,
            });
        }
        let mut b = StepStats::new();
        b.record_signed(Signed {
            verified: false,
            path_len: 200,
        });
        a.merge(&b);
        let r = StepReport::new(1, 1.0, 1.0, 0.1, &a);
        assert_eq!(r.verified, 2);
        // 200 is counted as 32, the longest path a 2^32-leaf tree has.
        assert_eq!(
            r.merkle_path,
            Some(MerklePaths {
                mean: (3.0 + 3.0 + 32.0) / 4.0,
                max: 32
            })
        );
    }
}
