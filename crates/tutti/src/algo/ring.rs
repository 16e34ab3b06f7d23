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
//!   reduces it and forwards it at step s+1 (a fused `RecvReduceSend`, one
//!   pass over memory). After n-1 steps rank r owns the complete block
//!   `r+1`, which the all-gather passes round the ring with `RecvCopySend`.
//!   Each rank sends `2(n-1)/n` of the data in `2(n-1)` latency steps:
//!   bandwidth-optimal, latency-poor. Large blocks are cut into pieces and
//!   the ring runs once per piece, partial sums passing through two small
//!   scratch slots ([`Pieces`]).
//! * **AllGather**: the all-gather half alone (`(n-1)/n` of the output sent).
//! * **ReduceScatter**: the reduce-scatter half, shifted by one so that rank
//!   r ends with block r; partial sums travel through two alternating
//!   scratch slots, piece by piece as in AllReduce.
//! * **Broadcast**: a pipelined chain root -> root+1 -> ... -> root-1; each
//!   rank forwards bytes as they arrive, so the time is about one message
//!   time plus (n-1) latencies.
//! * **Reduce**: a chain towards the root (root+1 -> root+2 -> ... -> root),
//!   each rank reducing the incoming partial with its input and forwarding
//!   it through the scratch slots, piece by piece.

use super::{block, Collective, Loc, Problem, Step};

/// Builds the ring schedule, or `None` for collectives the ring does not do.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    build_cut(p, true)
}

/// [`build`] without [`Pieces`]: whole blocks, partial sums of AllReduce in
/// Output and of ReduceScatter in two scratch blocks. Hierarchical
/// schedules pipeline their own pieces and lay a level's steps into their
/// buffers by offsets, which must agree between sender and receiver.
pub(super) fn build_whole(p: &Problem) -> Option<Vec<Step>> {
    build_cut(p, false)
}

