//! The symbolic verifier: runs every rank's schedule in memory and proves
//! that each rank ends with exactly the right contributions.
//!
//! Every element is a symbol `(index, set of ranks)`: rank r's input element
//! i starts as `(i, {r})`, in Input (or, in place, where Input lies in
//! Output); every other element of Output starts unwritten. Receiving copies symbols; reducing two symbols
//! requires the same index and disjoint rank sets (no contribution counted
//! twice) and yields their union. The simulation follows the executor's rules
//! (dependencies, per-peer message order, a message moves only when both
//! sides have reached it: no buffering is assumed, so a schedule that passes
//! cannot deadlock on any transport). It reports unmatched sends, length
//! mismatches, reads of data never written, writes to the (read-only) Input
//! of an out-of-place op, deadlocks, and wrong results.
//!
//! An Avg reduction ([`Problem::avg`]) must end with every result divided
//! by the rank count ([`Step::Scale`]) exactly once, after its last
//! contribution is in (a divided element may not be reduced again); any
//! other reduction, never.
//!
//! Beside its symbol, every element carries a fingerprint of the order in
//! which it was reduced (`a op b` and `b op a` differ, as may their bits
//! for max/min of signed zeros or NaNs). AllReduce results must have the same
//! fingerprint on every rank: every rank gets bitwise the same floats.
//!
//! A schedule lowered to a 16-bit wire ([`super::wire`]) keeps two kinds
//! of element apart: data elements (Input, Output, Scratch) and wire
//! elements (in [`Buf::Wire`], made only by [`Step::Narrow`]). Its
//! messages move only wire elements, so every value crosses each hop
//! narrowed, and it reduces only data elements (a received one after
//! [`Step::Widen`] or inside [`Step::WidenReduce`]). A narrowing (or
//! [`Step::Round`]) changes the fingerprint unless the value is already
//! rounded (rounding is idempotent), so the AllReduce check above also
//! proves that every rank rounded alike.

use super::{Algorithm, Buf, Collective, Loc, Problem, Schedule, Step};
use std::collections::VecDeque;
use std::fmt;

/// The content of one element: which input index it derives from and which
/// ranks' contributions it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sym {
    /// Index of the element in the contributing ranks' inputs.
    pub idx: usize,
    /// Contributing ranks, one bit each (so at most 128 ranks).
    pub ranks: u128,
}

/// What the verifier found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError(pub String);

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for VerifyError {}

/// What a verified run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Messages sent, all ranks together.
    pub messages: usize,
    /// Elements sent by each rank.
    pub elems_sent: Vec<usize>,
    /// Rounds of the simulation (a rough critical-path length).
    pub rounds: usize,
}

/// An element in the simulation: its symbol, the fingerprint of its
/// reduction order, and whether it was divided. Two elements with equal
/// cells hold bitwise the same value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    /// What it sums.
    pub sym: Sym,
    /// The fingerprint of the order it was reduced (and divided) in.
    pub shape: u64,
    /// Divided by the rank count ([`Step::Scale`]): the mean of what `sym`
    /// sums, which may not be reduced further.
    pub mean: bool,
    /// A wire element ([`Buf::Wire`]), not a data element.
    pub wire: bool,
    /// Exactly representable in the wire type (narrowed, widened or
    /// rounded since its last arithmetic): narrowing it changes nothing.
    pub rounded: bool,
}

impl Cell {
    /// Rank `rank`'s input element `idx`.
    pub fn leaf(idx: usize, rank: usize) -> Self {
        Cell {
            sym: Sym {
                idx,
                ranks: 1u128 << rank,
            },
            shape: mix(rank as u64 + 1),
            mean: false,
            wire: false,
            rounded: false,
        }
    }

    /// `self` narrowed to the wire type (`wire`: as a wire element, else
    /// widened back: rounded), or why it may not be.
    pub fn narrowed(&self, wire: bool) -> Result<Cell, String> {
        if self.wire {
            return Err(format!(
                "narrows element {}, which is already a wire element",
                self.sym.idx
            ));
        }
        Ok(Cell {
            shape: if self.rounded {
                self.shape
            } else {
                mix(self.shape ^ 0x0b16)
            },
            wire,
            rounded: true,
            ..*self
        })
    }

