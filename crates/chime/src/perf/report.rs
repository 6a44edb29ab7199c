//! The results as a person reads them (a table and a few sentences) and as a program does (CSV,
//! JSON), all from the same [`StepReport`]s.

use std::fmt::Write as _;
use std::io::{self, Write};

use serde::Serialize;

use super::stats::{Percentiles, StepReport};

/// The whole run, as `--json` writes it.
#[derive(Debug, Serialize)]
pub(crate) struct RunReport<'a> {
    pub(crate) protocol: &'static str,
    pub(crate) target: String,
    /// Protocol-specific settings (NTP: version and mode).
    pub(crate) request: serde_json::Value,
    pub(crate) threads: usize,
    pub(crate) sockets: usize,
    pub(crate) batch_size: usize,
    pub(crate) duration: f64,
    pub(crate) warmup: f64,
    pub(crate) timeout: f64,
    pub(crate) max_loss_pct: f64,
    pub(crate) server_pid: Option<u32>,
    /// Whether T4 is the kernel's receive timestamp (else a clock read after `recvmmsg`).
    pub(crate) kernel_rx_timestamps: bool,
    /// Why stepping stopped before the last step, if it did.
    pub(crate) stopped_early: Option<String>,
    /// With `--verdict` or `--max-p99`: whether every step held the limits, and where not.
    pub(crate) verdict: Option<Verdict>,
    pub(crate) steps: &'a [StepReport],
}

/// The run against the limits the operator gave: every step within `--max-loss` (lost and stale
/// together: what clients did not accept) and, if given, `--max-p99`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Verdict {
    pub(crate) pass: bool,
    /// One line per limit a step broke.
    pub(crate) failures: Vec<String>,
}

impl Verdict {
    pub(crate) fn of(steps: &[StepReport], max_loss: f64, max_p99_ms: Option<f64>) -> Self {
        let mut failures = Vec::new();
        for s in steps {
            let bad = s.loss_pct + s.stale_pct;
            if bad > max_loss {
                failures.push(format!(
                    "step {} ({:.0}/s): {bad:.3}% lost or stale, over --max-loss {max_loss}%",
                    s.step, s.offered_rate
                ));
            }
            if let Some(limit) = max_p99_ms {
                match &s.rtt_us {
                    Some(p) if p.p99 / 1e3 > limit => failures.push(format!(
                        "step {} ({:.0}/s): p99 round trip {:.3} ms, over --max-p99 {limit} ms",
                        s.step,
                        s.offered_rate,
                        p.p99 / 1e3
                    )),
                    Some(_) => {}
                    None => failures.push(format!(
                        "step {} ({:.0}/s): no reply, so no p99 to hold to --max-p99",
                        s.step, s.offered_rate
                    )),
                }
            }
        }
        Self {
            pass: failures.is_empty(),
            failures,
        }
    }

    /// The verdict's lines for people.
    pub(crate) fn text(&self) -> String {
        if self.pass {
            return "Verdict: PASS (every step within the limits)\n".to_owned();
        }
        let mut text = "Verdict: FAIL\n".to_owned();
        for f in &self.failures {
            let _ = writeln!(text, "  {f}");
        }
        text
    }
}

/// Writes the table of steps.
pub(crate) fn table(out: &mut impl Write, steps: &[StepReport]) -> io::Result<()> {
    writeln!(
        out,
        "{:>4} {:>10} {:>10} {:>11} {:>8} {:>8} {:>11} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10} {:>7}",
        "step",
        "offered/s",
        "sent",
        "answered/s",
        "loss %",
        "stale %",
        "accepted/s",
        "invalid",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "T2−T1 p99",
        "CPU/reply",
        "kernel"
    )?;
    for s in steps {
        let rtt = |f: fn(&Percentiles) -> f64| opt(s.rtt_us.as_ref().map(f), 1);
        writeln!(
            out,
            "{:>4} {:>10.0} {:>10} {:>11.1} {:>8.3} {:>8.3} {:>11.1} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10} \
             {:>7}",
            s.step,
            s.offered_rate,
            s.sent,
            s.answered_rate,
            s.loss_pct,
            s.stale_pct,
            s.accepted_rate,
            s.invalid,
            rtt(|p| p.p50),
            rtt(|p| p.p99),
            rtt(|p| p.p999),
            opt(s.t2_t1_us.map(|p| p.p99), 1),
            opt(s.server_cpu.and_then(|c| c.us_per_reply), 2),
            opt(s.server_cpu.and_then(|c| c.kernel_us_per_reply), 2),
        )?;
    }
    writeln!(
        out,
        "Latency is the round trip T4 − T1; T2 − T1 is the server's receive timestamp error (µs); \
         stale answers took longer than a client's poll interval (--client-interval), so the \
         client had sent its next request: accepted/s counts the others; CPU/reply is server CPU \
         µs per answered request (--server-pid), kernel the part of it spent in the kernel \
         (system time)."
    )
}

