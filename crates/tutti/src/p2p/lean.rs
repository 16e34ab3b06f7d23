//! The lean lane: a blocking call of one eager send and one receive, or
//! of either alone, over shared memory (a pipeline stage passing
//! activations on, a ping-pong, `tutti perf send_recv`), moved by the
//! calling thread alone.
//!
//! The usual way posts both ops, keeps them in a map, matches the
//! message against the posted receives and completes each op through
//! its completion: about 190 ns a call of the library's own work (a rank
//! exchanging 8 B with itself), more than `MPI_Sendrecv`'s whole exchange
//! here. When nothing else is under way on the channel, the lean lane
//! writes the send's eager message into the ring itself and reads the
//! receive's straight into the caller's buffer: the same bytes on the
//! same rings, matched the same way, with no post, op or completion. Two
//! ranks exchanging 8 B: 0.17-0.21 us a call against 0.31-0.45.
//!
//! It takes an exchange only where the usual way would do exactly the
//! same ([`State::lean_fits`]): no op of the channel in flight, no
//! message from the receive's source waiting for a receive, an eager
//! message (at most [`LEAN_BYTES`]) with credit for it and room for it in
//! the send's ring. It travels as the usual way's would: inside its
//! frame up to [`INLINE_BYTES`], else as a frame and then the payload,
//! which the receiving side reads straight into the receive's buffer.
//! Anything else that arrives first (a rendezvous offer, a message with
//! another tag, credit given back), another thread's post, an abort, or
//! a wait longer than a spin, and the receive becomes an op like any
//! other, with whatever came in taken in the usual way
//! ([`State::lean_post`]).

use super::eager::{EAGER_BYTES, INLINE_BYTES};
use super::peer::{Dest, Inbound};
use super::progress::State;
use super::wire::{Ctrl, Kind, CTRL_BYTES};
use super::{Post, RecvStatus};
use crate::error::{Error, Result};
use crate::transport::shm::RingLink;
use crate::transport::{Link, LinkOps, RecvMsg, SendMsg};
use std::time::Duration;

/// The longest message the lean lane sends: any eager one.
pub(crate) const LEAN_BYTES: usize = EAGER_BYTES;

/// One side of a lean exchange: the peer (a send's destination, a
/// receive's source), the buffer, the tag.
pub(crate) struct LeanOp {
    pub peer: usize,
    pub ptr: *mut u8,
    pub len: usize,
    pub tag: u32,
    /// Receives: the message must fill the buffer.
    pub exact: bool,
    /// The op's deadline.
    pub timeout: Duration,
}

/// What one look for the receive's message found.
pub(super) enum Look {
    /// Nothing yet.
    Nothing,
    /// The message, in the receive's buffer.
    Got(RecvStatus),
    /// A message of this many bytes that is not it (kept in `ctrl_in`).
    Other(usize),
    /// The link failed.
    Broken(Error),
}

impl State {
    /// Whether the lean lane may take send `s` and receive `r` (either
    /// may be missing; only the send ring's view of its free space
    /// changes).
    pub(super) fn lean_fits(&mut self, s: Option<&LeanOp>, r: Option<&LeanOp>) -> bool {
        if !self.ops.is_empty() || !self.posted.is_empty() {
            return false;
        }
        r.is_none_or(|r| self.lean_fits_recv(r)) && s.is_none_or(|s| self.lean_fits_send(s))
    }

    fn lean_fits_recv(&self, r: &LeanOp) -> bool {
        let pr = &self.peers[r.peer];
        r.peer != self.rank
            && matches!(pr.link, Some(Link::Ring(_)))
            && pr.broken.is_none()
            && pr.offers.is_empty()
            && match &pr.inbound {
                None => true,
                Some(Inbound::Ctrl(m)) => !m.header_seen && m.got == 0,
                Some(Inbound::Payload(..)) => false,
            }
    }

    fn lean_fits_send(&mut self, s: &LeanOp) -> bool {
        if s.peer == self.rank || s.len == 0 || s.len > LEAN_BYTES {
            return false;
        }
        let ps = &mut self.peers[s.peer];
        ps.broken.is_none()
            && !ps.sending()
            && ps.credit.has(s.len)
            && match &mut ps.link {
                Some(Link::Ring(ring)) => ring.has_room(if s.len <= INLINE_BYTES {
                    RingLink::footprint(CTRL_BYTES + s.len)
                } else {
                    RingLink::footprint(CTRL_BYTES) + RingLink::footprint(s.len)
                }),
                _ => false,
            }
    }

