//! Who the server's clients are, for the operator: what `chronyc clients` shows, kept for a
//! server whose worker threads all answer at once.
//!
//! Every worker [records](ClientLog::record) each request, with what became of it (a [`Fate`]),
//! into one [`ClientLog`] they share; the control plane asks it for the [busiest
//! clients](ClientLog::top) and for [how many distinct clients](ClientLog::distinct) were served in
//! the last hour and the last day. A client is an IPv4 address (its IPv4-mapped IPv6 form is the
//! same client) or an IPv6 /64, since a /64 is what one host or one customer holds, and a host
//! with temporary (privacy) addresses changes its address within it.
//!
//! # The table
//!
//! Like the rate limiter's [`ClientTable`](crate::ClientTable), the counts live in a fixed array of
//! sets of four slots, all atomics, taken without locks; the address's keyed hash picks the set,
//! and any slot of it may hold the client. A slot is 64 bytes: the address (an IPv4 address in the
//! low 32 bits of a `u64`, or an IPv6 /64's prefix, all 64 bits), a tag (the address's hash with
//! its family in the two low bits, 0 for a slot never used, so that the family needs no bits of
//! the address), the requests and the three fates counted apart, and the first and last times the
//! client was seen. A set keeps its addresses and tags in its first cache line, so finding a client
//! reads one line and counting its request writes the next (the two are a 128-byte aligned pair,
//! which the CPU fetches together); only a new client or a request not answered touches the rest.
//!
//! The memory is fixed when the log is made, whatever the number of source addresses. A new
//! client whose set is full takes the slot of the client least worth keeping: the one with the
//! fewest requests, its count halved for every hour since it was last seen, and of those the one
//! seen longest ago. So a flood of one-off (spoofed) addresses, each worth one request, evicts
//! little but its own addresses: in a set of busy clients it takes one slot, that of the least
//! busy, and then churns within it; a client that has gone quiet is halved away within hours and
//! leaves room. The cost is on the other side: during a flood, a new genuine client is worth no
//! more than a spoofed address until its second request, so it may be forgotten and counted anew.
//! chronyd's client log evicts the least recently seen instead (the fewest requests only breaking
//! ties), which keeps every new client at first but lets a flood of new addresses push out all.
//!
//! Threads that count the same client at the same instant never lose a count (each is a
//! `fetch_add`), but the races of eviction may: a request counted into a slot just as another
//! thread gives the slot to a new client is counted to the new client, and a client's very first
//! requests, from two threads at once, may each take a slot, leaving a second entry of a request
//! or two that is the first to be evicted. The tag is cleared first and written last when a slot
//! changes hands, with release ordering, so [`ClientLog::top`] never shows a new client with the
//! previous one's counts (but for a request counted in that race); and since the tag is the address's hash, an address and a tag written
//! by two threads evicting at once (a torn entry) do not match each other: such a slot is never
//! shown nor found, and is soon evicted, as it has one request.
//!
//! # Distinct clients
//!
//! Counting distinct clients exactly would take memory for every one; a HyperLogLog sketch counts
//! them in 4096 one-byte registers, with a standard error of 1.04/√4096 ≈ 1.6%. The log keeps
//! windows of time: six of ten minutes (the last hour is the union of the six newest, so it
//! covers the last 50 to 60 minutes) and 24 of an hour (the day: the last 23 to 24 hours). A
//! record raises one register of the current ten-minute window, and, if that rose, the same
//! register of the current hour (which holds the ten minutes; when the short window's register
//! was already as high, the hour's was raised with it). The windows are numbered from the start of
//! the caller's clock, and each is a ring: the first thread to write into a window that still
//! holds an older one's registers claims it (a compare-exchange of its number) and clears it, once
//! per ten minutes and once per hour, 4096 byte stores. What another thread writes into the window
//! while it is being cleared is lost, so a client seen only in the microseconds of a window's
//! start may be missed (and a thread that read the window's number just before the claim may
//! leave one register of the window's previous use in it). No crate offers a sketch that many threads write without locks and that
//! forgets by windows, hence this one.
//!
//! Sans-IO like the rest of the crate: the caller passes the time, monotonic nanoseconds from any
//! fixed start, the same for every thread.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU8, AtomicU64};

