//! Writing a key file's text, with no copy of a secret left anywhere but in the text, which is
//! wiped when dropped.

use std::fmt::Write as _;

use zeroize::Zeroizing;

/// One word of a key line, as [`KeyFileWriter::line`] writes it.
#[derive(Clone, Copy)]
pub enum Field<'a> {
    /// Written as it is: a label. It must hold no whitespace, and as a line's first word it must
    /// not start with `#`.
    Word(&'a str),
    /// A number in decimal (Unix seconds, say).
    Decimal(i128),
    /// A `u32` as 8 lower-case hex digits (a key id).
    HexU32(u32),
    /// Bytes as lower-case hex, secret or not: written through a stack buffer that is wiped
    /// afterwards.
    Hex(&'a [u8]),
}

impl std::fmt::Debug for Field<'_> {
    // `Hex` holds secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Word(w) => f.debug_tuple("Word").field(w).finish(),
            Self::Decimal(n) => f.debug_tuple("Decimal").field(n).finish(),
            Self::HexU32(n) => f.debug_tuple("HexU32").field(n).finish(),
            Self::Hex(bytes) => write!(f, "Hex({} bytes)", bytes.len()),
        }
    }
}

/// The text of a key file, written a line at a time into one buffer that is wiped when dropped.
/// When the buffer must grow, the text moves to a larger one and the old one is wiped, so no copy
/// of a secret is left behind on the heap.
pub struct KeyFileWriter {
    text: Zeroizing<String>,
}

/// Room for most key files at once; the delegation bundles grow beyond it.
const START_CAPACITY: usize = 512;

/// Room for an `i128` in decimal with its sign.
const DECIMAL_MAX_LEN: usize = 40;

/// Bytes written as hex per pass through the wiped stack buffer.
const HEX_CHUNK: usize = 64;

impl KeyFileWriter {
    /// An empty text.
    pub fn new() -> Self {
        Self::with_capacity(START_CAPACITY)
    }

    /// An empty text with room for `capacity` bytes before it first grows.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            text: Zeroizing::new(String::with_capacity(capacity)),
        }
    }

    /// Adds the comment line `# {line}`, or `#` alone for an empty `line`.
    ///
    /// # Panics
    /// If `line` holds a line break: the rest would not be a comment.
    pub fn comment(&mut self, line: &str) -> &mut Self {
        assert!(!line.contains(['\n', '\r']), "a comment is one line");
        self.reserve(line.len() + 3);
        self.text.push('#');
        if !line.is_empty() {
            self.text.push(' ');
            self.text.push_str(line);
        }
        self.text.push('\n');
        self
    }

    /// Adds a key line: `fields` separated by single spaces.
    pub fn line(&mut self, fields: &[Field<'_>]) -> &mut Self {
        debug_assert!(
            !matches!(fields.first(), Some(Field::Word(w)) if w.starts_with('#')),
            "a key line does not start with `#`"
        );
        for (i, field) in fields.iter().enumerate() {
            if i > 0 {
                self.reserve(1);
                self.text.push(' ');
            }
            self.field(field);
        }
        self.reserve(1);
        self.text.push('\n');
        self
    }

    /// The text.
    pub fn finish(self) -> Zeroizing<String> {
        self.text
    }

    fn field(&mut self, field: &Field<'_>) {
        match *field {
            Field::Word(word) => {
                debug_assert!(!word.is_empty() && !word.contains(char::is_whitespace));
                self.reserve(word.len());
                self.text.push_str(word);
            }
            Field::Decimal(n) => {
                self.reserve(DECIMAL_MAX_LEN);
                let _ = write!(self.text, "{n}");
            }
            Field::HexU32(n) => {
                self.reserve(8);
                let _ = write!(self.text, "{n:08x}");
            }
            Field::Hex(bytes) => self.push_hex(bytes),
        }
    }

    /// Appends `bytes` in hex through a stack buffer wiped afterwards, so that no copy is left but
    /// in the text. The one place in chime that writes a secret as hex.
    fn push_hex(&mut self, bytes: &[u8]) {
        self.reserve(2 * bytes.len());
        let mut digits = Zeroizing::new([0u8; 2 * HEX_CHUNK]);
        for chunk in bytes.chunks(HEX_CHUNK) {
            let digits = &mut digits[..2 * chunk.len()];
            hex::encode_to_slice(chunk, digits).expect("twice the chunk's length");
            self.text
                .push_str(std::str::from_utf8(digits).expect("hex digits are ASCII"));
        }
    }

    /// Makes room for `extra` more bytes without a reallocation that would leave the old buffer
    /// unwiped: the text moves to a new buffer, and the old one is wiped as it drops.
    fn reserve(&mut self, extra: usize) {
        let len = self.text.len();
        if self.text.capacity() - len >= extra {
            return;
        }
        let capacity = (2 * self.text.capacity()).max(len + extra);
        let mut grown = Zeroizing::new(String::with_capacity(capacity));
        grown.push_str(&self.text);
        self.text = grown;
    }
}

