//! The daemon's lifecycle: the flags and settings, binding every socket while privileged,
//! dropping privileges, then every service started on the [`supervisor`] and watched until a
//! signal stops them all (or one ends unexpectedly, which stops the rest and exits non-zero, so
//! that systemd restarts chimed). systemd hears of each step ([`notify`]).

mod bind;
pub(crate) mod notify;
mod privileges;
mod reload;
mod secrets;
mod start;
pub(crate) mod supervisor;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use arc_swap::ArcSwap;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use crate::access::Rules;
use crate::clock::published::Published;
use crate::config::Args;
use crate::config::{self, Settings, docs};

use self::secrets::Secrets;
use crate::nts::{ke as nts_ke, keys as nts_keys};
use crate::{ntp, roughtime};

use self::start::{Prepared, Running};
use self::supervisor::Supervisor;

/// Exit status for bad input (a flag, the config file, the key file), as clap uses for bad flags.
const EXIT_BAD_INPUT: u8 = 2;

/// chimed's whole life, from the command line to the exit status.
pub fn main() -> ExitCode {
    // The tests' fail points (FAILPOINTS=name=action), in builds with the `failpoints` feature.
    #[cfg(feature = "failpoints")]
    let _fail_points = fail::FailScenario::setup();
    let args = match Args::parse_from(std::env::args_os()) {
        Ok(args) => args,
        Err(e) => return bad_flags(&e),
    };
    if let Some(dir) = &args.generate_docs {
        return match docs::generate(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("chimed: --generate-docs {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    let loaded = config::settings(&args).and_then(|s| secrets::load(&s).map(|l| (s, l)));
    let (settings, secrets) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("chimed: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    if args.check_config {
        println!("# chimed: configuration is valid\n{}", settings.show());
        return ExitCode::SUCCESS;
    }
    let log = init_logging(&settings.observe.log_level.0);
    match run(&args, &settings, secrets, log) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Logging has started: the fatal error goes where everything else went.
            error!("chimed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A bad command line in one line, as a bad config file gets (clap's own message adds usage and
/// a hint on further lines); --help and --version print as clap prints them.
fn bad_flags(e: &clap::Error) -> ExitCode {
    if !e.use_stderr() {
        e.exit();
    }
    // A value out of its range reads as `resolve` words one: `--flag: reason`.
    let arg = e.get(clap::error::ContextKind::InvalidArg);
    let source = std::error::Error::source(e).and_then(|s| s.downcast_ref::<config::values::Bad>());
    if let (Some(arg), Some(config::values::Bad::Range(reason))) = (arg, source) {
        let flag = arg.to_string();
        eprintln!(
            "chimed: {}: {reason}",
            flag.split(' ').next().unwrap_or_default()
        );
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("bad arguments");
    eprintln!("chimed: {}", first.trim_start_matches("error: "));
    ExitCode::from(EXIT_BAD_INPUT)
}

/// Logs to stderr through `filter`, which SIGHUP can replace ([`reload::LogFilter`]).
fn init_logging(filter: &str) -> reload::LogFilter {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let (filter, handle) =
        tracing_subscriber::reload::Layer::new(tracing_subscriber::EnvFilter::new(filter));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    tracing_subscriber::registry()
        .with(filter)
        .with(stderr)
        .init();
    handle
}

/// Prepares the services' state, binds every socket while still privileged, drops privileges,
/// and runs the services on the control plane's runtime until they stop.
fn run(
    args: &Args,
    settings: &Settings,
    mut secrets: Secrets,
    log: reload::LogFilter,
) -> Result<()> {
    // The cookie keys: a fleet's, derived from its secret, else this server's own (with NTS-KE).
    // With either, the NTP workers serve NTS.
    let nts_start = match (&secrets.fleet, &secrets.tls) {
        (Some(fleet), _) => Some(nts_ke::fleet_start(fleet)),
        (None, Some(_)) => {
            let r = nts_ke::starting_keys(&mut secrets.dump, nts_keys::Rotation::of(settings));
            Some((r.saved.keys, r.next_rotation))
        }
        (None, None) => None,
    };
    // Each kind of state with its owner: the clock's, the access rules, the cookie keys; the
    // services are handed what they read of each.
    let clock = Arc::new(Published::new(settings));
    let access = Arc::new(Rules::new(settings.acl.clone()));
    let cookies =
        (nts_start.as_ref()).map(|(keys, _)| Arc::new(ArcSwap::from_pointee(keys.clone())));
    if let Some(zone) = settings.tz_offset() {
        reload::load_zone(zone, &clock, false)?;
    }
    let ntp = ntp::shared(settings, clock.clone(), access.clone(), cookies);
    log_shedding(settings);
    let stats_interval = settings.observe.stats_interval.duration();
    let roughtime = match &secrets.roughtime {
        Some(keys) => Some(roughtime::prepare(
            &settings.roughtime,
            keys,
            (&clock, &access, stats_interval),
        )?),
        None => None,
    };
    let prepared = Prepared {
        ntp,
        nts_start,
        roughtime,
        shed: settings
            .shed()
            .map(|cfg| Arc::new(chime_udp::ShedTuning::new(cfg))),
    };
    privileges::raise_open_files(open_files_needed(settings));
    let sockets = bind::all(settings, prepared.shed.as_ref())?;
    // Before the root changes, while systemd's socket can still be reached.
    let notifier = notify::Notifier::connect();
    let root = settings.process.root.as_ref().map(|r| r.0.as_path());
    privileges::drop_to(settings.process.user.as_deref(), root)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the control-plane runtime")?;
    runtime.block_on(supervise(
        (args, settings, secrets),
        prepared,
        sockets,
        (log, notifier),
    ))
}

/// The most files the services may hold open at once: the TCP services' connections, and room
/// for the rest (sockets, keys, the log).
fn open_files_needed(settings: &Settings) -> u64 {
    let nts = match settings.nts_ke() {
        Some(_) => nts_ke::MAX_SESSIONS,
        None => 0,
    };
    (nts + settings.roughtime.tcp.connections.0 + 256) as u64
}

fn log_shedding(settings: &Settings) {
    match settings.shed() {
        Some(shed) => info!(
            "overload: once the oldest queued request has waited over {} ms for {} ms, requests \
             that waited longer are shed unanswered (--shed-target 0 turns this off)",
            shed.target.as_secs_f64() * 1e3,
            shed.interval.as_secs_f64() * 1e3
        ),
        None => info!("overload: shedding off; whatever is queued is answered however late"),
    }
}

/// Starts every service, tells systemd it is ready, then handles signals, feeds the watchdog and
/// watches the services until a signal stops them or one ends by itself.
async fn supervise(
    (args, settings, secrets): (&Args, &Settings, Secrets),
    prepared: Prepared,
    sockets: bind::Sockets,
    (log, notifier): (reload::LogFilter, notify::Notifier),
) -> Result<()> {
    let mut sup = Supervisor::new();
    let started = start::all(&mut sup, (settings, secrets), prepared, sockets, log);
    let running = match started {
        Ok(running) => running,
        Err(e) => {
            sup.stop().await;
            return Err(e);
        }
    };
    let mut sigterm = signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot install SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("cannot install SIGHUP handler")?;
    let watchdog = notify::watchdog_interval();
    if let Some(every) = watchdog.filter(|&every| every < 2 * crate::service::WORKER_WAKE) {
        warn!(
            "watchdog: fed every {every:?}, while an idle worker shows it is alive only every {:?}: \
             set WatchdogSec= to 4 s or more",
            crate::service::WORKER_WAKE
        );
    }
    let mut feed = tokio::time::interval(watchdog.unwrap_or(std::time::Duration::from_secs(3600)));
    // The first tick is at once, before any worker could have shown it moves.
    feed.tick().await;
    // From here signals are handled (before, SIGHUP's default would end the process).
    info!("running: SIGTERM or SIGINT stops, SIGHUP reloads");
    notifier.ready();
    let outcome = loop {
        tokio::select! {
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break Ok(()); }
            _ = sigint.recv() => { info!("SIGINT: stopping"); break Ok(()); }
            _ = sighup.recv() => {
                notifier.reloading();
                running.reloadable.reload(args, settings);
                notifier.ready();
            }
            failure = sup.first_failure() => break Err(failure),
            _ = feed.tick(), if watchdog.is_some() => {
                if sup.all_moved() {
                    notifier.watchdog();
                } else {
                    warn!("watchdog: a serving thread has not moved since the last check; not \
                           telling systemd all is well");
                }
            }
        }
    };
    notifier.stopping();
    if let Err(failure) = &outcome {
        error!("{failure}: stopping the others");
    }
    // Each worker finishes the batch in hand, flushes its counters and exits.
    for failure in sup.stop().await {
        error!("while stopping: {failure}");
    }
    log_totals(&running);
    outcome.map_err(anyhow::Error::new)
}

/// The totals at exit, service by service.
fn log_totals(running: &Running) {
    if let Some(s) = &running.xdp {
        info!(
            "xdp totals at exit: malformed {}, receive times from the XDP program {}, from the \
             worker {}, replies the TX ring had no room for {}",
            s.malformed.load(Ordering::Relaxed),
            s.rx_times_from_program.load(Ordering::Relaxed),
            s.rx_times_from_worker.load(Ordering::Relaxed),
            s.tx_ring_full.load(Ordering::Relaxed)
        );
    }
    if let Some((counts, workers)) = &running.tcp {
        info!(
            "roughtime-tcp totals at exit: {} | connections: {}",
            workers.total().display_all(),
            counts.line()
        );
    }
    info!("ntp totals at exit: {}", running.ntp.total().display_all());
    if let Some(counts) = &running.ke_counts {
        info!("nts-ke totals at exit: {}", counts.line());
    }
    if let Some(shared) = &running.reloadable.roughtime {
        let totals = shared.workers.total();
        info!("roughtime totals at exit: {}", totals.display_all());
    }
}
