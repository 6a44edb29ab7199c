//! NTS-KE's session slots, and whom to close when they run out (sans-IO: the caller gives the
//! time).
//!
//! A session passes through four steps, each with a deadline of its own ([`Step::deadline`]):
//! the client's first flight (its ClientHello), the rest of the TLS handshake, the request, the
//! response. A client that follows the protocol leaves each step within a round trip or two; an
//! attacker holds a connection by stalling in one (a ClientHello a byte at a time, a handshake
//! never finished, no request after it).
//!
//! A new connection always gets a slot. When every slot is taken, the session that has *done
//! least* is closed for it: the one that has stalled longest in its step, whatever the step.
//! A good client's session is young in every step, since it only waits for round trips, so it
//! is the last to go: with `capacity` slots and connections arriving at `rate` a second, a
//! session is closed this way only if it stalled in one step for longer than about
//! `capacity / rate` seconds while every other did less. Taking the slot of an idle session
//! rather than waiting for it means no good client waits for an attacker's deadline, and no idle
//! accept loop holds a slot.

use std::time::{Duration, Instant};

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// From the accept to the whole ClientHello.
    Hello,
    /// From the ClientHello to the end of the TLS handshake.
    Handshake,
    /// From the handshake to the request's End of Message: a client sends its request with the
    /// handshake's last flight.
    Request,
    /// Writing the response and closing.
    Response,
}

impl Step {
    /// The longest a session may take over this step before it is closed (counted as a timeout):
    /// a round trip across the world many times over, and a lost segment's retransmission (TCP
    /// waits a second before its first). The request comes with the handshake's last flight, so
    /// only a lost segment of its own delays it.
    pub(crate) fn deadline(self) -> Duration {
        match self {
            Self::Hello | Self::Handshake | Self::Response => Duration::from_secs(2),
            Self::Request => Duration::from_secs(1),
        }
    }

    /// The step's name, as the counters and the log give it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Hello => "hello",
            Self::Handshake => "handshake",
            Self::Request => "request",
            Self::Response => "response",
        }
    }
}

/// A session's place in [`Slots`]. A place freed and given to another session gets a new
/// generation, so that a session closed for another cannot free its successor's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionId {
    index: u32,
    generation: u64,
}

#[derive(Debug)]
struct Entry<T> {
    generation: u64,
    step: Step,
    /// When the session entered its step.
    since: Instant,
    /// What the caller holds for the session: how to close it.
    handle: T,
}

/// The sessions in progress, at most `capacity`, each with the handle its caller closes it by.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    entries: Vec<Option<Entry<T>>>,
    free: Vec<u32>,
    generations: u64,
}

/// What [`Slots::admit`] did.
#[derive(Debug)]
pub(crate) struct Admitted<T> {
    pub(crate) id: SessionId,
    /// The session closed to make room: its handle, and the step it stalled in.
    pub(crate) closed: Option<(T, Step)>,
}

