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

mod review;
#[cfg(test)]
mod tests;
mod trials;
mod watch;

use super::Choice;
pub use review::{
    history_turns, review_floor, review_gaps, KEEP_PICK, RESET_GAIN, REVIEW_FLOOR_MAX, REVIEW_GAP,
    REVIEW_GAPS_SHARED, REVIEW_GAP_MAX, REVIEW_GAP_MAX_STREAM, REVIEW_MIN_SECS_SHARED,
};
pub use trials::{
    max_calls, spread, trials, MAX_CANDIDATES, MAX_TRIALS, MIN_TRIALS, SPREAD, SPREAD_SHARED,
    TRIAL_BYTES, TURNS,
};
pub(crate) use trials::{Agreed, Trials};
pub(crate) use watch::Watch;
pub use watch::{watch_window, WATCH_CHANGE, WATCH_MIN_BYTES, WATCH_MIN_SECS_SHARED, WATCH_WINDOW};

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
