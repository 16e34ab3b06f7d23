//! `tutti._native.Communicator`: a [`tutti::Communicator`] for Python.
//!
//! The Python package (`tutti/__init__.py`, `tutti/torch.py`) turns arrays and
//! tensors into addresses and lengths and calls [`PyComm::call`], the one
//! entry point for every collective. Blocking calls run with the GIL
//! released; asynchronous ones go to the core's progress thread and to this
//! communicator's [`Completer`].

use crate::errors::IntoPy;
use crate::work::{Completer, P2pCompleter, PostedP2p, PyWork};
use crate::UniqueIdArg;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tutti::algo::VCounts;
use tutti::{Collective, Communicator, Config, DataType, Options, RawCall, RawP2p, ReduceOp};

/// A point-to-point op from Python: (is_send, peer or -1 for any source,
/// address, bytes, tag, exact).
type P2pArg = (bool, i64, usize, usize, u32, bool);

/// AllToAllV counts from Python: (send_counts, send_displs, recv_counts, recv_displs).
type VCountsArg = (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>);

/// Collective codes used by [`PyComm::call`] (mirrored in `tutti/_codes.py`).
fn collective(kind: u8, arg: usize) -> PyResult<Collective> {
    Ok(match kind {
        0 => Collective::AllReduce,
        1 => Collective::Broadcast { root: arg },
        2 => Collective::Reduce { root: arg },
        3 => Collective::AllGather,
        4 => Collective::ReduceScatter,
        5 => Collective::AllToAll,
        6 => Collective::AllToAllV,
        7 => Collective::Gather { root: arg },
        8 => Collective::Scatter { root: arg },
        9 => Collective::Barrier,
        10 => Collective::Send { peer: arg },
        11 => Collective::Recv { peer: arg },
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown collective code {kind}"
            )))
        }
    })
}

/// Data type codes: the index in [`DataType::ALL`].
pub(crate) fn dtype(code: u8) -> PyResult<DataType> {
    DataType::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| PyValueError::new_err(format!("unknown data type code {code}")))
}

/// Reduction codes: the index in [`ReduceOp::ALL`] (sum, prod, max, min, avg).
pub(crate) fn reduce_op(code: u8) -> PyResult<ReduceOp> {
    ReduceOp::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| PyValueError::new_err(format!("unknown reduction code {code}")))
}

pub(crate) fn duration(secs: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    match secs {
        None => Ok(None),
        // Beyond what a Duration holds (about 1.8e19 s): as long as it can be.
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(
            Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX),
        )),
        Some(s) => Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, not {s}"
        ))),
    }
}

/// A non-null pointer for an empty buffer (the core may build empty slices from it).
pub(crate) fn nonnull(p: usize, len: usize, what: &str) -> PyResult<usize> {
    if p != 0 {
        Ok(p)
    } else if len == 0 {
        Ok(std::ptr::NonNull::<u64>::dangling().as_ptr() as usize)
    } else {
        Err(PyValueError::new_err(format!(
            "{what}: null address with {len} bytes"
        )))
    }
}

/// `tutti._native.Communicator`. See `tutti.Communicator` for the documented API.
#[pyclass(frozen, name = "Communicator", module = "tutti._native")]
pub(crate) struct PyComm {
    inner: RwLock<Option<Arc<Communicator>>>,
    completer: Mutex<Option<Completer>>,
    /// Sends and receives complete in any order: they have their own completer.
    p2p_completer: Mutex<Option<P2pCompleter>>,
    /// Deadline of each op unless the call names one (settable: torch's
    /// `set_timeout` changes a group's).
    timeout: RwLock<Option<Duration>>,
    rank: usize,
    size: usize,
}

impl PyComm {
    fn wrap(c: Communicator, timeout: Option<Duration>) -> PyComm {
        PyComm {
            rank: c.rank(),
            size: c.size(),
            inner: RwLock::new(Some(Arc::new(c))),
            completer: Mutex::new(None),
            p2p_completer: Mutex::new(None),
            timeout: RwLock::new(timeout),
        }
    }

    pub(crate) fn get(&self) -> PyResult<Arc<Communicator>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("this tutti communicator has been destroyed"))
    }

    /// The default deadline of this communicator's ops.
    pub(crate) fn default_timeout(&self) -> Option<Duration> {
        *self.timeout.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands posted point-to-point ops to this communicator's point-to-point completer.
    fn push_p2p(
        &self,
        py: Python<'_>,
        ops: Vec<PostedP2p>,
        keep: Option<&Py<PyAny>>,
    ) -> Vec<PyWork> {
        let mut g = self.p2p_completer.lock().unwrap_or_else(|e| e.into_inner());
        let completer = g.get_or_insert_with(|| P2pCompleter::start(self.rank));
        completer.push(ops, keep, py)
    }

    fn config(timeout: Option<Duration>) -> tutti::Result<Config> {
        let mut c = Config::from_env()?;
        if let Some(t) = timeout {
            c.timeout = t;
        }
        Ok(c)
    }
}

