//! Online tuning (`tune::online`): on the first calls of each call shape
//! Auto tries the cost model's close candidates, then the ranks agree on
//! the fastest, and later review that decision (one more turn of the
//! candidates). Every rank must try the same algorithm on the same call
//! even where ranks call differently: one in place and another not, one
//! whose repeated calls could skip the tuner (the engine's repeat path for
//! mailbox calls) and one whose could not, asynchronous calls among
//! blocking ones. A rank that ran another algorithm than its peers would
//! fail with a mismatch or wait for its timeout; every result is checked.

mod common;

use common::{Ctx, Transport};
use tutti::algo::Collective;
use tutti::{Algorithm, Communicator, DataType, ReduceOp};

/// Rank r's value at element i of call k: small integers, exact in f32.
fn val(r: usize, i: usize, k: usize) -> f32 {
    ((r * 5 + i * 3 + k) % 11) as f32
}

/// The shapes tried: AllReduce of these counts, and ReduceScatter,
/// Broadcast (root 1) and AllGather of the last but one.
const COUNTS: [usize; 4] = [2, 2048, 16 << 10, 96 << 10];

/// What the ranks agree on after the calls: every shape's plan on every
/// rank, as twice its index into `Algorithm::ALL`, plus one where its
/// shared-memory sends stream.
fn plans(c: &Communicator, count: usize) -> Vec<f64> {
    let n = c.size();
    let mut shapes = vec![
        (Collective::ReduceScatter, count / n),
        (Collective::Broadcast { root: 1 % n }, count),
        (Collective::AllGather, count / n),
    ];
    shapes.extend(COUNTS.iter().map(|&k| (Collective::AllReduce, k)));
    shapes
        .into_iter()
        .map(|(coll, k)| {
            assert!(!c.is_tuning(coll, k, DataType::F32), "{coll:?} {k}");
            let plan = c.plan(coll, k, DataType::F32).unwrap();
            let a = Algorithm::ALL.iter().position(|&x| x == plan.algorithm);
            (2 * a.unwrap() + usize::from(plan.stream)) as f64
        })
        .collect()
}

/// Call `k` of an AllReduce of `send` into `recv`, made differently on each
/// rank: rank 0 with the same buffers every time (its calls repeat), rank 1
/// in place, out of place and asynchronously in turn, the others into
/// fresh buffers.
fn all_reduce_mixed(c: &Communicator, send: &[f32], recv: &mut Vec<f32>, k: usize) {
    match (c.rank(), k % 4) {
        (0, _) => c.all_reduce_into(send, recv, ReduceOp::Sum).unwrap(),
        (1, 0 | 2) => {
            recv.copy_from_slice(send);
            c.all_reduce(recv, ReduceOp::Sum).unwrap();
        }
        (1, 1) => {
            *recv = c
                .all_reduce_async(send.to_vec(), ReduceOp::Sum)
                .wait()
                .unwrap();
        }
        _ => {
            let mut fresh = vec![0f32; send.len()];
            c.all_reduce_into(send, &mut fresh, ReduceOp::Sum).unwrap();
            *recv = fresh;
        }
    }
}

/// Enough calls of each shape for online tuning to decide, made
/// differently on each rank (see the module comment); returns how many
/// shapes were still being tuned after their first call.
fn tune_calls(c: &Communicator) -> usize {
    let (n, r) = (c.size(), c.rank());
    let mut tuned = 0;
    for &count in &COUNTS {
        let calls = tutti::tune::online::max_calls(count * 4) + 3;
        let mut send = vec![0f32; count];
        let mut recv = vec![0f32; count];
        for k in 0..calls {
            for (i, x) in send.iter_mut().enumerate() {
                *x = val(r, i, k);
            }
            let want = |i: usize| (0..n).map(|q| val(q, i, k)).sum::<f32>();
            all_reduce_mixed(c, &send, &mut recv, k);
            for (i, v) in recv.iter().enumerate() {
                assert_eq!(*v, want(i), "count {count} call {k} rank {r} i {i}");
            }
            if k == 0 && c.is_tuning(Collective::AllReduce, count, DataType::F32) {
                tuned += 1;
            }
        }
    }
    // Three more collectives on the last but one size.
    let count = COUNTS[2];
    let calls = tutti::tune::online::max_calls(count * 4) + 3;
    let block = count / n;
    for k in 0..calls {
        let mine: Vec<f32> = (0..block * n).map(|i| val(r, i, k)).collect();
        let mut out = vec![0f32; block];
        c.reduce_scatter(&mine, &mut out, ReduceOp::Sum).unwrap();
        for (i, v) in out.iter().enumerate() {
            let want = (0..n).map(|q| val(q, r * block + i, k)).sum::<f32>();
            assert_eq!(*v, want, "reduce_scatter call {k} rank {r} i {i}");
        }
        let root = 1 % n;
        let mut b = if r == root {
            (0..count).map(|i| val(r, i, k)).collect()
        } else {
            vec![0f32; count]
        };
        c.broadcast(&mut b, root).unwrap();
        assert!(b.iter().enumerate().all(|(i, &v)| v == val(root, i, k)));
        let mut g = vec![0f32; block * n];
        c.all_gather(&mine[..block], &mut g).unwrap();
        for (j, v) in g.iter().enumerate() {
            assert_eq!(*v, val(j / block, j % block, k), "all_gather call {k}");
        }
    }
    tuned
}

