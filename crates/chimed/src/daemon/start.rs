//! Starting every service on the supervisor, the same way: the data plane's worker groups (one
//! per protocol and address family, and AF_XDP), Roughtime over TCP, NTS-KE, and the control
//! plane's tasks (the upstream poller, key rotations, the metrics endpoint). Each is watched
//! under its name from the moment it starts.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result};
use arc_swap::ArcSwap;
use chime_ntp::ClientTable;
use chime_ntp::nts::CookieKeys;
use chime_udp::BatchHandler;
use tracing::{info, warn};

use crate::clock::{self, upstream};
use crate::config::Settings;
use crate::control;
use crate::daemon::bind::{self, Group, Service, Sockets};
use crate::daemon::reload::{FleetKeys, NtsTls, Reloadable};
use crate::daemon::secrets::Secrets;
use crate::daemon::supervisor::Supervisor;
use crate::ntp::worker::{self as ntp_worker, NtpWorker};
use crate::nts::{ke as nts_ke, keys as nts_keys};
use crate::observe::{metrics, stats};
use crate::roughtime::udp::RoughtimeWorker;
use crate::roughtime::{self, keys as online_keys, tcp as roughtime_tcp};
use crate::service::Beat;

/// The services' shared state, made before any socket is bound.
pub(crate) struct Prepared {
    pub(crate) ntp: Arc<ntp_worker::Shared>,
    /// NTS's first cookie keys and when they are next due to rotate (`--nts-dump-dir`'s keep
    /// their schedule); `None` without NTS.
    pub(crate) nts_start: Option<(CookieKeys, Duration)>,
    pub(crate) roughtime: Option<roughtime::Control>,
    /// Shedding's settings, which every worker that sheds reads and SIGHUP replaces; `None`
    /// with shedding off.
    pub(crate) shed: Option<Arc<chime_udp::ShedTuning>>,
}

/// What the daemon holds on to while the services run: what a reload replaces, and the counts
/// it logs at exit.
pub(crate) struct Running {
    pub(crate) reloadable: Reloadable,
    /// The NTP workers' counts.
    pub(crate) ntp: Arc<stats::Workers<ntp_worker::NtpDrop>>,
    pub(crate) xdp: Option<Arc<chime_xdp::XdpStats>>,
    pub(crate) tcp: Option<(
        Arc<roughtime_tcp::Counts>,
        Arc<stats::Workers<crate::roughtime::state::RoughtimeDrop>>,
    )>,
    pub(crate) ke_counts: Option<Arc<nts_ke::KeCounts>>,
}

/// Starts every service. On an error, the services already started are the supervisor's to stop.
pub(crate) fn all(
    sup: &mut Supervisor,
    (settings, mut secrets): (&Settings, Secrets),
    prepared: Prepared,
    sockets: Sockets,
    log: crate::daemon::reload::LogFilter,
) -> Result<Running> {
    let ntp = &prepared.ntp;
    let rt_shared = prepared.roughtime.as_ref().map(|(_, _, s)| s.clone());
    let roughtime = (rt_shared.as_ref()).map(|shared| (shared, settings.roughtime.batch_size.0));
    // Every service registers what it serves on the metrics endpoint as it starts.
    let mut registry = metrics::Registry::new(clock::read().unix_secs());
    let metrics = &mut registry;
    data_plane(
        (sup, metrics),
        (sockets.ntp, sockets.roughtime),
        ntp,
        roughtime,
    )?;
    let xdp = match sockets.xdp {
        Some(bound) => Some(xdp(
            (sup, metrics),
            bound,
            settings,
            ntp,
            rt_shared.as_ref(),
        )?),
        None => None,
    };
    let tcp = match (sockets.roughtime_tcp, &rt_shared) {
        (Some((listeners, limits)), Some(shared)) => Some(tcp(
            (sup, metrics),
            listeners,
            limits,
            shared,
            (settings, &secrets, prepared.shed.clone()),
        )?),
        _ => None,
    };
    let ke_counts = (secrets.tls.as_ref()).map(|_| Arc::new(nts_ke::KeCounts::default()));
    let nts = match (sockets.nts, &secrets.tls, &ke_counts, &ntp.cookies) {
        (Some(listener), Some(tls), Some(counts), Some(cookies)) => Some(nts_ke_service(
            (sup, metrics),
            listener,
            (settings, tls),
            counts,
            (cookies, ntp, settings.ntp.v5),
            secrets.pool.take(),
        )?),
        _ => None,
    };
    let fleet = tasks(
        (sup, metrics),
        (settings, &mut secrets),
        &prepared,
        nts.is_some(),
    );
    if let Some(listener) = sockets.metrics {
        metrics_service(sup, listener, registry);
    }
    let running = Running {
        reloadable: Reloadable {
            log: (
                log,
                std::sync::Mutex::new(settings.observe.log_level.0.clone()),
            ),
            clock: prepared.ntp.clock.clone(),
            access: prepared.ntp.access.clone(),
            nts,
            fleet,
            roughtime: rt_shared,
            restart: Arc::default(),
            ntp_limiter: prepared.ntp.ratelimit.clone(),
            shed: prepared.shed.clone(),
        },
        ntp: prepared.ntp.workers.clone(),
        xdp,
        tcp,
        ke_counts,
    };
    if let Some(listener) = sockets.control {
        let registry = control_sections(settings, &prepared, &running);
        sup.task("control", control::serve(listener, registry));
    }
    Ok(running)
}

