//! Recursive halving and doubling (Rabenseifner), for any number of ranks.
//!
//! Let `p` be the largest power of two `<= n` and `e = n - p`. The core runs
//! on `p` "members" numbered `0..p`; in round `d` (a power of two) member `i`
//! works with member `i ^ d`.
//!
//! ```text
//!   reduce-scatter by recursive halving, p = 4, blocks 0..4:
//!     d=2: 0<->2, 1<->3   each keeps the half of its range on its side,
//!                         sends the other half, reduces what it gets
//!     d=1: 0<->1, 2<->3   ... until member i holds block i, fully reduced
//!   all-gather by recursive doubling: the same rounds backwards (d=1, d=2),
//!   exchanging everything held so far; the ranges double each round.
//! ```
//!
//! **Non-powers of two (the fold).** `e` pairs of adjacent ranks `(r, r+1)`
//! fold: `r` hands its data to `r+1` before the core and gets the result
//! back after it; `r+1` is the pair's member, every other rank is a member
//! on its own. Members cover the ranks' blocks in rank order (a pair's
//! member owns two blocks), so the core needs no renumbering of data and
//! every count, including 0, 1 and primes, splits exactly. The pairs sit at
//! the members whose bit-reversed index is below `e`, which spreads them
//! evenly: both sides of every halving round hold the same number of blocks
//! to within one.
//!
//! ```text
//!   n = 6, p = 4, e = 2:  ranks  0 1 | 2 | 3 4 | 5
//!                         member   0   | 1 |  2  | 3     (pairs at members 0, 2)
//! ```
//!
//! * **AllReduce**: fold, reduce-scatter of `p` element groups, all-gather,
//!   unfold. Per rank: `2 log2 p` latency steps and `2 (p-1)/p * S` bytes for
//!   a power of two; otherwise the paired ranks add 2 steps and `S` each way.
//! * **ReduceScatter**: fold (the first rank of a pair sends its whole `n*c`
//!   input), then halving over the ranks' blocks; in the last round a member
//!   that owns two blocks passes its pair's block on to it in a fused step.
//!   `log2 p` steps; a member sends the `n*c` input less its own blocks; a
//!   folded rank sends `n*c`, and its pair's path gains 2 steps.
//! * **AllGather**: fold (the first rank of a pair gives its block),
//!   doubling over the ranks' blocks, then the pair's member sends the other
//!   everything it lacks. `log2 p` steps and about `(n-1)/n * n*c` elements
//!   sent; a pair's member sends about twice that, in 2 more steps.
//!
//! Partial sums live in Output (AllReduce) or Scratch (ReduceScatter): Input
//! is only read. Empty messages (counts below `p`) are skipped by both sides.
//!
//! # Bitwise identical results
//!
//! Every element is reduced completely on exactly one member (the owner of
//! its block after the last halving round), along a pairing tree fixed by
//! `n`; the all-gather and the unfold only copy that value to the others.

#![forbid(unsafe_code)]

use super::tree::prev_pow2;
use super::{block, Collective, Loc, Problem, Step};
use std::ops::Range;

/// The fold: which ranks pair up, and how ranks and their blocks map to
/// members.
struct Fold {
    /// Members (a power of two).
    p: usize,
    /// `first[i]`: the first rank (and rank block) of member `i`; `first[p] = n`.
    first: Vec<usize>,
}

impl Fold {
    /// Member `i` stands for two ranks when the bit-reversal of `i` (over
    /// `log2 p` bits) is below `n - p`: the pairs are spread evenly, so each
    /// half of every halving round holds nearly the same number of blocks.
    fn new(n: usize) -> Self {
        let p = prev_pow2(n);
        let bits = p.trailing_zeros();
        let rev = |i: usize| {
            i.reverse_bits()
                .checked_shr(usize::BITS - bits)
                .unwrap_or(0)
        };
        let mut first = vec![0];
        for i in 0..p {
            first.push(first[i] + 1 + usize::from(rev(i) < n - p));
        }
        Fold { p, first }
    }

    /// True when member `i` stands for two ranks.
    fn paired(&self, i: usize) -> bool {
        self.first[i + 1] - self.first[i] == 2
    }

    /// The member rank `r` acts as, or `None` for a rank that folds away
    /// into rank `r + 1`. A paired member is the second rank of its pair.
    fn member(&self, r: usize) -> Option<usize> {
        let i = self.first.partition_point(|&f| f <= r) - 1;
        (!self.paired(i) || r > self.first[i]).then_some(i)
    }

    /// The rank acting as member `i`.
    fn rank(&self, i: usize) -> usize {
        self.first[i + 1] - 1
    }

    /// First rank block owned by member `i` (`n` for `i == p`).
    fn first_block(&self, i: usize) -> usize {
        self.first[i]
    }
}

/// Pushes a step unless it moves no elements.
fn push(s: &mut Vec<Step>, st: Step) {
    if !st.is_empty() {
        s.push(st);
    }
}

