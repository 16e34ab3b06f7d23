//! Algorithms as schedules.
//!
//! An algorithm is a pure function from a [`Problem`] (which collective, how
//! many ranks, which rank, how many elements) to a [`Schedule`]: a list of
//! [`Step`]s over element ranges of three buffers ([`Buf::Input`],
//! [`Buf::Output`], [`Buf::Scratch`]). Nothing here touches sockets, shared
//! memory, threads or clocks; the executor (`engine`), the verifier
//! ([`verify`]) and the cost model (`tune`) all consume the same schedule.
//!
//! # Meaning of a schedule
//!
//! A schedule means "run the steps in order", with two relaxations that let
//! the executor overlap work:
//!
//! * messages between two ranks are matched in order: the k-th `Send` to
//!   peer p on rank r is received by the k-th receiving step from r on p
//!   (`Recv`, `RecvReduce` or the receive half of a fused step);
//! * a step may start before earlier steps have finished when it does not
//!   touch their data: [`Schedule::deps`] lists, for each step, the earlier
//!   steps whose ranges conflict with it (read-after-write, write-after-read,
//!   write-after-write), plus the ordering of messages on each peer queue.
//!   A [`Step::Fence`] conflicts with everything and so orders all steps.
//!
//! Fused steps ([`Step::RecvReduceSend`], [`Step::RecvCopySend`]) forward
//! bytes to the next rank as soon as they have been received (and reduced),
//! so a ring step is one pass over memory and a chain pipelines on its own.

mod direct;
mod double_tree;
mod halving_doubling;
mod hierarchical;
mod pairwise;
mod ring;
mod tree;
mod two_shot;
pub mod verify;

use crate::error::{Error, Result};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// One of the buffers a schedule works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The user's send buffer.
    Input,
    /// The user's receive buffer (the same memory as `Input` when the op is in place).
    Output,
    /// Temporary space the executor provides, [`Schedule::scratch`] elements long.
    Scratch,
}

/// A place in a buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Which buffer.
    pub buf: Buf,
    /// Offset in elements.
    pub off: usize,
}

impl Loc {
    /// `Input[off..]`.
    pub const fn input(off: usize) -> Self {
        Loc {
            buf: Buf::Input,
            off,
        }
    }
    /// `Output[off..]`.
    pub const fn output(off: usize) -> Self {
        Loc {
            buf: Buf::Output,
            off,
        }
    }
    /// `Scratch[off..]`.
    pub const fn scratch(off: usize) -> Self {
        Loc {
            buf: Buf::Scratch,
            off,
        }
    }
}

