//! Ring algorithms.
//!
//! The ranks form a ring, each sending to its right neighbour `r+1` and
//! receiving from its left neighbour `r-1`. The data is cut into `n` blocks.
//!
//! ```text
//!   AllReduce, n = 3, block b held by rank r after each step (* = complete)
//!
//!   reduce-scatter (n-1 steps)        all-gather (n-1 steps)
//!   r0: send b0, recv+reduce b2 ...   r0 ends with b1*, forwards it ...
//!        r0 --> r1 --> r2 --> r0
//! ```
//!
//! * **AllReduce** = reduce-scatter + all-gather. Step s of the
//!   reduce-scatter: rank r sends block `r-s` and receives block `r-s-1`,
//!   reduces it into Output and forwards it at step s+1 (a fused
//!   `RecvReduceSend`, one pass over memory). After n-1 steps rank r owns the
//!   complete block `r+1`, which the all-gather passes round the ring with
//!   `RecvCopySend`. Each rank sends `2(n-1)/n` of the data in `2(n-1)`
//!   latency steps: bandwidth-optimal, latency-poor.
//! * **AllGather**: the all-gather half alone (`(n-1)/n` of the output sent).
//! * **ReduceScatter**: the reduce-scatter half, shifted by one so that rank
//!   r ends with block r; partial sums travel through two alternating
//!   scratch blocks.
//! * **Broadcast**: a pipelined chain root -> root+1 -> ... -> root-1; each
//!   rank forwards bytes as they arrive, so the time is about one message
//!   time plus (n-1) latencies.
//! * **Reduce**: a chain towards the root (root+1 -> root+2 -> ... -> root),
//!   each rank reducing the incoming partial with its input and forwarding.

use super::{block, Collective, Loc, Problem, Step};

/// Builds the ring schedule, or `None` for collectives the ring does not do.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let n = p.nranks;
    let r = p.rank;
    let c = p.count;
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    let blk = |i: usize| block(c, n, i % n);
    let mut s = Vec::new();
    match p.coll {
        Collective::AllReduce => {
            if n == 1 {
                s.push(Step::Copy {
                    src: Loc::input(0),
                    dst: Loc::output(0),
                    len: c,
                });
                return Some(s);
            }
            let b = blk(r);
            s.push(Step::Send {
                peer: right,
                src: Loc::input(b.start),
                len: b.len(),
            });
            for st in 0..n - 1 {
                let b = blk(r + 2 * n - st - 1);
                s.push(Step::RecvReduceSend {
                    from: left,
                    to: right,
                    src: Loc::input(b.start),
                    dst: Loc::output(b.start),
                    len: b.len(),
                });
            }
            for t in 0..n - 1 {
                let b = blk(r + n - t);
                if t + 2 < n {
                    s.push(Step::RecvCopySend {
                        from: left,
                        to: right,
                        dst: Loc::output(b.start),
                        len: b.len(),
                    });
                } else {
                    s.push(Step::Recv {
                        peer: left,
                        dst: Loc::output(b.start),
                        len: b.len(),
                    });
                }
            }
        }
        Collective::AllGather => {
            if n == 1 {
                return Some(s);
            }
            s.push(Step::Send {
                peer: right,
                src: Loc::output(r * c),
                len: c,
            });
            for t in 0..n - 1 {
                let src_rank = (r + n - t - 1) % n;
                let dst = Loc::output(src_rank * c);
                if t + 2 < n {
                    s.push(Step::RecvCopySend {
                        from: left,
                        to: right,
                        dst,
                        len: c,
                    });
                } else {
                    s.push(Step::Recv {
                        peer: left,
                        dst,
                        len: c,
                    });
                }
            }
        }
        Collective::ReduceScatter => {
            if n == 1 {
                s.push(Step::Copy {
                    src: Loc::input(0),
                    dst: Loc::output(0),
                    len: c,
                });
                return Some(s);
            }
            // Step st: send partial of block (r-1-st), receive block (r-2-st).
            let first = (r + n - 1) % n;
            s.push(Step::Send {
                peer: right,
                src: Loc::input(first * c),
                len: c,
            });
            for st in 0..n - 1 {
                let bi = (r + 2 * n - 2 - st) % n;
                let src = Loc::input(bi * c);
                if st + 2 < n {
                    s.push(Step::RecvReduceSend {
                        from: left,
                        to: right,
                        src,
                        dst: Loc::scratch((st % 2) * c),
                        len: c,
                    });
                } else {
                    s.push(Step::RecvReduce {
                        peer: left,
                        src,
                        dst: Loc::output(0),
                        len: c,
                    });
                }
            }
        }
        Collective::Broadcast { root } => {
            if n == 1 {
                return Some(s);
            }
            let pos = (r + n - root) % n; // position in the chain
            let whole = Loc::output(0);
            if pos == 0 {
                s.push(Step::Send {
                    peer: right,
                    src: whole,
                    len: c,
                });
            } else if pos + 1 < n {
                s.push(Step::RecvCopySend {
                    from: left,
                    to: right,
                    dst: whole,
                    len: c,
                });
            } else {
                s.push(Step::Recv {
                    peer: left,
                    dst: whole,
                    len: c,
                });
            }
        }
        Collective::Reduce { root } => {
            if n == 1 {
                s.push(Step::Copy {
                    src: Loc::input(0),
                    dst: Loc::output(0),
                    len: c,
                });
                return Some(s);
            }
            // Chain root+1 -> root+2 -> ... -> root; position 0 starts it.
            let pos = (r + n - root - 1) % n;
            if pos == 0 {
                s.push(Step::Send {
                    peer: right,
                    src: Loc::input(0),
                    len: c,
                });
            } else if r != root {
                s.push(Step::RecvReduceSend {
                    from: left,
                    to: right,
                    src: Loc::input(0),
                    dst: Loc::scratch(0),
                    len: c,
                });
            } else {
                s.push(Step::RecvReduce {
                    peer: left,
                    src: Loc::input(0),
                    dst: Loc::output(0),
                    len: c,
                });
            }
        }
        _ => return None,
    }
    Some(s)
}
