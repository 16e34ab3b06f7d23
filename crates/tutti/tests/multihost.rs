//! Multi-host tests on a cluster of network namespaces (`scripts/cluster.sh`).
//!
//! Each test makes its own cluster (a unique prefix, so tests run in
//! parallel), starts this very test binary inside the namespaces as the
//! ranks (`cluster.sh launch ... -- <this exe> --exact <test> --nocapture`,
//! with `TUTTI_MH_ROLE=rank`), checks that every rank exited with 0, and
//! takes the cluster down in a drop guard, also when the test panics.
//!
//! Ranks in different namespaces are different hosts to tutti (the host
//! identity includes the network namespace), so ranks on one host talk over
//! shared memory and ranks on different hosts over TCP across a bridge.
//!
//! The tests need root and `ip netns`. Without them they print `SKIP` and
//! pass, unless `TUTTI_MULTIHOST_REQUIRED=1` is set (CI sets it), which
//! turns the skip into a failure. See `docs/multihost.md`.
// Reads the environment: the harness's own knobs, and the roles it gives its
// child processes.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;
use tutti::{Algorithm, Communicator, Element, ReduceOp, TransportKind};

/// Set (to "rank") in the processes that `cluster.sh launch` starts.
const ROLE: &str = "TUTTI_MH_ROLE";
/// Makes a skip (no root, no `ip netns`) a failure.
const REQUIRED: &str = "TUTTI_MULTIHOST_REQUIRED";
/// Elements of the big case (a prime, above 1 Mi).
const BIG: usize = 1_000_003;

// ---------------------------------------------------------------------------
// The cluster, seen from the test process
// ---------------------------------------------------------------------------

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster.sh")
}

fn is_rank() -> bool {
    std::env::var(ROLE).is_ok_and(|v| v == "rank")
}

/// `None` (and a printed reason) when this machine cannot make clusters.
fn unavailable() -> Option<String> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        let out = match Command::new("bash").arg(script()).arg("check").output() {
            Ok(o) => o,
            Err(e) => return Some(format!("cannot run {}: {e}", script().display())),
        };
        if out.status.success() {
            // Clusters left behind by test runs that were killed.
            let _ = Command::new("bash").arg(script()).arg("gc").output();
            None
        } else {
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
    })
    .clone()
}

/// A cluster that exists until it is dropped.
struct Cluster {
    prefix: String,
    hosts: usize,
}

impl Cluster {
    /// Makes a cluster of `hosts` hosts; `link` is a tc rate (`1gbit`) or
    /// `None` for no limit. Returns `None` (the test is skipped) when
    /// namespaces are not available.
    fn up(test: &str, hosts: usize, link: Option<&str>) -> Option<Cluster> {
        if let Some(why) = unavailable() {
            let msg = format!("multihost test {test}: {why}");
            if std::env::var(REQUIRED).is_ok_and(|v| v == "1") {
                panic!("{msg}, but {REQUIRED}=1");
            }
            // Straight to stderr, past libtest's capture, so a skip is always visible.
            let _ = writeln!(
                std::io::stderr(),
                "SKIP {msg} (needs root and ip netns; set {REQUIRED}=1 to fail instead)"
            );
            return None;
        }
        // Short (namespace names appear in `ip netns`), unique per process and test.
        let tag: String = test.split('_').filter_map(|w| w.chars().next()).collect();
        let prefix = format!("mh{}{}", std::process::id(), tag);
        let c = Cluster { prefix, hosts };
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .args([
                "up",
                "--quiet",
                "--hosts",
                &hosts.to_string(),
                "--prefix",
                &c.prefix,
            ])
            .args(["--owner", &std::process::id().to_string()])
            .args(["--link", link.unwrap_or("none")]);
        let out = cmd.output().expect("running cluster.sh up");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "cluster.sh up failed:\n{text}");
        print!("{text}");
        Some(c)
    }

    /// Runs `test` of this binary as `hosts x rph` ranks and panics, with
    /// the ranks' output, if any rank fails.
    fn launch(&self, test: &str, rph: usize, env: &[(&str, &str)]) {
        self.launch_on(test, self.hosts, rph, env)
    }

    /// [`launch`](Cluster::launch) on the first `hosts` hosts only.
    fn launch_on(&self, test: &str, hosts: usize, rph: usize, env: &[(&str, &str)]) {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .args([
                "launch",
                "--prefix",
                &self.prefix,
                "--hosts",
                &hosts.to_string(),
            ])
            .args(["--ranks-per-host", &rph.to_string()])
            .args(["--timeout", "100"])
            .args([
                "--env",
                &format!("{ROLE}=rank"),
                "--env",
                "RUST_BACKTRACE=0",
            ])
            // Every wait in tutti has a deadline: a hang becomes an error that names it.
            .args([
                "--env",
                "TUTTI_TIMEOUT=60",
                "--env",
                "TUTTI_CONNECT_TIMEOUT=30",
            ])
            // The tuner's measured cost model is cached per host layout; keep
            // this cluster's measurements out of the user's cache (and theirs
            // out of these tests).
            .args([
                "--env",
                &format!("XDG_CACHE_HOME={}", self.cache().display()),
            ]);
        for (k, v) in env {
            cmd.args(["--env", &format!("{k}={v}")]);
        }
        cmd.arg("--")
            .arg(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1", "-q"]);
        let what = format!(
            "{test} on {hosts} hosts x {rph} ranks{}",
            env.iter()
                .map(|(k, v)| format!(" {k}={v}"))
                .collect::<String>()
        );
        let t = Instant::now();
        let out = cmd.output().expect("running cluster.sh launch");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            // The ranks' panic messages first, then the end of the output.
            let lines: Vec<&str> = text.lines().collect();
            let mut panics = Vec::new();
            for (i, l) in lines.iter().enumerate() {
                if l.contains("panicked at") {
                    panics.extend(lines[i..(i + 2).min(lines.len())].iter().copied());
                }
            }
            let tail = &lines[lines.len().saturating_sub(60)..];
            panic!(
                "{what}: failed ({}) after {:.1}s\n--- panics:\n{}\n--- last lines:\n{}",
                out.status,
                t.elapsed().as_secs_f64(),
                panics.join("\n"),
                tail.join("\n")
            );
        }
        println!("ok: {what} ({:.1}s)", t.elapsed().as_secs_f64());
    }
}

