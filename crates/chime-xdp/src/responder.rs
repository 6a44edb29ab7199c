//! The XDP program that answers plain NTP in the driver, and the state it answers from.
//!
//! It is the steering program of `bpf` with one more route: a frame to an NTP address that is a
//! plain client request (48 bytes of UDP payload, NTP version 1–4, mode 3) is answered where it
//! arrived. The program writes the reply over the request, as chime-ntp's `respond` writes it on
//! the socket path, and sends it back out of the interface with `XDP_TX`: Ethernet, IP and UDP
//! addresses swapped, the IP header's fields as the AF_XDP path's replies have them (IPv4 TOS 0,
//! identification 0, Don't Fragment; TTL and hop limit 64, Linux's default), and both checksums
//! made anew. The reply is the request's frame, so it is never larger than the request.
//!
//! Everything else goes where the steering program sends it, unchanged: to the AF_XDP socket of
//! its queue, or to the kernel. So does every request this program cannot answer as chimed's
//! workers would:
//! - requests with extension fields or a MAC (any payload but 48 bytes), NTPv5, versions 0 and
//!   5–7, modes other than 3;
//! - a request whose origin timestamp has the receive mark (the lowest bit; see chime-ntp's
//!   `interleave`): an interleaved-mode request, whose answer needs the transmit time chimed
//!   saved for the previous reply;
//! - a request asking to upgrade to NTPv5 (reference timestamp `NTP5DRFT`), which chimed
//!   answers with the mark echoed when it speaks v5;
//! - frames whose IPv4 header checksum or UDP checksum is wrong, whose lengths do not match the
//!   frame's, or with bytes after the datagram: the AF_XDP worker drops and counts those;
//! - every request while [`DriverState`] does not say the in-driver path is on (a leap second
//!   announced), or while its leap smear's window is open ([`SMEAR`]).
//!
//! A request it would answer from a source the allow/deny rules deny (`access`,
//! [`DriverMaps::set_access`]) is dropped, as chimed's workers drop it.
//!
//! The server's side of the reply comes from one [`DriverState`], which the program's loader
//! keeps up to date through [`DriverMaps`]: each state is written once into a map of its own, then
//! put in the one slot of an array of maps the program looks it up through, so a reply never mixes
//! two states. The program counts what it does with each frame to a served address by
//! [`DriverOutcome`] in a per-CPU array, which [`DriverMaps::counts`] sums. The program reads the
//! clock with `bpf_ktime_get_tai_ns` (`CLOCK_TAI`, the only clock of the time of day a program can
//! read) less the TAI offset the state holds: that is `CLOCK_REALTIME`, the clock chimed's workers
//! read. It ages the state exactly as chime-ntp's `ServerState::served_at` does (the root
//! dispersion grows with the time since the last good poll and with the followed offset's error
//! bound; past the stale time the reply says unsynchronised), and serves the time chimed follows
//! (`ServedClock::serve`: an offset, and a rate applied for at most 16 s from its anchor).
//!
//! With [`DriverLimits`] on, each request it would answer first goes through its rate limiter
//! (`ratelimit`), chime-ntp's `ClientTable` as chimed's NTP workers use it: answered as above,
//! with the poll the limit suggests; answered with a Kiss-o'-Death RATE; or dropped there
//! (`XDP_DROP`). The rules come first: a denied request spends nothing of its burst.
//!
//! In timezone-offset mode ([`ZONE`], [`DriverZone`]) the receive and transmit times are shifted
//! by the zone's offset at the second each names, as chime-ntp's `ZoneShift` shifts them.

use std::io;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::asm::*;
use crate::bpf::{self, CTX, DATA, DATA_END, ETH_LEN, IPV4_LEN, IPV6_LEN, Route, Target, UDP_LEN};

mod access;
mod ratelimit;

pub use access::DriverRule;
use access::{ALLOW, FAMILY_BITS, FAMILY_V4, FAMILY_V6};

pub use ratelimit::DriverLimits;

/// The in-driver path is on. Its writer sets it only when nothing it does to a reply is left out
/// of this program (for chimed: no leap smear; the client log does not see these replies), and
/// [`DriverState::new`] clears it when the state cannot be served exactly (a leap warning or a
/// leap second announced; values past the ranges the program's arithmetic holds exactly). Until
/// a state is set, nothing is answered.
pub const ANSWER: u32 = 1 << 0;
/// The state is synchronised and was updated at least once (it is still unsynchronised once it
/// is older than its stale time).
pub const SYNCHRONISED: u32 = 1 << 1;
/// The served time's rate is negative.
pub const RATE_NEGATIVE: u32 = 1 << 2;
/// Timezone-offset mode: each timestamp the program writes is shifted by the zone's offset
/// ([`DriverZone`]).
pub const ZONE: u32 = 1 << 3;
/// A leap smear's window is set ([`DriverInput::smear`]): within it every request goes to the
/// workers, which smear.
pub const SMEAR: u32 = 1 << 4;

/// Timezone-offset mode's zone as the program shifts by it: its UTC offset now and, if it
/// changes ahead, when and to what. Each timestamp is shifted by the offset at the second it
/// names, as chime-ntp's `ZoneShift::apply` shifts it; the reference timestamp is the caller's to
/// shift (it is written as given).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverZone {
    /// The offset now, seconds east of UTC.
    pub offset: i32,
    /// The next transition: the NTP second (era 0, modulo 2^32) from which `after` holds, and
    /// `after`; `None` when the zone has none ahead.
    pub change: Option<(u32, i32)>,
}

/// What chimed knows about the clock it serves, in plain numbers, for [`DriverState::new`]: its
/// `ServerState`, its `StalePolicy` and the kernel's TAI offset.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DriverInput {
    /// chimed allows answers in the driver (see [`ANSWER`]).
    pub answer: bool,
    /// Leap indicator, 0–3.
    pub leap: u8,
    /// A leap second is announced (`ServerState::announced`).
    pub leap_announced: bool,
    /// Stratum.
    pub stratum: u8,
    /// Precision, log2 seconds.
    pub precision: i8,
    /// Reference ID.
    pub reference_id: [u8; 4],
    /// The reference timestamp, NTP 32.32.
    pub reference_ts: u64,
    /// Root delay as mirrored, in NTP's short format (2^-16 s).
    pub root_delay: u32,
    /// Root dispersion as mirrored, in NTP's short format.
    pub root_dispersion: u32,
    /// The local time (NTP 32.32) of the last good upstream reply; `None` before the first.
    pub updated: Option<u64>,
    /// `StalePolicy::stale_after`, nanoseconds.
    pub stale_after_ns: u64,
    /// `StalePolicy::dispersion_rate`, seconds per second.
    pub dispersion_rate: f64,
    /// The followed clock's (`ServedClock`) anchor, local NTP 32.32.
    pub anchor: u64,
    /// Its offset at the anchor, seconds.
    pub offset: f64,
    /// Its rate, seconds per second.
    pub rate: f64,
    /// Its error bound at the anchor, seconds.
    pub error: f64,
    /// How fast that grows away from the anchor, seconds per second.
    pub error_rate: f64,
    /// `CLOCK_TAI` less `CLOCK_REALTIME`, seconds: the kernel's TAI offset (0 while unset).
    pub tai_offset: i64,
    /// Timezone-offset mode's zone, when that mode is on.
    pub zone: Option<DriverZone>,
    /// With a leap smear: the local times (NTP 32.32) from and until which the smear may change
    /// what a reply says, within which the program answers nothing and hands every request to
    /// the workers. Outside it a smear changes nothing in a reply (a leap warning, which it
    /// would hide, already turns [`ANSWER`] off).
    pub smear: Option<(u64, u64)>,
}

