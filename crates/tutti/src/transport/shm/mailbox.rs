//! Mailboxes: small collectives in one shot among the ranks of one segment.
//!
//! Every local rank owns `SLOTS` (64) slots in the segment. In its k-th
//! mailbox op a rank writes what it contributes (nothing, for a rank that
//! only receives) into slot `k % SLOTS`, then stores `k` in the slot's `seq` word (Release);
//! the ranks that need it wait for that word (Acquire) and read the payload
//! straight out of the slot. The 16-byte slot header shares its cache line
//! with the first 48 payload bytes, so a small payload arrives with the flag
//! that announces it: one cache-line transfer per peer, no ring head or
//! tail to move, no acknowledgement on the critical path.
//!
//! ```text
//!  rank r's mailbox:  [ seq | meta | payload ......... ]  slot 0  (ops 16, 32, ...)
//!                     [ seq | meta | payload ......... ]  slot 1  (ops 1, 17, ...)
//!                     ...                                 slots 2 to 15
//! ```
//!
//! `meta` holds the op's tag (collective, type, reduction, root) and count
//! as the writer sees them; every reader compares it with its own, so ranks
//! that call different collectives get [`Error::Mismatch`], not wrong data.
//!
//! **Reuse.** A rank may overwrite slot `k % SLOTS` for op k only when
//! every peer has finished op `k - SLOTS`, the slot's previous use. A peer
//! that has *started* op `k - SLOTS + 1` (its header for it is out) has
//! finished `k - SLOTS`, so the writer checks each peer's header for that
//! op. It usually knows already: it read a later header of that peer
//! (`seen`). Only ranks that read nobody for a while (a broadcast root, say)
//! look at the peers' lines. A writer can thus run up to `SLOTS - 1` ops
//! ahead of its readers (a root broadcasting in a loop does not wait for
//! each reader), and a reader's slot is never overwritten while it reads.
//! Headers a rank did not need are still checked against its own calls, as
//! soon as it reads a later header of the same peer.
//!
//! **Waiting** keeps the contract of every wait ([`transport::wait`]):
//! spin, then yield or sleep on the segment's futex doorbell, checking
//! abort, the deadline and the peers' liveness while asleep. A writer wakes
//! sleeping peers after publishing.

use super::{self as shm, Segment};
use crate::error::{Error, Result};
use crate::transport::wait::{Backoff, Ended, Watch};
use crate::transport::{self, sys, Link};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Payload bytes of one mailbox slot: the largest contribution a rank can
/// make to a mailbox op.
pub(crate) const MBOX_BYTES: usize = 32 << 10;
/// Slots per rank: how far a writer may run ahead of its readers, plus one.
/// Where ranks share cores, a rank that waits yields its core, and every
/// switch costs microseconds: the further a broadcast's root (or a reduce's
/// senders) may run ahead, the fewer switches per op. 4 ranks on 2 cores,
/// `bench/before_after.sh` of 64 against 16 slots (5 rounds, 8 B-4 KiB):
/// Broadcast 0.47-0.59 of the time, Reduce 0.44-0.81 to 8 KiB; AllReduce,
/// where every rank waits for every other, 0.89-1.10 (7 rounds). The
/// slots cost address space (64 x 32 KiB per rank); a small op touches
/// one line of its slot.
pub(crate) const SLOTS: usize = 64;
/// Polls of a peer's header before a receive takes the slow path (which
/// polls on, then yields or sleeps): as many as [`Backoff`] spins
/// before an oversubscribed rank yields.
const INLINE_POLLS: usize = 8;
/// How often a waiting mailbox op checks on its peers.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);
/// The most cache lines of a slot that the prefetches touch (2 KiB), but
/// see [`OWN_PREFETCH_LINES`].
const PREFETCH_LINES: usize = 32;
/// The most cache lines of its own next slot a writer claims when it knows
/// no peer still reads them (8 KiB; [`Mailbox::prefetch_own_next`]).
const OWN_PREFETCH_LINES: usize = 128;
/// Bytes of a slot's header (`seq`, `meta`).
const SLOT_HDR: usize = 16;
/// The payload bytes that [`PREFETCH_LINES`] cover after the header: what
/// [`Mailbox::prefetch_own_next`] claims of a slot at the least.
pub(crate) const PREFETCH_PAYLOAD: usize = PREFETCH_LINES * 64 - SLOT_HDR;
/// Bytes from one slot to the next: header and payload, rounded to 128 so
/// that no two slots share a cache line or an adjacent-line prefetch pair.
pub(crate) const SLOT_STRIDE: usize = (SLOT_HDR + MBOX_BYTES).div_ceil(128) * 128;

