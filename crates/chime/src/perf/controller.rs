//! The run as a whole: sockets and threads set up, the steps started one after another (each
//! phase start handed to every thread as an absolute time, so they start together), /proc read
//! around each step, the live progress line, and the outputs at the end.

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chime_udp::{SocketConfig, UdpSocket};
use nix::fcntl::{FcntlArg, OFlag, fcntl};

use super::args::{LoadArgs, Plan, usage};
use super::inflight::{InFlight, WARMUP, thread_tags};
use super::plot;
use super::procfs::Watch;
use super::protocol::LoadProtocol;
use super::report::{self, RunReport};
use super::stats::{StepReport, StepStats};
use super::worker::{Command, Finished, Phase, Progress, StepDone, Worker};

/// Receive buffer asked for on each source socket, so that replies arriving in a burst are not
/// dropped on our side and counted as the server's loss (drops are reported either way).
const RECV_BUFFER: usize = 4 << 20;

/// Time from handing a phase to the threads to its start, so that every thread is waiting for it.
const START_DELAY: Duration = Duration::from_millis(20);

/// How often the progress line is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// How long past a step's end plus timeout the threads may take to report before the run is
/// abandoned as stuck.
const STALL_LIMIT: Duration = Duration::from_secs(10);

/// Runs the whole load test with `protocol`'s requests. `request` describes the requests for the
/// JSON output and `label` for people.
/// With `tcp`, the requests go over TCP: that many connections per thread, reused, or (0) a new
/// connection per request.
pub(crate) fn run<P: LoadProtocol>(
    load: &LoadArgs,
    protocol: P,
    request: serde_json::Value,
    label: &str,
    tcp: Option<usize>,
) -> Result<()> {
    let plan = load.plan().unwrap_or_else(|e| e.exit());
    // Open the output files first: a typo in a path should cost nothing, not a finished run.
    let outputs = Outputs::create(load).unwrap_or_else(|e| e.exit());

    let sockets = match tcp {
        None => bind_sockets(load.target(), load.sockets)?,
        Some(_) => Vec::new(),
    };
    let kernel_rx_timestamps =
        tcp.is_none() && sockets.iter().all(|s| s.capabilities().rx_timestamps);
    let watch = Watch {
        server_pid: load.server_pid,
        target: load.target(),
        client_ports: sockets
            .iter()
            .map(|s| s.local_addr().map(|a| a.port()))
            .collect::<io::Result<_>>()?,
    };
    let pool = Pool::spawn(load, &plan, sockets, protocol, tcp)?;
    print_banner::<P>(load, label, tcp, kernel_rx_timestamps);

    let mut line = ProgressLine::new(&pool.progress);
    let (mut reports, stopped_early) = run_steps(load, &plan, &pool, &watch, &mut line)?;
    // The live line goes before the report is printed.
    drop(line);

    // Late and duplicate replies are counted until the threads stop.
    for finished in pool.stop()? {
        for r in &mut reports {
            let step = r.step - 1;
            r.late += finished.late.get(step).copied().unwrap_or(0);
            r.duplicate += finished.duplicate.get(step).copied().unwrap_or(0);
        }
    }

    let verdict = (load.verdict || load.max_p99.is_some())
        .then(|| report::Verdict::of(&reports, load.max_loss, load.max_p99));
    print_results(
        &reports,
        load.max_loss,
        stopped_early.as_deref(),
        verdict.as_ref(),
    )?;

    let run = RunReport {
        protocol: P::NAME,
        target: load.target().to_string(),
        request,
        threads: load.threads,
        sockets: load.sockets,
        batch_size: load.batch_size,
        duration: load.duration,
        warmup: load.warmup,
        timeout: load.timeout,
        max_loss_pct: load.max_loss,
        server_pid: load.server_pid,
        kernel_rx_timestamps,
        stopped_early,
        verdict: verdict.clone(),
        steps: &reports,
    };
    outputs.write(
        &run,
        &format!("chime perf {} ({label}) → {}", P::NAME, load.target()),
    )?;
    match verdict {
        Some(v) if !v.pass => bail!("verdict: FAIL ({})", v.failures.join("; ")),
        _ => Ok(()),
    }
}

