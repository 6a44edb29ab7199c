//! One socket over loopback: what `recv_batch` reports about each datagram, and that
//! `send_batch` delivers each reply to its own peer from the address the request was sent to.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket as StdSocket},
    thread,
    time::{Duration, SystemTime},
};

use chime_udp::{RxBatch, SocketConfig, TxBatch, UdpSocket};

/// Long enough that a loaded CI machine does not fail a test, short enough that a lost datagram
/// fails it quickly.
const WAIT: Duration = Duration::from_secs(5);

fn server(ip: IpAddr) -> UdpSocket {
    let mut cfg = SocketConfig::new(SocketAddr::new(ip, 0));
    cfg.read_timeout = Some(WAIT);
    UdpSocket::bind(&cfg).unwrap()
}

fn client(ip: IpAddr) -> StdSocket {
    let sock = StdSocket::bind(SocketAddr::new(ip, 0)).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    sock
}

/// Receives the one datagram a test sent, for tests about content rather than batching.
fn recv_one(sock: &UdpSocket, rx: &mut RxBatch) {
    assert_eq!(sock.recv_batch(rx).unwrap(), 1);
}

#[test]
fn kernel_rx_timestamp_is_present_and_recent() {
    let sock = server(Ipv4Addr::LOCALHOST.into());
    assert!(
        sock.capabilities().rx_timestamps,
        "{:?}",
        sock.capabilities()
    );
    let c = client(Ipv4Addr::LOCALHOST.into());
    let mut rx = RxBatch::new(4, 64);
    // The kernel turns receive timestamping on for the whole system when the first socket asks,
    // through a deferred work item: a datagram that arrives before it has run carries no
    // timestamp (chimed falls back to its per-batch clock read for those). So the first few
    // datagrams after the first timestamping socket opens may go unstamped; a later one must not.
    let mut stamp = None;
    for _ in 0..50 {
        c.send_to(b"when", sock.local_addr().unwrap()).unwrap();
        recv_one(&sock, &mut rx);
        let (meta, payload) = rx.get(0);
        assert_eq!(payload, b"when");
        if meta.timestamp.is_some() {
            stamp = meta.timestamp;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stamped = SystemTime::from(stamp.expect("no kernel timestamp within 50 datagrams"));
    let now = SystemTime::now();
    let age = now.duration_since(stamped).unwrap_or_else(|e| e.duration());
    assert!(
        age < Duration::from_secs(1),
        "timestamp {stamped:?} vs now {now:?}"
    );
}

#[test]
fn timestamps_can_be_turned_off() {
    let mut cfg = SocketConfig::new((Ipv4Addr::LOCALHOST, 0).into());
    cfg.rx_timestamps = false;
    let sock = UdpSocket::bind(&cfg).unwrap();
    assert!(!sock.capabilities().rx_timestamps);
    let c = client(Ipv4Addr::LOCALHOST.into());
    c.send_to(b"when", sock.local_addr().unwrap()).unwrap();
    let mut rx = RxBatch::new(4, 64);
    recv_one(&sock, &mut rx);
    let (meta, payload) = rx.get(0);
    assert_eq!(payload, b"when");
    assert_eq!(meta.timestamp, None);
}

#[test]
fn a_socket_bound_to_one_address_reports_it_without_packet_info() {
    let sock = server(Ipv4Addr::LOCALHOST.into());
    assert!(
        sock.capabilities().pktinfo,
        "replies leave from the bound address"
    );
    let c = client(Ipv4Addr::LOCALHOST.into());
    c.send_to(b"x", sock.local_addr().unwrap()).unwrap();
    let mut rx = RxBatch::new(4, 64);
    recv_one(&sock, &mut rx);
    let (meta, _) = rx.get(0);
    assert_eq!(meta.dst_ip, Some(Ipv4Addr::LOCALHOST.into()));
    assert_eq!(meta.ifindex, 0, "no packet info was asked for");
    let mut tx = TxBatch::new(4, 64);
    assert!(tx.reply_to(meta, |buf| {
        buf[0] = b'y';
        Some(1)
    }));
    assert_eq!(sock.send_batch(&mut tx).sent, 1);
    let mut buf = [0u8; 8];
    let (n, from) = c.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"y"[..], sock.local_addr().unwrap()));
}

#[test]
fn pktinfo_reports_ipv4_destination_and_interface() {
    let sock = server(Ipv4Addr::UNSPECIFIED.into());
    assert!(sock.capabilities().pktinfo);
    let c = client(Ipv4Addr::LOCALHOST.into());
    let port = sock.local_addr().unwrap().port();
    c.send_to(b"x", (Ipv4Addr::LOCALHOST, port)).unwrap();

    let mut rx = RxBatch::new(4, 64);
    recv_one(&sock, &mut rx);
    let (meta, _) = rx.get(0);
    assert_eq!(meta.dst_ip, Some(Ipv4Addr::LOCALHOST.into()));
    assert_eq!(meta.src, c.local_addr().unwrap());
    assert_ne!(meta.ifindex, 0, "loopback has an interface index");
}

