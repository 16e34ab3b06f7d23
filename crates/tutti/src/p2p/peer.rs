//! One peer's side of the protocol: the frames waiting to go out on its
//! link, the frame or payload coming in, the messages it sent that no
//! receive has matched yet, and what each incoming control frame
//! ([`super::wire`]) does.

use super::eager::{Credit, EAGER_BYTES, INLINE_BYTES, SOCKET_INLINE_BYTES};
use super::progress::State;
use super::wire::{Ctrl, Kind, CTRL_BYTES};
use super::PostKind;
use crate::error::{Error, Result};
use crate::transport::{Link, LinkOps, RecvMsg, SendMsg, StepCx};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// Every this many rounds a round looks at every link; in between it
/// passes by the socket links of peers that nothing waits on ([`Peer::cold`]
/// and no posted receive). Each look at a socket is a `recv` call, and a
/// rank exchanging with one neighbour of several (4 ranks over TCP, each
/// sending to the next and receiving from the previous one) paid one for
/// every peer in every round: `TUTTI_TRANSPORT=tcp tutti perf send_recv -n
/// 4 -b 8 -e 1M`, 5 rounds, paired against looking at every link:
/// 0.73-0.96 at every size. What arrives from a peer passed by waits
/// in its socket (its sender's send has completed, or waits for our answer
/// anyway) until a receive for it is posted or the next full round, and a
/// sleeping waiter polls every link.
const COLD_EVERY: u64 = 16;

/// A frame waiting to go out on a link.
pub(super) enum Out {
    /// A control frame; for an empty message's offer, the send it completes.
    Ctrl(Box<[u8; CTRL_BYTES]>, Option<u64>),
    /// A rendezvous send's payload: the send completes once it has left.
    Payload(u64),
    /// An eager send's payload: the send completes once it has left (the
    /// receiver's answer only gives the credit back).
    Eager(u64),
    /// An eager send's `Eager` frame and payload in one message (see
    /// [`INLINE_BYTES`]), put together in `Peer::out_buf` as it goes.
    Inline(u64),
}

/// Where an incoming payload goes.
pub(super) enum Dest {
    /// A rendezvous receive's buffer.
    Recv(u64),
    /// An eager message straight into the receive that matched it (its
    /// length, whose credit goes back).
    EagerRecv(u64, usize),
    /// An eager message nobody has asked for yet, into the buffer kept
    /// beside it (its id and tag): queued with the offers once complete.
    Stash(u64, u32),
    /// Nowhere: its receive gave up (into the buffer kept beside it).
    Drop,
    /// An eager message with `tag` of `len` bytes straight into the
    /// receive of a lean exchange ([`super::lean`]), which has no op: the
    /// lean lane reads it whole, or gives it an op (`EagerRecv`) before it
    /// lets go of the state, so nothing else ever sees it.
    Lean { tag: u32, len: usize },
}

/// What the incoming side of a link is reading.
pub(super) enum Inbound {
    /// The next control frame (into `Peer::ctrl_in`).
    Ctrl(RecvMsg),
    /// A payload, and where it goes (the buffer of a stash or a drop
    /// beside it).
    Payload(RecvMsg, Dest, Vec<u8>),
}

/// How a message not yet matched travels.
pub(super) enum Body {
    /// Offered: its payload moves once a receive matches.
    Rendezvous,
    /// An eager message: its payload is here.
    Eager(Vec<u8>),
    /// A send to this rank itself: the op, whose buffer is copied directly.
    Local(u64),
}

/// A message not yet matched by a receive.
pub(super) struct Offer {
    pub id: u64,
    pub tag: u32,
    pub len: usize,
    /// Arrival order among all peers' messages (for any-source receives).
    pub arrival: u64,
    pub body: Body,
}

/// One peer's side of the protocol.
pub(super) struct Peer {
    pub link: Option<Link>,
    pub pid: Option<i32>,
    pub broken: Option<Error>,
    pub outq: VecDeque<Out>,
    pub cur: Option<(Out, SendMsg)>,
    /// The message going out for an [`Out::Inline`].
    pub out_buf: Vec<u8>,
    /// The incoming control frame, and room for an inline payload behind
    /// it ([`Peer::inline_bytes`]).
    pub ctrl_in: Box<[u8]>,
    pub inbound: Option<Inbound>,
    pub offers: VecDeque<Offer>,
    /// Our sends to this peer waiting for its Clear, by message id.
    pub clear_wait: FxHashMap<u64, u64>,
    /// Its messages we cleared, by its message id: the receive (or `None`:
    /// the receive gave up, drop the payload).
    pub data_wait: FxHashMap<u64, Option<u64>>,
    /// Our eager sends to this peer, and the credit they hold.
    pub credit: Credit,
    pub next_id: u64,
}

