//! Reduction chains: the executor runs a chain of steps that reduce into one
//! accumulator piece by piece, so each piece meets its operands while it is
//! in the cache ([`Schedule::reduce_chain`]).

use super::{resolve, Buffers, Env, Scratchpad, StepState};
use crate::algo::{Schedule, Step};
use crate::error::Result;
use crate::reduce;
use crate::transport::{Link, LinkOps, RecvMsg, SendMsg, StepCx};

/// Where ranks share cores, the executor runs reduction chains only over
/// accumulators larger than this (they outgrow this core's cache: 1 MiB of
/// L2 on this machine, which two ranks share there). Chains run their
/// members in step with each other's peers, and there that cost more than
/// it saved on small blocks: 4 ranks on 2 cores, `two_shot` AllReduce, 16
/// KiB 14.1 us a call step by step against 21.6 as chains, 64 KiB 29.4
/// against 38.8, 256 KiB 81 against 97. Where each rank has a core, chains
/// pay at every size (2 ranks: 16 KiB 2.5 against 2.2 us, 64 KiB 7.7
/// against 5.2, 256 KiB 27.7 against 21.3; medians of 4 alternated runs).
const CHAIN_MIN_BYTES_SHARED: usize = 256 << 10;

/// A reduction chain the executor runs piece by piece: every member
/// advances only as far as the member before it has got, so the pieces of
/// the accumulator meet their operands one after another while they are in
/// the cache, instead of once per operand from memory. Members that receive
/// are ordinary messages whose [`RecvMsg::limit`] the chain sets; local
/// members (a `Copy` that fills or copies out the accumulator, a `Reduce`
/// into it) run here. A member does not move before the steps outside the
/// chain it depends on are done, and is done when its last byte is: it
/// waits on nothing the step-by-step run would not wait on, so the chain
/// cannot deadlock where that run would not.
#[derive(Default)]
pub(super) struct Chain {
    members: Vec<Member>,
    /// Later sends of the finished accumulator that wait on nothing else:
    /// started with the chain, they send each piece as the last member
    /// finishes it, while it is in the cache.
    followers: Vec<usize>,
}

struct Member {
    step: usize,
    /// Bytes of the whole step.
    len: usize,
    /// Steps outside the chain this member depends on, until all are done.
    waits: Vec<u32>,
    /// For a local member: what it does, and the bytes it has done.
    local: Option<Local>,
}

struct Local {
    reduce: bool,
    src: *const u8,
    dst: *mut u8,
    got: usize,
    /// Folded into the neighbouring member that receives (this step): it
    /// does no work of its own and has got what that member has.
    merged: Option<usize>,
}

// A chain lives only while its op runs (`execute` empties the list at both
// ends, and spare chains hold no members), on the thread that runs it; the
// scratchpad moves between threads only between ops.
// SAFETY: the pointers point into the buffers of the op under way and are
// used only while it runs, on its thread (above).
unsafe impl Send for Local {}

/// Starts the reduction chain `chain` (its first step is ready) if it may
/// run piece by piece: every member that receives does so over a
/// shared-memory ring, and where ranks share cores, its accumulator
/// outgrows the cache ([`CHAIN_MIN_BYTES_SHARED`]). Returns false where its
/// steps are to run one by one instead.
pub(super) fn start_chain(
    sched: &Schedule,
    b: &Buffers,
    env: &mut Env<'_>,
    pad: &mut Scratchpad,
    esz: usize,
    chain: std::ops::Range<usize>,
    remaining: &mut usize,
) -> Result<bool> {
    // spin.1: this rank yields its core while polling, as where ranks
    // share cores.
    let min = if env.spin.1 {
        CHAIN_MIN_BYTES_SHARED
    } else {
        0
    };
    if sched.steps[chain.start].len() * esz <= min {
        return Ok(false);
    }
    let over_rings = chain.clone().all(|j| {
        sched.steps[j]
            .recv_peer()
            .is_none_or(|q| env.links[q].as_ref().is_some_and(Link::honours_limit))
    });
    if !over_rings {
        return Ok(false);
    }
    let mut c = pad.spare.pop().unwrap_or_default();
    let members = &mut c.members;
    for j in chain.clone() {
        let waits: Vec<u32> = sched.deps[j]
            .iter()
            .copied()
            .filter(|&d| !chain.contains(&(d as usize)) && !pad.states[d as usize].done)
            .collect();
        let st = &mut pad.states[j];
        st.started = true;
        let (len, local) = match sched.steps[j] {
            Step::Copy { src, dst, len } | Step::Reduce { src, dst, len } => (
                len * esz,
                Some(Local {
                    reduce: matches!(sched.steps[j], Step::Reduce { .. }),
                    src: resolve(b, src, len, esz)?,
                    dst: resolve(b, dst, len, esz)?,
                    got: 0,
                    merged: None,
                }),
            ),
            Step::Recv { dst, len, .. } => {
                let mut m = RecvMsg::new(resolve(b, dst, len, esz)?, None, len * esz);
                // Later members reduce into these bytes: keep them cached.
                m.stream = false;
                m.limit = 0;
                st.recv = Some(m);
                (len * esz, None)
            }
            Step::RecvReduce { src, dst, len, .. } => {
                let s = resolve(b, src, len, esz)?;
                let mut m = RecvMsg::new(resolve(b, dst, len, esz)?, Some(s), len * esz);
                m.limit = 0;
                st.recv = Some(m);
                (len * esz, None)
            }
            _ => unreachable!("a chain holds only Copy, Recv, RecvReduce and Reduce"),
        };
        members.push(Member {
            step: j,
            len,
            waits,
            local,
        });
    }
    merge_first_pair(members, &mut pad.states);
    let last = &sched.steps[chain.end - 1];
    let (fin, fin_len) = (last.dst(), last.len());
    let followers = &mut c.followers;
    for j in chain.end..sched.steps.len() {
        let Step::Send { src, len, .. } = sched.steps[j] else {
            continue;
        };
        let free = sched.deps[j]
            .iter()
            .all(|&d| chain.contains(&(d as usize)) || pad.states[d as usize].done);
        if Some(src) == fin && len == fin_len && free && !pad.states[j].started {
            let st = &mut pad.states[j];
            st.started = true;
            st.send = Some(SendMsg::new(resolve(b, src, len, esz)?, len * esz, 0));
            followers.push(j);
        }
    }
    pad.chains.push(c);
    advance_chains(pad, env.cx, remaining);
    Ok(true)
}

