//! A fleet's shared secret, its file, and the cookie master key each member derives from it for
//! each rotation period.

use chime_keyfile::{Field, KeyFileError, KeyFileWriter, key_lines};
use zeroize::{Zeroize, Zeroizing};

use super::KEY_LEN;

/// The length of a fleet secret.
pub const FLEET_SECRET_LEN: usize = 32;

/// The secret every member of a fleet holds, from which each derives the same cookie master key
/// for each rotation period ([`fleet_key`]). Wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct FleetSecret(pub [u8; FLEET_SECRET_LEN]);

impl Drop for FleetSecret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for FleetSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FleetSecret(..)")
    }
}

/// The HKDF info prefix of a fleet key; the period follows, 8 bytes big-endian. A new derivation
/// would get a new label, so that keys of two versions never coincide.
const FLEET_KEY_INFO: &[u8] = b"chime NTS fleet cookie key v1";

/// The cookie master key of rotation period `period` under `secret`, with its id: HKDF-SHA256
/// (RFC 5869) with `secret` as the input keying material, no salt, and the label `chime NTS
/// fleet cookie key v1` followed by the period as info, expanded to 36 bytes, the first 4 the id
/// and the rest the key. A pure function of its inputs, so every member derives it alone.
pub fn fleet_key(secret: &FleetSecret, period: u64) -> (u32, [u8; KEY_LEN]) {
    let mut info = [0u8; FLEET_KEY_INFO.len() + 8];
    info[..FLEET_KEY_INFO.len()].copy_from_slice(FLEET_KEY_INFO);
    info[FLEET_KEY_INFO.len()..].copy_from_slice(&period.to_be_bytes());
    let mut okm = [0u8; 4 + KEY_LEN];
    // 36 bytes is far under HKDF-SHA256's limit of 255 hashes: expanding cannot fail.
    let _ = hkdf::Hkdf::<sha2::Sha256>::new(None, &secret.0).expand(&info, &mut okm);
    let id = u32::from_be_bytes([okm[0], okm[1], okm[2], okm[3]]);
    let mut key = [0u8; KEY_LEN];
    key.copy_from_slice(&okm[4..]);
    okm.zeroize();
    (id, key)
}

/// The fleet secret file's text for `secret`: comments that say what it is, then one `secret`
/// line of 64 hex digits. A fleet replacing its secret adds a `previous` line with the old one,
/// which then opens cookies but seals none
/// ([`CookieKeys::for_fleet`](super::CookieKeys::for_fleet)). `chime nts-fleet-key` writes it;
/// chimed reads it with [`parse_fleet_file`]. Wiped when dropped.
pub fn encode_fleet_file(secret: &FleetSecret) -> Zeroizing<String> {
    let mut file = KeyFileWriter::new();
    file.comment("chime NTS fleet secret: every member of one fleet holds this same file (chimed")
        .comment(
            "--nts-fleet-key), and derives the NTS cookie keys from it. Keep it secret: whoever has",
        )
        .comment(
            "it can open every client's cookies. To replace it, add the old one as a `previous` line",
        )
        .comment("beside the new `secret` on every member, then remove it a rotation later.")
        .line(&[Field::Word(SECRET), Field::Hex(&secret.0)]);
    file.finish()
}

/// Reads a fleet secret file ([`encode_fleet_file`]): the secret, and the previous one if the
/// file has a `previous` line. Blank lines and `#` comments are skipped; anything else, a missing
/// or repeated `secret`, or a secret that is not 64 hex digits is an error naming the line.
pub fn parse_fleet_file(text: &str) -> Result<(FleetSecret, Option<FleetSecret>), KeyFileError> {
    let (mut secret, mut previous) = (None, None);
    for mut line in key_lines(text) {
        let (slot, what) = match line.label() {
            SECRET => (&mut secret, "`secret`"),
            PREVIOUS => (&mut previous, "`previous`"),
            _ => return Err(line.wrong_label("`secret HEX` or `previous HEX`")),
        };
        if slot.is_some() {
            return Err(line.repeated(what));
        }
        let bytes = line.hex::<FLEET_SECRET_LEN>("the secret")?;
        line.end("the secret")?;
        *slot = Some(FleetSecret(*bytes));
    }
    let secret = match (secret, &previous) {
        (Some(secret), _) => secret,
        (None, None) => return Err(KeyFileError::Empty),
        (None, Some(_)) => return Err(KeyFileError::Missing { what: "`secret`" }),
    };
    if previous.as_ref() == Some(&secret) {
        return Err(KeyFileError::Invalid {
            what: "`previous` is the same as `secret`",
        });
    }
    Ok((secret, previous))
}

/// The labels of the fleet secret file's lines.
const SECRET: &str = "secret";
const PREVIOUS: &str = "previous";
