//! The data calls: collectives, Send and Recv, in NCCL's shape
//! `(sendbuff, recvbuff, count, datatype, [op], [root|peer], comm, queue)`.
//!
//! Each checks every pointer, count and enum on this rank before anything
//! is sent: a NULL buffer with a non-zero count, an unknown type or
//! operation, a root or peer out of range, or buffers that overlap without
//! being in place (NCCL's meaning of in place, per call) are
//! `tuttiInvalidArgument`. Buffers that are in place and that the engine
//! cannot share are staged through a copy the library owns.

use crate::group::{dispatch, Kind, Op, Stage};
use crate::handle::{with_comm, Failure};
use crate::queue::tuttiQueue_t;
use crate::*;
use std::ffi::c_void;
use std::sync::Arc;
use tutti::{Collective, DataType, RawCall, RawP2p, ReduceOp};

#[inline(always)]
pub(crate) fn dtype_of(t: tuttiDataType_t) -> Option<DataType> {
    Some(match t {
        tuttiInt8 => DataType::I8,
        tuttiUint8 => DataType::U8,
        tuttiInt32 => DataType::I32,
        tuttiUint32 => DataType::U32,
        tuttiInt64 => DataType::I64,
        tuttiUint64 => DataType::U64,
        tuttiFloat16 => DataType::F16,
        tuttiFloat32 => DataType::F32,
        tuttiFloat64 => DataType::F64,
        tuttiBfloat16 => DataType::Bf16,
        _ => return None,
    })
}

#[inline(always)]
pub(crate) fn op_of(o: tuttiRedOp_t) -> Option<ReduceOp> {
    Some(match o {
        tuttiSum => ReduceOp::Sum,
        tuttiProd => ReduceOp::Prod,
        tuttiMax => ReduceOp::Max,
        tuttiMin => ReduceOp::Min,
        tuttiAvg => ReduceOp::Avg,
        _ => return None,
    })
}

/// A call being checked: its communicator, name and element size.
struct Check<'a> {
    c: &'a Arc<tuttiComm>,
    name: &'static str,
    dtype: DataType,
}

impl<'a> Check<'a> {
    #[inline(always)]
    fn new(c: &'a Arc<tuttiComm>, name: &'static str, t: tuttiDataType_t) -> Result<Self, Failure> {
        let dtype = dtype_of(t).ok_or_else(|| {
            Failure::arg(format!(
                "{}: {name}: unknown datatype {t} (tuttiInt8 .. tuttiBfloat16 are 0..{})",
                c.who(),
                tuttiNumTypes - 1
            ))
        })?;
        Ok(Check { c, name, dtype })
    }

    #[cold]
    fn arg(&self, msg: impl std::fmt::Display) -> Failure {
        Failure::arg(format!("{}: {}: {msg}", self.c.who(), self.name))
    }

    #[inline(always)]
    fn rank(&self) -> usize {
        self.c.comm.rank()
    }

    #[inline(always)]
    fn size(&self) -> usize {
        self.c.comm.size()
    }

    #[inline(always)]
    fn redop(&self, o: tuttiRedOp_t) -> Result<ReduceOp, Failure> {
        op_of(o).ok_or_else(|| {
            self.arg(format!(
                "unknown reduction {o} (tuttiSum .. tuttiAvg are 0..{})",
                tuttiNumOps - 1
            ))
        })
    }

    /// `root` as a rank of this communicator.
    #[inline(always)]
    fn root(&self, root: c_int, what: &str) -> Result<usize, Failure> {
        let n = self.size();
        if root < 0 || root as usize >= n {
            return Err(self.arg(format!(
                "{what} {root} is out of range; this communicator has ranks 0..{n}"
            )));
        }
        Ok(root as usize)
    }

