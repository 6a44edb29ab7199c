//! NTPv5 as drafted (draft-ietf-ntp-ntpv5, revisions -08 and -09): the server's responder, the
//! upgrade mark a v4 reply carries, the reference-ID Bloom filter, and a client's request and
//! response for `chime ntp`.
//!
//! The v5 header is 48 bytes like v4's, but the fields after the precision differ:
//!
//! ```text
//!  0 LI|VN|Mode  1 stratum  2 poll  3 precision
//!  4 root delay (unsigned 4.28 s)       8 root dispersion (4.28 s)
//! 12 timescale  13 era  14..16 flags (0x1 synchronised, 0x2 interleaved, 0x4 NTS NAK)
//! 16 server cookie (8)  24 client cookie (8)  32 receive timestamp  40 transmit timestamp
//! ```
//!
//! Extension fields follow, each a type and a length that counts the type, the length and the
//! value but not the zero padding to the next 4-byte boundary (v4's length counts the padding).
//! A v5 packet carries no MAC.
//!
//! Until v5 is a standard each side names the draft it speaks in a Draft Identification field,
//! and a server answers only a draft it knows, naming the same one. The receive and transmit
//! timestamps sit where v4 has them, so [`crate::stamp_transmit`] and
//! [`crate::reply_receive_timestamp`] work on v5 replies too. Like [`crate::respond`], nothing here
//! allocates, reads a clock or panics on any input.

use crate::interleave::RX_MARK;
use crate::packet::{Header, Leap, Mode, first_byte, version_of};
use crate::responder::DropReason;
use crate::state::ServedHeader;
use crate::time::NtpTimestamp;

/// The version number in the first byte.
pub const VERSION: u8 = 5;

/// The reference timestamp with which a v4 client asks whether the server speaks v5; a server
/// that does echoes it in its v4 reply ([`mark_upgrade`]).
pub const UPGRADE: [u8; 8] = *b"NTP5DRFT";

/// Extension field types used by the drafts (experimental range).
pub mod ef {
    /// Padding: makes a reply as long as its request.
    pub const PADDING: u16 = 0xF501;
    /// Asks for a slice of the server's reference-ID Bloom filter.
    pub const REFERENCE_ID_REQUEST: u16 = 0xF503;
    /// Carries the slice asked for.
    pub const REFERENCE_ID_RESPONSE: u16 = 0xF504;
    /// Names the draft the sender speaks.
    pub const DRAFT_ID: u16 = 0xF5FF;
    /// NTS's Unique Identifier (RFC 8915), echoed in v5 as in v4.
    pub const UNIQUE_IDENTIFIER: u16 = crate::nts::ef::UNIQUE_IDENTIFIER;
}

/// A revision of the draft, each with the identification it must be named by exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Draft {
    /// draft-ietf-ntp-ntpv5-08, which ntpd-rs 1.9 speaks.
    D08,
    /// draft-ietf-ntp-ntpv5-09.
    D09,
}

impl Draft {
    /// Every draft the responder answers.
    pub const ALL: [Self; 2] = [Self::D08, Self::D09];

    /// The identification carried in the Draft Identification field.
    pub const fn id(self) -> &'static str {
        match self {
            Self::D08 => "draft-ietf-ntp-ntpv5-08",
            Self::D09 => "draft-ietf-ntp-ntpv5-09",
        }
    }

    /// The draft named by a Draft Identification field's value, matched exactly.
    pub fn from_id(id: &[u8]) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.id().as_bytes() == id)
    }

    /// A short label (`"08"`), for counters.
    pub const fn label(self) -> &'static str {
        match self {
            Self::D08 => "08",
            Self::D09 => "09",
        }
    }
}

