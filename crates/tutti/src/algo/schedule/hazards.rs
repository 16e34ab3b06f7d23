//! A schedule's data hazards in time near-linear in its steps.
//!
//! Every boundary of every range the steps touch cuts its buffer into
//! elementary segments, so that a non-empty range is a run of whole
//! segments and two non-empty ranges overlap exactly when they share one.
//! Per segment we keep the steps (since the last fence) that read it and
//! that write it; a step then finds the earlier steps it conflicts with by
//! looking only at its own segments, instead of at every earlier step.
//!
//! An empty range `x..x` counts as touching a non-empty range `a..b` when
//! `a < x < b` (the rule of [`overlaps`](super::overlaps), whose results
//! these must equal): it is kept at its boundary `x`, and a range looks at
//! the boundaries strictly inside it.

use super::super::{Buf, Step};
use std::ops::Range;

/// A normalised range as ids in the [`Grid`]: `(first, last)` where a
/// non-empty range covers segments `first..last` (and the boundaries
/// `first + 1..last` strictly inside it), and an empty one is the boundary
/// `first == last`.
type Span = (usize, usize);

/// The reads and writes of one step, as spans.
struct Access {
    reads: Vec<Span>,
    writes: Vec<Span>,
}

/// Buffers with ranges of their own: Input (where it is not in Output),
/// Output, Scratch and Wire.
const BUFS: usize = 4;

/// Where Input lies in Output, applied: `(buffer number, range)`.
fn normalise(b: Buf, r: Range<usize>, alias: Option<usize>) -> (usize, Range<usize>) {
    match (b, alias) {
        (Buf::Input, Some(o)) => (1, r.start + o..r.end + o),
        (Buf::Input, None) => (0, r),
        (Buf::Output, _) => (1, r),
        (Buf::Scratch, _) => (2, r),
        (Buf::Wire, _) => (3, r),
    }
}

/// Every step's reads and writes as spans, and how many ids the grid has.
fn accesses(steps: &[Step], alias: Option<usize>) -> (Vec<Access>, usize) {
    let raw: Vec<_> = steps
        .iter()
        .map(|s| {
            let n = |v: Vec<(Buf, Range<usize>)>| -> Vec<_> {
                v.into_iter().map(|(b, r)| normalise(b, r, alias)).collect()
            };
            (n(s.reads()), n(s.writes()))
        })
        .collect();
    // Each buffer's boundaries, sorted; ids run through the buffers.
    let mut bounds: [Vec<usize>; BUFS] = Default::default();
    for (rs, ws) in &raw {
        for (b, r) in rs.iter().chain(ws) {
            bounds[*b].push(r.start);
            bounds[*b].push(r.end);
        }
    }
    let mut base = [0usize; BUFS];
    let mut total = 0;
    for (b, v) in bounds.iter_mut().enumerate() {
        v.sort_unstable();
        v.dedup();
        base[b] = total;
        total += v.len();
    }
    let id = |b: usize, x: usize| base[b] + bounds[b].binary_search(&x).unwrap_or_else(|e| e);
    let span = |v: &[(usize, Range<usize>)]| -> Vec<Span> {
        v.iter()
            .map(|(b, r)| (id(*b, r.start), id(*b, r.end)))
            .collect()
    };
    let acc = raw
        .iter()
        .map(|(rs, ws)| Access {
            reads: span(rs),
            writes: span(ws),
        })
        .collect();
    (acc, total)
}

/// The steps recorded per segment and per boundary since the last fence.
struct Touched {
    /// Per segment: steps reading all of it (non-empty reads).
    readers: Vec<Vec<u32>>,
    /// Per segment: steps writing all of it (non-empty writes).
    writers: Vec<Vec<u32>>,
    /// Per boundary: steps reading an empty range there.
    point_readers: Vec<Vec<u32>>,
    /// Per boundary: steps writing an empty range there.
    point_writers: Vec<Vec<u32>>,
    /// Which lists got an entry (0-3: the fields above, and the id), so a
    /// fence clears only those.
    log: Vec<(u8, usize)>,
}

