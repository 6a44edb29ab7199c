//! Sans-IO Roughtime: the wire format, every deployed protocol version, batch signing over a
//! Merkle tree, online-key delegation, and client-side verification and chaining.
//!
//! Nothing here opens a socket, spawns a thread, reads a clock or a random source, or touches the
//! filesystem: time, randomness (nonces, `rand` blinds, key seeds) and keys come in as arguments,
//! and outputs are values or bytes written into buffers the caller owns.
//!
//! # Versions
//!
//! RFC 10049 (version 1), 0x8000000c (drafts 12–19), drafts 08–11, draft 07 and Google's
//! original, chosen per request as the best the client offers and the server has enabled; see
//! [`Version`] for what differs between them.
//!
//! # Server
//!
//! A worker thread owns a [`Responder`]. Per received batch it builds [`BatchParams`] from its
//! snapshot of the control plane (time in Unix microseconds, error bound, the current
//! [`Delegation`]), then [`Responder::begin`] → [`Batch::add`] each datagram → [`Batch::sign`] →
//! [`SignedBatch::write_reply`] per accepted request. A drop is a [`DropReason`] with a dense
//! index for counters. No allocation happens after [`Responder::new`], and no reply is longer
//! than its request. [`SignedBatch::write_greased_reply`] writes a deliberately invalid reply
//! instead ([`Grease`]), for servers that test their clients.
//!
//! The control plane holds the [`LongTermKey`] and rotates online keys by calling
//! [`LongTermKey::delegate`] with a fresh [`OnlineKey`] seed; the resulting [`Delegation`]
//! carries every certificate pre-encoded and is what workers sign with. When the upstream clock
//! is unsynchronised, the daemon simply does not call the responder.
//!
//! # Client
//!
//! [`build_request`] writes a request for any versions; [`verify_reply`] checks a reply fully;
//! [`next_nonce`] chains requests and [`verify_chain`] checks a chain and reports servers that
//! contradict each other.
//!
//! For a measurement across several servers (RFC 10049 §8): [`ServerList::parse`] reads a server
//! list, [`choose`] picks servers from it at random, a [`Chain`] says whom to ask next with which
//! request and carries on past servers that do not answer, and [`accusations`] names the servers
//! behind each contradiction [`verify_chain`] finds.
//!
//! # Modules
//!
//! Everything above is at this root. Two parts are modules of their own: [`merkle`], the batch's
//! tree, its paths and the hash each version builds it with, for a client that checks a path on
//! its own; and, with the `mldsa` feature, `mldsa`, the experimental post-quantum suite.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bundle;
mod chain;
mod client;
mod codec;
mod ecosystem;
mod error;
mod grease;
mod keyfile;
mod keys;
mod layout;
pub mod merkle;
mod message;
#[cfg(feature = "mldsa")]
pub mod mldsa;
mod packet;
mod request;
mod response;
mod server;
mod stream;
mod tag;
mod version;

pub use bundle::{Bundle, BundleError, BundlePlan, make_bundle};
pub use chain::{
    ChainError, ChainReport, Contradiction, Link, contradictions, next_nonce, verify_chain,
};
pub use chime_keyfile::KeyFileError;
pub use client::{DraftSpelling, Signed, Verified, VerifyError, VerifyPolicy, verify_reply};
pub use ecosystem::{
    Accusation, Chain, Failure, FailureReason, ListError, ListedServer, ListedVersion, MIN_SERVERS,
    Plan, Query, ServerAddress, ServerList, ServerRef, Transport, accusations, choose, suspects,
};
pub use error::{DecodeError, EncodeError};
pub use grease::Grease;
pub use keyfile::{encode_key_file, parse_key_file};
pub use keys::{Certificate, Delegation, DelegationError, LongTermKey, OnlineKey, srv_value};
pub use request::{BuildError, REQUEST_LEN, Request, build_request};
pub use response::Reply;
pub use server::{
    Batch, BatchParams, DropReason, Exchange, MAX_BATCH_SIZE, MIN_REQUEST_LEN, Responder,
    ResponderConfig, SignedBatch, Ticket,
};
pub use stream::{FrameError, FrameReader};
pub use tag::Tag;
pub use version::{ContextSpelling, Family, Version, VersionSet};
