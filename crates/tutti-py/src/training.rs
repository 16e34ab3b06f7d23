//! Training options for Python (issue 41): the 16-bit wire's name, fused
//! AllReduce of many arrays ([`tutti::Communicator::all_reduce_many`]),
//! sparse AllReduce ([`tutti::Communicator::sparse_all_reduce`]) and Top-K
//! with error feedback ([`tutti::TopK`],
//! [`tutti::Communicator::top_k_all_reduce`]).
//!
//! Like `Communicator._call`, the calls here are private: the Python package
//! (`tutti/_training.py`, `tutti/_torch_hooks.py`) checks arrays and tensors
//! and passes addresses. Every call that communicates runs with the GIL
//! released; the core's errors become the exceptions of `tutti._errors`.

use crate::comm::{duration, nonnull, reduce_op, PyComm};
use crate::errors::IntoPy;
use half::{bf16, f16};
use numpy::{PyArray1, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use tutti::{Communicator, DataType, Element, FusionOptions, ReduceOp, SparseRoute};

/// The `wire` argument: None, or a 16-bit type's name (`"bf16"`,
/// `"bfloat16"`, `"f16"`, `"fp16"`, `"float16"`, `"half"`). Another type's
/// name is passed on, so that the core rejects it with its rule ("the wire
/// type must be bf16 or f16"); an unknown name is an argument error.
pub(crate) fn wire(py: Python<'_>, w: Option<&str>) -> PyResult<Option<DataType>> {
    match w {
        None => Ok(None),
        Some(s) if s.eq_ignore_ascii_case("fp16") => Ok(Some(DataType::F16)),
        Some(s) => s.parse::<DataType>().map(Some).py(py),
    }
}

fn route_name(r: SparseRoute) -> &'static str {
    match r {
        SparseRoute::Gather => "gather",
        SparseRoute::Dense => "dense",
    }
}

/// `(address, bytes)` of each array, as typed slices: checked for
/// alignment, whole elements and overlap (two `&mut` slices must not alias).
///
/// # Safety
/// Each address must be valid for reads and writes of its bytes, untouched
/// by anything else while the slices live.
unsafe fn slices<'a, T: Element>(bufs: &[(usize, usize)]) -> PyResult<Vec<&'a mut [T]>> {
    let size = std::mem::size_of::<T>();
    let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(bufs.len());
    for (i, &(p, n)) in bufs.iter().enumerate() {
        if n % size != 0 {
            return Err(PyValueError::new_err(format!(
                "all_reduce_many: array {i} has {n} bytes, not whole {} elements",
                T::DTYPE
            )));
        }
        let p = nonnull(p, n, "all_reduce_many")?;
        if p % std::mem::align_of::<T>() != 0 {
            return Err(PyValueError::new_err(format!(
                "all_reduce_many: array {i} is not aligned for {}; pass a copy",
                T::DTYPE
            )));
        }
        spans.push((p, n, i));
    }
    let mut sorted: Vec<_> = spans.iter().filter(|s| s.1 > 0).copied().collect();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(PyValueError::new_err(format!(
            "all_reduce_many: arrays {} and {} overlap in memory; pass separate arrays",
            w[0].2.min(w[1].2),
            w[0].2.max(w[1].2)
        )));
    }
    Ok(spans
        .into_iter()
        .map(|(p, n, _)| {
            // SAFETY: the caller's promise covers `p..p+n`; `p` is non-null
            // and aligned for T, `n` a whole number of elements, and no
            // two non-empty slices overlap (checked above).
            unsafe { std::slice::from_raw_parts_mut(p as *mut T, n / size) }
        })
        .collect())
}

fn many<T: Element>(
    py: Python<'_>,
    c: Arc<Communicator>,
    bufs: &[(usize, usize)],
    op: ReduceOp,
    opts: FusionOptions,
) -> PyResult<()> {
    // SAFETY: the caller of `_all_reduce_many` guarantees the buffers for
    // the duration of the call, which holds references to their owners.
    let mut s = unsafe { slices::<T>(bufs)? };
    py.detach(move || c.all_reduce_many(&mut s, op, &opts))
        .py(py)
}

