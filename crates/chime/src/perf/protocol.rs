//! The one thing the load generator needs from a request/reply protocol: write a request that
//! carries an id, and find that id again in a reply and judge the reply; and the judgement every
//! transport hands the engine.
//!
//! Everything else is the same for every protocol: the sockets or connections are the
//! transport's (`transport`), the pacing, the matching of ids to send times and the counting the
//! engine's (`worker`). NTP carries the id in the transmit timestamp, which the server echoes as
//! the origin timestamp; NTS in the unique identifier too; Roughtime in the nonce.

/// A protocol `chime perf` can load a server with.
///
/// Each sending thread owns its own clone, so an implementation may keep per-thread state behind
/// `&mut self` (scratch buffers, or a counter that picks which replies get an expensive check such
/// as a Roughtime signature verification) without locks.
pub(crate) trait LoadProtocol: Clone + Send + 'static {
    /// The protocol's name in reports.
    const NAME: &'static str;

    /// The room a request needs, in bytes.
    fn max_request_len(&self) -> usize;

    /// The room to receive a reply into, in bytes; a longer reply is cut short and judged on the
    /// bytes that fit.
    fn max_reply_len(&self) -> usize;

    /// Writes the request that carries `id` into `buf` (at least [`Self::max_request_len`] bytes)
    /// and returns its length. Ids are unique within a run and never zero.
    fn fill_request(&mut self, id: u64, buf: &mut [u8]) -> usize;

    /// Finds which request `reply` answers and judges it. `received_unix_secs` is when it arrived,
    /// for protocols whose timestamps need an era chosen.
    fn match_reply(&mut self, reply: &[u8], received_unix_secs: i64) -> ReplyMatch;
}

/// What a reply says about the request it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReplyMatch {
    /// Unparsable, or nothing in it can name one of our requests: counted invalid.
    Unmatched,
    /// It names request `id` (which the worker still checks is one it sent).
    Matched {
        id: u64,
        verdict: Verdict,
        /// The server's own timestamps, when the protocol carries them and they are set.
        server: Option<ServerTimes>,
        /// For a signed protocol (Roughtime), what the reply shows of its signature and batch.
        signed: Option<Signed>,
    },
}

impl ReplyMatch {
    /// The request named and the verdict, an unmatched reply as request 0 judged invalid: what the
    /// protocols' tests compare.
    #[cfg(test)]
    pub(crate) fn id_and_verdict(self) -> (u64, Verdict) {
        match self {
            Self::Matched { id, verdict, .. } => (id, verdict),
            Self::Unmatched => (0, Verdict::Invalid),
        }
    }
}

/// The judgement of a reply that names one of our requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A well-formed answer: the request is answered.
    Valid,
    /// A well-formed refusal, such as an NTP kiss-o'-death (RATE, DENY): the server is shedding
    /// or refusing load. Counted apart; the request is not answered.
    Refused,
    /// Wrong in a way a client would reject (mode, version, missing timestamps, bad signature).
    Invalid,
    /// An exchange the transport ran itself failed, in the way named (an NTS-KE session: `tls`,
    /// `refused`, `timeout`, ...). Counted by kind; the request is not answered.
    Failed(&'static str),
}

/// What a signed reply shows: whether it was checked in full, and how wide a tree it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signed {
    /// Its signatures and Merkle path were verified (only a sample is, `--verify-every`).
    pub(crate) verified: bool,
    /// Hashes in its Merkle path: the batch it was signed in had at most 2^n requests, and more
    /// than 2^(n−1) in a tree as full as the RFC's.
    pub(crate) path_len: u8,
}

/// When the server says it received the request and sent the reply, in nanoseconds since the Unix
/// epoch on the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServerTimes {
    pub(crate) receive_ns: i64,
    pub(crate) transmit_ns: i64,
}