    /// Bytes of `count * times` elements, without overflow.
    #[inline(always)]
    fn bytes(&self, count: usize, times: usize) -> Result<usize, Failure> {
        count
            .checked_mul(times)
            .and_then(|e| e.checked_mul(self.dtype.size()))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| self.arg(format!("count {count} overflows the addressable size")))
    }

    /// `ptr` as a buffer of `len` bytes: an error if NULL with `len > 0`;
    /// a dangling, aligned pointer if empty.
    #[inline(always)]
    fn buf(&self, ptr: *const c_void, len: usize, what: &str) -> Result<*mut u8, Failure> {
        if len == 0 {
            return Ok(std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8);
        }
        if ptr.is_null() {
            return Err(self.arg(format!("{what} is NULL but holds {len} bytes")));
        }
        Ok(ptr as *mut u8)
    }

    /// An error if `[a, a+al)` and `[b, b+bl)` overlap (the call is not in place).
    #[inline(always)]
    fn disjoint(&self, a: *mut u8, al: usize, b: *mut u8, bl: usize) -> Result<(), Failure> {
        let (a, b) = (a as usize, b as usize);
        if al > 0 && bl > 0 && a < b + bl && b < a + al {
            return Err(self.arg(
                "sendbuff and recvbuff overlap but the call is not in place \
                 (see docs/c.md for each call's in-place layout)",
            ));
        }
        Ok(())
    }

    #[inline(always)]
    fn call(&self, coll: Collective, op: ReduceOp, count: usize) -> RawCall {
        RawCall {
            coll,
            dtype: self.dtype,
            op,
            count,
            send: std::ptr::NonNull::<u64>::dangling().as_ptr() as *const u8,
            send_len: 0,
            recv: std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8,
            recv_len: 0,
            vcounts: None,
        }
    }

    /// Runs or queues the call.
    #[inline(always)]
    fn go(self, kind: Kind, stage: Option<Stage>, queue: tuttiQueue_t) -> Result<(), Failure> {
        // The common case, a blocking collective without staging, runs
        // here without making an owned op (one reference count less).
        if let (Kind::Coll(call), None, true) = (&kind, &stage, queue.is_null()) {
            if !group::in_group() {
                let c = &self.c;
                // SAFETY: the buffers were checked against the counts, and
                // the caller promises they stay valid until the call returns.
                return unsafe { c.comm.run_raw(call, c.opts_for(call)) }
                    .map_err(|e| Failure::of(c, self.name, &e));
            }
        }
        let op = Op {
            comm: self.c.clone(),
            name: self.name,
            kind,
            stage,
        };
        // SAFETY: the entry point's caller promises `queue` is NULL or live.
        unsafe { dispatch(op, queue) }
    }
}

/// A copy of `len` bytes at `p`, and the call reads it instead.
///
/// # Safety
/// `p` must be valid for reads of `len` bytes.
unsafe fn stage_input(c: &mut RawCall, p: *const u8, len: usize) -> Stage {
    let mut v = vec![0u8; len];
    // SAFETY: the caller's promise; `v` is ours.
    unsafe { std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), len) };
    c.send = v.as_ptr();
    c.send_len = len;
    Stage::Input(v)
}

/// The call writes a buffer of its own, copied to `dst` on success.
fn stage_output(c: &mut RawCall, dst: *mut u8, len: usize) -> Stage {
    let mut v = vec![0u8; len];
    c.recv = v.as_mut_ptr();
    c.recv_len = len;
    Stage::Output(v, dst)
}

macro_rules! entry {
    ($name:literal, $comm:ident, |$c:ident| $body:block) => {
        // SAFETY: the caller promises `comm` is NULL or a live handle, and
        // the buffers hold what the counts say.
        unsafe { with_comm($name, $comm, |$c| $body) }
    };
}

/// Reduces `count` elements of every rank's `sendbuff` with `op` into every
/// rank's `recvbuff`. In place: `sendbuff == recvbuff`.
///
/// # Safety
/// `sendbuff`/`recvbuff` valid for `count` elements each, untouched until
/// the call completes (at once with a NULL queue, else per the queue);
/// `comm` and `queue` live handles (queue may be NULL).
#[no_mangle]
pub unsafe extern "C" fn tuttiAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    op: tuttiRedOp_t,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        match crate::fast::all_reduce(sendbuff, recvbuff, count, datatype, op, comm, queue) {
            Some(r) => r,
            None => all_reduce_checked(sendbuff, recvbuff, count, datatype, op, comm, queue),
        }
    }
}

/// [`tuttiAllReduce`] through the full checks (every call the fast path
/// does not take), out of line so that the fast path's frame stays small.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[inline(never)]
unsafe fn all_reduce_checked(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    op: tuttiRedOp_t,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiAllReduce", comm, |c| {
        let k = Check::new(c, "tuttiAllReduce", datatype)?;
        let op = k.redop(op)?;
        let len = k.bytes(count, 1)?;
        let s = k.buf(sendbuff, len, "sendbuff")?;
        let r = k.buf(recvbuff, len, "recvbuff")?;
        if s != r {
            k.disjoint(s, len, r, len)?;
        }
        let mut call = k.call(Collective::AllReduce, op, count);
        (call.send, call.send_len, call.recv, call.recv_len) = (s, len, r, len);
        k.go(Kind::Coll(call), None, queue)
    })
}

