//! Who is served: the allow/deny rules (chronyd's `allow` and `deny`) and the per-address
//! bookkeeping the TCP services use to bound what one client may hold.

pub(crate) mod acl;
pub(crate) mod per_address;

use std::io;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use arc_swap::{ArcSwap, Guard};
use chime_xdp::DriverMaps;

/// The access rules in force, which every service checks and SIGHUP replaces; with
/// `--xdp-in-driver`, also written where the program that answers in the driver reads them.
#[derive(Debug)]
pub(crate) struct Rules {
    acl: ArcSwap<acl::Acl>,
    driver: OnceLock<Arc<DriverMaps>>,
    /// Held while rules are put in force, so that the driver's are the last put in force.
    writing: Mutex<()>,
}

impl Rules {
    pub(crate) fn new(acl: acl::Acl) -> Self {
        Self {
            acl: ArcSwap::from_pointee(acl),
            driver: OnceLock::new(),
            writing: Mutex::new(()),
        }
    }

    /// The rules in force now.
    pub(crate) fn load(&self) -> Guard<Arc<acl::Acl>> {
        self.acl.load()
    }

    /// Puts `acl` in force, in the driver too if it answers there and the rules changed. A
    /// failed write there is logged; the driver keeps the rules it had.
    pub(crate) fn replace(&self, acl: acl::Acl) {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = **self.acl.load() != acl;
        let rules = acl.driver_rules();
        self.acl.store(Arc::new(acl));
        if let (Some(maps), true) = (self.driver.get(), changed)
            && let Err(e) = maps.set_access(&rules)
        {
            tracing::error!(
                "xdp: cannot write the access rules into the driver ({e}): it keeps applying the \
                 last ones"
            );
        }
    }

    /// Applies the rules in the program that answers in the driver (`--xdp-in-driver`), from now
    /// on: those in force are written at once, before it answers anyone. Set once, at start.
    pub(crate) fn answer_in_driver(&self, maps: Arc<DriverMaps>) -> io::Result<()> {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        maps.set_access(&self.load().driver_rules())?;
        let _ = self.driver.set(maps);
        Ok(())
    }
}
