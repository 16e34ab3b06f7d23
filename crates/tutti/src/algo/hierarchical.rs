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
//!                                     per piece of the buffer, the pieces
//!                                     overlapping (see Pipelining)
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
//! | AllReduce | ring only: reduce-scatter, then all-gather, in blocks of `c/L` (per piece) | AllReduce of the rank's `c/L` block (per piece; any level algorithm) |
//! | AllGather | second: AllGather whose unit is a whole column of H blocks (per piece; ring, halving_doubling, direct) | first: AllGather of each rank's block (per piece; same three) |
//! | ReduceScatter | first: ReduceScatter whose unit is a column's H blocks, partial sums in scratch (per piece; ring, halving_doubling) | ReduceScatter of those partials (per piece; same two) |
//! | Broadcast | from the rank in the root's column (per piece; ring = chain, tree, direct) | first, in the root's column only: from the root (per piece; same three) |
//! | Reduce | first: towards the rank in the root's column, into scratch (per piece; ring = chain, tree, direct) | then in the root's column: towards the root (per piece; same three) |
//! | AllToAll | first: AllToAll whose unit is a column's H pieces: each row peer gets what this rank has for its whole column; its own host's piece lands in Output, the others in scratch (per piece; direct) | AllToAll of those, L pieces per host, into Output (per piece; direct) |
//!
//! AllToAll moves the same bytes across hosts as a flat AllToAll, but each
//! host's link carries L flows (one per column) instead of L x L (every
//! rank of one host to every rank of the other): on the namespace cluster
//! the fewer, larger TCP flows end a call with less of the link idle
//! (`docs/algorithms.md`). The cost is one more pass over the data through
//! shared memory, pipelined under the network step.
//!
//! # Pipelining
//!
//! Run one after the other, the phases leave the network idle while the
//! host works on its shared-memory phases. So every collective here cuts
//! the data into `K` pieces (AllReduce, Broadcast, Reduce: of the buffer;
//! AllGather, ReduceScatter, AllToAll: the same range of every rank's
//! block) and runs
//! the phases of one piece while the network carries another. `K` comes
//! from the size: as many pieces as hold [`MIN_PIECE`] elements (counting
//! the whole `n*c` of AllGather, ReduceScatter and AllToAll), at least 1 and at most
//! 8, or more on small grids (32 on up to 8 ranks, 16 on 16; see [`pieces`]);
//! small calls have one piece and the unpipelined schedule.
//! Every level choice is pipelined the same way; `Problem::chunks` still
//! goes to the level algorithms (a tree level cuts each piece's step).
//!
//! The steps are emitted software-pipeline style, the same order on every
//! rank. AllReduce, for K = 4 (RS = row reduce-scatter, X = the column's
//! network all-reduce, AG = row all-gather):
//!
//! ```text
//!   RS0 | RS1 X0 | RS2 X1 AG0 | RS3 X2 AG1 | X3 AG2 | AG3
//! ```
//!
//! Messages to and from each peer are matched in schedule order, and a
//! rank's row peers and column peers are different ranks, so the row queues
//! carry `RS0 RS1 RS2 AG0 RS3 AG1 AG2 AG3` and the column queues `X0 X1 X2
//! X3`. Pieces are disjoint ranges (each piece's level steps get their own
//! scratch), so a step depends only on the earlier phases of its own piece:
//! `Xi` on `RSi` and `AGi` on `Xi`. No queue waits on a later piece, so
//! there is no cycle; the verifier (which assumes no buffering) checks this
//! for every level choice (`hierarchical_pipelined` in
//! `algo/verify/tests.rs`). Row reduce-scatters run two pieces ahead of the
//! all-gathers ([`LEAD`]): while `X(i+1)` is on the network, the host
//! all-gathers piece `i` and reduce-scatters piece `i+2`, so the next network
//! step finds its input ready. AllGather runs `X0 | X1 AG0 | ... | AG(K-1)`
//! (the network step first), ReduceScatter and AllToAll
//! `RS0 | RS1 X0 | ... | X(K-1)` (the row step first), Broadcast `X0 R0 |
//! X1 R1 | ...` (the network first; a row forwards piece i while piece
//! i + 1 crosses) and Reduce `R0 X0 | R1 X1 | ...`.
//!
//! Broadcast on 2 namespace hosts x 2 ranks (1 Gbit/s tbf), before it was
//! cut: the receiving host's column rank forwarded the whole message to
//! its row only once all of it had crossed, and the tuner's pick reached
//! 93.9-96.7% of the link at 16 and 64 MiB against the flat chain's
//! 99.5-99.9%; cut, 99.5-100% (`docs/algorithms.md`).
//!
//! Measured with `bench/cluster.sh --rph "2 4" --algos auto,ring,hierarchical
//! --colls all_reduce --min 16M --max 64M` (2 namespace hosts, 1 Gbit/s tbf
//! links, 2-core machine otherwise idle), AllReduce at 16 and 64 MiB, time
//! of the host-ordered flat ring over hierarchical's: 2 x 2 ranks
//! 1.40-1.46x (93-97% of the link) unpipelined, 1.49-1.52x (98.8-99.8%)
//! pipelined; 2 x 4 ranks 1.61-1.65x (92-94%) unpipelined, 1.73-1.75x
//! (98.4-99.0%) pipelined, against bounds of 1.5x and 1.75x.
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
            Buf::Wire => unreachable!("levels are laid out before the wire lowering"),
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
                Step::Recv { dst, .. }
                | Step::RecvCopySend { dst, .. }
                | Step::Scale { dst, .. } => vec![dst],
                Step::RecvReduce { src, dst, .. }
                | Step::RecvReduceSend { src, dst, .. }
                | Step::Copy { src, dst, .. }
                | Step::Reduce { src, dst, .. } => vec![src, dst],
                Step::Fence => vec![],
                Step::Narrow { .. }
                | Step::Widen { .. }
                | Step::WidenReduce { .. }
                | Step::Round { .. } => {
                    unreachable!("levels are laid out before the wire lowering")
                }
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
                    Step::Scale { dst, divisor, .. } => Step::Scale {
                        dst: m(dst),
                        len: n,
                        divisor,
                    },
                    Step::Fence => Step::Fence,
                    Step::Narrow { .. }
                    | Step::Widen { .. }
                    | Step::WidenReduce { .. }
                    | Step::Round { .. } => unreachable!("checked above"),
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

