//! The client's side of the Roughtime ecosystem (RFC 10049 §8): reading a server list, choosing
//! servers from it, and driving a measurement sequence across them that carries on past servers
//! that do not answer.
//!
//! This sits above [`verify_reply`] and [`verify_chain`](crate::verify_chain):
//! [`ServerList::parse`] reads the list a vendor ships (§8.3), [`choose`] picks the servers at
//! random (§8.2), a [`Chain`] says which server to ask next and with which request, and takes back
//! each reply or the lack of one; its [`Chain::links`] go to [`verify_chain`](crate::verify_chain),
//! and [`accusations`] names the servers behind each contradiction found. Like the rest of the
//! crate it does no IO: the caller sends the requests,
//! waits for replies as long as it likes, and supplies the random numbers.

use core::fmt;

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::chain::{ChainReport, Link, next_nonce};
use crate::client::{Verified, VerifyError, VerifyPolicy, verify_reply};
use crate::keys::{KEY_LEN, srv_value};
use crate::request::{BuildError, REQUEST_LEN, build_request};
use crate::version::Version;

/// The fewest servers a measurement needs (RFC 10049 §8.1: "a minimum of three of which are
/// operational and not run by the same parties").
pub const MIN_SERVERS: usize = 3;

/// A list of trusted servers in the format of RFC 10049 §8.3
/// (`application/roughtime-server+json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerList {
    /// The servers, in the list's order; the indices the rest of this module uses point here.
    pub servers: Vec<ListedServer>,
    /// Where updated lists may be fetched (`sources`), as written.
    pub sources: Vec<String>,
    /// Where malfeasance reports go (`reports`), as written.
    pub reports: Option<String>,
}

/// One server of a [`ServerList`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedServer {
    /// A name to show to a person; unique within the list.
    pub name: String,
    /// The version the list says the server speaks, as written; informative only, since the
    /// reply's VER is what counts.
    pub version: Option<ListedVersion>,
    /// The Ed25519 long-term public key.
    pub public_key: [u8; KEY_LEN],
    /// Where to reach the server, in the list's order; never empty.
    pub addresses: Vec<ServerAddress>,
}

/// A server's `version` as a list writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListedVersion {
    /// A number, as the RFC asks (e.g. `1`, or `2147483660` for 0x8000000c).
    Number(u64),
    /// A name, as Cloudflare's list writes it (e.g. `"IETF-Roughtime"`).
    Name(String),
}

/// One way to reach a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddress {
    /// UDP or TCP.
    pub transport: Transport,
    /// `host:port` as written (IPv6 hosts in brackets); not resolved here.
    pub address: String,
}

/// The transport an address is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// One datagram each way.
    Udp,
    /// Framed packets over a stream.
    Tcp,
}

/// A server in a list, as errors name it: its position and, once read, its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRef {
    /// Position in `servers`, from 0.
    pub index: usize,
    /// Its `name`, if it has a readable one.
    pub name: Option<String>,
}

impl fmt::Display for ServerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "server {} ({name:?})", self.index),
            None => write!(f, "server {}", self.index),
        }
    }
}