/// The map's one value, as the program reads it: the reply's fields in the forms it writes them,
/// and the numbers it ages them and reads the time with, in fixed point.
///
/// [`DriverMaps::set_state`] writes each one into a map of its own before the program can see it,
/// and never writes it again, so a reply never mixes two states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DriverState {
    /// [`ANSWER`], [`SYNCHRONISED`], [`RATE_NEGATIVE`], [`ZONE`], [`SMEAR`].
    pub flags: u32,
    /// The leap indicator where the reply's first byte has it (`leap << 6`).
    pub leap: u8,
    /// Stratum.
    pub stratum: u8,
    /// Precision, log2 seconds.
    pub precision: i8,
    _reserved: u8,
    /// Root delay in network order, as the reply carries it.
    pub root_delay: [u8; 4],
    /// Reference ID, as the reply carries it.
    pub reference_id: [u8; 4],
    /// Root dispersion as mirrored, 2^-16 s.
    pub root_dispersion: u32,
    _reserved_2: u32,
    /// The reference timestamp in network order.
    pub reference_ts: [u8; 8],
    /// The local time (NTP 32.32) of the last good upstream reply.
    pub updated: u64,
    /// The stale time, 2^-32 s.
    pub stale_after: u64,
    /// Root dispersion grown per second of the state's age, 2^-48 s per second.
    pub dispersion_rate: u64,
    /// The followed offset's error bound at its anchor, 2^-48 s.
    pub error: u64,
    /// Its growth per second of distance from the anchor, 2^-48 s per second.
    pub error_rate: u64,
    /// The followed clock's anchor, local NTP 32.32.
    pub anchor: u64,
    /// Its offset at the anchor, 2^-32 s.
    pub offset: i64,
    /// The size of its rate, 2^-32 s per second; its sign is [`RATE_NEGATIVE`].
    pub rate: u64,
    /// `CLOCK_TAI` less `CLOCK_REALTIME`, nanoseconds (subtracted modulo 2^64).
    pub tai_offset: u64,
    /// With [`ZONE`]: the zone's offset before [`Self::zone_change`], in 2^-32 s (added modulo
    /// 2^64).
    pub zone_before: u64,
    /// The zone's offset from [`Self::zone_change`] on, likewise.
    pub zone_after: u64,
    /// The NTP second (modulo 2^32) from which [`Self::zone_after`] holds: a timestamp whose
    /// seconds are this or up to 2^31 later takes it.
    pub zone_change: u32,
    _reserved_3: u32,
    /// With [`SMEAR`]: the local time (NTP 32.32) the smear's window opens at.
    pub smear_from: u64,
    /// And the one it closes at.
    pub smear_until: u64,
}

/// Ages up to this (2^46 units of 2^-32 s, 16384 s) are multiplied exactly (see [`mul_q32`]).
const MAX_AGE: u64 = 1 << 46;
/// Rates below this (2^48 in their fixed point: 1 s/s for dispersion, 65536 s/s for the
/// served time's) are multiplied exactly.
const MAX_RATE: u64 = 1 << 48;
/// Error bounds below this (2^62 units of 2^-48 s, 16384 s) leave the sum room not to wrap.
const MAX_ERROR: u64 = 1 << 62;

/// `x` seconds in units of 2^-`bits` s, rounded, if it is finite, not negative and below `max`.
fn fixed(x: f64, bits: i32, max: u64) -> Option<u64> {
    let v = (x * 2f64.powi(bits)).round();
    (v >= 0.0 && v < max as f64).then_some(v as u64)
}

impl DriverState {
    /// The state for `s`, with [`ANSWER`] cleared where the program could not serve it as the
    /// workers would.
    pub fn new(s: &DriverInput) -> Self {
        let stale_after = (u128::from(s.stale_after_ns) << 32) / 1_000_000_000;
        let dispersion_rate = fixed(s.dispersion_rate, 48, MAX_RATE);
        let error = fixed(s.error, 48, MAX_ERROR);
        let error_rate = fixed(s.error_rate, 48, MAX_RATE);
        let rate = fixed(s.rate.abs(), 32, MAX_RATE);
        let updated = s.updated.unwrap_or(0);
        // How far from the anchor an age within the stale time can be.
        let from_anchor = u128::from((updated.wrapping_sub(s.anchor) as i64).unsigned_abs());
        let in_range = stale_after < u128::from(MAX_AGE)
            && (error_rate == Some(0) || from_anchor + stale_after < u128::from(MAX_AGE))
            && dispersion_rate.is_some()
            && error.is_some()
            && error_rate.is_some()
            && rate.is_some()
            && s.offset.abs() < f64::from(1u32 << 31);
        let warns = matches!(s.leap, 1 | 2) || s.leap_announced;
        let synchronised = s.updated.is_some() && s.leap < 3 && (1..=15).contains(&s.stratum);
        let mut flags = 0;
        if s.answer && in_range && !warns {
            flags |= ANSWER;
        }
        if synchronised {
            flags |= SYNCHRONISED;
        }
        if s.rate < 0.0 {
            flags |= RATE_NEGATIVE;
        }
        if s.zone.is_some() {
            flags |= ZONE;
        }
        if s.smear.is_some() {
            flags |= SMEAR;
        }
        let (smear_from, smear_until) = s.smear.unwrap_or_default();
        let zone = s.zone.unwrap_or_default();
        // No change ahead: the same offset either side of a change half the NTP era away.
        let (zone_change, after) = zone.change.unwrap_or((0, zone.offset));
        let shift = |secs: i32| (i64::from(secs) << 32) as u64;
        Self {
            flags,
            leap: (s.leap & 3) << 6,
            stratum: s.stratum,
            precision: s.precision,
            _reserved: 0,
            root_delay: s.root_delay.to_be_bytes(),
            reference_id: s.reference_id,
            root_dispersion: s.root_dispersion,
            _reserved_2: 0,
            reference_ts: s.reference_ts.to_be_bytes(),
            updated,
            stale_after: stale_after.min(u128::from(u64::MAX)) as u64,
            dispersion_rate: dispersion_rate.unwrap_or(0),
            error: error.unwrap_or(0),
            error_rate: error_rate.unwrap_or(0),
            anchor: s.anchor,
            // As `ServedClock::serve`, truncated to the 2^-32 s below.
            offset: (s.offset * 4_294_967_296.0) as i64,
            rate: rate.unwrap_or(0),
            tai_offset: s.tai_offset.wrapping_mul(1_000_000_000) as u64,
            zone_before: shift(zone.offset),
            zone_after: shift(after),
            zone_change,
            _reserved_3: 0,
            smear_from,
            smear_until,
        }
    }
}

/// What the answering program did with a frame to a served address: answered it, dropped it
/// ([`Self::Denied`]), or the first reason it found to hand it on to the AF_XDP socket. Frames for
/// the kernel are not counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverOutcome {
    /// Answered in the driver (`XDP_TX`).
    Answered,
    /// To a served address that is not NTP's (Roughtime's).
    NotNtp,
    /// Not exactly a frame of 48 bytes of UDP payload: extension fields, a MAC, anything after
    /// the datagram.
    Length,
    /// Length fields that disagree with the frame, or a checksum that does not hold.
    Malformed,
    /// Not a client request (mode 3).
    Mode,
    /// NTP version 0, or 5 to 7.
    Version,
    /// The interleaved form: the origin timestamp has the receive mark.
    Interleaved,
    /// A request to upgrade to NTPv5.
    Upgrade,
    /// The state says not to answer, or no state was written yet, or a leap smear's window is
    /// open.
    Off,
    /// A request it would answer from a source the rules ([`DriverMaps::set_access`]) deny:
    /// dropped (`XDP_DROP`), as chimed's workers drop it, unanswered.
    Denied,
    /// Over the rate limit ([`DriverLimits`]), answered with a Kiss-o'-Death RATE (`XDP_TX`).
    Kod,
    /// Over the rate limit, neither leaked nor kissed: dropped (`XDP_DROP`).
    RateLimited,
}

