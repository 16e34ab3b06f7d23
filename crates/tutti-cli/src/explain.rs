//! `tutti explain RUN --cluster CLUSTER`: reads a run and says, per
//! collective and size class, where the time went, how close each call
//! came to its link's limit, where Auto's pick differs from the model's
//! best for the described links, and how much faster the model says the
//! call could be. RUN is a `tutti perf --json` file (`--cluster` needed),
//! or a directory of flight-recorder traces written with
//! `TUTTI_TRACE_DIR` set ([`tutti::explain`] reads them; this module
//! prints the report, with stragglers and what-ifs).

use crate::perf::bench;
use crate::sim::cluster::{self, Checked};
use crate::sim::price;
use std::path::PathBuf;
use tutti::CollKind;

#[path = "explain_trace.rs"]
mod trace;

/// Arguments of `tutti explain`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ExplainArgs {
    /// A `tutti perf --json` file, or a directory of a run's traces
    /// (`TUTTI_TRACE_DIR`).
    pub run: PathBuf,
    /// The cluster it ran on (file or preset, as tutti sim); its host and
    /// rank counts are taken from the run. Needed for a perf file; for
    /// traces, the links each rank recorded (calibrated) if left out.
    #[arg(long, value_name = "CLUSTER")]
    pub cluster: Option<String>,
    /// With traces: also write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One measured row of the run.
#[derive(Clone, Debug, serde::Deserialize)]
struct Row {
    coll: String,
    nranks: usize,
    size_bytes: usize,
    count: usize,
    time_us: f64,
    #[serde(rename = "busbw_GBps")]
    busbw: f64,
    in_place: bool,
    dtype: String,
    algo: String,
}

/// Size classes of the report.
fn class(bytes: usize) -> &'static str {
    match bytes {
        0..65536 => "small (< 64 KiB)",
        65536..4194304 => "medium (64 KiB - 4 MiB)",
        _ => "large (>= 4 MiB)",
    }
}

/// `tutti explain`.
pub(crate) fn main(a: ExplainArgs) -> Result<i32, String> {
    print!("{}", explain(&a)?);
    Ok(0)
}

