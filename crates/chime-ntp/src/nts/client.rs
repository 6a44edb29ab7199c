//! The client's side, for `chime ntp --nts`: the NTS-KE request and the response's records, and
//! an NTS request and the check of its reply.

use std::ops::Range;

use super::aead::Aead;
use super::cookies::Keys;
use super::fields::{Field, Unopened, fields, open_authenticator};
use super::record::{self, KeAnswerError, Protocol};
use super::records::Agreement;
use super::{NONCE_LEN, TAG_LEN, ef};
use crate::packet::Header;
use crate::v5::{self, Draft};

/// The NTS-KE request a client sends: `protocol`, the algorithms `aeads` in its order of
/// preference (with record 1024 if AEAD_AES_128_GCM_SIV is among them, asking for its keys to be
/// exported as RFC 8915 says), End of Message.
pub fn ke_request(protocol: Protocol, aeads: &[Aead]) -> Vec<u8> {
    let ids: Vec<u8> = aeads.iter().flat_map(|a| a.id().to_be_bytes()).collect();
    let mut out = Vec::with_capacity(32);
    let protocol = protocol.id().to_be_bytes();
    record::put(
        &mut out,
        record::CRITICAL | record::NEXT_PROTOCOL,
        &protocol,
    );
    record::put(&mut out, record::CRITICAL | record::AEAD_ALGORITHM, &ids);
    if aeads.contains(&Aead::Aes128GcmSiv) {
        record::put(&mut out, record::COMPLIANT_GCM_SIV_EXPORT, &[]);
    }
    record::put(&mut out, record::CRITICAL | record::END_OF_MESSAGE, &[]);
    out
}

/// What an NTS-KE server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeAnswer {
    /// The algorithm it chose, and how its keys are exported.
    pub agreement: Agreement,
    /// The cookies handed out.
    pub cookies: Vec<Vec<u8>>,
    /// The NTP server to use, if not the NTS-KE server's host.
    pub server: Option<String>,
    /// The NTP port to use, if not 123.
    pub port: Option<u16>,
}

/// Reads an NTS-KE response (up to End of Message) to a request that offered `protocol` and the
/// algorithms `offered`.
pub fn parse_ke_response(
    bytes: &[u8],
    protocol: Protocol,
    offered: &[Aead],
) -> Result<KeAnswer, KeAnswerError> {
    let (mut cookies, mut server, mut port) = (Vec::new(), None, None);
    let (mut named, mut aead, mut compliant, mut ended) = (None, None, false, false);
    for r in record::records(bytes) {
        let r = r.map_err(|()| KeAnswerError::Bad("a record runs past the end"))?;
        let body = r.body;
        let u16_body = || {
            <[u8; 2]>::try_from(body)
                .map(u16::from_be_bytes)
                .map_err(|_| KeAnswerError::Bad("a record is not 2 bytes long"))
        };
        match r.ty {
            record::END_OF_MESSAGE => ended = true,
            record::NEXT_PROTOCOL if body.is_empty() => return Err(KeAnswerError::NoProtocol),
            record::NEXT_PROTOCOL => named = Some(u16_body()?),
            record::AEAD_ALGORITHM if body.is_empty() => return Err(KeAnswerError::NoAead),
            record::AEAD_ALGORITHM => aead = Aead::from_id(u16_body()?),
            record::COMPLIANT_GCM_SIV_EXPORT => compliant = true,
            record::ERROR => return Err(KeAnswerError::Refused(u16_body().unwrap_or(u16::MAX))),
            record::NEW_COOKIE => cookies.push(body.to_vec()),
            record::NTPV4_SERVER => {
                let name = std::str::from_utf8(body)
                    .map_err(|_| KeAnswerError::Bad("the server name is not text"))?;
                server = Some(name.to_owned());
            }
            record::NTPV4_PORT => port = Some(u16_body()?),
            _ if r.critical => return Err(KeAnswerError::Bad("an unknown critical record")),
            _ => {}
        }
    }
    if !ended {
        return Err(KeAnswerError::Bad("no End of Message"));
    }
    let aead = aead.filter(|a| offered.contains(a));
    let (true, Some(aead)) = (named == Some(protocol.id()), aead) else {
        return Err(KeAnswerError::Bad(
            "not the protocol offered with an algorithm offered",
        ));
    };
    if cookies.is_empty() {
        return Err(KeAnswerError::Bad("no cookies"));
    }
    // Record 1024 back: the server exports 30's keys with 30 in the context; without it, with
    // 15 (chrony 4.4 to 4.6.0 as servers).
    let compliant_export = aead != Aead::Aes128GcmSiv || compliant;
    Ok(KeAnswer {
        agreement: Agreement {
            protocol,
            aead,
            compliant_export,
        },
        cookies,
        server,
        port,
    })
}

