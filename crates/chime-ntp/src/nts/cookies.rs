//! Cookies: a client's two keys sealed under a master key only the server holds, and opened again
//! when a request spends one.

use aes_siv::KeyInit;
use aes_siv::siv::Aes128Siv;
use zeroize::Zeroize;

use super::aead::{Aead, MAX_KEY_LEN};
use super::fleet::{FleetSecret, fleet_key};
use super::record::Protocol;
use super::{KEY_LEN, NONCE_LEN, TAG_LEN};

/// Why a request gets an NTS NAK: what an operator needs to tell lost keys from a client's
/// mistake or an attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakReason {
    /// The cookie names a master key not held here: rotated out long ago, lost at a restart
    /// without saved keys, or another server's (a fleet member with another secret).
    UnknownKey,
    /// The cookie names a key held here but does not open under it (changed, or not sealed
    /// here), or names an algorithm or protocol it cannot be.
    BadCookie,
    /// The cookie's keys were exported for the other protocol (NTPv4's keys in an NTPv5 request,
    /// or the other way round).
    OtherProtocol,
    /// The cookie opened but the authenticator does not verify under its keys: the request was
    /// changed on its way, or made by someone without the keys.
    Forged,
}

impl NakReason {
    /// Every reason, in [`NakReason::index`] order.
    pub const ALL: [Self; 4] = [
        Self::UnknownKey,
        Self::BadCookie,
        Self::OtherProtocol,
        Self::Forged,
    ];

    /// A dense index below `NakReason::ALL.len()`, for counter arrays: its place in
    /// [`NakReason::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Self::UnknownKey => 0,
            Self::BadCookie => 1,
            Self::OtherProtocol => 2,
            Self::Forged => 3,
        }
    }

    /// Its name in counters and logs.
    pub const fn label(self) -> &'static str {
        match self {
            Self::UnknownKey => "unknown_key",
            Self::BadCookie => "bad_cookie",
            Self::OtherProtocol => "other_protocol",
            Self::Forged => "forged",
        }
    }
}

/// The two keys of one client's NTS association, the protocol they were exported for, and the
/// algorithm they are for.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    protocol: Protocol,
    aead: Aead,
    /// Client to server (the requests' authenticators), in its first `aead.key_len()` bytes.
    c2s: [u8; MAX_KEY_LEN],
    /// Server to client (the replies' authenticators and the cookies in them), likewise.
    s2c: [u8; MAX_KEY_LEN],
}

impl Keys {
    /// The keys of an association for `protocol` under `aead`, as the TLS exporter gave them;
    /// `None` if either is not the algorithm's key length.
    pub fn new(protocol: Protocol, aead: Aead, c2s: &[u8], s2c: &[u8]) -> Option<Self> {
        let len = aead.key_len();
        if c2s.len() != len || s2c.len() != len {
            return None;
        }
        let mut keys = Self {
            protocol,
            aead,
            c2s: [0; MAX_KEY_LEN],
            s2c: [0; MAX_KEY_LEN],
        };
        keys.c2s[..len].copy_from_slice(c2s);
        keys.s2c[..len].copy_from_slice(s2c);
        Some(keys)
    }

    /// The protocol the keys were exported for (RFC 8915 §5.1): a request of the other one is
    /// not theirs to authenticate.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The algorithm the keys are for.
    pub fn aead(&self) -> Aead {
        self.aead
    }

    /// The client-to-server key.
    pub fn c2s(&self) -> &[u8] {
        &self.c2s[..self.aead.key_len()]
    }

    /// The server-to-client key.
    pub fn s2c(&self) -> &[u8] {
        &self.s2c[..self.aead.key_len()]
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.c2s.zeroize();
        self.s2c.zeroize();
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Keys {{ protocol: {:?}, aead: {}, .. }}",
            self.protocol, self.aead
        )
    }
}

