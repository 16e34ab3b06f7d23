//! [`RingLink`]: one peer's pair of rings on one channel of the segment,
//! moving messages as the [module docs](super) describe.

use super::segment::{abort_wake, notify, Segment};
use crate::error::{Error, Result};
use crate::transport::{
    msg_flags, sys, Header, LinkOps, RecvMsg, SendMsg, StepCx, TransportKind, HEADER_BYTES,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long [`RingLink::withdraw`] waits for a receiver that is alive and
/// has claimed a direct message to finish reading it.
const WITHDRAW_WAIT: Duration = Duration::from_secs(60);

/// Flag in [`Header::flags`]: the payload is a direct-read descriptor.
const FLAG_DIRECT: u16 = 1;
/// Bytes of a direct-read descriptor (pid, address).
const DESC_BYTES: usize = 16;
/// Marks a withdrawn direct message in `RingCtl::claim`.
const REVOKED: u64 = 1 << 63;
/// The most a sender writes (or a receiver takes) before it publishes its
/// progress: an eighth of the ring (at least 4 KiB). Publishing only once
/// the ring was full (or drained) kept the two sides in lockstep where a
/// message was a multiple of the ring: the receiver waited for the whole
/// ring to be written, then the sender for the whole ring to be read.
/// 2 ranks, Broadcast of 1 MiB through a 512 KiB ring: 28-31 GB/s before
/// (43-52 GB/s at 960 KiB and 1088 KiB), 51-59 GB/s with pieces.
fn piece_bytes(cap: u64) -> usize {
    (cap as usize / 8).max(4096)
}

/// How a receiver reads a direct message from the sender's memory.
#[derive(Clone, Copy, Debug)]
pub(crate) enum DirectRead {
    /// Same address space: plain memory access.
    Memcpy,
    /// Another process: `process_vm_readv`.
    Cma,
}

/// One peer's pair of rings on one channel: ours to it and its to us.
pub(crate) struct RingLink {
    seg: Arc<Segment>,
    /// The channel (0: collectives; [`P2P_CHANNEL`]).
    chan: usize,
    me: usize,
    peer: usize,
    direct: DirectRead,
    /// Direct messages this side has sent (the `acked` target).
    direct_sent: u64,
    /// Messages sent and received on this link.
    sent_msgs: u32,
    recv_msgs: u32,
    /// Direct messages received on this link.
    direct_recvd: u64,
    /// The receiver's tail as this side last read it: at most the real
    /// one, so the free space it gives is never too much. The sender reads
    /// the real tail (a cache line the receiver writes) only when this
    /// does not leave room for what it is about to write: a small message
    /// then costs no cache-line transfer back from the receiver.
    tail_seen: u64,
    /// Our head, as we last stored it (we alone write it): read from here,
    /// not from the cache line the receiver polls.
    head_mine: u64,
}

impl RingLink {
    /// The link between local ranks `me` and `peer` on channel `chan`.
    pub(crate) fn on_channel(
        seg: Arc<Segment>,
        chan: usize,
        me: usize,
        peer: usize,
        direct: DirectRead,
    ) -> Self {
        // Where the ring stands (it may have carried an earlier link's
        // messages).
        let tail_seen = seg.ctl(chan, me, peer).tail.load(Ordering::Acquire);
        let head_mine = seg.ctl(chan, me, peer).head.load(Ordering::Acquire);
        RingLink {
            seg,
            chan,
            me,
            peer,
            direct,
            direct_sent: 0,
            sent_msgs: 0,
            recv_msgs: 0,
            direct_recvd: 0,
            tail_seen,
            head_mine,
        }
    }

    /// The segment this link's rings live in.
    pub(crate) fn segment(&self) -> &Arc<Segment> {
        &self.seg
    }

    /// The peer's local index in the segment.
    pub(crate) fn peer_index(&self) -> usize {
        self.peer
    }

    /// The ring bytes a message of `len` bytes (not read direct) takes:
    /// its header, and its payload padded to 16.
    pub(crate) fn footprint(len: usize) -> usize {
        HEADER_BYTES + len.div_ceil(16) * 16
    }

    /// Whether messages of `bytes` ring bytes in all ([`footprint`](Self::footprint))
    /// fit in the ring's free space now: then sends of them complete in
    /// one call each. Reads the receiver's tail only when the last one
    /// seen leaves too little room.
    pub(crate) fn has_room(&mut self, bytes: usize) -> bool {
        let cap = self.seg.layout.cap as u64;
        let need = bytes as u64;
        if cap.saturating_sub(self.head_mine - self.tail_seen) >= need {
            return true;
        }
        let ctl = self.seg.ctl(self.chan, self.me, self.peer);
        self.tail_seen = ctl.tail.load(Ordering::Acquire);
        cap.saturating_sub(self.head_mine - self.tail_seen) >= need
    }

    /// True if a message from the peer has arrived that this side has not
    /// started on (what [`peek_header`](Self::peek_header) would return).
    #[inline]
    pub(crate) fn has_message(&self) -> bool {
        let ctl = self.seg.ctl(self.chan, self.peer, self.me);
        let t = ctl.tail.load(Ordering::Relaxed);
        ctl.head.load(Ordering::Acquire) - t >= HEADER_BYTES as u64
    }

    /// The header of the next unread message from the peer, if one has
    /// arrived and this side has not started on it.
    pub(crate) fn peek_header(&self) -> Option<Header> {
        if !self.has_message() {
            return None;
        }
        let seg = &*self.seg;
        let cap = seg.layout.cap as u64;
        // This side alone moves the tail.
        let t = seg
            .ctl(self.chan, self.peer, self.me)
            .tail
            .load(Ordering::Relaxed);
        let mut hdr = Header::default();
        // SAFETY: 16 published bytes at t (16-aligned, not wrapping). Only
        // called between messages, where t is a message boundary.
        unsafe {
            std::ptr::copy_nonoverlapping(
                seg.data(self.chan, self.peer, self.me)
                    .add((t % cap) as usize),
                bytemuck::bytes_of_mut(&mut hdr).as_mut_ptr(),
                HEADER_BYTES,
            )
        };
        Some(hdr)
    }

    /// True if no unread byte from the peer is in the ring.
    pub(crate) fn inbound_empty(&self) -> bool {
        let ctl = self.seg.ctl(self.chan, self.peer, self.me);
        ctl.head.load(Ordering::Acquire) == ctl.tail.load(Ordering::Relaxed)
    }

    /// Pushes as much of `m` as the ring takes. Returns whether anything moved.
    pub(crate) fn send(&mut self, m: &mut SendMsg, cx: &StepCx) -> Result<bool> {
        let seg = &*self.seg;
        let cap = seg.layout.cap as u64;
        let ctl = seg.ctl(self.chan, self.me, self.peer);
        let data = seg.data(self.chan, self.me, self.peer);
        let head = self.head_mine;
        debug_assert_eq!(head, ctl.head.load(Ordering::Relaxed));
        // What this call would write at most: the header (and a direct
        // read's descriptor) if not yet out, and the rest of the payload
        // with its padding.
        let want = if m.header_sent {
            0
        } else {
            (HEADER_BYTES + DESC_BYTES) as u64
        } + (m.len.div_ceil(16) * 16 - m.sent) as u64;
        let mut tail = self.tail_seen;
        // `tail_seen` may lag far behind (a link made over a used ring):
        // saturating, a stale value only reads as a full ring, which is
        // read again (so `free` below is at most `cap`).
        if cap.saturating_sub(head - tail) < want.clamp(1, cap) {
            tail = ctl.tail.load(Ordering::Acquire);
            self.tail_seen = tail;
        }
        let free = cap - (head - tail);
        if let Some(target) = m.direct_target {
            // Waiting for the receiver to finish reading our buffer.
            if ctl.acked.load(Ordering::Acquire) >= target {
                m.done = true;
                return Ok(true);
            }
            return Ok(false);
        }
        let mut h = head;
        if !m.header_sent {
            let direct = m.len >= cx.direct_bytes && m.avail == m.len && m.len > 0;
            let need = HEADER_BYTES as u64 + if direct { DESC_BYTES as u64 } else { 0 };
            if free < need {
                return Ok(false);
            }
            let hdr = Header {
                seq: cx.coll_seq,
                tag: cx.tag,
                flags: msg_flags(self.sent_msgs) | if direct { FLAG_DIRECT } else { 0 },
                len: m.len as u64,
            };
            self.sent_msgs = self.sent_msgs.wrapping_add(1);
            // Header and descriptor are 16 bytes each and 16-aligned (cap and
            // every message are multiples of 16), so neither straddles the
            // ring's end; the descriptor may wrap, hence its own offset.
            // SAFETY: [h, h+need) is free space owned by the writer (free >= need).
            unsafe {
                let at = data.add((h % cap) as usize);
                std::ptr::copy_nonoverlapping(bytemuck::bytes_of(&hdr).as_ptr(), at, HEADER_BYTES);
                if direct {
                    let desc = [sys::pid() as u64, m.ptr as u64];
                    let dat = data.add(((h + HEADER_BYTES as u64) % cap) as usize);
                    std::ptr::copy_nonoverlapping(desc.as_ptr() as *const u8, dat, DESC_BYTES);
                }
            }
            h += need;
            m.header_sent = true;
            if direct {
                self.direct_sent += 1;
                m.direct_target = Some(self.direct_sent);
                m.sent = m.len;
                ctl.head.store(h, Ordering::Release);
                self.head_mine = h;
                notify(seg.bell(self.peer));
                return Ok(true);
            }
        }
        let padded = m.len.div_ceil(16) * 16;
        let piece = piece_bytes(cap);
        let mut published = head;
        loop {
            let free = cap - (h - tail);
            if m.sent < m.avail && free > 0 {
                let off = (h % cap) as usize;
                let contiguous = (cap as usize - off).min(free as usize);
                let k = (m.avail - m.sent).min(contiguous).min(piece);
                if h != published {
                    // The previous piece is out: a receiver that polls
                    // copies it while we write this one (one that sleeps is
                    // woken once, below: waking it per piece would switch
                    // a shared core back and forth).
                    ctl.head.store(h, Ordering::Release);
                    self.head_mine = h;
                    published = h;
                }
                // The streaming copy ends with a store fence: its bytes are
                // visible before the Release store of `head` publishes them.
                let copy: unsafe fn(*const u8, *mut u8, usize) = if cx.stream {
                    crate::reduce::copy::copy_stream
                } else {
                    crate::reduce::copy::copy
                };
                // SAFETY: [off, off+k) lies inside the ring and is free space
                // owned by the writer; m.ptr+sent..+k lies in the caller's
                // buffer, whose first `avail` bytes are ready to read.
                unsafe { copy(m.ptr.add(m.sent), data.add(off), k) };
                m.sent += k;
                h += k as u64;
                continue;
            }
            if m.sent == m.len {
                let pad = (padded - m.len) as u64;
                if free >= pad {
                    h += pad;
                    m.done = true;
                }
            }
            break;
        }
        if h != head {
            ctl.head.store(h, Ordering::Release);
            self.head_mine = h;
            notify(seg.bell(self.peer));
            return Ok(true);
        }
        Ok(m.done)
    }

    /// Takes as much of `m` as has arrived. Returns whether anything moved.
    pub(crate) fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        let seg = &*self.seg;
        let cap = seg.layout.cap as u64;
        let ctl = seg.ctl(self.chan, self.peer, self.me);
        let data = seg.data(self.chan, self.peer, self.me);
        let tail = ctl.tail.load(Ordering::Relaxed);
        let head = ctl.head.load(Ordering::Acquire);
        let mut t = tail;
        if !m.header_seen {
            if head - t < HEADER_BYTES as u64 {
                return Ok(false);
            }
            let mut hdr = Header::default();
            // SAFETY: 16 published bytes at t (16-aligned, not wrapping).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.add((t % cap) as usize),
                    bytemuck::bytes_of_mut(&mut hdr).as_mut_ptr(),
                    HEADER_BYTES,
                )
            };
            if m.var_len && hdr.flags & FLAG_DIRECT == 0 && hdr.len < m.len as u64 {
                // A shorter message where the receive takes one: its length
                // is the header's (checked against the rest below).
                m.len = hdr.len as usize;
            }
            cx.check_header(&hdr, m.len, self.peer, self.recv_msgs)?;
            if hdr.flags & FLAG_DIRECT != 0 {
                if m.limit < m.len {
                    // A direct message is read whole: not before all of it
                    // may be delivered.
                    return Ok(false);
                }
                if head - t < (HEADER_BYTES + DESC_BYTES) as u64 {
                    // Not taken yet: the header is read (and counted) again
                    // on the next call.
                    return Ok(false);
                }
                self.recv_msgs = self.recv_msgs.wrapping_add(1);
                let mut desc = [0u64; 2];
                // SAFETY: the descriptor was published with the header.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.add(((t + HEADER_BYTES as u64) % cap) as usize),
                        desc.as_mut_ptr() as *mut u8,
                        DESC_BYTES,
                    )
                };
                ctl.tail
                    .store(t + (HEADER_BYTES + DESC_BYTES) as u64, Ordering::Release);
                let k = self.direct_recvd + 1;
                if ctl
                    .claim
                    .compare_exchange(k - 1, k, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return Err(cx.lost(
                        self.peer,
                        format!(
                            "rank {} withdrew its buffer (it failed or aborted)",
                            self.peer
                        ),
                    ));
                }
                self.direct_recvd = k;
                let r = self.read_direct(m, cx, desc[0] as i32, desc[1]);
                // Done with the sender's buffer, whether the read worked or
                // not: a sender whose op failed waits for this in `withdraw`.
                ctl.acked.fetch_add(1, Ordering::Release);
                notify(seg.bell(self.peer));
                r?;
                return Ok(true);
            }
            self.recv_msgs = self.recv_msgs.wrapping_add(1);
            t += HEADER_BYTES as u64;
            m.header_seen = true;
        }
        let padded = m.len.div_ceil(16) * 16;
        let esz = cx.elem;
        let piece = piece_bytes(cap);
        let mut freed = tail;
        let end = m.len.min(m.limit);
        loop {
            let avail = head - t;
            if m.got < end && avail > 0 {
                let off = (t % cap) as usize;
                let contiguous = (cap as usize - off).min(avail as usize);
                let mut k = (end - m.got).min(contiguous).min(piece);
                if m.reduce_src.is_some() {
                    k -= k % esz;
                    if k == 0 {
                        break;
                    }
                }
                if t != freed {
                    // The previous piece is free again: a sender that polls
                    // refills it while we take this one (woken once, below,
                    // if it sleeps).
                    ctl.tail.store(t, Ordering::Release);
                    freed = t;
                }
                // SAFETY: [off, off+k) holds published bytes owned by the
                // reader; the destination range lies in the caller's buffer.
                unsafe { m.deliver(data.add(off), k, cx) };
                t += k as u64;
                continue;
            }
            if m.got == m.len {
                let pad = (padded - m.len) as u64;
                if head - t >= pad {
                    t += pad;
                    m.done = true;
                }
            }
            break;
        }
        if t != tail {
            ctl.tail.store(t, Ordering::Release);
            notify(seg.bell(self.peer));
            return Ok(true);
        }
        Ok(m.done)
    }

    /// Called when an op fails with `m` unfinished: makes sure the receiver
    /// will not read our buffer after we return. Either the message is
    /// withdrawn before the receiver claims it, or the receiver's read (which
    /// is under way: one copy of the message) is waited for, even if the
    /// receiver has failed or been aborted meanwhile (it does not stop a
    /// read it has begun), until it acknowledges the read or its process is
    /// gone; after [`WITHDRAW_WAIT`] (a receiver stopped mid-read, say) it
    /// gives up with an error in the log.
    pub(crate) fn withdraw(&self, m: &SendMsg, peer_pid: Option<i32>) {
        let Some(k) = m.direct_target else { return };
        if m.done {
            return;
        }
        let ctl = self.seg.ctl(self.chan, self.me, self.peer);
        if ctl
            .claim
            .compare_exchange(k - 1, REVOKED | k, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
        // The receiver claimed it: its read is under way, unless the
        // receiver died (then it reads nothing more). Its communicator
        // failing or being aborted does not end the read, so that is no
        // reason to stop waiting.
        let start = std::time::Instant::now();
        let mut checked = start;
        while ctl.acked.load(Ordering::Acquire) < k {
            if checked.elapsed() > Duration::from_millis(10) {
                checked = std::time::Instant::now();
                if peer_pid.is_some_and(|p| !sys::process_alive(p)) {
                    return;
                }
                if start.elapsed() > WITHDRAW_WAIT {
                    tracing::error!(
                        local_rank = self.me,
                        local_peer = self.peer,
                        "gave up waiting {:?} for the peer to finish reading a failed op's buffer",
                        WITHDRAW_WAIT
                    );
                    return;
                }
            }
            std::thread::yield_now();
        }
    }

    /// If the peer's communicator failed or was aborted: why (a
    /// [`failure`](super::failure) code).
    pub(crate) fn peer_failed(&self) -> Option<u32> {
        let c = self.seg.bell(self.peer).aborted.load(Ordering::Relaxed);
        (c != 0).then_some(c)
    }

    /// Tells the peers on this segment that this rank failed, and why.
    pub(crate) fn announce_failure(&self, why: &Error) {
        abort_wake(self.seg.bell(self.me), super::failure::code(why));
    }

    fn read_direct(&self, m: &mut RecvMsg, cx: &mut StepCx, pid: i32, addr: u64) -> Result<()> {
        match self.direct {
            DirectRead::Memcpy => {
                // SAFETY: the sender is a thread of this process and keeps its
                // buffer alive and unchanged until we bump `acked`.
                unsafe { m.deliver(addr as *const u8, m.len, cx) };
            }
            DirectRead::Cma => {
                let bounce = cx.bounce.len();
                while m.got < m.len {
                    let k = (m.len - m.got).min(bounce);
                    if m.reduce_src.is_none() {
                        // SAFETY: dst+got..+k lies in the caller's buffer.
                        unsafe { sys::process_read(pid, addr + m.got as u64, m.dst.add(m.got), k) }
                            .map_err(|e| cx.lost(self.peer, format!("process_vm_readv: {e}")))?;
                        m.got += k;
                    } else {
                        let b = cx.bounce.as_mut_ptr();
                        // SAFETY: the bounce buffer holds at least k bytes.
                        unsafe { sys::process_read(pid, addr + m.got as u64, b, k) }
                            .map_err(|e| cx.lost(self.peer, format!("process_vm_readv: {e}")))?;
                        // SAFETY: b..b+k was just filled; deliver writes to the
                        // caller's buffer. The bounce buffer is not aliased by dst.
                        unsafe { m.deliver(b, k, cx) };
                    }
                }
            }
        }
        m.done = true;
        Ok(())
    }
}

impl LinkOps for RingLink {
    #[inline]
    fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool> {
        RingLink::send(self, m, cx)
    }
    #[inline]
    fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        RingLink::recv(self, m, cx)
    }
    fn announce_failure(&self, why: &Error) {
        RingLink::announce_failure(self, why)
    }
    fn kind(&self) -> TransportKind {
        match self.direct {
            DirectRead::Memcpy => TransportKind::Local,
            DirectRead::Cma => TransportKind::Shm,
        }
    }
    #[inline]
    fn has_message(&self) -> bool {
        RingLink::has_message(self)
    }
    fn inbound_empty(&self) -> bool {
        RingLink::inbound_empty(self)
    }
    fn honours_limit(&self) -> bool {
        true
    }
    fn takes_var_len(&self) -> bool {
        true
    }
    fn withdraw(&self, m: &SendMsg, peer_pid: Option<i32>) {
        RingLink::withdraw(self, m, peer_pid)
    }
    fn peer_failed(&self) -> Option<u32> {
        RingLink::peer_failed(self)
    }
}