impl<T> Slots<T> {
    /// Room for `capacity` sessions at once (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, u32::MAX as usize);
        Self {
            entries: (0..capacity).map(|_| None).collect(),
            // Popped from the end: the lowest index first.
            free: (0..capacity as u32).rev().collect(),
            generations: 0,
        }
    }

    /// Sessions in progress.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// A slot for a session accepted at `now`, in its first step. If none is free, the session
    /// that has stalled longest in its step gives up its own, and its handle is returned for the
    /// caller to close it.
    pub(crate) fn admit(&mut self, now: Instant, handle: T) -> Admitted<T> {
        let (index, closed) = match self.free.pop() {
            Some(index) => (index, None),
            None => {
                let index = self.stalled_longest();
                let entry = self.entries[index as usize].take();
                (index, entry.map(|e| (e.handle, e.step)))
            }
        };
        self.generations += 1;
        let generation = self.generations;
        self.entries[index as usize] = Some(Entry {
            generation,
            step: Step::Hello,
            since: now,
            handle,
        });
        Admitted {
            id: SessionId { index, generation },
            closed,
        }
    }

    /// The session `id` entered `step` at `now`. Nothing if it was closed for another.
    pub(crate) fn enter(&mut self, id: SessionId, step: Step, now: Instant) {
        if let Some(entry) = self.entry(id) {
            entry.step = step;
            entry.since = now;
        }
    }

    /// The session `id` ended: its slot is free. Nothing if it was closed for another.
    pub(crate) fn release(&mut self, id: SessionId) {
        if self.entry(id).is_some() {
            self.entries[id.index as usize] = None;
            self.free.push(id.index);
        }
    }

    fn entry(&mut self, id: SessionId) -> Option<&mut Entry<T>> {
        let slot = self.entries.get_mut(id.index as usize)?;
        slot.as_mut().filter(|e| e.generation == id.generation)
    }

    /// The slot of the session longest in its step, every slot being taken. A scan: at the
    /// capacities chimed runs with, a few microseconds, and only while every slot is taken.
    fn stalled_longest(&self) -> u32 {
        let since = |(_, e): &(usize, &Option<Entry<T>>)| e.as_ref().map(|e| e.since);
        let oldest = self.entries.iter().enumerate().min_by_key(since);
        oldest.map_or(0, |(i, _)| i as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_full_table_closes_the_session_stalled_longest_in_its_step() {
        let t0 = Instant::now();
        let mut slots = Slots::new(3);
        let a = slots.admit(at(t0, 0), "a").id;
        let b = slots.admit(at(t0, 10), "b").id;
        let _c = slots.admit(at(t0, 20), "c").id;
        // a moves on at 30 ms: b, in its first step since 10 ms, has now done least.
        slots.enter(a, Step::Handshake, at(t0, 30));
        let d = slots.admit(at(t0, 40), "d");
        assert_eq!(d.closed, Some(("b", Step::Hello)));
        assert_eq!(slots.len(), 3);
        // b's end, after it was closed for d, frees nothing of d's.
        slots.release(b);
        slots.enter(b, Step::Request, at(t0, 50));
        assert_eq!(slots.len(), 3);
        // Later steps are no shield: c (first step since 20 ms) outlasted a (since 30 ms).
        let e = slots.admit(at(t0, 60), "e");
        assert_eq!(e.closed.map(|(h, _)| h), Some("c"));
    }

    #[test]
    fn a_freed_slot_is_taken_before_any_session_is_closed() {
        let t0 = Instant::now();
        let mut slots = Slots::new(2);
        let a = slots.admit(t0, 1).id;
        let _b = slots.admit(t0, 2).id;
        slots.release(a);
        assert!(slots.admit(at(t0, 5), 3).closed.is_none());
        assert_eq!(slots.len(), 2);
        slots.release(a);
        assert_eq!(slots.len(), 2, "a's old id frees nothing");
    }

    /// An attack, simulated a millisecond at a time: `hostile` connections, a third stalling
    /// before their ClientHello, a third in the handshake, a third after it (each until its
    /// step's deadline), each opened again `reconnect` after it is closed, while good clients
    /// arrive 50 a second and take 20 ms (a far client's round trip) per step.
    struct Attack {
        capacity: usize,
        hostile: usize,
        reconnect: Duration,
        seconds: u32,
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kind {
        Good,
        /// Stalls in this step.
        Hostile(Step),
    }

    impl Attack {
        /// The share of good sessions that completed; `admit` is how a connection gets a slot,
        /// `None` if it is refused (closed at once).
        fn good_share(
            &self,
            admit: fn(&mut Slots<Kind>, Instant, Kind) -> Option<SessionId>,
        ) -> f64 {
            const STEPS: [Step; 4] = [Step::Hello, Step::Handshake, Step::Request, Step::Response];
            let (t0, step_time) = (Instant::now(), Duration::from_millis(20));
            let mut slots: Slots<Kind> = Slots::new(self.capacity);
            // A hostile connection comes back after `reconnect`, give or take half of it.
            let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
            let mut back = |now: Instant| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                now + self.reconnect.mul_f64(0.5 + (seed % 1000) as f64 / 1000.0)
            };
            // Connections and when they arrive: every hostile one within the first `reconnect`.
            let hostile = (0..self.hostile).map(|i| (back(t0), Kind::Hostile(STEPS[i % 3])));
            let mut arriving: Vec<(Instant, Kind)> = hostile.collect();
            let mut live: Vec<(SessionId, Kind, Instant)> = Vec::new();
            let (mut good, mut done) = (0u32, 0u32);
            for ms in 0..self.seconds * 1000 {
                let now = t0 + Duration::from_millis(u64::from(ms));
                if ms % 20 == 0 {
                    arriving.push((now, Kind::Good));
                    good += 1;
                }
                let (due, later): (Vec<_>, Vec<_>) = arriving.drain(..).partition(|a| a.0 <= now);
                arriving = later;
                for (_, kind) in due {
                    let Some(id) = admit(&mut slots, now, kind) else {
                        if let Kind::Hostile(_) = kind {
                            arriving.push((back(now), kind));
                        }
                        continue;
                    };
                    if let Kind::Hostile(step) = kind {
                        slots.enter(id, step, now);
                    }
                    live.push((id, kind, now));
                }
                let mut still = Vec::new();
                for (id, kind, started) in live.drain(..) {
                    let age = now - started;
                    let ended = match kind {
                        // Closed for another.
                        _ if slots.entry(id).is_none() => true,
                        Kind::Good if age >= 4 * step_time => {
                            done += 1;
                            true
                        }
                        Kind::Good => {
                            let step = STEPS[(age.as_millis() / step_time.as_millis()) as usize];
                            if slots.entry(id).is_some_and(|e| e.step != step) {
                                slots.enter(id, step, now);
                            }
                            false
                        }
                        Kind::Hostile(step) => age >= step.deadline(),
                    };
                    match (ended, kind) {
                        (false, _) => still.push((id, kind, started)),
                        (true, Kind::Hostile(_)) => {
                            slots.release(id);
                            arriving.push((back(now), kind));
                        }
                        (true, Kind::Good) => slots.release(id),
                    }
                }
                live = still;
            }
            // Good sessions still in progress at the end are neither done nor lost.
            let in_progress = live.iter().filter(|(_, k, _)| *k == Kind::Good).count() as u32;
            f64::from(done) / f64::from(good - in_progress)
        }
    }

    fn admit(slots: &mut Slots<Kind>, now: Instant, kind: Kind) -> Option<SessionId> {
        Some(slots.admit(now, kind).id)
    }

    /// Without a slot free, a connection is closed at once: what waiting for a slot comes to.
    fn refuse_when_full(slots: &mut Slots<Kind>, now: Instant, kind: Kind) -> Option<SessionId> {
        (slots.len() < slots.entries.len()).then(|| slots.admit(now, kind).id)
    }

    /// 2,000 hostile connections from 250 addresses (eight each), reopened a round trip after
    /// they are closed: with chimed's slots, all of them fit, and each is closed at its step's
    /// deadline.
    #[test]
    fn good_clients_get_through_an_attack_that_fits_in_the_slots() {
        let attack = Attack {
            capacity: super::super::ke::MAX_SESSIONS,
            hostile: 2000,
            reconnect: Duration::from_millis(20),
            seconds: 3,
        };
        let share = attack.good_share(admit);
        assert!(share >= 0.99, "good sessions completed: {share}");
    }

    /// Three times as many hostile connections as slots, each reopened some 200 ms after it is
    /// closed: only closing the session that did least keeps the good ones in; refusing a new
    /// connection while the slots are full lets few in.
    #[test]
    fn good_clients_get_through_an_attack_larger_than_the_slots() {
        let attack = Attack {
            capacity: 1024,
            hostile: 3000,
            reconnect: Duration::from_millis(200),
            seconds: 3,
        };
        let share = attack.good_share(admit);
        assert!(share >= 0.99, "good sessions completed: {share}");
        let refused = attack.good_share(refuse_when_full);
        assert!(
            refused < 0.2,
            "good sessions completed when refused: {refused}"
        );
    }
}
