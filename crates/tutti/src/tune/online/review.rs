//! Deciding and reviewing: a decision pairs the candidates' times by turn
//! ([`decide`]) and keeps the pick unless another is clearly faster
//! ([`KEEP_PICK`]); reviews take one more turn each, their gaps growing
//! while the pick stays ([`review_gaps`], [`review_floor`]).

use super::by_share;
use super::trials::TURNS;

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
/// twin ([`Choice::stream`](crate::tune::Choice::stream)): reviews stay at [`REVIEW_GAP`] apart, never
/// doubling. The watch (`Watch`, [`WATCH_CHANGE`](super::WATCH_CHANGE)) holds only the pick's
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
/// [`WATCH_MIN_BYTES`](super::WATCH_MIN_BYTES) come at least this many seconds of its pick's calls
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
/// rank has a core (`cpu_share`, as [`spread`](super::spread) takes it) or for a
/// `watched` shape (the engine watches calls of [`WATCH_MIN_BYTES`](super::WATCH_MIN_BYTES) or
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
pub(super) fn paired(us: &[f64], k: usize, c: usize, reference: usize) -> f64 {
    let turns = us.len() / k;
    upper_median(
        (0..turns)
            .map(|t| us[t * k + c] / us[t * k + reference])
            .map(|x| if x.is_nan() { f64::INFINITY } else { x }),
    )
}

/// The median of `v` (at least one value); of an even count, the higher
/// of the middle two.
pub(super) fn upper_median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
