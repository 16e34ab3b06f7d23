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

use super::shm::{self, Doorbell, Segment};
use super::tcp::{rx_error, Expect, FrameSet, Framing, Lanes, RxError, Sink, TcpLink, PROBE_AFTER};
use super::{msg_flags, Header, RecvMsg, SendMsg, StepCx, HEADER_BYTES};
use crate::error::{Error, Result};
use crossbeam_utils::CachePadded;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// The I/O thread's side of one link.
struct Side {
    lanes: Lanes,
    tx_seen: u64,
    tx_on: bool,
    tx_ptr: *const u8,
    tx_len: usize,
    tx_hdr: [u8; HEADER_BYTES],
    rx_seen: u64,
    rx_on: bool,
    rx_dst: *mut u8,
    rx_reduce: bool,
    ex: Expect,
    dead: bool,
    last_heard: Instant,
    last_probe: Instant,
}

// SAFETY: a Side moves to the I/O thread once and is used only there; its
// raw pointers point into buffers that the executor keeps valid while the
// job they belong to is posted and not done or cancelled.
unsafe impl Send for Side {}

impl Side {
    fn new(lanes: Lanes) -> Side {
        Side {
            lanes,
            tx_seen: 0,
            tx_on: false,
            tx_ptr: std::ptr::null(),
            tx_len: 0,
            tx_hdr: [0; HEADER_BYTES],
            rx_seen: 0,
            rx_on: false,
            rx_dst: std::ptr::null_mut(),
            rx_reduce: false,
            ex: Expect {
                coll_seq: 0,
                tag: 0,
                len: 0,
                n: 0,
            },
            dead: false,
            last_heard: Instant::now(),
            last_probe: Instant::now(),
        }
    }

    fn die(&mut self, p: &Port, f: Failure) {
        p.fail(f);
        self.dead = true;
        self.tx_on = false;
        self.rx_on = false;
    }

    /// Moves this link's jobs as far as the sockets allow.
    fn step(&mut self, p: &Port) -> bool {
        let c = p.cancel.load(Ordering::Acquire);
        if c != p.cancel_ack.load(Ordering::Relaxed) {
            // The executor gave up on an op: forget its buffers.
            self.die(p, Failure::Reset);
            p.cancel_ack.store(c, Ordering::Release);
            return true;
        }
        if self.dead {
            return false;
        }
        let mut moved = false;
        if !self.tx_on && p.tx.posted.load(Ordering::Acquire) > self.tx_seen {
            self.tx_seen += 1;
            self.tx_ptr = p.tx.ptr.load(Ordering::Relaxed) as *const u8;
            self.tx_len = p.tx.len.load(Ordering::Relaxed);
            self.tx_hdr[..8].copy_from_slice(&p.tx.hdr[0].load(Ordering::Relaxed).to_le_bytes());
            self.tx_hdr[8..].copy_from_slice(&p.tx.hdr[1].load(Ordering::Relaxed).to_le_bytes());
            self.lanes.tx_start(self.tx_len);
            self.tx_on = true;
            moved = true;
        }
        if self.tx_on {
            let avail = p.tx.avail.load(Ordering::Acquire);
            // SAFETY: the executor keeps ptr..ptr+avail valid and unchanged
            // until this job is done or cancelled.
            match unsafe { self.lanes.tx(self.tx_ptr, self.tx_len, avail, &self.tx_hdr) } {
                Ok(m) => moved |= m,
                Err(e) => {
                    self.die(p, Failure::Io(e.to_string()));
                    return true;
                }
            }
            if self.lanes.tx_done() {
                self.tx_on = false;
                p.tx.done.store(self.tx_seen, Ordering::Release);
                moved = true;
            }
        } else if let Err(e) = self.lanes.flush_probes() {
            self.die(p, Failure::Io(e.to_string()));
            return true;
        }
        if !self.rx_on && p.rx.posted.load(Ordering::Acquire) > self.rx_seen {
            self.rx_seen += 1;
            self.rx_dst = p.rx.dst.load(Ordering::Relaxed) as *mut u8;
            self.rx_reduce = p.rx.reduce.load(Ordering::Relaxed);
            self.ex = Expect {
                coll_seq: p.rx.coll_seq.load(Ordering::Relaxed),
                tag: p.rx.tag.load(Ordering::Relaxed) as u16,
                len: p.rx.len.load(Ordering::Relaxed),
                n: p.rx.n.load(Ordering::Relaxed),
            };
            self.lanes.rx_start(self.ex.len);
            self.rx_on = true;
            moved = true;
        }
        if self.rx_on {
            let mut heard = false;
            let r = if self.rx_reduce {
                self.lanes.rx(&self.ex, &mut Staging { p }, &mut heard)
            } else {
                self.lanes.rx(
                    &self.ex,
                    &mut super::tcp::Direct { dst: self.rx_dst },
                    &mut heard,
                )
            };
            if heard {
                self.last_heard = Instant::now();
            }
            match r {
                Ok(m) => moved |= m,
                Err(RxError::Io(e)) => {
                    self.die(p, Failure::Io(e.to_string()));
                    return true;
                }
                Err(RxError::Header(h)) => {
                    self.die(p, Failure::Header(h));
                    return true;
                }
                Err(RxError::Frame(off)) => {
                    self.die(p, Failure::Frame(off));
                    return true;
                }
            }
            let len = self.ex.len;
            if !self.rx_reduce && moved {
                p.rx.got
                    .store(self.lanes.rx_prefix(len, |_| 0), Ordering::Release);
            }
            if self.lanes.rx_done() {
                self.rx_on = false;
                p.rx.done.store(self.rx_seen, Ordering::Release);
                moved = true;
            }
        }
        moved
    }

