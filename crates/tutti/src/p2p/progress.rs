//! The point-to-point state machine: posted sends and receives, matching,
//! and each peer link's outgoing and incoming frames ([`super::wire`]).
//! Owned by the progress thread alone: no locks, no waiting here (the
//! thread in [`super`] decides when to poll and when to sleep).
//!
//! Matching follows MPI: per peer, offers arrive in the order they were
//! sent; a receive takes the first offer from its source (the earliest to
//! arrive from any peer, for any-source) with its tag, and an offer the
//! first posted receive that accepts it. So messages between two ranks
//! with one tag are received in the order they were sent, and nothing
//! else orders them: not other tags, not other peers, not collectives.

use super::wire::{Ctrl, Kind, CTRL_BYTES};
use super::{Post, PostKind, RecvStatus};
use crate::error::{Error, Result};
use crate::reduce::{DataType, ReduceOp};
use crate::transport::{make_tag, Link, LinkOps, RecvMsg, SendMsg, StepCx, P2P_SEQ};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How often peers with pending messages are checked for life.
const LIVENESS_EVERY: Duration = Duration::from_millis(50);

/// A posted send or receive.
struct Op {
    post: Post,
    deadline: Instant,
    /// Sends: the message's number to its peer.
    id: u64,
    /// The peer: a send's, or the source a receive matched.
    peer: Option<usize>,
    /// Receives: the bytes of the message matched.
    matched: usize,
    /// Bytes may be moving (a send's payload is queued or going; a
    /// receive was matched and cleared): a failure past this point breaks
    /// the pair's link, whose stream is then out of step.
    moving: bool,
}

/// A frame waiting to go out on a link.
enum Out {
    /// A control frame; for an empty message's offer, the send it completes.
    Ctrl(Box<[u8; CTRL_BYTES]>, Option<u64>),
    /// A send's payload.
    Payload(u64),
}

/// What the incoming side of a link is reading.
enum Inbound {
    /// The next control frame (into `Peer::ctrl_in`).
    Ctrl(RecvMsg),
    /// A payload, for a receive (`Some(op)`) or to be dropped (`None`, into
    /// the buffer kept beside it: its receive gave up).
    Payload(RecvMsg, Option<u64>, #[allow(dead_code)] Vec<u8>),
}

/// An offer not yet matched by a receive.
struct Offer {
    id: u64,
    tag: u32,
    len: usize,
    /// Arrival order among all peers' offers (for any-source receives).
    arrival: u64,
    /// A send to this rank itself: the op, whose buffer is copied directly.
    local: Option<u64>,
}

/// One peer's side of the protocol.
struct Peer {
    link: Option<Link>,
    pid: Option<i32>,
    broken: Option<Error>,
    outq: VecDeque<Out>,
    cur: Option<(Out, SendMsg)>,
    ctrl_in: Box<[u8; CTRL_BYTES]>,
    inbound: Option<Inbound>,
    offers: VecDeque<Offer>,
    /// Our sends to this peer waiting for its Clear, by message id.
    clear_wait: FxHashMap<u64, u64>,
    /// Its messages we cleared, by its message id: the receive (or `None`:
    /// the receive gave up, drop the payload).
    data_wait: FxHashMap<u64, Option<u64>>,
    next_id: u64,
}

impl Peer {
    fn busy(&self) -> bool {
        self.cur.is_some()
            || !self.outq.is_empty()
            || !self.clear_wait.is_empty()
            || !self.data_wait.is_empty()
            || matches!(self.inbound, Some(Inbound::Payload(..)))
    }
}

/// Every posted op of a communicator's point-to-point channel.
pub(super) struct State {
    rank: usize,
    peers: Vec<Peer>,
    ops: FxHashMap<u64, Op>,
    next_op: u64,
    /// Posted receives not yet matched, in post order.
    posted: Vec<u64>,
    arrivals: u64,
    cx: StepCx,
    last_liveness: Instant,
}

impl State {
    /// The state over `links` (one per rank, `None` for this rank).
    pub fn new(
        links: Vec<Option<Link>>,
        pids: Vec<Option<i32>>,
        rank: usize,
        direct_bytes: usize,
    ) -> State {
        let peers = links
            .into_iter()
            .enumerate()
            .map(|(q, link)| Peer {
                link,
                pid: pids.get(q).copied().flatten(),
                broken: None,
                outq: VecDeque::new(),
                cur: None,
                ctrl_in: Box::new([0; CTRL_BYTES]),
                inbound: None,
                offers: VecDeque::new(),
                clear_wait: FxHashMap::default(),
                data_wait: FxHashMap::default(),
                next_id: 0,
            })
            .collect();
        State {
            rank,
            peers,
            ops: FxHashMap::default(),
            next_op: 0,
            posted: Vec::new(),
            arrivals: 0,
            cx: StepCx {
                rank,
                seq: 0,
                coll_seq: P2P_SEQ,
                tag: make_tag(
                    crate::algo::CollKind::SendRecv,
                    DataType::U8,
                    ReduceOp::Sum,
                    0,
                ),
                op_name: "send/recv",
                dtype: DataType::U8,
                op: ReduceOp::Sum,
                elem: 1,
                direct_bytes,
                stream: false,
                bounce: if direct_bytes == usize::MAX {
                    Vec::new()
                } else {
                    vec![0; 256 << 10]
                },
            },
            last_liveness: Instant::now(),
        }
    }

