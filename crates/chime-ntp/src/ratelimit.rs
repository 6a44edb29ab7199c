//! Per-client response rate limiting, with the meaning of chronyd's `ratelimit` directive.
//!
//! Each client address earns one response every 2^`interval` seconds and may save up `burst` of
//! them. A request that finds none saved is still answered once in 2^`leak` (so that someone who
//! floods with a victim's spoofed address cannot cut the victim off), and otherwise, if `kod` is
//! set, gets a Kiss-o'-Death RATE once in 2^`kod` of the rest, asking the client to poll less
//! often; the remainder are dropped. The limits, ranges and defaults are chronyd's, so that a
//! `ratelimit` line of a chrony.conf means the same here.
//!
//! The state is a [`ClientTable`] every worker thread shares, without locks: a fixed array of
//! 64-byte sets of four slots, each slot an address key and the address's *theoretical arrival
//! time* (GCRA, the generic cell rate algorithm), both atomics. A client whose next "full bucket"
//! time is at or before now has its whole burst saved, so the slot evicted for a new address is
//! the one with the earliest such time: a quiet client loses nothing by being forgotten, and a
//! busy one stays tracked. Threads that update the same slot at the same instant may lose one
//! update between them; the worst that does is answer one request too many.
//!
//! For NTP ([`ClientTable::relenting`]) the table also keeps chronyd's defence against clients
//! that poll faster when they are not answered: per client, the rate of requests that follow an
//! answer and the rate of those that follow a drop. When the second is more than twice the first,
//! limiting only makes such a client send more, so the leak is inverted for it: most of its
//! requests over the limit are answered, and the rates keep being measured.
//!
//! Sans-IO like the rest of the crate: the caller passes the time (monotonic nanoseconds from any
//! fixed start) and a [`Coin`] per thread for the random leak and KoD draws.

use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The limits: chronyd's `ratelimit` options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    interval: i8,
    burst: u8,
    leak: u8,
    kod: u8,
}

/// A [`RateLimit`] option outside chronyd's range for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{option} must be {min} to {max}, not {value}")]
pub struct RateLimitError {
    /// Which option: `interval`, `burst`, `leak` or `kod`.
    pub option: &'static str,
    /// The value given.
    pub value: i64,
    /// The smallest allowed value.
    pub min: i64,
    /// The largest allowed value.
    pub max: i64,
}

impl RateLimit {
    /// chronyd's defaults: one response per 8 s (interval 3), bursts of 8, leak 2 (every fourth
    /// request over the limit is answered anyway), no KoD.
    pub const DEFAULT: Self = Self {
        interval: 3,
        burst: 8,
        leak: 2,
        kod: 0,
    };

    /// The limits, each checked against chronyd's range: `interval` −19 to 12 (log2 seconds
    /// between responses), `burst` 1 to 255, `leak` 1 to 4 and `kod` 0 (off) to 4 (log2 of one
    /// in how many).
    pub fn new(interval: i64, burst: i64, leak: i64, kod: i64) -> Result<Self, RateLimitError> {
        let check = |option, value: i64, min: i64, max: i64| {
            if (min..=max).contains(&value) {
                Ok(value)
            } else {
                Err(RateLimitError {
                    option,
                    value,
                    min,
                    max,
                })
            }
        };
        // The ranges make each narrowing cast exact.
        Ok(Self {
            interval: check("interval", interval, -19, 12)? as i8,
            burst: check("burst", burst, 1, 255)? as u8,
            leak: check("leak", leak, 1, 4)? as u8,
            kod: check("kod", kod, 0, 4)? as u8,
        })
    }

    /// Log2 of the seconds between responses to one client: also the least poll exponent a reply
    /// suggests to a client that polls faster.
    pub fn interval(&self) -> i8 {
        self.interval
    }

    /// The responses a client may take back to back after being quiet.
    pub fn burst(&self) -> u8 {
        self.burst
    }

    /// Log2 of one in how many requests over the limit are answered anyway.
    pub fn leak(&self) -> u8 {
        self.leak
    }

    /// Log2 of one in how many requests over the limit, and not leaked, get a KoD RATE; 0 is
    /// none.
    pub fn kod(&self) -> u8 {
        self.kod
    }

    /// The limits in one word, for a table that swaps them without a lock.
    fn pack(self) -> u64 {
        u64::from(self.interval.to_ne_bytes()[0])
            | u64::from(self.burst) << 8
            | u64::from(self.leak) << 16
            | u64::from(self.kod) << 24
    }

