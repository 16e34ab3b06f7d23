//! Sub-communicators: [`Communicator::split`] and [`Communicator::new_group`].
//!
//! A split is collective over the parent. The ranks swap (color, key) with
//! an AllGather on the parent, then connect each new group using the parent
//! itself to swap addresses and segment names (no trip to the master). Each
//! sub-communicator has its own links (rings in a fresh segment, its own
//! sockets), so ops on parent and child never interleave on a wire.

use super::Communicator;
use crate::bootstrap::{self, Exchange};
use crate::engine::Core;
use crate::error::{Error, Result};
use crate::topo::Topology;
use crate::transport::shm::{DirectRead, RingLink, Segment};
use crate::transport::{Link, LinkOps, TransportKind};
use crate::ReduceOp;
use std::sync::Arc;
use std::time::Instant;

/// [`Exchange`] over an existing communicator (AllGather of lengths, then of padded bytes).
struct CommExchange<'a>(&'a Communicator);

impl Exchange for CommExchange<'_> {
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let c = self.0;
        let n = c.size();
        let mut lens = vec![0u64; n];
        c.all_gather(&[mine.len() as u64], &mut lens)?;
        let max = lens.iter().copied().max().unwrap_or(0) as usize;
        let mut buf = mine.to_vec();
        buf.resize(max, 0);
        let mut all = vec![0u8; max * n];
        c.all_gather(&buf, &mut all)?;
        Ok((0..n)
            .map(|q| all[q * max..q * max + lens[q] as usize].to_vec())
            .collect())
    }

    fn barrier(&mut self) -> Result<()> {
        self.0.barrier()
    }
}

