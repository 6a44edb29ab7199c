//! Grease: deliberately invalid replies, so that clients are seen to check what they must.
//!
//! A server may send a small share of replies that a correct client rejects (FACTS.md,
//! "Grease"), so that a client which skips a check fails in testing rather than in the field;
//! never a wrong time under a valid signature. Each [`Grease`] breaks one thing a client must
//! verify, in place: a greased reply has the same length as the true one, so it is never longer
//! than its request either. Which replies to grease, and how, is the caller's choice (this crate
//! reads no random source); [`SignedBatch::write_greased_reply`](crate::SignedBatch::write_greased_reply)
//! writes one.

use crate::layout::ReplyLayout;
use crate::message::Message;
use crate::tag::Tag;
use crate::version::Version;

/// One way to break a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Grease {
    /// A bit of SIG, the online key's signature over SREP, flipped.
    Signature,
    /// A bit of the certificate's SIG, the long-term key's signature over DELE, flipped.
    Certificate,
    /// A bit of the first PATH hash flipped, so the path leads to another root. A reply from a
    /// batch of one has no path; it gets [`Grease::Index`]'s break instead.
    Path,
    /// INDX given a bit above the path's depth, which the tree has no room for: a client must
    /// find that bit left over once it has walked the path.
    Index,
    /// A bit of NONC flipped, so the reply names another request's nonce. Not for Google's
    /// replies, which carry none.
    Nonce,
    /// MIDP moved by 2^24 of its units (194 days where it counts seconds, 17 s where it counts
    /// microseconds), the signature left as it was: a client that shows the time without
    /// checking the signature shows a wrong one.
    Time,
}

impl Grease {
    /// Every kind.
    pub const ALL: [Self; 6] = [
        Self::Signature,
        Self::Certificate,
        Self::Path,
        Self::Index,
        Self::Nonce,
        Self::Time,
    ];

    /// The kinds that apply to a reply in `version`: all but [`Grease::Nonce`] for Google's.
    pub fn kinds(version: Version) -> &'static [Self] {
        match version {
            Version::Google => &[
                Self::Signature,
                Self::Certificate,
                Self::Path,
                Self::Index,
                Self::Time,
            ],
            _ => &Self::ALL,
        }
    }

    /// A short name, for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Signature => "signature",
            Self::Certificate => "certificate",
            Self::Path => "path",
            Self::Index => "index",
            Self::Nonce => "nonce",
            Self::Time => "time",
        }
    }

    /// Breaks `reply`, laid out as `layout` says, whose tree hashes are `hash_len` bytes. Never
    /// panics: a reply of another length is left alone, and a value that is not where the
    /// layout puts it leaves the reply's SIG broken instead.
    pub(crate) fn apply(self, reply: &mut [u8], layout: &ReplyLayout, hash_len: usize) {
        debug_assert_eq!(reply.len(), layout.len);
        if reply.len() != layout.len || hash_len == 0 {
            return;
        }
        let depth = (layout.srep - layout.path) / hash_len;
        let at = match self {
            Self::Signature => Some(layout.sig),
            Self::Certificate => Message::parse(&reply[layout.cert..layout.indx])
                .ok()
                .and_then(|cert| cert.value_range(Tag::SIG))
                .map(|sig| layout.cert + sig.start),
            Self::Path if depth > 0 => Some(layout.path),
            Self::Path | Self::Index => {
                let mut indx = [0; 4];
                indx.copy_from_slice(&reply[layout.indx..layout.indx + 4]);
                // The deepest tree (32 levels) leaves no bit above it; the batch limit keeps
                // trees far shallower, and the fallback keeps this total.
                let stray = 1u32.checked_shl(depth as u32).unwrap_or(1);
                let indx = u32::from_le_bytes(indx) | stray;
                reply[layout.indx..layout.indx + 4].copy_from_slice(&indx.to_le_bytes());
                return;
            }
            Self::Nonce => layout.nonce,
            Self::Time => Message::parse(&reply[layout.srep..layout.cert])
                .ok()
                .and_then(|srep| srep.value_range(Tag::MIDP))
                .filter(|midp| midp.len() == 8)
                .map(|midp| layout.srep + midp.start + 3),
        };
        reply[at.unwrap_or(layout.sig)] ^= 1;
    }
}
