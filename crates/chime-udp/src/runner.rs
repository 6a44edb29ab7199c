//! The data plane's worker threads: N threads, each owning one `SO_REUSEPORT` socket, each
//! looping receive batch → handler → send batch.
//!
//! Binding ([`BoundWorkers::bind`]) and starting ([`BoundWorkers::spawn`]) are separate steps so
//! the daemon can bind privileged ports, drop privileges, and only then start threads that touch
//! client data. The protocol logic lives behind [`BatchHandler`]; this module only moves batches
//! and deals with socket errors without letting them flood the log or spin a CPU. The threads are
//! started, pinned and joined as a group by [`crate::Threads`].

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    Capabilities, RxBatch, SendOutcome, ShedTuning, Shedder, SocketConfig, Starting, Threads,
    Timestamp, TxBatch, UdpSocket, affinity, error::ConfigError, sys,
};

/// The protocol side of a worker: turns each received batch into replies.
///
/// One handler value is made per worker thread and lives on it, so per-client state (rate limits,
/// counters) needs no locks: the kernel sends a given client to the same socket every time.
pub trait BatchHandler: Send + 'static {
    /// Handles one received batch, queueing replies in `tx` (which is empty on entry).
    fn handle(&mut self, rx: &RxBatch, tx: &mut TxBatch);

    /// Called immediately before the queued replies are sent, when `tx` is not empty: the place
    /// to stamp transmit times (NTP's T3), as late as possible.
    fn before_send(&mut self, _tx: &mut TxBatch) {}

    /// Called after the queued replies were sent, with what became of them. Send errors are
    /// reported only here: counting and logging them (at most once per interval) is the
    /// handler's job, since it knows the protocol and keeps the counters.
    fn after_send(&mut self, _outcome: &SendOutcome) {}

    /// Called after a send in which some replies asked for their transmit timestamps
    /// ([`TxBatch::request_tx_timestamp`]), with those that came back: each datagram as it left
    /// (at the end of the bytes, after the headers) and when, in its [`crate::RecvMeta::timestamp`].
    fn tx_timestamps(&mut self, _looped: &RxBatch) {}

    /// Called when datagrams of a received batch were shed under a standing overload
    /// ([`WorkerConfig::shed`]), before the rest of the batch (possibly empty) is handled: they
    /// were received but are not in the batch, and get no reply. For counting.
    fn shed(&mut self, _count: usize) {}

    /// Called after a receive that returned nothing: a timeout, so at least every read timeout
    /// while idle if the socket has one (workers have none by default), or the wake-up of a stop.
    fn idle(&mut self) {}

    /// Called after a receive that failed with anything other than a timeout. The worker has
    /// already logged it (at most once per interval) and will back off briefly.
    fn recv_error(&mut self, _error: &io::Error) {}

    /// Called now and then (every [`DROPS_EVERY`] batches, every batch while shedding, when
    /// idle, and before [`BatchHandler::finish`]) with the kernel's count of datagrams dropped at this worker's
    /// socket before they could be received ([`crate::UdpSocket::receive_drops`]: cumulative,
    /// 32 bits, wrapping).
    fn receive_drops(&mut self, _total: u32) {}

    /// Called once when the worker stops, after its last batch.
    fn finish(&mut self) {}
}

/// Batches between two calls of [`BatchHandler::receive_drops`] under load, part of that
/// method's contract for every backend that serves [`BatchHandler`]s (this crate's workers,
/// chime-xdp's): a few dozen reads of the kernel's drop count a second at thousands of batches a
/// second, nothing against the batches themselves.
pub const DROPS_EVERY: u32 = 64;

