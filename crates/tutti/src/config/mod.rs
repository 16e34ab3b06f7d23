//! Every `TUTTI_*` setting, read in one place into a typed [`Config`];
//! the launcher's variables (rank, world size, master) in [`launch`].
//!
//! This module is the only reader of the environment in the library
//! (`clippy.toml` disallows `std::env::var` and its kin elsewhere): the
//! rest takes what it needs from a [`Config`] or an
//! [`EnvInfo`](launch::EnvInfo).

mod algo_override;
pub mod launch;
pub mod rank_table;

use crate::error::{Error, Result};
pub use algo_override::AlgoOverride;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// The TCP congestion control tutti's sockets use (`TUTTI_TCP_CONGESTION`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TcpCongestion {
    /// `cubic` where the kernel lets the socket have it, else the system's
    /// default. Collectives start and stop many flows at once, every call
    /// waiting for its slowest one; on shaped links BBR (some systems'
    /// default) left up to a quarter of the link idle where cubic filled it
    /// (`docs/multihost.md`).
    Auto,
    /// Whatever the system's default is (`net.ipv4.tcp_congestion_control`).
    System,
    /// This algorithm; creating a communicator fails if the kernel refuses it.
    Named(String),
}

/// Which transport to use between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory within a host, TCP across hosts.
    Auto,
    /// TCP everywhere (`TUTTI_TRANSPORT=tcp`).
    Tcp,
}

/// Whether the cost model is measured when a communicator is created
/// (`TUTTI_CALIBRATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calibrate {
    /// Reuse a cached measurement of this host layout younger than an
    /// hour, else measure and cache (any value but `0` and `force`).
    Auto,
    /// Keep the cost model's built-in parameters (`TUTTI_CALIBRATE=0`).
    Off,
    /// Measure at every set-up and replace the cache (`TUTTI_CALIBRATE=force`).
    Force,
}

