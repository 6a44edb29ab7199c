//! NTP's interleaved client/server mode (RFC 9769), the server's part.
//!
//! A server can only stamp a reply's transmit time (T3) before the reply leaves; the kernel knows
//! the true time only afterwards. In interleaved mode the server sends that true time one exchange
//! later. A client in this mode (chronyd's `xleave`) puts in its request's origin field the
//! receive timestamp the server sent it last time, and in its receive field the time it received
//! that reply. The server finds the transmit time it saved under that receive timestamp and
//! answers with origin = the request's receive field and transmit = the saved time of the previous
//! reply; the receive field is, as always, this request's arrival.
//!
//! Telling the modes apart, as chronyd does: every reply's receive timestamp has its lowest bit
//! set and its transmit timestamp the lowest bit clear (a quarter of a nanosecond), so an origin
//! with the bit set can only be a receive timestamp of ours; a client in basic mode sends zero or
//! our transmit timestamp there. [`interleaved_origin`] applies the test, and only replies to such
//! requests have their transmit times saved, so basic clients cost nothing.
//!
//! The saved times are a [`TxLog`] every worker thread shares, since a client's requests may reach
//! any thread: a fixed array of slots keyed by receive timestamp, written without locks. Each
//! saved time can be taken once, so a replayed request gets a basic reply. A time lost to a
//! collision, or not yet saved, costs the client one exchange in basic mode, as when a chronyd
//! server's log is full.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::packet::{Header, Mode, offset, version_of};
use crate::time::NtpTimestamp;

/// The lowest bit of the NTP fraction: set in every receive timestamp a reply carries, clear in
/// every transmit timestamp.
pub(crate) const RX_MARK: u64 = 1;

/// If `request` is an NTPv4 client request in the interleaved form, the origin timestamp it
/// carries: the receive timestamp of our reply to its previous request. The form: origin with the
/// receive mark set, and receive different from transmit (a client in basic mode that copies our
/// timestamps back, as old ntpd does, sends our transmit timestamp, which never has the mark).
pub fn interleaved_origin(request: &[u8]) -> Option<NtpTimestamp> {
    let head = request.first_chunk::<{ Header::LEN }>()?;
    if version_of(head[offset::LVM]) != 4
        || Mode::from_first_byte(head[offset::LVM]) != Mode::Client
    {
        return None;
    }
    let field = |at: usize| u64::from_be_bytes(head[at..at + 8].try_into().unwrap_or_default());
    let origin = field(offset::ORIGIN_TS);
    let (receive, transmit) = (field(offset::RECEIVE_TS), field(offset::TRANSMIT_TS));
    (origin & RX_MARK != 0 && receive != transmit).then_some(NtpTimestamp(origin))
}

/// Turns a reply made by [`crate::respond`] to an interleaved request into an interleaved reply:
/// origin = the request's receive field, transmit = `previous_tx`, the saved transmit time of our
/// reply to the client's previous request. The worker must then not stamp this reply's transmit
/// time again. Buffers shorter than a header are left alone.
pub fn make_interleaved(reply: &mut [u8], request: &[u8], previous_tx: NtpTimestamp) {
    let (Some(out), Some(head)) = (
        reply.first_chunk_mut::<{ Header::LEN }>(),
        request.first_chunk::<{ Header::LEN }>(),
    ) else {
        return;
    };
    out[offset::ORIGIN_TS..offset::RECEIVE_TS]
        .copy_from_slice(&head[offset::RECEIVE_TS..offset::TRANSMIT_TS]);
    let tx = NtpTimestamp(previous_tx.0 & !RX_MARK);
    out[offset::TRANSMIT_TS..Header::LEN].copy_from_slice(&tx.to_bits());
}

