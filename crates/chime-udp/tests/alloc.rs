//! Proves the hot path does not allocate: a counting global allocator watches `recv_batch` +
//! `reply_to` + `send_batch` on one socket, and then a whole worker thread's loop, over loopback.
//!
//! This is its own test binary because the global allocator is per binary. Counts are kept per
//! thread, so the test harness and other tests allocating concurrently do not disturb them.

use std::{
    net::{Ipv4Addr, UdpSocket as StdSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use chime_udp::counting_alloc::{
    CountingAlloc, assert_counting, thread_allocations as allocations,
};
use chime_udp::{
    BatchHandler, BoundWorkers, RxBatch, SendOutcome, ShedConfig, ShedTuning, SocketConfig,
    Timestamp, TxBatch, UdpSocket, WorkerConfig,
};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const SENDERS: usize = 4;
const WARMUP: usize = 5;
const ROUNDS: usize = 200;

fn clients() -> Vec<StdSocket> {
    (0..SENDERS)
        .map(|_| {
            let c = StdSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c
        })
        .collect()
}

/// Sends one request from each client, tagged with its index and the round.
fn send_requests(clients: &[StdSocket], server: std::net::SocketAddr, round: usize) {
    for (i, c) in clients.iter().enumerate() {
        c.send_to(&[i as u8, round as u8, 0, 0, 0, 0, 0, 0], server)
            .unwrap();
    }
}

fn expect_replies(clients: &[StdSocket], round: usize) {
    for (i, c) in clients.iter().enumerate() {
        let mut buf = [0u8; 64];
        let n = c.recv(&mut buf).unwrap();
        assert_eq!((n, buf[0], buf[1]), (8, i as u8, round as u8));
    }
}

/// Echoes each datagram with its receive timestamp's nanoseconds in bytes 4..8, the way an NTP
/// responder copies fields and stamps times; none of it may allocate.
fn echo(rx: &RxBatch, tx: &mut TxBatch) {
    for (meta, payload) in rx.iter() {
        tx.reply_to(meta, |buf| {
            buf[..payload.len()].copy_from_slice(payload);
            let nanos = meta.timestamp.map_or(0, |t| t.nanos);
            buf[4..8].copy_from_slice(&nanos.to_be_bytes());
            Some(payload.len())
        });
    }
}

fn stamp(tx: &mut TxBatch) {
    let now = Timestamp::now();
    for payload in tx.payloads_mut() {
        payload[2] = now.secs as u8;
    }
}

#[test]
fn recv_and_send_batches_do_not_allocate() {
    assert_counting();
    let mut cfg = SocketConfig::new((Ipv4Addr::LOCALHOST, 0).into());
    cfg.read_timeout = Some(Duration::from_millis(2));
    let sock = UdpSocket::bind(&cfg).unwrap();
    let addr = sock.local_addr().unwrap();
    let clients = clients();
    let mut rx = RxBatch::new(16, 512);
    let mut tx = TxBatch::new(16, 512);

    let mut during = 0;
    for round in 0..WARMUP + ROUNDS {
        send_requests(&clients, addr, round);
        let before = allocations();
        let mut received = 0;
        while received < SENDERS {
            let n = sock.recv_batch(&mut rx).unwrap();
            echo(&rx, &mut tx);
            received += n;
        }
        stamp(&mut tx);
        let outcome = sock.send_batch(&mut tx);
        assert_eq!(outcome.sent, SENDERS);
        // The idle path too: a receive that times out.
        assert_eq!(sock.recv_batch(&mut rx).unwrap(), 0);
        if round >= WARMUP {
            during += allocations() - before;
        }
        expect_replies(&clients, round);
    }
    assert_eq!(during, 0, "allocations in {ROUNDS} steady-state rounds");
}

/// Counts the worker thread's allocations between consecutive `handle` calls: everything the loop
/// does for one batch (stop check, receive, idle ticks, handle, stamp, send, callbacks).
struct Watcher {
    last: Option<u64>,
    batches: u64,
    total: Arc<AtomicU64>,
    measured: Arc<AtomicU64>,
}

impl BatchHandler for Watcher {
    fn handle(&mut self, rx: &RxBatch, tx: &mut TxBatch) {
        let now = allocations();
        if let Some(last) = self.last
            && self.batches >= WARMUP as u64
        {
            self.total.fetch_add(now - last, Ordering::Relaxed);
            self.measured.fetch_add(1, Ordering::Relaxed);
        }
        self.batches += 1;
        echo(rx, tx);
        // Read last, so the handler's own work is inside the next measured interval too.
        self.last = Some(allocations());
    }

    fn before_send(&mut self, tx: &mut TxBatch) {
        stamp(tx);
    }

    fn after_send(&mut self, outcome: &SendOutcome) {
        assert_eq!(outcome.errors, 0);
    }
}

#[test]
fn worker_loop_does_not_allocate() {
    worker_loop_allocates_nothing(|_| {});
}

/// The same with the loop's optional parts on: gathering (a receive that finds two or three of a
/// round's four requests waits for the rest) and shedding (a decision and the stall clocks on
/// every batch).
#[test]
fn worker_loop_with_gathering_and_shedding_does_not_allocate() {
    worker_loop_allocates_nothing(|cfg| {
        cfg.gather = Some(Duration::from_micros(200));
        cfg.shed = Some(std::sync::Arc::new(ShedTuning::new(ShedConfig::default())));
    });
}

/// Runs a worker configured by `configure` through rounds of requests, and checks that its loop
/// allocated nothing between one batch and the next.
fn worker_loop_allocates_nothing(configure: impl FnOnce(&mut WorkerConfig)) {
    assert_counting();
    let mut cfg = WorkerConfig::new("alloc", (Ipv4Addr::LOCALHOST, 0).into(), 1);
    cfg.socket.read_timeout = Some(Duration::from_millis(5));
    cfg.batch_size = 16;
    cfg.max_datagram = 512;
    configure(&mut cfg);
    let bound = BoundWorkers::bind(cfg).unwrap();
    let addr = bound.local_addr();
    let total = Arc::new(AtomicU64::new(0));
    let measured = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers = bound
        .spawn(Arc::clone(&stop), |_| Watcher {
            last: None,
            batches: 0,
            total: Arc::clone(&total),
            measured: Arc::clone(&measured),
        })
        .unwrap();

    let clients = clients();
    for round in 0..WARMUP + ROUNDS {
        send_requests(&clients, addr, round);
        expect_replies(&clients, round);
        // Now and then let the worker idle through a few read timeouts.
        if round % 50 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    stop.store(true, Ordering::Release);
    workers.join().unwrap();

    let measured = measured.load(Ordering::Relaxed);
    assert!(
        measured >= ROUNDS as u64 - 1,
        "only {measured} batches measured"
    );
    assert_eq!(
        total.load(Ordering::Relaxed),
        0,
        "allocations over {measured} worker batches"
    );
}
