//! Recovery: [`Communicator::shrink`] builds a new communicator among the
//! survivors of a failure, without restarting processes.
//!
//! The failed communicator cannot run collectives any more, so the survivors
//! meet elsewhere: the lowest surviving rank serves a fresh store on the
//! listener every rank kept from set-up (its address is known to all), the
//! others connect to it, and the group is connected as at start-up. If rank
//! 0 survived it is that root; otherwise the next rank up takes over, so no
//! outside master is needed.

use super::Communicator;
use crate::bootstrap::store::{StoreClient, StoreServer};
use crate::bootstrap::{self, StoreExchange};
use crate::engine::Core;
use crate::error::{Error, Result};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

impl Communicator {
    /// A new communicator of every rank not in `dead`, renumbered in order
    /// (like `ncclCommShrink`). Every survivor must call it with the same
    /// list. This communicator stays failed; drop it afterwards.
    pub fn shrink(&self, dead: &[usize]) -> Result<Communicator> {
        let n = self.size();
        let Some((listener, addrs)) = &self.rescue else {
            return Err(Error::arg(
                "shrink needs a multi-process communicator (from init_rank, from_env or split)",
            ));
        };
        if let Some(&d) = dead.iter().find(|&&d| d >= n) {
            return Err(Error::arg(format!(
                "shrink: rank {d} is not in this communicator of {n} ranks"
            )));
        }
        if dead.contains(&self.rank()) {
            return Err(Error::arg(format!(
                "shrink: this rank ({}) is listed as dead",
                self.rank()
            )));
        }
        let survivors: Vec<usize> = (0..n).filter(|r| !dead.contains(r)).collect();
        let new_rank = survivors
            .iter()
            .position(|&r| r == self.rank())
            .expect("a survivor");
        let root = survivors[0];
        let deadline = crate::config::deadline_after(Instant::now(), self.config.connect_timeout);
        let boot = |msg: String| Error::Bootstrap {
            rank: self.rank(),
            msg,
        };
        let server = if new_rank == 0 {
            let _ = listener.set_nonblocking(false);
            let l = listener
                .try_clone()
                .map_err(|e| boot(format!("cannot reuse the listener for recovery: {e}")))?;
            Some(StoreServer::start(l, self.token)?)
        } else {
            None
        };
        let mut client = StoreClient::connect(addrs[root], self.token, self.rank(), deadline)?;
        // Every survivor must agree on who survived.
        let view = format!("{survivors:?}");
        client.put(&format!("view/{new_rank}"), view.as_bytes(), deadline)?;
        for (r, &who) in survivors.iter().enumerate() {
            let v = client.get(&format!("view/{r}"), deadline)?;
            if v != view.as_bytes() {
                return Err(boot(format!(
                    "survivors disagree: this rank shrinks to {view}, rank {who} to {}",
                    String::from_utf8_lossy(&v)
                )));
            }
        }
        let members: Vec<usize> = (0..survivors.len()).collect();
        let ip = self
            .ip
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let conn = {
            let mut ex = StoreExchange {
                client: &mut client,
                rank: new_rank,
                n: survivors.len(),
                round: 0,
                deadline,
            };
            bootstrap::connect(
                &mut ex,
                new_rank,
                Some(&members),
                &self.config,
                self.token,
                ip,
                deadline,
            )?
            .ok_or_else(|| boot("internal: survivor missing from the new group".into()))?
        };
        // As at start-up, the recovery store lives only for set-up.
        match server {
            Some(s) => {
                s.linger_for(survivors.len() - 1);
                drop(s);
            }
            None => client.release(deadline)?,
        }
        let ranks_here = conn.ranks_on_machine;
        let mut core = Core::new(
            conn.links,
            conn.peer_pids,
            new_rank,
            self.config.clone(),
            ranks_here,
            conn.segment,
            conn.io,
        );
        core.tune = super::tune_ctx(&conn.topo, &self.config, false);
        crate::engine::keep_rescue(&mut core, conn.rescue.as_ref());
        let (engine, p2p) = super::start(
            core,
            conn.p2p_links,
            &conn.topo,
            &self.config,
            ranks_here,
            false,
        );
        Ok(Communicator {
            engine,
            p2p,
            rank: new_rank,
            size: survivors.len(),
            topo: conn.topo,
            config: self.config.clone(),
            _store: None,
            _client: Some(Mutex::new(client)),
            token: self.token,
            ip: self.ip,
            rescue: conn.rescue.map(|l| (l, conn.peer_addrs)),
        })
    }

    /// Finds the ranks that are gone (their process or host no longer
    /// answers) and [`shrink`](Communicator::shrink)s to the others.
    pub fn shrink_to_healthy(&self) -> Result<Communicator> {
        let dead = self.dead_ranks();
        self.shrink(&dead)
    }

    /// Ranks whose recovery listener does not answer within half a second.
    pub fn dead_ranks(&self) -> Vec<usize> {
        let Some((_, addrs)) = &self.rescue else {
            return Vec::new();
        };
        let me = self.rank();
        addrs
            .iter()
            .enumerate()
            .filter(|&(r, a)| r != me && !answers(*a))
            .map(|(r, _)| r)
            .collect()
    }
}

fn answers(a: SocketAddr) -> bool {
    // A bare connect reaches the listener's backlog; it is dropped at once.
    TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()
}
