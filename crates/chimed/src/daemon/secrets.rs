//! The step after the settings: what they name on this machine, read and checked before any
//! socket is bound. The Roughtime long-term key or delegation bundle and the ML-DSA key, the NTS
//! certificate and key (into a rustls configuration), the NTS fleet secret and saved cookie keys;
//! and the user, root directory and timezone looked up, so that a name that does not exist stops
//! chimed at start rather than after the sockets are bound. An error names the key that named
//! the file, as a bad value's does.

use std::path::PathBuf;

use zeroize::Zeroizing;

use crate::config::{ConfigError, KeyFile, Settings};
use crate::nts::{ke as nts_ke, keys as nts_keys};
use crate::roughtime::keys::{self as roughtime_keys, RoughtimeKeys};

/// Everything secret the settings name, loaded.
pub(crate) struct Secrets {
    /// NTS-KE's TLS configuration, with the certificate's expiry (Unix seconds) if it could be
    /// read; `None` without NTS-KE.
    pub(crate) tls: Option<(std::sync::Arc<rustls::ServerConfig>, Option<i64>)>,
    /// `--nts-dump-dir`'s key file, and the keys it held at start (`None`: no file yet).
    pub(crate) dump: Option<(PathBuf, Option<nts_keys::Saved>)>,
    pub(crate) fleet: Option<nts_keys::Fleet>,
    /// `--nts-pool-tokens`'s file and the tokens it held.
    pub(crate) pool: Option<(PathBuf, chime_ntp::nts::PoolTokens)>,
    pub(crate) roughtime: Option<RoughtimeKeys>,
    #[cfg_attr(not(feature = "mldsa"), allow(dead_code))]
    pub(crate) mldsa: Option<SeedFile>,
}

/// The experimental ML-DSA-44 suite's long-term key file and seed.
pub(crate) type SeedFile = (PathBuf, Zeroizing<[u8; 32]>);

/// Reads and checks everything `s` names.
pub(crate) fn load(s: &Settings) -> Result<Secrets, ConfigError> {
    if let Some(u) = &s.process.user {
        match nix::unistd::User::from_name(u) {
            Ok(Some(_)) => {}
            Ok(None) => return Err(s.bad("process.user", format!("no such user '{u}'"))),
            Err(e) => return Err(s.bad("process.user", format!("cannot look up '{u}': {e}"))),
        }
    }
    if let Some(r) = s.process.root.as_ref().filter(|r| !r.0.is_dir()) {
        let r = format!("{} is not a directory", r.0.display());
        return Err(s.bad("process.root", r));
    }
    if let Some(zone) = s.tz_offset() {
        // The system's zone is what the switch asked for when no zone is named.
        let key = zone.map_or("tz-offset.enabled", |_| "tz-offset.timezone");
        crate::clock::tz::load(zone).map_err(|r| s.bad(key, r))?;
    }
    let fleet = match &s.nts.fleet_key {
        None => None,
        Some(path) => Some(nts_keys::Fleet {
            secrets: nts_keys::load_fleet(path).map_err(|r| s.bad("nts.fleet-key", r))?,
            path: path.clone(),
            rotation: nts_keys::Rotation::of(s),
        }),
    };
    let tls = match s.nts_ke() {
        None => None,
        Some((certificate, key)) => {
            let loaded = nts_ke::load(certificate, key).map_err(|r| s.bad(r.setting(key), r))?;
            Some((loaded.config, loaded.not_after))
        }
    };
    let dump = match &s.nts.dump_dir {
        Some(dir) if !dir.is_dir() => {
            let r = format!("{}: not a directory", dir.display());
            return Err(s.bad("nts.dump-dir", r));
        }
        Some(dir) => {
            let file = nts_keys::path_in(dir);
            let saved = nts_keys::load(&file).map_err(|r| s.bad("nts.dump-dir", r))?;
            Some((file, saved))
        }
        None => None,
    };
    let pool = match &s.nts.pool_tokens {
        None => None,
        Some(path) => {
            let tokens = nts_keys::load_pool_tokens(path);
            Some((
                path.clone(),
                tokens.map_err(|r| s.bad("nts.pool-tokens", r))?,
            ))
        }
    };
    let roughtime = match s.roughtime_key() {
        None => None,
        Some(KeyFile::LongTerm(file)) => Some(RoughtimeKeys::LongTerm {
            seed: roughtime_keys::load_key(&file).map_err(|r| s.bad("roughtime.key", r))?,
            file,
        }),
        Some(KeyFile::Bundle(file)) => Some(RoughtimeKeys::Bundle {
            bundle: roughtime_keys::load_bundle(&file)
                .map_err(|r| s.bad("roughtime.delegation", r))?,
            file,
        }),
    };
    Ok(Secrets {
        tls,
        dump,
        fleet,
        pool,
        roughtime,
        mldsa: mldsa(s)?,
    })
}

