//! The experimental ML-DSA-44 suite (0x90000001, part of no draft; the `mldsa` feature), in one
//! place: its keys (a long-term key and an online key it certifies, replaced every rotation by a
//! supervised task) and its signer, which takes the requests offering it out of each batch of
//! Roughtime over TCP and signs them in a batch of their own under the same serve rule.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_roughtime::MAX_BATCH_SIZE;
use chime_roughtime::mldsa::{PqDelegation, PqLongTermKey, PqResponder};
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::service::ServiceError;

use crate::observe::counters::Note;
use crate::observe::stats::WorkerStats;
use crate::roughtime::job::{Job, Reply, refuse_all};
use crate::roughtime::serve;
use crate::roughtime::state::{RoughtimeDrop, Shared};

/// The online key in force, which the signer reads per batch.
pub(crate) type Now = Arc<ArcSwap<PqDelegation>>;

/// The experimental ML-DSA-44 suite (`--roughtime-mldsa-key`), served over TCP only: its
/// long-term key, and the online key in force, which [`rotate_pq`] replaces every rotation.
pub(crate) struct Pq {
    pub(crate) key: PqLongTermKey,
    pub(crate) rotation: Duration,
    pub(crate) now: Now,
}

impl Pq {
    /// The suite with a first online key, made at once (ML-DSA keys take no time to make).
    pub(crate) fn new(key: PqLongTermKey, rotation: Duration) -> Self {
        let now = Arc::new(ArcSwap::from_pointee(pq_delegation(&key, rotation)));
        Self { key, rotation, now }
    }
}

/// An online ML-DSA-44 key valid from an hour ago for two rotations, certified by `key`.
fn pq_delegation(key: &PqLongTermKey, rotation: Duration) -> PqDelegation {
    let now = crate::clock::read().unix_secs().max(0) as u64;
    let d = key.delegate(
        &rand::random(),
        now.saturating_sub(3600),
        now.saturating_add(2 * rotation.as_secs().max(1)),
    );
    let (mint, maxt) = d.window();
    info!("roughtime ml-dsa-44: online key valid {mint} .. {maxt} (Unix seconds)");
    d
}

/// Replaces the ML-DSA-44 online key every rotation, until the task is stopped.
pub(crate) async fn rotate_pq(pq: Pq) -> Result<(), ServiceError> {
    fail::fail_point!("roughtime-mldsa-keys", |_| Err(
        crate::service::fail_point_error("roughtime-mldsa-keys")
    ));
    let mut ticks = tokio::time::interval(pq.rotation);
    ticks.tick().await; // the first tick is immediate; the key made at start is fresh
    loop {
        ticks.tick().await;
        pq.now.store(Arc::new(pq_delegation(&pq.key, pq.rotation)));
    }
}

/// Reads the suite's long-term key file, refusing one that others may read.
pub(crate) fn load_key(file: &Path) -> Result<Zeroizing<[u8; 32]>, String> {
    let text = chime_keyfile::read_existing(file, "an ML-DSA-44 long-term key")
        .map_err(|e| e.to_string())?;
    chime_roughtime::mldsa::parse_key_file(&text).map_err(|e| format!("{}: {e}", file.display()))
}

/// The suite, if it has its key: the online key in force, which [`rotate_pq`] (a service the
/// daemon supervises) replaces every `rotation`.
pub(crate) fn start(
    key: Option<&(PathBuf, Zeroizing<[u8; 32]>)>,
    rotation: Duration,
) -> Option<Pq> {
    let (file, seed) = key?;
    let key = PqLongTermKey::from_seed(seed);
    warn!(
        "roughtime: EXPERIMENTAL ML-DSA-44 suite (0x90000001, part of no draft) served over TCP, \
         long-term key from {}; public key (base64): {}",
        file.display(),
        BASE64.encode(key.public_key())
    );
    Some(Pq::new(key, rotation))
}

/// The TCP signer's side of the suite: the online key in force, a responder, and the batch of
/// requests that offered it.
pub(super) struct Signer {
    now: Now,
    responder: PqResponder,
    jobs: Vec<Job>,
}

