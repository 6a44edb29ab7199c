//! Values whose range is checked where they are parsed: by clap for a flag (so the error names the
//! flag) and by serde for the file (so it names the file and line). Each range and its message is
//! written once, here; `resolve` keeps the rules between keys and the defaults.

use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value out of its range, or not a value of its type at all. `daemon` prints the first as
/// `--flag: reason`, as it prints an error `resolve` finds, and leaves the second to clap.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Bad {
    #[error("{0}")]
    Range(String),
    #[error("{0}")]
    Parse(String),
}

/// Declares `Name(inner)`, valid where `check` gives `Ok`, readable from a flag and from the file.
macro_rules! checked {
    ($($(#[$doc:meta])* $name:ident($inner:ty) = |$v:ident| $check:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub(crate) struct $name(pub(crate) $inner);

        impl TryFrom<$inner> for $name {
            type Error = String;
            fn try_from($v: $inner) -> Result<Self, String> {
                let checked: Result<(), String> = $check;
                checked.map(|()| Self($v))
            }
        }

        impl From<$name> for $inner {
            fn from(v: $name) -> $inner {
                v.0
            }
        }

        impl FromStr for $name {
            type Err = Bad;
            fn from_str(s: &str) -> Result<Self, Bad> {
                let v = s.parse::<$inner>().map_err(|e| Bad::Parse(e.to_string()))?;
                Self::try_from(v).map_err(Bad::Range)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Self::try_from(<$inner>::deserialize(d)?).map_err(serde::de::Error::custom)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.0.serialize(s)
            }
        }
    )*};
}

checked! {
    /// Worker threads of one service on one address family; 0 turns that family off.
    Threads(usize) = |n| at_most(n, MAX_THREADS, "threads is more than the limit of");
    /// `ntp.batch-size`.
    NtpBatch(usize) = |n| batch(n, MAX_NTP_BATCH);
    /// `roughtime.batch-size`: the most one signature covers.
    RoughtimeBatch(usize) = |n| batch(n, chime_roughtime::MAX_BATCH_SIZE);
    /// A socket's receive buffer in bytes.
    RecvBuffer(usize) = |n| match n {
        MIN_RECV_BUFFER..=MAX_RECV_BUFFER => Ok(()),
        _ => Err(format!("{n} bytes is outside {MIN_RECV_BUFFER}..={MAX_RECV_BUFFER}")),
    };
    /// `ntp.interleaved-log`: transmit times kept; 0 turns interleaved mode off.
    TxLogSize(usize) = |n| at_most(n, chime_ntp::TxLog::MAX_ENTRIES, "is more than");
    /// `ratelimit.clients`: the addresses one rate limit tracks.
    Clients(usize) = |n| match n {
        4..=chime_ntp::ClientTable::MAX_CLIENTS => Ok(()),
        _ => Err(format!("{n} clients is outside 4..={}", chime_ntp::ClientTable::MAX_CLIENTS)),
    };
    /// `nts.ke-threads`.
    KeThreads(usize) = |n| match n {
        1..=MAX_NTS_KE_THREADS => Ok(()),
        _ => Err(format!("{n} is not between 1 and {MAX_NTS_KE_THREADS}")),
    };
    /// `roughtime.tcp.connections`; 0 serves Roughtime over UDP only.
    TcpConnections(usize) = |n| at_most(n, MAX_TCP_CONNECTIONS, "is more than");
    /// A count that cannot be 0: `xdp.threads`, `roughtime.tcp.per-address`.
    AtLeastOne(usize) = |n| if n == 0 { Err("must be at least 1".into()) } else { Ok(()) };
    /// An interval that must pass between two things, so more than 0 and up to a day.
    Positive(f64) = |v| seconds(v, MAX_SECONDS).and_then(|()| match v > 0.0 {
        true => Ok(()),
        false => Err("must be more than 0 seconds".into()),
    });
    /// `observe.stats-interval`; 0 logs the statistics only at exit.
    Seconds(f64) = |v| seconds(v, MAX_SECONDS);
    /// `overload.shed-target`: beyond a second a request is stale for any client; 0 turns
    /// shedding off.
    ShedTarget(f64) = |v| seconds(v, 1.0);
    /// `overload.shed-interval`: beyond ten seconds "standing" means little.
    ShedInterval(f64) = |v| seconds(v, 10.0);
    /// `roughtime.gather`: beyond a tenth of a second it only adds delay.
    Gather(f64) = |v| seconds(v, 0.1);
    /// `roughtime.grease`: a share of replies.
    Share(f64) = |v| match v.is_finite() && (0.0..=1.0).contains(&v) {
        true => Ok(()),
        false => Err(format!("{v} is not a share of replies between 0 and 1")),
    };
}

fn at_most(n: usize, max: usize, says: &str) -> Result<(), String> {
    match n <= max {
        true => Ok(()),
        false => Err(format!("{n} {says} {max}")),
    }
}

fn batch(n: usize, max: usize) -> Result<(), String> {
    match (1..=max).contains(&n) {
        true => Ok(()),
        false => Err(format!("batch size {n} is outside 1..={max}")),
    }
}

fn seconds(v: f64, max: f64) -> Result<(), String> {
    match v.is_finite() && (0.0..=max).contains(&v) {
        true => Ok(()),
        false => Err(format!("{v} seconds is outside 0..={max}")),
    }
}

const MAX_THREADS: usize = 1024;
/// The smallest receive buffer accepted: below it the kernel would round up anyway, and a buffer
/// that holds one or two datagrams drops every burst.
const MIN_RECV_BUFFER: usize = 4096;
/// The largest: the kernel takes an int and doubles it.
const MAX_RECV_BUFFER: usize = 1 << 30;
/// The most NTP datagrams per receive and send.
const MAX_NTP_BATCH: usize = 1024;
/// The longest interval of any kind: a day.
const MAX_SECONDS: f64 = 86_400.0;
/// --nts-ke-threads: past the cores of any machine chimed runs on, handshakes only contend.
const MAX_NTS_KE_THREADS: usize = 64;
const MAX_TCP_CONNECTIONS: usize = 1 << 20;
