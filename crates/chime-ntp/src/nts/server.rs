//! The server's side of an NTS request: its extension fields checked, its cookie opened, its
//! authenticator verified, and the reply (fresh cookies, sealed under the client's key) or the NAK
//! written into the caller's buffer.

use std::ops::Range;

use super::cookies::{Cookie, CookieKeys, Keys, NakReason, cookie_len};
use super::fields::{Field, fields, open_authenticator};
use super::record::Protocol;
use super::{MAX_COOKIES, MIN_UNIQUE_ID, NONCE_LEN, TAG_LEN, ef};
use crate::packet::Header;
use crate::responder::kiss_of_death;

/// A request that passed NTS: what the reply needs.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The association's keys, from the cookie.
    pub keys: Keys,
    /// The unique identifier field's body, to echo.
    unique_id: Range<usize>,
    /// Cookies to return: the one spent plus one per placeholder, at most 8.
    cookies: usize,
}

/// What NTS makes of a request.
#[derive(Debug, Clone)]
pub enum Check {
    /// No NTS fields: an ordinary request.
    NotNts,
    /// Authentic: answer with [`write_response`].
    Verified(Verified),
    /// The cookie did not open, or serves another protocol, or the authenticator did not verify:
    /// answer with [`write_nak`] (the unique identifier's body is at this range). Why, for the
    /// server's counts.
    Nak(Range<usize>, NakReason),
    /// NTS fields that are not a valid request (no identifier, two cookies, the authenticator
    /// not last, ...): drop.
    Malformed,
}

/// Checks the NTS fields of an NTPv4 client request that [`crate::respond`] accepted.
pub fn check_request(request: &[u8], cookie_keys: &CookieKeys) -> Check {
    check_fields(request, cookie_keys, Protocol::NtpV4, fields(request))
}

/// Checks the NTS fields of an NTPv5 request that [`crate::v5::accept`] accepted: the same rules
/// as [`check_request`], over v5's fields (whose lengths leave out their padding).
pub fn check_request_v5(request: &[u8], cookie_keys: &CookieKeys) -> Check {
    let Some(v5_fields) = crate::v5::fields(request) else {
        return Check::Malformed;
    };
    check_fields(
        request,
        cookie_keys,
        Protocol::NtpV5Draft,
        v5_fields.map(Field::from),
    )
}

/// The checks of [`check_request`] over a request of `protocol`'s `fields`, however they are
/// framed. A cookie of keys exported for the other protocol gets a NAK, as one that does not open:
/// RFC 8915 §5.1 keeps each protocol's keys apart.
fn check_fields(
    request: &[u8],
    cookie_keys: &CookieKeys,
    protocol: Protocol,
    fields: impl Iterator<Item = Field>,
) -> Check {
    let mut unique_id = None;
    let mut cookie = None;
    let mut wanted = 0usize;
    let mut cookie_len = None;
    let mut auth = None;
    let mut any = false;
    for f in fields {
        match f.ty {
            ef::UNIQUE_IDENTIFIER => {
                any = true;
                if unique_id.is_some() || f.body.len() < MIN_UNIQUE_ID {
                    return Check::Malformed;
                }
                unique_id = Some(f.body.clone());
            }
            ef::COOKIE | ef::COOKIE_PLACEHOLDER => {
                any = true;
                if f.ty == ef::COOKIE {
                    if cookie.is_some() {
                        return Check::Malformed;
                    }
                    cookie = Some(f.body.clone());
                }
                // Placeholders are as long as the cookie: the room its replacement takes.
                if *cookie_len.get_or_insert(f.body.len()) != f.body.len() {
                    return Check::Malformed;
                }
                wanted += 1;
            }
            ef::AUTHENTICATOR => {
                any = true;
                if f.body.end != request.len() {
                    return Check::Malformed;
                }
                auth = Some(f);
            }
            _ => {}
        }
    }
    if !any {
        return Check::NotNts;
    }
    let (Some(unique_id), Some(cookie), Some(auth)) = (unique_id, cookie, auth) else {
        return Check::Malformed;
    };
    let keys = match cookie_keys.open_or_why(&request[cookie]) {
        Ok(keys) => keys,
        Err(why) => return Check::Nak(unique_id, why),
    };
    if keys.protocol() != protocol {
        return Check::Nak(unique_id, NakReason::OtherProtocol);
    }
    if !authentic(request, &auth, &keys) {
        return Check::Nak(unique_id, NakReason::Forged);
    }
    Check::Verified(Verified {
        keys,
        unique_id,
        cookies: wanted.min(MAX_COOKIES),
    })
}

