//! The answering program's rate limiter: chime-ntp's `ClientTable`, relenting as chimed's NTP
//! workers use it, in BPF, with the same table, the same arithmetic and the same thresholds, so
//! that a flooding address is treated in the driver as on the sockets.
//!
//! The table is an array map of sets of four slots, each slot a client's key, theoretical arrival
//! time (GCRA) and retry history, every one a `u64` laid out as chime-ntp lays them out. The
//! address (IPv4 as its IPv4-mapped IPv6 form) goes through the same keyed hash (MurmurHash3's
//! finaliser with a seed): its top bits pick the set, and the hash with the lowest bit set is the
//! key. A new address takes the slot with the earliest arrival time. The time is
//! `CLOCK_MONOTONIC`, the frame's arrival as the program read it on entry; the leak and KoD draws
//! are `bpf_get_prandom_u32`'s. Stores are plain: two CPUs that update one slot at the same
//! instant may lose one update between them, as two of chimed's threads may in the user-space
//! table, and the worst that does is answer one request too many.
//!
//! The limits are in a map of their own, which chimed writes at start and on every reload: a
//! request checked while they are rewritten may be taken by a mix of the old and the new limits,
//! as chime-ntp's `set_limit` allows. With rate limiting off nothing is read but that map.
//!
//! A request answered carries the poll the limit's interval suggests (`suggest_poll`), a KoD is
//! that reply turned into a Kiss-o'-Death RATE (`kiss_of_death`), and a request dropped is
//! dropped here (`XDP_DROP`) and counted.

use std::io;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::{DriverOutcome, FAMILY, KEY, LVM, NTP, OUTCOME, REFERENCE_ID, STRATUM, count};
use crate::asm::*;
use crate::bpf::{self, RX_MONO};

/// Rate limiting is on: [`DriverLimits::flags`].
pub(crate) const LIMIT: u32 = 1 << 0;

/// The limits as the program reads them, made from chronyd's `ratelimit` options as chime-ntp's
/// `RateLimit` makes its period and tolerance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DriverLimits {
    /// 1 while limiting, 0: nothing limited.
    pub flags: u32,
    /// Log2 of the seconds between responses: the least poll a reply suggests.
    pub interval: i8,
    /// Log2 of one in how many requests over the limit are answered anyway.
    pub leak: u8,
    /// Log2 of one in how many of the others get a KoD RATE; 0 is none.
    pub kod: u8,
    _reserved: u8,
    /// The time one response costs, nanoseconds: 2^interval s (at least 1 ns).
    pub period: u64,
    /// How far ahead of now a client's arrival time may be and still be answered: (burst − 1)
    /// periods.
    pub tolerance: u64,
}

impl DriverLimits {
    /// No rate limiting.
    pub const OFF: Self = Self {
        flags: 0,
        interval: 0,
        leak: 0,
        kod: 0,
        _reserved: 0,
        period: 0,
        tolerance: 0,
    };

    /// The limits of chronyd's `ratelimit interval I burst B leak L kod K`, whose ranges chime-ntp's
    /// `RateLimit::new` checks (−19 to 12, 1 to 255, 1 to 4, 0 to 4).
    pub fn new(interval: i8, burst: u8, leak: u8, kod: u8) -> Self {
        const SECOND: u64 = 1_000_000_000;
        let period = if interval >= 0 {
            SECOND << interval.min(32)
        } else {
            (SECOND >> interval.unsigned_abs().min(63)).max(1)
        };
        Self {
            flags: LIMIT,
            interval,
            // The draws take up to 32 random bits.
            leak: leak.min(32),
            kod: kod.min(32),
            _reserved: 0,
            period,
            tolerance: period * u64::from(burst.max(1) - 1),
        }
    }
}

/// Slots per set, and each slot's fields: key, arrival time, history (`u64` each).
const WAYS: usize = 4;
const SLOT: i16 = 24;
const TAT: i16 = 8;
const HISTORY: i16 = 16;
const SET_BYTES: usize = WAYS * SLOT as usize;

