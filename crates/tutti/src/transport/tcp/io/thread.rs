//! The I/O thread: moves the jobs of every port of its set over the
//! lanes, and sleeps in `poll()` when nothing moves.

use super::super::framing::{Expect, RxError, Sink, PROBE_AFTER};
use super::super::lanes::{close_gracefully, Direct, Lanes};
use super::{align16, Failure, Port, Shared, Stage, DESC_BYTES, MAX_NAP};
use crate::transport::wait::{self, Backoff};
use crate::transport::{shm, HEADER_BYTES};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The I/O thread's side of one link.
pub(super) struct Side {
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
    pub(super) fn new(lanes: Lanes) -> Side {
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
                var_len: false,
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
                var_len: false,
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
                self.lanes
                    .rx(&self.ex, &mut Direct { dst: self.rx_dst }, &mut heard)
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

    /// Sends a liveness probe if the peer we wait for has been silent, and
    /// fails the link if the peer's host no longer acknowledges what we
    /// sent it (the probe, or a message: [`Lanes::host_silent`]).
    fn maybe_probe(&mut self, p: &Port, now: Instant) {
        if self.dead || now.duration_since(self.last_heard) < PROBE_AFTER {
            return;
        }
        if self.rx_on && now.duration_since(self.last_probe) >= PROBE_AFTER {
            self.last_probe = now;
            self.lanes.start_probe();
        }
        if self.rx_on || self.tx_on {
            if let Some(why) = self.lanes.host_silent() {
                self.die(p, Failure::Io(why));
            }
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

/// The I/O thread's loop. It waits as every wait does
/// ([`crate::transport::wait`]): it polls its ports while the spin time
/// lasts, then probes silent peers (its liveness check; it has no deadline
/// of its own, and stops when told to) and sleeps in `poll()` on its
/// sockets and eventfd.
pub(super) fn io_thread(sh: &Shared, mut sides: Vec<Side>) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(1 + 2 * sides.len() * 8);
    let mut backoff = Backoff::new(sh.spin);
    let mut was_busy = false;
    loop {
        let kick = sh.kick.load(Ordering::SeqCst);
        if sh.stop.load(Ordering::Acquire) {
            if sh.graceful.load(Ordering::Acquire) {
                let lanes: Vec<&Lanes> = sides.iter().map(|s| &s.lanes).collect();
                close_gracefully(&lanes);
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
        for (s, p) in sides.iter_mut().zip(&sh.ports) {
            s.maybe_probe(p, now);
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
            wait::poll(&mut fds, MAX_NAP);
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
