//! Roughtime over TCP (RFC 10049 §4: servers SHOULD serve both UDP and TCP), on the same addresses
//! and ports as the UDP sockets, on a thread and runtime of its own so that nothing a TCP client
//! does slows the UDP workers.
//!
//! A connection carries packets back to back (chime-roughtime's `stream`), requests pipelined, up
//! to [`IN_FLIGHT`] unanswered at once; replies go back as they are signed, all those ready in one
//! write (a write per reply cost more than signing it). Requests from every
//! connection meet in one signer, which signs whatever has queued as one batch (one signature
//! over one Merkle tree per version family, each reply with its own path), as the UDP workers do
//! with a receive batch. It drops what they drop (an unsynchronised upstream, a request it cannot
//! answer) and counts the same way, as worker `family="tcp"`; a dropped request also ends its
//! connection, so that the client knows at once.
//!
//! Everything is bounded: connections at once and per client address (over either limit, or
//! denied by the access rules, a connection is closed at once), the size of a request, what a
//! connection buffers (a 16 KiB read, a request being framed, [`WAITING`] requests waiting for
//! the signer and [`IN_FLIGHT`] with it or as replies: at most about 200 KiB, a third of that
//! with requests of the usual 1 KiB), the time between requests (`idle`), the whole connection
//! (`lifetime`) and a reply's write (a client that does not read is closed). Each way a
//! connection ends is counted.
//!
//! Under overload what waits does so where chimed can time it and choose. A connection is read
//! as fast as its bytes come, not only while it has room with the signer: past [`WAITING`], its
//! oldest waiting request is shed, so that a client that sends faster than it is served does
//! not fill the kernel's buffers with requests that would be late. The signer sheds by age, as
//! the UDP workers do ([`Ageing`], with the same `--shed-target` and `--shed-interval`): under a
//! standing queue a request read longer than the target ago gets no reply. Both count as `shed`;
//! a connection with [`SHED_IN_A_ROW`] requests in a row shed by the signer is closed
//! (`closed_ageing`), which gives its slot to another.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use chime_roughtime::{FrameReader, MAX_BATCH_SIZE, Responder, ResponderConfig, VersionSet};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::service::{self, Beat, Threads, panic_message};
use tokio::time::{Instant, sleep_until, timeout};
use tracing::{debug, error, info, warn};

use crate::access::per_address::{PerAddress, Place};
use crate::clock;
use crate::observe::counters::Note;
use crate::observe::metrics::{counters, single};
use crate::observe::stats::{WorkerStats, Workers};
use crate::roughtime::job::{Job, Reply, refuse_all};
#[cfg(feature = "mldsa")]
use crate::roughtime::mldsa;
use crate::roughtime::state::{RoughtimeDrop, Shared};
use crate::roughtime::{Error, serve};

/// Requests one connection may have awaiting replies; past it, its bytes wait in the kernel.
pub(crate) const IN_FLIGHT: usize = 16;
/// The longest request message taken: a padded request is 1012 bytes of message; twice that and
/// more is not a request.
pub(crate) const MAX_MESSAGE: usize = 4096;
/// Room for any Ed25519 reply (none is longer than 1024 bytes); ML-DSA-44 replies are made to
/// measure.
const MAX_REPLY: usize = 2048;
/// Requests one connection may have waiting for the signer to have room, beyond those in flight;
/// past it the oldest is shed.
pub(crate) const WAITING: usize = 16;
/// Requests in a row shed on one connection before it is closed: one shed request is a client's
/// lost poll, as over UDP; a window's worth in a row is a client the server cannot serve in time.
pub(crate) const SHED_IN_A_ROW: usize = 2 * IN_FLIGHT;
/// How long writing one reply may take before the client is taken not to be reading.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
const READ_CHUNK: usize = 16 * 1024;

/// The bounds on Roughtime's TCP connections (`[roughtime.tcp]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections open at once.
    pub(crate) connections: usize,
    /// Connections open at once from one client address.
    pub(crate) per_address: usize,
    /// Longest wait for the next request (or for a reply to be read).
    pub(crate) idle: Duration,
    /// Longest a connection stays open, however busy.
    pub(crate) lifetime: Duration,
}

impl Limits {
    /// The limits `[roughtime.tcp]` sets; `None`: Roughtime over UDP only.
    pub(crate) fn of(t: &crate::config::schema::RoughtimeTcp) -> Option<Self> {
        (t.connections.0 > 0).then(|| Self {
            connections: t.connections.0,
            per_address: t.per_address.0,
            idle: t.idle.duration(),
            lifetime: t.lifetime.duration(),
        })
    }
}

