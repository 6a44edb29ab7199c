//! The second step after `resolve`: what the settings name on this machine, read and checked.
//! The Roughtime long-term key or delegation bundle and the ML-DSA key, the NTS certificate and
//! key (into a rustls configuration), the NTS fleet secret and saved cookie keys; and the user,
//! root directory and timezone looked up, so that a name that does not exist stops chimed at
//! start rather than after the sockets are bound. An error names the key that named the file.

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::Settings;
use super::resolve::{Resolved, Sources};
use super::secret_file::SecretFileError;
use super::{ConfigError, Fleet, KeyFile, Nts, NtsSet, Roughtime, RoughtimeKeys, RoughtimeSet};

/// Fills in what `resolve` left to be read.
pub(super) fn load(resolved: Resolved) -> Result<Settings, ConfigError> {
    let Resolved {
        mut settings,
        nts,
        fleet,
        roughtime,
        sources: s,
    } = resolved;
    if let Some(u) = &settings.user {
        match nix::unistd::User::from_name(u) {
            Ok(Some(_)) => {}
            Ok(None) => return Err(s.bad("process.user", format!("no such user '{u}'"))),
            Err(e) => return Err(s.bad("process.user", format!("cannot look up '{u}': {e}"))),
        }
    }
    if let Some(r) = settings.root.as_ref().filter(|r| !r.is_dir()) {
        return Err(s.bad(
            "process.root",
            format!("{} is not a directory", r.display()),
        ));
    }
    if let Some(zone) = &settings.tz_offset {
        crate::clock::tz::load(zone.as_deref()).map_err(|r| s.bad("tz-offset.timezone", r))?;
    }
    settings.nts_fleet = match fleet {
        None => None,
        Some((path, period)) => Some(Fleet {
            secrets: crate::nts::keys::load_fleet(&path).map_err(|r| s.bad("nts.fleet-key", r))?,
            path,
            period,
        }),
    };
    settings.nts = nts.map(|plan| nts_keys(plan, &s)).transpose()?;
    settings.roughtime = roughtime.map(|plan| roughtime_keys(plan, &s)).transpose()?;
    Ok(settings)
}

fn nts_keys(set: NtsSet, s: &Sources) -> Result<Nts, ConfigError> {
    let loaded = crate::nts::ke::load(&set.certificate, &set.private_key)
        .map_err(|r| s.bad("nts.certificate", r))?;
    let dump = match &set.dump_dir {
        None => None,
        Some(dir) => {
            if !dir.is_dir() {
                let r = format!("{}: not a directory", dir.display());
                return Err(s.bad("nts.dump-dir", r));
            }
            let file = crate::nts::keys::path_in(dir);
            let saved = crate::nts::keys::load(&file).map_err(|r| s.bad("nts.dump-dir", r))?;
            Some((file, saved))
        }
    };
    Ok(Nts {
        set,
        tls: loaded.config,
        not_after: loaded.not_after,
        dump,
    })
}

fn roughtime_keys(set: RoughtimeSet, s: &Sources) -> Result<Roughtime, ConfigError> {
    let mldsa = match &set.mldsa_key {
        None => None,
        // `resolve` refuses the key where the suite is not built in.
        #[cfg(not(feature = "mldsa"))]
        Some(_) => None,
        #[cfg(feature = "mldsa")]
        Some(file) => {
            let bad = |r: &dyn std::fmt::Display| s.bad("roughtime.mldsa-key", r);
            let text = super::secret_file::read_existing(file, "an ML-DSA-44 long-term key")
                .map_err(|e| bad(&e))?;
            let seed = chime_roughtime::mldsa::parse_key_file(&text)
                .map_err(|e| bad(&format!("{}: {e}", file.display())))?;
            Some((file.clone(), Zeroizing::new(seed)))
        }
    };
    let keys = match &set.key {
        KeyFile::LongTerm(file) => RoughtimeKeys::LongTerm {
            seed: load_key(file).map_err(|r| s.bad("roughtime.key", r))?,
            file: file.clone(),
        },
        KeyFile::Bundle(file) => RoughtimeKeys::Bundle {
            bundle: load_bundle(file).map_err(|r| s.bad("roughtime.delegation", r))?,
            file: file.clone(),
        },
    };
    Ok(Roughtime { set, keys, mldsa })
}

/// Why a Roughtime key file or delegation bundle could not be loaded; names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    #[error(transparent)]
    File(#[from] SecretFileError),
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
pub(crate) fn load_bundle(path: &Path) -> Result<chime_roughtime::Bundle, KeyError> {
    let text = super::secret_file::read_existing(path, "online keys that sign as this server")?;
    chime_roughtime::Bundle::parse(&text).map_err(|source| KeyError::Bundle {
        path: path.to_owned(),
        source,
    })
}

/// Reads the long-term key file, refusing one that others may read: a leaked long-term key lets
/// anyone sign times in this server's name.
fn load_key(path: &Path) -> Result<Zeroizing<[u8; 32]>, KeyError> {
    let text = super::secret_file::read_existing(path, "the Roughtime long-term key")?;
    chime_roughtime::parse_key_file(&text)
        .map(Zeroizing::new)
        .map_err(|source| KeyError::Key {
            path: path.to_owned(),
            source,
        })
}