impl DriverOutcome {
    /// Every outcome, in the order of their counters.
    pub const ALL: [Self; 12] = [
        Self::Answered,
        Self::NotNtp,
        Self::Length,
        Self::Malformed,
        Self::Mode,
        Self::Version,
        Self::Interleaved,
        Self::Upgrade,
        Self::Off,
        Self::Denied,
        Self::Kod,
        Self::RateLimited,
    ];

    /// Its name, for metrics' labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::NotNtp => "not_ntp",
            Self::Length => "length",
            Self::Malformed => "malformed",
            Self::Mode => "mode",
            Self::Version => "version",
            Self::Interleaved => "interleaved",
            Self::Upgrade => "upgrade",
            Self::Off => "off",
            Self::Denied => "denied",
            Self::Kod => "kod",
            Self::RateLimited => "rate_limited",
        }
    }
}

/// The answering program's maps: the slot its state is looked up through, the slot of its
/// allow/deny rules, and its counters.
#[derive(Debug)]
pub struct DriverMaps {
    /// An array of maps of one slot, each map put there holding one [`DriverState`].
    state: OwnedFd,
    /// An array of maps of one slot, empty or holding the trie of the rules in force (`access`).
    pub(crate) access: OwnedFd,
    /// [`DriverOutcome`]'s counters, per CPU.
    counts: OwnedFd,
    /// CPUs the kernel keeps a counter for.
    cpus: usize,
    /// The rate limiter's table and limits.
    limiter: ratelimit::Limiter,
}

impl DriverMaps {
    /// Makes the maps: no state yet (nothing answered), no rules (every source answered), every
    /// count zero, a rate limiter's table for `clients` addresses (see [`Self::set_limits`])
    /// keyed by random bits, its limits off.
    pub(crate) fn new(clients: usize) -> io::Result<Self> {
        Self::with_seed(clients, ratelimit::random_seed()?)
    }

    /// [`Self::new`] with the rate limiter's address hash keyed by `seed`.
    pub(crate) fn with_seed(clients: usize, seed: [u64; 2]) -> io::Result<Self> {
        let template = bpf::create_array("chimed_ntp", size_of::<DriverState>())?;
        Ok(Self {
            state: bpf::create_map_of_one("chimed_ntp_slot", &template)?,
            access: bpf::create_map_of_one("chimed_acl_slot", &access::trie(1)?)?,
            counts: bpf::create_percpu_counters(
                "chimed_ntp_outc",
                DriverOutcome::ALL.len() as u32,
            )?,
            cpus: bpf::possible_cpus()?,
            limiter: ratelimit::Limiter::new(clients, seed)?,
        })
    }

    /// The rate limiter's maps, for the program.
    pub(crate) fn limiter(&self) -> ratelimit::LimiterFds {
        self.limiter.fds()
    }

    /// Puts `limits` in force for every request checked from now on ([`DriverLimits::OFF`]: none
    /// limited). What each client has saved is kept, as chime-ntp's `ClientTable::set_limit`
    /// keeps it.
    pub fn set_limits(&self, limits: &DriverLimits) -> io::Result<()> {
        self.limiter.set_limits(limits)
    }

    /// How many client addresses the rate limiter's table tracks at once.
    pub fn clients_capacity(&self) -> usize {
        self.limiter.capacity()
    }

    /// The memory the rate limiter's table takes in the kernel, bytes.
    pub fn clients_bytes(&self) -> usize {
        self.limiter.bytes()
    }

    /// Set `index` of the rate limiter's table: each of its four slots' key, theoretical arrival
    /// time and history, as chime-ntp's `ClientTable` lays them out. For tests.
    pub fn client_set(&self, index: u32) -> io::Result<[[u64; 3]; 4]> {
        self.limiter.set(index)
    }

    /// The file descriptors the program is assembled with: the state's slot and the counters.
    pub(crate) fn fds(&self) -> (RawFd, RawFd) {
        (self.state.as_raw_fd(), self.counts.as_raw_fd())
    }

    /// Makes `state` the one the program answers from: written into a new map, which then
    /// replaces the last in the slot. A frame answered meanwhile has the last state or this one,
    /// whole: the kernel frees the last map only once no program can still be reading it (RCU),
    /// and nothing writes a map after it is in the slot. (Two entries and an index of the live one
    /// would leave an entry being rewritten while a reader that took the index two writes ago
    /// still reads it; only timing would rule that out.)
    pub fn set_state(&self, state: &DriverState) -> io::Result<()> {
        let map = bpf::create_array("chimed_ntp", size_of::<DriverState>())?;
        bpf::update_elem(&map, 0, state)?;
        bpf::update_elem(&self.state, 0, &(map.as_raw_fd() as u32))
    }

    /// The totals over every CPU, by outcome, in [`DriverOutcome::ALL`]'s order.
    pub fn counts(&self) -> io::Result<Vec<(DriverOutcome, u64)>> {
        (DriverOutcome::ALL.iter())
            .map(|&o| {
                Ok((
                    o,
                    bpf::sum_percpu_counter(&self.counts, o as u32, self.cpus)?,
                ))
            })
            .collect()
    }
}

/// Where a field of [`DriverState`] is (`offset_of!`), for the program's loads.
fn state_at(offset: usize) -> i16 {
    offset as i16
}

/// Registers of the answering path, beside `bpf`'s [`CTX`] and `RX_MONO`, which it keeps until
/// it is committed to answering: the state, and the NTP payload (the request, then the reply).
const STATE: Reg = R7;
const NTP: Reg = R8;

// Stack slots (offsets from the frame pointer).
const KEY: i16 = -4;
/// The [`DriverOutcome`] to count.
const OUTCOME: i16 = -8;
/// 4 or 6: which family's headers finish the reply.
const FAMILY: i16 = -16;
/// The local clock at the request's arrival, NTP 32.32.
const LOCAL: i16 = -24;
/// The served time less the local clock, 2^-32 s.
const DELTA: i16 = -32;

// The NTP header's fields (RFC 5905 §7.3).
const LVM: i16 = 0;
const STRATUM: i16 = 1;
const PRECISION: i16 = 3;
const ROOT_DELAY: i16 = 4;
const ROOT_DISPERSION: i16 = 8;
const REFERENCE_ID: i16 = 12;
const REFERENCE_TS: i16 = 16;
const ORIGIN_TS: i16 = 24;
const RECEIVE_TS: i16 = 32;
const TRANSMIT_TS: i16 = 40;
const NTP_LEN: i16 = 48;

/// The frames answered: Ethernet + IPv4 or IPv6 + UDP + 48 bytes, and nothing after.
const V4_FRAME: i16 = ETH_LEN + IPV4_LEN + UDP_LEN + NTP_LEN;
const V6_FRAME: i16 = ETH_LEN + IPV6_LEN + UDP_LEN + NTP_LEN;
/// The UDP length of a 48-byte payload.
const UDP_NTP_LEN: u16 = (UDP_LEN + NTP_LEN) as u16;

