//! The clock as published: what the upstream poller last mirrored from chronyd, and what every
//! service reads to serve it (NTP, NTS, Roughtime, the metrics). The poller is its one writer; the
//! workers load it once per batch. With `--xdp-in-driver` each state published is also written
//! where the program that answers in the driver reads it, so that program is one more reader.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use arc_swap::{ArcSwap, ArcSwapOption, Guard};
use chime_ntp::v5::{self, BloomFilter};
use chime_ntp::{Leap, NtpTimestamp, ServedHeader, ServerState, Smear, StalePolicy};
use chime_xdp::{DriverInput, DriverMaps, DriverState};
use tracing::{info, warn};

use crate::clock::{self, tz, tz::Zone};
use crate::config::Settings;

/// chronyd's state as last mirrored, how it ages, and how it is served: the leap smear, the zone
/// in timezone-offset mode, NTPv5's reference-ID filter.
#[derive(Debug)]
pub(crate) struct Published {
    state: ArcSwap<ServerState>,
    policy: StalePolicy,
    /// `--leap-smear`: leap seconds smeared over the day around them.
    smear: bool,
    /// The timezone-offset mode's zone, if on; replaced on SIGHUP.
    zone: ArcSwapOption<Zone>,
    /// NTPv5, if on: the reference-ID filter served.
    filter: Option<ReferenceFilter>,
    /// Where the monotonic clock is read from, to see the system clock step.
    epoch: Instant,
    /// `--xdp-in-driver`: what writes each state into the maps of the program that answers in
    /// the driver, once attached.
    driver: OnceLock<DriverWriter>,
}

impl Published {
    /// Unsynchronised until the poller's first reply, served as `settings` say.
    pub(crate) fn new(settings: &Settings) -> Self {
        let filter = settings.ntp.v5.then(|| {
            let filter = ReferenceFilter::new(rand::random);
            let bits: Vec<u16> = filter.own.bits().collect();
            info!(
                "ntp: NTPv5 on (drafts {}), server ID bits {bits:?}",
                v5::Draft::ALL.map(|d| d.label()).join(" and "),
            );
            filter
        });
        Self::with(
            ServerState::unsynchronised(),
            StalePolicy {
                stale_after: settings.upstream.stale_after.duration(),
                ..StalePolicy::default()
            },
            settings.ntp.leap_smear,
            filter,
        )
    }

    /// `state` published, aged by `policy`, with the smear on or off and NTPv5's filter if any.
    pub(crate) fn with(
        state: ServerState,
        policy: StalePolicy,
        smear: bool,
        filter: Option<ReferenceFilter>,
    ) -> Self {
        Self {
            state: ArcSwap::from_pointee(state),
            policy,
            smear,
            zone: ArcSwapOption::empty(),
            filter,
            epoch: Instant::now(),
            driver: OnceLock::new(),
        }
    }

    /// The state as last mirrored.
    pub(crate) fn load(&self) -> Guard<Arc<ServerState>> {
        self.state.load()
    }

    /// Publishes a newly mirrored state (the poller's), in the driver too if it answers there.
    pub(crate) fn publish(&self, state: ServerState) {
        self.state.store(Arc::new(state));
        self.to_driver();
    }

    /// From now on, every state published is also written into `maps`, the answering program's
    /// (`--xdp-in-driver`); the one in force is written at once, before this returns. Set once,
    /// at start.
    pub(crate) fn answer_in_driver(&self, maps: Arc<DriverMaps>) {
        if self.driver.get().is_some() {
            return;
        }
        let writer = DriverWriter::start(maps);
        writer.write(&self.driver_state());
        let _ = self.driver.set(writer);
    }

    /// The maps of the program that answers in the driver, once attached (`--xdp-in-driver`).
    pub(crate) fn driver(&self) -> Option<&Arc<DriverMaps>> {
        self.driver.get().map(|w| &w.maps)
    }

