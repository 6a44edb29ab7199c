//! The server side: turning a batch of request datagrams into signed replies.
//!
//! A worker thread owns one [`Responder`], created once with its capacity; after that nothing on
//! the batch path allocates. Per batch the worker:
//!
//! 1. reads its snapshot of the control plane's state once (time, radius, current
//!    [`Delegation`]) into [`BatchParams`] and calls [`Responder::begin`];
//! 2. [`Batch::add`]s each received datagram, keeping the `Result<Ticket, DropReason>` (both
//!    `Copy`) in an array beside its buffers; a drop is counted under [`DropReason::index`];
//! 3. calls [`Batch::sign`]: one Merkle tree and one Ed25519 signature per version family present
//!    in the batch (see [`Family`]);
//! 4. for every ticket, [`SignedBatch::write_reply`] into its send buffer, which can never
//!    produce more bytes than the request had.
//!
//! [`Responder::respond`] does all four for a slice of [`Exchange`]s, for callers that do not
//! need the split.
//!
//! Whether to answer at all is the caller's decision: when the upstream clock is unsynchronised
//! the daemon does not call this module (it answers nothing rather than vouch for a time it
//! cannot stand behind), and it must pass a radius that bounds the error of `now_unix_us`.

use core::fmt;

use crate::codec::Writer;
use crate::error::{DecodeError, EncodeError};
use crate::grease::Grease;
use crate::keys::{CERT_LEN, Delegation, SIGNATURE_LEN};
use crate::layout::ReplyLayout;
use crate::merkle::MerkleTree;
use crate::message::write_header;
use crate::packet::{FRAME_HEADER_LEN, Framing, write_frame_header};
use crate::request::{REQUEST_LEN, Request};
use crate::tag::Tag;
use crate::version::{Family, LeafData, NUMBERED_VERSIONS, TimeFormat, Version, VersionSet};

/// Requests shorter than this (the whole datagram) are dropped (RFC 10049 §5.1).
pub const MIN_REQUEST_LEN: usize = REQUEST_LEN;

/// Most requests one batch can hold. With 256 leaves the longest reply (Google's, with 64-byte
/// hashes) is 872 bytes, under [`MIN_REQUEST_LEN`], so no accepted request is ever too short
/// for its reply.
pub const MAX_BATCH_SIZE: usize = 256;

/// Least RADI, in seconds, sent to IETF clients: draft 11 requires 3 and RFC 10049 §5.2.5 asks
/// for it from servers without leap-second information, which this crate does not have.
pub(crate) const MIN_RADIUS_S: u32 = 3;

/// Why a request got no reply. Every variant is a counter: [`index`](Self::index) is dense and
/// [`label`](Self::label) names it in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// The datagram is shorter than [`MIN_REQUEST_LEN`].
    TooShort,
    /// The `ROUGHTIM` header's length disagrees with the datagram.
    BadFraming,
    /// The message breaks the encoding rules (offsets, tag order, lengths).
    Malformed,
    /// NONC is missing or has the wrong size for the version.
    BadNonce,
    /// A framed request has no usable VER (missing, empty, misaligned, over 32 entries).
    BadVersionList,
    /// No offered version is one this server has enabled.
    NoCommonVersion,
    /// An RFC 10049 request without TYPE.
    MissingType,
    /// TYPE is present and not 0: a response, or something else that is not a request.
    NotARequest,
    /// SRV names a long-term key this server does not have.
    UnknownServer,
    /// The batch already holds as many requests as the responder's capacity.
    BatchFull,
    /// The online key's certificate does not cover the current time.
    OutsideDelegation,
    /// The radius does not fit the version's RADI field; answering with a smaller one would be
    /// a lie.
    RadiusTooLarge,
    /// The reply would be longer than the request or than the reply buffer.
    ReplyTooLarge,
    /// The ticket belongs to an earlier batch (a caller bug, counted rather than panicking).
    StaleTicket,
}

impl DropReason {
    /// Every reason, in [`index`](Self::index) order.
    pub const ALL: [Self; 14] = [
        Self::TooShort,
        Self::BadFraming,
        Self::Malformed,
        Self::BadNonce,
        Self::BadVersionList,
        Self::NoCommonVersion,
        Self::MissingType,
        Self::NotARequest,
        Self::UnknownServer,
        Self::BatchFull,
        Self::OutsideDelegation,
        Self::RadiusTooLarge,
        Self::ReplyTooLarge,
        Self::StaleTicket,
    ];
    /// Number of reasons: the size of a per-thread counter array.
    pub const COUNT: usize = Self::ALL.len();

