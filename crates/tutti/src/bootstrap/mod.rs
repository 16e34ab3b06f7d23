//! Rendezvous: how ranks find each other and connect.
//!
//! Rank 0 hosts a [`store`] (a small TCP key-value store). Every rank
//! connects to it with the job's auth token, publishes its host identity,
//! process id and the address of its own peer listener, and reads everybody
//! else's. Ranks on one host then map a shared segment (created by the
//! host's lowest rank and unlinked as soon as all have mapped it); ranks on
//! different hosts connect directly over TCP, the higher rank dialling the
//! lower, each connection opened with the auth token and the dialler's rank.
//!
//! Where the rank, size and master come from: [`UniqueId`] (launcher-free,
//! like `ncclGetUniqueId`), or the environment ([`EnvInfo::from_env`]).

pub mod rank_table;
pub mod store;

pub use crate::config::launch::EnvInfo;
use crate::config::{Config, TcpCongestion, TransportChoice};
use crate::error::{Error, Result};
use crate::topo::{self, Topology};
use crate::transport::shm::{self, DirectRead, Layout, Segment, P2P_CHANNEL};
use crate::transport::tcp::{Framing, TcpLink, MAX_LANES};
use crate::transport::tcp_io::{self, Bell, IoSet};
use crate::transport::{sys, Link, TransportKind};
use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::str::FromStr;
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
        if tok.len() != 32 {
            return Err(bad());
        }
        let mut token = [0u8; 16];
        for (i, t) in token.iter_mut().enumerate() {
            *t = u8::from_str_radix(&tok[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
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

/// A way for the ranks being connected to swap small messages: the store
/// (first set-up) or the parent communicator (split).
pub(crate) trait Exchange {
    /// Every participant contributes `mine`; returns all contributions in
    /// participant order. Every participant must call it the same number of times.
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Waits until every participant has arrived.
    fn barrier(&mut self) -> Result<()>;
}

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

/// Joins the job described by `id` as `rank` of `nranks`.
pub(crate) fn rendezvous(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    cfg: &Config,
) -> Result<Joined> {
    if nranks == 0 || rank >= nranks {
        return Err(Error::arg(format!(
            "rank {rank} is not below the number of ranks {nranks}"
        )));
    }
    let deadline = crate::config::deadline_after(Instant::now(), cfg.connect_timeout);
    let boot = |msg: String| Error::Bootstrap { rank, msg };
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
    let mut client = StoreClient::connect(target, id.token, rank, deadline)?;
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
            Some(
                TcpListener::bind((ip, 0))
                    .map_err(|e| boot(format!("cannot listen for peers on {ip}: {e}")))?,
            )
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

    // Round 2: each host's lowest rank creates the segment and names it.
    let layout = Layout::new(locals.len().max(1), cfg.ring_bytes);
    let local_me = topo.local_rank[rank];
    let mut created = None;
    let name_out = if shm && local_me == 0 {
        let c = shm::connect::create(&token, me, layout).map_err(|e| boot(e.to_string()))?;
        let name = c.name.clone().into_bytes();
        created = Some(c);
        name
    } else {
        Vec::new()
    };
    let names = ex.allgather(&name_out)?;
    let segment = if shm {
        let seg = match created.take() {
            Some(c) => {
                let r = ex.barrier(); // everybody has mapped it
                let seg = c.unlink(); // removes the file, on success or failure
                r?;
                seg
            }
            None => {
                let leader = members[locals[0]];
                let name = String::from_utf8(names[leader].clone())
                    .map_err(|_| boot("bad segment name".into()))?;
                let seg = shm::connect::open(&name, layout).map_err(|e| boot(e.to_string()))?;
                ex.barrier()?;
                seg
            }
        };
        for (chan, links) in [(0, &mut links), (P2P_CHANNEL, &mut p2p_links)] {
            let (direct, kind) = (DirectRead::Cma, TransportKind::Shm);
            shm::connect::ring_links(&seg, chan, local_me, &locals, direct, kind, links);
        }
        for &q in locals.iter().filter(|&&q| q != rank) {
            peer_pids[q] = Some(infos[q].pid);
        }
        Some((seg, local_me))
    } else {
        ex.barrier()?;
        None
    };

    // TCP to everybody else: dial lower ranks (this rank decides the pair's
    // sockets and frame size), accept higher ones.
    let tcp_peers = (0..nranks).filter(|&q| q != rank && !use_shm(q)).count();
    let framing = tcp_framing(cfg, tcp_peers);
    for q in (0..rank).filter(|&q| !use_shm(q)) {
        let mut socks = Vec::with_capacity(framing.lanes);
        // The pair's lanes, then the point-to-point channel's socket.
        for lane in 0..=framing.lanes {
            let hello = Hello {
                rank,
                lane: if lane == framing.lanes { 0 } else { lane },
                framing,
                p2p: lane == framing.lanes,
            };
            let s = dial(infos[q].addr, token, &hello, deadline).map_err(|e| {
                boot(format!(
                    "cannot connect to rank {q} at {}: {e}",
                    infos[q].addr
                ))
            })?;
            socks.push(s);
        }
        let p2p = socks.pop().expect("the P2P socket was dialled last");
        links[q] = Some(Link::Tcp(TcpLink::new(socks, q, framing.chunk)?));
        p2p_links[q] = Some(Link::Tcp(TcpLink::new(vec![p2p], q, framing.chunk)?));
    }
    let expect: Vec<usize> = (rank + 1..nranks).filter(|&q| !use_shm(q)).collect();
    if let Some(l) = &listener {
        accept_peers(l, token, &expect, &mut links, &mut p2p_links, deadline).map_err(boot)?;
    }
    set_congestion(cfg, &links)?;
    let ranks_on_machine = infos
        .iter()
        .filter(|i| i.machine == infos[rank].machine)
        .count();
    let io = if links.iter().any(|l| matches!(l, Some(Link::Tcp(_))))
        && use_io_thread(cfg, ranks_on_machine)
    {
        let bell = match &segment {
            Some((seg, i)) => Bell::Seg(seg.clone(), *i),
            None => tcp_io::own_bell(),
        };
        let mut tcp = Vec::new();
        for (q, l) in links.iter_mut().enumerate() {
            if matches!(l, Some(Link::Tcp(_))) {
                if let Some(Link::Tcp(t)) = l.take() {
                    tcp.push((q, t));
                }
            }
        }
        let peers: Vec<usize> = tcp.iter().map(|(q, _)| *q).collect();
        let (set, io_links) = IoSet::start(tcp, bell, cfg.spin_for(2 * ranks_on_machine))?;
        for (q, l) in peers.into_iter().zip(io_links) {
            links[q] = Some(Link::TcpIo(l));
        }
        Some(set)
    } else {
        None
    };
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

/// Puts every TCP socket on the congestion control `cfg` asks for
/// ([`TcpCongestion`]): `Auto` tries cubic and keeps the system's default
/// if the kernel refuses; a named one that the kernel refuses fails set-up.
fn set_congestion(cfg: &Config, links: &[Option<Link>]) -> Result<()> {
    let (name, required) = match &cfg.tcp_congestion {
        TcpCongestion::Auto => ("cubic", false),
        TcpCongestion::System => return Ok(()),
        TcpCongestion::Named(n) => (n.as_str(), true),
    };
    for (q, l) in links.iter().enumerate() {
        if let Some(Link::Tcp(t)) = l {
            match t.set_congestion(name) {
                Ok(()) => {}
                Err(e) if !required => {
                    tracing::debug!(
                        "TCP sockets keep the system's congestion control: {name}: {e}"
                    );
                    return Ok(());
                }
                Err(e) => {
                    return Err(Error::Config(format!(
                        "TUTTI_TCP_CONGESTION={name}: the kernel refused it on the link to \
                         rank {q} ({e}); see /proc/sys/net/ipv4/tcp_available_congestion_control \
                         (and tcp_allowed_congestion_control for unprivileged processes), or \
                         use auto or system"
                    )))
                }
            }
        }
    }
    Ok(())
}

/// Whether a communicator's TCP links get a dedicated I/O thread:
/// `TUTTI_TCP_IO_THREAD`, or automatically when this machine has at least
/// two cores for each of the communicator's ranks on it (the executor and
/// the I/O thread then each have one).
fn use_io_thread(cfg: &Config, ranks_on_machine: usize) -> bool {
    cfg.tcp_io_thread.unwrap_or_else(|| {
        let cores = sys::online_cpus();
        cores >= 2 * ranks_on_machine.max(1)
    })
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

/// How many sockets, and what frame size, a TCP pair dialled by this rank
/// gets: `TUTTI_TCP_SOCKETS`, or automatically 2 when this rank has a
/// single TCP peer, else 1: a rank with several TCP peers already has a
/// flow per peer, and more flows through one shared link only contend in
/// its queue. Measured (see docs/performance.md): on loopback 2 sockets
/// carry 1-4 MiB AllReduce 1.5-1.8x faster than one; on the 1 Gbit/s
/// namespace cluster with 2 and 4 ranks per host, AllToAll reached 82% and
/// 74% of the link with 4 sockets per pair, 93-95% and 88-92% with 2, and
/// 97% and 92-98% with 1. Messages of one frame (256 KiB and less) use one
/// socket whatever the count.
fn tcp_framing(cfg: &Config, tcp_peers: usize) -> Framing {
    let auto = if tcp_peers == 1 { 2 } else { 1 };
    Framing {
        lanes: cfg.tcp_sockets.unwrap_or(auto).clamp(1, MAX_LANES),
        chunk: cfg.tcp_chunk,
    }
}

/// What a dialling rank says after the token on each socket it opens to a
/// peer: its rank, which lane (socket) of the pair this is, and the pair's
/// framing. On the wire (8 bytes after the 16-byte token): rank (u32, little
/// endian), lane (u8), lanes (u8), log2 of the frame size (u8), and 1 for
/// the pair's point-to-point socket (its lane then 0), else 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hello {
    rank: usize,
    lane: usize,
    framing: Framing,
    /// The socket of the point-to-point channel, not a lane.
    p2p: bool,
}

impl Hello {
    fn encode(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&(self.rank as u32).to_le_bytes());
        b[4] = self.lane as u8;
        b[5] = self.framing.lanes as u8;
        b[6] = self.framing.chunk.trailing_zeros() as u8;
        b[7] = u8::from(self.p2p);
        b
    }

    /// Decodes and validates the 8 bytes after the token.
    fn decode(b: &[u8; 8]) -> Option<Hello> {
        let rank = u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as usize;
        let (lane, lanes, log2) = (b[4] as usize, b[5] as usize, b[6] as u32);
        if lanes == 0
            || lanes > MAX_LANES
            || lane >= lanes
            || !(12..=26).contains(&log2)
            || b[7] > 1
            || (b[7] == 1 && lane != 0)
        {
            return None;
        }
        Some(Hello {
            rank,
            lane,
            framing: Framing {
                lanes,
                chunk: 1 << log2,
            },
            p2p: b[7] == 1,
        })
    }
}

fn dial(
    addr: SocketAddr,
    token: [u8; 16],
    hello: &Hello,
    deadline: Instant,
) -> std::io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(
            &addr,
            left.max(Duration::from_millis(10))
                .min(Duration::from_secs(2)),
        ) {
            Ok(mut s) => {
                let mut msg = [0u8; 24];
                msg[..16].copy_from_slice(&token);
                msg[16..].copy_from_slice(&hello.encode());
                s.write_all(&msg)?;
                return Ok(s);
            }
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("dial {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A connection whose hello has not fully arrived yet.
struct Pending {
    sock: TcpStream,
    from: SocketAddr,
    since: Instant,
    hello: [u8; 24],
    got: usize,
}

/// Accepts the expected ranks' connections (every lane of each). Hellos
/// are read without blocking, each connection with its own 2-second
/// allowance, so a slow or silent stranger cannot hold up the ranks behind
/// it.
fn accept_peers(
    l: &TcpListener,
    token: [u8; 16],
    expect: &[usize],
    links: &mut [Option<Link>],
    p2p_links: &mut [Option<Link>],
    deadline: Instant,
) -> std::result::Result<(), String> {
    let mut missing: Vec<usize> = expect.to_vec();
    let mut pending: Vec<Pending> = Vec::new();
    // Sockets arrived so far, per rank: the framing its first socket
    // announced, the sockets by lane, and the point-to-point socket.
    type Partial = (Framing, Vec<Option<TcpStream>>, Option<TcpStream>);
    let mut partial: HashMap<usize, Partial> = HashMap::new();
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    while !missing.is_empty() {
        if Instant::now() >= deadline {
            return Err(format!("timed out waiting for rank(s) {missing:?} to connect; are they running and able to reach this host?"));
        }
        let mut busy = false;
        match l.accept() {
            Ok((sock, from)) => {
                busy = true;
                if sock.set_nonblocking(true).is_ok() && pending.len() < 1024 {
                    pending.push(Pending {
                        sock,
                        from,
                        since: Instant::now(),
                        hello: [0; 24],
                        got: 0,
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accept failed: {e}")),
        }
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            let r = p.sock.read(&mut p.hello[p.got..]);
            let mut drop_it = None;
            match r {
                Ok(0) => drop_it = Some("closed before its hello".to_string()),
                Ok(k) => {
                    busy = true;
                    p.got += k;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => drop_it = Some(e.to_string()),
            }
            if drop_it.is_none() && p.got == 24 {
                let p = pending.swap_remove(i);
                if p.hello[..16] != token {
                    tracing::warn!(
                        "tutti: dropped a connection from {}: wrong auth token",
                        p.from
                    );
                    continue;
                }
                let Some(h) = Hello::decode(p.hello[16..].try_into().expect("8 bytes")) else {
                    tracing::warn!(
                        "tutti: dropped a connection from {}: malformed hello",
                        p.from
                    );
                    continue;
                };
                let q = h.rank;
                if !missing.contains(&q) {
                    tracing::warn!(
                        "tutti: dropped a connection from {} claiming unexpected rank {q}",
                        p.from
                    );
                    continue;
                }
                let (framing, socks, p2p) = partial.entry(q).or_insert_with(|| {
                    (
                        h.framing,
                        (0..h.framing.lanes).map(|_| None).collect(),
                        None,
                    )
                });
                let slot = if h.p2p { &mut *p2p } else { &mut socks[h.lane] };
                if *framing != h.framing || slot.is_some() {
                    tracing::warn!(
                        "tutti: dropped a connection from {} claiming rank {q}: its lane {} of {} (p2p: {}) does not fit the lanes already connected",
                        p.from, h.lane, h.framing.lanes, h.p2p
                    );
                    continue;
                }
                *slot = Some(p.sock);
                if p2p.is_some() && socks.iter().all(|s| s.is_some()) {
                    let (framing, socks, p2p) = partial.remove(&q).expect("present");
                    let socks: Vec<TcpStream> = socks.into_iter().flatten().collect();
                    let p2p = p2p.expect("checked above");
                    missing.retain(|&m| m != q);
                    links[q] = Some(Link::Tcp(
                        TcpLink::new(socks, q, framing.chunk).map_err(|e| e.to_string())?,
                    ));
                    p2p_links[q] = Some(Link::Tcp(
                        TcpLink::new(vec![p2p], q, framing.chunk).map_err(|e| e.to_string())?,
                    ));
                }
                continue;
            }
            if drop_it.is_none() && p.since.elapsed() > Duration::from_secs(2) {
                drop_it = Some("hello too slow".into());
            }
            if let Some(why) = drop_it {
                tracing::warn!(
                    "tutti: dropped a connection from {}: {why}",
                    pending[i].from
                );
                pending.swap_remove(i);
                continue;
            }
            i += 1;
        }
        if !busy {
            // Until a connection or a hello arrives (bounded, for the checks above).
            use std::os::fd::AsRawFd;
            let mut fds: Vec<_> = pending.iter().map(|p| p.sock.as_raw_fd()).collect();
            fds.push(l.as_raw_fd());
            sys::wait_readable(&fds, Duration::from_millis(10));
        }
    }
    Ok(())
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
