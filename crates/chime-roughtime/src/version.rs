//! Protocol versions, what differs between them, and how the server picks one.
//!
//! Versions that share a wire layout, hash, leaf definition, time unit and signature contexts form
//! a [`Family`]. A family is the unit of signing: one Merkle tree, one SREP and one CERT per family
//! present in a batch. Drafts 08–11 are one family because their SREP carries no version (VER is
//! an unsigned top-level tag there), so one signature covers all four.
//!
//! | family | VER | nonce | leaf data | hash | times | SREP context | DELE context |
//! |---|---|---|---|---|---|---|---|
//! | [`Family::Google`] | none | 64 | nonce | 64 | µs | `RoughTime …` | `RoughTime …--` |
//! | [`Family::Draft07`] | 0x80000007 | 32 | nonce | 32 (SHA-512/256) | MJD + µs | `RoughTime …` | `RoughTime …` |
//! | [`Family::Draft08`] | 0x80000008–b | 32 | nonce | 32 | s | `RoughTime …` | `RoughTime …--` |
//! | [`Family::Draft12`] | 0x8000000c | 32 | packet | 32 | s | `RoughTime …` | `RoughTime …` |
//! | [`Family::Rfc`] | 1 | 32 | packet | 32 | s | `Roughtime …` | `Roughtime …` |
//!
//! "packet" is the whole request datagram, `ROUGHTIM` header included. Every family but draft 07
//! hashes with SHA-512 cut to the hash size; draft 07 uses SHA-512/256, a different function.
//! Draft 07 is as pyroughtime 1.0.1's default client, roughtimed of 2022 and tannerryan's
//! roughtime have it: drafts 08–11's layout, with times as a Modified Julian Date and
//! microseconds ([`TimeFormat::MjdMicros`]) and the DELE context of drafts 12 on, without
//! the `--` that Google's and drafts 08–11's have.

use core::fmt;

pub(crate) use crate::merkle::TreeHash;
use crate::packet::Framing;

/// A protocol version this crate speaks.
///
/// The derived order is the server's preference: later variants are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// Google's original protocol: no header, no version number.
    Google,
    /// draft-ietf-ntp-roughtime-07 (0x80000007), which pyroughtime 1.0.1 sends by default.
    Draft07,
    /// draft-ietf-ntp-roughtime-08 (0x80000008).
    Draft08,
    /// draft-ietf-ntp-roughtime-09 (0x80000009).
    Draft09,
    /// draft-ietf-ntp-roughtime-10 (0x8000000a), which added SRV.
    Draft10,
    /// draft-ietf-ntp-roughtime-11 (0x8000000b), which requires RADI ≥ 3.
    Draft11,
    /// 0x8000000c, the number drafts 12 to 19 all use.
    Draft12,
    /// RFC 10049, Roughtime version 1.
    Rfc10049,
}

impl Version {
    /// Every version, worst to best.
    pub const ALL: [Self; 8] = [
        Self::Google,
        Self::Draft07,
        Self::Draft08,
        Self::Draft09,
        Self::Draft10,
        Self::Draft11,
        Self::Draft12,
        Self::Rfc10049,
    ];

    /// Number of versions.
    pub const COUNT: usize = Self::ALL.len();

