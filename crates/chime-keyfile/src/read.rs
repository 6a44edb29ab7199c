//! Reading a key file's text: its key lines, and each line's words, decoded.

use std::str::{Lines, SplitWhitespace};

use zeroize::Zeroizing;

use crate::KeyFileError;

/// The key lines of `text` in order, each with its line number; blank lines and lines starting
/// with `#` (after leading whitespace) are skipped.
pub fn key_lines(text: &str) -> KeyLines<'_> {
    KeyLines {
        lines: text.lines().enumerate(),
    }
}

/// The key line of a file that holds exactly one: [`KeyFileError::Empty`] if there is none, and
/// [`KeyFileError::TrailingJunk`] at the second if there are more.
pub fn single_line(text: &str) -> Result<KeyLine<'_>, KeyFileError> {
    let mut lines = key_lines(text);
    let first = lines.next().ok_or(KeyFileError::Empty)?;
    match lines.next() {
        Some(second) => Err(KeyFileError::TrailingJunk {
            line: second.number,
            what: "the key line",
        }),
        None => Ok(first),
    }
}

/// The key lines of a text ([`key_lines`]).
#[derive(Clone)]
pub struct KeyLines<'a> {
    lines: std::iter::Enumerate<Lines<'a>>,
}

impl<'a> Iterator for KeyLines<'a> {
    type Item = KeyLine<'a>;

    fn next(&mut self) -> Option<KeyLine<'a>> {
        loop {
            let (i, raw) = self.lines.next()?;
            let line = raw.trim();
            if !line.is_empty() && !line.starts_with('#') {
                return Some(KeyLine {
                    number: i + 1,
                    words: line.split_whitespace(),
                });
            }
        }
    }
}

impl std::fmt::Debug for KeyLines<'_> {
    // The text holds secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyLines(..)")
    }
}

/// One key line: its number, and its words, taken in order. Every error it gives names the line.
/// A clone looks ahead without taking.
#[derive(Clone)]
pub struct KeyLine<'a> {
    number: usize,
    words: SplitWhitespace<'a>,
}

impl<'a> KeyLine<'a> {
    /// The line's number in the file, 1-based.
    pub fn number(&self) -> usize {
        self.number
    }

    /// The next word, which is the line's label when taken first; `""` past the last word.
    pub fn label(&mut self) -> &'a str {
        self.words.next().unwrap_or("")
    }

    /// The next word as it is, named `what` in the error if the line has no more.
    pub fn word(&mut self, what: &'static str) -> Result<&'a str, KeyFileError> {
        self.words.next().ok_or(KeyFileError::MissingWord {
            line: self.number,
            what,
        })
    }

    /// The next word as exactly `N` bytes of hex (`2 * N` digits, either case), in a buffer wiped
    /// when dropped.
    pub fn hex<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<Zeroizing<[u8; N]>, KeyFileError> {
        let digits = self.word(what)?;
        let line = self.number;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyFileError::BadHex { line, what });
        }
        if digits.len() != 2 * N {
            return Err(KeyFileError::WrongLength {
                line,
                what,
                found: digits.len(),
                expected: 2 * N,
            });
        }
        let mut bytes = Zeroizing::new([0u8; N]);
        hex::decode_to_slice(digits, &mut bytes[..])
            .map_err(|_| KeyFileError::BadHex { line, what })?;
        Ok(bytes)
    }

    /// The next word as a decimal number of type `T`.
    pub fn decimal<T: std::str::FromStr>(&mut self, what: &'static str) -> Result<T, KeyFileError> {
        let line = self.number;
        self.word(what)?
            .parse()
            .map_err(|_| KeyFileError::BadNumber { line, what })
    }

    /// The next word as a `u32` in hex (a key id; [`Field::HexU32`](crate::Field::HexU32) writes
    /// one as 8 digits).
    pub fn hex_u32(&mut self, what: &'static str) -> Result<u32, KeyFileError> {
        let (digits, line) = (self.word(what)?, self.number);
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyFileError::BadHex { line, what });
        }
        u32::from_str_radix(digits, 16).map_err(|_| KeyFileError::BadNumber { line, what })
    }

    /// The end of the line: an error if a word is left after `what`, the last word taken.
    pub fn end(mut self, what: &'static str) -> Result<(), KeyFileError> {
        match self.words.next() {
            Some(_) => Err(KeyFileError::TrailingJunk {
                line: self.number,
                what,
            }),
            None => Ok(()),
        }
    }

    /// [`KeyFileError::WrongLabel`] for this line: the lines that would do are `expected`.
    pub fn wrong_label(&self, expected: &'static str) -> KeyFileError {
        KeyFileError::WrongLabel {
            line: self.number,
            expected,
        }
    }

    /// [`KeyFileError::Repeated`] for this line, a second `what` line.
    pub fn repeated(&self, what: &'static str) -> KeyFileError {
        KeyFileError::Repeated {
            line: self.number,
            what,
        }
    }

    /// [`KeyFileError::InvalidLine`] for this line.
    pub fn invalid(&self, what: &'static str) -> KeyFileError {
        KeyFileError::InvalidLine {
            line: self.number,
            what,
        }
    }
}