    /// Sends a liveness probe if the peer we wait for has been silent.
    fn maybe_probe(&mut self, now: Instant) {
        if self.rx_on
            && !self.dead
            && now.duration_since(self.last_heard) >= PROBE_AFTER
            && now.duration_since(self.last_probe) >= PROBE_AFTER
        {
            self.last_probe = now;
            self.lanes.start_probe();
        }
    }

    /// Adds the descriptors this link waits on.
    fn pollfds(&self, p: &Port, out: &mut Vec<libc::pollfd>) {
        if self.dead {
            return;
        }
        let avail = p.tx.avail.load(Ordering::Acquire);
        for i in 0..self.lanes.lanes.len() {
            let read = self.rx_on
                && self.lanes.rx_pending(i)
                && (!self.rx_reduce || stage_room(&p.stages[i]) >= DESC_BYTES);
            let wants = if self.tx_on {
                self.lanes.tx_wants_write(i, self.tx_len, avail)
            } else {
                self.lanes.nop_pending(i)
            };
            self.lanes.push_pollfd(i, read, wants, out);
        }
    }
}

fn stage_room(st: &Stage) -> usize {
    let head = st.head.load(Ordering::Relaxed);
    let tail = st.tail.load(Ordering::Acquire);
    (tail + st.cap).saturating_sub(head)
}

/// Receives into the lanes' staging rings: each frame is a descriptor
/// (its offset and length in the message, 16 bytes) and its payload, and
/// starts 16-aligned.
struct Staging<'a> {
    p: &'a Port,
}

impl Sink for Staging<'_> {
    fn frame_start(&mut self, lane: usize, off: usize, flen: usize) -> bool {
        let st = &self.p.stages[lane];
        if stage_room(st) < DESC_BYTES {
            return false;
        }
        let head = st.head.load(Ordering::Relaxed);
        let mut d = [0u8; DESC_BYTES];
        d[..8].copy_from_slice(&(off as u64).to_le_bytes());
        d[8..].copy_from_slice(&(flen as u64).to_le_bytes());
        // SAFETY: head is 16-aligned and the ring's size a multiple of 16, so
        // the descriptor lies inside the ring, in room the executor has freed.
        unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), st.buf.add(head % st.cap), DESC_BYTES) };
        st.head.store(head + DESC_BYTES, Ordering::Release);
        true
    }

    fn space(&mut self, lane: usize, _off: usize, want: usize) -> Option<(*mut u8, usize)> {
        let st = &self.p.stages[lane];
        let head = st.head.load(Ordering::Relaxed);
        let at = head % st.cap;
        let room = stage_room(st).min(want).min(st.cap - at);
        // SAFETY: at < cap: inside the ring.
        (room > 0).then(|| (unsafe { st.buf.add(at) }, room))
    }

    fn commit(&mut self, lane: usize, _off: usize, k: usize) {
        let st = &self.p.stages[lane];
        st.head.fetch_add(k, Ordering::Release);
    }

    fn frame_done(&mut self, lane: usize) {
        let st = &self.p.stages[lane];
        let head = st.head.load(Ordering::Relaxed);
        st.head.store(align16(head), Ordering::Release);
    }
}

fn io_thread(sh: &Shared, mut sides: Vec<Side>) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(1 + 2 * sides.len() * 8);
    let mut backoff = super::Backoff::new(sh.spin);
    let mut was_busy = false;
    loop {
        let kick = sh.kick.load(Ordering::SeqCst);
        if sh.stop.load(Ordering::Acquire) {
            if sh.graceful.load(Ordering::Acquire) {
                let lanes: Vec<&Lanes> = sides.iter().map(|s| &s.lanes).collect();
                super::tcp::close_gracefully(&lanes);
            }
            return;
        }
        let mut moved = false;
        let mut busy = false;
        for (s, p) in sides.iter_mut().zip(&sh.ports) {
            moved |= s.step(p);
            busy |= s.tx_on || s.rx_on;
        }
        if busy && !was_busy {
            // The first job after an idle spell: a new wait, the full spin.
            backoff.restore();
        }
        was_busy = busy;
        if moved {
            shm::notify(sh.bell.get());
            backoff.reset();
            continue;
        }
        if backoff.keep_polling() {
            continue;
        }
        let now = Instant::now();
        for s in sides.iter_mut() {
            s.maybe_probe(now);
        }
        fds.clear();
        fds.push(libc::pollfd {
            fd: sh.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for (s, p) in sides.iter().zip(&sh.ports) {
            s.pollfds(p, &mut fds);
        }
        sh.sleeping.store(1, Ordering::SeqCst);
        if sh.kick.load(Ordering::SeqCst) == kick {
            // SAFETY: `fds` is a valid array of pollfd for the call.
            unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    MAX_NAP.as_millis() as i32,
                )
            };
        }
        sh.sleeping.store(0, Ordering::SeqCst);
        if fds[0].revents != 0 {
            let mut b = [0u8; 8];
            // SAFETY: reading 8 bytes into a live buffer from our eventfd
            // (non-blocking; failure only means it was already drained).
            unsafe { libc::read(sh.wake.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 8) };
        }
        // Look again at once: the sleep may have ended for any reason.
        backoff.reset();
    }
}

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
    cur: [Option<(usize, usize, usize)>; super::tcp::MAX_LANES],
    pos: [usize; super::tcp::MAX_LANES],
    dead: bool,
}

impl IoLink {
    fn new(set: Arc<IoSet>, idx: usize) -> IoLink {
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
            cur: [None; super::tcp::MAX_LANES],
            pos: [0; super::tcp::MAX_LANES],
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
