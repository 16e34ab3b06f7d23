//! Reading a timed run's flight recorder: every rank's trace
//! (`tutti-trace-rank<R>.json`, written with `TUTTI_TRACE_DIR` set, see
//! [`recorder`](super::recorder)) turned into a [`Report`]: time in
//! communication per collective and size class, the bus bandwidth each
//! reached against its link's limit, who arrived last and by how much
//! (stragglers), where the algorithm that ran differs from the cost
//! model's best, and what-ifs priced from the measured times.
//!
//! Ops are matched across ranks by sequence number (collectives only: a
//! rank's sends and receives are its own). Calls under 64 KiB are timed
//! one in 16 ([`SAMPLE`](super::recorder::SAMPLE)): a group's times are
//! the timed calls' scaled to all its calls. For each timed op on every rank:
//! *arrival*, the latest start over the ranks; its *own time*, the latest
//! end less the arrival (what the collective took once everyone was
//! there); each rank's *wait*, the arrival less its own start. The last
//! rank to start is the op's straggler; its lateness is how long after the
//! second-last it started.
//!
//! Links: the cost model each rank recorded (calibrated at start-up, or
//! the defaults), ranks placed on hosts as recorded, every rank's stream
//! between hosts at the model's TCP rate (as the run-time tuner sees
//! them), unless the caller describes the links ([`Links`], `tutti
//! explain --cluster`). Prices come from the fabric simulation
//! ([`crate::tune::fabric`]) that `tutti sim` uses, each algorithm with its
//! best pipeline chunk count.

mod price;

use super::recorder::{OpState, Trace};
use crate::algo::{CollKind, Wire};
use crate::tune::fabric::Fabric;
use crate::tune::CostModel;
use price::{recorded_links, Pricer};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Links to price a run on, instead of the ones its traces recorded.
#[derive(Clone, Debug)]
pub struct Links {
    /// What to call them in the report (a cluster file's name).
    pub name: String,
    /// Cost-model parameters.
    pub model: CostModel,
    /// Hosts, ports and switch (its rank count must be the run's).
    pub fabric: Fabric,
    /// The bus-bandwidth limit of one rank, GB/s (utilization's 100%).
    pub limit_gbps: f64,
}

/// Reads every rank's trace in `dir`: an error names the file that is
/// unreadable or not a trace, or the rank whose file is missing.
pub fn read_traces(dir: &Path) -> Result<Vec<Trace>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut traces = Vec::new();
    for e in entries {
        let p = e.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("tutti-trace-rank") && name.ends_with(".json") {
            let b = std::fs::read(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            let t: Trace = serde_json::from_slice(&b)
                .map_err(|e| format!("{}: not a tutti trace: {e}", p.display()))?;
            if !t.timed {
                return Err(format!(
                    "{}: its ops were not timed (a failure's record; run with TUTTI_TRACE_DIR set)",
                    p.display()
                ));
            }
            traces.push(t);
        }
    }
    if traces.is_empty() {
        return Err(format!(
            "{}: no tutti-trace-rank*.json files (run with TUTTI_TRACE_DIR={0})",
            dir.display()
        ));
    }
    traces.sort_by_key(|t| t.rank);
    let size = traces[0].size;
    for r in 0..size {
        let file = dir.join(format!("tutti-trace-rank{r}.json"));
        match traces.iter().filter(|t| t.rank == r).count() {
            1 => {}
            0 => return Err(format!("{}: missing (rank {r} of {size})", file.display())),
            _ => return Err(format!("{}: rank {r} appears twice", dir.display())),
        }
    }
    if let Some(t) = traces.iter().find(|t| t.size != size || t.rank >= size) {
        return Err(format!(
            "{}: rank {} of {} ranks, but rank 0's trace has {size} ranks (traces of two runs?)",
            dir.join(format!("tutti-trace-rank{}.json", t.rank))
                .display(),
            t.rank,
            t.size
        ));
    }
    Ok(traces)
}

