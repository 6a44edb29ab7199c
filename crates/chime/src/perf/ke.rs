//! `chime perf nts-ke`: cold NTS-KE sessions at a fixed or stepped rate, on the engine.
//!
//! Each session is what a client's first contact costs the server: a new TCP connection, a full
//! TLS 1.3 handshake (no resumption), the NTS-KE request, the response up to End of Message, and
//! the key export. The engine starts sessions on its absolute schedule (open loop) as it sends any
//! request; the transport here hands each to one of `--connections` client threads, which runs it
//! whole and reports how it ended. A session the threads are all too busy to start within the
//! timeout is counted as `backlog`, not silently dropped. Per step: sessions completed per second,
//! the latency from connect to the last record, how long sessions queued for a thread, failures
//! by kind, and the server's CPU time per completed session from /proc.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chime_ntp::nts::{self, KeAnswerError};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use serde::Serialize;

use super::args::{
    Plan, Steps, parse_pid, parse_positive_seconds, parse_rate, parse_steps, rates, usage,
};
use super::engine::{self, Setup};
use super::procfs::Watch;
use super::protocol::{ReplyMatch, Verdict};
use super::stats::{self, ServerCpu, StepReport};
use super::transport::{Began, Event, Reply, Request, Sent, Transport, realtime_ns};
use super::worker::Worker;
use crate::out::outln;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl Failure {
    /// Its name in the report.
    fn name(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Closed => "closed",
            Self::Tls => "tls",
            Self::Timeout => "timeout",
            Self::KeError => "ke_error",
            Self::BadRecords => "bad_records",
            Self::Io => "io",
            Self::Backlog => "backlog",
        }
    }
}

/// One step's results, as `--json` writes them and the step's line reads.
#[derive(Debug, Serialize)]
struct KeStep<'a> {
    step: usize,
    offered_rate: f64,
    duration: f64,
    scheduled: u64,
    completed: u64,
    completed_rate: f64,
    failed: u64,
    failed_pct: f64,
    failures: &'a BTreeMap<&'static str, u64>,
    /// Connect to the last record, of the completed sessions.
    latency_ms: Millis,
    /// Scheduled start to the actual start, of every session.
    queued_ms: Millis,
    server_cpu: Option<ServerCpu>,
    client_cpu_percent: f64,
}

impl<'a> KeStep<'a> {
    /// The engine's step, in sessions.
    fn of(r: &'a StepReport) -> Self {
        let failed: u64 = r.failures.values().sum();
        Self {
            step: r.step,
            offered_rate: r.offered_rate,
            duration: r.duration,
            scheduled: r.scheduled,
            completed: r.answered,
            completed_rate: r.answered_rate,
            failed,
            failed_pct: 100.0 * failed as f64 / r.scheduled.max(1) as f64,
            failures: &r.failures,
            latency_ms: Millis::of(r.rtt_us),
            queued_ms: Millis::of(r.send_lag_us),
            server_cpu: r.server_cpu,
            client_cpu_percent: r.client_cpu_percent,
        }
    }
}