/// The timescale field's values. In a request, the timescale asked for; in a reply, the one its
/// receive and transmit timestamps are in, which a server that does not serve the one asked for
/// sets to one it does (the draft's "respond in any timescale it supports").
pub mod timescale {
    /// UTC: what chimed serves unless TAI is asked for and known.
    pub const UTC: u8 = 0;
    /// TAI: UTC plus the TAI − UTC offset, counting leap seconds.
    pub const TAI: u8 = 1;
    /// UT1.
    pub const UT1: u8 = 2;
    /// UTC with leap seconds smeared out.
    pub const LEAP_SMEARED_UTC: u8 = 3;
}

/// The timescale a v5 request asks for (its header's field); UTC for anything too short to say.
pub fn requested_timescale(request: &[u8]) -> u8 {
    request
        .get(at::TIMESCALE)
        .copied()
        .unwrap_or(timescale::UTC)
}

/// Asks, in a v5 request written by [`write_request`], for the timescale `scale` (one of
/// [`timescale`]'s). Nothing is done to a request shorter than the header.
pub fn ask_timescale(request: &mut [u8], scale: u8) {
    if let Some(byte) = request.get_mut(at::TIMESCALE) {
        *byte = scale;
    }
}

/// Says in a v5 reply written by [`write_header`] or [`respond`] that its timestamps are in the
/// timescale `scale` (one of [`timescale`]'s). Nothing is done to a reply shorter than the header.
pub fn set_timescale(reply: &mut [u8], scale: u8) {
    if let Some(byte) = reply.get_mut(at::TIMESCALE) {
        *byte = scale;
    }
}

/// Moves a v5 reply written by [`write_header`] or [`respond`] into TAI: its receive timestamp
/// becomes `receive_utc` (the time of arrival in UTC) `tai_offset` seconds later, marked as
/// [`write_header`] marks it; its timescale TAI; its era `era` (TAI's, which may differ from
/// UTC's within the offset of an era's end). The transmit timestamp is the caller's to stamp, in
/// TAI too. Nothing is done to a reply shorter than the header.
pub fn move_to_tai(reply: &mut [u8], receive_utc: NtpTimestamp, tai_offset: u16, era: u8) {
    let Some(out) = reply.first_chunk_mut::<{ Header::LEN }>() else {
        return;
    };
    let moved = NtpTimestamp(receive_utc.0.wrapping_add(u64::from(tai_offset) << 32) | RX_MARK);
    out[at::RECEIVE_TS..at::TRANSMIT_TS].copy_from_slice(&moved.to_bits());
    out[at::TIMESCALE] = timescale::TAI;
    out[at::ERA] = era;
}

/// The flags word's bits (byte 15; byte 14 is zero).
pub mod flags {
    /// The server is synchronised.
    pub const SYNCHRONISED: u8 = 0x01;
    /// Interleaved mode.
    pub const INTERLEAVED: u8 = 0x02;
    /// An NTS NAK: the server could not authenticate the request.
    pub const AUTH_NAK: u8 = 0x04;
}

/// Byte offsets of the v5 header's fields.
mod at {
    pub(super) const LVM: usize = 0;
    pub(super) const STRATUM: usize = 1;
    pub(super) const POLL: usize = 2;
    pub(super) const PRECISION: usize = 3;
    pub(super) const ROOT_DELAY: usize = 4;
    pub(super) const ROOT_DISPERSION: usize = 8;
    pub(super) const TIMESCALE: usize = 12;
    pub(super) const ERA: usize = 13;
    pub(super) const FLAGS: usize = 14;
    pub(super) const SERVER_COOKIE: usize = 16;
    pub(super) const CLIENT_COOKIE: usize = 24;
    pub(super) const RECEIVE_TS: usize = 32;
    pub(super) const TRANSMIT_TS: usize = 40;
}

/// Whether a datagram says it is NTPv5 (version bits 5), before any other check.
pub fn is_v5(packet: &[u8]) -> bool {
    packet.first().is_some_and(|&b| version_of(b) == VERSION)
}

/// One extension field: its type, its value and where it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    /// Where it starts in the packet.
    pub start: usize,
    /// The field type.
    pub ty: u16,
    /// The value, without the padding.
    pub value: &'a [u8],
}

