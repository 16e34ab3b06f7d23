//! Bad input is a typed error with a useful message; nothing panics or hangs.
//!
//! * Wrong lengths, roots and peers: every rank makes the same bad call (so
//!   no rank is left waiting in a collective), gets `InvalidArgument`, and
//!   the communicator still works afterwards.
//! * Bad environments: each in a child process of its own (environment
//!   variables are process-wide), expecting `Config` or `Bootstrap` errors.
//! * Mismatched collectives, a deadline that runs out, a peer that dies: in
//!   child processes under the harness's hard timeout, so a hang fails the
//!   test instead of stalling the suite.
// Reads the environment: a test's child process reads its role and rank from
// the environment its parent set.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{procs_raw, solo, threads, Ctx, Transport};
use std::time::Duration;
use tutti::algo::Problem;
use tutti::{Algorithm, Collective, Communicator, EnvInfo, Error, Options, RawCall, ReduceOp};

/// Asserts that `res` is `InvalidArgument` whose message contains every needle.
#[track_caller]
fn invalid<T: std::fmt::Debug>(res: tutti::Result<T>, needles: &[&str]) {
    match res {
        Err(Error::InvalidArgument(m)) => {
            for nd in needles {
                assert!(m.contains(nd), "message {m:?} does not mention {nd:?}");
            }
        }
        other => panic!("expected InvalidArgument mentioning {needles:?}, got {other:?}"),
    }
}

