//! The eager path: a small message travels at once, without waiting for
//! its receive to be posted.
//!
//! ```text
//!   sender                                receiver
//!     | -- Eager {id, tag, len} + payload -->|  (straight into the receive
//!     |                                       |   that matches it, or kept
//!     |                                       |   until one does)
//!     | <-- Ack {len} ------------------------|  (once per ACK_BYTES taken)
//! ```
//!
//! A message of 1 to [`EAGER_BYTES`] bytes goes eager when the pair has
//! credit for it: each ordered pair of ranks has [`CREDIT_BYTES`] of it,
//! taken by every eager message sent and given back once a receive has
//! taken the message, so a receiver never keeps more than that of one
//! sender's messages that no receive has asked for. Without credit (many
//! small messages sent before any receive) a message goes by rendezvous
//! ([`super::wire`]) instead; both kinds travel in one ordered stream per
//! pair and are matched in arrival order, so a message never overtakes an
//! earlier one of the same (peer, tag), however each travels.
//!
//! The receiver gives credit back in bulk: it counts the eager bytes its
//! receives took from each peer (or refused), and says `Ack {len}` once
//! they reach [`ACK_BYTES`], a quarter of the credit. One answer per
//! message made every small exchange three ring messages each way
//! instead of two (and a fence and a cache-line round trip more). The
//! sender therefore always has at least three quarters of its credit
//! free for messages its receiver has taken.
//!
//! A message of at most [`INLINE_BYTES`] (rings) or
//! [`SOCKET_INLINE_BYTES`] (sockets) goes *inline*: its `Eager` frame and
//! payload are one transport message (the receiver's next frame receive
//! takes it whole, learning its length from the transport's header), so
//! the smallest exchanges cost one header, one publication (or write) and
//! one wake-up check (or read) each way instead of two. The payload is
//! copied through a buffer on each side, which on the rings pays only at
//! small sizes, and over a socket always (a second message costs a system
//! call on each side); a larger eager message follows its frame as a
//! message of its own, straight into the receive's buffer where one is
//! posted.
//!
//! The send completes as soon as its payload has left (written into the
//! ring or the socket), as MPI completes an eager send: the sender's buffer
//! is free again and nothing waits for the receiver. A receive that does
//! not fit (too small, or an exact receive of another length) fails at the
//! receiver alone, which drops the payload (and counts its credit as
//! taken): the send has long completed, as MPI reports a truncation at the
//! receiver alone. A rendezvous send still fails on both sides.
//!
//! Nothing here can make a correct program hang: a message that finds no
//! credit waits for its receive, exactly as without the eager path, and
//! credit only comes back (it is never needed to make an Ack). Nor does an
//! eager send wait on anything once it is posted but its own link: a peer
//! that dies after the payload left is reported by the ops that still
//! involve it (a receive from it, a later send to it).

use super::peer::{drop_payload, Body, Dest, Inbound, Offer, Out, Peer};
use super::progress::State;
use super::wire::{Ctrl, Kind};
use crate::error::Result;
use crate::transport::RecvMsg;

/// The largest message that may travel eager (bytes): smaller ones leave at
/// once (within the pair's credit), larger ones by rendezvous.
///
/// 128 KiB: up to there, copying through the ring (or the socket) costs
/// less than rendezvous's round trip before the payload moves. 2 ranks on
/// shared memory, `tutti perf send_recv`, 16 KiB against 128 KiB as the
/// limit: 32 KiB exchanges took 2.6-3.1 us instead of 6.6-6.8, 64 KiB
/// 4.7-5.9 instead of 9.2-9.7, 128 KiB 9.7 instead of 15-18; over TCP on
/// loopback 32 KiB 22 us instead of 32 (`docs/performance.md`, "Send/Recv:
/// eager up to 128 KiB").
pub const EAGER_BYTES: usize = 128 << 10;

