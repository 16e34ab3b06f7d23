//! The lowering's proofs: every algorithm's reducing schedules, lowered to
//! each wire type, pass the verifier (full sums, every hop narrowed, all
//! ranks of an AllReduce bitwise alike) for 2..8 ranks.

use super::*;
use crate::algo::verify::{problems, run_outputs, verify};
use crate::algo::{Algorithm, Levels, Schedule};
use std::sync::Arc;

fn reducing(n: usize) -> Vec<Collective> {
    let mut v = vec![Collective::AllReduce, Collective::ReduceScatter];
    let mut roots = vec![0, n / 2, n - 1];
    roots.dedup();
    v.extend(roots.into_iter().map(|root| Collective::Reduce { root }));
    v
}

fn lowered(coll: Collective, n: usize, count: usize, wire: Wire) -> Vec<Problem> {
    let mut ps = problems(coll, n, count, false);
    for p in &mut ps {
        p.wire = Some(wire);
    }
    ps
}

fn check(ps: &[Problem], alg: Algorithm) {
    let p = &ps[0];
    let what = format!(
        "{alg} {:?} n={} count={} in_place={} avg={} chunks={} wire={:?}",
        p.coll,
        ps.len(),
        p.count,
        p.in_place,
        p.avg,
        p.chunks,
        p.wire
    );
    let Some(report) = verify(ps, alg).unwrap_or_else(|e| panic!("{what}: {e}")) else {
        return;
    };
    // Without the wire, the same algorithm sends the same elements.
    let plain: Vec<Problem> = ps
        .iter()
        .map(|p| Problem {
            wire: None,
            ..p.clone()
        })
        .collect();
    let base = verify(&plain, alg).unwrap().unwrap();
    assert_eq!(report.elems_sent, base.elems_sent, "{what}");
    assert_eq!(report.messages, base.messages, "{what}");
}

#[test]
fn every_algorithm_lowers_and_verifies() {
    for n in 2..=8usize {
        let mut counts = vec![0, 1, n - 1, n, n + 1, 31, 1000];
        counts.sort_unstable();
        counts.dedup();
        for count in counts {
            for coll in reducing(n) {
                for alg in Algorithm::ALL {
                    for in_place in [false, true] {
                        if in_place && coll != Collective::AllReduce {
                            continue;
                        }
                        for avg in [false, true] {
                            for chunks in [1, 3] {
                                for wire in [Wire::Bf16, Wire::F16] {
                                    let mut ps = lowered(coll, n, count, wire);
                                    for p in &mut ps {
                                        p.in_place = in_place;
                                        p.avg = avg;
                                        p.chunks = chunks;
                                    }
                                    check(&ps, alg);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn hierarchical_lowers_and_verifies() {
    for hosts in [
        vec![0, 0, 1, 1],
        vec![0, 0, 0, 1, 1, 1],
        vec![0, 0, 1, 1, 2, 2, 3, 3],
    ] {
        let n = hosts.len();
        let h: Arc<[usize]> = hosts.clone().into();
        for lv in Levels::ALL {
            for coll in reducing(n) {
                for count in [0, 1, 7, 100] {
                    for in_place in [false, true] {
                        if in_place && coll != Collective::AllReduce {
                            continue;
                        }
                        let mut ps = lowered(coll, n, count, Wire::Bf16);
                        for p in &mut ps {
                            p.hosts = Some(h.clone());
                            p.in_place = in_place;
                        }
                        check(&ps, Algorithm::Hierarchical(lv));
                    }
                }
            }
        }
    }
}

#[test]
fn large_ring_pieces_lower() {
    // Blocks above the ring's piece size: partial sums pass through scratch slots.
    for n in [3, 4] {
        let ps = lowered(Collective::AllReduce, n, 3 << 20, Wire::Bf16);
        check(&ps, Algorithm::Ring);
    }
}

#[test]
fn every_message_moves_wire_elements() {
    for alg in Algorithm::ALL {
        for n in 2..=5 {
            for p in lowered(Collective::AllReduce, n, 40, Wire::F16) {
                let Some(s) = alg.build(&p) else { continue };
                assert_eq!(s.wire, Some(Wire::F16));
                for st in &s.steps {
                    assert!(!matches!(
                        st,
                        Step::RecvReduce { .. } | Step::RecvReduceSend { .. }
                    ));
                    if let Some(l) = st.message_loc() {
                        assert_eq!(l.buf, Buf::Wire, "{alg} {st:?}");
                    }
                }
                // Halved: every message moves 2 bytes an element.
                for i in 0..s.steps.len() {
                    if s.steps[i].message_loc().is_some() {
                        assert_eq!(s.step_bytes(i, 4), s.steps[i].len() * 2);
                    }
                }
            }
        }
    }
}

#[test]
fn non_reducing_collectives_do_not_lower() {
    let mut p = Problem::new(Collective::AllGather, 4, 0, 10);
    p.wire = Some(Wire::Bf16);
    assert!(Algorithm::Ring.build(&p).is_none());
}

/// Runs lowered schedules by hand with a wrong step and expects the verifier to object.
fn doctored(alg: Algorithm, n: usize, f: impl Fn(&mut Vec<Step>)) -> String {
    let ps = lowered(Collective::AllReduce, n, 12, Wire::Bf16);
    let scheds: Vec<Schedule> = ps
        .iter()
        .map(|p| {
            let mut st = alg.build(p).unwrap().steps;
            if p.rank == 0 {
                f(&mut st);
            }
            Schedule::new(p, st)
        })
        .collect();
    run_outputs(&ps, scheds).unwrap_err().0
}

#[test]
fn catches_an_unrounded_own_copy() {
    // Two-shot rounds its own block before the all-gather's end; without it
    // rank 0 would keep the unrounded sum its peers never see.
    let e = doctored(Algorithm::TwoShot, 3, |st| {
        st.retain(|s| !matches!(s, Step::Round { .. }));
    });
    assert!(e.contains("different orders"), "{e}");
}

#[test]
fn catches_a_plain_message() {
    let e = doctored(Algorithm::Ring, 2, |st| {
        for s in st.iter_mut() {
            if let Step::Send { src, .. } = s {
                *src = Loc::output(0);
                break;
            }
        }
    });
    assert!(e.contains("only wire elements"), "{e}");
}

#[test]
fn catches_a_reduction_of_wire_elements() {
    let e = doctored(Algorithm::Direct, 2, |st| {
        for s in st.iter_mut() {
            if let Step::WidenReduce {
                src,
                wire,
                dst,
                len,
            } = *s
            {
                *s = Step::Reduce {
                    src: wire,
                    dst,
                    len,
                };
                let _ = src;
                break;
            }
        }
    });
    assert!(e.contains("wire element"), "{e}");
}

#[test]
fn f16_scale_covers_the_rank_count() {
    assert_eq!(Wire::Bf16.scale_shift(8), 0);
    for (n, k) in [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4)] {
        assert_eq!(Wire::F16.scale_shift(n), k, "n={n}");
        assert!(1usize << k >= n);
    }
    assert_eq!("BF16".parse::<Wire>().unwrap(), Wire::Bf16);
    assert!("f32".parse::<Wire>().is_err());
}
