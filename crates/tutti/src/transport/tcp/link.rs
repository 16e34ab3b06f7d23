//! [`TcpLink`]: a link whose lanes the executor drives itself (the
//! inline mode).

use super::framing::{rx_error, Expect, Sink, MAX_LANES, PROBE_AFTER};
use super::lanes::{Direct, Lanes};
use crate::error::{Error, Result};
use crate::transport::{
    msg_flags, wait, Header, LinkOps, RecvMsg, SendMsg, StepCx, TransportKind, HEADER_BYTES,
};
use std::io;
use std::net::TcpStream;
use std::time::Instant;

/// Reads into the bounce buffer and reduces whole elements into the
/// destination, holding a partial element per lane for the next read.
struct Reducing<'a> {
    m: &'a RecvMsg,
    cx: &'a mut StepCx,
    carry: &'a mut [([u8; 8], usize); MAX_LANES],
}

impl Sink for Reducing<'_> {
    const TAKES_ALL: bool = true;
    fn space(&mut self, lane: usize, _off: usize, want: usize) -> Option<(*mut u8, usize)> {
        let (c, cl) = &self.carry[lane];
        self.cx.bounce[..*cl].copy_from_slice(&c[..*cl]);
        // Never read past this frame: `want` excludes the carried bytes.
        let room = want.min(self.cx.bounce.len() - cl);
        // SAFETY: cl < 8 <= bounce.len().
        Some((unsafe { self.cx.bounce.as_mut_ptr().add(*cl) }, room))
    }

    fn commit(&mut self, lane: usize, off: usize, k: usize) {
        let cl = self.carry[lane].1;
        let have = cl + k;
        let esz = self.cx.elem;
        let whole = have - have % esz;
        let b = self.cx.bounce.as_ptr();
        // SAFETY: the bounce buffer holds `whole` received bytes (a whole
        // number of elements) that belong at message offset off - cl, inside
        // the message; it does not overlap the destination.
        unsafe { self.m.deliver_at(off - cl, b, whole, self.cx) };
        let rest = have - whole;
        let (c, cl) = &mut self.carry[lane];
        c[..rest].copy_from_slice(&self.cx.bounce[whole..have]);
        *cl = rest;
    }
}

/// A link to one peer whose lanes the executor drives itself.
pub(crate) struct TcpLink {
    pub(super) lanes: Lanes,
    peer: usize,
    /// Header of the message being sent (`tx_active`).
    tx_hdr: [u8; HEADER_BYTES],
    tx_active: bool,
    /// Whether a message is being received.
    rx_active: bool,
    /// A partial element per lane, for reducing receives.
    carry: [([u8; 8], usize); MAX_LANES],
    /// Messages sent and received on this link.
    sent_msgs: u32,
    recv_msgs: u32,
    /// When bytes last arrived, and when we last probed.
    last_heard: Instant,
    last_probe: Instant,
}

impl TcpLink {
    /// The link's sockets.
    pub(crate) fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    /// Wraps connected sockets to `peer` (one per lane, in lane order).
    pub(crate) fn new(socks: Vec<TcpStream>, peer: usize, chunk: usize) -> Result<Self> {
        Ok(TcpLink {
            lanes: Lanes::new(socks, chunk)?,
            peer,
            tx_hdr: [0; HEADER_BYTES],
            tx_active: false,
            rx_active: false,
            carry: [([0; 8], 0); MAX_LANES],
            sent_msgs: 0,
            recv_msgs: 0,
            last_heard: Instant::now(),
            last_probe: Instant::now(),
        })
    }

    /// Gives up the sockets (to an I/O thread), before any message moved.
    pub(crate) fn into_lanes(self) -> Lanes {
        self.lanes
    }

    /// Closes the connection so that the peer notices at once.
    pub(crate) fn shutdown(&self) {
        self.lanes.shutdown();
    }

    fn broken(&self, cx: &StepCx, e: io::Error) -> Error {
        cx.lost(self.peer, format!("TCP connection failed: {e}"))
    }

    /// While we wait on a silent peer, sends a probe (between frames only)
    /// so that a vanished host shows within about a second (the probe goes
    /// unacknowledged: [`Lanes::host_silent`]) instead of after
    /// keepalive's two.
    pub(crate) fn probe(&mut self, cx: &StepCx) -> Result<()> {
        if self.last_heard.elapsed() >= PROBE_AFTER && self.last_probe.elapsed() >= PROBE_AFTER {
            self.last_probe = Instant::now();
            self.lanes.start_probe();
        }
        self.lanes.flush_probes().map_err(|e| self.broken(cx, e))
    }