#[repr(C)]
struct SlotHdr {
    /// The mailbox op whose data the slot holds (0: none yet).
    seq: AtomicU64,
    /// The writer's view of the op: tag << 48 | count.
    meta: AtomicU64,
}

/// The slot (and `metas` entry) of op `s`.
#[inline]
fn slot_of(s: u64) -> usize {
    (s % SLOTS as u64) as usize
}

/// What identifies an op in a slot header: tag and element count.
pub(crate) fn meta(tag: u16, count: usize) -> u64 {
    (tag as u64) << 48 | (count as u64 & ((1 << 48) - 1))
}

/// One rank's view of its communicator's mailboxes.
pub(crate) struct Mailbox {
    /// Keeps the segment, and so every pointer below, mapped.
    _seg: Arc<Segment>,
    /// Every rank's slots (computed once: the hot path does no address
    /// arithmetic).
    slots: Vec<[*mut u8; SLOTS]>,
    /// Every rank's doorbell.
    bells: Vec<*const shm::Doorbell>,
    /// This rank (communicator numbering).
    me: usize,
    /// Mailbox ops this rank has started.
    seq: u64,
    /// Per rank, the last op whose header this rank has read and checked
    /// (`u64::MAX` for this rank).
    seen: Vec<u64>,
    /// The meta of this rank's last `SLOTS` ops (checked against late readers).
    metas: [u64; SLOTS],
    /// Published since the peers were last told (see [`Mailbox::flush`]).
    unflushed: bool,
    /// The current op writes its slot with non-temporal stores
    /// ([`crate::tune::Choice::stream`]).
    stream: bool,
    /// The CPU has `prefetchw` ([`Mailbox::prefetch_own_next`]).
    prefetchw: bool,
}

/// Whether the CPU has the `prefetchw` instruction (CPUID 0x8000_0001,
/// ECX bit 8; older CPUs may fault on it).
fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // The extended leaf is read only where the CPU reports it.
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// What a mailbox wait needs from its op: abort flag, deadline, spin
/// policy, and what to check about the peers while asleep.
pub(crate) struct Waiting<'a> {
    pub abort: &'a AtomicBool,
    pub timeout: Duration,
    pub spin: (Duration, bool),
    pub peer_pids: &'a [Option<i32>],
    pub links: &'a [Option<Link>],
    pub op_name: &'static str,
    /// The op's sequence number on the communicator (for errors).
    pub op_seq: u64,
    /// The collective number ring messages of this op would carry.
    pub coll_seq: u32,
    pub deadline: Option<Instant>,
}

// SAFETY: the raw pointers point into the segment, which the Arc keeps
// mapped for the Mailbox's whole life; all shared words are atomics, and
// payload bytes are handed over by the Release/Acquire protocol above.
unsafe impl Send for Mailbox {}

impl Mailbox {
    /// Mailboxes for a communicator whose every peer is a ring link on
    /// `seg`, where this rank (`me`) has local index `my_local`; `None` if
    /// some peer is not (TCP, or another segment) or there is no peer.
    pub(crate) fn new(
        links: &[Option<Link>],
        me: usize,
        seg: &Arc<Segment>,
        my_local: usize,
    ) -> Option<Self> {
        let n = links.len();
        if n < 2 || my_local >= seg.locals() {
            return None;
        }
        let mut local = vec![my_local; n];
        for (q, l) in links.iter().enumerate() {
            match l {
                None if q == me => {}
                Some(Link::Ring(r)) if Arc::ptr_eq(r.segment(), seg) => local[q] = r.peer_index(),
                _ => return None,
            }
        }
        let slots = local
            .iter()
            .map(|&i| std::array::from_fn(|k| seg.mbox_slot(i, k)))
            .collect();
        let bells = local
            .iter()
            .map(|&i| seg.bell(i) as *const shm::Doorbell)
            .collect();
        Some(Mailbox {
            _seg: seg.clone(),
            slots,
            bells,
            me,
            seq: 0,
            // This rank's own entry never holds anyone back.
            seen: (0..n).map(|q| if q == me { u64::MAX } else { 0 }).collect(),
            metas: [0; SLOTS],
            unflushed: false,
            stream: false,
            prefetchw: has_prefetchw(),
        })
    }

