//! Transports: how bytes get from one rank to another.
//!
//! The interface is narrow and non-blocking: the executor hands a link a
//! [`SendMsg`] or [`RecvMsg`] (a byte range of a buffer that stays valid and
//! untouched until the message is done) and calls [`Link::send`] /
//! [`Link::recv`] to make progress; neither ever blocks. Every wait keeps
//! one contract ([`wait`]): poll, check abort, deadline and liveness, then
//! sleep a bounded while the way the links say ([`Link::sleep`]).
//!
//! The transports, each a folder with the same files (`mod.rs`, `link.rs`:
//! the link type; `connect.rs`: its set-up), listed in [`Link`]:
//!
//! * [`shm`]: rings in a shared segment, for ranks on one host (processes),
//!   or in a heap segment for ranks that are threads of one process (the
//!   `local` transport). Large messages are read straight from the sender's
//!   buffer.
//! * [`tcp`]: one or more sockets per peer pair, for ranks on different
//!   hosts (or on one host with `TUTTI_TRANSPORT=tcp`); large messages are
//!   striped over the sockets in frames.
//!
//! `sys.rs` holds the system calls, `wait.rs` the waiting contract,
//! `link.rs` what every link answers ([`LinkOps`]) and `exchange.rs` the
//! set-up rounds the wiring uses ([`Exchange`]).
//!
//! Every message carries a 16-byte [`Header`] (op sequence number, a tag
//! fingerprinting the collective and data type, length), so ranks that call
//! different collectives get an [`Error::Mismatch`] instead of mixed data.

mod exchange;
pub(crate) mod shm;
pub(crate) mod sys;
pub(crate) mod tcp;
pub(crate) mod wait;

/// The mailboxes live with the segment they use (`shm/mailbox.rs`); this
/// is their old path.
pub(crate) use shm::mailbox;
/// The TCP I/O thread lives in the tcp folder (`tcp/io/`); this is its old
/// path.
pub(crate) use tcp::io as tcp_io;

use crate::error::{Error, Result};
use crate::reduce::{self, DataType, ReduceOp};

/// `Header::seq` of point-to-point messages, which have no collective order.
pub(crate) const P2P_SEQ: u32 = u32::MAX;

/// The link counter bits of `Header::flags` for message number `n`.
pub(crate) fn msg_flags(n: u32) -> u16 {
    ((n & 0x7fff) << 1) as u16
}

/// Bytes of a message header.
pub(crate) const HEADER_BYTES: usize = 16;

/// The header in front of every message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Header {
    /// Low 32 bits of the collective's sequence number on the communicator
    /// (counting collectives only), or [`P2P_SEQ`] for send/recv.
    pub seq: u32,
    /// Fingerprint of the collective kind, data type, reduction and root.
    pub tag: u16,
    /// Bit 0: a direct-read descriptor follows. Bits 1..16: the message's
    /// number on its link (mod 2^15), so a lost or repeated message shows.
    pub flags: u16,
    /// Payload bytes.
    pub len: u64,
}

pub use crate::topo::TransportKind;

pub(crate) use exchange::Exchange;
mod link;
pub(crate) use link::LinkOps;

// The transports' link types: adding a transport adds its folder and one
// line here.
link::links! {
    /// Shared-memory rings (shm or local).
    Ring(shm::RingLink),
    /// TCP sockets driven by the executor.
    Tcp(tcp::TcpLink),
    /// TCP sockets driven by the connection set's I/O thread.
    TcpIo(tcp::IoLink),
}

/// An outgoing message in progress.
pub(crate) struct SendMsg {
    /// Start of the bytes to send.
    pub ptr: *const u8,
    /// Total bytes.
    pub len: usize,
    /// Bytes ready to send (less than `len` while a fused step is still receiving them).
    pub avail: usize,
    /// Bytes handed to the transport.
    pub sent: usize,
    pub header_sent: bool,
    /// For a direct send: the `acked` count that means the receiver is done.
    pub direct_target: Option<u64>,
    pub done: bool,
}

impl SendMsg {
    pub(crate) fn new(ptr: *const u8, len: usize, avail: usize) -> Self {
        SendMsg {
            ptr,
            len,
            avail,
            sent: 0,
            header_sent: false,
            direct_target: None,
            done: false,
        }
    }
}

