//! Byte counts that several layers agree on: a TCP link's frame and lane
//! limits (the transport cuts frames by them, `Config` checks settings
//! against them), and what a rank contributes to a one-shot (mailbox) call. The engine runs a call through the mailboxes
//! when its contribution fits a slot, and the cost model prices it so
//! (`tune::cost::predict_mailbox`): both read it here. Pure arithmetic
//! over [`Collective`]s.

use crate::algo::Collective;

/// The most sockets a TCP link may have (`TUTTI_TCP_SOCKETS`' ceiling).
pub(crate) const TCP_MAX_LANES: usize = 8;

/// A TCP link's frames are at most this long when it has several lanes
/// (`Config::tcp_chunk`'s default).
pub(crate) const TCP_DEFAULT_CHUNK: usize = 256 << 10;

/// Bytes a rank contributes to `coll` with `bytes` per block on `n` ranks
/// (what its slot must hold), or `None` for calls mailboxes do not carry.
#[inline]
pub(crate) fn contribution(coll: Collective, n: usize, bytes: usize) -> Option<usize> {
    match coll {
        Collective::AllReduce
        | Collective::Reduce { .. }
        | Collective::Broadcast { .. }
        | Collective::AllGather
        | Collective::Gather { .. } => Some(bytes),
        Collective::ReduceScatter | Collective::AllToAll | Collective::Scatter { .. } => {
            bytes.checked_mul(n)
        }
        Collective::Barrier => Some(0),
        Collective::AllToAllV | Collective::Send { .. } | Collective::Recv { .. } => None,
    }
}