/// The extension fields after the header, or `None` if they are not well formed: each at least
/// its 4-byte head, its padded length within the packet, and nothing left over.
pub fn fields(packet: &[u8]) -> Option<impl Iterator<Item = Field<'_>>> {
    let mut at = Header::LEN;
    let mut ok = packet.len() >= Header::LEN;
    while ok && at < packet.len() {
        match field_at(packet, at) {
            Some((_, next)) => at = next,
            None => ok = false,
        }
    }
    ok.then(|| {
        let mut at = Header::LEN;
        std::iter::from_fn(move || {
            let (field, next) = field_at(packet, at)?;
            at = next;
            Some(field)
        })
    })
}

/// The field at `at` and where the next one starts.
fn field_at(packet: &[u8], at: usize) -> Option<(Field<'_>, usize)> {
    let head = packet.get(at..at + 4)?;
    let ty = u16::from_be_bytes([head[0], head[1]]);
    let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
    let next = at.checked_add(len.checked_next_multiple_of(4)?)?;
    if len < 4 || next > packet.len() {
        return None;
    }
    Some((
        Field {
            start: at,
            ty,
            value: &packet[at + 4..at + len],
        },
        next,
    ))
}

/// Appends a field to `out[..*len]`, zero-padded; `None` if it does not fit.
fn put_field(out: &mut [u8], len: &mut usize, ty: u16, value: &[u8]) -> Option<()> {
    let field_len = 4 + value.len();
    let end = *len + field_len.next_multiple_of(4);
    let slot = out.get_mut(*len..end)?;
    slot[..2].copy_from_slice(&ty.to_be_bytes());
    slot[2..4].copy_from_slice(&u16::try_from(field_len).ok()?.to_be_bytes());
    slot[4..field_len].copy_from_slice(value);
    slot[field_len..].fill(0);
    *len = end;
    Some(())
}

/// A server's identity in the reference-ID Bloom filter: ten distinct 12-bit bit numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerId([u16; 10]);

impl ServerId {
    /// An identity from a source of random numbers (only the low 12 bits of each are used),
    /// drawing until it has ten distinct ones.
    pub fn new(mut random: impl FnMut() -> u16) -> Self {
        let mut bits = [0u16; 10];
        let mut n = 0;
        while n < bits.len() {
            let b = random() & 0x0FFF;
            if !bits[..n].contains(&b) {
                bits[n] = b;
                n += 1;
            }
        }
        bits.sort_unstable();
        Self(bits)
    }

    /// The bit numbers.
    pub const fn bits(&self) -> [u16; 10] {
        self.0
    }
}

/// The reference-ID Bloom filter: 4096 bits, a server's own identity and those of its sources,
/// which a client reads in slices to see whether it is among them (a timing loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BloomFilter([u8; Self::BYTES]);

impl BloomFilter {
    /// Its size in bytes.
    pub const BYTES: usize = 512;

    /// An empty filter.
    pub const fn new() -> Self {
        Self([0; Self::BYTES])
    }

    /// A filter from its bytes, as a client assembles them.
    pub const fn from_bytes(bytes: [u8; Self::BYTES]) -> Self {
        Self(bytes)
    }

    /// Adds an identity.
    pub fn add_id(&mut self, id: &ServerId) {
        for bit in id.0 {
            self.0[usize::from(bit / 8)] |= 1 << (bit % 8);
        }
    }

    /// Adds every identity in another filter (a source's).
    pub fn add(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }

    /// Whether the filter may hold `id` (a Bloom filter can say yes wrongly, never no wrongly).
    pub fn contains(&self, id: &ServerId) -> bool {
        (id.0.iter()).all(|&bit| self.0[usize::from(bit / 8)] & (1 << (bit % 8)) != 0)
    }

    /// The filter's bytes.
    pub const fn as_bytes(&self) -> &[u8; Self::BYTES] {
        &self.0
    }

    /// The numbers of the bits set, in order: ten per identity the filter holds, less any that
    /// two identities share.
    pub fn bits(&self) -> impl Iterator<Item = u16> + '_ {
        (0..Self::BYTES as u16 * 8)
            .filter(|&bit| self.0[usize::from(bit / 8)] & (1 << (bit % 8)) != 0)
    }
}

