//! Asynchronous ops seen from Python: the [`PyWork`] handle and the
//! per-communicator completer thread.
//!
//! The core runs an asynchronous op on its progress thread and reports the
//! outcome through a [`tutti::Work`]. Python must keep the op's buffers alive
//! until then, even if it drops the handle, and some callers (torch futures)
//! want a callback when the op is done. Both are the job of the completer
//! threads of each communicator (usually one): they take the async ops in
//! issue order (ops complete in that order), wait for each without holding
//! the GIL, then run its callback (attached to the interpreter) and release
//! its buffers.
//!
//! Sends and receives do not complete in issue order (they match per peer
//! and tag, on the core's point-to-point channel), so they have a completer
//! of their own, [`P2pCompleter`], where every pending op has a thread
//! waiting for it: a send's callback never waits behind a receive that is
//! still unmatched, nor a collective's behind either.

use crate::errors::to_pyerr;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

thread_local! {
    /// True on a completer thread.
    static ON_COMPLETER: Cell<bool> = const { Cell::new(false) };
    /// The op whose callback this thread is running (null if none).
    static RUNNING: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
}

/// Whether the calling thread is a completer thread (inside a callback, as
/// Python code only runs there in one): it cannot wait for the completer
/// to finish.
pub(crate) fn on_completer_thread() -> bool {
    ON_COMPLETER.with(Cell::get)
}

/// What the handle and the completer share about one op.
pub(crate) struct Shared {
    work: tutti::Work<()>,
    /// A point-to-point op's handle (what a receive got); None for collectives.
    p2p: Option<tutti::P2pHandle>,
    /// True if a callback must run before the op counts as complete.
    has_callback: bool,
    /// Set (under the mutex) once the callback has returned.
    callback_done: Mutex<bool>,
    cv: Condvar,
}

impl Shared {
    /// Whether the calling thread is running this op's callback: the op
    /// itself is done, and its callback cannot be waited for from inside.
    fn in_own_callback(&self) -> bool {
        RUNNING.with(Cell::get) == std::ptr::from_ref(self)
    }