    fn unpack(bits: u64) -> Self {
        Self {
            interval: i8::from_ne_bytes([bits as u8]),
            burst: (bits >> 8) as u8,
            leak: (bits >> 16) as u8,
            kod: (bits >> 24) as u8,
        }
    }

    /// The time one response costs, in nanoseconds: 2^interval seconds (at least 1 ns).
    fn period_ns(&self) -> u64 {
        const SECOND: u64 = 1_000_000_000;
        if self.interval >= 0 {
            SECOND << self.interval
        } else {
            (SECOND >> self.interval.unsigned_abs()).max(1)
        }
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for RateLimit {
    /// As chrony.conf would say it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "interval {} burst {} leak {} kod {}",
            self.interval, self.burst, self.leak, self.kod
        )
    }
}

/// What to do with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Within the limit, or over it and leaked: answer as usual.
    Answer,
    /// Over the limit: answer with a Kiss-o'-Death RATE.
    Kod,
    /// Over the limit: no reply.
    Drop,
}

/// A small per-thread random source for the leak and KoD draws (xorshift64*): not for secrets,
/// only so that which requests over the limit get through cannot be predicted from their order.
#[derive(Clone, Debug)]
pub struct Coin(u64);

impl Coin {
    /// A coin from a seed; any seed works (zero is replaced).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// True once in 2^`log2` calls on average; always for 0.
    pub fn one_in(&mut self, log2: u8) -> bool {
        let r = self.next_u64();
        log2 == 0 || r >> (64 - u32::from(log2.min(63))) == 0
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// One client: a key derived from its address (0 is an empty slot), its theoretical arrival
/// time, when its saved responses will have grown back to a full burst minus one, and its
/// [`History`], packed.
#[derive(Debug, Default)]
struct Slot {
    key: AtomicU64,
    tat: AtomicU64,
    history: AtomicU64,
}

const WAYS: usize = 4;

/// Four slots in two cache lines: the address picks the set, any slot of it may hold the client.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Set([Slot; WAYS]);

/// A rate not measured yet, as chronyd's `INVALID_RATE`.
const NO_RATE: i8 = i8::MIN;
/// Rates are log2 of requests per second in quarters (chronyd's `RATE_SCALE`), measured in whole
/// octaves of the interval between two requests.
const RATE_SCALE: i16 = 4;
/// The unit of [`History::last`]: 2^20 ns, about a millisecond.
const HISTORY_SHIFT: u32 = 20;
/// The rate of two requests in the same unit: one octave above a millisecond apart.
const MAX_RATE: i16 = 44;
/// The slowest rate kept: one request in 2^20 s.
const MIN_RATE: i16 = -80;

/// What the retry heuristic remembers of a client, in 58 bits: when its last request came (in
/// units of 2^20 ns, 40 bits, so it wraps after 36 years), the rate of its requests after an
/// answered one and after a dropped one, and whether the last was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct History {
    last: u64,
    rate: i8,
    timeout_rate: i8,
    dropped: bool,
}

impl History {
    const LAST_BITS: u32 = 40;

    /// A client's first request, at `now_ns`: nothing measured yet.
    fn first(now_ns: u64) -> Self {
        Self {
            last: (now_ns >> HISTORY_SHIFT) & ((1 << Self::LAST_BITS) - 1),
            rate: NO_RATE,
            timeout_rate: NO_RATE,
            dropped: false,
        }
    }

    fn pack(self) -> u64 {
        self.last
            | u64::from(self.rate.to_ne_bytes()[0]) << 40
            | u64::from(self.timeout_rate.to_ne_bytes()[0]) << 48
            | u64::from(self.dropped) << 56
    }

    fn unpack(bits: u64) -> Self {
        let byte = |shift: u32| i8::from_ne_bytes([(bits >> shift) as u8]);
        Self {
            last: bits & ((1 << Self::LAST_BITS) - 1),
            rate: byte(40),
            timeout_rate: byte(48),
            dropped: bits >> 56 & 1 == 1,
        }
    }

