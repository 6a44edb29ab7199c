//! Network Time Security for NTPv4 (RFC 8915), the server's part, sans-IO.
//!
//! NTS has two halves. In NTS-KE a client opens TLS 1.3 to the key-establishment port, both sides
//! export two keys from the session (client-to-server and server-to-client), and the server hands
//! out *cookies*: the two keys sealed under a master key only the server knows. [`ke_response`]
//! answers the client's NTS-KE records; the daemon runs the TLS and exports the keys.
//!
//! Then each NTP request carries one cookie, a unique identifier and an authenticator: an
//! AEAD_AES_SIV_CMAC_256 tag over the packet, under the client-to-server key. The server opens the
//! cookie ([`CookieKeys::open`]), checks the tag ([`check_request`]), and answers with the
//! identifier echoed and an authenticator under the server-to-client key whose ciphertext holds
//! fresh cookies, one for each the client spent or asked for with a placeholder
//! ([`write_response`]). The reply is exactly as long as the request (the placeholders reserve the
//! room), never longer. A cookie that does not open (an old master key, a forgery) or a tag that
//! does not verify gets an NTS NAK ([`write_nak`]): a Kiss-o'-Death `NTSN` with the identifier and
//! nothing else, which tells the client to run NTS-KE again.
//!
//! Nothing here allocates or reads a clock; nonces come from the caller.

use std::ops::Range;

use aes_siv::KeyInit;
use aes_siv::siv::Aes128Siv;
use zeroize::Zeroize;

use crate::packet::Header;
use crate::responder::kiss_of_death;

/// The one AEAD algorithm served: AEAD_AES_SIV_CMAC_256 (IANA 15), RFC 8915's mandatory one.
pub const AEAD_AES_SIV_CMAC_256: u16 = 15;
/// Its key length: two AES-128 keys.
pub const KEY_LEN: usize = 32;
/// The length of the nonce and of the SIV tag.
const NONCE_LEN: usize = 16;
const TAG_LEN: usize = 16;
/// The TLS exporter label of RFC 8915 §5.1.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-network-time-security";
/// The ALPN protocol of NTS-KE.
pub const ALPN: &[u8] = b"ntske/1";
/// The exporter context for NTPv4 with AEAD_AES_SIV_CMAC_256: protocol 0, algorithm 15, then 0 for
/// the client-to-server key and 1 for the server-to-client key.
pub const EXPORTER_C2S: [u8; 5] = [0, 0, 0, 15, 0];
/// See [`EXPORTER_C2S`].
pub const EXPORTER_S2C: [u8; 5] = [0, 0, 0, 15, 1];

/// NTS extension field types (RFC 8915 §5.3–5.6).
mod ef {
    pub(super) const UNIQUE_IDENTIFIER: u16 = 0x0104;
    pub(super) const COOKIE: u16 = 0x0204;
    pub(super) const COOKIE_PLACEHOLDER: u16 = 0x0304;
    pub(super) const AUTHENTICATOR: u16 = 0x0404;
}

/// The most cookies one reply carries, as chronyd.
const MAX_COOKIES: usize = 8;
/// The shortest unique identifier a request may carry.
const MIN_UNIQUE_ID: usize = 32;

/// A sealed cookie: key id (4), nonce (16), SIV tag (16), then the sealed algorithm (2), padding
/// (2) and the two keys (64): 104 bytes, a multiple of 4 as clients require.
pub const COOKIE_LEN: usize = 4 + NONCE_LEN + TAG_LEN + COOKIE_PLAIN;
const COOKIE_PLAIN: usize = 2 + 2 + 2 * KEY_LEN;

/// The two keys of one client's NTS association.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    /// Client to server: the requests' authenticators.
    pub c2s: [u8; KEY_LEN],
    /// Server to client: the replies' authenticators and the cookies in them.
    pub s2c: [u8; KEY_LEN],
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.c2s.zeroize();
        self.s2c.zeroize();
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys { .. }")
    }
}

/// The master keys cookies are sealed under: the current one seals, it and the others open. On
/// one server the others are the key before the current one, so cookies handed out just before a
/// rotation still work. On a fleet ([`CookieKeys::for_fleet`]) they are the neighbouring rotation
/// periods' keys, and an old fleet secret's while it is being replaced.
#[derive(Clone)]
pub struct CookieKeys {
    current: (u32, [u8; KEY_LEN]),
    /// The other keys that open, the most recent first.
    also_open: Vec<(u32, [u8; KEY_LEN])>,
}

impl Drop for CookieKeys {
    // A rotated-out master key is wiped once the last worker lets go of the set that held it.
    fn drop(&mut self) {
        self.current.1.zeroize();
        for (_, key) in &mut self.also_open {
            key.zeroize();
        }
    }
}

impl std::fmt::Debug for CookieKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<u32> = self.also_open.iter().map(|k| k.0).collect();
        f.debug_struct("CookieKeys")
            .field("current_id", &self.current.0)
            .field("also_open_ids", &ids)
            .finish_non_exhaustive()
    }
}

impl CookieKeys {
    /// Master keys with `key` (random bits) as the current one, named `id`.
    pub fn new(id: u32, key: [u8; KEY_LEN]) -> Self {
        Self {
            current: (id, key),
            also_open: Vec::new(),
        }
    }