/// Whether the authenticator field `auth` (the request's last) verifies under the client-to-server
/// key, over every byte before it. Encrypted fields inside it are not used (chime needs none) but
/// must authenticate too; at most 1 KiB of them is checked, anything longer is refused.
fn authentic(request: &[u8], auth: &Field, keys: &Keys) -> bool {
    let mut plain = [0u8; 1024];
    open_authenticator(
        request,
        auth,
        (keys.aead(), keys.c2s()),
        NONCE_LEN,
        &mut plain,
    )
    .is_ok()
}

/// Completes the reply to a [`Check::Verified`] request: `reply` holds the 48-byte header made
/// by [`crate::respond`], with its transmit timestamp already stamped (the authenticator covers
/// it), and is as long as the request. Appends the echoed identifier and an authenticator under
/// the server-to-client key holding fresh cookies, made by `new_cookie`, as many as were spent
/// or asked for and fit; pads the authenticator so the reply is exactly as long as the request.
/// `nonce` must be fresh random bits (AES-GCM-SIV takes the first 12). Returns the reply's
/// length, or `None` if not even the identifier and an authenticator without cookies fit (then
/// drop).
pub fn write_response(
    reply: &mut [u8],
    request: &[u8],
    verified: &Verified,
    nonce: [u8; NONCE_LEN],
    new_cookie: impl FnMut() -> Cookie,
) -> Option<usize> {
    seal_reply(reply, request, verified, nonce, new_cookie, &[])
}

/// Completes the reply to a [`Check::Verified`] NTPv5 request as [`write_response`] does an
/// NTPv4 one: `reply` holds the v5 header ([`crate::v5::write_header`]), stamped. After the
/// echoed identifier comes the Draft Identification naming `draft`, authenticated with the rest;
/// the authenticator is padded so that the reply is exactly as long as the request.
pub fn write_response_v5(
    reply: &mut [u8],
    request: &[u8],
    verified: &Verified,
    draft: crate::v5::Draft,
    nonce: [u8; NONCE_LEN],
    new_cookie: impl FnMut() -> Cookie,
) -> Option<usize> {
    let draft = crate::v5::draft_field(draft);
    seal_reply(reply, request, verified, nonce, new_cookie, &draft)
}

