//! What a link is: [`LinkOps`], the calls the executor, the mailboxes and
//! the point-to-point thread make on a connection to one peer, and
//! [`links!`](crate::transport::links), which turns the list of link types
//! in `transport/mod.rs` into the [`Link`](super::Link) enum.
//!
//! A transport's link type implements `LinkOps`: `send`, `recv`,
//! `announce_failure` and `kind` always; the rest only where its defaults
//! (a link that sleeps on the doorbell, has no descriptors to poll and no
//! way to tell what waits unread) do not fit. The enum dispatches with a
//! `match`, so a call through [`Link`](super::Link) costs what a direct
//! call does.

use super::wait;
use super::{RecvMsg, SendMsg, StepCx, TransportKind};
use crate::error::{Error, Result};

/// The calls every link answers. Neither `send` nor `recv` ever blocks.
pub(crate) trait LinkOps {
    /// Makes progress on an outgoing message; true when it is done.
    fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool>;

    /// Makes progress on an incoming message; true when it is done.
    fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool>;

    /// Tells the peer that this rank failed with `why` (a flag that says
    /// why, a closed socket).
    fn announce_failure(&self, why: &Error);

    /// The transport of this link.
    fn kind(&self) -> TransportKind;

    /// Called while waiting on this peer: lets the transport check that the
    /// peer is still there (TCP sends a probe after a silence).
    fn probe(&mut self, _cx: &StepCx) -> Result<()> {
        Ok(())
    }

    /// How the owner of this link sleeps until it may move.
    fn sleep(&self) -> wait::Sleep {
        wait::Sleep::Doorbell
    }

    /// Adds to `out` the descriptors (and events) to wait on while `send`
    /// (the head outgoing message, if started) and the head incoming
    /// message (`recv`: whether there is one) cannot move; none for a link
    /// that sleeps on the doorbell.
    fn pollfds(&self, _send: Option<&SendMsg>, _recv: bool, _out: &mut Vec<libc::pollfd>) {}

    /// True if a message from the peer has arrived that this side has not
    /// started on; false where only reading would tell (sockets).
    fn has_message(&self) -> bool {
        false
    }

    /// True if no unread byte from the peer is waiting; false where only
    /// reading would tell (sockets).
    fn inbound_empty(&self) -> bool {
        false
    }

    /// Whether the link delivers a message no further than its
    /// [`RecvMsg::limit`] (reduction chains run only over such links).
    fn honours_limit(&self) -> bool {
        false
    }

    /// Whether the link delivers a message shorter than its receive
    /// expects where the receive allows it ([`RecvMsg::var_len`]).
    fn takes_var_len(&self) -> bool {
        false
    }

    /// After a failed op: ensures the peer no longer reads `m`'s buffer.
    fn withdraw(&self, _m: &SendMsg, _peer_pid: Option<i32>) {}

    /// After a failed op: ensures no other thread still uses the op's
    /// buffers for this link.
    fn quiesce(&mut self) {}

    /// If the peer is known to have failed: why, as a
    /// [`failure`](super::shm::failure) code.
    fn peer_failed(&self) -> Option<u32> {
        None
    }

    /// Why the peer's host looks gone, where the link can tell (sockets
    /// whose bytes go unacknowledged).
    fn host_silent(&self) -> Option<String> {
        None
    }
}

/// Declares the [`Link`](super::Link) enum, one variant per link type, and
/// implements [`LinkOps`] on it by dispatching to the variant's type.
macro_rules! links {
    ($( $(#[$doc:meta])* $variant:ident($ty:ty), )+) => {
        /// A connection to one peer: one variant per transport's link type
        /// (the list in `transport/mod.rs`).
        pub(crate) enum Link {
            $( $(#[$doc])* $variant($ty), )+
        }

        impl $crate::transport::link::LinkOps for Link {
            #[inline]
            fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool> {
                match self { $( Link::$variant(l) => l.send(m, cx), )+ }
            }
            #[inline]
            fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
                match self { $( Link::$variant(l) => l.recv(m, cx), )+ }
            }
            fn announce_failure(&self, why: &$crate::error::Error) {
                match self { $( Link::$variant(l) => l.announce_failure(why), )+ }
            }
            fn kind(&self) -> TransportKind {
                match self { $( Link::$variant(l) => l.kind(), )+ }
            }
            fn probe(&mut self, cx: &StepCx) -> Result<()> {
                match self { $( Link::$variant(l) => l.probe(cx), )+ }
            }
            #[inline]
            fn sleep(&self) -> wait::Sleep {
                match self { $( Link::$variant(l) => l.sleep(), )+ }
            }
            fn pollfds(&self, send: Option<&SendMsg>, recv: bool, out: &mut Vec<libc::pollfd>) {
                match self { $( Link::$variant(l) => l.pollfds(send, recv, out), )+ }
            }
            #[inline]
            fn has_message(&self) -> bool {
                match self { $( Link::$variant(l) => l.has_message(), )+ }
            }
            fn inbound_empty(&self) -> bool {
                match self { $( Link::$variant(l) => l.inbound_empty(), )+ }
            }
            fn honours_limit(&self) -> bool {
                match self { $( Link::$variant(l) => l.honours_limit(), )+ }
            }
            fn takes_var_len(&self) -> bool {
                match self { $( Link::$variant(l) => l.takes_var_len(), )+ }
            }
            fn withdraw(&self, m: &SendMsg, peer_pid: Option<i32>) {
                match self { $( Link::$variant(l) => l.withdraw(m, peer_pid), )+ }
            }
            fn quiesce(&mut self) {
                match self { $( Link::$variant(l) => l.quiesce(), )+ }
            }
            fn peer_failed(&self) -> Option<u32> {
                match self { $( Link::$variant(l) => l.peer_failed(), )+ }
            }
            fn host_silent(&self) -> Option<String> {
                match self { $( Link::$variant(l) => l.host_silent(), )+ }
            }
        }
    };
}
pub(crate) use links;
