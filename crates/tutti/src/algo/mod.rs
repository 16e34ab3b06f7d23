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
//!
//! Everything a collective does to the data is in its schedule: besides
//! the algorithm's own steps, the [`frame`] every schedule of a collective
//! begins and ends with (the copy of this rank's data to its place in
//! Output; the division that finishes an Avg), so the verifier proves it
//! and the cost model prices it like any other step.

mod direct;
mod double_tree;
pub mod frame;
mod halving_doubling;
mod hierarchical;
mod pairwise;
mod problem;
mod ring;
mod schedule;
mod step;
mod tree;
mod two_shot;
pub mod verify;
pub mod wire;

#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
pub use problem::{CollKind, Collective, Problem, VCounts};
pub use schedule::Schedule;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
pub use step::{Buf, Loc, Step};
pub use wire::Wire;

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

    /// True for the algorithms that forward data as it arrives: every
    /// message a rank passes on is a fused step of a chain (the ring's
    /// `RecvReduceSend` / `RecvCopySend`), so no rank waits for a whole
    /// message from one peer before it sends to the next. Between hosts
    /// they keep each TCP stream busy through a late peer (the socket
    /// buffers absorb it), where a store-and-forward schedule
    /// (halving-doubling: a whole exchange with a new partner every round)
    /// leaves both partners' links idle; see
    /// [`STREAM_SLACK`](crate::tune::STREAM_SLACK).
    pub const fn streams(self) -> bool {
        matches!(self, Algorithm::Ring)
    }

    /// Builds the schedule of `p` with this algorithm, or `None` if this
    /// algorithm does not implement that collective.
    ///
    /// The schedule is the algorithm's steps framed by what the collective
    /// does to the data besides moving it ([`frame`]), and lowered to
    /// [`Problem::wire`] where that is set ([`wire`]; `None` for a
    /// collective that does not reduce).
    pub fn build(self, p: &Problem) -> Option<Schedule> {
        if p.wire.is_some() && !p.coll.reduces() {
            return None;
        }
        let steps = frame::frame(p, self.steps(p)?);
        Some(Schedule::new(p, wire::lower(p, steps)))
    }

    /// The algorithm's own steps for `p`, without the frame or dependencies
    /// (what a hierarchical level runs on its sub-problem).
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

/// Splits `count` elements into `parts` nearly equal blocks: the first
/// `count % parts` blocks get one element more. Returns the range of block `i`.
pub fn block(count: usize, parts: usize, i: usize) -> Range<usize> {
    let base = count / parts;
    let extra = count % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}