/// An incoming message in progress.
pub(crate) struct RecvMsg {
    /// Where the payload goes.
    pub dst: *mut u8,
    /// For a reducing receive: the local operand (`dst = src (op) payload`).
    pub reduce_src: Option<*const u8>,
    /// Total bytes.
    pub len: usize,
    /// Bytes delivered to `dst`.
    pub got: usize,
    pub header_seen: bool,
    pub done: bool,
    /// Whether copies into `dst` use non-temporal stores: by default for
    /// messages of [`reduce::copy::STREAM_MIN`] bytes or more; the executor
    /// also streams plain receives of calls whose buffers outgrow the cache
    /// ([`reduce::copy::stream_received`]), and keeps in the cache what this
    /// rank reads again (a step that forwards the bytes, or a later one
    /// that sends or reduces them: [`crate::algo::Schedule::read_back`]).
    pub stream: bool,
    /// How many bytes the link may deliver for now: a member of a reduction
    /// chain ([`crate::algo::Schedule::reduce_chain`]) waits for the member
    /// before it. `usize::MAX` where nothing holds the message back. Only
    /// the shared-memory rings honour it (the executor forms chains only
    /// over them).
    pub limit: usize,
    /// For a reducing receive: the payload is the left operand (`dst =
    /// payload (op) src`), where a reduction chain folds its first message
    /// and this rank's own operand in one pass.
    pub recv_first: bool,
    /// The message may be shorter than `len`: its header says how long it
    /// is, and `len` becomes that. Only links whose
    /// [`LinkOps::takes_var_len`] says so honour it.
    pub var_len: bool,
}

impl RecvMsg {
    pub(crate) fn new(dst: *mut u8, reduce_src: Option<*const u8>, len: usize) -> Self {
        RecvMsg {
            dst,
            reduce_src,
            len,
            got: 0,
            header_seen: false,
            done: false,
            stream: len >= reduce::copy::STREAM_MIN,
            limit: usize::MAX,
            recv_first: false,
            var_len: false,
        }
    }

    /// Copies or reduces `k` payload bytes at `src` into place and advances.
    ///
    /// # Safety
    /// `src` must be valid for `k` bytes and must not overlap `dst`;
    /// `got + k <= len`; for a reduce, `k` is a whole number of elements.
    pub(crate) unsafe fn deliver(&mut self, src: *const u8, k: usize, cx: &StepCx) {
        debug_assert!(self.got + k <= self.len);
        // SAFETY: the message's dst (and reduce_src) are valid for len bytes
        // (the executor guarantees it) and got + k <= len.
        unsafe {
            let d = self.dst.add(self.got);
            match self.reduce_src {
                None if self.stream => reduce::copy::copy_stream(src, d, k),
                None => reduce::copy::copy(src, d, k),
                Some(a) if self.recv_first => {
                    reduce::reduce(cx.dtype, cx.op, d, src, a.add(self.got), k)
                }
                Some(a) => reduce::reduce(cx.dtype, cx.op, d, a.add(self.got), src, k),
            }
        }
        self.got += k;
    }

    /// Copies or reduces `k` payload bytes at `src` into place at message
    /// offset `off`, without touching `got` (for links that deliver parts of
    /// a message out of order).
    ///
    /// # Safety
    /// `src` must be valid for `k` bytes and must not overlap `dst`;
    /// `off + k <= len`; for a reduce, `off` and `k` are whole elements.
    pub(crate) unsafe fn deliver_at(&self, off: usize, src: *const u8, k: usize, cx: &StepCx) {
        debug_assert!(off + k <= self.len);
        // SAFETY: the message's dst (and reduce_src) are valid for len bytes
        // (the executor guarantees it) and off + k <= len.
        unsafe {
            let d = self.dst.add(off);
            match self.reduce_src {
                None => reduce::copy::copy(src, d, k),
                Some(a) if self.recv_first => {
                    reduce::reduce(cx.dtype, cx.op, d, src, a.add(off), k)
                }
                Some(a) => reduce::reduce(cx.dtype, cx.op, d, a.add(off), src, k),
            }
        }
    }
}

// SAFETY: the raw pointers in messages point into buffers that the op owns
// for its whole duration; messages move between threads only with their op.
unsafe impl Send for SendMsg {}
// SAFETY: as above.
unsafe impl Send for RecvMsg {}

/// What every message of one op shares: identity (for headers and errors),
/// the element type and reduction, and scratch space for the transports.
pub(crate) struct StepCx {
    pub rank: usize,
    /// The op's sequence number on the communicator (for messages and errors).
    pub seq: u64,
    /// What goes in `Header::seq`: the collective sequence number, or [`P2P_SEQ`].
    pub coll_seq: u32,
    pub tag: u16,
    pub op_name: &'static str,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub elem: usize,
    /// Messages at least this long go direct (shm), when their bytes are all ready.
    pub direct_bytes: usize,
    /// Shared-memory sends write the rings with non-temporal stores
    /// ([`crate::tune::Choice::stream`]).
    pub stream: bool,
    /// Bounce buffer for reductions of data that must first be copied in.
    pub bounce: Vec<u8>,
}