    /// Nothing posted and nothing in flight.
    pub fn idle(&self) -> bool {
        self.ops.is_empty() && !self.peers.iter().any(|p| p.busy())
    }

    /// The earliest deadline of a posted op.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.ops.values().map(|o| o.deadline).min()
    }

    /// The links, to sleep on (rings) or poll (sockets).
    pub fn links(&self) -> impl Iterator<Item = (&Link, Option<&SendMsg>)> {
        self.peers
            .iter()
            .filter_map(|p| p.link.as_ref().map(|l| (l, p.cur.as_ref().map(|c| &c.1))))
    }

    /// Takes new posts in.
    pub fn accept(&mut self, posts: Vec<Post>) {
        for post in posts {
            let id = self.next_op;
            self.next_op += 1;
            let deadline = crate::config::deadline_after(Instant::now(), post.timeout);
            let kind = post.kind;
            self.ops.insert(
                id,
                Op {
                    post,
                    deadline,
                    id: 0,
                    peer: match kind {
                        PostKind::Send { peer } => Some(peer),
                        PostKind::Recv { .. } => None,
                    },
                    matched: 0,
                    moving: false,
                },
            );
            match kind {
                PostKind::Send { peer } => self.post_send(id, peer),
                PostKind::Recv { src, .. } => self.post_recv(id, src),
            }
        }
    }

    fn post_send(&mut self, op: u64, peer: usize) {
        if let Some(e) = &self.peers[peer].broken {
            let e = e.clone();
            return self.finish(op, Err(e));
        }
        let p = &mut self.peers[peer];
        let id = p.next_id;
        p.next_id += 1;
        let o = self.ops.get_mut(&op).expect("just posted");
        o.id = id;
        let (tag, len) = (o.post.tag, o.post.len);
        if peer == self.rank {
            let arrival = self.next_arrival();
            let offer = Offer {
                id,
                tag,
                len,
                arrival,
                local: Some(op),
            };
            return self.offer_in(peer, offer);
        }
        let mut c = Ctrl::new(Kind::Offer, id);
        c.tag = tag;
        c.len = len as u64;
        let p = &mut self.peers[peer];
        if len == 0 {
            p.outq.push_back(Out::Ctrl(Box::new(c.encode()), Some(op)));
        } else {
            p.outq.push_back(Out::Ctrl(Box::new(c.encode()), None));
            p.clear_wait.insert(id, op);
        }
    }

