//! **Experimental, and part of no draft**: the ML-DSA-44 (FIPS 204) suite tannerryan's roughtime
//! server offers as version 0x90000001, over TCP only (its replies are some 6.4 KB: far past what
//! UDP may answer a 1 KB request with).
//!
//! The wire format is that of drafts 12 on and RFC 10049 with the signatures swapped:
//!
//! * request: VER (offering 0x90000001), SRV, NONC (32 bytes), TYPE = 0, padding;
//! * reply: SIG, NONC, TYPE = 1, PATH, SREP {VER, RADI, MIDP, `VERS = [0x90000001]`, ROOT}, CERT
//!   {SIG, DELE {PUBK, MINT, MAXT}}, INDX; times in Unix seconds, RADI in seconds;
//! * SIG fields are ML-DSA-44 signatures (2420 bytes) and PUBK an ML-DSA-44 public key (1312
//!   bytes); each signs the bare SREP or DELE bytes with FIPS 204's context parameter set to
//!   "RoughTime v1 response signature\0" or "RoughTime v1 delegation signature\0" (no context
//!   prefix on the message, unlike Ed25519's);
//! * SRV = SHA-512(0xff ‖ the 1312-byte long-term public key), first 32 bytes; the Merkle tree is
//!   that of drafts 12 on (SHA-512 truncated to 32 bytes, leaf = 0x00 ‖ the whole request
//!   packet).
//!
//! Keys come from 32-byte FIPS 204 seeds (ξ). Signing here is FIPS 204's deterministic variant
//! (this crate takes no randomness); tannerryan's server signs with the hedged one, and either
//! verifies the same. ML-DSA comes from RustCrypto's `ml-dsa` crate.

use chime_keyfile::Field;
use ml_dsa::{
    EncodedVerifyingKey, Keypair as _, MlDsa44, Seed, Signature, SigningKey, VerifyingKey,
};

use crate::merkle::{MerkleTree, hash, hash_leaf_with, root_from_path_with};
use crate::message::{Message, encode};
use crate::packet::{FRAME_HEADER_LEN, MAGIC, Packet};
use crate::request::Request;
use crate::server::DropReason;
use crate::tag::Tag;
use crate::version::Family;

/// The suite's version number.
pub const VERSION: u32 = 0x9000_0001;
/// Bytes of an ML-DSA-44 public key.
pub const PUBLIC_KEY_LEN: usize = 1312;
/// Bytes of an ML-DSA-44 signature.
pub const SIGNATURE_LEN: usize = 2420;
/// Bytes of a key's seed.
pub const SEED_LEN: usize = 32;
const SREP_CONTEXT: &[u8] = b"RoughTime v1 response signature\0";
const DELE_CONTEXT: &[u8] = b"RoughTime v1 delegation signature\0";
/// Least RADI, as for the RFC.
const MIN_RADIUS_S: u32 = 3;

/// Why a reply does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PqError {
    /// The bytes do not parse as a reply (or the request as a request).
    #[error("not a well-formed message: {0}")]
    Malformed(String),
    /// A field has the wrong value or size.
    #[error("{0}")]
    Field(&'static str),
    /// The long-term key's signature over DELE does not verify.
    #[error("the certificate's signature does not verify under the long-term key")]
    Certificate,
    /// The online key's signature over SREP does not verify.
    #[error("the response's signature does not verify under the online key")]
    Response,
    /// The request's leaf, INDX and PATH do not lead to ROOT.
    #[error("the request is not in the signed tree")]
    NotInTree,
    /// MIDP is outside the certificate's MINT..MAXT.
    #[error("the time is outside the certificate's window")]
    OutsideWindow,
}

fn malformed(e: impl std::fmt::Display) -> PqError {
    PqError::Malformed(e.to_string())
}

/// SRV for an ML-DSA-44 long-term public key.
pub fn srv_value(public_key: &[u8]) -> [u8; 32] {
    hash(&[&[0xff], public_key])
}

/// A long-term ML-DSA-44 key.
#[derive(Clone)]
pub struct PqLongTermKey {
    key: SigningKey<MlDsa44>,
}

impl std::fmt::Debug for PqLongTermKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PqLongTermKey(..)")
    }
}

impl PqLongTermKey {
    /// The key from its 32-byte seed (FIPS 204's ξ).
    pub fn from_seed(seed: &[u8; SEED_LEN]) -> Self {
        Self {
            key: SigningKey::from_seed(&Seed::from(*seed)),
        }
    }

