//! chime's AF_XDP backend: the same [`BatchHandler`]s as chime-udp's socket workers, served from
//! frames the driver hands over directly, without the kernel's UDP/IP stack or a socket per
//! protocol.
//!
//! An XDP program (`bpf`) on the interface redirects plain UDP to the served addresses and ports
//! into one AF_XDP socket per receive queue (`xsk`, over the rings and UMEM of `ring`) and passes
//! everything else to the kernel. One worker thread per queue takes batches of frames off its RX
//! ring, checks each and copies its payload into the [`RxBatch`] of the protocol its port belongs
//! to (`frame`), runs that protocol's handler, writes each reply over its request's frame with the
//! headers swapped, and puts the frames on the TX ring: no syscall per batch in zero-copy mode, one
//! (the send kick) in copy mode.
//!
//! Receive times come from the XDP program, which reads `CLOCK_MONOTONIC` as it sees each frame
//! and leaves the reading in the frame's metadata; the worker converts it with one pair of clock
//! reads per batch. That is the same moment a kernel software receive timestamp marks, at the
//! driver, before any queueing. A frame whose metadata did not come through gets the time the
//! worker took the batch, and [`XdpStats`] counts which happened. Transmit timestamps are not
//! available here, so handlers never see [`BatchHandler::tx_timestamps`] on this path.
//!
//! The program is attached through a BPF link owned by [`XdpWorkers`], so it is detached when they
//! are dropped or the process dies.
//!
//! With chime-udp, the only crate of chime allowed `unsafe`: the memory shared with the kernel
//! (`ring`, tested without the kernel, and `xsk`), the `bpf(2)` calls (`bpf`) and `getifaddrs`
//! here. Linux only.
//!
//! A second program (`responder`) answers plain NTP client requests in the driver itself, from a
//! [`DriverState`] in a BPF map, and steers everything else as the first does; [`prog_test_run`]
//! runs either on frames through the kernel without a network, which is how the tests see it.
//! [`XdpConfig::in_driver`] attaches it instead of the first, with its [`DriverMaps`] for the
//! caller to keep the state current in and read the counts from.
//!
//! Module map: `asm` (the assembler both programs are written with), `bpf` (the steering program
//! and the calls that load, attach and test-run programs), `responder` (the answering program and
//! its state, with `responder::access`, the allow/deny rules it answers by, and
//! `responder::ratelimit`, its rate limiter), `prog_test_run` (either program run on frames), `xsk`
//! (one AF_XDP socket), `ring`
//! (the mapping and the rings shared with the kernel), `frame` (requests read out of frames,
//! replies made in place), and `sys` (libc helpers).

#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!("chime-xdp supports Linux only: it needs AF_XDP and bpf(2)");

mod asm;
mod bpf;
mod frame;
pub mod prog_test_run;
mod responder;
mod ring;
mod sys;
mod xsk;

use std::{
    ffi::CString,
    fs, io,
    net::{IpAddr, SocketAddr},
    os::fd::OwnedFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub use responder::DriverRule;
pub use responder::{
    ANSWER, DriverInput, DriverLimits, DriverMaps, DriverOutcome, DriverState, DriverZone,
    RATE_NEGATIVE, SMEAR, SYNCHRONISED, ZONE,
};
pub use xsk::XdpMode;

use chime_udp::{
    BatchHandler, RecvMeta, RxBatch, SendOutcome, Starting, Threads, Timestamp, TxBatch,
};

/// One protocol served through XDP: the addresses and ports its requests are sent to, and the
/// longest payload its handler takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpGroup {
    /// The UDP addresses served. An unspecified IP (`0.0.0.0`, `::`) stands for every address of
    /// that family the interface has when the workers are bound.
    pub addrs: Vec<SocketAddr>,
    /// Payloads longer than this reach the handler truncated.
    pub max_datagram: usize,
}

