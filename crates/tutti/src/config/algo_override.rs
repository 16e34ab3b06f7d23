//! `TUTTI_ALGO`: the algorithms a user forces, for every collective or per
//! collective, named as [`Algorithm`] and [`CollKind`] parse.

use crate::algo::{Algorithm, CollKind};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Forced algorithms: one for every collective, and/or one per collective.
///
/// Parsed from `TUTTI_ALGO`: `ring` forces the ring wherever it applies;
/// `all_reduce:tree,all_gather:ring` forces per collective. Collectives are
/// spelled as `tutti perf` spells them (NCCL's `allreduce` is accepted too).
/// Hierarchical levels go in parentheses, whose commas do not separate
/// entries: `all_reduce:hierarchical(intra=ring,inter=halving_doubling),ring`.
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
        for part in split_top_level(s)?
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
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

    /// Whether nothing is forced (`TUTTI_ALGO` unset, empty or `auto`).
    pub fn is_empty(&self) -> bool {
        self.global.is_none() && self.per_coll.is_empty()
    }
}

/// In `TUTTI_ALGO` syntax, names spelled as they parse (the global
/// algorithm first, then `coll:algo` pairs); `auto` where nothing is forced.
/// Parsing the text gives the same value back.
impl std::fmt::Display for AlgoOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("auto");
        }
        let global = self.global.iter().map(|a| a.to_string());
        let per = self.per_coll.iter().map(|(c, a)| format!("{c}:{a}"));
        f.write_str(&global.chain(per).collect::<Vec<_>>().join(","))
    }
}

/// Splits `s` at the commas outside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, ch) in s.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| Error::arg(format!("TUTTI_ALGO '{s}': unbalanced ')'")))?
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(Error::arg(format!("TUTTI_ALGO '{s}': unclosed '('")));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_override() {
        let o = AlgoOverride::parse("ring").unwrap();
        assert_eq!(o.get(CollKind::AllGather), Some(Algorithm::Ring));
        let o = AlgoOverride::parse("all_reduce:tree, allgather:ring").unwrap();
        assert_eq!(o.get(CollKind::AllReduce), Some(Algorithm::Tree));
        assert_eq!(o.get(CollKind::AllGather), Some(Algorithm::Ring));
        assert_eq!(o.get(CollKind::Broadcast), None);
        let e = AlgoOverride::parse("all_reduce:bogus")
            .unwrap_err()
            .to_string();
        assert!(e.contains("valid: ring"), "{e}");
        assert!(AlgoOverride::parse("allreduc:ring").is_err());
    }

    #[test]
    fn override_prints_as_it_parses() {
        for (text, shown) in [
            ("", "auto"),
            ("auto", "auto"),
            ("hd", "halving_doubling"),
            (
                "allreduce:tree,ring,all_gather:hierarchical(inter=hd)",
                "ring,all_reduce:tree,all_gather:hierarchical(inter=halving_doubling)",
            ),
        ] {
            let o = AlgoOverride::parse(text).unwrap();
            assert_eq!(o.to_string(), shown);
            assert_eq!(AlgoOverride::parse(shown).unwrap(), o);
            assert_eq!(o.is_empty(), shown == "auto");
        }
    }

    #[test]
    fn parse_override_with_levels() {
        use crate::algo::{Level, Levels};
        let hd = Algorithm::Hierarchical(Levels {
            intra: Level::Ring,
            inter: Level::HalvingDoubling,
        });
        let o = AlgoOverride::parse(
            "all_reduce:hierarchical(intra=ring,inter=halving_doubling), \
             broadcast:hierarchical(intra=tree,inter=direct),ring",
        )
        .unwrap();
        assert_eq!(o.get(CollKind::AllReduce), Some(hd));
        assert_eq!(
            o.get(CollKind::Broadcast),
            Some(Algorithm::Hierarchical(Levels {
                intra: Level::Tree,
                inter: Level::Direct,
            }))
        );
        assert_eq!(o.get(CollKind::AllGather), Some(Algorithm::Ring));
        // As the global value, and the name it prints parses back.
        let o = AlgoOverride::parse("hierarchical(inter=hd)").unwrap();
        assert_eq!(o.global, Some(hd));
        assert_eq!(AlgoOverride::parse(hd.name()).unwrap().global, Some(hd));
        assert_eq!(
            AlgoOverride::parse("hierarchical").unwrap().global,
            Some(Algorithm::Hierarchical(Levels::DEFAULT))
        );
        for (bad, want) in [
            ("all_reduce:hierarchical(inter=bogus)", "valid: ring, tree"),
            ("all_reduce:hierarchical(inter=ring", "unclosed"),
            ("all_reduce:hierarchical(inter=ring))", "unbalanced"),
            ("hierarchical(outer=ring)", "valid: intra, inter"),
            ("all_reduce:ring(inter=ring)", "only hierarchical"),
        ] {
            let e = AlgoOverride::parse(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