    /// Counts a request at `now_ns` into the rate its predecessor's fate picks, as chronyd's
    /// `update_record`: the interval in whole octaves (rounded at 1.5×), the rate moving up a
    /// quarter octave per request and down halfway at once, at most 2.5 octaves above the latest
    /// interval's.
    fn count(&mut self, now_ns: u64) {
        let now = (now_ns >> HISTORY_SHIFT) & ((1 << Self::LAST_BITS) - 1);
        let interval = now.wrapping_sub(self.last) & ((1 << Self::LAST_BITS) - 1);
        self.last = now;
        if interval >= 1 << (Self::LAST_BITS - 1) {
            return; // the clock went back, or a wrap: skip, as chronyd does
        }
        let latest = if interval == 0 {
            MAX_RATE
        } else {
            let octave = i16::try_from((interval + (interval >> 1)).ilog2()).unwrap_or(i16::MAX);
            (MAX_RATE - RATE_SCALE - RATE_SCALE * octave).max(MIN_RATE)
        };
        let rate = if self.dropped {
            &mut self.timeout_rate
        } else {
            &mut self.rate
        };
        let old = i16::from(*rate);
        let new = if *rate == NO_RATE {
            latest
        } else if old < latest {
            old + 1
        } else if old > latest + RATE_SCALE * 5 / 2 {
            latest + RATE_SCALE * 5 / 2
        } else if old > latest {
            (old + latest - 1) / 2
        } else {
            old
        };
        *rate = i8::try_from(new).unwrap_or(i8::MAX);
    }

    /// chronyd's test: the client polls more than twice as fast after a drop as after an answer.
    fn retries_faster(&self) -> bool {
        self.timeout_rate != NO_RATE
            && i16::from(self.timeout_rate) > i16::from(self.rate) + RATE_SCALE
    }
}

/// The shared per-client state. See the module's documentation.
#[derive(Debug)]
pub struct ClientTable {
    /// The limits, packed ([`RateLimit::pack`]), and what follows from them: a response's period
    /// and how far ahead of now a client's theoretical arrival time may be and still be answered,
    /// (burst − 1) periods. Replaced by [`ClientTable::set_limit`] while threads check; a check
    /// racing it may take one request by a mix of the old and the new limits.
    limit: AtomicU64,
    period: AtomicU64,
    tolerance: AtomicU64,
    sets: Box<[Set]>,
    mask: usize,
    seed: [u64; 2],
    /// Whether the leak is inverted for clients that retry faster when dropped
    /// ([`Self::relenting`]).
    relent: bool,
}

impl ClientTable {
    /// The most clients a table tracks: 2^24, as chronyd's largest client log.
    pub const MAX_CLIENTS: usize = 1 << 24;

    /// A table for `clients` addresses (rounded up to a power of two, at least 4, at most
    /// [`Self::MAX_CLIENTS`]), 32 bytes each. `seed` keys the address hash: pass random bits, so
    /// that no one can pick addresses that crowd one set.
    pub fn new(limit: RateLimit, clients: usize, seed: [u64; 2]) -> Self {
        let clients = clients.clamp(WAYS, Self::MAX_CLIENTS).next_power_of_two();
        let sets = clients / WAYS;
        let table = Self {
            limit: AtomicU64::new(0),
            period: AtomicU64::new(0),
            tolerance: AtomicU64::new(0),
            sets: (0..sets).map(|_| Set::default()).collect(),
            mask: sets - 1,
            seed,
            relent: false,
        };
        table.set_limit(limit);
        table
    }

    /// Applies `limit` from now on, to every client the table tracks (a reload of the settings):
    /// what each client has saved is kept, and earns and is spent at the new rate.
    pub fn set_limit(&self, limit: RateLimit) {
        let period = limit.period_ns();
        self.period.store(period, Relaxed);
        self.tolerance
            .store(period * (u64::from(limit.burst) - 1), Relaxed);
        self.limit.store(limit.pack(), Relaxed);
    }

    /// The same table with chronyd's NTP-only defence on: for a client whose requests come more
    /// than twice as fast after a drop as after an answer, most requests over the limit are
    /// answered (the leak inverted), since dropping them only brings more. See the module's
    /// documentation.
    pub fn relenting(mut self) -> Self {
        self.relent = true;
        self
    }

    /// The memory the table takes, in bytes.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.sets)
    }

    /// The limits the table applies.
    pub fn limit(&self) -> RateLimit {
        RateLimit::unpack(self.limit.load(Relaxed))
    }