    /// The public key clients are given, 1312 bytes.
    pub fn public_key(&self) -> Vec<u8> {
        self.key.verifying_key().encode().to_vec()
    }

    /// Certifies an online key (from its seed) for `mint_unix_s..=maxt_unix_s`.
    pub fn delegate(
        &self,
        online_seed: &[u8; SEED_LEN],
        mint_unix_s: u64,
        maxt_unix_s: u64,
    ) -> PqDelegation {
        let online = SigningKey::<MlDsa44>::from_seed(&Seed::from(*online_seed));
        let pubk = online.verifying_key().encode();
        let (mint, maxt) = (mint_unix_s.to_le_bytes(), maxt_unix_s.to_le_bytes());
        let mut dele = vec![0u8; PUBLIC_KEY_LEN + 64];
        let len = encode(
            &mut dele,
            &[(Tag::PUBK, &pubk), (Tag::MINT, &mint), (Tag::MAXT, &maxt)],
        )
        .expect("DELE fits its buffer");
        dele.truncate(len);
        let sig = sign(&self.key, &dele, DELE_CONTEXT);
        let mut cert = vec![0u8; SIGNATURE_LEN + dele.len() + 64];
        let len = encode(&mut cert, &[(Tag::SIG, &sig), (Tag::DELE, &dele)])
            .expect("CERT fits its buffer");
        cert.truncate(len);
        PqDelegation {
            online,
            cert,
            mint_unix_s,
            maxt_unix_s,
            srv: srv_value(&self.public_key()),
        }
    }
}

fn sign(key: &SigningKey<MlDsa44>, message: &[u8], context: &[u8]) -> Vec<u8> {
    key.expanded_key()
        .sign_deterministic(message, context)
        // Only a context over 255 bytes fails; ours are constants of 32 and 34.
        .expect("a short context")
        .encode()
        .to_vec()
}

/// An online key and the certificate the long-term key signed for it.
#[derive(Clone)]
pub struct PqDelegation {
    online: SigningKey<MlDsa44>,
    cert: Vec<u8>,
    mint_unix_s: u64,
    maxt_unix_s: u64,
    srv: [u8; 32],
}

impl std::fmt::Debug for PqDelegation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PqDelegation")
            .field("mint_unix_s", &self.mint_unix_s)
            .field("maxt_unix_s", &self.maxt_unix_s)
            .finish_non_exhaustive()
    }
}

impl PqDelegation {
    /// When the certificate's window opens and closes (Unix seconds).
    pub fn window(&self) -> (u64, u64) {
        (self.mint_unix_s, self.maxt_unix_s)
    }

    /// SRV of the long-term key that certified this one.
    pub fn srv(&self) -> &[u8; 32] {
        &self.srv
    }
}

/// Whether `packet` is a request that offers the suite (and so should be answered with it).
pub fn offered(packet: &[u8]) -> bool {
    Request::parse(packet)
        .ok()
        .and_then(|r| r.versions)
        .is_some_and(|v| v.contains(VERSION))
}

/// Signs batches of requests for the suite: one signature over one Merkle tree per batch.
#[derive(Debug)]
pub struct PqResponder {
    tree: MerkleTree<32>,
    nonces: Vec<[u8; 32]>,
}

impl PqResponder {
    /// A responder for batches of up to `capacity` requests.
    pub fn new(capacity: usize) -> Self {
        Self {
            tree: MerkleTree::with_capacity_and_hash(capacity, Family::Draft12.tree_hash()),
            nonces: Vec::with_capacity(capacity),
        }
    }

    /// Starts a new batch.
    pub fn clear(&mut self) {
        self.tree.clear();
        self.nonces.clear();
    }

    /// Adds a request (a whole packet) to the batch, answerable under `delegation`'s long-term
    /// key; returns its place in the batch.
    pub fn add(&mut self, packet: &[u8], delegation: &PqDelegation) -> Result<usize, DropReason> {
        let request = Request::parse(packet).map_err(|_| DropReason::Malformed)?;
        if !request
            .versions
            .as_ref()
            .is_some_and(|v| v.contains(VERSION))
        {
            return Err(DropReason::NoCommonVersion);
        }
        let nonce: [u8; 32] = request.nonce.try_into().map_err(|_| DropReason::BadNonce)?;
        match request.type_value {
            Some(0) => {}
            Some(_) => return Err(DropReason::NotARequest),
            None => return Err(DropReason::MissingType),
        }
        if request.srv.is_some_and(|srv| srv != delegation.srv()) {
            return Err(DropReason::UnknownServer);
        }
        self.tree.push(packet).ok_or(DropReason::BatchFull)?;
        self.nonces.push(nonce);
        Ok(self.nonces.len() - 1)
    }