use crate::ratelimit::mix;

/// What became of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Answered.
    Answered,
    /// Not answered, for a reason other than the client's rate (a malformed or denied request).
    Dropped,
    /// Not answered: over the client's rate limit.
    RateLimited,
    /// Answered with a Kiss-o'-Death; a reply, and counted as one.
    Kod,
}

impl Fate {
    /// Which of a slot's fate counters counts it; none for an answer, which only the requests do.
    fn counter(self) -> Option<usize> {
        match self {
            Self::Answered => None,
            Self::Dropped => Some(0),
            Self::RateLimited => Some(1),
            Self::Kod => Some(2),
        }
    }
}

/// One client, as the log has it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Client {
    /// The IPv4 address, or the IPv6 /64 (its low 64 bits zero).
    pub address: IpAddr,
    /// Its requests, whatever became of them.
    pub requests: u64,
    /// Of those, the ones not answered for another reason than their rate.
    pub dropped: u64,
    /// Of those, the ones not answered for being over the rate limit.
    pub rate_limited: u64,
    /// Of those, the ones answered with a Kiss-o'-Death.
    pub kod: u64,
    /// When its last request came, on the caller's clock.
    pub last_seen_ns: u64,
    /// The mean time between its requests, in seconds; `None` after one request.
    pub interval: Option<f64>,
}

/// Estimates of how many distinct clients (IPv4 addresses and IPv6 /64s) were seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Distinct {
    /// In the last hour (the last 50 to 60 minutes).
    pub last_hour: u64,
    /// In the last day (the last 23 to 24 hours).
    pub last_day: u64,
}

/// The per-client counts and distinct-client sketches every worker thread shares. See the
/// module's documentation.
#[derive(Debug)]
pub struct ClientLog {
    sets: Box<[Set]>,
    mask: usize,
    windows: Box<[Window]>,
    seed: [u64; 2],
}

impl ClientLog {
    /// The most clients a log tracks: 2^22, 256 MiB of slots.
    pub const MAX_CLIENTS: usize = 1 << 22;

    /// A log for `clients` clients (rounded up to a power of two, at least 4, at most
    /// [`Self::MAX_CLIENTS`]), 64 bytes each, and its sketches, 30 windows of 4160 bytes: all the
    /// memory it will ever take, allocated here. 65536 clients take 4,319,160 bytes (4.1 MiB).
    /// `seed` keys the address hash: pass random bits, so that no one can pick addresses that
    /// crowd one set or one register.
    pub fn new(clients: usize, seed: [u64; 2]) -> Self {
        let clients = clients.clamp(WAYS, Self::MAX_CLIENTS).next_power_of_two();
        let sets = clients / WAYS;
        Self {
            sets: (0..sets).map(|_| Set::default()).collect(),
            mask: sets - 1,
            windows: (0..WINDOWS).map(|_| Window::new()).collect(),
            seed,
        }
    }

    /// How many clients the log can track at once.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// The memory the log takes, in bytes: the table, the sketches and this handle.
    pub fn bytes(&self) -> usize {
        size_of::<Self>() + size_of_val(&*self.sets) + size_of_val(&*self.windows)
    }

    /// Counts one request from `ip` at `now_ns` (monotonic nanoseconds, from the same start on
    /// every call), and what became of it. For every request a worker handles: a hash, one set
    /// of four slots, a few relaxed atomic operations and a sketch register or two. Never
    /// allocates or blocks.
    pub fn record(&self, ip: IpAddr, now_ns: u64, fate: Fate) {
        let (family, key) = group(ip);
        let hash = self.hash(family, key);
        self.sketch(hash, now_ns);
        let tag = hash & !FAMILY | family;
        // The set from bits 20 up, clear of the sketch's register number in the top 12.
        let set = &self.sets[(hash >> 20) as usize & self.mask];
        let found =
            (0..WAYS).find(|&i| set.key[i].load(Relaxed) == key && set.tag[i].load(Relaxed) == tag);
        let way = match found {
            Some(i) => {
                set.requests[i].fetch_add(1, Relaxed);
                set.last[i].store(now_ns, Relaxed);
                i
            }
            None => {
                let i = set.victim(now_ns);
                set.claim(i, key, tag, now_ns);
                i
            }
        };
        if let Some(counter) = fate.counter() {
            set.fates[counter][way].fetch_add(1, Relaxed);
        }
    }

