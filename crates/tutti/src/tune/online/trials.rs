//! Trials: which candidates are tried ([`spread`]), how many calls a
//! candidate's block runs ([`trials`]), and a shape's [`Trials`]: the
//! turns, their times, and the decisions made on them.

use super::review::{decide, history_turns, paired, upper_median, RESET_GAIN};
use super::{by_share, Choice};

/// Candidates priced within this factor of the cheapest are tried.
pub const SPREAD: f64 = 2.0;

/// At most this many algorithms per shape (the model's pick included);
/// the pick's streaming twin ([`crate::tune::STREAM_MIN_BYTES`]) may come
/// on top.
pub const MAX_CANDIDATES: usize = 5;

/// [`SPREAD`] and [`MAX_CANDIDATES`] where ranks share cores (more ranks on
/// a host than it has CPUs). There the model prices a schedule as if each
/// rank ran on its share of a core, but a rank that waits sleeps and leaves
/// its core to the others, so a schedule whose work falls on few ranks runs
/// faster than priced: 4 ranks on 2 cores, Reduce of 64 MiB, direct (the
/// root reduces the three others' data) priced over twice the ring's
/// time, and forced, it ran at 0.83-0.87x the time of the tree or ring
/// that Auto kept in three runs (2026-12-03). A wider spread lets the
/// trials measure it. Fewer at most: every candidate costs a block of
/// calls at each review, and reviews come more often there
/// ([`REVIEW_GAPS_SHARED`](super::REVIEW_GAPS_SHARED)); the cheapest four keep AllReduce's
/// candidates at 4 ranks as [`SPREAD`] chose them (the tree, priced within
/// four times, was the slowest forced at every size from 64 KiB to 64
/// MiB).
pub const SPREAD_SHARED: (f64, usize) = (4.0, 4);

/// How far from the cheapest price a candidate may be, and how many
/// candidates at most, as `cpu_share` (the CPUs a rank has on its host,
/// [`crate::tune::TuneCtx::cpu_share`]) says.
pub fn spread(cpu_share: f64) -> (f64, usize) {
    by_share(cpu_share, (SPREAD, MAX_CANDIDATES), SPREAD_SHARED)
}

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
/// The candidates take turns this many times before the first decision,
/// each turn a block of calls in a row, so that every candidate's calls
/// spread over the whole trial (named `ROUNDS` before 2026-12-01: it
/// counts turns); every decision looks at the last this many turns.
pub const TURNS: usize = 3;

/// What a stretch's end decided ([`Trials::agreed`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Agreed {
    /// The pick, its `us` the median of its times in the turns decided on
    /// (of two, the higher).
    pub pick: Choice,
    /// Turns in the stretch that ended.
    pub turns: usize,
    /// A review changed the pick.
    pub changed: bool,
    /// A review changed the pick to one faster by more than
    /// [`RESET_GAIN`].
    pub moved: bool,
    /// A review kept the pick, but in its turn another candidate was
    /// faster than the pick by more than [`RESET_GAIN`] (and the review was
    /// not itself such a follow-up): one more turn, at the shape's next
    /// call, with the gap to the review after it left as it was.
    pub unsettled: bool,
}

/// Untimed and timed calls in a candidate's block (one per turn) for a
/// call of `bytes` bytes (count x element size, as the engine counts a
/// call's bytes): over the [`TURNS`] turns, the timed ones move about
/// [`TRIAL_BYTES`] (from [`MIN_TRIALS`] to [`MAX_TRIALS`] a block); a
/// quarter as many (at least one) lead in untimed.
pub fn trials(bytes: usize) -> (usize, usize) {
    let timed = (TRIAL_BYTES / TURNS / bytes.max(1)).clamp(MIN_TRIALS, MAX_TRIALS);
    (timed.div_ceil(4), timed)
}

