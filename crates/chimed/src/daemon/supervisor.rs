//! The supervisor: every service of the daemon is started through it, stops on its one
//! cancellation signal, and is watched. A service that ends before it was asked to (it returned,
//! failed or panicked) is logged at error level by name, the others are stopped, and the daemon
//! exits non-zero, so that systemd restarts it.
//!
//! Two kinds of service, one way to watch them: a task on the control plane's runtime (the
//! upstream poller, key rotations, the metrics endpoint), and a group of OS threads of its own
//! (the data plane's workers, NTS-KE, Roughtime over TCP), which the supervisor looks at every
//! [`THREAD_CHECK`] and stops, on the same signal, by their own means.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::service::{Beat, Heartbeats, ServiceError, Threads, panic_message, span};

/// How often thread groups are checked for a dead thread: well inside the 2 s in which a dead
/// service must have taken the daemon down.
pub(crate) const THREAD_CHECK: Duration = Duration::from_millis(100);

/// How long the services together get to stop once asked; past it, the daemon exits anyway.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A service that ended unexpectedly, by name: what the daemon exits with.
#[derive(Debug, thiserror::Error)]
#[error("service {name} {error}")]
pub(crate) struct Failure {
    pub(crate) name: &'static str,
    pub(crate) error: ServiceError,
}

/// The services, the signal they stop on, and what became of them.
#[derive(Debug)]
pub(crate) struct Supervisor {
    stop: CancellationToken,
    tasks: JoinSet<Result<(), ServiceError>>,
    /// The running services' names; a service's is taken out once it ended.
    names: HashMap<Id, &'static str>,
    /// One per serving thread, each made here as its service is started: what the watchdog
    /// reads.
    hearts: Heartbeats,
}

impl Supervisor {
    /// A supervisor with no service yet. Must be made inside the control plane's runtime.
    pub(crate) fn new() -> Self {
        Self {
            stop: CancellationToken::new(),
            tasks: JoinSet::new(),
            names: HashMap::new(),
            hearts: Heartbeats::default(),
        }
    }

    /// The stop signal, for a service that stops by its own means (its threads wait on it).
    pub(crate) fn stop_signal(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Starts `service` as a task in its [`span`]: it runs until the stop signal, which drops it
    /// where it waits.
    pub(crate) fn task<F>(&mut self, name: &'static str, service: F)
    where
        F: Future<Output = Result<(), ServiceError>> + Send + 'static,
    {
        let service = service.instrument(span(name));
        let stop = self.stop.clone();
        let handle = self.tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => Ok(()),
                ended = service => ended.and(Err(ServiceError::Returned)),
            }
        });
        self.names.insert(handle.id(), name);
    }

    /// Watches `threads`, already started (in the [`span`] of `name`, for their log lines): a
    /// thread that ends before the stop signal ends the service; the signal stops them all (on a blocking thread: joining waits).
    pub(crate) fn threads(&mut self, name: &'static str, threads: impl Threads) {
        let stop = self.stop.clone();
        let threads: Box<dyn Threads> = Box::new(threads);
        let handle = self.tasks.spawn(async move {
            let mut check = tokio::time::interval(THREAD_CHECK);
            let asked = loop {
                tokio::select! {
                    () = stop.cancelled() => break true,
                    _ = check.tick() => if threads.any_finished() { break false },
                }
            };
            let joined = tokio::task::spawn_blocking(move || threads.stop())
                .await
                .unwrap_or_else(|e| Err(panic_message(e.into_panic())));
            match (asked, joined) {
                (_, Err(panic)) => Err(ServiceError::Panicked(panic)),
                (true, Ok(())) => Ok(()),
                (false, Ok(())) => Err(ServiceError::Returned),
            }
        });
        self.names.insert(handle.id(), name);
    }

    /// A heartbeat for one more serving thread, to be handed to it as it is started: every
    /// service's threads get theirs here, whatever loop beats it.
    pub(crate) fn beat(&mut self) -> Beat {
        self.hearts.add()
    }

    /// Whether every serving thread has beaten since the last call: the watchdog's question.
    pub(crate) fn all_moved(&mut self) -> bool {
        self.hearts.all_moved()
    }

    /// Waits for the first service to end: `Err` naming it. Never ends while all run.
    pub(crate) async fn first_failure(&mut self) -> Failure {
        let Some(joined) = self.tasks.join_next_with_id().await else {
            // No service at all: nothing can fail; wait for the stop signal's caller.
            return std::future::pending().await;
        };
        let (id, error) = match joined {
            Ok((id, Err(error))) => (id, error),
            // Only a service that was stopped returns Ok, and nothing is stopped yet.
            Ok((id, Ok(()))) => (id, ServiceError::Returned),
            Err(e) => (e.id(), ServiceError::Panicked(join_error_message(e))),
        };
        Failure {
            name: self.name(id),
            error,
        }
    }

    /// Sends the stop signal and waits (at most [`STOP_GRACE`]) for every service to end.
    /// Returns the services that failed while stopping, or did not stop in time.
    pub(crate) async fn stop(mut self) -> Vec<Failure> {
        self.stop.cancel();
        let mut failures = Vec::new();
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next_with_id()).await {
                Ok(None) => break,
                Ok(Some(Ok((_, Ok(()))))) => {}
                Ok(Some(Ok((id, Err(error))))) => failures.push(Failure {
                    name: self.name(id),
                    error,
                }),
                Ok(Some(Err(e))) => failures.push(Failure {
                    name: self.name(e.id()),
                    error: ServiceError::Panicked(join_error_message(e)),
                }),
                Err(_) => {
                    for name in self.running() {
                        failures.push(Failure {
                            name,
                            error: ServiceError::Failed(format!(
                                "did not stop within {} s",
                                STOP_GRACE.as_secs()
                            )),
                        });
                    }
                    break;
                }
            }
        }
        failures
    }

    /// The name of a service that ended, taken out of those running.
    fn name(&mut self, id: Id) -> &'static str {
        self.names.remove(&id).unwrap_or("(unnamed)")
    }

    /// The services not yet ended, by name.
    fn running(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.names.values().copied().collect();
        names.sort_unstable();
        names
    }
}

