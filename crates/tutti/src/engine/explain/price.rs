//! Prices a run's calls on its links: the links the traces recorded, and
//! every algorithm (with its best pipeline chunk count) by the rule
//! `tutti sim` uses too ([`crate::tune::fabric_price`]).

use super::{Links, Op};
use crate::algo::{Algorithm, Problem, Wire};
use crate::engine::recorder::Trace;
use crate::tune::fabric::{Fabric, SimStats};
use crate::tune::fabric_price;

/// The links the traces recorded (see the module's comment).
pub(super) fn recorded_links(traces: &[Trace]) -> Result<(Links, bool), String> {
    let t = &traces[0];
    let model = t.model.ok_or_else(|| {
        "the traces carry no cost model (written by an older tutti): pass the cluster".to_string()
    })?;
    let n = t.size;
    let host_of = if t.host_of.len() == n {
        t.host_of.clone()
    } else {
        vec![0; n]
    };
    let hosts = host_of.iter().max().map_or(1, |h| h + 1);
    let mut local_rank = vec![0; n];
    let mut seen = vec![0; hosts];
    for r in 0..n {
        local_rank[r] = seen[host_of[r]];
        seen[host_of[r]] += 1;
    }
    let per_host = seen.iter().copied().max().unwrap_or(1);
    let limit = if hosts > 1 {
        model.tcp.gbps
    } else if t.threads {
        model.local.gbps
    } else {
        model.shm.gbps
    };
    Ok((
        Links {
            name: "calibrated (recorded in the traces)".into(),
            model,
            fabric: Fabric {
                host_of,
                local_rank,
                ports: 1,
                port_gbps: model.tcp.gbps * per_host as f64,
                oversub: 1.0,
                burst_bytes: 0.0,
            },
            limit_gbps: limit,
        },
        t.threads,
    ))
}

/// Prices calls on one set of links.
pub(super) struct Pricer<'a> {
    pub links: &'a Links,
    pub threads: bool,
}

impl Pricer<'_> {
    /// The problem `op` poses with `chunks` and `wire`, or `None` for
    /// sends and receives.
    fn problem(&self, op: &Op, chunks: usize, wire: Option<Wire>) -> Option<Problem> {
        let f = &self.links.fabric;
        let coll = op.kind.with_root(op.root)?;
        let mut p = Problem::new(coll, f.host_of.len(), 0, op.count);
        p.chunks = chunks;
        p.wire = wire;
        let many_hosts = f.host_of.iter().any(|&h| h != f.host_of[0]);
        p.hosts = (many_hosts && !self.threads).then(|| f.host_of.clone().into());
        Some(p)
    }

    /// `alg` on `p` as it stands, if it implements it and finishes.
    fn price(&self, p: &Problem, elem: usize, alg: Algorithm) -> Option<SimStats> {
        let l = self.links;
        fabric_price::price(&l.model, &l.fabric, self.threads, p, elem, alg)
            .filter(|s| s.us.is_finite())
    }

    /// `alg` with its best chunk count (the rule `tutti sim` and the tuner
    /// share: a finer cut must win by 3%): `(us, chunks)`.
    pub fn best_chunks(&self, op: &Op, alg: Algorithm, wire: Option<Wire>) -> Option<(f64, usize)> {
        let p = self.problem(op, 1, wire)?;
        let x = fabric_price::best_chunks(&p, op.elem, alg, |q| self.price(q, op.elem, alg))?;
        Some((x.stats.us, x.chunks))
    }

    /// The model's best algorithm for `op`: `(label, us)`.
    pub fn best(&self, op: &Op) -> Option<(String, f64)> {
        let n = self.links.fabric.host_of.len();
        let among: Vec<Algorithm> = Algorithm::VARIANTS
            .iter()
            .copied()
            .filter(|&a| n <= 256 || (a != Algorithm::Direct && a != Algorithm::TwoShot))
            .collect();
        let p = self.problem(op, 1, None)?;
        let v = fabric_price::rank(&among, |a| {
            fabric_price::best_chunks(&p, op.elem, a, |q| self.price(q, op.elem, a))
        });
        // Auto's rule, slacks included, so a near tie is not reported as a
        // better algorithm than the one Auto runs.
        let best = fabric_price::auto_pick(&v, &self.links.fabric)?;
        let label = if best.chunks > 1 {
            format!("{}/{}", best.alg, best.chunks)
        } else {
            best.alg.to_string()
        };
        Some((label, best.stats.us))
    }

    /// The algorithm that ran, priced (its best chunk count).
    pub fn ran(&self, op: &Op, wire: Option<Wire>) -> Option<f64> {
        let alg: Algorithm = op.algorithm.parse().ok()?;
        Some(self.best_chunks(op, alg, wire)?.0)
    }
}
