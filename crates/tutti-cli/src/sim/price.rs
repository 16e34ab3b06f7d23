//! Pricing one call on a described cluster: every algorithm that implements
//! it, each with its best pipeline chunk count, through the fabric
//! simulation, and Auto's pick among them by the tuner's own rule. The
//! rule is the library's ([`tutti::tune::fabric_price`], which `tutti
//! explain` uses too); what is `tutti sim`'s own here: the problem a
//! cluster poses, the candidates, and a cache of prices.

use super::cluster::Checked;
use tutti::algo::Problem;
use tutti::tune::fabric::SimStats;
use tutti::tune::fabric_price;
use tutti::{Algorithm, Collective};

/// One priced algorithm.
pub(crate) use tutti::tune::fabric_price::Priced;

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
    fabric_price::price(&c.model, &c.fabric(), false, &p, elem, alg)
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
    fabric_price::best_chunks(&problem(c, coll, count, 1), elem, alg, |q| {
        price_one(c, coll, count, elem, alg, q.chunks)
    })
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
    fabric_price::rank(among, |a| best_chunks(c, coll, count, elem, a))
}

/// Auto's pick in `v` (cheapest first) on `c`: the cheapest, or a
/// hierarchical schedule priced within `HIER_SLACK` of it, or across hosts
/// a streaming one within `STREAM_SLACK` (`tune::choose_with`).
pub(crate) fn auto_pick(c: &Checked, v: &[Priced]) -> Option<Priced> {
    fabric_price::auto_pick(v, &c.fabric())
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
    Some((auto_pick(c, &v)?, v))
}

/// `alg:chunks` as tables print it (`tree/4`).
pub(crate) fn label(p: &Priced) -> String {
    if p.chunks > 1 {
        format!("{}/{}", p.alg, p.chunks)
    } else {
        p.alg.to_string()
    }
}