    /// `self`, a wire element, widened to a data element.
    pub fn widened(&self) -> Result<Cell, String> {
        if !self.wire {
            return Err(format!(
                "widens element {}, which is not a wire element",
                self.sym.idx
            ));
        }
        Ok(Cell {
            wire: false,
            ..*self
        })
    }

    /// `self (op) other`, `self` the local operand, or why the two may not
    /// be reduced.
    pub fn combine(&self, other: &Cell) -> Result<Cell, String> {
        let (x, y) = (&self.sym, &other.sym);
        if self.wire || other.wire {
            Err(format!(
                "reduces element {} as a wire element: a 16-bit wire reduces in the data type",
                x.idx
            ))
        } else if self.mean || other.mean {
            Err(format!(
                "reduces element {} after it was divided by the rank count",
                x.idx
            ))
        } else if x.idx != y.idx {
            Err(format!("reduces element {} with element {}", x.idx, y.idx))
        } else if x.ranks & y.ranks != 0 {
            Err(format!(
                "counts contributions {:#x} twice at element {}",
                x.ranks & y.ranks,
                x.idx
            ))
        } else {
            Ok(Cell {
                sym: Sym {
                    idx: x.idx,
                    ranks: x.ranks | y.ranks,
                },
                shape: mix(self.shape.rotate_left(23) ^ mix(other.shape)),
                mean: false,
                wire: false,
                rounded: false,
            })
        }
    }

    /// `self` divided by the rank count, or why it may not be.
    pub fn divided(&self) -> Result<Cell, String> {
        if self.mean {
            return Err("divides by the rank count a second time".into());
        }
        Ok(Cell {
            shape: mix(self.shape ^ 0x5ca1e),
            mean: true,
            rounded: false,
            ..*self
        })
    }
}

/// splitmix64's finaliser: a cheap, well-spread hash step.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A buffer in the simulation: each element's cell, `None` where never
/// written.
pub type Mem = Vec<Option<Cell>>;

struct RankState {
    sched: Schedule,
    /// Input, when apart from Output (else empty).
    input: Mem,
    /// Input's length in elements (it may lie in Output).
    input_len: usize,
    output: Mem,
    scratch: Mem,
    /// The wire staging ([`Buf::Wire`]).
    wire: Mem,
    /// Where Input lies in Output when in place ([`Problem::input_in_output`]).
    alias: Option<usize>,
    done: Vec<bool>,
    recv_done: Vec<bool>,
    /// Step indices of send halves, per destination, in order.
    sendq: Vec<VecDeque<usize>>,
    /// Step indices of receive halves, per source, in order.
    recvq: Vec<VecDeque<usize>>,
}

impl RankState {
    /// The memory `b` lives in, where in it `b` starts, and `b`'s length.
    fn mem(&mut self, b: Buf) -> (&mut Mem, usize, usize) {
        match (b, self.alias) {
            (Buf::Input, Some(o)) => (&mut self.output, o, self.input_len),
            (Buf::Input, None) => (&mut self.input, 0, self.input_len),
            (Buf::Output, _) => {
                let n = self.output.len();
                (&mut self.output, 0, n)
            }
            (Buf::Scratch, _) => {
                let n = self.scratch.len();
                (&mut self.scratch, 0, n)
            }
            (Buf::Wire, _) => {
                let n = self.wire.len();
                (&mut self.wire, 0, n)
            }
        }
    }

    fn read(
        &mut self,
        rank: usize,
        i: usize,
        l: Loc,
        len: usize,
    ) -> Result<Vec<Cell>, VerifyError> {
        let (m, base, size) = self.mem(l.buf);
        if l.off + len > size {
            return Err(VerifyError(format!(
                "rank {rank} step {i}: reads {:?}[{}..{}] past its end ({size})",
                l.buf,
                l.off,
                l.off + len,
            )));
        }
        m[base + l.off..base + l.off + len]
            .iter()
            .enumerate()
            .map(|(k, x)| {
                x.ok_or_else(|| {
                    VerifyError(format!(
                        "rank {rank} step {i}: reads {:?}[{}], which was never written",
                        l.buf,
                        l.off + k
                    ))
                })
            })
            .collect()
    }

