//! Hierarchical algorithms: ranks on one host talk through shared memory,
//! hosts talk through the network, and the network carries as little as
//! possible.
//!
//! The ranks form a grid: host h, local rank l (every host must have the
//! same number L of ranks; otherwise these builders return `None` and the
//! tuner uses a flat algorithm). A "row" is the L ranks of one host; a
//! "column" is the H ranks with the same local rank on every host.
//!
//! ```text
//!            l=0   l=1   l=2          AllReduce of S bytes:
//!   host 0   r0 -- r1 -- r2   row     1. ring reduce-scatter in each row:
//!             |     |     |               rank (h,l) holds 1/L of the host's sum
//!   host 1   r3 -- r4 -- r5           2. all-reduce in each column on that
//!             |     |     |               1/L: all L columns run in parallel
//!          column                     3. ring all-gather in each row
//! ```
//!
//! Each level runs a flat algorithm ([`Levels`]): `intra` in the rows,
//! `inter` in the columns (rings unless chosen otherwise). A level's step
//! is that flat algorithm's own schedule for the sub-group, built by its
//! builder and laid into this rank's schedule ([`Sub`]): sub-ranks become
//! the group's global ranks and the sub-problem's buffers become places in
//! this problem's buffers. The variant implements a collective when both
//! level algorithms implement their steps (below); otherwise `build` returns
//! `None`, as a flat algorithm does for a collective it lacks.
//!
//! Bytes a host sends over the network for AllReduce with a ring across
//! hosts: `2(H-1)/H * S` in total (each of its L ranks sends
//! `2(H-1)/H * S/L`), against `2(n-1)/n * S` per rank boundary for a flat
//! ring laid across hosts.
//!
//! | collective | intra (rows) | inter (columns) |
//! |---|---|---|
//! | AllReduce | ring only: reduce-scatter, then all-gather, in blocks of `c/L` | AllReduce of the rank's `c/L` block (any level algorithm) |
//! | AllGather | AllGather whose unit is a whole column of H blocks (ring, halving_doubling, direct) | first: AllGather of each rank's block (same three) |
//! | ReduceScatter | first: ReduceScatter whose unit is a column's H blocks, partial sums in scratch (ring, halving_doubling) | ReduceScatter of those partials (same two) |
//! | Broadcast | from the rank in the root's column (ring = chain, tree, direct) | first, in the root's column only: from the root (same three) |
//! | Reduce | first: towards the rank in the root's column, into scratch (ring = chain, tree, direct) | then in the root's column: towards the root (same three) |
//!
//! AllReduce's row steps split the buffer into L blocks that differ by at
//! most one element, which no flat ReduceScatter (equal blocks) expresses:
//! they stay ring-only here, and `intra` must be `ring` for AllReduce.
//!
//! Every element is reduced in a fixed order determined by the grid and the
//! level algorithms (each of which reduces an element once, or identically
//! on every rank) and copied to the other ranks, so every rank gets bitwise
//! identical results.

#![forbid(unsafe_code)]

use super::{block, Buf, Collective, Level, Levels, Loc, Problem, Step};

/// A piece of a buffer: (offset, length) in elements.
type Seg = (usize, usize);

/// The grid of a problem: `host_of[r]` for every rank.
struct Grid {
    /// rows[h][l] = global rank.
    rows: Vec<Vec<usize>>,
    h: usize,
    l: usize,
}

impl Grid {
    fn new(host_of: &[usize], me: usize) -> Option<(Grid, usize, usize)> {
        let hosts = host_of.iter().copied().max()? + 1;
        let mut rows = vec![Vec::new(); hosts];
        for (r, &h) in host_of.iter().enumerate() {
            rows[h].push(r);
        }
        let l = rows[0].len();
        if hosts < 2 || l < 2 || rows.iter().any(|r| r.len() != l) {
            return None;
        }
        let my_h = host_of[me];
        let my_l = rows[my_h].iter().position(|&r| r == me)?;
        Some((Grid { rows, h: hosts, l }, my_h, my_l))
    }

    fn row(&self, h: usize) -> Vec<usize> {
        self.rows[h].clone()
    }

    fn column(&self, l: usize) -> Vec<usize> {
        self.rows.iter().map(|r| r[l]).collect()
    }

    /// The (host, local rank) of global rank `r`.
    fn position(&self, r: usize) -> Option<(usize, usize)> {
        self.rows
            .iter()
            .enumerate()
            .find_map(|(h, row)| row.iter().position(|&x| x == r).map(|l| (h, l)))
    }
}

