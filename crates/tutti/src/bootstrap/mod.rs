//! Rendezvous: how ranks find each other and connect.
//!
//! Rank 0 hosts a [`store`] (a small TCP key-value store). Every rank
//! connects to it with the job's auth token, publishes its host identity,
//! process id and the address of its own peer listener, and reads everybody
//! else's. Ranks on one host then map a shared segment (created by the
//! host's lowest rank and unlinked as soon as all have mapped it); ranks on
//! different hosts connect directly over TCP, the higher rank dialling the
//! lower, each connection opened with the auth token and the dialler's rank.
//! This module runs the exchange rounds; the wiring itself is each
//! transport's (`transport::shm::connect`, `transport::tcp::connect`).
//!
//! Where the rank, size and master come from: [`UniqueId`] (launcher-free,
//! like `ncclGetUniqueId`), or the environment ([`EnvInfo::from_env`]).

pub use crate::config::rank_table;
pub mod store;
mod torch_store;

pub use crate::config::launch::EnvInfo;
use crate::config::{Config, TransportChoice};
use crate::error::{Error, Result};
use crate::topo::{self, Topology};
use crate::transport::shm::{self, Segment};
use crate::transport::tcp::{self, IoSet};
use crate::transport::{sys, Link, LinkOps};
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use store::{StoreClient, StoreServer};

/// A printable handle that lets ranks find each other without a launcher:
/// the root's address and port and a random auth token.
///
/// Create it once (on any rank, usually 0), pass its string form to the
/// other ranks by any means, and call
/// [`Communicator::init_rank`](crate::Communicator::init_rank) on each.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UniqueId {
    /// Where the root's store listens.
    pub addr: SocketAddr,
    /// The job's auth token.
    pub token: [u8; 16],
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({})", self.addr)
    }
}

/// Listeners bound by `UniqueId::new`, waiting for rank 0 of this process.
fn pending_listeners() -> &'static Mutex<HashMap<SocketAddr, TcpListener>> {
    static P: OnceLock<Mutex<HashMap<SocketAddr, TcpListener>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(crate) fn random_token() -> [u8; 16] {
    let mut t = [0u8; 16];
    getrandom::getrandom(&mut t).expect("the OS random source failed");
    t
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl UniqueId {
    /// Binds a listener for the root on `TUTTI_SOCKET_IFNAME`'s address (or
    /// loopback) and a random port, and makes a fresh token. The process that
    /// calls this must also be the one that runs rank 0.
    pub fn new() -> Result<UniqueId> {
        let ip = match crate::config::socket_ifname_from_env() {
            Some(spec) => crate::topo::iface::pick(&spec)?.ok_or_else(|| {
                Error::Config(format!(
                    "TUTTI_SOCKET_IFNAME={spec:?} matches no interface with an IPv4 address"
                ))
            })?,
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let l =
            TcpListener::bind((ip, 0)).map_err(|e| Error::io("binding the root listener", e))?;
        let addr = l
            .local_addr()
            .map_err(|e| Error::io("root listener address", e))?;
        pending_listeners()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr, l);
        Ok(UniqueId {
            addr,
            token: random_token(),
        })
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tutti1:{}:{}", self.addr, hex(&self.token))
    }
}

impl FromStr for UniqueId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::arg(format!(
                "{s:?} is not a tutti unique id (expected tutti1:ADDR:PORT:TOKEN)"
            ))
        };
        let rest = s.trim().strip_prefix("tutti1:").ok_or_else(bad)?;
        let (addr, tok) = rest.rsplit_once(':').ok_or_else(bad)?;
        let addr: SocketAddr = addr.parse().map_err(|_| bad())?;
        let token = crate::config::launch::parse_token(tok).ok_or_else(bad)?;
        Ok(UniqueId { addr, token })
    }
}