/// Why a server list was rejected: the first problem found, naming the server and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ListError {
    /// Not JSON, or not a JSON object.
    #[error("not a server list: {reason}")]
    Json {
        /// What the JSON reader said.
        reason: String,
    },
    /// A top-level field is missing or of the wrong type.
    #[error("server list: \"{field}\" must be {expected}")]
    List {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// `servers` is empty.
    #[error("server list: \"servers\" is empty")]
    NoServers,
    /// A server lacks a required field.
    #[error("{server}: missing \"{field}\"")]
    Missing {
        /// The server.
        server: ServerRef,
        /// The field.
        field: &'static str,
    },
    /// A server's field has the wrong JSON type.
    #[error("{server}: \"{field}\" must be {expected}")]
    WrongType {
        /// The server.
        server: ServerRef,
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A key type other than Ed25519.
    #[error("{server}: \"publicKeyType\" {found:?} is not supported (only \"ed25519\")")]
    KeyType {
        /// The server.
        server: ServerRef,
        /// The type written.
        found: String,
    },
    /// The key is not 32 bytes in base64 or hex.
    #[error("{server}: \"publicKey\" is not a 32-byte key in base64 or hex ({reason})")]
    Key {
        /// The server.
        server: ServerRef,
        /// What was wrong with it.
        reason: String,
    },
    /// `addresses` is empty, so the server cannot be reached.
    #[error("{server}: \"addresses\" is empty")]
    NoAddresses {
        /// The server.
        server: ServerRef,
    },
    /// An address for a transport other than UDP and TCP.
    #[error("{server}: address {index}: \"protocol\" {found:?} is neither \"udp\" nor \"tcp\"")]
    Protocol {
        /// The server.
        server: ServerRef,
        /// Position in `addresses`.
        index: usize,
        /// The protocol written.
        found: String,
    },
    /// An address that is not `host:port`.
    #[error("{server}: address {index}: {address:?} is not host:port")]
    Address {
        /// The server.
        server: ServerRef,
        /// Position in `addresses`.
        index: usize,
        /// The address written.
        address: String,
    },
    /// Two servers share a name, so reports naming one would be ambiguous.
    #[error("{server}: the name is already used by server {first}")]
    DuplicateName {
        /// The second server with the name.
        server: ServerRef,
        /// Position of the first.
        first: usize,
    },
}

impl ServerList {
    /// Reads a list, rejecting it at the first problem. Fields this crate does not know (such as
    /// descriptions) are ignored.
    pub fn parse(json: &str) -> Result<Self, ListError> {
        let value: Value = serde_json::from_str(json).map_err(|e| ListError::Json {
            reason: e.to_string(),
        })?;
        let Value::Object(top) = value else {
            return Err(ListError::Json {
                reason: "the top level is not an object".into(),
            });
        };
        let entries = match top.get("servers") {
            Some(Value::Array(entries)) => entries,
            _ => return Err(list_field("servers", "an array of servers")),
        };
        if entries.is_empty() {
            return Err(ListError::NoServers);
        }
        let mut servers: Vec<ListedServer> = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let server = parse_server(index, entry)?;
            if let Some(first) = servers.iter().position(|s| s.name == server.name) {
                return Err(ListError::DuplicateName {
                    server: ServerRef {
                        index,
                        name: Some(server.name),
                    },
                    first,
                });
            }
            servers.push(server);
        }
        let sources = match top.get("sources") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| list_field("sources", "an array of URL strings"))?,
            Some(_) => return Err(list_field("sources", "an array of URL strings")),
        };
        let reports = match top.get("reports") {
            None => None,
            Some(Value::String(url)) => Some(url.clone()),
            Some(_) => return Err(list_field("reports", "a URL string")),
        };
        Ok(Self {
            servers,
            sources,
            reports,
        })
    }

    /// The index of the server called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.name == name)
    }
}

fn list_field(field: &'static str, expected: &'static str) -> ListError {
    ListError::List { field, expected }
}

fn parse_server(index: usize, entry: &Value) -> Result<ListedServer, ListError> {
    let mut at = ServerRef { index, name: None };
    let Value::Object(fields) = entry else {
        return Err(ListError::WrongType {
            server: at,
            field: "servers",
            expected: "an object",
        });
    };
    let name = string_field(fields, "name", &at)?.to_owned();
    at.name = Some(name.clone());
    let version = match fields.get("version") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(ListedVersion::Name(name.clone())),
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64().map(ListedVersion::Number),
        Some(_) => {
            return Err(ListError::WrongType {
                server: at,
                field: "version",
                expected: "a non-negative integer or a string",
            });
        }
    };
    let key_type = string_field(fields, "publicKeyType", &at)?;
    if key_type != "ed25519" {
        return Err(ListError::KeyType {
            found: key_type.to_owned(),
            server: at,
        });
    }
    let public_key =
        decode_key(string_field(fields, "publicKey", &at)?).map_err(|reason| ListError::Key {
            server: at.clone(),
            reason,
        })?;
    let addresses = parse_addresses(fields, &at)?;
    Ok(ListedServer {
        name,
        version,
        public_key,
        addresses,
    })
}

fn string_field<'v>(
    fields: &'v Map<String, Value>,
    field: &'static str,
    at: &ServerRef,
) -> Result<&'v str, ListError> {
    match fields.get(field) {
        None => Err(ListError::Missing {
            server: at.clone(),
            field,
        }),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ListError::WrongType {
            server: at.clone(),
            field,
            expected: "a string",
        }),
    }
}

/// A key in hex (64 digits, as roughenough's lists write it) or standard base64 (as the RFC and
/// Cloudflare's list do). No 32-byte key is 64 characters of base64, so the two cannot be
/// confused.
fn decode_key(text: &str) -> Result<[u8; KEY_LEN], String> {
    let bytes = if text.len() == 2 * KEY_LEN && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(text).map_err(|e| e.to_string())?
    } else {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| "neither hex nor base64".to_owned())?
    };
    let len = bytes.len();
    bytes
        .try_into()
        .map_err(|_| format!("{len} bytes, not {KEY_LEN}"))
}

