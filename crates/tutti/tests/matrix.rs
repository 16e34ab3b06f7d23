//! The correctness matrix: transports {local, shm, tcp} x world sizes
//! {1, 2, 3, 4, 8} x every collective x every element type x every reduction
//! x counts {0, 1, 7, 1009 (prime, not divisible by any world size)}, roots
//! and send/recv shifts rotating, plus every root and shift for three types,
//! plus large counts (1_000_003, a prime, and 6 MiB + 3 elements) for
//! (f32, sum), (i32, max) and (bf16, sum). One job (one set of processes, or
//! threads for local) runs the whole sub-matrix of a (transport, size) cell.
//! The tuner picks algorithms here; `algorithms.rs` forces each one.

mod common;

use common::cases::{Mode, Runner};
use common::{Ctx, Transport};
use half::{bf16, f16};
use tutti::{Communicator, ReduceOp};

/// Small counts: empty, one element, odd, and a prime not divisible by any world size.
pub const SMALL: [usize; 4] = [0, 1, 7, 1009];
/// A prime around a million.
pub const PRIME: usize = 1_000_003;
/// Several MiB, not a multiple of any world size.
pub const MIB6: usize = 6 << 20;

fn matrix(comm: &Communicator, ctx: &Ctx) {
    let mut r = Runner::new(comm, ctx, Mode::Default);
    let ops = &ReduceOp::ALL;
    for &c in &SMALL {
        r.every_collective::<f32>(c, ops);
        r.every_collective::<f64>(c, ops);
        r.every_collective::<f16>(c, ops);
        r.every_collective::<bf16>(c, ops);
        r.every_collective::<i8>(c, ops);
        r.every_collective::<u8>(c, ops);
        r.every_collective::<i32>(c, ops);
        r.every_collective::<i64>(c, ops);
        r.every_collective::<u32>(c, ops);
        r.every_collective::<u64>(c, ops);
        r.barrier();
        r.phase(&format!("count {c}"));
    }
    r.every_root::<f32>(7);
    r.every_root::<u8>(1009);
    r.every_root::<i64>(1);
    r.barrier();
    r.phase("small counts");
    r.large::<f32>(ReduceOp::Sum, PRIME);
    r.large::<f32>(ReduceOp::Sum, MIB6 / 4 + 3);
    r.phase("large f32");
    r.large::<i32>(ReduceOp::Max, PRIME);
    r.large::<i32>(ReduceOp::Max, MIB6 / 4 + 3);
    r.phase("large i32");
    r.large::<bf16>(ReduceOp::Sum, PRIME);
    r.large::<bf16>(ReduceOp::Sum, MIB6 / 2 + 3);
    r.barrier();
    r.finish(&format!(
        "matrix {} n={}",
        ctx.transport.name(),
        comm.size()
    ));
}

rank_test!(local_1, Transport::Local, 1, matrix);
rank_test!(local_2, Transport::Local, 2, matrix);
rank_test!(local_3, Transport::Local, 3, matrix);
rank_test!(local_4, Transport::Local, 4, matrix);
rank_test!(local_8, Transport::Local, 8, matrix);
rank_test!(shm_1, Transport::Shm, 1, matrix);
rank_test!(shm_2, Transport::Shm, 2, matrix);
rank_test!(shm_3, Transport::Shm, 3, matrix);
rank_test!(shm_4, Transport::Shm, 4, matrix);
rank_test!(shm_8, Transport::Shm, 8, matrix);
rank_test!(tcp_1, Transport::Tcp, 1, matrix);
rank_test!(tcp_2, Transport::Tcp, 2, matrix);
rank_test!(tcp_3, Transport::Tcp, 3, matrix);
rank_test!(tcp_4, Transport::Tcp, 4, matrix);
rank_test!(tcp_8, Transport::Tcp, 8, matrix);
// Two emulated hosts (distinct TUTTI_HOST_ID): shared memory within a host,
// TCP between them, in one job.
rank_test!(hosts_2x2, Transport::Hosts { per_host: 2 }, 4, matrix);
rank_test!(hosts_2x3, Transport::Hosts { per_host: 3 }, 6, matrix);

// The direct-read path (a large message read straight from the sender's
// buffer: memcpy for threads, process_vm_readv for processes) is off by
// default; these runs force it on for every message of 64 KiB or more.
const DIRECT: &[(&str, &str)] = &[("TUTTI_SHM_DIRECT_BYTES", "64K")];
rank_test!(local_3_direct, Transport::Local, 3, DIRECT, matrix);
rank_test!(shm_3_direct, Transport::Shm, 3, DIRECT, matrix);
rank_test!(shm_4_direct, Transport::Shm, 4, DIRECT, matrix);

// TCP striped over several sockets per pair, with small frames so that
// every large message is cut into many; once driven by the executor, once
// by the communicator's I/O thread (whose staging rings then wrap many
// times), and the I/O thread next to shared memory (it rings the segment's
// doorbell). The automatic choices depend on the machine; these force them.
const LANES_INLINE: &[(&str, &str)] = &[
    ("TUTTI_TCP_IO_THREAD", "0"),
    ("TUTTI_TCP_SOCKETS", "4"),
    ("TUTTI_TCP_CHUNK", "4K"),
];
const LANES_IO: &[(&str, &str)] = &[
    ("TUTTI_TCP_IO_THREAD", "1"),
    ("TUTTI_TCP_SOCKETS", "3"),
    ("TUTTI_TCP_CHUNK", "8K"),
];
const IO_ONE_LANE: &[(&str, &str)] = &[("TUTTI_TCP_IO_THREAD", "1"), ("TUTTI_TCP_SOCKETS", "1")];
rank_test!(tcp_3_lanes, Transport::Tcp, 3, LANES_INLINE, matrix);
rank_test!(tcp_3_io_lanes, Transport::Tcp, 3, LANES_IO, matrix);
rank_test!(tcp_2_io, Transport::Tcp, 2, IO_ONE_LANE, matrix);
rank_test!(
    hosts_2x2_io,
    Transport::Hosts { per_host: 2 },
    4,
    LANES_IO,
    matrix
);

/// Thousands of tiny ops back to back: empty and one-element reductions
/// complete before (or as) their frame headers arrive, so this checks that
/// the executor and the I/O thread hand message slots over in step.
fn tiny_ops(comm: &Communicator, _ctx: &Ctx) {
    let (n, r) = (comm.size(), comm.rank());
    for i in 0..1500usize {
        let mut empty: Vec<f32> = Vec::new();
        comm.all_reduce(&mut empty, ReduceOp::Sum)
            .expect("empty all_reduce");
        let mut one = vec![(r + i) as f32];
        comm.all_reduce(&mut one, ReduceOp::Sum)
            .expect("all_reduce");
        let want = (0..n).map(|q| (q + i) as f32).sum::<f32>();
        assert_eq!(one[0], want, "op {i}");
        let mut b = vec![if r == i % n { i as i32 } else { -1 }];
        comm.broadcast(&mut b, i % n).expect("broadcast");
        assert_eq!(b[0], i as i32, "op {i}");
        let send: Vec<u8> = Vec::new();
        let mut recv: Vec<u8> = Vec::new();
        comm.reduce_scatter(&send, &mut recv, ReduceOp::Max)
            .expect("empty reduce_scatter");
    }
}
rank_test!(tcp_6_io_tiny_ops, Transport::Tcp, 6, LANES_IO, tiny_ops);
rank_test!(tcp_3_tiny_ops, Transport::Tcp, 3, LANES_INLINE, tiny_ops);