/// The sentences under the table: what the run found, and anything that makes a figure suspect.
pub(crate) fn summary(steps: &[StepReport], max_loss: f64, stopped_early: Option<&str>) -> String {
    let mut text = String::new();
    let line = |s: &StepReport| {
        format!(
            "step {}: {:.0} requests/s offered, {:.1} answered/s, loss {:.3}%, stale {:.3}% (a \
             {:.0} ms client interval), {:.1} accepted/s",
            s.step,
            s.offered_rate,
            s.answered_rate,
            s.loss_pct,
            s.stale_pct,
            s.client_interval * 1e3,
            s.accepted_rate
        )
    };
    if let [only] = steps {
        let _ = writeln!(text, "Result: {}.", line(only));
    } else {
        match steps
            .iter()
            .filter(|s| s.loss_pct + s.stale_pct < 1.0)
            .max_by(|a, b| a.answered_rate.total_cmp(&b.answered_rate))
        {
            Some(best) => {
                let _ = writeln!(
                    text,
                    "Highest rate with loss and stale answers under 1%: {}.",
                    line(best)
                );
            }
            None => {
                let _ = writeln!(text, "No step had loss and stale answers under 1%.");
            }
        }
        if let Some(peak) = steps
            .iter()
            .max_by(|a, b| a.accepted_rate.total_cmp(&b.accepted_rate))
        {
            let _ = writeln!(text, "Most accepted: {}.", line(peak));
        }
    }
    if let Some(s) = steps
        .iter()
        .filter(|s| s.merkle_path.is_some())
        .max_by(|a, b| a.answered_rate.total_cmp(&b.answered_rate))
        && let Some(m) = s.merkle_path
    {
        let batch = match m.max {
            0 => "every reply signed alone".to_owned(),
            n => {
                let widest = 1u64.checked_shl(u32::from(n)).unwrap_or(u64::MAX);
                format!("a batch of {} to {widest} requests", widest / 2 + 1)
            }
        };
        let _ = writeln!(
            text,
            "Merkle paths at step {}: mean {:.2} hashes, longest {} ({batch}); {} replies verified \
             in full.",
            s.step, m.mean, m.max, s.verified
        );
    }
    // The round trips of the step that mattered: the only one, or the one most accepted.
    if let Some(s) = steps
        .iter()
        .max_by(|a, b| a.accepted_rate.total_cmp(&b.accepted_rate))
        && s.answered > 0
    {
        text.push_str(&distribution_text(s));
    }
    if let Some((s, worst)) = steps
        .iter()
        .filter_map(|s| s.slowest.map(|w| (s, w)))
        .max_by(|a, b| a.1.rtt_us.total_cmp(&b.1.rtt_us))
    {
        let when = jiff::Timestamp::from_nanosecond(i128::from(worst.sent_unix_ns))
            .map_or_else(|_| worst.sent_unix_ns.to_string(), |t| t.to_string());
        let _ = writeln!(
            text,
            "Slowest reply: {} at step {} ({:.0}/s offered), to the request sent at {when}.",
            fmt_us(worst.rtt_us),
            s.step,
            s.offered_rate
        );
    }
    if let Some(why) = stopped_early {
        let _ = writeln!(text, "Stopped early: {why} (--max-loss {max_loss}%).");
    }
    for s in steps {
        for warning in warnings(s) {
            let _ = writeln!(text, "warning: step {}: {warning}", s.step);
        }
    }
    text
}

/// A latency, in the unit that reads best.
fn fmt_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} µs")
    }
}

/// The widest bar, in characters.
const BAR: usize = 40;

/// Step `s`'s round trips as text bars, one per latency range that has any.
fn distribution_text(s: &StepReport) -> String {
    let mut text = format!(
        "Round trips at step {} ({:.0}/s offered), {} replies:\n",
        s.step, s.offered_rate, s.answered
    );
    let most = s.rtt_ranges.iter().copied().max().unwrap_or(0).max(1);
    let mut lower = 0.0;
    for (i, &n) in s.rtt_ranges.iter().enumerate() {
        let label = match crate::perf::stats::RANGES_US.get(i) {
            Some(&upper) => {
                let l = format!("{:>9} – {:<9}", fmt_us(lower), fmt_us(upper));
                lower = upper;
                l
            }
            None => format!("{:>9} and more  ", fmt_us(lower)),
        };
        if n == 0 {
            continue;
        }
        let width = ((n as f64 / most as f64) * BAR as f64).ceil() as usize;
        let _ = writeln!(
            text,
            "  {label} {:<BAR$} {n} ({:.2}%)",
            "#".repeat(width),
            100.0 * n as f64 / s.answered.max(1) as f64
        );
    }
    text
}