/// How to serve through XDP on one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    /// The interface's name.
    pub interface: String,
    /// Worker threads, one per receive queue from queue 0: the interface must have this many.
    pub threads: usize,
    /// The protocols served; a frame goes to the first group one of whose addresses it was sent to.
    pub groups: Vec<XdpGroup>,
    /// Zero-copy or copy mode; `None` tries zero-copy and falls back to copy.
    pub mode: Option<XdpMode>,
    /// CPUs to pin the threads to, as [`chime_udp::WorkerConfig::cpus`].
    pub cpus: Vec<usize>,
    /// The most frames taken off the RX ring at once, and so the most requests of one protocol a
    /// handler is given at once (a handler whose own limit is lower drops and counts the rest,
    /// as Roughtime's does past its batch size).
    pub batch_size: usize,
    /// Answer plain NTP client requests to the first group's addresses in the driver: attach
    /// the answering program (`responder`) instead of the steering one. It answers nothing
    /// until a state is written through [`XdpBound::driver_maps`].
    pub in_driver: bool,
    /// With [`Self::in_driver`], the client addresses its rate limiter tracks, rounded up to a
    /// power of two, at least 4 and at most 2^20 (96 bytes of kernel memory for every four);
    /// its limits are written through [`XdpBound::driver_maps`] ([`DriverMaps::set_limits`]).
    pub driver_clients: usize,
}

impl XdpConfig {
    /// One thread on `interface`, no groups yet, the mode the driver allows.
    pub fn new(interface: impl Into<String>) -> Self {
        Self {
            interface: interface.into(),
            threads: 1,
            groups: Vec::new(),
            mode: None,
            cpus: Vec::new(),
            batch_size: 64,
            in_driver: false,
            driver_clients: 0,
        }
    }
}

/// UMEM frames per socket and entries per ring: 16 MiB of frames, enough to keep a full RX ring
/// and a full TX ring in flight.
const FRAMES: u32 = 4096;
const RING: u32 = 2048;

/// How long an idle worker waits for frames before looking at the stop flag again.
const IDLE_WAIT_MS: i32 = 100;

/// The sockets made and the program attached, no thread started yet.
#[derive(Debug)]
pub struct XdpBound {
    cfg: XdpConfig,
    sockets: Vec<xsk::Xsk>,
    link: OwnedFd,
    _map: OwnedFd,
    mode: XdpMode,
    targets: Vec<Vec<SocketAddr>>,
    driver: Option<Arc<DriverMaps>>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// The interface's receive queues, from sysfs.
fn rx_queues(interface: &str) -> io::Result<usize> {
    let dir = format!("/sys/class/net/{interface}/queues");
    Ok(fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count())
}

/// Every address of the interface, from `getifaddrs`.
fn interface_addrs(interface: &str) -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a live pointer for the kernel's list; freed below.
    crate::sys::cvt(unsafe { libc::getifaddrs(&mut head) })?;
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is an element of the list getifaddrs made, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: the name is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if name.to_bytes() != interface.as_bytes() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points at a sockaddr of the family it states, of
        // at least that family's size.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    Some(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        out.extend(addr);
    }
    // SAFETY: `head` came from getifaddrs and is freed once; nothing borrowed from it remains.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// How long binding a queue is retried while another AF_XDP socket still holds it.
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// Each group's addresses, an unspecified one standing for every address of its family that
/// `own` (the interface's) holds.
fn group_targets(groups: &[XdpGroup], own: &[IpAddr]) -> Vec<Vec<SocketAddr>> {
    let expand = |a: &SocketAddr| -> Vec<SocketAddr> {
        if !a.ip().is_unspecified() {
            return vec![*a];
        }
        let family = own.iter().filter(|ip| ip.is_ipv4() == a.is_ipv4());
        family.map(|&ip| SocketAddr::new(ip, a.port())).collect()
    };
    (groups.iter())
        .map(|g| g.addrs.iter().flat_map(expand).collect())
        .collect()
}

/// What an operator can do about a failed step (`what`) of setting XDP up, from its errno.
fn hint(what: &str, e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) => " (needs CAP_NET_ADMIN and CAP_BPF, or root)",
        Some(libc::EBUSY) if what.starts_with("an AF_XDP socket") => {
            " (another AF_XDP socket holds the queue: another chimed on this interface, or \
             another program's)"
        }
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            " (the interface already has an XDP program: detach it with `ip link set dev IFACE \
             xdp off`)"
        }
        Some(libc::ENOBUFS) | Some(libc::ENOMEM) => {
            " (the frames are locked memory: raise RLIMIT_MEMLOCK, e.g. LimitMEMLOCK= in the \
             unit, or grant CAP_IPC_LOCK)"
        }
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {
            " (the driver may lack native XDP or AF_XDP support)"
        }
        _ => "",
    }
}