impl EnvInfo {
    /// The master's socket address, and the token (derived from the master's
    /// address when `TUTTI_TOKEN` is not set, which only guards against
    /// accidents, not attackers).
    pub(crate) fn unique_id(&self) -> Result<UniqueId> {
        let addr = (self.master_addr.as_str(), self.master_port)
            .to_socket_addrs()
            .map_err(|e| {
                Error::Config(format!(
                    "cannot resolve master address {:?}: {e}",
                    self.master_addr
                ))
            })?
            .find(|a| a.is_ipv4())
            .ok_or_else(|| {
                Error::Config(format!(
                    "master address {:?} has no IPv4 address",
                    self.master_addr
                ))
            })?;
        let token = self.token.unwrap_or_else(|| {
            let mut t = [0u8; 16];
            let s = format!("tutti:{}:{}", self.master_addr, self.master_port);
            for (i, b) in s.bytes().enumerate() {
                t[i % 16] = t[i % 16].wrapping_mul(31).wrapping_add(b);
            }
            t
        });
        Ok(UniqueId { addr, token })
    }
}

/// The set-up rounds' interface lives with the transports that use it.
pub(crate) use crate::transport::Exchange;

/// [`Exchange`] through the store: round k puts `x{k}/{rank}` and reads everybody's.
pub(crate) struct StoreExchange<'a> {
    pub client: &'a mut StoreClient,
    pub rank: usize,
    pub n: usize,
    pub round: u32,
    pub deadline: Instant,
}

impl Exchange for StoreExchange<'_> {
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let k = self.round;
        self.round += 1;
        self.client
            .put(&format!("x{k}/{}", self.rank), mine, self.deadline)?;
        (0..self.n)
            .map(|r| self.client.get(&format!("x{k}/{r}"), self.deadline))
            .collect()
    }

    fn barrier(&mut self) -> Result<()> {
        let k = self.round;
        self.round += 1;
        self.client.barrier(&format!("b{k}"), self.n, self.deadline)
    }
}

/// The transports of a connected group.
pub(crate) struct Connected {
    /// The peer listener, kept after set-up: if rank failures force a
    /// shrink, the lowest survivor serves a store on it.
    pub rescue: Option<TcpListener>,
    /// Every rank's listener address.
    pub peer_addrs: Vec<SocketAddr>,
    /// Ranks of this group on this physical machine (they share its cores).
    pub ranks_on_machine: usize,
    pub links: Vec<Option<Link>>,
    /// The point-to-point channel's links ([`crate::p2p`]): rings on the
    /// segment's P2P channel, or a TCP socket of its own per peer.
    pub p2p_links: Vec<Option<Link>>,
    pub peer_pids: Vec<Option<i32>>,
    pub topo: Topology,
    pub segment: Option<(Arc<Segment>, usize)>,
    /// The I/O thread of the TCP links, if they have one.
    pub io: Option<Arc<IoSet>>,
}