/// Steal on one CPU from which a lossy step is called out: a few percent of a two-second step
/// is one stall of tens of milliseconds, about what a deep receive buffer still rides out.
const STEAL_WARNING_PCT: f64 = 2.0;

fn warnings(s: &StepReport) -> Vec<String> {
    let mut w = Vec::new();
    if let Some(drops) = s.client_rx_drops.filter(|&d| d > 0) {
        w.push(format!(
            "our own sockets dropped {drops} datagrams on full receive queues: that loss is the \
             load generator's, not the server's (add --threads or --sockets)"
        ));
    }
    if s.scheduled > 0 && s.unsent * 100 > s.scheduled {
        w.push(format!(
            "the load generator fell behind and left {} of {} requests unsent (sent {:.0}/s of \
             {:.0}/s offered): add --threads, or the host is out of CPU",
            s.unsent, s.scheduled, s.sent_rate, s.offered_rate
        ));
    }
    if s.send_errors > 0 {
        w.push(format!("{} requests could not be sent", s.send_errors));
    }
    if s.recv_errors > 0 {
        w.push(format!("{} receive errors", s.recv_errors));
    }
    if let Some(steal) = &s.steal_pct
        && let Some((cpu, pct)) = steal
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .filter(|&(_, &p)| p >= STEAL_WARNING_PCT)
        && s.loss_pct > 0.0
    {
        w.push(format!(
            "the hypervisor took {pct:.1}% of CPU {cpu} (steal) during a step that lost {:.3}%: \
             some of that loss may be the host's stalls, not the server's",
            s.loss_pct
        ));
    }
    if s.t2_before_t1 > 0 {
        w.push(format!(
            "{} replies had T2 before T1: T2 − T1 means nothing unless the server shares this \
             host's clock",
            s.t2_before_t1
        ));
    }
    w
}

/// The CSV columns, one row per step.
const CSV_HEADER: &str = "step,offered_rate,duration_s,scheduled,sent,sent_rate,unsent,send_errors,\
answered,answered_rate,loss_pct,lost,invalid,refused,late,duplicate,\
rtt_p50_us,rtt_p90_us,rtt_p99_us,rtt_p999_us,rtt_max_us,\
t2_t1_p50_us,t2_t1_p90_us,t2_t1_p99_us,t2_t1_p999_us,t2_t1_max_us,\
t3_t2_p50_us,t3_t2_p90_us,t3_t2_p99_us,t3_t2_p999_us,t3_t2_max_us,\
send_lag_p99_us,server_cpu_us_per_reply,server_kernel_us_per_reply,server_cpu_pct,server_busiest_thread_pct,\
client_cpu_pct,client_rx_drops,server_rx_drops,verified,merkle_path_mean,merkle_path_max,\
max_cpu_steal_pct,client_interval_s,stale,stale_pct,accepted_rate";

