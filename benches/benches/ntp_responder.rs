//! The NTP responder's per-packet cost: one request, and a batch of 64 as a worker sees it (one
//! served-header computation per batch, then 64 responses and 64 transmit stamps); and the same
//! batch with `--ratelimit` on, its 64 requests from 64 of 65536 client addresses in a table of
//! 65536, each client under its limit (the common case: the lookup and the update are the cost);
//! the batch with every receive and transmit time mapped through a followed offset and rate, and
//! then smeared through a leap second as `--leap-smear` does;
//! and one NTS request as chronyd sends it in steady state (one cookie, no placeholders):
//! opening the cookie, verifying the authenticator, sealing a new cookie and authenticating the
//! reply; and what the client log adds per request.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use chime_ntp::{
    Announced, ClientLog, ClientTable, Coin, Fate, Header, Leap, LeapStep, Mirror, Mode, NtpShort,
    NtpTimestamp, RateLimit, ServedClock, ServerState, StalePolicy, Verdict, respond,
    stamp_transmit, suggest_poll,
};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};

fn request() -> [u8; 48] {
    let h = Header::request(4, Mode::Client, NtpTimestamp(0x1234_5678_9abc_def0));
    let mut out = [0u8; 48];
    h.encode(&mut out);
    out
}

/// A synchronised state, produced the way the daemon produces it: a mirror fed a chronyd reply.
fn state(now: NtpTimestamp) -> ServerState {
    let upstream: SocketAddr = (Ipv4Addr::LOCALHOST, 11123).into();
    let mut mirror = Mirror::new(upstream);
    let poll = mirror.request(now, 42);
    let mut reply = Header::parse(&poll).unwrap();
    reply.mode = Mode::Server;
    reply.stratum = 2;
    reply.reference_id = [192, 0, 2, 1];
    reply.reference_ts = now;
    reply.origin_ts = reply.transmit_ts;
    reply.receive_ts = now;
    reply.transmit_ts = now;
    reply.root_delay = NtpShort::from_seconds(0.01);
    reply.root_dispersion = NtpShort::from_seconds(0.001);
    let mut bytes = [0u8; 48];
    reply.encode(&mut bytes);
    mirror.on_reply(upstream, &bytes, now).unwrap();
    mirror.state()
}

const BATCH: usize = 64;

/// The group's benches over one synchronised state, in the order criterion reports them.
fn bench(c: &mut Criterion) {
    let now = NtpTimestamp::from_unix(1_790_000_000, 0);
    let state = state(now);
    let policy = StalePolicy {
        stale_after: Duration::from_secs(8),
        ..StalePolicy::default()
    };
    let req = request();
    let served = Served {
        state: &state,
        policy: &policy,
        now,
    };

    let mut g = c.benchmark_group("ntp_responder");
    plain(&mut g, &served, &req);
    served_offset(&mut g, &served, &req);
    smeared(&mut g, &served, &req);
    ratelimited(&mut g, &served, &req);
    nts(&mut g, &served, &req);
    client_log(&mut g, &served, &req);
    g.finish();
}

/// What every bench answers from: the state, its staleness policy and the time now.
struct Served<'a> {
    state: &'a ServerState,
    policy: &'a StalePolicy,
    now: NtpTimestamp,
}

/// One request, and a batch of 64, with no rate limit.
fn plain(g: &mut BenchmarkGroup<'_, WallTime>, s: &Served<'_>, req: &[u8; 48]) {
    let (state, policy, now) = (s.state, s.policy, s.now);
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_packet", |b| {
        let mut reply = [0u8; 48];
        b.iter(|| {
            let served = state.served_at(black_box(now), policy);
            let n = respond(black_box(req), 40000, now, &served, &mut reply).unwrap();
            stamp_transmit(&mut reply[..n], now);
            black_box(&reply);
        })
    });

    let requests = [*req; BATCH];
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("batch_64", |b| {
        let mut replies = [[0u8; 48]; BATCH];
        b.iter(|| {
            let served = state.served_at(black_box(now), policy);
            for (req, reply) in requests.iter().zip(replies.iter_mut()) {
                respond(black_box(req), 40000, now, &served, reply).unwrap();
            }
            for reply in replies.iter_mut() {
                stamp_transmit(reply, now);
            }
            black_box(&replies);
        })
    });
}

