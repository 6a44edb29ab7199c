//! Online-key rotation, on the control plane. The long-term key never leaves this module's
//! caller: workers only ever see a [`Delegation`] (an online key and the certificates the
//! long-term key signed for it). With a delegation bundle (`--roughtime-delegation`) there is no
//! long-term key here at all: [`follow_bundle`] moves through the bundle's windows as time
//! passes.
//!
//! Each online key is valid from a minute before it is made until two rotation intervals later,
//! and is replaced after one: the key in use always has at least one interval left, so no reply
//! carries an expired certificate even if a rotation is late by almost an interval. If the
//! control plane stalls longer than that, the responder drops requests outside the validity
//! window rather than sign them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_keyfile::{ReadError, read_existing};
use chime_roughtime::{Bundle, Delegation, LongTermKey, OnlineKey};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use tracing::{error, info, warn};
use zeroize::Zeroizing;

use crate::observe::metrics::single;
use crate::roughtime::state::Shared;
use crate::service::ServiceError;

/// How far before its making a certificate is valid: covers a reply signed in the same second
/// and a clock that steps back a little.
const BACKDATE: Duration = Duration::from_secs(60);

/// A fresh online key delegated by `key`, valid for two rotation intervals from now.
pub(crate) fn delegate(
    key: &LongTermKey,
    rotation: Duration,
) -> Result<Delegation, chime_roughtime::DelegationError> {
    let now = crate::clock::read().since_epoch.as_secs();
    let seed = Zeroizing::new(rand::random::<[u8; 32]>());
    let mint = now.saturating_sub(BACKDATE.as_secs());
    let maxt = now.saturating_add(2 * rotation.as_secs().max(1));
    key.delegate(OnlineKey::from_seed(&seed), mint, maxt)
}

pub(crate) fn describe(d: &Delegation) -> String {
    format!(
        "online key {} valid {} .. {} (Unix seconds)",
        BASE64.encode(d.online_public_key()),
        d.mint_unix_s(),
        d.maxt_unix_s()
    )
}

/// What the control plane signs with: the long-term key, which delegates fresh online keys, or a
/// bundle of delegations made where the long-term key lives.
#[derive(Debug, Clone)]
pub(crate) enum Signer {
    Key(Arc<LongTermKey>),
    /// The bundle in `Shared::bundle`.
    Bundle,
}

/// Keeps the workers' delegation current until the task is aborted.
pub(crate) async fn run(
    signer: Signer,
    rotation: Duration,
    shared: Arc<Shared>,
) -> Result<(), ServiceError> {
    fail::fail_point!("roughtime-keys", |_| Err(crate::service::fail_point_error(
        "roughtime-keys"
    )));
    match signer {
        Signer::Key(key) => rotate(key, rotation, shared).await,
        Signer::Bundle => follow_bundle(shared).await,
    }
    Ok(())
}

/// How often a bundle's windows are looked at: a window lasts hours or days.
const BUNDLE_CHECK: Duration = Duration::from_secs(60);

/// Warn once less than this is left of a bundle.
const BUNDLE_WARN_LEFT_S: u64 = 2 * 86_400;

/// The delegation to start with from `bundle`: the window covering now with the most time left;
/// outside every window, the first (if none has opened yet) or the last, which the workers will
/// not sign with since it does not cover the time (their drops say so).
pub(crate) fn from_bundle(bundle: &Bundle) -> Delegation {
    let now = crate::clock::read().since_epoch.as_secs();
    let windows = bundle.windows();
    match bundle.current(now) {
        Some(d) => {
            info!(
                "roughtime: delegation bundle: {} windows, {} s left",
                windows.len(),
                bundle.seconds_left(now)
            );
            d.clone()
        }
        None => {
            error!(
                "roughtime: no window of the delegation bundle covers now ({now}, Unix seconds): \
                 nothing is signed until one does; make a new bundle with chime delegate"
            );
            if windows[0].mint_unix_s() > now {
                windows[0].clone()
            } else {
                windows[windows.len() - 1].clone()
            }
        }
    }
}

