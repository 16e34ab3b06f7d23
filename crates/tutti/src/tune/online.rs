//! Online tuning: Auto times the algorithms the cost model cannot tell
//! apart on the first calls of each call shape, and keeps the fastest.
//!
//! The cost model ranks algorithms well where every rank has its own core.
//! Where ranks share cores (4 ranks on 2) its times were several times the
//! measured ones, and the fastest algorithm changed from one launch to the
//! next by more than 10% as the scheduler placed the ranks differently
//! (`docs/algorithms.md`): no fixed choice is right there. A training loop
//! makes the same calls thousands of times, so some calls per shape spent
//! measuring are cheap, and the measurement is of this launch.
//!
//! For a shape first seen (collective, rank count, count, roots, hosts,
//! element type; not the buffers, nor whether a rank runs in place), the
//! engine asks the tuner for candidates (`tune::candidates`): the model's
//! pick first, then the others priced within [`SPREAD`] of the cheapest, at
//! most [`MAX_CANDIDATES`]. With one candidate there is nothing to try.
//! Otherwise the candidates take turns, [`TURNS`] times, turn t starting
//! with candidate t (the model's pick first in the first); in its turn a
//! candidate runs a block of calls in a row, with (l, t) = [`trials`] for
//! the call's size:
//!
//! ```text
//!   l calls        untimed (first touch, schedule, and the ranks settling
//!                  after the switch from the last candidate)
//!   t calls        timed
//!   after TURNS    each rank takes the mean of its times per candidate and
//!   x k (l + t)    turn; one AllReduce (max) of those k x TURNS numbers;
//!   calls          a candidate's score is the median over turns of its time
//!                  over the model's pick's in the same turn; the least
//!                  wins, the model's pick unless another is faster by
//!                  more than KEEP_MODEL
//! ```
//!
//! The timed calls of a candidate move about 32 MiB in all (9 to 255
//! calls), the untimed ones a quarter as many. Few calls measure the wrong
//! thing where ranks share cores: they take many calls to fall into the
//! rhythm in which they hand the cores to each other. 4 ranks on 2 cores,
//! Reduce of 64 KiB, whose ring ran at 10.5 us a call in a loop: trials
//! taking turns call by call (5 each) measured the ring at 714 us; in a row
//! after one untimed call (5 each), 90 us; 256 in a row after 64 untimed,
//! 5.7 us. The small calls that need many cost little: 4 x 320 calls of
//! 64 KiB at the 6-82 us each measured there. The turns spread each
//! candidate's calls over the trial: this machine slows down 3-5x for
//! seconds at a time (2 ranks, AllReduce of 1 MiB, means of 50 calls:
//! 69-99 us in one launch, 334-479 us in another, 123-218 us and then
//! 302-400 us in a third), and a candidate timed in one block only could fall in a
//! slow stretch (4 ranks, Reduce of 64 MiB, one block of 3 calls each:
//! the ring timed at 25.2 ms in one run and 39.9 ms in the next). Scoring
//! by turn cancels a slow stretch that spans a turn; the median drops a
//! turn that one only partly covered. The rotating order keeps the first
//! block of a turn from always being the same candidate's: with the model's
//! pick first in every turn, 2 ranks, ReduceScatter of 16 and 64 MiB, the
//! ring's means were 1.09-1.69x halving-doubling's in four runs, where in
//! a loop the two ran within 10% of each other.
//!
//! Every rank sees the same shapes in the same order and prices them alike
//! (that is what lets the model choose without talking), so every rank
//! tries the same algorithm on the same call, and the AllReduce gives every
//! rank the same numbers to decide from. The time a rank measures for a
//! call includes its waits for the others; the maximum over ranks is what
//! `tutti perf` reports as a call's time.

use super::Choice;

/// Candidates priced within this factor of the cheapest are tried.
pub const SPREAD: f64 = 2.0;

/// At most this many candidates per shape (the model's pick included).
pub const MAX_CANDIDATES: usize = 4;