/// How to bind and run one group of workers: one protocol on one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The thread name prefix: threads are named `"{name}-{i}"`. Linux keeps the first 15 bytes
    /// of a thread name, so a short prefix keeps the numbers visible in `top -H`.
    pub name: String,
    /// How to bind each thread's socket; all share its address.
    pub socket: SocketConfig,
    /// The number of threads (and sockets).
    pub threads: usize,
    /// The most datagrams per receive and per send. Default 64.
    pub batch_size: usize,
    /// The receive and send buffer size per datagram; longer datagrams arrive truncated. Default
    /// 2048.
    pub max_datagram: usize,
    /// CPUs to pin the threads to: thread `i` runs on `cpus[i % cpus.len()]`. Empty (the
    /// default) leaves scheduling to the kernel. See [`crate::allowed_cpus`].
    pub cpus: Vec<usize>,
    /// Gathering under load: when a receive returns two datagrams or more but under a quarter of
    /// a batch, wait this long and add what arrived meanwhile ([`crate::UdpSocket::recv_more`])
    /// before handling the batch. A lone datagram is never held back; once a receive already
    /// finds a quarter of a batch queued the load batches itself and nothing waits; and nothing
    /// waits while the arrival rate would keep the thread three quarters busy even in large
    /// batches (measured by the worker as it goes), since near saturation a wait only idles a
    /// core that has no time to spare. `None` (the default) handles every receive at once. For
    /// handlers whose cost per batch dwarfs their cost per datagram, such as one signature per
    /// batch.
    pub gather: Option<Duration>,
    /// Shedding under a standing overload ([`crate::Shedder`]): once the oldest datagram of
    /// every batch has waited longer than the target for an interval, those that waited longer
    /// than the target are received and not answered ([`BatchHandler::shed`]), so that the
    /// newest are, and the socket's receive buffer is shortened so that the kernel drops the
    /// excess, until the overload passes. Needs kernel receive timestamps (without them nothing
    /// is shed). While shedding, the socket's drop count is read after every batch, not every
    /// [`DROPS_EVERY`]. The settings are shared ([`ShedTuning`]): every worker reads them once
    /// per batch, so that they may be changed while the workers run. `None` (the default)
    /// answers everything however long it waited.
    pub shed: Option<Arc<ShedTuning>>,
}

impl WorkerConfig {
    /// The defaults for `threads` workers named `name` on `addr`.
    pub fn new(name: impl Into<String>, addr: SocketAddr, threads: usize) -> Self {
        Self {
            name: name.into(),
            socket: SocketConfig::new(addr),
            threads,
            batch_size: 64,
            max_datagram: 2048,
            cpus: Vec::new(),
            gather: None,
            shed: None,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.threads == 0 {
            return Err(ConfigError::NoThreads);
        }
        if self.batch_size == 0 {
            return Err(ConfigError::ZeroBatchSize);
        }
        if self.max_datagram == 0 {
            return Err(ConfigError::ZeroMaxDatagram);
        }
        if self.threads > 1 && !self.socket.reuse_port {
            return Err(ConfigError::ReusePortOff {
                threads: self.threads,
                addr: self.socket.addr,
            });
        }
        if let Some(&cpu) = self.cpus.iter().find(|&&cpu| cpu >= affinity::MAX_CPUS) {
            return Err(ConfigError::CpuOutOfRange {
                cpu,
                max: affinity::MAX_CPUS - 1,
            });
        }
        Ok(())
    }
}

/// A group of workers with every socket bound and no thread started yet.
#[derive(Debug)]
pub struct BoundWorkers {
    cfg: WorkerConfig,
    sockets: Vec<UdpSocket>,
    local_addr: SocketAddr,
    caps: Capabilities,
}

impl BoundWorkers {
    /// Binds `cfg.threads` sockets to `cfg.socket.addr`, sharing it with `SO_REUSEPORT`.
    ///
    /// With port 0 the first socket gets a port from the kernel and the others bind to that same
    /// port, so the group serves one address however many threads it has.
    pub fn bind(cfg: WorkerConfig) -> io::Result<Self> {
        cfg.validate()?;
        let first = UdpSocket::bind(&cfg.socket)?;
        let local_addr = first.local_addr()?;
        let mut rest_cfg = cfg.socket.clone();
        // Only the port: the configured address keeps its wildcard, scope and flow info.
        rest_cfg.addr.set_port(local_addr.port());

        let mut caps = first.capabilities();
        let mut sockets = Vec::with_capacity(cfg.threads);
        sockets.push(first);
        for _ in 1..cfg.threads {
            let sock = UdpSocket::bind(&rest_cfg)?;
            // The sockets are set up alike, so this only differs if the kernel changed its mind;
            // report what every socket has.
            let c = sock.capabilities();
            caps.rx_timestamps &= c.rx_timestamps;
            caps.pktinfo &= c.pktinfo;
            caps.recv_buffer = caps.recv_buffer.min(c.recv_buffer);
            sockets.push(sock);
        }
        // Debug, not info: the daemon reports what it listens on in its own words.
        tracing::debug!(
            name = %cfg.name,
            addr = %local_addr,
            threads = cfg.threads,
            rx_timestamps = caps.rx_timestamps,
            pktinfo = caps.pktinfo,
            recv_buffer = caps.recv_buffer,
            "sockets bound"
        );
        Ok(Self {
            cfg,
            sockets,
            local_addr,
            caps,
        })
    }

