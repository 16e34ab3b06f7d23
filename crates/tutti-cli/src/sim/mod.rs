//! `tutti sim`: predictions on a described cluster, from the same schedules
//! and cost model that pick algorithms at run time.
//!
//! `tutti sim CLUSTER [COLLECTIVE]` prints the nccl-tests table of `tutti
//! perf`, predicted, for Auto's pick (and with `--all-algorithms` one
//! column per algorithm); `tutti sim CLUSTER step ...` models a
//! data-parallel training step: compute, exposed and overlapped
//! communication, scaling efficiency over 1, 2, 4, ... hosts, the
//! bottleneck, and what-ifs with their predicted gain. CLUSTER is a file
//! ([`cluster`]) or a preset (`--list-presets`). docs/sim.md has examples
//! and the validation against measurements.

pub(crate) mod cluster;
mod collectives;
pub(crate) mod price;
mod step;
#[cfg(test)]
mod tests;
mod workload;

use cluster::Checked;

/// Arguments of `tutti sim`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct SimArgs {
    /// Cluster file (TOML or JSON) or preset name (--list-presets).
    #[arg(value_name = "CLUSTER", required_unless_present = "list_presets")]
    pub cluster: Option<String>,
    /// A collective as in tutti perf (all_reduce, all_gather, ...), all, or
    /// step (a training step: see --model, --compute-ms).
    #[arg(value_name = "WORKLOAD", default_value = "all_reduce")]
    pub workload: String,
    /// Print the presets and exit.
    #[arg(long)]
    pub list_presets: bool,
    /// Print the cluster (after --hosts and --ranks-per-host) as a TOML file and exit.
    #[arg(long)]
    pub show_cluster: bool,
    /// Replace the cluster's host count.
    #[arg(long, value_name = "N")]
    pub hosts: Option<usize>,
    /// Replace the cluster's ranks per host.
    #[arg(long, value_name = "K")]
    pub ranks_per_host: Option<usize>,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(
        short = 'b',
        long = "minbytes",
        value_name = "SIZE",
        default_value = "8"
    )]
    pub minbytes: String,
    /// Largest size in bytes (K, M, G suffixes).
    #[arg(
        short = 'e',
        long = "maxbytes",
        value_name = "SIZE",
        default_value = "64M"
    )]
    pub maxbytes: String,
    /// Multiply the size by this factor between rows.
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "F",
        default_value_t = 2
    )]
    pub stepfactor: usize,
    /// Element type: f32, f64, f16, bf16, i8, u8, i32, i64, u32, u64.
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "f32"
    )]
    pub datatype: String,
    /// Force an algorithm (as tutti perf -a); auto: the cost model's pick.
    #[arg(
        short = 'a',
        long = "algo",
        value_name = "ALGO",
        default_value = "auto"
    )]
    pub algo: String,
    /// Root of broadcast, reduce, gather and scatter.
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    pub root: usize,
    /// Also print one column per algorithm (predicted time, us).
    #[arg(long)]
    pub all_algorithms: bool,
    /// Write the predicted rows as JSON (the format of tutti perf --json).
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// The training step (WORKLOAD = step).
    #[command(flatten)]
    pub step: step::StepArgs,
}

/// `tutti sim`.
pub(crate) fn main(a: SimArgs) -> Result<i32, String> {
    if a.list_presets {
        print!("{}", cluster::list_presets());
        return Ok(0);
    }
    let name = a.cluster.as_deref().unwrap_or_default();
    let mut file = cluster::resolve(name)?;
    if let Some(h) = a.hosts {
        file.hosts = Some(h);
    }
    if let Some(k) = a.ranks_per_host {
        file.ranks_per_host = Some(k);
    }
    let c = file.check().map_err(|e| format!("{name}: {e}"))?;
    if a.show_cluster {
        print!("{}", file.to_toml()?);
        return Ok(0);
    }
    // Everything is computed before anything is printed: bad input is an
    // error, never half a report.
    let out = if a.workload.eq_ignore_ascii_case("step") {
        step::run(&a, &c)?
    } else {
        collectives::run(&a, &c)?
    };
    print!("{out}");
    Ok(0)
}

/// The report's first lines: what was simulated.
pub(crate) fn describe(c: &Checked, file: &str) -> String {
    let mut s = format!(
        "# tutti sim: {} ({file}): {} host(s) x {} rank(s) = {} ranks; predicted by the cost model, not measured\n",
        if c.name.is_empty() { "cluster" } else { &c.name },
        c.hosts,
        c.per_host,
        c.nranks()
    );
    s += &format!(
        "#   host:    {:.1} Gbit/s per rank, {} us{}\n",
        c.model.shm.gbps * 8.0,
        c.model.shm.alpha_us,
        if c.cpu_share < 1.0 {
            format!(" ({:.2} of a core per rank)", c.cpu_share)
        } else {
            String::new()
        }
    );
    if c.hosts > 1 {
        s += &format!(
            "#   network: {} port(s) x {:.1} Gbit/s per host, {} us, {:.1} Gbit/s per stream, oversubscription {}:1\n",
            c.ports,
            c.port_gbps * 8.0,
            c.model.tcp.alpha_us,
            c.model.tcp.gbps * 8.0,
            c.oversub
        );
        if c.burst_bytes > 0.0 {
            s += &format!(
                "#            token bucket {:.0} KiB per port each way (steady state of back-to-back calls)\n",
                c.burst_bytes / 1024.0
            );
        }
    }
    s
}

/// A cluster with `hosts` hosts instead of its own ([`Checked::with_hosts`]).
pub(crate) fn with_hosts(c: &Checked, hosts: usize) -> Checked {
    c.with_hosts(hosts)
}
