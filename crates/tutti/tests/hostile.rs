//! Hostile input: what reaches tutti from the network must never crash it,
//! hang it, make it allocate what a length field claims, or disturb a job.
//!
//! * Decoders, fed directly: the store's `read_frame`/`parse_request` and the
//!   TCP transport's receive path (`tutti::fuzzing`), with crafted inputs
//!   and with the fuzz-target bodies of `fuzz/src/lib.rs` over seeded random
//!   inputs (the stable-Rust stand-in for `fuzz/run.sh`).
//! * Ports, attacked while a job runs or starts: the bootstrap store (rank
//!   0's master port), each rank's peer listener during set-up, and the
//!   listener kept for recovery. Multi-process tests re-run this binary as
//!   the ranks (see `tests/faults.rs` for the pattern); the rogue client is
//!   the test process itself.
//!
//! See `docs/faults.md`.
// Reads the environment: the harness's own knobs, and the roles it gives its
// child processes.
#![allow(clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Cursor, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tutti::fuzzing::{parse_request, read_frame, tcp_receive, valid_header, Request, MAX_FRAME};
use tutti::{Communicator, Config, Error, ReduceOp, UniqueId};

#[path = "../../../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod fuzz_bodies;

// ---------------------------------------------------------------------------
// An allocator that reports the largest single allocation of this thread
// ---------------------------------------------------------------------------

struct Tracking;

thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
    static BIGGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            let _ = BIGGEST.try_with(|b| b.set(b.get().max(size)));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; `note` only
// touches const-initialised thread-locals (no allocation, no re-entry).
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Runs `f` and returns its result with the largest allocation it made (on this thread).
fn biggest_alloc<R>(f: impl FnOnce() -> R) -> (R, usize) {
    BIGGEST.with(|b| b.set(0));
    TRACK.with(|t| t.set(true));
    let r = f();
    TRACK.with(|t| t.set(false));
    (r, BIGGEST.with(|b| b.get()))
}

// ---------------------------------------------------------------------------
// Utilities
// ---------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn seed() -> u64 {
    std::env::var("TUTTI_FAULT_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(20_240_611)
}

fn iters(default: usize) -> usize {
    std::env::var("TUTTI_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// One port-attacking test at a time: they share two cores with their ranks.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

// ---------------------------------------------------------------------------
// Decoders, fed directly
// ---------------------------------------------------------------------------

/// A reader that hands out `prefix`, then `fill` bytes forever.
fn endless(prefix: &[u8], fill: u8) -> impl Read + '_ {
    Cursor::new(prefix).chain(std::io::repeat(fill))
}

#[test]
fn read_frame_refuses_oversized_lengths_before_allocating() {
    for len in [u32::MAX, 0x8000_0000, (MAX_FRAME + 1) as u32, 64 << 20] {
        let prefix = len.to_le_bytes();
        let (r, biggest) = biggest_alloc(|| read_frame(&mut endless(&prefix, 0x41)));
        let e = r.expect_err("an oversized frame must be refused");
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::InvalidData,
            "length {len:#x}: {e}"
        );
        assert!(
            biggest < 4096,
            "length {len:#x}: allocated {biggest} bytes before refusing"
        );
    }
    // The largest legal frame is read whole, and allocates no more than it holds.
    let prefix = (MAX_FRAME as u32).to_le_bytes();
    let (r, biggest) = biggest_alloc(|| read_frame(&mut endless(&prefix, 7)));
    assert_eq!(r.unwrap().len(), MAX_FRAME);
    assert!(biggest <= MAX_FRAME, "{biggest}");
}

#[test]
fn read_frame_handles_truncated_and_empty_input() {
    // Truncated length prefix, truncated payload, nothing at all.
    for bytes in [
        &[][..],
        &[5],
        &[5, 0, 0],
        &[5, 0, 0, 0, 1, 2],
        &[0xff, 0xff, 0x0f, 0x00, 1],
    ] {
        let r = read_frame(&mut Cursor::new(bytes));
        assert_eq!(
            r.unwrap_err().kind(),
            std::io::ErrorKind::UnexpectedEof,
            "{bytes:?}"
        );
    }
    // A zero-length frame is a frame; frames follow one another exactly.
    let mut c = Cursor::new([frame(b""), frame(b"Gkey"), frame(b"A")].concat());
    assert_eq!(read_frame(&mut c).unwrap(), b"");
    assert_eq!(read_frame(&mut c).unwrap(), b"Gkey");
    assert_eq!(read_frame(&mut c).unwrap(), b"A");
    assert!(read_frame(&mut c).is_err());
}

