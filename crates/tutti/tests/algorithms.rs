//! Every algorithm forced, for every collective it implements (asked through
//! `Algorithm::build`; the others are skipped and counted):
//!
//! * per call, `Options { algorithm: Some(a) }` (through `all_reduce_with`
//!   and `run_raw`), over the local transport at world sizes {1, 2, 3, 4, 8}
//!   and over shm and tcp processes at 8 ranks;
//! * per process, `TUTTI_ALGO=<a>` (and the per-collective syntax), over shm
//!   and tcp processes at 3 and 4 ranks;
//! * both, on two emulated hosts of two ranks (distinct `TUTTI_HOST_ID`s:
//!   shared memory within a host, TCP between), where the hierarchical
//!   algorithms apply; every hierarchical level choice per call on 2 x 2
//!   and 3 x 2 emulated hosts, and levels in `TUTTI_ALGO` on 2 x 2.
//!
//! Each runs a reduced matrix: f32 with every reduction, i64 (sum, prod),
//! f16 (sum, max) and u8 (min, avg), counts {0, 1, 7, 1009, 100_003}, every
//! collective, every root and shift, and one large (1_000_003 f32) sum.
// Reads the environment: a child checks the TUTTI_ALGO its parent set.
#![allow(clippy::disallowed_methods)]

mod common;

use common::cases::{Mode, Runner};
use common::{Ctx, Transport};
use half::f16;
use tutti::algo::{Levels, Problem};
use tutti::{Algorithm, CollKind, Collective, Communicator, DataType, ReduceOp};

const COUNTS: [usize; 5] = [0, 1, 7, 1009, 100_003];

fn reduced(r: &mut Runner<'_>) {
    use ReduceOp::*;
    for &c in &COUNTS {
        r.every_collective::<f32>(c, &ReduceOp::ALL);
        r.every_collective::<i64>(c, &[Sum, Prod]);
        r.every_collective::<f16>(c, &[Sum, Max]);
        r.every_collective::<u8>(c, &[Min, Avg]);
        r.barrier();
    }
    r.every_root::<f32>(7);
    r.every_root::<i64>(1009);
    r.large::<f32>(Sum, 1_000_003);
    r.barrier();
}

/// Every algorithm in turn, forced per call.
fn per_call(comm: &Communicator, ctx: &Ctx) {
    let mut r = Runner::new(comm, ctx, Mode::Default);
    for a in Algorithm::ALL {
        r.mode = Mode::Forced(a);
        reduced(&mut r);
        r.phase(a.name());
    }
    r.finish(&format!(
        "forced per call, {} n={}",
        ctx.transport.name(),
        comm.size()
    ));
}

/// Every hierarchical level choice ([`Levels::ALL`]) in turn, forced per
/// call, on a lighter matrix than [`reduced`] (16 variants; each builder is
/// verified symbolically on many more layouts in `algo/verify/tests.rs`).
fn per_call_levels(comm: &Communicator, ctx: &Ctx) {
    use ReduceOp::*;
    let mut r = Runner::new(comm, ctx, Mode::Default);
    for lv in Levels::ALL {
        let a = Algorithm::Hierarchical(lv);
        r.mode = Mode::Forced(a);
        for c in [0, 1, 7, 1009] {
            r.every_collective::<f32>(c, &[Sum, Max]);
            r.every_collective::<i64>(c, &[Prod]);
        }
        r.every_root::<f32>(7);
        r.large::<f32>(Sum, 100_003);
        r.barrier();
        r.phase(a.name());
    }
    r.finish(&format!(
        "hierarchical levels forced per call, {} n={}",
        ctx.transport.name(),
        comm.size()
    ));
}

/// The algorithm named by `TUTTI_ALGO` (set by the parent), checked to be in force.
fn from_env(comm: &Communicator, ctx: &Ctx) {
    let spec = std::env::var("TUTTI_ALGO").expect("the parent sets TUTTI_ALGO");
    let n = comm.size();
    // The communicator must plan the forced algorithm wherever it applies.
    for coll in [
        Collective::AllReduce,
        Collective::Broadcast { root: 0 },
        Collective::Reduce { root: n - 1 },
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Gather { root: 0 },
        Collective::Scatter { root: 0 },
        Collective::Barrier,
    ] {
        let Some(a) = comm.config().algo.get(coll.kind()) else {
            continue;
        };
        let mut p = Problem::new(coll, n, comm.rank(), 1000);
        if comm.topology().hosts.len() > 1 {
            p.hosts = Some(comm.topology().host_of.clone().into());
        }
        if a.build(&p).is_some() {
            let planned = comm
                .plan(coll, 1000, DataType::F32)
                .expect("plan")
                .algorithm;
            assert_eq!(
                planned, a,
                "TUTTI_ALGO={spec}: {coll:?} planned with {planned}, not {a}"
            );
        }
    }
    let mut r = Runner::new(comm, ctx, Mode::Default);
    reduced(&mut r);
    r.finish(&format!(
        "TUTTI_ALGO={spec}, {} n={}",
        ctx.transport.name(),
        n
    ));
}