/// What the control socket's `status` reads, section by section, each from the state its service
/// shares.
fn control_sections(
    settings: &Settings,
    prepared: &Prepared,
    running: &Running,
) -> control::Registry {
    let mut registry = control::Registry::default();
    let ntp = running.ntp.clone();
    registry.section("ntp", move |_| ntp.total().as_json());
    if prepared.ntp.clients.is_some() {
        let ntp = prepared.ntp.clone();
        registry.clients(move |top| ntp.clients(top).unwrap_or_default());
    }
    let (clock, upstream) = (prepared.ntp.clock.clone(), settings.upstream.server_address);
    registry.section("upstream", move |health| {
        upstream::status(&clock, upstream, health)
    });
    if let Some(counts) = running.ke_counts.clone() {
        registry.section("nts_ke", move |health| counts.status(health));
    }
    if let Some(cookies) = prepared.ntp.cookies.clone() {
        let rotation = nts_keys::Rotation::of(settings);
        let fleet = running.reloadable.fleet.is_some();
        registry.section("nts_cookie_keys", move |_| {
            let keys = cookies.load();
            serde_json::json!({
                "current_id": format!("{:08x}", keys.current_id()),
                "kept": keys.kept().len(),
                "kept_setting": rotation.kept,
                "rotation_seconds": rotation.every.as_secs_f64(),
                "cookie_life_seconds": rotation.cookie_life().as_secs_f64(),
                "fleet": fleet,
            })
        });
    }
    if let Some(rt) = running.reloadable.roughtime.clone() {
        registry.section("roughtime", move |health| online_keys::status(&rt, health));
    }
    if let Some((_, workers)) = running.tcp.clone() {
        registry.section("roughtime_tcp", move |_| workers.total().as_json());
    }
    if let Some(tuning) = prepared.shed.clone() {
        registry.section("overload", move |_| {
            let cfg = tuning.get();
            serde_json::json!({
                "shed_target_seconds": cfg.target.as_secs_f64(),
                "shed_interval_seconds": cfg.interval.as_secs_f64(),
            })
        });
    }
    let restart = running.reloadable.restart.clone();
    registry.section("reload", move |health| {
        let keys = restart
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for key in &keys {
            health.warnings.push(format!(
                "{key} changed in the config file: restart chimed for it"
            ));
        }
        serde_json::json!({ "needs_restart": keys })
    });
    registry
}

/// Starts the metrics endpoint on its listener.
fn metrics_service(
    sup: &mut Supervisor,
    listener: std::net::TcpListener,
    registry: metrics::Registry,
) {
    match listener.local_addr() {
        Ok(addr) => info!("metrics: http://{addr}/metrics"),
        Err(e) => warn!("metrics: cannot tell the bound address: {e}"),
    }
    sup.task("metrics", metrics::serve(listener, registry));
}

