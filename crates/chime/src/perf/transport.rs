//! The one thing the engine needs from a way of reaching a server: send requests that carry ids,
//! and hand back what came of them.
//!
//! The engine (the worker's event loop) owns the schedule, the in-flight table and the counting;
//! a transport owns the I/O. Two plug in: datagrams (`udp`: NTP, NTS and Roughtime over UDP) and
//! streams (`tcp`: Roughtime over TCP), both carrying any [`LoadProtocol`]'s requests and finding
//! the id in each reply with it.
//!
//! [`LoadProtocol`]: super::protocol::LoadProtocol

use super::protocol::ReplyMatch;

/// How one sending thread's requests reach the server and what comes back reaches the engine.
pub(crate) trait Transport {
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
}

/// What became of one [`Transport::send`].
#[derive(Debug, Default)]
pub(crate) struct Sent {
    /// Requests that went out.
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

/// A reply, and what it says of the request it answers.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) matched: ReplyMatch,
    /// When it arrived (T4), nanoseconds since the Unix epoch.
    pub(crate) t4_ns: i64,
}

impl Reply {
    /// A reply as a request/reply transport hands it: matched, and when it came.
    pub(crate) fn arrived(matched: ReplyMatch, t4_ns: i64) -> Self {
        Self { matched, t4_ns }
    }
}

/// The realtime clock in nanoseconds since the Unix epoch: the clock the kernel stamps received
/// datagrams with and the server reads for T2 and T3.
pub(crate) fn realtime_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
