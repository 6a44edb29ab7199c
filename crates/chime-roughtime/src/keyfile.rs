//! The long-term key file's text, shared by `chime keygen` (which writes it) and chimed (which
//! reads it), through `chime-keyfile`. Pure string work: opening, permissions and never
//! overwriting are the callers' business.
//!
//! The format: `#` comment lines (keygen writes the public key there, so an operator can read it
//! from the file without tools), blank lines, and exactly one line holding the 32-byte Ed25519
//! seed as 64 hexadecimal digits. That line alone has no label: files in use were written so.

use chime_keyfile::{Field, KeyFileError, KeyFileWriter, KeyLine, single_line};
use zeroize::Zeroizing;

use crate::keys::{KEY_LEN, LongTermKey};

/// The file's text for `seed`, with the public key in comments; wiped when dropped.
pub fn encode_key_file(seed: &[u8; KEY_LEN]) -> Zeroizing<String> {
    let public = LongTermKey::from_seed(seed).public_key();
    let mut file = KeyFileWriter::new();
    file.comment(
        "chime Roughtime long-term key: an Ed25519 seed. Keep this file secret (mode 0600).",
    )
    .comment(&format!("public key (hex): {}", hex::encode(public)))
    .line(&[Field::Hex(seed)]);
    file.finish()
}

/// The seed in a key file's text, in a buffer wiped when dropped.
pub fn parse_key_file(text: &str) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyFileError> {
    let mut line = single_line(text)?;
    if is_labelled(&line) {
        // Another kind of key file (`secret HEX`, `mldsa44 HEX`): say so rather than "not hex".
        return Err(line.wrong_label("the seed alone, as 64 hex digits"));
    }
    let seed = line.hex("the seed")?;
    line.end("the seed")?;
    Ok(seed)
}

/// Whether `line` starts with a word that is not hex and has more after it: a label.
fn is_labelled(line: &KeyLine<'_>) -> bool {
    let mut ahead = line.clone();
    let first = ahead.label();
    !first.bytes().all(|b| b.is_ascii_hexdigit()) && !ahead.label().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_comments() {
        let seed = [0x5a; KEY_LEN];
        let text = encode_key_file(&seed);
        assert!(text.contains("# public key (hex): "));
        assert_eq!(*parse_key_file(&text).unwrap(), seed);
        let upper = format!("\n# note\n  {}  \n", "AB".repeat(32));
        assert_eq!(*parse_key_file(&upper).unwrap(), [0xab; KEY_LEN]);
    }

    #[test]
    fn malformed_files_say_where() {
        let says = |text: &str| parse_key_file(text).unwrap_err().to_string();
        assert_eq!(
            says("# only a comment\n"),
            "empty: no key line, only blank lines and comments"
        );
        assert_eq!(says("abc\n"), "line 1: the seed is 3 hex digits, not 64");
        let two = format!("{0}\n{0}\n", "00".repeat(32));
        assert_eq!(says(&two), "line 2: trailing junk after the key line");
        let bad = format!("#\n{}zz\n", "00".repeat(31));
        assert_eq!(says(&bad), "line 2: the seed is not hex digits");
        let junk = format!("{} 00\n", "00".repeat(32));
        assert_eq!(says(&junk), "line 1: trailing junk after the seed");
        let fleet = format!("# a fleet secret\nsecret {}\n", "00".repeat(32));
        assert_eq!(
            says(&fleet),
            "line 2: expected the seed alone, as 64 hex digits"
        );
        // Multi-byte characters of the right byte length are not hex and must not panic.
        let odd = format!("{}é", "0".repeat(62));
        assert_eq!(says(&odd), "line 1: the seed is not hex digits");
    }
}
