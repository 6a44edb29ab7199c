//! The AEAD algorithms an NTS association may run under (RFC 8915 §5.1, IANA's AEAD registry),
//! and sealing and opening under each without allocating.
//!
//! AES-SIV (RFC 5297) takes the associated data and the nonce as two header components and puts
//! its tag (the synthetic IV) before the ciphertext; AES-GCM-SIV (RFC 8452) takes a 12-byte nonce
//! and puts its tag after. Both tags are 16 bytes.

use aes_gcm_siv::Aes128GcmSiv;
use aes_gcm_siv::aead::AeadInPlace;
use aes_siv::KeyInit;
use aes_siv::siv::{Aes128Siv, Aes256Siv};

use super::TAG_LEN;

/// An AEAD algorithm for NTS, by its IANA number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Aead {
    /// AEAD_AES_SIV_CMAC_256 (15): RFC 8915's mandatory algorithm; two AES-128 keys.
    AesSivCmac256,
    /// AEAD_AES_SIV_CMAC_512 (17): two AES-256 keys; what ntpd-rs clients offer first.
    AesSivCmac512,
    /// AEAD_AES_128_GCM_SIV (30, RFC 8452): one AES-128 key; what chrony 4.4 and later offer
    /// first.
    Aes128GcmSiv,
}

/// The longest key of any [`Aead`]: AEAD_AES_SIV_CMAC_512's.
pub const MAX_KEY_LEN: usize = 64;

impl Aead {
    /// Every algorithm served, in no order of preference: a server takes the client's.
    pub const ALL: [Self; 3] = [Self::AesSivCmac256, Self::AesSivCmac512, Self::Aes128GcmSiv];

    /// A dense index below `Aead::ALL.len()`, for counter arrays: its place in [`Aead::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Self::AesSivCmac256 => 0,
            Self::AesSivCmac512 => 1,
            Self::Aes128GcmSiv => 2,
        }
    }

    /// Its IANA number.
    pub const fn id(self) -> u16 {
        match self {
            Self::AesSivCmac256 => 15,
            Self::AesSivCmac512 => 17,
            Self::Aes128GcmSiv => 30,
        }
    }

    /// The algorithm with IANA number `id`, if it is one of these.
    pub fn from_id(id: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.id() == id)
    }

    /// Its name in IANA's registry.
    pub const fn name(self) -> &'static str {
        match self {
            Self::AesSivCmac256 => "AEAD_AES_SIV_CMAC_256",
            Self::AesSivCmac512 => "AEAD_AES_SIV_CMAC_512",
            Self::Aes128GcmSiv => "AEAD_AES_128_GCM_SIV",
        }
    }

    /// The length of each of an association's two keys.
    pub const fn key_len(self) -> usize {
        match self {
            Self::AesSivCmac256 => 32,
            Self::AesSivCmac512 => 64,
            Self::Aes128GcmSiv => 16,
        }
    }

    /// The nonce this side sends: 16 bytes for AES-SIV (RFC 8915 §5.6 asks at least that), the
    /// 12 AES-GCM-SIV takes.
    pub(super) const fn nonce_len(self) -> usize {
        match self {
            Self::AesSivCmac256 | Self::AesSivCmac512 => 16,
            Self::Aes128GcmSiv => 12,
        }
    }

    /// Whether a nonce of `len` bytes is one this algorithm takes from the other side: AES-SIV
    /// takes any of at least `min_siv`, AES-GCM-SIV exactly 12.
    pub(super) const fn takes_nonce(self, len: usize, min_siv: usize) -> bool {
        match self {
            Self::AesSivCmac256 | Self::AesSivCmac512 => len >= min_siv,
            Self::Aes128GcmSiv => len == 12,
        }
    }

    /// Whether its tag comes before the ciphertext (AES-SIV) or after it (AES-GCM-SIV).
    pub(super) const fn tag_first(self) -> bool {
        matches!(self, Self::AesSivCmac256 | Self::AesSivCmac512)
    }

    /// Encrypts `plain` in place under `key` (its [`Aead::key_len`] bytes), authenticating `ad`
    /// and `nonce` (of a length [`Aead::takes_nonce`]); the tag, or `None` if the key or nonce
    /// is not of a length this algorithm takes.
    pub(super) fn seal(
        self,
        key: &[u8],
        ad: &[u8],
        nonce: &[u8],
        plain: &mut [u8],
    ) -> Option<[u8; TAG_LEN]> {
        let tag = match self {
            Self::AesSivCmac256 => Aes128Siv::new_from_slice(key)
                .ok()?
                .encrypt_in_place_detached([ad, nonce], plain)
                .ok()?,
            Self::AesSivCmac512 => Aes256Siv::new_from_slice(key)
                .ok()?
                .encrypt_in_place_detached([ad, nonce], plain)
                .ok()?,
            Self::Aes128GcmSiv => Aes128GcmSiv::new_from_slice(key)
                .ok()?
                .encrypt_in_place_detached(twelve(nonce)?.into(), ad, plain)
                .ok()?,
        };
        Some(tag.into())
    }

    /// Decrypts `ciphertext` in place under `key` if `tag` authenticates it with `ad` and
    /// `nonce`; `false` (and `ciphertext` unspecified) if not.
    pub(super) fn open(
        self,
        key: &[u8],
        ad: &[u8],
        nonce: &[u8],
        ciphertext: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        match self {
            Self::AesSivCmac256 => Aes128Siv::new_from_slice(key).is_ok_and(|mut siv| {
                (siv.decrypt_in_place_detached([ad, nonce], ciphertext, tag.into())).is_ok()
            }),
            Self::AesSivCmac512 => Aes256Siv::new_from_slice(key).is_ok_and(|mut siv| {
                (siv.decrypt_in_place_detached([ad, nonce], ciphertext, tag.into())).is_ok()
            }),
            Self::Aes128GcmSiv => {
                let (Ok(gcm), Some(nonce)) = (Aes128GcmSiv::new_from_slice(key), twelve(nonce))
                else {
                    return false;
                };
                gcm.decrypt_in_place_detached(nonce.into(), ad, ciphertext, tag.into())
                    .is_ok()
            }
        }
    }
}

