//! The codecs on their own: the NTP header (parse and encode) and Roughtime request parsing, the
//! per-packet work before any protocol logic.

use std::hint::black_box;

use chime_ntp::Header;
use chime_roughtime::{Request, Version, build_request};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("codecs");
    g.throughput(Throughput::Elements(1));

    let mut ntp = [0u8; 48];
    ntp[0] = 0x23;
    ntp[40..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    g.bench_function("ntp_header_parse", |b| {
        b.iter(|| Header::parse(black_box(&ntp)).unwrap())
    });
    let header = Header::parse(&ntp).unwrap();
    g.bench_function("ntp_header_encode", |b| {
        let mut out = [0u8; 48];
        b.iter(|| {
            black_box(&header).encode(&mut out);
            black_box(&out);
        })
    });

    let mut rt = vec![0u8; 1024];
    let n = build_request(
        &mut rt,
        &[Version::Draft12, Version::Rfc10049],
        &[9; 32],
        None,
    )
    .unwrap();
    rt.truncate(n);
    g.bench_function("roughtime_request_parse", |b| {
        b.iter(|| Request::parse(black_box(&rt)).unwrap().nonce.len())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
