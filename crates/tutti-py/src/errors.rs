//! tutti errors as Python exceptions.
//!
//! The exception classes are defined in Python (`tutti/_errors.py`), where
//! they can inherit from two built-ins at once (`tutti.TimeoutError` is both a
//! `tutti.TuttiError` and a built-in `TimeoutError`). This module imports them
//! once and raises them with the core's message and its fields as attributes.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use tutti::Error;

/// The Python class for each error variant, by name in `tutti._errors`.
fn class_name(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument(_) => "InvalidArgumentError",
        Error::Config(_) => "ConfigError",
        Error::Bootstrap { .. } => "BootstrapError",
        Error::Timeout { .. } => "TimeoutError",
        Error::PeerLost { .. } => "PeerLostError",
        Error::Mismatch { .. } => "MismatchError",
        Error::SizeMismatch { .. } => "SizeMismatchError",
        Error::Aborted => "AbortedError",
        Error::Io { .. } => "IoError",
        _ => "TuttiError",
    }
}

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> Option<Bound<'py, PyType>> {
    let m = ERRORS
        .get_or_try_init(py, || py.import("tutti._errors").map(|m| m.unbind()))
        .ok()?;
    m.bind(py).getattr(name).ok()?.cast_into::<PyType>().ok()
}

/// The exception object for `e`: the class named by [`class_name`], built
/// with the core's message, with the error's fields set as attributes.
pub(crate) fn to_pyerr(py: Python<'_>, e: &Error) -> PyErr {
    let msg = e.to_string();
    let Some(cls) = class(py, class_name(e)) else {
        return PyRuntimeError::new_err(msg);
    };
    let exc = match cls.call1((msg.clone(),)) {
        Ok(x) => x,
        Err(_) => return PyRuntimeError::new_err(msg),
    };
    let set = |k: &str, v: Bound<'_, PyAny>| {
        let _ = exc.setattr(k, v);
    };
    match e {
        Error::Timeout {
            op,
            seq,
            rank,
            waiting_for,
            after,
        } => {
            set("op", op.into_pyobject(py).expect("str").into_any());
            set("seq", seq.into_pyobject(py).expect("int").into_any());
            set("rank", rank.into_pyobject(py).expect("int").into_any());
            if let Ok(v) = waiting_for.clone().into_pyobject(py) {
                set("waiting_for", v.into_any());
            }
            set(
                "after",
                after
                    .as_secs_f64()
                    .into_pyobject(py)
                    .expect("float")
                    .into_any(),
            );
        }
        Error::PeerLost {
            rank,
            peer,
            op,
            seq,
            ..
        } => {
            set("rank", rank.into_pyobject(py).expect("int").into_any());
            set("peer", peer.into_pyobject(py).expect("int").into_any());
            set("op", op.into_pyobject(py).expect("str").into_any());
            set("seq", seq.into_pyobject(py).expect("int").into_any());
        }
        Error::Mismatch {
            rank, peer, seq, ..
        } => {
            set("rank", rank.into_pyobject(py).expect("int").into_any());
            set("peer", peer.into_pyobject(py).expect("int").into_any());
            set("seq", seq.into_pyobject(py).expect("int").into_any());
        }
        Error::SizeMismatch {
            rank,
            peer,
            tag,
            message,
            buffer,
        } => {
            set("rank", rank.into_pyobject(py).expect("int").into_any());
            set("peer", peer.into_pyobject(py).expect("int").into_any());
            set("tag", tag.into_pyobject(py).expect("int").into_any());
            set(
                "message",
                message.into_pyobject(py).expect("int").into_any(),
            );
            set("buffer", buffer.into_pyobject(py).expect("int").into_any());
        }
        Error::Bootstrap { rank, .. } => {
            set("rank", rank.into_pyobject(py).expect("int").into_any());
        }
        _ => {}
    }
    PyErr::from_value(exc)
}

/// `Result<T, tutti::Error>` to `PyResult<T>`.
pub(crate) trait IntoPy<T> {
    /// Converts the error, if any, into the matching Python exception.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for tutti::Result<T> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, &e))
    }
}
