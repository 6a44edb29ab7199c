//! chime's key files: every kind of secret file (the Roughtime long-term keys, delegation
//! bundles, the NTS fleet secret, saved NTS cookie keys) is text of labelled hex lines, read and
//! written here and nowhere else.
//!
//! A key file is lines of words separated by whitespace. Blank lines and lines starting with `#`
//! are comments; every other line is a key line, whose first word is usually its label (`secret`,
//! `window`, ...) and whose other words are hex (secrets, public keys), decimal numbers or key ids.
//! Each kind of file says which labels it takes and what follows each; this crate does the rest:
//!
//! - [`key_lines`] walks a file's key lines, and a [`KeyLine`] hands out its words one at a time,
//!   decoded ([`KeyLine::hex`], [`KeyLine::decimal`], [`KeyLine::hex_u32`]), finishing with
//!   [`KeyLine::end`], which refuses trailing junk. [`single_line`] is a file of one key line.
//! - A [`KeyFileError`] says what is wrong and on which line, in words an operator reads in one
//!   line after the file's name; it never holds the file's text, so never a secret.
//! - A [`KeyFileWriter`] writes comments and key lines of [`Field`]s into one buffer that is wiped
//!   when dropped and grows without leaving an unwiped copy behind; secrets go in through a stack
//!   buffer that is wiped too.
//! - [`create`] and [`replace`] put a file's text on disk (mode 0600; [`create`] never overwrites),
//!   and [`read`] reads one only if no one but its owner may read it.
//!
//! The text functions do no IO, so the sans-IO protocol crates (`chime-ntp`, `chime-roughtime`)
//! read and write their files' text with them; the file functions are for `chimed` and `chime`.
//! Decoded secrets come back in [`Zeroizing`] buffers.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod fs;
mod read;
mod write;

pub use error::KeyFileError;
pub use fs::{ReadError, create, read, read_existing, replace};
pub use read::{KeyLine, KeyLines, key_lines, single_line};
pub use write::{Field, KeyFileWriter};
pub use zeroize::Zeroizing;
