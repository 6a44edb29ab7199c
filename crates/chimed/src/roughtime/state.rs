//! What every Roughtime transport shares (UDP, AF_XDP, TCP, and the ML-DSA-44 suite's signer):
//! the state the workers read, and why a request got no reply, which each counts.

use std::sync::Arc;

use arc_swap::ArcSwap;
use chime_roughtime::{Delegation, DropReason, Grease};

use crate::access::Rules;
use crate::clock::published::Published;
use crate::observe::counters;
use crate::observe::stats::Workers;

/// Why a Roughtime request got no reply: the protocol's reasons, and the daemon's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RoughtimeDrop {
    /// The responder's reason.
    Request(DropReason),
    /// The upstream cannot vouch for the time: nothing is signed.
    Unsynchronised,
    /// Larger than the receive buffer.
    Truncated,
    /// An `--allow`/`--deny` rule.
    Denied,
}

impl RoughtimeDrop {
    const COUNT: usize = DropReason::COUNT + 3;

    /// The daemon's own reasons, each beside its label.
    const OWN: [(Self, &'static str); 3] = [
        (Self::Unsynchronised, "upstream_unsynchronised"),
        (Self::Truncated, "truncated"),
        (Self::Denied, "denied"),
    ];

    /// Every label, by slot.
    const ALL_LABELS: [&'static str; Self::COUNT] =
        counters::drop_labels!(DropReason::COUNT, |i| DropReason::ALL[i].label());

    const fn slot(self) -> usize {
        match self {
            Self::Request(why) => why.index(),
            Self::Unsynchronised => DropReason::COUNT,
            Self::Truncated => DropReason::COUNT + 1,
            Self::Denied => DropReason::COUNT + 2,
        }
    }
}

impl counters::Reason for RoughtimeDrop {
    type Counts = [u64; Self::COUNT];
    const LABELS: &'static [&'static str] = &Self::ALL_LABELS;
    const NOTES: counters::Of = counters::Of::Roughtime;

    fn index(self) -> usize {
        self.slot()
    }
}

/// State every Roughtime worker shares.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The clock as the upstream poller publishes it: Roughtime serves the same as NTP.
    pub(crate) clock: Arc<Published>,
    /// Who is served, NTP and Roughtime alike; replaced on SIGHUP.
    pub(crate) access: Arc<Rules>,
    pub(crate) stats_interval: Option<std::time::Duration>,
    /// The current online key and its certificates; replaced by the control plane on rotation.
    pub(crate) delegation: ArcSwap<Delegation>,
    /// Every UDP and AF_XDP worker's counts, for the log's totals and the metrics.
    pub(crate) workers: Arc<Workers<RoughtimeDrop>>,
    /// The share of replies to make deliberately invalid (`--roughtime-grease`); 0: none.
    pub(crate) grease: f64,
    /// The kinds of grease to use (`--roughtime-grease-kinds`).
    pub(crate) grease_kinds: Vec<Grease>,
    /// The delegation bundle the delegations come from (`--roughtime-delegation`), for the
    /// control plane and the metrics; SIGHUP replaces it. `None` with a long-term key.
    pub(crate) bundle: Option<ArcSwap<chime_roughtime::Bundle>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drop_reason_has_a_label_of_its_own() {
        use crate::observe::counters::Reason as _;
        let mut labels = RoughtimeDrop::LABELS.to_vec();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), RoughtimeDrop::COUNT);
        assert!(!labels.contains(&""));
        let label = |why: RoughtimeDrop| RoughtimeDrop::LABELS[why.index()];
        assert_eq!(
            label(RoughtimeDrop::Unsynchronised),
            "upstream_unsynchronised"
        );
        let why = RoughtimeDrop::Request(DropReason::StaleTicket);
        assert_eq!(label(why), "stale_ticket");
    }
}
