//! Reduction kernel throughput: `dst = a (op) b` for every type, in cache
//! (64 KiB) and out of cache (16 MiB). Reported as bytes of `b` per second,
//! like membw's "reduce" in ../shared/peers.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tutti::reduce::{reduce, DataType, ReduceOp};

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("reduce");
    for bytes in [64usize << 10, 16 << 20] {
        let a = vec![1u8; bytes];
        let b = vec![2u8; bytes];
        let mut d = vec![0u8; bytes];
        for dt in [
            DataType::F32,
            DataType::F64,
            DataType::F16,
            DataType::Bf16,
            DataType::I32,
            DataType::U8,
        ] {
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{dt}_sum"), bytes),
                &bytes,
                |bch, _| {
                    // SAFETY: all three buffers hold `bytes` bytes and do not overlap.
                    bch.iter(|| unsafe {
                        reduce(
                            dt,
                            ReduceOp::Sum,
                            d.as_mut_ptr(),
                            a.as_ptr(),
                            b.as_ptr(),
                            bytes,
                        )
                    })
                },
            );
        }
        // In place (`dst == a`), as the rings and mailboxes accumulate.
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(
            BenchmarkId::new("f32_sum_in_place", bytes),
            &bytes,
            |bch, _| {
                // SAFETY: both buffers hold `bytes` bytes; the output is `d` itself.
                bch.iter(|| unsafe {
                    let p = d.as_mut_ptr();
                    reduce(DataType::F32, ReduceOp::Sum, p, p, b.as_ptr(), bytes)
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