impl Default for BloomFilter {
    fn default() -> Self {
        Self::new()
    }
}

/// A v5 reply written by [`respond`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Its length, always the request's.
    pub len: usize,
    /// The draft the request named, and the reply names.
    pub draft: Draft,
}

/// What [`accept`] made of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The draft it named.
    pub draft: Draft,
    /// Whether it carries NTS fields (a cookie, a placeholder or an authenticator): to be
    /// answered through [`crate::nts::check_request_v5`], or dropped.
    pub nts: bool,
}

/// NTS's field types, which a plain v5 reply never answers.
const NTS_FIELDS: [u16; 3] = {
    use crate::nts::ef;
    [ef::COOKIE, ef::COOKIE_PLACEHOLDER, ef::AUTHENTICATOR]
};

/// Checks an NTPv5 request: at least the header and a multiple of 4 bytes, version 5, mode 3,
/// well-formed fields, and a Draft Identification naming a draft in [`Draft::ALL`] exactly
/// (unknown or missing: [`DropReason::UnknownDraft`]).
pub fn accept(request: &[u8]) -> Result<Accepted, DropReason> {
    let Some(head) = request.first_chunk::<{ Header::LEN }>() else {
        return Err(DropReason::TooShort);
    };
    if !request.len().is_multiple_of(4) {
        return Err(DropReason::BadLength);
    }
    let version = version_of(head[at::LVM]);
    if version != VERSION {
        return Err(DropReason::BadVersion(version));
    }
    match Mode::from_first_byte(head[at::LVM]) {
        Mode::Client => {}
        mode => return Err(DropReason::UnsupportedMode(mode)),
    }
    let (mut draft, mut nts) = (None, false);
    for f in fields(request).ok_or(DropReason::BadExtension)? {
        match f.ty {
            ef::DRAFT_ID => draft = Draft::from_id(f.value),
            ty => nts |= NTS_FIELDS.contains(&ty),
        }
    }
    let draft = draft.ok_or(DropReason::UnknownDraft)?;
    Ok(Accepted { draft, nts })
}

/// Writes the v5 header of the reply to an accepted `request` into `reply[..48]`: the served
/// state (timescale UTC, era `era`, the synchronised flag unless `served` says unsynchronised),
/// the request's poll and client cookie, the marked receive timestamp as the server cookie
/// (unique per reply), receive and provisional transmit timestamps as [`crate::respond`] writes
/// them. `Err` if `reply` is shorter than the request: a v5 reply is exactly as long.
pub fn write_header(
    request: &[u8],
    rx_time: NtpTimestamp,
    served: &ServedHeader,
    era: u8,
    reply: &mut [u8],
) -> Result<(), DropReason> {
    let (Some(head), true) = (
        request.first_chunk::<{ Header::LEN }>(),
        reply.len() >= request.len(),
    ) else {
        return Err(DropReason::ReplyBufferTooSmall);
    };
    let out = &mut reply[..Header::LEN];
    let synchronised = served.leap != Leap::Unsynchronised && (1..16).contains(&served.stratum);
    let leap = if synchronised {
        served.leap
    } else {
        Leap::Unsynchronised
    };
    out[at::LVM] = first_byte(leap, VERSION, Mode::Server);
    out[at::STRATUM] = served.stratum;
    out[at::POLL] = head[at::POLL];
    out[at::PRECISION] = served.precision as u8;
    out[at::ROOT_DELAY..at::ROOT_DISPERSION].copy_from_slice(&short_to_time32(served.root_delay.0));
    out[at::ROOT_DISPERSION..at::TIMESCALE]
        .copy_from_slice(&short_to_time32(served.root_dispersion.0));
    out[at::TIMESCALE] = timescale::UTC;
    out[at::ERA] = era;
    out[at::FLAGS] = 0;
    out[at::FLAGS + 1] = if synchronised { flags::SYNCHRONISED } else { 0 };
    let receive = NtpTimestamp(rx_time.0 | RX_MARK);
    let transmit = NtpTimestamp(rx_time.0 & !RX_MARK);
    out[at::SERVER_COOKIE..at::CLIENT_COOKIE].copy_from_slice(&receive.to_bits());
    out[at::CLIENT_COOKIE..at::RECEIVE_TS]
        .copy_from_slice(&head[at::CLIENT_COOKIE..at::RECEIVE_TS]);
    out[at::RECEIVE_TS..at::TRANSMIT_TS].copy_from_slice(&receive.to_bits());
    out[at::TRANSMIT_TS..Header::LEN].copy_from_slice(&transmit.to_bits());
    Ok(())
}

