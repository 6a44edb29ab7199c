//! What systemd is told (`Type=notify`, sd_notify(3)): ready once every socket is bound and every
//! service started, reloading and ready again around a SIGHUP, stopping on SIGTERM, and the
//! watchdog's keep-alive, sent only while every serving thread is moving ([`Heartbeats`]). Without
//! `NOTIFY_SOCKET` (not started by systemd) each of these does nothing.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;
use tracing::{debug, warn};

/// The socket systemd listens on (`NOTIFY_SOCKET`), connected once at start, while chimed can
/// still reach it: sd_notify(3), and the sd-notify crate, find it by its path at every call,
/// which a chimed that has since changed root (`--root`) no longer could. The crate still
/// writes the messages.
#[derive(Debug)]
pub(crate) struct Notifier(Option<UnixDatagram>);

impl Notifier {
    /// Connects to `NOTIFY_SOCKET` (a path, or an abstract name after `@`); without it, or if it
    /// cannot be reached, every message is dropped.
    pub(crate) fn connect() -> Self {
        let Some(name) = std::env::var_os("NOTIFY_SOCKET") else {
            return Self(None);
        };
        match connect(&name) {
            Ok(socket) => Self(Some(socket)),
            Err(e) => {
                let shown = name.display();
                warn!("NOTIFY_SOCKET {shown}: {e}; systemd will not hear from chimed");
                Self(None)
            }
        }
    }

    /// Tells systemd that every service is up.
    pub(crate) fn ready(&self) {
        self.send(&[NotifyState::Ready]);
    }

    /// Tells systemd that a reload began: `RELOADING=1` with the monotonic time, as
    /// `Type=notify-reload` requires; [`Self::ready`] ends it.
    pub(crate) fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(_) => self.send(&[NotifyState::Reloading]),
        }
    }

    /// Tells systemd that chimed is stopping.
    pub(crate) fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }

    /// Feeds the watchdog.
    pub(crate) fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    fn send(&self, states: &[NotifyState]) {
        let Some(socket) = &self.0 else {
            return;
        };
        let message: String = states.iter().map(|s| format!("{s}\n")).collect();
        // systemd notices what it did not hear; a failed send is worth a debug line.
        if let Err(e) = socket.send(message.as_bytes()) {
            debug!("sd_notify: {e}");
        }
    }
}

fn connect(name: &OsStr) -> std::io::Result<UnixDatagram> {
    use std::os::linux::net::SocketAddrExt as _;
    let addr = match name.as_bytes().strip_prefix(b"@") {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
        None => SocketAddr::from_pathname(name)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.connect_addr(&addr)?;
    Ok(socket)
}

/// How often to feed the watchdog, if systemd asked for one (`WatchdogSec=`): twice per period,
/// as sd_watchdog_enabled(3) advises. Read as that page says: `WATCHDOG_USEC`, for this process
/// unless `WATCHDOG_PID` names another (sd_notify's own `watchdog_enabled` wants the PID set).
pub(crate) fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse() != Ok(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// One counter per serving thread. A data-plane worker's handler advances it on every pass
/// through its loop: every batch, and every idle wake-up (the workers' sockets time out once a
/// [`WORKER_WAKE`] without traffic). A thread that runs tasks on a runtime of its own (NTS-KE,
/// Roughtime over TCP) advances it on a tick of that runtime, every [`WORKER_WAKE`]. The watchdog
/// is fed only if each advanced since it was last fed, so a thread stuck in a batch or in a call
/// that blocks its runtime, or dead, starves it and systemd restarts chimed.
#[derive(Debug, Default)]
pub(crate) struct Heartbeats {
    beats: Vec<(Arc<AtomicU64>, u64)>,
}

/// How long a serving thread waits for traffic (or its runtime for its next tick) before it
/// wakes up to show it is alive.
pub(crate) const WORKER_WAKE: Duration = Duration::from_secs(1);

impl Heartbeats {
    /// A new counter for one more thread.
    pub(crate) fn add(&mut self) -> Beat {
        let beat = Arc::new(AtomicU64::new(0));
        self.beats.push((beat.clone(), 0));
        Beat(beat)
    }

    /// Whether every thread has beaten since the last call (the first call compares with 0).
    pub(crate) fn all_moved(&mut self) -> bool {
        let mut all = true;
        for (beat, seen) in &mut self.beats {
            let now = beat.load(Ordering::Relaxed);
            all &= now != *seen;
            *seen = now;
        }
        all
    }
}

/// A thread's heartbeat; see [`Heartbeats`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Beat(Arc<AtomicU64>);

/// Beats `beat` every [`WORKER_WAKE`], for as long as the runtime it runs on does: spawned on the
/// runtime of a thread that serves in tasks (NTS-KE), it shows that nothing blocks that thread.
pub(crate) async fn beat_on_every_wake(beat: Beat) {
    let mut wake = tokio::time::interval(WORKER_WAKE);
    loop {
        wake.tick().await;
        beat.beat();
    }
}

impl Beat {
    /// One more pass through the thread's loop. Only this thread writes it, so a load and a
    /// store (no read-modify-write) are enough.
    pub(crate) fn beat(&self) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_moves_only_if_every_thread_beat() {
        let mut hearts = Heartbeats::default();
        let (a, b) = (hearts.add(), hearts.add());
        assert!(!hearts.all_moved(), "nothing beat yet");
        a.beat();
        b.beat();
        assert!(hearts.all_moved());
        a.beat();
        assert!(!hearts.all_moved(), "b did not beat since");
        a.beat();
        b.beat();
        assert!(hearts.all_moved());
        let c = hearts.add();
        a.beat();
        b.beat();
        assert!(!hearts.all_moved(), "c, added since, did not beat");
        for beat in [&a, &b, &c] {
            beat.beat();
        }
        assert!(hearts.all_moved());
    }
}