    /// Signs the batch at `now_unix_us` with error bound `radius_us`; the replies, in the order
    /// the requests were added, each a whole packet.
    pub fn sign(
        &mut self,
        now_unix_us: u64,
        radius_us: u64,
        delegation: &PqDelegation,
    ) -> Result<Vec<Vec<u8>>, DropReason> {
        let root = self.tree.build().ok_or(DropReason::StaleTicket)?;
        let midp = now_unix_us.saturating_add(500_000) / 1_000_000;
        if !(delegation.mint_unix_s..=delegation.maxt_unix_s).contains(&midp) {
            return Err(DropReason::OutsideDelegation);
        }
        let rounding = now_unix_us.abs_diff(midp.saturating_mul(1_000_000));
        let radi = radius_us.saturating_add(rounding).div_ceil(1_000_000);
        let radi = u32::try_from(radi)
            .map_err(|_| DropReason::RadiusTooLarge)?
            .max(MIN_RADIUS_S);
        let version = VERSION.to_le_bytes();
        let mut srep = vec![0u8; 128];
        let len = encode(
            &mut srep,
            &[
                (Tag::VER, &version),
                (Tag::RADI, &radi.to_le_bytes()),
                (Tag::MIDP, &midp.to_le_bytes()),
                (Tag::VERS, &version),
                (Tag::ROOT, &root),
            ],
        )
        .map_err(|_| DropReason::ReplyTooLarge)?;
        srep.truncate(len);
        let sig = sign(&delegation.online, &srep, SREP_CONTEXT);
        let mut path = vec![0u8; self.tree.path_len()];
        let mut replies = Vec::with_capacity(self.nonces.len());
        for (index, nonce) in self.nonces.iter().enumerate() {
            let index = index as u32;
            self.tree
                .write_path(index, &mut path)
                .ok_or(DropReason::StaleTicket)?;
            let mut reply =
                vec![0u8; FRAME_HEADER_LEN + 64 + SIGNATURE_LEN + path.len() + srep.len()];
            reply.resize(reply.len() + delegation.cert.len() + 64, 0);
            let len = encode(
                &mut reply[FRAME_HEADER_LEN..],
                &[
                    (Tag::SIG, &sig),
                    (Tag::NONC, nonce),
                    (Tag::TYPE, &1u32.to_le_bytes()),
                    (Tag::PATH, &path),
                    (Tag::SREP, &srep),
                    (Tag::CERT, &delegation.cert),
                    (Tag::INDX, &index.to_le_bytes()),
                ],
            )
            .map_err(|_| DropReason::ReplyTooLarge)?;
            reply[..8].copy_from_slice(&MAGIC);
            reply[8..FRAME_HEADER_LEN].copy_from_slice(&(len as u32).to_le_bytes());
            reply.truncate(FRAME_HEADER_LEN + len);
            replies.push(reply);
        }
        Ok(replies)
    }
}

/// A request for the suite: VER, SRV (of `public_key`), NONC, TYPE, padded to 1024 bytes.
pub fn build_request(nonce: &[u8; 32], public_key: &[u8]) -> Vec<u8> {
    let srv = srv_value(public_key);
    let version = VERSION.to_le_bytes();
    let fields_len = 4 + 32 + 32 + 4;
    let header = 4 + 4 * 4 + 5 * 4;
    let pad = crate::REQUEST_LEN - FRAME_HEADER_LEN - header - fields_len;
    let zeros = vec![0u8; pad];
    let mut out = vec![0u8; crate::REQUEST_LEN];
    let len = encode(
        &mut out[FRAME_HEADER_LEN..],
        &[
            (Tag::VER, &version),
            (Tag::SRV, &srv),
            (Tag::NONC, nonce),
            (Tag::TYPE, &0u32.to_le_bytes()),
            (Tag::ZZZZ, &zeros),
        ],
    )
    .expect("a request fits 1024 bytes");
    out[..8].copy_from_slice(&MAGIC);
    out[8..FRAME_HEADER_LEN].copy_from_slice(&(len as u32).to_le_bytes());
    out.truncate(FRAME_HEADER_LEN + len);
    out
}

/// The key line's label, so that neither kind of long-term key file reads as the other.
const KEY_FILE_LABEL: &str = "mldsa44";