/// Seconds from 1900 (NTP's epoch) to 1970 (Unix's).
const UNIX_EPOCH_IN_NTP: i32 = 0x83aa_7e80_u32 as i32;
/// `ServedClock::HOLD`, 16 s, in 2^-32 s: the rate is applied no further from the anchor.
const HOLD: u64 = 16 << 32;
/// The pseudo-header's protocol (17) and the UDP length (56), as the two network-order 16-bit
/// words they are, loaded as one little-endian word: how every other word is summed.
const PSEUDO_REST: i32 = (((UDP_NTP_LEN.swap_bytes() as u32) << 16) | 0x1100) as i32;
/// The reference timestamp of a request to upgrade to NTPv5 (chime-ntp's `v5::UPGRADE`).
const UPGRADE: [u8; 8] = *b"NTP5DRFT";

/// Assembles the answering program for `targets`, of which those in `ntp` are answered in the
/// driver, through the XSKMAP `xsks`, the state's slot `state` and the counters `counts`
/// ([`DriverMaps::fds`]), the rules' slot `rules` ([`DriverMaps::access_fd`]) and the rate
/// limiter's maps `limiter` ([`DriverMaps::limiter`]).
pub(crate) fn program(
    xsks: RawFd,
    (state, counts): (RawFd, RawFd),
    rules: RawFd,
    limiter: ratelimit::LimiterFds,
    targets: &[Target],
    ntp: &[Target],
) -> Vec<Insn> {
    let mut a = Asm::default();
    let pass = a.label();
    let abort = a.label();
    let v4 = a.label();
    let v6 = a.label();
    let answer = a.label();
    let hand_on = HandOn(std::array::from_fn(|_| a.label()));
    let routes: Vec<Route> = (targets.iter())
        .map(|&target| {
            let ours = ntp.contains(&target);
            let other = hand_on.to(DriverOutcome::NotNtp);
            Route {
                target,
                v4: if ours { v4 } else { other },
                v6: if ours { v6 } else { other },
            }
        })
        .collect();
    bpf::frame_to_target(&mut a, &routes, pass);
    // A family no NTP target is of has no frames to check: its checks would be unreachable code,
    // which the verifier refuses.
    let serves = |v6: bool| (ntp.iter()).any(|(ip, _)| ip.is_none_or(|ip| ip.is_ipv6() == v6));
    if serves(false) {
        a.place(v4);
        ipv4_request(&mut a, &hand_on, answer);
    }
    if serves(true) {
        a.place(v6);
        ipv6_request(&mut a, &hand_on, answer);
    }
    a.place(answer);
    ntp_request(&mut a, state, &hand_on);
    allowed(&mut a, rules, counts);
    a.st(Size::W, FP, OUTCOME, DriverOutcome::Answered as i32);
    ratelimit::check(&mut a, limiter, counts);
    reply(&mut a, counts, abort);
    // Each reason to hand a frame on: counted, then to the socket. Without a target but NTP's,
    // nothing jumps to `NotNtp`'s, which the verifier would refuse as unreachable.
    let counted = a.label();
    let others = targets.iter().any(|t| !ntp.contains(t));
    for o in &DriverOutcome::ALL[1..] {
        if *o == DriverOutcome::NotNtp && !others
            || matches!(o, DriverOutcome::Kod | DriverOutcome::RateLimited)
        {
            continue;
        }
        // Dropped, not handed on: `allowed` counts it.
        if *o == DriverOutcome::Denied {
            continue;
        }
        a.place(hand_on.to(*o));
        a.st(Size::W, FP, OUTCOME, *o as i32);
        a.ja(counted);
    }
    a.place(counted);
    count(&mut a, counts);
    bpf::to_socket(&mut a, xsks, pass);
    a.place(pass);
    a.exit_with(XDP_PASS);
    a.place(abort);
    a.exit_with(XDP_ABORTED);
    a.finish()
}

/// Where the program jumps to hand a frame on for each [`DriverOutcome`] but `Answered`.
struct HandOn([Label; DriverOutcome::ALL.len()]);

impl HandOn {
    fn to(&self, o: DriverOutcome) -> Label {
        self.0[o as usize]
    }
}

/// Adds one to the counter of the [`DriverOutcome`] at [`OUTCOME`] in the per-CPU map `counts`,
/// clobbering r0–r5. Per CPU, so a plain add: no other CPU writes this CPU's counter, and a
/// program runs to its end on one CPU.
fn count(a: &mut Asm, counts: RawFd) {
    let done = a.label();
    a.ld_map(R1, counts);
    a.lookup(OUTCOME);
    a.jmp_k(JEQ, R0, 0, done);
    a.ldx(Size::DW, R1, R0, 0);
    a.alu_k(ADD, R1, 1);
    a.stx(Size::DW, R0, 0, R1);
    a.place(done);
}

/// An IPv4 datagram of 48 bytes whose lengths and checksums hold goes on to `answer`, with
/// [`NTP`] at its payload; anything else is handed on.
fn ipv4_request(a: &mut Asm, hand_on: &HandOn, answer: Label) {
    let malformed = hand_on.to(DriverOutcome::Malformed);
    exactly(a, V4_FRAME, hand_on.to(DriverOutcome::Length));
    a.ldx(Size::H, R4, DATA, ETH_LEN + 2);
    a.jmp32_k(
        JNE,
        R4,
        i32::from((IPV4_LEN as u16 + UDP_NTP_LEN).swap_bytes()),
        malformed,
    );
    a.ldx(Size::H, R4, DATA, ETH_LEN + IPV4_LEN + 4);
    a.jmp32_k(JNE, R4, i32::from(UDP_NTP_LEN.swap_bytes()), malformed);
    // The header checksum: its words, checksum included, sum to all ones.
    a.mov_imm(R0, 0);
    sum_words(a, ETH_LEN..ETH_LEN + IPV4_LEN);
    fold(a);
    a.jmp32_k(JNE, R0, 0xffff, malformed);
    // The UDP checksum, where there is one (zero is none, which IPv4 allows).
    let checked = a.label();
    a.ldx(Size::H, R4, DATA, ETH_LEN + IPV4_LEN + 6);
    a.jmp32_k(JEQ, R4, 0, checked);
    a.mov_imm(R0, PSEUDO_REST);
    // The addresses (the pseudo-header's), then the datagram.
    sum_words(a, ETH_LEN + 12..V4_FRAME);
    fold(a);
    a.jmp32_k(JNE, R0, 0xffff, malformed);
    a.place(checked);
    a.mov(NTP, DATA);
    a.alu_k(ADD, NTP, i32::from(ETH_LEN + IPV4_LEN + UDP_LEN));
    a.mov_imm(R1, 4);
    a.stx(Size::DW, FP, FAMILY, R1);
    a.ja(answer);
}

/// [`ipv4_request`] for IPv6, where the UDP checksum is mandatory.
fn ipv6_request(a: &mut Asm, hand_on: &HandOn, answer: Label) {
    let malformed = hand_on.to(DriverOutcome::Malformed);
    exactly(a, V6_FRAME, hand_on.to(DriverOutcome::Length));
    a.ldx(Size::H, R4, DATA, ETH_LEN + 4);
    a.jmp32_k(JNE, R4, i32::from(UDP_NTP_LEN.swap_bytes()), malformed);
    a.ldx(Size::H, R4, DATA, ETH_LEN + IPV6_LEN + 4);
    a.jmp32_k(JNE, R4, i32::from(UDP_NTP_LEN.swap_bytes()), malformed);
    a.mov_imm(R0, PSEUDO_REST);
    sum_words(a, ETH_LEN + 8..V6_FRAME);
    fold(a);
    a.jmp32_k(JNE, R0, 0xffff, malformed);
    a.mov(NTP, DATA);
    a.alu_k(ADD, NTP, i32::from(ETH_LEN + IPV6_LEN + UDP_LEN));
    a.mov_imm(R1, 6);
    a.stx(Size::DW, FP, FAMILY, R1);
    a.ja(answer);
}

