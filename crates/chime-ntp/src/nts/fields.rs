//! NTS's extension fields in an NTP packet, as the server reads a request's and the client a
//! reply's: the fields after the header, and the authenticator opened under a key.

use std::ops::Range;

use super::TAG_LEN;
use super::aead::Aead;
use crate::packet::Header;

/// One extension field of a request: its type, where its body is, and where it starts.
#[derive(Clone, Debug)]
pub(crate) struct Field {
    pub(crate) ty: u16,
    pub(crate) start: usize,
    pub(crate) body: Range<usize>,
}

impl From<crate::v5::Field<'_>> for Field {
    /// A v5 field, its body without the padding v5 leaves out of its length.
    fn from(f: crate::v5::Field<'_>) -> Self {
        Self {
            ty: f.ty,
            start: f.start,
            body: f.start + 4..f.start + 4 + f.value.len(),
        }
    }
}

/// The extension fields after the header, as `check_extensions` accepted them: a remainder of 20
/// or 24 bytes is a MAC, not a field.
pub(crate) fn fields(packet: &[u8]) -> impl Iterator<Item = Field> + '_ {
    let mut at = Header::LEN;
    std::iter::from_fn(move || {
        let remaining = packet.len().checked_sub(at)?;
        if remaining < 16 || remaining == 20 || remaining == 24 {
            return None;
        }
        let ty = u16::from_be_bytes([packet[at], packet[at + 1]]);
        let len = usize::from(u16::from_be_bytes([packet[at + 2], packet[at + 3]]));
        if len < 16 || len > remaining || len % 4 != 0 {
            return None;
        }
        let field = Field {
            ty,
            start: at,
            body: at + 4..at + len,
        };
        at += len;
        Some(field)
    })
}

/// Why an authenticator field did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unopened {
    /// Its lengths do not fit the field, the nonce is not one the algorithm takes (for AES-SIV,
    /// shorter than `min_siv_nonce`), or the plaintext is longer than the buffer.
    Malformed,
    /// It does not verify under the key.
    Forged,
}

/// Opens the authenticator field `auth` of `packet` under `key` of algorithm `aead`: nonce and
/// ciphertext lengths, the nonce and the ciphertext with its tag (each padded to 4 bytes), with
/// every byte of `packet` before the field as associated data. The plaintext goes to the start of
/// `plain`; its length is returned. Shared by the server (requests) and the client (replies).
pub(crate) fn open_authenticator(
    packet: &[u8],
    auth: &Field,
    (aead, key): (Aead, &[u8]),
    min_siv_nonce: usize,
    plain: &mut [u8],
) -> Result<usize, Unopened> {
    let body = &packet[auth.body.clone()];
    if body.len() < 4 {
        return Err(Unopened::Malformed);
    }
    let nonce_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let ct_len = usize::from(u16::from_be_bytes([body[2], body[3]]));
    let padded = |n: usize| n.div_ceil(4) * 4;
    if !aead.takes_nonce(nonce_len, min_siv_nonce)
        || ct_len < TAG_LEN
        || 4 + padded(nonce_len) + padded(ct_len) > body.len()
    {
        return Err(Unopened::Malformed);
    }
    let nonce = &body[4..4 + nonce_len];
    let ct = &body[4 + padded(nonce_len)..4 + padded(nonce_len) + ct_len];
    let (tag, sealed) = match aead.tag_first() {
        true => ct.split_at(TAG_LEN),
        false => {
            let (sealed, tag) = ct.split_at(ct_len - TAG_LEN);
            (tag, sealed)
        }
    };
    let plain = plain.get_mut(..sealed.len()).ok_or(Unopened::Malformed)?;
    plain.copy_from_slice(sealed);
    let tag = tag.try_into().map_err(|_| Unopened::Malformed)?;
    match aead.open(key, &packet[..auth.start], nonce, plain, tag) {
        true => Ok(plain.len()),
        false => Err(Unopened::Forged),
    }
}
