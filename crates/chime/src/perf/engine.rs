//! The engine: a run as a whole, whatever the protocol and the transport. It starts one sending
//! thread per share of the transport (each an event loop, `worker`), hands them the steps one
//! after another (each phase start as an absolute time, so they start together), reads /proc
//! around each step, keeps the live progress line, merges the threads' numbers into each step's
//! report, and stops stepping once a step breaks the front end's limit. What is printed and
//! written of the reports is the front end's (`load` for request/reply protocols, `ke` for
//! NTS-KE sessions).

use std::io::{self, IsTerminal};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::args::Plan;
use super::inflight::{InFlight, WARMUP, thread_tags};
use super::procfs::Watch;
use super::stats::{StepReport, StepStats};
use super::worker::{Command, Finished, Phase, Progress, StepDone, Worker};

/// Time from handing a phase to the threads to its start, so that every thread is waiting for it.
const START_DELAY: Duration = Duration::from_millis(20);

/// How often the progress line is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// How long past a step's end plus timeout the threads may take to report before the run is
/// abandoned as stuck.
const STALL_LIMIT: Duration = Duration::from_secs(10);

/// What a run is: its steps, how large a batch a thread sends at most, and what /proc is read
/// for.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) plan: Plan,
    pub(crate) batch_size: usize,
    pub(crate) watch: Watch,
}

/// The steps measured, and why stepping stopped early if it did.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) steps: Vec<StepReport>,
    pub(crate) stopped_early: Option<String>,
}

/// Runs the whole load: one sending thread per share, each running `drive` on its share (which
/// plugs its transport into the worker's event loop). After each step, `over` says whether the
/// step broke the run's limit (and how, for the report), which stops stepping if more steps were
/// to come, and `on_step` sees its report.
pub(crate) fn run<S, F>(
    setup: &Setup,
    shares: Vec<S>,
    drive: F,
    over: impl Fn(&StepReport) -> Option<String>,
    on_step: impl FnMut(&StepReport),
) -> Result<Outcome>
where
    S: Send + 'static,
    F: Fn(S, Worker) -> Finished + Send + Clone + 'static,
{
    let pool = Pool::spawn(setup, shares, drive)?;
    let mut line = ProgressLine::new(&pool.progress);
    let (mut steps, stopped_early) = run_steps(setup, &pool, &mut line, over, on_step)?;
    // The live line goes before the report is printed.
    drop(line);

    // Late and duplicate replies are counted until the threads stop.
    for finished in pool.stop()? {
        for r in &mut steps {
            let step = r.step - 1;
            r.late += finished.late.get(step).copied().unwrap_or(0);
            r.duplicate += finished.duplicate.get(step).copied().unwrap_or(0);
        }
    }
    Ok(Outcome {
        steps,
        stopped_early,
    })
}

/// Runs the warm-up (if any) and then the steps one after another, stopping after a step that is
/// `over` the limit if more were to come. Returns the steps' reports and, if it stopped early,
/// why.
fn run_steps(
    setup: &Setup,
    pool: &Pool,
    line: &mut ProgressLine,
    over: impl Fn(&StepReport) -> Option<String>,
    mut on_step: impl FnMut(&StepReport),
) -> Result<(Vec<StepReport>, Option<String>)> {
    let plan = &setup.plan;
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
        let report = run_step(i, rate, start, plan, pool, &setup.watch, line)?;
        on_step(&report);
        let broke = over(&report);
        reports.push(report);
        if broke.is_some() && i + 1 < plan.rates.len() {
            return Ok((reports, broke));
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
    // A transport that ends its requests itself may take a second timeout (see `worker`).
    let limit = start + plan.duration + plan.timeout * 2 + STALL_LIMIT;
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

/// The sending threads and the channels to and from them.
struct Pool {
    commands: Vec<Sender<Command>>,
    results: mpsc::Receiver<StepDone>,
    handles: Vec<JoinHandle<Finished>>,
    progress: Vec<Arc<Progress>>,
}

impl Pool {
    /// Starts one worker per share, each running `drive` on its share.
    fn spawn<S, F>(setup: &Setup, shares: Vec<S>, drive: F) -> Result<Self>
    where
        S: Send + 'static,
        F: Fn(S, Worker) -> Finished + Send + Clone + 'static,
    {
        let threads = shares.len();
        let tags = thread_tags(threads);
        let (results_tx, results) = mpsc::channel();
        let mut pool = Self {
            commands: Vec::new(),
            results,
            handles: Vec::new(),
            progress: Vec::new(),
        };
        for (index, (share, tag)) in shares.into_iter().zip(tags).enumerate() {
            let (commands_tx, commands) = mpsc::channel();
            let progress = Arc::new(Progress::default());
            let worker = Worker {
                index,
                threads,
                inflight: InFlight::new(tag, setup.plan.inflight_slots),
                batch_size: setup.batch_size,
                timeout: setup.plan.timeout,
                steps: setup.plan.rates.len(),
                progress: progress.clone(),
                commands,
                results: results_tx.clone(),
            };
            let drive = drive.clone();
            let handle = std::thread::Builder::new()
                .name(format!("perf-{index}"))
                .spawn(move || drive(share, worker))
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
