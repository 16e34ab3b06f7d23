//! The cost model on a described cluster: every rank's schedule run through
//! an event-driven timed simulation in which the ranks of a host share its
//! network ports (NICs) and the hosts share an oversubscribed switch.
//!
//! The rules per message are those of [`super::cost`]: a message
//! costs `alpha + bytes / bandwidth` of its link class, a reducing receive
//! moves at most at the reduction rate, local copies and reductions cost
//! [`CostModel::local_us`], every step `step_us`, and a fused step forwards
//! one `alpha` after its own receive started, so chains pipeline. What this
//! adds is contention, the resources a message holds while it moves:
//!
//! * between ranks of one host (shared memory, or threads), the CPUs: the
//!   sender's copies the message into the ring, the receiver's copies (or
//!   reduces) it out, each one thing at a time, the ring between them;
//! * between hosts, the sender's outgoing and the receiver's incoming
//!   socket (a rank's TCP stream runs at `model.tcp.gbps` at most), and one
//!   port of each host's link: rank `r` uses port `local_rank(r) % ports`;
//!   a port carries `port_gbps / oversub` (a switch oversubscribed `k:1`
//!   gives each host `1/k` of its ports' rate when every host sends at
//!   once, which is what a collective does).
//!
//! Unlike `cost::simulate`, which sweeps every pair of ranks until nothing
//! moves (quadratic in ranks per sweep), this one keeps a queue of the
//! messages whose both sides are ready, ordered by the time they could
//! start, so thousands of ranks simulate in seconds: each message is
//! handled once, at the time it can start, and a resource is granted first
//! come first served.

use super::cost::LinkCost;
use super::CostModel;
use crate::algo::Schedule;
use rustc_hash::FxHashMap;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

/// How the ranks of a simulated cluster are placed and connected.
#[derive(Clone, Debug, PartialEq)]
pub struct Fabric {
    /// Host of every rank.
    pub host_of: Vec<usize>,
    /// Index of every rank among the ranks of its host.
    pub local_rank: Vec<usize>,
    /// Network ports (NICs) per host, at least 1.
    pub ports: usize,
    /// Bandwidth of one port, each way, GB/s (10^9 bytes per second).
    pub port_gbps: f64,
    /// Switch oversubscription (1 = full bisection; 4 = 4:1).
    pub oversub: f64,
    /// Each port's token bucket, bytes, each way (0: none). A shaped link
    /// (a token-bucket shaper such as Linux `tbf`, or a switch port's
    /// buffer) lets up to this many bytes through at once after it was
    /// idle; on average it still carries `port_gbps / oversub`. See
    /// [`simulate`].
    pub burst_bytes: f64,
}

impl Fabric {
    /// `hosts` hosts of `per_host` ranks each, ranks numbered host by host.
    pub fn grid(hosts: usize, per_host: usize, ports: usize, port_gbps: f64, oversub: f64) -> Self {
        let n = hosts * per_host;
        Fabric {
            host_of: (0..n).map(|r| r / per_host.max(1)).collect(),
            local_rank: (0..n).map(|r| r % per_host.max(1)).collect(),
            ports: ports.max(1),
            port_gbps,
            oversub: oversub.max(1.0),
            burst_bytes: 0.0,
        }
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.host_of.len()
    }

    /// Number of hosts.
    pub fn nhosts(&self) -> usize {
        self.host_of.iter().copied().max().map_or(0, |m| m + 1)
    }
}

/// What a simulation found.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SimStats {
    /// Predicted time, microseconds: the latest finish over all ranks.
    pub us: f64,
    /// Bytes that crossed between hosts (sum over messages).
    pub net_bytes: f64,
    /// Bytes moved between ranks of one host.
    pub host_bytes: f64,
    /// Messages sent.
    pub messages: usize,
}

/// A message whose both sides are ready: `(a, si)` sends to `(b, ri)`, and
/// could start at `t`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ready {
    t: f64,
    a: u32,
    b: u32,
    si: u32,
    ri: u32,
}

impl Eq for Ready {}

impl Ord for Ready {
    fn cmp(&self, o: &Self) -> Ordering {
        // A min-heap on time; ties in rank order, so the run is deterministic.
        o.t.total_cmp(&self.t)
            .then(o.a.cmp(&self.a))
            .then(o.b.cmp(&self.b))
            .then(o.si.cmp(&self.si))
    }
}

impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// One rank's progress through its schedule.
struct Rank<'a> {
    s: &'a Schedule,
    /// Dependencies not yet finished, per step.
    waiting: Vec<u32>,
    /// Steps that depend on each step.
    dependents: Vec<Vec<u32>>,
    ready: Vec<f64>,
    recv_start: Vec<f64>,
    recv_fin: Vec<f64>,
    send_fin: Vec<f64>,
    fin: Vec<f64>,
    /// Latest finish of a step's dependencies so far.
    deps_fin: Vec<f64>,
    sendq: FxHashMap<u32, VecDeque<u32>>,
    recvq: FxHashMap<u32, VecDeque<u32>>,
    /// When this rank's CPU (same-host copies), outgoing and incoming
    /// socket are next free.
    cpu_free: f64,
    out_free: f64,
    in_free: f64,
}

const UNSET: f64 = f64::NAN;

/// Simulates every rank's schedule (`scheds[r]` is rank `r`'s) on `fabric`
/// with `model`'s link costs: `model.shm` (or `model.local` when
/// `threads`) within a host, `model.tcp` between hosts, `elem` bytes per
/// element. Returns the predicted time and the traffic; `us` is infinite
/// if the schedules deadlock (a send without its receive).
///
/// With a token bucket on the ports ([`Fabric::burst_bytes`]) the result
/// is the steady state of the call issued back to back, as `tutti perf`
/// and a training loop issue it: the call is simulated again, each port
/// starting with the tokens (or the backlog) the previous call left it,
/// from empty buckets, until the ports' state repeats (at most
/// [`BURST_ROUNDS`] calls). A call that
/// keeps its ports busy gets nothing from the bucket; one that leaves them
/// idle part of the time (latency, copies within hosts) sends a burst at
/// the stream's rate at its start.
pub fn simulate(
    model: &CostModel,
    scheds: &[Schedule],
    elem: usize,
    fabric: &Fabric,
    threads: bool,
) -> SimStats {
    let nports = fabric.nhosts() * fabric.ports.max(1);
    // Each port's "clear" time: when its bucket is empty with nothing
    // queued. Without a bucket, when it is next free.
    let mut ports = Ports {
        out: vec![0.0; nports],
        inn: vec![0.0; nports],
    };
    if fabric.burst_bytes.is_nan() || fabric.burst_bytes <= 0.0 {
        return run(model, scheds, elem, fabric, threads, &mut ports);
    }
    let rate = fabric.port_gbps / fabric.oversub.max(1.0) * 1e3; // bytes per us
    let full = -fabric.burst_bytes / rate;
    // From empty buckets: each call starts with what the one before left.
    let mut stats = SimStats::default();
    for _ in 0..BURST_ROUNDS {
        let before = (ports.out.clone(), ports.inn.clone());
        stats = run(model, scheds, elem, fabric, threads, &mut ports);
        if !stats.us.is_finite() {
            break;
        }
        // The next call starts when this one ends.
        for v in ports.out.iter_mut().chain(ports.inn.iter_mut()) {
            *v = (*v - stats.us).max(full);
        }
        let moved = (before.0.iter().zip(&ports.out))
            .chain(before.1.iter().zip(&ports.inn))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        if moved <= 1e-3 * stats.us {
            break;
        }
    }
    stats
}

/// Calls simulated back to back, at most, for the steady state of a
/// shaped link ([`simulate`]).
pub const BURST_ROUNDS: usize = 16;

/// Every port's clear time, each way: without a bucket, when it is next
/// free; with one, when the bucket would be empty (earlier: it holds
/// `(t - clear) * rate` bytes of tokens at `t`, at most the burst).
struct Ports {
    out: Vec<f64>,
    inn: Vec<f64>,
}

