//! The 16-bit wire: a lowering pass that makes a float reduction's
//! schedule move its data as bf16 or f16 while every rank reduces in the
//! data type (f32).
//!
//! [`lower`] rewrites a schedule (framed, for a [`Problem`] with
//! [`Problem::wire`] set) step by step, in program order:
//!
//! | step | becomes |
//! | --- | --- |
//! | `Send { src }` | `Narrow { src -> W }`, `Send { W }` |
//! | `Recv { dst }` | `Recv { W }`, `Widen { W -> dst }` |
//! | `RecvReduce { src, dst }` | `Recv { W }`, `WidenReduce { dst = src + widen(W) }` |
//! | `RecvReduceSend { src, dst }` | `Recv { W1 }`, `WidenReduce`, `Narrow { dst -> W2 }`, `Send { W2 }` |
//! | `RecvCopySend { dst }` | `RecvCopySend { W }` (the wire elements are forwarded as they are), `Widen { W -> dst }` |
//!
//! `W` is a fresh range of the staging buffer [`Buf::Wire`]. So every
//! message carries wire elements, every value is narrowed once per hop (a
//! forwarded value is not narrowed again), and every reduction adds in f32.
//! A range narrowed once is not narrowed again while it is unchanged (the
//! direct algorithm sends its input to every peer from one staging range).
//!
//! **Own copies.** Once a rank has sent a value narrowed, its peers hold
//! `widen(narrow(v))`; the rank itself must not go on with `v`, or the
//! ranks' results would differ in their last bits. Before any later local
//! use of a range it sent (a reduction, a copy, the Avg's division) and, in
//! an AllReduce, at the end for the Output it sent, the pass rounds the
//! range ([`Step::Round`]: `v = widen(narrow(v))`), in place, or, for the
//! read-only Input of an out-of-place op, into scratch that the later
//! reads then use. Narrowing is element-wise and rounding idempotent, so
//! every rank holds bitwise the same result: the verifier proves it for
//! every algorithm.
//!
//! **Scaling.** bf16 has f32's exponent range: it needs no scale (a finite
//! value past bf16's largest saturates to it rather than become infinite).
//! f16 tops out at 65504, so an f16 wire carries every value multiplied by
//! `2^-k`, `k = ceil(log2(nranks))` ([`Wire::scale_shift`]), and undoes it
//! when it widens: a partial sum of up to `nranks` inputs within f16's
//! range then never overflows. Powers of two scale exactly, so rounding
//! stays idempotent.

use super::{Buf, Collective, Loc, Problem, Step};
use crate::error::{Error, Result};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// A 16-bit type that f32 data may travel as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    /// bfloat16: f32's range, 8 significant bits.
    Bf16,
    /// IEEE half: 11 significant bits, values scaled by `2^-k` on the wire.
    F16,
}

impl Wire {
    /// The name (`bf16`, `f16`).
    pub const fn name(self) -> &'static str {
        match self {
            Wire::Bf16 => "bf16",
            Wire::F16 => "f16",
        }
    }

    /// Bytes of one wire element.
    pub const fn size(self) -> usize {
        2
    }

    /// The unit roundoff of one narrowing (half an ulp, relative): `2^-8`
    /// for bf16, `2^-11` for f16.
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            Wire::Bf16 => 1.0 / 256.0,
            Wire::F16 => 1.0 / 2048.0,
        }
    }

    /// `k` such that values travel multiplied by `2^-k` on `nranks` ranks:
    /// 0 for bf16, `ceil(log2(nranks))` for f16.
    pub const fn scale_shift(self, nranks: usize) -> u32 {
        match self {
            Wire::Bf16 => 0,
            Wire::F16 => {
                let n = if nranks < 1 { 1 } else { nranks };
                usize::BITS - (n - 1).leading_zeros()
            }
        }
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Wire {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(Wire::Bf16),
            "f16" | "fp16" | "half" | "float16" => Ok(Wire::F16),
            _ => Err(Error::arg(format!(
                "unknown wire type '{s}'; valid: bf16, f16"
            ))),
        }
    }
}

/// A data range narrowed into staging: `buf[range]` narrowed is
/// `Wire[wire..]`, while the range is unchanged. `pending`: sent, and not
/// yet rounded in this rank's own copy.
#[derive(Clone, Debug)]
struct Narrowed {
    buf: Buf,
    range: Range<usize>,
    wire: usize,
    pending: bool,
}

