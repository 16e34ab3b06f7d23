//! A small TCP key-value store, hosted by rank 0, through which ranks find
//! each other.
//!
//! Wire format: frames of `[u32 length][payload]`, little-endian. A client's
//! first frame is the job's 16-byte auth token; a connection that sends
//! anything else (or nothing within a few seconds) is logged and dropped,
//! and the job carries on. Requests are `P key value` (put), `G key` (get,
//! answered once the key exists) and `A key` (add one, answered with the new
//! count). Frames longer than [`MAX_FRAME`] are refused before any
//! allocation.

use super::torch_store::TorchStore;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest frame the store accepts.
pub const MAX_FRAME: usize = 1 << 20;

pub(crate) fn write_frame(s: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    s.write_all(&buf)
}

/// Reads one `[u32 length][payload]` frame, refusing lengths over [`MAX_FRAME`]
/// before allocating.
pub fn read_frame(s: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {n} bytes is too long"),
        ));
    }
    let mut v = vec![0u8; n];
    s.read_exact(&mut v)?;
    Ok(v)
}

#[derive(Default)]
struct Table {
    map: HashMap<Vec<u8>, Vec<u8>>,
    counters: HashMap<Vec<u8>, u64>,
}

struct Shared {
    table: Mutex<Table>,
    changed: Condvar,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    /// Releases to wait for before stopping.
    linger: std::sync::atomic::AtomicU64,
}