/// Moves the workers to the current window of the bundle in `shared` whenever it changes; says
/// once when little is left, and once when the bundle has run out (each again after a new bundle
/// has put it right).
pub(crate) async fn follow_bundle(shared: Arc<Shared>) {
    let Some(held) = &shared.bundle else {
        return;
    };
    let (mut warned, mut out) = (false, false);
    let mut ticks = tokio::time::interval(BUNDLE_CHECK);
    loop {
        ticks.tick().await;
        let bundle = held.load();
        let now = crate::clock::read().since_epoch.as_secs();
        let left = bundle.seconds_left(now);
        match bundle.current(now) {
            Some(d) => {
                out = false;
                if d.online_public_key() != shared.delegation.load().online_public_key() {
                    let shown = describe(d);
                    shared.delegation.store(Arc::new(d.clone()));
                    info!("roughtime: moved to the bundle's next window: {shown}");
                }
                // Once per bundle running low: a new bundle (SIGHUP) with time left rearms it.
                if left >= BUNDLE_WARN_LEFT_S {
                    warned = false;
                } else if !warned {
                    warned = true;
                    warn!(
                        "roughtime: the delegation bundle runs out in {left} s: make a new one \
                         with chime delegate, put it in place and send chimed SIGHUP"
                    );
                }
            }
            None if !out => {
                out = true;
                error!(
                    "roughtime: the delegation bundle has run out: nothing is signed (requests \
                     are dropped and counted); make a new one with chime delegate"
                );
            }
            None => {}
        }
    }
}

/// SIGHUP with `--roughtime-delegation`: reads the bundle again and, if it loads and verifies,
/// puts it in force: the workers move to its current window at once (an atomic swap between two
/// batches: no reply is dropped or signed wrongly for it). A bundle that fails, or that covers
/// nothing now, is reported and the one in force kept.
pub(crate) fn reload_bundle(path: &Path, shared: &Shared) {
    let Some(held) = &shared.bundle else {
        return;
    };
    match load_bundle(path) {
        Ok(bundle) => {
            let now = crate::clock::read().since_epoch.as_secs();
            let Some(d) = bundle.current(now) else {
                warn!(
                    "SIGHUP: delegation bundle {}: no window covers now; keeping the one in force",
                    path.display()
                );
                return;
            };
            let shown = describe(d);
            shared.delegation.store(Arc::new(d.clone()));
            info!(
                "SIGHUP: delegation bundle reloaded from {} ({} windows, {} s left): {shown}",
                path.display(),
                bundle.windows().len(),
                bundle.seconds_left(now)
            );
            held.store(Arc::new(bundle));
        }
        Err(e) => warn!("SIGHUP: delegation bundle: {e}; keeping the one in force"),
    }
}

/// Rotates forever; the caller aborts the task at shutdown.
pub(crate) async fn rotate(key: Arc<LongTermKey>, rotation: Duration, shared: Arc<Shared>) {
    let mut ticks = tokio::time::interval(rotation);
    ticks.tick().await; // the first tick is immediate; the key made at start is fresh
    loop {
        ticks.tick().await;
        match delegate(&key, rotation) {
            Ok(d) => {
                // Logged once in force, so that whoever reads the line can rely on it.
                let shown = describe(&d);
                shared.delegation.store(Arc::new(d));
                info!("roughtime: rotated to {shown}");
            }
            // The old key keeps serving until it expires, then requests are dropped and counted.
            Err(e) => error!("roughtime: online key rotation failed: {e:#}"),
        }
    }
}

/// Writes the online key's metrics: its validity, and the end of its delegation bundle if it has
/// one.
pub(crate) fn encode(
    enc: &mut DescriptorEncoder,
    rt: &crate::roughtime::state::Shared,
) -> std::fmt::Result {
    let d = rt.delegation.load();
    single(
        enc,
        "chimed_roughtime_online_key_not_before_seconds",
        "Start of the current online key's validity (MINT), Unix seconds.",
        ConstGauge::new(d.mint_unix_s()),
    )?;
    single(
        enc,
        "chimed_roughtime_online_key_not_after_seconds",
        "End of the current online key's validity (MAXT), Unix seconds; it is replaced well \
         before.",
        ConstGauge::new(d.maxt_unix_s()),
    )?;
    if let Some(bundle) = &rt.bundle {
        let end = bundle
            .load()
            .windows()
            .last()
            .map_or(0, |d| d.maxt_unix_s());
        single(
            enc,
            "chimed_roughtime_delegation_end_seconds",
            "When the delegation bundle (--roughtime-delegation) runs out: the end of its last \
             window, Unix seconds. After it nothing is signed.",
            ConstGauge::new(end),
        )?;
    }
    Ok(())
}