#[test]
fn parse_request_decodes_exactly_the_valid_requests() {
    assert_eq!(parse_request(b"Gabc"), Ok(Request::Get(b"abc")));
    assert_eq!(parse_request(b"A"), Ok(Request::Add(b"")));
    assert_eq!(parse_request(b"P\x01\x00kv"), Ok(Request::Put(b"k", b"v")));
    assert_eq!(parse_request(b"P\x00\x00"), Ok(Request::Put(b"", b"")));
    for bad in [
        &b""[..],
        b"P",
        b"P\x01",
        b"P\x05\x00abc",
        b"P\xff\xffx",
        b"X",
        b"\x00",
        b"g",
    ] {
        assert!(parse_request(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn parse_request_never_panics_on_random_bytes() {
    let mut rng = Rng(seed());
    for i in 0..iters(20_000) {
        let n = rng.below(64) as usize;
        let mut b = rng.bytes(n);
        // Steer half of the inputs to the known commands.
        if i % 2 == 0 && !b.is_empty() {
            b[0] = b"PGA"[i / 2 % 3];
        }
        let _ = parse_request(&b);
    }
}

#[test]
fn tcp_receive_accepts_exactly_well_formed_messages() {
    for reduce in [false, true] {
        for len in [0usize, 4, 64, 4096, 4100, 100_000] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let good = [&valid_header(len)[..], &payload].concat();
            let r = tcp_receive(&good, len, reduce);
            assert!(r.is_ok(), "len {len} reduce {reduce}: {r:?}");
            // Every strict prefix is a truncated message.
            for cut in [0, 1, 15, 16, 16 + len / 2, good.len() - 1] {
                if cut < good.len() {
                    let r = tcp_receive(&good[..cut], len, reduce);
                    assert!(
                        matches!(r, Err(Error::PeerLost { .. })),
                        "len {len} cut {cut}: {r:?}"
                    );
                }
            }
            // A length that is not this message's, up to absurd.
            for claim in [len + 4, len.saturating_sub(4), 1 << 40, u64::MAX as usize] {
                if claim == len {
                    continue;
                }
                let mut h = valid_header(len);
                h[8..16].copy_from_slice(&(claim as u64).to_le_bytes());
                let bytes = [&h[..], &payload].concat();
                let (r, biggest) = biggest_alloc(|| tcp_receive(&bytes, len, reduce));
                assert!(
                    matches!(r, Err(Error::Mismatch { .. })),
                    "claim {claim}: {r:?}"
                );
                // The harness allocates its two buffers of `len` bytes; nothing near `claim`.
                assert!(
                    biggest <= len.max(256 << 10),
                    "claim {claim}: allocated {biggest} bytes"
                );
            }
            // Another op's sequence number, another collective's tag, or
            // another message number on the link (flags bits 1..).
            for byte in [0usize, 3, 4, 5, 6] {
                let mut h = valid_header(len);
                h[byte] ^= if byte == 6 { 0x02 } else { 0x01 };
                let r = tcp_receive(&[&h[..], &payload].concat(), len, reduce);
                assert!(
                    matches!(r, Err(Error::Mismatch { .. })),
                    "header byte {byte} flipped: {r:?}"
                );
            }
        }
    }
}

#[test]
fn tcp_receive_refuses_garbage() {
    let mut rng = Rng(seed() ^ 0x5eed);
    for _ in 0..iters(300) / 3 {
        let n = rng.below(300) as usize;
        let b = rng.bytes(n);
        let len = 4 * rng.below(64) as usize;
        let r = tcp_receive(&b, len, rng.below(2) == 1);
        assert!(
            r.is_err(),
            "random bytes accepted as a message of {len} bytes"
        );
    }
}

/// The bodies of the cargo-fuzz targets (`fuzz/src/lib.rs`), on seeded
/// random and mutated inputs: what CI runs where cargo-fuzz does not.
#[test]
fn fuzz_fallback_store_request() {
    let mut rng = Rng(seed() ^ 0xf0);
    let seeds: Vec<Vec<u8>> = vec![
        frame(b"Gkey"),
        frame(b"P\x03\x00keyvalue"),
        frame(b"Acount"),
        [frame(&[7u8; 16]), frame(b"Gx0/1")].concat(),
        (u32::MAX).to_le_bytes().to_vec(),
        ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec(),
    ];
    let t = Instant::now();
    let n = iters(20_000);
    for i in 0..n {
        let mut b = seeds[i % seeds.len()].clone();
        for _ in 0..rng.below(4) {
            mutate(&mut rng, &mut b);
        }
        fuzz_bodies::store_request(&b);
    }
    println!("store_request fallback: {n} inputs in {:?}", t.elapsed());
}

#[test]
fn fuzz_fallback_tcp_message() {
    let mut rng = Rng(seed() ^ 0xf1);
    let t = Instant::now();
    let n = iters(600);
    for i in 0..n {
        let mut b = vec![
            rng.next() as u8,
            rng.next() as u8,
            rng.below(8) as u8,
            (i % 4) as u8,
        ];
        let body = rng.below(200) as usize;
        b.extend(rng.bytes(body));
        // Often ask for exactly the payload that follows (mode 1), so that
        // well-formed messages are common, then mutate a little.
        if i % 4 == 1 {
            let len = body / 4 * 4;
            b[1..3].copy_from_slice(&((len / 4) as u16).to_le_bytes());
        }
        if i % 3 == 0 {
            mutate(&mut rng, &mut b);
        }
        fuzz_bodies::tcp_message(&b);
    }
    println!("tcp_message fallback: {n} inputs in {:?}", t.elapsed());
}

#[test]
fn fuzz_fallback_tcp_lanes() {
    let mut rng = Rng(seed() ^ 0x1a4e5);
    let t = Instant::now();
    let n = iters(400);
    for i in 0..n {
        let mut b = vec![
            rng.next() as u8,
            rng.next() as u8,
            rng.next() as u8,
            (i % 4) as u8,
        ];
        let body = rng.below(64) as usize;
        b.extend(rng.bytes(body));
        if i % 8 == 0 {
            mutate(&mut rng, &mut b);
        }
        fuzz_bodies::tcp_lanes(&b);
    }
    println!("tcp_lanes fallback: {n} inputs in {:?}", t.elapsed());
}

#[test]
fn fuzz_fallback_tcp_stream() {
    let mut rng = Rng(seed() ^ 0x5713);
    let t = Instant::now();
    let n = iters(1000);
    for i in 0..n {
        let mut b = vec![rng.next() as u8, (i % 4) as u8];
        let body = rng.below(40) as usize;
        b.extend(rng.bytes(body));
        if i % 8 == 0 {
            mutate(&mut rng, &mut b);
        }
        fuzz_bodies::tcp_stream(&b);
    }
    println!("tcp_stream fallback: {n} inputs in {:?}", t.elapsed());
}

fn mutate(rng: &mut Rng, b: &mut Vec<u8>) {
    match rng.below(5) {
        0 if !b.is_empty() => {
            let i = rng.below(b.len() as u64) as usize;
            b[i] ^= 1 << rng.below(8);
        }
        1 => {
            let i = rng.below(b.len() as u64 + 1) as usize;
            b.insert(i, rng.next() as u8);
        }
        2 if !b.is_empty() => {
            b.truncate(rng.below(b.len() as u64) as usize);
        }
        3 if b.len() >= 4 => {
            let i = rng.below(b.len() as u64 - 3) as usize;
            let v = [
                0u32,
                1,
                0xffff,
                0xffff_ffff,
                MAX_FRAME as u32,
                MAX_FRAME as u32 + 1,
            ][rng.below(6) as usize];
            b[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
        _ => {
            let n = rng.below(8) as usize;
            b.extend(rng.bytes(n));
        }
    }
}

// ---------------------------------------------------------------------------
// Rank processes (the parent's side)
// ---------------------------------------------------------------------------

const ROLE: &str = "TUTTI_HOSTILE_ROLE";

struct Group {
    kids: Vec<Option<Child>>,
    pids: Vec<u32>,
    status: Vec<Option<ExitStatus>>,
    rx: Receiver<(usize, String)>,
    log: Arc<Mutex<Vec<String>>>,
}

struct Job {
    test: &'static str,
    role: &'static str,
    n: usize,
    port: u16,
    token: String,
    extra: Vec<(String, String)>,
}

impl Job {
    fn new(test: &'static str, role: &'static str, n: usize, extra: &[(&str, String)]) -> Job {
        let mut r = Rng(now_ms() ^ ((std::process::id() as u64) << 20));
        Job {
            test,
            role,
            n,
            port: std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port(),
            token: format!("{:016x}{:016x}", r.next(), r.next()),
            extra: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    fn command(&self, rank: usize) -> Command {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args([self.test, "--exact", "--nocapture", "--test-threads=1"]);
        for v in [
            "TUTTI_TRANSPORT",
            "TUTTI_TIMEOUT",
            "TUTTI_TRACE_DIR",
            "TUTTI_LOCAL_RANK",
            "TUTTI_HOST_ID",
        ] {
            c.env_remove(v);
        }
        c.env(ROLE, self.role)
            .env("TUTTI_RANK", rank.to_string())
            .env("TUTTI_WORLD_SIZE", self.n.to_string())
            .env("TUTTI_MASTER_ADDR", "127.0.0.1")
            .env("TUTTI_MASTER_PORT", self.port.to_string())
            .env("TUTTI_TOKEN", &self.token)
            .env("TUTTI_CONNECT_TIMEOUT", "20")
            .env("TUTTI_TIMEOUT", "30");
        for (k, v) in &self.extra {
            c.env(k, v);
        }
        c
    }

    fn store(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn spawn(&self, ranks: &[usize]) -> Group {
        Group::spawn(ranks.iter().map(|&r| self.command(r)).collect(), ranks)
    }
}

fn push_log(log: &Mutex<Vec<String>>, r: usize, line: String) {
    // Skip the child test harness's own chatter.
    let t = line.trim();
    if t.is_empty()
        || t == "ok"
        || t == "running 1 test"
        || t.starts_with("test result:")
        || t.starts_with("test ") && t.ends_with("...")
    {
        return;
    }
    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
    if l.len() >= 400 {
        l.remove(0);
    }
    l.push(format!("[{r}] {line}"));
}

impl Group {
    /// Starts `cmds`, the ranks `ranks` (the numbers they report lines under).
    fn spawn(cmds: Vec<Command>, ranks: &[usize]) -> Group {
        let (tx, rx) = channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut kids = Vec::new();
        let mut pids = Vec::new();
        for (mut c, &r) in cmds.into_iter().zip(ranks) {
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = c.spawn().expect("starting a rank");
            pids.push(child.id());
            let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
            let (tx2, log2) = (tx.clone(), log.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    match line.find("@@ ") {
                        Some(i) => {
                            let _ = tx2.send((r, line[i + 3..].to_string()));
                        }
                        None => push_log(&log2, r, line),
                    }
                }
            });
            let log3 = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                    push_log(&log3, r, line);
                }
            });
            kids.push(Some(child));
        }
        let n = kids.len();
        Group {
            kids,
            pids,
            status: vec![None; n],
            rx,
            log,
        }
    }

    fn reap(&mut self) {
        for (i, k) in self.kids.iter_mut().enumerate() {
            if let Some(c) = k {
                if let Ok(Some(st)) = c.try_wait() {
                    self.status[i] = Some(st);
                    *k = None;
                }
            }
        }
    }

    /// Lines with `tag` from `count` distinct ranks (or fewer at `until`), by rank.
    fn collect(
        &mut self,
        tag: &str,
        count: usize,
        until: Instant,
        other: &mut Vec<(usize, String)>,
    ) -> Vec<(usize, String)> {
        let mut got: Vec<(usize, String)> = Vec::new();
        while got.len() < count {
            self.reap();
            let now = Instant::now();
            if now >= until {
                break;
            }
            match self
                .rx
                .recv_timeout((until - now).min(Duration::from_millis(10)))
            {
                Ok((r, l))
                    if l.split_whitespace().next() == Some(tag)
                        && !got.iter().any(|(q, _)| *q == r) =>
                {
                    got.push((r, l))
                }
                Ok(x) => other.push(x),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
            }
        }
        got.sort();
        got
    }

    fn log_tail(&self) -> String {
        let l = self.log.lock().unwrap_or_else(|e| e.into_inner());
        l[l.len().saturating_sub(25)..].join("\n")
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for c in self.kids.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn child() -> bool {
    let Ok(role) = std::env::var(ROLE) else {
        return false;
    };
    match role.as_str() {
        "job" => job_rank(),
        "setup" => setup_rank(),
        "flood" => flood_rank(),
        other => panic!("unknown role {other}"),
    }
    true
}

/// The TCP ports process `pid` listens on (from /proc: its socket inodes,
/// matched against the LISTEN entries of /proc/PID/net/tcp).
fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = HashSet::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            if let Ok(l) = std::fs::read_link(e.path()) {
                let l = l.to_string_lossy().to_string();
                if let Some(i) = l.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(i.to_string());
                }
            }
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let mut ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok()
            } else {
                None
            }
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

fn field(s: &str, key: &str) -> Option<u64> {
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// (VmHWM in KiB, threads) of this process.
fn self_status() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (
        field(&s, "VmHWM:").unwrap_or(0),
        field(&s, "Threads:").unwrap_or(0),
    )
}

// ---------------------------------------------------------------------------
// Rogue clients on the store port while a job runs
// ---------------------------------------------------------------------------

/// A job: all_reduce with checked results until rank 0 (after JOB_MS)
/// broadcasts "stop". Rank 0 reports its peak memory and thread count.
fn job_rank() {
    let comm = Communicator::from_env().unwrap();
    let (r, n) = (comm.rank(), comm.size());
    let job = Duration::from_millis(env_or("JOB_MS", "5000").parse().unwrap());
    let t0 = Instant::now();
    let mut x = vec![0.0f32; 16 << 10];
    let (mut it, mut bad, mut threads) = (0usize, 0usize, 0u64);
    loop {
        let k = (it % 5) as f32;
        x.fill((r + 1) as f32 + k);
        if let Err(e) = comm.all_reduce(&mut x, ReduceOp::Sum) {
            println!("@@ FAIL iteration {it}: {e}");
            return;
        }
        let want = (n * (n + 1) / 2) as f32 + n as f32 * k;
        bad += x.iter().filter(|&&v| v != want).count();
        if it == 0 {
            println!("@@ READY");
        }
        it += 1;
        if it % 16 == 0 {
            threads = threads.max(self_status().1);
            let mut go = [u8::from(t0.elapsed() < job)];
            if let Err(e) = comm.broadcast(&mut go, 0) {
                println!("@@ FAIL broadcast: {e}");
                return;
            }
            if go[0] == 0 {
                break;
            }
        }
    }
    let (hwm, _) = self_status();
    println!("@@ DONE {it} {bad} {hwm} {threads}");
}

/// What the rogue did.
#[derive(Default)]
struct Tally {
    attacks: AtomicUsize,
    refused: AtomicUsize,
}

/// One hostile connection of kind `k` to `addr`.
fn attack(addr: SocketAddr, k: u64, rng: &mut Rng, tally: &Tally) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        tally.refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    tally.attacks.fetch_add(1, Ordering::Relaxed);
    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
    let bytes: Vec<u8> = match k % 9 {
        0 => Vec::new(),            // connect, close
        1 => frame(&rng.bytes(16)), // a wrong token
        2 => frame(b"Gx0/0"),       // a request without the token
        3 => {
            let n = 1 + rng.below(2048) as usize;
            rng.bytes(n) // garbage
        }
        4 => [&u32::MAX.to_le_bytes()[..], &rng.bytes(64)].concat(), // a huge length
        5 => [&16u32.to_le_bytes()[..], &[1, 2, 3, 4, 5]].concat(),  // a truncated frame
        6 => ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec(),        // just over the limit
        7 => frame(&rng.bytes(15)),                                  // a token one byte short
        _ => [frame(&rng.bytes(16)), frame(b"P\x02\x00x0garbage")].concat(), // wrong token, then a put
    };
    let _ = s.write_all(&bytes);
    // Half the time hang around briefly to see whether the store answers (it must not).
    if k.is_multiple_of(2) {
        let _ = s.set_read_timeout(Some(Duration::from_millis(20)));
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
    }
}

/// A slow-loris client: announces a frame of MAX_FRAME bytes, then sends a
/// byte every `every` until the server closes the connection or `stop`.
/// Returns how long the server kept it open (`None`: still open at stop).
fn slow_loris(
    addr: SocketAddr,
    every: Duration,
    stop: &AtomicBool,
    limit: Duration,
) -> Option<Duration> {
    let mut s = TcpStream::connect(addr).ok()?;
    let t = Instant::now();
    let _ = s.set_nonblocking(true);
    let _ = s.write_all(&(MAX_FRAME as u32).to_le_bytes());
    while !stop.load(Ordering::Relaxed) && t.elapsed() < limit {
        std::thread::sleep(every);
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => return Some(t.elapsed()),
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return Some(t.elapsed()),
            _ => {}
        }
        if s.write(&[0x42]).is_err() {
            return Some(t.elapsed());
        }
    }
    None
}

/// A 3-rank job (TCP) runs repeated, checked all_reduce while the rogue
/// hammers rank 0's store port with every kind of bad connection, a flood
/// of idle connections and slow-loris clients. The job must finish with
/// correct results and rank 0's memory must stay bounded.
#[test]
fn rogue_clients_on_store_port_during_job() {
    if child() {
        return;
    }
    let _s = serial();
    let job = Job::new(
        "rogue_clients_on_store_port_during_job",
        "job",
        3,
        &[("JOB_MS", "6000".into()), ("TUTTI_TRANSPORT", "tcp".into())],
    );
    let mut g = job.spawn(&[0, 1, 2]);
    let mut other = Vec::new();
    let ready = g.collect(
        "READY",
        3,
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    assert_eq!(
        ready.len(),
        3,
        "not ready: {ready:?} {other:?}; log:\n{}",
        g.log_tail()
    );
    let addr = job.store();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let t0 = Instant::now();
    let rogue = {
        let (stop, tally) = (stop.clone(), tally.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(seed() ^ 0xbad);
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(5) {
                attack(addr, k, &mut rng, &tally);
                k += 1;
            }
        })
    };
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // 200 idle connections, held for two seconds, twice.
            let mut held = 0;
            for _ in 0..2 {
                let conns: Vec<TcpStream> = (0..200)
                    .filter_map(|_| {
                        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()
                    })
                    .collect();
                held += conns.len();
                std::thread::sleep(Duration::from_secs(2));
                drop(conns);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            held
        })
    };
    let lorises: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                slow_loris(
                    addr,
                    Duration::from_millis(250),
                    &stop,
                    Duration::from_secs(30),
                )
            })
        })
        .collect();
    let done = g.collect(
        "DONE",
        3,
        Instant::now() + Duration::from_secs(60),
        &mut other,
    );
    stop.store(true, Ordering::Relaxed);
    let _ = rogue.join();
    let held = flood.join().unwrap();
    let loris: Vec<Option<Duration>> = lorises.into_iter().map(|h| h.join().unwrap()).collect();
    println!(
        "rogue: {} hostile connections ({} refused), {held} idle connections held; the job ran {:?} under attack; \
         slow-loris clients were closed after {loris:?} (when the job ended, if that is the job's length)",
        tally.attacks.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        t0.elapsed()
    );
    println!("job: {done:?}; other: {other:?}");
    assert_eq!(
        done.len(),
        3,
        "the job did not finish: {done:?} {other:?}; log:\n{}",
        g.log_tail()
    );
    for (r, l) in &done {
        let f: Vec<u64> = l
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(f[0] > 16, "rank {r}: only {} iterations", f[0]);
        assert_eq!(f[1], 0, "rank {r}: {} wrong elements", f[1]);
        if *r == 0 {
            println!(
                "rank 0 (the store): peak RSS {} MiB, at most {} threads",
                f[2] / 1024,
                f[3]
            );
            assert!(f[2] < 256 << 10, "rank 0's peak RSS is {} KiB", f[2]);
        }
    }
    // The store serves only set-up: once every rank has joined it stops, so
    // during the job the rogue is refused at the door, which is the best
    // outcome. Either way it must really have tried.
    assert!(
        tally.attacks.load(Ordering::Relaxed) + tally.refused.load(Ordering::Relaxed) > 100,
        "the rogue hardly tried"
    );
}

