//! What a measurement found: the servers behind each contradiction.

use core::fmt;

use super::list::ServerList;
use crate::chain::ChainReport;
use crate::client::Verified;

/// A contradiction from [`verify_chain`](crate::verify_chain), with the servers named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accusation<'a> {
    /// The server whose reply came first.
    pub earlier: &'a str,
    /// Its reply.
    pub earlier_reply: Verified,
    /// The server whose reply came later, yet claims an earlier time than the first allows.
    pub later: &'a str,
    /// Its reply.
    pub later_reply: Verified,
}

impl fmt::Display for Accusation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |f: &mut fmt::Formatter<'_>, name: &str, v: &Verified| {
            write!(
                f,
                "{name} (midpoint {}.{:06}, radius {}.{:06} s)",
                v.midpoint_unix_us / 1_000_000,
                v.midpoint_unix_us % 1_000_000,
                v.radius_us / 1_000_000,
                v.radius_us % 1_000_000
            )
        };
        side(f, self.earlier, &self.earlier_reply)?;
        f.write_str(", answering first, contradicts ")?;
        side(f, self.later, &self.later_reply)
    }
}

/// Names the servers behind each contradiction of `report`. `link_servers` is the server behind
/// each link checked ([`Chain::link_servers`]); a position it does not cover is named
/// "(unknown)".
pub fn accusations<'a>(
    list: &'a ServerList,
    link_servers: &[usize],
    report: &ChainReport,
) -> Vec<Accusation<'a>> {
    let name = |link: usize| {
        link_servers
            .get(link)
            .and_then(|&s| list.servers.get(s))
            .map_or("(unknown)", |s| s.name.as_str())
    };
    report
        .contradictions
        .iter()
        .map(|c| Accusation {
            earlier: name(c.earlier),
            earlier_reply: report.replies[c.earlier],
            later: name(c.later),
            later_reply: report.replies[c.later],
        })
        .collect()
}

/// The servers named in every one of `accusations`, in the order first named; none when there
/// are none. With one liar among honest servers, the measurement's two passes put every honest
/// server after the liar at least once, so each contradiction names the liar and the liar alone
/// is in all of them, unless a single contradiction was found, when both of its servers are.
/// More than one liar can leave no one in every contradiction.
pub fn suspects<'a>(accusations: &[Accusation<'a>]) -> Vec<&'a str> {
    let Some(first) = accusations.first() else {
        return Vec::new();
    };
    let mut named = vec![first.earlier];
    if first.later != first.earlier {
        named.push(first.later);
    }
    named.retain(|name| {
        accusations
            .iter()
            .all(|a| a.earlier == *name || a.later == *name)
    });
    named
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::verify_chain;
    use crate::ecosystem::measure::{Chain, choose};
    use crate::ecosystem::testing::{Net, drive, policy, seeded};
    use crate::version::{ContextSpelling, Version};

    #[test]
    fn a_slow_clock_is_named_in_the_accusation() {
        // s1's clock is a minute slow: whatever the order, some reply of it comes after one of
        // another server that it contradicts.
        let mut net = Net::new(&[0, -60, 0]);
        let list = net.list.clone();
        let mut random = seeded(11);
        let plan = choose(&list, 3, &mut random);
        let mut chain = Chain::new(&list, plan, &[Version::Rfc10049], policy(), random).unwrap();
        drive(&mut chain, &mut net, |_, _| false);
        let report = verify_chain(&chain.links(), &policy()).unwrap();
        let named = accusations(&list, &chain.link_servers(), &report);
        assert!(!named.is_empty());
        assert!(named.iter().all(|a| a.later == "s1" && a.earlier != "s1"));
        let line = named[0].to_string();
        assert!(
            line.starts_with(&format!("{} (midpoint 17952852", named[0].earlier)),
            "{line}"
        );
        assert!(line.contains(", answering first, contradicts s1 (midpoint 17952851"));
        assert!(line.contains("radius 3.000000 s"), "{line}");
        if named.len() > 1 {
            assert_eq!(suspects(&named), ["s1"]);
        }
    }

    #[test]
    fn suspects_are_those_in_every_contradiction() {
        let v = Verified {
            version: Version::Rfc10049,
            midpoint_unix_us: 0,
            radius_us: 0,
            mint_unix_us: 0,
            maxt_unix_us: 0,
            online_key: [0; 32],
            cert_spelling: ContextSpelling::Roughtime,
            srep_spelling: ContextSpelling::Roughtime,
            index: 0,
        };
        let acc = |earlier, later| Accusation {
            earlier,
            earlier_reply: v,
            later,
            later_reply: v,
        };
        assert!(suspects(&[]).is_empty());
        assert_eq!(suspects(&[acc("liar", "a")]), ["liar", "a"]);
        assert_eq!(suspects(&[acc("liar", "a"), acc("b", "liar")]), ["liar"]);
        assert!(suspects(&[acc("x", "a"), acc("y", "b")]).is_empty());
    }
}
