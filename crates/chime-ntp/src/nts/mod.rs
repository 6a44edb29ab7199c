//! Network Time Security for NTPv4 (RFC 8915), sans-IO: the server's part, and the client's for
//! `chime ntp --nts`.
//!
//! NTS has two halves. In NTS-KE a client opens TLS 1.3 to the key-establishment port, both sides
//! export two keys from the session (client-to-server and server-to-client), and the server hands
//! out *cookies*: the two keys sealed under a master key only the server knows. [`ke_response`]
//! answers the client's NTS-KE records; the daemon runs the TLS and exports the keys.
//!
//! Then each NTP request carries one cookie, a unique identifier and an authenticator: an
//! AEAD_AES_SIV_CMAC_256 tag over the packet, under the client-to-server key. The server opens the
//! cookie ([`CookieKeys::open`]), checks the tag ([`check_request`]), and answers with the
//! identifier echoed and an authenticator under the server-to-client key whose ciphertext holds
//! fresh cookies, one for each the client spent or asked for with a placeholder
//! ([`write_response`]). The reply is exactly as long as the request (the placeholders reserve the
//! room), never longer. A cookie that does not open (an old master key, a forgery) or a tag that
//! does not verify gets an NTS NAK ([`write_nak`]): a Kiss-o'-Death `NTSN` with the identifier and
//! nothing else, which tells the client to run NTS-KE again.
//!
//! In four parts: the cookies and the keys they seal (`cookies`), a fleet's shared secret and the
//! keys derived from it (`fleet`), the server's checks of requests and its replies (`server`), the
//! NTS-KE records (`records`), and the client's side (`client`). Nothing reads a clock; nonces come
//! from the caller. The server's side allocates nothing per request; the client's returns what it
//! builds and parses as vectors.

mod client;
mod cookies;
mod fleet;
mod records;
mod server;
#[cfg(test)]
mod tests;

pub use chime_keyfile::KeyFileError;
pub use client::{
    ClientReply, ClientReplyError, KeAnswer, KeAnswerError, client_check_reply, client_request,
    client_request_into, client_request_len, ke_request, parse_ke_response, reply_unique_id,
};
pub use cookies::{CookieKeys, Keys};
pub use fleet::{FLEET_SECRET_LEN, FleetSecret, encode_fleet_file, fleet_key, parse_fleet_file};
pub use records::{
    KE_MAX_REQUEST, KeOutcome, NtpNegotiation, ke_check, ke_message_len, ke_response,
    valid_ntp_server,
};
pub use server::{Check, Verified, check_request, write_nak, write_response};

/// The one AEAD algorithm served: AEAD_AES_SIV_CMAC_256 (IANA 15), RFC 8915's mandatory one.
pub const AEAD_AES_SIV_CMAC_256: u16 = 15;
/// Its key length: two AES-128 keys.
pub const KEY_LEN: usize = 32;
/// The length of the nonce and of the SIV tag.
const NONCE_LEN: usize = 16;
const TAG_LEN: usize = 16;
/// The TLS exporter label of RFC 8915 §5.1.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-network-time-security";
/// The ALPN protocol of NTS-KE.
pub const ALPN: &[u8] = b"ntske/1";
/// The exporter context for NTPv4 with AEAD_AES_SIV_CMAC_256: protocol 0, algorithm 15, then 0 for
/// the client-to-server key and 1 for the server-to-client key.
pub const EXPORTER_C2S: [u8; 5] = [0, 0, 0, 15, 0];
/// See [`EXPORTER_C2S`].
pub const EXPORTER_S2C: [u8; 5] = [0, 0, 0, 15, 1];

/// NTS extension field types (RFC 8915 §5.3–5.6).
mod ef {
    pub(super) const UNIQUE_IDENTIFIER: u16 = 0x0104;
    pub(super) const COOKIE: u16 = 0x0204;
    pub(super) const COOKIE_PLACEHOLDER: u16 = 0x0304;
    pub(super) const AUTHENTICATOR: u16 = 0x0404;
}

/// The most cookies one reply carries, as chronyd.
const MAX_COOKIES: usize = 8;
/// The shortest unique identifier a request may carry.
const MIN_UNIQUE_ID: usize = 32;

/// A sealed cookie: key id (4), nonce (16), SIV tag (16), then the sealed algorithm (2), padding
/// (2) and the two keys (64): 104 bytes, a multiple of 4 as clients require.
pub const COOKIE_LEN: usize = 4 + NONCE_LEN + TAG_LEN + COOKIE_PLAIN;
const COOKIE_PLAIN: usize = 2 + 2 + 2 * KEY_LEN;

/// NTS-KE record types.
mod record {
    pub(super) const END_OF_MESSAGE: u16 = 0;
    pub(super) const NEXT_PROTOCOL: u16 = 1;
    pub(super) const ERROR: u16 = 2;
    pub(super) const AEAD_ALGORITHM: u16 = 4;
    pub(super) const NEW_COOKIE: u16 = 5;
    pub(super) const NTPV4_SERVER: u16 = 6;
    pub(super) const NTPV4_PORT: u16 = 7;
    pub(super) const CRITICAL: u16 = 0x8000;
}

/// NTS-KE error codes.
const ERROR_UNRECOGNIZED_CRITICAL: u16 = 0;
const ERROR_BAD_REQUEST: u16 = 1;
