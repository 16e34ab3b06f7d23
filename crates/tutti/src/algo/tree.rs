//! Tree algorithms: binomial trees for the rooted collectives, a binary tree
//! for AllReduce.
//!
//! # Binomial tree (Broadcast, Reduce, Gather, Scatter)
//!
//! Ranks are renumbered relative to the root, `v = (rank - root) mod n`.
//! Node `v != 0` with lowest set bit `b` has parent `v - b` and children
//! `v + m` for `m = b/2, b/4, ..., 1` (those below `n`); the root's children
//! are `v + m` for every power of two `m < n`. The subtree of `v` is the
//! contiguous relative range `v .. min(v + b, n)`.
//!
//! ```text
//!   n = 8, relative ranks        Broadcast: round 1: 0->4
//!                                           round 2: 0->2, 4->6
//!          0                                round 3: 0->1, 2->3, 4->5, 6->7
//!        / | \
//!       4  2  1                  Reduce runs the same tree upwards,
//!      / \  \                    Gather/Scatter move whole subtrees
//!     6   5  3                   (`v .. v+b`) in one message.
//!     |
//!     7
//! ```
//!
//! * **Broadcast**: each rank receives the buffer from its parent and
//!   forwards it to its children, largest subtree first. The buffer is cut
//!   into `Problem::chunks` pieces; the first child gets each chunk through a
//!   fused `RecvCopySend` as it arrives, so the levels overlap. The root sends
//!   `ceil(log2 n) * S` bytes (`S` = the buffer); latency `ceil(log2 n)` steps.
//! * **Reduce**: the same tree upwards, children smallest subtree first; a
//!   node reduces its input with each child's partial and forwards the last
//!   reduction with a fused `RecvReduceSend`. Partial sums live in scratch
//!   (Input is never written), at the root in Output. Every rank sends `S`
//!   at most once; the root receives `ceil(log2 n) * S`.
//! * **Gather / Scatter**: whole subtrees travel in one message (two when the
//!   subtree's absolute ranks wrap past `n-1`), staged in scratch on inner
//!   nodes. `ceil(log2 n)` latency steps; the root receives (sends) `(n-1)*c`
//!   elements; a rank at depth d forwards at most its subtree.
//!
//! # Binary tree (AllReduce)
//!
//! [`btree`] builds the in-order binary tree NCCL uses: node `v` with lowest
//! set bit `b` sits at height `log2 b`, its children are `v - b/2` and
//! `v + b/2` (or the nearest `v + b/2^k` below `n`), so odd ranks are leaves.
//! Node 0 is the root and has one child, the highest power of two below `n`.
//!
//! ```text
//!   n = 8:          0
//!                   |
//!                   4
//!                 /   \
//!                2     6
//!               / \   / \
//!              1   3 5   7
//! ```
//!
//! AllReduce reduces each chunk up the tree into Output (a node's partial
//! sum, then the final value, live in its own Output chunk) and broadcasts
//! it back down; reduce-up of chunk k+1 overlaps broadcast-down of chunk k.
//! Leaves send `S`, inner nodes `3S` (one up, two down), the root `S`;
//! latency `2 * depth` steps plus one step per extra chunk.
//!
//! # Bitwise identical results
//!
//! Each element of an AllReduce is reduced exactly once, on the root, in an
//! order fixed by the tree shape (input first, then the children in list
//! order), and every other rank receives a copy of that value. Reduce has a
//! single result. So every rank ends with the same bits.

#![forbid(unsafe_code)]

use super::{Buf, Collective, Loc, Problem, Step};
use std::ops::Range;

/// One rank's place in a tree, in real ranks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Node {
    /// The parent, `None` at the root.
    pub parent: Option<usize>,
    /// The children, in the order the schedule visits them.
    pub children: Vec<usize>,
}

