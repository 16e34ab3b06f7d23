//! How a link cuts messages into frames, and what a receiver checks of
//! every frame header (the rules are in the [module docs](super)).

use crate::error::Error;
use crate::transport::{msg_flags, Header, StepCx, HEADER_BYTES, P2P_SEQ};
use std::io;
use std::time::Duration;

/// The most sockets a link may have.
pub(crate) const MAX_LANES: usize = crate::sizes::TCP_MAX_LANES;

/// Frames are at most this long when a link has several lanes.
pub(crate) const DEFAULT_CHUNK: usize = crate::sizes::TCP_DEFAULT_CHUNK;

/// The longest frame header: a message header and a frame offset.
pub(crate) const FRAME_HDR_MAX: usize = HEADER_BYTES + 8;

/// How a link cuts messages into frames: `lanes` sockets, frames of at most
/// `chunk` bytes (a power of two, at least 4 KiB, so that frames start on
/// element boundaries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Framing {
    pub lanes: usize,
    pub chunk: usize,
}

impl Framing {
    /// Frames of a message of `len` bytes (at least one, also for 0 bytes).
    #[inline]
    pub(crate) fn frames(&self, len: usize) -> usize {
        if self.lanes == 1 || len <= self.chunk {
            1
        } else {
            len.div_ceil(self.chunk)
        }
    }

    /// Offset and length of frame `j` of a message of `len` bytes.
    #[inline]
    pub(crate) fn frame(&self, len: usize, j: usize) -> (usize, usize) {
        if self.lanes == 1 || len <= self.chunk {
            (0, len)
        } else {
            let off = j * self.chunk;
            (off, self.chunk.min(len - off))
        }
    }

    /// Bytes of a frame header: the message header, plus the frame's
    /// offset when there are several lanes.
    #[inline]
    pub(crate) fn hdr_bytes(&self) -> usize {
        if self.lanes == 1 {
            HEADER_BYTES
        } else {
            FRAME_HDR_MAX
        }
    }
}

/// A liveness probe: a header with no message, which the receiver skips. It
/// gives the kernel unacknowledged data to time out on when the peer's host
/// has vanished without a word. Its sequence number and tag are reserved
/// values no message carries. (On a link with several lanes it is followed
/// by 8 zero bytes, the size of a frame offset.)
pub const NOP: Header = Header {
    seq: u32::MAX - 1,
    tag: u16::MAX,
    flags: 1,
    len: 0,
};

pub(super) fn nop_bytes() -> [u8; FRAME_HDR_MAX] {
    let mut b = [0u8; FRAME_HDR_MAX];
    b[..HEADER_BYTES].copy_from_slice(bytemuck::bytes_of(&NOP));
    b
}

/// Probe a peer that has been silent this long while we wait for it.
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(300);

/// What a receiver expects of every frame of the message it receives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    pub coll_seq: u32,
    pub tag: u16,
    pub len: usize,
    /// The message's number on the link.
    pub n: u32,
    /// The message may be shorter than `len` ([`RecvMsg::var_len`]): its
    /// header says how long (links of one lane only).
    ///
    /// [`RecvMsg::var_len`]: crate::transport::RecvMsg::var_len
    pub var_len: bool,
}

impl Expect {
    /// True if `h` is a frame of this message (the test of
    /// [`StepCx::check_header`], which explains a failure).
    #[inline]
    pub(crate) fn matches(&self, h: &Header) -> bool {
        h.flags & !1 == msg_flags(self.n)
            && h.tag == self.tag
            && (h.seq == self.coll_seq || h.seq == P2P_SEQ || self.coll_seq == P2P_SEQ)
            && (h.len == self.len as u64 || self.var_len && h.len < self.len as u64)
    }
}

/// Why receiving stopped.
#[derive(Debug)]
pub(crate) enum RxError {
    /// The connection failed.
    Io(io::Error),
    /// A frame header that does not belong to the expected message.
    Header(Header),
    /// A frame of the right message at an impossible offset.
    Frame(u64),
}

