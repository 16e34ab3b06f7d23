//! Test harness shared by the integration tests.
//!
//! * [`procs`]: runs a test body as `n` real processes. The parent re-runs
//!   the current test executable once per rank (`--exact NAME --nocapture`)
//!   with the `TUTTI_*` launcher variables set and [`ROLE_VAR`] naming the
//!   test, waits for every child to exit 0 within a hard timeout, and kills
//!   them all otherwise (printing each rank's log).
//! * [`threads`]: runs the same body as `n` threads of this process over the
//!   `local` transport (`Communicator::init_all`); `rank_test!` runs those
//!   threads in a child process, so that a crash or a hang fails one test
//!   under the hard timeout instead of taking the test binary down.
//! * [`solo`]: runs a body in one child process with a given environment
//!   (for tests that set process-global state: environment variables, fd and
//!   thread counts).
//!
//! Bodies get a [`Ctx`]: a directory shared by all ranks of one job, used for
//! out-of-band signals (barrier markers, "go" files) that do not go through
//! the communicator under test.
#![allow(dead_code)]
// Reads the environment: the harness passes roles and paths to its child
// processes, and cleans the environment they inherit.
#![allow(clippy::disallowed_methods)]

pub mod cases;
pub mod data;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tutti::Communicator;

/// Names the test a child process plays a rank of.
pub const ROLE_VAR: &str = "TUTTI_HARNESS_TEST";
/// Set to print every child's log, also when the job succeeds.
pub const VERBOSE_VAR: &str = "TUTTI_HARNESS_VERBOSE";
/// The shared directory of a job.
pub const DIR_VAR: &str = "TUTTI_HARNESS_DIR";

/// How the ranks of a job talk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Threads of one process (`init_all`).
    Local,
    /// Processes on this host over shared memory (the default for one host).
    Shm,
    /// Processes over TCP (`TUTTI_TRANSPORT=tcp`).
    Tcp,
    /// Processes on emulated hosts of `per_host` ranks each (distinct
    /// `TUTTI_HOST_ID`s): shared memory within a host, TCP between hosts.
    Hosts { per_host: usize },
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Local => "local",
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
            Transport::Hosts { .. } => "hosts",
        }
    }

    /// The `TransportKind` rank `r`'s link to rank `q` must report.
    pub fn kind(self, r: usize, q: usize) -> tutti::TransportKind {
        match self {
            Transport::Local => tutti::TransportKind::Local,
            Transport::Shm => tutti::TransportKind::Shm,
            Transport::Tcp => tutti::TransportKind::Tcp,
            Transport::Hosts { per_host } if r / per_host == q / per_host => {
                tutti::TransportKind::Shm
            }
            Transport::Hosts { .. } => tutti::TransportKind::Tcp,
        }
    }
}

/// What a rank's body gets besides its communicator.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// A directory shared by every rank of the job.
    pub dir: PathBuf,
    pub transport: Transport,
}

impl Ctx {
    /// Creates the marker file `name` in the shared directory.
    pub fn mark(&self, name: &str) {
        std::fs::write(self.dir.join(name), b"").expect("writing a marker file");
    }

    /// True if the marker `name` exists.
    pub fn marked(&self, name: &str) -> bool {
        self.dir.join(name).exists()
    }

    /// Waits (without a deadline of its own: the harness's hard timeout
    /// bounds it) until the marker `name` exists.
    pub fn wait_mark(&self, name: &str) {
        while !self.marked(name) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The full libtest name of a test function defined at `module_path` (as
/// `module_path!()` spells it inside the test crate).
pub fn test_name(module_path: &str, f: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{f}"),
        None => f.to_string(),
    }
}

/// True if this process is a child spawned for test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(ROLE_VAR).is_ok_and(|v| v == name)
}

fn unique_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "tutti-test-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        tag.replace("::", "-")
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating the job directory");
    d
}

/// A TCP port that is free now, below the kernel's ephemeral range (so no
/// outgoing connection of a concurrent test can take it meanwhile) and not
/// handed out before by this process.
pub fn free_port() -> u16 {
    static USED: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let used = USED.get_or_init(|| Mutex::new(HashSet::new()));
    let mut used = used.lock().unwrap_or_else(|e| e.into_inner());
    let mut x = std::process::id() as u64 ^ (used.len() as u64).wrapping_mul(0x9e37_79b9);
    for _ in 0..10_000 {
        x = data::mix64(x);
        let port = 20_000 + (x % 12_000) as u16;
        if used.contains(&port) {
            continue;
        }
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            used.insert(port);
            return port;
        }
    }
    panic!("no free TCP port in 20000..32000");
}

/// A random 32-hex-digit job token.
pub fn token() -> String {
    let mut t = [0u8; 16];
    getrandom::getrandom(&mut t).expect("random token");
    t.iter().map(|b| format!("{b:02x}")).collect()
}

