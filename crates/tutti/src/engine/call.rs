//! The untyped call: [`RawCall`] (buffers as raw bytes plus a
//! [`DataType`]), its [`Options`], and the check that turns it into an
//! [`OpCall`] before anything is sent ([`Engine::check`]): lengths, roots,
//! peers and overlaps, against this communicator. The typed API in `comm`
//! builds raw calls from slices; the C and Python bindings build them
//! directly.

use super::{Engine, OpCall};
use crate::algo::{verify::buffer_sizes, Algorithm, Collective, Problem, VCounts, Wire};
use crate::error::{Error, Result};
use crate::reduce::{DataType, ReduceOp};
use std::time::Duration;

/// Per-call options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Force an algorithm for this call (`None`: the tuner or `TUTTI_ALGO` decides).
    pub algorithm: Option<Algorithm>,
    /// Deadline for this call (`None`: the communicator's, `TUTTI_TIMEOUT`).
    pub timeout: Option<Duration>,
    /// A 16-bit wire: `Some(DataType::Bf16)` or `Some(DataType::F16)` makes
    /// an f32 Sum or Avg reduction (AllReduce, ReduceScatter, Reduce) move
    /// its data in that type, half the bytes, while every rank reduces in
    /// f32 ([`crate::algo::wire`]; accuracy and f16's scaling in
    /// `docs/training.md`). Every rank must pass the same. Anything else
    /// (another type, an integer or f64 call, another op or collective) is
    /// [`Error::InvalidArgument`].
    pub wire: Option<DataType>,
}

impl Options {
    /// These options with the 16-bit wire `wire` (see [`Options::wire`]).
    ///
    /// ```
    /// let o = tutti::Options::default().wire(tutti::DataType::Bf16);
    /// assert_eq!(o.wire, Some(tutti::DataType::Bf16));
    /// ```
    pub fn wire(self, wire: DataType) -> Self {
        Options {
            wire: Some(wire),
            ..self
        }
    }
}

/// The wire type of a checked call's `wire` option.
pub(crate) fn wire_of(w: Option<DataType>) -> Option<Wire> {
    match w? {
        DataType::Bf16 => Some(Wire::Bf16),
        DataType::F16 => Some(Wire::F16),
        _ => None,
    }
}

/// An untyped collective call: buffers as raw bytes plus a [`DataType`].
///
/// Buffer sizes follow the table on [`Problem`]: e.g. AllGather's `recv`
/// holds `size * count` elements. A root-only buffer may be null/empty on
/// other ranks. Broadcast sends the root's `recv`; the root may instead pass
/// its data in a separate `send` of `count` elements (copied into `recv`
/// first, as NCCL's out-of-place broadcast); a null or empty `send` means
/// the data is in `recv`. Other ranks' `send` is ignored.
#[derive(Clone, Debug)]
pub struct RawCall {
    /// Which collective (with its root or peer).
    pub coll: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Element count, per the conventions of [`Problem`].
    pub count: usize,
    /// Send buffer.
    pub send: *const u8,
    /// Send buffer length in bytes.
    pub send_len: usize,
    /// Receive buffer.
    pub recv: *mut u8,
    /// Receive buffer length in bytes.
    pub recv_len: usize,
    /// AllToAllV counts and displacements (elements).
    pub vcounts: Option<VCounts>,
}

// SAFETY: RawCall only carries addresses; the unsafe entry points that use
// it state the caller's obligations.
unsafe impl Send for RawCall {}

/// Where the engine reads a call's input: `send`, except for a Broadcast
/// without a separate send buffer (null, empty, or `recv` itself), whose
/// root's data is already in `recv`.
#[inline]
pub(crate) fn input_of(c: &RawCall) -> *mut u8 {
    let separate = !c.send.is_null() && c.send_len > 0;
    if matches!(c.coll, Collective::Broadcast { .. }) && !separate {
        c.recv
    } else {
        c.send as *mut u8
    }
}

