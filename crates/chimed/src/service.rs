//! The contract every service of the daemon fulfils, on the ground floor: the span it runs in,
//! how it ends when it should not ([`ServiceError`], fail points, a panic's message), how a
//! service on threads of its own is watched and stopped ([`Threads`]), and the heartbeat each
//! serving thread keeps ([`Heartbeats`]). The services (`clock`, `ntp`, `nts`, `roughtime`,
//! `observe`) fulfil it; `daemon` composes them, starts each under its supervisor and feeds
//! systemd's watchdog from the heartbeats. Nothing here knows of the daemon.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The span a service runs in, carrying its name: its task, or its threads, which start it as
/// they start and enter it (the data plane's worker threads' spans are children of it when they
/// are spawned inside it). A log line names the service it came from, and `--log-level` can pick
/// one out (`[service{service=nts-ke}]=debug`).
pub(crate) fn span(service: &'static str) -> tracing::Span {
    tracing::info_span!("service", service = %service)
}

/// Why a service ended before it was asked to.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    /// It returned, although a service runs until it is stopped.
    #[error("ended without an error, before it was asked to stop")]
    Returned,
    /// It gave up, for this reason.
    #[error("failed: {0}")]
    Failed(String),
    /// It (or one of its threads) panicked, with this message.
    #[error("panicked: {0}")]
    Panicked(String),
}

/// What a fail point set to `return` makes a service end with (the `failpoints` feature, tests
/// only): an error naming the fail point.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) fn fail_point_error(name: &str) -> ServiceError {
    ServiceError::Failed(format!("fail point {name}"))
}

/// A service running on threads of its own.
pub(crate) trait Threads: Send + 'static {
    /// Whether any of its threads has ended. Before [`Threads::stop`] that means one died.
    fn any_finished(&self) -> bool;
    /// Asks every thread to stop and waits for them. `Err` with the first panic's message.
    fn stop(self: Box<Self>) -> Result<(), String>;
}

/// The message a panic was given, if it was a string (as `panic!` and `expect` make).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

impl Threads for chime_udp::Workers {
    fn any_finished(&self) -> bool {
        chime_udp::Workers::any_finished(self)
    }

    fn stop(self: Box<Self>) -> Result<(), String> {
        self.join().map_err(panic_message)
    }
}

impl Threads for chime_xdp::XdpWorkers {
    fn any_finished(&self) -> bool {
        chime_xdp::XdpWorkers::any_finished(self)
    }

    fn stop(self: Box<Self>) -> Result<(), String> {
        self.join().map_err(panic_message)
    }
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

/// Accepts connections until the task is aborted, at most `max` at once (one more is closed as
/// soon as it is accepted), each handled by `handle` in a task of its own. A failing accept (out
/// of file descriptors and the like) is logged at most once a minute, as `what`, and retried
/// after 100 ms: it says nothing about the next one. The metrics endpoint and the control socket
/// both serve this way.
pub(crate) async fn serve_connections<L, H, F>(what: &str, max: usize, listener: L, handle: H) -> !
where
    L: Listener,
    H: Fn(L::Stream) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let mut last_error: Option<std::time::Instant> = None;
    loop {
        let stream = match listener.accept_one().await {
            Ok(stream) => stream,
            Err(e) => {
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!("{what}: accept failed: {e}");
                    last_error = Some(std::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue; // too many at once: this one is closed as it is dropped
        };
        let work = handle(stream);
        tokio::spawn(async move {
            let _permit = permit;
            work.await;
        });
    }
}

/// A listening socket that [`serve_connections`] takes connections from.
pub(crate) trait Listener {
    /// One accepted connection.
    type Stream: Send + 'static;
    /// The next connection, whoever it is from.
    fn accept_one(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl Listener for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(stream, _)| stream)
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