impl Cluster {
    /// `XDG_CACHE_HOME` of this cluster's ranks.
    fn cache(&self) -> PathBuf {
        std::env::temp_dir().join(format!("{}.cache", self.prefix))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.cache());
        let out = Command::new("bash")
            .arg(script())
            .args(["down", "--prefix", &self.prefix])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "cluster.sh down --prefix {} failed: {}{}",
                self.prefix,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("cannot run cluster.sh down: {e}"),
        }
    }
}

/// The big count of a launch: 1,000,003 elements (and i32 too) with the
/// automatic choice, 300,007 (f32 only; still larger than a shared-memory
/// ring) with a forced algorithm, to keep the suite short.
fn big_for(algo: &str) -> &'static str {
    if algo.is_empty() {
        "1000003"
    } else {
        MEDIUM
    }
}

const MEDIUM: &str = "300007";

/// `TUTTI_ALGO` values: automatic choice (empty) and every algorithm.
fn algo_settings() -> Vec<&'static str> {
    let mut v = vec![""];
    v.extend(Algorithm::ALL.iter().map(|a| a.name()));
    v
}

/// `TUTTI_ALGO` values forcing hierarchical level variants, each valid for
/// its collective on a grid (see `algo/hierarchical.rs`); together they run
/// every level algorithm at both levels.
const LEVEL_SETTINGS: [&str; 2] = [
    "all_reduce:hierarchical(inter=halving_doubling),\
     all_gather:hierarchical(intra=direct,inter=halving_doubling),\
     reduce_scatter:hierarchical(intra=halving_doubling,inter=halving_doubling),\
     broadcast:hierarchical(intra=tree,inter=direct),\
     reduce:hierarchical(intra=direct,inter=tree),\
     all_to_all:hierarchical(intra=direct,inter=direct)",
    "all_reduce:hierarchical(inter=direct),\
     all_gather:hierarchical(intra=halving_doubling,inter=direct),\
     reduce_scatter:hierarchical(inter=halving_doubling),\
     broadcast:hierarchical(intra=direct,inter=tree),\
     reduce:hierarchical(intra=tree,inter=direct)",
];

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

/// 4 hosts x 1 rank: only TCP. Every collective, every algorithm forced.
#[test]
fn four_hosts_every_collective() {
    if is_rank() {
        return rank_every_collective();
    }
    let Some(c) = Cluster::up("four_hosts_every_collective", 4, None) else {
        return;
    };
    for a in algo_settings() {
        c.launch(
            "four_hosts_every_collective",
            1,
            &[("TUTTI_ALGO", a), ("TUTTI_MH_BIG", big_for(a))],
        );
    }
}

/// 2 hosts x 2 ranks: shared memory within a host, TCP across. Every
/// collective, every algorithm forced, then hierarchical level variants
/// ([`LEVEL_SETTINGS`]); then TCP only
/// (`TUTTI_TRANSPORT=tcp`), with the interface named
/// (`TUTTI_SOCKET_IFNAME=eth0`), and with `TUTTI_DETERMINISTIC=1`.
#[test]
fn two_hosts_two_ranks_every_collective() {
    if is_rank() {
        return rank_every_collective();
    }
    let name = "two_hosts_two_ranks_every_collective";
    let Some(c) = Cluster::up(name, 2, None) else {
        return;
    };
    for a in algo_settings() {
        c.launch(name, 2, &[("TUTTI_ALGO", a), ("TUTTI_MH_BIG", big_for(a))]);
    }
    for a in LEVEL_SETTINGS {
        c.launch(name, 2, &[("TUTTI_ALGO", a), ("TUTTI_MH_BIG", MEDIUM)]);
    }
    for setting in [
        ("TUTTI_TRANSPORT", "tcp"),
        ("TUTTI_SOCKET_IFNAME", "eth0"),
        ("TUTTI_DETERMINISTIC", "1"),
    ] {
        c.launch(name, 2, &[setting, ("TUTTI_MH_BIG", MEDIUM)]);
    }
}