fn loc(buf: Buf, off: usize) -> Loc {
    Loc { buf, off }
}

/// Ring reduce-scatter among `members` (global ranks, ring order), this rank
/// at index `i`. `blocks[j]` lists the segments of block j. Reads `src`,
/// writes partial and final sums to `dst`. Afterwards member i holds block
/// `(i + 1) % k` fully reduced in `dst`.
fn ring_reduce_scatter(
    s: &mut Vec<Step>,
    members: &[usize],
    i: usize,
    blocks: &[Vec<Seg>],
    src: Buf,
    dst: Buf,
) {
    let k = members.len();
    if k == 1 {
        if src != dst {
            for &(o, n) in &blocks[0] {
                s.push(Step::Copy {
                    src: loc(src, o),
                    dst: loc(dst, o),
                    len: n,
                });
            }
        }
        return;
    }
    let right = members[(i + 1) % k];
    let left = members[(i + k - 1) % k];
    for &(o, n) in &blocks[i] {
        s.push(Step::Send {
            peer: right,
            src: loc(src, o),
            len: n,
        });
    }
    for st in 0..k - 1 {
        let j = (i + 2 * k - 1 - st) % k;
        for &(o, n) in &blocks[j] {
            if st + 2 < k {
                s.push(Step::RecvReduceSend {
                    from: left,
                    to: right,
                    src: loc(src, o),
                    dst: loc(dst, o),
                    len: n,
                });
            } else {
                s.push(Step::RecvReduce {
                    peer: left,
                    src: loc(src, o),
                    dst: loc(dst, o),
                    len: n,
                });
            }
        }
    }
}

/// Ring all-gather among `members`: member i starts with block `(i + 1) % k`
/// (or `i` if `shift` is 0) in `buf` and ends with all of them.
fn ring_all_gather(
    s: &mut Vec<Step>,
    members: &[usize],
    i: usize,
    blocks: &[Vec<Seg>],
    buf: Buf,
    shift: usize,
) {
    let k = members.len();
    if k == 1 {
        return;
    }
    let right = members[(i + 1) % k];
    let left = members[(i + k - 1) % k];
    for &(o, n) in &blocks[(i + shift) % k] {
        s.push(Step::Send {
            peer: right,
            src: loc(buf, o),
            len: n,
        });
    }
    for t in 0..k - 1 {
        let j = (i + shift + 2 * k - 1 - t) % k;
        for &(o, n) in &blocks[j] {
            if t + 2 < k {
                s.push(Step::RecvCopySend {
                    from: left,
                    to: right,
                    dst: loc(buf, o),
                    len: n,
                });
            } else {
                s.push(Step::Recv {
                    peer: left,
                    dst: loc(buf, o),
                    len: n,
                });
            }
        }
    }
}

/// Where one of a sub-schedule's buffers lies in this rank's buffers.
enum Place {
    /// Sub-offset `x` is at `at.off + x` in `at.buf`.
    At(Loc),
    /// Sub-offset `x` is at `pieces[x / unit].off + x % unit`: the buffer
    /// is made of `unit`-long pieces scattered over this rank's buffers.
    Pieces(Vec<Loc>),
}

/// A flat schedule of a sub-group, to be laid into this rank's schedule.
struct Sub<'a> {
    /// The global rank of each sub-rank.
    members: &'a [usize],
    /// Where the sub-problem's Input, Output and Scratch lie.
    input: Place,
    output: Place,
    scratch: Place,
    /// Every step is cut where an operand crosses a multiple of `unit`
    /// (0: no cuts). Both sides of a message cut it at the same points as
    /// long as their offsets agree modulo `unit`, which holds for the flat
    /// builders used here (whole blocks, scratch laid out like Input).
    unit: usize,
}

