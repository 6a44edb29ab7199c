//! Standard output for chime's reports. `println!` panics when the reader has gone ("failed
//! printing to stdout: Broken pipe", as `chime ntp HOST | head -1` makes it); [`outln!`] ends
//! chime instead, with the status a process killed by SIGPIPE has (128 + 13), as other command
//! line tools end there, and so does a write checked with [`closed_ends`] (`chime perf`'s
//! table). Any other failure of `outln!` is still a panic: nothing else can fail a write to a
//! terminal, a file or a pipe.

use std::io::{self, Write as _};

/// `println!` for chime's reports: a closed standard output ends chime quietly.
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// The status of a process killed by SIGPIPE.
const BROKEN_PIPE_STATUS: i32 = 128 + 13;

/// Writes `args` and a newline to standard output.
pub(crate) fn line(args: std::fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = closed_ends(writeln!(out, "{args}")) {
        panic!("failed printing to stdout: {e}");
    }
}

/// `written`, a write to standard output; if it failed because the reader has gone, chime ends
/// here as [`outln!`] does.
pub(crate) fn closed_ends(written: io::Result<()>) -> io::Result<()> {
    match written {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(BROKEN_PIPE_STATUS),
        other => other,
    }
}
