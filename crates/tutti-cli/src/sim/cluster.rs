//! The cluster `tutti sim` prices calls on: a small TOML (or JSON) file, or
//! a preset, checked field by field ([`Cluster::check`]) and turned into
//! the cost model's parameters and a [`Fabric`].
//!
//! ```toml
//! name = "2 x 8 ranks, 100 Gbit/s Ethernet"
//! hosts = 2
//! ranks_per_host = 8
//!
//! [host]                 # level 0: ranks of one host (shared memory)
//! bandwidth_gbit = 64    # one rank's copy rate, Gbit/s
//! latency_us = 0.3
//! cores = 8              # optional: fewer cores than ranks slows every rank
//!
//! [network]              # level 1: between hosts (TCP)
//! bandwidth_gbit = 100   # one port (NIC), each way
//! latency_us = 20
//! ports = 1              # NICs per host
//! oversubscription = 1   # k for a k:1 oversubscribed switch
//! stream_gbit = 25       # optional: one rank's TCP stream at most
//! burst_kib = 256        # optional: each port's token bucket (a shaper's burst)
//! line_gbit = 10         # with burst_kib: the rate a burst leaves at
//! ```

use serde::{Deserialize, Serialize};
use std::path::Path;
use tutti::tune::fabric::Fabric;
use tutti::tune::{CostModel, LinkCost};

/// A described cluster (the file format).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Cluster {
    /// Free text shown in reports.
    #[serde(default)]
    pub name: String,
    /// Number of hosts.
    pub hosts: Option<usize>,
    /// Ranks on each host.
    pub ranks_per_host: Option<usize>,
    /// Every host is the same machine with this many cores (a namespace
    /// cluster): each rank gets `shared_cores / all ranks` of a core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cores: Option<usize>,
    /// Level 0: between the ranks of one host.
    pub host: Option<HostLevel>,
    /// Level 1: between hosts (required with more than one host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetLevel>,
}

/// Level 0 of a [`Cluster`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostLevel {
    /// One rank's copy rate through shared memory, Gbit/s.
    pub bandwidth_gbit: Option<f64>,
    /// Fixed cost of a message, microseconds.
    pub latency_us: Option<f64>,
    /// Cores of the host (default: one per rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
    /// Reduction rate, Gbit/s of incoming data (default: the cost model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_gbit: Option<f64>,
    /// Local copy rate, Gbit/s (default: the cost model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_gbit: Option<f64>,
}

/// Level 1 of a [`Cluster`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NetLevel {
    /// One port's bandwidth, each way, Gbit/s.
    pub bandwidth_gbit: Option<f64>,
    /// Fixed cost of a message between hosts, microseconds.
    pub latency_us: Option<f64>,
    /// Network ports (NICs) per host.
    #[serde(default = "one")]
    pub ports: usize,
    /// `k` of a `k:1` oversubscribed switch (1: full bisection).
    #[serde(default = "one_f")]
    pub oversubscription: f64,
    /// One rank's TCP stream at most, Gbit/s (default: the port's rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_gbit: Option<f64>,
    /// Each port's token bucket, KiB, each way (a shaper's burst, such
    /// as Linux tbf's, or what a switch port's buffer absorbs): after an
    /// idle spell this much passes at `line_gbit`. Absent or 0: none, every
    /// byte at `bandwidth_gbit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_kib: Option<f64>,
    /// The link's rate under the shaper, Gbit/s: how fast a burst leaves
    /// (and a stream's limit when `stream_gbit` is absent). Needed with
    /// `burst_kib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line_gbit: Option<f64>,
}

fn one() -> usize {
    1
}

fn one_f() -> f64 {
    1.0
}

/// A cluster file or preset that cannot be used: which field, and what it may be.
fn bad(field: &str, got: impl std::fmt::Display, allowed: &str) -> String {
    format!("cluster field `{field}` is {got}; allowed: {allowed}")
}

fn positive(field: &str, v: Option<f64>, example: &str) -> Result<f64, String> {
    match v {
        None => Err(bad(
            field,
            "missing",
            &format!("a positive number, e.g. {example}"),
        )),
        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
        Some(x) => Err(bad(field, x, &format!("a positive number, e.g. {example}"))),
    }
}

fn non_negative(field: &str, v: Option<f64>, example: &str) -> Result<f64, String> {
    match v {
        None => Err(bad(field, "missing", &format!("0 or more, e.g. {example}"))),
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => Err(bad(field, x, &format!("0 or more, e.g. {example}"))),
    }
}

