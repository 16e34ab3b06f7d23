//! `tutti._native`: the compiled half of the `tutti` Python package.
//!
//! It is deliberately thin. The Python package (in `python/tutti`) owns the
//! user-facing API (argument names, shapes, defaults, docstrings) and the
//! torch.distributed backend; this module owns what must be fast or must not
//! hold the GIL:
//!
//! * `comm::PyComm`: a communicator with one entry point, `_call`, that
//!   runs any collective on raw addresses (blocking with the GIL released,
//!   or asynchronously with a `work::PyWork` handle);
//! * `array::buffer`: address, length and element type of a numpy array,
//!   checked (C-contiguous, writable where written, native byte order);
//! * `PyUniqueId`: the rendezvous handle;
//! * `errors`: tutti errors as the exception classes of `tutti._errors`.
#![deny(unsafe_op_in_unsafe_fn)]

mod array;
mod comm;
mod errors;
mod explain;
mod training;
mod work;

use errors::IntoPy;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use tutti::UniqueId;

/// The rendezvous handle (`tutti.UniqueId`): rank 0's address and port and
/// an auth token. Its string form, `tutti1:ADDR:PORT:TOKEN`, is what other
/// ranks need to join.
#[pyclass(
    frozen,
    eq,
    hash,
    name = "UniqueId",
    module = "tutti._native",
    from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyUniqueId(UniqueId);

/// A `UniqueId` argument: the object or its string form.
pub(crate) struct UniqueIdArg(UniqueId);

impl<'py> FromPyObject<'_, 'py> for UniqueIdArg {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(u) = ob.cast::<PyUniqueId>() {
            return Ok(UniqueIdArg(u.get().0.clone()));
        }
        let s: String = ob.extract().map_err(|_| {
            PyTypeError::new_err("a unique id must be a tutti.UniqueId or its string form")
        })?;
        Ok(UniqueIdArg(s.parse::<UniqueId>().py(ob.py())?))
    }
}

fn resolve_v4(host: &str, port: u16) -> PyResult<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| PyValueError::new_err(format!("cannot resolve {host:?}: {e}")))?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| PyValueError::new_err(format!("{host:?} has no IPv4 address")))
}

#[pymethods]
impl PyUniqueId {
    /// Parses the string form (`tutti1:ADDR:PORT:TOKEN`).
    #[new]
    fn parse(py: Python<'_>, s: &str) -> PyResult<Self> {
        Ok(PyUniqueId(s.parse::<UniqueId>().py(py)?))
    }

    /// A fresh id with a random token. Without `host`, the root listens on
    /// `TUTTI_SOCKET_IFNAME`'s address or loopback, and this process must be
    /// the one that runs rank 0. With `host` (this machine's address as the
    /// other ranks reach it), a free port is chosen on all interfaces and
    /// rank 0 binds it when it joins.
    #[staticmethod]
    #[pyo3(signature = (host=None))]
    fn new(py: Python<'_>, host: Option<&str>) -> PyResult<Self> {
        let Some(host) = host else {
            return Ok(PyUniqueId(UniqueId::new().py(py)?));
        };
        let mut token = [0u8; 16];
        getrandom::getrandom(&mut token)
            .map_err(|e| PyValueError::new_err(format!("no random token: {e}")))?;
        let ip = resolve_v4(host, 0)?.ip();
        let port = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| PyValueError::new_err(format!("cannot find a free port: {e}")))?
            .port();
        Ok(PyUniqueId(UniqueId {
            addr: SocketAddr::new(ip, port),
            token,
        }))
    }

    /// The id every rank can compute from the master's address alone (as for
    /// `init_method="tcp://HOST:PORT"`): the token is `TUTTI_TOKEN` if set,
    /// else derived from `host` and `port` (this guards against accidents,
    /// not attackers). Rank 0 listens on `port`.
    #[staticmethod]
    fn for_address(host: &str, port: u16) -> PyResult<Self> {
        let addr = resolve_v4(host, port)?;
        let token = match tutti::config::launch::token_from_env()
            .map_err(|_| PyValueError::new_err("TUTTI_TOKEN must be 32 hex digits"))?
        {
            Some(t) => t,
            // The same derivation as the core's for TUTTI_MASTER_ADDR/PORT.
            None => {
                let mut t = [0u8; 16];
                let s = format!("tutti:{host}:{port}");
                for (i, b) in s.bytes().enumerate() {
                    t[i % 16] = t[i % 16].wrapping_mul(31).wrapping_add(b);
                }
                t
            }
        };
        Ok(PyUniqueId(UniqueId { addr, token }))
    }

    /// Rank 0's address, as `"ADDR:PORT"`.
    #[getter]
    fn address(&self) -> String {
        self.0.addr.to_string()
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("UniqueId({:?})", self.0.to_string())
    }
}

/// The data type codes understood by `Communicator._call`, by name.
#[pyfunction]
fn _dtype_codes() -> Vec<(&'static str, u8, usize)> {
    tutti::DataType::ALL
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name(), i as u8, d.size()))
        .collect()
}

/// This host's IPv4 addresses other than loopback, of the interfaces that
/// are up (`tutti::topo::iface::list`), in the kernel's order.
#[pyfunction]
fn _local_addresses() -> PyResult<Vec<String>> {
    let list = tutti::topo::iface::list()
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    Ok(list
        .into_iter()
        .filter(|i| !i.addr.is_loopback())
        .map(|i| i.addr.to_string())
        .collect())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::PyComm>()?;
    m.add_class::<work::PyWork>()?;
    m.add_class::<PyUniqueId>()?;
    m.add_function(wrap_pyfunction!(array::buffer, m)?)?;
    m.add_function(wrap_pyfunction!(_dtype_codes, m)?)?;
    m.add_function(wrap_pyfunction!(_local_addresses, m)?)?;
    training::register(m)?;
    m.add_function(wrap_pyfunction!(explain::_explain, m)?)?;
    m.add_function(wrap_pyfunction!(explain::_predict_us, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
