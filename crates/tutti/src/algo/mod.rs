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

#[cfg(test)]
mod tests;

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

    /// Where the step writes (its `len` elements from there), if it writes.
    pub fn dst(&self) -> Option<Loc> {
        match *self {
            Step::Recv { dst, .. }
            | Step::RecvReduce { dst, .. }
            | Step::RecvReduceSend { dst, .. }
            | Step::RecvCopySend { dst, .. }
            | Step::Copy { dst, .. }
            | Step::Reduce { dst, .. } => Some(dst),
            Step::Send { .. } | Step::Fence => None,
        }
    }

    /// Ranges the step writes.
    pub fn writes(&self) -> Vec<(Buf, Range<usize>)> {
        self.dst()
            .map(|d| (d.buf, d.off..d.off + self.len()))
            .into_iter()
            .collect()
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
    /// Pipeline chunks per block (at least 1); a tuned parameter. The ring
    /// cuts large blocks into pieces by itself and takes this as a lower
    /// bound on their number (the tuner leaves it at 1 there).
    pub chunks: usize,
    /// The host of every rank, when the ranks span several hosts (used by
    /// [`Algorithm::Hierarchical`]; the flat algorithms ignore it).
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
    /// Within hosts over shared memory, across hosts over the network, with
    /// a flat algorithm chosen for each of the two [`Levels`].
    Hierarchical(Levels),
}

/// A flat algorithm that runs one level of [`Algorithm::Hierarchical`]:
/// among the ranks of one host (`intra`) or among the ranks with the same
/// local rank on every host (`inter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// [`Algorithm::Ring`].
    Ring,
    /// [`Algorithm::Tree`].
    Tree,
    /// [`Algorithm::HalvingDoubling`].
    HalvingDoubling,
    /// [`Algorithm::Direct`].
    Direct,
}

impl Level {
    /// Every level algorithm, in the order of [`Algorithm::ALL`].
    pub const ALL: [Level; 4] = [
        Level::Ring,
        Level::Tree,
        Level::HalvingDoubling,
        Level::Direct,
    ];

    /// The flat algorithm this level runs.
    pub const fn algorithm(self) -> Algorithm {
        match self {
            Level::Ring => Algorithm::Ring,
            Level::Tree => Algorithm::Tree,
            Level::HalvingDoubling => Algorithm::HalvingDoubling,
            Level::Direct => Algorithm::Direct,
        }
    }

    /// The name, as the flat algorithm's (`ring`, `halving_doubling`, ...).
    pub const fn name(self) -> &'static str {
        self.algorithm().name()
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Level {
    type Err = Error;
    /// A flat algorithm's name or alias (`hd`, `one_shot`, ...) that can run a level.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::arg(format!(
                "unknown level algorithm '{s}'; valid: {}",
                Level::ALL.map(Level::name).join(", ")
            ))
        };
        let a: Algorithm = s.parse().map_err(|_| bad())?;
        Level::ALL
            .into_iter()
            .find(|l| l.algorithm() == a)
            .ok_or_else(bad)
    }
}

/// The per-level choice of [`Algorithm::Hierarchical`]: which flat
/// algorithm runs within hosts and which across them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Levels {
    /// Among the ranks of one host (a row of the grid).
    pub intra: Level,
    /// Among the ranks with the same local rank on every host (a column).
    pub inter: Level,
}

impl Levels {
    /// Rings at both levels: plain `hierarchical`.
    pub const DEFAULT: Levels = Levels {
        intra: Level::Ring,
        inter: Level::Ring,
    };

    /// Every combination, [`Levels::DEFAULT`] first.
    pub const ALL: [Levels; 16] = {
        let mut v = [Levels::DEFAULT; 16];
        let mut i = 0;
        while i < 16 {
            v[i] = Levels {
                intra: Level::ALL[i / 4],
                inter: Level::ALL[i % 4],
            };
            i += 1;
        }
        v
    };

    /// The algorithm's name with these levels: `hierarchical`, then
    /// `(intra=..,inter=..)` listing the levels that are not rings.
    pub const fn name(self) -> &'static str {
        HIERARCHICAL_NAMES[self.intra as usize][self.inter as usize]
    }
}

