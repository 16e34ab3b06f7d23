//! How a data call runs: at once (NULL queue), on a queue, or collected
//! between `tuttiGroupStart` and `tuttiGroupEnd` and then posted together.
//!
//! A group posts all its operations before it waits for any: collectives
//! are submitted to their communicators' engines (which run them in order,
//! in the background), and the sends and receives of each communicator go
//! to its point-to-point channel in one batch (`post_p2p_raw`), where every
//! one progresses on its own. So no order of the calls inside a group, on
//! one rank or across ranks, can deadlock: a ring exchange where everyone
//! sends first just works, and so do collectives on several communicators
//! driven by one thread.

use crate::handle::{guard, tuttiComm, Failure};
use crate::queue::{queue_ref, tuttiQueue, tuttiQueue_t};
use crate::*;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use tutti::{RawCall, RawP2p, Work};

/// An operation's transfer.
pub(crate) enum Kind {
    /// A collective.
    Coll(RawCall),
    /// A send or a receive.
    P2p(RawP2p),
}

/// An owned copy the library makes of a buffer for an in-place call whose
/// buffers the engine may not share (e.g. an in-place ReduceScatter).
pub(crate) enum Stage {
    /// The call reads this copy of the caller's input; nothing to do after
    /// (the op only keeps it alive).
    Input(#[allow(dead_code)] Vec<u8>),
    /// The call writes this buffer; on success it is copied to `dst`.
    Output(Vec<u8>, *mut u8),
}

/// One checked data call, ready to run.
pub(crate) struct Op {
    pub(crate) comm: Arc<tuttiComm>,
    /// The C function's name, for messages.
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) stage: Option<Stage>,
}

// SAFETY: an Op carries buffer addresses that the caller promised stay
// valid (and untouched) until the op completes, on whichever thread runs it.
unsafe impl Send for Op {}

impl Op {
    fn fail(&self, e: &tutti::Error) -> Failure {
        let peer = match &self.kind {
            Kind::P2p(p) if p.send => format!(" to peer {}", p.peer.unwrap_or(usize::MAX)),
            Kind::P2p(p) => format!(" from peer {}", p.peer.unwrap_or(usize::MAX)),
            Kind::Coll(_) => String::new(),
        };
        Failure::of(&self.comm, &format!("{}{peer}", self.name), e)
    }

    /// After the transfer: copies a staged output to the caller's buffer.
    fn finish(self, r: tutti::Result<()>) -> Result<(), Failure> {
        if let Err(e) = r {
            return Err(self.fail(&e));
        }
        if let Some(Stage::Output(tmp, dst)) = &self.stage {
            // SAFETY: `dst` is the caller's output buffer of `tmp.len()`
            // bytes, valid until this op completes (the caller's promise);
            // `tmp` is our own allocation, so they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), *dst, tmp.len()) };
        }
        Ok(())
    }

    /// Runs the op to completion on this thread.
    fn run(self) -> Result<(), Failure> {
        let c = &self.comm;
        let r = match &self.kind {
            // SAFETY: the buffers were checked against the counts, and the
            // caller promises they stay valid until the call returns.
            Kind::Coll(call) => unsafe { c.comm.run_raw(call, c.opts_for(call)) },
            Kind::P2p(p) => {
                // SAFETY: as above.
                let mut w = unsafe { c.comm.post_p2p_raw(&[*p], c.opts.timeout) };
                w.pop().expect("one op posted").0.wait()
            }
        };
        self.finish(r)
    }
}

thread_local! {
    /// How deep this thread is in group calls.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The operations of this thread's open group, with their queues.
    static OPS: RefCell<Vec<(Op, QueuePtr)>> = const { RefCell::new(Vec::new()) };
}

/// A queue handle that may travel to another thread.
#[derive(Clone, Copy, PartialEq, Eq)]
struct QueuePtr(tuttiQueue_t);
// SAFETY: queues are shared between threads by design (their state is
// behind locks); the caller keeps a queue alive while ops use it.
unsafe impl Send for QueuePtr {}

/// Threads with an open group, process-wide: while none has one (the
/// common case), a call learns that it is not in a group from one relaxed
/// load of a line nobody writes, without a thread-local lookup (which a
/// shared library pays a function call for). A thread always sees its
/// own increment, so a thread with an open group never reads 0.
static OPEN_GROUPS: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread is between `tuttiGroupStart` and `tuttiGroupEnd`.
#[inline]
pub(crate) fn in_group() -> bool {
    OPEN_GROUPS.load(Ordering::Relaxed) > 0 && depth_open()
}

/// This thread's group depth is not 0. Out of line: inlined, the compiler
/// hoisted the thread-local lookup (`__tls_get_addr` in the shared
/// library) above the load of `OPEN_GROUPS`, so every call paid it.
#[cold]
#[inline(never)]
fn depth_open() -> bool {
    DEPTH.with(|d| d.get()) > 0
}

/// Runs `op` now (NULL queue), on `queue`, or keeps it for the open group.
///
/// # Safety
/// `queue` must be NULL or a live queue.
pub(crate) unsafe fn dispatch(op: Op, queue: tuttiQueue_t) -> Result<(), Failure> {
    if in_group() {
        OPS.with(|o| o.borrow_mut().push((op, QueuePtr(queue))));
        return Ok(());
    }
    if queue.is_null() {
        return op.run();
    }
    // SAFETY: the caller's promise.
    let q = unsafe { queue_ref(queue) };
    q.put(Box::new(move || {
        let comm = op.comm.clone();
        op.run().inspect_err(|f| comm.record_async(f.code, &f.msg))
    }))
}

