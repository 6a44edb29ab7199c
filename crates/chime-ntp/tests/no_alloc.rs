//! The per-packet path allocates nothing: a counting global allocator, armed only around the calls
//! under test on this thread, sees no allocation while a worker's work for a batch is done.

use chime_ntp::{
    Announced, Leap, NtpShort, NtpTimestamp, ServedClock, ServerState, StalePolicy,
    check_extensions, respond, stamp_transmit,
};
use chime_udp::counting_alloc::CountingAlloc;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations_in(f: impl FnOnce()) -> u64 {
    chime_udp::counting_alloc::allocations_in(f).1
}

#[test]
fn a_batch_allocates_nothing() {
    let state = ServerState {
        leap: Leap::NoWarning,
        stratum: 2,
        precision: -25,
        reference_id: [192, 0, 2, 1],
        reference_ts: NtpTimestamp(0xEEAC_6C00_0000_0000),
        root_delay: NtpShort(0x0800),
        root_dispersion: NtpShort(0x0400),
        updated: Some(NtpTimestamp(0xEEAC_6C47_0000_0000)),
        // Served 0.3 s ahead of the clock read, as behind a chronyd run with -x.
        clock: ServedClock {
            anchor: NtpTimestamp(0xEEAC_6C47_0000_0000),
            offset: 0.3,
            rate: 1e-6,
            error: 20e-6,
            error_rate: 1e-5,
        },
        // A leap second pending a second after the clock read, so that replies take its path.
        announced: Some(Announced {
            leap: Leap::AddSecond,
            at: NtpTimestamp(0xEEAC_6C48_0000_0000),
        }),
        tai_offset: Some(37),
        leap_step: chime_ntp::LeapStep::NONE,
    };
    let policy = StalePolicy::default();
    let mut requests: Vec<Vec<u8>> = Vec::new();
    for first in 0..=u8::MAX {
        let mut request = vec![0x5A; 48];
        request[0] = first;
        requests.push(request);
    }
    let mut with_fields = vec![0x23; 48];
    with_fields.extend([0x7A, 0x7A, 0, 28]);
    with_fields.extend([0; 24]);
    with_fields.extend([0; 20]);
    requests.push(with_fields);
    requests.push(vec![0x23; 47]);
    let mut replies: Vec<Vec<u8>> = requests.iter().map(|r| vec![0; r.len()]).collect();

    let mut answered = 0;
    let count = allocations_in(|| {
        let now = NtpTimestamp(0xEEAC_6C48_0000_0000);
        let served = state.served_at(now, &policy);
        for (request, reply) in requests.iter().zip(replies.iter_mut()) {
            let _ = check_extensions(&request[48.min(request.len())..]);
            let t2 = state.clock.serve(now);
            if let Ok(len) = respond(request, 40_000, t2, &served, reply) {
                stamp_transmit(&mut reply[..len], state.clock.serve(now));
                answered += 1;
            }
        }
    });
    assert_eq!(count, 0);
    // Modes 1 and 3 of versions 1–4 in each of the four leap values, v1 mode 0, and the request
    // with extension fields.
    assert_eq!(answered, 4 * 2 * 4 + 4 + 1);
}