    /// The keys after a rotation: `key` seals from now on, the current one still opens.
    pub fn rotated(&self, id: u32, key: [u8; KEY_LEN]) -> Self {
        Self {
            current: (id, key),
            also_open: vec![self.current],
        }
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> u32 {
        self.current.0
    }

    /// The key that seals, with its id: what a server saves so that its cookies outlive a
    /// restart.
    pub fn current(&self) -> (u32, [u8; KEY_LEN]) {
        self.current
    }

    /// The most recent other key that still opens, with its id: on one server, the key before.
    pub fn previous(&self) -> Option<(u32, [u8; KEY_LEN])> {
        self.also_open.first().copied()
    }

    /// Master keys as [`CookieKeys::current`] and [`CookieKeys::previous`] gave them, e.g. read
    /// back from where a server saved them.
    pub fn from_parts(
        current: (u32, [u8; KEY_LEN]),
        previous: Option<(u32, [u8; KEY_LEN])>,
    ) -> Self {
        Self {
            current,
            also_open: previous.into_iter().collect(),
        }
    }

    /// A fleet member's keys for rotation period `period` (Unix time divided by the rotation
    /// interval): [`fleet_key`] of `secret` for `period` seals; it and the keys of the periods
    /// before and after open (members' clocks differ a little, and a client's cookie outlives a
    /// period's end), and so do those of `old_secret`, if given, while the fleet replaces it.
    /// Every member with the same secrets derives the same keys: no store, no copying.
    pub fn for_fleet(secret: &FleetSecret, old_secret: Option<&FleetSecret>, period: u64) -> Self {
        let neighbours = [period.checked_sub(1), period.checked_add(1)];
        let mut also_open: Vec<_> = neighbours
            .iter()
            .flatten()
            .map(|&p| fleet_key(secret, p))
            .collect();
        if let Some(old) = old_secret {
            also_open.push(fleet_key(old, period));
            also_open.extend(neighbours.iter().flatten().map(|&p| fleet_key(old, p)));
        }
        Self {
            current: fleet_key(secret, period),
            also_open,
        }
    }

    /// Seals `keys` into a cookie with a fresh random `nonce`.
    pub fn seal(&self, keys: &Keys, nonce: [u8; NONCE_LEN]) -> [u8; COOKIE_LEN] {
        let (id, master) = &self.current;
        let mut cookie = [0u8; COOKIE_LEN];
        let (head, body) = cookie.split_at_mut(4 + NONCE_LEN + TAG_LEN);
        head[..4].copy_from_slice(&id.to_be_bytes());
        head[4..4 + NONCE_LEN].copy_from_slice(&nonce);
        body[..2].copy_from_slice(&AEAD_AES_SIV_CMAC_256.to_be_bytes());
        body[4..4 + KEY_LEN].copy_from_slice(&keys.c2s);
        body[4 + KEY_LEN..].copy_from_slice(&keys.s2c);
        let mut siv = Aes128Siv::new(master.into());
        // Sealing cannot fail: two headers, and the plaintext is not empty.
        if let Ok(tag) = siv.encrypt_in_place_detached([&head[..4], &nonce[..]], body) {
            head[4 + NONCE_LEN..].copy_from_slice(&tag);
        }
        cookie
    }

    /// The keys in `cookie`, if one of our master keys sealed it and nobody changed it since.
    pub fn open(&self, cookie: &[u8]) -> Option<Keys> {
        let cookie: &[u8; COOKIE_LEN] = cookie.try_into().ok()?;
        let id = u32::from_be_bytes(cookie[..4].try_into().ok()?);
        let (_, master) = std::iter::once(&self.current)
            .chain(&self.also_open)
            .find(|(k, _)| *k == id)?;
        let nonce = &cookie[4..4 + NONCE_LEN];
        let tag = aes_siv::Tag::clone_from_slice(&cookie[4 + NONCE_LEN..4 + NONCE_LEN + TAG_LEN]);
        let mut body = [0u8; COOKIE_PLAIN];
        body.copy_from_slice(&cookie[4 + NONCE_LEN + TAG_LEN..]);
        let mut siv = Aes128Siv::new(master.into());
        siv.decrypt_in_place_detached([&cookie[..4], nonce], &mut body, &tag)
            .ok()?;
        let mut keys = Keys {
            c2s: [0; KEY_LEN],
            s2c: [0; KEY_LEN],
        };
        keys.c2s.copy_from_slice(&body[4..4 + KEY_LEN]);
        keys.s2c.copy_from_slice(&body[4 + KEY_LEN..]);
        let algorithm = u16::from_be_bytes([body[0], body[1]]);
        body.zeroize();
        (algorithm == AEAD_AES_SIV_CMAC_256).then_some(keys)
    }
}

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
/// (RFC 5869) with `secret` as the input keying material, no salt, and [`FLEET_KEY_INFO`]
/// followed by the period as info, expanded to 36 bytes, the first 4 the id and the rest the key.
/// A pure function of its inputs, so every member derives it alone.
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
/// which then opens cookies but seals none ([`CookieKeys::for_fleet`]). `chime nts-fleet-key`
/// writes it; chimed reads it with [`parse_fleet_file`].
pub fn encode_fleet_file(secret: &FleetSecret) -> zeroize::Zeroizing<String> {
    let mut text = zeroize::Zeroizing::new(String::with_capacity(512));
    text.push_str(
        "# chime NTS fleet secret: every member of one fleet holds this same file (chimed\n\
         # --nts-fleet-key), and derives the NTS cookie keys from it. Keep it secret: whoever has\n\
         # it can open every client's cookies. To replace it, add the old one as a `previous` line\n\
         # beside the new `secret` on every member, then remove it a rotation later.\n\
         secret ",
    );
    for b in secret.0 {
        text.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        text.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    text.push('\n');
    text
}

/// Reads a fleet secret file ([`encode_fleet_file`]): the secret, and the previous one if the
/// file has a `previous` line. Blank lines and `#` comments are skipped; anything else, a missing
/// or repeated `secret`, or a secret that is not 64 hex digits is an error naming the line.
pub fn parse_fleet_file(text: &str) -> Result<(FleetSecret, Option<FleetSecret>), String> {
    let (mut secret, mut previous) = (None, None);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |what: &str| format!("line {}: {what}", n + 1);
        let (slot, hex) = match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["secret", hex] => (&mut secret, hex),
            ["previous", hex] => (&mut previous, hex),
            _ => return Err(bad("expected `secret HEX` or `previous HEX`")),
        };
        if slot.is_some() {
            return Err(bad("given twice"));
        }
        *slot = Some(parse_secret(hex).ok_or_else(|| bad("not 64 hex digits"))?);
    }
    let secret = secret.ok_or("no `secret` line")?;
    if previous.as_ref() == Some(&secret) {
        return Err("`previous` is the same as `secret`".into());
    }
    Ok((secret, previous))
}

fn parse_secret(hex: &str) -> Option<FleetSecret> {
    if hex.len() != 2 * FLEET_SECRET_LEN || !hex.is_ascii() {
        return None;
    }
    let mut secret = FleetSecret([0; FLEET_SECRET_LEN]);
    for (byte, pair) in secret.0.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let digits = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(digits, 16).ok()?;
    }
    Some(secret)
}

/// One extension field of a request: its type, where its body is, and where it starts.
#[derive(Clone, Debug)]
struct Field {
    ty: u16,
    start: usize,
    body: Range<usize>,
}

/// The extension fields after the header, as `check_extensions` accepted them: a remainder of 20
/// or 24 bytes is a MAC, not a field.
fn fields(packet: &[u8]) -> impl Iterator<Item = Field> + '_ {
    let mut at = Header::LEN;
    std::iter::from_fn(move || {
        let remaining = packet.len().checked_sub(at)?;
        if remaining < 16 || remaining == 20 || remaining == 24 {
            return None;
        }
        let ty = u16::from_be_bytes([packet[at], packet[at + 1]]);
        let len = usize::from(u16::from_be_bytes([packet[at + 2], packet[at + 3]]));
        if len < 16 || len > remaining || len % 4 != 0 {
            return None;
        }
        let field = Field {
            ty,
            start: at,
            body: at + 4..at + len,
        };
        at += len;
        Some(field)
    })
}

/// A request that passed NTS: what the reply needs.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The association's keys, from the cookie.
    pub keys: Keys,
    /// The unique identifier field's body, to echo.
    unique_id: Range<usize>,
    /// Cookies to return: the one spent plus one per placeholder, at most 8.
    cookies: usize,
}

/// What NTS makes of a request.
#[derive(Debug, Clone)]
pub enum Check {
    /// No NTS fields: an ordinary request.
    NotNts,
    /// Authentic: answer with [`write_response`].
    Verified(Verified),
    /// The cookie did not open or the authenticator did not verify: answer with [`write_nak`]
    /// (the unique identifier's body is at this range).
    Nak(Range<usize>),
    /// NTS fields that are not a valid request (no identifier, two cookies, the authenticator
    /// not last, ...): drop.
    Malformed,
}

/// Checks the NTS fields of an NTPv4 client request that [`crate::respond`] accepted.
pub fn check_request(request: &[u8], cookie_keys: &CookieKeys) -> Check {
    let mut unique_id = None;
    let mut cookie = None;
    let mut wanted = 0usize;
    let mut cookie_len = None;
    let mut auth = None;
    let mut any = false;
    for f in fields(request) {
        match f.ty {
            ef::UNIQUE_IDENTIFIER => {
                any = true;
                if unique_id.is_some() || f.body.len() < MIN_UNIQUE_ID {
                    return Check::Malformed;
                }
                unique_id = Some(f.body.clone());
            }
            ef::COOKIE | ef::COOKIE_PLACEHOLDER => {
                any = true;
                if f.ty == ef::COOKIE {
                    if cookie.is_some() {
                        return Check::Malformed;
                    }
                    cookie = Some(f.body.clone());
                }
                // Placeholders are as long as the cookie: the room its replacement takes.
                if *cookie_len.get_or_insert(f.body.len()) != f.body.len() {
                    return Check::Malformed;
                }
                wanted += 1;
            }
            ef::AUTHENTICATOR => {
                any = true;
                if f.body.end != request.len() {
                    return Check::Malformed;
                }
                auth = Some(f);
            }
            _ => {}
        }
    }
    if !any {
        return Check::NotNts;
    }
    let (Some(unique_id), Some(cookie), Some(auth)) = (unique_id, cookie, auth) else {
        return Check::Malformed;
    };
    let Some(keys) = cookie_keys.open(&request[cookie]) else {
        return Check::Nak(unique_id);
    };
    if !authentic(request, &auth, &keys.c2s) {
        return Check::Nak(unique_id);
    }
    Check::Verified(Verified {
        keys,
        unique_id,
        cookies: wanted.min(MAX_COOKIES),
    })
}

