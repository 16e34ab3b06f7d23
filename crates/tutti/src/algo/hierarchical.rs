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
//!   host 1   r3 -- r4 -- r5           2. ring all-reduce in each column on that
//!             |     |     |               1/L: all L columns run in parallel
//!          column                     3. ring all-gather in each row
//! ```
//!
//! Bytes a host sends over the network for AllReduce: `2(H-1)/H * S` in
//! total (each of its L ranks sends `2(H-1)/H * S/L`), against
//! `2(n-1)/n * S` per rank boundary for a flat ring laid across hosts.
//!
//! * **AllReduce**: as above.
//! * **AllGather**: column ring all-gather of each rank's own block, then a
//!   row ring all-gather in which each unit is a whole column of H blocks.
//!   Each host receives `(H-1) * L * c` over the network: the minimum.
//! * **ReduceScatter**: the mirror image: a row ring reduce-scatter whose
//!   unit is a column's H blocks (partial sums in scratch), then a column
//!   ring reduce-scatter.
//! * **Broadcast**: a chain across the root's column (each host receives the
//!   data once), then a chain along each row.
//! * **Reduce**: a chain along each row towards the rank in the root's
//!   column, then a chain up that column to the root.
//!
//! Every element is reduced in a fixed order determined by the grid (row
//! ring, then column ring) and copied to the other ranks, so every rank gets
//! bitwise identical results.

use super::{block, Buf, Collective, Loc, Problem, Step};

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

/// A chain `members[0] -> members[1] -> ...` carrying `len` elements at `at`.
fn chain_broadcast(s: &mut Vec<Step>, members: &[usize], i: usize, at: Loc, len: usize) {
    let k = members.len();
    if k == 1 {
        return;
    }
    if i == 0 {
        s.push(Step::Send {
            peer: members[1],
            src: at,
            len,
        });
    } else if i + 1 < k {
        s.push(Step::RecvCopySend {
            from: members[i - 1],
            to: members[i + 1],
            dst: at,
            len,
        });
    } else {
        s.push(Step::Recv {
            peer: members[i - 1],
            dst: at,
            len,
        });
    }
}

/// A chain reducing towards `members[k-1]`: each rank combines the incoming
/// partial with `src` into `dst` and forwards it.
fn chain_reduce(s: &mut Vec<Step>, members: &[usize], i: usize, src: Loc, dst: Loc, len: usize) {
    let k = members.len();
    if k == 1 {
        if src != dst {
            s.push(Step::Copy { src, dst, len });
        }
        return;
    }
    if i == 0 {
        s.push(Step::Send {
            peer: members[1],
            src,
            len,
        });
    } else if i + 1 < k {
        s.push(Step::RecvReduceSend {
            from: members[i - 1],
            to: members[i + 1],
            src,
            dst,
            len,
        });
    } else {
        s.push(Step::RecvReduce {
            peer: members[i - 1],
            src,
            dst,
            len,
        });
    }
}

/// Rotates `members` so that `first` comes first; returns it and our index.
fn rotated(members: &[usize], first: usize, me: usize) -> (Vec<usize>, usize) {
    let k = members.len();
    let f = members.iter().position(|&x| x == first).unwrap_or(0);
    let v: Vec<usize> = (0..k).map(|j| members[(f + j) % k]).collect();
    let i = v.iter().position(|&x| x == me).unwrap_or(0);
    (v, i)
}