    /// The `n` clients with the most requests, the most first (and of equal counts the latest
    /// seen). For the control plane: reads every slot, and allocates the `n` clients.
    pub fn top(&self, n: usize) -> Vec<Client> {
        let n = n.min(self.capacity());
        let mut kept: Vec<Client> = Vec::with_capacity(n);
        // The least busy of those kept on top, to be replaced by a busier one.
        let mut least = BinaryHeap::with_capacity(n);
        for client in self.clients() {
            let rank = Reverse((client.requests, client.last_seen_ns));
            if kept.len() < n {
                least.push((rank, kept.len()));
                kept.push(client);
            } else if let Some(mut top) = least.peek_mut()
                && rank < top.0
            {
                kept[top.1] = client;
                top.0 = rank;
            }
        }
        kept.sort_unstable_by_key(|c| Reverse((c.requests, c.last_seen_ns)));
        kept
    }

    /// Estimates of the distinct clients seen in the hour and the day before `now_ns`, each
    /// within about 1.6% (one standard error) of the truth.
    pub fn distinct(&self, now_ns: u64) -> Distinct {
        let [last_hour, last_day] = LEVELS.map(|level| self.estimate(&level, now_ns));
        Distinct {
            last_hour,
            last_day,
        }
    }

    /// Every client in the table, in no order: each slot read once, torn ones left out.
    fn clients(&self) -> impl Iterator<Item = Client> + '_ {
        self.sets
            .iter()
            .flat_map(move |set| (0..WAYS).filter_map(move |i| self.read(set, i)))
    }

    /// The client in slot `i` of `set`, unless it is empty, being written, or torn (an address
    /// and a tag that two threads wrote for two clients).
    fn read(&self, set: &Set, i: usize) -> Option<Client> {
        let tag = set.tag[i].load(Acquire);
        let key = set.key[i].load(Relaxed);
        let family = tag & FAMILY;
        if family == EMPTY || self.hash(family, key) & !FAMILY | family != tag {
            return None;
        }
        let requests = set.requests[i].load(Relaxed);
        let first = set.first[i].load(Relaxed);
        let last = set.last[i].load(Relaxed);
        let [dropped, rate_limited, kod] = set.fates.each_ref().map(|f| f[i].load(Relaxed));
        Some(Client {
            address: address(family, key),
            requests,
            dropped,
            rate_limited,
            kod,
            last_seen_ns: last,
            interval: (requests > 1)
                .then(|| last.saturating_sub(first) as f64 / 1e9 / (requests - 1) as f64),
        })
    }

    /// A keyed 64-bit hash of a client: a bijection of the key for each family, so two clients
    /// of one family never share a hash.
    fn hash(&self, family: u64, key: u64) -> u64 {
        mix(mix(key ^ self.seed[0]) ^ self.seed[1] ^ family)
    }

    /// Raises the client's register in the current ten-minute window, and, if it rose, in the
    /// current hour. The register is the hash's top bits, and its value the rank of the first
    /// one bit in the rest: a client raises it to a value reached once in 2^value clients.
    fn sketch(&self, hash: u64, now_ns: u64) {
        let index = (hash >> (64 - PRECISION)) as usize;
        // At most 53, so the cast is exact.
        let rank = ((hash << PRECISION).leading_zeros().min(64 - PRECISION) + 1) as u8;
        for level in &LEVELS {
            let Some(window) = self.window(level, now_ns) else {
                return;
            };
            let register = &window.registers[index];
            if register.load(Relaxed) >= rank {
                return;
            }
            register.fetch_max(rank, Relaxed);
        }
    }

    /// The window of `level` that `now_ns` falls in, claimed and cleared if it held an older
    /// one; none if it already holds a newer one (a thread whose clock lags by the whole ring).
    fn window(&self, level: &Level, now_ns: u64) -> Option<&Window> {
        let number = now_ns / level.span_ns;
        let window = &self.windows[level.first + (number % level.windows as u64) as usize];
        let mark = number + 1;
        let mut seen = window.mark.load(Relaxed);
        while seen < mark {
            match window
                .mark
                .compare_exchange_weak(seen, mark, Relaxed, Relaxed)
            {
                Ok(_) => {
                    for register in &window.registers {
                        register.store(0, Relaxed);
                    }
                    return Some(window);
                }
                Err(now_there) => seen = now_there,
            }
        }
        (seen == mark).then_some(window)
    }

    /// The distinct clients in the union of the windows of `level` that end at `now_ns`'s.
    fn estimate(&self, level: &Level, now_ns: u64) -> u64 {
        let number = now_ns / level.span_ns;
        let mut union = [0u8; REGISTERS];
        let windows = &self.windows[level.first..level.first + level.windows];
        for window in windows {
            let Some(held) = window.mark.load(Relaxed).checked_sub(1) else {
                continue; // never written
            };
            if held > number || number - held >= level.windows as u64 {
                continue;
            }
            for (u, register) in union.iter_mut().zip(&window.registers) {
                *u = (*u).max(register.load(Relaxed));
            }
        }
        hyperloglog(&union)
    }
}

