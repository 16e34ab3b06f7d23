//! Starting ranks as local processes, like `torchrun --standalone`.
//!
//! Every rank gets the `TUTTI_*` variables that
//! [`tutti::EnvInfo::from_env`] reads, and torchrun's `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`, so that
//! torch programs run unchanged. The master is 127.0.0.1 on a port that was
//! free a moment ago, and the job's auth token is 16 fresh random bytes.
//!
//! Supervision, in one loop on the main thread:
//!
//! * each rank runs in its own process group, so that stopping a rank stops
//!   whatever it started (`sh -c` children included), and dies with us
//!   (`PR_SET_PDEATHSIG`) if `tutti` itself is killed;
//! * the first rank that exits with a non-zero code or is killed by a signal
//!   decides the exit code (128 + signal for a signal, as shells do), and the
//!   other ranks get SIGTERM, then SIGKILL after a grace period;
//! * SIGINT, SIGTERM and SIGHUP sent to `tutti` are forwarded to every rank
//!   (ranks are in their own process groups, so a terminal's Ctrl-C reaches
//!   only us); a second one, or the end of the grace period, sends SIGKILL;
//! * one thread per pipe copies each line of a rank's stdout and stderr to
//!   ours, prefixed with `[rank R] `, one whole line at a time.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Arguments of `tutti run`.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// Number of local ranks to start.
    #[arg(short = 'n', long = "nproc", value_name = "N", default_value_t = 1)]
    pub nproc: usize,
    /// Master port (default: a free port chosen by the system).
    #[arg(long, value_name = "PORT")]
    pub master_port: Option<u16>,
    /// Do not prefix output lines with `[rank R] ` (ranks then write straight to the terminal).
    #[arg(long)]
    pub no_prefix: bool,
    /// Seconds between SIGTERM and SIGKILL when stopping ranks.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub grace: f64,
    /// CPU binding: `none` (default), or `core`: rank r gets its own slice of
    /// the CPUs this process may use (cores / N each; with more ranks than
    /// cores, core r mod cores), like mpirun's --bind-to core.
    #[arg(long, value_name = "HOW", default_value = "none", value_parser = ["none", "core"])]
    pub bind: String,
    /// The program to run and its arguments (put `--` before them if they start with `-`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<OsString>,
}

/// `tutti run`.
pub(crate) fn main(a: RunArgs) -> Result<i32, String> {
    if a.nproc == 0 {
        return Err("-n must be at least 1".into());
    }
    if !(a.grace >= 0.0 && a.grace.is_finite()) {
        return Err("--grace must be a non-negative number of seconds".into());
    }
    let job = Job {
        nranks: a.nproc,
        program: a.command[0].clone(),
        args: a.command[1..].to_vec(),
        prefix: !a.no_prefix,
        rank0_direct: false,
        grace: Duration::from_secs_f64(a.grace),
        master_port: a.master_port,
        bind: a.bind == "core",
    };
    run(&job).map_err(|e| format!("run: {e}"))
}

/// A set of ranks to start and supervise.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    /// Number of ranks.
    pub nranks: usize,
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Prefix each output line with `[rank R] `.
    pub prefix: bool,
    /// Rank 0 writes straight to our stdout and stderr (no prefix, so it
    /// sees the terminal); used by `tutti perf` and `tutti topo`, where only
    /// rank 0 prints.
    pub rank0_direct: bool,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Master port; `None` picks a free one.
    pub master_port: Option<u16>,
    /// Bind each rank to its own slice of the allowed CPUs ([`cpu_slices`]).
    pub bind: bool,
}

/// The CPUs this process may run on, ascending.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it
    // (size given) and the CPU_ISSET reads stay within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// For `n` ranks over `cpus`: rank r's slice, `cpus.len() / n` CPUs each
/// (the leftovers unused), or one CPU, `r mod len`, with more ranks than CPUs.
pub(crate) fn cpu_slices(cpus: &[usize], n: usize) -> Vec<Vec<usize>> {
    if cpus.is_empty() {
        return vec![Vec::new(); n];
    }
    let k = (cpus.len() / n.max(1)).max(1);
    (0..n)
        .map(|r| {
            if n > cpus.len() {
                vec![cpus[r % cpus.len()]]
            } else {
                cpus[r * k..(r + 1) * k].to_vec()
            }
        })
        .collect()
}

