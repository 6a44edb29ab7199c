//! chimed: serves NTP, NTS and Roughtime from every core beside a local chronyd. Everything is in
//! the library; see `chimed::daemon`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    chimed::daemon::main()
}
