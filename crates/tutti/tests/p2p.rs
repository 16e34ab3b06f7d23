//! Point-to-point: sends and receives progress on their own channel, so the
//! patterns that deadlock when ops run one at a time in issue order
//! complete: a symmetric exchange of large messages (both sides send, then
//! receive), ring shifts, batches in any order, receives posted before a
//! collective that the sender runs first. Messages match per (peer, tag) in
//! order; any-source receives report the sender; a receive too small for
//! its message fails (and so does a rendezvous send; an eager send has
//! completed) and the communicator stays usable.

mod common;

use common::{Ctx, Transport};
use tutti::{Communicator, Error, P2pOp, ReduceOp, EAGER_BYTES};

/// 64 MiB: far more than a ring or a socket buffer holds.
const BIG: usize = 64 << 20;

/// The numbers a plan draws from, the same on every rank for one `seed`.
fn plan_rng(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed = common::data::mix64(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
        seed
    }
}

/// A byte of rank `r`'s message at index `i` (distinct per rank and index).
fn byte(r: usize, i: usize) -> u8 {
    (i as u64)
        .wrapping_mul(2654435761)
        .wrapping_add(r as u64 * 97) as u8
}

fn message(r: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte(r, i)).collect()
}

fn check_from(got: &[u8], r: usize) {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != byte(r, i)) {
        panic!(
            "byte {i} of rank {r}'s message is {}, expected {}",
            got[i],
            byte(r, i)
        );
    }
}