/// How connections ended, and how many are open; for the log and the metrics.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) accepted: AtomicU64,
    pub(crate) open: AtomicU64,
    /// Closed at once: as many connections open as allowed.
    pub(crate) refused_full: AtomicU64,
    /// Closed at once: as many from that address as allowed.
    pub(crate) refused_address: AtomicU64,
    /// Closed at once: the access rules deny the address.
    pub(crate) refused_denied: AtomicU64,
    /// The client closed (its side) and every reply it was owed was written.
    pub(crate) closed_by_client: AtomicU64,
    pub(crate) closed_idle: AtomicU64,
    pub(crate) closed_lifetime: AtomicU64,
    /// Not Roughtime, or a packet over [`MAX_MESSAGE`].
    pub(crate) closed_bad_frame: AtomicU64,
    /// A request got no reply (dropped, as the drop counters say why).
    pub(crate) closed_unanswered: AtomicU64,
    /// [`SHED_IN_A_ROW`] requests in a row waited too long and were shed.
    pub(crate) closed_ageing: AtomicU64,
    /// Requests shed from a connection's waiting ones since the signer last counted them.
    pub(crate) shed_waiting: AtomicU64,
    /// A reply could not be written within [`WRITE_TIMEOUT`].
    pub(crate) closed_slow: AtomicU64,
    /// A read or write failed (reset by the peer and the like).
    pub(crate) closed_error: AtomicU64,
}

impl Counts {
    /// Every outcome with its label, as the metrics name them.
    pub(crate) fn outcomes(&self) -> [(&'static str, u64); 12] {
        [
            ("accepted", self.accepted.load(Relaxed)),
            ("refused_full", self.refused_full.load(Relaxed)),
            ("refused_address", self.refused_address.load(Relaxed)),
            ("refused_denied", self.refused_denied.load(Relaxed)),
            ("closed_by_client", self.closed_by_client.load(Relaxed)),
            ("closed_idle", self.closed_idle.load(Relaxed)),
            ("closed_lifetime", self.closed_lifetime.load(Relaxed)),
            ("closed_bad_frame", self.closed_bad_frame.load(Relaxed)),
            ("closed_unanswered", self.closed_unanswered.load(Relaxed)),
            ("closed_ageing", self.closed_ageing.load(Relaxed)),
            ("closed_slow", self.closed_slow.load(Relaxed)),
            ("closed_error", self.closed_error.load(Relaxed)),
        ]
    }

    pub(crate) fn line(&self) -> String {
        let mut line = format!("open={}", self.open.load(Relaxed));
        for (label, n) in self.outcomes() {
            line.push_str(&format!(" {label}={n}"));
        }
        line
    }
}

/// When the signer sheds (CoDel's rule, as [`chime_udp::Shedder`] applies it to a socket's
/// queue): once the oldest request of every full batch has waited longer than the target for a
/// whole interval, the queue is standing and every request older than the target is shed, until
/// a batch empties the queue. A burst that drains within the interval is answered in full.
/// Sans-IO: the caller passes the times in.
#[derive(Debug)]
pub(super) struct Ageing {
    /// The settings in force, read at each batch (SIGHUP may change them).
    tuning: Arc<chime_udp::ShedTuning>,
    /// Since when every full batch's oldest request has waited longer than the target.
    above_since: Option<std::time::Instant>,
    shedding: bool,
}

impl Ageing {
    pub(super) fn new(tuning: Arc<chime_udp::ShedTuning>) -> Self {
        Self {
            tuning,
            above_since: None,
            shedding: false,
        }
    }

