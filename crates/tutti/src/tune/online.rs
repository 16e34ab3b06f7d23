//! Online tuning: Auto times the algorithms the cost model cannot tell
//! apart on the first calls of each call shape, and keeps the fastest.
//!
//! The cost model ranks algorithms well where every rank has its own core.
//! Where ranks share cores (4 ranks on 2) its times were several times the
//! measured ones, and the fastest algorithm changed from one launch to the
//! next by more than 10% as the scheduler placed the ranks differently
//! (`docs/algorithms.md`): no fixed choice is right there. A training loop
//! makes the same calls thousands of times, so a few calls per shape spent
//! measuring are cheap, and the measurement is of this launch.
//!
//! For a shape first seen (collective, rank count, count, roots, hosts,
//! element type; not the buffers, nor whether a rank runs in place), the
//! engine asks the tuner for [`candidates`](super::candidates): the model's
//! pick first, then the others priced within [`SPREAD`] of the cheapest, at
//! most [`MAX_CANDIDATES`]. With one candidate there is nothing to try.
//! Otherwise, with k candidates and t = [`trials`] per candidate:
//!
//! ```text
//!   call 0            the model's pick, untimed (first touch, schedules)
//!   calls 1 ..= k*t   candidate (i - 1) mod k, timed: round robin, so
//!                     drift hits every candidate alike
//!   then              each rank takes the median of its times per
//!                     candidate; one AllReduce (max) of those k numbers;
//!                     the least wins, the model's pick unless another is
//!                     faster by more than KEEP_MODEL
//! ```
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

/// Below this many bytes per call, [`trials`] gives more timed calls per
/// candidate: small calls are cheap and their single times noisier.
const SMALL_BYTES: usize = 1 << 20;

/// Another candidate replaces the model's pick only when faster by more
/// than this fraction: between near-equal candidates, keep what the model
/// would pick (less churn from noise).
pub const KEEP_MODEL: f64 = 0.03;

/// Timed calls per candidate for a call of `bytes` bytes (count x element
/// size, as the engine counts a call's bytes).
pub fn trials(bytes: usize) -> usize {
    if bytes < SMALL_BYTES {
        5
    } else {
        3
    }
}

/// The most calls a shape of `bytes` bytes spends tuning (untimed first
/// call included): after this many, Auto runs its decision.
pub fn max_calls(bytes: usize) -> usize {
    1 + MAX_CANDIDATES * trials(bytes)
}

/// A shape's trials so far.
#[derive(Clone, Debug)]
pub(crate) struct Trials {
    cands: Vec<Choice>,
    per: usize,
    calls: usize,
    /// Seconds per timed call, per candidate.
    times: Vec<Vec<f64>>,
}

impl Trials {
    /// Trials of `cands` (the model's pick first; at least two) for calls
    /// of `bytes` bytes.
    pub(crate) fn new(cands: Vec<Choice>, bytes: usize) -> Trials {
        debug_assert!(cands.len() >= 2);
        let per = trials(bytes);
        Trials {
            times: vec![Vec::with_capacity(per); cands.len()],
            cands,
            per,
            calls: 0,
        }
    }

    /// What the next call runs, and whether it is timed.
    pub(crate) fn next(&self) -> (Choice, bool) {
        match self.calls {
            0 => (self.cands[0], false),
            i => (self.cands[(i - 1) % self.cands.len()], true),
        }
    }

    /// Records the call just made (`secs`: its time on this rank, used if
    /// it was timed). True once every candidate has its timed calls.
    pub(crate) fn record(&mut self, secs: f64) -> bool {
        if self.calls > 0 {
            let k = (self.calls - 1) % self.cands.len();
            self.times[k].push(secs);
        }
        self.calls += 1;
        self.calls > self.cands.len() * self.per
    }

    /// The median of this rank's times per candidate, in microseconds.
    pub(crate) fn medians_us(&self) -> Vec<f64> {
        self.times
            .iter()
            .map(|v| {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).map_or(f64::INFINITY, |s| s * 1e6)
            })
            .collect()
    }

    /// The candidates, the model's pick first.
    pub(crate) fn candidates(&self) -> &[Choice] {
        &self.cands
    }
}

/// The winner among `cands` (the model's pick first) given `us[i]`, the
/// time of candidate `i` (the maximum over ranks of each rank's median).
/// The `us` of the result is the measured time.
pub(crate) fn decide(cands: &[Choice], us: &[f64]) -> Choice {
    let best = (0..cands.len())
        .min_by(|&a, &b| us[a].total_cmp(&us[b]))
        .unwrap_or(0);
    let i = if us[0] <= us[best] * (1.0 + KEEP_MODEL) {
        0
    } else {
        best
    };
    Choice {
        us: us[i],
        ..cands[i]
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
    fn trials_go_round_robin_after_an_untimed_first_call() {
        let mut t = Trials::new(cands(), 64);
        let per = trials(64);
        assert_eq!(t.next(), (cands()[0], false));
        assert!(!t.record(99.0));
        let mut seen = Vec::new();
        for i in 0..3 * per {
            let (c, timed) = t.next();
            assert!(timed);
            seen.push(c.algorithm);
            // Candidate k takes 10 + k seconds, the last call of each 1000.
            let k = i % 3;
            let secs = if i / 3 == per - 1 {
                1000.0
            } else {
                10.0 + k as f64
            };
            assert_eq!(t.record(secs), i == 3 * per - 1, "call {i}");
        }
        assert_eq!(
            &seen[..3],
            &[Algorithm::Ring, Algorithm::Tree, Algorithm::Direct]
        );
        assert_eq!(&seen[3..6], &seen[..3]);
        // The untimed call and the outliers do not count.
        assert_eq!(t.medians_us(), vec![10e6, 11e6, 12e6]);
    }

    #[test]
    fn decision_keeps_the_models_pick_unless_clearly_beaten() {
        let c = cands();
        let d = decide(&c, &[100.0, 98.0, 99.0]);
        assert_eq!((d.algorithm, d.us), (Algorithm::Ring, 100.0));
        let d = decide(&c, &[100.0, 90.0, 95.0]);
        assert_eq!((d.algorithm, d.us), (Algorithm::Tree, 90.0));
        let d = decide(&c, &[f64::INFINITY, 90.0, 80.0]);
        assert_eq!(d.algorithm, Algorithm::Direct);
    }

    #[test]
    fn calls_spent_tuning_are_bounded() {
        assert_eq!(max_calls(8), 1 + MAX_CANDIDATES * 5);
        assert_eq!(max_calls(64 << 20), 1 + MAX_CANDIDATES * 3);
        let mut t = Trials::new(cands(), 8);
        let mut n = 0;
        while !t.record(1.0) {
            n += 1;
        }
        assert!(n < max_calls(8));
    }
}
