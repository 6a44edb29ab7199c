//! NTS cookie master keys saved across restarts (`--nts-dump-dir`, chronyd's `ntsdumpdir`), and
//! derived from a fleet secret (`--nts-fleet-key`, at the end).
//!
//! A cookie is sealed under a master key that only this server holds. Kept in memory alone, the
//! keys die with the process: after a restart every client's cookies fail, every client gets a
//! NAK at its next poll and comes back for a TLS handshake at once. With a dump directory the keys
//! are written to [`FILE`] whenever they change and read back at start, so a restart (an upgrade, a
//! new configuration) costs the clients nothing.
//!
//! The file holds secrets: it is written mode 0600 beside its final name and renamed over it, so
//! it is never seen half written or readable by others, and a file that group or others may read
//! is refused at start (`chime-keyfile`'s `replace` and `read`). Its text, labelled hex lines as
//! every key file is:
//!
//! ```text
//! # chimed NTS cookie keys ...
//! made 1795312345
//! current 1a2b3c4d <64 hex digits>
//! previous 5e6f7a8b <64 hex digits>
//! previous 90a1b2c3 <64 hex digits>
//! ```
//!
//! `made` is when the current key was made, Unix seconds; it places the next rotation on the
//! schedule it had, so restarts neither skip nor postpone one. The `previous` lines are the keys
//! kept (`--nts-kept-keys`), the most recent first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use chime_keyfile::{Field, KeyFileError, KeyFileWriter, KeyLine, ReadError, key_lines};
use chime_ntp::nts::{CookieKeys, FleetSecret, KEY_LEN, parse_fleet_file};
use zeroize::Zeroizing;

/// The cookie keys in force: NTS-KE seals new cookies under the current one, the NTP workers open
/// cookies with any key kept, and the rotation (or a fleet's SIGHUP) replaces them.
pub(crate) type InForce = Arc<ArcSwap<CookieKeys>>;

/// How the cookie keys rotate (`--nts-rotation`, `--nts-kept-keys`): a new key every `every`, and
/// `kept` keys before it still opening the cookies they sealed, so that a cookie lasts `kept`
/// rotations past its own. A fleet's periods are `every` long too.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rotation {
    pub(crate) every: Duration,
    pub(crate) kept: usize,
}

impl Rotation {
    /// As the settings give it.
    pub(crate) fn of(settings: &crate::config::Settings) -> Self {
        Self {
            every: settings.nts.rotation.duration(),
            kept: settings.nts.kept_keys.0,
        }
    }

    /// The longest a cookie opens after it was sealed: through its own rotation and the kept ones.
    pub(crate) fn cookie_life(self) -> Duration {
        self.every.saturating_mul(self.kept as u32 + 1)
    }
}

/// The file's name in the dump directory.
pub(crate) const FILE: &str = "nts-cookie-keys";

/// The keys and when the current one was made.
#[derive(Clone, Debug)]
pub(crate) struct Saved {
    pub(crate) keys: CookieKeys,
    pub(crate) made_unix: i64,
}

/// Where the keys live in `dir`.
pub(crate) fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Reads the saved keys; `Ok(None)` if there is no file yet. An error names the file and, for a
/// bad line, its number.
pub(crate) fn load(path: &Path) -> Result<Option<Saved>, KeysError> {
    let Some(text) = chime_keyfile::read(path, "the NTS cookie keys")? else {
        return Ok(None);
    };
    parse(&text).map(Some).map_err(|reason| KeysError::Parse {
        path: path.to_owned(),
        reason,
    })
}

/// Why saved cookie keys or a fleet secret could not be read; names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeysError {
    #[error(transparent)]
    File(#[from] ReadError),
    #[error("{}: no such file (chime nts-fleet-key makes one)", path.display())]
    NoFleetFile { path: PathBuf },
    /// The file's contents, with the line at fault where there is one.
    #[error("{}: {reason}", path.display())]
    Parse { path: PathBuf, reason: KeyFileError },
}

/// Reads the pool token file (`--nts-pool-tokens`). An error names the file and, for a bad line,
/// its number.
pub(crate) fn load_pool_tokens(path: &Path) -> Result<chime_ntp::nts::PoolTokens, KeysError> {
    let text = chime_keyfile::read_existing(path, "NTS pool tokens")?;
    chime_ntp::nts::parse_pool_tokens(&text).map_err(|reason| KeysError::Parse {
        path: path.to_owned(),
        reason,
    })
}

/// A fleet's secrets (`--nts-fleet-key`): the one that seals, and the previous one while the
/// fleet replaces it.
pub(crate) type FleetSecrets = (FleetSecret, Option<FleetSecret>);