/// Makes the socket for queue `queue`, retrying for up to [`BUSY_WAIT`] while the queue is busy:
/// the kernel releases a dead process's AF_XDP sockets a little after the process is gone (its
/// program is detached at once), so a chimed restarted at once, or after `kill -9`, would
/// otherwise find its queues still taken by its predecessor.
fn socket_waiting_out_the_last(ifindex: u32, queue: u32, mode: XdpMode) -> io::Result<xsk::Xsk> {
    let deadline = Instant::now() + BUSY_WAIT;
    loop {
        match xsk::Xsk::new(ifindex, queue, FRAMES, RING, mode) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                tracing::debug!(
                    queue,
                    "queue busy; waiting for its last socket to be released"
                );
                thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// The program to attach: the steering one through the XSKMAP `map` to `prog_targets`, or with
/// `driver`'s maps the answering one, answering NTP (the first group of `targets`) in the driver.
fn program(
    map: &OwnedFd,
    prog_targets: &[bpf::Target],
    targets: &[Vec<SocketAddr>],
    driver: Option<&DriverMaps>,
) -> Vec<asm::Insn> {
    let map = std::os::fd::AsRawFd::as_raw_fd(map);
    match driver {
        None => bpf::program(map, prog_targets),
        Some(maps) => {
            let ntp: Vec<bpf::Target> = (targets.first().into_iter().flatten())
                .map(|a| (Some(a.ip()), a.port()))
                .collect();
            responder::program(
                map,
                maps.fds(),
                maps.access_fd(),
                maps.limiter(),
                prog_targets,
                &ntp,
            )
        }
    }
}

impl XdpBound {
    /// Makes one AF_XDP socket per thread on queues `0..threads`, loads the program for the
    /// groups' addresses and attaches it to the interface.
    ///
    /// Errors name what failed: an interface that does not exist or has too few queues, a
    /// kernel without AF_XDP or a process without `CAP_NET_ADMIN` / `CAP_BPF`, a driver without
    /// native XDP, or an interface that already has an XDP program (another process's, or one
    /// attached by `ip link`).
    pub fn bind(cfg: XdpConfig) -> io::Result<Self> {
        let iface = &cfg.interface;
        if cfg.threads == 0 || cfg.groups.is_empty() || cfg.batch_size == 0 {
            return Err(invalid(format!(
                "XDP on {iface}: at least one thread, one protocol and a batch of one are needed"
            )));
        }
        let c_name = CString::new(iface.as_str())
            .map_err(|_| invalid(format!("interface name {iface:?} has a NUL byte")))?;
        // SAFETY: a NUL-terminated name; the call only reads it.
        let ifindex = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("XDP: no interface named {iface}"),
            ));
        }
        let queues = rx_queues(iface)
            .map_err(|e| io::Error::new(e.kind(), format!("XDP on {iface}: its queues: {e}")))?;
        if cfg.threads > queues {
            return Err(invalid(format!(
                "XDP on {iface}: {} threads asked for, but the interface has {queues} receive \
                 queue(s): one thread serves one queue",
                cfg.threads
            )));
        }
        let targets = group_targets(&cfg.groups, &interface_addrs(iface)?);
        let prog_targets: Vec<bpf::Target> = (targets.iter().flatten())
            .map(|a| (Some(a.ip()), a.port()))
            .collect();
        if prog_targets.is_empty() {
            return Err(invalid(format!(
                "XDP on {iface}: none of the addresses to serve is on the interface"
            )));
        }
        let ctx = |what: &str, e: io::Error| {
            let hint = hint(what, &e);
            io::Error::new(e.kind(), format!("XDP on {iface}: {what}: {e}{hint}"))
        };
        let map = bpf::create_xskmap(queues as u32).map_err(|e| ctx("making the socket map", e))?;
        let mut sockets = Vec::with_capacity(cfg.threads);
        let mut mode = cfg.mode.unwrap_or(XdpMode::ZeroCopy);
        for q in 0..cfg.threads as u32 {
            let sock = match socket_waiting_out_the_last(ifindex, q, mode) {
                Err(e) if cfg.mode.is_none() && mode == XdpMode::ZeroCopy && q == 0 => {
                    tracing::debug!(error = %e, "no zero-copy AF_XDP; trying copy mode");
                    mode = XdpMode::Copy;
                    socket_waiting_out_the_last(ifindex, q, mode)
                }
                other => other,
            }
            .map_err(|e| ctx(&format!("an AF_XDP socket on queue {q}"), e))?;
            bpf::set_xskmap(&map, q, sock.fd()).map_err(|e| ctx("filling the socket map", e))?;
            sockets.push(sock);
        }
        let driver = (cfg.in_driver)
            .then(|| DriverMaps::new(cfg.driver_clients))
            .transpose()
            .map_err(|e| ctx("making the in-driver maps", e))?
            .map(Arc::new);
        let insns = program(&map, &prog_targets, &targets, driver.as_deref());
        let prog = bpf::load_xdp(&insns).map_err(|e| ctx("loading the XDP program", e))?;
        let link =
            bpf::attach_xdp(&prog, ifindex).map_err(|e| ctx("attaching the XDP program", e))?;
        tracing::info!(
            interface = %iface,
            threads = cfg.threads,
            ?mode,
            targets = ?prog_targets,
            in_driver = driver.is_some(),
            "XDP program attached"
        );
        Ok(Self {
            cfg,
            sockets,
            link,
            _map: map,
            mode,
            targets,
            driver,
        })
    }

    /// With [`XdpConfig::in_driver`], the answering program's maps: where its state is written,
    /// and its counts.
    pub fn driver_maps(&self) -> Option<Arc<DriverMaps>> {
        self.driver.clone()
    }

    /// Copy mode or zero-copy, as the driver granted.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// The addresses each group is served on, wildcards resolved.
    pub fn addrs(&self) -> &[Vec<SocketAddr>] {
        &self.targets
    }

    /// Starts one thread per queue, each with a handler per group made by `make(thread, group)`.
    pub fn spawn(
        self,
        stop: Arc<AtomicBool>,
        mut make: impl FnMut(usize, usize) -> Box<dyn BatchHandler>,
    ) -> io::Result<XdpWorkers> {
        let stats = Arc::new(XdpStats::default());
        let cfg = &self.cfg;
        let threads = self.sockets.into_iter().enumerate().map(|(i, sock)| {
            let groups = (cfg.groups.iter().zip(&self.targets).enumerate())
                .map(|(g, (group, addrs))| Group {
                    addrs: addrs.clone(),
                    handler: make(i, g),
                    rx: RxBatch::new(cfg.batch_size, group.max_datagram),
                    tx: TxBatch::new(cfg.batch_size, group.max_datagram),
                    reqs: Vec::with_capacity(cfg.batch_size),
                    built: 0..0,
                })
                .collect();
            let name = format!("xdp-{i}");
            let worker = XdpWorker {
                span: tracing::info_span!("worker", thread = %name),
                sock,
                groups,
                stop: Arc::clone(&stop),
                stats: Arc::clone(&stats),
                batch_size: cfg.batch_size,
            };
            let cpu = (!cfg.cpus.is_empty()).then(|| cfg.cpus[i % cfg.cpus.len()]);
            (name, cpu, move |starting| worker.run(starting))
        });
        let threads = Threads::spawn(threads, || stop.store(true, Ordering::Release))?;
        Ok(XdpWorkers {
            threads,
            stop,
            stats,
            mode: self.mode,
            _link: self.link,
        })
    }
}

