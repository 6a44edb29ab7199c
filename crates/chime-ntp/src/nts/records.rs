//! NTS-KE records (RFC 8915 §4), the server's side: a message's length, the request's checks, and
//! the response.

use zeroize::Zeroizing;

use super::aead::{Aead, MAX_KEY_LEN};
use super::cookies::{Cookie, Keys};
use super::pool::{PoolTokens, supported_algorithms};
use super::record::{self, Protocol};
use super::{ERROR_BAD_REQUEST, ERROR_UNRECOGNIZED_CRITICAL, MAX_COOKIES};

/// The most bytes of NTS-KE request the server reads, as chronyd.
pub const KE_MAX_REQUEST: usize = 16384;

/// Whether `buf` holds a whole NTS-KE message: records up to and including End of Message.
/// `None` while more bytes are needed; `Some(len)` once the message ends at `len`.
pub fn ke_message_len(buf: &[u8]) -> Option<usize> {
    for r in record::records(buf) {
        let r = r.ok()?;
        if r.ty == record::END_OF_MESSAGE {
            return Some(r.end);
        }
    }
    None
}

/// What the two sides of NTS-KE agreed on: the protocol, the AEAD algorithm, and how its keys are
/// exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// The protocol the keys are for.
    pub protocol: Protocol,
    /// The association's algorithm.
    pub aead: Aead,
    /// With AEAD_AES_128_GCM_SIV: whether the keys are exported with 30 in the context, as RFC
    /// 8915 says (the client sent record 1024 and the server echoed it), or with 15, as chrony
    /// 4.4 to 4.6.0 do. Always `true` for the other algorithms, whose own number is used.
    pub compliant_export: bool,
}

impl Agreement {
    /// The TLS exporter context of one of the two keys (RFC 8915 §5.1): the protocol's id, the
    /// algorithm's number (15 in chrony's old place of 30), then 0 for the client-to-server key
    /// and 1 for the server-to-client key. The key is [`Aead::key_len`] bytes long.
    pub fn exporter_context(&self, server_to_client: bool) -> [u8; 5] {
        let id = match (self.aead, self.compliant_export) {
            (Aead::Aes128GcmSiv, false) => Aead::AesSivCmac256.id(),
            (aead, _) => aead.id(),
        };
        let [p_hi, p_lo] = self.protocol.id().to_be_bytes();
        let [hi, lo] = id.to_be_bytes();
        [p_hi, p_lo, hi, lo, u8::from(server_to_client)]
    }

    /// The association's two keys, each as `export` fills it from the TLS session (RFC 5705's
    /// exporter, label [`super::EXPORTER_LABEL`]) given its [`Agreement::exporter_context`] and
    /// a buffer of the algorithm's key length: the one way both sides export them.
    pub fn export_keys<E>(
        &self,
        mut export: impl FnMut(&[u8; 5], &mut [u8]) -> Result<(), E>,
    ) -> Result<Keys, E> {
        let len = self.aead.key_len();
        let (mut c2s, mut s2c) = (
            Zeroizing::new([0; MAX_KEY_LEN]),
            Zeroizing::new([0; MAX_KEY_LEN]),
        );
        export(&self.exporter_context(false), &mut c2s[..len])?;
        export(&self.exporter_context(true), &mut s2c[..len])?;
        let keys = Keys::new(self.protocol, self.aead, &c2s[..len], &s2c[..len]);
        Ok(keys.expect("the algorithm's own key length"))
    }
}