/// Environment variables the harness never passes on to a child (launcher
/// variables that would confuse `EnvInfo::from_env`, and tutti's own).
fn scrub(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let launcher = [
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_LOCALID",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ];
        if (k.starts_with("TUTTI_") && k != "TUTTI_NO_AVX2") || launcher.contains(&k.as_str()) {
            cmd.env_remove(&k);
        }
    }
}

/// A job of child processes: spawn them, wait with a hard timeout.
pub struct Job {
    name: String,
    children: Vec<(usize, Child, PathBuf)>,
    pub dir: PathBuf,
}

impl Job {
    /// Spawns one child per entry of `envs` (rank `i` gets `envs[i]`),
    /// each re-running test `name` of this executable.
    pub fn spawn(name: &str, envs: Vec<Vec<(String, String)>>) -> Job {
        let exe = std::env::current_exe().expect("current test executable");
        let dir = unique_dir(name);
        let mut children = Vec::new();
        for (i, env) in envs.into_iter().enumerate() {
            let log = dir.join(format!("rank{i}.log"));
            let f = std::fs::File::create(&log).expect("creating a child log");
            let mut cmd = Command::new(&exe);
            cmd.args([
                name,
                "--exact",
                "--nocapture",
                "--include-ignored",
                "--test-threads",
                "1",
            ])
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log file"))
            .stderr(f);
            scrub(&mut cmd);
            cmd.env(ROLE_VAR, name)
                .env(DIR_VAR, &dir)
                .env("RUST_BACKTRACE", "1");
            for (k, v) in env {
                cmd.env(k, v);
            }
            let child = cmd.spawn().expect("spawning a child process");
            children.push((i, child, log));
        }
        Job {
            name: name.to_string(),
            children,
            dir,
        }
    }

