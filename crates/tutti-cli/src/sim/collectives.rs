//! `tutti sim CLUSTER COLLECTIVE`: the nccl-tests table of `tutti perf`,
//! predicted, for Auto's pick or a forced algorithm, and with
//! `--all-algorithms` one column per algorithm.

use super::cluster::Checked;
use super::price::{self, Priced};
use super::SimArgs;
use crate::perf::bench;
use crate::perf::report::{self, Row};
use tutti::{Algorithm, CollKind, DataType};

/// The checked sweep: collectives, sizes, type, algorithm.
struct Sweep {
    colls: Vec<CollKind>,
    sizes: Vec<usize>,
    dtype: DataType,
    algo: Option<Algorithm>,
}

fn parse_size(flag: &str, v: &str) -> Result<usize, String> {
    tutti::config::parse_bytes(v)
        .ok_or_else(|| format!("{flag} {v:?} is not a size (allowed: e.g. 8, 64K, 256M, 1G)"))
}

fn sweep(a: &SimArgs, c: &Checked) -> Result<Sweep, String> {
    let colls = if a.workload.eq_ignore_ascii_case("all") {
        CollKind::ALL
            .into_iter()
            .filter(|&k| k != CollKind::SendRecv)
            .collect()
    } else {
        vec![a
            .workload
            .parse::<CollKind>()
            .map_err(|e| format!("WORKLOAD: {e}, all, or step"))?]
    };
    let (lo, hi) = (
        parse_size("-b", &a.minbytes)?,
        parse_size("-e", &a.maxbytes)?,
    );
    if lo == 0 || lo > hi {
        return Err(format!(
            "the size range -b {} -e {} is empty; -b must be at least 1 and at most -e",
            a.minbytes, a.maxbytes
        ));
    }
    if a.stepfactor < 2 {
        return Err("-f must be at least 2".into());
    }
    let dtype: DataType = a
        .datatype
        .parse()
        .map_err(|e: tutti::Error| format!("-d: {e}"))?;
    let n = c.nranks();
    if lo == hi {
        // One size asked for: it must fit the collective exactly.
        for &k in &colls {
            let (size, _) = bench::shape(k, lo, n, dtype.size());
            if size != lo && k != CollKind::Barrier {
                let unit = bench::shape(k, 1, n, dtype.size()).0;
                return Err(format!(
                    "-b/-e {lo}: {k} on {n} ranks of {dtype} needs a size that is a multiple of {unit} bytes (ranks x element size), e.g. {}",
                    size.max(unit)
                ));
            }
        }
    }
    let mut sizes = Vec::new();
    let mut s = lo;
    while s <= hi {
        sizes.push(s);
        s = match s.checked_mul(a.stepfactor) {
            Some(x) => x,
            None => break,
        };
    }
    let algo = if a.algo.eq_ignore_ascii_case("auto") {
        None
    } else {
        Some(
            a.algo
                .parse::<Algorithm>()
                .map_err(|e| format!("-a: {e}"))?,
        )
    };
    if a.root >= n {
        return Err(format!("-r {}: the root must be a rank in 0..{n}", a.root));
    }
    Ok(Sweep {
        colls,
        sizes,
        dtype,
        algo,
    })
}