fn parse_addresses(
    fields: &Map<String, Value>,
    at: &ServerRef,
) -> Result<Vec<ServerAddress>, ListError> {
    let wrong = |field, expected| ListError::WrongType {
        server: at.clone(),
        field,
        expected,
    };
    let items = match fields.get("addresses") {
        None => {
            return Err(ListError::Missing {
                server: at.clone(),
                field: "addresses",
            });
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(wrong("addresses", "an array of addresses")),
    };
    if items.is_empty() {
        return Err(ListError::NoAddresses { server: at.clone() });
    }
    let mut addresses = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Value::Object(entry) = item else {
            return Err(wrong("addresses", "an array of objects"));
        };
        let transport = match string_field(entry, "protocol", at)? {
            "udp" => Transport::Udp,
            "tcp" => Transport::Tcp,
            other => {
                return Err(ListError::Protocol {
                    server: at.clone(),
                    index,
                    found: other.to_owned(),
                });
            }
        };
        let address = string_field(entry, "address", at)?;
        if !is_host_port(address) {
            return Err(ListError::Address {
                server: at.clone(),
                index,
                address: address.to_owned(),
            });
        }
        addresses.push(ServerAddress {
            transport,
            address: address.to_owned(),
        });
    }
    Ok(addresses)
}

/// A non-empty host, a colon, and a port that fits in 16 bits. The host is not checked further:
/// resolving it is the caller's business.
fn is_host_port(address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// The servers chosen for one measurement, in the order they are to be asked.
///
/// RFC 10049 §8.2: "The client randomly selects at least three servers from the list, and
/// sequentially queries them. To ensure that all possible inconsistencies can be detected, it is
/// necessary for clients to repeat the query sequence twice with the servers in the same order."
/// Asking the whole sequence a second time puts every server both before and after every other,
/// so no server can pick a place in the chain where its lie would go unnoticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every index of the list; the first `chosen` are shuffled and chosen, and the rest are
    /// drawn from, one more Fisher–Yates step at a time, to stand in for servers that fail.
    order: Vec<usize>,
    chosen: usize,
}

impl Plan {
    /// The chosen servers (indices into the list), distinct, in the order to ask them.
    pub fn servers(&self) -> &[usize] {
        &self.order[..self.chosen]
    }

    /// Every query of the measurement: the chosen servers in order, then the same again. With
    /// two servers or more, no server is asked twice in a row, since the sequence's last and
    /// first servers differ.
    pub fn queries(&self) -> impl Iterator<Item = usize> + '_ {
        self.servers().iter().chain(self.servers()).copied()
    }

    /// Chooses one more server, uniformly among those not chosen yet.
    fn draw(&mut self, random: &mut impl FnMut() -> u64) -> Option<usize> {
        let i = self.chosen;
        if i == self.order.len() {
            return None;
        }
        let j = i + below(self.order.len() - i, random);
        self.order.swap(i, j);
        self.chosen += 1;
        Some(self.order[i])
    }
}

/// Chooses `count` distinct servers of `list` uniformly at random (fewer if the list is shorter),
/// by a partial Fisher–Yates shuffle driven by `random`, which should be a cryptographically
/// secure source: a server that could predict the order could choose its place in it.
///
/// RFC 10049 §8.2 asks for at least three; [`MIN_SERVERS`] is that number.
pub fn choose(list: &ServerList, count: usize, mut random: impl FnMut() -> u64) -> Plan {
    let mut plan = Plan {
        order: (0..list.servers.len()).collect(),
        chosen: 0,
    };
    for _ in 0..count.min(list.servers.len()) {
        plan.draw(&mut random);
    }
    plan
}

/// A number in `0..n` from one 64-bit draw, by the multiply-and-shift reduction. Its bias is at
/// most `n / 2^64`, negligible for any list, and unlike rejection sampling it never asks again,
/// so a poor random source cannot make it spin.
fn below(n: usize, random: &mut impl FnMut() -> u64) -> usize {
    let wide = u128::from(random()) * n as u128;
    // The high half is less than n, so it fits.
    (wide >> 64) as usize
}

/// 32 bytes from the caller's random source.
fn random_bytes(random: &mut impl FnMut() -> u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    for chunk in out.chunks_exact_mut(8) {
        chunk.copy_from_slice(&random().to_le_bytes());
    }
    out
}

/// Why a server dropped out of a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// The caller gave up waiting.
    NoAnswer,
    /// The reply failed verification; like no answer, it is not malfeasance (RFC 10049 §8.4.2:
    /// "Clients MUST NOT send malfeasance reports in response to signature verification
    /// failures or any other protocol errors").
    Invalid(VerifyError),
}

/// A server that dropped out of a measurement, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// Index into the list.
    pub server: usize,
    /// Why.
    pub reason: FailureReason,
}

/// One received, verified exchange, owning its packets.
#[derive(Debug, Clone)]
struct Recorded {
    server: usize,
    rand: Option<[u8; 32]>,
    request: Vec<u8>,
    reply: Vec<u8>,
}