/// Whether the authenticator field `auth` (the request's last) verifies under `c2s`, over every
/// byte before it. Encrypted fields inside it are not used (chime needs none) but must
/// authenticate too; at most 1 KiB of them is checked, anything longer is refused.
fn authentic(request: &[u8], auth: &Field, c2s: &[u8; KEY_LEN]) -> bool {
    open_authenticator(request, auth, c2s, NONCE_LEN, &mut [0u8; 1024]).is_ok()
}

/// Why an authenticator field did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unopened {
    /// Its lengths do not fit the field, the nonce is shorter than `min_nonce`, or the plaintext
    /// is longer than the buffer.
    Malformed,
    /// It does not verify under the key.
    Forged,
}

/// Opens the authenticator field `auth` of `packet` under `key`: nonce and ciphertext lengths, the
/// nonce and the SIV tag and ciphertext (each padded to 4 bytes), with every byte of `packet`
/// before the field as associated data. The plaintext goes to the start of `plain`; its length
/// is returned. Shared by the server (requests) and the client (replies).
fn open_authenticator(
    packet: &[u8],
    auth: &Field,
    key: &[u8; KEY_LEN],
    min_nonce: usize,
    plain: &mut [u8],
) -> Result<usize, Unopened> {
    let body = &packet[auth.body.clone()];
    if body.len() < 4 {
        return Err(Unopened::Malformed);
    }
    let nonce_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let ct_len = usize::from(u16::from_be_bytes([body[2], body[3]]));
    let padded = |n: usize| n.div_ceil(4) * 4;
    if nonce_len < min_nonce
        || ct_len < TAG_LEN
        || 4 + padded(nonce_len) + padded(ct_len) > body.len()
    {
        return Err(Unopened::Malformed);
    }
    let nonce = &body[4..4 + nonce_len];
    let ct = &body[4 + padded(nonce_len)..4 + padded(nonce_len) + ct_len];
    let plain = plain
        .get_mut(..ct_len - TAG_LEN)
        .ok_or(Unopened::Malformed)?;
    plain.copy_from_slice(&ct[TAG_LEN..]);
    let tag = aes_siv::Tag::clone_from_slice(&ct[..TAG_LEN]);
    Aes128Siv::new(key.into())
        .decrypt_in_place_detached([&packet[..auth.start], nonce], plain, &tag)
        .map_err(|_| Unopened::Forged)?;
    Ok(plain.len())
}

/// Completes the reply to a [`Check::Verified`] request: `reply` holds the 48-byte header made
/// by [`crate::respond`], with its transmit timestamp already stamped (the authenticator covers
/// it), and is as long as the request. Appends the echoed identifier and an authenticator under
/// the server-to-client key holding fresh cookies, made by `new_cookie`, as many as were spent
/// or asked for and fit; pads the authenticator so the reply is exactly as long as the request.
/// `nonce` must be fresh random bits. Returns the reply's length, or `None` if not even the
/// identifier and an authenticator without cookies fit (then drop).
pub fn write_response(
    reply: &mut [u8],
    request: &[u8],
    verified: &Verified,
    nonce: [u8; NONCE_LEN],
    mut new_cookie: impl FnMut() -> [u8; COOKIE_LEN],
) -> Option<usize> {
    let target = request.len().min(reply.len());
    let uid = &request[verified.unique_id.clone()];
    let uid_field = 4 + uid.len();
    let auth_start = Header::LEN + uid_field;
    const COOKIE_FIELD: usize = 4 + COOKIE_LEN;
    // Authenticator without cookies: header 4, lengths 4, nonce 16, tag 16.
    let auth_min = 4 + 4 + NONCE_LEN + TAG_LEN;
    let room = target.checked_sub(auth_start + auth_min)?;
    let cookies = verified.cookies.min(room / COOKIE_FIELD);
    let plain_len = cookies * COOKIE_FIELD;
    let auth_len = target - auth_start;

    put_field_header(reply, Header::LEN, ef::UNIQUE_IDENTIFIER, uid_field);
    reply[Header::LEN + 4..auth_start].copy_from_slice(uid);

    put_field_header(reply, auth_start, ef::AUTHENTICATOR, auth_len);
    let lengths = auth_start + 4;
    reply[lengths..lengths + 2].copy_from_slice(&(NONCE_LEN as u16).to_be_bytes());
    reply[lengths + 2..lengths + 4].copy_from_slice(&((TAG_LEN + plain_len) as u16).to_be_bytes());
    let nonce_at = lengths + 4;
    reply[nonce_at..nonce_at + NONCE_LEN].copy_from_slice(&nonce);
    let tag_at = nonce_at + NONCE_LEN;
    let plain_at = tag_at + TAG_LEN;
    for i in 0..cookies {
        let at = plain_at + i * COOKIE_FIELD;
        put_field_header(reply, at, ef::COOKIE, COOKIE_FIELD);
        reply[at + 4..at + COOKIE_FIELD].copy_from_slice(&new_cookie());
    }
    // Padding to the request's length, inside the authenticator, after the ciphertext.
    reply[plain_at + plain_len..target].fill(0);

    let (ad, rest) = reply.split_at_mut(auth_start);
    let plain = &mut rest[plain_at - auth_start..plain_at - auth_start + plain_len];
    let mut siv = Aes128Siv::new((&verified.keys.s2c).into());
    let tag = siv
        .encrypt_in_place_detached([&ad[..], &nonce[..]], plain)
        .ok()?;
    reply[tag_at..plain_at].copy_from_slice(&tag);
    Some(target)
}

/// Turns `reply` (a header made by [`crate::respond`]) into an NTS NAK: a Kiss-o'-Death `NTSN`
/// with the request's unique identifier (at `unique_id` in `request`) and nothing else. Returns
/// its length, or `None` if the buffer cannot hold it.
pub fn write_nak(reply: &mut [u8], request: &[u8], unique_id: Range<usize>) -> Option<usize> {
    let uid = request.get(unique_id)?;
    let len = Header::LEN + 4 + uid.len();
    if len > reply.len() {
        return None;
    }
    kiss_of_death(reply, *b"NTSN");
    put_field_header(reply, Header::LEN, ef::UNIQUE_IDENTIFIER, 4 + uid.len());
    reply[Header::LEN + 4..len].copy_from_slice(uid);
    Some(len)
}

fn put_field_header(buf: &mut [u8], at: usize, ty: u16, len: usize) {
    buf[at..at + 2].copy_from_slice(&ty.to_be_bytes());
    buf[at + 2..at + 4].copy_from_slice(&(len as u16).to_be_bytes());
}

// --- NTS-KE records (RFC 8915 §4) -----------------------------------------------------------