/// Checks that every rank has the same `mine`.
fn same_everywhere(c: &Communicator, mine: &[f64]) {
    let mut all = vec![0f64; mine.len() * c.size()];
    c.all_gather(mine, &mut all).unwrap();
    for (q, theirs) in all.chunks(mine.len()).enumerate() {
        assert_eq!(theirs, mine, "rank {q} against rank {}", c.rank());
    }
}

/// The calls above, then a check that every rank decided alike.
fn agree(c: &Communicator) {
    let tuned = tune_calls(c);
    // At least one shape had candidates to try: online tuning ran.
    assert!(tuned > 0, "no shape was tuned");
    same_everywhere(c, &plans(c, COUNTS[2]));
}

#[test]
fn online_tuning_agrees_threads() {
    for n in [2, 3, 4] {
        common::threads(n, |c, _: &Ctx| agree(c));
    }
}

#[test]
fn online_tuning_agrees_shm_4() {
    common::procs(
        "online_tuning_agrees_shm_4",
        4,
        Transport::Shm,
        &[],
        |c, _: &Ctx| agree(c),
    );
}

/// Two processes, a core each: shapes of 16 KiB and more also try their
/// pick with streaming ring stores (`tune::STREAM_MIN_BYTES`).
#[test]
fn online_tuning_agrees_shm_2() {
    common::procs(
        "online_tuning_agrees_shm_2",
        2,
        Transport::Shm,
        &[],
        |c, _: &Ctx| agree(c),
    );
}

/// Enough AllToAll and Scatter calls with blocks of `tune::CMA_TWIN_BYTES`,
/// and Broadcasts of `tune::BCAST_CMA_BYTES`, for online tuning to decide, every result checked (the direct-read twin's trial
/// calls among them); then a check that the twin was among the candidates
/// exactly where it may be (`allowed`, ranks outnumbering the host's CPUs,
/// as on CI's 2, and a host that lets them read each other's memory) and
/// that every rank decided alike.
fn cma_twin(c: &Communicator, allowed: bool) {
    let (n, r) = (c.size(), c.rank());
    let block = tutti::tune::CMA_TWIN_BYTES / 4;
    let calls = tutti::tune::online::max_calls(block * 4) + 3;
    let mut send = vec![0f32; block * n];
    let mut recv = vec![0f32; block * n];
    for k in 0..calls {
        for (i, x) in send.iter_mut().enumerate() {
            *x = val(r, i, k);
        }
        c.all_to_all(&send, &mut recv).unwrap();
        // Block q of what rank r receives is block r of what rank q sends.
        for (j, v) in recv.iter().enumerate() {
            let (q, i) = (j / block, j % block);
            assert_eq!(
                *v,
                val(q, r * block + i, k),
                "call {k} rank {r} from {q} i {i}"
            );
        }
    }
    // Scatter from rank 1: rank r receives block r of the root's buffer.
    let root = 1;
    let scatter = Collective::Scatter { root };
    for k in 0..calls {
        let all: Vec<f32> = (0..block * n).map(|i| val(root, i, k)).collect();
        let mut mine = vec![0f32; block];
        c.scatter(&all, &mut mine, root).unwrap();
        for (i, v) in mine.iter().enumerate() {
            assert_eq!(
                *v,
                val(root, r * block + i, k),
                "scatter call {k} rank {r} i {i}"
            );
        }
    }
    // Broadcast from rank 2 of BCAST_CMA_BYTES, in place on the root: its
    // direct-read candidate (the direct schedule) reads the root's buffer.
    let root = 2 % n;
    let bcast = Collective::Broadcast { root };
    let count = tutti::tune::BCAST_CMA_BYTES / 4;
    let bcalls = tutti::tune::online::max_calls(count * 4) + 3;
    let mut buf = vec![0f32; count];
    for k in 0..bcalls {
        for (i, x) in buf.iter_mut().enumerate() {
            *x = if r == root { val(root, i, k) } else { -1.0 };
        }
        c.broadcast(&mut buf, root).unwrap();
        for (i, v) in buf.iter().enumerate() {
            assert_eq!(*v, val(root, i, k), "broadcast call {k} rank {r} i {i}");
        }
    }
    let host = &c.topology().hosts[0];
    // The test's processes run as one user in one PID namespace: they can
    // read each other's memory wherever Yama lets siblings do so.
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    let open = scope.as_deref().is_none_or(|s| s.trim() == "0");
    assert_eq!(host.cma, open, "ptrace_scope {scope:?}, host {host:?}");
    let want = allowed && host.cma && host.cpus < host.ranks.len();
    let mut plans = Vec::new();
    for (coll, k) in [
        (Collective::AllToAll, block),
        (scatter, block),
        (bcast, count),
    ] {
        assert!(!c.is_tuning(coll, k, DataType::F32));
        let cands = c.tuning_candidates(coll, k, DataType::F32);
        assert_eq!(
            cands.iter().filter(|x| x.cma).count(),
            usize::from(want),
            "{coll:?}: {cands:?}, host {host:?}"
        );
        if coll == bcast && want {
            assert!(
                cands
                    .iter()
                    .any(|x| x.cma && x.algorithm == Algorithm::Direct),
                "{cands:?}"
            );
        }
        let plan = c.plan(coll, k, DataType::F32).unwrap();
        let a = Algorithm::ALL.iter().position(|&x| x == plan.algorithm);
        plans.extend([a.unwrap() as f64, f64::from(u8::from(plan.cma))]);
    }
    same_everywhere(c, &plans);
}

