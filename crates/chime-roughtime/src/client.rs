//! The client side: verifying a reply against the request it answers.
//!
//! [`verify_reply`] checks everything RFC 10049 §5.4 asks, for every version: the CERT signature
//! with the long-term key, MINT ≤ MIDP ≤ MAXT, the SREP signature with the delegated key, the
//! echoed nonce, that the request is in the Merkle tree (PATH and INDX), TYPE where the version
//! has it, that the version was offered, and a caller-chosen cap on the radius (one deployed
//! server answers 0xffffffff seconds when its clock is unsynchronised, and every client accepted
//! that).
//!
//! Version 1 is checked with the RFC body's context spelling, "Roughtime". If a signature
//! verifies only with the drafts' "RoughTime" (as the RFC's own Appendix B example does), the
//! result says so: an error by default, or an accepted reply whose [`Verified`] records the
//! spelling, if the policy allows it.

use ed25519_dalek::{Signature, VerifyingKey};

use crate::error::DecodeError;
use crate::keys::KEY_LEN;
use crate::merkle::{PathError, hash_leaf_with, root_from_path_with};
use crate::message::Message;
use crate::packet::Framing;
use crate::request::{Request, version_list};
use crate::response::Reply;
use crate::tag::Tag;
use crate::version::{ContextSpelling, Family, LeafData, Version, VersionList};

/// What a client accepts beyond what the protocol requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyPolicy {
    /// Largest radius accepted, in microseconds. There is deliberately no default: the caller
    /// decides how rough is too rough.
    pub max_radius_us: u64,
    /// What to do with a version 1 reply whose signatures verify only with "RoughTime".
    pub v1_draft_spelling: DraftSpelling,
}

impl VerifyPolicy {
    /// Accepts radii up to `max_radius_us` and rejects version 1 replies signed with the drafts'
    /// spelling.
    pub fn new(max_radius_us: u64) -> Self {
        Self {
            max_radius_us,
            v1_draft_spelling: DraftSpelling::Reject,
        }
    }

    /// The same policy, accepting version 1 replies signed with the drafts' spelling (the result
    /// still records it).
    pub fn accepting_draft_spelling(self) -> Self {
        Self {
            v1_draft_spelling: DraftSpelling::Accept,
            ..self
        }
    }
}

/// Whether a version 1 reply signed with the drafts' "RoughTime" contexts is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftSpelling {
    /// Fail with [`VerifyError::DraftSpellingOnly`].
    Reject,
    /// Accept, recording the spelling in [`Verified`].
    Accept,
}

/// Which of the two signatures in a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signed {
    /// The long-term key's signature over DELE, in CERT.
    Cert,
    /// The online key's signature over SREP.
    Srep,
}

impl core::fmt::Display for Signed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Cert => "CERT",
            Self::Srep => "SREP",
        })
    }
}

/// A reply that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// The version the server answered with.
    pub version: Version,
    /// MIDP as Unix microseconds (seconds scaled for IETF versions; saturating beyond the year
    /// 586 000).
    pub midpoint_unix_us: u64,
    /// RADI in microseconds.
    pub radius_us: u64,
    /// MINT as Unix microseconds.
    pub mint_unix_us: u64,
    /// MAXT as Unix microseconds (saturating: a MAXT of "forever" stays so).
    pub maxt_unix_us: u64,
    /// The online key that signed SREP.
    pub online_key: [u8; KEY_LEN],
    /// The spelling the CERT signature verified with.
    pub cert_spelling: ContextSpelling,
    /// The spelling the SREP signature verified with.
    pub srep_spelling: ContextSpelling,
    /// INDX.
    pub index: u32,
}

impl Verified {
    /// MIDP − RADI: the earliest the server says it signed.
    pub fn earliest_unix_us(&self) -> u64 {
        self.midpoint_unix_us.saturating_sub(self.radius_us)
    }

    /// MIDP + RADI: the latest the server says it signed.
    pub fn latest_unix_us(&self) -> u64 {
        self.midpoint_unix_us.saturating_add(self.radius_us)
    }

    /// True if both signatures used the spelling the version prescribes: always for drafts and
    /// Google, and for version 1 only if signed as RFC 10049's body says.
    pub fn spelling_conforms(&self) -> bool {
        let expected = self.version.family().spelling();
        self.cert_spelling == expected && self.srep_spelling == expected
    }
}

