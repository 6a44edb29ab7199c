//! A member of an NTS pool (draft-ietf-ntp-nts-keyexchange-pool, as pendulum-project/nts-pool and
//! ntpd-rs 1.9 implement it).
//!
//! NTS does not survive a DNS pool: a client's keys come from the TLS session of the server it
//! talked to. An NTS pool puts a key-exchange load balancer (KELB) in front. It ends the
//! client's TLS itself, exports the client's keys, picks a member, and asks the member over an
//! ordinary NTS-KE connection for cookies sealing *those* keys (a Fixed Key Request), which it
//! hands on to the client with the member's NTP server. Before that it may ask what the member
//! serves (a support request: the Supported Algorithm and Supported Next Protocol Lists). Both
//! requests carry an Authentication Token the pool was given for this member; the member serves
//! them only for a token it accepts, and answers a wrong or missing one with Error Bad Request.
//! Everyone else, the pool's monitors included, keeps talking plain RFC 8915 to the same port.
//!
//! The records (their numbers are IANA's early allocations): Keep Alive (8: keep the session
//! open for another request), Supported Next Protocol List (9), Supported Algorithm List (10:
//! pairs of AEAD number and key length), Fixed Key Request (12: the client-to-server key, then
//! the server-to-client key), NTP Server Deny (13: for the pool, ignored by a member) and
//! Authentication Token (14).
//!
//! The server's side is in `records` ([`super::ke_check`] with the accepted [`PoolTokens`]); here
//! are the tokens, and the pool's side of the two requests, for tests and tools.

use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::aead::Aead;
use super::cookies::Keys;
use super::record::{self, KeAnswerError, Protocol, put};

/// The Authentication Tokens a member accepts from its pools, compared in constant time.
#[derive(Default)]
pub struct PoolTokens {
    tokens: Vec<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for PoolTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PoolTokens({} accepted)", self.tokens.len())
    }
}

impl PoolTokens {
    /// No pool: pool requests are refused, every other request is served as before.
    pub fn none() -> Self {
        Self::default()
    }

    /// The tokens accepted, each as the pool sends it (nts-pool's are 64 hexadecimal digits).
    /// Empty tokens are left out: they would accept a request that sends an empty record.
    pub fn new<T: AsRef<[u8]>>(tokens: impl IntoIterator<Item = T>) -> Self {
        let tokens = tokens.into_iter().map(|t| t.as_ref().to_vec());
        Self {
            tokens: tokens
                .filter(|t| !t.is_empty())
                .map(Zeroizing::new)
                .collect(),
        }
    }

    /// How many tokens are accepted.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether none is: this server is in no pool.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether `token` is one of them. Each comparison takes the same time whatever the bytes,
    /// and every token is compared, so that the time taken says nothing of how close a guess
    /// came.
    pub fn accepts(&self, token: &[u8]) -> bool {
        let mut found = subtle::Choice::from(0);
        for accepted in &self.tokens {
            found |= accepted.as_slice().ct_eq(token);
        }
        bool::from(found) && !token.is_empty()
    }
}

/// The pool's support request to a member: its token, the two lists asked for (empty), Keep Alive
/// if `keep_alive`, End of Message.
pub fn pool_support_request(token: &[u8], keep_alive: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + token.len());
    put(&mut out, record::AUTHENTICATION_TOKEN, token);
    put(
        &mut out,
        record::CRITICAL | record::SUPPORTED_ALGORITHMS,
        &[],
    );
    put(
        &mut out,
        record::CRITICAL | record::SUPPORTED_PROTOCOLS,
        &[],
    );
    if keep_alive {
        put(&mut out, record::KEEP_ALIVE, &[]);
    }
    put(&mut out, record::CRITICAL | record::END_OF_MESSAGE, &[]);
    out
}

/// The pool's Fixed Key Request to a member: its token, the client's `keys`, the `protocol` they
/// were exported for, their algorithm, Keep Alive if `keep_alive`, End of Message.
pub fn pool_fixed_key_request(
    token: &[u8],
    keys: &Keys,
    protocol: Protocol,
    keep_alive: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + token.len() + 2 * keys.c2s().len());
    put(&mut out, record::AUTHENTICATION_TOKEN, token);
    let mut both = Zeroizing::new(keys.c2s().to_vec());
    both.extend_from_slice(keys.s2c());
    put(
        &mut out,
        record::CRITICAL | record::FIXED_KEY_REQUEST,
        &both,
    );
    let protocol = protocol.id().to_be_bytes();
    put(
        &mut out,
        record::CRITICAL | record::NEXT_PROTOCOL,
        &protocol,
    );
    let id = keys.aead().id().to_be_bytes();
    put(&mut out, record::CRITICAL | record::AEAD_ALGORITHM, &id);
    if keep_alive {
        put(&mut out, record::KEEP_ALIVE, &[]);
    }
    put(&mut out, record::CRITICAL | record::END_OF_MESSAGE, &[]);
    out
}

