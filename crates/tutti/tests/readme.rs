//! The README's example, compiled and run as a test; `readme_is_in_sync`
//! checks that README.md shows exactly the code between the markers below.

// README-BEGIN
use tutti::{Communicator, ReduceOp};

fn main() -> tutti::Result<()> {
    // Four ranks as four threads of this process. In a job of processes, each
    // one calls `Communicator::from_env()` instead (under `tutti run`,
    // torchrun, Slurm or mpirun).
    let comms = Communicator::init_all(4)?;
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || -> tutti::Result<()> {
                // Every rank contributes its rank; AllReduce sums: 0+1+2+3.
                let mut grad = vec![comm.rank() as f32; 1 << 20];
                comm.all_reduce(&mut grad, ReduceOp::Sum)?;
                assert!(grad.iter().all(|&x| x == 6.0));

                // Rank 0's parameters reach everybody.
                let mut params = vec![comm.rank() as u8; 1000];
                comm.broadcast(&mut params, 0)?;
                assert!(params.iter().all(|&x| x == 0));

                // Asynchronous: the Work owns the buffer until the op is done.
                let work = comm.all_reduce_async(grad, ReduceOp::Avg);
                let grad = work.wait()?;
                assert!(grad.iter().all(|&x| x == 6.0));
                Ok(())
            });
        }
    });
    Ok(())
}
// README-END

#[test]
fn readme_example_runs() {
    main().expect("the README example");
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let a = s.find(start).unwrap_or_else(|| panic!("no {start:?}")) + start.len();
    let b = a + s[a..]
        .find(end)
        .unwrap_or_else(|| panic!("no {end:?} after {start:?}"));
    &s[a..b]
}

#[test]
fn readme_is_in_sync() {
    let me = include_str!("readme.rs");
    let code = between(me, "// README-BEGIN\n", "// README-END");
    let readme = include_str!("../../../README.md");
    let shown = between(readme, "```rust\n", "```");
    assert_eq!(
        shown.trim(),
        code.trim(),
        "README.md's example differs from crates/tutti/tests/readme.rs: copy the code between the README markers into README.md"
    );
}