/// Goes to `to` unless the frame is exactly `len` bytes: a frame with anything after the
/// datagram (Ethernet padding, or a lie in its lengths) is the AF_XDP worker's to judge.
fn exactly(a: &mut Asm, len: i16, to: Label) {
    a.check_len(R4, DATA, DATA_END, i32::from(len), to);
    a.jmp_x(JLT, R4, DATA_END, to);
}

/// Adds the 32-bit words of the frame in `range` (from [`DATA`]), loaded little-endian, to `R0`,
/// clobbering `R4`. A ones'-complement sum of network-order 16-bit words is the byte-swapped sum
/// of the same words loaded little-endian (RFC 1071 §2(B)), and storing the folded result
/// little-endian swaps it back: so the checksums are summed, checked and written without a swap.
fn sum_words(a: &mut Asm, range: std::ops::Range<i16>) {
    debug_assert!(range.len().is_multiple_of(4));
    for off in range.step_by(4) {
        a.ldx(Size::W, R4, DATA, off);
        a.alu_x(ADD, R0, R4);
    }
}

/// Folds the 64-bit sum in `R0` to 16 bits with end-around carries, clobbering `R4`: all
/// ones for a datagram whose checksum holds.
fn fold(a: &mut Asm) {
    a.mov(R4, R0);
    a.alu_k(RSH, R4, 32);
    a.zext32(R0);
    a.alu_x(ADD, R0, R4);
    // Below 2^33; then below 2^17 + 2^16; then at most 0x10001; then at most 0xffff.
    for _ in 0..3 {
        a.mov(R4, R0);
        a.alu_k(RSH, R4, 16);
        a.alu_k(AND, R0, 0xffff);
        a.alu_x(ADD, R0, R4);
    }
}

/// The NTP checks, then the state: a client request (version 1–4, mode 3) that is not in the
/// interleaved form and does not ask to upgrade, while the state in the slot `state` says to
/// answer, goes on with [`STATE`] at that state; any other is handed on.
fn ntp_request(a: &mut Asm, state: RawFd, hand_on: &HandOn) {
    use DriverOutcome::*;
    a.ldx(Size::B, R1, NTP, LVM);
    a.mov(R2, R1);
    a.alu_k(AND, R2, 0x07);
    a.jmp32_k(JNE, R2, 3, hand_on.to(Mode));
    a.alu_k(RSH, R1, 3);
    a.alu_k(AND, R1, 0x07);
    a.jmp32_k(JEQ, R1, 0, hand_on.to(Version));
    a.jmp32_k(JGT, R1, 4, hand_on.to(Version));
    // The receive mark in the origin timestamp: the interleaved form.
    a.ldx(Size::B, R1, NTP, ORIGIN_TS + 7);
    a.jmp_k(JSET, R1, 1, hand_on.to(Interleaved));
    a.ldx(Size::DW, R1, NTP, REFERENCE_TS);
    a.ld_imm64(R2, u64::from_ne_bytes(UPGRADE));
    a.jmp_x(JEQ, R1, R2, hand_on.to(Upgrade));
    // The map in the slot, then its state: the map is never written once there, so every field
    // read below is of the one state.
    a.st(Size::W, FP, KEY, 0);
    a.ld_map(R1, state);
    a.lookup(KEY);
    a.jmp_k(JEQ, R0, 0, hand_on.to(Off));
    a.mov(R1, R0);
    a.lookup(KEY);
    a.jmp_k(JEQ, R0, 0, hand_on.to(Off));
    a.mov(STATE, R0);
    a.ldx(Size::W, R1, STATE, state_at(offset_of!(DriverState, flags)));
    a.alu_k(AND, R1, ANSWER as i32);
    a.jmp_k(JEQ, R1, 0, hand_on.to(Off));
    outside_smear(a, hand_on.to(Off));
}

/// With [`SMEAR`], hands the request on to `off` while the local clock is within the smear's
/// window (each end compared as a wrapping difference). Clobbers r0–r5.
fn outside_smear(a: &mut Asm, off: Label) {
    let outside = a.label();
    a.ldx(Size::W, R1, STATE, state_at(offset_of!(DriverState, flags)));
    a.alu_k(AND, R1, SMEAR as i32);
    a.jmp_k(JEQ, R1, 0, outside);
    local_now(a, R0);
    a.ldx(
        Size::DW,
        R1,
        STATE,
        state_at(offset_of!(DriverState, smear_from)),
    );
    a.mov(R2, R0);
    a.alu_x(SUB, R2, R1);
    a.jmp_k(JSLT, R2, 0, outside);
    a.ldx(
        Size::DW,
        R1,
        STATE,
        state_at(offset_of!(DriverState, smear_until)),
    );
    a.alu_x(SUB, R1, R0);
    a.jmp_k(JSGE, R1, 0, off);
    a.place(outside);
}

/// Where the key of the rules' trie is built: [`access::Key`], 24 bytes, below the rate
/// limiter's slots.
const ACL_KEY: i16 = -144;

/// The allow/deny rules: with rules in the slot `rules`, a request from a source they deny is
/// counted [`DriverOutcome::Denied`] and dropped; any other goes on to be answered. The source
/// address is read at its place before the payload at [`NTP`]; an IPv4-mapped IPv6 source is
/// looked up as the IPv4 address it stands for. Clobbers r0–r5.
fn allowed(a: &mut Asm, rules: RawFd, counts: RawFd) {
    const V4_SOURCE: i16 = -(UDP_LEN + IPV4_LEN) + 12;
    const V6_SOURCE: i16 = -(UDP_LEN + IPV6_LEN) + 8;
    let answer = a.label();
    let v6 = a.label();
    let v4_at = a.label();
    let look_up = a.label();
    // The trie in the slot; none while there are no rules.
    a.st(Size::W, FP, KEY, 0);
    a.ld_map(R1, rules);
    a.lookup(KEY);
    a.jmp_k(JEQ, R0, 0, answer);
    // The key: every byte written, as the verifier wants of a key on the stack.
    a.st(Size::DW, FP, ACL_KEY + 8, 0);
    a.st(Size::DW, FP, ACL_KEY + 16, 0);
    a.ldx(Size::DW, R1, FP, FAMILY);
    a.jmp_k(JNE, R1, 4, v6);
    a.ldx(Size::W, R1, NTP, V4_SOURCE);
    a.ja(v4_at);
    // IPv6: ::ffff:0:0/96 is the IPv4 address in its last 4 bytes.
    a.place(v6);
    let plain = a.label();
    a.ldx(Size::DW, R1, NTP, V6_SOURCE);
    a.jmp_k(JNE, R1, 0, plain);
    a.ldx(Size::W, R1, NTP, V6_SOURCE + 8);
    a.jmp32_k(JNE, R1, i32::from_ne_bytes([0, 0, 0xff, 0xff]), plain);
    a.ldx(Size::W, R1, NTP, V6_SOURCE + 12);
    a.place(v4_at);
    a.stx(Size::W, FP, ACL_KEY + 8, R1);
    a.st(Size::W, FP, ACL_KEY, (FAMILY_BITS + 32) as i32);
    a.st(Size::W, FP, ACL_KEY + 4, i32::from_ne_bytes(FAMILY_V4));
    a.ja(look_up);
    a.place(plain);
    a.ldx(Size::DW, R1, NTP, V6_SOURCE);
    a.stx(Size::DW, FP, ACL_KEY + 8, R1);
    a.ldx(Size::DW, R1, NTP, V6_SOURCE + 8);
    a.stx(Size::DW, FP, ACL_KEY + 16, R1);
    a.st(Size::W, FP, ACL_KEY, (FAMILY_BITS + 128) as i32);
    a.st(Size::W, FP, ACL_KEY + 4, i32::from_ne_bytes(FAMILY_V6));
    a.place(look_up);
    a.mov(R1, R0);
    a.lookup(ACL_KEY);
    // Every trie holds the entry of prefix 0, so a lookup finds one; the verifier wants the
    // check all the same.
    a.jmp_k(JEQ, R0, 0, answer);
    a.ldx(Size::B, R1, R0, 0);
    a.jmp_k(JEQ, R1, i32::from(ALLOW), answer);
    a.st(Size::W, FP, OUTCOME, DriverOutcome::Denied as i32);
    count(a, counts);
    a.exit_with(XDP_DROP);
    a.place(answer);
}

