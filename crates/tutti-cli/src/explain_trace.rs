//! `tutti explain TRACE_DIR [--cluster CLUSTER] [--json FILE]`: prints
//! [`tutti::explain`]'s report of a run's timed traces.

use super::ExplainArgs;
use crate::sim::cluster;
use tutti::explain::{Links, Report};

/// The links of `--cluster`, with the run's hosts and ranks per host.
fn links(arg: &str, hosts: usize, n: usize) -> Result<Links, String> {
    let mut file = cluster::resolve(arg)?;
    if !n.is_multiple_of(hosts) {
        return Err(format!(
            "the run's {n} ranks do not split evenly over its {hosts} hosts"
        ));
    }
    file.hosts = Some(hosts);
    file.ranks_per_host = Some(n / hosts);
    let c = file.check().map_err(|e| format!("{arg}: {e}"))?;
    let limit = if hosts > 1 {
        (c.port_gbps * c.ports as f64 / c.oversub / c.per_host as f64).min(c.model.tcp.gbps)
    } else {
        c.model.shm.gbps
    };
    Ok(Links {
        name: format!("{arg} ({})", c.name),
        model: c.model,
        fabric: c.fabric(),
        limit_gbps: limit,
    })
}

/// The report of the traces in `a.run`, as text (and JSON to `a.json`).
pub(crate) fn explain(a: &ExplainArgs) -> Result<String, String> {
    let traces = tutti::explain::read_traces(&a.run)?;
    let l = match &a.cluster {
        Some(arg) => {
            let t = &traces[0];
            let hosts = t.host_of.iter().max().map_or(1, |h| h + 1);
            Some(links(arg, hosts, t.size)?)
        }
        None => None,
    };
    let r = tutti::explain::report(&traces, l.as_ref())?;
    let s = format(&r, &a.run.display().to_string());
    if let Some(j) = &a.json {
        let b = serde_json::to_vec_pretty(&r).map_err(|e| e.to_string())?;
        std::fs::write(j, b).map_err(|e| format!("cannot write {}: {e}", j.display()))?;
    }
    Ok(s)
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1e3)
    } else {
        format!("{v:.1} us")
    }
}

