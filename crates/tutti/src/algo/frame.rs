//! What a collective does to the data besides moving it, whatever the
//! algorithm: the steps every schedule of it begins with, around the
//! algorithm's own. [`Algorithm::build`](super::Algorithm::build) frames
//! every schedule so; the verifier proves the frame like any step, and the
//! cost model prices it.
//!
//! * **Pre-copy** ([`pre_copy`]). Out of place, AllGather's schedule begins
//!   by copying this rank's Input to its block of Output (`rank*c..`), and
//!   Broadcast's, on the root, by copying Input to Output: the algorithms
//!   then send from Output, as they would in place. In place
//!   ([`Problem::in_place`]) the data is already there and there is no
//!   copy. The verifier starts an out-of-place Output empty, so it proves
//!   that this rank's own block arrives too.
//!
//! ```text
//!   AllGather, rank 1 of 3:   Input [x1]  --Copy-->  Output [ . | x1 | . ]
//!                             then the algorithm fills blocks 0 and 2
//! ```
//!
//! The executor runs a copy whose source is its destination as nothing (a
//! caller's Input may be Output's block without saying so), so a schedule
//! with the copy is right whichever way the caller passed its buffers. The
//! mailbox path (`engine/oneshot.rs`), which runs the direct algorithm
//! without a schedule, does the same copies.

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

/// `body`, an algorithm's steps for `p`, framed by what every schedule of
/// `p`'s collective does besides: the whole schedule.
pub fn frame(p: &Problem, body: Vec<Step>) -> Vec<Step> {
    match pre_copy(p) {
        Some(first) => {
            let mut s = Vec::with_capacity(body.len() + 1);
            s.push(first);
            s.extend(body);
            s
        }
        None => body,
    }
}