/// Roughtime as `chime status` shows it: the workers' counts, the online key's window, and the
/// delegation bundle's end. A window that does not cover now is a problem (nothing is signed);
/// a bundle that runs out within a week, a warning.
pub(crate) fn status(
    rt: &crate::roughtime::state::Shared,
    health: &mut crate::control::Health,
) -> serde_json::Value {
    let now = crate::clock::read().unix_secs().max(0) as u64;
    let d = rt.delegation.load();
    if !(d.mint_unix_s()..=d.maxt_unix_s()).contains(&now) {
        health.problems.push(format!(
            "roughtime: the online key is valid from {} to {} (Unix seconds), not now: nothing is \
             signed",
            d.mint_unix_s(),
            d.maxt_unix_s()
        ));
    }
    let bundle_end =
        (rt.bundle.as_ref()).map(|b| b.load().windows().last().map_or(0, |d| d.maxt_unix_s()));
    if let Some(end) = bundle_end
        && end.saturating_sub(now) < 7 * 86_400
    {
        health.warnings.push(format!(
            "roughtime: the delegation bundle runs out in {} h: make the next one",
            end.saturating_sub(now) / 3600
        ));
    }
    serde_json::json!({
        "workers": rt.workers.total().as_json(),
        "online_key_not_before": d.mint_unix_s(),
        "online_key_not_after": d.maxt_unix_s(),
        "delegation_end": bundle_end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_online_key_covers_now_for_two_rotations_and_changes_each_time() {
        let key = LongTermKey::from_seed(&[5; 32]);
        let rotation = Duration::from_secs(3600);
        let now = crate::clock::read().since_epoch.as_secs();
        let first = delegate(&key, rotation).unwrap();
        assert!(first.mint_unix_s() <= now && now <= first.mint_unix_s() + BACKDATE.as_secs() + 1);
        let lasts = first.maxt_unix_s() - now;
        assert!((2 * 3600..=2 * 3600 + 1).contains(&lasts), "{lasts}");
        let second = delegate(&key, rotation).unwrap();
        assert_ne!(first.online_public_key(), second.online_public_key());
    }
}

/// What Roughtime signs with, loaded.
#[derive(Clone)]
pub(crate) enum RoughtimeKeys {
    /// The long-term key itself (`--roughtime-key`): online keys are made and rotated here.
    LongTerm {
        file: PathBuf,
        /// Wiped when dropped.
        seed: Zeroizing<[u8; 32]>,
    },
    /// Delegations made where the long-term key lives (`--roughtime-delegation`), every
    /// certificate already checked against the long-term public key.
    Bundle { file: PathBuf, bundle: Bundle },
}

impl RoughtimeKeys {
    pub(crate) fn file(&self) -> &Path {
        match self {
            Self::LongTerm { file, .. } | Self::Bundle { file, .. } => file,
        }
    }
}

/// Why a Roughtime key file or delegation bundle could not be loaded; names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    #[error(transparent)]
    File(#[from] ReadError),
    #[error("{}: {source}", path.display())]
    Bundle {
        path: PathBuf,
        source: chime_roughtime::BundleError,
    },
    #[error("{}: not a key file: {source}", path.display())]
    Key {
        path: PathBuf,
        source: chime_roughtime::KeyFileError,
    },
}

/// Reads a delegation bundle (`chime delegate`), refusing one that others may read (its online
/// keys sign as this server) and one whose certificates do not verify.
pub(crate) fn load_bundle(path: &Path) -> Result<Bundle, KeyError> {
    let text = read_existing(path, "online keys that sign as this server")?;
    Bundle::parse(&text).map_err(|source| KeyError::Bundle {
        path: path.to_owned(),
        source,
    })
}

/// Reads the long-term key file, refusing one that others may read: a leaked long-term key lets
/// anyone sign times in this server's name.
pub(crate) fn load_key(path: &Path) -> Result<Zeroizing<[u8; 32]>, KeyError> {
    let text = read_existing(path, "the Roughtime long-term key")?;
    chime_roughtime::parse_key_file(&text).map_err(|source| KeyError::Key {
        path: path.to_owned(),
        source,
    })
}
