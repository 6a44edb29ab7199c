//! Requests: reading one into a borrowed view, and building one for a client.
//!
//! [`Request::parse`] checks syntax only (framing, message rules, sizes of the fields it reads);
//! what a server accepts is policy and lives in `server`. [`build_request`] writes a request of
//! exactly [`REQUEST_LEN`] bytes for any version set a client wants to offer.

use crate::codec::{BufferTooSmall, Writer};
use crate::error::{DecodeError, EncodeError};
use crate::keys::KEY_LEN;
use crate::message::{Message, header_len, write_header};
use crate::packet::{FRAME_HEADER_LEN, Framing, Packet, write_frame_header};
use crate::tag::Tag;
use crate::version::{MAX_OFFERED_VERSIONS, Version, VersionList};

/// The size every request is padded to, and the least a server answers: the whole datagram,
/// header included (what every deployed implementation measures).
pub const REQUEST_LEN: usize = 1024;

/// A request as received, borrowing the datagram.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// How the datagram was framed; Google requests have no header and no VER.
    pub framing: Framing,
    /// The whole datagram, which drafts 12 on hash into the Merkle tree.
    pub packet: &'a [u8],
    /// The parsed message.
    pub message: Message<'a>,
    /// The versions offered (IETF framing only; 1 to 32 numbers, in the order sent).
    pub versions: Option<VersionList<'a>>,
    /// The NONC value, of whatever length was sent.
    pub nonce: &'a [u8],
    /// The SRV value, naming the long-term key the client expects.
    pub srv: Option<&'a [u8; KEY_LEN]>,
    /// The TYPE value (0 for a request), if present.
    pub type_value: Option<u32>,
}

impl<'a> Request<'a> {
    /// Reads a datagram as a request. NONC is required in every version, VER in every framed one;
    /// other tags are read only if present and unknown ones are ignored.
    pub fn parse(datagram: &'a [u8]) -> Result<Self, DecodeError> {
        let packet = Packet::parse(datagram)?;
        let message = Message::parse(packet.message)?;
        let nonce = message.require(Tag::NONC)?;
        let versions = match packet.framing {
            Framing::Google => None,
            Framing::Ietf => Some(version_list(&message, Tag::VER)?),
        };
        let (mut srv, mut type_value) = (None, None);
        if packet.framing == Framing::Ietf {
            if message.get(Tag::SRV).is_some() {
                srv = Some(message.fixed::<KEY_LEN>(Tag::SRV)?);
            }
            if message.get(Tag::TYPE).is_some() {
                type_value = Some(message.u32(Tag::TYPE)?);
            }
        }
        Ok(Self {
            framing: packet.framing,
            packet: datagram,
            message,
            versions,
            nonce,
            srv,
            type_value,
        })
    }
}

/// Reads a VER or VERS list: 1 to 32 little-endian numbers.
pub(crate) fn version_list<'a>(
    message: &Message<'a>,
    tag: Tag,
) -> Result<VersionList<'a>, DecodeError> {
    let bytes = message.require(tag)?;
    if bytes.is_empty() || bytes.len() % 4 != 0 || bytes.len() / 4 > MAX_OFFERED_VERSIONS {
        return Err(DecodeError::BadList {
            tag,
            len: bytes.len(),
            item_len: 4,
            max_items: MAX_OFFERED_VERSIONS,
        });
    }
    Ok(VersionList::new(bytes))
}

/// Why a request could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No version was given.
    #[error("no version to offer")]
    NoVersion,
    /// Google's protocol has no header and no VER, so it cannot be offered with any other.
    #[error("Google-Roughtime cannot be offered together with another version")]
    GoogleWithOthers,
    /// The nonce has the wrong size for the versions offered.
    #[error("nonce of {len} bytes; {version} needs {expected}")]
    NonceLength {
        /// Bytes given.
        len: usize,
        /// Bytes the versions need.
        expected: usize,
        /// A version offered.
        version: Version,
    },
    /// The output could not be written.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

impl From<BufferTooSmall> for BuildError {
    fn from(e: BufferTooSmall) -> Self {
        Self::Encode(e.into())
    }
}

