//! Shared-memory rings: the `shm` transport (processes on one host) and, over
//! a heap segment instead of a shared file, the `local` transport (threads of
//! one process).
//!
//! # Segment layout
//!
//! One segment per host (or per process for `local`) holds, for L local
//! ranks:
//!
//! ```text
//! [ SegHeader | Doorbell x L | RingCtl x C*L*L | ring data x C*L*L (cap bytes
//!   each) | mailbox slots x L*16 ]
//! ```
//!
//! The mailboxes carry small collectives in one shot (see
//! [`mailbox`](super::mailbox)); the rings carry everything else, on
//! [`CHANNELS`] independent channels: channel 0 for collectives (in issue
//! order), channel [`P2P_CHANNEL`] for point-to-point messages, so that a
//! send or receive never waits behind a collective's bytes or the reverse.
//!
//! Ring (c, i, j) carries bytes of channel c from local rank i to local
//! rank j. Its
//! `RingCtl` holds three cache-padded counters: `head` (bytes ever written,
//! stored only by i), `tail` (bytes ever consumed, stored only by j) and
//! `acked` (direct-read messages j has finished, stored only by j).
//!
//! # Messages
//!
//! Every message starts with a 16-byte [`Header`]; its payload follows and is
//! padded to 16 bytes, so every message starts 16-aligned and no element
//! straddles the ring's wrap point. A large message whose bytes are all ready
//! is sent *direct*: the header is followed by the sender's pid and buffer
//! address, the receiver copies (or reduces) straight from the sender's
//! memory — `memcpy` for threads, `process_vm_readv` for processes — and
//! bumps `acked`. Each byte then crosses memory once instead of twice.
//! Before reading, the receiver claims the message (`claim`); a sender that
//! fails first withdraws it instead, so a buffer is never read after its
//! owner has given up on the op (and may have freed it).
//!
//! A copied message moves in pieces of an eighth of the ring: the sender
//! publishes `head` after each piece it writes and the receiver `tail`
//! after each piece it takes, so the two copy at the same time.
//!
//! # Waiting
//!
//! A rank with nothing to do spins briefly, then sleeps on the futex in its
//! [`Doorbell`]. Whoever changes a counter the sleeper may be waiting for
//! calls [`notify`]: a SeqCst fence, then a wake only if the doorbell says
//! somebody sleeps. The sleeper announces itself, re-checks its work, and
//! only then sleeps on the sequence number it read, so no wake-up is lost.

use super::sys;
use super::{msg_flags, Header, RecvMsg, SendMsg, StepCx, HEADER_BYTES};
use crate::error::{Error, Result};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long [`RingLink::withdraw`] waits for a receiver that is alive and
/// has claimed a direct message to finish reading it.
const WITHDRAW_WAIT: Duration = Duration::from_secs(60);

/// Flag in [`Header::flags`]: the payload is a direct-read descriptor.
const FLAG_DIRECT: u16 = 1;
/// Bytes of a direct-read descriptor (pid, address).
const DESC_BYTES: usize = 16;

/// A per-rank wake-up word.
#[repr(C)]
pub(crate) struct Doorbell {
    /// Bumped by notifiers when somebody sleeps; the futex word.
    seq: AtomicU32,
    /// Number of threads of this rank that are, or are about to be, asleep.
    sleepers: AtomicU32,
    /// Set when the owning rank's communicator is aborted.
    pub(crate) aborted: AtomicU32,
}

impl Doorbell {
    /// A doorbell outside any segment (in the heap of one process).
    pub(crate) fn new() -> Doorbell {
        Doorbell {
            seq: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            aborted: AtomicU32::new(0),
        }
    }
}

#[repr(C)]
struct RingCtl {
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
    acked: CachePadded<AtomicU64>,
    /// The number of the last direct message the receiver has started to
    /// read, or [`REVOKED`] | k once the sender withdrew message k (it
    /// failed before the read began). Changed only by compare-and-swap.
    claim: CachePadded<AtomicU64>,
}

/// Marks a withdrawn direct message in `RingCtl::claim`.
const REVOKED: u64 = 1 << 63;

#[repr(C)]
struct SegHeader {
    magic: AtomicU64,
    locals: AtomicU64,
    cap: AtomicU64,
}

const MAGIC: u64 = 0x7475_7474_6973_6d32; // "tuttism2"

/// Independent sets of rings in a segment (see the module docs).
pub(crate) const CHANNELS: usize = 2;
/// The channel of point-to-point messages ([`crate::p2p`]).
pub(crate) const P2P_CHANNEL: usize = 1;

