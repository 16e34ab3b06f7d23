//! tutti: collective communication for CPU processes on one host or many.
//!
//! What NCCL is to NVIDIA GPUs, tutti is to CPU processes: AllReduce,
//! Broadcast, Reduce, AllGather, ReduceScatter, AllToAll(V), Gather,
//! Scatter, Barrier and Send/Recv, over shared memory within a host and TCP
//! across hosts, with algorithms (ring, trees, halving-doubling, direct)
//! chosen per call.
//!
//! The architecture (see `docs/architecture.md`): an algorithm is a pure
//! [`algo::Schedule`] that the executor runs, the verifier checks and the
//! cost model prices. Data flows one way: [`Communicator`] -> engine ->
//! (tune picks) algo schedule -> executor -> transport.
//!
//! ```
//! use tutti::{Communicator, ReduceOp};
//!
//! let comms = Communicator::init_all(2)?;
//! std::thread::scope(|s| {
//!     for c in &comms {
//!         s.spawn(move || {
//!             let mut x = [1.0f32, 2.0, 3.0];
//!             c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
//!             assert_eq!(x, [2.0, 4.0, 6.0]);
//!         });
//!     }
//! });
//! # Ok::<(), tutti::Error>(())
//! ```
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod algo;
pub mod bootstrap;
mod comm;
pub mod config;
mod engine;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod p2p;
pub mod reduce;
mod sizes;
pub mod topo;
pub(crate) mod transport;
pub mod tune;

pub use algo::{Algorithm, CollKind, Collective};
pub use bootstrap::{EnvInfo, UniqueId};
pub use comm::{
    sum_pair_blocks, BucketOptions, Communicator, FusionOptions, GradSync, ManyWork, Options,
    P2pHandle, P2pOp, RawCall, RawP2p, Received, SparseRoute, TopK, Work, DEFAULT_BUCKET_BYTES,
};
pub use config::Config;
pub use engine::explain;
pub use engine::recorder::{self as trace};
pub use error::{Error, Result};
pub use p2p::{RecvStatus, EAGER_BYTES};
pub use reduce::{DataType, Element, ReduceOp};
pub use transport::TransportKind;