/// Starts the NTP and the Roughtime workers on their sockets, group by group.
fn data_plane(
    (sup, metrics): (&mut Supervisor, &mut metrics::Registry),
    (ntp_groups, rt_groups): (Vec<Group>, Vec<Group>),
    ntp: &Arc<ntp_worker::Shared>,
    roughtime: Option<(&Arc<crate::roughtime::state::Shared>, usize)>,
) -> Result<()> {
    metrics.workers(ntp.workers.clone());
    for group in ntp_groups {
        let family = group.family;
        workers(sup, group, |i, beat| {
            NtpWorker::new(ntp.clone(), family, i).with_heartbeat(beat)
        })?;
    }
    let Some((shared, batch)) = roughtime else {
        return Ok(());
    };
    metrics.workers(shared.workers.clone());
    for group in rt_groups {
        let family = group.family;
        workers(sup, group, |i, beat| {
            RoughtimeWorker::new(shared.clone(), batch, (family, i)).with_heartbeat(beat)
        })?;
    }
    Ok(())
}

/// Starts one group of workers and watches it under its name.
fn workers<H: BatchHandler>(
    sup: &mut Supervisor,
    group: Group,
    mut make: impl FnMut(usize, Beat) -> H,
) -> Result<()> {
    let addr = group.workers.local_addr();
    let caps = group.workers.capabilities();
    let name = group.name;
    // The workers' own stop flag: the supervisor raises it (Workers::join) on the stop signal.
    let stop = Arc::new(AtomicBool::new(false));
    let running = crate::service::span(name)
        .in_scope(|| group.workers.spawn(stop, |i| make(i, sup.beat())))
        .with_context(|| format!("cannot start the {name} threads"))?;
    sup.threads(name, running);
    let service = group.service.name();
    let timestamps = match (group.service, caps.rx_timestamps) {
        (Service::Ntp, true) => "kernel receive timestamps: yes, ",
        (Service::Ntp, false) => "kernel receive timestamps: no, ",
        (Service::Roughtime, _) => "",
    };
    info!(
        "{service} listening on {addr} ({} threads, {timestamps}pktinfo: {}, receive buffer {} \
         bytes, as the kernel counts it: twice the setting's)",
        group.threads,
        if caps.pktinfo { "yes" } else { "no" },
        caps.recv_buffer
    );
    if !caps.rx_timestamps && group.service == Service::Ntp {
        warn!(
            "{name}: no kernel receive timestamps; receive times are read once per batch instead"
        );
    }
    if !caps.rx_timestamps && group.shed {
        warn!(
            "{name}: no kernel receive timestamps, so how long each waited is unknown: no shedding"
        );
    }
    Ok(())
}

/// Starts the AF_XDP workers: group 0 answers NTP, group 1 Roughtime.
fn xdp(
    (sup, metrics): (&mut Supervisor, &mut metrics::Registry),
    bound: chime_xdp::XdpBound,
    settings: &Settings,
    ntp: &Arc<ntp_worker::Shared>,
    rt_shared: Option<&Arc<crate::roughtime::state::Shared>>,
) -> Result<Arc<chime_xdp::XdpStats>> {
    let rt_batch = settings.roughtime.batch_size.0;
    let mode = bind::mode_name(bound.mode());
    let driver = bound.driver_maps();
    if let Some(maps) = &driver {
        // The rules before the state: the program answers nothing until the state's first write.
        (ntp.access.answer_in_driver(maps.clone()))
            .context("cannot write the access rules into the driver")?;
        // The limits before the state: the program answers nothing until the state's first write,
        // so no request is answered there unlimited.
        if let Some(r) = settings.ntp_rate_limit() {
            crate::ntp::limit_in_driver(maps, Some(r.limit))
                .context("writing the rate limits into the driver")?;
            info!(
                "xdp: rate limiting in the driver too: ratelimit {}, {} client addresses tracked \
                 there ({} KiB of kernel memory)",
                r.limit,
                maps.clients_capacity(),
                maps.clients_bytes() / 1024
            );
        }
        ntp.clock.answer_in_driver(maps.clone());
    }
    let make = |i, group| -> Box<dyn BatchHandler> {
        let beat = sup.beat();
        match (group, rt_shared) {
            (0, _) => {
                let worker = NtpWorker::new(ntp.clone(), "xdp", i);
                Box::new(worker.without_interleaved().with_heartbeat(beat))
            }
            (_, Some(shared)) => {
                let worker = RoughtimeWorker::new(shared.clone(), rt_batch, ("xdp", i));
                Box::new(worker.with_heartbeat(beat))
            }
            (_, None) => unreachable!("a Roughtime group only with Roughtime on"),
        }
    };
    let running = crate::service::span("xdp")
        .in_scope(|| bound.spawn(Arc::new(AtomicBool::new(false)), make))
        .context("cannot start the XDP threads")?;
    let stats = running.stats();
    sup.threads("xdp", running);
    if let Some(interface) = &settings.xdp.interface {
        metrics.collector(
            "xdp",
            metrics::Xdp {
                interface: interface.0.clone(),
                mode,
                stats: stats.clone(),
                driver,
            },
        );
    }
    Ok(stats)
}