/// Writes the reply over the request and sends it: from here the frame is answered, and counted
/// by the outcome at [`OUTCOME`] (`Answered`, or the rate limiter's `Kod`).
fn reply(a: &mut Asm, counts: RawFd, abort: Label) {
    count(a, counts);
    // The receive time, and the served time's offset from it.
    local_now(a, R0);
    a.stx(Size::DW, FP, LOCAL, R0);
    served_offset(a);
    header(a);
    // Origin: the request's transmit timestamp, read before it is overwritten.
    a.ldx(Size::DW, R1, NTP, TRANSMIT_TS);
    a.stx(Size::DW, NTP, ORIGIN_TS, R1);
    // Receive, with the receive mark set, as `respond` writes it.
    a.ldx(Size::DW, R1, FP, LOCAL);
    a.ldx(Size::DW, R2, FP, DELTA);
    a.alu_x(ADD, R1, R2);
    zone_shift(a, R1, R2, R3);
    a.alu_k(OR, R1, 1);
    a.host_to_be(R1, 64);
    a.stx(Size::DW, NTP, RECEIVE_TS, R1);
    // Transmit, read as late as the checksums over it allow, the mark clear.
    local_now(a, R0);
    a.ldx(Size::DW, R2, FP, DELTA);
    a.alu_x(ADD, R0, R2);
    zone_shift(a, R0, R2, R3);
    a.alu_k(AND, R0, -2);
    a.host_to_be(R0, 64);
    a.stx(Size::DW, NTP, TRANSMIT_TS, R0);
    ratelimit::finish_reply(a);
    let v6 = a.label();
    a.ldx(Size::DW, R1, FP, FAMILY);
    a.jmp_k(JNE, R1, 4, v6);
    ipv4_reply(a, abort);
    a.place(v6);
    ipv6_reply(a, abort);
}

/// Reads the clock into `dst` as the local time (`CLOCK_TAI` less the state's TAI offset, which
/// is `CLOCK_REALTIME`) in NTP's 32.32, exactly as chime-ntp's `NtpTimestamp::from_unix` converts
/// it: the nanoseconds rounded to the nearest 2^-32 s. Clobbers r0–r5.
fn local_now(a: &mut Asm, dst: Reg) {
    a.call(FN_KTIME_GET_TAI_NS);
    a.ldx(
        Size::DW,
        R1,
        STATE,
        state_at(offset_of!(DriverState, tai_offset)),
    );
    a.alu_x(SUB, R0, R1);
    a.mov(R1, R0);
    a.alu_k(DIV, R1, 1_000_000_000);
    a.alu_k(MOD, R0, 1_000_000_000);
    a.alu_k(LSH, R0, 32);
    a.alu_k(ADD, R0, 500_000_000);
    a.alu_k(DIV, R0, 1_000_000_000);
    // Seconds since 1900, modulo 2^32: the immediate is sign-extended, but only the low 32 bits
    // of the sum survive the shift.
    a.alu_k(ADD, R1, UNIX_EPOCH_IN_NTP);
    a.alu_k(LSH, R1, 32);
    a.alu_x(OR, R0, R1);
    if dst != R0 {
        a.mov(dst, R0);
    }
}

/// With [`ZONE`], shifts the served time in `t` (NTP 32.32) by the zone's offset at its second,
/// as `ZoneShift::apply`: the offset before the change, or after it from the change's second on.
/// Only whole seconds move. Clobbers `x` and `y`.
fn zone_shift(a: &mut Asm, t: Reg, x: Reg, y: Reg) {
    let done = a.label();
    let after = a.label();
    let add = a.label();
    a.ldx(Size::W, x, STATE, state_at(offset_of!(DriverState, flags)));
    a.alu_k(AND, x, ZONE as i32);
    a.jmp_k(JEQ, x, 0, done);
    // The second's distance from the change, as a signed 32-bit number (wrapping with the era).
    a.mov(x, t);
    a.alu_k(RSH, x, 32);
    a.ldx(
        Size::W,
        y,
        STATE,
        state_at(offset_of!(DriverState, zone_change)),
    );
    // The low 32 bits of the difference are the wrapping one, which the 32-bit jump compares.
    a.alu_x(SUB, x, y);
    a.jmp32_k(JSGE, x, 0, after);
    a.ldx(
        Size::DW,
        x,
        STATE,
        state_at(offset_of!(DriverState, zone_before)),
    );
    a.ja(add);
    a.place(after);
    a.ldx(
        Size::DW,
        x,
        STATE,
        state_at(offset_of!(DriverState, zone_after)),
    );
    a.place(add);
    a.alu_x(ADD, t, x);
    a.place(done);
}

/// `dst = (rate * age) >> 32`, exactly, for `rate` below 2^48 and `age` below 2^47, from their
/// 32-bit halves: `rh·age + rl·ah + (rl·al >> 32)`, each term within 64 bits (the last is the
/// only one with bits below 2^32, so the sum is the floor of the whole). Clobbers `rate`, `age`
/// and `tmp`.
fn mul_q32(a: &mut Asm, dst: Reg, rate: Reg, age: Reg, tmp: Reg) {
    a.mov(dst, rate);
    a.alu_k(RSH, dst, 32);
    a.alu_x(MUL, dst, age);
    a.zext32(rate);
    a.mov(tmp, age);
    a.alu_k(RSH, tmp, 32);
    a.alu_x(MUL, tmp, rate);
    a.alu_x(ADD, dst, tmp);
    a.zext32(age);
    a.alu_x(MUL, age, rate);
    a.alu_k(RSH, age, 32);
    a.alu_x(ADD, dst, age);
}

/// `reg = |reg|`, as a signed 64-bit difference of two times.
fn abs(a: &mut Asm, reg: Reg) {
    let done = a.label();
    a.jmp_k(JSGE, reg, 0, done);
    a.neg(reg);
    a.place(done);
}

/// The served time less the local clock at [`LOCAL`] into [`DELTA`], as `ServedClock::serve`:
/// the offset, plus the rate times the time from the anchor, held within 16 s of it.
fn served_offset(a: &mut Asm) {
    let done = a.label();
    let positive = a.label();
    let added = a.label();
    a.ldx(
        Size::DW,
        R1,
        STATE,
        state_at(offset_of!(DriverState, offset)),
    );
    a.stx(Size::DW, FP, DELTA, R1);
    a.ldx(Size::DW, R2, STATE, state_at(offset_of!(DriverState, rate)));
    a.jmp_k(JEQ, R2, 0, done);
    a.ldx(Size::DW, R3, FP, LOCAL);
    a.ldx(
        Size::DW,
        R4,
        STATE,
        state_at(offset_of!(DriverState, anchor)),
    );
    a.alu_x(SUB, R3, R4);
    // Held within ±HOLD.
    let below = a.label();
    let held = a.label();
    a.ld_imm64(R4, HOLD);
    a.jmp_x(JSGT, R3, R4, below);
    a.neg(R4);
    a.jmp_x(JSLT, R3, R4, below);
    a.ja(held);
    a.place(below);
    a.mov(R3, R4);
    a.place(held);
    // The product's sign: the rate's, flipped before the anchor.
    a.ldx(Size::W, R5, STATE, state_at(offset_of!(DriverState, flags)));
    a.alu_k(AND, R5, RATE_NEGATIVE as i32);
    a.jmp_k(JSGE, R3, 0, positive);
    a.neg(R3);
    a.alu_k(XOR, R5, RATE_NEGATIVE as i32);
    a.place(positive);
    mul_q32(a, R0, R2, R3, R4);
    a.jmp_k(JEQ, R5, 0, added);
    a.neg(R0);
    a.place(added);
    a.ldx(Size::DW, R1, FP, DELTA);
    a.alu_x(ADD, R1, R0);
    a.stx(Size::DW, FP, DELTA, R1);
    a.place(done);
}