/// Sub-communicators across hosts: split by host (shared memory only), by
/// local rank (TCP only), a subset, `new_group`, a split of a split; on
/// 2 hosts x 2 ranks and 4 hosts x 1 rank.
#[test]
fn split_groups_across_hosts() {
    if is_rank() {
        return rank_split();
    }
    let Some(c) = Cluster::up("split_groups_across_hosts", 4, None) else {
        return;
    };
    c.launch("split_groups_across_hosts", 1, &[]);
    // 2 hosts x 2 ranks on the first two hosts of the same cluster.
    c.launch_on("split_groups_across_hosts", 2, 2, &[]);
}

/// A 1 Gbit/s tbf link between 2 hosts x 2 ranks: every collective still
/// correct when the network, not the CPU, is the bottleneck.
#[test]
fn rate_limited_link() {
    if is_rank() {
        return rank_every_collective();
    }
    let Some(c) = Cluster::up("rate_limited_link", 2, Some("1gbit")) else {
        return;
    };
    c.launch("rate_limited_link", 2, &[("TUTTI_MH_BIG", MEDIUM)]);
}

/// The script itself: `up` twice is fine, `down` twice is fine, and nothing is left.
#[test]
fn cluster_script_is_idempotent() {
    if is_rank() {
        return;
    }
    let prefix = format!("mh{}idem", std::process::id());
    let Some(c) = Cluster::up("cluster_script_is_idempotent", 2, Some("1gbit")) else {
        return;
    };
    let run = |args: &[&str]| {
        let o = Command::new("bash")
            .arg(script())
            .args(args)
            .output()
            .expect("cluster.sh");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "cluster.sh {args:?} failed:\n{text}");
        text
    };
    drop(c);
    run(&["up", "-q", "--hosts", "2", "--prefix", &prefix]);
    run(&[
        "up", "-q", "--hosts", "2", "--prefix", &prefix, "--link", "1gbit",
    ]);
    let s = run(&["status", "--prefix", &prefix]);
    assert!(s.contains("tbf"), "no tbf after up --link:\n{s}");
    run(&["up", "-q", "--hosts", "3", "--prefix", &prefix]);
    let s = run(&["status", "--prefix", &prefix]);
    assert!(
        s.contains(&format!("{prefix}-h2")) && !s.contains("tbf"),
        "not 3 unlimited hosts:\n{s}"
    );
    let a = run(&["addr", "--prefix", &prefix, "2"]);
    assert_eq!(a.trim(), "10.233.0.3");
    run(&["down", "--prefix", &prefix]);
    run(&["down", "--prefix", &prefix]);
    let l = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let l = String::from_utf8_lossy(&l.stdout);
    assert!(!l.contains(&prefix), "namespaces left behind:\n{l}");
}

// ---------------------------------------------------------------------------
// The ranks
// ---------------------------------------------------------------------------

/// What a rank knows about the cluster it runs in (from `cluster.sh launch`).
struct Ctx {
    hosts: usize,
    rph: usize,
    tcp_only: bool,
    label: String,
}

impl Ctx {
    fn from_env(comm: &Communicator) -> Ctx {
        let get = |k: &str| -> usize {
            std::env::var(k)
                .unwrap_or_else(|_| panic!("{k} not set: not started by cluster.sh launch"))
                .parse()
                .expect("a number")
        };
        let algo = std::env::var("TUTTI_ALGO").unwrap_or_default();
        let transport = std::env::var("TUTTI_TRANSPORT").unwrap_or_default();
        Ctx {
            hosts: get("CLUSTER_HOSTS"),
            rph: get("CLUSTER_RANKS_PER_HOST"),
            tcp_only: transport.eq_ignore_ascii_case("tcp"),
            label: format!(
                "rank {}/{} algo={} transport={}",
                comm.rank(),
                comm.size(),
                if algo.is_empty() { "auto" } else { &algo },
                if transport.is_empty() {
                    "auto"
                } else {
                    &transport
                }
            ),
        }
    }
}

/// The world must look like `hosts` hosts of `rph` ranks each, rank r on
/// host r / rph, with shared memory within a host and TCP across.
fn check_topology(comm: &Communicator, cx: &Ctx) {
    let (n, r) = (comm.size(), comm.rank());
    let t = comm.topology();
    let l = &cx.label;
    assert_eq!(n, cx.hosts * cx.rph, "{l}: world size");
    assert_eq!(t.nranks, n, "{l}: topology nranks");
    assert_eq!(t.hosts.len(), cx.hosts, "{l}: hosts seen: {:?}", t.hosts);
    assert_eq!(comm.local_size(), cx.rph, "{l}: local_size");
    assert_eq!(comm.local_rank(), r % cx.rph, "{l}: local_rank");
    for q in 0..n {
        assert_eq!(t.host_of[q], q / cx.rph, "{l}: host of rank {q}");
        assert_eq!(t.local_rank[q], q % cx.rph, "{l}: local rank of rank {q}");
        let want = if q == r {
            None
        } else if q / cx.rph == r / cx.rph && !cx.tcp_only {
            Some(TransportKind::Shm)
        } else {
            Some(TransportKind::Tcp)
        };
        assert_eq!(
            t.transports[q], want,
            "{l}: transport to rank {q} (transports {:?})",
            t.transports
        );
    }
}