/// The store drops a client that trickles its first frame: whatever it
/// claims, a connection that has not authenticated within a few seconds is
/// gone (the store's own doc says so).
#[test]
fn store_drops_slow_loris_clients() {
    let _s = serial();
    // The store lives while ranks join: rank 0 waits for rank 1, which
    // joins only after 7 s, so the slow-loris meets a running store.
    let id = UniqueId::new().unwrap();
    let stop = AtomicBool::new(false);
    let kept = std::thread::scope(|s| {
        let id0 = id.clone();
        let r0 = s.spawn(move || Communicator::init_rank(&id0, 2, 0));
        std::thread::sleep(Duration::from_millis(200));
        let kept = slow_loris(
            id.addr,
            Duration::from_millis(250),
            &stop,
            Duration::from_secs(6),
        );
        let id1 = id.clone();
        let r1 = s.spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            Communicator::init_rank(&id1, 2, 1)
        });
        let c0 = r0
            .join()
            .unwrap()
            .expect("rank 0 joins despite the slow-loris");
        let c1 = r1.join().unwrap().expect("rank 1 joins");
        drop((c0, c1));
        kept
    });
    println!("slow-loris kept open for {kept:?} (None: still open after 6 s)");
    assert!(
        kept.is_some_and(|d| d < Duration::from_millis(5500)),
        "the store kept an unauthenticated slow-loris connection open for {kept:?} (None: > 6 s); \
         it should enforce a deadline on the whole handshake, not only on each read"
    );
}