impl Default for KeyFileWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for KeyFileWriter {
    // The text holds secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyFileWriter({} bytes)", self.text.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{key_lines, single_line};

    #[test]
    fn lines_read_back_as_written() {
        let mut w = KeyFileWriter::new();
        w.comment("a test file").comment("");
        w.line(&[Field::Word("made"), Field::Decimal(-1_795_000_000)]);
        w.line(&[
            Field::Word("current"),
            Field::HexU32(0x1a),
            Field::Hex(&[0xab; 32]),
        ]);
        w.line(&[Field::Hex(&[0, 1, 0xfe])]);
        let text = w.finish();
        let expected = format!(
            "# a test file\n#\nmade -1795000000\ncurrent 0000001a {}\n0001fe\n",
            "ab".repeat(32)
        );
        assert_eq!(*text, expected);
        let mut lines = key_lines(&text);
        let mut made = lines.next().unwrap();
        assert_eq!(made.label(), "made");
        assert_eq!(made.decimal::<i64>("the time"), Ok(-1_795_000_000));
        let mut current = lines.next().unwrap();
        assert_eq!(current.label(), "current");
        assert_eq!(current.hex_u32("the id"), Ok(0x1a));
        assert_eq!(*current.hex::<32>("the key").unwrap(), [0xab; 32]);
        assert!(current.end("the key").is_ok());
        let mut bare = lines.next().unwrap();
        assert_eq!(*bare.hex::<3>("the seed").unwrap(), [0, 1, 0xfe]);
    }

    #[test]
    fn growing_keeps_the_text() {
        // Far past the first buffer, in long hex words and short ones.
        let mut w = KeyFileWriter::with_capacity(4);
        let secret: Vec<u8> = (0..=255).collect();
        for _ in 0..20 {
            w.line(&[Field::Word("cert"), Field::Hex(&secret)]);
            w.line(&[Field::Decimal(i128::MIN)]);
        }
        let text = w.finish();
        assert_eq!(text.lines().count(), 40);
        for mut line in key_lines(&text).step_by(2) {
            assert_eq!(line.label(), "cert");
            assert_eq!(&line.hex::<256>("the cert").unwrap()[..], &secret[..]);
        }
        assert!(single_line("#\n").is_err());
    }

    #[test]
    #[should_panic(expected = "a comment is one line")]
    fn a_comment_cannot_open_a_key_line() {
        KeyFileWriter::new().comment("fine\nsecret 00");
    }

    #[test]
    fn debug_shows_no_secret() {
        let mut w = KeyFileWriter::new();
        w.line(&[Field::Hex(&[0x5a; 4])]);
        let shown = format!("{w:?} {:?}", Field::Hex(&[0x5a; 4]));
        assert!(!shown.contains("5a"), "{shown}");
    }
}
