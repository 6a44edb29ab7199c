//! chime's shared UDP socket layer: batched `recvmmsg`/`sendmmsg` with kernel receive timestamps
//! and per-datagram source addresses, and the worker threads that drive a protocol handler over
//! them.
//!
//! This is the data plane of `chimed` over sockets, and with chime-xdp (the AF_XDP backend, which
//! serves the same [`BatchHandler`]s and builds on this crate's batches and its [`Threads`]) the
//! only crate of chime allowed `unsafe`. The pipeline for one worker thread:
//!
//! 1. [`UdpSocket::bind`] (via [`BoundWorkers::bind`]) binds one `SO_REUSEPORT` socket per thread
//!    and turns on receive timestamps and packet info where the kernel allows, recording what it
//!    got in [`Capabilities`].
//! 2. [`UdpSocket::recv_batch`] fills a preallocated [`RxBatch`] with one `recvmmsg`: payloads
//!    plus a [`RecvMeta`] each (sender, local address and interface, kernel [`Timestamp`]).
//! 3. A [`BatchHandler`] (the sans-IO NTP or Roughtime responder, adapted by `chimed`) reads the
//!    batch and writes replies into a preallocated [`TxBatch`], each addressed back to its client
//!    with [`TxBatch::reply_to`].
//! 4. [`UdpSocket::send_batch`] sends them all with one `sendmmsg`, each from the address its
//!    request was sent to.
//!
//! Nothing in that loop allocates, locks or touches shared state other than the stop flag.
//!
//! Linux only: it relies on `recvmmsg`/`sendmmsg`, `SO_TIMESTAMPING`, `IP_PKTINFO` and
//! `SO_REUSEPORT` load balancing.
//!
//! Module map: `socket` (binding, the two syscalls), `batch` (the preallocated batches), `meta`
//! (per-datagram metadata), `shed` (which old datagrams to shed under overload), `cmsg`
//! (control-message encoding and parsing), `sockaddr` (address conversion), `runner` (the socket
//! workers' loop), `threads` (starting, pinning and joining a group of worker threads, for any
//! backend), `affinity` (CPU pinning), `error`, and `sys` (libc helpers shared by the others).

#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!("chime-udp supports Linux only: it needs recvmmsg, sendmmsg and SO_TIMESTAMPING");

mod affinity;
mod batch;
mod cmsg;
#[cfg(feature = "counting-alloc")]
pub mod counting_alloc;
mod error;
mod meta;
mod runner;
mod shed;
mod sockaddr;
mod socket;
mod sys;
mod threads;

pub use crate::{
    affinity::allowed_cpus,
    batch::{RxBatch, TxBatch},
    error::ConfigError,
    meta::{RecvMeta, Timestamp},
    runner::{BatchHandler, BoundWorkers, DROPS_EVERY, WorkerConfig, Workers},
    shed::{Decision, MIN_SHED_BUFFER, ShedConfig, ShedTuning, Shedder},
    socket::{Capabilities, SendOutcome, SocketConfig, UdpSocket},
    threads::{Starting, Threads},
};