/// The most clients the table in the driver tracks: 2^20, 24 MiB of kernel memory (96 bytes a
/// set of four), which the kernel keeps resident; chimed's own table allows more.
pub(crate) const MAX_CLIENTS: usize = 1 << 20;

/// The table and the limits, for [`super::DriverMaps`].
#[derive(Debug)]
pub(crate) struct Limiter {
    limits: OwnedFd,
    clients: OwnedFd,
    sets: u32,
    seed: [u64; 2],
}

/// What the program is assembled with: the maps, the table's set mask and the hash's seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LimiterFds {
    pub(crate) limits: RawFd,
    pub(crate) clients: RawFd,
    pub(crate) mask: u32,
    pub(crate) seed: [u64; 2],
}

impl Limiter {
    /// A table for `clients` addresses (rounded up to a power of two, at least 4, at most
    /// [`MAX_CLIENTS`]), as chime-ntp's `ClientTable::new` rounds them, keyed by `seed`; the
    /// limits off.
    pub(crate) fn new(clients: usize, seed: [u64; 2]) -> io::Result<Self> {
        let clients = clients.clamp(WAYS, MAX_CLIENTS).next_power_of_two();
        let sets = (clients / WAYS) as u32;
        Ok(Self {
            limits: bpf::create_array("chimed_ntp_rlim", size_of::<DriverLimits>())?,
            clients: bpf::create_table("chimed_ntp_clnt", SET_BYTES, sets)?,
            sets,
            seed,
        })
    }

    pub(crate) fn fds(&self) -> LimiterFds {
        LimiterFds {
            limits: self.limits.as_raw_fd(),
            clients: self.clients.as_raw_fd(),
            mask: self.sets - 1,
            seed: self.seed,
        }
    }

    pub(crate) fn set_limits(&self, limits: &DriverLimits) -> io::Result<()> {
        bpf::update_elem(&self.limits, 0, limits)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.sets as usize * WAYS
    }

    pub(crate) fn bytes(&self) -> usize {
        self.sets as usize * SET_BYTES
    }

    /// Set `index` of the table: each slot's key, arrival time and history.
    pub(crate) fn set(&self, index: u32) -> io::Result<[[u64; 3]; WAYS]> {
        bpf::lookup_elem(&self.clients, index)
    }
}

/// Sixteen random bytes from the kernel, for the address hash's seed.
pub(crate) fn random_seed() -> io::Result<[u64; 2]> {
    let mut seed = [0u64; 2];
    let len = size_of_val(&seed);
    // SAFETY: `seed` is `len` writable bytes, alive for the call.
    let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), len, 0) };
    if got == len as isize {
        Ok(seed)
    } else {
        Err(io::Error::last_os_error())
    }
}

// Stack slots, below the responder's (which end at -32).
/// The least poll a reply suggests, sign-extended; `i64::MIN` when nothing is limited.
const POLL_MIN: i16 = -40;
/// The arrival time, `CLOCK_MONOTONIC` nanoseconds.
const NOW: i16 = -48;
/// The client's key.
const CLIENT: i16 = -56;
/// The limits' map value.
const LIMITS: i16 = -64;
/// The history's fields as `History` has them, the rates sign-extended.
const LAST: i16 = -72;
const RATE: i16 = -80;
const TIMEOUT_RATE: i16 = -88;
const DROPPED: i16 = -96;
/// 1 if the client retries faster when dropped (the leak inverted), else 0.
const RELENT: i16 = -104;
/// What to do: [`ANSWER`], [`KOD`] or [`DROP`].
const VERDICT: i16 = -112;
/// The set's index, for the lookup.
const SET: i16 = -116;

const ANSWER: i32 = 0;
const KOD: i32 = 1;
const DROP: i32 = 2;

// chime-ntp's `History` constants.
const NO_RATE: i32 = -128;
const RATE_SCALE: i32 = 4;
const HISTORY_SHIFT: i32 = 20;
const LAST_BITS: u32 = 40;
const MAX_RATE: i32 = 44;
const MIN_RATE: i32 = -80;

/// The NTP header's poll field.
const POLL: i16 = 2;