fn optional_positive(field: &str, v: Option<f64>) -> Result<(), String> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => {
            Err(bad(field, x, "a positive number, or leave it out"))
        }
        _ => Ok(()),
    }
}

/// A cluster whose every field has been checked: the numbers the model needs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Checked {
    /// Free text.
    pub name: String,
    /// Hosts.
    pub hosts: usize,
    /// Ranks per host.
    pub per_host: usize,
    /// Cost-model parameters (links per level, rates, scaled where ranks share cores).
    pub model: CostModel,
    /// Ports per host.
    pub ports: usize,
    /// One port, GB/s.
    pub port_gbps: f64,
    /// Switch oversubscription.
    pub oversub: f64,
    /// The share of a core each rank gets (at most 1).
    pub cpu_share: f64,
    /// Each port's token bucket, bytes (0: none).
    pub burst_bytes: f64,
    /// The file's `shared_cores`: every host is one machine with this many cores.
    pub shared_cores: Option<usize>,
    /// The file's `host.cores`.
    pub host_cores: Option<usize>,
    /// `model` before the scaling for shared cores (what [`Checked::with_hosts`] rescales).
    pub unscaled: CostModel,
}

impl Checked {
    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.hosts * self.per_host
    }

    /// The fabric of this cluster.
    pub fn fabric(&self) -> Fabric {
        Fabric {
            burst_bytes: self.burst_bytes,
            ..Fabric::grid(
                self.hosts,
                self.per_host,
                self.ports,
                self.port_gbps,
                self.oversub,
            )
        }
    }

    /// The host of every rank, for problems spanning several hosts.
    pub fn hosts_arg(&self) -> Option<std::sync::Arc<[usize]>> {
        (self.hosts > 1).then(|| self.fabric().host_of.into())
    }

    /// The same cluster with `hosts` hosts: the share of a core each rank
    /// gets follows (with `shared_cores`, more hosts are more ranks on the
    /// same cores).
    pub fn with_hosts(&self, hosts: usize) -> Checked {
        let cpu_share = cpu_share(self.shared_cores, self.host_cores, hosts, self.per_host);
        Checked {
            hosts,
            cpu_share,
            model: scaled(self.unscaled, cpu_share),
            ..self.clone()
        }
    }

    /// How much slower each rank's own compute runs than on a machine of
    /// its own: `ranks / shared_cores` where the cluster is one machine
    /// (`shared_cores`) with fewer cores than ranks, else 1. `host.cores`
    /// does not slow it: a real host's ranks compute on their own devices
    /// (GPUs), and a CPU job's threads per rank are the user's to choose.
    pub fn compute_slowdown(&self) -> f64 {
        match self.shared_cores {
            Some(c) if self.nranks() > c => self.nranks() as f64 / c as f64,
            _ => 1.0,
        }
    }
}

/// The share of a core each of `hosts` x `per_host` ranks gets (at most 1).
fn cpu_share(
    shared_cores: Option<usize>,
    host_cores: Option<usize>,
    hosts: usize,
    per_host: usize,
) -> f64 {
    let cores_per_rank = match (shared_cores, host_cores) {
        (Some(c), _) => c as f64 / (hosts * per_host) as f64,
        (None, Some(c)) => c as f64 / per_host as f64,
        (None, None) => 1.0,
    };
    cores_per_rank.min(1.0)
}

/// `model` for ranks that get `cpu_share` of a core each.
fn scaled(mut model: CostModel, cpu_share: f64) -> CostModel {
    if cpu_share < 1.0 {
        // As the tuner does (`tune::price`): a hand-off waits for the
        // peer to be scheduled, and every rank moves bytes at its share.
        model.shm.alpha_us = model.shm.alpha_us.max(model.mailbox_us);
        model.local.alpha_us = model.local.alpha_us.max(model.mailbox_us);
        model.shm.gbps *= cpu_share;
        model.local.gbps *= cpu_share;
        model.copy_gbps *= cpu_share;
        model.reduce_gbps *= cpu_share;
    }
    model
}