#[test]
fn pktinfo_reports_ipv6_destination() {
    let sock = server(Ipv6Addr::UNSPECIFIED.into());
    assert!(sock.capabilities().pktinfo);
    let c = client(Ipv6Addr::LOCALHOST.into());
    let port = sock.local_addr().unwrap().port();
    c.send_to(b"x", (Ipv6Addr::LOCALHOST, port)).unwrap();

    let mut rx = RxBatch::new(4, 64);
    recv_one(&sock, &mut rx);
    let (meta, _) = rx.get(0);
    assert_eq!(meta.dst_ip, Some(Ipv6Addr::LOCALHOST.into()));
    assert_eq!(meta.src, c.local_addr().unwrap());
    assert!(meta.timestamp.is_some());

    // And the reply finds its way back over IPv6, from ::1.
    let mut tx = TxBatch::new(4, 64);
    assert!(tx.reply_to(meta, |b| {
        b[..2].copy_from_slice(b"v6");
        Some(2)
    }));
    assert_eq!(sock.send_batch(&mut tx).sent, 1);
    let mut buf = [0u8; 8];
    let (n, from) = c.recv_from(&mut buf).unwrap();
    assert_eq!(
        (&buf[..n], from),
        (
            &b"v6"[..],
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port)
        )
    );
}

/// All of 127.0.0.0/8 is local, which makes loopback a multi-homed host: a request to 127.0.0.2
/// must be answered from 127.0.0.2, although routing alone would pick 127.0.0.1 as the source.
#[test]
fn reply_leaves_from_the_address_the_request_was_sent_to() {
    let sock = server(Ipv4Addr::UNSPECIFIED.into());
    let port = sock.local_addr().unwrap().port();
    let asked = Ipv4Addr::new(127, 0, 0, 2);
    let c = client(Ipv4Addr::LOCALHOST.into());
    let mut rx = RxBatch::new(4, 64);
    let mut tx = TxBatch::new(4, 64);
    let mut buf = [0u8; 8];

    c.send_to(b"q", (asked, port)).unwrap();
    recv_one(&sock, &mut rx);
    let (meta, _) = rx.get(0);
    assert_eq!(meta.dst_ip, Some(asked.into()));
    assert!(tx.reply_to(meta, |_| Some(0)));
    assert_eq!(sock.send_batch(&mut tx).sent, 1);
    let (_, from) = c.recv_from(&mut buf).unwrap();
    assert_eq!(from, (asked, port).into());

    // The control case: without a source, routing picks 127.0.0.1. This is what makes the check
    // above meaningful.
    assert!(tx.push_with(meta.src, None, |_| Some(0)));
    assert_eq!(sock.send_batch(&mut tx).sent, 1);
    let (_, from) = c.recv_from(&mut buf).unwrap();
    assert_eq!(from, (Ipv4Addr::LOCALHOST, port).into());
}

#[test]
fn one_batch_from_many_senders_gets_one_reply_each() {
    const SENDERS: usize = 6;
    let sock = server(Ipv4Addr::LOCALHOST.into());
    let addr = sock.local_addr().unwrap();
    let clients: Vec<_> = (0..SENDERS)
        .map(|_| client(Ipv4Addr::LOCALHOST.into()))
        .collect();
    for (i, c) in clients.iter().enumerate() {
        c.send_to(format!("request {i}").as_bytes(), addr).unwrap();
    }
    // Loopback delivers during send_to, so this pause is only insurance against a slow softirq: the
    // point is that everything queued comes back from a single recvmmsg.
    thread::sleep(Duration::from_millis(20));

    let mut rx = RxBatch::new(16, 256);
    assert_eq!(sock.recv_batch(&mut rx).unwrap(), SENDERS);
    assert_eq!(rx.len(), SENDERS);
    let mut tx = TxBatch::new(16, 256);
    for (meta, payload) in rx.iter() {
        let reply = [b"reply to ", payload].concat();
        assert!(tx.reply_to(meta, |b| {
            b[..reply.len()].copy_from_slice(&reply);
            Some(reply.len())
        }));
    }
    let outcome = sock.send_batch(&mut tx);
    assert_eq!((outcome.sent, outcome.errors), (SENDERS, 0), "{outcome:?}");

    for (i, c) in clients.iter().enumerate() {
        let mut buf = [0u8; 256];
        let (n, from) = c.recv_from(&mut buf).unwrap();
        assert_eq!(from, addr);
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            format!("reply to request {i}")
        );
    }
}

