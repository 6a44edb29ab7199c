//! Online-key rotation, on the control plane. The long-term key never leaves this module's
//! caller: workers only ever see a [`Delegation`] (an online key and the certificates the
//! long-term key signed for it).
//!
//! Each online key is valid from a minute before it is made until two rotation intervals later,
//! and is replaced after one: the key in use always has at least one interval left, so no reply
//! carries an expired certificate even if a rotation is late by almost an interval. If the
//! control plane stalls longer than that, the responder drops requests outside the validity
//! window rather than sign them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_roughtime::{Delegation, LongTermKey, OnlineKey};
use tracing::{error, info};
use zeroize::Zeroizing;

use crate::roughtime_worker::Shared;

/// How far before its making a certificate is valid: covers a reply signed in the same second
/// and a clock that steps back a little.
const BACKDATE: Duration = Duration::from_secs(60);

/// A fresh online key delegated by `key`, valid for two rotation intervals from now.
pub(crate) fn delegate(key: &LongTermKey, rotation: Duration) -> Result<Delegation> {
    let now = crate::clock::read().since_epoch.as_secs();
    let seed = Zeroizing::new(rand::random::<[u8; 32]>());
    let mint = now.saturating_sub(BACKDATE.as_secs());
    let maxt = now.saturating_add(2 * rotation.as_secs().max(1));
    key.delegate(OnlineKey::from_seed(&seed), mint, maxt)
        .context("cannot delegate an online key")
}

pub(crate) fn describe(d: &Delegation) -> String {
    format!(
        "online key {} valid {} .. {} (Unix seconds)",
        BASE64.encode(d.online_public_key()),
        d.mint_unix_s(),
        d.maxt_unix_s()
    )
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