/// Percentiles in milliseconds; all zero where there were none.
#[derive(Debug, Default, Serialize)]
struct Millis {
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Millis {
    fn of(p: Option<stats::Percentiles>) -> Self {
        p.map_or_else(Self::default, |p| Self {
            p50: p.p50 / 1e3,
            p99: p.p99 / 1e3,
            p999: p.p999 / 1e3,
            max: p.max / 1e3,
        })
    }
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let plan = plan(args).unwrap_or_else(|e| e.exit());
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
    if args.sources > 1 && !matches!(addr.ip(), IpAddr::V4(v4) if v4.octets()[0] == 127) {
        usage(format!("--sources: {addr} is not in 127.0.0.0/8")).exit();
    }
    let client = Client {
        config,
        name,
        aeads: Arc::new(args.nts_aead.0.clone()),
        addr,
        timeout: plan.timeout,
    };
    let sessions = Sessions::start(client, args.connections, args.sources)?;

    outln!(
        "chime perf nts-ke: cold NTS-KE sessions (TCP, TLS 1.3, request, response) to {addr} as \
         {host}, {} client threads, {} source address(es), {} s per step, timeout {} s",
        args.connections,
        args.sources,
        args.duration,
        args.timeout
    );
    let setup = Setup {
        plan,
        batch_size: BATCH,
        watch: Watch {
            server_pid: args.server_pid,
            target: addr,
            client_ports: Vec::new(),
        },
    };
    let max_failures = args.max_failures;
    let over = |r: &StepReport| {
        let s = KeStep::of(r);
        (s.failed_pct > max_failures)
            .then(|| format!("step {} failed {:.2}%", s.step, s.failed_pct))
    };
    let drive = |sessions: Sessions, worker: Worker| worker.run(sessions);
    let outcome = engine::run(&setup, vec![sessions], drive, over, |r| {
        print_step(&KeStep::of(r));
    })?;
    let steps: Vec<KeStep<'_>> = outcome.steps.iter().map(KeStep::of).collect();
    let stopped_early = outcome.stopped_early;
    print_summary(args, &steps, stopped_early.as_deref());
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
            "steps": steps,
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

/// Sessions handed to the client threads at once at most, when the schedule has fallen behind.
const BATCH: usize = 32;

/// The longest the engine sleeps before it takes the sessions' ends.
const END_POLL: Duration = Duration::from_millis(5);

/// The steps, from `--rate` or `--steps`; a first step too short to start a session is a usage
/// error. No warm-up: every session is a cold one.
fn plan(args: &Args) -> Result<Plan, clap::Error> {
    let rates = rates(args.rate, args.steps)?;
    if rates[0] * args.duration < 1.0 {
        return Err(usage(format!(
            "--duration {} s at {} sessions/s starts no session: make the step longer",
            args.duration, rates[0]
        )));
    }
    // A session ends by its timeout from when it was due; the table keeps two of those.
    Plan::new(rates, (args.duration, 0.0, args.timeout), None, 1, BATCH)
}

/// What every client thread needs to run a session.
#[derive(Clone)]
struct Client {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    aeads: Arc<Vec<nts::Aead>>,
    addr: SocketAddr,
    timeout: Duration,
}

/// A session to run: its id, when it was due, and where it connects from.
struct Job {
    id: u64,
    due: Instant,
    source: Option<IpAddr>,
}

/// How a session ended: the outcome, how long it queued for a thread, and when it began and
/// ended on the realtime clock.
struct End {
    id: u64,
    outcome: Result<(), (Failure, String)>,
    queued: Duration,
    began_ns: i64,
    ended_ns: i64,
}

/// NTS-KE sessions as the engine's transport: each request a session, run by the next free
/// client thread, its end reported under the request's id.
struct Sessions {
    /// To the client threads; taken when the transport goes, which ends them.
    jobs: Option<mpsc::Sender<Job>>,
    ends: mpsc::Receiver<End>,
    threads: Vec<JoinHandle<()>>,
    sources: u8,
    /// Sessions handed out so far, for the source address of the next.
    handed: u64,
}

impl Sessions {
    /// Starts `n` client threads, each running sessions until the transport goes.
    fn start(client: Client, n: u16, sources: u8) -> Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let (ends_tx, ends) = mpsc::channel();
        let mut threads = Vec::new();
        for i in 0..n {
            let (client, jobs, ends) = (client.clone(), rx.clone(), ends_tx.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("perf-ke-{i}"))
                    .stack_size(256 << 10)
                    .spawn(move || client.serve(&jobs, &ends))
                    .context("cannot start a client thread")?,
            );
        }
        Ok(Self {
            jobs: Some(jobs),
            ends,
            threads,
            sources,
            handed: 0,
        })
    }
}

impl Transport for Sessions {
    const ENDS_ITSELF: bool = true;