impl Cluster {
    /// Reads a cluster file: TOML, or JSON if it ends in `.json` or starts with `{`.
    pub fn load(path: &Path) -> Result<Cluster, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read cluster file {}: {e}", path.display()))?;
        Cluster::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses TOML or JSON text.
    pub fn parse(text: &str) -> Result<Cluster, String> {
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("not a cluster file: {e}"))
        } else {
            toml::from_str(text).map_err(|e| format!("not a cluster file: {e}"))
        }
    }

    /// The cluster as TOML.
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| e.to_string())
    }

    /// Checks every field; the first bad one is named with what it may be.
    pub fn check(&self) -> Result<Checked, String> {
        let count = |field: &str, v: Option<usize>| match v {
            None => Err(bad(field, "missing", "a whole number of at least 1")),
            Some(0) => Err(bad(field, 0, "a whole number of at least 1")),
            Some(x) => Ok(x),
        };
        let hosts = count("hosts", self.hosts)?;
        let per_host = count("ranks_per_host", self.ranks_per_host)?;
        let h = self.host.as_ref().ok_or_else(|| {
            bad(
                "host",
                "missing",
                "a [host] table with bandwidth_gbit and latency_us",
            )
        })?;
        let shm = LinkCost {
            alpha_us: non_negative("host.latency_us", h.latency_us, "0.3")?,
            gbps: positive("host.bandwidth_gbit", h.bandwidth_gbit, "64")? / 8.0,
        };
        optional_positive("host.reduce_gbit", h.reduce_gbit)?;
        optional_positive("host.copy_gbit", h.copy_gbit)?;
        if h.cores == Some(0) {
            return Err(bad(
                "host.cores",
                0,
                "a whole number of at least 1, or leave it out",
            ));
        }
        if self.shared_cores == Some(0) {
            return Err(bad(
                "shared_cores",
                0,
                "a whole number of at least 1, or leave it out",
            ));
        }
        let mut model = CostModel {
            shm,
            local: shm,
            ..CostModel::default()
        };
        if let Some(r) = h.reduce_gbit {
            model.reduce_gbps = r / 8.0;
        }
        if let Some(c) = h.copy_gbit {
            model.copy_gbps = c / 8.0;
        }
        let (mut ports, mut port_gbps, mut oversub) = (1, f64::INFINITY, 1.0);
        let mut burst_bytes = 0.0;
        match (&self.network, hosts) {
            (None, 1) => {}
            (None, _) => {
                return Err(bad(
                    "network",
                    "missing",
                    "a [network] table with bandwidth_gbit and latency_us (needed with more than one host)",
                ))
            }
            (Some(net), _) => {
                let bw = positive("network.bandwidth_gbit", net.bandwidth_gbit, "100")?;
                let lat = non_negative("network.latency_us", net.latency_us, "20")?;
                if net.ports == 0 {
                    return Err(bad("network.ports", 0, "a whole number of at least 1"));
                }
                if !(net.oversubscription.is_finite() && net.oversubscription >= 1.0) {
                    return Err(bad(
                        "network.oversubscription",
                        net.oversubscription,
                        "1 (full bisection) or more, e.g. 4 for 4:1",
                    ));
                }
                optional_positive("network.stream_gbit", net.stream_gbit)?;
                let b = net.burst_kib.unwrap_or(0.0);
                if !(b.is_finite() && b >= 0.0) {
                    return Err(bad("network.burst_kib", b, "0 or more, e.g. 256"));
                }
                // A rank's stream is limited by the port's rate, or, with a
                // bucket, by the line under the shaper.
                let line = if b > 0.0 {
                    positive("network.line_gbit", net.line_gbit, "10 (needed with burst_kib)")?
                } else {
                    optional_positive("network.line_gbit", net.line_gbit)?;
                    bw
                };
                burst_bytes = b * 1024.0;
                model.tcp = LinkCost {
                    alpha_us: lat,
                    gbps: net.stream_gbit.unwrap_or(line).min(line) / 8.0,
                };
                ports = net.ports;
                port_gbps = bw / 8.0;
                oversub = net.oversubscription;
            }
        }
        let cpu_share = cpu_share(self.shared_cores, h.cores, hosts, per_host);
        Ok(Checked {
            name: self.name.clone(),
            hosts,
            per_host,
            ports,
            port_gbps,
            oversub,
            cpu_share,
            burst_bytes,
            shared_cores: self.shared_cores,
            host_cores: h.cores,
            unscaled: model,
            model: scaled(model, cpu_share),
        })
    }
}

