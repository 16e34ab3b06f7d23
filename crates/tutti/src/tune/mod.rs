//! Choosing an algorithm per call, and the `TUTTI_ALGO` override.
//!
//! Every algorithm that implements a collective builds its schedules; the
//! [`cost`] model prices them under the communicator's topology and the
//! cheapest wins ([`choose_with`]). The decision is cached per call shape by
//! the engine, so the pricing runs once per shape, not once per call.

pub(crate) mod calibrate;
pub mod cost;
pub mod online;

use crate::algo::{Algorithm, CollKind, Collective, Problem};
pub use crate::config::AlgoOverride;
use crate::error::{Error, Result};
pub use cost::{CostModel, LinkClass, LinkCost};

/// A rule of thumb for `p` (of `bytes` bytes per rank) that needs no
/// topology: the fallback when the cost model has nothing to price.
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

/// What the tuner knows about a communicator: how ranks are connected and
/// the cost-model parameters. The same on every rank, so every rank picks
/// the same algorithm.
#[derive(Clone, Debug)]
pub struct TuneCtx {
    /// Cost-model parameters.
    pub model: CostModel,
    /// Host index of every rank.
    pub host_of: Vec<usize>,
    /// Ranks are threads of one process.
    pub threads: bool,
    /// TCP is forced between all ranks.
    pub tcp_only: bool,
    /// Float reductions must not depend on the algorithm (`TUTTI_DETERMINISTIC=1`).
    pub deterministic: bool,
    /// The direct algorithm runs small calls through one-shot mailboxes
    /// (every rank on one host, over shared memory or as threads).
    pub mailbox: bool,
    /// The share of a core each rank gets on the most crowded host: 1.0
    /// where every rank has a core, cores / ranks where a host runs more
    /// ranks than this machine has cores. Below 1, a hand-off between
    /// ranks is priced at no less than `mailbox_us`, and every byte a rank
    /// moves or reduces at that share of the measured rates (not the
    /// mailboxes' own: those were measured with every rank at work).
    pub cpu_share: f64,
    /// Bytes of each shared-memory ring between two ranks
    /// ([`Config::ring_bytes`](crate::Config::ring_bytes)): where ranks
    /// share cores, a sender that fills the ring waits for its receiver to
    /// run, so a message costs a hand-off per ring's worth of bytes.
    pub ring_bytes: usize,
    /// Online tuning may try the pick with streaming ring stores
    /// ([`Choice::stream`]): some ranks share a host's rings and
    /// `TUTTI_SHM_STREAM` is `auto`.
    pub stream_trials: bool,
    /// Online tuning may try the pick with direct reads of large messages
    /// ([`Choice::cma`]): some ranks share a host, every such host's
    /// ranks can read each other's memory (`Host::cma`), and
    /// `TUTTI_SHM_DIRECT_BYTES` is unset.
    pub cma_trials: bool,
}

impl TuneCtx {
    /// The link class between ranks `a` and `b`.
    pub fn class(&self, a: usize, b: usize) -> LinkClass {
        if self.threads {
            LinkClass::Local
        } else if self.tcp_only || self.host_of.get(a) != self.host_of.get(b) {
            LinkClass::Tcp
        } else {
            LinkClass::Shm
        }
    }

    /// A context for `n` ranks on one host, with default parameters.
    pub fn single_host(n: usize) -> Self {
        TuneCtx {
            model: CostModel::default(),
            host_of: vec![0; n],
            threads: false,
            tcp_only: false,
            deterministic: false,
            mailbox: n > 1,
            cpu_share: 1.0,
            ring_bytes: crate::Config::default().ring_bytes,
            stream_trials: n > 1,
            cma_trials: false,
        }
    }

    /// The host layout to put in problems, when ranks span several hosts.
    pub fn hosts(&self) -> Option<std::sync::Arc<[usize]>> {
        let many_hosts = self.host_of.iter().any(|&h| h != self.host_of[0]);
        (many_hosts && !self.threads).then(|| self.host_of.clone().into())
    }
}

/// Rank counts above which the tuner prices one rank's schedule instead of
/// simulating all of them.
const SIMULATE_ALL_UP_TO: usize = 64;

/// Pipeline chunk counts the tuner tries for algorithms that cut their data
/// into chunks (trees; see [`Problem::chunks`]).
pub const CHUNK_CHOICES: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// Smallest chunk the tuner considers, bytes per rank: below it the fixed
/// cost of a message outweighs what pipelining gains.
const MIN_CHUNK_BYTES: usize = 16 << 10;

