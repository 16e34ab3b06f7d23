//! `tutti`: the command-line face of the tutti collective library.
//!
//! * `tutti run -n N -- PROGRAM ARGS...` starts N local ranks, like
//!   `torchrun --standalone` (see [`launch`]).
//! * `tutti perf [COLLECTIVE]` measures collectives in the style of
//!   nccl-tests (see [`perf`]).
//! * `tutti topo` prints what a communicator found: hosts, local ranks,
//!   transports, interfaces and the tuner's choices (see [`topo`]).
//! * `tutti sim CLUSTER [WORKLOAD]` predicts collectives and training steps
//!   on a described cluster (see [`sim`]).
//! * `tutti explain RUN.json --cluster CLUSTER` reads a `tutti perf
//!   --json` run and says how close it came to its links (see [`explain`]).
//! * `tutti trace DIR` reads the flight-recorder files that ranks wrote to
//!   `TUTTI_TRACE_DIR` after a failure and says which rank is behind.
//!
//! `docs/cli.md` documents every flag with sample output.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod explain;
mod launch;
mod perf;
mod plot;
mod sim;
mod topo;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// The `tutti` command line.
#[derive(Parser, Debug)]
#[command(
    name = "tutti",
    version,
    about = "Collective communication for CPU processes: launch ranks, measure collectives, inspect topology."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start N local ranks of PROGRAM (like `torchrun --standalone`).
    Run(launch::RunArgs),
    /// Measure collectives in the nccl-tests style (time, algbw, busbw, #wrong).
    Perf(Box<perf::PerfArgs>),
    /// Print hosts, local ranks, transports, interfaces and algorithm choices.
    Topo(topo::TopoArgs),
    /// Predict collectives or a training step on a described cluster (file or preset).
    Sim(Box<sim::SimArgs>),
    /// Explain a `tutti perf --json` run against the model of its cluster's links.
    Explain(explain::ExplainArgs),
    /// Read the flight-recorder files in DIR (from TUTTI_TRACE_DIR) and say which rank is behind.
    Trace(TraceArgs),
}

/// Arguments of `tutti trace`.
#[derive(clap::Args, Debug)]
struct TraceArgs {
    /// The directory the ranks wrote `tutti-trace-rank<R>.json` files to.
    dir: std::path::PathBuf,
    /// Also list each rank's recorded ops.
    #[arg(short, long)]
    verbose: bool,
}

fn trace(a: TraceArgs) -> Result<i32, String> {
    let r = tutti::trace::analyze(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    if r.traces.is_empty() {
        return Err(format!(
            "no tutti-trace-rank*.json files in {}; set TUTTI_TRACE_DIR for the job",
            a.dir.display()
        ));
    }
    println!("{}", r.summary);
    if a.verbose {
        for t in &r.traces {
            println!("\nrank {} ({} ops recorded):", t.rank, t.ops.len());
            for o in &t.ops {
                println!(
                    "  #{:<6} {:<15} count {:<10} {:<5} {:<4} {:<17} {:?}",
                    o.seq, o.op, o.count, o.dtype, o.redop, o.algorithm, o.state
                );
            }
        }
    }
    Ok(0)
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Perf(_) | Cmd::Topo(_) | Cmd::Sim(_)) {
        // `tutti perf | head` should end quietly, as other Unix tools do,
        // rather than panic on a closed stdout.
        // SAFETY: restoring the default action of a signal has no preconditions.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let r = match cli.cmd {
        Cmd::Run(a) => launch::main(a),
        Cmd::Perf(a) => perf::main(*a),
        Cmd::Topo(a) => topo::main(a),
        Cmd::Sim(a) => sim::main(*a),
        Cmd::Explain(a) => explain::main(a),
        Cmd::Trace(a) => trace(a),
    };
    match r {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(msg) => {
            eprintln!("tutti: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Logs go to stderr; `TUTTI_LOG` or `RUST_LOG` set the filter (default `warn`).
// The command's own log filter, not a library setting: read before any
// subcommand runs, and a malformed library variable (an error from
// `tutti::Config::from_env`) must not silence the logs that report it.
#[allow(clippy::disallowed_methods)]
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("TUTTI_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}