/// Rogue clients hammer the store port while the ranks are still starting
/// (threads of this process, each joining with init_rank): set-up succeeds
/// and the first collective is right.
#[test]
fn rogue_clients_during_setup() {
    let _s = serial();
    let id = UniqueId::new().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let rogues: Vec<_> = (0..2)
        .map(|i| {
            let (stop, tally, addr) = (stop.clone(), tally.clone(), id.addr);
            std::thread::spawn(move || {
                let mut rng = Rng(seed() ^ 0x5e7 ^ i);
                let mut k = i;
                while !stop.load(Ordering::Relaxed) {
                    attack(addr, k, &mut rng, &tally);
                    k += 2;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let results: Vec<tutti::Result<Vec<f64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let id = id.clone();
                s.spawn(move || {
                    let cfg = Config {
                        connect_timeout: Duration::from_secs(20),
                        timeout: Duration::from_secs(20),
                        ..Config::default()
                    };
                    let c = Communicator::init_rank_with(&id, 3, r, cfg)?;
                    let mut x = vec![(r + 1) as f64; 1000];
                    c.all_reduce(&mut x, ReduceOp::Sum)?;
                    Ok(x)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in rogues {
        let _ = h.join();
    }
    println!(
        "set-up under attack: {took:?}, {} hostile connections",
        tally.attacks.load(Ordering::Relaxed)
    );
    for (r, x) in results.iter().enumerate() {
        let x = x.as_ref().unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(x.iter().all(|&v| v == 6.0), "rank {r}: wrong sum");
    }
    assert!(
        took < Duration::from_secs(10),
        "set-up took {took:?} under attack"
    );
}

// ---------------------------------------------------------------------------
// The peer listener during set-up
// ---------------------------------------------------------------------------

fn setup_rank() {
    let t = Instant::now();
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("@@ READY FAILED after {:?}: {e}", t.elapsed());
            return;
        }
    };
    println!("@@ READY ok {}", t.elapsed().as_millis());
    let mut x = vec![1.0f32; 1000];
    match comm.all_reduce(&mut x, ReduceOp::Sum) {
        Ok(()) if x.iter().all(|&v| v == comm.size() as f32) => println!("@@ DONE ok"),
        Ok(()) => println!("@@ DONE wrong-data"),
        Err(e) => println!("@@ DONE {e}"),
    }
}

/// A slow-loris client on a rank's peer listener (which accepts the TCP
/// links of higher ranks during set-up) must not stall the job's start:
/// ranks 0 and 1 start; the rogue finds rank 1's listener (from /proc) and
/// trickles bytes into it; then rank 2 starts. Set-up must finish promptly.
#[test]
fn peer_listener_slow_loris_during_setup() {
    if child() {
        return;
    }
    let _s = serial();
    let job = Job::new(
        "peer_listener_slow_loris_during_setup",
        "setup",
        3,
        &[("TUTTI_TRANSPORT", "tcp".into())],
    );
    let mut first = job.spawn(&[0, 1]);
    let pid1 = first.pids[1];
    let until = Instant::now() + Duration::from_secs(15);
    let port = loop {
        if let Some(&p) = listening_ports(pid1).first() {
            break p;
        }
        assert!(
            Instant::now() < until,
            "rank 1 never listened; log:\n{}",
            first.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let stop = Arc::new(AtomicBool::new(false));
    let loris = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let Ok(mut s) = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))) else {
                return;
            };
            while !stop.load(Ordering::Relaxed) {
                if s.write_all(&[0x42]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let mut last = job.spawn(&[2]);
    let mut other = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut ready = first.collect("READY", 2, deadline, &mut other);
    ready.extend(last.collect("READY", 1, deadline, &mut other));
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = loris.join();
    println!("set-up with a slow-loris on rank 1's peer port {port}: {took:?}: {ready:?}");
    assert!(
        ready.len() == 3 && ready.iter().all(|(_, l)| l.starts_with("READY ok")),
        "set-up failed with a slow-loris client on rank 1's peer listener: {ready:?}; log:\n{}",
        first.log_tail()
    );
    assert!(
        took < Duration::from_secs(8),
        "set-up took {took:?}: a slow-loris client on a peer listener stalls the job's start"
    );
}

// ---------------------------------------------------------------------------
// The recovery listener
// ---------------------------------------------------------------------------

/// After set-up, rank 0 waits for the file GO, then asks which ranks are dead.
fn flood_rank() {
    let comm = Communicator::from_env().unwrap();
    println!("@@ READY");
    if comm.rank() == 0 {
        let go = std::path::PathBuf::from(env_or("GO", ""));
        let t = Instant::now();
        while !go.exists() && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let t = Instant::now();
        let dead = comm.dead_ranks();
        println!("@@ DEAD {dead:?} {}", t.elapsed().as_millis());
    }
    match comm.barrier() {
        Ok(()) => println!("@@ DONE ok"),
        Err(e) => println!("@@ DONE {e}"),
    }
}

/// Every rank keeps a listener for recovery (shrink); dead_ranks() calls a
/// rank dead when a connect to it does not complete within half a second.
/// A rogue that opens and closes connections to that port (which nobody
/// accepts while the job runs) must not make a live rank look dead.
#[test]
fn rescue_listener_flood_does_not_fake_dead_ranks() {
    if child() {
        return;
    }
    let _s = serial();
    let go = std::env::temp_dir().join(format!(
        "tutti-hostile-go-{}-{}",
        std::process::id(),
        now_ms()
    ));
    let _ = std::fs::remove_file(&go);
    let job = Job::new(
        "rescue_listener_flood_does_not_fake_dead_ranks",
        "flood",
        3,
        &[("GO", go.display().to_string())],
    );
    let mut g = job.spawn(&[0, 1, 2]);
    let mut other = Vec::new();
    let ready = g.collect(
        "READY",
        3,
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    assert_eq!(ready.len(), 3, "{ready:?}; log:\n{}", g.log_tail());
    let ports = listening_ports(g.pids[1]);
    assert_eq!(
        ports.len(),
        1,
        "rank 1 should listen on exactly its recovery port: {ports:?}"
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    // Open and close connections until the port stops answering (its
    // backlog is full), at most 1000.
    let (mut opened, mut refused) = (0, 0);
    while opened + refused < 1000 && refused < 5 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
            Ok(s) => {
                opened += 1;
                drop(s);
            }
            Err(_) => refused += 1,
        }
    }
    std::fs::write(&go, b"go").unwrap();
    let dead = g.collect(
        "DEAD",
        1,
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    let done = g.collect(
        "DONE",
        3,
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    let _ = std::fs::remove_file(&go);
    println!("flooded rank 1's recovery port {}: {opened} connections opened, {refused} timed out; {dead:?} {done:?}", ports[0]);
    assert!(done.iter().all(|(_, l)| l == "DONE ok"), "{done:?}");
    assert!(
        dead.first().is_some_and(|(_, l)| l.starts_with("DEAD []")),
        "dead_ranks() calls a live rank dead after a rogue filled its recovery listener's backlog: {dead:?}"
    );
}
