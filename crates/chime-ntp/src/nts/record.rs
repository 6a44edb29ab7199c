//! NTS-KE's records (RFC 8915 §4, and the NTS pool's): their types, the one reader of record
//! headers for the server's side, the client's and a pool's, the Next Protocol ids they name, and
//! why a response's records are not usable.

pub(crate) const END_OF_MESSAGE: u16 = 0;
pub(crate) const NEXT_PROTOCOL: u16 = 1;
pub(crate) const ERROR: u16 = 2;
pub(crate) const AEAD_ALGORITHM: u16 = 4;
pub(crate) const NEW_COOKIE: u16 = 5;
pub(crate) const NTPV4_SERVER: u16 = 6;
pub(crate) const NTPV4_PORT: u16 = 7;
/// The NTS pool's records (see `pool`).
pub(crate) const KEEP_ALIVE: u16 = 8;
pub(crate) const SUPPORTED_PROTOCOLS: u16 = 9;
pub(crate) const SUPPORTED_ALGORITHMS: u16 = 10;
pub(crate) const FIXED_KEY_REQUEST: u16 = 12;
pub(crate) const NTP_SERVER_DENY: u16 = 13;
pub(crate) const AUTHENTICATION_TOKEN: u16 = 14;
/// chrony's Compliant AES-128-GCM-SIV Exporter Context (empty, not critical): a client
/// that sends it wants the keys of AEAD_AES_128_GCM_SIV exported with its own number in the
/// context; one that does not (chrony 4.4 to 4.6.0) exports them with 15's, and a server
/// that agrees on 30 must do the same for it.
pub(crate) const COMPLIANT_GCM_SIV_EXPORT: u16 = 1024;
pub(crate) const CRITICAL: u16 = 0x8000;

/// One record of an NTS-KE message, as [`records`] reads it.
pub(crate) struct Record<'a> {
    pub(crate) critical: bool,
    /// Its type, without the critical bit.
    pub(crate) ty: u16,
    pub(crate) body: &'a [u8],
    /// Where the record ends in the message.
    pub(crate) end: usize,
}

/// The records of a message, in order, up to and including End of Message: the one reader
/// of record headers, for the server's side, the client's and a pool's.
pub(crate) fn records(bytes: &[u8]) -> Records<'_> {
    Records { bytes, at: 0 }
}

/// See [`records`]. A record whose body runs past the end is an `Err`, and the last item;
/// nothing after End of Message is read, nor a tail too short for a record's header.
pub(crate) struct Records<'a> {
    bytes: &'a [u8],
    /// Where the next record starts; past the end once the message is read.
    at: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, ()>;

    fn next(&mut self) -> Option<Self::Item> {
        let (bytes, at) = (self.bytes, self.at);
        let header = bytes.get(at..at.checked_add(4)?)?;
        let raw = u16::from_be_bytes([header[0], header[1]]);
        let len = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let Some(body) = bytes.get(at + 4..at + 4 + len) else {
            self.at = usize::MAX;
            return Some(Err(()));
        };
        let ty = raw & !CRITICAL;
        self.at = if ty == END_OF_MESSAGE {
            usize::MAX
        } else {
            at + 4 + len
        };
        Some(Ok(Record {
            critical: raw & CRITICAL != 0,
            ty,
            body,
            end: at + 4 + len,
        }))
    }
}

/// Appends a record: its type (with the critical bit, if set), its length, its body.
pub(crate) fn put(out: &mut Vec<u8>, ty: u16, body: &[u8]) {
    out.extend_from_slice(&ty.to_be_bytes());
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(body);
}

/// The NTP a session's keys are for (RFC 8915 §4.1.2's Next Protocol ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// NTPv4, id 0.
    #[default]
    NtpV4,
    /// NTPv5 as drafted, id 0x8001 (the drafts' experimental number), served only where the
    /// server speaks v5.
    NtpV5Draft,
}

impl Protocol {
    /// Every protocol, in [`Protocol::index`] order.
    pub const ALL: [Self; 2] = [Self::NtpV4, Self::NtpV5Draft];

    /// A dense index below `Protocol::ALL.len()`, for counter arrays: its place in
    /// [`Protocol::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Self::NtpV4 => 0,
            Self::NtpV5Draft => 1,
        }
    }

    /// Its Next Protocol id.
    pub const fn id(self) -> u16 {
        match self {
            Self::NtpV4 => 0,
            Self::NtpV5Draft => 0x8001,
        }
    }

    /// The protocol of Next Protocol id `id`, if it is one of these.
    pub const fn from_id(id: u16) -> Option<Self> {
        match id {
            0 => Some(Self::NtpV4),
            0x8001 => Some(Self::NtpV5Draft),
            _ => None,
        }
    }
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
    /// The server serves none of the protocols offered (an empty Next Protocol record).
    #[error("the server serves no protocol offered")]
    NoProtocol,
    /// The server serves none of the AEAD algorithms offered (an empty AEAD Algorithm record).
    #[error("the server serves none of the AEAD algorithms offered")]
    NoAead,
}