/// What [`explain`] found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Ranks.
    pub ranks: usize,
    /// Hosts.
    pub hosts: usize,
    /// The links of rank 0 (`shm`, `tcp`, `shm+tcp`, `local`).
    pub transport: String,
    /// Where the links' numbers come from.
    pub links: String,
    /// One rank's bus-bandwidth limit, GB/s: between hosts, a rank's share
    /// of its host's ports (or its stream, if less); on one host, its
    /// shared-memory copy rate.
    pub link_limit_gbps: f64,
    /// Collectives seen on every rank, done.
    pub ops: usize,
    /// Of which timed on every rank.
    pub timed_ops: usize,
    /// From the first start to the last end, microseconds.
    pub span_us: f64,
    /// Time in collectives per rank (start to end, averaged over ranks), us.
    pub comm_us: f64,
    /// Of which waiting for the last rank to arrive, us.
    pub wait_us: f64,
    /// Per collective and size class.
    pub groups: Vec<Group>,
    /// Who arrived last.
    pub stragglers: Stragglers,
    /// Calls whose algorithm differs from the model's best.
    pub differ: Vec<Differ>,
    /// What would help, from the measured times.
    pub what_ifs: Vec<WhatIf>,
    /// Ops left out, and why.
    pub notes: Vec<String>,
}

/// One collective and size class.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    /// Collective (`all_reduce`, ...).
    pub collective: String,
    /// `small (< 64 KiB)`, `medium (64 KiB - 4 MiB)`, `large (>= 4 MiB)`.
    pub size_class: String,
    /// Calls.
    pub calls: usize,
    /// Of which timed (the times below are theirs, scaled to all calls).
    pub timed_calls: usize,
    /// Largest timed call, bytes (as `tutti perf` counts a size).
    pub bytes: u64,
    /// Time in these calls per rank (average over ranks), us.
    pub comm_us: f64,
    /// Of which waiting for the last rank, us.
    pub wait_us: f64,
    /// Median own time (after the last rank arrived) of the largest calls, us.
    pub own_us: f64,
    /// Their bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// `busbw_gbps` over the link's limit.
    pub of_link: f64,
    /// The algorithm the largest calls ran (the most frequent).
    pub algorithm: String,
    /// Whether it was forced (not Auto's pick).
    pub forced: bool,
    /// The model's time for that algorithm on the links, us.
    pub model_us: Option<f64>,
    /// The model's best algorithm (`name/chunks` where pipelined).
    pub model_best: Option<String>,
    /// Its predicted time, us.
    pub model_best_us: Option<f64>,
}

/// Who arrived last at the collectives.
#[derive(Clone, Debug, Serialize)]
pub struct Stragglers {
    /// Ops compared.
    pub ops: usize,
    /// Per rank.
    pub ranks: Vec<Late>,
    /// The rank last most often, if it was last in more than 1.5 times
    /// its fair share (1 / ranks) of the ops.
    pub straggler: Option<usize>,
}

/// How often one rank was last, and by how much.
#[derive(Clone, Debug, Serialize)]
pub struct Late {
    /// The rank.
    pub rank: usize,
    /// Ops at which it started last.
    pub last: usize,
    /// `last` over all ops compared.
    pub share: f64,
    /// Median lateness when last (after the second-last), us.
    pub median_late_us: f64,
    /// Largest lateness, us.
    pub max_late_us: f64,
    /// Its own waiting for others over the timed collectives, us.
    pub waited_us: f64,
}

/// A call where the algorithm that ran is not the model's best.
#[derive(Clone, Debug, Serialize)]
pub struct Differ {
    /// Collective.
    pub collective: String,
    /// Bytes.
    pub bytes: u64,
    /// What ran, and whether it was forced.
    pub ran: String,
    /// Forced (not Auto's pick).
    pub forced: bool,
    /// Its measured own time (median), us.
    pub measured_us: f64,
    /// The model's time for it, us.
    pub model_us: f64,
    /// The model's best.
    pub best: String,
    /// Its predicted time, us.
    pub best_us: f64,
}

/// One what-if.
#[derive(Clone, Debug, Serialize)]
pub struct WhatIf {
    /// What changes.
    pub what: String,
    /// Time saved per rank over the traced ops, us (the measured own
    /// times scaled by the model's ratio, or measured waiting).
    pub saved_us: f64,
    /// `saved_us` over the time in collectives.
    pub of_comm: f64,
}

/// Size classes of the report (by `tutti perf`'s size).
pub fn size_class(bytes: u64) -> &'static str {
    match bytes {
        0..65536 => "small (< 64 KiB)",
        65536..4194304 => "medium (64 KiB - 4 MiB)",
        _ => "large (>= 4 MiB)",
    }
}

/// The bus-bandwidth factor of nccl-tests (`busbw = algbw * factor`).
pub fn bus_factor(k: CollKind, n: usize) -> f64 {
    let n = n as f64;
    match k {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter => (n - 1.0) / n,
        CollKind::Broadcast | CollKind::Reduce | CollKind::SendRecv => 1.0,
        CollKind::Barrier => 0.0,
    }
}

