//! Roughtime: the batch handler the socket and XDP workers run, the TCP transport, and the keys
//! every transport signs with (online keys delegated by a long-term key or read from a bundle).

pub(crate) mod keys;
pub(crate) mod tcp;
pub(crate) mod udp;
