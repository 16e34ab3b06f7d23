//! `tutti topo`: what a communicator found, printed by rank 0.
//!
//! Hosts and their ranks, local ranks, the transport of every ordered pair
//! of ranks, each host's network interfaces, and for every collective and
//! size bucket the algorithm tutti would run (the tuner's choice, or what
//! `TUTTI_ALGO` forces), with the time the cost model predicts for it.

use crate::launch;
use crate::perf::{bench, gather_info, report::human_bytes, short_host};
use std::path::PathBuf;
use tutti::topo::Topology;
use tutti::tune::AlgoOverride;
use tutti::{CollKind, Communicator, DataType, TransportKind};

/// Arguments of `tutti topo`.
#[derive(clap::Args, Debug)]
pub(crate) struct TopoArgs {
    /// Ranks to start locally (default 2); ignored under a launcher.
    #[arg(short = 'n', long = "nranks", value_name = "N")]
    pub nranks: Option<usize>,
    /// Element type the size buckets are counted in.
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "f32"
    )]
    pub datatype: String,
    /// Save the topology (tutti::topo::Topology, as rank 0 sees it) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Save this machine and network as a `tutti sim` cluster file (TOML),
    /// with the calibrated link numbers, to FILE.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Internal: this process is a rank started by `tutti topo -n N`.
    #[arg(long, hide = true)]
    pub as_rank: bool,
}

/// The size buckets of the algorithm table (bytes, as `tutti perf` counts them).
pub(crate) const BUCKETS: [usize; 9] = [
    8,
    64,
    512,
    4 << 10,
    32 << 10,
    256 << 10,
    2 << 20,
    16 << 20,
    256 << 20,
];

/// `tutti topo`.
pub(crate) fn main(a: TopoArgs) -> Result<i32, String> {
    let dtype: DataType = a
        .datatype
        .parse()
        .map_err(|e: tutti::Error| e.to_string())?;
    if !a.as_rank {
        let spawn = match launch::launcher_world() {
            None => true,
            Some(w) => a.nranks.is_some() && w <= 1,
        };
        if spawn {
            let n = a.nranks.unwrap_or(2);
            if n == 0 {
                return Err("-n must be at least 1".into());
            }
            return launch::relaunch_self(n, "--as-rank");
        }
    }
    let comm = Communicator::from_env().map_err(|e| e.to_string())?;
    let info = gather_info(&comm).map_err(|e| e.to_string())?;
    let ifaces = gather_interfaces(&comm).map_err(|e| e.to_string())?;
    if comm.rank() != 0 {
        return Ok(0);
    }
    let topo = comm.topology();
    let ifname = comm.config().socket_ifname.as_deref();
    print!("{}", describe(topo, &info, &ifaces, ifname));
    print!("{}", algorithm_table(&comm, dtype));
    if let Some(p) = &a.json {
        let f =
            std::fs::File::create(p).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(f), topo)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        eprintln!("tutti topo: wrote {}", p.display());
    }
    if let Some(p) = &a.save {
        let text = cluster_file(&comm).to_toml()?;
        std::fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        eprintln!(
            "tutti topo: wrote {} (tutti sim {} ...)",
            p.display(),
            p.display()
        );
    }
    Ok(0)
}

/// This communicator's hosts and calibrated links as a `tutti sim` cluster.
fn cluster_file(comm: &Communicator) -> crate::sim::cluster::Cluster {
    use crate::sim::cluster::{Cluster, HostLevel, NetLevel};
    let topo = comm.topology();
    let m = comm.cost_model();
    let per_host = topo.hosts.iter().map(|h| h.ranks.len()).max().unwrap_or(1);
    let cores = topo.hosts.iter().map(|h| h.cpus).filter(|&c| c > 0).min();
    // Rounded: calibration is a measurement, not a spec.
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    Cluster {
        name: format!("saved by tutti topo from {} rank(s)", comm.size()),
        hosts: Some(topo.hosts.len()),
        ranks_per_host: Some(per_host),
        shared_cores: None,
        host: Some(HostLevel {
            bandwidth_gbit: Some(r(m.shm.gbps * 8.0)),
            latency_us: Some(r(m.shm.alpha_us)),
            cores,
            reduce_gbit: Some(r(m.reduce_gbps * 8.0)),
            copy_gbit: Some(r(m.copy_gbps * 8.0)),
        }),
        network: (topo.hosts.len() > 1).then(|| NetLevel {
            bandwidth_gbit: Some(r(m.tcp.gbps * 8.0)),
            latency_us: Some(r(m.tcp.alpha_us)),
            ports: 1,
            oversubscription: 1.0,
            stream_gbit: None,
            burst_kib: None,
            line_gbit: None,
        }),
    }
}