/// Copies `count` elements of the root's `sendbuff` into every rank's
/// `recvbuff`. `sendbuff` is read on the root only; in place:
/// `sendbuff == recvbuff`.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    root: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiBroadcast", comm, |c| {
        let k = Check::new(c, "tuttiBroadcast", datatype)?;
        let root = k.root(root, "root")?;
        let len = k.bytes(count, 1)?;
        let r = k.buf(recvbuff, len, "recvbuff")?;
        let mut call = k.call(Collective::Broadcast { root }, ReduceOp::Sum, count);
        (call.recv, call.recv_len) = (r, len);
        if k.rank() == root {
            let s = k.buf(sendbuff, len, "sendbuff")?;
            if s != r {
                k.disjoint(s, len, r, len)?;
                (call.send, call.send_len) = (s, len);
            }
        }
        k.go(Kind::Coll(call), None, queue)
    })
}

/// In-place [`tuttiBroadcast`] (NCCL's `ncclBcast`).
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiBcast(
    buff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    root: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    // SAFETY: the caller's promises, passed on.
    unsafe { tuttiBroadcast(buff, buff, count, datatype, root, comm, queue) }
}

/// Reduces `count` elements of every rank's `sendbuff` into the root's
/// `recvbuff` (read on the root only). In place: `sendbuff == recvbuff`.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    op: tuttiRedOp_t,
    root: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiReduce", comm, |c| {
        let k = Check::new(c, "tuttiReduce", datatype)?;
        let op = k.redop(op)?;
        let root = k.root(root, "root")?;
        let len = k.bytes(count, 1)?;
        let s = k.buf(sendbuff, len, "sendbuff")?;
        let mut call = k.call(Collective::Reduce { root }, op, count);
        (call.send, call.send_len) = (s, len);
        let mut stage = None;
        if k.rank() == root {
            let r = k.buf(recvbuff, len, "recvbuff")?;
            (call.recv, call.recv_len) = (r, len);
            if s == r {
                // SAFETY: `s` holds `len` bytes (the caller's promise).
                stage = Some(stage_input(&mut call, s, len));
            } else {
                k.disjoint(s, len, r, len)?;
            }
        }
        k.go(Kind::Coll(call), stage, queue)
    })
}

/// Every rank's `sendcount` elements land in every rank's `recvbuff`
/// (`nranks * sendcount` elements, in rank order). In place:
/// `sendbuff == recvbuff + rank * sendcount` elements.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: tuttiDataType_t,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiAllGather", comm, |c| {
        let k = Check::new(c, "tuttiAllGather", datatype)?;
        let len = k.bytes(sendcount, 1)?;
        let rlen = k.bytes(sendcount, k.size())?;
        let s = k.buf(sendbuff, len, "sendbuff")?;
        let r = k.buf(recvbuff, rlen, "recvbuff")?;
        let mut call = k.call(Collective::AllGather, ReduceOp::Sum, sendcount);
        (call.send, call.send_len, call.recv, call.recv_len) = (s, len, r, rlen);
        let mut stage = None;
        if len > 0 && s as usize == r as usize + k.rank() * len {
            // SAFETY: `s` holds `len` bytes (the caller's promise).
            stage = Some(stage_input(&mut call, s, len));
        } else {
            k.disjoint(s, len, r, rlen)?;
        }
        k.go(Kind::Coll(call), stage, queue)
    })
}

/// Reduces every rank's `sendbuff` (`nranks * recvcount` elements); rank r
/// receives block r in `recvbuff`. In place:
/// `recvbuff == sendbuff + rank * recvcount` elements.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: tuttiDataType_t,
    op: tuttiRedOp_t,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiReduceScatter", comm, |c| {
        let k = Check::new(c, "tuttiReduceScatter", datatype)?;
        let op = k.redop(op)?;
        let len = k.bytes(recvcount, 1)?;
        let slen = k.bytes(recvcount, k.size())?;
        let s = k.buf(sendbuff, slen, "sendbuff")?;
        let r = k.buf(recvbuff, len, "recvbuff")?;
        let mut call = k.call(Collective::ReduceScatter, op, recvcount);
        (call.send, call.send_len, call.recv, call.recv_len) = (s, slen, r, len);
        let mut stage = None;
        if len > 0 && r as usize == s as usize + k.rank() * len {
            stage = Some(stage_output(&mut call, r, len));
        } else {
            k.disjoint(s, slen, r, len)?;
        }
        k.go(Kind::Coll(call), stage, queue)
    })
}