/// The report, computed whole before it is printed.
pub(crate) fn explain(a: &ExplainArgs) -> Result<String, String> {
    if a.run.is_dir() {
        return trace::explain(a);
    }
    let Some(cluster_arg) = &a.cluster else {
        return Err(format!(
            "{}: a tutti perf --json file needs --cluster (the links it ran on)",
            a.run.display()
        ));
    };
    let text = std::fs::read_to_string(&a.run)
        .map_err(|e| format!("cannot read {}: {e}", a.run.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a tutti perf --json file: {e}", a.run.display()))?;
    let rows: Vec<Row> = serde_json::from_value(v["rows"].clone())
        .map_err(|e| format!("{}: no rows of tutti perf --json: {e}", a.run.display()))?;
    let rows: Vec<Row> = rows.into_iter().filter(|r| !r.in_place).collect();
    let Some(first) = rows.first() else {
        return Err(format!("{}: no out-of-place rows", a.run.display()));
    };
    let n = first.nranks;
    let hosts = v["meta"]["hosts"].as_array().map_or(1, |h| h.len().max(1));
    let mut file = cluster::resolve(cluster_arg)?;
    file.hosts = Some(hosts);
    file.ranks_per_host = Some(n / hosts);
    let c: Checked = file.check().map_err(|e| format!("{cluster_arg}: {e}"))?;
    if c.nranks() != n {
        return Err(format!(
            "the run's {n} ranks do not split evenly over its {hosts} hosts"
        ));
    }
    // The link that limits a collective's bus bandwidth: the network's
    // ports per host across hosts, else one rank's shared-memory rate.
    let limit = if hosts > 1 {
        (c.port_gbps * c.ports as f64 / c.oversub / c.per_host as f64).min(c.model.tcp.gbps)
    } else {
        c.model.shm.gbps
    };
    let mut s = format!(
        "tutti explain: {} ({} ranks on {hosts} host(s)), links of {}; link limit per rank {:.3} GB/s\n\n",
        a.run.display(),
        n,
        cluster_arg,
        limit
    );
    s += &format!(
        "  {:<15} {:<24} {:>5} {:>12} {:>10} {:>7}  {:<22} {:<22} {:>9}\n",
        "collective",
        "size class",
        "calls",
        "time (us)",
        "busbw",
        "of link",
        "ran",
        "model's best",
        "could be"
    );
    let mut total = 0.0;
    let mut keys: Vec<(String, &'static str)> = Vec::new();
    for r in &rows {
        let k = (r.coll.clone(), class(r.size_bytes));
        if !keys.contains(&k) {
            keys.push(k);
        }
        total += r.time_us;
    }
    let mut differ = Vec::new();
    for (coll, cl) in &keys {
        let group: Vec<&Row> = rows
            .iter()
            .filter(|r| &r.coll == coll && class(r.size_bytes) == *cl)
            .collect();
        let t: f64 = group.iter().map(|r| r.time_us).sum();
        let bus = group.iter().map(|r| r.busbw).fold(0.0, f64::max);
        let kind: CollKind = coll.parse().map_err(|e: tutti::Error| e.to_string())?;
        // The model on the largest call of the group.
        let big = group
            .iter()
            .max_by_key(|r| r.size_bytes)
            .expect("a group has rows");
        let esz: tutti::DataType = big.dtype.parse().map_err(|e: tutti::Error| e.to_string())?;
        let best = (kind != CollKind::SendRecv && kind != CollKind::Barrier)
            .then(|| price::auto(&c, bench::collective(kind, 0), big.count, esz.size()))
            .flatten();
        let ran = big.algo.trim_start_matches("auto:").to_string();
        let (best_name, could) = match &best {
            Some((p, _)) => (price::label(p), format!("{:.0}", p.stats.us)),
            None => ("-".into(), "-".into()),
        };
        if best.is_some() && ran != best_name && big.algo.starts_with("auto") {
            differ.push(format!(
                "  {coll} {} B: Auto ran {ran} in {:.0} us; the model's best for these links is {best_name} at {could} us",
                big.size_bytes, big.time_us
            ));
        }
        s += &format!(
            "  {:<15} {:<24} {:>5} {:>12.0} {:>10.3} {:>6.0}%  {:<22} {:<22} {:>9}\n",
            coll,
            cl,
            group.len(),
            t,
            bus,
            if kind == CollKind::Barrier {
                0.0
            } else {
                100.0 * bus / limit
            },
            ran,
            best_name,
            could
        );
    }
    s += &format!(
        "\n  (time: the sum of one call of each size; {:.0} us in all; could be: the model's prediction for the largest call of the class)\n",
        total
    );
    if differ.is_empty() {
        s += "\nAuto's picks agree with the model's best for these links.\n";
    } else {
        s += "\nwhere Auto's pick differs from the model's best for these links:\n";
        s += &differ.join("\n");
        s += "\n";
    }
    s += "\nstragglers: not in a perf --json file (they need the flight recorder's per-op timings, not yet recorded)\n";
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `tutti perf --json` file of 2 x 4 ranks, written by hand.
    fn run_file(algo: &str) -> PathBuf {
        let row = |size: usize, t: f64| {
            serde_json::json!({
                "label": "tutti", "coll": "all_reduce", "nranks": 8, "size_bytes": size,
                "count": size / 4, "iters": 10, "time_us": t, "algbw_GBps": size as f64 / t / 1e3,
                "busbw_GBps": size as f64 / t / 1e3 * 1.75, "wrong": null, "in_place": false,
                "dtype": "f32", "op": "sum", "root": -1, "algo": algo, "transport": "shm+tcp"
            })
        };
        let v = serde_json::json!({
            "meta": {"nranks": 8, "hosts": [{"id": "a"}, {"id": "b"}]},
            "rows": [row(1024, 300.0), row(4 << 20, 40_000.0)],
        });
        let p = std::env::temp_dir().join(format!(
            "tutti-explain-{}-{}.json",
            std::process::id(),
            algo.len()
        ));
        std::fs::write(&p, v.to_string()).unwrap();
        p
    }

    #[test]
    fn reads_a_perf_run_and_names_what_differs() {
        let p = run_file("auto:direct");
        let a = ExplainArgs {
            run: p.clone(),
            cluster: Some("ns-1g".into()),
            json: None,
        };
        let s = explain(&a).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert!(s.contains("8 ranks on 2 host(s)"), "{s}");
        assert!(
            s.contains("small (< 64 KiB)") && s.contains("large (>= 4 MiB)"),
            "{s}"
        );
        // Direct for 4 MiB across hosts is never the model's best.
        assert!(s.contains("Auto ran direct"), "{s}");
    }

    #[test]
    fn rejects_what_is_not_a_perf_run() {
        let p = std::env::temp_dir().join(format!("tutti-explain-bad-{}.json", std::process::id()));
        std::fs::write(&p, "{\"rows\": 3}").unwrap();
        let e = explain(&ExplainArgs {
            run: p.clone(),
            cluster: Some("ns-1g".into()),
            json: None,
        })
        .unwrap_err();
        std::fs::remove_file(&p).unwrap();
        assert!(e.contains("no rows"), "{e}");
    }
}
