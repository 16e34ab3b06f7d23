//! What a collective does to the data besides moving it, whatever the
//! algorithm: the steps every schedule of it begins and ends with, around
//! the algorithm's own. [`Algorithm::build`](super::Algorithm::build)
//! frames every schedule so; the verifier proves the frame like any step,
//! and the cost model prices it.
//!
//! * **Pre-copy** ([`pre_copy`]). Out of place, AllGather's schedule begins
//!   by copying this rank's Input to its block of Output (`rank*c..`), and
//!   Broadcast's, on the root, by copying Input to Output: the algorithms
//!   then send from Output, as they would in place. In place
//!   ([`Problem::in_place`]) the data is already there and there is no
//!   copy. The verifier starts an out-of-place Output empty, so it proves
//!   that this rank's own block arrives too.
//! * **Mean** ([`mean`]). An Avg reduction ([`Problem::avg`]) reduces as
//!   Sum; its schedule ends, on the ranks that hold a result (AllReduce and
//!   ReduceScatter: all; Reduce: the root), with a [`Step::Scale`] that
//!   divides the result by the rank count. The verifier requires it exactly
//!   once, after the last contribution is in, and exactly when the
//!   reduction is Avg.
//!
//! ```text
//!   AllGather, rank 1 of 3:   Input [x1]  --Copy-->  Output [ . | x1 | . ]
//!                             then the algorithm fills blocks 0 and 2
//!   AllReduce, Avg:           the algorithm's steps   Output = x0 + x1 + x2
//!                             then Scale by 3         Output = (x0 + x1 + x2) / 3
//! ```
//!
//! The executor runs a copy whose source is its destination as nothing (a
//! caller's Input may be Output's block without saying so), so a schedule
//! with the copy is right whichever way the caller passed its buffers. The
//! mailbox path (`engine/oneshot.rs`), which runs the direct algorithm
//! without a schedule, does the same copies and ends an Avg with the same
//! [`mean`] step.

use super::{Collective, Loc, Problem, Step};

/// The copy that puts this rank's data where the algorithm expects it in
/// Output, if the collective needs one here (see the module docs).
pub fn pre_copy(p: &Problem) -> Option<Step> {
    if p.in_place || p.count == 0 {
        return None;
    }
    let dst = match p.coll {
        Collective::AllGather => Loc::output(p.rank * p.count),
        Collective::Broadcast { root } if root == p.rank => Loc::output(0),
        _ => return None,
    };
    Some(Step::Copy {
        src: Loc::input(0),
        dst,
        len: p.count,
    })
}

/// The step that ends an Avg reduction of `coll` with `count` elements on
/// `nranks` ranks, as rank `rank`: the division of its result by the rank
/// count, where it holds a result (see the module docs), or `None`.
pub fn mean(coll: Collective, nranks: usize, rank: usize, count: usize) -> Option<Step> {
    let holds = match coll {
        Collective::AllReduce | Collective::ReduceScatter => true,
        Collective::Reduce { root } => root == rank,
        _ => false,
    };
    (holds && count > 0).then_some(Step::Scale {
        dst: Loc::output(0),
        len: count,
        divisor: nranks,
    })
}

/// `body`, an algorithm's steps for `p`, framed by what every schedule of
/// `p`'s collective does besides: the whole schedule.
pub fn frame(p: &Problem, body: Vec<Step>) -> Vec<Step> {
    let first = pre_copy(p);
    let last = if p.avg {
        mean(p.coll, p.nranks, p.rank, p.count)
    } else {
        None
    };
    if first.is_none() && last.is_none() {
        return body;
    }
    let mut s = Vec::with_capacity(body.len() + 2);
    s.extend(first);
    s.extend(body);
    s.extend(last);
    s
}

#[cfg(test)]
mod tests;
