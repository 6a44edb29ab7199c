//! SIGHUP: what can change without a restart is loaded again, and anything that fails to load is
//! reported with the state before kept: the NTS certificate and key, the NTS pool tokens, the NTS
//! fleet secret, the Roughtime delegation bundle, the access rules and the rate limits (of the
//! limiters on) from the config file, and the timezone in timezone-offset mode. What changed in
//! the file and needs a restart is logged by key and kept for `chime status`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arc_swap::ArcSwap;
use tracing::{info, warn};

use crate::access::Rules;
use crate::clock::published::Published;
use crate::clock::tz;
use crate::config::{self, Args, Settings};
use crate::nts::{ke as nts_ke, keys as nts_keys};
use crate::roughtime::keys as online_keys;

/// A fleet member's NTS keys (`--nts-fleet-key`): the secret file and the periods, the secrets in
/// force (SIGHUP replaces them), and the cookie keys derived from them.
pub(crate) struct FleetKeys {
    pub(crate) path: PathBuf,
    pub(crate) rotation: nts_keys::Rotation,
    pub(crate) secrets: Arc<ArcSwap<nts_keys::FleetSecrets>>,
    pub(crate) cookies: nts_keys::InForce,
}

/// Where the NTS-KE's TLS configuration in force lives, its certificate and key files, and where
/// the certificate's expiry is published.
pub(crate) struct NtsTls {
    pub(crate) tls: Arc<ArcSwap<rustls::ServerConfig>>,
    pub(crate) files: (PathBuf, PathBuf),
    pub(crate) counts: Arc<nts_ke::KeCounts>,
    /// `--nts-pool-tokens`'s file, and the tokens in force.
    pub(crate) pool: Option<(PathBuf, Arc<ArcSwap<chime_ntp::nts::PoolTokens>>)>,
    /// `--nts-ratelimit`'s table, whose limits a reload replaces.
    pub(crate) limiter: Option<Arc<chime_ntp::ClientTable>>,
}

/// The log filter in force, which a reload may replace.
pub(crate) type LogFilter =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Everything a reload replaces, as the services run it.
pub(crate) struct Reloadable {
    /// The log filter, and the level or filter it was last given.
    pub(crate) log: (LogFilter, std::sync::Mutex<String>),
    pub(crate) clock: Arc<Published>,
    pub(crate) access: Arc<Rules>,
    pub(crate) nts: Option<NtsTls>,
    pub(crate) fleet: Option<FleetKeys>,
    pub(crate) roughtime: Option<Arc<crate::roughtime::state::Shared>>,
    /// The settings the config file changed that take effect at a restart, as the last reload
    /// found them (for `chime status`).
    pub(crate) restart: Arc<std::sync::Mutex<Vec<String>>>,
    /// `--ratelimit`'s table, whose limits a reload replaces.
    pub(crate) ntp_limiter: Option<Arc<chime_ntp::ClientTable>>,
    /// Shedding's settings, if it is on.
    pub(crate) shed: Option<Arc<chime_udp::ShedTuning>>,
}