/// Every check that fails before anything is sent, on every rank alike.
fn bad_arguments(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let s = |k: usize| k.to_string();
    let send = vec![1f32; 5];
    // AllGather: recv must be size * send.
    invalid(
        c.all_gather(&send, &mut vec![0f32; 5 * n + 1]),
        &["all_gather", "receive buffer", &s(5 * n)],
    );
    invalid(
        c.all_gather(&send, &mut vec![0f32; 5 * n - 1]),
        &["all_gather", "receive buffer"],
    );
    // ReduceScatter: send must be size * recv.
    invalid(
        c.reduce_scatter(&vec![1f32; 3 * n + 1], &mut [0f32; 3], ReduceOp::Sum),
        &["reduce_scatter", "send buffer", &s(3 * n)],
    );
    // AllReduce out of place: same lengths.
    invalid(
        c.all_reduce_into(&send, &mut [0f32; 4], ReduceOp::Sum),
        &["all_reduce", "receive buffer"],
    );
    // AllToAll: send divisible by size, recv the same length.
    if n > 1 {
        invalid(
            c.all_to_all(&vec![1i32; 3 * n + 1], &mut vec![0i32; 3 * n + 1]),
            &["all_to_all", &s(3 * n + 1), &s(n)],
        );
    }
    invalid(
        c.all_to_all(&vec![1i32; 3 * n], &mut vec![0i32; 3 * n + 2]),
        &["all_to_all", "receive buffer"],
    );
    // AllToAllV: one count and displacement per rank, inside the buffers.
    let ones = vec![1usize; n];
    let displs: Vec<usize> = (0..n).collect();
    invalid(
        c.all_to_all_v(
            &vec![0u8; n],
            &vec![1; n + 1],
            &displs,
            &mut vec![0u8; n],
            &ones,
            &displs,
        ),
        &["all_to_all", "send_counts", &s(n + 1)],
    );
    invalid(
        c.all_to_all_v(
            &vec![0u8; n],
            &ones,
            &displs,
            &mut vec![0u8; n],
            &ones,
            &vec![0; n - 1],
        ),
        &["all_to_all", "recv_displs"],
    );
    let past_end: Vec<usize> = (0..n).map(|q| q + 1).collect();
    invalid(
        c.all_to_all_v(
            &vec![0u8; n],
            &ones,
            &past_end,
            &mut vec![0u8; n],
            &ones,
            &displs,
        ),
        &["all_to_all"],
    );
    // A displacement whose end in bytes overflows: an error, never an
    // access before the buffer.
    let huge = vec![(1usize << 61) - 1; n];
    invalid(
        c.all_to_all_v(
            &vec![0f64; 2 * n],
            &vec![2; n],
            &huge,
            &mut vec![0f64; 2 * n],
            &vec![2; n],
            &huge,
        ),
        &["all_to_all", "overflow"],
    );
    // What a rank sends itself must be what it expects from itself.
    let mut two = ones.clone();
    two[c.rank()] = 2;
    invalid(
        c.all_to_all_v(
            &vec![0u8; n + 1],
            &two,
            &displs,
            &mut vec![0u8; n + 1],
            &ones,
            &displs,
        ),
        &["all_to_all", "send_counts"],
    );
    // Roots out of range.
    for root in [n, n + 7] {
        invalid(
            c.broadcast(&mut [0u8; 4], root),
            &["broadcast", "root", &s(root)],
        );
        invalid(
            c.reduce(&[0u8; 4], &mut [0u8; 4], ReduceOp::Max, root),
            &["reduce", "root", &s(root)],
        );
        invalid(
            c.gather(&[0u8; 4], &mut vec![0u8; 4 * n], root),
            &["gather", "root", &s(root)],
        );
        invalid(
            c.scatter(&vec![0u8; 4 * n], &mut [0u8; 4], root),
            &["scatter", "root", &s(root)],
        );
    }
    // Peers out of range, and this rank itself.
    for peer in [n, n + 1, r] {
        invalid(c.send(&[1u64; 3], peer), &["send", "peer", &s(peer)]);
        invalid(c.recv(&mut [1u64; 3], peer), &["recv", "peer", &s(peer)]);
    }
    // Overlapping send and receive buffers (only reachable through the raw API).
    let mut buf = vec![0f32; 4 * n];
    let call = RawCall {
        coll: Collective::ReduceScatter,
        dtype: tutti::DataType::F32,
        op: ReduceOp::Sum,
        count: 4,
        send: buf.as_ptr() as *const u8,
        send_len: 16 * n,
        recv: buf.as_mut_ptr() as *mut u8,
        recv_len: 16,
        vcounts: None,
    };
    // SAFETY: both ranges lie in `buf`, which outlives the call; the call
    // is refused before it touches them.
    invalid(
        unsafe { c.run_raw(&call, &Options::default()) },
        &["overlap"],
    );
    // Broadcast from a separate send buffer that is too short: every rank
    // names itself the root, so every rank is refused.
    let mut out = vec![0f32; 8];
    let short = [1f32; 7];
    let call = RawCall {
        coll: Collective::Broadcast { root: r },
        dtype: tutti::DataType::F32,
        op: ReduceOp::Sum,
        count: 8,
        send: short.as_ptr() as *const u8,
        send_len: 28,
        recv: out.as_mut_ptr() as *mut u8,
        recv_len: 32,
        vcounts: None,
    };
    // SAFETY: both buffers outlive the call, which is refused before it
    // touches them.
    invalid(
        unsafe { c.run_raw(&call, &Options::default()) },
        &["broadcast", "root", "send buffer", "28", "32"],
    );
    // A forced algorithm that does not implement the collective.
    let p = Problem::new(Collective::AllReduce, n, r, 0);
    if let Some(a) = Algorithm::ALL.into_iter().find(|a| a.build(&p).is_none()) {
        let o = Options {
            algorithm: Some(a),
            timeout: None,
            wire: None,
        };
        invalid(
            c.all_reduce_with(&mut [0f32; 3], ReduceOp::Sum, &o),
            &[a.name(), "all_reduce"],
        );
    }
    // Asynchronous calls report the same errors through their Work.
    let w = c.all_to_all_async(vec![0i32; 3 * n + 1], vec![0i32; 3 * n + 1]);
    if n > 1 {
        assert!(w.is_done(), "a refused call completes at once");
        invalid(w.wait(), &["all_to_all"]);
    } else {
        w.wait().expect("with one rank any length divides");
    }
    invalid(
        c.reduce_scatter_async(vec![0f32; 2 * n + 1], vec![0f32; 2], ReduceOp::Sum)
            .wait(),
        &["reduce_scatter"],
    );
    invalid(
        c.all_gather_async(vec![0u8; 2], vec![0u8; 2 * n + 3])
            .wait(),
        &["all_gather"],
    );
    // A message to oneself, posted asynchronously, meets its receive (the
    // blocking calls above refuse it: nothing else could post the match).
    let ws = c.send_async(vec![7u8; 2], r);
    let got = c
        .recv_async(vec![0u8; 2], r)
        .wait()
        .expect("recv from oneself");
    assert_eq!(got, [7, 7]);
    ws.wait().expect("send to oneself");
    invalid(c.send_async(vec![0u8; 2], n).wait(), &["peer"]);
    // None of that poisoned the communicator.
    assert!(
        c.error().is_none(),
        "an argument error poisoned the communicator: {:?}",
        c.error()
    );
    let mut x = vec![1i32; 9];
    c.all_reduce(&mut x, ReduceOp::Sum)
        .expect("the communicator still works");
    assert!(x.iter().all(|&v| v == n as i32));
}