/// What the server answers to an NTS-KE request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeOutcome {
    /// Agreed on a protocol and an algorithm: export the keys and send [`ke_response`] with
    /// cookies.
    Agreed(Agreement),
    /// A well-formed request offering no protocol served: the Next Protocol record, empty (RFC
    /// 8915 §4.1.2), and no cookies.
    NoProtocol,
    /// A protocol, but no AEAD algorithm served among those offered: the protocol and the AEAD
    /// Algorithm record, empty (RFC 8915 §4.1.5), and no cookies.
    NoAead(Protocol),
    /// Refused: send this error code (0 unrecognized critical record, 1 bad request).
    Error(u16),
    /// A pool's request (a support request or a Fixed Key Request) without a token this server
    /// accepts: refused as a bad request, but worth telling apart, since the pool will keep
    /// failing until its token or this server's list is put right.
    PoolRefused,
    /// A pool, its token accepted, asks what is served: the algorithms with their key lengths,
    /// and the protocols (see `pool`).
    PoolSupport {
        /// Whether the NTPv5 draft is served, and so listed beside NTPv4.
        ntpv5: bool,
        /// Keep the session open for the pool's next request.
        keep_alive: bool,
    },
    /// A pool, its token accepted, asks for cookies sealing these keys, its client's: send
    /// [`ke_response`] with cookies sealing them.
    PoolKeys {
        /// The client's keys, and their algorithm.
        keys: Keys,
        /// The protocol the pool agreed on with its client, which the keys were exported for.
        protocol: Protocol,
        /// Keep the session open for the pool's next request.
        keep_alive: bool,
    },
}

impl KeOutcome {
    /// Whether the session stays open for another request after this answer.
    pub fn keep_alive(&self) -> bool {
        matches!(
            self,
            Self::PoolSupport {
                keep_alive: true,
                ..
            } | Self::PoolKeys {
                keep_alive: true,
                ..
            }
        )
    }
}

/// What one request's records said, as [`ke_check`] reads them.
#[derive(Default)]
struct Seen<'a> {
    /// The client's first offered protocol that is served (a pool names one).
    protocol: Option<Protocol>,
    /// Whether NTPv5 is served.
    ntpv5: bool,
    aead: Option<Aead>,
    compliant: bool,
    protocols: usize,
    aeads: usize,
    /// The ids of the last AEAD Algorithm record: a pool names exactly one.
    aead_ids: usize,
    ended: bool,
    keep_alive: bool,
    token: Option<&'a [u8]>,
    fixed_keys: Option<&'a [u8]>,
    support: bool,
}

/// Reads a whole NTS-KE request (as [`ke_message_len`] found it) and decides. The protocol is the
/// client's first that is served (NTPv4, and the NTPv5 draft if `ntpv5`), and the algorithm the
/// client's first that is served. A pool's requests (a Fixed Key Request, a support request)
/// are served only with a token in `pool` ([`KeOutcome::PoolRefused`] without one), for the
/// same protocols; a pool's request that is not well formed is a bad request.
pub fn ke_check(request: &[u8], pool: &PoolTokens, ntpv5: bool) -> KeOutcome {
    let mut seen = Seen {
        ntpv5,
        ..Seen::default()
    };
    for r in record::records(request) {
        let Ok(r) = r else {
            return KeOutcome::Error(ERROR_BAD_REQUEST);
        };
        if let Err(code) = seen.record(r.ty, r.critical, r.body) {
            return KeOutcome::Error(code);
        }
    }
    // One Next Protocol record, and for NTPv4 one AEAD record; what they offer may still be
    // nothing served, which the response says with the record empty.
    if !seen.ended || seen.protocols > 1 || seen.aeads > 1 {
        return KeOutcome::Error(ERROR_BAD_REQUEST);
    }
    if seen.support || seen.fixed_keys.is_some() {
        return seen.pool(pool);
    }
    if seen.protocols != 1 || (seen.protocol.is_some() && seen.aeads != 1) {
        return KeOutcome::Error(ERROR_BAD_REQUEST);
    }
    match (seen.protocol, seen.aead) {
        (None, _) => KeOutcome::NoProtocol,
        (Some(protocol), None) => KeOutcome::NoAead(protocol),
        (Some(protocol), Some(aead)) => KeOutcome::Agreed(Agreement {
            protocol,
            aead,
            compliant_export: aead != Aead::Aes128GcmSiv || seen.compliant,
        }),
    }
}

