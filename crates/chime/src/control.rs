//! `chime status` and `chime clients`: what chimed answers on its control socket
//! (`chimed --control-socket`), as `chronyc serverstats`, `tracking` and `clients` show chronyd's.
//! One line of JSON asked, one line of JSON back; `--json` prints it as it came, and otherwise it
//! is laid out for a person. `chime status` exits 2 when chimed says it is unhealthy, so that a
//! monitoring script needs nothing more than the exit code.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::out::outln;

/// Where chimed makes its control socket unless told otherwise.
const DEFAULT_SOCKET: &str = "/run/chimed/chimed.sock";
/// The longest answer read: a `clients` answer of the most clients is well under it.
const MAX_ANSWER: u64 = 64 << 20;
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// chimed's control socket
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print chimed's answer as JSON, as it came
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ClientsArgs {
    /// chimed's control socket
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// How many of the busiest clients to show
    #[arg(long, value_name = "N", default_value_t = 20)]
    top: usize,
    /// Print chimed's answer as JSON, as it came
    #[arg(long)]
    json: bool,
}

/// Asks chimed on `socket` one question and reads its answer; an `error` answer is an error.
fn ask(socket: &Path, question: &Value) -> Result<Value> {
    let shown = socket.display();
    let mut stream = UnixStream::connect(socket).with_context(|| {
        format!("{shown}: cannot connect (is chimed running, with --control-socket here, and are you root or in its group?)")
    })?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut line = serde_json::to_vec(question)?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .with_context(|| format!("{shown}: cannot send"))?;
    let mut answer = Vec::new();
    BufReader::new(stream.take(MAX_ANSWER))
        .read_until(b'\n', &mut answer)
        .with_context(|| format!("{shown}: no answer"))?;
    let value: Value = serde_json::from_slice(&answer)
        .with_context(|| format!("{shown}: an answer that is not JSON"))?;
    if let Some(why) = value.get("error").and_then(Value::as_str) {
        bail!("chimed: {why}");
    }
    Ok(value)
}

