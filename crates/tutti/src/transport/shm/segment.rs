//! The shared segment: its layout, the per-rank [`Doorbell`]s, and how a
//! rank sleeps on its doorbell and is woken ([`notify`], [`sleep_on`]).
//! The layout is drawn in the [module docs](super).

use super::super::sys;
use crate::error::{Error, Result};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A per-rank wake-up word.
#[repr(C)]
pub(crate) struct Doorbell {
    /// Bumped by notifiers when somebody sleeps; the futex word.
    seq: AtomicU32,
    /// Number of threads of this rank that are, or are about to be, asleep.
    sleepers: AtomicU32,
    /// Set when the owning rank's communicator fails or is aborted: why,
    /// as a [`failure`](super::failure) code (0 while it is healthy).
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
pub(super) struct RingCtl {
    pub(super) head: CachePadded<AtomicU64>,
    pub(super) tail: CachePadded<AtomicU64>,
    pub(super) acked: CachePadded<AtomicU64>,
    /// The number of the last direct message the receiver has started to
    /// read, or `REVOKED | k` once the sender withdrew message k (it
    /// failed before the read began). Changed only by compare-and-swap.
    pub(super) claim: CachePadded<AtomicU64>,
}

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
    pub(super) layout: Layout,
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
    #[inline]
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

    #[inline]
    pub(super) fn ctl(&self, chan: usize, from: usize, to: usize) -> &RingCtl {
        let i = self.ring(chan, from, to);
        // SAFETY: the RingCtl array lies at `ctls` with CHANNELS*locals*locals
        // entries, and `ring` checked i is one of them.
        unsafe { &*(self.base.add(self.layout.ctls) as *const RingCtl).add(i) }
    }

    #[inline]
    pub(super) fn data(&self, chan: usize, from: usize, to: usize) -> *mut u8 {
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

/// Marks a rank failed (`code`: why, a [`failure`](super::failure) code;
/// the first reason stays) and wakes its sleepers.
pub(crate) fn abort_wake(bell: &Doorbell, code: u32) {
    let _ = bell
        .aborted
        .compare_exchange(0, code.max(1), Ordering::SeqCst, Ordering::SeqCst);
    bell.seq.fetch_add(1, Ordering::SeqCst);
    sys::futex_wake_all(&bell.seq);
}