/// Answers one NTPv5 request without NTS, or says why it is dropped.
///
/// Accepted as [`accept`] says; a request with NTS fields is [`DropReason::BadExtension`] here,
/// never answered unauthenticated. The reply: the header ([`write_header`]), then the request's
/// Unique Identifier, the slice of `filter` each Reference ID Request asks for (one within the
/// 512 bytes, a multiple of 4 long), the Draft Identification, and Padding to the request's
/// length. It is exactly as long as the request, never longer: every field echoed or answered
/// takes the room its request field took.
pub fn respond(
    request: &[u8],
    rx_time: NtpTimestamp,
    served: &ServedHeader,
    filter: &BloomFilter,
    era: u8,
    reply: &mut [u8],
) -> Result<Reply, DropReason> {
    let accepted = accept(request)?;
    if accepted.nts {
        return Err(DropReason::BadExtension);
    }
    write_header(request, rx_time, served, era, reply)?;
    let out = &mut reply[..request.len()];
    let mut len = Header::LEN;
    // The fields were checked by `accept`; each answer is no longer than the field that asked.
    for f in fields(request).into_iter().flatten() {
        let put = match f.ty {
            ef::UNIQUE_IDENTIFIER => put_field(out, &mut len, f.ty, f.value),
            ef::REFERENCE_ID_REQUEST => match reference_slice(f.value, filter) {
                Some(slice) => put_field(out, &mut len, ef::REFERENCE_ID_RESPONSE, slice),
                None => Some(()),
            },
            _ => Some(()),
        };
        put.ok_or(DropReason::ReplyBufferTooSmall)?;
    }
    put_field(out, &mut len, ef::DRAFT_ID, accepted.draft.id().as_bytes())
        .ok_or(DropReason::ReplyBufferTooSmall)?;
    if len < out.len() {
        // What is left is a multiple of 4 and at least 4: one padding field fills it.
        let pad = out.len() - len;
        out[len..len + 2].copy_from_slice(&ef::PADDING.to_be_bytes());
        out[len + 2..len + 4].copy_from_slice(&(pad as u16).to_be_bytes());
        out[len + 4..].fill(0);
        len = out.len();
    }
    Ok(Reply {
        len,
        draft: accepted.draft,
    })
}

/// The Draft Identification field for `draft`, framed and padded: 28 bytes for every draft
/// answered (a 23-byte name). For replies that add it after fields of their own (NTS's).
pub fn draft_field(draft: Draft) -> [u8; 28] {
    let mut out = [0u8; 28];
    let mut len = 0;
    put_field(&mut out, &mut len, ef::DRAFT_ID, draft.id().as_bytes()).expect("23 bytes fit");
    out
}

/// The slice of `filter` a Reference ID Request's value asks for: its offset in the first two
/// bytes, its length the value's own, a multiple of 4 within the filter.
fn reference_slice<'f>(value: &[u8], filter: &'f BloomFilter) -> Option<&'f [u8]> {
    let offset = usize::from(u16::from_be_bytes([*value.first()?, *value.get(1)?]));
    if !value.len().is_multiple_of(4) {
        return None;
    }
    filter
        .as_bytes()
        .get(offset..offset.checked_add(value.len())?)
}

