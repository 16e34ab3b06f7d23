//! What online tuning tries for a call ([`candidates`]): the pick, the
//! others priced close to it, and the pick's twins, with streaming ring
//! stores ([`STREAM_MIN_BYTES`]) or direct reads ([`CMA_TWIN_BYTES`]).

use super::select::select_all;
use super::{online, AlgoOverride, Choice, TuneCtx};
use crate::algo::{Algorithm, Problem};
use crate::error::Result;

/// What online tuning tries for `p` ([`online`]): [`select`]'s choice
/// first, then, where the cost model chose (nothing forced), the other
/// algorithms it prices within [`online::SPREAD`] of the cheapest, at most
/// [`online::MAX_CANDIDATES`] in all (where ranks share cores, as
/// [`online::spread`] says), each with its best chunk count; and,
/// on top of those, the pick's streaming twin second where
/// [`STREAM_MIN_BYTES`] says, or its direct-read twin second where
/// [`CMA_TWIN_BYTES`] says (never both: one needs a core per rank, the
/// other ranks that share cores); for a Broadcast, the direct schedule
/// with direct reads instead of the twin ([`BCAST_CMA_BYTES`]).
pub(crate) fn candidates(
    p: &Problem,
    dtype: crate::DataType,
    env: &AlgoOverride,
    ctx: &TuneCtx,
) -> Result<Vec<Choice>> {
    let mut v = select_all(p, dtype, None, env, ctx)?;
    let cheapest = v.iter().map(|c| c.us).fold(f64::INFINITY, f64::min);
    let pick = v[0];
    let direct = v.iter().find(|c| c.algorithm == Algorithm::Direct).copied();
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
    if chose && ctx.cma_trials && ctx.cpu_share < 1.0 {
        if let Some(twin) = cma_twin(p, dtype.size(), pick, direct) {
            out.insert(1, twin);
        }
    }
    Ok(out)
}

/// The direct-read candidate where ranks share cores, if `p` has one:
/// AllToAll and Scatter with blocks of [`CMA_TWIN_BYTES`] or more try the
/// pick with direct reads; a Broadcast of [`BCAST_CMA_BYTES`] or more tries
/// the direct schedule (`direct`: the model's price of it, if it priced
/// it) with direct reads, whatever the pick, so that every non-root copies
/// the message straight out of the root's buffer.
fn cma_twin(p: &Problem, elem: usize, pick: Choice, direct: Option<Choice>) -> Option<Choice> {
    use crate::algo::Collective as C;
    let bytes = p.count * elem;
    match p.coll {
        C::AllToAll | C::Scatter { .. } if bytes >= CMA_TWIN_BYTES => {
            Some(Choice { cma: true, ..pick })
        }
        C::Broadcast { .. } if bytes >= BCAST_CMA_BYTES => {
            let direct = direct.unwrap_or(Choice {
                algorithm: Algorithm::Direct,
                chunks: 1,
                us: f64::NAN,
                stream: false,
                cma: false,
            });
            Some(Choice {
                chunks: 1,
                stream: false,
                cma: true,
                ..direct
            })
        }
        _ => None,
    }
}

/// The smallest message that goes direct ([`Choice::cma`]) in a call of
/// `coll` whose plan reads directly: [`BCAST_CMA_BYTES`] for Broadcast,
/// [`CMA_TWIN_BYTES`] otherwise.
pub(crate) fn cma_direct_bytes(coll: crate::algo::Collective) -> usize {
    match coll {
        crate::algo::Collective::Broadcast { .. } => BCAST_CMA_BYTES,
        _ => CMA_TWIN_BYTES,
    }
}

/// Broadcasts of at least this many bytes try the
/// direct schedule with direct reads ([`Choice::cma`]) where ranks share
/// cores: the root publishes where its buffer is, and every other rank
/// copies the whole message out of it with `process_vm_readv` when its
/// turn on a core comes (as Open MPI's shared-memory transport does).
/// Through the rings, the root copies every byte in once per reader (or a
/// chain or tree forwards it, every hop needing both of its ranks to run),
/// and the readers copy it out again.
///
/// This machine (4 ranks on 2 cores, 2026-12-06, `bench/before_after.sh`,
/// 9 rounds, medians of the paired ratio; docs/performance.md, "Broadcast
/// where ranks share cores"): the direct schedule reading directly from
/// 64 KiB took 0.82x the time of the same schedule through the rings at
/// 128 KiB, 0.55-0.61 at 256-512 KiB, 0.87 at 1 MiB, 0.88-1.01 at 2-8 MiB,
/// 1.17 at 16 MiB, and 1.0-1.2 at 32-64 KiB; against Auto's pick through
/// the rings, 0.70, 0.46-0.48, 0.75, 0.90-0.96 and 1.20. Which wins from
/// 1 MiB up depends on the machine, so online tuning measures it.
pub const BCAST_CMA_BYTES: usize = 128 << 10;

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
/// block), nor the pick of Broadcast (forced, far apart, 1.6x faster at
/// 8-16 MiB in one run but slower at 1-4 MiB and close; tried as a twin of
/// a chain or tree, which must receive a whole message before forwarding
/// it, two runs far apart, Auto never kept it: Broadcast tries the direct
/// schedule instead, [`BCAST_CMA_BYTES`]), nor the collectives that forward or reduce
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
