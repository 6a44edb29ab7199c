//! The NTP worker: the data plane's handler for one socket. It reads the mirrored upstream state
//! once per batch, answers each request with the sans-IO responder, and stamps every reply's
//! transmit time in one clock read immediately before the batch is handed to `sendmmsg`.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use chime_ntp::{Drop, NtpTimestamp, ServerState, StalePolicy};
use chime_udp::{BatchHandler, RxBatch, SendOutcome, TxBatch};
use tracing::{info, warn};

use crate::clock;
use crate::stats::{Counters, Totals};
use crate::tz::Zone;

/// State every worker of the service shares: the published upstream snapshot and the totals.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: ArcSwap<ServerState>,
    pub(crate) policy: StalePolicy,
    pub(crate) totals: Totals,
    pub(crate) stats_interval: Option<Duration>,
    /// The timezone-offset mode's zone, if on; replaced on SIGHUP.
    pub(crate) zone: ArcSwapOption<Zone>,
}

pub(crate) struct NtpWorker {
    shared: Arc<Shared>,
    name: String,
    /// Counted since the last flush into `shared.totals`.
    pending: Counters,
    /// Counted since start, for this thread's own log lines.
    lifetime: Counters,
    last_flush: NtpTimestamp,
    /// Send errors are logged at most once per stats interval, never per packet.
    send_error_logged: bool,
    /// The zone for the batch in hand (loaded once per batch) and the Unix time that resolves
    /// NTP eras for it.
    zone: Option<Arc<Zone>>,
    pivot_unix: i64,
}

impl NtpWorker {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> Self {
        Self {
            shared,
            name,
            pending: Counters::default(),
            lifetime: Counters::default(),
            last_flush: clock::now(),
            send_error_logged: false,
            zone: None,
            pivot_unix: 0,
        }
    }

    fn maybe_flush(&mut self, now: NtpTimestamp) {
        let Some(interval) = self.shared.stats_interval else {
            return;
        };
        if now.wrapping_diff_seconds(self.last_flush) >= interval.as_secs_f64() {
            self.flush(now);
            info!(thread = %self.name, "ntp stats: {}", self.lifetime);
            self.send_error_logged = false;
        }
    }

    fn flush(&mut self, now: NtpTimestamp) {
        self.shared.totals.add(&self.pending);
        self.lifetime.add(&self.pending);
        self.pending = Counters::default();
        self.last_flush = now;
    }
}

impl BatchHandler for NtpWorker {
    fn handle(&mut self, rx: &RxBatch, tx: &mut TxBatch) {
        // One clock read and one snapshot load per batch: the fallback receive time for a
        // datagram without a kernel timestamp, and the header every reply in the batch carries.
        let (now, now_unix) = clock::now_with_unix();
        let mut served = self.shared.state.load().served_at(now, &self.shared.policy);
        self.zone = self.shared.zone.load_full();
        self.pivot_unix = now_unix;
        if let Some(zone) = &self.zone {
            served.reference_ts = zone.apply(served.reference_ts, now_unix);
        }
        for (meta, request) in rx.iter() {
            self.pending.received += 1;
            if meta.truncated {
                self.pending.drop(Drop::Truncated);
                continue;
            }
            let mut t2 = meta.timestamp.map_or(now, clock::from_kernel);
            if let Some(zone) = &self.zone {
                t2 = zone.apply(t2, now_unix);
            }
            let mut dropped = None;
            tx.reply_to(meta, |buf| {
                // The reply buffer is cut to the request's length: no reply can be longer than
                // the request that caused it.
                let cap = request.len().min(buf.len());
                match chime_ntp::respond(request, meta.src.port(), t2, &served, &mut buf[..cap]) {
                    Ok(len) => Some(len),
                    Err(why) => {
                        dropped = Some(why);
                        None
                    }
                }
            });
            if let Some(why) = dropped {
                self.pending.drop(why);
            }
        }
        self.maybe_flush(now);
    }

    fn before_send(&mut self, tx: &mut TxBatch) {
        let mut t3 = clock::now();
        if let Some(zone) = &self.zone {
            t3 = zone.apply(t3, self.pivot_unix);
        }
        for reply in tx.payloads_mut() {
            chime_ntp::stamp_transmit(reply, t3);
        }
    }

    fn after_send(&mut self, outcome: &SendOutcome) {
        self.pending.answered += outcome.sent as u64;
        self.pending.send_errors += outcome.errors as u64;
        if let Some(e) = &outcome.last_error {
            if !self.send_error_logged {
                self.send_error_logged = true;
                warn!(thread = %self.name, "ntp send failed: {e} (further errors this interval are only counted)");
            }
        }
    }

    fn idle(&mut self) {
        self.maybe_flush(clock::now());
    }

    fn finish(&mut self) {
        self.flush(clock::now());
        info!(thread = %self.name, "ntp stats at exit: {}", self.lifetime);
    }
}