/// `chime status`: 0 when chimed is healthy, 2 when it says it is not, 1 when it cannot be asked.
pub(crate) fn run_status(args: &StatusArgs) -> Result<ExitCode> {
    let status = ask(&args.socket, &json!({ "command": "status" }))?;
    if args.json {
        outln!("{status}");
    } else {
        print_status(&status);
    }
    Ok(if status["healthy"] == true {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// `chime clients`.
pub(crate) fn run_clients(args: &ClientsArgs) -> Result<()> {
    let question = json!({ "command": "clients", "top": args.top });
    let clients = ask(&args.socket, &question)?;
    if args.json {
        outln!("{clients}");
        return Ok(());
    }
    print_clients(&clients);
    Ok(())
}

fn print_status(s: &Value) {
    let healthy = if s["healthy"] == true {
        "healthy"
    } else {
        "UNHEALTHY"
    };
    outln!("chimed {}: {healthy}", text(&s["version"]));
    print_upstream(&s["upstream"]);
    print_workers("NTP", &s["ntp"]);
    if let Some(ke) = s.get("nts_ke") {
        outln!(
            "NTS-KE         sessions {} agreed, {} refused, {} failed; {} rate-limited, {} \
             denied, {} over the per-address limit; certificate valid until {}",
            ke["agreed"],
            ke["refused"],
            ke["failed"],
            ke["rate_limited"],
            ke["denied"],
            ke["address_limited"],
            unix_time(&ke["certificate_not_after"])
        );
    }
    if let Some(k) = s.get("nts_cookie_keys") {
        outln!(
            "Cookie keys    current {}, {} earlier kept (of {}), rotated every {} s: a cookie \
             opens for up to {:.1} days{}",
            text(&k["current_id"]),
            k["kept"],
            k["kept_setting"],
            k["rotation_seconds"],
            k["cookie_life_seconds"].as_f64().unwrap_or(0.0) / 86_400.0,
            if k["fleet"] == true {
                " (fleet keys)"
            } else {
                ""
            }
        );
    }
    if let Some(rt) = s.get("roughtime") {
        print_workers("Roughtime", &rt["workers"]);
        outln!(
            "  online key   valid {} to {}{}",
            unix_time(&rt["online_key_not_before"]),
            unix_time(&rt["online_key_not_after"]),
            match rt["delegation_end"].as_i64() {
                Some(_) => format!("; delegations until {}", unix_time(&rt["delegation_end"])),
                None => String::new(),
            }
        );
    }
    if let Some(tcp) = s.get("roughtime_tcp") {
        print_workers("Roughtime TCP", tcp);
    }
    for (label, key) in [("Problem", "problems"), ("Warning", "warnings")] {
        for line in s[key].as_array().into_iter().flatten() {
            outln!("{label}: {}", text(line));
        }
    }
}

fn print_upstream(u: &Value) {
    let synced = if u["synchronised"] == true {
        "synchronised"
    } else {
        "unsynchronised"
    };
    outln!(
        "Upstream       {}, {synced}, stratum {}, reference {}",
        text(&u["address"]),
        u["stratum"],
        text(&u["reference_id"])
    );
    outln!(
        "  last reply   {} ago; root delay {} s, root dispersion {} s",
        seconds(&u["last_reply_age_seconds"]),
        fixed(&u["root_delay_seconds"]),
        fixed(&u["root_dispersion_seconds"])
    );
    let served = &u["served"];
    let leap = ["none", "insert", "delete", "unsynchronised"];
    outln!(
        "  served       {}, stratum {}, root distance {} s, leap {}",
        if served["synchronised"] == true {
            "synchronised"
        } else {
            "UNSYNCHRONISED"
        },
        served["stratum"],
        fixed(&served["root_distance_seconds"]),
        leap[served["leap"].as_u64().unwrap_or(3).min(3) as usize]
    );
    outln!(
        "  offset       {:+.6} s from the system clock, within {} s, moving {:+.3} ppm",
        u["offset_seconds"].as_f64().unwrap_or(0.0),
        fixed(&u["offset_error_seconds"]),
        u["offset_rate"].as_f64().unwrap_or(0.0) * 1e6
    );
    if let Some(left) = u["leap_pending_seconds"].as_f64() {
        outln!("  leap second  over in {left:.0} s");
    }
}

/// A service's worker counts: the totals, then the drop reasons and replies of note that are
/// not zero.
fn print_workers(name: &str, w: &Value) {
    outln!(
        "{name:<14} received {}, answered {}, dropped {}, shed {}, kernel drops {}",
        w["received"],
        w["answered"],
        w["dropped"],
        w["shed"],
        w["kernel_drops"]
    );
    for (label, key) in [
        ("  dropped for", "dropped_by_reason"),
        ("  replies", "replies"),
    ] {
        let nonzero: Vec<String> = (w[key].as_object().into_iter().flatten())
            .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        if !nonzero.is_empty() {
            outln!("{label:<14} {}", nonzero.join(", "));
        }
    }
}

fn print_clients(c: &Value) {
    let distinct = &c["distinct"];
    outln!(
        "Distinct clients (estimated): {} in the last hour, {} in the last day",
        distinct["last_hour"],
        distinct["last_day"]
    );
    outln!(
        "{:<40} {:>10} {:>8} {:>8} {:>6} {:>9} {:>10}",
        "Address (IPv6 by /64)",
        "Requests",
        "Dropped",
        "Limited",
        "KoD",
        "Interval",
        "Last seen"
    );
    for client in c["clients"].as_array().into_iter().flatten() {
        let interval = client["interval_seconds"]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |s| format!("{s:.1} s"));
        // A JSON value's Display ignores widths: the counts as numbers, so that they line up.
        let count = |key: &str| client[key].as_u64().unwrap_or(0);
        outln!(
            "{:<40} {:>10} {:>8} {:>8} {:>6} {:>9} {:>8.1} s",
            text(&client["address"]),
            count("requests"),
            count("dropped"),
            count("rate_limited"),
            count("kod"),
            interval,
            client["last_seen_seconds_ago"].as_f64().unwrap_or(0.0)
        );
    }
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn fixed(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_owned(), |s| format!("{s:.6}"))
}

fn seconds(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "never".to_owned(), |s| format!("{s:.1} s"))
}

/// Unix seconds as an RFC 3339 time.
fn unix_time(v: &Value) -> String {
    v.as_i64()
        .and_then(|t| jiff::Timestamp::from_second(t).ok())
        .map_or_else(|| "unknown".to_owned(), |t| t.to_string())
}
