//! Set-up of the tcp transport: socket options, the hello a dialling
//! rank sends, dialling and accepting a rank's peers, the frame size and
//! congestion control of its links, and whether they get an I/O thread.

use super::io::{self, Bell, IoSet};
use super::{Framing, TcpLink, MAX_LANES};
use crate::config::{Config, TcpCongestion};
use crate::error::{Error, Result};
use crate::transport::shm::Segment;
use crate::transport::{sys, Link};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Socket buffer size asked for, when the system allows it.
const SOCKET_BUFFER: usize = 4 << 20;

/// Configures a connected socket for a lane: non-blocking, `TCP_NODELAY`,
/// large buffers where the system allows them, keepalive towards another
/// host; with several lanes, a short unsent queue.
pub(crate) fn configure(sock: &TcpStream, framing: Framing) -> Result<()> {
    sock.set_nonblocking(true)
        .and_then(|_| sock.set_nodelay(true))
        .map_err(|e| Error::io("configuring a TCP link", e))?;
    let s = socket2::SockRef::from(sock);
    // An explicit size turns the kernel's buffer autotuning off and is
    // capped at net.core.{w,r}mem_max (often 208 KiB): ask only where the
    // cap allows the large buffer, else leave autotuning on.
    let (wmax, rmax) = buffer_caps();
    if wmax >= SOCKET_BUFFER {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
    if rmax >= SOCKET_BUFFER {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
    if framing.lanes > 1 {
        // A lane reports itself busy (EAGAIN) once this much is queued but
        // not yet sent, so that frames go to the lanes that move.
        let lowat: libc::c_int = (2 * framing.chunk).max(512 << 10) as libc::c_int;
        // SAFETY: setsockopt on a valid socket with a pointer to a c_int
        // and its size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                &lowat as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    // A peer whose host vanished sends no reset. An idle connection is
    // probed by keepalive after a second of silence; bytes of ours left
    // unacknowledged (a liveness probe, a message) are found by the
    // waiting side ([`Lanes::host_silent`]) after two retransmission
    // timeouts, about 0.6 s, or 0.3 s past a first one that came late
    // (a long measured round trip); either way the failure then spreads to the
    // other ranks at once. No TCP_USER_TIMEOUT: Linux applies it to a
    // closed receive window too, so it cut the connections of a live rank
    // that did not read for about a second (busy computing, say) while a
    // peer had a few MiB queued for it (tests/slow_reader.rs). A live
    // peer's kernel acknowledges whatever its process is doing, so
    // slowness is not mistaken for death.
    //
    // Between two ranks of one host there is nothing for keepalive to
    // find: the host cannot vanish from itself, and a process that dies
    // has its connections reset by the kernel they share. There the
    // single one-second probe could only do harm: on a loaded machine
    // (16 busy ranks on 2 cores) a probe left unanswered for a second
    // killed a live idle connection (ETIMEDOUT on one side, a reset on
    // the other), so it is not set.
    if !same_host(sock) {
        let ka = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(1))
            .with_interval(Duration::from_secs(1))
            .with_retries(1);
        let _ = s.set_tcp_keepalive(&ka);
    }
    Ok(())
}

/// Whether both ends of `sock` are on this host (in this network
/// namespace): a loopback peer, or a peer at our own address. Unknown
/// addresses count as another host.
pub(crate) fn same_host(sock: &TcpStream) -> bool {
    match (sock.local_addr(), sock.peer_addr()) {
        (Ok(l), Ok(p)) => p.ip().is_loopback() || p.ip() == l.ip(),
        _ => false,
    }
}

/// net.core.wmem_max and rmem_max (0 if unreadable), read once per process.
fn buffer_caps() -> (usize, usize) {
    static CAPS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *CAPS.get_or_init(|| {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        (
            read("/proc/sys/net/core/wmem_max"),
            read("/proc/sys/net/core/rmem_max"),
        )
    })
}

/// Connects this rank (`rank`) to its TCP peers `tcp` (ranks, ascending):
/// dials the lower ones at `addrs` (this rank decides the pair's sockets
/// and frame size), accepts the higher ones on `listener`, each pair with
/// its lanes and its point-to-point socket. Each socket has the congestion
/// control `cfg` asks for from its first packet ([`set_congestion`]): a
/// dialled one sets it before it connects, an accepted one has the
/// listener's. `boot` makes a set-up error of a message.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_peers(
    cfg: &Config,
    rank: usize,
    tcp: &[usize],
    addrs: &[SocketAddr],
    listener: Option<&TcpListener>,
    token: [u8; 16],
    deadline: Instant,
    links: &mut [Option<Link>],
    p2p_links: &mut [Option<Link>],
    boot: &dyn Fn(String) -> Error,
) -> Result<()> {
    let framing = tcp_framing(cfg, tcp.len());
    for &q in tcp.iter().filter(|&&q| q < rank) {
        let mut socks = Vec::with_capacity(framing.lanes);
        // The pair's lanes, then the point-to-point channel's socket.
        for lane in 0..=framing.lanes {
            let hello = Hello {
                rank,
                lane: if lane == framing.lanes { 0 } else { lane },
                framing,
                p2p: lane == framing.lanes,
            };
            let s = dial(cfg, addrs[q], token, &hello, deadline).map_err(|e| match e {
                DialError::Io(e) => {
                    boot(format!("cannot connect to rank {q} at {}: {e}", addrs[q]))
                }
                DialError::Setup(e) => e,
            })?;
            socks.push(s);
        }
        let p2p = socks.pop().expect("the P2P socket was dialled last");
        links[q] = Some(Link::Tcp(TcpLink::new(socks, q, framing.chunk)?));
        p2p_links[q] = Some(Link::Tcp(TcpLink::new(vec![p2p], q, framing.chunk)?));
    }
    let expect: Vec<usize> = tcp.iter().copied().filter(|&q| q > rank).collect();
    if let Some(l) = listener {
        accept_peers(l, token, &expect, links, p2p_links, deadline).map_err(boot)?;
    }
    Ok(())
}

/// Moves the TCP links of `links` to a new I/O thread where they get one
/// ([`use_io_thread`]; `ranks_on_machine`: this communicator's ranks on
/// this machine). The thread rings this rank's doorbell in `segment` (its
/// host's shared segment and its index there), or one of its own.
pub(crate) fn start_io_thread(
    cfg: &Config,
    links: &mut [Option<Link>],
    ranks_on_machine: usize,
    segment: Option<&(Arc<Segment>, usize)>,
) -> Result<Option<Arc<IoSet>>> {
    if !links.iter().any(|l| matches!(l, Some(Link::Tcp(_))))
        || !use_io_thread(cfg, ranks_on_machine)
    {
        return Ok(None);
    }
    let bell = match segment {
        Some((seg, i)) => Bell::Seg(seg.clone(), *i),
        None => io::own_bell(),
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
    Ok(Some(set))
}

/// Whether the kernel takes the congestion control `cfg` names, asked of a
/// socket of this process's own before any other rank is contacted: a
/// refused name is then the same [`Error::Config`] on every rank, where a
/// rank failing later (at its listener) would leave the others a
/// bootstrap error about a master that went away.
pub(crate) fn check_congestion(cfg: &Config) -> Result<()> {
    if !matches!(cfg.tcp_congestion, TcpCongestion::Named(_)) {
        return Ok(());
    }
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| Error::io("a socket to check TUTTI_TCP_CONGESTION", e))?;
    set_congestion(cfg, socket2::SockRef::from(&s))
}

/// Puts socket `sock` on the congestion control `cfg` asks for
/// ([`TcpCongestion`]): `Auto` tries cubic and keeps the system's default
/// if the kernel refuses; a named one that the kernel refuses is an error.
///
/// It must be set before the socket connects (or, on a listener, before
/// it accepts: an accepted socket takes its listener's). A socket that
/// starts on BBR (the default of some systems) and moves to cubic once
/// connected is not on cubic as one that started there is (likely
/// because BBR turned the socket's pacing on, and nothing turns it off):
/// over loopback, 4 ranks' Send/Recv of 1-4 MiB took 1.5-1.8x as long,
/// and 256-512 KiB longer still than on BBR alone.
pub(crate) fn set_congestion(cfg: &Config, sock: socket2::SockRef<'_>) -> Result<()> {
    let (name, required) = match &cfg.tcp_congestion {
        TcpCongestion::Auto => ("cubic", false),
        TcpCongestion::System => return Ok(()),
        TcpCongestion::Named(n) => (n.as_str(), true),
    };
    match sock.set_tcp_congestion(name.as_bytes()) {
        Ok(()) => Ok(()),
        Err(e) if !required => {
            tracing::debug!("TCP sockets keep the system's congestion control: {name}: {e}");
            Ok(())
        }
        Err(e) => Err(Error::Config(format!(
            "TUTTI_TCP_CONGESTION={name}: the kernel refused it ({e}); see \
             /proc/sys/net/ipv4/tcp_available_congestion_control (and \
             tcp_allowed_congestion_control for unprivileged processes), or use auto or system"
        ))),
    }
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

/// Why dialling a peer failed.
enum DialError {
    /// The connection (after retries until the deadline).
    Io(std::io::Error),
    /// The socket's set-up ([`set_congestion`]).
    Setup(Error),
}

fn dial(
    cfg: &Config,
    addr: SocketAddr,
    token: [u8; 16],
    hello: &Hello,
    deadline: Instant,
) -> std::result::Result<TcpStream, DialError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .map_err(DialError::Io)?;
        set_congestion(cfg, socket2::SockRef::from(&sock)).map_err(DialError::Setup)?;
        let wait = left
            .max(Duration::from_millis(10))
            .min(Duration::from_secs(2));
        match sock.connect_timeout(&addr.into(), wait) {
            Ok(()) => {
                let mut s: TcpStream = sock.into();
                let mut msg = [0u8; 24];
                msg[..16].copy_from_slice(&token);
                msg[16..].copy_from_slice(&hello.encode());
                s.write_all(&msg).map_err(DialError::Io)?;
                return Ok(s);
            }
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("dial {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(DialError::Io(e)),
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

    /// Both ends of a pair have the congestion control asked for: the
    /// dialled end set it before connecting, the accepted end took its
    /// listener's.
    #[test]
    fn both_ends_start_on_the_congestion_control_asked_for() {
        let name = |s: socket2::SockRef<'_>| {
            let mut n = s.tcp_congestion().expect("TCP_CONGESTION");
            n.retain(|&b| b != 0);
            n
        };
        // reno is always built in and allowed; the system's default is
        // another here (and if it is reno, the test still checks both ends).
        let cfg = Config {
            tcp_congestion: TcpCongestion::Named("reno".into()),
            ..Config::default()
        };
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        set_congestion(&cfg, socket2::SockRef::from(&l)).expect("reno on the listener");
        let hello = Hello {
            rank: 1,
            lane: 0,
            framing: Framing {
                lanes: 1,
                chunk: super::super::DEFAULT_CHUNK,
            },
            p2p: true,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let addr = l.local_addr().expect("addr");
        let Ok(dialled) = dial(&cfg, addr, [7; 16], &hello, deadline) else {
            panic!("dial failed");
        };
        let (accepted, _) = l.accept().expect("accept");
        assert_eq!(name(socket2::SockRef::from(&dialled)), b"reno");
        assert_eq!(name(socket2::SockRef::from(&accepted)), b"reno");

        let bad = Config {
            tcp_congestion: TcpCongestion::Named("no_such_cc".into()),
            ..Config::default()
        };
        let e = set_congestion(&bad, socket2::SockRef::from(&l)).expect_err("refused");
        assert!(e.to_string().contains("no_such_cc"), "{e}");
        assert!(matches!(
            dial(&bad, addr, [7; 16], &hello, deadline),
            Err(DialError::Setup(Error::Config(_)))
        ));
    }
}
