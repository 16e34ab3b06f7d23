//! The public face: [`Communicator`].

mod calibrate;
mod fusion;
mod grad_sync;
mod ops;
mod p2p;
mod shrink;
mod sparse;
mod split;
mod work;

pub use crate::engine::{Options, RawCall};
pub use fusion::{FusionOptions, ManyWork, DEFAULT_BUCKET_BYTES};
pub use grad_sync::{BucketOptions, GradSync};
pub use p2p::{P2pHandle, P2pOp, RawP2p, Received};
pub use sparse::{sum_pair_blocks, SparseRoute, TopK};
pub use work::Work;

use crate::bootstrap::{self, store::StoreClient, store::StoreServer, UniqueId};
use crate::config::Config;
use crate::engine::{keep_rescue, Core, Engine};
use crate::error::{Error, Result};
use crate::topo::Topology;
use crate::transport::shm::{DirectRead, RingLink, Segment, P2P_CHANNEL};
use crate::transport::{Link, LinkOps};
use std::sync::Mutex;

/// A group of ranks that run collectives together.
///
/// Create one per rank with [`from_env`](Communicator::from_env) (under
/// `tutti run`, torchrun, Slurm or mpirun), [`init_rank`](Communicator::init_rank)
/// (with a [`UniqueId`]), or all at once for threads of one process with
/// [`init_all`](Communicator::init_all). Every rank must issue the same
/// collectives in the same order. Dropping it releases everything: threads,
/// sockets and shared memory.
///
/// ```
/// use tutti::{Communicator, ReduceOp};
///
/// // Four ranks as four threads of this process.
/// let comms = Communicator::init_all(4).unwrap();
/// std::thread::scope(|s| {
///     for c in &comms {
///         s.spawn(move || {
///             let mut grad = vec![c.rank() as f32; 1000];
///             c.all_reduce(&mut grad, ReduceOp::Sum).unwrap();
///             assert!(grad.iter().all(|&x| x == 6.0)); // 0 + 1 + 2 + 3
///         });
///     }
/// });
/// ```
pub struct Communicator {
    pub(crate) engine: Engine,
    /// Sends and receives, beside the engine's collectives.
    pub(crate) p2p: crate::p2p::P2p,
    rank: usize,
    size: usize,
    topo: Topology,
    config: Config,
    /// Kept for the communicator's life: rank 0 serves the store; the client
    /// connection stays open for later use (splits, diagnostics).
    _store: Option<StoreServer>,
    _client: Option<Mutex<StoreClient>>,
    /// The job's auth token (sub-communicators use it too).
    pub(crate) token: [u8; 16],
    /// The address peers reach this rank at (`None` for thread ranks).
    pub(crate) ip: Option<std::net::IpAddr>,
    /// This rank's listener, kept for [`shrink`](Communicator::shrink), and every rank's address.
    pub(crate) rescue: Option<(std::net::TcpListener, Vec<std::net::SocketAddr>)>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank())
            .field("local_size", &self.local_size())
            .finish()
    }
}

/// Messages at least this long go straight from the sender's memory on
/// the point-to-point channel's shared-memory links, where ranks can read
/// each other's memory: one copy (`process_vm_readv`) instead of two
/// through the ring. Measured against the ring alone (`docs/performance.md`,
/// "Send/Recv: direct reads from 32 KiB"), 2 ranks on 2 cores: 32 KiB to
/// 128 KiB exchanges take 0.50-0.75 of their time. Eager messages never
/// go direct (`p2p::progress`), and since they go up to
/// [`EAGER_BYTES`](crate::EAGER_BYTES) (128 KiB), every rendezvous message
/// is read direct, under either threshold.
const P2P_DIRECT_BYTES: usize = 32 << 10;

/// [`P2P_DIRECT_BYTES`] where this host has more ranks than cores: a
/// direct send waits for its receiver to run and read, where the ring
/// lets it go on; from 128 KiB direct still gains (0.69-0.77 with 4
/// ranks on 2 cores), at 32 KiB it lost (1.10).
const P2P_DIRECT_BYTES_SHARED: usize = 128 << 10;

