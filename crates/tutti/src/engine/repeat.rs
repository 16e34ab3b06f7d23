//! The mailbox repeat path: a blocking call that repeats the last one that
//! ran through the mailboxes, in all but its buffers, skips the call's
//! checks ([`Engine::check`](super::Engine::check)) and the tuner ([`Engine::run_raw`](super::Engine::run_raw)).

use super::call::{input_of, Options, RawCall};
use super::{recorder, Core, OpCall};
use crate::algo::{Algorithm, Collective};
use crate::reduce::{DataType, ReduceOp};
use std::time::Duration;

/// A checked call that ran through the mailboxes, less its buffers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Repeat {
    coll: Collective,
    dtype: DataType,
    op: ReduceOp,
    count: usize,
    send_len: usize,
    recv_len: usize,
    in_place: bool,
    input_len: usize,
    output_len: usize,
    algorithm: Option<Algorithm>,
    timeout: Option<Duration>,
    /// What the flight recorder keeps of each repeat.
    pub(super) rec: recorder::Rec,
}

impl Repeat {
    pub(super) fn new(c: &RawCall, opts: &Options, call: &OpCall) -> Repeat {
        Repeat {
            coll: c.coll,
            dtype: c.dtype,
            op: c.op,
            count: c.count,
            send_len: c.send_len,
            recv_len: c.recv_len,
            in_place: call.in_place,
            input_len: call.input_len,
            output_len: call.output_len,
            algorithm: opts.algorithm,
            timeout: opts.timeout,
            rec: recorder::Rec {
                algorithm: Algorithm::Direct.name(),
                ..Core::record_of(call, 0)
            },
        }
    }

    /// The op for `c` if it repeats this call in all but its buffers and its
    /// buffers pass the call's checks (`None`: check it in full).
    #[inline]
    pub(super) fn of(&self, c: &RawCall, opts: &Options) -> Option<OpCall> {
        let in_place = c.coll == Collective::AllReduce && std::ptr::eq(c.send, c.recv);
        let same = c.coll == self.coll
            && c.dtype == self.dtype
            && c.op == self.op
            && c.count == self.count
            && c.send_len == self.send_len
            && c.recv_len == self.recv_len
            && c.vcounts.is_none()
            && in_place == self.in_place
            && opts.algorithm == self.algorithm
            && opts.timeout == self.timeout
            && opts.wire.is_none();
        // The check's overlap rule: input and output bytes are the
        // checked lengths (input_len is 0 exactly where no input is read).
        let overlap = !in_place
            && self.input_len > 0
            && self.output_len > 0
            && c.coll != Collective::AllGather
            && (c.send as usize) < c.recv as usize + self.output_len
            && (c.recv as usize) < c.send as usize + self.input_len;
        (same && !overlap).then_some(OpCall {
            coll: c.coll,
            dtype: c.dtype,
            op: c.op,
            count: c.count,
            vcounts: None,
            in_place,
            input: input_of(c),
            input_len: self.input_len,
            output: c.recv,
            output_len: self.output_len,
            algorithm: opts.algorithm,
            timeout: opts.timeout,
            wire: None,
            background: false,
        })
    }
}