    /// Waits for every child to exit 0 within `limit`. If one fails, the
    /// others get `grace` to finish (a correct library fails them fast with
    /// `PeerLost`), then everything left is killed. Panics with every rank's
    /// log on failure.
    pub fn wait(mut self, limit: Duration, grace: Duration) {
        let start = Instant::now();
        let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; self.children.len()];
        let mut first_failure: Option<Instant> = None;
        let mut killed = false;
        loop {
            for (k, (_, c, _)) in self.children.iter_mut().enumerate() {
                if status[k].is_none() {
                    if let Ok(Some(s)) = c.try_wait() {
                        status[k] = Some(s);
                        if !s.success() && first_failure.is_none() {
                            first_failure = Some(Instant::now());
                        }
                    }
                }
            }
            if status.iter().all(Option::is_some) {
                break;
            }
            let expired =
                start.elapsed() > limit || first_failure.is_some_and(|t| t.elapsed() > grace);
            if expired {
                killed = true;
                let live: Vec<(usize, u32)> = self
                    .children
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| status[*k].is_none())
                    .map(|(_, (i, c, _))| (*i, c.id()))
                    .collect();
                hang_report(&self.dir, &live);
                for (k, (_, c, _)) in self.children.iter_mut().enumerate() {
                    if status[k].is_none() {
                        let _ = c.kill();
                        status[k] = c.wait().ok();
                    }
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let ok = !killed && status.iter().all(|s| s.is_some_and(|s| s.success()));
        if ok {
            if let Ok(s) = std::fs::read_to_string(self.dir.join("summary.txt")) {
                print!("{s}");
            }
            if std::env::var_os(VERBOSE_VAR).is_some() {
                for (i, _, log) in &self.children {
                    println!("--- {} rank {i} (ok):\n{}", self.name, tail(log, 40));
                }
            }
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        let mut report = format!(
            "job {} failed after {:.1?}{} (full logs in {}):\n",
            self.name,
            start.elapsed(),
            if killed {
                " (children killed: hard timeout or a rank failed and the others did not finish)"
            } else {
                ""
            },
            self.dir.display()
        );
        for (k, (i, _, log)) in self.children.iter().enumerate() {
            report += &format!("--- rank {i}: {:?}\n", status[k]);
            report += &tail(log, 60);
        }
        panic!("{report}");
    }
}

/// Before a job's live children are killed, writes what each was doing to
/// `hang.txt` in the job's directory (whose path the failure names) and to
/// standard error: every thread's name, state, CPU time (twice, a second
/// apart: a spinning thread gains, a sleeping one does not) and kernel wait
/// channel, and, where `gdb` is installed, every thread's stack. So a hang
/// in CI says where it hung.
fn hang_report(dir: &Path, live: &[(usize, u32)]) {
    let threads = |pid: u32| -> Vec<(String, String)> {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut v: Vec<(String, String)> = rd
            .flatten()
            .map(|e| {
                let t = e.path();
                let read = |f: &str| std::fs::read_to_string(t.join(f)).unwrap_or_default();
                // stat: "tid (comm) state ... utime stime" (fields 14, 15).
                let stat = read("stat");
                let after = stat.rsplit_once(") ").map_or("", |(_, a)| a);
                let f: Vec<&str> = after.split_whitespace().collect();
                let cpu = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
                let line = format!(
                    "{} state {} cpu {} ticks wchan {}",
                    read("comm").trim(),
                    f.first().unwrap_or(&"?"),
                    cpu(11) + cpu(12),
                    read("wchan").trim()
                );
                (e.file_name().to_string_lossy().into_owned(), line)
            })
            .collect();
        v.sort();
        v
    };
    let before: Vec<Vec<(String, String)>> = live.iter().map(|&(_, p)| threads(p)).collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut out = String::from("=== live ranks when the hard timeout struck\n");
    for (k, &(rank, pid)) in live.iter().enumerate() {
        out += &format!("--- rank {rank} (pid {pid})\n");
        for (tid, line) in threads(pid) {
            let was = before[k].iter().find(|(t, _)| *t == tid);
            out += &format!(
                "    tid {tid}: {line} (a second before: {})\n",
                was.map_or("-", |w| &w.1)
            );
        }
        let gdb = Command::new("timeout")
            .args([
                "20",
                "gdb",
                "-p",
                &pid.to_string(),
                "-batch",
                "-ex",
                "thread apply all bt",
            ])
            .stdin(Stdio::null())
            .output();
        if let Ok(o) = gdb {
            // Each thread's innermost 16 frames, without the toolchain's paths.
            let mut depth = 0;
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                if l.starts_with("Thread") {
                    depth = 0;
                } else if !l.starts_with('#') || depth >= 16 {
                    continue;
                } else {
                    depth += 1;
                }
                let l = l.split(" at /rustc/").next().unwrap_or(l);
                out += &format!("    {l}\n");
            }
        }
    }
    let _ = std::fs::write(dir.join("hang.txt"), &out);
    eprint!("{out}");
}

fn tail(p: &Path, lines: usize) -> String {
    let Ok(f) = std::fs::File::open(p) else {
        return String::new();
    };
    let all: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    let from = all.len().saturating_sub(lines);
    all[from..].iter().map(|l| format!("    {l}\n")).collect()
}

/// Environment for rank `r` of an `n`-rank job over `t`.
pub fn rank_env(t: Transport, n: usize, r: usize, port: u16, token: &str) -> Vec<(String, String)> {
    let mut e = vec![
        ("TUTTI_RANK".to_string(), r.to_string()),
        ("TUTTI_WORLD_SIZE".to_string(), n.to_string()),
        ("TUTTI_MASTER_ADDR".to_string(), "127.0.0.1".to_string()),
        ("TUTTI_MASTER_PORT".to_string(), port.to_string()),
        ("TUTTI_TOKEN".to_string(), token.to_string()),
        // An op that hangs becomes a typed error long before the harness kills it.
        ("TUTTI_TIMEOUT".to_string(), "120".to_string()),
        ("TUTTI_CONNECT_TIMEOUT".to_string(), "60".to_string()),
        // The default cost model, not one measured on a busy test machine:
        // every run picks the same algorithms, so failures reproduce.
        ("TUTTI_CALIBRATE".to_string(), "0".to_string()),
    ];
    match t {
        Transport::Tcp => e.push(("TUTTI_TRANSPORT".to_string(), "tcp".to_string())),
        Transport::Hosts { per_host } => e.push((
            "TUTTI_HOST_ID".to_string(),
            format!("emulated-host-{}", r / per_host),
        )),
        _ => {}
    }
    e
}

/// Hard limit for a whole multi-process job.
pub const JOB_LIMIT: Duration = Duration::from_secs(600);

/// Runs `body` as each of `n` processes over `t` (shm or tcp), with `extra`
/// environment variables; the body makes its own communicators. In the
/// parent this spawns the children and waits; in a child it runs the body.
pub fn procs_raw(
    name: &str,
    n: usize,
    t: Transport,
    extra: &[(&str, &str)],
    body: impl FnOnce(&Ctx),
) {
    assert!(
        t != Transport::Local,
        "processes are for shm and tcp; use threads for local"
    );
    if is_child(name) {
        let ctx = Ctx {
            dir: std::env::var_os(DIR_VAR).expect("job dir").into(),
            transport: t,
        };
        body(&ctx);
        return;
    }
    let port = free_port();
    let tok = token();
    let envs = (0..n)
        .map(|r| {
            let mut e = rank_env(t, n, r, port, &tok);
            e.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            e
        })
        .collect();
    Job::spawn(name, envs).wait(JOB_LIMIT, Duration::from_secs(15));
}

/// Checks that `comm` reaches every peer over `t`.
pub fn assert_transport(comm: &Communicator, t: Transport) {
    let r = comm.rank();
    for (q, k) in comm.topology().transports.iter().enumerate() {
        if q != r {
            assert_eq!(
                *k,
                Some(t.kind(r, q)),
                "rank {r} reaches rank {q} over {k:?} ({})",
                t.name()
            );
        }
    }
}

/// Runs `body` as rank `r` of `n` processes over `t` (shm or tcp), with
/// `extra` environment variables: each child joins with
/// `Communicator::from_env` and runs the body.
pub fn procs(
    name: &str,
    n: usize,
    t: Transport,
    extra: &[(&str, &str)],
    body: impl FnOnce(&Communicator, &Ctx),
) {
    procs_raw(name, n, t, extra, |ctx| {
        let comm = Communicator::from_env().expect("joining the job from the environment");
        assert_eq!(comm.size(), n);
        assert_transport(&comm, t);
        body(&comm, ctx);
    });
}

/// Runs `body` on `n` threads, one per rank, over the `local` transport.
pub fn threads(n: usize, body: impl Fn(&Communicator, &Ctx) + Sync) {
    let comms = Communicator::init_all(n).expect("init_all");
    threads_with(comms, body);
}

/// Runs `body` on one thread per communicator of `comms`.
pub fn threads_with(comms: Vec<Communicator>, body: impl Fn(&Communicator, &Ctx) + Sync) {
    let ctx = Ctx {
        dir: unique_dir("local"),
        transport: Transport::Local,
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| body(c, &ctx))).collect();
        let mut panics = Vec::new();
        for (r, h) in hs.into_iter().enumerate() {
            if let Err(e) = h.join() {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panics.push(format!("rank {r}: {msg}"));
            }
        }
        assert!(panics.is_empty(), "{}", panics.join("\n"));
    });
    let _ = std::fs::remove_dir_all(&ctx.dir);
}