    /// Hands the sessions to the client threads; each begins when a thread is free.
    fn send(&mut self, requests: &[Request]) -> Sent {
        let now = realtime_ns();
        for r in requests {
            let source = (self.sources > 1).then(|| {
                let host = 1 + (self.handed % u64::from(self.sources)) as u8;
                IpAddr::from(Ipv4Addr::new(127, 0, 0, host))
            });
            self.handed += 1;
            if let Some(jobs) = &self.jobs {
                // The threads live until the sender goes.
                let _ = jobs.send(Job {
                    id: r.id,
                    due: r.due,
                    source,
                });
            }
        }
        Sent {
            sent: requests.len() as u64,
            t1_ns: (now, now),
            ..Sent::default()
        }
    }

    /// An end carries its own times, so it need not be taken the moment it comes: the engine
    /// sleeps until the next session is due (or a short while, as it waits for a step's last
    /// ends) and then takes all that came, one wakeup where waking for each end would be one
    /// more per session on the generator's CPU.
    fn poll(&mut self, wait: Duration, on: &mut impl FnMut(Event)) {
        std::thread::sleep(wait.min(END_POLL));
        for end in self.ends.try_iter() {
            let (verdict, why) = match end.outcome {
                Ok(()) => (Verdict::Valid, None),
                Err((kind, why)) => (Verdict::Failed(kind.name()), Some(why)),
            };
            let matched = ReplyMatch::Matched {
                id: end.id,
                verdict,
                server: None,
                signed: None,
            };
            on(Event::Reply(Reply {
                matched,
                t4_ns: end.ended_ns,
                began: Some(Began {
                    at_ns: end.began_ns,
                    queued_ns: i64::try_from(end.queued.as_nanos()).unwrap_or(i64::MAX),
                }),
                why,
            }));
        }
    }
}

impl Drop for Sessions {
    /// Ends the client threads once their sessions are over.
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Client {
    /// Takes jobs one at a time and runs each as a session, or counts it as backlog if it waited
    /// past its timeout, until the job sender goes.
    fn serve(&self, jobs: &Mutex<mpsc::Receiver<Job>>, ends: &mpsc::Sender<End>) {
        loop {
            // The lock is held only to take one job.
            let job = jobs.lock().map(|r| r.recv());
            let Ok(Ok(job)) = job else { return };
            let started = Instant::now();
            let began_ns = realtime_ns();
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
            let took = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
            let end = End {
                id: job.id,
                outcome,
                queued,
                began_ns,
                ended_ns: began_ns.saturating_add(took),
            };
            if ends.send(end).is_err() {
                return;
            }
        }
    }
}

/// The lines after the steps: why the run stopped early, if it did, and the best step within
/// `--max-failures`.
fn print_summary(args: &Args, reports: &[KeStep<'_>], stopped_early: Option<&str>) {
    if let Some(why) = stopped_early {
        outln!("stopped early: {why}");
    }
    if let Some(best) = reports
        .iter()
        .filter(|r| r.failed_pct <= args.max_failures)
        .max_by(|a, b| a.completed_rate.total_cmp(&b.completed_rate))
    {
        outln!(
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

fn print_step(r: &KeStep<'_>) {
    let failures = if r.failures.is_empty() {
        "none".to_owned()
    } else {
        r.failures
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
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
    outln!(
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
    source: Option<IpAddr>,
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
    tls.write_all(&nts::ke_request(nts::Protocol::NtpV4, aeads))
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
    let answer = nts::parse_ke_response(&response[..len], nts::Protocol::NtpV4, aeads).map_err(
        |e| match e {
            KeAnswerError::Refused(_) | KeAnswerError::NoProtocol | KeAnswerError::NoAead => {
                (Failure::KeError, e.to_string())
            }
            KeAnswerError::Bad(_) => (Failure::BadRecords, e.to_string()),
        },
    )?;
    crate::nts::export_keys(&tls.conn, &answer)
        .map_err(|e| (Failure::Tls, format!("key export: {e}")))?;
    Ok(())
}

/// A TCP connection to `addr`, from `source` if given.
fn connect(addr: SocketAddr, source: Option<IpAddr>, limit: Duration) -> io::Result<TcpStream> {
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
