//! Failure handling over real processes: fault injection (kill -9 a random
//! rank during a random collective, over shm, tcp and a cluster of network
//! namespaces), timeouts, abort, mismatched collectives, shrink-and-continue
//! and the flight recorder. See `docs/faults.md`.
//!
//! Every multi-process test re-runs this test binary as its ranks
//! (`<exe> <test> --exact --nocapture --test-threads=1` with `TUTTI_RANK`,
//! `TUTTI_WORLD_SIZE`, `TUTTI_MASTER_ADDR/PORT`, `TUTTI_TOKEN` and the role
//! variable [`ROLE`]). A rank reports on stdout in lines starting with `@@`,
//! which the parent parses; the parent holds a hard deadline on every step
//! and kills every rank it started when it returns or panics, so a hang
//! fails loudly instead of hanging CI.
//!
//! Random choices come from a seeded generator (`TUTTI_FAULT_SEED`, printed);
//! `TUTTI_FAULT_TRIALS` sets the number of fault-injection trials per
//! transport (default 50). The multi-process tests of this file run one at a
//! time (a lock), because detection times are asserted and the machine may
//! have only two cores.
// Reads the environment: the harness's own knobs, and the roles it gives its
// child processes.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tutti::{Communicator, Config, Error, Options, ReduceOp};

/// Set in rank processes: which body to run.
const ROLE: &str = "TUTTI_FAULTS_ROLE";
/// The detection bound the issue asks for.
const DETECT_MS: u64 = 2000;

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// splitmix64: a seeded generator, so every run makes the same choices.
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
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

