//! The cost model: prices a schedule by running every rank's steps through
//! a timed simulation.
//!
//! Each message costs `alpha + bytes / bandwidth` of its link class; a
//! reducing receive moves at most at the reduction rate; local copies and
//! reductions cost `bytes / rate`. A step starts when its dependencies are
//! done; a message starts when both sides have reached it and both ranks'
//! ports are free: one port per direction for TCP, where the wire is the
//! bottleneck; for shared memory the port is the rank's CPU, which copies
//! every byte it sends into the ring and every byte it receives out of it,
//! one thing at a time. The two are separate: a rank's shared-memory copies
//! overlap its network transfers (the kernel moves TCP bytes while the rank
//! works on its host's data), which is what a pipelined hierarchical
//! schedule relies on; the ranks of a host share its network link. A fused
//! step forwards after one `alpha`, so chains pipeline. The predicted time
//! is the latest finish over all ranks. Because the model is a pure function of the
//! problem, the topology and the parameters, every rank predicts the same
//! and so picks the same algorithm.

use crate::algo::{Algorithm, Problem, Schedule, Step};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// The class of the link between two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkClass {
    /// Threads of one process.
    Local,
    /// Processes on one host.
    Shm,
    /// Different hosts (or TCP forced).
    Tcp,
}

/// Latency and bandwidth of one link class.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkCost {
    /// Fixed cost of a message, microseconds.
    pub alpha_us: f64,
    /// Bandwidth, GB/s (10^9 bytes per second).
    pub gbps: f64,
}

/// The parameters of the cost model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Threads of one process.
    pub local: LinkCost,
    /// Shared memory between processes.
    pub shm: LinkCost,
    /// TCP.
    pub tcp: LinkCost,
    /// Reduction rate, GB/s of incoming data.
    pub reduce_gbps: f64,
    /// Local copy rate, GB/s.
    pub copy_gbps: f64,
    /// Fixed cost of every step a rank runs, microseconds.
    pub step_us: f64,
    /// Fixed cost of a one-shot mailbox op among the ranks of one host
    /// (publish, one flag transfer, the op's software path), microseconds.
    #[serde(default = "default_mailbox_us")]
    pub mailbox_us: f64,
    /// Rate at which a rank copies its contribution into its mailbox slot
    /// and reads its peers' out of theirs, GB/s: the slots are small and
    /// stay in cache, so where every rank has a core this is well above the
    /// rings' streaming rate.
    #[serde(default = "default_mailbox_gbps")]
    pub mailbox_gbps: f64,
    /// Rate at which a rank reduces its peers' contributions straight out
    /// of their mailbox slots, GB/s of incoming data.
    #[serde(default = "default_mailbox_reduce_gbps")]
    pub mailbox_reduce_gbps: f64,
}

fn default_mailbox_us() -> f64 {
    0.2
}

fn default_mailbox_gbps() -> f64 {
    40.0
}

fn default_mailbox_reduce_gbps() -> f64 {
    40.0
}

impl Default for CostModel {
    /// Defaults measured on a 2-core KVM guest (AMD EPYC, Zen 3): shared
    /// memory 0.3 us / 8 GB/s, TCP over loopback 15 us / 1.8 GB/s.
    fn default() -> Self {
        CostModel {
            local: LinkCost {
                alpha_us: 0.25,
                gbps: 10.0,
            },
            shm: LinkCost {
                alpha_us: 0.3,
                gbps: 8.0,
            },
            tcp: LinkCost {
                alpha_us: 15.0,
                gbps: 1.8,
            },
            reduce_gbps: 8.0,
            copy_gbps: 12.0,
            step_us: 0.05,
            mailbox_us: default_mailbox_us(),
            mailbox_gbps: default_mailbox_gbps(),
            mailbox_reduce_gbps: default_mailbox_reduce_gbps(),
        }
    }
}

/// Bytes up to which a local step ([`Step::Copy`], [`Step::Reduce`]) is
/// priced at the in-cache rates: its operands fit in a core's L2 cache with
/// room for a second rank's, so it does not stream through memory.
pub const CACHED_STEP_BYTES: usize = 1 << 20;

