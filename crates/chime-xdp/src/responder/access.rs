//! Who the program in the driver answers: allow and deny subnets with chronyd's semantics, as a
//! longest-prefix-match trie the program looks a request's source address up in.
//!
//! The most specific subnet that holds the address decides; for the same subnet both allowed and
//! denied, deny wins; an address no rule covers is answered only if no rule allows. IPv4 rules
//! cover IPv4 sources and IPv6 rules IPv6 sources; an IPv4-mapped IPv6 source (`::ffff:a.b.c.d`)
//! is the IPv4 address it stands for.
//!
//! One trie holds a whole rule set, both families and what an uncovered address gets, so that
//! swapping it into the one slot the program reads it through replaces everything in one step: a
//! frame sees the old rules or the new, never some of each (as [`DriverMaps::set_state`] does for
//! the state). A key is the prefix length in bits, then a 32-bit word naming the family, then the
//! address: a rule for `a.b.c.d/p` is the key of prefix `32 + p`, for an IPv6 subnet `/p` too,
//! so no rule of one family covers an address of the other. What an uncovered address gets is the
//! entry of prefix length 0, which covers every key: a lookup always finds an entry. Without
//! rules the slot is empty, and the program answers without a lookup.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::DriverMaps;
use crate::bpf;

/// One `allow` or `deny` subnet, in plain numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverRule {
    /// An IPv6 subnet; else IPv4.
    pub v6: bool,
    /// The subnet's address as a number, IPv4's in the low 32 bits; bits past the prefix are
    /// ignored.
    pub addr: u128,
    /// The prefix length: at most 32 for IPv4, 128 for IPv6.
    pub prefix: u8,
    /// Allow; else deny.
    pub allow: bool,
}

/// The trie's key, as the program builds it on its stack: the prefix length in bits of what
/// follows, the family, the address in network order (an IPv4 address in the first 4 bytes, the
/// rest zero).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[repr(C)]
pub(crate) struct Key {
    pub(crate) prefix: u32,
    pub(crate) family: [u8; 4],
    pub(crate) addr: [u8; 16],
}

/// The family words, as the key's bytes.
pub(crate) const FAMILY_V4: [u8; 4] = [0, 0, 0, 4];
pub(crate) const FAMILY_V6: [u8; 4] = [0, 0, 0, 6];
/// The bits of the key's data before the address: the family word.
pub(crate) const FAMILY_BITS: u32 = 32;
/// The values: the address is answered, or dropped.
pub(crate) const ALLOW: u8 = 1;
pub(crate) const DENY: u8 = 0;

/// The entries of the trie for `rules`: each subnet once, denied if any rule denies it, and the
/// entry of prefix 0 saying what an address no rule covers gets. `None` without rules.
pub(crate) fn entries(rules: &[DriverRule]) -> io::Result<Option<BTreeMap<Key, u8>>> {
    if rules.is_empty() {
        return Ok(None);
    }
    let mut out = BTreeMap::new();
    let uncovered = if rules.iter().any(|r| r.allow) {
        DENY
    } else {
        ALLOW
    };
    out.insert(Key::default(), uncovered);
    for r in rules {
        let width = if r.v6 { 128 } else { 32 };
        if r.prefix > width {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a rule's prefix length {} is past {width}", r.prefix),
            ));
        }
        // The subnet's bits alone (below 128 host bits, as a prefix of 0 has).
        let host_bits = u32::from(width - r.prefix);
        let net = match r.prefix {
            0 => 0,
            _ => (r.addr >> host_bits) << host_bits,
        };
        let mut addr = [0u8; 16];
        if r.v6 {
            addr = net.to_be_bytes();
        } else {
            addr[..4].copy_from_slice(&(net as u32).to_be_bytes());
        }
        let key = Key {
            prefix: FAMILY_BITS + u32::from(r.prefix),
            family: if r.v6 { FAMILY_V6 } else { FAMILY_V4 },
            addr,
        };
        let value = if r.allow { ALLOW } else { DENY };
        // Deny wins for the same subnet.
        out.entry(key)
            .and_modify(|v: &mut u8| *v = (*v).min(value))
            .or_insert(value);
    }
    Ok(Some(out))
}

impl DriverMaps {
    /// Makes `rules` the ones the program answers by (see the module's doc for how they are
    /// read): written into a new trie, which then replaces the last in the slot, so a frame is
    /// judged by the last rules or these, whole. No rules: the slot is emptied and every source
    /// is answered, without a lookup.
    pub fn set_access(&self, rules: &[DriverRule]) -> io::Result<()> {
        let Some(entries) = entries(rules)? else {
            return bpf::delete_elem(&self.access, 0);
        };
        let trie = trie(entries.len() as u32)?;
        for (key, value) in &entries {
            bpf::update_keyed(&trie, key, value)?;
        }
        bpf::update_elem(&self.access, 0, &(trie.as_raw_fd() as u32))
    }

    /// The slot the program finds the rules' trie in.
    pub(crate) fn access_fd(&self) -> RawFd {
        self.access.as_raw_fd()
    }
}

/// A trie of [`Key`]s to one byte, for at most `entries` entries.
pub(crate) fn trie(entries: u32) -> io::Result<std::os::fd::OwnedFd> {
    bpf::create_lpm_trie("chimed_ntp_acl", size_of::<Key>(), 1, entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(v6: bool, addr: u128, prefix: u8, allow: bool) -> DriverRule {
        DriverRule {
            v6,
            addr,
            prefix,
            allow,
        }
    }

    #[test]
    fn the_key_has_no_padding() {
        assert_eq!(size_of::<Key>(), 24);
    }

    #[test]
    fn each_subnet_is_one_entry_deny_winning_and_host_bits_cleared() {
        let e = entries(&[
            rule(false, 0xc000_0201, 24, true),
            rule(false, 0xc000_02ff, 24, false),
            rule(false, 0xc000_0200, 24, true),
            rule(true, 1, 0, true),
        ])
        .unwrap()
        .unwrap();
        let v4 = Key {
            prefix: 56,
            family: FAMILY_V4,
            addr: [192, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        };
        let v6 = Key {
            prefix: 32,
            family: FAMILY_V6,
            addr: [0; 16],
        };
        assert_eq!(
            e.into_iter().collect::<Vec<_>>(),
            [(Key::default(), DENY), (v6, ALLOW), (v4, DENY)]
        );
    }

    #[test]
    fn uncovered_addresses_are_answered_only_without_allow_rules() {
        let uncovered = |rules: &[DriverRule]| entries(rules).unwrap().unwrap()[&Key::default()];
        assert_eq!(uncovered(&[rule(false, 0, 8, false)]), ALLOW);
        assert_eq!(
            uncovered(&[rule(false, 0, 8, false), rule(true, 0, 8, true)]),
            DENY
        );
        assert!(entries(&[]).unwrap().is_none());
        assert!(entries(&[rule(false, 0, 33, true)]).is_err());
        assert!(entries(&[rule(true, 0, 128, true)]).is_ok());
    }
}
