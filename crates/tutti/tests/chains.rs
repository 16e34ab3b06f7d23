//! Reduction chains run piece by piece (`Schedule::reduce_chain`): the
//! rank-order AllReduce algorithms (`direct`, `two_shot`) build each result
//! block from a run of steps that the executor interleaves over the
//! shared-memory rings. Each element must still meet its operands in rank
//! order, so the result is checked bitwise against a sequential rank-order
//! fold, on data whose float sums depend on the order. Blocks larger than
//! 256 KiB (where ranks share cores, chains run only over those) and, with a
//! core per rank, small ones; in place and out of place, over threads and
//! processes, through the default ring and a 64 KiB one whose wrap point the
//! pieces cross, and with large messages read straight from the sender.

mod common;

use common::{procs, threads_with, Transport};
use half::{bf16, f16};
use tutti::tune::AlgoOverride;
use tutti::{Algorithm, Communicator, Config, Element, Options, ReduceOp};

/// Rank `r`'s element `i`: magnitudes from 1e-3 to 1e3 and both signs, so
/// that a sum's bits depend on the order of the additions.
fn value(r: usize, i: usize) -> f64 {
    let h = (i as u64)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(r as u64 * 40_503)
        % 1_000_003;
    let mant = (h % 2001) as f64 - 1000.0;
    mant * 10f64.powi((h % 7) as i32 - 6)
}

/// Counts whose blocks (a third or a quarter of them) exceed 256 KiB of f32
/// and of 2-byte types, odd so the blocks differ by one element.
const COUNTS: [usize; 3] = [600_001, 1_000_003, 2_100_007];

fn check<T: Element + PartialEq + std::fmt::Debug>(
    c: &Communicator,
    counts: &[usize],
    conv: impl Fn(f64) -> T,
    op: ReduceOp,
    fold: impl Fn(T, T) -> T,
) {
    let n = c.size();
    for &count in counts {
        let mine: Vec<T> = (0..count).map(|i| conv(value(c.rank(), i))).collect();
        let want: Vec<T> = (0..count)
            .map(|i| (1..n).fold(conv(value(0, i)), |a, r| fold(a, conv(value(r, i)))))
            .collect();
        for alg in [Algorithm::TwoShot, Algorithm::Direct] {
            let opts = Options {
                algorithm: Some(alg),
                ..Options::default()
            };
            let mut buf = mine.clone();
            c.all_reduce_with(&mut buf, op, &opts)
                .expect("all_reduce in place");
            same_bits(
                &buf,
                &want,
                &format!(
                    "{alg} in place, {count} x {:?}, {op:?}, rank {}",
                    T::DTYPE,
                    c.rank()
                ),
            );
        }
        // Out of place: the algorithm comes from the communicator's
        // configuration (TUTTI_ALGO), which these tests set to two_shot.
        let mut out = vec![conv(0.0); count];
        c.all_reduce_into(&mine, &mut out, op)
            .expect("all_reduce out of place");
        same_bits(
            &out,
            &want,
            &format!(
                "out of place, {count} x {:?}, {op:?}, rank {}",
                T::DTYPE,
                c.rank()
            ),
        );
    }
}

/// Fails naming the first element of `got` whose bits differ from `want`'s.
fn same_bits<T: bytemuck::Pod + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    if bytemuck::cast_slice::<T, u8>(got) == bytemuck::cast_slice::<T, u8>(want) {
        return;
    }
    let bits = |x: &T| bytemuck::bytes_of(x).to_vec();
    if let Some(i) = got.iter().zip(want).position(|(a, b)| bits(a) != bits(b)) {
        panic!(
            "{what}: element {i} is {:?}, rank order gives {:?}",
            got[i], want[i]
        );
    }
}

fn all_types(c: &Communicator, _: &common::Ctx) {
    types(c, &COUNTS);
}

fn types(c: &Communicator, counts: &[usize]) {
    check(c, counts, |v| v as f32, ReduceOp::Sum, |a, b| a + b);
    check(c, counts, |v| v, ReduceOp::Sum, |a, b| a + b);
    check(c, counts, f16::from_f64, ReduceOp::Sum, |a, b| a + b);
    check(c, counts, bf16::from_f64, ReduceOp::Sum, |a, b| a + b);
    check(c, counts, |v| v as f32, ReduceOp::Max, f32::max);
    check(c, counts, |v| (v * 1e3) as i64, ReduceOp::Sum, |a, b| a + b);
    check(
        c,
        counts,
        |v| 1.0 + v.abs() * 1e-4,
        ReduceOp::Prod,
        |a: f64, b| a * b,
    );
}

fn config(ring_bytes: Option<usize>) -> Config {
    let mut cfg = Config {
        algo: AlgoOverride::parse("all_reduce:two_shot").expect("spec"),
        timeout: std::time::Duration::from_secs(60),
        ..Config::default()
    };
    if let Some(b) = ring_bytes {
        cfg.ring_bytes = b;
    }
    cfg
}

#[test]
fn rank_order_bitwise_threads_3() {
    threads_with(
        Communicator::init_all_with(3, config(None)).expect("init_all_with"),
        all_types,
    );
}

#[test]
fn rank_order_bitwise_threads_4_small_ring() {
    threads_with(
        Communicator::init_all_with(4, config(Some(64 << 10))).expect("init_all_with"),
        all_types,
    );
}

#[test]
fn rank_order_bitwise_shm_3() {
    procs(
        "rank_order_bitwise_shm_3",
        3,
        Transport::Shm,
        &[
            ("TUTTI_ALGO", "all_reduce:two_shot"),
            ("TUTTI_TIMEOUT", "60"),
        ],
        all_types,
    );
}

#[test]
fn rank_order_bitwise_shm_4_small_ring() {
    procs(
        "rank_order_bitwise_shm_4_small_ring",
        4,
        Transport::Shm,
        &[
            ("TUTTI_ALGO", "all_reduce:two_shot"),
            ("TUTTI_SHM_RING_BYTES", "64K"),
            ("TUTTI_TIMEOUT", "60"),
        ],
        all_types,
    );
}

/// With messages of 64 KiB or more read straight from the sender's memory
/// (read whole, so such a member waits for the one before it to finish).
#[test]
fn rank_order_bitwise_threads_3_direct_reads() {
    let cfg = Config {
        direct_bytes: Some(64 << 10),
        ..config(None)
    };
    threads_with(
        Communicator::init_all_with(3, cfg).expect("init_all_with"),
        all_types,
    );
}

#[test]
fn rank_order_bitwise_shm_3_direct_reads() {
    procs(
        "rank_order_bitwise_shm_3_direct_reads",
        3,
        Transport::Shm,
        &[
            ("TUTTI_ALGO", "all_reduce:two_shot"),
            ("TUTTI_SHM_DIRECT_BYTES", "64K"),
            ("TUTTI_TIMEOUT", "60"),
        ],
        all_types,
    );
}

/// Where each rank has a core, chains run at every size: small blocks too
/// (2 ranks on this 2-core machine; where there are fewer cores the ranks
/// share them and this repeats the large-block runs on small counts).
#[test]
fn rank_order_bitwise_threads_2_small_blocks() {
    threads_with(
        Communicator::init_all_with(2, config(None)).expect("init_all_with"),
        |c, _| types(c, &[1, 7, 1009, 4099, 65_537, 600_001]),
    );
}
