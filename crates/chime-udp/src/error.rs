//! The errors this crate adds to the operating system's: a configuration it refuses to act on.
//!
//! They reach callers as an [`std::io::Error`] of kind `InvalidInput` wrapping a [`ConfigError`],
//! so every fallible function keeps returning `io::Result` and a caller that wants the details
//! can downcast.

use std::{io, net::SocketAddr};

/// A socket or worker configuration that cannot work, found before or while acting on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A read timeout of zero, which the kernel takes as "block forever".
    #[error("the read timeout must be greater than zero")]
    ZeroReadTimeout,
    /// No worker threads.
    #[error("at least one worker thread is needed")]
    NoThreads,
    /// A batch size of zero.
    #[error("the batch size must be at least 1")]
    ZeroBatchSize,
    /// A maximum datagram size of zero.
    #[error("the maximum datagram size must be at least 1 byte")]
    ZeroMaxDatagram,
    /// Several threads asked to share an address without `SO_REUSEPORT`.
    #[error("{threads} worker threads cannot share {addr} without SO_REUSEPORT")]
    ReusePortOff {
        /// The number of threads asked for.
        threads: usize,
        /// The address they would share.
        addr: SocketAddr,
    },
    /// A CPU number that the affinity mask cannot hold.
    #[error("CPU {cpu} is out of range: CPU numbers go up to {max}")]
    CpuOutOfRange {
        /// The CPU asked for.
        cpu: usize,
        /// The largest CPU number there can be.
        max: usize,
    },
    /// The kernel refused to pin a worker to its CPU, typically because the CPU is offline or
    /// outside the process's allowed set (a cgroup cpuset, `taskset`).
    #[error("pinning worker {thread} to CPU {cpu}: {source}")]
    Pin {
        /// The worker thread's name.
        thread: String,
        /// The CPU asked for.
        cpu: usize,
        /// The error `sched_setaffinity` returned.
        source: io::Error,
    },
}

impl From<ConfigError> for io::Error {
    fn from(e: ConfigError) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}
