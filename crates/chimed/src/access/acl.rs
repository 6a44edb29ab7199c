//! Who is served: `--allow` and `--deny` subnets, as chronyd's `allow` and `deny` directives.
//!
//! The most specific subnet that contains the client's address decides (the longest prefix); for
//! the same subnet both allowed and denied, deny wins. An address no rule covers is served only if
//! there are no `allow` rules: with none given at all everyone is served (chimed's default, unlike
//! chronyd's), with only `deny` rules everyone else is. IPv4 rules cover IPv4 clients and IPv6
//! rules IPv6 clients; `all` is both 0.0.0.0/0 and ::/0.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One `allow` or `deny` subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    /// The subnet's address with the host bits cleared, as a 128-bit number (IPv4 in the low 32).
    net: u128,
    prefix: u8,
    v4: bool,
    allow: bool,
}

impl Rule {
    fn covers(&self, v4: bool, addr: u128) -> bool {
        let width = if self.v4 { 32 } else { 128 };
        self.v4 == v4 && mask(addr, self.prefix, width) == self.net
    }
}

/// Keeps the top `prefix` bits of a `width`-bit address.
fn mask(addr: u128, prefix: u8, width: u8) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let host_bits = u32::from(width - prefix);
    (addr >> host_bits) << host_bits
}

/// The rules, most specific first.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Acl {
    rules: Vec<Rule>,
    has_allow: bool,
}

impl Acl {
    /// The rules from `--allow` and `--deny` values, each `ADDR`, `ADDR/PREFIX` or `all`; an error
    /// names the value and what is wrong with it.
    pub(crate) fn new(allow: &[String], deny: &[String]) -> Result<Self, AclError> {
        let mut rules = Vec::new();
        for (values, is_allow) in [(allow, true), (deny, false)] {
            for value in values {
                rules.extend(parse(value, is_allow)?);
            }
        }
        // Longest prefix first; for the same subnet deny (false) before allow.
        rules.sort_by_key(|r| (std::cmp::Reverse(r.prefix), r.allow));
        Ok(Self {
            has_allow: !allow.is_empty(),
            rules,
        })
    }

    /// No rules: everyone is served, and the workers need not look.
    pub(crate) fn is_open(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `ip` is served: the one access check of every service and transport (NTP, NTS-KE,
    /// Roughtime over UDP, XDP and TCP). Without rules it looks at nothing.
    pub(crate) fn serves(&self, ip: IpAddr) -> bool {
        self.is_open() || self.permits(ip)
    }

    /// The rules as the program that answers in the driver takes them, which applies them as
    /// [`Self::permits`] does (`DriverMaps::set_access`); none for no rules.
    pub(crate) fn driver_rules(&self) -> Vec<chime_xdp::DriverRule> {
        (self.rules.iter())
            .map(|r| chime_xdp::DriverRule {
                v6: !r.v4,
                addr: r.net,
                prefix: r.prefix,
                allow: r.allow,
            })
            .collect()
    }

    /// Whether `ip` is served.
    pub(crate) fn permits(&self, ip: IpAddr) -> bool {
        let (v4, addr) = match ip {
            IpAddr::V4(a) => (true, u128::from(u32::from(a))),
            // An IPv4-mapped address is the IPv4 client it stands for.
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(m) => (true, u128::from(u32::from(m))),
                None => (false, u128::from(a)),
            },
        };
        self.rules
            .iter()
            .find(|r| r.covers(v4, addr))
            .map_or(!self.has_allow, |r| r.allow)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.allow { "allow" } else { "deny" };
        if self.v4 {
            // A v4 rule's net fits in 32 bits by construction.
            let a = Ipv4Addr::from(u32::try_from(self.net).unwrap_or(0));
            write!(f, "{verb} {a}/{}", self.prefix)
        } else {
            write!(f, "{verb} {}/{}", Ipv6Addr::from(self.net), self.prefix)
        }
    }
}

/// As `--check-config` prints it: the rules in the order they are tried, and what happens to a
/// client none covers.
impl fmt::Debug for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rules.is_empty() {
            return f.write_str("everyone is served");
        }
        let mut list = f.debug_list();
        for r in &self.rules {
            list.entry(&format_args!("{r}"));
        }
        let otherwise = if self.has_allow {
            "otherwise deny"
        } else {
            "otherwise allow"
        };
        list.entry(&format_args!("{otherwise}"));
        list.finish()
    }
}

/// A value that is not a rule; names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AclError {
    #[error("'{0}': not an address, ADDR/PREFIX or 'all'")]
    NotAnAddress(String),
    #[error("'{value}': prefix length '{prefix}' is not a number from 0 to {width}")]
    BadPrefix {
        value: String,
        prefix: String,
        width: u8,
    },
}