/// A measurement sequence (RFC 10049 §8.2) that the caller drives: [`Chain::next_query`] says
/// which server to ask and hands over the request, and the caller answers the [`Query`] with the
/// reply or with [`Query::no_answer`].
///
/// The first request's nonce is random; every later one is `H(last reply ‖ rand)` over the last
/// reply received, so a server that does not answer leaves no gap. A server that fails in the
/// first pass is replaced by one not chosen before, drawn at random, while any remain (with none
/// left, its place is dropped). In the second pass there is no one to replace it with, since the
/// replacement would have no earlier place to be compared with, so it is skipped. A failed
/// server is never asked again.
pub struct Chain<'l, R> {
    list: &'l ServerList,
    plan: Plan,
    /// The sequence as it stands, after replacements.
    slots: Vec<usize>,
    /// 0 for the first pass, 1 for the repetition.
    pass: u8,
    position: usize,
    versions: Vec<Version>,
    policy: VerifyPolicy,
    random: R,
    recorded: Vec<Recorded>,
    failures: Vec<Failure>,
}

impl<R> fmt::Debug for Chain<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field("slots", &self.slots)
            .field("pass", &self.pass)
            .field("position", &self.position)
            .field("links", &self.recorded.len())
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

/// The next exchange of a [`Chain`]: send [`Query::request`] to the server, then report what
/// came back. Dropping it unanswered records nothing; the chain then asks again with a fresh
/// nonce.
pub struct Query<'c, 'l, R> {
    chain: &'c mut Chain<'l, R>,
    server: usize,
    rand: Option<[u8; 32]>,
    request: Vec<u8>,
}

impl<R> fmt::Debug for Query<'_, '_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Query")
            .field("server", &self.server)
            .field("rand", &self.rand)
            .field("request", &self.request.len())
            .finish_non_exhaustive()
    }
}

impl<'l, R: FnMut() -> u64> Chain<'l, R> {
    /// A measurement over the servers of `plan`, chosen from `list`, offering `versions` (which
    /// must use 32-byte nonces: Google's cannot be chained), accepting replies that pass
    /// `policy`, with nonces and replacements drawn from `random`.
    pub fn new(
        list: &'l ServerList,
        plan: Plan,
        versions: &[Version],
        policy: VerifyPolicy,
        random: R,
    ) -> Result<Self, BuildError> {
        // Building one request now turns away version sets that can never make one.
        build_request(
            &mut [0u8; REQUEST_LEN],
            versions,
            &[0; 32],
            Some(&[0; KEY_LEN]),
        )?;
        Ok(Self {
            list,
            slots: plan.servers().to_vec(),
            plan,
            pass: 0,
            position: 0,
            versions: versions.to_vec(),
            policy,
            random,
            recorded: Vec::new(),
            failures: Vec::new(),
        })
    }

    /// The next server to ask and the request for it, or `None` once the sequence is done.
    pub fn next_query(&mut self) -> Option<Query<'_, 'l, R>> {
        let server = self.current()?;
        let (rand, nonce) = match self.recorded.last() {
            None => (None, random_bytes(&mut self.random)),
            Some(previous) => {
                let rand = random_bytes(&mut self.random);
                (Some(rand), next_nonce(&previous.reply, &rand))
            }
        };
        let key = &self.list.servers[server].public_key;
        let mut request = vec![0u8; REQUEST_LEN];
        let len = build_request(&mut request, &self.versions, &nonce, Some(&srv_value(key)))
            // `new` built a request with these versions and a nonce of this length.
            .expect("versions checked in Chain::new");
        request.truncate(len);
        Some(Query {
            chain: self,
            server,
            rand,
            request,
        })
    }
}

impl<'l, R> Chain<'l, R> {
    /// True once every query of the sequence has been answered or given up on.
    pub fn is_done(&self) -> bool {
        self.current().is_none()
    }

    /// The exchanges received, in order, for [`verify_chain`](crate::verify_chain).
    pub fn links(&self) -> Vec<Link<'_>> {
        self.recorded
            .iter()
            .map(|r| Link {
                public_key: self.list.servers[r.server].public_key,
                rand: r.rand,
                request: &r.request,
                reply: &r.reply,
            })
            .collect()
    }

    /// The server (index into the list) behind each of [`Chain::links`].
    pub fn link_servers(&self) -> Vec<usize> {
        self.recorded.iter().map(|r| r.server).collect()
    }

    /// The servers that dropped out, in the order they did.
    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// The names of the servers that dropped out, in the order they did.
    pub fn dead(&self) -> Vec<&'l str> {
        let list = self.list;
        self.failures
            .iter()
            .map(|f| list.servers[f.server].name.as_str())
            .collect()
    }

    /// How many distinct servers answered every query put to them.
    pub fn answered(&self) -> usize {
        let mut live: Vec<usize> = self
            .recorded
            .iter()
            .map(|r| r.server)
            .filter(|s| !self.is_dead(*s))
            .collect();
        live.sort_unstable();
        live.dedup();
        live.len()
    }

    /// True if enough servers answered: at least [`MIN_SERVERS`] of them, or every server of a
    /// list shorter than that. A list that short cannot meet RFC 10049 §8.1 whatever happens;
    /// telling it apart is left to the caller, who can see the list's length.
    pub fn has_enough(&self) -> bool {
        self.answered() >= MIN_SERVERS.min(self.list.servers.len())
    }

    fn is_dead(&self, server: usize) -> bool {
        self.failures.iter().any(|f| f.server == server)
    }

    /// The server the sequence is at. No slot holds a failed server still to be asked: in the
    /// first pass a failed server's slot is refilled or removed, and in the second each slot is
    /// asked once.
    fn current(&self) -> Option<usize> {
        self.slots.get(self.position).copied()
    }

    /// Moves to the next slot, and from the end of the first pass to the start of the second.
    fn advance(&mut self) {
        self.position += 1;
        if self.pass == 0 && self.position == self.slots.len() {
            self.pass = 1;
            self.position = 0;
        }
    }
}

