//! The hot path of the most frequent call, a blocking AllReduce (a
//! training loop's small gradient or loss reduction): when every argument
//! is good, the call goes straight to the engine, without the checked
//! call's intermediate values (the per-call checker, the op kind that a
//! queue or group would need). Any argument this path does not accept, a
//! queue, or an open group sends the call down the full path
//! ([`crate::tuttiAllReduce`]'s body), which checks again and reports.

use crate::coll::{dtype_of, op_of};
use crate::handle::{guard, tuttiComm, Failure};
use crate::queue::tuttiQueue_t;
use crate::*;
use std::ffi::c_void;
use tutti::{Collective, RawCall};

/// Runs a blocking AllReduce whose arguments are all good; `None` (and
/// nothing done) for any other call.
///
/// # Safety
/// As for [`crate::tuttiAllReduce`].
#[inline(always)]
pub(crate) unsafe fn all_reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    op: tuttiRedOp_t,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> Option<tuttiResult_t> {
    if comm.is_null() || !queue.is_null() || sendbuff.is_null() || recvbuff.is_null() {
        return None;
    }
    let dtype = dtype_of(datatype)?;
    let op = op_of(op)?;
    let len = count
        .checked_mul(dtype.size())
        .filter(|&b| b > 0 && b <= isize::MAX as usize)?;
    let (s, r) = (sendbuff as usize, recvbuff as usize);
    // In place, or disjoint.
    if s != r && s < r.wrapping_add(len) && r < s.wrapping_add(len) {
        return None;
    }
    if group::in_group() {
        return None;
    }
    // SAFETY: not NULL; the caller promises a live handle that no
    // tuttiCommDestroy releases during this call (handle.rs).
    let c: &tuttiComm = unsafe { &*(comm as *const tuttiComm) };
    let call = RawCall {
        coll: Collective::AllReduce,
        dtype,
        op,
        count,
        send: sendbuff as *const u8,
        send_len: len,
        recv: recvbuff as *mut u8,
        recv_len: len,
        vcounts: None,
    };
    Some(guard("tuttiAllReduce", Some(c), || {
        // SAFETY: both buffers hold `len` bytes (the caller's promise),
        // are not NULL, and are the same or disjoint.
        unsafe { c.comm.run_raw(&call, c.opts_for(&call)) }
            .map_err(|e| Failure::of(c, "tuttiAllReduce", &e))
    }))
}
