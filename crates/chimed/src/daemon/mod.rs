//! The daemon's lifecycle: flags and settings, binding every socket while privileged, dropping
//! privileges, starting the data plane's threads and the control plane, and stopping them.

mod privileges;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result};
use arc_swap::{ArcSwap, ArcSwapOption};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_ntp::{ClientTable, ServerState, StalePolicy};
use chime_roughtime::LongTermKey;
use chime_udp::{BatchHandler, BoundWorkers, WorkerConfig, Workers};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::clock::{self, tz, upstream};
use crate::config::cli::Args;
use crate::config::{self, Settings, docs};
use crate::ntp::worker as ntp_worker;
use crate::ntp::worker::NtpWorker;
use crate::nts::{ke as nts_ke, keys as nts_keys};
use crate::observe::{metrics, stats};
use crate::roughtime::udp::RoughtimeWorker;
use crate::roughtime::{keys as online_keys, tcp as roughtime_tcp, udp as roughtime_worker};

/// Exit status for bad input (a flag, the config file, the key file), as clap uses for bad flags.
const EXIT_BAD_INPUT: u8 = 2;

/// A bad command line in one line, as a bad config file gets (clap's own message adds usage and
/// a hint on further lines); --help and --version print as clap prints them.
fn bad_flags(e: &clap::Error) -> ExitCode {
    if !e.use_stderr() {
        e.exit();
    }
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("bad arguments");
    eprintln!("chimed: {}", first.trim_start_matches("error: "));
    ExitCode::from(EXIT_BAD_INPUT)
}

/// chimed's whole life, from the command line to the exit status.
pub fn main() -> ExitCode {
    let args = match Args::try_parse() {
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
    match run(&args, settings) {
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

/// The two services chimed runs on chime-udp workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Ntp,
    Roughtime,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Self::Ntp => "ntp",
            Self::Roughtime => "roughtime",
        }
    }

    /// The prefix of its address flags (`--ipv4-address`, `--roughtime-ipv4-address`).
    fn flag_prefix(self) -> &'static str {
        match self {
            Self::Ntp => "",
            Self::Roughtime => "roughtime-",
        }
    }
}

/// One service's sockets on one address family, bound and waiting for its threads.
struct Bound {
    service: Service,
    /// Whether its workers shed under overload (which needs receive timestamps).
    shed: bool,
    family: &'static str,
    name: String,
    threads: usize,
    workers: BoundWorkers,
}