/// Parent and children of virtual node `v` in the in-order binary tree over
/// `m` nodes (see the module doc). Children come lower node first.
pub(super) fn btree(m: usize, v: usize) -> (Option<usize>, Vec<usize>) {
    if m <= 1 {
        return (None, Vec::new());
    }
    if v == 0 {
        return (None, vec![prev_pow2(m - 1)]);
    }
    let b = v & v.wrapping_neg();
    let mut up = (v ^ b) | (b << 1);
    if up >= m {
        up = v ^ b;
    }
    let mut children = Vec::new();
    if b >= 2 {
        children.push(v - b / 2);
        let mut k = b / 2;
        while k >= 1 && v + k >= m {
            k /= 2;
        }
        if k >= 1 {
            children.push(v + k);
        }
    }
    (Some(up), children)
}

/// The largest power of two not above `x` (`x >= 1`).
pub(super) fn prev_pow2(x: usize) -> usize {
    1 << (usize::BITS - 1 - x.leading_zeros())
}

/// Binomial tree over `n` relative ranks: parent of `v`, children with
/// subtree masks ascending (smallest subtree first), and the size of `v`'s
/// subtree.
fn binomial(n: usize, v: usize) -> (Option<usize>, Vec<usize>, usize) {
    let b = if v == 0 {
        n.next_power_of_two()
    } else {
        v & v.wrapping_neg()
    };
    let parent = (v != 0).then(|| v - b);
    let children = (0..)
        .map(|k| 1usize << k)
        .take_while(|&m| m < b && v + m < n)
        .map(|m| v + m)
        .collect();
    (parent, children, b.min(n - v))
}

/// `len` elements starting at `start`, cut into at most `chunks` nearly
/// equal non-empty pieces (none when `len == 0`).
pub(super) fn chunk_ranges(start: usize, len: usize, chunks: usize) -> Vec<Range<usize>> {
    let k = chunks.max(1).min(len);
    (0..k)
        .map(|i| {
            let b = super::block(len, k, i);
            start + b.start..start + b.end
        })
        .collect()
}

/// Emits the reduce-to-root part of chunk `rg` at `node`: a leaf sends its
/// input; an inner node reduces Input with each child's partial into `acc`
/// and forwards the last reduction to its parent in the same (fused) step.
/// At the root, when `then_bcast` is set, the last reduction is forwarded
/// straight back down to that child; the child is returned so [`down`] skips it.
pub(super) fn up(
    s: &mut Vec<Step>,
    node: &Node,
    rg: &Range<usize>,
    acc: Buf,
    then_bcast: bool,
) -> Option<usize> {
    let len = rg.len();
    let inp = Loc::input(rg.start);
    let a = Loc {
        buf: acc,
        off: rg.start,
    };
    let Some((&last, first)) = node.children.split_last() else {
        match node.parent {
            Some(peer) => s.push(Step::Send {
                peer,
                src: inp,
                len,
            }),
            None => s.push(Step::Copy {
                src: inp,
                dst: a,
                len,
            }),
        }
        return None;
    };
    for (i, &peer) in first.iter().enumerate() {
        let src = if i == 0 { inp } else { a };
        s.push(Step::RecvReduce {
            peer,
            src,
            dst: a,
            len,
        });
    }
    let src = if first.is_empty() { inp } else { a };
    let to = match node.parent {
        Some(p) => Some(p),
        None if then_bcast => Some(last),
        None => None,
    };
    match to {
        Some(to) => s.push(Step::RecvReduceSend {
            from: last,
            to,
            src,
            dst: a,
            len,
        }),
        None => s.push(Step::RecvReduce {
            peer: last,
            src,
            dst: a,
            len,
        }),
    }
    (node.parent.is_none() && then_bcast).then_some(last)
}

/// Emits the broadcast-from-root part of chunk `rg` (in Output) at `node`:
/// receive from the parent, forwarding to the first child as the data
/// arrives, then send to the other children. The root sends to every child
/// except `skip` (already served by a fused step of [`up`]).
pub(super) fn down(s: &mut Vec<Step>, node: &Node, rg: &Range<usize>, skip: Option<usize>) {
    let len = rg.len();
    let out = Loc::output(rg.start);
    let rest = match (node.parent, node.children.first()) {
        (Some(peer), None) => {
            s.push(Step::Recv {
                peer,
                dst: out,
                len,
            });
            return;
        }
        (Some(from), Some(&to)) => {
            s.push(Step::RecvCopySend {
                from,
                to,
                dst: out,
                len,
            });
            &node.children[1..]
        }
        (None, _) => &node.children[..],
    };
    for &peer in rest {
        if Some(peer) != skip {
            s.push(Step::Send {
                peer,
                src: out,
                len,
            });
        }
    }
}

