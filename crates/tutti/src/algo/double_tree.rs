//! Double binary tree: two complementary binary trees, each carrying half of
//! the data (as NCCL does).
//!
//! Tree 0 is the in-order binary tree of [`btree`] over the members. Tree 1
//! is the same shape over renumbered members: mirrored (`u -> m-1-u`) when
//! the member count `m` is even, shifted by one (`u -> u-1`) when it is odd.
//! In tree 0 the odd members are leaves; in tree 1 the even ones are (except
//! member 0 for odd `m`), so every rank does the inner-node work (receive
//! two, send three) in one tree only.
//!
//! ```text
//!   AllReduce, n = 4, first half on tree 0, second half on tree 1 (mirrored):
//!
//!        tree 0               tree 1
//!          0                    3
//!          |                    |
//!          2                    1
//!         / \                  / \
//!        1   3                2   0
//! ```
//!
//! * **AllReduce**: members are all ranks. Each half is cut into
//!   `Problem::chunks` pieces, reduced up its tree into Output (fused
//!   `RecvReduceSend`) and broadcast down (fused `RecvCopySend`). Two ranks
//!   may be linked in both trees, and messages between two ranks are matched
//!   in order, so every rank sorts its steps by the same key (slot, phase,
//!   tree): the reduce-up of chunk k has slot k, the broadcast-down of chunk
//!   k has slot `k + 2 * bits(n)`, about a round trip later, so a shared link
//!   carries the up of a later chunk beside the down of an earlier one
//!   instead of waiting for each chunk's round trip (the roots therefore
//!   receive and send in two steps rather than one fused step). Each rank
//!   sends at most `2S` (`S/2` up and `2 * S/2` down where it is inner, `S/2`
//!   up where it is a leaf), like the ring's `2(n-1)/n * S`, but in
//!   `2 * depth ~ 2 log2 n` latency steps instead of `2(n-1)`.
//! * **Broadcast / Reduce**: the root sits above two trees over the other
//!   `n-1` ranks and sends (receives) one half to (from) each tree's top.
//!   The root sends (receives) `S`, other ranks send about `S`, in about
//!   `log2 n + 1` latency steps plus one per extra chunk: a bandwidth-optimal
//!   broadcast with logarithmic depth.
//!
//! # Bitwise identical results
//!
//! Each element of an AllReduce belongs to one half and so to one tree; it
//! is reduced once, at that tree's root, in the order fixed by the tree
//! shape, and every other rank receives a copy of the result.

#![forbid(unsafe_code)]

use super::tree::{btree, chunk_ranges, down, up, Node};
use super::{block, Buf, Collective, Problem, Step};

/// This member's nodes in the two trees over `m` members, where member `u`
/// is real rank `real(u)` and the trees' roots hang below `above` (if any).
fn nodes(m: usize, u: usize, real: impl Fn(usize) -> usize, above: Option<usize>) -> [Node; 2] {
    let to1 = |x: usize| {
        if m.is_multiple_of(2) {
            m - 1 - x
        } else {
            (x + m - 1) % m
        }
    };
    let from1 = |x: usize| {
        if m.is_multiple_of(2) {
            m - 1 - x
        } else {
            (x + 1) % m
        }
    };
    let node = |v: usize, back: &dyn Fn(usize) -> usize| {
        let (parent, children) = btree(m, v);
        Node {
            parent: parent.map(|x| real(back(x))).or(above),
            children: children.into_iter().map(|x| real(back(x))).collect(),
        }
    };
    [node(u, &|x| x), node(to1(u), &from1)]
}

/// The root's node in each tree when it hangs above both trees over `m`
/// members: one child, the tree's top (none when `m == 0`).
fn root_nodes(m: usize, real: impl Fn(usize) -> usize) -> [Node; 2] {
    let top1 = if m.is_multiple_of(2) {
        m.max(1) - 1
    } else {
        1 % m
    };
    [0, top1].map(|u| Node {
        parent: None,
        children: (m > 0).then(|| real(u)).into_iter().collect(),
    })
}

/// Builds the double-tree schedule, or `None` for collectives it does not do.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let (n, r, c) = (p.nranks, p.rank, p.count);
    let bits = (usize::BITS - n.leading_zeros()) as usize;
    let (tr, lag) = match p.coll {
        Collective::AllReduce if n == 1 && p.in_place => return Some(Vec::new()),
        // The broadcast-down of chunk k shares links with the reduce-up of
        // chunk k + lag: about one round trip through the trees later.
        Collective::AllReduce => (nodes(n, r, |x| x, None), 2 * bits),
        Collective::Broadcast { root } | Collective::Reduce { root } => {
            let real = |u: usize| (u + root + 1) % n;
            let tr = if r == root {
                root_nodes(n - 1, real)
            } else {
                nodes(n - 1, (r + n - root - 1) % n, real, Some(root))
            };
            (tr, 0)
        }
        _ => return None,
    };
    let acc = match p.coll.root() {
        Some(root) if root != r => Buf::Scratch,
        _ => Buf::Output,
    };
    let (goes_up, goes_down) = match p.coll {
        Collective::Broadcast { .. } => (false, true),
        Collective::Reduce { .. } => (true, false),
        _ => (true, true),
    };
    // Steps keyed by (slot, phase, tree): sorted alike on every rank, so any
    // two ranks see the messages between them in the same order.
    let mut items: Vec<((usize, usize, usize), Vec<Step>)> = Vec::new();
    for (t, node) in tr.iter().enumerate() {
        let half = block(c, 2, t);
        for (k, rg) in chunk_ranges(half.start, half.len(), p.chunks)
            .iter()
            .enumerate()
        {
            if goes_up {
                let mut s = Vec::new();
                up(&mut s, node, rg, acc, false);
                items.push(((k, 0, t), s));
            }
            if goes_down {
                let mut s = Vec::new();
                down(&mut s, node, rg, None);
                items.push(((k + lag, 1, t), s));
            }
        }
    }
    items.sort_by_key(|i| i.0);
    Some(items.into_iter().flat_map(|i| i.1).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_is_inner_in_at_most_one_tree_mostly() {
        for m in 2..=64usize {
            let mut both = 0;
            for u in 0..m {
                let [a, b] = nodes(m, u, |x| x, None);
                if !a.children.is_empty() && !b.children.is_empty() {
                    both += 1;
                }
            }
            // Only member 0 of an odd count is inner in both.
            assert!(
                both <= usize::from(m % 2 == 1),
                "m={m}: {both} ranks inner twice"
            );
        }
    }

    #[test]
    fn root_nodes_point_at_the_tops() {
        for m in 1..=40usize {
            for (t, root) in root_nodes(m, |x| x).iter().enumerate() {
                let top = root.children[0];
                let node = &nodes(m, top, |x| x, Some(999))[t];
                assert_eq!(node.parent, Some(999), "m={m} tree {t}: top {top}");
            }
        }
    }
}