/// Why a reply failed verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The request could not be read.
    #[error("request: {0}")]
    Request(DecodeError),
    /// The reply could not be read.
    #[error("reply: {0}")]
    Reply(DecodeError),
    /// Google requests get unframed replies and IETF requests framed ones.
    #[error("reply framing {reply:?} does not match the request's {request:?}")]
    FramingMismatch {
        /// The request's framing.
        request: Framing,
        /// The reply's framing.
        reply: Framing,
    },
    /// The reply's VER is not a version this crate knows.
    #[error("reply version {number:#010x} is not one this client speaks")]
    UnknownVersion {
        /// The number sent.
        number: u32,
    },
    /// A framed reply carries no VER where its version puts it.
    #[error("reply carries no VER (inside SREP from draft 12 on, top-level before)")]
    MissingVersion,
    /// VER is in the wrong place for the version it names (e.g. version 1 outside SREP, where
    /// it would not be signed).
    #[error("VER names {version} but is not where that version puts it")]
    VersionMisplaced {
        /// The version named.
        version: Version,
    },
    /// The reply has a VER inside SREP and another at the top level, and they differ.
    #[error("signed VER {signed:#010x} differs from top-level VER {top_level:#010x}")]
    VersionConflict {
        /// The VER inside SREP.
        signed: u32,
        /// The VER outside it.
        top_level: u32,
    },
    /// The server answered with a version the request did not offer.
    #[error("reply speaks {version}, which the request did not offer")]
    NotOffered {
        /// The reply's version.
        version: Version,
    },
    /// SREP's VERS must list SREP's VER.
    #[error("VERS does not list the reply's version {version}")]
    VersMissingVersion {
        /// The reply's version.
        version: Version,
    },
    /// The request's nonce has the wrong size for the reply's version.
    #[error("request nonce of {len} bytes, {version} uses {expected}")]
    RequestNonceLength {
        /// Bytes in the request's NONC.
        len: usize,
        /// Bytes the version uses.
        expected: usize,
        /// The reply's version.
        version: Version,
    },
    /// NONC is required in IETF replies.
    #[error("reply has no NONC")]
    MissingNonce,
    /// NONC is not the request's nonce.
    #[error("reply's NONC is not the request's nonce")]
    NonceMismatch,
    /// TYPE is required from draft 12 on (this crate follows draft 19 for 0x8000000c).
    #[error("reply has no TYPE")]
    MissingType,
    /// TYPE must be 1 in a response.
    #[error("TYPE is {value}, not 1 (response)")]
    NotAResponse {
        /// The TYPE sent.
        value: u32,
    },
    /// The configured long-term key is not an Ed25519 public key.
    #[error("the long-term public key is not a valid Ed25519 key")]
    BadLongTermKey,
    /// PUBK is not an Ed25519 public key.
    #[error("PUBK is not a valid Ed25519 key")]
    BadOnlineKey,
    /// A signature does not verify with any spelling the version allows.
    #[error("{which} signature does not verify")]
    BadSignature {
        /// Which signature.
        which: Signed,
    },
    /// A version 1 signature verifies only with the drafts' "RoughTime" context, against RFC
    /// 10049 §5.2.1/§5.2.6, and the policy rejects that.
    #[error(
        "{which} signature of a version 1 reply verifies only with the drafts' context \
         \"RoughTime v1 …\", not RFC 10049's \"Roughtime v1 …\""
    )]
    DraftSpellingOnly {
        /// The first signature that needed the drafts' spelling.
        which: Signed,
    },
    /// MIDP is outside the online key's validity.
    #[error(
        "MIDP {midpoint_unix_us} is outside the delegation's [{mint_unix_us}, {maxt_unix_us}] (Unix µs)"
    )]
    OutsideDelegation {
        /// MIDP, in microseconds since the Unix epoch.
        midpoint_unix_us: u64,
        /// MINT, likewise.
        mint_unix_us: u64,
        /// MAXT, likewise.
        maxt_unix_us: u64,
    },
    /// A draft 07 MJD timestamp that is not a time: more microseconds than a day has, or a day
    /// before 1970.
    #[error("{tag} {value:#018x} is not a time in {version}'s format")]
    BadTimestamp {
        /// MIDP, MINT or MAXT.
        tag: Tag,
        /// What it held.
        value: u64,
        /// The reply's version.
        version: Version,
    },
    /// ROOT has the wrong size for the version.
    #[error("ROOT of {len} bytes, {version} uses {expected}")]
    RootLength {
        /// Bytes in ROOT.
        len: usize,
        /// Bytes the version uses.
        expected: usize,
        /// The reply's version.
        version: Version,
    },
    /// PATH or INDX is malformed.
    #[error(transparent)]
    Path(#[from] PathError),
    /// PATH and INDX lead from the request to a root other than ROOT.
    #[error("the request is not in the signed Merkle tree: PATH and INDX {index} lead elsewhere")]
    NotInTree {
        /// INDX.
        index: u32,
    },
    /// RADI is 0, which no server may send (RFC 10049 §5.2.5).
    #[error("RADI is 0")]
    ZeroRadius,
    /// RADI is above the policy's cap.
    #[error("radius of {radius_us} µs exceeds the cap of {max_us} µs")]
    RadiusTooLarge {
        /// The reply's radius.
        radius_us: u64,
        /// The policy's cap.
        max_us: u64,
    },
}

