//! Pricing one call on a described cluster: every algorithm that implements
//! it, each with its best pipeline chunk count, through the fabric
//! simulation ([`tutti::tune::fabric`]), and Auto's pick among them by the
//! tuner's own rule ([`tutti::tune::HIER_SLACK`]).

use super::cluster::Checked;
use tutti::algo::Problem;
use tutti::tune::fabric::{simulate, SimStats};
use tutti::tune::{cost, CHUNK_CHOICES, HIER_SLACK};
use tutti::{Algorithm, Collective};

/// One priced algorithm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Priced {
    /// The algorithm.
    pub alg: Algorithm,
    /// Pipeline chunks.
    pub chunks: usize,
    /// What the simulation found.
    pub stats: SimStats,
}

/// Smallest chunk tried, bytes (as the tuner: `tune::price`).
const MIN_CHUNK_BYTES: usize = 16 << 10;

/// The problem rank 0 poses.
pub(crate) fn problem(c: &Checked, coll: Collective, count: usize, chunks: usize) -> Problem {
    let mut p = Problem::new(coll, c.nranks(), 0, count);
    p.chunks = chunks;
    p.hosts = c.hosts_arg();
    p
}

/// `alg` on the call with `chunks` pipeline chunks, or `None` if it does
/// not implement the collective.
pub(crate) fn price_one(
    c: &Checked,
    coll: Collective,
    count: usize,
    elem: usize,
    alg: Algorithm,
    chunks: usize,
) -> Option<SimStats> {
    // What-ifs and scaling tables price the same call many times.
    thread_local! {
        static MEMO: std::cell::RefCell<std::collections::HashMap<String, Option<SimStats>>> =
            Default::default();
    }
    let key = format!("{c:?}|{coll:?}|{count}|{elem}|{alg}|{chunks}");
    if let Some(v) = MEMO.with(|m| m.borrow().get(&key).copied()) {
        return v;
    }
    let v = price_uncached(c, coll, count, elem, alg, chunks);
    MEMO.with(|m| m.borrow_mut().insert(key, v));
    v
}

fn price_uncached(
    c: &Checked,
    coll: Collective,
    count: usize,
    elem: usize,
    alg: Algorithm,
    chunks: usize,
) -> Option<SimStats> {
    let p = problem(c, coll, count, chunks);
    if alg == Algorithm::Direct && c.hosts == 1 && c.nranks() > 1 {
        // One host: small direct calls go through the one-shot mailboxes,
        // priced as the tuner prices them.
        if let Some(us) = cost::predict_mailbox(&c.model, &p, elem) {
            let b = (count * elem) as f64;
            return Some(SimStats {
                us,
                net_bytes: 0.0,
                host_bytes: b * (c.nranks() - 1) as f64 * c.nranks() as f64,
                messages: 0,
            });
        }
    }
    let scheds = cost::schedules(&p, alg)?;
    Some(simulate(&c.model, &scheds, elem, &c.fabric(), false))
}

/// `alg` with its best chunk count (the tuner's rule: a finer cut must win
/// by 3%).
pub(crate) fn best_chunks(
    c: &Checked,
    coll: Collective,
    count: usize,
    elem: usize,
    alg: Algorithm,
) -> Option<Priced> {
    let mut best = Priced {
        alg,
        chunks: 1,
        stats: price_one(c, coll, count, elem, alg, 1)?,
    };
    let bytes = count * elem;
    if bytes < 2 * MIN_CHUNK_BYTES || alg == Algorithm::Ring {
        return Some(best);
    }
    let steps = |k| {
        alg.build(&problem(c, coll, count, k))
            .map(|s| s.steps.len())
    };
    if steps(2) == steps(1) {
        return Some(best);
    }
    for k in CHUNK_CHOICES.into_iter().skip(1) {
        if bytes / k < MIN_CHUNK_BYTES {
            break;
        }
        if let Some(s) = price_one(c, coll, count, elem, alg, k) {
            if s.us < best.stats.us * 0.97 {
                best = Priced {
                    alg,
                    chunks: k,
                    stats: s,
                };
            }
        }
    }
    Some(best)
}

/// Every algorithm of `among` that implements the call, cheapest first
/// (ties keep `among`'s order).
pub(crate) fn rank(
    c: &Checked,
    coll: Collective,
    count: usize,
    elem: usize,
    among: &[Algorithm],
) -> Vec<Priced> {
    let mut v: Vec<Priced> = among
        .iter()
        .filter_map(|&a| best_chunks(c, coll, count, elem, a))
        .filter(|x| x.stats.us.is_finite())
        .collect();
    v.sort_by(|x, y| x.stats.us.total_cmp(&y.stats.us));
    v
}

/// Auto's pick in `v` (cheapest first): the cheapest, or a hierarchical
/// schedule priced within [`HIER_SLACK`] of it (`tune::choose_with`).
pub(crate) fn auto_pick(v: &[Priced]) -> Option<Priced> {
    let best = v.first()?;
    Some(
        v.iter()
            .find(|x| x.alg.is_hierarchical() && x.stats.us <= best.stats.us * (1.0 + HIER_SLACK))
            .copied()
            .unwrap_or(*best),
    )
}

/// The algorithms `tutti sim` considers: every flat one and every
/// hierarchical level choice ([`Algorithm::VARIANTS`]); above 256 ranks
/// only the default hierarchical levels and not direct nor two-shot (whose
/// n x n messages never win there, and take minutes to build), to keep
/// thousands of ranks in tens of seconds.
pub(crate) fn candidates(nranks: usize) -> Vec<Algorithm> {
    let mut v: Vec<Algorithm> = Algorithm::VARIANTS.to_vec();
    if nranks > 256 {
        v.retain(|&a| a != Algorithm::Direct && a != Algorithm::TwoShot);
        let mut seen = false;
        v.retain(|a| {
            if !a.is_hierarchical() {
                return true;
            }
            let keep = !seen;
            seen = true;
            keep
        });
    }
    v
}

/// Auto's pick for the call, with every algorithm it priced (cheapest
/// first); `None` if nothing implements it.
pub(crate) fn auto(
    c: &Checked,
    coll: Collective,
    count: usize,
    elem: usize,
) -> Option<(Priced, Vec<Priced>)> {
    let v = rank(c, coll, count, elem, &candidates(c.nranks()));
    Some((auto_pick(&v)?, v))
}

/// `alg:chunks` as tables print it (`tree/4`).
pub(crate) fn label(p: &Priced) -> String {
    if p.chunks > 1 {
        format!("{}/{}", p.alg, p.chunks)
    } else {
        p.alg.to_string()
    }
}
