//! The verifier's own tests and the matrix every algorithm must pass.

use super::*;
use crate::algo::{CollKind, Level, Levels, VCounts};
use proptest::prelude::*;

/// Every collective with a count, with roots 0, n/2 and n-1.
fn colls(n: usize) -> Vec<Collective> {
    let mut v = vec![
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Barrier,
    ];
    let mut roots = vec![0, n / 2, n - 1];
    roots.dedup();
    for root in roots {
        v.push(Collective::Broadcast { root });
        v.push(Collective::Reduce { root });
        v.push(Collective::Gather { root });
        v.push(Collective::Scatter { root });
    }
    v
}

/// The collectives whose Input can lie in their Output ([`Problem::in_place`]).
fn runs_in_place(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllReduce | Collective::AllGather | Collective::Broadcast { .. }
    )
}

/// The ways to run `coll`, as `(in_place, avg)`: in place where it can
/// be ([`runs_in_place`]), Avg where it reduces.
fn variants(coll: Collective) -> Vec<(bool, bool)> {
    let mut v = vec![(false, false)];
    if runs_in_place(coll) {
        v.push((true, false));
    }
    if coll.reduces() {
        v.push((false, true));
        if runs_in_place(coll) {
            v.push((true, true));
        }
    }
    v
}

/// `ps` with [`Problem::avg`] set to `avg`.
fn with_avg(mut ps: Vec<Problem>, avg: bool) -> Vec<Problem> {
    for p in &mut ps {
        p.avg = avg;
    }
    ps
}

/// What each algorithm implements; it must answer `None` for the rest.
fn implements(alg: Algorithm, k: CollKind) -> bool {
    use CollKind::*;
    match alg {
        Algorithm::Ring => matches!(
            k,
            AllReduce | Broadcast | Reduce | AllGather | ReduceScatter
        ),
        Algorithm::Direct => true,
        Algorithm::Tree => matches!(k, AllReduce | Broadcast | Reduce | Gather | Scatter),
        Algorithm::DoubleTree => matches!(k, AllReduce | Broadcast | Reduce),
        Algorithm::HalvingDoubling => matches!(k, AllReduce | ReduceScatter | AllGather),
        Algorithm::Pairwise => k == AllToAll,
        Algorithm::TwoShot => matches!(k, AllReduce | ReduceScatter),
        // Needs a host layout; without one (as in the matrix) it builds nothing.
        Algorithm::Hierarchical(_) => false,
    }
}

/// Verifies one configuration, checking that the algorithm implements
/// exactly what [`implements`] says.
fn check(ps: &[Problem], alg: Algorithm) -> Result<Option<Report>, String> {
    let coll = ps[0].coll;
    let what = format!(
        "{alg} {coll:?} n={} count={} in_place={} avg={} chunks={}",
        ps.len(),
        ps[0].count,
        ps[0].in_place,
        ps[0].avg,
        ps[0].chunks
    );
    let got = verify(ps, alg).map_err(|e| format!("{what}: {e}"))?;
    if got.is_some() != implements(alg, coll.kind()) {
        return Err(format!("{what}: implemented = {}", got.is_some()));
    }
    Ok(got)
}

fn with_chunks(mut ps: Vec<Problem>, chunks: usize) -> Vec<Problem> {
    for p in &mut ps {
        p.chunks = chunks;
    }
    ps
}

/// Algorithms whose schedules depend on `Problem::chunks`.
fn chunked(alg: Algorithm) -> &'static [usize] {
    match alg {
        Algorithm::Tree | Algorithm::DoubleTree => &[1, 3, 8],
        // The ring cuts its blocks into pieces only with 3 ranks or more
        // and blocks above 256 Ki elements, unless told to.
        Algorithm::Ring => &[1, 3],
        _ => &[1],
    }
}