/// One priced candidate: an algorithm, how many pipeline chunks it cuts the
/// data into, and the cost model's predicted time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Pipeline chunks ([`Problem::chunks`]); 1 for algorithms without.
    pub chunks: usize,
    /// Predicted time in microseconds (NaN when nothing priced it).
    pub us: f64,
    /// Shared-memory sends write the rings (a one-shot call its mailbox
    /// slot) with non-temporal stores ([`STREAM_MIN_BYTES`]). The cost
    /// model never sets it: online tuning
    /// tries it beside the model's pick ([`online`]).
    pub stream: bool,
    /// Shared-memory messages of [`CMA_TWIN_BYTES`] or more go direct:
    /// the receiver reads them from the sender's buffer
    /// (`process_vm_readv`, one copy) instead of through the ring. The
    /// cost model never sets it: online tuning tries it beside the model's
    /// pick where ranks share cores ([`CMA_TWIN_BYTES`]).
    pub cma: bool,
}

impl Choice {
    /// How the choice's name marks a twin of an algorithm (as `tutti perf`
    /// and the debug log print it): `+stream` ([`Choice::stream`]), `+cma`
    /// ([`Choice::cma`]), or nothing.
    pub fn twin(&self) -> &'static str {
        match (self.stream, self.cma) {
            (true, _) => "+stream",
            (_, true) => "+cma",
            _ => "",
        }
    }
}

/// The cost model the simulation runs with: `ctx.model`, adjusted where
/// ranks share cores.
fn simulated_model(ctx: &TuneCtx) -> CostModel {
    let mut model = ctx.model;
    if ctx.cpu_share < 1.0 {
        // A hand-off between ranks that share cores waits for the peer to
        // be scheduled. The ping-pong that measured `alpha` ran while the
        // other ranks idled; the mailbox op was measured with every rank
        // at work, so it is the better price of a hand-off here.
        model.shm.alpha_us = model.shm.alpha_us.max(model.mailbox_us);
        model.local.alpha_us = model.local.alpha_us.max(model.mailbox_us);
        // The rates were measured with a core per rank; the simulation
        // gives every rank its own CPU, so each gets its share of one.
        let f = ctx.cpu_share;
        model.shm.gbps *= f;
        model.local.gbps *= f;
        model.copy_gbps *= f;
        model.reduce_gbps *= f;
    }
    model
}

/// Predicted time of `alg` on `p` as it stands (chunks included).
fn price(p: &Problem, elem: usize, ctx: &TuneCtx, alg: Algorithm) -> Option<f64> {
    if alg == Algorithm::Direct && ctx.mailbox {
        if let Some(t) = cost::predict_mailbox(&ctx.model, p, elem) {
            return Some(t);
        }
    }
    let class = |a: usize, b: usize| ctx.class(a, b);
    let model = simulated_model(ctx);
    if p.nranks <= SIMULATE_ALL_UP_TO {
        if ctx.cpu_share < 1.0 && p.hosts.is_none() && !ctx.tcp_only && p.vcounts.is_none() {
            // The simulation charges each hand-off once, on the critical
            // path. On a shared core, the wait is also a switch: the
            // waiting rank sleeps and a peer is woken, and the core's other
            // ranks wait their turn meanwhile. So each hand-off on the
            // critical path costs 1/cpu_share - 1 more: the ring's 2(n-1)
            // rounds against two-shot's 2 or halving-doubling's 2 log2(n).
            // Only on one host, over shared memory: a TCP message's alpha
            // is the network's, not a switch; and only where every rank's
            // schedule is known (not AllToAllV).
            let extra = 1.0 / ctx.cpu_share - 1.0;
            return cost::predict_shared(&model, p, alg, elem, &class, ctx.ring_bytes, extra);
        }
        cost::predict(&model, p, alg, elem, &class)
    } else {
        let mut q = p.clone();
        q.rank = 0;
        cost::predict_one(&model, &q, alg, elem, &class)
    }
}

/// `alg` on `p` with its best chunk count from [`CHUNK_CHOICES`], or `None`
/// if `alg` does not implement `p`'s collective.
pub fn best_chunks(p: &Problem, elem: usize, ctx: &TuneCtx, alg: Algorithm) -> Option<Choice> {
    let mut q = Problem {
        chunks: 1,
        ..p.clone()
    };
    let mut best = Choice {
        algorithm: alg,
        chunks: 1,
        us: price(&q, elem, ctx, alg)?,
        stream: false,
        cma: false,
    };
    let bytes = p.count * elem;
    // The ring cuts its own pieces, to save memory traffic the model does
    // not count (`algo/ring.rs`, `Pieces`).
    if bytes < 2 * MIN_CHUNK_BYTES || alg == Algorithm::Ring {
        return Some(best);
    }
    // Only algorithms whose schedule changes with the chunk count.
    let steps = |q: &Problem| alg.build(q).map(|s| s.steps.len());
    let one = steps(&q);
    q.chunks = 2;
    if steps(&q) == one {
        return Some(best);
    }
    for k in CHUNK_CHOICES.into_iter().skip(1) {
        if bytes / k < MIN_CHUNK_BYTES {
            break;
        }
        q.chunks = k;
        if let Some(t) = price(&q, elem, ctx, alg) {
            // A finer cut must win clearly: more messages, more to go wrong.
            if t < best.us * 0.97 {
                best = Choice {
                    algorithm: alg,
                    chunks: k,
                    us: t,
                    stream: false,
                    cma: false,
                };
            }
        }
    }
    Some(best)
}