/// Bytes each rank contributes to the interface exchange.
const IFACE_BYTES: usize = 4096;

/// Every rank's interface list, as text lines, on every rank.
fn gather_interfaces(comm: &Communicator) -> tutti::Result<Vec<String>> {
    let text = match tutti::topo::iface::list() {
        Ok(v) => v
            .iter()
            .map(|i| {
                let speed = i.speed_mbps.map_or("-".into(), |s| format!("{s} Mbit/s"));
                format!("{:<12} {:<16} {speed}", i.name, i.addr)
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(cannot list interfaces: {e})"),
    };
    let mut mine = vec![0u8; IFACE_BYTES];
    let b = text.as_bytes();
    let len = b.len().min(IFACE_BYTES - 2);
    mine[..2].copy_from_slice(&(len as u16).to_le_bytes());
    mine[2..2 + len].copy_from_slice(&b[..len]);
    let mut all = vec![0u8; IFACE_BYTES * comm.size()];
    comm.all_gather(&mine, &mut all)?;
    Ok(all
        .chunks(IFACE_BYTES)
        .map(|c| {
            let len = u16::from_le_bytes([c[0], c[1]]) as usize;
            String::from_utf8_lossy(&c[2..2 + len.min(IFACE_BYTES - 2)]).into_owned()
        })
        .collect())
}

/// `0-3`, `0, 2, 5-7`.
fn ranges(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    out.join(", ")
}

/// Hosts, ranks, the transport matrix and interfaces (and the
/// `TUTTI_SOCKET_IFNAME` choice, `ifname`, if any).
fn describe(
    topo: &Topology,
    info: &[(u64, Vec<Option<TransportKind>>)],
    ifaces: &[String],
    ifname: Option<&str>,
) -> String {
    let n = topo.nranks;
    let mut s = format!(
        "tutti topo: {n} rank(s) on {} host(s)\n\nhosts\n",
        topo.hosts.len()
    );
    for (h, host) in topo.hosts.iter().enumerate() {
        let cpus = if host.cpus > 0 {
            host.cpus.to_string()
        } else {
            "?".into()
        };
        s += &format!(
            "  host {h}  {:<20} ranks {:<12} cpus {:<4} id {}\n",
            short_host(&host.id),
            ranges(&host.ranks),
            cpus,
            host.id
        );
    }
    s += "\nranks\n  rank  host  local      pid\n";
    for (r, (pid, _)) in info.iter().enumerate() {
        s += &format!(
            "  {r:>4}  {:>4}  {:>5}  {pid:>7}\n",
            topo.host_of[r],
            format!("{}/{}", topo.local_rank[r], topo.local_size(r))
        );
    }
    s += "\ntransports (row: from rank, column: to rank)\n      ";
    for q in 0..n {
        s += &format!("{q:>6}");
    }
    s += "\n";
    for (r, (_, ts)) in info.iter().enumerate() {
        s += &format!("  {r:>4}");
        for t in ts {
            s += &format!("{:>6}", t.map_or("-".to_string(), |t| t.to_string()));
        }
        s += "\n";
    }
    for host in &topo.hosts {
        let first = host.ranks[0];
        s += &format!(
            "\ninterfaces on host {} (seen by rank {first})\n",
            short_host(&host.id)
        );
        for l in ifaces[first].lines() {
            s += &format!("  {l}\n");
        }
    }
    if let Some(v) = ifname {
        s += &format!("  TUTTI_SOCKET_IFNAME={v}\n");
    }
    s
}

/// The problem rank 0 poses for `kind` at `size` bytes (as `tutti perf`
/// counts them): the collective and its count.
fn problem(kind: CollKind, n: usize, size: usize, esz: usize) -> (tutti::Collective, usize) {
    let (_, count) = bench::shape(kind, size, n, esz);
    let coll = match kind {
        CollKind::SendRecv => tutti::Collective::Send { peer: 1 % n },
        k => bench::collective(k, 0),
    };
    (coll, count)
}

/// The algorithm table, then the predicted time of each choice.
///
/// Cells come from [`Communicator::plan`]: what `TUTTI_ALGO` forces (marked
/// `*`), else the cost model's cheapest schedule, priced under this
/// communicator's topology.
fn algorithm_table(comm: &Communicator, dtype: DataType) -> String {
    let n = comm.size();
    let esz = dtype.size();
    let ov: &AlgoOverride = &comm.config().algo;
    let forced = (!ov.is_empty()).then(|| ov.to_string());
    // (collective, [(algorithm cell, predicted time cell)] per bucket)
    let mut rows: Vec<(CollKind, Vec<(String, String)>)> = Vec::new();
    for kind in CollKind::ALL {
        let mut cells = Vec::new();
        for b in BUCKETS {
            let (coll, count) = problem(kind, n, b, esz);
            let (cell, t) = if kind == CollKind::SendRecv && n < 2 {
                ("-".to_string(), None)
            } else {
                match comm.plan(coll, count, dtype) {
                    Ok(c) => {
                        let a = c.algorithm;
                        let star = if ov.get(kind) == Some(a) { "*" } else { "" };
                        let cut = if c.chunks > 1 {
                            format!("/{}", c.chunks)
                        } else {
                            String::new()
                        };
                        (format!("{a}{cut}{star}"), c.us.is_finite().then_some(c.us))
                    }
                    Err(e) => (format!("error: {e}"), None),
                }
            };
            cells.push((cell, t.map_or("-".to_string(), fmt_us)));
        }
        rows.push((kind, cells));
    }
    // Each column as wide as its widest cell (hierarchical names are long).
    let widths: Vec<usize> = BUCKETS
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            rows.iter()
                .flat_map(|(_, c)| [c[i].0.len(), c[i].1.len()])
                .chain([human_bytes(b as u64).len(), 8])
                .max()
                .unwrap_or(8)
                + 2
        })
        .collect();
    let head = |s: &mut String| {
        *s += &format!("  {:<15}", "collective");
        for (b, w) in BUCKETS.iter().zip(&widths) {
            *s += &format!("{:>w$}", human_bytes(*b as u64));
        }
        *s += "\n";
    };
    let mut s = format!(
        "\nalgorithm per collective and size ({dtype}; size as in tutti perf; /k = cut into k pipeline chunks{})\n",
        forced
            .as_ref()
            .map_or(String::new(), |v| format!("; * = forced by TUTTI_ALGO={v}"))
    );
    head(&mut s);
    for (kind, cells) in &rows {
        s += &format!("  {:<15}", kind.name());
        for ((a, _), w) in cells.iter().zip(&widths) {
            s += &format!("{a:>w$}");
        }
        s += "\n";
    }
    s += "\npredicted time (us) of that choice (cost model; - where it has no price)\n";
    head(&mut s);
    for (kind, cells) in &rows {
        s += &format!("  {:<15}", kind.name());
        for ((_, t), w) in cells.iter().zip(&widths) {
            s += &format!("{t:>w$}");
        }
        s += "\n";
    }
    if comm.config().online {
        // Where ranks share cores the tuner tries a wider spread.
        let (spread, _) = tutti::tune::online::spread(comm.topology().cpu_share());
        s += &format!(
            "(the cost model's picks; where it prices other algorithms within {spread}x, Auto times \
             them on a shape's first calls and keeps the fastest: TUTTI_TUNE, docs/algorithms.md)\n"
        );
    }
    s
}

/// `0.42`, `13.5`, `1234`.
fn fmt_us(t: f64) -> String {
    if t < 10.0 {
        format!("{t:.2}")
    } else if t < 1000.0 {
        format!("{t:.1}")
    } else {
        format!("{t:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 3]), "0-3");
        assert_eq!(ranges(&[0, 2, 5, 6, 7]), "0, 2, 5-7");
        assert_eq!(ranges(&[4]), "4");
    }

    #[test]
    fn table_has_every_collective() {
        let comms = Communicator::init_all(3).unwrap();
        let t = algorithm_table(&comms[0], DataType::F32);
        for k in CollKind::ALL {
            assert!(t.contains(k.name()), "{t}");
        }
        assert!(t.contains("predicted time"), "{t}");
    }
}
