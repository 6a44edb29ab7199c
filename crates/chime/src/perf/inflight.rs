//! Requests in flight: ids unique within a run, and for each one the time it was sent, found again
//! from the id a reply carries.
//!
//! An id is a random tag for the sending thread in the high 24 bits and the thread's sequence
//! number in the low 40. The tag makes ids unguessable across runs (a stray reply to an earlier
//! run, or to another tool on the same port, is not mistaken for ours) and lets each thread tell
//! its own ids from others'; the sequence indexes a ring of slots, so a lookup is one array access
//! and nothing is allocated per request.

use rand::Rng;

/// Bits of an id that hold the sequence number: 2^40 requests per thread per run.
const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const TAG_MASK: u32 = (1 << (64 - SEQ_BITS)) - 1;

/// The step index of requests sent during the warm-up, which are never counted.
pub(crate) const WARMUP: u16 = u16::MAX;

/// What became of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Sent, no reply yet.
    Pending,
    /// A valid reply came in time.
    Answered,
    /// A reply came after the timeout.
    Late,
    /// A reply came that was invalid or a refusal.
    Settled,
}

/// One request's record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    /// The full sequence number, to tell this request from older ones that used the slot.
    seq: u64,
    /// When it was sent, nanoseconds since the Unix epoch (T1): read just before its `sendmmsg`
    /// for the first datagram of the call, placed within the call for the others (see
    /// [`InFlight::commit`]).
    pub(crate) t1_ns: i64,
    /// It was the first datagram of its `sendmmsg`, so its T1 is exact: the server's receive
    /// timestamp error, small enough for the estimate's error to matter, is measured on these.
    pub(crate) first_in_batch: bool,
    /// The step it belongs to, or [`WARMUP`].
    pub(crate) step: u16,
    pub(crate) state: State,
}

/// What an id from a reply turned out to be.
#[derive(Debug)]
pub(crate) enum Lookup<'a> {
    /// Not an id this thread has sent: another tag, or a sequence number not reached yet.
    Foreign,
    /// One of ours, so old that its slot has been reused: certainly past its timeout.
    Expired,
    /// One of ours, with its record.
    Found(&'a mut Slot),
}

/// One thread's ids and in-flight records.
#[derive(Debug)]
pub(crate) struct InFlight {
    tag: u64,
    next_seq: u64,
    slots: Box<[Slot]>,
}

impl InFlight {
    /// A table for the thread with this tag. `slots` is a power of two, large enough that a slot
    /// is reused only after its request's timeout has long passed (see `args::inflight_slots`).
    pub(crate) fn new(tag: u32, slots: usize) -> Self {
        assert!(slots.is_power_of_two(), "{slots} slots");
        let empty = Slot {
            seq: u64::MAX,
            t1_ns: 0,
            step: WARMUP,
            first_in_batch: false,
            state: State::Settled,
        };
        Self {
            tag: u64::from(tag & TAG_MASK),
            next_seq: 0,
            slots: vec![empty; slots].into_boxed_slice(),
        }
    }

    /// The id the next request is sent with.
    pub(crate) fn peek_id(&self, ahead: u64) -> u64 {
        (self.tag << SEQ_BITS) | ((self.next_seq + ahead) & SEQ_MASK)
    }

    /// Records the next `n` ids (as handed out by [`Self::peek_id`] with `ahead` 0..n) as sent in
    /// `step` by one `sendmmsg` that began at `before_ns` and returned at `after_ns`.
    ///
    /// The kernel sends a batch one datagram after another (on loopback it even delivers each into
    /// the server's socket before taking the next), so request i of n is placed i/n of the way
    /// through the call rather than at its start, which would make the last of a batch of 32 look
    /// tens of microseconds slower than it was. Only the first one's T1 is exact.
    pub(crate) fn commit(&mut self, n: u64, before_ns: i64, after_ns: i64, step: u16) {
        let mask = self.slots.len() as u64 - 1;
        let spread = i128::from(after_ns.saturating_sub(before_ns).max(0));
        for i in 0..n {
            let seq = self.next_seq + i;
            // i < n, so the offset is below `spread` and fits.
            let offset = (spread * i128::from(i) / i128::from(n)) as i64;
            self.slots[(seq & mask) as usize] = Slot {
                seq,
                t1_ns: before_ns + offset,
                step,
                first_in_batch: i == 0,
                state: State::Pending,
            };
        }
        self.next_seq += n;
    }

    /// Finds the request an id names.
    pub(crate) fn lookup(&mut self, id: u64) -> Lookup<'_> {
        let seq = id & SEQ_MASK;
        if id >> SEQ_BITS != self.tag || seq >= self.next_seq {
            return Lookup::Foreign;
        }
        let mask = self.slots.len() as u64 - 1;
        let slot = &mut self.slots[(seq & mask) as usize];
        if slot.seq != seq {
            return Lookup::Expired;
        }
        Lookup::Found(slot)
    }
}

/// Distinct, non-zero tags for `threads` threads, so that no id is zero (an NTP transmit timestamp
/// of zero means "unknown") and no two threads share one.
pub(crate) fn thread_tags(threads: usize) -> Vec<u32> {
    let mut rng = rand::rng();
    let mut tags: Vec<u32> = Vec::with_capacity(threads);
    while tags.len() < threads {
        let tag = rng.random::<u32>() & TAG_MASK;
        if tag != 0 && !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_find_their_slots_until_reused() {
        let mut t = InFlight::new(0xAB_CDEF, 4);
        let ids: Vec<u64> = (0..3).map(|i| t.peek_id(i)).collect();
        assert_eq!(ids[0], 0xAB_CDEF << 40);
        // Not sent yet.
        assert!(matches!(t.lookup(ids[0]), Lookup::Foreign));
        // One sendmmsg from 1000 ns to 1300 ns.
        t.commit(3, 1_000, 1_300, 2);
        let Lookup::Found(slot) = t.lookup(ids[0]) else {
            panic!()
        };
        assert!(slot.first_in_batch);
        assert_eq!(slot.t1_ns, 1_000);
        let Lookup::Found(slot) = t.lookup(ids[1]) else {
            panic!()
        };
        assert_eq!(
            (slot.t1_ns, slot.step, slot.state, slot.first_in_batch),
            (1_100, 2, State::Pending, false)
        );
        slot.state = State::Answered;
        let Lookup::Found(slot) = t.lookup(ids[1]) else {
            panic!()
        };
        assert_eq!(slot.state, State::Answered);

        // Another tag, or a sequence number beyond what was sent.
        assert!(matches!(t.lookup(ids[0] ^ (1 << 50)), Lookup::Foreign));
        assert!(matches!(t.lookup(t.peek_id(0)), Lookup::Foreign));

        // Five more requests wrap the four slots: the first ids are now expired.
        let later = t.peek_id(4);
        t.commit(5, 2_000, 2_000, 3);
        assert!(matches!(t.lookup(ids[0]), Lookup::Expired));
        assert!(matches!(t.lookup(later), Lookup::Found(_)));
    }

    #[test]
    fn tags_are_distinct_and_non_zero() {
        let tags = thread_tags(64);
        assert_eq!(tags.len(), 64);
        for (i, t) in tags.iter().enumerate() {
            assert!(*t != 0 && *t <= TAG_MASK);
            assert!(!tags[..i].contains(t));
        }
    }
}