    #[inline]
    fn hdr(&self, r: usize, s: u64) -> &SlotHdr {
        // SAFETY: a slot starts with a SlotHdr (two atomics, valid when
        // zeroed), 128-aligned inside the segment, which `seg` keeps mapped.
        unsafe { &*(self.slots[r][slot_of(s)] as *const SlotHdr) }
    }

    #[inline]
    fn bell(&self, r: usize) -> &shm::Doorbell {
        // SAFETY: doorbells live in the segment, which `seg` keeps mapped.
        unsafe { &*self.bells[r] }
    }

    /// Rank `r`'s payload for op `s`.
    #[inline]
    pub(crate) fn payload(&self, r: usize, s: u64) -> *const u8 {
        // SAFETY: the payload follows the header inside the slot.
        unsafe { self.slots[r][slot_of(s)].add(SLOT_HDR) }
    }

    /// True if peer `q` has published op `s` (or a later one).
    #[inline]
    fn arrived(&self, q: usize, s: u64) -> bool {
        self.hdr(q, s).seq.load(Ordering::Acquire) >= s
    }

    /// Checks peer `q`'s header for op `s` (published) against ours. A slot
    /// that already holds a later op of `q` (it ran ahead of a rank that
    /// only reads) has nothing left to check.
    #[inline]
    fn check_meta(&mut self, q: usize, s: u64, w: &Waiting<'_>) -> Result<()> {
        let h = self.hdr(q, s);
        let theirs = h.meta.load(Ordering::Relaxed);
        let ours = self.metas[slot_of(s)];
        // The Acquire load of seq that found it published came first; this
        // re-load after reading meta tells whether meta was overwritten since
        // (the writer zeroes seq before it writes meta).
        fence(Ordering::Acquire);
        if theirs != ours && h.seq.load(Ordering::Relaxed) == s {
            let (tt, tc) = ((theirs >> 48) as u16, theirs & ((1 << 48) - 1));
            let (ot, oc) = ((ours >> 48) as u16, ours & ((1 << 48) - 1));
            let which = if s == self.seq {
                "this call".to_string()
            } else {
                format!("the call {} before this one", self.seq - s)
            };
            return Err(Error::Mismatch {
                rank: self.me,
                peer: q,
                seq: w.op_seq,
                msg: format!(
                    "in {which}, this rank runs {} with {oc} elements ({}), rank {q} runs {} with {tc} elements ({}); {}",
                    transport::tag_name(ot),
                    transport::describe_tag(ot),
                    transport::tag_name(tt),
                    transport::describe_tag(tt),
                    transport::SAME_CALLS,
                ),
            });
        }
        self.seen[q] = self.seen[q].max(s);
        Ok(())
    }

    /// The communicator's size and this rank.
    pub(crate) fn ranks(&self) -> (usize, usize) {
        (self.slots.len(), self.me)
    }

    /// Starts the next op: returns its number. With `stream`, the op's
    /// [`publish`](Mailbox::publish) writes the slot with non-temporal
    /// stores: the peers then read it from memory rather than from this
    /// core's cache, which pays where the cores lie far apart (see
    /// [`crate::tune::STREAM_MIN_BYTES`]).
    pub(crate) fn begin(&mut self, meta: u64, stream: bool) -> u64 {
        self.stream = stream;
        self.seq += 1;
        self.metas[slot_of(self.seq)] = meta;
        self.seq
    }

    /// Publishes this rank's part of op `s`: `len` bytes from `src` (none
    /// if `len` is 0), after making sure no peer still reads the slot.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes, `len <= MBOX_BYTES`.
    #[inline(always)]
    pub(crate) unsafe fn publish(
        &mut self,
        s: u64,
        src: *const u8,
        len: usize,
        w: &mut Waiting<'_>,
    ) -> Result<()> {
        debug_assert!(len <= MBOX_BYTES);
        let reused = SLOTS as u64 - 1;
        if s > reused && self.seen.iter().any(|&k| k < s - reused) {
            self.make_room(s, w)?;
        }
        let h = self.hdr(self.me, s);
        // Seqlock-style: a reader that loaded the old seq and then meta
        // sees, on re-loading seq, that the slot changed under it.
        h.seq.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        h.meta.store(self.metas[slot_of(s)], Ordering::Relaxed);
        if len > 0 {
            // A streamed copy ends with a store fence, so the payload is
            // visible before the seq store below.
            let dst = self.payload(self.me, s) as *mut u8;
            if self.stream {
                // SAFETY: the slot holds MBOX_BYTES >= len payload bytes, and
                // no peer reads it (checked above); src is valid (caller).
                unsafe { crate::reduce::copy::copy_stream(src, dst, len) };
            } else {
                // SAFETY: as for the streamed copy just above.
                unsafe { crate::reduce::copy::copy(src, dst, len) };
            }
        }
        h.seq.store(s, Ordering::Release);
        // The fence that pairs with a sleeper's announcement (see `flush`)
        // goes here, between the store and the look at `sleepers`: it waits
        // until the line has left this core, which it must do before any
        // peer can read it, while this rank would wait for the peers' parts
        // anyway. At the op's end, after the peers' data has arrived, it
        // stalled the next op instead (8 B AllReduce, 2 ranks: 0.14-0.15 us
        // against 0.15-0.16, and 0.44-0.48 against 0.49-0.51 in the
        // machine's slow state).
        fence(Ordering::SeqCst);
        self.unflushed = true;
        Ok(())
    }