/// The key file's text for `seed`: a comment, and the seed after `mldsa44 ` in hex (so that
/// neither kind of key file reads as the other); wiped when dropped.
pub fn encode_key_file(seed: &[u8; SEED_LEN]) -> zeroize::Zeroizing<String> {
    let mut file = chime_keyfile::KeyFileWriter::new();
    file.comment(
        "chime Roughtime long-term key for the experimental ML-DSA-44 suite (0x90000001, part",
    )
    .comment("of no draft): a FIPS 204 seed. Keep this file secret (mode 0600).")
    .line(&[Field::Word(KEY_FILE_LABEL), Field::Hex(seed)]);
    file.finish()
}

/// The seed in an ML-DSA-44 key file's text, in a buffer wiped when dropped.
pub fn parse_key_file(
    text: &str,
) -> Result<zeroize::Zeroizing<[u8; SEED_LEN]>, chime_keyfile::KeyFileError> {
    let mut line = chime_keyfile::single_line(text)?;
    if line.label() != KEY_FILE_LABEL {
        return Err(line.wrong_label("`mldsa44 HEX`"));
    }
    let seed = line.hex("the seed")?;
    line.end("the seed")?;
    Ok(seed)
}

/// What a verified reply says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PqVerified {
    /// The signed time, Unix seconds.
    pub midpoint_unix_s: u64,
    /// Its radius, seconds.
    pub radius_s: u32,
    /// The online key's window (Unix seconds).
    pub mint_unix_s: u64,
    /// The online key's window's end.
    pub maxt_unix_s: u64,
    /// The reply's place in its batch.
    pub index: u32,
}

/// Verifies a reply to `request` fully under the long-term `public_key` (1312 bytes): both
/// signatures with their contexts, the nonce, the request's place in the signed tree, the time
/// within the certificate's window.
pub fn verify_reply(
    request: &[u8],
    reply: &[u8],
    public_key: &[u8],
) -> Result<PqVerified, PqError> {
    let req = Request::parse(request).map_err(malformed)?;
    let packet = Packet::parse(reply).map_err(malformed)?;
    let m = Message::parse(packet.message).map_err(malformed)?;
    if m.u32(Tag::TYPE).map_err(malformed)? != 1 {
        return Err(PqError::Field("TYPE is not 1"));
    }
    if m.require(Tag::NONC).map_err(malformed)? != req.nonce {
        return Err(PqError::Field("NONC is not the request's"));
    }
    let srep_bytes = m.require(Tag::SREP).map_err(malformed)?;
    let srep = m.nested(Tag::SREP).map_err(malformed)?;
    if srep.u32(Tag::VER).map_err(malformed)? != VERSION {
        return Err(PqError::Field("SREP's VER is not 0x90000001"));
    }
    let cert = m.nested(Tag::CERT).map_err(malformed)?;
    let dele_bytes = cert.require(Tag::DELE).map_err(malformed)?;
    let dele = cert.nested(Tag::DELE).map_err(malformed)?;
    let long_term = verifying_key(public_key)?;
    let cert_sig = signature(cert.require(Tag::SIG).map_err(malformed)?)?;
    if !long_term.verify_with_context(dele_bytes, DELE_CONTEXT, &cert_sig) {
        return Err(PqError::Certificate);
    }
    let online = verifying_key(dele.require(Tag::PUBK).map_err(malformed)?)?;
    let sig = signature(m.require(Tag::SIG).map_err(malformed)?)?;
    if !online.verify_with_context(srep_bytes, SREP_CONTEXT, &sig) {
        return Err(PqError::Response);
    }
    let index = m.u32(Tag::INDX).map_err(malformed)?;
    let leaf = hash_leaf_with::<32>(Family::Draft12.tree_hash(), request);
    let path = m.require(Tag::PATH).map_err(malformed)?;
    let root = root_from_path_with(Family::Draft12.tree_hash(), leaf, index, path)
        .map_err(|_| PqError::NotInTree)?;
    if &root[..] != srep.require(Tag::ROOT).map_err(malformed)? {
        return Err(PqError::NotInTree);
    }
    let midpoint_unix_s = srep.u64(Tag::MIDP).map_err(malformed)?;
    let (mint_unix_s, maxt_unix_s) = (
        dele.u64(Tag::MINT).map_err(malformed)?,
        dele.u64(Tag::MAXT).map_err(malformed)?,
    );
    if !(mint_unix_s..=maxt_unix_s).contains(&midpoint_unix_s) {
        return Err(PqError::OutsideWindow);
    }
    Ok(PqVerified {
        midpoint_unix_s,
        radius_s: srep.u32(Tag::RADI).map_err(malformed)?,
        mint_unix_s,
        maxt_unix_s,
        index,
    })
}

