//! The training step `tutti sim CLUSTER step` models: data-parallel SGD
//! with gradient buckets, as torch DDP and `GradSync` run it.
//!
//! A step is `accum` micro-batches of `compute_us` each (a third forward,
//! two thirds backward); gradients are synchronised once, after the last
//! backward. The gradients are cut into buckets of `bucket_bytes`; bucket
//! `i` of `k` is ready when `(i + 1) / k` of the last backward is done
//! (the backward pass produces them at an even rate) and is all-reduced
//! (or, sparsified, all-gathered as values and indices) after the bucket
//! before it, on one communicator, as calls run in issue order. With
//! overlap off every bucket waits for the end of the backward pass. Each
//! call is priced by the fabric simulation ([`super::price`]), the
//! algorithm being Auto's pick for its size unless one is forced.
//!
//! Two more terms, both measured by the user rather than modelled:
//!
//! * the framework's own cost per step (`framework_us`: one rank's step
//!   under DDP less its plain compute: flattening gradients into buckets,
//!   the one-rank AllReduce call, the division by the world size). It is
//!   charged in full after the compute and the communication, hiding
//!   nothing and hidden by nothing;
//! * on a cluster that is one machine (`shared_cores`) with fewer cores
//!   than ranks, each rank's compute and framework cost run
//!   [`Checked::compute_slowdown`] (ranks / cores) times slower.
//!
//! Scaling efficiency compares with one rank alone: its compute and
//! framework cost, on a core of its own.

use super::cluster::Checked;
use super::price::{self, Priced};
use tutti::{Algorithm, Collective};

/// A training step's shape.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Workload {
    /// Gradient elements (parameters).
    pub params: u64,
    /// Bytes of one gradient element as stored (4: f32, 2: bf16).
    pub grad_elem: usize,
    /// Bytes of one element on the wire (4: f32, 2: bf16 or f16).
    pub wire_elem: usize,
    /// One micro-batch's compute on one rank, microseconds.
    pub compute_us: f64,
    /// The framework's own cost per step on one rank, microseconds
    /// (`--step-1-ms` less the compute; 0 if not given).
    pub framework_us: f64,
    /// Bucket size, bytes of stored gradients.
    pub bucket_bytes: u64,
    /// Communication overlaps the backward pass.
    pub overlap: bool,
    /// Fraction of gradient elements sent (1: dense; 0.01: Top-1%).
    pub sparsify: f64,
    /// Micro-batches per step (gradient accumulation).
    pub accum: usize,
}

/// A predicted step.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StepTime {
    /// Compute of the step (all micro-batches), microseconds, slowed
    /// where ranks share cores.
    pub compute_us: f64,
    /// The framework's cost of the step, microseconds, slowed the same way.
    pub framework_us: f64,
    /// How much slower each rank computes than alone (1: not at all).
    pub slowdown: f64,
    /// One rank's step alone (compute and framework cost, no
    /// communication, a core of its own), microseconds.
    pub alone_us: f64,
    /// All communication, microseconds.
    pub comm_us: f64,
    /// Communication the compute does not hide, microseconds.
    pub exposed_us: f64,
    /// The step, microseconds.
    pub step_us: f64,
    /// Buckets per step.
    pub buckets: usize,
    /// The algorithm of the largest bucket.
    pub pick: Option<Priced>,
    /// Bytes that crossed between hosts per step.
    pub net_bytes: f64,
    /// Bytes moved in all (between hosts and within them) per step.
    pub all_bytes: f64,
}

impl StepTime {
    /// Communication hidden behind compute, microseconds.
    pub fn overlapped_us(&self) -> f64 {
        self.comm_us - self.exposed_us
    }

    /// Time per micro-batch, microseconds (what throughput compares).
    pub fn per_batch_us(&self, w: &Workload) -> f64 {
        self.step_us / w.accum.max(1) as f64
    }