/// Element types under test; values are small integers, so f32 sums are exact.
trait Num: Element + Copy + PartialEq + std::fmt::Debug {
    const NAME: &'static str;
    fn of(x: i64) -> Self;
}
impl Num for f32 {
    const NAME: &'static str = "f32";
    fn of(x: i64) -> f32 {
        x as f32
    }
}
impl Num for i32 {
    const NAME: &'static str = "i32";
    fn of(x: i64) -> i32 {
        x as i32
    }
}

/// Rank r's i-th input element.
fn v(r: usize, i: usize) -> i64 {
    ((r * 31 + i * 7) % 101) as i64 - 50
}

/// Element i of the block that rank `s` sends to rank `d`.
fn w(s: usize, d: usize, i: usize) -> i64 {
    ((s * 13 + d * 5 + i * 3) % 97) as i64 - 40
}

/// A value no collective produces, for untouched elements.
const SENTINEL: i64 = -777;

fn reduce_of(op: ReduceOp, n: usize, f: impl Fn(usize) -> i64) -> i64 {
    match op {
        ReduceOp::Sum => (0..n).map(f).sum(),
        ReduceOp::Max => (0..n).map(f).max().expect("n > 0"),
        _ => unreachable!("only sum and max are tested here"),
    }
}

/// Panics naming the first wrong element (and how many are wrong).
fn expect<T: Num>(what: &str, got: &[T], want: impl Fn(usize) -> i64) {
    let mut bad = 0;
    let mut first = None;
    for (i, g) in got.iter().enumerate() {
        let wv = T::of(want(i));
        if *g != wv {
            bad += 1;
            first.get_or_insert((i, *g, wv));
        }
    }
    if let Some((i, g, wv)) = first {
        panic!(
            "{what} ({}): {bad} of {} elements wrong; first at [{i}]: got {g:?}, want {wv:?}",
            T::NAME,
            got.len()
        );
    }
}

fn fill<T: Num>(len: usize, f: impl Fn(usize) -> i64) -> Vec<T> {
    (0..len).map(|i| T::of(f(i))).collect()
}

/// The collectives that reduce, with `op`, on `count` elements per rank.
fn reducing<T: Num>(c: &Communicator, cx: &Ctx, count: usize, op: ReduceOp, roots: &[usize]) {
    let (n, r) = (c.size(), c.rank());
    let at = |coll: &str| format!("{}: {coll} {op:?} count {count}", cx.label);

    // AllReduce in place.
    let mut x: Vec<T> = fill(count, |i| v(r, i));
    c.all_reduce(&mut x, op)
        .unwrap_or_else(|e| panic!("{}: {e}", at("all_reduce")));
    expect(&at("all_reduce"), &x, |i| reduce_of(op, n, |q| v(q, i)));

    // AllReduce out of place (the input must survive).
    let send: Vec<T> = fill(count, |i| v(r, i + 3));
    let mut recv: Vec<T> = fill(count, |_| SENTINEL);
    c.all_reduce_into(&send, &mut recv, op)
        .unwrap_or_else(|e| panic!("{}: {e}", at("all_reduce_into")));
    expect(&at("all_reduce_into"), &recv, |i| {
        reduce_of(op, n, |q| v(q, i + 3))
    });
    expect(&at("all_reduce_into input"), &send, |i| v(r, i + 3));

    // Reduce to each root.
    for &root in roots {
        let send: Vec<T> = fill(count, |i| v(r + root, i));
        let mut recv: Vec<T> = fill(if r == root { count } else { 0 }, |_| SENTINEL);
        c.reduce(&send, &mut recv, op, root)
            .unwrap_or_else(|e| panic!("{} root {root}: {e}", at("reduce")));
        if r == root {
            expect(&format!("{} root {root}", at("reduce")), &recv, |i| {
                reduce_of(op, n, |q| v(q + root, i))
            });
        }
    }

    // ReduceScatter: block r of the reduction of everybody's n * count elements.
    let send: Vec<T> = fill(n * count, |j| v(r, j));
    let mut recv: Vec<T> = fill(count, |_| SENTINEL);
    c.reduce_scatter(&send, &mut recv, op)
        .unwrap_or_else(|e| panic!("{}: {e}", at("reduce_scatter")));
    expect(&at("reduce_scatter"), &recv, |i| {
        reduce_of(op, n, |q| v(q, r * count + i))
    });
}

