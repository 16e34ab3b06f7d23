//! Picking: the per-call choice, else `TUTTI_ALGO`, else (rank-order
//! algorithms only, where results must not depend on the pick) the cost
//! model's ranking ([`select`]).

use super::price::{
    across_hosts, best_chunks, choose_with, model_pick, rank_algorithms, rank_among,
};
use super::{AlgoOverride, Choice, TuneCtx};
use crate::algo::{Algorithm, CollKind, Collective, Problem};
use crate::error::{Error, Result};

/// Picks the algorithm for `p`: the per-call choice, else `TUTTI_ALGO`, else
/// the cost model; the chunk count is the cost model's best for the
/// algorithm picked. A forced algorithm that does not implement the
/// collective is an error for a per-call choice and ignored for a global
/// `TUTTI_ALGO`.
pub(crate) fn select(
    p: &Problem,
    dtype: crate::DataType,
    per_call: Option<Algorithm>,
    env: &AlgoOverride,
    ctx: &TuneCtx,
) -> Result<Choice> {
    Ok(select_all(p, dtype, per_call, env, ctx)?[0])
}

/// [`select`]'s choice first; where the cost model chose, the other
/// algorithms it priced follow, cheapest first.
pub(super) fn select_all(
    p: &Problem,
    dtype: crate::DataType,
    per_call: Option<Algorithm>,
    env: &AlgoOverride,
    ctx: &TuneCtx,
) -> Result<Vec<Choice>> {
    // Every rank must choose alike, and whether a rank runs in place is its
    // own affair (one may call all_reduce, another all_reduce_into): price
    // the call as out of place everywhere. The caller builds its schedule
    // with its own in-place flag.
    let p = &Problem {
        in_place: false,
        ..p.clone()
    };
    let elem = dtype.size();
    let kind = p.coll.kind();
    let implements = |a: Algorithm| {
        a.build(&Problem {
            count: 0,
            ..p.clone()
        })
        .is_some()
    };
    let forced = |a: Algorithm| {
        vec![best_chunks(p, elem, ctx, a).unwrap_or(Choice {
            algorithm: a,
            chunks: 1,
            us: f64::NAN,
            stream: false,
            cma: false,
        })]
    };
    if let Some(a) = per_call {
        if !implements(a) {
            return Err(Error::arg(format!(
                "algorithm {a} does not implement {kind}"
            )));
        }
        return Ok(forced(a));
    }
    // `all_to_all:` also covers AllToAllV: an algorithm that does only the
    // plain AllToAll (hierarchical) leaves AllToAllV calls to the tuner.
    let only_plain = |a: Algorithm| {
        p.coll == Collective::AllToAllV
            && !implements(a)
            && a.build(&Problem {
                coll: Collective::AllToAll,
                count: 0,
                vcounts: None,
                ..p.clone()
            })
            .is_some()
    };
    if let Some(a) = env.per_coll.get(&kind).filter(|&&a| !only_plain(a)) {
        if !implements(*a) {
            return Err(Error::Config(format!(
                "TUTTI_ALGO forces {a} for {kind}, which it does not implement"
            )));
        }
        return Ok(forced(*a));
    }
    if let Some(a) = env.global {
        if implements(a) {
            return Ok(forced(a));
        }
    }
    let reduces = matches!(
        kind,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    if ctx.deterministic && reduces && dtype.is_float() {
        // Only the rank-order algorithms: the result then does not depend on
        // which one is picked (nor on the rank count's factorisation).
        let v = rank_among(p, elem, ctx, &[Algorithm::Direct, Algorithm::TwoShot]);
        if !v.is_empty() {
            return Ok(v);
        }
    }
    let mut v = rank_algorithms(p, elem, ctx);
    match model_pick(&v, across_hosts(ctx)) {
        Some(i) => {
            v[..=i].rotate_right(1);
            Ok(v)
        }
        None => Ok(vec![choose_with(p, elem, ctx)]),
    }
}