impl<'l, R: FnMut() -> u64> Query<'_, 'l, R> {
    /// The server to ask (index into the list).
    pub fn server(&self) -> usize {
        self.server
    }

    /// The server's entry in the list: its addresses and name.
    pub fn listed(&self) -> &'l ListedServer {
        &self.chain.list.servers[self.server]
    }

    /// The request packet to send.
    pub fn request(&self) -> &[u8] {
        &self.request
    }

    /// Records the server's reply, if it verifies; a reply that does not is treated as no
    /// answer, and the error says why.
    pub fn answer(self, reply: &[u8]) -> Result<Verified, VerifyError> {
        let key = self.chain.list.servers[self.server].public_key;
        match verify_reply(&self.request, reply, &key, &self.chain.policy) {
            Ok(verified) => {
                let chain = self.chain;
                chain.recorded.push(Recorded {
                    server: self.server,
                    rand: self.rand,
                    request: self.request,
                    reply: reply.to_vec(),
                });
                chain.advance();
                Ok(verified)
            }
            Err(e) => {
                self.chain.fail(self.server, FailureReason::Invalid(e));
                Err(e)
            }
        }
    }

    /// Records that the server did not answer in time.
    pub fn no_answer(self) {
        self.chain.fail(self.server, FailureReason::NoAnswer);
    }
}

impl<R: FnMut() -> u64> Chain<'_, R> {
    /// Marks `server` failed and, in the first pass, puts a fresh server in its place.
    fn fail(&mut self, server: usize, reason: FailureReason) {
        self.failures.push(Failure { server, reason });
        if self.pass == 0 {
            match self.plan.draw(&mut self.random) {
                Some(replacement) => self.slots[self.position] = replacement,
                None => {
                    self.slots.remove(self.position);
                    if self.position == self.slots.len() {
                        self.pass = 1;
                        self.position = 0;
                    }
                }
            }
        } else {
            self.advance();
        }
    }
}

/// A contradiction from [`verify_chain`](crate::verify_chain), with the servers named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accusation<'a> {
    /// The server whose reply came first.
    pub earlier: &'a str,
    /// Its reply.
    pub earlier_reply: Verified,
    /// The server whose reply came later, yet claims an earlier time than the first allows.
    pub later: &'a str,
    /// Its reply.
    pub later_reply: Verified,
}

impl fmt::Display for Accusation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |f: &mut fmt::Formatter<'_>, name: &str, v: &Verified| {
            write!(
                f,
                "{name} (midpoint {}.{:06}, radius {}.{:06} s)",
                v.midpoint_unix_us / 1_000_000,
                v.midpoint_unix_us % 1_000_000,
                v.radius_us / 1_000_000,
                v.radius_us % 1_000_000
            )
        };
        side(f, self.earlier, &self.earlier_reply)?;
        f.write_str(", answering first, contradicts ")?;
        side(f, self.later, &self.later_reply)
    }
}

