//! Standard output for chime's reports. `println!` panics when the reader has gone ("failed
//! printing to stdout: Broken pipe", as `chime ntp HOST | head -1` makes it); [`outln!`] ends
//! chime instead, with the status a process killed by SIGPIPE has (128 + 13), as other command
//! line tools end there. Any other failure to write is still a panic: nothing else can fail a
//! write to a terminal, a file or a pipe.

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
    if let Err(e) = writeln!(out, "{args}") {
        if e.kind() == io::ErrorKind::BrokenPipe {
            std::process::exit(BROKEN_PIPE_STATUS);
        }
        panic!("failed printing to stdout: {e}");
    }
}