/// tutti's settings. [`Config::from_env`] reads them from `TUTTI_*`
/// variables (and the cache directory from `XDG_CACHE_HOME` / `HOME`);
/// [`Config::default`] gives the defaults and reads nothing.
///
/// | variable | field | default |
/// |---|---|---|
/// | `TUTTI_TIMEOUT` (seconds) | [`timeout`](Config::timeout) | 300 |
/// | `TUTTI_CONNECT_TIMEOUT` (seconds) | [`connect_timeout`](Config::connect_timeout) | 60 |
/// | `TUTTI_TRANSPORT` (`auto`, `tcp`) | [`transport`](Config::transport) | auto |
/// | `TUTTI_ALGO` | [`algo`](Config::algo) | auto |
/// | `TUTTI_SHM_RING_BYTES` | [`ring_bytes`](Config::ring_bytes) | 512 KiB |
/// | `TUTTI_SHM_DIRECT_BYTES` | [`direct_bytes`](Config::direct_bytes) | auto (off, but online tuning may try 256 KiB; Broadcast 128 KiB) |
/// | `TUTTI_SHM_MAILBOX` (`0`, `1`) | [`mailbox`](Config::mailbox) | 1 |
/// | `TUTTI_SPIN_US` | [`spin`](Config::spin) | 200 us (20 us for async ops), or 50 us yielding when ranks outnumber cores |
/// | `TUTTI_SOCKET_IFNAME` | [`socket_ifname`](Config::socket_ifname) | any |
/// | `TUTTI_HOST_ID` | [`host_id`](Config::host_id) | hostname + boot id + network namespace |
/// | `TUTTI_DETERMINISTIC` (`0`, `1`) | [`deterministic`](Config::deterministic) | 0 |
/// | `TUTTI_TUNE` (`online`, `once`, `model`) | [`online`](Config::online), [`review`](Config::review) | online |
/// | `TUTTI_TOPO_FILE` | [`topo_file`](Config::topo_file) | detect |
/// | `TUTTI_TCP_SOCKETS` | [`tcp_sockets`](Config::tcp_sockets) | auto |
/// | `TUTTI_TCP_CHUNK` | [`tcp_chunk`](Config::tcp_chunk) | 256 KiB |
/// | `TUTTI_TCP_IO_THREAD` (`auto`, `0`, `1`) | [`tcp_io_thread`](Config::tcp_io_thread) | auto |
/// | `TUTTI_TCP_CONGESTION` (`auto`, `system`, a name) | [`tcp_congestion`](Config::tcp_congestion) | auto (cubic) |
/// | `TUTTI_SHM_STREAM` (`auto`, `0`, `1`) | [`shm_stream`](Config::shm_stream) | auto |
/// | `TUTTI_CALIBRATE` (`0`, `force`, other) | [`calibrate`](Config::calibrate) | auto |
/// | `XDG_CACHE_HOME`, else `HOME` + `/.cache` | [`cost_model_cache`](Config::cost_model_cache) | none (`from_env`: that + `/tutti`) |
/// | `TUTTI_TRACE_DIR` | [`trace_dir`](Config::trace_dir) | none |
#[derive(Clone, Debug)]
pub struct Config {
    /// Deadline of each operation.
    pub timeout: Duration,
    /// Deadline of communicator set-up.
    pub connect_timeout: Duration,
    /// Transport selection.
    pub transport: TransportChoice,
    /// Forced algorithms.
    pub algo: AlgoOverride,
    /// Bytes of each shared-memory ring (a power of two, at least 4 KiB).
    pub ring_bytes: usize,
    /// Shared-memory messages at least this large are read directly from the
    /// sender's buffer (`process_vm_readv` / memcpy); `Some(usize::MAX)`:
    /// never. `None` (the default): never, except that where ranks share
    /// cores online tuning tries large AllToAll and Scatter calls with
    /// direct reads too ([`tune::CMA_TWIN_BYTES`](crate::tune::CMA_TWIN_BYTES)),
    /// and large Broadcasts through the direct schedule with direct reads
    /// ([`tune::BCAST_CMA_BYTES`](crate::tune::BCAST_CMA_BYTES)).
    /// Off by default because on the machines measured, streaming through
    /// the cache-sized ring, with the sender and the receiver copying at
    /// once, was 1.5-4x faster at every size where every rank has a core
    /// (see docs/performance.md).
    pub direct_bytes: Option<usize>,
    /// Whether the direct algorithm uses the one-shot mailboxes among ranks
    /// of one segment (small collectives; see `docs/algorithms.md`).
    pub mailbox: bool,
    /// Whether shared-memory sends write the rings (and one-shot calls
    /// their mailbox slots) with non-temporal stores; `None`: online tuning
    /// tries both where ranks have a core each ([`tune::STREAM_MIN_BYTES`](crate::tune::STREAM_MIN_BYTES)).
    pub shm_stream: Option<bool>,
    /// How long a waiting op polls before it sleeps; `None` picks automatically.
    pub spin: Option<Duration>,
    /// Network interface selection (NCCL syntax: `eth0`, `^lo`, `=eth0`).
    pub socket_ifname: Option<String>,
    /// Explicit host identity (ranks with the same id use shared memory).
    pub host_id: Option<String>,
    /// Float reductions independent of the algorithm picked (rank order).
    pub deterministic: bool,
    /// Auto times the algorithms the cost model prices close to its pick on
    /// the first calls of each call shape and keeps the fastest
    /// ([`tune::online`](crate::tune::online)); `false`: the cost model's
    /// pick, always.
    pub online: bool,
    /// With [`online`](Config::online): Auto times the candidates again now
    /// and then after deciding, and changes its pick when another has
    /// become faster (`TUTTI_TUNE=online`); `false`: the first decision
    /// stays (`TUTTI_TUNE=once`).
    pub review: bool,
    /// A saved topology (`tutti topo --json`) whose host grouping replaces detection.
    pub topo_file: Option<String>,
    /// Sockets per TCP peer pair (1 to 8); `None` picks automatically. The
    /// rank that dials (the higher one) decides for the pair.
    pub tcp_sockets: Option<usize>,
    /// Frame size of messages striped over several sockets (a power of two,
    /// 4 KiB to 64 MiB); decided by the dialling rank.
    pub tcp_chunk: usize,
    /// Whether a communicator's TCP links get a dedicated I/O thread;
    /// `None` decides by the number of cores per rank on this machine.
    pub tcp_io_thread: Option<bool>,
    /// Congestion control of every TCP socket.
    pub tcp_congestion: TcpCongestion,
    /// Whether rank 0 measures the cost model's link parameters at set-up
    /// (docs/configuration.md, `TUTTI_CALIBRATE`).
    pub calibrate: Calibrate,
    /// Where rank 0 caches measured cost models (`$XDG_CACHE_HOME/tutti`,
    /// else `~/.cache/tutti`); `None`: measure without a cache.
    pub cost_model_cache: Option<PathBuf>,
    /// Where each rank writes its flight recorder when an op fails
    /// (`tutti-trace-rank<R>.json`); `None`: only logged.
    pub trace_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(60),
            transport: TransportChoice::Auto,
            algo: AlgoOverride::default(),
            ring_bytes: 512 << 10,
            direct_bytes: None,
            mailbox: true,
            shm_stream: None,
            spin: None,
            socket_ifname: None,
            host_id: None,
            deterministic: false,
            online: true,
            review: true,
            topo_file: None,
            tcp_sockets: None,
            tcp_chunk: crate::sizes::TCP_DEFAULT_CHUNK,
            tcp_io_thread: None,
            tcp_congestion: TcpCongestion::Auto,
            calibrate: Calibrate::Auto,
            cost_model_cache: None,
            trace_dir: None,
        }
    }
}