impl Peer {
    /// The largest eager payload that travels inside its frame on `link`:
    /// through the rings, where the copy through a buffer on each side
    /// costs about what a second ring message saves, little; over a
    /// socket, where a second message costs a system call on each side,
    /// more.
    pub fn inline_bytes(link: Option<&Link>) -> usize {
        match link {
            Some(Link::Ring(_)) | None => INLINE_BYTES,
            Some(_) => SOCKET_INLINE_BYTES,
        }
    }

    /// Whether anything is under way with this peer. Eager messages it
    /// has not answered yet do not count: their sends are complete, and
    /// the answers (credit only) are taken in by the next round anyone
    /// runs; counting them would keep the progress thread polling (or
    /// asleep on the doorbell, which every ring write then rings) after
    /// each small exchange.
    pub fn busy(&self) -> bool {
        self.sending()
            || !self.clear_wait.is_empty()
            || !self.data_wait.is_empty()
            || matches!(self.inbound, Some(Inbound::Payload(..)))
    }

    /// Whether a round may pass this peer by (see [`COLD_EVERY`]): its
    /// link is a socket, where looking for a message costs a system call,
    /// and nothing of ours waits on it: no frame to send, no answer to a
    /// message of ours (a `Clear`, the credit of eager messages), no
    /// payload coming in. (A receive posted for it is the caller's to
    /// check.)
    fn cold(&self) -> bool {
        !matches!(self.link, Some(Link::Ring(_))) && !self.busy() && !self.credit.outstanding()
    }

    /// Reads on what is coming in from this peer: the payload under way,
    /// or else the next frame (and perhaps an inline eager payload behind
    /// it). Returns whether anything moved, and whether it is all in.
    pub fn take_in(&mut self, cx: &mut StepCx) -> Result<(bool, bool)> {
        let link = self.link.as_mut().expect("a link: checked by the caller");
        let ctrl_in = &mut self.ctrl_in;
        let inbound = self.inbound.get_or_insert_with(|| {
            let mut m = RecvMsg::new(ctrl_in.as_mut_ptr(), None, ctrl_in.len());
            m.var_len = true;
            Inbound::Ctrl(m)
        });
        let (Inbound::Ctrl(m) | Inbound::Payload(m, ..)) = inbound;
        let moved = link.recv(m, cx)?;
        Ok((moved, m.done))
    }

    /// Whether frames wait to go out to this peer.
    pub fn sending(&self) -> bool {
        self.cur.is_some() || !self.outq.is_empty()
    }
}

impl State {
    /// One pass over every link. Returns whether anything moved.
    pub fn progress(&mut self) -> bool {
        let mut moved = false;
        self.rounds = self.rounds.wrapping_add(1);
        let every = !self.sockets || self.rounds.is_multiple_of(COLD_EVERY) || self.mark_awaited();
        for q in 0..self.peers.len() {
            let p = &self.peers[q];
            if p.link.is_none() || p.broken.is_some() {
                continue;
            }
            if !every && !self.awaited[q] && p.cold() {
                continue;
            }
            // Out again after in: what came in may have queued answers
            // (an Ack, a Clear), which leave now, not at the next round
            // (there may be none: the waiter whose message this was is
            // gone once it completes).
            let r = self.pump_out(q).and_then(|m| {
                moved |= m;
                let m = self.pump_in(q)?;
                Ok(m | self.pump_out(q)?)
            });
            match r {
                Ok(m) => moved |= m,
                Err(e) => {
                    self.break_peer(q, e);
                    moved = true;
                }
            }
        }
        moved
    }

    /// Marks in `awaited` the peers that a posted receive waits on; true
    /// if one takes any source (every peer is awaited).
    fn mark_awaited(&mut self) -> bool {
        self.awaited.clear();
        self.awaited.resize(self.peers.len(), false);
        for op in &self.posted {
            if let PostKind::Recv { src, .. } = self.ops[op].post.kind {
                match src {
                    Some(q) => self.awaited[q] = true,
                    None => return true,
                }
            }
        }
        false
    }

