//! The eager path: a small message travels at once, without waiting for
//! its receive to be posted.
//!
//! ```text
//!   sender                                receiver
//!     | -- Eager {id, tag, len} + payload -->|  (straight into the receive
//!     |                                       |   that matches it, or kept
//!     |                                       |   until one does)
//!     | <-- Ack {id} -------------------------|  (matched and copied out)
//! ```
//!
//! A message of 1 to [`EAGER_BYTES`] bytes goes eager when the pair has
//! credit for it: each ordered pair of ranks has [`CREDIT_BYTES`] of it,
//! taken by every eager message sent and given back by its Ack, so a
//! receiver never keeps more than that of one sender's messages that no
//! receive has asked for. Without credit (many small messages sent before
//! any receive) a message goes by rendezvous ([`super::wire`]) instead;
//! both kinds travel in one ordered stream per pair and are matched in
//! arrival order, so a message never overtakes an earlier one of the same
//! (peer, tag), however each travels.
//!
//! The send completes as soon as its payload has left (written into the
//! ring or the socket), as MPI completes an eager send: the sender's buffer
//! is free again and nothing waits for the receiver. A receive that does
//! not fit (too small, or an exact receive of another length) fails at the
//! receiver, which answers `Refuse {id, aux = buffer bytes}` instead of the
//! Ack and drops the payload; the sender only takes its credit back (its
//! send has long completed, as MPI reports a truncation at the receiver
//! alone). A rendezvous send still fails on both sides.
//!
//! Nothing here can make a correct program hang: a message that finds no
//! credit waits for its receive, exactly as without the eager path, and
//! credit only comes back (it is never needed to make an Ack). Nor does an
//! eager send wait on anything once it is posted but its own link: a peer
//! that dies after the payload left is reported by the ops that still
//! involve it (a receive from it, a later send to it).

use super::peer::{drop_payload, Body, Dest, Inbound, Offer, Out};
use super::progress::State;
use super::wire::{Ctrl, Kind};
use crate::error::Result;
use crate::transport::RecvMsg;
use rustc_hash::FxHashMap;

/// The largest message that may travel eager (bytes).
pub(crate) const EAGER_BYTES: usize = 16 << 10;

/// Eager bytes in flight per ordered pair of ranks: sent, and not yet
/// matched and acknowledged by the receiver.
pub(crate) const CREDIT_BYTES: usize = 256 << 10;

/// A sender's eager messages to one peer that are not yet answered.
#[derive(Default)]
pub(super) struct Credit {
    /// Their bytes (at most [`CREDIT_BYTES`]).
    used: usize,
    /// Their lengths, by message id.
    unacked: FxHashMap<u64, usize>,
}

impl Credit {
    /// Takes credit for message `id` of `len` bytes, if the pair has
    /// enough.
    fn take(&mut self, id: u64, len: usize) -> bool {
        if self.used + len > CREDIT_BYTES {
            return false;
        }
        self.used += len;
        self.unacked.insert(id, len);
        true
    }

    /// Message `id` was answered: its credit comes back. False if it was
    /// not waiting for an answer.
    fn settle(&mut self, id: u64) -> bool {
        match self.unacked.remove(&id) {
            Some(len) => {
                self.used -= len;
                true
            }
            None => false,
        }
    }

    /// The link broke: all credit back (the sends completed already).
    pub fn drain(&mut self) {
        self.used = 0;
        self.unacked.clear();
    }
}

impl State {
    /// Sends `op` to `peer` eager if it is small and the pair has credit;
    /// false: it goes by rendezvous.
    pub(super) fn post_eager(&mut self, op: u64, peer: usize) -> bool {
        let o = self.ops.get_mut(&op).expect("posted");
        let (id, tag, len) = (o.id, o.post.tag, o.post.len);
        let p = &mut self.peers[peer];
        if len == 0 || len > EAGER_BYTES || !p.credit.take(id, len) {
            return false;
        }
        o.moving = true;
        let mut c = Ctrl::new(Kind::Eager, id);
        c.tag = tag;
        c.len = len as u64;
        p.outq.push_back(Out::Ctrl(Box::new(c.encode()), None));
        p.outq.push_back(Out::Eager(op));
        true
    }

    /// `q` acknowledged eager message `id`: its credit comes back. False
    /// if none was waiting.
    pub(super) fn eager_acked(&mut self, q: usize, id: u64) -> bool {
        self.peers[q].credit.settle(id)
    }

    /// `q` refused eager message `id` (its receive failed with the size
    /// mismatch): its credit comes back. False if none was waiting.
    pub(super) fn eager_refused(&mut self, q: usize, id: u64) -> bool {
        self.peers[q].credit.settle(id)
    }

    /// An eager message of `len` bytes from `q` begins: straight into the
    /// first posted receive that takes it, or kept aside.
    pub(super) fn eager_in(&mut self, q: usize, id: u64, tag: u32, len: usize) {
        let inbound = match self.take_posted(q, tag) {
            Some(op) => match self.check_fit(op, q, len) {
                Ok(()) => {
                    let o = self.ops.get_mut(&op).expect("posted");
                    o.moving = true;
                    let m = RecvMsg::new(o.post.ptr, None, len);
                    Inbound::Payload(m, Dest::EagerRecv(op, id), Vec::new())
                }
                Err(e) => {
                    self.refuse(q, id, op);
                    self.finish(op, Err(e));
                    drop_payload(len)
                }
            },
            None => {
                let mut v = vec![0u8; len];
                let m = RecvMsg::new(v.as_mut_ptr(), None, len);
                Inbound::Payload(m, Dest::Stash(id, tag), v)
            }
        };
        self.peers[q].inbound = Some(inbound);
    }

    /// Eager message `id` from `q`, kept aside, has arrived whole: it
    /// joins the messages waiting for a receive.
    pub(super) fn eager_arrived(&mut self, q: usize, id: u64, tag: u32, data: Vec<u8>) {
        let arrival = self.next_arrival();
        let offer = Offer {
            id,
            tag,
            len: data.len(),
            arrival,
            body: Body::Eager(data),
        };
        self.offer_in(q, offer);
    }

    /// Receive `op` matched eager message `id` from `q`, kept aside as
    /// `data`; `fit` says whether it fits.
    pub(super) fn eager_matched(
        &mut self,
        op: u64,
        q: usize,
        id: u64,
        data: &[u8],
        fit: Result<()>,
    ) {
        if let Err(e) = fit {
            self.refuse(q, id, op);
            return self.finish(op, Err(e));
        }
        let to = self.ops[&op].post.ptr;
        // SAFETY: the receive's buffer is valid for its length until the
        // op completes (the poster's promise), and `data` fits it (checked
        // by the caller); `data` is our own allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
        self.finish(op, Ok(()));
        self.send_ctrl(q, Ctrl::new(Kind::Ack, id));
    }

    /// Tells `q` that its message `id` does not fit receive `op`.
    fn refuse(&mut self, q: usize, id: u64, op: u64) {
        let mut c = Ctrl::new(Kind::Refuse, id);
        c.aux = self.ops[&op].post.len as u64;
        self.send_ctrl(q, c);
    }
}
