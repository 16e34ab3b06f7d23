//! `tutti.explain(dir)` and the cost model's prediction for one call
//! (torch's time estimator, `tutti/_torch_estimate.py`).

use crate::comm::PyComm;
use crate::errors::IntoPy;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tutti::{CollKind, DataType};

/// The report of a run's timed traces in `dir` ([`tutti::explain`]), as
/// JSON text (the Python side parses it into a dict).
#[pyfunction]
pub(crate) fn _explain(py: Python<'_>, dir: std::path::PathBuf) -> PyResult<String> {
    let r = py
        .detach(|| tutti::explain::explain(&dir, None))
        .map_err(PyValueError::new_err)?;
    serde_json::to_string(&r).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// What Auto would run for `collective` (`all_reduce`, ...) with `count`
/// elements of `dtype` (`f32`, ...) on `comm`, and its time in
/// microseconds: the cost model's prediction with the communicator's
/// calibrated links, or online tuning's measured time once it decided.
/// Nothing moves. `root`: for the rooted collectives.
#[pyfunction]
#[pyo3(signature = (comm, collective, count, dtype, root = 0))]
pub(crate) fn _predict_us(
    py: Python<'_>,
    comm: &Bound<'_, PyComm>,
    collective: &str,
    count: usize,
    dtype: &str,
    root: usize,
) -> PyResult<(String, f64)> {
    let bad = |e: tutti::Error| PyValueError::new_err(e.to_string());
    let kind: CollKind = collective.parse().map_err(bad)?;
    let dtype: DataType = dtype.parse().map_err(bad)?;
    let coll = kind
        .with_root(root)
        .ok_or_else(|| PyValueError::new_err("no prediction for sends and receives"))?;
    let c = comm.get().get()?;
    let choice = py.detach(|| c.plan(coll, count, dtype)).py(py)?;
    Ok((choice.algorithm.to_string(), choice.us))
}