impl<'a> Seen<'a> {
    /// Notes one record; `Err` with the error code if it makes the request one to refuse.
    fn record(&mut self, ty: u16, critical: bool, body: &'a [u8]) -> Result<(), u16> {
        let ids = || {
            body.chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
        };
        let once = |seen: Option<&[u8]>| match seen {
            None => Ok(Some(body)),
            Some(_) => Err(ERROR_BAD_REQUEST),
        };
        match ty {
            record::END_OF_MESSAGE => self.ended = true,
            record::NEXT_PROTOCOL => {
                self.protocols += 1;
                if body.len().is_multiple_of(2) {
                    let served = |id| {
                        Protocol::from_id(id).filter(|&p| p != Protocol::NtpV5Draft || self.ntpv5)
                    };
                    self.protocol = self.protocol.or_else(|| ids().find_map(served));
                }
            }
            record::AEAD_ALGORITHM => {
                self.aeads += 1;
                self.aead_ids = body.len() / 2;
                if body.len().is_multiple_of(2) {
                    self.aead = self.aead.or_else(|| ids().find_map(Aead::from_id));
                }
            }
            record::COMPLIANT_GCM_SIV_EXPORT if body.is_empty() => self.compliant = true,
            record::KEEP_ALIVE if body.is_empty() => self.keep_alive = true,
            record::COMPLIANT_GCM_SIV_EXPORT | record::KEEP_ALIVE => return Err(ERROR_BAD_REQUEST),
            record::AUTHENTICATION_TOKEN => self.token = once(self.token)?,
            record::FIXED_KEY_REQUEST => self.fixed_keys = once(self.fixed_keys)?,
            // The pool sends the two lists empty, asking for them.
            record::SUPPORTED_ALGORITHMS | record::SUPPORTED_PROTOCOLS => self.support = true,
            // Server and port negotiation from a client only state preferences, and a pool's
            // deny list is for the pool: ignored.
            record::NTPV4_SERVER | record::NTPV4_PORT | record::NTP_SERVER_DENY => {}
            _ if critical => return Err(ERROR_UNRECOGNIZED_CRITICAL),
            _ => {}
        }
        Ok(())
    }

    /// A pool's request: refused without an accepted token, then a support request, or keys for
    /// a protocol served under exactly one algorithm, each key its length.
    fn pool(&self, pool: &PoolTokens) -> KeOutcome {
        if !self.token.is_some_and(|t| pool.accepts(t)) {
            return KeOutcome::PoolRefused;
        }
        let bad = KeOutcome::Error(ERROR_BAD_REQUEST);
        let keep_alive = self.keep_alive;
        let Some(both) = self.fixed_keys else {
            let ntpv5 = self.ntpv5;
            return KeOutcome::PoolSupport { ntpv5, keep_alive };
        };
        if self.support || self.protocols != 1 || self.aeads != 1 || self.aead_ids != 1 {
            return bad;
        }
        match (self.protocol, self.aead) {
            (None, _) => KeOutcome::NoProtocol,
            (Some(protocol), None) => KeOutcome::NoAead(protocol),
            (Some(protocol), Some(aead)) => {
                let (c2s, s2c) = both.split_at(both.len() / 2);
                match Keys::new(protocol, aead, c2s, s2c) {
                    Some(keys) => KeOutcome::PoolKeys {
                        keys,
                        protocol,
                        keep_alive,
                    },
                    None => bad,
                }
            }
        }
    }
}

/// Where an NTS-KE server sends its clients for NTP when that is not its own address and port
/// 123 (RFC 8915 §4.1.7, §4.1.8): the NTPv4 Server and Port Negotiation records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NtpNegotiation {
    /// The NTP server, an IP address or a fully qualified domain name (see [`valid_ntp_server`]).
    pub server: Option<String>,
    /// The NTP port.
    pub port: Option<u16>,
}

