//! Who the ranks are (pid and transports, gathered to all) and the header
//! `tutti perf` prints above its table.

use super::plan::{Count, PerfArgs, Plan, CAP_SECS};
use super::report;
use tutti::{Communicator, TransportKind};

/// What every rank is: pid and transports (0 none, 1 local, 2 shm, 3 tcp), gathered to all.
pub(super) struct RankInfo {
    pub(super) pid: u64,
    pub(super) transports: Vec<Option<TransportKind>>,
}

fn code(t: Option<TransportKind>) -> u64 {
    match t {
        None => 0,
        Some(TransportKind::Local) => 1,
        Some(TransportKind::Shm) => 2,
        Some(TransportKind::Tcp) => 3,
    }
}

fn uncode(c: u64) -> Option<TransportKind> {
    match c {
        1 => Some(TransportKind::Local),
        2 => Some(TransportKind::Shm),
        3 => Some(TransportKind::Tcp),
        _ => None,
    }
}

/// Every rank's pid and transports, on every rank.
pub(crate) fn gather_info(
    comm: &Communicator,
) -> tutti::Result<Vec<(u64, Vec<Option<TransportKind>>)>> {
    let n = comm.size();
    let mine: Vec<u64> = std::iter::once(std::process::id() as u64)
        .chain(comm.topology().transports.iter().map(|t| code(*t)))
        .collect();
    let mut all = vec![0u64; n * (n + 1)];
    comm.all_gather(&mine, &mut all)?;
    Ok(all
        .chunks(n + 1)
        .map(|c| (c[0], c[1..].iter().map(|&x| uncode(x)).collect()))
        .collect())
}

/// `shm`, `tcp`, `shm+tcp`: the kinds in `ts`.
pub(super) fn transport_summary(ts: &[Option<TransportKind>]) -> String {
    let mut kinds: Vec<String> = Vec::new();
    for t in ts.iter().flatten() {
        let s = t.to_string();
        if !kinds.contains(&s) {
            kinds.push(s);
        }
    }
    if kinds.is_empty() {
        "none".into()
    } else {
        kinds.join("+")
    }
}

/// The short host name of a host id (`hostname/boot/netns`).
pub(crate) fn short_host(id: &str) -> &str {
    id.split('/').next().unwrap_or(id)
}

pub(super) fn header(comm: &Communicator, a: &PerfArgs, plan: &Plan, info: &[RankInfo]) -> String {
    let topo = comm.topology();
    let n = comm.size();
    let mut h = String::new();
    let what = if plan.colls.len() == 1 {
        plan.colls[0].name()
    } else {
        "all"
    };
    let algo = match plan.algo {
        Some(x) => format!("{x} (forced with -a)"),
        None if comm.config().algo.is_empty() => "auto (tuner)".into(),
        None => format!("auto, TUTTI_ALGO={}", comm.config().algo),
    };
    let count = |c: Count, what: &str| match c {
        Count::Exact(k) => format!("{what} {k}"),
        Count::Capped(k, min) => format!(
            "{what} {k} (at least ~{} ms, at most ~{CAP_SECS} s per size)",
            min * 1e3
        ),
        Count::Timed(s) => format!("{what}: {s} s per size"),
    };
    h += &format!(
        "# tutti perf {what}: {n} ranks on {} host(s), local size {}, dtype {}, op {}, root {}\n",
        topo.hosts.len(),
        comm.local_size(),
        match plan.opts.wire {
            Some(w) => format!("{} (reductions on a {w} wire)", plan.dtype),
            None => plan.dtype.to_string(),
        },
        plan.op,
        plan.root
    );
    h += &format!(
        "#   sizes {} .. {} x{}, {}, {}, check {}, algorithm {}\n#\n",
        report::human_bytes(plan.sizes[0] as u64),
        report::human_bytes(*plan.sizes.last().expect("at least one size") as u64),
        a.stepfactor,
        count(plan.warmup, "warm-up"),
        count(plan.iters, "iters"),
        if plan.check { "on" } else { "off" },
        algo
    );
    if let Some(ns) = super::measure::api_overhead_ns() {
        h += &format!(
            "#  API overhead: {ns:.0} ns per call (8 B all_reduce on a 1-rank communicator, median of 5 x 20000 calls)\n"
        );
    }
    for (r, i) in info.iter().enumerate() {
        let peers = if n <= 16 {
            i.transports
                .iter()
                .enumerate()
                .filter_map(|(q, t)| t.map(|t| format!("{q}:{t}")))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            transport_summary(&i.transports)
        };
        h += &format!(
            "#  Rank {r:>3}  Pid {:>7}  on {:<16} local {}/{}  transports {}\n",
            i.pid,
            short_host(&topo.hosts[topo.host_of[r]].id),
            topo.local_rank[r],
            topo.local_size(r),
            if peers.is_empty() { "-".into() } else { peers }
        );
    }
    h
}