/// The most calls a shape of `bytes` bytes spends tuning before its first
/// decision: after this many, Auto runs its pick (until a review).
pub fn max_calls(bytes: usize) -> usize {
    let (lead, timed) = trials(bytes);
    (TURNS * (MAX_CANDIDATES + 1) + 1) * (lead + timed)
}

/// A shape's trials: the first stretch (a warm-up block, then [`TURNS`]
/// turns), the decision, then stretches of one turn each (reviews), each
/// followed by a decision on the last [`history_turns`] turns.
#[derive(Clone, Debug)]
pub(crate) struct Trials {
    cands: Vec<Choice>,
    /// Untimed calls in a block, before its timed ones.
    lead: usize,
    /// Timed calls in a block.
    per: usize,
    /// Turns in the stretches before (each turn starts one candidate on).
    turns_before: usize,
    /// Calls made in the current stretch.
    calls: usize,
    /// Seconds of timed calls in the current stretch, per turn and
    /// candidate (`turn * k + c`).
    secs: Vec<f64>,
    /// The agreed times (us) of the last [`history_turns`] turns, oldest
    /// first, `turn * k + c`.
    history: Vec<f64>,
    /// The decided candidate (its index) and its median time over
    /// `history`.
    pick: Option<(usize, f64)>,
    /// Decisions after the first.
    reviews: usize,
    /// The current stretch follows an unsettled decision
    /// ([`Agreed::unsettled`]).
    follow_up: bool,
    /// The turns before the current stretch are stale: the watch saw the
    /// pick's time move ([`Trials::stale`]).
    stale: bool,
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
            turns_before: 0,
            calls: 0,
            history: Vec::new(),
            pick: None,
            reviews: 0,
            follow_up: false,
            stale: false,
        }
    }

    /// The next call's turn (in the stretch), candidate (its index) and
    /// whether it is timed. Turn t starts with candidate t (mod k), counting
    /// the turns of earlier stretches: each candidate takes each place in
    /// the order alike (the first block of a turn follows the switch from
    /// the last one, or whatever ran before). The first stretch starts with
    /// one block's worth of untimed calls of the model's pick (warm-up).
    fn place(&self) -> (usize, usize, bool) {
        let k = self.cands.len();
        let block = self.lead + self.per;
        let calls = if self.first() {
            match self.calls.checked_sub(block) {
                Some(c) => c,
                None => return (0, 0, false),
            }
        } else {
            self.calls
        };
        let turn = calls / (k * block);
        let j = calls % (k * block);
        let c = (self.turns_before + turn + j / block) % k;
        (turn, c, j % block >= self.lead)
    }

    /// Whether the next call starts a block (or a stretch): the engine
    /// then asks for its candidate, where within a block the calls reuse
    /// the plan of the block's first.
    pub(crate) fn at_block_start(&self) -> bool {
        self.calls.is_multiple_of(self.lead + self.per)
    }

    /// What the next call runs, and whether it is timed.
    pub(crate) fn next(&self) -> (Choice, bool) {
        let (_, c, timed) = self.place();
        (self.cands[c], timed)
    }

    /// Whether the current stretch is the first (a warm-up block, then
    /// [`TURNS`] turns), before any decision; later ones are reviews.
    fn first(&self) -> bool {
        self.pick.is_none()
    }

    /// Turns in the current stretch: [`TURNS`] in the first, one in a review.
    fn turns(&self) -> usize {
        if self.first() {
            TURNS
        } else {
            1
        }
    }

    /// Whether the current stretch has not begun.
    pub(crate) fn fresh(&self) -> bool {
        self.calls == 0
    }

    /// Records the call just made (`secs`: its time on this rank, used if
    /// it was timed). True once every candidate has its timed calls in this
    /// stretch: the ranks then agree on [`means_us`](Trials::means_us) and
    /// pass the result to [`agreed`](Trials::agreed).
    pub(crate) fn record(&mut self, secs: f64) -> bool {
        let (turn, c, timed) = self.place();
        if timed {
            self.secs[turn * self.cands.len() + c] += secs;
        }
        self.calls += 1;
        let blocks = usize::from(self.first()) + self.turns() * self.cands.len();
        self.calls == blocks * (self.lead + self.per)
    }

    /// This rank's mean time per call of each candidate in each turn of the
    /// stretch, in microseconds (`turn * k + candidate`). The mean, not
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

    /// Ends the stretch with `us`, its times as the ranks agreed on them
    /// (the maximum over ranks of [`means_us`](Trials::means_us)): decides
    /// on the last [`history_turns`] turns, against the current pick (the
    /// model's at first), and makes the next stretch a review of one turn.
    pub(crate) fn agreed(&mut self, us: &[f64]) -> Agreed {
        let k = self.cands.len();
        let stretch = self.turns();
        let stale = std::mem::take(&mut self.stale);
        if stale {
            self.history.clear();
        }
        self.history.extend_from_slice(us);
        let keep = history_turns(k) * k;
        if self.history.len() > keep {
            self.history.drain(..self.history.len() - keep);
        }
        let before = self.pick.map(|p| p.0);
        let best = decide(&self.history, k, before.unwrap_or(0));
        // The pick's time: the median over the turns (of two, the higher),
        // which a turn from before a change of the machine does not move.
        self.pick = Some((best, upper_median(self.times(best))));
        self.reviews += usize::from(before.is_some());
        self.turns_before += stretch;
        self.calls = 0;
        self.secs = vec![0.0; k];
        let changed = before.is_some_and(|b| b != best);
        let moved =
            before.is_some_and(|b| paired(&self.history, k, best, b) * (1.0 + RESET_GAIN) < 1.0);
        // A review's turn alone against the pick: a clear loss there is
        // either noise or a machine that changed since the turns before,
        // and one more turn tells which (two of the last three turns).
        // Not the first decision: its turns ran back to back.
        let last = &self.history[self.history.len() - k..];
        let lost = (0..k).any(|c| last[c] * (1.0 + RESET_GAIN) < last[best]);
        let unsettled = before.is_some() && (stale || !changed && !self.follow_up && lost);
        self.follow_up = unsettled;
        Agreed {
            pick: self.decided().expect("just decided"),
            turns: stretch,
            changed,
            moved,
            unsettled,
        }
    }

    /// The machine changed since the turns decided on (the watch saw the
    /// pick's time move): the next review decides on its own turn alone,
    /// and is unsettled (one more turn follows, decided on the two).
    pub(crate) fn stale(&mut self) {
        self.stale = !self.first();
    }

    /// The decision, once there is one; its `us` is the winner's median
    /// time over the turns it was decided on (of two, the higher).
    pub(crate) fn decided(&self) -> Option<Choice> {
        self.pick.map(|(c, us)| Choice {
            us,
            ..self.cands[c]
        })
    }

    /// Decisions after the first.
    pub(crate) fn reviews(&self) -> usize {
        self.reviews
    }

    /// The pick's best time (us) in the turns decided on: the pace
    /// [`review_floor`] takes for its calls between reviews.
    pub(crate) fn pace_us(&self) -> Option<f64> {
        let (best, _) = self.pick?;
        self.times(best).min_by(f64::total_cmp)
    }

    /// Candidate `c`'s agreed times in the turns of `history`, oldest first.
    fn times(&self, c: usize) -> impl Iterator<Item = f64> + '_ {
        self.history
            .iter()
            .skip(c)
            .step_by(self.cands.len())
            .copied()
    }

    /// Calls in a turn: a block of each candidate.
    pub(crate) fn turn_calls(&self) -> usize {
        self.cands.len() * (self.lead + self.per)
    }

    /// The candidates, the model's pick first.
    pub(crate) fn candidates(&self) -> &[Choice] {
        &self.cands
    }
}
