//! The shared-memory ring between two thread-ranks (the `local` transport;
//! `shm` runs the same ring code over a shared mapping): one-way send/recv
//! of 8 B to 4 MiB, and 8 B AllReduce latency.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::mpsc;
use tutti::{Communicator, ReduceOp};

fn ring(c: &mut Criterion) {
    let comms = Communicator::init_all(2).unwrap();
    let mut it = comms.into_iter();
    let (c0, c1) = (it.next().unwrap(), it.next().unwrap());
    // Rank 1 echoes in a thread, driven by a channel of sizes (0 = stop).
    let (tx, rx) = mpsc::channel::<(usize, bool)>();
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4 << 20];
        while let Ok((n, allreduce)) = rx.recv() {
            if n == 0 {
                break;
            }
            if allreduce {
                let mut x = [0f32; 2];
                for _ in 0..n {
                    c1.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                }
            } else {
                c1.recv(&mut buf[..n], 0).unwrap();
                c1.send(&buf[..8], 0).unwrap();
            }
        }
    });
    let mut g = c.benchmark_group("ring");
    let mut buf = vec![1u8; 4 << 20];
    let mut ack = [0u8; 8];
    for n in [8usize, 4096, 65536, 1 << 20, 4 << 20] {
        g.throughput(Throughput::Bytes(n as u64));
        g.bench_with_input(BenchmarkId::new("send_recv", n), &n, |b, &n| {
            b.iter(|| {
                tx.send((n, false)).unwrap();
                c0.send(&buf[..n], 1).unwrap();
                c0.recv(&mut ack, 1).unwrap();
            })
        });
    }
    g.bench_function("all_reduce_8B_x1000", |b| {
        b.iter(|| {
            tx.send((1000, true)).unwrap();
            let mut x = [1f32; 2];
            for _ in 0..1000 {
                c0.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            }
        })
    });
    g.finish();
    buf.clear();
    tx.send((0, false)).unwrap();
    echo.join().unwrap();
}

criterion_group!(benches, ring);
criterion_main!(benches);