impl Sub<'_> {
    fn place(&self, l: Loc) -> Loc {
        let p = match l.buf {
            Buf::Input => &self.input,
            Buf::Output => &self.output,
            Buf::Scratch => &self.scratch,
        };
        match p {
            Place::At(at) => loc(at.buf, at.off + l.off),
            Place::Pieces(v) => {
                let at = v[l.off / self.unit];
                loc(at.buf, at.off + l.off % self.unit)
            }
        }
    }

    /// Appends `steps` (a flat builder's schedule for the sub-problem) to
    /// `s`, in global ranks and this rank's buffers. Empty steps are dropped
    /// (on both sides of a message alike).
    fn lay(&self, s: &mut Vec<Step>, steps: Vec<Step>) {
        for st in steps {
            if matches!(st, Step::Fence) {
                s.push(st);
                continue;
            }
            let len = st.len();
            if len == 0 {
                continue;
            }
            let locs: Vec<Loc> = match st {
                Step::Send { src, .. } => vec![src],
                Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => vec![dst],
                Step::RecvReduce { src, dst, .. }
                | Step::RecvReduceSend { src, dst, .. }
                | Step::Copy { src, dst, .. }
                | Step::Reduce { src, dst, .. } => vec![src, dst],
                Step::Fence => vec![],
            };
            let mut cuts = vec![0, len];
            if self.unit > 0 {
                for l in &locs {
                    let first = (self.unit - l.off % self.unit) % self.unit;
                    cuts.extend((first..len).step_by(self.unit));
                }
            }
            cuts.sort_unstable();
            cuts.dedup();
            for w in cuts.windows(2) {
                let (a, n) = (w[0], w[1] - w[0]);
                let m = |l: Loc| self.place(loc(l.buf, l.off + a));
                let g = |q: usize| self.members[q];
                s.push(match st {
                    Step::Send { peer, src, .. } => Step::Send {
                        peer: g(peer),
                        src: m(src),
                        len: n,
                    },
                    Step::Recv { peer, dst, .. } => Step::Recv {
                        peer: g(peer),
                        dst: m(dst),
                        len: n,
                    },
                    Step::RecvReduce { peer, src, dst, .. } => Step::RecvReduce {
                        peer: g(peer),
                        src: m(src),
                        dst: m(dst),
                        len: n,
                    },
                    Step::RecvReduceSend {
                        from, to, src, dst, ..
                    } => Step::RecvReduceSend {
                        from: g(from),
                        to: g(to),
                        src: m(src),
                        dst: m(dst),
                        len: n,
                    },
                    Step::RecvCopySend { from, to, dst, .. } => Step::RecvCopySend {
                        from: g(from),
                        to: g(to),
                        dst: m(dst),
                        len: n,
                    },
                    Step::Copy { src, dst, .. } => Step::Copy {
                        src: m(src),
                        dst: m(dst),
                        len: n,
                    },
                    Step::Reduce { src, dst, .. } => Step::Reduce {
                        src: m(src),
                        dst: m(dst),
                        len: n,
                    },
                    Step::Fence => Step::Fence,
                });
            }
        }
    }
}

/// The first scratch element that no step of `s` touches.
fn scratch_end(s: &[Step]) -> usize {
    s.iter()
        .flat_map(|st| st.reads().into_iter().chain(st.writes()))
        .filter(|(b, _)| *b == Buf::Scratch)
        .map(|(_, r)| r.end)
        .max()
        .unwrap_or(0)
}

/// `level`'s flat schedule of `coll` among `n` ranks, as sub-rank `rank`.
fn flat(
    level: Level,
    coll: Collective,
    n: usize,
    rank: usize,
    count: usize,
    p: &Problem,
) -> Option<Vec<Step>> {
    let mut q = Problem::new(coll, n, rank, count);
    q.chunks = p.chunks;
    q.in_place = coll == Collective::AllReduce;
    level.algorithm().steps(&q)
}