/// All-reduces many arrays of one type in place, packed into buckets of
/// `bucket_bytes` (`Communicator::all_reduce_many`), blocking, without the
/// GIL. `bufs`: `(address, bytes)` per array, in the same order and sizes
/// on every rank; `dtype`, `op` are codes as for `_call`; `wire` a 16-bit
/// type's name or None.
///
/// The caller promises valid, disjoint addresses, untouched until this
/// returns.
#[pyfunction]
#[pyo3(signature = (comm, bufs, dtype, op, bucket_bytes, wire=None, timeout=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _all_reduce_many(
    py: Python<'_>,
    comm: &PyComm,
    bufs: Vec<(usize, usize)>,
    dtype: u8,
    op: u8,
    bucket_bytes: usize,
    wire: Option<&str>,
    timeout: Option<f64>,
) -> PyResult<()> {
    let c = comm.get()?;
    let mut opts = FusionOptions::default().bucket_bytes(bucket_bytes);
    opts.call.timeout = duration(timeout, "timeout")?.or_else(|| comm.default_timeout());
    opts.call.wire = self::wire(py, wire)?;
    let op = reduce_op(op)?;
    match crate::comm::dtype(dtype)? {
        DataType::F32 => many::<f32>(py, c, &bufs, op, opts),
        DataType::F64 => many::<f64>(py, c, &bufs, op, opts),
        DataType::F16 => many::<f16>(py, c, &bufs, op, opts),
        DataType::Bf16 => many::<bf16>(py, c, &bufs, op, opts),
        DataType::I8 => many::<i8>(py, c, &bufs, op, opts),
        DataType::U8 => many::<u8>(py, c, &bufs, op, opts),
        DataType::I32 => many::<i32>(py, c, &bufs, op, opts),
        DataType::I64 => many::<i64>(py, c, &bufs, op, opts),
        DataType::U32 => many::<u32>(py, c, &bufs, op, opts),
        DataType::U64 => many::<u64>(py, c, &bufs, op, opts),
    }
}

/// A float32 vector of `count` elements at `addr`, written by the caller's
/// promise.
///
/// # Safety
/// `addr` must be valid for reads and writes of `count` f32 elements,
/// aligned, untouched by anything else while the slice lives.
unsafe fn f32_slice<'a>(addr: usize, count: usize, what: &str) -> PyResult<&'a mut [f32]> {
    let p = nonnull(addr, count * 4, what)?;
    if p % 4 != 0 {
        return Err(PyValueError::new_err(format!(
            "{what} is not aligned for float32"
        )));
    }
    // SAFETY: the caller's promise; `p` is non-null and aligned.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut f32, count) })
}

/// Sums every rank's `(indices, values)` pairs into the dense float32
/// vector of `out_count` elements at `out` (`Communicator::sparse_all_reduce`;
/// `op` Sum or Avg as a code), blocking, without the GIL. Returns the route
/// the cost model chose: `"gather"` or `"dense"`.
///
/// The caller promises that `out` is valid for `out_count` float32 elements
/// and untouched until this returns.
#[pyfunction]
#[pyo3(signature = (comm, indices, values, out, out_count, op))]
pub(crate) fn _sparse_all_reduce(
    py: Python<'_>,
    comm: &PyComm,
    indices: PyReadonlyArray1<'_, u32>,
    values: PyReadonlyArray1<'_, f32>,
    out: usize,
    out_count: usize,
    op: u8,
) -> PyResult<&'static str> {
    let c = comm.get()?;
    let op = reduce_op(op)?;
    let idx = indices
        .as_slice()
        .map_err(|_| PyValueError::new_err("sparse_all_reduce: indices must be contiguous"))?;
    let val = values
        .as_slice()
        .map_err(|_| PyValueError::new_err("sparse_all_reduce: values must be contiguous"))?;
    // SAFETY: the caller's promise for `out`.
    let out = unsafe { f32_slice(out, out_count, "sparse_all_reduce: out")? };
    let r = py
        .detach(move || c.sparse_all_reduce(idx, val, out, op))
        .py(py)?;
    Ok(route_name(r))
}