impl CostModel {
    /// The cost of `class`.
    pub fn link(&self, class: LinkClass) -> LinkCost {
        match class {
            LinkClass::Local => self.local,
            LinkClass::Shm => self.shm,
            LinkClass::Tcp => self.tcp,
        }
    }

    /// Time of local step `st` (a copy, a reduction, an Avg's division or
    /// a 16-bit wire's conversion) of `bytes`, in microseconds; 0 for
    /// other steps.
    ///
    /// Up to [`CACHED_STEP_BYTES`] a local step works in cache, at the rates
    /// the mailboxes measured (`mailbox_gbps`, `mailbox_reduce_gbps`: small
    /// copies and reductions, with every rank at work), where those are
    /// faster than the streaming rates. Two-shot's own-block reduction is
    /// such a step: priced at the streaming rate, it made two-shot look
    /// slower than halving-doubling at 128 KiB to 1 MiB, where with 4 ranks
    /// on 2 cores it is the faster.
    pub fn local_us(&self, st: &Step, bytes: f64) -> f64 {
        let cached = bytes <= CACHED_STEP_BYTES as f64;
        let gbps = match st {
            // A division is one pass over its bytes, as a copy is.
            Step::Copy { .. } | Step::Scale { .. } if cached => {
                self.copy_gbps.max(self.mailbox_gbps)
            }
            Step::Copy { .. } | Step::Scale { .. } => self.copy_gbps,
            // A 16-bit wire's conversions (their data-type bytes): a
            // narrowing, widening or rounding is a pass like a copy, a
            // widening reduction one like a reduction.
            Step::Narrow { .. } | Step::Widen { .. } | Step::Round { .. } if cached => {
                self.copy_gbps.max(self.mailbox_gbps)
            }
            Step::Narrow { .. } | Step::Widen { .. } | Step::Round { .. } => self.copy_gbps,
            Step::Reduce { .. } | Step::WidenReduce { .. } if cached => {
                self.reduce_gbps.max(self.mailbox_reduce_gbps)
            }
            Step::Reduce { .. } | Step::WidenReduce { .. } => self.reduce_gbps,
            _ => return 0.0,
        };
        bytes / gbps / 1e3
    }
}

/// Predicted time of the direct algorithm over mailboxes
/// (`transport/mailbox.rs`, one-shot calls): `mailbox_us`, then the largest
/// contribution copied into its slot, then the most any rank reads out of
/// the peers' slots, each byte once: copying at `mailbox_gbps`, reducing
/// at `mailbox_reduce_gbps`; an Avg's division as in a schedule. `None`
/// if the call does not fit a slot, or travels on a 16-bit wire.
pub fn predict_mailbox(model: &CostModel, p: &Problem, elem: usize) -> Option<f64> {
    use crate::algo::Collective as C;
    let n = p.nranks;
    let b = (p.count * elem) as f64;
    let publish = crate::sizes::contribution(p.coll, n, p.count * elem)?;
    // A 16-bit wire runs its lowered schedule, never the mailboxes.
    if p.vcounts.is_some() || p.wire.is_some() || publish > crate::transport::mailbox::MBOX_BYTES {
        return None;
    }
    let publish = publish as f64;
    let others = (n - 1) as f64 * b;
    let (read, reduces) = match p.coll {
        C::AllReduce | C::ReduceScatter | C::Reduce { .. } => (others, true),
        C::AllGather | C::AllToAll | C::Gather { .. } => (others, false),
        C::Broadcast { .. } | C::Scatter { .. } => (b, false),
        C::Barrier => (0.0, false),
        C::AllToAllV | C::Send { .. } | C::Recv { .. } => return None,
    };
    let g = model.mailbox_gbps;
    let rg = if reduces {
        model.mailbox_reduce_gbps
    } else {
        g
    };
    // An Avg ends with the division every schedule of it ends with (on
    // the root of a Reduce: the rank that finishes last).
    let last = p.coll.root().unwrap_or(p.rank);
    let mean = crate::algo::frame::mean(p.coll, n, last, p.count)
        .filter(|_| p.avg)
        .map_or(0.0, |s| model.local_us(&s, b));
    Some(model.mailbox_us + publish / g / 1e3 + read / rg / 1e3 + mean)
}

