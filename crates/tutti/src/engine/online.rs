//! Online tuning's glue: which calls online tuning tries candidates for,
//! when a decided shape is reviewed, and how the ranks agree on trial and
//! watch times ([`crate::tune::online`] keeps the arithmetic).

use super::{Core, OpCall};
use crate::algo::{Collective, Problem};
use crate::error::Result;
use crate::reduce::{DataType, ReduceOp};
use crate::transport::mailbox::MBOX_BYTES;
use crate::tune::online::{Trials, Watch};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// A call shape as online tuning tells them apart: the problem priced out
/// of place (whether a rank runs in place is its own affair), and the type.
pub(super) type ShapeKey = (Problem, DataType);

/// The shape of a call of `p` (as the engine builds it, hosts included)
/// and `dtype`.
pub(super) fn shape_of(p: &Problem, dtype: DataType) -> ShapeKey {
    (
        Problem {
            in_place: false,
            ..p.clone()
        },
        dtype,
    )
}

/// A candidate's name in the debug log: its algorithm and its twin
/// ([`crate::tune::Choice::twin`]).
fn plan_name(c: &crate::tune::Choice) -> String {
    format!("{}{}", c.algorithm.name(), c.twin())
}

/// Every rank times a watched shape's calls alike, so they fill a window at
/// the same call: watched calls never take the mailbox repeat path, which
/// skips the clock and is taken by some ranks and not others.
const _: () = assert!(crate::tune::online::WATCH_MIN_BYTES > MBOX_BYTES);

/// A tuned shape's [`Watch`], shared by the shape and the plans that run
/// its decision, so that a call that skips the tuner still counts.
pub(super) struct Watched {
    key: ShapeKey,
    watch: Mutex<Watch>,
}

impl Watched {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Online tuning's say in a call ([`Core::online_choice`]).
pub(super) struct Online {
    /// The decision, or the candidate to try; `None` where online tuning
    /// has no say.
    pub(super) choice: Option<crate::tune::Choice>,
    /// The shape, while its trials run (the call is a trial).
    pub(super) trial: Option<ShapeKey>,
    /// The shape's watch, where the call runs its decision.
    pub(super) watch: Option<Arc<Watched>>,
}

/// Online tuning's state for one call shape.
pub(super) enum Shape {
    /// The only candidate: nothing to try.
    Fixed(crate::tune::Choice),
    /// Candidates timed, decided on, and reviewed.
    Tuned(Tuning),
}

/// A tuned shape's trials and when they run.
pub(super) struct Tuning {
    trials: Trials,
    /// `None` while its trials run (the first, or a review); else the
    /// collective number from which its next review is due (`u64::MAX`:
    /// never).
    review_at: Option<u64>,
    /// Turn spans from one review to the next ([`tune::online::REVIEW_GAP`](crate::tune::online::REVIEW_GAP)).
    gap: u64,
    /// The collective number at the current stretch's first call.
    stretch_from: u64,
    /// Times the decision's calls between reviews (calls of at least
    /// [`WATCH_MIN_BYTES`](crate::tune::online::WATCH_MIN_BYTES), reviews
    /// on).
    watch: Option<Arc<Watched>>,
}

/// Shapes online tuning keeps apart; calls of further shapes get the cost
/// model's pick. A training loop has a few dozen; `tutti perf`'s widest
/// sweep (every collective, 1 B to 4 GiB) about 330.
const MAX_SHAPES: usize = 4096;

impl Core {
    /// The shape online tuning files calls of `p` (with this communicator's
    /// hosts) and `dtype` under.
    fn shape_key(&self, p: &Problem, dtype: DataType) -> ShapeKey {
        (
            Problem {
                in_place: false,
                hosts: self.tune.hosts(),
                ..p.clone()
            },
            dtype,
        )
    }

    /// Online tuning's state for calls of `p` (with this communicator's
    /// hosts) and `dtype`: `None` before the first such call, and where it
    /// does not tune; `Err(())` while it tries candidates; its decision.
    pub(crate) fn online_state(
        &self,
        p: &Problem,
        dtype: DataType,
    ) -> Option<std::result::Result<crate::tune::Choice, ()>> {
        let key = self.shape_key(p, dtype);
        match self.shapes.get(&key)? {
            Shape::Fixed(c) => Some(Ok(*c)),
            Shape::Tuned(t) => t.trials.decided().ok_or(()).into(),
        }
    }

    /// How many times online tuning has reviewed its decision for calls of
    /// `p` and `dtype` (0 where it does not tune them).
    pub(crate) fn online_reviews(&self, p: &Problem, dtype: DataType) -> usize {
        let key = self.shape_key(p, dtype);
        match self.shapes.get(&key) {
            Some(Shape::Tuned(t)) => t.trials.reviews(),
            _ => 0,
        }
    }