impl Communicator {
    /// Splits this communicator, like `MPI_Comm_split` / `ncclCommSplit`.
    ///
    /// Every rank calls it. Ranks with the same `color` form a new
    /// communicator, ranked by `key` (ties broken by the parent rank); ranks
    /// passing `None` get `None` back.
    ///
    /// ```
    /// # use tutti::Communicator;
    /// let comms = Communicator::init_all(4).unwrap();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             // Even and odd ranks in two groups of two.
    ///             let sub = c.split(Some((c.rank() % 2) as u32), c.rank() as i64).unwrap().unwrap();
    ///             assert_eq!(sub.size(), 2);
    ///             assert_eq!(sub.rank(), c.rank() / 2);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let n = self.size();
        let mine = [color.map_or(-1, |c| c as i64), key];
        let mut all = vec![0i64; 2 * n];
        self.all_gather(&mine, &mut all)?;
        let members: Option<Vec<usize>> = color.map(|c| {
            let mut m: Vec<usize> = (0..n).filter(|&q| all[2 * q] == c as i64).collect();
            m.sort_by_key(|&q| (all[2 * q + 1], q));
            m
        });
        if self
            .topo
            .transports
            .iter()
            .all(|t| matches!(t, None | Some(TransportKind::Local)))
        {
            return self.split_local(members);
        }
        let deadline = crate::config::deadline_after(Instant::now(), self.config.connect_timeout);
        let ip = self
            .ip
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let conn = {
            let mut ex = CommExchange(self);
            bootstrap::connect(
                &mut ex,
                self.rank(),
                members.as_deref(),
                &self.config,
                self.token,
                ip,
                deadline,
            )?
        };
        let (Some(conn), Some(members)) = (conn, members) else {
            return Ok(None);
        };
        let rank = members
            .iter()
            .position(|&q| q == self.rank())
            .expect("a member of its group");
        let ranks_here = conn.ranks_on_machine;
        let mut core = Core::new(
            conn.links,
            conn.peer_pids,
            rank,
            self.config.clone(),
            ranks_here,
            conn.segment,
            conn.io,
        );
        core.tune = super::tune_ctx(&conn.topo, &self.config, false);
        crate::engine::keep_rescue(&mut core, conn.rescue.as_ref());
        let rescue = conn.rescue.map(|l| (l, conn.peer_addrs));
        let (engine, p2p) = super::start(
            core,
            conn.p2p_links,
            &conn.topo,
            &self.config,
            ranks_here,
            false,
        );
        Ok(Some(Communicator {
            engine,
            p2p,
            rank,
            size: members.len(),
            topo: conn.topo,
            config: self.config.clone(),
            _store: None,
            _client: None,
            token: self.token,
            ip: self.ip,
            rescue,
        }))
    }

    /// A communicator of `ranks` (parent ranks, in new-rank order), like
    /// `torch.distributed.new_group`. Every rank of the parent calls it with
    /// the same list; ranks not in it get `None`.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<Communicator>> {
        let n = self.size();
        if let Some(&bad) = ranks.iter().find(|&&r| r >= n) {
            return Err(Error::arg(format!(
                "new_group: rank {bad} is not in this communicator of {n} ranks"
            )));
        }
        let mut seen = vec![false; n];
        for &r in ranks {
            if std::mem::replace(&mut seen[r], true) {
                return Err(Error::arg(format!("new_group: rank {r} is listed twice")));
            }
        }
        // Make sure every rank passed the same list (a cheap fingerprint).
        let fp = ranks.iter().fold(ranks.len() as u64, |h, &r| {
            h.wrapping_mul(1_000_003).wrapping_add(r as u64 + 1)
        });
        let mut lo = [fp];
        let mut hi = [fp];
        self.all_reduce(&mut lo, ReduceOp::Min)?;
        self.all_reduce(&mut hi, ReduceOp::Max)?;
        if lo != hi {
            return Err(Error::arg(
                "new_group: ranks passed different lists; every rank must pass the same ranks",
            ));
        }
        let pos = ranks.iter().position(|&r| r == self.rank());
        self.split(pos.map(|_| 0), pos.map_or(0, |p| p as i64))
    }

    /// Split for thread ranks: the group's first member makes a heap segment
    /// and hands a reference to each member through the parent.
    fn split_local(&self, members: Option<Vec<usize>>) -> Result<Option<Communicator>> {
        let my = members
            .as_ref()
            .and_then(|m| m.iter().position(|&q| q == self.rank()));
        let mut out = Vec::new();
        if let (Some(m), Some(0)) = (&members, my) {
            let seg = Segment::heap(m.len(), self.config.ring_bytes);
            for _ in 0..m.len() {
                out.extend_from_slice(&(Arc::into_raw(seg.clone()) as u64).to_le_bytes());
            }
        }
        let all = CommExchange(self).allgather(&out)?;
        let (Some(members), Some(rank)) = (members, my) else {
            return Ok(None);
        };
        let from_leader = &all[members[0]];
        let raw = u64::from_le_bytes(
            from_leader[8 * rank..8 * rank + 8]
                .try_into()
                .expect("8 bytes"),
        );
        // The leader is a thread of this process (the parent is local-only).
        // SAFETY: the leader made this pointer with Arc::into_raw, one
        // reference per member; each member takes exactly its own entry once.
        let seg: Arc<Segment> = unsafe { Arc::from_raw(raw as *const Segment) };
        let m = members.len();
        let ring = |chan: usize| -> Vec<Option<Link>> {
            (0..m)
                .map(|q| {
                    (q != rank).then(|| {
                        Link::Ring(RingLink::on_channel(
                            seg.clone(),
                            chan,
                            rank,
                            q,
                            DirectRead::Memcpy,
                        ))
                    })
                })
                .collect()
        };
        let (links, p2p_links) = (ring(0), ring(crate::transport::shm::P2P_CHANNEL));
        let mut topo = Topology::from_host_ids(&vec![String::from("local"); m]);
        topo.transports = links.iter().map(|l| l.as_ref().map(|l| l.kind())).collect();
        let mut core = Core::new(
            links,
            vec![None; m],
            rank,
            self.config.clone(),
            m,
            Some((seg, rank)),
            None,
        );
        core.tune = super::tune_ctx(&topo, &self.config, true);
        let (engine, p2p) = super::start(core, p2p_links, &topo, &self.config, m, true);
        Ok(Some(Communicator {
            engine,
            p2p,
            rank,
            size: m,
            topo,
            config: self.config.clone(),
            _store: None,
            _client: None,
            token: self.token,
            ip: None,
            rescue: None,
        }))
    }
}