/// The collectives that move data without reducing.
fn moving<T: Num>(c: &Communicator, cx: &Ctx, count: usize, roots: &[usize]) {
    let (n, r) = (c.size(), c.rank());
    let at = |coll: &str| format!("{}: {coll} count {count}", cx.label);

    for &root in roots {
        // Broadcast.
        let mut x: Vec<T> = fill(count, |i| if r == root { w(root, 0, i) } else { SENTINEL });
        c.broadcast(&mut x, root)
            .unwrap_or_else(|e| panic!("{} root {root}: {e}", at("broadcast")));
        expect(&format!("{} root {root}", at("broadcast")), &x, |i| {
            w(root, 0, i)
        });

        // Gather.
        let send: Vec<T> = fill(count, |i| w(r, root, i));
        let mut recv: Vec<T> = fill(if r == root { n * count } else { 0 }, |_| SENTINEL);
        c.gather(&send, &mut recv, root)
            .unwrap_or_else(|e| panic!("{} root {root}: {e}", at("gather")));
        if r == root {
            expect(&format!("{} root {root}", at("gather")), &recv, |j| {
                w(j / count.max(1), root, j % count.max(1))
            });
        }

        // Scatter.
        let send: Vec<T> = fill(if r == root { n * count } else { 0 }, |j| {
            w(root, j / count.max(1), j % count.max(1))
        });
        let mut recv: Vec<T> = fill(count, |_| SENTINEL);
        c.scatter(&send, &mut recv, root)
            .unwrap_or_else(|e| panic!("{} root {root}: {e}", at("scatter")));
        expect(&format!("{} root {root}", at("scatter")), &recv, |i| {
            w(root, r, i)
        });
    }

    // AllGather.
    let send: Vec<T> = fill(count, |i| v(r, i));
    let mut recv: Vec<T> = fill(n * count, |_| SENTINEL);
    c.all_gather(&send, &mut recv)
        .unwrap_or_else(|e| panic!("{}: {e}", at("all_gather")));
    expect(&at("all_gather"), &recv, |j| {
        v(j / count.max(1), j % count.max(1))
    });

    // AllToAll: block p of the send buffer goes to rank p.
    let send: Vec<T> = fill(n * count, |j| w(r, j / count.max(1), j % count.max(1)));
    let mut recv: Vec<T> = fill(n * count, |_| SENTINEL);
    c.all_to_all(&send, &mut recv)
        .unwrap_or_else(|e| panic!("{}: {e}", at("all_to_all")));
    expect(&at("all_to_all"), &recv, |j| {
        w(j / count.max(1), r, j % count.max(1))
    });

    // AllToAllV: rank s sends cnt(s, d) elements to d; blocks are laid out
    // with gaps (1 element in send, 2 in recv) that must stay untouched.
    let cnt = |s: usize, d: usize| (s + 2 * d) % 3 + count;
    let send_counts: Vec<usize> = (0..n).map(|d| cnt(r, d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|s| cnt(s, r)).collect();
    let displs = |counts: &[usize], gap: usize| -> Vec<usize> {
        counts
            .iter()
            .scan(0, |off, &k| {
                let d = *off;
                *off += k + gap;
                Some(d)
            })
            .collect()
    };
    let send_displs = displs(&send_counts, 1);
    let recv_displs = displs(&recv_counts, 2);
    let send_len = send_displs[n - 1] + send_counts[n - 1] + 1;
    let recv_len = recv_displs[n - 1] + recv_counts[n - 1] + 2;
    let mut send: Vec<T> = fill(send_len, |_| SENTINEL + 1);
    for d in 0..n {
        for i in 0..send_counts[d] {
            send[send_displs[d] + i] = T::of(w(r, d, i));
        }
    }
    let mut recv: Vec<T> = fill(recv_len, |_| SENTINEL);
    c.all_to_all_v(
        &send,
        &send_counts,
        &send_displs,
        &mut recv,
        &recv_counts,
        &recv_displs,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", at("all_to_all_v")));
    let mut want = vec![SENTINEL; recv_len];
    for s in 0..n {
        for i in 0..recv_counts[s] {
            want[recv_displs[s] + i] = w(s, r, i);
        }
    }
    expect(&at("all_to_all_v"), &recv, |j| want[j]);

    send_recv_rings::<T>(c, cx, count, false);
    send_recv_rings::<T>(c, cx, count, true);

    c.barrier()
        .unwrap_or_else(|e| panic!("{}: {e}", at("barrier")));
}

/// Send/Recv around the rings r -> r + s for shifts 1 and n / 2 (across
/// hosts on 2 x 2), with blocking calls. `chain`: in each cycle of the
/// shift its first rank sends first and every other rank receives, then
/// sends (valid under MPI and NCCL; ranks are at different op counts when
/// their messages meet, so point-to-point messages must not be matched by
/// the communicator's op sequence). Otherwise the ranks of a cycle alternate:
/// even positions send first, odd ones receive first (cycles have even length).
fn send_recv_rings<T: Num>(c: &Communicator, cx: &Ctx, count: usize, chain: bool) {
    let (n, r) = (c.size(), c.rank());
    let mut shifts = vec![1, n / 2];
    shifts.dedup();
    for s in shifts.into_iter().filter(|&s| s > 0 && n > 1) {
        let (to, from) = ((r + s) % n, (r + n - s) % n);
        let g = gcd(n, s);
        let len = n / g;
        let pos = (0..len)
            .position(|k| (r % g + k * s) % n == r)
            .expect("r is on its cycle");
        assert!(
            chain || len & 1 == 0,
            "alternating order needs cycles of even length"
        );
        let send_first = if chain { pos == 0 } else { pos % 2 == 0 };
        let send: Vec<T> = fill(count, |i| w(r, to, i));
        let mut recv: Vec<T> = fill(count, |_| SENTINEL);
        let what = format!(
            "{}: send/recv count {count} shift {s} ({} order)",
            cx.label,
            if chain { "chain" } else { "alternating" }
        );
        let sendf = |c: &Communicator| {
            c.send(&send, to)
                .unwrap_or_else(|e| panic!("{what} send to {to}: {e}"))
        };
        if send_first {
            sendf(c);
            c.recv(&mut recv, from)
                .unwrap_or_else(|e| panic!("{what} recv from {from}: {e}"));
        } else {
            c.recv(&mut recv, from)
                .unwrap_or_else(|e| panic!("{what} recv from {from}: {e}"));
            sendf(c);
        }
        expect(&what, &recv, |i| w(from, r, i));
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Phase times, printed by rank 0 when `TUTTI_MH_VERBOSE=1`.
struct Laps {
    on: bool,
    t: Instant,
}

impl Laps {
    fn new(rank: usize) -> Laps {
        Laps {
            on: rank == 0 && std::env::var("TUTTI_MH_VERBOSE").is_ok_and(|v| v == "1"),
            t: Instant::now(),
        }
    }
    fn at(&mut self, what: &str) {
        if self.on {
            println!("  {what}: {:.3}s", self.t.elapsed().as_secs_f64());
        }
        self.t = Instant::now();
    }
}

/// Every collective on f32 and i32, sum and max, counts 0, 1, 7, roots 0
/// and n - 1; then f32 sum (and i32 max) with a big count, root n - 1
/// (1,000,003 elements, or `TUTTI_MH_BIG`).
fn rank_every_collective() {
    let t = Instant::now();
    let comm = Communicator::from_env().expect("joining the job");
    let cx = Ctx::from_env(&comm);
    check_topology(&comm, &cx);
    let n = comm.size();
    let roots: Vec<usize> = if n > 1 { vec![0, n - 1] } else { vec![0] };
    // The big count: BIG unless the launcher asks for less (forced algorithms).
    let big: usize = std::env::var("TUTTI_MH_BIG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BIG);
    let mut lap = Laps::new(comm.rank());
    for count in [0, 1, 7] {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            reducing::<f32>(&comm, &cx, count, op, &roots);
            reducing::<i32>(&comm, &cx, count, op, &roots);
        }
        moving::<f32>(&comm, &cx, count, &roots);
        moving::<i32>(&comm, &cx, count, &roots);
    }
    lap.at("small counts");
    reducing::<f32>(&comm, &cx, big, ReduceOp::Sum, &roots[roots.len() - 1..]);
    lap.at("big f32 sum");
    if big >= BIG {
        reducing::<i32>(&comm, &cx, big, ReduceOp::Max, &roots[..1]);
        lap.at("big i32 max");
    }
    moving::<f32>(&comm, &cx, big, &roots[roots.len() - 1..]);
    lap.at("big moving");
    // Asynchronous ops queue in order and complete.
    let works: Vec<_> = (0..4)
        .map(|k| comm.all_reduce_async(vec![(comm.rank() + k) as i32; 1000], ReduceOp::Sum))
        .collect();
    for (k, wk) in works.into_iter().enumerate() {
        let x = wk
            .wait()
            .unwrap_or_else(|e| panic!("{}: all_reduce_async {k}: {e}", cx.label));
        let want: usize = (0..n).map(|q| q + k).sum();
        assert!(
            x.iter().all(|&e| e == want as i32),
            "{}: all_reduce_async {k}",
            cx.label
        );
    }
    comm.barrier().expect("final barrier");
    if comm.rank() == 0 {
        println!(
            "{}: every collective correct in {:.2}s",
            cx.label,
            t.elapsed().as_secs_f64()
        );
    }
}

/// Sizes, ranks, topology and an AllReduce on sub-communicators.
fn rank_split() {
    let comm = Communicator::from_env().expect("joining the job");
    let cx = Ctx::from_env(&comm);
    check_topology(&comm, &cx);
    let (n, r) = (comm.size(), comm.rank());
    let (host, local) = (r / cx.rph, r % cx.rph);
    let l = &cx.label;

    // All ranks of one host: shared memory only (a single rank has no links).
    let by_host = comm
        .split(Some(host as u32), r as i64)
        .expect("split by host")
        .expect("a member");
    assert_eq!(
        (by_host.size(), by_host.rank()),
        (cx.rph, local),
        "{l}: split by host"
    );
    let t = by_host.topology();
    assert_eq!(t.hosts.len(), 1, "{l}: split by host sees {:?}", t.hosts);
    assert_eq!(by_host.local_size(), cx.rph);
    for q in 0..cx.rph {
        let want = (q != local).then_some(TransportKind::Shm);
        assert_eq!(
            t.transports[q], want,
            "{l}: split by host, transport to {q}"
        );
    }
    sub_all_reduce(&by_host, &format!("{l}: by host"), |q| host * cx.rph + q);

    // Rank k of every host: one rank per host, TCP only. Ranked by host
    // in reverse (key), so sub rank = hosts - 1 - host.
    let by_local = comm
        .split(Some(local as u32), -(r as i64))
        .expect("split by local rank")
        .expect("a member");
    assert_eq!(
        (by_local.size(), by_local.rank()),
        (cx.hosts, cx.hosts - 1 - host),
        "{l}: split by local rank"
    );
    let t = by_local.topology();
    assert_eq!(
        t.hosts.len(),
        cx.hosts,
        "{l}: split by local rank sees {:?}",
        t.hosts
    );
    assert_eq!(by_local.local_size(), 1);
    for q in 0..cx.hosts {
        let want = (q != by_local.rank()).then_some(TransportKind::Tcp);
        assert_eq!(
            t.transports[q], want,
            "{l}: split by local rank, transport to {q}"
        );
    }
    sub_all_reduce(&by_local, &format!("{l}: by local rank"), |q| {
        (cx.hosts - 1 - q) * cx.rph + local
    });
    // A larger op across hosts on the sub-communicator.
    let send: Vec<f32> = fill(BIG / 8, |i| v(host, i));
    let mut recv: Vec<f32> = fill(cx.hosts * (BIG / 8), |_| SENTINEL);
    by_local
        .all_gather(&send, &mut recv)
        .expect("all_gather by local rank");
    // sub rank s is host hosts - 1 - s
    expect(&format!("{l}: all_gather by local rank"), &recv, |j| {
        v(cx.hosts - 1 - j / (BIG / 8), j % (BIG / 8))
    });

    // A subset: the even ranks (on 2 x 2: one per host; on 4 x 1: hosts 0 and 2).
    let even = comm
        .split((r % 2 == 0).then_some(7), r as i64)
        .expect("split even");
    assert_eq!(even.is_some(), r % 2 == 0, "{l}: odd ranks get None");
    if let Some(e) = &even {
        assert_eq!(
            (e.size(), e.rank()),
            (n.div_ceil(2), r / 2),
            "{l}: even split"
        );
        sub_all_reduce(e, &format!("{l}: even"), |q| 2 * q);
    }

    // new_group in a given order: the last rank first.
    let order: Vec<usize> = std::iter::once(n - 1).chain(0..n - 1).collect();
    let g = comm
        .new_group(&order)
        .expect("new_group")
        .expect("every rank is in it");
    let me = order.iter().position(|&q| q == r).expect("in order");
    assert_eq!((g.size(), g.rank()), (n, me), "{l}: new_group");
    sub_all_reduce(&g, &format!("{l}: new_group"), |q| order[q]);

    // A split of a split: within the by-local-rank group, pairs of hosts.
    if cx.hosts >= 2 {
        let sr = by_local.rank();
        let pair = by_local
            .split(Some((sr / 2) as u32), sr as i64)
            .expect("split of split")
            .expect("a member");
        let pn = pair.size();
        assert_eq!(
            pn,
            if (sr / 2) * 2 + 1 < cx.hosts { 2 } else { 1 },
            "{l}: split of split size"
        );
        sub_all_reduce(&pair, &format!("{l}: split of split"), |q| {
            let sub_rank = (sr / 2) * 2 + q;
            (cx.hosts - 1 - sub_rank) * cx.rph + local
        });
    }

    // The parent still works after its children did.
    let mut x: Vec<i32> = fill(7, |i| v(r, i));
    comm.all_reduce(&mut x, ReduceOp::Max)
        .expect("parent all_reduce");
    expect(&format!("{l}: parent after splits"), &x, |i| {
        reduce_of(ReduceOp::Max, n, |q| v(q, i))
    });
    drop((by_host, by_local, even, g));
    comm.barrier().expect("final barrier");
    if r == 0 {
        println!("{l}: splits correct");
    }
}

/// AllReduce (sum, f32 and i32) on a sub-communicator whose rank q is world rank `world(q)`.
fn sub_all_reduce(c: &Communicator, what: &str, world: impl Fn(usize) -> usize) {
    let (n, r) = (c.size(), c.rank());
    assert_eq!(
        world(r),
        world_rank(),
        "{what}: sub rank {r} is not this process"
    );
    for count in [1usize, 1000, 65_537] {
        let mut x: Vec<f32> = fill(count, |i| v(world(r), i));
        c.all_reduce(&mut x, ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("{what}: all_reduce: {e}"));
        expect(
            &format!("{what}: all_reduce f32 sum count {count}"),
            &x,
            |i| (0..n).map(|q| v(world(q), i)).sum(),
        );
        let mut y: Vec<i32> = fill(count, |i| v(world(r), i));
        c.all_reduce(&mut y, ReduceOp::Max)
            .unwrap_or_else(|e| panic!("{what}: all_reduce: {e}"));
        expect(
            &format!("{what}: all_reduce i32 max count {count}"),
            &y,
            |i| (0..n).map(|q| v(world(q), i)).max().unwrap(),
        );
    }
}

fn world_rank() -> usize {
    std::env::var("TUTTI_RANK")
        .expect("TUTTI_RANK")
        .parse()
        .expect("a number")
}

// ---------------------------------------------------------------------------
// Bandwidth worker for bench/cluster.sh
// ---------------------------------------------------------------------------

/// Not a test: the rank program of `bench/cluster.sh` when `tutti perf` is
/// not built. Under `cluster.sh launch` (with `TUTTI_MH_ROLE=rank`) it
/// times each collective like nccl-tests (f32, sum, root 0, separate send
/// and receive buffers; the maximum over ranks of the average time) and
/// rank 0 prints `coll,nranks,size_bytes,time_us,algbw_GBps,busbw_GBps`.
/// Settings: `BENCH_COLLS` (comma list), `BENCH_MIN`/`BENCH_MAX` (bytes,
/// K/M/G suffixes; sizes step by 4x), `BENCH_SECS` (seconds per size).
/// Size is the buffer for all_reduce, broadcast and reduce, and the total
/// (n x per-rank part) for the others.
#[test]
#[ignore = "a benchmark worker for bench/cluster.sh, not a test"]
fn bench_worker() {
    if !is_rank() {
        println!(
            "bench_worker runs as a rank under scripts/cluster.sh launch; see bench/cluster.sh"
        );
        return;
    }
    let comm = Communicator::from_env().expect("joining the job");
    let (n, r) = (comm.size(), comm.rank());
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let bytes = |k: &str, d: &str| {
        tutti::config::parse_bytes(&env(k, d)).unwrap_or_else(|| panic!("{k}: not a size"))
    };
    let (min, max) = (bytes("BENCH_MIN", "1M"), bytes("BENCH_MAX", "64M"));
    let secs: f64 = env("BENCH_SECS", "1").parse().expect("BENCH_SECS: seconds");
    let colls = env(
        "BENCH_COLLS",
        "all_reduce,broadcast,reduce,all_gather,reduce_scatter,all_to_all,gather,scatter",
    );
    if r == 0 {
        println!("coll,nranks,size_bytes,time_us,algbw_GBps,busbw_GBps");
    }
    for coll in colls.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let mut size = min;
        while size <= max {
            // Per-rank element count (size rounded down to a multiple of 4n for the split ones).
            let whole = matches!(coll, "all_reduce" | "broadcast" | "reduce");
            let count = if whole { size / 4 } else { size / 4 / n };
            let size_b = if whole { count * 4 } else { count * 4 * n };
            let mut a = vec![1.0f32; if whole { count } else { count * n }];
            let mut b = vec![0.0f32; if whole { count } else { count * n }];
            let mut once = || match coll {
                "all_reduce" => comm.all_reduce_into(&a, &mut b, ReduceOp::Sum),
                "broadcast" => comm.broadcast(&mut a, 0),
                "reduce" => comm.reduce(&a, &mut b, ReduceOp::Sum, 0),
                "all_gather" => comm.all_gather(&a[..count], &mut b),
                "reduce_scatter" => comm.reduce_scatter(&a, &mut b[..count], ReduceOp::Sum),
                "all_to_all" => comm.all_to_all(&a, &mut b),
                "gather" => comm.gather(&a[..count], &mut b, 0),
                "scatter" => comm.scatter(&a, &mut b[..count], 0),
                other => panic!("unknown collective {other}"),
            };
            // Warm up, then agree on an iteration count that fills `secs`.
            let t = Instant::now();
            for _ in 0..2 {
                once().expect("warmup");
            }
            let mut warm = [t.elapsed().as_secs_f64() / 2.0];
            let mut tmp = warm;
            comm.all_reduce_into(&warm, &mut tmp, ReduceOp::Max)
                .expect("agree");
            warm = tmp;
            let iters = ((secs / warm[0].max(1e-6)) as usize).clamp(3, 10_000);
            comm.barrier().expect("barrier");
            let t = Instant::now();
            for _ in 0..iters {
                once().expect("timed op");
            }
            let mine = [t.elapsed().as_secs_f64() / iters as f64];
            let mut dt = [0.0f64];
            comm.all_reduce_into(&mine, &mut dt, ReduceOp::Max)
                .expect("max time");
            if r == 0 {
                let algbw = size_b as f64 / dt[0] / 1e9;
                let nf = n as f64;
                let factor = match coll {
                    "all_reduce" => 2.0 * (nf - 1.0) / nf,
                    "broadcast" | "reduce" => 1.0,
                    _ => (nf - 1.0) / nf,
                };
                println!(
                    "{coll},{n},{size_b},{:.1},{algbw:.4},{:.4}",
                    dt[0] * 1e6,
                    algbw * factor
                );
            }
            size *= 4;
        }
    }
}