    /// The candidates online tuning times for `p`'s shape (the model's
    /// pick first); empty where it has none to try, or has not seen the
    /// shape yet.
    pub(crate) fn online_candidates(
        &self,
        p: &Problem,
        dtype: DataType,
    ) -> Vec<crate::tune::Choice> {
        let key = self.shape_key(p, dtype);
        match self.shapes.get(&key) {
            Some(Shape::Tuned(t)) => t.trials.candidates().to_vec(),
            _ => Vec::new(),
        }
    }

    /// Online tuning's choice for `c` (algorithm and twin): its shape's
    /// decision, or (while the shape is being tuned) the candidate to try,
    /// with the shape's key; `None` where online tuning has no say (an
    /// algorithm forced for the call, which then runs as forced, or
    /// tuning off: the cost model's pick).
    pub(super) fn online_choice(
        &mut self,
        problem: &Problem,
        c: &OpCall,
        bytes: usize,
    ) -> Result<Online> {
        let none = Online {
            choice: None,
            trial: None,
            watch: None,
        };
        if c.algorithm.is_some()
            || !self.config.online
            || c.vcounts.is_some()
            || c.coll.kind() == crate::algo::CollKind::SendRecv
            || self.nranks < 2
        {
            return Ok(none);
        }
        let key = shape_of(problem, c.dtype);
        if !self.shapes.contains_key(&key) {
            // Never forget a shape: every rank must agree on which shapes
            // are being tuned (one that repeats a call skips the tuner), so
            // past the bound new shapes get the cost model's pick.
            if self.shapes.len() >= MAX_SHAPES {
                return Ok(none);
            }
            let cands = crate::tune::candidates(&key.0, c.dtype, &self.config.algo, &self.tune)?;
            let shape = if cands.len() < 2 {
                Shape::Fixed(cands[0])
            } else {
                let watched = self.config.review && bytes >= crate::tune::online::WATCH_MIN_BYTES;
                Shape::Tuned(Tuning {
                    trials: Trials::new(cands, bytes),
                    review_at: None,
                    gap: crate::tune::online::REVIEW_GAP,
                    stretch_from: 0,
                    watch: watched.then(|| {
                        Arc::new(Watched {
                            key: key.clone(),
                            watch: Mutex::new(Watch::new(bytes, self.tune.cpu_share)),
                        })
                    }),
                })
            };
            self.shapes.insert(key.clone(), shape);
        }
        let colls = self.auto_colls;
        Ok(match self.shapes.get_mut(&key).expect("inserted above") {
            Shape::Fixed(d) => Online {
                choice: Some(*d),
                ..none
            },
            Shape::Tuned(t) => match (t.review_at, t.trials.decided()) {
                (Some(_), Some(d)) => Online {
                    choice: Some(d),
                    watch: t.watch.clone(),
                    ..none
                },
                _ => {
                    if t.trials.fresh() {
                        t.stretch_from = colls;
                    }
                    let next = t.trials.next().0;
                    Online {
                        choice: Some(next),
                        trial: Some(key),
                        ..none
                    }
                }
            },
        })
    }

    /// Online tuning's reviews that are due start: their shapes' next
    /// calls try the candidates again, so the paths that skip the tuner
    /// (the last call's schedule, the cache of decided shapes, the repeat
    /// of a mailbox call) are cleared, and the next review due is found.
    /// Every rank gets here at the same collective.
    #[cold]
    pub(super) fn start_reviews(&mut self) {
        let now = self.auto_colls;
        let mut next = u64::MAX;
        for s in self.shapes.values_mut() {
            if let Shape::Tuned(t) = s {
                match t.review_at {
                    Some(at) if at <= now => t.review_at = None,
                    Some(at) => next = next.min(at),
                    None => {}
                }
            }
        }
        self.review_from = next;
        self.last = None;
        self.repeat = None;
        self.cache.retain(|k, _| k.1.is_some());
    }