#[test]
fn bad_arguments_local_1() {
    threads(1, bad_arguments);
}

#[test]
fn bad_arguments_local_3() {
    threads(3, bad_arguments);
}

#[test]
fn bad_arguments_shm_2() {
    common::procs("bad_arguments_shm_2", 2, Transport::Shm, &[], bad_arguments);
}

#[test]
fn bad_arguments_tcp_2() {
    common::procs("bad_arguments_tcp_2", 2, Transport::Tcp, &[], bad_arguments);
}

/// Root-only buffers are checked on the root: with one rank nobody else waits.
#[test]
fn bad_root_buffers_local_1() {
    threads(1, |c, _| {
        invalid(
            c.gather(&[0u8; 4], &mut [0u8; 5], 0),
            &["gather", "receive buffer"],
        );
        invalid(
            c.scatter(&[0u8; 5], &mut [0u8; 4], 0),
            &["scatter", "send buffer"],
        );
        invalid(
            c.reduce(&[0u8; 4], &mut [0u8; 3], ReduceOp::Sum, 0),
            &["reduce", "receive buffer"],
        );
        c.barrier().expect("still works");
    });
}

/// A raw Broadcast whose root passes its data in a separate send buffer
/// (as NCCL's out-of-place broadcast): every rank ends with it and the
/// root's send buffer is left alone; with an empty send buffer the data is
/// the root's receive buffer. Repeated, so the repeat fast path runs too.
#[test]
fn raw_broadcast_from_a_send_buffer_local_3() {
    threads(3, |c, _| {
        let r = c.rank();
        let root = 1;
        for k in 0..6u32 {
            let data: Vec<u32> = (0..40).map(|i| i * 7 + k).collect();
            let separate = k % 3 != 2;
            let send: Vec<u32> = if r == root && separate {
                data.clone()
            } else {
                Vec::new()
            };
            let mut recv = if r == root && !separate {
                data.clone()
            } else {
                vec![u32::MAX; 40]
            };
            let call = RawCall {
                coll: Collective::Broadcast { root },
                dtype: tutti::DataType::U32,
                op: ReduceOp::Sum,
                count: 40,
                send: if send.is_empty() {
                    std::ptr::null()
                } else {
                    send.as_ptr() as *const u8
                },
                send_len: send.len() * 4,
                recv: recv.as_mut_ptr() as *mut u8,
                recv_len: 160,
                vcounts: None,
            };
            // SAFETY: both vectors outlive this blocking call and nothing
            // else touches them.
            unsafe { c.run_raw(&call, &Options::default()) }.unwrap();
            assert_eq!(recv, data, "rank {r} call {k}");
            if r == root && separate {
                assert_eq!(send, data, "the root's send buffer is unchanged");
            }
        }
    });
}

#[test]
fn init_all_zero_ranks() {
    invalid(Communicator::init_all(0), &["init_all"]);
}

#[test]
fn init_rank_out_of_range() {
    let id: tutti::UniqueId = "tutti1:127.0.0.1:1:00112233445566778899aabbccddeeff"
        .parse()
        .expect("id");
    match Communicator::init_rank(&id, 2, 2) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains('2'), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!("tutti1:nonsense".parse::<tutti::UniqueId>().is_err());
}

// ---- environments ----

