//! Reduction kernel throughput: `dst = a (op) b` for every type, in cache
//! (64 KiB) and out of cache (16 MiB). Reported as bytes of `b` per second,
//! like membw's "reduce" in ../shared/peers. Also the data path's byte copy
//! against the C library's, with the destination 0 and 16 bytes after the
//! source modulo 4 KiB (`tutti::reduce::copy` says why).

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

fn copies(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy");
    for bytes in [4usize << 10, 64 << 10, 512 << 10] {
        let a = vec![1u8; bytes + 8192];
        let mut d = vec![0u8; bytes + 8192];
        // Both from page-aligned starts, so that the destination lies `off`
        // bytes after the source modulo 4 KiB: 16 is the slow case of
        // glibc's `rep movsb` on AMD (see `tutti::reduce::copy`).
        let sa = a.as_ptr().align_offset(4096);
        let da = d.as_ptr().align_offset(4096);
        for off in [0usize, 16] {
            g.throughput(Throughput::Bytes(bytes as u64));
            let s = a[sa..].as_ptr();
            let t = d[da + off..].as_mut_ptr();
            g.bench_with_input(
                BenchmarkId::new(format!("tutti_dst+{off}"), bytes),
                &bytes,
                // SAFETY: both ranges lie inside their (distinct) vectors.
                |bch, _| bch.iter(|| unsafe { tutti::reduce::copy::copy(s, t, bytes) }),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("libc_dst+{off}"), bytes),
                &bytes,
                // SAFETY: as above.
                |bch, _| bch.iter(|| unsafe { std::ptr::copy_nonoverlapping(s, t, bytes) }),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, kernels, copies);
criterion_main!(benches);