/// Verifies `reply` as the answer to `request` from the server with `long_term_key`: the
/// version and framing agreed (RFC 10049 §5.1), the request echoed (§5.2), both signatures
/// (§5.2.4, §6.2), the signed version list (§5.2.5), the times within the delegation (§5.2.4),
/// the request in the Merkle tree (§5.3), and the radius (§5.2.5, and the policy's cap).
pub fn verify_reply(
    request: &[u8],
    reply: &[u8],
    long_term_key: &[u8; KEY_LEN],
    policy: &VerifyPolicy,
) -> Result<Verified, VerifyError> {
    let req = Request::parse(request).map_err(VerifyError::Request)?;
    let rep = Reply::parse(reply).map_err(VerifyError::Reply)?;
    let version = agreed_version(&req, &rep)?;
    let family = version.family();
    check_echo(&req, &rep, version)?;
    let (cert_spelling, srep_spelling) = check_signatures(&rep, long_term_key, family, policy)?;
    if family.signs_version() {
        let vers = srep_versions(&rep)?;
        if !version.number().is_some_and(|n| vers.contains(n)) {
            return Err(VerifyError::VersMissingVersion { version });
        }
    }
    let (midpoint_unix_us, mint_unix_us, maxt_unix_us) = delegated_times(&rep, version)?;
    check_in_tree(&req, &rep, version)?;
    let radius_us = radius_us(&rep, version, policy)?;
    Ok(Verified {
        version,
        midpoint_unix_us,
        radius_us,
        mint_unix_us,
        maxt_unix_us,
        online_key: *rep.cert.online_key,
        cert_spelling,
        srep_spelling,
        index: rep.index,
    })
}

/// The version request and reply agree on, framed alike. pyroughtime 1.0.1's server answers
/// draft 07 without the ROUGHTIM header (roughtimed and tannerryan's roughtime send it);
/// pyroughtime's client takes either, and so does this one, for draft 07 alone. The version then
/// comes from the top-level VER, as it would framed.
fn agreed_version(req: &Request<'_>, rep: &Reply<'_>) -> Result<Version, VerifyError> {
    let headerless_draft07 = req.framing == Framing::Ietf
        && rep.framing == Framing::Google
        && rep.top_version.is_some_and(|v| {
            Version::Draft07
                .number()
                .is_some_and(|n| v == n.to_le_bytes())
        });
    if req.framing != rep.framing && !headerless_draft07 {
        return Err(VerifyError::FramingMismatch {
            request: req.framing,
            reply: rep.framing,
        });
    }
    reply_version(req, rep)
}

/// The request as the reply echoes it: a nonce of the version's length, the same in the reply
/// (which IETF versions must carry), and TYPE 1 where the version has TYPE.
fn check_echo(req: &Request<'_>, rep: &Reply<'_>, version: Version) -> Result<(), VerifyError> {
    let family = version.family();
    if req.nonce.len() != family.nonce_len() {
        return Err(VerifyError::RequestNonceLength {
            len: req.nonce.len(),
            expected: family.nonce_len(),
            version,
        });
    }
    match (rep.nonce, family.framing()) {
        (Some(nonce), _) if nonce != req.nonce => return Err(VerifyError::NonceMismatch),
        (None, Framing::Ietf) => return Err(VerifyError::MissingNonce),
        _ => {}
    }
    if family.has_type() {
        match rep.type_value {
            None => return Err(VerifyError::MissingType),
            Some(1) => {}
            Some(value) => return Err(VerifyError::NotAResponse { value }),
        }
    }
    Ok(())
}