/// Asserts that `res` is a `Config` error mentioning every needle.
#[track_caller]
fn config_err<T: std::fmt::Debug>(res: tutti::Result<T>, needles: &[&str]) {
    match res {
        Err(Error::Config(m)) => {
            for nd in needles {
                assert!(m.contains(nd), "message {m:?} does not mention {nd:?}");
            }
        }
        other => panic!("expected a Config error mentioning {needles:?}, got {other:?}"),
    }
}

macro_rules! env_case {
    ($name:ident, $env:expr, $body:expr) => {
        #[test]
        fn $name() {
            solo(
                &common::test_name(module_path!(), stringify!($name)),
                $env,
                $body,
            );
        }
    };
}

env_case!(
    env_rank_not_below_world_size,
    &[
        ("TUTTI_RANK", "3"),
        ("TUTTI_WORLD_SIZE", "2"),
        ("TUTTI_MASTER_ADDR", "127.0.0.1"),
        ("TUTTI_MASTER_PORT", "1")
    ],
    || {
        config_err(EnvInfo::from_env(), &["TUTTI_RANK=3", "TUTTI_WORLD_SIZE=2"]);
        config_err(Communicator::from_env(), &["TUTTI_RANK=3"]);
    }
);

env_case!(
    env_world_size_zero,
    &[("TUTTI_RANK", "0"), ("TUTTI_WORLD_SIZE", "0")],
    || {
        config_err(EnvInfo::from_env(), &["TUTTI_WORLD_SIZE=0"]);
    }
);

env_case!(
    env_rank_not_a_number,
    &[("TUTTI_RANK", "one"), ("TUTTI_WORLD_SIZE", "2")],
    || {
        config_err(EnvInfo::from_env(), &["TUTTI_RANK", "one"]);
    }
);

env_case!(
    env_no_master,
    &[("TUTTI_RANK", "0"), ("TUTTI_WORLD_SIZE", "2")],
    || {
        config_err(
            EnvInfo::from_env(),
            &["TUTTI_MASTER_ADDR", "TUTTI_MASTER_PORT"],
        );
    }
);

env_case!(env_nothing_set, &[], || {
    config_err(
        Communicator::from_env(),
        &["TUTTI_RANK", "TUTTI_WORLD_SIZE"],
    );
});

env_case!(
    env_bad_token,
    &[
        ("TUTTI_RANK", "0"),
        ("TUTTI_WORLD_SIZE", "1"),
        ("TUTTI_MASTER_ADDR", "127.0.0.1"),
        ("TUTTI_MASTER_PORT", "1"),
        ("TUTTI_TOKEN", "xyz")
    ],
    || {
        config_err(EnvInfo::from_env(), &["TUTTI_TOKEN"]);
    }
);

env_case!(
    env_rank_table_missing,
    &[
        ("TUTTI_RANK_TABLE", "/nonexistent/tutti-rank-table.json"),
        ("TUTTI_RANK", "0")
    ],
    || {
        config_err(
            EnvInfo::from_env(),
            &["TUTTI_RANK_TABLE", "/nonexistent/tutti-rank-table.json"],
        );
    }
);

env_case!(env_bad_settings, &[], || {
    // Each malformed variable is named in its error.
    for (k, v) in [
        ("TUTTI_TIMEOUT", "soon"),
        ("TUTTI_TIMEOUT", "-1"),
        ("TUTTI_CONNECT_TIMEOUT", "0"),
        ("TUTTI_TRANSPORT", "pigeon"),
        ("TUTTI_ALGO", "bogus"),
        ("TUTTI_ALGO", "all_reduce:bogus"),
        ("TUTTI_SHM_RING_BYTES", "3000"),
        ("TUTTI_TCP_CONGESTION", "cubic; rm"),
        ("TUTTI_TUNE", "fast"),
        ("TUTTI_SHM_STREAM", "maybe"),
    ] {
        std::env::set_var(k, v);
        config_err(tutti::Config::from_env(), &[k]);
        config_err(Communicator::init_all(2), &[k]);
        std::env::remove_var(k);
    }
    tutti::Config::from_env().expect("all clean again");
});

