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
//! most [`MAX_CANDIDATES`], and where ranks have a core each the pick with
//! streaming ring stores as well (where they share cores, for large
//! AllToAll and Scatter calls, the pick with direct reads instead). With one
//! candidate there is nothing to try.
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
//! calls), the untimed ones a quarter as many. Within a block the calls
//! reuse the plan of its first through the engine's paths that skip the
//! tuner (the last call's plan, the mailbox repeat), as the candidate's
//! calls would once decided, and each is timed from the start of the
//! engine's run of it; the block's last call makes every rank ask for the
//! next candidate. Few calls measure the wrong
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
//! Then reviews: the fastest candidate can change within a run, seconds
//! after the trials measured it (4 ranks on 2 cores, Reduce of 256 KiB:
//! the tree at 29-32 us a call for 18 rounds of a bench, then 44-52 us,
//! while the ring went back to 33-35), so a decision is not final. Once
//! [`REVIEW_GAP`] times as many of Auto's collectives as a turn spanned
//! have run on the communicator since the decision, the shape's next calls
//! take one more turn (a block of each candidate, no warm-up), the ranks
//! agree on its times as before, and the decision is made again on the
//! last [`TURNS`] turns (four where there are two candidates, so that
//! each ran first in a turn as often as the other, [`history_turns`]),
//! against the current pick (kept unless another is more than
//! [`KEEP_PICK`] faster). Each review that keeps the pick, or
//! changes it for one less than [`RESET_GAIN`] faster, doubles the gap to
//! the next, up to [`REVIEW_GAP_MAX`] (where the pick is a streaming
//! twin, which the watch below cannot see overtaken, the gap stays at
//! [`REVIEW_GAP`]: [`REVIEW_GAP_MAX_STREAM`]); one that changes it for
//! more resets the gap. A review that keeps the pick though its turn
//! alone has another
//! candidate faster than the pick by more than [`RESET_GAIN`] leaves the
//! decision unsettled: one more turn follows at the shape's next call, the
//! gap left as it was, so that a machine that changed since the earlier
//! turns moves the pick after two turns (two of the last three; where
//! four are decided on, after three) rather than after the next gap (4
//! ranks on 2 cores, AllReduce of 64 KiB: a review's turn had halving-doubling
//! at 38.5 us against the ring's 61.5, the median of three kept the ring,
//! and the next review, 4 turns' span later, changed it; Auto ran the ring
//! through half the bench's rounds, 1.26x the best); a follow-up is never
//! followed up. A review is due by the communicator's count of the collectives
//! that left the algorithm to the tuner (calls with an algorithm forced do
//! not count), which every rank keeps alike, so it starts at the same call
//! everywhere (the engine then clears its paths that skip the tuner). What
//! a review costs is the time its other candidates' blocks take beyond the
//! pick's: one turn in every 17 turns' worth of the shape's calls at
//! first, one in 129 after three reviews that kept the pick (3 and 17
//! where ranks share cores, [`review_gaps`]; as a fraction
//! of the shape's own calls, the same where other shapes' Auto calls run
//! between: they stretch the turn's span and the gap alike; forced calls
//! would stretch only the gap). Between reviews, the pick's own calls of
//! [`WATCH_MIN_BYTES`] or more are timed in windows (`Watch`): two
//! windows in a row whose mean (agreed by the ranks) is more than
//! [`WATCH_CHANGE`] away from the pick's time in its trials bring the
//! review forward to the shape's next call, so that a change of the
//! machine is followed within a few windows rather than up to 128 turns'
//! worth of calls later. Such a review decides on its own turn alone (the
//! turns before it ran on the machine before the change) and is unsettled:
//! one more turn follows, and the decision after it is on the two. The
//! pick's time that windows are held against is its median over the turns
//! decided on. `TUTTI_TUNE=once` keeps the first decision (and watches
//! nothing).
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
/// ([`REVIEW_GAPS_SHARED`]); the cheapest four keep AllReduce's
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