/// `--nts-fleet-key`'s file, the secrets it held when last read, and the period each key is for
/// with the periods kept before it.
pub(crate) struct Fleet {
    pub(crate) path: PathBuf,
    pub(crate) secrets: FleetSecrets,
    pub(crate) rotation: Rotation,
}

/// Reads the fleet secret file (`chime nts-fleet-key` makes one). An error names the file and,
/// for a bad line, its number.
pub(crate) fn load_fleet(path: &Path) -> Result<FleetSecrets, KeysError> {
    let text = chime_keyfile::read(path, "the NTS fleet secret")?.ok_or_else(|| {
        KeysError::NoFleetFile {
            path: path.to_owned(),
        }
    })?;
    parse_fleet_file(&text).map_err(|reason| KeysError::Parse {
        path: path.to_owned(),
        reason,
    })
}

/// A fleet member's keys at `now_micros` (Unix microseconds) for periods of `rotation.every`
/// (whole seconds, at least one), `rotation.kept` periods before opening too: the keys, the
/// period's number, and how long until the next begins.
pub(crate) fn fleet_keys(
    secrets: &FleetSecrets,
    rotation: Rotation,
    now_micros: u64,
) -> (CookieKeys, u64, Duration) {
    let len = rotation.every.as_secs().max(1) * 1_000_000;
    let number = now_micros / len;
    let keys = CookieKeys::for_fleet(&secrets.0, secrets.1.as_ref(), number, rotation.kept);
    let left = Duration::from_micros((number + 1) * len - now_micros);
    (keys, number, left)
}

fn parse(text: &str) -> Result<Saved, KeyFileError> {
    let (mut made, mut current, mut previous) = (None, None, Vec::new());
    for mut line in key_lines(text) {
        match line.label() {
            MADE => read_once(&mut made, line, "`made`", read_made)?,
            CURRENT => read_once(&mut current, line, "`current`", read_key)?,
            PREVIOUS => previous.push(read_key(line)?),
            _ => {
                return Err(line.wrong_label("`made SECS`, `current ID KEY` or `previous ID KEY`"));
            }
        }
    }
    if made.is_none() && current.is_none() && previous.is_empty() {
        return Err(KeyFileError::Empty);
    }
    let made_unix = made.ok_or(KeyFileError::Missing { what: "`made`" })?;
    let current = current.ok_or(KeyFileError::Missing { what: "`current`" })?;
    Ok(Saved {
        keys: CookieKeys::from_parts(*current, previous.iter().map(|key| **key)),
        made_unix,
    })
}

/// The labels of the file's lines.
const MADE: &str = "made";
const CURRENT: &str = "current";
const PREVIOUS: &str = "previous";

