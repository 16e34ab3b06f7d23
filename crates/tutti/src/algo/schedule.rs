//! A rank's [`Schedule`]: its steps, and what the executor derives from
//! them once (dependencies, read-back receives, reduction chains).

use super::{Buf, Loc, Problem, Step, Wire};
use hazards::{dependencies, read_back};
use std::ops::Range;

mod hazards;
#[cfg(test)]
mod tests;

/// A rank's list of steps for one collective, with the dependencies the
/// executor must respect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The steps, in program order.
    pub steps: Vec<Step>,
    /// For each step, the earlier steps it must wait for.
    pub deps: Vec<Vec<u32>>,
    /// Scratch elements the executor must provide.
    pub scratch: usize,
    /// For each step, whether a later step of this rank reads what it
    /// writes (a receive whose bytes are forwarded or reduced again): the
    /// executor keeps such bytes in the cache rather than stream them to
    /// memory.
    pub read_back: Vec<bool>,
    /// For each step, the length of the reduction chain it heads (0 where
    /// it heads none): see [`reduce_chain`](Schedule::reduce_chain).
    pub chains: Vec<u32>,
    /// The 16-bit type the data travels as, for a lowered schedule
    /// ([`wire`](super::wire)): its messages move [`Buf::Wire`] elements.
    pub wire: Option<Wire>,
    /// Wire-type staging elements ([`Buf::Wire`]) the executor must provide.
    pub staging: usize,
}

impl Schedule {
    /// Wraps steps, computing the scratch size and the dependencies.
    pub fn new(p: &Problem, steps: Vec<Step>) -> Self {
        let end = |buf: Buf| {
            steps
                .iter()
                .flat_map(|s| s.reads().into_iter().chain(s.writes()))
                .filter(|(b, _)| *b == buf)
                .map(|(_, r)| r.end)
                .max()
                .unwrap_or(0)
        };
        let (scratch, staging) = (end(Buf::Scratch), end(Buf::Wire));
        let alias = p.input_in_output();
        let deps = dependencies(&steps, alias);
        let read_back = read_back(&steps, alias);
        let chains = reduce_chains(&steps, alias);
        Schedule {
            steps,
            deps,
            scratch,
            read_back,
            chains,
            wire: p.wire.filter(|_| p.coll.reduces()),
            staging,
        }
    }

    /// Bytes of step `i`'s message or local pass with `elem`-byte data
    /// elements: a message of wire elements moves `wire.size()` bytes per
    /// element.
    pub fn step_bytes(&self, i: usize, elem: usize) -> usize {
        let st = &self.steps[i];
        let wire = match (self.wire, st.message_loc()) {
            (Some(w), Some(l)) if l.buf == Buf::Wire => w.size(),
            _ => elem,
        };
        st.len() * wire
    }

    /// The reduction chain starting at step `i`, as a range of steps, if
    /// step `i` heads one.
    ///
    /// A chain is a run of consecutive steps that build one accumulator
    /// range `A`: a head that fills it (`Copy` into `A`, or `Recv` into
    /// `A`), then steps that fold one more operand into it (`RecvReduce`
    /// with `src == dst == A`, or `Reduce` into `A`), each from a different
    /// peer, and optionally a `Copy` of `A` elsewhere. Run one by one, each
    /// step passes over all of `A`; the executor may instead run the chain
    /// piece by piece, each member advancing only as far as the member
    /// before it has got, so a cache-sized piece of `A` meets every operand
    /// before it leaves the cache. That applies the same operations to every
    /// element in the same order (the result is bitwise the same) while `A`
    /// crosses memory once instead of once per member. Each member still
    /// waits for the steps outside the chain it depends on, and is done on
    /// its own, so the piecewise run waits on nothing the step-by-step run
    /// would not.
    pub fn reduce_chain(&self, i: usize) -> Option<Range<usize>> {
        let m = *self.chains.get(i)? as usize;
        (m > 1).then(|| i..i + m)
    }

    /// Total elements this rank sends.
    pub fn elems_sent(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.send_peer().is_some())
            .map(|s| s.len())
            .sum()
    }
}

/// Whether ranges `a` and `b` share an element; `alias`: where Input lies
/// in Output ([`Problem::input_in_output`]).
fn overlaps(a: &[(Buf, Range<usize>)], b: &[(Buf, Range<usize>)], alias: Option<usize>) -> bool {
    let norm = |x: Buf, r: &Range<usize>| match (x, alias) {
        (Buf::Input, Some(o)) => (Buf::Output, r.start + o..r.end + o),
        _ => (x, r.clone()),
    };
    a.iter().any(|(ba, ra)| {
        let (ba, ra) = norm(*ba, ra);
        b.iter().any(|(bb, rb)| {
            let (bb, rb) = norm(*bb, rb);
            ba == bb && ra.start < rb.end && rb.start < ra.end && !ra.is_empty()
        })
    })
}

/// The reduction chains of a schedule ([`Schedule::reduce_chain`]): for
/// each step, the length of the chain it heads, or 0.
fn reduce_chains(steps: &[Step], alias: Option<usize>) -> Vec<u32> {
    let mut out = vec![0u32; steps.len()];
    let norm = |l: Loc| match (l.buf, alias) {
        (Buf::Input, Some(o)) => Loc::output(l.off + o),
        _ => l,
    };
    let apart = |a: Loc, b: Loc, len: usize| {
        let range = |l: Loc| [(l.buf, l.off..l.off + len)];
        !overlaps(&range(a), &range(b), alias)
    };
    let mut i = 0;
    while i < steps.len() {
        let (acc, len, first_peer) = match steps[i] {
            Step::Copy { src, dst, len } if apart(src, dst, len) => (dst, len, None),
            Step::Recv { peer, dst, len } => (dst, len, Some(peer)),
            _ => {
                i += 1;
                continue;
            }
        };
        let mut peers: Vec<usize> = first_peer.into_iter().collect();
        let mut end = i + 1;
        while let Some(s) = steps.get(end) {
            let ok = match *s {
                Step::RecvReduce {
                    peer,
                    src,
                    dst,
                    len: l,
                } => {
                    l == len
                        && norm(src) == norm(acc)
                        && norm(dst) == norm(acc)
                        && !peers.contains(&peer)
                        && {
                            peers.push(peer);
                            true
                        }
                }
                Step::Reduce { src, dst, len: l } => {
                    l == len && norm(dst) == norm(acc) && apart(src, acc, len)
                }
                _ => false,
            };
            if !ok {
                break;
            }
            end += 1;
        }
        // A copy of the finished accumulator elsewhere (in place, where it
        // was built aside) ends the chain.
        if end > i + 1 {
            if let Some(&Step::Copy { src, dst, len: l }) = steps.get(end) {
                if l == len && norm(src) == norm(acc) && apart(src, dst, len) {
                    end += 1;
                }
            }
        }
        // Worth it with a message to read and two passes to save.
        if end - i >= 2 && !peers.is_empty() && len > 0 {
            out[i] = (end - i) as u32;
            i = end;
        } else {
            i += 1;
        }
    }
    out
}
