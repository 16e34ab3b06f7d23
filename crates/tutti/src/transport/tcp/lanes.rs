//! The sockets of a link ([`Lane`]s) and the frame machinery over them
//! ([`Lanes`]), shared by the inline link and the I/O thread; and the
//! graceful close of a communicator's links.

use super::connect::{configure, same_host};
use super::framing::{is_ahead, nop_bytes, Expect, FrameSet, Framing, RxError, Sink};
use super::framing::{FRAME_HDR_MAX, MAX_LANES, NOP};
use crate::error::Result;
use crate::transport::{sys, Header, HEADER_BYTES};
use std::cell::Cell;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// The longest message whose payload a header read takes with it (a
/// message of one frame, into a sink that takes every byte at once,
/// [`Sink::TAKES_ALL`]): header and payload then arrive in one `read`
/// instead of two, and a copy out of the lane's buffer costs less than the
/// system call it saves. The read asks for exactly the expected frame, so it
/// never takes bytes of the next one (unless a probe comes first: see
/// [`Lanes::rx`]). Longer messages read their header alone, as before.
///
/// A message of variable length ([`Expect::var_len`], links of one lane)
/// does not know where it ends before its header is in: its header read
/// asks for this much payload whatever the message, and what it takes of
/// the messages after stays in the lane's buffer, the start of the next.
pub(crate) const READ_AHEAD: usize = 4096;

/// The most payload bytes one [`Lanes::tx`] call writes on a lane. A socket whose
/// buffer takes a whole message at once (4 MiB, `SOCKET_BUFFER`) would
/// otherwise have a rank write all of it before it reads what its peer
/// sends meanwhile: by then the first bytes are out of cache, on both
/// sides. In bursts, the caller reads between them and the bytes travel
/// while warm. 2 ranks exchanging messages over loopback (`tutti perf
/// send_recv`, 5 rounds, paired against no limit): 1 MiB 403 -> 202 us
/// (0.54), 2 MiB 0.61, 4 MiB 0.73, 8-64 MiB 0.87-0.97; 128 KiB bursts
/// measured no better than 256 KiB.
pub(crate) const TX_BURST: usize = 256 << 10;

/// Retransmission timeouts in a row, with bytes still unacknowledged,
/// after which a peer's host counts as gone ([`Lanes::host_silent`]): with
/// Linux's 200 ms minimum and doubling, the second fires about 0.6 s
/// after the bytes left, where the 0.6 s `TCP_USER_TIMEOUT` used to cut
/// the connection.
pub(crate) const LOST_AFTER_TIMEOUTS: u8 = 2;

/// How long a first retransmission timeout may stand with nothing
/// acknowledged before a peer's host counts as gone, whatever the
/// second one's time. The timeout grows with the round trips the kernel
/// measured: on a loaded machine (delayed acknowledgements, a rank
/// descheduled) it was seen near 1 s, and two of them took 2.9 s where
/// the minimum's take 0.6 s. This keeps detection within 0.3 s of the first timeout.
pub(crate) const LOST_AFTER_SILENT: Duration = Duration::from_millis(300);

/// One socket of a link and where each direction stands on it.
pub(crate) struct Lane {
    pub(crate) sock: TcpStream,
    /// Sending: the frame being written, its header, and how much of the
    /// header and payload have gone.
    tx_frame: Option<usize>,
    tx_hbuf: [u8; FRAME_HDR_MAX],
    tx_hdr: usize,
    tx_off: usize,
    /// Bytes of a liveness probe written (`hdr_bytes` when none is pending).
    nop_sent: usize,
    /// Receiving: the frame header so far, the frame being read (and
    /// whether the sink has started it), payload bytes read, and whether
    /// `rx_hbuf` holds the next message's first header (kept for later).
    /// Payload read with the header lies in `rx_hbuf[rx_pre_at..]`,
    /// `rx_pre` bytes of it not yet delivered.
    rx_hbuf: [u8; FRAME_HDR_MAX + READ_AHEAD],
    rx_hdr_got: usize,
    rx_pre: usize,
    rx_pre_at: usize,
    rx_frame: Option<usize>,
    rx_begun: bool,
    rx_read: usize,
    rx_stash: bool,
    /// When [`Lanes::host_silent`] first saw a retransmission timeout
    /// standing on this socket (cleared once one is not).
    timed_out_at: Cell<Option<Instant>>,
    /// The peer closed this lane (at a frame boundary).
    rx_eof: bool,
}

