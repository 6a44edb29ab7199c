//! A measurement (RFC 10049 §8.2): the servers chosen at random, and the sequence the caller
//! drives across them, carrying on past servers that do not answer.

use core::fmt;

use super::list::{ListedServer, ListedVersion, ServerList};
use crate::chain::{Link, next_nonce};
use crate::client::{Verified, VerifyError, VerifyPolicy, verify_reply};
use crate::keys::{KEY_LEN, srv_value};
use crate::request::{BuildError, REQUEST_LEN, build_request};
use crate::version::Version;

/// The fewest servers a measurement needs (RFC 10049 §8.1: "a minimum of three of which are
/// operational and not run by the same parties").
pub const MIN_SERVERS: usize = 3;

/// The servers chosen for one measurement, in the order they are to be asked.
///
/// RFC 10049 §8.2: "The client randomly selects at least three servers from the list, and
/// sequentially queries them. To ensure that all possible inconsistencies can be detected, it is
/// necessary for clients to repeat the query sequence twice with the servers in the same order."
/// Asking the whole sequence a second time puts every server both before and after every other,
/// so no server can pick a place in the chain where its lie would go unnoticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every index of the list; the first `chosen` are shuffled and chosen, and the rest are
    /// drawn from, one more Fisher–Yates step at a time, to stand in for servers that fail.
    order: Vec<usize>,
    chosen: usize,
}

impl Plan {
    /// The chosen servers (indices into the list), distinct, in the order to ask them.
    pub fn servers(&self) -> &[usize] {
        &self.order[..self.chosen]
    }

    /// Every query of the measurement: the chosen servers in order, then the same again. With
    /// two servers or more, no server is asked twice in a row, since the sequence's last and
    /// first servers differ.
    pub fn queries(&self) -> impl Iterator<Item = usize> + '_ {
        self.servers().iter().chain(self.servers()).copied()
    }

    /// Chooses one more server, uniformly among those not chosen yet.
    fn draw(&mut self, random: &mut impl FnMut() -> u64) -> Option<usize> {
        let i = self.chosen;
        if i == self.order.len() {
            return None;
        }
        let j = i + below(self.order.len() - i, random);
        self.order.swap(i, j);
        self.chosen += 1;
        Some(self.order[i])
    }
}

/// Chooses `count` distinct servers of `list` uniformly at random (fewer if the list is shorter),
/// by a partial Fisher–Yates shuffle driven by `random`, which should be a cryptographically
/// secure source: a server that could predict the order could choose its place in it.
///
/// RFC 10049 §8.2 asks for at least three; [`MIN_SERVERS`] is that number.
pub fn choose(list: &ServerList, count: usize, mut random: impl FnMut() -> u64) -> Plan {
    let mut plan = Plan {
        order: (0..list.servers.len()).collect(),
        chosen: 0,
    };
    for _ in 0..count.min(list.servers.len()) {
        plan.draw(&mut random);
    }
    plan
}

/// A number in `0..n` from one 64-bit draw, by the multiply-and-shift reduction. Its bias is at
/// most `n / 2^64`, negligible for any list, and unlike rejection sampling it never asks again,
/// so a poor random source cannot make it spin.
fn below(n: usize, random: &mut impl FnMut() -> u64) -> usize {
    let wide = u128::from(random()) * n as u128;
    // The high half is less than n, so it fits.
    (wide >> 64) as usize
}

/// 32 bytes from the caller's random source.
fn random_bytes(random: &mut impl FnMut() -> u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    for chunk in out.chunks_exact_mut(8) {
        chunk.copy_from_slice(&random().to_le_bytes());
    }
    out
}

/// Why a server dropped out of a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// The caller gave up waiting.
    NoAnswer,
    /// The reply failed verification; like no answer, it is not malfeasance (RFC 10049 §8.4.2:
    /// "Clients MUST NOT send malfeasance reports in response to signature verification
    /// failures or any other protocol errors").
    Invalid(VerifyError),
}

/// A server that dropped out of a measurement, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// Index into the list.
    pub server: usize,
    /// Why.
    pub reason: FailureReason,
}