    /// The address the workers serve, with the real port if port 0 was asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the kernel granted every socket.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// Starts one thread per socket, each running a handler made by `make(i)`, until `stop` is
    /// set.
    ///
    /// Returns once every thread has started (and is pinned, if asked). If one cannot start, this
    /// sets `stop`, waits for the threads already started to finish, and returns the error
    /// ([`Threads::spawn`]).
    pub fn spawn<H: BatchHandler, F: FnMut(usize) -> H>(
        self,
        stop: Arc<AtomicBool>,
        mut make: F,
    ) -> io::Result<Workers> {
        let Self {
            cfg,
            sockets,
            local_addr,
            caps,
        } = self;
        let sockets: Vec<Arc<UdpSocket>> = sockets.into_iter().map(Arc::new).collect();
        let threads = sockets.iter().enumerate().map(|(i, socket)| {
            let name = format!("{}-{i}", cfg.name);
            let cpu = (!cfg.cpus.is_empty()).then(|| cfg.cpus[i % cfg.cpus.len()]);
            let worker = Worker {
                span: tracing::info_span!("worker", thread = %name),
                socket: Arc::clone(socket),
                stop: Arc::clone(&stop),
                cpu,
                batch_size: cfg.batch_size,
                max_datagram: cfg.max_datagram,
                gather: cfg.gather,
                shed: cfg.shed.clone(),
            };
            let handler = make(i);
            (name, cpu, move |starting| worker.run(handler, starting))
        });
        let threads = Threads::spawn(threads, || stop_workers(&stop, &sockets))?;
        Ok(Workers {
            threads,
            sockets,
            stop,
            local_addr,
            caps,
        })
    }
}

/// Running workers.
///
/// [`Workers::join`] (or dropping this) stops them: it sets the stop flag and shuts their sockets
/// down for reading, which wakes a worker blocked waiting for traffic.
#[derive(Debug)]
pub struct Workers {
    threads: Threads,
    sockets: Vec<Arc<UdpSocket>>,
    stop: Arc<AtomicBool>,
    local_addr: SocketAddr,
    caps: Capabilities,
}

impl Workers {
    /// The address the workers serve.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the kernel granted every socket.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// Whether any worker has stopped: after the stop flag was set, or because its handler
    /// panicked. Lets a supervisor notice a dead worker without joining.
    pub fn any_finished(&self) -> bool {
        self.threads.any_finished()
    }

    /// Asks every worker to stop: sets the stop flag, then wakes the workers by shutting their
    /// sockets down for reading. Each finishes the batch in hand, calls its handler's `finish`,
    /// and exits. Datagrams still queued are not read.
    pub fn stop(&self) {
        stop_workers(&self.stop, &self.sockets);
    }

    /// Stops the workers ([`Self::stop`]) and waits for every thread, after the first panic too.
    /// Returns the first panic's payload if a handler panicked.
    pub fn join(mut self) -> thread::Result<()> {
        self.stop();
        self.threads.join()
    }
}

/// [`Workers::stop`], also for workers not yet handed over as [`Workers`]: one failed to start.
fn stop_workers(stop: &AtomicBool, sockets: &[Arc<UdpSocket>]) {
    stop.store(true, Ordering::Release);
    for socket in sockets {
        socket.shutdown_read();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Threads left running would wait for traffic forever; after `join` this is a no-op.
        if !self.threads.is_empty() {
            self.stop();
        }
    }
}

/// How often a worker logs a persistent receive error; occurrences in between are counted and
/// reported with the next log line.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The first and the longest pause after a failed receive. Short enough that a transient error
/// (ENOMEM, ENOBUFS) costs little, capped low so that a stop request is still noticed promptly.
const MIN_BACKOFF: Duration = Duration::from_millis(1);
const MAX_BACKOFF: Duration = Duration::from_millis(50);

/// Receives of this many datagrams or more are handled without gathering (see
/// [`WorkerConfig::gather`]): a quarter of the batch, at least three.
fn gather_below(capacity: usize) -> usize {
    (capacity / 4).max(3)
}

/// How long arrivals are counted for one rate estimate.
const RATE_WINDOW: Duration = Duration::from_millis(100);

/// Gathering stops while the arrival rate, handled in large batches, would keep the thread at
/// least this busy: near saturation a wait leaves the core idle when it has no time to spare.
const MAX_GATHER_LOAD: f64 = 0.75;

/// How long a cost estimate lasts without a new large batch to refresh it. Only large batches
/// measure the cost, and at a load where gathering is off they may stop coming; an estimate that
/// came out too high (the first sample alone sets it) would then keep gathering off for good, the
/// thread answering in small batches at up to twice the CPU. Forgetting it after a second lets
/// gathering resume, and if the load is high, large batches measure it again at once.
const COST_MAX_AGE: Duration = Duration::from_secs(1);

/// Decides receive by receive whether to wait for more datagrams ([`WorkerConfig::gather`]): for
/// a receive of two or more but under a quarter of a batch, unless the load would keep the thread
/// busy even in large batches. It measures both sides itself: the arrival rate over the last
/// 100 ms, and the thread's CPU time per datagram in batches of half a batch or more (handling
/// and sending; the receive is not in it, so the load it gives is a little low). CPU time, not
/// wall time: a batch during which the thread was preempted or its CPU taken by the hypervisor
/// would otherwise count the stall as cost.
#[derive(Debug)]
struct Gatherer {
    wait: Duration,
    below: usize,
    window_start: Instant,
    /// Datagrams handled since `window_start`.
    arrived: u64,
    /// Datagrams per second over the last full window.
    rate: f64,
    /// Seconds of handling per datagram in large batches, smoothed; zero until one was seen, and
    /// again once [`COST_MAX_AGE`] passed without one.
    cost: f64,
    /// When `cost` was last measured.
    cost_at: Instant,
}

impl Gatherer {
    fn new(wait: Duration, below: usize, now: Instant) -> Self {
        Self {
            wait,
            below,
            window_start: now,
            arrived: 0,
            rate: 0.0,
            cost: 0.0,
            cost_at: now,
        }
    }