/// Each candidate's timed calls move about this many bytes in all (at
/// least [`MIN_TRIALS`] calls a turn, at most [`MAX_TRIALS`]): small calls
/// need many to reach the rhythm they keep in a loop, and cost little.
pub const TRIAL_BYTES: usize = 32 << 20;
/// Fewest timed calls per candidate and turn. With one, a turn's time was
/// one call's, and one call of a large shape varies too much here (2 ranks,
/// ReduceScatter of 16 MiB, one timed call a turn: the ring's mean 5.07 ms
/// and 3.80 ms in two runs where it ran 2.4-2.6 ms a call in the loop).
pub const MIN_TRIALS: usize = 3;
/// Most timed calls per candidate and turn.
pub const MAX_TRIALS: usize = 85;
/// The candidates take turns this many times, each turn a block of calls
/// in a row, so that every candidate's calls spread over the whole trial
/// (named `ROUNDS` before 2026-12-01: it counts turns).
pub const TURNS: usize = 3;

/// Another candidate replaces the model's pick only when faster by more
/// than this fraction: between near-equal candidates, keep what the model
/// would pick (less churn from noise).
pub const KEEP_MODEL: f64 = 0.03;

/// Untimed and timed calls in a candidate's block (one per turn) for a
/// call of `bytes` bytes (count x element size, as the engine counts a
/// call's bytes): over the [`TURNS`] turns, the timed ones move about
/// [`TRIAL_BYTES`] (from [`MIN_TRIALS`] to [`MAX_TRIALS`] a block); a
/// quarter as many (at least one) lead in untimed.
pub fn trials(bytes: usize) -> (usize, usize) {
    let timed = (TRIAL_BYTES / TURNS / bytes.max(1)).clamp(MIN_TRIALS, MAX_TRIALS);
    (timed.div_ceil(4), timed)
}

/// The most calls a shape of `bytes` bytes spends tuning: after this many,
/// Auto runs its decision.
pub fn max_calls(bytes: usize) -> usize {
    let (lead, timed) = trials(bytes);
    (TURNS * MAX_CANDIDATES + 1) * (lead + timed)
}

/// A shape's trials so far.
#[derive(Clone, Debug)]
pub(crate) struct Trials {
    cands: Vec<Choice>,
    /// Untimed calls in a block, before its timed ones.
    lead: usize,
    /// Timed calls in a block.
    per: usize,
    calls: usize,
    /// Seconds of timed calls, per turn and candidate (`turn * k + c`).
    secs: Vec<f64>,
}

impl Trials {
    /// Trials of `cands` (the model's pick first; at least two) for calls
    /// of `bytes` bytes.
    pub(crate) fn new(cands: Vec<Choice>, bytes: usize) -> Trials {
        debug_assert!(cands.len() >= 2);
        let (lead, per) = trials(bytes);
        Trials {
            secs: vec![0.0; TURNS * cands.len()],
            cands,
            lead,
            per,
            calls: 0,
        }
    }

    /// The next call's turn, candidate (its index) and whether it is timed.
    /// Turn t starts with candidate t (mod k): each candidate takes each
    /// place in the order alike (the first block of a turn follows the
    /// switch from the last one, or whatever ran before the trials).
    /// Before the turns, one block's worth of untimed calls of the model's
    /// pick warms up.
    fn place(&self) -> (usize, usize, bool) {
        let k = self.cands.len();
        let block = self.lead + self.per;
        let Some(calls) = self.calls.checked_sub(block) else {
            return (0, 0, false);
        };
        let turn = calls / (k * block);
        let j = calls % (k * block);
        (turn, (turn + j / block) % k, j % block >= self.lead)
    }

    /// What the next call runs, and whether it is timed.
    pub(crate) fn next(&self) -> (Choice, bool) {
        let (_, c, timed) = self.place();
        (self.cands[c], timed)
    }

    /// Records the call just made (`secs`: its time on this rank, used if
    /// it was timed). True once every candidate has its timed calls.
    pub(crate) fn record(&mut self, secs: f64) -> bool {
        let (turn, c, timed) = self.place();
        if timed {
            self.secs[turn * self.cands.len() + c] += secs;
        }
        self.calls += 1;
        self.calls == (TURNS * self.cands.len() + 1) * (self.lead + self.per)
    }

    /// This rank's mean time per call of each candidate in each turn, in
    /// microseconds, turn by turn (`turn * k + candidate`). The mean, not
    /// the median: a loop's time per call is the mean, and where a rank
    /// runs ahead of its peers (a root posting into the mailboxes) most
    /// calls are quick and a few wait long; the median missed those waits
    /// (Broadcast and Reduce of 256 KiB, 4 ranks on 2 cores: direct kept in
    /// two runs at 1.21-1.27x the best forced time).
    pub(crate) fn means_us(&self) -> Vec<f64> {
        self.secs
            .iter()
            .map(|s| s / self.per as f64 * 1e6)
            .collect()
    }