/// Empties the list of chains under way into the spares (an op that
/// failed leaves some).
pub(super) fn recycle_chains(pad: &mut Scratchpad) {
    for mut c in pad.chains.drain(..) {
        c.members.clear();
        c.followers.clear();
        pad.spare.push(c);
    }
}

/// Folds a chain's first two members into one pass where one of them is
/// local: `Copy own -> A` then `A = A (op) received` becomes `A = own (op)
/// received`, and `Recv -> A` then `A = A (op) own` becomes `A = received
/// (op) own`; the same operands in the same order, one pass over `A`
/// instead of two.
fn merge_first_pair(members: &mut [Member], states: &mut [StepState]) {
    let [first, second, ..] = members else { return };
    if !first.waits.is_empty() || !second.waits.is_empty() {
        return;
    }
    match (&mut first.local, &mut second.local) {
        // Copy own -> A; RecvReduce A = A (op) received.
        (Some(l), None) if !l.reduce => {
            if let Some(m) = states[second.step].recv.as_mut() {
                m.reduce_src = Some(l.src);
                l.merged = Some(second.step);
            }
        }
        // Recv -> A; Reduce A = A (op) own.
        (None, Some(l)) if l.reduce => {
            if let Some(m) = states[first.step].recv.as_mut() {
                if m.reduce_src.is_none() {
                    m.reduce_src = Some(l.src);
                    m.recv_first = true;
                    l.merged = Some(first.step);
                }
            }
        }
        _ => {}
    }
}

/// Moves every reduction chain's bounds on, and its local members as far as
/// their bounds go. Returns whether a local member did any work.
pub(super) fn advance_chains(pad: &mut Scratchpad, cx: &StepCx, remaining: &mut usize) -> bool {
    let mut moved = false;
    let esz = cx.elem;
    let Scratchpad {
        chains,
        states,
        spare,
        ..
    } = pad;
    let mut k = 0;
    while k < chains.len() {
        let c = &mut chains[k];
        let got = |m: &Member, states: &[StepState]| match (&m.local, &states[m.step].recv) {
            (Some(l), _) => l.got,
            (None, Some(r)) => r.got,
            (None, None) => unreachable!("a receiving member has its message"),
        };
        for m in &mut c.members {
            m.waits.retain(|&d| !states[d as usize].done);
        }
        // The first member goes as far as its message (or, copying
        // locally, its whole range) goes. No member waits for a later one:
        // a message read straight from its sender's memory is read whole,
        // only once the member before it is done.
        let mut bound = usize::MAX;
        for m in &mut c.members {
            let b = if m.waits.is_empty() {
                bound.min(m.len)
            } else {
                0
            };
            match &mut m.local {
                Some(l) if l.merged.is_some() => {
                    let with = l.merged.expect("checked");
                    let g = states[with].recv.as_ref().map_or(0, |r| r.got);
                    if g > l.got {
                        l.got = g;
                        moved = true;
                        if g == m.len {
                            states[m.step].done = true;
                            *remaining -= 1;
                        }
                    }
                    // It bounds nothing: the member it is folded into
                    // goes as far as the member before the pair lets it.
                    continue;
                }
                Some(l) => {
                    // A reduction takes whole elements, a copy any bytes.
                    let to = if l.reduce && b < m.len {
                        b - b % esz
                    } else {
                        b
                    };
                    if to > l.got {
                        let k = to - l.got;
                        // SAFETY: src and dst were resolved for m.len bytes
                        // and l.got + k <= m.len; they do not overlap (the
                        // chain's rule); a reduction covers whole elements.
                        unsafe {
                            if l.reduce {
                                let d = l.dst.add(l.got);
                                reduce::reduce(cx.dtype, cx.op, d, d, l.src.add(l.got), k);
                            } else {
                                crate::reduce::copy::copy(l.src.add(l.got), l.dst.add(l.got), k);
                            }
                        }
                        l.got = to;
                        moved = true;
                        if to == m.len {
                            let st = &mut states[m.step];
                            st.done = true;
                            *remaining -= 1;
                        }
                    }
                }
                None => {
                    if let Some(r) = states[m.step].recv.as_mut() {
                        r.limit = b;
                    }
                }
            }
            bound = got(m, states);
        }
        let fin = got(c.members.last().expect("a chain has members"), states);
        for &f in &c.followers {
            if let Some(m) = states[f].send.as_mut() {
                m.avail = fin;
            }
        }
        if c.members.iter().all(|m| states[m.step].done) {
            let mut done = chains.swap_remove(k);
            done.members.clear();
            done.followers.clear();
            spare.push(done);
        } else {
            k += 1;
        }
    }
    moved
}
