//! Keys and certificates: the long-term key, the online key it delegates to, and the CERT that
//! proves the delegation.
//!
//! The long-term key stays with the control plane; workers only ever hold a [`Delegation`], which
//! is the online key plus its CERT encoded once per [`Family`] (the families differ in the DELE
//! context and, for Google, in MINT/MAXT units). Rotating the online key means creating a new
//! `Delegation` with [`LongTermKey::delegate`] and handing it to the workers; nothing in a batch
//! re-encodes a certificate.
//!
//! Keys come in as 32-byte seeds: this crate reads no randomness. RFC 10049 §9.3 asks that they
//! be generated as RFC 8032 §5.1.5 describes, which a random seed is.

use core::fmt;

use ed25519_dalek::{Signer, SigningKey};

use crate::codec::Writer;
use crate::merkle::hash;
use crate::message::write_header;
use crate::tag::Tag;
use crate::version::Family;

/// Bytes of an Ed25519 seed, public key, and of an SRV value.
pub(crate) const KEY_LEN: usize = 32;
/// Bytes of an Ed25519 signature.
pub(crate) const SIGNATURE_LEN: usize = 64;
/// Bytes of an encoded DELE: `{PUBK, MINT, MAXT}`.
pub(crate) const DELE_LEN: usize = 24 + KEY_LEN + 8 + 8;
/// Bytes of an encoded CERT: `{SIG, DELE}`.
pub(crate) const CERT_LEN: usize = 16 + SIGNATURE_LEN + DELE_LEN;

/// The SRV value that names a long-term key: `SHA-512(0xff ‖ public key)[0..32]`.
pub fn srv_value(long_term_public_key: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    hash(&[&[0xff], long_term_public_key])
}

/// The server's long-term identity. Clients know its public key in advance.
#[derive(Clone)]
pub struct LongTermKey {
    key: SigningKey,
}

impl LongTermKey {
    /// The key with this Ed25519 seed.
    pub fn from_seed(seed: &[u8; KEY_LEN]) -> Self {
        Self {
            key: SigningKey::from_bytes(seed),
        }
    }

    /// The public key clients are configured with.
    pub fn public_key(&self) -> [u8; KEY_LEN] {
        self.key.verifying_key().to_bytes()
    }

    /// The SRV value requests use to name this key.
    pub fn srv(&self) -> [u8; KEY_LEN] {
        srv_value(&self.public_key())
    }

    /// Delegates to `online` for midpoints from `mint_unix_s` to `maxt_unix_s` inclusive (Unix
    /// seconds), signing one CERT per family. Done once per online-key rotation.
    pub fn delegate(
        &self,
        online: OnlineKey,
        mint_unix_s: u64,
        maxt_unix_s: u64,
    ) -> Result<Delegation, DelegationError> {
        if mint_unix_s > maxt_unix_s {
            return Err(DelegationError::EmptyValidity {
                mint_unix_s,
                maxt_unix_s,
            });
        }
        let online_public = online.public_key();
        let certs = Family::ALL.map(|family| {
            // Google counts microseconds and draft 07 writes MJD dates; a MAXT of "forever"
            // (u64::MAX seconds) saturates at the largest time each format holds.
            let format = family.time_format();
            let (mint, maxt) = (
                format.encode_seconds(mint_unix_s),
                format.encode_seconds(maxt_unix_s),
            );
            self.certificate(family, &online_public, mint, maxt)
        });
        Ok(Delegation {
            online,
            certs,
            mint_unix_s,
            maxt_unix_s,
            srv: self.srv(),
            long_term_public: self.public_key(),
        })
    }

    fn certificate(
        &self,
        family: Family,
        online_public: &[u8; KEY_LEN],
        mint: u64,
        maxt: u64,
    ) -> Certificate {
        let dele = dele_bytes(online_public, mint, maxt);
        let signature = sign_with_context(&self.key, family.dele_context(family.spelling()), &dele);
        cert_bytes(&signature, &dele)
    }
}