    /// The op's outcome once it (and its callback) finished, waiting at most
    /// `d`; inside the op's own callback, once the op finished (a torch
    /// future's callback that waits on its op's `Work`).
    fn wait_for(&self, d: Duration) -> Option<tutti::Result<()>> {
        let start = Instant::now();
        let r = self.work.wait_timeout(d)?;
        if self.has_callback && !self.in_own_callback() {
            let mut g = self.callback_done.lock().unwrap_or_else(|e| e.into_inner());
            while !*g {
                let left = d.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return None;
                }
                g = self
                    .cv
                    .wait_timeout(g, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        Some(r)
    }

    fn is_done(&self) -> bool {
        self.work.is_done()
            && (!self.has_callback
                || self.in_own_callback()
                || *self.callback_done.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn mark_callback_done(&self) {
        *self.callback_done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// One queued op: its state, the Python objects to keep alive, its callback.
struct Entry {
    shared: Arc<Shared>,
    keep: Option<Py<PyAny>>,
    callback: Option<Py<PyAny>>,
}

/// The completer threads of one communicator.
///
/// One thread at a time waits on the queue (the receiver sits behind a
/// mutex); once it has taken an op it lets go of the queue, so the next idle
/// thread takes the next op, and waits for its op without the GIL. A callback
/// may block waiting for a later op of the same communicator (torch's
/// PowerSGD hook waits on a future inside a future callback), so a thread
/// about to run a callback makes sure another thread is free to serve the
/// queue, spawning one if needed. Ops complete in issue order; callbacks
/// start in that order unless one blocks.
pub(crate) struct Completer {
    tx: Option<mpsc::Sender<Entry>>,
    shared: Arc<PoolState>,
}

struct PoolState {
    rx: Mutex<mpsc::Receiver<Entry>>,
    /// (threads alive, threads inside a callback)
    counts: Mutex<(usize, usize)>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    rank: usize,
}

impl PoolState {
    fn spawn(self: &Arc<Self>) {
        let me = self.clone();
        let n = {
            let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            c.0 += 1;
            c.0
        };
        let h = std::thread::Builder::new()
            .name(format!("tutti-py-completer-{}-{n}", self.rank))
            .spawn(move || me.serve())
            .expect("spawning a tutti-py completer thread");
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(h);
    }

    fn serve(self: Arc<Self>) {
        ON_COMPLETER.with(|c| c.set(true));
        loop {
            let next = self.rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
            let Ok(e) = next else { break };
            let r = e.wait();
            if e.callback.is_some() {
                let spare = {
                    let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                    c.1 += 1;
                    c.0 - c.1 == 0
                };
                if spare {
                    self.spawn(); // someone must serve the queue while this callback runs
                }
                e.finish(&r);
                self.counts.lock().unwrap_or_else(|e| e.into_inner()).1 -= 1;
            } else {
                e.finish(&r);
            }
        }
    }
}

impl Entry {
    /// Waits for the op (without the GIL; the op has its own deadline).
    fn wait(&self) -> tutti::Result<()> {
        loop {
            if let Some(r) = self.shared.work.wait_timeout(Duration::from_secs(3600)) {
                return r;
            }
        }
    }

    /// Runs the callback, if any (attached to the interpreter), and lets
    /// go of the buffers.
    fn finish(self, r: &tutti::Result<()>) {
        let Entry {
            shared,
            keep,
            callback,
        } = self;
        match callback {
            Some(cb) => {
                Python::attach(|py| {
                    let arg: Py<PyAny> = match r {
                        Ok(()) => py.None(),
                        Err(err) => to_pyerr(py, err).into_value(py).into_any(),
                    };
                    RUNNING.with(|c| c.set(Arc::as_ptr(&shared)));
                    if let Err(pe) = cb.call1(py, (arg,)) {
                        pe.write_unraisable(py, Some(cb.bind(py)));
                    }
                    RUNNING.with(|c| c.set(std::ptr::null()));
                    drop(cb);
                    drop(keep);
                });
                shared.mark_callback_done();
            }
            // Without a callback there is nothing to run in Python:
            // dropping the references while detached defers the
            // decrements to the next attach.
            None => drop(keep),
        }
    }
}

/// Builds the shared state and the queue entry of one op.
fn entry(
    work: tutti::Work<()>,
    p2p: Option<tutti::P2pHandle>,
    keep: Option<Py<PyAny>>,
    callback: Option<Py<PyAny>>,
) -> (Entry, PyWork) {
    let shared = Arc::new(Shared {
        work,
        p2p,
        has_callback: callback.is_some(),
        callback_done: Mutex::new(false),
        cv: Condvar::new(),
    });
    let e = Entry {
        shared: shared.clone(),
        keep,
        callback,
    };
    (e, PyWork { shared })
}

impl Completer {
    pub(crate) fn start(rank: usize) -> Completer {
        let (tx, rx) = mpsc::channel::<Entry>();
        let shared = Arc::new(PoolState {
            rx: Mutex::new(rx),
            counts: Mutex::new((0, 0)),
            handles: Mutex::new(Vec::new()),
            rank,
        });
        shared.spawn();
        Completer {
            tx: Some(tx),
            shared,
        }
    }

    /// Hands an op to the completer; returns the Python handle.
    pub(crate) fn push(
        &self,
        work: tutti::Work<()>,
        keep: Option<Py<PyAny>>,
        callback: Option<Py<PyAny>>,
    ) -> PyWork {
        let (e, w) = entry(work, None, keep, callback);
        if let Err(mpsc::SendError(e)) = self.tx.as_ref().expect("completer is running").send(e) {
            // Cannot happen while `tx` lives (the receiver lives in `shared`).
            drop(e);
        }
        w
    }

    /// Lets the threads finish every queued op, then joins them. Call
    /// detached: callbacks need to attach.
    pub(crate) fn shutdown(mut self) {
        drop(self.tx.take());
        loop {
            let h = self
                .shared
                .handles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            match h {
                Some(h) => {
                    let _ = h.join();
                }
                None => break,
            }
        }
    }
}

/// A posted point-to-point op for [`P2pCompleter::push`]: its completion,
/// its handle (a receive's status), and its callback.
pub(crate) type PostedP2p = (tutti::Work<()>, Option<tutti::P2pHandle>, Option<Py<PyAny>>);

/// How long an idle point-to-point completer thread stays for the next op.
const P2P_IDLE: Duration = Duration::from_secs(10);
/// At most this many point-to-point completer threads; beyond, pending ops
/// wait for a thread in the order they were posted.
const P2P_MAX_THREADS: usize = 1024;

/// The point-to-point completer of one communicator: a thread per pending
/// send or receive (threads are reused, and leave after [`P2P_IDLE`] without
/// work), so that each op's callback runs, and its buffers are released, as
/// soon as that op completes, whatever the others do.
pub(crate) struct P2pCompleter {
    pool: Arc<P2pPool>,
}

struct P2pPool {
    q: Mutex<P2pQueue>,
    cv: Condvar,
    /// Threads by id; a thread that leaves takes its handle out (detaching).
    handles: Mutex<HashMap<usize, JoinHandle<()>>>,
    rank: usize,
}

#[derive(Default)]
struct P2pQueue {
    entries: VecDeque<Entry>,
    /// Threads alive.
    threads: usize,
    /// Threads not busy with an op (starting, or waiting for one).
    free: usize,
    next_id: usize,
    stop: bool,
}

impl P2pPool {
    /// Starts a thread; call with the queue locked (so that the thread
    /// cannot leave before its handle is stored). False if it did not start.
    fn spawn(self: &Arc<Self>, q: &mut P2pQueue) -> bool {
        let id = q.next_id;
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name(format!("tutti-py-p2p-{}-{id}", self.rank))
            .spawn(move || me.serve(id));
        match h {
            Ok(h) => {
                q.next_id += 1;
                q.threads += 1;
                q.free += 1;
                self.handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id, h);
                true
            }
            Err(_) => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, P2pQueue> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn serve(self: Arc<Self>, id: usize) {
        ON_COMPLETER.with(|c| c.set(true));
        let mut q = self.lock();
        loop {
            if let Some(e) = q.entries.pop_front() {
                q.free -= 1;
                drop(q);
                let r = e.wait();
                e.finish(&r);
                q = self.lock();
                q.free += 1;
                continue;
            }
            if q.stop {
                break;
            }
            let (g, t) = self
                .cv
                .wait_timeout(q, P2P_IDLE)
                .unwrap_or_else(|e| e.into_inner());
            q = g;
            if t.timed_out() && q.entries.is_empty() && !q.stop {
                // Idle for a while: leave, detaching this thread.
                drop(
                    self.handles
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id),
                );
                break;
            }
        }
        q.threads -= 1;
        q.free -= 1;
    }
}

impl P2pCompleter {
    pub(crate) fn start(rank: usize) -> P2pCompleter {
        P2pCompleter {
            pool: Arc::new(P2pPool {
                q: Mutex::new(P2pQueue::default()),
                cv: Condvar::new(),
                handles: Mutex::new(HashMap::new()),
                rank,
            }),
        }
    }

    /// Hands posted ops to the completer; returns their Python handles.
    /// Each op keeps `keep` alive until it is done.
    pub(crate) fn push(
        &self,
        ops: Vec<PostedP2p>,
        keep: Option<&Py<PyAny>>,
        py: Python<'_>,
    ) -> Vec<PyWork> {
        let mut entries = Vec::with_capacity(ops.len());
        let mut out = Vec::with_capacity(ops.len());
        for (w, h, cb) in ops {
            let (e, pw) = entry(w, h, keep.map(|k| k.clone_ref(py)), cb);
            entries.push(e);
            out.push(pw);
        }
        let pool = &self.pool;
        let mut q = pool.lock();
        for e in entries {
            q.entries.push_back(e);
            // Every queued op has a free thread to take it; a thread that
            // waits for the condition variable wakes for it.
            if q.free < q.entries.len() && q.threads < P2P_MAX_THREADS {
                pool.spawn(&mut q);
            }
            pool.cv.notify_one();
        }
        out
    }

    /// Lets the threads finish every queued op, then joins them. Call
    /// detached: callbacks need to attach.
    pub(crate) fn shutdown(self) {
        self.pool.lock().stop = true;
        self.pool.cv.notify_all();
        let hs: Vec<JoinHandle<()>> = self
            .pool
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, h)| h)
            .collect();
        for h in hs {
            let _ = h.join();
        }
    }
}

/// The handle of an asynchronous op (`tutti._native.Work`).
///
/// Complete once the op has finished and its callback, if any, has returned.
/// Dropping it does not cancel or wait for the op: the communicator keeps the
/// buffers alive until the op is done.
#[pyclass(frozen, name = "Work", module = "tutti._native")]
pub(crate) struct PyWork {
    shared: Arc<Shared>,
}

#[pymethods]
impl PyWork {
    /// Waits for the op: returns True, raises the op's error (a
    /// `tutti.TuttiError`), or raises the built-in `TimeoutError` if it is
    /// still running after `timeout` seconds (the op carries on).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = match timeout {
            // A timeout too long to count from now waits forever, like None.
            Some(t) if t.is_finite() && t >= 0.0 => Duration::try_from_secs_f64(t)
                .ok()
                .and_then(|t| Instant::now().checked_add(t)),
            Some(t) if t.is_nan() || t < 0.0 => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "timeout must be a number of seconds >= 0, not {t}"
                )))
            }
            _ => None,
        };
        let fast = self.shared.wait_for(Duration::ZERO);
        let r = match fast {
            Some(r) => r,
            None => loop {
                let slice = match deadline {
                    Some(d) => d
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(100)),
                    None => Duration::from_millis(100),
                };
                let shared = &self.shared;
                if let Some(r) = py.detach(|| shared.wait_for(slice)) {
                    break r;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(PyTimeoutError::new_err(format!(
                        "the op is still running after {:.3} s; it carries on (wait again, or abort the communicator)",
                        timeout.unwrap_or(0.0)
                    )));
                }
                py.check_signals()?;
            },
        };
        r.map(|()| true).map_err(|e| to_pyerr(py, &e))
    }

    /// What a receive got, once it completed successfully: `(source, tag,
    /// bytes)`; None for sends and collectives, and before.
    fn status(&self) -> Option<(usize, u32, usize)> {
        if !matches!(self.shared.work.wait_timeout(Duration::ZERO), Some(Ok(()))) {
            return None;
        }
        let s = self.shared.p2p.as_ref()?.status()?;
        Some((s.source, s.tag, s.bytes))
    }

    /// True once the op has finished (successfully or not) and its callback returned.
    fn is_completed(&self) -> bool {
        self.shared.is_done()
    }

    /// True if the op finished successfully.
    fn is_success(&self) -> bool {
        self.shared.is_done()
            && matches!(self.shared.work.wait_timeout(Duration::ZERO), Some(Ok(())))
    }

    /// The op's error as an exception object, or None (also while it runs).
    fn exception(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        match self.shared.work.wait_timeout(Duration::ZERO) {
            Some(Err(e)) => Some(to_pyerr(py, &e).into_value(py).into_any()),
            _ => None,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<tutti Work {}>",
            if self.shared.is_done() {
                "done"
            } else {
                "pending"
            }
        )
    }
}
