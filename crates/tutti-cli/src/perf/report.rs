//! What `tutti perf` prints and writes: the nccl-tests style table, CSV and
//! JSON rows, and CSV reading for `--plot-from`.

use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// One measured row (one placement of one collective at one size).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Row {
    /// Free label for comparisons (`--label`, default `tutti`).
    pub label: String,
    /// Collective, as `tutti perf` spells it.
    pub coll: &'static str,
    /// Number of ranks.
    pub nranks: usize,
    /// Size in bytes, as nccl-tests defines it (the larger buffer).
    pub size_bytes: usize,
    /// The count passed to the call: elements per rank for all_gather,
    /// reduce_scatter, all_to_all, gather and scatter (as the peers' CSV).
    pub count: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Mean time per call, the maximum over ranks, in microseconds.
    pub time_us: f64,
    /// size / time, GB/s (10^9 bytes per second).
    #[serde(rename = "algbw_GBps")]
    pub algbw: f64,
    /// algbw times the nccl-tests bus factor.
    #[serde(rename = "busbw_GBps")]
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` when not checked.
    pub wrong: Option<u64>,
    /// In-place (all_reduce only) or out-of-place.
    pub in_place: bool,
    /// Element type.
    pub dtype: String,
    /// Reduction (`none` for collectives that do not reduce).
    pub op: String,
    /// Root (`-1` for collectives without one).
    pub root: i64,
    /// The forced algorithm, or `auto:` and what Auto ran (`auto:ring`,
    /// `auto:tree/4` with 4 pipeline chunks; `auto` where it picks none).
    pub algo: String,
    /// The transports rank 0 uses (`shm`, `tcp`, `shm+tcp`, `local`, `none`).
    pub transport: String,
}

/// The first line of `--csv` files: the peers' columns, then tutti's own.
pub(crate) const CSV_HEADER: &str =
    "label,coll,nranks,size_bytes,count,iters,time_us,algbw_GBps,busbw_GBps,wrong,in_place,dtype,op,root,algo,transport";

impl Row {
    fn csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{:.3},{:.6},{:.6},{},{},{},{},{},{},{}",
            self.label,
            self.coll,
            self.nranks,
            self.size_bytes,
            self.count,
            self.iters,
            self.time_us,
            self.algbw,
            self.busbw,
            self.wrong.map(|w| w.to_string()).unwrap_or_default(),
            u8::from(self.in_place),
            self.dtype,
            self.op,
            self.root,
            self.algo,
            self.transport
        )
    }
}

/// Writes `rows` as CSV (header first).
pub(crate) fn write_csv(path: &Path, rows: &[Row]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(f, "{CSV_HEADER}")?;
    for r in rows {
        writeln!(f, "{}", r.csv())?;
    }
    f.flush()
}

/// Writes `rows` and `meta` as one JSON object `{"meta": ..., "rows": [...]}`.
pub(crate) fn write_json(
    path: &Path,
    meta: &serde_json::Value,
    rows: &[Row],
) -> std::io::Result<()> {
    let v = serde_json::json!({ "meta": meta, "rows": rows });
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    serde_json::to_writer_pretty(&mut f, &v)?;
    writeln!(f)?;
    f.flush()
}

/// `8 B`, `64 KiB`, `256 MiB`.
pub(crate) fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < U.len() - 1 && (v / 1024.0).fract() == 0.0 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 && b >= 1024 {
        // Not a whole number of KiB: say it in bytes.
        return format!("{b} B");
    }
    format!("{v} {}", U[u])
}

/// The table header of one collective, as nccl-tests prints it.
pub(crate) fn table_header(name: &str) -> String {
    let place = |title: &str| format!("{title:^40}");
    let cols = format!(
        "{:>10}  {:>9}  {:>9}  {:>7}",
        "time", "algbw", "busbw", "#wrong"
    );
    let units = format!(
        "{:>10}  {:>9}  {:>9}  {:>7}",
        "(us)", "(GB/s)", "(GB/s)", ""
    );
    let text = format!(
        "#\n# {name}\n# {:>10}  {:>12}  {:>6}  {:>6}  {:>6}  {}  {}\n# {:>10}  {:>12}  {:>6}  {:>6}  {:>6}  {}  {}\n# {:>10}  {:>12}  {:>6}  {:>6}  {:>6}  {}  {}",
        "",
        "",
        "",
        "",
        "",
        place("out-of-place"),
        place("in-place"),
        "size",
        "count",
        "type",
        "redop",
        "root",
        cols,
        cols,
        "(B)",
        "(elements)",
        "",
        "",
        "",
        units,
        units
    );
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

fn fmt_time(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.2}")
    } else if us < 1e6 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

fn cell(r: Option<&Row>) -> String {
    match r {
        Some(r) => format!(
            "{:>10}  {:>9.3}  {:>9.3}  {:>7}",
            fmt_time(r.time_us),
            r.algbw,
            r.busbw,
            r.wrong
                .map(|w| w.to_string())
                .unwrap_or_else(|| "N/A".into())
        ),
        None => format!("{:>10}  {:>9}  {:>9}  {:>7}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// One table line: the out-of-place row and, for all_reduce, the in-place one.
/// `elements` is nccl-tests' count column (size / element size).
pub(crate) fn table_line(oop: &Row, ip: Option<&Row>, elements: usize) -> String {
    format!(
        "  {:>10}  {:>12}  {:>6}  {:>6}  {:>6}  {}  {}",
        oop.size_bytes,
        elements,
        oop.dtype,
        oop.op,
        oop.root,
        cell(Some(oop)),
        cell(ip)
    )
}

/// A series of (size, busbw) points read from a CSV, for plotting.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    /// Legend text.
    pub name: String,
    /// (size in bytes, busbw in GB/s), sorted by size.
    pub points: Vec<(u64, f64)>,
}

/// Reads a `tutti perf` or peer CSV: one series per (label, collective,
/// ranks), out-of-place rows only, the median where a size repeats.
pub(crate) fn read_series(path: &Path) -> Result<Vec<Series>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'));
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| format!("{} is empty", path.display()))?
        .split(',')
        .collect();
    let col = |name: &str| header.iter().position(|h| h.trim() == name);
    let need =
        |name: &str| col(name).ok_or_else(|| format!("{} has no column {name}", path.display()));
    let (cl, cc, cn, cs, cb) = (
        need("label")?,
        need("coll")?,
        need("nranks")?,
        need("size_bytes")?,
        need("busbw_GBps")?,
    );
    let cip = col("in_place");
    // (series name, [(size, busbw of every row with that size)])
    type Group = (String, Vec<(u64, Vec<f64>)>);
    let mut groups: Vec<Group> = Vec::new();
    for (i, l) in lines.enumerate() {
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        let get = |c: usize| f.get(c).copied().unwrap_or("");
        if cip.is_some_and(|c| get(c) == "1") {
            continue;
        }
        let bad = || format!("{}: malformed data line {}", path.display(), i + 2);
        let size: u64 = get(cs).parse().map_err(|_| bad())?;
        let bw: f64 = get(cb).parse().map_err(|_| bad())?;
        let name = format!("{} {} n={}", get(cl), get(cc), get(cn));
        let g = match groups.iter().position(|(n, _)| *n == name) {
            Some(g) => g,
            None => {
                groups.push((name, Vec::new()));
                groups.len() - 1
            }
        };
        let pts = &mut groups[g].1;
        match pts.iter_mut().find(|(s, _)| *s == size) {
            Some((_, v)) => v.push(bw),
            None => pts.push((size, vec![bw])),
        }
    }
    Ok(groups
        .into_iter()
        .map(|(name, mut pts)| {
            pts.sort_by_key(|p| p.0);
            Series {
                name,
                points: pts.into_iter().map(|(s, v)| (s, median(v))).collect(),
            }
        })
        .collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(1536), "1536 B");
    }

    #[test]
    fn reads_peer_csv() {
        let p = std::env::temp_dir().join(format!("tutti-cli-test-{}.csv", std::process::id()));
        std::fs::write(
            &p,
            "label,coll,nranks,size_bytes,count,iters,time_us,algbw_GBps,busbw_GBps,check\n\
             ompi2,allreduce,2,8,2,100,0.5,0.01,0.02,ok\nompi2,allreduce,2,16,4,100,0.5,0.01,0.04,ok\n\
             ompi2,allreduce,2,8,2,100,0.5,0.01,0.06,ok\n",
        )
        .unwrap();
        let s = read_series(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name, "ompi2 allreduce n=2");
        assert_eq!(s[0].points, vec![(8, 0.04), (16, 0.04)]);
    }
}