/// Ring shift of 64 MiB: every rank `send_async`s to the next, then
/// `recv_async`s from the previous, then waits for both; then the same
/// through `batch_isend_irecv` (receive listed first, as a pipeline stage
/// might), then the reverse direction with blocking calls in a batch.
fn ring_shift(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let ws = c.send_async(message(r, BIG), next);
    let wr = c.recv_async(vec![0u8; BIG], prev);
    let got = wr.wait().expect("recv_async");
    check_from(&got, prev);
    ws.wait().expect("send_async");

    let out = message(r + 10, BIG);
    let mut inp = got;
    c.batch_isend_irecv(vec![
        P2pOp::recv(&mut inp, prev, 7),
        P2pOp::send(&out, next, 7),
    ])
    .expect("batch_isend_irecv");
    check_from(&inp, prev + 10);

    let st = c
        .batch_isend_irecv(vec![
            P2pOp::send(&out[..1000], prev, 1),
            P2pOp::recv_from(&mut inp[..4096], Some(next), 1),
        ])
        .expect("reverse batch");
    let s = st[1].expect("a receive's status");
    assert_eq!((s.source, s.tag, s.bytes), (next, 1, 1000));
    check_from(&inp[..1000], next + 10);
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(ring_shift_local_2, Transport::Local, 2, ring_shift);
rank_test!(ring_shift_local_3, Transport::Local, 3, ring_shift);
rank_test!(ring_shift_shm_2, Transport::Shm, 2, ring_shift);
rank_test!(ring_shift_shm_3, Transport::Shm, 3, ring_shift);
rank_test!(ring_shift_shm_4, Transport::Shm, 4, ring_shift);
rank_test!(ring_shift_tcp_2, Transport::Tcp, 2, ring_shift);
rank_test!(ring_shift_tcp_3, Transport::Tcp, 3, ring_shift);
rank_test!(ring_shift_tcp_4, Transport::Tcp, 4, ring_shift);

/// Tags, order, any source, empty messages, sends to oneself.
fn matching(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    // Rank 0 receives tag 2 before tag 1 although rank 1 sent tag 1 first;
    // three messages of tag 3 arrive in the order they were sent.
    if r == 1 {
        let a = c.send_tagged_async(message(1, 300_000), 0, 1);
        let b = c.send_tagged_async(message(2, 5_000), 0, 2);
        let cs: Vec<_> = (0..3)
            .map(|k| c.send_tagged_async(vec![k as u8; 10 + k], 0, 3))
            .collect();
        a.wait().expect("tag 1");
        b.wait().expect("tag 2");
        for w in cs {
            w.wait().expect("tag 3");
        }
    } else if r == 0 {
        let mut two = vec![0u8; 5_000];
        c.recv_tagged(&mut two, 1, 2).expect("tag 2");
        check_from(&two, 2);
        let mut one = vec![0u8; 300_000];
        c.recv_tagged(&mut one, 1, 1).expect("tag 1");
        check_from(&one, 1);
        for k in 0..3 {
            let mut b = vec![9u8; 64];
            let s = c.recv_from(&mut b, Some(1), 3).expect("tag 3");
            assert_eq!(s.bytes, 10 + k, "tag-3 messages out of order");
            assert!(b[..s.bytes].iter().all(|&x| x as usize == k));
            assert!(
                b[s.bytes..].iter().all(|&x| x == 9),
                "written past the message"
            );
        }
    }
    c.barrier().expect("barrier");

    // Any source: every other rank sends its rank to rank 0, which learns
    // who sent each message.
    if r == 0 {
        let mut seen = vec![false; n];
        for _ in 1..n {
            let mut b = [0u32; 4];
            let s = c.recv_from(&mut b, None, 5).expect("any source");
            assert_eq!(s.bytes, 4 * (s.source + 1).min(4));
            assert_eq!(b[0] as usize, s.source);
            assert!(!seen[s.source], "rank {} twice", s.source);
            seen[s.source] = true;
        }
    } else {
        let v = vec![r as u32; (r + 1).min(4)];
        c.send_tagged(&v, 0, 5).expect("send to 0");
    }

    // Empty messages, and a message to oneself (in a batch with its receive).
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    c.batch_isend_irecv(vec![
        P2pOp::send::<f32>(&[], next, 9),
        P2pOp::recv::<f32>(&mut [], prev, 9),
    ])
    .expect("empty messages");
    let mine = [r as f64; 3];
    let mut back = [0f64; 3];
    c.batch_isend_irecv(vec![P2pOp::recv(&mut back, r, 4), P2pOp::send(&mine, r, 4)])
        .expect("to oneself");
    assert_eq!(back, mine);
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(matching_local_3, Transport::Local, 3, matching);
rank_test!(matching_shm_4, Transport::Shm, 4, matching);
rank_test!(matching_tcp_3, Transport::Tcp, 3, matching);

/// Sends and receives do not wait behind collectives: rank 0 posts a
/// receive, then runs an AllReduce, then waits; rank 1 runs the AllReduce
/// first and sends after it; meanwhile rank 1 has a large send to rank 0
/// in flight across the AllReduce, which rank 0 receives after it.
fn beside_collectives(c: &Communicator, _: &Ctx) {
    let r = c.rank();
    let mut x = vec![1.0f32; 1 << 16];
    if r == 0 {
        let w = c.recv_async(vec![0u8; 1 << 20], 1);
        c.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce");
        check_from(&w.wait().expect("recv before the collective"), 1);
        let mut big = vec![0u8; 8 << 20];
        c.recv_tagged(&mut big, 1, 1)
            .expect("recv after the collective");
        check_from(&big, 3);
    } else if r == 1 {
        let w = c.send_tagged_async(message(3, 8 << 20), 0, 1);
        c.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce");
        c.send(&message(1, 1 << 20), 0)
            .expect("send after the collective");
        w.wait().expect("send across the collective");
    } else {
        c.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce");
    }
    assert!(x.iter().all(|&v| v == c.size() as f32));
}

rank_test!(
    beside_collectives_local_3,
    Transport::Local,
    3,
    beside_collectives
);
rank_test!(
    beside_collectives_shm_2,
    Transport::Shm,
    2,
    beside_collectives
);
rank_test!(
    beside_collectives_tcp_2,
    Transport::Tcp,
    2,
    beside_collectives
);

/// A receive too small for its message fails with `SizeMismatch` naming
/// both sizes, the peer and the tag; nothing is written; the next messages
/// and collectives work. A rendezvous send (over `EAGER_BYTES`) fails too; an
/// eager one has completed once it left (as in MPI), and its receiver
/// alone reports the mismatch.
fn too_small(c: &Communicator, _: &Ctx) {
    const BIG_MSG: usize = EAGER_BYTES + 20_000;
    const BIG_BUF: usize = EAGER_BYTES + 17_000;
    let r = c.rank();
    if r == 0 {
        // Rendezvous: both sides fail.
        let e = c.send_tagged(&message(0, BIG_MSG), 1, 3).unwrap_err();
        match e {
            Error::SizeMismatch {
                rank: 0,
                peer: 1,
                tag: 3,
                message: BIG_MSG,
                buffer: BIG_BUF,
            } => {}
            e => panic!("sender: {e}"),
        }
        // Eager: the send completes; the receive fails.
        c.send_tagged(&message(0, 1000), 1, 3)
            .expect("an eager send completes once it has left");
        // An exact receive of another length fails too.
        c.send(&[1u8; 10], 1).expect("an eager send");
        let e = c.send(&vec![1u8; BIG_MSG], 1).unwrap_err();
        assert!(
            matches!(
                e,
                Error::SizeMismatch {
                    message: BIG_MSG,
                    buffer: BIG_BUF,
                    ..
                }
            ),
            "{e}"
        );
        c.send(&message(0, 600), 1).expect("the next message");
    } else if r == 1 {
        let mut big = vec![7u8; BIG_BUF];
        let e = c.recv_from(&mut big, Some(0), 3).unwrap_err();
        assert!(
            matches!(
                e,
                Error::SizeMismatch {
                    rank: 1,
                    peer: 0,
                    tag: 3,
                    message: BIG_MSG,
                    buffer: BIG_BUF
                }
            ),
            "{e}"
        );
        assert!(
            big.iter().all(|&x| x == 7),
            "the receive buffer was written"
        );
        let mut b = vec![7u8; 600];
        let e = c.recv_from(&mut b, Some(0), 3).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e,
                Error::SizeMismatch {
                    rank: 1,
                    peer: 0,
                    tag: 3,
                    message: 1000,
                    buffer: 600
                }
            ),
            "{text}"
        );
        assert!(
            text.contains("1000") && text.contains("600") && text.contains("tag 3"),
            "{text}"
        );
        assert!(b.iter().all(|&x| x == 7), "the receive buffer was written");
        let mut twelve = [0u8; 12];
        let e = c.recv(&mut twelve, 0).unwrap_err();
        assert!(
            matches!(
                e,
                Error::SizeMismatch {
                    message: 10,
                    buffer: 12,
                    ..
                }
            ),
            "{e}"
        );
        assert!(c.recv(&mut big, 0).is_err());
        c.recv(&mut b, 0).expect("the next message");
        check_from(&b, 0);
    }
    let mut x = [1u64; 3];
    c.all_reduce(&mut x, ReduceOp::Sum)
        .expect("a collective after");
    assert_eq!(x, [c.size() as u64; 3]);
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(too_small_local_2, Transport::Local, 2, too_small);
rank_test!(too_small_shm_2, Transport::Shm, 2, too_small);
rank_test!(too_small_tcp_2, Transport::Tcp, 2, too_small);

/// Bad peers are argument errors; a receive nobody sends to times out,
/// naming the peer and the tag, and the communicator stays usable.
#[test]
fn bad_input_and_deadlines() {
    common::solo("bad_input_and_deadlines", &[("TUTTI_TIMEOUT", "1")], || {
        common::threads(2, |c, _| {
            let e = c.send(&[1u8], 2).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            assert!(e.to_string().contains("peer 2"), "{e}");
            let e = c.recv(&mut [0u8], 5).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            let peer = 1 - c.rank();
            let e = c.recv_tagged(&mut [0u8; 4], peer, 42).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, Error::Timeout { .. }), "{text}");
            assert!(
                text.contains(&format!("rank {peer}")) && text.contains("tag 42"),
                "{text}"
            );
            c.barrier().expect("barrier");
            let mut b = [0u8; 4];
            let w = c.send_async(vec![c.rank() as u8; 4], peer);
            c.recv(&mut b, peer).expect("after a timeout");
            w.wait().expect("send after a timeout");
            assert_eq!(b, [peer as u8; 4]);
        });
    });
}

