//! `tutti::explain` on real runs: ranks (threads of this process, over the
//! local transport) run collectives with the flight recorder's timings on
//! (`Config::trace_dir`), write their traces when destroyed, and the
//! report names the rank that arrives late as the straggler; bad trace
//! directories are errors that name the file.

use std::path::PathBuf;
use std::time::Duration;
use tutti::{Communicator, Config, ReduceOp};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tutti-explain-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `ops` AllReduces of `count` f32 on `n` thread ranks, rank `late`
/// sleeping `sleep` before each; the traces go to `dir`.
fn run(dir: &std::path::Path, n: usize, late: usize, sleep: Duration, ops: usize, count: usize) {
    let cfg = Config {
        trace_dir: Some(dir.to_path_buf()),
        timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let comms = Communicator::init_all_with(n, cfg).expect("init_all_with");
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let mut x = vec![1.0f32; count];
                for _ in 0..ops {
                    if c.rank() == late {
                        std::thread::sleep(sleep);
                    }
                    c.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce");
                    x.fill(1.0);
                }
                // Dropped here: each rank writes its trace.
            });
        }
    });
}

#[test]
fn names_the_rank_that_arrives_late() {
    let dir = temp_dir("late");
    // 64 KiB calls: every one is timed (smaller ones one in 16).
    run(&dir, 3, 1, Duration::from_millis(3), 20, 16384);
    let r = tutti::explain::explain(&dir, None).expect("explain");
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert_eq!(r.ranks, 3);
    assert_eq!((r.ops, r.timed_ops), (20, 20), "{:?}", r.notes);
    assert_eq!(r.stragglers.straggler, Some(1), "{:?}", r.stragglers);
    let l = &r.stragglers.ranks[1];
    assert!(l.last >= 15, "{l:?}");
    // Slept 3 ms before each op: the others waited for it, by about that.
    assert!(l.median_late_us > 1000.0, "{l:?}");
    assert!(r.wait_us > 0.5 * r.comm_us, "{r:?}");
    let g = &r.groups[0];
    assert_eq!(
        (g.collective.as_str(), g.calls, g.bytes),
        ("all_reduce", 20, 65536)
    );
    assert!(g.model_us.is_some() && g.model_best.is_some(), "{g:?}");
    // Waiting for rank 1 is the first what-if.
    assert!(
        r.what_ifs[0].what.contains("stragglers"),
        "{:?}",
        r.what_ifs
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_trace_directories_name_the_file() {
    let dir = temp_dir("bad");
    run(&dir, 2, 0, Duration::ZERO, 3, 8);
    // Calls of 8 B: one in 16 timed, by sequence number (here op 0).
    let r = tutti::explain::explain(&dir, None).expect("explain");
    assert_eq!((r.ops, r.timed_ops), (3, 1), "{r:?}");
    assert_eq!(
        (r.groups[0].calls, r.groups[0].timed_calls),
        (3, 1),
        "{r:?}"
    );
    let f1 = dir.join("tutti-trace-rank1.json");
    let text = std::fs::read_to_string(&f1).unwrap();
    // Truncated JSON.
    std::fs::write(&f1, &text[..text.len() / 2]).unwrap();
    let e = tutti::explain::explain(&dir, None).unwrap_err();
    assert!(
        e.contains("tutti-trace-rank1.json") && e.contains("not a tutti trace"),
        "{e}"
    );
    // A missing rank's file.
    std::fs::remove_file(&f1).unwrap();
    let e = tutti::explain::explain(&dir, None).unwrap_err();
    assert!(
        e.contains("tutti-trace-rank1.json") && e.contains("missing"),
        "{e}"
    );
    // No traces at all.
    let empty = temp_dir("empty");
    let e = tutti::explain::explain(&empty, None).unwrap_err();
    assert!(e.contains("no tutti-trace-rank"), "{e}");
    // Not a directory.
    let e = tutti::explain::explain(&dir.join("nosuch"), None).unwrap_err();
    assert!(e.contains("nosuch"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&empty);
}
