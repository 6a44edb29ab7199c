//! Files that hold secrets (the Roughtime long-term key, a delegation bundle, the NTS fleet
//! secret, saved cookie keys): read only if no one but their owner may read them.
//!
//! One exception: systemd's credentials directory (`$CREDENTIALS_DIRECTORY`, from
//! `LoadCredential=` and the like). systemd makes that directory private to the service and gives
//! the service's user read access to each credential through an ACL, so `stat` shows a group
//! read bit (the ACL mask) on a file no one else can read. There a group bit is accepted; a bit for
//! others never is.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// Why a secret file could not be read; names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretFileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error(
        "{}: readable by group or others (mode {mode:04o}); it holds {holds}: run chmod 600 on it",
        path.display()
    )]
    Readable {
        path: PathBuf,
        mode: u32,
        holds: &'static str,
    },
    #[error("{}: no such file", path.display())]
    Missing { path: PathBuf },
}

/// The contents of the secret file at `path` (`holds` says what it holds, for the error), or
/// `None` if there is no such file. An error names the file.
pub(crate) fn read(
    path: &Path,
    holds: &'static str,
) -> Result<Option<Zeroizing<String>>, SecretFileError> {
    let io = |source| SecretFileError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_file() {
        return Err(SecretFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY");
    check_mode(
        path,
        meta.permissions().mode(),
        credentials.as_deref().map(Path::new),
        holds,
    )?;
    let text = std::fs::read_to_string(path).map_err(io)?;
    Ok(Some(Zeroizing::new(text)))
}

/// [`read`], for a file that must exist.
pub(crate) fn read_existing(
    path: &Path,
    holds: &'static str,
) -> Result<Zeroizing<String>, SecretFileError> {
    read(path, holds)?.ok_or_else(|| SecretFileError::Missing {
        path: path.to_owned(),
    })
}

/// Refuses `mode` for a secret file at `path` if group or others may read it, but allows a group
/// bit inside `credentials`, systemd's credentials directory.
fn check_mode(
    path: &Path,
    mode: u32,
    credentials: Option<&Path>,
    holds: &'static str,
) -> Result<(), SecretFileError> {
    let in_credentials = credentials.is_some_and(|dir| {
        let canonical = |p: &Path| std::fs::canonicalize(p).ok();
        match (canonical(dir), canonical(path)) {
            (Some(dir), Some(file)) => file.starts_with(dir),
            _ => false,
        }
    });
    let forbidden = if in_credentials { 0o007 } else { 0o077 };
    if mode & forbidden != 0 {
        return Err(SecretFileError::Readable {
            path: path.to_owned(),
            mode: mode & 0o777,
            holds,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_bits_pass_only_inside_the_credentials_directory() {
        let creds = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let (inside, outside) = (creds.path().join("k"), elsewhere.path().join("k"));
        std::fs::write(&inside, "x").unwrap();
        std::fs::write(&outside, "x").unwrap();
        let dir = Some(creds.path());
        assert!(check_mode(&inside, 0o100440, dir, "a key").is_ok());
        assert!(check_mode(&inside, 0o100400, dir, "a key").is_ok());
        let e = check_mode(&inside, 0o100444, dir, "a key")
            .unwrap_err()
            .to_string();
        assert!(e.contains("(mode 0444); it holds a key"), "{e}");
        let e = check_mode(&outside, 0o100440, dir, "a key")
            .unwrap_err()
            .to_string();
        assert!(e.contains("readable by group or others (mode 0440)"), "{e}");
        assert!(check_mode(&outside, 0o100600, dir, "a key").is_ok());
        assert!(check_mode(&inside, 0o100440, None, "a key").is_err());
        // A path that only looks as if it were inside.
        let name = elsewhere.path().file_name().unwrap();
        let sneaky = creds.path().join("..").join(name).join("k");
        assert!(check_mode(&sneaky, 0o100440, dir, "a key").is_err());
    }
}
