//! libtutti: tutti's C ABI, shaped like NCCL's API with a `tutti` prefix.
//!
//! The header `include/tutti.h` is generated from this crate by cbindgen
//! (`tests/header.rs` checks that the checked-in copy is current);
//! `include/nccl_compat.h` and `include/hccl_compat.h` map NCCL's and
//! HCCL's names onto it. `docs/c.md` is the guide: building, linking, the
//! threading rules and the error model.
//!
//! Every entry point catches panics (a panic becomes
//! [`tuttiInternalError`]), checks every pointer, count and enum before it
//! touches memory, and records a message naming the rank, the call and the
//! peer that [`tuttiGetLastError`] returns.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod coll;
mod comm;
mod fast;
mod group;
mod handle;
mod queue;

pub use coll::*;
pub use comm::*;
pub use group::*;
pub use handle::{tuttiComm, tuttiComm_t, tuttiGetErrorString, tuttiGetLastError};
pub use queue::*;

use std::ffi::c_int;

/// The result of every call: `tuttiSuccess` (0) or an error code. The
/// numbers are NCCL's (`ncclResult_t`) where the meaning is the same.
pub type tuttiResult_t = c_int;
/// The call succeeded.
pub const tuttiSuccess: tuttiResult_t = 0;
/// An operating-system call failed (a socket, shared memory, a thread).
pub const tuttiSystemError: tuttiResult_t = 2;
/// A bug in tutti (a panic, caught at the ABI boundary).
pub const tuttiInternalError: tuttiResult_t = 3;
/// An argument is wrong: a NULL pointer, a count, a type, a root or peer.
pub const tuttiInvalidArgument: tuttiResult_t = 4;
/// The calls are wrong together: ranks called different collectives, a
/// configuration is invalid, group calls do not nest.
pub const tuttiInvalidUsage: tuttiResult_t = 5;
/// A peer failed: its process died or its connection broke.
pub const tuttiRemoteError: tuttiResult_t = 6;
/// The operation has not completed yet (`tuttiQueueQuery`).
pub const tuttiInProgress: tuttiResult_t = 7;
/// An operation did not complete within its deadline.
pub const tuttiTimeout: tuttiResult_t = 8;
/// The communicator was aborted.
pub const tuttiAborted: tuttiResult_t = 9;
/// One past the largest result code.
pub const tuttiNumResults: tuttiResult_t = 10;

/// Element types; the numbers are NCCL's (`ncclDataType_t`).
pub type tuttiDataType_t = c_int;
/// Signed 8-bit integer.
pub const tuttiInt8: tuttiDataType_t = 0;
/// Signed 8-bit integer (NCCL's alias).
pub const tuttiChar: tuttiDataType_t = 0;
/// Unsigned 8-bit integer.
pub const tuttiUint8: tuttiDataType_t = 1;
/// Signed 32-bit integer.
pub const tuttiInt32: tuttiDataType_t = 2;
/// Signed 32-bit integer (NCCL's alias).
pub const tuttiInt: tuttiDataType_t = 2;
/// Unsigned 32-bit integer.
pub const tuttiUint32: tuttiDataType_t = 3;
/// Signed 64-bit integer.
pub const tuttiInt64: tuttiDataType_t = 4;
/// Unsigned 64-bit integer.
pub const tuttiUint64: tuttiDataType_t = 5;
/// IEEE half precision.
pub const tuttiFloat16: tuttiDataType_t = 6;
/// IEEE half precision (NCCL's alias).
pub const tuttiHalf: tuttiDataType_t = 6;
/// 32-bit float.
pub const tuttiFloat32: tuttiDataType_t = 7;
/// 32-bit float (NCCL's alias).
pub const tuttiFloat: tuttiDataType_t = 7;
/// 64-bit float.
pub const tuttiFloat64: tuttiDataType_t = 8;
/// 64-bit float (NCCL's alias).
pub const tuttiDouble: tuttiDataType_t = 8;
/// bfloat16.
pub const tuttiBfloat16: tuttiDataType_t = 9;
/// One past the largest data type.
pub const tuttiNumTypes: tuttiDataType_t = 10;

/// Reductions; the numbers are NCCL's (`ncclRedOp_t`).
pub type tuttiRedOp_t = c_int;
/// Sum (integers wrap).
pub const tuttiSum: tuttiRedOp_t = 0;
/// Product (integers wrap).
pub const tuttiProd: tuttiRedOp_t = 1;
/// Maximum.
pub const tuttiMax: tuttiRedOp_t = 2;
/// Minimum.
pub const tuttiMin: tuttiRedOp_t = 3;
/// Average: the sum divided by the number of ranks (integers truncate).
pub const tuttiAvg: tuttiRedOp_t = 4;
/// One past the largest reduction.
pub const tuttiNumOps: tuttiRedOp_t = 5;