/// Runs `body` in one child process with environment `env` (and nothing
/// else of tutti's). In the child, runs the body; in the parent, waits.
pub fn solo(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if is_child(name) {
        body();
        return;
    }
    let env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Job::spawn(name, vec![env]).wait(Duration::from_secs(300), Duration::ZERO);
}

/// Defines `#[test] fn $name` that runs `$body(&comm, &ctx)` as `$n` ranks
/// over `$t`: threads of one child process for local, `$n` child
/// processes otherwise.
#[macro_export]
macro_rules! rank_test {
    ($name:ident, $t:expr, $n:expr, $body:expr) => {
        $crate::rank_test!($name, $t, $n, &[], $body);
    };
    ($name:ident, $t:expr, $n:expr, $extra:expr, $body:expr) => {
        #[test]
        fn $name() {
            let name = $crate::common::test_name(module_path!(), stringify!($name));
            match $t {
                // Threads, but in a child process: a crash or a hang fails
                // this test (hard timeout) instead of the whole test binary.
                $crate::common::Transport::Local => {
                    $crate::common::solo(&name, $extra, || $crate::common::threads($n, $body))
                }
                t => $crate::common::procs(&name, $n, t, $extra, $body),
            }
        }
    };
}

/// Counts of the process-wide resources a communicator may leak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resources {
    pub fds: usize,
    pub threads: usize,
    /// Mappings of tutti segments in /proc/self/maps.
    pub shm_maps: usize,
}

fn count_dir(p: &str) -> usize {
    std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0)
}

impl Resources {
    pub fn now() -> Resources {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        Resources {
            fds: count_dir("/proc/self/fd"),
            threads: count_dir("/proc/self/task"),
            shm_maps: maps
                .lines()
                .filter(|l| l.contains("/dev/shm/tutti-"))
                .count(),
        }
    }

    /// The counts once two reads 10 ms apart agree (at most 2 s): a
    /// baseline taken right after a drop without a thread that is still
    /// being reaped (see [`Resources::settled`]).
    pub fn steady() -> Resources {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut last = Resources::now();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let now = Resources::now();
            if now == last || std::time::Instant::now() >= end {
                return now;
            }
            last = now;
        }
    }

    /// The counts once they equal `want`, or the last ones read after
    /// `within`. A thread that has been joined can still be listed in
    /// /proc/self/task for a moment (the kernel reaps it after `join`
    /// returns), so a comparison right after a drop polls briefly; a real
    /// leak stays and still fails the comparison.
    pub fn settled(want: &Resources, within: std::time::Duration) -> Resources {
        let end = std::time::Instant::now() + within;
        loop {
            let now = Resources::now();
            if now == *want || std::time::Instant::now() >= end {
                return now;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// Files in /dev/shm whose names start with `prefix`.
pub fn shm_files(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}