/// One step of a schedule. Lengths are in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send `len` elements at `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// Where the data is.
        src: Loc,
        /// Elements.
        len: usize,
    },
    /// Receive `len` elements from `peer` into `dst`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the data goes.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Receive from `peer` and store `dst = src (op) received`.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// The local operand.
        src: Loc,
        /// Where the result goes (may equal `src`).
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// `RecvReduce` from `from`, then forward the result (`dst`) to `to` as it is produced.
    RecvReduceSend {
        /// Source rank.
        from: usize,
        /// Destination rank of the forwarded result.
        to: usize,
        /// The local operand.
        src: Loc,
        /// Where the result goes (may equal `src`).
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// `Recv` from `from` into `dst`, forwarding the data to `to` as it arrives.
    RecvCopySend {
        /// Source rank.
        from: usize,
        /// Destination rank.
        to: usize,
        /// Where the data goes.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Local copy.
    Copy {
        /// From.
        src: Loc,
        /// To.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Local reduction `dst = dst (op) src`.
    Reduce {
        /// Operand.
        src: Loc,
        /// Accumulator.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Orders everything: no later step starts before every earlier step is done.
    Fence,
}

impl Step {
    /// The peer this step receives from, if any.
    pub fn recv_peer(&self) -> Option<usize> {
        match *self {
            Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } => Some(peer),
            Step::RecvReduceSend { from, .. } | Step::RecvCopySend { from, .. } => Some(from),
            _ => None,
        }
    }

    /// The peer this step sends to, if any.
    pub fn send_peer(&self) -> Option<usize> {
        match *self {
            Step::Send { peer, .. } => Some(peer),
            Step::RecvReduceSend { to, .. } | Step::RecvCopySend { to, .. } => Some(to),
            _ => None,
        }
    }

    /// Elements this step moves or touches.
    pub fn len(&self) -> usize {
        match *self {
            Step::Send { len, .. }
            | Step::Recv { len, .. }
            | Step::RecvReduce { len, .. }
            | Step::RecvReduceSend { len, .. }
            | Step::RecvCopySend { len, .. }
            | Step::Copy { len, .. }
            | Step::Reduce { len, .. } => len,
            Step::Fence => 0,
        }
    }

    /// True if the step has no elements (a `Fence`, or a zero-length step).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if the step combines received data with local data.
    pub fn reduces(&self) -> bool {
        matches!(
            self,
            Step::RecvReduce { .. } | Step::RecvReduceSend { .. } | Step::Reduce { .. }
        )
    }

    /// Ranges the step reads (buffer, element range).
    pub fn reads(&self) -> Vec<(Buf, Range<usize>)> {
        let r = |l: Loc, n: usize| (l.buf, l.off..l.off + n);
        match *self {
            Step::Send { src, len, .. } => vec![r(src, len)],
            Step::RecvReduce { src, len, .. } | Step::RecvReduceSend { src, len, .. } => {
                vec![r(src, len)]
            }
            Step::Copy { src, len, .. } => vec![r(src, len)],
            Step::Reduce { src, dst, len } => vec![r(src, len), r(dst, len)],
            _ => vec![],
        }
    }

    /// Ranges the step writes.
    pub fn writes(&self) -> Vec<(Buf, Range<usize>)> {
        let r = |l: Loc, n: usize| (l.buf, l.off..l.off + n);
        match *self {
            Step::Recv { dst, len, .. }
            | Step::RecvReduce { dst, len, .. }
            | Step::RecvReduceSend { dst, len, .. }
            | Step::RecvCopySend { dst, len, .. }
            | Step::Copy { dst, len, .. }
            | Step::Reduce { dst, len, .. } => vec![r(dst, len)],
            _ => vec![],
        }
    }
}

/// The collectives, with their root or peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// The root's buffer is copied to every rank.
    Broadcast {
        /// Root rank.
        root: usize,
    },
    /// The root ends with the reduction of all inputs.
    Reduce {
        /// Root rank.
        root: usize,
    },
    /// Every rank ends with every rank's input, in rank order.
    AllGather,
    /// Rank r ends with block r of the reduction of all inputs.
    ReduceScatter,
    /// Rank r sends its block p to rank p, which stores it as block r.
    AllToAll,
    /// AllToAll with per-peer counts and displacements.
    AllToAllV,
    /// The root ends with every rank's input, in rank order.
    Gather {
        /// Root rank.
        root: usize,
    },
    /// Block p of the root's input goes to rank p.
    Scatter {
        /// Root rank.
        root: usize,
    },
    /// Nobody leaves before everybody has arrived.
    Barrier,
    /// Point-to-point send to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
    },
    /// Point-to-point receive from `peer`.
    Recv {
        /// Source rank.
        peer: usize,
    },
}

/// The kind of a collective, without its root: used for names and for `TUTTI_ALGO`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollKind {
    /// AllReduce.
    AllReduce,
    /// Broadcast.
    Broadcast,
    /// Reduce.
    Reduce,
    /// AllGather.
    AllGather,
    /// ReduceScatter.
    ReduceScatter,
    /// AllToAll (and AllToAllV).
    AllToAll,
    /// Gather.
    Gather,
    /// Scatter.
    Scatter,
    /// Barrier.
    Barrier,
    /// Send and Recv.
    SendRecv,
}

impl CollKind {
    /// Every kind.
    pub const ALL: [CollKind; 10] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Barrier,
        CollKind::SendRecv,
    ];

    /// The name as `tutti perf` spells it (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "all_to_all",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::Barrier => "barrier",
            CollKind::SendRecv => "send_recv",
        }
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CollKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let l: String = s
            .to_ascii_lowercase()
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect();
        for k in CollKind::ALL {
            if k.name().replace('_', "") == l {
                return Ok(k);
            }
        }
        match l.as_str() {
            "alltoallv" => Ok(CollKind::AllToAll),
            "sendrecv" | "send" | "recv" | "p2p" => Ok(CollKind::SendRecv),
            _ => Err(Error::arg(format!(
                "unknown collective '{s}'; valid: {}",
                CollKind::ALL.map(|k| k.name()).join(", ")
            ))),
        }
    }
}