/// Where a field of [`DriverLimits`] is.
fn limits_at(offset: usize) -> i16 {
    offset as i16
}

/// The check, between the NTP checks and the reply: with the limits on, the request's address is
/// counted in the table as `ClientTable::check` counts it. Answered, it goes on with
/// [`OUTCOME`] as it was (`Answered`); a KoD, with [`OUTCOME`] `Kod`; dropped, it is counted as
/// `RateLimited` and the program ends with `XDP_DROP`. [`POLL_MIN`] is set for [`finish_reply`].
/// Clobbers r0–r5 and r9 ([`RX_MONO`], not needed once a request is to be answered).
pub(super) fn check(a: &mut Asm, l: LimiterFds, counts: RawFd) {
    let done = a.label();
    let found = a.label();
    let settled = a.label();
    a.ld_imm64(R1, i64::MIN as u64);
    a.stx(Size::DW, FP, POLL_MIN, R1);
    a.stx(Size::DW, FP, NOW, RX_MONO);
    a.st(Size::W, FP, KEY, 0);
    a.ld_map(R1, l.limits);
    a.lookup(KEY);
    a.jmp_k(JEQ, R0, 0, done);
    a.ldx(Size::W, R1, R0, limits_at(offset_of!(DriverLimits, flags)));
    a.alu_k(AND, R1, LIMIT as i32);
    a.jmp_k(JEQ, R1, 0, done);
    a.stx(Size::DW, FP, LIMITS, R0);
    a.ldx(
        Size::B,
        R1,
        R0,
        limits_at(offset_of!(DriverLimits, interval)),
    );
    sign_extend_byte(a, R1);
    a.stx(Size::DW, FP, POLL_MIN, R1);

    // The set and the key, from the keyed hash of the address.
    address_hash(a, l.seed);
    a.mov(R1, R0);
    a.alu_k(OR, R1, 1);
    a.stx(Size::DW, FP, CLIENT, R1);
    a.alu_k(RSH, R0, 40);
    a.alu_k(AND, R0, l.mask as i32);
    a.stx(Size::W, FP, SET, R0);
    a.ld_map(R1, l.clients);
    a.lookup(SET);
    // Never: the index is within the array.
    a.jmp_k(JEQ, R0, 0, done);

    slot_or_new(a, found, done);

    // A client the table knows: its history counts this request, then the GCRA step.
    a.place(found);
    history_count(a);
    spend(a, settled);
    a.place(settled);
    // The history back, `dropped` as the verdict says.
    let kept = a.label();
    a.ldx(Size::DW, R1, FP, LAST);
    for (slot, shift) in [(RATE, 40), (TIMEOUT_RATE, 48)] {
        a.ldx(Size::DW, R2, FP, slot);
        a.alu_k(AND, R2, 0xff);
        a.alu_k(LSH, R2, shift);
        a.alu_x(OR, R1, R2);
    }
    a.ldx(Size::DW, R2, FP, VERDICT);
    a.jmp_k(JNE, R2, DROP, kept);
    a.ld_imm64(R2, 1 << 56);
    a.alu_x(OR, R1, R2);
    a.place(kept);
    a.stx(Size::DW, R9, HISTORY, R1);
    let kod = a.label();
    a.ldx(Size::DW, R2, FP, VERDICT);
    a.jmp_k(JEQ, R2, ANSWER, done);
    a.jmp_k(JEQ, R2, KOD, kod);
    a.st(Size::W, FP, OUTCOME, DriverOutcome::RateLimited as i32);
    count(a, counts);
    a.exit_with(XDP_DROP);
    a.place(kod);
    a.st(Size::W, FP, OUTCOME, DriverOutcome::Kod as i32);
    a.place(done);
}