#[pymethods]
impl PyComm {
    /// Joins the job named by `unique_id` (a `UniqueId` or its string) as
    /// `rank` of `nranks`. Blocks (without the GIL) until every rank joined.
    #[staticmethod]
    #[pyo3(signature = (unique_id, nranks, rank, timeout=None))]
    fn init_rank(
        py: Python<'_>,
        unique_id: UniqueIdArg,
        nranks: usize,
        rank: usize,
        timeout: Option<f64>,
    ) -> PyResult<PyComm> {
        let t = duration(timeout, "timeout")?;
        let id = unique_id.0;
        let c = py
            .detach(move || {
                Self::config(t).and_then(|cfg| Communicator::init_rank_with(&id, nranks, rank, cfg))
            })
            .py(py)?;
        Ok(PyComm::wrap(c, t))
    }

    /// Joins the job described by the environment (`tutti run`, torchrun, Slurm, Open MPI).
    #[staticmethod]
    #[pyo3(signature = (timeout=None))]
    fn from_env(py: Python<'_>, timeout: Option<f64>) -> PyResult<PyComm> {
        let t = duration(timeout, "timeout")?;
        let c = py.detach(Communicator::from_env).py(py)?;
        Ok(PyComm::wrap(c, t))
    }

    /// `n` communicators for `n` threads of this process (the local transport).
    #[staticmethod]
    #[pyo3(signature = (n, timeout=None))]
    fn init_all(py: Python<'_>, n: usize, timeout: Option<f64>) -> PyResult<Vec<PyComm>> {
        let t = duration(timeout, "timeout")?;
        let cs = py
            .detach(move || Self::config(t).and_then(|cfg| Communicator::init_all_with(n, cfg)))
            .py(py)?;
        Ok(cs.into_iter().map(|c| PyComm::wrap(c, t)).collect())
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// This rank's index among the ranks on its host.
    #[getter]
    fn local_rank(&self) -> PyResult<usize> {
        Ok(self.get()?.local_rank())
    }

    /// Number of ranks on this rank's host.
    #[getter]
    fn local_size(&self) -> PyResult<usize> {
        Ok(self.get()?.local_size())
    }

    /// The default op deadline in seconds (None: the core's, `TUTTI_TIMEOUT`).
    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.default_timeout().map(|d| d.as_secs_f64())
    }

    /// Sets the default op deadline in seconds (None: the core's); ops
    /// already submitted keep theirs.
    #[setter]
    fn set_timeout(&self, secs: Option<f64>) -> PyResult<()> {
        let t = duration(secs, "timeout")?;
        *self.timeout.write().unwrap_or_else(|e| e.into_inner()) = t;
        Ok(())
    }

    /// True once `destroy()` ran.
    #[getter]
    fn destroyed(&self) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// The core's view of the topology, as text.
    fn topology(&self) -> PyResult<String> {
        Ok(format!("{:?}", self.get()?.topology()))
    }

