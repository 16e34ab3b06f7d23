//! The mailbox path against the direct schedule: the one-shot body
//! ([`one_shot`]) runs on a symbolic [`Medium`] whose memory holds the
//! verifier's symbols, and every rank must end with exactly the output the
//! verifier finds the direct schedule leaves: the same contributions,
//! reduced in the same order, divided alike (bitwise the same values).

use super::*;
use crate::algo::verify::{self, Cell, Mem};
use crate::algo::{Algorithm, Problem};
use crate::error::Error;
use crate::reduce::DataType;

/// An element never written.
const NONE: u64 = u64::MAX;

/// Every rank's published contribution and the cells their elements name:
/// each 8-byte element of a symbolic buffer holds an index into `cells`.
#[derive(Default)]
struct World {
    slots: Vec<Option<Vec<u64>>>,
    cells: Vec<Cell>,
    errors: Vec<String>,
}

impl World {
    fn cell(&mut self, c: Cell) -> u64 {
        self.cells.push(c);
        (self.cells.len() - 1) as u64
    }
}

/// Rank `me` of `n`'s view of the world, as a [`Medium`].
struct Symbolic<'a> {
    w: &'a mut World,
    n: usize,
    me: usize,
}

/// The `len / 8` ids at `p`.
///
/// # Safety
/// `p` valid for `len` bytes of ids.
unsafe fn ids(p: *const u8, len: usize) -> Vec<u64> {
    // SAFETY: as the caller promises; symbolic buffers are `Vec<u64>`s,
    // so every pointer into them is aligned.
    unsafe { std::slice::from_raw_parts(p as *const u64, len / 8).to_vec() }
}

impl Medium for Symbolic<'_> {
    fn ranks(&self) -> (usize, usize) {
        (self.n, self.me)
    }
    unsafe fn publish(&mut self, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: forwarded.
        self.w.slots[self.me] = Some(unsafe { ids(src, len) });
        Ok(())
    }
    fn own(&self) -> *const u8 {
        self.w.slots[self.me].as_ref().expect("published").as_ptr() as *const u8
    }
    fn receive(&mut self, q: usize) -> Result<*const u8> {
        match &self.w.slots[q] {
            Some(v) => Ok(v.as_ptr() as *const u8),
            None => Err(Error::Internal(format!("rank {q} has not published yet"))),
        }
    }
    unsafe fn reduce(&mut self, acc: *mut u8, a: *const u8, b: *const u8, len: usize) {
        // SAFETY: forwarded.
        let (xa, xb) = unsafe { (ids(a, len), ids(b, len)) };
        for (k, (ia, ib)) in xa.into_iter().zip(xb).enumerate() {
            let id = if ia == NONE || ib == NONE {
                self.w
                    .errors
                    .push(format!("rank {}: reduces an unwritten element", self.me));
                NONE
            } else {
                let (ca, cb) = (self.w.cells[ia as usize], self.w.cells[ib as usize]);
                match ca.combine(&cb) {
                    Ok(c) => self.w.cell(c),
                    Err(e) => {
                        self.w.errors.push(format!("rank {}: {e}", self.me));
                        NONE
                    }
                }
            };
            // SAFETY: `acc` holds `len` bytes of ids (forwarded); element
            // k of `a` and `b` was read above, before this write.
            unsafe { (acc as *mut u64).add(k).write(id) };
        }
    }
    unsafe fn copy(&mut self, src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: forwarded.
        unsafe { std::ptr::copy(src, dst, len) }
    }
    unsafe fn copy_overlapping(&mut self, src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: forwarded.
        unsafe { std::ptr::copy(src, dst, len) }
    }
    fn prefetch_own_next(&self, _: usize) {}
    fn prefetch_peer_next(&self, _: usize, _: usize, _: usize) {}
}

/// A rank's buffers, laid out as the verifier lays out `p`'s (Input in
/// Output where in place), as ids of its input leaves; and the call over them.
struct Rank {
    input: Vec<u64>,
    output: Vec<u64>,
    /// Where Input lies in Output, in place.
    alias: Option<usize>,
    input_len: usize,
}

impl Rank {
    fn new(p: &Problem, w: &mut World) -> Rank {
        let (mut ni, no) = verify::buffer_sizes(p);
        if matches!(p.coll, Collective::Broadcast { root } if root == p.rank) {
            ni = p.count;
        }
        let leaves: Vec<u64> = (0..ni).map(|i| w.cell(Cell::leaf(i, p.rank))).collect();
        let mut output = vec![NONE; no];
        let alias = p.input_in_output();
        let input = match alias {
            Some(o) => {
                output[o..o + ni].copy_from_slice(&leaves);
                Vec::new()
            }
            None => leaves,
        };
        Rank {
            input,
            output,
            alias,
            input_len: ni,
        }
    }

    /// The engine's call for `p` over these buffers.
    fn call(&mut self, p: &Problem) -> OpCall {
        let output = self.output.as_mut_ptr() as *mut u8;
        let input = match self.alias {
            Some(o) => output.wrapping_add(o * 8),
            None if self.input.is_empty() => output,
            None => self.input.as_mut_ptr() as *mut u8,
        };
        OpCall {
            coll: p.coll,
            dtype: DataType::U64,
            op: if p.avg { ReduceOp::Avg } else { ReduceOp::Sum },
            count: p.count,
            vcounts: None,
            in_place: p.in_place && p.coll == Collective::AllReduce,
            input,
            input_len: self.input_len * 8,
            output,
            output_len: self.output.len() * 8,
            algorithm: None,
            timeout: None,
            wire: None,
            background: false,
        }
    }
}