/// NTS-KE record types.
mod record {
    pub(super) const END_OF_MESSAGE: u16 = 0;
    pub(super) const NEXT_PROTOCOL: u16 = 1;
    pub(super) const ERROR: u16 = 2;
    pub(super) const AEAD_ALGORITHM: u16 = 4;
    pub(super) const NEW_COOKIE: u16 = 5;
    pub(super) const NTPV4_SERVER: u16 = 6;
    pub(super) const NTPV4_PORT: u16 = 7;
    pub(super) const CRITICAL: u16 = 0x8000;
}

/// NTS-KE error codes.
const ERROR_UNRECOGNIZED_CRITICAL: u16 = 0;
const ERROR_BAD_REQUEST: u16 = 1;

/// The most bytes of NTS-KE request the server reads, as chronyd.
pub const KE_MAX_REQUEST: usize = 16384;

/// Whether `buf` holds a whole NTS-KE message: records up to and including End of Message.
/// `None` while more bytes are needed; `Some(len)` once the message ends at `len`.
pub fn ke_message_len(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    while at + 4 <= buf.len() {
        let ty = u16::from_be_bytes([buf[at], buf[at + 1]]) & !record::CRITICAL;
        let len = usize::from(u16::from_be_bytes([buf[at + 2], buf[at + 3]]));
        if at + 4 + len > buf.len() {
            return None;
        }
        at += 4 + len;
        if ty == record::END_OF_MESSAGE {
            return Some(at);
        }
    }
    None
}

/// What the server answers to an NTS-KE request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeOutcome {
    /// Agreed on NTPv4 and AEAD_AES_SIV_CMAC_256: export the keys and send [`ke_response`] with
    /// cookies.
    Agreed,
    /// Refused: send this error code (0 unrecognized critical record, 1 bad request).
    Error(u16),
}

/// Reads a whole NTS-KE request (as [`ke_message_len`] found it) and decides.
pub fn ke_check(request: &[u8]) -> KeOutcome {
    let mut at = 0;
    let (mut ntpv4, mut siv, mut protocols_seen, mut aeads_seen, mut ended) =
        (false, false, 0, 0, false);
    while at + 4 <= request.len() && !ended {
        let raw = u16::from_be_bytes([request[at], request[at + 1]]);
        let (critical, ty) = (raw & record::CRITICAL != 0, raw & !record::CRITICAL);
        let len = usize::from(u16::from_be_bytes([request[at + 2], request[at + 3]]));
        let Some(body) = request.get(at + 4..at + 4 + len) else {
            return KeOutcome::Error(ERROR_BAD_REQUEST);
        };
        let ids = || {
            body.chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
        };
        match ty {
            record::END_OF_MESSAGE => ended = true,
            record::NEXT_PROTOCOL => {
                protocols_seen += 1;
                ntpv4 |= body.len() % 2 == 0 && ids().any(|p| p == 0);
            }
            record::AEAD_ALGORITHM => {
                aeads_seen += 1;
                siv |= body.len() % 2 == 0 && ids().any(|a| a == AEAD_AES_SIV_CMAC_256);
            }
            // Server and port negotiation from a client only state preferences: ignored.
            6 | record::NTPV4_PORT => {}
            _ if critical => return KeOutcome::Error(ERROR_UNRECOGNIZED_CRITICAL),
            _ => {}
        }
        at += 4 + len;
    }
    if !ended || protocols_seen != 1 || aeads_seen > 1 || !ntpv4 || !siv {
        return KeOutcome::Error(ERROR_BAD_REQUEST);
    }
    KeOutcome::Agreed
}

/// Where an NTS-KE server sends its clients for NTP when that is not its own address and port
/// 123 (RFC 8915 §4.1.7, §4.1.8): the NTPv4 Server and Port Negotiation records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NtpNegotiation {
    /// The NTP server, an IP address or a fully qualified domain name (see [`valid_ntp_server`]).
    pub server: Option<String>,
    /// The NTP port.
    pub port: Option<u16>,
}

/// Whether `name` may go in an NTPv4 Server Negotiation record: an IPv4 address in dotted decimal,
/// an IPv6 address in its text form without a zone, or a domain name (letters, digits and hyphens
/// in dot-separated labels of 1 to 63, at most 253 in all, a label neither starting nor ending
/// with a hyphen).
pub fn valid_ntp_server(name: &str) -> bool {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && !name.chars().all(|c| c.is_ascii_digit() || c == '.')
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Writes the NTS-KE response for [`KeOutcome::Agreed`]: NTPv4, AEAD_AES_SIV_CMAC_256, the NTP
/// port if `ntp_port` is given (one other than 123), `cookies` cookies from `new_cookie`, End of
/// Message. For [`KeOutcome::Error`], the error record and End of Message.
pub fn ke_response(
    outcome: &KeOutcome,
    ntp: &NtpNegotiation,
    cookies: usize,
    mut new_cookie: impl FnMut() -> [u8; COOKIE_LEN],
    out: &mut Vec<u8>,
) {
    let mut put = |ty: u16, body: &[u8]| {
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
    };
    match outcome {
        KeOutcome::Error(code) => {
            put(record::CRITICAL | record::ERROR, &code.to_be_bytes());
        }
        KeOutcome::Agreed => {
            put(
                record::CRITICAL | record::NEXT_PROTOCOL,
                &0u16.to_be_bytes(),
            );
            put(
                record::CRITICAL | record::AEAD_ALGORITHM,
                &AEAD_AES_SIV_CMAC_256.to_be_bytes(),
            );
            if let Some(server) = &ntp.server {
                put(record::CRITICAL | record::NTPV4_SERVER, server.as_bytes());
            }
            if let Some(port) = ntp.port {
                put(record::CRITICAL | record::NTPV4_PORT, &port.to_be_bytes());
            }
            for _ in 0..cookies.min(MAX_COOKIES) {
                put(record::NEW_COOKIE, &new_cookie());
            }
        }
    }
    put(record::CRITICAL | record::END_OF_MESSAGE, &[]);
}

// --- the client's side, for `chime ntp --nts` ------------------------------------------------

/// The NTS-KE request a client sends: NTPv4, AEAD_AES_SIV_CMAC_256, End of Message.
pub fn ke_request() -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    for (ty, body) in [
        (
            record::CRITICAL | record::NEXT_PROTOCOL,
            &0u16.to_be_bytes()[..],
        ),
        (
            record::CRITICAL | record::AEAD_ALGORITHM,
            &AEAD_AES_SIV_CMAC_256.to_be_bytes()[..],
        ),
        (record::CRITICAL | record::END_OF_MESSAGE, &[][..]),
    ] {
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
    }
    out
}

/// What an NTS-KE server answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeAnswer {
    /// The cookies handed out.
    pub cookies: Vec<Vec<u8>>,
    /// The NTP server to use, if not the NTS-KE server's host.
    pub server: Option<String>,
    /// The NTP port to use, if not 123.
    pub port: Option<u16>,
}

/// Why an NTS-KE response is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeAnswerError {
    /// The server sent an Error record with this code.
    #[error("the server refused: NTS-KE error {0}")]
    Refused(u16),
    /// Records that do not parse, or are missing.
    #[error("bad NTS-KE response: {0}")]
    Bad(&'static str),
}

