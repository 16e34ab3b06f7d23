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
//! The send completes on the Ack, as a rendezvous send completes once its
//! receive has taken it: so a receive that does not fit (too small, or an
//! exact receive of another length) fails both sides here too, the receiver
//! answering `Refuse {id, aux = buffer bytes}` instead and dropping the
//! payload. A send whose deadline runs out while its message waits at the
//! receiver says `Cancel {id}`: the receiver drops the message unmatched
//! and acknowledges, giving the credit back.
//!
//! Nothing here can make a correct program hang: a message that finds no
//! credit waits for its receive, exactly as without the eager path, and
//! credit only comes back (it is never needed to make an Ack).

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

/// A sender's eager messages to one peer that are not yet acknowledged.
#[derive(Default)]
pub(super) struct Credit {
    /// Their bytes (at most [`CREDIT_BYTES`]).
    used: usize,
    /// By message id: the send (`None`: it gave up) and the length.
    unacked: FxHashMap<u64, (Option<u64>, usize)>,
}

impl Credit {
    /// Whether any eager message waits for its Ack.
    pub fn outstanding(&self) -> bool {
        !self.unacked.is_empty()
    }

    /// Takes credit for message `id` of send `op`, `len` bytes, if the
    /// pair has enough.
    fn take(&mut self, id: u64, op: u64, len: usize) -> bool {
        if self.used + len > CREDIT_BYTES {
            return false;
        }
        self.used += len;
        self.unacked.insert(id, (Some(op), len));
        true
    }

    /// Message `id` was answered: its credit comes back. `None` if it was
    /// not waiting; else its send, if that still waits.
    fn settle(&mut self, id: u64) -> Option<Option<u64>> {
        let (op, len) = self.unacked.remove(&id)?;
        self.used -= len;
        Some(op)
    }

    /// The send of message `id` gave up; true if the message was eager
    /// (and still holds credit, until the receiver answers).
    pub fn forget(&mut self, id: u64) -> bool {
        match self.unacked.get_mut(&id) {
            Some(e) => {
                e.0 = None;
                true
            }
            None => false,
        }
    }

    /// The link broke: the sends still waiting, and all credit back.
    pub fn drain(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.used = 0;
        self.unacked.drain().filter_map(|(_, (op, _))| op)
    }
}

impl State {
    /// Sends `op` to `peer` eager if it is small and the pair has credit;
    /// false: it goes by rendezvous.
    pub(super) fn post_eager(&mut self, op: u64, peer: usize) -> bool {
        let o = self.ops.get_mut(&op).expect("posted");
        let (id, tag, len) = (o.id, o.post.tag, o.post.len);
        let p = &mut self.peers[peer];
        if len == 0 || len > EAGER_BYTES || !p.credit.take(id, op, len) {
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

    /// Eager send `op`'s payload has left: the send completes with the
    /// receiver's answer, now if it came already.
    pub(super) fn eager_left(&mut self, op: u64) {
        let Some(o) = self.ops.get_mut(&op) else {
            return;
        };
        o.moving = false;
        if let Some(r) = o.answer.take() {
            self.finish(op, r);
        }
    }

    /// Completes eager send `op` with the receiver's answer `r` (once its
    /// payload has left).
    fn eager_answer(&mut self, op: u64, r: Result<()>) {
        match self.ops.get_mut(&op) {
            Some(o) if o.moving => o.answer = Some(r),
            Some(_) => self.finish(op, r),
            None => {}
        }
    }

    /// `q` acknowledged eager message `id`; false if none was waiting.
    pub(super) fn eager_acked(&mut self, q: usize, id: u64) -> bool {
        match self.peers[q].credit.settle(id) {
            None => false,
            Some(None) => true,
            Some(Some(op)) => {
                self.eager_answer(op, Ok(()));
                true
            }
        }
    }

    /// `q` refused eager message `id`: its receive holds `buffer` bytes,
    /// which the message does not fit.
    pub(super) fn eager_refused(&mut self, q: usize, id: u64, buffer: usize) {
        if let Some(Some(op)) = self.peers[q].credit.settle(id) {
            let e = self.size_mismatch(op, q, buffer);
            self.eager_answer(op, Err(e));
        }
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

    /// `q` gave up its eager message `id`: dropped unmatched (with its
    /// credit given back), unless a receive took it already.
    pub(super) fn eager_cancelled(&mut self, q: usize, id: u64) {
        let p = &mut self.peers[q];
        let i = p
            .offers
            .iter()
            .position(|o| o.id == id && matches!(o.body, Body::Eager(_)));
        if let Some(i) = i {
            p.offers.remove(i);
            self.send_ctrl(q, Ctrl::new(Kind::Ack, id));
        }
    }
}