fn build_cut(p: &Problem, cut: bool) -> Option<Vec<Step>> {
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
            // Partial sums only pass through: with three ranks or more they
            // go through two small scratch slots in turn (see `Pieces`),
            // and the whole ring runs once per piece.
            let pc = Pieces::new(blk(0).len(), n, cut, p.chunks);
            let mut slots = 0;
            for i in 0..pc.count {
                let piece = |b: std::ops::Range<usize>| {
                    let q = pc.piece(b.len(), i);
                    b.start + q.start..b.start + q.end
                };
                let q = piece(blk(r));
                s.push(Step::Send {
                    peer: right,
                    src: Loc::input(q.start),
                    len: q.len(),
                });
                for st in 0..n - 1 {
                    let q = piece(blk(r + 2 * n - st - 1));
                    let dst = if st + 2 < n && pc.count > 1 {
                        pc.slot(&mut slots)
                    } else {
                        Loc::output(q.start)
                    };
                    s.push(Step::RecvReduceSend {
                        from: left,
                        to: right,
                        src: Loc::input(q.start),
                        dst,
                        len: q.len(),
                    });
                }
                for t in 0..n - 1 {
                    let q = piece(blk(r + n - t));
                    let dst = Loc::output(q.start);
                    let len = q.len();
                    if t + 2 < n {
                        s.push(Step::RecvCopySend {
                            from: left,
                            to: right,
                            dst,
                            len,
                        });
                    } else {
                        s.push(Step::Recv {
                            peer: left,
                            dst,
                            len,
                        });
                    }
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
            // Piece by piece, as the AllReduce.
            let pc = Pieces::new(c, n, cut, p.chunks);
            let mut slots = 0;
            let first = (r + n - 1) % n;
            for i in 0..pc.count {
                let q = pc.piece(c, i);
                s.push(Step::Send {
                    peer: right,
                    src: Loc::input(first * c + q.start),
                    len: q.len(),
                });
                for st in 0..n - 1 {
                    let bi = (r + 2 * n - 2 - st) % n;
                    let src = Loc::input(bi * c + q.start);
                    if st + 2 < n {
                        s.push(Step::RecvReduceSend {
                            from: left,
                            to: right,
                            src,
                            dst: pc.slot(&mut slots),
                            len: q.len(),
                        });
                    } else {
                        s.push(Step::RecvReduce {
                            peer: left,
                            src,
                            dst: Loc::output(q.start),
                            len: q.len(),
                        });
                    }
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
            let pc = Pieces::new(c, n, cut, p.chunks);
            let mut slots = 0;
            for i in 0..pc.count {
                let q = pc.piece(c, i);
                let src = Loc::input(q.start);
                let len = q.len();
                if pos == 0 {
                    s.push(Step::Send {
                        peer: right,
                        src,
                        len,
                    });
                } else if r != root {
                    s.push(Step::RecvReduceSend {
                        from: left,
                        to: right,
                        src,
                        dst: pc.slot(&mut slots),
                        len,
                    });
                } else {
                    s.push(Step::RecvReduce {
                        peer: left,
                        src,
                        dst: Loc::output(q.start),
                        len,
                    });
                }
            }
        }
        _ => return None,
    }
    Some(s)
}

/// How a ring cuts its blocks when partial sums pass through ranks.
///
/// A rank that only passes a partial sum on (every reduce-scatter step but
/// the last, every link of a Reduce chain but the root) needs it for no
/// longer than it takes to forward it. Reduced into Output (AllReduce) or
/// into a scratch block as large as the message (ReduceScatter, Reduce),
/// a large partial sum leaves the cache before it is forwarded (and for
/// AllReduce the all-gather then overwrites it). So with three ranks or
/// more, a block of more than [`Pieces::MIN`] elements is cut into pieces
/// of at least `MIN` elements, at most [`Pieces::MAX_COUNT`] of them (fewer
/// with many ranks, [`Pieces::MAX_STEPS`]), one message each; the ring runs
/// once per piece (every step of piece 0, then every
/// step of piece 1, the same order on every rank, so no queue waits on a
/// later piece), and partial sums go through two scratch slots of one
/// piece each, in turn, which stay in cache. Smaller blocks, and every
/// block with 2 ranks (nothing passes through), stay whole.
///
/// 4 ranks on 2 cores, forced ring, busbw GB/s (`tutti perf C -n 4 -b 1M
/// -e 256M -f 4 -T 0.7 -c 0 -a ring`, old and new builds alternated, 3
/// rounds each): AllReduce at 64 MiB 4.2-4.4 before, 5.0-6.0 after;
/// ReduceScatter at 16-256 MiB 3.5-4.7 before, 4.7-6.4 after; Reduce at
/// 16-64 MiB 4.4-5.6 before, 6.3-7.0 after. At 1-4 MiB the two were within
/// the noise. Smaller pieces (128 KiB of f32, up to 64 of them) were
/// slower at 1-4 MiB (ReduceScatter at 1 MiB: 6.5-6.9 against 7.6-8.2).
#[derive(Clone, Copy, Debug)]
struct Pieces {
    /// Elements of the largest piece (the size of a slot).
    size: usize,
    /// Pieces per block.
    count: usize,
}

impl Pieces {
    /// Smallest piece worth a message of its own (1 MiB of f32).
    const MIN: usize = 256 * 1024;
    /// Most pieces a block is cut into.
    const MAX_COUNT: usize = 32;
    /// Most steps the pieces may make of a rank's schedule (about `2n` per
    /// piece): so many ranks cut fewer pieces. The cost model simulates
    /// every rank's schedule in time that grows with the square of its
    /// length; without this bound, tuning a 1 GiB AllReduce on 64 ranks
    /// took 27 s (0.07 s with whole blocks).
    const MAX_STEPS: usize = 256;

    /// Pieces for blocks of at most `largest` elements on `n` ranks: one
    /// per block unless `cut`, else at least `chunks` ([`Problem::chunks`],
    /// which the tuner leaves at 1 for the ring: its cost model has no
    /// term for memory traffic, which is what the pieces save; the
    /// verifier's tests set it to cut small blocks).
    fn new(largest: usize, n: usize, cut: bool, chunks: usize) -> Self {
        let count = if !cut {
            1
        } else if n < 3 || largest <= Self::MIN {
            chunks.max(1)
        } else {
            largest
                .div_ceil(Self::MIN.max(largest.div_ceil(Self::MAX_COUNT)))
                .min(Self::MAX_STEPS / (2 * n))
                .max(chunks)
                .max(1)
        };
        Pieces {
            size: largest.div_ceil(count),
            count,
        }
    }

    /// Piece `i` of a block of `len` elements (at most `largest`), as a
    /// range within the block.
    fn piece(self, len: usize, i: usize) -> std::ops::Range<usize> {
        block(len, self.count, i)
    }

    /// The next scratch slot for a partial sum (two, used in turn).
    fn slot(self, used: &mut usize) -> Loc {
        let l = Loc::scratch((*used % 2) * self.size);
        *used += 1;
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Algorithm, Buf};

    fn sched(n: usize, count: usize) -> crate::algo::Schedule {
        let p = Problem::new(Collective::AllReduce, n, 1, count);
        Algorithm::Ring.build(&p).unwrap()
    }

    #[test]
    fn large_blocks_pass_partial_sums_through_two_slots() {
        // 4 ranks, 64 MiB of f32: blocks of 4 Mi elements, 16 pieces.
        let s = sched(4, 16 << 20);
        assert_eq!(s.scratch, 2 * Pieces::MIN);
        let mut partial = 0;
        let mut into_output = 0;
        for st in &s.steps {
            if let Step::RecvReduceSend { dst, len, .. } = *st {
                assert!(len <= Pieces::MIN);
                match dst.buf {
                    Buf::Scratch => partial += len,
                    _ => into_output += len,
                }
            }
        }
        // Two of the three reduce-scatter steps pass partial sums on;
        // the last reduces into Output.
        assert_eq!((partial, into_output), (2 << 22, 1 << 22));
    }

    #[test]
    fn many_ranks_cut_fewer_pieces() {
        // 64 ranks, 1 GiB of f32: blocks of 4 Mi elements would make 16
        // pieces; 256 steps allow 2.
        let s = sched(64, 256 << 20);
        assert_eq!(s.scratch, 2 * (4 << 20) / 2);
        assert!(s.steps.len() <= Pieces::MAX_STEPS, "{}", s.steps.len());
        // 4 ranks keep their 32.
        assert_eq!(Pieces::new(16 << 20, 4, true, 1).count, 32);
    }

    #[test]
    fn small_blocks_and_two_ranks_stay_whole() {
        // 4 ranks, 4 MiB: blocks of MIN elements, one piece, no scratch.
        let s = sched(4, 4 * Pieces::MIN);
        assert_eq!((s.steps.len(), s.scratch), (7, 0));
        // 2 ranks, 256 MiB: nothing passes through.
        let s = sched(2, 64 << 20);
        assert_eq!((s.steps.len(), s.scratch), (3, 0));
        // A hierarchical level: whole blocks whatever the size.
        let p = Problem::new(Collective::AllReduce, 4, 1, 16 << 20);
        assert_eq!(build_whole(&p).unwrap().len(), 7);
    }
}