/// Writes the steps as CSV: numbers only, an empty field where there is no value.
pub(crate) fn csv(out: &mut impl Write, steps: &[StepReport]) -> io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    for s in steps {
        let mut row = format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.step,
            s.offered_rate,
            s.duration,
            s.scheduled,
            s.sent,
            s.sent_rate,
            s.unsent,
            s.send_errors,
            s.answered,
            s.answered_rate,
            s.loss_pct,
            s.lost,
            s.invalid,
            s.refused,
            s.late,
            s.duplicate
        );
        for p in [s.rtt_us, s.t2_t1_us, s.t3_t2_us] {
            match p {
                Some(p) => {
                    let _ = write!(row, ",{},{},{},{},{}", p.p50, p.p90, p.p99, p.p999, p.max);
                }
                None => row.push_str(",,,,,"),
            }
        }
        let cpu = s.server_cpu;
        let fields = [
            s.send_lag_us.map(|p| p.p99),
            cpu.and_then(|c| c.us_per_reply),
            cpu.and_then(|c| c.kernel_us_per_reply),
            cpu.map(|c| c.percent),
            cpu.map(|c| c.busiest_thread_percent),
            Some(s.client_cpu_percent),
            s.client_rx_drops.map(|d| d as f64),
            s.server_rx_drops.map(|d| d as f64),
            Some(s.verified as f64),
            s.merkle_path.map(|m| m.mean),
            s.merkle_path.map(|m| f64::from(m.max)),
            s.steal_pct
                .as_ref()
                .and_then(|v| v.iter().copied().reduce(f64::max)),
            Some(s.client_interval),
            Some(s.stale as f64),
            Some(s.stale_pct),
            Some(s.accepted_rate),
        ];
        for f in fields {
            row.push(',');
            if let Some(v) = f {
                let _ = write!(row, "{v}");
            }
        }
        writeln!(out, "{row}")?;
    }
    Ok(())
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::stats::StepStats;

    fn step(n: usize, rate: f64, answered: u64) -> StepReport {
        let mut s = StepStats::new();
        s.scheduled = (rate * 2.0) as u64;
        s.sent = s.scheduled;
        s.answered = answered;
        super::super::stats::record_ns(&mut s.rtt, 25_000);
        StepReport::new(n, rate, 2.0, 0.1, &s)
    }

    #[test]
    fn csv_rows_match_the_header() {
        let steps = [step(1, 1000.0, 2000), step(2, 1500.0, 2900)];
        let mut out = Vec::new();
        csv(&mut out, &steps).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let columns = lines[0].split(',').count();
        for l in &lines[1..] {
            assert_eq!(l.split(',').count(), columns, "{l}");
        }
        assert!(lines[2].starts_with("2,1500,2,3000,3000,1500,0,0,2900,1450,"));
    }

    #[test]
    fn summary_names_the_best_step_under_one_percent() {
        let steps = [
            step(1, 1000.0, 2000),
            step(2, 1500.0, 2990),
            step(3, 2250.0, 3000),
        ];
        let text = summary(&steps, 10.0, Some("step 3 lost 33.333%"));
        assert!(
            text.contains(
                "Highest rate with loss and stale answers under 1%: step 2: 1500 requests/s \
                 offered, 1495.0 answered/s, loss 0.333%, stale 0.000% (a 100 ms client \
                 interval), 1495.0 accepted/s"
            ),
            "{text}"
        );
        assert!(text.contains("Stopped early"), "{text}");
        let one = summary(&steps[..1], 10.0, None);
        assert!(one.contains("answered/s, loss 0.000%"), "{one}");

        let mut table_out = Vec::new();
        table(&mut table_out, &steps).unwrap();
        let table_text = String::from_utf8(table_out).unwrap();
        assert_eq!(table_text.lines().count(), 5, "{table_text}");
    }

    #[test]
    fn stale_answers_count_against_a_step_as_loss_does() {
        let mut stale = StepStats::new();
        stale.sent = 3000;
        stale.answered = 3000;
        stale.stale = 60;
        let steps = [
            step(1, 1000.0, 2000),
            StepReport::new(2, 1500.0, 2.0, 0.025, &stale),
        ];
        assert_eq!((steps[1].stale_pct, steps[1].accepted_rate), (2.0, 1470.0));
        let text = summary(&steps, 10.0, None);
        // Step 2 answered more, but 2% of it stale: the best clean step is step 1.
        assert!(
            text.contains("under 1%: step 1: 1000 requests/s offered"),
            "{text}"
        );
        assert!(
            text.contains(
                "Most accepted: step 2: 1500 requests/s offered, 1500.0 answered/s, \
                 loss 0.000%, stale 2.000% (a 25 ms client interval), 1470.0 accepted/s"
            ),
            "{text}"
        );
        let mut out = Vec::new();
        csv(&mut out, &steps).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.lines().nth(2).unwrap().ends_with(",0.025,60,2,1470"),
            "{text}"
        );
    }

    #[test]
    fn steal_during_a_lossy_step_is_called_out() {
        let mut lossy = step(1, 1000.0, 1900);
        lossy.steal_pct = Some(vec![0.5, 3.25]);
        let mut clean = step(2, 1000.0, 2000);
        clean.steal_pct = Some(vec![9.0, 9.0]);
        let mut calm = step(3, 1000.0, 1900);
        calm.steal_pct = Some(vec![1.0, 1.5]);
        let text = summary(&[lossy, clean, calm], 10.0, None);
        let warned: Vec<&str> = text.lines().filter(|l| l.contains("steal")).collect();
        assert_eq!(warned.len(), 1, "{text}");
        assert!(
            warned[0].starts_with("warning: step 1: the hypervisor took 3.2% of CPU 1"),
            "{text}"
        );

        let mut out = Vec::new();
        csv(&mut out, &[step(1, 1000.0, 1900)]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().next().unwrap().contains(",max_cpu_steal_pct,"));
        let mut with = step(1, 1000.0, 1900);
        with.steal_pct = Some(vec![0.5, 3.25]);
        let mut out = Vec::new();
        csv(&mut out, &[with]).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .trim_end()
                .ends_with(",3.25,0.1,0,0,950")
        );
    }
}