/// The batch of 64 as chimed answers it behind a chronyd whose served time is away from the
/// clock (`-x`, a slew, `smoothtime`): every receive and transmit time mapped through the
/// followed offset and its rate, beside `batch_64`, which maps nothing.
fn served_offset(g: &mut BenchmarkGroup<'_, WallTime>, s: &Served<'_>, req: &[u8; 48]) {
    let (policy, now) = (s.policy, s.now);
    let state = ServerState {
        clock: followed(now),
        ..*s.state
    };
    let requests = [*req; BATCH];
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("batch_64_served_offset", |b| {
        let mut replies = [[0u8; 48]; BATCH];
        b.iter(|| {
            let served = state.served_at(black_box(now), policy);
            let clock = black_box(state.clock);
            for (req, reply) in requests.iter().zip(replies.iter_mut()) {
                respond(black_box(req), 40000, clock.serve(now), &served, reply).unwrap();
            }
            let t3 = clock.serve(black_box(now));
            for reply in replies.iter_mut() {
                stamp_transmit(reply, t3);
            }
            black_box(&replies);
        })
    });
}

/// An offset of 0.3 s followed from chronyd at `now`, moving at 2 ppm.
fn followed(now: NtpTimestamp) -> ServedClock {
    ServedClock {
        anchor: now,
        offset: 0.3,
        rate: 2e-6,
        error: 20e-6,
        error_rate: 1e-6,
    }
}

/// [`served_offset`]'s batch through a leap second's smear (`--leap-smear`), an hour before the
/// leap: the smear looked up once for the batch, then every receive and transmit time smeared.
fn smeared(g: &mut BenchmarkGroup<'_, WallTime>, s: &Served<'_>, req: &[u8; 48]) {
    let (policy, now) = (s.policy, s.now);
    let leap = Announced {
        leap: Leap::AddSecond,
        at: now.add_duration(Duration::from_secs(3600)),
    };
    let state = ServerState {
        clock: followed(now),
        leap_step: LeapStep {
            leap: Some(leap),
            ..LeapStep::NONE
        },
        ..*s.state
    };
    let requests = [*req; BATCH];
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("batch_64_smeared", |b| {
        let mut replies = [[0u8; 48]; BATCH];
        b.iter(|| {
            let served = state.served_at(black_box(now), policy);
            let clock = black_box(state.clock);
            let (smear, stepped) = state.smear_at(black_box(now), || 0.0).unwrap();
            for (req, reply) in requests.iter().zip(replies.iter_mut()) {
                let t2 = smear.serve(clock.serve(now), stepped);
                respond(black_box(req), 40000, t2, &served, reply).unwrap();
            }
            let t3 = smear.serve(clock.serve(black_box(now)), stepped);
            for reply in replies.iter_mut() {
                stamp_transmit(reply, t3);
            }
            black_box(&replies);
        })
    });
}

/// A batch of 64 with the rate limit on; the group's throughput is still 64 per iteration.
fn ratelimited(g: &mut BenchmarkGroup<'_, WallTime>, s: &Served<'_>, req: &[u8; 48]) {
    let (state, policy, now) = (s.state, s.policy, s.now);
    let requests = [*req; BATCH];
    // 65536 clients in 172.18.0.0/16 (ntpperf's range), one request every 2 s each at most:
    // far under a limit of 16 a second, so every verdict is Answer and the table is full. The
    // table relents for fast retries, as chimed's NTP table does, so each request also updates
    // its client's rates.
    let limit = RateLimit::new(-4, 16, 2, 0).unwrap();
    let table = ClientTable::new(limit, 1 << 16, [1, 2]).relenting();
    let clients: Vec<IpAddr> = (0..1u32 << 16)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0xac12_0000 | i)))
        .collect();
    let mut coin = Coin::new(3);
    let mut next = 0usize;
    // 2^16 clients × 2 s apart each: the clock advances 2 s / 2^16 per request.
    let mut mono: u64 = 1_000_000_000;
    g.bench_function("batch_64_ratelimited", |b| {
        let mut replies = [[0u8; 48]; BATCH];
        b.iter(|| {
            let served = state.served_at(black_box(now), policy);
            for (req, reply) in requests.iter().zip(replies.iter_mut()) {
                respond(black_box(req), 40000, now, &served, reply).unwrap();
                let ip = clients[next];
                next = (next + 7919) & 0xffff;
                mono += 30_518;
                let verdict = table.check(ip, mono, &mut coin);
                debug_assert_eq!(verdict, Verdict::Answer);
                black_box(verdict);
                suggest_poll(reply, limit.interval());
            }
            for reply in replies.iter_mut() {
                stamp_transmit(reply, now);
            }
            black_box(&replies);
        })
    });
}