#[test]
fn online_cma_twin_shm_4() {
    common::procs(
        "online_cma_twin_shm_4",
        4,
        Transport::Shm,
        &[],
        |c, _: &Ctx| cma_twin(c, true),
    );
}

/// `TUTTI_SHM_DIRECT_BYTES=off` leaves the direct-read twin out.
#[test]
fn online_cma_twin_off_shm_4() {
    common::procs(
        "online_cma_twin_off_shm_4",
        4,
        Transport::Shm,
        &[("TUTTI_SHM_DIRECT_BYTES", "off")],
        |c, _: &Ctx| cma_twin(c, false),
    );
}

#[test]
fn online_tuning_agrees_tcp_3() {
    common::procs(
        "online_tuning_agrees_tcp_3",
        3,
        Transport::Tcp,
        &[],
        |c, _: &Ctx| agree(c),
    );
}

/// The first of `COUNTS` whose AllReduce has candidates to try (the same
/// on every rank), after one call of each until then.
fn tuned_count(c: &Communicator) -> usize {
    COUNTS
        .into_iter()
        .find(|&count| {
            let mut x = vec![0f32; count];
            c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            c.is_tuning(Collective::AllReduce, count, DataType::F32)
        })
        .expect("a tuned shape")
}

/// Calls of `count` elements by which online tuning has reviewed its
/// decision twice: the first decision, 16 turns' span, a review, 32 turns'
/// span, a review (`MAX_CANDIDATES` algorithms and the streaming twin at
/// most), twice over; where ranks share cores, either gap may be up to
/// `REVIEW_FLOOR_MAX` spans (at least 50 ms of calls between reviews).
fn review_bound(count: usize) -> usize {
    use tutti::tune::online::{trials, MAX_CANDIDATES, REVIEW_FLOOR_MAX};
    let (lead, per) = trials(count * 4);
    let gap = |g: usize| g.max(REVIEW_FLOOR_MAX as usize);
    2 * (lead + per) * (1 + (MAX_CANDIDATES + 1) * (3 + 1 + gap(16) + 1 + gap(32)))
}

/// Calls of one tuned AllReduce shape, made differently on each rank as in
/// `tune_calls`, until online tuning has reviewed its decision twice; every
/// result checked. Returns the reviews and the plan (as an index into
/// `Algorithm::ALL`) after each call where the reviews went up.
fn review_calls(c: &Communicator) -> Vec<f64> {
    let (n, r) = (c.size(), c.rank());
    let count = tuned_count(c);
    let shape = (Collective::AllReduce, count, DataType::F32);
    let bound = review_bound(count);
    let mut seen = Vec::new();
    let (mut send, mut recv) = (vec![0f32; count], vec![0f32; count]);
    for k in 0..bound {
        for (i, x) in send.iter_mut().enumerate() {
            *x = val(r, i, k);
        }
        all_reduce_mixed(c, &send, &mut recv, k);
        for (i, v) in recv.iter().enumerate() {
            let want = (0..n).map(|q| val(q, i, k)).sum::<f32>();
            assert_eq!(*v, want, "count {count} call {k} rank {r} i {i}");
        }
        let reviews = c.tuning_reviews(shape.0, shape.1, shape.2);
        if reviews > seen.len() / 2 {
            let a = c.plan(shape.0, shape.1, shape.2).unwrap().algorithm;
            seen.push(k as f64);
            seen.push(Algorithm::ALL.iter().position(|&x| x == a).unwrap() as f64);
            if reviews == 2 {
                return seen;
            }
        }
    }
    panic!(
        "rank {r}: {} reviews in {bound} calls of {count}",
        seen.len() / 2
    );
}

