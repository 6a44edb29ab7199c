//! Tag-value messages: strict parsing into a borrowed view, and encoding into a caller's buffer.
//!
//! Layout (RFC 10049 §4): `u32 N`, `N-1` `u32` offsets (the first value's offset 0 is implied),
//! `N` `u32` tags, then the values. [`Message::parse`] checks the whole header once, so that
//! lookups afterwards are plain slicing that cannot fail or panic. Nested messages (SREP, CERT,
//! DELE) are parsed on demand by [`Message::nested`], which bounds the depth.

use crate::codec::{Reader, Writer, u32_at};
use crate::error::{DecodeError, EncodeError};
use crate::tag::Tag;

/// The deepest nesting [`Message::nested`] follows. Roughtime's deepest structure is
/// response → CERT → DELE (depth 2); a little slack leaves room for extensions.
pub(crate) const MAX_DEPTH: u8 = 4;

/// A parsed, validated message borrowing its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// Number of tags.
    count: usize,
    /// The `N-1` offsets, `4 * (N-1)` bytes.
    offsets: &'a [u8],
    /// The `N` tags, `4 * N` bytes.
    tags: &'a [u8],
    /// The value area.
    values: &'a [u8],
    /// 0 for a top-level message.
    depth: u8,
}

impl<'a> Message<'a> {
    /// Parses and validates a top-level message: length a multiple of 4, offsets multiples of 4,
    /// non-decreasing and inside the value area, tags strictly increasing by `u32` value.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        Self::parse_at_depth(bytes, 0)
    }

    fn parse_at_depth(bytes: &'a [u8], depth: u8) -> Result<Self, DecodeError> {
        if !bytes.len().is_multiple_of(4) {
            return Err(DecodeError::Misaligned { len: bytes.len() });
        }
        let mut r = Reader::new(bytes);
        let n = r.u32().ok_or(DecodeError::Truncated {
            len: bytes.len(),
            needed: 4,
        })?;
        if n == 0 {
            if !r.is_empty() {
                return Err(DecodeError::TrailingBytes { len: r.remaining() });
            }
            return Ok(Self {
                count: 0,
                offsets: &[],
                tags: &[],
                values: &[],
                depth,
            });
        }
        // The header of N tags is 8N bytes; computed in u64 so that an absurd N from the wire
        // cannot overflow on any target.
        let needed = u64::from(n) * 8;
        let truncated = DecodeError::Truncated {
            len: bytes.len(),
            needed,
        };
        let count = usize::try_from(n).map_err(|_| truncated)?;
        let offsets = r.take((count - 1) * 4).ok_or(truncated)?;
        let tags = r.take(count * 4).ok_or(truncated)?;
        let values = r.rest();
        let msg = Self {
            count,
            offsets,
            tags,
            values,
            depth,
        };
        msg.validate()?;
        Ok(msg)
    }

    fn validate(&self) -> Result<(), DecodeError> {
        let mut previous_offset = 0u32;
        for index in 1..self.count {
            let offset = self.raw_offset(index);
            if !offset.is_multiple_of(4) {
                return Err(DecodeError::OffsetMisaligned { index, offset });
            }
            if offset < previous_offset {
                return Err(DecodeError::OffsetDecreasing {
                    index,
                    offset,
                    previous: previous_offset,
                });
            }
            // u32 to usize is lossless on every target this crate builds for (16-bit is not one).
            if offset as usize > self.values.len() {
                return Err(DecodeError::OffsetOutOfBounds {
                    index,
                    offset,
                    values_len: self.values.len(),
                });
            }
            previous_offset = offset;
        }
        let mut previous_tag = self.tag_at(0);
        for index in 1..self.count {
            let tag = self.tag_at(index);
            if tag <= previous_tag {
                return Err(DecodeError::TagOrder {
                    index,
                    tag,
                    previous: previous_tag,
                });
            }
            previous_tag = tag;
        }
        Ok(())
    }

    /// The offset of value `index` as written (index 0 is the implied 0).
    fn raw_offset(&self, index: usize) -> u32 {
        match index {
            0 => 0,
            _ => u32_at(self.offsets, (index - 1) * 4).unwrap_or(0),
        }
    }

    fn tag_at(&self, index: usize) -> Tag {
        Tag::from_u32(u32_at(self.tags, index * 4).unwrap_or(0))
    }

    /// The value at `index`; validation guarantees the range, the fallback only keeps this
    /// function total.
    fn value_at(&self, index: usize) -> &'a [u8] {
        let start = self.raw_offset(index) as usize;
        let end = match index + 1 < self.count {
            true => self.raw_offset(index + 1) as usize,
            false => self.values.len(),
        };
        self.values.get(start..end).unwrap_or_default()
    }

    /// Number of tags.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True for the empty message.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How deeply this message is nested (0 for a top-level message).
    pub fn depth(&self) -> u8 {
        self.depth
    }

    /// The value of `tag`, if present.
    pub fn get(&self, tag: Tag) -> Option<&'a [u8]> {
        self.index_of(tag).map(|i| self.value_at(i))
    }

    /// Where the value of `tag` lies in the bytes this message was parsed from (header
    /// included), if present.
    pub(crate) fn value_range(&self, tag: Tag) -> Option<core::ops::Range<usize>> {
        let index = self.index_of(tag)?;
        let start = header_len(self.count) + self.raw_offset(index) as usize;
        Some(start..start + self.value_at(index).len())
    }

    /// The index of `tag`, if present. Tags are sorted, so this is a binary search.
    fn index_of(&self, tag: Tag) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.tag_at(mid).cmp(&tag) {
                core::cmp::Ordering::Less => lo = mid + 1,
                core::cmp::Ordering::Greater => hi = mid,
                core::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The value of `tag`, which must be present.
    pub fn require(&self, tag: Tag) -> Result<&'a [u8], DecodeError> {
        self.get(tag).ok_or(DecodeError::MissingTag { tag })
    }

    /// The value of `tag` as a fixed-size array; absent or wrong-sized is an error.
    pub fn fixed<const N: usize>(&self, tag: Tag) -> Result<&'a [u8; N], DecodeError> {
        let value = self.require(tag)?;
        value.try_into().map_err(|_| DecodeError::BadLength {
            tag,
            len: value.len(),
            expected: N,
        })
    }

    /// The value of `tag` as a little-endian `u32`.
    pub fn u32(&self, tag: Tag) -> Result<u32, DecodeError> {
        self.fixed::<4>(tag).map(|b| u32::from_le_bytes(*b))
    }

    /// The value of `tag` as a little-endian `u64`.
    pub fn u64(&self, tag: Tag) -> Result<u64, DecodeError> {
        self.fixed::<8>(tag).map(|b| u64::from_le_bytes(*b))
    }

    /// The value of `tag` parsed as a nested message, at most [`MAX_DEPTH`] levels down.
    pub fn nested(&self, tag: Tag) -> Result<Message<'a>, DecodeError> {
        let depth = self.depth + 1;
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep { max: MAX_DEPTH });
        }
        Self::parse_at_depth(self.require(tag)?, depth)
    }

    /// All `(tag, value)` pairs in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (Tag, &'a [u8])> + '_ {
        (0..self.count).map(|i| (self.tag_at(i), self.value_at(i)))
    }
}

