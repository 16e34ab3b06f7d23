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

mod chain;

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

use chain::{advance_chains, recycle_chains, start_chain, Chain};

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
    if waiter.polls() {
        // Sockets: a peer's bytes come through the kernel, so where ranks
        // outnumber cores a waiter yields its core sooner (as p2p's do).
        backoff = backoff.yield_after(2);
    }
    let mut busy = 0u32;
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
            busy = busy.wrapping_add(1);
            if busy.is_multiple_of(wait::BUSY_CHECK_EVERY) {
                match watch.check_busy(&mut env.deadline) {
                    Ok(()) => {}
                    Err(Ended::Aborted) => return Err(Error::Aborted),
                    Err(Ended::Deadline) => return Err(timeout_error(env, pad)),
                }
            }
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
        // Over a socket, sends whose bytes are all ready go first: they
        // leave before this rank spends time on a receive (an empty `recv`
        // costs about a microsecond, which the peer, waiting for these
        // bytes, waits too). Then the receives, then every send: a fused
        // step forwards what just arrived. (On shared memory a look at a
        // ring costs next to nothing, and sending first measured 3-8%
        // slower from 512 KiB to 8 MiB, 2 ranks.)
        if link.sleep() == wait::Sleep::Poll {
            moved |= send_ready(pad, link, env.cx, q, remaining, true)?;
        }
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
        moved |= send_ready(pad, link, env.cx, q, remaining, false)?;
    }
    moved |= advance_chains(pad, env.cx, remaining);
    Ok(moved)
}

/// Moves the sends queued for peer `q` as far as their ready bytes and
/// the link allow, in order; with `ready_only`, only up to the first that
/// forwards what its step still receives. Returns whether anything moved.
fn send_ready(
    pad: &mut Scratchpad,
    link: &mut Link,
    cx: &mut StepCx,
    q: usize,
    remaining: &mut usize,
    ready_only: bool,
) -> Result<bool> {
    let mut moved = false;
    while let Some(&i) = pad.sendq[q].front() {
        let st = &mut pad.states[i as usize];
        if !st.started || (ready_only && st.recv.as_ref().is_some_and(|r| !r.done)) {
            break;
        }
        if let (Some(s), Some(r)) = (st.send.as_mut(), st.recv.as_ref()) {
            s.avail = r.got;
        }
        let m = st.send.as_mut().expect("sending step has a SendMsg");
        moved |= link.send(m, cx)?;
        if !m.done {
            break;
        }
        pad.sendq[q].pop_front();
        if st.recv.as_ref().is_none_or(|r| r.done) {
            st.done = true;
            *remaining -= 1;
        }
    }
    Ok(moved)
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
