//! End-to-end tests of the `tutti` command: real processes, real exit codes
//! and signals, real collectives over shared memory.

use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TUTTI: &str = env!("CARGO_BIN_EXE_tutti");

/// Multi-rank jobs share two cores; running them one at a time keeps each fast.
static SERIAL: Mutex<()> = Mutex::new(());

fn tutti(args: &[&str]) -> (Output, Duration) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let out = Command::new(TUTTI)
        .args(args)
        .env_remove("TUTTI_RANK")
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .output()
        .expect("tutti runs");
    (out, t.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    )
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tutti-cli-{}-{name}", std::process::id()))
}

#[test]
fn run_returns_the_exit_code() {
    let (o, _) = tutti(&["run", "-n", "2", "--", "sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let (o, _) = tutti(&["run", "-n", "2", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let (o, _) = tutti(&["run", "-n", "1", "--", "/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(127), "{}", show(&o));
}

#[test]
fn run_sets_the_environment_and_prefixes_lines() {
    let script = "echo out $TUTTI_RANK/$TUTTI_WORLD_SIZE $RANK/$WORLD_SIZE $LOCAL_RANK $MASTER_ADDR ${#TUTTI_TOKEN}; \
                  [ \"$TUTTI_MASTER_PORT\" = \"$MASTER_PORT\" ] && echo err $TUTTI_LOCAL_WORLD_SIZE >&2";
    let (o, _) = tutti(&["run", "-n", "3", "--", "sh", "-c", script]);
    assert!(o.status.success(), "{}", show(&o));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    for r in 0..3 {
        assert!(
            out.contains(&format!("[rank {r}] out {r}/3 {r}/3 {r} 127.0.0.1 32\n")),
            "{}",
            show(&o)
        );
        assert!(err.contains(&format!("[rank {r}] err 3\n")), "{}", show(&o));
    }
}

#[test]
fn a_killed_rank_stops_the_others() {
    let script = "if [ $TUTTI_RANK = 1 ]; then kill -9 $$; fi; sleep 100";
    let (o, dt) = tutti(&["run", "-n", "3", "--", "sh", "-c", script]);
    assert_eq!(o.status.code(), Some(128 + 9), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("rank 1 killed by signal 9 (SIGKILL)"),
        "{}",
        show(&o)
    );
    assert!(dt < Duration::from_secs(10), "took {dt:?}");
}

#[test]
fn ranks_that_ignore_sigterm_get_sigkill() {
    // `trap "" TERM` is inherited by sleep, so only SIGKILL ends it.
    let script = "trap '' TERM; if [ $TUTTI_RANK = 0 ]; then sleep 0.2; exit 5; fi; sleep 100";
    let (o, dt) = tutti(&["run", "-n", "3", "--grace", "0.5", "--", "sh", "-c", script]);
    assert_eq!(o.status.code(), Some(5), "{}", show(&o));
    assert!(text(&o.stderr).contains("sending SIGKILL"), "{}", show(&o));
    assert!(dt < Duration::from_secs(10), "took {dt:?}");
}

/// Asserts that a perf run checked every table and found nothing wrong.
fn assert_all_correct(o: &Output, tables: usize) {
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", show(o));
    assert_eq!(
        out.matches("# Out of bounds values : 0 OK").count(),
        tables,
        "{}",
        show(o)
    );
    assert!(!out.contains("FAILED"), "{}", show(o));
}

#[test]
fn perf_checks_every_collective_with_three_ranks() {
    let (o, _) = tutti(&[
        "perf", "all", "-n", "3", "-b", "8", "-e", "8K", "-f", "4", "-w", "1", "-i", "3",
    ]);
    assert_all_correct(&o, 10);
    let out = text(&o.stdout);
    for k in [
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "gather",
        "scatter",
        "barrier",
        "send_recv",
    ] {
        assert!(
            out.contains(&format!("\n# {k}\n")),
            "{k} missing\n{}",
            show(&o)
        );
    }
}

#[test]
fn perf_checks_every_collective_with_two_ranks_and_other_types() {
    let (o, _) = tutti(&[
        "perf", "all", "-n", "2", "-e", "4K", "-f", "8", "-w", "1", "-i", "2", "-d", "i32", "-o",
        "max",
    ]);
    assert_all_correct(&o, 10);
    let (o, _) = tutti(&[
        "perf",
        "all_reduce",
        "-n",
        "2",
        "-e",
        "64K",
        "-f",
        "16",
        "-d",
        "bf16",
        "-o",
        "avg",
    ]);
    assert_all_correct(&o, 1);
    let (o, _) = tutti(&[
        "perf",
        "reduce_scatter",
        "-n",
        "3",
        "-e",
        "4K",
        "-f",
        "8",
        "-d",
        "i8",
        "-o",
        "prod",
    ]);
    assert_all_correct(&o, 1);
}

#[test]
fn perf_writes_csv_json_and_plots() {
    let (csv, json, svg) = (tmp("p.csv"), tmp("p.json"), tmp("p.svg"));
    let (o, _) = tutti(&[
        "perf",
        "all_gather",
        "-n",
        "2",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "4",
        "-i",
        "2",
        "--csv",
        csv.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_all_correct(&o, 1);
    let c = std::fs::read_to_string(&csv).unwrap();
    let mut lines = c.lines();
    assert!(lines.next().unwrap().starts_with(
        "label,coll,nranks,size_bytes,count,iters,time_us,algbw_GBps,busbw_GBps,wrong"
    ));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 4, "{c}"); // 1K, 4K, 16K, 64K
    assert!(rows[0].starts_with("tutti,all_gather,2,1024,128,2,"), "{c}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["rows"].as_array().unwrap().len(), 4);
    assert_eq!(j["rows"][0]["wrong"], 0);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    // And a plot from the CSV alone.
    let svg2 = tmp("q.svg");
    let (o, _) = tutti(&[
        "perf",
        "--plot",
        svg2.to_str().unwrap(),
        "--plot-from",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(std::fs::read_to_string(&svg2)
        .unwrap()
        .contains("tutti all_gather n=2"));
    for p in [csv, json, svg, svg2] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn perf_under_tutti_run_prints_from_rank_zero_only() {
    let (o, _) = tutti(&["run", "-n", "2", "--", TUTTI, "perf", "-e", "64", "-i", "2"]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(
        out.contains("[rank 0] # tutti perf all_reduce: 2 ranks"),
        "{}",
        show(&o)
    );
    assert!(!out.contains("[rank 1]"), "{}", show(&o));
}

#[test]
fn perf_rejects_bad_arguments() {
    let (o, _) = tutti(&["perf", "allreduc"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("unknown collective"),
        "{}",
        show(&o)
    );
    let (o, _) = tutti(&["perf", "-b", "1M", "-e", "1K"]);
    assert!(!o.status.success());
    let (o, _) = tutti(&["perf", "-n", "2", "-r", "5", "-e", "8"]);
    assert!(!o.status.success(), "{}", show(&o));
}

#[test]
fn topo_prints_and_saves_the_topology() {
    let json = tmp("topo.json");
    let (o, _) = tutti(&["topo", "-n", "2", "--json", json.to_str().unwrap()]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    for s in [
        "hosts",
        "transports",
        "interfaces",
        "algorithm per collective",
        "predicted time",
        "all_reduce",
        "shm",
    ] {
        assert!(out.contains(s), "{s} missing\n{}", show(&o));
    }
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["nranks"], 2);
    assert_eq!(j["transports"][1], "shm");
    let _ = std::fs::remove_file(json);
}