/// Every rank's output after the one-shot body (and an Avg's division) for
/// `ps`, or what went wrong.
fn one_shot_outputs(ps: &[Problem]) -> std::result::Result<Vec<Mem>, String> {
    let n = ps.len();
    let mut w = World {
        slots: vec![None; n],
        ..World::default()
    };
    // Every rank publishes before it reads (the body's first act), so a
    // first pass, on copies, publishes every contribution; the second runs
    // every rank's body whole.
    for p in ps {
        let mut r = Rank::new(p, &mut w);
        let c = r.call(p);
        let mut m = Symbolic {
            w: &mut w,
            n,
            me: p.rank,
        };
        // SAFETY: the buffers hold what the call says; a read of a
        // contribution not yet published fails (and is run again below).
        let _ = unsafe { one_shot(&mut m, &c) };
    }
    w.errors.clear();
    let mut outs = Vec::new();
    for p in ps {
        let mut r = Rank::new(p, &mut w);
        let c = r.call(p);
        let mut m = Symbolic {
            w: &mut w,
            n,
            me: p.rank,
        };
        // SAFETY: as above; every contribution is published now.
        unsafe { one_shot(&mut m, &c) }.map_err(|e| format!("rank {}: {e}", p.rank))?;
        if let Some((off, len, divisor)) = Core::mean_range(&c, n, p.rank) {
            if divisor != n {
                return Err(format!("rank {}: divides by {divisor}", p.rank));
            }
            for k in off / 8..(off + len) / 8 {
                let id = r.output[k];
                let c = w.cells[id as usize]
                    .divided()
                    .map_err(|e| format!("rank {}: {e}", p.rank))?;
                r.output[k] = w.cell(c);
            }
        }
        if let Some(e) = w.errors.first() {
            return Err(e.clone());
        }
        outs.push(
            r.output
                .iter()
                .map(|&id| (id != NONE).then(|| w.cells[id as usize]))
                .collect(),
        );
    }
    Ok(outs)
}

/// Every collective the mailboxes carry, on 2 to 8 ranks, with a few
/// counts, roots, in place and out, Sum and Avg: every rank's output from
/// the one-shot body is the direct schedule's, symbol for symbol and in
/// the same reduction order.
#[test]
fn one_shot_is_the_direct_schedule() {
    let mut runs = 0;
    for n in 2..=8usize {
        let mut colls = vec![
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::AllToAll,
            Collective::Barrier,
        ];
        for root in [0, n / 2, n - 1] {
            colls.extend([
                Collective::Reduce { root },
                Collective::Broadcast { root },
                Collective::Gather { root },
                Collective::Scatter { root },
            ]);
        }
        colls.dedup();
        for coll in colls {
            assert!(contribution(coll, n, 8).is_some(), "{coll:?}");
            for count in [0, 1, 3, 17] {
                let in_place: &[bool] = match coll {
                    Collective::AllReduce
                    | Collective::AllGather
                    | Collective::Broadcast { .. } => &[false, true],
                    _ => &[false],
                };
                let avg: &[bool] = if coll.reduces() {
                    &[false, true]
                } else {
                    &[false]
                };
                for &in_place in in_place {
                    for &avg in avg {
                        let mut ps = verify::problems(coll, n, count, in_place);
                        for p in &mut ps {
                            p.avg = avg;
                        }
                        let what =
                            format!("{coll:?} n={n} count={count} in_place={in_place} avg={avg}");
                        let scheds = ps
                            .iter()
                            .map(|p| Algorithm::Direct.build(p).expect("direct builds it"))
                            .collect();
                        let (_, want) = verify::run_outputs(&ps, scheds)
                            .unwrap_or_else(|e| panic!("{what}: direct: {e}"));
                        let got = one_shot_outputs(&ps)
                            .unwrap_or_else(|e| panic!("{what}: one shot: {e}"));
                        for r in 0..n {
                            assert_eq!(got[r], want[r], "{what}: rank {r}");
                        }
                        runs += 1;
                    }
                }
            }
        }
    }
    assert!(runs > 500, "{runs}");
}

/// The comparison can fail: a body that reduced in another order, or read
/// its own part where an in-place sum had overwritten it, would differ.
#[test]
fn a_different_order_is_caught() {
    let ps = verify::problems(Collective::AllReduce, 3, 2, false);
    let scheds = ps
        .iter()
        .map(|p| Algorithm::Direct.build(p).unwrap())
        .collect();
    let (_, want) = verify::run_outputs(&ps, scheds).unwrap();
    let got = one_shot_outputs(&ps).unwrap();
    assert_eq!(got, want);
    // x0 + (x1 + x2) is not (x0 + x1) + x2.
    let (a, b, c) = (Cell::leaf(0, 0), Cell::leaf(0, 1), Cell::leaf(0, 2));
    let left = a.combine(&b).unwrap().combine(&c).unwrap();
    let right = a.combine(&b.combine(&c).unwrap()).unwrap();
    assert_eq!(left.sym, right.sym);
    assert_ne!(left, right);
    assert_eq!(got[0][0], Some(left));
}