/// Bytes a message with `count` tags spends on its header.
pub(crate) const fn header_len(count: usize) -> usize {
    match count {
        0 => 4,
        n => 8 * n,
    }
}

/// Writes a message header for `fields` (tag and value length, in strictly increasing tag
/// order); the caller then writes the values in the same order. This lets values be produced in
/// place (a Merkle path, a signature) instead of being assembled and copied.
pub(crate) fn write_header(w: &mut Writer<'_>, fields: &[(Tag, usize)]) -> Result<(), EncodeError> {
    let mut total = 0usize;
    for (i, &(tag, len)) in fields.iter().enumerate() {
        if len % 4 != 0 {
            return Err(EncodeError::Misaligned { tag, len });
        }
        if let Some(&(previous, _)) = i.checked_sub(1).and_then(|p| fields.get(p))
            && tag <= previous
        {
            return Err(EncodeError::TagOrder { tag, previous });
        }
        total = total.saturating_add(len);
    }
    if u32::try_from(total).is_err() {
        return Err(EncodeError::TooLarge { len: total });
    }
    w.put_u32(fields.len() as u32)?;
    let mut offset = 0u32;
    for &(_, len) in fields.iter().take(fields.len().saturating_sub(1)) {
        // Cannot overflow: the total fits in a u32, checked above.
        offset += len as u32;
        w.put_u32(offset)?;
    }
    for &(tag, _) in fields {
        w.put_u32(tag.to_u32())?;
    }
    Ok(())
}