/// Builds the tree schedule, or `None` for collectives this file does not do.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let (n, r, c) = (p.nranks, p.rank, p.count);
    let mut s = Vec::new();
    let root = p.coll.root().unwrap_or(0);
    let v = (r + n - root) % n;
    let real = |x: usize| (x + root) % n;
    match p.coll {
        Collective::AllReduce => {
            if n == 1 {
                if !p.in_place {
                    s.push(Step::Copy {
                        src: Loc::input(0),
                        dst: Loc::output(0),
                        len: c,
                    });
                }
                return Some(s);
            }
            let (parent, children) = btree(n, r);
            let node = Node { parent, children };
            for rg in chunk_ranges(0, c, p.chunks) {
                let skip = up(&mut s, &node, &rg, Buf::Output, true);
                down(&mut s, &node, &rg, skip);
            }
        }
        Collective::Broadcast { .. } => {
            let (parent, mut children, _) = binomial(n, v);
            children.reverse(); // largest subtree first
            let node = Node {
                parent: parent.map(real),
                children: children.into_iter().map(real).collect(),
            };
            for rg in chunk_ranges(0, c, p.chunks) {
                down(&mut s, &node, &rg, None);
            }
        }
        Collective::Reduce { .. } => {
            let (parent, children, _) = binomial(n, v);
            let node = Node {
                parent: parent.map(real),
                children: children.into_iter().map(real).collect(),
            };
            let acc = if r == root { Buf::Output } else { Buf::Scratch };
            for rg in chunk_ranges(0, c, p.chunks) {
                up(&mut s, &node, &rg, acc, false);
            }
        }
        Collective::Gather { .. } => gather(&mut s, n, root, v, c),
        Collective::Scatter { .. } => scatter(&mut s, n, root, v, c),
        _ => return None,
    }
    Some(s)
}

/// Splits the relative range `a..b` where the absolute ranks wrap from
/// `n-1` to 0 (relative index `n - root`), so each piece is contiguous in
/// absolute rank order too.
fn pieces(n: usize, root: usize, a: usize, b: usize) -> impl Iterator<Item = Range<usize>> {
    let w = (n - root).clamp(a, b);
    [a..w, w..b].into_iter().filter(|x| !x.is_empty())
}

/// Where relative block `x` lives on node `v`: Output (absolute order) on the
/// root, Scratch (relative to `v`) elsewhere.
fn stage(n: usize, root: usize, v: usize, x: usize, c: usize) -> Loc {
    if v == 0 {
        Loc::output(((x + root) % n) * c)
    } else {
        Loc::scratch((x - v) * c)
    }
}

/// Binomial gather: each node collects its subtree's blocks (its own first)
/// and sends them to its parent in one message per contiguous piece.
fn gather(s: &mut Vec<Step>, n: usize, root: usize, v: usize, c: usize) {
    if c == 0 {
        return;
    }
    let real = |x: usize| (x + root) % n;
    let (parent, children, size) = binomial(n, v);
    if children.is_empty() {
        match parent {
            Some(pv) => s.push(Step::Send {
                peer: real(pv),
                src: Loc::input(0),
                len: c,
            }),
            None => s.push(Step::Copy {
                src: Loc::input(0),
                dst: Loc::output(root * c),
                len: c,
            }),
        }
        return;
    }
    s.push(Step::Copy {
        src: Loc::input(0),
        dst: stage(n, root, v, v, c),
        len: c,
    });
    for ch in children {
        let (_, _, sz) = binomial(n, ch);
        for pc in pieces(n, root, ch, ch + sz) {
            let dst = stage(n, root, v, pc.start, c);
            s.push(Step::Recv {
                peer: real(ch),
                dst,
                len: pc.len() * c,
            });
        }
    }
    if let Some(pv) = parent {
        for pc in pieces(n, root, v, v + size) {
            let src = Loc::scratch((pc.start - v) * c);
            s.push(Step::Send {
                peer: real(pv),
                src,
                len: pc.len() * c,
            });
        }
    }
}

