//! The control socket (`--control-socket`): where `chime status` and `chime clients` ask chimed
//! what `chronyc serverstats`, `tracking` and `clients` ask chronyd. A Unix stream socket, made
//! before privileges are dropped (see [`listen`]), read-only: nothing asked on it changes anything.
//!
//! One question per connection: one line of JSON of at most [`MAX_REQUEST`] bytes, within
//! [`READ_TIMEOUT`], `{"command":"status"}` or `{"command":"clients","top":N}`; one line of JSON
//! back, then the connection is closed. A request that is not one of those (garbage, too long, cut
//! off) gets `{"error":"..."}` saying what was wrong, and changes nothing. At most
//! [`MAX_CONNECTIONS`] are answered at once; more are closed at once.
//!
//! Like the metrics endpoint it never touches the data plane: it reads what the workers publish
//! and the services' shared state, each through a [`Section`] the daemon registered, so that this
//! module knows no service.

pub(crate) mod listen;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

use crate::service::ServiceError;

/// The longest request line, its newline included.
pub(crate) const MAX_REQUEST: usize = 1024;
/// How long a client may take to send its request.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_CONNECTIONS: usize = 8;
/// The most clients one `clients` request may ask for.
pub(crate) const MAX_TOP: usize = 10_000;

/// What `status` found wrong: problems make chimed unhealthy (`chime status` exits non-zero),
/// warnings are for the operator to read.
#[derive(Debug, Default)]
pub(crate) struct Health {
    pub(crate) problems: Vec<String>,
    pub(crate) warnings: Vec<String>,
}

/// One part of the `status` answer, read afresh at each request; it notes in [`Health`] what it
/// finds wrong.
pub(crate) type Section = Box<dyn Fn(&mut Health) -> Value + Send + Sync>;

/// The busiest `top` clients, and the distinct ones: the `clients` answer.
pub(crate) type Clients = Box<dyn Fn(usize) -> Value + Send + Sync>;

/// What the socket answers, filled in by the daemon as the services start.
#[derive(Default)]
pub(crate) struct Registry {
    sections: Vec<(&'static str, Section)>,
    clients: Option<Clients>,
    /// Questions answered, and requests refused as malformed, since start.
    answered: AtomicU64,
    refused: AtomicU64,
}

impl Registry {
    /// A part of `status` under `name`.
    pub(crate) fn section(
        &mut self,
        name: &'static str,
        report: impl Fn(&mut Health) -> Value + Send + Sync + 'static,
    ) {
        self.sections.push((name, Box::new(report)));
    }

    /// What answers `clients`; without it `clients` is an error saying the log is off.
    pub(crate) fn clients(&mut self, top: impl Fn(usize) -> Value + Send + Sync + 'static) {
        self.clients = Some(Box::new(top));
    }

    /// The `status` answer: every section, and whether chimed is healthy.
    pub(crate) fn status(&self) -> Value {
        let mut health = Health::default();
        let mut out = Map::new();
        out.insert("version".into(), env!("CARGO_PKG_VERSION").into());
        for (name, report) in &self.sections {
            out.insert((*name).into(), report(&mut health));
        }
        out.insert(
            "control".into(),
            json!({
                "answered": self.answered.load(Relaxed),
                "refused": self.refused.load(Relaxed),
            }),
        );
        out.insert("healthy".into(), health.problems.is_empty().into());
        out.insert("problems".into(), health.problems.into());
        out.insert("warnings".into(), health.warnings.into());
        Value::Object(out)
    }