    /// Before publishing op `s`: waits until every peer has started op
    /// `s - SLOTS + 1`, so that none still reads the slot's previous use.
    /// Only for `s >= SLOTS` (earlier ops use fresh slots).
    #[inline(never)]
    fn make_room(&mut self, s: u64, w: &mut Waiting<'_>) -> Result<()> {
        let reused = SLOTS as u64 - 1;
        for q in 0..self.slots.len() {
            if q != self.me && self.seen[q] < s - reused {
                // Look at the peer's newest possible call first: if it
                // has started it, no look is needed for SLOTS - 2 calls.
                if self.arrived(q, s - 1) {
                    self.check_meta(q, s - 1, w)?;
                } else {
                    self.wait_for(q, s - reused, w)?;
                }
            }
        }
        Ok(())
    }

    /// Wakes the peers that sleep waiting for what this rank published. Must
    /// run before this rank waits for long or returns from its op: a peer
    /// that went to sleep before our store was visible is woken only here.
    pub(crate) fn flush(&mut self) {
        if !std::mem::take(&mut self.unflushed) {
            return;
        }
        // The SeqCst fence in `publish`, after the store and before these
        // loads, pairs with the sleeper's SeqCst announcement in
        // `shm::sleep_on`: either it sees our seq, or we see it asleep.
        for q in 0..self.slots.len() {
            if q != self.me {
                shm::notify_fenced(self.bell(q));
            }
        }
    }

    /// Waits for peer `q`'s part of op `s` and checks that it is the same
    /// op; returns its payload.
    #[inline(always)]
    pub(crate) fn receive(&mut self, q: usize, s: u64, w: &mut Waiting<'_>) -> Result<*const u8> {
        // The common case inline: the header right after the last one read
        // from `q` arrives within a few polls and matches. (The first polls
        // of the slow path's waiting, without its bookkeeping between the
        // data's arrival and its use.)
        if self.seen[q] + 1 == s {
            let h = self.hdr(q, s);
            for _ in 0..INLINE_POLLS {
                if h.seq.load(Ordering::Acquire) >= s {
                    if h.meta.load(Ordering::Relaxed) == self.metas[slot_of(s)] {
                        self.seen[q] = s;
                        return Ok(self.payload(q, s));
                    }
                    break;
                }
                std::hint::spin_loop();
            }
        }
        if self.seen[q] < s {
            self.receive_slow(q, s, w)?;
        }
        Ok(self.payload(q, s))
    }