impl Reloadable {
    /// Reloads everything that can change without a restart.
    pub(crate) fn reload(&self, args: &Args, settings: &Settings) {
        if let Some(f) = &self.fleet {
            nts_ke::reload_fleet(&f.path, &f.secrets, &f.cookies, f.rotation);
        }
        if let (Some(file), Some(shared)) = (&settings.roughtime.delegation, &self.roughtime) {
            online_keys::reload_bundle(file, shared);
        }
        if let Some(nts) = &self.nts {
            nts.reload();
        }
        match config::reload(args, settings) {
            Ok(Some(new)) => {
                self.log_level(&new.log_level);
                for key in &new.restart {
                    warn!("SIGHUP: {key} changed in the config file; it takes effect at a restart");
                }
                *self
                    .restart
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    new.restart.iter().map(ToString::to_string).collect();
                let nts_limiter = self.nts.as_ref().and_then(|n| n.limiter.as_ref());
                for (table, limit, name) in [
                    (self.ntp_limiter.as_ref(), new.ntp_rate_limit, "ratelimit"),
                    (nts_limiter, new.nts_rate_limit, "ntsratelimit"),
                ] {
                    if let (Some(table), Some(limit)) = (table, limit)
                        && table.limit() != limit
                    {
                        table.set_limit(limit);
                        if name == "ratelimit" {
                            self.limit_in_driver(limit);
                        }
                        info!("SIGHUP: {name} {limit} in force");
                    }
                }
                if let (Some(tuning), Some(cfg)) = (&self.shed, new.shed)
                    && tuning.get() != cfg
                {
                    tuning.set(cfg);
                    info!(
                        "SIGHUP: shedding past {} ms of queueing for {} ms in force",
                        cfg.target.as_secs_f64() * 1e3,
                        cfg.interval.as_secs_f64() * 1e3
                    );
                }
                // Logged once in force, so that whoever reads the line can rely on it.
                let shown = format!("{:?}", new.acl);
                self.access.replace(new.acl);
                info!("SIGHUP: access rules reloaded: {shown}");
            }
            Ok(None) => info!("SIGHUP: no config file, so no access rules to reload"),
            Err(e) => warn!("SIGHUP: {e}; keeping the access rules in force"),
        }
        if let Some(zone) = settings.tz_offset() {
            info!("SIGHUP: re-reading the timezone");
            if let Err(e) = load_zone(zone, &self.clock, true) {
                warn!("{e}; keeping the zone loaded before");
            }
        }
    }
}

impl Reloadable {
    /// `--xdp-in-driver`: `limit` in force in the driver too.
    fn limit_in_driver(&self, limit: chime_ntp::RateLimit) {
        if let Some(maps) = self.clock.driver()
            && let Err(e) = crate::ntp::limit_in_driver(maps, Some(limit))
        {
            warn!(
                "SIGHUP: cannot write ratelimit {limit} into the driver ({e}); it keeps the last"
            );
        }
    }

    /// Puts `level` in force if it is not the one in force.
    fn log_level(&self, level: &str) {
        let (filter, in_force) = &self.log;
        let mut in_force = in_force
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *in_force == level {
            return;
        }
        match filter.reload(tracing_subscriber::EnvFilter::new(level)) {
            Ok(()) => {
                level.clone_into(&mut in_force);
                info!("SIGHUP: log level now {level}");
            }
            Err(e) => warn!("SIGHUP: log level {level}: {e}; keeping the one in force"),
        }
    }
}

impl NtsTls {
    fn reload(&self) {
        let (certificate, private_key) = &self.files;
        match nts_ke::load(certificate, private_key) {
            Ok(loaded) => {
                self.tls.store(loaded.config);
                self.counts
                    .certificate_not_after
                    .store(loaded.not_after.unwrap_or(i64::MIN), Ordering::Relaxed);
                info!(
                    "SIGHUP: NTS certificate reloaded from {}",
                    certificate.display()
                );
                nts_ke::log_expiry(certificate, loaded.not_after);
            }
            Err(e) => warn!("SIGHUP: NTS certificate: {e}; keeping the one in force"),
        }
        if let Some((file, tokens)) = &self.pool {
            match nts_keys::load_pool_tokens(file) {
                Ok(loaded) => {
                    let n = loaded.len();
                    tokens.store(Arc::new(loaded));
                    info!(
                        "SIGHUP: NTS pool tokens reloaded from {}: {n}",
                        file.display()
                    );
                }
                Err(e) => warn!("SIGHUP: NTS pool tokens: {e}; keeping those in force"),
            }
        }
    }
}

/// Loads the timezone-offset mode's zone (afresh from disk on a reload) and publishes it to the
/// workers, with the warning every start (and reload) owes the operator.
pub(crate) fn load_zone(
    name: Option<&str>,
    clock: &Published,
    reload: bool,
) -> Result<(), tz::ZoneError> {
    let (zone, description) = if reload {
        tz::reload(name)?
    } else {
        tz::load(name)?
    };
    clock.set_zone(zone);
    warn!(
        "timezone-offset mode: NTP replies carry the local time of {description} as if it \
         were UTC; clients that expect UTC will be wrong by that offset (Roughtime is never shifted)"
    );
    Ok(())
}