/// The largest eager message whose `Eager` frame and payload travel as one
/// transport message through the shared-memory rings: one header, one
/// publication and one wake-up check each way instead of two, for a copy
/// of the payload through a buffer on each side.
pub(crate) const INLINE_BYTES: usize = 1 << 10;

/// [`INLINE_BYTES`] over a socket: every eager message. A second socket
/// message costs a system call on each side and often a second wake-up
/// of the receiver, far more than the copy through a buffer on each side.
/// 2 ranks on loopback, `tutti perf send_recv` with 16 KiB against 128
/// KiB as the limit, 5 rounds (paired, 128 KiB over 16 KiB): 16 KiB
/// 0.76, 32 KiB 0.79, 64 KiB 0.81, 128 KiB 0.73. The receiving buffer
/// this takes per peer (`Peer::ctrl_in`) is allocated zeroed, which the
/// allocator maps fresh at this size: its pages cost memory only once a
/// message that long has come.
pub(crate) const SOCKET_INLINE_BYTES: usize = EAGER_BYTES;

/// Eager bytes in flight per ordered pair of ranks: sent, and not yet
/// given back by the receiver.
pub(crate) const CREDIT_BYTES: usize = 256 << 10;

/// Eager bytes a receiver takes from one sender before it gives their
/// credit back (in one `Ack`).
pub(crate) const ACK_BYTES: usize = CREDIT_BYTES / 4;

/// A sender's eager bytes to one peer that are not yet given back, and
/// the eager bytes received from it that are not yet given back to it.
#[derive(Default)]
pub(super) struct Credit {
    /// Sent (at most [`CREDIT_BYTES`]).
    used: usize,
    /// Received and taken (or refused) by receives, not yet acknowledged
    /// (less than [`ACK_BYTES`] between rounds).
    owed: usize,
    /// The peer is closing (it said `Flush`): acknowledge every message.
    flush: bool,
    /// We asked the peer to `Flush`.
    asked: bool,
}

impl Credit {
    /// Takes credit for a message of `len` bytes, if the pair has enough.
    pub fn take(&mut self, len: usize) -> bool {
        if !self.has(len) {
            return false;
        }
        self.used += len;
        true
    }

    /// The receiver gave `len` bytes back; false if we did not send that
    /// many.
    fn settle(&mut self, len: u64) -> bool {
        match usize::try_from(len) {
            Ok(len) if len <= self.used => {
                self.used -= len;
                true
            }
            _ => false,
        }
    }

    /// Whether the pair has credit for `len` bytes.
    pub fn has(&self, len: usize) -> bool {
        self.used + len <= CREDIT_BYTES
    }

    /// Whether eager bytes sent to the peer are not yet given back.
    pub fn outstanding(&self) -> bool {
        self.used > 0
    }

    /// The link broke: all credit back (the sends completed already).
    pub fn drain(&mut self) {
        self.used = 0;
        self.owed = 0;
    }
}

impl State {
    /// Sends `op` to `peer` eager if it is small and the pair has credit;
    /// false: it goes by rendezvous.
    pub(super) fn post_eager(&mut self, op: u64, peer: usize) -> bool {
        let o = self.ops.get_mut(&op).expect("posted");
        let (id, tag, len) = (o.id, o.post.tag, o.post.len);
        let p = &mut self.peers[peer];
        if len == 0 || len > EAGER_BYTES || !p.credit.take(len) {
            return false;
        }
        o.moving = true;
        if len <= Peer::inline_bytes(p.link.as_ref()) {
            p.outq.push_back(Out::Inline(op));
            return true;
        }
        let mut c = Ctrl::new(Kind::Eager, id);
        c.tag = tag;
        c.len = len as u64;
        p.outq.push_back(Out::Ctrl(Box::new(c.encode()), None));
        p.outq.push_back(Out::Eager(op));
        true
    }

