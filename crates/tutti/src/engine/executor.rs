//! The executor: runs one rank's [`Schedule`] over its links.
//!
//! Steps start when their dependencies are done. Messages to and from each
//! peer form two FIFO queues (the order in the schedule); only the head of a
//! queue moves, and it moves as far as the link lets it without blocking. A
//! fused step forwards the bytes it has received so far. When nothing moves,
//! the executor waits as every wait does ([`crate::transport::wait`]): it
//! polls, checks abort, the deadline and its peers' liveness, and sleeps a
//! bounded while the way its links say (on its doorbell, or in `poll()` on
//! its TCP sockets).

use crate::algo::{Buf, Loc, Schedule, Step};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::mailbox::Mailbox;
use crate::transport::shm::Doorbell;
use crate::transport::wait::{self, Backoff, Ended, Waiter, Watch};
use crate::transport::{Link, LinkOps, RecvMsg, SendMsg, StepCx};
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// The three buffers of an op, as raw byte ranges.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Buffers {
    pub input: *mut u8,
    pub input_len: usize,
    pub output: *mut u8,
    pub output_len: usize,
    pub scratch: *mut u8,
    pub scratch_len: usize,
    /// The wire staging ([`Buf::Wire`]), 2-byte elements.
    pub wire: *mut u8,
    pub wire_len: usize,
}

impl Buffers {
    /// Bytes of the call's own buffers (input and output, once where they
    /// are one; not the scratch).
    pub(crate) fn footprint(&self) -> usize {
        if self.input == self.output {
            self.input_len.max(self.output_len)
        } else {
            self.input_len + self.output_len
        }
    }
}

/// Everything the executor needs besides the schedule and buffers.
pub(crate) struct Env<'a> {
    pub links: &'a mut [Option<Link>],
    pub cx: &'a mut StepCx,
    /// Set when the op first waits (op start + timeout, in effect).
    pub deadline: Option<Instant>,
    pub timeout: Duration,
    pub abort: &'a AtomicBool,
    /// This rank's shared-memory doorbell, if it has ring links.
    pub bell: Option<&'a Doorbell>,
    /// Process ids of peers reached through shared memory (liveness checks).
    pub peer_pids: &'a [Option<i32>],
    /// How long to poll before sleeping, and whether to yield the core
    /// while polling (more ranks than cores).
    pub spin: (Duration, bool),
    /// The communicator's mailboxes, if it has them (to notice a peer that
    /// runs this op in one shot while this rank runs it over the rings).
    pub mailbox: Option<&'a Mailbox>,
    /// A lowered schedule's wire type and f16 scale shift
    /// ([`crate::algo::wire`]).
    pub wire: Option<(reduce::DataType, u32)>,
}

#[derive(Default)]
struct StepState {
    started: bool,
    done: bool,
    send: Option<SendMsg>,
    recv: Option<RecvMsg>,
}