    /// After a trial call of `key`'s shape that took `secs` here: once every
    /// candidate has its timed calls, the ranks agree on each candidate's
    /// time (the maximum over ranks of each rank's mean) and the shape
    /// is decided. Returns whether the call ended a block (the last plan
    /// is then forgotten, so that the next call asks for its candidate).
    pub(super) fn trial_done(
        &mut self,
        key: ShapeKey,
        secs: f64,
        abort: &AtomicBool,
    ) -> Result<bool> {
        let Some(Shape::Tuned(t)) = self.shapes.get_mut(&key) else {
            return Ok(false);
        };
        let done = t.trials.record(secs);
        // The block ended (or the trials did): the shape's next call asks
        // the tuner, on every rank alike.
        let ended = t.trials.at_block_start();
        if ended {
            self.last = None;
            self.repeat = None;
        }
        if !done {
            return Ok(ended);
        }
        let cands = t.trials.candidates().to_vec();
        let mut us = t.trials.means_us();
        self.all_max(&mut us, abort)?;
        let colls = self.auto_colls;
        let Some(Shape::Tuned(t)) = self.shapes.get_mut(&key) else {
            unreachable!("a shape is never forgotten");
        };
        let crate::tune::online::Agreed {
            pick: d,
            turns,
            changed,
            moved,
            unsettled,
        } = t.trials.agreed(&us);
        if let Some(w) = &t.watch {
            w.lock().restart(d.us, !changed, unsettled);
        }
        let reviews = t.trials.reviews();
        // The next review: REVIEW_GAP times a turn's span in Auto's
        // collectives (the same count on every rank), doubling while
        // reviews keep the pick or change it for little (where ranks share
        // cores, a shape too small to watch waits at least
        // REVIEW_MIN_SECS_SHARED of its pick's calls); at the shape's next
        // call where the decision is unsettled (the gap then stays).
        let (first, most) = crate::tune::online::review_gaps(self.tune.cpu_share, d.stream);
        t.gap = if reviews == 0 || moved {
            first
        } else if unsettled {
            t.gap
        } else {
            (t.gap * 2).min(most)
        };
        let span = (colls - t.stretch_from) / turns as u64;
        let at = if !self.config.review {
            u64::MAX
        } else if unsettled {
            colls
        } else {
            let pace = t.trials.pace_us().unwrap_or(d.us);
            let floor = crate::tune::online::review_floor(
                t.watch.is_some(),
                t.trials.turn_calls(),
                pace,
                self.tune.cpu_share,
            );
            colls.saturating_add(t.gap.max(floor).saturating_mul(span.max(1)))
        };
        t.review_at = Some(at);
        self.review_from = self.review_from.min(at);
        tracing::debug!(
            rank = self.rank,
            coll = key.0.coll.kind().name(),
            count = key.0.count,
            dtype = key.1.name(),
            tried = ?cands
                .iter()
                .enumerate()
                .map(|(c, x)| {
                    let per_turn: Vec<f64> = us.iter().skip(c).step_by(cands.len()).copied().collect();
                    (plan_name(x), per_turn)
                })
                .collect::<Vec<_>>(),
            picked = plan_name(&d),
            reviews,
            changed,
            unsettled,
            "online tuning"
        );
        Ok(true)
    }

    /// After a call of a watched shape's decision that filled its window:
    /// the ranks agree on the window's mean (the maximum over ranks), and
    /// where it moved from the baseline the shape's review is due now (at
    /// its next call, on every rank alike).
    #[cold]
    pub(super) fn watch_done(&mut self, w: &Watched, abort: &AtomicBool) -> Result<()> {
        let mut us = [w.lock().mean_us()];
        self.all_max(&mut us, abort)?;
        if !w.lock().agreed(us[0]) {
            return Ok(());
        }
        let now = self.auto_colls;
        if let Some(Shape::Tuned(t)) = self.shapes.get_mut(&w.key) {
            if t.review_at.is_some() {
                t.review_at = Some(now);
                t.trials.stale();
                t.gap = crate::tune::online::review_gaps(self.tune.cpu_share, false).0;
                self.review_from = now;
                tracing::debug!(
                    rank = self.rank,
                    coll = w.key.0.coll.kind().name(),
                    count = w.key.0.count,
                    us = us[0],
                    "online tuning: the pick's time moved, review"
                );
            }
        }
        Ok(())
    }

    /// AllReduce (max) of `v` among the ranks, inside the current op (every
    /// rank makes it at the same point), with the cost model's algorithm.
    fn all_max(&mut self, v: &mut [f64], abort: &AtomicBool) -> Result<()> {
        let count = v.len();
        let p = Problem {
            hosts: self.tune.hosts(),
            ..Problem::new(Collective::AllReduce, self.nranks, self.rank, count)
        };
        let alg = crate::tune::select(&p, DataType::F64, None, &self.config.algo, &self.tune)?;
        let bytes = count * DataType::F64.size();
        let call = OpCall {
            coll: Collective::AllReduce,
            dtype: DataType::F64,
            op: ReduceOp::Max,
            count,
            vcounts: None,
            in_place: true,
            input: v.as_mut_ptr().cast(),
            input_len: bytes,
            output: v.as_mut_ptr().cast(),
            output_len: bytes,
            algorithm: Some(alg.algorithm),
            timeout: None,
            wire: None,
            background: false,
        };
        self.run_inner(&call, abort, false)
    }
}