impl Lane {
    fn new(sock: TcpStream, hdr_bytes: usize) -> Lane {
        Lane {
            sock,
            tx_frame: None,
            tx_hbuf: [0; FRAME_HDR_MAX],
            tx_hdr: 0,
            tx_off: 0,
            nop_sent: hdr_bytes,
            rx_hbuf: [0; FRAME_HDR_MAX + READ_AHEAD],
            rx_hdr_got: 0,
            rx_pre: 0,
            rx_pre_at: 0,
            rx_frame: None,
            rx_begun: false,
            rx_read: 0,
            rx_stash: false,
            timed_out_at: Cell::new(None),
            rx_eof: false,
        }
    }

    /// Writes what is left of a probe; true when it is all out.
    fn flush_nop(&mut self, hb: usize) -> io::Result<bool> {
        let nop = nop_bytes();
        while self.nop_sent < hb {
            match (&self.sock).write(&nop[self.nop_sent..hb]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => self.nop_sent += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}
/// The lanes of one link and the frame machinery over them. Each method
/// moves as much as the sockets take without blocking.
pub(crate) struct Lanes {
    pub(crate) lanes: Vec<Lane>,
    pub(crate) framing: Framing,
    /// Sending: the message's frames, the next frame to hand out, and the
    /// lane to offer it to first.
    tx_frames: usize,
    tx_next: usize,
    tx_turn: usize,
    /// Receiving: which frames of the current message have arrived, and
    /// its length (less than expected where its header said so,
    /// [`Expect::var_len`]).
    rx: FrameSet,
    rx_len: usize,
    /// The peer is on another host ([`Lanes::host_silent`] looks only there).
    remote: bool,
}

/// The longest a communicator's close waits for its TCP peers to
/// acknowledge what was sent to them ([`close_gracefully`]).
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How long [`close_gracefully`] waits without any acknowledgement or
/// incoming byte before it gives up: a peer that reads nothing (it is
/// failing too, or stopped) will not take the rest.
const CLOSE_STALL: Duration = Duration::from_millis(200);

/// Closes a communicator's TCP links (all of them at once, so that ranks
/// closing at the same time drain one another) without losing what they
/// still have to send. Linux answers the close of a socket that holds
/// unread incoming bytes (a liveness probe from a peer that was waiting on
/// us, on a link we only send on) with a reset, which throws away whatever
/// is still queued to send: the end of the last message the peer waits
/// for. On a 4-host namespace cluster, a job whose last call was a 16 MiB
/// ring AllReduce failed that way in 6 of 12 runs (`Connection reset by
/// peer` on the receiving rank). So: stop writing (the FIN follows the
/// queued bytes), then read and drop what arrives until every peer has
/// acknowledged every byte sent (`SIOCOUTQ` is 0) or its connection is
/// gone, for at most [`CLOSE_WAIT`], and no longer than [`CLOSE_STALL`]
/// without progress. Bytes arriving after that can no longer cost a peer
/// data. The sockets close when the links are dropped.
pub(crate) fn close_gracefully(all: &[&Lanes]) {
    let socks: Vec<&TcpStream> = all
        .iter()
        .flat_map(|l| l.lanes.iter().map(|lane| &lane.sock))
        .collect();
    if socks.is_empty() {
        return;
    }
    for s in &socks {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let start = Instant::now();
    let mut progress_at = start;
    let mut last_queued = i64::MAX;
    let mut buf = [0u8; 4096];
    let mut ended = vec![false; socks.len()];
    loop {
        let mut queued_total: i64 = 0;
        for (s, ended) in socks.iter().zip(&mut ended) {
            // Drop what the peer sent, up to the end of the stream, an
            // error or nothing more to read now.
            while !*ended {
                match (&**s).read(&mut buf) {
                    Ok(0) => *ended = true,
                    Ok(_) => progress_at = Instant::now(),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        *ended = e.kind() != io::ErrorKind::WouldBlock;
                        break;
                    }
                }
            }
            let mut queued: libc::c_int = 0;
            // SAFETY: TIOCOUTQ (SIOCOUTQ for TCP) writes one c_int: the
            // bytes sent but not yet acknowledged, or never sent.
            let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
            if r == 0 {
                queued_total += queued.max(0) as i64;
            }
        }
        let now = Instant::now();
        if queued_total < last_queued {
            last_queued = queued_total;
            progress_at = now;
        }
        if queued_total == 0
            || now.duration_since(start) >= CLOSE_WAIT
            || now.duration_since(progress_at) >= CLOSE_STALL
        {
            return;
        }
        // Wait for input on the sockets still open (a closed one would
        // wake us at once), or a moment for the acknowledgements.
        let open: Vec<RawFd> = socks
            .iter()
            .zip(&ended)
            .filter(|(_, &e)| !e)
            .map(|(s, _)| s.as_raw_fd())
            .collect();
        if open.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        } else {
            crate::transport::sys::wait_readable(&open, Duration::from_millis(1));
        }
    }
}

impl Lanes {
    /// Wraps connected sockets (lane `i` is `socks[i]`), configuring each.
    pub(crate) fn new(socks: Vec<TcpStream>, chunk: usize) -> Result<Lanes> {
        assert!(!socks.is_empty() && socks.len() <= MAX_LANES);
        let framing = Framing {
            lanes: socks.len(),
            chunk,
        };
        for s in &socks {
            configure(s, framing)?;
        }
        let hb = framing.hdr_bytes();
        let remote = !same_host(&socks[0]);
        Ok(Lanes {
            framing,
            remote,
            lanes: socks.into_iter().map(|s| Lane::new(s, hb)).collect(),
            tx_frames: 0,
            tx_next: 0,
            tx_turn: 0,
            rx: FrameSet::default(),
            rx_len: 0,
        })
    }

    /// Prepares to send a message of `len` bytes.
    pub(crate) fn tx_start(&mut self, len: usize) {
        self.tx_frames = self.framing.frames(len);
        self.tx_next = 0;
        self.tx_turn = 0;
        for l in &mut self.lanes {
            l.tx_frame = None;
        }
    }

    /// True once every frame of the message has been written.
    pub(crate) fn tx_done(&self) -> bool {
        self.tx_next >= self.tx_frames && self.lanes.iter().all(|l| l.tx_frame.is_none())
    }

    /// Whether the next frame may be handed out: frames go in order, each
    /// once some of its bytes are ready (or it is empty).
    fn tx_next_ready(&self, len: usize, avail: usize) -> bool {
        if self.tx_next >= self.tx_frames {
            return false;
        }
        let (off, flen) = self.framing.frame(len, self.tx_next);
        flen == 0 || avail > off
    }

    /// Writes frames of the message at `ptr` (`len` bytes, of which the first
    /// `avail` are ready) headed by `hdr`, at most [`TX_BURST`] payload
    /// bytes per lane in one call. Returns whether anything moved.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `avail` bytes, and those bytes must
    /// not change until the message is done.
    pub(crate) unsafe fn tx(
        &mut self,
        ptr: *const u8,
        len: usize,
        avail: usize,
        hdr: &[u8; HEADER_BYTES],
    ) -> io::Result<bool> {
        let fr = self.framing;
        let hb = fr.hdr_bytes();
        let k = self.lanes.len();
        let mut moved = false;
        let mut budget = [TX_BURST; MAX_LANES];
        loop {
            let mut pass = false;
            for step in 0..k {
                let s = (self.tx_turn + step) % k;
                // A lane that finished its frame takes the next one in turn,
                // one frame per lane per pass, so free lanes share the work.
                if self.lanes[s].tx_frame.is_none()
                    && self.lanes[s].nop_sent >= hb
                    && (s == 0 || self.tx_frames > 1)
                    && self.tx_next_ready(len, avail)
                {
                    let l = &mut self.lanes[s];
                    let (off, _) = fr.frame(len, self.tx_next);
                    l.tx_hbuf[..HEADER_BYTES].copy_from_slice(hdr);
                    l.tx_hbuf[HEADER_BYTES..].copy_from_slice(&(off as u64).to_le_bytes());
                    l.tx_frame = Some(self.tx_next);
                    l.tx_hdr = 0;
                    l.tx_off = 0;
                    self.tx_next += 1;
                    self.tx_turn = (s + 1) % k;
                }
                let l = &mut self.lanes[s];
                // SAFETY: forwarded from the caller.
                let m = unsafe { Self::tx_lane(l, fr, hb, ptr, len, avail, &mut budget[s])? };
                pass |= m;
            }
            moved |= pass;
            if !pass || budget[..k].iter().all(|&b| b == 0) {
                return Ok(moved);
            }
        }
    }

    /// Moves lane `l`'s probe and frame as far as its socket takes them.
    ///
    /// # Safety
    /// As for [`Lanes::tx`].
    unsafe fn tx_lane(
        l: &mut Lane,
        fr: Framing,
        hb: usize,
        ptr: *const u8,
        len: usize,
        avail: usize,
        budget: &mut usize,
    ) -> io::Result<bool> {
        let mut moved = false;
        if l.nop_sent < hb {
            // A probe goes out whole before the next frame starts.
            let before = l.nop_sent;
            let done = l.flush_nop(hb)?;
            moved = l.nop_sent != before;
            if !done {
                return Ok(moved);
            }
        }
        while let Some(j) = l.tx_frame {
            let (off, flen) = fr.frame(len, j);
            if l.tx_hdr == hb && l.tx_off == flen {
                l.tx_frame = None;
                moved = true;
                break;
            }
            let at = off + l.tx_off;
            let ready = avail.min(off + flen).saturating_sub(at).min(*budget);
            let hdr_left = hb - l.tx_hdr;
            if hdr_left == 0 && ready == 0 {
                break; // waiting for the bytes to become ready
            }
            // An empty message may come with a null pointer, which no slice
            // may hold, not even an empty one.
            let payload: &[u8] = if ready == 0 {
                &[]
            } else {
                // SAFETY: at + ready <= avail: the caller guarantees these
                // bytes are readable and stable (and so `ptr` is not null).
                unsafe { std::slice::from_raw_parts(ptr.add(at), ready) }
            };
            let r = if hdr_left > 0 {
                let bufs = [
                    IoSlice::new(&l.tx_hbuf[l.tx_hdr..hb]),
                    IoSlice::new(payload),
                ];
                (&l.sock).write_vectored(&bufs)
            } else {
                (&l.sock).write(payload)
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    moved = true;
                    let h = n.min(hdr_left);
                    l.tx_hdr += h;
                    l.tx_off += n - h;
                    *budget -= n - h;
                    if *budget == 0 {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }

    /// Whether lane `i` has something to write now (for `poll`).
    pub(crate) fn tx_wants_write(&self, i: usize, len: usize, avail: usize) -> bool {
        let l = &self.lanes[i];
        if l.nop_sent < self.framing.hdr_bytes() {
            return true;
        }
        match l.tx_frame {
            Some(j) => {
                let (off, _) = self.framing.frame(len, j);
                l.tx_hdr < self.framing.hdr_bytes() || avail > off + l.tx_off
            }
            None => (i == 0 || self.tx_frames > 1) && self.tx_next_ready(len, avail),
        }
    }

    /// Prepares to receive a message of `len` bytes. A header of it that
    /// arrived early stays, to be checked first, and so do the bytes read
    /// so far of a header still arriving: a lane done with the last
    /// message's frames may have begun to read this one's while another
    /// lane finished the last message.
    pub(crate) fn rx_start(&mut self, len: usize) {
        self.rx.reset(self.framing.frames(len));
        self.rx_len = len;
        for l in &mut self.lanes {
            l.rx_frame = None;
            l.rx_read = 0;
        }
    }

    /// The length of the message being received: the expected one, or
    /// what its header said ([`Expect::var_len`]).
    pub(crate) fn rx_len(&self) -> usize {
        self.rx_len
    }

    /// True once every frame of the message has been read.
    pub(crate) fn rx_done(&self) -> bool {
        self.rx.complete()
    }

    /// Whether lane `i` may still carry frames of the message (for `poll`).
    pub(crate) fn rx_pending(&self, i: usize) -> bool {
        let l = &self.lanes[i];
        i < self.rx_lanes() && !self.rx.complete() && !l.rx_stash && !l.rx_eof
    }

    /// The lanes that may carry frames of the message being received: a
    /// message of one frame always travels on lane 0 (so a small message
    /// costs one read while waiting), a longer one on any.
    fn rx_lanes(&self) -> usize {
        if self.rx.frames == 1 {
            1
        } else {
            self.lanes.len()
        }
    }

    /// The longest prefix of the message delivered so far: whole frames,
    /// then what a lane has read of the first missing frame, minus
    /// `held(lane)` (bytes a sink holds back, such as a partial element).
    pub(crate) fn rx_prefix(&self, len: usize, held: impl Fn(usize) -> usize) -> usize {
        let p = self.rx.prefix();
        if self.rx.complete() {
            return len;
        }
        let (off, _) = self.framing.frame(len, p);
        let partial = self
            .lanes
            .iter()
            .enumerate()
            .find(|(_, l)| l.rx_frame == Some(p))
            .map_or(0, |(s, l)| l.rx_read - held(s));
        off + partial
    }

    /// Reads frames of the expected message into `sink`. Returns whether
    /// anything moved; `heard` is set when bytes arrived.
    pub(crate) fn rx<S: Sink>(
        &mut self,
        ex: &Expect,
        sink: &mut S,
        heard: &mut bool,
    ) -> std::result::Result<bool, RxError> {
        let fr = self.framing;
        let hb = fr.hdr_bytes();
        let mut moved = false;
        let lanes = self.rx_lanes();
        // A message of one frame comes on lane 0 alone, and nothing of a
        // later message can come before it there: its header may bring
        // payload with it (and on one lane, if its length is not known,
        // bytes of the next messages: they stay for them).
        debug_assert!(
            !ex.var_len || fr.lanes == 1,
            "variable lengths on one lane only"
        );
        let ahead = if !S::TAKES_ALL || self.rx.frames != 1 {
            0
        } else if ex.var_len {
            READ_AHEAD
        } else if ex.len <= READ_AHEAD {
            ex.len
        } else {
            0
        };
        for s in 0..lanes {
            loop {
                if self.rx.complete() {
                    return Ok(moved);
                }
                if self.lanes[s].rx_eof && self.lanes[s].rx_frame.is_none() {
                    if self.lanes[..lanes].iter().all(|l| l.rx_eof || l.rx_stash) {
                        return Err(RxError::Io(io::ErrorKind::UnexpectedEof.into()));
                    }
                    break;
                }
                let l = &mut self.lanes[s];
                if l.rx_frame.is_none() {
                    if l.rx_stash {
                        // The early header of this message: check it now.
                        l.rx_stash = false;
                        l.rx_hdr_got = 0;
                    } else {
                        // (Bytes already there after a probe may hold a whole header.)
                        if l.rx_hdr_got < hb {
                            match (&l.sock).read(&mut l.rx_hbuf[l.rx_hdr_got..hb + ahead]) {
                                Ok(0) if l.rx_hdr_got == 0 => {
                                    // Closed between frames: what is missing may
                                    // still come on another lane (a peer that
                                    // finished closes them all, each after the
                                    // frames it carried).
                                    l.rx_eof = true;
                                    if self.lanes[..lanes].iter().all(|l| l.rx_eof || l.rx_stash) {
                                        return Err(RxError::Io(
                                            io::ErrorKind::UnexpectedEof.into(),
                                        ));
                                    }
                                    break;
                                }
                                Ok(0) => {
                                    return Err(RxError::Io(io::ErrorKind::UnexpectedEof.into()))
                                }
                                Ok(n) => {
                                    moved = true;
                                    *heard = true;
                                    l.rx_hdr_got += n;
                                    if l.rx_hdr_got < hb {
                                        continue;
                                    }
                                }
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                                Err(e) => return Err(RxError::Io(e)),
                            }
                        }
                        // What came after the header is payload (read ahead).
                        l.rx_pre = l.rx_hdr_got - hb;
                        l.rx_pre_at = hb;
                        l.rx_hdr_got = 0;
                    }
                    let h: Header = bytemuck::pod_read_unaligned(&l.rx_hbuf[..HEADER_BYTES]);
                    if h == NOP {
                        // A peer's liveness probe: what was read after it
                        // begins the next frame.
                        let (at, pre) = (l.rx_pre_at, l.rx_pre);
                        l.rx_hbuf.copy_within(at..at + pre, 0);
                        l.rx_hdr_got = pre;
                        l.rx_pre = 0;
                        continue;
                    }
                    if !ex.matches(&h) {
                        if fr.lanes > 1
                            && l.rx_pre == 0
                            && h.flags & 1 == 0
                            && is_ahead(h.flags >> 1, ex.n)
                        {
                            // A frame of a later message: this lane carried
                            // none of this message's remaining frames (they
                            // are on other lanes); keep it for its turn.
                            l.rx_stash = true;
                            l.rx_hdr_got = hb;
                            break;
                        }
                        return Err(RxError::Header(h));
                    }
                    // (Only a variable-length message's header may differ.)
                    self.rx_len = h.len as usize;
                    let j = if fr.lanes == 1 {
                        0
                    } else {
                        let off = u64::from_le_bytes(
                            l.rx_hbuf[HEADER_BYTES..FRAME_HDR_MAX]
                                .try_into()
                                .expect("8 bytes"),
                        );
                        let j = (off / fr.chunk as u64) as usize;
                        if off % fr.chunk as u64 != 0 || j >= self.rx.frames || self.rx.has(j) {
                            return Err(RxError::Frame(off));
                        }
                        j
                    };
                    l.rx_frame = Some(j);
                    l.rx_begun = false;
                    l.rx_read = 0;
                }
                let j = l.rx_frame.expect("a frame is being read");
                let (off, flen) = fr.frame(self.rx_len, j);
                if !l.rx_begun {
                    if !sink.frame_start(s, off, flen) {
                        break;
                    }
                    l.rx_begun = true;
                }
                if l.rx_read == flen {
                    sink.frame_done(s);
                    l.rx_frame = None;
                    if l.rx_pre > 0 {
                        // Read ahead past a message of variable length:
                        // the beginning of the next one.
                        let (at, pre) = (l.rx_pre_at, l.rx_pre);
                        l.rx_hbuf.copy_within(at..at + pre, 0);
                        l.rx_hdr_got = pre;
                        l.rx_pre = 0;
                    }
                    self.rx.set(j);
                    moved = true;
                    continue;
                }
                let at = off + l.rx_read;
                let Some((p, room)) = sink.space(s, at, flen - l.rx_read) else {
                    break;
                };
                if l.rx_pre > 0 {
                    // Payload that came with the header: at most the frame's.
                    let k = room.min(l.rx_pre);
                    // SAFETY: the sink hands out `room` writable bytes at `p`,
                    // which do not overlap this lane's own buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(l.rx_hbuf.as_ptr().add(l.rx_pre_at), p, k)
                    };
                    sink.commit(s, at, k);
                    l.rx_read += k;
                    l.rx_pre -= k;
                    l.rx_pre_at += k;
                    moved = true;
                    continue;
                }
                // SAFETY: the sink hands out `room` writable bytes at `p`.
                let buf = unsafe { std::slice::from_raw_parts_mut(p, room) };
                match (&l.sock).read(buf) {
                    Ok(0) => return Err(RxError::Io(io::ErrorKind::UnexpectedEof.into())),
                    Ok(n) => {
                        moved = true;
                        *heard = true;
                        sink.commit(s, at, n);
                        l.rx_read += n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(RxError::Io(e)),
                }
            }
        }
        Ok(moved)
    }

    /// Starts a liveness probe on a lane that is between frames (lane 0 if
    /// it can, which every message uses). Returns false if none could.
    pub(crate) fn start_probe(&mut self) -> bool {
        let hb = self.framing.hdr_bytes();
        match self
            .lanes
            .iter()
            .position(|l| l.tx_frame.is_none() && l.nop_sent >= hb)
        {
            Some(i) => {
                self.lanes[i].nop_sent = 0;
                true
            }
            None => false,
        }
    }

    /// Writes what is left of any started probe.
    pub(crate) fn flush_probes(&mut self) -> io::Result<()> {
        let hb = self.framing.hdr_bytes();
        for l in &mut self.lanes {
            l.flush_nop(hb)?;
        }
        Ok(())
    }

    /// Whether lane `i` has a probe to finish writing.
    pub(crate) fn nop_pending(&self, i: usize) -> bool {
        self.lanes[i].nop_sent < self.framing.hdr_bytes()
    }

    /// Why the peer's host looks gone, if it does: a lane has bytes out
    /// that [`LOST_AFTER_TIMEOUTS`] retransmission timeouts in a row have
    /// not got acknowledged, or that one has not for [`LOST_AFTER_SILENT`]
    /// (seen by the clock of the calls here, which come every few tens of
    /// milliseconds while a rank waits). A host that is up acknowledges
    /// whatever its process is doing, also when its buffers are full and
    /// its window closed (then nothing is in flight and no retransmission
    /// timer runs), so this never takes a live rank that does not read for
    /// a while for a dead one. (The kernel's `TCP_USER_TIMEOUT` would,
    /// which is why it is not set: see [`super::connect::configure`].)
    /// A peer on this host is never taken for gone: its kernel is ours.
    pub(crate) fn host_silent(&self) -> Option<String> {
        self.lanes.iter().filter(|_| self.remote).find_map(|l| {
            let u = sys::tcp_unacked(l.sock.as_raw_fd())?;
            if u.segments == 0 || u.timeouts == 0 {
                l.timed_out_at.set(None);
                return None;
            }
            let now = Instant::now();
            let since = l.timed_out_at.get().unwrap_or(now);
            l.timed_out_at.set(Some(since));
            let standing = now - since;
            // No acknowledgement came since the timeout was first seen
            // (any would have reset the count, but a new timeout may have
            // fired since).
            let unbroken = u128::from(u.since_ack_ms) >= standing.as_millis();
            if !unbroken {
                l.timed_out_at.set(Some(now));
            }
            (u.timeouts >= LOST_AFTER_TIMEOUTS || (unbroken && standing >= LOST_AFTER_SILENT)).then(
                || {
                    format!(
                        "its host stopped acknowledging TCP data ({} retransmissions, nothing \
                         acknowledged for {} ms, retransmission timeout {} ms): it is down or \
                         cut off",
                        u.timeouts, u.since_ack_ms, u.rto_ms
                    )
                },
            )
        })
    }

    /// Closes every lane so that the peer notices at once.
    pub(crate) fn shutdown(&self) {
        for l in &self.lanes {
            let _ = l.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The descriptor of lane `i`.
    /// Adds lane `i` to a poll set, waiting to read if `read` and to
    /// write if `write`; nothing if neither.
    pub(crate) fn push_pollfd(
        &self,
        i: usize,
        read: bool,
        write: bool,
        out: &mut Vec<libc::pollfd>,
    ) {
        let events = if read { libc::POLLIN } else { 0 } | if write { libc::POLLOUT } else { 0 };
        if events != 0 {
            out.push(libc::pollfd {
                fd: self.fd(i),
                events,
                revents: 0,
            });
        }
    }

    pub(crate) fn fd(&self, i: usize) -> RawFd {
        self.lanes[i].sock.as_raw_fd()
    }
}

/// Copies received bytes straight into the destination.
pub(crate) struct Direct {
    /// Start of the message's destination.
    pub(crate) dst: *mut u8,
}

impl Sink for Direct {
    const TAKES_ALL: bool = true;
    fn space(&mut self, _lane: usize, off: usize, want: usize) -> Option<(*mut u8, usize)> {
        // SAFETY: off + want <= the message length, for which dst is valid.
        Some((unsafe { self.dst.add(off) }, want))
    }
    fn commit(&mut self, _lane: usize, _off: usize, _k: usize) {}
}
