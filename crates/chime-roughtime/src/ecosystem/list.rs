//! Server lists (RFC 10049 §8.3): reading one, and the errors that name what is wrong with it.

use core::fmt;

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::keys::KEY_LEN;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_list_with_base64_keys() {
        let list =
            ServerList::parse(include_str!("../../testdata/serverlist-base64.json")).unwrap();
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
        let list = ServerList::parse(include_str!("../../testdata/serverlist-hex.json")).unwrap();
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
}