impl Collective {
    /// The kind of this collective.
    pub const fn kind(&self) -> CollKind {
        match self {
            Collective::AllReduce => CollKind::AllReduce,
            Collective::Broadcast { .. } => CollKind::Broadcast,
            Collective::Reduce { .. } => CollKind::Reduce,
            Collective::AllGather => CollKind::AllGather,
            Collective::ReduceScatter => CollKind::ReduceScatter,
            Collective::AllToAll | Collective::AllToAllV => CollKind::AllToAll,
            Collective::Gather { .. } => CollKind::Gather,
            Collective::Scatter { .. } => CollKind::Scatter,
            Collective::Barrier => CollKind::Barrier,
            Collective::Send { .. } | Collective::Recv { .. } => CollKind::SendRecv,
        }
    }

    /// The root, for rooted collectives.
    pub const fn root(&self) -> Option<usize> {
        match *self {
            Collective::Broadcast { root }
            | Collective::Reduce { root }
            | Collective::Gather { root }
            | Collective::Scatter { root } => Some(root),
            _ => None,
        }
    }
}

/// Per-peer counts and displacements of an AllToAllV, from one rank's view (elements).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct VCounts {
    /// Elements sent to each peer.
    pub send_counts: Vec<usize>,
    /// Where in Input the block for each peer starts.
    pub send_displs: Vec<usize>,
    /// Elements received from each peer.
    pub recv_counts: Vec<usize>,
    /// Where in Output the block from each peer goes.
    pub recv_displs: Vec<usize>,
}

/// What a schedule is built for.
///
/// Buffer conventions (all lengths in elements, `c = count`, `n = nranks`):
///
/// | collective | Input | Output |
/// |---|---|---|
/// | AllReduce | c | c (may be the same memory as Input: `in_place`) |
/// | Broadcast | – | c (the root's holds the data at the start) |
/// | Reduce | c | c, on the root only |
/// | AllGather | – | n*c; this rank's block is already at `rank*c` |
/// | ReduceScatter | n*c | c |
/// | AllToAll | n*c | n*c |
/// | AllToAllV | per [`VCounts`] | per [`VCounts`] |
/// | Gather | c | n*c, on the root only |
/// | Scatter | n*c, on the root only | c |
/// | Send / Recv | c / – | – / c |
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    /// Which collective.
    pub coll: Collective,
    /// Number of ranks.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Element count, per the table above.
    pub count: usize,
    /// Input and Output are the same memory (AllReduce only).
    pub in_place: bool,
    /// AllToAllV counts.
    pub vcounts: Option<VCounts>,
    /// Pipeline chunks per block (at least 1); a tuned parameter.
    pub chunks: usize,
    /// The host of every rank, when the ranks span several hosts (used by
    /// [`Algorithm::Hierarchical`]).
    pub hosts: Option<std::sync::Arc<[usize]>>,
}

impl Problem {
    /// A problem with no AllToAllV counts, out of place, one chunk.
    pub fn new(coll: Collective, nranks: usize, rank: usize, count: usize) -> Self {
        Problem {
            coll,
            nranks,
            rank,
            count,
            in_place: false,
            vcounts: None,
            chunks: 1,
            hosts: None,
        }
    }
}