/// Smallest piece of a pipelined collective, in elements (1 MiB of f32).
const MIN_PIECE: usize = 256 << 10;

/// Most pieces a pipelined collective is cut into: 8, or up to 32 where
/// pieces times ranks stays within [`PIECE_RANKS`].
const MAX_PIECES: usize = 32;

/// Pieces times ranks beyond which no more than 8 pieces are cut. The
/// tuner simulates every rank's schedule, in time that grows with the
/// square of its length: 32 pieces on 4 x 8 ranks took 2 s to price a
/// 1 GiB ReduceScatter against 0.17 s with 8.
const PIECE_RANKS: usize = 256;

/// How many pieces a collective whose whole buffer is `count` elements is
/// cut into on `n` ranks: as many as hold [`MIN_PIECE`] elements each, at
/// least 1, at most 8, or more on small grids (up to [`MAX_PIECES`], with
/// `pieces * n <= PIECE_RANKS`). Smaller pieces shorten a call's start
/// (the host's first row step, before anything crosses the network):
/// ReduceScatter on 2 namespace hosts x 4 ranks at 64 MiB reached 94.3-97.4%
/// of the link with 8 pieces and 97.5-99.1% with 32 (`docs/algorithms.md`).
fn pieces(count: usize, n: usize) -> usize {
    let most = (PIECE_RANKS / n.max(1)).clamp(8, MAX_PIECES);
    (count / MIN_PIECE).clamp(1, most)
}

