//! The NTP packet: the fixed 48-byte header (RFC 5905 §7.3) and the walk over what may follow it
//! (RFC 7822 extension fields and a legacy MAC).
//!
//! The mirror and the `chime ntp` client decode replies with [`Header::parse`]. The responder reads
//! requests and writes replies at fixed offsets itself, laid out exactly as [`Header::encode`]
//! does.

use crate::time::{NtpShort, NtpTimestamp};

/// The smallest extension field RFC 7822 allows.
const MIN_EXTENSION_FIELD_LEN: usize = 16;

/// A legacy MAC after the header or the extension fields: a 4-byte key ID and an MD5 digest.
const MAC_LEN_MD5: usize = 4 + 16;

/// A legacy MAC with a SHA-1 digest, the longest RFC 7822 allows in NTPv4, which is what makes
/// a MAC distinguishable from an extension field.
const MAC_LEN_SHA1: usize = 4 + 20;

/// The leap indicator: a warning of a leap second at the end of the current UTC day, or the
/// "clock unsynchronised" alarm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Leap {
    /// No leap second pending.
    NoWarning = 0,
    /// The last minute of the day has 61 seconds.
    AddSecond = 1,
    /// The last minute of the day has 59 seconds.
    DelSecond = 2,
    /// The clock is not synchronised: clients must not use the time.
    Unsynchronised = 3,
}

impl Leap {
    /// The leap indicator in the top two bits of the packet's first byte.
    pub const fn from_first_byte(byte: u8) -> Self {
        match byte >> 6 {
            0 => Self::NoWarning,
            1 => Self::AddSecond,
            2 => Self::DelSecond,
            _ => Self::Unsynchronised,
        }
    }
}

/// The association mode, the low three bits of the packet's first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Mode {
    /// Mode 0: reserved in NTPv2–v4; NTPv1 had no mode field and sent zero.
    Reserved = 0,
    /// Mode 1: a symmetric peer offering to synchronise with us (old Windows clients send it).
    SymmetricActive = 1,
    /// Mode 2: the reply to symmetric active.
    SymmetricPassive = 2,
    /// Mode 3: a client request.
    Client = 3,
    /// Mode 4: a server reply.
    Server = 4,
    /// Mode 5: broadcast.
    Broadcast = 5,
    /// Mode 6: NTP control messages (ntpq).
    Control = 6,
    /// Mode 7: ntpd's private mode (ntpdc, the `monlist` amplification vector).
    Private = 7,
}

impl Mode {
    /// The mode in the low three bits of the packet's first byte.
    pub const fn from_first_byte(byte: u8) -> Self {
        match byte & 0x07 {
            0 => Self::Reserved,
            1 => Self::SymmetricActive,
            2 => Self::SymmetricPassive,
            3 => Self::Client,
            4 => Self::Server,
            5 => Self::Broadcast,
            6 => Self::Control,
            _ => Self::Private,
        }
    }
}

/// The fixed 48-byte NTP header, decoded field by field.
///
/// Decoding is total: every 48-byte pattern is a `Header` and re-encodes to the same bytes, so
/// validity (version, mode, stratum) is the caller's judgement, not the codec's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Leap indicator.
    pub leap: Leap,
    /// Protocol version, 0–7 on the wire (1–4 are meaningful). Encoding keeps the low three bits.
    pub version: u8,
    /// Association mode.
    pub mode: Mode,
    /// Stratum: 0 unspecified or kiss-o'-death, 1 primary, 2–15 secondary, 16 unsynchronised.
    pub stratum: u8,
    /// Poll interval, log2 seconds.
    pub poll: i8,
    /// Precision of the sender's clock, log2 seconds.
    pub precision: i8,
    /// Round-trip delay to the primary reference.
    pub root_delay: NtpShort,
    /// Error bound relative to the primary reference.
    pub root_dispersion: NtpShort,
    /// Reference ID: an IPv4 address, a hash of an IPv6 address, an ASCII reference-clock name or
    /// (stratum 0) a kiss code.
    pub reference_id: [u8; 4],
    /// When the sender's clock was last set or corrected.
    pub reference_ts: NtpTimestamp,
    /// The request's transmit timestamp, echoed in a reply (T1).
    pub origin_ts: NtpTimestamp,
    /// When the request arrived at the server (T2).
    pub receive_ts: NtpTimestamp,
    /// When the packet left its sender (T3 in a reply).
    pub transmit_ts: NtpTimestamp,
}