/// Reviews happen at the same call on every rank, with the same outcome.
fn reviews_agree(c: &Communicator) {
    same_everywhere(c, &review_calls(c));
}

#[test]
fn online_reviews_agree_threads() {
    common::threads(3, |c, _: &Ctx| reviews_agree(c));
}

#[test]
fn online_reviews_agree_shm_4() {
    common::procs(
        "online_reviews_agree_shm_4",
        4,
        Transport::Shm,
        &[],
        |c, _: &Ctx| reviews_agree(c),
    );
}

/// The first review's gap (in turns' spans) for `c`.
fn first_review_gap(c: &Communicator) -> usize {
    tutti::tune::online::review_gaps(c.topology().cpu_share(), false).0 as usize
}

/// The first of `counts` whose AllReduce online tuning tries candidates
/// for (one call of each until then), called until it has decided; returns
/// the count and its calls so far: the first stretch, a warm-up block then
/// `TURNS` turns of a block per candidate.
fn decided(c: &Communicator, mut counts: impl Iterator<Item = usize>) -> (usize, usize) {
    let count = counts
        .find(|&count| {
            let mut x = vec![0f32; count];
            c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            c.is_tuning(Collective::AllReduce, count, DataType::F32)
        })
        .expect("a tuned shape");
    let mut x = vec![1f32; count];
    let mut first = 1;
    while c.is_tuning(Collective::AllReduce, count, DataType::F32) {
        c.all_reduce(&mut x, ReduceOp::Max).unwrap();
        first += 1;
    }
    assert_eq!(x, vec![1f32; count]);
    (count, first)
}

/// Reviews are due by Auto's calls: calls that force an algorithm, here
/// eight after each Auto call, do not bring them sooner (they did when
/// every collective counted: a review's turn then came every two turns'
/// worth of Auto's calls, not every 17).
#[test]
fn forced_calls_do_not_bring_reviews_sooner() {
    use tutti::tune::online::{trials, TURNS, WATCH_MIN_BYTES};
    common::threads(2, |c, _: &Ctx| {
        let gap = first_review_gap(c);
        // A shape too small to be watched (a watch brings reviews forward
        // where the pick's time moves, as it may with the calls between).
        let counts = [2048, 4096, 8192, 12 << 10, 15 << 10];
        let (count, first) = decided(c, counts.into_iter().filter(|&k| k * 4 < WATCH_MIN_BYTES));
        let shape = (Collective::AllReduce, count, DataType::F32);
        let mut x = vec![1f32; count];
        let (lead, per) = trials(count * 4);
        let span = (first - (lead + per)) / TURNS;
        assert!(span >= 2 * (lead + per), "{first} calls, {span} a turn");
        let forced = tutti::Options {
            algorithm: Some(Algorithm::Ring),
            timeout: None,
            wire: None,
        };
        let mut auto = 0;
        while c.tuning_reviews(shape.0, shape.1, shape.2) == 0 {
            assert!(auto < 40 * span, "no review in {auto} calls");
            c.all_reduce(&mut x, ReduceOp::Max).unwrap();
            auto += 1;
            for _ in 0..8 {
                c.all_reduce_with(&mut x, ReduceOp::Max, &forced).unwrap();
            }
        }
        assert_eq!(x, vec![1f32; count]);
        // Due after `gap` turns' span of Auto's calls, then one turn.
        assert!(
            auto >= gap * span,
            "the review ended after {auto} Auto calls, a turn {span}, count {count}"
        );
        // (The engine's span counts the first stretch's warm-up block too.)
        let most = (gap + 2) * first.div_ceil(TURNS);
        assert!(auto <= most, "{auto} Auto calls, at most {most}");
    });
}

