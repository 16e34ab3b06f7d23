//! Typed errors. Every message says what went wrong, on which rank and op,
//! and what to change.

use std::time::Duration;

/// The result type of every fallible tutti call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tutti.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is wrong: a length, a root, a peer, a count.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The environment or configuration is wrong or incomplete.
    #[error("configuration error: {0}")]
    Config(String),

    /// Setting up the communicator failed (rendezvous, connections, shared memory).
    #[error("bootstrap failed on rank {rank}: {msg}")]
    Bootstrap {
        /// This process's rank.
        rank: usize,
        /// What failed.
        msg: String,
    },

    /// An operation did not finish within its deadline.
    #[error("timeout after {after:?} in {op} (seq {seq}) on rank {rank}: still waiting for rank(s) {waiting_for:?}. Raise TUTTI_TIMEOUT if the job is just slow; otherwise those ranks are stuck or did not call {op}")]
    Timeout {
        /// The collective that timed out.
        op: String,
        /// Its sequence number on this communicator.
        seq: u64,
        /// This process's rank.
        rank: usize,
        /// Ranks this rank was still waiting on.
        waiting_for: Vec<usize>,
        /// The deadline that ran out.
        after: Duration,
    },

    /// A peer died or its connection broke.
    #[error("rank {rank} lost peer rank {peer} during {op} (seq {seq}): {msg}")]
    PeerLost {
        /// This process's rank.
        rank: usize,
        /// The peer that is gone.
        peer: usize,
        /// The op in progress.
        op: String,
        /// Its sequence number.
        seq: u64,
        /// Details (process gone, connection reset, ...).
        msg: String,
    },

    /// Two ranks called different collectives, or the same one with different arguments.
    #[error("collective mismatch on rank {rank} with peer {peer} at seq {seq}: {msg}")]
    Mismatch {
        /// This process's rank.
        rank: usize,
        /// The peer whose message did not match.
        peer: usize,
        /// Sequence number of the op on this rank.
        seq: u64,
        /// What differed.
        msg: String,
    },

    /// A point-to-point message and the receive that matched it differ in
    /// size (the message is longer than the buffer, or a receive that must
    /// be filled exactly got another length). The receive gets this error,
    /// and so does the send of a rendezvous message (over 16 KiB; an eager
    /// send has completed once it left, as in MPI); nothing was
    /// transferred, and the communicator stays usable.
    #[error("point-to-point size mismatch between rank {rank} (this process) and rank {peer}, tag {tag}: the message holds {message} bytes, the receive buffer {buffer} bytes; nothing was transferred")]
    SizeMismatch {
        /// This process's rank.
        rank: usize,
        /// The other side.
        peer: usize,
        /// The message's tag.
        tag: u32,
        /// The message's bytes.
        message: usize,
        /// The receive buffer's bytes.
        buffer: usize,
    },

    /// The communicator was aborted.
    #[error("communicator aborted")]
    Aborted,

    /// A bug in tutti: an op panicked. The communicator is unusable (every
    /// later op returns this error, and its peers were told); destroy it.
    #[error("internal error: {0}")]
    Internal(String),

    /// An operating-system call failed.
    #[error("{ctx}: {err}")]
    Io {
        /// What tutti was doing.
        ctx: String,
        /// The OS error, as text (so that errors can be cloned and shared).
        err: String,
    },
}

impl Error {
    /// Wraps an `std::io::Error` with context.
    pub(crate) fn io(ctx: impl Into<String>, err: std::io::Error) -> Self {
        Error::Io {
            ctx: ctx.into(),
            err: err.to_string(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub(crate) fn arg(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}