/// The variable `name`; unset, empty, blank or not Unicode: `None`.
#[allow(clippy::disallowed_methods)] // the reader the rest of the crate goes through
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The variable `name` as the OS holds it, set even where empty (paths).
#[allow(clippy::disallowed_methods)] // the reader the rest of the crate goes through
fn var_os(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// `TUTTI_SOCKET_IFNAME` alone, for
/// [`UniqueId::new`](crate::UniqueId::new): it binds the root's listener
/// before any communicator (and its [`Config`]) exists, and must not fail
/// on a malformed value of some other variable.
pub(crate) fn socket_ifname_from_env() -> Option<String> {
    var("TUTTI_SOCKET_IFNAME")
}

/// Whether `TUTTI_NO_AVX2` is set (to anything): the reduction kernels
/// then use the baseline code. Not a [`Config`] field: the kernels'
/// dispatch is one per process, chosen at its first reduction, with or
/// without a communicator.
pub(crate) fn no_avx2_from_env() -> bool {
    var_os("TUTTI_NO_AVX2").is_some()
}

/// `now + timeout`, or a moment decades away where that overflows (a
/// timeout of `Duration::MAX` means "no timeout").
pub(crate) fn deadline_after(now: std::time::Instant, timeout: Duration) -> std::time::Instant {
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}

fn secs(name: &str, v: &str) -> Result<Duration> {
    let s: f64 = v
        .trim()
        .parse()
        .map_err(|_| Error::Config(format!("{name}={v:?} is not a number of seconds")))?;
    if !(s > 0.0 && s.is_finite()) {
        return Err(Error::Config(format!(
            "{name}={v:?} must be a positive number of seconds"
        )));
    }
    // Beyond what a Duration holds (about 1.8e19 s): as long as it can be.
    Ok(Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
}

/// Parses an on/off setting.
fn flag(name: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::Config(format!("{name}={v:?}: use 1 or 0"))),
    }
}

