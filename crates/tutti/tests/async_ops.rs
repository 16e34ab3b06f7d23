//! Asynchronous ops: `*_async` calls return a `Work` that owns the buffers;
//! ops complete in the order they were issued (also when mixed with blocking
//! calls); `wait`, `wait_timeout` and `is_done` report each op's outcome;
//! several can be outstanding at once; dropping a `Work` waits for its op.

mod common;

use common::{Ctx, Transport};
use std::time::Duration;
use tutti::{Communicator, ReduceOp};

const LONG: Duration = Duration::from_secs(120);

fn async_ops(c: &Communicator, ctx: &Ctx) {
    let (n, r) = (c.size(), c.rank());

    // Several outstanding at once, of different collectives and types (one
    // large enough for the shared-memory direct path).
    let w1 = c.all_reduce_async(vec![r as f32 + 1.0; 1000], ReduceOp::Sum);
    let big = 300_000;
    let w2 = c.broadcast_async(
        if r == 0 {
            (0..big).map(|i| i as u8).collect()
        } else {
            vec![0u8; big]
        },
        0,
    );
    let w3 = c.all_gather_async(vec![r as i64; 5], vec![-1i64; 5 * n]);
    let w4 = c.reduce_scatter_async(
        (0..4 * n).map(|j| (j + r) as i32).collect(),
        vec![0i32; 4],
        ReduceOp::Sum,
    );
    let w5 = c.reduce_async(vec![r as u64 + 1; 9], vec![0u64; 9], ReduceOp::Max, n - 1);
    let w6 = c.all_to_all_async(
        (0..2 * n).map(|j| (r * 100 + j) as i32).collect(),
        vec![0i32; 2 * n],
    );
    let w7 = c.barrier_async();
    // A blocking call issued after them runs after them: when it returns,
    // every earlier op is done and its Work says so.
    let mut x = vec![1u32; 17];
    c.all_reduce(&mut x, ReduceOp::Sum)
        .expect("blocking all_reduce");
    assert!(x.iter().all(|&v| v == n as u32));
    for (k, done) in [
        w1.is_done(),
        w2.is_done(),
        w3.is_done(),
        w4.is_done(),
        w5.is_done(),
        w6.is_done(),
        w7.is_done(),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(
            done,
            "async op {} is not done after a later blocking op returned",
            k + 1
        );
    }
    // Waited for in reverse order.
    w7.wait().expect("barrier_async");
    let (_, recv) = w6.wait().expect("all_to_all_async");
    for q in 0..n {
        for i in 0..2 {
            assert_eq!(recv[q * 2 + i], (q * 100 + r * 2 + i) as i32);
        }
    }
    let (send, recv) = w5.wait().expect("reduce_async");
    assert!(
        send.iter().all(|&v| v == r as u64 + 1),
        "the send buffer comes back unchanged"
    );
    if r == n - 1 {
        assert!(recv.iter().all(|&v| v == n as u64));
    }
    let (_, recv) = w4.wait().expect("reduce_scatter_async");
    for (i, v) in recv.iter().enumerate() {
        assert_eq!(*v as usize, (0..n).map(|q| r * 4 + i + q).sum::<usize>());
    }
    let (_, recv) = w3.wait().expect("all_gather_async");
    assert!(recv.iter().enumerate().all(|(j, &v)| v == (j / 5) as i64));
    let b = w2.wait().expect("broadcast_async");
    assert!(b.iter().enumerate().all(|(i, &v)| v == i as u8));
    let s = w1.wait().expect("all_reduce_async");
    assert!(s.iter().all(|&v| v == (n * (n + 1) / 2) as f32));

    // Many outstanding; the last one done implies all earlier ones are.
    let ws: Vec<_> = (0..50)
        .map(|k| c.all_reduce_async(vec![(k * n + r) as i64; 33], ReduceOp::Sum))
        .collect();
    let last = ws.last().expect("50 ops");
    assert!(matches!(last.wait_timeout(LONG), Some(Ok(()))));
    assert!(ws.iter().all(|w| w.is_done()), "ops complete in order");
    for (k, w) in ws.into_iter().enumerate() {
        let v = w.wait().expect("all_reduce_async");
        let want: usize = (0..n).map(|q| k * n + q).sum();
        assert!(v.iter().all(|&x| x as usize == want), "op {k}");
    }

    // wait_timeout: None while a peer has not issued the op yet (rank 0
    // issues first and checks; the others issue only once told to).
    if n > 1 {
        if r == 0 {
            let w = c.all_reduce_async(vec![2.0f64; 3], ReduceOp::Prod);
            assert!(
                w.wait_timeout(Duration::from_millis(50)).is_none(),
                "the op cannot be done: rank 1 has not issued it"
            );
            assert!(!w.is_done());
            ctx.mark("go");
            assert!(matches!(w.wait_timeout(LONG), Some(Ok(()))));
            assert!(w.is_done());
            let v = w.wait().expect("all_reduce_async");
            assert!(v.iter().all(|&x| x == 2f64.powi(n as i32)));
        } else {
            ctx.wait_mark("go");
            let v = c
                .all_reduce_async(vec![2.0f64; 3], ReduceOp::Prod)
                .wait()
                .expect("all_reduce_async");
            assert!(v.iter().all(|&x| x == 2f64.powi(n as i32)));
        }
    }

    // Send/recv: a ring of small messages, all sends issued before the receives.
    if n > 1 {
        let (to, from) = ((r + 1) % n, (r + n - 1) % n);
        let ws = c.send_async((0..100).map(|i| (r * 1000 + i) as u32).collect(), to);
        let wr = c.recv_async(vec![0u32; 100], from);
        let got = wr.wait().expect("recv_async");
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (from * 1000 + i) as u32));
        ws.wait().expect("send_async");
    }

    // Dropping a Work without waiting blocks until the op is done; the
    // communicator carries on.
    drop(c.all_reduce_async(vec![1i8; 64], ReduceOp::Sum));
    let w = c.all_gather_async(vec![r as u8; 3], vec![0u8; 3 * n]);
    let mut y = [r as f64; 4];
    c.all_reduce(&mut y, ReduceOp::Max)
        .expect("blocking after async");
    assert!(y.iter().all(|&v| v == (n - 1) as f64));
    let (_, g) = w.wait().expect("all_gather_async");
    assert!(g.iter().enumerate().all(|(j, &v)| v as usize == j / 3));
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(async_local_1, Transport::Local, 1, async_ops);
rank_test!(async_local_2, Transport::Local, 2, async_ops);
rank_test!(async_local_4, Transport::Local, 4, async_ops);
rank_test!(async_shm_3, Transport::Shm, 3, async_ops);
rank_test!(async_tcp_3, Transport::Tcp, 3, async_ops);
rank_test!(async_shm_8, Transport::Shm, 8, async_ops);

