//! Binding every socket while still privileged (port 123 needs it), before any service starts:
//! the NTP and Roughtime workers' UDP sockets, Roughtime's TCP listeners on the same ports, the
//! NTS-KE and metrics listeners, the control socket, and the AF_XDP sockets.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use anyhow::{Context, Result};
use chime_udp::{BoundWorkers, ShedTuning, WorkerConfig};
use tracing::{info, warn};

use crate::config::{Settings, schema, values};
use crate::control::listen as control;
use crate::roughtime::tcp as roughtime_tcp;
use crate::service::WORKER_WAKE;

/// The two services chimed runs on chime-udp workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    Ntp,
    Roughtime,
}

impl Service {
    pub(crate) fn name(self) -> &'static str {
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
pub(crate) struct Group {
    pub(crate) service: Service,
    /// Whether its workers shed under overload (which needs receive timestamps).
    pub(crate) shed: bool,
    pub(crate) family: &'static str,
    /// `ntp-ipv4`, `roughtime-ipv6`: the threads' names, and the service's.
    pub(crate) name: &'static str,
    pub(crate) threads: usize,
    pub(crate) workers: BoundWorkers,
}

/// Everything chimed listens on, bound.
pub(crate) struct Sockets {
    pub(crate) metrics: Option<TcpListener>,
    /// `--control-socket`'s, unless off or (at the default path) not to be made.
    pub(crate) control: Option<std::os::unix::net::UnixListener>,
    pub(crate) ntp: Vec<Group>,
    /// NTS-KE's listener, and the NTP port it names to clients when that is not 123.
    pub(crate) nts: Option<(TcpListener, Option<u16>)>,
    pub(crate) roughtime: Vec<Group>,
    /// Roughtime over TCP, on each Roughtime UDP socket's address and port.
    pub(crate) roughtime_tcp: Option<(Vec<TcpListener>, roughtime_tcp::Limits)>,
    pub(crate) xdp: Option<chime_xdp::XdpBound>,
}

/// Binds everything `settings` asks for.
pub(crate) fn all(settings: &Settings, shed: Option<&Arc<ShedTuning>>) -> Result<Sockets> {
    let metrics = match settings.observe.metrics_address {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .with_context(|| format!("--metrics-address {addr}: cannot bind"))?,
        ),
        None => None,
    };
    let mut ntp = Vec::new();
    for (family, threads, addr) in [
        (
            "ipv4",
            settings.ntp.ipv4_threads.0,
            settings.ntp.ipv4_address.0,
        ),
        (
            "ipv6",
            settings.ntp.ipv6_threads.0,
            settings.ntp.ipv6_address.0,
        ),
    ] {
        ntp.extend(group(
            (settings, shed),
            Service::Ntp,
            family,
            threads,
            addr,
        )?);
    }
    let nts = match settings.nts_ke() {
        Some(_) => {
            let addr = settings.nts.ke_address;
            let listener = TcpListener::bind(addr)
                .with_context(|| format!("--nts-ke-address {addr}: cannot bind"))?;
            // NTS-KE tells clients the NTP port when it is not 123: the one --nts-ntp-server
            // names, else this server's own (a port-0 bind's real one).
            let port = (settings.nts.ntp_server.as_ref())
                .and_then(|s| s.parts().1)
                .or_else(|| ntp.first().map(|g: &Group| g.workers.local_addr().port()))
                .filter(|&p| p != 123);
            Some((listener, port))
        }
        None => None,
    };
    let (roughtime, tcp_listeners) = roughtime(settings, shed)?;
    let roughtime_tcp = (settings.roughtime_key())
        .and(roughtime_tcp::Limits::of(&settings.roughtime.tcp))
        .map(|limits| (tcp_listeners, limits));
    let xdp = match &settings.xdp.interface {
        Some(interface) => xdp(&interface.0, settings, &ntp, &roughtime)?,
        None => None,
    };
    Ok(Sockets {
        metrics,
        control: control_socket(settings)?,
        ntp,
        nts,
        roughtime,
        roughtime_tcp,
        xdp,
    })
}

/// The control socket, in the group of `--user` if given (else the one chimed runs as). At the
/// default path, one that cannot be made (no /run/chimed off the unit, another chimed answering
/// there) is a warning: chimed serves on without it.
fn control_socket(settings: &Settings) -> Result<Option<std::os::unix::net::UnixListener>> {
    let setting = &settings.observe.control_socket;
    let Some(path) = setting.path() else {
        return Ok(None);
    };
    let group = match settings.process.user.as_deref() {
        Some(name) => nix::unistd::User::from_name(name)
            .with_context(|| format!("--user {name}: cannot look up the user"))?
            .map(|user| user.gid),
        None => None,
    };
    match control::bind(path, group) {
        Ok(listener) => {
            info!(
                "control: chime status and chime clients answered on {}",
                path.display()
            );
            Ok(Some(listener))
        }
        Err(e) if setting.is_default() => {
            warn!("control: no control socket: {e} (--control-socket PATH, or none)");
            Ok(None)
        }
        Err(e) => Err(e).context("--control-socket: cannot make the socket"),
    }
}