impl Header {
    /// The header's length on the wire.
    pub const LEN: usize = 48;

    /// A request as a client sends it: `mode` (client, or symmetric active), every field zero
    /// except the transmit timestamp, which the server echoes as the origin timestamp. Clients
    /// that keep T1 to themselves (chrony's, ours) send a random value there: it tells the server
    /// nothing about our clock and makes a spoofed reply a 64-bit guess.
    pub fn request(version: u8, mode: Mode, transmit_ts: NtpTimestamp) -> Self {
        Self {
            leap: Leap::NoWarning,
            version,
            mode,
            stratum: 0,
            poll: 0,
            precision: 0,
            root_delay: NtpShort(0),
            root_dispersion: NtpShort(0),
            reference_id: [0; 4],
            reference_ts: NtpTimestamp::ZERO,
            origin_ts: NtpTimestamp::ZERO,
            receive_ts: NtpTimestamp::ZERO,
            transmit_ts,
        }
    }

    /// Decodes the first 48 bytes of `bytes`; anything after them (extension fields, a MAC) is
    /// left for [`check_extensions`].
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let Some(b) = bytes.first_chunk::<{ Self::LEN }>() else {
            return Err(ParseError::TooShort { len: bytes.len() });
        };
        Ok(Self {
            leap: Leap::from_first_byte(b[offset::LVM]),
            version: version_of(b[offset::LVM]),
            mode: Mode::from_first_byte(b[offset::LVM]),
            stratum: b[offset::STRATUM],
            poll: b[offset::POLL] as i8,
            precision: b[offset::PRECISION] as i8,
            root_delay: NtpShort::from_bits(array_at(b, offset::ROOT_DELAY)),
            root_dispersion: NtpShort::from_bits(array_at(b, offset::ROOT_DISPERSION)),
            reference_id: array_at(b, offset::REFERENCE_ID),
            reference_ts: NtpTimestamp::from_bits(array_at(b, offset::REFERENCE_TS)),
            origin_ts: NtpTimestamp::from_bits(array_at(b, offset::ORIGIN_TS)),
            receive_ts: NtpTimestamp::from_bits(array_at(b, offset::RECEIVE_TS)),
            transmit_ts: NtpTimestamp::from_bits(array_at(b, offset::TRANSMIT_TS)),
        })
    }

    /// Encodes the header into `out`. A `version` above 7 does not fit its three bits and is
    /// masked.
    pub fn encode(&self, out: &mut [u8; 48]) {
        debug_assert!(
            self.version <= 7,
            "NTP version {} does not fit 3 bits",
            self.version
        );
        out[offset::LVM] = first_byte(self.leap, self.version, self.mode);
        out[offset::STRATUM] = self.stratum;
        out[offset::POLL] = self.poll as u8;
        out[offset::PRECISION] = self.precision as u8;
        put(out, offset::ROOT_DELAY, self.root_delay.to_bits());
        put(out, offset::ROOT_DISPERSION, self.root_dispersion.to_bits());
        put(out, offset::REFERENCE_ID, self.reference_id);
        put(out, offset::REFERENCE_TS, self.reference_ts.to_bits());
        put(out, offset::ORIGIN_TS, self.origin_ts.to_bits());
        put(out, offset::RECEIVE_TS, self.receive_ts.to_bits());
        put(out, offset::TRANSMIT_TS, self.transmit_ts.to_bits());
    }
}

/// Why bytes could not be decoded as an NTP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer bytes than the 48-byte header.
    #[error("NTP packet of {len} bytes is shorter than the 48-byte header")]
    TooShort {
        /// The length received.
        len: usize,
    },
}