/// One run of the simulation from the ports' state `pp`, which it leaves
/// as the call left them.
fn run(
    model: &CostModel,
    scheds: &[Schedule],
    elem: usize,
    fabric: &Fabric,
    threads: bool,
    pp: &mut Ports,
) -> SimStats {
    let n = scheds.len();
    let mut rs: Vec<Rank> = scheds.iter().map(Rank::new).collect();
    let ports = fabric.ports.max(1);
    let (port_out, port_in) = (&mut pp.out, &mut pp.inn);
    let port_gbps = fabric.port_gbps / fabric.oversub.max(1.0);
    let burst = fabric.burst_bytes.max(0.0);
    let host = |r: usize| fabric.host_of.get(r).copied().unwrap_or(0);
    let port = |r: usize| host(r) * ports + fabric.local_rank.get(r).copied().unwrap_or(0) % ports;
    let link_of = |a: usize, b: usize| -> (LinkCost, bool) {
        if host(a) != host(b) {
            (model.tcp, true)
        } else if threads {
            (model.local, false)
        } else {
            (model.shm, false)
        }
    };
    let mut heap = BinaryHeap::new();
    let mut stats = SimStats::default();
    // Steps with no dependencies are ready at `step_us`.
    let mut newly: Vec<(usize, usize)> = Vec::new();
    for (r, x) in rs.iter().enumerate() {
        for i in 0..x.s.steps.len() {
            if x.waiting[i] == 0 {
                newly.push((r, i));
            }
        }
    }
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    loop {
        // Make steps ready, finish local ones, and note the pairs to try.
        while let Some((r, i)) = newly.pop() {
            let x = &mut rs[r];
            let t = x.deps_fin[i] + model.step_us;
            x.ready[i] = t;
            let st = x.s.steps[i];
            match (st.send_peer(), st.recv_peer()) {
                (None, None) => {
                    let bytes = (st.len() * elem) as f64;
                    finish(x, i, t + model.local_us(&st, bytes), &mut newly, r);
                }
                (s, q) => {
                    if let Some(q) = q {
                        pairs.push((q, r));
                    }
                    if let Some(s) = s {
                        pairs.push((r, s));
                    }
                }
            }
        }
        for (a, b) in pairs.drain(..) {
            if let Some(m) = candidate(&rs, a, b, &link_of) {
                heap.push(m);
            }
        }
        let Some(m) = heap.pop() else { break };
        let (a, b, si, ri) = (m.a as usize, m.b as usize, m.si as usize, m.ri as usize);
        if rs[a].sendq.get(&m.b).and_then(|q| q.front()) != Some(&m.si)
            || rs[b].recvq.get(&m.a).and_then(|q| q.front()) != Some(&m.ri)
        {
            continue; // already moved (a duplicate entry)
        }
        let (l, cross) = link_of(a, b);
        let sstep = rs[a].s.steps[si];
        let bytes = (sstep.len() * elem) as f64;
        let mut bw = l.gbps;
        if rs[b].s.steps[ri].reduces() {
            bw = bw.min(model.reduce_gbps);
        }
        let busy = bytes / bw / 1e3;
        let (start, end) = if cross {
            let (pa, pb) = (port(a), port(b));
            let start =
                m.t.max(rs[a].out_free)
                    .max(rs[b].in_free)
                    .max(port_out[pa])
                    .max(port_in[pb]);
            // Tokens in each port's bucket at `start` (none without one):
            // that many bytes pass at the stream's rate, the rest at the port's.
            let tokens = |clear: f64| {
                if burst > 0.0 {
                    ((start - clear) * port_gbps * 1e3).clamp(0.0, burst)
                } else {
                    0.0
                }
            };
            let (to, ti) = (tokens(port_out[pa]), tokens(port_in[pb]));
            let wire = (bytes - to.min(ti)).max(0.0) / port_gbps / 1e3;
            let end = start + l.alpha_us + busy.max(wire);
            rs[a].out_free = start + busy.max(wire);
            rs[b].in_free = start + busy.max(wire);
            port_out[pa] = start + (bytes - to) / port_gbps / 1e3;
            port_in[pb] = start + (bytes - ti) / port_gbps / 1e3;
            stats.net_bytes += bytes;
            (start, end)
        } else {
            // Through a ring: the sender copies in when its CPU is free,
            // the receiver copies out when its CPU is free and the data
            // has started to arrive, and finishes no sooner than the sender.
            let s_start = m.t.max(rs[a].cpu_free);
            let s_end = s_start + busy;
            rs[a].cpu_free = s_end;
            let r_start = rs[b].ready[ri]
                .max(rs[b].cpu_free)
                .max(s_start + l.alpha_us);
            rs[b].cpu_free = r_start + busy;
            stats.host_bytes += bytes;
            (r_start, (r_start + busy).max(s_end + l.alpha_us))
        };
        stats.messages += 1;
        let mut end = end;
        if sstep.recv_peer().is_some() {
            // A forward cannot finish before its own input has arrived.
            end = end.max(rs[a].recv_fin[si] + l.alpha_us);
        }
        rs[a].sendq.get_mut(&m.b).map(VecDeque::pop_front);
        rs[b].recvq.get_mut(&m.a).map(VecDeque::pop_front);
        rs[a].send_fin[si] = end;
        rs[b].recv_fin[ri] = end;
        rs[b].recv_start[ri] = start;
        settle(&mut rs[a], si, &mut newly, a);
        settle(&mut rs[b], ri, &mut newly, b);
        pairs.push((a, b));
        // A fused receive that started may now forward.
        if let Some(to) = rs[b].s.steps[ri].send_peer() {
            pairs.push((b, to));
        }
    }
    let unfinished = rs.iter().any(|x| x.fin.iter().any(|f| f.is_nan()));
    stats.us = if unfinished && n > 0 {
        f64::INFINITY
    } else {
        rs.iter()
            .flat_map(|x| x.fin.iter().copied())
            .fold(0.0, f64::max)
    };
    stats
}