/// Whether `tutti perf -n N` and `tutti topo -n N` bind their ranks, given
/// `TUTTI_BIND`: `core` always, `none` never, and by default as mpirun
/// does: bound when every rank gets a CPU of its own (placement then does
/// not change from run to run), left to the scheduler when ranks outnumber
/// CPUs. Pinning two ranks to one CPU keeps the scheduler from moving a
/// rank that has work onto the CPU whose rank waits, and favours whichever
/// algorithm happens to pair ranks across CPUs. Any other value is an error.
fn bench_binds(nranks: usize, env: Option<&str>) -> Result<bool, String> {
    match env.map(str::trim) {
        Some("none") => Ok(false),
        Some("core") => Ok(true),
        None | Some("") => Ok(nranks <= allowed_cpus().len().max(1)),
        Some(v) => Err(format!("TUTTI_BIND={v:?}: use core or none")),
    }
}

/// Environment variables that mean "this process is a rank started by a launcher".
pub(crate) const LAUNCHER_RANK_VARS: [&str; 4] =
    ["TUTTI_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"];

/// The world size a launcher announced, if this process runs under one
/// (`TUTTI_RANK`, torchrun, Slurm or Open MPI variables).
// The launcher decides whether to start ranks from the environment it was
// started in, before any communicator (and its `tutti::Config`) exists.
#[allow(clippy::disallowed_methods)]
pub(crate) fn launcher_world() -> Option<usize> {
    let size_vars = [
        "TUTTI_WORLD_SIZE",
        "WORLD_SIZE",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_SIZE",
    ];
    for (rk, sz) in LAUNCHER_RANK_VARS.iter().zip(size_vars) {
        if std::env::var(rk).is_ok_and(|v| !v.trim().is_empty()) {
            return Some(
                std::env::var(sz)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0),
            );
        }
    }
    None
}

/// Starts `nranks` copies of this very program with the arguments it was
/// given plus `extra` (the hidden "I am a rank" flag of `perf` and `topo`),
/// rank 0 writing straight to the terminal.
// `TUTTI_BIND` is the launcher's own setting (how it places the ranks it
// starts), not the library's: `tutti::Config` does not hold it.
#[allow(clippy::disallowed_methods)]
pub(crate) fn relaunch_self(nranks: usize, extra: &str) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    args.push(extra.into());
    let job = Job {
        nranks,
        program: exe.into_os_string(),
        args,
        prefix: true,
        rank0_direct: true,
        grace: Duration::from_secs(2),
        master_port: None,
        bind: bench_binds(nranks, std::env::var("TUTTI_BIND").ok().as_deref())?,
    };
    run(&job).map_err(|e| e.to_string())
}

/// The last signal sent to this process (SIGINT, SIGTERM or SIGHUP), 0 if none is pending.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNAL.store(sig, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value;
        // the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Sends `sig` to the process group `pgid` (each rank leads its own group).
fn kill_group(pgid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals a process group; it has no
    // memory-safety preconditions. Errors (ESRCH: the group is gone) are fine.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), sig);
    }
}

/// A signal's conventional name, for messages.
pub(crate) fn signal_name(sig: i32) -> String {
    let n = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    n.to_string()
}