/// Parses a byte size with an optional K, M or G suffix (powers of 1024).
pub fn parse_bytes(v: &str) -> Option<usize> {
    let t = v.trim();
    let (num, mul) = match t.chars().last()? {
        'k' | 'K' => (&t[..t.len() - 1], 1usize << 10),
        'm' | 'M' => (&t[..t.len() - 1], 1 << 20),
        'g' | 'G' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

fn bytes(name: &str, v: &str) -> Result<usize> {
    parse_bytes(v)
        .ok_or_else(|| Error::Config(format!("{name}={v:?} is not a byte size (e.g. 512K, 4M)")))
}

impl Config {
    /// Reads every `TUTTI_*` variable; a malformed value is an error naming it.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = var("TUTTI_TIMEOUT") {
            c.timeout = secs("TUTTI_TIMEOUT", &v)?;
        }
        if let Some(v) = var("TUTTI_CONNECT_TIMEOUT") {
            c.connect_timeout = secs("TUTTI_CONNECT_TIMEOUT", &v)?;
        }
        if let Some(v) = var("TUTTI_TRANSPORT") {
            c.transport = match v.to_ascii_lowercase().as_str() {
                "auto" | "shm" => TransportChoice::Auto,
                "tcp" | "socket" | "net" => TransportChoice::Tcp,
                _ => {
                    return Err(Error::Config(format!(
                        "TUTTI_TRANSPORT={v:?} is not a transport; valid: auto, tcp"
                    )))
                }
            };
        }
        if let Some(v) = var("TUTTI_ALGO") {
            c.algo =
                AlgoOverride::parse(&v).map_err(|e| Error::Config(format!("TUTTI_ALGO: {e}")))?;
        }
        if let Some(v) = var("TUTTI_SHM_RING_BYTES") {
            let b = bytes("TUTTI_SHM_RING_BYTES", &v)?;
            if !b.is_power_of_two() || b < 4096 {
                return Err(Error::Config(format!(
                    "TUTTI_SHM_RING_BYTES={v:?} must be a power of two of at least 4K"
                )));
            }
            c.ring_bytes = b;
        }
        if let Some(v) = var("TUTTI_SHM_DIRECT_BYTES") {
            c.direct_bytes = if v.trim().eq_ignore_ascii_case("off") {
                Some(usize::MAX)
            } else if v.trim().eq_ignore_ascii_case("auto") {
                None
            } else {
                Some(bytes("TUTTI_SHM_DIRECT_BYTES", &v)?)
            };
        }
        if let Some(v) = var("TUTTI_SPIN_US") {
            let us: u64 = v.trim().parse().map_err(|_| {
                Error::Config(format!(
                    "TUTTI_SPIN_US={v:?} is not a number of microseconds"
                ))
            })?;
            c.spin = Some(Duration::from_micros(us));
        }
        if let Some(v) = var("TUTTI_TCP_SOCKETS") {
            if !v.trim().eq_ignore_ascii_case("auto") {
                let max = crate::sizes::TCP_MAX_LANES;
                match v.trim().parse::<usize>() {
                    Ok(k) if (1..=max).contains(&k) => c.tcp_sockets = Some(k),
                    _ => {
                        return Err(Error::Config(format!(
                            "TUTTI_TCP_SOCKETS={v:?} must be auto or a number from 1 to {max}"
                        )))
                    }
                }
            }
        }
        if let Some(v) = var("TUTTI_TCP_CHUNK") {
            let b = bytes("TUTTI_TCP_CHUNK", &v)?;
            if !b.is_power_of_two() || !(4096..=64 << 20).contains(&b) {
                return Err(Error::Config(format!(
                    "TUTTI_TCP_CHUNK={v:?} must be a power of two from 4K to 64M"
                )));
            }
            c.tcp_chunk = b;
        }
        if let Some(v) = var("TUTTI_TCP_IO_THREAD") {
            c.tcp_io_thread = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => None,
                "1" | "true" | "yes" | "on" => Some(true),
                "0" | "false" | "no" | "off" => Some(false),
                _ => {
                    return Err(Error::Config(format!(
                        "TUTTI_TCP_IO_THREAD={v:?}: use auto, 1 or 0"
                    )))
                }
            };
        }
        if let Some(v) = var("TUTTI_TCP_CONGESTION") {
            let name = v.trim();
            c.tcp_congestion = match name.to_ascii_lowercase().as_str() {
                "auto" => TcpCongestion::Auto,
                "system" => TcpCongestion::System,
                _ if !name.is_empty()
                    && name.len() < 16
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                {
                    TcpCongestion::Named(name.to_string())
                }
                _ => {
                    return Err(Error::Config(format!(
                        "TUTTI_TCP_CONGESTION={v:?}: use auto, system or an algorithm's name \
                         (see /proc/sys/net/ipv4/tcp_available_congestion_control)"
                    )))
                }
            };
        }
        c.socket_ifname = socket_ifname_from_env();
        c.host_id = var("TUTTI_HOST_ID");
        c.topo_file = var("TUTTI_TOPO_FILE");
        if let Some(v) = var("TUTTI_DETERMINISTIC") {
            c.deterministic = flag("TUTTI_DETERMINISTIC", &v)?;
        }
        if let Some(v) = var("TUTTI_TUNE") {
            (c.online, c.review) = match v.trim().to_ascii_lowercase().as_str() {
                "online" => (true, true),
                "once" => (true, false),
                "model" => (false, false),
                _ => {
                    return Err(Error::Config(format!(
                        "TUTTI_TUNE={v:?}: use online, once or model"
                    )))
                }
            };
        }
        if let Some(v) = var("TUTTI_SHM_MAILBOX") {
            c.mailbox = flag("TUTTI_SHM_MAILBOX", &v)?;
        }
        if let Some(v) = var("TUTTI_SHM_STREAM") {
            c.shm_stream = if v.trim().eq_ignore_ascii_case("auto") {
                None
            } else {
                Some(flag("TUTTI_SHM_STREAM", &v).map_err(|_| {
                    Error::Config(format!("TUTTI_SHM_STREAM={v:?}: use auto, 1 or 0"))
                })?)
            };
        }
        // Any value but these two means the default, as it always has.
        c.calibrate = match var("TUTTI_CALIBRATE").as_deref() {
            Some("0") => Calibrate::Off,
            Some("force") => Calibrate::Force,
            _ => Calibrate::Auto,
        };
        c.cost_model_cache = var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("tutti"));
        c.trace_dir = var_os("TUTTI_TRACE_DIR").map(PathBuf::from);
        Ok(c)
    }

    /// How waiting ops poll when `ranks_here` ranks share this host's cores:
    /// (how long before sleeping, whether to yield the core while polling).
    pub(crate) fn spin_for(&self, ranks_here: usize) -> (Duration, bool) {
        let cores = crate::topo::online_cpus();
        let over = ranks_here > cores;
        let d = self.spin.unwrap_or(if over {
            Duration::from_micros(50)
        } else {
            Duration::from_micros(200)
        });
        (d, over)
    }
}
