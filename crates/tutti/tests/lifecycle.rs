//! Create/destroy loops: a communicator made and dropped 100 times in a row
//! must give back every file descriptor, thread and shared-memory segment.
//! Each loop runs in processes of its own (so the counts of /proc/self/fd
//! and /proc/self/task are not disturbed by other tests), after two warm-up
//! rounds (lazily initialised process-wide state is not a leak).
// Reads the environment: a child reads the job its parent set up.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{procs_raw, solo, threads_with, Resources, Transport};
use tutti::{Communicator, ReduceOp, UniqueId};

const ITERS: usize = 100;

/// How long the counts may take to settle after the last drop (see
/// [`Resources::settled`]).
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Touches everything that allocates: a small and a direct-read-sized
/// AllReduce, an async op (which starts the progress thread) and a barrier.
fn exercise(c: &Communicator) {
    let n = c.size();
    let mut x = vec![c.rank() as f32; 1000];
    c.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce");
    let want = (n * (n - 1) / 2) as f32;
    assert!(x.iter().all(|&v| v == want));
    let w = c.all_reduce_async(vec![1u8; 300_000], ReduceOp::Sum);
    let y = w.wait().expect("all_reduce_async");
    assert!(y.iter().all(|&v| v as usize == n));
    c.barrier().expect("barrier");
}

fn check(what: &str, before: &Resources, after: &Resources) {
    assert_eq!(
        before, after,
        "{what}: resources before and after {ITERS} create/use/drop rounds differ (fds, threads, tutti mappings)"
    );
    assert_eq!(after.shm_maps, 0, "{what}: a tutti segment is still mapped");
}

/// The loop for one rank of a multi-process job: join, use, drop.
///
/// Successive rounds alternate between two master ports (the second one in
/// `PORT2`): when a rank starts round k+1, rank 0 may still be tearing down
/// round k's store, but it has certainly finished round k-1. Reusing one
/// port for back-to-back communicators is `recreate_same_port_*` below.
fn churn(ctx: &common::Ctx) {
    let token = std::env::var("TUTTI_TOKEN").expect("token");
    let prefix = format!("tutti-{}", &token[..8]);
    let ports = [
        std::env::var("TUTTI_MASTER_PORT").expect("port"),
        std::env::var(PORT2).expect("second port"),
    ];
    let rank: usize = std::env::var("TUTTI_RANK")
        .expect("rank")
        .parse()
        .expect("rank");
    let n: usize = std::env::var("TUTTI_WORLD_SIZE")
        .expect("size")
        .parse()
        .expect("size");
    let mut k = 0;
    let mut round = || {
        let id: UniqueId = format!("tutti1:127.0.0.1:{}:{token}", ports[k % 2])
            .parse()
            .expect("unique id");
        k += 1;
        let c = Communicator::init_rank(&id, n, rank).expect("init_rank");
        common::assert_transport(&c, ctx.transport);
        exercise(&c);
        Resources::now()
    };
    round();
    round();
    let before = Resources::steady();
    let mut during = Vec::new();
    for _ in 0..ITERS {
        during.push(round());
    }
    let after = Resources::settled(&before, SETTLE);
    check(
        &format!("{} rank {rank}", ctx.transport.name()),
        &before,
        &after,
    );
    // The probes do see a live communicator's resources.
    let live = &during[ITERS / 2];
    assert!(
        live.fds > before.fds && live.threads > before.threads,
        "{live:?} vs {before:?}"
    );
    if ctx.transport == Transport::Shm {
        assert!(
            live.shm_maps >= 1,
            "no tutti segment mapped while a communicator is alive: {live:?}"
        );
    }
    let left = common::shm_files(&prefix);
    assert!(
        left.is_empty(),
        "shared-memory files left in /dev/shm: {left:?}"
    );
}

const PORT2: &str = "TUTTI_HARNESS_PORT2";

fn churn_job(name: &str, t: Transport) {
    let p2 = if common::is_child(name) {
        String::new()
    } else {
        common::free_port().to_string()
    };
    // Calibration on: set-up runs in full (measured once, then cached).
    procs_raw(name, 3, t, &[(PORT2, &p2), ("TUTTI_CALIBRATE", "1")], churn);
}

#[test]
fn create_destroy_shm_3() {
    churn_job("create_destroy_shm_3", Transport::Shm);
}

#[test]
fn create_destroy_tcp_3() {
    churn_job("create_destroy_tcp_3", Transport::Tcp);
}

/// `Communicator::from_env` twice in a row with the same environment, as a
/// job that rebuilds its communicator (after an error, or per phase) does.
fn recreate_from_env(ctx: &common::Ctx) {
    for _ in 0..20 {
        let c = Communicator::from_env().expect("from_env");
        common::assert_transport(&c, ctx.transport);
        exercise(&c);
    }
}

#[test]
fn recreate_same_port_shm_3() {
    procs_raw(
        "recreate_same_port_shm_3",
        3,
        Transport::Shm,
        &[],
        recreate_from_env,
    );
}

#[test]
fn recreate_same_port_tcp_3() {
    procs_raw(
        "recreate_same_port_tcp_3",
        3,
        Transport::Tcp,
        &[],
        recreate_from_env,
    );
}

#[test]
fn create_destroy_init_all_4() {
    solo("create_destroy_init_all_4", &[], || {
        let round = || {
            threads_with(Communicator::init_all(4).expect("init_all"), |c, _| {
                exercise(c)
            })
        };
        let probe = Communicator::init_all(4).expect("init_all");
        let threads_before = Resources::now().threads;
        threads_with(Vec::new(), |_, _| {});
        drop(
            probe
                .iter()
                .map(|c| c.all_reduce_async(vec![0u8; 4], ReduceOp::Sum))
                .collect::<Vec<_>>(),
        );
        assert!(
            Resources::now().threads > threads_before,
            "the thread probe does not see progress threads"
        );
        drop(probe);
        round();
        round();
        let before = Resources::steady();
        for _ in 0..ITERS {
            round();
        }
        check("init_all", &before, &Resources::settled(&before, SETTLE));
    });
}
