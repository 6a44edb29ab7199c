//! An upstream in the test's own process: an NTP server at stratum 1 on loopback that serves, at
//! each reading of the system clock, the time and leap indicator a function of the test's gives.
//! What chronyd follows, or what chimed follows in chronyd's place.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chime_ntp::{Leap, NtpShort, NtpTimestamp, ServedHeader};

pub struct StandIn {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StandIn {
    /// Serves, for the system clock's `now`, the time and leap indicator `serve(now)` gives.
    pub fn start(serve: impl Fn(NtpTimestamp) -> (NtpTimestamp, Leap) + Send + 'static) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = thread::spawn(move || {
            let mut buf = [0u8; 1024];
            let mut reply = [0u8; 48];
            while !stopped.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let (received, leap) = serve(ntp_now());
                let served = ServedHeader {
                    leap,
                    stratum: 1,
                    precision: -20,
                    reference_id: *b"TEST",
                    reference_ts: received,
                    root_delay: NtpShort(0),
                    root_dispersion: NtpShort(0),
                };
                if let Ok(len) =
                    chime_ntp::respond(&buf[..n], from.port(), received, &served, &mut reply)
                {
                    chime_ntp::stamp_transmit(&mut reply[..len], serve(ntp_now()).0);
                    let _ = socket.send_to(&reply[..len], from);
                }
            }
        });
        Self {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The system clock now, as an NTP timestamp.
pub fn ntp_now() -> NtpTimestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    NtpTimestamp::from_unix(d.as_secs() as i64, d.subsec_nanos())
}