    fn write(&mut self, rank: usize, i: usize, l: Loc, data: &[Cell]) -> Result<(), VerifyError> {
        if l.buf == Buf::Input && self.alias.is_none() && !data.is_empty() {
            return Err(VerifyError(format!(
                "rank {rank} step {i}: writes Input[{}..{}], the caller's read-only send buffer",
                l.off,
                l.off + data.len()
            )));
        }
        if let Some(k) = data.iter().position(|d| d.wire != (l.buf == Buf::Wire)) {
            return Err(VerifyError(format!(
                "rank {rank} step {i}: writes {} element to {:?}[{}]",
                if data[k].wire { "a wire" } else { "a data" },
                l.buf,
                l.off + k
            )));
        }
        let (m, base, size) = self.mem(l.buf);
        if l.off + data.len() > size {
            return Err(VerifyError(format!(
                "rank {rank} step {i}: writes {:?}[{}..{}] past its end ({size})",
                l.buf,
                l.off,
                l.off + data.len(),
            )));
        }
        for (k, d) in data.iter().enumerate() {
            m[base + l.off + k] = Some(*d);
        }
        Ok(())
    }

    fn ready(&self, i: usize) -> bool {
        self.sched.deps[i].iter().all(|&d| self.done[d as usize])
    }
}

/// `a op b`, element by element (`a` is the local operand).
fn combine(rank: usize, i: usize, a: &[Cell], b: &[Cell]) -> Result<Vec<Cell>, VerifyError> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            x.combine(y)
                .map_err(|e| VerifyError(format!("rank {rank} step {i}: {e}")))
        })
        .collect()
}

/// Input and Output sizes of `p`, per the conventions of [`Problem`], as
/// the caller passes them: a Broadcast root's Input is left out (0), as the
/// root may pass its data in Output alone; where it passes it apart (not
/// in place), its Input holds `count` elements more.
pub fn buffer_sizes(p: &Problem) -> (usize, usize) {
    let (n, c, r) = (p.nranks, p.count, p.rank);
    match p.coll {
        Collective::AllReduce => (c, c),
        Collective::Broadcast { .. } => (0, c),
        Collective::Reduce { root } => (c, if r == root { c } else { 0 }),
        Collective::AllGather => (c, n * c),
        Collective::ReduceScatter => (n * c, c),
        Collective::AllToAll => (n * c, n * c),
        Collective::AllToAllV => {
            let v = p.vcounts.as_ref().expect("AllToAllV needs vcounts");
            let ends = |cs: &[usize], ds: &[usize]| {
                cs.iter().zip(ds).map(|(c, d)| c + d).max().unwrap_or(0)
            };
            (
                ends(&v.send_counts, &v.send_displs),
                ends(&v.recv_counts, &v.recv_displs),
            )
        }
        Collective::Gather { root } => (c, if r == root { n * c } else { 0 }),
        Collective::Scatter { root } => (if r == root { n * c } else { 0 }, c),
        Collective::Barrier => (0, 0),
        Collective::Send { .. } => (c, 0),
        Collective::Recv { .. } => (0, c),
    }
}

/// Input's length (with a Broadcast root's data, in Input or, in place,
/// in Output), Input apart from Output (empty in place) and Output at the
/// start of `p`'s op.
fn initial(p: &Problem) -> Result<(usize, Mem, Mem), VerifyError> {
    let (mut ni, no) = buffer_sizes(p);
    if matches!(p.coll, Collective::Broadcast { root } if root == p.rank) {
        ni = p.count;
    }
    let mut input: Mem = (0..ni).map(|i| Some(Cell::leaf(i, p.rank))).collect();
    let mut output: Mem = vec![None; no];
    if let Some(o) = p.input_in_output() {
        if o + ni > no {
            return Err(VerifyError(format!(
                "rank {}: {:?} cannot run in place: Input ({ni}) does not fit Output ({no}) at {o}",
                p.rank, p.coll
            )));
        }
        output[o..o + ni].copy_from_slice(&input);
        input.clear();
    }
    Ok((ni, input, output))
}