/// `own` where every rank has a core (`cpu_share`, the CPUs a rank has on
/// its host, at least 1), `shared` where ranks share cores: the one test
/// behind each parameter online tuning sets apart for shared cores.
fn by_share<T>(cpu_share: f64, own: T, shared: T) -> T {
    if cpu_share < 1.0 {
        shared
    } else {
        own
    }
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

/// Another candidate replaces the current pick (the model's, at first)
/// only when faster by more than this fraction: between near-equal
/// candidates, keep what runs (less churn from noise). Named `KEEP_MODEL`
/// before reviews (2026-12-01).
pub const KEEP_PICK: f64 = 0.03;

/// After a decision, the candidates take one more turn (a review) once
/// this many times as many collectives have run on the communicator as a
/// turn spanned: the review's calls are about 1/17 of the shape's calls.
pub const REVIEW_GAP: u64 = 16;
/// Each review that keeps the pick doubles the gap to the next, up to this
/// many times a turn's span; one that changes it goes back to
/// [`REVIEW_GAP`].
pub const REVIEW_GAP_MAX: u64 = 128;

/// [`REVIEW_GAP`] and [`REVIEW_GAP_MAX`] where ranks share cores (more
/// ranks on a host than it has CPUs): there the fastest algorithm changes
/// more often. `bench/auto_vs_forced.sh 4` (all five collectives, 64 KiB
/// to 64 MiB, 30 cells a run) runs 4-6 forced calls to each of Auto's;
/// while reviews were due by all collectives they came about this often
/// there, and Auto was over 1.10x the best forced time in 15 cells of 6
/// runs; with the gaps counted in Auto's calls alone and (16, 128), in 25
/// of 6 runs alternated with those; with these gaps, 7 of 3 runs against
/// 5 (2026-12-02; the machine's noise is about as large as the
/// differences).
pub const REVIEW_GAPS_SHARED: (u64, u64) = (2, 16);

/// The most turns' spans between reviews where the pick is a streaming
/// twin ([`Choice::stream`]): reviews stay at [`REVIEW_GAP`] apart, never
/// doubling. The watch (`Watch`, [`WATCH_CHANGE`]) holds only the pick's
/// own time, and the streaming twin's hardly moves with the state that
/// moves the cached algorithms' by 3x, so a change that makes them the
/// faster ones shows only at a review: 2 ranks, ReduceScatter of 512 KiB,
/// the bench's rounds had the cached algorithms at 53-61 us for three
/// rounds, 14-18 for the next 13, and 54-60 again, while streaming took
/// 33-46 us in all; the watch fired 11 rounds into the fast stretch, and
/// Auto ran streaming through most of it, 2.11x the best (2026-12-03).
/// Five pairs of runs alternated (2 ranks, AllReduce, AllGather and
/// ReduceScatter of 32 KiB-32 MiB): Auto over its pick forced, in the
/// cells where it picked a streaming twin, averaged 1.165 and 1.114
/// before, 1.011 and 0.815 after (docs/algorithms.md). What it costs: a
/// review's other candidates' blocks beyond the pick's, once in 17 turns'
/// worth of calls (at 1.4x the pick's time there, about 2%).
pub const REVIEW_GAP_MAX_STREAM: u64 = REVIEW_GAP;

/// The gap to the first review and the most between reviews (in turns'
/// spans of Auto's collectives), as `cpu_share` (the CPUs a rank has on
/// its host, [`crate::tune::TuneCtx::cpu_share`]) and whether the pick is
/// a `stream`ing twin ([`REVIEW_GAP_MAX_STREAM`]) say.
pub fn review_gaps(cpu_share: f64, stream: bool) -> (u64, u64) {
    let (first, most) = by_share(cpu_share, (REVIEW_GAP, REVIEW_GAP_MAX), REVIEW_GAPS_SHARED);
    if stream {
        (first, most.min(REVIEW_GAP_MAX_STREAM.max(first)))
    } else {
        (first, most)
    }
}

/// A review that changes the pick brings the gap to the next back to
/// [`REVIEW_GAP`] only where the new pick beats the old by more than this
/// fraction (scored as `decide` scores, paired by turn); a smaller change
/// doubles the gap as a kept pick does. Between candidates within a few
/// percent of each other the pick changes with the noise of the turns,
/// which says nothing of a machine that changed, and resetting on every
/// change kept reviews at their most frequent.
pub const RESET_GAIN: f64 = 0.10;

/// Where ranks share cores, the reviews of a shape under
/// [`WATCH_MIN_BYTES`] come at least this many seconds of its pick's calls
/// apart ([`review_floor`]). A review there costs about a millisecond
/// more than its candidates' own times: each switch between candidates,
/// and the one back to the pick, throws the ranks out of the rhythm they
/// keep in a loop, and calls of a few microseconds run slow for a while
/// (4 ranks on 2 cores, ReduceScatter of 8 B: direct mostly 3.6-5.5 us a
/// call in the reviews' turns, 2.6-4.3 in a loop). Gaps counted in turns' spans
/// alone (2 to 16) brought such a shape's reviews every few milliseconds:
/// `bench/auto_vs_forced.sh 4 reduce_scatter 8 512` had Auto at
/// 1.07-1.13x its own pick forced, with 28-37 reviews in the rounds.
/// Watched shapes keep their gaps: their reviews are what mends a pick the
/// machine left behind, and with this floor on every shape, three runs
/// at 64 KiB-64 MiB had 2, 1 and 1 cells over 1.10 against 1, 0 and 0
/// without (alternated).
pub const REVIEW_MIN_SECS_SHARED: f64 = 0.05;

/// The most turns' spans [`review_floor`] asks for.
pub const REVIEW_FLOOR_MAX: u64 = 256;

/// The fewest turns' spans to a shape's next review: none where every
/// rank has a core (`cpu_share`, as [`spread`] takes it) or for a
/// `watched` shape (the engine watches calls of [`WATCH_MIN_BYTES`] or
/// more); else as many as [`REVIEW_MIN_SECS_SHARED`] of `turn` calls at
/// `pace_us` (the pick's best time in the turns decided on; the ranks
/// agree on it) take, at most [`REVIEW_FLOOR_MAX`].
pub fn review_floor(watched: bool, turn: usize, pace_us: f64, cpu_share: f64) -> u64 {
    let secs = by_share(cpu_share, 0.0, REVIEW_MIN_SECS_SHARED);
    let span = turn as f64 * pace_us;
    if !(span > 0.0 && secs > 0.0) || watched {
        return 0;
    }
    (secs * 1e6 / span).ceil().min(REVIEW_FLOOR_MAX as f64) as u64
}

/// The turns a decision looks at among `k` candidates: the last
/// [`TURNS`], or with fewer candidates than that, up to a multiple of `k`
/// (four for two), so that each ran first in as many of them as the other;
/// with `k` of [`TURNS`] or more, none runs first in two of the last
/// [`TURNS`]. A review's turn starts after calls of the pick alone, and
/// its first block runs at another speed than the rest; with two
/// candidates and three turns, the one that ran first in two of them won:
/// 4 ranks on 2 cores, ReduceScatter of 8 and 32 B, direct (2.6-3.9 us a
/// call forced in a loop) against two-shot (4.2-7.5), in all 25 review
/// turns of two runs the one that ran first in the turn was the faster in
/// it (direct 2.8-4.5 us first, 4.6-10.6 second), the pick changed at
/// every other review, and Auto ran 1.17x direct's time in one of the four
/// cells; with four turns decided on, no review changed the pick in two
/// runs (2026-12-03). An untimed block of the pick before each review's
/// turn did not remove the effect (two runs: the turns alternated as
/// before). Not more turns for more candidates: a decision on five or six
/// turns follows a machine that changed reviews later.
pub fn history_turns(k: usize) -> usize {
    if k < TURNS {
        TURNS.next_multiple_of(k.max(1))
    } else {
        TURNS
    }
}

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

/// Calls of at least this many bytes are watched between reviews (the
/// engine's `Watch`); smaller ones run through the mailboxes, whose
/// repeated calls skip the tuner (and the clock), and take microseconds,
/// in which the clock's reads would weigh.
pub const WATCH_MIN_BYTES: usize = 64 << 10;

/// A watched shape's window holds this many times as many calls as each
/// candidate's timed calls in a decision ([`TURNS`] blocks).
pub const WATCH_WINDOW: usize = 2;

/// A window whose mean time per call differs from the baseline by more
/// than this fraction (either way), twice in a row, brings the next review
/// forward to the shape's next call.
pub const WATCH_CHANGE: f64 = 0.25;

/// Where ranks share cores, a window spans this many seconds of the
/// pick's calls (at the time per call it was decided at; at least
/// [`MIN_TRIALS`] calls) rather than a count of calls.
/// The AllReduce that ends a window makes the ranks wait for each other,
/// and where they share cores that wait costs sleeps, wake-ups and the
/// pipelining of the calls around it: 4 ranks on 2 cores, Reduce of 64
/// KiB, a window of 510 calls (about 4 ms), Auto ran its pick at 1.06-1.20x
/// the pick's forced time in rounds with no review, and at 1.17, 1.27 and
/// 1.17x the best forced algorithm in three runs; with this minimum, 1.03,
/// 1.06 and 1.03 in the runs alternated with them, as without a watch
/// (1.05, 1.01, 1.01; `bench/auto_vs_forced.sh`, 2026-12-03). Large calls
/// need fewer than the count: a window of 18 calls of 64 MiB lasts about
/// 0.5 s, and the bench's rounds of that size give Auto 63 calls in all,
/// in which two windows in a row rarely both moved (Reduce of 64 MiB: the
/// ring, picked at a review, ran 1.17x the best through the rounds, its
/// windows 1.31x and then 1.07x its baseline, no review; 50 ms is about
/// one window a round there, 2026-12-03).
pub const WATCH_MIN_SECS_SHARED: f64 = 0.05;

/// The calls a watch window holds for calls of `bytes` bytes decided at
/// `us` a call, as `cpu_share` (the CPUs a rank has on its host,
/// [`crate::tune::TuneCtx::cpu_share`]) says: [`WATCH_WINDOW`] x
/// [`TURNS`] x the timed calls of a block, and where ranks share cores
/// [`WATCH_MIN_SECS_SHARED`] of calls at `us`, at least [`MIN_TRIALS`]
/// (where `us` is a time; every rank has the same, agreed on).
pub fn watch_window(bytes: usize, us: f64, cpu_share: f64) -> usize {
    let calls = WATCH_WINDOW * TURNS * trials(bytes).1;
    let span = (by_share(cpu_share, 0.0, WATCH_MIN_SECS_SHARED) * 1e6 / us).ceil();
    if span.is_finite() && span > 0.0 {
        MIN_TRIALS.max(span.min(1e9) as usize)
    } else {
        calls
    }
}

/// Between reviews, the pick's own calls are timed in windows of
/// [`WATCH_WINDOW`] x [`TURNS`] x the timed calls of a block (where ranks
/// share cores, [`WATCH_MIN_SECS_SHARED`] of them: [`watch_window`]), and
/// the ranks agree on each window's mean (the maximum over ranks, one
/// small AllReduce a window). The baseline is the pick's time in the
/// turns it was decided on (their median); two windows in a row more than
/// [`WATCH_CHANGE`] away from it (slower or faster) say the machine
/// changed, and the shape is reviewed at its next call, on its own turn
/// and one more ([`Trials::stale`]). Where that review and its follow-up
/// keep the pick, the pick's calls run at another speed than its trials
/// measured, and the first window after them is the baseline instead
/// (else the watch would review again and again).
///
/// Why: the fastest algorithm changes with the machine's state, and
/// between scheduled reviews, up to 128 turns' worth of calls apart, Auto
/// kept a pick that had become slow (2 ranks, each on its own CPU:
/// AllReduce of 1-64 MiB with streaming stores picked while the two CPUs
/// were far apart, at 0.5x the other algorithms' time, then 1.1-2.05x its
/// cached twin's once they were close). Why the decision's time and not
/// the first window: where the state changes between the trials and the
/// first window, the first window already has the new speed (a build that
/// took it as the baseline kept the streaming AllReduce of 4 MiB at 1.49x
/// the best through a run whose state changed from far apart to close
/// during its AllReduce sizes). Why two windows: with one, 2 ranks with 8 forced calls
/// between Auto's AllReduce calls of 64 KiB were reviewed every 6-12
/// windows with nothing changed but the noise. The cost is a clock read a
/// call and an AllReduce of one number a window.
#[derive(Clone, Debug)]
pub(crate) struct Watch {
    /// The calls' bytes, and the CPUs a rank has ([`watch_window`]).
    bytes: usize,
    cpu_share: f64,
    /// Calls a window holds.
    window: usize,
    /// Calls in the current window, and their seconds.
    calls: usize,
    secs: f64,
    /// The pick's time (us a call) the windows are held against; `None`:
    /// the next window's.
    baseline: Option<f64>,
    /// The last window moved from the baseline: one more that does asks
    /// for a review.
    moved: bool,
    /// The review now running (or last ended) is this watch's.
    asked: bool,
    /// A stretch since the watch asked changed the pick (the review, or
    /// its follow-up).
    changed: bool,
}

impl Watch {
    /// A watch for calls of `bytes` bytes, where a rank has `cpu_share`
    /// CPUs.
    pub(crate) fn new(bytes: usize, cpu_share: f64) -> Watch {
        Watch {
            bytes,
            cpu_share,
            window: watch_window(bytes, f64::NAN, cpu_share),
            calls: 0,
            secs: 0.0,
            baseline: None,
            moved: false,
            asked: false,
            changed: false,
        }
    }

    /// Adds a call of the pick that took `secs` here. True once the window
    /// is full: the ranks then agree on [`mean_us`](Watch::mean_us) and
    /// pass the result to [`agreed`](Watch::agreed).
    pub(crate) fn add(&mut self, secs: f64) -> bool {
        self.calls += 1;
        self.secs += secs;
        self.calls >= self.window
    }

    /// This rank's mean time per call in the window (us).
    pub(crate) fn mean_us(&self) -> f64 {
        self.secs / self.calls.max(1) as f64 * 1e6
    }

    /// Ends the window with `us`, its mean as the ranks agreed on it. True
    /// where it and the window before moved more than [`WATCH_CHANGE`]
    /// from the baseline: the shape is to be reviewed.
    pub(crate) fn agreed(&mut self, us: f64) -> bool {
        self.calls = 0;
        self.secs = 0.0;
        let Some(b) = self.baseline else {
            self.baseline = Some(us);
            return false;
        };
        let moved = us > b * (1.0 + WATCH_CHANGE) || us * (1.0 + WATCH_CHANGE) < b;
        let review = moved && self.moved;
        self.moved = moved && !review;
        self.asked = review;
        review
    }

    /// A stretch of trials ended with the pick taking `us` a call in the
    /// turns decided on (`kept`: the pick before it stays; `more`: the
    /// decision is unsettled, one more turn follows at once): that is the
    /// next windows' baseline, unless this watch asked for the review and
    /// the pick stayed through it and its follow-up (then the next
    /// window's).
    pub(crate) fn restart(&mut self, us: f64, kept: bool, more: bool) {
        self.window = watch_window(self.bytes, us, self.cpu_share);
        self.calls = 0;
        self.secs = 0.0;
        self.moved = false;
        self.changed |= !kept;
        if more {
            self.baseline = None;
            return;
        }
        self.baseline = (!self.asked || self.changed).then_some(us);
        self.asked = false;
        self.changed = false;
    }
}

/// The winner (an index) among `k` candidates given `us`, the time per
/// call of each in each turn (`turn * k + candidate`; the maximum over
/// ranks of each rank's mean), against candidate `reference` (the current
/// pick). Paired by turn: a candidate's score is the median over turns of
/// its time over the reference's in that turn, so that a slow stretch of
/// the machine, which slows a whole turn, cancels. The least score wins;
/// the reference (score 1) unless another is faster by more than
/// [`KEEP_PICK`].
pub(crate) fn decide(us: &[f64], k: usize, reference: usize) -> usize {
    (0..k)
        .filter(|&c| c != reference)
        .map(|c| (c, paired(us, k, c, reference)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|&(_, x)| x * (1.0 + KEEP_PICK) < 1.0)
        .map_or(reference, |(c, _)| c)
}

/// Candidate `c`'s score against candidate `reference` given `us` (as for
/// [`decide`]): the median over turns of its time over the reference's in
/// the same turn; not a number counts as infinitely slow.
fn paired(us: &[f64], k: usize, c: usize, reference: usize) -> f64 {
    let turns = us.len() / k;
    upper_median(
        (0..turns)
            .map(|t| us[t * k + c] / us[t * k + reference])
            .map(|x| if x.is_nan() { f64::INFINITY } else { x }),
    )
}

/// The median of `v` (at least one value); of an even count, the higher
/// of the middle two.
fn upper_median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
}
