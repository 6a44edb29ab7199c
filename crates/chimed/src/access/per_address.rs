//! Connections open per client address, for the TCP services (NTS-KE, Roughtime over TCP): a
//! connection takes a [`Place`] when accepted, if its address has fewer than the limit, and gives
//! it back when the place is dropped. An address's entry goes when its last connection does, so
//! the map holds only addresses with connections open.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Open connections per address, shared by the accept loops and the connections.
#[derive(Debug, Default, Clone)]
pub(crate) struct PerAddress {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerAddress {
    /// A place for one more connection from `ip`, if it has fewer than `limit` open.
    pub(crate) fn take(&self, ip: IpAddr, limit: usize) -> Option<Place> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(Place {
            of: self.clone(),
            ip,
        })
    }
}

/// One connection's place in its address's count; given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    of: PerAddress,
    ip: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.of.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_limited_per_address_and_given_back() {
        let p = PerAddress::default();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let first = p.take(a, 2).unwrap();
        let second = p.take(a, 2).unwrap();
        assert!(p.take(a, 2).is_none());
        let other = p.take(b, 2).unwrap();
        drop(first);
        let third = p.take(a, 2).unwrap();
        drop((second, third, other));
        // The last connection of an address takes its entry with it.
        assert!(p.open.lock().unwrap().is_empty());
    }
}
