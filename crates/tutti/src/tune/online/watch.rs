//! The watch: between reviews, the pick's own calls are timed in windows
//! ([`Watch`]), and a machine that changed brings the next review forward.

use super::by_share;
use super::trials::{trials, MIN_TRIALS, TURNS};

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
    pub(super) window: usize,
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