/// Block p (`count` elements) of `sendbuff` goes to rank p, where it lands
/// as block r (this rank) of `recvbuff`; both hold `nranks * count`
/// elements. In place: `sendbuff == recvbuff`.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiAllToAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiAllToAll", comm, |c| {
        let k = Check::new(c, "tuttiAllToAll", datatype)?;
        let len = k.bytes(count, k.size())?;
        let s = k.buf(sendbuff, len, "sendbuff")?;
        let r = k.buf(recvbuff, len, "recvbuff")?;
        let mut call = k.call(Collective::AllToAll, ReduceOp::Sum, count);
        (call.send, call.send_len, call.recv, call.recv_len) = (s, len, r, len);
        let mut stage = None;
        if s == r {
            // SAFETY: `s` holds `len` bytes (the caller's promise).
            stage = Some(stage_input(&mut call, s, len));
        } else {
            k.disjoint(s, len, r, len)?;
        }
        k.go(Kind::Coll(call), stage, queue)
    })
}

/// AllToAll with per-peer counts and displacements (elements, `nranks`
/// entries each): `sendcounts[p]` elements from `sendbuff + sdispls[p]` go
/// to rank p; rank p's block lands at `recvbuff + rdispls[p]`
/// (`recvcounts[p]` elements). In place: `sendbuff == recvbuff`.
///
/// # Safety
/// As for [`tuttiAllReduce`]; the four arrays hold `nranks` entries.
#[no_mangle]
pub unsafe extern "C" fn tuttiAllToAllv(
    sendbuff: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: tuttiDataType_t,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiAllToAllv", comm, |c| {
        let k = Check::new(c, "tuttiAllToAllv", datatype)?;
        let n = k.size();
        let mut arrays = Vec::with_capacity(4);
        for (p, what) in [
            (sendcounts, "sendcounts"),
            (sdispls, "sdispls"),
            (recvcounts, "recvcounts"),
            (rdispls, "rdispls"),
        ] {
            if p.is_null() {
                return Err(k.arg(format!("{what} is NULL")));
            }
            // SAFETY: non-null; the caller promises `nranks` entries.
            arrays.push(std::slice::from_raw_parts(p, n).to_vec());
        }
        let extent = |counts: &[usize], displs: &[usize]| -> Result<usize, Failure> {
            let mut end = 0usize;
            for (q, (&cn, &d)) in counts.iter().zip(displs).enumerate() {
                let e = cn
                    .checked_add(d)
                    .ok_or_else(|| k.arg(format!("count + displacement of rank {q} overflow")))?;
                if cn > 0 {
                    end = end.max(e);
                }
            }
            k.bytes(end, 1)
        };
        let slen = extent(&arrays[0], &arrays[1])?;
        let rlen = extent(&arrays[2], &arrays[3])?;
        let s = k.buf(sendbuff, slen, "sendbuff")?;
        let r = k.buf(recvbuff, rlen, "recvbuff")?;
        let mut call = k.call(Collective::AllToAllV, ReduceOp::Sum, 0);
        (call.send, call.send_len, call.recv, call.recv_len) = (s, slen, r, rlen);
        let mut stage = None;
        if s == r {
            // SAFETY: `s` holds `slen` bytes (the caller's promise).
            stage = Some(stage_input(&mut call, s, slen));
        } else {
            k.disjoint(s, slen, r, rlen)?;
        }
        let mut it = arrays.into_iter();
        let mut next = || it.next().expect("four arrays");
        call.vcounts = Some(tutti::algo::VCounts {
            send_counts: next(),
            send_displs: next(),
            recv_counts: next(),
            recv_displs: next(),
        });
        k.go(Kind::Coll(call), stage, queue)
    })
}

/// Every rank's `sendcount` elements land in the root's `recvbuff`
/// (`nranks * sendcount` elements in rank order; read on the root only).
/// In place: on the root `sendbuff == recvbuff + root * sendcount`.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: tuttiDataType_t,
    root: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiGather", comm, |c| {
        let k = Check::new(c, "tuttiGather", datatype)?;
        let root = k.root(root, "root")?;
        let len = k.bytes(sendcount, 1)?;
        let s = k.buf(sendbuff, len, "sendbuff")?;
        let mut call = k.call(Collective::Gather { root }, ReduceOp::Sum, sendcount);
        (call.send, call.send_len) = (s, len);
        let mut stage = None;
        if k.rank() == root {
            let rlen = k.bytes(sendcount, k.size())?;
            let r = k.buf(recvbuff, rlen, "recvbuff")?;
            (call.recv, call.recv_len) = (r, rlen);
            if len > 0 && s as usize == r as usize + root * len {
                // SAFETY: `s` holds `len` bytes (the caller's promise).
                stage = Some(stage_input(&mut call, s, len));
            } else {
                k.disjoint(s, len, r, rlen)?;
            }
        }
        k.go(Kind::Coll(call), stage, queue)
    })
}