impl Engine {
    /// Validates `c` against this communicator (its ranks, lengths, roots
    /// and peers) and turns it into an op.
    pub(crate) fn check(&self, c: &RawCall, opts: &Options) -> Result<OpCall> {
        let (n, r) = (self.nranks, self.rank);
        let name = c.coll.kind().name();
        if let Some(root) = c.coll.root() {
            if root >= n {
                return Err(Error::arg(format!(
                    "{name}: root {root} is out of range; this communicator has ranks 0..{n}"
                )));
            }
        }
        if let Collective::Send { peer } | Collective::Recv { peer } = c.coll {
            if peer >= n || peer == r {
                return Err(Error::arg(format!(
                    "{name}: peer {peer} is invalid on rank {r}; it must be another rank in 0..{n}"
                )));
            }
        }
        if let Some(w) = opts.wire {
            check_wire(c, w)?;
        }
        let esz = c.dtype.size();
        if c.count
            .checked_mul(esz)
            .and_then(|b| b.checked_mul(n))
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(Error::arg(format!(
                "{name}: count {} overflows the addressable size",
                c.count
            )));
        }
        if let Some(v) = &c.vcounts {
            for (what, xs) in [
                ("send_counts", &v.send_counts),
                ("send_displs", &v.send_displs),
                ("recv_counts", &v.recv_counts),
                ("recv_displs", &v.recv_displs),
            ] {
                if xs.len() != n {
                    return Err(Error::arg(format!(
                        "{name}: {what} has {} entries; it needs one per rank ({n})",
                        xs.len()
                    )));
                }
            }
            // End of every block in bytes, without overflow: the buffer
            // sizes below and the executor's offsets multiply by the element
            // size (with wrapping arithmetic in a release build, a huge
            // displacement would otherwise point before the buffer).
            let end_ok = |count: usize, displ: usize| {
                count
                    .checked_add(displ)
                    .and_then(|e| e.checked_mul(esz))
                    .is_some_and(|b| b <= isize::MAX as usize)
            };
            for q in 0..n {
                if !end_ok(v.send_counts[q], v.send_displs[q])
                    || !end_ok(v.recv_counts[q], v.recv_displs[q])
                {
                    return Err(Error::arg(format!(
                        "{name}: counts/displacements of rank {q} overflow the addressable size"
                    )));
                }
            }
            if v.send_counts[r] != v.recv_counts[r] {
                return Err(Error::arg(format!(
                    "{name}: rank {r} sends itself {} elements (send_counts[{r}]) but expects {} \
                     (recv_counts[{r}]); they must be equal",
                    v.send_counts[r], v.recv_counts[r]
                )));
            }
        } else if c.coll == Collective::AllToAllV {
            return Err(Error::arg("all_to_all_v needs counts and displacements"));
        }
        let p = Problem {
            coll: c.coll,
            nranks: n,
            rank: r,
            count: c.count,
            in_place: false,
            avg: false,
            vcounts: c.vcounts.clone(),
            chunks: 1,
            hosts: None,
            wire: None,
        };
        let (mut ie, oe) = buffer_sizes(&p);
        // Broadcast sends the root's `recv`. A root may pass its data in a
        // separate `send` instead (as NCCL's out-of-place broadcast does):
        // the schedule copies it into `recv` first, so it is an input of the
        // whole message. A null or empty `send` means the data is in `recv`.
        let bcast_send =
            matches!(c.coll, Collective::Broadcast { root } if root == r) && input_of(c) != c.recv;
        if bcast_send {
            ie = c.count;
        }
        let (ib, ob) = (ie * esz, oe * esz);
        let input_needed = bcast_send
            || !matches!(
                c.coll,
                Collective::Broadcast { .. } | Collective::Recv { .. } | Collective::Barrier
            );
        let rooted_out = matches!(
            c.coll,
            Collective::Reduce { .. } | Collective::Gather { .. }
        );
        let rooted_in = matches!(c.coll, Collective::Scatter { .. });
        let in_len_ok = if c.coll == Collective::AllToAllV {
            c.send_len >= ib
        } else {
            c.send_len == ib
        };
        let out_len_ok = if c.coll == Collective::AllToAllV {
            c.recv_len >= ob
        } else {
            c.recv_len == ob
        };
        if input_needed && !(rooted_in && ib == 0) && !in_len_ok {
            return Err(Error::arg(format!(
                "{name} on rank {r}: the send buffer has {} bytes but {} elements of {} ({} bytes) are needed{}",
                c.send_len,
                ie,
                c.dtype,
                ib,
                hint(c.coll, n)
            )));
        }
        let out_unused = c.coll == Collective::Barrier
            || matches!(c.coll, Collective::Send { .. })
            || (rooted_out && ob == 0);
        if !out_unused && !out_len_ok {
            return Err(Error::arg(format!(
                "{name} on rank {r}: the receive buffer has {} bytes but {} elements of {} ({} bytes) are needed{}",
                c.recv_len,
                oe,
                c.dtype,
                ob,
                hint(c.coll, n)
            )));
        }
        let in_place = c.coll == Collective::AllReduce && std::ptr::eq(c.send, c.recv);
        if !in_place && ib > 0 && ob > 0 && c.coll != Collective::AllGather {
            let (s, e) = (c.send as usize, c.send as usize + ib);
            let (rs, re) = (c.recv as usize, c.recv as usize + ob);
            if s < re && rs < e {
                return Err(Error::arg(format!(
                    "{name}: the send and receive buffers overlap; use separate buffers"
                )));
            }
        }
        Ok(OpCall {
            coll: c.coll,
            dtype: c.dtype,
            op: c.op,
            count: c.count,
            vcounts: c.vcounts.clone(),
            in_place,
            input: input_of(c),
            input_len: if input_needed { ib } else { 0 },
            output: c.recv,
            output_len: ob,
            algorithm: opts.algorithm,
            timeout: opts.timeout,
            wire: wire_of(opts.wire),
            background: false,
        })
    }
}