/// Builds the hierarchical schedule with `levels`, or `None` when the
/// layout is not a uniform grid of at least 2 hosts x 2 ranks, the
/// collective is not covered, or a level's algorithm does not implement
/// its step.
pub(super) fn build(p: &Problem, levels: Levels) -> Option<Vec<Step>> {
    let host_of = p.hosts.as_deref()?;
    if host_of.len() != p.nranks {
        return None;
    }
    let (g, my_h, my_l) = Grid::new(host_of, p.rank)?;
    let (c, h, l) = (p.count, g.h, g.l);
    let row = g.row(my_h);
    let col = g.column(my_l);
    let out = |off| Place::At(loc(Buf::Output, off));
    let scr = |off| Place::At(loc(Buf::Scratch, off));
    let inp = |off| Place::At(loc(Buf::Input, off));
    let mut s = Vec::new();
    match p.coll {
        Collective::AllReduce => {
            if levels.intra != Level::Ring {
                return None;
            }
            let rb: Vec<Vec<Seg>> = (0..l)
                .map(|j| {
                    let b = block(c, l, j);
                    vec![(b.start, b.len())]
                })
                .collect();
            ring_reduce_scatter(&mut s, &row, my_l, &rb, Buf::Input, Buf::Output);
            // This rank owns row block (my_l + 1) % L: all-reduce it, in
            // place, down the column.
            let own = block(c, l, (my_l + 1) % l);
            let steps = flat(levels.inter, p.coll, h, my_h, own.len(), p)?;
            let sub = Sub {
                members: &col,
                input: out(own.start),
                output: out(own.start),
                scratch: scr(scratch_end(&s)),
                unit: 0,
            };
            sub.lay(&mut s, steps);
            ring_all_gather(&mut s, &row, my_l, &rb, Buf::Output, 1);
        }
        Collective::AllGather => {
            // Column step: block j of the sub-problem is column member j's block.
            let steps = flat(levels.inter, p.coll, h, my_h, c, p)?;
            let sub = Sub {
                members: &col,
                input: inp(0),
                output: Place::Pieces(col.iter().map(|&r| loc(Buf::Output, r * c)).collect()),
                scratch: scr(0),
                unit: c,
            };
            sub.lay(&mut s, steps);
            // Row step: block j (H*c long) is the whole column of local rank j.
            let steps = flat(levels.intra, p.coll, l, my_l, h * c, p)?;
            let pieces = (0..l)
                .flat_map(|j| g.column(j))
                .map(|r| loc(Buf::Output, r * c))
                .collect();
            let sub = Sub {
                members: &row,
                input: inp(0),
                output: Place::Pieces(pieces),
                scratch: scr(scratch_end(&s)),
                unit: c,
            };
            sub.lay(&mut s, steps);
        }
        Collective::ReduceScatter => {
            // Row step: block j (H*c long) of the sub-problem's input is
            // column j's H blocks; this rank ends with its column's partial
            // sums in Scratch[0..H*c], column member k's block at k*c.
            let steps = flat(levels.intra, p.coll, l, my_l, h * c, p)?;
            let pieces = (0..l)
                .flat_map(|j| g.column(j))
                .map(|r| loc(Buf::Input, r * c))
                .collect();
            let sub = Sub {
                members: &row,
                input: Place::Pieces(pieces),
                output: scr(0),
                scratch: scr(h * c),
                unit: c,
            };
            sub.lay(&mut s, steps);
            // Column step: reduce-scatter those partials.
            let steps = flat(levels.inter, p.coll, h, my_h, c, p)?;
            let sub = Sub {
                members: &col,
                input: scr(0),
                output: out(0),
                scratch: scr(scratch_end(&s).max(h * c)),
                unit: 0,
            };
            sub.lay(&mut s, steps);
        }
        Collective::Broadcast { root } => {
            let (rh, rl) = g.position(root)?;
            // Built on every rank, so that all agree on whether the variant
            // implements the collective.
            let across = flat(
                levels.inter,
                Collective::Broadcast { root: rh },
                h,
                my_h,
                c,
                p,
            )?;
            let within = flat(
                levels.intra,
                Collective::Broadcast { root: rl },
                l,
                my_l,
                c,
                p,
            )?;
            if my_l == rl {
                let sub = Sub {
                    members: &col,
                    input: inp(0),
                    output: out(0),
                    scratch: scr(0),
                    unit: 0,
                };
                sub.lay(&mut s, across);
            }
            let sub = Sub {
                members: &row,
                input: inp(0),
                output: out(0),
                scratch: scr(scratch_end(&s)),
                unit: 0,
            };
            sub.lay(&mut s, within);
        }
        Collective::Reduce { root } => {
            let (rh, rl) = g.position(root)?;
            let within = flat(levels.intra, Collective::Reduce { root: rl }, l, my_l, c, p)?;
            let across = flat(levels.inter, Collective::Reduce { root: rh }, h, my_h, c, p)?;
            // Row step towards the rank in the root's column, whose result
            // lands in Scratch[0..c].
            let sub = Sub {
                members: &row,
                input: inp(0),
                output: scr(0),
                scratch: scr(c),
                unit: 0,
            };
            sub.lay(&mut s, within);
            if my_l == rl {
                // Column step from those results towards the root.
                let sub = Sub {
                    members: &col,
                    input: scr(0),
                    output: out(0),
                    scratch: scr(scratch_end(&s).max(c)),
                    unit: 0,
                };
                sub.lay(&mut s, across);
            }
        }
        _ => return None,
    }
    Some(s)
}