    /// Takes ownership of the lines this rank's next op will write (the
    /// header and `len` payload bytes, at most [`PREFETCH_LINES`]), so that
    /// the next [`publish`](Mailbox::publish) does not wait for them.
    ///
    /// For ops where some ranks only write and the others only read (a
    /// broadcast, a reduce): in a loop of them, the writer runs ahead, and
    /// each line crosses between the cores once per op. Where the two
    /// cores lie far apart (a round trip of 500-600 ns here), that crossing
    /// took most of an op: the writer's fence waited for its ownership of
    /// the line, the reader for the line to arrive. Started one op early,
    /// each side's transfer overlaps the rest of its op. Not for ops in
    /// which every rank writes and reads (AllReduce): there the writer's
    /// early claim meets the peer's read of its current line (2 ranks, 8 B
    /// AllReduce, 0.33-0.34 us against 0.30).
    ///
    /// Where this rank already knows that every peer is done with the
    /// slot's last use, it takes the whole of it, up to [`OWN_PREFETCH_LINES`];
    /// where it does not, a peer a whole round of slots behind may still be
    /// reading those lines, and it takes [`PREFETCH_LINES`], as it always
    /// did before. 2 ranks, `bench/before_after.sh` against 32 lines always
    /// (7 rounds): Broadcast and Reduce at 8 KiB 0.66 of the time, 4 KiB
    /// 0.91-0.93, 16 KiB 0.86-0.88; Gather 4-16 KiB 0.59-0.85. A scatter's
    /// root claims less (`engine/oneshot.rs`, `SCATTER_CLAIM`).
    #[inline(always)]
    pub(crate) fn prefetch_own_next(&self, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.prefetchw {
            let next = self.seq + 1;
            let mut lines = (SLOT_HDR + len).div_ceil(64).min(OWN_PREFETCH_LINES);
            if lines > PREFETCH_LINES
                && next >= SLOTS as u64
                && self.seen.iter().any(|&k| k < next + 1 - SLOTS as u64)
            {
                lines = PREFETCH_LINES;
            }
            let p = self.slots[self.me][slot_of(next)] as *const u8;
            for l in 0..lines {
                // SAFETY: the CPU has `prefetchw` (checked above), a hint
                // that never faults and changes no register or memory.
                unsafe {
                    std::arch::asm!("prefetchw [{p}]", p = in(reg) p.wrapping_add(l * 64),
                        options(nostack, preserves_flags, readonly))
                };
            }
        }
    }