/// The halving rounds for member `i` over `p` members: for each round, the
/// partner, the member range kept and the member range given away.
fn halving(p: usize, i: usize) -> Vec<(usize, Range<usize>, Range<usize>)> {
    let mut out = Vec::new();
    let (mut lo, mut hi) = (0, p);
    let mut d = p / 2;
    while d >= 1 {
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if i & d == 0 {
            (lo..mid, mid..hi)
        } else {
            (mid..hi, lo..mid)
        };
        out.push((i ^ d, keep.clone(), give));
        (lo, hi) = (keep.start, keep.end);
        d /= 2;
    }
    out
}

/// The doubling rounds for member `i`: partner, the member range held, and
/// the partner's range.
fn doubling(p: usize, i: usize) -> Vec<(usize, Range<usize>, Range<usize>)> {
    let mut out = Vec::new();
    let mut d = 1;
    while d < p {
        let lo = i & !(d - 1);
        let mine = lo..lo + d;
        let theirs = (lo ^ d)..(lo ^ d) + d;
        out.push((i ^ d, mine, theirs));
        d *= 2;
    }
    out
}

/// Builds the halving-doubling schedule, or `None` for collectives it does not do.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let mut s = Vec::new();
    match p.coll {
        Collective::AllReduce => all_reduce(&mut s, p),
        Collective::ReduceScatter => reduce_scatter(&mut s, p),
        Collective::AllGather => all_gather(&mut s, p),
        _ => return None,
    }
    Some(s)
}

/// Rabenseifner AllReduce: fold, halving reduce-scatter, doubling all-gather, unfold.
fn all_reduce(s: &mut Vec<Step>, pb: &Problem) {
    let (n, r, c) = (pb.nranks, pb.rank, pb.count);
    if c == 0 || (n == 1 && pb.in_place) {
        return;
    }
    let all = |src, dst| Step::Copy { src, dst, len: c };
    if n == 1 {
        s.push(all(Loc::input(0), Loc::output(0)));
        return;
    }
    let f = Fold::new(n);
    // Element range of member groups a..b (group g = block(c, p, g)).
    let el = |g: &Range<usize>| block(c, f.p, g.start).start..block(c, f.p, g.end - 1).end;
    let Some(i) = f.member(r) else {
        s.push(Step::Send {
            peer: r + 1,
            src: Loc::input(0),
            len: c,
        });
        s.push(Step::Recv {
            peer: r + 1,
            dst: Loc::output(0),
            len: c,
        });
        return;
    };
    let folded = f.paired(i);
    if folded {
        s.push(Step::RecvReduce {
            peer: r - 1,
            src: Loc::input(0),
            dst: Loc::output(0),
            len: c,
        });
    }
    // Where this rank's current partial of each element is.
    let mut cur: fn(usize) -> Loc = if folded { Loc::output } else { Loc::input };
    for (q, keep, give) in halving(f.p, i) {
        let peer = f.rank(q);
        let (k, g) = (el(&keep), el(&give));
        push(
            s,
            Step::Send {
                peer,
                src: cur(g.start),
                len: g.len(),
            },
        );
        push(
            s,
            Step::RecvReduce {
                peer,
                src: cur(k.start),
                dst: Loc::output(k.start),
                len: k.len(),
            },
        );
        cur = Loc::output;
    }
    for (q, mine, theirs) in doubling(f.p, i) {
        let peer = f.rank(q);
        let (m, t) = (el(&mine), el(&theirs));
        push(
            s,
            Step::Send {
                peer,
                src: Loc::output(m.start),
                len: m.len(),
            },
        );
        push(
            s,
            Step::Recv {
                peer,
                dst: Loc::output(t.start),
                len: t.len(),
            },
        );
    }
    if folded {
        s.push(Step::Send {
            peer: r - 1,
            src: Loc::output(0),
            len: c,
        });
    }
}

