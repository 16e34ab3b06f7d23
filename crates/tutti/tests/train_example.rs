//! The training example `examples/train_mlp.rs` at a small size: two real
//! processes (the launcher's `TUTTI_*` variables set here), each variant
//! of the gradient exchange (f32, bf16 and f16 wires, Top-K with error
//! feedback, with and without a dense warm-up, with momentum correction,
//! accumulation) runs to its
//! JSON line and the loss falls. Nothing is timed.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The example's binary, beside this test's (`cargo test` builds examples);
/// built here if this test runs alone.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("examples").join("train_mlp");
    if !bin.exists() {
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let profile = if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        };
        let ok = Command::new(cargo)
            .args([
                "build",
                "-p",
                "tutti",
                "--example",
                "train_mlp",
                "--profile",
                profile,
            ])
            .status()
            .expect("running cargo build");
        assert!(ok.success(), "building the example failed");
    }
    bin
}

/// Runs the example on 2 ranks with `args`; returns rank 0's JSON line.
fn run(args: &[&str]) -> String {
    let bin = example();
    let port = common::free_port().to_string();
    let children: Vec<_> = (0..2)
        .map(|r| {
            Command::new(&bin)
                .args(args)
                .env("TUTTI_RANK", r.to_string())
                .env("TUTTI_WORLD_SIZE", "2")
                .env("TUTTI_LOCAL_RANK", r.to_string())
                .env("TUTTI_MASTER_ADDR", "127.0.0.1")
                .env("TUTTI_MASTER_PORT", &port)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawning a rank")
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("waiting for a rank"))
        .collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r} of {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let out = String::from_utf8_lossy(&outs[0].stdout).to_string();
    out.lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line from {args:?}:\n{out}"))
        .to_string()
}

fn number(json: &str, key: &str) -> f64 {
    let at = json.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
    let end = json[at..].find([',', '}']).expect("a number") + at;
    json[at..end].parse().expect("a number")
}

#[test]
fn train_mlp_learns_with_every_exchange() {
    let base = ["--steps", "60", "--hidden", "64", "--quiet"];
    for extra in [
        &["--wire", "f32"][..],
        &["--wire", "bf16"],
        &["--wire", "f16"],
        &["--topk", "0.05"],
        &["--topk", "0.05", "--accum", "2"],
        &["--topk", "0.05", "--topk-warmup", "10"],
        &["--topk", "0.05", "--topk-momentum", "0.9"],
        &[
            "--topk",
            "0.05",
            "--topk-momentum",
            "0.9",
            "--topk-warmup",
            "10",
        ],
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let json = run(&args);
        assert_eq!(number(&json, "ranks"), 2.0);
        let (first, last) = (number(&json, "loss_first"), number(&json, "loss_last5"));
        assert!(
            last < 0.8 * first,
            "{extra:?}: the loss did not fall: {first} -> {last}"
        );
    }
}