/// The tag of a slot never used.
const EMPTY: u64 = 0;
/// The tag's family of an IPv4 client.
const V4: u64 = 1;
/// The tag's family of an IPv6 /64.
const V6: u64 = 2;
/// The tag's bits that hold the family.
const FAMILY: u64 = 3;

/// A client's family and key: an IPv4 address (IPv4-mapped ones too) in the low 32 bits, or an
/// IPv6 address's /64 prefix.
fn group(ip: IpAddr) -> (u64, u64) {
    let v6 = match ip {
        IpAddr::V4(a) => return (V4, u64::from(a.to_bits())),
        IpAddr::V6(a) => a,
    };
    match v6.to_ipv4_mapped() {
        Some(a) => (V4, u64::from(a.to_bits())),
        None => (V6, (v6.to_bits() >> 64) as u64),
    }
}

/// The address a family and key stand for: [`group`] undone, to the /64.
fn address(family: u64, key: u64) -> IpAddr {
    if family == V4 {
        IpAddr::V4(Ipv4Addr::from_bits(key as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from_bits(u128::from(key) << 64))
    }
}

const WAYS: usize = 4;

/// A client's count is halved for every hour since it was last seen, when deciding whom to evict.
const HALF_LIFE_NS: u64 = 3600 * 1_000_000_000;

/// Four slots in four cache lines, as arrays of each field, so that finding a client reads only
/// the first line (the keys and tags) and counting a request writes the second, its pair.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Set {
    key: [AtomicU64; WAYS],
    /// The hash with the family in the low bits (a [`V4`] or [`V6`]), or [`EMPTY`].
    tag: [AtomicU64; WAYS],
    requests: [AtomicU64; WAYS],
    last: [AtomicU64; WAYS],
    first: [AtomicU64; WAYS],
    /// The dropped, the rate-limited and the KoD requests ([`Fate::counter`]).
    fates: [[AtomicU64; WAYS]; 3],
}

impl Set {
    /// The slot a new client takes: an empty one, or the one of the client least worth keeping
    /// (its requests, halved for each hour since it was seen), of those the one seen longest ago.
    fn victim(&self, now_ns: u64) -> usize {
        let mut victim = (0, (u64::MAX, u64::MAX));
        for i in 0..WAYS {
            if self.tag[i].load(Relaxed) == EMPTY {
                return i;
            }
            let last = self.last[i].load(Relaxed);
            let halvings = now_ns.saturating_sub(last) / HALF_LIFE_NS;
            let worth = u32::try_from(halvings)
                .ok()
                .and_then(|h| self.requests[i].load(Relaxed).checked_shr(h))
                .unwrap_or(0);
            if (worth, last) < victim.1 {
                victim = (i, (worth, last));
            }
        }
        victim.0
    }

