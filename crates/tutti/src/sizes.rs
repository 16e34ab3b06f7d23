//! Byte counts that several layers agree on: what a rank contributes to a
//! one-shot (mailbox) call. The engine runs a call through the mailboxes
//! when its contribution fits a slot, and the cost model prices it so
//! (`tune::cost::predict_mailbox`): both read it here. Pure arithmetic
//! over [`Collective`]s.

use crate::algo::Collective;

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
