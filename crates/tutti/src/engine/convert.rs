//! The executor's conversion steps of a schedule on a 16-bit wire
//! ([`crate::algo::wire`]): narrowing, widening, widening with a reduction,
//! and rounding, over the op's buffers with the kernels of
//! [`crate::reduce::wire`].

use super::executor::{resolve, Buffers};
use crate::algo::Step;
use crate::error::{Error, Result};
use crate::reduce::{wire, DataType};

/// Runs conversion step `st` (`esz`: the data element's size) with the
/// schedule's wire type and f16 scale shift.
pub(super) fn run(st: &Step, b: &Buffers, esz: usize, w: Option<(DataType, u32)>) -> Result<()> {
    let Some((ty, shift)) = w else {
        return Err(Error::Internal(format!(
            "a schedule without a wire type converts: {st:?}"
        )));
    };
    if st.is_empty() {
        return Ok(());
    }
    // SAFETY (all four): `resolve` checked every range against its
    // buffer; the step's dependencies are done and every later step that
    // touches these ranges waits for this one, so nothing else accesses
    // them meanwhile; the wire staging is a buffer of its own, apart from
    // the data buffers, and a data range's source and destination are the
    // same range or apart (the lowering makes them so).
    match *st {
        Step::Narrow { src, dst, len } => unsafe {
            wire::narrow(
                ty,
                shift,
                resolve(b, dst, len, esz)?,
                resolve(b, src, len, esz)?,
                len,
            )
        },
        Step::Widen { src, dst, len } => unsafe {
            wire::widen(
                ty,
                shift,
                resolve(b, dst, len, esz)?,
                resolve(b, src, len, esz)?,
                len,
            )
        },
        Step::WidenReduce {
            src,
            wire: w,
            dst,
            len,
        } => unsafe {
            wire::widen_add(
                ty,
                shift,
                resolve(b, dst, len, esz)?,
                resolve(b, src, len, esz)?,
                resolve(b, w, len, esz)?,
                len,
            )
        },
        Step::Round { src, dst, len } => unsafe {
            wire::round(
                ty,
                shift,
                resolve(b, dst, len, esz)?,
                resolve(b, src, len, esz)?,
                len,
            )
        },
        _ => return Err(Error::Internal(format!("not a conversion: {st:?}"))),
    }
    Ok(())
}