/// The report, every line of it computed before any is printed.
pub(super) fn run(a: &SimArgs, c: &Checked) -> Result<String, String> {
    let sw = sweep(a, c)?;
    let started = std::time::Instant::now();
    let n = c.nranks();
    let esz = sw.dtype.size();
    let mut out = super::describe(c, a.cluster.as_deref().unwrap_or_default());
    let mut rows: Vec<Row> = Vec::new();
    for &kind in &sw.colls {
        let coll = bench::collective(kind, a.root);
        if let Some(alg) = sw.algo {
            let mut p = super::price::problem(c, coll, 0, 1);
            p.count = 0;
            if alg.build(&p).is_none() {
                return Err(format!("-a {alg}: it does not implement {kind}"));
            }
        }
        out += &report::table_header(kind.name());
        out += "  algorithm\n";
        let mut all_cols: Vec<(usize, Vec<Priced>)> = Vec::new();
        let mut seen = Vec::new();
        for &req in &sw.sizes {
            let (size, count) = bench::shape(kind, req, n, esz);
            if seen.contains(&size) {
                continue;
            }
            seen.push(size);
            let (pick, all) = match sw.algo {
                Some(alg) => {
                    let p = price::best_chunks(c, coll, count, esz, alg)
                        .ok_or_else(|| format!("-a {alg}: it does not implement {kind}"))?;
                    (p, vec![p])
                }
                None => price::auto(c, coll, count, esz)
                    .ok_or_else(|| format!("no algorithm implements {kind} on {n} ranks"))?,
            };
            let us = pick.stats.us;
            let algbw = if us > 0.0 {
                size as f64 / us / 1e3
            } else {
                0.0
            };
            let row = Row {
                label: "sim".into(),
                coll: kind.name(),
                nranks: n,
                size_bytes: size,
                count,
                iters: 0,
                time_us: us,
                algbw,
                busbw: algbw * bench::bus_factor(kind, n),
                wrong: None,
                in_place: false,
                dtype: sw.dtype.to_string(),
                op: if bench::reduces(kind) {
                    "sum".into()
                } else {
                    "none".into()
                },
                root: if bench::rooted(kind) {
                    a.root as i64
                } else {
                    -1
                },
                algo: match sw.algo {
                    Some(_) => price::label(&pick),
                    None => format!("auto:{}", price::label(&pick)),
                },
                transport: if c.hosts > 1 { "shm+tcp" } else { "shm" }.into(),
            };
            out += &format!(
                "{}  {}\n",
                report::table_line(&row, None, size / esz.max(1)),
                row.algo
            );
            rows.push(row);
            all_cols.push((size, all));
            if kind == CollKind::Barrier {
                break;
            }
        }
        if a.all_algorithms && sw.algo.is_none() {
            out += &algorithm_columns(kind, &all_cols);
        }
    }
    out += &format!(
        "# (in-place columns: not priced, the tuner prices every call out of place; simulated in {:.2} s)\n",
        started.elapsed().as_secs_f64()
    );
    if let Some(p) = &a.json {
        let meta = serde_json::json!({
            "label": "sim",
            "nranks": n,
            "cluster": a.cluster,
            "dtype": sw.dtype.to_string(),
            "predicted": true,
        });
        report::write_json(p, &meta, &rows)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(out)
}

/// One column per algorithm: predicted time (us), `-` where it does not
/// implement the call.
fn algorithm_columns(kind: CollKind, cols: &[(usize, Vec<Priced>)]) -> String {
    let mut algs: Vec<Algorithm> = Vec::new();
    for (_, v) in cols {
        for p in v {
            if !algs.contains(&p.alg) {
                algs.push(p.alg);
            }
        }
    }
    algs.sort_by_key(|a| {
        Algorithm::VARIANTS
            .iter()
            .position(|x| x == a)
            .unwrap_or(usize::MAX)
    });
    let names: Vec<String> = algs.iter().map(|a| a.to_string()).collect();
    let w: Vec<usize> = names.iter().map(|s| s.len().max(9) + 2).collect();
    let mut s = format!(
        "#\n# {}: predicted time (us) per algorithm\n# {:>10}",
        kind.name(),
        "size"
    );
    for (nm, w) in names.iter().zip(&w) {
        s += &format!("{nm:>w$}");
    }
    s += "\n";
    for (size, v) in cols {
        s += &format!("  {size:>10}");
        for (a, w) in algs.iter().zip(&w) {
            let cell = v
                .iter()
                .find(|p| p.alg == *a)
                .map_or("-".to_string(), |p| format!("{:.1}", p.stats.us));
            s += &format!("{cell:>w$}");
        }
        s += "\n";
    }
    s
}
