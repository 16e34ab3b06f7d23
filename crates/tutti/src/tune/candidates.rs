//! What online tuning tries for a call ([`candidates`]): the pick, the
//! others priced close to it, and the pick's twins, with streaming ring
//! stores ([`STREAM_MIN_BYTES`]) or direct reads ([`CMA_TWIN_BYTES`]).

use super::select::select_all;
use super::{online, AlgoOverride, Choice, TuneCtx};
use crate::algo::Problem;
use crate::error::Result;

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