/// The store server. Stops (and closes every connection) on drop.
pub(crate) struct StoreServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Serves on `listener` for clients presenting `token`.
    pub(crate) fn start(listener: TcpListener, token: [u8; 16]) -> Result<StoreServer> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("store address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("store listener", e))?;
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            linger: std::sync::atomic::AtomicU64::new(0),
        });
        let sh = shared.clone();
        let accept = std::thread::Builder::new()
            .name("tutti-store".into())
            .spawn(move || accept_loop(listener, token, sh))
            .map_err(|e| Error::io("spawning the store thread", e))?;
        Ok(StoreServer {
            shared,
            addr,
            accept: Some(accept),
        })
    }

    /// Where the store listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl StoreServer {
    /// On drop, wait (up to 5 s) until `n` clients have called
    /// [`StoreClient::release`]: a client may still be reading its last
    /// reply when the server's own rank is already done.
    pub(crate) fn linger_for(&self, n: usize) {
        self.shared.linger.store(n as u64, Ordering::SeqCst);
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        let want = self.shared.linger.load(Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(5);
        let mut t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        while t.counters.get(&b"released"[..]).copied().unwrap_or(0) < want
            && Instant::now() < until
        {
            t = self
                .shared
                .changed
                .wait_timeout(t, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(t);
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        for c in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, token: [u8; 16], sh: Arc<Shared>) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !sh.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, peer)) => {
                let sh2 = sh.clone();
                if let Ok(c) = s.try_clone() {
                    sh.conns.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                }
                if let Ok(h) = std::thread::Builder::new()
                    .name("tutti-store-conn".into())
                    .spawn(move || serve(s, peer, token, sh2))
                {
                    handlers.push(h);
                }
                handlers.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    for c in sh.conns.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
    for h in handlers {
        let _ = h.join();
    }
}

fn serve(mut s: TcpStream, peer: SocketAddr, token: [u8; 16], sh: Arc<Shared>) {
    serve_conn(&mut s, peer, token, sh);
    // The server keeps a clone of every connection (to close them all on
    // stop): shut the socket itself so the client sees the end at once.
    let _ = s.shutdown(std::net::Shutdown::Both);
}

fn serve_conn(s: &mut TcpStream, peer: SocketAddr, token: [u8; 16], sh: Arc<Shared>) {
    let _ = s.set_nonblocking(false);
    // The whole handshake, not each read, must finish within the deadline,
    // and it is exactly a 4-byte length of 16 plus the token.
    match read_exact_by(s, 20, Instant::now() + Duration::from_secs(5)) {
        Ok(b) if b[..4] == 16u32.to_le_bytes() && b[4..] == token => {}
        Ok(_) => {
            tracing::warn!("tutti store: dropped a connection from {peer}: wrong auth token");
            return;
        }
        Err(e) => {
            tracing::warn!("tutti store: dropped a connection from {peer}: {e}");
            return;
        }
    }
    let _ = s.set_read_timeout(None);
    let _ = s.set_nodelay(true);
    while let Ok(req) = read_frame(s) {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let reply = match parse_request(&req) {
            Ok(Request::Put(k, v)) => {
                let mut t = sh.table.lock().unwrap_or_else(|e| e.into_inner());
                t.map.insert(k.to_vec(), v.to_vec());
                drop(t);
                sh.changed.notify_all();
                Vec::new()
            }
            Ok(Request::Get(k)) => {
                let mut t = sh.table.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(v) = t.map.get(k) {
                        break v.clone();
                    }
                    if sh.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    t = sh
                        .changed
                        .wait_timeout(t, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            Ok(Request::Add(k)) => {
                let mut t = sh.table.lock().unwrap_or_else(|e| e.into_inner());
                let c = t.counters.entry(k.to_vec()).or_insert(0);
                *c += 1;
                let v = *c;
                drop(t);
                sh.changed.notify_all();
                v.to_le_bytes().to_vec()
            }
            Err(why) => {
                tracing::warn!("tutti store: dropped {peer}: {why}");
                return;
            }
        };
        if write_frame(s, &reply).is_err() {
            return;
        }
    }
}

/// A decoded store request.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Store a value under a key.
    Put(&'a [u8], &'a [u8]),
    /// Wait for a key and return its value.
    Get(&'a [u8]),
    /// Add one to a counter.
    Add(&'a [u8]),
}

/// Decodes one request frame's payload. Never panics, whatever the bytes.
pub fn parse_request(req: &[u8]) -> std::result::Result<Request<'_>, String> {
    let Some((&cmd, rest)) = req.split_first() else {
        return Err("empty request".into());
    };
    match cmd {
        b'P' => split_kv(rest)
            .map(|(k, v)| Request::Put(k, v))
            .ok_or_else(|| "malformed put".into()),
        b'G' => Ok(Request::Get(rest)),
        b'A' => Ok(Request::Add(rest)),
        c => Err(format!("unknown request {c}")),
    }
}

/// Reads exactly `n` bytes, failing once `deadline` passes however slowly
/// they trickle in.
pub(crate) fn read_exact_by(s: &mut TcpStream, n: usize, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake too slow",
            ));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

fn split_kv(b: &[u8]) -> Option<(&[u8], &[u8])> {
    if b.len() < 2 {
        return None;
    }
    let kl = u16::from_le_bytes([b[0], b[1]]) as usize;
    if b.len() < 2 + kl {
        return None;
    }
    Some((&b[2..2 + kl], &b[2 + kl..]))
}

/// A connection to the store: tutti's own, or the launcher's (torch's
/// `TCPStore`, see [`super::torch_store`]).
pub(crate) struct StoreClient {
    conn: Conn,
    rank: usize,
}

enum Conn {
    Tutti(TcpStream),
    Torch(TorchStore),
}

impl StoreClient {
    /// Connects to tutti's store at `addr`, retrying until `deadline`, and
    /// authenticates.
    pub(crate) fn connect(
        addr: SocketAddr,
        token: [u8; 16],
        rank: usize,
        deadline: Instant,
    ) -> Result<StoreClient> {
        let mut last = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Bootstrap {
                    rank,
                    msg: format!(
                        "could not reach the master at {addr} ({}); check that rank 0 is running and that MASTER_ADDR/MASTER_PORT (or TUTTI_MASTER_ADDR/PORT) point to it, or raise TUTTI_CONNECT_TIMEOUT",
                        last.map_or("timed out".to_string(), |e: io::Error| e.to_string())
                    ),
                });
            }
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
                Ok(mut s) => {
                    let _ = s.set_nodelay(true);
                    write_frame(&mut s, &token).map_err(|e| Error::io("store handshake", e))?;
                    return Ok(StoreClient {
                        conn: Conn::Tutti(s),
                        rank,
                    });
                }
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Joins the launcher's torch `TCPStore` at `addr`, keys under `prefix`.
    pub(crate) fn connect_torch(
        addr: SocketAddr,
        prefix: String,
        rank: usize,
        deadline: Instant,
    ) -> Result<StoreClient> {
        Ok(StoreClient {
            conn: Conn::Torch(TorchStore::connect(addr, prefix, rank, deadline)?),
            rank,
        })
    }

    /// The local address of the connection (an address that reaches the master).
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        match &self.conn {
            Conn::Tutti(s) => s.local_addr().ok(),
            Conn::Torch(t) => t.local_addr(),
        }
    }

    fn request(&mut self, req: &[u8], deadline: Instant, what: &str) -> Result<Vec<u8>> {
        let Conn::Tutti(sock) = &mut self.conn else {
            unreachable!("tutti's requests go to tutti's store")
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let _ = sock.set_read_timeout(Some(left));
        write_frame(sock, req)
            .and_then(|_| read_frame(sock))
            .map_err(|e| Error::Bootstrap {
                rank: self.rank,
                msg: if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                    format!("timed out waiting for {what}: some rank did not join; check that every rank was started with the same world size and master, or raise TUTTI_CONNECT_TIMEOUT")
                } else {
                    format!("lost the master while waiting for {what}: {e}")
                },
            })
    }

    /// Stores `value` under `key`.
    pub(crate) fn put(&mut self, key: &str, value: &[u8], deadline: Instant) -> Result<()> {
        if let Conn::Torch(t) = &mut self.conn {
            return t.put(key, value);
        }
        let mut r = vec![b'P'];
        r.extend_from_slice(&(key.len() as u16).to_le_bytes());
        r.extend_from_slice(key.as_bytes());
        r.extend_from_slice(value);
        self.request(&r, deadline, key).map(|_| ())
    }

    /// Waits for `key` and returns its value.
    pub(crate) fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        if let Conn::Torch(t) = &mut self.conn {
            return t.get(key, deadline);
        }
        let mut r = vec![b'G'];
        r.extend_from_slice(key.as_bytes());
        self.request(&r, deadline, key)
    }

    /// Adds one to counter `key` and returns the new value.
    pub(crate) fn add(&mut self, key: &str, deadline: Instant) -> Result<u64> {
        if let Conn::Torch(t) = &mut self.conn {
            return t.add(key, deadline);
        }
        let mut r = vec![b'A'];
        r.extend_from_slice(key.as_bytes());
        let v = self.request(&r, deadline, key)?;
        Ok(u64::from_le_bytes(v.try_into().map_err(|_| {
            Error::Bootstrap {
                rank: self.rank,
                msg: "malformed reply from the store".into(),
            }
        })?))
    }

    /// Tells tutti's server this client has everything it needs from it. No
    /// reply is awaited: the server may stop as soon as it has counted us.
    /// (The launcher's store outlives the job: nothing to tell it.)
    pub(crate) fn release(&mut self, _deadline: Instant) -> Result<()> {
        if let Conn::Tutti(sock) = &mut self.conn {
            let mut r = vec![b'A'];
            r.extend_from_slice(b"released");
            let _ = write_frame(sock, &r);
        }
        Ok(())
    }

    /// Waits until `n` ranks have called `barrier` with this `name`.
    pub(crate) fn barrier(&mut self, name: &str, n: usize, deadline: Instant) -> Result<()> {
        let c = self.add(&format!("{name}/count"), deadline)?;
        if c as usize == n {
            self.put(&format!("{name}/done"), b"1", deadline)?;
        }
        self.get(&format!("{name}/done"), deadline).map(|_| ())
    }
}