/// One received, verified exchange, owning its packets.
#[derive(Debug, Clone)]
struct Recorded {
    server: usize,
    rand: Option<[u8; 32]>,
    request: Vec<u8>,
    reply: Vec<u8>,
}

/// A measurement sequence (RFC 10049 §8.2) that the caller drives: [`Chain::next_query`] says
/// which server to ask and hands over the request, and the caller answers the [`Query`] with the
/// reply or with [`Query::no_answer`].
///
/// The first request's nonce is random; every later one is `H(last reply ‖ rand)` over the last
/// reply received, so a server that does not answer leaves no gap. A server that fails in the
/// first pass is replaced by one not chosen before, drawn at random, while any remain (with none
/// left, its place is dropped). In the second pass there is no one to replace it with, since the
/// replacement would have no earlier place to be compared with, so it is skipped. A failed
/// server is never asked again.
pub struct Chain<'l, R> {
    list: &'l ServerList,
    plan: Plan,
    /// The sequence as it stands, after replacements.
    slots: Vec<usize>,
    /// 0 for the first pass, 1 for the repetition.
    pass: u8,
    position: usize,
    versions: Vec<Version>,
    /// For each server of the list, the version its entry names, where that is one this crate
    /// speaks and can chain; such a server is offered that version alone.
    listed: Vec<Option<Version>>,
    policy: VerifyPolicy,
    random: R,
    recorded: Vec<Recorded>,
    failures: Vec<Failure>,
}

impl<R> fmt::Debug for Chain<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field("slots", &self.slots)
            .field("pass", &self.pass)
            .field("position", &self.position)
            .field("links", &self.recorded.len())
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

/// The next exchange of a [`Chain`]: send [`Query::request`] to the server, then report what
/// came back. Dropping it unanswered records nothing; the chain then asks again with a fresh
/// nonce.
pub struct Query<'c, 'l, R> {
    chain: &'c mut Chain<'l, R>,
    server: usize,
    rand: Option<[u8; 32]>,
    request: Vec<u8>,
}

impl<R> fmt::Debug for Query<'_, '_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Query")
            .field("server", &self.server)
            .field("rand", &self.rand)
            .field("request", &self.request.len())
            .finish_non_exhaustive()
    }
}

impl<'l, R: FnMut() -> u64> Chain<'l, R> {
    /// A measurement over the servers of `plan`, chosen from `list`, accepting replies that pass
    /// `policy`, with nonces and replacements drawn from `random`.
    ///
    /// A server whose list entry names a version by number that this crate speaks and can chain
    /// is offered that version alone, so that a list can mix servers that share no version (as
    /// Cloudflare's drafts-only server and roughenough's version-1-only one do); every other
    /// server is offered `versions`, which must use 32-byte nonces (Google's cannot be chained).
    /// [`Chain::offering_only`] offers `versions` to every server instead.
    pub fn new(
        list: &'l ServerList,
        plan: Plan,
        versions: &[Version],
        policy: VerifyPolicy,
        random: R,
    ) -> Result<Self, BuildError> {
        // Building one request now turns away version sets that can never make one.
        build_request(
            &mut [0u8; REQUEST_LEN],
            versions,
            &[0; 32],
            Some(&[0; KEY_LEN]),
        )?;
        Ok(Self {
            list,
            slots: plan.servers().to_vec(),
            plan,
            pass: 0,
            position: 0,
            versions: versions.to_vec(),
            listed: list.servers.iter().map(chainable_version).collect(),
            policy,
            random,
            recorded: Vec::new(),
            failures: Vec::new(),
        })
    }

    /// Offers the versions given to [`Chain::new`] to every server, whatever its list entry
    /// names (as a user who asks for one version expects).
    #[must_use]
    pub fn offering_only(mut self) -> Self {
        self.listed.fill(None);
        self
    }