/// The reply's header but for its timestamps, as `respond` writes it from
/// `ServerState::served_at` at [`LOCAL`]: the state's fields with the root dispersion grown, or,
/// if the state is not synchronised or older than its stale time, an unsynchronised server's.
/// The version is the request's, and the poll, which stays where it is.
fn header(a: &mut Asm) {
    let unsynchronised = a.label();
    let done = a.label();
    a.ldx(Size::W, R1, STATE, state_at(offset_of!(DriverState, flags)));
    a.alu_k(AND, R1, SYNCHRONISED as i32);
    a.jmp_k(JEQ, R1, 0, unsynchronised);
    // The state's age: |now − updated|, as `served_at` takes it.
    a.ldx(Size::DW, R3, FP, LOCAL);
    a.ldx(
        Size::DW,
        R1,
        STATE,
        state_at(offset_of!(DriverState, updated)),
    );
    a.alu_x(SUB, R3, R1);
    abs(a, R3);
    a.ldx(
        Size::DW,
        R1,
        STATE,
        state_at(offset_of!(DriverState, stale_after)),
    );
    a.jmp_x(JGT, R3, R1, unsynchronised);
    root_dispersion(a);
    let field = |a: &mut Asm, size: Size, offset: usize, to: i16| {
        a.ldx(size, R1, STATE, state_at(offset));
        a.stx(size, NTP, to, R1);
    };
    a.ldx(Size::B, R2, STATE, state_at(offset_of!(DriverState, leap)));
    first_byte(a, R2);
    field(a, Size::B, offset_of!(DriverState, stratum), STRATUM);
    field(a, Size::B, offset_of!(DriverState, precision), PRECISION);
    field(a, Size::W, offset_of!(DriverState, root_delay), ROOT_DELAY);
    field(
        a,
        Size::W,
        offset_of!(DriverState, reference_id),
        REFERENCE_ID,
    );
    field(
        a,
        Size::DW,
        offset_of!(DriverState, reference_ts),
        REFERENCE_TS,
    );
    a.ja(done);

    // chronyd's unsynchronised header (chime-ntp's `ServedHeader::unsynchronised`): leap 3,
    // stratum 0, root delay and dispersion 1 s, no reference; the precision is still the clock's.
    a.place(unsynchronised);
    a.mov_imm(R2, 0xc0);
    first_byte(a, R2);
    a.st(Size::B, NTP, STRATUM, 0);
    field(a, Size::B, offset_of!(DriverState, precision), PRECISION);
    let one_second = i32::from_ne_bytes(0x0001_0000_u32.to_be_bytes());
    a.st(Size::W, NTP, ROOT_DELAY, one_second);
    a.st(Size::W, NTP, ROOT_DISPERSION, one_second);
    a.st(Size::W, NTP, REFERENCE_ID, 0);
    a.st(Size::DW, NTP, REFERENCE_TS, 0);
    a.place(done);
}

/// The reply's first byte: the leap bits in `leap`, the request's version, mode 4 (server).
fn first_byte(a: &mut Asm, leap: Reg) {
    a.ldx(Size::B, R1, NTP, LVM);
    a.alu_k(AND, R1, 0x38);
    a.alu_x(OR, R1, leap);
    a.alu_k(OR, R1, 4);
    a.stx(Size::B, NTP, LVM, R1);
}

/// The root dispersion for a state of age `R3` (2^-32 s): as `served_at`, the mirrored one plus,
/// rounded up to the 2^-16 s, the dispersion rate times the age and the followed offset's error
/// bound (its error plus its error rate times the distance from its anchor), saturating.
fn root_dispersion(a: &mut Asm) {
    let grown = a.label();
    let within = a.label();
    // In 2^-48 s, which the state's rates and error are in.
    a.ldx(
        Size::DW,
        R2,
        STATE,
        state_at(offset_of!(DriverState, dispersion_rate)),
    );
    mul_q32(a, R0, R2, R3, R4);
    a.ldx(
        Size::DW,
        R1,
        STATE,
        state_at(offset_of!(DriverState, error)),
    );
    a.alu_x(ADD, R1, R0);
    a.ldx(
        Size::DW,
        R2,
        STATE,
        state_at(offset_of!(DriverState, error_rate)),
    );
    a.jmp_k(JEQ, R2, 0, grown);
    a.ldx(Size::DW, R3, FP, LOCAL);
    a.ldx(
        Size::DW,
        R4,
        STATE,
        state_at(offset_of!(DriverState, anchor)),
    );
    a.alu_x(SUB, R3, R4);
    abs(a, R3);
    mul_q32(a, R0, R2, R3, R4);
    a.alu_x(ADD, R1, R0);
    a.place(grown);
    // Up to whole units of 2^-16 s (ceiling), added to the mirrored value, at most all ones.
    a.ld_imm64(R2, 0xffff_ffff);
    a.alu_x(ADD, R1, R2);
    a.alu_k(RSH, R1, 32);
    a.ldx(
        Size::W,
        R3,
        STATE,
        state_at(offset_of!(DriverState, root_dispersion)),
    );
    a.alu_x(ADD, R1, R3);
    a.jmp_x(JGT, R2, R1, within);
    a.mov(R1, R2);
    a.place(within);
    a.host_to_be(R1, 32);
    a.stx(Size::W, NTP, ROOT_DISPERSION, R1);
}

/// Swaps the Ethernet addresses of the frame at [`DATA`], clobbering r0, r1, r4, r5.
fn swap_macs(a: &mut Asm) {
    a.ldx(Size::W, R4, DATA, 0);
    a.ldx(Size::H, R5, DATA, 4);
    a.ldx(Size::W, R0, DATA, 6);
    a.ldx(Size::H, R1, DATA, 10);
    a.stx(Size::W, DATA, 0, R0);
    a.stx(Size::H, DATA, 4, R1);
    a.stx(Size::W, DATA, 6, R4);
    a.stx(Size::H, DATA, 10, R5);
}

/// Swaps the `size` values at `x` and `y` in the frame, clobbering r4 and r5.
fn swap(a: &mut Asm, size: Size, x: i16, y: i16) {
    a.ldx(size, R4, DATA, x);
    a.ldx(size, R5, DATA, y);
    a.stx(size, DATA, x, R5);
    a.stx(size, DATA, y, R4);
}

/// The UDP checksum of the datagram in `range` (from the pseudo-header's addresses to the end),
/// written at `at`: zero is sent as all ones, as zero would mean none.
fn udp_checksum(a: &mut Asm, range: std::ops::Range<i16>, at: i16) {
    let nonzero = a.label();
    a.st(Size::H, DATA, at, 0);
    a.mov_imm(R0, PSEUDO_REST);
    sum_words(a, range);
    fold(a);
    a.alu_k(XOR, R0, 0xffff);
    a.jmp_k(JNE, R0, 0, nonzero);
    a.mov_imm(R0, 0xffff);
    a.place(nonzero);
    a.stx(Size::H, DATA, at, R0);
}

