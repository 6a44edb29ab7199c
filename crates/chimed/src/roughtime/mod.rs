//! Roughtime: the batch handler the socket and XDP workers run, the TCP transport, and the keys
//! every transport signs with (online keys delegated by a long-term key or read from a bundle).

pub(crate) mod job;
pub(crate) mod keys;
#[cfg(feature = "mldsa")]
pub(crate) mod mldsa;
pub(crate) mod serve;
pub(crate) mod state;
pub(crate) mod tcp;
pub(crate) mod udp;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_roughtime::LongTermKey;
use tracing::{info, warn};

use crate::access::Rules;
use crate::clock::published::Published;
use crate::config::schema;
use crate::roughtime::keys::RoughtimeKeys;

/// Why Roughtime cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The long-term key would not delegate an online key.
    #[error("cannot delegate an online key: {0}")]
    Delegate(#[from] chime_roughtime::DelegationError),
    /// Roughtime over TCP could not be set up on this address.
    #[error("roughtime-tcp {addr}: cannot {what}: {source}")]
    Tcp {
        addr: std::net::SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    /// Roughtime over TCP's runtime or thread could not be started.
    #[error("cannot start the Roughtime TCP {what}: {source}")]
    TcpStart {
        what: &'static str,
        source: std::io::Error,
    },
}

/// What the control plane needs to keep Roughtime's keys current: what it signs with, the
/// rotation interval, and the state the workers share.
pub(crate) type Control = (keys::Signer, Duration, Arc<state::Shared>);

/// The state every Roughtime transport shares, with the first delegation made (or taken from the
/// bundle), and what the control plane needs to keep it current. Logs what an operator needs to
/// know about it: the public key, the online key, the hashing backend, gathering and grease.
pub(crate) fn prepare(
    rt: &schema::Roughtime,
    keys: &RoughtimeKeys,
    (clock, access, stats_interval): (&Arc<Published>, &Arc<Rules>, Option<Duration>),
) -> Result<Control, Error> {
    let rotation = rt.rotation.duration();
    let (signer, delegation, public, bundle) = match keys {
        RoughtimeKeys::LongTerm { seed, .. } => {
            let key = Arc::new(LongTermKey::from_seed(seed));
            let delegation = keys::delegate(&key, rotation)?;
            let public = key.public_key();
            (keys::Signer::Key(key), delegation, public, None)
        }
        RoughtimeKeys::Bundle { bundle, .. } => (
            keys::Signer::Bundle,
            keys::from_bundle(bundle),
            bundle.long_term_public_key(),
            Some(ArcSwap::from_pointee(bundle.clone())),
        ),
    };
    info!(
        "roughtime public key (base64): {} (hex {}), from {}",
        BASE64.encode(public),
        hex::encode(public),
        keys.file().display()
    );
    info!("roughtime: {}", keys::describe(&delegation));
    info!(
        "roughtime: Merkle hashing on {}",
        match chime_sha512::Backend::detect() {
            chime_sha512::Backend::Avx512 => "AVX-512, eight requests at a time",
            chime_sha512::Backend::Avx2 => "AVX2, four requests at a time",
            _ => "one request at a time (no AVX2 or AVX-512 on this CPU)",
        }
    );
    if let Some(gather) = rt.gather.duration() {
        info!(
            "roughtime: under light load, requests are gathered for {} µs before signing (a lone \
             request never waits; --roughtime-gather 0 turns this off)",
            gather.as_micros()
        );
    }
    let (grease, grease_kinds) = (rt.grease.0, rt.grease_kinds.kinds());
    if grease > 0.0 {
        let kinds: Vec<_> = grease_kinds.iter().map(|k| k.label()).collect();
        warn!(
            "roughtime: --roughtime-grease {}: {:.3}% of replies are deliberately invalid ({}), \
             for testing clients; no production server should send these",
            grease,
            grease * 100.0,
            kinds.join(", ")
        );
    }
    let shared = Arc::new(state::Shared {
        clock: clock.clone(),
        access: access.clone(),
        stats_interval,
        delegation: ArcSwap::from_pointee(delegation),
        workers: Arc::new(crate::observe::stats::Workers::new("roughtime")),
        grease,
        grease_kinds,
        bundle,
    });
    Ok((signer, rotation, shared))
}