/// The long-term key's signature over DELE and the online key's over SREP, and the spelling of
/// the context each verified with (a version 1 reply signed only with the drafts' spelling is
/// refused unless the policy accepts it).
fn check_signatures(
    rep: &Reply<'_>,
    long_term_key: &[u8; KEY_LEN],
    family: Family,
    policy: &VerifyPolicy,
) -> Result<(ContextSpelling, ContextSpelling), VerifyError> {
    let long_term =
        VerifyingKey::from_bytes(long_term_key).map_err(|_| VerifyError::BadLongTermKey)?;
    let cert_spelling = verify_signed(
        &long_term,
        family,
        Signed::Cert,
        rep.cert.signature,
        rep.cert.dele,
    )?;
    let online =
        VerifyingKey::from_bytes(rep.cert.online_key).map_err(|_| VerifyError::BadOnlineKey)?;
    let srep_spelling =
        verify_signed(&online, family, Signed::Srep, rep.signature, rep.srep.bytes)?;
    if policy.v1_draft_spelling == DraftSpelling::Reject {
        for (which, spelling) in [(Signed::Cert, cert_spelling), (Signed::Srep, srep_spelling)] {
            if spelling != family.spelling() {
                return Err(VerifyError::DraftSpellingOnly { which });
            }
        }
    }
    Ok((cert_spelling, srep_spelling))
}

/// MIDP, MINT and MAXT as Unix microseconds, the midpoint within the delegation's window.
fn delegated_times(rep: &Reply<'_>, version: Version) -> Result<(u64, u64, u64), VerifyError> {
    let format = version.family().time_format();
    let unix_us = |tag, value| {
        format.decode_us(value).ok_or(VerifyError::BadTimestamp {
            tag,
            value,
            version,
        })
    };
    let midpoint_unix_us = unix_us(Tag::MIDP, rep.srep.midpoint)?;
    let mint_unix_us = unix_us(Tag::MINT, rep.cert.mint)?;
    let maxt_unix_us = unix_us(Tag::MAXT, rep.cert.maxt)?;
    if !(mint_unix_us..=maxt_unix_us).contains(&midpoint_unix_us) {
        return Err(VerifyError::OutsideDelegation {
            midpoint_unix_us,
            mint_unix_us,
            maxt_unix_us,
        });
    }
    Ok((midpoint_unix_us, mint_unix_us, maxt_unix_us))
}

/// The request (its nonce, or the whole packet where the version hashes that) in the tree whose
/// root SREP signs, by PATH and INDX.
fn check_in_tree(req: &Request<'_>, rep: &Reply<'_>, version: Version) -> Result<(), VerifyError> {
    let family = version.family();
    let leaf_data = match family.leaf_data() {
        LeafData::Nonce => req.nonce,
        LeafData::Packet => req.packet,
    };
    let root_ok = match family.hash_len() {
        64 => check_root::<64>(leaf_data, rep, version)?,
        _ => check_root::<32>(leaf_data, rep, version)?,
    };
    if !root_ok {
        return Err(VerifyError::NotInTree { index: rep.index });
    }
    Ok(())
}

/// RADI in microseconds: never 0, and no more than the policy's cap.
fn radius_us(rep: &Reply<'_>, version: Version, policy: &VerifyPolicy) -> Result<u64, VerifyError> {
    if rep.srep.radius == 0 {
        return Err(VerifyError::ZeroRadius);
    }
    let ticks = version.family().time_format().radius_ticks_per_second();
    let radius_us = u64::from(rep.srep.radius) * (1_000_000 / ticks);
    if radius_us > policy.max_radius_us {
        return Err(VerifyError::RadiusTooLarge {
            radius_us,
            max_us: policy.max_radius_us,
        });
    }
    Ok(radius_us)
}

