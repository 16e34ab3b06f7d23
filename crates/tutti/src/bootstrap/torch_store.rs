//! A client of PyTorch's `TCPStore`, for jobs whose launcher already serves
//! one: under torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`) the agent
//! listens on `MASTER_PORT` itself, so rank 0 cannot serve tutti's store
//! there, and every rank joins the agent's store instead.
//!
//! The protocol, as torch 2.x's server (both the libuv and the legacy
//! backend) speaks it: a connection opens with a one-byte query type
//! `VALIDATE` and a `u32` magic number; then each request is a one-byte
//! query type and its arguments, little-endian, strings and byte vectors
//! as a `u64` length and the bytes. This client uses `SET` (key, value; no
//! reply), `WAIT` (a count of keys and the keys; one byte once all exist),
//! `GET` (key; the value as a length and bytes; asked only after `WAIT`,
//! since a missing key is not answered alike by both backends), `ADD`
//! (key, `i64`; the new `i64`) and `PING` (a `u32`, echoed), which checks
//! at connection time that a TCPStore is what listens.

use crate::error::{Error, Result};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const ADD: u8 = 4;
const WAIT: u8 = 6;
const PING: u8 = 13;
/// What `VALIDATE` carries.
const MAGIC: u32 = 0x3C85_F7CE;
/// Values longer than this are refused before any allocation.
const MAX_VALUE: u64 = 1 << 24;

/// A connection to a torch `TCPStore`, with a key prefix.
pub(crate) struct TorchStore {
    sock: TcpStream,
    addr: SocketAddr,
    prefix: String,
    rank: usize,
}

fn push_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

impl TorchStore {
    /// Connects to the store at `addr`, retrying until `deadline`, and
    /// checks that it answers as a TCPStore. Every key is put under
    /// `prefix`.
    pub(crate) fn connect(
        addr: SocketAddr,
        prefix: String,
        rank: usize,
        deadline: Instant,
    ) -> Result<TorchStore> {
        let mut last = None;
        let sock = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Bootstrap {
                    rank,
                    msg: format!(
                        "could not reach the launcher's store at {addr} ({}); under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the agent serves it on MASTER_ADDR:MASTER_PORT",
                        last.map_or("timed out".to_string(), |e: io::Error| e.to_string())
                    ),
                });
            }
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
                Ok(s) => break s,
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        let _ = sock.set_nodelay(true);
        let mut s = TorchStore {
            sock,
            addr,
            prefix,
            rank,
        };
        let mut hello = vec![VALIDATE];
        hello.extend_from_slice(&MAGIC.to_le_bytes());
        hello.push(PING);
        let nonce = std::process::id();
        hello.extend_from_slice(&nonce.to_le_bytes());
        s.sock
            .write_all(&hello)
            .map_err(|e| s.failed(e, "the handshake"))?;
        let echo = s.read_u32(deadline, "the handshake")?;
        if echo != nonce {
            return Err(s.fail(format!(
                "{addr} does not answer as a torch TCPStore (ping {nonce} came back as {echo})"
            )));
        }
        Ok(s)
    }

    /// The local address of the connection.
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.sock.local_addr().ok()
    }

    fn key(&self, key: &str) -> Vec<u8> {
        format!("/{}/{key}", self.prefix).into_bytes()
    }

    fn fail(&self, msg: String) -> Error {
        Error::Bootstrap {
            rank: self.rank,
            msg,
        }
    }

    fn failed(&self, e: io::Error, what: &str) -> Error {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            self.fail(format!(
                "timed out waiting for {what} in the launcher's store at {}: some rank did not join; check that every rank was started by the same launcher with the same world size, or raise TUTTI_CONNECT_TIMEOUT",
                self.addr
            ))
        } else {
            self.fail(format!(
                "lost the launcher's store at {} during {what}: {e}",
                self.addr
            ))
        }
    }

    fn read_exact(&mut self, buf: &mut [u8], deadline: Instant, what: &str) -> Result<()> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let _ = self.sock.set_read_timeout(Some(left));
        self.sock.read_exact(buf).map_err(|e| self.failed(e, what))
    }

    fn read_u32(&mut self, deadline: Instant, what: &str) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b, deadline, what)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_u64(&mut self, deadline: Instant, what: &str) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b, deadline, what)?;
        Ok(u64::from_le_bytes(b))
    }

    fn send(&mut self, req: &[u8], what: &str) -> Result<()> {
        self.sock.write_all(req).map_err(|e| self.failed(e, what))
    }

    /// Stores `value` under `key`.
    pub(crate) fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let mut r = vec![SET];
        push_bytes(&mut r, &self.key(key));
        push_bytes(&mut r, value);
        self.send(&r, key)
    }

    /// Waits for `key` (until `deadline`) and returns its value.
    pub(crate) fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let k = self.key(key);
        let mut r = vec![WAIT];
        r.extend_from_slice(&1u64.to_le_bytes());
        push_bytes(&mut r, &k);
        self.send(&r, key)?;
        let mut done = [0u8; 1];
        self.read_exact(&mut done, deadline, key)?;
        if done[0] != 0 {
            return Err(self.fail(format!(
                "the launcher's store answered {} to a wait for {key}",
                done[0]
            )));
        }
        let mut r = vec![GET];
        push_bytes(&mut r, &k);
        self.send(&r, key)?;
        let n = self.read_u64(deadline, key)?;
        if n > MAX_VALUE {
            return Err(self.fail(format!(
                "the launcher's store sent {n} bytes for {key}; tutti's values are small"
            )));
        }
        let mut v = vec![0u8; n as usize];
        self.read_exact(&mut v, deadline, key)?;
        Ok(v)
    }

    /// Adds one to counter `key` and returns the new value.
    pub(crate) fn add(&mut self, key: &str, deadline: Instant) -> Result<u64> {
        let mut r = vec![ADD];
        push_bytes(&mut r, &self.key(key));
        r.extend_from_slice(&1i64.to_le_bytes());
        self.send(&r, key)?;
        self.read_u64(deadline, key)
    }
}