/// The report in plain words and small tables.
pub(crate) fn format(r: &Report, dir: &str) -> String {
    let pct = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
    let mut s = format!(
        "tutti explain: {dir}: {} ranks on {} host(s) over {}; links: {}; link limit per rank {:.3} GB/s\n",
        r.ranks, r.hosts, r.transport, r.links, r.link_limit_gbps
    );
    s += &format!(
        "{} collectives on every rank ({} timed) in {}; per rank {} in collectives ({:.0}% of the span), {} of it ({:.0}%) waiting for the last rank to arrive\n\n",
        r.ops,
        r.timed_ops,
        us(r.span_us),
        us(r.comm_us),
        // Scaled from sampled calls, it can exceed the span a little.
        pct(r.comm_us, r.span_us).min(100.0),
        us(r.wait_us),
        pct(r.wait_us, r.comm_us)
    );
    s += &format!(
        "  {:<15} {:<24} {:>6} {:>11} {:>11} {:>11} {:>9} {:>7}  {:<24} {:>10}  {:<24} {:>10}\n",
        "collective",
        "size class",
        "calls",
        "comm",
        "waiting",
        "own (max)",
        "busbw",
        "of link",
        "ran",
        "model",
        "model's best",
        "best"
    );
    for g in &r.groups {
        let opt = |v: Option<f64>| v.map_or("-".into(), us);
        s += &format!(
            "  {:<15} {:<24} {:>6} {:>11} {:>11} {:>11} {:>9.3} {:>6.0}%  {:<24} {:>10}  {:<24} {:>10}\n",
            g.collective,
            g.size_class,
            g.calls,
            us(g.comm_us),
            us(g.wait_us),
            us(g.own_us),
            g.busbw_gbps,
            100.0 * g.of_link,
            format!("{}{}", g.algorithm, if g.forced { " (forced)" } else { "" }),
            opt(g.model_us),
            g.model_best.as_deref().unwrap_or("-"),
            opt(g.model_best_us)
        );
    }
    s += "  (comm, waiting: per rank, all calls of the class (calls under 64 KiB are timed one in 16, and scaled); \
          own: the median time of its largest timed calls once every rank had arrived, busbw from it; \
          model: the model's time for what ran, on these links)\n";

    let st = &r.stragglers;
    s += &format!("\nstragglers ({} collectives compared):\n", st.ops);
    match st.straggler {
        Some(k) => {
            let l = st.ranks.iter().find(|l| l.rank == k).expect("a rank");
            s += &format!(
                "  rank {k} arrived last at {} of {} collectives ({:.0}%), by {} (median; max {}) after the next-latest rank\n",
                l.last,
                st.ops,
                100.0 * l.share,
                us(l.median_late_us),
                us(l.max_late_us)
            );
        }
        None if st.ops > 0 => {
            s += "  no rank stands out: each arrived last about as often as the others\n"
        }
        None => s += "  none: one rank, or no collectives on every rank\n",
    }
    s += &format!(
        "  {:>6} {:>10} {:>8} {:>14} {:>12} {:>12}\n",
        "rank", "last", "share", "late (median)", "late (max)", "waited"
    );
    for l in &st.ranks {
        s += &format!(
            "  {:>6} {:>10} {:>7.0}% {:>14} {:>12} {:>12}\n",
            l.rank,
            l.last,
            100.0 * l.share,
            us(l.median_late_us),
            us(l.max_late_us),
            us(l.waited_us)
        );
    }
    if r.differ.is_empty() {
        s += "\nthe algorithms that ran agree with the model's best for these links\n";
    } else {
        s += "\nwhere the algorithm that ran differs from the model's best for these links:\n";
        for d in &r.differ {
            s += &format!(
                "  {} {} B: {} ran {} in {} (model {}); the model's best is {} at {}\n",
                d.collective,
                d.bytes,
                if d.forced { "forced," } else { "Auto" },
                d.ran,
                us(d.measured_us),
                us(d.model_us),
                d.best,
                us(d.best_us)
            );
        }
    }
    s += "\nwhat-ifs (time saved per rank over these collectives, from the measured times):\n";
    if r.what_ifs.is_empty() {
        s += "  none saves anything\n";
    }
    for w in &r.what_ifs {
        s += &format!(
            "  {:<60} {:>11}  {:>5.1}% of the time in collectives\n",
            w.what,
            us(w.saved_us),
            100.0 * w.of_comm
        );
    }
    for n in &r.notes {
        s += &format!("\nnote: {n}");
    }
    if !r.notes.is_empty() {
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti::{Communicator, Config, ReduceOp};

    #[test]
    fn prints_a_traced_run_with_and_without_a_cluster() {
        let dir = std::env::temp_dir().join(format!("tutti-explain-cli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = Config {
            trace_dir: Some(dir.clone()),
            ..Config::default()
        };
        let comms = Communicator::init_all_with(2, cfg).unwrap();
        std::thread::scope(|s| {
            for c in comms {
                s.spawn(move || {
                    let mut x = vec![1.0f32; 70_000];
                    for _ in 0..5 {
                        c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    }
                });
            }
        });
        let json = dir.join("report.json");
        let mut a = ExplainArgs {
            run: dir.clone(),
            cluster: None,
            json: Some(json.clone()),
        };
        let s = super::super::explain(&a).unwrap();
        assert!(s.contains("2 ranks on 1 host(s)"), "{s}");
        assert!(
            s.contains("medium (64 KiB - 4 MiB)") && s.contains("stragglers"),
            "{s}"
        );
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(v["ops"], 5, "{v}");
        a.cluster = Some("1x8".into());
        a.json = None;
        let s = super::super::explain(&a).unwrap();
        assert!(s.contains("links: 1x8"), "{s}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