/// Writes a request offering `versions` with `nonce` (32 bytes, or 64 for Google) into `out` and
/// returns its length, always [`REQUEST_LEN`].
///
/// VER lists the versions ascending without repeats (RFC 10049 §5.1.1). TYPE = 0 is sent when a
/// version from draft 12 on is offered; SRV when `srv` is given and the packet is framed.
/// Padding is ZZZZ, `PAD\0` when draft 07 is the newest version offered, or `PAD\xff` for
/// Google.
pub fn build_request(
    out: &mut [u8],
    versions: &[Version],
    nonce: &[u8],
    srv: Option<&[u8; KEY_LEN]>,
) -> Result<usize, BuildError> {
    let first = *versions.first().ok_or(BuildError::NoVersion)?;
    let google = versions.contains(&Version::Google);
    if google && versions.iter().any(|v| *v != Version::Google) {
        return Err(BuildError::GoogleWithOthers);
    }
    let family = first.family();
    if nonce.len() != family.nonce_len() {
        return Err(BuildError::NonceLength {
            len: nonce.len(),
            expected: family.nonce_len(),
            version: first,
        });
    }
    let mut w = Writer::new(out);
    if google {
        let pad = REQUEST_LEN - header_len(2) - nonce.len();
        write_header(&mut w, &[(Tag::NONC, nonce.len()), (Tag::PAD, pad)])?;
        w.put(nonce)?;
        w.put_zeros(pad)?;
        return Ok(w.position());
    }

    // Ascending and without repeats, whatever order the caller gave.
    let mut numbers = [0u32; Version::ALL.len()];
    let mut count = 0;
    for number in versions.iter().filter_map(|v| v.number()) {
        if !numbers[..count].contains(&number) {
            numbers[count] = number;
            count += 1;
        }
    }
    let numbers = &mut numbers[..count];
    numbers.sort_unstable();
    let with_type = versions.iter().any(|v| v.family().has_type());
    // Drafts up to 07 pad with `PAD\0`, which sorts first and which a draft 07 server such as
    // pyroughtime's requires (it refuses tags it does not know, ZZZZ among them); drafts 08 on
    // pad with ZZZZ, last.
    let pad_first = versions.iter().max() == Some(&Version::Draft07);

    // Tags in increasing order: [PAD\0] < VER < SRV < NONC < TYPE < [ZZZZ].
    let mut spec = [(Tag::VER, 0); 5];
    let mut n = 0;
    let mut push = |tag, len| {
        spec[n] = (tag, len);
        n += 1;
    };
    if pad_first {
        push(Tag::PAD_DRAFT, 0);
    }
    push(Tag::VER, 4 * count);
    if srv.is_some() {
        push(Tag::SRV, KEY_LEN);
    }
    push(Tag::NONC, nonce.len());
    if with_type {
        push(Tag::TYPE, 4);
    }
    if !pad_first {
        push(Tag::ZZZZ, 0);
    }
    let values: usize = spec[..n].iter().map(|(_, len)| len).sum();
    // At most 92 bytes of values and a 40-byte header: the subtraction cannot underflow.
    let pad = REQUEST_LEN - FRAME_HEADER_LEN - header_len(n) - values;
    let pad_at = if pad_first { 0 } else { n - 1 };
    spec[pad_at].1 = pad;

    write_frame_header(&mut w, REQUEST_LEN - FRAME_HEADER_LEN)?;
    write_header(&mut w, &spec[..n])?;
    if pad_first {
        w.put_zeros(pad)?;
    }
    for number in numbers.iter() {
        w.put_u32(*number)?;
    }
    if let Some(srv) = srv {
        w.put(srv)?;
    }
    w.put(nonce)?;
    if with_type {
        w.put_u32(0)?;
    }
    if !pad_first {
        w.put_zeros(pad)?;
    }
    Ok(w.position())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn builds_an_rfc_request() {
        let mut out = [0u8; 1500];
        let srv = [0xcd; 32];
        let n = build_request(
            &mut out,
            &[Version::Draft12, Version::Rfc10049],
            &[7; 32],
            Some(&srv),
        )
        .unwrap();
        assert_eq!(n, REQUEST_LEN);
        let r = Request::parse(&out[..n]).unwrap();
        assert_eq!(r.framing, Framing::Ietf);
        let offered: Vec<u32> = r.versions.unwrap().iter().collect();
        assert_eq!(offered, [1, 0x8000_000c]);
        assert_eq!(r.nonce, &[7; 32]);
        assert_eq!(r.srv, Some(&srv));
        assert_eq!(r.type_value, Some(0));
        let tags: Vec<Tag> = r.message.iter().map(|(t, _)| t).collect();
        assert_eq!(tags, [Tag::VER, Tag::SRV, Tag::NONC, Tag::TYPE, Tag::ZZZZ]);
    }

    #[test]
    fn builds_like_cloudflare_for_old_drafts() {
        let mut out = [0u8; REQUEST_LEN];
        let n = build_request(
            &mut out,
            &[Version::Draft11, Version::Draft08, Version::Draft11],
            &[1; 32],
            None,
        )
        .unwrap();
        let r = Request::parse(&out[..n]).unwrap();
        let offered: Vec<u32> = r.versions.unwrap().iter().collect();
        assert_eq!(offered, [0x8000_0008, 0x8000_000b]);
        assert_eq!(r.type_value, None, "drafts before 12 have no TYPE");
    }

    /// Draft 07 alone pads with `PAD\0`, first, as pyroughtime does; offered with a later
    /// draft it pads with ZZZZ.
    #[test]
    fn builds_a_draft07_request() {
        let mut out = [0u8; REQUEST_LEN];
        let n = build_request(&mut out, &[Version::Draft07], &[4; 32], None).unwrap();
        assert_eq!(n, REQUEST_LEN);
        let r = Request::parse(&out).unwrap();
        let tags: Vec<Tag> = r.message.iter().map(|(t, _)| t).collect();
        assert_eq!(tags, [Tag::PAD_DRAFT, Tag::VER, Tag::NONC]);
        assert_eq!(
            r.versions.unwrap().iter().collect::<Vec<_>>(),
            [0x8000_0007]
        );
        assert_eq!(r.nonce, &[4; 32]);
        assert!(
            r.message
                .get(Tag::PAD_DRAFT)
                .unwrap()
                .iter()
                .all(|b| *b == 0)
        );

        build_request(
            &mut out,
            &[Version::Draft07, Version::Draft08],
            &[4; 32],
            None,
        )
        .unwrap();
        let r = Request::parse(&out).unwrap();
        let tags: Vec<Tag> = r.message.iter().map(|(t, _)| t).collect();
        assert_eq!(tags, [Tag::VER, Tag::NONC, Tag::ZZZZ]);
    }

    #[test]
    fn builds_a_google_request() {
        let mut out = [0u8; REQUEST_LEN];
        let n = build_request(&mut out, &[Version::Google], &[9; 64], None).unwrap();
        assert_eq!(n, REQUEST_LEN);
        assert_eq!(&out[..8], &[2, 0, 0, 0, 64, 0, 0, 0]);
        let r = Request::parse(&out).unwrap();
        assert_eq!(r.framing, Framing::Google);
        assert_eq!(r.nonce, &[9; 64]);
        assert!(r.versions.is_none());
        assert!(r.message.get(Tag::PAD).is_some());
    }

    #[test]
    fn build_errors() {
        let mut out = [0u8; REQUEST_LEN];
        assert_eq!(
            build_request(&mut out, &[], &[0; 32], None),
            Err(BuildError::NoVersion)
        );
        assert_eq!(
            build_request(
                &mut out,
                &[Version::Google, Version::Draft08],
                &[0; 64],
                None
            ),
            Err(BuildError::GoogleWithOthers)
        );
        assert_eq!(
            build_request(&mut out, &[Version::Rfc10049], &[0; 64], None),
            Err(BuildError::NonceLength {
                len: 64,
                expected: 32,
                version: Version::Rfc10049
            })
        );
        assert!(matches!(
            build_request(&mut out[..500], &[Version::Rfc10049], &[0; 32], None),
            Err(BuildError::Encode(EncodeError::BufferTooSmall(_)))
        ));
    }

    #[test]
    fn parse_errors() {
        let mut out = [0u8; REQUEST_LEN];
        build_request(&mut out, &[Version::Rfc10049], &[0; 32], None).unwrap();
        // An empty VER list: rewrite the first offset (VER's length) to 0.
        let mut bad = out;
        bad[16..20].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            Request::parse(&bad).unwrap_err(),
            DecodeError::BadList {
                tag: Tag::VER,
                len: 0,
                item_len: 4,
                max_items: 32
            }
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = Request::parse(&bytes);
            let mut framed = b"ROUGHTIM".to_vec();
            framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            framed.extend_from_slice(&bytes);
            let _ = Request::parse(&framed);
        }
    }
}
