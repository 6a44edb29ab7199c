//! `chime perf`: an open-loop load generator for time servers, in the spirit of ntpperf and of the
//! latency tools that keep HDR histograms.
//!
//! Requests leave on an absolute schedule whatever comes back, so an overloaded server cannot slow
//! the load down; every reply is matched to its request by an id the protocol carries; a run is a
//! fixed rate or a series of geometrically growing steps that stops once loss passes a threshold.
//! Per step it measures loss, the answered rate, round-trip latency percentiles, for NTP the
//! server's receive timestamp error and processing time, and optionally the server's CPU time per
//! reply; it prints a table and writes CSV, JSON and an SVG plot.
//!
//! Module map: `args` (the shared flags), `protocol` (the [`protocol::LoadProtocol`] trait a
//! protocol implements), `ntp` and `roughtime` (each protocol's requests and replies), `controller` (steps, progress, /proc
//! readings, outputs), `worker` (the sending and receiving threads), `inflight` (ids and send
//! times), `stats` (counts, histograms, per-step results), `procfs`, `report` (table, CSV, JSON),
//! `plot` (SVG).

mod args;
mod controller;
mod inflight;
mod ntp;
mod plot;
mod procfs;
mod protocol;
mod report;
mod roughtime;
mod stats;
mod tcp;
mod worker;

use anyhow::Result;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    protocol: Protocol,
}

#[derive(Debug, clap::Subcommand)]
enum Protocol {
    /// Load an NTP server with client (or symmetric active) requests
    Ntp(ntp::Args),
    /// Load a Roughtime server with requests of one version, verifying a sample of the replies
    Roughtime(roughtime::Args),
}

pub(crate) fn run(args: &Args) -> Result<()> {
    match &args.protocol {
        Protocol::Ntp(a) => {
            let request = serde_json::json!({
                "ntp_version": a.ntp_version,
                "mode": match a.mode {
                    ntp::RequestMode::Client => 3,
                    ntp::RequestMode::SymmetricActive => 1,
                },
            });
            let label = format!(
                "NTPv{} mode {}",
                a.ntp_version,
                request["mode"].as_u64().unwrap_or(0)
            );
            controller::run(
                &a.load,
                ntp::NtpLoad::new(a.ntp_version, a.mode),
                request,
                &label,
                None,
            )
        }
        Protocol::Roughtime(a) => {
            let tcp = a.tcp.then_some(a.tcp_connections as usize);
            let request = serde_json::json!({
                "roughtime_version": a.version.to_string(),
                "verify_every": a.verify_every,
                "transport": if a.tcp { "tcp" } else { "udp" },
                "tcp_connections_per_thread": tcp,
            });
            let label = format!("Roughtime {}", a.version);
            let load = roughtime::RoughtimeLoad::new(a.version, a.public_key, a.verify_every);
            controller::run(&a.load, load, request, &label, tcp)
        }
    }
}
