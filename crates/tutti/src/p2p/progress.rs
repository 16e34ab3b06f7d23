//! The point-to-point state machine: posted sends and receives, and
//! matching. Each peer link's outgoing and incoming frames are in
//! [`super::peer`], the eager path in [`super::eager`], failures and
//! deadlines in [`super::failure`]. No locks and no waiting here: whoever
//! holds the state ([`super::driver`]) decides when to poll and when to
//! sleep.
//!
//! Matching follows MPI: per peer, messages (rendezvous offers and eager
//! messages alike) arrive in the order they were sent; a receive takes the
//! first message from its source (the earliest to arrive from any peer,
//! for any-source) with its tag, and a message the first posted receive
//! that accepts it. So messages between two ranks with one tag are
//! received in the order they were sent, whichever way each travels, and
//! nothing else orders them: not other tags, not other peers, not
//! collectives.

use super::eager::{Credit, EAGER_BYTES};
use super::peer::{Body, Offer, Out, Peer};
use super::wire::{Ctrl, Kind, CTRL_BYTES};
use super::{Post, PostKind, RecvStatus};
use crate::error::{Error, Result};
use crate::transport::{Link, LinkOps, SendMsg, StepCx};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A posted send or receive.
pub(super) struct Op {
    pub post: Post,
    /// Set by the first look at the deadlines after the post
    /// ([`State::check`], within a few milliseconds while the op is in
    /// flight): most small ops complete before any, and reading the clock
    /// at every post cost 4% of a small exchange.
    pub deadline: Option<Instant>,
    /// Sends: the message's number to its peer.
    pub id: u64,
    /// The peer: a send's, or the source a receive matched.
    pub peer: Option<usize>,
    /// Receives: the bytes of the message matched.
    pub matched: usize,
    /// Bytes may be moving (a send's payload is queued or going; a
    /// receive was matched and cleared): a failure past this point breaks
    /// the pair's link, whose stream is then out of step.
    pub moving: bool,
}

/// Every posted op of a communicator's point-to-point channel.
pub(crate) struct State {
    pub(super) rank: usize,
    pub(super) peers: Vec<Peer>,
    pub(super) ops: FxHashMap<u64, Op>,
    next_op: u64,
    /// Posted receives not yet matched, in post order.
    pub(super) posted: Vec<u64>,
    arrivals: u64,
    pub(super) cx: StepCx,
    pub(super) last_liveness: Instant,
    /// The longest deadline of any op posted: how long closing waits for
    /// peers to take the eager messages sent to them.
    pub(super) longest: Duration,
    /// Rounds run ([`State::progress`]).
    pub(super) rounds: u64,
    /// Per peer: a posted receive waits on it (scratch of a round).
    pub(super) awaited: Vec<bool>,
    /// Some link is a socket (a round may pass some by).
    pub(super) sockets: bool,
}