    /// The candidates, the model's pick first.
    pub(crate) fn candidates(&self) -> &[Choice] {
        &self.cands
    }
}

/// The winner among `cands` (the model's pick first) given `us`, the time
/// per call of each candidate in each turn (`turn * k + candidate`; the
/// maximum over ranks of each rank's mean). Paired by turn: a candidate's
/// score is the median over turns of its time over the model's pick's in
/// that turn, so that a slow stretch of the machine, which slows a whole
/// turn, cancels. The least score wins; the model's pick (score 1) unless
/// another is faster by more than [`KEEP_MODEL`]. The `us` of the result
/// is the winner's mean time over the turns.
pub(crate) fn decide(cands: &[Choice], us: &[f64]) -> Choice {
    let k = cands.len();
    let turns = us.len() / k;
    let score = |c: usize| {
        let mut r: Vec<f64> = (0..turns)
            .map(|t| us[t * k + c] / us[t * k])
            .map(|x| if x.is_nan() { f64::INFINITY } else { x })
            .collect();
        r.sort_by(f64::total_cmp);
        r[turns / 2]
    };
    let best = (1..k)
        .map(|c| (c, score(c)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|&(_, x)| x * (1.0 + KEEP_MODEL) < 1.0)
        .map_or(0, |(c, _)| c);
    let mean = (0..turns).map(|t| us[t * k + best]).sum::<f64>() / turns as f64;
    Choice {
        us: mean,
        ..cands[best]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algorithm;

    fn cands() -> Vec<Choice> {
        [Algorithm::Ring, Algorithm::Tree, Algorithm::Direct]
            .into_iter()
            .map(|algorithm| Choice {
                algorithm,
                chunks: 1,
                us: 1.0,
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
    fn decision_is_paired_by_turn_and_keeps_the_models_pick_unless_clearly_beaten() {
        let c = cands();
        // Near-equal in every turn: the model's pick stays.
        let d = decide(&c, &[100.0, 98.0, 99.0, 200.0, 196.0, 198.0]);
        assert_eq!((d.algorithm, d.us), (Algorithm::Ring, 150.0));
        // Tree 10% faster in every turn, though its times in a slow second
        // turn exceed everything in the first: paired, it wins.
        let d = decide(
            &c,
            &[100.0, 90.0, 95.0, 300.0, 270.0, 290.0, 100.0, 90.0, 95.0],
        );
        assert_eq!((d.algorithm, d.us), (Algorithm::Tree, 150.0));
        // One turn where direct looks fast does not make it win: the median
        // of its ratios (1.2, 0.5, 1.2) is 1.2.
        let d = decide(
            &c,
            &[100.0, 101.0, 120.0, 100.0, 101.0, 50.0, 100.0, 101.0, 120.0],
        );
        assert_eq!(d.algorithm, Algorithm::Ring);
        // Not a number (a time that went wrong) never wins.
        let d = decide(
            &c,
            &[
                f64::NAN,
                f64::NAN,
                80.0,
                100.0,
                90.0,
                80.0,
                100.0,
                90.0,
                80.0,
            ],
        );
        assert_eq!(d.algorithm, Algorithm::Direct);
    }

    #[test]
    fn calls_spent_tuning_are_bounded() {
        // Small calls: many (at most 85 timed a block), large ones few
        // (at least 3).
        assert_eq!(trials(8), (22, 85));
        assert_eq!(trials(64 << 10), (22, 85));
        assert_eq!(trials(6 << 20), (1, 3));
        assert_eq!(max_calls(64 << 20), (TURNS * MAX_CANDIDATES + 1) * 4);
        for bytes in [0, 8, 100 << 10, 1 << 20, 5 << 20, 1 << 30] {
            let mut t = Trials::new(cands(), bytes);
            let mut n = 1;
            while !t.record(1.0) {
                n += 1;
            }
            let (lead, per) = trials(bytes);
            assert_eq!(n, (TURNS * 3 + 1) * (lead + per), "{bytes}");
            assert!(n <= max_calls(bytes));
        }
    }
}