    /// Hands the state in force to be written where the program in the driver reads it. Only
    /// when it changes: the program ages it as [`ServerState::served_at`] does, turning it
    /// unsynchronised past the stale time, so a poller that hears nothing more need write
    /// nothing more.
    fn to_driver(&self) {
        if let Some(writer) = self.driver.get() {
            writer.hand(self.driver_state());
        }
    }

    /// The state in force as the program in the driver reads it, with the zone as it is now.
    fn driver_state(&self) -> DriverState {
        let zone = self.zone();
        let now_unix = clock::read().unix_secs();
        DriverState::new(&driver_input(
            &self.load(),
            &self.policy,
            clock::kernel_tai_offset(),
            zone.as_deref().map(|z| (z, now_unix)),
            self.smear,
        ))
    }

    /// How the state ages when chronyd goes quiet.
    pub(crate) fn policy(&self) -> &StalePolicy {
        &self.policy
    }

    /// Whether leap seconds are smeared (`--leap-smear`).
    pub(crate) fn smears(&self) -> bool {
        self.smear
    }

    /// The zone in timezone-offset mode, if on.
    pub(crate) fn zone(&self) -> Option<Arc<Zone>> {
        self.zone.load_full()
    }

    /// Serves the local time of `zone` from now on.
    pub(crate) fn set_zone(&self, zone: Arc<Zone>) {
        self.zone.store(Some(zone));
        self.to_driver();
    }

    /// NTPv5's reference-ID filter, if v5 is on.
    pub(crate) fn filter(&self) -> Option<&ReferenceFilter> {
        self.filter.as_ref()
    }

    /// What a reply sent at local time `now` says about the clock ([`ServerState::served_at`]
    /// under the stale policy), with `--leap-smear` never a leap warning: the smear takes the
    /// leap up, and clients must not apply it too.
    pub(crate) fn served_at(&self, state: &ServerState, now: NtpTimestamp) -> ServedHeader {
        let mut served = state.served_at(now, &self.policy);
        if self.smear && matches!(served.leap, Leap::AddSecond | Leap::DelSecond) {
            served.leap = Leap::NoWarning;
        }
        served
    }

    /// With `--leap-smear` and a leap second within the day of local time `reading`: the smear,
    /// and whether the time served has taken the leap's step. The monotonic clock is read only
    /// within seconds of the leap.
    pub(crate) fn smear_at(
        &self,
        state: &ServerState,
        reading: clock::Reading,
    ) -> Option<(Smear, bool)> {
        if !self.smear {
            return None;
        }
        state.smear_at(reading.ntp(), || self.realtime_minus_monotonic(reading))
    }

    /// The system clock at `reading` less the monotonic clock now, seconds: it moves only when
    /// the system clock is stepped.
    pub(crate) fn realtime_minus_monotonic(&self, reading: clock::Reading) -> f64 {
        reading.since_epoch.as_secs_f64() - self.epoch.elapsed().as_secs_f64()
    }
}

/// Writes states into the maps of the program that answers in the driver, on a thread of its own:
/// a write makes a map and swaps it into the program's slot, and the kernel's swap waits out
/// every program still reading the old one (about 15 ms here), which the poller, on the async
/// runtime, must not. The poller hands over the newest state and goes on; a state handed over
/// while an older one is being written replaces any still waiting, so the last one handed over
/// is always the last written.
#[derive(Debug)]
struct DriverWriter {
    maps: Arc<DriverMaps>,
    next: Arc<(Mutex<Option<DriverState>>, Condvar)>,
    /// The last write failed (logged once until one succeeds).
    failed: Arc<AtomicBool>,
    /// The thread runs; without it, states are written as they are handed over.
    threaded: bool,
}