    /// The next server to ask and the request for it, or `None` once the sequence is done.
    pub fn next_query(&mut self) -> Option<Query<'_, 'l, R>> {
        let server = self.current()?;
        let (rand, nonce) = match self.recorded.last() {
            None => (None, random_bytes(&mut self.random)),
            Some(previous) => {
                let rand = random_bytes(&mut self.random);
                (Some(rand), next_nonce(&previous.reply, &rand))
            }
        };
        let key = &self.list.servers[server].public_key;
        let mut request = vec![0u8; REQUEST_LEN];
        let offer = match &self.listed[server] {
            Some(version) => core::slice::from_ref(version),
            None => &self.versions[..],
        };
        let len = build_request(&mut request, offer, &nonce, Some(&srv_value(key)))
            // `new` built a request with each offer and a nonce of this length.
            .expect("offers checked in Chain::new");
        request.truncate(len);
        Some(Query {
            chain: self,
            server,
            rand,
            request,
        })
    }
}

impl<'l, R> Chain<'l, R> {
    /// True once every query of the sequence has been answered or given up on.
    pub fn is_done(&self) -> bool {
        self.current().is_none()
    }

    /// The exchanges received, in order, for [`verify_chain`](crate::verify_chain).
    pub fn links(&self) -> Vec<Link<'_>> {
        self.recorded
            .iter()
            .map(|r| Link {
                public_key: self.list.servers[r.server].public_key,
                rand: r.rand,
                request: &r.request,
                reply: &r.reply,
            })
            .collect()
    }

    /// The server (index into the list) behind each of [`Chain::links`].
    pub fn link_servers(&self) -> Vec<usize> {
        self.recorded.iter().map(|r| r.server).collect()
    }

    /// The servers that dropped out, in the order they did.
    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// The names of the servers that dropped out, in the order they did.
    pub fn dead(&self) -> Vec<&'l str> {
        let list = self.list;
        self.failures
            .iter()
            .map(|f| list.servers[f.server].name.as_str())
            .collect()
    }

    /// How many distinct servers answered every query put to them.
    pub fn answered(&self) -> usize {
        let mut live: Vec<usize> = self
            .recorded
            .iter()
            .map(|r| r.server)
            .filter(|s| !self.is_dead(*s))
            .collect();
        live.sort_unstable();
        live.dedup();
        live.len()
    }

    /// True if enough servers answered: at least [`MIN_SERVERS`] of them, or every server of a
    /// list shorter than that. A list that short cannot meet RFC 10049 §8.1 whatever happens;
    /// telling it apart is left to the caller, who can see the list's length.
    pub fn has_enough(&self) -> bool {
        self.answered() >= MIN_SERVERS.min(self.list.servers.len())
    }

    fn is_dead(&self, server: usize) -> bool {
        self.failures.iter().any(|f| f.server == server)
    }

    /// The server the sequence is at. No slot holds a failed server still to be asked: in the
    /// first pass a failed server's slot is refilled or removed, and in the second each slot is
    /// asked once.
    fn current(&self) -> Option<usize> {
        self.slots.get(self.position).copied()
    }

    /// Moves to the next slot, and from the end of the first pass to the start of the second.
    fn advance(&mut self) {
        self.position += 1;
        if self.pass == 0 && self.position == self.slots.len() {
            self.pass = 1;
            self.position = 0;
        }
    }
}

impl<'l, R: FnMut() -> u64> Query<'_, 'l, R> {
    /// The server to ask (index into the list).
    pub fn server(&self) -> usize {
        self.server
    }

    /// The server's entry in the list: its addresses and name.
    pub fn listed(&self) -> &'l ListedServer {
        &self.chain.list.servers[self.server]
    }

    /// The request packet to send.
    pub fn request(&self) -> &[u8] {
        &self.request
    }

    /// Records the server's reply, if it verifies; a reply that does not is treated as no
    /// answer, and the error says why.
    pub fn answer(self, reply: &[u8]) -> Result<Verified, VerifyError> {
        let key = self.chain.list.servers[self.server].public_key;
        match verify_reply(&self.request, reply, &key, &self.chain.policy) {
            Ok(verified) => {
                let chain = self.chain;
                chain.recorded.push(Recorded {
                    server: self.server,
                    rand: self.rand,
                    request: self.request,
                    reply: reply.to_vec(),
                });
                chain.advance();
                Ok(verified)
            }
            Err(e) => {
                self.chain.fail(self.server, FailureReason::Invalid(e));
                Err(e)
            }
        }
    }

    /// Records that the server did not answer in time.
    pub fn no_answer(self) {
        self.chain.fail(self.server, FailureReason::NoAnswer);
    }
}