/// A peer that dies while a receive from it is posted: the receive fails
/// with `PeerLost` naming it, well before the deadline.
fn peer_dies(c: &Communicator, ctx: &Ctx) {
    if c.rank() == 1 {
        ctx.wait_mark("posted");
        std::process::exit(0);
    }
    let w = c.recv_async(vec![0u8; 1 << 20], 1);
    ctx.mark("posted");
    let t = std::time::Instant::now();
    let e = w.wait().unwrap_err();
    assert!(matches!(e, Error::PeerLost { peer: 1, .. }), "{e}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );
}

rank_test!(
    peer_dies_shm_2,
    Transport::Shm,
    2,
    &[("TUTTI_TIMEOUT", "60")],
    peer_dies
);
rank_test!(
    peer_dies_tcp_2,
    Transport::Tcp,
    2,
    &[("TUTTI_TIMEOUT", "60")],
    peer_dies
);

// The eager path (messages of at most 128 KiB travel before their receive
// is posted, within 256 KiB of credit per ordered pair) must keep every
// promise above: order per (peer, tag) across eager and rendezvous
// messages, no hang when credit runs out or both sides send first, and
// errors that name a dead peer.

/// Sizes on both sides of the eager limit, and far past it.
const SIZES: [usize; 9] = [
    1,
    8,
    1000,
    16384,
    EAGER_BYTES - 1,
    EAGER_BYTES,
    EAGER_BYTES + 1,
    300_000,
    0,
];

/// Eager and rendezvous messages interleaved on two tags: rank 1 sends
/// every size on tag 1 and tag 2 alternately, before rank 0 posts any
/// receive; rank 0 takes all of tag 2 first, then tag 1, each in the
/// order sent (told apart by length and content).
fn eager_order(c: &Communicator, _: &Ctx) {
    let r = c.rank();
    if r == 1 {
        let mut ws = Vec::new();
        for (k, &len) in SIZES.iter().enumerate() {
            for tag in [1u32, 2] {
                let salt = 100 * tag as usize + k;
                ws.push(c.send_tagged_async(message(salt, len), 0, tag));
            }
        }
        c.barrier().expect("barrier");
        for w in ws {
            w.wait().expect("send");
        }
    } else if r == 0 {
        c.barrier().expect("barrier");
        for tag in [2u32, 1] {
            for (k, &len) in SIZES.iter().enumerate() {
                let mut b = vec![0u8; 300_000];
                let s = c.recv_from(&mut b, Some(1), tag).expect("recv");
                assert_eq!(s.bytes, len, "tag {tag}: message {k} out of order");
                check_from(&b[..len], 100 * tag as usize + k);
            }
        }
    } else {
        c.barrier().expect("barrier");
    }
    // The same tag, eager and rendezvous alternating, receives posted first.
    if r == 0 {
        let ws: Vec<_> = SIZES
            .iter()
            .map(|&len| c.recv_tagged_async(vec![0u8; len], 1, 7))
            .collect();
        c.barrier().expect("barrier");
        for (k, w) in ws.into_iter().enumerate() {
            check_from(&w.wait().expect("recv"), 50 + k);
        }
    } else {
        c.barrier().expect("barrier");
        if r == 1 {
            for (k, &len) in SIZES.iter().enumerate() {
                c.send_tagged(&message(50 + k, len), 0, 7).expect("send");
            }
        }
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(eager_order_local_2, Transport::Local, 2, eager_order);
rank_test!(eager_order_shm_2, Transport::Shm, 2, eager_order);
rank_test!(eager_order_shm_3, Transport::Shm, 3, eager_order);
rank_test!(eager_order_tcp_2, Transport::Tcp, 2, eager_order);

/// More eager messages than the credit holds (200 x 8 KiB = 1.6 MiB
/// against 256 KiB), sent both ways before either side receives: those
/// past the credit wait for their receives, and every byte arrives in
/// order.
fn credit_exhaustion(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let peer = (r + 1) % n;
    let from = (r + n - 1) % n;
    const COUNT: usize = 200;
    const LEN: usize = 8 << 10;
    let ws: Vec<_> = (0..COUNT)
        .map(|k| c.send_async(message(r * 1000 + k, LEN), peer))
        .collect();
    c.barrier().expect("barrier");
    let mut b = vec![0u8; LEN];
    for k in 0..COUNT {
        c.recv(&mut b, from).expect("recv");
        check_from(&b, from * 1000 + k);
    }
    for w in ws {
        w.wait().expect("send");
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(
    credit_exhaustion_local_2,
    Transport::Local,
    2,
    credit_exhaustion
);
rank_test!(
    credit_exhaustion_shm_2,
    Transport::Shm,
    2,
    credit_exhaustion
);
rank_test!(
    credit_exhaustion_shm_3,
    Transport::Shm,
    3,
    credit_exhaustion
);
rank_test!(
    credit_exhaustion_tcp_2,
    Transport::Tcp,
    2,
    credit_exhaustion
);

/// Every rank sends to the next, then receives from the previous, then
/// waits for its send, for sizes across the eager limit: no size hangs.
/// Then (even rank counts) blocking calls, even ranks sending first.
fn both_send_first(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for (k, &len) in SIZES.iter().enumerate() {
        let w = c.send_async(message(r + 10 * k, len), next);
        let mut b = vec![0u8; len];
        c.recv(&mut b, prev).expect("recv");
        check_from(&b, prev + 10 * k);
        w.wait().expect("send");
        if n % 2 == 0 {
            let out = message(r + 7, len);
            let mut inp = vec![0u8; len];
            if r % 2 == 0 {
                c.send(&out, next).expect("blocking send");
                c.recv(&mut inp, prev).expect("blocking recv");
            } else {
                c.recv(&mut inp, prev).expect("blocking recv");
                c.send(&out, next).expect("blocking send");
            }
            check_from(&inp, prev + 7);
        }
    }
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(
    both_send_first_local_2,
    Transport::Local,
    2,
    both_send_first
);
rank_test!(both_send_first_shm_2, Transport::Shm, 2, both_send_first);
rank_test!(both_send_first_shm_4, Transport::Shm, 4, both_send_first);
rank_test!(both_send_first_tcp_2, Transport::Tcp, 2, both_send_first);
rank_test!(both_send_first_tcp_3, Transport::Tcp, 3, both_send_first);

/// A random plan of messages between every pair (seeded, the same on every
/// rank): tags 0-2, sizes across the eager limit. Each rank posts its
/// sends and receives in a random order of its own (keeping each (peer,
/// tag) stream's order), some blocking, some not, and checks every message
/// against the plan.
fn random_plan(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    let mut next = plan_rng(0x7e57_u64);
    const LENS: [usize; 8] = [
        0,
        3,
        64,
        4096,
        40_000,
        EAGER_BYTES,
        EAGER_BYTES + 1,
        200_000,
    ];
    // (src, dst, tag, len, salt): salt numbers the message in the plan.
    let plan: Vec<(usize, usize, u32, usize, usize)> = (0..40 * n)
        .filter_map(|k| {
            let (src, dst) = ((next() % n as u64) as usize, (next() % n as u64) as usize);
            let tag = (next() % 3) as u32;
            let len = LENS[(next() % LENS.len() as u64) as usize];
            (src != dst).then_some((src, dst, tag, len, k))
        })
        .collect();
    // This rank's ops, each stream in plan order, then shuffled across
    // streams: an op may go before another only if they are of different
    // streams.
    let mine = plan
        .iter()
        .enumerate()
        .filter(|(_, m)| m.0 == r || m.1 == r)
        .map(|(i, m)| (m.0 == r, i));
    // Per stream (direction, peer, tag) its ops in plan order; then,
    // repeatedly, the head of a random stream.
    let stream = |&(send, i): &(bool, usize)| {
        let m = plan[i];
        (send, if send { m.1 } else { m.0 }, m.2)
    };
    let mut heads: Vec<std::collections::VecDeque<(bool, usize)>> = Vec::new();
    for op in mine {
        match heads.iter_mut().find(|q| stream(&q[0]) == stream(&op)) {
            Some(q) => q.push_back(op),
            None => heads.push([op].into()),
        }
    }
    let mut local = common::data::mix64(r as u64 + 1);
    let mut order = Vec::new();
    while !heads.is_empty() {
        local = common::data::mix64(local);
        let i = (local % heads.len() as u64) as usize;
        order.push(heads[i].pop_front().expect("non-empty"));
        if heads[i].is_empty() {
            heads.swap_remove(i);
        }
    }
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for (send, i) in order {
        let (src, dst, tag, len, salt) = plan[i];
        if send {
            sends.push(c.send_tagged_async(message(salt, len), dst, tag));
        } else {
            recvs.push((salt, c.recv_tagged_async(vec![0u8; len], src, tag)));
        }
    }
    for (salt, w) in recvs {
        let got = w.wait().expect("recv");
        check_from(&got, salt);
    }
    for w in sends {
        w.wait().expect("send");
    }
    c.barrier().expect("barrier");
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(random_plan_local_4, Transport::Local, 4, random_plan);
rank_test!(random_plan_shm_3, Transport::Shm, 3, random_plan);
rank_test!(random_plan_shm_4, Transport::Shm, 4, random_plan);
rank_test!(random_plan_tcp_3, Transport::Tcp, 3, random_plan);

/// A peer that dies while messages to and from it are pending: a message
/// of its own waits unreceived here, and a receive from it and a
/// rendezvous send to it are posted; both fail with `PeerLost` naming it,
/// well before the deadline. An eager send posted then has completed
/// once it left (as in MPI), and a later one fails.
fn peer_dies_eager(c: &Communicator, ctx: &Ctx) {
    if c.rank() == 1 {
        c.send_tagged_async(message(1, 100), 0, 1)
            .wait()
            .expect("first");
        let pending = c.send_tagged_async(message(2, 100), 0, 3);
        ctx.wait_mark("posted");
        std::mem::forget(pending);
        std::process::exit(0);
    }
    let mut first = vec![0u8; 100];
    c.recv_tagged(&mut first, 1, 1)
        .expect("the message sent before dying");
    check_from(&first, 1);
    let eager = c.send_async(message(0, 4096), 1);
    let ws = c.send_async(message(0, EAGER_BYTES + 100_000), 1);
    let wr = c.recv_tagged_async(vec![0u8; 100], 1, 2);
    ctx.mark("posted");
    let t = std::time::Instant::now();
    eager
        .wait()
        .expect("an eager send completes once it has left");
    for e in [ws.wait().unwrap_err(), wr.wait().unwrap_err()] {
        assert!(matches!(e, Error::PeerLost { peer: 1, .. }), "{e}");
        assert!(e.to_string().contains("rank 1"), "{e}");
    }
    let e = c.send(&[1u8; 8], 1).unwrap_err();
    assert!(matches!(e, Error::PeerLost { peer: 1, .. }), "{e}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );
}

rank_test!(
    peer_dies_eager_shm_2,
    Transport::Shm,
    2,
    &[("TUTTI_TIMEOUT", "60")],
    peer_dies_eager
);
rank_test!(
    peer_dies_eager_tcp_2,
    Transport::Tcp,
    2,
    &[("TUTTI_TIMEOUT", "60")],
    peer_dies_eager
);

/// An eager send completes once its message has left, so its rank may
/// destroy its communicator (and exit) before the peer receives: the
/// messages still arrive (over TCP, closing the sockets at once would
/// fail the peer), the closing rank waiting until the peer has taken them.
fn send_then_close(ctx: &Ctx) {
    let comm = Communicator::from_env().expect("joining");
    let sizes = [1usize, 8, 1000, 16384, EAGER_BYTES];
    if comm.rank() == 0 {
        for (k, &len) in sizes.iter().enumerate() {
            comm.send_tagged(&message(k, len), 1, k as u32)
                .expect("an eager send completes once it has left");
        }
        ctx.mark("sent");
        drop(comm);
        return;
    }
    ctx.wait_mark("sent");
    std::thread::sleep(std::time::Duration::from_millis(300));
    for (k, &len) in sizes.iter().enumerate().rev() {
        let mut b = vec![0u8; len];
        comm.recv_tagged(&mut b, 0, k as u32)
            .expect("a message whose sender has closed");
        check_from(&b, k);
    }
}

/// Eager messages that the peer never receives: its communicator, closing,
/// gives their credit back, so the sender's close does not wait for them
/// until its deadline.
fn unreceived_then_close(ctx: &Ctx) {
    let comm = Communicator::from_env().expect("joining");
    if comm.rank() == 0 {
        for k in 0..3 {
            comm.send(&message(k, 100), 1).expect("eager send");
        }
    }
    comm.barrier().expect("barrier");
    let t = std::time::Instant::now();
    drop(comm);
    ctx.mark("closed");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "closing took {:?}",
        t.elapsed()
    );
}

#[test]
fn send_then_close_shm() {
    let name = common::test_name(module_path!(), "send_then_close_shm");
    common::procs_raw(&name, 2, Transport::Shm, &[], send_then_close);
}

/// With direct reads asked for from 1 KiB, eager messages still travel
/// through the ring: a direct read would need the receiver, which here
/// waits for the sender first, to run before the send completes.
#[test]
fn send_then_close_shm_direct() {
    let name = common::test_name(module_path!(), "send_then_close_shm_direct");
    let env = [("TUTTI_SHM_DIRECT_BYTES", "1K"), ("TUTTI_TIMEOUT", "60")];
    common::procs_raw(&name, 2, Transport::Shm, &env, send_then_close);
}

#[test]
fn send_then_close_tcp() {
    let name = common::test_name(module_path!(), "send_then_close_tcp");
    common::procs_raw(&name, 2, Transport::Tcp, &[], send_then_close);
}

#[test]
fn unreceived_then_close_shm() {
    let name = common::test_name(module_path!(), "unreceived_then_close_shm");
    let env = [("TUTTI_TIMEOUT", "60")];
    common::procs_raw(&name, 2, Transport::Shm, &env, unreceived_then_close);
}

#[test]
fn unreceived_then_close_tcp() {
    let name = common::test_name(module_path!(), "unreceived_then_close_tcp");
    let env = [("TUTTI_TIMEOUT", "60")];
    common::procs_raw(&name, 2, Transport::Tcp, &env, unreceived_then_close);
}

/// A rendezvous send whose deadline runs out before its receive is
/// posted; the receive, posted later and too small, fails with
/// `SizeMismatch` (its refusal reaches a sender that gave up, which is no
/// error), and the pair's link stays usable.
fn refused_after_timeout(c: &Communicator, ctx: &Ctx) {
    const LEN: usize = EAGER_BYTES + 20_000;
    if c.rank() == 0 {
        let data = message(0, LEN);
        let op = tutti::RawP2p {
            send: true,
            peer: Some(1),
            ptr: data.as_ptr().cast_mut(),
            len: LEN,
            tag: 5,
            exact: true,
        };
        // SAFETY: `data` outlives the wait below, and nothing writes it.
        let mut posted =
            unsafe { c.post_p2p_raw(&[op], Some(std::time::Duration::from_millis(200))) };
        let (w, _) = posted.pop().expect("one op");
        let e = w.wait().unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        ctx.mark("timed out");
        c.send(&message(0, 8), 1).expect("a send after");
    } else {
        ctx.wait_mark("timed out");
        let mut b = vec![0u8; EAGER_BYTES + 17_000];
        let e = c.recv_tagged(&mut b, 0, 5).unwrap_err();
        assert!(matches!(e, Error::SizeMismatch { message: LEN, .. }), "{e}");
        let mut b = vec![0u8; 8];
        c.recv(&mut b, 0).expect("a receive after");
        check_from(&b, 0);
    }
    c.barrier().expect("barrier");
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(
    refused_after_timeout_shm_2,
    Transport::Shm,
    2,
    refused_after_timeout
);
rank_test!(
    refused_after_timeout_tcp_2,
    Transport::Tcp,
    2,
    refused_after_timeout
);

/// Blocking exchanges of one send and one receive (the lean lane's
/// case), round after round, each round a shift by a random distance with
/// a random tag and length (empty, inside a frame, eager, rendezvous), and
/// around them what makes the lean lane give way to the usual path: a
/// message of another tag arriving first, a peer that is late (the
/// receiver's spin runs out), a send still pending, receives of at most
/// the buffer (`recv_from`), and a receive too long for its message;
/// then a ping-pong of lone blocking sends and receives. Every message is
/// checked; the communicator stays usable.
fn exchanges(c: &Communicator, _: &Ctx) {
    let (n, r) = (c.size(), c.rank());
    // The same plan on every rank.
    let mut next = plan_rng(0x1ea4_u64);
    const LENS: [usize; 12] = [
        0,
        1,
        8,
        100,
        1000,
        1024,
        1025,
        4096,
        40_000,
        EAGER_BYTES - 8,
        EAGER_BYTES,
        EAGER_BYTES + 1,
    ];
    for k in 0..300usize {
        let shift = 1 + (next() % (n as u64 - 1)) as usize;
        let tag = (next() % 2) as u32;
        let len = LENS[(next() % LENS.len() as u64) as usize];
        let event = next() % 8;
        let (dst, src) = ((r + shift) % n, (r + n - shift) % n);
        let out = message(k * n + r, len);
        let mut inp = vec![0u8; len];
        // 1: another tag first, received after the exchange.
        if event == 1 {
            c.send_tagged(&message(k, 5), dst, 7)
                .expect("the other tag");
        }
        // 2: this round's sender is late.
        if event == 2 && r == k % n {
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        // 3: a send still pending during the exchange.
        let pending = (event == 3).then(|| c.send_tagged_async(message(k, 9), dst, 8));
        let got = if event == 4 {
            // At most the buffer: a longer one, told how much came.
            let mut wide = vec![0u8; len + 16];
            let st = c
                .batch_isend_irecv(vec![
                    P2pOp::recv_from(&mut wide, Some(src), tag),
                    P2pOp::send(&out, dst, tag),
                ])
                .expect("exchange");
            let st = st[0].expect("a receive's status");
            assert_eq!((st.source, st.tag, st.bytes), (src, tag, len));
            wide.truncate(len);
            wide
        } else {
            let st = c
                .batch_isend_irecv(vec![
                    P2pOp::send(&out, dst, tag),
                    P2pOp::recv(&mut inp, src, tag),
                ])
                .expect("exchange");
            assert!(st[0].is_none());
            let st = st[1].expect("a receive's status");
            assert_eq!((st.source, st.tag, st.bytes), (src, tag, len));
            inp
        };
        check_from(&got, k * n + src);
        if let Some(w) = pending {
            w.wait().expect("pending send");
            let mut b = [0u8; 9];
            c.recv_tagged(&mut b, src, 8).expect("pending message");
            check_from(&b, k);
        }
        if event == 1 {
            let mut b = [0u8; 5];
            c.recv_tagged(&mut b, src, 7).expect("the other tag");
            check_from(&b, k);
        }
    }
    // Ping-pong of lone blocking sends and receives between the first and
    // the last rank (the lean lane takes a lone op too), with a message of
    // another tag ahead of some pings.
    let last = n - 1;
    for k in 0..200usize {
        let len = LENS[(next() % LENS.len() as u64) as usize];
        let tag = (next() % 3) as u32;
        let other = next().is_multiple_of(5);
        if r == 0 {
            if other {
                c.send_tagged(&message(k, 3), last, 9).expect("other tag");
            }
            c.send_tagged(&message(2 * k, len), last, tag)
                .expect("ping");
            let mut b = vec![0u8; len];
            c.recv_tagged(&mut b, last, tag).expect("pong");
            check_from(&b, 2 * k + 1);
        } else if r == last {
            let mut b = vec![0u8; len];
            c.recv_tagged(&mut b, 0, tag).expect("ping");
            check_from(&b, 2 * k);
            if other {
                let mut o = [0u8; 3];
                c.recv_tagged(&mut o, 0, 9).expect("other tag");
                check_from(&o, k);
            }
            c.send_tagged(&message(2 * k + 1, len), 0, tag)
                .expect("pong");
        }
    }
    // An exact receive two bytes too long for its message (inside its
    // frame, and with a payload of its own): it fails alone (the eager
    // send has completed), and both go on.
    for len in [10, 5000] {
        let out = message(r, len);
        let mut inp = vec![0u8; len + 2];
        let res = c.batch_isend_irecv(vec![
            P2pOp::send(&out, (r + 1) % n, 4),
            P2pOp::recv(&mut inp, (r + n - 1) % n, 4),
        ]);
        assert!(
            matches!(
                res,
                Err(Error::SizeMismatch { message, buffer, .. }) if message == len && buffer == len + 2
            ),
            "{res:?}"
        );
    }
    let mut x = [1u32; 2];
    c.all_reduce(&mut x, ReduceOp::Sum)
        .expect("a collective after");
    assert_eq!(x, [n as u32; 2]);
    assert_eq!(c.error().map(|e| e.to_string()), None);
}

rank_test!(exchanges_local_3, Transport::Local, 3, exchanges);
rank_test!(exchanges_shm_2, Transport::Shm, 2, exchanges);
rank_test!(exchanges_shm_4, Transport::Shm, 4, exchanges);
rank_test!(exchanges_tcp_3, Transport::Tcp, 3, exchanges);