    fn post_recv(&mut self, op: u64, src: Option<usize>) {
        if let Some(q) = src {
            if let Some(e) = &self.peers[q].broken {
                let e = e.clone();
                return self.finish(op, Err(e));
            }
        }
        let tag = self.ops[&op].post.tag;
        // The first offer from the source with the tag; for any source, the
        // earliest to arrive.
        let mut best: Option<(usize, usize, u64)> = None;
        for (q, p) in self.peers.iter().enumerate() {
            if src.is_some_and(|s| s != q) {
                continue;
            }
            if let Some(i) = p.offers.iter().position(|o| o.tag == tag) {
                let a = p.offers[i].arrival;
                if best.is_none_or(|b| a < b.2) {
                    best = Some((q, i, a));
                }
            }
        }
        match best {
            Some((q, i, _)) => {
                let offer = self.peers[q].offers.remove(i).expect("found above");
                self.matched(op, q, offer);
            }
            None => self.posted.push(op),
        }
    }

    fn next_arrival(&mut self) -> u64 {
        self.arrivals += 1;
        self.arrivals
    }

    /// An offer from `q` arrived: the first posted receive that takes it,
    /// or the queue of unmatched offers.
    fn offer_in(&mut self, q: usize, offer: Offer) {
        let found = self.posted.iter().position(|op| {
            let o = &self.ops[op];
            let PostKind::Recv { src, .. } = o.post.kind else {
                return false;
            };
            o.post.tag == offer.tag && src.is_none_or(|s| s == q)
        });
        match found {
            Some(i) => {
                let op = self.posted.remove(i);
                self.matched(op, q, offer);
            }
            None => self.peers[q].offers.push_back(offer),
        }
    }

    /// Receive `op` matched `offer` from `q`.
    fn matched(&mut self, op: u64, q: usize, offer: Offer) {
        let o = &self.ops[&op];
        let PostKind::Recv { exact, .. } = o.post.kind else {
            unreachable!("only receives match offers");
        };
        let (buf, tag) = (o.post.len, o.post.tag);
        if let Some(st) = &o.post.status {
            st.set(RecvStatus {
                source: q,
                tag,
                bytes: offer.len,
            });
        }
        if offer.len > buf || (exact && offer.len != buf) {
            let e = Error::SizeMismatch {
                rank: self.rank,
                peer: q,
                tag,
                message: offer.len,
                buffer: buf,
            };
            match offer.local {
                Some(s) => self.finish(s, Err(e.clone())),
                None => {
                    let mut c = Ctrl::new(Kind::Refuse, offer.id);
                    c.aux = buf as u64;
                    self.peers[q]
                        .outq
                        .push_back(Out::Ctrl(Box::new(c.encode()), None));
                }
            }
            return self.finish(op, Err(e));
        }
        if let Some(s) = offer.local {
            let from = self.ops[&s].post.ptr;
            // SAFETY: both buffers are valid until their ops complete, and
            // a receive's never overlaps another op's (the posters' promise);
            // offer.len <= buf.
            unsafe { std::ptr::copy_nonoverlapping(from, o.post.ptr, offer.len) };
            self.finish(s, Ok(()));
            return self.finish(op, Ok(()));
        }
        if offer.len == 0 {
            return self.finish(op, Ok(()));
        }
        let o = self.ops.get_mut(&op).expect("posted");
        o.moving = true;
        o.peer = Some(q);
        o.matched = offer.len;
        let p = &mut self.peers[q];
        p.data_wait.insert(offer.id, Some(op));
        p.outq.push_back(Out::Ctrl(
            Box::new(Ctrl::new(Kind::Clear, offer.id).encode()),
            None,
        ));
    }

    /// Completes `op` with `r` and forgets it.
    fn finish(&mut self, op: u64, r: Result<()>) {
        if let Some(o) = self.ops.remove(&op) {
            o.post.done.complete(r);
        }
    }