    /// Whether to wait after a receive of `n` datagrams.
    fn should_wait(&self, n: usize) -> bool {
        (2..self.below).contains(&n) && self.rate * self.cost < MAX_GATHER_LOAD
    }

    /// Counts a batch of `n` whose handling and sending took `took` of the thread's CPU time,
    /// done at `now`. The rate is refreshed once a window has passed, so after a quiet spell the
    /// first decision may still go by the busier window before it.
    fn handled(&mut self, n: usize, took: Duration, now: Instant) {
        self.arrived += n as u64;
        let window = now.saturating_duration_since(self.window_start);
        if window >= RATE_WINDOW {
            self.rate = self.arrived as f64 / window.as_secs_f64();
            self.arrived = 0;
            self.window_start = now;
        }
        if n >= 2 * self.below {
            let per = took.as_secs_f64() / n as f64;
            self.cost = if self.cost == 0.0 {
                per
            } else {
                0.9 * self.cost + 0.1 * per
            };
            self.cost_at = now;
        } else if now.saturating_duration_since(self.cost_at) >= COST_MAX_AGE {
            self.cost = 0.0;
        }
    }
}

/// Everything one worker thread owns, moved into it at spawn.
struct Worker {
    span: tracing::Span,
    socket: Arc<UdpSocket>,
    stop: Arc<AtomicBool>,
    cpu: Option<usize>,
    batch_size: usize,
    max_datagram: usize,
    gather: Option<Duration>,
    shed: Option<Arc<ShedTuning>>,
}

impl Worker {
    /// The thread's body, on its CPU if it has one: allocates its batches once, then receives,
    /// handles and sends batch after batch until the stop flag is set.
    fn run<H: BatchHandler>(self, handler: H, starting: Starting) {
        let _span = self.span.enter();
        // Allocated here, once, so that the loop below never allocates.
        let mut batches = BatchLoop::new(&self, handler);
        starting.ready();
        tracing::debug!(cpu = ?self.cpu, "worker started");
        // Relaxed would do for the flag alone; Acquire pairs with the Release in
        // `Workers::stop` and costs nothing on x86.
        while !self.stop.load(Ordering::Acquire) {
            if let Some(batch) = batches.receive() {
                batches.handle_batch(batch);
                batches.note_batch();
            }
        }
        batches.finish();
        tracing::debug!("worker stopped");
    }
}

/// A batch received into a [`BatchLoop`], to be handled.
#[derive(Clone, Copy, Debug)]
struct Received {
    /// The receive filled the batch, so the queue may hold more (for [`Shedder::decide`]).
    full: bool,
}

/// A worker's loop, one batch at a time: what it keeps from one batch to the next.
///
/// The batches are allocated once, in [`BatchLoop::new`]; nothing after that allocates. Gathering
/// and shedding are optional ([`WorkerConfig::gather`], [`WorkerConfig::shed`]), each kept here
/// with its own state, so that the steps below only ask whether each is on. Generic over the
/// handler, so every call to it is a direct one.
struct BatchLoop<'w, H> {
    socket: &'w UdpSocket,
    handler: H,
    rx: RxBatch,
    tx: TxBatch,
    /// Where transmit timestamps come back, each datagram behind its link, IP and UDP headers.
    looped: RxBatch,
    recv_errors: ErrorLog,
    /// The pause after the next failed receive; doubled by each failure, reset by a success.
    backoff: Duration,
    gatherer: Option<Gatherer>,
    shedding: Option<Shedding>,
    /// Batches handled since the socket's drop count was last read.
    batches_since_drops: u32,
}

