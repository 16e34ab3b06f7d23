//! The step vocabulary: the buffers a schedule works on, places in them,
//! and the steps over their element ranges.

use std::ops::Range;

/// One of the buffers a schedule works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The user's send buffer.
    Input,
    /// The user's receive buffer (the same memory as `Input` when the op is in place).
    Output,
    /// Temporary space the executor provides, [`Schedule::scratch`](super::Schedule::scratch) elements long.
    Scratch,
    /// Staging for a 16-bit wire ([`wire`](super::wire)): elements of the
    /// wire type, [`Schedule::staging`](super::Schedule::staging) long.
    /// Only a lowered schedule uses it; its messages move only these.
    Wire,
}

/// A place in a buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Which buffer.
    pub buf: Buf,
    /// Offset in elements.
    pub off: usize,
}

impl Loc {
    /// `Input[off..]`.
    pub const fn input(off: usize) -> Self {
        Loc {
            buf: Buf::Input,
            off,
        }
    }
    /// `Output[off..]`.
    pub const fn output(off: usize) -> Self {
        Loc {
            buf: Buf::Output,
            off,
        }
    }
    /// `Scratch[off..]`.
    pub const fn scratch(off: usize) -> Self {
        Loc {
            buf: Buf::Scratch,
            off,
        }
    }
    /// `Wire[off..]`.
    pub const fn wire(off: usize) -> Self {
        Loc {
            buf: Buf::Wire,
            off,
        }
    }
}