/// Builds every rank's schedule of `p` (one [`Problem`] per rank derived
/// from `p`) with `alg` and predicts its time in microseconds, or `None` if
/// `alg` does not implement the collective.
pub fn predict(
    model: &CostModel,
    p: &Problem,
    alg: Algorithm,
    elem: usize,
    class: &dyn Fn(usize, usize) -> LinkClass,
) -> Option<f64> {
    if p.vcounts.is_some() && p.nranks > 1 {
        // Other ranks' AllToAllV counts are unknown here: assume this rank's shape.
        return predict_one(model, p, alg, elem, class);
    }
    let scheds = schedules(p, alg)?;
    Some(simulate(model, &scheds, elem, class, p.hosts.as_deref()))
}

/// Every rank's schedule of `p` (one [`Problem`] per rank derived from
/// `p`), or `None` if `alg` does not implement the collective.
pub fn schedules(p: &Problem, alg: Algorithm) -> Option<Vec<Schedule>> {
    (0..p.nranks)
        .map(|r| {
            alg.build(&Problem {
                rank: r,
                ..p.clone()
            })
        })
        .collect()
}

/// [`predict`] plus `extra` times the hand-offs on the critical path
/// ([`handoffs`]), from one build of every rank's schedule: the price where
/// a host's ranks share cores (see `tune::price`). One host only.
pub fn predict_shared(
    model: &CostModel,
    p: &Problem,
    alg: Algorithm,
    elem: usize,
    class: &dyn Fn(usize, usize) -> LinkClass,
    ring_bytes: usize,
    extra: f64,
) -> Option<f64> {
    let scheds = schedules(p, alg)?;
    let t = simulate(model, &scheds, elem, class, None);
    Some(t + extra * handoffs(model, &scheds, elem, class, ring_bytes))
}

/// [`predict`] plus the processor time of every TCP message of every
/// rank's schedule, shared by `cores`: the price where a host's ranks
/// share cores over sockets (see `tune::price`). A message over loopback
/// costs about its `alpha` of processor time (the system calls at both
/// ends and the receiver's wake-up), which the simulation charges only to
/// the critical path, as if every rank had a core of its own; with 4 ranks
/// on 2 cores, a small AllReduce's 12 direct messages took 36-52 us a call
/// where the tree's 6 took 31-40 (8 B-16 KiB, medians of 5 rounds,
/// 2026-12-07), though the tree waits for 4 hand-offs in a row and direct
/// for one. One host only.
pub fn predict_sockets_shared(
    model: &CostModel,
    p: &Problem,
    alg: Algorithm,
    elem: usize,
    class: &dyn Fn(usize, usize) -> LinkClass,
    cores: f64,
) -> Option<f64> {
    let scheds = schedules(p, alg)?;
    let t = simulate(model, &scheds, elem, class, None);
    let messages = scheds
        .iter()
        .enumerate()
        .flat_map(|(r, s)| s.steps.iter().map(move |st| (r, st)))
        .filter(|(r, st)| {
            st.send_peer()
                .is_some_and(|q| class(*r, q) == LinkClass::Tcp)
        })
        .count();
    Some(t + messages as f64 * model.tcp.alpha_us / cores.max(1.0))
}

/// The hand-offs on the critical path of `scheds` (every rank's schedule,
/// on one host), in microseconds: their time when a message costs only its
/// `alpha`, plus one more per `ring_bytes` of it (a sender that fills its
/// ring waits for the receiver to drain it), and local work is free.
pub fn handoffs(
    model: &CostModel,
    scheds: &[Schedule],
    elem: usize,
    class: &dyn Fn(usize, usize) -> LinkClass,
    ring_bytes: usize,
) -> f64 {
    let mut lat = *model;
    let per_handoff = ring_bytes.max(1) as f64 / 1e3;
    lat.shm.gbps = per_handoff / lat.shm.alpha_us.max(1e-3);
    lat.local.gbps = per_handoff / lat.local.alpha_us.max(1e-3);
    // Local work is free: every rate `CostModel::local_us` may take.
    lat.copy_gbps = f64::INFINITY;
    lat.reduce_gbps = f64::INFINITY;
    lat.mailbox_gbps = f64::INFINITY;
    lat.mailbox_reduce_gbps = f64::INFINITY;
    simulate(&lat, scheds, elem, class, None)
}