    /// One pass over every link. Returns whether anything moved.
    pub fn progress(&mut self) -> bool {
        let mut moved = false;
        for q in 0..self.peers.len() {
            if self.peers[q].link.is_none() || self.peers[q].broken.is_some() {
                continue;
            }
            let r = self.pump_out(q).and_then(|m| {
                moved |= m;
                self.pump_in(q)
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

    fn pump_out(&mut self, q: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let p = &mut self.peers[q];
            if p.cur.is_none() {
                let Some(out) = p.outq.pop_front() else {
                    return Ok(moved);
                };
                let m = match &out {
                    Out::Ctrl(b, _) => SendMsg::new(b.as_ptr(), CTRL_BYTES, CTRL_BYTES),
                    Out::Payload(op) => {
                        let o = &self.ops[op];
                        SendMsg::new(o.post.ptr, o.post.len, o.post.len)
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
                Out::Ctrl(_, Some(op)) | Out::Payload(op) => self.finish(op, Ok(())),
                Out::Ctrl(_, None) => {}
            }
            moved = true;
        }
    }

    fn pump_in(&mut self, q: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let p = &mut self.peers[q];
            let inbound = p.inbound.get_or_insert_with(|| {
                Inbound::Ctrl(RecvMsg::new(p.ctrl_in.as_mut_ptr(), None, CTRL_BYTES))
            });
            let link = p.link.as_mut().expect("checked by the caller");
            let m = match inbound {
                Inbound::Ctrl(m) | Inbound::Payload(m, ..) => m,
            };
            moved |= link.recv(m, &mut self.cx)?;
            if !m.done {
                return Ok(moved);
            }
            moved = true;
            match p.inbound.take().expect("set above") {
                Inbound::Ctrl(_) => {
                    let c = Ctrl::decode(&p.ctrl_in, self.rank, q)?;
                    self.on_ctrl(q, c)?;
                }
                Inbound::Payload(_, Some(op), _) => self.finish(op, Ok(())),
                Inbound::Payload(_, None, _) => {}
            }
        }
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
                    local: None,
                };
                self.offer_in(q, offer);
            }
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
                    None => p.outq.push_back(Out::Ctrl(
                        Box::new(Ctrl::new(Kind::Cancel, c.id).encode()),
                        None,
                    )),
                }
            }
            Kind::Refuse => {
                if let Some(op) = self.peers[q].clear_wait.remove(&c.id) {
                    let o = &self.ops[&op];
                    let e = Error::SizeMismatch {
                        rank: self.rank,
                        peer: q,
                        tag: o.post.tag,
                        message: o.post.len,
                        buffer: c.aux as usize,
                    };
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
                        Inbound::Payload(RecvMsg::new(o.post.ptr, None, len), Some(op), Vec::new())
                    }
                    None => {
                        let mut v = vec![0u8; len];
                        let m = RecvMsg::new(v.as_mut_ptr(), None, len);
                        Inbound::Payload(m, None, v)
                    }
                };
                self.peers[q].inbound = Some(inbound);
            }
            Kind::Cancel => {
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

    /// The pair's link is out of step or gone: every op that involves `q`
    /// fails with `e`, now and later. A send whose buffer the peer may be
    /// reading is withdrawn first.
    fn break_peer(&mut self, q: usize, e: Error) {
        let p = &mut self.peers[q];
        if p.broken.is_some() {
            return;
        }
        tracing::warn!(
            rank = self.rank,
            peer = q,
            "point-to-point link broken: {e}"
        );
        p.broken = Some(e.clone());
        let mut fail: Vec<u64> = Vec::new();
        if let Some((out, m)) = p.cur.take() {
            if let Some(l) = &p.link {
                l.withdraw(&m, p.pid);
            }
            if let Out::Ctrl(_, Some(op)) | Out::Payload(op) = out {
                fail.push(op);
            }
        }
        for out in p.outq.drain(..) {
            if let Out::Ctrl(_, Some(op)) | Out::Payload(op) = out {
                fail.push(op);
            }
        }
        fail.extend(p.clear_wait.drain().map(|(_, op)| op));
        fail.extend(p.data_wait.drain().filter_map(|(_, op)| op));
        if let Some(Inbound::Payload(_, Some(op), _)) = p.inbound.take() {
            fail.push(op);
        }
        p.offers.clear();
        if let Some(Link::Tcp(l)) = &p.link {
            // The peer's side fails at once instead of at its deadline.
            l.shutdown();
        }
        let ops = &self.ops;
        self.posted.retain(|op| {
            let keep = !matches!(ops[op].post.kind, PostKind::Recv { src: Some(s), .. } if s == q);
            if !keep {
                fail.push(*op);
            }
            keep
        });
        fail.sort_unstable();
        fail.dedup();
        for op in fail {
            self.finish(op, Err(e.clone()));
        }
    }

    /// Fails every op with `e` (abort, or the communicator going away),
    /// withdrawing buffers peers may be reading.
    pub fn fail_all(&mut self, e: Error) {
        for q in 0..self.peers.len() {
            self.break_peer(q, e.clone());
        }
        let ops: Vec<u64> = self.ops.keys().copied().collect();
        for op in ops {
            self.finish(op, Err(e.clone()));
        }
        self.posted.clear();
    }

    /// Deadlines and liveness, at `now`.
    pub fn check(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.deadline <= now)
            .map(|(&op, _)| op)
            .collect();
        for op in late {
            self.time_out(op);
        }
        if now.duration_since(self.last_liveness) < LIVENESS_EVERY {
            return;
        }
        self.last_liveness = now;
        for q in 0..self.peers.len() {
            let p = &self.peers[q];
            let waited_on = p.busy()
                || self.posted.iter().any(|op| {
                    matches!(self.ops[op].post.kind, PostKind::Recv { src: Some(s), .. } if s == q)
                });
            if p.broken.is_some() || !waited_on {
                continue;
            }
            let why = crate::transport::wait::peer_lost(q, p.link.as_ref(), p.pid);
            if let Some(msg) = why {
                let e = Error::PeerLost {
                    rank: self.rank,
                    peer: q,
                    op: "send/recv".into(),
                    seq: 0,
                    msg,
                };
                self.break_peer(q, e);
            }
        }
    }

