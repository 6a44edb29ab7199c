//! The decoding and encoding errors shared by every parser and encoder in the crate.
//!
//! They are small and `Copy` (quinn-proto's `coding::UnexpectedEnd` is the model) so that a
//! parser can return them on a hot path at no cost, and each carries the values that made the
//! input wrong so that a person reading a log line or a test failure can see what was received.

use crate::codec::BufferTooSmall;
use crate::tag::Tag;

/// Why bytes could not be read as a Roughtime packet, message or field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The datagram is shorter than the 12-byte `ROUGHTIM` header and length.
    #[error("packet of {len} bytes is shorter than the 12-byte ROUGHTIM header")]
    ShortFrame {
        /// Bytes received.
        len: usize,
    },
    /// The `ROUGHTIM` header's length field disagrees with the bytes that follow it. Trailing
    /// bytes are rejected rather than ignored: from draft 12 on the whole packet is hashed into
    /// the Merkle tree, so two readings of one datagram must not exist.
    #[error("ROUGHTIM header declares a {declared}-byte message but {actual} bytes follow")]
    FrameLength {
        /// The length field.
        declared: u32,
        /// Bytes after the header.
        actual: usize,
    },
    /// The message is shorter than its own header says.
    #[error("message of {len} bytes is shorter than its {needed}-byte header")]
    Truncated {
        /// Bytes in the message.
        len: usize,
        /// Bytes the header needs (saturated for absurd tag counts).
        needed: u64,
    },
    /// Every value length is a multiple of 4, so the message length is too.
    #[error("message length {len} is not a multiple of 4")]
    Misaligned {
        /// Bytes in the message.
        len: usize,
    },
    /// A message with no tags has bytes after its header.
    #[error("empty message has {len} trailing bytes")]
    TrailingBytes {
        /// Bytes after the header.
        len: usize,
    },
    /// An offset is not a multiple of 4.
    #[error("offset {offset} of value {index} is not a multiple of 4")]
    OffsetMisaligned {
        /// Position of the value (the first value has the implied offset 0).
        index: usize,
        /// The offset read.
        offset: u32,
    },
    /// An offset is smaller than the one before it.
    #[error("offset {offset} of value {index} is below the previous offset {previous}")]
    OffsetDecreasing {
        /// Position of the value.
        index: usize,
        /// The offset read.
        offset: u32,
        /// The offset of the value before it.
        previous: u32,
    },
    /// An offset points past the end of the value area.
    #[error("offset {offset} of value {index} is past the {values_len}-byte value area")]
    OffsetOutOfBounds {
        /// Position of the value.
        index: usize,
        /// The offset read.
        offset: u32,
        /// Bytes in the value area.
        values_len: usize,
    },
    /// Tags must be strictly increasing by their `u32` value (which also forbids repeats).
    #[error("tag {tag} at position {index} does not sort above the tag before it, {previous}")]
    TagOrder {
        /// Position of the tag.
        index: usize,
        /// The tag read there.
        tag: Tag,
        /// The tag before it.
        previous: Tag,
    },
    /// Nested messages go deeper than any Roughtime structure does.
    #[error("message nested deeper than {max} levels")]
    TooDeep {
        /// The deepest nesting accepted.
        max: u8,
    },
    /// A tag the structure requires is absent.
    #[error("missing tag {tag}")]
    MissingTag {
        /// The tag looked for.
        tag: Tag,
    },
    /// A fixed-size value has the wrong size.
    #[error("{tag} has {len} bytes, expected {expected}")]
    BadLength {
        /// The tag of the value.
        tag: Tag,
        /// Its length.
        len: usize,
        /// The length its type has.
        expected: usize,
    },
    /// A list of 4-byte (or hash-sized) items has a length that is not a whole number of items,
    /// is empty where it may not be, or has more items than allowed.
    #[error("{tag} has {len} bytes, not 1 to {max_items} items of {item_len} bytes")]
    BadList {
        /// The tag of the list.
        tag: Tag,
        /// Its length in bytes.
        len: usize,
        /// Bytes per item.
        item_len: usize,
        /// Most items allowed.
        max_items: usize,
    },
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is too small.
    #[error(transparent)]
    BufferTooSmall(#[from] BufferTooSmall),
    /// Fields must be given in strictly increasing tag order.
    #[error("tag {tag} given after {previous}; tags must strictly increase")]
    TagOrder {
        /// The out-of-order tag.
        tag: Tag,
        /// The tag before it.
        previous: Tag,
    },
    /// Value lengths must be multiples of 4.
    #[error("value of {tag} is {len} bytes, not a multiple of 4")]
    Misaligned {
        /// The tag of the value.
        tag: Tag,
        /// Its length.
        len: usize,
    },
    /// Offsets would not fit in a `u32`.
    #[error("message values total {len} bytes, more than a u32 offset can address")]
    TooLarge {
        /// Total bytes of values.
        len: usize,
    },
}