/// ReduceScatter by recursive halving over the ranks' blocks.
fn reduce_scatter(s: &mut Vec<Step>, pb: &Problem) {
    let (n, r, c) = (pb.nranks, pb.rank, pb.count);
    if c == 0 {
        return;
    }
    if n == 1 {
        s.push(Step::Copy {
            src: Loc::input(0),
            dst: Loc::output(0),
            len: c,
        });
        return;
    }
    let f = Fold::new(n);
    // Element range (in Input) of the rank blocks owned by members a..b.
    let el = |g: &Range<usize>| f.first_block(g.start) * c..f.first_block(g.end) * c;
    let Some(i) = f.member(r) else {
        s.push(Step::Send {
            peer: r + 1,
            src: Loc::input(0),
            len: n * c,
        });
        s.push(Step::Recv {
            peer: r + 1,
            dst: Loc::output(0),
            len: c,
        });
        return;
    };
    let folded = f.paired(i);
    if folded {
        s.push(Step::RecvReduce {
            peer: r - 1,
            src: Loc::input(0),
            dst: Loc::scratch(0),
            len: n * c,
        });
    }
    let mut cur: fn(usize) -> Loc = if folded { Loc::scratch } else { Loc::input };
    let rounds = halving(f.p, i);
    let last = rounds.len() - 1;
    for (j, (q, keep, give)) in rounds.into_iter().enumerate() {
        let peer = f.rank(q);
        if j < last {
            let (k, g) = (el(&keep), el(&give));
            s.push(Step::Send {
                peer,
                src: cur(g.start),
                len: g.len(),
            });
            s.push(Step::RecvReduce {
                peer,
                src: cur(k.start),
                dst: Loc::scratch(k.start),
                len: k.len(),
            });
            cur = Loc::scratch;
            continue;
        }
        // Last round: one message per rank block, so each lands where it belongs.
        for b in f.first_block(give.start)..f.first_block(give.end) {
            s.push(Step::Send {
                peer,
                src: cur(b * c),
                len: c,
            });
        }
        for b in f.first_block(keep.start)..f.first_block(keep.end) {
            let src = cur(b * c);
            if b == r {
                s.push(Step::RecvReduce {
                    peer,
                    src,
                    dst: Loc::output(0),
                    len: c,
                });
            } else {
                let dst = Loc::scratch(b * c);
                s.push(Step::RecvReduceSend {
                    from: peer,
                    to: b,
                    src,
                    dst,
                    len: c,
                });
            }
        }
    }
}

/// AllGather by recursive doubling over the ranks' blocks.
fn all_gather(s: &mut Vec<Step>, pb: &Problem) {
    let (n, r, c) = (pb.nranks, pb.rank, pb.count);
    if c == 0 || n == 1 {
        return;
    }
    let f = Fold::new(n);
    let el = |g: &Range<usize>| f.first_block(g.start) * c..f.first_block(g.end) * c;
    let Some(i) = f.member(r) else {
        s.push(Step::Send {
            peer: r + 1,
            src: Loc::output(r * c),
            len: c,
        });
        push(
            s,
            Step::Recv {
                peer: r + 1,
                dst: Loc::output(0),
                len: r * c,
            },
        );
        s.push(Step::Recv {
            peer: r + 1,
            dst: Loc::output((r + 1) * c),
            len: (n - r - 1) * c,
        });
        return;
    };
    let folded = f.paired(i);
    if folded {
        s.push(Step::Recv {
            peer: r - 1,
            dst: Loc::output((r - 1) * c),
            len: c,
        });
    }
    for (q, mine, theirs) in doubling(f.p, i) {
        let peer = f.rank(q);
        let (m, t) = (el(&mine), el(&theirs));
        s.push(Step::Send {
            peer,
            src: Loc::output(m.start),
            len: m.len(),
        });
        s.push(Step::Recv {
            peer,
            dst: Loc::output(t.start),
            len: t.len(),
        });
    }
    if folded {
        push(
            s,
            Step::Send {
                peer: r - 1,
                src: Loc::output(0),
                len: (r - 1) * c,
            },
        );
        s.push(Step::Send {
            peer: r - 1,
            src: Loc::output(r * c),
            len: (n - r) * c,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_maps_ranks_and_blocks_consistently() {
        for n in 1..=70 {
            let f = Fold::new(n);
            assert!(f.p.is_power_of_two() && f.p <= n && n < 2 * f.p);
            for i in 0..f.p {
                assert_eq!(f.member(f.rank(i)), Some(i));
                let blocks = f.first_block(i)..f.first_block(i + 1);
                assert!(
                    blocks.contains(&f.rank(i)),
                    "n={n}: member {i} owns its rank's block"
                );
                assert_eq!(blocks.len(), if f.paired(i) { 2 } else { 1 });
            }
            assert_eq!(f.first_block(f.p), n);
            let away = (0..n).filter(|&r| f.member(r).is_none()).count();
            assert_eq!(away, n - f.p);
            // Every halving split keeps the blocks of the two sides within one.
            for i in 0..f.p {
                for (_, keep, give) in halving(f.p, i) {
                    let blocks = |g: &Range<usize>| f.first_block(g.end) - f.first_block(g.start);
                    assert!(
                        blocks(&keep).abs_diff(blocks(&give)) <= 1,
                        "n={n}: {keep:?} {give:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounds_are_symmetric() {
        for p in [1, 2, 4, 8, 16] {
            for i in 0..p {
                for (j, (q, keep, give)) in halving(p, i).into_iter().enumerate() {
                    let (q2, keep2, give2) = halving(p, q)[j].clone();
                    assert_eq!((q2, &keep2, &give2), (i, &give, &keep));
                }
                let last = halving(p, i).last().map(|x| x.1.clone());
                assert_eq!(last.unwrap_or(0..1), i..i + 1);
                for (j, (q, mine, theirs)) in doubling(p, i).into_iter().enumerate() {
                    assert_eq!(doubling(p, q)[j], (i, theirs, mine));
                }
            }
        }
    }
}