fn expected(ps: &[Problem], r: usize) -> Vec<Option<Sym>> {
    let p = &ps[r];
    let (n, c) = (p.nranks, p.count);
    let all = if n == 128 {
        u128::MAX
    } else {
        (1u128 << n) - 1
    };
    let one = |idx, q: usize| {
        Some(Sym {
            idx,
            ranks: 1u128 << q,
        })
    };
    let full = |idx| Some(Sym { idx, ranks: all });
    match p.coll {
        Collective::AllReduce => (0..c).map(full).collect(),
        Collective::Broadcast { root } => (0..c).map(|i| one(i, root)).collect(),
        Collective::Reduce { root } if r == root => (0..c).map(full).collect(),
        Collective::AllGather => (0..n * c).map(|j| one(j % c, j / c.max(1))).collect(),
        Collective::ReduceScatter => (0..c).map(|i| full(r * c + i)).collect(),
        Collective::AllToAll => (0..n * c)
            .map(|j| one(r * c + j % c, j / c.max(1)))
            .collect(),
        Collective::AllToAllV => {
            let v = p.vcounts.as_ref().unwrap();
            let mut out = vec![None; buffer_sizes(p).1];
            for q in 0..n {
                let vq = ps[q].vcounts.as_ref().unwrap();
                for i in 0..v.recv_counts[q] {
                    out[v.recv_displs[q] + i] = one(vq.send_displs[r] + i, q);
                }
            }
            out
        }
        Collective::Gather { root } if r == root => {
            (0..n * c).map(|j| one(j % c, j / c.max(1))).collect()
        }
        Collective::Scatter { root } => (0..c).map(|i| one(r * c + i, root)).collect(),
        Collective::Recv { peer } => (0..c).map(|i| one(i, peer)).collect(),
        _ => vec![None; buffer_sizes(p).1],
    }
}

/// Builds every rank's schedule for `problems` (one per rank) with `alg`,
/// runs them symbolically, and checks every rank's Output.
///
/// Returns `Ok(None)` when `alg` does not implement the collective.
pub fn verify(problems: &[Problem], alg: Algorithm) -> Result<Option<Report>, VerifyError> {
    let mut scheds = Vec::new();
    for p in problems {
        match alg.build(p) {
            Some(s) => scheds.push(s),
            None => return Ok(None),
        }
    }
    run(problems, scheds).map(Some)
}

/// Runs the given schedules (one per rank) symbolically and checks results.
pub fn run(problems: &[Problem], scheds: Vec<Schedule>) -> Result<Report, VerifyError> {
    run_outputs(problems, scheds).map(|(report, _)| report)
}