/// Fills `slot` from the rest of `line` with `read`; a second `what` line is an error.
fn read_once<T>(
    slot: &mut Option<T>,
    line: KeyLine<'_>,
    what: &'static str,
    read: impl FnOnce(KeyLine<'_>) -> Result<T, KeyFileError>,
) -> Result<(), KeyFileError> {
    if slot.is_some() {
        return Err(line.repeated(what));
    }
    *slot = Some(read(line)?);
    Ok(())
}

/// The rest of a `made SECS` line.
fn read_made(mut line: KeyLine<'_>) -> Result<i64, KeyFileError> {
    let made = line.decimal("the time")?;
    line.end("the time")?;
    Ok(made)
}

/// The rest of a `current ID KEY` or `previous ID KEY` line, the key wiped when dropped.
fn read_key(mut line: KeyLine<'_>) -> Result<Zeroizing<(u32, [u8; KEY_LEN])>, KeyFileError> {
    let id = line.hex_u32("the key id")?;
    let key = line.hex::<KEY_LEN>("the key")?;
    line.end("the key")?;
    Ok(Zeroizing::new((id, *key)))
}

/// The file's text, wiped when dropped, written by `chime-keyfile` so that no copy of a key is
/// left on the heap unwiped; the keys' copies on the stack are wiped too.
fn render(saved: &Saved) -> Zeroizing<String> {
    let mut file = KeyFileWriter::new();
    file.comment(
        "chimed NTS cookie keys (--nts-dump-dir): secret, rewritten whenever the keys rotate",
    )
    .line(&[Field::Word(MADE), Field::Decimal(saved.made_unix.into())]);
    let mut line = |label: &str, key: (u32, [u8; KEY_LEN])| {
        let (id, key) = &*Zeroizing::new(key);
        file.line(&[Field::Word(label), Field::HexU32(*id), Field::Hex(key)]);
    };
    line(CURRENT, saved.keys.current());
    for kept in saved.keys.kept() {
        line(PREVIOUS, kept);
    }
    file.finish()
}

/// Writes the keys to `path`: a new file, mode 0600, synced, then renamed over the old one.
pub(crate) fn save(path: &Path, saved: &Saved) -> std::io::Result<()> {
    chime_keyfile::replace(path, &render(saved))
}

/// What to serve with at start, given what was saved (if anything), the time now and the rotation
/// interval: the keys, when the current one counts as made, and how long until the next rotation.
///
/// Saved keys keep their schedule: a current key younger than one interval stays current. One
/// older missed the rotations due while chimed was down: it is rotated now, once, and the keys
/// that would have been rotated out by the missed ones are dropped (the keys never made in the
/// missed rotations count as kept, since their time passed). Keys so old that none would still be
/// kept, or none saved, give fresh keys. `fresh` makes a key with its id.
pub(crate) fn resume(
    saved: Option<Saved>,
    now_unix: i64,
    rotation: Rotation,
    mut fresh: impl FnMut() -> (u32, [u8; KEY_LEN]),
) -> Resumed {
    let (every, kept) = (rotation.every.as_secs_f64(), rotation.kept);
    let rotation = rotation.every;
    let brand_new = |fresh: &mut dyn FnMut() -> (u32, [u8; KEY_LEN])| {
        let (id, key) = fresh();
        Resumed {
            saved: Saved {
                keys: CookieKeys::new(id, key),
                made_unix: now_unix,
            },
            next_rotation: rotation,
            how: How::Fresh,
        }
    };
    let Some(saved) = saved else {
        return brand_new(&mut fresh);
    };
    // A clock that went back makes a key look younger than it is, never older than now.
    let age = (now_unix - saved.made_unix).max(0) as f64;
    // Rotations missed, the one due now among them.
    let missed = (age / every).floor();
    if missed < 1.0 {
        Resumed {
            next_rotation: Duration::from_secs_f64(every - age),
            saved,
            how: How::Kept,
        }
    } else if missed <= kept as f64 {
        let (id, key) = fresh();
        let still_kept = kept - (missed as usize - 1);
        Resumed {
            saved: Saved {
                keys: saved.keys.rotated(id, key, still_kept),
                made_unix: now_unix,
            },
            next_rotation: rotation,
            how: How::Rotated,
        }
    } else {
        Resumed {
            how: How::Expired,
            ..brand_new(&mut fresh)
        }
    }
}

/// [`resume`]'s answer.
#[derive(Debug)]
pub(crate) struct Resumed {
    pub(crate) saved: Saved,
    pub(crate) next_rotation: Duration,
    pub(crate) how: How,
}

/// What [`resume`] did with the saved keys, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// Nothing saved: fresh keys.
    Fresh,
    /// The saved keys, as they were.
    Kept,
    /// The saved current key, now kept, under a fresh current one.
    Rotated,
    /// Saved keys too old to open anything still valid: fresh keys.
    Expired,
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    /// Daily, keeping `kept` earlier keys.
    const fn daily(kept: usize) -> Rotation {
        Rotation { every: DAY, kept }
    }

    #[test]
    fn fleet_periods_follow_the_unix_clock() {
        let secrets: FleetSecrets = (FleetSecret([5; 32]), None);
        // 1_000_000.25 s after the epoch is 11 days and 49_600.25 s: period 11 of a day, with
        // 36_799.75 s of it left.
        let (keys, number, left) = fleet_keys(&secrets, daily(1), 1_000_000_250_000);
        assert_eq!(number, 11);
        assert_eq!(left, Duration::from_micros(36_799_750_000));
        assert_eq!(keys.current(), chime_ntp::nts::fleet_key(&secrets.0, 11));
        // A rotation under a second counts as one.
        let short = Rotation {
            every: Duration::from_millis(300),
            kept: 1,
        };
        let (_, number, left) = fleet_keys(&secrets, short, 7_500_000);
        assert_eq!((number, left), (7, Duration::from_micros(500_000)));
    }

    fn counter() -> impl FnMut() -> (u32, [u8; KEY_LEN]) {
        let mut n = 0u8;
        move || {
            n += 1;
            (u32::from(n), [n; KEY_LEN])
        }
    }

    fn saved(made_unix: i64) -> Saved {
        Saved {
            keys: CookieKeys::from_parts(
                (0xaa, [0xaa; KEY_LEN]),
                [(0xbb, [0xbb; KEY_LEN]), (0xcc, [0xcc; KEY_LEN])],
            ),
            made_unix,
        }
    }

    #[test]
    fn saved_keys_round_trip_through_a_private_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        assert!(load(&path).unwrap().is_none());
        save(&path, &saved(1_795_000_000)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let back = load(&path).unwrap().unwrap();
        assert_eq!(back.made_unix, 1_795_000_000);
        assert_eq!(back.keys.current(), (0xaa, [0xaa; KEY_LEN]));
        let kept: Vec<_> = back.keys.kept().collect();
        assert_eq!(kept, [(0xbb, [0xbb; KEY_LEN]), (0xcc, [0xcc; KEY_LEN])]);
        // Saving again replaces it, and leaves nothing else behind.
        save(&path, &saved(1_795_000_001)).unwrap();
        assert_eq!(load(&path).unwrap().unwrap().made_unix, 1_795_000_001);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_readable_or_damaged_file_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        save(&path, &saved(1)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&path.display().to_string()) && e.contains("644"),
            "{e}"
        );

        for (text, why) in [
            ("", "empty: no key line"),
            ("made 1\n", "no `current` line"),
            ("current 01 00\n", "line 1: the key is 2 hex digits, not 64"),
            ("made x\n", "line 1: the time is not a number"),
            ("made 1\nmade 2\n", "line 2: a second `made` line"),
            ("made 1 2\n", "line 1: trailing junk after the time"),
            (
                "made 1\ncurrent zz 00\n",
                "line 2: the key id is not hex digits",
            ),
            ("made 1\nlater 1\n", "line 2: expected `made SECS`"),
        ] {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let e = load(&path).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    /// The ids of the keys kept, the most recent first.
    fn kept_ids(keys: &CookieKeys) -> Vec<u32> {
        keys.kept().map(|(id, _)| id).collect()
    }

    #[test]
    fn saved_keys_keep_their_schedule() {
        let now = 1_795_000_000;
        let day = DAY.as_secs() as i64;

        let r = resume(None, now, daily(1), counter());
        assert_eq!(r.how, How::Fresh);
        assert_eq!(r.saved.keys.current().0, 1);
        assert!(kept_ids(&r.saved.keys).is_empty());
        assert_eq!(r.next_rotation, DAY);

        // Made 10 hours ago: kept, rotated 14 hours from now as it would have been.
        let r = resume(Some(saved(now - 36_000)), now, daily(1), counter());
        assert_eq!(r.how, How::Kept);
        assert_eq!(r.saved.keys.current().0, 0xaa);
        assert_eq!(kept_ids(&r.saved.keys), [0xbb, 0xcc]);
        assert_eq!(r.next_rotation, Duration::from_secs(50_400));

        // Made 30 hours ago: due; the saved key still opens, kept.
        let r = resume(Some(saved(now - day - 21_600)), now, daily(1), counter());
        assert_eq!(r.how, How::Rotated);
        assert_eq!(r.saved.keys.current().0, 1);
        assert_eq!(kept_ids(&r.saved.keys), [0xaa]);
        assert_eq!(r.saved.made_unix, now);

        // Two intervals old, one key kept: nothing it sealed is still valid.
        let r = resume(Some(saved(now - 2 * day)), now, daily(1), counter());
        assert_eq!(r.how, How::Expired);
        assert!(kept_ids(&r.saved.keys).is_empty());

        // Made "in the future" (the clock went back): kept, never rotated later than one interval.
        let r = resume(Some(saved(now + 3_600)), now, daily(1), counter());
        assert_eq!(r.how, How::Kept);
        assert_eq!(r.next_rotation, DAY);
    }

    /// With keys kept, a restart after days down keeps the keys that would still be kept had
    /// chimed rotated through them: the missed rotations' keys were never made, but their time
    /// passed.
    #[test]
    fn a_restart_keeps_what_the_missed_rotations_would_have_kept() {
        let now = 1_795_000_000;
        let day = DAY.as_secs() as i64;
        for (days_down, kept) in [
            (1, vec![0xaa, 0xbb, 0xcc]),
            (2, vec![0xaa, 0xbb]),
            (3, vec![0xaa]),
        ] {
            let r = resume(
                Some(saved(now - days_down * day - 60)),
                now,
                daily(3),
                counter(),
            );
            assert_eq!(r.how, How::Rotated, "{days_down} days");
            assert_eq!(kept_ids(&r.saved.keys), kept, "{days_down} days");
        }
        let r = resume(Some(saved(now - 4 * day - 60)), now, daily(3), counter());
        assert_eq!(r.how, How::Expired);
    }

    /// The committed sample (`testdata/nts-cookie-keys`, written by [`render`] from patterned test
    /// keys) still reads as the keys it holds, and writing them again gives the same bytes.
    #[test]
    fn the_saved_keys_sample_reads_and_writes_back_byte_for_byte() {
        let text = include_str!("../../testdata/nts-cookie-keys");
        let saved = parse(text).unwrap();
        assert_eq!(saved.made_unix, 1_795_000_000);
        assert_eq!(saved.keys.current(), (0x6666_6666, [0x66; KEY_LEN]));
        assert_eq!(kept_ids(&saved.keys), [0x5555_5555]);
        assert_eq!(
            saved.keys.kept().next(),
            Some((0x5555_5555, [0x55; KEY_LEN]))
        );
        assert_eq!(*render(&saved), text);
    }
}