/// What rendezvous hands to the communicator.
pub(crate) struct Joined {
    pub conn: Connected,
    /// The address other ranks reach this one at.
    pub ip: IpAddr,
    pub server: Option<StoreServer>,
    pub client: StoreClient,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct RankInfo {
    host: String,
    /// The physical machine (see [`topo::machine_id`]).
    #[serde(default)]
    machine: String,
    pid: i32,
    addr: SocketAddr,
    nranks: usize,
    /// Online CPUs of this rank's machine (0 from a peer that does not say).
    #[serde(default)]
    cpus: usize,
    /// This rank can read its peers' memory ([`sys::cma_usable`]; false
    /// from a peer that does not say).
    #[serde(default)]
    cma: bool,
    /// This rank's user id ([`sys::uid`]); `process_vm_readv` between
    /// ranks needs the same one.
    #[serde(default)]
    uid: Option<u32>,
    /// This rank's PID namespace ([`sys::pid_namespace`]): the pids in
    /// direct-read descriptors mean the same process only within one.
    #[serde(default)]
    pidns: String,
}

/// Whether the ranks `infos` of one host can read each other's memory:
/// each can ([`sys::cma_usable`]), and all run as one user in one PID
/// namespace (ranks in containers that share a host's network but not its
/// processes do not).
fn host_cma(infos: &[&RankInfo]) -> bool {
    let Some(first) = infos.first() else {
        return false;
    };
    infos.iter().all(|i| {
        i.cma
            && i.uid.is_some()
            && i.uid == first.uid
            && !i.pidns.is_empty()
            && i.pidns == first.pidns
    })
}

/// Joins the job described by `id` as `rank` of `nranks`: through tutti's
/// store, which rank 0 serves on `id`'s address, or, with `agent_store`
/// (a key prefix, see [`EnvInfo::agent_store`]), through the launcher's
/// torch `TCPStore` there.
pub(crate) fn rendezvous(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    cfg: &Config,
    agent_store: Option<&str>,
) -> Result<Joined> {
    if nranks == 0 || rank >= nranks {
        return Err(Error::arg(format!(
            "rank {rank} is not below the number of ranks {nranks}"
        )));
    }
    // A congestion control the kernel refuses fails every rank alike,
    // before any of them has reached the store.
    tcp::connect::check_congestion(cfg)?;
    let deadline = crate::config::deadline_after(Instant::now(), cfg.connect_timeout);
    let boot = |msg: String| Error::Bootstrap { rank, msg };
    if let Some(prefix) = agent_store {
        // Every communicator this process joins through the launcher's
        // store gets its own keys: the ranks create theirs in the same order.
        static JOINS: AtomicU32 = AtomicU32::new(0);
        let k = JOINS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{}/tutti/{k}", prefix.trim_end_matches('/'));
        let client = StoreClient::connect_torch(id.addr, prefix, rank, deadline)?;
        return join_through(client, None, id, nranks, rank, cfg, deadline);
    }
    // Rank 0 serves the store.
    let server = if rank == 0 {
        let l = pending_listeners()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id.addr);
        let l = match l {
            Some(l) => l,
            None => {
                let bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), id.addr.port());
                bind_retry(bind, deadline).map_err(|e| {
                    boot(format!("cannot listen on port {} for the store: {e}; is another job using it? choose another MASTER_PORT", id.addr.port()))
                })?
            }
        };
        Some(StoreServer::start(l, id.token)?)
    } else {
        None
    };
    let target = match &server {
        Some(s) if id.addr.ip().is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), s.addr().port())
        }
        _ => id.addr,
    };
    let client = StoreClient::connect(target, id.token, rank, deadline)?;
    join_through(client, server, id, nranks, rank, cfg, deadline)
}

/// The rest of [`rendezvous`], once this rank holds a store connection
/// (and rank 0 of tutti's own store, its `server`).
fn join_through(
    mut client: StoreClient,
    server: Option<StoreServer>,
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    cfg: &Config,
    deadline: Instant,
) -> Result<Joined> {
    let boot = |msg: String| Error::Bootstrap { rank, msg };
    // Our peer listener goes on an address that reaches the master (or the chosen interface).
    let my_ip = client
        .local_addr()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let members: Vec<usize> = (0..nranks).collect();
    let conn = {
        let mut ex = StoreExchange {
            client: &mut client,
            rank,
            n: nranks,
            round: 0,
            deadline,
        };
        connect(
            &mut ex,
            rank,
            Some(&members),
            cfg,
            id.token,
            my_ip,
            deadline,
        )?
        .ok_or_else(|| boot("internal: rank missing from its own group".into()))?
    };
    // The store is only for set-up: once every rank has its last reply it
    // stops, freeing the port for the next communicator (recovery uses the
    // ranks' own listeners).
    match server {
        Some(s) => {
            s.linger_for(nranks - 1);
            drop(s);
        }
        None => client.release(deadline)?,
    }
    Ok(Joined {
        conn,
        server: None,
        client,
        ip: my_ip,
    })
}

/// The address this process's peer listener should use.
fn listen_ip(cfg: &Config, default: IpAddr) -> Result<IpAddr> {
    match &cfg.socket_ifname {
        Some(spec) => topo::iface::pick(spec)?.ok_or_else(|| {
            Error::Config(format!(
                "TUTTI_SOCKET_IFNAME={spec:?} matches no interface with an IPv4 address"
            ))
        }),
        None => Ok(default),
    }
}