fn seed() -> u64 {
    std::env::var("TUTTI_FAULT_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(20_240_611)
}

fn trials() -> usize {
    std::env::var("TUTTI_FAULT_TRIALS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(50)
}

/// One multi-process test at a time (timings are asserted).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn token() -> String {
    let mut r = Rng(now_ms() ^ ((std::process::id() as u64) << 32) ^ free_port() as u64);
    format!("{:016x}{:016x}", r.next(), r.next())
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn median(xs: &mut [u64]) -> u64 {
    if xs.is_empty() {
        return 0;
    }
    xs.sort_unstable();
    xs[xs.len() / 2]
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tutti-faults-{}-{tag}-{}",
        std::process::id(),
        now_ms()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A compact, parseable description of an error: `KIND PEER SEQ`.
fn err_fields(e: &Error) -> String {
    match e {
        Error::PeerLost { peer, seq, .. } => format!("PeerLost {peer} {seq}"),
        Error::Timeout {
            seq, waiting_for, ..
        } => {
            let w: Vec<String> = waiting_for.iter().map(|r| r.to_string()).collect();
            format!(
                "Timeout {} {seq}",
                if w.is_empty() {
                    "-".into()
                } else {
                    w.join(",")
                }
            )
        }
        Error::Mismatch { peer, seq, .. } => format!("Mismatch {peer} {seq}"),
        Error::Aborted => "Aborted - -".into(),
        Error::InvalidArgument(_) => "InvalidArgument - -".into(),
        Error::Bootstrap { .. } => "Bootstrap - -".into(),
        _ => "Other - -".into(),
    }
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::PeerLost { .. } => "PeerLost",
        Error::Timeout { .. } => "Timeout",
        Error::Mismatch { .. } => "Mismatch",
        Error::Aborted => "Aborted",
        _ => "Other",
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " | ")
}

// ---------------------------------------------------------------------------
// The parent's side: a group of rank processes
// ---------------------------------------------------------------------------

/// Rank processes started by a test. Dropping the group kills (SIGKILL) and
/// reaps every rank still running.
struct Group {
    kids: Vec<Option<Child>>,
    pids: Vec<u32>,
    status: Vec<Option<ExitStatus>>,
    rx: Receiver<(usize, String)>,
    log: Arc<Mutex<Vec<String>>>,
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

/// What every rank command gets; `extra` is added last.
struct RankEnv<'a> {
    test: &'a str,
    role: &'a str,
    n: usize,
    master: String,
    port: u16,
    token: String,
    extra: Vec<(String, String)>,
}

impl RankEnv<'_> {
    fn command(&self, rank: usize, netns: Option<&str>) -> Command {
        let exe = std::env::current_exe().unwrap();
        let mut c = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        c.args([self.test, "--exact", "--nocapture", "--test-threads=1"]);
        for v in [
            "TUTTI_TRANSPORT",
            "TUTTI_TIMEOUT",
            "TUTTI_CONNECT_TIMEOUT",
            "TUTTI_TRACE_DIR",
            "TUTTI_LOCAL_RANK",
            "TUTTI_HOST_ID",
            "TUTTI_SOCKET_IFNAME",
            "RUST_LOG",
        ] {
            c.env_remove(v);
        }
        c.env(ROLE, self.role)
            .env("TUTTI_RANK", rank.to_string())
            .env("TUTTI_WORLD_SIZE", self.n.to_string())
            .env("TUTTI_MASTER_ADDR", &self.master)
            .env("TUTTI_MASTER_PORT", self.port.to_string())
            .env("TUTTI_TOKEN", &self.token)
            .env("TUTTI_CONNECT_TIMEOUT", "20")
            .env("RUST_BACKTRACE", "0");
        for (k, v) in &self.extra {
            c.env(k, v);
        }
        c
    }
}

impl Group {
    fn spawn(cmds: Vec<Command>) -> Group {
        let (tx, rx) = channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut kids = Vec::new();
        let mut pids = Vec::new();
        for (r, mut c) in cmds.into_iter().enumerate() {
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = c.spawn().expect("starting a rank process");
            pids.push(child.id());
            let out = child.stdout.take().unwrap();
            let err = child.stderr.take().unwrap();
            let (tx2, log2) = (tx.clone(), log.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    // libtest may print "test NAME ... " on the same line.
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

    /// Reaps ranks that exited (so that a dead rank does not linger as a
    /// zombie, which shared-memory peers would take for alive).
    fn reap(&mut self) {
        for (r, k) in self.kids.iter_mut().enumerate() {
            if let Some(c) = k {
                if let Ok(Some(st)) = c.try_wait() {
                    self.status[r] = Some(st);
                    *k = None;
                }
            }
        }
    }

    /// The next `@@` line from any rank, or `None` at `until`.
    fn recv(&mut self, until: Instant) -> Option<(usize, String)> {
        loop {
            self.reap();
            let now = Instant::now();
            if now >= until {
                return None;
            }
            match self
                .rx
                .recv_timeout((until - now).min(Duration::from_millis(10)))
            {
                Ok(x) => return Some(x),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
            }
        }
    }

    /// Waits until every rank in `want` has sent a line with `tag` (first
    /// word); returns each one's fields after the tag. Lines with other tags
    /// go to `other`.
    fn collect(
        &mut self,
        want: &[usize],
        tags: &[&str],
        until: Instant,
        other: &mut Vec<(usize, String)>,
    ) -> Vec<Option<String>> {
        let mut got: Vec<Option<String>> = vec![None; self.kids.len()];
        while want.iter().any(|&r| got[r].is_none()) {
            let Some((r, line)) = self.recv(until) else {
                break;
            };
            let tag = line.split_whitespace().next().unwrap_or("");
            if tags.contains(&tag) && want.contains(&r) && got[r].is_none() {
                got[r] = Some(line);
            } else {
                other.push((r, line));
            }
        }
        got
    }

    /// SIGKILL and reap one rank.
    fn kill(&mut self, r: usize) {
        if let Some(mut c) = self.kids[r].take() {
            let _ = c.kill();
            if let Ok(st) = c.wait() {
                self.status[r] = Some(st);
            }
        }
    }

    /// Waits until the ranks in `which` have exited; returns those still running at `until`.
    fn wait_exit(&mut self, which: &[usize], until: Instant) -> Vec<usize> {
        loop {
            self.reap();
            let running: Vec<usize> = which
                .iter()
                .copied()
                .filter(|&r| self.kids[r].is_some())
                .collect();
            if running.is_empty() || Instant::now() >= until {
                return running;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn log_tail(&self) -> String {
        let l = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let start = l.len().saturating_sub(25);
        l[start..].join("\n")
    }

    /// The threads' stacks of a (hung) rank, from gdb if it is installed.
    fn stacks(&self, r: usize) -> String {
        if self.kids[r].is_none() {
            return format!("rank {r} has exited");
        }
        let out = Command::new("gdb")
            .args([
                "-p",
                &self.pids[r].to_string(),
                "-batch",
                "-nx",
                "-ex",
                "thread apply all bt 30",
            ])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout);
                let frames: Vec<&str> = text
                    .lines()
                    .filter(|l| l.starts_with('#') || l.starts_with("Thread"))
                    .collect();
                format!(
                    "stacks of rank {r} (pid {}):\n{}",
                    self.pids[r],
                    frames.join("\n")
                )
            }
            Err(e) => format!("no stacks of rank {r} (gdb: {e})"),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for r in 0..self.kids.len() {
            self.kill(r);
        }
    }
}

fn local_group(test: &str, role: &str, n: usize, extra: Vec<(String, String)>) -> Group {
    let e = RankEnv {
        test,
        role,
        n,
        master: "127.0.0.1".into(),
        port: free_port(),
        token: token(),
        extra,
    };
    Group::spawn((0..n).map(|r| e.command(r, None)).collect())
}

fn kv(k: &str, v: impl ToString) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// Rank processes run the body of their role and the test returns.
fn child() -> bool {
    let Ok(role) = std::env::var(ROLE) else {
        return false;
    };
    match role.as_str() {
        "fault" => fault_rank(),
        "abort" => abort_rank(),
        "abort_idle" => abort_idle_rank(),
        "timeout" => timeout_rank(),
        "mismatch" => mismatch_rank(),
        "shrink" => shrink_rank(),
        other => panic!("unknown role {other}"),
    }
    true
}

fn die_now() -> ! {
    // SAFETY: kill(2) on our own pid with SIGKILL; nothing after it runs.
    unsafe {
        libc::kill(std::process::id() as i32, libc::SIGKILL);
    }
    unreachable!("SIGKILL did not kill")
}

// ---------------------------------------------------------------------------
// Collectives with checked results (shared by several roles)
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coll {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    Barrier,
}

const COLLS: [Coll; 9] = [
    Coll::AllReduce,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::AllGather,
    Coll::ReduceScatter,
    Coll::AllToAll,
    Coll::Gather,
    Coll::Scatter,
    Coll::Barrier,
];

impl Coll {
    fn name(self) -> String {
        format!("{self:?}")
    }
    fn parse(s: &str) -> Coll {
        *COLLS
            .iter()
            .find(|c| c.name() == s)
            .unwrap_or_else(|| panic!("unknown collective {s}"))
    }
    /// Buffers of `size * count` elements (so counts stay smaller).
    fn blocked(self) -> bool {
        matches!(
            self,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter
        )
    }
}

struct Bufs {
    send: Vec<f32>,
    recv: Vec<f32>,
}

/// Checks a sample of `xs` (every element up to 64 Ki, a stride beyond).
fn check(xs: &[f32], want: impl Fn(usize) -> f32) -> bool {
    let stride = (xs.len() / 65536).max(1);
    (0..xs.len())
        .step_by(stride)
        .chain(xs.len().checked_sub(1))
        .all(|i| xs[i] == want(i))
}

/// Runs iteration `it` of `coll` with `count` elements and checks the result.
fn run_coll(
    c: &Communicator,
    coll: Coll,
    count: usize,
    it: usize,
    b: &mut Bufs,
) -> tutti::Result<bool> {
    let (r, n) = (c.rank(), c.size());
    let k = (it % 3) as f32;
    let root = it % n;
    let val = |q: usize| (q + 1) as f32 + k;
    let sum: f32 = (0..n).map(val).sum();
    let nc = n * count;
    Ok(match coll {
        Coll::AllReduce => {
            let x = &mut b.recv[..count];
            x.fill(val(r));
            c.all_reduce(x, ReduceOp::Sum)?;
            check(x, |_| sum)
        }
        Coll::Broadcast => {
            let x = &mut b.recv[..count];
            x.fill(if r == root { val(root) } else { -1.0 });
            c.broadcast(x, root)?;
            check(x, |_| val(root))
        }
        Coll::Reduce => {
            b.send[..count].fill(val(r));
            let out = if r == root {
                &mut b.recv[..count]
            } else {
                &mut b.recv[..0]
            };
            c.reduce(&b.send[..count], out, ReduceOp::Sum, root)?;
            check(out, |_| sum)
        }
        Coll::AllGather => {
            b.send[..count].fill(val(r));
            c.all_gather(&b.send[..count], &mut b.recv[..nc])?;
            check(&b.recv[..nc], |i| val(i / count))
        }
        Coll::ReduceScatter => {
            b.send[..nc].fill(val(r));
            c.reduce_scatter(&b.send[..nc], &mut b.recv[..count], ReduceOp::Sum)?;
            check(&b.recv[..count], |_| sum)
        }
        Coll::AllToAll => {
            for q in 0..n {
                b.send[q * count..(q + 1) * count].fill((r * n + q) as f32 + k);
            }
            c.all_to_all(&b.send[..nc], &mut b.recv[..nc])?;
            check(&b.recv[..nc], |i| ((i / count) * n + r) as f32 + k)
        }
        Coll::Gather => {
            b.send[..count].fill(val(r));
            let out = if r == root {
                &mut b.recv[..nc]
            } else {
                &mut b.recv[..0]
            };
            c.gather(&b.send[..count], out, root)?;
            check(out, |i| val(i / count))
        }
        Coll::Scatter => {
            if r == root {
                for q in 0..n {
                    b.send[q * count..(q + 1) * count].fill(val(q));
                }
            }
            let send = if r == root {
                &b.send[..nc]
            } else {
                &b.send[..0]
            };
            c.scatter(send, &mut b.recv[..count], root)?;
            check(&b.recv[..count], |_| val(r))
        }
        Coll::Barrier => {
            c.barrier()?;
            true
        }
    })
}

// ---------------------------------------------------------------------------
// Fault injection: kill -9 a random rank during a random collective
// ---------------------------------------------------------------------------

/// A rank of a fault-injection trial: loops the collective until it fails.
fn fault_rank() {
    let coll = Coll::parse(&env_or("FAULT_COLL", "AllReduce"));
    let count: usize = env_or("FAULT_COUNT", "1000").parse().unwrap();
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("@@ INITERR {}", one_line(&e.to_string()));
            return;
        }
    };
    let n = comm.size();
    let mut b = Bufs {
        send: vec![0.0; n * count],
        recv: vec![0.0; n * count],
    };
    let t0 = Instant::now();
    let mut it = 0usize;
    loop {
        match run_coll(&comm, coll, count, it, &mut b) {
            Ok(ok) => {
                if !ok {
                    println!("@@ BADDATA {it}");
                }
                if it == 0 {
                    println!("@@ READY");
                }
            }
            Err(e) => {
                let at = now_ms();
                let asyn = comm.error().map_or("None", |e| kind(&e));
                println!(
                    "@@ ERR {at} {} {asyn} {}",
                    err_fields(&e),
                    one_line(&e.to_string())
                );
                return;
            }
        }
        it += 1;
        if t0.elapsed() > Duration::from_secs(25) {
            println!("@@ NOERR {it}");
            return;
        }
    }
}

/// How a trial kills its victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KillMode {
    /// SIGKILL the victim rank's process.
    Process,
    /// The victim's host vanishes: its link goes down, then its ranks are killed.
    HostCut,
}

struct Trial {
    n: usize,
    coll: Coll,
    count: usize,
    victim: usize,
    delay_ms: u64,
    mode: KillMode,
}

impl Trial {
    fn random(rng: &mut Rng, ns: &[usize]) -> Trial {
        let n = rng.pick(ns);
        let coll = rng.pick(&COLLS);
        let count = if coll.blocked() {
            rng.pick(&[1usize, 1000, 40_000, 300_000])
        } else {
            rng.pick(&[1usize, 1000, 65_537, 1 << 20])
        };
        Trial {
            n,
            coll,
            count,
            victim: rng.below(n as u64) as usize,
            delay_ms: rng.below(150),
            mode: KillMode::Process,
        }
    }
    fn describe(&self) -> String {
        format!(
            "n={} {} count={} victim={} delay={}ms mode={:?}",
            self.n,
            self.coll.name(),
            self.count,
            self.victim,
            self.delay_ms,
            self.mode
        )
    }
}

/// What a trial found.
#[derive(Default)]
struct Outcome {
    /// Detection time (ms from the kill) of every survivor that reported PeerLost.
    times: Vec<u64>,
    /// Survivors that named the killed rank itself as the lost peer.
    named_victim: usize,
    survivors: usize,
    problems: Vec<String>,
}

/// Where and how a trial's ranks run.
trait Stage {
    fn label(&self) -> String;
    fn spawn(&self, trial: &Trial, idx: usize, trace: &Path) -> Group;
    /// Kills the victim(s); returns the ranks killed.
    fn kill(&self, g: &mut Group, trial: &Trial) -> Vec<usize>;
    /// Undo whatever `kill` changed besides the processes.
    fn restore(&self, _trial: &Trial) {}
}

struct LocalStage {
    tcp: bool,
    test: &'static str,
}

impl Stage for LocalStage {
    fn label(&self) -> String {
        if self.tcp {
            "tcp".into()
        } else {
            "shm".into()
        }
    }
    fn spawn(&self, t: &Trial, _idx: usize, trace: &Path) -> Group {
        let mut extra = vec![
            kv("FAULT_COLL", t.coll.name()),
            kv("FAULT_COUNT", t.count),
            // Far beyond the detection bound: only failure detection may end an op.
            kv("TUTTI_TIMEOUT", 60),
            kv("TUTTI_TRACE_DIR", trace.display()),
        ];
        if self.tcp {
            extra.push(kv("TUTTI_TRANSPORT", "tcp"));
        }
        local_group(self.test, "fault", t.n, extra)
    }
    fn kill(&self, g: &mut Group, t: &Trial) -> Vec<usize> {
        g.kill(t.victim);
        vec![t.victim]
    }
}

/// Runs one trial on `stage`.
fn run_trial(stage: &dyn Stage, t: &Trial, idx: usize) -> Outcome {
    let mut out = Outcome::default();
    let trace = temp_dir(&format!("{}-{idx}", stage.label()));
    let mut g = stage.spawn(t, idx, &trace);
    let all: Vec<usize> = (0..t.n).collect();
    let mut other = Vec::new();
    let ready = g.collect(
        &all,
        &["READY", "INITERR"],
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    if let Some(r) = (0..t.n).find(|&r| ready[r].as_deref() != Some("READY")) {
        out.problems.push(format!(
            "rank {r} never became ready ({:?}); other lines {other:?}; log:\n{}",
            ready[r],
            g.log_tail()
        ));
        return out;
    }
    std::thread::sleep(Duration::from_millis(t.delay_ms));
    let kill_at = now_ms();
    let killed = stage.kill(&mut g, t);
    let survivors: Vec<usize> = all
        .iter()
        .copied()
        .filter(|r| !killed.contains(r))
        .collect();
    out.survivors = survivors.len();
    let got = g.collect(
        &survivors,
        &["ERR", "NOERR"],
        Instant::now() + Duration::from_secs(12),
        &mut other,
    );
    for &r in &survivors {
        match got[r].as_deref() {
            None => out.problems.push(format!(
                "rank {r}: no error within 12 s of the kill (hang); {}",
                g.stacks(r)
            )),
            Some(l) if l.starts_with("NOERR") => {
                out.problems.push(format!("rank {r}: never failed: {l}"))
            }
            Some(l) => {
                // ERR <ms> <kind> <peer> <seq> <async kind> <message>
                let f: Vec<&str> = l.split_whitespace().collect();
                let at: u64 = f[1].parse().unwrap();
                let dt = at.saturating_sub(kill_at);
                let (k, peer, asyn) = (f[2], f[3], f[5]);
                if k != "PeerLost" {
                    out.problems
                        .push(format!("rank {r}: expected PeerLost, got {l}"));
                } else if dt > DETECT_MS {
                    out.problems.push(format!(
                        "rank {r}: detected after {dt} ms (> {DETECT_MS}): {l}"
                    ));
                }
                if k == "PeerLost" {
                    out.times.push(dt);
                    if killed.iter().any(|v| v.to_string() == peer) {
                        out.named_victim += 1;
                    }
                }
                if asyn == "None" {
                    out.problems
                        .push(format!("rank {r}: comm.error() is None after a failure"));
                }
            }
        }
    }
    for (r, l) in &other {
        if l.starts_with("BADDATA") {
            out.problems
                .push(format!("rank {r}: wrong data before the failure: {l}"));
        }
    }
    let hung = g.wait_exit(&survivors, Instant::now() + Duration::from_secs(5));
    if !hung.is_empty() {
        out.problems.push(format!(
            "ranks {hung:?} did not exit within 5 s of failing (hang in drop?)"
        ));
    }
    let log = g.log_tail();
    drop(g);
    stage.restore(t);
    // Every survivor wrote its flight recorder; the analysis names the dead rank(s).
    if out.problems.is_empty() {
        match tutti::trace::analyze(&trace) {
            Ok(a) => {
                // A cut-off host's ranks live on for a moment and may see
                // their own failure and write a trace before they are
                // killed: then only a subset of them is missing.
                let ok = if t.mode == KillMode::HostCut {
                    a.missing.iter().all(|m| killed.contains(m))
                } else {
                    a.missing == killed
                };
                if !ok {
                    out.problems.push(format!(
                        "trace analysis: missing {:?}, expected {killed:?}:\n{}",
                        a.missing, a.summary
                    ));
                }
            }
            Err(e) => out.problems.push(format!("trace analysis failed: {e}")),
        }
    } else {
        out.problems.push(format!("log:\n{log}"));
    }
    let _ = std::fs::remove_dir_all(&trace);
    out
}

/// Runs `count` random trials on `stage` and asserts that every survivor of
/// every trial failed with PeerLost within [`DETECT_MS`].
fn campaign(stage: &dyn Stage, ns: &[usize], count: usize, rng: &mut Rng, modes: &[KillMode]) {
    let t0 = Instant::now();
    let mut times = Vec::new();
    let (mut detected, mut named, mut survivors) = (0usize, 0usize, 0usize);
    let mut failures = Vec::new();
    for i in 0..count {
        let mut t = Trial::random(rng, ns);
        t.mode = rng.pick(modes);
        let o = run_trial(stage, &t, i);
        let worst = o.times.iter().max().copied().unwrap_or(0);
        println!(
            "[{}] trial {i:2}: {} -> {} survivors, worst {worst} ms{}",
            stage.label(),
            t.describe(),
            o.survivors,
            if o.problems.is_empty() {
                String::new()
            } else {
                format!("  PROBLEMS: {}", o.problems.join("; "))
            }
        );
        if o.problems.is_empty() {
            detected += 1;
        } else {
            failures.push(format!(
                "trial {i} ({}): {}",
                t.describe(),
                o.problems.join("\n  ")
            ));
        }
        named += o.named_victim;
        survivors += o.survivors;
        times.extend(o.times);
    }
    let max = times.iter().max().copied().unwrap_or(0);
    let med = median(&mut times);
    println!(
        "FAULT TALLY [{}]: trials {count}, detected {detected}, max {max} ms, median {med} ms, \
         survivor reports {} ({named} named the killed rank, the rest a rank that failed after it), {:.1} s",
        stage.label(),
        times.len(),
        t0.elapsed().as_secs_f64(),
    );
    let _ = survivors;
    assert!(
        failures.is_empty(),
        "{} of {count} trials failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn fault_injection_shm() {
    if child() {
        return;
    }
    let _s = serial();
    let seed = seed();
    println!("seed {seed} (TUTTI_FAULT_SEED)");
    campaign(
        &LocalStage {
            tcp: false,
            test: "fault_injection_shm",
        },
        &[3, 4],
        trials(),
        &mut Rng(seed),
        &[KillMode::Process],
    );
}

#[test]
fn fault_injection_tcp() {
    if child() {
        return;
    }
    let _s = serial();
    let seed = seed() ^ 0x7c9;
    println!("seed {seed} (TUTTI_FAULT_SEED ^ 0x7c9)");
    campaign(
        &LocalStage {
            tcp: true,
            test: "fault_injection_tcp",
        },
        &[3, 4],
        trials(),
        &mut Rng(seed),
        &[KillMode::Process],
    );
}

/// A launcher may reap a dead rank late (torchrun's agent polls its
/// children periodically): until then the rank is a zombie, and its process
/// id still exists. Survivors must detect the death all the same.
fn unreaped_victim(tcp: bool) {
    let _s = serial();
    let mut extra = vec![
        kv("FAULT_COLL", "AllReduce"),
        kv("FAULT_COUNT", 1000),
        kv("TUTTI_TIMEOUT", 60),
    ];
    if tcp {
        extra.push(kv("TUTTI_TRANSPORT", "tcp"));
    }
    let test = if tcp {
        "fault_detection_with_unreaped_victim_tcp"
    } else {
        "fault_detection_with_unreaped_victim_shm"
    };
    let mut g = local_group(test, "fault", 3, extra);
    let mut other = Vec::new();
    let ready = g.collect(
        &[0, 1, 2],
        &["READY"],
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    assert!(
        ready.iter().all(|r| r.is_some()),
        "not ready: {ready:?}; log:\n{}",
        g.log_tail()
    );
    // Kill rank 1 but keep it out of the reaper's reach for three seconds.
    let mut victim = g.kids[1].take().unwrap();
    let kill_at = now_ms();
    victim.kill().unwrap();
    let got = g.collect(
        &[0, 2],
        &["ERR", "NOERR"],
        Instant::now() + Duration::from_secs(3),
        &mut other,
    );
    let _ = victim.wait();
    let got = if got.iter().flatten().count() < 2 {
        // Reaped now: the survivors should notice at last.
        let late = g.collect(
            &[0, 2],
            &["ERR", "NOERR"],
            Instant::now() + Duration::from_secs(5),
            &mut other,
        );
        got.into_iter().zip(late).map(|(a, b)| a.or(b)).collect()
    } else {
        got
    };
    let mut report = Vec::new();
    for r in [0, 2] {
        let l = got[r]
            .clone()
            .unwrap_or_else(|| panic!("rank {r} silent; log:\n{}", g.log_tail()));
        let f: Vec<&str> = l.split_whitespace().collect();
        let dt = f[1]
            .parse::<u64>()
            .unwrap_or(u64::MAX)
            .saturating_sub(kill_at);
        report.push((r, f[2].to_string(), dt));
    }
    println!(
        "unreaped victim ({}): {report:?}",
        if tcp { "tcp" } else { "shm" }
    );
    for (r, k, dt) in report {
        assert!(
            k == "PeerLost" && dt <= DETECT_MS,
            "rank {r}: {k} after {dt} ms; a dead rank that is not yet reaped (a zombie) must count as dead"
        );
    }
}

#[test]
fn fault_detection_with_unreaped_victim_shm() {
    if child() {
        return;
    }
    unreaped_victim(false);
}

#[test]
fn fault_detection_with_unreaped_victim_tcp() {
    if child() {
        return;
    }
    unreaped_victim(true);
}

// ---------------------------------------------------------------------------
// Fault injection on a cluster of network namespaces (scripts/cluster.sh)
// ---------------------------------------------------------------------------

fn cluster_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster.sh")
}

fn run_quiet(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!("{cmd:?} failed: {text}"))
    }
}

/// Three "hosts" (network namespaces on a bridge). A trial of 3 ranks puts
/// one rank on each host (TCP only); a trial of 4 puts two ranks on each of
/// hosts 0 and 1 (shm within a host, TCP across).
struct ClusterStage {
    prefix: String,
    master: String,
}

impl ClusterStage {
    /// `Err` with the reason when this machine cannot make clusters.
    fn up() -> Result<ClusterStage, String> {
        let script = cluster_script();
        run_quiet(Command::new("bash").arg(&script).arg("check"))?;
        let _ = Command::new("bash").arg(&script).arg("gc").output();
        let prefix = format!("tf{}", std::process::id());
        let me = std::process::id().to_string();
        run_quiet(Command::new("bash").arg(&script).args([
            "up", "--hosts", "3", "--prefix", &prefix, "--owner", &me, "--quiet",
        ]))
        .map_err(|e| format!("cluster up: {e}"))?;
        let mut stage = ClusterStage {
            master: String::new(),
            prefix,
        };
        stage.master = run_quiet(Command::new("bash").arg(&script).args([
            "addr",
            "--prefix",
            &stage.prefix,
            "0",
        ]))?;
        Ok(stage)
    }
    fn host_of(&self, t: &Trial, r: usize) -> usize {
        if t.n == 3 {
            r
        } else {
            r / 2
        }
    }
    /// Sets (or with `None` clears) the least retransmission timeout of
    /// every host's route to the others, for the connections made after.
    fn rto_min(&self, ms: Option<u32>) {
        for h in 0..3 {
            let ns = format!("{}-h{h}", self.prefix);
            let route = run_quiet(Command::new("ip").args(["-n", &ns, "route", "show"]))
                .unwrap_or_else(|e| panic!("{e}"));
            let mut args: Vec<String> = ["-n", &ns, "route", "replace"].map(String::from).to_vec();
            let words: Vec<&str> = route
                .lines()
                .next()
                .expect("a route")
                .split_whitespace()
                .collect();
            // `ip route show` prints an rto_min set earlier as
            // "rto_min lock 1s": the route is the words before it.
            let end = words
                .iter()
                .position(|w| *w == "rto_min")
                .unwrap_or(words.len());
            args.extend(words[..end].iter().map(|w| w.to_string()));
            if let Some(ms) = ms {
                args.extend(["rto_min".into(), format!("{ms}ms")]);
            }
            run_quiet(Command::new("ip").args(&args)).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    fn link(&self, host: usize, state: &str) -> Result<String, String> {
        run_quiet(Command::new("ip").args([
            "-n",
            &format!("{}-br", self.prefix),
            "link",
            "set",
            &format!("h{host}"),
            state,
        ]))
    }
}

impl Drop for ClusterStage {
    fn drop(&mut self) {
        if self.prefix.is_empty() {
            return;
        }
        if let Err(e) = run_quiet(Command::new("bash").arg(cluster_script()).args([
            "down",
            "--prefix",
            &self.prefix,
        ])) {
            eprintln!("{e}");
        }
    }
}

impl Stage for ClusterStage {
    fn label(&self) -> String {
        "netns".into()
    }
    fn spawn(&self, t: &Trial, idx: usize, trace: &Path) -> Group {
        let e = RankEnv {
            test: "fault_injection_netns",
            role: "fault",
            n: t.n,
            master: self.master.clone(),
            port: 20_000 + (idx % 5000) as u16,
            token: token(),
            extra: vec![
                kv("FAULT_COLL", t.coll.name()),
                kv("FAULT_COUNT", t.count),
                kv("TUTTI_TIMEOUT", 60),
                kv("TUTTI_TRACE_DIR", trace.display()),
            ],
        };
        Group::spawn(
            (0..t.n)
                .map(|r| e.command(r, Some(&format!("{}-h{}", self.prefix, self.host_of(t, r)))))
                .collect(),
        )
    }
    fn kill(&self, g: &mut Group, t: &Trial) -> Vec<usize> {
        match t.mode {
            KillMode::Process => {
                g.kill(t.victim);
                vec![t.victim]
            }
            KillMode::HostCut => {
                // The host vanishes: its port on the switch goes down (no FIN,
                // no RST reaches anyone), then its processes die.
                let h = self.host_of(t, t.victim);
                if let Err(e) = self.link(h, "down") {
                    panic!("{e}");
                }
                let gone: Vec<usize> = (0..t.n).filter(|&r| self.host_of(t, r) == h).collect();
                for &r in &gone {
                    g.kill(r);
                }
                gone
            }
        }
    }
    fn restore(&self, t: &Trial) {
        if t.mode == KillMode::HostCut {
            if let Err(e) = self.link(self.host_of(t, t.victim), "up") {
                panic!("{e}");
            }
        }
    }
}

/// Fault injection across "hosts": kill a rank, or cut a host off the
/// network and kill its ranks (detection then rests on TCP keepalive and
/// TCP_USER_TIMEOUT). Skips (passes) where namespaces cannot be made,
/// unless TUTTI_MULTIHOST_REQUIRED=1.
#[test]
fn fault_injection_netns() {
    if child() {
        return;
    }
    let _s = serial();
    let stage = match ClusterStage::up() {
        Ok(s) => s,
        Err(why) => {
            let required = std::env::var("TUTTI_MULTIHOST_REQUIRED").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "TUTTI_MULTIHOST_REQUIRED=1 but no cluster: {why}"
            );
            println!("SKIP fault_injection_netns: {why}");
            return;
        }
    };
    let seed = seed() ^ 0x2e7;
    println!(
        "seed {seed} (TUTTI_FAULT_SEED ^ 0x2e7), master {}",
        stage.master
    );
    let mut rng = Rng(seed);
    campaign(
        &stage,
        &[3, 4],
        trials(),
        &mut rng,
        &[KillMode::Process, KillMode::HostCut],
    );
    // A loaded machine measures long round trips, and the kernel's
    // retransmission timeout grows with them (seen near 1 s in CI, where
    // two timeouts took 2.9 s). Detection must not wait for the second:
    // the hosts' routes now say 0.8 s at the least (two timeouts: 2.4 s).
    stage.rto_min(Some(800));
    campaign(&stage, &[3, 4], 6, &mut rng, &[KillMode::HostCut]);
    stage.rto_min(None);
}

// ---------------------------------------------------------------------------
// Abort
// ---------------------------------------------------------------------------

fn cfg(timeout_s: f64) -> Config {
    Config {
        timeout: Duration::from_secs_f64(timeout_s),
        ..Config::default()
    }
}

/// abort() from another thread unblocks a rank blocked in all_reduce at once;
/// its peers then fail fast too (threads of one process, `local` transport).
#[test]
fn abort_unblocks_threads() {
    let _s = serial();
    let comms = Communicator::init_all_with(3, cfg(20.0)).unwrap();
    let (abort_at, r0, r1) = std::thread::scope(|s| {
        fn blocked(c: &Communicator) -> (tutti::Result<()>, Instant) {
            let mut x = vec![1.0f32; 1000];
            let r = c.all_reduce(&mut x, ReduceOp::Sum);
            (r, Instant::now())
        }
        let h0 = s.spawn(|| blocked(&comms[0]));
        let h1 = s.spawn(|| blocked(&comms[1]));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !h0.is_finished() && !h1.is_finished(),
            "all_reduce finished without rank 2"
        );
        let at = Instant::now();
        comms[0].abort();
        (at, h0.join().unwrap(), h1.join().unwrap())
    });
    let d0 = r0.1.duration_since(abort_at);
    let d1 = r1.1.duration_since(abort_at);
    println!(
        "abort: rank 0 returned after {d0:?} with {:?}; rank 1 after {d1:?} with {:?}",
        r0.0, r1.0
    );
    assert!(matches!(r0.0, Err(Error::Aborted)), "rank 0: {:?}", r0.0);
    assert!(
        d0 < Duration::from_millis(200),
        "rank 0 took {d0:?} to see the abort"
    );
    assert!(
        matches!(comms[0].error(), Some(Error::Aborted)),
        "error(): {:?}",
        comms[0].error()
    );
    assert!(
        matches!(r1.0, Err(Error::PeerLost { peer: 0, .. })),
        "rank 1 should lose rank 0: {:?}",
        r1.0
    );
    assert!(d1 < Duration::from_millis(DETECT_MS), "rank 1 took {d1:?}");
    assert!(comms[1].error().is_some());
    // Rank 2 never took part: its next op fails fast too, and so does rank 0's.
    let t = Instant::now();
    let mut x = vec![1.0f32; 1000];
    let r2 = comms[2].all_reduce(&mut x, ReduceOp::Sum);
    assert!(matches!(r2, Err(Error::PeerLost { .. })), "rank 2: {r2:?}");
    assert!(
        t.elapsed() < Duration::from_millis(DETECT_MS),
        "rank 2 took {:?}",
        t.elapsed()
    );
    assert!(matches!(
        comms[0].all_reduce(&mut x, ReduceOp::Sum),
        Err(Error::Aborted)
    ));
}

/// abort() also fails asynchronous ops, queued or running, at once.
#[test]
fn abort_fails_queued_async_ops() {
    let _s = serial();
    let comms = Communicator::init_all_with(2, cfg(20.0)).unwrap();
    let w1 = comms[0].all_reduce_async(vec![1.0f32; 1000], ReduceOp::Sum);
    let w2 = comms[0].all_reduce_async(vec![1.0f32; 1000], ReduceOp::Sum);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!w1.is_done() && !w2.is_done());
    let t = Instant::now();
    comms[0].abort();
    for w in [&w1, &w2] {
        let r = w.wait_timeout(Duration::from_secs(3));
        assert!(matches!(r, Some(Err(Error::Aborted))), "{r:?}");
    }
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "async ops took {:?} to abort",
        t.elapsed()
    );
    let w3 = comms[0].all_reduce_async(vec![1.0f32; 10], ReduceOp::Sum);
    assert!(matches!(
        w3.wait_timeout(Duration::from_secs(3)),
        Some(Err(Error::Aborted))
    ));
}