    /// A dense index, worst to best as in [`Version::ALL`], for per-version arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// A short, stable name for logs and metric labels: the VER number as RFC 10049 writes it
    /// (`1`, `0x8000000b`), or `google`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Google => "google",
            Self::Draft07 => "0x80000007",
            Self::Draft08 => "0x80000008",
            Self::Draft09 => "0x80000009",
            Self::Draft10 => "0x8000000a",
            Self::Draft11 => "0x8000000b",
            Self::Draft12 => "0x8000000c",
            Self::Rfc10049 => "1",
        }
    }

    /// The number sent in VER, or `None` for Google's protocol, which has no VER.
    pub const fn number(self) -> Option<u32> {
        match self {
            Self::Google => None,
            Self::Draft07 => Some(0x8000_0007),
            Self::Draft08 => Some(0x8000_0008),
            Self::Draft09 => Some(0x8000_0009),
            Self::Draft10 => Some(0x8000_000a),
            Self::Draft11 => Some(0x8000_000b),
            Self::Draft12 => Some(0x8000_000c),
            Self::Rfc10049 => Some(0x0000_0001),
        }
    }

    /// The version with this VER number. Unknown numbers, including roughly's 0x8000000d–f (which
    /// it offers as if they were drafts 13–15), are `None`: the server ignores them.
    pub const fn from_number(number: u32) -> Option<Self> {
        match number {
            0x8000_0007 => Some(Self::Draft07),
            0x8000_0008 => Some(Self::Draft08),
            0x8000_0009 => Some(Self::Draft09),
            0x8000_000a => Some(Self::Draft10),
            0x8000_000b => Some(Self::Draft11),
            0x8000_000c => Some(Self::Draft12),
            0x0000_0001 => Some(Self::Rfc10049),
            _ => None,
        }
    }

    /// Whether a client speaking this version names the server's key with SRV (draft 10 on);
    /// Google's protocol and drafts 07–09 predate it.
    pub const fn has_srv(self) -> bool {
        !matches!(
            self,
            Self::Google | Self::Draft07 | Self::Draft08 | Self::Draft09
        )
    }

    /// The family that fixes this version's wire layout and signing.
    pub const fn family(self) -> Family {
        match self {
            Self::Google => Family::Google,
            Self::Draft07 => Family::Draft07,
            Self::Draft08 | Self::Draft09 | Self::Draft10 | Self::Draft11 => Family::Draft08,
            Self::Draft12 => Family::Draft12,
            Self::Rfc10049 => Family::Rfc,
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Google => f.write_str("Google-Roughtime"),
            Self::Draft12 => f.write_str("draft-ietf-ntp-roughtime-12..19 (0x8000000c)"),
            Self::Rfc10049 => f.write_str("RFC 10049 (version 1)"),
            Self::Draft07 | Self::Draft08 | Self::Draft09 | Self::Draft10 | Self::Draft11 => {
                let n = self.number().unwrap_or(0) & 0xff;
                write!(
                    f,
                    "draft-ietf-ntp-roughtime-{n:02} (0x{:08x})",
                    0x8000_0000u32 | n
                )
            }
        }
    }
}

/// How the signature context strings are spelled.
///
/// RFC 10049 contradicts itself: its §5.2.1 and §5.2.6 spell the contexts "Roughtime …", while its
/// Appendix B example (version 1) verifies only with the drafts' "RoughTime …". Servers of the RFC
/// (roughenough ≥ 2.1, roughly 0.3) sign with the body's spelling, and so does this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContextSpelling {
    /// "Roughtime v1 …": RFC 10049's body text.
    Roughtime,
    /// "RoughTime v1 …": every draft and Google, and RFC 10049's Appendix B.
    RoughTime,
}

impl fmt::Display for ContextSpelling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Roughtime => "\"Roughtime\" (RFC 10049 body)",
            Self::RoughTime => "\"RoughTime\" (drafts, RFC 10049 Appendix B)",
        })
    }
}

/// What a family hashes into its Merkle leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafData {
    /// The request's nonce (Google, drafts 07–11).
    Nonce,
    /// The whole request packet, `ROUGHTIM` header included (draft 12 on).
    Packet,
}

/// Versions that share a wire layout and signing; one Merkle tree and one signature each per
/// batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Google's original.
    Google,
    /// Draft 07.
    Draft07,
    /// Drafts 08–11.
    Draft08,
    /// 0x8000000c (drafts 12–19).
    Draft12,
    /// RFC 10049.
    Rfc,
}

/// SREP context of RFC 10049's body.
const SREP_ROUGHTIME: &[u8] = b"Roughtime v1 response signature\x00";
/// SREP context of every draft and Google.
const SREP_ROUGHTIME_DRAFT: &[u8] = b"RoughTime v1 response signature\x00";
/// DELE context of RFC 10049's body.
const DELE_ROUGHTIME: &[u8] = b"Roughtime v1 delegation signature\x00";
/// DELE context of draft 07 and drafts 12–19 (and of the RFC's Appendix B).
const DELE_ROUGHTIME_DRAFT12: &[u8] = b"RoughTime v1 delegation signature\x00";
/// DELE context of Google and drafts up to 11.
const DELE_ROUGHTIME_OLD: &[u8] = b"RoughTime v1 delegation signature--\x00";

