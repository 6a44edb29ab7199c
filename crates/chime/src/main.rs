//! chime: the operator's tool. Queries NTP and Roughtime servers (verifying every Roughtime
//! signature), makes Roughtime keys and NTS fleet secrets, and load-tests servers.

#![forbid(unsafe_code)]

mod addr;
mod control;
mod keygen;
mod ntp;
mod nts;
mod out;
mod perf;
mod reference;
mod roughtime;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand};

/// The unit tests count allocations (`chime perf`'s hot path makes none); the tool itself uses the
/// system allocator.
#[cfg(test)]
#[global_allocator]
static GLOBAL: chime_udp::counting_alloc::CountingAlloc = chime_udp::counting_alloc::CountingAlloc;

#[derive(Debug, Parser)]
#[command(
    name = "chime",
    version,
    about = "Query, verify and load-test NTP and Roughtime servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send one NTP request to a server and print its answer
    Ntp(ntp::Args),
    /// Query Roughtime servers, verify their replies, and chain several into a report
    Roughtime(roughtime::Args),
    /// Make a Roughtime long-term key file (mode 0600, never overwritten)
    Keygen(keygen::Args),
    /// Make a Roughtime delegation bundle for one server from the long-term key, so that the
    /// server never holds that key (mode 0600, never overwritten)
    Delegate(keygen::DelegateArgs),
    /// Make an NTS fleet secret file for chimed --nts-fleet-key (mode 0600, never overwritten)
    NtsFleetKey(keygen::FleetArgs),
    /// Load-test a server: open-loop request rates, loss, latency percentiles
    Perf(Box<perf::Args>),
    /// Ask a local chimed how it is (as chronyc serverstats and tracking): its services' counts,
    /// the upstream, keys and expiries; exits 2 when chimed says it is unhealthy
    Status(control::StatusArgs),
    /// Ask a local chimed who its busiest clients are (as chronyc clients), and how many distinct
    /// clients it served in the last hour and day
    Clients(control::ClientsArgs),
    /// Write the manual pages (chime(1) and one per subcommand), the bash, zsh and fish
    /// completions, and the AsciiDoc reference CHIME.adoc into DIR (for packaging and docs/)
    #[command(hide = true)]
    GenerateDocs {
        /// Where to write them
        dir: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ntp(args) => ntp::run(&args),
        Command::Roughtime(args) => roughtime::run(&args),
        Command::Keygen(args) => keygen::run(&args),
        Command::NtsFleetKey(args) => keygen::run_fleet(&args),
        Command::Delegate(args) => keygen::run_delegate(&args),
        Command::Perf(args) => perf::run(&args),
        Command::Status(args) => return finish(control::run_status(&args)),
        Command::Clients(args) => control::run_clients(&args),
        Command::GenerateDocs { dir } => generate_docs(&dir),
    };
    finish(result.map(|()| ExitCode::SUCCESS))
}

/// The exit code of a subcommand's result; an error is said on one line, exit 1.
fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("chime: {e:#}");
        ExitCode::FAILURE
    })
}

/// `chime generate-docs DIR`: the pages, completions and CHIME.adoc, from the flags' own
/// definitions.
fn generate_docs(dir: &std::path::Path) -> anyhow::Result<()> {
    let context = || format!("{}", dir.display());
    std::fs::create_dir_all(dir).with_context(context)?;
    let mut cmd = Cli::command();
    clap_mangen::generate_to(cmd.clone(), dir).with_context(context)?;
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        clap_complete::generate_to(shell, &mut cmd, "chime", dir).with_context(context)?;
    }
    let reference = reference::chime_reference(cmd);
    std::fs::write(dir.join("CHIME.adoc"), reference).with_context(context)?;
    Ok(())
}