/// Encodes `fields` (strictly increasing tags, values a multiple of 4 bytes long) into `out`,
/// returning the number of bytes written. The server writes its replies field by field; this is
/// for the ML-DSA-44 suite and the tests.
#[cfg(any(test, feature = "mldsa"))]
pub(crate) fn encode(out: &mut [u8], fields: &[(Tag, &[u8])]) -> Result<usize, EncodeError> {
    let mut w = Writer::new(out);
    encode_into(&mut w, fields)?;
    Ok(w.position())
}

/// Like [`encode`], appending to a [`Writer`].
#[cfg(any(test, feature = "mldsa"))]
pub(crate) fn encode_into(w: &mut Writer<'_>, fields: &[(Tag, &[u8])]) -> Result<(), EncodeError> {
    // A message never has more than a handful of tags; more than this is a caller bug, reported
    // as an error instead of allocating.
    const MAX_FIELDS: usize = 16;
    let mut spec = [(Tag::from_u32(0), 0usize); MAX_FIELDS];
    let spec = spec
        .get_mut(..fields.len())
        .ok_or(EncodeError::TooLarge { len: fields.len() })?;
    for (s, &(tag, value)) in spec.iter_mut().zip(fields) {
        *s = (tag, value.len());
    }
    write_header(w, spec)?;
    for &(_, value) in fields {
        w.put(value)?;
    }
    Ok(())
}