    /// Sends `s` eager: its frame and payload in one message, or a
    /// larger one as a frame and then the payload (the ring has room for
    /// them: [`State::lean_fits`]). It is complete once this returns `Ok`.
    pub(super) fn lean_send(&mut self, s: &LeanOp) -> Result<()> {
        self.longest = self.longest.max(s.timeout);
        let p = &mut self.peers[s.peer];
        let id = p.next_id;
        p.next_id += 1;
        let took = p.credit.take(s.len);
        debug_assert!(took, "checked by lean_fits");
        let mut c = Ctrl::new(Kind::Eager, id);
        c.tag = s.tag;
        c.len = s.len as u64;
        let link = p.link.as_mut().expect("a ring: checked by lean_fits");
        if s.len > INLINE_BYTES {
            let frame = c.encode();
            let mut m = SendMsg::new(frame.as_ptr(), CTRL_BYTES, CTRL_BYTES);
            while !m.done {
                link.send(&mut m, &mut self.cx)?;
            }
            let mut m = SendMsg::new(s.ptr, s.len, s.len);
            while !m.done {
                link.send(&mut m, &mut self.cx)?;
            }
            return Ok(());
        }
        p.out_buf.clear();
        p.out_buf.extend_from_slice(&c.encode());
        // SAFETY: the send's buffer is valid for reads of its length until
        // the blocking call returns (its caller's promise).
        let payload = unsafe { std::slice::from_raw_parts(s.ptr, s.len) };
        p.out_buf.extend_from_slice(payload);
        let mut m = SendMsg::new(p.out_buf.as_ptr(), p.out_buf.len(), p.out_buf.len());
        let link = p.link.as_mut().expect("a ring: checked by lean_fits");
        // The ring has room for all of it: one call writes it.
        while !m.done {
            link.send(&mut m, &mut self.cx)?;
        }
        Ok(())
    }

    /// One look for receive `r`'s message on its ring: an eager message
    /// with its tag that fits goes straight into the receive's buffer,
    /// from inside its frame or, a larger one, read there as its payload
    /// comes (its credit goes back as the usual way's would).
    pub(super) fn lean_look(&mut self, r: &LeanOp) -> Look {
        let q = r.peer;
        loop {
            let p = &mut self.peers[q];
            match p.take_in(&mut self.cx) {
                Err(e) => return Look::Broken(e),
                Ok((_, false)) => return Look::Nothing,
                Ok((_, true)) => {}
            }
            let m = match p.inbound.take().expect("set above") {
                Inbound::Ctrl(m) => m,
                Inbound::Payload(_, Dest::Lean { tag, len }, _) => {
                    return self.lean_got(q, tag, len)
                }
                Inbound::Payload(..) => unreachable!("lean_fits saw no other payload coming in"),
            };
            let len = m.len;
            let Some(inline) = len.checked_sub(CTRL_BYTES) else {
                return Look::Other(len);
            };
            let head: &[u8; CTRL_BYTES] = p.ctrl_in[..CTRL_BYTES].try_into().expect("long enough");
            let Ok(c) = Ctrl::decode(head, self.rank, q) else {
                return Look::Other(len);
            };
            // The message's length: the frame's, checked against what came
            // inside it (none: the payload follows).
            let msg = c.len as usize;
            let fits = msg <= r.len && (!r.exact || msg == r.len);
            let ok = c.kind == Kind::Eager
                && c.tag == r.tag
                && fits
                && (1..=EAGER_BYTES).contains(&msg)
                && (inline == 0 || inline == msg);
            if !ok {
                return Look::Other(len);
            }
            if inline == 0 {
                // The payload follows, straight into the receive's buffer.
                let m = RecvMsg::new(r.ptr, None, msg);
                let into = Dest::Lean {
                    tag: c.tag,
                    len: msg,
                };
                p.inbound = Some(Inbound::Payload(m, into, Vec::new()));
                continue;
            }
            // SAFETY: the receive's buffer is valid for writes of its length
            // until the blocking call returns (its caller's promise), and the
            // payload fits it (checked); `ctrl_in` is this side's own buffer.
            unsafe { std::ptr::copy_nonoverlapping(p.ctrl_in[CTRL_BYTES..].as_ptr(), r.ptr, msg) };
            return self.lean_got(q, c.tag, msg);
        }
    }

    /// The lean receive took an eager message of `len` bytes with `tag`
    /// from `q`: its credit goes back as the usual way's would.
    fn lean_got(&mut self, q: usize, tag: u32, len: usize) -> Look {
        self.eager_taken(q, len);
        // An Ack that it queued leaves now.
        if let Err(e) = self.pump_out(q) {
            self.break_peer(q, e);
        }
        Look::Got(RecvStatus {
            source: q,
            tag,
            bytes: len,
        })
    }

    /// The lean lane gives up on receive `r`: it is posted as `post` (with
    /// its message, if that has begun to come in), and what the last look
    /// found is taken in the usual way.
    pub(super) fn lean_post(&mut self, r: &LeanOp, post: Post, last: Look) {
        let q = r.peer;
        if let Some(Inbound::Payload(_, Dest::Lean { len, .. }, _)) = &self.peers[q].inbound {
            let len = *len;
            let op = self.accept_matched(post, q, len);
            if let Some(Inbound::Payload(_, into, _)) = &mut self.peers[q].inbound {
                *into = Dest::EagerRecv(op, len);
            }
        } else {
            self.accept(vec![post]);
        }
        let failed = match last {
            Look::Other(len) => self.frame_in(q, len).err(),
            Look::Broken(e) => Some(e),
            Look::Nothing | Look::Got(_) => None,
        };
        if let Some(e) = failed {
            self.break_peer(q, e);
        }
    }
}

/// How a lean exchange ended (its send, if any, has completed, or
/// failed).
pub(crate) enum Lean {
    /// The receive too, if any: what it got, or the first error.
    Done(Result<Option<RecvStatus>>),
    /// The receive went the usual way, and completes through this.
    Posted(std::sync::Arc<crate::engine::Completion>),
}