/// Prices every algorithm that implements `p`, hierarchical with every
/// level choice ([`Algorithm::VARIANTS`]; those build only when `p.hosts`
/// spans several hosts), each with its best chunk count, and returns them
/// cheapest first.
pub fn rank_algorithms(p: &Problem, elem: usize, ctx: &TuneCtx) -> Vec<Choice> {
    rank_among(p, elem, ctx, &Algorithm::VARIANTS)
}

/// [`rank_algorithms`] restricted to `candidates`.
pub fn rank_among(
    p: &Problem,
    elem: usize,
    ctx: &TuneCtx,
    candidates: &[Algorithm],
) -> Vec<Choice> {
    let mut v: Vec<Choice> = candidates
        .iter()
        .filter_map(|&a| best_chunks(p, elem, ctx, a))
        .collect();
    // Stable: ties keep the order of `candidates` (Algorithm::VARIANTS:
    // flat first, default levels first).
    v.sort_by(|x, y| x.us.total_cmp(&y.us));
    v
}

/// The algorithm (and chunk count) the cost model picks for `p`, with its
/// predicted time.
///
/// Across hosts, a hierarchical schedule priced within [`HIER_SLACK`] of
/// the cheapest flat one is taken instead: a host's link then carries
/// messages of L ranks to L peers instead of L x L pairs of them, and the
/// fewer, larger TCP flows leave the link less idle where a call ends
/// (the cost model sees bytes and ports, not flows).
pub fn choose_with(p: &Problem, elem: usize, ctx: &TuneCtx) -> Choice {
    let v = rank_algorithms(p, elem, ctx);
    model_pick(&v).map_or(
        Choice {
            algorithm: choose(p, p.count * elem),
            chunks: 1,
            us: f64::NAN,
            stream: false,
            cma: false,
        },
        |i| v[i],
    )
}

/// Where in `v` (cheapest first) [`choose_with`]'s pick is, if `v` has any.
fn model_pick(v: &[Choice]) -> Option<usize> {
    let best = v.first()?;
    Some(
        v.iter()
            .position(|c| c.algorithm.is_hierarchical() && c.us <= best.us * (1.0 + HIER_SLACK))
            .unwrap_or(0),
    )
}

/// How much dearer (as a fraction) a hierarchical schedule may be priced
/// than the cheapest flat one and still be chosen (see [`choose_with`]).
pub const HIER_SLACK: f64 = 0.02;

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

/// What online tuning tries for `p` ([`online`]): [`select`]'s choice
/// first, then, where the cost model chose (nothing forced), the other
/// algorithms it prices within [`online::SPREAD`] of the cheapest, at most
/// [`online::MAX_CANDIDATES`] in all (where ranks share cores, as
/// [`online::spread`] says), each with its best chunk count; and,
/// on top of those, the pick's streaming twin second where
/// [`STREAM_MIN_BYTES`] says, or its direct-read twin second where
/// [`CMA_TWIN_BYTES`] says (never both: one needs a core per rank, the
/// other ranks that share cores).
pub(crate) fn candidates(
    p: &Problem,
    dtype: crate::DataType,
    env: &AlgoOverride,
    ctx: &TuneCtx,
) -> Result<Vec<Choice>> {
    let mut v = select_all(p, dtype, None, env, ctx)?;
    let cheapest = v.iter().map(|c| c.us).fold(f64::INFINITY, f64::min);
    let pick = v[0];
    // One choice: forced (`TUTTI_ALGO`), which leaves the stores alone too.
    let chose = v.len() > 1;
    let (spread, most) = online::spread(ctx.cpu_share);
    let rest = v.drain(1..).filter(|c| c.us <= cheapest * spread);
    let mut out = vec![pick];
    out.extend(rest.take(most - 1));
    if chose
        && ctx.stream_trials
        && ctx.cpu_share >= 1.0
        && p.count * dtype.size() >= STREAM_MIN_BYTES
    {
        out.insert(
            1,
            Choice {
                stream: true,
                ..pick
            },
        );
    }
    if chose
        && ctx.cma_trials
        && ctx.cpu_share < 1.0
        && cma_twin_may_pay(p.coll)
        && p.count * dtype.size() >= CMA_TWIN_BYTES
    {
        out.insert(1, Choice { cma: true, ..pick });
    }
    Ok(out)
}