/// The first line of the output: what is sent, to where, by how many threads over what, and
/// where T4 comes from.
fn print_banner<P: LoadProtocol>(
    load: &LoadArgs,
    label: &str,
    tcp: Option<usize>,
    kernel_rx_timestamps: bool,
) {
    let links = match tcp {
        None => format!("{} socket(s)", load.sockets),
        Some(0) => "TCP, a new connection per request".to_owned(),
        Some(n) => format!("TCP, {n} connection(s) per thread, reused"),
    };
    println!(
        "chime perf {}: {label} to {}, {} thread(s), {links}, {} s per step, timeout {} s, {}",
        P::NAME,
        load.target(),
        load.threads,
        load.duration,
        load.timeout,
        if kernel_rx_timestamps {
            "T4 from kernel receive timestamps"
        } else if tcp.is_some() {
            "T4 read when a reply is read"
        } else {
            "no kernel receive timestamps: T4 read after recvmmsg"
        }
    );
}

/// Runs the warm-up (if any) and then the steps one after another, stopping after a step whose
/// loss is over `--max-loss` if more were to come. Returns the steps' reports and, if it stopped
/// early, why.
fn run_steps(
    load: &LoadArgs,
    plan: &Plan,
    pool: &Pool,
    watch: &Watch,
    line: &mut ProgressLine,
) -> Result<(Vec<StepReport>, Option<String>)> {
    let first_start = Instant::now() + START_DELAY;
    if !plan.warmup.is_zero() {
        pool.broadcast(Phase {
            step: WARMUP,
            rate: plan.rates[0],
            start: first_start,
            duration: plan.warmup,
            stale_after: plan.client_interval(plan.rates[0]),
        });
    }

    let mut reports: Vec<StepReport> = Vec::new();
    for (i, &rate) in plan.rates.iter().enumerate() {
        let start = if i == 0 {
            first_start + plan.warmup
        } else {
            Instant::now() + START_DELAY
        };
        let report = run_step(i, rate, start, plan, pool, watch, line)?;
        let over = report.loss_pct > load.max_loss;
        let loss = report.loss_pct;
        reports.push(report);
        if over && i + 1 < plan.rates.len() {
            let stopped_early = Some(format!("step {} lost {loss:.3}%", i + 1));
            return Ok((reports, stopped_early));
        }
    }
    Ok((reports, None))
}

/// Step `i` (from 0) at `rate`, starting at `start`: handed to the threads, waited for with the
/// progress line redrawn, and reported with /proc's readings from either side of it.
fn run_step(
    i: usize,
    rate: f64,
    start: Instant,
    plan: &Plan,
    pool: &Pool,
    watch: &Watch,
    line: &mut ProgressLine,
) -> Result<StepReport> {
    let phase = Phase {
        step: u16::try_from(i).context("too many steps")?,
        rate,
        start,
        duration: plan.duration,
        stale_after: plan.client_interval(rate),
    };
    pool.broadcast(phase);
    line.begin(format!("warm-up at {rate:.0}/s"));
    while let Some(left) = start.checked_duration_since(Instant::now()) {
        line.show();
        std::thread::sleep(left.min(PROGRESS_INTERVAL));
    }
    let before = watch.snapshot();
    line.begin(format!(
        "step {}/{} at {rate:.0}/s",
        i + 1,
        plan.rates.len()
    ));
    let limit = start + plan.duration + plan.timeout + STALL_LIMIT;
    let stats = pool.collect(phase.step, limit, line)?;
    let after = watch.snapshot();

    let mut report = StepReport::new(
        i + 1,
        rate,
        plan.duration.as_secs_f64(),
        plan.client_interval(rate).as_secs_f64(),
        &stats,
    );
    let delta = watch.delta(&before, &after, stats.answered, plan.duration);
    report.server_cpu = delta.server_cpu;
    report.client_cpu_percent = delta.client_cpu_percent;
    report.client_rx_drops = delta.client_rx_drops;
    report.server_rx_drops = delta.server_rx_drops;
    report.steal_pct = delta.steal_pct;
    line.end(&report);
    if let Some(e) = &stats.first_error {
        eprintln!("chime: step {}: {e}", i + 1);
    }
    Ok(report)
}

/// The table, the summary and the verdict, if one was asked for, on stdout.
fn print_results(
    reports: &[StepReport],
    max_loss: f64,
    stopped_early: Option<&str>,
    verdict: Option<&report::Verdict>,
) -> Result<()> {
    let mut stdout = io::stdout().lock();
    report::table(&mut stdout, reports)?;
    write!(
        stdout,
        "{}",
        report::summary(reports, max_loss, stopped_early)
    )?;
    if let Some(v) = verdict {
        write!(stdout, "{}", v.text())?;
    }
    Ok(())
}