/// [`run`], also returning every rank's Output as it ends (`None` where
/// nothing was written).
pub fn run_outputs(
    problems: &[Problem],
    scheds: Vec<Schedule>,
) -> Result<(Report, Vec<Mem>), VerifyError> {
    let n = problems.len();
    assert!(n <= 128, "the verifier handles at most 128 ranks");
    let mut st: Vec<RankState> = Vec::new();
    for (p, sched) in problems.iter().zip(scheds) {
        let (input_len, input, output) = initial(p)?;
        let mut sendq = vec![VecDeque::new(); n];
        let mut recvq = vec![VecDeque::new(); n];
        for (i, s) in sched.steps.iter().enumerate() {
            for q in [s.send_peer(), s.recv_peer()].into_iter().flatten() {
                if q >= n || q == p.rank {
                    return Err(VerifyError(format!(
                        "rank {} step {i}: peer {q} is out of range or itself",
                        p.rank
                    )));
                }
            }
            if let Some(q) = s.send_peer() {
                sendq[q].push_back(i);
            }
            if let Some(q) = s.recv_peer() {
                recvq[q].push_back(i);
            }
        }
        let k = sched.steps.len();
        for (i, s) in sched.steps.iter().enumerate() {
            let wire_msg = s.message_loc().map(|l| l.buf == Buf::Wire);
            let bad = match (sched.wire, s) {
                (None, _) => s.converts() || wire_msg == Some(true),
                (Some(_), Step::RecvReduce { .. } | Step::RecvReduceSend { .. }) => true,
                (Some(_), _) => wire_msg == Some(false),
            };
            if bad {
                return Err(VerifyError(format!(
                    "rank {} step {i} ({s:?}): {}",
                    p.rank,
                    if sched.wire.is_some() {
                        "a schedule on a 16-bit wire sends and receives only wire elements, and reduces after it widens"
                    } else {
                        "a schedule without a wire type neither converts nor stages wire elements"
                    }
                )));
            }
        }
        st.push(RankState {
            scratch: vec![None; sched.scratch],
            wire: vec![None; sched.staging],
            sched,
            input,
            input_len,
            output,
            alias: p.input_in_output(),
            done: vec![false; k],
            recv_done: vec![false; k],
            sendq,
            recvq,
        });
    }
    let mut report = Report {
        elems_sent: vec![0; n],
        ..Report::default()
    };
    loop {
        let mut progress = false;
        // Local steps.
        for (r, sr) in st.iter_mut().enumerate() {
            for i in 0..sr.sched.steps.len() {
                if sr.done[i] || !sr.ready(i) {
                    continue;
                }
                let step = sr.sched.steps[i];
                match step {
                    Step::Copy { src, dst, len } => {
                        let d = sr.read(r, i, src, len)?;
                        sr.write(r, i, dst, &d)?;
                    }
                    Step::Reduce { src, dst, len } => {
                        let a = sr.read(r, i, dst, len)?;
                        let b = sr.read(r, i, src, len)?;
                        let d = combine(r, i, &a, &b)?;
                        sr.write(r, i, dst, &d)?;
                    }
                    Step::Scale { dst, len, divisor } => {
                        if divisor != n {
                            return Err(VerifyError(format!(
                                "rank {r} step {i}: divides by {divisor}, not by the rank count {n}"
                            )));
                        }
                        let mut d = sr.read(r, i, dst, len)?;
                        for (k, c) in d.iter_mut().enumerate() {
                            *c = c.divided().map_err(|e| {
                                VerifyError(format!(
                                    "rank {r} step {i}: {e} at {:?}[{}]",
                                    dst.buf,
                                    dst.off + k
                                ))
                            })?;
                        }
                        sr.write(r, i, dst, &d)?;
                    }
                    Step::Narrow { src, dst, len } | Step::Round { src, dst, len } => {
                        let to_wire = matches!(step, Step::Narrow { .. });
                        let d = sr
                            .read(r, i, src, len)?
                            .iter()
                            .map(|c| c.narrowed(to_wire))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| VerifyError(format!("rank {r} step {i}: {e}")))?;
                        sr.write(r, i, dst, &d)?;
                    }
                    Step::Widen { src, dst, len } => {
                        let d = sr
                            .read(r, i, src, len)?
                            .iter()
                            .map(Cell::widened)
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| VerifyError(format!("rank {r} step {i}: {e}")))?;
                        sr.write(r, i, dst, &d)?;
                    }
                    Step::WidenReduce {
                        src,
                        wire,
                        dst,
                        len,
                    } => {
                        let a = sr.read(r, i, src, len)?;
                        let b = sr
                            .read(r, i, wire, len)?
                            .iter()
                            .map(Cell::widened)
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| VerifyError(format!("rank {r} step {i}: {e}")))?;
                        let d = combine(r, i, &a, &b)?;
                        sr.write(r, i, dst, &d)?;
                    }
                    Step::Fence => {}
                    _ => continue,
                }
                sr.done[i] = true;
                progress = true;
            }
        }
        // Messages: a send half at the head of r's queue to q meets the
        // receive half at the head of q's queue from r.
        for r in 0..n {
            for q in 0..n {
                let Some(&si) = st[r].sendq[q].front() else {
                    continue;
                };
                let Some(&ri) = st[q].recvq[r].front() else {
                    continue;
                };
                let sstep = st[r].sched.steps[si];
                let send_ready = st[r].ready(si)
                    && match sstep {
                        Step::Send { .. } => true,
                        _ => st[r].recv_done[si],
                    };
                if !send_ready || !st[q].ready(ri) {
                    continue;
                }
                let (sloc, slen) = match sstep {
                    Step::Send { src, len, .. } => (src, len),
                    Step::RecvReduceSend { dst, len, .. } | Step::RecvCopySend { dst, len, .. } => {
                        (dst, len)
                    }
                    _ => unreachable!(),
                };
                let rstep = st[q].sched.steps[ri];
                if rstep.len() != slen {
                    return Err(VerifyError(format!(
                        "rank {r} step {si} sends {slen} elements to rank {q}, whose step {ri} expects {}",
                        rstep.len()
                    )));
                }
                let data = st[r].read(r, si, sloc, slen)?;
                match rstep {
                    Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => {
                        st[q].write(q, ri, dst, &data)?
                    }
                    Step::RecvReduce { src, dst, len, .. }
                    | Step::RecvReduceSend { src, dst, len, .. } => {
                        let a = st[q].read(q, ri, src, len)?;
                        let d = combine(q, ri, &a, &data)?;
                        st[q].write(q, ri, dst, &d)?;
                    }
                    _ => unreachable!(),
                }
                report.messages += 1;
                report.elems_sent[r] += slen;
                st[r].sendq[q].pop_front();
                st[q].recvq[r].pop_front();
                st[q].recv_done[ri] = true;
                if rstep.send_peer().is_none() {
                    st[q].done[ri] = true;
                }
                st[r].done[si] = true;
                progress = true;
            }
        }
        report.rounds += 1;
        if !progress {
            break;
        }
    }
    for (r, s) in st.iter().enumerate() {
        if let Some(i) = s.done.iter().position(|d| !d) {
            let waiting: Vec<String> =
                s.sendq
                    .iter()
                    .enumerate()
                    .filter_map(|(q, d)| d.front().map(|i| format!("send step {i} to {q}")))
                    .chain(
                        s.recvq.iter().enumerate().filter_map(|(q, d)| {
                            d.front().map(|i| format!("recv step {i} from {q}"))
                        }),
                    )
                    .collect();
            return Err(VerifyError(format!(
                "deadlock or unmatched message: rank {r} never finishes step {i} ({:?}); pending: {}",
                s.sched.steps[i],
                waiting.join(", ")
            )));
        }
    }
    for (r, s) in st.iter().enumerate() {
        let want = expected(problems, r);
        let cell = |k: usize| s.output.get(k).copied().flatten();
        let got = |k: usize| cell(k).map(|c| c.sym);
        if let Some(k) = (0..want.len()).find(|&k| want[k].is_some() && got(k) != want[k]) {
            return Err(VerifyError(format!(
                "rank {r}: Output[{k}] is {:?}, expected {:?}",
                got(k),
                want[k]
            )));
        }
        // An Avg result is the mean, divided once; nothing else is divided.
        let p = &problems[r];
        let mean = p.avg && p.coll.reduces();
        if let Some(k) =
            (0..want.len()).find(|&k| want[k].is_some() && cell(k).is_some_and(|c| c.mean != mean))
        {
            return Err(VerifyError(if mean {
                format!("rank {r}: Output[{k}] is the sum, but the reduction is Avg: it is never divided by the rank count")
            } else {
                format!("rank {r}: Output[{k}] is divided by the rank count, but the reduction is not Avg")
            }));
        }
    }
    if problems.first().map(|p| p.coll) == Some(Collective::AllReduce) {
        for (r, s) in st.iter().enumerate().skip(1) {
            let shape = |m: &Mem, k: usize| m[k].map(|c| c.shape);
            if let Some(k) =
                (0..s.output.len()).find(|&k| shape(&s.output, k) != shape(&st[0].output, k))
            {
                return Err(VerifyError(format!(
                    "ranks 0 and {r} reduced Output[{k}] in different orders: \
                     their results would not be bitwise identical"
                )));
            }
        }
    }
    Ok((report, st.into_iter().map(|s| s.output).collect()))
}

/// One [`Problem`] per rank for `coll` on `n` ranks with `count` elements.
pub fn problems(coll: Collective, n: usize, count: usize, in_place: bool) -> Vec<Problem> {
    (0..n)
        .map(|r| {
            let mut p = Problem::new(coll, n, r, count);
            p.in_place = in_place;
            p
        })
        .collect()
}

#[cfg(test)]
mod tests;
