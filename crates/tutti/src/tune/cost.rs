//! The cost model: prices a schedule by running every rank's steps through
//! a timed simulation.
//!
//! Each message costs `alpha + bytes / bandwidth` of its link class; a
//! reducing receive moves at most at the reduction rate; local copies and
//! reductions cost `bytes / rate`. A step starts when its dependencies are
//! done; a message starts when both sides have reached it and both ranks'
//! ports are free (one port per direction for TCP, one shared port for
//! shared memory, where the rank's own CPU does the copying). A fused step
//! forwards after one `alpha`, so chains pipeline. The predicted time is the
//! latest finish over all ranks. Because the model is a pure function of the
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
        }
    }
}

impl CostModel {
    /// The cost of `class`.
    pub fn link(&self, class: LinkClass) -> LinkCost {
        match class {
            LinkClass::Local => self.local,
            LinkClass::Shm => self.shm,
            LinkClass::Tcp => self.tcp,
        }
    }
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
    let n = p.nranks;
    let mut scheds = Vec::with_capacity(n);
    for r in 0..n {
        let mut q = p.clone();
        q.rank = r;
        if q.vcounts.is_some() && r != p.rank {
            // Other ranks' AllToAllV counts are unknown here: assume this rank's shape.
            return predict_one(model, p, alg, elem, class);
        }
        scheds.push(alg.build(&q)?);
    }
    Some(simulate(model, &scheds, elem, class))
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
        let bytes = (st.len() * elem) as f64;
        let t = match *st {
            Step::Copy { .. } => ready + bytes / model.copy_gbps / 1e3,
            Step::Reduce { .. } => ready + bytes / model.reduce_gbps / 1e3,
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
    out_free: f64,
    in_free: f64,
}

fn simulate(
    model: &CostModel,
    scheds: &[Schedule],
    elem: usize,
    class: &dyn Fn(usize, usize) -> LinkClass,
) -> f64 {
    let n = scheds.len();
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
                let bytes = (r.s.steps[i].len() * elem) as f64;
                match r.s.steps[i] {
                    Step::Copy { .. } => r.fin[i] = Some(t + bytes / model.copy_gbps / 1e3),
                    Step::Reduce { .. } => r.fin[i] = Some(t + bytes / model.reduce_gbps / 1e3),
                    Step::Fence => r.fin[i] = Some(t),
                    _ => {}
                }
            }
        }
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                let (Some(&si), Some(&ri)) = (rs[a].sendq[b].front(), rs[b].recvq[a].front())
                else {
                    continue;
                };
                let (Some(sr), Some(rr)) = (rs[a].ready[si], rs[b].ready[ri]) else {
                    continue;
                };
                let sstep = rs[a].s.steps[si];
                // A forward can leave once its own receive has started and one alpha passed.
                let s_avail = if matches!(sstep, Step::Send { .. }) {
                    sr
                } else {
                    match rs[a].recv_start[si] {
                        Some(t) => t + model.link(class(a, b)).alpha_us,
                        None => continue,
                    }
                };
                let l = model.link(class(a, b));
                let bytes = (sstep.len() * elem) as f64;
                let mut bw = l.gbps;
                let rstep = rs[b].s.steps[ri];
                if rstep.reduces() {
                    bw = bw.min(model.reduce_gbps);
                }
                let shared = class(a, b) != LinkClass::Tcp;
                let (a_port, b_port) = if shared {
                    (
                        rs[a].out_free.max(rs[a].in_free),
                        rs[b].in_free.max(rs[b].out_free),
                    )
                } else {
                    (rs[a].out_free, rs[b].in_free)
                };
                let start = s_avail.max(rr).max(a_port).max(b_port);
                let busy = bytes / bw / 1e3;
                let mut end = start + l.alpha_us + busy;
                if !matches!(sstep, Step::Send { .. }) {
                    // The forward cannot finish before its own input has arrived.
                    end = end.max(rs[a].recv_fin[si].unwrap_or(end) + l.alpha_us);
                }
                if shared {
                    // Half the copy work on each side (sender into the ring, receiver out).
                    rs[a].out_free = start + busy / 2.0;
                    rs[b].in_free = start + busy / 2.0;
                } else {
                    rs[a].out_free = start + busy;
                    rs[b].in_free = start + busy;
                }
                rs[a].sendq[b].pop_front();
                rs[b].recvq[a].pop_front();
                rs[a].send_fin[si] = Some(end);
                rs[b].recv_fin[ri] = Some(end);
                rs[b].recv_start[ri] = Some(start);
                for (x, i) in [(a, si), (b, ri)] {
                    let st = rs[x].s.steps[i];
                    let need_recv = st.recv_peer().is_some();
                    let need_send = st.send_peer().is_some();
                    let rf = if need_recv {
                        rs[x].recv_fin[i]
                    } else {
                        Some(0.0)
                    };
                    let sf = if need_send {
                        rs[x].send_fin[i]
                    } else {
                        Some(0.0)
                    };
                    if let (Some(rf), Some(sf)) = (rf, sf) {
                        rs[x].fin[i] = Some(rf.max(sf));
                    }
                }
                progress = true;
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
