//! Connections open per client address, for the TCP services (NTS-KE, Roughtime over TCP): a
//! connection takes a [`Place`] when accepted, if its address has fewer than the limit, and gives
//! it back when the place is dropped. An address's entry goes when its last connection does, so
//! the map holds only addresses with connections open.
//!
//! An IPv6 client is counted by its /64: one host is given a whole /64 (SLAAC, a customer's
//! prefix) and can connect from as many of its addresses as it likes, so a limit per address
//! would hold nothing. An IPv4-mapped address counts as the IPv4 address it maps.

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
        let ip = client(ip);
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

/// Whom `ip` is counted as: itself for IPv4, its /64 for IPv6.
fn client(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
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

    #[test]
    fn an_ipv6_client_is_counted_by_its_64_and_a_mapped_one_as_ipv4() {
        let p = PerAddress::default();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let held: Vec<_> = ["2001:db8:1:2::1", "2001:db8:1:2:ffff::9"]
            .iter()
            .map(|a| p.take(ip(a), 2).unwrap())
            .collect();
        assert!(
            p.take(ip("2001:db8:1:2:abcd::1"), 2).is_none(),
            "the same /64"
        );
        let other = p.take(ip("2001:db8:1:3::1"), 2).unwrap();
        let v4 = p.take(ip("192.0.2.7"), 1).unwrap();
        assert!(
            p.take(ip("::ffff:192.0.2.7"), 1).is_none(),
            "192.0.2.7, mapped"
        );
        drop((held, other, v4));
        assert!(p.open.lock().unwrap().is_empty());
    }
}