/// Checks that what follows an NTPv4 header is a sequence of well-formed RFC 7822 extension fields,
/// optionally ending in a legacy MAC. The contents of the fields are not looked at: unknown but
/// well-formed fields are fine, as they are for chronyd.
///
/// The rules are chronyd's (4.3, `parse_packet` and `NEF_ParseField`), which make the parse
/// deterministic as RFC 7822 intends:
/// - the length after the header is a multiple of 4;
/// - wherever exactly 20 (key ID + MD5) or 24 (key ID + SHA-1) bytes remain, they are the MAC;
/// - otherwise at least 28 bytes must remain, and the field there has a length of at least 16, a
///   multiple of 4, within what remains. So the last field of a packet without a MAC is at least
///   28 bytes, as RFC 7822 requires.
///
/// Offsets in the error are relative to the start of `after_header`.
pub fn check_extensions(after_header: &[u8]) -> Result<(), ExtensionError> {
    if !after_header.len().is_multiple_of(4) {
        return Err(ExtensionError::Misaligned {
            len: after_header.len(),
        });
    }
    let mut offset = 0;
    loop {
        let rest = &after_header[offset..];
        match rest.len() {
            0 | MAC_LEN_MD5 | MAC_LEN_SHA1 => return Ok(()),
            remaining if remaining <= MAC_LEN_SHA1 => {
                return Err(ExtensionError::Leftover { offset, remaining });
            }
            remaining => {
                // At least 28 bytes remain, so the 4-byte field header is there.
                let length = u16::from_be_bytes([rest[2], rest[3]]);
                let len = usize::from(length);
                if len < MIN_EXTENSION_FIELD_LEN {
                    return Err(ExtensionError::FieldTooShort { offset, length });
                }
                if len % 4 != 0 {
                    return Err(ExtensionError::FieldMisaligned { offset, length });
                }
                if len > remaining {
                    return Err(ExtensionError::FieldOverrun {
                        offset,
                        length,
                        remaining,
                    });
                }
                offset += len;
            }
        }
    }
}

/// Why the bytes after an NTPv4 header are not well-formed extension fields and MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExtensionError {
    /// The bytes after the header are not a whole number of 32-bit words.
    #[error("{len} bytes after the NTP header are not a multiple of 4")]
    Misaligned {
        /// Bytes after the header.
        len: usize,
    },
    /// Too few bytes remain for an extension field, and not the 20 or 24 of a MAC.
    #[error(
        "{remaining} bytes at offset {offset} after the NTP header are neither a MAC (20 or 24 \
         bytes) nor an extension field (at least 28 bytes when last)"
    )]
    Leftover {
        /// Where the leftover bytes start.
        offset: usize,
        /// How many there are.
        remaining: usize,
    },
    /// An extension field's length is below the minimum of 16.
    #[error("extension field at offset {offset} has length {length}, below the minimum of 16")]
    FieldTooShort {
        /// Where the field starts.
        offset: usize,
        /// Its length field.
        length: u16,
    },
    /// An extension field's length is not a multiple of 4.
    #[error("extension field at offset {offset} has length {length}, not a multiple of 4")]
    FieldMisaligned {
        /// Where the field starts.
        offset: usize,
        /// Its length field.
        length: u16,
    },
    /// An extension field claims more bytes than remain in the packet.
    #[error("extension field at offset {offset} has length {length}, but only {remaining} remain")]
    FieldOverrun {
        /// Where the field starts.
        offset: usize,
        /// Its length field.
        length: u16,
        /// Bytes left from `offset` to the end of the packet.
        remaining: usize,
    },
}

/// Checks that what follows an NTPv1–v3 header is nothing or a MAC. These versions have no
/// extension fields; chronyd takes whatever follows for a MAC, chime accepts the two MAC sizes that
/// [`check_extensions`] accepts for NTPv4.
pub(crate) fn is_mac_only(after_header: &[u8]) -> bool {
    matches!(after_header.len(), 0 | MAC_LEN_MD5 | MAC_LEN_SHA1)
}

/// The first byte of a packet: leap indicator, version (masked to its three bits) and mode.
pub(crate) const fn first_byte(leap: Leap, version: u8, mode: Mode) -> u8 {
    (leap as u8) << 6 | (version & 0x07) << 3 | mode as u8
}

/// The version in bits 3–5 of the packet's first byte.
pub(crate) const fn version_of(first_byte: u8) -> u8 {
    (first_byte >> 3) & 0x07
}

/// Byte offsets of the header fields, shared with the responder's fixed-offset writer.
pub(crate) mod offset {
    pub(crate) const LVM: usize = 0;
    pub(crate) const STRATUM: usize = 1;
    pub(crate) const POLL: usize = 2;
    pub(crate) const PRECISION: usize = 3;
    pub(crate) const ROOT_DELAY: usize = 4;
    pub(crate) const ROOT_DISPERSION: usize = 8;
    pub(crate) const REFERENCE_ID: usize = 12;
    pub(crate) const REFERENCE_TS: usize = 16;
    pub(crate) const ORIGIN_TS: usize = 24;
    pub(crate) const RECEIVE_TS: usize = 32;
    pub(crate) const TRANSMIT_TS: usize = 40;
}