impl Family {
    /// Every family, in [`Family::index`] order.
    pub const ALL: [Self; 5] = [
        Self::Google,
        Self::Draft07,
        Self::Draft08,
        Self::Draft12,
        Self::Rfc,
    ];
    /// Number of families.
    pub const COUNT: usize = Self::ALL.len();

    /// A dense index, for per-family arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// How packets of this family are framed.
    pub const fn framing(self) -> Framing {
        match self {
            Self::Google => Framing::Google,
            _ => Framing::Ietf,
        }
    }

    /// Bytes of a nonce.
    pub const fn nonce_len(self) -> usize {
        match self {
            Self::Google => 64,
            _ => 32,
        }
    }

    /// Bytes of a Merkle tree hash: all of SHA-512 for Google, its first half otherwise.
    pub const fn hash_len(self) -> usize {
        match self {
            Self::Google => 64,
            _ => 32,
        }
    }

    /// What a leaf hashes.
    pub const fn leaf_data(self) -> LeafData {
        match self {
            Self::Google | Self::Draft07 | Self::Draft08 => LeafData::Nonce,
            Self::Draft12 | Self::Rfc => LeafData::Packet,
        }
    }

    /// The hash of the Merkle tree: SHA-512/256 for draft 07, SHA-512 (cut to
    /// [`hash_len`](Self::hash_len)) for the rest.
    pub const fn tree_hash(self) -> TreeHash {
        match self {
            Self::Draft07 => TreeHash::Sha512_256,
            _ => TreeHash::Sha512,
        }
    }

    /// How MIDP, MINT and MAXT are written, and RADI's unit.
    pub const fn time_format(self) -> TimeFormat {
        match self {
            Self::Google => TimeFormat::UnixMicros,
            Self::Draft07 => TimeFormat::MjdMicros,
            _ => TimeFormat::UnixSeconds,
        }
    }

    /// True if the version number and supported versions are inside SREP (draft 12 on), false if
    /// VER is a top-level, unsigned tag (drafts 08–11) or absent (Google).
    pub const fn signs_version(self) -> bool {
        matches!(self, Self::Draft12 | Self::Rfc)
    }

    /// True if responses carry TYPE = 1 (draft 14 on; 0x8000000c covers drafts 12–19 and this
    /// crate follows draft 19 there).
    pub const fn has_type(self) -> bool {
        matches!(self, Self::Draft12 | Self::Rfc)
    }

    /// The spelling this family's contexts use when signing.
    pub const fn spelling(self) -> ContextSpelling {
        match self {
            Self::Rfc => ContextSpelling::Roughtime,
            _ => ContextSpelling::RoughTime,
        }
    }

    /// The context prefixed to SREP before signing, with its terminating zero byte.
    pub const fn srep_context(self, spelling: ContextSpelling) -> &'static [u8] {
        match spelling {
            ContextSpelling::Roughtime => SREP_ROUGHTIME,
            ContextSpelling::RoughTime => SREP_ROUGHTIME_DRAFT,
        }
    }

    /// The context prefixed to DELE before signing, with its terminating zero byte.
    pub const fn dele_context(self, spelling: ContextSpelling) -> &'static [u8] {
        match (self, spelling) {
            (Self::Google | Self::Draft08, _) => DELE_ROUGHTIME_OLD,
            (_, ContextSpelling::Roughtime) => DELE_ROUGHTIME,
            (_, ContextSpelling::RoughTime) => DELE_ROUGHTIME_DRAFT12,
        }
    }
}

/// How a family writes MIDP, MINT and MAXT, and what RADI counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFormat {
    /// Unix seconds, RADI in seconds (drafts 08 on and RFC 10049).
    UnixSeconds,
    /// Unix microseconds, RADI in microseconds (Google).
    UnixMicros,
    /// The Modified Julian Date in the top 24 bits and microseconds since that UTC midnight in
    /// the low 40, RADI in microseconds (drafts 01–07). The Unix epoch is MJD 40587; a day is
    /// 86,400 s, as in Unix time.
    MjdMicros,
}