/// The receive timestamp a reply carries: the key its transmit time is saved under. `None` for a
/// buffer that is not a 48-byte-or-longer server reply with the receive mark, so that whatever
/// else comes back from the kernel is ignored.
pub fn reply_receive_timestamp(reply: &[u8]) -> Option<NtpTimestamp> {
    let head = reply.first_chunk::<{ Header::LEN }>()?;
    if Mode::from_first_byte(head[offset::LVM]) != Mode::Server {
        return None;
    }
    let rx = u64::from_be_bytes(
        head[offset::RECEIVE_TS..offset::TRANSMIT_TS]
            .try_into()
            .ok()?,
    );
    (rx & RX_MARK != 0).then_some(NtpTimestamp(rx))
}

/// One saved transmit time, under the receive timestamp of the reply it belongs to: 0 for an
/// empty slot, [`BUSY`] while one thread has it to itself.
#[derive(Debug, Default)]
struct Slot {
    rx: AtomicU64,
    tx: AtomicU64,
}

/// The key of a slot that one thread is writing or taking from. Never a receive timestamp: those
/// all carry [`RX_MARK`], so they are odd.
const BUSY: u64 = 2;

const WAYS: usize = 4;

/// Four slots in one cache line: the receive timestamp picks the set, any slot of it may hold it.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Set([Slot; WAYS]);

/// The transmit times of recent replies to interleaved clients, shared by every worker thread.
///
/// A save goes to an empty slot of its set, else over the oldest transmit time there, so a time is
/// lost only if four later ones land in its set before its client asks again: with as many
/// clients as a quarter of the entries, each polling once in the time the others all do, about
/// 2% are.
///
/// No thread ever waits: a save or a take first claims its slot by swapping the key it saw for
/// a busy mark (compare-and-swap), touches the time only while it holds the slot, and releases it
/// with the new key (a save) or empty (a take). So a time is only ever written, and read, by the
/// one thread holding its slot, and returned only under the key it was saved with. A thread that
/// loses the race for a slot gives up: a save is lost, which costs its client one basic reply, and
/// a take finds nothing, the same. (An earlier version without the claim on saves could, with two
/// writers in one slot at once, publish one key with the other's time.)
#[derive(Debug)]
pub struct TxLog {
    sets: Box<[Set]>,
    mask: usize,
}

impl TxLog {
    /// The most entries a log holds: 2^24 (256 MiB).
    pub const MAX_ENTRIES: usize = 1 << 24;

    /// A log of `entries` slots (rounded up to a power of two, at least 4, at most
    /// [`Self::MAX_ENTRIES`]), 16 bytes each. A client needs its time to survive from one
    /// request to its next, so give it about four entries per interleaved client.
    pub fn new(entries: usize) -> Self {
        let entries = entries.clamp(WAYS, Self::MAX_ENTRIES).next_power_of_two();
        let sets = entries / WAYS;
        Self {
            sets: (0..sets).map(|_| Set::default()).collect(),
            mask: sets - 1,
        }
    }

