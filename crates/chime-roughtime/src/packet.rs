//! Packet framing: the IETF `ROUGHTIM` header, or none for Google's original protocol.
//!
//! IETF packets (draft 05 on, RFC 10049 §5) are `ROUGHTIM`, a `u32` message length, then the
//! message. Google's original sends the bare message. The two are told apart by the first eight
//! bytes: read as a Google message, `ROUG` would be a tag count of about 1.2 billion, which no
//! datagram can hold.

use crate::codec::{Reader, Writer};
use crate::error::{DecodeError, EncodeError};

/// The magic that starts every IETF packet: the `u64` 0x4d49544847554f52, `ROUGHTIM` in ASCII.
pub(crate) const MAGIC: [u8; 8] = 0x4d49_5448_4755_4f52u64.to_le_bytes();

/// Bytes of the IETF header: magic plus the `u32` length.
pub(crate) const FRAME_HEADER_LEN: usize = 12;

/// How a packet is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// `ROUGHTIM` + length + message: every IETF draft from 05 on and RFC 10049.
    Ietf,
    /// The bare message: Google's original protocol.
    Google,
}

/// A datagram split into its framing and the message it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Packet<'a> {
    /// How the datagram was framed.
    pub framing: Framing,
    /// The message, without the header.
    pub message: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Splits a datagram. An IETF header must declare exactly the bytes that follow it.
    pub(crate) fn parse(datagram: &'a [u8]) -> Result<Self, DecodeError> {
        if datagram.get(..MAGIC.len()) != Some(&MAGIC[..]) {
            return Ok(Self {
                framing: Framing::Google,
                message: datagram,
            });
        }
        let mut r = Reader::new(datagram);
        let short = DecodeError::ShortFrame {
            len: datagram.len(),
        };
        r.take(MAGIC.len()).ok_or(short)?;
        let declared = r.u32().ok_or(short)?;
        let message = r.rest();
        if declared as usize != message.len() {
            return Err(DecodeError::FrameLength {
                declared,
                actual: message.len(),
            });
        }
        Ok(Self {
            framing: Framing::Ietf,
            message,
        })
    }
}

/// Writes the 12-byte IETF header for a message of `message_len` bytes.
pub(crate) fn write_frame_header(
    w: &mut Writer<'_>,
    message_len: usize,
) -> Result<(), EncodeError> {
    let len = u32::try_from(message_len).map_err(|_| EncodeError::TooLarge { len: message_len })?;
    w.put(&MAGIC)?;
    w.put_u32(len)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_spells_roughtim() {
        assert_eq!(&MAGIC, b"ROUGHTIM");
    }

    #[test]
    fn splits_ietf_and_google() {
        let mut buf = [0u8; 16];
        let mut w = Writer::new(&mut buf);
        write_frame_header(&mut w, 4).unwrap();
        let p = Packet::parse(&buf).unwrap();
        assert_eq!(p.framing, Framing::Ietf);
        assert_eq!(p.message, &[0; 4]);

        let g = Packet::parse(&[0; 8]).unwrap();
        assert_eq!(g.framing, Framing::Google);
        assert_eq!(g.message.len(), 8);
    }

    #[test]
    fn rejects_wrong_lengths() {
        assert_eq!(
            Packet::parse(b"ROUGHTIM\x04\x00").unwrap_err(),
            DecodeError::ShortFrame { len: 10 }
        );
        assert_eq!(
            Packet::parse(b"ROUGHTIM\x04\x00\x00\x00\x00\x00\x00\x00\x00").unwrap_err(),
            DecodeError::FrameLength {
                declared: 4,
                actual: 5
            }
        );
        assert_eq!(
            Packet::parse(b"ROUGHTIM\x08\x00\x00\x00\x00\x00\x00\x00").unwrap_err(),
            DecodeError::FrameLength {
                declared: 8,
                actual: 4
            }
        );
    }
}
