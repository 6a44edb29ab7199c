//! Sans-IO NTP for chime: the packet codec, the server's responder, and the logic that mirrors the
//! upstream chronyd's state.
//!
//! Nothing here opens a socket, reads a clock or spawns a thread; times come in as arguments and
//! replies are written into buffers the caller owns. The pipeline, driven by `chimed`:
//!
//! 1. The control plane polls chronyd with a [`Mirror`]: [`Mirror::request`] makes the bytes to
//!    send, [`Mirror::on_reply`] checks the answer and updates the [`ServerState`].
//!    Each poll's four timestamps are also a [`Sample`] of how far chronyd's served time is from
//!    the local clock; a [`Follower`] filters them into the state's [`ServedClock`].
//! 2. Once per batch a worker turns the latest state into a [`ServedHeader`] with
//!    [`ServerState::served_at`], which ages it (dispersion growth, the offset's error bound, then
//!    "unsynchronised" after the [`StalePolicy`]'s stale time), and reads the [`ServedClock`]
//!    that maps every local time it reads to chronyd's served time ([`ServedClock::serve`]).
//! 3. For each datagram the worker calls [`respond`] with the kernel's receive timestamp, served; a
//!    [`DropReason`] says why a datagram gets no reply, with a dense [`DropReason::index`] for
//!    counters. Just before sending, [`stamp_transmit`] writes the transmit timestamp.
//! 4. With rate limiting on, a [`ClientTable`] shared by the workers gives each request a
//!    [`Verdict`]; [`kiss_of_death`] and [`suggest_poll`] adjust the reply to match.
//! 5. For a request in interleaved mode ([`interleaved_origin`]), the worker takes the previous
//!    reply's transmit time from a shared [`TxLog`] into the reply ([`make_interleaved`]), and
//!    saves this reply's once it is known ([`reply_receive_timestamp`]).
//! 6. Every request, and what became of it ([`Fate`]), goes into a shared [`ClientLog`], from
//!    which the control plane reads the busiest [`Client`]s and how many [`Distinct`] clients
//!    were served in the last hour and day.
//!
//! The `chime ntp` client uses the same [`Header`] codec and [`NtpTimestamp`] conversions.
//!
//! Everything else is at this root but for two protocols, each a module of its own with its whole
//! API at its top: [`nts`], Network Time Security (NTS-KE's records, cookies, the server's checks
//! and replies, a pool member's answers, and a client's side), and [`v5`], the NTPv5 draft.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clients;
mod follow;
mod interleave;
mod leap;
mod mirror;
pub mod nts;
mod packet;
mod ratelimit;
mod responder;
mod state;
mod time;
mod timescale;
pub mod v5;

pub use clients::{Client, ClientLog, Distinct, Fate};
pub use follow::{Follower, Sample, ServedClock};
pub use interleave::{TxLog, interleaved_origin, make_interleaved, reply_receive_timestamp};
pub use leap::{Announced, LeapStep, Smear};
pub use mirror::{Mirror, MirrorError};
pub use packet::{ExtensionError, Header, Leap, Mode, ParseError, check_extensions};
pub use ratelimit::{ClientTable, Coin, RateLimit, RateLimitError, Verdict, address_hash};
pub use responder::{DropReason, kiss_of_death, respond, stamp_transmit, suggest_poll};
pub use state::{ServedHeader, ServerState, StalePolicy};
pub use time::{NtpShort, NtpTimestamp};
pub use timescale::ZoneShift;
