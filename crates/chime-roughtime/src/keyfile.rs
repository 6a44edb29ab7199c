//! The long-term key file's text format, shared by `chime keygen` (which writes it) and chimed
//! (which reads it). Pure string work: opening, permissions and never overwriting are the
//! callers' business.
//!
//! The format: `#` comment lines (keygen writes the public key there, so an operator can read it
//! from the file without tools), blank lines, and exactly one line holding the 32-byte Ed25519
//! seed as 64 hexadecimal digits.

use std::fmt::Write as _;

use zeroize::Zeroizing;

use crate::keys::{KEY_LEN, LongTermKey};

/// Why a key file's text is not a key. Never carries the secret itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// No seed line at all.
    #[error("no key line (expected 64 hex digits)")]
    Missing,
    /// More than one non-comment line.
    #[error("more than one key line (line {line})")]
    Extra {
        /// The 1-based line number of the second key line.
        line: usize,
    },
    /// The seed line is not 64 hex digits.
    #[error("line {line} is not 64 hex digits")]
    NotHex {
        /// The 1-based line number.
        line: usize,
    },
}

/// Room for a key file's whole text (236 bytes), allocated at once.
const KEY_FILE_CAPACITY: usize = 256;

/// The file's text for `seed`, with the public key in comments; wiped when dropped.
pub fn encode_key_file(seed: &[u8; KEY_LEN]) -> Zeroizing<String> {
    let public = LongTermKey::from_seed(seed).public_key();
    // Room for all of it at once: a reallocation would leave a copy of the seed behind, unwiped.
    let mut out = Zeroizing::new(String::with_capacity(KEY_FILE_CAPACITY));
    out.push_str(
        "# chime Roughtime long-term key: an Ed25519 seed. Keep this file secret (mode 0600).\n",
    );
    let _ = writeln!(out, "# public key (hex): {}", hex::encode(public));
    push_hex(&mut out, seed);
    out.push('\n');
    out
}

/// The seed in a key file's text.
pub fn parse_key_file(text: &str) -> Result<[u8; KEY_LEN], KeyFileError> {
    let mut seed = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if seed.is_some() {
            return Err(KeyFileError::Extra { line: i + 1 });
        }
        seed = Some(decode_hex::<KEY_LEN>(line).ok_or(KeyFileError::NotHex { line: i + 1 })?);
    }
    seed.ok_or(KeyFileError::Missing)
}

/// Appends `bytes` to `out` as lower-case hex, as the key file and the delegation bundle
/// ([`crate::make_bundle`]) write secrets: through a stack buffer wiped afterwards, so that no copy
/// is left but in `out`.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    let mut digits = Zeroizing::new([0u8; 128]);
    for chunk in bytes.chunks(64) {
        let digits = &mut digits[..2 * chunk.len()];
        hex::encode_to_slice(chunk, digits).expect("twice the chunk's length");
        out.push_str(std::str::from_utf8(digits).expect("hex digits are ASCII"));
    }
}

/// `N` bytes from exactly `2 * N` hex digits, as the key file and the bundle read them.
pub(crate) fn decode_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_comments() {
        let seed = [0x5a; KEY_LEN];
        let text = encode_key_file(&seed);
        assert!(text.contains("# public key (hex): "));
        assert_eq!(
            text.capacity(),
            KEY_FILE_CAPACITY,
            "written without a reallocation"
        );
        assert_eq!(parse_key_file(&text), Ok(seed));
        let upper = format!("\n# note\n  {}  \n", "AB".repeat(32));
        assert_eq!(parse_key_file(&upper), Ok([0xab; KEY_LEN]));
    }

    #[test]
    fn malformed_files_say_where() {
        assert_eq!(
            parse_key_file("# only a comment\n"),
            Err(KeyFileError::Missing)
        );
        assert_eq!(
            parse_key_file("abc\n"),
            Err(KeyFileError::NotHex { line: 1 })
        );
        let two = format!("{0}\n{0}\n", "00".repeat(32));
        assert_eq!(parse_key_file(&two), Err(KeyFileError::Extra { line: 2 }));
        let bad = format!("#\n{}zz\n", "00".repeat(31));
        assert_eq!(parse_key_file(&bad), Err(KeyFileError::NotHex { line: 2 }));
        // Multi-byte characters of the right byte length are not hex and must not panic.
        let odd = format!("{}é", "0".repeat(62));
        assert_eq!(parse_key_file(&odd), Err(KeyFileError::NotHex { line: 1 }));
    }
}