/// Roughtime's UDP sockets, and its TCP listeners on the same addresses and ports.
fn roughtime(
    settings: &Settings,
    shed: Option<&Arc<ShedTuning>>,
) -> Result<(Vec<Group>, Vec<TcpListener>)> {
    let (mut groups, mut listeners) = (Vec::new(), Vec::new());
    if settings.roughtime_key().is_none() {
        return Ok((groups, listeners));
    }
    let rt = &settings.roughtime;
    let tcp = rt.tcp.connections.0 > 0;
    for (family, threads, addr) in [
        ("ipv4", rt.ipv4_threads.0, rt.ipv4_address.0),
        ("ipv6", rt.ipv6_threads.0, rt.ipv6_address.0),
    ] {
        // Port 0 lets the kernel choose the UDP port, which a TCP connection may hold: then
        // choose again (a configured port is either free for both or an error).
        let mut tries = 0;
        loop {
            let Some(bound) = group((settings, shed), Service::Roughtime, family, threads, addr)?
            else {
                break;
            };
            if tcp {
                match roughtime_tcp::bind(bound.workers.local_addr()) {
                    Ok(listener) => listeners.push(listener),
                    Err(e) if addr.port() == 0 && tries < 20 => {
                        tries += 1;
                        tracing::debug!("roughtime: {e:#}; choosing another port");
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            groups.push(bound);
            break;
        }
    }
    Ok((groups, listeners))
}

fn group(
    (settings, shed): (&Settings, Option<&Arc<ShedTuning>>),
    service: Service,
    family: &'static str,
    threads: usize,
    addr: SocketAddr,
) -> Result<Option<Group>> {
    if threads == 0 {
        return Ok(None);
    }
    let name = match (service, family) {
        (Service::Ntp, "ipv4") => "ntp-ipv4",
        (Service::Ntp, _) => "ntp-ipv6",
        (Service::Roughtime, "ipv4") => "roughtime-ipv4",
        (Service::Roughtime, _) => "roughtime-ipv6",
    };
    let mut cfg = WorkerConfig::new(name, addr, threads);
    cfg.socket.recv_buffer = Some(settings.ntp.recv_buffer.0);
    // An idle worker wakes up now and then, so that the watchdog can tell it is alive.
    cfg.socket.read_timeout = Some(WORKER_WAKE);
    cfg.batch_size = settings.ntp.batch_size.0;
    cfg.cpus = settings.process.cpus.clone();
    cfg.shed = shed.cloned();
    if service == Service::Roughtime {
        let rt = &settings.roughtime;
        cfg.socket.recv_buffer = Some(rt.recv_buffer.0);
        cfg.batch_size = rt.batch_size.0;
        cfg.gather = rt.gather.duration();
    }
    // Roughtime signs the time read once per batch; per-datagram kernel timestamps are there only
    // to tell how long each request waited, for shedding.
    cfg.socket.rx_timestamps = service == Service::Ntp || cfg.shed.is_some();
    let flag = service.flag_prefix();
    let shed = cfg.shed.is_some();
    let workers = BoundWorkers::bind(cfg)
        .with_context(|| format!("--{flag}{family}-address {addr}: cannot bind"))?;
    Ok(Some(Group {
        service,
        shed,
        family,
        name,
        threads,
        workers,
    }))
}

/// Makes the AF_XDP sockets and attaches the program for `--xdp`, serving the addresses and
/// ports the sockets were bound to (so a port-0 bind's real port). With `--xdp-fallback` a
/// failure is logged and the sockets serve alone.
fn xdp(
    interface: &str,
    settings: &Settings,
    ntp: &[Group],
    rt: &[Group],
) -> Result<Option<chime_xdp::XdpBound>> {
    use chime_xdp::{XdpBound, XdpConfig, XdpGroup, XdpMode};
    let x: &schema::Xdp = &settings.xdp;
    let mut cfg = XdpConfig::new(interface.to_owned());
    cfg.threads = x.threads.0;
    cfg.mode = match x.mode {
        values::XdpMode::Auto => None,
        values::XdpMode::Copy => Some(XdpMode::Copy),
        values::XdpMode::ZeroCopy => Some(XdpMode::ZeroCopy),
    };
    cfg.cpus = settings.process.cpus.clone();
    cfg.in_driver = x.in_driver;
    cfg.driver_clients = settings.ntp_rate_limit().map_or(0, |r| r.clients);
    // Frames taken per loop: enough for a whole batch of either protocol, so that a Roughtime
    // signature can cover as many requests as on its sockets.
    let roughtime = settings.roughtime_key().is_some();
    let rt_batch = if roughtime {
        settings.roughtime.batch_size.0
    } else {
        0
    };
    cfg.batch_size = settings.ntp.batch_size.0.max(rt_batch);
    cfg.groups.push(XdpGroup {
        addrs: ntp.iter().map(|b| b.workers.local_addr()).collect(),
        max_datagram: 2048,
    });
    if roughtime {
        cfg.groups.push(XdpGroup {
            addrs: rt.iter().map(|b| b.workers.local_addr()).collect(),
            max_datagram: 2048,
        });
    }
    match XdpBound::bind(cfg) {
        Ok(b) => {
            info!(
                "xdp on {}: {} thread(s), {} mode, receive times from the XDP program; serving \
                 {:?}; interleaved NTP requests get basic replies on this path{}",
                interface,
                x.threads.0,
                mode_name(b.mode()),
                b.addrs(),
                if x.in_driver {
                    "; plain NTP client requests are answered in the driver"
                } else {
                    ""
                }
            );
            Ok(Some(b))
        }
        Err(e) if x.fallback => {
            tracing::warn!("{e}; --xdp-fallback: serving through the sockets alone");
            Ok(None)
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("--xdp {interface}"))),
    }
}

pub(crate) fn mode_name(mode: chime_xdp::XdpMode) -> &'static str {
    match mode {
        chime_xdp::XdpMode::ZeroCopy => "zero-copy",
        chime_xdp::XdpMode::Copy => "copy",
    }
}
