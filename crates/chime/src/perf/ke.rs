//! `chime perf nts-ke`: cold NTS-KE sessions at a fixed or stepped rate.
//!
//! Each session is what a client's first contact costs the server: a new TCP connection, a full
//! TLS 1.3 handshake (no resumption), the NTS-KE request, the response up to End of Message, and
//! the key export. Sessions start on an absolute schedule (open loop), each on one of
//! `--connections` client threads; a session the threads are all too busy to start within the
//! timeout is counted as `backlog`, not silently dropped. Per step: sessions completed per second,
//! the latency from connect to the last record (HDR histogram), failures by kind, and the
//! server's CPU time per completed session from /proc.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chime_ntp::nts::{self, KeAnswerError};
use hdrhistogram::Histogram;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use serde::Serialize;

use super::args::{Steps, parse_pid, parse_positive_seconds, parse_rate, parse_steps, usage};
use super::procfs::Watch;
use super::stats::ServerCpu;

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("load").required(true).args(["rate", "steps"])))]
pub(crate) struct Args {
    /// The NTS-KE server: HOST[:PORT], port 4460 by default. HOST is also the name its
    /// certificate must carry
    #[arg(long, value_name = "HOST[:PORT]")]
    target: String,

    /// Trust the certificates in this PEM file [default: the system's store]
    #[arg(long = "nts-ca", value_name = "FILE")]
    nts_ca: Option<PathBuf>,

    /// The AEAD algorithms to offer, in order of preference: 15 (siv-cmac-256), 17
    /// (siv-cmac-512) or 30 (gcm-siv), comma-separated
    #[arg(long = "nts-aead", value_name = "LIST", default_value = "15",
          value_parser = crate::nts::parse_aeads)]
    nts_aead: crate::nts::AeadList,

    /// One fixed rate of new sessions per second
    #[arg(long, value_name = "N", value_parser = parse_rate, allow_negative_numbers = true)]
    rate: Option<f64>,

    /// Stepped rates: START sessions per second, times FACTOR each step, COUNT steps at most;
    /// stepping stops after a step whose failures pass --max-failures
    #[arg(long, value_name = "START:FACTOR:COUNT", value_parser = parse_steps)]
    steps: Option<Steps>,

    /// Seconds of new sessions per step
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = parse_positive_seconds,
          allow_negative_numbers = true)]
    duration: f64,

    /// Seconds a session may take, from its scheduled start to the last record
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = parse_positive_seconds,
          allow_negative_numbers = true)]
    timeout: f64,

    /// Connect from this many source addresses in turn, 127.0.0.1 up (a loopback target only), so
    /// that a server's per-address limits see many clients rather than one
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=254))]
    sources: u8,

    /// Sessions in progress at once at most (one client thread each)
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    connections: u16,

    /// Stop stepping after a step whose failed share is above this percentage
    #[arg(long = "max-failures", value_name = "PCT", default_value = "5",
          value_parser = super::args::parse_percent, allow_negative_numbers = true)]
    max_failures: f64,

    /// Report the CPU time this process (the server, on this host) spends per completed session
    #[arg(long = "server-pid", value_name = "PID", value_parser = parse_pid)]
    server_pid: Option<u32>,

    /// Write the settings and every step's results as one JSON object to this file
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// How a session failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum Failure {
    /// The connection was refused (nothing listening, or a full backlog).
    Refused,
    /// The server closed or reset the connection before the response was whole (as chimed does
    /// to an address over its limits).
    Closed,
    /// The TLS handshake failed: an alert, or a certificate we do not trust.
    Tls,
    /// No answer within the timeout.
    Timeout,
    /// The server answered with an NTS-KE Error record.
    KeError,
    /// Records that do not parse, or no cookies.
    BadRecords,
    /// Another I/O error.
    Io,
    /// Every client thread was busy until the session's timeout had passed: never started.
    Backlog,
}

/// One step's sessions as the client threads report them.
struct StepAcc {
    completed: u64,
    failures: BTreeMap<Failure, u64>,
    /// Connect to the last record, microseconds.
    latency: Histogram<u64>,
    /// Scheduled start to the actual start, microseconds.
    queued: Histogram<u64>,
    pending: u64,
    first_error: Option<String>,
}

impl StepAcc {
    fn new() -> Self {
        let h = || Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
        Self {
            completed: 0,
            failures: BTreeMap::new(),
            latency: h(),
            queued: h(),
            pending: 0,
            first_error: None,
        }
    }
}

