//! Who is served: the allow/deny rules (chronyd's `allow` and `deny`) and the per-address
//! bookkeeping the TCP services use to bound what one client may hold.

pub(crate) mod acl;
pub(crate) mod per_address;

use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

/// The access rules in force, which every service checks and SIGHUP replaces.
#[derive(Debug)]
pub(crate) struct Rules(ArcSwap<acl::Acl>);

impl Rules {
    pub(crate) fn new(acl: acl::Acl) -> Self {
        Self(ArcSwap::from_pointee(acl))
    }

    /// The rules in force now.
    pub(crate) fn load(&self) -> Guard<Arc<acl::Acl>> {
        self.0.load()
    }

    /// Puts `acl` in force.
    pub(crate) fn replace(&self, acl: acl::Acl) {
        self.0.store(Arc::new(acl));
    }
}