/// Whether online tuning tries `coll`'s direct-read twin where ranks share
/// cores ([`CMA_TWIN_BYTES`]): AllToAll, and Scatter, whose readers copy
/// their blocks out of the root's buffer in parallel where the root
/// otherwise copies every byte into the rings.
fn cma_twin_may_pay(coll: crate::algo::Collective) -> bool {
    use crate::algo::Collective as C;
    matches!(coll, C::AllToAll | C::Scatter { .. })
}

/// Messages of at least this many bytes go direct in the direct-read twin
/// ([`Choice::cma`]), which online tuning tries where ranks share cores for
/// AllToAll and Scatter calls whose blocks (one per peer) are this large.
///
/// Why: where ranks share cores, a ring between two ranks moves only while
/// both run, and a sender that fills it waits for its receiver to be
/// scheduled; a direct read needs the sender only to publish where its
/// buffer is, and the receiver copies the whole message in one call when
/// its turn comes. Open MPI's AllToAll reads that way. This machine (4
/// ranks on 2 cores, AllToAll, `TUTTI_SHM_DIRECT_BYTES=256K` against the
/// rings, docs/algorithms.md): 2 MiB 462-473 us against 736-745 (Open MPI
/// 545-580) with the two CPUs on one core's hyperthreads, 1-4 MiB 1.4-1.8x
/// faster with the CPUs far apart, but 8-16 MiB 1.15-1.27x slower with
/// them close: measured, not priced. Scatter, forced, far apart: 4-16 MiB
/// 1.5-2.2x faster (16 MiB 1264-1314 us against 2797-2821), close 1.3-2.4x
/// slower below 8 MiB. Not Gather (slower far apart: its root reads every
/// block), nor Broadcast (forced, far apart, 1.6x faster at 8-16 MiB in
/// one run but slower at 1-4 MiB and close; tried as a twin, two runs far
/// apart, Auto never kept it), nor the collectives that forward or reduce
/// what they receive (mostly slower at 4 ranks). Not where every rank has
/// a core: 2 ranks, AllToAll of 1 MiB took 110-157 us direct against 46-61
/// (CPUs close) and 98-105 (far apart, streamed) through the rings.
pub const CMA_TWIN_BYTES: usize = 256 << 10;

/// Calls of at least this many bytes (count x element size) try their
/// pick a second time with streaming ring stores ([`Choice::stream`]),
/// where every rank has a core of its own and ranks share a host.
///
/// Why: a shared-memory ring is written by one core and read by another,
/// so every line of it changes hands twice per lap (the reader's miss, and
/// the writer's request for ownership of the line the reader still holds).
/// Where the two cores are close (one L3) that costs little and the ring
/// stays in the cache; where they are far apart (two sockets, or a guest's
/// two CPUs placed on distant cores) each hand-off costs a long round trip
/// and the writer's stores wait on them. Non-temporal stores skip the
/// request for ownership and leave the line in memory, where the reader's
/// prefetchers find it. Which wins depends on where the CPUs are now,
/// which a guest cannot see and which changes while it runs, so it is
/// measured, not priced. This machine (2 ranks, 1 MiB AllToAll): with the
/// CPUs close, 51-61 us with cached stores against 137-161 us streaming;
/// far apart (a cache-line round trip of 570 ns instead of 165), 177-205
/// us against 98-105 (docs/performance.md). At 16 KiB streaming still
/// won far apart (Broadcast 1.9-2.2 us against 3.3-3.5); smaller calls
/// were not measured, and their trials already run many calls. Not where ranks share cores: 4
/// ranks on 2 cores, streaming took 0.80-1.23x the cached time far apart
/// and 1.1-2.5x close (docs/algorithms.md).
pub const STREAM_MIN_BYTES: usize = 16 << 10;

