//! The hazard index against the plain pairwise comparison it replaced.

use super::super::verify::problems;
use super::super::{Algorithm, Collective};
use super::*;
use std::sync::Arc;

/// The reference: every step against every earlier step since the last
/// fence (quadratic; what `dependencies` computed before the index).
fn dependencies_pairwise(steps: &[Step], alias: Option<usize>) -> Vec<Vec<u32>> {
    let rw: Vec<_> = steps.iter().map(|s| (s.reads(), s.writes())).collect();
    let mut deps = Vec::with_capacity(steps.len());
    let mut last_fence: Option<usize> = None;
    for (i, s) in steps.iter().enumerate() {
        let mut d = Vec::new();
        if matches!(s, Step::Fence) {
            d.extend((last_fence.unwrap_or(0)..i).map(|j| j as u32));
            last_fence = Some(i);
            deps.push(d);
            continue;
        }
        let start = last_fence.unwrap_or(0);
        if let Some(f) = last_fence {
            d.push(f as u32);
        }
        let (ri, wi) = &rw[i];
        for (j, (rj, wj)) in rw.iter().enumerate().take(i).skip(start) {
            let hazard =
                overlaps(wi, rj, alias) || overlaps(ri, wj, alias) || overlaps(wi, wj, alias);
            if hazard {
                d.push(j as u32);
            }
        }
        deps.push(d);
    }
    deps
}

/// The reference for `read_back`: every step against every later one.
fn read_back_pairwise(steps: &[Step], alias: Option<usize>) -> Vec<bool> {
    let rw: Vec<_> = steps.iter().map(|s| (s.reads(), s.writes())).collect();
    (0..steps.len())
        .map(|j| {
            let wj = &rw[j].1;
            !wj.is_empty() && rw[j + 1..].iter().any(|(ri, _)| overlaps(ri, wj, alias))
        })
        .collect()
}

/// Every collective with a root at 0 and at the last rank.
fn colls(n: usize) -> Vec<Collective> {
    let mut v = vec![
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Barrier,
    ];
    for root in [0, n - 1] {
        v.extend([
            Collective::Broadcast { root },
            Collective::Reduce { root },
            Collective::Gather { root },
            Collective::Scatter { root },
        ]);
    }
    v
}

/// A host layout for `n` ranks: a grid where `n` has a factor, else
/// ranks dealt round-robin to 2 hosts (uneven: hierarchical declines).
fn layout(n: usize) -> Arc<[usize]> {
    let l = (2..n).find(|l| n.is_multiple_of(*l)).unwrap_or(1);
    (0..n)
        .map(|r| if l > 1 { r / l } else { r % 2 })
        .collect::<Vec<_>>()
        .into()
}

fn check(steps: &[Step], alias: Option<usize>, what: &dyn Fn() -> String) {
    assert_eq!(
        dependencies(steps, alias),
        dependencies_pairwise(steps, alias),
        "dependencies of {}",
        what()
    );
    assert_eq!(
        read_back(steps, alias),
        read_back_pairwise(steps, alias),
        "read_back of {}",
        what()
    );
}

#[test]
fn the_index_finds_the_same_hazards_as_every_pair() {
    let (mut checked, mut hier) = (0, 0);
    for n in 2..=16usize {
        let hosts = layout(n);
        for coll in colls(n) {
            for count in [0, 1, n + 1, 1000] {
                for alg in Algorithm::VARIANTS {
                    for chunks in [1, 3, 8] {
                        for (in_place, avg) in [(false, false), (true, false), (false, true)] {
                            let ps = problems(coll, n, count, in_place);
                            for mut p in ps {
                                p.chunks = chunks;
                                p.avg = avg && coll.reduces();
                                p.hosts = Some(hosts.clone());
                                let Some(s) = alg.build(&p) else { continue };
                                let alias = p.input_in_output();
                                let what = || {
                                    format!("{alg} {coll:?} n={n} rank={} count={count} chunks={chunks} in_place={in_place} avg={avg}", p.rank)
                                };
                                check(&s.steps, alias, &what);
                                checked += 1;
                                hier += usize::from(alg.is_hierarchical());
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 50_000 && hier > 5_000, "{checked} {hier}");
}

/// The same over schedules lowered to a 16-bit wire (their staging buffer
/// is a fourth buffer with ranges of its own).
#[test]
fn the_index_finds_the_same_hazards_on_a_wire() {
    let mut checked = 0;
    for n in 2..=8usize {
        let hosts = layout(n);
        for coll in colls(n).into_iter().filter(|c| c.reduces()) {
            for count in [1, n + 1, 1000] {
                for alg in Algorithm::VARIANTS {
                    for in_place in [false, true] {
                        for mut p in problems(coll, n, count, in_place) {
                            p.wire = Some(Wire::Bf16);
                            p.hosts = Some(hosts.clone());
                            let Some(s) = alg.build(&p) else { continue };
                            let alias = p.input_in_output();
                            let what = || {
                                format!(
                                    "{alg} {coll:?} n={n} rank={} count={count} on bf16",
                                    p.rank
                                )
                            };
                            check(&s.steps, alias, &what);
                            checked += usize::from(s.staging > 0);
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1_000, "{checked}");
}

/// Empty ranges, fences and aliasing, which no algorithm above may hit.
#[test]
fn empty_ranges_fences_and_aliases() {
    use super::super::Loc;
    let steps = vec![
        Step::Copy {
            src: Loc::input(0),
            dst: Loc::output(4),
            len: 4,
        },
        Step::Recv {
            peer: 1,
            dst: Loc::output(6),
            len: 0,
        },
        Step::Send {
            peer: 1,
            src: Loc::output(2),
            len: 0,
        },
        Step::Reduce {
            src: Loc::scratch(0),
            dst: Loc::output(5),
            len: 2,
        },
        Step::Fence,
        Step::Send {
            peer: 1,
            src: Loc::input(1),
            len: 3,
        },
        Step::RecvReduce {
            peer: 1,
            src: Loc::output(0),
            dst: Loc::output(0),
            len: 8,
        },
        Step::Fence,
        Step::Scale {
            dst: Loc::output(0),
            len: 8,
            divisor: 2,
        },
        Step::Copy {
            src: Loc::output(6),
            dst: Loc::scratch(0),
            len: 0,
        },
        Step::Copy {
            src: Loc::scratch(0),
            dst: Loc::input(0),
            len: 8,
        },
    ];
    for alias in [None, Some(0), Some(4)] {
        check(&steps, alias, &|| format!("alias {alias:?}"));
    }
}
