//! The flags every `chime perf` protocol shares: where to send, how fast, for how long, and where
//! the results go. Each flag is checked on its own by clap (exit 2, one line naming the flag);
//! [`LoadArgs::plan`] checks the ones that only make sense together.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;

/// The highest rate the tool accepts, requests per second, summed over threads. Far beyond what
/// one host can send; it only keeps the arithmetic and the in-flight table finite.
const MAX_RATE: f64 = 10_000_000.0;

/// The most steps a `--steps` run may have.
const MAX_STEPS: u32 = 100;

/// The longest a step, the warm-up or the timeout may be, in seconds.
const MAX_SECONDS: f64 = 3600.0;

/// The most sending threads and source sockets.
const MAX_THREADS: usize = 64;
const MAX_SOCKETS: usize = 4096;

/// The most in-flight slots one thread may hold (24 bytes each): the product of its rate and the
/// timeout, with headroom, must fit.
pub(crate) const MAX_INFLIGHT_SLOTS: usize = 1 << 24;

#[derive(Clone, Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("load").required(true).args(["rate", "steps"])))]
pub(crate) struct LoadArgs {
    /// The server to load: ADDR:PORT, HOST:PORT or [IPv6]:PORT
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_target)]
    pub(crate) target: Option<SocketAddr>,

    /// One fixed request rate, in requests per second (all threads together)
    #[arg(long, value_name = "N", value_parser = parse_rate,
          allow_negative_numbers = true)]
    pub(crate) rate: Option<f64>,

    /// Stepped rates, as ntpperf does: START requests per second, multiplied by FACTOR each step,
    /// COUNT steps at most (e.g. 20000:1.5:5); stepping stops after a step loses more than
    /// --max-loss
    #[arg(long, value_name = "START:FACTOR:COUNT", value_parser = parse_steps)]
    pub(crate) steps: Option<Steps>,

    /// Seconds of sending per step
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = parse_positive_seconds,
          allow_negative_numbers = true)]
    pub(crate) duration: f64,

    /// Seconds of load at the first step's rate before the first step, not counted
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds,
          allow_negative_numbers = true)]
    pub(crate) warmup: f64,

    /// Seconds a reply may take; later replies are counted late and their requests lost. After
    /// the last request of a step, the step waits this long for replies still out
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_positive_seconds,
          allow_negative_numbers = true)]
    pub(crate) timeout: f64,

    /// A client's poll interval, for counting stale replies: an answer whose round trip took
    /// longer came after that client's next request would have gone out, and a client (ntpperf's
    /// too) rejects it [default: ntpperf's, whose min(rate/10, 16384) clients share the rate:
    /// 0.1 s up to 163,840 requests/s, 16384/rate s above]
    #[arg(long = "client-interval", value_name = "SECS", value_parser = parse_positive_seconds,
          allow_negative_numbers = true)]
    pub(crate) client_interval: Option<f64>,

    /// Stop stepping after a step whose loss is above this percentage
    #[arg(long = "max-loss", value_name = "PCT", default_value = "10", value_parser = parse_percent,
          allow_negative_numbers = true)]
    pub(crate) max_loss: f64,

    /// End with a verdict: PASS if every step kept lost and stale replies within --max-loss (and
    /// its p99 round trip within --max-p99), else FAIL and exit status 1
    #[arg(long)]
    pub(crate) verdict: bool,

    /// With --verdict (which it turns on): the highest p99 round trip a step may have, in
    /// milliseconds
    #[arg(long = "max-p99", value_name = "MS", value_parser = parse_milliseconds,
          allow_negative_numbers = true)]
    pub(crate) max_p99: Option<f64>,

    /// Sending threads; each also receives the replies to its own requests
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_threads)]
    pub(crate) threads: usize,

    /// Source sockets (source ports), shared out among the threads, so that SO_REUSEPORT spreads
    /// the load over the server's threads
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = parse_sockets)]
    pub(crate) sockets: usize,

    /// Most requests per sendmmsg. Requests go out when they are due, so batches are this large
    /// only when the rate (or falling behind) calls for it
    #[arg(long = "batch-size", value_name = "N", default_value_t = 32, value_parser = parse_batch)]
    pub(crate) batch_size: usize,

    /// Report the CPU time this process (the server, on this host) spends per answered request,
    /// read from /proc/PID/stat and /proc/PID/task/*/stat before and after each step
    #[arg(long = "server-pid", value_name = "PID", value_parser = parse_pid)]
    pub(crate) server_pid: Option<u32>,

    /// Write one CSV row per step to this file
    #[arg(long, value_name = "FILE")]
    pub(crate) csv: Option<PathBuf>,

    /// Write the settings and every step's results as one JSON object to this file
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Draw answered rate against offered rate, and latency percentiles per step, as SVG
    #[arg(long, value_name = "FILE.svg", value_parser = parse_svg_path)]
    pub(crate) plot: Option<PathBuf>,
}

