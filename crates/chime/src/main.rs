//! chime: the operator's tool. Queries NTP servers and prints what they said.

#![forbid(unsafe_code)]

mod ntp;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "chime", version, about = "Query and measure NTP time servers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send one NTP request to a server and print its answer
    Ntp(ntp::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ntp(args) => ntp::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chime: {e:#}");
            ExitCode::FAILURE
        }
    }
}
