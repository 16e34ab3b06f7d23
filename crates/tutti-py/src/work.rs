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

use crate::errors::to_pyerr;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use std::cell::Cell;
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
            let r = loop {
                if let Some(r) = e.shared.work.wait_timeout(Duration::from_secs(3600)) {
                    break r;
                }
            };
            match e.callback {
                Some(cb) => {
                    let spare = {
                        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                        c.1 += 1;
                        c.0 - c.1 == 0
                    };
                    if spare {
                        self.spawn(); // someone must serve the queue while this callback runs
                    }
                    Python::attach(|py| {
                        let arg: Py<PyAny> = match &r {
                            Ok(()) => py.None(),
                            Err(err) => to_pyerr(py, err).into_value(py).into_any(),
                        };
                        RUNNING.with(|c| c.set(Arc::as_ptr(&e.shared)));
                        if let Err(pe) = cb.call1(py, (arg,)) {
                            pe.write_unraisable(py, Some(cb.bind(py)));
                        }
                        RUNNING.with(|c| c.set(std::ptr::null()));
                        drop(cb);
                        drop(e.keep);
                    });
                    e.shared.mark_callback_done();
                    self.counts.lock().unwrap_or_else(|e| e.into_inner()).1 -= 1;
                }
                // Without a callback there is nothing to run in Python:
                // dropping the references while detached defers the
                // decrements to the next attach.
                None => drop(e.keep),
            }
        }
    }
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
        let shared = Arc::new(Shared {
            work,
            has_callback: callback.is_some(),
            callback_done: Mutex::new(false),
            cv: Condvar::new(),
        });
        let e = Entry {
            shared: shared.clone(),
            keep,
            callback,
        };
        if let Err(mpsc::SendError(e)) = self.tx.as_ref().expect("completer is running").send(e) {
            // Cannot happen while `tx` lives (the receiver lives in `shared`).
            drop(e);
        }
        PyWork { shared }
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