/// The NTP era (the count of 2^32-second wraps since 1900) of a Unix time, for the v5 header:
/// 0 until 2036-02-07T06:28:16Z, 1 from then.
pub const fn era(unix_secs: i64) -> u8 {
    (unix_secs + 2_208_988_800).div_euclid(1 << 32) as u8
}

/// A v4 short (16.16 seconds) as v5's 4.28 seconds, saturating at 16 s.
const fn short_to_time32(short: u32) -> [u8; 4] {
    let v = if short >= 0x0010_0000 {
        u32::MAX
    } else {
        short << 12
    };
    v.to_be_bytes()
}

/// Turns a v5 reply into a Kiss-o'-Death: stratum 0, leap 3, not synchronised, and the code in
/// the server cookie's first four bytes, where v5 carries it. A buffer shorter than a header is
/// left alone.
pub fn kiss_of_death(reply: &mut [u8], code: [u8; 4]) {
    if let Some(out) = reply.first_chunk_mut::<{ Header::LEN }>() {
        out[at::LVM] = (out[at::LVM] & 0x3f) | (Leap::Unsynchronised as u8) << 6;
        out[at::STRATUM] = 0;
        out[at::FLAGS + 1] &= !flags::SYNCHRONISED;
        out[at::SERVER_COOKIE..at::SERVER_COOKIE + 4].copy_from_slice(&code);
    }
}

/// Turns a v5 reply into an NTS NAK: a Kiss-o'-Death (code `NTSN`) with the NTS NAK flag, which
/// tells the client to run NTS-KE again.
pub fn nts_nak(reply: &mut [u8]) {
    kiss_of_death(reply, *b"NTSN");
    if let Some(flags) = reply.get_mut(at::FLAGS + 1) {
        *flags |= flags::AUTH_NAK;
    }
}

/// For a v4 request that asks to upgrade (its reference timestamp is [`UPGRADE`]), writes
/// [`UPGRADE`] as the reference timestamp of its v4 reply, made by [`crate::respond`], and says so.
pub fn mark_upgrade(request: &[u8], reply: &mut [u8]) -> bool {
    let asks = request.get(16..24) == Some(&UPGRADE[..]) && version_of(request[0]) == 4;
    if let (true, Some(slot)) = (asks, reply.get_mut(16..24)) {
        slot.copy_from_slice(&UPGRADE);
        return true;
    }
    false
}

/// Writes a client's v5 request into `buf`: mode 3, `poll`, `client_cookie`, the transmit
/// timestamp left zero (v5 matches replies by cookie), the Draft Identification for `draft`, and
/// a Reference ID Request for `reference` (offset, length), if given. Returns its length, or
/// `None` if `buf` is too short or the request is not a multiple of 4 bytes within the filter.
pub fn write_request(
    buf: &mut [u8],
    draft: Draft,
    poll: i8,
    client_cookie: [u8; 8],
    reference: Option<(u16, u16)>,
) -> Option<usize> {
    let head = buf.first_chunk_mut::<{ Header::LEN }>()?;
    head.fill(0);
    head[at::LVM] = first_byte(Leap::NoWarning, VERSION, Mode::Client);
    head[at::POLL] = poll as u8;
    head[at::CLIENT_COOKIE..at::RECEIVE_TS].copy_from_slice(&client_cookie);
    let mut len = Header::LEN;
    if let Some((offset, bytes)) = reference {
        let (o, b) = (usize::from(offset), usize::from(bytes));
        if b < 4 || !b.is_multiple_of(4) || o + b > BloomFilter::BYTES {
            return None;
        }
        let mut value = [0u8; BloomFilter::BYTES];
        value[..2].copy_from_slice(&offset.to_be_bytes());
        put_field(buf, &mut len, ef::REFERENCE_ID_REQUEST, &value[..b])?;
    }
    put_field(buf, &mut len, ef::DRAFT_ID, draft.id().as_bytes())?;
    Some(len)
}