/// Algorithms a [`tuttiConfig_t`] may force for every collective that has
/// them (others keep the tuner's choice).
pub type tuttiAlgo_t = c_int;
/// The tuner picks per call (or `TUTTI_ALGO`).
pub const tuttiAlgoAuto: tuttiAlgo_t = 0;
/// Ring.
pub const tuttiAlgoRing: tuttiAlgo_t = 1;
/// Binomial / binary trees.
pub const tuttiAlgoTree: tuttiAlgo_t = 2;
/// Two complementary binary trees.
pub const tuttiAlgoDoubleTree: tuttiAlgo_t = 3;
/// Recursive halving and doubling.
pub const tuttiAlgoHalvingDoubling: tuttiAlgo_t = 4;
/// One shot: every rank talks to every rank.
pub const tuttiAlgoDirect: tuttiAlgo_t = 5;
/// Pairwise exchange (AllToAll).
pub const tuttiAlgoPairwise: tuttiAlgo_t = 6;
/// Direct reduce-scatter then all-gather.
pub const tuttiAlgoTwoShot: tuttiAlgo_t = 7;

/// The major version.
pub const TUTTI_MAJOR: c_int = 0;
/// The minor version.
pub const TUTTI_MINOR: c_int = 1;
/// The patch level.
pub const TUTTI_PATCH: c_int = 0;
/// `MAJOR * 10000 + MINOR * 100 + PATCH`, as [`tuttiGetVersion`] returns it.
pub const TUTTI_VERSION_CODE: c_int = TUTTI_MAJOR * 10000 + TUTTI_MINOR * 100 + TUTTI_PATCH;
/// The size of a [`tuttiUniqueId`].
pub const TUTTI_UNIQUE_ID_BYTES: usize = 128;
/// Pass as `color` to [`tuttiCommSplit`] to get no new communicator.
pub const TUTTI_SPLIT_NOCOLOR: c_int = -1;
/// [`tuttiConfig_t::wireType`]'s default: data travels as its own type.
pub const TUTTI_WIRE_NATIVE: tuttiDataType_t = -1;
/// Marks an initialized [`tuttiConfig_t`].
pub const TUTTI_CONFIG_MAGIC: u32 = 0x7475_7474;

/// What lets ranks find each other: made by [`tuttiGetUniqueId`] on one
/// rank and passed to the others by any means (its bytes may be copied).
/// It holds a NUL-terminated text (`tutti1:ADDR:PORT:TOKEN`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct tuttiUniqueId {
    /// The text, NUL-terminated.
    pub internal: [std::ffi::c_char; TUTTI_UNIQUE_ID_BYTES],
}

/// Options for a new communicator, like `ncclConfig_t`. Initialize it with
/// `TUTTI_CONFIG_INITIALIZER`: `size`, `magic` and `version` let the struct
/// grow, as fields the library does not know of (or an older caller did not
/// have) are never read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tuttiConfig_t {
    /// `sizeof(tuttiConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`TUTTI_CONFIG_MAGIC`].
    pub magic: u32,
    /// [`TUTTI_VERSION_CODE`] as the caller compiled it.
    pub version: u32,
    /// The deadline of every operation, in milliseconds (0: `TUTTI_TIMEOUT`).
    pub timeoutMs: i64,
    /// An algorithm to force ([`tuttiAlgoAuto`]: the tuner decides).
    pub algorithm: tuttiAlgo_t,
    /// The type float32 gradients travel as between ranks:
    /// [`tuttiBfloat16`] or [`tuttiFloat16`] for a 16-bit wire, which
    /// halves the bytes and still adds in float32 at every hop (docs/training.md);
    /// [`TUTTI_WIRE_NATIVE`] (the default): every call moves its own type.
    /// It applies to the float32 `tuttiSum`/`tuttiAvg` AllReduce,
    /// ReduceScatter and Reduce of this communicator; its other calls run
    /// as they would without it.
    pub wireType: tuttiDataType_t,
}

/// Writes the library's version, [`TUTTI_VERSION_CODE`], to `*version`.
///
/// # Safety
/// `version` must be NULL or valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn tuttiGetVersion(version: *mut c_int) -> tuttiResult_t {
    if version.is_null() {
        return handle::fail_local("tuttiGetVersion: version is NULL");
    }
    // SAFETY: checked non-null; the caller promises it is writable.
    unsafe { version.write(TUTTI_VERSION_CODE) };
    tuttiSuccess
}
