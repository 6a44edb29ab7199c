//! Worker threads over loopback: several `SO_REUSEPORT` sockets on one port, all serving, the
//! handler's callbacks in order, and a prompt stop.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket as StdSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use chime_udp::{BatchHandler, BoundWorkers, RxBatch, SendOutcome, TxBatch, WorkerConfig};

const WAIT: Duration = Duration::from_secs(5);

/// Echoes every datagram back to its sender and counts what it saw.
struct Echo {
    stats: Arc<Stats>,
    thread: usize,
    sent_in_last_batch: usize,
}

#[derive(Default)]
struct Stats {
    handled: [AtomicUsize; 2],
    idle: AtomicUsize,
    sent: AtomicUsize,
    finished: AtomicUsize,
    /// Callback order problems, recorded rather than panicked on so the test can report them.
    violations: Mutex<Vec<String>>,
}

impl BatchHandler for Echo {
    fn handle(&mut self, rx: &RxBatch, tx: &mut TxBatch) {
        if !tx.is_empty() {
            self.stats
                .violations
                .lock()
                .unwrap()
                .push("tx not empty on entry".into());
        }
        for (meta, payload) in rx.iter() {
            tx.reply_to(meta, |buf| {
                buf[..payload.len()].copy_from_slice(payload);
                Some(payload.len())
            });
        }
        self.stats.handled[self.thread].fetch_add(rx.len(), Ordering::Relaxed);
    }

    fn before_send(&mut self, tx: &mut TxBatch) {
        self.sent_in_last_batch = tx.len();
    }

    fn after_send(&mut self, outcome: &SendOutcome) {
        if outcome.sent != self.sent_in_last_batch {
            self.stats
                .violations
                .lock()
                .unwrap()
                .push(format!("{outcome:?}"));
        }
        self.stats.sent.fetch_add(outcome.sent, Ordering::Relaxed);
    }

    fn idle(&mut self) {
        self.stats.idle.fetch_add(1, Ordering::Relaxed);
    }

    fn finish(&mut self) {
        self.stats.finished.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn reuse_port_workers_share_one_port_and_all_serve() {
    const CLIENTS: usize = 64;
    let mut cfg = WorkerConfig::new("echo", (Ipv4Addr::LOCALHOST, 0).into(), 2);
    cfg.socket.read_timeout = Some(Duration::from_millis(50));
    let bound = BoundWorkers::bind(cfg).unwrap();
    let addr = bound.local_addr();
    assert_ne!(addr.port(), 0, "the real port, not the one asked for");
    assert!(bound.capabilities().pktinfo && bound.capabilities().rx_timestamps);

    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers = bound
        .spawn(Arc::clone(&stop), |thread| Echo {
            stats: Arc::clone(&stats),
            thread,
            sent_in_last_batch: 0,
        })
        .unwrap();
    assert_eq!(workers.local_addr(), addr);

    // Many source ports, so the kernel's 4-tuple hash spreads them over both sockets.
    let clients: Vec<StdSocket> = (0..CLIENTS)
        .map(|_| {
            let c = StdSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            c.set_read_timeout(Some(WAIT)).unwrap();
            c
        })
        .collect();
    for (i, c) in clients.iter().enumerate() {
        c.send_to(format!("ping {i}").as_bytes(), addr).unwrap();
    }
    for (i, c) in clients.iter().enumerate() {
        let mut buf = [0u8; 64];
        let (n, from) = c.recv_from(&mut buf).unwrap();
        assert_eq!(from, addr);
        assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), format!("ping {i}"));
    }

    let handled = stats.handled.each_ref().map(|h| h.load(Ordering::Relaxed));
    assert_eq!(handled.iter().sum::<usize>(), CLIENTS);
    // Both sockets received some: they are bound to the same port. All 64 clients hashing to one
    // socket has a probability of 2^-63.
    assert!(
        handled.iter().all(|&n| n > 0),
        "per-thread counts {handled:?}"
    );
    assert_eq!(stats.sent.load(Ordering::Relaxed), CLIENTS);

    // Idle ticks arrive while nothing is sent.
    let deadline = Instant::now() + WAIT;
    while stats.idle.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(stats.idle.load(Ordering::Relaxed) > 0);

    stop.store(true, Ordering::Release);
    let stopping = Instant::now();
    workers.join().unwrap();
    // A stop is noticed within a read timeout (50 ms); the bound is loose for busy machines.
    assert!(
        stopping.elapsed() < WAIT,
        "join took {:?}",
        stopping.elapsed()
    );
    assert_eq!(stats.finished.load(Ordering::Relaxed), 2);
    assert_eq!(*stats.violations.lock().unwrap(), Vec::<String>::new());
}