impl<'w, H: BatchHandler> BatchLoop<'w, H> {
    fn new(worker: &'w Worker, handler: H) -> Self {
        let rx = RxBatch::new(worker.batch_size, worker.max_datagram);
        let below = gather_below(rx.capacity());
        Self {
            socket: &worker.socket,
            handler,
            rx,
            tx: TxBatch::new(worker.batch_size, worker.max_datagram),
            looped: RxBatch::new(worker.batch_size, worker.max_datagram + LOOPED_HEADROOM),
            recv_errors: ErrorLog::new("receive"),
            backoff: MIN_BACKOFF,
            gatherer: (worker.gather).map(|wait| Gatherer::new(wait, below, Instant::now())),
            shedding: (worker.shed.clone()).map(|tuning| Shedding::new(tuning, &worker.socket)),
            batches_since_drops: 0,
        }
    }

    /// Receives the next batch into `rx`, and with gathering waits for more if the gatherer says
    /// so. `None` after a receive that found nothing (a timeout, or a stop's wake-up) or failed:
    /// this has told the handler, and after a failure paused.
    fn receive(&mut self) -> Option<Received> {
        match self.socket.recv_batch(&mut self.rx) {
            Ok(0) => {
                self.report_drops();
                self.handler.idle();
                Shedding::idle_if_any(&mut self.shedding);
                None
            }
            Ok(n) => {
                self.backoff = MIN_BACKOFF;
                if let Some(g) = &self.gatherer
                    && g.should_wait(n)
                {
                    thread::sleep(g.wait);
                    if let Err(e) = self.socket.recv_more(&mut self.rx) {
                        self.recv_failed(&e);
                    }
                }
                Some(Received {
                    full: n >= self.rx.capacity(),
                })
            }
            Err(e) => {
                self.recv_failed(&e);
                Shedding::idle_if_any(&mut self.shedding);
                // Without a pause a persistent error would spin this CPU at 100%.
                thread::sleep(self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                None
            }
        }
    }

    /// Handles the batch in `rx`: sheds what waited too long (with shedding), hands the rest to
    /// the handler, sends its replies, and notes what the batch cost, for shedding's stalls and
    /// gathering's load.
    fn handle_batch(&mut self, batch: Received) {
        let received = self.rx.len();
        let taken = self.shed(batch.full);
        let started = self.gatherer.as_ref().map(|_| sys::thread_cpu_time());
        self.handler.handle(&self.rx, &mut self.tx);
        if !self.tx.is_empty() {
            self.send();
        }
        if let (Some(s), Some(taken)) = (&mut self.shedding, taken) {
            s.stalls.handled(taken, Clocks::read());
        }
        if let (Some(g), Some(started)) = (&mut self.gatherer, started) {
            let took = sys::thread_cpu_time().saturating_sub(started);
            g.handled(received, took, Instant::now());
        }
    }

    /// Counts a batch handled, and reads the socket's drop count every [`DROPS_EVERY`] batches;
    /// while shedding, after every batch: the shedder ends when an interval passes without a
    /// drop, and 64 batches of 256 Roughtime requests can take longer than an interval.
    fn note_batch(&mut self) {
        self.batches_since_drops += 1;
        if self.batches_since_drops >= DROPS_EVERY
            || (self.shedding.as_ref()).is_some_and(|s| s.shedder.is_shedding())
        {
            self.batches_since_drops = 0;
            self.report_drops();
        }
    }

    /// After the last batch: the drop count once more, the handler's `finish`, and the errors
    /// not yet logged.
    fn finish(&mut self) {
        self.report_drops();
        self.handler.finish();
        self.recv_errors.flush();
        if let Some(s) = &mut self.shedding {
            s.resize_errors.flush();
        }
    }

    /// Hands the socket's drop count to the handler, and to the shedder.
    fn report_drops(&mut self) {
        if let Ok(total) = self.socket.receive_drops() {
            self.handler.receive_drops(total);
            if let Some(s) = &mut self.shedding {
                s.shedder.kernel_drops(total);
            }
        }
    }

    /// A receive failed: logged (at most once per interval) and told to the handler.
    fn recv_failed(&mut self, e: &io::Error) {
        self.recv_errors.record(1, e);
        self.handler.recv_error(e);
    }

    /// Sends the replies in `tx`, and hands the handler their kernel transmit timestamps if it
    /// asked for them (they come back on the error queue, into `looped`).
    fn send(&mut self) {
        self.handler.before_send(&mut self.tx);
        let stamped = self.tx.wants_tx_timestamps();
        let outcome = self.socket.send_batch(&mut self.tx);
        self.handler.after_send(&outcome);
        if stamped {
            match self.socket.recv_tx_timestamps(&mut self.looped) {
                Ok(0) => {}
                Ok(_) => self.handler.tx_timestamps(&self.looped),
                Err(e) => self.recv_errors.record(1, &e),
            }
        }
    }

    /// With shedding, its decision for the batch in `rx` (`full`: the receive filled it), taken
    /// now: the receive buffer resized as it says, and the requests that waited too long shed
    /// from `rx`. Returns the clocks as the batch was taken, for [`Stalls::handled`]; `None`
    /// without shedding.
    fn shed(&mut self, full: bool) -> Option<Clocks> {
        let shedding = self.shedding.as_mut()?;
        let taken = Clocks::read();
        let oldest = self.rx.get(0).0.timestamp;
        let stalled = shedding.stalls.before(taken, oldest);
        let s = &mut shedding.shedder;
        s.retune(shedding.tuning.get());
        let decision = s.decide(taken.wall, oldest, full, stalled);
        if let Some(bytes) = decision.recv_buffer {
            match self.socket.resize_recv_buffer(bytes) {
                Ok(granted) => {
                    if granted < bytes && !shedding.warned_short {
                        shedding.warned_short = true;
                        tracing::warn!(
                            asked = bytes,
                            granted,
                            "the receive buffer could not grow back after shedding: without \
                             CAP_NET_ADMIN it is capped at net.core.rmem_max"
                        );
                    }
                    s.buffer_granted(granted);
                }
                Err(e) => shedding.resize_errors.record(1, &e),
            }
        }
        if let Some(cutoff) = decision.cutoff {
            let shed = self.rx.shed_received_before(cutoff);
            if shed > 0 {
                self.handler.shed(shed);
            }
        }
        Some(taken)
    }
}

/// A worker's shedding (with [`WorkerConfig::shed`]): the decisions, the stalls they take out
/// of the waits, and the receive buffer's resizes.
struct Shedding {
    shedder: Shedder,
    /// The settings in force, read before each decision.
    tuning: Arc<ShedTuning>,
    stalls: Stalls,
    resize_errors: ErrorLog,
    /// Whether the kernel's cap on the buffer has been warned about.
    warned_short: bool,
}

impl Shedding {
    fn new(tuning: Arc<ShedTuning>, socket: &UdpSocket) -> Self {
        Self {
            shedder: Shedder::new(tuning.get(), socket.capabilities().recv_buffer),
            tuning,
            stalls: Stalls::default(),
            resize_errors: ErrorLog::new("receive buffer resize"),
            warned_short: false,
        }
    }

