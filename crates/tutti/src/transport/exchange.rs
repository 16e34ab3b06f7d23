//! [`Exchange`]: how the ranks being connected swap small messages during
//! set-up, as the transports' wiring (`connect.rs` in each folder) sees it.
//! The bootstrap implements it over the store; a split, over the parent
//! communicator.

use crate::error::Result;

/// A way for the ranks being connected to swap small messages: the store
/// (first set-up) or the parent communicator (split).
pub(crate) trait Exchange {
    /// Every participant contributes `mine`; returns all contributions in
    /// participant order. Every participant must call it the same number of times.
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Waits until every participant has arrived.
    fn barrier(&mut self) -> Result<()>;
}
