//! What the kernel tells us about each received datagram, beyond its bytes.
//!
//! A [`RecvMeta`] is filled in by [`crate::UdpSocket::recv_batch`] for every datagram of a batch
//! and read by the handler: who sent it, which local address and interface it arrived on (so the
//! reply can leave from the same address), whether it was cut short, and when the kernel received
//! it (the NTP server's T2).

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// Metadata of one received datagram.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RecvMeta {
    /// The sender's address and port: where a reply goes.
    pub src: SocketAddr,
    /// The destination address in the datagram's IP header, from `IP_PKTINFO` /
    /// `IPV6_PKTINFO`; `None` if the socket could not enable those.
    pub dst_ip: Option<IpAddr>,
    /// The index of the interface the datagram arrived on; 0 if unknown.
    pub ifindex: u32,
    /// The number of payload bytes in the buffer: at most the batch's `max_datagram`.
    pub len: usize,
    /// The datagram was longer than the buffer and its tail was discarded (`MSG_TRUNC`).
    pub truncated: bool,
    /// When the kernel received the datagram, if receive timestamps are enabled.
    pub timestamp: Option<Timestamp>,
    /// The source address a reply should use. For IPv4 this is the kernel's `ipi_spec_dst`, which
    /// equals `dst_ip` for unicast but is an address of the receiving interface when the datagram
    /// was sent to a broadcast address (a broadcast address cannot be a source). For IPv6 it is
    /// `dst_ip` unless that is a multicast address, when the kernel is left to choose.
    pub(crate) reply_ip: Option<IpAddr>,
}

impl RecvMeta {
    /// Metadata with only a sender and a length known, as for a datagram received without control
    /// messages. Useful to construct test inputs for code that consumes `RecvMeta`.
    pub fn new(src: SocketAddr, len: usize) -> Self {
        Self {
            src,
            dst_ip: None,
            ifindex: 0,
            len,
            truncated: false,
            timestamp: None,
            reply_ip: None,
        }
    }

    /// The source address and interface a reply to this datagram is sent from, as
    /// [`crate::TxBatch::reply_to`] uses them; `None` lets the kernel choose.
    pub fn reply_source(&self) -> Option<(IpAddr, u32)> {
        self.reply_ip.map(|ip| (ip, self.ifindex))
    }

    /// Sets the source address a reply should use, for a datagram received other than by
    /// `recvmmsg`: the AF_XDP backend gives the address its request was sent to.
    pub fn set_reply_ip(&mut self, ip: Option<IpAddr>) {
        self.reply_ip = ip;
    }
}

impl Default for RecvMeta {
    fn default() -> Self {
        Self::new(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0), 0)
    }
}

/// A point in time on `CLOCK_REALTIME`, as seconds and nanoseconds since the Unix epoch.
///
/// This is the kernel's own representation of its receive timestamps, kept as is so that no
/// precision is lost before the protocol code converts it to NTP or Roughtime time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Whole seconds since 1970-01-01T00:00:00Z; negative before it.
    pub secs: i64,
    /// Nanoseconds past `secs`, always below 1 000 000 000.
    pub nanos: u32,
}

impl Timestamp {
    /// The current `CLOCK_REALTIME` time, for stamping a transmit time as late as possible.
    pub fn now() -> Self {
        SystemTime::now().into()
    }

    /// Nanoseconds since the Unix epoch; negative before it. For differences between two
    /// timestamps (an i128 holds any `secs`).
    pub fn as_nanos(self) -> i128 {
        i128::from(self.secs) * 1_000_000_000 + i128::from(self.nanos)
    }

    /// The inverse of [`Self::as_nanos`], saturating at `secs`' range.
    pub fn from_nanos(nanos: i128) -> Self {
        let secs = nanos.div_euclid(1_000_000_000);
        Self {
            secs: i64::try_from(secs).unwrap_or(if secs < 0 { i64::MIN } else { i64::MAX }),
            // rem_euclid is in 0..1e9: fits.
            nanos: nanos.rem_euclid(1_000_000_000) as u32,
        }
    }

    /// Converts a kernel `timespec`; `None` for the all-zero value the kernel reports when it has
    /// no timestamp for a datagram, and for an out-of-range nanosecond field.
    pub(crate) fn from_timespec(ts: &libc::timespec) -> Option<Self> {
        if ts.tv_sec == 0 && ts.tv_nsec == 0 {
            return None;
        }
        let nanos = u32::try_from(ts.tv_nsec)
            .ok()
            .filter(|&n| n < 1_000_000_000)?;
        // `as`: time_t is i64 on every 64-bit Linux target and i32 on older 32-bit ones.
        #[allow(clippy::unnecessary_cast)]
        let secs = ts.tv_sec as i64;
        Some(Self { secs, nanos })
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self {
                // Saturate rather than wrap: 2^63 seconds is beyond any clock's range anyway.
                secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                // Before the epoch: floor to whole seconds so that `nanos` stays non-negative.
                let d = e.duration();
                let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                match d.subsec_nanos() {
                    0 => Self {
                        secs: -secs,
                        nanos: 0,
                    },
                    n => Self {
                        secs: -secs - 1,
                        nanos: 1_000_000_000 - n,
                    },
                }
            }
        }
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> Self {
        let since = Duration::new(t.secs.unsigned_abs(), 0);
        let base = if t.secs >= 0 {
            UNIX_EPOCH + since
        } else {
            UNIX_EPOCH - since
        };
        base + Duration::from_nanos(u64::from(t.nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Zeroable;

    #[test]
    fn system_time_round_trip() {
        for (secs, nanos) in [
            (0, 0),
            (1_700_000_000, 999_999_999),
            (-1, 500_000_000),
            (-10, 0),
        ] {
            let t = Timestamp { secs, nanos };
            assert_eq!(Timestamp::from(SystemTime::from(t)), t);
        }
        let before = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(
            Timestamp::from(before),
            Timestamp {
                secs: -2,
                nanos: 500_000_000
            }
        );
    }

    #[test]
    fn nanos_round_trip() {
        for (secs, nanos) in [(0, 0), (1_700_000_000, 999_999_999), (-1, 500_000_000)] {
            let t = Timestamp { secs, nanos };
            assert_eq!(Timestamp::from_nanos(t.as_nanos()), t);
        }
        assert_eq!(
            Timestamp {
                secs: -1,
                nanos: 500_000_000
            }
            .as_nanos(),
            -500_000_000
        );
        assert_eq!(Timestamp::from_nanos(i128::MAX).secs, i64::MAX);
    }

    #[test]
    fn timespec_conversion() {
        let mut ts = libc::timespec::zeroed();
        assert_eq!(Timestamp::from_timespec(&ts), None);
        ts.tv_sec = 1_700_000_000;
        ts.tv_nsec = 5;
        assert_eq!(
            Timestamp::from_timespec(&ts),
            Some(Timestamp {
                secs: 1_700_000_000,
                nanos: 5
            })
        );
        ts.tv_nsec = 1_000_000_000;
        assert_eq!(Timestamp::from_timespec(&ts), None);
    }
}
