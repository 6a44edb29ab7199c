//! chimed: the chime daemon. It serves NTP from N worker threads per address family, each with its
//! own `SO_REUSEPORT` socket (the data plane), while a small tokio runtime on the main thread
//! polls the local chronyd and handles signals (the control plane).

#![forbid(unsafe_code)]

mod cli;
mod clock;
mod config;
mod ntp_worker;
mod privileges;
mod stats;
mod tz;
mod upstream;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use arc_swap::{ArcSwap, ArcSwapOption};
use chime_ntp::{ServerState, StalePolicy};
use chime_udp::{BoundWorkers, WorkerConfig, Workers};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::cli::Args;
use crate::config::Settings;
use crate::ntp_worker::{NtpWorker, Shared};
use crate::stats::Totals;

/// Exit status for bad input (a flag, the config file), as clap uses for bad flags.
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let args = Args::parse();
    let settings = match Settings::resolve(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("chimed: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    if args.check_config {
        println!("chimed: configuration is valid\n{settings:#?}");
        return ExitCode::SUCCESS;
    }
    init_logging(&settings.log_level);
    match run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chimed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

fn run(settings: Settings) -> Result<()> {
    let shared = Arc::new(Shared {
        state: ArcSwap::from_pointee(ServerState::unsynchronised()),
        policy: StalePolicy {
            stale_after: settings.stale_after,
            ..StalePolicy::default()
        },
        totals: Totals::default(),
        stats_interval: settings.stats_interval,
        zone: ArcSwapOption::empty(),
    });
    if let Some(name) = &settings.tz_offset {
        load_zone(name.as_deref(), &shared).map_err(anyhow::Error::msg)?;
    }

    // Bind everything while still privileged, then drop privileges, then start the threads.
    let mut bound = Vec::new();
    for (family, threads, addr) in [
        ("ipv4", settings.ipv4_threads, settings.ipv4_address),
        ("ipv6", settings.ipv6_threads, settings.ipv6_address),
    ] {
        if threads == 0 {
            continue;
        }
        let mut cfg = WorkerConfig::new(format!("ntp-{family}"), addr, threads);
        cfg.socket.recv_buffer = settings.recv_buffer;
        cfg.batch_size = settings.batch_size;
        cfg.cpus = settings.cpus.clone();
        let workers = BoundWorkers::bind(cfg)
            .with_context(|| format!("--{family}-address {addr}: cannot bind"))?;
        bound.push((family, threads, workers));
    }
    privileges::drop_to(settings.user.as_deref(), settings.root.as_deref())?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut running: Vec<Workers> = Vec::new();
    for (family, threads, workers) in bound {
        let addr = workers.local_addr();
        let caps = workers.capabilities();
        let name = format!("ntp-{family}");
        let s = shared.clone();
        let started = workers.spawn(stop.clone(), |i| {
            NtpWorker::new(s.clone(), format!("{name}-{i}"))
        });
        let started = match started {
            Ok(w) => w,
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                join_all(running);
                return Err(e).context(format!("cannot start the {name} threads"));
            }
        };
        info!(
            "ntp listening on {addr} ({threads} threads, kernel receive timestamps: {}, \
             pktinfo: {}, receive buffer {} bytes)",
            yes_no(caps.rx_timestamps),
            yes_no(caps.pktinfo),
            caps.recv_buffer
        );
        if !caps.rx_timestamps {
            warn!("{name}: no kernel receive timestamps; T2 is read after the packet queued");
        }
        running.push(started);
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the control-plane runtime")?;
    let result = runtime.block_on(control_plane(&settings, shared.clone()));

    // Stop receiving; each worker finishes the batch in hand, flushes its counters and exits.
    stop.store(true, Ordering::Relaxed);
    join_all(running);
    info!("ntp totals at exit: {}", shared.totals.snapshot());
    result
}

async fn control_plane(settings: &Settings, shared: Arc<Shared>) -> Result<()> {
    let mut sigterm = signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot install SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("cannot install SIGHUP handler")?;
    let poller = tokio::spawn(upstream::run(
        settings.server_address,
        settings.poll_interval,
        shared.clone(),
    ));
    loop {
        tokio::select! {
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
            _ = sighup.recv() => match &settings.tz_offset {
                Some(name) => {
                    info!("SIGHUP: re-reading the timezone");
                    if let Err(e) = load_zone(name.as_deref(), &shared) {
                        warn!("{e}; keeping the zone loaded before");
                    }
                }
                None => info!("SIGHUP: nothing to reload"),
            },
        }
    }
    poller.abort();
    Ok(())
}

/// Loads the timezone-offset mode's zone and publishes it to the workers, with the warning every
/// start (and reload) owes the operator.
fn load_zone(name: Option<&str>, shared: &Shared) -> Result<(), String> {
    let (zone, description) = tz::load(name)?;
    shared.zone.store(Some(zone));
    warn!(
        "timezone-offset mode: NTP replies carry the local time of {description} as if it \
         were UTC; clients that expect UTC will be wrong by that offset (Roughtime is never shifted)"
    );
    Ok(())
}

fn join_all(workers: Vec<Workers>) {
    for w in workers {
        if w.join().is_err() {
            warn!("a worker thread panicked");
        }
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