/// The rules of the `wire` option ([`Options::wire`]).
fn check_wire(c: &RawCall, w: DataType) -> Result<()> {
    let name = c.coll.kind().name();
    let why = if !matches!(w, DataType::Bf16 | DataType::F16) {
        format!("the wire type must be bf16 or f16, not {w}")
    } else if !c.coll.reduces() {
        "a wire type applies only to all_reduce, reduce_scatter and reduce".into()
    } else if c.dtype != DataType::F32 {
        format!(
            "a {w} wire carries f32 data, and this tensor is {}",
            c.dtype
        )
    } else if !matches!(c.op, ReduceOp::Sum | ReduceOp::Avg) {
        format!("a {w} wire reduces with sum or avg, not {}", c.op)
    } else {
        return Ok(());
    };
    Err(Error::arg(format!("{name} with wire={w}: {why}")))
}

fn hint(c: Collective, n: usize) -> String {
    match c {
        Collective::AllGather => {
            format!(" (AllGather's receive buffer holds size ({n}) x the send count)")
        }
        Collective::ReduceScatter => {
            format!(" (ReduceScatter's send buffer holds size ({n}) x the receive count)")
        }
        Collective::Gather { .. } => {
            format!(" (the root's receive buffer holds size ({n}) x the send count)")
        }
        Collective::Scatter { .. } => {
            format!(" (the root's send buffer holds size ({n}) x the receive count)")
        }
        Collective::AllReduce => {
            " (AllReduce's send and receive buffers have the same length)".into()
        }
        Collective::Broadcast { .. } => " (a root's separate send buffer holds the whole \
             message; an empty one means the data is in the receive buffer)"
            .into(),
        _ => String::new(),
    }
}