env_case!(
    env_unreachable_master,
    &[
        ("TUTTI_RANK", "1"),
        ("TUTTI_WORLD_SIZE", "2"),
        ("TUTTI_MASTER_ADDR", "127.0.0.1"),
        ("TUTTI_CONNECT_TIMEOUT", "1")
    ],
    || {
        // Nobody listens on this port (it was free a moment ago and only this
        // test knows it); the rank must give up after ~1 s with advice.
        std::env::set_var("TUTTI_MASTER_PORT", common::free_port().to_string());
        match Communicator::from_env() {
            Err(Error::Bootstrap { rank: 1, msg }) => {
                assert!(msg.contains("TUTTI_CONNECT_TIMEOUT"), "{msg}");
                assert!(
                    msg.contains("MASTER_ADDR") || msg.contains("master"),
                    "{msg}"
                );
            }
            other => panic!("expected a Bootstrap error, got {other:?}"),
        }
    }
);

env_case!(
    env_missing_rank,
    &[
        ("TUTTI_RANK", "0"),
        ("TUTTI_WORLD_SIZE", "2"),
        ("TUTTI_MASTER_ADDR", "127.0.0.1"),
        ("TUTTI_CONNECT_TIMEOUT", "1")
    ],
    || {
        // Rank 0 serves the store; rank 1 never comes.
        std::env::set_var("TUTTI_MASTER_PORT", common::free_port().to_string());
        match Communicator::from_env() {
            Err(Error::Bootstrap { rank: 0, msg }) => assert!(
                msg.contains("TUTTI_CONNECT_TIMEOUT") || msg.contains("join"),
                "{msg}"
            ),
            other => panic!("expected a Bootstrap error, got {other:?}"),
        }
    }
);

/// Ranks started with different world sizes, a wrong token or different
/// ring sizes fail to join (each within the connect timeout) instead of
/// hanging, and leave no shared-memory file behind.
fn disagreeing_job(name: &str, second: &[(&str, &str)]) {
    if common::is_child(name) {
        let r = Communicator::from_env();
        let rank = std::env::var("TUTTI_RANK").unwrap_or_default();
        match r {
            Err(Error::Bootstrap { msg, .. }) => {
                println!("rank {rank}: refused as expected: {msg}")
            }
            other => panic!("rank {rank}: expected a Bootstrap error, got {other:?}"),
        }
        return;
    }
    let (port, tok) = (common::free_port(), common::token());
    let mut envs = vec![
        common::rank_env(Transport::Shm, 2, 0, port, &tok),
        common::rank_env(Transport::Shm, 2, 1, port, &tok),
    ];
    for e in &mut envs {
        e.push(("TUTTI_CONNECT_TIMEOUT".into(), "3".into()));
    }
    for (k, v) in second {
        envs[1].retain(|(x, _)| x != k);
        envs[1].push((k.to_string(), v.to_string()));
    }
    common::Job::spawn(name, envs).wait(Duration::from_secs(120), Duration::from_secs(30));
    let left = common::shm_files(&format!("tutti-{}", &tok[..8]));
    for f in &left {
        let _ = std::fs::remove_file(std::path::Path::new("/dev/shm").join(f));
    }
    assert!(
        left.is_empty(),
        "a failed set-up left shared-memory files in /dev/shm: {left:?}"
    );
}

#[test]
fn disagreeing_world_size() {
    disagreeing_job("disagreeing_world_size", &[("TUTTI_WORLD_SIZE", "3")]);
}

#[test]
fn disagreeing_ring_bytes() {
    // Rank 1 finds the segment's layout unexpected and gives up; rank 0,
    // which created the segment, then times out waiting for it.
    disagreeing_job("disagreeing_ring_bytes", &[("TUTTI_SHM_RING_BYTES", "8K")]);
}

#[test]
fn wrong_token() {
    disagreeing_job(
        "wrong_token",
        &[("TUTTI_TOKEN", "00000000000000000000000000000000")],
    );
}

// ---- collectives that cannot complete ----