/// A cheaper estimate from `p.rank`'s schedule alone, assuming every peer is
/// ready when this rank is (used for very large rank counts).
pub fn predict_one(
    model: &CostModel,
    p: &Problem,
    alg: Algorithm,
    elem: usize,
    class: &dyn Fn(usize, usize) -> LinkClass,
) -> Option<f64> {
    let s = alg.build(p)?;
    let mut finish = vec![0f64; s.steps.len()];
    let mut port = 0f64;
    for (i, st) in s.steps.iter().enumerate() {
        let ready = s.deps[i]
            .iter()
            .map(|&d| finish[d as usize])
            .fold(0.0, f64::max)
            + model.step_us;
        let bytes = s.step_bytes(i, elem) as f64;
        let t = match *st {
            _ if st.converts() => ready + model.local_us(st, bytes),
            Step::Copy { .. } | Step::Reduce { .. } | Step::Scale { .. } => {
                ready + model.local_us(st, bytes)
            }
            Step::Fence => ready,
            _ => {
                let peer = st.send_peer().or(st.recv_peer()).unwrap_or(p.rank);
                let l = model.link(class(p.rank, peer));
                let mut bw = l.gbps;
                if st.reduces() {
                    bw = bw.min(model.reduce_gbps);
                }
                let start = ready.max(port);
                port = start + bytes / bw / 1e3;
                start + l.alpha_us + bytes / bw / 1e3
            }
        };
        finish[i] = t;
    }
    Some(finish.into_iter().fold(0.0, f64::max))
}

struct RankSim<'a> {
    s: &'a Schedule,
    /// Time each step became ready (deps done), once known.
    ready: Vec<Option<f64>>,
    /// Finish time of each half: receive and send.
    recv_fin: Vec<Option<f64>>,
    send_fin: Vec<Option<f64>>,
    /// Start of each step's receive (for fused forwarding).
    recv_start: Vec<Option<f64>>,
    fin: Vec<Option<f64>>,
    sendq: Vec<VecDeque<usize>>,
    recvq: Vec<VecDeque<usize>>,
    /// Shared memory: messages to each peer whose send half is done, as
    /// (step, send start, send end), waiting for the peer to drain them.
    inflight: Vec<VecDeque<(usize, f64, f64)>>,
    /// Shared memory: when this rank's CPU is next free.
    cpu_free: f64,
    /// TCP: when this rank's outgoing and incoming ports are next free.
    out_free: f64,
    in_free: f64,
}