#[test]
fn matrix() {
    let mut runs = 0;
    for n in 1..=17usize {
        let mut counts = vec![0, 1, n - 1, n, n + 1, 31, 1000];
        counts.sort_unstable();
        counts.dedup();
        for count in counts {
            for coll in colls(n) {
                for alg in Algorithm::ALL {
                    for (in_place, avg) in variants(coll) {
                        for &chunks in chunked(alg) {
                            let ps = with_chunks(problems(coll, n, count, in_place), chunks);
                            check(&with_avg(ps, avg), alg).unwrap_or_else(|e| panic!("{e}"));
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 10_000);
}

/// A tiny deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn below(&mut self, m: usize) -> usize {
        self.0 = mix(self.0);
        (self.0 % m as u64) as usize
    }
}

/// Consistent AllToAllV problems: uneven counts (a third of them zero),
/// blocks placed in a random order with random gaps on both sides.
fn vproblems(n: usize, seed: u64) -> Vec<Problem> {
    let mut rng = Rng(seed);
    // counts[q][p]: elements q sends to p.
    let counts: Vec<Vec<usize>> = (0..n)
        .map(|_| {
            (0..n)
                .map(|_| if rng.below(3) == 0 { 0 } else { rng.below(9) })
                .collect()
        })
        .collect();
    let mut place = |lens: Vec<usize>| {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut displs = vec![0; n];
        let mut at = 0;
        for q in order {
            at += rng.below(3);
            displs[q] = at;
            at += lens[q];
        }
        (lens, displs)
    };
    (0..n)
        .map(|r| {
            let (send_counts, send_displs) = place(counts[r].clone());
            let (recv_counts, recv_displs) = place((0..n).map(|q| counts[q][r]).collect());
            let mut p = Problem::new(Collective::AllToAllV, n, r, 0);
            p.vcounts = Some(VCounts {
                send_counts,
                send_displs,
                recv_counts,
                recv_displs,
            });
            p
        })
        .collect()
}

#[test]
fn alltoallv_with_uneven_counts() {
    for n in 1..=17 {
        for seed in 0..12 {
            let ps = vproblems(n, seed * 1000 + n as u64);
            for alg in Algorithm::ALL {
                check(&ps, alg).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            }
        }
    }
}

#[test]
fn bytes_sent_match_the_docs() {
    let (n, c) = (8, 64);
    let sent = |coll, alg: Algorithm| {
        let r = verify(&problems(coll, n, c, false), alg).unwrap().unwrap();
        (
            r.elems_sent.iter().copied().max().unwrap(),
            r.elems_sent.iter().sum::<usize>(),
        )
    };
    let bw = 2 * (n - 1) * c / n; // 2(n-1)/n * S
    assert_eq!(sent(Collective::AllReduce, Algorithm::Ring).0, bw);
    assert_eq!(
        sent(Collective::AllReduce, Algorithm::HalvingDoubling),
        (bw, n * bw)
    );
    assert_eq!(
        sent(Collective::AllReduce, Algorithm::DoubleTree),
        (2 * c, 2 * (n - 1) * c)
    );
    assert_eq!(
        sent(Collective::AllReduce, Algorithm::Tree),
        (3 * c, 2 * (n - 1) * c)
    );
    assert_eq!(
        sent(Collective::ReduceScatter, Algorithm::HalvingDoubling).0,
        (n - 1) * c
    );
    assert_eq!(
        sent(Collective::AllGather, Algorithm::HalvingDoubling).0,
        (n - 1) * c
    );
    assert_eq!(
        sent(Collective::AllToAll, Algorithm::Pairwise).0,
        (n - 1) * c
    );
    assert_eq!(sent(Collective::AllReduce, Algorithm::TwoShot).0, bw);
    assert_eq!(
        sent(Collective::ReduceScatter, Algorithm::TwoShot).0,
        (n - 1) * c
    );
    assert_eq!(
        sent(Collective::ReduceScatter, Algorithm::Direct).0,
        (n - 1) * c
    );
    let root = Collective::Broadcast { root: 0 };
    assert_eq!(sent(root, Algorithm::Tree).0, 3 * c); // log2(8) children
    assert_eq!(sent(root, Algorithm::DoubleTree), (c, (n - 1) * c));
    assert_eq!(
        sent(Collective::Gather { root: 0 }, Algorithm::Tree).0,
        4 * c
    );
    // n = 12 folds 4 pairs onto p = 8 members.
    let n = 12;
    let sent = |coll, alg: Algorithm| {
        let r = verify(&problems(coll, n, c, false), alg).unwrap().unwrap();
        r.elems_sent.into_iter().max().unwrap()
    };
    let hd = Algorithm::HalvingDoubling;
    assert_eq!(sent(Collective::AllReduce, hd), 2 * 7 * c / 8 + c);
    assert_eq!(sent(Collective::ReduceScatter, hd), n * c);
    assert_eq!(sent(Collective::AllGather, hd), 2 * (n - 1) * c);
}

#[test]
fn catches_a_wrong_schedule() {
    // Rank 1 forgets to reduce: receives instead.
    let ps = problems(Collective::AllReduce, 2, 4, false);
    let mut scheds: Vec<Schedule> = ps
        .iter()
        .map(|p| Algorithm::Direct.build(p).unwrap())
        .collect();
    let steps: Vec<Step> = scheds[1]
        .steps
        .iter()
        .map(|s| match *s {
            Step::Reduce { src, dst, len } => Step::Copy { src, dst, len },
            s => s,
        })
        .collect();
    scheds[1] = Schedule::new(&ps[1], steps);
    assert!(run(&ps, scheds).is_err());
}

/// AllGather on two ranks, in place (each rank's block is in its Output),
/// each rank's steps given by `f(rank, other)`.
fn two_ranks(f: impl Fn(usize, usize) -> Vec<Step>) -> Result<Report, VerifyError> {
    let ps = problems(Collective::AllGather, 2, 1, true);
    let scheds = ps
        .iter()
        .map(|p| Schedule::new(p, f(p.rank, 1 - p.rank)))
        .collect();
    run(&ps, scheds)
}

#[test]
fn rejects_a_deadlock() {
    let send = |r: usize, q: usize| Step::Send {
        peer: q,
        src: Loc::output(r),
        len: 1,
    };
    let recv = |q: usize| Step::Recv {
        peer: q,
        dst: Loc::output(q),
        len: 1,
    };
    // Receive first, send after: fine, steps without a data hazard overlap.
    two_ranks(|r, q| vec![recv(q), send(r, q)]).unwrap();
    // With a fence in between, both ranks wait for each other forever.
    let e = two_ranks(|r, q| vec![recv(q), Step::Fence, send(r, q)]).unwrap_err();
    assert!(e.0.contains("deadlock"), "{e}");
}

#[test]
fn rejects_writes_to_input() {
    let ps = problems(Collective::AllReduce, 1, 3, false);
    let steps = vec![
        Step::Copy {
            src: Loc::input(0),
            dst: Loc::output(0),
            len: 3,
        },
        Step::Copy {
            src: Loc::output(0),
            dst: Loc::input(0),
            len: 3,
        },
    ];
    let e = run(&ps, vec![Schedule::new(&ps[0], steps)]).unwrap_err();
    assert!(e.0.contains("read-only"), "{e}");
}

#[test]
fn rejects_reductions_in_different_orders() {
    // Direct AllReduce on 3 ranks, but rank 1 adds x2 before x0 and x1.
    let ps = problems(Collective::AllReduce, 3, 2, false);
    let mut scheds: Vec<Schedule> = ps
        .iter()
        .map(|p| Algorithm::Direct.build(p).unwrap())
        .collect();
    let (inp, out) = (Loc::input(0), Loc::output(0));
    let steps = vec![
        Step::Send {
            peer: 2,
            src: inp,
            len: 2,
        },
        Step::Send {
            peer: 0,
            src: inp,
            len: 2,
        },
        Step::Recv {
            peer: 2,
            dst: out,
            len: 2,
        },
        Step::RecvReduce {
            peer: 0,
            src: out,
            dst: out,
            len: 2,
        },
        Step::Reduce {
            src: inp,
            dst: out,
            len: 2,
        },
    ];
    scheds[1] = Schedule::new(&ps[1], steps);
    let e = run(&ps, scheds).unwrap_err();
    assert!(e.0.contains("bitwise"), "{e}");
}

/// Every collective with a count for `n` ranks, by number, root picked by `pick`.
fn coll_of(i: usize, n: usize, pick: usize) -> Collective {
    let root = pick % n;
    [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Barrier,
        Collective::Broadcast { root },
        Collective::Reduce { root },
        Collective::Gather { root },
        Collective::Scatter { root },
    ][i % 9]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_problems_verify(
        n in 1usize..=17,
        count in 0usize..300,
        alg in 0usize..6,
        coll in 0usize..9,
        pick in any::<usize>(),
        in_place in any::<bool>(),
        avg in any::<bool>(),
        chunks in 1usize..10,
    ) {
        let coll = coll_of(coll, n, pick);
        let in_place = in_place && runs_in_place(coll);
        let ps = with_chunks(problems(coll, n, count, in_place), chunks);
        let ps = with_avg(ps, avg && coll.reduces());
        if let Err(e) = check(&ps, Algorithm::ALL[alg]) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn random_alltoallv_verify(n in 1usize..=17, seed in any::<u64>(), pairwise in any::<bool>()) {
        let alg = if pairwise { Algorithm::Pairwise } else { Algorithm::Direct };
        if let Err(e) = check(&vproblems(n, seed), alg) {
            prop_assert!(false, "{}", e);
        }
    }

    /// Every send needs its receive: dropping a message step, or changing
    /// its length, on any rank of a correct schedule is caught.
    #[test]
    fn a_broken_message_is_caught(
        n in 2usize..=17,
        count in 1usize..100,
        alg in 0usize..6,
        coll in 0usize..9,
        pick in any::<usize>(),
        which in any::<usize>(),
        drop in any::<bool>(),
    ) {
        let coll = coll_of(coll, n, pick);
        let ps = problems(coll, n, count, false);
        let Some(mut scheds) = ps.iter().map(|p| Algorithm::ALL[alg].build(p)).collect::<Option<Vec<_>>>() else {
            return Ok(());
        };
        let r = pick % n;
        let msgs: Vec<usize> = (0..scheds[r].steps.len())
            .filter(|&i| scheds[r].steps[i].send_peer().is_some() || scheds[r].steps[i].recv_peer().is_some())
            .collect();
        prop_assume!(!msgs.is_empty());
        let i = msgs[which % msgs.len()];
        let mut steps = scheds[r].steps.clone();
        if drop {
            steps.remove(i);
        } else {
            steps[i] = match steps[i] {
                Step::Send { peer, src, len } => Step::Send { peer, src, len: len + 1 },
                Step::Recv { peer, dst, len } => Step::Recv { peer, dst, len: len + 1 },
                Step::RecvReduce { peer, src, dst, len } => Step::RecvReduce { peer, src, dst, len: len + 1 },
                Step::RecvReduceSend { from, to, src, dst, len } => {
                    Step::RecvReduceSend { from, to, src, dst, len: len + 1 }
                }
                Step::RecvCopySend { from, to, dst, len } => Step::RecvCopySend { from, to, dst, len: len + 1 },
                s => s,
            };
        }
        scheds[r] = Schedule::new(&ps[r], steps);
        prop_assert!(run(&ps, scheds).is_err());
    }
}

/// What hierarchical with `lv` implements (see `hierarchical.rs`): a
/// collective it covers whose row and column steps both level algorithms
/// implement.
fn hierarchical_implements(lv: Levels, k: CollKind) -> bool {
    use Level::*;
    let both = |ok: &[Level]| ok.contains(&lv.intra) && ok.contains(&lv.inter);
    match k {
        CollKind::AllReduce => lv.intra == Ring,
        CollKind::AllGather => both(&[Ring, HalvingDoubling, Direct]),
        CollKind::ReduceScatter => both(&[Ring, HalvingDoubling, Direct]),
        CollKind::Broadcast | CollKind::Reduce => both(&[Ring, Tree, Direct]),
        CollKind::AllToAll => both(&[Direct]),
        _ => false,
    }
}

/// Ranks `0..h*l` on `h` hosts of `l`, contiguous (rank r on host r / l).
fn grid(h: usize, l: usize) -> Vec<usize> {
    (0..h * l).map(|r| r / l).collect()
}

/// Host layouts for the hierarchical algorithms: uniform grids, contiguous
/// and interleaved, every level choice ([`Levels::ALL`]) for every
/// collective, with counts that divide evenly and counts that do not.
#[test]
fn hierarchical_layouts() {
    use std::sync::Arc;
    let mut layouts: Vec<Vec<usize>> = [(2, 2), (2, 3), (3, 2), (4, 2), (2, 4), (3, 3), (5, 2)]
        .into_iter()
        .map(|(h, l)| grid(h, l))
        .collect();
    layouts.extend([
        vec![0, 1, 0, 1],
        vec![1, 0, 2, 0, 1, 2],
        vec![0, 1, 2, 0, 1, 2, 0, 1, 2],
        vec![2, 2, 0, 1, 1, 0],
    ]);
    let mut runs = 0;
    for hosts in &layouts {
        let n = hosts.len();
        let h: Arc<[usize]> = hosts.clone().into();
        let mut counts = vec![0, 1, 2, n - 1, n, n + 1, 7, 31, 97];
        counts.sort_unstable();
        counts.dedup();
        for count in counts {
            for coll in colls(n) {
                for lv in Levels::ALL {
                    let alg = Algorithm::Hierarchical(lv);
                    let chunks: &[usize] = if lv.intra == Level::Tree || lv.inter == Level::Tree {
                        &[1, 3]
                    } else {
                        &[1]
                    };
                    for (in_place, avg) in variants(coll) {
                        for &chunks in chunks {
                            let ps = with_chunks(problems(coll, n, count, in_place), chunks);
                            let mut ps = with_avg(ps, avg);
                            for p in &mut ps {
                                p.hosts = Some(h.clone());
                            }
                            let got = verify(&ps, alg).unwrap_or_else(|e| {
                                panic!("{alg} {coll:?} hosts={hosts:?} count={count} in_place={in_place} avg={avg} chunks={chunks}: {e}")
                            });
                            let want = hierarchical_implements(lv, coll.kind());
                            assert_eq!(got.is_some(), want, "{alg} {coll:?} hosts={hosts:?}");
                            runs += usize::from(want);
                        }
                    }
                }
            }
        }
    }
    // Not a grid: refuse, whatever the levels.
    for hosts in [vec![0, 0, 0, 0], vec![0, 0, 1], vec![0, 1, 2, 3]] {
        let h: Arc<[usize]> = hosts.clone().into();
        let mut ps = problems(Collective::AllReduce, hosts.len(), 8, false);
        for p in &mut ps {
            p.hosts = Some(h.clone());
        }
        for lv in Levels::ALL {
            assert!(
                verify(&ps, Algorithm::Hierarchical(lv)).unwrap().is_none(),
                "{hosts:?}"
            );
        }
    }
    assert!(runs > 9_000, "{runs}");
}

/// Every rank agrees on whether a variant implements a rooted collective,
/// also when only the root's column runs the inter-host step.
#[test]
fn hierarchical_implements_alike_on_every_rank() {
    use std::sync::Arc;
    let h: Arc<[usize]> = grid(3, 2).into();
    for lv in Levels::ALL {
        for coll in colls(6) {
            let built: Vec<bool> = (0..6)
                .map(|r| {
                    let mut p = Problem::new(coll, 6, r, 5);
                    p.hosts = Some(h.clone());
                    Algorithm::Hierarchical(lv).build(&p).is_some()
                })
                .collect();
            assert!(
                built.iter().all(|&b| b == built[0]),
                "{lv:?} {coll:?}: {built:?}"
            );
        }
    }
}

/// The inter-host level decides what crosses the network in AllReduce:
/// each rank's `c/L` block, all-reduced by the chosen flat algorithm.
#[test]
fn hierarchical_inter_level_shapes_network_traffic() {
    use std::sync::Arc;
    // 4 hosts x 2 ranks, 8000 elements: each column all-reduces 4000.
    let hosts: Arc<[usize]> = grid(4, 2).into();
    let (n, c) = (8, 8000);
    let cross = |inter: Level| {
        let alg = Algorithm::Hierarchical(Levels {
            intra: Level::Ring,
            inter,
        });
        let mut max_msgs = 0;
        let mut max_elems = 0;
        for r in 0..n {
            let mut p = Problem::new(Collective::AllReduce, n, r, c);
            p.hosts = Some(hosts.clone());
            let s = alg.build(&p).unwrap();
            let x: Vec<usize> = s
                .steps
                .iter()
                .filter_map(|st| st.send_peer().map(|q| (q, st.len())))
                .filter(|&(q, _)| hosts[q] != hosts[r])
                .map(|(_, l)| l)
                .collect();
            max_msgs = max_msgs.max(x.len());
            max_elems = max_elems.max(x.iter().sum::<usize>());
        }
        (max_msgs, max_elems)
    };
    let b = c / 2;
    // Ring: 2(H-1) messages of b/H; halving-doubling: 2 log2 H of the same
    // total; direct: H-1 whole blocks.
    assert_eq!(cross(Level::Ring), (6, 2 * 3 * b / 4));
    assert_eq!(cross(Level::HalvingDoubling), (4, 2 * 3 * b / 4));
    assert_eq!(cross(Level::Direct), (3, 3 * b));
}

/// Hierarchical AllReduce sends less across hosts than a flat ring laid
/// over the same hosts.
#[test]
fn hierarchical_saves_network_bytes() {
    use std::sync::Arc;
    let hosts: Arc<[usize]> = vec![0, 0, 0, 0, 1, 1, 1, 1].into();
    let cross = |alg: Algorithm| {
        let mut total = 0usize;
        for r in 0..8 {
            let mut p = Problem::new(Collective::AllReduce, 8, r, 8000);
            p.hosts = Some(hosts.clone());
            let s = alg.build(&p).unwrap();
            total += s
                .steps
                .iter()
                .filter_map(|st| st.send_peer().map(|q| (q, st.len())))
                .filter(|&(q, _)| hosts[q] != hosts[r])
                .map(|(_, l)| l)
                .sum::<usize>();
        }
        total
    };
    let (flat, hier) = (
        cross(Algorithm::Ring),
        cross(Algorithm::Hierarchical(Levels::DEFAULT)),
    );
    // Ring over ranks 0..8 crosses twice per direction pass; hierarchical
    // sends 2(H-1)/H * S per host = S per host.
    assert_eq!(hier, 2 * 8000);
    assert!(flat > hier, "flat {flat} hier {hier}");
}

/// Pipelined hierarchical AllReduce, AllGather, ReduceScatter, AllToAll,
/// Broadcast and Reduce (roots off rank 0, on either host): cut into
/// `k` pieces (forced, so that small counts exercise it), every level
/// choice, grids and interleaved layouts, counts with empty pieces and
/// blocks, AllReduce in and out of place. The verifier runs without
/// buffering, so this also proves that the software pipeline's order on the
/// row and column queues cannot deadlock.
#[test]
fn hierarchical_pipelined() {
    use std::sync::Arc;
    let mut layouts: Vec<Vec<usize>> = [(2, 2), (2, 3), (3, 2), (2, 4), (4, 2), (3, 3)]
        .into_iter()
        .map(|(h, l)| grid(h, l))
        .collect();
    layouts.extend([vec![0, 1, 0, 1], vec![1, 0, 2, 0, 1, 2]]);
    let mut runs = 0;
    for hosts in &layouts {
        let n = hosts.len();
        let h: Arc<[usize]> = hosts.clone().into();
        for coll in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
            Collective::Broadcast { root: n - 1 },
            Collective::Reduce { root: n / 2 + 1 },
        ] {
            for count in [0, 1, 5, n * 3 + 1, 64] {
                for lv in Levels::ALL {
                    let want = hierarchical_implements(lv, coll.kind());
                    for k in [2, 3, 8] {
                        for (in_place, avg) in variants(coll) {
                            let chunks: &[usize] =
                                if lv.intra == Level::Tree || lv.inter == Level::Tree {
                                    &[1, 3]
                                } else {
                                    &[1]
                                };
                            for &chunks in chunks {
                                let ps = with_chunks(problems(coll, n, count, in_place), chunks);
                                let mut ps = with_avg(ps, avg);
                                let what = format!(
                                    "{lv:?} {coll:?} hosts={hosts:?} count={count} pieces={k} \
                                     in_place={in_place} avg={avg} chunks={chunks}"
                                );
                                let mut scheds = Vec::new();
                                for p in &mut ps {
                                    p.hosts = Some(h.clone());
                                    let steps = crate::algo::hierarchical::build_pieces(p, lv, k);
                                    assert_eq!(steps.is_some(), want, "{what}");
                                    if let Some(steps) = steps {
                                        let steps = crate::algo::frame::frame(p, steps);
                                        scheds.push(Schedule::new(p, steps));
                                    }
                                }
                                if want {
                                    run(&ps, scheds).unwrap_or_else(|e| panic!("{what}: {e}"));
                                    runs += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 2_500, "{runs}");
}