/// Starts a connected group's engine over `core`, and makes its
/// point-to-point channel over `p2p_links`.
pub(crate) fn start(
    core: Core,
    p2p_links: Vec<Option<Link>>,
    topo: &Topology,
    config: &Config,
    ranks_here: usize,
    threads: bool,
) -> (Engine, crate::p2p::P2p) {
    let bell = core.bell_owner.clone().map(|s| (s, core.local_index));
    let pids = core.peer_pids.clone();
    let rank = core.rank;
    let engine = Engine::new(core);
    let cma = threads
        || topo
            .host_of
            .get(rank)
            .and_then(|&h| topo.hosts.get(h))
            .is_some_and(|h| h.cma);
    let direct = config.direct_bytes.unwrap_or(if !cma {
        usize::MAX
    } else if config.spin_for(ranks_here).1 {
        P2P_DIRECT_BYTES_SHARED
    } else {
        P2P_DIRECT_BYTES
    });
    let p2p = crate::p2p::P2p::new(
        p2p_links,
        pids,
        rank,
        direct,
        crate::p2p::Waits {
            // The progress thread is one more busy thread per rank.
            spin: config.spin_for(2 * ranks_here),
            // Where ranks outnumber cores, a waiter lets the other rank on its
            // core run almost at once: an exchange is one message each way,
            // and the one it waits for is often that rank's to send. Send/Recv,
            // 4 ranks on 2 cores, yielding after 2 idle rounds against 8 (7
            // rounds, paired, two sittings): 8 B-32 KiB 0.67-1.07 and
            // 0.75-1.06, most sizes below 0.95 (64 KiB 1.80 and 0.65: noise).
            // With 2 ranks (which yield too, beside their progress threads) it
            // measured 1.07-1.17 at 8-256 B in one sitting and 0.70-1.10 in
            // another, so they keep 8; and for every wait alike, 4-rank
            // Broadcast slowed by 1.04-1.42.
            yield_after: if config.spin_for(ranks_here).1 { 2 } else { 8 },
        },
        bell,
        engine.abort.clone(),
    );
    (engine, p2p)
}

/// The tuner's view of a communicator.
pub(crate) fn tune_ctx(topo: &Topology, config: &Config, threads: bool) -> crate::tune::TuneCtx {
    crate::tune::TuneCtx {
        model: crate::tune::CostModel::default(),
        host_of: topo.host_of.clone(),
        threads,
        tcp_only: config.transport == crate::config::TransportChoice::Tcp,
        deterministic: config.deterministic,
        mailbox: config.mailbox
            && config.transport != crate::config::TransportChoice::Tcp
            && topo.host_of.len() > 1
            && topo.host_of.iter().all(|&h| h == topo.host_of[0]),
        cpu_share: topo.cpu_share(),
        ring_bytes: config.ring_bytes,
        stream_trials: config.shm_stream.is_none()
            && config.transport != crate::config::TransportChoice::Tcp
            && (threads || topo.hosts.iter().any(|h| h.ranks.len() > 1)),
        // Not for threads of one process: their direct path is a memcpy
        // out of the sender's buffer, not measured against the rings.
        cma_trials: config.direct_bytes.is_none()
            && config.transport != crate::config::TransportChoice::Tcp
            && !threads
            && topo.hosts.iter().any(|h| h.ranks.len() > 1)
            && topo.hosts.iter().all(|h| h.ranks.len() < 2 || h.cma),
    }
}

impl Communicator {
    /// The algorithm and pipeline chunk count Auto uses for `coll` with
    /// `count` elements of `dtype` on this communicator: online tuning's
    /// decision once calls of this shape have made it (`us`: the measured
    /// time, the maximum over ranks), else what the tuner (or `TUTTI_ALGO`)
    /// picks, with the cost model's predicted time in microseconds.
    pub fn plan(
        &self,
        coll: crate::Collective,
        count: usize,
        dtype: crate::DataType,
    ) -> Result<crate::tune::Choice> {
        let mut p = crate::algo::Problem::new(coll, self.size, self.rank, count);
        let mut ctx = tune_ctx(&self.topo, &self.config, self.ip.is_none() && self.size > 1);
        let (model, state) = self
            .engine
            .with_core(|c| (c.tune.model, c.online_state(&p, dtype)));
        ctx.model = model;
        p.hosts = ctx.hosts();
        match state {
            Some(Ok(d)) => Ok(d),
            _ => crate::tune::select(&p, dtype, None, &self.config.algo, &ctx),
        }
    }

