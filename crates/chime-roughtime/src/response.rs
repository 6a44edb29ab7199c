//! Responses: reading one into a borrowed view of every field a client checks.
//!
//! [`Reply::parse`] accepts the layout of every version (Google's unframed replies without NONC,
//! drafts 08–11 with a top-level VER, draft 12 on with VER and VERS inside SREP) and checks only
//! syntax and fixed sizes. Which of those a given reply must have, and everything cryptographic,
//! is `client`'s job.

use crate::error::DecodeError;
use crate::keys::{KEY_LEN, SIGNATURE_LEN};
use crate::message::Message;
use crate::packet::{Framing, Packet};
use crate::tag::Tag;

/// A response as received, borrowing the datagram.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    /// How the datagram was framed.
    pub framing: Framing,
    /// The whole datagram (chaining hashes it).
    pub packet: &'a [u8],
    /// The parsed top-level message.
    pub message: Message<'a>,
    /// SIG: the online key's signature over SREP.
    pub signature: &'a [u8; SIGNATURE_LEN],
    /// NONC, if present (absent in Google's replies).
    pub nonce: Option<&'a [u8]>,
    /// TYPE, if present (1 in a response, from draft 14 on).
    pub type_value: Option<u32>,
    /// The top-level VER value, if present (drafts 08–11 put the version there, unsigned).
    pub top_version: Option<&'a [u8]>,
    /// PATH: sibling hashes from the request's leaf to the root.
    pub path: &'a [u8],
    /// INDX: the request's leaf index.
    pub index: u32,
    /// SREP, the signed part.
    pub srep: Srep<'a>,
    /// CERT, the delegation.
    pub cert: Cert<'a>,
}

/// The signed response, SREP.
#[derive(Debug, Clone, Copy)]
pub struct Srep<'a> {
    /// The encoded value, as signed.
    pub bytes: &'a [u8],
    /// VER inside SREP (draft 12 on), as sent.
    pub version: Option<&'a [u8]>,
    /// VERS (draft 12 on), as sent.
    pub versions: Option<&'a [u8]>,
    /// RADI, in the version's unit (seconds; Google microseconds).
    pub radius: u32,
    /// MIDP, in the version's unit.
    pub midpoint: u64,
    /// ROOT: 32 bytes, or 64 for Google.
    pub root: &'a [u8],
}

/// The certificate, CERT, with its delegation DELE.
#[derive(Debug, Clone, Copy)]
pub struct Cert<'a> {
    /// The long-term key's signature over DELE.
    pub signature: &'a [u8; SIGNATURE_LEN],
    /// The encoded DELE value, as signed.
    pub dele: &'a [u8],
    /// PUBK: the online public key.
    pub online_key: &'a [u8; KEY_LEN],
    /// MINT, in the version's unit.
    pub mint: u64,
    /// MAXT, in the version's unit.
    pub maxt: u64,
}

impl<'a> Reply<'a> {
    /// Reads a datagram as a response. Unknown tags are ignored.
    pub fn parse(datagram: &'a [u8]) -> Result<Self, DecodeError> {
        let packet = Packet::parse(datagram)?;
        let message = Message::parse(packet.message)?;

        let srep_msg = message.nested(Tag::SREP)?;
        let srep = Srep {
            bytes: message.require(Tag::SREP)?,
            version: srep_msg.get(Tag::VER),
            versions: srep_msg.get(Tag::VERS),
            radius: srep_msg.u32(Tag::RADI)?,
            midpoint: srep_msg.u64(Tag::MIDP)?,
            root: srep_msg.require(Tag::ROOT)?,
        };

        let cert_msg = message.nested(Tag::CERT)?;
        let dele_msg = cert_msg.nested(Tag::DELE)?;
        let cert = Cert {
            signature: cert_msg.fixed::<SIGNATURE_LEN>(Tag::SIG)?,
            dele: cert_msg.require(Tag::DELE)?,
            online_key: dele_msg.fixed::<KEY_LEN>(Tag::PUBK)?,
            mint: dele_msg.u64(Tag::MINT)?,
            maxt: dele_msg.u64(Tag::MAXT)?,
        };

        let type_value = match message.get(Tag::TYPE) {
            Some(_) => Some(message.u32(Tag::TYPE)?),
            None => None,
        };
        Ok(Self {
            framing: packet.framing,
            packet: datagram,
            message,
            signature: message.fixed::<SIGNATURE_LEN>(Tag::SIG)?,
            nonce: message.get(Tag::NONC),
            type_value,
            top_version: message.get(Tag::VER),
            path: message.require(Tag::PATH)?,
            index: message.u32(Tag::INDX)?,
            srep,
            cert,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_what_is_missing() {
        // A framed message with only SIG.
        let mut bytes = b"ROUGHTIM".to_vec();
        bytes.extend_from_slice(&72u32.to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&Tag::SIG.to_bytes());
        bytes.extend_from_slice(&[0; 64]);
        assert_eq!(
            Reply::parse(&bytes).unwrap_err(),
            DecodeError::MissingTag { tag: Tag::SREP }
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Reply::parse(&bytes);
            let mut framed = b"ROUGHTIM".to_vec();
            framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            framed.extend_from_slice(&bytes);
            let _ = Reply::parse(&framed);
        }
    }
}