impl Default for Levels {
    fn default() -> Self {
        Levels::DEFAULT
    }
}

/// [`Levels::name`], indexed by `[intra][inter]` in the order of [`Level::ALL`].
const HIERARCHICAL_NAMES: [[&str; 4]; 4] = [
    [
        "hierarchical",
        "hierarchical(inter=tree)",
        "hierarchical(inter=halving_doubling)",
        "hierarchical(inter=direct)",
    ],
    [
        "hierarchical(intra=tree)",
        "hierarchical(intra=tree,inter=tree)",
        "hierarchical(intra=tree,inter=halving_doubling)",
        "hierarchical(intra=tree,inter=direct)",
    ],
    [
        "hierarchical(intra=halving_doubling)",
        "hierarchical(intra=halving_doubling,inter=tree)",
        "hierarchical(intra=halving_doubling,inter=halving_doubling)",
        "hierarchical(intra=halving_doubling,inter=direct)",
    ],
    [
        "hierarchical(intra=direct)",
        "hierarchical(intra=direct,inter=tree)",
        "hierarchical(intra=direct,inter=halving_doubling)",
        "hierarchical(intra=direct,inter=direct)",
    ],
];

impl FromStr for Levels {
    type Err = Error;
    /// `intra=A,inter=B` (either may be left out: a ring), the text between
    /// the parentheses of `hierarchical(...)`.
    fn from_str(s: &str) -> Result<Self> {
        let mut l = Levels::DEFAULT;
        let mut seen = [false; 2];
        for part in s.split(',').map(str::trim) {
            if part.is_empty() {
                continue;
            }
            let Some((k, v)) = part.split_once('=') else {
                return Err(Error::arg(format!(
                    "hierarchical level '{part}' is not key=algorithm; valid keys: intra, inter"
                )));
            };
            let i = match k.trim().to_ascii_lowercase().as_str() {
                "intra" => 0,
                "inter" => 1,
                other => {
                    return Err(Error::arg(format!(
                        "unknown hierarchical level '{other}'; valid: intra, inter"
                    )))
                }
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(Error::arg(format!(
                    "hierarchical level '{}' given twice",
                    k.trim()
                )));
            }
            let v: Level = v.trim().parse()?;
            if i == 0 {
                l.intra = v;
            } else {
                l.inter = v;
            }
        }
        Ok(l)
    }
}