/// The clients a log holds in chimed by default (`--client-log`).
const LOGGED: u32 = 16384;

/// A client log of chimed's default size, filled with that many clients (172.18.0.0/18, each
/// seen once), and where the next address of [`next_client`] starts.
fn filled_log(mono: u64) -> ClientLog {
    let log = ClientLog::new(LOGGED as usize, [1, 2]);
    for i in 0..LOGGED {
        let ip = IpAddr::V4(Ipv4Addr::from(0xac12_0000 | i));
        log.record(ip, mono, Fate::Answered);
    }
    log
}

/// The next request's source: seven in eight from the clients that filled the log, in a
/// scattered order, the eighth from an IPv6 /64 never seen (which raises a register in both of
/// the sketches' current windows and evicts a client, which may be one of the others, then
/// counted anew).
fn next_client(next: &mut u32, new: &mut u64) -> IpAddr {
    let ip = if *next & 7 == 0 {
        *new += 1;
        IpAddr::V6(Ipv6Addr::from(
            0x2001_0db8_u128 << 96 | u128::from(*new) << 64,
        ))
    } else {
        IpAddr::V4(Ipv4Addr::from(0xac12_0000 | (*next % LOGGED)))
    };
    *next = next.wrapping_add(7919);
    ip
}

/// One request recorded into a client log of chimed's default size, as every worker does for
/// every request; and the batch of 64 with each request recorded, beside `batch_64`, which
/// records none.
fn client_log(g: &mut BenchmarkGroup<'_, WallTime>, s: &Served<'_>, req: &[u8; 48]) {
    let mut mono: u64 = 1_000_000_000;
    let log = filled_log(mono);
    let (mut next, mut new) = (0u32, 0u64);
    g.throughput(Throughput::Elements(1));
    g.bench_function("client_log_record", |b| {
        b.iter(|| {
            mono += 30_518;
            let ip = next_client(&mut next, &mut new);
            log.record(black_box(ip), mono, Fate::Answered);
        })
    });

    let (state, policy, now) = (s.state, s.policy, s.now);
    let requests = [*req; BATCH];
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("batch_64_client_log", |b| {
        let mut replies = [[0u8; 48]; BATCH];
        b.iter(|| {
            mono += 1_953_125;
            let served = state.served_at(black_box(now), policy);
            for (req, reply) in requests.iter().zip(replies.iter_mut()) {
                respond(black_box(req), 40000, now, &served, reply).unwrap();
                log.record(next_client(&mut next, &mut new), mono, Fate::Answered);
            }
            for reply in replies.iter_mut() {
                stamp_transmit(reply, now);
            }
            black_box(&replies);
        })
    });
}

/// One NTS request: the cookie opened, the authenticator checked, a new cookie sealed and the
/// reply authenticated; under each AEAD algorithm (`nts_one_request` is AEAD_AES_SIV_CMAC_256's,
/// the others are named by their number).
fn nts(g: &mut BenchmarkGroup<'_, WallTime>, s: &Served<'_>, req: &[u8; 48]) {
    let (state, policy, now) = (s.state, s.policy, s.now);
    let master = chime_ntp::nts::CookieKeys::new(1, [7; 32]);
    for aead in chime_ntp::nts::Aead::ALL {
        let len = aead.key_len();
        let keys = chime_ntp::nts::Keys::new(
            chime_ntp::nts::Protocol::NtpV4,
            aead,
            &vec![1; len],
            &vec![2; len],
        )
        .unwrap();
        // As chronyd sends it in steady state: a unique identifier, one cookie, no placeholder.
        let cookie = master.seal(&keys, [3; 16]);
        let nts_request = chime_ntp::nts::client_request(req, &[9; 32], &cookie, 0, &keys, [4; 16]);
        let name = match aead {
            chime_ntp::nts::Aead::AesSivCmac256 => "nts_one_request".to_owned(),
            other => format!("nts_one_request_aead{}", other.id()),
        };
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            let mut reply = vec![0u8; nts_request.len()];
            b.iter(|| {
                let served = state.served_at(black_box(now), policy);
                respond(black_box(&nts_request), 40000, now, &served, &mut reply).unwrap();
                stamp_transmit(&mut reply, now);
                let chime_ntp::nts::Check::Verified(v) =
                    chime_ntp::nts::check_request(&nts_request, &master)
                else {
                    panic!("the bench request must verify");
                };
                let len =
                    chime_ntp::nts::write_response(&mut reply, &nts_request, &v, [5; 16], || {
                        master.seal(&v.keys, [6; 16])
                    });
                black_box(len)
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
