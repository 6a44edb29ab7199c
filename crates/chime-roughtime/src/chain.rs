//! Chaining requests across servers and finding servers that contradict each other.
//!
//! RFC 10049 §8.2: the first request's nonce is random; each next one is
//! `H(previous reply packet ‖ rand)` with a fresh 32-byte `rand`, so that each reply provably
//! came after the one before. Then for every pair of replies `i` received before `j`,
//! `MIDP_i − RADI_i ≤ MIDP_j + RADI_j` must hold; a pair that breaks it is a contradiction, and
//! the chain (with its `rand` values) is the malfeasance report that proves it.
//!
//! Only 32-byte nonces chain this way; Google's 64-byte nonces are not covered.

use crate::client::{Verified, VerifyError, VerifyPolicy, verify_reply};
use crate::keys::KEY_LEN;
use crate::merkle::hash;
use crate::request::Request;

/// The nonce of the next request in a chain: `H(previous_reply ‖ rand)`, `H` being the first 32
/// bytes of SHA-512. `previous_reply` is the whole reply packet, `ROUGHTIM` header included;
/// `rand` comes from the caller's random source.
pub fn next_nonce(previous_reply: &[u8], rand: &[u8; 32]) -> [u8; 32] {
    hash(&[previous_reply, rand])
}

/// One exchange of a chain, as a malfeasance report records it (RFC 10049 §8.4.1).
#[derive(Debug, Clone, Copy)]
pub struct Link<'a> {
    /// The long-term key the server was expected to sign with.
    pub public_key: [u8; KEY_LEN],
    /// The blind that derived this request's nonce from the previous reply; `None` only for the
    /// first link.
    pub rand: Option<[u8; 32]>,
    /// The request packet sent.
    pub request: &'a [u8],
    /// The reply packet received.
    pub reply: &'a [u8],
}

/// Two replies whose intervals cannot both be true in the order they were received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contradiction {
    /// Position of the earlier reply.
    pub earlier: usize,
    /// Position of the later reply.
    pub later: usize,
    /// The earlier reply's MIDP − RADI (Unix microseconds)...
    pub earlier_earliest_unix_us: u64,
    /// ...is after the later reply's MIDP + RADI.
    pub later_latest_unix_us: u64,
}

/// The outcome of checking a chain: every reply verified and linked, and whether the times agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainReport {
    /// Each reply's verified content, in order.
    pub replies: Vec<Verified>,
    /// Every pair whose times contradict causal order.
    pub contradictions: Vec<Contradiction>,
}

impl ChainReport {
    /// True if no server contradicted another.
    pub fn is_consistent(&self) -> bool {
        self.contradictions.is_empty()
    }
}

/// Why a chain could not be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// A reply failed verification.
    #[error("reply {index}: {source}")]
    Verify {
        /// Position in the chain.
        index: usize,
        /// What failed.
        source: VerifyError,
    },
    /// A link after the first has no `rand`, so nothing ties it to the one before.
    #[error("link {index} has no rand tying it to the reply before")]
    MissingRand {
        /// Position in the chain.
        index: usize,
    },
    /// A request's nonce is not `H(previous reply ‖ rand)`.
    #[error("link {index}: the request's nonce is not derived from reply {previous}")]
    BrokenLink {
        /// Position in the chain.
        index: usize,
        /// The reply it should derive from.
        previous: usize,
    },
}

/// Verifies every link, checks that each request's nonce derives from the reply before, and
/// reports contradictions.
pub fn verify_chain(links: &[Link<'_>], policy: &VerifyPolicy) -> Result<ChainReport, ChainError> {
    let mut replies = Vec::with_capacity(links.len());
    for (index, link) in links.iter().enumerate() {
        let verified = verify_reply(link.request, link.reply, &link.public_key, policy)
            .map_err(|source| ChainError::Verify { index, source })?;
        if let Some(previous) = index.checked_sub(1) {
            let rand = link.rand.ok_or(ChainError::MissingRand { index })?;
            // verify_reply has parsed the request already, so this cannot fail; a failure would
            // still be reported, not ignored.
            let request = Request::parse(link.request).map_err(|e| ChainError::Verify {
                index,
                source: VerifyError::Request(e),
            })?;
            if request.nonce != next_nonce(links[previous].reply, &rand) {
                return Err(ChainError::BrokenLink { index, previous });
            }
        }
        replies.push(verified);
    }
    let contradictions = contradictions(&replies);
    Ok(ChainReport {
        replies,
        contradictions,
    })
}

/// Every pair `(i, j)`, `i` received before `j`, with `MIDP_i − RADI_i > MIDP_j + RADI_j`.
pub fn contradictions(replies: &[Verified]) -> Vec<Contradiction> {
    let mut found = Vec::new();
    for (i, earlier) in replies.iter().enumerate() {
        for (j, later) in replies.iter().enumerate().skip(i + 1) {
            if earlier.earliest_unix_us() > later.latest_unix_us() {
                found.push(Contradiction {
                    earlier: i,
                    later: j,
                    earlier_earliest_unix_us: earlier.earliest_unix_us(),
                    later_latest_unix_us: later.latest_unix_us(),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::{ContextSpelling, Version};

    fn verified(midpoint_s: u64, radius_s: u64) -> Verified {
        Verified {
            version: Version::Rfc10049,
            midpoint_unix_us: midpoint_s * 1_000_000,
            radius_us: radius_s * 1_000_000,
            mint_unix_us: 0,
            maxt_unix_us: u64::MAX,
            online_key: [0; 32],
            cert_spelling: ContextSpelling::Roughtime,
            srep_spelling: ContextSpelling::Roughtime,
            index: 0,
        }
    }

    #[test]
    fn overlapping_or_forward_times_agree() {
        let r = [verified(100, 3), verified(98, 3), verified(200, 1)];
        assert!(contradictions(&r).is_empty());
    }

    #[test]
    fn a_reply_from_the_past_contradicts() {
        // 100 − 3 = 97 > 90 + 3 = 93: the later reply claims an earlier time than possible.
        let r = [verified(100, 3), verified(90, 3), verified(101, 3)];
        assert_eq!(
            contradictions(&r),
            [Contradiction {
                earlier: 0,
                later: 1,
                earlier_earliest_unix_us: 97_000_000,
                later_latest_unix_us: 93_000_000,
            }]
        );
    }

    #[test]
    fn next_nonce_is_sha512_truncated() {
        let n = next_nonce(b"reply", &[0; 32]);
        let mut input = b"reply".to_vec();
        input.extend_from_slice(&[0; 32]);
        assert_eq!(n, hash::<32>(&[&input]));
    }
}
