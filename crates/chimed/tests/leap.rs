//! Leap seconds end to end: the real chimed behind an upstream that announces a leap second and
//! serves across it what chronyd would, queried many times a second through the leap.
//!
//! The upstream stands in for chronyd, in this process: its time is the system clock moved to a
//! few seconds before the end of 2026 (an injected clock: chimed serves the upstream's time, so
//! it serves the end of the year too), and it serves UTC through an inserted second (its time
//! steps back a second at the leap, as chronyd's does in `leapsecmode system` and `slew`, here
//! with the kernel's clock running on, as under `slew` or `-x`), through a deleted second (a
//! step forward), or time smoothed through the leap (`smoothtime … leaponly`: no step, the second
//! taken up slowly after). A real chronyd cannot play the part on a machine whose clock is not at
//! the leap: chronyd takes a leap second only on the last day of June or December by the system
//! clock, whatever its source serves.
//!
//! Every reply must hold the time the upstream served when it was sent, within the reply's own
//! root distance; carry the warning until the leap and none after; and, from a moment after the
//! leap, be as tight as before it.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use chime_ntp::{Header, Leap, NtpTimestamp};
use common::Chimed;
use common::standin::{StandIn, ntp_now};

/// 2027-01-01T00:00:00Z, the end of the month a leap second is announced for.
const MONTH_END_UNIX: i64 = 1_798_761_600;

/// How the stand-in serves time across the leap.
#[derive(Clone, Copy, Debug)]
enum Across {
    /// UTC, an inserted second: the second before the month's end comes twice.
    InsertedUtc,
    /// UTC, a deleted second: the second before the month's end never comes.
    DeletedUtc,
    /// Smoothed: time runs on through the month's end, 100 ppm slower after it.
    Smoothed,
}

impl Across {
    fn leap(self) -> Leap {
        match self {
            Self::DeletedUtc => Leap::DelSecond,
            _ => Leap::AddSecond,
        }
    }
}

/// Seconds.
fn secs(t: NtpTimestamp) -> f64 {
    let (s, n) = t.to_unix_near(MONTH_END_UNIX);
    (s - MONTH_END_UNIX) as f64 + f64::from(n) * 1e-9
}

fn at(secs: f64) -> NtpTimestamp {
    let whole = secs.floor();
    NtpTimestamp::from_unix(MONTH_END_UNIX + whole as i64, ((secs - whole) * 1e9) as u32)
}

/// The stand-in's time at system time `local` (seconds from the month's end, on the system
/// clock moved by `shift`), and its warning: sent until a second after the leap, as chronyd
/// clears it a moment after.
fn served(across: Across, shift: f64, local: f64) -> (f64, Leap) {
    let raw = local + shift;
    let time = match across {
        Across::InsertedUtc if raw >= 0.0 => raw - 1.0,
        Across::DeletedUtc if raw >= -1.0 => raw + 1.0,
        Across::Smoothed if raw >= 0.0 => raw - 100e-6 * raw,
        _ => raw,
    };
    let leap = if raw < 1.0 {
        across.leap()
    } else {
        Leap::NoWarning
    };
    (time, leap)
}

/// One reply of chimed's: when we sent and got it (system clock, seconds from the month's end),
/// what it said.
#[derive(Debug)]
struct Got {
    sent: f64,
    back: f64,
    leap: Leap,
    receive: f64,
    transmit: f64,
    root_distance: f64,
}

fn query(socket: &UdpSocket, server: SocketAddr, nonce: u64) -> Option<Got> {
    let mut request = [0u8; 48];
    Header::request(4, chime_ntp::Mode::Client, NtpTimestamp(nonce)).encode(&mut request);
    let sent = secs(ntp_now());
    socket.send_to(&request, server).ok()?;
    let mut buf = [0u8; 256];
    loop {
        let n = socket.recv(&mut buf).ok()?;
        let back = secs(ntp_now());
        let Ok(reply) = Header::parse(&buf[..n]) else {
            continue;
        };
        if reply.origin_ts != NtpTimestamp(nonce) {
            continue;
        }
        return Some(Got {
            sent,
            back,
            leap: reply.leap,
            receive: secs(reply.receive_ts),
            transmit: secs(reply.transmit_ts),
            root_distance: reply.root_delay.seconds() / 2.0 + reply.root_dispersion.seconds(),
        });
    }
}