/// Rank 0 blocks in all_reduce (rank 1 sleeps); a thread of rank 0 aborts.
fn abort_rank() {
    let comm = Communicator::from_env().unwrap();
    let mut x = vec![1.0f32; 4096];
    comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    if comm.rank() == 1 {
        std::thread::sleep(Duration::from_millis(1500));
        // Rank 0's contribution may already sit in a socket buffer: then this
        // op completes (with the right sum) and the next one must fail.
        let t = Instant::now();
        x.fill(1.0);
        let r = comm.all_reduce(&mut x, ReduceOp::Sum);
        let first = match &r {
            Ok(()) if x.iter().all(|&v| v == 2.0) => "Ok",
            Ok(()) => "WrongData",
            Err(e) => kind(e),
        };
        let second = if r.is_ok() {
            comm.all_reduce(&mut x, ReduceOp::Sum)
                .err()
                .map_or("Ok", |e| kind(&e))
        } else {
            "-"
        };
        println!("@@ R1 {first} {} {second}", t.elapsed().as_millis());
        return;
    }
    x.fill(1.0);
    let at = Mutex::new(None::<Instant>);
    let (r, done) = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            *at.lock().unwrap() = Some(Instant::now());
            comm.abort();
        });
        let r = comm.all_reduce(&mut x, ReduceOp::Sum);
        (r, Instant::now())
    });
    let at = at.lock().unwrap().expect("abort ran");
    let lat = done.saturating_duration_since(at).as_millis();
    let asyn = comm.error().map_or("None", |e| kind(&e));
    println!("@@ R0 {} {lat} {asyn}", r.as_ref().err().map_or("Ok", kind));
}

