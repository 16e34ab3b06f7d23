//! numpy arrays as raw buffers, without copying.

use numpy::npyffi::NPY_ARRAY_WRITEABLE;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use tutti::DataType;

/// Code for `bool` arrays (moved and reduced as `u8`; the Python side maps the op).
const BOOL: i32 = 10;
/// Code for any other fixed-size type: it can be moved as bytes, not reduced.
const OTHER: i32 = -1;

fn code(kind: u8, size: usize) -> i32 {
    let d = match (kind, size) {
        (b'f', 4) => DataType::F32,
        (b'f', 8) => DataType::F64,
        (b'f', 2) => DataType::F16,
        (b'i', 1) => DataType::I8,
        (b'i', 4) => DataType::I32,
        (b'i', 8) => DataType::I64,
        (b'u', 1) => DataType::U8,
        (b'u', 4) => DataType::U32,
        (b'u', 8) => DataType::U64,
        (b'b', 1) => return BOOL,
        _ => return OTHER,
    };
    DataType::ALL.iter().position(|&x| x == d).expect("in ALL") as i32
}

/// `(address, bytes, type code, item size)` of a numpy array.
///
/// The type code is an index into the core's data types, 10 for `bool`, or
/// -1 for any other fixed-size type. Raises `TypeError` for a non-array or an
/// object / non-native-byte-order dtype, and `ValueError` for an array that
/// is not C-contiguous, or not writable when `writable` is set. `what` names
/// the argument in messages.
#[pyfunction]
#[pyo3(signature = (array, writable, what="array"))]
pub(crate) fn buffer(
    array: &Bound<'_, PyAny>,
    writable: bool,
    what: &str,
) -> PyResult<(usize, usize, i32, usize)> {
    let a = array.cast::<PyUntypedArray>().map_err(|_| {
        let t = array.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        PyTypeError::new_err(format!(
            "{what} must be a numpy.ndarray, not {t} (for torch tensors use tutti.torch, or tensor.numpy())"
        ))
    })?;
    let d = a.dtype();
    if d.has_object() {
        return Err(PyTypeError::new_err(format!(
            "{what} has dtype object; tutti moves only plain numbers"
        )));
    }
    if d.is_native_byteorder() == Some(false) {
        return Err(PyTypeError::new_err(format!(
            "{what} has non-native byte order ({}); convert it with a.astype(a.dtype.newbyteorder('='))",
            d.str().map(|s| s.to_string()).unwrap_or_default()
        )));
    }
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{what} is not C-contiguous (shape {:?}, strides {:?}); pass numpy.ascontiguousarray(a), and copy the result back if it is an output",
            a.shape(),
            a.strides()
        )));
    }
    let ptr = a.as_array_ptr();
    // SAFETY: `ptr` is the live array object `a` refers to; we read two fields.
    let (data, flags) = unsafe { ((*ptr).fields.data as usize, (*ptr).fields.flags) };
    if writable && flags & NPY_ARRAY_WRITEABLE == 0 {
        return Err(PyValueError::new_err(format!(
            "{what} is read-only, but tutti writes the result into it"
        )));
    }
    let item = d.itemsize();
    Ok((data, a.len() * item, code(d.kind(), item), item))
}
