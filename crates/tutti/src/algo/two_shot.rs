//! Two-shot: a direct reduce-scatter, then (for AllReduce) a direct
//! all-gather.
//!
//! ```text
//!   shot 1 (reduce-scatter): rank r receives block r from every rank
//!          and reduces the n pieces in rank order 0, 1, ..., n-1
//!   shot 2 (all-gather):     rank r sends its finished block to every rank
//! ```
//!
//! Each rank sends `(n-1)/n * S` in each shot (`2(n-1)/n * S` for AllReduce,
//! like the ring) in two latency steps instead of `2(n-1)`. Every element is
//! reduced in rank order by exactly one rank and copied to the others, so
//! the result is bitwise the same on every rank — and the same as the
//! one-shot [`direct`](super::direct) AllReduce, which also reduces in rank
//! order. `TUTTI_DETERMINISTIC=1` therefore chooses only between these two.
//! Many messages are in flight at once (n-1 per rank per shot): it suits
//! medium messages and moderate rank counts.

use super::direct::reduce_in_rank_order;
use super::{block, Collective, Loc, Problem, Step};

/// Builds the two-shot schedule (AllReduce and ReduceScatter).
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let (n, r, c) = (p.nranks, p.rank, p.count);
    let mut s = Vec::new();
    match p.coll {
        Collective::AllReduce => {
            let blk = |q: usize| block(c, n, q);
            let mine = blk(r);
            for q in (1..n).map(|k| (r + k) % n) {
                let b = blk(q);
                s.push(Step::Send {
                    peer: q,
                    src: Loc::input(b.start),
                    len: b.len(),
                });
            }
            // In place, the accumulator must not overwrite our own input
            // before its turn in the rank order: accumulate aside.
            let acc = if p.in_place {
                Loc::scratch(0)
            } else {
                Loc::output(mine.start)
            };
            reduce_in_rank_order(&mut s, n, r, mine.len(), Loc::input(mine.start), acc);
            if p.in_place {
                s.push(Step::Copy {
                    src: acc,
                    dst: Loc::output(mine.start),
                    len: mine.len(),
                });
            }
            for q in (1..n).map(|k| (r + k) % n) {
                s.push(Step::Send {
                    peer: q,
                    src: Loc::output(mine.start),
                    len: mine.len(),
                });
                let from = (r + n - (q + n - r) % n) % n;
                let b = blk(from);
                s.push(Step::Recv {
                    peer: from,
                    dst: Loc::output(b.start),
                    len: b.len(),
                });
            }
        }
        Collective::ReduceScatter => {
            for q in (1..n).map(|k| (r + k) % n) {
                s.push(Step::Send {
                    peer: q,
                    src: Loc::input(q * c),
                    len: c,
                });
            }
            reduce_in_rank_order(&mut s, n, r, c, Loc::input(r * c), Loc::output(0));
        }
        _ => return None,
    }
    Some(s)
}