/// Between reviews the pick's calls are timed in windows; two windows in a
/// row whose mean moved by more than a quarter from the pick's trial time
/// bring the review forward. Here a peer that comes late to every call
/// (rank 1 sleeps before each) moves it: the review follows within a few
/// windows' calls, not the 16 turns' span it is otherwise due after (where
/// each rank has a core), and one more turn follows it at once.
fn moved_pick_reviewed(c: &Communicator) {
    use tutti::tune::online::{trials, watch_window, TURNS, WATCH_MIN_BYTES};
    let gap = first_review_gap(c);
    let (count, first) = decided(c, COUNTS.into_iter().filter(|&k| k * 4 >= WATCH_MIN_BYTES));
    let shape = (Collective::AllReduce, count, DataType::F32);
    let mut x = vec![1f32; count];
    let (lead, per) = trials(count * 4);
    let span = (first - (lead + per)) / TURNS;
    let us = c.plan(shape.0, shape.1, shape.2).unwrap().us;
    let window = watch_window(count * 4, us, c.topology().cpu_share());
    // A window of the pick's calls as they run (its baseline is the
    // decision's time).
    let t = std::time::Instant::now();
    for _ in 0..window {
        c.all_reduce(&mut x, ReduceOp::Max).unwrap();
    }
    assert_eq!(c.tuning_reviews(shape.0, shape.1, shape.2), 0);
    // Rank 1 comes late by several times either: every rank's calls
    // slow down (rank 0's wait), far beyond a quarter.
    let mut late = [t.elapsed().as_secs_f64() / window as f64 * 1e6];
    late[0] = late[0].max(c.plan(shape.0, shape.1, shape.2).unwrap().us);
    c.all_reduce(&mut late, ReduceOp::Max).unwrap();
    let late = std::time::Duration::from_micros((4.0 * late[0]) as u64 + 100);
    let mut calls = 0;
    while c.tuning_reviews(shape.0, shape.1, shape.2) == 0 {
        assert!(
            calls < 2 * window + 2 * span,
            "no review in {calls} calls (a window {window}, a turn {span})"
        );
        if c.rank() == 1 {
            std::thread::sleep(late);
        }
        c.all_reduce(&mut x, ReduceOp::Max).unwrap();
        calls += 1;
    }
    assert_eq!(x, vec![1f32; count]);
    assert!(gap < 16 || 2 * window + 2 * span < gap * span);
    // That review decided on its own turn alone (the turns before ran
    // before the change) and is unsettled: one more turn follows at once,
    // a second review a turn's span later.
    let mut more = 0;
    while c.tuning_reviews(shape.0, shape.1, shape.2) == 1 {
        assert!(more < span, "no follow-up in {more} calls (a turn {span})");
        c.all_reduce(&mut x, ReduceOp::Max).unwrap();
        more += 1;
    }
    assert_eq!(more, span);
    assert_eq!(c.tuning_reviews(shape.0, shape.1, shape.2), 2);
    // The calls after it run on (the AllReduce that agreed on the
    // window's mean is not a call to repeat).
    for _ in 0..8 {
        c.all_reduce(&mut x, ReduceOp::Max).unwrap();
    }
    assert_eq!(x, vec![1f32; count]);
}

#[test]
fn a_moved_pick_is_reviewed_soon_threads() {
    common::threads(2, |c, _: &Ctx| moved_pick_reviewed(c));
}

#[test]
fn a_moved_pick_is_reviewed_soon_shm_2() {
    common::procs(
        "a_moved_pick_is_reviewed_soon_shm_2",
        2,
        Transport::Shm,
        &[],
        |c, _: &Ctx| moved_pick_reviewed(c),
    );
}

#[test]
fn tune_once_does_not_review() {
    common::procs(
        "tune_once_does_not_review",
        2,
        Transport::Shm,
        &[("TUTTI_TUNE", "once")],
        |c, _: &Ctx| {
            // The calls by which online tuning reviews twice.
            let count = tuned_count(c);
            let mut x = vec![1f32; count];
            for _ in 0..review_bound(count) {
                c.all_reduce(&mut x, ReduceOp::Max).unwrap();
            }
            assert_eq!(x, vec![1f32; count]);
            assert!(!c.is_tuning(Collective::AllReduce, count, DataType::F32));
            assert_eq!(
                c.tuning_reviews(Collective::AllReduce, count, DataType::F32),
                0
            );
        },
    );
}

#[test]
fn tune_model_does_not_try() {
    common::procs(
        "tune_model_does_not_try",
        2,
        Transport::Shm,
        &[("TUTTI_TUNE", "model")],
        |c, _: &Ctx| {
            assert_eq!(tune_calls(c), 0);
            // The plan is the cost model's.
            let p = c
                .plan(Collective::AllReduce, COUNTS[2], DataType::F32)
                .unwrap();
            assert!(p.us.is_finite());
        },
    );
}