/// Names the servers behind each contradiction of `report`. `link_servers` is the server behind
/// each link checked ([`Chain::link_servers`]); a position it does not cover is named
/// "(unknown)".
pub fn accusations<'a>(
    list: &'a ServerList,
    link_servers: &[usize],
    report: &ChainReport,
) -> Vec<Accusation<'a>> {
    let name = |link: usize| {
        link_servers
            .get(link)
            .and_then(|&s| list.servers.get(s))
            .map_or("(unknown)", |s| s.name.as_str())
    };
    report
        .contradictions
        .iter()
        .map(|c| Accusation {
            earlier: name(c.earlier),
            earlier_reply: report.replies[c.earlier],
            later: name(c.later),
            later_reply: report.replies[c.later],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::verify_chain;
    use crate::keys::{LongTermKey, OnlineKey};
    use crate::server::{BatchParams, Exchange, Responder, ResponderConfig};
    use proptest::prelude::*;

    const NOW_US: u64 = 1_795_285_217_000_000;

    /// SplitMix64: a seeded stand-in for the caller's random source.
    fn seeded(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
    }

    fn key(b64: &str) -> [u8; 32] {
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap()
            .try_into()
            .unwrap()
    }

    #[test]
    fn reads_a_list_with_base64_keys() {
        let list = ServerList::parse(include_str!("../testdata/serverlist-base64.json")).unwrap();
        assert_eq!(list.servers.len(), 2);
        let first = &list.servers[0];
        assert_eq!(first.name, "Example-Roughtime");
        assert_eq!(
            first.version,
            Some(ListedVersion::Name("IETF-Roughtime".into()))
        );
        assert_eq!(first.public_key, core::array::from_fn(|i| i as u8));
        assert_eq!(
            first.addresses,
            [ServerAddress {
                transport: Transport::Udp,
                address: "roughtime.example.com:2002".into()
            }]
        );
        let second = &list.servers[1];
        assert_eq!(second.public_key, core::array::from_fn(|i| 32 + i as u8));
        assert_eq!(second.addresses[1].transport, Transport::Tcp);
        assert_eq!(second.addresses[1].address, "[2001:db8::7]:2002");
        assert_eq!(
            list.reports.as_deref(),
            Some("https://reports.example.org/roughtime")
        );
        assert!(list.sources.is_empty());
        assert_eq!(list.position("example.net"), Some(1));
    }

    #[test]
    fn reads_a_list_with_hex_keys() {
        let list = ServerList::parse(include_str!("../testdata/serverlist-hex.json")).unwrap();
        let [a, b] = &list.servers[..] else {
            panic!("two servers expected")
        };
        assert_eq!(a.public_key, [0xa5; 32]);
        assert_eq!(a.version, Some(ListedVersion::Number(1)));
        assert_eq!(a.addresses[0].address, "127.0.0.1:2002");
        assert_eq!(b.public_key, core::array::from_fn(|i| i as u8));
        assert_eq!(b.version, Some(ListedVersion::Number(0x8000_000c)));
        assert_eq!(list.reports, None);
    }

    /// A one-server list whose server has `fields` (JSON members, without braces).
    fn one(fields: &str) -> String {
        format!(r#"{{"servers":[{{{fields}}}]}}"#)
    }

    const KEY: &str = r#""publicKey":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=""#;
    const UDP: &str = r#""addresses":[{"protocol":"udp","address":"a.example:2002"}]"#;

    #[test]
    fn each_malformed_list_gets_one_error_naming_server_and_field() {
        let cases = [
            (
                one(&format!(r#""publicKeyType":"ed25519",{KEY},{UDP}"#)),
                r#"server 0: missing "name""#,
            ),
            (
                one(&format!(r#""name":"a",{KEY},{UDP}"#)),
                r#"server 0 ("a"): missing "publicKeyType""#,
            ),
            (
                one(&format!(r#""name":"a","publicKeyType":"ed25519",{UDP}"#)),
                r#"server 0 ("a"): missing "publicKey""#,
            ),
            (
                one(&format!(r#""name":"a","publicKeyType":"ed25519",{KEY}"#)),
                r#"server 0 ("a"): missing "addresses""#,
            ),
            (
                one(&format!(r#""name":"a","publicKeyType":"p256",{KEY},{UDP}"#)),
                r#"server 0 ("a"): "publicKeyType" "p256" is not supported (only "ed25519")"#,
            ),
            (
                one(&format!(
                    r#""name":"a","publicKeyType":"ed25519","publicKey":"AAEC",{UDP}"#
                )),
                r#"server 0 ("a"): "publicKey" is not a 32-byte key in base64 or hex (3 bytes, not 32)"#,
            ),
            (
                one(&format!(
                    r#""name":"a","publicKeyType":"ed25519","publicKey":"not a key!",{UDP}"#
                )),
                r#"server 0 ("a"): "publicKey" is not a 32-byte key in base64 or hex (neither hex nor base64)"#,
            ),
            (
                one(&format!(
                    r#""name":"a","publicKeyType":"ed25519",{KEY},"addresses":[{{"protocol":"quic","address":"a:1"}}]"#
                )),
                r#"server 0 ("a"): address 0: "protocol" "quic" is neither "udp" nor "tcp""#,
            ),
            (
                one(&format!(
                    r#""name":"a","publicKeyType":"ed25519",{KEY},"addresses":[]"#
                )),
                r#"server 0 ("a"): "addresses" is empty"#,
            ),
            (
                one(&format!(
                    r#""name":"a","publicKeyType":"ed25519",{KEY},"addresses":[{{"protocol":"udp","address":"a.example"}}]"#
                )),
                r#"server 0 ("a"): address 0: "a.example" is not host:port"#,
            ),
            (
                one(&format!(
                    r#""name":"a","version":-1,"publicKeyType":"ed25519",{KEY},{UDP}"#
                )),
                r#"server 0 ("a"): "version" must be a non-negative integer or a string"#,
            ),
            (
                r#"{"servers":[]}"#.to_owned(),
                r#"server list: "servers" is empty"#,
            ),
            (
                r#"{"reports":"https://r.example"}"#.to_owned(),
                r#"server list: "servers" must be an array of servers"#,
            ),
            (
                format!(
                    r#"{{"servers":[{{"name":"a","publicKeyType":"ed25519",{KEY},{UDP}}},{{"name":"a","publicKeyType":"ed25519",{KEY},{UDP}}}]}}"#
                ),
                r#"server 1 ("a"): the name is already used by server 0"#,
            ),
        ];
        for (json, expected) in cases {
            let err = ServerList::parse(&json).expect_err(&json);
            assert_eq!(err.to_string(), expected, "{json}");
        }
        assert!(
            ServerList::parse("[1]")
                .unwrap_err()
                .to_string()
                .starts_with("not a server list")
        );
    }

    /// A list of `n` servers named `s0`, `s1`, … with made-up keys.
    fn list_of(n: usize) -> ServerList {
        ServerList {
            servers: (0..n)
                .map(|i| ListedServer {
                    name: format!("s{i}"),
                    version: None,
                    public_key: [i as u8; 32],
                    addresses: vec![ServerAddress {
                        transport: Transport::Udp,
                        address: format!("s{i}.example:2002"),
                    }],
                })
                .collect(),
            sources: Vec::new(),
            reports: None,
        }
    }

    proptest! {
        #[test]
        fn choice_is_distinct_clamped_and_reaches_every_server(
            n in 1usize..12,
            count in 0usize..16,
            seed in any::<u64>(),
        ) {
            let list = list_of(n);
            let mut random = seeded(seed);
            let mut seen = vec![false; n];
            for _ in 0..200 {
                let plan = choose(&list, count, &mut random);
                let servers = plan.servers();
                prop_assert_eq!(servers.len(), count.min(n));
                let mut sorted = servers.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), servers.len(), "distinct");
                let queries: Vec<usize> = plan.queries().collect();
                prop_assert_eq!(queries.len(), 2 * servers.len());
                prop_assert_eq!(&queries[..servers.len()], servers);
                prop_assert_eq!(&queries[servers.len()..], servers);
                if servers.len() >= 2 {
                    prop_assert!(queries.windows(2).all(|w| w[0] != w[1]), "{:?}", queries);
                }
                for &s in servers {
                    seen[s] = true;
                }
            }
            // 200 draws of at least one of at most 11: missing a server has probability
            // below 11·(10/11)^200, about 5e-8.
            if count > 0 {
                prop_assert!(seen.iter().all(|s| *s), "{:?}", seen);
            }
        }
    }

    /// Our own servers, each with a clock offset in seconds, and the list naming them.
    struct Net {
        keys: Vec<LongTermKey>,
        offsets_s: Vec<i64>,
        list: ServerList,
        step: u64,
    }

    impl Net {
        fn new(offsets_s: &[i64]) -> Self {
            let keys: Vec<LongTermKey> = (0..offsets_s.len())
                .map(|i| LongTermKey::from_seed(&[i as u8 + 1; 32]))
                .collect();
            let servers: Vec<String> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    let b64 = base64::engine::general_purpose::STANDARD.encode(k.public_key());
                    format!(
                        r#"{{"name":"s{i}","publicKeyType":"ed25519","publicKey":"{b64}","addresses":[{{"protocol":"udp","address":"192.0.2.{i}:2002"}}]}}"#
                    )
                })
                .collect();
            let list =
                ServerList::parse(&format!(r#"{{"servers":[{}]}}"#, servers.join(","))).unwrap();
            assert_eq!(list.servers[0].public_key, key(&base64_key(&keys[0])));
            Self {
                keys,
                offsets_s: offsets_s.to_vec(),
                list,
                step: 0,
            }
        }

        /// Server `i`'s reply to `request`, 10 ms after the last one.
        fn reply(&mut self, i: usize, request: &[u8]) -> Vec<u8> {
            self.step += 1;
            let now_us = NOW_US
                .checked_add_signed(self.offsets_s[i] * 1_000_000)
                .unwrap()
                + self.step * 10_000;
            let delegation = self.keys[i]
                .delegate(OnlineKey::from_seed(&[i as u8 ^ 0xff; 32]), 0, u64::MAX / 2)
                .unwrap();
            let mut reply = vec![0u8; request.len()];
            let mut ex = [Exchange::new(request, &mut reply)];
            Responder::new(ResponderConfig::default()).respond(
                BatchParams {
                    now_unix_us: now_us,
                    radius_us: 1_000_000,
                    delegation: &delegation,
                },
                &mut ex,
            );
            let len = ex[0].outcome().unwrap().unwrap();
            reply.truncate(len);
            reply
        }
    }

    fn base64_key(k: &LongTermKey) -> String {
        base64::engine::general_purpose::STANDARD.encode(k.public_key())
    }

    /// Drives `chain` to the end; `dead(server, pass)` says who stays silent.
    fn drive<R: FnMut() -> u64>(
        chain: &mut Chain<'_, R>,
        net: &mut Net,
        mut dead: impl FnMut(usize, usize) -> bool,
    ) -> Vec<usize> {
        let mut asked = Vec::new();
        while let Some(query) = chain.next_query() {
            let server = query.server();
            let pass = asked.iter().filter(|s| **s == server).count();
            asked.push(server);
            if dead(server, pass) {
                query.no_answer();
            } else {
                let reply = net.reply(server, query.request());
                query.answer(&reply).unwrap();
            }
        }
        asked
    }

    fn policy() -> VerifyPolicy {
        VerifyPolicy::new(10_000_000)
    }

    #[test]
    fn a_dead_server_is_replaced_named_and_the_chain_verifies() {
        let mut net = Net::new(&[0; 5]);
        let list = net.list.clone();
        let mut random = seeded(7);
        let plan = choose(&list, 3, &mut random);
        let victim = plan.servers()[1];
        let mut chain =
            Chain::new(&list, plan.clone(), &[Version::Rfc10049], policy(), random).unwrap();
        let asked = drive(&mut chain, &mut net, |s, _| s == victim);
        assert!(chain.is_done());
        assert_eq!(chain.dead(), [list.servers[victim].name.as_str()]);
        assert_eq!(chain.failures()[0].reason, FailureReason::NoAnswer);
        // Asked: the first, the victim (silent), its replacement, the third, then the sequence
        // with the replacement again.
        assert_eq!(asked.len(), 7);
        let servers = chain.link_servers();
        assert_eq!(servers.len(), 6);
        assert!(!servers.contains(&victim));
        assert_eq!(servers[..3], servers[3..]);
        assert!(servers.windows(2).all(|w| w[0] != w[1]));
        assert_eq!(servers[0], plan.servers()[0]);
        assert_eq!(servers[2], plan.servers()[2]);
        assert_eq!(chain.answered(), 3);
        assert!(chain.has_enough());
        let report = verify_chain(&chain.links(), &policy()).unwrap();
        assert!(report.is_consistent());
        assert!(accusations(&list, &servers, &report).is_empty());
    }

    #[test]
    fn too_few_live_servers_is_said() {
        let mut net = Net::new(&[0; 3]);
        let list = net.list.clone();
        let mut random = seeded(1);
        let plan = choose(&list, 3, &mut random);
        let live = plan.servers()[2];
        let mut chain = Chain::new(&list, plan, &[Version::Rfc10049], policy(), random).unwrap();
        drive(&mut chain, &mut net, |s, _| s != live);
        let mut dead = chain.dead();
        dead.sort_unstable();
        assert_eq!(dead.len(), 2);
        assert!(!dead.contains(&list.servers[live].name.as_str()));
        assert_eq!(chain.link_servers(), [live, live]);
        assert_eq!(chain.answered(), 1);
        assert!(!chain.has_enough());
        assert!(verify_chain(&chain.links(), &policy()).is_ok());
    }

    #[test]
    fn a_server_silent_in_the_second_pass_is_skipped_and_not_counted() {
        let mut net = Net::new(&[0; 3]);
        let list = net.list.clone();
        let mut random = seeded(3);
        let plan = choose(&list, 3, &mut random);
        let flaky = plan.servers()[0];
        let mut chain = Chain::new(&list, plan, &[Version::Rfc10049], policy(), random).unwrap();
        let asked = drive(&mut chain, &mut net, |s, pass| s == flaky && pass == 1);
        assert_eq!(asked.len(), 6);
        assert_eq!(chain.link_servers().len(), 5);
        assert_eq!(chain.dead(), [list.servers[flaky].name.as_str()]);
        assert_eq!(chain.answered(), 2);
        assert!(!chain.has_enough());
        assert!(verify_chain(&chain.links(), &policy()).is_ok());
    }

    #[test]
    fn a_slow_clock_is_named_in_the_accusation() {
        // s1's clock is a minute slow: whatever the order, some reply of it comes after one of
        // another server that it contradicts.
        let mut net = Net::new(&[0, -60, 0]);
        let list = net.list.clone();
        let mut random = seeded(11);
        let plan = choose(&list, 3, &mut random);
        let mut chain = Chain::new(&list, plan, &[Version::Rfc10049], policy(), random).unwrap();
        drive(&mut chain, &mut net, |_, _| false);
        let report = verify_chain(&chain.links(), &policy()).unwrap();
        let named = accusations(&list, &chain.link_servers(), &report);
        assert!(!named.is_empty());
        assert!(named.iter().all(|a| a.later == "s1" && a.earlier != "s1"));
        let line = named[0].to_string();
        assert!(
            line.starts_with(&format!("{} (midpoint 17952852", named[0].earlier)),
            "{line}"
        );
        assert!(line.contains(", answering first, contradicts s1 (midpoint 17952851"));
        assert!(line.contains("radius 3.000000 s"), "{line}");
    }

    #[test]
    fn google_cannot_be_chained() {
        let list = list_of(3);
        let plan = choose(&list, 3, seeded(0));
        assert!(Chain::new(&list, plan, &[Version::Google], policy(), seeded(0)).is_err());
    }
}