/// [`select`]'s choice first; where the cost model chose, the other
/// algorithms it priced follow, cheapest first.
fn select_all(
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
    match model_pick(&v) {
        Some(i) => {
            v[..=i].rotate_right(1);
            Ok(v)
        }
        None => Ok(vec![choose_with(p, elem, ctx)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Collective;

    /// `hosts` hosts of `l` ranks each (rank r on host r / l), priced with `model`.
    fn grid_ctx(hosts: usize, l: usize, model: CostModel) -> TuneCtx {
        TuneCtx {
            model,
            host_of: (0..hosts * l).map(|r| r / l).collect(),
            threads: false,
            tcp_only: false,
            deterministic: false,
            mailbox: false,
            cpu_share: 1.0,
            ring_bytes: 512 << 10,
            stream_trials: l > 1,
            cma_trials: l > 1,
        }
    }

    /// The default model with 1 Gbit/s-like TCP links.
    fn gbit_model() -> CostModel {
        CostModel {
            tcp: LinkCost {
                alpha_us: 30.0,
                gbps: 0.12,
            },
            ..CostModel::default()
        }
    }

    #[test]
    fn mailbox_priced_at_its_own_rates() {
        // 2 ranks, 8 KiB per rank: the mailboxes copy at `mailbox_gbps`
        // and reduce at `mailbox_reduce_gbps`, not at the rings' rates.
        let ctx = TuneCtx::single_host(2);
        let m = ctx.model;
        let (b, us) = (8192.0, m.mailbox_us);
        let ag = Problem::new(Collective::AllGather, 2, 0, 2048);
        let ar = Problem::new(Collective::AllReduce, 2, 0, 2048);
        let got = cost::predict_mailbox(&m, &ag, 4).unwrap();
        assert!(
            (got - (us + 2.0 * b / m.mailbox_gbps / 1e3)).abs() < 1e-9,
            "{got}"
        );
        let got = cost::predict_mailbox(&m, &ar, 4).unwrap();
        let want = us + b / m.mailbox_gbps / 1e3 + b / m.mailbox_reduce_gbps / 1e3;
        assert!((got - want).abs() < 1e-9, "{got} {want}");
        // The tuner follows the rates: slow mailbox copies send a 32 KiB
        // AllGather through the rings.
        let p = Problem::new(Collective::AllGather, 2, 0, 4096);
        assert_eq!(choose_with(&p, 4, &ctx).algorithm, Algorithm::Direct);
        let mut slow = ctx.clone();
        slow.model.mailbox_gbps = 1.0;
        assert_ne!(choose_with(&p, 4, &slow).algorithm, Algorithm::Direct);
    }

    #[test]
    fn hierarchical_variants_only_across_hosts() {
        // One host: no hierarchical variant is priced.
        let p = Problem::new(Collective::AllReduce, 4, 0, 1 << 20);
        let v = rank_algorithms(&p, 4, &TuneCtx::single_host(4));
        assert!(v.iter().all(|c| !c.algorithm.is_hierarchical()), "{v:?}");
        // 4 hosts x 2 ranks on 1 Gbit/s links: every AllReduce variant
        // (intra=ring) is priced.
        let ctx = grid_ctx(4, 2, gbit_model());
        for count in [16usize, 1 << 20] {
            let mut p = Problem::new(Collective::AllReduce, 8, 0, count);
            p.hosts = ctx.hosts();
            let v = rank_algorithms(&p, 4, &ctx);
            let hier: Vec<Algorithm> = v
                .iter()
                .map(|c| c.algorithm)
                .filter(|a| a.is_hierarchical())
                .collect();
            assert_eq!(hier.len(), 4, "{v:?}");
            eprintln!("count {count}: {v:?}");
            // Auto picks among the levels: a latency-bound inter-host step
            // for a tiny buffer, the default rings for a large one.
            let best = v[0].algorithm;
            if count == 16 {
                assert!(
                    matches!(best, Algorithm::Hierarchical(l) if l.inter != crate::algo::Level::Ring),
                    "{v:?}"
                );
            } else {
                assert!(best.is_hierarchical(), "{v:?}");
            }
        }
    }

    #[test]
    fn cost_model_prefers_latency_for_small_and_bandwidth_for_large() {
        for n in [2usize, 4, 8] {
            let ctx = TuneCtx::single_host(n);
            let small = choose_with(&Problem::new(Collective::AllReduce, n, 0, 2), 4, &ctx);
            let large = choose_with(
                &Problem::new(Collective::AllReduce, n, 0, 64 << 20),
                4,
                &ctx,
            );
            let rs = rank_algorithms(
                &Problem::new(Collective::AllReduce, n, 0, 64 << 20),
                4,
                &ctx,
            );
            eprintln!("n={n}: small {small:?} large {large:?} all {rs:?}");
            assert!(small.us < 20.0, "small allreduce predicted {small:?}");
            assert!(large.us > small.us);
            // Large messages: an algorithm moving ~2(n-1)/n of the data, not direct.
            assert_ne!(large.algorithm, Algorithm::Direct, "n={n}");
        }
    }

    #[test]
    fn hierarchical_wins_across_hosts() {
        for (hosts, l) in [(2usize, 2usize), (2, 4)] {
            let ctx = grid_ctx(hosts, l, CostModel::default());
            let mut p = Problem::new(Collective::AllReduce, hosts * l, 0, 4 << 20);
            p.hosts = ctx.hosts();
            let v = rank_algorithms(&p, 4, &ctx);
            eprintln!("{hosts}x{l}: {v:?}");
            assert!(v[0].algorithm.is_hierarchical(), "{v:?}");
        }
    }

    /// A large AllToAll across hosts: hierarchical moves the same bytes
    /// over the network as a flat one (plus a pipelined shared-memory pass),
    /// so the model prices the two within a few percent; the slack takes
    /// the hierarchical one. On one host nothing hierarchical is priced.
    #[test]
    fn hierarchical_all_to_all_within_slack() {
        use crate::algo::{Level, Levels};
        let ctx = grid_ctx(2, 4, gbit_model());
        // 16 MiB of f32 per rank: 512 Ki elements per block.
        let mut p = Problem::new(Collective::AllToAll, 8, 0, 512 << 10);
        p.hosts = ctx.hosts();
        let v = rank_algorithms(&p, 4, &ctx);
        let flat = v.iter().find(|c| !c.algorithm.is_hierarchical()).unwrap();
        let hier = Algorithm::Hierarchical(Levels {
            intra: Level::Direct,
            inter: Level::Direct,
        });
        let h = v.iter().find(|c| c.algorithm == hier).unwrap();
        assert!(h.us <= flat.us * (1.0 + HIER_SLACK), "{v:?}");
        assert_eq!(choose_with(&p, 4, &ctx).algorithm, hier, "{v:?}");
        // Only hierarchical (intra=direct, inter=direct) does AllToAll.
        assert_eq!(
            v.iter().filter(|c| c.algorithm.is_hierarchical()).count(),
            1,
            "{v:?}"
        );
        let one = TuneCtx::single_host(8);
        let q = Problem::new(Collective::AllToAll, 8, 0, 512 << 10);
        assert!(!choose_with(&q, 4, &one).algorithm.is_hierarchical());
        // Forced for all_to_all, it runs AllToAll and leaves AllToAllV
        // (which it does not do) to the tuner; an algorithm that does
        // neither is still an error.
        let f32 = crate::DataType::F32;
        let o = AlgoOverride::parse(&format!("all_to_all:{}", hier.name())).unwrap();
        assert_eq!(select(&p, f32, None, &o, &ctx).unwrap().algorithm, hier);
        let mut pv = p.clone();
        pv.coll = Collective::AllToAllV;
        pv.vcounts = Some(crate::algo::VCounts {
            send_counts: vec![1; 8],
            send_displs: (0..8).collect(),
            recv_counts: vec![1; 8],
            recv_displs: (0..8).collect(),
        });
        let got = select(&pv, f32, None, &o, &ctx).unwrap().algorithm;
        assert!(!got.is_hierarchical(), "{got}");
        let o = AlgoOverride::parse("all_to_all:ring").unwrap();
        assert!(select(&pv, f32, None, &o, &ctx).is_err());
        // One that does both runs both.
        let o = AlgoOverride::parse("all_to_all:pairwise").unwrap();
        let got = select(&pv, f32, None, &o, &ctx).unwrap().algorithm;
        assert_eq!(got, Algorithm::Pairwise);
    }

    #[test]
    fn deterministic_mode_picks_rank_order_algorithms() {
        let mut ctx = TuneCtx::single_host(4);
        ctx.deterministic = true;
        for count in [1usize, 1000, 1 << 22] {
            let p = Problem::new(Collective::AllReduce, 4, 0, count);
            let a = select(
                &p,
                crate::DataType::F32,
                None,
                &AlgoOverride::default(),
                &ctx,
            )
            .unwrap()
            .algorithm;
            assert!(matches!(a, Algorithm::Direct | Algorithm::TwoShot), "{a}");
            let a = select(
                &p,
                crate::DataType::I32,
                None,
                &AlgoOverride::default(),
                &ctx,
            )
            .unwrap();
            let _ = a; // integers are exact: any algorithm
        }
    }

    /// 4 ranks on 2 cores with a 3 us hand-off (as measured here), the
    /// shared-memory rate halved per rank.
    fn shared_ctx() -> TuneCtx {
        let mut ctx = TuneCtx::single_host(4);
        ctx.model.shm.alpha_us = 3.0;
        ctx.model.mailbox_us = 3.0;
        ctx.cpu_share = 0.5;
        ctx
    }

    /// Online tuning tries the pick a second time with streaming ring
    /// stores where ranks have a core each, share a host's rings, and the
    /// call has at least STREAM_MIN_BYTES; never where the algorithm is
    /// forced.
    #[test]
    fn the_pick_has_a_streaming_twin_where_it_may_pay() {
        let f32s = crate::DataType::F32;
        fn no_twin(ctx: &TuneCtx) -> TuneCtx {
            TuneCtx {
                stream_trials: false,
                ..ctx.clone()
            }
        }
        let free = AlgoOverride::default();
        let twins = |ctx: &TuneCtx, count: usize, env: &AlgoOverride| {
            let p = Problem::new(Collective::AllToAll, ctx.host_of.len(), 0, count);
            let c = candidates(&p, f32s, env, ctx).unwrap();
            assert!(c.len() <= online::MAX_CANDIDATES + 1, "{c:?}");
            // The twin comes on top: no algorithm is left out for it.
            let algorithms = c.iter().filter(|x| !x.stream).count();
            assert_eq!(
                algorithms,
                candidates(&p, f32s, env, &no_twin(ctx)).unwrap().len()
            );
            assert!(!c[0].stream, "{c:?}");
            c.iter().filter(|x| x.stream).count()
        };
        let own = TuneCtx::single_host(2);
        let big = STREAM_MIN_BYTES / 4;
        assert_eq!(twins(&own, big, &free), 1);
        let c = candidates(
            &Problem::new(Collective::AllToAll, 2, 0, big),
            f32s,
            &free,
            &own,
        )
        .unwrap();
        assert_eq!(
            c[1],
            Choice {
                stream: true,
                ..c[0]
            }
        );
        assert_eq!(twins(&own, big - 1, &free), 0);
        assert_eq!(twins(&shared_ctx(), big * 4, &free), 0);
        assert_eq!(twins(&no_twin(&own), big, &free), 0);
        let forced = AlgoOverride::parse("pairwise").unwrap();
        assert_eq!(twins(&own, big, &forced), 0);
    }

    /// Online tuning tries the pick a second time with direct reads where
    /// ranks share cores, for AllToAll and Scatter blocks of CMA_TWIN_BYTES
    /// or more,
    /// where the hosts can read their ranks' memory; never beside the
    /// streaming twin, nor where the algorithm is forced.
    #[test]
    fn the_pick_has_a_direct_read_twin_where_ranks_share_cores() {
        let f32s = crate::DataType::F32;
        let free = AlgoOverride::default();
        let shared = TuneCtx {
            cma_trials: true,
            ..shared_ctx()
        };
        let twins = |ctx: &TuneCtx, coll: Collective, count: usize, env: &AlgoOverride| {
            let p = Problem::new(coll, ctx.host_of.len(), 0, count);
            let c = candidates(&p, f32s, env, ctx).unwrap();
            let without = TuneCtx {
                cma_trials: false,
                ..ctx.clone()
            };
            let algorithms = c.iter().filter(|x| !x.cma).count();
            assert_eq!(
                algorithms,
                candidates(&p, f32s, env, &without).unwrap().len()
            );
            assert!(!c[0].cma && c.iter().all(|x| !(x.cma && x.stream)), "{c:?}");
            if c.iter().any(|x| x.cma) {
                assert_eq!(c[1], Choice { cma: true, ..c[0] });
            }
            c.iter().filter(|x| x.cma).count()
        };
        let big = CMA_TWIN_BYTES / 4;
        assert_eq!(twins(&shared, Collective::AllToAll, big, &free), 1);
        assert_eq!(twins(&shared, Collective::AllToAll, big - 1, &free), 0);
        assert_eq!(
            twins(&shared, Collective::Scatter { root: 1 }, big, &free),
            1
        );
        assert_eq!(
            twins(&shared, Collective::Scatter { root: 1 }, big - 1, &free),
            0
        );
        assert_eq!(
            twins(&shared, Collective::Broadcast { root: 0 }, big, &free),
            0
        );
        assert_eq!(
            twins(&shared, Collective::Gather { root: 0 }, big, &free),
            0
        );
        assert_eq!(twins(&shared, Collective::AllGather, big, &free), 0);
        assert_eq!(twins(&shared, Collective::AllReduce, 4 * big, &free), 0);
        let own = TuneCtx {
            cma_trials: true,
            ..TuneCtx::single_host(4)
        };
        assert_eq!(twins(&own, Collective::AllToAll, big, &free), 0);
        assert_eq!(twins(&shared_ctx(), Collective::AllToAll, big, &free), 0);
        let forced = AlgoOverride::parse("pairwise").unwrap();
        assert_eq!(twins(&shared, Collective::AllToAll, big, &forced), 0);
    }

    /// Whether a rank runs in place is its own affair: the choice (and the
    /// chunk count) must not depend on it, or ranks that differ in it pick
    /// different algorithms.
    #[test]
    fn in_place_does_not_change_the_choice() {
        let env = AlgoOverride::default();
        let mut differ = 0;
        for ctx in [
            TuneCtx::single_host(4),
            shared_ctx(),
            TuneCtx::single_host(3),
        ] {
            let n = ctx.host_of.len();
            for coll in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
            ] {
                let mut count = 1;
                while count <= 1 << 22 {
                    let mut p = Problem::new(coll, n, 0, count);
                    let out = select(&p, crate::DataType::F32, None, &env, &ctx).unwrap();
                    p.in_place = true;
                    let inp = select(&p, crate::DataType::F32, None, &env, &ctx).unwrap();
                    assert_eq!(
                        (out.algorithm, out.chunks),
                        (inp.algorithm, inp.chunks),
                        "{coll:?} count {count} on {n} ranks"
                    );
                    // What the choice would be if priced in place.
                    let priced_in_place = rank_algorithms(&p, 4, &ctx)[0];
                    differ += usize::from(priced_in_place.algorithm != out.algorithm);
                    count = count * 3 + 1;
                }
            }
        }
        // The grid reaches a point where pricing in place would choose
        // differently, so the test can tell.
        assert!(differ > 0, "no crossover on the grid");
    }

    #[test]
    fn handoffs_count_rounds_and_ring_fills() {
        let ctx = shared_ctx();
        let m = ctx.model;
        let class = |a: usize, b: usize| ctx.class(a, b);
        let rounds = |alg: Algorithm, bytes: usize| {
            let p = Problem::new(Collective::AllReduce, 4, 0, bytes / 4);
            let scheds = cost::schedules(&p, alg).unwrap();
            cost::handoffs(&m, &scheds, 4, &class, ctx.ring_bytes) / m.shm.alpha_us
        };
        // 64 KiB: every message fits a ring.
        let (ring, hd, two) = (
            rounds(Algorithm::Ring, 64 << 10),
            rounds(Algorithm::HalvingDoubling, 64 << 10),
            rounds(Algorithm::TwoShot, 64 << 10),
        );
        // The ring's first send, then five forwards: each leaves one alpha
        // after its receive began and arrives one alpha later.
        assert!((10.5..11.5).contains(&ring), "ring {ring}");
        assert!((3.9..4.5).contains(&hd), "halving-doubling {hd}");
        assert!(two < 3.5, "two-shot {two}");
        // 8 MiB: the ring's messages are 2 MiB, four rings' worth each.
        let big = rounds(Algorithm::Ring, 8 << 20);
        assert!(big > ring + 12.0, "{big} vs {ring}");
    }

    #[test]
    fn sharing_cores_prices_the_rings_rounds() {
        // At 128 KiB the ring's six rounds cost more than its bytes save.
        let p = Problem::new(Collective::AllReduce, 4, 0, 32 << 10);
        let shared = shared_ctx();
        let ranked = rank_among(
            &p,
            4,
            &shared,
            &[
                Algorithm::Ring,
                Algorithm::HalvingDoubling,
                Algorithm::TwoShot,
            ],
        );
        assert_ne!(ranked[0].algorithm, Algorithm::Ring, "{ranked:?}");
        // A core per rank: no extra cost, the ring is not dearer than before.
        let own = TuneCtx {
            cpu_share: 1.0,
            ..shared.clone()
        };
        let price_of = |ctx: &TuneCtx, a| price(&p, 4, ctx, a).unwrap();
        let extra = |a| {
            // The same simulation without the hand-off term.
            price_of(&shared, a)
                - cost::predict(&simulated_model(&shared), &p, a, 4, &|x, y| {
                    shared.class(x, y)
                })
                .unwrap()
        };
        assert!(extra(Algorithm::Ring) > 2.0 * extra(Algorithm::TwoShot));
        assert!(price_of(&own, Algorithm::Ring) < price_of(&shared, Algorithm::Ring));
    }

    #[test]
    fn local_steps_in_cache_at_the_mailbox_rates() {
        use crate::algo::{Loc, Step};
        let m = CostModel {
            copy_gbps: 10.0,
            reduce_gbps: 5.0,
            mailbox_gbps: 40.0,
            mailbox_reduce_gbps: 30.0,
            ..CostModel::default()
        };
        let copy = Step::Copy {
            src: Loc::input(0),
            dst: Loc::output(0),
            len: 1,
        };
        let reduce = Step::Reduce {
            src: Loc::input(0),
            dst: Loc::output(0),
            len: 1,
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.max(1.0);
        let (small, large) = ((256 << 10) as f64, (4 << 20) as f64);
        // In cache: the mailboxes' rates.
        assert!(close(m.local_us(&copy, small), small / 40.0 / 1e3));
        assert!(close(m.local_us(&reduce, small), small / 30.0 / 1e3));
        // Streaming: the copy and reduction rates.
        assert!(close(m.local_us(&copy, large), large / 10.0 / 1e3));
        assert!(close(m.local_us(&reduce, large), large / 5.0 / 1e3));
        // A streaming rate above the mailboxes' is kept in cache too.
        let fast = CostModel {
            copy_gbps: 50.0,
            ..m
        };
        assert!(close(fast.local_us(&copy, small), small / 50.0 / 1e3));
        // Messages are not local steps.
        let send = Step::Send {
            peer: 1,
            src: Loc::input(0),
            len: 1,
        };
        assert_eq!(m.local_us(&send, small), 0.0);
    }
}