/// What the XDP workers do to a frame, without the network (the `fuzzing` feature only): checks
/// `frame` as a worker does and,
/// if it is a well-formed UDP request, turns it into a reply carrying the request's first
/// `reply_len` payload bytes (at most all of them), then checks that reply the same way. Returns
/// the reply's length, or `None` for a frame a worker would drop. For the fuzzer, which must find
/// no frame that panics here, and no reply that does not parse back as going the other way.
///
/// # Panics
/// If the reply does not parse, or does not go from the request's destination back to its
/// source: a bug.
#[cfg(feature = "fuzzing")]
pub fn answer_frame_in_place(frame: &mut [u8], reply_len: usize) -> Option<usize> {
    let req = frame::parse(frame).ok()?;
    let len = reply_len.min(req.payload.1);
    let n = frame::make_reply(frame, &req, len);
    let reply = frame::parse(&frame[..n]).expect("a reply parses");
    assert_eq!(
        (reply.src, reply.dst),
        (req.dst, req.src),
        "the reply goes back"
    );
    assert_eq!(reply.payload, (req.payload.0, len));
    Some(n)
}

/// Counts the XDP workers keep beside their handlers', for the metrics.
#[derive(Debug, Default)]
pub struct XdpStats {
    /// Frames the program redirected that were not a well-formed request to a served address
    /// (bad checksum, lengths that do not add up): dropped.
    pub malformed: AtomicU64,
    /// Frames whose receive time came from the XDP program.
    pub rx_times_from_program: AtomicU64,
    /// Frames whose receive time is the worker's, read once per batch, because the program's
    /// did not come through.
    pub rx_times_from_worker: AtomicU64,
    /// Replies the TX ring had no room for: dropped.
    pub tx_ring_full: AtomicU64,
}