#[test]
fn join_wakes_workers_blocked_without_a_timeout_and_ipv6() {
    // The default: no read timeout, so idle workers are blocked in recvmmsg and only `join`
    // (shutting their sockets down) can wake them. IPv6 loopback; threads named from the prefix.
    let cfg = WorkerConfig::new("v6", (std::net::Ipv6Addr::LOCALHOST, 0).into(), 2);
    let bound = BoundWorkers::bind(cfg).unwrap();
    let addr: SocketAddr = bound.local_addr();
    let names = Arc::new(Mutex::new(Vec::new()));

    struct Named(Arc<Mutex<Vec<String>>>);
    impl BatchHandler for Named {
        fn handle(&mut self, _: &RxBatch, _: &mut TxBatch) {}
        fn finish(&mut self) {
            let name = std::thread::current().name().map(str::to_owned);
            self.0.lock().unwrap().push(name.unwrap_or_default());
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let workers = bound
        .spawn(Arc::clone(&stop), |_| Named(Arc::clone(&names)))
        .unwrap();
    assert_eq!(workers.local_addr(), addr);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!workers.any_finished(), "idle workers wait for traffic");
    let stopping = Instant::now();
    workers.join().unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(1),
        "join took {:?}",
        stopping.elapsed()
    );
    assert!(stop.load(Ordering::Acquire), "join sets the stop flag");
    let mut names = names.lock().unwrap().clone();
    names.sort();
    assert_eq!(names, ["v6-0", "v6-1"]);
}

#[test]
fn a_panicking_handler_is_reported_by_join() {
    struct Panics;
    impl BatchHandler for Panics {
        fn handle(&mut self, _: &RxBatch, _: &mut TxBatch) {
            panic!("handler bug");
        }
    }
    let mut cfg = WorkerConfig::new("panic", (Ipv4Addr::LOCALHOST, 0).into(), 1);
    cfg.socket.read_timeout = Some(Duration::from_millis(20));
    let bound = BoundWorkers::bind(cfg).unwrap();
    let addr = bound.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let workers = bound.spawn(Arc::clone(&stop), |_| Panics).unwrap();
    StdSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .send_to(b"boom", addr)
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while !workers.any_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Release);
    assert!(workers.join().is_err());
}

/// Echoes every datagram and records the size of every batch it was handed.
struct Recorder {
    batches: Arc<Mutex<Vec<usize>>>,
}

impl BatchHandler for Recorder {
    fn handle(&mut self, rx: &RxBatch, tx: &mut TxBatch) {
        self.batches.lock().unwrap().push(rx.len());
        for (meta, payload) in rx.iter() {
            tx.reply_to(meta, |buf| {
                buf[..payload.len()].copy_from_slice(payload);
                Some(payload.len())
            });
        }
    }
}

#[test]
fn gathering_waits_under_load_and_never_for_a_lone_datagram() {
    const GATHER: Duration = Duration::from_secs(1);
    let mut cfg = WorkerConfig::new("gather", (Ipv4Addr::LOCALHOST, 0).into(), 1);
    cfg.batch_size = 16;
    cfg.gather = Some(GATHER);
    let bound = BoundWorkers::bind(cfg).unwrap();
    let addr = bound.local_addr();
    let client = StdSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    client.set_read_timeout(Some(WAIT)).unwrap();
    // Two queued before the worker starts: its first receive returns both, a sign of load.
    for p in ["a", "b"] {
        client.send_to(p.as_bytes(), addr).unwrap();
    }
    let batches = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let workers = bound
        .spawn(Arc::clone(&stop), |_| Recorder {
            batches: Arc::clone(&batches),
        })
        .unwrap();
    // Well inside the gathering wait: these join the first batch.
    std::thread::sleep(GATHER / 5);
    for p in ["c", "d", "e"] {
        client.send_to(p.as_bytes(), addr).unwrap();
    }
    let mut buf = [0u8; 16];
    let mut echoed = Vec::new();
    for _ in 0..5 {
        let n = client.recv(&mut buf).unwrap();
        echoed.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert_eq!(echoed, ["a", "b", "c", "d", "e"]);
    assert_eq!(*batches.lock().unwrap(), [5]);

    // Alone, a datagram is answered at once, not after the gathering wait.
    let sent = Instant::now();
    client.send_to(b"f", addr).unwrap();
    let n = client.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"f");
    assert!(
        sent.elapsed() < GATHER / 2,
        "a lone datagram took {:?}",
        sent.elapsed()
    );
    assert_eq!(*batches.lock().unwrap(), [5, 1]);

    stop.store(true, Ordering::Release);
    workers.join().unwrap();
}