/// The client's slot in the set at r0: to `found` with r9 at it if the set holds the client;
/// else the slot with the earliest arrival time (the first of equals) is the new client's, with
/// a full burst of which this request takes one, and on to `done`, answered. Clobbers r0–r5.
fn slot_or_new(a: &mut Asm, found: Label, done: Label) {
    a.ldx(Size::DW, R5, FP, CLIENT);
    for i in 0..WAYS as i16 {
        let next = a.label();
        a.ldx(Size::DW, R1, R0, i * SLOT);
        a.jmp_x(JNE, R1, R5, next);
        a.mov(R9, R0);
        a.alu_k(ADD, R9, i32::from(i * SLOT));
        a.ja(found);
        a.place(next);
    }
    a.mov(R9, R0);
    a.mov_imm(R3, -1);
    for i in 0..WAYS as i16 {
        let take = a.label();
        let next = a.label();
        a.ldx(Size::DW, R1, R0, i * SLOT + TAT);
        a.jmp_x(JGT, R3, R1, take);
        a.ja(next);
        a.place(take);
        a.mov(R3, R1);
        a.mov(R9, R0);
        a.alu_k(ADD, R9, i32::from(i * SLOT));
        a.place(next);
    }
    a.ldx(Size::DW, R1, FP, CLIENT);
    a.stx(Size::DW, R9, 0, R1);
    // now + period: monotonic nanoseconds since boot are far from wrapping.
    a.ldx(Size::DW, R1, FP, NOW);
    a.ldx(Size::DW, R2, FP, LIMITS);
    a.ldx(
        Size::DW,
        R3,
        R2,
        limits_at(offset_of!(DriverLimits, period)),
    );
    a.alu_x(ADD, R3, R1);
    a.stx(Size::DW, R9, TAT, R3);
    // `History::first`: nothing measured yet.
    last_of(a, R1);
    a.ld_imm64(R2, (0x80 << 40) | (0x80 << 48));
    a.alu_x(OR, R1, R2);
    a.stx(Size::DW, R9, HISTORY, R1);
    a.ja(done);
}

/// What the limiter does to a reply already written (its transmit time too), before its headers
/// are finished: as chimed's workers do after `respond`, the poll raised to at least the limit's
/// interval (`suggest_poll`) while limiting, and a KoD made a Kiss-o'-Death RATE
/// (`kiss_of_death`: leap 3, stratum 0, `RATE` as the reference ID; the rest as answered).
/// Clobbers r1 and r2.
pub(super) fn finish_reply(a: &mut Asm) {
    let polled = a.label();
    let done = a.label();
    a.ldx(Size::B, R1, NTP, POLL);
    sign_extend_byte(a, R1);
    a.ldx(Size::DW, R2, FP, POLL_MIN);
    a.jmp_x(JSGE, R1, R2, polled);
    a.stx(Size::B, NTP, POLL, R2);
    a.place(polled);
    a.ldx(Size::W, R1, FP, OUTCOME);
    a.jmp_k(JNE, R1, DriverOutcome::Kod as i32, done);
    a.ldx(Size::B, R1, NTP, LVM);
    a.alu_k(AND, R1, 0x3f);
    a.alu_k(OR, R1, 0xc0);
    a.stx(Size::B, NTP, LVM, R1);
    a.st(Size::B, NTP, STRATUM, 0);
    a.st(Size::W, NTP, REFERENCE_ID, i32::from_ne_bytes(*b"RATE"));
    a.place(done);
}

/// `reg` (0–255) as the signed byte it holds, sign-extended to 64 bits.
fn sign_extend_byte(a: &mut Asm, reg: Reg) {
    a.alu_k(XOR, reg, 0x80);
    a.alu_k(SUB, reg, 0x80);
}

/// `dst` = the arrival time in the history's units ([`NOW`] >> 20, 40 bits). Clobbers r2.
fn last_of(a: &mut Asm, dst: Reg) {
    a.ldx(Size::DW, dst, FP, NOW);
    a.alu_k(RSH, dst, HISTORY_SHIFT);
    a.ld_imm64(R2, (1 << LAST_BITS) - 1);
    a.alu_x(AND, dst, R2);
}