fn join_error_message(e: tokio::task::JoinError) -> String {
    if e.is_panic() {
        panic_message(e.into_panic())
    } else {
        "cancelled".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;

    /// Threads that run until stopped, or end (or panic) by themselves when told to.
    struct Fake {
        thread: std::thread::JoinHandle<()>,
        stop: Arc<AtomicBool>,
        stopped: Arc<AtomicBool>,
    }

    impl Fake {
        /// `fate`: after 200 ms, `Some(true)` panics, `Some(false)` returns; `None` runs on.
        fn start(fate: Option<bool>, stopped: &Arc<AtomicBool>) -> Self {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            let thread = std::thread::spawn(move || {
                let start = Instant::now();
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                    if start.elapsed() > Duration::from_millis(200) {
                        match fate {
                            Some(true) => panic!("worker fell over"),
                            Some(false) => return,
                            None => {}
                        }
                    }
                }
            });
            Self {
                thread,
                stop,
                stopped: stopped.clone(),
            }
        }
    }

    impl Threads for Fake {
        fn any_finished(&self) -> bool {
            self.thread.is_finished()
        }

        fn stop(self: Box<Self>) -> Result<(), String> {
            self.stop.store(true, Ordering::Release);
            self.stopped.store(true, Ordering::Release);
            self.thread.join().map_err(panic_message)
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Starts a healthy thread group and a healthy task beside `fail`, waits for the first
    /// failure, then stops the rest: returns the failure, how long it took to be seen, and
    /// whether both healthy services were stopped cleanly.
    fn first_of(fail: impl FnOnce(&mut Supervisor)) -> (Failure, Duration, bool) {
        runtime().block_on(async {
            let mut sup = Supervisor::new();
            let stopped = Arc::new(AtomicBool::new(false));
            sup.threads("healthy-threads", Fake::start(None, &stopped));
            let task_ended = Arc::new(AtomicBool::new(false));
            let guard = DropFlag(task_ended.clone());
            sup.task("healthy-task", async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                Ok(())
            });
            let start = Instant::now();
            fail(&mut sup);
            let failure = sup.first_failure().await;
            let took = start.elapsed();
            let leftovers = sup.stop().await;
            let clean = leftovers.is_empty()
                && stopped.load(Ordering::Acquire)
                && task_ended.load(Ordering::Acquire);
            (failure, took, clean)
        })
    }

    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[test]
    fn a_task_that_fails_is_named_and_the_others_stop() {
        let (failure, took, clean) = first_of(|sup| {
            sup.task("upstream", async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(ServiceError::Failed("no socket".into()))
            })
        });
        assert_eq!(failure.name, "upstream");
        assert_eq!(failure.to_string(), "service upstream failed: no socket");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(clean);
    }

    #[test]
    fn a_task_that_panics_is_named() {
        let (failure, took, clean) = first_of(|sup| {
            sup.task("metrics", async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                panic!("listener gone");
            })
        });
        assert_eq!(
            failure.to_string(),
            "service metrics panicked: listener gone"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(clean);
    }

    #[test]
    fn a_task_that_returns_is_a_failure_too() {
        let (failure, _, clean) = first_of(|sup| sup.task("roughtime-keys", async { Ok(()) }));
        assert_eq!(failure.name, "roughtime-keys");
        assert!(matches!(failure.error, ServiceError::Returned), "{failure}");
        assert!(clean);
    }

    #[test]
    fn a_thread_that_panics_is_named_within_two_seconds() {
        let (failure, took, clean) = first_of(|sup| {
            sup.threads("ntp-ipv4", Fake::start(Some(true), &Arc::default()));
        });
        assert_eq!(
            failure.to_string(),
            "service ntp-ipv4 panicked: worker fell over"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(clean);
    }

    #[test]
    fn a_thread_that_ends_is_named() {
        let (failure, took, clean) = first_of(|sup| {
            sup.threads("nts-ke", Fake::start(Some(false), &Arc::default()));
        });
        assert_eq!(failure.name, "nts-ke");
        assert!(matches!(failure.error, ServiceError::Returned), "{failure}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(clean);
    }

    #[test]
    fn the_stop_signal_stops_every_service_cleanly() {
        runtime().block_on(async {
            let mut sup = Supervisor::new();
            let stopped = Arc::new(AtomicBool::new(false));
            sup.threads("roughtime-ipv4", Fake::start(None, &stopped));
            sup.task("upstream", std::future::pending());
            let signal = sup.stop_signal();
            let failures = sup.stop().await;
            assert!(failures.is_empty(), "{failures:?}");
            assert!(stopped.load(Ordering::Acquire) && signal.is_cancelled());
        });
    }

    #[test]
    fn the_watchdog_waits_for_every_beat_the_supervisor_handed_out() {
        runtime().block_on(async {
            let mut sup = Supervisor::new();
            let (worker, ke) = (sup.beat(), sup.beat());
            assert!(!sup.all_moved(), "neither beat yet");
            worker.beat();
            assert!(!sup.all_moved(), "one did not beat");
            ke.beat();
            assert!(
                !sup.all_moved(),
                "the worker did not beat since the last check"
            );
            worker.beat();
            ke.beat();
            assert!(sup.all_moved());
            assert!(sup.stop().await.is_empty());
        });
    }

    /// A real worker group, on a real socket: its handler panics on the first datagram.
    #[test]
    fn a_real_worker_that_panics_is_named() {
        struct Faulty;
        impl chime_udp::BatchHandler for Faulty {
            fn handle(&mut self, _: &chime_udp::RxBatch, _: &mut chime_udp::TxBatch) {
                panic!("bad batch");
            }
        }
        let addr = "127.0.0.1:0".parse().unwrap();
        let bound =
            chime_udp::BoundWorkers::bind(chime_udp::WorkerConfig::new("t", addr, 1)).unwrap();
        let local = bound.local_addr();
        let workers = bound
            .spawn(Arc::new(AtomicBool::new(false)), |_| Faulty)
            .unwrap();
        let (failure, took, _) = first_of(|sup| {
            sup.threads("ntp-ipv4", workers);
            let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            client.send_to(&[0u8; 48], local).unwrap();
        });
        assert_eq!(failure.to_string(), "service ntp-ipv4 panicked: bad batch");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
