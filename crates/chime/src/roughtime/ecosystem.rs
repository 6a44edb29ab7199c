//! `chime roughtime --servers FILE`: a measurement as RFC 10049 §8 has a client make one. The
//! servers come from a list (§8.3's JSON), at least three are chosen at random and asked in
//! sequence, then the same sequence again, each nonce chained to the reply before, so that no
//! server can choose its place; a server that does not answer (or answers what does not verify)
//! is named and another from the list takes its place while any remain. The replies are then
//! checked against each other: servers that contradict each other are named, and the chain is the
//! malfeasance report that proves it (`--report`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use chime_roughtime::{
    Chain, ListedServer, MIN_SERVERS, ServerList, Transport, Verified, VerifyPolicy, Version,
    accusations, choose, verify_chain,
};
use serde::Serialize;

use super::{exchange, exchange_tcp, rfc3339};
use crate::out::outln;

/// What the measurement asks for: the list's file, how many servers, and how.
pub(crate) struct Measure<'a> {
    pub(crate) file: &'a Path,
    pub(crate) count: usize,
    pub(crate) versions: Vec<Version>,
    pub(crate) timeout: Duration,
    pub(crate) policy: VerifyPolicy,
    pub(crate) report: Option<&'a Path>,
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
struct Answered {
    server: String,
    address: String,
    midpoint_unix_us: u64,
    radius_us: u64,
}

#[derive(Debug, Serialize)]
struct Outcome {
    answered: Vec<Answered>,
    dead: Vec<String>,
    consistent: bool,
    contradictions: Vec<String>,
    enough: bool,
}

/// Runs the measurement: 0 when enough servers answered and none contradicted another.
pub(crate) fn run(m: &Measure<'_>) -> Result<()> {
    let shown = m.file.display();
    let text = std::fs::read_to_string(m.file).with_context(|| format!("--servers {shown}"))?;
    let list = ServerList::parse(&text).map_err(|e| anyhow!("--servers {shown}: {e}"))?;
    let plan = choose(&list, m.count.max(MIN_SERVERS), rand::random::<u64>);
    let mut chain = Chain::new(&list, plan, &m.versions, m.policy, rand::random::<u64>)
        .map_err(|e| anyhow!("cannot build a request for these versions: {e}"))?;
    let mut answered = Vec::new();
    while let Some(query) = chain.next_query() {
        let listed = query.listed();
        match ask(listed, query.request(), m.timeout) {
            Ok((reply, address)) => match query.answer(&reply) {
                Ok(v) => answered.push(said(listed, address, &v, m.json)),
                Err(e) => say(
                    m.json,
                    &format!("{}: reply does not verify ({e}); skipped", listed.name),
                ),
            },
            Err(e) => {
                query.no_answer();
                say(m.json, &format!("{}: {e:#}; skipped", listed.name));
            }
        }
    }
    let links = chain.links();
    let report = verify_chain(&links, &m.policy).map_err(|e| anyhow!("chain: {e}"))?;
    if let Some(path) = m.report {
        super::write_links(path, &links)?;
    }
    let outcome = Outcome {
        answered,
        dead: chain.dead().iter().map(|s| (*s).to_owned()).collect(),
        consistent: report.contradictions.is_empty(),
        contradictions: accusations(&list, &chain.link_servers(), &report)
            .iter()
            .map(ToString::to_string)
            .collect(),
        enough: chain.has_enough(),
    };
    print(&outcome, m.json)?;
    if !outcome.consistent {
        bail!("servers contradict each other; the chain is the proof (--report FILE keeps it)");
    }
    if !outcome.enough {
        bail!(
            "only {} servers answered every query; at least {} are needed (RFC 10049 §8.1)",
            chain.answered(),
            MIN_SERVERS.min(list.servers.len())
        );
    }
    Ok(())
}

/// Asks `server` at each of its addresses in turn until one answers: the reply and where from.
fn ask(server: &ListedServer, request: &[u8], timeout: Duration) -> Result<(Vec<u8>, String)> {
    let mut last = anyhow!("no address");
    for a in &server.addresses {
        let attempt = resolve(&a.address).and_then(|addr| match a.transport {
            Transport::Udp => exchange(addr, request, timeout),
            Transport::Tcp => exchange_tcp(addr, request, timeout),
        });
        match attempt {
            Ok((reply, ..)) => {
                let proto = if a.transport == Transport::Udp {
                    "udp"
                } else {
                    "tcp"
                };
                return Ok((reply, format!("{proto}:{}", a.address)));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn resolve(address: &str) -> Result<SocketAddr> {
    address
        .to_socket_addrs()
        .with_context(|| format!("{address}: cannot resolve"))?
        .next()
        .ok_or_else(|| anyhow!("{address}: no address"))
}

/// A verified reply, said as it comes (for a person) and kept for the outcome.
fn said(server: &ListedServer, address: String, v: &Verified, json: bool) -> Answered {
    let a = Answered {
        server: server.name.clone(),
        address,
        midpoint_unix_us: v.midpoint_unix_us,
        radius_us: v.radius_us,
    };
    say(
        json,
        &format!(
            "{} ({}): {} ± {:.6} s",
            a.server,
            a.address,
            rfc3339(a.midpoint_unix_us),
            a.radius_us as f64 / 1e6
        ),
    );
    a
}

/// A line for a person; with `--json` the outcome alone is printed.
fn say(json: bool, line: &str) {
    if !json {
        outln!("{line}");
    }
}

fn print(o: &Outcome, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string(o)?);
        return Ok(());
    }
    if !o.dead.is_empty() {
        outln!("Did not answer: {}", o.dead.join(", "));
    }
    for c in &o.contradictions {
        outln!("CONTRADICTION: {c}");
    }
    if o.consistent {
        outln!(
            "Chain: {} replies, all signed, no server contradicted another",
            o.answered.len()
        );
    }
    Ok(())
}
