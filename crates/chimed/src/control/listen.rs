//! Making the control socket, as chronyd makes its command socket: owned by the user chimed
//! starts as (root, or the unit's user), in the group chimed runs as, mode 0660, so that root and
//! that group may ask and nobody else may even connect. Made before privileges are dropped.

use std::io;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use nix::sys::stat::{Mode, umask};
use nix::unistd::{Gid, chown};

/// Why the socket could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ListenError {
    #[error("{}: another process answers on it (another chimed?)", path.display())]
    InUse { path: std::path::PathBuf },
    #[error("{}: exists and is not a socket; not replaced", path.display())]
    NotASocket { path: std::path::PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: io::Error,
    },
}

/// Binds the socket at `path`, mode 0660, its group `group` if given. A socket left there by a
/// chimed that is gone is replaced; one another process answers on is not, nor is anything that
/// is not a socket.
pub(crate) fn bind(path: &Path, group: Option<Gid>) -> Result<UnixListener, ListenError> {
    let io = |source| ListenError::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(ListenError::NotASocket {
                path: path.to_owned(),
            });
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ListenError::InUse {
                    path: path.to_owned(),
                });
            }
            Err(_) => std::fs::remove_file(path).map_err(io)?,
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    // Made with no permission for others at any moment: the mode is narrowed as it is created,
    // then opened to the group. Nothing else runs yet to be affected by the process-wide mask.
    let before = umask(Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    umask(before);
    let listener = bound.map_err(io)?;
    if let Some(gid) = group {
        chown(path, None, Some(gid)).map_err(|e| io(e.into()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(io)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_for_owner_and_group_only_and_a_stale_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chimed.sock");
        let first = bind(&path, None).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        // A live one is not taken over.
        assert!(matches!(bind(&path, None), Err(ListenError::InUse { .. })));
        drop(first);
        // One left behind is.
        let _second = bind(&path, None).unwrap();
        // Nor is a file that is not a socket replaced.
        let file = dir.path().join("file");
        std::fs::write(&file, "keep").unwrap();
        assert!(matches!(
            bind(&file, None),
            Err(ListenError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
        let missing = dir.path().join("no/such/dir/chimed.sock");
        assert!(matches!(bind(&missing, None), Err(ListenError::Io { .. })));
    }
}