/// Running XDP workers; dropping them (or [`Self::join`]) stops them and detaches the program.
#[derive(Debug)]
pub struct XdpWorkers {
    threads: Threads,
    stop: Arc<AtomicBool>,
    stats: Arc<XdpStats>,
    mode: XdpMode,
    /// Declared last so that the threads are joined before the program is detached.
    _link: OwnedFd,
}

impl XdpWorkers {
    /// Copy mode or zero-copy, as the driver granted.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// The workers' own counts, shared with whoever reads them (the metrics).
    pub fn stats(&self) -> Arc<XdpStats> {
        Arc::clone(&self.stats)
    }

    /// Whether any worker has stopped: after the stop flag was set, or because its handler
    /// panicked. Lets a supervisor notice a dead worker without joining.
    pub fn any_finished(&self) -> bool {
        self.threads.any_finished()
    }

    /// Stops the workers, waits for them (at most about 100 ms each, their idle wait), and
    /// detaches the program. Returns the first panic's payload if a handler panicked.
    pub fn join(mut self) -> thread::Result<()> {
        self.stop.store(true, Ordering::Release);
        self.threads.join()
    }
}

impl Drop for XdpWorkers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// One protocol on one worker.
struct Group {
    addrs: Vec<SocketAddr>,
    handler: Box<dyn BatchHandler>,
    rx: RxBatch,
    tx: TxBatch,
    /// The frames of the batch in `rx`, in the same order: their UMEM addresses and what was in
    /// them.
    reqs: Vec<(u64, frame::Request)>,
    /// Where this group's replies of the batch in hand are in the frames put on the TX ring.
    built: std::ops::Range<usize>,
}

struct XdpWorker {
    span: tracing::Span,
    sock: xsk::Xsk,
    groups: Vec<Group>,
    stop: Arc<AtomicBool>,
    stats: Arc<XdpStats>,
    batch_size: usize,
}

/// `CLOCK_REALTIME` minus `CLOCK_MONOTONIC`, in nanoseconds: added to the program's monotonic
/// reading it gives the time of day. Read once per batch, so a clock step shows from the next.
fn realtime_offset() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one live timespec for the kernel to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mono = i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec);
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as i128;
    real - mono
}