/// Appends to `header` (a 48-byte client request) the NTS fields of a client request: the unique
/// identifier, the cookie, `placeholders` placeholders as long as the cookie, and an authenticator
/// over all of it under the client-to-server key of `keys` with `nonce` (AES-GCM-SIV takes its
/// first 12 bytes).
pub fn client_request(
    header: &[u8; Header::LEN],
    unique_id: &[u8; 32],
    cookie: &[u8],
    placeholders: usize,
    keys: &Keys,
    nonce: [u8; NONCE_LEN],
) -> Vec<u8> {
    let mut p = vec![0; client_request_len(cookie.len(), placeholders)];
    let len = client_request_into(&mut p, header, unique_id, cookie, placeholders, keys, nonce);
    p.truncate(len);
    p
}

/// The length of a client request with a cookie of `cookie_len` bytes and `placeholders`
/// placeholders, at most (an AES-GCM-SIV request's nonce is 4 bytes shorter).
pub fn client_request_len(cookie_len: usize, placeholders: usize) -> usize {
    Header::LEN + (4 + 32) + (1 + placeholders) * (4 + cookie_len) + 4 + 4 + NONCE_LEN + TAG_LEN
}

/// [`client_request`] written into `out` (at least [`client_request_len`] bytes) without
/// allocating; returns the length written.
///
/// # Panics
/// If `out` is shorter than [`client_request_len`].
pub fn client_request_into(
    out: &mut [u8],
    header: &[u8; Header::LEN],
    unique_id: &[u8; 32],
    cookie: &[u8],
    placeholders: usize,
    keys: &Keys,
    nonce: [u8; NONCE_LEN],
) -> usize {
    out[..Header::LEN].copy_from_slice(header);
    let nts = NtsFields {
        unique_id,
        cookie,
        placeholders,
        keys,
        nonce,
    };
    append_nts(out, Header::LEN, &nts)
}

/// What a client request's NTS fields are made of: its unique identifier, the cookie it spends,
/// how many placeholders ask for more, the association's keys and the authenticator's nonce.
#[derive(Debug, Clone, Copy)]
pub struct NtsFields<'a> {
    /// The unique identifier, which the reply echoes.
    pub unique_id: &'a [u8; 32],
    /// The cookie spent.
    pub cookie: &'a [u8],
    /// Placeholders as long as the cookie, each asking for one more.
    pub placeholders: usize,
    /// The association's keys: the authenticator is under the client-to-server one.
    pub keys: &'a Keys,
    /// The authenticator's nonce (AES-GCM-SIV takes its first 12 bytes).
    pub nonce: [u8; NONCE_LEN],
}

/// [`client_request`] for the NTPv5 draft `draft`: a v5 request with `client_cookie` and its
/// Draft Identification (which the authenticator covers, as the server's), then the same NTS
/// fields.
pub fn client_request_v5(
    draft: Draft,
    client_cookie: [u8; 8],
    unique_id: &[u8; 32],
    cookie: &[u8],
    placeholders: usize,
    keys: &Keys,
    nonce: [u8; NONCE_LEN],
) -> Vec<u8> {
    let mut p = vec![0; client_request_v5_len(draft, cookie.len(), placeholders)];
    let nts = NtsFields {
        unique_id,
        cookie,
        placeholders,
        keys,
        nonce,
    };
    let len = client_request_v5_into(&mut p, draft, client_cookie, &nts);
    p.truncate(len);
    p
}