    /// Whether Auto is still timing candidate algorithms on calls of `coll`
    /// with `count` elements of `dtype` (online tuning, see
    /// [`tune::online`](crate::tune::online): at most
    /// [`online::max_calls`](crate::tune::online::max_calls) calls per
    /// shape; false before the first call). The same on every rank after
    /// the same calls: a benchmark repeats its call until this is false
    /// before it times.
    pub fn is_tuning(&self, coll: crate::Collective, count: usize, dtype: crate::DataType) -> bool {
        let p = crate::algo::Problem::new(coll, self.size, self.rank, count);
        matches!(
            self.engine.with_core(|c| c.online_state(&p, dtype)),
            Some(Err(()))
        )
    }

    /// How many times Auto has timed the candidates for calls of `coll`
    /// with `count` elements of `dtype` again after its first decision
    /// (online tuning's reviews, see [`tune::online`](crate::tune::online);
    /// 0 where it does not tune them, or with `TUTTI_TUNE=once`). The same
    /// on every rank after the same calls.
    pub fn tuning_reviews(
        &self,
        coll: crate::Collective,
        count: usize,
        dtype: crate::DataType,
    ) -> usize {
        let p = crate::algo::Problem::new(coll, self.size, self.rank, count);
        self.engine.with_core(|c| c.online_reviews(&p, dtype))
    }

    /// The candidates Auto times on calls of `coll` with `count` elements
    /// of `dtype` (online tuning, see [`tune::online`](crate::tune::online)):
    /// the cost model's pick first, then the other algorithms and the
    /// pick's twins ([`Choice::stream`](crate::tune::Choice::stream),
    /// [`Choice::cma`](crate::tune::Choice::cma)), with the cost
    /// model's predicted times. Empty before the shape's first call and
    /// where there is nothing to try (one candidate, a forced algorithm,
    /// `TUTTI_TUNE=model`). The same on every rank after the same calls.
    pub fn tuning_candidates(
        &self,
        coll: crate::Collective,
        count: usize,
        dtype: crate::DataType,
    ) -> Vec<crate::tune::Choice> {
        let p = crate::algo::Problem::new(coll, self.size, self.rank, count);
        self.engine.with_core(|c| c.online_candidates(&p, dtype))
    }

    /// `n` communicators for `n` threads of this process (like
    /// `ncclCommInitAll`); element `r` is rank `r`. Uses the `local`
    /// transport (direct memory access) and reads [`Config::from_env`].
    pub fn init_all(n: usize) -> Result<Vec<Communicator>> {
        Self::init_all_with(n, Config::from_env()?)
    }