/// Starts Roughtime over TCP.
fn tcp(
    (sup, metrics): (&mut Supervisor, &mut metrics::Registry),
    listeners: Vec<std::net::TcpListener>,
    limits: roughtime_tcp::Limits,
    shared: &Arc<crate::roughtime::state::Shared>,
    (settings, secrets, shed): (&Settings, &Secrets, Option<Arc<chime_udp::ShedTuning>>),
) -> Result<(
    Arc<roughtime_tcp::Counts>,
    Arc<stats::Workers<crate::roughtime::state::RoughtimeDrop>>,
)> {
    info!(
        "roughtime-tcp: at most {} connections, {} per address, closed after {} s idle or {} s \
         in all",
        limits.connections,
        limits.per_address,
        limits.idle.as_secs_f64(),
        limits.lifetime.as_secs_f64()
    );
    // The experimental ML-DSA-44 suite, where it is built in and configured.
    #[cfg(feature = "mldsa")]
    let pq_now = {
        let rotation = settings.roughtime.rotation.duration();
        roughtime::mldsa::start(secrets.mldsa.as_ref(), rotation).map(|pq| {
            let now = pq.now.clone();
            sup.task("roughtime-mldsa-keys", roughtime::mldsa::rotate_pq(pq));
            now
        })
    };
    #[cfg(not(feature = "mldsa"))]
    let pq_now = {
        let _ = (settings, secrets);
        None
    };
    let counts = Arc::new(roughtime_tcp::Counts::default());
    let workers = Arc::new(stats::Workers::new("roughtime"));
    let (beat, stop) = (sup.beat(), sup.stop_signal());
    let service = crate::service::span("roughtime-tcp").in_scope(|| {
        roughtime_tcp::spawn(
            listeners,
            shared.clone(),
            limits,
            (counts.clone(), workers.clone()),
            (pq_now, shed),
            (beat, stop),
        )
    })?;
    sup.threads("roughtime-tcp", service);
    metrics.workers(workers.clone());
    metrics.encoded("roughtime-tcp", counts.clone(), roughtime_tcp::encode);
    Ok((counts, workers))
}