    /// The answer to one request line (without its newline), counted.
    pub(crate) fn answer(&self, line: &[u8]) -> Value {
        let request = serde_json::from_slice::<Request>(line).map(|r| (r.command, r.top));
        let answer = match request {
            Ok((Command::Status, None)) => Ok(self.status()),
            Ok((Command::Status, Some(_))) => Err("top is for clients, not status".to_owned()),
            Ok((Command::Clients, Some(top))) if top > MAX_TOP => {
                Err(format!("top {top} is more than {MAX_TOP}"))
            }
            Ok((Command::Clients, top)) => match &self.clients {
                Some(clients) => Ok(clients(top.unwrap_or(DEFAULT_TOP))),
                None => Err("the client log is off (--client-log 0)".to_owned()),
            },
            Err(e) => Err(format!(
                "not a request ({e}): send {{\"command\":\"status\"}} or \
                 {{\"command\":\"clients\",\"top\":N}}"
            )),
        };
        match answer {
            Ok(value) => {
                self.answered.fetch_add(1, Relaxed);
                value
            }
            Err(why) => {
                self.refused.fetch_add(1, Relaxed);
                json!({ "error": why })
            }
        }
    }
}

/// A question, as its one line of JSON names it: nothing else is taken.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    command: Command,
    /// For `clients`: how many.
    top: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Command {
    Status,
    Clients,
}

/// The clients a `clients` request without `top` gets.
const DEFAULT_TOP: usize = 20;

/// Answers questions on `listener` (bound before privileges were dropped) until aborted.
pub(crate) async fn serve(
    listener: std::os::unix::net::UnixListener,
    registry: Registry,
) -> Result<(), ServiceError> {
    fail::fail_point!("control", |_| Err(crate::service::fail_point_error(
        "control"
    )));
    let listener = listener
        .set_nonblocking(true)
        .and_then(|()| UnixListener::from_std(listener))
        .map_err(|e| ServiceError::Failed(format!("cannot listen: {e}")))?;
    let registry = Arc::new(registry);
    crate::service::serve_connections("control", MAX_CONNECTIONS, listener, |stream| {
        let registry = registry.clone();
        async move {
            // A client that goes away, or reads too slowly, is its own business.
            let _ = tokio::time::timeout(2 * READ_TIMEOUT, exchange(stream, &registry)).await;
        }
    })
    .await
}

/// One connection: its request line, within the time and length allowed, and the answer.
async fn exchange(stream: tokio::net::UnixStream, registry: &Registry) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::with_capacity(256);
    let mut reader = BufReader::new(read).take(MAX_REQUEST as u64);
    let read = tokio::time::timeout(READ_TIMEOUT, reader.read_until(b'\n', &mut line)).await;
    let answer = match read {
        Err(_) => refuse(registry, "no complete request line within 2 s"),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(_)) if line.last() != Some(&b'\n') && line.len() >= MAX_REQUEST => {
            refuse(registry, "request longer than 1024 bytes")
        }
        Ok(Ok(_)) if line.last() != Some(&b'\n') => {
            refuse(registry, "request cut off before its newline")
        }
        Ok(Ok(_)) => registry.answer(&line[..line.len() - 1]),
    };
    let mut text = serde_json::to_vec(&answer)?;
    text.push(b'\n');
    write.write_all(&text).await?;
    write.shutdown().await
}

fn refuse(registry: &Registry, why: &str) -> Value {
    registry.refused.fetch_add(1, Relaxed);
    json!({ "error": why })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        let mut r = Registry::default();
        r.section("ntp", |_| json!({ "received": 3 }));
        r.section("upstream", |h| {
            h.problems.push("upstream unsynchronised".into());
            json!({ "synchronised": false })
        });
        r
    }

    #[test]
    fn status_gathers_every_section_and_their_health() {
        let r = registry();
        let s = r.answer(br#"{"command":"status"}"#);
        assert_eq!(s["ntp"]["received"], 3);
        assert_eq!(s["healthy"], false);
        assert_eq!(s["problems"][0], "upstream unsynchronised");
        assert_eq!(s["control"]["answered"], 0, "counted after it is answered");
        assert_eq!(r.answered.load(Relaxed), 1);
    }

    #[test]
    fn a_request_that_is_not_one_gets_an_error_and_is_counted() {
        let r = registry();
        for bad in [
            &b"status"[..],
            b"{}",
            br#"{"command":"stop"}"#,
            br#"{"command":"status","extra":1}"#,
            br#"{"command":"clients","top":-1}"#,
            br#"{"command":"clients","top":100000}"#,
            br#"{"command":"clients"}"#,
            b"\xff\xfe",
        ] {
            let a = r.answer(bad);
            assert!(
                a["error"].is_string(),
                "{}: {a}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(r.refused.load(Relaxed), 8);
        assert_eq!(r.answered.load(Relaxed), 0);
    }
}