    /// [`init_all`](Communicator::init_all) with an explicit configuration.
    pub fn init_all_with(n: usize, config: Config) -> Result<Vec<Communicator>> {
        if n == 0 {
            return Err(Error::arg("init_all needs at least one rank"));
        }
        let seg = Segment::heap(n, config.ring_bytes);
        let mut topo = Topology::from_host_ids(&vec![String::from("local"); n]);
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            let ring = |chan: usize| -> Vec<Option<Link>> {
                (0..n)
                    .map(|q| {
                        (q != r).then(|| {
                            Link::Ring(RingLink::on_channel(
                                seg.clone(),
                                chan,
                                r,
                                q,
                                DirectRead::Memcpy,
                            ))
                        })
                    })
                    .collect()
            };
            let (links, p2p_links) = (ring(0), ring(P2P_CHANNEL));
            topo.transports = links.iter().map(|l| l.as_ref().map(|l| l.kind())).collect();
            let mut core = Core::new(
                links,
                vec![None; n],
                r,
                config.clone(),
                n,
                Some((seg.clone(), r)),
                None,
            );
            core.tune = tune_ctx(&topo, &config, true);
            let (engine, p2p) = start(core, p2p_links, &topo, &config, n, true);
            out.push(Communicator {
                engine,
                p2p,
                rank: r,
                size: n,
                topo: topo.clone(),
                config: config.clone(),
                _store: None,
                _client: None,
                token: [0; 16],
                ip: None,
                rescue: None,
            });
        }
        Ok(out)
    }

    /// Joins the job named by `id` as `rank` of `nranks` (like
    /// `ncclCommInitRank`). Rank 0 must run in the process that created `id`
    /// with [`UniqueId::new`], or `id` must name a free port on rank 0's host.
    pub fn init_rank(id: &UniqueId, nranks: usize, rank: usize) -> Result<Communicator> {
        Self::init_rank_with(id, nranks, rank, Config::from_env()?)
    }

    /// [`init_rank`](Communicator::init_rank) with an explicit configuration.
    pub fn init_rank_with(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        config: Config,
    ) -> Result<Communicator> {
        Self::join(id, nranks, rank, config, None)
    }

    /// [`init_rank_with`](Communicator::init_rank_with), through the
    /// launcher's store where `agent_store` names one
    /// ([`EnvInfo::agent_store`](crate::EnvInfo::agent_store)).
    fn join(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        config: Config,
        agent_store: Option<&str>,
    ) -> Result<Communicator> {
        let j = bootstrap::rendezvous(id, nranks, rank, &config, agent_store)?;
        let crate::bootstrap::Connected {
            rescue,
            peer_addrs,
            ranks_on_machine,
            links,
            p2p_links,
            peer_pids,
            topo,
            segment,
            io,
        } = j.conn;
        let ranks_here = ranks_on_machine;
        let mut core = Core::new(
            links,
            peer_pids,
            rank,
            config.clone(),
            ranks_here,
            segment,
            io,
        );
        core.tune = tune_ctx(&topo, &config, false);
        keep_rescue(&mut core, rescue.as_ref());
        // The measurement is cached per layout: which hosts, how many ranks
        // on each, which transports.
        let key = format!(
            "{:?}/{:?}/{:?}",
            topo.hosts
                .iter()
                .map(|h| (&h.id, h.ranks.len()))
                .collect::<Vec<_>>(),
            topo.transports.iter().flatten().collect::<Vec<_>>(),
            config.socket_ifname
        );
        let (engine, p2p) = start(core, p2p_links, &topo, &config, ranks_here, false);
        let comm = Communicator {
            engine,
            p2p,
            rank,
            size: nranks,
            topo,
            config,
            _store: j.server,
            _client: Some(Mutex::new(j.client)),
            token: id.token,
            ip: Some(j.ip),
            rescue: rescue.map(|l| (l, peer_addrs)),
        };
        let model = calibrate::calibrate(&comm, &key)?;
        comm.engine.with_core(|c| {
            c.tune.model = model;
            c.forget_decisions();
        });
        Ok(comm)
    }

    /// The cost-model parameters this communicator's tuner uses.
    pub fn cost_model(&self) -> crate::tune::CostModel {
        self.engine.with_core(|c| c.tune.model)
    }

    /// Joins the job described by the environment: `TUTTI_*` (as set by
    /// `tutti run`), torchrun, Slurm or Open MPI variables, in that order
    /// (see [`EnvInfo::from_env`](crate::EnvInfo::from_env)).
    pub fn from_env() -> Result<Communicator> {
        Self::from_env_with(Config::from_env()?)
    }

    /// [`from_env`](Communicator::from_env) with an explicit configuration
    /// (the job's layout still comes from the launcher's variables).
    pub fn from_env_with(mut config: Config) -> Result<Communicator> {
        let (e, table) = crate::config::launch::read()?;
        let id = e.unique_id()?;
        if let Some(t) = table.filter(|_| config.host_id.is_none()) {
            // The table decides which ranks share a host.
            config.host_id = t.host_of(e.rank).map(|h| h.name.clone());
        }
        Self::join(&id, e.world_size, e.rank, config, e.agent_store.as_deref())
    }

    /// This rank, in `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This rank's index among the ranks on its host.
    pub fn local_rank(&self) -> usize {
        self.topo.local_rank[self.rank]
    }

    /// Number of ranks on this rank's host.
    pub fn local_size(&self) -> usize {
        self.topo.local_size(self.rank)
    }

    /// The host index of every rank, as the engine puts it in every
    /// [`Problem`](crate::algo::Problem) it schedules: `Some` only when the
    /// ranks span several hosts (and are not threads of one process), which
    /// is when [`Algorithm::Hierarchical`](crate::Algorithm::Hierarchical) can build.
    pub fn hosts(&self) -> Option<std::sync::Arc<[usize]>> {
        self.engine.with_core(|c| c.tune.hosts())
    }

    /// The topology this communicator detected.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Aborts the communicator: ops that wait fail with [`Error::Aborted`] at
    /// once, and so does every later op. Callable from any thread.
    pub fn abort(&self) {
        self.engine.abort();
        self.p2p.wake();
    }

    /// The first error this communicator hit, if any (like
    /// `ncclCommGetAsyncError`): after a timeout, a lost peer, a mismatch or
    /// an abort, every later op fails with it too. Does not wait.
    pub fn error(&self) -> Option<Error> {
        self.engine
            .first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Number of ops this communicator has completed or failed.
    pub fn ops_done(&self) -> u64 {
        self.engine.with_core(|c| c.seq())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two hosts of 4 ranks each, with `a` and `b` CPUs.
    fn two_hosts(a: usize, b: usize) -> Topology {
        let ids: Vec<String> = (0..8).map(|r| format!("h{}", r / 4)).collect();
        let mut t = Topology::from_host_ids(&ids);
        t.hosts[0].cpus = a;
        t.hosts[1].cpus = b;
        t
    }

    /// An op that panics inside its turn poisons the communicator and passes
    /// the turn on: the caller sees the panic, every later op on any thread
    /// fails at once with `Error::Internal`, an asynchronous op's waiter gets
    /// that error, and a peer waiting in the same op is told (it fails long
    /// before its timeout). Before, the turn was never passed on and every
    /// later op waited for it forever.
    #[test]
    fn a_panicking_op_poisons_the_communicator_and_passes_the_turn_on() {
        use crate::ReduceOp;
        use std::time::{Duration, Instant};
        let internal = |r: Result<()>| matches!(r, Err(Error::Internal(_)));
        // Blocking, one rank.
        let c = Communicator::init_all(1).unwrap().pop().unwrap();
        c.engine.with_core(|k| k.panic_next = true);
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = c.all_reduce(&mut [1.0f32], ReduceOp::Sum);
        }));
        assert!(p.is_err(), "the injected panic reaches the caller");
        let t = Instant::now();
        assert!(internal(c.all_reduce(&mut [1.0f32], ReduceOp::Sum)));
        let other = std::thread::scope(|s| {
            s.spawn(|| c.barrier())
                .join()
                .expect("no panic on another thread")
        });
        assert!(internal(other));
        assert!(t.elapsed() < Duration::from_secs(5));

        // Asynchronous: the progress thread survives and reports.
        let c = Communicator::init_all(1).unwrap().pop().unwrap();
        c.engine.with_core(|k| k.panic_next = true);
        let r = c.all_reduce_async(vec![1.0f32; 4], ReduceOp::Sum).wait();
        assert!(matches!(r, Err(Error::Internal(_))), "{r:?}");
        let r = c.all_reduce_async(vec![1.0f32; 4], ReduceOp::Sum).wait();
        assert!(matches!(r, Err(Error::Internal(_))), "{r:?}");

        // Two ranks: rank 0 panics in an AllReduce that rank 1 waits in.
        let config = Config {
            timeout: Duration::from_secs(60),
            ..Config::from_env().unwrap()
        };
        let mut cs = Communicator::init_all_with(2, config).unwrap();
        let c1 = cs.pop().unwrap();
        let c0 = cs.pop().unwrap();
        c0.engine.with_core(|k| k.panic_next = true);
        let t = Instant::now();
        let (r0, r1) = std::thread::scope(|s| {
            let h1 = s.spawn(|| c1.all_reduce(&mut [1.0f32; 1000], ReduceOp::Sum));
            let h0 = s.spawn(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    c0.all_reduce(&mut [1.0f32; 1000], ReduceOp::Sum)
                }))
            });
            (h0.join().unwrap(), h1.join().unwrap())
        });
        assert!(r0.is_err(), "rank 0 panicked");
        assert!(r1.is_err(), "rank 1 was told: {r1:?}");
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
        assert!(internal(c0.all_reduce(&mut [1.0f32], ReduceOp::Sum)));
    }

    #[test]
    fn cpu_share_comes_from_every_hosts_cpus() {
        // The crowded host decides, whatever this machine has.
        assert_eq!(two_hosts(2, 16).cpu_share(), 0.5);
        assert_eq!(two_hosts(16, 2).cpu_share(), 0.5);
        assert_eq!(two_hosts(8, 16).cpu_share(), 1.0);
        // A host that did not report counts this machine's CPUs.
        let here = crate::transport::sys::online_cpus() as f64;
        assert_eq!(two_hosts(0, 16).cpu_share(), (here / 4.0).min(1.0));
    }
}
