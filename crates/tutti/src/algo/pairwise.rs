//! Pairwise exchange for AllToAll and AllToAllV: one peer at a time.
//!
//! In step `k = 1..n`, rank `r` sends its block for `r+k` to `r+k` and
//! receives the block from `r-k` (mod n); its own block is a local copy. A
//! `Fence` separates the steps, so each rank has exactly one send and one
//! receive in flight: no rank is hit by many senders at once (no incast),
//! unlike the direct algorithm, which posts all `n-1` exchanges together.
//!
//! ```text
//!   n = 4        step 1          step 2          step 3
//!             0->1 1->2       0->2 1->3       0->3 1->0
//!             2->3 3->0       2->0 3->1       2->1 3->2
//! ```
//!
//! Each rank sends `(n-1)/n` of its input (`(n-1) * c` elements for
//! AllToAll) in `n-1` latency steps: `(n-1)(alpha + c * beta)`. AllToAllV
//! keeps zero-length messages, so counts that disagree between two ranks are
//! caught as a length mismatch rather than hanging the step.
//!
//! No element is reduced, so results are trivially bitwise identical.

#![forbid(unsafe_code)]

use super::{Collective, Loc, Problem, Step};

/// Builds the pairwise schedule, or `None` for collectives it does not do.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let (n, r, c) = (p.nranks, p.rank, p.count);
    // (send offset, send len, recv offset, recv len) for each peer.
    let blocks: Box<dyn Fn(usize) -> (usize, usize, usize, usize)> = match p.coll {
        Collective::AllToAll if c == 0 => return Some(Vec::new()),
        Collective::AllToAll => Box::new(move |q| (q * c, c, q * c, c)),
        Collective::AllToAllV => {
            let v = p.vcounts.clone()?;
            Box::new(move |q| {
                (
                    v.send_displs[q],
                    v.send_counts[q],
                    v.recv_displs[q],
                    v.recv_counts[q],
                )
            })
        }
        _ => return None,
    };
    let (so, sl, ro, _) = blocks(r);
    let mut s = vec![Step::Copy {
        src: Loc::input(so),
        dst: Loc::output(ro),
        len: sl,
    }];
    for k in 1..n {
        if k > 1 {
            s.push(Step::Fence);
        }
        let to = (r + k) % n;
        let from = (r + n - k) % n;
        let (so, sl, _, _) = blocks(to);
        let (_, _, ro, rl) = blocks(from);
        s.push(Step::Send {
            peer: to,
            src: Loc::input(so),
            len: sl,
        });
        s.push(Step::Recv {
            peer: from,
            dst: Loc::output(ro),
            len: rl,
        });
    }
    Some(s)
}
