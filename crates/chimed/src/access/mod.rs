//! Who is served: the allow/deny rules (chronyd's `allow` and `deny`) and the per-address
//! bookkeeping the TCP services use to bound what one client may hold.

pub(crate) mod acl;
pub(crate) mod per_address;