/// The sending threads and the channels to and from them.
struct Pool {
    commands: Vec<Sender<Command>>,
    results: mpsc::Receiver<StepDone>,
    handles: Vec<JoinHandle<Finished>>,
    progress: Vec<Arc<Progress>>,
}

impl Pool {
    /// Starts `--threads` workers, sharing the sockets out among them round robin.
    fn spawn<P: LoadProtocol>(
        load: &LoadArgs,
        plan: &Plan,
        sockets: Vec<UdpSocket>,
        protocol: P,
        tcp: Option<usize>,
    ) -> Result<Self> {
        let threads = load.threads;
        let mut shares: Vec<Vec<UdpSocket>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, s) in sockets.into_iter().enumerate() {
            shares[i % threads].push(s);
        }
        let tags = thread_tags(threads);
        let (results_tx, results) = mpsc::channel();
        let mut pool = Self {
            commands: Vec::new(),
            results,
            handles: Vec::new(),
            progress: Vec::new(),
        };
        for (index, (sockets, tag)) in shares.into_iter().zip(tags).enumerate() {
            let (commands_tx, commands) = mpsc::channel();
            let progress = Arc::new(Progress::default());
            let worker = Worker {
                index,
                threads,
                target: load.target(),
                sockets,
                protocol: protocol.clone(),
                inflight: InFlight::new(tag, plan.inflight_slots),
                batch_size: load.batch_size,
                timeout: plan.timeout,
                steps: plan.rates.len(),
                progress: progress.clone(),
                tcp,
            };
            let results = results_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("perf-{index}"))
                .spawn(move || worker.run(commands, results))
                .context("cannot start a sending thread")?;
            pool.commands.push(commands_tx);
            pool.handles.push(handle);
            pool.progress.push(progress);
        }
        Ok(pool)
    }

    fn broadcast(&self, phase: Phase) {
        for c in &self.commands {
            // A worker that is gone shows up in `collect`.
            let _ = c.send(Command::Run(phase));
        }
    }

    /// Waits for every thread's numbers for the current step, redrawing the progress line.
    fn collect(&self, step: u16, limit: Instant, line: &mut ProgressLine) -> Result<StepStats> {
        let mut merged = StepStats::new();
        let mut done = 0;
        while done < self.handles.len() {
            match self.results.recv_timeout(PROGRESS_INTERVAL) {
                Ok(d) => {
                    // Phases run strictly one after another, so nothing else can arrive.
                    if d.step != step {
                        bail!(
                            "a sending thread reported step {} during step {step}",
                            d.step
                        );
                    }
                    merged.merge(&d.stats);
                    done += 1;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(i) = self.handles.iter().position(JoinHandle::is_finished) {
                        bail!("sending thread {i} stopped unexpectedly");
                    }
                    if Instant::now() > limit {
                        bail!("the sending threads did not finish the step in time");
                    }
                }
                Err(RecvTimeoutError::Disconnected) => bail!("the sending threads stopped"),
            }
            line.show();
        }
        Ok(merged)
    }

    /// Tells every thread to stop and collects what they hand back.
    fn stop(self) -> Result<Vec<Finished>> {
        for c in &self.commands {
            let _ = c.send(Command::Stop);
        }
        self.handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a sending thread panicked"))
            })
            .collect()
    }
}

