//! The one-shot mailboxes (the direct algorithm on one host) under a long,
//! random sequence of mixed collectives: every call type, changing roots and
//! counts, in-place and not, so that slots are reused across calls of every
//! shape while some ranks run ahead of others (a root does not wait for its
//! readers). `TUTTI_ALGO=direct` forces the direct algorithm, which runs
//! through the mailboxes wherever a call fits a slot (all calls here do).
//! Every result is checked against a formula (small integers, so sums are
//! exact). Threads (`local`) and processes (`shm`), and the same calls over
//! the rings with mailboxes off.

mod common;

use common::{Ctx, Transport};
use tutti::tune::AlgoOverride;
use tutti::{Communicator, Config, ReduceOp};

const CALLS: usize = 3000;

/// Rank r's value at element i of call k: small integers, exact in f32.
fn val(r: usize, i: usize, k: usize) -> f32 {
    ((r * 7 + i * 3 + k) % 13) as f32
}

/// Runs the same pseudo-random sequence of calls on every rank.
fn random_calls(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for k in 0..CALLS {
        let kind = next() % 9;
        let root = (next() % n as u64) as usize;
        // Up to 32 KiB / 4 / n elements per block, so every call fits a slot.
        let count = (next() % (8192 / n as u64 + 1)) as usize;
        let mine: Vec<f32> = (0..count).map(|i| val(r, i, k)).collect();
        let sum = |i: usize, blk: usize| -> f32 {
            (0..n).map(|q| val(q, blk * count + i, k)).sum::<f32>()
        };
        match kind {
            0 => {
                let mut x = mine.clone();
                c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                for (i, v) in x.iter().enumerate() {
                    assert_eq!(*v, sum(i, 0), "call {k} all_reduce rank {r} i {i}");
                }
            }
            1 => {
                let mut x = if r == root {
                    mine.clone()
                } else {
                    vec![-1.0; count]
                };
                c.broadcast(&mut x, root).unwrap();
                for (i, v) in x.iter().enumerate() {
                    assert_eq!(*v, val(root, i, k), "call {k} broadcast rank {r}");
                }
            }
            2 => {
                let mut out = vec![-1.0; if r == root { count } else { 0 }];
                c.reduce(&mine, &mut out, ReduceOp::Sum, root).unwrap();
                for (i, v) in out.iter().enumerate() {
                    assert_eq!(*v, sum(i, 0), "call {k} reduce rank {r}");
                }
            }
            3 => {
                let mut out = vec![-1.0; n * count];
                c.all_gather(&mine, &mut out).unwrap();
                for q in 0..n {
                    for i in 0..count {
                        assert_eq!(out[q * count + i], val(q, i, k), "call {k} all_gather");
                    }
                }
            }
            4 => {
                let input: Vec<f32> = (0..n * count).map(|i| val(r, i, k)).collect();
                let mut out = vec![-1.0; count];
                c.reduce_scatter(&input, &mut out, ReduceOp::Sum).unwrap();
                for (i, v) in out.iter().enumerate() {
                    assert_eq!(*v, sum(i, r), "call {k} reduce_scatter rank {r}");
                }
            }
            5 => {
                let input: Vec<f32> = (0..n * count).map(|i| val(r, i, k)).collect();
                let mut out = vec![-1.0; n * count];
                c.all_to_all(&input, &mut out).unwrap();
                for q in 0..n {
                    for i in 0..count {
                        assert_eq!(out[q * count + i], val(q, r * count + i, k), "call {k} a2a");
                    }
                }
            }
            6 => {
                let mut out = vec![-1.0; if r == root { n * count } else { 0 }];
                c.gather(&mine, &mut out, root).unwrap();
                if r == root {
                    for q in 0..n {
                        for i in 0..count {
                            assert_eq!(out[q * count + i], val(q, i, k), "call {k} gather");
                        }
                    }
                }
            }
            7 => {
                let input: Vec<f32> = if r == root {
                    (0..n * count).map(|i| val(root, i, k)).collect()
                } else {
                    Vec::new()
                };
                let mut out = vec![-1.0; count];
                c.scatter(&input, &mut out, root).unwrap();
                for (i, v) in out.iter().enumerate() {
                    assert_eq!(*v, val(root, r * count + i, k), "call {k} scatter");
                }
            }
            _ => c.barrier().unwrap(),
        }
    }
}

#[test]
fn random_sequence_threads() {
    for n in [2, 3, 5] {
        let config = Config {
            algo: AlgoOverride::parse("direct").unwrap(),
            // A failed check on one thread leaves the others waiting.
            timeout: std::time::Duration::from_secs(20),
            ..Config::default()
        };
        on_threads(n, config, random_calls);
    }
}

/// Runs `f` on every rank of an `n`-rank communicator of threads.
fn on_threads(n: usize, config: Config, f: fn(&Communicator)) {
    let comms = Communicator::init_all_with(n, config).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || f(c));
        }
    });
}

#[test]
fn random_sequence_shm_3() {
    common::procs(
        "random_sequence_shm_3",
        3,
        Transport::Shm,
        &[("TUTTI_ALGO", "direct")],
        |c, _: &Ctx| random_calls(c),
    );
}

/// The same calls with every slot written by non-temporal stores
/// (`TUTTI_SHM_STREAM=1`), which online tuning tries for calls of 16 KiB
/// and more: a publish must fence them before its seq store.
#[test]
fn random_sequence_shm_2_streamed() {
    common::procs(
        "random_sequence_shm_2_streamed",
        2,
        Transport::Shm,
        &[("TUTTI_ALGO", "direct"), ("TUTTI_SHM_STREAM", "1")],
        |c, _: &Ctx| random_calls(c),
    );
}

