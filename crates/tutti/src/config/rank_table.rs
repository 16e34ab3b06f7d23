//! Rank tables: a JSON file that describes the whole job (like HCCL's rank
//! table), so ranks can start with nothing but the file and their rank.
//!
//! ```json
//! {
//!   "version": 1,
//!   "port": 29500,
//!   "token": "00112233445566778899aabbccddeeff",
//!   "hosts": [
//!     { "name": "node0", "addr": "10.233.0.1", "ranks": [0, 1] },
//!     { "name": "node1", "addr": "10.233.0.2", "ranks": [2, 3] }
//!   ]
//! }
//! ```
//!
//! `TUTTI_RANK_TABLE=path` selects it; the rank comes from `TUTTI_RANK` (or
//! torchrun's, Slurm's or Open MPI's rank variable). The lowest rank of the
//! first host serves the rendezvous store at `addr:port`; each rank's host
//! identity is its host's `name`, so the table, not the machine, decides
//! which ranks share memory. `token` is optional (32 hex digits).

use super::launch::{parse_token, EnvInfo};
use crate::error::{Error, Result};
use serde::Deserialize;

/// One host of a rank table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct TableHost {
    /// The host's name (its identity for topology).
    pub name: String,
    /// An address other hosts reach it at.
    pub addr: String,
    /// The global ranks on this host.
    pub ranks: Vec<usize>,
}

/// A rank table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RankTable {
    /// Format version (1).
    pub version: u32,
    /// The rendezvous port on the first host.
    pub port: u16,
    /// The job's auth token, 32 hex digits.
    #[serde(default)]
    pub token: Option<String>,
    /// The hosts.
    pub hosts: Vec<TableHost>,
}

impl RankTable {
    /// Parses and checks a table: ranks 0..n each exactly once.
    pub fn parse(text: &str) -> Result<RankTable> {
        let t: RankTable =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("rank table: {e}")))?;
        if t.version != 1 {
            return Err(Error::Config(format!(
                "rank table version {} is not supported (expected 1)",
                t.version
            )));
        }
        let n: usize = t.hosts.iter().map(|h| h.ranks.len()).sum();
        let mut seen = vec![false; n];
        for h in &t.hosts {
            for &r in &h.ranks {
                if r >= n || std::mem::replace(&mut seen[r], true) {
                    return Err(Error::Config(format!(
                        "rank table: rank {r} on host {:?} is out of range or listed twice (the table has {n} ranks)",
                        h.name
                    )));
                }
            }
        }
        if n == 0 {
            return Err(Error::Config("rank table lists no ranks".into()));
        }
        Ok(t)
    }

    /// The host of `rank`.
    pub fn host_of(&self, rank: usize) -> Option<&TableHost> {
        self.hosts.iter().find(|h| h.ranks.contains(&rank))
    }

    /// The launch description for `rank`.
    pub fn env_info(&self, rank: usize) -> Result<EnvInfo> {
        let n: usize = self.hosts.iter().map(|h| h.ranks.len()).sum();
        if rank >= n {
            return Err(Error::Config(format!(
                "rank {rank} is not in the rank table ({n} ranks)"
            )));
        }
        let host = self.host_of(rank).expect("checked by parse");
        let token =
            match &self.token {
                None => None,
                Some(t) => Some(parse_token(t).ok_or_else(|| {
                    Error::Config("rank table: token must be 32 hex digits".into())
                })?),
            };
        Ok(EnvInfo {
            rank,
            world_size: n,
            local_rank: host.ranks.iter().position(|&r| r == rank),
            master_addr: self.hosts[0].addr.clone(),
            master_port: self.port,
            token,
            source: "rank table",
            agent_store: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let t = RankTable::parse(
            r#"{"version":1,"port":29500,"hosts":[{"name":"a","addr":"127.0.0.1","ranks":[0,2]},{"name":"b","addr":"127.0.0.2","ranks":[1]}]}"#,
        )
        .unwrap();
        let e = t.env_info(2).unwrap();
        assert_eq!(
            (e.world_size, e.local_rank, e.master_port),
            (3, Some(1), 29500)
        );
        assert_eq!(t.host_of(1).unwrap().name, "b");
        assert!(RankTable::parse(
            r#"{"version":1,"port":1,"hosts":[{"name":"a","addr":"x","ranks":[0,0]}]}"#
        )
        .is_err());
        assert!(RankTable::parse(
            r#"{"version":1,"port":1,"hosts":[{"name":"a","addr":"x","ranks":[1]}]}"#
        )
        .is_err());
        assert!(t.env_info(3).is_err());
    }
}