/// An encoded DELE, `{PUBK, MINT, MAXT}` (MINT and MAXT already in the family's time format).
fn dele_bytes(online_public: &[u8; KEY_LEN], mint: u64, maxt: u64) -> [u8; DELE_LEN] {
    let mut dele = [0u8; DELE_LEN];
    let mut w = Writer::new(&mut dele);
    // Fixed sizes, fixed tag order: these writes cannot fail, and a failure would show up as a
    // certificate that does not verify, which the tests check.
    let _ = write_header(
        &mut w,
        &[(Tag::PUBK, KEY_LEN), (Tag::MINT, 8), (Tag::MAXT, 8)],
    );
    let _ = w.put(online_public);
    let _ = w.put_u64(mint);
    let _ = w.put_u64(maxt);
    dele
}

/// An encoded CERT, `{SIG, DELE}`.
fn cert_bytes(signature: &[u8; SIGNATURE_LEN], dele: &[u8; DELE_LEN]) -> Certificate {
    let mut bytes = [0u8; CERT_LEN];
    let mut w = Writer::new(&mut bytes);
    let _ = write_header(&mut w, &[(Tag::SIG, SIGNATURE_LEN), (Tag::DELE, DELE_LEN)]);
    let _ = w.put(signature);
    let _ = w.put(dele);
    Certificate { bytes }
}

impl fmt::Debug for LongTermKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LongTermKey")
            .field("public_key", &Hex(&self.public_key()))
            .finish_non_exhaustive()
    }
}

/// A short-lived key that signs SREPs on the long-term key's behalf.
#[derive(Clone)]
pub struct OnlineKey {
    key: SigningKey,
}

impl OnlineKey {
    /// The key with this Ed25519 seed (fresh random bytes from the caller at every rotation).
    pub fn from_seed(seed: &[u8; KEY_LEN]) -> Self {
        Self {
            key: SigningKey::from_bytes(seed),
        }
    }

    /// The public key, as PUBK carries it.
    pub fn public_key(&self) -> [u8; KEY_LEN] {
        self.key.verifying_key().to_bytes()
    }

    /// The seed, for writing a delegation bundle ([`crate::make_bundle`]); wiped when dropped.
    pub fn seed(&self) -> zeroize::Zeroizing<[u8; KEY_LEN]> {
        zeroize::Zeroizing::new(self.key.to_bytes())
    }
}

impl fmt::Debug for OnlineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnlineKey")
            .field("public_key", &Hex(&self.public_key()))
            .finish_non_exhaustive()
    }
}

/// An encoded CERT value, `{SIG, DELE{PUBK, MINT, MAXT}}`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Certificate {
    bytes: [u8; CERT_LEN],
}

impl Certificate {
    /// The encoded CERT value.
    pub fn as_bytes(&self) -> &[u8; CERT_LEN] {
        &self.bytes
    }

    /// A CERT value as encoded, e.g. read back from a delegation bundle. Nothing is checked
    /// here; [`Delegation::from_certificates`] checks it.
    pub fn from_bytes(bytes: [u8; CERT_LEN]) -> Self {
        Self { bytes }
    }
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Certificate")
            .field(&Hex(&self.bytes))
            .finish()
    }
}

/// An online key with its certificates: everything a worker needs to sign, and nothing that
/// could sign another delegation.
#[derive(Clone)]
pub struct Delegation {
    online: OnlineKey,
    certs: [Certificate; Family::COUNT],
    mint_unix_s: u64,
    maxt_unix_s: u64,
    srv: [u8; KEY_LEN],
    long_term_public: [u8; KEY_LEN],
}

impl Delegation {
    /// A delegation made elsewhere (where the long-term key lives), from its online key and its
    /// certificates in [`Family::ALL`] order: each must be the CERT the long-term key with public
    /// key `long_term_public` signs for this online key, `mint_unix_s` and `maxt_unix_s` in its
    /// family's context and time format, the check a client makes of a CERT.
    pub fn from_certificates(
        online: OnlineKey,
        certs: [Certificate; Family::COUNT],
        mint_unix_s: u64,
        maxt_unix_s: u64,
        long_term_public: [u8; KEY_LEN],
    ) -> Result<Self, DelegationError> {
        if mint_unix_s > maxt_unix_s {
            return Err(DelegationError::EmptyValidity {
                mint_unix_s,
                maxt_unix_s,
            });
        }
        let verifier = ed25519_dalek::VerifyingKey::from_bytes(&long_term_public)
            .map_err(|_| DelegationError::BadLongTermKey)?;
        let online_public = online.public_key();
        for (family, cert) in Family::ALL.into_iter().zip(&certs) {
            let format = family.time_format();
            let dele = dele_bytes(
                &online_public,
                format.encode_seconds(mint_unix_s),
                format.encode_seconds(maxt_unix_s),
            );
            let mut signature = [0u8; SIGNATURE_LEN];
            signature.copy_from_slice(&cert.bytes[16..16 + SIGNATURE_LEN]);
            let context = family.dele_context(family.spelling());
            let mut signed = Vec::with_capacity(context.len() + DELE_LEN);
            signed.extend_from_slice(context);
            signed.extend_from_slice(&dele);
            let valid = cert_bytes(&signature, &dele) == *cert
                && verifier
                    .verify_strict(&signed, &ed25519_dalek::Signature::from_bytes(&signature))
                    .is_ok();
            if !valid {
                return Err(DelegationError::BadCertificate { family });
            }
        }
        Ok(Self {
            online,
            certs,
            mint_unix_s,
            maxt_unix_s,
            srv: srv_value(&long_term_public),
            long_term_public,
        })
    }