/// The client cookie of a v5 packet, or `None` if it is shorter than a header: what a client
/// sending many requests at once (`chime perf`) finds its request by before it checks the reply
/// with [`parse_response`] and that request's cookie. Nothing else is checked here.
pub fn client_cookie(packet: &[u8]) -> Option<[u8; 8]> {
    let head = packet.first_chunk::<{ Header::LEN }>()?;
    let mut cookie = [0; 8];
    cookie.copy_from_slice(&head[at::CLIENT_COOKIE..at::RECEIVE_TS]);
    Some(cookie)
}

/// A server's v5 reply as a client reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Response<'a> {
    /// Leap indicator.
    pub leap: Leap,
    /// Stratum (0: a Kiss-o'-Death).
    pub stratum: u8,
    /// Poll exponent.
    pub poll: i8,
    /// Precision, log2 seconds.
    pub precision: i8,
    /// Root delay, seconds.
    pub root_delay: f64,
    /// Root dispersion, seconds.
    pub root_dispersion: f64,
    /// Timescale.
    pub timescale: u8,
    /// Era.
    pub era: u8,
    /// Flags (byte 15).
    pub flags: u8,
    /// Server cookie.
    pub server_cookie: [u8; 8],
    /// Receive timestamp (T2).
    pub receive_ts: NtpTimestamp,
    /// Transmit timestamp (T3).
    pub transmit_ts: NtpTimestamp,
    /// The draft the reply names.
    pub draft: Draft,
    /// The Reference ID Response's bytes, if any.
    pub reference: Option<&'a [u8]>,
}

/// Why a v5 reply was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// Another version than 5 (a server that answered in v4, say).
    #[error("version {0}, not 5")]
    Version(u8),
    /// Not a well-formed v5 server reply (length, mode or fields).
    #[error("not a well-formed NTPv5 server reply")]
    Malformed,
    /// The client cookie is not the request's.
    #[error("the client cookie is not the request's")]
    WrongCookie,
    /// No Draft Identification, or another draft than the request's.
    #[error("the reply does not name the request's draft")]
    WrongDraft,
}

/// Reads a v5 server reply to a request made with `client_cookie` and `draft`.
pub fn parse_response(
    reply: &[u8],
    client_cookie: [u8; 8],
    draft: Draft,
) -> Result<Response<'_>, ResponseError> {
    let head = reply
        .first_chunk::<{ Header::LEN }>()
        .ok_or(ResponseError::Malformed)?;
    match version_of(head[0]) {
        VERSION => {}
        other => return Err(ResponseError::Version(other)),
    }
    if Mode::from_first_byte(head[0]) != Mode::Server {
        return Err(ResponseError::Malformed);
    }
    if head[at::CLIENT_COOKIE..at::RECEIVE_TS] != client_cookie {
        return Err(ResponseError::WrongCookie);
    }
    let mut named = None;
    let mut reference = None;
    for f in fields(reply).ok_or(ResponseError::Malformed)? {
        match f.ty {
            ef::DRAFT_ID => named = Draft::from_id(f.value),
            ef::REFERENCE_ID_RESPONSE => reference = Some(f.value),
            _ => {}
        }
    }
    if named != Some(draft) {
        return Err(ResponseError::WrongDraft);
    }
    let u32_at = |i: usize| u32::from_be_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let ts_at = |i: usize| NtpTimestamp(u64::from(u32_at(i)) << 32 | u64::from(u32_at(i + 4)));
    let mut server_cookie = [0; 8];
    server_cookie.copy_from_slice(&head[at::SERVER_COOKIE..at::CLIENT_COOKIE]);
    Ok(Response {
        leap: Leap::from_first_byte(head[0]),
        stratum: head[at::STRATUM],
        poll: head[at::POLL] as i8,
        precision: head[at::PRECISION] as i8,
        root_delay: f64::from(u32_at(at::ROOT_DELAY)) / f64::from(1u32 << 28),
        root_dispersion: f64::from(u32_at(at::ROOT_DISPERSION)) / f64::from(1u32 << 28),
        timescale: head[at::TIMESCALE],
        era: head[at::ERA],
        flags: head[at::FLAGS + 1],
        server_cookie,
        receive_ts: ts_at(at::RECEIVE_TS),
        transmit_ts: ts_at(at::TRANSMIT_TS),
        draft,
        reference,
    })
}

