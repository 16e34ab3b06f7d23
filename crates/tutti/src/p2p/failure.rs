//! When point-to-point goes wrong: deadlines, peers that die, links out of
//! step, abort. Every op that can no longer complete fails, naming the
//! peer it waited for.

use super::peer::{Dest, Inbound, Out};
use super::progress::State;
use super::PostKind;
use crate::error::Error;
use crate::transport::{Link, LinkOps};
use std::time::{Duration, Instant};

/// How often peers with pending messages are checked for life.
const LIVENESS_EVERY: Duration = Duration::from_millis(50);

impl State {
    /// The pair's link is out of step or gone: every op that involves `q`
    /// fails with `e`, now and later. A send whose buffer the peer may be
    /// reading is withdrawn first.
    pub(super) fn break_peer(&mut self, q: usize, e: Error) {
        let p = &mut self.peers[q];
        if p.broken.is_some() {
            return;
        }
        p.broken = Some(e.clone());
        let mut fail: Vec<u64> = Vec::new();
        if let Some((out, m)) = p.cur.take() {
            if let Some(l) = &p.link {
                l.withdraw(&m, p.pid);
            }
            if let Out::Ctrl(_, Some(op)) | Out::Payload(op) | Out::Eager(op) | Out::Inline(op) =
                out
            {
                fail.push(op);
            }
        }
        for out in p.outq.drain(..) {
            if let Out::Ctrl(_, Some(op)) | Out::Payload(op) | Out::Eager(op) | Out::Inline(op) =
                out
            {
                fail.push(op);
            }
        }
        fail.extend(p.clear_wait.drain().map(|(_, op)| op));
        fail.extend(p.data_wait.drain().filter_map(|(_, op)| op));
        p.credit.drain();
        if let Some(Inbound::Payload(_, Dest::Recv(op) | Dest::EagerRecv(op, _), _)) =
            p.inbound.take()
        {
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
        // A link that breaks with nothing on it is most often a peer that
        // exited when its job was done: later ops on it fail with `e`, and
        // the log says so only at debug level, not as a warning at every
        // healthy job's end.
        if fail.is_empty() {
            tracing::debug!(
                rank = self.rank,
                peer = q,
                "point-to-point link closed while idle: {e}"
            );
        } else {
            tracing::warn!(
                rank = self.rank,
                peer = q,
                failed_ops = fail.len(),
                "point-to-point link broken: {e}"
            );
        }
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
        let mut late = Vec::new();
        for (&op, o) in self.ops.iter_mut() {
            let d = *o
                .deadline
                .get_or_insert_with(|| crate::config::deadline_after(now, o.post.timeout));
            if d <= now {
                late.push(op);
            }
        }
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
            self.break_if_lost(q);
        }
    }

    /// Breaks the pair with `q` if `q` is known to be lost.
    fn break_if_lost(&mut self, q: usize) {
        let p = &self.peers[q];
        if let Some(msg) = crate::transport::wait::peer_lost(q, p.link.as_ref(), p.pid) {
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

    /// Closing: breaks the links of peers, still holding eager messages of
    /// ours, whose process is gone (at most every [`LIVENESS_EVERY`]).
    pub fn check_closing(&mut self, now: Instant) {
        if now.duration_since(self.last_liveness) < LIVENESS_EVERY {
            return;
        }
        self.last_liveness = now;
        for q in 0..self.peers.len() {
            let p = &self.peers[q];
            if p.broken.is_some() || !p.credit.outstanding() {
                continue;
            }
            self.break_if_lost(q);
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
            // No byte of it is moving: forget it. A later Clear of a
            // rendezvous send is answered with Cancel; a receive was not
            // matched yet. (An eager send is moving until it completes.)
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
        let receiving = self.peers.iter().any(|p| {
            matches!(p.inbound, Some(Inbound::Payload(_, Dest::Recv(x) | Dest::EagerRecv(x, _), _)) if x == op)
        });
        if !receiving {
            for p in &mut self.peers {
                if let Some(slot) = p.data_wait.values_mut().find(|v| **v == Some(op)) {
                    *slot = None;
                    return self.finish(op, Err(e));
                }
            }
        }
        let q = o.peer.expect("a moving op has its peer");
        self.break_peer(q, e.clone());
        // A pair broken before would have failed the op then; should one
        // be left over all the same, it ends here, not never.
        self.finish(op, Err(e));
    }
}