#[test]
fn random_sequence_shm_4_rings_only() {
    // The same calls with mailboxes off: direct over the rings.
    common::procs(
        "random_sequence_shm_4_rings_only",
        4,
        Transport::Shm,
        &[("TUTTI_ALGO", "direct"), ("TUTTI_SHM_MAILBOX", "0")],
        |c, _: &Ctx| random_calls(c),
    );
}

/// Runs of identical calls (the engine skips the checks and the tuner for a
/// call that repeats the last mailbox call in all but its buffers): new
/// buffers and data every time, in place and not, with asynchronous ops
/// and other shapes in between, and calls that repeat the shape but not
/// its checks (overlapping buffers, a wrong length), which must still fail.
fn repeated_calls(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    let mut bufs = [vec![0f32; 17], vec![0f32; 17], vec![0f32; 17]];
    for k in 0..1500 {
        let count = [8, 16, 8, 3][(k / 7) % 4];
        let want = |i: usize| (0..n).map(|q| val(q, i, k)).sum::<f32>();
        let (a, rest) = bufs.split_at_mut(1);
        let (send, recv) = (&mut a[0][..count], &mut rest[k % 2][..count]);
        for (i, x) in send.iter_mut().enumerate() {
            *x = val(r, i, k);
        }
        match k % 11 {
            // In place, in the buffer the last call received into.
            3 => {
                recv.copy_from_slice(send);
                c.all_reduce(recv, ReduceOp::Sum).unwrap();
            }
            // An asynchronous op between repeats.
            5 => {
                let v = c.all_reduce_async(send.to_vec(), ReduceOp::Sum).wait();
                recv.copy_from_slice(&v.unwrap());
            }
            // Another collective between repeats.
            7 => {
                let mut g = vec![0f32; n * count];
                c.all_gather(send, &mut g).unwrap();
                for (i, x) in recv.iter_mut().enumerate() {
                    *x = (0..n).map(|q| g[q * count + i]).sum();
                }
            }
            _ => c.all_reduce_into(send, recv, ReduceOp::Sum).unwrap(),
        }
        for (i, v) in recv.iter().enumerate() {
            assert_eq!(*v, want(i), "call {k} rank {r} i {i}");
        }
        if k % 97 == 96 {
            // The shape just repeated, but the buffers overlap: refused,
            // on every rank, before anything moves.
            let p = bufs[0].as_mut_ptr() as *mut u8;
            let raw = tutti::RawCall {
                coll: tutti::algo::Collective::AllReduce,
                dtype: tutti::DataType::F32,
                op: ReduceOp::Sum,
                count,
                send: p,
                send_len: 4 * count,
                // SAFETY: one element further into a 17-element buffer.
                recv: unsafe { p.add(4) },
                recv_len: 4 * count,
                vcounts: None,
            };
            // SAFETY: both ranges lie in bufs[0], which nothing else uses.
            let e = unsafe { c.run_raw(&raw, &Default::default()) }.unwrap_err();
            assert!(matches!(e, tutti::Error::InvalidArgument(_)), "{e}");
            // The same shape with a receive buffer one element too long.
            let (a, rest) = bufs.split_at_mut(1);
            let e = c
                .all_reduce_into(&a[0][..count], &mut rest[0][..count + 1], ReduceOp::Sum)
                .unwrap_err();
            assert!(matches!(e, tutti::Error::InvalidArgument(_)), "{e}");
        }
    }
}

#[test]
fn repeated_calls_threads() {
    for n in [2, 3] {
        on_threads(n, Config::from_env().unwrap(), repeated_calls);
    }
}

#[test]
fn repeated_calls_shm() {
    common::procs(
        "repeated_calls_shm",
        3,
        Transport::Shm,
        &[],
        |c, _: &Ctx| repeated_calls(c),
    );
}

/// A rank that arrives late finds its peer asleep on its doorbell (it
/// polled past its spin time) and must wake it as it publishes: the
/// writer's fence after publishing pairs with the sleeper's announcement.
/// A lost wake-up would leave the sleeper in its nap (up to 20 ms) on
/// every call; the median over calls shows it (with the wake-up removed
/// from `Mailbox::flush`, the median is 17 ms; with it, well under 1 ms).
fn late_peer_wakes_sleeper(c: &Communicator) {
    let late = std::time::Duration::from_millis(3);
    let mut extra = Vec::new();
    for k in 0..30 {
        let mut x = [c.rank() as f32 + k as f32; 2];
        if c.rank() == 1 {
            std::thread::sleep(late);
        }
        let t = std::time::Instant::now();
        c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x[0], 1.0 + 2.0 * k as f32);
        if c.rank() == 0 {
            extra.push(t.elapsed().saturating_sub(late));
        }
    }
    if c.rank() == 0 {
        extra.sort();
        let median = extra[extra.len() / 2];
        assert!(
            median < std::time::Duration::from_millis(10),
            "rank 0 woke {median:?} after its late peer published (median of 30 calls)"
        );
    }
}

#[test]
fn late_peer_wakes_sleeper_threads() {
    on_threads(2, Config::from_env().unwrap(), late_peer_wakes_sleeper);
}

#[test]
fn late_peer_wakes_sleeper_shm() {
    common::procs(
        "late_peer_wakes_sleeper_shm",
        2,
        Transport::Shm,
        &[],
        |c, _: &Ctx| late_peer_wakes_sleeper(c),
    );
}