/// The length of a [`client_request_v5`] naming `draft`, at most (as [`client_request_len`]).
pub fn client_request_v5_len(draft: Draft, cookie_len: usize, placeholders: usize) -> usize {
    v5::draft_field(draft).len() + client_request_len(cookie_len, placeholders)
}

/// [`client_request_v5`] written into `out` (at least [`client_request_v5_len`] bytes) without
/// allocating; returns the length written.
///
/// # Panics
/// If `out` is shorter than [`client_request_v5_len`].
pub fn client_request_v5_into(
    out: &mut [u8],
    draft: Draft,
    client_cookie: [u8; 8],
    nts: &NtsFields<'_>,
) -> usize {
    let head = v5::write_request(out, draft, 0, client_cookie, None)
        .expect("room for the header and the draft's name");
    append_nts(out, head, nts)
}

/// Writes the NTS fields after the first `at` bytes of `out` (the request's header and any
/// fields of its own): the unique identifier, the cookie, the placeholders and the authenticator
/// over everything before it. Returns the length of the whole.
fn append_nts(out: &mut [u8], mut at: usize, nts: &NtsFields<'_>) -> usize {
    let NtsFields {
        unique_id,
        cookie,
        placeholders,
        keys,
        nonce,
    } = *nts;
    let field = |out: &mut [u8], at: &mut usize, ty: u16, body: Option<&[u8]>, len: usize| {
        out[*at..*at + 2].copy_from_slice(&ty.to_be_bytes());
        out[*at + 2..*at + 4].copy_from_slice(&((4 + len) as u16).to_be_bytes());
        let room = &mut out[*at + 4..*at + 4 + len];
        match body {
            Some(b) => room.copy_from_slice(b),
            None => room.fill(0),
        }
        *at += 4 + len;
    };
    field(out, &mut at, ef::UNIQUE_IDENTIFIER, Some(unique_id), 32);
    field(out, &mut at, ef::COOKIE, Some(cookie), cookie.len());
    for _ in 0..placeholders {
        field(out, &mut at, ef::COOKIE_PLACEHOLDER, None, cookie.len());
    }
    let (aead, nonce) = (keys.aead(), &nonce[..keys.aead().nonce_len()]);
    // An empty plaintext under a key of the algorithm's own length cannot fail to encrypt.
    let tag = aead
        .seal(keys.c2s(), &out[..at], nonce, &mut [])
        .unwrap_or_default();
    let mut body = [0u8; 4 + NONCE_LEN + TAG_LEN];
    body[..2].copy_from_slice(&(nonce.len() as u16).to_be_bytes());
    body[2..4].copy_from_slice(&(TAG_LEN as u16).to_be_bytes());
    body[4..4 + nonce.len()].copy_from_slice(nonce);
    body[4 + nonce.len()..4 + nonce.len() + TAG_LEN].copy_from_slice(&tag);
    let body = &body[..4 + nonce.len() + TAG_LEN];
    field(out, &mut at, ef::AUTHENTICATOR, Some(body), body.len());
    at
}

/// The unique identifier a reply carries (the first, if it has several), for a client to find
/// which of its requests the reply answers.
pub fn reply_unique_id(reply: &[u8]) -> Option<&[u8]> {
    fields(reply)
        .find(|f| f.ty == ef::UNIQUE_IDENTIFIER)
        .map(|f| &reply[f.body])
}

/// [`reply_unique_id`] of a reply to [`client_request_v5`], its fields as v5 frames them.
pub fn reply_unique_id_v5(reply: &[u8]) -> Option<&[u8]> {
    v5::fields(reply)?
        .find(|f| f.ty == ef::UNIQUE_IDENTIFIER)
        .map(|f| f.value)
}

/// What the client makes of a reply to an NTS request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientReply {
    /// Authentic: the new cookies it carried.
    Authentic(Vec<Vec<u8>>),
    /// An NTS NAK for our identifier: the cookie was refused; run NTS-KE again.
    Nak,
}

