//! Measuring the cost model's parameters when a communicator is created:
//! this module drives the communicator, and hands what it timed to the
//! tuner ([`tune::calibrate`](crate::tune::calibrate)), which makes a
//! [`CostModel`] of the numbers.
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
//! ([`calibrate::merge_best`]). `TUTTI_CALIBRATE=0`
//! ([`Calibrate::Off`]) skips all of it and keeps the defaults;
//! `TUTTI_CALIBRATE=force` ([`Calibrate::Force`]) measures even with a
//! cache, and replaces it.

use super::{Communicator, Options};
use crate::algo::{Algorithm, Collective};
use crate::config::{Calibrate, Config};
use crate::error::Result;
use crate::reduce::ReduceOp;
use crate::transport::mailbox::MBOX_BYTES;
use crate::tune::{calibrate, CostModel, LinkClass, LinkCost};
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

/// The cost model for `comm`: cached, measured, or the defaults.
pub(super) fn calibrate(comm: &Communicator, ctx_key: &str) -> Result<CostModel> {
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
    let topo = comm.topology();
    let same_host = (1..comm.size()).find(|&r| topo.host_of[r] == topo.host_of[0]);
    let other_host = (1..comm.size()).find(|&r| topo.host_of[r] != topo.host_of[0]);
    let tcp_forced = comm.config().transport == crate::config::TransportChoice::Tcp;
    let mut links = Vec::new();
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
        if let Some(c) = measure(comm, peer)? {
            links.push((class, c));
        }
    }
    let one_host = topo.host_of.iter().all(|&h| h == topo.host_of[0]);
    let mailbox = if one_host && !tcp_forced && comm.config().mailbox {
        measure_mailbox(comm)?
    } else {
        None
    };
    let mut model = calibrate::model_of(&links, mailbox);
    if comm.rank() == 0 && mode != Calibrate::Force && topo.cpu_share() >= 1.0 {
        // Where every rank has a core, the best of this and the last
        // measurement (`tune::calibrate::merge_best`): one taken in a slow spell would
        // otherwise steer the next hour's choices.
        let earlier = path
            .as_ref()
            .filter(|p| age_secs(p).is_some_and(|a| a < calibrate::MERGE_MAX_AGE_SECS))
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<CostModel>(&b).ok());
        if let Some(earlier) = earlier {
            model = calibrate::merge_best(&model, &earlier);
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
/// beyond the fixed cost and copying its own part in
/// ([`calibrate::mailbox_of`]). Best means of a few batches; rank 0's
/// measurement, `None` elsewhere.
fn measure_mailbox(comm: &Communicator) -> Result<Option<(f64, f64, f64)>> {
    let direct = Options {
        algorithm: Some(Algorithm::Direct),
        timeout: None,
        wire: None,
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
    let rates = calibrate::mailbox_of(small, gather, reduce, part, n);
    Ok((comm.rank() == 0).then_some(rates))
}

/// Ping-pong and streaming between rank 0 and `peer`; every rank takes part
/// in the barriers. Returns rank 0's measurement ([`calibrate::link_of`];
/// others return `None`).
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
            wire: None,
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
        let mut best_big = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            xfer(&mut big, me == 0)?;
            xfer(&mut small, me != 0)?; // the receiver confirms
            best_big = best_big.min(t.elapsed().as_secs_f64());
        }
        if me == 0 {
            out = Some(calibrate::link_of(best_rtt, best_big, big.len()));
        }
    }
    comm.barrier()?;
    Ok(out)
}