impl std::fmt::Debug for KeyLine<'_> {
    // The words hold secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyLine")
            .field("number", &self.number)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The secret of a `secret HEX` file, as a kind of file would read it.
    fn secret(text: &str) -> Result<[u8; 4], KeyFileError> {
        let mut line = single_line(text)?;
        if line.label() != "secret" {
            return Err(line.wrong_label("`secret HEX`"));
        }
        let bytes = line.hex::<4>("the secret")?;
        line.end("the secret")?;
        Ok(*bytes)
    }

    #[test]
    fn comments_blank_lines_case_and_spacing_do_not_matter() {
        let text = "# made by a test\n\n  # indented\n\tsecret   0a0B0c0D  \n\n";
        assert_eq!(secret(text), Ok([0x0a, 0x0b, 0x0c, 0x0d]));
        let numbers: Vec<usize> = key_lines("#\na\n\nb\n# c\n").map(|l| l.number()).collect();
        assert_eq!(numbers, [2, 4]);
    }

    #[test]
    fn each_fault_is_named_with_its_line() {
        use KeyFileError::*;
        for (text, error) in [
            ("", Empty),
            ("# only a comment\n\n", Empty),
            (
                "secrte 00000000\n",
                WrongLabel {
                    line: 1,
                    expected: "`secret HEX`",
                },
            ),
            (
                "secret 0000000g\n",
                BadHex {
                    line: 1,
                    what: "the secret",
                },
            ),
            (
                "#\nsecret 0x000000\n",
                BadHex {
                    line: 2,
                    what: "the secret",
                },
            ),
            (
                "secret 000000\n",
                WrongLength {
                    line: 1,
                    what: "the secret",
                    found: 6,
                    expected: 8,
                },
            ),
            (
                "secret\n",
                MissingWord {
                    line: 1,
                    what: "the secret",
                },
            ),
            (
                "secret 00000000 00\n",
                TrailingJunk {
                    line: 1,
                    what: "the secret",
                },
            ),
            (
                "secret 00000000\n#\nsecret 00000000\n",
                TrailingJunk {
                    line: 3,
                    what: "the key line",
                },
            ),
        ] {
            assert_eq!(secret(text), Err(error), "{text:?}");
        }
    }

    #[test]
    fn multi_byte_characters_are_not_hex_and_do_not_panic() {
        // Eight bytes, as long as the digits would be.
        let e = secret("secret 000000é\n").unwrap_err();
        assert_eq!(
            e,
            KeyFileError::BadHex {
                line: 1,
                what: "the secret"
            }
        );
    }

    #[test]
    fn numbers_and_key_ids() {
        let mut line = key_lines("made 1795000000 -3 1a2b3c4d 0x1 +1 123456789\n")
            .next()
            .unwrap();
        assert_eq!(line.label(), "made");
        assert_eq!(line.decimal::<i64>("the time"), Ok(1_795_000_000));
        assert_eq!(line.decimal::<i64>("the time"), Ok(-3));
        assert_eq!(line.hex_u32("the id"), Ok(0x1a2b_3c4d));
        let bad_hex = KeyFileError::BadHex {
            line: 1,
            what: "the id",
        };
        assert_eq!(line.hex_u32("the id"), Err(bad_hex));
        assert_eq!(line.hex_u32("the id"), Err(bad_hex), "no sign");
        let too_big = KeyFileError::BadNumber {
            line: 1,
            what: "the id",
        };
        assert_eq!(line.hex_u32("the id"), Err(too_big));
        assert_eq!(line.label(), "");
        let mut line = key_lines("made soon\n").next().unwrap();
        line.label();
        let bad = KeyFileError::BadNumber {
            line: 1,
            what: "the time",
        };
        assert_eq!(line.decimal::<u64>("the time"), Err(bad));
    }

    #[test]
    fn errors_read_as_one_line() {
        let e = KeyFileError::WrongLength {
            line: 3,
            what: "the secret",
            found: 62,
            expected: 64,
        };
        assert_eq!(e.to_string(), "line 3: the secret is 62 hex digits, not 64");
        let e = KeyFileError::Missing { what: "`secret`" };
        assert_eq!(e.to_string(), "no `secret` line");
    }

    #[test]
    fn debug_shows_no_words() {
        let line = key_lines("secret 0123abcd\n").next().unwrap();
        let shown = format!("{line:?} {:?}", key_lines("secret 0123abcd\n"));
        assert!(!shown.contains("0123"), "{shown}");
    }
}