    /// How many clients the table can track at once.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// Counts one request from `ip` at `now_ns` (monotonic nanoseconds, from the same start on
    /// every call) and says whether to answer it. Never allocates or blocks.
    pub fn check(&self, ip: IpAddr, now_ns: u64, coin: &mut Coin) -> Verdict {
        let hash = self.hash(ip);
        let key = hash | 1;
        let set = &self.sets[(hash >> 40) as usize & self.mask].0;
        let mut victim = &set[0];
        let mut earliest = u64::MAX;
        for slot in set {
            if slot.key.load(Relaxed) == key {
                if !self.relent {
                    return self.spend(&slot.tat, now_ns, coin, false);
                }
                let mut history = History::unpack(slot.history.load(Relaxed));
                history.count(now_ns);
                let verdict = self.spend(&slot.tat, now_ns, coin, history.retries_faster());
                history.dropped = verdict == Verdict::Drop;
                slot.history.store(history.pack(), Relaxed);
                return verdict;
            }
            let tat = slot.tat.load(Relaxed);
            if tat < earliest {
                earliest = tat;
                victim = slot;
            }
        }
        // A new client (or one forgotten, which had less saved than a new one gets): a full
        // burst, of which this request takes one.
        victim.key.store(key, Relaxed);
        victim
            .tat
            .store(now_ns.saturating_add(self.period.load(Relaxed)), Relaxed);
        if self.relent {
            victim.history.store(History::first(now_ns).pack(), Relaxed);
        }
        Verdict::Answer
    }

    fn spend(&self, tat: &AtomicU64, now: u64, coin: &mut Coin, relent: bool) -> Verdict {
        let mut seen = tat.load(Relaxed);
        loop {
            let from = seen.max(now);
            if from - now > self.tolerance.load(Relaxed) {
                return self.over_limit(coin, relent);
            }
            let period = self.period.load(Relaxed);
            match tat.compare_exchange_weak(seen, from + period, Relaxed, Relaxed) {
                Ok(_) => return Verdict::Answer,
                Err(now_there) => seen = now_there,
            }
        }
    }

    /// A request over the limit: leaked once in 2^leak, or with `relent` all but once in 2^leak.
    fn over_limit(&self, coin: &mut Coin, relent: bool) -> Verdict {
        let limit = self.limit();
        if coin.one_in(limit.leak) != relent {
            Verdict::Answer
        } else if limit.kod > 0 && coin.one_in(limit.kod) {
            Verdict::Kod
        } else {
            Verdict::Drop
        }
    }

    fn hash(&self, ip: IpAddr) -> u64 {
        address_hash(ip, self.seed)
    }
}

/// The keyed 64-bit hash a [`ClientTable`] made with `seed` files `ip` under: bits 40 and up
/// pick its set, and the hash with the lowest bit set is its key. An IPv4 address and its
/// IPv4-mapped IPv6 form are the same client. Both halves go through a bijective mixer, so two
/// addresses of one /64 never share a key. Public for the table chimed keeps in the driver,
/// which must file addresses the same way.
pub fn address_hash(ip: IpAddr, seed: [u64; 2]) -> u64 {
    let bits = match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().to_bits(),
        IpAddr::V6(a) => a.to_bits(),
    };
    let (high, low) = ((bits >> 64) as u64, bits as u64);
    mix(low ^ seed[1] ^ mix(high ^ seed[0]))
}