    /// A dense index in `0..COUNT`.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// A short label for metrics.
    pub const fn label(self) -> &'static str {
        match self {
            Self::TooShort => "too_short",
            Self::BadFraming => "bad_framing",
            Self::Malformed => "malformed",
            Self::BadNonce => "bad_nonce",
            Self::BadVersionList => "bad_version_list",
            Self::NoCommonVersion => "no_common_version",
            Self::MissingType => "missing_type",
            Self::NotARequest => "not_a_request",
            Self::UnknownServer => "unknown_server",
            Self::BatchFull => "batch_full",
            Self::OutsideDelegation => "outside_delegation",
            Self::RadiusTooLarge => "radius_too_large",
            Self::ReplyTooLarge => "reply_too_large",
            Self::StaleTicket => "stale_ticket",
        }
    }

    fn from_decode(err: DecodeError) -> Self {
        match err {
            DecodeError::ShortFrame { .. } | DecodeError::FrameLength { .. } => Self::BadFraming,
            DecodeError::MissingTag { tag: Tag::NONC } => Self::BadNonce,
            DecodeError::MissingTag { tag: Tag::VER } | DecodeError::BadList { .. } => {
                Self::BadVersionList
            }
            _ => Self::Malformed,
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// How a [`Responder`] is set up.
#[derive(Debug, Clone, Copy)]
pub struct ResponderConfig {
    /// Versions to answer. VERS lists the numbered ones, so a server restricted to 0x8000000c
    /// answers byte for byte like one that speaks only that version.
    pub versions: VersionSet,
    /// Most requests per batch, at most [`MAX_BATCH_SIZE`]; at least the worker's receive batch.
    pub capacity: usize,
}

impl Default for ResponderConfig {
    fn default() -> Self {
        Self {
            versions: VersionSet::ALL,
            capacity: 64,
        }
    }
}

/// What a batch is signed with: read once per batch from the control plane's snapshot.
#[derive(Debug, Clone, Copy)]
pub struct BatchParams<'a> {
    /// The time to serve, Unix microseconds (the caller's clock; this crate reads none). Read it
    /// after the batch was received: the signed time must not predate any request in it.
    pub now_unix_us: u64,
    /// A bound on the error of `now_unix_us`, in microseconds. Each version rounds the served
    /// interval outward so that it still contains the true time: IETF versions send MIDP as
    /// the nearest second and RADI = ⌈(radius + rounding) / 1 s⌉, at least 3 s;
    /// Google sends both in microseconds (RADI at least 1).
    pub radius_us: u64,
    /// The current online key and its certificates.
    pub delegation: &'a Delegation,
}

/// A request accepted into a batch; redeem it with [`SignedBatch::write_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    slot: u32,
    generation: u32,
    version: Version,
}

impl Ticket {
    /// The request's position among those accepted into its batch.
    pub fn slot(&self) -> usize {
        self.slot as usize
    }

    /// The version the reply will speak, e.g. for per-version counters.
    pub fn version(&self) -> Version {
        self.version
    }
}

/// What the responder remembers of an accepted request until its reply is written.
#[derive(Debug, Clone, Copy)]
struct Slot {
    version: Version,
    leaf: u32,
    request_len: usize,
    nonce: [u8; 64],
}

/// The signed part of one family's replies in the current batch.
#[derive(Debug, Clone, Copy)]
struct FamilySignature {
    /// `Err` when the family cannot be answered this batch (clock outside the delegation,
    /// radius too large); every reply of the family then reports it.
    status: Result<(), DropReason>,
    srep: [u8; MAX_SREP_LEN],
    srep_len: usize,
    signature: [u8; SIGNATURE_LEN],
}

/// Longest SREP: five tags, VER, RADI, MIDP, a VERS entry per numbered version and a 32-byte
/// ROOT; Google's three tags with a 64-byte ROOT are shorter.
const MAX_SREP_LEN: usize = 40 + 4 + 4 + 8 + NUMBERED_VERSIONS * 4 + 32;

/// A worker's signer: Merkle trees and per-request state, allocated once.
#[derive(Debug)]
pub struct Responder {
    versions: VersionSet,
    capacity: usize,
    /// VERS: the enabled numbered versions, ascending.
    vers: [u32; NUMBERED_VERSIONS],
    vers_len: usize,
    /// Trees for the 32-byte-hash families, indexed by `Family::index() - 1`, each with its
    /// family's hash.
    trees: [MerkleTree<32>; Family::COUNT - 1],
    /// Google's tree, with 64-byte hashes.
    google_tree: MerkleTree<64>,
    slots: Vec<Slot>,
    used: usize,
    generation: u32,
    signatures: [FamilySignature; Family::COUNT],
    /// Requests come over a stream (TCP): see [`over_stream`](Self::over_stream).
    stream: bool,
}

