//! What a schedule is built for: the collectives, their kinds and the
//! [`Problem`] an algorithm takes.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

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

    /// The collective of this kind with `root` (ignored where it has none),
    /// or `None` for [`CollKind::SendRecv`], which is two operations.
    pub const fn with_root(self, root: usize) -> Option<Collective> {
        Some(match self {
            CollKind::AllReduce => Collective::AllReduce,
            CollKind::Broadcast => Collective::Broadcast { root },
            CollKind::Reduce => Collective::Reduce { root },
            CollKind::AllGather => Collective::AllGather,
            CollKind::ReduceScatter => Collective::ReduceScatter,
            CollKind::AllToAll => Collective::AllToAll,
            CollKind::Gather => Collective::Gather { root },
            CollKind::Scatter => Collective::Scatter { root },
            CollKind::Barrier => Collective::Barrier,
            CollKind::SendRecv => return None,
        })
    }

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

    /// True for the collectives that reduce (AllReduce, Reduce, ReduceScatter).
    pub const fn reduces(&self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::Reduce { .. } | Collective::ReduceScatter
        )
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
/// | collective | Input | Output | `in_place`: Input is |
/// |---|---|---|---|
/// | AllReduce | c | c | Output |
/// | Broadcast | c on the root (its data), else – | c | Output (the root's data is there) |
/// | Reduce | c | c, on the root only | – |
/// | AllGather | c (this rank's block) | n*c | Output's block `rank*c..` |
/// | ReduceScatter | n*c | c | – |
/// | AllToAll | n*c | n*c | – |
/// | AllToAllV | per [`VCounts`] | per [`VCounts`] | – |
/// | Gather | c | n*c, on the root only | – |
/// | Scatter | n*c, on the root only | c | – |
/// | Send / Recv | c / – | – / c | – |
///
/// Everything the collective does to the data is in the schedule
/// ([`frame`](super::frame)): out of place, AllGather's schedule starts by
/// copying this rank's block to its place in Output, and Broadcast's, on
/// the root, by copying Input to Output (in place, that data is already
/// there); an Avg reduction's ends by dividing the result by the rank count.
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
    /// Input already lies in Output, where the last column of the table
    /// above says: for AllReduce and Broadcast they are the same memory,
    /// for AllGather Input is this rank's block of Output (the other
    /// collectives do not run in place; set, it makes Input the start of
    /// Output). Whether a rank runs in place is its own affair: the tuner
    /// prices every call out of place.
    pub in_place: bool,
    /// The reduction is Avg: it reduces as Sum, and the schedule ends by
    /// dividing the result by the rank count on the ranks that hold one
    /// ([`frame`](super::frame)). Only for the collectives that
    /// [reduce](Collective::reduces); ignored for the others.
    pub avg: bool,
    /// AllToAllV counts.
    pub vcounts: Option<VCounts>,
    /// Pipeline chunks per block (at least 1); a tuned parameter. The ring
    /// cuts large blocks into pieces by itself and takes this as a lower
    /// bound on their number (the tuner leaves it at 1 there).
    pub chunks: usize,
    /// The host of every rank, when the ranks span several hosts (used by
    /// [`Algorithm::Hierarchical`](super::Algorithm::Hierarchical); the flat algorithms ignore it).
    pub hosts: Option<std::sync::Arc<[usize]>>,
    /// The 16-bit type the data travels as, for a Sum (or Avg) reduction
    /// of f32 ([`wire`](super::wire)): [`Algorithm::build`](super::Algorithm::build)
    /// lowers the schedule to it. Only for the collectives that
    /// [reduce](Collective::reduces).
    pub wire: Option<super::Wire>,
}

impl Problem {
    /// A problem with no AllToAllV counts, out of place, not Avg, one chunk.
    pub fn new(coll: Collective, nranks: usize, rank: usize, count: usize) -> Self {
        Problem {
            coll,
            nranks,
            rank,
            count,
            in_place: false,
            avg: false,
            vcounts: None,
            chunks: 1,
            hosts: None,
            wire: None,
        }
    }

    /// Where Input lies in Output (an element offset) when the op runs in
    /// place, per [`Problem::in_place`]; `None` when they are apart.
    pub fn input_in_output(&self) -> Option<usize> {
        match self.coll {
            _ if !self.in_place => None,
            Collective::AllGather => Some(self.rank * self.count),
            _ => Some(0),
        }
    }
}