    /// Gives slot `i` to a new client, seen once at `now_ns`. The tag goes first, so that no one
    /// finds or reads the slot while it changes hands, and comes back last, after the counts.
    fn claim(&self, i: usize, key: u64, tag: u64, now_ns: u64) {
        self.tag[i].store(EMPTY, Relaxed);
        self.requests[i].store(1, Relaxed);
        self.first[i].store(now_ns, Relaxed);
        self.last[i].store(now_ns, Relaxed);
        for fate in &self.fates {
            fate[i].store(0, Relaxed);
        }
        self.key[i].store(key, Relaxed);
        self.tag[i].store(tag, Release);
    }
}

/// Log2 of the registers in a sketch.
const PRECISION: u32 = 12;
const REGISTERS: usize = 1 << PRECISION;

/// One window of time's sketch.
#[derive(Debug)]
#[repr(align(64))]
struct Window {
    /// The number of the window whose clients the registers hold (its start over its span), plus
    /// one: 0 for one never written.
    mark: AtomicU64,
    registers: [AtomicU8; REGISTERS],
}

impl Window {
    fn new() -> Self {
        Self {
            mark: AtomicU64::new(0),
            registers: std::array::from_fn(|_| AtomicU8::new(0)),
        }
    }
}

/// A ring of windows of one span, `windows` of them from `first` in the log's array.
#[derive(Debug)]
struct Level {
    span_ns: u64,
    first: usize,
    windows: usize,
}

/// The hour's six ten-minute windows, then the day's 24 hours.
const LEVELS: [Level; 2] = [
    Level {
        span_ns: 600 * 1_000_000_000,
        first: 0,
        windows: 6,
    },
    Level {
        span_ns: 3600 * 1_000_000_000,
        first: 6,
        windows: 24,
    },
];
const WINDOWS: usize = LEVELS[1].first + LEVELS[1].windows;