/// Binomial scatter: each node receives its subtree's blocks from its
/// parent, keeps its own and sends each child its subtree, largest first.
fn scatter(s: &mut Vec<Step>, n: usize, root: usize, v: usize, c: usize) {
    if c == 0 {
        return;
    }
    let real = |x: usize| (x + root) % n;
    let (parent, children, size) = binomial(n, v);
    // Where relative block x is read from: Input (absolute order) on the root.
    let from = |x: usize| {
        if v == 0 {
            Loc::input(real(x) * c)
        } else {
            Loc::scratch((x - v) * c)
        }
    };
    match parent {
        Some(pv) if children.is_empty() => {
            s.push(Step::Recv {
                peer: real(pv),
                dst: Loc::output(0),
                len: c,
            });
            return;
        }
        Some(pv) => {
            for pc in pieces(n, root, v, v + size) {
                s.push(Step::Recv {
                    peer: real(pv),
                    dst: from(pc.start),
                    len: pc.len() * c,
                });
            }
        }
        None => {}
    }
    s.push(Step::Copy {
        src: from(v),
        dst: Loc::output(0),
        len: c,
    });
    for &ch in children.iter().rev() {
        let (_, _, sz) = binomial(n, ch);
        for pc in pieces(n, root, ch, ch + sz) {
            s.push(Step::Send {
                peer: real(ch),
                src: from(pc.start),
                len: pc.len() * c,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Follows parents to the root, checking that parent and child agree.
    fn check_tree(m: usize, node: impl Fn(usize) -> (Option<usize>, Vec<usize>)) -> usize {
        let mut depth = 0;
        for v in 0..m {
            let (parent, children) = node(v);
            for &ch in &children {
                assert!(
                    ch < m && node(ch).0 == Some(v),
                    "m={m}: {ch} is a child of {v}"
                );
            }
            if let Some(pv) = parent {
                assert!(node(pv).1.contains(&v), "m={m}: {pv} does not list {v}");
            } else {
                assert_eq!(v, 0, "m={m}: only node 0 is a root");
            }
            let (mut d, mut x) = (0, v);
            while let Some(pv) = node(x).0 {
                x = pv;
                d += 1;
                assert!(d <= m, "m={m}: cycle through {v}");
            }
            depth = depth.max(d);
        }
        depth
    }

    #[test]
    fn binary_tree_is_a_shallow_spanning_tree() {
        for m in 1..=130 {
            let depth = check_tree(m, |v| btree(m, v));
            let log = usize::BITS - (m - 1).max(1).leading_zeros();
            assert!(depth <= log as usize + 1, "m={m}: depth {depth}");
            for v in 0..m {
                assert!(btree(m, v).1.len() <= 2);
                if v % 2 == 1 {
                    assert!(btree(m, v).1.is_empty(), "m={m}: odd {v} is a leaf");
                }
            }
        }
    }

    #[test]
    fn binomial_tree_is_a_spanning_tree() {
        for n in 1..=70 {
            let depth = check_tree(n, |v| {
                let (p, c, _) = binomial(n, v);
                (p, c)
            });
            assert!(n == 1 || depth <= (usize::BITS - (n - 1).leading_zeros()) as usize);
            for v in 0..n {
                let (_, children, size) = binomial(n, v);
                let below: usize = children.iter().map(|&ch| binomial(n, ch).2).sum();
                assert_eq!(size, below + 1, "n={n} v={v}: subtree size");
            }
        }
    }

    #[test]
    fn chunks_cover_the_range() {
        for len in 0..40 {
            for k in 1..9 {
                let cs = chunk_ranges(5, len, k);
                assert!(cs.iter().all(|c| !c.is_empty()));
                let total: usize = cs.iter().map(|c| c.len()).sum();
                assert_eq!(total, len);
                assert!(cs.windows(2).all(|w| w[0].end == w[1].start));
            }
        }
    }
}
