//! Pricing calls on a described cluster: the one rule `tutti sim` and
//! `tutti explain` share. A call is priced by the fabric simulation
//! ([`super::fabric`]) of every rank's schedule, except small direct calls
//! on one host, which go through the one-shot mailboxes and are priced as
//! the tuner prices them ([`cost::predict_mailbox`]); every algorithm gets
//! its best pipeline chunk count by the tuner's rule
//! ([`search_chunks`](super::price::search_chunks)); algorithms are ranked
//! cheapest first, and Auto's pick among them is the tuner's
//! ([`HIER_SLACK`](super::HIER_SLACK)).
//!
//! What differs between the two callers stays with them: which problem a
//! call is (hosts, wire type), which algorithms are candidates, and
//! whether prices are cached.

use super::cost;
use super::fabric::{simulate, Fabric, SimStats};
use super::CostModel;
use crate::algo::{Algorithm, Problem};

/// One algorithm priced with its chunk count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Priced {
    /// The algorithm.
    pub alg: Algorithm,
    /// Pipeline chunks ([`Problem::chunks`]).
    pub chunks: usize,
    /// What the simulation found.
    pub stats: SimStats,
}

/// `alg` on `p` (its chunk count as it stands) on `fabric` with `model`'s
/// rates, ranks being threads of one process if `threads`; `None` if `alg`
/// does not implement `p`'s collective.
pub fn price(
    model: &CostModel,
    fabric: &Fabric,
    threads: bool,
    p: &Problem,
    elem: usize,
    alg: Algorithm,
) -> Option<SimStats> {
    let n = p.nranks;
    let one_host = fabric.host_of.iter().all(|&h| h == fabric.host_of[0]);
    if alg == Algorithm::Direct && one_host && n > 1 {
        // One host: small direct calls go through the one-shot mailboxes,
        // priced as the tuner prices them.
        if let Some(us) = cost::predict_mailbox(model, p, elem) {
            let b = (p.count * elem) as f64;
            return Some(SimStats {
                us,
                net_bytes: 0.0,
                host_bytes: b * (n - 1) as f64 * n as f64,
                messages: 0,
            });
        }
    }
    let scheds = cost::schedules(p, alg)?;
    Some(simulate(model, &scheds, elem, fabric, threads))
}

/// `alg` on `p` with its best chunk count
/// ([`search_chunks`](super::price::search_chunks)); `price` prices `p`
/// with a given chunk count (normally [`price`], perhaps cached).
pub fn best_chunks(
    p: &Problem,
    elem: usize,
    alg: Algorithm,
    price: impl FnMut(&Problem) -> Option<SimStats>,
) -> Option<Priced> {
    let (chunks, stats) = super::price::search_chunks(p, elem, alg, price, |s| s.us)?;
    Some(Priced { alg, chunks, stats })
}

/// Every algorithm of `among` that `best` prices with a finite time,
/// cheapest first (ties keep `among`'s order).
pub fn rank(among: &[Algorithm], best: impl FnMut(Algorithm) -> Option<Priced>) -> Vec<Priced> {
    let mut v: Vec<Priced> = among
        .iter()
        .copied()
        .filter_map(best)
        .filter(|x| x.stats.us.is_finite())
        .collect();
    v.sort_by(|x, y| x.stats.us.total_cmp(&y.stats.us));
    v
}

/// Auto's pick in `v` (cheapest first) on `fabric`: the cheapest, or a
/// hierarchical schedule priced within [`HIER_SLACK`](super::HIER_SLACK)
/// of it, or where the fabric has several hosts a streaming one within
/// [`STREAM_SLACK`](super::STREAM_SLACK), as
/// [`choose_with`](super::choose_with) picks.
pub fn auto_pick(v: &[Priced], fabric: &Fabric) -> Option<Priced> {
    super::price::pick_among(v, fabric.nhosts() > 1, |x| (x.alg, x.stats.us)).map(|i| v[i])
}