    /// The online key, for writing a delegation bundle.
    pub fn online_key(&self) -> &OnlineKey {
        &self.online
    }

    /// The CERT value sent to clients of `family`.
    pub fn certificate(&self, family: Family) -> &Certificate {
        &self.certs[family.index()]
    }

    /// The online public key.
    pub fn online_public_key(&self) -> [u8; KEY_LEN] {
        self.online.public_key()
    }

    /// The long-term public key that signed the certificates.
    pub fn long_term_public_key(&self) -> [u8; KEY_LEN] {
        self.long_term_public
    }

    /// The SRV value of the long-term key; requests naming another key are dropped.
    pub fn srv(&self) -> &[u8; KEY_LEN] {
        &self.srv
    }

    /// First second (Unix) the certificates cover.
    pub fn mint_unix_s(&self) -> u64 {
        self.mint_unix_s
    }

    /// Last second (Unix) the certificates cover.
    pub fn maxt_unix_s(&self) -> u64 {
        self.maxt_unix_s
    }

    /// True if a midpoint at `unix_s` lies inside the validity, so clients will accept it.
    pub fn covers(&self, unix_s: u64) -> bool {
        (self.mint_unix_s..=self.maxt_unix_s).contains(&unix_s)
    }

    /// Signs an encoded SREP with the context of `family`.
    pub(crate) fn sign_srep(&self, family: Family, srep: &[u8]) -> [u8; SIGNATURE_LEN] {
        sign_with_context(
            &self.online.key,
            family.srep_context(family.spelling()),
            srep,
        )
    }
}

impl fmt::Debug for Delegation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delegation")
            .field("online_public_key", &Hex(&self.online_public_key()))
            .field("long_term_public_key", &Hex(&self.long_term_public))
            .field("mint_unix_s", &self.mint_unix_s)
            .field("maxt_unix_s", &self.maxt_unix_s)
            .finish_non_exhaustive()
    }
}

/// Why a delegation could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DelegationError {
    /// MINT is after MAXT, so no midpoint would ever be valid.
    #[error("delegation from {mint_unix_s} to {maxt_unix_s} (Unix seconds) is empty")]
    EmptyValidity {
        /// Requested MINT.
        mint_unix_s: u64,
        /// Requested MAXT.
        maxt_unix_s: u64,
    },
    /// The long-term public key is not an Ed25519 point.
    #[error("the long-term public key is not a valid Ed25519 key")]
    BadLongTermKey,
    /// A certificate is not the one the long-term key signs for this online key and validity.
    #[error("the {family:?} certificate does not verify under the long-term key")]
    BadCertificate {
        /// The family whose certificate failed.
        family: Family,
    },
}

/// Longest context plus the largest value signed (an SREP with the longest VERS; a DELE is
/// smaller). Signing assembles the message on the stack: no allocation on the hot path.
const MAX_SIGNED_LEN: usize = 64 + 160;

fn sign_with_context(key: &SigningKey, context: &[u8], value: &[u8]) -> [u8; SIGNATURE_LEN] {
    let mut buf = [0u8; MAX_SIGNED_LEN];
    let mut w = Writer::new(&mut buf);
    // The callers sign fixed-size structures that fit; should one ever not, the signature is
    // made over a truncated message and fails verification instead of panicking a worker.
    let _ = w.put(context);
    let _ = w.put(value);
    let len = w.position();
    key.sign(&buf[..len]).to_bytes()
}

