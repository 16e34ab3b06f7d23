//! The launcher's environment: which rank this process is, how many ranks
//! the job has and where rank 0 serves the rendezvous store, as `tutti run`,
//! torchrun, Slurm, Open MPI or a rank table (`TUTTI_RANK_TABLE`) say.
//! Read here and nowhere else in the library; [`Config`](super::Config)
//! holds the settings.

use super::rank_table::RankTable;
use super::var;
use crate::error::{Error, Result};
use std::str::FromStr;

/// Rank, world size and master, as read from a launcher's environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvInfo {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this host, if the launcher says.
    pub local_rank: Option<usize>,
    /// The master's host name or address.
    pub master_addr: String,
    /// The master's port.
    pub master_port: u16,
    /// The auth token (`TUTTI_TOKEN`, 32 hex digits), if set.
    pub token: Option<[u8; 16]>,
    /// Which launcher's variables were used.
    pub source: &'static str,
    /// Where the ranks join a store the launcher already serves, instead
    /// of rank 0 serving one: the key prefix in it. torchrun's agent
    /// serves a torch `TCPStore` on `MASTER_PORT` and says so with
    /// `TORCHELASTIC_USE_AGENT_STORE=True`; the prefix is then
    /// `/worker/attempt_{TORCHELASTIC_RESTART_COUNT}`, so that the ranks of
    /// a restarted attempt never read an earlier attempt's keys.
    pub agent_store: Option<String>,
}

fn num<T: FromStr>(name: &str) -> Result<Option<T>> {
    match var(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}={v:?} is not a valid number"))),
    }
}

impl EnvInfo {
    /// Reads, in this order: `TUTTI_RANK/TUTTI_WORLD_SIZE/TUTTI_MASTER_ADDR/
    /// TUTTI_MASTER_PORT`, torchrun's `RANK/WORLD_SIZE/LOCAL_RANK/
    /// MASTER_ADDR/MASTER_PORT`, Slurm's `SLURM_PROCID/SLURM_NTASKS/
    /// SLURM_LOCALID` and Open MPI's `OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK`.
    /// Slurm and Open MPI do not name a master: `TUTTI_MASTER_ADDR` or
    /// `MASTER_ADDR` (and the port) must then be set as well.
    pub fn from_env() -> Result<EnvInfo> {
        read().map(|(e, _)| e)
    }
}

/// [`EnvInfo::from_env`], and the rank table it came from, if it did (the
/// table also says which ranks share a host).
pub(crate) fn read() -> Result<(EnvInfo, Option<RankTable>)> {
    if let Some(path) = var("TUTTI_RANK_TABLE") {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::Config(format!("TUTTI_RANK_TABLE={path:?}: {e}")))?;
        let table = RankTable::parse(&text)?;
        let rank = ["TUTTI_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"]
            .iter()
            .find_map(|v| num::<usize>(v).transpose())
            .transpose()?
            .ok_or_else(|| {
                Error::Config("TUTTI_RANK_TABLE is set but no rank is: set TUTTI_RANK".into())
            })?;
        return Ok((table.env_info(rank)?, Some(table)));
    }
    let sources: [(&str, &str, &str, &str); 4] = [
        (
            "tutti",
            "TUTTI_RANK",
            "TUTTI_WORLD_SIZE",
            "TUTTI_LOCAL_RANK",
        ),
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        (
            "openmpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ),
    ];
    for (source, rk, sz, lr) in sources {
        let (Some(rank), Some(world_size)) = (num::<usize>(rk)?, num::<usize>(sz)?) else {
            continue;
        };
        if world_size == 0 {
            return Err(Error::Config(format!(
                "{sz}=0: the world needs at least one rank"
            )));
        }
        if rank >= world_size {
            return Err(Error::Config(format!(
                "{rk}={rank} but {sz}={world_size}: the rank must be below the world size"
            )));
        }
        let master_addr = var("TUTTI_MASTER_ADDR").or_else(|| var("MASTER_ADDR"));
        let master_port = match num::<u16>("TUTTI_MASTER_PORT")? {
            Some(p) => Some(p),
            None => num::<u16>("MASTER_PORT")?,
        };
        let (Some(master_addr), Some(master_port)) = (master_addr, master_port) else {
            return Err(Error::Config(format!(
                "found {rk}/{sz} ({source}) but no master: set TUTTI_MASTER_ADDR and TUTTI_MASTER_PORT (or MASTER_ADDR and MASTER_PORT) to rank 0's host and a free port"
            )));
        };
        let token = token_from_env()?;
        let agent_store = match (source, var("TORCHELASTIC_USE_AGENT_STORE")) {
            ("torchrun", Some(v)) if v.trim().eq_ignore_ascii_case("true") || v.trim() == "1" => {
                let attempt = num::<u32>("TORCHELASTIC_RESTART_COUNT")?.unwrap_or(0);
                Some(format!("/worker/attempt_{attempt}"))
            }
            _ => None,
        };
        return Ok((
            EnvInfo {
                rank,
                world_size,
                local_rank: num::<usize>(lr)?,
                master_addr,
                master_port,
                token,
                source,
                agent_store,
            },
            None,
        ));
    }
    Err(Error::Config(
        "no rank/world size in the environment: run under `tutti run`, torchrun, Slurm or mpirun, or set TUTTI_RANK, TUTTI_WORLD_SIZE, TUTTI_MASTER_ADDR and TUTTI_MASTER_PORT".into(),
    ))
}

/// The job's auth token from `TUTTI_TOKEN` (32 hex digits), if set; for
/// [`EnvInfo::from_env`], and for bindings that build a
/// [`UniqueId`](crate::bootstrap::UniqueId) from a master's address
/// themselves.
pub fn token_from_env() -> Result<Option<[u8; 16]>> {
    match var("TUTTI_TOKEN") {
        None => Ok(None),
        Some(t) => parse_token(t.trim())
            .map(Some)
            .ok_or_else(|| Error::Config("TUTTI_TOKEN must be 32 hex digits".into())),
    }
}

/// A job's auth token written as 32 hex digits, or `None` if `s` is not
/// exactly that.
pub(crate) fn parse_token(s: &str) -> Option<[u8; 16]> {
    let digits = s.as_bytes();
    if digits.len() != 32 {
        return None;
    }
    let nibble = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut token = [0u8; 16];
    for (t, pair) in token.iter_mut().zip(digits.chunks_exact(2)) {
        *t = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(token)
}

#[cfg(test)]
mod tests {
    use super::parse_token;

    #[test]
    fn tokens_are_exactly_32_hex_digits() {
        let t = parse_token("00112233445566778899aabbccddeeFF").unwrap();
        assert_eq!(t[0], 0x00);
        assert_eq!(t[1], 0x11);
        assert_eq!(t[15], 0xff);
        assert_eq!(parse_token("0011"), None);
        assert_eq!(parse_token("0011223344556677889 aabbccddeeff"), None);
        assert_eq!(parse_token("+0112233445566778899aabbccddeeff"), None);
        // 32 bytes of two-byte characters: rejected, not a panic on a
        // character boundary.
        assert_eq!(parse_token(&"é".repeat(16)), None);
    }
}