impl LoadArgs {
    /// The server to load. Each protocol's flags make `--target` required (or, for NTS, filled in
    /// from NTS-KE) before the run starts.
    pub(crate) fn target(&self) -> SocketAddr {
        self.target
            .unwrap_or_else(|| usage("--target ADDR:PORT is required").exit())
    }
}

/// `--steps START:FACTOR:COUNT`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Steps {
    pub(crate) start: f64,
    pub(crate) factor: f64,
    pub(crate) count: u32,
}

/// What to run, derived from the flags once they have been checked together.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Offered rates, one per step, requests per second over all threads.
    pub(crate) rates: Vec<f64>,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) timeout: Duration,
    /// In-flight slots per thread, a power of two.
    pub(crate) inflight_slots: usize,
    /// `--client-interval`; `None`: ntpperf's, which depends on the rate.
    pub(crate) client_interval: Option<Duration>,
}

impl Plan {
    /// The client poll interval at `rate` requests per second, beyond which a reply is stale.
    pub(crate) fn client_interval(&self, rate: f64) -> Duration {
        self.client_interval.unwrap_or_else(|| {
            // ntpperf: min(rate / 10, 16384) clients, each sending rate / clients per second.
            let clients = (rate / 10.0).clamp(1.0, NTPPERF_MAX_CLIENTS);
            Duration::from_secs_f64(clients / rate)
        })
    }
}

/// ntpperf's most simulated clients.
const NTPPERF_MAX_CLIENTS: f64 = 16384.0;

impl LoadArgs {
    /// Checks the flags that depend on each other and works out the steps. A bad combination
    /// is reported like a bad flag: one line naming the flags, exit 2.
    pub(crate) fn plan(&self) -> Result<Plan, clap::Error> {
        let rates = rates(self.rate, self.steps)?;
        if rates[0] * self.duration < 1.0 {
            return Err(usage(format!(
                "--duration {} s at {} requests/s sends no request: make the step longer",
                self.duration, rates[0]
            )));
        }
        if self.sockets < self.threads {
            return Err(usage(format!(
                "--sockets {} is fewer than --threads {}: every thread needs its own sockets",
                self.sockets, self.threads
            )));
        }
        Plan::new(
            rates,
            (self.duration, self.warmup, self.timeout),
            self.client_interval,
            self.threads,
            self.batch_size,
        )
    }
}

/// The steps' rates, from `--rate` or `--steps`.
pub(crate) fn rates(rate: Option<f64>, steps: Option<Steps>) -> Result<Vec<f64>, clap::Error> {
    match (rate, steps) {
        (Some(rate), _) => Ok(vec![rate]),
        (None, Some(s)) => Ok((0..s.count)
            .map(|i| s.start * s.factor.powi(i as i32))
            .collect()),
        // clap's group makes one of the two required.
        (None, None) => Err(usage("one of --rate and --steps is required")),
    }
}

impl Plan {
    /// The plan for `rates`, with each step's (duration, warm-up, timeout) in seconds, sent by
    /// `threads` threads in batches of up to `batch`: the in-flight table must hold the requests
    /// of a timeout.
    pub(crate) fn new(
        rates: Vec<f64>,
        (duration, warmup, timeout): (f64, f64, f64),
        client_interval: Option<f64>,
        threads: usize,
        batch: usize,
    ) -> Result<Self, clap::Error> {
        let max_rate = rates.iter().copied().fold(0.0, f64::max);
        let per_thread = max_rate / threads as f64;
        let slots = inflight_slots(per_thread, timeout, batch);
        if slots > MAX_INFLIGHT_SLOTS {
            return Err(usage(format!(
                "--timeout {timeout} s at {max_rate:.0} requests/s per {threads} thread(s) keeps \
                 too many requests in flight: shorten --timeout or add --threads"
            )));
        }
        Ok(Self {
            rates,
            duration: Duration::from_secs_f64(duration),
            warmup: Duration::from_secs_f64(warmup),
            timeout: Duration::from_secs_f64(timeout),
            inflight_slots: slots,
            client_interval: client_interval.map(Duration::from_secs_f64),
        })
    }
}

