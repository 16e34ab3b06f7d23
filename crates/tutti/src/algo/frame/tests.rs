//! The frame, proven: without it the verifier finds the own block missing
//! or the mean undivided, and every way to get the mean wrong is caught.

use super::*;
use crate::algo::verify::{problems, run, verify};
use crate::algo::{Algorithm, Schedule};

/// Out of place, AllGather's Output starts empty and a Broadcast root's
/// data is in its Input: without the frame's copy ([`pre_copy`]) a rank's
/// own block never arrives, and the verifier says so. In place the data is
/// already there and the frame copies nothing.
#[test]
fn the_pre_copy_is_proven() {
    for coll in [Collective::AllGather, Collective::Broadcast { root: 1 }] {
        let ps = problems(coll, 3, 5, false);
        let bare = ps
            .iter()
            .map(|p| Schedule::new(p, Algorithm::Direct.steps(p).unwrap()))
            .collect();
        let e = run(&ps, bare).unwrap_err();
        assert!(e.0.contains("Output"), "{coll:?}: {e}");
        verify(&ps, Algorithm::Direct).unwrap().unwrap();
        let ps = problems(coll, 3, 5, true);
        assert!(ps.iter().all(|p| pre_copy(p).is_none()));
        verify(&ps, Algorithm::Direct).unwrap().unwrap();
    }
}

/// An Avg reduction ends with its result divided by the rank count
/// ([`mean`]) exactly once, after its last contribution is in; any other
/// reduction never. The verifier catches every way to get that wrong.
#[test]
fn the_mean_is_proven() {
    let n = 3;
    let built = |ps: &[Problem], f: &dyn Fn(&Problem, Vec<Step>) -> Vec<Step>| {
        ps.iter()
            .map(|p| {
                let steps = frame(p, Algorithm::Direct.steps(p).unwrap());
                Schedule::new(p, f(p, steps))
            })
            .collect::<Vec<_>>()
    };
    let err = |ps: &[Problem], f: &dyn Fn(&Problem, Vec<Step>) -> Vec<Step>| {
        run(ps, built(ps, f)).unwrap_err().0
    };
    for coll in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::Reduce { root: 1 },
    ] {
        let avg = {
            let mut ps = problems(coll, n, 4, false);
            for p in &mut ps {
                p.avg = true;
            }
            ps
        };
        let sum = problems(coll, n, 4, false);
        let holds = |p: &Problem| coll.root().is_none_or(|root| root == p.rank);
        // As built: the mean where Avg, on the ranks with a result only.
        run(&avg, built(&avg, &|_, s| s)).unwrap();
        for p in &avg {
            let last = Algorithm::Direct.build(p).unwrap().steps.pop();
            assert_eq!(
                matches!(last, Some(Step::Scale { divisor: 3, .. })),
                holds(p),
                "{coll:?} rank {}",
                p.rank
            );
        }
        // Avg left undivided.
        let e = err(&avg, &|_, mut s| {
            s.retain(|x| !matches!(x, Step::Scale { .. }));
            s
        });
        assert!(e.contains("never divided"), "{coll:?}: {e}");
        // A Sum divided.
        let e = err(&sum, &|p, mut s| {
            s.extend(mean(p.coll, n, p.rank, p.count));
            s
        });
        assert!(e.contains("not Avg"), "{coll:?}: {e}");
        // Divided twice.
        let e = err(&avg, &|_, mut s| {
            if let Some(&last @ Step::Scale { .. }) = s.last() {
                s.push(last);
            }
            s
        });
        assert!(e.contains("second time"), "{coll:?}: {e}");
        // By the wrong count.
        let e = err(&avg, &|_, s| {
            s.into_iter()
                .map(|x| match x {
                    Step::Scale { dst, len, .. } => Step::Scale {
                        dst,
                        len,
                        divisor: 2,
                    },
                    x => x,
                })
                .collect()
        });
        assert!(e.contains("not by the rank count"), "{coll:?}: {e}");
        // Before the last contribution is in: divided first, then reduced.
        let e = err(&avg, &|_, mut s| {
            if let Some(&last @ Step::Scale { .. }) = s.last() {
                s.pop();
                let at = s.iter().position(|x| x.reduces()).unwrap();
                s.insert(at, last);
            }
            s
        });
        assert!(e.contains("after it was divided"), "{coll:?}: {e}");
    }
}
