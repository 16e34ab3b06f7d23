//! The cost model from measured numbers: what the calibration
//! (`comm/calibrate.rs`, which drives a communicator) timed becomes a
//! [`CostModel`] here, kept within sane bounds of the defaults, and a new
//! model is merged with a cached one ([`merge_best`]). Nothing here
//! measures: the tuner is handed numbers.

use super::{CostModel, LinkClass, LinkCost};

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

/// A link's cost from rank 0's best ping-pong round trip of 8 bytes
/// (`best_rtt`, seconds) and best time to stream `big_bytes` and have the
/// receiver confirm (`best_big`, seconds).
pub(crate) fn link_of(best_rtt: f64, best_big: f64, big_bytes: usize) -> LinkCost {
    let alpha_us = best_rtt * 1e6 / 2.0;
    let secs = (best_big - 2.0 * alpha_us * 1e-6).max(1e-9);
    let gbps = big_bytes as f64 / secs / 1e9;
    LinkCost {
        alpha_us: alpha_us.clamp(0.05, 10_000.0),
        gbps: gbps.clamp(0.01, 100.0),
    }
}

/// The mailboxes' fixed cost (us) and rates (GB/s) from the best mean
/// times in microseconds of an 8-byte AllReduce (`small`), an AllGather of
/// `part` bytes per rank (`gather`) and an f32 AllReduce of `part` bytes
/// (`reduce`) on `n` ranks: (fixed cost, copy rate, reduce rate).
pub(crate) fn mailbox_of(
    small: f64,
    gather: f64,
    reduce: f64,
    part: usize,
    n: usize,
) -> (f64, f64, f64) {
    // AllGather: each rank copies its part in and the n - 1 others out.
    let gbps = (part * n) as f64 / ((gather - small).max(1e-3) * 1e3);
    // AllReduce: its own part in, then the n - 1 others reduced.
    let copy_in = part as f64 / (gbps * 1e3);
    let reduce_gbps = (part * (n - 1)) as f64 / ((reduce - small - copy_in).max(1e-3) * 1e3);
    (small, gbps, reduce_gbps)
}

/// The cost model of what was measured: each link class's cost, in the
/// order measured (a later one of a class wins), and the mailboxes' fixed
/// cost and rates ([`mailbox_of`]); the defaults for the rest.
pub(crate) fn model_of(
    links: &[(LinkClass, LinkCost)],
    mailbox: Option<(f64, f64, f64)>,
) -> CostModel {
    let mut model = CostModel::default();
    for &(class, mut c) in links {
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
    if let Some((us, gbps, reduce_gbps)) = mailbox {
        let d = CostModel::default();
        model.mailbox_us = us.clamp(d.mailbox_us / 10.0, d.mailbox_us * 100.0);
        model.mailbox_gbps = gbps.clamp(d.mailbox_gbps / 10.0, d.mailbox_gbps * 10.0);
        model.mailbox_reduce_gbps =
            reduce_gbps.clamp(d.mailbox_reduce_gbps / 10.0, d.mailbox_reduce_gbps * 10.0);
    }
    model
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