/// Rank 0 aborts while no op runs, fails its next op, and stays alive (its
/// communicator too) for 6 s; rank 1's op must fail with `PeerLost` well
/// before that, not wait for rank 0's exit or its own timeout.
fn abort_idle_rank() {
    let comm = Communicator::from_env().unwrap();
    let mut x = vec![1.0f32; 4096];
    comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    if comm.rank() == 0 {
        comm.abort();
        let r = comm.all_reduce(&mut x, ReduceOp::Sum);
        println!("@@ R0 {}", r.err().map_or("Ok", |e| kind(&e)));
        std::thread::sleep(Duration::from_secs(6));
        return;
    }
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let r = comm.all_reduce(&mut x, ReduceOp::Sum);
    println!(
        "@@ R1 {} {}",
        r.err().map_or("Ok", |e| kind(&e)),
        t.elapsed().as_millis()
    );
}

/// Two ranks of `test` playing `role`: starts them and returns the group
/// and the reports ("R0 ...", "R1 ...") both printed, within 30 s.
fn two_reports(test: &str, role: &str, extra: Vec<(String, String)>) -> (Group, String, String) {
    let mut g = local_group(test, role, 2, extra);
    let mut other = Vec::new();
    let got = g.collect(
        &[0, 1],
        &["R0", "R1"],
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    println!("{test}: {got:?}");
    let report = |r: usize| {
        got[r]
            .clone()
            .unwrap_or_else(|| panic!("rank {r} did not report; log:\n{}", g.log_tail()))
    };
    let (r0, r1) = (report(0), report(1));
    (g, r0, r1)
}

/// An abort while idle reaches TCP peers (`abort_idle_rank`).
#[test]
fn abort_idle_reaches_tcp_peers() {
    if child() {
        return;
    }
    let _s = serial();
    let extra = vec![kv("TUTTI_TIMEOUT", 20), kv("TUTTI_TRANSPORT", "tcp")];
    let (mut g, r0, r1) = two_reports("abort_idle_reaches_tcp_peers", "abort_idle", extra);
    assert_eq!(
        r0.split_whitespace().nth(1),
        Some("Aborted"),
        "rank 0: {r0}"
    );
    let f1: Vec<&str> = r1.split_whitespace().collect();
    assert_eq!(f1[1], "PeerLost", "rank 1: {r1}");
    assert!(
        f1[2].parse::<u64>().unwrap() < DETECT_MS,
        "rank 1 took {} ms",
        f1[2]
    );
    assert!(
        g.wait_exit(&[0, 1], Instant::now() + Duration::from_secs(15))
            .is_empty(),
        "ranks did not exit"
    );
}

fn abort_processes(tcp: bool) {
    let _s = serial();
    let mut extra = vec![kv("TUTTI_TIMEOUT", 20)];
    if tcp {
        extra.push(kv("TUTTI_TRANSPORT", "tcp"));
    }
    let test = if tcp {
        "abort_unblocks_processes_tcp"
    } else {
        "abort_unblocks_processes_shm"
    };
    let (mut g, r0, r1) = two_reports(test, "abort", extra);
    let f0: Vec<&str> = r0.split_whitespace().collect();
    assert_eq!(f0[1], "Aborted", "rank 0: {r0}");
    assert!(
        f0[2].parse::<u64>().unwrap() < 200,
        "rank 0 took {} ms to see the abort",
        f0[2]
    );
    assert_eq!(f0[3], "Aborted", "rank 0's error(): {r0}");
    let f1: Vec<&str> = r1.split_whitespace().collect();
    assert!(
        f1[1] == "PeerLost" || (f1[1] == "Ok" && f1[3] == "PeerLost"),
        "rank 1 (its peer aborted) must fail, at the latest on the op after one that rank 0's data completed: {r1}"
    );
    assert!(
        f1[2].parse::<u64>().unwrap() < DETECT_MS,
        "rank 1 took {} ms",
        f1[2]
    );
    assert!(
        g.wait_exit(&[0, 1], Instant::now() + Duration::from_secs(5))
            .is_empty(),
        "ranks did not exit"
    );
}

#[test]
fn abort_unblocks_processes_shm() {
    if child() {
        return;
    }
    abort_processes(false);
}

#[test]
fn abort_unblocks_processes_tcp() {
    if child() {
        return;
    }
    abort_processes(true);
}

// ---------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------

/// A per-call timeout (Options::timeout) beats the communicator's.
#[test]
fn per_call_timeout_threads() {
    let _s = serial();
    let comms = Communicator::init_all_with(2, cfg(60.0)).unwrap();
    let mut x = vec![1.0f32; 100];
    let opts = Options {
        timeout: Some(Duration::from_millis(300)),
        ..Options::default()
    };
    let t = Instant::now();
    let r = comms[0].all_reduce_with(&mut x, ReduceOp::Sum, &opts);
    let took = t.elapsed();
    println!("per-call timeout: {took:?}: {r:?}");
    match &r {
        Err(Error::Timeout {
            op,
            seq,
            rank,
            waiting_for,
            after,
        }) => {
            assert_eq!(op, "all_reduce");
            assert_eq!(*seq, 0);
            assert_eq!(*rank, 0);
            assert_eq!(waiting_for, &vec![1]);
            assert_eq!(*after, Duration::from_millis(300));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(900),
        "{took:?}"
    );
    assert!(matches!(comms[0].error(), Some(Error::Timeout { .. })));
    // The communicator is poisoned: later ops fail with the same error at once.
    let t = Instant::now();
    assert!(matches!(
        comms[0].all_reduce(&mut x, ReduceOp::Sum),
        Err(Error::Timeout { seq: 0, .. })
    ));
    assert!(t.elapsed() < Duration::from_millis(50));
    // The partner hears of it instead of waiting for its own (60 s) deadline.
    // Rank 0's contribution may already be in the ring: then rank 1's op
    // completes with the right sum, and its next one fails.
    let t = Instant::now();
    let mut y = vec![1.0f32; 100];
    let mut r1 = comms[1].all_reduce(&mut y, ReduceOp::Sum);
    if r1.is_ok() {
        assert!(
            y.iter().all(|&v| v == 2.0),
            "rank 1 completed with wrong data: {:?}",
            &y[..4]
        );
        r1 = comms[1].all_reduce(&mut y, ReduceOp::Sum);
    }
    assert!(matches!(r1, Err(Error::PeerLost { peer: 0, .. })), "{r1:?}");
    assert!(
        t.elapsed() < Duration::from_millis(DETECT_MS),
        "{:?}",
        t.elapsed()
    );
}

/// Ranks run three good all_reduces; then the last rank sleeps before the
/// fourth (seq 3). TIMEOUT_MODE=env: TUTTI_TIMEOUT=1; call: a per-call
/// timeout of 400 ms with TUTTI_TIMEOUT=60.
fn timeout_rank() {
    let comm = Communicator::from_env().unwrap();
    let (r, n) = (comm.rank(), comm.size());
    let per_call = env_or("TIMEOUT_MODE", "env") == "call";
    let mut x = vec![1.0f32; 4096];
    for _ in 0..3 {
        comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    }
    println!("@@ READY");
    if r == n - 1 {
        let ms: u64 = env_or("SLEEP_MS", "2500").parse().unwrap();
        std::thread::sleep(Duration::from_millis(ms));
    }
    let opts = Options {
        timeout: per_call.then(|| Duration::from_millis(400)),
        ..Options::default()
    };
    // Set-up may run ops of its own (calibration): the op's number is this.
    let want_seq = comm.ops_done();
    let t = Instant::now();
    let mut res = comm.all_reduce_with(&mut x, ReduceOp::Sum, &opts);
    if res.is_ok() {
        // The peer's data was already in flight when it failed (TCP): the
        // next op is the one that must fail.
        res = comm.all_reduce(&mut x, ReduceOp::Sum);
    }
    let el = t.elapsed().as_millis();
    match res {
        Err(Error::Timeout {
            op,
            seq,
            waiting_for,
            after,
            ..
        }) => println!(
            "@@ ERR Timeout {el} {op} {} {waiting_for:?} {}",
            if seq == want_seq {
                "seq-ok".to_string()
            } else {
                format!("seq={seq}-want={want_seq}")
            },
            after.as_millis()
        ),
        Err(e) => println!("@@ ERR {} {el} {}", kind(&e), one_line(&e.to_string())),
        Ok(()) => println!("@@ ERR Ok {el}"),
    }
    println!("@@ SEQ {want_seq}");
}

fn timeout_processes(
    test: &str,
    n: usize,
    mode: &str,
    tcp: bool,
    trace: Option<&Path>,
) -> (Group, Vec<Option<String>>, Vec<(usize, String)>) {
    let mut extra = vec![
        kv("TIMEOUT_MODE", mode),
        kv("TUTTI_TIMEOUT", if mode == "env" { 1 } else { 60 }),
    ];
    if tcp {
        extra.push(kv("TUTTI_TRANSPORT", "tcp"));
    }
    if let Some(d) = trace {
        extra.push(kv("TUTTI_TRACE_DIR", d.display()));
        extra.push(kv("SLEEP_MS", 30_000));
    }
    let mut g = local_group(test, "timeout", n, extra);
    let all: Vec<usize> = (0..n).collect();
    let mut other = Vec::new();
    let ready = g.collect(
        &all,
        &["READY"],
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    assert!(
        ready.iter().all(|r| r.is_some()),
        "not ready: {ready:?}; log:\n{}",
        g.log_tail()
    );
    let want: Vec<usize> = if trace.is_some() {
        (0..n - 1).collect()
    } else {
        all
    };
    let got = g.collect(
        &want,
        &["ERR"],
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    // Each rank prints its SEQ line right after its ERR line.
    let seqs = g.collect(
        &want,
        &["SEQ"],
        Instant::now() + Duration::from_secs(5),
        &mut other,
    );
    other.extend(
        seqs.into_iter()
            .enumerate()
            .filter_map(|(r, l)| Some((r, l?))),
    );
    (g, got, other)
}

/// Two ranks, rank 1 sleeps: rank 0 times out naming all_reduce, seq 3 and
/// rank 1; rank 1, once awake, fails fast with PeerLost.
fn timeout_two_ranks(test: &str, mode: &str, tcp: bool) {
    let _s = serial();
    let (g, got, _) = timeout_processes(test, 2, mode, tcp, None);
    println!("timeout mode={mode} tcp={tcp}: {got:?}");
    let r0 = got[0]
        .clone()
        .unwrap_or_else(|| panic!("rank 0 silent; log:\n{}", g.log_tail()));
    let f: Vec<&str> = r0.split_whitespace().collect();
    assert_eq!(f[1], "Timeout", "rank 0: {r0}");
    let el: u64 = f[2].parse().unwrap();
    let want_ms = if mode == "env" { 1000 } else { 400 };
    assert!(
        el >= want_ms && el < want_ms + 600,
        "rank 0 timed out after {el} ms, deadline {want_ms} ms"
    );
    assert_eq!(f[3], "all_reduce");
    assert_eq!(f[4], "seq-ok", "seq");
    assert_eq!(f[5], "[1]", "waiting_for");
    assert_eq!(f[6], want_ms.to_string(), "after");
    let r1 = got[1]
        .clone()
        .unwrap_or_else(|| panic!("rank 1 silent; log:\n{}", g.log_tail()));
    let f: Vec<&str> = r1.split_whitespace().collect();
    assert_eq!(
        f[1], "PeerLost",
        "rank 1 (awake after its peer timed out): {r1}"
    );
    assert!(f[2].parse::<u64>().unwrap() < DETECT_MS, "rank 1: {r1}");
}

#[test]
fn timeout_env_names_op_seq_and_rank_shm() {
    if child() {
        return;
    }
    timeout_two_ranks("timeout_env_names_op_seq_and_rank_shm", "env", false);
}

#[test]
fn timeout_env_names_op_seq_and_rank_tcp() {
    if child() {
        return;
    }
    timeout_two_ranks("timeout_env_names_op_seq_and_rank_tcp", "env", true);
}

#[test]
fn timeout_per_call_processes() {
    if child() {
        return;
    }
    timeout_two_ranks("timeout_per_call_processes", "call", false);
}

/// Three ranks, rank 2 hangs (sleeps 30 s) before op #3: the others time out
/// (or hear that the first one did), each writes its flight recorder, and
/// `tutti::trace::analyze` names rank 2 as the one that left no trace.
#[test]
fn timeout_flight_recorder_names_hung_rank() {
    if child() {
        return;
    }
    let _s = serial();
    let dir = temp_dir("recorder");
    let (mut g, got, lines) = timeout_processes(
        "timeout_flight_recorder_names_hung_rank",
        3,
        "env",
        false,
        Some(&dir),
    );
    println!("timeout, 3 ranks: {got:?}");
    let mut timeouts = 0;
    for (r, l) in got.iter().enumerate().take(2) {
        let l = l
            .clone()
            .unwrap_or_else(|| panic!("rank {r} silent; log:\n{}", g.log_tail()));
        let f: Vec<&str> = l.split_whitespace().collect();
        let el: u64 = f[2].parse().unwrap();
        match f[1] {
            "Timeout" => {
                timeouts += 1;
                assert_eq!(f[3], "all_reduce");
                assert_eq!(f[4], "seq-ok");
                assert!(f[5] != "[]", "waiting_for is empty: {l}");
                assert!((1000..1600).contains(&el), "rank {r}: {l}");
            }
            "PeerLost" => assert!(el < 1000 + DETECT_MS, "rank {r}: {l}"),
            _ => panic!("rank {r}: {l}"),
        }
    }
    assert!(timeouts >= 1, "nobody reported the timeout itself: {got:?}");
    // An operator kills the hung rank; the traces point at it.
    g.kill(2);
    let a = tutti::trace::analyze(&dir).unwrap();
    println!("{}", a.summary);
    assert_eq!(a.missing, vec![2], "{}", a.summary);
    assert!(a.summary.contains("[2]"), "{}", a.summary);
    for t in &a.traces {
        let last = t.ops.last().unwrap();
        let want = lines
            .iter()
            .find(|(r, l)| *r == t.rank && l.starts_with("SEQ"))
            .and_then(|(_, l)| l.split_whitespace().nth(1))
            .unwrap_or_else(|| panic!("no SEQ line from rank {}: {lines:?}", t.rank));
        assert_eq!(last.seq.to_string(), want, "rank {}: {last:?}", t.rank);
        assert!(
            matches!(last.state, tutti::trace::OpState::Failed(_)),
            "{last:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// Mismatched collectives
// ---------------------------------------------------------------------------

/// One rank's call in a mismatch case.
#[derive(Clone, Copy, Debug)]
enum Call {
    AllReduceF32 { count: usize, op: ReduceOp },
    AllReduceI32 { count: usize },
    AllReduceF64 { count: usize },
    Broadcast { count: usize, root: usize },
    Reduce { count: usize, root: usize },
    AllGather { count: usize },
    ReduceScatter { count: usize },
    AllToAll { count: usize },
    Gather { count: usize, root: usize },
    Scatter { count: usize, root: usize },
    Barrier,
}

const C: usize = 999;

/// The mismatch cases: rank 1 does something else than the others.
const CASES: [&str; 16] = [
    "kind_broadcast",
    "kind_reduce",
    "kind_all_gather",
    "kind_reduce_scatter",
    "kind_all_to_all",
    "kind_gather",
    "kind_scatter",
    "kind_barrier",
    "count_all_reduce",
    "count_broadcast",
    "count_all_gather",
    "dtype_f32_i32",
    "dtype_f32_f64_same_bytes",
    "op_sum_max",
    "op_sum_avg",
    "root_broadcast",
];

fn case_call(case: &str, rank: usize) -> Call {
    let sum = Call::AllReduceF32 {
        count: C,
        op: ReduceOp::Sum,
    };
    let odd = rank == 1;
    if !odd {
        return match case {
            "count_broadcast" | "root_broadcast" => Call::Broadcast { count: C, root: 0 },
            "count_all_gather" => Call::AllGather { count: C },
            _ => sum,
        };
    }
    match case {
        "kind_broadcast" => Call::Broadcast { count: C, root: 0 },
        "kind_reduce" => Call::Reduce { count: C, root: 0 },
        "kind_all_gather" => Call::AllGather { count: C / 3 },
        "kind_reduce_scatter" => Call::ReduceScatter { count: C / 3 },
        "kind_all_to_all" => Call::AllToAll { count: C / 3 },
        "kind_gather" => Call::Gather {
            count: C / 3,
            root: 0,
        },
        "kind_scatter" => Call::Scatter {
            count: C / 3,
            root: 0,
        },
        "kind_barrier" => Call::Barrier,
        "count_all_reduce" => Call::AllReduceF32 {
            count: C + 1,
            op: ReduceOp::Sum,
        },
        "count_broadcast" => Call::Broadcast {
            count: C + 1,
            root: 0,
        },
        "count_all_gather" => Call::AllGather { count: C + 1 },
        "dtype_f32_i32" => Call::AllReduceI32 { count: C },
        "dtype_f32_f64_same_bytes" => Call::AllReduceF64 { count: C / 2 },
        "op_sum_max" => Call::AllReduceF32 {
            count: C,
            op: ReduceOp::Max,
        },
        "op_sum_avg" => Call::AllReduceF32 {
            count: C,
            op: ReduceOp::Avg,
        },
        "root_broadcast" => Call::Broadcast { count: C, root: 1 },
        other => panic!("unknown case {other}"),
    }
}

/// Runs `call`; `Ok(true)` if the result is what this call means when every
/// rank makes the same call.
fn run_call(c: &Communicator, call: Call) -> tutti::Result<bool> {
    let (r, n) = (c.rank(), c.size());
    let v = (r + 1) as f32;
    let tri = (n * (n + 1) / 2) as f32;
    Ok(match call {
        Call::AllReduceF32 { count, op } => {
            let mut x = vec![v; count];
            c.all_reduce(&mut x, op)?;
            let want = match op {
                ReduceOp::Sum => tri,
                ReduceOp::Max => n as f32,
                ReduceOp::Avg => tri / n as f32,
                _ => unreachable!(),
            };
            x.iter().all(|&y| y == want)
        }
        Call::AllReduceI32 { count } => {
            let mut x = vec![(r + 1) as i32; count];
            c.all_reduce(&mut x, ReduceOp::Sum)?;
            x.iter().all(|&y| y == tri as i32)
        }
        Call::AllReduceF64 { count } => {
            let mut x = vec![(r + 1) as f64; count];
            c.all_reduce(&mut x, ReduceOp::Sum)?;
            x.iter().all(|&y| y == tri as f64)
        }
        Call::Broadcast { count, root } => {
            let mut x = vec![if r == root { 100.0 + root as f32 } else { 0.0 }; count];
            c.broadcast(&mut x, root)?;
            x.iter().all(|&y| y == 100.0 + root as f32)
        }
        Call::Reduce { count, root } => {
            let mut out = vec![0.0f32; if r == root { count } else { 0 }];
            c.reduce(&vec![v; count], &mut out, ReduceOp::Sum, root)?;
            out.iter().all(|&y| y == tri)
        }
        Call::AllGather { count } => {
            let mut out = vec![0.0f32; n * count];
            c.all_gather(&vec![v; count], &mut out)?;
            out.iter()
                .enumerate()
                .all(|(i, &y)| y == (i / count + 1) as f32)
        }
        Call::ReduceScatter { count } => {
            let mut out = vec![0.0f32; count];
            c.reduce_scatter(&vec![v; n * count], &mut out, ReduceOp::Sum)?;
            out.iter().all(|&y| y == tri)
        }
        Call::AllToAll { count } => {
            let send: Vec<f32> = (0..n * count).map(|i| (r * n + i / count) as f32).collect();
            let mut out = vec![0.0f32; n * count];
            c.all_to_all(&send, &mut out)?;
            out.iter()
                .enumerate()
                .all(|(i, &y)| y == ((i / count) * n + r) as f32)
        }
        Call::Gather { count, root } => {
            let mut out = vec![0.0f32; if r == root { n * count } else { 0 }];
            c.gather(&vec![v; count], &mut out, root)?;
            out.iter()
                .enumerate()
                .all(|(i, &y)| y == (i / count + 1) as f32)
        }
        Call::Scatter { count, root } => {
            let send: Vec<f32> = if r == root {
                (0..n * count).map(|i| (i / count + 1) as f32).collect()
            } else {
                Vec::new()
            };
            let mut out = vec![0.0f32; count];
            c.scatter(&send, &mut out, root)?;
            out.iter().all(|&y| y == v)
        }
        Call::Barrier => {
            c.barrier()?;
            true
        }
    })
}

/// What one rank saw in a mismatch case: the mismatched call, then a
/// follow-up all_reduce (which must fail too if the first went unnoticed).
#[derive(Clone, Debug)]
struct Seen {
    first: String,
    first_data_ok: bool,
    second: String,
    mismatch_msg: Option<String>,
}

fn mismatch_on(c: &Communicator, case: &str) -> Seen {
    let t = Instant::now();
    let first = run_call(c, case_call(case, c.rank()));
    let el1 = t.elapsed().as_millis();
    let t = Instant::now();
    let second = run_call(
        c,
        Call::AllReduceF32 {
            count: 4,
            op: ReduceOp::Sum,
        },
    );
    let el2 = t.elapsed().as_millis();
    let show = |r: &tutti::Result<bool>, el: u128| match r {
        Ok(_) => format!("Ok({el}ms)"),
        Err(e) => format!("{}({el}ms)", kind(e)),
    };
    Seen {
        first: show(&first, el1),
        first_data_ok: first.as_ref().map_or(true, |ok| *ok),
        second: show(&second, el2),
        mismatch_msg: match &first {
            Err(e @ Error::Mismatch { .. }) => Some(e.to_string()),
            _ => None,
        },
    }
}

fn mismatch_rank() {
    let comm = Communicator::from_env().unwrap();
    let case = env_or("CASE", "");
    let s = mismatch_on(&comm, &case);
    println!(
        "@@ SEEN {} {} {} {}",
        s.first,
        s.first_data_ok,
        s.second,
        s.mismatch_msg.map_or("-".into(), |m| one_line(&m))
    );
}

/// Judges one case: every rank must fail (on the call or the next one), at
/// least one with Mismatch on the call itself, none with a timeout (a
/// mismatch noticed only by the deadline), and no call may return wrong data.
fn judge(case: &str, transport: &str, seen: &[Seen]) -> Result<(), String> {
    let line: Vec<String> = seen
        .iter()
        .enumerate()
        .map(|(r, s)| format!("r{r}: {} then {}", s.first, s.second))
        .collect();
    println!("MISMATCH [{transport}] {case:26} {}", line.join(" | "));
    let mut why = Vec::new();
    // A different root is the one mismatch no message of the call itself can
    // reveal (each rank only hears from the root it believes in); it must be
    // reported by the next call instead, with no wrong data in between.
    let late_ok = case == "root_broadcast";
    if late_ok {
        if !seen
            .iter()
            .any(|s| s.first.starts_with("Mismatch") || s.second.starts_with("Mismatch"))
        {
            why.push("no rank reported Mismatch on the mismatched call or the next".to_string());
        }
    } else if !seen.iter().any(|s| s.first.starts_with("Mismatch")) {
        why.push("no rank reported Mismatch on the mismatched call".to_string());
    }
    for (r, s) in seen.iter().enumerate() {
        if s.first.starts_with("Ok") && !s.first_data_ok {
            why.push(format!(
                "rank {r}: the mismatched call returned Ok with wrong data"
            ));
        }
        if s.first.starts_with("Ok") && s.second.starts_with("Ok") {
            why.push(format!("rank {r}: never noticed (both calls returned Ok)"));
        }
        for x in [&s.first, &s.second] {
            if x.starts_with("Timeout") || x.starts_with("Other") {
                why.push(format!("rank {r}: {x} (not detected as a mismatch)"));
            }
        }
        if let Some(m) = &s.mismatch_msg {
            if !m.contains("rank") || !m.contains("seq") {
                why.push(format!(
                    "rank {r}: the message does not name both sides: {m}"
                ));
            }
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "[{transport}] {case}: {}\n    {}",
            why.join("; "),
            line.join("\n    ")
        ))
    }
}

fn mismatch_threads(case: &str) -> Vec<Seen> {
    let comms = Communicator::init_all_with(3, cfg(3.0)).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || mismatch_on(c, case)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn mismatch_processes(test: &str, case: &str, tcp: bool) -> Vec<Seen> {
    let mut extra = vec![kv("CASE", case), kv("TUTTI_TIMEOUT", 3)];
    if tcp {
        extra.push(kv("TUTTI_TRANSPORT", "tcp"));
    }
    let mut g = local_group(test, "mismatch", 3, extra);
    let mut other = Vec::new();
    let got = g.collect(
        &[0, 1, 2],
        &["SEEN"],
        Instant::now() + Duration::from_secs(30),
        &mut other,
    );
    // Every rank exits cleanly afterwards (no panic or hang when the failed
    // communicator is dropped).
    let hung = g.wait_exit(&[0, 1, 2], Instant::now() + Duration::from_secs(10));
    assert!(
        hung.is_empty(),
        "{case}: ranks {hung:?} did not exit; log:\n{}",
        g.log_tail()
    );
    for (r, st) in g.status.iter().enumerate() {
        assert!(
            st.is_some_and(|s| s.success()),
            "{case}: rank {r} exited with {st:?}; log:\n{}",
            g.log_tail()
        );
    }
    got.iter()
        .enumerate()
        .map(|(r, l)| {
            let l = l.clone().unwrap_or_else(|| {
                panic!("{case}: rank {r} silent (hang?); log:\n{}", g.log_tail())
            });
            let f: Vec<&str> = l.splitn(5, ' ').collect();
            Seen {
                first: f[1].into(),
                first_data_ok: f[2] == "true",
                second: f[3].into(),
                mismatch_msg: (f[4] != "-").then(|| f[4].to_string()),
            }
        })
        .collect()
}

/// Runs one mismatch case over threads (`local`), shm and tcp.
fn mismatch_case(test: &str, case: &str) {
    let _s = serial();
    let mut failures = Vec::new();
    for (transport, seen) in [
        ("local", mismatch_threads(case)),
        ("shm", mismatch_processes(test, case, false)),
        ("tcp", mismatch_processes(test, case, true)),
    ] {
        if let Err(e) = judge(case, transport, &seen) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! mismatch_tests {
    ($($name:ident => $case:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if child() {
                    return;
                }
                mismatch_case(stringify!($name), $case);
            }
        )*
        /// Every case has a test.
        #[test]
        fn mismatch_cases_all_tested() {
            let tested = [$($case),*];
            for c in CASES {
                assert!(tested.contains(&c), "case {c} has no test");
            }
        }
    };
}

mismatch_tests! {
    mismatch_kind_broadcast => "kind_broadcast",
    mismatch_kind_reduce => "kind_reduce",
    mismatch_kind_all_gather => "kind_all_gather",
    mismatch_kind_reduce_scatter => "kind_reduce_scatter",
    mismatch_kind_all_to_all => "kind_all_to_all",
    mismatch_kind_gather => "kind_gather",
    mismatch_kind_scatter => "kind_scatter",
    mismatch_kind_barrier => "kind_barrier",
    mismatch_count_all_reduce => "count_all_reduce",
    mismatch_count_broadcast => "count_broadcast",
    mismatch_count_all_gather => "count_all_gather",
    mismatch_dtype_f32_i32 => "dtype_f32_i32",
    mismatch_dtype_f32_f64_same_bytes => "dtype_f32_f64_same_bytes",
    mismatch_op_sum_max => "op_sum_max",
    mismatch_op_sum_avg => "op_sum_avg",
    mismatch_root_broadcast => "root_broadcast",
}

// ---------------------------------------------------------------------------
// Shrink and continue
// ---------------------------------------------------------------------------

/// A training loop of 12 steps (an f64 all_reduce of `world_rank + 1`,
/// checked against the ranks still alive). The victim kills itself
/// (SIGKILL) at step 6; the survivors find the dead, shrink and redo the step.
fn shrink_rank() {
    let mut comm = Communicator::from_env().unwrap();
    let me = comm.rank();
    let victim: usize = env_or("VICTIM", "2").parse().unwrap();
    let healthy = env_or("SHRINK_API", "list") == "healthy";
    let mut alive: Vec<usize> = (0..comm.size()).collect();
    let mut step = 0;
    let mut shrinks = 0;
    while step < 12 {
        if step == 6 && me == victim {
            println!("@@ DYING");
            die_now();
        }
        let mut grad = vec![(me + 1) as f64; 10_000 + step];
        match comm.all_reduce(&mut grad, ReduceOp::Sum) {
            Ok(()) => {
                let want: f64 = alive.iter().map(|&r| (r + 1) as f64).sum();
                if let Some(bad) = grad.iter().find(|&&g| g != want) {
                    println!("@@ FAIL step {step}: got {bad}, want {want}");
                    return;
                }
                step += 1;
            }
            Err(e @ (Error::PeerLost { .. } | Error::Timeout { .. })) => {
                if shrinks > 0 {
                    println!("@@ FAIL second failure: {}", one_line(&e.to_string()));
                    return;
                }
                shrinks += 1;
                std::thread::sleep(Duration::from_millis(300));
                let dead = comm.dead_ranks();
                println!("@@ DEAD {dead:?} after {}", kind(&e));
                let new = if healthy {
                    comm.shrink_to_healthy()
                } else {
                    comm.shrink(&dead)
                };
                let new = match new {
                    Ok(c) => c,
                    Err(e) => {
                        println!("@@ FAIL shrink: {}", one_line(&e.to_string()));
                        return;
                    }
                };
                alive = alive
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !dead.contains(i))
                    .map(|(_, &r)| r)
                    .collect();
                comm = new;
            }
            Err(e) => {
                println!("@@ FAIL step {step}: {}", one_line(&e.to_string()));
                return;
            }
        }
    }
    // The new communicator is whole: gather who is in it.
    let mut who = vec![0u64; comm.size()];
    if let Err(e) = comm.all_gather(&[me as u64], &mut who) {
        println!("@@ FAIL all_gather: {e}");
        return;
    }
    let alive64: Vec<u64> = alive.iter().map(|&r| r as u64).collect();
    if who != alive64 {
        println!("@@ FAIL members {who:?}, expected {alive64:?}");
        return;
    }
    println!("@@ DONE {} {} {shrinks}", comm.rank(), comm.size());
}

fn shrink_case(victim: usize, tcp: bool, api: &str) {
    let mut extra = vec![
        kv("VICTIM", victim),
        kv("SHRINK_API", api),
        kv("TUTTI_TIMEOUT", 20),
    ];
    if tcp {
        extra.push(kv("TUTTI_TRANSPORT", "tcp"));
    }
    let n = 4;
    let t = Instant::now();
    let mut g = local_group("shrink_and_continue", "shrink", n, extra);
    let survivors: Vec<usize> = (0..n).filter(|&r| r != victim).collect();
    let mut other = Vec::new();
    let got = g.collect(
        &survivors,
        &["DONE", "FAIL"],
        Instant::now() + Duration::from_secs(60),
        &mut other,
    );
    let label = format!(
        "victim {victim}, {}, {api}",
        if tcp { "tcp" } else { "shm" }
    );
    println!(
        "shrink ({label}) in {:.2} s: {got:?} {other:?}",
        t.elapsed().as_secs_f64()
    );
    for &r in &survivors {
        let l = got[r]
            .clone()
            .unwrap_or_else(|| panic!("shrink ({label}): rank {r} silent; log:\n{}", g.log_tail()));
        assert!(
            l.starts_with("DONE"),
            "shrink ({label}): rank {r}: {l}; log:\n{}",
            g.log_tail()
        );
        let f: Vec<&str> = l.split_whitespace().collect();
        let new_rank = survivors.iter().position(|&s| s == r).unwrap();
        assert_eq!(f[1], new_rank.to_string(), "rank {r}'s new rank");
        assert_eq!(f[2], (n - 1).to_string());
        assert_eq!(f[3], "1", "number of shrinks");
    }
    for (r, l) in &other {
        if let Some(d) = l.strip_prefix("DEAD ") {
            assert!(
                d.starts_with(&format!("[{victim}]")),
                "rank {r} found dead: {d}"
            );
        }
    }
}

#[test]
fn shrink_and_continue() {
    if child() {
        return;
    }
    let _s = serial();
    for (victim, tcp, api) in [
        (2, false, "list"),
        (0, false, "healthy"),
        (0, true, "list"),
        (3, true, "healthy"),
    ] {
        shrink_case(victim, tcp, api);
    }
}

// ---------------------------------------------------------------------------
// What the always-on mismatch check costs (run by hand: --ignored)
// ---------------------------------------------------------------------------

/// Every message carries a 16-byte header (collective number, tag, message
/// number, length) that the receiver compares with what it expects; there
/// is no switch to turn it off. This prints, for a 4-rank AllReduce of 8 B
/// and of 64 MiB (threads, `local` transport), the time per op, the
/// messages each rank sends (from the schedule the tuner picks) and the
/// header bytes as a share of the payload; and the time of a 24 B AllReduce
/// next to the 8 B one, which bounds what 16 more bytes per message cost. Run:
/// `cargo test -p tutti --test faults -- --ignored mismatch_header_cost --nocapture`
#[test]
#[ignore]
fn mismatch_header_cost() {
    use tutti::algo::{Problem, Step};
    use tutti::{Collective, DataType};
    let n = 4;
    let comms = Communicator::init_all_with(n, cfg(60.0)).unwrap();
    // 24 B: what 16 more bytes per message (a header's worth) cost at 8 B.
    for (label, count, iters) in [
        ("8 B", 2usize, 5000usize),
        ("24 B", 6, 5000),
        ("8 B", 2, 5000),
        ("64 MiB", 16 << 20, 6),
    ] {
        let plan = comms[0]
            .plan(Collective::AllReduce, count, DataType::F32)
            .unwrap();
        let mut p = Problem::new(Collective::AllReduce, n, 0, count);
        p.chunks = plan.chunks;
        let sched = plan.algorithm.build(&p).unwrap();
        let sends: Vec<usize> = sched
            .steps
            .iter()
            .filter(|s| s.send_peer().is_some())
            .map(|s| match *s {
                Step::Send { len, .. }
                | Step::RecvReduceSend { len, .. }
                | Step::RecvCopySend { len, .. } => len * 4,
                _ => 0,
            })
            .collect();
        let payload: usize = sends.iter().sum();
        let times: Vec<Vec<Duration>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut x = vec![1.0f32; count];
                        c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                        (0..iters)
                            .map(|_| {
                                let t = Instant::now();
                                c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                                t.elapsed()
                            })
                            .collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut t0: Vec<u64> = times[0].iter().map(|d| d.as_nanos() as u64).collect();
        let med = median(&mut t0);
        println!(
            "AllReduce {label} x {n} ranks ({:?}): median {:.1} us/op; rank 0 sends {} messages, {payload} payload bytes, {} header bytes ({:.4}% of payload)",
            plan.algorithm,
            med as f64 / 1000.0,
            sends.len(),
            16 * sends.len(),
            100.0 * (16 * sends.len()) as f64 / payload.max(1) as f64
        );
    }
}
