//! Measuring the cost model's parameters when a communicator is created.
//!
//! Rank 0 decides and broadcasts, so every rank ends with the same
//! parameters (and so picks the same algorithms). If rank 0 has a cached
//! measurement for this host layout it is used; otherwise rank 0 and rank 1
//! (shared memory, if they share a host) and rank 0 and the first rank of
//! another host (TCP) ping-pong 8-byte messages and stream 1 MiB messages,
//! and rank 0 caches the result in `~/.cache/tutti/` (or
//! `$XDG_CACHE_HOME/tutti/`: [`Config::cost_model_cache`]) for an hour.
//! Where every rank has a core, a new measurement is merged with the
//! cached one if that is under a day old, the faster value of each
//! ([`merge_best`]). `TUTTI_CALIBRATE=0`
//! ([`Calibrate::Off`]) skips all of it and keeps the defaults;
//! `TUTTI_CALIBRATE=force` ([`Calibrate::Force`]) measures even with a
//! cache, and replaces it.

use super::{CostModel, LinkClass, LinkCost};
use crate::algo::Algorithm;
use crate::comm::Options;
use crate::config::{Calibrate, Config};
use crate::error::Result;
use crate::transport::mailbox::MBOX_BYTES;
use crate::{Collective, Communicator, ReduceOp};
use std::path::PathBuf;
use std::time::Instant;

/// The cache file of host layout `key` in `dir`.
fn cache_path(dir: &std::path::Path, key: &str) -> PathBuf {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    dir.join(format!("costmodel-{h:016x}.json"))
}

/// Seconds since `p` was written, where it can be told.
fn age_secs(p: &PathBuf) -> Option<u64> {
    let t = std::fs::metadata(p).and_then(|m| m.modified()).ok()?;
    Some(t.elapsed().ok()?.as_secs())
}

/// A cached model at most this old is merged with a new measurement
/// ([`merge_best`]); an older one is replaced.
pub const MERGE_MAX_AGE_SECS: u64 = 24 * 3600;

/// The faster of two measurements of one host layout, field by field: the
/// least latencies and fixed costs, the highest rates. A busy machine only
/// ever adds time, so the best of two is nearer the links' own cost than
/// either (the ping-pong already keeps its fastest round trip). With 2
/// ranks, each on its own core, this machine measured the shared-memory
/// latency at 0.42-0.50 us (23-28 GB/s) in six runs, and at 3.0 us (the
/// bound, 10x the default) with 4.2 GB/s in another; that model, cached
/// for an hour, priced the rings' steps at 6x their cost, and online
/// tuning then never tried them where they were the fastest (ReduceScatter
/// of 32 KiB: the ring priced 7.9 us against direct's 1.8 and left out;
/// forced, the ring and halving-doubling took 1.51-1.58 us against
/// direct's 1.67-1.76 in four runs, 2026-12-03). Not where ranks share
/// cores: there the fastest round trip is one where the two ranks ran on
/// separate cores, which collectives among more ranks than cores do not
/// get.
pub fn merge_best(a: &CostModel, b: &CostModel) -> CostModel {
    let link = |x: &LinkCost, y: &LinkCost| LinkCost {
        alpha_us: x.alpha_us.min(y.alpha_us),
        gbps: x.gbps.max(y.gbps),
    };
    CostModel {
        local: link(&a.local, &b.local),
        shm: link(&a.shm, &b.shm),
        tcp: link(&a.tcp, &b.tcp),
        reduce_gbps: a.reduce_gbps.max(b.reduce_gbps),
        copy_gbps: a.copy_gbps.max(b.copy_gbps),
        step_us: a.step_us.min(b.step_us),
        mailbox_us: a.mailbox_us.min(b.mailbox_us),
        mailbox_gbps: a.mailbox_gbps.max(b.mailbox_gbps),
        mailbox_reduce_gbps: a.mailbox_reduce_gbps.max(b.mailbox_reduce_gbps),
    }
}

