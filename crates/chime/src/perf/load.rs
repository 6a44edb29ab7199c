//! `chime perf ntp` and `chime perf roughtime`: a request/reply protocol on the engine, over
//! datagrams (`udp`) or streams (`tcp`), and what is made of its steps: the table, the summary and
//! the verdict on stdout, and the CSV, JSON and SVG files.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use chime_udp::UdpSocket;

use super::args::{LoadArgs, usage};
use super::engine::{self, Setup};
use super::plot;
use super::procfs::Watch;
use super::protocol::LoadProtocol;
use super::report::{self, RunReport};
use super::stats::StepReport;
use super::tcp::Streams;
use super::udp::{Datagrams, bind_sockets};
use super::worker::Worker;
use crate::out::outln;

/// Runs the load with `protocol`'s requests. `request` describes the requests for the JSON
/// output and `label` for people. With `tcp`, the requests go over TCP: that many connections
/// per thread, reused, or (0) a new connection per request.
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
    let target = load.target();
    let sockets = match tcp {
        None => bind_sockets(target, load.sockets)?,
        Some(_) => Vec::new(),
    };
    let kernel_rx_timestamps =
        tcp.is_none() && sockets.iter().all(|s| s.capabilities().rx_timestamps);
    let watch = Watch {
        server_pid: load.server_pid,
        target,
        client_ports: sockets
            .iter()
            .map(|s| s.local_addr().map(|a| a.port()))
            .collect::<io::Result<_>>()?,
    };
    let timeout = plan.timeout;
    let setup = Setup {
        plan,
        batch_size: load.batch_size,
        watch,
    };
    print_banner::<P>(load, label, tcp, kernel_rx_timestamps);
    let max_loss = load.max_loss;
    let over = |r: &StepReport| {
        (r.loss_pct > max_loss).then(|| format!("step {} lost {:.3}%", r.step, r.loss_pct))
    };
    let batch_size = load.batch_size;
    let outcome = match tcp {
        None => {
            let shares = share_out(sockets, load.threads)
                .into_iter()
                .map(|s| (s, protocol.clone()));
            let drive = move |(sockets, protocol): (Vec<UdpSocket>, P), worker: Worker| {
                worker.run(Datagrams::new(target, &sockets, protocol, batch_size))
            };
            engine::run(&setup, shares.collect(), drive, over, |_| {})?
        }
        Some(reuse) => {
            let shares = (0..load.threads)
                .map(|_| Streams::new(target, reuse, protocol.clone(), timeout))
                .collect();
            let drive = |streams: Streams<P>, worker: Worker| worker.run(streams);
            engine::run(&setup, shares, drive, over, |_| {})?
        }
    };
    let reports = outcome.steps;
    let stopped_early = outcome.stopped_early;

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
        target: target.to_string(),
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
        &format!("chime perf {} ({label}) → {}", P::NAME, target),
    )?;
    match verdict {
        Some(v) if !v.pass => bail!("verdict: FAIL ({})", v.failures.join("; ")),
        _ => Ok(()),
    }
}

/// The sockets shared out among `threads` threads, round robin.
fn share_out(sockets: Vec<UdpSocket>, threads: usize) -> Vec<Vec<UdpSocket>> {
    let mut shares: Vec<Vec<UdpSocket>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, s) in sockets.into_iter().enumerate() {
        shares[i % threads].push(s);
    }
    shares
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
    outln!(
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

/// The table, the summary and the verdict, if one was asked for, on stdout.
fn print_results(
    reports: &[StepReport],
    max_loss: f64,
    stopped_early: Option<&str>,
    verdict: Option<&report::Verdict>,
) -> Result<()> {
    let mut stdout = io::stdout().lock();
    let mut written = report::table(&mut stdout, reports).and_then(|()| {
        let summary = report::summary(reports, max_loss, stopped_early);
        write!(stdout, "{summary}")
    });
    if let Some(v) = verdict {
        written = written.and_then(|()| write!(stdout, "{}", v.text()));
    }
    Ok(crate::out::closed_ends(written)?)
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