/// What a member answered to a support request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSupport {
    /// The algorithms served, each with its key length in bytes.
    pub algorithms: Vec<(u16, u16)>,
    /// The next protocols served (0: NTPv4, 0x8001: the NTPv5 draft).
    pub protocols: Vec<u16>,
    /// Whether the member keeps the session open for another request.
    pub keep_alive: bool,
}

/// Reads a member's answer to a support request.
pub fn parse_pool_support(bytes: &[u8]) -> Result<PoolSupport, KeAnswerError> {
    let (mut algorithms, mut protocols, mut keep_alive) = (None, None, false);
    for r in record::records(bytes) {
        let r = r.map_err(|()| KeAnswerError::Bad("a record runs past the end"))?;
        let pairs = || {
            r.body
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
        };
        let len = r.body.len();
        match r.ty {
            record::END_OF_MESSAGE => {
                let (Some(algorithms), Some(protocols)) = (algorithms, protocols) else {
                    return Err(KeAnswerError::Bad(
                        "no Supported Algorithm or Protocol List",
                    ));
                };
                return Ok(PoolSupport {
                    algorithms,
                    protocols,
                    keep_alive,
                });
            }
            record::ERROR => {
                return Err(KeAnswerError::Refused(pairs().next().unwrap_or(u16::MAX)));
            }
            record::SUPPORTED_ALGORITHMS if len.is_multiple_of(4) => {
                let ids: Vec<u16> = pairs().collect();
                algorithms = Some(ids.chunks_exact(2).map(|p| (p[0], p[1])).collect());
            }
            record::SUPPORTED_PROTOCOLS if len.is_multiple_of(2) => {
                protocols = Some(pairs().collect())
            }
            record::KEEP_ALIVE => keep_alive = true,
            _ if r.critical => return Err(KeAnswerError::Bad("an unknown critical record")),
            _ => {}
        }
    }
    Err(KeAnswerError::Bad("no End of Message"))
}

/// The algorithms a member offers its pools: AEAD_AES_SIV_CMAC_256 and _512, not
/// AEAD_AES_128_GCM_SIV. A pool exports its client's keys itself, and for 30 the context is in
/// doubt: nts-pool-ke exports them with 30 in it, as RFC 8915 says, but does not echo chrony's
/// record 1024, and a client that sent it and sees no echo (chrony 4.6.1 on, `chime ntp`) takes
/// the server for a chrony 4.4-4.6.0 and exports them with 15, so every request of it would be
/// NAKed. Run by hand through nts-pool-ke: 15 and 17 authenticated, 30 NAKed. A Fixed Key Request
/// for 30 is still served: the pool knows what it exported.
pub const POOL_AEADS: [Aead; 2] = [Aead::AesSivCmac256, Aead::AesSivCmac512];

/// The Supported Algorithm List a member sends: each of [`POOL_AEADS`], with its key length.
pub(super) fn supported_algorithms() -> impl Iterator<Item = u8> {
    POOL_AEADS.into_iter().flat_map(|aead| {
        let [a, b] = aead.id().to_be_bytes();
        let [c, d] = (aead.key_len() as u16).to_be_bytes();
        [a, b, c, d]
    })
}

/// The label of a line of the pool token file: `token TOKEN`.
const TOKEN_LABEL: &str = "token";

/// Reads a pool token file: one `token TOKEN` line per pool this server serves (the token as the
/// pool gave it), comments after `#`. At least one, and none twice.
pub fn parse_pool_tokens(text: &str) -> Result<PoolTokens, chime_keyfile::KeyFileError> {
    let mut tokens: Vec<Zeroizing<Vec<u8>>> = Vec::new();
    for mut line in chime_keyfile::key_lines(text) {
        if line.label() != TOKEN_LABEL {
            return Err(line.wrong_label("`token TOKEN`"));
        }
        let token = line.word("the token")?.as_bytes();
        if tokens.iter().any(|t| t.as_slice() == token) {
            return Err(line.repeated("this token"));
        }
        tokens.push(Zeroizing::new(token.to_vec()));
        line.end("the token")?;
    }
    if tokens.is_empty() {
        return Err(chime_keyfile::KeyFileError::Empty);
    }
    Ok(PoolTokens { tokens })
}