/// Bytes [`encode`] needs for values of these lengths.
#[cfg(test)]
pub(crate) fn encoded_len(value_lens: &[usize]) -> usize {
    header_len(value_lens.len()) + value_lens.iter().sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn le(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn empty_message() {
        let m = Message::parse(&[0, 0, 0, 0]).unwrap();
        assert!(m.is_empty());
        assert_eq!(
            Message::parse(&[0, 0, 0, 0, 1, 2, 3, 4]).unwrap_err(),
            DecodeError::TrailingBytes { len: 4 }
        );
        let mut out = [0u8; 4];
        assert_eq!(encode(&mut out, &[]).unwrap(), 4);
        assert_eq!(out, [0; 4]);
    }

    #[test]
    fn google_protocol_examples() {
        // The two examples of Google's PROTOCOL.md, as bytes.
        let one = le(&[1, 0x0102_0304, 0x8080_8080]);
        let m = Message::parse(&one).unwrap();
        assert_eq!(m.get(Tag::from_u32(0x0102_0304)), Some(&[0x80; 4][..]));

        let two = le(&[2, 4, 0x0002_0305, 0x0102_0304, 0, 0x8080_8080]);
        let m = Message::parse(&two).unwrap();
        assert_eq!(m.get(Tag::from_u32(0x0002_0305)), Some(&[0; 4][..]));
        assert_eq!(m.get(Tag::from_u32(0x0102_0304)), Some(&[0x80; 4][..]));
        assert_eq!(m.get(Tag::from_u32(0x0102_0305)), None);

        let mut out = [0u8; 24];
        let n = encode(
            &mut out,
            &[
                (Tag::from_u32(0x0002_0305), &[0; 4]),
                (Tag::from_u32(0x0102_0304), &[0x80; 4]),
            ],
        )
        .unwrap();
        assert_eq!(&out[..n], &two[..]);
    }

    #[test]
    fn zero_length_values() {
        let bytes = le(&[
            3,
            0,
            0,
            Tag::SIG.to_u32(),
            Tag::NONC.to_u32(),
            Tag::PATH.to_u32(),
        ]);
        let m = Message::parse(&bytes).unwrap();
        assert_eq!(m.get(Tag::SIG), Some(&[][..]));
        assert_eq!(m.get(Tag::PATH), Some(&[][..]));
    }

    #[test]
    fn rejects_bad_headers() {
        let sig = Tag::SIG.to_u32();
        let nonc = Tag::NONC.to_u32();
        let cases: &[(Vec<u8>, DecodeError)] = &[
            (vec![1, 0, 0], DecodeError::Misaligned { len: 3 }),
            (
                le(&[2, 0, sig]),
                DecodeError::Truncated {
                    len: 12,
                    needed: 16,
                },
            ),
            (
                le(&[u32::MAX]),
                DecodeError::Truncated {
                    len: 4,
                    needed: u64::from(u32::MAX) * 8,
                },
            ),
            (
                le(&[2, 2, sig, nonc, 0]),
                DecodeError::OffsetMisaligned {
                    index: 1,
                    offset: 2,
                },
            ),
            (
                le(&[2, 8, sig, nonc, 0]),
                DecodeError::OffsetOutOfBounds {
                    index: 1,
                    offset: 8,
                    values_len: 4,
                },
            ),
            (
                le(&[3, 4, 0, sig, nonc, Tag::PATH.to_u32(), 0]),
                DecodeError::OffsetDecreasing {
                    index: 2,
                    offset: 0,
                    previous: 4,
                },
            ),
            (
                le(&[2, 0, nonc, sig]),
                DecodeError::TagOrder {
                    index: 1,
                    tag: Tag::SIG,
                    previous: Tag::NONC,
                },
            ),
            (
                le(&[2, 0, sig, sig]),
                DecodeError::TagOrder {
                    index: 1,
                    tag: Tag::SIG,
                    previous: Tag::SIG,
                },
            ),
        ];
        for (bytes, err) in cases {
            assert_eq!(Message::parse(bytes).unwrap_err(), *err, "{bytes:02x?}");
        }
    }

    #[test]
    fn typed_getters() {
        let mut out = [0u8; 64];
        let n = encode(
            &mut out,
            &[
                (Tag::RADI, &7u32.to_le_bytes()),
                (Tag::MIDP, &9u64.to_le_bytes()),
            ],
        )
        .unwrap();
        let m = Message::parse(&out[..n]).unwrap();
        assert_eq!(m.u32(Tag::RADI), Ok(7));
        assert_eq!(m.u64(Tag::MIDP), Ok(9));
        assert_eq!(
            m.u64(Tag::RADI),
            Err(DecodeError::BadLength {
                tag: Tag::RADI,
                len: 4,
                expected: 8
            })
        );
        assert_eq!(
            m.u32(Tag::ROOT),
            Err(DecodeError::MissingTag { tag: Tag::ROOT })
        );
    }

    #[test]
    fn nesting_is_bounded() {
        // Build a chain of messages each holding the next under SREP, deeper than MAX_DEPTH.
        let mut inner = vec![0u8; 4];
        for _ in 0..=MAX_DEPTH {
            let mut out = vec![0u8; inner.len() + 8];
            let n = encode(&mut out, &[(Tag::SREP, &inner)]).unwrap();
            out.truncate(n);
            inner = out;
        }
        let mut m = Message::parse(&inner).unwrap();
        for _ in 0..MAX_DEPTH {
            m = m.nested(Tag::SREP).unwrap();
        }
        assert_eq!(
            m.nested(Tag::SREP).unwrap_err(),
            DecodeError::TooDeep { max: MAX_DEPTH }
        );
    }

    #[test]
    fn encoder_checks_its_input() {
        let mut out = [0u8; 64];
        assert_eq!(
            encode(&mut out, &[(Tag::NONC, &[0; 4]), (Tag::SIG, &[0; 4])]),
            Err(EncodeError::TagOrder {
                tag: Tag::SIG,
                previous: Tag::NONC
            })
        );
        assert_eq!(
            encode(&mut out, &[(Tag::NONC, &[0; 3])]),
            Err(EncodeError::Misaligned {
                tag: Tag::NONC,
                len: 3
            })
        );
        assert!(matches!(
            encode(&mut out[..10], &[(Tag::NONC, &[0; 4])]),
            Err(EncodeError::BufferTooSmall(_))
        ));
        assert_eq!(encoded_len(&[4, 8]), 16 + 12);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(m) = Message::parse(&bytes) {
                for (tag, value) in m.iter() {
                    prop_assert_eq!(m.get(tag), Some(value));
                    let _ = m.nested(tag);
                }
            }
        }

        #[test]
        fn parse_accepts_what_encode_writes(
            raw in proptest::collection::btree_map(any::<u32>(), 0usize..6, 0..8)
        ) {
            let values: Vec<(Tag, Vec<u8>)> = raw
                .iter()
                .map(|(&t, &words)| (Tag::from_u32(t), vec![t as u8; words * 4]))
                .collect();
            let fields: Vec<(Tag, &[u8])> = values.iter().map(|(t, v)| (*t, &v[..])).collect();
            let lens: Vec<usize> = values.iter().map(|(_, v)| v.len()).collect();
            let mut out = vec![0u8; encoded_len(&lens)];
            let n = encode(&mut out, &fields).unwrap();
            prop_assert_eq!(n, out.len());
            let m = Message::parse(&out).unwrap();
            prop_assert_eq!(m.len(), fields.len());
            for ((tag, value), (t2, v2)) in fields.iter().zip(m.iter()) {
                prop_assert_eq!(*tag, t2);
                prop_assert_eq!(*value, v2);
                prop_assert_eq!(m.get(*tag), Some(*value));
            }
        }
    }
}