/// A preset: name, what it is, and the cluster.
pub(crate) struct Preset {
    /// Name on the command line.
    pub name: &'static str,
    /// One line about it.
    pub about: &'static str,
    /// The cluster file's text.
    pub toml: &'static str,
}

/// The presets `tutti sim --list-presets` prints.
pub(crate) const PRESETS: &[Preset] = &[
    Preset {
        name: "1x8",
        about: "one host, 8 ranks over shared memory",
        toml: "name = \"1 x 8 ranks\"\nhosts = 1\nranks_per_host = 8\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n",
    },
    Preset {
        name: "2x8-eth100",
        about: "2 hosts x 8 ranks, 100 Gbit/s Ethernet (TCP, 25 Gbit/s per stream)",
        toml: "name = \"2 x 8 ranks, 100 Gbit/s Ethernet\"\nhosts = 2\nranks_per_host = 8\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 100\nlatency_us = 20\nstream_gbit = 25\n",
    },
    Preset {
        name: "2x8-eth200",
        about: "2 hosts x 8 ranks, 200 Gbit/s Ethernet (TCP, 25 Gbit/s per stream)",
        toml: "name = \"2 x 8 ranks, 200 Gbit/s Ethernet\"\nhosts = 2\nranks_per_host = 8\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 200\nlatency_us = 20\nstream_gbit = 25\n",
    },
    Preset {
        name: "2x8-roce200",
        about: "2 hosts x 8 ranks, 200 Gbit/s RoCE (3 us, one stream can fill the port)",
        toml: "name = \"2 x 8 ranks, 200 Gbit/s RoCE\"\nhosts = 2\nranks_per_host = 8\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 200\nlatency_us = 3\n",
    },
    Preset {
        name: "4x8-eth100",
        about: "4 hosts x 8 ranks, 100 Gbit/s Ethernet",
        toml: "name = \"4 x 8 ranks, 100 Gbit/s Ethernet\"\nhosts = 4\nranks_per_host = 8\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 100\nlatency_us = 20\nstream_gbit = 25\n",
    },
    Preset {
        name: "32x8-eth100",
        about: "32 hosts x 8 ranks, 100 Gbit/s Ethernet, full bisection",
        toml: "name = \"32 x 8 ranks, 100 Gbit/s Ethernet\"\nhosts = 32\nranks_per_host = 8\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 100\nlatency_us = 20\nstream_gbit = 25\n",
    },
    Preset {
        name: "32x8-eth100-4to1",
        about: "32 hosts x 8 ranks, 100 Gbit/s Ethernet, switch oversubscribed 4:1",
        toml: "name = \"32 x 8 ranks, 100 Gbit/s Ethernet, 4:1\"\nhosts = 32\nranks_per_host = 8\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 100\nlatency_us = 20\nstream_gbit = 25\noversubscription = 4\n",
    },
    Preset {
        name: "ns-1g",
        about: "scripts/cluster.sh on this 2-core machine: 2 namespaces x 1 rank, tbf 1 Gbit/s",
        toml: "name = \"namespace cluster, 1 Gbit/s tbf\"\nhosts = 2\nranks_per_host = 1\nshared_cores = 2\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 1\nlatency_us = 40\n",
    },
    Preset {
        name: "ns-200m",
        about: "scripts/cluster.sh on this 2-core machine: 2 namespaces x 1 rank, tbf 200 Mbit/s",
        toml: "name = \"namespace cluster, 200 Mbit/s tbf\"\nhosts = 2\nranks_per_host = 1\nshared_cores = 2\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 0.2\nlatency_us = 40\n",
    },
];

/// The cluster named by `arg`: a file if one exists there, else a preset.
pub(crate) fn resolve(arg: &str) -> Result<Cluster, String> {
    let p = Path::new(arg);
    if p.exists() {
        return Cluster::load(p);
    }
    match PRESETS.iter().find(|x| x.name.eq_ignore_ascii_case(arg)) {
        Some(x) => Cluster::parse(x.toml),
        None => Err(format!(
            "{arg:?} is neither a cluster file nor a preset; presets: {}",
            PRESETS
                .iter()
                .map(|x| x.name)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// `tutti sim --list-presets`.
pub(crate) fn list_presets() -> String {
    let mut s =
        String::from("presets (tutti sim PRESET ...; --show-cluster prints one as a file)\n");
    for x in PRESETS {
        s += &format!("  {:<18} {}\n", x.name, x.about);
    }
    s
}