/// The route `Communicator::sparse_route` picks for `k_max` pairs per rank
/// and vectors of `len` elements (`"gather"` or `"dense"`): the same on
/// every rank of the communicator.
#[pyfunction]
pub(crate) fn _sparse_route(comm: &PyComm, k_max: usize, len: usize) -> PyResult<&'static str> {
    Ok(route_name(comm.get()?.sparse_route(k_max, len)))
}

/// Sums gathered Top-K blocks (`tutti::sum_pair_blocks`: per rank `k`
/// indices, then `k` values as float32 bits, in rank order) into `out`
/// (float32, writable; zeroed first), dividing the touched entries by the
/// number of blocks when `avg`. Runs without the GIL.
#[pyfunction]
pub(crate) fn _sum_pair_blocks(
    py: Python<'_>,
    all: PyReadonlyArray1<'_, u32>,
    k: usize,
    mut out: PyReadwriteArray1<'_, f32>,
    avg: bool,
) -> PyResult<()> {
    let all = all
        .as_slice()
        .map_err(|_| PyTypeError::new_err("_sum_pair_blocks: the blocks must be contiguous"))?;
    let out = out
        .as_slice_mut()
        .map_err(|_| PyTypeError::new_err("_sum_pair_blocks: out must be contiguous"))?;
    py.detach(|| tutti::sum_pair_blocks(all, k, out, avg))
        .py(py)
}

/// Top-K's kept entries: (indices, values).
type Pairs<'py> = (Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<f32>>);

/// `tutti.TopK`'s compiled half: a [`tutti::TopK`] (Top-K sparsification
/// with error feedback for vectors of one length).
#[pyclass(frozen, name = "TopK", module = "tutti._native")]
pub(crate) struct PyTopK {
    inner: Mutex<tutti::TopK>,
    len: usize,
    error_feedback: bool,
}

impl PyTopK {
    fn lock(&self) -> std::sync::MutexGuard<'_, tutti::TopK> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl PyTopK {
    /// For vectors of `len` elements, sending `ceil(ratio * len)` of them
    /// (at least one); `ratio` in (0, 1].
    /// `momentum`: DGC's momentum correction (`TopK::with_momentum`) when
    /// not None.
    #[new]
    #[pyo3(signature = (len, ratio, error_feedback=true, momentum=None))]
    fn new(
        py: Python<'_>,
        len: usize,
        ratio: f64,
        error_feedback: bool,
        momentum: Option<f64>,
    ) -> PyResult<Self> {
        let mut t = tutti::TopK::new(len, ratio, error_feedback).py(py)?;
        if let Some(m) = momentum {
            t = t.with_momentum(m).py(py)?;
        }
        Ok(PyTopK {
            inner: Mutex::new(t),
            len,
            error_feedback,
        })
    }

    /// Entries sent per step.
    #[getter]
    fn k(&self) -> usize {
        self.lock().k()
    }

    /// The vector length.
    #[getter]
    fn len(&self) -> usize {
        self.len
    }

    /// Whether what is not sent is kept for the next step.
    #[getter]
    fn error_feedback(&self) -> bool {
        self.error_feedback
    }