impl State {
    /// The state over `links` (one per rank, `None` for this rank).
    pub fn new(
        links: Vec<Option<Link>>,
        pids: Vec<Option<i32>>,
        rank: usize,
        direct_bytes: usize,
    ) -> State {
        // An eager payload is never read direct: its send completes once
        // it has left, and a direct read needs the receiver to run first
        // (a receiver that waits for that sender before receiving would
        // never let it complete).
        let direct_bytes = direct_bytes.max(EAGER_BYTES + 1);
        let sockets = links
            .iter()
            .any(|l| l.as_ref().is_some_and(|l| !matches!(l, Link::Ring(_))));
        let peers = links
            .into_iter()
            .enumerate()
            .map(|(q, link)| Peer {
                // Frames travel with an inline payload behind them.
                ctrl_in: {
                    assert!(
                        link.as_ref().is_none_or(|l| l.takes_var_len()),
                        "point-to-point links take messages of variable length"
                    );
                    vec![0; CTRL_BYTES + Peer::inline_bytes(link.as_ref())].into_boxed_slice()
                },
                link,
                pid: pids.get(q).copied().flatten(),
                broken: None,
                outq: VecDeque::new(),
                cur: None,
                out_buf: Vec::new(),
                inbound: None,
                offers: VecDeque::new(),
                clear_wait: FxHashMap::default(),
                data_wait: FxHashMap::default(),
                credit: Credit::default(),
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
            cx: StepCx::point_to_point(
                rank,
                direct_bytes,
                if direct_bytes == usize::MAX {
                    Vec::new()
                } else {
                    vec![0; 256 << 10]
                },
            ),
            last_liveness: Instant::now(),
            longest: Duration::ZERO,
            rounds: 0,
            awaited: Vec::new(),
            sockets,
        }
    }

    /// Nothing posted and nothing in flight.
    pub fn idle(&self) -> bool {
        self.ops.is_empty() && !self.peers.iter().any(|p| p.busy())
    }

    /// Frames wait to go out on some link.
    pub fn sending(&self) -> bool {
        self.peers.iter().any(|p| p.sending())
    }

    /// The earliest deadline of a posted op.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.ops.values().filter_map(|o| o.deadline).min()
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
            let kind = post.kind;
            let peer = match kind {
                PostKind::Send { peer } => Some(peer),
                PostKind::Recv { .. } => None,
            };
            let id = self.new_op(post, peer, 0);
            match kind {
                PostKind::Send { peer } => self.post_send(id, peer),
                PostKind::Recv { src, .. } => self.post_recv(id, src),
            }
        }
    }

    /// Takes in receive `post`, matched already to an eager message of
    /// `len` bytes from `q` whose payload is coming in (a lean exchange
    /// that gives way: [`super::lean`]); returns its op.
    pub(super) fn accept_matched(&mut self, post: Post, q: usize, len: usize) -> u64 {
        let id = self.new_op(post, Some(q), len);
        self.ops.get_mut(&id).expect("just made").moving = true;
        id
    }

    /// Records `post` as a new op (its peer, and the bytes it matched, if
    /// known yet); returns its number.
    fn new_op(&mut self, post: Post, peer: Option<usize>, matched: usize) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        self.longest = self.longest.max(post.timeout);
        let op = Op {
            post,
            deadline: None,
            id: 0,
            peer,
            matched,
            moving: false,
        };
        self.ops.insert(id, op);
        id
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
                body: Body::Local(op),
            };
            return self.offer_in(peer, offer);
        }
        if self.post_eager(op, peer) {
            return;
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

    pub(super) fn next_arrival(&mut self) -> u64 {
        self.arrivals += 1;
        self.arrivals
    }

    /// The first posted receive that takes a message from `q` with `tag`,
    /// taken out of the posted list.
    pub(super) fn take_posted(&mut self, q: usize, tag: u32) -> Option<u64> {
        let i = self.posted.iter().position(|op| {
            let o = &self.ops[op];
            let PostKind::Recv { src, .. } = o.post.kind else {
                return false;
            };
            o.post.tag == tag && src.is_none_or(|s| s == q)
        })?;
        Some(self.posted.remove(i))
    }

    /// A message from `q` arrived: the first posted receive that takes it,
    /// or the queue of unmatched messages.
    pub(super) fn offer_in(&mut self, q: usize, offer: Offer) {
        match self.take_posted(q, offer.tag) {
            Some(op) => self.matched(op, q, offer),
            None => self.peers[q].offers.push_back(offer),
        }
    }

    /// Receive `op` matched a message of `len` bytes from `q`: records
    /// where it came from (the status it completes with), and returns the
    /// error if the message does not fit.
    pub(super) fn check_fit(&mut self, op: u64, q: usize, len: usize) -> Result<()> {
        let o = self.ops.get_mut(&op).expect("posted");
        let PostKind::Recv { exact, .. } = o.post.kind else {
            unreachable!("only receives match messages");
        };
        let (buf, tag) = (o.post.len, o.post.tag);
        o.peer = Some(q);
        o.matched = len;
        if len > buf || (exact && len != buf) {
            return Err(Error::SizeMismatch {
                rank: self.rank,
                peer: q,
                tag,
                message: len,
                buffer: buf,
            });
        }
        Ok(())
    }

    /// Receive `op` matched `offer` from `q`.
    fn matched(&mut self, op: u64, q: usize, offer: Offer) {
        let fit = self.check_fit(op, q, offer.len);
        let buf = self.ops[&op].post.len;
        match (offer.body, fit) {
            (Body::Local(s), Err(e)) => {
                self.finish(s, Err(e.clone()));
                self.finish(op, Err(e));
            }
            (Body::Local(s), Ok(())) => {
                let (from, to) = (self.ops[&s].post.ptr, self.ops[&op].post.ptr);
                // SAFETY: both buffers are valid until their ops complete,
                // and a receive's never overlaps another op's (the posters'
                // promise); offer.len <= the receive's length (checked).
                unsafe { std::ptr::copy_nonoverlapping(from, to, offer.len) };
                self.finish(s, Ok(()));
                self.finish(op, Ok(()));
            }
            (Body::Eager(data), fit) => self.eager_matched(op, q, &data, fit),
            (Body::Rendezvous, Err(e)) => {
                let mut c = Ctrl::new(Kind::Refuse, offer.id);
                c.aux = buf as u64;
                self.peers[q]
                    .outq
                    .push_back(Out::Ctrl(Box::new(c.encode()), None));
                self.finish(op, Err(e));
            }
            (Body::Rendezvous, Ok(())) if offer.len == 0 => self.finish(op, Ok(())),
            (Body::Rendezvous, Ok(())) => {
                self.ops.get_mut(&op).expect("posted").moving = true;
                let p = &mut self.peers[q];
                p.data_wait.insert(offer.id, Some(op));
                p.outq.push_back(Out::Ctrl(
                    Box::new(Ctrl::new(Kind::Clear, offer.id).encode()),
                    None,
                ));
            }
        }
    }

    /// Completes `op` with `r` and forgets it. A receive that matched a
    /// message also says what it got, whether or not it fit.
    pub(super) fn finish(&mut self, op: u64, r: Result<()>) {
        if let Some(o) = self.ops.remove(&op) {
            let status = match (o.post.kind, o.peer) {
                (PostKind::Recv { .. }, Some(source)) => Some(RecvStatus {
                    source,
                    tag: o.post.tag,
                    bytes: o.matched,
                }),
                _ => None,
            };
            o.post.done.get().complete_with(r, status);
        }
    }
}