impl Responder {
    /// A responder for batches of up to `config.capacity` (clamped to 1..=[`MAX_BATCH_SIZE`])
    /// requests. All memory is allocated here.
    pub fn new(config: ResponderConfig) -> Self {
        let capacity = config.capacity.clamp(1, MAX_BATCH_SIZE);
        let mut vers = [0; NUMBERED_VERSIONS];
        let vers_len = config.versions.numbers_ascending(&mut vers);
        let empty_slot = Slot {
            version: Version::Rfc10049,
            leaf: 0,
            request_len: 0,
            nonce: [0; 64],
        };
        let unsigned = FamilySignature {
            status: Err(DropReason::StaleTicket),
            srep: [0; MAX_SREP_LEN],
            srep_len: 0,
            signature: [0; SIGNATURE_LEN],
        };
        Self {
            versions: config.versions,
            capacity,
            vers,
            vers_len,
            trees: core::array::from_fn(|i| {
                MerkleTree::with_capacity_and_hash(capacity, Family::ALL[i + 1].tree_hash())
            }),
            google_tree: MerkleTree::with_capacity(capacity),
            slots: vec![empty_slot; capacity],
            used: 0,
            generation: 0,
            signatures: [unsigned; Family::COUNT],
            stream: false,
        }
    }

    /// For requests that came over a stream (TCP, [`crate::FrameReader`]), where a reply cannot be
    /// used to amplify a forged source address: requests need not be padded to
    /// [`MIN_REQUEST_LEN`], and a reply may be longer than its request. Datagrams keep both
    /// rules.
    pub fn over_stream(mut self) -> Self {
        self.stream = true;
        self
    }

    /// The versions this responder answers.
    pub fn versions(&self) -> VersionSet {
        self.versions
    }

    /// Most requests per batch.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of PATH in this batch's replies of `family`.
    fn path_len(&self, family: Family) -> usize {
        match family {
            Family::Google => self.google_tree.path_len(),
            _ => self.trees[family.index() - 1].path_len(),
        }
    }

    /// Starts a batch signed with `params`. Tickets of earlier batches stop being valid.
    pub fn begin<'r>(&'r mut self, params: BatchParams<'r>) -> Batch<'r> {
        self.used = 0;
        self.generation = self.generation.wrapping_add(1);
        for tree in &mut self.trees {
            tree.clear();
        }
        self.google_tree.clear();
        Batch {
            responder: self,
            params,
        }
    }

    /// Answers a whole batch in one call: each exchange's reply buffer receives its reply and its
    /// outcome is set. Replies are capped at the request's length whatever the buffer's size.
    pub fn respond(&mut self, params: BatchParams<'_>, exchanges: &mut [Exchange<'_>]) {
        let mut batch = self.begin(params);
        for exchange in exchanges.iter_mut() {
            exchange.ticket = batch.add(exchange.request);
            exchange.outcome = None;
        }
        let signed = batch.sign();
        for exchange in exchanges.iter_mut() {
            exchange.outcome = Some(match exchange.ticket {
                Ok(ticket) => signed.write_reply(ticket, exchange.reply),
                Err(reason) => Err(reason),
            });
        }
    }

    fn tree_for(&mut self, family: Family) -> Option<&mut MerkleTree<32>> {
        self.trees.get_mut(family.index().checked_sub(1)?)
    }
}

/// One request and the buffer for its reply, for [`Responder::respond`].
#[derive(Debug)]
pub struct Exchange<'a> {
    /// The request datagram.
    pub request: &'a [u8],
    /// Where the reply goes; only its first `outcome` bytes are the reply.
    pub reply: &'a mut [u8],
    ticket: Result<Ticket, DropReason>,
    outcome: Option<Result<usize, DropReason>>,
}

impl<'a> Exchange<'a> {
    /// Pairs a request with a reply buffer.
    pub fn new(request: &'a [u8], reply: &'a mut [u8]) -> Self {
        Self {
            request,
            reply,
            ticket: Err(DropReason::StaleTicket),
            outcome: None,
        }
    }

    /// After [`Responder::respond`]: the reply's length, or why there is none. `None` before.
    pub fn outcome(&self) -> Option<Result<usize, DropReason>> {
        self.outcome
    }