/// Ranks call different collectives (different type, then different count).
fn mismatch(c: &Communicator, _: &Ctx) {
    let o = Options {
        algorithm: None,
        timeout: Some(Duration::from_secs(30)),
        wire: None,
    };
    let res = if c.rank() == 0 {
        c.all_reduce_with(&mut [1f32; 7], ReduceOp::Sum, &o)
    } else {
        c.all_reduce_with(&mut [1i32; 7], ReduceOp::Sum, &o)
    };
    println!("rank {}: {res:?}", c.rank());
    match res {
        Err(Error::Mismatch { msg, .. }) => assert!(msg.contains("all_reduce"), "{msg}"),
        // A rank that only hears that its peer failed.
        Err(Error::PeerLost { .. }) => {}
        other => panic!("expected a mismatch error, got {other:?}"),
    }
    assert!(c.error().is_some(), "a mismatch poisons the communicator");
    assert!(c.barrier().is_err(), "later ops fail fast");
}

fn count_mismatch(c: &Communicator, _: &Ctx) {
    let o = Options {
        algorithm: None,
        timeout: Some(Duration::from_secs(30)),
        wire: None,
    };
    let len = 7 + c.rank();
    let res = c.all_reduce_with(&mut vec![1f32; len], ReduceOp::Sum, &o);
    println!("rank {}: {res:?}", c.rank());
    match res {
        Err(Error::Mismatch { .. }) | Err(Error::PeerLost { .. }) => {}
        other => panic!("expected a mismatch error, got {other:?}"),
    }
}

#[test]
fn mismatch_local_2() {
    solo("mismatch_local_2", &[], || threads(2, mismatch));
}

#[test]
fn count_mismatch_local_2() {
    solo("count_mismatch_local_2", &[], || threads(2, count_mismatch));
}

#[test]
fn mismatch_shm_2() {
    common::procs("mismatch_shm_2", 2, Transport::Shm, &[], mismatch);
}

#[test]
fn mismatch_tcp_2() {
    common::procs("mismatch_tcp_2", 2, Transport::Tcp, &[], mismatch);
}

