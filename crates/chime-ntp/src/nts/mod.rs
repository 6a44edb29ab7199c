//! Network Time Security (RFC 8915) for NTPv4 and the NTPv5 draft, sans-IO: the server's part,
//! and the client's for `chime ntp --nts` (NTPv4 and the NTPv5 draft).
//!
//! NTS has two halves. In NTS-KE a client opens TLS 1.3 to the key-establishment port, both sides
//! export two keys from the session (client-to-server and server-to-client), and the server hands
//! out *cookies*: the two keys sealed under a master key only the server knows. [`ke_response`]
//! answers the client's NTS-KE records; the daemon runs the TLS and exports the keys.
//!
//! Then each NTP request carries one cookie, a unique identifier and an authenticator: an AEAD
//! tag over the packet, under the client-to-server key, in the algorithm the two agreed on in
//! NTS-KE ([`Aead`]: the client's first of AEAD_AES_SIV_CMAC_256, the mandatory one, _512 and
//! AEAD_AES_128_GCM_SIV). The server opens the cookie ([`CookieKeys::open`]), which names the
//! algorithm, checks the tag ([`check_request`]), and answers with the identifier echoed and an
//! authenticator under the server-to-client key whose ciphertext holds fresh cookies, one for each
//! the client spent or asked for with a placeholder ([`write_response`]). The reply is exactly as
//! long as the request (the placeholders reserve the room), never longer. A cookie that does not
//! open (an old master key, a forgery) or a tag that does not verify gets an NTS NAK
//! ([`write_nak`]): a Kiss-o'-Death `NTSN` with the identifier and nothing else, which tells the
//! client to run NTS-KE again.
//!
//! A server may also be a member of NTS pools (`pool`): a pool's key-exchange front end, holding a
//! token the member accepts, asks it for cookies sealing keys it gives ([`KeOutcome::PoolKeys`]),
//! for whichever protocol the member serves that the pool agreed on with its client.
//!
//! In six parts: the AEAD algorithms (`aead`), the cookies and the keys they seal (`cookies`), a
//! fleet's shared secret and the keys derived from it (`fleet`), the server's checks of requests
//! and its replies (`server`), the NTS-KE records (`records`) and a pool's (`pool`), and the
//! client's side (`client`).
//! Nothing reads a clock; nonces come from the caller. The server's side allocates nothing per
//! request; the client's returns what it builds and parses as vectors.

mod aead;
mod client;
mod cookies;
mod fields;
mod fleet;
mod pool;
mod record;
mod records;
mod server;
#[cfg(test)]
mod tests;

pub use aead::{Aead, MAX_KEY_LEN};
pub use chime_keyfile::KeyFileError;
pub use client::{
    ClientReply, ClientReplyError, KeAnswer, NtsFields, client_check_reply, client_check_reply_v5,
    client_request, client_request_into, client_request_len, client_request_v5,
    client_request_v5_into, client_request_v5_len, ke_request, parse_ke_response, reply_unique_id,
    reply_unique_id_v5,
};
pub use cookies::{Cookie, CookieKeys, Keys, MAX_COOKIE_LEN, NakReason, cookie_len};
pub use fleet::{FLEET_SECRET_LEN, FleetSecret, encode_fleet_file, fleet_key, parse_fleet_file};
pub use pool::{
    POOL_AEADS, PoolSupport, PoolTokens, parse_pool_support, parse_pool_tokens,
    pool_fixed_key_request, pool_support_request,
};
pub use record::{KeAnswerError, Protocol};
pub use records::{
    Agreement, KE_MAX_REQUEST, KeOutcome, NtpNegotiation, ke_check, ke_message_len, ke_response,
    valid_ntp_server,
};
pub use server::{
    Check, Verified, check_request, check_request_v5, write_nak, write_nak_v5, write_response,
    write_response_v5,
};

/// The length of a master key cookies are sealed under (an AEAD_AES_SIV_CMAC_256 key, whatever
/// the association's algorithm).
pub const KEY_LEN: usize = 32;
/// The length of the nonces sent: the cookies', and the most an authenticator's takes.
pub const NONCE_LEN: usize = 16;
/// The length of every algorithm's tag.
const TAG_LEN: usize = 16;
/// The TLS exporter label of RFC 8915 §5.1.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-network-time-security";
/// The ALPN protocol of NTS-KE.
pub const ALPN: &[u8] = b"ntske/1";

/// NTS extension field types (RFC 8915 §5.3–5.6).
pub(crate) mod ef {
    pub(crate) const UNIQUE_IDENTIFIER: u16 = 0x0104;
    pub(crate) const COOKIE: u16 = 0x0204;
    pub(crate) const COOKIE_PLACEHOLDER: u16 = 0x0304;
    pub(crate) const AUTHENTICATOR: u16 = 0x0404;
}

/// The most cookies one reply carries, as chronyd.
const MAX_COOKIES: usize = 8;
/// The shortest unique identifier a request may carry.
const MIN_UNIQUE_ID: usize = 32;

/// NTS-KE error codes.
const ERROR_UNRECOGNIZED_CRITICAL: u16 = 0;
const ERROR_BAD_REQUEST: u16 = 1;