/// The reply's version: Google by the request's framing (the reply's matches it, bar a draft 07
/// reply without header); from draft 12 on VER inside SREP (signed); drafts 07–11 a top-level
/// VER. It must have been offered.
///
/// A reply may carry VER in both places: roughly 0.3.0's server signs one in SREP for drafts
/// 10–11 too, beside the top-level one those drafts have. The signed one is then the version, and
/// the two must agree. A version that signs VER is never taken from the top level alone, where it
/// could have been changed on the way.
fn reply_version(req: &Request<'_>, rep: &Reply<'_>) -> Result<Version, VerifyError> {
    if req.framing == Framing::Google {
        return Ok(Version::Google);
    }
    let number = |bytes: &[u8]| {
        <[u8; 4]>::try_from(bytes)
            .map(u32::from_le_bytes)
            .map_err(|_| {
                VerifyError::Reply(DecodeError::BadLength {
                    tag: Tag::VER,
                    len: bytes.len(),
                    expected: 4,
                })
            })
    };
    let signed = rep.srep.version.map(number).transpose()?;
    let top_level = rep.top_version.map(number).transpose()?;
    let number = match (signed, top_level) {
        (Some(signed), Some(top_level)) if signed != top_level => {
            return Err(VerifyError::VersionConflict { signed, top_level });
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => return Err(VerifyError::MissingVersion),
    };
    let version = Version::from_number(number).ok_or(VerifyError::UnknownVersion { number })?;
    if version.family().signs_version() && signed.is_none() {
        return Err(VerifyError::VersionMisplaced { version });
    }
    if !req.versions.is_some_and(|offered| offered.contains(number)) {
        return Err(VerifyError::NotOffered { version });
    }
    Ok(version)
}

fn srep_versions<'a>(rep: &Reply<'a>) -> Result<VersionList<'a>, VerifyError> {
    // Re-read through the message view so that VERS gets the same list checks as VER.
    let srep = Message::parse(rep.srep.bytes).map_err(VerifyError::Reply)?;
    version_list(&srep, Tag::VERS).map_err(VerifyError::Reply)
}

/// Verifies `signature` over `context ‖ value` with the spelling `family` prescribes; for
/// version 1 also with the drafts' spelling, returning which one worked.
fn verify_signed(
    key: &VerifyingKey,
    family: Family,
    which: Signed,
    signature: &[u8; 64],
    value: &[u8],
) -> Result<ContextSpelling, VerifyError> {
    let signature = Signature::from_bytes(signature);
    let spellings: &[ContextSpelling] = match family {
        Family::Rfc => &[ContextSpelling::Roughtime, ContextSpelling::RoughTime],
        _ => &[ContextSpelling::RoughTime],
    };
    for &spelling in spellings {
        let context = match which {
            Signed::Cert => family.dele_context(spelling),
            Signed::Srep => family.srep_context(spelling),
        };
        let mut message = Vec::with_capacity(context.len() + value.len());
        message.extend_from_slice(context);
        message.extend_from_slice(value);
        // Strict verification: no small-order keys, no non-canonical encodings, so that a
        // signature proves what a malfeasance report claims it proves.
        if key.verify_strict(&message, &signature).is_ok() {
            return Ok(spelling);
        }
    }
    Err(VerifyError::BadSignature { which })
}