    /// How many transmit times the log can hold.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    fn set(&self, rx: u64) -> &[Slot; WAYS] {
        // The fraction's low bits vary fastest; mix so that neighbouring times spread out.
        let h = rx.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.sets[(h >> 32) as usize & self.mask].0
    }

    /// Saves `tx` as the transmit time of the reply whose receive timestamp was `rx` (which has the
    /// receive mark; an `rx` without it is ignored). A later save under the same `rx` replaces it:
    /// the kernel's timestamp, arriving after the send, replaces the daemon's, read before.
    pub fn save(&self, rx: NtpTimestamp, tx: NtpTimestamp) {
        if rx.0 & RX_MARK == 0 {
            return;
        }
        let set = self.set(rx.0);
        let mut victim = None;
        let mut oldest = u64::MAX;
        for slot in set {
            let key = slot.rx.load(Ordering::Relaxed);
            if key == rx.0 {
                victim = Some((slot, key));
                break;
            }
            // An empty slot counts as the oldest of all; a busy one is someone else's.
            let age = match key {
                0 => 0,
                BUSY => continue,
                _ => slot.tx.load(Ordering::Relaxed),
            };
            if age < oldest {
                oldest = age;
                victim = Some((slot, key));
            }
        }
        let Some((slot, seen)) = victim else { return };
        if slot
            .rx
            .compare_exchange(seen, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        slot.tx.store(tx.0, Ordering::Relaxed);
        slot.rx.store(rx.0, Ordering::Release);
    }

    /// The transmit time saved for the reply whose receive timestamp was `rx`, removed so that it
    /// is used once; `None` if it is not (or no longer) there.
    pub fn take(&self, rx: NtpTimestamp) -> Option<NtpTimestamp> {
        if rx.0 & RX_MARK == 0 {
            return None;
        }
        let slot = self
            .set(rx.0)
            .iter()
            .find(|s| s.rx.load(Ordering::Relaxed) == rx.0)?;
        slot.rx
            .compare_exchange(rx.0, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        let tx = slot.tx.load(Ordering::Relaxed);
        slot.rx.store(0, Ordering::Release);
        Some(NtpTimestamp(tx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responder::tests::served;
    use crate::{respond, stamp_transmit};

    fn request(origin: u64, receive: u64, transmit: u64) -> [u8; 48] {
        let mut h = Header::request(4, Mode::Client, NtpTimestamp(transmit));
        h.origin_ts = NtpTimestamp(origin);
        h.receive_ts = NtpTimestamp(receive);
        let mut b = [0; 48];
        h.encode(&mut b);
        b
    }

    #[test]
    fn interleaved_requests_are_told_from_basic_ones() {
        // chronyd in xleave mode: origin = our last receive timestamp (odd), receive = its own.
        assert_eq!(
            interleaved_origin(&request(0x11_0001, 0x22_0000, 0x33_0000)),
            Some(NtpTimestamp(0x11_0001))
        );
        // Basic chronyd: zero origin. Old ntpd: our transmit timestamp (even) as origin.
        assert_eq!(interleaved_origin(&request(0, 0, 0x33_0000)), None);
        assert_eq!(
            interleaved_origin(&request(0x11_0002, 0x22_0000, 0x33_0000)),
            None
        );
        // Receive equal to transmit: not the interleaved form.
        assert_eq!(
            interleaved_origin(&request(0x11_0001, 0x33_0000, 0x33_0000)),
            None
        );
        // Only NTPv4 client requests.
        let mut v3 = request(0x11_0001, 0x22_0000, 0x33_0000);
        v3[0] = 0x1B;
        assert_eq!(interleaved_origin(&v3), None);
        let mut active = request(0x11_0001, 0x22_0000, 0x33_0000);
        active[0] = 0x21;
        assert_eq!(interleaved_origin(&active), None);
        assert_eq!(interleaved_origin(&[0x23; 20]), None);
    }

    #[test]
    fn replies_mark_receive_and_clear_transmit() {
        let mut reply = [0u8; 48];
        let rx = NtpTimestamp(0xEEAC_6C48_F557_5190); // even: respond sets the mark
        respond(&request(0, 0, 7), 40_000, rx, &served(), &mut reply).unwrap();
        stamp_transmit(&mut reply, NtpTimestamp(0xEEAC_6C48_F557_6001)); // odd: cleared
        let h = Header::parse(&reply).unwrap();
        assert_eq!(h.receive_ts, NtpTimestamp(0xEEAC_6C48_F557_5191));
        assert_eq!(h.transmit_ts, NtpTimestamp(0xEEAC_6C48_F557_6000));
        assert_eq!(reply_receive_timestamp(&reply), Some(h.receive_ts));
        assert_eq!(
            reply_receive_timestamp(&request(0, 0x11, 7)),
            None,
            "a request"
        );
    }

    #[test]
    fn an_interleaved_reply_carries_the_previous_transmit_time() {
        let req = request(0x11_0001, 0x22_0000, 0x33_0000);
        let mut reply = [0u8; 48];
        respond(&req, 40_000, NtpTimestamp(0x44_0001), &served(), &mut reply).unwrap();
        make_interleaved(&mut reply, &req, NtpTimestamp(0x55_0001));
        let h = Header::parse(&reply).unwrap();
        assert_eq!(
            h.origin_ts,
            NtpTimestamp(0x22_0000),
            "the client's receive field"
        );
        assert_eq!(h.receive_ts, NtpTimestamp(0x44_0001));
        assert_eq!(
            h.transmit_ts,
            NtpTimestamp(0x55_0000),
            "saved time, mark cleared"
        );
    }

    #[test]
    fn saved_times_are_taken_once() {
        let log = TxLog::new(1000);
        assert_eq!(log.capacity(), 1024);
        assert_eq!(std::mem::size_of::<Set>(), 64);
        let (rx, tx) = (NtpTimestamp(0xAB_0001), NtpTimestamp(0xCD_0000));
        assert_eq!(log.take(rx), None);
        log.save(rx, NtpTimestamp(0xCC_0000));
        log.save(rx, tx); // the kernel's time replaces the daemon's
        assert_eq!(log.take(NtpTimestamp(0xAB_0003)), None);
        assert_eq!(log.take(rx), Some(tx));
        assert_eq!(log.take(rx), None, "a replay gets a basic reply");
        log.save(NtpTimestamp(0), tx);
        assert_eq!(log.take(NtpTimestamp(0)), None);
    }

    #[test]
    fn the_oldest_time_of_a_set_makes_room() {
        // Four slots, one set: a fifth save evicts the one with the oldest transmit time.
        let log = TxLog::new(4);
        assert_eq!(log.capacity(), 4);
        for k in 1..=4u64 {
            log.save(NtpTimestamp(k << 1 | 1), NtpTimestamp(100 + k));
        }
        log.save(NtpTimestamp(11), NtpTimestamp(200));
        assert_eq!(log.take(NtpTimestamp(3)), None, "the oldest went");
        for k in 2..=4u64 {
            assert_eq!(
                log.take(NtpTimestamp(k << 1 | 1)),
                Some(NtpTimestamp(100 + k))
            );
        }
        assert_eq!(log.take(NtpTimestamp(11)), Some(NtpTimestamp(200)));
    }

    #[test]
    fn a_quarter_full_log_keeps_nearly_every_time() {
        // 16384 clients polling round robin into 65536 entries, as ntpperf at high rates: each
        // takes its time back one round later.
        let log = TxLog::new(1 << 16);
        let clients = 16_384u64;
        let mut kept = 0;
        let key = |round: u64, c: u64| ((round * clients + c) * 0x2_0000_0001) | 1;
        for round in 0..4u64 {
            for c in 0..clients {
                if round > 0 && log.take(NtpTimestamp(key(round - 1, c))).is_some() {
                    kept += 1;
                }
                log.save(
                    NtpTimestamp(key(round, c)),
                    NtpTimestamp(round * clients + c),
                );
            }
        }
        let asked = 3 * clients;
        assert!(kept * 100 >= asked * 97, "kept {kept} of {asked}");
    }

    #[test]
    fn concurrent_saves_and_takes_never_mismatch() {
        // Writers save tx = rx + 1 under keys that collide in a tiny log; readers take whatever
        // they can. A taken time must always belong to its key.
        let log = TxLog::new(4);
        std::thread::scope(|s| {
            for w in 0..4u64 {
                let log = &log;
                s.spawn(move || {
                    for i in 0..200_000u64 {
                        let rx = ((i * 4 + w) << 1) | 1;
                        log.save(NtpTimestamp(rx), NtpTimestamp(rx + 1));
                    }
                });
            }
            for _ in 0..2 {
                let log = &log;
                s.spawn(move || {
                    for i in 0..800_000u64 {
                        let rx = (i << 1) | 1;
                        if let Some(tx) = log.take(NtpTimestamp(rx)) {
                            assert_eq!(tx.0, rx + 1);
                        }
                    }
                });
            }
        });
    }
}
