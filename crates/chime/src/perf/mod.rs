//! `chime perf`: an open-loop load generator for time servers, in the spirit of ntpperf and of the
//! latency tools that keep HDR histograms.
//!
//! Requests leave on an absolute schedule whatever comes back, so an overloaded server cannot slow
//! the load down; every reply is matched to its request by an id the protocol carries (an NTS-KE
//! session's end by the id its client thread was handed); a run is a fixed rate or a series of
//! geometrically growing steps that stops once loss (or failure) passes a threshold. Per step it
//! measures loss, the answered rate, round-trip latency percentiles, for NTP the server's receive
//! timestamp error and processing time, and optionally the server's CPU time per reply; it prints
//! a table and writes CSV, JSON and an SVG plot (NTS-KE: a line per step and JSON).
//!
//! Module map. The engine, once for every protocol: `engine` (the run: threads, steps, /proc
//! readings around each, the progress line), `worker` (each thread's event loop: the absolute
//! schedule, sending through the transport, matching and counting what comes back), `inflight`
//! (ids and send times), `stats` (counts, histograms, per-step results), `procfs`, and
//! `transport` (the [`transport::Transport`] trait through which the engine sends and receives).
//! The transports: `udp` (datagrams) and `tcp` (streams), which carry any request/reply protocol
//! ([`protocol::LoadProtocol`], in `protocol`: `ntp`, `ntpv5`, `nts` and `roughtime`), and `ke`
//! (NTS-KE sessions, each run whole on a client thread). The front ends: `load` (`chime perf ntp`
//! and `chime perf roughtime`, with `report` for the table, CSV and JSON and `plot` for the SVG)
//! and `ke` (`chime perf nts-ke` and its report); `args` holds the flags they share.

mod args;
mod engine;
mod inflight;
mod ke;
mod load;
mod ntp;
mod ntpv5;
mod nts;
mod plot;
mod procfs;
mod protocol;
mod report;
mod roughtime;
mod stats;
mod tcp;
mod transport;
mod udp;
mod worker;

use anyhow::Result;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    protocol: Protocol,
}

#[derive(Debug, clap::Subcommand)]
enum Protocol {
    /// Load an NTP server with client (or symmetric active) requests, or with NTS-authenticated
    /// ones (--nts)
    Ntp(ntp::Args),
    /// Load a Roughtime server with requests of one version, verifying a sample of the replies
    Roughtime(roughtime::Args),
    /// Load an NTS-KE server with cold sessions: a new TCP connection and a full TLS 1.3
    /// handshake each
    #[command(name = "nts-ke")]
    NtsKe(ke::Args),
}

pub(crate) fn run(args: &Args) -> Result<()> {
    if let Protocol::Ntp(a) = &args.protocol
        && a.ntpv5_draft.is_some()
        && a.ntp_version != 5
    {
        args::usage(format!(
            "--ntpv5-draft: only with --ntp-version 5, not {}",
            a.ntp_version
        ))
        .exit();
    }
    match &args.protocol {
        Protocol::Ntp(a) if a.nts.nts.is_some() => nts::run(a),
        Protocol::Ntp(a) if a.ntp_version == 5 => run_v5(a),
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
            load::run(
                &a.load,
                ntp::NtpLoad::new(a.ntp_version, a.mode),
                request,
                &label,
                None,
            )
        }
        Protocol::NtsKe(a) => ke::run(a),
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
            load::run(&a.load, load, request, &label, tcp)
        }
    }
}

/// `chime perf ntp --ntp-version 5`: client requests naming one draft.
fn run_v5(a: &ntp::Args) -> Result<()> {
    if a.mode != ntp::RequestMode::Client {
        args::usage("--mode: NTPv5 has client mode (3) only").exit();
    }
    let draft = a.draft();
    let request = serde_json::json!({
        "ntp_version": 5,
        "mode": 3,
        "ntpv5_draft": draft.id(),
    });
    let label = format!("NTPv5 ({}) mode 3", draft.id());
    load::run(&a.load, ntpv5::V5Load::new(draft), request, &label, None)
}