/// One step's results.
#[derive(Debug, Serialize)]
struct StepReport {
    step: usize,
    offered_rate: f64,
    duration: f64,
    scheduled: u64,
    completed: u64,
    completed_rate: f64,
    failed: u64,
    failed_pct: f64,
    failures: BTreeMap<Failure, u64>,
    latency_ms: Percentiles,
    queued_ms: Percentiles,
    server_cpu: Option<ServerCpu>,
    client_cpu_percent: f64,
}

#[derive(Debug, Serialize)]
struct Percentiles {
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Self {
        let ms = |v: u64| v as f64 / 1000.0;
        Self {
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// A session to run: when it was due, which step counts it, and where it connects from.
struct Job {
    due: Instant,
    step: usize,
    source: Option<std::net::IpAddr>,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let rates = rates(args);
    // Open the output first: a typo in a path should cost nothing, not a finished run.
    let json = args.json.as_ref().map(|p| {
        std::fs::File::create(p)
            .map(|f| (p.clone(), f))
            .unwrap_or_else(|e| usage(format!("--json {}: {e}", p.display())).exit())
    });
    let (host, port) = crate::nts::split_host(&args.target, crate::nts::KE_PORT)?;
    let config = crate::nts::client_config(args.nts_ca.as_deref())?;
    let name =
        ServerName::try_from(host.clone()).with_context(|| format!("{host}: not a server name"))?;
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .with_context(|| format!("{host}: cannot resolve"))?
        .next()
        .with_context(|| format!("{host}: no address"))?;
    if args.sources > 1 && !matches!(addr.ip(), std::net::IpAddr::V4(v4) if v4.octets()[0] == 127) {
        usage(format!("--sources: {addr} is not in 127.0.0.0/8")).exit();
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let steps: Arc<Vec<Mutex<StepAcc>>> =
        Arc::new(rates.iter().map(|_| Mutex::new(StepAcc::new())).collect());

    let (tx, rx) = mpsc::channel::<Job>();
    let client = Client {
        jobs: Arc::new(Mutex::new(rx)),
        steps: steps.clone(),
        config,
        name,
        aeads: Arc::new(args.nts_aead.0.clone()),
        addr,
        timeout,
    };
    let threads = client.spawn(args.connections)?;

    println!(
        "chime perf nts-ke: cold NTS-KE sessions (TCP, TLS 1.3, request, response) to {addr} as \
         {host}, {} client threads, {} source address(es), {} s per step, timeout {} s",
        args.connections, args.sources, args.duration, args.timeout
    );
    let watch = Watch {
        server_pid: args.server_pid,
        target: addr,
        client_ports: Vec::new(),
    };
    let mut reports = Vec::new();
    let mut stopped_early = None;
    for (i, &rate) in rates.iter().enumerate() {
        let report = run_step(args, i, rate, &steps[i], &tx, &watch);
        print_step(&report);
        let over = report.failed_pct > args.max_failures;
        let pct = report.failed_pct;
        reports.push(report);
        if over && i + 1 < rates.len() {
            stopped_early = Some(format!("step {} failed {pct:.2}%", i + 1));
            break;
        }
    }
    drop(tx);
    for t in threads {
        let _ = t.join();
    }
    print_summary(args, &reports, stopped_early.as_deref());
    if let Some((path, file)) = json {
        let run = serde_json::json!({
            "protocol": "nts-ke",
            "target": args.target,
            "address": addr.to_string(),
            "connections": args.connections,
            "sources": args.sources,
            "duration": args.duration,
            "timeout": args.timeout,
            "max_failures_pct": args.max_failures,
            "server_pid": args.server_pid,
            "stopped_early": stopped_early,
            "steps": reports,
        });
        let mut out = io::BufWriter::new(file);
        let context = || format!("cannot write {}", path.display());
        serde_json::to_writer_pretty(&mut out, &run).with_context(context)?;
        writeln!(out)
            .and_then(|()| out.flush())
            .with_context(context)?;
    }
    Ok(())
}

/// The steps' rates, from `--rate` or `--steps`; a first step too short to start a session is
/// a usage error.
fn rates(args: &Args) -> Vec<f64> {
    let rates: Vec<f64> = match (args.rate, args.steps) {
        (Some(r), _) => vec![r],
        (None, Some(s)) => (0..s.count)
            .map(|i| s.start * s.factor.powi(i as i32))
            .collect(),
        (None, None) => usage("one of --rate and --steps is required").exit(),
    };
    if rates[0] * args.duration < 1.0 {
        usage(format!(
            "--duration {} s at {} sessions/s starts no session: make the step longer",
            args.duration, rates[0]
        ))
        .exit();
    }
    rates
}

/// What every client thread shares: the queue of jobs, the steps' tallies, and the server.
struct Client {
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    steps: Arc<Vec<Mutex<StepAcc>>>,
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    aeads: Arc<Vec<nts::Aead>>,
    addr: SocketAddr,
    timeout: Duration,
}

impl Client {
    /// Starts `n` client threads, each running sessions until the job sender goes.
    fn spawn(self, n: u16) -> Result<Vec<std::thread::JoinHandle<()>>> {
        let mut threads = Vec::new();
        for i in 0..n {
            let client = Self {
                jobs: self.jobs.clone(),
                steps: self.steps.clone(),
                config: self.config.clone(),
                name: self.name.clone(),
                aeads: self.aeads.clone(),
                addr: self.addr,
                timeout: self.timeout,
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("perf-ke-{i}"))
                    .stack_size(256 << 10)
                    .spawn(move || client.run())
                    .context("cannot start a client thread")?,
            );
        }
        Ok(threads)
    }

    /// Takes jobs one at a time and runs each as a session, or counts it as backlog if it waited
    /// past its timeout, until the job sender goes.
    fn run(self) {
        loop {
            // The lock is held only to take one job.
            let job = self.jobs.lock().map(|r| r.recv());
            let Ok(Ok(job)) = job else { return };
            let started = Instant::now();
            let queued = started.saturating_duration_since(job.due);
            let outcome = if queued >= self.timeout {
                Err((Failure::Backlog, "every client thread was busy".into()))
            } else {
                session(
                    (&self.config, &self.name, &self.aeads),
                    self.addr,
                    job.source,
                    job.due + self.timeout,
                )
            };
            let took = started.elapsed();
            let mut acc = self.steps[job.step]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            acc.pending -= 1;
            let _ = acc.queued.record(micros(queued));
            match outcome {
                Ok(()) => {
                    acc.completed += 1;
                    let _ = acc.latency.record(micros(took));
                }
                Err((kind, why)) => {
                    *acc.failures.entry(kind).or_insert(0) += 1;
                    acc.first_error.get_or_insert(why);
                }
            }
        }
    }
}

/// Step `i` (from 0) at `rate`: its sessions handed to the client threads on schedule, waited
/// for until each has ended or the step's limit passed, and reported with /proc's readings from
/// either side of it.
fn run_step(
    args: &Args,
    i: usize,
    rate: f64,
    step: &Mutex<StepAcc>,
    tx: &mpsc::Sender<Job>,
    watch: &Watch,
) -> StepReport {
    let timeout = Duration::from_secs_f64(args.timeout);
    let before = watch.snapshot();
    let start = Instant::now() + Duration::from_millis(20);
    let count = (rate * args.duration).round() as u64;
    step.lock().unwrap_or_else(|p| p.into_inner()).pending = count;
    for k in 0..count {
        let due = start + Duration::from_secs_f64(k as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // The threads live until the sender goes.
        let source = (args.sources > 1).then(|| {
            std::net::Ipv4Addr::new(127, 0, 0, 1 + (k % u64::from(args.sources)) as u8).into()
        });
        let _ = tx.send(Job {
            due,
            step: i,
            source,
        });
    }
    // Every session of the step ends by its deadline; the last is due a little before
    // start + duration.
    let limit = start + Duration::from_secs_f64(args.duration) + timeout * 2;
    while step.lock().unwrap_or_else(|p| p.into_inner()).pending > 0 && Instant::now() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = watch.snapshot();
    let acc = step.lock().unwrap_or_else(|p| p.into_inner());
    let delta = watch.delta(
        &before,
        &after,
        acc.completed,
        Duration::from_secs_f64(args.duration),
    );
    let failed: u64 = acc.failures.values().sum();
    let report = StepReport {
        step: i + 1,
        offered_rate: rate,
        duration: args.duration,
        scheduled: count,
        completed: acc.completed,
        completed_rate: acc.completed as f64 / args.duration,
        failed,
        failed_pct: 100.0 * failed as f64 / count.max(1) as f64,
        failures: acc.failures.clone(),
        latency_ms: Percentiles::of(&acc.latency),
        queued_ms: Percentiles::of(&acc.queued),
        server_cpu: delta.server_cpu,
        client_cpu_percent: delta.client_cpu_percent,
    };
    if let Some(e) = &acc.first_error {
        eprintln!("chime: step {}: first failure: {e}", i + 1);
    }
    report
}

/// The lines after the steps: why the run stopped early, if it did, and the best step within
/// `--max-failures`.
fn print_summary(args: &Args, reports: &[StepReport], stopped_early: Option<&str>) {
    if let Some(why) = stopped_early {
        println!("stopped early: {why}");
    }
    if let Some(best) = reports
        .iter()
        .filter(|r| r.failed_pct <= args.max_failures)
        .max_by(|a, b| a.completed_rate.total_cmp(&b.completed_rate))
    {
        println!(
            "best step within {}% failures: {:.0} sessions/s completed, p99 {:.2} ms{}",
            args.max_failures,
            best.completed_rate,
            best.latency_ms.p99,
            best.server_cpu
                .as_ref()
                .and_then(|c| c.us_per_reply)
                .map_or(String::new(), |us| format!(
                    ", server CPU {us:.0} µs per session ({:.0} sessions/s per core)",
                    1e6 / us
                ))
        );
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn print_step(r: &StepReport) {
    let failures = if r.failures.is_empty() {
        "none".to_owned()
    } else {
        r.failures
            .iter()
            .map(|(k, n)| {
                format!(
                    "{}={n}",
                    serde_json::to_value(k)
                        .unwrap_or_default()
                        .as_str()
                        .unwrap_or("?")
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let cpu = r.server_cpu.as_ref().map_or(String::new(), |c| {
        format!(
            ", server {} µs/session ({:.0}% of a core, busiest thread {:.0}%)",
            c.us_per_reply.map_or("-".into(), |u| format!("{u:.0}")),
            c.percent,
            c.busiest_thread_percent
        )
    });
    println!(
        "step {}: {:.0}/s offered, {:.1}/s completed ({} of {}), failed {:.2}% ({failures}), \
         latency p50 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms max {:.2} ms{cpu}",
        r.step,
        r.offered_rate,
        r.completed_rate,
        r.completed,
        r.scheduled,
        r.failed_pct,
        r.latency_ms.p50,
        r.latency_ms.p99,
        r.latency_ms.p999,
        r.latency_ms.max,
    );
}

/// One cold session, to be over by `deadline`.
fn session(
    (config, name, aeads): (&Arc<ClientConfig>, &ServerName<'static>, &[nts::Aead]),
    addr: SocketAddr,
    source: Option<std::net::IpAddr>,
    deadline: Instant,
) -> Result<(), (Failure, String)> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or((Failure::Timeout, "timed out".to_owned()))
    };
    let tcp = connect(addr, source, left()?).map_err(|e| classify(&e))?;
    let _ = tcp.set_nodelay(true);
    let conn = ClientConnection::new(config.clone(), name.clone())
        .map_err(|e| (Failure::Tls, e.to_string()))?;
    let mut tls = StreamOwned::new(conn, tcp);
    tls.sock
        .set_write_timeout(Some(left()?))
        .map_err(|e| classify(&e))?;
    tls.write_all(&nts::ke_request(aeads))
        .map_err(|e| classify(&e))?;
    let mut response = Vec::with_capacity(1500);
    let mut chunk = [0u8; 4096];
    let len = loop {
        if let Some(len) = nts::ke_message_len(&response) {
            break len;
        }
        if response.len() > 65536 {
            return Err((Failure::BadRecords, "response longer than 64 KiB".into()));
        }
        tls.sock
            .set_read_timeout(Some(left()?))
            .map_err(|e| classify(&e))?;
        match tls.read(&mut chunk) {
            Ok(0) => return Err((Failure::Closed, "closed before End of Message".into())),
            Ok(n) => response.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(classify(&e)),
        }
    };
    let answer = nts::parse_ke_response(&response[..len], aeads).map_err(|e| match e {
        KeAnswerError::Refused(_) | KeAnswerError::NoProtocol | KeAnswerError::NoAead => {
            (Failure::KeError, e.to_string())
        }
        KeAnswerError::Bad(_) => (Failure::BadRecords, e.to_string()),
    })?;
    crate::nts::export_keys(&tls.conn, &answer)
        .map_err(|e| (Failure::Tls, format!("key export: {e}")))?;
    Ok(())
}

/// A TCP connection to `addr`, from `source` if given.
fn connect(
    addr: SocketAddr,
    source: Option<std::net::IpAddr>,
    limit: Duration,
) -> io::Result<TcpStream> {
    let Some(ip) = source else {
        return TcpStream::connect_timeout(&addr, limit);
    };
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.bind(&SocketAddr::new(ip, 0).into())?;
    socket.connect_timeout(&addr.into(), limit)?;
    Ok(socket.into())
}

/// Which failure an I/O error is. rustls reports a TLS failure (an alert, an untrusted
/// certificate) as `InvalidData` wrapping its own error.
fn classify(e: &io::Error) -> (Failure, String) {
    use io::ErrorKind as K;
    let kind = match e.kind() {
        K::ConnectionRefused => Failure::Refused,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            Failure::Closed
        }
        K::TimedOut | K::WouldBlock => Failure::Timeout,
        K::InvalidData => Failure::Tls,
        _ => Failure::Io,
    };
    (kind, e.to_string())
}