/// Ops complete in issue order: once a blocking call issued after an async
/// op has returned, that op's Work must report done.
#[test]
fn blocking_after_async_sees_done() {
    let comms = Communicator::init_all(1).expect("init_all");
    let c = &comms[0];
    let mut late = 0;
    for _ in 0..2000 {
        let w = c.all_reduce_async(vec![1f32; 8], ReduceOp::Sum);
        c.barrier().expect("barrier");
        if !w.is_done() {
            late += 1;
        }
        w.wait().expect("all_reduce_async");
    }
    assert_eq!(
        late, 0,
        "{late} of 2000 async ops were not done after a later blocking op returned"
    );
}

/// Two ranks exchange 1 MiB with `send_async` then `recv_async` (the MPI
/// `Isend`/`Irecv` idiom). Sends and receives progress on their own
/// channel, beside the ordered collectives, so neither send waits for the
/// receive queued after it (tests/p2p.rs has the 64 MiB ring shifts).
#[test]
fn exchange_large_async() {
    common::solo("exchange_large_async", &[("TUTTI_TIMEOUT", "5")], || {
        common::threads(2, |c, _| {
            let peer = 1 - c.rank();
            let ws = c.send_async(vec![c.rank() as u8; 1 << 20], peer);
            let wr = c.recv_async(vec![9u8; 1 << 20], peer);
            let got = wr.wait().expect("recv_async");
            assert!(got.iter().all(|&v| v as usize == peer));
            ws.wait().expect("send_async");
        });
    });
}

/// Point-to-point ops posted with the longest deadline there is
/// (`Duration::MAX`): an eager send completes at once, its receive gets
/// it, and closing the communicators (which waits for peers to take eager
/// messages, as long as the ops' deadlines) neither overflows nor hangs.
fn p2p_without_deadline(c: &Communicator, _: &Ctx) {
    let data = [c.rank() as u8 + 1; 8];
    let mut got = [0u8; 8];
    let peer = 1 - c.rank();
    let ops = [
        tutti::RawP2p {
            send: true,
            peer: Some(peer),
            ptr: data.as_ptr().cast_mut(),
            len: data.len(),
            tag: 0,
            exact: true,
        },
        tutti::RawP2p {
            send: false,
            peer: Some(peer),
            ptr: got.as_mut_ptr(),
            len: got.len(),
            tag: 0,
            exact: true,
        },
    ];
    // SAFETY: `data` and `got` outlive the waits below, and nothing else
    // touches them meanwhile.
    let posted = unsafe { c.post_p2p_raw(&ops, Some(Duration::MAX)) };
    for (w, _) in posted {
        w.wait().expect("p2p op");
    }
    assert_eq!(got, [peer as u8 + 1; 8]);
}

rank_test!(
    p2p_without_deadline_local_2,
    Transport::Local,
    2,
    p2p_without_deadline
);
rank_test!(
    p2p_without_deadline_tcp_2,
    Transport::Tcp,
    2,
    p2p_without_deadline
);