/// Reads the `N` bytes at `at` of the header. Called only with the constant offsets above, each
/// with its field's width, so the range is always within the 48 bytes.
fn array_at<const N: usize>(header: &[u8; Header::LEN], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&header[at..at + N]);
    out
}

/// Writes `bytes` at `at` of a 48-byte header buffer.
fn put<const N: usize>(out: &mut [u8; Header::LEN], at: usize, bytes: [u8; N]) {
    out[at..at + N].copy_from_slice(&bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        Header {
            leap: Leap::AddSecond,
            version: 4,
            mode: Mode::Server,
            stratum: 2,
            poll: -6,
            precision: -25,
            root_delay: NtpShort(0x0000_1234),
            root_dispersion: NtpShort(0x0001_0000),
            reference_id: *b"GPS\0",
            reference_ts: NtpTimestamp(0xEEAC_6C47_24A8_0B7B),
            origin_ts: NtpTimestamp(0x0123_4567_89AB_CDEF),
            receive_ts: NtpTimestamp(0xEEAC_6C48_F557_519F),
            transmit_ts: NtpTimestamp(0xEEAC_6C48_F55E_B28C),
        }
    }

    #[test]
    fn encodes_at_rfc_5905_offsets() {
        let mut out = [0; 48];
        sample().encode(&mut out);
        assert_eq!(out[0], 0b01_100_100);
        assert_eq!(&out[1..4], &[2, 0xFA, 0xE7]);
        assert_eq!(&out[4..12], &[0, 0, 0x12, 0x34, 0, 1, 0, 0]);
        assert_eq!(&out[12..16], b"GPS\0");
        assert_eq!(
            &out[24..32],
            &[0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF]
        );
        assert_eq!(Header::parse(&out), Ok(sample()));
    }

    #[test]
    fn parse_needs_48_bytes_and_ignores_the_rest() {
        let mut bytes = [0_u8; 60];
        sample().encode((&mut bytes[..48]).try_into().unwrap());
        assert_eq!(
            Header::parse(&bytes[..47]),
            Err(ParseError::TooShort { len: 47 })
        );
        assert_eq!(Header::parse(&[]), Err(ParseError::TooShort { len: 0 }));
        assert_eq!(Header::parse(&bytes), Ok(sample()));
    }

    #[test]
    fn first_byte_fields() {
        for byte in 0..=u8::MAX {
            let h = Header::parse(&[&[byte][..], &[0; 47]].concat()).unwrap();
            assert_eq!(h.leap as u8, byte >> 6);
            assert_eq!(h.version, (byte >> 3) & 7);
            assert_eq!(h.mode as u8, byte & 7);
            assert_eq!(first_byte(h.leap, h.version, h.mode), byte);
        }
    }

    fn ef(kind: u16, len: u16) -> Vec<u8> {
        let mut v = vec![0xA5; usize::from(len.max(4))];
        v[..2].copy_from_slice(&kind.to_be_bytes());
        v[2..4].copy_from_slice(&len.to_be_bytes());
        v
    }

    #[test]
    fn extension_walk_accepts_well_formed_fields() {
        assert_eq!(check_extensions(&[]), Ok(()));
        assert_eq!(check_extensions(&ef(0x7A7A, 28)), Ok(()));
        assert_eq!(
            check_extensions(&[ef(0x0104, 16), ef(0x0204, 100)].concat()),
            Ok(())
        );
        // NTS-sized: unique identifier, cookie, authenticator.
        let nts = [ef(0x0104, 36), ef(0x0204, 104), ef(0x0404, 40)].concat();
        assert_eq!(check_extensions(&nts), Ok(()));
    }

    #[test]
    fn extension_walk_accepts_a_trailing_mac() {
        assert_eq!(check_extensions(&[0; 20]), Ok(()));
        assert_eq!(check_extensions(&[0; 24]), Ok(()));
        assert_eq!(
            check_extensions(&[ef(0x7A7A, 16), vec![0; 24]].concat()),
            Ok(())
        );
        assert_eq!(
            check_extensions(&[ef(0x7A7A, 28), vec![0; 20]].concat()),
            Ok(())
        );
        assert!(is_mac_only(&[]) && is_mac_only(&[0; 20]) && is_mac_only(&[0; 24]));
        assert!(!is_mac_only(&[0; 4]) && !is_mac_only(&[0; 28]) && !is_mac_only(&ef(0x7A7A, 28)));
    }

    #[test]
    fn extension_walk_rejects_malformed_fields() {
        assert_eq!(
            check_extensions(&[0; 2]),
            Err(ExtensionError::Misaligned { len: 2 })
        );
        assert_eq!(
            check_extensions(&[0; 30]),
            Err(ExtensionError::Misaligned { len: 30 })
        );
        // A crypto-NAK (4 zero bytes) is a reply's business, not a request's.
        assert_eq!(
            check_extensions(&[0; 4]),
            Err(ExtensionError::Leftover {
                offset: 0,
                remaining: 4
            })
        );
        // The last field of a packet without a MAC must be at least 28 bytes.
        assert_eq!(
            check_extensions(&ef(0x7A7A, 16)),
            Err(ExtensionError::Leftover {
                offset: 0,
                remaining: 16
            })
        );
        assert_eq!(
            check_extensions(&[ef(0x7A7A, 28), ef(0x7A7A, 16)].concat()),
            Err(ExtensionError::Leftover {
                offset: 28,
                remaining: 16
            })
        );
        assert_eq!(
            check_extensions(&[ef(0x7A7A, 12), ef(0x7A7A, 28)].concat()),
            Err(ExtensionError::FieldTooShort {
                offset: 0,
                length: 12
            })
        );
        assert_eq!(
            check_extensions(&[ef(0x7A7A, 0), vec![0; 28]].concat()),
            Err(ExtensionError::FieldTooShort {
                offset: 0,
                length: 0
            })
        );
        let mut odd = ef(0x7A7A, 32);
        odd[3] = 30;
        assert_eq!(
            check_extensions(&odd),
            Err(ExtensionError::FieldMisaligned {
                offset: 0,
                length: 30
            })
        );
        let mut long = ef(0x7A7A, 28);
        long[3] = 64;
        assert_eq!(
            check_extensions(&long),
            Err(ExtensionError::FieldOverrun {
                offset: 0,
                length: 64,
                remaining: 28
            })
        );
        let error = ExtensionError::FieldOverrun {
            offset: 0,
            length: 64,
            remaining: 28,
        };
        assert_eq!(
            error.to_string(),
            "extension field at offset 0 has length 64, but only 28 remain"
        );
    }

    fn header() -> impl Strategy<Value = Header> {
        let bytes = proptest::collection::vec(any::<u8>(), 48);
        bytes.prop_map(|b| Header::parse(&b).unwrap())
    }

    proptest! {
        #[test]
        fn parse_then_encode_gives_back_the_bytes(bytes in proptest::array::uniform32(any::<u8>()),
                                                  more in proptest::array::uniform16(any::<u8>())) {
            let mut wire = [0_u8; 48];
            wire[..32].copy_from_slice(&bytes);
            wire[32..].copy_from_slice(&more);
            let mut out = [0_u8; 48];
            Header::parse(&wire).unwrap().encode(&mut out);
            prop_assert_eq!(out, wire);
        }

        #[test]
        fn encode_then_parse_gives_back_the_header(h in header()) {
            let mut out = [0_u8; 48];
            h.encode(&mut out);
            prop_assert_eq!(Header::parse(&out), Ok(h));
        }

        #[test]
        fn extension_walk_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = check_extensions(&bytes);
        }

        #[test]
        fn extension_walk_accepts_any_well_formed_sequence(
            lens in proptest::collection::vec(4_u16..64, 0..6),
            mac in prop_oneof![Just(0_usize), Just(20), Just(24)],
        ) {
            let mut bytes = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                // The last field without a MAC must be 28 bytes or more.
                let min = if i + 1 == lens.len() && mac == 0 { 7 } else { 4 };
                bytes.extend(ef(0x7A00 + i as u16, len.max(&min) * 4));
            }
            bytes.extend(std::iter::repeat_n(0, mac));
            prop_assert_eq!(check_extensions(&bytes), Ok(()));
        }
    }
}