/// Posts every op of a group, then waits for all of them: the first error.
fn run_batch(ops: Vec<Op>, queued: bool) -> Result<(), Failure> {
    let mut works: Vec<Option<Work<()>>> = (0..ops.len()).map(|_| None).collect();
    // Collectives first, in call order, each to its engine.
    for (i, op) in ops.iter().enumerate() {
        if let Kind::Coll(call) = &op.kind {
            let c = &op.comm;
            // SAFETY: the buffers were checked, and the caller promises they
            // stay valid until the group completes; we wait below.
            works[i] = Some(unsafe { c.comm.submit_raw(call, c.opts_for(call)) });
        }
    }
    // Then each communicator's sends and receives in one batch.
    let mut done = vec![false; ops.len()];
    for i in 0..ops.len() {
        if done[i] || !matches!(ops[i].kind, Kind::P2p(_)) {
            continue;
        }
        let comm = &ops[i].comm;
        let mut idx = Vec::new();
        let mut batch = Vec::new();
        for (j, op) in ops.iter().enumerate().skip(i) {
            if let Kind::P2p(p) = &op.kind {
                if Arc::ptr_eq(&op.comm, comm) {
                    idx.push(j);
                    batch.push(*p);
                    done[j] = true;
                }
            }
        }
        // SAFETY: as for the collectives above.
        let posted = unsafe { comm.comm.post_p2p_raw(&batch, comm.opts.timeout) };
        for (j, (w, _)) in idx.into_iter().zip(posted) {
            works[j] = Some(w);
        }
    }
    let mut first = None;
    for (op, w) in ops.into_iter().zip(works) {
        let r = w.expect("every op was posted").wait();
        let comm = op.comm.clone();
        if let Err(f) = op.finish(r) {
            if queued {
                comm.record_async(f.code, &f.msg);
            } else {
                comm.record(&f.msg);
            }
            first.get_or_insert(f);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Where the queues of a group meet: the runner waits until every other
/// queue has reached the group (finished what was put before it), runs
/// the group, and lets them go on.
#[derive(Default)]
struct Meeting {
    /// (queues arrived, group done)
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl Meeting {
    fn arrive_and_wait_done(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += 1;
        self.cv.notify_all();
        while !s.1 {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn run_when_all_arrived(
        &self,
        others: usize,
        ops: Vec<Op>,
        queued: bool,
    ) -> Result<(), Failure> {
        {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            while s.0 < others {
                s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        }
        let r = run_batch(ops, queued);
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.cv.notify_all();
        r
    }
}

/// Starts a group: data calls until the matching [`tuttiGroupEnd`] are
/// collected, not run. Groups nest; the outermost end runs them.
#[no_mangle]
pub extern "C" fn tuttiGroupStart() -> tuttiResult_t {
    DEPTH.with(|d| {
        if d.get() == 0 {
            OPEN_GROUPS.fetch_add(1, Ordering::Relaxed);
        }
        d.set(d.get() + 1)
    });
    tuttiSuccess
}

/// Ends a group. At the outermost end, every collected call is posted at
/// once. If a call of the group had a NULL queue, this waits until all of
/// them have completed and returns the first error; otherwise the group
/// runs on its calls' queues (after what was put on each before it), and
/// this returns at once.
#[no_mangle]
pub extern "C" fn tuttiGroupEnd() -> tuttiResult_t {
    const CALL: &str = "tuttiGroupEnd";
    guard(CALL, None, || {
        let depth = DEPTH.with(|d| d.get());
        if depth == 0 {
            return Err(Failure {
                code: tuttiInvalidUsage,
                msg: format!("{CALL}: no group is open (tuttiGroupStart was not called)"),
            });
        }
        DEPTH.with(|d| d.set(depth - 1));
        if depth > 1 {
            return Ok(());
        }
        OPEN_GROUPS.fetch_sub(1, Ordering::Relaxed);
        let all = OPS.with(|o| std::mem::take(&mut *o.borrow_mut()));
        if all.is_empty() {
            return Ok(());
        }
        let blocking = all.iter().any(|(_, q)| q.0.is_null());
        let mut queues: Vec<QueuePtr> = Vec::new();
        for (_, q) in &all {
            if !q.0.is_null() && !queues.contains(q) {
                queues.push(*q);
            }
        }
        let ops: Vec<Op> = all.into_iter().map(|(op, _)| op).collect();
        if queues.is_empty() {
            return run_batch(ops, false);
        }
        let meet = Arc::new(Meeting::default());
        let (runner, others): (Option<QueuePtr>, &[QueuePtr]) = if blocking {
            (None, &queues[..])
        } else {
            (Some(queues[0]), &queues[1..])
        };
        for q in others {
            let m = meet.clone();
            // SAFETY: the caller passed live queues with the group's calls.
            let q: &tuttiQueue = unsafe { queue_ref(q.0) };
            q.put(Box::new(move || {
                m.arrive_and_wait_done();
                Ok(())
            }))?;
        }
        let n = others.len();
        match runner {
            None => meet.run_when_all_arrived(n, ops, false),
            Some(q) => {
                // SAFETY: as above.
                let q: &tuttiQueue = unsafe { queue_ref(q.0) };
                q.put(Box::new(move || meet.run_when_all_arrived(n, ops, true)))
            }
        }
    })
}