    /// Starts loading the lines of peer `q`'s next op that this rank will
    /// read: its header and `len` payload bytes from `off` (at most
    /// [`PREFETCH_LINES`] in all); the reader's half of
    /// [`prefetch_own_next`](Mailbox::prefetch_own_next). A line the peer
    /// has not written yet is still in this core's cache from the slot's
    /// last use, so loading it early costs nothing.
    #[inline(always)]
    pub(crate) fn prefetch_peer_next(&self, q: usize, off: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let slot = self.slots[q][slot_of(self.seq + 1)] as *const i8;
            // SAFETY: a prefetch is a hint that never faults.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(slot) };
            let p = slot.wrapping_add(SLOT_HDR + off);
            for l in 0..len.div_ceil(64).min(PREFETCH_LINES - 1) {
                // SAFETY: a prefetch is a hint that never faults.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        p.wrapping_add(l * 64),
                    )
                };
            }
        }
    }

    /// [`receive`](Mailbox::receive) when it must wait, check skipped
    /// headers, or report a mismatch.
    #[inline(never)]
    fn receive_slow(&mut self, q: usize, s: u64, w: &mut Waiting<'_>) -> Result<()> {
        let skipped = self.seen[q] + 1..s;
        if self.arrived(q, s) {
            self.check_meta(q, s, w)?;
        } else {
            self.wait_for(q, s, w)?;
        }
        // Headers of `q` this rank did not need, those still in their
        // slots (`check_meta` skips any already reused).
        for k in skipped.rev().take(SLOTS - 1) {
            if self.arrived(q, k) {
                self.check_meta(q, k, w)?;
            }
        }
        Ok(())
    }

    /// Waits until `q` has published op `s`, then checks its header.
    fn wait_for(&mut self, q: usize, s: u64, w: &mut Waiting<'_>) -> Result<()> {
        let mut backoff = Backoff::new(w.spin);
        let mut watch = Watch::new(w.abort, w.timeout, LIVENESS_EVERY);
        loop {
            if self.arrived(q, s) {
                return self.check_meta(q, s, w);
            }
            if backoff.rounds() == 63 {
                // The peer may be asleep waiting for us.
                self.flush();
            }
            if backoff.keep_polling() {
                continue;
            }
            let checked = match watch.check(&mut w.deadline) {
                Ok(c) => c,
                Err(Ended::Aborted) => return Err(Error::Aborted),
                Err(Ended::Deadline) => {
                    let waiting_for = (0..self.slots.len())
                        .filter(|&p| p != self.me && !self.arrived(p, s))
                        .collect();
                    return Err(Error::Timeout {
                        op: w.op_name.to_string(),
                        seq: w.op_seq,
                        rank: self.me,
                        waiting_for,
                        after: w.timeout,
                    });
                }
            };
            if checked.liveness {
                self.check_peer(q, w)?;
            }
            // The mailboxes are the segment's: their waits sleep on the doorbell.
            shm::sleep_on(self.bell(self.me), checked.nap, || !self.arrived(q, s));
        }
    }

    /// While waiting for `q`: fails if any peer died or aborted (every
    /// rank takes part in a mailbox call, so the call cannot complete; as
    /// on the rings, the survivors get `PeerLost`), or if `q` sent a ring
    /// message of this very collective (it runs the op another way, so the
    /// ranks disagree on the call).
    fn check_peer(&self, q: usize, w: &Waiting<'_>) -> Result<()> {
        self.check_failed(w, true)?;
        if let Some(Some(Link::Ring(l))) = w.links.get(q) {
            if let Some(h) = l.peek_header() {
                if h.seq == w.coll_seq {
                    return Err(Error::Mismatch {
                        rank: self.me,
                        peer: q,
                        seq: w.op_seq,
                        msg: format!(
                            "this rank runs {} in one shot, rank {q} sent it a message of {} ({}); {}",
                            w.op_name,
                            transport::tag_name(h.tag),
                            transport::describe_tag(h.tag),
                            transport::SAME_CALLS,
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Fails with `PeerLost` if a peer announced a failure (its doorbell's
    /// abort flag) or, with `pids`, if its process is gone.
    fn check_failed(&self, w: &Waiting<'_>, pids: bool) -> Result<()> {
        for p in (0..self.slots.len()).filter(|&p| p != self.me) {
            let lost = |msg: String| Error::PeerLost {
                rank: self.me,
                peer: p,
                op: w.op_name.to_string(),
                seq: w.op_seq,
                msg,
            };
            let code = self.bell(p).aborted.load(Ordering::Relaxed);
            if code != 0 {
                return Err(lost(super::failure::describe(p, code)));
            }
            if let (true, Some(Some(pid))) = (pids, w.peer_pids.get(p)) {
                if !sys::process_alive(*pid) {
                    return Err(lost(format!("process {pid} is gone")));
                }
            }
        }
        Ok(())
    }

    /// At the start of a mailbox op: fails if a peer has failed, or if a
    /// peer's ring holds an unread message of an earlier collective, which
    /// this rank skipped (the ranks disagreed on a call, e.g. on a
    /// broadcast's root). Costs a load of each peer's doorbell and ring
    /// head, lines the peer writes only when it fails or sends.
    #[inline(always)]
    pub(crate) fn check_stale(&self, w: &Waiting<'_>) -> Result<()> {
        // The common case inline: no peer failed, no ring message waits.
        let failed = (0..self.bells.len())
            .any(|p| p != self.me && self.bell(p).aborted.load(Ordering::Relaxed) != 0);
        let waiting = w
            .links
            .iter()
            .any(|l| matches!(l, Some(Link::Ring(l)) if l.has_message()));
        if failed || waiting {
            self.check_stale_slow(w)
        } else {
            Ok(())
        }
    }

    /// [`check_stale`](Mailbox::check_stale) once something is amiss or a
    /// ring message waits: says which.
    #[inline(never)]
    fn check_stale_slow(&self, w: &Waiting<'_>) -> Result<()> {
        // A peer that failed may have published this call's data already:
        // fail now, as the rings would, rather than finish with it.
        self.check_failed(w, false)?;
        for (q, l) in w.links.iter().enumerate() {
            let Some(Link::Ring(l)) = l else { continue };
            let Some(h) = l.peek_header() else { continue };
            if h.seq != transport::P2P_SEQ && (h.seq.wrapping_sub(w.coll_seq) as i32) < 0 {
                return Err(Error::Mismatch {
                    rank: self.me,
                    peer: q,
                    seq: w.op_seq,
                    msg: format!(
                        "rank {q} sent a message of {} ({}, collective #{}) that this rank never received: the ranks disagreed on an earlier call; {}",
                        transport::tag_name(h.tag),
                        transport::describe_tag(h.tag),
                        h.seq,
                        transport::SAME_CALLS,
                    ),
                });
            }
        }
        Ok(())
    }

    /// For an op that is not a mailbox op, waiting on `q`: true if `q` is in
    /// a mailbox op this rank has not started, so it will never send what
    /// this rank waits for.
    pub(crate) fn peer_ahead(&self, q: usize) -> bool {
        q != self.me && self.arrived(q, self.seq + 1)
    }
}

#[cfg(test)]
mod tests {
    /// The CPUID check agrees with the kernel's reading of the same bit.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn prefetchw_detection_matches_the_kernel() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let flags = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .expect("a flags line");
        let kernel = flags.split_whitespace().any(|f| f == "3dnowprefetch");
        assert_eq!(super::has_prefetchw(), kernel, "{flags}");
    }
}