impl StepCx {
    /// The context of point-to-point messages on `rank`: bytes under the
    /// Send/Recv tag and [`P2P_SEQ`], direct from `direct_bytes` up.
    pub(crate) fn point_to_point(rank: usize, direct_bytes: usize, bounce: Vec<u8>) -> StepCx {
        StepCx {
            rank,
            seq: 0,
            coll_seq: P2P_SEQ,
            tag: make_tag(
                crate::algo::CollKind::SendRecv,
                DataType::U8,
                ReduceOp::Sum,
                0,
            ),
            op_name: "send/recv",
            dtype: DataType::U8,
            op: ReduceOp::Sum,
            elem: 1,
            direct_bytes,
            stream: false,
            bounce,
        }
    }

    /// Checks an incoming header against what this rank expects: the `n`-th
    /// message on the link from `peer`, of `len` bytes, for this op.
    pub(crate) fn check_header(&self, h: &Header, len: usize, peer: usize, n: u32) -> Result<()> {
        let mismatch = |msg: String| Error::Mismatch {
            rank: self.rank,
            peer,
            seq: self.seq,
            msg,
        };
        if h.flags & !1 != msg_flags(n) {
            return Err(mismatch(format!(
                "message {} from rank {peer} arrived where message {} was expected (lost or repeated data)",
                h.flags >> 1,
                n & 0x7fff
            )));
        }
        if h.tag != self.tag
            || (h.seq != self.coll_seq && h.seq != P2P_SEQ && self.coll_seq != P2P_SEQ)
        {
            let which = |seq: u32| {
                if seq == P2P_SEQ {
                    "send/recv".to_string()
                } else {
                    format!("collective #{seq}")
                }
            };
            return Err(mismatch(format!(
                "this rank runs {} ({}, {}), rank {peer} sent a message of {} ({}, {}); every rank must call the same collectives in the same order with the same type, op and root",
                self.op_name,
                which(self.coll_seq),
                describe_tag(self.tag),
                tag_name(h.tag),
                which(h.seq),
                describe_tag(h.tag)
            )));
        }
        if h.len != len as u64 {
            return Err(mismatch(format!(
                "{} (op #{}): this rank expects {len} bytes from rank {peer}, which sent {} bytes; do all ranks pass the same count?",
                self.op_name, self.seq, h.len
            )));
        }
        Ok(())
    }

    /// A `PeerLost` error for this op.
    pub(crate) fn lost(&self, peer: usize, msg: String) -> Error {
        Error::PeerLost {
            rank: self.rank,
            peer,
            op: self.op_name.to_string(),
            seq: self.seq,
            msg,
        }
    }
}

/// The tag of an op in 16 bits: collective kind, data type, reduction op
/// and root (mod 16), four bits each.
pub(crate) fn make_tag(
    kind: crate::algo::CollKind,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
) -> u16 {
    let k = crate::algo::CollKind::ALL
        .iter()
        .position(|x| *x == kind)
        .unwrap_or(15) as u16;
    let d = DataType::ALL.iter().position(|x| *x == dtype).unwrap_or(15) as u16;
    let o = ReduceOp::ALL.iter().position(|x| *x == op).unwrap_or(15) as u16;
    (k << 12) | (d << 8) | (o << 4) | (root as u16 & 15)
}

/// How a `Mismatch` message ends: the rule the ranks broke.
pub(crate) const SAME_CALLS: &str = "every rank must call the same collectives in the same order with the same count, type, op and root";

pub(crate) fn tag_name(tag: u16) -> &'static str {
    crate::algo::CollKind::ALL
        .get((tag >> 12) as usize)
        .map(|k| k.name())
        .unwrap_or("?")
}

pub(crate) fn describe_tag(tag: u16) -> String {
    let d = DataType::ALL
        .get(((tag >> 8) & 15) as usize)
        .map(|d| d.name())
        .unwrap_or("?");
    let o = ReduceOp::ALL
        .get(((tag >> 4) & 15) as usize)
        .map(|o| o.name())
        .unwrap_or("?");
    format!("dtype {d}, op {o}, root {} (mod 16)", tag & 15)
}