/// Reusable per-op storage, kept by the engine so that small ops allocate nothing.
#[derive(Default)]
pub(crate) struct Scratchpad {
    states: Vec<StepState>,
    sendq: Vec<VecDeque<u32>>,
    recvq: Vec<VecDeque<u32>>,
    peers: Vec<usize>,
    /// The sockets a sleep waits on, kept between sleeps.
    fds: Vec<libc::pollfd>,
    /// Reduction chains under way ([`Schedule::reduce_chain`]).
    chains: Vec<Chain>,
    /// Finished chains, emptied, kept for their capacity (no allocation per
    /// op once the shapes have been seen).
    spare: Vec<Chain>,
}

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
struct Chain {
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

/// `len` elements at `l`: data elements of `esz` bytes, or 2-byte wire
/// elements in [`Buf::Wire`].
pub(super) fn resolve(b: &Buffers, l: Loc, len: usize, esz: usize) -> Result<*mut u8> {
    let (base, blen, esz) = match l.buf {
        Buf::Input => (b.input, b.input_len, esz),
        Buf::Output => (b.output, b.output_len, esz),
        Buf::Scratch => (b.scratch, b.scratch_len, esz),
        Buf::Wire => (b.wire, b.wire_len, 2),
    };
    let (start, end) = (l.off * esz, (l.off + len) * esz);
    if end > blen {
        return Err(Error::arg(format!(
            "internal: schedule touches {:?}[{start}..{end}] bytes but the buffer has {blen}",
            l.buf
        )));
    }
    Ok(if len == 0 {
        base
    } else {
        // SAFETY: start < end <= blen: the result stays inside the buffer.
        unsafe { base.add(start) }
    })
}

/// Runs `sched` to completion, or fails with a typed error.
pub(crate) fn execute(
    sched: &Schedule,
    b: &Buffers,
    env: &mut Env<'_>,
    pad: &mut Scratchpad,
) -> Result<()> {
    let esz = env.cx.elem;
    let k = sched.steps.len();
    let n = env.links.len();
    pad.states.clear();
    pad.states.resize_with(k, StepState::default);
    if pad.sendq.len() < n {
        pad.sendq.resize_with(n, VecDeque::new);
        pad.recvq.resize_with(n, VecDeque::new);
    }
    pad.peers.clear();
    recycle_chains(pad);
    for (i, s) in sched.steps.iter().enumerate() {
        for q in [s.send_peer(), s.recv_peer()].into_iter().flatten() {
            if q >= n || env.links[q].is_none() {
                return Err(Error::arg(format!(
                    "internal: schedule names peer {q}, which has no link"
                )));
            }
            if !pad.peers.contains(&q) {
                pad.peers.push(q);
            }
        }
        if let Some(q) = s.send_peer() {
            pad.sendq[q].push_back(i as u32);
        }
        if let Some(q) = s.recv_peer() {
            pad.recvq[q].push_back(i as u32);
        }
    }
    let r = run(sched, b, env, pad, esz);
    if r.is_err() {
        for &q in &pad.peers {
            if let Some(l) = env.links[q].as_mut() {
                l.quiesce();
            }
        }
        // Buffers go back to the caller: no peer may still read them.
        for (i, st) in pad.states.iter().enumerate() {
            if let (Some(m), Some(q)) = (&st.send, sched.steps[i].send_peer()) {
                if let Some(l) = &env.links[q] {
                    l.withdraw(m, env.peer_pids.get(q).copied().flatten());
                }
            }
        }
    }
    for &q in &pad.peers {
        pad.sendq[q].clear();
        pad.recvq[q].clear();
    }
    recycle_chains(pad);
    r
}

fn run(
    sched: &Schedule,
    b: &Buffers,
    env: &mut Env<'_>,
    pad: &mut Scratchpad,
    esz: usize,
) -> Result<()> {
    let k = sched.steps.len();
    let mut remaining = k;
    let mut first_unstarted = 0usize;
    let mut backoff = Backoff::new(env.spin);
    let mut watch = Watch::new(env.abort, env.timeout, LIVENESS_EVERY);
    let mut waiter = Waiter::new();
    for &q in &pad.peers {
        if let Some(l) = &env.links[q] {
            waiter.add(l);
        }
    }
    loop {
        let mut moved = start_ready(
            sched,
            b,
            env,
            pad,
            esz,
            &mut first_unstarted,
            &mut remaining,
        )?;
        moved |= progress(sched, env, pad, &mut remaining)?;
        if remaining == 0 {
            return Ok(());
        }
        if moved {
            backoff.reset();
            continue;
        }
        if backoff.keep_polling() {
            continue;
        }
        // Nothing moves: check the world, then sleep a bounded while.
        let checked = match watch.check(&mut env.deadline) {
            Ok(c) => c,
            Err(Ended::Aborted) => return Err(Error::Aborted),
            Err(Ended::Deadline) => return Err(timeout_error(env, pad)),
        };
        if checked.liveness {
            check_liveness(env, pad)?;
            for q in pending_peers(pad) {
                if !pad.recvq[q].is_empty() {
                    if let Some(l) = env.links[q].as_mut() {
                        l.probe(env.cx)?;
                    }
                }
            }
        }
        let mut fds = std::mem::take(&mut pad.fds);
        if waiter.polls() {
            pollfds(env, pad, &mut fds);
        }
        let (mut found, mut err) = (false, None);
        waiter.sleep(checked.nap, env.bell, &mut fds, || {
            match progress(sched, env, pad, &mut remaining) {
                Ok(m) => found = m,
                Err(e) => err = Some(e),
            }
            !found && err.is_none()
        });
        pad.fds = fds;
        if let Some(e) = err {
            return Err(e);
        }
        if remaining == 0 {
            return Ok(());
        }
        if found {
            backoff.reset();
        }
    }
}

/// How often a waiting op checks that its peers are alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(50);

/// Starts every step whose dependencies are done; runs local steps at once.
fn start_ready(
    sched: &Schedule,
    b: &Buffers,
    env: &mut Env<'_>,
    pad: &mut Scratchpad,
    esz: usize,
    first_unstarted: &mut usize,
    remaining: &mut usize,
) -> Result<bool> {
    let mut moved = false;
    let k = sched.steps.len();
    let mut i = *first_unstarted;
    let mut all_before_started = true;
    while i < k {
        if pad.states[i].started {
            i += 1;
            continue;
        }
        let ready = sched.deps[i].iter().all(|&d| pad.states[d as usize].done);
        if !ready {
            if all_before_started {
                *first_unstarted = i;
                all_before_started = false;
            }
            i += 1;
            continue;
        }
        if let Some(chain) = sched.reduce_chain(i) {
            if start_chain(sched, b, env, pad, esz, chain.clone(), remaining)? {
                moved = true;
                i = chain.end;
                continue;
            }
        }
        let st = &mut pad.states[i];
        st.started = true;
        moved = true;
        match sched.steps[i] {
            Step::Copy { src, dst, len } => {
                let s = resolve(b, src, len, esz)?;
                let d = resolve(b, dst, len, esz)?;
                if s != d {
                    // SAFETY: both ranges were bounds-checked by `resolve`;
                    // `copy` tolerates overlap.
                    unsafe { crate::reduce::copy::copy_overlapping(s, d, len * esz) };
                }
                st.done = true;
            }
            Step::Reduce { src, dst, len } => {
                let s = resolve(b, src, len, esz)?;
                let d = resolve(b, dst, len, esz)?;
                // SAFETY: bounds-checked ranges; dst is the accumulator and
                // may not partially overlap src (schedules never do that).
                unsafe { reduce::reduce(env.cx.dtype, env.cx.op, d, d, s, len * esz) };
                st.done = true;
            }
            Step::Scale { dst, len, divisor } => {
                let d = resolve(b, dst, len, esz)?;
                if len > 0 {
                    // SAFETY: bounds-checked by `resolve`; every step that
                    // touches these bytes is done or waits for this one
                    // (its dependencies), so nothing else accesses them.
                    let buf = unsafe { std::slice::from_raw_parts_mut(d, len * esz) };
                    reduce::scale_avg(env.cx.dtype, buf, divisor);
                }
                st.done = true;
            }
            Step::Fence => st.done = true,
            c @ (Step::Narrow { .. }
            | Step::Widen { .. }
            | Step::WidenReduce { .. }
            | Step::Round { .. }) => {
                super::convert::run(&c, b, esz, env.wire)?;
                st.done = true;
            }
            Step::Send { src, len, .. } => {
                let (p, nb) = (resolve(b, src, len, esz)?, sched.step_bytes(i, esz));
                st.send = Some(SendMsg::new(p, nb, nb));
            }
            Step::Recv { dst, len, .. } => {
                let nb = sched.step_bytes(i, esz);
                let mut m = RecvMsg::new(resolve(b, dst, len, esz)?, None, nb);
                // Bytes this rank sends or reduces again stay in the cache.
                m.stream = !sched.read_back[i] && reduce::copy::stream_received(nb, b.footprint());
                st.recv = Some(m);
            }
            Step::RecvReduce { src, dst, len, .. } => {
                let s = resolve(b, src, len, esz)?;
                st.recv = Some(RecvMsg::new(resolve(b, dst, len, esz)?, Some(s), len * esz));
            }
            Step::RecvReduceSend { src, dst, len, .. } => {
                let s = resolve(b, src, len, esz)?;
                let d = resolve(b, dst, len, esz)?;
                st.recv = Some(RecvMsg::new(d, Some(s), len * esz));
                st.send = Some(SendMsg::new(d, len * esz, 0));
            }
            Step::RecvCopySend { dst, len, .. } => {
                let (d, nb) = (resolve(b, dst, len, esz)?, sched.step_bytes(i, esz));
                let mut m = RecvMsg::new(d, None, nb);
                // The forward reads these bytes back as they land: keep
                // them in the cache.
                m.stream = false;
                st.recv = Some(m);
                st.send = Some(SendMsg::new(d, nb, 0));
            }
        }
        if st.done {
            *remaining -= 1;
        }
        i += 1;
    }
    if all_before_started {
        *first_unstarted = k;
    }
    Ok(moved)
}

/// Moves the head message of every peer queue as far as it goes.
fn progress(
    sched: &Schedule,
    env: &mut Env<'_>,
    pad: &mut Scratchpad,
    remaining: &mut usize,
) -> Result<bool> {
    let _ = sched;
    let mut moved = advance_chains(pad, env.cx, remaining);
    for pi in 0..pad.peers.len() {
        let q = pad.peers[pi];
        let link = env.links[q].as_mut().expect("checked in execute");
        // Receive first: a fused step's forward can then use what just arrived.
        while let Some(&i) = pad.recvq[q].front() {
            let st = &mut pad.states[i as usize];
            if !st.started {
                break;
            }
            let m = st.recv.as_mut().expect("receiving step has a RecvMsg");
            moved |= link.recv(m, env.cx)?;
            if !m.done {
                break;
            }
            pad.recvq[q].pop_front();
            if st.send.as_ref().is_none_or(|s| s.done) {
                st.done = true;
                *remaining -= 1;
            }
        }
        while let Some(&i) = pad.sendq[q].front() {
            let st = &mut pad.states[i as usize];
            if !st.started {
                break;
            }
            if let (Some(s), Some(r)) = (st.send.as_mut(), st.recv.as_ref()) {
                s.avail = r.got;
            }
            let m = st.send.as_mut().expect("sending step has a SendMsg");
            moved |= link.send(m, env.cx)?;
            if !m.done {
                break;
            }
            pad.sendq[q].pop_front();
            if st.recv.as_ref().is_none_or(|r| r.done) {
                st.done = true;
                *remaining -= 1;
            }
        }
    }
    moved |= advance_chains(pad, env.cx, remaining);
    Ok(moved)
}

/// Starts the reduction chain `chain` (its first step is ready) if it may
/// run piece by piece: every member that receives does so over a
/// shared-memory ring, and where ranks share cores, its accumulator
/// outgrows the cache ([`CHAIN_MIN_BYTES_SHARED`]). Returns false where its
/// steps are to run one by one instead.
fn start_chain(
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
fn recycle_chains(pad: &mut Scratchpad) {
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
fn advance_chains(pad: &mut Scratchpad, cx: &StepCx, remaining: &mut usize) -> bool {
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

fn pending_peers(pad: &Scratchpad) -> Vec<usize> {
    let mut v: Vec<usize> = pad
        .peers
        .iter()
        .copied()
        .filter(|&q| !pad.sendq[q].is_empty() || !pad.recvq[q].is_empty())
        .collect();
    v.sort_unstable();
    v
}

fn timeout_error(env: &Env<'_>, pad: &Scratchpad) -> Error {
    Error::Timeout {
        op: env.cx.op_name.to_string(),
        seq: env.cx.seq,
        rank: env.cx.rank,
        waiting_for: pending_peers(pad),
        after: env.timeout,
    }
}

fn check_liveness(env: &Env<'_>, pad: &Scratchpad) -> Result<()> {
    for q in pending_peers(pad) {
        let link = env.links[q].as_ref();
        if let Some(why) = wait::peer_lost(q, link, env.peer_pids.get(q).copied().flatten()) {
            return Err(env.cx.lost(q, why));
        }
        // A peer in a mailbox op this rank has not started, with nothing
        // left for us in its ring, will never send what we wait for.
        if let (Some(mb), Some(l)) = (env.mailbox, link) {
            if !pad.recvq[q].is_empty() && mb.peer_ahead(q) && l.inbound_empty() {
                return Err(Error::Mismatch {
                    rank: env.cx.rank,
                    peer: q,
                    seq: env.cx.seq,
                    msg: format!(
                        "this rank runs {} over the rings, rank {q} runs a small collective in one shot; {}",
                        env.cx.op_name,
                        crate::transport::SAME_CALLS
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The descriptors to sleep on in `poll()`: the head messages' lanes of
/// every peer (readable lanes for the incoming one, writable lanes only
/// where the outgoing one has bytes to write: a fused step may still be
/// waiting for its own input).
fn pollfds(env: &Env<'_>, pad: &Scratchpad, fds: &mut Vec<libc::pollfd>) {
    fds.clear();
    for &q in &pad.peers {
        if let Some(l) = &env.links[q] {
            let recv = !pad.recvq[q].is_empty();
            let send = pad.sendq[q]
                .front()
                .and_then(|&i| pad.states[i as usize].send.as_ref());
            l.pollfds(send, recv, fds);
        }
    }
}
