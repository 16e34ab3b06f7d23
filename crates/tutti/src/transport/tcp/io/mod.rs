//! TCP with a dedicated I/O thread per connection set (one per
//! communicator): the thread does every socket system call of the set's
//! links, so that the executor reduces received data while more moves.
//!
//! # Hand-off
//!
//! Each link has a [`Port`] shared by the executor and the I/O thread: one
//! slot per direction (the executor moves one message per direction and
//! peer at a time), made of atomics, so nothing is allocated per message or
//! per frame. The executor fills a slot and bumps its `posted` count; the
//! I/O thread takes the job, moves its frames with the same lane machinery
//! as the inline link ([`Lanes`]) and bumps `done`.
//!
//! * Sends are written straight from the user's buffer; a fused step's
//!   growing `avail` is published as an atomic.
//! * Plain receives are read straight into the destination; the I/O thread
//!   publishes how much of it has arrived (`got`).
//! * Reducing receives are read into a staging ring per lane (1 MiB each,
//!   single producer, single consumer): each frame as a 16-byte descriptor
//!   (its offset and length in the message) and its payload. The executor
//!   reduces out of the rings into the destination, frame by frame, while
//!   the I/O thread reads on; the next frame is handed over only when the
//!   executor has freed the room. Every frame starts 16-aligned in its
//!   ring, so no descriptor or element straddles the wrap point. Both sides
//!   are done with a message only when the executor has reduced every frame
//!   and the I/O thread has finished the job, so a slot is never refilled
//!   before the thread has taken the previous job.
//!
//! # Waiting
//!
//! The I/O thread spins briefly when idle, then sleeps in `poll()` on the
//! sockets it waits for and an eventfd. The executor's events (a post, more
//! `avail`, ring space, a cancel, stop) bump a counter and write the eventfd
//! only if the thread says it sleeps; the thread announces itself, then
//! re-reads the counter before sleeping, so no wake-up is lost. In the other
//! direction the I/O thread rings the executor's [`Doorbell`] (the
//! shared-memory one if the rank has one), which wakes the executor only
//! when it sleeps there.
//!
//! # Failures
//!
//! A failed connection or a frame header of the wrong message is recorded
//! in the port and reported by the executor's next `send`/`recv` on that
//! link, as the inline link would. After a failed op the executor cancels
//! the ports it used and waits for the thread's acknowledgement, so that no
//! buffer is touched after the op returns; a cancelled port refuses further
//! messages (its byte stream is no longer in step with the peer's).
//! Liveness probes are sent by the I/O thread when a peer it waits for has
//! been silent.
//!
//! # Files
//!
//! This file holds what the two sides share (the [`IoSet`], its ports and
//! staging rings); `thread.rs` the I/O thread; `link.rs` the executor's
//! side of a link ([`IoLink`]).

mod link;
mod thread;

pub(crate) use link::IoLink;

use super::{Framing, TcpLink};
use crate::error::{Error, Result};
use crate::transport::shm::{Doorbell, Segment};
use crate::transport::Header;
use crossbeam_utils::CachePadded;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use thread::{io_thread, Side};

/// Bytes of each lane's staging ring for reducing receives (a power of two).
const STAGE_BYTES: usize = 1 << 20;

/// How long the I/O thread sleeps in `poll()` at most.
const MAX_NAP: Duration = Duration::from_millis(50);

/// The doorbell the executor sleeps on, which the I/O thread rings.
pub(crate) enum Bell {
    /// The set's own (a rank without shared-memory links).
    Own(Box<CachePadded<Doorbell>>),
    /// The rank's doorbell in its host's shared segment.
    Seg(Arc<Segment>, usize),
}

impl Bell {
    /// The doorbell.
    pub(crate) fn get(&self) -> &Doorbell {
        match self {
            Bell::Own(b) => b,
            Bell::Seg(s, i) => s.bell(*i),
        }
    }
}

/// A single-producer (I/O thread), single-consumer (executor) byte ring.
struct Stage {
    buf: *mut u8,
    cap: usize,
    /// Bytes ever written (plus alignment padding), stored by the I/O thread.
    head: CachePadded<AtomicUsize>,
    /// Bytes ever consumed (plus padding), stored by the executor.
    tail: CachePadded<AtomicUsize>,
}

// The ring's bytes are handed over by the head/tail protocol: the I/O
// thread writes only [head, tail + cap) and publishes with a Release store
// of `head`; the executor reads only [tail, head) after an Acquire load of
// `head` and frees it with a Release store of `tail`.
// SAFETY: by that protocol no byte is accessed by both threads at once.
unsafe impl Send for Stage {}
// SAFETY: as above.
unsafe impl Sync for Stage {}

