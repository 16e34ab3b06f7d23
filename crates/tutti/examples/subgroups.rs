//! Node-local and cross-node groups, as in HCCL's `create_subgroups()`:
//! ranks on one host form a "node" group; ranks with the same local rank
//! across hosts form a "cross" group. Run under `tutti run -n 4`.

use tutti::{Communicator, ReduceOp};

fn main() -> tutti::Result<()> {
    let world = Communicator::from_env()?;
    let host = world.topology().host_of[world.rank()] as u32;
    // The two lines: one group per host, one per local rank.
    let node = world
        .split(Some(host), world.rank() as i64)?
        .expect("member");
    let cross = world
        .split(Some(world.local_rank() as u32), world.rank() as i64)?
        .expect("member");

    let mut x = [world.rank() as i64];
    node.all_reduce(&mut x, ReduceOp::Sum)?;
    let mut y = [world.rank() as i64];
    cross.all_reduce(&mut y, ReduceOp::Sum)?;
    // Odd ranks only, through new_group.
    let odd: Vec<usize> = (1..world.size()).step_by(2).collect();
    let g = world.new_group(&odd)?;
    let mut z = [1i32];
    if let Some(g) = &g {
        g.all_reduce(&mut z, ReduceOp::Sum)?;
    }
    println!(
        "rank {}: node group {}/{} sum {}, cross group {}/{} sum {}, odd group {}",
        world.rank(),
        node.rank(),
        node.size(),
        x[0],
        cross.rank(),
        cross.size(),
        y[0],
        g.map_or("-".to_string(), |g| format!(
            "{}/{} count {}",
            g.rank(),
            g.size(),
            z[0]
        ))
    );
    Ok(())
}