/// Microseconds in a day.
const DAY_US: u64 = 86_400_000_000;
/// The Modified Julian Date of 1970-01-01.
const MJD_UNIX_EPOCH: u64 = 40_587;
/// The last MJD the 24-bit day field holds.
const MJD_MAX: u64 = (1 << 24) - 1;

impl TimeFormat {
    /// RADI units per second.
    pub const fn radius_ticks_per_second(self) -> u64 {
        match self {
            Self::UnixSeconds => 1,
            Self::UnixMicros | Self::MjdMicros => 1_000_000,
        }
    }

    /// A timestamp of `unix_us` microseconds since the Unix epoch, truncated to whole seconds
    /// for [`UnixSeconds`](Self::UnixSeconds); a time beyond what the format holds saturates
    /// at the largest it does.
    pub const fn encode(self, unix_us: u64) -> u64 {
        match self {
            Self::UnixSeconds => unix_us / 1_000_000,
            Self::UnixMicros => unix_us,
            Self::MjdMicros => {
                let mjd = MJD_UNIX_EPOCH + unix_us / DAY_US;
                if mjd > MJD_MAX {
                    (MJD_MAX << 40) | (DAY_US - 1)
                } else {
                    (mjd << 40) | (unix_us % DAY_US)
                }
            }
        }
    }

    /// The timestamp `unix_s` seconds after the Unix epoch (saturating), e.g. a MINT or MAXT.
    pub const fn encode_seconds(self, unix_s: u64) -> u64 {
        match self {
            Self::UnixSeconds => unix_s,
            _ => self.encode(unix_s.saturating_mul(1_000_000)),
        }
    }

    /// Microseconds since the Unix epoch of a timestamp, saturating; `None` for an MJD timestamp
    /// whose microseconds do not fit in a day or whose day is before 1970.
    pub const fn decode_us(self, wire: u64) -> Option<u64> {
        match self {
            Self::UnixSeconds => Some(wire.saturating_mul(1_000_000)),
            Self::UnixMicros => Some(wire),
            Self::MjdMicros => {
                let (mjd, us) = (wire >> 40, wire & ((1 << 40) - 1));
                if us >= DAY_US || mjd < MJD_UNIX_EPOCH {
                    return None;
                }
                Some((mjd - MJD_UNIX_EPOCH) * DAY_US + us)
            }
        }
    }
}

/// Versions with a VER number: all but Google's. The most a VERS list holds.
pub(crate) const NUMBERED_VERSIONS: usize = Version::COUNT - 1;

/// Most versions a request's VER may list (RFC 10049 §5.1.1).
pub(crate) const MAX_OFFERED_VERSIONS: usize = 32;

/// A set of versions, e.g. the ones a server has enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionSet(u8);

impl VersionSet {
    /// No version.
    pub const EMPTY: Self = Self(0);
    /// Every version this crate speaks.
    pub const ALL: Self = {
        let mut bits = 0;
        let mut i = 0;
        while i < Version::ALL.len() {
            bits |= Version::ALL[i].bit();
            i += 1;
        }
        Self(bits)
    };

    /// This set plus `version`.
    pub const fn with(self, version: Version) -> Self {
        Self(self.0 | version.bit())
    }

    /// This set minus `version`.
    pub const fn without(self, version: Version) -> Self {
        Self(self.0 & !version.bit())
    }

    /// True if `version` is in the set.
    pub const fn contains(self, version: Version) -> bool {
        self.0 & version.bit() != 0
    }

    /// True if the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The members, worst to best.
    pub fn iter(self) -> impl Iterator<Item = Version> {
        Version::ALL.into_iter().filter(move |v| self.contains(*v))
    }

    /// The best member among `offered` VER numbers; unknown numbers are ignored, and so is the
    /// order they come in (Cloudflare's client offers [0x8000000b, 0x80000008]).
    pub fn best_of(self, offered: VersionList<'_>) -> Option<Version> {
        offered
            .iter()
            .filter_map(Version::from_number)
            .filter(|v| self.contains(*v))
            .max()
    }

