//! Names and parsing of algorithms and hierarchical levels.

use super::*;

fn hier(intra: Level, inter: Level) -> Algorithm {
    Algorithm::Hierarchical(Levels { intra, inter })
}

#[test]
fn every_name_parses_back() {
    for a in Algorithm::VARIANTS {
        assert_eq!(a.name().parse::<Algorithm>().unwrap(), a, "{a}");
        assert_eq!(a.to_string(), a.name());
    }
    for lv in Levels::ALL {
        // Unique names, and the full form (both keys) parses to the same.
        let full = format!("hierarchical(intra={},inter={})", lv.intra, lv.inter);
        assert_eq!(
            full.parse::<Algorithm>().unwrap(),
            Algorithm::Hierarchical(lv)
        );
    }
    let mut names: Vec<&str> = Algorithm::VARIANTS.iter().map(|a| a.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), Algorithm::VARIANTS.len());
    assert_eq!(Levels::ALL[0], Levels::DEFAULT);
    assert_eq!(Algorithm::ALL[7], Algorithm::Hierarchical(Levels::DEFAULT));
}

#[test]
fn parses_hierarchical_levels() {
    use Level::*;
    let p = |s: &str| s.parse::<Algorithm>().unwrap();
    assert_eq!(p("hierarchical"), hier(Ring, Ring));
    assert_eq!(p("hierarchical()"), hier(Ring, Ring));
    assert_eq!(p("hier"), hier(Ring, Ring));
    assert_eq!(
        p("hierarchical(intra=ring,inter=halving_doubling)"),
        hier(Ring, HalvingDoubling)
    );
    assert_eq!(
        p("hierarchical(inter=halving_doubling)"),
        hier(Ring, HalvingDoubling)
    );
    assert_eq!(
        p(" Hierarchical( inter = HD , intra=tree ) "),
        hier(Tree, HalvingDoubling)
    );
    assert_eq!(p("hier(inter=one_shot)"), hier(Ring, Direct));
    assert_eq!(p("hierarchical(intra=direct)"), hier(Direct, Ring));
    assert_eq!(
        p("hierarchical(inter=halving-doubling)"),
        hier(Ring, HalvingDoubling)
    );
    assert_eq!(
        p("hierarchical(intra=direct,inter=direct)").name(),
        "hierarchical(intra=direct,inter=direct)"
    );
    assert_eq!(
        p("hierarchical(intra=ring,inter=ring)").name(),
        "hierarchical"
    );
}

#[test]
fn rejects_bad_levels() {
    let e = |s: &str| s.parse::<Algorithm>().unwrap_err().to_string();
    let msg = e("hierarchical(inter=bogus)");
    assert!(
        msg.contains("'bogus'") && msg.contains("valid: ring, tree, halving_doubling, direct"),
        "{msg}"
    );
    // Flat algorithms that cannot run a level are refused like unknown ones.
    for bad in ["pairwise", "double_tree", "two_shot", "hierarchical"] {
        let msg = e(&format!("hierarchical(intra={bad})"));
        assert!(msg.contains("valid: ring, tree"), "{bad}: {msg}");
    }
    let msg = e("hierarchical(across=ring)");
    assert!(msg.contains("valid: intra, inter"), "{msg}");
    let msg = e("hierarchical(ring)");
    assert!(msg.contains("key=algorithm"), "{msg}");
    let msg = e("hierarchical(inter=ring,inter=direct)");
    assert!(msg.contains("twice"), "{msg}");
    let msg = e("hierarchical(inter=ring");
    assert!(msg.contains("')'"), "{msg}");
    let msg = e("hierarchical(inter=hierarchical(inter=ring))");
    assert!(msg.contains("nested"), "{msg}");
    let msg = e("ring(inter=ring)");
    assert!(msg.contains("only hierarchical takes levels"), "{msg}");
    let msg = e("hierarchicl(inter=ring)");
    assert!(msg.contains("unknown algorithm"), "{msg}");
    let msg = e("bogus");
    assert!(msg.contains("hierarchical(intra=A,inter=B)"), "{msg}");
}

/// `Schedule::read_back` marks the receives whose bytes a later step sends
/// on (the executor keeps those in the cache) and no others.
#[test]
fn read_back_marks_forwarded_receives() {
    let recvs = |s: &Schedule| -> Vec<bool> {
        s.steps
            .iter()
            .zip(&s.read_back)
            .filter(|(st, _)| matches!(st, Step::Recv { .. }))
            .map(|(_, &r)| r)
            .collect()
    };
    // Direct AllToAll: every received block is final.
    let p = Problem::new(Collective::AllToAll, 4, 1, 4 * 1000);
    let s = Algorithm::Direct.build(&p).unwrap();
    let r = recvs(&s);
    assert_eq!(r.len(), 3);
    assert!(r.iter().all(|&x| !x), "{r:?}");
    // Recursive doubling AllGather, 4 ranks: the first exchange's block is
    // sent on in the second, whose block is final.
    let p = Problem::new(Collective::AllGather, 4, 0, 1000);
    let s = Algorithm::HalvingDoubling.build(&p).unwrap();
    assert_eq!(recvs(&s), vec![true, false]);
    // A step that writes nothing is never read back.
    assert!(s
        .steps
        .iter()
        .zip(&s.read_back)
        .all(|(st, &r)| !r || !st.writes().is_empty()));
}

/// `Schedule::reduce_chain`: the rank-order AllReduce algorithms build each
/// rank's result from one chain (its head, one member per other operand,
/// and in place the copy out of the scratch accumulator); the ring builds
/// its blocks with fused forwarding steps and has none.
#[test]
fn reduce_chains_cover_the_rank_order_reductions() {
    for n in 2..=6 {
        for in_place in [false, true] {
            for r in 0..n {
                let mut p = Problem::new(Collective::AllReduce, n, r, 1000 * n + 3);
                p.in_place = in_place;
                for alg in [Algorithm::Direct, Algorithm::TwoShot] {
                    let s = alg.build(&p).unwrap();
                    let chains: Vec<_> = (0..s.steps.len())
                        .filter_map(|i| s.reduce_chain(i))
                        .collect();
                    let want = n + usize::from(in_place);
                    assert_eq!(chains.len(), 1, "{alg} n={n} rank {r} in place {in_place}");
                    assert_eq!(
                        chains[0].len(),
                        want,
                        "{alg} n={n} rank {r} in place {in_place}"
                    );
                    let c = &chains[0];
                    assert!(matches!(
                        s.steps[c.start],
                        Step::Copy { .. } | Step::Recv { .. }
                    ));
                    let peers: Vec<_> = s.steps[c.clone()]
                        .iter()
                        .filter_map(|x| x.recv_peer())
                        .collect();
                    assert_eq!(
                        peers.len(),
                        n - 1,
                        "{alg} n={n} rank {r}: one message per peer"
                    );
                }
                let s = Algorithm::Ring.build(&p).unwrap();
                assert!((0..s.steps.len()).all(|i| s.reduce_chain(i).is_none()));
            }
        }
    }
}
