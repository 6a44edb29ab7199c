//! Roughtime's serve rule, once for every transport (UDP, AF_XDP and TCP, and each suite): a
//! batch is counted as it begins; the time is read once, after the batch arrived, and the
//! upstream's state once; if the upstream cannot vouch for the time nothing is signed and every
//! request is counted as `upstream_unsynchronised`; otherwise the time signed is the upstream's
//! served time (the offset the NTP side follows), the radius is the upstream's own error bound
//! with the offset's, and each request's sender must pass the access rules (else it is counted as
//! `denied`).

use std::net::IpAddr;
use std::sync::Arc;

use chime_roughtime::{BatchParams, Delegation};

use crate::access::acl::Acl;
use crate::clock;
use crate::observe::stats::WorkerStats;
use crate::roughtime::state::{RoughtimeDrop, Shared};

/// A batch the rule lets be signed.
pub(crate) struct Batch {
    reading: clock::Reading,
    radius_us: u64,
    acl: arc_swap::Guard<Arc<Acl>>,
}

/// A batch of `n` requests begins. `None` if the upstream is unsynchronised (or stale): then all
/// `n` are counted as dropped for it, the stats are ticked, and nothing may be signed.
pub(crate) fn begin(
    shared: &Shared,
    stats: &mut WorkerStats<RoughtimeDrop>,
    n: usize,
) -> Option<Batch> {
    let local = clock::read();
    let state = shared.clock.load();
    let served = state.served_at(local.ntp(), shared.clock.policy());
    // The midpoint is chronyd's served time; the radius below covers the offset's error bound,
    // which the root dispersion carries.
    let reading = local.served(&state.clock);
    stats.counts.received += n as u64;
    stats.counts.batches += 1;
    if !served.is_synchronised() {
        stats.counts.drop_n(RoughtimeDrop::Unsynchronised, n as u64);
        stats.tick(reading.unix_secs());
        return None;
    }
    Some(Batch {
        reading,
        // The upstream's own error bound (root delay / 2 + root dispersion, the dispersion grown
        // since the last poll); each version rounds it up to its resolution and minimum.
        radius_us: (served.root_distance() * 1e6).ceil() as u64,
        acl: shared.access.load(),
    })
}

impl Batch {
    /// What the responder signs: the time read for this batch, its radius, the online key.
    pub(crate) fn params<'d>(&self, delegation: &'d Delegation) -> BatchParams<'d> {
        BatchParams {
            now_unix_us: self.now_unix_us(),
            radius_us: self.radius_us,
            delegation,
        }
    }

    /// The time read for this batch, Unix microseconds.
    pub(crate) fn now_unix_us(&self) -> u64 {
        self.reading.unix_micros()
    }

    /// The radius to sign, microseconds (for a suite that takes it apart from the params).
    #[cfg(feature = "mldsa")]
    pub(crate) fn radius_us(&self) -> u64 {
        self.radius_us
    }

    /// Whether a request from `peer` may be served; one that may not is counted as `denied`.
    pub(crate) fn admits(&self, peer: IpAddr, stats: &mut WorkerStats<RoughtimeDrop>) -> bool {
        let served = self.acl.serves(peer);
        if !served {
            stats.counts.drop(RoughtimeDrop::Denied);
        }
        served
    }

    /// The batch is done: the stats are ticked at the time it was signed at.
    pub(crate) fn finish(self, stats: &mut WorkerStats<RoughtimeDrop>) {
        stats.tick(self.reading.unix_secs());
    }
}

/// What tests of the Roughtime transports need: a served state, keys, requests.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::Duration;

    use arc_swap::ArcSwap;
    use chime_ntp::ServerState;
    use chime_roughtime::{LongTermKey, VerifyPolicy, Version, build_request};

    use super::*;
    use crate::access::{Rules, acl::Acl};
    use crate::clock::published::testing::{self as clock, published};
    use crate::roughtime::keys;

    /// The long-term key the tests sign with.
    pub(crate) fn long_term_key() -> LongTermKey {
        LongTermKey::from_seed(&[7; 32])
    }

    /// Roughtime's shared state over an upstream that is synchronised or not, with the subnets
    /// in `deny` refused.
    pub(crate) fn shared(synchronised: bool, deny: &[&str]) -> Arc<Shared> {
        let state = if synchronised {
            clock::synchronised()
        } else {
            ServerState::unsynchronised()
        };
        let delegation = keys::delegate(&long_term_key(), Duration::from_secs(3600)).unwrap();
        Arc::new(Shared {
            clock: published(state),
            access: Arc::new(Rules::new(Acl::new(&[], &deny_all(deny)).unwrap())),
            stats_interval: None,
            delegation: ArcSwap::from_pointee(delegation),
            workers: Arc::new(crate::observe::stats::Workers::new("roughtime")),
            grease: 0.0,
            grease_kinds: Vec::new(),
            bundle: None,
        })
    }

    fn deny_all(subnets: &[&str]) -> Vec<String> {
        subnets.iter().map(|s| (*s).to_owned()).collect()
    }

    /// An RFC 10049 request with this nonce.
    pub(crate) fn request(nonce: u8) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        let n = build_request(&mut buf, &[Version::Rfc10049], &[nonce; 32], None).unwrap();
        buf.truncate(n);
        buf
    }

    /// Checks `reply` against `request` and the test key: the signature, the path, the nonce,
    /// and a radius of at most 10 s (the upstream's 2.5 ms, raised to the version's minimum).
    pub(crate) fn verify(request: &[u8], reply: &[u8]) -> chime_roughtime::Verified {
        let key = long_term_key().public_key();
        chime_roughtime::verify_reply(request, reply, &key, &VerifyPolicy::new(10_000_000))
            .unwrap_or_else(|e| panic!("the reply does not verify: {e}"))
    }
}
