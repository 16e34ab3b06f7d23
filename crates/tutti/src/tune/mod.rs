//! Choosing an algorithm per call, and the `TUTTI_ALGO` override.
//!
//! `choose` picks by collective, rank count and message size; a cost model
//! that prices each candidate schedule replaces these rules as it matures.

use crate::algo::{Algorithm, CollKind, Problem};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Forced algorithms: one for every collective, and/or one per collective.
///
/// Parsed from `TUTTI_ALGO`: `ring` forces the ring wherever it applies;
/// `all_reduce:tree,all_gather:ring` forces per collective. Collectives are
/// spelled as `tutti perf` spells them (NCCL's `allreduce` is accepted too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgoOverride {
    /// Applies to every collective that the algorithm implements.
    pub global: Option<Algorithm>,
    /// Per-collective choices; these win over `global`.
    pub per_coll: BTreeMap<CollKind, Algorithm>,
}

impl AlgoOverride {
    /// Parses the `TUTTI_ALGO` syntax; unknown names are errors listing the valid ones.
    pub fn parse(s: &str) -> Result<Self> {
        let mut o = AlgoOverride::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once(':') {
                Some((c, a)) => {
                    let c: CollKind = c.trim().parse()?;
                    let a: Algorithm = a.trim().parse()?;
                    o.per_coll.insert(c, a);
                }
                None => {
                    if part.eq_ignore_ascii_case("auto") {
                        continue;
                    }
                    o.global = Some(part.parse()?);
                }
            }
        }
        Ok(o)
    }

    /// The forced algorithm for `kind`, if any.
    pub fn get(&self, kind: CollKind) -> Option<Algorithm> {
        self.per_coll.get(&kind).copied().or(self.global)
    }
}

/// The algorithm tutti uses for `p` (of `bytes` bytes per rank) when nothing is forced.
pub fn choose(p: &Problem, bytes: usize) -> Algorithm {
    let n = p.nranks;
    match p.coll.kind() {
        CollKind::AllReduce | CollKind::AllGather | CollKind::Broadcast | CollKind::Reduce => {
            if n <= 2 || bytes <= 16 << 10 {
                if n <= 2 && bytes > 16 << 10 {
                    Algorithm::Ring
                } else {
                    Algorithm::Direct
                }
            } else {
                Algorithm::Ring
            }
        }
        CollKind::ReduceScatter => Algorithm::Ring,
        _ => Algorithm::Direct,
    }
}

/// Picks the algorithm for `p`: the per-call choice, else `TUTTI_ALGO`, else
/// [`choose`]. A forced algorithm that does not implement the collective is
/// an error for a per-call choice and ignored for a global `TUTTI_ALGO`.
pub(crate) fn select(
    p: &Problem,
    bytes: usize,
    per_call: Option<Algorithm>,
    env: &AlgoOverride,
) -> Result<Algorithm> {
    let kind = p.coll.kind();
    let implements = |a: Algorithm| a.build(&Problem { count: 0, ..p.clone() }).is_some();
    if let Some(a) = per_call {
        if !implements(a) {
            return Err(Error::arg(format!("algorithm {a} does not implement {kind}")));
        }
        return Ok(a);
    }
    if let Some(a) = env.per_coll.get(&kind) {
        if !implements(*a) {
            return Err(Error::Config(format!("TUTTI_ALGO forces {a} for {kind}, which it does not implement")));
        }
        return Ok(*a);
    }
    if let Some(a) = env.global {
        if implements(a) {
            return Ok(a);
        }
    }
    Ok(choose(p, bytes))
}