/// A bijective 64-bit finaliser (MurmurHash3's); the client log's hash too.
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    const SEC: u64 = 1_000_000_000;
    const SEED: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];

    fn v4(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))
    }

    /// Verdicts for `n` requests from `ip` at `now`, counted as (answered, kod, dropped).
    fn tally(t: &ClientTable, ip: IpAddr, now: u64, n: usize, coin: &mut Coin) -> [usize; 3] {
        let mut c = [0; 3];
        for _ in 0..n {
            c[match t.check(ip, now, coin) {
                Verdict::Answer => 0,
                Verdict::Kod => 1,
                Verdict::Drop => 2,
            }] += 1;
        }
        c
    }

    #[test]
    fn ranges_are_chronyds() {
        assert_eq!(RateLimit::new(3, 8, 2, 0), Ok(RateLimit::DEFAULT));
        assert!(RateLimit::new(-19, 1, 1, 4).is_ok());
        assert!(RateLimit::new(12, 255, 4, 0).is_ok());
        for (args, option) in [
            ((-20, 8, 2, 0), "interval"),
            ((13, 8, 2, 0), "interval"),
            ((3, 0, 2, 0), "burst"),
            ((3, 256, 2, 0), "burst"),
            ((3, 8, 0, 0), "leak"),
            ((3, 8, 5, 0), "leak"),
            ((3, 8, 2, -1), "kod"),
            ((3, 8, 2, 5), "kod"),
        ] {
            let err = RateLimit::new(args.0, args.1, args.2, args.3).unwrap_err();
            assert_eq!(err.option, option, "{args:?}");
        }
        let err = RateLimit::new(3, 300, 2, 0).unwrap_err();
        assert_eq!(err.to_string(), "burst must be 1 to 255, not 300");
        assert_eq!(
            RateLimit::DEFAULT.to_string(),
            "interval 3 burst 8 leak 2 kod 0"
        );
    }

    #[test]
    fn period_covers_the_whole_range() {
        let p = |i| RateLimit::new(i, 1, 1, 0).unwrap().period_ns();
        assert_eq!(p(0), SEC);
        assert_eq!(p(3), 8 * SEC);
        assert_eq!(p(12), 4096 * SEC);
        assert_eq!(p(-1), SEC / 2);
        assert_eq!(p(-19), 1907); // 524288 per second, as chronyd's minimum
    }

    #[test]
    fn coin_lands_at_the_asked_rate() {
        let mut coin = Coin::new(7);
        for log2 in 0..=4u8 {
            let n = 64_000;
            let hits = (0..n).filter(|_| coin.one_in(log2)).count();
            let expect = n >> log2;
            assert!(
                hits.abs_diff(expect) < expect / 20 + 10,
                "one in 2^{log2}: {hits} of {n}"
            );
        }
        assert_eq!(Coin::new(0).0, Coin::new(0x9e37_79b9_7f4a_7c15).0);
    }

    #[test]
    fn a_burst_then_one_per_interval() {
        // With no time passing, the first `burst` requests are always answered.
        let limit = RateLimit::new(0, 5, 4, 0).unwrap();
        let t = ClientTable::new(limit, 64, SEED);
        let mut coin = Coin::new(1);
        let ip = v4(1);
        for i in 0..5 {
            assert_eq!(
                t.check(ip, 10 * SEC, &mut coin),
                Verdict::Answer,
                "request {i}"
            );
        }
        // Over the limit: about one in 16 leaks, the rest are dropped (no KoD asked for).
        let [answered, kod, dropped] = tally(&t, ip, 10 * SEC, 16_000, &mut coin);
        assert_eq!(kod, 0);
        assert!((800..1200).contains(&answered), "leaked {answered}");
        assert_eq!(answered + dropped, 16_000);
        // One second later, one response has been earned back: it is answered for sure.
        assert_eq!(t.check(ip, 11 * SEC, &mut coin), Verdict::Answer);
        // After burst × interval of quiet the whole burst is back.
        for i in 0..5 {
            assert_eq!(
                t.check(ip, 20 * SEC, &mut coin),
                Verdict::Answer,
                "after quiet {i}"
            );
        }
    }

    #[test]
    fn steady_rate_is_held_to_the_interval() {
        // 100 requests a second for 60 s against one per 2 s, burst 4, leak 4 (1 in 16).
        let limit = RateLimit::new(1, 4, 4, 0).unwrap();
        let t = ClientTable::new(limit, 64, SEED);
        let mut coin = Coin::new(99);
        let (mut answered, n) = (0usize, 6000u64);
        for i in 0..n {
            if t.check(v4(9), SEC + i * SEC / 100, &mut coin) == Verdict::Answer {
                answered += 1;
            }
        }
        // Earned: 4 + 60 / 2 = 34; leaked: about (6000 − 34) / 16 = 373.
        let expect = 34 + (6000 - 34) / 16;
        assert!(
            answered.abs_diff(expect) < 60,
            "answered {answered}, expected about {expect}"
        );
    }

    #[test]
    fn kod_is_a_share_of_what_is_not_leaked() {
        let limit = RateLimit::new(3, 1, 1, 1).unwrap();
        let t = ClientTable::new(limit, 64, SEED);
        let mut coin = Coin::new(5);
        assert_eq!(t.check(v4(2), SEC, &mut coin), Verdict::Answer);
        let [answered, kod, dropped] = tally(&t, v4(2), SEC, 40_000, &mut coin);
        // Leak 1: half answered; kod 1: half of the other half.
        for (what, got, expect) in [
            ("answered", answered, 20_000),
            ("kod", kod, 10_000),
            ("dropped", dropped, 10_000),
        ] {
            assert!(got.abs_diff(expect) < 800, "{what}: {got}");
        }
    }

    #[test]
    fn clients_are_limited_apart_and_v4_mapped_is_the_same_client() {
        let limit = RateLimit::new(3, 2, 4, 0).unwrap();
        let t = ClientTable::new(limit, 1024, SEED);
        let mut coin = Coin::new(3);
        let a = v4(10);
        let a_mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 10).to_ipv6_mapped());
        assert_eq!(t.check(a, SEC, &mut coin), Verdict::Answer);
        assert_eq!(t.check(a_mapped, SEC, &mut coin), Verdict::Answer);
        // a's burst of 2 is spent: mostly dropped now, while b and an IPv6 client start fresh.
        let [answered, ..] = tally(&t, a, SEC, 1600, &mut coin);
        assert!(answered < 200, "a answered {answered} of 1600");
        for other in [v4(11), IpAddr::V6(Ipv6Addr::LOCALHOST)] {
            assert_eq!(t.check(other, SEC, &mut coin), Verdict::Answer);
            assert_eq!(t.check(other, SEC, &mut coin), Verdict::Answer);
        }
    }

    #[test]
    fn eviction_keeps_busy_clients_and_forgets_quiet_ones() {
        // A table of one set: four slots. A flooder spends its burst; then more distinct clients
        // than slots arrive, each once, long after their own arrival. The flooder's arrival time
        // is far ahead, so it is never the one evicted and stays limited.
        let limit = RateLimit::new(6, 1, 4, 0).unwrap();
        let t = ClientTable::new(limit, 4, SEED);
        assert_eq!(t.capacity(), 4);
        let mut coin = Coin::new(11);
        let flooder = v4(200);
        let [answered, ..] = tally(&t, flooder, SEC, 1000, &mut coin);
        assert!(answered < 120, "{answered}");
        for i in 0..50 {
            assert_eq!(t.check(v4(i), 2 * SEC, &mut coin), Verdict::Answer);
        }
        let [answered, ..] = tally(&t, flooder, 2 * SEC, 1600, &mut coin);
        assert!(
            answered < 200,
            "the flooder was forgotten: {answered} of 1600"
        );
    }

    #[test]
    fn table_size_is_rounded_and_bounded() {
        let l = RateLimit::DEFAULT;
        assert_eq!(ClientTable::new(l, 0, SEED).capacity(), 4);
        assert_eq!(ClientTable::new(l, 1000, SEED).capacity(), 1024);
        assert_eq!(ClientTable::new(l, 4096, SEED).capacity(), 4096);
        assert_eq!(std::mem::size_of::<Set>(), 128);
        assert_eq!(ClientTable::new(l, 4096, SEED).bytes(), 4096 * 32);
    }

    #[test]
    fn threads_share_one_limit() {
        // Two threads spend one client's burst of 100 at once, with no time passing and leak 4:
        // about 100 + 1/16 of the rest are answered, not 200 + as two private tables would.
        let limit = RateLimit::new(12, 100, 4, 0).unwrap();
        let t = ClientTable::new(limit, 64, SEED);
        let ip = v4(77);
        let answered: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|k| {
                    let t = &t;
                    s.spawn(move || tally(t, ip, SEC, 1000, &mut Coin::new(k + 1))[0])
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let expect = 100 + 1900 / 16;
        assert!(answered.abs_diff(expect) < 60, "answered {answered}");
    }

    #[test]
    fn history_packs_and_measures_rates_as_chronyd() {
        let h = History {
            last: (1 << 40) - 1,
            rate: -12,
            timeout_rate: NO_RATE,
            dropped: true,
        };
        assert_eq!(History::unpack(h.pack()), h);
        let u = 1u64 << HISTORY_SHIFT;
        // One request a second settles at rate 0; every 8 s at -12 (log2 in quarters).
        for (every, settled) in [(SEC, 0), (8 * SEC, -12), (SEC / 4, 8)] {
            let mut h = History::first(0);
            for i in 1..=60 {
                h.count(i * every);
            }
            assert_eq!(h.rate, settled, "every {every} ns");
            assert_eq!(h.timeout_rate, NO_RATE);
        }
        // Up a quarter octave a request, down halfway at once, never 2.5 octaves above the last.
        let mut h = History::first(0);
        h.count(8 * SEC);
        assert_eq!(h.rate, -12);
        h.count(9 * SEC);
        assert_eq!(h.rate, -11);
        h.count(9 * SEC + 8 * SEC);
        assert_eq!(h.rate, -12);
        // 16,000,000 units (4.7 hours) later: the latest is -56, and the rate drops at once to
        // 2.5 octaves above it, not halfway.
        h.count(9 * SEC + 8 * SEC + 16 * u * 1000 * 1000);
        assert_eq!(h.rate, -46);
        // After a drop, the next interval counts towards the timeout rate instead.
        let mut h = History::first(0);
        h.count(8 * SEC);
        h.dropped = true;
        h.count(9 * SEC);
        assert_eq!((h.rate, h.timeout_rate), (-12, 0));
        assert!(h.retries_faster());
    }

    /// A client that waits `answered` after an answer and `dropped` after a drop, for an hour
    /// against one response per 64 s, burst 1, leak 2: the share of its requests answered, and
    /// how many it sent.
    fn retrying_client(t: &ClientTable, answered: u64, dropped: u64) -> (f64, u64) {
        let mut coin = Coin::new(21);
        let (mut now, mut sent, mut ok) = (SEC, 0u64, 0u64);
        while now < 3600 * SEC {
            sent += 1;
            if t.check(v4(50), now, &mut coin) == Verdict::Drop {
                now += dropped;
            } else {
                ok += 1;
                now += answered;
            }
        }
        (ok as f64 / sent as f64, sent)
    }

    #[test]
    fn a_client_that_retries_faster_when_dropped_is_mostly_answered() {
        let limit = RateLimit::new(6, 1, 2, 0).unwrap();
        // Every 16 s when answered, every 2 s when not: more than twice as fast after a drop.
        let (plain, plain_sent) =
            retrying_client(&ClientTable::new(limit, 64, SEED), 16 * SEC, 2 * SEC);
        let relenting = ClientTable::new(limit, 64, SEED).relenting();
        let (relented, relented_sent) = retrying_client(&relenting, 16 * SEC, 2 * SEC);
        // Limited as usual, under two in five are answered (31%, of 566 requests, with this
        // seed); relenting, most are (84%), and the client sends under half as many (263).
        assert!(plain < 0.4, "plain: {plain} of {plain_sent}");
        assert!(relented > 0.6, "relenting: {relented} of {relented_sent}");
        assert!(
            relented_sent * 2 < plain_sent,
            "{relented_sent} against {plain_sent}"
        );
    }

    #[test]
    fn a_client_that_keeps_its_pace_stays_limited_when_relenting() {
        // Every 2 s whatever happens: the two rates are equal, so nothing is inverted.
        let limit = RateLimit::new(6, 1, 2, 0).unwrap();
        let relenting = ClientTable::new(limit, 64, SEED).relenting();
        let (share, sent) = retrying_client(&relenting, 2 * SEC, 2 * SEC);
        assert!(share < 0.4, "{share} of {sent}");
        // Nor does relenting change anything for a flood at one instant or a steady 100/s.
        let t = ClientTable::new(RateLimit::new(0, 5, 4, 0).unwrap(), 64, SEED).relenting();
        let mut coin = Coin::new(1);
        let [answered, ..] = tally(&t, v4(1), 10 * SEC, 16_000, &mut coin);
        assert!((800..1300).contains(&answered), "leaked {answered}");
    }

    /// New limits apply at once to the clients tracked, what each had saved kept.
    #[test]
    fn set_limit_applies_to_every_client_at_once() {
        let strict = RateLimit::new(12, 2, 4, 0).unwrap();
        let t = ClientTable::new(strict, 64, SEED);
        let mut coin = Coin::new(7);
        let [answered, ..] = tally(&t, v4(1), 0, 2, &mut coin);
        assert_eq!(answered, 2);
        let loose = RateLimit::new(12, 100, 4, 0).unwrap();
        t.set_limit(loose);
        assert_eq!(t.limit(), loose);
        let [answered, ..] = tally(&t, v4(1), 0, 98, &mut coin);
        assert_eq!(answered, 98, "the new burst not in force");
        t.set_limit(strict);
        let [answered, _, dropped] = tally(&t, v4(1), 0, 64, &mut coin);
        assert!(answered < 16 && dropped > 48, "{answered} {dropped}");
    }
}