impl Algorithm {
    /// Every algorithm, hierarchical with its default levels: one entry per
    /// file of `algo/`.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::DoubleTree,
        Algorithm::HalvingDoubling,
        Algorithm::Direct,
        Algorithm::Pairwise,
        Algorithm::TwoShot,
        Algorithm::Hierarchical(Levels::DEFAULT),
    ];

    /// Every algorithm with every hierarchical level choice
    /// ([`Levels::ALL`]): what the tuner prices.
    pub const VARIANTS: [Algorithm; 23] = {
        let mut v = [Algorithm::Ring; 23];
        let mut i = 0;
        while i < 7 {
            v[i] = Algorithm::ALL[i];
            i += 1;
        }
        while i < 23 {
            v[i] = Algorithm::Hierarchical(Levels::ALL[i - 7]);
            i += 1;
        }
        v
    };

    /// The name used in `TUTTI_ALGO` and tables; [`FromStr`] parses it back.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::DoubleTree => "double_tree",
            Algorithm::HalvingDoubling => "halving_doubling",
            Algorithm::Direct => "direct",
            Algorithm::Pairwise => "pairwise",
            Algorithm::TwoShot => "two_shot",
            Algorithm::Hierarchical(l) => l.name(),
        }
    }

    /// True for [`Algorithm::Hierarchical`] with any levels.
    pub const fn is_hierarchical(self) -> bool {
        matches!(self, Algorithm::Hierarchical(_))
    }

    /// Builds the schedule of `p` with this algorithm, or `None` if this
    /// algorithm does not implement that collective.
    pub fn build(self, p: &Problem) -> Option<Schedule> {
        let steps = self.steps(p)?;
        Some(Schedule::new(p, steps))
    }

    /// The steps of `p`'s schedule, without dependencies.
    fn steps(self, p: &Problem) -> Option<Vec<Step>> {
        match self {
            Algorithm::Ring => ring::build(p),
            Algorithm::Direct => direct::build(p),
            Algorithm::Tree => tree::build(p),
            Algorithm::DoubleTree => double_tree::build(p),
            Algorithm::HalvingDoubling => halving_doubling::build(p),
            Algorithm::Pairwise => pairwise::build(p),
            Algorithm::TwoShot => two_shot::build(p),
            Algorithm::Hierarchical(l) => hierarchical::build(p, l),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    /// A name or alias; hierarchical also as `hierarchical(intra=A,inter=B)`
    /// (see [`Levels`]).
    fn from_str(s: &str) -> Result<Self> {
        let l = s.trim().to_ascii_lowercase().replace('-', "_");
        if let Some(open) = l.find('(') {
            let (base, rest) = l.split_at(open);
            let Some(args) = rest[1..].strip_suffix(')') else {
                return Err(Error::arg(format!(
                    "algorithm '{s}': levels must end with ')'"
                )));
            };
            if args.contains(['(', ')']) {
                return Err(Error::arg(format!("algorithm '{s}': nested parentheses")));
            }
            return match base.trim().parse::<Algorithm>()? {
                Algorithm::Hierarchical(_) => Ok(Algorithm::Hierarchical(args.parse()?)),
                a => Err(Error::arg(format!(
                    "algorithm '{s}': only hierarchical takes levels, not {a}"
                ))),
            };
        }
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
            "hier" | "hierarchy" => Ok(Algorithm::Hierarchical(Levels::DEFAULT)),
            _ => Err(Error::arg(format!(
                "unknown algorithm '{s}'; valid: {}, hierarchical(intra=A,inter=B)",
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
    /// For each step, whether a later step of this rank reads what it
    /// writes (a receive whose bytes are forwarded or reduced again): the
    /// executor keeps such bytes in the cache rather than stream them to
    /// memory.
    pub read_back: Vec<bool>,
    /// For each step, the length of the reduction chain it heads (0 where
    /// it heads none): see [`reduce_chain`](Schedule::reduce_chain).
    pub chains: Vec<u32>,
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
        let read_back = read_back(&steps, p.in_place);
        let chains = reduce_chains(&steps, p.in_place);
        Schedule {
            steps,
            deps,
            scratch,
            read_back,
            chains,
        }
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

/// For each step, whether a later step reads a range it writes (fences
/// do not matter here: the bytes are read again either way).
fn read_back(steps: &[Step], in_place: bool) -> Vec<bool> {
    let rw: Vec<_> = steps.iter().map(|s| (s.reads(), s.writes())).collect();
    (0..steps.len())
        .map(|j| {
            let wj = &rw[j].1;
            !wj.is_empty() && rw[j + 1..].iter().any(|(ri, _)| overlaps(ri, wj, in_place))
        })
        .collect()
}

/// The reduction chains of a schedule ([`Schedule::reduce_chain`]): for
/// each step, the length of the chain it heads, or 0.
fn reduce_chains(steps: &[Step], in_place: bool) -> Vec<u32> {
    let mut out = vec![0u32; steps.len()];
    let norm = |l: Loc| {
        if in_place && l.buf == Buf::Input {
            Loc {
                buf: Buf::Output,
                ..l
            }
        } else {
            l
        }
    };
    let apart = |a: Loc, b: Loc, len: usize| {
        let range = |l: Loc| [(l.buf, l.off..l.off + len)];
        !overlaps(&range(a), &range(b), in_place)
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

/// Splits `count` elements into `parts` nearly equal blocks: the first
/// `count % parts` blocks get one element more. Returns the range of block `i`.
pub fn block(count: usize, parts: usize, i: usize) -> Range<usize> {
    let base = count / parts;
    let extra = count % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}