/// Finishes an IPv4 reply (its payload written) and sends it: the frame found again, the
/// addresses and ports swapped, the header's fields as the AF_XDP path's replies have them, the
/// checksums made.
fn ipv4_reply(a: &mut Asm, abort: Label) {
    const IP: i16 = ETH_LEN;
    const UDP: i16 = ETH_LEN + IPV4_LEN;
    a.ldx(Size::W, DATA, CTX, MD_DATA);
    a.ldx(Size::W, DATA_END, CTX, MD_DATA_END);
    // Checked already: only for the verifier, which follows the frame afresh.
    a.check_len(R4, DATA, DATA_END, i32::from(V4_FRAME), abort);
    swap_macs(a);
    // TOS 0; identification 0 and Don't Fragment; TTL 64; checksum to come.
    a.st(Size::B, DATA, IP + 1, 0);
    a.st(Size::W, DATA, IP + 4, i32::from_ne_bytes([0, 0, 0x40, 0]));
    a.st(Size::B, DATA, IP + 8, 64);
    a.st(Size::H, DATA, IP + 10, 0);
    swap(a, Size::W, IP + 12, IP + 16);
    swap(a, Size::H, UDP, UDP + 2);
    a.mov_imm(R0, 0);
    sum_words(a, IP..UDP);
    fold(a);
    a.alu_k(XOR, R0, 0xffff);
    a.stx(Size::H, DATA, IP + 10, R0);
    udp_checksum(a, IP + 12..V4_FRAME, UDP + 6);
    a.exit_with(XDP_TX);
}

/// [`ipv4_reply`] for IPv6: traffic class and flow label 0, hop limit 64.
fn ipv6_reply(a: &mut Asm, abort: Label) {
    const IP: i16 = ETH_LEN;
    const UDP: i16 = ETH_LEN + IPV6_LEN;
    a.ldx(Size::W, DATA, CTX, MD_DATA);
    a.ldx(Size::W, DATA_END, CTX, MD_DATA_END);
    a.check_len(R4, DATA, DATA_END, i32::from(V6_FRAME), abort);
    swap_macs(a);
    a.st(Size::W, DATA, IP, i32::from_ne_bytes([0x60, 0, 0, 0]));
    a.st(Size::B, DATA, IP + 7, 64);
    swap(a, Size::DW, IP + 8, IP + 24);
    swap(a, Size::DW, IP + 16, IP + 32);
    swap(a, Size::H, UDP, UDP + 2);
    udp_checksum(a, IP + 8..V6_FRAME, UDP + 6);
    a.exit_with(XDP_TX);
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program() {
        let ntp = [(None, 123), (Some(IpAddr::V6(Ipv6Addr::LOCALHOST)), 123)];
        let targets = [
            ntp[0],
            (Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))), 2002),
            ntp[1],
        ];
        let limiter = ratelimit::LimiterFds {
            limits: 7,
            clients: 8,
            mask: 15,
            seed: [1, 2],
        };
        assert_jumps_land_inside(&program(3, (4, 5), 6, limiter, &targets, &ntp));
    }

    #[test]
    fn the_state_has_no_padding() {
        // Every byte is a field's, so the map's value is all initialised when chimed writes it.
        assert_eq!(size_of::<DriverState>(), 144);
        assert_eq!(offset_of!(DriverState, reference_ts), 24);
        assert_eq!(offset_of!(DriverState, tai_offset), 96);
    }

    /// A synchronised state as chimed would give it: 8 s stale time at 15 ppm, a followed
    /// clock 0.25 s ahead.
    fn synced() -> DriverInput {
        DriverInput {
            answer: true,
            leap: 0,
            stratum: 2,
            precision: -20,
            reference_id: *b"GPS\0",
            reference_ts: 0xeeb4_1500_8000_0000,
            root_delay: 0x0000_0123,
            root_dispersion: 0x0000_0456,
            updated: Some(0xeeb4_1599_0000_0000),
            stale_after_ns: 8_000_000_000,
            dispersion_rate: 15e-6,
            anchor: 0xeeb4_1598_8000_0000,
            offset: 0.25,
            rate: -1e-5,
            error: 1e-4,
            error_rate: 0.0,
            tai_offset: 37,
            ..Default::default()
        }
    }

    #[test]
    fn the_state_is_the_programs_fixed_point() {
        let s = DriverState::new(&synced());
        assert_eq!(s.flags, ANSWER | SYNCHRONISED | RATE_NEGATIVE);
        assert_eq!((s.leap, s.stratum, s.precision), (0, 2, -20));
        assert_eq!(s.root_delay, [0, 0, 0x01, 0x23]);
        assert_eq!(s.reference_ts, 0xeeb4_1500_8000_0000_u64.to_be_bytes());
        assert_eq!(s.stale_after, 8 << 32);
        // 15 ppm in 2^-48 s per second, rounded: 4222124650.66.
        assert_eq!(s.dispersion_rate, 4_222_124_651);
        assert_eq!(s.offset, 1 << 30);
        assert_eq!(s.rate, 42_950);
        assert_eq!(s.tai_offset, 37_000_000_000);
        let unset = DriverState::new(&DriverInput {
            leap: 3,
            ..synced()
        });
        assert_eq!(unset.leap, 0xc0);
        assert_eq!(unset.flags & SYNCHRONISED, 0);
    }

    #[test]
    fn answers_stop_where_the_program_could_not_give_the_workers_answer() {
        let off = |input: DriverInput| DriverState::new(&input).flags & ANSWER == 0;
        assert!(!off(synced()));
        assert!(off(DriverInput {
            answer: false,
            ..synced()
        }));
        for leap in [1, 2] {
            assert!(off(DriverInput { leap, ..synced() }));
        }
        assert!(off(DriverInput {
            leap_announced: true,
            ..synced()
        }));
        assert!(off(DriverInput {
            stale_after_ns: 16_384_000_000_000,
            ..synced()
        }));
        for rate in [1.0, -1e-9, f64::NAN] {
            assert!(off(DriverInput {
                dispersion_rate: rate,
                ..synced()
            }));
        }
        assert!(off(DriverInput {
            error: 16_384.0,
            ..synced()
        }));
        assert!(off(DriverInput {
            rate: 65_536.0,
            ..synced()
        }));
        assert!(off(DriverInput {
            offset: -2_147_483_648.0,
            ..synced()
        }));
        // An error rate with the anchor so far from the last update that an age within the stale
        // time would be multiplied past 2^46: off; with the anchor near, on.
        let far = DriverInput {
            error_rate: 1e-6,
            anchor: 0x1000_0000_0000_0000,
            ..synced()
        };
        assert!(off(far));
        assert!(!off(DriverInput {
            error_rate: 1e-6,
            ..synced()
        }));
        // Unsynchronised states are answered (as unsynchronised).
        for input in [
            DriverInput {
                updated: None,
                ..synced()
            },
            DriverInput {
                stratum: 16,
                ..synced()
            },
            DriverInput {
                leap: 3,
                ..synced()
            },
        ] {
            let s = DriverState::new(&input);
            assert_eq!(s.flags & (ANSWER | SYNCHRONISED), ANSWER);
        }
    }

    #[test]
    fn the_pseudo_header_rest_is_its_two_words() {
        // 0x0011 and 0x0038 in network order: 00 11 00 38, loaded little-endian.
        assert_eq!(PSEUDO_REST, i32::from_le_bytes([0x00, 0x11, 0x00, 0x38]));
    }
}