    /// Collective over this communicator: ranks with the same `color` form a
    /// new communicator ordered by `key`; `color=None` gets None.
    #[pyo3(signature = (color, key))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<PyComm>> {
        let c = self.get()?;
        let sub = py.detach(move || c.split(color, key)).py(py)?;
        Ok(sub.map(|s| PyComm::wrap(s, self.default_timeout())))
    }

    /// Collective over this communicator: a communicator of `ranks` (in
    /// that order); ranks not listed get None.
    fn new_group(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<PyComm>> {
        let c = self.get()?;
        let sub = py.detach(move || c.new_group(&ranks)).py(py)?;
        Ok(sub.map(|s| PyComm::wrap(s, self.default_timeout())))
    }

    /// Collective over the survivors: a communicator of every rank not in
    /// `dead` (renumbered in order, like `ncclCommShrink`). Every survivor
    /// calls it with the same list; this communicator stays as it is.
    fn shrink(&self, py: Python<'_>, dead: Vec<usize>) -> PyResult<PyComm> {
        let c = self.get()?;
        let sub = py.detach(move || c.shrink(&dead)).py(py)?;
        Ok(PyComm::wrap(sub, self.default_timeout()))
    }

    /// Makes every waiting and later op fail with `tutti.AbortedError`. Any thread.
    fn abort(&self) -> PyResult<()> {
        self.get()?.abort();
        Ok(())
    }

    /// Finishes queued ops, then releases threads, sockets and shared memory.
    /// Later calls raise. Idempotent. Called from an op's callback (on the
    /// completer thread, which cannot wait for itself), it returns at once
    /// and the release follows once the callbacks have returned.
    fn destroy(&self, py: Python<'_>) {
        let c = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        let done = self
            .completer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let p2p = self
            .p2p_completer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let release = move || {
            if let Some(done) = done {
                done.shutdown();
            }
            // Sends and receives still pending fail when the communicator
            // goes; then their completer threads can finish.
            drop(c);
            if let Some(p2p) = p2p {
                p2p.shutdown();
            }
        };
        if crate::work::on_completer_thread() {
            let _ = std::thread::Builder::new()
                .name("tutti-py-destroy".into())
                .spawn(release);
            return;
        }
        py.detach(release);
    }

    /// Number of ops this communicator has completed or failed.
    fn ops_done(&self, py: Python<'_>) -> PyResult<u64> {
        let c = self.get()?;
        Ok(py.detach(move || c.ops_done()))
    }

    /// Runs one collective on raw memory. Private: the Python package checks
    /// the buffers and passes their addresses.
    ///
    /// `kind`, `dtype` and `op` are codes (see `tutti/_codes.py`); `arg` is
    /// the root or peer; lengths are in bytes. Blocking unless `async_op`:
    /// then it returns a `Work`, keeps `keep` alive until the op is done and
    /// then calls `callback(None or exception)` on the completer thread.
    /// `wire`: a 16-bit wire type's name (`"bf16"`, `"f16"`) for an f32
    /// Sum or Avg reduction, or None (`tutti::Options::wire`).
    ///
    /// The caller promises that the addresses are valid for the given
    /// lengths and that nothing else touches that memory until the call
    /// returns (blocking) or the op completes (asynchronous); `keep` should
    /// own the memory.
    #[pyo3(signature = (kind, arg, dtype, op, count, send, send_len, recv, recv_len, timeout=None, async_op=false, keep=None, callback=None, vcounts=None, wire=None))]
    #[allow(clippy::too_many_arguments)]
    fn _call(
        &self,
        py: Python<'_>,
        kind: u8,
        arg: usize,
        dtype: u8,
        op: u8,
        count: usize,
        send: usize,
        send_len: usize,
        recv: usize,
        recv_len: usize,
        timeout: Option<f64>,
        async_op: bool,
        keep: Option<Py<PyAny>>,
        callback: Option<Py<PyAny>>,
        vcounts: Option<VCountsArg>,
        wire: Option<&str>,
    ) -> PyResult<Option<PyWork>> {
        let c = self.get()?;
        let call = RawCall {
            coll: collective(kind, arg)?,
            dtype: crate::comm::dtype(dtype)?,
            op: reduce_op(op)?,
            count,
            send: nonnull(send, send_len, "send buffer")? as *const u8,
            send_len,
            recv: nonnull(recv, recv_len, "receive buffer")? as *mut u8,
            recv_len,
            vcounts: vcounts.map(
                |(send_counts, send_displs, recv_counts, recv_displs)| VCounts {
                    send_counts,
                    send_displs,
                    recv_counts,
                    recv_displs,
                },
            ),
        };
        let opts = Options {
            timeout: duration(timeout, "timeout")?.or_else(|| self.default_timeout()),
            wire: crate::training::wire(py, wire)?,
            ..Options::default()
        };
        if !async_op {
            // SAFETY: the caller guarantees the buffers (see above) for the
            // duration of this call, during which it holds references to them.
            py.detach(move || unsafe { c.run_raw(&call, &opts) })
                .py(py)?;
            return Ok(None);
        }
        // SAFETY: as above, until the op completes; the completer holds
        // `keep` (the buffers' owner) until then.
        let w = unsafe { c.submit_raw(&call, &opts) };
        if matches!(call.coll, Collective::Send { .. } | Collective::Recv { .. }) {
            // Point-to-point: completes out of issue order.
            let mut ws = self.push_p2p(py, vec![(w, None, callback)], keep.as_ref());
            return Ok(ws.pop());
        }
        let mut g = self.completer.lock().unwrap_or_else(|e| e.into_inner());
        let completer = g.get_or_insert_with(|| Completer::start(self.rank));
        Ok(Some(completer.push(w, keep, callback)))
    }

    /// Posts sends and receives on raw memory, all at once, on the
    /// point-to-point channel (they match per peer and tag, in order, and
    /// progress beside the collectives). Private: the Python package checks
    /// the buffers and passes their addresses.
    ///
    /// `ops`: `(is_send, peer, address, bytes, tag, exact)`; a receive's
    /// peer -1 is any source; `exact`: the message must fill the receive
    /// buffer (else it may be shorter). Blocking unless `async_op`: waits
    /// (without the GIL) for every op and returns, per op, a receive's
    /// `(source, tag, bytes)` or None for a send, raising the first error
    /// once all ended. With `async_op`: returns a `Work` per op, keeps
    /// `keep` alive until each op is done and then calls its callback
    /// (`callback`: one callable for every op, or a list with one callable
    /// or None per op) with None or the exception, on a completer thread.
    ///
    /// The caller promises what `_call` needs: valid addresses, memory
    /// untouched until the call returns or the op completes.
    #[pyo3(signature = (ops, timeout=None, async_op=false, keep=None, callback=None))]
    fn _p2p<'py>(
        &self,
        py: Python<'py>,
        ops: Vec<P2pArg>,
        timeout: Option<f64>,
        async_op: bool,
        keep: Option<Py<PyAny>>,
        callback: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let c = self.get()?;
        let mut raw = Vec::with_capacity(ops.len());
        for (send, peer, ptr, len, tag, exact) in ops {
            let what = if send {
                "send buffer"
            } else {
                "receive buffer"
            };
            raw.push(RawP2p {
                send,
                peer: usize::try_from(peer).ok(),
                ptr: nonnull(ptr, len, what)? as *mut u8,
                len,
                tag,
                exact,
            });
        }
        let callbacks: Vec<Option<Py<PyAny>>> = match callback {
            None => (0..raw.len()).map(|_| None).collect(),
            Some(cb) if cb.is_instance_of::<PyList>() || cb.is_instance_of::<PyTuple>() => {
                let v: Vec<Option<Py<PyAny>>> = cb.extract()?;
                if v.len() != raw.len() {
                    return Err(PyValueError::new_err(format!(
                        "_p2p: {} callbacks for {} ops",
                        v.len(),
                        raw.len()
                    )));
                }
                v
            }
            Some(cb) => (0..raw.len()).map(|_| Some(cb.clone().unbind())).collect(),
        };
        let t = duration(timeout, "timeout")?.or_else(|| self.default_timeout());
        if !async_op {
            // The blocking call (`run_p2p_raw`): one send and one receive,
            // or either alone, may take the point-to-point lean lane.
            // SAFETY: the caller guarantees the buffers for the duration of
            // this call, which waits for every op.
            let out = py.detach(move || unsafe { c.run_p2p_raw(&raw, t) });
            let out = out.py(py)?;
            let items = out
                .into_iter()
                .map(|s| match s {
                    Some(s) => (s.source, s.tag, s.bytes)
                        .into_pyobject(py)
                        .map(|t| t.into_any()),
                    None => Ok(py.None().into_bound(py)),
                })
                .collect::<PyResult<Vec<_>>>()?;
            return PyList::new(py, items);
        }
        // SAFETY: as above, until each op completes; the completer holds
        // `keep` (the buffers' owner) until then.
        let posted = unsafe { c.post_p2p_raw(&raw, t) };
        let ops = posted
            .into_iter()
            .zip(callbacks)
            .map(|((w, h), cb)| (w, Some(h), cb))
            .collect();
        let ws = self.push_p2p(py, ops, keep.as_ref());
        let ws = ws
            .into_iter()
            .map(|w| Bound::new(py, w).map(|b| b.into_any()))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, ws)
    }

    fn __repr__(&self) -> String {
        if self.destroyed() {
            format!(
                "<tutti Communicator rank {} of {} (destroyed)>",
                self.rank, self.size
            )
        } else {
            format!("<tutti Communicator rank {} of {}>", self.rank, self.size)
        }
    }
}

impl Drop for PyComm {
    fn drop(&mut self) {
        // Without the GIL held by us here we cannot detach; the completer's
        // callbacks may need to attach, so hand the join to a thread.
        let done = self
            .completer
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let p2p = self
            .p2p_completer
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let c = self
            .inner
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if done.is_some() || c.is_some() || p2p.is_some() {
            let _ = std::thread::Builder::new()
                .name("tutti-py-destroy".into())
                .spawn(move || {
                    if let Some(d) = done {
                        d.shutdown();
                    }
                    drop(c);
                    if let Some(p) = p2p {
                        p.shutdown();
                    }
                });
        }
    }
}