    /// The reply, if one was written.
    pub fn reply_bytes(&self) -> Option<&[u8]> {
        match self.outcome {
            Some(Ok(len)) => self.reply.get(..len),
            _ => None,
        }
    }
}

/// A batch being filled; see the module documentation for the sequence.
#[derive(Debug)]
pub struct Batch<'r> {
    responder: &'r mut Responder,
    params: BatchParams<'r>,
}

impl<'r> Batch<'r> {
    /// Validates a request and adds it to its family's tree. The datagram is not kept: everything
    /// the reply needs is copied, and the leaf's input is staged for hashing with seven others.
    pub fn add(&mut self, datagram: &[u8]) -> Result<Ticket, DropReason> {
        if datagram.len() < MIN_REQUEST_LEN && !self.responder.stream {
            return Err(DropReason::TooShort);
        }
        let request = Request::parse(datagram).map_err(DropReason::from_decode)?;
        let r = &mut *self.responder;
        let version = match (request.framing, request.versions) {
            (Framing::Google, _) => Some(Version::Google).filter(|v| r.versions.contains(*v)),
            (Framing::Ietf, Some(offered)) => r.versions.best_of(offered),
            (Framing::Ietf, None) => return Err(DropReason::BadVersionList),
        }
        .ok_or(DropReason::NoCommonVersion)?;
        let family = version.family();
        if request.nonce.len() != family.nonce_len() {
            return Err(DropReason::BadNonce);
        }
        match request.type_value {
            Some(0) => {}
            Some(_) => return Err(DropReason::NotARequest),
            // Required from draft 14 on; 0x8000000c also covers drafts 12 and 13, whose clients
            // send none, so only version 1 insists.
            None if version == Version::Rfc10049 => return Err(DropReason::MissingType),
            None => {}
        }
        // SRV is only read from framed requests. Drafts 08 and 09 predate it, but a client that
        // names a key expects that key whatever version it ends up with.
        if request
            .srv
            .is_some_and(|srv| srv != self.params.delegation.srv())
        {
            return Err(DropReason::UnknownServer);
        }
        if r.used >= r.capacity {
            return Err(DropReason::BatchFull);
        }
        let leaf_data = match family.leaf_data() {
            LeafData::Nonce => request.nonce,
            LeafData::Packet => request.packet,
        };
        let leaf = match family {
            Family::Google => r.google_tree.push(leaf_data),
            _ => r.tree_for(family).and_then(|t| t.push(leaf_data)),
        }
        .ok_or(DropReason::BatchFull)?;
        let mut nonce = [0u8; 64];
        nonce[..request.nonce.len()].copy_from_slice(request.nonce);
        let slot = r.used;
        r.slots[slot] = Slot {
            version,
            leaf,
            request_len: datagram.len(),
            nonce,
        };
        r.used += 1;
        Ok(Ticket {
            slot: slot as u32,
            generation: r.generation,
            version,
        })
    }

    /// Requests accepted so far.
    pub fn len(&self) -> usize {
        self.responder.used
    }

    /// True if no request has been accepted.
    pub fn is_empty(&self) -> bool {
        self.responder.used == 0
    }

    /// Builds each present family's tree and signs its SREP: one signature per family, however
    /// many requests it holds.
    pub fn sign(self) -> SignedBatch<'r> {
        let Batch { responder, params } = self;
        for family in Family::ALL {
            let root = match family {
                Family::Google => responder.google_tree.build().map(Root::Google),
                _ => responder
                    .tree_for(family)
                    .and_then(MerkleTree::build)
                    .map(Root::Short),
            };
            let Some(root) = root else {
                continue;
            };
            let signature = &mut responder.signatures[family.index()];
            signature.status = sign_family(
                family,
                &params,
                &root,
                &responder.vers[..responder.vers_len],
                signature,
            );
        }
        SignedBatch { responder, params }
    }
}

/// A tree root of either size.
enum Root {
    Short([u8; 32]),
    Google([u8; 64]),
}

impl Root {
    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Short(r) => r,
            Self::Google(r) => r,
        }
    }
}