fn simulate(
    model: &CostModel,
    scheds: &[Schedule],
    elem: usize,
    class: &dyn Fn(usize, usize) -> LinkClass,
    hosts: Option<&[usize]>,
) -> f64 {
    let n = scheds.len();
    // Every host's network link, each way: the ranks of a host share it.
    let nhosts = hosts.map_or(0, |h| h.iter().copied().max().map_or(0, |m| m + 1));
    let mut nic = Nics {
        host_of: hosts.unwrap_or(&[]),
        out_free: vec![0.0; nhosts],
        in_free: vec![0.0; nhosts],
    };
    let mut rs: Vec<RankSim> = scheds
        .iter()
        .map(|s| {
            let k = s.steps.len();
            let mut sendq = vec![VecDeque::new(); n];
            let mut recvq = vec![VecDeque::new(); n];
            for (i, st) in s.steps.iter().enumerate() {
                if let Some(q) = st.send_peer() {
                    sendq[q].push_back(i);
                }
                if let Some(q) = st.recv_peer() {
                    recvq[q].push_back(i);
                }
            }
            RankSim {
                s,
                ready: vec![None; k],
                recv_fin: vec![None; k],
                send_fin: vec![None; k],
                recv_start: vec![None; k],
                fin: vec![None; k],
                sendq,
                recvq,
                inflight: vec![VecDeque::new(); n],
                cpu_free: 0.0,
                out_free: 0.0,
                in_free: 0.0,
            }
        })
        .collect();
    loop {
        let mut progress = false;
        for r in rs.iter_mut() {
            for i in 0..r.s.steps.len() {
                if r.ready[i].is_some() {
                    continue;
                }
                let mut t = 0f64;
                let mut ok = true;
                for &d in &r.s.deps[i] {
                    match r.fin[d as usize] {
                        Some(f) => t = t.max(f),
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok {
                    continue;
                }
                let t = t + model.step_us;
                r.ready[i] = Some(t);
                progress = true;
                let bytes = r.s.step_bytes(i, elem) as f64;
                match r.s.steps[i] {
                    st if st.converts() => r.fin[i] = Some(t + model.local_us(&st, bytes)),
                    st @ (Step::Copy { .. } | Step::Reduce { .. } | Step::Scale { .. }) => {
                        r.fin[i] = Some(t + model.local_us(&st, bytes))
                    }
                    Step::Fence => r.fin[i] = Some(t),
                    _ => {}
                }
            }
        }
        // Sends first: a rank's CPU starts what it can send before it
        // turns to what it receives (the rings take the data meanwhile).
        for pass in 0..2 {
            for a in 0..n {
                for b in 0..n {
                    if a == b {
                        continue;
                    }
                    let l = model.link(class(a, b));
                    progress |= match (class(a, b), pass) {
                        (LinkClass::Tcp, 0) => tcp_message(model, &mut rs, &mut nic, a, b, l, elem),
                        (LinkClass::Tcp, _) => false,
                        (_, 0) => shm_send_half(&mut rs, a, b, l, elem),
                        _ => shm_recv_half(model, &mut rs, a, b, l, elem),
                    };
                }
            }
        }
        if !progress {
            break;
        }
    }
    rs.iter()
        .flat_map(|r| r.fin.iter().map(|f| f.unwrap_or(f64::INFINITY)))
        .fold(0.0, f64::max)
}

/// Marks step `i` of rank `x` finished once both of its halves are.
fn settle(r: &mut RankSim, i: usize) {
    let st = r.s.steps[i];
    let rf = if st.recv_peer().is_some() {
        r.recv_fin[i]
    } else {
        Some(0.0)
    };
    let sf = if st.send_peer().is_some() {
        r.send_fin[i]
    } else {
        Some(0.0)
    };
    if let (Some(rf), Some(sf)) = (rf, sf) {
        r.fin[i] = Some(rf.max(sf));
    }
}

/// Shared memory, sending side: on one host, moving bytes is CPU work. The
/// sender copies its message into the ring at the stream rate as soon as
/// the step is ready (the ring decouples it from the receiver); a fused
/// forward starts one `alpha` after its own receive did and interleaves
/// with it, so chains pipeline, but its CPU work still adds up.
fn shm_send_half(rs: &mut [RankSim], a: usize, b: usize, l: LinkCost, elem: usize) -> bool {
    let Some(&si) = rs[a].sendq[b].front() else {
        return false;
    };
    let Some(ready) = rs[a].ready[si] else {
        return false;
    };
    let st = rs[a].s.steps[si];
    let s_busy = rs[a].s.step_bytes(si, elem) as f64 / l.gbps / 1e3;
    let (s_start, s_end) = if matches!(st, Step::Send { .. }) {
        let s_start = ready.max(rs[a].cpu_free);
        (s_start, s_start + s_busy)
    } else {
        let (Some(rst), Some(rfin)) = (rs[a].recv_start[si], rs[a].recv_fin[si]) else {
            return false;
        };
        let s_start = rst + l.alpha_us;
        (s_start, (rs[a].cpu_free + s_busy).max(rfin + l.alpha_us))
    };
    rs[a].cpu_free = rs[a].cpu_free.max(s_start) + s_busy;
    rs[a].sendq[b].pop_front();
    rs[a].inflight[b].push_back((si, s_start, s_end));
    rs[a].send_fin[si] = Some(s_end);
    settle(&mut rs[a], si);
    true
}

/// Shared memory, receiving side: the receiver drains (copies or reduces)
/// a message once its step is ready, its CPU is free and the data has
/// started to arrive, and cannot finish before the sender has.
fn shm_recv_half(
    model: &CostModel,
    rs: &mut [RankSim],
    a: usize,
    b: usize,
    l: LinkCost,
    elem: usize,
) -> bool {
    let (Some(&(_, s_start, s_end)), Some(&ri)) =
        (rs[a].inflight[b].front(), rs[b].recvq[a].front())
    else {
        return false;
    };
    let Some(ready) = rs[b].ready[ri] else {
        return false;
    };
    let st = rs[b].s.steps[ri];
    let mut bw = l.gbps;
    if st.reduces() {
        bw = bw.min(model.reduce_gbps);
    }
    let busy = rs[b].s.step_bytes(ri, elem) as f64 / bw / 1e3;
    let r_start = ready.max(rs[b].cpu_free).max(s_start + l.alpha_us);
    let r_end = (r_start + busy).max(s_end + l.alpha_us);
    // The CPU works for `busy`; waiting for the sender leaves it free.
    rs[b].cpu_free = r_start + busy;
    rs[a].inflight[b].pop_front();
    rs[b].recvq[a].pop_front();
    rs[b].recv_start[ri] = Some(r_start);
    rs[b].recv_fin[ri] = Some(r_end);
    settle(&mut rs[b], ri);
    true
}

/// The network links of the hosts (when ranks span several).
struct Nics<'a> {
    host_of: &'a [usize],
    /// When each host's outgoing and incoming link is next free.
    out_free: Vec<f64>,
    in_free: Vec<f64>,
}

impl Nics<'_> {
    /// The hosts of `a` and `b` if they differ (the message crosses the network).
    fn crossing(&self, a: usize, b: usize) -> Option<(usize, usize)> {
        let (ha, hb) = (*self.host_of.get(a)?, *self.host_of.get(b)?);
        (ha != hb).then_some((ha, hb))
    }
}

