//! Worker threads started and stopped as one group, for every backend whose workers each own a
//! thread: this crate's socket workers ([`crate::BoundWorkers::spawn`]), and chime-xdp's AF_XDP
//! workers, which serve the same [`crate::BatchHandler`]s.
//!
//! A daemon must know that its workers run before it reports itself started, and a worker that
//! cannot start (its CPU is not allowed, it could not be spawned) must not leave the others
//! serving on their own. So [`Threads::spawn`] pins each thread to its CPU, waits until every
//! thread says it is ready, and on the first failure stops and joins those already running before
//! it returns the error. [`Threads::join`] waits for every thread, after a panic too.

use std::{
    io,
    sync::mpsc,
    thread::{self, JoinHandle},
};

use crate::{affinity, error::ConfigError};

/// A group of worker threads, all of which started (see the module docs). Dropping it leaves the
/// threads running, detached: its owner stops and joins them.
#[derive(Debug)]
pub struct Threads {
    handles: Vec<JoinHandle<()>>,
}

/// A thread's word that it is ready to serve, which [`Threads::spawn`] waits for: its body says
/// so with [`Starting::ready`] once it is set up (its buffers allocated), before its loop. A body
/// that ends or panics without saying so fails the group's start.
#[derive(Debug)]
pub struct Starting(mpsc::Sender<io::Result<()>>);

impl Starting {
    /// Tells [`Threads::spawn`] that this thread is ready.
    pub fn ready(self) {
        // The receiver only goes away if `spawn` itself is gone; nothing left to tell.
        let _ = self.0.send(Ok(()));
    }
}

impl Threads {
    /// Starts one thread for each of `threads`: its name (as `top -H` shows it), the CPU to pin
    /// it to (`None`: wherever the kernel schedules it), and its body, run once the thread is
    /// pinned. Returns once every body has said it is ready.
    ///
    /// If a thread cannot be spawned (those after it are not asked for), cannot be pinned, or
    /// ends before it is ready, this calls `stop` (which must make every body return), waits for
    /// the threads already started, and returns the first error.
    pub fn spawn<F>(
        threads: impl IntoIterator<Item = (String, Option<usize>, F)>,
        stop: impl FnOnce(),
    ) -> io::Result<Self>
    where
        F: FnOnce(Starting) + Send + 'static,
    {
        let (started_tx, started_rx) = mpsc::channel();
        let mut group = Self {
            handles: Vec::new(),
        };
        let mut failure = None;
        for (name, cpu, body) in threads {
            let starting = Starting(started_tx.clone());
            let spawned = thread::Builder::new().name(name.clone()).spawn(move || {
                if let Some(cpu) = cpu
                    && let Err(source) = affinity::pin_current_thread(cpu)
                {
                    let pin = ConfigError::Pin {
                        thread: name,
                        cpu,
                        source,
                    };
                    let _ = starting.0.send(Err(pin.into()));
                    return;
                }
                body(starting);
            });
            match spawned {
                Ok(handle) => group.handles.push(handle),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        drop(started_tx);
        if let Some(e) = await_starts(group.handles.len(), &started_rx) {
            failure.get_or_insert(e);
        }
        if let Some(e) = failure {
            stop();
            // A panic here is secondary to the error being returned.
            let _ = group.join();
            return Err(e);
        }
        Ok(group)
    }

    /// Whether any thread has ended: after its stop was asked for, or because it panicked. Lets
    /// a supervisor notice a dead worker without joining.
    pub fn any_finished(&self) -> bool {
        self.handles.iter().any(JoinHandle::is_finished)
    }

    /// Whether the group holds no thread: none was started, or all were joined.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Waits for every thread of the group, after the first panic too, and leaves the group
    /// empty. Returns the first panic's payload. The caller first makes the threads stop, however
    /// its workers are stopped.
    pub fn join(&mut self) -> thread::Result<()> {
        let mut result = Ok(());
        for t in self.handles.drain(..) {
            if let Err(panic) = t.join()
                && result.is_ok()
            {
                result = Err(panic);
            }
        }
        result
    }
}

/// Waits for each of `n` threads just spawned to report that it started, and returns the first
/// error reported. Every started thread reports once; a thread that ends first drops its sender,
/// so this ends rather than waits forever.
fn await_starts(n: usize, started: &mpsc::Receiver<io::Result<()>>) -> Option<io::Error> {
    let mut failure = None;
    for _ in 0..n {
        match started.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failure.get_or_insert(e);
            }
            Err(mpsc::RecvError) => {
                failure.get_or_insert_with(|| {
                    io::Error::other("a worker thread ended while starting")
                });
                break;
            }
        }
    }
    failure
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    /// A body that serves until `stop` is set.
    fn serving(stop: &Arc<AtomicBool>) -> impl FnOnce(Starting) + Send + 'static {
        let stop = Arc::clone(stop);
        move |starting| {
            starting.ready();
            while !stop.load(Ordering::Acquire) {
                thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn a_thread_that_ends_before_it_is_ready_stops_the_others() {
        let stop = Arc::new(AtomicBool::new(false));
        let quitter: Box<dyn FnOnce(Starting) + Send> = Box::new(|_starting| {});
        let threads = vec![
            ("t-0".to_owned(), None, Box::new(serving(&stop)) as Box<_>),
            ("t-1".to_owned(), None, quitter),
            ("t-2".to_owned(), None, Box::new(serving(&stop))),
        ];
        let err = Threads::spawn(threads, || stop.store(true, Ordering::Release)).unwrap_err();
        assert!(err.to_string().contains("ended while starting"), "{err}");
        // Stopped, so that the two that served ended and could be joined before it returned.
        assert!(stop.load(Ordering::Acquire));
    }

    #[test]
    fn join_waits_for_every_thread_and_reports_the_first_panic() {
        let stop = Arc::new(AtomicBool::new(false));
        let panics: Box<dyn FnOnce(Starting) + Send> = Box::new(|starting| {
            starting.ready();
            panic!("a handler fell over");
        });
        let threads = vec![
            ("t-0".to_owned(), None, panics),
            ("t-1".to_owned(), None, Box::new(serving(&stop))),
        ];
        let mut group = Threads::spawn(threads, || unreachable!("every thread started")).unwrap();
        while !group.any_finished() {
            thread::sleep(std::time::Duration::from_millis(1));
        }
        stop.store(true, Ordering::Release);
        assert!(group.join().is_err());
        assert!(group.is_empty());
    }
}