    /// `op`'s deadline ran out.
    fn time_out(&mut self, op: u64) {
        let o = &self.ops[&op];
        let (name, waiting_for) = match o.post.kind {
            PostKind::Send { peer } => (
                format!("send to rank {peer} (tag {})", o.post.tag),
                vec![peer],
            ),
            PostKind::Recv { src: Some(q), .. } => {
                (format!("recv from rank {q} (tag {})", o.post.tag), vec![q])
            }
            PostKind::Recv { src: None, .. } => (
                format!("recv from any rank (tag {})", o.post.tag),
                (0..self.peers.len()).filter(|&q| q != self.rank).collect(),
            ),
        };
        let e = Error::Timeout {
            op: name,
            seq: op,
            rank: self.rank,
            waiting_for,
            after: o.post.timeout,
        };
        if !o.moving {
            // No byte of it has moved: forget it. A later Clear of the send
            // is answered with Cancel; a receive was not matched yet.
            if let PostKind::Send { peer } = o.post.kind {
                let id = o.id;
                self.peers[peer].clear_wait.remove(&id);
            }
            self.posted.retain(|&x| x != op);
            return self.finish(op, Err(e));
        }
        // Bytes may be moving into or out of the buffer: unless a matched
        // receive's data has not started (then it is dropped on arrival),
        // the stream is cut.
        let receiving = self
            .peers
            .iter()
            .any(|p| matches!(p.inbound, Some(Inbound::Payload(_, Some(x), _)) if x == op));
        if !receiving {
            for p in &mut self.peers {
                if let Some(slot) = p.data_wait.values_mut().find(|v| **v == Some(op)) {
                    *slot = None;
                    return self.finish(op, Err(e));
                }
            }
        }
        let q = o.peer.expect("a moving op has its peer");
        self.break_peer(q, e);
    }
}

/// A receive's status slot, filled when it matches.
#[derive(Default)]
pub(crate) struct StatusCell(std::sync::Mutex<Option<RecvStatus>>);

impl StatusCell {
    fn set(&self, s: RecvStatus) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    /// The status, once matched.
    pub(crate) fn get(&self) -> Option<RecvStatus> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
