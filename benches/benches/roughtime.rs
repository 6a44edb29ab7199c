//! The Roughtime signer's cost per batch size: one Merkle tree and one Ed25519 signature per
//! batch, then one reply per request. Throughput is in requests, so criterion's per-element time
//! is the per-request cost at that batch size.

use std::hint::black_box;

use chime_roughtime::{
    BatchParams, Exchange, LongTermKey, OnlineKey, Responder, ResponderConfig, Version,
    build_request,
};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const NOW_S: u64 = 1_790_000_000;

fn bench(c: &mut Criterion) {
    let long_term = LongTermKey::from_seed(&[1; 32]);
    let delegation = long_term
        .delegate(OnlineKey::from_seed(&[2; 32]), NOW_S - 60, NOW_S + 86_400)
        .unwrap();
    let params = BatchParams {
        now_unix_us: NOW_S * 1_000_000,
        radius_us: 1_000,
        delegation: &delegation,
    };

    let mut g = c.benchmark_group("roughtime_batch");
    for &size in &[1usize, 8, 64, 128, 256] {
        let requests: Vec<Vec<u8>> = (0..size)
            .map(|i| {
                let mut r = vec![0u8; 1024];
                let nonce = [i as u8; 32];
                let n = build_request(&mut r, &[Version::Rfc10049], &nonce, None).unwrap();
                r.truncate(n);
                r
            })
            .collect();
        let mut responder = Responder::new(ResponderConfig {
            capacity: size,
            ..Default::default()
        });
        let mut replies = vec![vec![0u8; 1024]; size];
        g.throughput(Throughput::Elements(size as u64));
        g.bench_with_input(BenchmarkId::new("rfc10049", size), &size, |b, _| {
            b.iter(|| {
                let mut exchanges: Vec<Exchange<'_>> = requests
                    .iter()
                    .zip(replies.iter_mut())
                    .map(|(q, r)| Exchange::new(q, r))
                    .collect();
                responder.respond(params, black_box(&mut exchanges));
                black_box(exchanges.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