/// Starts NTS-KE on its threads.
fn nts_ke_service(
    (sup, metrics): (&mut Supervisor, &mut metrics::Registry),
    (listener, port): (std::net::TcpListener, Option<u16>),
    (settings, (config, not_after)): (&Settings, &(Arc<rustls::ServerConfig>, Option<i64>)),
    counts: &Arc<nts_ke::KeCounts>,
    (cookies, ntp, ntpv5): (&nts_keys::InForce, &Arc<ntp_worker::Shared>, bool),
    pool: Option<(std::path::PathBuf, chime_ntp::nts::PoolTokens)>,
) -> Result<NtsTls> {
    let nts = &settings.nts;
    let (certificate, private_key) = settings.nts_ke().context("NTS-KE without its files")?;
    let negotiation = Arc::new(chime_ntp::nts::NtpNegotiation {
        server: nts.ntp_server.as_ref().map(|s| s.parts().0),
        port,
    });
    let (rotation, threads) = (nts_keys::Rotation::of(settings), nts.ke_threads.0);
    match listener.local_addr() {
        Ok(addr) => info!(
            "nts-ke listening on {addr} (certificate {}, NTP server {}, NTP port {}, cookie key \
             rotated every {} s with {} kept: cookies open for up to {} s, {} thread{})",
            certificate.display(),
            negotiation.server.as_deref().unwrap_or("this one"),
            negotiation.port.unwrap_or(123),
            rotation.every.as_secs_f64(),
            rotation.kept,
            rotation.cookie_life().as_secs_f64(),
            threads,
            if threads == 1 { "" } else { "s" },
        ),
        Err(e) => warn!("nts-ke: cannot tell the bound address: {e}"),
    }
    let limiter = settings.nts_rate_limit().map(|r| {
        let table = ClientTable::new(r.limit, r.clients, rand::random());
        info!(
            "nts-ke: rate limiting on: ntsratelimit {}, {} client addresses tracked",
            r.limit,
            table.capacity()
        );
        Arc::new(table)
    });
    let tls = Arc::new(ArcSwap::new(config.clone()));
    let (pool_file, tokens) = pool.unzip();
    let tokens = Arc::new(ArcSwap::from_pointee(tokens.unwrap_or_default()));
    if let Some(file) = &pool_file {
        let n = tokens.load().len();
        info!(
            "nts-ke: a member of NTS pools: {n} token{} from {}",
            if n == 1 { "" } else { "s" },
            file.display()
        );
    }
    let shared = Arc::new(nts_ke::KeShared::new(
        (tls.clone(), cookies.clone(), tokens.clone()),
        negotiation,
        counts.clone(),
        limiter.clone(),
        (ntp.access.clone(), ntpv5),
    ));
    let beats = (0..threads).map(|_| sup.beat()).collect();
    let stop = sup.stop_signal();
    let threads = crate::service::span("nts-ke")
        .in_scope(|| nts_ke::KeThreads::spawn(&listener, &shared, beats, &stop))
        .context("cannot start the NTS-KE threads")?;
    sup.threads("nts-ke", threads);
    metrics.encoded("nts-ke", counts.clone(), nts_ke::encode);
    nts_ke::log_expiry(certificate, *not_after);
    if let Some(t) = *not_after {
        counts
            .certificate_not_after
            .store(t, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(NtsTls {
        tls,
        files: (certificate.to_owned(), private_key.to_owned()),
        counts: counts.clone(),
        pool: pool_file.map(|file| (file, tokens)),
        limiter,
    })
}

/// Starts the control plane's tasks: the upstream poller, Roughtime's key rotation, and NTS's
/// cookie-key rotation (a fleet's keys follow its periods, with or without NTS-KE here).
fn tasks(
    (sup, metrics): (&mut Supervisor, &mut metrics::Registry),
    (settings, secrets): (&Settings, &mut Secrets),
    prepared: &Prepared,
    nts_ke_here: bool,
) -> Option<FleetKeys> {
    let ntp = prepared.ntp.clone();
    let upstream = &settings.upstream;
    let (server, interval) = (upstream.server_address, upstream.poll_interval.duration());
    metrics.encoded("upstream", ntp.clock.clone(), upstream::encode);
    let stats_interval = ntp.stats_interval;
    sup.task(
        "upstream",
        upstream::run(server, interval, (ntp.clock.clone(), stats_interval)),
    );
    if let Some((signer, rotation, shared)) = prepared.roughtime.clone() {
        metrics.encoded("roughtime-keys", shared.clone(), online_keys::encode);
        sup.task("roughtime-keys", online_keys::run(signer, rotation, shared));
    }
    let cookies = prepared.ntp.cookies.clone()?;
    // The fleet's secrets are taken out of the settings, which live as long as the process: once
    // SIGHUP replaces them, no copy of the old ones is left to outlive the replacement.
    let Some(fleet) = secrets.fleet.take() else {
        if secrets.tls.is_some() {
            let first = prepared
                .nts_start
                .as_ref()
                .map_or(Duration::ZERO, |(_, next)| *next);
            let rotation = nts_keys::Rotation::of(settings);
            let dump = secrets.dump.as_ref().map(|(path, _)| path.clone());
            sup.task(
                "nts-cookie-keys",
                nts_ke::rotate(cookies, first, rotation, dump),
            );
        }
        return None;
    };
    if !nts_ke_here {
        info!(
            "nts: no certificate, so no NTS-KE here: authenticated NTP for the cookies the \
             fleet's NTS-KE members hand out"
        );
    }
    let keys = FleetKeys {
        path: fleet.path,
        rotation: fleet.rotation,
        secrets: Arc::new(ArcSwap::from_pointee(fleet.secrets)),
        cookies,
    };
    let (cookies, secrets) = (keys.cookies.clone(), keys.secrets.clone());
    sup.task(
        "nts-fleet-keys",
        nts_ke::follow_fleet(cookies, secrets, keys.rotation),
    );
    Some(keys)
}