    pub(super) fn pump_out(&mut self, q: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let p = &mut self.peers[q];
            if p.cur.is_none() {
                let Some(out) = p.outq.pop_front() else {
                    return Ok(moved);
                };
                let m = match &out {
                    Out::Ctrl(b, _) => SendMsg::new(b.as_ptr(), CTRL_BYTES, CTRL_BYTES),
                    Out::Payload(op) | Out::Eager(op) => {
                        let o = &self.ops[op];
                        SendMsg::new(o.post.ptr, o.post.len, o.post.len)
                    }
                    Out::Inline(op) => {
                        let o = &self.ops[op];
                        let mut c = Ctrl::new(Kind::Eager, o.id);
                        c.tag = o.post.tag;
                        c.len = o.post.len as u64;
                        p.out_buf.clear();
                        p.out_buf.extend_from_slice(&c.encode());
                        // SAFETY: a send's buffer is valid for reads of its
                        // length until the op completes (the poster's promise).
                        let payload = unsafe { std::slice::from_raw_parts(o.post.ptr, o.post.len) };
                        p.out_buf.extend_from_slice(payload);
                        SendMsg::new(p.out_buf.as_ptr(), p.out_buf.len(), p.out_buf.len())
                    }
                };
                p.cur = Some((out, m));
            }
            let (_, m) = p.cur.as_mut().expect("set above");
            let link = p.link.as_mut().expect("checked by the caller");
            moved |= link.send(m, &mut self.cx)?;
            if !m.done {
                return Ok(moved);
            }
            match p.cur.take().expect("set above").0 {
                Out::Ctrl(_, Some(op)) | Out::Payload(op) | Out::Eager(op) | Out::Inline(op) => {
                    self.finish(op, Ok(()))
                }
                Out::Ctrl(_, None) => {}
            }
            moved = true;
        }
    }

    fn pump_in(&mut self, q: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let p = &mut self.peers[q];
            let (m, done) = p.take_in(&mut self.cx)?;
            moved |= m;
            if !done {
                return Ok(moved);
            }
            moved = true;
            match p.inbound.take().expect("set above") {
                Inbound::Ctrl(m) => {
                    if self.frame_in(q, m.len)? {
                        return Ok(true);
                    }
                }
                Inbound::Payload(_, into, data) => self.payload_in(q, into, data),
            }
        }
    }

    /// A message of `len` bytes from `q` has arrived whole in `ctrl_in`:
    /// a control frame, and perhaps an inline eager payload behind it.
    /// Returns whether the caller should stop reading for this round.
    pub(super) fn frame_in(&mut self, q: usize, len: usize) -> Result<bool> {
        let head: &[u8; CTRL_BYTES] = self.peers[q].ctrl_in[..CTRL_BYTES]
            .try_into()
            .expect("long enough");
        let c = Ctrl::decode(head, self.rank, q)?;
        // An eager payload inside: the message is longer than a frame.
        let inline = len.checked_sub(CTRL_BYTES).ok_or_else(|| Error::Mismatch {
            rank: self.rank,
            peer: q,
            seq: 0,
            msg: format!("a point-to-point control frame of {len} bytes (at least {CTRL_BYTES})"),
        })?;
        if inline > 0 {
            self.inline_in(q, c, inline)?;
            return Ok(false);
        }
        let data = c.kind == Kind::Data;
        self.on_ctrl(q, c)?;
        // What this round queued out (the payload of our own send that the
        // peer just cleared, say) leaves before the read: read now, and the
        // peer would wait for it the whole read long, where both can read
        // at once.
        Ok(data && self.reads_whole(q))
    }

    /// Whether the payload about to come from `q` is read whole in one
    /// call: a direct read from the sender's memory (shared memory, up to
    /// MiBs at a time). Over a socket a payload comes in as it arrives.
    fn reads_whole(&self, q: usize) -> bool {
        let p = &self.peers[q];
        let Some(Inbound::Payload(m, ..)) = &p.inbound else {
            return false;
        };
        // Only the rings read direct.
        m.len >= self.cx.direct_bytes && matches!(p.link, Some(Link::Ring(_)))
    }

    /// An `Eager` frame `c` from `q` came with `len` bytes of payload
    /// behind it, in `ctrl_in`.
    fn inline_in(&mut self, q: usize, c: Ctrl, len: usize) -> Result<()> {
        if c.kind != Kind::Eager || c.len != len as u64 || len == 0 {
            return Err(Error::Mismatch {
                rank: self.rank,
                peer: q,
                seq: c.id,
                msg: format!(
                    "a {:?} frame with {len} bytes behind it (only an eager message of that length may carry them)",
                    c.kind
                ),
            });
        }
        // Borrowed out while the message is matched (no allocation).
        let buf = std::mem::take(&mut self.peers[q].ctrl_in);
        self.eager_inline_in(q, c.id, c.tag, &buf[CTRL_BYTES..CTRL_BYTES + len]);
        self.peers[q].ctrl_in = buf;
        Ok(())
    }

    /// A payload from `q` has arrived whole.
    fn payload_in(&mut self, q: usize, into: Dest, data: Vec<u8>) {
        match into {
            Dest::Recv(op) => self.finish(op, Ok(())),
            Dest::EagerRecv(op, len) => {
                self.finish(op, Ok(()));
                self.eager_taken(q, len);
            }
            Dest::Stash(id, tag) => self.eager_arrived(q, id, tag, data),
            Dest::Drop => {}
            Dest::Lean { .. } => unreachable!("the lean lane reads its payload itself"),
        }
    }

    /// Queues control frame `c` to `q`.
    pub(super) fn send_ctrl(&mut self, q: usize, c: Ctrl) {
        self.peers[q]
            .outq
            .push_back(Out::Ctrl(Box::new(c.encode()), None));
    }

    fn on_ctrl(&mut self, q: usize, c: Ctrl) -> Result<()> {
        let rank = self.rank;
        let protocol = |msg: String| Error::Mismatch {
            rank,
            peer: q,
            seq: c.id,
            msg,
        };
        match c.kind {
            Kind::Offer => {
                let arrival = self.next_arrival();
                let len = usize::try_from(c.len)
                    .map_err(|_| protocol(format!("an offer of {} bytes", c.len)))?;
                let offer = Offer {
                    id: c.id,
                    tag: c.tag,
                    len,
                    arrival,
                    body: Body::Rendezvous,
                };
                self.offer_in(q, offer);
            }
            Kind::Eager => {
                if c.len == 0 || c.len > EAGER_BYTES as u64 {
                    return Err(protocol(format!(
                        "an eager message of {} bytes (at most {EAGER_BYTES})",
                        c.len
                    )));
                }
                self.eager_in(q, c.id, c.tag, c.len as usize);
            }
            Kind::Ack => {
                if !self.eager_acked(q, c.len) {
                    return Err(protocol(format!(
                        "{} bytes of eager credit given back, more than were sent",
                        c.len
                    )));
                }
            }
            Kind::Flush => self.eager_flush(q),
            Kind::Clear => {
                let p = &mut self.peers[q];
                match p.clear_wait.remove(&c.id) {
                    Some(op) => {
                        let o = self.ops.get_mut(&op).expect("waiting ops are posted");
                        o.moving = true;
                        let mut d = Ctrl::new(Kind::Data, c.id);
                        d.len = o.post.len as u64;
                        p.outq.push_back(Out::Ctrl(Box::new(d.encode()), None));
                        p.outq.push_back(Out::Payload(op));
                    }
                    // The send gave up before the receiver matched it.
                    None => self.send_ctrl(q, Ctrl::new(Kind::Cancel, c.id)),
                }
            }
            Kind::Refuse => {
                // None: the send gave up (its deadline ran out) before the
                // receiver matched it; nothing waits for the answer.
                if let Some(op) = self.peers[q].clear_wait.remove(&c.id) {
                    let e = self.size_mismatch(op, q, c.aux as usize);
                    self.finish(op, Err(e));
                }
            }
            Kind::Data => {
                let target = self.peers[q].data_wait.remove(&c.id).ok_or_else(|| {
                    protocol(format!("data for message {} that was never cleared", c.id))
                })?;
                let len = c.len as usize;
                let inbound = match target {
                    Some(op) => {
                        let o = &self.ops[&op];
                        let want = o.matched;
                        if len != want || len > o.post.len {
                            return Err(protocol(format!(
                                "message {} carries {len} bytes, its offer said {want}",
                                c.id
                            )));
                        }
                        Inbound::Payload(
                            RecvMsg::new(o.post.ptr, None, len),
                            Dest::Recv(op),
                            Vec::new(),
                        )
                    }
                    None => drop_payload(len),
                };
                self.peers[q].inbound = Some(inbound);
            }
            Kind::Cancel => {
                // `Some(None)`: the receive gave up already. Eager messages
                // are never cancelled.
                if let Some(Some(op)) = self.peers[q].data_wait.remove(&c.id) {
                    let e = Error::PeerLost {
                        rank: self.rank,
                        peer: q,
                        op: "recv".into(),
                        seq: op,
                        msg: format!(
                            "rank {q} gave up its matching send (it failed or its deadline ran out) before the data moved"
                        ),
                    };
                    self.finish(op, Err(e));
                }
            }
        }
        Ok(())
    }

    /// The error of send `op` to `q`, whose receive of `buffer` bytes
    /// does not fit it.
    pub(super) fn size_mismatch(&self, op: u64, q: usize, buffer: usize) -> Error {
        let o = &self.ops[&op];
        Error::SizeMismatch {
            rank: self.rank,
            peer: q,
            tag: o.post.tag,
            message: o.post.len,
            buffer,
        }
    }
}

/// Reading `len` bytes that nobody wants.
pub(super) fn drop_payload(len: usize) -> Inbound {
    let mut v = vec![0u8; len];
    let m = RecvMsg::new(v.as_mut_ptr(), None, len);
    Inbound::Payload(m, Dest::Drop, v)
}