/// One value: `all` gives an IPv4 and an IPv6 rule, anything else one.
fn parse(value: &str, allow: bool) -> Result<Vec<Rule>, AclError> {
    if value.trim() == "all" {
        return Ok(vec![
            Rule {
                net: 0,
                prefix: 0,
                v4: true,
                allow,
            },
            Rule {
                net: 0,
                prefix: 0,
                v4: false,
                allow,
            },
        ]);
    }
    let (addr, prefix) = match value.trim().split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (value.trim(), None),
    };
    let (v4, bits, width) = if let Ok(a) = addr.parse::<Ipv4Addr>() {
        (true, u128::from(u32::from(a)), 32)
    } else if let Ok(a) = addr.parse::<Ipv6Addr>() {
        (false, u128::from(a), 128)
    } else {
        return Err(AclError::NotAnAddress(value.to_owned()));
    };
    let prefix = match prefix {
        None => width,
        Some(p) => match p.parse::<u8>() {
            Ok(n) if n <= width => n,
            _ => {
                return Err(AclError::BadPrefix {
                    value: value.to_owned(),
                    prefix: p.to_owned(),
                    width,
                });
            }
        },
    };
    Ok(vec![Rule {
        net: mask(bits, prefix, width),
        prefix,
        v4,
        allow,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(allow: &[&str], deny: &[&str]) -> Acl {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Acl::new(&s(allow), &s(deny)).unwrap()
    }

    fn ok(a: &Acl, ip: &str) -> bool {
        a.permits(ip.parse().unwrap())
    }

    #[test]
    fn no_rules_serve_everyone() {
        let a = acl(&[], &[]);
        assert!(a.is_open());
        assert!(ok(&a, "192.0.2.1") && ok(&a, "2001:db8::1"));
    }

    #[test]
    fn the_most_specific_rule_decides() {
        let a = acl(&["10.0.0.0/8", "10.1.2.3"], &["10.1.0.0/16"]);
        assert!(ok(&a, "10.9.9.9"));
        assert!(!ok(&a, "10.1.9.9"));
        assert!(ok(&a, "10.1.2.3"));
        // Allow rules exist, so what none covers is not served.
        assert!(!ok(&a, "192.0.2.1"));
        assert!(!ok(&a, "2001:db8::1"));
    }

    #[test]
    fn only_deny_rules_serve_everyone_else() {
        let a = acl(&[], &["192.0.2.0/24", "2001:db8::/32"]);
        assert!(!ok(&a, "192.0.2.77"));
        assert!(ok(&a, "192.0.3.1"));
        assert!(!ok(&a, "2001:db8:1::5"));
        assert!(ok(&a, "2001:db9::5"));
    }

    #[test]
    fn deny_wins_for_the_same_subnet_and_families_stay_apart() {
        let a = acl(&["192.0.2.0/24"], &["192.0.2.0/24"]);
        assert!(!ok(&a, "192.0.2.1"));
        // An IPv4 rule says nothing about IPv6 clients, except IPv4-mapped ones.
        let a = acl(&["all"], &["0.0.0.0/0"]);
        assert!(!ok(&a, "198.51.100.1"));
        assert!(!ok(&a, "::ffff:198.51.100.1"));
        assert!(ok(&a, "2001:db8::1"));
    }

    #[test]
    fn host_bits_of_a_subnet_are_ignored() {
        let a = acl(&[], &["192.0.2.77/24"]);
        assert!(!ok(&a, "192.0.2.1"));
        let a = acl(&[], &["2001:db8::1/0"]);
        assert!(!ok(&a, "::1") && ok(&a, "127.0.0.1"));
    }

    #[test]
    fn the_driver_is_given_every_rule() {
        use chime_xdp::DriverRule;
        let a = acl(&["10.0.0.0/8", "all"], &["2001:db8::1/32"]);
        let rule = |v6, addr, prefix, allow| DriverRule {
            v6,
            addr,
            prefix,
            allow,
        };
        let mut got = a.driver_rules();
        got.sort_by_key(|r| (r.v6, r.prefix, r.allow));
        assert_eq!(
            got,
            [
                rule(false, 0, 0, true),
                rule(false, 0x0a00_0000, 8, true),
                rule(true, 0, 0, true),
                rule(true, 0x2001_0db8 << 96, 32, false),
            ]
        );
        assert!(acl(&[], &[]).driver_rules().is_empty());
    }

    #[test]
    fn check_config_shows_the_rules_in_order() {
        let a = acl(&["10.0.0.0/8", "2001:db8::/32"], &["10.1.2.3/16"]);
        assert_eq!(
            format!("{a:?}"),
            "[allow 2001:db8::/32, deny 10.1.0.0/16, allow 10.0.0.0/8, otherwise deny]"
        );
        assert_eq!(format!("{:?}", acl(&[], &[])), "everyone is served");
    }

    #[test]
    fn bad_values_are_named() {
        let e = Acl::new(&["10.0.0.0/33".into()], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'10.0.0.0/33'") && e.contains("0 to 32"), "{e}");
        let e = Acl::new(&[], &["::/129".into()]).unwrap_err().to_string();
        assert!(e.contains("0 to 128"), "{e}");
        let e = Acl::new(&["example.net".into()], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'example.net'"), "{e}");
        let e = Acl::new(&["10.0.0.0/x".into()], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'x'"), "{e}");
    }
}