/// The cost model for `comm`: cached, measured, or the defaults.
pub(crate) fn calibrate(comm: &Communicator, ctx_key: &str) -> Result<CostModel> {
    let config: &Config = comm.config();
    let mode = config.calibrate;
    if mode == Calibrate::Off || comm.size() < 2 {
        return Ok(CostModel::default());
    }
    let path = config
        .cost_model_cache
        .as_deref()
        .map(|dir| cache_path(dir, ctx_key));
    // Rank 0 decides: 1 = here is a cached model, 0 = measure.
    let mut blob = vec![0u8; 1024];
    if comm.rank() == 0 && mode != Calibrate::Force {
        // A cached measurement older than an hour is taken again: a machine
        // that was busy when it was measured should not steer choices for long.
        if let Some(b) = path
            .as_ref()
            .filter(|p| age_secs(p).is_some_and(|a| a < 3600))
            .and_then(|p| std::fs::read(p).ok())
        {
            if serde_json::from_slice::<CostModel>(&b).is_ok() && b.len() < blob.len() - 2 {
                blob[0] = 1;
                blob[1] = b.len() as u8;
                blob[2] = (b.len() >> 8) as u8;
                blob[3..3 + b.len()].copy_from_slice(&b);
            }
        }
    }
    comm.broadcast(&mut blob, 0)?;
    if blob[0] == 1 {
        let len = blob[1] as usize | (blob[2] as usize) << 8;
        return Ok(serde_json::from_slice(&blob[3..3 + len]).unwrap_or_default());
    }
    let mut model = CostModel::default();
    let topo = comm.topology();
    let same_host = (1..comm.size()).find(|&r| topo.host_of[r] == topo.host_of[0]);
    let other_host = (1..comm.size()).find(|&r| topo.host_of[r] != topo.host_of[0]);
    let tcp_forced = comm.config().transport == crate::config::TransportChoice::Tcp;
    for (peer, class) in [
        (
            same_host,
            if tcp_forced {
                LinkClass::Tcp
            } else {
                LinkClass::Shm
            },
        ),
        (other_host, LinkClass::Tcp),
    ] {
        let Some(peer) = peer else { continue };
        if let Some(mut c) = measure(comm, peer)? {
            // Keep measurements within 10x of the defaults: a wildly busy
            // machine measures noise, not the link.
            let d = CostModel::default().link(class);
            // Latency is kept within 10x of the default; bandwidth may be
            // far lower (a 1 Gbit/s link) but not absurdly higher.
            c.alpha_us = c.alpha_us.clamp(d.alpha_us / 10.0, d.alpha_us * 10.0);
            c.gbps = c.gbps.clamp(0.001, d.gbps * 10.0);
            match class {
                LinkClass::Shm => model.shm = c,
                LinkClass::Tcp => model.tcp = c,
                LinkClass::Local => model.local = c,
            }
        }
    }
    let one_host = topo.host_of.iter().all(|&h| h == topo.host_of[0]);
    if one_host && !tcp_forced && comm.config().mailbox {
        if let Some((us, gbps, reduce_gbps)) = measure_mailbox(comm)? {
            let d = CostModel::default();
            model.mailbox_us = us.clamp(d.mailbox_us / 10.0, d.mailbox_us * 100.0);
            model.mailbox_gbps = gbps.clamp(d.mailbox_gbps / 10.0, d.mailbox_gbps * 10.0);
            model.mailbox_reduce_gbps =
                reduce_gbps.clamp(d.mailbox_reduce_gbps / 10.0, d.mailbox_reduce_gbps * 10.0);
        }
    }
    if comm.rank() == 0 && mode != Calibrate::Force && topo.cpu_share() >= 1.0 {
        // Where every rank has a core, the best of this and the last
        // measurement (`merge_best`): one taken in a slow spell would
        // otherwise steer the next hour's choices.
        let earlier = path
            .as_ref()
            .filter(|p| age_secs(p).is_some_and(|a| a < MERGE_MAX_AGE_SECS))
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<CostModel>(&b).ok());
        if let Some(earlier) = earlier {
            model = merge_best(&model, &earlier);
        }
    }
    let mut blob = vec![0u8; 1024];
    if comm.rank() == 0 {
        let b = serde_json::to_vec(&model).expect("serialise");
        blob[1] = b.len() as u8;
        blob[2] = (b.len() >> 8) as u8;
        blob[3..3 + b.len()].copy_from_slice(&b);
        if let Some(p) = &path {
            let _ = std::fs::create_dir_all(p.parent().expect("has a parent"));
            let _ = std::fs::write(p, &b);
        }
    }
    comm.broadcast(&mut blob, 0)?;
    let len = blob[1] as usize | (blob[2] as usize) << 8;
    Ok(serde_json::from_slice(&blob[3..3 + len]).unwrap_or_default())
}

