//! Pricing: every algorithm that implements a call, with its best pipeline
//! chunk count, under the cost model ([`cost`](super::cost)), cheapest
//! first; the model's pick among them ([`choose_with`]); and a rule of
//! thumb for when nothing can be priced ([`choose`]).

use super::{cost, Choice, CostModel, TuneCtx};
use crate::algo::{Algorithm, CollKind, Problem};

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

/// Rank counts above which the tuner prices one rank's schedule instead of
/// simulating all of them.
const SIMULATE_ALL_UP_TO: usize = 64;

/// Pipeline chunk counts the tuner tries for algorithms that cut their data
/// into chunks (trees; see [`Problem::chunks`]).
pub const CHUNK_CHOICES: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// Smallest chunk the tuner considers, bytes per rank: below it the fixed
/// cost of a message outweighs what pipelining gains.
const MIN_CHUNK_BYTES: usize = 16 << 10;

/// The cost model the simulation runs with: `ctx.model`, adjusted where
/// ranks share cores.
pub(super) fn simulated_model(ctx: &TuneCtx) -> CostModel {
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
pub(super) fn price(p: &Problem, elem: usize, ctx: &TuneCtx, alg: Algorithm) -> Option<f64> {
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
        if ctx.cpu_share < 1.0 && p.hosts.is_none() && ctx.tcp_only && p.vcounts.is_none() {
            // Over sockets on shared cores, what a message costs the
            // processors counts too: the host's cores share every rank's
            // system calls, so fewer messages win at small sizes.
            let cores = p.nranks as f64 * ctx.cpu_share;
            return cost::predict_sockets_shared(&model, p, alg, elem, &class, cores);
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
    let (chunks, us) = search_chunks(p, elem, alg, |q| price(q, elem, ctx, alg), |&t| t)?;
    Some(Choice {
        algorithm: alg,
        chunks,
        us,
        stream: false,
        cma: false,
    })
}

/// The chunk-count rule every pricer shares: the tuner's [`best_chunks`],
/// and [`fabric_price::best_chunks`](super::fabric_price::best_chunks) for
/// `tutti sim` and `tutti explain`. `price` prices `p` with the chunk
/// count it is given ([`Problem::chunks`]); `us` reads a price's time.
/// Tried: 1 chunk; then, for calls of at least two `MIN_CHUNK_BYTES` (16 KiB)
/// chunks and algorithms whose schedule changes with the chunk count (not
/// the ring), every count of [`CHUNK_CHOICES`] whose chunks stay that
/// large. A finer cut must win by 3%. Returns the count and its price, or
/// `None` if the 1-chunk price is `None` (`alg` does not implement it).
pub fn search_chunks<T>(
    p: &Problem,
    elem: usize,
    alg: Algorithm,
    mut price: impl FnMut(&Problem) -> Option<T>,
    us: impl Fn(&T) -> f64,
) -> Option<(usize, T)> {
    let mut q = Problem {
        chunks: 1,
        ..p.clone()
    };
    let mut best = (1, price(&q)?);
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
        if let Some(t) = price(&q) {
            // A finer cut must win clearly: more messages, more to go wrong.
            if us(&t) < us(&best.1) * 0.97 {
                best = (k, t);
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
/// (the cost model sees bytes and ports, not flows). Otherwise, across
/// hosts, a streaming schedule ([`Algorithm::streams`]) priced within
/// [`STREAM_SLACK`] of the cheapest is taken.
pub fn choose_with(p: &Problem, elem: usize, ctx: &TuneCtx) -> Choice {
    let v = rank_algorithms(p, elem, ctx);
    model_pick(&v, across_hosts(ctx)).map_or(
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

/// Whether `ctx`'s ranks talk TCP to some of their peers (several hosts,
/// or TCP forced), where [`STREAM_SLACK`] applies.
pub(super) fn across_hosts(ctx: &TuneCtx) -> bool {
    !ctx.threads && (ctx.tcp_only || ctx.hosts().is_some())
}

/// Where in `v` (cheapest first) [`choose_with`]'s pick is, if `v` has any;
/// `across_hosts`: some messages go over TCP ([`across_hosts`]).
pub(super) fn model_pick(v: &[Choice], across_hosts: bool) -> Option<usize> {
    pick_among(v, across_hosts, |c| (c.algorithm, c.us))
}

/// Where in `v` (cheapest first; `of` reads an entry's algorithm and time)
/// the model's pick is: the first hierarchical schedule priced within
/// [`HIER_SLACK`] of the cheapest; else, where messages cross hosts
/// (`across_hosts`), the first streaming one ([`Algorithm::streams`])
/// priced within [`STREAM_SLACK`] of it; else the cheapest.
pub(super) fn pick_among<T>(
    v: &[T],
    across_hosts: bool,
    of: impl Fn(&T) -> (Algorithm, f64),
) -> Option<usize> {
    let best = of(v.first()?).1;
    let within = |slack: f64, pick: fn(Algorithm) -> bool| {
        v.iter()
            .map(&of)
            .position(|(a, us)| pick(a) && us <= best * (1.0 + slack))
    };
    Some(
        within(HIER_SLACK, Algorithm::is_hierarchical)
            .or_else(|| {
                across_hosts
                    .then(|| within(STREAM_SLACK, Algorithm::streams))
                    .flatten()
            })
            .unwrap_or(0),
    )
}

/// How much dearer (as a fraction) a hierarchical schedule may be priced
/// than the cheapest flat one and still be chosen (see [`choose_with`]).
pub const HIER_SLACK: f64 = 0.02;

/// How much dearer (as a fraction) a streaming schedule
/// ([`Algorithm::streams`]: the ring) may be priced than the cheapest and
/// still be chosen where messages cross hosts (see [`choose_with`]).
///
/// The cost model prices every schedule as if each rank reached every
/// step on time. Between hosts a store-and-forward schedule
/// (halving-doubling) makes each rank wait for a partner's whole message
/// before it sends to the next partner, so a rank that is late (scheduled
/// late, a TCP stream that ramps slowly) leaves its partner's link idle,
/// and the delay passes to a new partner every round; the ring forwards as
/// it receives, and the socket buffers carry its streams through such a
/// delay. Where both are bandwidth-bound the model prices them alike
/// (the ring's extra latencies are a fraction of a percent), and the
/// measured difference is all in what it does not see: 8 x 1 ranks at 1
/// Gbit/s (namespace cluster, forced algorithms, 16 MiB AllReduce) ran
/// the ring in 247-287 ms, within 7-24% of the model, and
/// halving-doubling in 260-456 ms (docs/sim.md). This slack breaks such
/// near ties toward the ring; a clear win of another schedule still
/// stands. A model of the lateness itself would replace it.
pub const STREAM_SLACK: f64 = 0.02;