/// MIDP and RADI as `family` sends them, or why the time cannot be served.
fn served_time(family: Family, params: &BatchParams<'_>) -> Result<(u64, u32), DropReason> {
    let d = params.delegation;
    let format = family.time_format();
    match format {
        // Google and draft 07 count microseconds.
        TimeFormat::UnixMicros | TimeFormat::MjdMicros => {
            let (mint, maxt) = (
                d.mint_unix_s().saturating_mul(1_000_000),
                d.maxt_unix_s().saturating_mul(1_000_000),
            );
            if !(mint..=maxt).contains(&params.now_unix_us) {
                return Err(DropReason::OutsideDelegation);
            }
            let radius =
                u32::try_from(params.radius_us.max(1)).map_err(|_| DropReason::RadiusTooLarge)?;
            Ok((format.encode(params.now_unix_us), radius))
        }
        TimeFormat::UnixSeconds => {
            let midp = params.now_unix_us.saturating_add(500_000) / 1_000_000;
            if !d.covers(midp) {
                return Err(DropReason::OutsideDelegation);
            }
            let rounding = params.now_unix_us.abs_diff(midp.saturating_mul(1_000_000));
            let radius = params
                .radius_us
                .saturating_add(rounding)
                .div_ceil(1_000_000);
            let radius = u32::try_from(radius).map_err(|_| DropReason::RadiusTooLarge)?;
            Ok((midp, radius.max(MIN_RADIUS_S)))
        }
    }
}

fn sign_family(
    family: Family,
    params: &BatchParams<'_>,
    root: &Root,
    vers: &[u32],
    out: &mut FamilySignature,
) -> Result<(), DropReason> {
    let (midp, radi) = served_time(family, params)?;
    let mut w = Writer::new(&mut out.srep);
    // The SREP buffer is sized for the largest SREP; failing here would be a bug in that sizing,
    // reported as a drop of the family rather than a panic.
    encode_srep(&mut w, family, midp, radi, vers, root.as_bytes())
        .map_err(|_| DropReason::ReplyTooLarge)?;
    out.srep_len = w.position();
    out.signature = params
        .delegation
        .sign_srep(family, &out.srep[..out.srep_len]);
    Ok(())
}

fn encode_srep(
    w: &mut Writer<'_>,
    family: Family,
    midp: u64,
    radi: u32,
    vers: &[u32],
    root: &[u8],
) -> Result<(), EncodeError> {
    if family.signs_version() {
        let version = match family {
            Family::Rfc => Version::Rfc10049,
            _ => Version::Draft12,
        };
        write_header(
            w,
            &[
                (Tag::VER, 4),
                (Tag::RADI, 4),
                (Tag::MIDP, 8),
                (Tag::VERS, 4 * vers.len()),
                (Tag::ROOT, root.len()),
            ],
        )?;
        w.put_u32(version.number().unwrap_or(0))?;
        w.put_u32(radi)?;
        w.put_u64(midp)?;
        for v in vers {
            w.put_u32(*v)?;
        }
    } else {
        write_header(
            w,
            &[(Tag::RADI, 4), (Tag::MIDP, 8), (Tag::ROOT, root.len())],
        )?;
        w.put_u32(radi)?;
        w.put_u64(midp)?;
    }
    w.put(root)?;
    Ok(())
}

/// A signed batch: write each accepted request's reply.
#[derive(Debug)]
pub struct SignedBatch<'r> {
    responder: &'r mut Responder,
    params: BatchParams<'r>,
}

impl SignedBatch<'_> {
    /// Writes the reply for `ticket` into `out` and returns its length. The reply is never
    /// longer than the request it answers, nor than `out`.
    pub fn write_reply(&self, ticket: Ticket, out: &mut [u8]) -> Result<usize, DropReason> {
        let r = &*self.responder;
        if ticket.generation != r.generation || ticket.slot() >= r.used {
            return Err(DropReason::StaleTicket);
        }
        let slot = &r.slots[ticket.slot()];
        let family = slot.version.family();
        let signed = &r.signatures[family.index()];
        signed.status?;
        let path_len = r.path_len(family);
        let len = reply_len(family, path_len, signed.srep_len);
        let limit = if r.stream {
            out.len()
        } else {
            out.len().min(slot.request_len)
        };
        let out = out.get_mut(..len).filter(|_| len <= limit);
        let out = out.ok_or(DropReason::ReplyTooLarge)?;
        let srep = &signed.srep[..signed.srep_len];
        let cert = self.params.delegation.certificate(family).as_bytes();
        encode_reply(
            r,
            slot,
            family,
            path_len,
            &signed.signature,
            srep,
            cert,
            out,
        )
        .map_err(|_| DropReason::ReplyTooLarge)?;
        Ok(len)
    }

    /// Writes the reply for `ticket` as [`write_reply`](Self::write_reply) does, then breaks it
    /// the way `grease` says: a reply every client must reject, no longer than the true one. For
    /// servers that send a small share of these so that clients are seen to check (see
    /// [`Grease`]); never a wrong time under a valid signature.
    pub fn write_greased_reply(
        &self,
        ticket: Ticket,
        out: &mut [u8],
        grease: Grease,
    ) -> Result<usize, DropReason> {
        let len = self.write_reply(ticket, out)?;
        let r = &*self.responder;
        let family = ticket.version.family();
        let srep_len = r.signatures[family.index()].srep_len;
        let layout = ReplyLayout::new(family, r.path_len(family), srep_len);
        grease.apply(&mut out[..len], &layout, family.hash_len());
        Ok(len)
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.responder.used
    }

    /// True if the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.responder.used == 0
    }
}