    /// An eager message from `q` came whole with its frame (`data`, at most
    /// [`INLINE_BYTES`]): into the first posted receive that takes it, or
    /// kept aside.
    pub(super) fn eager_inline_in(&mut self, q: usize, id: u64, tag: u32, data: &[u8]) {
        let len = data.len();
        let Some(op) = self.take_posted(q, tag) else {
            return self.eager_arrived(q, id, tag, data.to_vec());
        };
        let fit = self.check_fit(op, q, len);
        if fit.is_ok() {
            let to = self.ops[&op].post.ptr;
            // SAFETY: the receive's buffer is valid for its length until the
            // op completes (the poster's promise) and `data` fits it
            // (checked); `data` is this side's own buffer.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, len) };
        }
        self.finish(op, fit);
        self.eager_taken(q, len);
    }

    /// `q` gave back `len` bytes of credit; false if it never had them.
    pub(super) fn eager_acked(&mut self, q: usize, len: u64) -> bool {
        self.peers[q].credit.settle(len)
    }

    /// `q` is closing: its credit comes back now, and with every message
    /// taken from here on.
    pub(super) fn eager_flush(&mut self, q: usize) {
        let c = &mut self.peers[q].credit;
        c.flush = true;
        if c.owed > 0 {
            let mut a = Ctrl::new(Kind::Ack, 0);
            a.len = std::mem::take(&mut c.owed) as u64;
            self.send_ctrl(q, a);
        }
    }

    /// Closing: asks every peer that holds eager messages of ours not yet
    /// given back to give their credit back as it takes them. Returns
    /// whether any such peer is left (its link unbroken).
    pub(super) fn eager_unsettled(&mut self) -> bool {
        let mut any = false;
        for q in 0..self.peers.len() {
            let p = &mut self.peers[q];
            if p.broken.is_some() || !p.credit.outstanding() {
                continue;
            }
            any = true;
            if !p.credit.asked {
                p.credit.asked = true;
                self.send_ctrl(q, Ctrl::new(Kind::Flush, 0));
            }
        }
        any
    }

    /// Closing: gives every peer the credit of its eager messages back,
    /// those taken and those that no receive will take now (dropped), and
    /// from now on of each message as it comes.
    pub(super) fn eager_release(&mut self) {
        for q in 0..self.peers.len() {
            let p = &mut self.peers[q];
            if p.broken.is_some() || p.link.is_none() {
                continue;
            }
            let mut dropped = 0;
            p.offers.retain(|o| match o.body {
                Body::Eager(_) => {
                    dropped += o.len;
                    false
                }
                _ => true,
            });
            p.credit.owed += dropped;
            self.eager_flush(q);
        }
    }

    /// A receive took (or refused) an eager message of `len` bytes from
    /// `q`: its credit goes back with the next `Ack`, once enough is owed.
    pub(super) fn eager_taken(&mut self, q: usize, len: usize) {
        let c = &mut self.peers[q].credit;
        c.owed += len;
        if c.owed >= ACK_BYTES || c.flush {
            let mut a = Ctrl::new(Kind::Ack, 0);
            a.len = std::mem::take(&mut c.owed) as u64;
            self.send_ctrl(q, a);
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
                    Inbound::Payload(m, Dest::EagerRecv(op, len), Vec::new())
                }
                Err(e) => {
                    self.eager_taken(q, len);
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

    /// Receive `op` matched an eager message from `q`, kept aside as
    /// `data`; `fit` says whether it fits.
    pub(super) fn eager_matched(&mut self, op: u64, q: usize, data: &[u8], fit: Result<()>) {
        self.eager_taken(q, data.len());
        if let Err(e) = fit {
            return self.finish(op, Err(e));
        }
        let to = self.ops[&op].post.ptr;
        // SAFETY: the receive's buffer is valid for its length until the
        // op completes (the poster's promise), and `data` fits it (checked
        // by the caller); `data` is our own allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
        self.finish(op, Ok(()));
    }
}
