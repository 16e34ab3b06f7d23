//! Online tuning's trials, decisions, reviews and watch.

use super::review::decide;
use super::*;
use crate::algo::Algorithm;

fn cands() -> Vec<Choice> {
    [Algorithm::Ring, Algorithm::Tree, Algorithm::Direct]
        .into_iter()
        .map(|algorithm| Choice {
            algorithm,
            chunks: 1,
            us: 1.0,
            stream: false,
            cma: false,
        })
        .collect()
}

#[test]
fn candidates_take_turns_in_blocks_after_untimed_calls() {
    let bytes = 1 << 20;
    let mut t = Trials::new(cands(), bytes);
    let (lead, per) = trials(bytes);
    assert_eq!((lead, per), (3, 10));
    // A block's worth of the model's pick, untimed, warms up.
    for _ in 0..lead + per {
        assert_eq!(t.next(), (cands()[0], false));
        assert!(!t.record(99.0));
    }
    for turn in 0..TURNS {
        for slot in 0..3 {
            // Turn `turn` starts with candidate `turn`.
            let k = (turn + slot) % 3;
            let c = cands()[k];
            for _ in 0..lead {
                assert_eq!(t.next(), (c, false));
                assert!(!t.record(99.0));
            }
            for j in 0..per {
                assert_eq!(t.next(), (c, true));
                // Candidate k takes 10 + k and 20 + k seconds in turn,
                // plus the turn's number.
                let secs = if j % 2 == 0 { 10.0 } else { 20.0 } + (k + turn) as f64;
                let last = turn == TURNS - 1 && slot == 2 && j == per - 1;
                assert_eq!(t.record(secs), last, "{turn} {k} {j}");
            }
        }
    }
    // The means of the timed calls per turn and candidate; the untimed
    // ones do not count.
    let want: Vec<f64> = (0..TURNS)
        .flat_map(|r| (0..3).map(move |k| (15 + k + r) as f64 * 1e6))
        .collect();
    assert_eq!(t.means_us(), want);
}

#[test]
fn decision_is_paired_by_turn_and_keeps_the_pick_unless_clearly_beaten() {
    // Near-equal in every turn: the reference stays.
    assert_eq!(decide(&[100.0, 98.0, 99.0, 200.0, 196.0, 198.0], 3, 0), 0);
    // Tree 10% faster in every turn, though its times in a slow second
    // turn exceed everything in the first: paired, it wins.
    let us = [100.0, 90.0, 95.0, 300.0, 270.0, 290.0, 100.0, 90.0, 95.0];
    assert_eq!(decide(&us, 3, 0), 1);
    // Against the tree as the reference, the ring (10% slower) does not
    // win it back, nor direct.
    assert_eq!(decide(&us, 3, 1), 1);
    // Direct as the reference loses to the tree (0.947 of its time in
    // each turn), not to the ring (1.05).
    assert_eq!(decide(&us, 3, 2), 1);
    // One turn where direct looks fast does not make it win: the median
    // of its ratios (1.2, 0.5, 1.2) is 1.2.
    let us = [100.0, 101.0, 120.0, 100.0, 101.0, 50.0, 100.0, 101.0, 120.0];
    assert_eq!(decide(&us, 3, 0), 0);
    // Not a number (a time that went wrong) never wins.
    let nan = f64::NAN;
    let us = [nan, nan, 80.0, 100.0, 90.0, 80.0, 100.0, 90.0, 80.0];
    assert_eq!(decide(&us, 3, 0), 2);
}

/// Runs `t`'s current stretch with candidate c taking `secs(c)` a call.
fn run_stretch(t: &mut Trials, secs: impl Fn(usize) -> f64) -> usize {
    let mut n = 0;
    loop {
        let (c, _) = t.next();
        let i = t.candidates().iter().position(|x| *x == c).unwrap();
        n += 1;
        if t.record(secs(i)) {
            return n;
        }
    }
}