impl std::fmt::Display for Aead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.id())
    }
}

/// `nonce` as AES-GCM-SIV's 12 bytes, if it is that long.
fn twelve(nonce: &[u8]) -> Option<&[u8; 12]> {
    nonce.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        hex::decode(s.replace(' ', "")).unwrap()
    }

    /// RFC 8452 appendix C.1's first AEAD_AES_128_GCM_SIV vectors (no data, a block of
    /// plaintext, and a byte of associated data): the tag comes out as the RFC's last 16 bytes of
    /// the result, the ciphertext as the rest, and both open again.
    #[test]
    fn every_algorithm_has_its_index() {
        for (i, aead) in Aead::ALL.into_iter().enumerate() {
            assert_eq!(aead.index(), i, "{aead}");
        }
    }

    #[test]
    fn aes_128_gcm_siv_gives_rfc_8452s_vectors() {
        let key = unhex("01000000000000000000000000000000");
        let nonce = unhex("030000000000000000000000");
        // (AAD, plaintext, result = ciphertext || tag)
        let vectors = [
            ("", "", "dc20e2d83f25705bb49e439eca56de25"),
            (
                "",
                "0100000000000000",
                "b5d839330ac7b786578782fff6013b815b287c22493a364c",
            ),
            (
                "01",
                "0200000000000000",
                "1e6daba35669f4273b0a1a2560969cdf790d99759abd1508",
            ),
        ];
        for (aad, plain, result) in vectors {
            let (aad, plain, result) = (unhex(aad), unhex(plain), unhex(result));
            let mut buf = plain.clone();
            let tag = Aead::Aes128GcmSiv
                .seal(&key, &aad, &nonce, &mut buf)
                .unwrap();
            assert_eq!([&buf[..], &tag[..]].concat(), result);
            assert!(Aead::Aes128GcmSiv.open(&key, &aad, &nonce, &mut buf, &tag));
            assert_eq!(buf, plain);
        }
    }

    /// Vectors from an independent implementation, pyca/cryptography 48 (OpenSSL's AES-SIV and
    /// AES-GCM-SIV), made with the associated data and the nonce as chime passes them:
    /// `AESSIV(key).encrypt(plain, [ad, nonce])` and `AESGCMSIV(key).encrypt(nonce, plain, ad)`.
    #[test]
    fn each_algorithm_agrees_with_an_independent_implementation() {
        let (ad, plain) = (b"associated data".as_slice(), b"the plaintext!".as_slice());
        let vectors = [
            (Aead::AesSivCmac256, INDEPENDENT_SIV_256),
            (Aead::AesSivCmac512, INDEPENDENT_SIV_512),
            (Aead::Aes128GcmSiv, INDEPENDENT_GCM_SIV),
        ];
        for (aead, expected) in vectors {
            let key: Vec<u8> = (0..aead.key_len() as u8).collect();
            let nonce: Vec<u8> = (100..100 + aead.nonce_len() as u8).collect();
            let mut buf = plain.to_vec();
            let tag = aead.seal(&key, ad, &nonce, &mut buf).unwrap();
            let out = match aead.tag_first() {
                true => [&tag[..], &buf[..]].concat(),
                false => [&buf[..], &tag[..]].concat(),
            };
            assert_eq!(hex::encode(out), expected, "{aead}");
        }
    }

    const INDEPENDENT_SIV_256: &str =
        "639ec07812fa1cc8a5aa0c707484fa71eef7ff0426c56c241ea007192d51";
    const INDEPENDENT_SIV_512: &str =
        "ae6bf19e77d01d271a40876ee5dd904ad9c2c9f7e3857f1cc970c5ef6fba";
    const INDEPENDENT_GCM_SIV: &str =
        "11f811eaacba881eec497c98f628697b0a4fccc7c595f54ab7315d873356";

    #[test]
    fn a_changed_byte_or_a_wrong_length_does_not_open() {
        for aead in Aead::ALL {
            let key = vec![7u8; aead.key_len()];
            let nonce = vec![9u8; aead.nonce_len()];
            let mut buf = *b"sixteen bytes!!!";
            let tag = aead.seal(&key, b"ad", &nonce, &mut buf).unwrap();
            let sealed = buf;
            assert!(!aead.open(&key, b"ae", &nonce, &mut buf, &tag), "{aead}");
            buf = sealed;
            let mut bad_tag = tag;
            bad_tag[0] ^= 1;
            assert!(
                !aead.open(&key, b"ad", &nonce, &mut buf, &bad_tag),
                "{aead}"
            );
            buf = sealed;
            assert!(
                !aead.open(&key[1..], b"ad", &nonce, &mut buf, &tag),
                "{aead}"
            );
            assert!(
                aead.seal(&key[1..], b"ad", &nonce, &mut buf).is_none(),
                "{aead}"
            );
            buf = sealed;
            assert!(aead.open(&key, b"ad", &nonce, &mut buf, &tag), "{aead}");
            assert_eq!(&buf, b"sixteen bytes!!!");
        }
        let gcm = Aead::Aes128GcmSiv;
        assert!(gcm.seal(&[0; 16], b"", &[0; 16], &mut []).is_none());
        assert!(gcm.takes_nonce(12, 16) && !gcm.takes_nonce(16, 16));
        assert!(
            Aead::AesSivCmac512.takes_nonce(16, 16) && !Aead::AesSivCmac512.takes_nonce(12, 16)
        );
    }

    #[test]
    fn ids_name_the_algorithms() {
        for aead in Aead::ALL {
            assert_eq!(Aead::from_id(aead.id()), Some(aead));
        }
        assert_eq!(Aead::from_id(16), None);
        assert_eq!(Aead::Aes128GcmSiv.to_string(), "AEAD_AES_128_GCM_SIV (30)");
    }
}
