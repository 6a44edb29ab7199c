//! `chime roughtime --servers FILE`: a measurement as RFC 10049 §8 has a client make one. The
//! servers come from a list (§8.3's JSON), at least three are chosen at random and asked in
//! sequence, then the same sequence again, each nonce chained to the reply before, so that no
//! server can choose its place; a server that does not answer (or answers what does not verify)
//! is named and another from the list takes its place while any remain. The replies are then
//! checked against each other: servers that contradict each other are named, and the chain is the
//! malfeasance report that proves it (`--report`), which `--upload` sends to the list's
//! collector.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use chime_roughtime::{
    Chain, ListedServer, MIN_SERVERS, ServerList, Transport, Verified, VerifyPolicy, Version,
    accusations, choose, suspects, verify_chain,
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
    /// Send the report to the list's `reports` URL when servers contradict each other.
    pub(crate) upload: bool,
    /// Offer `versions` to every server, whatever its entry names (`--version` was given).
    pub(crate) offer_to_all: bool,
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
    /// The servers named in every contradiction: with one liar among honest servers, the liar
    /// (and, from a single contradiction, the server it was caught by).
    suspects: Vec<String>,
    enough: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    uploaded: Option<Uploaded>,
}

/// What the list's collector answered to the report.
#[derive(Debug, Clone, Serialize)]
struct Uploaded {
    url: String,
    status: u16,
    answer: String,
}

/// Runs the measurement: 0 when enough servers answered and none contradicted another.
pub(crate) fn run(m: &Measure<'_>) -> Result<()> {
    let shown = m.file.display();
    let text = std::fs::read_to_string(m.file).with_context(|| format!("--servers {shown}"))?;
    let list = ServerList::parse(&text).map_err(|e| anyhow!("--servers {shown}: {e}"))?;
    // Refused before any query, as --report's existing file is.
    let collector = match (&list.reports, m.upload) {
        (None, true) => bail!("--upload: the server list {shown} names no \"reports\" URL"),
        (url, upload) => url.as_deref().filter(|_| upload),
    };
    let plan = choose(&list, m.count.max(MIN_SERVERS), rand::random::<u64>);
    let mut chain = Chain::new(&list, plan, &m.versions, m.policy, rand::random::<u64>)
        .map_err(|e| anyhow!("cannot build a request for these versions: {e}"))?;
    if m.offer_to_all {
        chain = chain.offering_only();
    }
    let answered = ask_every(&mut chain, m);
    let links = chain.links();
    let checked = verify_chain(&links, &m.policy).map_err(|e| anyhow!("chain: {e}"))?;
    let report = super::report_of(&links);
    if let Some(path) = m.report {
        super::write_report(path, &report)?;
    }
    let named = accusations(&list, &chain.link_servers(), &checked);
    let mut outcome = Outcome {
        answered,
        dead: chain.dead().iter().map(|s| (*s).to_owned()).collect(),
        consistent: named.is_empty(),
        contradictions: named.iter().map(ToString::to_string).collect(),
        suspects: suspects(&named).iter().map(|s| (*s).to_owned()).collect(),
        enough: chain.has_enough(),
        uploaded: None,
    };
    let sent = match collector {
        Some(url) if !outcome.consistent => Some(upload(url, &report, m.timeout)),
        _ => None,
    };
    if let Some(Ok(uploaded)) = &sent {
        outcome.uploaded = Some(uploaded.clone());
    }
    print(&outcome, m.json)?;
    if let Some(Err(e)) = sent {
        return Err(e.context("--upload: the report was not sent"));
    }
    if !outcome.consistent {
        bail!("servers contradict each other; the chain is the proof (--report FILE keeps it)");
    }
    if collector.is_some() {
        say(m.json, "Nothing sent: no server contradicted another");
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

/// Drives the chain to its end: asks each server it names and hands back the reply or its lack.
fn ask_every<R: FnMut() -> u64>(chain: &mut Chain<'_, R>, m: &Measure<'_>) -> Vec<Answered> {
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
    answered
}

/// Sends `report` to the collector at `url`, as RFC 10049 §8.4 registers it; any 2xx answer is
/// taken as received. TLS is checked against the system's roots.
fn upload(url: &str, report: &super::MalfeasanceReport, timeout: Duration) -> Result<Uploaded> {
    let mut roots = Vec::new();
    for cert in rustls_native_certs::load_native_certs().certs {
        roots.push(ureq::tls::Certificate::from_der(&cert).to_owned());
    }
    let tls = ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(ureq::tls::RootCerts::new_with_certs(&roots))
        .unversioned_rustls_crypto_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .build();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_global(Some(timeout.max(Duration::from_secs(10))))
        .http_status_as_error(false)
        .build()
        .into();
    let body = serde_json::to_vec(report)?;
    let mut response = agent
        .post(url)
        .content_type("application/roughtime-malfeasance+json")
        .send(&body[..])
        .with_context(|| format!("POST {url}"))?;
    let status = response.status().as_u16();
    let answer = response
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_string()
        .unwrap_or_default();
    let answer = answer.trim().chars().take(200).collect::<String>();
    if !response.status().is_success() {
        bail!("POST {url}: HTTP {status}: {answer}");
    }
    Ok(Uploaded {
        url: url.to_owned(),
        status,
        answer,
    })
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
    // The same two replies can contradict each other from more than one pair of places in the
    // chain; a person needs each once.
    let mut shown: Vec<(&str, usize)> = Vec::new();
    for c in &o.contradictions {
        match shown.iter_mut().find(|(line, _)| line == c) {
            Some((_, times)) => *times += 1,
            None => shown.push((c, 1)),
        }
    }
    for (line, times) in shown {
        match times {
            1 => outln!("CONTRADICTION: {line}"),
            n => outln!("CONTRADICTION: {line} ({n} times in the chain)"),
        }
    }
    if !o.suspects.is_empty() {
        outln!("In every contradiction: {}", o.suspects.join(", "));
    }
    if let Some(u) = &o.uploaded {
        outln!("Report sent to {}: HTTP {} {}", u.url, u.status, u.answer);
    }
    if o.consistent {
        outln!(
            "Chain: {} replies, all signed, no server contradicted another",
            o.answered.len()
        );
    }
    Ok(())
}
