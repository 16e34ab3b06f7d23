//! [`IoLink`]: the executor's side of a link served by an I/O thread.

use super::super::framing::{rx_error, FrameSet, Framing, RxError, MAX_LANES};
use super::{align16, Failure, IoSet, Port, DESC_BYTES};
use crate::error::{Error, Result};
use crate::transport::{
    msg_flags, Header, LinkOps, RecvMsg, SendMsg, StepCx, TransportKind, HEADER_BYTES,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The executor's side of a link served by an I/O thread.
pub(crate) struct IoLink {
    set: Arc<IoSet>,
    idx: usize,
    peer: usize,
    framing: Framing,
    sent_msgs: u32,
    recv_msgs: u32,
    tx_posted: bool,
    tx_count: u64,
    tx_avail: usize,
    rx_posted: bool,
    rx_count: u64,
    /// Reducing receives: the frames reduced so far, the frame each lane's
    /// ring is in (offset, length, bytes reduced), and where each ring has
    /// been consumed to.
    rx_frames: FrameSet,
    cur: [Option<(usize, usize, usize)>; MAX_LANES],
    pos: [usize; MAX_LANES],
    dead: bool,
}

impl IoLink {
    pub(super) fn new(set: Arc<IoSet>, idx: usize) -> IoLink {
        let p = &set.shared.ports[idx];
        let (peer, framing) = (p.peer, p.framing);
        IoLink {
            set,
            idx,
            peer,
            framing,
            sent_msgs: 0,
            recv_msgs: 0,
            tx_posted: false,
            tx_count: 0,
            tx_avail: 0,
            rx_posted: false,
            rx_count: 0,
            rx_frames: FrameSet::default(),
            cur: [None; MAX_LANES],
            pos: [0; MAX_LANES],
            dead: false,
        }
    }

    fn port(&self) -> &Port {
        &self.set.shared.ports[self.idx]
    }

    /// The error for a failed port.
    fn failure(&self, cx: &StepCx, len: usize) -> Error {
        let f = self
            .port()
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match f {
            Some(Failure::Header(h)) => {
                rx_error(cx, RxError::Header(h), len, self.peer, self.recv_msgs)
            }
            Some(Failure::Frame(off)) => {
                rx_error(cx, RxError::Frame(off), len, self.peer, self.recv_msgs)
            }
            Some(Failure::Io(e)) => cx.lost(self.peer, format!("TCP connection failed: {e}")),
            Some(Failure::Reset) | None => cx.lost(
                self.peer,
                "TCP link unusable: an earlier op failed in the middle of a message".into(),
            ),
        }
    }

    fn failed(&self) -> bool {
        self.dead || self.port().failed.load(Ordering::Acquire)
    }

    /// Closes the connection so that the peer notices at once.
    pub(crate) fn shutdown(&self) {
        for s in &self.port().socks {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub(crate) fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool> {
        let sh = &self.set.shared;
        let p = &sh.ports[self.idx];
        if !self.tx_posted {
            if self.failed() {
                return Err(self.failure(cx, m.len));
            }
            let h = Header {
                seq: cx.coll_seq,
                tag: cx.tag,
                flags: msg_flags(self.sent_msgs),
                len: m.len as u64,
            };
            self.sent_msgs = self.sent_msgs.wrapping_add(1);
            let hb: [u8; HEADER_BYTES] = bytemuck::cast(h);
            p.tx.hdr[0].store(
                u64::from_le_bytes(hb[..8].try_into().expect("8")),
                Ordering::Relaxed,
            );
            p.tx.hdr[1].store(
                u64::from_le_bytes(hb[8..].try_into().expect("8")),
                Ordering::Relaxed,
            );
            p.tx.ptr.store(m.ptr as usize, Ordering::Relaxed);
            p.tx.len.store(m.len, Ordering::Relaxed);
            p.tx.avail.store(m.avail, Ordering::Relaxed);
            self.tx_count += 1;
            p.tx.posted.store(self.tx_count, Ordering::Release);
            self.tx_posted = true;
            self.tx_avail = m.avail;
            m.header_sent = true;
            sh.kick();
            return Ok(true);
        }
        let mut moved = false;
        if m.avail != self.tx_avail {
            p.tx.avail.store(m.avail, Ordering::Release);
            self.tx_avail = m.avail;
            sh.kick();
            moved = true;
        }
        if p.tx.done.load(Ordering::Acquire) == self.tx_count {
            m.sent = m.len;
            m.done = true;
            self.tx_posted = false;
            return Ok(true);
        }
        if self.failed() {
            return Err(self.failure(cx, m.len));
        }
        Ok(moved)
    }

    pub(crate) fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        let sh = &self.set.shared;
        let p = &sh.ports[self.idx];
        if !self.rx_posted {
            if self.failed() {
                return Err(self.failure(cx, m.len));
            }
            p.rx.dst.store(m.dst as usize, Ordering::Relaxed);
            p.rx.len.store(m.len, Ordering::Relaxed);
            p.rx.reduce.store(m.reduce_src.is_some(), Ordering::Relaxed);
            p.rx.coll_seq.store(cx.coll_seq, Ordering::Relaxed);
            p.rx.tag.store(cx.tag as u32, Ordering::Relaxed);
            p.rx.n.store(self.recv_msgs, Ordering::Relaxed);
            p.rx.got.store(0, Ordering::Relaxed);
            self.rx_count += 1;
            p.rx.posted.store(self.rx_count, Ordering::Release);
            self.rx_posted = true;
            self.rx_frames.reset(self.framing.frames(m.len));
            m.header_seen = true;
            sh.kick();
            return Ok(true);
        }
        let mut moved = false;
        let done = if m.reduce_src.is_none() {
            let got = p.rx.got.load(Ordering::Acquire);
            if got != m.got {
                m.got = got;
                moved = true;
            }
            p.rx.done.load(Ordering::Acquire) == self.rx_count
        } else {
            moved = self.consume(m, cx);
            // The I/O thread must be done with the job too (an empty
            // message is consumed before its header has even arrived), so
            // that the slot is free for the next one.
            self.rx_frames.complete()
                && self.port().rx.done.load(Ordering::Acquire) == self.rx_count
        };
        if done {
            m.got = m.len;
            m.done = true;
            self.rx_posted = false;
            self.recv_msgs = self.recv_msgs.wrapping_add(1);
            return Ok(true);
        }
        if self.failed() {
            return Err(self.failure(cx, m.len));
        }
        Ok(moved)
    }

    /// Reduces what the staging rings hold of the message.
    fn consume(&mut self, m: &mut RecvMsg, cx: &StepCx) -> bool {
        let sh = &self.set.shared;
        let p = &sh.ports[self.idx];
        let chunk = self.framing.chunk;
        let mut moved = false;
        for s in 0..self.framing.lanes {
            let st = &p.stages[s];
            loop {
                if self.rx_frames.complete() {
                    break;
                }
                let head = st.head.load(Ordering::Acquire);
                let (off, flen, done) = match self.cur[s] {
                    Some(c) => c,
                    None => {
                        if head < self.pos[s] + DESC_BYTES {
                            break;
                        }
                        let mut d = [0u8; DESC_BYTES];
                        // SAFETY: the descriptor is below `head` (published
                        // with Release, loaded with Acquire), 16-aligned in a
                        // ring whose size is a multiple of 16.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                st.buf.add(self.pos[s] % st.cap),
                                d.as_mut_ptr(),
                                DESC_BYTES,
                            )
                        };
                        self.pos[s] += DESC_BYTES;
                        let off = u64::from_le_bytes(d[..8].try_into().expect("8")) as usize;
                        let flen = u64::from_le_bytes(d[8..].try_into().expect("8")) as usize;
                        self.cur[s] = Some((off, flen, 0));
                        moved = true;
                        (off, flen, 0)
                    }
                };
                if done < flen {
                    let have = head.saturating_sub(self.pos[s]).min(flen - done);
                    let whole = have - have % cx.elem;
                    if whole == 0 {
                        break;
                    }
                    let at = self.pos[s] % st.cap;
                    let first = whole.min(st.cap - at);
                    // [pos, pos + whole) of the ring holds received bytes
                    // (below `head`), whole elements at element-aligned ring
                    // offsets (payloads start 16-aligned, the ring's size is a
                    // multiple of 16), in at most two pieces around the wrap;
                    // the I/O thread checked the frame lies inside the message.
                    // SAFETY: so both reads stay within published ring bytes.
                    unsafe {
                        m.deliver_at(off + done, st.buf.add(at), first, cx);
                        if whole > first {
                            m.deliver_at(off + done + first, st.buf, whole - first, cx);
                        }
                    }
                    self.pos[s] += whole;
                    self.cur[s] = Some((off, flen, done + whole));
                    moved = true;
                    if done + whole < flen {
                        st.tail.store(self.pos[s], Ordering::Release);
                        sh.kick();
                        break;
                    }
                }
                // The frame is complete; the next one in this ring starts aligned.
                self.pos[s] = align16(self.pos[s]);
                st.tail.store(self.pos[s], Ordering::Release);
                sh.kick();
                self.cur[s] = None;
                self.rx_frames.set(off / chunk);
                moved = true;
            }
        }
        let p0 = self.rx_frames.prefix();
        m.got = if self.rx_frames.complete() {
            m.len
        } else {
            let (off, _) = self.framing.frame(m.len, p0);
            let partial = self
                .cur
                .iter()
                .take(self.framing.lanes)
                .flatten()
                .find(|c| c.0 == off)
                .map_or(0, |c| c.2);
            off + partial
        };
        moved
    }

    /// After a failed op: makes sure the I/O thread no longer touches the
    /// op's buffers. The link refuses later messages.
    pub(crate) fn quiesce(&mut self) {
        if !self.tx_posted && !self.rx_posted {
            return;
        }
        self.tx_posted = false;
        self.rx_posted = false;
        self.dead = true;
        let sh = &self.set.shared;
        let p = &sh.ports[self.idx];
        let c = p.cancel.fetch_add(1, Ordering::SeqCst) + 1;
        sh.kick();
        let start = Instant::now();
        let mut spins = 0u32;
        while p.cancel_ack.load(Ordering::Acquire) < c {
            spins += 1;
            if spins < 100 {
                std::thread::yield_now();
                continue;
            }
            if self.set.thread_gone() {
                break;
            }
            if start.elapsed() > Duration::from_secs(10) {
                tracing::error!(
                    "tutti: the TCP I/O thread did not release a failed op's buffers within 10 s"
                );
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl LinkOps for IoLink {
    #[inline]
    fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool> {
        IoLink::send(self, m, cx)
    }
    #[inline]
    fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        IoLink::recv(self, m, cx)
    }
    fn announce_failure(&self, _why: &crate::error::Error) {
        self.shutdown()
    }
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }
    // The I/O thread probes by itself and rings the doorbell after it
    // moved something: the defaults.
    fn quiesce(&mut self) {
        IoLink::quiesce(self)
    }
}