impl DriverWriter {
    /// The writer of `maps`, its thread waiting for a state.
    fn start(maps: Arc<DriverMaps>) -> Self {
        let mut writer = Self {
            maps,
            next: Arc::default(),
            failed: Arc::default(),
            threaded: false,
        };
        let (maps, next, failed) = (
            writer.maps.clone(),
            writer.next.clone(),
            writer.failed.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("xdp-state".into())
            .spawn(move || {
                let (slot, handed) = &*next;
                loop {
                    let mut waiting = slot.lock().unwrap_or_else(PoisonError::into_inner);
                    let state = loop {
                        match waiting.take() {
                            Some(state) => break state,
                            None => {
                                waiting =
                                    handed.wait(waiting).unwrap_or_else(PoisonError::into_inner);
                            }
                        }
                    };
                    drop(waiting);
                    write_state(&maps, &state, &failed);
                }
            });
        match spawned {
            Ok(_) => writer.threaded = true,
            Err(e) => warn!(
                "xdp: no thread to write the state into the driver ({e}): the poller writes it"
            ),
        }
        writer
    }

    /// Writes `state` now, on the caller's thread.
    fn write(&self, state: &DriverState) {
        write_state(&self.maps, state, &self.failed);
    }

    /// Hands `state` to the writer's thread.
    fn hand(&self, state: DriverState) {
        if !self.threaded {
            return self.write(&state);
        }
        let (slot, handed) = &*self.next;
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(state);
        handed.notify_one();
    }
}

/// Writes `state` into `maps`, saying once when writes start failing and once when they work
/// again.
fn write_state(maps: &DriverMaps, state: &DriverState, failed: &AtomicBool) {
    match maps.set_state(state) {
        Ok(()) => {
            if failed.swap(false, Ordering::Relaxed) {
                info!("xdp: the state in the driver is written again");
            }
        }
        Err(e) => {
            if !failed.swap(true, Ordering::Relaxed) {
                warn!(
                    "xdp: cannot write the state into the driver ({e}): it keeps the last one, \
                     which it turns unsynchronised past the stale time"
                );
            }
        }
    }
}

/// What the program in the driver is given for `state` under `policy`, with the kernel's TAI
/// offset `tai` (`CLOCK_TAI` less `CLOCK_REALTIME`, which the program subtracts from the one
/// clock it can read). Answering is allowed: the settings that would forbid it are refused with
/// `--xdp-in-driver`, and [`DriverState::new`] turns it off around a leap second.
///
/// In timezone-offset mode, `zone` at Unix second `now_unix`: the reference timestamp shifted as
/// the workers shift it, and the zone's offset now and at its next change for the program to
/// shift the times it writes. With `--leap-smear` (`smear`) and a leap to smear: the local times
/// around its window within which the program hands every request to the workers.
pub(crate) fn driver_input(
    state: &ServerState,
    policy: &StalePolicy,
    tai: i64,
    zone: Option<(&Zone, i64)>,
    smear: bool,
) -> DriverInput {
    let reference_ts = match zone {
        Some((zone, now_unix)) => zone.apply(state.reference_ts, now_unix),
        None => state.reference_ts,
    };
    DriverInput {
        answer: true,
        leap: state.leap as u8,
        leap_announced: state.announced.is_some(),
        stratum: state.stratum,
        precision: state.precision,
        reference_id: state.reference_id,
        reference_ts: reference_ts.0,
        root_delay: state.root_delay.0,
        root_dispersion: state.root_dispersion.0,
        updated: state.updated.map(|t| t.0),
        stale_after_ns: u64::try_from(policy.stale_after.as_nanos()).unwrap_or(u64::MAX),
        dispersion_rate: policy.dispersion_rate,
        anchor: state.clock.anchor.0,
        offset: state.clock.offset,
        rate: state.clock.rate,
        error: state.clock.error,
        error_rate: state.clock.error_rate,
        tai_offset: tai,
        zone: zone.map(|(zone, now_unix)| tz::driver_zone(zone, now_unix)),
        smear: smear.then(|| smear_window(state)).flatten(),
    }
}

/// The local times (NTP 32.32) from and until which `ServerState::smear_at` may smear: its window
/// in served time (a second wider each side, as it takes it) around the leap it remembers, widened
/// on each side by as much as the served time can be from the local clock (the followed offset,
/// its rate over the 16 s it is held for) and a second more. `None` without a leap to smear.
fn smear_window(state: &ServerState) -> Option<(u64, u64)> {
    let leap = state.leap_step.leap?;
    let (start, end) = Smear { announced: leap }.window();
    let served_from_local = state.clock.offset.abs() + 16.0 * state.clock.rate.abs() + 1.0;
    let at = |seconds: f64| {
        leap.at
            .0
            .wrapping_add((seconds * 4_294_967_296.0).round() as i64 as u64)
    };
    Some((
        at(start - 1.0 - served_from_local),
        at(end + 1.0 + served_from_local),
    ))
}

/// NTPv5's reference-ID Bloom filter: chimed's own identity, and the one served, which adds the
/// upstream's filter when the upstream speaks v5 (the upstream poller gathers it).
#[derive(Debug)]
pub(crate) struct ReferenceFilter {
    own: BloomFilter,
    served: ArcSwap<BloomFilter>,
}

impl ReferenceFilter {
    /// chimed's own identity, drawn from `random`, alone in the filter served until the
    /// upstream's is known.
    pub(crate) fn new(random: impl FnMut() -> u16) -> Self {
        let mut own = BloomFilter::new();
        own.add_id(&v5::ServerId::new(random));
        Self {
            own,
            served: ArcSwap::from_pointee(own),
        }
    }