rank_test!(per_call_local_1, Transport::Local, 1, per_call);
rank_test!(per_call_local_2, Transport::Local, 2, per_call);
rank_test!(per_call_local_3, Transport::Local, 3, per_call);
rank_test!(per_call_local_4, Transport::Local, 4, per_call);
rank_test!(per_call_local_8, Transport::Local, 8, per_call);
rank_test!(per_call_shm_8, Transport::Shm, 8, per_call);
rank_test!(per_call_tcp_8, Transport::Tcp, 8, per_call);
rank_test!(
    per_call_hosts_2x2,
    Transport::Hosts { per_host: 2 },
    4,
    per_call
);

rank_test!(
    per_call_levels_hosts_2x2,
    Transport::Hosts { per_host: 2 },
    4,
    per_call_levels
);
rank_test!(
    per_call_levels_hosts_3x2,
    Transport::Hosts { per_host: 2 },
    6,
    per_call_levels
);

/// Runs `from_env` under `TUTTI_ALGO=spec` as `n` processes over `t`.
fn env_job(test: &str, t: Transport, n: usize, spec: &str) {
    let name = common::test_name(module_path!(), test);
    common::procs(&name, n, t, &[("TUTTI_ALGO", spec)], from_env);
}

/// A per-collective `TUTTI_ALGO` that forces, for each collective, the
/// first algorithm of `Algorithm::ALL` (rotated by `shift`) implementing it.
fn per_collective_spec(n: usize, shift: usize) -> String {
    let colls = [
        (CollKind::AllReduce, Collective::AllReduce),
        (CollKind::Broadcast, Collective::Broadcast { root: 0 }),
        (CollKind::Reduce, Collective::Reduce { root: 0 }),
        (CollKind::AllGather, Collective::AllGather),
        (CollKind::ReduceScatter, Collective::ReduceScatter),
        (CollKind::AllToAll, Collective::AllToAll),
        (CollKind::Gather, Collective::Gather { root: 0 }),
        (CollKind::Scatter, Collective::Scatter { root: 0 }),
    ];
    let k = Algorithm::ALL.len();
    let mut parts = Vec::new();
    for (kind, coll) in colls {
        let pick = (0..k)
            .map(|i| Algorithm::ALL[(i + shift) % k])
            .find(|a| (0..n).all(|r| a.build(&Problem::new(coll, n, r, 0)).is_some()));
        if let Some(a) = pick {
            parts.push(format!("{}:{}", kind.name(), a.name()));
        }
    }
    parts.join(",")
}

/// One job per algorithm of `Algorithm::ALL`, each under `TUTTI_ALGO=<a>`
/// (one that does not implement a collective, or needs several hosts, leaves
/// it to the tuner).
fn env_every_algorithm(test: &str, t: Transport, n: usize) {
    let name = common::test_name(module_path!(), test);
    if common::is_child(&name) {
        common::procs(&name, n, t, &[], from_env);
        return;
    }
    for a in Algorithm::ALL {
        common::procs(&name, n, t, &[("TUTTI_ALGO", a.name())], from_env);
    }
}

#[test]
fn env_every_algorithm_shm_3() {
    env_every_algorithm("env_every_algorithm_shm_3", Transport::Shm, 3);
}

#[test]
fn env_every_algorithm_shm_4() {
    env_every_algorithm("env_every_algorithm_shm_4", Transport::Shm, 4);
}

#[test]
fn env_every_algorithm_tcp_3() {
    env_every_algorithm("env_every_algorithm_tcp_3", Transport::Tcp, 3);
}

#[test]
fn env_every_algorithm_tcp_4() {
    env_every_algorithm("env_every_algorithm_tcp_4", Transport::Tcp, 4);
}

#[test]
fn env_every_algorithm_hosts_2x2() {
    env_every_algorithm(
        "env_every_algorithm_hosts_2x2",
        Transport::Hosts { per_host: 2 },
        4,
    );
}