/// The mailboxes' fixed cost and rates, from batches of calls through
/// them (all ranks take part): the time of an 8-byte AllReduce; the rate
/// at which an AllGather of [`MBOX_BYTES`] per rank moves bytes beyond that
/// (each rank copies its part in and every peer's part out); and the rate
/// at which an f32 AllReduce of `MBOX_BYTES` reduces its peers' parts,
/// beyond the fixed cost and copying its own part in. Best means of a few
/// batches; rank 0's measurement, `None` elsewhere.
fn measure_mailbox(comm: &Communicator) -> Result<Option<(f64, f64, f64)>> {
    let direct = Options {
        algorithm: Some(Algorithm::Direct),
        timeout: None,
    };
    let n = comm.size();
    let part = MBOX_BYTES;
    let mut x = [0u64; 1];
    let mut mine = vec![0u8; part];
    let mut all = vec![0u8; part * n];
    let floats_in = vec![1f32; part / 4];
    let mut floats_out = vec![0f32; part / 4];
    // Best mean per call of 6 batches of `calls`, the first a warm-up.
    let best_of = |calls: u32, f: &mut dyn FnMut(u32) -> Result<()>| -> Result<f64> {
        let mut best = f64::INFINITY;
        for batch in 0..6 {
            comm.barrier()?;
            let t = Instant::now();
            for i in 0..calls {
                f(i)?;
            }
            if batch > 0 {
                best = best.min(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
            }
        }
        Ok(best)
    };
    let small = best_of(1000, &mut |_| {
        comm.all_reduce_with(&mut x, ReduceOp::Sum, &direct)
    })?;
    let gather = best_of(100, &mut |i| {
        mine[0] = i as u8; // every call's contribution differs
        let c = Collective::AllGather;
        comm.run_slices(c, ReduceOp::Sum, part, &mine, &mut all, &direct)
    })?;
    let reduce = best_of(100, &mut |_| {
        let c = Collective::AllReduce;
        comm.run_slices(
            c,
            ReduceOp::Sum,
            part / 4,
            &floats_in,
            &mut floats_out,
            &direct,
        )
    })?;
    // AllGather: each rank copies its part in and the n - 1 others out.
    let gbps = (part * n) as f64 / ((gather - small).max(1e-3) * 1e3);
    // AllReduce: its own part in, then the n - 1 others reduced.
    let copy_in = part as f64 / (gbps * 1e3);
    let reduce_gbps = (part * (n - 1)) as f64 / ((reduce - small - copy_in).max(1e-3) * 1e3);
    Ok((comm.rank() == 0).then_some((small, gbps, reduce_gbps)))
}

/// Ping-pong and streaming between rank 0 and `peer`; every rank takes part
/// in the barriers. Returns rank 0's measurement (others return `None`).
fn measure(comm: &Communicator, peer: usize) -> Result<Option<LinkCost>> {
    let me = comm.rank();
    comm.barrier()?;
    let mut out = None;
    if me == 0 || me == peer {
        let other = if me == 0 { peer } else { 0 };
        let mut small = [0u8; 8];
        // Big enough that a rate limiter's burst allowance does not flatter the link.
        let mut big = vec![0u8; 4 << 20];
        let direct = Options {
            algorithm: Some(Algorithm::Direct),
            timeout: None,
        };
        let xfer = |buf: &mut [u8], send: bool| -> Result<()> {
            let (n, sum) = (buf.len(), ReduceOp::Sum);
            if send {
                let c = Collective::Send { peer: other };
                comm.run_slices(c, sum, n, buf, &mut [], &direct)
            } else {
                let c = Collective::Recv { peer: other };
                comm.run_slices(c, sum, n, &[], buf, &direct)
            }
        };
        // Minimums, not means: a busy machine only ever adds time.
        let mut best_rtt = f64::INFINITY;
        for _ in 0..40 {
            let t = Instant::now();
            if me == 0 {
                xfer(&mut small, true)?;
                xfer(&mut small, false)?;
            } else {
                xfer(&mut small, false)?;
                xfer(&mut small, true)?;
            }
            best_rtt = best_rtt.min(t.elapsed().as_secs_f64());
        }
        let alpha_us = best_rtt * 1e6 / 2.0;
        let mut best_big = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            xfer(&mut big, me == 0)?;
            xfer(&mut small, me != 0)?; // the receiver confirms
            best_big = best_big.min(t.elapsed().as_secs_f64());
        }
        let secs = (best_big - 2.0 * alpha_us * 1e-6).max(1e-9);
        let gbps = big.len() as f64 / secs / 1e9;
        if me == 0 {
            out = Some(LinkCost {
                alpha_us: alpha_us.clamp(0.05, 10_000.0),
                gbps: gbps.clamp(0.01, 100.0),
            });
        }
    }
    comm.barrier()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measurement taken in a slow spell (latencies up, rates down) does
    /// not undo a faster one, in either order, field by field.
    #[test]
    fn merging_keeps_the_faster_value_of_each_parameter() {
        let fast = CostModel {
            shm: LinkCost {
                alpha_us: 0.45,
                gbps: 23.0,
            },
            mailbox_us: 0.12,
            ..CostModel::default()
        };
        let slow = CostModel {
            shm: LinkCost {
                alpha_us: 3.0,
                gbps: 4.2,
            },
            mailbox_us: 0.11,
            mailbox_gbps: 10.0,
            ..CostModel::default()
        };
        for m in [merge_best(&fast, &slow), merge_best(&slow, &fast)] {
            assert_eq!(m.shm.alpha_us, 0.45);
            assert_eq!(m.shm.gbps, 23.0);
            // The slow run's one faster parameter is kept too.
            assert_eq!(m.mailbox_us, 0.11);
            assert_eq!(m.mailbox_gbps, CostModel::default().mailbox_gbps);
        }
        let same = merge_best(&fast, &fast);
        assert_eq!(
            serde_json::to_string(&same).unwrap(),
            serde_json::to_string(&fast).unwrap()
        );
    }
}