/// Connects a group. `me` is this process's index in the exchange;
/// `members` lists the exchange indices of its group in new-rank order
/// (`None`: this process joins no group but must still take part in every
/// exchange round). Ranks on one host share a segment; others use TCP.
pub(crate) fn connect(
    ex: &mut dyn Exchange,
    me: usize,
    members: Option<&[usize]>,
    cfg: &Config,
    token: [u8; 16],
    default_ip: IpAddr,
    deadline: Instant,
) -> Result<Option<Connected>> {
    let boot = |msg: String| Error::Bootstrap { rank: me, msg };
    let my_rank = members.and_then(|m| m.iter().position(|&x| x == me));
    let nranks = members.map_or(0, |m| m.len());
    // Round 1: who is where.
    let listener = match my_rank {
        Some(_) => {
            let ip = listen_ip(cfg, default_ip)?;
            let l = TcpListener::bind((ip, 0))
                .map_err(|e| boot(format!("cannot listen for peers on {ip}: {e}")))?;
            // Before any peer connects: accepted sockets take it.
            tcp::connect::set_congestion(cfg, socket2::SockRef::from(&l))?;
            Some(l)
        }
        None => None,
    };
    let mine = match &listener {
        Some(l) => serde_json::to_vec(&RankInfo {
            host: topo::host_id(cfg.host_id.as_deref()),
            machine: topo::machine_id(),
            pid: sys::pid(),
            addr: l.local_addr().map_err(|e| Error::io("peer listener", e))?,
            nranks,
            cpus: sys::online_cpus(),
            cma: sys::cma_usable(),
            uid: Some(sys::uid()),
            pidns: sys::pid_namespace(),
        })
        .expect("serialise"),
        None => Vec::new(),
    };
    let all = ex.allgather(&mine)?;
    let (Some(members), Some(rank)) = (members, my_rank) else {
        // Not in a group: keep step with the others' rounds.
        ex.allgather(&[])?;
        ex.barrier()?;
        ex.barrier()?;
        return Ok(None);
    };
    let mut infos = Vec::with_capacity(nranks);
    for (r, &x) in members.iter().enumerate() {
        let i: RankInfo = serde_json::from_slice(&all[x])
            .map_err(|e| boot(format!("malformed info from rank {r}: {e}")))?;
        if i.nranks != nranks {
            return Err(boot(format!(
                "rank {r} was started with world size {}, this rank with {nranks}; all ranks must agree",
                i.nranks
            )));
        }
        infos.push(i);
    }
    let mut ids: Vec<String> = infos.iter().map(|i| i.host.clone()).collect();
    if let Some(path) = &cfg.topo_file {
        // A saved topology decides which ranks share a host.
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("TUTTI_TOPO_FILE={path:?}: {e}")))?;
        let t: Topology = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("TUTTI_TOPO_FILE={path:?}: {e}")))?;
        if t.host_of.len() != nranks {
            return Err(Error::Config(format!(
                "TUTTI_TOPO_FILE={path:?} describes {} ranks, this job has {nranks}",
                t.host_of.len()
            )));
        }
        ids = t
            .host_of
            .iter()
            .map(|h| format!("topo-file-host-{h}"))
            .collect();
    }
    let mut topo = Topology::from_host_ids(&ids);
    // Every rank learns every host's CPUs, so that all price calls alike
    // where ranks outnumber cores (`TuneCtx::cpu_share`), and whether its
    // ranks can read each other's memory (`TuneCtx::cma_trials`).
    for h in &mut topo.hosts {
        h.cpus = h
            .ranks
            .iter()
            .map(|&r| infos[r].cpus)
            .filter(|&c| c > 0)
            .min()
            .unwrap_or(0);
        h.cma = host_cma(&h.ranks.iter().map(|&r| &infos[r]).collect::<Vec<_>>());
    }
    let my_host = topo.host_of[rank];
    let locals = topo.hosts[my_host].ranks.clone();
    let shm = cfg.transport == TransportChoice::Auto && locals.len() > 1;
    let use_shm = |q: usize| shm && topo.host_of[q] == my_host;
    let mut links: Vec<Option<Link>> = (0..nranks).map(|_| None).collect();
    let mut p2p_links: Vec<Option<Link>> = (0..nranks).map(|_| None).collect();
    let mut peer_pids = vec![None; nranks];

    // Round 2: the host's shared segment (every rank takes part in its
    // rounds, with or without shared memory).
    let local_me = topo.local_rank[rank];
    let host = shm::connect::HostRanks {
        locals: &locals,
        me: local_me,
        leader: members[locals[0]],
        exchange_me: me,
    };
    let chans = [&mut links, &mut p2p_links];
    let segment = shm::connect::wire(ex, shm, &host, &token, cfg.ring_bytes, chans, &boot)?;
    if segment.is_some() {
        for &q in locals.iter().filter(|&&q| q != rank) {
            peer_pids[q] = Some(infos[q].pid);
        }
    }
    let segment = segment.map(|seg| (seg, local_me));

    // TCP to everybody else: dial lower ranks (this rank decides the pair's
    // sockets and frame size), accept higher ones.
    let tcp_peers: Vec<usize> = (0..nranks).filter(|&q| q != rank && !use_shm(q)).collect();
    let addrs: Vec<SocketAddr> = infos.iter().map(|i| i.addr).collect();
    tcp::connect::connect_peers(
        cfg,
        rank,
        &tcp_peers,
        &addrs,
        listener.as_ref(),
        token,
        deadline,
        &mut links,
        &mut p2p_links,
        &boot,
    )?;
    let ranks_on_machine = infos
        .iter()
        .filter(|i| i.machine == infos[rank].machine)
        .count();
    let io = tcp::connect::start_io_thread(cfg, &mut links, ranks_on_machine, segment.as_ref())?;
    for (q, l) in links.iter().enumerate() {
        topo.transports[q] = l.as_ref().map(|l| l.kind());
    }
    ex.barrier()?;
    Ok(Some(Connected {
        links,
        p2p_links,
        peer_pids,
        topo,
        segment,
        io,
        rescue: listener,
        peer_addrs: infos.iter().map(|i| i.addr).collect(),
        ranks_on_machine,
    }))
}

