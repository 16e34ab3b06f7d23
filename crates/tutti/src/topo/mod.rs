//! Topology: which ranks share a host, and how each pair is connected.
//!
//! Two ranks share a host when their host identities are equal. The identity
//! is `TUTTI_HOST_ID` if set, otherwise hostname + boot id + network
//! namespace, so that ranks in different network namespaces on one machine
//! count as different hosts (and talk TCP), as they would on real hosts.

pub mod iface;

use serde::{Deserialize, Serialize};

/// Which transport a link uses (for `tutti topo` and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// Threads of one process.
    Local,
    /// Processes on one host, shared memory.
    Shm,
    /// TCP sockets.
    Tcp,
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportKind::Local => "local",
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
        })
    }
}

/// The machine's online CPUs. Not `available_parallelism`, which counts
/// this process's affinity mask: a rank bound to one core would conclude
/// that its peers (bound to the others) share that core with it.
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// This process's host identity.
pub fn host_id(explicit: Option<&str>) -> String {
    if let Some(h) = explicit {
        return h.to_string();
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{hostname}/{boot}/{netns}")
}

/// The identity of the physical machine (hostname + boot id, ignoring
/// network namespaces): ranks on one machine share its cores, whatever
/// hosts they pretend to be.
pub fn machine_id() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", hostname.trim(), boot.trim())
}

/// A host of the communicator.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Host {
    /// Host identity.
    pub id: String,
    /// Global ranks on this host, ascending.
    pub ranks: Vec<usize>,
    /// Online CPUs of the host, as its ranks reported them at set-up (the
    /// fewest, if they differ); 0 where unknown (ranks that are threads of
    /// one process, or a saved topology without it).
    #[serde(default)]
    pub cpus: usize,
    /// Every rank of the host can read its peers' memory with
    /// `process_vm_readv`, as they reported at set-up (each can, and all
    /// run as one user in one PID namespace); false where unknown.
    #[serde(default)]
    pub cma: bool,
}

/// The communicator's topology.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Topology {
    /// Number of ranks.
    pub nranks: usize,
    /// The hosts, ordered by their lowest rank.
    pub hosts: Vec<Host>,
    /// For each rank, the index of its host in `hosts`.
    pub host_of: Vec<usize>,
    /// For each rank, its index among the ranks of its host.
    pub local_rank: Vec<usize>,
    /// This rank's transport to each peer (`None` for itself).
    pub transports: Vec<Option<TransportKind>>,
}

impl Topology {
    /// The share of a core each rank gets on the most crowded host (at
    /// most 1): from the CPUs every host reported at set-up, the same on
    /// every rank, so that all ranks price calls alike (hosts with
    /// different core counts used to give different shares, and so
    /// different algorithms). A host that did not report its CPUs (ranks
    /// that are threads of this process) counts this machine's.
    pub fn cpu_share(&self) -> f64 {
        self.hosts
            .iter()
            .map(|h| {
                let cpus = if h.cpus > 0 { h.cpus } else { online_cpus() };
                cpus as f64 / h.ranks.len() as f64
            })
            .fold(1.0, f64::min)
    }

    /// Groups ranks by host identity.
    pub fn from_host_ids(ids: &[String]) -> Topology {
        let n = ids.len();
        let mut hosts: Vec<Host> = Vec::new();
        let mut host_of = vec![0; n];
        let mut local_rank = vec![0; n];
        for (r, id) in ids.iter().enumerate() {
            let h = match hosts.iter().position(|h| &h.id == id) {
                Some(h) => h,
                None => {
                    hosts.push(Host {
                        id: id.clone(),
                        ranks: Vec::new(),
                        cpus: 0,
                        cma: false,
                    });
                    hosts.len() - 1
                }
            };
            local_rank[r] = hosts[h].ranks.len();
            hosts[h].ranks.push(r);
            host_of[r] = h;
        }
        Topology {
            nranks: n,
            hosts,
            host_of,
            local_rank,
            transports: vec![None; n],
        }
    }

    /// Number of ranks on `rank`'s host.
    pub fn local_size(&self, rank: usize) -> usize {
        self.hosts[self.host_of[rank]].ranks.len()
    }
}