    /// For a batch taken at `now` whose oldest request was read at `oldest`: shed what was read
    /// before the cutoff, if any. `full`: the batch took all it could, so more may be queued.
    pub(super) fn cutoff(
        &mut self,
        now: std::time::Instant,
        oldest: std::time::Instant,
        full: bool,
    ) -> Option<std::time::Instant> {
        let cfg = self.tuning.get();
        let old = now.saturating_duration_since(oldest) > cfg.target;
        let cutoff = now.checked_sub(cfg.target);
        if !self.shedding && old && full {
            let since = *self.above_since.get_or_insert(now);
            self.shedding = now.saturating_duration_since(since) >= cfg.interval;
        } else if !old || !full {
            self.above_since = None;
        }
        let shed = self.shedding && old;
        // The queue is empty once a batch does not fill: this one is the last shed from.
        self.shedding &= full;
        if shed { cutoff } else { None }
    }
}

/// The running TCP service, on a thread of its own until the stop signal. The signer's stats
/// tick (every batch, and every [`service::WORKER_WAKE`]) beats its heartbeat for the watchdog.
pub(crate) struct Service {
    thread: std::thread::JoinHandle<()>,
}

impl Threads for Service {
    fn any_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the thread, which closes every connection and flushes the signer's counters
    /// once the stop signal is given.
    fn stop(self: Box<Self>) -> Result<(), String> {
        self.thread.join().map_err(panic_message)
    }
}

/// The experimental ML-DSA-44 suite's online key in force, where it is served.
#[cfg(feature = "mldsa")]
pub(crate) type PqNow = mldsa::Now;
/// Without the `mldsa` feature there is no such suite: a value that cannot be made.
#[cfg(not(feature = "mldsa"))]
pub(crate) type PqNow = std::convert::Infallible;

/// Where the service counts: its connections, and its replies and drops (its one signer is
/// worker `tcp` 0 among them).
pub(crate) type Counters = (Arc<Counts>, Arc<Workers<RoughtimeDrop>>);

/// Starts serving on `listeners` (bound before privileges were dropped) on a thread of its own.
pub(crate) fn spawn(
    listeners: Vec<std::net::TcpListener>,
    shared: Arc<Shared>,
    limits: Limits,
    (counts, workers): Counters,
    (pq, shed): (Option<PqNow>, Option<Arc<chime_udp::ShedTuning>>),
    (beat, stopped): (Beat, CancellationToken),
) -> Result<Service, Error> {
    for l in &listeners {
        l.set_nonblocking(true).map_err(|source| Error::Tcp {
            addr: l.local_addr().unwrap_or_else(|_| ([0, 0, 0, 0], 0).into()),
            what: "make the listener non-blocking",
            source,
        })?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::TcpStart {
            what: "runtime",
            source,
        })?;
    // The thread logs in the span current here, the service's.
    let span = tracing::Span::current();
    let thread = std::thread::Builder::new()
        .name("roughtime-tcp".into())
        .spawn(move || {
            let _entered = span.entered();
            runtime.block_on(async move {
                fail::fail_point!("roughtime-tcp");
                let stats =
                    WorkerStats::new("roughtime-tcp", shared.stats_interval, (&workers, "tcp", 0))
                        .with_heartbeat(beat);
                // One batch queued at most: a request that waits behind more would be stale by
                // the time it is signed (at 3x capacity, 1,024 queued cost a fifth of the
                // replies accepted, and every one waited some 50 ms); the rest wait in their
                // connection, where the oldest is shed.
                let (jobs, queue) = mpsc::channel(MAX_BATCH_SIZE);
                let ageing = shed.map(Ageing::new);
                let counting = (stats, ageing, counts.clone());
                let signer = tokio::spawn(sign(queue, shared.clone(), counting, pq));
                let addresses = PerAddress::default();
                let mut accepting = tokio::task::JoinSet::new();
                for l in listeners {
                    match tokio::net::TcpListener::from_std(l) {
                        Ok(l) => drop(accepting.spawn(accept(
                            l,
                            jobs.clone(),
                            shared.clone(),
                            limits,
                            counts.clone(),
                            addresses.clone(),
                        ))),
                        Err(e) => warn!("roughtime-tcp: cannot use a listener: {e}"),
                    }
                }
                drop(jobs);
                tokio::select! {
                    () = stopped.cancelled() => {}
                    // An accept loop never ends by itself: if one did, the service is over and
                    // the supervisor, seeing this thread end, stops the daemon.
                    _ = accepting.join_next() => error!("roughtime-tcp: an accept loop ended"),
                }
                // The accept loops hold the connections' tasks' senders only through them:
                // ending them and the connections lets the signer see its queue close.
                accepting.abort_all();
                let _ = signer.await;
            });
            // Dropping the runtime ends the connection tasks still running.
        })
        .map_err(|source| Error::TcpStart {
            what: "thread",
            source,
        })?;
    Ok(Service { thread })
}

/// A connection's place in the per-address count and in the open count; freed when it ends.
struct Slot {
    _place: Place,
    counts: Arc<Counts>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counts.open.fetch_sub(1, Relaxed);
    }
}