/// chime-ntp's `ClientTable::hash` of the source address into r0: `mix(low ^ seed[1] ^
/// mix(high ^ seed[0]))` of its 128 bits, an IPv4 address as its IPv4-mapped form. Clobbers
/// r1–r4.
fn address_hash(a: &mut Asm, seed: [u64; 2]) {
    use super::{IPV4_LEN, IPV6_LEN, UDP_LEN};
    let v6 = a.label();
    let mixed = a.label();
    a.ldx(Size::DW, R1, FP, FAMILY);
    a.jmp_k(JNE, R1, 4, v6);
    // The source address, back from the payload: 12 bytes into the IPv4 header.
    a.ldx(Size::W, R2, NTP, -(UDP_LEN + IPV4_LEN) + 12);
    a.host_to_be(R2, 32);
    a.ld_imm64(R1, 0xffff_0000_0000);
    a.alu_x(OR, R2, R1);
    a.mov_imm(R1, 0);
    a.ja(mixed);
    a.place(v6);
    // 8 bytes into the IPv6 header.
    a.ldx(Size::DW, R1, NTP, -(UDP_LEN + IPV6_LEN) + 8);
    a.host_to_be(R1, 64);
    a.ldx(Size::DW, R2, NTP, -(UDP_LEN + IPV6_LEN) + 16);
    a.host_to_be(R2, 64);
    a.place(mixed);
    a.ld_imm64(R3, seed[0]);
    a.alu_x(XOR, R1, R3);
    mix(a, R1, R4);
    a.ld_imm64(R3, seed[1]);
    a.alu_x(XOR, R2, R3);
    a.alu_x(XOR, R2, R1);
    mix(a, R2, R4);
    a.mov(R0, R2);
}

/// chime-ntp's `mix`, MurmurHash3's 64-bit finaliser, on `x`, clobbering `tmp`.
fn mix(a: &mut Asm, x: Reg, tmp: Reg) {
    for multiplier in [0xff51_afd7_ed55_8ccd_u64, 0xc4ce_b9fe_1a85_ec53] {
        a.mov(tmp, x);
        a.alu_k(RSH, tmp, 33);
        a.alu_x(XOR, x, tmp);
        a.ld_imm64(tmp, multiplier);
        a.alu_x(MUL, x, tmp);
    }
    a.mov(tmp, x);
    a.alu_k(RSH, tmp, 33);
    a.alu_x(XOR, x, tmp);
}

/// `History::count` of the slot at r9's history at [`NOW`], its fields left in [`LAST`],
/// [`RATE`], [`TIMEOUT_RATE`] and [`DROPPED`], and `History::retries_faster` in [`RELENT`].
/// Clobbers r0–r5.
fn history_count(a: &mut Asm) {
    let counted = a.label();
    let measure = a.label();
    let latest_known = a.label();
    a.ldx(Size::DW, R5, R9, HISTORY);
    for (slot, shift) in [(RATE, 40), (TIMEOUT_RATE, 48)] {
        a.mov(R1, R5);
        a.alu_k(RSH, R1, shift);
        a.alu_k(AND, R1, 0xff);
        sign_extend_byte(a, R1);
        a.stx(Size::DW, FP, slot, R1);
    }
    a.mov(R1, R5);
    a.alu_k(RSH, R1, 56);
    a.alu_k(AND, R1, 1);
    a.stx(Size::DW, FP, DROPPED, R1);
    // The interval since the last request, in units of 2^20 ns, modulo 2^40.
    last_of(a, R1);
    a.stx(Size::DW, FP, LAST, R1);
    a.alu_x(AND, R5, R2);
    a.alu_x(SUB, R1, R5);
    a.alu_x(AND, R1, R2);
    // The clock went back, or a wrap: the rates stay.
    a.ld_imm64(R3, 1 << (LAST_BITS - 1));
    a.jmp_x(JGT, R3, R1, measure);
    a.ja(counted);
    a.place(measure);
    // The latest rate, r3: the interval in whole octaves, rounded at 1.5×.
    a.mov_imm(R3, MAX_RATE);
    a.jmp_k(JEQ, R1, 0, latest_known);
    a.mov(R2, R1);
    a.alu_k(RSH, R2, 1);
    a.alu_x(ADD, R1, R2);
    ilog2(a, R1, R0, R2);
    a.mov_imm(R3, MAX_RATE - RATE_SCALE);
    a.alu_k(MUL, R0, RATE_SCALE);
    a.alu_x(SUB, R3, R0);
    a.jmp_k(JSGE, R3, MIN_RATE, latest_known);
    a.mov_imm(R3, MIN_RATE);
    a.place(latest_known);
    // Into the rate the last request's fate picks.
    let timeout = a.label();
    a.ldx(Size::DW, R1, FP, DROPPED);
    a.jmp_k(JNE, R1, 0, timeout);
    a.ldx(Size::DW, R1, FP, RATE);
    update_rate(a);
    a.stx(Size::DW, FP, RATE, R1);
    a.ja(counted);
    a.place(timeout);
    a.ldx(Size::DW, R1, FP, TIMEOUT_RATE);
    update_rate(a);
    a.stx(Size::DW, FP, TIMEOUT_RATE, R1);
    a.place(counted);
    // `retries_faster`: a timeout rate more than an octave above the rate.
    let no = a.label();
    a.mov_imm(R0, 0);
    a.ldx(Size::DW, R1, FP, TIMEOUT_RATE);
    a.jmp_k(JEQ, R1, NO_RATE, no);
    a.ldx(Size::DW, R2, FP, RATE);
    a.alu_k(ADD, R2, RATE_SCALE);
    a.jmp_x(JSGE, R2, R1, no);
    a.mov_imm(R0, 1);
    a.place(no);
    a.stx(Size::DW, FP, RELENT, R0);
}