impl<'a> Rank<'a> {
    fn new(s: &'a Schedule) -> Self {
        let k = s.steps.len();
        let mut dependents = vec![Vec::new(); k];
        let mut waiting = vec![0u32; k];
        for (i, ds) in s.deps.iter().enumerate() {
            waiting[i] = ds.len() as u32;
            for &d in ds {
                dependents[d as usize].push(i as u32);
            }
        }
        let mut sendq: FxHashMap<u32, VecDeque<u32>> = FxHashMap::default();
        let mut recvq: FxHashMap<u32, VecDeque<u32>> = FxHashMap::default();
        for (i, st) in s.steps.iter().enumerate() {
            if let Some(q) = st.send_peer() {
                sendq.entry(q as u32).or_default().push_back(i as u32);
            }
            if let Some(q) = st.recv_peer() {
                recvq.entry(q as u32).or_default().push_back(i as u32);
            }
        }
        Rank {
            s,
            waiting,
            dependents,
            ready: vec![UNSET; k],
            recv_start: vec![UNSET; k],
            recv_fin: vec![UNSET; k],
            send_fin: vec![UNSET; k],
            fin: vec![UNSET; k],
            deps_fin: vec![0.0; k],
            sendq,
            recvq,
            cpu_free: 0.0,
            out_free: 0.0,
            in_free: 0.0,
        }
    }
}

/// The message from `a` to `b` at the head of both queues, if both sides
/// are ready (a forward: once its own receive has started).
fn candidate(
    rs: &[Rank],
    a: usize,
    b: usize,
    link_of: &dyn Fn(usize, usize) -> (LinkCost, bool),
) -> Option<Ready> {
    let si = *rs[a].sendq.get(&(b as u32))?.front()? as usize;
    let ri = *rs[b].recvq.get(&(a as u32))?.front()? as usize;
    let (sr, rr) = (rs[a].ready[si], rs[b].ready[ri]);
    if sr.is_nan() || rr.is_nan() {
        return None;
    }
    let s_avail = if rs[a].s.steps[si].recv_peer().is_some() {
        let t = rs[a].recv_start[si];
        if t.is_nan() {
            return None;
        }
        t + link_of(a, b).0.alpha_us
    } else {
        sr
    };
    Some(Ready {
        t: s_avail.max(rr),
        a: a as u32,
        b: b as u32,
        si: si as u32,
        ri: ri as u32,
    })
}

/// Marks step `i` of `x` finished once both of its halves are.
fn settle(x: &mut Rank, i: usize, newly: &mut Vec<(usize, usize)>, r: usize) {
    let st = x.s.steps[i];
    let rf = if st.recv_peer().is_some() {
        x.recv_fin[i]
    } else {
        0.0
    };
    let sf = if st.send_peer().is_some() {
        x.send_fin[i]
    } else {
        0.0
    };
    if !rf.is_nan() && !sf.is_nan() && x.fin[i].is_nan() {
        finish(x, i, rf.max(sf), newly, r);
    }
}

/// Step `i` of rank `r` finished at `t`: its dependents that wait on
/// nothing else become ready.
fn finish(x: &mut Rank, i: usize, t: f64, newly: &mut Vec<(usize, usize)>, r: usize) {
    x.fin[i] = t;
    for k in 0..x.dependents[i].len() {
        let d = x.dependents[i][k] as usize;
        x.deps_fin[d] = x.deps_fin[d].max(t);
        x.waiting[d] -= 1;
        if x.waiting[d] == 0 {
            newly.push((r, d));
        }
    }
}