impl Touched {
    fn new(ids: usize) -> Self {
        Touched {
            readers: vec![Vec::new(); ids],
            writers: vec![Vec::new(); ids],
            point_readers: vec![Vec::new(); ids],
            point_writers: vec![Vec::new(); ids],
            log: Vec::new(),
        }
    }

    fn list(&mut self, kind: u8) -> &mut Vec<Vec<u32>> {
        match kind {
            0 => &mut self.readers,
            1 => &mut self.writers,
            2 => &mut self.point_readers,
            _ => &mut self.point_writers,
        }
    }

    /// Records step `i` accessing `span` (`write`: as a write).
    fn record(&mut self, i: u32, (a, b): Span, write: bool) {
        if a < b {
            let kind = u8::from(write);
            for s in a..b {
                self.list(kind)[s].push(i);
                self.log.push((kind, s));
            }
        } else {
            let kind = 2 + u8::from(write);
            self.list(kind)[a].push(i);
            self.log.push((kind, a));
        }
    }

    /// Forgets everything recorded (at a fence).
    fn clear(&mut self) {
        let log = std::mem::take(&mut self.log);
        for &(kind, s) in &log {
            self.list(kind)[s].clear();
        }
        self.log = log;
        self.log.clear();
    }
}

/// For each step, the earlier steps it conflicts with: data hazards and
/// fences. The same as comparing every pair of steps since the last fence
/// (read-after-write, write-after-read, write-after-write), in ascending
/// order, the fence first.
pub(super) fn dependencies(steps: &[Step], alias: Option<usize>) -> Vec<Vec<u32>> {
    let (acc, ids) = accesses(steps, alias);
    let mut t = Touched::new(ids);
    // seen[j] == i: step j is already in step i's list.
    let mut seen = vec![u32::MAX; steps.len()];
    let mut deps = Vec::with_capacity(steps.len());
    let mut last_fence: Option<usize> = None;
    for (i, s) in steps.iter().enumerate() {
        if matches!(s, Step::Fence) {
            deps.push((last_fence.unwrap_or(0)..i).map(|j| j as u32).collect());
            last_fence = Some(i);
            t.clear();
            continue;
        }
        let me = i as u32;
        let mut d: Vec<u32> = last_fence.map(|f| f as u32).into_iter().collect();
        let mut take = |list: &[u32], d: &mut Vec<u32>| {
            for &j in list {
                if seen[j as usize] != me {
                    seen[j as usize] = me;
                    d.push(j);
                }
            }
        };
        let a = &acc[i];
        for &(lo, hi) in a.writes.iter().filter(|(lo, hi)| lo < hi) {
            for s in lo..hi {
                take(&t.writers[s], &mut d);
                take(&t.readers[s], &mut d);
            }
            for s in lo + 1..hi {
                take(&t.point_writers[s], &mut d);
                take(&t.point_readers[s], &mut d);
            }
        }
        for &(lo, hi) in a.reads.iter().filter(|(lo, hi)| lo < hi) {
            for s in lo..hi {
                take(&t.writers[s], &mut d);
            }
            for s in lo + 1..hi {
                take(&t.point_writers[s], &mut d);
            }
        }
        d.sort_unstable();
        for &sp in &a.reads {
            t.record(me, sp, false);
        }
        for &sp in &a.writes {
            t.record(me, sp, true);
        }
        deps.push(d);
    }
    deps
}

/// For each step, whether a later step reads a range it writes (fences
/// do not matter here: the bytes are read again either way). One pass
/// from the end, marking the segments (and inner boundaries) read so far.
pub(super) fn read_back(steps: &[Step], alias: Option<usize>) -> Vec<bool> {
    let (acc, ids) = accesses(steps, alias);
    let mut read = vec![false; ids];
    let mut inner = vec![false; ids];
    let mut out = vec![false; steps.len()];
    for (j, a) in acc.iter().enumerate().rev() {
        out[j] = a.writes.iter().any(|&(lo, hi)| {
            if lo < hi {
                read[lo..hi].iter().any(|&x| x)
            } else {
                inner[lo]
            }
        });
        for &(lo, hi) in a.reads.iter().filter(|(lo, hi)| lo < hi) {
            read[lo..hi].iter_mut().for_each(|x| *x = true);
            inner[lo + 1..hi].iter_mut().for_each(|x| *x = true);
        }
    }
    out
}