impl Signer {
    pub(super) fn new(now: Now) -> Self {
        Self {
            now,
            responder: PqResponder::new(MAX_BATCH_SIZE),
            jobs: Vec::new(),
        }
    }

    /// Takes the requests that offer the suite out of `jobs` and answers them.
    pub(super) fn answer_offered(
        &mut self,
        jobs: &mut Vec<Job>,
        shared: &Shared,
        stats: &mut WorkerStats<RoughtimeDrop>,
    ) {
        let (theirs, ours): (Vec<Job>, Vec<Job>) = jobs
            .drain(..)
            .partition(|j| chime_roughtime::mldsa::offered(&j.packet));
        *jobs = ours;
        self.jobs = theirs;
        if !self.jobs.is_empty() {
            answer(
                &mut self.responder,
                &self.now.load(),
                shared,
                stats,
                &self.jobs,
            );
        }
    }
}

/// One batch of the suite: the same checks and counts as Roughtime over TCP's, one
/// ML-DSA-44 signature over its tree.
fn answer(
    responder: &mut PqResponder,
    delegation: &PqDelegation,
    shared: &Shared,
    stats: &mut WorkerStats<RoughtimeDrop>,
    jobs: &[Job],
) {
    let Some(serving) = serve::begin(shared, stats, jobs.len()) else {
        refuse_all(jobs);
        return;
    };
    responder.clear();
    let mut taken = Vec::with_capacity(jobs.len());
    for job in jobs {
        let added = serving.admits(job.peer, stats)
            && responder
                .add(&job.packet, delegation)
                .map_err(|why| stats.counts.drop(RoughtimeDrop::Request(why)))
                .is_ok();
        if added {
            taken.push(job);
        } else {
            let _ = job.reply.try_send(Reply::Dropped);
        }
    }
    if !taken.is_empty() {
        match responder.sign(serving.now_unix_us(), serving.radius_us(), delegation) {
            Ok(replies) => {
                for (job, reply) in taken.iter().zip(replies) {
                    stats.counts.answered += 1;
                    stats.counts.note(Note::Mldsa44, true);
                    let _ = job.reply.try_send(Reply::Signed(reply));
                }
            }
            Err(why) => {
                for job in &taken {
                    stats.counts.drop(RoughtimeDrop::Request(why));
                    let _ = job.reply.try_send(Reply::Dropped);
                }
            }
        }
    }
    serving.finish(stats);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roughtime::job::testing::{answers, jobs, stats};
    use crate::roughtime::serve::testing::shared;
    use crate::roughtime::state::RoughtimeDrop;

    #[test]
    fn the_mldsa_online_key_covers_now() {
        let pq = Pq::new(PqLongTermKey::from_seed(&[6; 32]), Duration::from_secs(600));
        let now = crate::clock::read().unix_secs() as u64;
        let (mint, maxt) = pq.now.load().window();
        assert!(mint < now && now < maxt, "{mint} {now} {maxt}");
    }

    #[test]
    fn the_mldsa_suite_follows_the_same_rule() {
        let key = PqLongTermKey::from_seed(&[9; 32]);
        let pq = Pq::new(key, Duration::from_secs(3600));
        let packet = chime_roughtime::mldsa::build_request(&[3; 32], &pq.key.public_key());
        for (synchronised, deny, peer, answered, reason) in [
            (true, &[][..], "192.0.2.1", true, None),
            (
                false,
                &[][..],
                "192.0.2.1",
                false,
                Some(RoughtimeDrop::Unsynchronised),
            ),
            (
                true,
                &["198.51.100.0/24"][..],
                "198.51.100.9",
                false,
                Some(RoughtimeDrop::Denied),
            ),
        ] {
            let shared = shared(synchronised, deny);
            let (jobs, rx) = jobs(std::slice::from_ref(&packet), peer);
            let mut stats = stats();
            let mut responder = PqResponder::new(MAX_BATCH_SIZE);
            answer(&mut responder, &pq.now.load(), &shared, &mut stats, &jobs);
            let replies = answers(rx);
            assert_eq!(replies[0].is_some(), answered, "{synchronised} {peer}");
            if let Some(reason) = reason {
                assert_eq!(stats.counts.dropped(reason), 1, "{synchronised} {peer}");
            }
        }
    }
}