    /// A receive found nothing (or failed): the thread is running now, and a stall is counted
    /// from here, or from the arrival of what it receives next.
    fn idle(&mut self) {
        self.stalls = Stalls {
            done: Some(Clocks::read()),
            handling: Duration::ZERO,
        };
    }

    /// [`Shedding::idle`], for a worker that may not shed at all.
    fn idle_if_any(shedding: &mut Option<Self>) {
        if let Some(s) = shedding {
            s.idle();
        }
    }
}

/// The wall clock and this thread's CPU clock, read together.
#[derive(Clone, Copy, Debug)]
struct Clocks {
    wall: Timestamp,
    cpu: Duration,
}

impl Clocks {
    fn read() -> Self {
        Self {
            wall: Timestamp::now(),
            cpu: sys::thread_cpu_time(),
        }
    }
}

/// Time the thread spent off the CPU while it had work: what a CPU quota's throttling or a
/// preempted vCPU costs every datagram queued meanwhile, and the shedder takes out of their waits
/// ([`Shedder::decide`]). Wall time that passed without this thread's CPU time passing with it,
/// counted while handling a batch, and while receiving the next from when there was something to
/// receive (its oldest datagram's arrival, or the receive's start if that was earlier): time
/// blocked on an empty queue is idleness, not a stall.
#[derive(Clone, Copy, Debug, Default)]
struct Stalls {
    /// The clocks when the last batch was done, and the stall while handling it.
    done: Option<Clocks>,
    handling: Duration,
}

impl Stalls {
    /// The stall since the last batch was done, for a batch taken at `taken` whose oldest
    /// datagram arrived at `oldest`.
    fn before(&self, taken: Clocks, oldest: Option<Timestamp>) -> Duration {
        let Some(done) = self.done else {
            return Duration::ZERO;
        };
        let from = oldest.map_or(done.wall, |o| o.max(done.wall));
        let waited = taken.wall.as_nanos() - from.as_nanos();
        let ran = taken.cpu.saturating_sub(done.cpu).as_nanos() as i128;
        let receiving = u64::try_from(waited - ran).unwrap_or(0);
        self.handling + Duration::from_nanos(receiving)
    }