/// The identifier, then `extra` (whole fields), then the authenticator with the cookies: the
/// body of both versions' replies. The identifier's field is padded to 4 bytes, as v5 frames it
/// (in v4 it always is).
fn seal_reply(
    reply: &mut [u8],
    request: &[u8],
    verified: &Verified,
    nonce: [u8; NONCE_LEN],
    mut new_cookie: impl FnMut() -> Cookie,
    extra: &[u8],
) -> Option<usize> {
    let aead = verified.keys.aead();
    let nonce = &nonce[..aead.nonce_len()];
    let target = request.len().min(reply.len());
    let uid = &request[verified.unique_id.clone()];
    let uid_field = 4 + uid.len();
    let extra_at = Header::LEN + uid_field.next_multiple_of(4);
    let auth_start = extra_at + extra.len();
    let cookie_field = 4 + cookie_len(aead);
    // Authenticator without cookies: header 4, lengths 4, nonce, tag 16.
    let auth_min = 4 + 4 + nonce.len() + TAG_LEN;
    let room = target.checked_sub(auth_start + auth_min)?;
    let cookies = verified.cookies.min(room / cookie_field);
    let plain_len = cookies * cookie_field;
    let auth_len = target - auth_start;

    put_unique_id(reply, uid);
    reply[extra_at..auth_start].copy_from_slice(extra);

    put_field_header(reply, auth_start, ef::AUTHENTICATOR, auth_len);
    let lengths = auth_start + 4;
    reply[lengths..lengths + 2].copy_from_slice(&(nonce.len() as u16).to_be_bytes());
    reply[lengths + 2..lengths + 4].copy_from_slice(&((TAG_LEN + plain_len) as u16).to_be_bytes());
    let nonce_at = lengths + 4;
    reply[nonce_at..nonce_at + nonce.len()].copy_from_slice(nonce);
    // The ciphertext and its tag, in the order the algorithm gives them.
    let ct_at = nonce_at + nonce.len();
    let (plain_at, tag_at) = match aead.tag_first() {
        true => (ct_at + TAG_LEN, ct_at),
        false => (ct_at, ct_at + plain_len),
    };
    for i in 0..cookies {
        let at = plain_at + i * cookie_field;
        put_field_header(reply, at, ef::COOKIE, cookie_field);
        reply[at + 4..at + cookie_field].copy_from_slice(new_cookie().as_bytes());
    }
    // Padding to the request's length, inside the authenticator, after the ciphertext.
    reply[ct_at + TAG_LEN + plain_len..target].fill(0);

    let (ad, rest) = reply.split_at_mut(auth_start);
    let plain = &mut rest[plain_at - auth_start..plain_at - auth_start + plain_len];
    let tag = aead.seal(verified.keys.s2c(), ad, nonce, plain)?;
    reply[tag_at..tag_at + TAG_LEN].copy_from_slice(&tag);
    Some(target)
}

/// Turns `reply` (a header made by [`crate::respond`]) into an NTS NAK: a Kiss-o'-Death `NTSN`
/// with the request's unique identifier (at `unique_id` in `request`) and nothing else. Returns
/// its length, or `None` if the buffer cannot hold it.
pub fn write_nak(reply: &mut [u8], request: &[u8], unique_id: Range<usize>) -> Option<usize> {
    let uid = request.get(unique_id)?;
    let len = Header::LEN + 4 + uid.len();
    if len > reply.len() {
        return None;
    }
    kiss_of_death(reply, *b"NTSN");
    put_field_header(reply, Header::LEN, ef::UNIQUE_IDENTIFIER, 4 + uid.len());
    reply[Header::LEN + 4..len].copy_from_slice(uid);
    Some(len)
}

/// Turns `reply` (a header made by [`crate::v5::write_header`]) into an NTPv5 NTS NAK: a
/// Kiss-o'-Death with the NTS NAK flag, the request's unique identifier (at `unique_id` in
/// `request`) and the Draft Identification naming `draft`. Returns its length, or `None` if the
/// buffer cannot hold it.
pub fn write_nak_v5(
    reply: &mut [u8],
    request: &[u8],
    unique_id: Range<usize>,
    draft: crate::v5::Draft,
) -> Option<usize> {
    let uid = request.get(unique_id)?;
    let uid_field = 4 + uid.len();
    let draft_at = Header::LEN + uid_field.next_multiple_of(4);
    let draft = crate::v5::draft_field(draft);
    let len = draft_at + draft.len();
    if len > reply.len() {
        return None;
    }
    crate::v5::nts_nak(reply);
    put_unique_id(reply, uid);
    reply[draft_at..len].copy_from_slice(&draft);
    Some(len)
}

/// The reply's first field after the header, the request's unique identifier `uid`, zero-padded
/// to 4 bytes as v5 frames it (a v4 identifier needs none); the caller checked that it fits.
fn put_unique_id(reply: &mut [u8], uid: &[u8]) {
    let end = Header::LEN + 4 + uid.len();
    put_field_header(reply, Header::LEN, ef::UNIQUE_IDENTIFIER, 4 + uid.len());
    reply[Header::LEN + 4..end].copy_from_slice(uid);
    reply[end..end.next_multiple_of(4)].fill(0);
}

pub(super) fn put_field_header(buf: &mut [u8], at: usize, ty: u16, len: usize) {
    buf[at..at + 2].copy_from_slice(&ty.to_be_bytes());
    buf[at + 2..at + 4].copy_from_slice(&(len as u16).to_be_bytes());
}