/// How many pieces AllReduce's row reduce-scatters run ahead of its row
/// all-gathers on the row queues: piece i + 2's reduce-scatter and piece
/// i's all-gather surround piece i + 1's network step.
const LEAD: usize = 2;

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
    match level {
        // Pieces are cut here, for both levels alike.
        Level::Ring => super::ring::build_whole(&q),
        _ => level.algorithm().steps(&q),
    }
}

/// Builds the hierarchical schedule with `levels`, or `None` when the
/// layout is not a uniform grid of at least 2 hosts x 2 ranks, the
/// collective is not covered, or a level's algorithm does not implement
/// its step.
pub(super) fn build(p: &Problem, levels: Levels) -> Option<Vec<Step>> {
    let whole = match p.coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            p.nranks * p.count
        }
        _ => p.count,
    };
    build_pieces(p, levels, pieces(whole, p.nranks))
}

/// [`build`], with every collective cut into `k`
/// pieces (at least 1) whatever their size: lets the verifier check the
/// pipeline on small counts.
pub(super) fn build_pieces(p: &Problem, levels: Levels, k: usize) -> Option<Vec<Step>> {
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
    let k = k.max(1);
    let mut s = Vec::new();
    match p.coll {
        Collective::AllReduce => {
            if levels.intra != Level::Ring {
                return None;
            }
            // The row blocks of piece `i`: its L nearly equal blocks.
            let row_blocks = |i: usize| -> Vec<Vec<Seg>> {
                let pc = block(c, k, i);
                (0..l)
                    .map(|j| {
                        let b = block(pc.len(), l, j);
                        vec![(pc.start + b.start, b.len())]
                    })
                    .collect()
            };
            for stage in 0..k + LEAD {
                if stage < k {
                    let rb = row_blocks(stage);
                    ring_reduce_scatter(&mut s, &row, my_l, &rb, Buf::Input, Buf::Output);
                }
                if (1..=k).contains(&stage) {
                    // This rank owns row block (my_l + 1) % L of the piece:
                    // all-reduce it, in place, down the column.
                    let (off, len) = row_blocks(stage - 1)[(my_l + 1) % l][0];
                    let steps = flat(levels.inter, p.coll, h, my_h, len, p)?;
                    let sub = Sub {
                        members: &col,
                        input: out(off),
                        output: out(off),
                        scratch: scr(scratch_end(&s)),
                        unit: 0,
                    };
                    sub.lay(&mut s, steps);
                }
                if stage >= LEAD && stage - LEAD < k {
                    let rb = row_blocks(stage - LEAD);
                    ring_all_gather(&mut s, &row, my_l, &rb, Buf::Output, 1);
                }
            }
        }
        Collective::AllGather => {
            // Piece i of every rank's block: gathered down the column, then
            // along the row; the row step of piece i runs while the column
            // step of piece i + 1 uses the network.
            let col_step = |s: &mut Vec<Step>, i: usize| -> Option<()> {
                // Block j of the sub-problem is piece i of column member j's block.
                let pc = block(c, k, i);
                let steps = flat(levels.inter, p.coll, h, my_h, pc.len(), p)?;
                let sub = Sub {
                    members: &col,
                    input: inp(0),
                    output: Place::Pieces(
                        col.iter()
                            .map(|&r| loc(Buf::Output, r * c + pc.start))
                            .collect(),
                    ),
                    scratch: scr(scratch_end(s)),
                    unit: pc.len(),
                };
                sub.lay(s, steps);
                Some(())
            };
            let row_step = |s: &mut Vec<Step>, i: usize| -> Option<()> {
                // Block j (H pieces) is piece i of the whole column of local rank j.
                let pc = block(c, k, i);
                let steps = flat(levels.intra, p.coll, l, my_l, h * pc.len(), p)?;
                let pieces = (0..l)
                    .flat_map(|j| g.column(j))
                    .map(|r| loc(Buf::Output, r * c + pc.start))
                    .collect();
                let sub = Sub {
                    members: &row,
                    input: inp(0),
                    output: Place::Pieces(pieces),
                    scratch: scr(scratch_end(s)),
                    unit: pc.len(),
                };
                sub.lay(s, steps);
                Some(())
            };
            for stage in 0..=k {
                if stage < k {
                    col_step(&mut s, stage)?;
                }
                if stage >= 1 {
                    row_step(&mut s, stage - 1)?;
                }
            }
        }
        Collective::ReduceScatter => {
            // Piece i of every block: reduce-scattered along the row, then
            // down the column; the row step of piece i + 1 runs while the
            // column step of piece i uses the network. Each piece has its
            // own scratch, so pieces share no data.
            let mut base = 0;
            let row_step = |s: &mut Vec<Step>, i: usize, base: usize| -> Option<()> {
                // Block j (H pieces) of the sub-problem's input is piece i
                // of column j's H blocks; this rank ends with piece i of its
                // column's partial sums in Scratch[base..base + H*len],
                // column member m's at base + m*len.
                let pc = block(c, k, i);
                let steps = flat(levels.intra, p.coll, l, my_l, h * pc.len(), p)?;
                let pieces = (0..l)
                    .flat_map(|j| g.column(j))
                    .map(|r| loc(Buf::Input, r * c + pc.start))
                    .collect();
                let sub = Sub {
                    members: &row,
                    input: Place::Pieces(pieces),
                    output: scr(base),
                    scratch: scr(base + h * pc.len()),
                    unit: pc.len(),
                };
                sub.lay(s, steps);
                Some(())
            };
            let col_step = |s: &mut Vec<Step>, i: usize, base: usize| -> Option<()> {
                // Reduce-scatter those partials into piece i of Output.
                let pc = block(c, k, i);
                let steps = flat(levels.inter, p.coll, h, my_h, pc.len(), p)?;
                let sub = Sub {
                    members: &col,
                    input: scr(base),
                    output: out(pc.start),
                    scratch: scr(scratch_end(s).max(base + h * pc.len())),
                    unit: 0,
                };
                sub.lay(s, steps);
                Some(())
            };
            let mut bases = Vec::with_capacity(k);
            for stage in 0..=k {
                if stage < k {
                    bases.push(base);
                    row_step(&mut s, stage, base)?;
                    base = scratch_end(&s).max(base + h * block(c, k, stage).len());
                }
                if stage >= 1 {
                    col_step(&mut s, stage - 1, bases[stage - 1])?;
                    base = base.max(scratch_end(&s));
                }
            }
        }
        Collective::Broadcast { root } | Collective::Reduce { root } => {
            // Broadcast: piece i goes down the root's column, then along
            // every row; a row forwards piece i while the network carries
            // piece i + 1. Reduce: piece i is reduced along every row
            // towards the rank in the root's column (into Scratch[piece
            // i]), then down that column towards the root, which reduces
            // piece i while the rows work on piece i + 1.
            let (rh, rl) = g.position(root)?;
            let bcast = matches!(p.coll, Collective::Broadcast { .. });
            let rooted = |r: usize| {
                if bcast {
                    Collective::Broadcast { root: r }
                } else {
                    Collective::Reduce { root: r }
                }
            };
            // Lays a level's steps with contiguous buffers, its scratch
            // past everything used so far (and past `floor`).
            let put = |s: &mut Vec<Step>,
                       members: &[usize],
                       input: Place,
                       output: Place,
                       floor: usize,
                       steps: Vec<Step>| {
                let scratch = scr(scratch_end(s).max(floor));
                Sub {
                    members,
                    input,
                    output,
                    scratch,
                    unit: 0,
                }
                .lay(s, steps)
            };
            for i in 0..k {
                let pc = block(c, k, i);
                // Built on every rank, so that all agree on whether the
                // variant implements the collective.
                let across = flat(levels.inter, rooted(rh), h, my_h, pc.len(), p)?;
                let within = flat(levels.intra, rooted(rl), l, my_l, pc.len(), p)?;
                let (x, o) = (inp(pc.start), out(pc.start));
                if bcast {
                    if my_l == rl {
                        put(&mut s, &col, x, o, 0, across);
                    }
                    put(&mut s, &row, inp(pc.start), out(pc.start), 0, within);
                } else {
                    put(&mut s, &row, x, scr(pc.start), c, within);
                    if my_l == rl {
                        put(&mut s, &col, scr(pc.start), o, c, across);
                    }
                }
            }
        }
        Collective::AllToAll => {
            // Piece i of every block, in two steps. Row: rank (h, l) gives
            // each row peer (h, l') its pieces for the whole column l'
            // (H of them, one per host); the piece for (h, l') itself lands
            // in Output, the others in Scratch. Column: (h, l) sends host
            // h' what the row gathered for (h', l), L pieces, which land
            // in Output where their sources' blocks go. The network step of
            // piece i runs while the row step of piece i + 1 uses the host.
            // Where piece i of the block from (my_h, j) for (hh, my_l) waits
            // between the steps: in Output if hh is this host (its place
            // for good), else in scratch, (H - 1) x L pieces per piece.
            let at = |i: usize, hh: usize, j: usize| {
                let pc = block(c, k, i);
                if hh == my_h {
                    return loc(Buf::Output, row[j] * c + pc.start);
                }
                let x = if hh < my_h { hh } else { hh - 1 };
                loc(
                    Buf::Scratch,
                    (h - 1) * l * pc.start + (x * l + j) * pc.len(),
                )
            };
            // (a, b) for a in 0..x, b in 0..y: the order of sub-pieces.
            let pairs = |x: usize, y: usize| (0..x).flat_map(move |a| (0..y).map(move |b| (a, b)));
            let row_step = |s: &mut Vec<Step>, i: usize| -> Option<()> {
                // Sub-block j: H pieces, piece hh for rank (hh, j); from row
                // member j, piece hh is for (hh, my_l).
                let pc = block(c, k, i);
                let steps = flat(levels.intra, p.coll, l, my_l, h * pc.len(), p)?;
                let sub = Sub {
                    members: &row,
                    input: Place::Pieces(
                        pairs(l, h)
                            .map(|(j, hh)| loc(Buf::Input, g.rows[hh][j] * c + pc.start))
                            .collect(),
                    ),
                    output: Place::Pieces(pairs(l, h).map(|(j, hh)| at(i, hh, j)).collect()),
                    scratch: scr(0),
                    unit: pc.len(),
                };
                sub.lay(s, steps);
                Some(())
            };
            let col_step = |s: &mut Vec<Step>, i: usize| -> Option<()> {
                // Sub-block hh: L pieces, piece j from rank (my_h, j) for
                // rank (hh, my_l); this host's own block is already in
                // Output, so its copy (onto itself) is dropped.
                let pc = block(c, k, i);
                let steps = flat(levels.inter, p.coll, h, my_h, l * pc.len(), p)?;
                let sub = Sub {
                    members: &col,
                    input: Place::Pieces(pairs(h, l).map(|(hh, j)| at(i, hh, j)).collect()),
                    output: Place::Pieces(
                        pairs(h, l)
                            .map(|(hh, j)| loc(Buf::Output, g.rows[hh][j] * c + pc.start))
                            .collect(),
                    ),
                    scratch: scr(0),
                    unit: pc.len(),
                };
                let mut laid = Vec::new();
                sub.lay(&mut laid, steps);
                laid.retain(|st| !matches!(st, Step::Copy { src, dst, .. } if src == dst));
                s.extend(laid);
                Some(())
            };
            for stage in 0..=k {
                if stage < k {
                    row_step(&mut s, stage)?;
                }
                if stage >= 1 {
                    col_step(&mut s, stage - 1)?;
                }
            }
        }
        _ => return None,
    }
    Some(s)
}