    /// Notes a batch taken at `taken` and done at `done`.
    fn handled(&mut self, taken: Clocks, done: Clocks) {
        let wall = done.wall.as_nanos() - taken.wall.as_nanos();
        let ran = done.cpu.saturating_sub(taken.cpu).as_nanos() as i128;
        self.handling = Duration::from_nanos(u64::try_from(wall - ran).unwrap_or(0));
        self.done = Some(done);
    }
}

/// Room for the headers a looped transmit-timestamp datagram carries before the payload: link
/// (Ethernet 14 bytes, or more with VLAN tags), IPv6 (40, or more with extension headers), UDP (8).
const LOOPED_HEADROOM: usize = 128;

/// Rate-limited logging of one kind of socket error: the first occurrence is logged at once, then
/// at most one line per [`ERROR_LOG_INTERVAL`] with the count of those not logged.
struct ErrorLog {
    what: &'static str,
    total: u64,
    unlogged: u64,
    last_logged: Option<Instant>,
}

impl ErrorLog {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            total: 0,
            unlogged: 0,
            last_logged: None,
        }
    }

    fn record(&mut self, count: usize, error: &io::Error) {
        let count = count as u64;
        self.total += count;
        let now = Instant::now();
        if self
            .last_logged
            .is_some_and(|t| now.duration_since(t) < ERROR_LOG_INTERVAL)
        {
            self.unlogged += count;
            return;
        }
        tracing::warn!(
            %error,
            count = count + self.unlogged,
            total = self.total,
            "{} errors",
            self.what
        );
        self.unlogged = 0;
        self.last_logged = Some(now);
    }

    /// Logs the errors not yet logged, when the worker stops.
    fn flush(&mut self) {
        if self.unlogged > 0 {
            tracing::warn!(
                count = self.unlogged,
                total = self.total,
                "{} errors",
                self.what
            );
            self.unlogged = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn a_stall_is_wall_time_without_the_threads_cpu_time_while_it_had_work() {
        let ms = |n: i128| Timestamp::from_nanos(n * 1_000_000);
        let at = |wall: i128, cpu: u64| Clocks {
            wall: ms(wall),
            cpu: Duration::from_millis(cpu),
        };
        let mut stalls = Stalls::default();
        assert_eq!(
            stalls.before(at(10, 1), Some(ms(5))),
            Duration::ZERO,
            "no batch yet"
        );
        // Handled without a stall, done at 100 ms; the next batch's oldest arrived at 105 ms and
        // was taken at 120 ms, with 2 ms of CPU between: 13 ms off the CPU with work to do.
        // Blocked on an empty queue from 100 to 105 ms was not a stall.
        stalls.handled(at(90, 9), at(100, 19));
        assert_eq!(
            stalls.before(at(120, 21), Some(ms(105))),
            Duration::from_millis(13)
        );
        // An oldest datagram from before the last batch was done: counted from then.
        assert_eq!(
            stalls.before(at(120, 21), Some(ms(50))),
            Duration::from_millis(18)
        );
        // Handling took 5 ms of wall time and 1 ms of CPU: 4 ms more, added to the next.
        stalls.handled(at(120, 21), at(125, 22));
        assert_eq!(
            stalls.before(at(126, 23), Some(ms(125))),
            Duration::from_millis(4)
        );
    }

    fn cfg(threads: usize) -> WorkerConfig {
        WorkerConfig::new("t", (Ipv4Addr::LOCALHOST, 0).into(), threads)
    }

    fn config_error(cfg: WorkerConfig) -> ConfigError {
        let err = BoundWorkers::bind(cfg).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        *err.into_inner().unwrap().downcast::<ConfigError>().unwrap()
    }

    #[test]
    fn invalid_configs_are_refused_before_binding() {
        assert!(matches!(config_error(cfg(0)), ConfigError::NoThreads));
        let mut c = cfg(1);
        c.batch_size = 0;
        assert!(matches!(config_error(c), ConfigError::ZeroBatchSize));
        let mut c = cfg(1);
        c.max_datagram = 0;
        assert!(matches!(config_error(c), ConfigError::ZeroMaxDatagram));
        let mut c = cfg(2);
        c.socket.reuse_port = false;
        assert!(matches!(
            config_error(c),
            ConfigError::ReusePortOff { threads: 2, .. }
        ));
        let mut c = cfg(1);
        c.cpus = vec![0, affinity::MAX_CPUS];
        assert!(matches!(config_error(c), ConfigError::CpuOutOfRange { .. }));
    }

    struct Nothing;
    impl BatchHandler for Nothing {
        fn handle(&mut self, _: &RxBatch, _: &mut TxBatch) {}
    }

    #[test]
    fn pinning_failure_fails_spawn_and_stops_the_rest() {
        let allowed = affinity::allowed_cpus().unwrap();
        let Some(outside) = (0..affinity::MAX_CPUS).find(|c| !allowed.contains(c)) else {
            return; // Every CPU is allowed: nothing to fail with.
        };
        let mut c = cfg(2);
        c.cpus = vec![allowed[0], outside];
        let stop = Arc::new(AtomicBool::new(false));
        let err = BoundWorkers::bind(c)
            .unwrap()
            .spawn(Arc::clone(&stop), |_| Nothing)
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("to CPU {outside}")),
            "{err}"
        );
        assert!(stop.load(Ordering::Acquire));
    }

    #[test]
    fn error_log_counts_suppressed_errors() {
        let mut log = ErrorLog::new("test");
        let e = io::Error::from(io::ErrorKind::Other);
        log.record(1, &e);
        log.record(3, &e);
        assert_eq!((log.total, log.unlogged), (4, 3));
        log.flush();
        assert_eq!(log.unlogged, 0);
    }

    #[test]
    fn gatherer_waits_only_for_small_batches_at_light_load() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut g = Gatherer::new(ms(1), 16, t0);
        // Nothing measured yet: small batches of two or more wait, lone ones and large ones not.
        assert!(!g.should_wait(1));
        assert!(g.should_wait(2) && g.should_wait(15));
        assert!(!g.should_wait(16));
        // 64-datagram batches at 5 µs each, one every 640 µs: 100k/s, a load of 0.5, gathering
        // goes on. The rate is known once a 100 ms window has passed. (Batches under 32 would
        // not count towards the cost.)
        let us = Duration::from_micros;
        for i in 1..=157 {
            g.handled(64, us(320), t0 + us(640) * i);
        }
        assert!((g.rate - 100_000.0).abs() < 1_000.0, "{}", g.rate);
        assert!((g.cost - 5e-6).abs() < 1e-9, "{}", g.cost);
        assert!(g.should_wait(4), "rate {} cost {}", g.rate, g.cost);
        // Then 200k/s of the same: a load of 1.0, no waiting.
        let later = t0 + us(640) * 157;
        for i in 1..=21 {
            g.handled(1000, us(5000), later + us(5000) * i);
        }
        assert!((g.rate - 200_000.0).abs() < 2_000.0, "{}", g.rate);
        assert!(!g.should_wait(4), "rate {} cost {}", g.rate, g.cost);
    }

    #[test]
    fn gatherer_forgets_a_cost_no_large_batch_renews() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut g = Gatherer::new(Duration::from_millis(1), 16, t0);
        // One large batch with an inflated cost (100 µs a datagram), then 70k/s in small batches
        // of 7: a load of 7 by that cost, so no gathering.
        g.handled(40, us(4000), t0);
        let mut t = t0;
        for _ in 0..1000 {
            t += us(100);
            g.handled(7, us(200), t);
        }
        assert!(!g.should_wait(7), "rate {} cost {}", g.rate, g.cost);
        // A second after the large batch, with no other, the estimate is gone: gathering resumes.
        for _ in 0..10_001 {
            t += us(100);
            g.handled(7, us(200), t);
        }
        assert!(
            g.cost == 0.0 && g.should_wait(7),
            "rate {} cost {}",
            g.rate,
            g.cost
        );
        // And a large batch measures it again.
        g.handled(40, us(200), t + us(100));
        assert!((g.cost - 5e-6).abs() < 1e-9, "{}", g.cost);
    }
}
