//! Tags: the 32-bit keys of a Roughtime message.
//!
//! A tag is written on the wire as four bytes, which read as ASCII (`NONC`, `SIG\0`). Messages sort
//! tags by their little-endian `u32` value, not by their ASCII spelling, which is why the constants
//! below are given as numbers (RFC 10049 §4.1.3 and Table 2).

use core::fmt;

/// A Roughtime tag. Ordering is by the `u32` value, which is the order a message must use.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(u32);

impl Tag {
    /// Signature (Ed25519, 64 bytes).
    pub const SIG: Self = Self(0x0047_4953);
    /// Version list (request) or chosen version (response, inside SREP from draft 12 on).
    pub const VER: Self = Self(0x0052_4556);
    /// Which long-term key the client expects: `SHA-512(0xff ‖ public key)[0..32]`.
    pub const SRV: Self = Self(0x0056_5253);
    /// The client's nonce.
    pub const NONC: Self = Self(0x434e_4f4e);
    /// The delegation signed by the long-term key.
    pub const DELE: Self = Self(0x454c_4544);
    /// 0 in requests, 1 in responses (draft 14 on).
    pub const TYPE: Self = Self(0x4550_5954);
    /// Merkle path from the request's leaf to the root.
    pub const PATH: Self = Self(0x4854_4150);
    /// Radius of the time interval.
    pub const RADI: Self = Self(0x4944_4152);
    /// Online (delegated) public key.
    pub const PUBK: Self = Self(0x4b42_5550);
    /// Midpoint: the time of processing.
    pub const MIDP: Self = Self(0x5044_494d);
    /// The signed part of a response.
    pub const SREP: Self = Self(0x5045_5253);
    /// Versions the server supports (draft 12 on).
    pub const VERS: Self = Self(0x5352_4556);
    /// Start of the online key's validity.
    pub const MINT: Self = Self(0x544e_494d);
    /// Merkle tree root.
    pub const ROOT: Self = Self(0x544f_4f52);
    /// Certificate: `{SIG, DELE}`.
    pub const CERT: Self = Self(0x5452_4543);
    /// End of the online key's validity.
    pub const MAXT: Self = Self(0x5458_414d);
    /// Index of the request's leaf in the Merkle tree.
    pub const INDX: Self = Self(0x5844_4e49);
    /// Zero padding of IETF requests.
    pub const ZZZZ: Self = Self(0x5a5a_5a5a);
    /// Zero padding of Google requests, spelled `PAD\xff`.
    pub const PAD: Self = Self(0xff44_4150);
    /// Zero padding of drafts 01–07 requests, spelled `PAD\0`: it sorts before every other tag.
    pub const PAD_DRAFT: Self = Self(0x0044_4150);

    /// The tag with this `u32` value.
    pub const fn from_u32(value: u32) -> Self {
        Self(value)
    }

    /// The `u32` value, which is what messages sort by.
    pub const fn to_u32(self) -> u32 {
        self.0
    }

    /// The four bytes as they appear on the wire.
    pub const fn to_bytes(self) -> [u8; 4] {
        self.0.to_le_bytes()
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Tag {
    /// Printable ASCII as such, anything else (trailing zeros, `\xff`) escaped, so that a tag in
    /// an error message reads the way the specification spells it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.to_bytes() {
            if b.is_ascii_graphic() {
                write!(f, "{}", b as char)?;
            } else if b != 0 {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_spell_their_names() {
        let cases = [
            (Tag::SIG, *b"SIG\0"),
            (Tag::VER, *b"VER\0"),
            (Tag::SRV, *b"SRV\0"),
            (Tag::NONC, *b"NONC"),
            (Tag::DELE, *b"DELE"),
            (Tag::TYPE, *b"TYPE"),
            (Tag::PATH, *b"PATH"),
            (Tag::RADI, *b"RADI"),
            (Tag::PUBK, *b"PUBK"),
            (Tag::MIDP, *b"MIDP"),
            (Tag::SREP, *b"SREP"),
            (Tag::VERS, *b"VERS"),
            (Tag::MINT, *b"MINT"),
            (Tag::ROOT, *b"ROOT"),
            (Tag::CERT, *b"CERT"),
            (Tag::MAXT, *b"MAXT"),
            (Tag::INDX, *b"INDX"),
            (Tag::ZZZZ, *b"ZZZZ"),
            (Tag::PAD, *b"PAD\xff"),
            (Tag::PAD_DRAFT, *b"PAD\0"),
        ];
        for (tag, bytes) in cases {
            assert_eq!(tag.to_bytes(), bytes, "{tag}");
        }
    }

    #[test]
    fn order_is_numeric_not_ascii() {
        // "SIG" < "NONC" numerically because the trailing zero byte is the most significant.
        assert!(Tag::SIG < Tag::NONC);
        assert!(Tag::VER < Tag::NONC);
        assert!(Tag::NONC < Tag::PAD);
        assert!(Tag::PAD_DRAFT < Tag::SIG && Tag::SIG < Tag::VER);
    }

    #[test]
    fn display_escapes() {
        assert_eq!(Tag::SIG.to_string(), "SIG");
        assert_eq!(Tag::PAD.to_string(), "PAD\\xff");
        assert_eq!(
            Tag::from_u32(0x0102_0304).to_string(),
            "\\x04\\x03\\x02\\x01"
        );
    }
}
