//! Choosing an algorithm per call, and the `TUTTI_ALGO` override.
//!
//! Every algorithm that implements a collective builds its schedules; the
//! [`cost`] model prices them under the communicator's topology and the
//! cheapest wins ([`choose_with`]). The decision is cached per call shape by
//! the engine, so the pricing runs once per shape, not once per call.

pub(crate) mod calibrate;
mod candidates;
pub mod cost;
pub mod fabric;
pub mod fabric_price;
pub mod online;
mod price;
mod select;
#[cfg(test)]
mod tests;

use crate::algo::Algorithm;
pub use crate::config::AlgoOverride;
pub(crate) use candidates::candidates;
pub(crate) use candidates::cma_direct_bytes;
pub use candidates::{BCAST_CMA_BYTES, CMA_TWIN_BYTES, STREAM_MIN_BYTES};
pub use cost::{CostModel, LinkClass, LinkCost};
pub use price::{
    best_chunks, choose, choose_with, rank_algorithms, rank_among, search_chunks, CHUNK_CHOICES,
    HIER_SLACK, STREAM_SLACK,
};
pub(crate) use select::select;

/// What the tuner knows about a communicator: how ranks are connected and
/// the cost-model parameters. The same on every rank, so every rank picks
/// the same algorithm.
#[derive(Clone, Debug)]
pub struct TuneCtx {
    /// Cost-model parameters.
    pub model: CostModel,
    /// Host index of every rank.
    pub host_of: Vec<usize>,
    /// Ranks are threads of one process.
    pub threads: bool,
    /// TCP is forced between all ranks.
    pub tcp_only: bool,
    /// Float reductions must not depend on the algorithm (`TUTTI_DETERMINISTIC=1`).
    pub deterministic: bool,
    /// The direct algorithm runs small calls through one-shot mailboxes
    /// (every rank on one host, over shared memory or as threads).
    pub mailbox: bool,
    /// The share of a core each rank gets on the most crowded host: 1.0
    /// where every rank has a core, cores / ranks where a host runs more
    /// ranks than this machine has cores. Below 1, a hand-off between
    /// ranks is priced at no less than `mailbox_us`, and every byte a rank
    /// moves or reduces at that share of the measured rates (not the
    /// mailboxes' own: those were measured with every rank at work).
    pub cpu_share: f64,
    /// Bytes of each shared-memory ring between two ranks
    /// ([`Config::ring_bytes`](crate::Config::ring_bytes)): where ranks
    /// share cores, a sender that fills the ring waits for its receiver to
    /// run, so a message costs a hand-off per ring's worth of bytes.
    pub ring_bytes: usize,
    /// Online tuning may try the pick with streaming ring stores
    /// ([`Choice::stream`]): some ranks share a host's rings and
    /// `TUTTI_SHM_STREAM` is `auto`.
    pub stream_trials: bool,
    /// Online tuning may try the pick with direct reads of large messages
    /// ([`Choice::cma`]): some ranks share a host, every such host's
    /// ranks can read each other's memory (`Host::cma`), and
    /// `TUTTI_SHM_DIRECT_BYTES` is unset.
    pub cma_trials: bool,
}

impl TuneCtx {
    /// The link class between ranks `a` and `b`.
    pub fn class(&self, a: usize, b: usize) -> LinkClass {
        if self.threads {
            LinkClass::Local
        } else if self.tcp_only || self.host_of.get(a) != self.host_of.get(b) {
            LinkClass::Tcp
        } else {
            LinkClass::Shm
        }
    }

    /// A context for `n` ranks on one host, with default parameters.
    pub fn single_host(n: usize) -> Self {
        TuneCtx {
            model: CostModel::default(),
            host_of: vec![0; n],
            threads: false,
            tcp_only: false,
            deterministic: false,
            mailbox: n > 1,
            cpu_share: 1.0,
            ring_bytes: crate::Config::default().ring_bytes,
            stream_trials: n > 1,
            cma_trials: false,
        }
    }

    /// The host layout to put in problems, when ranks span several hosts.
    pub fn hosts(&self) -> Option<std::sync::Arc<[usize]>> {
        let many_hosts = self.host_of.iter().any(|&h| h != self.host_of[0]);
        (many_hosts && !self.threads).then(|| self.host_of.clone().into())
    }
}

/// One priced candidate: an algorithm, how many pipeline chunks it cuts the
/// data into, and the cost model's predicted time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Pipeline chunks ([`Problem::chunks`](crate::algo::Problem::chunks)); 1 for algorithms without.
    pub chunks: usize,
    /// Predicted time in microseconds (NaN when nothing priced it).
    pub us: f64,
    /// Shared-memory sends write the rings (a one-shot call its mailbox
    /// slot) with non-temporal stores ([`STREAM_MIN_BYTES`]). The cost
    /// model never sets it: online tuning
    /// tries it beside the model's pick ([`online`]).
    pub stream: bool,
    /// Shared-memory messages of [`CMA_TWIN_BYTES`] or more (Broadcast:
    /// [`BCAST_CMA_BYTES`]) go direct:
    /// the receiver reads them from the sender's buffer
    /// (`process_vm_readv`, one copy) instead of through the ring. The
    /// cost model never sets it: online tuning tries it beside the model's
    /// pick where ranks share cores ([`CMA_TWIN_BYTES`], [`BCAST_CMA_BYTES`]).
    pub cma: bool,
}

impl Choice {
    /// How the choice's name marks a twin of an algorithm (as `tutti perf`
    /// and the debug log print it): `+stream` ([`Choice::stream`]), `+cma`
    /// ([`Choice::cma`]), or nothing.
    pub fn twin(&self) -> &'static str {
        match (self.stream, self.cma) {
            (true, _) => "+stream",
            (_, true) => "+cma",
            _ => "",
        }
    }
}