/// One op as every rank saw it.
struct Op {
    kind: CollKind,
    root: usize,
    count: usize,
    elem: usize,
    dtype: String,
    redop: String,
    /// As `tutti perf` counts a size.
    size: u64,
    algorithm: String,
    forced: bool,
    /// Timed on every rank (else `starts` and `ends` are empty).
    timed: bool,
    starts: Vec<f64>,
    ends: Vec<f64>,
}

impl Op {
    fn arrival(&self) -> f64 {
        self.starts.iter().copied().fold(f64::MIN, f64::max)
    }
    fn own_us(&self) -> f64 {
        (self.ends.iter().copied().fold(f64::MIN, f64::max) - self.arrival()).max(0.0)
    }
}

/// Reads `dir` ([`read_traces`]) and explains it ([`report`]).
pub fn explain(dir: &Path, links: Option<&Links>) -> Result<Report, String> {
    report(&read_traces(dir)?, links)
}

/// The ops every rank ran, in sequence order, with what was left out.
fn match_ops(traces: &[Trace], notes: &mut Vec<String>) -> Vec<Op> {
    let n = traces.len();
    let mut by_seq: BTreeMap<u64, Vec<&super::recorder::OpRecord>> = BTreeMap::new();
    for t in traces {
        for o in &t.ops {
            by_seq.entry(o.seq).or_default().push(o);
        }
    }
    let (mut partial, mut p2p, mut mismatched, mut undone, mut some) = (0, 0, 0, 0, 0);
    let mut ops = Vec::new();
    for recs in by_seq.values() {
        if recs.len() != n {
            partial += 1;
            continue;
        }
        let first = recs[0];
        let Ok(kind) = first.op.parse::<CollKind>() else {
            mismatched += 1;
            continue;
        };
        if kind == CollKind::SendRecv {
            p2p += 1;
            continue;
        }
        if recs
            .iter()
            .any(|o| o.op != first.op || o.count != first.count || o.dtype != first.dtype)
        {
            mismatched += 1;
            continue;
        }
        if recs.iter().any(|o| o.state != OpState::Done) {
            undone += 1;
            continue;
        }
        let timed = recs
            .iter()
            .all(|o| o.start_ns != 0 && o.end_ns >= o.start_ns);
        if !timed && recs.iter().any(|o| o.start_ns != 0) {
            some += 1;
            continue;
        }
        let elem = first
            .dtype
            .parse::<crate::DataType>()
            .map_or(1, |d| d.size());
        let blocks = matches!(
            kind,
            CollKind::AllGather
                | CollKind::ReduceScatter
                | CollKind::AllToAll
                | CollKind::Gather
                | CollKind::Scatter
        );
        let size = (first.count * elem * if blocks { n } else { 1 }) as u64;
        // Times relative to the first op's first start, in microseconds
        // (f64 keeps nanoseconds over days).
        ops.push(Op {
            kind,
            root: first.root_or_peer.unwrap_or(0),
            count: first.count,
            elem,
            dtype: first.dtype.clone(),
            redop: first.redop.clone(),
            size,
            algorithm: first.algorithm.clone(),
            forced: first.forced,
            timed,
            starts: recs
                .iter()
                .filter(|_| timed)
                .map(|o| o.start_ns as f64 / 1e3)
                .collect(),
            ends: recs
                .iter()
                .filter(|_| timed)
                .map(|o| o.end_ns as f64 / 1e3)
                .collect(),
        });
    }
    let mut note = |k: usize, why: &str| {
        if k > 0 {
            notes.push(format!("{k} op(s) left out: {why}"));
        }
    };
    note(
        partial,
        "not in every rank's trace (each keeps its last 4096 ops)",
    );
    note(p2p, "sends and receives (not collectives)");
    note(mismatched, "the ranks disagree on the op (a mismatch)");
    note(undone, "not done on every rank (running or failed)");
    note(some, "timed on some ranks only (their sizes differ)");
    ops
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Explains `traces` (one per rank, as [`read_traces`] returns them).
pub fn report(traces: &[Trace], links: Option<&Links>) -> Result<Report, String> {
    let mut notes = Vec::new();
    let ops = match_ops(traces, &mut notes);
    let n = traces.len();
    let (recorded, threads) = recorded_links(traces)?;
    let links = match links {
        Some(l) if l.fabric.host_of.len() != n => {
            return Err(format!(
                "the links describe {} ranks, the run has {n}",
                l.fabric.host_of.len()
            ))
        }
        Some(l) => l,
        None => &recorded,
    };
    let hosts = links.fabric.nhosts();
    let pricer = Pricer { links, threads };
    let all: Vec<&Op> = ops.iter().filter(|o| o.timed).collect();
    let t0 = all
        .iter()
        .flat_map(|o| o.starts.iter().copied())
        .fold(f64::MAX, f64::min);
    let t1 = all
        .iter()
        .flat_map(|o| o.ends.iter().copied())
        .fold(f64::MIN, f64::max);
    let per_rank = |f: &dyn Fn(&Op, usize) -> f64, ops: &[&Op]| {
        ops.iter()
            .map(|o| (0..n).map(|r| f(o, r)).sum::<f64>())
            .sum::<f64>()
            / n as f64
    };
    let comm = |o: &Op, r: usize| o.ends[r] - o.starts[r];
    let wait = |o: &Op, r: usize| o.arrival() - o.starts[r];
    let (mut comm_us, mut wait_us) = (0.0, 0.0);

    // Groups, by collective and size class, in order of first appearance.
    let mut keys: Vec<(CollKind, &'static str)> = Vec::new();
    for o in &ops {
        let k = (o.kind, size_class(o.size));
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut groups = Vec::new();
    let mut differ = Vec::new();
    // Per what-if, the saving.
    let mut saved: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut model_differs = false;
    for (kind, cl) in keys {
        let calls = ops
            .iter()
            .filter(|o| o.kind == kind && size_class(o.size) == cl)
            .count();
        let g: Vec<&Op> = all
            .iter()
            .copied()
            .filter(|o| o.kind == kind && size_class(o.size) == cl)
            .collect();
        if g.is_empty() {
            groups.push(Group {
                collective: kind.name().into(),
                size_class: cl.into(),
                calls,
                timed_calls: 0,
                bytes: 0,
                comm_us: 0.0,
                wait_us: 0.0,
                own_us: 0.0,
                busbw_gbps: 0.0,
                of_link: 0.0,
                algorithm: String::new(),
                forced: false,
                model_us: None,
                model_best: None,
                model_best_us: None,
            });
            continue;
        }
        // The timed calls stand for all the class's calls.
        let scale = calls as f64 / g.len() as f64;
        let big_size = g.iter().map(|o| o.size).max().unwrap_or(0);
        let big: Vec<&Op> = g.iter().copied().filter(|o| o.size == big_size).collect();
        // The most frequent algorithm among the largest calls.
        let mut algs: BTreeMap<&str, usize> = BTreeMap::new();
        for o in &big {
            *algs.entry(&o.algorithm).or_default() += 1;
        }
        let alg = algs
            .iter()
            .max_by_key(|(_, c)| **c)
            .map(|(a, _)| a.to_string())
            .unwrap_or_default();
        let rep = big
            .iter()
            .copied()
            .find(|o| o.algorithm == alg)
            .expect("a group has calls");
        let own = median(&mut big.iter().map(|o| o.own_us()).collect::<Vec<_>>());
        let busbw = if own > 0.0 {
            big_size as f64 / own / 1e3 * bus_factor(kind, n)
        } else {
            0.0
        };
        let model_us = pricer.ran(rep, None);
        let best = pricer.best(rep);
        let own_total: f64 = scale * g.iter().map(|o| o.own_us()).sum::<f64>();
        let (gc, gw) = (scale * per_rank(&comm, &g), scale * per_rank(&wait, &g));
        comm_us += gc;
        wait_us += gw;
        if let (Some(m), Some((b, bus))) = (model_us, &best) {
            if *bus < m * 0.97 {
                model_differs = true;
                differ.push(Differ {
                    collective: kind.name().into(),
                    bytes: big_size,
                    ran: alg.clone(),
                    forced: rep.forced,
                    measured_us: own,
                    model_us: m,
                    best: b.clone(),
                    best_us: *bus,
                });
                *saved.entry("best").or_default() += own_total * (1.0 - bus / m);
            }
        }
        // Link what-ifs: the same algorithm on changed links.
        if let Some(m) = model_us.filter(|m| *m > 0.0) {
            let mut priced = |what: &'static str, l: Links| {
                let p = Pricer { links: &l, threads };
                if let Some(x) = p.ran(rep, None) {
                    *saved.entry(what).or_default() += own_total * (1.0 - x / m).max(0.0);
                }
            };
            let base = links.clone();
            if hosts > 1 {
                let mut l = base.clone();
                l.model.tcp.gbps *= 2.0;
                l.fabric.port_gbps *= 2.0;
                priced("net2x", l);
            }
            let mut l = base.clone();
            for c in [&mut l.model.shm, &mut l.model.local] {
                c.gbps *= 2.0;
            }
            l.model.copy_gbps *= 2.0;
            l.model.reduce_gbps *= 2.0;
            priced("mem2x", l);
            let mut l = base.clone();
            for c in [&mut l.model.shm, &mut l.model.local, &mut l.model.tcp] {
                c.alpha_us /= 2.0;
            }
            l.model.step_us /= 2.0;
            l.model.mailbox_us /= 2.0;
            priced("lat2x", l);
            let wire_ok = matches!(
                kind,
                CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
            ) && rep.dtype == "f32"
                && (rep.redop == "sum" || rep.redop == "avg");
            if wire_ok {
                if let Some(x) = pricer.ran(rep, Some(Wire::Bf16)) {
                    *saved.entry("bf16").or_default() += own_total * (1.0 - x / m).max(0.0);
                }
            }
        }
        groups.push(Group {
            collective: kind.name().into(),
            size_class: cl.into(),
            calls,
            timed_calls: g.len(),
            bytes: big_size,
            comm_us: gc,
            wait_us: gw,
            own_us: own,
            busbw_gbps: busbw,
            of_link: if links.limit_gbps > 0.0 {
                busbw / links.limit_gbps
            } else {
                0.0
            },
            algorithm: alg,
            forced: rep.forced,
            model_us,
            model_best: best.as_ref().map(|b| b.0.clone()),
            model_best_us: best.map(|b| b.1),
        });
    }

    // Stragglers.
    let mut lates: Vec<Vec<f64>> = vec![Vec::new(); n];
    for o in &all {
        if n < 2 {
            break;
        }
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| o.starts[a].total_cmp(&o.starts[b]));
        let last = idx[n - 1];
        lates[last].push(o.starts[last] - o.starts[idx[n - 2]]);
    }
    let compared = if n < 2 { 0 } else { all.len() };
    let ranks: Vec<Late> = (0..n)
        .map(|r| {
            let mut v = lates[r].clone();
            Late {
                rank: traces[r].rank,
                last: v.len(),
                share: if compared > 0 {
                    v.len() as f64 / compared as f64
                } else {
                    0.0
                },
                max_late_us: v.iter().copied().fold(0.0, f64::max),
                median_late_us: median(&mut v),
                waited_us: all.iter().map(|o| wait(o, r)).sum(),
            }
        })
        .collect();
    let straggler = ranks
        .iter()
        .max_by_key(|l| l.last)
        .filter(|l| compared > 0 && l.share > 1.5 / n as f64)
        .map(|l| l.rank);

    let mut what_ifs = Vec::new();
    let mut push = |what: String, s: f64| {
        if s > 0.0 {
            what_ifs.push(WhatIf {
                what,
                saved_us: s,
                of_comm: if comm_us > 0.0 { s / comm_us } else { 0.0 },
            });
        }
    };
    push(
        "no stragglers: every rank starts each collective on time".into(),
        wait_us,
    );
    let names = [
        ("best", "the model's best algorithm for every call"),
        ("net2x", "a 2x faster network (level 1)"),
        ("mem2x", "2x faster memory within hosts (level 0)"),
        ("lat2x", "every latency halved"),
        ("bf16", "bf16 on the wire for f32 sums"),
    ];
    for (k, what) in names {
        if k == "best" && !model_differs {
            continue;
        }
        push(what.into(), saved.get(k).copied().unwrap_or(0.0));
    }
    what_ifs.sort_by(|a, b| b.saved_us.total_cmp(&a.saved_us));
    Ok(Report {
        ranks: n,
        hosts,
        transport: traces[0].links.clone(),
        links: links.name.clone(),
        link_limit_gbps: links.limit_gbps,
        ops: ops.len(),
        timed_ops: all.len(),
        span_us: if all.is_empty() { 0.0 } else { t1 - t0 },
        comm_us,
        wait_us,
        groups,
        stragglers: Stragglers {
            ops: compared,
            ranks,
            straggler,
        },
        differ,
        what_ifs,
        notes,
    })
}