    /// The members' VER numbers in ascending numeric order, as VERS lists them; returns the count
    /// written into `out`.
    pub fn numbers_ascending(self, out: &mut [u32; NUMBERED_VERSIONS]) -> usize {
        let mut n = 0;
        // Version 1 sorts below the experimental 0x8000_00xx numbers.
        for v in [
            Version::Rfc10049,
            Version::Draft07,
            Version::Draft08,
            Version::Draft09,
            Version::Draft10,
            Version::Draft11,
            Version::Draft12,
        ] {
            if let (true, Some(number), Some(slot)) = (self.contains(v), v.number(), out.get_mut(n))
            {
                *slot = number;
                n += 1;
            }
        }
        n
    }
}

impl Default for VersionSet {
    fn default() -> Self {
        Self::ALL
    }
}

impl FromIterator<Version> for VersionSet {
    fn from_iter<I: IntoIterator<Item = Version>>(iter: I) -> Self {
        iter.into_iter().fold(Self::EMPTY, Self::with)
    }
}

/// A VER value: a list of little-endian `u32` version numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionList<'a>(&'a [u8]);

impl<'a> VersionList<'a> {
    /// Wraps a VER value whose length the caller has checked to be a multiple of 4.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self(bytes)
    }

    /// The version numbers in the order sent.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.0
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }

    /// True if `number` is listed.
    pub fn contains(&self, number: u32) -> bool {
        self.iter().any(|n| n == number)
    }

    /// Number of versions listed.
    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    /// True if nothing is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(numbers: &[u32]) -> Vec<u8> {
        numbers.iter().flat_map(|n| n.to_le_bytes()).collect()
    }

    #[test]
    fn numbers_round_trip() {
        for v in Version::ALL {
            match v.number() {
                Some(n) => assert_eq!(Version::from_number(n), Some(v)),
                None => assert_eq!(v, Version::Google),
            }
        }
        for unknown in [0, 2, 0x8000_0006, 0x8000_000d, 0x8000_000e, 0x8000_000f] {
            assert_eq!(Version::from_number(unknown), None, "{unknown:#x}");
        }
    }

    #[test]
    fn labels_are_the_numbers_and_indexes_dense() {
        for (i, v) in Version::ALL.into_iter().enumerate() {
            assert_eq!(v.index(), i);
            let expected = match v.number() {
                Some(1) => "1".to_owned(),
                Some(n) => format!("{n:#010x}"),
                None => "google".to_owned(),
            };
            assert_eq!(v.label(), expected);
        }
    }

    #[test]
    fn picks_the_best_offered_version() {
        let all = VersionSet::ALL;
        let pick = |numbers: &[u32]| all.best_of(VersionList::new(&list(numbers)));
        // Cloudflare's order, not ascending.
        assert_eq!(pick(&[0x8000_000b, 0x8000_0008]), Some(Version::Draft11));
        assert_eq!(pick(&[1, 0x8000_000c]), Some(Version::Rfc10049));
        // tannerryan's client: drafts 01–12.
        let tannerryan: Vec<u32> = (1..=12).map(|d| 0x8000_0000 | d).collect();
        assert_eq!(pick(&tannerryan), Some(Version::Draft12));
        // roughly's numbers are not drafts 13–15.
        assert_eq!(pick(&[0x8000_000d, 0x8000_000e, 0x8000_000f]), None);
        assert_eq!(pick(&[]), None);

        let old_only = VersionSet::EMPTY.with(Version::Draft08);
        let list = list(&[1, 0x8000_000c, 0x8000_0008]);
        assert_eq!(
            old_only.best_of(VersionList::new(&list)),
            Some(Version::Draft08)
        );
    }

    #[test]
    fn vers_lists_ascending() {
        let mut out = [0; NUMBERED_VERSIONS];
        let n = VersionSet::ALL.numbers_ascending(&mut out);
        assert_eq!(
            &out[..n],
            &[
                1,
                0x8000_0007,
                0x8000_0008,
                0x8000_0009,
                0x8000_000a,
                0x8000_000b,
                0x8000_000c
            ]
        );
        let only12 = VersionSet::EMPTY
            .with(Version::Draft12)
            .with(Version::Google);
        let n = only12.numbers_ascending(&mut out);
        assert_eq!(&out[..n], &[0x8000_000c]);
        assert!(!only12.without(Version::Draft12).contains(Version::Draft12));
    }

    #[test]
    fn contexts_per_family() {
        use ContextSpelling::*;
        assert_eq!(
            Family::Rfc.srep_context(Family::Rfc.spelling()),
            b"Roughtime v1 response signature\0"
        );
        assert_eq!(
            Family::Rfc.dele_context(Family::Rfc.spelling()),
            b"Roughtime v1 delegation signature\0"
        );
        assert_eq!(
            Family::Rfc.dele_context(RoughTime),
            b"RoughTime v1 delegation signature\0"
        );
        // In each family's own spelling: Google and drafts 08–11 end DELE's context with "--",
        // draft 07 and drafts 12 on do not.
        for (f, dele) in [
            (
                Family::Google,
                &b"RoughTime v1 delegation signature--\0"[..],
            ),
            (Family::Draft08, b"RoughTime v1 delegation signature--\0"),
            (Family::Draft07, b"RoughTime v1 delegation signature\0"),
            (Family::Draft12, b"RoughTime v1 delegation signature\0"),
        ] {
            assert_eq!(f.dele_context(f.spelling()), dele, "{f:?}");
            let srep = f.srep_context(f.spelling());
            assert_eq!(srep, b"RoughTime v1 response signature\0", "{f:?}");
        }
    }

    #[test]
    fn draft07_hashes_its_nonces_with_sha512_256() {
        let f = Version::Draft07.family();
        assert_eq!(f.tree_hash(), TreeHash::Sha512_256);
        assert_eq!(f.leaf_data(), LeafData::Nonce);
        assert_eq!(f.time_format(), TimeFormat::MjdMicros);
        assert!(!f.signs_version() && !f.has_type());
        assert_eq!(Family::Draft08.tree_hash(), TreeHash::Sha512);
    }

    /// MJD timestamps: the Unix epoch is MJD 40587, 2026-11-22 (20,779 days later) is MJD 61366,
    /// and out-of-range values are refused or saturate.
    #[test]
    fn mjd_timestamps() {
        let f = TimeFormat::MjdMicros;
        assert_eq!(f.encode(0), 40_587 << 40);
        let noon = 20_779 * 86_400_000_000 + 43_200_000_001;
        assert_eq!(f.encode(noon), (61_366 << 40) | 43_200_000_001);
        assert_eq!(f.decode_us(f.encode(noon)), Some(noon));
        assert_eq!(f.encode_seconds(20_779 * 86_400), 61_366 << 40);
        // The last microsecond of a day, then the next day.
        let last = 86_400_000_000 - 1;
        assert_eq!(f.encode(last), (40_587 << 40) | last);
        assert_eq!(f.encode(last + 1), 40_588 << 40);
        // Not a time: a day of more than 86,400 s, a day before 1970.
        assert_eq!(f.decode_us((61_001 << 40) | 86_400_000_000), None);
        assert_eq!(f.decode_us(40_586 << 40), None);
        // "Forever" saturates at the last representable microsecond, which decodes.
        let forever = f.encode_seconds(u64::MAX);
        assert_eq!(forever, ((1 << 24) - 1) << 40 | last);
        assert!(f.decode_us(forever).is_some());
        assert_eq!(TimeFormat::UnixSeconds.encode(1_999_999), 1);
        assert_eq!(TimeFormat::UnixSeconds.decode_us(2), Some(2_000_000));
        assert_eq!(TimeFormat::UnixMicros.encode_seconds(3), 3_000_000);
        assert_eq!(f.radius_ticks_per_second(), 1_000_000);
    }

    #[test]
    fn display() {
        assert_eq!(
            Version::Draft08.to_string(),
            "draft-ietf-ntp-roughtime-08 (0x80000008)"
        );
        assert_eq!(
            Version::Draft07.to_string(),
            "draft-ietf-ntp-roughtime-07 (0x80000007)"
        );
        assert_eq!(
            Version::Draft11.to_string(),
            "draft-ietf-ntp-roughtime-11 (0x8000000b)"
        );
    }
}