fn bind_retry(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpListener> {
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && Instant::now() + Duration::from_millis(50)
                        < deadline.min(Instant::now() + Duration::from_secs(5)) =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(cma: bool, uid: Option<u32>, pidns: &str) -> RankInfo {
        RankInfo {
            host: "h".into(),
            machine: String::new(),
            pid: 1,
            addr: "127.0.0.1:1".parse().unwrap(),
            nranks: 2,
            cpus: 2,
            cma,
            uid,
            pidns: pidns.into(),
        }
    }

    /// A host's ranks read each other's memory only where every one can,
    /// as one user, in one PID namespace; a rank that does not say (an
    /// older peer) counts as one that cannot.
    #[test]
    fn host_cma_needs_every_rank_one_user_one_pid_namespace() {
        let ns = "pid:[4026531836]";
        let ok = info(true, Some(1000), ns);
        assert!(host_cma(&[&ok, &info(true, Some(1000), ns)]));
        assert!(!host_cma(&[&ok, &info(false, Some(1000), ns)]));
        assert!(!host_cma(&[&ok, &info(true, Some(0), ns)]));
        assert!(!host_cma(&[&ok, &info(true, None, ns)]));
        assert!(!host_cma(&[
            &ok,
            &info(true, Some(1000), "pid:[4026532000]")
        ]));
        assert!(!host_cma(&[
            &info(true, Some(1000), ""),
            &info(true, Some(1000), "")
        ]));
        let old: RankInfo =
            serde_json::from_str(r#"{"host":"h","pid":1,"addr":"127.0.0.1:1","nranks":2}"#)
                .unwrap();
        assert!(!host_cma(&[&ok, &old]));
        assert!(!host_cma(&[]));
    }
}