/// Whether `name` may go in an NTPv4 Server Negotiation record: an IPv4 address in dotted decimal,
/// an IPv6 address in its text form without a zone, or a domain name (letters, digits and hyphens
/// in dot-separated labels of 1 to 63, at most 253 in all, a label neither starting nor ending
/// with a hyphen).
pub fn valid_ntp_server(name: &str) -> bool {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && !name.chars().all(|c| c.is_ascii_digit() || c == '.')
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Writes the NTS-KE response for [`KeOutcome::Agreed`] and [`KeOutcome::PoolKeys`]: the
/// protocol, the algorithm (and record 1024 where a client asked for it and AEAD_AES_128_GCM_SIV
/// was agreed), the NTP server and port if given, up to eight of `cookies`, Keep Alive where kept,
/// End of Message. For the others, what each says and End of Message.
pub fn ke_response(
    outcome: &KeOutcome,
    ntp: &NtpNegotiation,
    cookies: impl IntoIterator<Item = Cookie>,
    out: &mut Vec<u8>,
) {
    let mut put = |ty: u16, body: &[u8]| record::put(out, ty, body);
    let aead = match outcome {
        KeOutcome::Error(code) => {
            put(record::CRITICAL | record::ERROR, &code.to_be_bytes());
            None
        }
        KeOutcome::PoolRefused => {
            put(
                record::CRITICAL | record::ERROR,
                &ERROR_BAD_REQUEST.to_be_bytes(),
            );
            None
        }
        KeOutcome::NoProtocol => {
            put(record::CRITICAL | record::NEXT_PROTOCOL, &[]);
            None
        }
        KeOutcome::NoAead(protocol) => {
            put(
                record::CRITICAL | record::NEXT_PROTOCOL,
                &protocol.id().to_be_bytes(),
            );
            put(record::CRITICAL | record::AEAD_ALGORITHM, &[]);
            None
        }
        KeOutcome::PoolSupport { ntpv5, .. } => {
            let algorithms: Vec<u8> = supported_algorithms().collect();
            put(record::CRITICAL | record::SUPPORTED_ALGORITHMS, &algorithms);
            let v5 = Protocol::NtpV5Draft.id().to_be_bytes();
            let protocols = [Protocol::NtpV4.id().to_be_bytes(), v5];
            let served = if *ntpv5 {
                &protocols[..]
            } else {
                &protocols[..1]
            };
            put(
                record::CRITICAL | record::SUPPORTED_PROTOCOLS,
                served.as_flattened(),
            );
            None
        }
        KeOutcome::Agreed(agreement) => {
            // The pool exported its client's keys itself, so record 1024 is the client's
            // business with the pool; here it is echoed to a client of this server.
            let echo = agreement.aead == Aead::Aes128GcmSiv && agreement.compliant_export;
            Some((agreement.protocol, agreement.aead, echo))
        }
        KeOutcome::PoolKeys { keys, protocol, .. } => Some((*protocol, keys.aead(), false)),
    };
    if let Some((protocol, aead, echo_compliant)) = aead {
        put(
            record::CRITICAL | record::NEXT_PROTOCOL,
            &protocol.id().to_be_bytes(),
        );
        put(
            record::CRITICAL | record::AEAD_ALGORITHM,
            &aead.id().to_be_bytes(),
        );
        if echo_compliant {
            put(record::COMPLIANT_GCM_SIV_EXPORT, &[]);
        }
        if let Some(server) = &ntp.server {
            put(record::CRITICAL | record::NTPV4_SERVER, server.as_bytes());
        }
        if let Some(port) = ntp.port {
            put(record::CRITICAL | record::NTPV4_PORT, &port.to_be_bytes());
        }
        for cookie in cookies.into_iter().take(MAX_COOKIES) {
            put(record::NEW_COOKIE, cookie.as_bytes());
        }
    }
    if outcome.keep_alive() {
        put(record::KEEP_ALIVE, &[]);
    }
    put(record::CRITICAL | record::END_OF_MESSAGE, &[]);
}