/// The algorithms tutti knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring: reduce-scatter + all-gather, pipelined chains.
    Ring,
    /// Binomial / binary trees.
    Tree,
    /// Two complementary binary trees, each carrying half the data.
    DoubleTree,
    /// Recursive halving and doubling (Rabenseifner).
    HalvingDoubling,
    /// One shot: every rank talks to every rank directly.
    Direct,
    /// Pairwise exchange, one peer at a time (AllToAll).
    Pairwise,
    /// Reduce-scatter then all-gather, both direct, reducing in rank order.
    TwoShot,
    /// Within hosts over shared memory, across hosts over the network.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::DoubleTree,
        Algorithm::HalvingDoubling,
        Algorithm::Direct,
        Algorithm::Pairwise,
        Algorithm::TwoShot,
        Algorithm::Hierarchical,
    ];

    /// The name used in `TUTTI_ALGO` and tables.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::DoubleTree => "double_tree",
            Algorithm::HalvingDoubling => "halving_doubling",
            Algorithm::Direct => "direct",
            Algorithm::Pairwise => "pairwise",
            Algorithm::TwoShot => "two_shot",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// Builds the schedule of `p` with this algorithm, or `None` if this
    /// algorithm does not implement that collective.
    pub fn build(self, p: &Problem) -> Option<Schedule> {
        let steps = match self {
            Algorithm::Ring => ring::build(p)?,
            Algorithm::Direct => direct::build(p)?,
            Algorithm::Tree => tree::build(p)?,
            Algorithm::DoubleTree => double_tree::build(p)?,
            Algorithm::HalvingDoubling => halving_doubling::build(p)?,
            Algorithm::Pairwise => pairwise::build(p)?,
            Algorithm::TwoShot => two_shot::build(p)?,
            Algorithm::Hierarchical => hierarchical::build(p)?,
        };
        Some(Schedule::new(p, steps))
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let l = s.to_ascii_lowercase().replace('-', "_");
        for a in Algorithm::ALL {
            if a.name() == l || a.name().replace('_', "") == l {
                return Ok(a);
            }
        }
        match l.as_str() {
            "doubletree" | "dtree" => Ok(Algorithm::DoubleTree),
            "hd" | "rabenseifner" | "recursive_doubling" => Ok(Algorithm::HalvingDoubling),
            "one_shot" | "oneshot" => Ok(Algorithm::Direct),
            "twoshot" | "rs_ag" => Ok(Algorithm::TwoShot),
            "hier" | "hierarchy" => Ok(Algorithm::Hierarchical),
            _ => Err(Error::arg(format!(
                "unknown algorithm '{s}'; valid: {}",
                Algorithm::ALL.map(|a| a.name()).join(", ")
            ))),
        }
    }
}

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
}

impl Schedule {
    /// Wraps steps, computing the scratch size and the dependencies.
    pub fn new(p: &Problem, steps: Vec<Step>) -> Self {
        let scratch = steps
            .iter()
            .flat_map(|s| s.reads().into_iter().chain(s.writes()))
            .filter(|(b, _)| *b == Buf::Scratch)
            .map(|(_, r)| r.end)
            .max()
            .unwrap_or(0);
        let deps = dependencies(&steps, p.in_place);
        Schedule {
            steps,
            deps,
            scratch,
        }
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

fn overlaps(a: &[(Buf, Range<usize>)], b: &[(Buf, Range<usize>)], in_place: bool) -> bool {
    let norm = |x: Buf| {
        if in_place && x == Buf::Input {
            Buf::Output
        } else {
            x
        }
    };
    a.iter().any(|(ba, ra)| {
        b.iter().any(|(bb, rb)| {
            norm(*ba) == norm(*bb) && ra.start < rb.end && rb.start < ra.end && !ra.is_empty()
        })
    })
}

/// For each step, the earlier steps it conflicts with: data hazards and
/// fences. Message order on each peer queue is kept by the executor itself,
/// not by dependencies (a fused step may receive while an earlier send to
/// its forward peer is still draining).
fn dependencies(steps: &[Step], in_place: bool) -> Vec<Vec<u32>> {
    let rw: Vec<_> = steps.iter().map(|s| (s.reads(), s.writes())).collect();
    let mut deps = Vec::with_capacity(steps.len());
    let mut last_fence: Option<usize> = None;
    for (i, s) in steps.iter().enumerate() {
        let mut d = Vec::new();
        if matches!(s, Step::Fence) {
            d.extend((last_fence.unwrap_or(0)..i).map(|j| j as u32));
            last_fence = Some(i);
            deps.push(d);
            continue;
        }
        let start = last_fence.unwrap_or(0);
        if let Some(f) = last_fence {
            d.push(f as u32);
        }
        let (ri, wi) = &rw[i];
        for (j, (rj, wj)) in rw.iter().enumerate().take(i).skip(start) {
            let hazard = overlaps(wi, rj, in_place)
                || overlaps(ri, wj, in_place)
                || overlaps(wi, wj, in_place);
            if hazard {
                d.push(j as u32);
            }
        }
        deps.push(d);
    }
    deps
}

/// Splits `count` elements into `parts` nearly equal blocks: the first
/// `count % parts` blocks get one element more. Returns the range of block `i`.
pub fn block(count: usize, parts: usize, i: usize) -> Range<usize> {
    let base = count / parts;
    let extra = count % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}