/// Rank 0 runs an AllReduce with a short deadline that rank 1 never joins.
fn deadline(c: &Communicator, ctx: &Ctx) {
    if c.rank() == 0 {
        let o = Options {
            algorithm: None,
            timeout: Some(Duration::from_millis(300)),
            wire: None,
        };
        match c.all_reduce_with(&mut [1f64; 5], ReduceOp::Sum, &o) {
            Err(e @ Error::Timeout { .. }) => {
                let Error::Timeout {
                    rank,
                    ref waiting_for,
                    ref op,
                    ..
                } = e
                else {
                    unreachable!()
                };
                assert_eq!(rank, 0);
                assert_eq!(waiting_for, &vec![1]);
                assert_eq!(op, "all_reduce");
                assert!(e.to_string().contains("TUTTI_TIMEOUT"), "{e}");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(matches!(c.error(), Some(Error::Timeout { .. })));
        assert!(c.barrier().is_err(), "later ops fail fast");
        ctx.mark("timed-out");
    } else {
        ctx.wait_mark("timed-out");
    }
    // Dropping both communicators now must not hang.
}

#[test]
fn deadline_local_2() {
    solo("deadline_local_2", &[], || threads(2, deadline));
}

#[test]
fn deadline_shm_2() {
    common::procs("deadline_shm_2", 2, Transport::Shm, &[], deadline);
}

#[test]
fn deadline_tcp_2() {
    common::procs("deadline_tcp_2", 2, Transport::Tcp, &[], deadline);
}

/// Rank 1 never joins a small AllReduce; rank 0 gives up after 300 ms and
/// tells its peers why. Rank 2, with a long deadline, then fails at once
/// with `PeerLost` naming rank 0 and what rank 0 saw: that it timed out
/// waiting for rank 1, the rank at the root of it.
fn timeout_reason(c: &Communicator, ctx: &Ctx) {
    let after = |ms| Options {
        timeout: Some(Duration::from_millis(ms)),
        ..Options::default()
    };
    match c.rank() {
        0 => {
            let r = c.all_reduce_with(&mut [1f64; 5], ReduceOp::Sum, &after(300));
            assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
            ctx.mark("timed-out");
        }
        2 => {
            let t0 = std::time::Instant::now();
            let r = c.all_reduce_with(&mut [1f64; 5], ReduceOp::Sum, &after(60_000));
            match r {
                Err(Error::PeerLost {
                    peer: 0, ref msg, ..
                }) => {
                    assert!(msg.contains("rank 0 timed out waiting for rank 1"), "{msg}");
                }
                other => panic!("expected PeerLost naming rank 0, got {other:?}"),
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "heard of it, did not wait"
            );
        }
        _ => ctx.wait_mark("timed-out"),
    }
}

#[test]
fn timeout_reason_shm_3() {
    common::procs(
        "timeout_reason_shm_3",
        3,
        Transport::Shm,
        &[],
        timeout_reason,
    );
}

/// `Duration::MAX` as a per-call timeout means "no timeout": rank 1 joins
/// late, so rank 0 stops spinning and computes its deadline; that used to
/// overflow `Instant` and panic. Small (mailbox) and large (ring) calls.
fn no_timeout(c: &Communicator, _: &Ctx) {
    let o = Options {
        algorithm: None,
        timeout: Some(Duration::MAX),
        wire: None,
    };
    for count in [5, 300_000] {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut x = vec![1f64; count];
        c.all_reduce_with(&mut x, ReduceOp::Sum, &o)
            .expect("all_reduce without a timeout");
        assert!(x.iter().all(|&v| v == 2.0));
    }
}

#[test]
fn no_timeout_local_2() {
    solo("no_timeout_local_2", &[], || threads(2, no_timeout));
}

#[test]
fn no_timeout_shm_2() {
    common::procs("no_timeout_shm_2", 2, Transport::Shm, &[], no_timeout);
}

/// The last rank exits (without dropping its communicator) after a first
/// AllReduce; the others' next AllReduce must fail with `PeerLost`, long
/// before the 120 s deadline.
fn peer_dies(ctx: &Ctx) {
    let c = Communicator::from_env().expect("from_env");
    let n = c.size();
    let mut x = vec![1f32; 1000];
    c.all_reduce(&mut x, ReduceOp::Sum)
        .expect("first all_reduce");
    if c.rank() == n - 1 {
        std::process::exit(0);
    }
    let _ = ctx;
    let res = c.all_reduce(&mut x, ReduceOp::Sum);
    println!("rank {}: {res:?}", c.rank());
    match res {
        Err(Error::PeerLost { .. }) => {}
        other => panic!("expected PeerLost, got {other:?}"),
    }
    assert!(c.barrier().is_err(), "later ops fail fast");
}

#[test]
fn peer_dies_shm_3() {
    procs_raw("peer_dies_shm_3", 3, Transport::Shm, &[], peer_dies);
}

#[test]
fn peer_dies_tcp_3() {
    procs_raw("peer_dies_tcp_3", 3, Transport::Tcp, &[], peer_dies);
}

/// A congestion control the kernel does not have fails set-up on every rank
/// with an error that names it; `auto` and `system` never fail set-up, and
/// a named one the kernel has (reno is always built in and allowed) works.
#[test]
fn tcp_congestion_choice() {
    use tutti::config::{TcpCongestion, TransportChoice};
    let run = |cc: TcpCongestion| -> Vec<tutti::Result<Vec<f32>>> {
        let id = tutti::UniqueId::new().expect("id");
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let (id, cc) = (id.clone(), cc.clone());
                    s.spawn(move || {
                        let cfg = tutti::Config {
                            transport: TransportChoice::Tcp,
                            tcp_congestion: cc,
                            connect_timeout: Duration::from_secs(20),
                            timeout: Duration::from_secs(20),
                            ..tutti::Config::default()
                        };
                        let c = Communicator::init_rank_with(&id, 2, r, cfg)?;
                        let mut x = vec![(r + 1) as f32; 100_000];
                        c.all_reduce(&mut x, ReduceOp::Sum)?;
                        Ok(x)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        })
    };
    for r in run(TcpCongestion::Named("no_such_cc".into())) {
        config_err(r, &["TUTTI_TCP_CONGESTION=no_such_cc", "refused"]);
    }
    for cc in [
        TcpCongestion::Auto,
        TcpCongestion::System,
        TcpCongestion::Named("reno".into()),
    ] {
        for (r, x) in run(cc.clone()).into_iter().enumerate() {
            let x = x.unwrap_or_else(|e| panic!("{cc:?} rank {r}: {e}"));
            assert!(x.iter().all(|&v| v == 3.0), "{cc:?} rank {r}: wrong sum");
        }
    }
}