fn verifying_key(bytes: &[u8]) -> Result<VerifyingKey<MlDsa44>, PqError> {
    let enc = EncodedVerifyingKey::<MlDsa44>::try_from(bytes)
        .map_err(|_| PqError::Field("a public key is not 1312 bytes"))?;
    Ok(VerifyingKey::decode(&enc))
}

fn signature(bytes: &[u8]) -> Result<Signature<MlDsa44>, PqError> {
    Signature::try_from(bytes).map_err(|_| PqError::Field("a signature is not ML-DSA-44's"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_S: u64 = 1_795_285_217;

    #[test]
    fn a_batch_signs_once_and_every_reply_verifies() {
        let long_term = PqLongTermKey::from_seed(&[1; 32]);
        let public = long_term.public_key();
        assert_eq!(public.len(), PUBLIC_KEY_LEN);
        let d = long_term.delegate(&[2; 32], NOW_S - 3600, NOW_S + 3600);
        let requests: Vec<Vec<u8>> = (0..5u8).map(|i| build_request(&[i; 32], &public)).collect();
        assert!(requests.iter().all(|r| r.len() == crate::REQUEST_LEN));
        assert!(offered(&requests[0]));
        let mut responder = PqResponder::new(8);
        for r in &requests {
            responder.add(r, &d).unwrap();
        }
        let replies = responder.sign(NOW_S * 1_000_000, 1_000_000, &d).unwrap();
        for (i, (req, reply)) in requests.iter().zip(&replies).enumerate() {
            let v = verify_reply(req, reply, &public).unwrap();
            assert_eq!((v.midpoint_unix_s, v.index), (NOW_S, i as u32));
            assert!(v.radius_s >= 3);
        }
        // Another request's reply, another key, a flipped bit: all refused.
        assert_eq!(
            verify_reply(&requests[0], &replies[1], &public),
            Err(PqError::Field("NONC is not the request's"))
        );
        let other = PqLongTermKey::from_seed(&[3; 32]).public_key();
        assert_eq!(
            verify_reply(&requests[0], &replies[0], &other),
            Err(PqError::Certificate)
        );
        let mut bent = replies[2].clone();
        let at = bent.len() / 3;
        bent[at] ^= 1;
        assert!(verify_reply(&requests[2], &bent, &public).is_err());
    }

    #[test]
    fn key_files_round_trip_and_are_not_ed25519_ones() {
        let seed = [0xab; 32];
        let text = encode_key_file(&seed);
        assert_eq!(*parse_key_file(&text).unwrap(), seed);
        assert!(crate::parse_key_file(&text).is_err());
        let ed = crate::encode_key_file(&seed);
        let says = |text: &str| parse_key_file(text).unwrap_err().to_string();
        assert_eq!(says(&ed), "line 3: expected `mldsa44 HEX`");
        assert_eq!(
            says("mldsa44 12\n"),
            "line 1: the seed is 2 hex digits, not 64"
        );
        let twice = format!("{}{}", &*text, &*text);
        assert_eq!(says(&twice), "line 6: trailing junk after the key line");
    }

    #[test]
    fn requests_it_cannot_answer_are_refused() {
        let long_term = PqLongTermKey::from_seed(&[1; 32]);
        let d = long_term.delegate(&[2; 32], NOW_S - 3600, NOW_S + 3600);
        let mut responder = PqResponder::new(2);
        // An Ed25519 request (RFC 10049) does not offer the suite.
        let mut ed = vec![0u8; crate::REQUEST_LEN];
        crate::build_request(&mut ed, &[crate::Version::Rfc10049], &[0; 32], None).unwrap();
        assert!(!offered(&ed));
        assert_eq!(responder.add(&ed, &d), Err(DropReason::NoCommonVersion));
        // One naming another key.
        let other = PqLongTermKey::from_seed(&[9; 32]).public_key();
        let wrong = build_request(&[0; 32], &other);
        assert_eq!(responder.add(&wrong, &d), Err(DropReason::UnknownServer));
        // Outside the window, nothing is signed.
        let ok = build_request(&[0; 32], &long_term.public_key());
        responder.add(&ok, &d).unwrap();
        assert_eq!(
            responder.sign((NOW_S + 7200) * 1_000_000, 0, &d),
            Err(DropReason::OutsideDelegation)
        );
    }
}