/// Binds the source sockets: any local address, kernel-chosen ports, non-blocking.
fn bind_sockets(target: SocketAddr, n: usize) -> Result<Vec<UdpSocket>> {
    let any: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    (0..n)
        .map(|_| {
            let mut cfg = SocketConfig::new(any);
            cfg.reuse_port = false;
            cfg.recv_buffer = Some(RECV_BUFFER);
            let socket = UdpSocket::bind(&cfg).context("cannot open a UDP socket")?;
            // The worker polls for readiness and must never block in a receive or a send: a
            // blocked send would stall the schedule, which is what an open loop must not do.
            let flags = OFlag::from_bits_truncate(fcntl(&socket, FcntlArg::F_GETFL)?);
            fcntl(&socket, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
            Ok(socket)
        })
        .collect()
}

/// The files named by `--csv`, `--json` and `--plot`, created before the run.
struct Outputs {
    csv: Option<(PathBuf, File)>,
    json: Option<(PathBuf, File)>,
    plot: Option<PathBuf>,
}

impl Outputs {
    fn create(load: &LoadArgs) -> Result<Self, clap::Error> {
        let open = |flag: &str, path: &Option<PathBuf>| -> Result<_, clap::Error> {
            path.as_ref()
                .map(|p| {
                    File::create(p)
                        .map(|f| (p.clone(), f))
                        .map_err(|e| usage(format!("--{flag} {}: {e}", p.display())))
                })
                .transpose()
        };
        let plot = open("plot", &load.plot)?.map(|(p, _)| p);
        Ok(Self {
            csv: open("csv", &load.csv)?,
            json: open("json", &load.json)?,
            plot,
        })
    }

    fn write(self, run: &RunReport<'_>, title: &str) -> Result<()> {
        let context = |p: &Path| format!("cannot write {}", p.display());
        if let Some((path, file)) = self.csv {
            let mut out = io::BufWriter::new(file);
            report::csv(&mut out, run.steps).with_context(|| context(&path))?;
            out.flush().with_context(|| context(&path))?;
        }
        if let Some((path, file)) = self.json {
            let mut out = io::BufWriter::new(file);
            serde_json::to_writer_pretty(&mut out, run).with_context(|| context(&path))?;
            writeln!(out).with_context(|| context(&path))?;
            out.flush().with_context(|| context(&path))?;
        }
        if let Some(path) = self.plot {
            plot::draw(&path, title, run.steps).with_context(|| context(&path))?;
        }
        Ok(())
    }
}

/// The live progress line on stderr (indicatif), drawn only when stderr is a terminal, in colour
/// there: the phase (warm-up or step N/M at its rate), the time it has run, and what was sent and
/// answered per second since the last redraw.
struct ProgressLine {
    bar: Option<indicatif::ProgressBar>,
    counters: Vec<Arc<Progress>>,
    last_draw: Instant,
    /// Totals when the current phase began, and at the last redraw.
    base: (u64, u64),
    last: (u64, u64),
}

impl ProgressLine {
    fn new(counters: &[Arc<Progress>]) -> Self {
        let bar = io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner:.green} {prefix:.bold.cyan} [{elapsed_precise}] {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar
        });
        let mut line = Self {
            bar,
            counters: counters.to_vec(),
            last_draw: Instant::now(),
            base: (0, 0),
            last: (0, 0),
        };
        line.base = line.totals();
        line.last = line.base;
        line
    }

    fn totals(&self) -> (u64, u64) {
        self.counters.iter().fold((0, 0), |(s, a), p| {
            (
                s + p.sent.load(Ordering::Relaxed),
                a + p.answered.load(Ordering::Relaxed),
            )
        })
    }

    fn begin(&mut self, label: String) {
        self.base = self.totals();
        self.last = self.base;
        self.last_draw = Instant::now();
        if let Some(bar) = &self.bar {
            bar.reset_elapsed();
            bar.set_prefix(label);
            bar.set_message("starting");
        }
    }

    fn show(&mut self) {
        let elapsed = self.last_draw.elapsed();
        let Some(bar) = &self.bar else { return };
        if elapsed < PROGRESS_INTERVAL {
            bar.tick();
            return;
        }
        let (sent, answered) = self.totals();
        let secs = elapsed.as_secs_f64();
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs;
        let (step_sent, step_answered) = (sent - self.base.0, answered - self.base.1);
        let unanswered = if step_sent == 0 {
            0.0
        } else {
            step_sent.saturating_sub(step_answered) as f64 / step_sent as f64 * 100.0
        };
        bar.set_message(format!(
            "sent {step_sent} ({:.0}/s), answered {step_answered} ({:.0}/s), not yet answered \
             {unanswered:.2}%",
            rate(sent, self.last.0),
            rate(answered, self.last.1),
        ));
        self.last = (sent, answered);
        self.last_draw = Instant::now();
    }

    fn end(&mut self, r: &StepReport) {
        if let Some(bar) = &self.bar {
            bar.println(format!(
                "step {}: {:.0}/s offered, {:.1} answered/s, loss {:.3}%",
                r.step, r.offered_rate, r.answered_rate, r.loss_pct
            ));
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