/// Reads an NTS-KE response (up to End of Message).
pub fn parse_ke_response(bytes: &[u8]) -> Result<KeAnswer, KeAnswerError> {
    let mut answer = KeAnswer::default();
    let (mut ntpv4, mut siv, mut ended) = (false, false, false);
    let mut at = 0;
    while at + 4 <= bytes.len() && !ended {
        let raw = u16::from_be_bytes([bytes[at], bytes[at + 1]]);
        let (critical, ty) = (raw & record::CRITICAL != 0, raw & !record::CRITICAL);
        let len = usize::from(u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]));
        let body = bytes
            .get(at + 4..at + 4 + len)
            .ok_or(KeAnswerError::Bad("a record runs past the end"))?;
        let u16_body = || {
            <[u8; 2]>::try_from(body)
                .map(u16::from_be_bytes)
                .map_err(|_| KeAnswerError::Bad("a record is not 2 bytes long"))
        };
        match ty {
            record::END_OF_MESSAGE => ended = true,
            record::NEXT_PROTOCOL => ntpv4 = u16_body()? == 0,
            record::AEAD_ALGORITHM => siv = u16_body()? == AEAD_AES_SIV_CMAC_256,
            record::ERROR => return Err(KeAnswerError::Refused(u16_body().unwrap_or(u16::MAX))),
            record::NEW_COOKIE => answer.cookies.push(body.to_vec()),
            6 => {
                let name = std::str::from_utf8(body)
                    .map_err(|_| KeAnswerError::Bad("the server name is not text"))?;
                answer.server = Some(name.to_owned());
            }
            record::NTPV4_PORT => answer.port = Some(u16_body()?),
            _ if critical => return Err(KeAnswerError::Bad("an unknown critical record")),
            _ => {}
        }
        at += 4 + len;
    }
    if !ended {
        return Err(KeAnswerError::Bad("no End of Message"));
    }
    if !ntpv4 || !siv {
        return Err(KeAnswerError::Bad("not NTPv4 with AEAD_AES_SIV_CMAC_256"));
    }
    if answer.cookies.is_empty() {
        return Err(KeAnswerError::Bad("no cookies"));
    }
    Ok(answer)
}

/// Appends to `header` (a 48-byte client request) the NTS fields of a client request: the unique
/// identifier, the cookie, `placeholders` placeholders as long as the cookie, and an authenticator
/// over all of it under `c2s` with `nonce`.
pub fn client_request(
    header: &[u8; Header::LEN],
    unique_id: &[u8; 32],
    cookie: &[u8],
    placeholders: usize,
    c2s: &[u8; KEY_LEN],
    nonce: [u8; NONCE_LEN],
) -> Vec<u8> {
    let mut p = vec![0; client_request_len(cookie.len(), placeholders)];
    let len = client_request_into(&mut p, header, unique_id, cookie, placeholders, c2s, nonce);
    p.truncate(len);
    p
}

/// The length of a client request with a cookie of `cookie_len` bytes and `placeholders`
/// placeholders.
pub fn client_request_len(cookie_len: usize, placeholders: usize) -> usize {
    Header::LEN + (4 + 32) + (1 + placeholders) * (4 + cookie_len) + 4 + 4 + NONCE_LEN + TAG_LEN
}

/// [`client_request`] written into `out` (at least [`client_request_len`] bytes) without
/// allocating; returns the length written.
///
/// # Panics
/// If `out` is shorter than [`client_request_len`].
pub fn client_request_into(
    out: &mut [u8],
    header: &[u8; Header::LEN],
    unique_id: &[u8; 32],
    cookie: &[u8],
    placeholders: usize,
    c2s: &[u8; KEY_LEN],
    nonce: [u8; NONCE_LEN],
) -> usize {
    let mut at = Header::LEN;
    out[..at].copy_from_slice(header);
    let field = |out: &mut [u8], at: &mut usize, ty: u16, body: Option<&[u8]>, len: usize| {
        out[*at..*at + 2].copy_from_slice(&ty.to_be_bytes());
        out[*at + 2..*at + 4].copy_from_slice(&((4 + len) as u16).to_be_bytes());
        let room = &mut out[*at + 4..*at + 4 + len];
        match body {
            Some(b) => room.copy_from_slice(b),
            None => room.fill(0),
        }
        *at += 4 + len;
    };
    field(out, &mut at, ef::UNIQUE_IDENTIFIER, Some(unique_id), 32);
    field(out, &mut at, ef::COOKIE, Some(cookie), cookie.len());
    for _ in 0..placeholders {
        field(out, &mut at, ef::COOKIE_PLACEHOLDER, None, cookie.len());
    }
    let mut siv = Aes128Siv::new(c2s.into());
    // An empty plaintext cannot fail to encrypt.
    let tag = siv
        .encrypt_in_place_detached([&out[..at], &nonce[..]], &mut [])
        .unwrap_or_default();
    let mut body = [0u8; 4 + NONCE_LEN + TAG_LEN];
    body[..2].copy_from_slice(&(NONCE_LEN as u16).to_be_bytes());
    body[2..4].copy_from_slice(&(TAG_LEN as u16).to_be_bytes());
    body[4..4 + NONCE_LEN].copy_from_slice(&nonce);
    body[4 + NONCE_LEN..].copy_from_slice(&tag);
    field(out, &mut at, ef::AUTHENTICATOR, Some(&body), body.len());
    at
}

/// The unique identifier a reply carries (the first, if it has several), for a client to find
/// which of its requests the reply answers.
pub fn reply_unique_id(reply: &[u8]) -> Option<&[u8]> {
    fields(reply)
        .find(|f| f.ty == ef::UNIQUE_IDENTIFIER)
        .map(|f| &reply[f.body])
}

/// What the client makes of a reply to an NTS request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientReply {
    /// Authentic: the new cookies it carried.
    Authentic(Vec<Vec<u8>>),
    /// An NTS NAK for our identifier: the cookie was refused; run NTS-KE again.
    Nak,
}

/// Why a reply to an NTS request is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClientReplyError {
    /// No unique identifier, or not ours.
    #[error("the reply's unique identifier is missing or not ours")]
    WrongIdentifier,
    /// No authenticator (and not a NAK), or one that is malformed.
    #[error("the reply has no usable NTS authenticator")]
    NoAuthenticator,
    /// The authenticator does not verify under the server-to-client key.
    #[error("the reply's NTS authenticator does not verify")]
    Forged,
}

/// Checks a reply to our NTS request: our identifier, then either an NTS NAK (stratum 0, `NTSN`)
/// or an authenticator that verifies under `s2c`, whose plaintext holds new cookies.
pub fn client_check_reply(
    reply: &[u8],
    unique_id: &[u8; 32],
    s2c: &[u8; KEY_LEN],
) -> Result<ClientReply, ClientReplyError> {
    let fs: Vec<Field> = fields(reply).collect();
    let ours = fs
        .iter()
        .any(|f| f.ty == ef::UNIQUE_IDENTIFIER && reply[f.body.clone()] == unique_id[..]);
    if !ours {
        return Err(ClientReplyError::WrongIdentifier);
    }
    let is_nak = reply.len() >= Header::LEN && reply[1] == 0 && reply[offset_refid()] == *b"NTSN";
    let Some(auth) = fs.iter().find(|f| f.ty == ef::AUTHENTICATOR) else {
        return if is_nak {
            Ok(ClientReply::Nak)
        } else {
            Err(ClientReplyError::NoAuthenticator)
        };
    };
    // At most eight cookies of up to 256 bytes come back: 2 KiB holds them.
    let mut buf = [0u8; 2048];
    let len = open_authenticator(reply, auth, s2c, 1, &mut buf).map_err(|e| match e {
        Unopened::Malformed => ClientReplyError::NoAuthenticator,
        Unopened::Forged => ClientReplyError::Forged,
    })?;
    let plain = &buf[..len];
    let mut cookies = Vec::new();
    let mut at = 0;
    while at + 4 <= plain.len() {
        let ty = u16::from_be_bytes([plain[at], plain[at + 1]]);
        let len = usize::from(u16::from_be_bytes([plain[at + 2], plain[at + 3]]));
        if len < 4 || at + len > plain.len() {
            break;
        }
        if ty == ef::COOKIE {
            cookies.push(plain[at + 4..at + len].to_vec());
        }
        at += len;
    }
    Ok(ClientReply::Authentic(cookies))
}

