//! What can be wrong with a key file's text.

/// Why a key file's text is not what its kind says, with the line at fault (1-based) where there
/// is one. Its words name the file's parts (`what`, `expected`) as the kind of file calls them;
/// it never holds the file's text, so never a secret. Shown after the file's name, it makes one
/// line: `/etc/chimed/fleet.key: line 3: the secret is 62 hex digits, not 64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// The text has no key line: it is empty, or only blank lines and comments.
    #[error("empty: no key line, only blank lines and comments")]
    Empty,
    /// A line's label is not one this kind of file has.
    #[error("line {line}: expected {expected}")]
    WrongLabel {
        /// The line.
        line: usize,
        /// The lines that would do, as they read (`` `secret HEX` or `previous HEX` ``).
        expected: &'static str,
    },
    /// A word that should be hex has something else in it.
    #[error("line {line}: {what} is not hex digits")]
    BadHex {
        /// The line.
        line: usize,
        /// The word's name (`the secret`).
        what: &'static str,
    },
    /// A word of hex digits has the wrong number of them.
    #[error("line {line}: {what} is {found} hex digits, not {expected}")]
    WrongLength {
        /// The line.
        line: usize,
        /// The word's name.
        what: &'static str,
        /// Digits found.
        found: usize,
        /// Digits expected.
        expected: usize,
    },
    /// A word that should be a number is not one (or is out of range).
    #[error("line {line}: {what} is not a number")]
    BadNumber {
        /// The line.
        line: usize,
        /// The word's name.
        what: &'static str,
    },
    /// A line ends before a word it needs.
    #[error("line {line}: {what} is missing")]
    MissingWord {
        /// The line.
        line: usize,
        /// The missing word's name.
        what: &'static str,
    },
    /// More on a line than it takes, or a key line after the last one a file takes.
    #[error("line {line}: trailing junk after {what}")]
    TrailingJunk {
        /// The line with the junk.
        line: usize,
        /// What should have been the end (`the secret`, `the key line`).
        what: &'static str,
    },
    /// A line the file needs is not there.
    #[error("no {what} line")]
    Missing {
        /// The line's label, as it reads (`` `secret` ``).
        what: &'static str,
    },
    /// A line that a file takes once is there again.
    #[error("line {line}: a second {what} line")]
    Repeated {
        /// The second one's line.
        line: usize,
        /// The line's label.
        what: &'static str,
    },
    /// Some lines of one label, where the file takes another number of them.
    #[error("line {line}: {found} {what} lines, not {expected}")]
    WrongCount {
        /// The line that opens the group.
        line: usize,
        /// The lines' label.
        what: &'static str,
        /// Lines found.
        found: usize,
        /// Lines expected.
        expected: usize,
    },
    /// A line that is well formed but out of place, or wrong for its kind's own reasons.
    #[error("line {line}: {what}")]
    InvalidLine {
        /// The line.
        line: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// The file is wrong as a whole for its kind's own reasons.
    #[error("{what}")]
    Invalid {
        /// What is wrong.
        what: &'static str,
    },
}
