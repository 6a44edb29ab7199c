//! SHA-512 of eight 1025-byte messages (a Roughtime leaf: 0x00 and a 1024-byte request), eight
//! lanes at once on each backend this CPU runs, against `sha2` one message at a time. Throughput
//! is in messages, so criterion's per-element time is the cost of one leaf.

use std::hint::black_box;

use chime_sha512::{Backend, LANES, Lanes, digest};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let requests: Vec<Vec<u8>> = (0..LANES).map(|i| vec![i as u8; 1024]).collect();
    let mut g = c.benchmark_group("sha512_leaf");
    g.throughput(Throughput::Elements(LANES as u64));
    for &backend in Backend::available() {
        let mut lanes = Lanes::with_backend(backend).expect("listed as available");
        g.bench_function(BenchmarkId::new("lanes", format!("{backend:?}")), |b| {
            b.iter(|| {
                for r in &requests {
                    lanes.push(&[&[0x00], black_box(r)]);
                }
                let mut x = 0u8;
                lanes.finish(|_, d| x ^= d[0]);
                black_box(x)
            })
        });
    }
    g.bench_function("sha2_one_at_a_time", |b| {
        b.iter(|| {
            let mut x = 0u8;
            for r in &requests {
                x ^= digest(&[&[0x00], black_box(r)])[0];
            }
            black_box(x)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