    /// Adds to `out` the descriptors (and events) to wait on while `send`
    /// (the head outgoing message, if started) and the head incoming message
    /// (`recv`: whether there is one) cannot move.
    pub(crate) fn pollfds(&self, send: Option<&SendMsg>, recv: bool, out: &mut Vec<libc::pollfd>) {
        for i in 0..self.lanes.lanes.len() {
            // Before the head message has started, lane 0 (which every
            // message uses) stands for the link.
            let reading = if self.rx_active {
                self.lanes.rx_pending(i)
            } else {
                i == 0
            };
            let wants = match send {
                Some(m) if self.tx_active => self.lanes.tx_wants_write(i, m.len, m.avail),
                Some(_) => i == 0,
                None => self.lanes.nop_pending(i),
            };
            self.lanes.push_pollfd(i, recv && reading, wants, out);
        }
    }

    pub(crate) fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool> {
        if !self.tx_active {
            let h = Header {
                seq: cx.coll_seq,
                tag: cx.tag,
                flags: msg_flags(self.sent_msgs),
                len: m.len as u64,
            };
            self.sent_msgs = self.sent_msgs.wrapping_add(1);
            self.tx_hdr.copy_from_slice(bytemuck::bytes_of(&h));
            self.lanes.tx_start(m.len);
            self.tx_active = true;
            m.header_sent = true;
        }
        // SAFETY: ptr..ptr+avail lies in the sender's buffer, whose first
        // `avail` bytes are ready and stay untouched until the message is done.
        let moved = unsafe { self.lanes.tx(m.ptr, m.len, m.avail, &self.tx_hdr) }
            .map_err(|e| self.broken(cx, e))?;
        if self.lanes.tx_done() {
            m.sent = m.len;
            m.done = true;
            self.tx_active = false;
        }
        Ok(moved)
    }

    pub(crate) fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        if !self.rx_active {
            self.lanes.rx_start(m.len);
            self.rx_active = true;
            for c in &mut self.carry {
                c.1 = 0;
            }
        }
        let ex = Expect {
            coll_seq: cx.coll_seq,
            tag: cx.tag,
            len: m.len,
            n: self.recv_msgs,
            var_len: m.var_len,
        };
        let mut heard = false;
        let r = if m.reduce_src.is_none() {
            self.lanes.rx(&ex, &mut Direct { dst: m.dst }, &mut heard)
        } else {
            let mut sink = Reducing {
                m,
                cx: &mut *cx,
                carry: &mut self.carry,
            };
            self.lanes.rx(&ex, &mut sink, &mut heard)
        };
        if heard {
            self.last_heard = Instant::now();
        }
        let moved = r.map_err(|e| rx_error(cx, e, m.len, self.peer, self.recv_msgs))?;
        m.header_seen = true;
        m.len = self.lanes.rx_len();
        let carry = &self.carry;
        m.got = self.lanes.rx_prefix(m.len, |s| carry[s].1);
        if self.lanes.rx_done() {
            m.done = true;
            self.rx_active = false;
            self.recv_msgs = self.recv_msgs.wrapping_add(1);
        }
        Ok(moved)
    }
}

impl LinkOps for TcpLink {
    #[inline]
    fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool> {
        TcpLink::send(self, m, cx)
    }
    #[inline]
    fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        TcpLink::recv(self, m, cx)
    }
    fn announce_failure(&self, _why: &crate::error::Error) {
        self.shutdown()
    }
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }
    fn probe(&mut self, cx: &StepCx) -> Result<()> {
        TcpLink::probe(self, cx)
    }
    fn sleep(&self) -> wait::Sleep {
        wait::Sleep::Poll
    }
    fn pollfds(&self, send: Option<&SendMsg>, recv: bool, out: &mut Vec<libc::pollfd>) {
        TcpLink::pollfds(self, send, recv, out)
    }
    fn host_silent(&self) -> Option<String> {
        self.lanes.host_silent()
    }
    fn takes_var_len(&self) -> bool {
        self.lanes.lanes.len() == 1
    }
}