/// Hex for `Debug` output.
struct Hex<'a>(&'a [u8]);

impl fmt::Debug for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, encoded_len};
    use ed25519_dalek::{Signature, VerifyingKey};

    const INTEROP_SEED: [u8; 32] = [
        0x06, 0xe5, 0xe2, 0xdc, 0x28, 0x69, 0x7b, 0xb3, 0x63, 0xde, 0x00, 0x97, 0x6a, 0xf2, 0xd4,
        0x22, 0x81, 0x9b, 0xc6, 0x78, 0x32, 0xad, 0x65, 0x5a, 0xde, 0x96, 0x08, 0x1e, 0xcc, 0x1b,
        0xcd, 0xb5,
    ];

    fn hex(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    #[test]
    fn interop_key_and_srv() {
        // The IETF interop harness key, as documented in the vectors' README.
        let k = LongTermKey::from_seed(&INTEROP_SEED);
        assert_eq!(
            k.public_key().to_vec(),
            hex("231bbb82a8c9f5353a231b0ef30c59c40153e6d7ba15c65942ae6f5c5977e491")
        );
        assert_eq!(
            k.srv().to_vec(),
            hex("cdcfa4e8234b5404316d22e413f8b581602af2ed127317f5c15e26ee4e751254")
        );
    }

    #[test]
    fn certificates_verify_per_family() {
        let long = LongTermKey::from_seed(&INTEROP_SEED);
        let online = OnlineKey::from_seed(&[7; 32]);
        let d = long.delegate(online.clone(), 1000, 2000).unwrap();
        let vk = VerifyingKey::from_bytes(&long.public_key()).unwrap();
        for family in Family::ALL {
            let cert = Message::parse(d.certificate(family).as_bytes()).unwrap();
            let sig = Signature::from_bytes(cert.fixed::<64>(Tag::SIG).unwrap());
            let dele_bytes = cert.require(Tag::DELE).unwrap();
            let mut msg = family.dele_context(family.spelling()).to_vec();
            msg.extend_from_slice(dele_bytes);
            vk.verify_strict(&msg, &sig).unwrap();
            let dele = cert.nested(Tag::DELE).unwrap();
            assert_eq!(dele.fixed::<32>(Tag::PUBK).unwrap(), &online.public_key());
            let format = family.time_format();
            assert_eq!(dele.u64(Tag::MINT).unwrap(), format.encode_seconds(1000));
            assert_eq!(dele.u64(Tag::MAXT).unwrap(), format.encode_seconds(2000));
            assert_eq!(
                format.decode_us(format.encode_seconds(2000)),
                Some(2_000_000_000)
            );
        }
        assert!(d.covers(1000) && d.covers(2000) && !d.covers(999) && !d.covers(2001));
        assert_eq!(d.srv(), &long.srv());
    }

    #[test]
    fn forever_saturates_for_google() {
        let long = LongTermKey::from_seed(&INTEROP_SEED);
        let d = long
            .delegate(OnlineKey::from_seed(&[1; 32]), 0, u64::MAX)
            .unwrap();
        let cert = Message::parse(d.certificate(Family::Google).as_bytes()).unwrap();
        let dele = cert.nested(Tag::DELE).unwrap();
        assert_eq!(dele.u64(Tag::MAXT).unwrap(), u64::MAX);
    }

    #[test]
    fn empty_validity_is_refused() {
        let long = LongTermKey::from_seed(&INTEROP_SEED);
        assert_eq!(
            long.delegate(OnlineKey::from_seed(&[1; 32]), 5, 4)
                .unwrap_err(),
            DelegationError::EmptyValidity {
                mint_unix_s: 5,
                maxt_unix_s: 4
            }
        );
    }

    #[test]
    fn debug_shows_no_secret() {
        let long = LongTermKey::from_seed(&INTEROP_SEED);
        let s = format!("{long:?}");
        assert!(s.contains("231bbb82"));
        assert!(!s.contains("06e5e2dc"));
    }

    #[test]
    fn lengths_match_the_encoder() {
        assert_eq!(encoded_len(&[KEY_LEN, 8, 8]), DELE_LEN);
        assert_eq!(encoded_len(&[SIGNATURE_LEN, DELE_LEN]), CERT_LEN);
    }
}