/// The pass's state for one rank's schedule.
struct Lowering {
    out: Vec<Step>,
    /// Where Input lies in Output (in place).
    alias: Option<usize>,
    /// Next free staging element.
    wire_end: usize,
    /// Next free scratch element.
    scratch_end: usize,
    narrowed: Vec<Narrowed>,
    /// Input ranges (out of place) whose rounded copy is in scratch at the offset.
    renamed: Vec<(Range<usize>, usize)>,
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

fn within(a: &Range<usize>, b: &Range<usize>) -> bool {
    b.start <= a.start && a.end <= b.end
}

impl Lowering {
    /// `l` as (buffer, element range), Input in place as Output.
    fn norm(&self, l: Loc, len: usize) -> (Buf, Range<usize>) {
        match (l.buf, self.alias) {
            (Buf::Input, Some(o)) => (Buf::Output, l.off + o..l.off + o + len),
            (b, _) => (b, l.off..l.off + len),
        }
    }

    fn stage(&mut self, len: usize) -> Loc {
        let l = Loc::wire(self.wire_end);
        self.wire_end += len;
        l
    }

    /// `dst[..len]` is overwritten: what was narrowed of it no longer
    /// holds (the parts outside it still do).
    fn invalidate(&mut self, dst: Loc, len: usize) {
        if len == 0 {
            return;
        }
        let (b, r) = self.norm(dst, len);
        let mut keep = Vec::with_capacity(self.narrowed.len());
        for e in self.narrowed.drain(..) {
            if e.buf != b || !overlap(&e.range, &r) {
                keep.push(e);
                continue;
            }
            if e.range.start < r.start {
                keep.push(Narrowed {
                    range: e.range.start..r.start,
                    ..e.clone()
                });
            }
            if r.end < e.range.end {
                keep.push(Narrowed {
                    range: r.end..e.range.end,
                    wire: e.wire + (r.end - e.range.start),
                    ..e
                });
            }
        }
        self.narrowed = keep;
    }

    /// Makes this rank's copy of what it sent of `src[..len]` the rounded
    /// value, before a local step reads it; returns where the step is to
    /// read (a scratch copy for an out-of-place Input).
    fn settle(&mut self, src: Loc, len: usize) -> Loc {
        if len == 0 {
            return src;
        }
        let (b, r) = self.norm(src, len);
        if b == Buf::Input {
            if let Some((rr, s)) = self.renamed.iter().find(|(rr, _)| within(&r, rr)) {
                return Loc::scratch(s + r.start - rr.start);
            }
            let hit: Vec<usize> = (0..self.narrowed.len())
                .filter(|&i| {
                    let e = &self.narrowed[i];
                    e.pending && e.buf == b && overlap(&e.range, &r)
                })
                .collect();
            if hit.is_empty() {
                return src;
            }
            if let [i] = hit[..] {
                if within(&r, &self.narrowed[i].range) {
                    // Round the whole range sent once; later reads use it.
                    let e = self.narrowed[i].range.clone();
                    let s = self.scratch_end;
                    self.scratch_end += e.len();
                    self.out.push(Step::Round {
                        src: Loc::input(e.start),
                        dst: Loc::scratch(s),
                        len: e.len(),
                    });
                    self.narrowed[i].pending = false;
                    self.renamed.push((e.clone(), s));
                    return Loc::scratch(s + r.start - e.start);
                }
            }
            // A read across several sent ranges: a rounded copy of it
            // alone (rounding what was not sent costs accuracy, never
            // agreement).
            let s = self.scratch_end;
            self.scratch_end += len;
            self.out.push(Step::Round {
                src,
                dst: Loc::scratch(s),
                len,
            });
            return Loc::scratch(s);
        }
        for e in self.narrowed.iter_mut() {
            if e.pending && e.buf == b && overlap(&e.range, &r) {
                let l = Loc {
                    buf: b,
                    off: e.range.start,
                };
                self.out.push(Step::Round {
                    src: l,
                    dst: l,
                    len: e.range.len(),
                });
                e.pending = false;
            }
        }
        src
    }

    /// Staging that holds `src[..len]` narrowed (narrowing it there if no
    /// staging does yet); the range counts as sent.
    fn narrowed_for_send(&mut self, src: Loc, len: usize) -> Loc {
        let (b, r) = self.norm(src, len);
        if len > 0 {
            if let Some(e) = self
                .narrowed
                .iter()
                .find(|e| e.buf == b && within(&r, &e.range))
            {
                // Narrowed before: its pending rounding (if any) stands.
                return Loc::wire(e.wire + r.start - e.range.start);
            }
        }
        // An Input range rounded into scratch narrows from there, exactly
        // as from the original: nothing left to round.
        let from = self.rename(src, len);
        let w = self.stage(len);
        self.out.push(Step::Narrow {
            src: from,
            dst: w,
            len,
        });
        if len > 0 {
            self.narrowed.push(Narrowed {
                buf: b,
                range: r,
                wire: w.off,
                pending: from == src,
            });
        }
        w
    }