/// Sizes and offsets of the parts of a segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) locals: usize,
    pub(crate) cap: usize,
    bells: usize,
    ctls: usize,
    data: usize,
    mbox: usize,
    pub(crate) total: usize,
}

impl Layout {
    pub(crate) fn new(locals: usize, cap: usize) -> Self {
        assert!(cap.is_power_of_two() && cap >= 4096);
        let pad = |x: usize| x.div_ceil(128) * 128;
        let bells = pad(std::mem::size_of::<SegHeader>());
        let ctls = bells + pad(locals * std::mem::size_of::<CachePadded<Doorbell>>());
        let rings = CHANNELS * locals * locals;
        let data = pad(ctls + rings * std::mem::size_of::<RingCtl>()).div_ceil(4096) * 4096;
        let mbox = data + rings * cap;
        let total = mbox + locals * super::mailbox::SLOTS * super::mailbox::SLOT_STRIDE;
        Layout {
            locals,
            cap,
            bells,
            ctls,
            data,
            mbox,
            total,
        }
    }
}

/// Where a segment's memory comes from.
enum Backing {
    /// Heap memory, for ranks that are threads of one process.
    Heap(std::alloc::Layout),
    /// A shared mapping of a file in /dev/shm.
    Mmap,
}

/// A mapped segment. Shared by the links that use it; unmapped on drop.
pub(crate) struct Segment {
    base: *mut u8,
    layout: Layout,
    backing: Backing,
}

// SAFETY: the segment is plain memory accessed only through atomics (the
// counters) or under the ring protocol (each data byte is owned by exactly one
// side at a time, handed over by Release/Acquire on head/tail).
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// A zeroed heap segment for `locals` thread-ranks.
    pub(crate) fn heap(locals: usize, cap: usize) -> Arc<Segment> {
        let layout = Layout::new(locals, cap);
        let al = std::alloc::Layout::from_size_align(layout.total, 4096).expect("segment layout");
        // SAFETY: the layout has non-zero size (at least one header page).
        let base = unsafe { std::alloc::alloc_zeroed(al) };
        assert!(
            !base.is_null(),
            "out of memory allocating a {} byte segment",
            layout.total
        );
        let seg = Segment {
            base,
            layout,
            backing: Backing::Heap(al),
        };
        seg.init();
        Arc::new(seg)
    }

    /// Maps the shared file `fd` (already sized to `layout.total`).
    pub(crate) fn map(fd: i32, layout: Layout, create: bool) -> Result<Arc<Segment>> {
        // SAFETY: mapping a file we own with a length it has; the kernel
        // picks the address. The result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(
                "mmap of the shared-memory segment",
                std::io::Error::last_os_error(),
            ));
        }
        let seg = Segment {
            base: p as *mut u8,
            layout,
            backing: Backing::Mmap,
        };
        if create {
            seg.init();
        } else {
            let h = seg.header();
            if h.magic.load(Ordering::Acquire) != MAGIC
                || h.locals.load(Ordering::Relaxed) as usize != layout.locals
                || h.cap.load(Ordering::Relaxed) as usize != layout.cap
            {
                return Err(Error::Config(
                    "shared-memory segment has an unexpected layout: are all ranks running the same tutti version?".into(),
                ));
            }
        }
        Ok(Arc::new(seg))
    }

    fn init(&self) {
        let h = self.header();
        h.locals.store(self.layout.locals as u64, Ordering::Relaxed);
        h.cap.store(self.layout.cap as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: the segment starts with a SegHeader (Layout puts it at 0);
        // the memory is zero-initialised or initialised by `init`, and all
        // fields are atomics.
        unsafe { &*(self.base as *const SegHeader) }
    }

    /// Local rank `i`'s doorbell.
    pub(crate) fn bell(&self, i: usize) -> &Doorbell {
        assert!(i < self.layout.locals);
        // SAFETY: the doorbell array lies at `bells` with `locals` padded
        // entries inside the mapping; atomics are valid when zeroed.
        unsafe { &*(self.base.add(self.layout.bells) as *const CachePadded<Doorbell>).add(i) }
    }

    /// The index of ring (chan, from, to) among the segment's rings.
    #[inline]
    fn ring(&self, chan: usize, from: usize, to: usize) -> usize {
        let l = self.layout.locals;
        assert!(chan < CHANNELS && from < l && to < l);
        (chan * l + from) * l + to
    }

    fn ctl(&self, chan: usize, from: usize, to: usize) -> &RingCtl {
        let i = self.ring(chan, from, to);
        // SAFETY: the RingCtl array lies at `ctls` with CHANNELS*locals*locals
        // entries, and `ring` checked i is one of them.
        unsafe { &*(self.base.add(self.layout.ctls) as *const RingCtl).add(i) }
    }

    fn data(&self, chan: usize, from: usize, to: usize) -> *mut u8 {
        let i = self.ring(chan, from, to);
        // SAFETY: ring data lies at `data`, cap bytes per ring, all inside
        // the mapping of `total` bytes (`ring` checked the index).
        unsafe { self.base.add(self.layout.data + i * self.layout.cap) }
    }
}