async fn accept(
    listener: tokio::net::TcpListener,
    jobs: mpsc::Sender<Job>,
    shared: Arc<Shared>,
    limits: Limits,
    counts: Arc<Counts>,
    addresses: PerAddress,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: pause rather than spin.
                    warn!("roughtime-tcp: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        counts.accepted.fetch_add(1, Relaxed);
        let ip = canonical(peer.ip());
        let acl = shared.access.load();
        if !acl.serves(ip) {
            counts.refused_denied.fetch_add(1, Relaxed);
            continue;
        }
        if counts.open.load(Relaxed) >= limits.connections as u64 {
            counts.refused_full.fetch_add(1, Relaxed);
            continue;
        }
        let Some(place) = addresses.take(ip, limits.per_address) else {
            counts.refused_address.fetch_add(1, Relaxed);
            continue;
        };
        counts.open.fetch_add(1, Relaxed);
        let slot = Slot {
            _place: place,
            counts: counts.clone(),
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(serve_connection(
            stream,
            ip,
            jobs.clone(),
            limits,
            counts.clone(),
            slot,
        ));
    }
}

/// An IPv4 client on an IPv6 socket as the IPv4 address the access rules know.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why a connection ended.
enum End {
    ByClient,
    Idle,
    Lifetime,
    BadFrame,
    /// A request was dropped (see the drop counters).
    Unanswered,
    /// [`SHED_IN_A_ROW`] requests in a row were shed.
    Ageing,
    Slow,
    Error,
    /// chimed is stopping.
    Stopping,
}

impl End {
    /// How the log names it.
    fn label(&self) -> &'static str {
        match self {
            Self::ByClient => "closed by the client",
            Self::Idle => "idle",
            Self::Lifetime => "its lifetime over",
            Self::BadFrame => "a bad frame",
            Self::Unanswered => "a request unanswered",
            Self::Ageing => "requests shed in a row",
            Self::Slow => "a reply not read in time",
            Self::Error => "a read or write failed",
            Self::Stopping => "chimed stopping",
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: IpAddr,
    jobs: mpsc::Sender<Job>,
    limits: Limits,
    counts: Arc<Counts>,
    _slot: Slot,
) {
    let end = converse(stream, peer, (&jobs, &counts), limits).await;
    debug!(%peer, "roughtime-tcp: connection closed: {}", end.label());
    let counter = match end {
        End::ByClient => &counts.closed_by_client,
        End::Idle => &counts.closed_idle,
        End::Lifetime => &counts.closed_lifetime,
        End::BadFrame => &counts.closed_bad_frame,
        End::Unanswered => &counts.closed_unanswered,
        End::Ageing => &counts.closed_ageing,
        End::Slow => &counts.closed_slow,
        End::Error => &counts.closed_error,
        End::Stopping => return,
    };
    counter.fetch_add(1, Relaxed);
}

/// A connection's requests: framed and waiting for the signer to have room (oldest first), and
/// handed to it. Reading never waits for room: requests beyond [`WAITING`] push the oldest out
/// (shed), so that what waits does so here, timed, rather than unseen in the kernel's buffers.
struct Requests {
    frames: FrameReader,
    waiting: std::collections::VecDeque<(Vec<u8>, std::time::Instant)>,
    in_flight: usize,
    shed_in_a_row: usize,
}

impl Requests {
    /// Takes `bytes` read from the connection; whether a whole request came.
    fn read(&mut self, bytes: &[u8], counts: &Counts) -> Result<bool, End> {
        self.frames.push(bytes);
        let (before, read_at) = (self.waiting.len(), std::time::Instant::now());
        while let Some(packet) = self.frames.next_packet().map_err(|_| End::BadFrame)? {
            self.waiting.push_back((packet.to_vec(), read_at));
        }
        let came = self.waiting.len() > before;
        // A client that sends faster than it is served: not a stuck one, so no run of sheds.
        while self.waiting.len() > WAITING {
            self.waiting.pop_front();
            counts.shed_waiting.fetch_add(1, Relaxed);
        }
        Ok(came)
    }

    /// What became of one of this connection's requests: a reply goes onto `out`; one that
    /// got none ends the connection (RFC 10049 §4: either side closes on errors), so that the
    /// client learns at once rather than at its timeout, unless it was shed.
    fn take(&mut self, reply: Reply, out: &mut Vec<u8>) -> Result<(), End> {
        self.in_flight -= 1;
        match reply {
            Reply::Signed(bytes) => {
                self.shed_in_a_row = 0;
                out.extend_from_slice(&bytes);
                Ok(())
            }
            Reply::Dropped => Err(End::Unanswered),
            Reply::Shed => self.shed(),
        }
    }

    /// One of this connection's requests was shed by the signer, having waited too long.
    fn shed(&mut self) -> Result<(), End> {
        self.shed_in_a_row += 1;
        match self.shed_in_a_row >= SHED_IN_A_ROW {
            true => Err(End::Ageing),
            false => Ok(()),
        }
    }

    /// Whether a request waits and the signer may take one more of this connection's.
    fn ready(&self) -> bool {
        !self.waiting.is_empty() && self.in_flight < IN_FLIGHT
    }

    /// The oldest waiting request, as a job for the signer.
    fn next_job(&mut self, peer: IpAddr, reply: &mpsc::Sender<Reply>) -> Option<Job> {
        let (packet, read_at) = self.waiting.pop_front()?;
        self.in_flight += 1;
        Some(Job {
            packet,
            peer,
            read_at,
            reply: reply.clone(),
        })
    }
}

/// Reads requests and writes replies until the connection ends, and says why it did.
async fn converse(
    stream: TcpStream,
    peer: IpAddr,
    (jobs, counts): (&mpsc::Sender<Job>, &Counts),
    limits: Limits,
) -> End {
    let (mut rd, mut wr) = stream.into_split();
    let (reply_to, mut replies) = mpsc::channel::<Reply>(IN_FLIGHT);
    let mut requests = Requests {
        frames: FrameReader::new(MAX_MESSAGE),
        waiting: std::collections::VecDeque::with_capacity(WAITING + 1),
        in_flight: 0,
        shed_in_a_row: 0,
    };
    let (mut buf, mut out) = (vec![0u8; READ_CHUNK], Vec::new());
    let mut reading = true;
    let ends = Instant::now() + limits.lifetime;
    let mut idle_until = Instant::now() + limits.idle;
    loop {
        let handed = tokio::select! {
            biased;
            Some(reply) = replies.recv() => {
                // Every reply that is in goes out in one write.
                out.clear();
                let mut ended = requests.take(reply, &mut out);
                while ended.is_ok() && let Ok(reply) = replies.try_recv() {
                    ended = requests.take(reply, &mut out);
                }
                if !out.is_empty() {
                    match timeout(WRITE_TIMEOUT, wr.write_all(&out)).await {
                        Ok(Ok(())) => idle_until = Instant::now() + limits.idle,
                        Ok(Err(_)) => return End::Error,
                        Err(_) => return End::Slow,
                    }
                }
                ended
            }
            permit = jobs.reserve(), if requests.ready() => match permit {
                Ok(permit) => {
                    permit.send(requests.next_job(peer, &reply_to).expect("one waits"));
                    Ok(())
                }
                Err(_) => return End::Stopping,
            },
            read = rd.read(&mut buf), if reading => match read {
                Ok(0) => {
                    reading = false;
                    Ok(())
                }
                Ok(n) => match requests.read(&buf[..n], counts) {
                    Ok(true) => {
                        idle_until = Instant::now() + limits.idle;
                        Ok(())
                    }
                    other => other.map(drop),
                },
                Err(_) => return End::Error,
            },
            () = sleep_until(idle_until) => return End::Idle,
            () = sleep_until(ends) => return End::Lifetime,
        };
        if let Err(end) = handed {
            return end;
        }
        if !reading && requests.in_flight == 0 && requests.waiting.is_empty() {
            return End::ByClient;
        }
    }
}

/// Signs what the connections send, as many as have queued (up to [`MAX_BATCH_SIZE`]) per
/// signature, until every sender is gone.
async fn sign(
    mut queue: mpsc::Receiver<Job>,
    shared: Arc<Shared>,
    (mut stats, mut ageing, counts): (WorkerStats<RoughtimeDrop>, Option<Ageing>, Arc<Counts>),
    pq: Option<PqNow>,
) {
    #[cfg(feature = "mldsa")]
    let mut pq = pq.map(mldsa::Signer::new);
    #[cfg(not(feature = "mldsa"))]
    let _ = pq;
    let mut responder = Responder::new(ResponderConfig {
        versions: VersionSet::ALL,
        capacity: MAX_BATCH_SIZE,
    })
    .over_stream();
    let mut jobs = Vec::with_capacity(MAX_BATCH_SIZE);
    let mut tickets = Vec::with_capacity(MAX_BATCH_SIZE);
    // Ticks while no request comes, as an idle UDP worker wakes: the watchdog sees them.
    let mut ticks = tokio::time::interval(service::WORKER_WAKE);
    loop {
        // The tests' way to make the signer slower than its clients, who go on meanwhile.
        #[cfg(feature = "failpoints")]
        if let Some(Some(ms)) = fail::eval("roughtime-tcp-signer", |ms| ms?.parse().ok()) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        tokio::select! {
            n = queue.recv_many(&mut jobs, MAX_BATCH_SIZE) => {
                if n == 0 {
                    break;
                }
                stats.shed(counts.shed_waiting.swap(0, Relaxed) as usize);
                if let Some(ageing) = &mut ageing {
                    shed(ageing, &mut jobs, n == MAX_BATCH_SIZE, &mut stats);
                }
                // Requests offering the experimental suite, where it is served, are signed
                // with it in a batch of their own.
                #[cfg(feature = "mldsa")]
                if let Some(pq) = &mut pq {
                    pq.answer_offered(&mut jobs, &shared, &mut stats);
                }
                if !jobs.is_empty() {
                    answer(&mut responder, &shared, &mut stats, &jobs, &mut tickets);
                }
                jobs.clear();
            }
            _ = ticks.tick() => {
                stats.shed(counts.shed_waiting.swap(0, Relaxed) as usize);
                stats.tick(clock::read().unix_secs());
            }
        }
    }
    stats.shed(counts.shed_waiting.swap(0, Relaxed) as usize);
    stats.finish();
}

/// Takes the requests that waited too long out of a batch (they come in the order they were
/// read), telling their connections and counting them as shed.
fn shed(
    ageing: &mut Ageing,
    jobs: &mut Vec<Job>,
    full: bool,
    stats: &mut WorkerStats<RoughtimeDrop>,
) {
    let Some(oldest) = jobs.first().map(|j| j.read_at) else {
        return;
    };
    let Some(cutoff) = ageing.cutoff(std::time::Instant::now(), oldest, full) else {
        return;
    };
    let old = jobs.partition_point(|j| j.read_at < cutoff);
    for job in jobs.drain(..old) {
        let _ = job.reply.try_send(Reply::Shed);
    }
    stats.shed(old);
}

/// One batch: the same checks, signature and counts as a UDP worker's receive batch.
fn answer(
    responder: &mut Responder,
    shared: &Shared,
    stats: &mut WorkerStats<RoughtimeDrop>,
    jobs: &[Job],
    tickets: &mut Vec<Option<chime_roughtime::Ticket>>,
) {
    let Some(serving) = serve::begin(shared, stats, jobs.len()) else {
        refuse_all(jobs);
        return;
    };
    let delegation = shared.delegation.load();
    let mut batch = responder.begin(serving.params(&delegation));
    tickets.clear();
    for job in jobs {
        let ticket = if serving.admits(job.peer, stats) {
            batch
                .add(&job.packet)
                .map_err(|why| stats.counts.drop(RoughtimeDrop::Request(why)))
                .ok()
        } else {
            None
        };
        tickets.push(ticket);
    }
    let signed = (!batch.is_empty()).then(|| batch.sign());
    for (job, ticket) in jobs.iter().zip(tickets.iter()) {
        let reply = ticket.zip(signed.as_ref()).and_then(|(ticket, signed)| {
            let mut out = vec![0u8; MAX_REPLY];
            match signed.write_reply(ticket, &mut out) {
                Ok(len) => {
                    out.truncate(len);
                    stats.counts.answered += 1;
                    stats.counts.note(Note::Roughtime(ticket.version()), true);
                    Some(out)
                }
                Err(why) => {
                    stats.counts.drop(RoughtimeDrop::Request(why));
                    None
                }
            }
        });
        let _ = job
            .reply
            .try_send(reply.map_or(Reply::Dropped, Reply::Signed));
    }
    serving.finish(stats);
}

/// Binds a TCP listener on a Roughtime UDP socket's address (the same port: a port-0 bind's real
/// one).
pub(crate) fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, Error> {
    let failed = |what| move |source| Error::Tcp { addr, what, source };
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(failed("open a socket"))?;
    if addr.is_ipv6() {
        // The IPv4 address has its own listener.
        socket.set_only_v6(true).ok();
    }
    socket.set_reuse_address(true).ok();
    socket.bind(&addr.into()).map_err(failed("bind"))?;
    socket.listen(1024).map_err(failed("listen"))?;
    let listener: std::net::TcpListener = socket.into();
    if let Ok(bound) = listener.local_addr() {
        info!("roughtime over tcp on {bound}");
    }
    Ok(listener)
}

/// Writes Roughtime over TCP's metrics: its connections (its requests are its worker's, with the
/// others').
pub(crate) fn encode(enc: &mut DescriptorEncoder, tcp: &Counts) -> std::fmt::Result {
    counters(
        enc,
        "chimed_roughtime_tcp_connections_total",
        "Roughtime TCP connections: accepted, refused at once (refused_full: as many open as \
         --roughtime-tcp-connections; refused_address: as many from the address as \
         --roughtime-tcp-per-address; refused_denied: the access rules), and how the others \
         ended (closed_by_client, closed_idle, closed_lifetime, closed_bad_frame: not \
         Roughtime or too long, closed_unanswered: a request dropped, closed_ageing: requests \
         shed in a row under overload, closed_slow: a reply not read in time, closed_error).",
        tcp.outcomes()
            .into_iter()
            .map(|(outcome, n)| (vec![("outcome", outcome.to_string())], n)),
    )?;
    single(
        enc,
        "chimed_roughtime_tcp_open_connections",
        "Roughtime TCP connections open now.",
        ConstGauge::new(tcp.open.load(Relaxed) as i64),
    )?;
    Ok(())
}

/// The signer's batches driven in process, without a connection: the serve rule as TCP follows
/// it, for both suites.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::roughtime::job::testing::{answers, jobs, stats};
    use crate::roughtime::serve::testing::{request, shared, verify};
    use crate::roughtime::state::RoughtimeDrop;

    /// One Ed25519 batch of `packets` from `peer` over a state `synchronised` or not.
    fn batch(
        synchronised: bool,
        deny: &[&str],
        packets: &[Vec<u8>],
        peer: &str,
    ) -> (
        Vec<Option<Vec<u8>>>,
        crate::observe::counters::Counters<RoughtimeDrop>,
    ) {
        let shared = shared(synchronised, deny);
        let mut responder = Responder::new(ResponderConfig {
            versions: VersionSet::ALL,
            capacity: MAX_BATCH_SIZE,
        })
        .over_stream();
        let (jobs, rx) = jobs(packets, peer);
        let mut stats = stats();
        answer(&mut responder, &shared, &mut stats, &jobs, &mut Vec::new());
        (answers(rx), stats.counts)
    }

    #[test]
    fn a_batch_over_tcp_is_signed_once_and_every_reply_verifies() {
        let packets: Vec<_> = (0..3).map(request).collect();
        let (replies, counts) = batch(true, &[], &packets, "192.0.2.1");
        for (req, reply) in packets.iter().zip(&replies) {
            verify(req, reply.as_deref().expect("answered"));
        }
        assert_eq!(
            (counts.received, counts.batches, counts.answered),
            (3, 1, 3)
        );
    }

    #[test]
    fn over_tcp_too_nothing_is_signed_while_unsynchronised() {
        let (replies, counts) = batch(false, &[], &[request(1), request(2)], "192.0.2.1");
        assert_eq!(replies, [None, None]);
        assert_eq!(counts.dropped(RoughtimeDrop::Unsynchronised), 2);
    }

    #[test]
    fn over_tcp_a_denied_sender_is_counted_and_not_answered() {
        let (replies, counts) = batch(true, &["198.51.100.0/24"], &[request(1)], "198.51.100.9");
        assert_eq!(replies, [None]);
        assert_eq!(counts.dropped(RoughtimeDrop::Denied), 1);
    }

    /// CoDel's rule over the signer's queue: a burst is answered, a standing queue is shed from
    /// once it has stood for an interval, and shedding ends with the first batch that empties it.
    #[test]
    fn the_signer_sheds_only_from_a_standing_queue() {
        use std::time::{Duration, Instant};
        let ms = Duration::from_millis;
        let mut ageing = Ageing::new(Arc::new(chime_udp::ShedTuning::new(
            chime_udp::ShedConfig::default(),
        )));
        let t0 = Instant::now() + ms(1000);
        // Full batches whose oldest waited 20 ms, for 90 ms: a burst, answered.
        for at in (0..=90).step_by(10) {
            assert_eq!(ageing.cutoff(t0 + ms(at), t0 + ms(at) - ms(20), true), None);
        }
        // At 100 ms it has stood a whole interval: what waited over 5 ms is shed.
        let now = t0 + ms(100);
        assert_eq!(ageing.cutoff(now, now - ms(20), true), Some(now - ms(5)));
        // A young oldest sheds nothing, but shedding goes on while batches fill.
        assert_eq!(ageing.cutoff(now + ms(1), now, true), None);
        let now = t0 + ms(110);
        assert_eq!(ageing.cutoff(now, now - ms(9), true), Some(now - ms(5)));
        // A batch that does not fill has emptied the queue: shed from, and the last.
        let now = t0 + ms(120);
        assert_eq!(ageing.cutoff(now, now - ms(9), false), Some(now - ms(5)));
        assert_eq!(ageing.cutoff(now + ms(1), now - ms(9), true), None);
        // A batch that drains the queue ends a would-be standing queue too.
        let mut ageing = Ageing::new(Arc::new(chime_udp::ShedTuning::new(
            chime_udp::ShedConfig::default(),
        )));
        for at in [0, 50, 99] {
            let full = at != 50;
            assert_eq!(ageing.cutoff(t0 + ms(at), t0 + ms(at) - ms(20), full), None);
        }
    }

    /// What waited longer than the target is taken out of the batch, told so, and counted.
    #[test]
    fn shed_requests_are_told_and_counted_and_the_rest_signed() {
        use std::time::{Duration, Instant};
        let packets: Vec<_> = (0..6u8).map(request).collect();
        let (mut jobs, answers) = jobs(&packets, "192.0.2.1");
        let now = Instant::now();
        for (i, job) in jobs.iter_mut().enumerate() {
            job.read_at = now - Duration::from_millis(if i < 4 { 50 } else { 1 });
        }
        let mut ageing = Ageing::new(Arc::new(chime_udp::ShedTuning::new(
            chime_udp::ShedConfig {
                target: Duration::from_millis(5),
                interval: Duration::ZERO,
            },
        )));
        let mut stats = stats();
        shed(&mut ageing, &mut jobs, true, &mut stats);
        assert_eq!(jobs.len(), 2);
        assert_eq!(stats.counts.shed, 4);
        let shed_told = answers
            .into_iter()
            .take(4)
            .map(|mut a| a.try_recv().unwrap());
        assert!(shed_told.into_iter().all(|r| r == Reply::Shed));
    }

    /// A connection is read however far ahead of the signer its client is: past [`WAITING`]
    /// the oldest waiting request goes, counted as shed, and a run of them closes it.
    #[test]
    fn a_connection_ahead_of_the_signer_sheds_its_oldest_waiting_requests() {
        let counts = Counts::default();
        let mut requests = Requests {
            frames: FrameReader::new(MAX_MESSAGE),
            waiting: Default::default(),
            in_flight: 0,
            shed_in_a_row: 0,
        };
        let packets: Vec<Vec<u8>> = (0..WAITING as u8 + 3).map(request).collect();
        let bytes: Vec<u8> = packets.concat();
        assert_eq!(requests.read(&bytes, &counts).ok(), Some(true));
        assert_eq!(requests.waiting.len(), WAITING);
        assert_eq!(counts.shed_waiting.load(Relaxed), 3);
        // The youngest stay, oldest first: the fourth request leads.
        assert_eq!(requests.waiting[0].0, packets[3]);
        let (reply, _answers) = mpsc::channel(IN_FLIGHT);
        let job = requests
            .next_job("192.0.2.1".parse().unwrap(), &reply)
            .unwrap();
        assert_eq!((job.packet, requests.in_flight), (packets[3].clone(), 1));
        // Replies go onto what is written next; a signed one ends a run of sheds, and
        // SHED_IN_A_ROW sheds in a row end the connection, as does a dropped request.
        let mut out = Vec::new();
        requests.in_flight = 3;
        assert!(requests.take(Reply::Shed, &mut out).is_ok());
        assert!(requests.take(Reply::Signed(vec![1, 2]), &mut out).is_ok());
        assert_eq!(
            (out, requests.in_flight, requests.shed_in_a_row),
            (vec![1, 2], 1, 0)
        );
        assert!(matches!(
            requests.take(Reply::Dropped, &mut vec![]),
            Err(End::Unanswered)
        ));
        for _ in 1..SHED_IN_A_ROW {
            assert!(requests.shed().is_ok());
        }
        assert!(matches!(requests.shed(), Err(End::Ageing)));
        // Bytes that are not Roughtime end it too.
        assert!(matches!(
            requests.read(&[0xff; 64], &counts),
            Err(End::BadFrame)
        ));
    }
}