    /// `dst[..len]` now holds `w` widened: it narrows back to `w` exactly.
    fn widened(&mut self, dst: Loc, len: usize, w: Loc) {
        self.invalidate(dst, len);
        if len > 0 {
            let (b, r) = self.norm(dst, len);
            self.narrowed.push(Narrowed {
                buf: b,
                range: r,
                wire: w.off,
                pending: false,
            });
        }
    }

    fn step(&mut self, st: Step) {
        match st {
            Step::Send { peer, src, len } => {
                let w = self.narrowed_for_send(src, len);
                self.out.push(Step::Send { peer, src: w, len });
            }
            Step::Recv { peer, dst, len } => {
                let w = self.stage(len);
                self.out.push(Step::Recv { peer, dst: w, len });
                self.out.push(Step::Widen { src: w, dst, len });
                self.widened(dst, len, w);
            }
            Step::RecvReduce {
                peer,
                src,
                dst,
                len,
            } => {
                let src = self.settle(src, len);
                self.settle(dst, len);
                let w = self.stage(len);
                self.out.push(Step::Recv { peer, dst: w, len });
                self.out.push(Step::WidenReduce {
                    src,
                    wire: w,
                    dst,
                    len,
                });
                self.invalidate(dst, len);
            }
            Step::RecvReduceSend {
                from,
                to,
                src,
                dst,
                len,
            } => {
                self.step(Step::RecvReduce {
                    peer: from,
                    src,
                    dst,
                    len,
                });
                self.step(Step::Send {
                    peer: to,
                    src: dst,
                    len,
                });
            }
            Step::RecvCopySend { from, to, dst, len } => {
                let w = self.stage(len);
                self.out.push(Step::RecvCopySend {
                    from,
                    to,
                    dst: w,
                    len,
                });
                self.out.push(Step::Widen { src: w, dst, len });
                self.widened(dst, len, w);
            }
            Step::Copy { src, dst, len } => {
                let src = self.settle(src, len);
                self.out.push(Step::Copy { src, dst, len });
                self.invalidate(dst, len);
            }
            Step::Reduce { src, dst, len } => {
                let src = self.settle(src, len);
                self.settle(dst, len);
                self.out.push(Step::Reduce { src, dst, len });
                self.invalidate(dst, len);
            }
            Step::Scale { dst, len, divisor } => {
                self.settle(dst, len);
                self.out.push(Step::Scale { dst, len, divisor });
                self.invalidate(dst, len);
            }
            Step::Fence => self.out.push(st),
            Step::Narrow { .. }
            | Step::Widen { .. }
            | Step::WidenReduce { .. }
            | Step::Round { .. } => {
                unreachable!("a schedule is lowered once")
            }
        }
    }

    /// Where a read of `src[..len]` that only narrows (a send) reads: the
    /// rounded scratch copy of an Input range if there is one (narrowing
    /// it gives the same wire elements; the original would too).
    fn rename(&self, src: Loc, len: usize) -> Loc {
        let (b, r) = self.norm(src, len);
        if b == Buf::Input {
            if let Some((rr, s)) = self.renamed.iter().find(|(rr, _)| within(&r, rr)) {
                return Loc::scratch(s + r.start - rr.start);
            }
        }
        src
    }
}

/// The schedule `steps` (framed, for `p`) with its data on the wire type
/// `p.wire` (see the module docs); `steps` unchanged without one.
pub fn lower(p: &Problem, steps: Vec<Step>) -> Vec<Step> {
    if p.wire.is_none() {
        return steps;
    }
    let scratch_end = steps
        .iter()
        .flat_map(|s| s.reads().into_iter().chain(s.writes()))
        .filter(|(b, _)| *b == Buf::Scratch)
        .map(|(_, r)| r.end)
        .max()
        .unwrap_or(0);
    let mut l = Lowering {
        out: Vec::with_capacity(steps.len() * 2),
        alias: p.input_in_output(),
        wire_end: 0,
        scratch_end,
        narrowed: Vec::new(),
        renamed: Vec::new(),
    };
    for st in steps {
        l.step(st);
    }
    if p.coll == Collective::AllReduce {
        // Every rank ends with what its peers received of it.
        let sent: Vec<Range<usize>> = l
            .narrowed
            .iter()
            .filter(|e| e.pending && e.buf == Buf::Output)
            .map(|e| e.range.clone())
            .collect();
        for r in sent {
            l.settle(Loc::output(r.start), r.len());
        }
    }
    l.out
}

#[cfg(test)]
mod tests;