    /// A copy of what has not been sent yet (zeros without error feedback).
    fn residual<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        PyArray1::from_slice(py, self.lock().residual())
    }

    /// The momentum factor, or None without momentum correction.
    #[getter]
    fn momentum(&self) -> Option<f64> {
        self.lock().momentum()
    }

    /// A copy of the velocity of momentum correction, or None without it.
    fn velocity<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f32>>> {
        self.lock().velocity().map(|v| PyArray1::from_slice(py, v))
    }

    /// Overwrites the residual (and the velocity, with momentum
    /// correction; None leaves it) with copies of the given float32
    /// vectors of `len` elements.
    #[pyo3(signature = (residual, velocity=None))]
    fn restore(
        &self,
        residual: PyReadonlyArray1<'_, f32>,
        velocity: Option<PyReadonlyArray1<'_, f32>>,
    ) -> PyResult<()> {
        let mut t = self.lock();
        let (r, v) = t.state_mut();
        let copy = |dst: &mut [f32], src: &PyReadonlyArray1<'_, f32>, what: &str| {
            let src = src.as_slice().map_err(|_| {
                PyTypeError::new_err(format!("TopK.restore: {what} must be contiguous"))
            })?;
            if src.len() != dst.len() {
                return Err(PyValueError::new_err(format!(
                    "TopK.restore: {what} has {} elements, this compressor {}",
                    src.len(),
                    dst.len()
                )));
            }
            dst.copy_from_slice(src);
            Ok(())
        };
        copy(r, &residual, "residual")?;
        match (v, velocity) {
            (Some(v), Some(src)) => copy(v, &src, "velocity"),
            (None, Some(_)) => Err(PyValueError::new_err(
                "TopK.restore: a velocity for a compressor without momentum correction",
            )),
            _ => Ok(()),
        }
    }

    /// A dense step in place on `grad` (float32, 1-D, writable): folds it
    /// in as `compress` does, leaves the whole residual in `grad` and
    /// empties the residual (`TopK::dense_step`). Runs without the GIL.
    fn dense_step(&self, py: Python<'_>, mut grad: PyReadwriteArray1<'_, f32>) -> PyResult<()> {
        let g = grad
            .as_slice_mut()
            .map_err(|_| PyTypeError::new_err("TopK.dense_step: grad must be contiguous"))?;
        py.detach(|| self.lock().dense_step(g)).py(py)
    }

    /// Adds the residual to `grad` (float32, 1-D, `len` elements), keeps
    /// the `k` entries of largest magnitude and returns them as
    /// `(indices uint32, values float32)`, ascending by index; the rest
    /// becomes the residual. Runs without the GIL.
    fn compress<'py>(
        &self,
        py: Python<'py>,
        grad: PyReadonlyArray1<'py, f32>,
    ) -> PyResult<Pairs<'py>> {
        let g = grad
            .as_slice()
            .map_err(|_| PyTypeError::new_err("TopK.compress: grad must be contiguous"))?;
        let (i, v) = py.detach(|| self.lock().compress(g)).py(py)?;
        Ok((PyArray1::from_vec(py, i), PyArray1::from_vec(py, v)))
    }

    fn __repr__(&self) -> String {
        format!(
            "TopK(len={}, k={}, error_feedback={})",
            self.len,
            self.k(),
            self.error_feedback
        )
    }
}

/// Top-K AllReduce of the float32 vector of `count` elements at `grad`, in
/// place (`Communicator::top_k_all_reduce`: compress with `topk`'s residual,
/// then sparse AllReduce with `op`, Sum or Avg), blocking, without the GIL.
/// Returns the route (`"gather"` or `"dense"`). A length that is not
/// `topk`'s fails on every rank.
///
/// The caller promises that `grad` is valid for `count` float32 elements
/// and untouched until this returns.
#[pyfunction]
pub(crate) fn _top_k_all_reduce(
    py: Python<'_>,
    comm: &PyComm,
    grad: usize,
    count: usize,
    topk: &PyTopK,
    op: u8,
) -> PyResult<&'static str> {
    let c = comm.get()?;
    let op = reduce_op(op)?;
    // SAFETY: the caller's promise for `grad`.
    let g = unsafe { f32_slice(grad, count, "top_k_all_reduce: grad")? };
    let r = py
        .detach(|| {
            let mut t = topk.lock();
            c.top_k_all_reduce(g, &mut t, op)
        })
        .py(py)?;
    Ok(route_name(r))
}

/// Registers this module's classes and functions in `tutti._native`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTopK>()?;
    m.add_function(wrap_pyfunction!(_all_reduce_many, m)?)?;
    m.add_function(wrap_pyfunction!(_sparse_all_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(_sparse_route, m)?)?;
    m.add_function(wrap_pyfunction!(_sum_pair_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(_top_k_all_reduce, m)?)?;
    Ok(())
}