impl XdpWorker {
    fn run(mut self, starting: Starting) {
        let span = self.span.clone();
        let _span = span.enter();
        starting.ready();
        let mut frames: Vec<(u64, usize)> = Vec::with_capacity(self.batch_size);
        let mut out: Vec<(u64, usize)> = Vec::with_capacity(self.batch_size);
        let mut batches = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            self.sock.collect_completed();
            self.sock.refill();
            frames.clear();
            self.sock
                .receive(self.batch_size as u32, |addr, len| frames.push((addr, len)));
            if frames.is_empty() {
                self.report_drops();
                for g in &mut self.groups {
                    g.handler.idle();
                }
                // The tests' fail point (the `failpoints` feature): `panic` is a worker that
                // falls over, `return` one whose loop ends, for the supervisor to notice.
                #[cfg(feature = "failpoints")]
                fail::fail_point!("xdp-worker", |_| ());
                self.sock.wait(IDLE_WAIT_MS);
                continue;
            }
            self.take(&frames);
            out.clear();
            for g in &mut self.groups {
                g.built = out.len()..out.len();
                if g.rx.is_empty() {
                    continue;
                }
                g.handler.handle(&g.rx, &mut g.tx);
                if !g.tx.is_empty() {
                    g.handler.before_send(&mut g.tx);
                }
                Self::build_replies(&mut self.sock, g, &mut out);
                g.built.end = out.len();
            }
            let queued = self.sock.transmit(&out);
            for &(addr, _) in &out[queued..] {
                self.sock.recycle(addr);
            }
            if queued < out.len() {
                self.stats
                    .tx_ring_full
                    .fetch_add((out.len() - queued) as u64, Ordering::Relaxed);
            }
            for g in &mut self.groups {
                if !g.tx.is_empty() {
                    // Its replies that found room on the TX ring were sent; the others, and any
                    // that could not be written into a frame, failed.
                    let sent = g.built.end.min(queued).saturating_sub(g.built.start);
                    let errors = g.tx.len() - sent;
                    let outcome = SendOutcome {
                        sent,
                        errors,
                        // ENOBUFS, as a full socket send queue says: no allocation.
                        last_error: (errors > 0)
                            .then(|| io::Error::from_raw_os_error(libc::ENOBUFS)),
                    };
                    g.handler.after_send(&outcome);
                    g.tx.clear();
                }
            }
            batches += 1;
            if batches >= chime_udp::DROPS_EVERY {
                batches = 0;
                self.report_drops();
            }
        }
        self.report_drops();
        for g in &mut self.groups {
            g.handler.finish();
        }
    }

    fn report_drops(&mut self) {
        if let Ok(s) = self.sock.stats()
            && let Some(g) = self.groups.first_mut()
        {
            // The handlers' count is the kernel's 32-bit wrapping one.
            g.handler.receive_drops(s.rx_dropped as u32);
        }
    }

    /// Sorts the received frames into their groups' batches, dropping and counting any that are
    /// not a well-formed request to a served address.
    fn take(&mut self, frames: &[(u64, usize)]) {
        for g in &mut self.groups {
            g.rx.reset();
            g.reqs.clear();
        }
        let offset = realtime_offset();
        let mut batch_time = None;
        let (mut from_program, mut from_worker, mut malformed) = (0u64, 0u64, 0u64);
        for &(addr, len) in frames {
            let Some(buf) = self.sock.frame_mut(addr, bpf::META_LEN, len) else {
                malformed += 1;
                self.sock.recycle(addr);
                continue;
            };
            let (meta, pkt) = buf.split_at_mut(bpf::META_LEN);
            let magic = u64::from_ne_bytes(meta[8..16].try_into().expect("8 bytes"));
            let timestamp = if magic == bpf::META_MAGIC {
                meta[8..16].fill(0);
                from_program += 1;
                let mono = u64::from_ne_bytes(meta[..8].try_into().expect("8 bytes"));
                Timestamp::from_nanos(i128::from(mono) + offset)
            } else {
                from_worker += 1;
                *batch_time.get_or_insert_with(Timestamp::now)
            };
            let group = frame::parse(pkt).ok().and_then(|req| {
                let g = self
                    .groups
                    .iter()
                    .position(|g| g.addrs.contains(&req.dst))?;
                Some((g, req))
            });
            let Some((g, req)) = group else {
                malformed += 1;
                self.sock.recycle(addr);
                continue;
            };
            let group = &mut self.groups[g];
            let mut m = RecvMeta::new(req.src, 0);
            m.dst_ip = Some(req.dst.ip());
            m.set_reply_ip(Some(req.dst.ip()));
            m.timestamp = Some(timestamp);
            let (off, n) = req.payload;
            if group.rx.push(m, &pkt[off..off + n]) {
                group.reqs.push((addr, req));
            } else {
                self.sock.recycle(addr);
            }
        }
        let s = &self.stats;
        s.rx_times_from_program
            .fetch_add(from_program, Ordering::Relaxed);
        s.rx_times_from_worker
            .fetch_add(from_worker, Ordering::Relaxed);
        if malformed > 0 {
            s.malformed.fetch_add(malformed, Ordering::Relaxed);
        }
    }

    /// Writes each reply of `g` over the frame of the request it answers, and gives the frames
    /// of requests without a reply back. Replies come in request order, one per request at most,
    /// so walking both lists together pairs them: a reply goes to its request's sender.
    fn build_replies(sock: &mut xsk::Xsk, g: &mut Group, out: &mut Vec<(u64, usize)>) {
        let mut reqs = g.reqs.iter();
        for (dst, payload) in g.tx.iter() {
            let mut found = None;
            for &(addr, req) in reqs.by_ref() {
                if req.src == dst {
                    found = Some((addr, req));
                    break;
                }
                sock.recycle(addr);
            }
            let Some((addr, req)) = found else {
                // A reply to no request of the batch: handlers do not send those.
                debug_assert!(
                    false,
                    "a reply to {dst} that no request of the batch asked for"
                );
                break;
            };
            let off = req.payload.0;
            if off + payload.len() > xsk::Xsk::room(addr) {
                sock.recycle(addr);
                continue;
            }
            let Some(f) = sock.frame_mut(addr, 0, xsk::Xsk::room(addr)) else {
                sock.recycle(addr);
                continue;
            };
            f[off..off + payload.len()].copy_from_slice(payload);
            let len = frame::make_reply(f, &req, payload.len());
            out.push((addr, len));
        }
        for &(addr, _) in reqs {
            sock.recycle(addr);
        }
    }
}