/// The length of a cookie sealing keys for `aead`: key id (4), nonce (16), tag (16), then the
/// sealed algorithm (2), protocol (2) and the two keys; a multiple of 4, as clients require. (The
/// protocol's two bytes were zero padding before NTPv5: a cookie of then opens as NTPv4's.)
/// 104 bytes for AEAD_AES_SIV_CMAC_256, 168 for _512, 72 for AEAD_AES_128_GCM_SIV.
pub const fn cookie_len(aead: Aead) -> usize {
    HEAD + 4 + 2 * aead.key_len()
}

/// The longest cookie: one for AEAD_AES_SIV_CMAC_512.
pub const MAX_COOKIE_LEN: usize = HEAD + 4 + 2 * MAX_KEY_LEN;

/// A cookie's key id, nonce and tag, before what they seal.
const HEAD: usize = 4 + NONCE_LEN + TAG_LEN;

/// A sealed cookie, as long as its algorithm's ([`cookie_len`]).
#[derive(Clone, Copy)]
pub struct Cookie {
    bytes: [u8; MAX_COOKIE_LEN],
    len: usize,
}

impl Cookie {
    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::ops::Deref for Cookie {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cookie({} bytes)", self.len)
    }
}

/// The master keys cookies are sealed under: the current one seals, it and the others open. On
/// one server the others are the keys before the current one, as many as it keeps, so a cookie
/// lives that many rotations past the one it was sealed in (a client that sleeps over a weekend
/// comes back without a new handshake). On a fleet ([`CookieKeys::for_fleet`]) they are the kept
/// periods' keys before the current one and the period's after, and an old fleet secret's while it
/// is being replaced.
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
    /// The most earlier keys a set keeps: past a year of daily rotations, which no cookie needs.
    pub const MAX_KEPT: usize = 400;

    /// Master keys with `key` (random bits) as the current one, named `id`.
    pub fn new(id: u32, key: [u8; KEY_LEN]) -> Self {
        Self {
            current: (id, key),
            also_open: Vec::new(),
        }
    }

    /// The keys after a rotation: `key` seals from now on; the current one and those before it
    /// still open, `kept` of them in all (at most [`CookieKeys::MAX_KEPT`]), the oldest dropped.
    pub fn rotated(&self, id: u32, key: [u8; KEY_LEN], kept: usize) -> Self {
        let kept = kept.min(Self::MAX_KEPT);
        Self {
            current: (id, key),
            also_open: std::iter::once(self.current)
                .chain(self.also_open.iter().copied())
                .take(kept)
                .collect(),
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

    /// The other keys that still open, with their ids, the most recent first: on one server, the
    /// keys before the current one.
    pub fn kept(&self) -> impl ExactSizeIterator<Item = (u32, [u8; KEY_LEN])> + '_ {
        self.also_open.iter().copied()
    }

    /// Master keys as [`CookieKeys::current`] and [`CookieKeys::kept`] gave them, e.g. read back
    /// from where a server saved them; past [`CookieKeys::MAX_KEPT`] kept keys, the oldest are
    /// dropped.
    pub fn from_parts(
        current: (u32, [u8; KEY_LEN]),
        kept: impl IntoIterator<Item = (u32, [u8; KEY_LEN])>,
    ) -> Self {
        Self {
            current,
            also_open: kept.into_iter().take(Self::MAX_KEPT).collect(),
        }
    }

    /// A fleet member's keys for rotation period `period` (Unix time divided by the rotation
    /// interval): [`fleet_key`] of `secret` for `period` seals; it, the keys of the `kept` periods
    /// before (at most [`CookieKeys::MAX_KEPT`]) and of the period after open (members' clocks
    /// differ a little, and a client's cookie outlives its period by the kept ones), and so do
    /// those of `old_secret`, if given, while the fleet replaces it. Every member with the same
    /// secrets and `kept` derives the same keys: no store, no copying.
    pub fn for_fleet(
        secret: &FleetSecret,
        old_secret: Option<&FleetSecret>,
        period: u64,
        kept: usize,
    ) -> Self {
        let kept = kept.min(Self::MAX_KEPT) as u64;
        let others = (1..=kept)
            .filter_map(|back| period.checked_sub(back))
            .chain(period.checked_add(1));
        let mut also_open: Vec<_> = others.clone().map(|p| fleet_key(secret, p)).collect();
        if let Some(old) = old_secret {
            also_open.push(fleet_key(old, period));
            also_open.extend(others.map(|p| fleet_key(old, p)));
        }
        Self {
            current: fleet_key(secret, period),
            also_open,
        }
    }

    /// Seals `keys` into a cookie with a fresh random `nonce`.
    pub fn seal(&self, keys: &Keys, nonce: [u8; NONCE_LEN]) -> Cookie {
        let (id, master) = &self.current;
        let (aead, len) = (keys.aead, keys.aead.key_len());
        let mut cookie = Cookie {
            bytes: [0; MAX_COOKIE_LEN],
            len: cookie_len(aead),
        };
        let (head, body) = cookie.bytes[..cookie.len].split_at_mut(HEAD);
        head[..4].copy_from_slice(&id.to_be_bytes());
        head[4..4 + NONCE_LEN].copy_from_slice(&nonce);
        body[..2].copy_from_slice(&aead.id().to_be_bytes());
        body[2..4].copy_from_slice(&keys.protocol.id().to_be_bytes());
        body[4..4 + len].copy_from_slice(keys.c2s());
        body[4 + len..].copy_from_slice(keys.s2c());
        let mut siv = Aes128Siv::new(master.into());
        // Sealing cannot fail: two headers, and the plaintext is not empty.
        if let Ok(tag) = siv.encrypt_in_place_detached([&head[..4], &nonce[..]], body) {
            head[4 + NONCE_LEN..].copy_from_slice(&tag);
        }
        cookie
    }

    /// The keys in `cookie`, if one of our master keys sealed it, nobody changed it since, the
    /// algorithm it names is the one its length is for, and the protocol it names is one we know.
    pub fn open(&self, cookie: &[u8]) -> Option<Keys> {
        self.open_or_why(cookie).ok()
    }

    /// [`CookieKeys::open`], saying why a cookie does not open: it names a key not held here, or
    /// it is not a cookie these keys sealed as it is.
    pub(crate) fn open_or_why(&self, cookie: &[u8]) -> Result<Keys, NakReason> {
        let aead = Aead::ALL
            .into_iter()
            .find(|&a| cookie_len(a) == cookie.len())
            .ok_or(NakReason::BadCookie)?;
        let id = u32::from_be_bytes([cookie[0], cookie[1], cookie[2], cookie[3]]);
        let (_, master) = std::iter::once(&self.current)
            .chain(&self.also_open)
            .find(|(k, _)| *k == id)
            .ok_or(NakReason::UnknownKey)?;
        let nonce = &cookie[4..4 + NONCE_LEN];
        let tag = aes_siv::Tag::clone_from_slice(&cookie[4 + NONCE_LEN..HEAD]);
        let mut body = [0u8; MAX_COOKIE_LEN - HEAD];
        let body = &mut body[..cookie.len() - HEAD];
        body.copy_from_slice(&cookie[HEAD..]);
        let mut siv = Aes128Siv::new(master.into());
        let opened = siv.decrypt_in_place_detached([&cookie[..4], nonce], body, &tag);
        let len = aead.key_len();
        let named = u16::from_be_bytes([body[0], body[1]]);
        let protocol = Protocol::from_id(u16::from_be_bytes([body[2], body[3]]));
        let keys = match protocol {
            Some(p) if opened.is_ok() && named == aead.id() => {
                Keys::new(p, aead, &body[4..4 + len], &body[4 + len..])
            }
            _ => None,
        };
        body.zeroize();
        keys.ok_or(NakReason::BadCookie)
    }
}