impl<R: FnMut() -> u64> Chain<'_, R> {
    /// Marks `server` failed and, in the first pass, puts a fresh server in its place.
    fn fail(&mut self, server: usize, reason: FailureReason) {
        self.failures.push(Failure { server, reason });
        if self.pass == 0 {
            match self.plan.draw(&mut self.random) {
                Some(replacement) => self.slots[self.position] = replacement,
                None => {
                    self.slots.remove(self.position);
                    if self.position == self.slots.len() {
                        self.pass = 1;
                        self.position = 0;
                    }
                }
            }
        } else {
            self.advance();
        }
    }
}

/// The version `server`'s entry names, if it is a number this crate knows and a chained request
/// (a 32-byte nonce) can be built in it. Google's protocol has no number and cannot be chained;
/// a name (Cloudflare writes `"IETF-Roughtime"`) or an unknown number leaves the server to the
/// chain's offer.
fn chainable_version(server: &ListedServer) -> Option<Version> {
    let Some(ListedVersion::Number(number)) = server.version else {
        return None;
    };
    let version = Version::from_number(u32::try_from(number).ok()?)?;
    let mut probe = [0u8; REQUEST_LEN];
    let srv = srv_value(&server.public_key);
    build_request(&mut probe, &[version], &[0; 32], Some(&srv))
        .ok()
        .map(|_| version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::verify_chain;
    use crate::ecosystem::list::ListedVersion;
    use crate::ecosystem::testing::{Net, drive, list_of, policy, seeded};
    use crate::ecosystem::verdict::accusations;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn choice_is_distinct_clamped_and_reaches_every_server(
            n in 1usize..12,
            count in 0usize..16,
            seed in any::<u64>(),
        ) {
            let list = list_of(n);
            let mut random = seeded(seed);
            let mut seen = vec![false; n];
            for _ in 0..200 {
                let plan = choose(&list, count, &mut random);
                let servers = plan.servers();
                prop_assert_eq!(servers.len(), count.min(n));
                let mut sorted = servers.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), servers.len(), "distinct");
                let queries: Vec<usize> = plan.queries().collect();
                prop_assert_eq!(queries.len(), 2 * servers.len());
                prop_assert_eq!(&queries[..servers.len()], servers);
                prop_assert_eq!(&queries[servers.len()..], servers);
                if servers.len() >= 2 {
                    prop_assert!(queries.windows(2).all(|w| w[0] != w[1]), "{:?}", queries);
                }
                for &s in servers {
                    seen[s] = true;
                }
            }
            // 200 draws of at least one of at most 11: missing a server has probability
            // below 11·(10/11)^200, about 5e-8.
            if count > 0 {
                prop_assert!(seen.iter().all(|s| *s), "{:?}", seen);
            }
        }
    }

    #[test]
    fn a_dead_server_is_replaced_named_and_the_chain_verifies() {
        let mut net = Net::new(&[0; 5]);
        let list = net.list.clone();
        let mut random = seeded(7);
        let plan = choose(&list, 3, &mut random);
        let victim = plan.servers()[1];
        let mut chain =
            Chain::new(&list, plan.clone(), &[Version::Rfc10049], policy(), random).unwrap();
        let asked = drive(&mut chain, &mut net, |s, _| s == victim);
        assert!(chain.is_done());
        assert_eq!(chain.dead(), [list.servers[victim].name.as_str()]);
        assert_eq!(chain.failures()[0].reason, FailureReason::NoAnswer);
        // Asked: the first, the victim (silent), its replacement, the third, then the sequence
        // with the replacement again.
        assert_eq!(asked.len(), 7);
        let servers = chain.link_servers();
        assert_eq!(servers.len(), 6);
        assert!(!servers.contains(&victim));
        assert_eq!(servers[..3], servers[3..]);
        assert!(servers.windows(2).all(|w| w[0] != w[1]));
        assert_eq!(servers[0], plan.servers()[0]);
        assert_eq!(servers[2], plan.servers()[2]);
        assert_eq!(chain.answered(), 3);
        assert!(chain.has_enough());
        let report = verify_chain(&chain.links(), &policy()).unwrap();
        assert!(report.is_consistent());
        assert!(accusations(&list, &servers, &report).is_empty());
    }

    #[test]
    fn too_few_live_servers_is_said() {
        let mut net = Net::new(&[0; 3]);
        let list = net.list.clone();
        let mut random = seeded(1);
        let plan = choose(&list, 3, &mut random);
        let live = plan.servers()[2];
        let mut chain = Chain::new(&list, plan, &[Version::Rfc10049], policy(), random).unwrap();
        drive(&mut chain, &mut net, |s, _| s != live);
        let mut dead = chain.dead();
        dead.sort_unstable();
        assert_eq!(dead.len(), 2);
        assert!(!dead.contains(&list.servers[live].name.as_str()));
        assert_eq!(chain.link_servers(), [live, live]);
        assert_eq!(chain.answered(), 1);
        assert!(!chain.has_enough());
        assert!(verify_chain(&chain.links(), &policy()).is_ok());
    }

    #[test]
    fn a_server_silent_in_the_second_pass_is_skipped_and_not_counted() {
        let mut net = Net::new(&[0; 3]);
        let list = net.list.clone();
        let mut random = seeded(3);
        let plan = choose(&list, 3, &mut random);
        let flaky = plan.servers()[0];
        let mut chain = Chain::new(&list, plan, &[Version::Rfc10049], policy(), random).unwrap();
        let asked = drive(&mut chain, &mut net, |s, pass| s == flaky && pass == 1);
        assert_eq!(asked.len(), 6);
        assert_eq!(chain.link_servers().len(), 5);
        assert_eq!(chain.dead(), [list.servers[flaky].name.as_str()]);
        assert_eq!(chain.answered(), 2);
        assert!(!chain.has_enough());
        assert!(verify_chain(&chain.links(), &policy()).is_ok());
    }

    /// The versions a request offers, by number.
    fn offered(request: &[u8]) -> Vec<u32> {
        let parsed = crate::request::Request::parse(request).unwrap();
        parsed.versions.unwrap().iter().collect()
    }

    #[test]
    fn a_server_is_offered_the_version_its_entry_names() {
        let mut net = Net::new(&[0; 4]);
        let mut list = net.list.clone();
        // Draft 11 and version 1 by number; a name and an unknown number say nothing usable.
        list.servers[0].version = Some(ListedVersion::Number(0x8000_000b));
        list.servers[1].version = Some(ListedVersion::Number(1));
        list.servers[2].version = Some(ListedVersion::Name("IETF-Roughtime".into()));
        list.servers[3].version = Some(ListedVersion::Number(0x8000_00ff));
        let default = [Version::Rfc10049, Version::Draft12];
        let expected = |server: usize| match server {
            0 => vec![0x8000_000b],
            1 => vec![1],
            _ => vec![1, 0x8000_000c],
        };
        let mut random = seeded(5);
        let plan = choose(&list, 4, &mut random);
        let mut chain = Chain::new(&list, plan.clone(), &default, policy(), random).unwrap();
        while let Some(query) = chain.next_query() {
            let server = query.server();
            assert_eq!(
                offered(query.request()),
                expected(server),
                "server {server}"
            );
            let reply = net.reply(server, query.request());
            query.answer(&reply).unwrap();
        }
        // A chain across versions verifies as one.
        assert_eq!(chain.link_servers().len(), 8);
        let report = verify_chain(&chain.links(), &policy()).unwrap();
        assert!(report.is_consistent());

        let mut chain = Chain::new(&list, plan, &default, policy(), seeded(5))
            .unwrap()
            .offering_only();
        let query = chain.next_query().unwrap();
        assert_eq!(offered(query.request()), [1, 0x8000_000c]);
    }

    #[test]
    fn google_cannot_be_chained() {
        let list = list_of(3);
        let plan = choose(&list, 3, seeded(0));
        assert!(Chain::new(&list, plan, &[Version::Google], policy(), seeded(0)).is_err());
    }
}