/// 32 random hex digits from the kernel's random source.
fn random_token() -> io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A port that was free when we asked: bind port 0 and read what we got.
fn free_port() -> io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// The variables that make process `rank` a rank of the job.
fn rank_env(rank: usize, n: usize, port: u16, token: &str) -> Vec<(&'static str, String)> {
    let (r, n, p) = (rank.to_string(), n.to_string(), port.to_string());
    vec![
        ("TUTTI_RANK", r.clone()),
        ("TUTTI_WORLD_SIZE", n.clone()),
        ("TUTTI_LOCAL_RANK", r.clone()),
        ("TUTTI_LOCAL_WORLD_SIZE", n.clone()),
        ("TUTTI_MASTER_ADDR", "127.0.0.1".into()),
        ("TUTTI_MASTER_PORT", p.clone()),
        ("TUTTI_TOKEN", token.into()),
        ("RANK", r.clone()),
        ("WORLD_SIZE", n.clone()),
        ("LOCAL_RANK", r),
        ("LOCAL_WORLD_SIZE", n),
        ("GROUP_RANK", "0".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", p),
    ]
}

/// Copies `src` to our stdout or stderr line by line, each line prefixed;
/// a last line without a newline gets one. Write errors (a closed pipe) are
/// ignored but reading goes on, so that the rank never blocks on a full pipe.
fn pump(src: impl Read, prefix: String, to_stderr: bool) {
    let mut r = BufReader::with_capacity(64 << 10, src);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let _ = if to_stderr {
                    let mut e = io::stderr().lock();
                    e.write_all(&line).and_then(|_| e.flush())
                } else {
                    let mut o = io::stdout().lock();
                    o.write_all(&line).and_then(|_| o.flush())
                };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// One supervised rank.
struct Rank {
    child: Child,
    status: Option<ExitStatus>,
}

/// Why supervision is stopping the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopping {
    /// Everything is fine so far.
    No,
    /// A rank failed; the others got SIGTERM at `since`.
    Failure,
    /// We got a signal and forwarded it.
    Signal,
}

/// Starts the job's ranks and supervises them until all have exited.
/// Returns the exit code `tutti` should exit with.
pub(crate) fn run(job: &Job) -> io::Result<i32> {
    let n = job.nranks;
    let port = match job.master_port {
        Some(p) => p,
        None => free_port()?,
    };
    let token = random_token()?;
    install_signal_handlers();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut readers = 0usize;
    let mut ranks: Vec<Rank> = Vec::with_capacity(n);
    let slices = if job.bind {
        cpu_slices(&allowed_cpus(), n)
    } else {
        vec![Vec::new(); n]
    };
    for (r, slice) in slices.iter().enumerate() {
        // Built here, before fork: the child only makes the system call.
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within it
        // for CPU numbers below CPU_SETSIZE (they come from sched_getaffinity).
        let cpuset = (!slice.is_empty()).then(|| unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in slice {
                libc::CPU_SET(c, &mut set);
            }
            set
        });
        let mut cmd = Command::new(&job.program);
        cmd.args(&job.args)
            .envs(rank_env(r, n, port, &token))
            .stdin(Stdio::null());
        let direct = !job.prefix || (job.rank0_direct && r == 0);
        if !direct {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        cmd.process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and
        // only calls sched_setaffinity, prctl and getppid, which are
        // async-signal-safe system calls.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(set) = &cpuset {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() != parent {
                    return Err(io::Error::other("tutti exited while starting the rank"));
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "tutti: cannot start rank {r} ({}): {e}",
                    job.program.to_string_lossy()
                );
                for k in &mut ranks {
                    kill_group(k.child.id(), libc::SIGKILL);
                    let _ = k.child.wait();
                }
                return Ok(if e.kind() == io::ErrorKind::NotFound {
                    127
                } else {
                    126
                });
            }
        };
        for (to_stderr, pipe) in [
            (
                false,
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
            ),
            (
                true,
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
            ),
        ] {
            if let Some(p) = pipe {
                let tx = done_tx.clone();
                let prefix = format!("[rank {r}] ");
                readers += 1;
                std::thread::Builder::new()
                    .name(format!("tutti-pipe-{r}"))
                    .spawn(move || {
                        pump(p, prefix, to_stderr);
                        let _ = tx.send(());
                    })?;
            }
        }
        ranks.push(Rank {
            child,
            status: None,
        });
    }
    drop(done_tx);

    let mut code: Option<i32> = None;
    let mut stopping = Stopping::No;
    let mut kill_at: Option<Instant> = None;
    let mut forwarded: Option<i32> = None;
    let mut first: Option<usize> = None;
    loop {
        // Reap ranks that have exited.
        for (r, k) in ranks.iter_mut().enumerate() {
            if k.status.is_some() {
                continue;
            }
            let st = match k.child.try_wait() {
                Ok(Some(st)) => st,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("tutti: cannot wait for rank {r}: {e}");
                    kill_group(k.child.id(), libc::SIGKILL);
                    match k.child.wait() {
                        Ok(st) => st,
                        Err(_) => ExitStatus::from_raw(libc::SIGKILL),
                    }
                }
            };
            k.status = Some(st);
            let failed = !st.success();
            if failed && code.is_none() && stopping == Stopping::No {
                let c = match (st.code(), st.signal()) {
                    (Some(c), _) => {
                        eprintln!("tutti: rank {r} exited with code {c}");
                        c
                    }
                    (None, Some(s)) => {
                        eprintln!("tutti: rank {r} killed by signal {s} ({})", signal_name(s));
                        128 + s
                    }
                    _ => 1,
                };
                code = Some(c);
                stopping = Stopping::Failure;
                kill_at = Some(Instant::now() + job.grace);
                first = Some(r);
                let others = alive(&ranks);
                if !others.is_empty() {
                    eprintln!(
                        "tutti: stopping the other ranks ({}) with SIGTERM",
                        list(&others)
                    );
                }
                for k2 in ranks.iter() {
                    if k2.status.is_none() {
                        kill_group(k2.child.id(), libc::SIGTERM);
                    }
                }
                break;
            }
        }
        let alive = alive(&ranks);
        if alive.is_empty() {
            break;
        }
        // A signal for us: forward it; the second one, or the grace period, escalates.
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            if forwarded.is_some() {
                eprintln!("tutti: {} again; killing the ranks", signal_name(sig));
                for &r in &alive {
                    kill_group(ranks[r].child.id(), libc::SIGKILL);
                }
            } else {
                eprintln!(
                    "tutti: got {}; forwarding it to the ranks",
                    signal_name(sig)
                );
                for &r in &alive {
                    kill_group(ranks[r].child.id(), sig);
                }
                forwarded = Some(sig);
                if stopping == Stopping::No {
                    stopping = Stopping::Signal;
                    code.get_or_insert(128 + sig);
                }
                kill_at.get_or_insert(Instant::now() + job.grace);
            }
        }
        if let Some(t) = kill_at {
            if Instant::now() >= t {
                eprintln!(
                    "tutti: rank(s) {} still running after {:.1} s; sending SIGKILL",
                    list(&alive),
                    job.grace.as_secs_f64()
                );
                for &r in &alive {
                    kill_group(ranks[r].child.id(), libc::SIGKILL);
                }
                kill_at = None;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    // Drain the output. A pipe stays open while anything the rank started
    // still holds it: give that a moment, then stop the rank's whole group.
    let mut finished = 0;
    let deadline = Instant::now() + Duration::from_millis(500);
    while finished < readers {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(()) => finished += 1,
            Err(_) => break,
        }
    }
    if finished < readers {
        for k in &ranks {
            kill_group(k.child.id(), libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while finished < readers {
            match done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(()) => finished += 1,
                Err(_) => {
                    for k in &ranks {
                        kill_group(k.child.id(), libc::SIGKILL);
                    }
                    break;
                }
            }
        }
    }
    if stopping == Stopping::Failure {
        let stopped: Vec<usize> = ranks
            .iter()
            .enumerate()
            .filter(|&(r, k)| {
                Some(r) != first
                    && k.status
                        .is_some_and(|s| matches!(s.signal(), Some(libc::SIGTERM | libc::SIGKILL)))
            })
            .map(|(r, _)| r)
            .collect();
        if !stopped.is_empty() {
            eprintln!("tutti: stopped rank(s) {}", list(&stopped));
        }
    }
    Ok(code.unwrap_or(0))
}

/// The ranks that have not exited yet.
fn alive(ranks: &[Rank]) -> Vec<usize> {
    ranks
        .iter()
        .enumerate()
        .filter(|(_, k)| k.status.is_none())
        .map(|(r, _)| r)
        .collect()
}

/// `0, 2, 3`.
fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_32_hex_digits() {
        let t = random_token().unwrap();
        assert_eq!(t.len(), 32);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(t, random_token().unwrap());
    }

    #[test]
    fn env_names_both_spellings() {
        let e = rank_env(1, 3, 4242, "00112233445566778899aabbccddeeff");
        let get = |k: &str| e.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("TUTTI_RANK"), Some("1"));
        assert_eq!(get("RANK"), Some("1"));
        assert_eq!(get("WORLD_SIZE"), Some("3"));
        assert_eq!(get("TUTTI_MASTER_PORT"), Some("4242"));
        assert_eq!(get("MASTER_ADDR"), Some("127.0.0.1"));
    }
}

#[cfg(test)]
mod bind_tests {
    use super::{allowed_cpus, bench_binds, cpu_slices};

    #[test]
    fn benchmarks_bind_only_where_every_rank_has_a_cpu() {
        let cpus = allowed_cpus().len().max(1);
        assert_eq!(bench_binds(cpus, None), Ok(true));
        assert_eq!(bench_binds(cpus + 1, None), Ok(false));
        assert_eq!(bench_binds(cpus + 1, Some("core")), Ok(true));
        assert_eq!(bench_binds(1, Some("none")), Ok(false));
        let e = bench_binds(1, Some("yes")).unwrap_err();
        assert!(e.contains("use core or none"), "{e}");
    }

    #[test]
    fn slices_split_the_cpus_and_wrap_when_oversubscribed() {
        let cpus = [0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(
            cpu_slices(&cpus, 2),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert_eq!(cpu_slices(&cpus, 3)[2], vec![4, 5]);
        assert_eq!(
            cpu_slices(&[2, 5], 4),
            vec![vec![2], vec![5], vec![2], vec![5]]
        );
        assert_eq!(cpu_slices(&[], 2), vec![Vec::<usize>::new(); 2]);
    }
}