/// The ML-DSA-44 key, where the suite is built in (`resolve` refuses the key elsewhere).
fn mldsa(s: &Settings) -> Result<Option<SeedFile>, ConfigError> {
    let Some(file) = &s.roughtime.mldsa_key else {
        return Ok(None);
    };
    #[cfg(feature = "mldsa")]
    {
        let seed = crate::roughtime::mldsa::load_key(file);
        let seed = seed.map_err(|r| s.bad("roughtime.mldsa-key", r))?;
        Ok(Some((file.clone(), seed)))
    }
    #[cfg(not(feature = "mldsa"))]
    {
        let _ = file;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::tests::resolve_with;

    /// The settings from `flags`, and what they name loaded.
    fn load_with(flags: &[&str]) -> Result<Secrets, ConfigError> {
        load(&resolve_with("", flags)?)
    }

    /// Writes `text` to `path` with this mode.
    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_roughtime_key_file_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        write(&key, &chime_roughtime::encode_key_file(&[7; 32]), 0o644);
        let flag = ["--roughtime-key", key.to_str().unwrap()];
        let e = load_with(&flag).err().unwrap().to_string();
        assert!(e.contains("--roughtime-key") && e.contains("0644"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let Some(RoughtimeKeys::LongTerm { seed, .. }) = load_with(&flag).unwrap().roughtime else {
            panic!("not the long-term key");
        };
        assert_eq!(*seed, [7; 32]);
        write(&key, "not a key\n", 0o600);
        let e = load_with(&flag).err().unwrap().to_string();
        assert!(e.contains("not a key file") && e.contains("line 1"), "{e}");
        let e = load(&resolve_with("[roughtime]\nkey = \"/nonexistent/key\"\n", &[]).unwrap());
        assert!(e.err().unwrap().to_string().contains("/nonexistent/key"));
    }

    #[test]
    fn a_delegation_bundle_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let long = chime_roughtime::LongTermKey::from_seed(&[7; 32]);
        let plan = chime_roughtime::BundlePlan {
            start_unix_s: 1_795_000_000,
            span_s: 86_400,
            step_s: 3600,
            window_s: 7200,
        };
        let bundle = chime_roughtime::make_bundle(&long, plan, || [9; 32]).unwrap();
        let file = dir.path().join("bundle");
        write(&file, &bundle.encode(), 0o600);
        let flag = ["--roughtime-delegation", file.to_str().unwrap()];
        let Some(RoughtimeKeys::Bundle { bundle: read, .. }) = load_with(&flag).unwrap().roughtime
        else {
            panic!("not the bundle");
        };
        assert_eq!(read.windows().len(), bundle.windows().len());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = load_with(&flag).err().unwrap().to_string();
        assert!(e.contains("readable by group or others (mode 0640)"), "{e}");
        write(&file, "frob\n", 0o600);
        let e = load_with(&flag).err().unwrap().to_string();
        assert!(
            e.ends_with("bundle: line 1: expected `long-term-public HEX` first"),
            "{e}"
        );
    }

    #[test]
    fn a_fleet_key_serves_nts_without_a_certificate_with_its_own_period() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fleet");
        write(&file, &format!("secret {}\n", "ab".repeat(32)), 0o600);
        let f = file.to_str().unwrap();
        let s = load_with(&["--nts-fleet-key", f, "--nts-rotation", "3600"]).unwrap();
        assert!(s.tls.is_none(), "no certificate: no NTS-KE");
        let fleet = s.fleet.unwrap();
        assert_eq!(fleet.rotation.every, Duration::from_secs(3600));
        assert!(fleet.secrets.1.is_none());
    }

    #[test]
    fn names_that_do_not_exist_here_are_refused() {
        let e = load_with(&["--tz-offset", "--timezone", "Nowhere/Atlantis"]);
        let e = e.err().unwrap().to_string();
        // Named once, by the flag that gave it.
        assert!(
            e.starts_with("--timezone: Nowhere/Atlantis: unknown zone"),
            "{e}"
        );
        let e = load_with(&["-u", "no-such-user-here"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("--user: no such user"), "{e}");
        let e = load_with(&["-r", "/nonexistent/root"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("--root: /nonexistent/root is not a directory"),
            "{e}"
        );
        assert!(load_with(&["--tz-offset", "--timezone", "Asia/Kolkata"]).is_ok());
    }
}