#[test]
fn oversized_datagram_is_flagged_truncated() {
    let sock = server(Ipv4Addr::LOCALHOST.into());
    let c = client(Ipv4Addr::LOCALHOST.into());
    let big = [0xa5u8; 100];
    c.send_to(&big, sock.local_addr().unwrap()).unwrap();
    c.send_to(&big[..64], sock.local_addr().unwrap()).unwrap();
    thread::sleep(Duration::from_millis(20));

    let mut rx = RxBatch::new(4, 64);
    assert_eq!(sock.recv_batch(&mut rx).unwrap(), 2);
    let (meta, payload) = rx.get(0);
    assert!(meta.truncated);
    assert_eq!((meta.len, payload), (64, &big[..64]));
    // Exactly the buffer's size is not truncated.
    let (meta, payload) = rx.get(1);
    assert!(!meta.truncated);
    assert_eq!(payload.len(), 64);
}

#[test]
fn recv_timeout_returns_zero_and_empties_the_batch() {
    let mut cfg = SocketConfig::new((Ipv4Addr::LOCALHOST, 0).into());
    cfg.read_timeout = Some(Duration::from_millis(30));
    let sock = UdpSocket::bind(&cfg).unwrap();
    let c = client(Ipv4Addr::LOCALHOST.into());
    let mut rx = RxBatch::new(4, 64);

    c.send_to(b"one", sock.local_addr().unwrap()).unwrap();
    assert_eq!(sock.recv_batch(&mut rx).unwrap(), 1);
    assert_eq!(sock.recv_batch(&mut rx).unwrap(), 0);
    assert!(rx.is_empty());
    assert_eq!(rx.iter().count(), 0);
}

#[test]
fn a_lone_datagram_is_not_held_back() {
    // With a long read timeout, a batch with room for 64 must still return the one datagram that
    // is there rather than wait for more (MSG_WAITFORONE).
    let sock = server(Ipv4Addr::LOCALHOST.into());
    let c = client(Ipv4Addr::LOCALHOST.into());
    let addr = sock.local_addr().unwrap();
    let sender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        c.send_to(b"alone", addr).unwrap();
    });
    let mut rx = RxBatch::new(64, 64);
    let start = std::time::Instant::now();
    assert_eq!(sock.recv_batch(&mut rx).unwrap(), 1);
    assert!(start.elapsed() < WAIT, "waited for the full read timeout");
    sender.join().unwrap();
}

#[test]
fn shutdown_read_wakes_a_receive_blocked_without_a_timeout() {
    let sock = std::sync::Arc::new(
        UdpSocket::bind(&SocketConfig::new((Ipv4Addr::LOCALHOST, 0).into())).unwrap(),
    );
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let blocked = std::sync::Arc::clone(&sock);
    std::thread::spawn(move || {
        let mut rx = RxBatch::new(4, 64);
        let _ = done_tx.send(blocked.recv_batch(&mut rx).map_err(|e| e.kind()));
    });
    // Still waiting: nothing was sent and there is no timeout.
    assert!(done_rx.recv_timeout(Duration::from_millis(100)).is_err());
    sock.shutdown_read();
    let got = done_rx
        .recv_timeout(WAIT)
        .expect("shutdown_read did not wake the receive");
    assert_eq!(got, Ok(0));
    let mut rx = RxBatch::new(4, 64);
    assert_eq!(
        sock.recv_batch(&mut rx).unwrap(),
        0,
        "later receives return at once"
    );
}

/// A socket whose small buffer overflows: every datagram sent was either received or counted
/// by `receive_drops`, the kernel's own count, which starts at zero.
#[test]
fn datagrams_the_buffer_had_no_room_for_are_counted_as_drops() {
    let mut cfg = SocketConfig::new(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0));
    cfg.read_timeout = Some(Duration::from_millis(50));
    cfg.recv_buffer = Some(4096);
    let sock = UdpSocket::bind(&cfg).unwrap();
    assert_eq!(sock.receive_drops().unwrap(), 0);
    let to = sock.local_addr().unwrap();
    let c = client(Ipv4Addr::LOCALHOST.into());
    const SENT: u32 = 200;
    for i in 0..SENT {
        c.send_to(&[i as u8; 100], to).unwrap();
    }
    let mut rx = RxBatch::new(64, 2048);
    let mut received = 0;
    loop {
        let n = sock.recv_batch(&mut rx).unwrap();
        if n == 0 {
            break;
        }
        received += n as u32;
    }
    let dropped = sock.receive_drops().unwrap();
    assert!(
        dropped > 0,
        "a {} byte buffer held all {SENT}",
        sock.capabilities().recv_buffer
    );
    assert_eq!(received + dropped, SENT);
}