/// chimed (with `extra` flags) behind a stand-in serving `across` a leap `lead` seconds from now,
/// queried every 40 ms from 2 s before the leap to 3 s after: the replies, with the shift of the
/// stand-in's clock.
fn through_the_leap(across: Across, extra: &[&str]) -> (Vec<Got>, f64) {
    let lead = 8.0;
    let shift = -secs(ntp_now()) - lead;
    let upstream = StandIn::start(move |now| {
        let (time, leap) = served(across, shift, secs(now));
        (at(time), leap)
    });
    // chimed polls once a second from its start: started half a second before a whole number of
    // seconds to the leap, its polls fall half way between the leap's edges, so that without the
    // poll it adds at a leap, replies would go half a second without one.
    let leap_local = -shift;
    while ((leap_local - secs(ntp_now())).fract() - 0.5).abs() > 0.01 {
        thread::sleep(Duration::from_millis(2));
    }
    let mut flags = vec!["--stats-interval", "1"];
    flags.extend_from_slice(extra);
    let mut chimed = Chimed::mirroring(&upstream.addr.to_string(), &flags);
    chimed.wait_for("synchronised: stratum 1", Duration::from_secs(5));
    let word = match (across.leap(), extra.is_empty()) {
        (_, false) => "leap_in=",
        (Leap::DelSecond, true) => "leap=delete leap_in=",
        (_, true) => "leap=insert leap_in=",
    };
    chimed.wait_for(word, Duration::from_secs(3));
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while secs(ntp_now()) < leap_local - 2.0 {
        thread::sleep(Duration::from_millis(5));
    }
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    let mut nonce = 0x1EA9_0000_0000_0000u64;
    while Instant::now() < end {
        nonce += 1;
        got.extend(query(&socket, chimed.addr, nonce));
        thread::sleep(Duration::from_millis(40));
    }
    (got, shift)
}

fn check(across: Across) {
    let (got, shift) = through_the_leap(across, &[]);
    assert!(got.len() > 80, "{} replies of about 120", got.len());
    let leap_local = -shift;
    // When the upstream's time may step (a second earlier for a deleted second), and for an
    // inserted second in UTC, when the repeated second ends: chimed cannot know which side of the
    // step a moment after either is on until it has polled, and says so with a second more.
    let start = match across {
        Across::DeletedUtc => leap_local - 1.0,
        _ => leap_local,
    };
    let mut loose: Vec<(f64, f64)> = vec![(start, start + 0.1)];
    if let Across::InsertedUtc = across {
        loose.push((start + 1.0, start + 1.1));
    }
    let mut wide = 0;
    for g in &got {
        // The upstream's time while the reply was on its way, within the reply's bound.
        let (a, b) = (
            served(across, shift, g.sent).0,
            served(across, shift, g.back).0,
        );
        let (lo, hi) = (a.min(b), a.max(b));
        let slack = g.root_distance + 50e-6;
        for t in [g.receive, g.transmit] {
            assert!(
                t >= lo - slack && t <= hi + slack,
                "{across:?}: served {t:.6} outside [{lo:.6}, {hi:.6}] ± {slack:.6} at {:.3} s \
                 from the leap: {g:?}",
                g.sent - leap_local
            );
        }
        let in_loose = loose
            .iter()
            .any(|&(from, to)| g.back >= from && g.sent <= to);
        if g.back < start - 0.05 {
            assert_eq!(g.leap, across.leap(), "{across:?} before the leap: {g:?}");
            assert!(g.root_distance < 0.005, "{across:?} before the leap: {g:?}");
        } else if g.sent > start && !in_loose {
            assert!(
                g.root_distance < 0.005,
                "{across:?}: not tight again: {g:?}"
            );
        }
        // Done: from the poll after the leap, though the upstream still sends its warning for a
        // second (but through an inserted second in UTC, the second before the leap again).
        let done = match across {
            Across::InsertedUtc => start + 1.1,
            _ => start + 0.1,
        };
        if g.sent > done {
            assert_eq!(g.leap, Leap::NoWarning, "{across:?} after the leap: {g:?}");
        }
        wide += usize::from(g.root_distance >= 1.0);
    }
    eprintln!(
        "{across:?}: {} replies, {wide} with the leap's extra second of dispersion",
        got.len()
    );
}

#[test]
fn an_inserted_second_served_as_utc() {
    check(Across::InsertedUtc);
}

#[test]
fn a_deleted_second_served_as_utc() {
    check(Across::DeletedUtc);
}

#[test]
fn an_inserted_second_smoothed_through() {
    check(Across::Smoothed);
}

/// The 24-hour smear noon to noon of an inserted second, as the test reads it: smeared time
/// minus the leap's end at `elapsed` SI seconds from it (continuous time, UTC before the leap).
fn smeared(elapsed: f64) -> f64 {
    elapsed - ((elapsed + 43_200.0) / 86_401.0).clamp(0.0, 1.0)
}

/// `--leap-smear` behind an upstream serving UTC through an inserted second: chimed's time runs
/// on through the leap, half a second behind UTC before it and half a second ahead after (the
/// middle of the day's smear), never repeating, and no reply announces the leap.
#[test]
fn an_inserted_second_smeared_by_chimed() {
    let across = Across::InsertedUtc;
    let (got, shift) = through_the_leap(across, &["--leap-smear"]);
    assert!(got.len() > 80, "{} replies of about 120", got.len());
    let mut last = f64::NEG_INFINITY;
    for g in &got {
        // Continuous time is the stand-in's before its step.
        let (a, b) = (smeared(g.sent + shift), smeared(g.back + shift));
        let slack = g.root_distance + 50e-6;
        assert!(
            g.transmit >= a - slack && g.transmit <= b + slack,
            "smeared {:.6} outside [{a:.6}, {b:.6}] ± {slack:.6} at {:.3} s from the leap: {g:?}",
            g.transmit,
            g.sent + shift
        );
        assert_eq!(g.leap, Leap::NoWarning, "{g:?}");
        assert!(g.transmit > last, "the time served went back: {g:?}");
        last = g.transmit;
    }
}