/// The error for a receive that stopped with `e`, on the message number `n`
/// of `len` bytes from `peer`.
pub(crate) fn rx_error(cx: &StepCx, e: RxError, len: usize, peer: usize, n: u32) -> Error {
    match e {
        RxError::Io(e) => cx.lost(peer, format!("TCP connection failed: {e}")),
        RxError::Header(h) => match cx.check_header(&h, len, peer, n) {
            Err(e) => e,
            Ok(()) => Error::Mismatch {
                rank: cx.rank,
                peer,
                seq: cx.seq,
                msg: format!("unexpected frame header from rank {peer}: {h:?}"),
            },
        },
        RxError::Frame(off) => Error::Mismatch {
            rank: cx.rank,
            peer,
            seq: cx.seq,
            msg: format!(
                "{} (op #{}): rank {peer} sent a frame at offset {off} of a {len}-byte message, which is off the frame grid, beyond the end or repeated (lost or repeated data)",
                cx.op_name, cx.seq
            ),
        },
    }
}

/// How far ahead of the expected message `n` a frame of a later message
/// may be (message numbers are 15 bits and wrap).
const MAX_AHEAD: u16 = 4096;

/// True if message number `got` (15 bits) is a little after `n`'s.
#[inline]
pub(super) fn is_ahead(got: u16, n: u32) -> bool {
    let d = got.wrapping_sub((n & 0x7fff) as u16) & 0x7fff;
    (1..MAX_AHEAD).contains(&d)
}

/// Where received payload goes.
pub(crate) trait Sink {
    /// Whether every `frame_start` is true and every `space` is `Some`: the
    /// sink never holds a frame back, so a header read may bring payload
    /// along ([`super::lanes::READ_AHEAD`]).
    const TAKES_ALL: bool = false;
    /// A frame of `flen` bytes at message offset `off` starts on `lane`;
    /// false if it cannot start now (no room), in which case it is offered
    /// again later.
    fn frame_start(&mut self, _lane: usize, _off: usize, _flen: usize) -> bool {
        true
    }
    /// Room for up to `want` payload bytes of lane `lane` that belong at
    /// message offset `off`: a pointer and how many bytes may be written
    /// there, or `None` when there is no room now.
    fn space(&mut self, lane: usize, off: usize, want: usize) -> Option<(*mut u8, usize)>;
    /// `k` bytes were written to the last space given for `lane`.
    fn commit(&mut self, lane: usize, off: usize, k: usize);
    /// The frame `lane` was receiving is complete.
    fn frame_done(&mut self, _lane: usize) {}
}

/// Which frames of a message have arrived.
#[derive(Default)]
pub(crate) struct FrameSet {
    bits: Vec<u64>,
    pub(super) frames: usize,
    count: usize,
    /// Frames 0..prefix have all arrived.
    prefix: usize,
}

impl FrameSet {
    /// Starts a message of `frames` frames (allocates only for a message
    /// with more frames than any before).
    #[inline]
    pub(crate) fn reset(&mut self, frames: usize) {
        let words = frames.div_ceil(64);
        if self.bits.len() < words {
            self.bits.resize(words, 0);
        }
        self.bits[..words].fill(0);
        self.frames = frames;
        self.count = 0;
        self.prefix = 0;
    }

    /// Whether frame `i` has arrived.
    #[inline]
    pub(crate) fn has(&self, i: usize) -> bool {
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Marks frame `i` as arrived.
    #[inline]
    pub(crate) fn set(&mut self, i: usize) {
        self.bits[i / 64] |= 1 << (i % 64);
        self.count += 1;
        while self.prefix < self.frames && self.has(self.prefix) {
            self.prefix += 1;
        }
    }

    /// True once every frame has arrived.
    #[inline]
    pub(crate) fn complete(&self) -> bool {
        self.count == self.frames
    }

    /// The first frame that has not arrived (`frames` when all have).
    #[inline]
    pub(crate) fn prefix(&self) -> usize {
        self.prefix
    }
}