/// A usage error found after parsing, reported the way clap reports a bad flag (exit 2).
pub(crate) fn usage(msg: impl std::fmt::Display) -> clap::Error {
    clap::Error::raw(ErrorKind::ValueValidation, format!("{msg}\n"))
}

/// In-flight slots for one thread: a slot is reused only after twice the timeout's worth of
/// requests has been sent, so any reply that can still be on time finds its request's slot.
fn inflight_slots(rate_per_thread: f64, timeout: f64, batch: usize) -> usize {
    let needed = (rate_per_thread * timeout * 2.0).ceil() + 4.0 * batch as f64;
    if needed >= MAX_INFLIGHT_SLOTS as f64 * 2.0 {
        return usize::MAX;
    }
    (needed as usize).next_power_of_two().max(4096)
}

fn parse_target(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if s.parse::<IpAddr>().is_ok() || !s.contains(':') {
        return Err("no port: give ADDR:PORT, e.g. 127.0.0.1:123".into());
    }
    match s.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{s} resolves to no address")),
        Err(e) => Err(format!("cannot resolve: {e}")),
    }
}

pub(super) fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of requests per second"))?;
    check_rate(rate)?;
    Ok(rate)
}

fn check_rate(rate: f64) -> Result<(), String> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err("the rate must be more than 0 requests per second".into());
    }
    if rate > MAX_RATE {
        return Err(format!(
            "{rate} requests per second is more than the limit of {MAX_RATE:.0}"
        ));
    }
    Ok(())
}

pub(super) fn parse_steps(s: &str) -> Result<Steps, String> {
    const FORM: &str = "expected START:FACTOR:COUNT, e.g. 20000:1.5:5";
    let parts: Vec<&str> = s.split(':').collect();
    let [start, factor, count] = parts[..] else {
        return Err(FORM.into());
    };
    let start: f64 = start
        .parse()
        .map_err(|_| format!("START '{start}' is not a number ({FORM})"))?;
    check_rate(start).map_err(|e| format!("START: {e}"))?;
    let factor: f64 = factor
        .parse()
        .map_err(|_| format!("FACTOR '{factor}' is not a number ({FORM})"))?;
    if !(factor.is_finite() && factor >= 1.0) {
        return Err(format!("FACTOR {factor} must be 1 or more"));
    }
    let count: u32 = count
        .parse()
        .map_err(|_| format!("COUNT '{count}' is not a whole number ({FORM})"))?;
    if !(1..=MAX_STEPS).contains(&count) {
        return Err(format!("COUNT {count} is outside 1..={MAX_STEPS}"));
    }
    let last = start * factor.powi(count as i32 - 1);
    check_rate(last).map_err(|e| format!("the last step: {e}"))?;
    Ok(Steps {
        start,
        factor,
        count,
    })
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(v.is_finite() && (0.0..=MAX_SECONDS).contains(&v)) {
        return Err(format!("{v} seconds is outside 0..={MAX_SECONDS}"));
    }
    Ok(v)
}

pub(super) fn parse_positive_seconds(s: &str) -> Result<f64, String> {
    let v = parse_seconds(s)?;
    // Below a millisecond a step holds no meaningful number of requests and a timeout no reply.
    if v < 0.001 {
        return Err(format!("{v} seconds is less than the minimum of 0.001"));
    }
    Ok(v)
}

fn parse_milliseconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of milliseconds"))?;
    if !(v.is_finite() && v > 0.0 && v <= MAX_SECONDS * 1e3) {
        return Err(format!("{v} ms is outside (0, {}]", MAX_SECONDS * 1e3));
    }
    Ok(v)
}

pub(super) fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage"))?;
    if !(v.is_finite() && (0.0..=100.0).contains(&v)) {
        return Err(format!("{v} is outside 0..=100"));
    }
    Ok(v)
}

fn parse_count(s: &str, what: &str, max: usize) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of {what}"))?;
    if !(1..=max).contains(&n) {
        return Err(format!("{n} {what} is outside 1..={max}"));
    }
    Ok(n)
}

fn parse_threads(s: &str) -> Result<usize, String> {
    parse_count(s, "threads", MAX_THREADS)
}

fn parse_sockets(s: &str) -> Result<usize, String> {
    parse_count(s, "sockets", MAX_SOCKETS)
}

fn parse_batch(s: &str) -> Result<usize, String> {
    parse_count(s, "requests per batch", 1024)
}