/// Why a reply to an NTS request is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClientReplyError {
    /// No unique identifier, or not ours.
    #[error("the reply's unique identifier is missing or not ours")]
    WrongIdentifier,
    /// No authenticator (and not a NAK), or one that is malformed.
    #[error("the reply has no usable NTS authenticator")]
    NoAuthenticator,
    /// The authenticator does not verify under the server-to-client key.
    #[error("the reply's NTS authenticator does not verify")]
    Forged,
}

/// Checks a reply to our NTS request: our identifier, then either an NTS NAK (stratum 0, `NTSN`)
/// or an authenticator that verifies under the server-to-client key of `keys`, whose plaintext
/// holds new cookies.
pub fn client_check_reply(
    reply: &[u8],
    unique_id: &[u8; 32],
    keys: &Keys,
) -> Result<ClientReply, ClientReplyError> {
    let fs: Vec<Field> = fields(reply).collect();
    let is_nak = reply.len() >= Header::LEN && reply[1] == 0 && reply[offset_refid()] == *b"NTSN";
    check_fields(reply, &fs, is_nak, unique_id, keys)
}

/// [`client_check_reply`] for a reply to [`client_request_v5`]: its fields as v5 frames them, and
/// a NAK as a v5 Kiss-o'-Death with the NTS NAK flag.
pub fn client_check_reply_v5(
    reply: &[u8],
    unique_id: &[u8; 32],
    keys: &Keys,
) -> Result<ClientReply, ClientReplyError> {
    let fs: Vec<Field> = (v5::fields(reply).into_iter().flatten())
        .map(Field::from)
        .collect();
    // The v5 header's flags are its byte 15.
    let flags = reply.get(15).copied().unwrap_or(0);
    let is_nak = reply.get(1) == Some(&0) && flags & v5::flags::AUTH_NAK != 0;
    check_fields(reply, &fs, is_nak, unique_id, keys)
}

/// The checks of [`client_check_reply`] over the reply's fields `fs`, `is_nak` saying whether it is
/// an NTS NAK as its version writes one.
fn check_fields(
    reply: &[u8],
    fs: &[Field],
    is_nak: bool,
    unique_id: &[u8; 32],
    keys: &Keys,
) -> Result<ClientReply, ClientReplyError> {
    let ours = fs
        .iter()
        .any(|f| f.ty == ef::UNIQUE_IDENTIFIER && reply[f.body.clone()] == unique_id[..]);
    if !ours {
        return Err(ClientReplyError::WrongIdentifier);
    }
    let Some(auth) = fs.iter().find(|f| f.ty == ef::AUTHENTICATOR) else {
        return if is_nak {
            Ok(ClientReply::Nak)
        } else {
            Err(ClientReplyError::NoAuthenticator)
        };
    };
    // At most eight cookies of up to 256 bytes come back: 2 KiB holds them.
    let mut buf = [0u8; 2048];
    let key = (keys.aead(), keys.s2c());
    let len = open_authenticator(reply, auth, key, 1, &mut buf).map_err(|e| match e {
        Unopened::Malformed => ClientReplyError::NoAuthenticator,
        Unopened::Forged => ClientReplyError::Forged,
    })?;
    let plain = &buf[..len];
    let mut cookies = Vec::new();
    let mut at = 0;
    while at + 4 <= plain.len() {
        let ty = u16::from_be_bytes([plain[at], plain[at + 1]]);
        let len = usize::from(u16::from_be_bytes([plain[at + 2], plain[at + 3]]));
        if len < 4 || at + len > plain.len() {
            break;
        }
        if ty == ef::COOKIE {
            cookies.push(plain[at + 4..at + len].to_vec());
        }
        at += len;
    }
    Ok(ClientReply::Authentic(cookies))
}

fn offset_refid() -> Range<usize> {
    crate::packet::offset::REFERENCE_ID..crate::packet::offset::REFERENCE_TS
}