/// Walks PATH from the request's leaf; true if it arrives at ROOT.
fn check_root<const H: usize>(
    leaf_data: &[u8],
    rep: &Reply<'_>,
    version: Version,
) -> Result<bool, VerifyError> {
    let root: &[u8; H] = rep
        .srep
        .root
        .try_into()
        .map_err(|_| VerifyError::RootLength {
            len: rep.srep.root.len(),
            expected: H,
            version,
        })?;
    let tree_hash = version.family().tree_hash();
    let leaf = hash_leaf_with(tree_hash, leaf_data);
    let computed = root_from_path_with::<H>(tree_hash, leaf, rep.index, rep.path)?;
    Ok(&computed == root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{LongTermKey, OnlineKey};
    use crate::request::{REQUEST_LEN, build_request};
    use crate::server::{BatchParams, Exchange, Responder, ResponderConfig};

    const NOW_S: u64 = 1_800_000_000;

    fn exchange(versions: &[Version]) -> (Vec<u8>, Vec<u8>, [u8; 32]) {
        let long = LongTermKey::from_seed(&[3; 32]);
        let d = long
            .delegate(OnlineKey::from_seed(&[4; 32]), NOW_S - 10, NOW_S + 10)
            .unwrap();
        let mut request = vec![0u8; REQUEST_LEN];
        let nonce = vec![6u8; versions[0].family().nonce_len()];
        build_request(&mut request, versions, &nonce, Some(&long.srv())).unwrap();
        let mut reply = vec![0u8; 1500];
        let mut responder = Responder::new(ResponderConfig::default());
        let mut ex = [Exchange::new(&request, &mut reply)];
        responder.respond(
            BatchParams {
                now_unix_us: NOW_S * 1_000_000,
                radius_us: 2_000_000,
                delegation: &d,
            },
            &mut ex,
        );
        let len = ex[0].outcome().unwrap().unwrap();
        reply.truncate(len);
        (request, reply, long.public_key())
    }

    #[test]
    fn verifies_every_family() {
        for versions in [
            &[Version::Rfc10049][..],
            &[Version::Draft12],
            &[Version::Draft08, Version::Draft11],
            &[Version::Google],
        ] {
            let (request, reply, pk) = exchange(versions);
            let v = verify_reply(&request, &reply, &pk, &VerifyPolicy::new(5_000_000)).unwrap();
            assert_eq!(v.version, *versions.iter().max().unwrap());
            assert!(v.spelling_conforms());
            match v.version {
                Version::Google => assert_eq!(v.midpoint_unix_us, NOW_S * 1_000_000),
                _ => assert_eq!(v.radius_us, 3_000_000, "rounded up to MIN_RADIUS_S"),
            }
        }
    }

    #[test]
    fn radius_cap_and_wrong_key() {
        let (request, reply, pk) = exchange(&[Version::Rfc10049]);
        assert_eq!(
            verify_reply(&request, &reply, &pk, &VerifyPolicy::new(2_999_999)),
            Err(VerifyError::RadiusTooLarge {
                radius_us: 3_000_000,
                max_us: 2_999_999
            })
        );
        let other = LongTermKey::from_seed(&[9; 32]).public_key();
        assert_eq!(
            verify_reply(&request, &reply, &other, &VerifyPolicy::new(u64::MAX)),
            Err(VerifyError::BadSignature {
                which: Signed::Cert
            })
        );
    }

    /// `reply` (a framed drafts 08–11 reply) with `ver` added inside its SREP and the SREP signed
    /// again by the online key, as roughly 0.3.0's server answers drafts 10 and 11.
    fn with_signed_ver(reply: &[u8], ver: u32) -> Vec<u8> {
        use ed25519_dalek::{Signer, SigningKey};
        let top = Message::parse(&reply[12..]).unwrap();
        let srep = Message::parse(top.get(Tag::SREP).unwrap()).unwrap();
        let ver = ver.to_le_bytes();
        let mut fields: Vec<(Tag, &[u8])> = srep.iter().collect();
        fields.push((Tag::VER, &ver));
        fields.sort_by_key(|(tag, _)| tag.to_u32());
        let mut new_srep = vec![0u8; 512];
        let n = crate::message::encode(&mut new_srep, &fields).unwrap();
        new_srep.truncate(n);
        let context = Family::Draft08.srep_context(Family::Draft08.spelling());
        let signature = SigningKey::from_bytes(&[4; 32])
            .sign(&[context, &new_srep[..]].concat())
            .to_bytes();
        let fields: Vec<(Tag, &[u8])> = top
            .iter()
            .map(|(tag, value)| match tag {
                Tag::SREP => (tag, &new_srep[..]),
                Tag::SIG => (tag, &signature[..]),
                _ => (tag, value),
            })
            .collect();
        let mut message = vec![0u8; 1500];
        let n = crate::message::encode(&mut message, &fields).unwrap();
        let mut out = b"ROUGHTIM".to_vec();
        out.extend_from_slice(&u32::try_from(n).unwrap().to_le_bytes());
        out.extend_from_slice(&message[..n]);
        out
    }

    #[test]
    fn drafts_08_11_reply_may_also_sign_its_ver() {
        let (request, reply, pk) = exchange(&[Version::Draft11]);
        let policy = VerifyPolicy::new(5_000_000);
        // A signed VER that agrees with the top-level one: the reply verifies.
        let same = with_signed_ver(&reply, 0x8000_000b);
        let v = verify_reply(&request, &same, &pk, &policy).unwrap();
        assert_eq!(v.version, Version::Draft11);
        // A signed VER naming another version than the top-level one is refused.
        let conflicting = with_signed_ver(&reply, 0x8000_000a);
        assert_eq!(
            verify_reply(&request, &conflicting, &pk, &policy),
            Err(VerifyError::VersionConflict {
                signed: 0x8000_000a,
                top_level: 0x8000_000b
            })
        );
    }

    #[test]
    fn reply_to_another_request_fails() {
        let (_, reply, pk) = exchange(&[Version::Rfc10049]);
        let (other_request, _, _) = exchange(&[Version::Draft12]);
        assert_eq!(
            verify_reply(&other_request, &reply, &pk, &VerifyPolicy::new(u64::MAX)),
            Err(VerifyError::NotOffered {
                version: Version::Rfc10049
            })
        );
    }
}