fn offset_refid() -> Range<usize> {
    crate::packet::offset::REFERENCE_ID..crate::packet::offset::REFERENCE_TS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::Mode;
    use crate::time::NtpTimestamp;

    const C2S: [u8; KEY_LEN] = [0x11; KEY_LEN];
    const S2C: [u8; KEY_LEN] = [0x22; KEY_LEN];

    fn keys() -> Keys {
        Keys { c2s: C2S, s2c: S2C }
    }

    fn master() -> CookieKeys {
        CookieKeys::new(7, [0x33; KEY_LEN])
    }

    fn field(out: &mut Vec<u8>, ty: u16, body: &[u8]) {
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&((4 + body.len()) as u16).to_be_bytes());
        out.extend_from_slice(body);
    }

    /// A request as chronyd makes one: header, unique identifier, cookie, `placeholders`
    /// placeholders, authenticator over all of it under `c2s`.
    fn request(cookie: &[u8], placeholders: usize, c2s: &[u8; KEY_LEN]) -> Vec<u8> {
        let mut p = vec![0u8; 48];
        Header::request(4, Mode::Client, NtpTimestamp(0x0102_0304_0506_0708))
            .encode((&mut p[..48]).try_into().unwrap());
        field(&mut p, ef::UNIQUE_IDENTIFIER, &[0xAB; 32]);
        field(&mut p, ef::COOKIE, cookie);
        for _ in 0..placeholders {
            field(&mut p, ef::COOKIE_PLACEHOLDER, &vec![0; cookie.len()]);
        }
        let nonce = [0x44u8; NONCE_LEN];
        let mut siv = Aes128Siv::new(c2s.into());
        let tag = siv
            .encrypt_in_place_detached([&p[..], &nonce[..]], &mut [])
            .unwrap();
        let mut body = Vec::new();
        body.extend_from_slice(&(NONCE_LEN as u16).to_be_bytes());
        body.extend_from_slice(&(TAG_LEN as u16).to_be_bytes());
        body.extend_from_slice(&nonce);
        body.extend_from_slice(&tag);
        field(&mut p, ef::AUTHENTICATOR, &body);
        p
    }

    /// What a client makes of the reply: the identifier must match, the authenticator verify
    /// under `s2c`, and the cookies come out of its ciphertext.
    fn client_reads(reply: &[u8], uid: &[u8]) -> Vec<Vec<u8>> {
        let fs: Vec<_> = fields(reply).collect();
        assert_eq!(fs.len(), 2, "identifier and authenticator");
        assert_eq!(fs[0].ty, ef::UNIQUE_IDENTIFIER);
        assert_eq!(&reply[fs[0].body.clone()], uid);
        let auth = &fs[1];
        assert_eq!((auth.ty, auth.body.end), (ef::AUTHENTICATOR, reply.len()));
        let uid: &[u8; 32] = uid.try_into().unwrap();
        match client_check_reply(reply, uid, &S2C) {
            Ok(ClientReply::Authentic(cookies)) => cookies,
            other => panic!("the reply does not verify as a client reads it: {other:?}"),
        }
    }

    fn reply_to(req: &[u8], m: &CookieKeys) -> (Vec<u8>, usize) {
        let Check::Verified(v) = check_request(req, m) else {
            panic!("not verified");
        };
        let mut reply = vec![0u8; req.len()];
        let mut server = Header::request(4, Mode::Server, NtpTimestamp(9));
        server.stratum = 2;
        server.encode((&mut reply[..48]).try_into().unwrap());
        let mut n = 0u8;
        let len = write_response(&mut reply, req, &v, [0x55; NONCE_LEN], || {
            n += 1;
            m.seal(&keys(), [n; NONCE_LEN])
        })
        .unwrap();
        (reply, len)
    }

    #[test]
    fn cookies_open_under_the_current_and_previous_key_only() {
        let m = master();
        let cookie = m.seal(&keys(), [1; NONCE_LEN]);
        assert_eq!(cookie.len() % 4, 0);
        assert_eq!(m.open(&cookie), Some(keys()));
        let r1 = m.rotated(8, [0x66; KEY_LEN]);
        assert_eq!(
            r1.open(&cookie),
            Some(keys()),
            "the previous key still opens"
        );
        assert_ne!(r1.seal(&keys(), [1; NONCE_LEN])[..4], cookie[..4]);
        let r2 = r1.rotated(9, [0x77; KEY_LEN]);
        assert_eq!(r2.open(&cookie), None, "two rotations later it does not");
        for i in 0..COOKIE_LEN {
            let mut bad = cookie;
            bad[i] ^= 1;
            assert_eq!(m.open(&bad), None, "flipped byte {i} still opened");
        }
        assert_eq!(m.open(&cookie[1..]), None);
    }

    fn secret(fill: u8) -> FleetSecret {
        FleetSecret([fill; FLEET_SECRET_LEN])
    }

    /// Known answers, computed apart from this code with Python's hmac and hashlib (RFC 5869's
    /// HKDF-Extract and -Expand by hand): secret 00 01 02 .. 1f, periods 20415 and 0.
    #[test]
    fn fleet_keys_match_an_independent_hkdf() {
        let secret = FleetSecret(std::array::from_fn(|i| i as u8));
        let hex = |k: &[u8]| k.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let (id, key) = fleet_key(&secret, 20415);
        assert_eq!(id, 0x85c3_1154);
        assert_eq!(
            hex(&key),
            "d4001d5f606e5a1f95161924f8c5a32fde120906ad429fead320e13e7ced1902"
        );
        let (id, key) = fleet_key(&secret, 0);
        assert_eq!(id, 0x5382_5973);
        assert_eq!(
            hex(&key),
            "b262e57f85276692a13652e1691101588a04eb5a7d971f0c65299b843dd381e9"
        );
    }

    #[test]
    fn members_derive_equal_keys_from_equal_secrets_and_periods_only() {
        let (a, b) = (secret(1), secret(1));
        assert_eq!(fleet_key(&a, 7), fleet_key(&b, 7));
        assert_ne!(fleet_key(&a, 7), fleet_key(&a, 8));
        assert_ne!(fleet_key(&a, 7), fleet_key(&secret(2), 7));
        let one = CookieKeys::for_fleet(&a, None, 100);
        let other = CookieKeys::for_fleet(&b, None, 100);
        assert_eq!(one.current(), other.current());
        assert_eq!(one.current(), fleet_key(&a, 100));
    }

    proptest::proptest! {
        /// Two members' keys agree exactly when their secrets and periods do (the second secret
        /// and period are the first's half the time, so that both sides are tried).
        #[test]
        fn fleet_keys_agree_exactly_when_secret_and_period_do(
            a: [u8; FLEET_SECRET_LEN],
            b: [u8; FLEET_SECRET_LEN],
            p: u64,
            q: u64,
            same_secret: bool,
            same_period: bool,
        ) {
            let b = if same_secret { a } else { b };
            let q = if same_period { p } else { q };
            let (ka, kb) = (fleet_key(&FleetSecret(a), p), fleet_key(&FleetSecret(b), q));
            proptest::prop_assert_eq!(ka == kb, a == b && p == q);
            proptest::prop_assert_eq!(ka.0 == kb.0, a == b && p == q);
        }
    }

    /// A cookie one member seals opens at any other member whose period is the same, one before
    /// or one after; two periods apart, or under another secret, it does not.
    #[test]
    fn a_fleet_cookie_opens_across_members_within_a_period_either_side() {
        let s = secret(9);
        let cookie = CookieKeys::for_fleet(&s, None, 1000).seal(&keys(), [3; NONCE_LEN]);
        for period in [999, 1000, 1001] {
            let member = CookieKeys::for_fleet(&s, None, period);
            assert_eq!(member.open(&cookie), Some(keys()), "period {period}");
        }
        for period in [998, 1002] {
            let member = CookieKeys::for_fleet(&s, None, period);
            assert_eq!(member.open(&cookie), None, "period {period}");
        }
        assert_eq!(
            CookieKeys::for_fleet(&secret(8), None, 1000).open(&cookie),
            None
        );
        // Period 0 has no period before it; it still opens its own and the next.
        let first = CookieKeys::for_fleet(&s, None, 0);
        assert_eq!(
            first.open(&first.seal(&keys(), [4; NONCE_LEN])),
            Some(keys())
        );
    }

    /// Replacing the fleet secret: members holding the new one with the old beside it seal under
    /// the new and open cookies of both, so a member still on the old secret, or a client's cookie
    /// from before, is not cut off.
    #[test]
    fn a_new_fleet_secret_opens_the_old_ones_cookies_while_both_are_held() {
        let (old, new) = (secret(1), secret(2));
        let by_old = CookieKeys::for_fleet(&old, None, 50).seal(&keys(), [5; NONCE_LEN]);
        let both = CookieKeys::for_fleet(&new, Some(&old), 50);
        assert_eq!(both.current(), fleet_key(&new, 50));
        assert_eq!(both.open(&by_old), Some(keys()));
        let next_period_old = CookieKeys::for_fleet(&old, None, 51).seal(&keys(), [6; NONCE_LEN]);
        assert_eq!(both.open(&next_period_old), Some(keys()));
        let by_new = both.seal(&keys(), [7; NONCE_LEN]);
        assert_eq!(
            CookieKeys::for_fleet(&new, None, 50).open(&by_new),
            Some(keys())
        );
        // Once the old secret is dropped, its cookies no longer open.
        assert_eq!(CookieKeys::for_fleet(&new, None, 50).open(&by_old), None);
    }

    #[test]
    fn fleet_files_round_trip_and_bad_ones_name_the_line() {
        let s = FleetSecret(std::array::from_fn(|i| (i * 7) as u8));
        let text = encode_fleet_file(&s);
        assert_eq!(parse_fleet_file(&text), Ok((s.clone(), None)));
        let old = secret(0xAB);
        let both = format!("{}previous {}\n", &*text, "ab".repeat(32));
        assert_eq!(parse_fleet_file(&both), Ok((s.clone(), Some(old))));
        for (bad, says) in [
            ("", "no `secret` line"),
            ("secret 00\n", "line 1: not 64 hex digits"),
            (
                &format!("secret {}\n", "zz".repeat(32)),
                "line 1: not 64 hex digits",
            ),
            (
                &format!("\nsecret {h}\nsecret {h}\n", h = "00".repeat(32)),
                "line 3: given twice",
            ),
            (
                "key 00\n",
                "line 1: expected `secret HEX` or `previous HEX`",
            ),
            (
                &format!("secret {h}\nprevious {h}\n", h = "01".repeat(32)),
                "`previous` is the same as `secret`",
            ),
        ] {
            assert_eq!(
                parse_fleet_file(bad).map(|_| ()),
                Err(says.to_owned()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_request_gets_an_authentic_reply_as_long_as_itself_with_fresh_cookies() {
        let m = master();
        for placeholders in [0, 1, 3, 7, 9] {
            let req = request(&m.seal(&keys(), [2; NONCE_LEN]), placeholders, &C2S);
            let (reply, len) = reply_to(&req, &m);
            assert_eq!(len, req.len(), "exactly the request's length");
            let cookies = client_reads(&reply, &[0xAB; 32]);
            assert_eq!(cookies.len(), (1 + placeholders).min(8));
            for c in &cookies {
                assert_eq!(m.open(c), Some(keys()));
            }
        }
    }

    #[test]
    fn a_short_request_gets_fewer_cookies_never_a_longer_reply() {
        let m = master();
        // A request whose placeholders are shorter than the cookies: they cannot all be replaced.
        let mut req = request(&m.seal(&keys(), [2; NONCE_LEN]), 0, &C2S);
        let (reply, len) = reply_to(&req, &m);
        assert_eq!(
            (len, client_reads(&reply, &[0xAB; 32]).len()),
            (req.len(), 1)
        );
        // Cut room: a reply buffer of 48 + identifier + a cookieless authenticator only.
        req.truncate(req.len());
        let Check::Verified(v) = check_request(&req, &m) else {
            panic!()
        };
        let mut small = vec![0u8; 48 + 36 + 40];
        let len = write_response(&mut small, &req, &v, [0; NONCE_LEN], || unreachable!()).unwrap();
        assert_eq!(len, small.len());
        let mut tiny = vec![0u8; 48 + 36 + 39];
        assert_eq!(
            write_response(&mut tiny, &req, &v, [0; NONCE_LEN], || unreachable!()),
            None
        );
    }

    #[test]
    fn bad_cookies_and_forged_authenticators_get_a_nak() {
        let m = master();
        let other = CookieKeys::new(99, [0x99; KEY_LEN]);
        let req = request(&other.seal(&keys(), [2; NONCE_LEN]), 1, &C2S);
        let Check::Nak(uid) = check_request(&req, &m) else {
            panic!("foreign cookie")
        };
        let mut reply = vec![0u8; req.len()];
        Header::request(4, Mode::Server, NtpTimestamp(9))
            .encode((&mut reply[..48]).try_into().unwrap());
        let len = write_nak(&mut reply, &req, uid).unwrap();
        assert_eq!(len, 48 + 36);
        let h = Header::parse(&reply).unwrap();
        assert_eq!((h.stratum, h.reference_id), (0, *b"NTSN"));
        assert_eq!(&reply[52..len], &[0xAB; 32]);

        let forged = request(&m.seal(&keys(), [2; NONCE_LEN]), 1, &[0x12; KEY_LEN]);
        assert!(matches!(check_request(&forged, &m), Check::Nak(_)));
    }

    #[test]
    fn any_changed_byte_of_a_request_is_refused() {
        let m = master();
        let req = request(&m.seal(&keys(), [2; NONCE_LEN]), 1, &C2S);
        for i in 0..req.len() {
            for bit in [0x01, 0x80] {
                let mut bad = req.clone();
                bad[i] ^= bit;
                assert!(
                    !matches!(check_request(&bad, &m), Check::Verified(_)),
                    "byte {i} bit {bit:#x} changed and still verified"
                );
            }
        }
    }

    #[test]
    fn malformed_nts_requests_and_plain_ones() {
        let m = master();
        let cookie = m.seal(&keys(), [2; NONCE_LEN]);
        let mut plain = vec![0u8; 48];
        Header::request(4, Mode::Client, NtpTimestamp(1))
            .encode((&mut plain[..48]).try_into().unwrap());
        assert!(matches!(check_request(&plain, &m), Check::NotNts));
        // An unknown field alone is not NTS either.
        let mut other = plain.clone();
        field(&mut other, 0x7777, &[0; 24]);
        assert!(matches!(check_request(&other, &m), Check::NotNts));
        // A cookie without identifier or authenticator.
        let mut half = plain.clone();
        field(&mut half, ef::COOKIE, &cookie);
        assert!(matches!(check_request(&half, &m), Check::Malformed));
        // Two cookies.
        let mut two = plain.clone();
        field(&mut two, ef::UNIQUE_IDENTIFIER, &[1; 32]);
        field(&mut two, ef::COOKIE, &cookie);
        field(&mut two, ef::COOKIE, &cookie);
        assert!(matches!(check_request(&two, &m), Check::Malformed));
        // A short identifier.
        let mut short = plain.clone();
        field(&mut short, ef::UNIQUE_IDENTIFIER, &[1; 16]);
        field(&mut short, ef::COOKIE, &cookie);
        assert!(matches!(check_request(&short, &m), Check::Malformed));
    }

    fn record(out: &mut Vec<u8>, ty: u16, body: &[u8]) {
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
    }

    #[test]
    fn ke_agrees_on_ntpv4_and_siv_and_refuses_the_rest() {
        // chronyd's request: next protocol NTPv4, AEADs 30 and 15, end.
        let mut req = Vec::new();
        record(&mut req, 0x8001, &[0, 0]);
        record(&mut req, 0x8004, &[0, 30, 0, 15]);
        assert_eq!(ke_message_len(&req), None, "no end yet");
        record(&mut req, 0x8000, &[]);
        assert_eq!(ke_message_len(&req), Some(req.len()));
        assert_eq!(ke_message_len(&req[..req.len() - 1]), None);
        assert_eq!(ke_check(&req), KeOutcome::Agreed);

        let mut out = Vec::new();
        let cookie = master().seal(&keys(), [3; NONCE_LEN]);
        let port_only = NtpNegotiation {
            server: None,
            port: Some(12345),
        };
        ke_response(&KeOutcome::Agreed, &port_only, 8, || cookie, &mut out);
        assert_eq!(&out[..6], &[0x80, 1, 0, 2, 0, 0]);
        assert_eq!(&out[6..12], &[0x80, 4, 0, 2, 0, 15]);
        assert_eq!(&out[12..18], &[0x80, 7, 0, 2, 0x30, 0x39]);
        assert_eq!(&out[18..22], &[0, 5, 0, COOKIE_LEN as u8]);
        assert_eq!(out.len(), 18 + 8 * (4 + COOKIE_LEN) + 4);
        assert_eq!(&out[out.len() - 4..], &[0x80, 0, 0, 0]);

        let refused = |body: &[(u16, &[u8])]| {
            let mut r = Vec::new();
            for (t, b) in body {
                record(&mut r, *t, b);
            }
            ke_check(&r)
        };
        let eom: (u16, &[u8]) = (0x8000, &[]);
        assert_eq!(
            refused(&[(0x8004, &[0, 15]), eom]),
            KeOutcome::Error(1),
            "no protocol"
        );
        assert_eq!(
            refused(&[(0x8001, &[0, 1]), (0x8004, &[0, 15]), eom]),
            KeOutcome::Error(1)
        );
        assert_eq!(
            refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 30]), eom]),
            KeOutcome::Error(1)
        );
        assert_eq!(
            refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 15]), (0x8123, &[]), eom]),
            KeOutcome::Error(0),
            "unknown critical record"
        );
        assert_eq!(
            refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 15]), (0x0123, &[1]), eom]),
            KeOutcome::Agreed,
            "unknown non-critical record"
        );
        assert_eq!(
            refused(&[(0x8001, &[0, 0]), (0x8004, &[0, 15])]),
            KeOutcome::Error(1)
        );
        let mut err = Vec::new();
        ke_response(
            &KeOutcome::Error(1),
            &port_only,
            8,
            || unreachable!(),
            &mut err,
        );
        assert_eq!(err, [0x80, 2, 0, 2, 0, 1, 0x80, 0, 0, 0]);
    }

    #[test]
    fn server_names_for_the_negotiation_record() {
        for good in [
            "192.0.2.1",
            "2001:db8::1",
            "ntp.example.net",
            "ntp.example.net.",
            "a-b.c0",
        ] {
            assert!(valid_ntp_server(good), "{good}");
        }
        let long = ["a"; 130].join(".");
        for bad in [
            "",
            "fe80::1%eth0",
            "[2001:db8::1]",
            "ntp example",
            "-ntp.example",
            "ntp-.example",
            "ntp..example",
            "192.0.2.300",
            "ntp.example.net:123",
            long.as_str(),
        ] {
            assert!(!valid_ntp_server(bad), "{bad}");
        }
    }

    #[test]
    fn the_client_side_round_trips_with_the_server_side() {
        let m = master();
        let mut ke = Vec::new();
        let elsewhere = NtpNegotiation {
            server: Some("ntp.example.net".to_owned()),
            port: Some(4123),
        };
        ke_response(
            &ke_check(&ke_request()),
            &elsewhere,
            8,
            || m.seal(&keys(), [1; 16]),
            &mut ke,
        );
        let answer = parse_ke_response(&ke).unwrap();
        assert_eq!(
            (answer.cookies.len(), answer.server.as_deref(), answer.port),
            (8, Some("ntp.example.net"), Some(4123))
        );
        let mut err = Vec::new();
        let nowhere = NtpNegotiation::default();
        ke_response(
            &KeOutcome::Error(1),
            &nowhere,
            0,
            || unreachable!(),
            &mut err,
        );
        assert_eq!(parse_ke_response(&err), Err(KeAnswerError::Refused(1)));

        let mut header = [0u8; 48];
        Header::request(4, Mode::Client, NtpTimestamp(5)).encode(&mut header);
        let uid = [0x5A; 32];
        let req = client_request(&header, &uid, &answer.cookies[0], 2, &C2S, [8; 16]);
        let Check::Verified(v) = check_request(&req, &m) else {
            panic!()
        };
        let mut reply = vec![0u8; req.len()];
        Header::request(4, Mode::Server, NtpTimestamp(9))
            .encode((&mut reply[..48]).try_into().unwrap());
        write_response(&mut reply, &req, &v, [2; 16], || m.seal(&keys(), [3; 16])).unwrap();
        let Ok(ClientReply::Authentic(cookies)) = client_check_reply(&reply, &uid, &S2C) else {
            panic!()
        };
        assert_eq!(cookies.len(), 3);
        assert_eq!(
            client_check_reply(&reply, &[0; 32], &S2C),
            Err(ClientReplyError::WrongIdentifier)
        );
        assert_eq!(
            client_check_reply(&reply, &uid, &C2S),
            Err(ClientReplyError::Forged)
        );
        let mut bad = reply.clone();
        bad[40] ^= 1; // the transmit timestamp is covered
        assert_eq!(
            client_check_reply(&bad, &uid, &S2C),
            Err(ClientReplyError::Forged)
        );

        let foreign = client_request(&header, &uid, &[0; COOKIE_LEN], 0, &C2S, [8; 16]);
        let Check::Nak(range) = check_request(&foreign, &m) else {
            panic!()
        };
        let mut nak = vec![0u8; foreign.len()];
        Header::request(4, Mode::Server, NtpTimestamp(9))
            .encode((&mut nak[..48]).try_into().unwrap());
        let len = write_nak(&mut nak, &foreign, range).unwrap();
        assert_eq!(
            client_check_reply(&nak[..len], &uid, &S2C),
            Ok(ClientReply::Nak)
        );
    }
    #[test]
    fn client_request_is_what_chronyd_sends_and_the_reply_names_it() {
        let cookie = master().seal(&keys(), [1; 16]);
        for placeholders in [0, 1, 7] {
            let mut header = [0u8; 48];
            Header::request(4, Mode::Client, NtpTimestamp(0x0102_0304_0506_0708))
                .encode(&mut header);
            let ours = client_request(
                &header,
                &[0xAB; 32],
                &cookie,
                placeholders,
                &C2S,
                [0x44; 16],
            );
            assert_eq!(ours, request(&cookie, placeholders, &C2S));
            assert_eq!(ours.len(), client_request_len(cookie.len(), placeholders));
            assert_eq!(reply_unique_id(&ours), Some(&[0xAB; 32][..]));
        }
        assert_eq!(reply_unique_id(&[0; 48]), None);
    }
}