fn run(args: &Args, mut settings: Settings) -> Result<()> {
    // The cookie keys: a fleet's, derived from its secret, else this server's own (with NTS-KE).
    // With either, the NTP workers serve NTS.
    let nts_start = match (&settings.nts_fleet, settings.nts.as_mut()) {
        (Some(fleet), _) => Some(nts_ke::fleet_start(fleet)),
        (None, Some(nts)) => {
            let r = nts_ke::starting_keys(nts);
            Some((r.saved.keys, r.next_rotation))
        }
        (None, None) => None,
    };
    let ntp = Arc::new(ntp_worker::Shared {
        state: ArcSwap::from_pointee(ServerState::unsynchronised()),
        policy: StalePolicy {
            stale_after: settings.stale_after,
            ..StalePolicy::default()
        },
        totals: Default::default(),
        stats_interval: settings.stats_interval,
        zone: ArcSwapOption::empty(),
        acl: ArcSwap::from_pointee(settings.acl.clone()),
        ratelimit: settings.ratelimit.map(|r| {
            let table = ClientTable::new(r.limit, r.clients, rand::random()).relenting();
            info!(
                "ntp: rate limiting on: ratelimit {}, {} client addresses tracked ({} KiB)",
                r.limit,
                table.capacity(),
                table.bytes() / 1024
            );
            table
        }),
        epoch: Instant::now(),
        nts: nts_start
            .as_ref()
            .map(|(keys, _)| Arc::new(ArcSwap::from_pointee(keys.clone()))),
        txlog: (settings.interleaved_log > 0).then(|| {
            let log = chime_ntp::TxLog::new(settings.interleaved_log);
            info!(
                "ntp: interleaved mode on: transmit times of {} replies kept ({} KiB)",
                log.capacity(),
                log.capacity() * 16 / 1024
            );
            log
        }),
    });
    if let Some(name) = &settings.tz_offset {
        load_zone(name.as_deref(), &ntp, false).map_err(anyhow::Error::msg)?;
    }
    match settings.shed {
        Some(shed) => info!(
            "overload: once the oldest queued request has waited over {} ms for {} ms, requests \
             that waited longer are shed unanswered (--shed-target 0 turns this off)",
            shed.target.as_secs_f64() * 1e3,
            shed.interval.as_secs_f64() * 1e3
        ),
        None => info!("overload: shedding off; whatever is queued is answered however late"),
    }
    let roughtime = match &settings.roughtime {
        Some(rt) => {
            let (signer, delegation, public, bundle) = match &rt.keys {
                config::RoughtimeKeys::LongTerm { seed, .. } => {
                    let key = Arc::new(LongTermKey::from_seed(seed));
                    let delegation = online_keys::delegate(&key, rt.rotation)?;
                    let public = key.public_key();
                    (online_keys::Signer::Key(key), delegation, public, None)
                }
                config::RoughtimeKeys::Bundle { bundle, .. } => (
                    online_keys::Signer::Bundle,
                    online_keys::from_bundle(bundle),
                    bundle.long_term_public_key(),
                    Some(ArcSwap::from_pointee(bundle.clone())),
                ),
            };
            info!(
                "roughtime public key (base64): {} (hex {}), from {}",
                BASE64.encode(public),
                hex(&public),
                rt.keys.file().display()
            );
            info!("roughtime: {}", online_keys::describe(&delegation));
            info!(
                "roughtime: Merkle hashing on {}",
                match chime_roughtime::HashBackend::detect() {
                    chime_roughtime::HashBackend::Avx512 => "AVX-512, eight requests at a time",
                    chime_roughtime::HashBackend::Avx2 => "AVX2, four requests at a time",
                    _ => "one request at a time (no AVX2 or AVX-512 on this CPU)",
                }
            );
            if let Some(gather) = rt.gather {
                info!(
                    "roughtime: under light load, requests are gathered for {} µs before signing \
                     (a lone request never waits; --roughtime-gather 0 turns this off)",
                    gather.as_micros()
                );
            }
            if rt.grease > 0.0 {
                warn!(
                    "roughtime: --roughtime-grease {}: {:.3}% of replies are deliberately invalid \
                     ({}), for testing clients; no production server should send these",
                    rt.grease,
                    rt.grease * 100.0,
                    rt.grease_kinds
                        .iter()
                        .map(|k| k.label())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            let shared = Arc::new(roughtime_worker::Shared {
                ntp: ntp.clone(),
                delegation: ArcSwap::from_pointee(delegation),
                totals: Default::default(),
                grease: rt.grease,
                grease_kinds: rt.grease_kinds.clone(),
                bundle,
            });
            Some((signer, rt.rotation, shared))
        }
        None => None,
    };

    let registry = settings
        .metrics_address
        .map(|_| Arc::new(stats::Registry::default()));
    let register = |service: &'static str, family: &'static str, thread, labels| {
        registry
            .as_ref()
            .map(|r| r.register(service, family, thread, labels))
    };

    // Bind everything while still privileged, then drop privileges, then start the threads.
    let metrics_listener = match settings.metrics_address {
        Some(addr) => Some(
            std::net::TcpListener::bind(addr)
                .with_context(|| format!("--metrics-address {addr}: cannot bind"))?,
        ),
        None => None,
    };
    let mut ntp_bound = Vec::new();
    for (family, threads, addr) in [
        ("ipv4", settings.ipv4_threads, settings.ipv4_address),
        ("ipv6", settings.ipv6_threads, settings.ipv6_address),
    ] {
        ntp_bound.extend(bind(&settings, Service::Ntp, family, threads, addr)?);
    }
    let nts_listener = match &settings.nts {
        Some(nts) => {
            let addr = nts.ke_address;
            let listener = std::net::TcpListener::bind(addr)
                .with_context(|| format!("--nts-ke-address {addr}: cannot bind"))?;
            // NTS-KE tells clients the NTP port when it is not 123: the one --nts-ntp-server
            // names, else this server's own (a port-0 bind's real one).
            let port = nts
                .ntp_port
                .or_else(|| {
                    ntp_bound
                        .first()
                        .map(|b: &Bound| b.workers.local_addr().port())
                })
                .filter(|&p| p != 123);
            Some((listener, port))
        }
        None => None,
    };
    // Roughtime, and over TCP on each UDP socket's address and port.
    let mut rt_bound = Vec::new();
    let mut rt_listeners = Vec::new();
    if let Some(rt) = &settings.roughtime {
        for (family, threads, addr) in [
            ("ipv4", rt.ipv4_threads, rt.ipv4_address),
            ("ipv6", rt.ipv6_threads, rt.ipv6_address),
        ] {
            // Port 0 lets the kernel choose the UDP port, which a TCP connection may hold: then
            // choose again (a configured port is either free for both or an error).
            let mut tries = 0;
            loop {
                let Some(bound) = bind(&settings, Service::Roughtime, family, threads, addr)?
                else {
                    break;
                };
                if rt.tcp.is_some() {
                    match roughtime_tcp::bind(bound.workers.local_addr()) {
                        Ok(listener) => rt_listeners.push(listener),
                        Err(e) if addr.port() == 0 && tries < 20 => {
                            tries += 1;
                            tracing::debug!("roughtime: {e:#}; choosing another port");
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                rt_bound.push(bound);
                break;
            }
        }
    }
    let rt_tcp = settings
        .roughtime
        .as_ref()
        .and_then(|rt| rt.tcp)
        .map(|limits| (rt_listeners, limits));
    let xdp_bound = match &settings.xdp {
        Some(x) => bind_xdp(x, &settings, &ntp_bound, &rt_bound)?,
        None => None,
    };
    privileges::drop_to(settings.user.as_deref(), settings.root.as_deref())?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut running: Vec<Workers> = Vec::new();
    let started = (|| -> Result<()> {
        for b in ntp_bound {
            let shared = ntp.clone();
            let family = b.family;
            running.push(start(b, &stop, |i| {
                let published = register("ntp", family, i, &ntp_worker::LABELS);
                NtpWorker::new(shared.clone(), published)
            })?);
        }
        if let (Some((_, _, shared)), Some(rt)) = (&roughtime, &settings.roughtime) {
            for b in rt_bound {
                let batch = rt.batch_size;
                let family = b.family;
                running.push(start(b, &stop, |i| {
                    let published = register("roughtime", family, i, &roughtime_worker::LABELS);
                    RoughtimeWorker::new(shared.clone(), batch, published)
                })?);
            }
        }
        Ok(())
    })();
    if let Err(e) = started {
        join_all(running);
        return Err(e);
    }
    let xdp_workers = match xdp_bound {
        Some(bound) => {
            let rt_shared = roughtime.as_ref().map(|(_, _, shared)| shared.clone());
            let rt_batch = settings.roughtime.as_ref().map_or(1, |rt| rt.batch_size);
            let spawned = bound.spawn(stop.clone(), |i, group| -> Box<dyn BatchHandler> {
                match (group, &rt_shared) {
                    (0, _) => {
                        let published = register("ntp", "xdp", i, &ntp_worker::LABELS);
                        Box::new(NtpWorker::new(ntp.clone(), published).without_interleaved())
                    }
                    (_, Some(shared)) => {
                        let published = register("roughtime", "xdp", i, &roughtime_worker::LABELS);
                        Box::new(RoughtimeWorker::new(shared.clone(), rt_batch, published))
                    }
                    (_, None) => unreachable!("a Roughtime group only with Roughtime on"),
                }
            });
            match spawned {
                Ok(w) => Some(w),
                Err(e) => {
                    join_all(running);
                    return Err(anyhow::Error::new(e).context("cannot start the XDP threads"));
                }
            }
        }
        None => None,
    };
    let tcp_counts = Arc::new(roughtime_tcp::Counts::default());
    let tcp_totals = Arc::new(stats::Totals::default());
    let tcp_service = match (rt_tcp, &roughtime) {
        (Some((listeners, limits)), Some((_, _, shared))) => {
            info!(
                "roughtime tcp: at most {} connections, {} per address, closed after {} s idle \
                 or {} s in all",
                limits.connections,
                limits.per_address,
                limits.idle.as_secs_f64(),
                limits.lifetime.as_secs_f64()
            );
            let published = register("roughtime", "tcp", 0, &roughtime_worker::LABELS);
            let pq = settings
                .roughtime
                .as_ref()
                .and_then(|rt| rt.mldsa.as_ref().map(|m| (rt.rotation, m)))
                .map(|(rotation, (file, seed))| {
                    let key = chime_roughtime::mldsa::PqLongTermKey::from_seed(seed);
                    warn!(
                        "roughtime: EXPERIMENTAL ML-DSA-44 suite (0x90000001, part of no draft) \
                         served over TCP, long-term key from {}; public key (base64): {}",
                        file.display(),
                        BASE64.encode(key.public_key())
                    );
                    roughtime_tcp::Pq { key, rotation }
                });
            match roughtime_tcp::spawn(
                listeners,
                shared.clone(),
                limits,
                tcp_counts.clone(),
                tcp_totals.clone(),
                published,
                pq,
            ) {
                Ok(service) => Some(service),
                Err(e) => {
                    join_all(running);
                    return Err(e);
                }
            }
        }
        _ => None,
    };

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the control-plane runtime")?;
    let ke_counts = Arc::new(nts_ke::KeCounts::default());
    let metrics = metrics_listener.zip(registry).map(|(listener, registry)| {
        let sources = metrics::Sources {
            registry,
            ntp: ntp.clone(),
            roughtime: roughtime.as_ref().map(|(_, _, shared)| shared.clone()),
            started_unix: clock::read().unix_secs(),
            nts_ke: settings.nts.as_ref().map(|_| ke_counts.clone()),
            roughtime_tcp: tcp_service.as_ref().map(|_| tcp_counts.clone()),
            xdp: xdp_workers
                .as_ref()
                .zip(settings.xdp.as_ref())
                .map(|(w, x)| metrics::Xdp {
                    interface: x.interface.clone(),
                    mode: match w.mode() {
                        chime_udp::xdp::XdpMode::ZeroCopy => "zero-copy",
                        chime_udp::xdp::XdpMode::Copy => "copy",
                    },
                    stats: w.stats(),
                }),
        };
        (listener, Arc::new(sources))
    });
    let nts = nts_listener
        .zip(settings.nts.clone())
        .zip(ntp.nts.clone())
        .map(|(((listener, port), nts), cookies)| NtsControl {
            listener,
            tls: Arc::new(ArcSwap::new(nts.tls.clone())),
            ntp: Arc::new(chime_ntp::nts::NtpNegotiation {
                server: nts.ntp_server.clone(),
                port,
            }),
            settings: nts,
            cookies,
            first_rotation: nts_start
                .as_ref()
                .map_or(std::time::Duration::ZERO, |(_, next)| *next),
            counts: ke_counts.clone(),
        });
    // A fleet's keys follow its periods whether or not this member serves NTS-KE. The secrets
    // are taken out of the settings, which live as long as the process: once SIGHUP replaces
    // them, no copy of the old ones is left to outlive the replacement.
    let fleet = settings
        .nts_fleet
        .take()
        .zip(ntp.nts.clone())
        .map(|(f, cookies)| FleetControl {
            path: f.path,
            period: f.period,
            secrets: Arc::new(ArcSwap::from_pointee(f.secrets)),
            cookies,
        });
    let result = runtime.block_on(control_plane(
        args,
        &settings,
        ntp.clone(),
        roughtime.clone(),
        metrics,
        nts,
        fleet,
    ));

    // Stop receiving (join sets the stop flag and wakes the workers); each worker finishes the
    // batch in hand, flushes its counters and exits.
    join_all(running);
    if let Some(x) = xdp_workers {
        let s = x.stats();
        info!(
            "xdp totals at exit: malformed {}, receive times from the XDP program {}, from the \
             worker {}, replies the TX ring had no room for {}",
            s.malformed.load(std::sync::atomic::Ordering::Relaxed),
            s.rx_times_from_program
                .load(std::sync::atomic::Ordering::Relaxed),
            s.rx_times_from_worker
                .load(std::sync::atomic::Ordering::Relaxed),
            s.tx_ring_full.load(std::sync::atomic::Ordering::Relaxed)
        );
        if x.join().is_err() {
            warn!("an XDP worker thread panicked");
        }
    }
    if let Some(service) = tcp_service {
        service.stop();
        info!(
            "roughtime tcp totals at exit: {} | connections: {}",
            tcp_totals.snapshot().display(&roughtime_worker::LABELS),
            tcp_counts.line()
        );
    }
    info!(
        "ntp totals at exit: {}",
        ntp.totals.snapshot().display(&ntp_worker::LABELS)
    );
    if settings.nts.is_some() {
        info!("nts-ke totals at exit: {}", ke_counts.line());
    }
    if let Some((_, _, shared)) = &roughtime {
        let totals = shared.totals.snapshot();
        info!(
            "roughtime totals at exit: {}",
            totals.display(&roughtime_worker::LABELS)
        );
    }
    result
}

fn bind(
    settings: &Settings,
    service: Service,
    family: &'static str,
    threads: usize,
    addr: SocketAddr,
) -> Result<Option<Bound>> {
    if threads == 0 {
        return Ok(None);
    }
    let name = format!("{}-{family}", service.name());
    let mut cfg = WorkerConfig::new(name.clone(), addr, threads);
    cfg.socket.recv_buffer = Some(settings.recv_buffer);
    cfg.batch_size = settings.batch_size;
    cfg.cpus = settings.cpus.clone();
    cfg.shed = settings.shed;
    if let (Service::Roughtime, Some(rt)) = (service, &settings.roughtime) {
        cfg.socket.recv_buffer = Some(rt.recv_buffer);
        cfg.batch_size = rt.batch_size;
        cfg.gather = rt.gather;
    }
    // Roughtime signs the time read once per batch; per-datagram kernel timestamps are there only
    // to tell how long each request waited, for shedding.
    cfg.socket.rx_timestamps = service == Service::Ntp || cfg.shed.is_some();
    let flag = service.flag_prefix();
    let cfg_shed = cfg.shed.is_some();
    let workers = BoundWorkers::bind(cfg)
        .with_context(|| format!("--{flag}{family}-address {addr}: cannot bind"))?;
    Ok(Some(Bound {
        service,
        shed: cfg_shed,
        family,
        name,
        threads,
        workers,
    }))
}

/// Makes the AF_XDP sockets and attaches the program for `--xdp`, serving the addresses and
/// ports the sockets were bound to (so a port-0 bind's real port). With `--xdp-fallback` a
/// failure is logged and the sockets serve alone.
fn bind_xdp(
    x: &config::Xdp,
    settings: &Settings,
    ntp: &[Bound],
    rt: &[Bound],
) -> Result<Option<chime_udp::xdp::XdpBound>> {
    use chime_udp::xdp::{XdpBound, XdpConfig, XdpGroup};
    let mut cfg = XdpConfig::new(x.interface.clone());
    cfg.threads = x.threads;
    cfg.mode = x.mode;
    cfg.cpus = settings.cpus.clone();
    // Frames taken per loop: enough for a whole batch of either protocol, so that a Roughtime
    // signature can cover as many requests as on its sockets.
    cfg.batch_size = settings
        .batch_size
        .max(settings.roughtime.as_ref().map_or(0, |r| r.batch_size));
    cfg.groups.push(XdpGroup {
        addrs: ntp.iter().map(|b| b.workers.local_addr()).collect(),
        max_datagram: 2048,
    });
    if settings.roughtime.is_some() {
        cfg.groups.push(XdpGroup {
            addrs: rt.iter().map(|b| b.workers.local_addr()).collect(),
            max_datagram: 2048,
        });
    }
    match XdpBound::bind(cfg) {
        Ok(b) => {
            info!(
                "xdp on {}: {} thread(s), {} mode, receive times from the XDP program; serving \
                 {:?}; interleaved NTP requests get basic replies on this path",
                x.interface,
                x.threads,
                match b.mode() {
                    chime_udp::xdp::XdpMode::ZeroCopy => "zero-copy",
                    chime_udp::xdp::XdpMode::Copy => "copy",
                },
                b.addrs()
            );
            Ok(Some(b))
        }
        Err(e) if x.fallback => {
            warn!("{e}; --xdp-fallback: serving through the sockets alone");
            Ok(None)
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("--xdp {}", x.interface))),
    }
}

fn start<H: BatchHandler>(
    b: Bound,
    stop: &Arc<AtomicBool>,
    mut make: impl FnMut(usize) -> H,
) -> Result<Workers> {
    let addr = b.workers.local_addr();
    let caps = b.workers.capabilities();
    let name = b.name;
    let workers = b
        .workers
        .spawn(stop.clone(), &mut make)
        .with_context(|| format!("cannot start the {name} threads"))?;
    let service = b.service.name();
    let timestamps = match (b.service, caps.rx_timestamps) {
        (Service::Ntp, true) => "kernel receive timestamps: yes, ",
        (Service::Ntp, false) => "kernel receive timestamps: no, ",
        (Service::Roughtime, _) => "",
    };
    info!(
        "{service} listening on {addr} ({} threads, {timestamps}pktinfo: {}, receive buffer {} \
         bytes)",
        b.threads,
        yes_no(caps.pktinfo),
        caps.recv_buffer
    );
    if !caps.rx_timestamps && b.service == Service::Ntp {
        warn!(
            "{name}: no kernel receive timestamps; receive times are read once per batch instead"
        );
    }
    if !caps.rx_timestamps && b.shed {
        warn!(
            "{name}: no kernel receive timestamps, so how long each waited is unknown: no shedding"
        );
    }
    Ok(workers)
}

/// What SIGHUP needs to reload the NTS certificate: where the TLS configuration in force lives,
/// the settings that name the files, and where the expiry is published.
type NtsReload = (
    Arc<ArcSwap<rustls::ServerConfig>>,
    config::Nts,
    Arc<nts_ke::KeCounts>,
);

/// A fleet member's NTS keys (`--nts-fleet-key`): the secret file and the period, the secrets in
/// force (SIGHUP replaces them), and the cookie keys derived from them.
struct FleetControl {
    path: std::path::PathBuf,
    period: std::time::Duration,
    secrets: Arc<ArcSwap<nts_keys::FleetSecrets>>,
    cookies: Arc<ArcSwap<chime_ntp::nts::CookieKeys>>,
}

/// What the control plane needs to run NTS-KE and rotate the cookie keys.
struct NtsControl {
    listener: std::net::TcpListener,
    /// The TLS configuration in force; SIGHUP replaces it.
    tls: Arc<ArcSwap<rustls::ServerConfig>>,
    /// What NTS-KE tells clients about the NTP server: its name and port, when not its own.
    ntp: Arc<chime_ntp::nts::NtpNegotiation>,
    settings: config::Nts,
    cookies: Arc<ArcSwap<chime_ntp::nts::CookieKeys>>,
    /// When the cookie key is next due to rotate: a key read back from `--nts-dump-dir` keeps its
    /// schedule.
    first_rotation: std::time::Duration,
    counts: Arc<nts_ke::KeCounts>,
}

type RoughtimeControl = (
    online_keys::Signer,
    std::time::Duration,
    Arc<roughtime_worker::Shared>,
);

async fn control_plane(
    args: &Args,
    settings: &Settings,
    ntp: Arc<ntp_worker::Shared>,
    roughtime: Option<RoughtimeControl>,
    metrics: Option<(std::net::TcpListener, Arc<metrics::Sources>)>,
    nts: Option<NtsControl>,
    fleet: Option<FleetControl>,
) -> Result<()> {
    let mut sigterm = signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot install SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("cannot install SIGHUP handler")?;
    let mut tasks = vec![tokio::spawn(upstream::run(
        settings.server_address,
        settings.poll_interval,
        ntp.clone(),
    ))];
    let roughtime_shared = roughtime.as_ref().map(|(_, _, shared)| shared.clone());
    if let Some((signer, rotation, shared)) = roughtime {
        tasks.push(tokio::spawn(online_keys::run(signer, rotation, shared)));
    }
    if let Some((listener, sources)) = metrics {
        match listener.local_addr() {
            Ok(addr) => info!("metrics: http://{addr}/metrics"),
            Err(e) => warn!("metrics: cannot tell the bound address: {e}"),
        }
        tasks.push(tokio::spawn(metrics::serve(listener, sources)));
    }
    let mut nts_tls = None;
    let mut ke_threads = None;
    if let Some(n) = nts {
        match n.listener.local_addr() {
            Ok(addr) => info!(
                "nts-ke listening on {addr} (certificate {}, NTP server {}, NTP port {}, cookie \
                 key rotated every {} s, {} thread{})",
                n.settings.certificate.display(),
                n.ntp.server.as_deref().unwrap_or("this one"),
                n.ntp.port.unwrap_or(123),
                n.settings.rotation.as_secs(),
                n.settings.ke_threads,
                if n.settings.ke_threads == 1 { "" } else { "s" },
            ),
            Err(e) => warn!("nts-ke: cannot tell the bound address: {e}"),
        }
        let limiter = n.settings.ratelimit.map(|r| {
            let table = ClientTable::new(r.limit, r.clients, rand::random());
            info!(
                "nts-ke: rate limiting on: ntsratelimit {}, {} client addresses tracked",
                r.limit,
                table.capacity()
            );
            table
        });
        let shared = Arc::new(nts_ke::KeShared::new(
            n.tls.clone(),
            n.cookies.clone(),
            n.ntp.clone(),
            n.counts.clone(),
            limiter,
            ntp.clone(),
        ));
        ke_threads = Some(
            nts_ke::KeThreads::spawn(&n.listener, &shared, n.settings.ke_threads)
                .context("cannot start the NTS-KE threads")?,
        );
        nts_ke::log_expiry(&n.settings.certificate, n.settings.not_after);
        if let Some(t) = n.settings.not_after {
            n.counts
                .certificate_not_after
                .store(t, std::sync::atomic::Ordering::Relaxed);
        }
        if fleet.is_none() {
            tasks.push(tokio::spawn(nts_ke::rotate(
                n.cookies,
                n.first_rotation,
                n.settings.rotation,
                n.settings.dump.clone().map(|(path, _)| path),
            )));
        }
        nts_tls = Some((n.tls, n.settings, n.counts));
    }
    if let Some(f) = &fleet {
        if nts_tls.is_none() {
            info!(
                "nts: no certificate, so no NTS-KE here: authenticated NTP for the cookies the \
                 fleet's NTS-KE members hand out"
            );
        }
        tasks.push(tokio::spawn(nts_ke::follow_fleet(
            f.cookies.clone(),
            f.secrets.clone(),
            f.period,
        )));
    }
    // From here signals are handled (before, SIGHUP's default would end the process).
    info!("running: SIGTERM or SIGINT stops, SIGHUP reloads");
    loop {
        tokio::select! {
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
            _ = sighup.recv() => reload(
                args,
                settings,
                &ntp,
                nts_tls.as_ref(),
                fleet.as_ref(),
                roughtime_shared.as_deref(),
            ),
        }
    }
    for t in tasks {
        t.abort();
    }
    if let Some(t) = ke_threads {
        t.stop();
    }
    Ok(())
}

/// SIGHUP: the NTS certificate and key, the NTS fleet secret, the Roughtime delegation bundle,
/// the access rules from the config file again, and the timezone in timezone-offset mode.
/// Anything that fails to load is reported and the state before kept.
fn reload(
    args: &Args,
    settings: &Settings,
    ntp: &ntp_worker::Shared,
    nts: Option<&NtsReload>,
    fleet: Option<&FleetControl>,
    roughtime: Option<&roughtime_worker::Shared>,
) {
    if let Some(f) = fleet {
        nts_ke::reload_fleet(&f.path, &f.secrets, &f.cookies, f.period);
    }
    if let (Some(rt), Some(shared)) = (&settings.roughtime, roughtime)
        && let config::RoughtimeKeys::Bundle { file, .. } = &rt.keys
    {
        online_keys::reload_bundle(file, shared);
    }
    if let Some((tls, nts, counts)) = nts {
        match nts_ke::load(&nts.certificate, &nts.private_key) {
            Ok(loaded) => {
                tls.store(loaded.config);
                counts.certificate_not_after.store(
                    loaded.not_after.unwrap_or(i64::MIN),
                    std::sync::atomic::Ordering::Relaxed,
                );
                info!(
                    "SIGHUP: NTS certificate reloaded from {}",
                    nts.certificate.display()
                );
                nts_ke::log_expiry(&nts.certificate, loaded.not_after);
            }
            Err(e) => warn!("SIGHUP: NTS certificate: {e}; keeping the one in force"),
        }
    }
    match config::reload_acl(args) {
        Ok(Some(acl)) => {
            // Logged once in force, so that whoever reads the line can rely on it.
            let shown = format!("{acl:?}");
            ntp.acl.store(Arc::new(acl));
            info!("SIGHUP: access rules reloaded: {shown}");
        }
        Ok(None) => info!("SIGHUP: no config file, so no access rules to reload"),
        Err(e) => warn!("SIGHUP: {e}; keeping the access rules in force"),
    }
    if let Some(name) = &settings.tz_offset {
        info!("SIGHUP: re-reading the timezone");
        if let Err(e) = load_zone(name.as_deref(), ntp, true) {
            warn!("{e}; keeping the zone loaded before");
        }
    }
}

/// Loads the timezone-offset mode's zone (afresh from disk on a reload) and publishes it to the
/// workers, with the warning every start (and reload) owes the operator.
fn load_zone(name: Option<&str>, shared: &ntp_worker::Shared, reload: bool) -> Result<(), String> {
    let (zone, description) = if reload {
        tz::reload(name)?
    } else {
        tz::load(name)?
    };
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