/// Bytes of a reply of `family` with a path of `path_len` bytes and an SREP of `srep_len`.
pub(crate) const fn reply_len(family: Family, path_len: usize, srep_len: usize) -> usize {
    ReplyLayout::new(family, path_len, srep_len).len
}

#[allow(clippy::too_many_arguments)]
fn encode_reply(
    r: &Responder,
    slot: &Slot,
    family: Family,
    path_len: usize,
    signature: &[u8; SIGNATURE_LEN],
    srep: &[u8],
    cert: &[u8; CERT_LEN],
    out: &mut [u8],
) -> Result<(), EncodeError> {
    let total = out.len();
    let mut w = Writer::new(out);
    let nonce = &slot.nonce[..family.nonce_len()];
    match family {
        Family::Google => write_header(
            &mut w,
            &[
                (Tag::SIG, SIGNATURE_LEN),
                (Tag::PATH, path_len),
                (Tag::SREP, srep.len()),
                (Tag::CERT, CERT_LEN),
                (Tag::INDX, 4),
            ],
        )?,
        Family::Draft07 | Family::Draft08 => {
            write_frame_header(&mut w, total - FRAME_HEADER_LEN)?;
            write_header(
                &mut w,
                &[
                    (Tag::SIG, SIGNATURE_LEN),
                    (Tag::VER, 4),
                    (Tag::NONC, nonce.len()),
                    (Tag::PATH, path_len),
                    (Tag::SREP, srep.len()),
                    (Tag::CERT, CERT_LEN),
                    (Tag::INDX, 4),
                ],
            )?;
        }
        Family::Draft12 | Family::Rfc => {
            write_frame_header(&mut w, total - FRAME_HEADER_LEN)?;
            write_header(
                &mut w,
                &[
                    (Tag::SIG, SIGNATURE_LEN),
                    (Tag::NONC, nonce.len()),
                    (Tag::TYPE, 4),
                    (Tag::PATH, path_len),
                    (Tag::SREP, srep.len()),
                    (Tag::CERT, CERT_LEN),
                    (Tag::INDX, 4),
                ],
            )?;
        }
    }
    w.put(signature)?;
    match family {
        Family::Google => {}
        Family::Draft07 | Family::Draft08 => {
            w.put_u32(slot.version.number().unwrap_or(0))?;
            w.put(nonce)?;
        }
        Family::Draft12 | Family::Rfc => {
            w.put(nonce)?;
            w.put_u32(1)?;
        }
    }
    let path = w.slot(path_len)?;
    let written = match family {
        Family::Google => r.google_tree.write_path(slot.leaf, path),
        _ => r.trees[family.index() - 1].write_path(slot.leaf, path),
    };
    debug_assert_eq!(written, Some(path_len));
    w.put(srep)?;
    w.put(cert)?;
    w.put_u32(slot.leaf)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{LongTermKey, OnlineKey};
    use crate::message::header_len;
    use crate::request::build_request;

    const NOW_S: u64 = 1_795_285_217;

    fn delegation() -> Delegation {
        LongTermKey::from_seed(&[1; 32])
            .delegate(OnlineKey::from_seed(&[2; 32]), NOW_S - 3600, NOW_S + 3600)
            .unwrap()
    }

    fn params(d: &Delegation) -> BatchParams<'_> {
        BatchParams {
            now_unix_us: NOW_S * 1_000_000,
            radius_us: 1_000_000,
            delegation: d,
        }
    }

    fn request(versions: &[Version]) -> Vec<u8> {
        let mut out = vec![0u8; REQUEST_LEN];
        let nonce = vec![5u8; versions[0].family().nonce_len()];
        build_request(&mut out, versions, &nonce, None).unwrap();
        out
    }

    #[test]
    fn labels_are_dense_and_unique() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert!(
                DropReason::ALL[..i]
                    .iter()
                    .all(|other| other.label() != r.label())
            );
        }
    }

    /// An RFC 10049 request with no padding: the header and VER, NONC and TYPE alone.
    fn unpadded_request() -> Vec<u8> {
        let mut message = [0u8; 128];
        let len = crate::message::encode(
            &mut message,
            &[
                (Tag::VER, &1u32.to_le_bytes()),
                (Tag::NONC, &[6; 32]),
                (Tag::TYPE, &0u32.to_le_bytes()),
            ],
        )
        .unwrap();
        let mut packet = crate::packet::MAGIC.to_vec();
        packet.extend_from_slice(&(len as u32).to_le_bytes());
        packet.extend_from_slice(&message[..len]);
        packet
    }

    /// Over a stream there is nothing to amplify: an unpadded request is answered, with a reply
    /// longer than itself that verifies. As a datagram the same request is too short.
    #[test]
    fn over_a_stream_requests_need_no_padding() {
        let d = delegation();
        let request = unpadded_request();
        let mut datagrams = Responder::new(ResponderConfig::default());
        let mut batch = datagrams.begin(params(&d));
        assert_eq!(batch.add(&request), Err(DropReason::TooShort));

        let mut stream = Responder::new(ResponderConfig::default()).over_stream();
        let mut batch = stream.begin(params(&d));
        let ticket = batch.add(&request).unwrap();
        let signed = batch.sign();
        let mut reply = [0u8; 1024];
        let len = signed.write_reply(ticket, &mut reply).unwrap();
        assert!(len > request.len(), "{len} bytes for {}", request.len());
        let key = LongTermKey::from_seed(&[1; 32]).public_key();
        let policy = crate::client::VerifyPolicy::new(10_000_000);
        let v = crate::client::verify_reply(&request, &reply[..len], &key, &policy).unwrap();
        assert_eq!(v.midpoint_unix_us / 1_000_000, NOW_S);
    }

    #[test]
    fn longest_reply_fits_the_shortest_request() {
        for family in Family::ALL {
            let path = family.hash_len() * MAX_BATCH_SIZE.ilog2() as usize;
            let srep = match family {
                Family::Google => header_len(3) + 4 + 8 + 64,
                Family::Draft07 | Family::Draft08 => header_len(3) + 4 + 8 + 32,
                _ => MAX_SREP_LEN,
            };
            assert!(
                reply_len(family, path, srep) <= MIN_REQUEST_LEN,
                "{family:?}"
            );
        }
        assert_eq!(reply_len(Family::Google, 8 * 64, 100), 872);
    }

    #[test]
    fn drops_are_classified() {
        let d = delegation();
        let mut responder = Responder::new(ResponderConfig::default());
        let mut batch = responder.begin(params(&d));
        assert_eq!(batch.add(&[0; 100]), Err(DropReason::TooShort));

        let mut framed = request(&[Version::Rfc10049]);
        framed[8] ^= 4; // length field
        assert_eq!(batch.add(&framed), Err(DropReason::BadFraming));

        let mut misordered = request(&[Version::Rfc10049]);
        // The second tag (NONC) of VER, NONC, TYPE, ZZZZ becomes ZZZZ.
        misordered[32..36].copy_from_slice(&Tag::ZZZZ.to_bytes());
        assert_eq!(batch.add(&misordered), Err(DropReason::Malformed));

        let roughly: Vec<u8> = {
            let mut r = request(&[Version::Rfc10049]);
            // VER is the first value, right after a 5-tag header.
            let ver = 12 + header_len(4);
            r[ver..ver + 4].copy_from_slice(&0x8000_000du32.to_le_bytes());
            r
        };
        assert_eq!(batch.add(&roughly), Err(DropReason::NoCommonVersion));

        let mut wrong_type = request(&[Version::Rfc10049]);
        // Values VER(4) NONC(32) then TYPE, after the 4-tag header.
        let type_at = 12 + header_len(4) + 36;
        wrong_type[type_at..type_at + 4].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(batch.add(&wrong_type), Err(DropReason::NotARequest));

        let mut srv = vec![0u8; REQUEST_LEN];
        build_request(&mut srv, &[Version::Rfc10049], &[0; 32], Some(&[0xee; 32])).unwrap();
        assert_eq!(batch.add(&srv), Err(DropReason::UnknownServer));

        let google = request(&[Version::Google]);
        assert!(batch.add(&google).is_ok());
        assert_eq!(batch.len(), 1);
    }

    #[test]
    fn rfc_requires_type_but_draft12_does_not() {
        let d = delegation();
        let mut responder = Responder::new(ResponderConfig::default());
        for (version, expect_ok) in [(Version::Rfc10049, false), (Version::Draft12, true)] {
            // A request without TYPE, built the way a draft 12/13 client would.
            let mut out = [0u8; REQUEST_LEN];
            let mut w = Writer::new(&mut out);
            let pad = REQUEST_LEN - 12 - header_len(3) - 36;
            write_frame_header(&mut w, REQUEST_LEN - 12).unwrap();
            write_header(&mut w, &[(Tag::VER, 4), (Tag::NONC, 32), (Tag::ZZZZ, pad)]).unwrap();
            w.put_u32(version.number().unwrap()).unwrap();
            w.put(&[3; 32]).unwrap();
            w.put_zeros(pad).unwrap();
            let mut batch = responder.begin(params(&d));
            assert_eq!(
                batch.add(&out).is_ok(),
                expect_ok,
                "{version}: {:?}",
                batch.add(&out)
            );
        }
    }

    #[test]
    fn disabled_versions_are_not_answered() {
        let d = delegation();
        let config = ResponderConfig {
            versions: VersionSet::ALL.without(Version::Google),
            capacity: 4,
        };
        let mut responder = Responder::new(config);
        let mut batch = responder.begin(params(&d));
        assert_eq!(
            batch.add(&request(&[Version::Google])),
            Err(DropReason::NoCommonVersion)
        );
    }

    #[test]
    fn capacity_and_stale_tickets() {
        let d = delegation();
        let mut responder = Responder::new(ResponderConfig {
            versions: VersionSet::ALL,
            capacity: 2,
        });
        let req = request(&[Version::Rfc10049]);
        let old = {
            let mut batch = responder.begin(params(&d));
            let t = batch.add(&req).unwrap();
            batch.add(&req).unwrap();
            assert_eq!(batch.add(&req), Err(DropReason::BatchFull));
            t
        };
        let mut batch = responder.begin(params(&d));
        let fresh = batch.add(&req).unwrap();
        let signed = batch.sign();
        let mut out = [0u8; 1024];
        assert_eq!(
            signed.write_reply(old, &mut out),
            Err(DropReason::StaleTicket)
        );
        assert!(signed.write_reply(fresh, &mut out).is_ok());
        assert_eq!(
            signed.write_reply(fresh, &mut out[..100]),
            Err(DropReason::ReplyTooLarge)
        );
    }

    #[test]
    fn time_outside_the_delegation_is_not_signed() {
        let d = delegation();
        let mut responder = Responder::new(ResponderConfig::default());
        let req = [request(&[Version::Rfc10049]), request(&[Version::Google])];
        for now_s in [NOW_S - 3601, NOW_S + 3601] {
            let mut p = params(&d);
            p.now_unix_us = now_s * 1_000_000;
            let mut batch = responder.begin(p);
            let tickets: Vec<_> = req.iter().map(|r| batch.add(r).unwrap()).collect();
            let signed = batch.sign();
            for t in tickets {
                let mut out = [0u8; 1024];
                assert_eq!(
                    signed.write_reply(t, &mut out),
                    Err(DropReason::OutsideDelegation)
                );
            }
        }
    }

    #[test]
    fn served_time_rounds_outward() {
        let d = delegation();
        let mut p = params(&d);
        p.now_unix_us = NOW_S * 1_000_000 + 600_000;
        p.radius_us = 2_500_000;
        // Nearest second is NOW_S + 1, 0.4 s away; 2.5 + 0.4 rounds up to 3.
        assert_eq!(served_time(Family::Rfc, &p), Ok((NOW_S + 1, 3)));
        p.radius_us = 7_000_000;
        assert_eq!(served_time(Family::Rfc, &p), Ok((NOW_S + 1, 8)));
        p.radius_us = 0;
        assert_eq!(
            served_time(Family::Draft08, &p),
            Ok((NOW_S + 1, MIN_RADIUS_S))
        );
        assert_eq!(
            served_time(Family::Google, &p),
            Ok((NOW_S * 1_000_000 + 600_000, 1))
        );
        p.radius_us = u64::from(u32::MAX) + 1;
        assert_eq!(
            served_time(Family::Google, &p),
            Err(DropReason::RadiusTooLarge)
        );
        p.radius_us = u64::MAX;
        assert_eq!(
            served_time(Family::Rfc, &p),
            Err(DropReason::RadiusTooLarge)
        );
    }
}
