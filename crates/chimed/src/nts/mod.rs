//! NTS (RFC 8915): the key-exchange server over TLS, and the cookie keys it and the NTP workers
//! share (this server's own, rotated and optionally saved, or a fleet's, derived from its secret).

pub(crate) mod ke;
pub(crate) mod keys;
mod slots;
