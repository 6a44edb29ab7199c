//! What chime's XDP programs cost per frame by themselves, as the kernel times them under
//! `BPF_PROG_TEST_RUN` (no driver, no copy, no system call in the figure): the program that
//! answers plain NTP in the driver, on each of its paths, beside the steering program that hands
//! a request to an AF_XDP socket. Each run starts from the request as built here.
//!
//! Loading the programs needs root (`CAP_BPF`, `CAP_NET_ADMIN`); without it the bench says why and
//! measures nothing. Run with `cargo bench -p chime-benches --bench xdp_program`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use chime_xdp::prog_test_run::{Outcome, XdpProgram};
use chime_xdp::{DriverInput, DriverLimits, DriverRule, DriverState};
use criterion::{Criterion, criterion_group, criterion_main};

const SERVER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 7);
/// Seconds from 1900 (NTP's era 0) to 1970.
const NTP_UNIX: u64 = 2_208_988_800;

/// The ones' complement sum of `data` as big-endian 16-bit words.
fn sum(data: &[u8]) -> u32 {
    (data.chunks(2))
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An Ethernet frame carrying `payload` in UDP from `src` to `dst`, checksums right.
fn frame(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let udp_len = (8 + payload.len()) as u16;
    let mut udp = Vec::new();
    udp.extend_from_slice(&src.port().to_be_bytes());
    udp.extend_from_slice(&dst.port().to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    let (pseudo, ip) = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
            ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let c = fold(sum(&ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            let pseudo = [
                &s.octets()[..],
                &d.octets(),
                &[0, 17],
                &udp_len.to_be_bytes(),
            ]
            .concat();
            (pseudo, ip)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            let mut ip = vec![0x60, 0, 0, 0];
            ip.extend_from_slice(&udp_len.to_be_bytes());
            ip.extend_from_slice(&[17, 64]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let len = u32::from(udp_len).to_be_bytes();
            let pseudo = [&s.octets()[..], &d.octets(), &len, &[0, 0, 0, 17]].concat();
            (pseudo, ip)
        }
        _ => unreachable!("one family"),
    };
    let c = fold(sum(&pseudo) + sum(&udp));
    udp[6..8].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&udp);
    f
}

/// A plain NTPv4 client request from `client` to port 123 of `server`.
fn request(client: IpAddr, server: IpAddr) -> Vec<u8> {
    let mut ntp = [0u8; 48];
    ntp[0] = 0x23;
    ntp[2] = 6;
    ntp[40..48].copy_from_slice(&0xE111_2222_3333_4444_u64.to_be_bytes());
    frame(
        SocketAddr::new(client, 40_123),
        SocketAddr::new(server, 123),
        &ntp,
    )
}

/// A synchronised state, last updated a second ago by the system clock.
fn state() -> DriverState {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let now = ((since.as_secs() + NTP_UNIX) << 32) | u64::from(since.subsec_nanos() >> 2) << 2;
    let second = 1 << 32;
    DriverState::new(&DriverInput {
        answer: true,
        stratum: 2,
        precision: -20,
        reference_id: *b"GPS\0",
        reference_ts: now - 8 * second,
        root_delay: 0x123,
        root_dispersion: 0x456,
        updated: Some(now - second),
        stale_after_ns: 8_000_000_000,
        dispersion_rate: 15e-6,
        anchor: now - second,
        ..Default::default()
    })
}

fn programs(c: &mut Criterion) {
    let targets = [
        SocketAddr::new(IpAddr::V4(SERVER_V4), 123),
        SocketAddr::new(IpAddr::V6(SERVER_V6), 123),
    ];
    let v4 = request(IpAddr::V4(CLIENT_V4), IpAddr::V4(SERVER_V4));
    let v6 = request(IpAddr::V6(CLIENT_V6), IpAddr::V6(SERVER_V6));
    let steering = match XdpProgram::steering(&targets) {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "xdp_program: cannot load the programs ({e}; it needs root): nothing measured"
            );
            return;
        }
    };
    let answering = XdpProgram::answering_limited(&targets, &targets, 65_536, [1, 2]).unwrap();
    answering.set_state(&state()).unwrap();
    let mut g = c.benchmark_group("xdp_program");
    // Each case checked to take the path it is named for before it is timed.
    let mut run = |name: &str, p: &XdpProgram, frame: &[u8], paths: &[Outcome]| {
        let outcome = p.run(frame).unwrap().outcome;
        assert!(paths.contains(&outcome), "{name}: {outcome:?}");
        g.bench_function(name, |b| b.iter_custom(|n| p.time(frame, n).unwrap()));
    };
    run(
        "steering/to_the_socket_v4",
        &steering,
        &v4,
        &[Outcome::Socket],
    );
    run("answering/answered_v4", &answering, &v4, &[Outcome::Tx]);
    run("answering/answered_v6", &answering, &v6, &[Outcome::Tx]);
    // Ten rules, the client's subnet allowed, another denied.
    let rule = |addr: Ipv4Addr, prefix, allow| DriverRule {
        v6: false,
        addr: u128::from(u32::from(addr)),
        prefix,
        allow,
    };
    let mut rules: Vec<DriverRule> = (0..8)
        .map(|i| rule(Ipv4Addr::new(10, i, 0, 0), 16, i % 2 == 0))
        .collect();
    rules.push(rule(Ipv4Addr::new(198, 51, 100, 0), 24, true));
    rules.push(rule(Ipv4Addr::new(198, 51, 100, 7), 32, false));
    answering.set_access(&rules[..9]).unwrap();
    run("answering/allowed_v4", &answering, &v4, &[Outcome::Tx]);
    answering.set_access(&rules).unwrap();
    run("answering/denied_v4", &answering, &v4, &[Outcome::Drop]);
    answering.set_access(&[]).unwrap();
    // Rate limited: within the limit (a response every 2^-19 s, bursts of 255), and over it
    // (one in 4096 s, a burst of 1: leaked one in 16, the rest dropped).
    let limits = answering.driver_maps();
    limits
        .set_limits(&DriverLimits::new(-19, 255, 4, 0))
        .unwrap();
    run(
        "answering/rate_limited_within_v4",
        &answering,
        &v4,
        &[Outcome::Tx],
    );
    limits.set_limits(&DriverLimits::new(12, 1, 4, 0)).unwrap();
    // The burst spent, most are dropped; one in 16 is leaked and answered.
    p_spend(&answering, &v4);
    let over = [Outcome::Drop, Outcome::Tx];
    run("answering/rate_limited_over_v4", &answering, &v4, &over);
    g.finish();
}

/// Runs `frame` until `p` drops it once: the client's burst spent.
fn p_spend(p: &XdpProgram, frame: &[u8]) {
    while p.run(frame).unwrap().outcome != Outcome::Drop {}
}

criterion_group!(benches, programs);
criterion_main!(benches);
