//! `--plot FILE.svg`: three panels drawn with plotters' SVG backend. On the left, answered rate
//! against offered rate, as ntpperf's plots show it (a server keeping up lies on the diagonal;
//! where it bends away is its capacity); in the middle, latency percentiles per step against
//! offered rate, on a logarithmic axis because they span orders of magnitude; on the right, the
//! most accepted step's round trips as bars per latency range, as the text summary draws them.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::stats::{RANGES_US, StepReport};

const WIDTH: u32 = 1800;
const HEIGHT: u32 = 520;

/// One line of the latency panel: its name, colour, and (offered rate, µs) points.
type Series = (&'static str, RGBColor, Vec<(f64, f64)>);

/// Draws the steps into an SVG file at `path`.
pub(crate) fn draw(path: &Path, title: &str, steps: &[StepReport]) -> Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let panels = root.split_evenly((1, 3));
    let (left, right, third) = (&panels[0], &panels[1], &panels[2]);

    let x_hi = steps.iter().map(|s| s.offered_rate).fold(0.0, f64::max) * 1.1;

    answered(left, steps, x_hi)?;
    latency(right, steps, x_hi)?;
    distribution(third, steps)?;
    root.present()?;
    Ok(())
}

/// Answered rate against offered rate, over the diagonal a server that answers everything lies
/// on.
fn answered<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    steps: &[StepReport],
    x_hi: f64,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let answered: Vec<(f64, f64)> = steps
        .iter()
        .map(|s| (s.offered_rate, s.answered_rate))
        .collect();
    let y_hi = answered.iter().map(|p| p.1).fold(x_hi, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("Answered rate", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_hi, 0.0..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("offered requests/s")
        .y_desc("answered requests/s")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    chart
        .draw_series(LineSeries::new([(0.0, 0.0), (x_hi, x_hi)], BLACK.mix(0.35)))?
        .label("all answered")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.35)));
    chart
        .draw_series(LineSeries::new(answered.iter().copied(), BLUE))?
        .label("answered")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
    chart.draw_series(answered.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()?;

    Ok(())
}

/// Latency percentiles against offered rate, on a logarithmic axis; a line with no points is
/// left out, and the legend with it when none has any.
fn latency<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    steps: &[StepReport],
    x_hi: f64,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let series: [Series; 4] = [
        ("p50", GREEN, pick(steps, |s| s.rtt_us.map(|p| p.p50))),
        ("p99", BLUE, pick(steps, |s| s.rtt_us.map(|p| p.p99))),
        ("p99.9", RED, pick(steps, |s| s.rtt_us.map(|p| p.p999))),
        (
            "T2−T1 p99",
            MAGENTA,
            pick(steps, |s| s.t2_t1_us.map(|p| p.p99)),
        ),
    ];
    let (l_lo, l_hi) = log_range(series.iter().flat_map(|s| s.2.iter().map(|p| p.1)));
    // Headroom above the highest line for the legend.
    let l_hi = l_hi * 4.0;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Latency (round trip, and server receive error)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_hi, (l_lo..l_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("offered requests/s")
        .y_desc("µs")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| {
            let decimals = if *v >= 10.0 {
                0
            } else if *v >= 1.0 {
                1
            } else {
                2
            };
            format!("{v:.decimals$}")
        })
        .draw()?;
    let any_latency = series.iter().any(|s| !s.2.is_empty());
    for (name, color, points) in series {
        if points.is_empty() {
            continue;
        }
        let style = ShapeStyle::from(color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.iter().copied(), style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    if any_latency {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    Ok(())
}

/// The most accepted step's round trips, as the share of its replies in each latency range.
fn distribution<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    steps: &[StepReport],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let Some(s) = steps
        .iter()
        .max_by(|a, b| a.accepted_rate.total_cmp(&b.accepted_rate))
        .filter(|s| s.answered > 0)
    else {
        return Ok(());
    };
    let n = s.rtt_ranges.len() as u32;
    let shares: Vec<(u32, f64)> = (0..n)
        .zip(&s.rtt_ranges)
        .map(|(i, &c)| (i, 100.0 * c as f64 / s.answered as f64))
        .collect();
    let label = |i: u32| match RANGES_US.get(i as usize) {
        Some(&us) if us >= 1e6 => format!("≤{}s", us / 1e6),
        Some(&us) if us >= 1e3 => format!("≤{}ms", us / 1e3),
        Some(&us) => format!("≤{us}µs"),
        None => ">1s".to_owned(),
    };
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "Round trips at step {} ({:.0}/s offered)",
                s.step, s.offered_rate
            ),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..100.0)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("round trip")
        .y_desc("% of replies")
        .x_labels(n as usize)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => label(*i),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(shares.into_iter().map(|(i, share)| {
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), share),
            ],
            BLUE.filled(),
        );
        bar.set_margin(0, 0, 3, 3);
        bar
    }))?;
    Ok(())
}

/// (offered rate, value) for the steps that have the value and where it can go on a log axis.
fn pick(steps: &[StepReport], value: impl Fn(&StepReport) -> Option<f64>) -> Vec<(f64, f64)> {
    steps
        .iter()
        .filter_map(|s| value(s).filter(|v| *v > 0.0).map(|v| (s.offered_rate, v)))
        .collect()
}

/// A log-axis range around some positive values, with room on either side; a fallback for none.
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (1.0, 10.0);
    }
    (lo / 1.5, hi * 1.5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::stats::{StepStats, record_ns};

    #[test]
    fn draws_an_svg() {
        let steps: Vec<StepReport> = [(1000.0, 1000), (1500.0, 1490), (2250.0, 1800)]
            .into_iter()
            .enumerate()
            .map(|(i, (rate, answered))| {
                let mut s = StepStats::new();
                s.sent = rate as u64;
                s.answered = answered;
                record_ns(&mut s.rtt, 20_000 * (i as i64 + 1));
                record_ns(&mut s.t2_t1, 5_000);
                StepReport::new(i + 1, rate, 1.0, 0.1, &s)
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf.svg");
        draw(&path, "chime perf ntp 127.0.0.1:123", &steps).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.contains("offered requests/s") && svg.contains("p99.9"));
        assert!(svg.contains("Round trips at step") && svg.contains("% of replies"));
    }

    #[test]
    fn ranges_survive_nothing_to_draw() {
        assert_eq!(log_range([0.0, -1.0].into_iter()), (1.0, 10.0));
        let (lo, hi) = log_range([5.0].into_iter());
        assert!(lo < 5.0 && hi > 5.0);
    }
}