/// `History::count`'s step of the rate in r1 towards the latest, r3 (both sign-extended): the
/// latest if none yet; up a quarter octave; down to 2.5 octaves above the latest at most, or
/// halfway (rounded towards zero, as Rust's `/`). Clobbers r4.
fn update_rate(a: &mut Asm) {
    let done = a.label();
    let known = a.label();
    let not_below = a.label();
    let cap = a.label();
    let halve = a.label();
    let positive = a.label();
    a.jmp_k(JNE, R1, NO_RATE, known);
    a.mov(R1, R3);
    a.ja(done);
    a.place(known);
    a.jmp_x(JSGE, R1, R3, not_below);
    a.alu_k(ADD, R1, 1);
    a.ja(done);
    a.place(not_below);
    a.mov(R4, R3);
    a.alu_k(ADD, R4, RATE_SCALE * 5 / 2);
    a.jmp_x(JSGT, R1, R4, cap);
    a.jmp_x(JSGT, R1, R3, halve);
    a.ja(done);
    a.place(cap);
    a.mov(R1, R4);
    a.ja(done);
    a.place(halve);
    a.alu_x(ADD, R1, R3);
    a.alu_k(SUB, R1, 1);
    a.jmp_k(JSGE, R1, 0, positive);
    a.neg(R1);
    a.alu_k(RSH, R1, 1);
    a.neg(R1);
    a.ja(done);
    a.place(positive);
    a.alu_k(RSH, R1, 1);
    a.place(done);
}

/// `dst` = ⌊log2 `x`⌋ for `x` ≥ 1, by a bounded search over 64 bits, `x` clobbered, and `tmp`.
fn ilog2(a: &mut Asm, x: Reg, dst: Reg, tmp: Reg) {
    a.mov_imm(dst, 0);
    for shift in [32, 16, 8, 4, 2, 1] {
        let next = a.label();
        a.mov(tmp, x);
        a.alu_k(RSH, tmp, shift);
        a.jmp_k(JEQ, tmp, 0, next);
        a.mov(x, tmp);
        a.alu_k(ADD, dst, shift);
        a.place(next);
    }
}