    /// The filter replies carry.
    pub(crate) fn served(&self) -> Guard<Arc<BloomFilter>> {
        self.served.load()
    }

    /// Serves our own identity with the upstream's `filter`.
    pub(crate) fn with_upstream(&self, filter: &BloomFilter) {
        let mut both = self.own;
        both.add(filter);
        self.served.store(Arc::new(both));
    }
}

/// What tests of the services that read the clock need.
#[cfg(test)]
pub(crate) mod testing {
    use chime_ntp::{NtpShort, ServedClock};

    use super::*;

    /// A fresh state from a synchronised upstream, stratum 3, reference `LOCL`.
    pub(crate) fn synchronised() -> ServerState {
        ServerState {
            leap: Leap::NoWarning,
            stratum: 3,
            precision: -20,
            reference_id: *b"LOCL",
            reference_ts: clock::now(),
            root_delay: NtpShort::from_seconds(0.001),
            root_dispersion: NtpShort::from_seconds(0.002),
            updated: Some(clock::now()),
            clock: ServedClock::LOCAL,
            announced: None,
            tai_offset: None,
            leap_step: chime_ntp::LeapStep::NONE,
        }
    }

    /// `state` published under the default stale policy, no smear, no NTPv5.
    pub(crate) fn published(state: ServerState) -> Arc<Published> {
        Arc::new(Published::with(state, StalePolicy::default(), false, None))
    }
}

#[cfg(test)]
mod tests {
    use chime_ntp::{Announced, ServedClock};

    use super::*;

    #[test]
    fn the_driver_hands_on_around_a_smeared_leap_with_room_for_the_served_offset() {
        let mut state = testing::synchronised();
        let input = |state: &ServerState, smear| {
            driver_input(state, &StalePolicy::default(), 37, None, smear)
        };
        assert_eq!(input(&state, true).smear, None, "no leap to smear");
        let at = NtpTimestamp(0xee00_0000_0000_0000);
        state.leap_step.leap = Some(Announced {
            leap: Leap::AddSecond,
            at,
        });
        state.clock = ServedClock {
            offset: -0.5,
            rate: 1e-3,
            ..ServedClock::LOCAL
        };
        assert_eq!(input(&state, false).smear, None, "no --leap-smear");
        // The smear is noon to noon, a second longer in continuous time for the inserted one (the
        // window `Smear` gives); a second more each side as `smear_at` takes it, then 0.5 s + 16
        // ms of served offset and a second: 2.516 s each side.
        let (from, until) = input(&state, true).smear.unwrap();
        let seconds = |t: u64| (t.wrapping_sub(at.0) as i64) as f64 / 4_294_967_296.0;
        assert!(
            (seconds(from) - (-43_200.0 - 2.516)).abs() < 1e-6,
            "{}",
            seconds(from)
        );
        assert!(
            (seconds(until) - (43_201.0 + 2.516)).abs() < 1e-6,
            "{}",
            seconds(until)
        );
    }
}