/// A TCP message: it starts when both sides have reached it and the
/// sender's outgoing and the receiver's incoming ports are free (the wire
/// is the bottleneck) — between hosts, the ports of the hosts' links, which
/// all their ranks share — and a forward leaves one `alpha` after its own
/// receive started.
fn tcp_message(
    model: &CostModel,
    rs: &mut [RankSim],
    nic: &mut Nics,
    a: usize,
    b: usize,
    l: LinkCost,
    elem: usize,
) -> bool {
    let (Some(&si), Some(&ri)) = (rs[a].sendq[b].front(), rs[b].recvq[a].front()) else {
        return false;
    };
    let (Some(sr), Some(rr)) = (rs[a].ready[si], rs[b].ready[ri]) else {
        return false;
    };
    let sstep = rs[a].s.steps[si];
    let s_avail = if matches!(sstep, Step::Send { .. }) {
        sr
    } else {
        match rs[a].recv_start[si] {
            Some(t) => t + l.alpha_us,
            None => return false,
        }
    };
    let bytes = rs[a].s.step_bytes(si, elem) as f64;
    let mut bw = l.gbps;
    if rs[b].s.steps[ri].reduces() {
        bw = bw.min(model.reduce_gbps);
    }
    let cross = nic.crossing(a, b);
    let mut start = s_avail.max(rr).max(rs[a].out_free).max(rs[b].in_free);
    if let Some((ha, hb)) = cross {
        start = start.max(nic.out_free[ha]).max(nic.in_free[hb]);
    }
    let busy = bytes / bw / 1e3;
    let mut end = start + l.alpha_us + busy;
    if !matches!(sstep, Step::Send { .. }) {
        // The forward cannot finish before its own input has arrived.
        end = end.max(rs[a].recv_fin[si].unwrap_or(end) + l.alpha_us);
    }
    rs[a].out_free = start + busy;
    rs[b].in_free = start + busy;
    if let Some((ha, hb)) = cross {
        nic.out_free[ha] = start + busy;
        nic.in_free[hb] = start + busy;
    }
    rs[a].sendq[b].pop_front();
    rs[b].recvq[a].pop_front();
    rs[a].send_fin[si] = Some(end);
    rs[b].recv_fin[ri] = Some(end);
    rs[b].recv_start[ri] = Some(start);
    settle(&mut rs[a], si);
    settle(&mut rs[b], ri);
    true
}