/// The HyperLogLog estimate of the distinct items a sketch saw (Flajolet et al., 2007), with
/// linear counting while a good share of the registers are still zero. With 64-bit hashes no
/// correction for large counts is needed.
fn hyperloglog(registers: &[u8; REGISTERS]) -> u64 {
    let m = REGISTERS as f64;
    let sum: f64 = registers.iter().map(|&r| (-f64::from(r)).exp2()).sum();
    let zeros = registers.iter().filter(|&&r| r == 0).count();
    let raw = 0.7213 / (1.0 + 1.079 / m) * m * m / sum;
    let estimate = if raw <= 2.5 * m && zeros > 0 {
        m * (m / zeros as f64).ln()
    } else {
        raw
    };
    estimate.round() as u64
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    const SEC: u64 = 1_000_000_000;
    const MINUTE: u64 = 60 * SEC;
    const HOUR: u64 = 60 * MINUTE;
    const SEED: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    fn v6(bits: u128) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from_bits(bits))
    }

    /// The `i`th address of a flood: even ones IPv4, odd ones IPv6, each in a /64 of its own.
    fn flooder(i: u32) -> IpAddr {
        if i.is_multiple_of(2) {
            IpAddr::V4(Ipv4Addr::from_bits(0x0a00_0000 + i))
        } else {
            v6(0x2001_0db8_0000_0000_0000_0000_0000_0000 | u128::from(i) << 64 | 0x1234)
        }
    }

    /// `got` within `share` of `expect`.
    fn near(got: u64, expect: u64, share: f64) -> bool {
        (got as f64 - expect as f64).abs() <= expect as f64 * share
    }

    fn find(log: &ClientLog, address: IpAddr) -> Option<Client> {
        log.top(log.capacity())
            .into_iter()
            .find(|c| c.address == address)
    }

    #[test]
    fn counts_each_client_and_groups_mapped_v4_and_v6_by_64() {
        let log = ClientLog::new(1024, SEED);
        let (a, b, c) = (
            v4(192, 0, 2, 1),
            v4(192, 0, 2, 2),
            v6(0x2001_0db8 << 96 | 5),
        );
        let a_mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped());
        let c_sibling = v6(0x2001_0db8 << 96 | 0xffff_0000_0000_0001);
        for i in 0..1000u64 {
            let now = i * SEC;
            // a: 1000 requests, half of them in the IPv4-mapped form; 10 rate-limited, 5 KoD.
            let fate = match i {
                0..10 => Fate::RateLimited,
                10..15 => Fate::Kod,
                _ => Fate::Answered,
            };
            log.record(if i.is_multiple_of(2) { a } else { a_mapped }, now, fate);
            if i.is_multiple_of(2) {
                // b: 500, 3 of them dropped.
                let fate = if i < 6 { Fate::Dropped } else { Fate::Answered };
                log.record(b, now, fate);
            }
            if i.is_multiple_of(10) {
                // c: 100, from two addresses of one /64.
                log.record(
                    if i.is_multiple_of(20) { c } else { c_sibling },
                    now,
                    Fate::Answered,
                );
            }
        }
        // Another /64, next to c's: another client.
        log.record(v6(0x2001_0db8 << 96 | 1 << 64), 1000 * SEC, Fate::Kod);
        let top = log.top(10);
        let counts: Vec<_> = top
            .iter()
            .map(|c| (c.address, c.requests, c.dropped, c.rate_limited, c.kod))
            .collect();
        assert_eq!(
            counts,
            [
                (a, 1000, 0, 10, 5),
                (b, 500, 3, 0, 0),
                (v6(0x2001_0db8 << 96), 100, 0, 0, 0),
                (v6(0x2001_0db8 << 96 | 1 << 64), 1, 0, 0, 1),
            ]
        );
        assert_eq!(top[0].last_seen_ns, 999 * SEC);
        assert_eq!(log.top(2).len(), 2);
        assert_eq!(log.top(2)[1].address, b);
        assert!(log.top(0).is_empty());
    }

    #[test]
    fn interval_is_the_mean_spacing() {
        let log = ClientLog::new(64, SEED);
        let ip = v4(198, 51, 100, 7);
        log.record(ip, 5 * SEC, Fate::Answered);
        assert_eq!(find(&log, ip).unwrap().interval, None);
        for i in 1..=30 {
            log.record(ip, 5 * SEC + i * 2 * SEC, Fate::Answered);
        }
        let client = find(&log, ip).unwrap();
        assert_eq!((client.requests, client.interval), (31, Some(2.0)));
    }

    #[test]
    fn a_million_addresses_leave_the_memory_and_the_busy_clients_alone() {
        let log = ClientLog::new(65536, SEED);
        let bytes = log.bytes();
        assert_eq!(bytes, 4_319_160, "the figure in the docs of `new`");
        let busy: Vec<IpAddr> = (1..=5).map(|i| v4(203, 0, 113, i)).collect();
        let start = HOUR;
        for (k, &ip) in busy.iter().enumerate() {
            for _ in 0..(k + 1) * 100 {
                log.record(ip, start, Fate::Answered);
            }
        }
        // A million one-off addresses over half an hour, the busy clients polling through it.
        let n = 1_000_000u32;
        for i in 0..n {
            let now = start + u64::from(i) * 1800 * SEC / u64::from(n);
            log.record(flooder(i), now, Fate::Answered);
            if i.is_multiple_of(1000) {
                for &ip in &busy {
                    log.record(ip, now, Fate::Answered);
                }
            }
        }
        assert_eq!(log.bytes(), bytes);
        let top = log.top(10);
        for (k, &ip) in busy.iter().enumerate() {
            let client = top
                .iter()
                .find(|c| c.address == ip)
                .expect("busy client kept");
            assert_eq!(client.requests, (k as u64 + 1) * 100 + 1000, "{ip}");
        }
        // m = 4096: a standard error of 1.6%, three of them 4.9%.
        let distinct = log.distinct(start + 1800 * SEC);
        let expect = u64::from(n) + 5;
        assert!(near(distinct.last_hour, expect, 0.049), "{distinct:?}");
        assert!(near(distinct.last_day, expect, 0.049), "{distinct:?}");
    }

    #[test]
    fn windows_forget_the_hour_then_the_day() {
        let log = ClientLog::new(4096, SEED);
        let t = 5 * HOUR + 3 * MINUTE;
        for i in 0..1000 {
            log.record(flooder(i), t, Fate::Answered);
        }
        let d = log.distinct(t);
        assert!(
            near(d.last_hour, 1000, 0.05) && d.last_hour == d.last_day,
            "{d:?}"
        );
        let d = log.distinct(t + 61 * MINUTE);
        assert_eq!(d.last_hour, 0);
        assert!(near(d.last_day, 1000, 0.05), "{d:?}");
        // Ten new clients into the ten-minute window that held t's, which must be cleared first.
        for i in 0..10 {
            log.record(flooder(5000 + i), t + 61 * MINUTE, Fate::Answered);
        }
        assert_eq!(log.distinct(t + 61 * MINUTE).last_hour, 10);
        assert_eq!(log.distinct(t + 25 * HOUR), Distinct::default());
        // And five into the hour that held t's.
        for i in 0..5 {
            log.record(flooder(6000 + i), t + 24 * HOUR, Fate::Answered);
        }
        assert_eq!(
            log.distinct(t + 24 * HOUR),
            Distinct {
                last_hour: 5,
                last_day: 15
            }
        );
    }

    #[test]
    fn quiet_clients_are_halved_away_and_busy_ones_stay() {
        // One set: three busy clients stay through a flood, which churns the fourth slot.
        let log = ClientLog::new(4, SEED);
        let busy = [v4(192, 0, 2, 1), v4(192, 0, 2, 2), v4(192, 0, 2, 3)];
        for &ip in &busy {
            for _ in 0..100 {
                log.record(ip, SEC, Fate::Answered);
            }
        }
        for i in 0..1000 {
            log.record(flooder(i), 2 * SEC, Fate::Answered);
        }
        let top = log.top(4);
        assert_eq!(top.len(), 4);
        for ip in busy {
            assert!(top.iter().any(|c| c.address == ip && c.requests == 100));
        }
        // Eight hours on, 100 requests are halved to nothing: three new clients take the busy
        // ones' slots, seen before the flood's last.
        for i in 0..3 {
            log.record(flooder(2000 + i), 8 * HOUR, Fate::Answered);
        }
        let top = log.top(4);
        assert!(top.iter().all(|c| c.requests == 1), "{top:?}");
    }

    #[test]
    fn threads_share_one_log() {
        let log = ClientLog::new(1024, SEED);
        let busy = [v4(192, 0, 2, 9), v6(0x2001_0db8 << 96), v4(10, 1, 1, 1)];
        let per_thread = 20_000u32;
        std::thread::scope(|s| {
            for k in 0..4u32 {
                let log = &log;
                s.spawn(move || {
                    for i in 0..per_thread {
                        let now = u64::from(i) * 1_000_000;
                        for &ip in &busy {
                            log.record(ip, now, Fate::Answered);
                        }
                        log.record(flooder(k * per_thread + i), now, Fate::Dropped);
                    }
                });
            }
        });
        let all = log.top(log.capacity());
        for ip in busy {
            // A client's first requests, from two threads at once, may make two entries.
            let total: u64 = all
                .iter()
                .filter(|c| c.address == ip)
                .map(|c| c.requests)
                .sum();
            assert!(
                near(total, 4 * u64::from(per_thread), 0.02),
                "{ip}: {total}"
            );
        }
        let d = log.distinct(u64::from(per_thread) * 1_000_000);
        assert!(
            near(d.last_hour, 4 * u64::from(per_thread) + 3, 0.05),
            "{d:?}"
        );
    }

    #[test]
    fn sizes_are_rounded_and_bounded() {
        fn shared<T: Send + Sync>(_: &T) {}
        shared(&ClientLog::new(0, SEED));
        assert_eq!(size_of::<Set>(), 4 * 64);
        assert_eq!(ClientLog::new(0, SEED).capacity(), 4);
        assert_eq!(ClientLog::new(1000, SEED).capacity(), 1024);
        let log = ClientLog::new(4096, SEED);
        assert_eq!(log.bytes(), size_of::<ClientLog>() + 4096 * 64 + 30 * 4160);
        assert_eq!(log.distinct(0), Distinct::default());
        assert!(log.top(10).is_empty());
    }

    #[test]
    fn group_gives_the_address_back() {
        for (ip, grouped) in [
            (v4(192, 0, 2, 1), v4(192, 0, 2, 1)),
            (v4(0, 0, 0, 0), v4(0, 0, 0, 0)),
            (v6(0xffff_c000_0201), v4(192, 0, 2, 1)),
            (v6(1), v6(0)),
            (v6(u128::MAX), v6(u128::MAX << 64)),
        ] {
            let (family, key) = group(ip);
            assert_eq!(address(family, key), grouped, "{ip}");
        }
        // ::1 and 0.0.0.0 both have key 0, but not the same family.
        assert_ne!(group(v6(1)), group(v4(0, 0, 0, 0)));
    }

    /// An address from a few clients: four IPv4 ones, each also in its IPv4-mapped form, and
    /// three IPv6 /64s, each under any interface identifier.
    fn few_clients() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (0u8..4).prop_map(|d| v4(192, 0, 2, d)),
            (0u8..4).prop_map(|d| IpAddr::V6(Ipv4Addr::new(192, 0, 2, d).to_ipv6_mapped())),
            (0u128..3, any::<u64>())
                .prop_map(|(net, id)| v6(0x2001_0db8 << 96 | net << 64 | u128::from(id))),
        ]
    }

    /// The client an address is, worked out apart from [`group`].
    fn grouped(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(a) => IpAddr::V4(a),
                None => v6(a.to_bits() >> 64 << 64),
            },
            v4 => v4,
        }
    }

    fn fate() -> impl Strategy<Value = Fate> {
        prop_oneof![
            Just(Fate::Answered),
            Just(Fate::Dropped),
            Just(Fate::RateLimited),
            Just(Fate::Kod)
        ]
    }

    proptest! {
        /// With room for every client, the log's counts are a plain map's.
        #[test]
        fn counts_are_a_maps(steps in prop::collection::vec((few_clients(), fate(), 0..10 * SEC), 1..200)) {
            let log = ClientLog::new(1 << 10, SEED);
            let mut model: HashMap<IpAddr, (u64, [u64; 3], u64, u64)> = HashMap::new();
            let mut now = 0;
            for (ip, fate, step) in steps {
                now += step;
                log.record(ip, now, fate);
                let entry = model.entry(grouped(ip)).or_insert((0, [0; 3], now, now));
                entry.0 += 1;
                if let Some(counter) = fate.counter() {
                    entry.1[counter] += 1;
                }
                entry.3 = now;
            }
            let top = log.top(usize::MAX);
            prop_assert_eq!(top.len(), model.len());
            prop_assert!(top.windows(2).all(|w| w[0].requests >= w[1].requests));
            for c in top {
                let (requests, [dropped, rate_limited, kod], first, last) = model[&c.address];
                prop_assert_eq!(
                    (c.requests, c.dropped, c.rate_limited, c.kod, c.last_seen_ns),
                    (requests, dropped, rate_limited, kod, last)
                );
                let interval = (requests > 1).then(|| (last - first) as f64 / 1e9 / (requests - 1) as f64);
                prop_assert_eq!(c.interval, interval);
            }
        }

        /// Any addresses at any times, in a table far too small: nothing panics, the memory stays,
        /// every entry is a grouped address, and no more requests are counted than were made.
        #[test]
        fn any_traffic_stays_in_bounds(steps in prop::collection::vec((any::<u128>(), any::<bool>(), any::<u64>()), 1..300)) {
            let log = ClientLog::new(8, SEED);
            let bytes = log.bytes();
            for &(bits, is_v4, now) in &steps {
                let ip = if is_v4 { IpAddr::V4(Ipv4Addr::from_bits(bits as u32)) } else { v6(bits) };
                log.record(ip, now, Fate::Answered);
            }
            let _ = log.distinct(steps[0].2);
            prop_assert_eq!(log.bytes(), bytes);
            let top = log.top(100);
            prop_assert!(top.len() <= 8);
            prop_assert!(top.iter().map(|c| c.requests).sum::<u64>() <= steps.len() as u64);
            for c in top {
                match c.address {
                    IpAddr::V4(_) => {}
                    IpAddr::V6(a) => {
                        prop_assert_eq!(a.to_bits() as u64, 0);
                        prop_assert!(a.to_ipv4_mapped().is_none());
                    }
                }
            }
        }
    }
}
