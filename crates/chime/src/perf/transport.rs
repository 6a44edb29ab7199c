//! The one thing the engine needs from a way of reaching a server: send requests that carry ids,
//! and hand back what came of them.
//!
//! The engine (the worker's event loop) owns the schedule, the in-flight table and the counting;
//! a transport owns the I/O. Three plug in: datagrams (`udp`: NTP, NTS and Roughtime over UDP),
//! streams (`tcp`: Roughtime over TCP), both carrying any [`LoadProtocol`]'s requests and finding
//! the id in each reply with it; and NTS-KE sessions (`ke`), which run whole on helper threads and
//! report each session's end under its id.
//!
//! [`LoadProtocol`]: super::protocol::LoadProtocol

use std::time::Instant;

use super::protocol::ReplyMatch;

/// How one sending thread's requests reach the server and what comes back reaches the engine.
pub(crate) trait Transport {
    /// The transport ends every request itself, a timeout included, and says when each one began
    /// and how long it queued first ([`Reply::began`]): NTS-KE sessions, which wait for a free
    /// client thread. Its ends count whenever they arrive while their step is measured, and the
    /// step waits up to a second timeout for them.
    const ENDS_ITSELF: bool = false;

    /// Sends the requests, in order, now. T1 is the transport's to read, as close to the
    /// requests leaving as it can.
    fn send(&mut self, requests: &[Request]) -> Sent;

    /// Waits up to `wait` for anything to arrive, then hands every reply that has, and every
    /// error met, to `on`.
    fn poll(&mut self, wait: std::time::Duration, on: &mut impl FnMut(Event));
}

/// A request the schedule has made due.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    /// Unique within the run and never zero.
    pub(crate) id: u64,
    /// When the schedule wanted it sent.
    pub(crate) due: Instant,
}

/// What became of one [`Transport::send`].
#[derive(Debug, Default)]
pub(crate) struct Sent {
    /// Requests that went out (or, for a transport that queues, were queued).
    pub(crate) sent: u64,
    /// Requests that could not be sent, and other send errors.
    pub(crate) errors: u64,
    /// The first error, to report once.
    pub(crate) error: Option<String>,
    /// The realtime clock just before the first request left and when the send returned, in
    /// nanoseconds since the Unix epoch: T1 of the first request, and the span the others are
    /// placed in (see `InFlight::commit`).
    pub(crate) t1_ns: (i64, i64),
}

/// What a transport hands the engine.
#[derive(Debug)]
pub(crate) enum Event {
    Reply(Reply),
    /// A receive or connection error, counted once each and reported once a step.
    Error(String),
}

/// A reply, or the end of an exchange, and what it says of the request it answers.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) matched: ReplyMatch,
    /// When it arrived (T4), nanoseconds since the Unix epoch.
    pub(crate) t4_ns: i64,
    /// For a transport that ends its requests itself: when the exchange began and how long it
    /// waited to, which stand in for T1 and the send lag.
    pub(crate) began: Option<Began>,
    /// Why it failed, for a failure the step reports once.
    pub(crate) why: Option<String>,
}

impl Reply {
    /// A reply as a request/reply transport hands it: matched, and when it came.
    pub(crate) fn arrived(matched: ReplyMatch, t4_ns: i64) -> Self {
        Self {
            matched,
            t4_ns,
            began: None,
            why: None,
        }
    }
}

/// When an exchange the transport ran itself began, and how long it queued first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Began {
    pub(crate) at_ns: i64,
    pub(crate) queued_ns: i64,
}

/// The realtime clock in nanoseconds since the Unix epoch: the clock the kernel stamps received
/// datagrams with and the server reads for T2 and T3.
pub(crate) fn realtime_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