/// Per-collective hierarchical levels in `TUTTI_ALGO` (commas inside the
/// parentheses), planned and run on two emulated hosts.
#[test]
fn env_levels_hosts_2x2() {
    env_job(
        "env_levels_hosts_2x2",
        Transport::Hosts { per_host: 2 },
        4,
        "all_reduce:hierarchical(intra=ring,inter=halving_doubling),\
         all_gather:hierarchical(intra=halving_doubling,inter=direct),\
         reduce_scatter:hierarchical(inter=halving_doubling),\
         broadcast:hierarchical(intra=tree,inter=direct),\
         reduce:hierarchical(intra=direct,inter=tree),ring",
    );
}

#[test]
fn env_per_collective_shm_4() {
    env_job(
        "env_per_collective_shm_4",
        Transport::Shm,
        4,
        &per_collective_spec(4, 1),
    );
}

#[test]
fn env_per_collective_tcp_3() {
    env_job(
        "env_per_collective_tcp_3",
        Transport::Tcp,
        3,
        &per_collective_spec(3, 2),
    );
}

/// The data a schedule's first step puts in place (`algo::frame`), both
/// ways a caller can pass it: an AllGather whose send buffer is (in place)
/// or is not its own block of the receive buffer, and a Broadcast whose
/// root passes its data in its receive buffer or in a separate send buffer
/// (left unchanged), with the tuner and with every algorithm that
/// implements them forced per call; over processes, small calls run
/// through the mailboxes.
fn in_place_and_apart(comm: &Communicator, _: &Ctx) {
    use tutti::{Options, RawCall};
    let (n, r) = (comm.size(), comm.rank());
    let val = |q: usize, i: usize, k: usize| (q * 1000 + i * 7 + k) as u32;
    let run = |call: &RawCall, algorithm: Option<Algorithm>| {
        let opts = Options {
            algorithm,
            ..Options::default()
        };
        // SAFETY: the caller's buffers outlive this blocking call and
        // nothing else touches them.
        unsafe { comm.run_raw(call, &opts) }.unwrap();
    };
    let mut k = 0;
    for a in std::iter::once(None).chain(Algorithm::ALL.map(Some)) {
        let implements = |coll: Collective| {
            a.is_none_or(|a| (0..n).all(|q| a.build(&Problem::new(coll, n, q, 1)).is_some()))
        };
        for count in [0, 1, 7, 1009] {
            k += 1;
            if implements(Collective::AllGather) {
                for in_place in [true, false] {
                    let send: Vec<u32> = (0..count).map(|i| val(r, i, k)).collect();
                    let mut recv = vec![u32::MAX; n * count];
                    if in_place {
                        recv[r * count..(r + 1) * count].copy_from_slice(&send);
                    }
                    let p = recv.as_mut_ptr();
                    let call = RawCall {
                        coll: Collective::AllGather,
                        dtype: DataType::U32,
                        op: ReduceOp::Sum,
                        count,
                        send: if in_place {
                            p.wrapping_add(r * count) as *const u8
                        } else {
                            send.as_ptr() as *const u8
                        },
                        send_len: count * 4,
                        recv: p as *mut u8,
                        recv_len: n * count * 4,
                        vcounts: None,
                    };
                    run(&call, a);
                    for (j, v) in recv.iter().enumerate() {
                        let want = val(j / count, j % count, k);
                        assert_eq!(
                            *v, want,
                            "{a:?} all_gather in place {in_place} rank {r} [{j}]"
                        );
                    }
                }
            }
            for root in [0, n - 1] {
                let coll = Collective::Broadcast { root };
                if !implements(coll) {
                    continue;
                }
                for apart in [true, false] {
                    let data: Vec<u32> = (0..count).map(|i| val(root, i, k)).collect();
                    let send = if r == root && apart {
                        data.clone()
                    } else {
                        Vec::new()
                    };
                    let mut recv = if r == root && !apart {
                        data.clone()
                    } else {
                        vec![u32::MAX; count]
                    };
                    let call = RawCall {
                        coll,
                        dtype: DataType::U32,
                        op: ReduceOp::Sum,
                        count,
                        send: if send.is_empty() {
                            std::ptr::null()
                        } else {
                            send.as_ptr() as *const u8
                        },
                        send_len: send.len() * 4,
                        recv: recv.as_mut_ptr() as *mut u8,
                        recv_len: count * 4,
                        vcounts: None,
                    };
                    run(&call, a);
                    assert_eq!(
                        recv, data,
                        "{a:?} broadcast root {root} apart {apart} rank {r}"
                    );
                    if r == root && apart {
                        assert_eq!(send, data, "the root's send buffer is unchanged");
                    }
                }
            }
        }
    }
}

rank_test!(
    in_place_and_apart_local_3,
    Transport::Local,
    3,
    in_place_and_apart
);
rank_test!(
    in_place_and_apart_shm_4,
    Transport::Shm,
    4,
    in_place_and_apart
);