/// One step of a schedule. Lengths are in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send `len` elements at `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// Where the data is.
        src: Loc,
        /// Elements.
        len: usize,
    },
    /// Receive `len` elements from `peer` into `dst`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the data goes.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Receive from `peer` and store `dst = src (op) received`.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// The local operand.
        src: Loc,
        /// Where the result goes (may equal `src`).
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// `RecvReduce` from `from`, then forward the result (`dst`) to `to` as it is produced.
    RecvReduceSend {
        /// Source rank.
        from: usize,
        /// Destination rank of the forwarded result.
        to: usize,
        /// The local operand.
        src: Loc,
        /// Where the result goes (may equal `src`).
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// `Recv` from `from` into `dst`, forwarding the data to `to` as it arrives.
    RecvCopySend {
        /// Source rank.
        from: usize,
        /// Destination rank.
        to: usize,
        /// Where the data goes.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Local copy.
    Copy {
        /// From.
        src: Loc,
        /// To.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Local reduction `dst = dst (op) src`.
    Reduce {
        /// Operand.
        src: Loc,
        /// Accumulator.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Divides each of `len` elements at `dst` by `divisor`, in place: how
    /// an Avg reduction ends (it reduces as Sum, then divides the result by
    /// the rank count; see [`frame`](super::frame)).
    Scale {
        /// The elements.
        dst: Loc,
        /// Elements.
        len: usize,
        /// What they are divided by.
        divisor: usize,
    },
    /// Narrows `len` data elements at `src` to the wire type, into `dst`
    /// (in [`Buf::Wire`]): how a value leaves for the wire
    /// ([`wire`](super::wire)).
    Narrow {
        /// The data elements.
        src: Loc,
        /// Where the wire elements go.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Widens `len` wire elements at `src` (in [`Buf::Wire`]) into data
    /// elements at `dst` (exact).
    Widen {
        /// The wire elements.
        src: Loc,
        /// Where the data elements go.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// `dst = src (op) widen(wire)`: a reducing receive's second half on a
    /// 16-bit wire, reducing in the data type.
    WidenReduce {
        /// The local operand (data elements).
        src: Loc,
        /// The received operand (wire elements, in [`Buf::Wire`]).
        wire: Loc,
        /// Where the result goes (may equal `src`).
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// `dst = widen(narrow(src))`, data elements to data elements (`dst`
    /// may equal `src`): a rank rounds its own copy of a value it sent
    /// narrowed, so that it holds what its peers received.
    Round {
        /// The data elements.
        src: Loc,
        /// Where the rounded elements go.
        dst: Loc,
        /// Elements.
        len: usize,
    },
    /// Orders everything: no later step starts before every earlier step is done.
    Fence,
}

impl Step {
    /// The peer this step receives from, if any.
    pub fn recv_peer(&self) -> Option<usize> {
        match *self {
            Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } => Some(peer),
            Step::RecvReduceSend { from, .. } | Step::RecvCopySend { from, .. } => Some(from),
            _ => None,
        }
    }

    /// The peer this step sends to, if any.
    pub fn send_peer(&self) -> Option<usize> {
        match *self {
            Step::Send { peer, .. } => Some(peer),
            Step::RecvReduceSend { to, .. } | Step::RecvCopySend { to, .. } => Some(to),
            _ => None,
        }
    }

    /// Elements this step moves or touches.
    pub fn len(&self) -> usize {
        match *self {
            Step::Send { len, .. }
            | Step::Recv { len, .. }
            | Step::RecvReduce { len, .. }
            | Step::RecvReduceSend { len, .. }
            | Step::RecvCopySend { len, .. }
            | Step::Copy { len, .. }
            | Step::Reduce { len, .. }
            | Step::Scale { len, .. }
            | Step::Narrow { len, .. }
            | Step::Widen { len, .. }
            | Step::WidenReduce { len, .. }
            | Step::Round { len, .. } => len,
            Step::Fence => 0,
        }
    }

    /// True if the step has no elements (a `Fence`, or a zero-length step).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if the step combines received data with local data.
    pub fn reduces(&self) -> bool {
        matches!(
            self,
            Step::RecvReduce { .. }
                | Step::RecvReduceSend { .. }
                | Step::Reduce { .. }
                | Step::WidenReduce { .. }
        )
    }

    /// Ranges the step reads (buffer, element range).
    pub fn reads(&self) -> Vec<(Buf, Range<usize>)> {
        let r = |l: Loc, n: usize| (l.buf, l.off..l.off + n);
        match *self {
            Step::Send { src, len, .. } => vec![r(src, len)],
            Step::RecvReduce { src, len, .. } | Step::RecvReduceSend { src, len, .. } => {
                vec![r(src, len)]
            }
            Step::Copy { src, len, .. }
            | Step::Narrow { src, len, .. }
            | Step::Widen { src, len, .. }
            | Step::Round { src, len, .. } => vec![r(src, len)],
            Step::WidenReduce { src, wire, len, .. } => vec![r(src, len), r(wire, len)],
            Step::Reduce { src, dst, len } => vec![r(src, len), r(dst, len)],
            Step::Scale { dst, len, .. } => vec![r(dst, len)],
            _ => vec![],
        }
    }

    /// Where the step writes (its `len` elements from there), if it writes.
    pub fn dst(&self) -> Option<Loc> {
        match *self {
            Step::Recv { dst, .. }
            | Step::RecvReduce { dst, .. }
            | Step::RecvReduceSend { dst, .. }
            | Step::RecvCopySend { dst, .. }
            | Step::Copy { dst, .. }
            | Step::Reduce { dst, .. }
            | Step::Scale { dst, .. }
            | Step::Narrow { dst, .. }
            | Step::Widen { dst, .. }
            | Step::WidenReduce { dst, .. }
            | Step::Round { dst, .. } => Some(dst),
            Step::Send { .. } | Step::Fence => None,
        }
    }

    /// True for the local steps that convert between the data type and a
    /// 16-bit wire type ([`wire`](super::wire)).
    pub fn converts(&self) -> bool {
        matches!(
            self,
            Step::Narrow { .. }
                | Step::Widen { .. }
                | Step::WidenReduce { .. }
                | Step::Round { .. }
        )
    }

    /// Where the step's message lies: the source of what it sends, else
    /// the destination of what it receives (`None` for a local step).
    pub fn message_loc(&self) -> Option<Loc> {
        match *self {
            Step::Send { src, .. } => Some(src),
            Step::Recv { dst, .. }
            | Step::RecvReduce { dst, .. }
            | Step::RecvReduceSend { dst, .. }
            | Step::RecvCopySend { dst, .. } => Some(dst),
            _ => None,
        }
    }

    /// Ranges the step writes.
    pub fn writes(&self) -> Vec<(Buf, Range<usize>)> {
        self.dst()
            .map(|d| (d.buf, d.off..d.off + self.len()))
            .into_iter()
            .collect()
    }
}