/// What a worker adds per request when rate limiting, interleaved mode and NTS are on allocates
/// nothing either: the limiter's lookup, the interleaved log's take and save, opening a cookie,
/// verifying, sealing new cookies and authenticating the reply (or a NAK).
#[test]
fn rate_limiting_interleaving_and_nts_allocate_nothing() {
    use chime_ntp::nts::{self, Check, CookieKeys, Keys};
    use chime_ntp::{ClientTable, Coin, Header, Mode, RateLimit, TxLog};
    let master = CookieKeys::new(1, [7; 32]);
    let mut header = [0u8; 48];
    Header::request(4, Mode::Client, NtpTimestamp(0x1234)).encode(&mut header);
    // A good request and one whose cookie no key opens, under each algorithm.
    let requests: Vec<Vec<u8>> = nts::Aead::ALL
        .into_iter()
        .flat_map(|aead| {
            let len = aead.key_len();
            let v4 = nts::Protocol::NtpV4;
            let keys = Keys::new(v4, aead, &vec![1; len], &vec![2; len]).unwrap();
            let other = Keys::new(v4, aead, &vec![5; len], &vec![5; len]).unwrap();
            let cookie = master.seal(&keys, [3; 16]);
            let foreign = vec![0; nts::cookie_len(aead)];
            [
                nts::client_request(&header, &[9; 32], cookie.as_bytes(), 2, &keys, [4; 16]),
                nts::client_request(&header, &[9; 32], &foreign, 0, &other, [4; 16]),
            ]
        })
        .collect();
    let mut interleaved = header;
    interleaved[24..32].copy_from_slice(&0xABCD_0001u64.to_be_bytes());
    interleaved[32..40].copy_from_slice(&0x7777_0000u64.to_be_bytes());
    let table = ClientTable::new(RateLimit::DEFAULT, 1024, [1, 2]);
    let log = TxLog::new(1024);
    log.save(NtpTimestamp(0xABCD_0001), NtpTimestamp(0x5555_0000));
    let mut coin = Coin::new(9);
    let served = ServerState::unsynchronised().served_at(NtpTimestamp(1), &StalePolicy::default());
    let mut reply = vec![0u8; requests.iter().map(Vec::len).max().unwrap()];
    let mut outcomes = (0, 0, 0);

    let count = allocations_in(|| {
        for i in 0..64u32 {
            let ip = std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i % 8));
            let _ = table.check(ip, u64::from(i) * 1_000_000, &mut coin);
        }
        if let Some(origin) = chime_ntp::interleaved_origin(&interleaved)
            && let Some(tx) = log.take(origin)
        {
            let _ = respond(
                &interleaved,
                40_000,
                NtpTimestamp(2),
                &served,
                &mut reply[..48],
            );
            chime_ntp::make_interleaved(&mut reply[..48], &interleaved, tx);
            log.save(NtpTimestamp(0x9999_0001), NtpTimestamp(0x9999_2000));
            outcomes.0 += 1;
        }
        for request in &requests {
            let _ = respond(
                request,
                40_000,
                NtpTimestamp(2),
                &served,
                &mut reply[..request.len()],
            );
            match nts::check_request(request, &master) {
                Check::Verified(v) => {
                    let len = nts::write_response(&mut reply, request, &v, [6; 16], || {
                        master.seal(&v.keys, [7; 16])
                    });
                    outcomes.1 += usize::from(len == Some(request.len()));
                }
                Check::Nak(uid, _) => {
                    outcomes.2 += usize::from(nts::write_nak(&mut reply, request, uid).is_some());
                }
                _ => {}
            }
        }
    });
    assert_eq!(count, 0);
    let algorithms = nts::Aead::ALL.len();
    assert_eq!(outcomes, (1, algorithms, algorithms));
}

/// Recording a request into the client log allocates nothing, whether it finds its client, evicts
/// one for it, or is the first into a new window of the distinct-client sketches (which clears it).
#[test]
fn the_client_log_allocates_nothing() {
    use chime_ntp::{ClientLog, Fate};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let log = ClientLog::new(64, [1, 2]);
    let count = allocations_in(|| {
        for i in 0..1024u32 {
            // Every 100 s, so that a window of ten minutes and one of an hour begin now and then.
            let now = u64::from(i) * 100_000_000_000;
            let fate =
                [Fate::Answered, Fate::Dropped, Fate::RateLimited, Fate::Kod][i as usize % 4];
            log.record(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i % 8)), now, fate);
            let v6 = Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(i) << 64);
            log.record(IpAddr::V6(v6), now, Fate::Answered);
        }
    });
    assert_eq!(count, 0);
    assert_eq!(log.top(1)[0].requests, 128);
}