pub(super) fn parse_pid(s: &str) -> Result<u32, String> {
    let pid: u32 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a process ID"))?;
    let stat = format!("/proc/{pid}/stat");
    if let Err(e) = std::fs::metadata(&stat) {
        return Err(format!("no process {pid} ({stat}: {e})"));
    }
    Ok(pid)
}

fn parse_svg_path(s: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(s);
    if !path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"))
    {
        return Err("the plot is drawn as SVG: name the file FILE.svg".into());
    }
    Ok(path)
}

/// The flags of `chime perf ntp` that turn it to NTS.
#[derive(Debug, clap::Args)]
pub(crate) struct NtsArgs {
    /// Authenticate every request with NTS: run NTS-KE with this server (HOST[:PORT], port 4460
    /// by default) first, then load the NTP server it names (or --target)
    #[arg(long, value_name = "HOST[:PORT]")]
    pub(crate) nts: Option<String>,

    /// With --nts: trust the certificates in this PEM file [default: the system's store]
    #[arg(long = "nts-ca", value_name = "FILE", requires = "nts")]
    pub(crate) nts_ca: Option<PathBuf>,

    /// With --nts: the AEAD algorithms to offer, in order of preference: 15 (siv-cmac-256), 17
    /// (siv-cmac-512) or 30 (gcm-siv), comma-separated
    #[arg(long = "nts-aead", value_name = "LIST", default_value = "15", requires = "nts",
          value_parser = crate::nts::parse_aeads)]
    pub(crate) nts_aead: crate::nts::AeadList,

    /// With --nts: NTS-KE sessions made before the run and shared out among the threads, each
    /// holding up to eight cookies
    #[arg(long = "nts-sessions", value_name = "N", default_value_t = 256, requires = "nts",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) nts_sessions: u32,

    /// With --nts: cookie placeholders in every request [default: as many as the session is
    /// short of eight cookies, as clients send them]
    #[arg(long = "nts-placeholders", value_name = "N", requires = "nts",
          value_parser = clap::value_parser!(u8).range(0..=7))]
    pub(crate) nts_placeholders: Option<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_and_multiply() {
        let s = parse_steps("20000:1.5:5").unwrap();
        assert_eq!(
            s,
            Steps {
                start: 20000.0,
                factor: 1.5,
                count: 5
            }
        );
        for bad in [
            "20000:1.5",
            "20000:1.5:5:1",
            "x:1.5:5",
            "0:1.5:5",
            "1000:0.5:5",
            "1000:2:0",
            "1000:2:1.5",
            "1000:10:10",
            "",
        ] {
            assert!(parse_steps(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_and_targets() {
        assert_eq!(parse_rate("2000").unwrap(), 2000.0);
        assert_eq!(parse_rate("1e5").unwrap(), 100_000.0);
        for bad in ["0", "-5", "nan", "inf", "many", "1e9"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_target("127.0.0.1:123").unwrap(),
            "127.0.0.1:123".parse().unwrap()
        );
        assert_eq!(parse_target("[::1]:5").unwrap().port(), 5);
        assert_eq!(parse_target("localhost:5123").unwrap().port(), 5123);
        assert!(parse_target("127.0.0.1").unwrap_err().contains("no port"));
    }

    #[test]
    fn inflight_table_covers_twice_the_timeout() {
        assert_eq!(inflight_slots(10.0, 1.0, 32), 4096);
        let n = inflight_slots(300_000.0, 1.0, 32);
        assert!(n.is_power_of_two() && n >= 600_000, "{n}");
        assert_eq!(inflight_slots(1e7, 3600.0, 32), usize::MAX);
    }

    #[test]
    fn the_client_interval_is_ntpperfs_unless_given() {
        let plan = |interval| Plan {
            rates: vec![1000.0],
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            timeout: Duration::from_secs(1),
            inflight_slots: 4096,
            client_interval: interval,
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // ntpperf: rate / 10 clients up to 16384, so 100 ms until 163,840/s, then shorter.
        assert!((ms(plan(None).client_interval(50_000.0)) - 100.0).abs() < 1e-9);
        assert!((ms(plan(None).client_interval(163_840.0)) - 100.0).abs() < 1e-9);
        let at_650k = ms(plan(None).client_interval(650_000.0));
        assert!((at_650k - 25.206).abs() < 1e-3, "{at_650k}");
        // At least one client, however low the rate.
        assert!((ms(plan(None).client_interval(2.0)) - 500.0).abs() < 1e-9);
        let fixed = Some(Duration::from_millis(64));
        assert_eq!(
            plan(fixed).client_interval(650_000.0),
            Duration::from_millis(64)
        );
    }
}