impl Stage {
    fn new(cap: usize) -> Stage {
        let b: Box<[u8]> = vec![0u8; cap].into_boxed_slice();
        Stage {
            buf: Box::into_raw(b) as *mut u8,
            cap,
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // SAFETY: `buf` came from Box::into_raw of a boxed slice of `cap`
        // bytes in `new`, and is freed only here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.buf, self.cap)) });
    }
}

#[inline]
fn align16(x: usize) -> usize {
    (x + 15) & !15
}

/// Bytes of a frame descriptor in a staging ring.
const DESC_BYTES: usize = 16;

/// An outgoing message slot. The fields are written by the executor before
/// the Release increment of `posted` and read by the I/O thread after an
/// Acquire load of it.
#[derive(Default)]
struct TxSlot {
    posted: AtomicU64,
    done: AtomicU64,
    ptr: AtomicUsize,
    len: AtomicUsize,
    /// Bytes ready to send (grows during a fused step).
    avail: AtomicUsize,
    hdr: [AtomicU64; 2],
}

/// An incoming message slot (same protocol as [`TxSlot`]).
#[derive(Default)]
struct RxSlot {
    posted: AtomicU64,
    done: AtomicU64,
    dst: AtomicUsize,
    len: AtomicUsize,
    reduce: AtomicBool,
    coll_seq: AtomicU32,
    tag: AtomicU32,
    n: AtomicU32,
    /// Plain receives: bytes delivered from the start (Release by the I/O thread).
    got: AtomicUsize,
}

/// Why a port stopped.
#[derive(Clone, Debug)]
enum Failure {
    Io(String),
    Header(Header),
    Frame(u64),
    Reset,
}

/// What the executor and the I/O thread share about one link.
struct Port {
    peer: usize,
    framing: Framing,
    /// Duplicates of the lanes' sockets, to shut them down from the executor.
    socks: Vec<TcpStream>,
    tx: CachePadded<TxSlot>,
    rx: CachePadded<RxSlot>,
    /// One staging ring per lane (reducing receives).
    stages: Vec<Stage>,
    failed: AtomicBool,
    failure: Mutex<Option<Failure>>,
    cancel: AtomicU64,
    cancel_ack: AtomicU64,
}

impl Port {
    fn fail(&self, f: Failure) {
        let mut g = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(f);
        }
        self.failed.store(true, Ordering::Release);
    }
}

/// Everything the I/O thread shares with the executors' links.
struct Shared {
    ports: Vec<Port>,
    /// Bumped by the executor after every event the I/O thread may wait for.
    kick: CachePadded<AtomicU64>,
    /// Set while the I/O thread is (about to be) asleep in `poll()`.
    sleeping: CachePadded<AtomicU32>,
    stop: AtomicBool,
    /// Whether the thread closes the links gracefully when it stops (the
    /// communicator ended healthy; see `tcp::close_gracefully`).
    graceful: AtomicBool,
    /// Wakes the I/O thread from `poll()`.
    wake: OwnedFd,
    bell: Bell,
    /// How long to spin before sleeping, and whether to yield meanwhile.
    spin: (Duration, bool),
}

impl Shared {
    /// Tells the I/O thread that something changed.
    #[inline]
    fn kick(&self) {
        self.kick.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) != 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writing 8 bytes from a live buffer to our eventfd.
            unsafe {
                libc::write(
                    self.wake.as_raw_fd(),
                    one.as_ptr() as *const libc::c_void,
                    8,
                )
            };
        }
    }
}

/// A connection set's I/O thread; stopped and joined when dropped.
pub(crate) struct IoSet {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl IoSet {
    /// Moves `links` (peer, inline link) to a new I/O thread and returns
    /// the set and the executor's side of each link, in the same order.
    /// `spin`: how long the thread polls before sleeping, and whether it
    /// yields the core meanwhile.
    pub(crate) fn start(
        links: Vec<(usize, TcpLink)>,
        bell: Bell,
        spin: (Duration, bool),
    ) -> Result<(Arc<IoSet>, Vec<IoLink>)> {
        // SAFETY: eventfd with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io(
                "creating the TCP I/O thread's eventfd",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut ports = Vec::with_capacity(links.len());
        let mut sides = Vec::with_capacity(links.len());
        for (peer, link) in links {
            let lanes = link.into_lanes();
            let socks = lanes
                .lanes
                .iter()
                .map(|l| l.sock.try_clone())
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| Error::io("duplicating a TCP socket", e))?;
            ports.push(Port {
                peer,
                framing: lanes.framing,
                socks,
                tx: Default::default(),
                rx: Default::default(),
                stages: (0..lanes.framing.lanes)
                    .map(|_| Stage::new(STAGE_BYTES))
                    .collect(),
                failed: AtomicBool::new(false),
                failure: Mutex::new(None),
                cancel: AtomicU64::new(0),
                cancel_ack: AtomicU64::new(0),
            });
            sides.push(Side::new(lanes));
        }
        let shared = Arc::new(Shared {
            ports,
            kick: Default::default(),
            sleeping: Default::default(),
            stop: AtomicBool::new(false),
            graceful: AtomicBool::new(false),
            wake,
            bell,
            spin,
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tutti-tcp-io".into())
            .spawn(move || io_thread(&sh, sides))
            .map_err(|e| Error::io("starting the TCP I/O thread", e))?;
        let set = Arc::new(IoSet {
            shared,
            thread: Mutex::new(Some(thread)),
        });
        let links = (0..set.shared.ports.len())
            .map(|i| IoLink::new(set.clone(), i))
            .collect();
        Ok((set, links))
    }

    /// The doorbell the executor sleeps on.
    pub(crate) fn bell(&self) -> &Doorbell {
        self.shared.bell.get()
    }

    /// Whether the I/O thread, when it stops, lets the peers take what is
    /// still queued to them before the sockets close
    /// (`tcp::close_gracefully`): for a communicator that ended healthy.
    pub(crate) fn close_gracefully_on_stop(&self, yes: bool) {
        self.shared.graceful.store(yes, Ordering::Release);
    }

    fn thread_gone(&self) -> bool {
        self.thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|h| h.is_finished())
    }
}

impl Drop for IoSet {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kick();
        let h = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

/// Creates the set's own doorbell.
pub(crate) fn own_bell() -> Bell {
    Bell::Own(Box::new(CachePadded::new(Doorbell::new())))
}