/// Builds the hierarchical schedule, or `None` when the layout is not a
/// uniform grid of at least 2 hosts x 2 ranks or the collective is not covered.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let host_of = p.hosts.as_deref()?;
    if host_of.len() != p.nranks {
        return None;
    }
    let (g, my_h, my_l) = Grid::new(host_of, p.rank)?;
    let c = p.count;
    let row = g.row(my_h);
    let col = g.column(my_l);
    let mut s = Vec::new();
    match p.coll {
        Collective::AllReduce => {
            let rb: Vec<Vec<Seg>> = (0..g.l)
                .map(|j| {
                    let b = block(c, g.l, j);
                    vec![(b.start, b.len())]
                })
                .collect();
            ring_reduce_scatter(&mut s, &row, my_l, &rb, Buf::Input, Buf::Output);
            // This rank owns row block (my_l + 1) % L: all-reduce it down the column.
            let own = block(c, g.l, (my_l + 1) % g.l);
            let cb: Vec<Vec<Seg>> = (0..g.h)
                .map(|j| {
                    let b = block(own.len(), g.h, j);
                    vec![(own.start + b.start, b.len())]
                })
                .collect();
            ring_reduce_scatter(&mut s, &col, my_h, &cb, Buf::Output, Buf::Output);
            ring_all_gather(&mut s, &col, my_h, &cb, Buf::Output, 1);
            ring_all_gather(&mut s, &row, my_l, &rb, Buf::Output, 1);
        }
        Collective::AllGather => {
            // Column phase: each rank's own block, block j of the column = rank col[j].
            let cb: Vec<Vec<Seg>> = col.iter().map(|&r| vec![(r * c, c)]).collect();
            ring_all_gather(&mut s, &col, my_h, &cb, Buf::Output, 0);
            // Row phase: unit j = the whole column of local rank j.
            let rb: Vec<Vec<Seg>> = (0..g.l)
                .map(|j| g.column(j).iter().map(|&r| (r * c, c)).collect())
                .collect();
            ring_all_gather(&mut s, &row, my_l, &rb, Buf::Output, 0);
        }
        Collective::ReduceScatter => {
            // Row phase in scratch laid out like Input: unit j = column j's H blocks.
            let rb: Vec<Vec<Seg>> = (0..g.l)
                .map(|j| g.column(j).iter().map(|&r| (r * c, c)).collect())
                .collect();
            // Shift the row ring so that member i ends with its own column (unit i).
            let k = g.l;
            let shifted: Vec<Vec<Seg>> = (0..k).map(|j| rb[(j + k - 1) % k].clone()).collect();
            ring_reduce_scatter(&mut s, &row, my_l, &shifted, Buf::Input, Buf::Scratch);
            // Column phase over this column's H blocks, now in scratch: shift so
            // that member i ends with block i (its own rank's block).
            let h = g.h;
            let cb: Vec<Vec<Seg>> = (0..h)
                .map(|j| vec![(col[(j + h - 1) % h] * c, c)])
                .collect();
            ring_reduce_scatter(&mut s, &col, my_h, &cb, Buf::Scratch, Buf::Scratch);
            s.push(Step::Copy {
                src: loc(Buf::Scratch, p.rank * c),
                dst: loc(Buf::Output, 0),
                len: c,
            });
        }
        Collective::Broadcast { root } => {
            let (rh, rl) = (
                host_of[root],
                g.rows[host_of[root]].iter().position(|&r| r == root)?,
            );
            if my_l == rl {
                let (chain, i) = rotated(&g.column(rl), g.rows[rh][rl], p.rank);
                chain_broadcast(&mut s, &chain, i, loc(Buf::Output, 0), c);
            }
            let (chain, i) = rotated(&row, g.rows[my_h][rl], p.rank);
            chain_broadcast(&mut s, &chain, i, loc(Buf::Output, 0), c);
        }
        Collective::Reduce { root } => {
            let (rh, rl) = (
                host_of[root],
                g.rows[host_of[root]].iter().position(|&r| r == root)?,
            );
            // Row chain ending at the rank in the root's column.
            let (mut chain, _) = rotated(&row, g.rows[my_h][rl], p.rank);
            chain.rotate_left(1);
            let i = chain.iter().position(|&x| x == p.rank)?;
            let head = g.rows[my_h][rl];
            let acc = if p.rank == root {
                loc(Buf::Output, 0)
            } else {
                loc(Buf::Scratch, 0)
            };
            chain_reduce(
                &mut s,
                &chain,
                i,
                loc(Buf::Input, 0),
                if p.rank == head {
                    acc
                } else {
                    loc(Buf::Scratch, 0)
                },
                c,
            );
            if my_l == rl {
                // Column chain ending at the root.
                let (mut cchain, _) = rotated(&g.column(rl), g.rows[rh][rl], p.rank);
                cchain.rotate_left(1);
                let j = cchain.iter().position(|&x| x == p.rank)?;
                chain_reduce(&mut s, &cchain, j, acc, acc, c);
            }
        }
        _ => return None,
    }
    Some(s)
}