#[test]
fn reviews_take_one_turn_and_decide_on_the_last_turns() {
    let bytes = 1 << 20;
    let (lead, per) = trials(bytes);
    let block = lead + per;
    // A first decision is never unsettled: its turns ran back to back
    // (here the tree is twice as fast in the last).
    let mut t = Trials::new(cands(), bytes);
    run_stretch(&mut t, |_| 1.0);
    let a = t.agreed(&[1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 2.0, 1.0, 3.0]);
    assert_eq!((a.pick.algorithm, a.unsettled), (Algorithm::Ring, false));
    let mut t = Trials::new(cands(), bytes);
    assert!(t.fresh() && t.decided().is_none());
    // The first stretch: the ring fastest.
    let ring_fast = |c: usize| [1.0, 2.0, 3.0][c];
    assert_eq!(run_stretch(&mut t, ring_fast), (1 + TURNS * 3) * block);
    let a = t.agreed(&t.means_us());
    assert_eq!(
        (a.pick.algorithm, a.pick.us, a.turns, a.changed, a.moved),
        (Algorithm::Ring, 1e6, TURNS, false, false)
    );
    assert_eq!(t.reviews(), 0);
    // A review: one turn, no warm-up, starting where the rotation left
    // off (turn TURNS starts with candidate TURNS mod 3).
    assert!(t.fresh());
    assert_eq!(t.next(), (cands()[TURNS % 3], false));
    // The tree becomes fastest: one review turn is not enough to switch
    // (median over the last TURNS turns), a second is.
    // The review's turn alone says the tree, by more than RESET_GAIN:
    // unsettled, one more turn follows at once.
    let tree_fast = |c: usize| [2.0, 1.0, 3.0][c];
    assert_eq!(run_stretch(&mut t, tree_fast), 3 * block);
    let a = t.agreed(&t.means_us());
    assert_eq!(
        (a.pick.algorithm, a.turns, a.changed, a.unsettled),
        (Algorithm::Ring, 1, false, true)
    );
    run_stretch(&mut t, tree_fast);
    let a = t.agreed(&t.means_us());
    // Twice as fast: a change that resets the gap to the next review.
    assert_eq!(
        (a.pick.algorithm, a.pick.us, a.changed, a.moved, a.unsettled),
        (Algorithm::Tree, 1e6, true, true, false)
    );
    assert_eq!(t.reviews(), 2);
    // Back and forth by 2%: the pick (now the tree) stays.
    for _ in 0..TURNS {
        run_stretch(&mut t, |c| [0.98, 1.0, 3.0][c]);
        let a = t.agreed(&t.means_us());
        assert_eq!((a.pick.algorithm, a.changed), (Algorithm::Tree, false));
    }
    // The ring 5% faster: it becomes the pick once it has the median
    // turn, but by too little to count as a machine that moved.
    for i in 0..TURNS {
        run_stretch(&mut t, |c| [0.95, 1.0, 3.0][c]);
        let a = t.agreed(&t.means_us());
        assert_eq!((a.changed, a.moved), (i == TURNS / 2, false), "{i}");
    }
    assert_eq!(t.decided().unwrap().algorithm, Algorithm::Ring);
    // A turn where the tree is 20% faster: unsettled; the turn after
    // shows the ring ahead again (noise): the ring stays, settled.
    run_stretch(&mut t, |c| [1.2, 1.0, 3.0][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!((a.pick.algorithm, a.unsettled), (Algorithm::Ring, true));
    run_stretch(&mut t, |c| [0.95, 1.0, 3.0][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!((a.pick.algorithm, a.unsettled), (Algorithm::Ring, false));
    // A follow-up is never followed up: the tree ahead by 20% in one
    // turn, then direct by as much in the next keeps the ring (the
    // median of the last three turns) without a third turn at once.
    for _ in 0..2 {
        run_stretch(&mut t, |c| [0.9, 1.0, 3.0][c]);
        let a = t.agreed(&t.means_us());
        assert_eq!((a.changed, a.unsettled), (false, false));
    }
    run_stretch(&mut t, |c| [1.2, 1.0, 3.0][c]);
    assert!(t.agreed(&t.means_us()).unsettled);
    run_stretch(&mut t, |c| [1.2, 3.0, 1.0][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!(
        (a.pick.algorithm, a.changed, a.unsettled),
        (Algorithm::Ring, false, false)
    );
}

#[test]
fn an_order_effect_in_review_turns_does_not_move_the_pick() {
    // Two candidates, the ring twice as fast as the tree in a loop; in
    // a review's turn, whichever runs first takes a third of its time
    // (as direct and two-shot did at 8 B, 4 ranks on 2 cores). Four
    // turns decided on, each candidate first in two: the ring stays.
    let bytes = 64;
    let (lead, per) = trials(bytes);
    let two = cands()[..2].to_vec();
    let mut t = Trials::new(two.clone(), bytes);
    run_stretch(&mut t, |c| [1.0, 2.0][c]);
    assert_eq!(t.agreed(&t.means_us()).pick.algorithm, Algorithm::Ring);
    for review in 0..12 {
        let first = t.next().0;
        let mut calls = 0;
        loop {
            let (c, _) = t.next();
            let i = two.iter().position(|x| *x == c).unwrap();
            let secs = [1.0, 2.0][i] / if c == first { 3.0 } else { 1.0 };
            calls += 1;
            if t.record(secs) {
                break;
            }
        }
        assert_eq!(calls, 2 * (lead + per));
        let a = t.agreed(&t.means_us());
        assert_eq!(
            (a.pick.algorithm, a.changed),
            (Algorithm::Ring, false),
            "{review}"
        );
    }
    // On the last three turns only, the tree would win each decision
    // after a turn it ran first in (then first in two of the three).
    let (ring_first, tree_first) = ([1.0 / 3.0, 2.0], [1.0, 2.0 / 3.0]);
    let three = [tree_first, ring_first, tree_first].concat();
    assert_eq!(decide(&three, 2, 0), 1);
    assert_eq!(decide(&[&ring_first[..], &three].concat(), 2, 0), 0);
    assert_eq!((history_turns(1), history_turns(2)), (TURNS, 4));
    assert_eq!((history_turns(3), history_turns(5)), (3, 3));
}

#[test]
fn reviews_of_quick_shapes_come_seconds_apart_where_ranks_share_cores() {
    // A turn of 400 calls at 2.5 us takes 1 ms: 50 of them where
    // ranks share cores; no floor where every rank has a core, nor for
    // a watched shape.
    assert_eq!(review_floor(false, 400, 2.5, 0.5), 50);
    assert_eq!(review_floor(false, 400, 2.5, 1.0), 0);
    assert_eq!(review_floor(true, 400, 2.5, 0.5), 0);
    // A turn longer than the seconds: one span.
    assert_eq!(review_floor(false, 16, 25_000.0, 0.5), 1);
    // Bounded, and nothing from a time that went wrong.
    assert_eq!(review_floor(false, 400, 1e-6, 0.5), REVIEW_FLOOR_MAX);
    assert_eq!(review_floor(false, 400, f64::NAN, 0.5), 0);
    assert_eq!(review_floor(false, 0, 2.5, 0.5), 0);
    // The pace is the pick's best turn: the ring at 3, 1 and 2 us.
    let bytes = 1 << 20;
    let mut t = Trials::new(cands(), bytes);
    assert_eq!(t.pace_us(), None);
    let (lead, per) = trials(bytes);
    assert_eq!(t.turn_calls(), 3 * (lead + per));
    run_stretch(&mut t, |c| [1.0, 2.0, 3.0][c]);
    t.agreed(&[3.0, 4.0, 5.0, 1.0, 4.0, 5.0, 2.0, 4.0, 5.0]);
    assert_eq!(t.decided().unwrap().algorithm, Algorithm::Ring);
    assert_eq!(t.pace_us(), Some(1.0));
}

#[test]
fn a_review_the_watch_asked_for_decides_on_the_turns_after_it() {
    let bytes = 1 << 20;
    let mut t = Trials::new(cands(), bytes);
    // Before the first decision there are no turns to drop.
    t.stale();
    run_stretch(&mut t, |c| [1.0, 2.0, 3.0][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!((a.pick.algorithm, a.unsettled), (Algorithm::Ring, false));
    // Three turns with the ring ahead: the history.
    for _ in 0..TURNS {
        run_stretch(&mut t, |c| [1.0, 2.0, 3.0][c]);
        assert!(!t.agreed(&t.means_us()).changed);
    }
    // The machine changes; the watch asks for a review. Its turn alone
    // decides (direct, against the ring's two turns ahead before), and
    // one more turn follows at once.
    t.stale();
    run_stretch(&mut t, |c| [2.0, 3.0, 1.0][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!(
        (a.pick.algorithm, a.pick.us, a.changed, a.moved, a.unsettled),
        (Algorithm::Direct, 1e6, true, true, true)
    );
    // The follow-up decides on the two turns since the change: direct
    // ahead in both stays, settled; its time the higher of the two.
    run_stretch(&mut t, |c| [2.0, 3.0, 1.5][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!(
        (a.pick.algorithm, a.pick.us, a.changed, a.unsettled),
        (Algorithm::Direct, 1.5e6, false, false)
    );
    // A review the watch asked for that keeps the pick is unsettled
    // too; its follow-up decides on the two turns since the change,
    // where another must be ahead in both (the ring, 20% ahead in the
    // second only, does not move it), and is settled.
    t.stale();
    run_stretch(&mut t, |c| [2.0, 3.0, 1.0][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!(
        (a.pick.algorithm, a.changed, a.unsettled),
        (Algorithm::Direct, false, true)
    );
    run_stretch(&mut t, |c| [1.0, 3.0, 1.2][c]);
    let a = t.agreed(&t.means_us());
    assert_eq!(
        (a.pick.algorithm, a.changed, a.unsettled),
        (Algorithm::Direct, false, false)
    );
}

/// Ends windows with these agreed means, none of which asks for a
/// review.
fn quiet(w: &mut Watch, windows: &[f64]) {
    for &us in windows {
        assert!(!w.agreed(us), "{us}");
    }
}

#[test]
fn a_watch_reviews_when_the_pick_slows_or_speeds_by_a_quarter() {
    let bytes = 1 << 20;
    let mut w = Watch::new(bytes, 1.0);
    let window = WATCH_WINDOW * TURNS * trials(bytes).1;
    assert_eq!(window, 60);
    // Decided at 100 us a call: the baseline.
    w.restart(100.0, true, false);
    for i in 0..window {
        assert_eq!(w.add(100e-6), i == window - 1);
    }
    assert!((w.mean_us() - 100.0).abs() < 1e-9);
    // Within a quarter either way: no review; the agreed mean counts,
    // not this rank's.
    for us in [100.0, 124.0, 81.0, 100.0, 124.0] {
        for _ in 0..window {
            w.add(500e-6);
        }
        assert!(!w.agreed(us), "{us}");
    }
    // One window slower by more than a quarter, then one within: no
    // review (noise).
    assert!(!w.agreed(126.0));
    assert!(!w.agreed(110.0));
    // Two in a row, slower then faster: review.
    assert!(!w.agreed(130.0));
    assert!(w.agreed(79.0));
    // The review keeps the pick, decided at 100 us again: the calls
    // run at another speed than the trials, so the next window (130)
    // is the baseline, and 130 and 150 are within a quarter of it.
    w.restart(100.0, true, false);
    quiet(&mut w, &[130.0, 130.0, 150.0, 130.0]);
    // Faster by more than a quarter (100 over 130), twice: review.
    quiet(&mut w, &[100.0]);
    assert!(w.agreed(100.0));
    // This time the review changes the pick: its trial time (50) is
    // the baseline.
    w.restart(50.0, false, false);
    assert!(!w.agreed(70.0));
    assert!(w.agreed(70.0));
    // That review changes the pick again (to one at 60 us); then a
    // review that was due (not the watch's) keeps it: its trial time
    // is the baseline, and a moved window before it does not count.
    w.restart(60.0, false, false);
    assert!(!w.agreed(30.0));
    w.add(1.0);
    w.restart(100.0, true, false);
    assert!(!w.agreed(30.0));
    assert!(w.agreed(30.0));
    // The watch's review is unsettled and keeps the pick, and so does
    // its follow-up: the next window (30) is the baseline.
    w.restart(100.0, true, true);
    w.restart(100.0, true, false);
    quiet(&mut w, &[30.0, 30.0, 36.0, 36.0, 60.0]);
    assert!(w.agreed(60.0));
    // This time the review changes the pick and the follow-up keeps
    // the new one: its time in the turns since the change (70) is the
    // baseline.
    w.restart(50.0, false, true);
    w.restart(70.0, true, false);
    assert!(!w.agreed(80.0));
    assert!(!w.agreed(100.0));
    assert!(w.agreed(100.0));
}

#[test]
fn a_watch_window_spans_at_least_its_seconds_where_ranks_share_cores() {
    let bytes = 1 << 20;
    let calls = WATCH_WINDOW * TURNS * trials(bytes).1;
    assert_eq!(Watch::new(bytes, 0.5).window, calls);
    // A core per rank: the calls' count, however quick the calls.
    let mut w = Watch::new(bytes, 1.0);
    w.restart(8.0, false, false);
    assert_eq!(w.window, calls);
    let mut w = Watch::new(bytes, 0.5);
    // Slow calls: 50 ms of them, fewer than the calls' count (2 ms a
    // call: 25), and at least MIN_TRIALS (40 ms a call: 3, not 2).
    w.restart(2000.0, false, false);
    assert_eq!(w.window, 25);
    w.restart(40_000.0, false, false);
    assert_eq!(w.window, MIN_TRIALS);
    // Quick ones: 50 ms of them (8 us a call: 6250 calls).
    w.restart(8.0, false, false);
    assert_eq!(
        w.window,
        (WATCH_MIN_SECS_SHARED * 1e6 / 8.0).ceil() as usize
    );
    assert_eq!(w.window, 6250);
    // A time that went wrong (0, not a number): the calls' count.
    for us in [0.0, f64::NAN, -1.0] {
        w.restart(us, false, false);
        assert_eq!(w.window, calls, "{us}");
    }
}

#[test]
fn candidates_spread_wider_and_fewer_where_ranks_share_cores() {
    assert_eq!(spread(1.0), (SPREAD, MAX_CANDIDATES));
    assert_eq!(spread(0.5), SPREAD_SHARED);
    assert!(SPREAD_SHARED.0 > SPREAD && SPREAD_SHARED.1 < MAX_CANDIDATES);
}

#[test]
fn reviews_come_sooner_where_ranks_share_cores() {
    assert_eq!(review_gaps(1.0, false), (REVIEW_GAP, REVIEW_GAP_MAX));
    assert_eq!(review_gaps(0.5, false), REVIEW_GAPS_SHARED);
    // A streaming pick's reviews never spread out.
    assert_eq!(review_gaps(1.0, true), (REVIEW_GAP, REVIEW_GAP));
    assert!(REVIEW_GAPS_SHARED.0 < REVIEW_GAP && REVIEW_GAPS_SHARED.1 < REVIEW_GAP_MAX);
}

#[test]
fn calls_spent_tuning_are_bounded() {
    // Small calls: many (at most 85 timed a block), large ones few
    // (at least 3).
    assert_eq!(trials(8), (22, 85));
    assert_eq!(trials(64 << 10), (22, 85));
    assert_eq!(trials(6 << 20), (1, 3));
    assert_eq!(max_calls(64 << 20), (TURNS * (MAX_CANDIDATES + 1) + 1) * 4);
    for bytes in [0, 8, 100 << 10, 1 << 20, 5 << 20, 1 << 30] {
        let mut t = Trials::new(cands(), bytes);
        let n = run_stretch(&mut t, |_| 1.0);
        let (lead, per) = trials(bytes);
        assert_eq!(n, (TURNS * 3 + 1) * (lead + per), "{bytes}");
        assert!(n <= max_calls(bytes));
    }
}