    /// Scaling efficiency against one rank alone: its step / this step.
    pub fn efficiency(&self) -> f64 {
        if self.step_us > 0.0 {
            self.alone_us / self.step_us
        } else {
            1.0
        }
    }
}

/// A model preset: name, parameters, bytes per gradient element.
pub(crate) const MODELS: &[(&str, u64, usize)] = &[
    ("resnet50", 25_557_032, 4),
    ("bert-large", 340_000_000, 4),
    ("gpt2", 124_000_000, 4),
    ("llm-7b", 7_000_000_000, 2),
];

/// The calls of one step: (collective, count, element bytes, how many).
fn calls(w: &Workload) -> Vec<(Collective, usize, usize, usize)> {
    let per_bucket = (w.bucket_bytes / w.grad_elem.max(1) as u64).max(1);
    let full = w.params / per_bucket;
    let rest = w.params % per_bucket;
    let mut v = Vec::new();
    let mut push = |elems: u64, times: usize| {
        if times == 0 || elems == 0 {
            return;
        }
        if w.sparsify < 1.0 {
            // Top-K: every rank's values and 4-byte indices, all-gathered.
            let k = ((elems as f64 * w.sparsify).ceil() as usize).max(1);
            v.push((Collective::AllGather, k, w.wire_elem + 4, times));
        } else {
            v.push((Collective::AllReduce, elems as usize, w.wire_elem, times));
        }
    };
    push(per_bucket, full as usize);
    push(rest, 1);
    v
}

/// Predicts one step of `w` on `c`; `force` runs every call with that algorithm.
pub(crate) fn step_time(
    c: &Checked,
    w: &Workload,
    force: Option<Algorithm>,
) -> Result<StepTime, String> {
    let slowdown = c.compute_slowdown();
    let alone = w.compute_us * w.accum.max(1) as f64 + w.framework_us;
    let compute = w.compute_us * slowdown * w.accum.max(1) as f64;
    let framework = w.framework_us * slowdown;
    let calls = calls(w);
    let buckets: usize = calls.iter().map(|x| x.3).sum();
    let mut priced: Vec<(f64, usize)> = Vec::new();
    let mut pick = None;
    let (mut net, mut all) = (0.0, 0.0);
    for &(coll, count, elem, times) in &calls {
        let p = if c.nranks() == 1 {
            None
        } else {
            Some(match force {
                Some(a) => price::best_chunks(c, coll, count, elem, a)
                    .ok_or_else(|| format!("algorithm {a} does not implement {coll:?}"))?,
                None => price::auto(c, coll, count, elem)
                    .map(|x| x.0)
                    .ok_or_else(|| format!("no algorithm implements {coll:?}"))?,
            })
        };
        let us = p.map_or(0.0, |p| p.stats.us);
        if let Some(p) = p {
            net += p.stats.net_bytes * times as f64;
            all += (p.stats.net_bytes + p.stats.host_bytes) * times as f64;
            if pick.is_none() {
                pick = Some(p);
            }
        }
        priced.push((us, times));
    }
    // The buckets in order: full ones, then the rest.
    let durations: Vec<f64> = priced
        .iter()
        .flat_map(|&(us, times)| std::iter::repeat_n(us, times))
        .collect();
    let comm: f64 = durations.iter().sum();
    let last_backward = 2.0 / 3.0 * w.compute_us * slowdown;
    let bwd_start = compute - last_backward;
    let k = durations.len().max(1) as f64;
    let mut end = 0f64;
    for (i, d) in durations.iter().enumerate() {
        let ready = if w.overlap {
            bwd_start + (i + 1) as f64 / k * last_backward
        } else {
            compute
        };
        end = end.max(ready) + d;
    }
    let step = compute.max(end) + framework;
    Ok(StepTime {
        compute_us: compute,
        framework_us: framework,
        slowdown,
        alone_us: alone,
        comm_us: comm,
        exposed_us: step - compute - framework,
        step_us: step,
        buckets,
        pick,
        net_bytes: net,
        all_bytes: all,
    })
}