impl Segment {
    /// Slot `k` (< `mailbox::SLOTS`) of local rank `i`'s mailbox: a slot
    /// header followed by `mailbox::MBOX_BYTES` of payload, 128-byte aligned.
    pub(crate) fn mbox_slot(&self, i: usize, k: usize) -> *mut u8 {
        use super::mailbox::SLOTS;
        assert!(i < self.layout.locals && k < SLOTS);
        // SAFETY: the mailboxes lie at `mbox`, two SLOT_STRIDE slots per
        // local rank, all inside the mapping of `total` bytes.
        unsafe {
            self.base
                .add(self.layout.mbox + (SLOTS * i + k) * super::mailbox::SLOT_STRIDE)
        }
    }

    /// The number of local ranks the segment was made for.
    pub(crate) fn locals(&self) -> usize {
        self.layout.locals
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated in `heap` with exactly this layout.
            Backing::Heap(al) => unsafe { std::alloc::dealloc(self.base, al) },
            // SAFETY: mapped in `map` with this length; no reference into the
            // segment outlives it (links hold an Arc<Segment>).
            Backing::Mmap => unsafe {
                libc::munmap(self.base as *mut libc::c_void, self.layout.total);
            },
        }
    }
}

/// Wakes the owner of `bell` if it sleeps.
#[inline]
pub(crate) fn notify(bell: &Doorbell) {
    fence(Ordering::SeqCst);
    if bell.sleepers.load(Ordering::Relaxed) != 0 {
        bell.seq.fetch_add(1, Ordering::SeqCst);
        sys::futex_wake_all(&bell.seq);
    }
}

/// [`notify`] for a caller that has just issued a SeqCst fence itself
/// (one fence, then several doorbells).
#[inline]
pub(crate) fn notify_fenced(bell: &Doorbell) {
    if bell.sleepers.load(Ordering::Relaxed) != 0 {
        bell.seq.fetch_add(1, Ordering::SeqCst);
        sys::futex_wake_all(&bell.seq);
    }
}

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
}

impl RingLink {
    /// The collectives' link between local ranks `me` and `peer`.
    pub(crate) fn new(seg: Arc<Segment>, me: usize, peer: usize, direct: DirectRead) -> Self {
        Self::on_channel(seg, 0, me, peer, direct)
    }

    /// The link between local ranks `me` and `peer` on channel `chan`.
    pub(crate) fn on_channel(
        seg: Arc<Segment>,
        chan: usize,
        me: usize,
        peer: usize,
        direct: DirectRead,
    ) -> Self {
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
        let head = ctl.head.load(Ordering::Relaxed);
        let tail = ctl.tail.load(Ordering::Acquire);
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

    /// True if the peer's communicator failed or was aborted.
    pub(crate) fn peer_failed(&self) -> bool {
        self.seg.bell(self.peer).aborted.load(Ordering::Relaxed) != 0
    }

    /// Tells the peers on this segment that this rank failed.
    pub(crate) fn announce_failure(&self) {
        abort_wake(self.seg.bell(self.me));
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

/// Sleeps on `bell` until notified or `timeout` passes, unless `still_idle`
/// (re-run after announcing ourselves) finds work.
pub(crate) fn sleep_on(bell: &Doorbell, timeout: Duration, still_idle: impl FnOnce() -> bool) {
    bell.sleepers.fetch_add(1, Ordering::SeqCst);
    // Pairs with the fence in `notify`: either the waker sees us among the
    // sleepers, or `still_idle` sees what the waker published. The SeqCst
    // increment alone orders only `sleepers`, not the Acquire loads
    // `still_idle` makes of other words (on x86 the locked add is a full
    // barrier anyway; on AArch64 it need not be).
    fence(Ordering::SeqCst);
    let s = bell.seq.load(Ordering::SeqCst);
    if still_idle() && bell.aborted.load(Ordering::Relaxed) == 0 {
        sys::futex_wait(&bell.seq, s, timeout);
    }
    bell.sleepers.fetch_sub(1, Ordering::SeqCst);
}

/// Marks a rank aborted and wakes its sleepers.
pub(crate) fn abort_wake(bell: &Doorbell) {
    bell.aborted.store(1, Ordering::SeqCst);
    bell.seq.fetch_add(1, Ordering::SeqCst);
    sys::futex_wake_all(&bell.seq);
}