/// `ClientTable::spend` of the slot at r9's arrival time at [`NOW`], then `over_limit` for a
/// request past the tolerance (with [`RELENT`]): the verdict into [`VERDICT`], then to
/// `settled`. Clobbers r0–r5.
fn spend(a: &mut Asm, settled: Label) {
    let over = a.label();
    let from_now = a.label();
    a.ldx(Size::DW, R1, R9, TAT);
    a.ldx(Size::DW, R2, FP, NOW);
    a.jmp_x(JGT, R1, R2, from_now);
    a.mov(R1, R2);
    a.place(from_now);
    a.mov(R3, R1);
    a.alu_x(SUB, R3, R2);
    a.ldx(Size::DW, R4, FP, LIMITS);
    a.ldx(
        Size::DW,
        R5,
        R4,
        limits_at(offset_of!(DriverLimits, tolerance)),
    );
    a.jmp_x(JGT, R3, R5, over);
    a.ldx(
        Size::DW,
        R5,
        R4,
        limits_at(offset_of!(DriverLimits, period)),
    );
    a.alu_x(ADD, R1, R5);
    a.stx(Size::DW, R9, TAT, R1);
    a.st(Size::DW, FP, VERDICT, ANSWER);
    a.ja(settled);

    // Over the limit: leaked once in 2^leak, or, relenting, all but once in 2^leak; then a KoD
    // once in 2^kod of the rest, if kod is not 0.
    a.place(over);
    let answer = a.label();
    let drop = a.label();
    one_in(a, offset_of!(DriverLimits, leak));
    a.ldx(Size::DW, R2, FP, RELENT);
    a.jmp_x(JNE, R0, R2, answer);
    a.ldx(Size::DW, R2, FP, LIMITS);
    a.ldx(Size::B, R1, R2, limits_at(offset_of!(DriverLimits, kod)));
    a.jmp_k(JEQ, R1, 0, drop);
    one_in(a, offset_of!(DriverLimits, kod));
    a.jmp_k(JEQ, R0, 0, drop);
    a.st(Size::DW, FP, VERDICT, KOD);
    a.ja(settled);
    a.place(answer);
    a.st(Size::DW, FP, VERDICT, ANSWER);
    a.ja(settled);
    a.place(drop);
    a.st(Size::DW, FP, VERDICT, DROP);
    a.ja(settled);
}

/// `Coin::one_in` with the log2 at `field` of the limits: r0 = 1 when the top log2 bits of 32
/// random ones are zero (always for 0), else 0. Clobbers r1–r5.
fn one_in(a: &mut Asm, field: usize) {
    let hit = a.label();
    a.call(FN_GET_PRANDOM_U32);
    a.ldx(Size::DW, R2, FP, LIMITS);
    a.ldx(Size::B, R1, R2, limits_at(field));
    a.mov_imm(R3, 32);
    a.alu_x(SUB, R3, R1);
    a.zext32(R0);
    a.alu_x(RSH, R0, R3);
    a.jmp_k(JEQ, R0, 0, hit);
    a.mov_imm(R0, -1);
    a.place(hit);
    // 0 → 1 (a hit), −1 → 0.
    a.alu_k(ADD, R0, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_have_no_padding_and_chime_ntps_period() {
        assert_eq!(size_of::<DriverLimits>(), 24);
        let l = DriverLimits::new(3, 8, 2, 1);
        assert_eq!((l.period, l.tolerance), (8_000_000_000, 56_000_000_000));
        assert_eq!(DriverLimits::new(-19, 1, 1, 0).period, 1907);
        assert_eq!(DriverLimits::new(12, 255, 4, 4).period, 4_096_000_000_000);
        assert_eq!(DriverLimits::new(0, 1, 1, 0).tolerance, 0);
        assert_eq!(DriverLimits::default(), DriverLimits::OFF);
    }

    #[test]
    fn the_stack_slots_are_apart() {
        let mut slots = [
            POLL_MIN,
            NOW,
            CLIENT,
            LIMITS,
            LAST,
            RATE,
            TIMEOUT_RATE,
            DROPPED,
            RELENT,
            VERDICT,
        ];
        slots.sort_unstable();
        assert!(slots.windows(2).all(|w| w[1] - w[0] >= 8));
        assert!(SET < VERDICT && SET % 4 == 0 && *slots.last().unwrap() <= super::super::DELTA - 8);
    }
}