/// Block p (`recvcount` elements) of the root's `sendbuff` (read on the
/// root only) lands in rank p's `recvbuff`. In place: on the root
/// `recvbuff == sendbuff + root * recvcount`.
///
/// # Safety
/// As for [`tuttiAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn tuttiScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: tuttiDataType_t,
    root: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    entry!("tuttiScatter", comm, |c| {
        let k = Check::new(c, "tuttiScatter", datatype)?;
        let root = k.root(root, "root")?;
        let len = k.bytes(recvcount, 1)?;
        let r = k.buf(recvbuff, len, "recvbuff")?;
        let mut call = k.call(Collective::Scatter { root }, ReduceOp::Sum, recvcount);
        (call.recv, call.recv_len) = (r, len);
        let mut stage = None;
        if k.rank() == root {
            let slen = k.bytes(recvcount, k.size())?;
            let s = k.buf(sendbuff, slen, "sendbuff")?;
            (call.send, call.send_len) = (s, slen);
            if len > 0 && r as usize == s as usize + root * len {
                stage = Some(stage_output(&mut call, r, len));
            } else {
                k.disjoint(s, slen, r, len)?;
            }
        }
        k.go(Kind::Coll(call), stage, queue)
    })
}

/// Returns (NULL queue) or completes (on a queue) once every rank has
/// entered the barrier.
///
/// # Safety
/// `comm` and `queue` live handles (queue may be NULL).
#[no_mangle]
pub unsafe extern "C" fn tuttiBarrier(comm: tuttiComm_t, queue: tuttiQueue_t) -> tuttiResult_t {
    entry!("tuttiBarrier", comm, |c| {
        let k = Check::new(c, "tuttiBarrier", tuttiUint8)?;
        let call = k.call(Collective::Barrier, ReduceOp::Sum, 0);
        k.go(Kind::Coll(call), None, queue)
    })
}

/// A send or receive of `count` elements at `buf` with `peer`.
///
/// # Safety
/// As for [`tuttiSend`].
#[allow(clippy::too_many_arguments)] // the C call's arguments, plus its name and direction
unsafe fn p2p(
    name: &'static str,
    send: bool,
    buf: *const c_void,
    count: usize,
    datatype: tuttiDataType_t,
    peer: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    // SAFETY: the caller promises `comm` is NULL or a live handle.
    unsafe {
        with_comm(name, comm, |c| {
            let k = Check::new(c, name, datatype)?;
            let peer = k.root(peer, "peer")?;
            let len = k.bytes(count, 1)?;
            let ptr = k.buf(buf, len, if send { "sendbuff" } else { "recvbuff" })?;
            if peer == k.rank() && !group::in_group() {
                return Err(k.arg(format!(
                    "peer {peer} is this rank itself; outside a group its match could never \
                     be posted: put the send and the receive between tuttiGroupStart and \
                     tuttiGroupEnd"
                )));
            }
            let p = RawP2p {
                send,
                peer: Some(peer),
                ptr,
                len,
                tag: 0,
                exact: true,
            };
            k.go(Kind::P2p(p), None, queue)
        })
    }
}

/// Sends `count` elements of `sendbuff` to `peer`, which receives them
/// with [`tuttiRecv`]. Messages between two ranks match in order.
///
/// # Safety
/// `sendbuff` valid for `count` elements and untouched until the send
/// completes; `comm` and `queue` live handles (queue may be NULL).
#[no_mangle]
pub unsafe extern "C" fn tuttiSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: tuttiDataType_t,
    peer: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        p2p(
            "tuttiSend",
            true,
            sendbuff,
            count,
            datatype,
            peer,
            comm,
            queue,
        )
    }
}

/// Receives exactly `count` elements from `peer` into `recvbuff`.
///
/// # Safety
/// As for [`tuttiSend`], with `recvbuff` writable.
#[no_mangle]
pub unsafe extern "C" fn tuttiRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: tuttiDataType_t,
    peer: c_int,
    comm: tuttiComm_t,
    queue: tuttiQueue_t,
) -> tuttiResult_t {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        p2p(
            "tuttiRecv",
            false,
            recvbuff,
            count,
            datatype,
            peer,
            comm,
            queue,
        )
    }
}
