//! The Rust side of the ABI overhead benchmark (scripts/bench_overhead.sh):
//! a loop of small AllReduces through the Rust API, timed like
//! bench/allreduce_loop.c does through the C API.
//!
//! `tutti run -n 2 -- allreduce_loop [ITERS] [BYTES]` prints, on rank 0,
//! `rust us_per_op <t>` (the median of 20 timed blocks). With a third argument `abi` it loops over the C
//! entry point `tuttiAllReduce` instead, linked statically (the wrapper's
//! own cost, without the shared library), and prints `abi us_per_op <t>`.

/// The timed loop is cut into this many blocks; the result is the median
/// block, so that a block in which another process took the core (this is
/// a shared 2-core machine) does not decide it.
const BLOCKS: usize = 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> tutti::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(50_000);
    let bytes: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    if args.get(3).map(String::as_str) == Some("abi") {
        abi(iters, bytes);
        return Ok(());
    }
    let comm = tutti::Communicator::from_env()?;
    let mut buf = vec![1.0f32; bytes / 4];
    // Warm-up, past online tuning.
    for _ in 0..iters / 10 + 1000 {
        comm.all_reduce(&mut buf, tutti::ReduceOp::Sum)?;
    }
    comm.barrier()?;
    let mut blocks = Vec::with_capacity(BLOCKS);
    for _ in 0..BLOCKS {
        let t = std::time::Instant::now();
        for _ in 0..iters / BLOCKS {
            comm.all_reduce(&mut buf, tutti::ReduceOp::Sum)?;
        }
        blocks.push(t.elapsed().as_secs_f64() * 1e6 / (iters / BLOCKS) as f64);
    }
    let us = median(blocks);
    comm.barrier()?;
    if comm.rank() == 0 {
        println!("rust us_per_op {us:.4}");
    }
    Ok(())
}

/// The same loop through the C entry points.
fn abi(iters: usize, bytes: usize) {
    use tutti_c::*;
    let mut comm: tuttiComm_t = std::ptr::null_mut();
    let mut buf = vec![1.0f32; bytes / 4];
    let n = buf.len();
    let p = buf.as_mut_ptr() as *mut std::ffi::c_void;
    let ok = |r: tuttiResult_t| assert_eq!(r, tuttiSuccess, "a tutti call failed");
    // SAFETY: `comm` is written by init and used while live; `buf` holds
    // `n` floats for every call, which all block (NULL queue).
    unsafe {
        ok(tuttiCommInitFromEnv(&mut comm, std::ptr::null_mut()));
        let null = std::ptr::null_mut();
        for _ in 0..iters / 10 + 1000 {
            ok(tuttiAllReduce(p, p, n, tuttiFloat32, tuttiSum, comm, null));
        }
        ok(tuttiBarrier(comm, null));
        let mut blocks = Vec::with_capacity(BLOCKS);
        for _ in 0..BLOCKS {
            let t = std::time::Instant::now();
            for _ in 0..iters / BLOCKS {
                ok(tuttiAllReduce(p, p, n, tuttiFloat32, tuttiSum, comm, null));
            }
            blocks.push(t.elapsed().as_secs_f64() * 1e6 / (iters / BLOCKS) as f64);
        }
        let us = median(blocks);
        ok(tuttiBarrier(comm, null));
        let mut me = 0;
        ok(tuttiCommUserRank(comm, &mut me));
        if me == 0 {
            println!("abi us_per_op {us:.4}");
        }
        ok(tuttiCommDestroy(comm));
    }
}