/// A client's gathering of a server's reference-ID Bloom filter over v5, a slice a poll: the
/// filter chimed serves holds its upstream's as well as its own identity, so that a client that
/// is the upstream's source sees the loop.
///
/// Sans-IO: [`FilterFetch::request`] writes the next request (asking for the next missing
/// quarter), [`FilterFetch::on_reply`] takes what came back and returns the whole filter once all
/// four quarters are in, then starts over, so that a changed filter is seen within four polls.
/// An upstream that answers no v5 (chronyd drops it unanswered) is asked again only every
/// [`FilterFetch::RETRY_EVERY`] polls after [`FilterFetch::TRIES`] unanswered ones.
#[derive(Clone, Debug)]
pub struct FilterFetch {
    draft: Draft,
    pending: Option<([u8; 8], usize)>,
    bytes: [u8; BloomFilter::BYTES],
    got: [bool; 4],
    unanswered: u32,
    skipped: u32,
}

impl FilterFetch {
    /// Unanswered requests after which the upstream is taken not to speak v5.
    pub const TRIES: u32 = 4;
    /// How often an upstream taken not to speak v5 is asked again, in calls to
    /// [`FilterFetch::request`].
    pub const RETRY_EVERY: u32 = 64;
    /// The bytes of the filter one request asks for: a quarter, so that a request (48 + 132 +
    /// 28 bytes) and its reply stay small.
    pub const SLICE: usize = BloomFilter::BYTES / 4;

    /// A fetch in `draft`, nothing gathered yet.
    pub fn new(draft: Draft) -> Self {
        Self {
            draft,
            pending: None,
            bytes: [0; BloomFilter::BYTES],
            got: [false; 4],
            unanswered: 0,
            skipped: 0,
        }
    }

    /// Whether the upstream has answered in v5 lately.
    pub fn speaks_v5(&self) -> bool {
        self.unanswered < Self::TRIES
    }

    /// The next request, into `buf` (at least 48 + 132 + 28 bytes), with the random
    /// `client_cookie`: its length, or `None` when this poll asks nothing (an upstream taken not
    /// to speak v5, between retries).
    pub fn request(&mut self, buf: &mut [u8], client_cookie: [u8; 8]) -> Option<usize> {
        if self.pending.take().is_some() {
            self.unanswered = self.unanswered.saturating_add(1);
        }
        if !self.speaks_v5() {
            self.skipped += 1;
            if self.skipped < Self::RETRY_EVERY {
                return None;
            }
            self.skipped = 0;
        }
        let quarter = self.got.iter().position(|g| !g).unwrap_or(0);
        let offset = (quarter * Self::SLICE) as u16;
        let len = write_request(
            buf,
            self.draft,
            0,
            client_cookie,
            Some((offset, Self::SLICE as u16)),
        )?;
        self.pending = Some((client_cookie, quarter));
        Some(len)
    }

    /// Takes a datagram from the upstream: if it answers the request outstanding with its slice,
    /// the slice is kept, and once all four are in the whole filter is returned.
    pub fn on_reply(&mut self, reply: &[u8]) -> Option<BloomFilter> {
        let (cookie, quarter) = self.pending?;
        let response = parse_response(reply, cookie, self.draft).ok()?;
        self.pending = None;
        self.unanswered = 0;
        let slice = response.reference.filter(|s| s.len() == Self::SLICE)?;
        let at = quarter * Self::SLICE;
        self.bytes[at..at + Self::SLICE].copy_from_slice(slice);
        self.got[quarter] = true;
        if self.got.iter().all(|&g| g) {
            self.got = [false; 4];
            return Some(BloomFilter::from_bytes(self.bytes));
        }
        None
    }
}

#[cfg(test)]
mod tests;
