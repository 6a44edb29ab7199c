//! Where each value of a reply sits: what the server writes by, and what grease corrupts by.

use crate::keys::{CERT_LEN, SIGNATURE_LEN};
use crate::message::header_len;
use crate::packet::FRAME_HEADER_LEN;
use crate::version::Family;

/// Where each value of a reply starts, in the order the server writes them (tags sorted by
/// value): Google's SIG PATH SREP CERT INDX; drafts 07–11's SIG VER NONC PATH SREP CERT INDX,
/// framed; from draft 12 on SIG NONC TYPE PATH SREP CERT INDX, framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplyLayout {
    pub(crate) sig: usize,
    /// Google's replies carry no nonce.
    pub(crate) nonce: Option<usize>,
    pub(crate) path: usize,
    pub(crate) srep: usize,
    pub(crate) cert: usize,
    pub(crate) indx: usize,
    pub(crate) len: usize,
}

impl ReplyLayout {
    pub(crate) const fn new(family: Family, path_len: usize, srep_len: usize) -> Self {
        let framed = FRAME_HEADER_LEN + header_len(7);
        let (sig, nonce, path) = match family {
            Family::Google => (header_len(5), None, header_len(5) + SIGNATURE_LEN),
            Family::Draft07 | Family::Draft08 => {
                let nonce = framed + SIGNATURE_LEN + 4;
                (framed, Some(nonce), nonce + family.nonce_len())
            }
            Family::Draft12 | Family::Rfc => {
                let nonce = framed + SIGNATURE_LEN;
                (framed, Some(nonce), nonce + family.nonce_len() + 4)
            }
        };
        let srep = path + path_len;
        let cert = srep + srep_len;
        let indx = cert + CERT_LEN;
        Self {
            sig,
            nonce,
            path,
            srep,
            cert,
            indx,
            len: indx + 4,
        }
    }
}
