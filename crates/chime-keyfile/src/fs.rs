//! Key files on disk. A key file is made mode 0600 and, once made, never overwritten ([`create`]);
//! a file of keys that the daemon itself rotates is replaced whole, never seen half written
//! ([`replace`]). A key file is read only if no one but its owner may read it ([`read`]).
//!
//! One exception to the last: systemd's credentials directory (`$CREDENTIALS_DIRECTORY`, from
//! `LoadCredential=` and the like). systemd makes that directory private to the service and gives
//! the service's user read access to each credential through an ACL, so `stat` shows a group
//! read bit (the ACL mask) on a file no one else can read. There a group bit is accepted; a bit for
//! others never is.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// Why a key file could not be read; names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Reading it failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is a directory, a device, ...
    #[error("{}: not a regular file", path.display())]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// Someone but its owner may read it.
    #[error(
        "{}: readable by group or others (mode {mode:04o}); it holds {holds}: run chmod 600 on it",
        path.display()
    )]
    Readable {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// What it holds, as [`read`] was told.
        holds: &'static str,
    },
    /// There is no such file, and there must be one ([`read_existing`]).
    #[error("{}: no such file", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// Its bytes are not text (UTF-8), as a key file's are.
    #[error("{}: not a key file: not text (UTF-8)", path.display())]
    NotText {
        /// The file.
        path: PathBuf,
    },
}

/// The text of the key file at `path` (`holds` says what it holds, for the error), or `None` if
/// there is no such file. Refused if group or others may read it (see the module's docs for
/// systemd's credentials).
pub fn read(path: &Path, holds: &'static str) -> Result<Option<Zeroizing<String>>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_file() {
        return Err(ReadError::NotAFile {
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
    // Read at once into a buffer of the file's size: no reallocation leaves a copy behind.
    // Bytes that are not text are wiped all the same.
    match String::from_utf8(std::fs::read(path).map_err(io)?) {
        Ok(text) => Ok(Some(Zeroizing::new(text))),
        Err(e) => {
            drop(Zeroizing::new(e.into_bytes()));
            Err(ReadError::NotText {
                path: path.to_owned(),
            })
        }
    }
}

/// [`read`], for a file that must exist.
pub fn read_existing(path: &Path, holds: &'static str) -> Result<Zeroizing<String>, ReadError> {
    read(path, holds)?.ok_or_else(|| ReadError::Missing {
        path: path.to_owned(),
    })
}

/// Writes `text` to a new file at `path`, mode 0600, and syncs it. An existing file is an error
/// (`AlreadyExists`), never overwritten: a key lost to a typo cannot be made again.
pub fn create(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Puts `text` at `path` in place of what was there: written to a new file beside it (mode 0600,
/// synced) and renamed over it, so the file is never seen half written or readable by others.
/// For keys the daemon makes and rotates itself, never for a key an operator made.
pub fn replace(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = create(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Refuses `mode` for a key file at `path` if group or others may read it, but allows a group
/// bit inside `credentials`, systemd's credentials directory.
fn check_mode(
    path: &Path,
    mode: u32,
    credentials: Option<&Path>,
    holds: &'static str,
) -> Result<(), ReadError> {
    let in_credentials = credentials.is_some_and(|dir| {
        let canonical = |p: &Path| std::fs::canonicalize(p).ok();
        match (canonical(dir), canonical(path)) {
            (Some(dir), Some(file)) => file.starts_with(dir),
            _ => false,
        }
    });
    let forbidden = if in_credentials { 0o007 } else { 0o077 };
    if mode & forbidden != 0 {
        return Err(ReadError::Readable {
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

    #[test]
    fn a_created_file_is_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        create(&path, "secret 00\n").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = create(&path, "secret 11\n").unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(*read_existing(&path, "a key").unwrap(), "secret 00\n");
    }

    #[test]
    fn a_replaced_file_is_private_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "old\n").unwrap();
        replace(&path, "new\n").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn readable_missing_and_odd_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        assert!(read(&path, "a key").unwrap().is_none());
        let e = read_existing(&path, "a key").unwrap_err().to_string();
        assert_eq!(e, format!("{}: no such file", path.display()));
        std::fs::write(&path, "x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read(&path, "a key").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: readable by group", path.display())),
            "{e}"
        );
        let e = read(dir.path(), "a key").unwrap_err().to_string();
        assert!(e.ends_with(": not a regular file"), "{e}");
        std::fs::write(&path, [0x9f, 0x00, 0xff, 0x10]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read(&path, "a key").unwrap_err().to_string();
        assert_eq!(
            e,
            format!("{}: not a key file: not text (UTF-8)", path.display())
        );
    }
}
