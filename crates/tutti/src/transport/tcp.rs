//! The TCP transport.
//!
//! # Lanes and frames
//!
//! A link to a peer is `K` connected sockets, its *lanes* (`K` is chosen at
//! set-up by the rank that dials, see [`Framing`]). With one lane, a message
//! is its 16-byte [`Header`] and its payload. With several, a message of `L`
//! bytes is cut on a fixed grid into frames of `chunk` bytes (the last one
//! shorter); each frame is the message's header (collective sequence
//! number, tag, the message's number on the link, and the total length
//! `L`), the frame's offset in the message (8 bytes), and its payload. A
//! message of at most one chunk is one frame and always travels on lane 0,
//! so that it pays no extra latency (the receiver waits on one socket); a
//! larger one is spread over every lane.
//!
//! Frames are given to lanes as they become free: the sender hands the next
//! frame to the next lane (in turn) that is not still busy writing one, so a
//! lane that runs slower (a congested path, an unlucky hash) carries fewer
//! frames instead of holding up the whole message, as a fixed stripe would.
//! `TCP_NOTSENT_LOWAT` keeps each lane's unsent queue short, so that "busy"
//! means what it says. The receiver reads a frame's offset from its header,
//! puts the payload there, and keeps a bitmap of the frames it has, which
//! says when the message is complete and how long its complete prefix is (a
//! fused step forwards that prefix).
//!
//! Every frame header is checked against what the receiver expects, so a
//! frame of another op, another length or another message number on any
//! lane is an [`Error::Mismatch`]; so is an offset off the grid, beyond the
//! message, or seen twice. One exception: on a link with several lanes, a
//! frame of a *later* message may arrive on one lane while the current
//! message still has frames in flight on another (the sender moved on after
//! writing them, and later messages may have gone entirely on other lanes);
//! that header is kept, the lane pauses, and the header is checked when its
//! message's turn comes.
//!
//! A liveness probe ([`NOP`]) may appear between frames on any lane and is
//! skipped by the receiver.
//!
//! # Who does the system calls
//!
//! [`TcpLink`] moves frames with non-blocking reads and writes on the
//! executor's thread (the *inline* mode). Payloads are read straight into
//! the destination buffer; a reducing receive reads into the bounce buffer
//! and reduces whole elements, carrying a partial element (per lane) over to
//! the next read. The lane machinery ([`Lanes`]) is shared with the I/O
//! thread mode in [`super::tcp_io`], where a dedicated thread does the
//! system calls.

use super::{msg_flags, Header, RecvMsg, SendMsg, StepCx, HEADER_BYTES, P2P_SEQ};
use crate::error::{Error, Result};
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// The most sockets a link may have.
pub(crate) const MAX_LANES: usize = 8;

/// Frames are at most this long when a link has several lanes.
pub(crate) const DEFAULT_CHUNK: usize = 256 << 10;

/// Socket buffer size asked for, when the system allows it.
const SOCKET_BUFFER: usize = 4 << 20;

/// The longest frame header: a message header and a frame offset.
pub(crate) const FRAME_HDR_MAX: usize = HEADER_BYTES + 8;

/// How a link cuts messages into frames: `lanes` sockets, frames of at most
/// `chunk` bytes (a power of two, at least 4 KiB, so that frames start on
/// element boundaries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Framing {
    pub lanes: usize,
    pub chunk: usize,
}

impl Framing {
    /// Frames of a message of `len` bytes (at least one, also for 0 bytes).
    pub(crate) fn frames(&self, len: usize) -> usize {
        if self.lanes == 1 || len <= self.chunk {
            1
        } else {
            len.div_ceil(self.chunk)
        }
    }

    /// Offset and length of frame `j` of a message of `len` bytes.
    pub(crate) fn frame(&self, len: usize, j: usize) -> (usize, usize) {
        if self.lanes == 1 || len <= self.chunk {
            (0, len)
        } else {
            let off = j * self.chunk;
            (off, self.chunk.min(len - off))
        }
    }

    /// Bytes of a frame header: the message header, plus the frame's
    /// offset when there are several lanes.
    pub(crate) fn hdr_bytes(&self) -> usize {
        if self.lanes == 1 {
            HEADER_BYTES
        } else {
            FRAME_HDR_MAX
        }
    }
}

/// A liveness probe: a header with no message, which the receiver skips. It
/// gives the kernel unacknowledged data to time out on when the peer's host
/// has vanished without a word. Its sequence number and tag are reserved
/// values no message carries. (On a link with several lanes it is followed
/// by 8 zero bytes, the size of a frame offset.)
pub const NOP: Header = Header {
    seq: u32::MAX - 1,
    tag: u16::MAX,
    flags: 1,
    len: 0,
};

fn nop_bytes() -> [u8; FRAME_HDR_MAX] {
    let mut b = [0u8; FRAME_HDR_MAX];
    b[..HEADER_BYTES].copy_from_slice(bytemuck::bytes_of(&NOP));
    b
}

/// Probe a peer that has been silent this long while we wait for it.
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(300);

/// What a receiver expects of every frame of the message it receives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    pub coll_seq: u32,
    pub tag: u16,
    pub len: usize,
    /// The message's number on the link.
    pub n: u32,
}

impl Expect {
    /// True if `h` is a frame of this message (the test of
    /// [`StepCx::check_header`], which explains a failure).
    pub(crate) fn matches(&self, h: &Header) -> bool {
        h.flags & !1 == msg_flags(self.n)
            && h.tag == self.tag
            && (h.seq == self.coll_seq || h.seq == P2P_SEQ || self.coll_seq == P2P_SEQ)
            && h.len == self.len as u64
    }
}

/// Why receiving stopped.
#[derive(Debug)]
pub(crate) enum RxError {
    /// The connection failed.
    Io(io::Error),
    /// A frame header that does not belong to the expected message.
    Header(Header),
    /// A frame of the right message at an impossible offset.
    Frame(u64),
}

/// The error for a receive that stopped with `e`, on the message number `n`
/// of `len` bytes from `peer`.
pub(crate) fn rx_error(cx: &StepCx, e: RxError, len: usize, peer: usize, n: u32) -> Error {
    match e {
        RxError::Io(e) => cx.lost(peer, format!("TCP connection failed: {e}")),
        RxError::Header(h) => match cx.check_header(&h, len, peer, n) {
            Err(e) => e,
            Ok(()) => Error::Mismatch {
                rank: cx.rank,
                peer,
                seq: cx.seq,
                msg: format!("unexpected frame header from rank {peer}: {h:?}"),
            },
        },
        RxError::Frame(off) => Error::Mismatch {
            rank: cx.rank,
            peer,
            seq: cx.seq,
            msg: format!(
                "{} (op #{}): rank {peer} sent a frame at offset {off} of a {len}-byte message, which is off the frame grid, beyond the end or repeated (lost or repeated data)",
                cx.op_name, cx.seq
            ),
        },
    }
}

/// How far ahead of the expected message `n` a frame of a later message
/// may be (message numbers are 15 bits and wrap).
const MAX_AHEAD: u16 = 4096;

/// True if message number `got` (15 bits) is a little after `n`'s.
fn is_ahead(got: u16, n: u32) -> bool {
    let d = got.wrapping_sub((n & 0x7fff) as u16) & 0x7fff;
    (1..MAX_AHEAD).contains(&d)
}

/// Where received payload goes.
pub(crate) trait Sink {
    /// A frame of `flen` bytes at message offset `off` starts on `lane`;
    /// false if it cannot start now (no room), in which case it is offered
    /// again later.
    fn frame_start(&mut self, _lane: usize, _off: usize, _flen: usize) -> bool {
        true
    }
    /// Room for up to `want` payload bytes of lane `lane` that belong at
    /// message offset `off`: a pointer and how many bytes may be written
    /// there, or `None` when there is no room now.
    fn space(&mut self, lane: usize, off: usize, want: usize) -> Option<(*mut u8, usize)>;
    /// `k` bytes were written to the last space given for `lane`.
    fn commit(&mut self, lane: usize, off: usize, k: usize);
    /// The frame `lane` was receiving is complete.
    fn frame_done(&mut self, _lane: usize) {}
}

/// Which frames of a message have arrived.
#[derive(Default)]
pub(crate) struct FrameSet {
    bits: Vec<u64>,
    frames: usize,
    count: usize,
    /// Frames 0..prefix have all arrived.
    prefix: usize,
}

impl FrameSet {
    /// Starts a message of `frames` frames (allocates only for a message
    /// with more frames than any before).
    pub(crate) fn reset(&mut self, frames: usize) {
        let words = frames.div_ceil(64);
        if self.bits.len() < words {
            self.bits.resize(words, 0);
        }
        self.bits[..words].fill(0);
        self.frames = frames;
        self.count = 0;
        self.prefix = 0;
    }

    /// Whether frame `i` has arrived.
    pub(crate) fn has(&self, i: usize) -> bool {
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Marks frame `i` as arrived.
    pub(crate) fn set(&mut self, i: usize) {
        self.bits[i / 64] |= 1 << (i % 64);
        self.count += 1;
        while self.prefix < self.frames && self.has(self.prefix) {
            self.prefix += 1;
        }
    }

    /// True once every frame has arrived.
    pub(crate) fn complete(&self) -> bool {
        self.count == self.frames
    }

    /// The first frame that has not arrived (`frames` when all have).
    pub(crate) fn prefix(&self) -> usize {
        self.prefix
    }
}

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
    rx_hbuf: [u8; FRAME_HDR_MAX],
    rx_hdr_got: usize,
    rx_frame: Option<usize>,
    rx_begun: bool,
    rx_read: usize,
    rx_stash: bool,
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
            rx_hbuf: [0; FRAME_HDR_MAX],
            rx_hdr_got: 0,
            rx_frame: None,
            rx_begun: false,
            rx_read: 0,
            rx_stash: false,
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

/// Configures a connected socket for a lane: non-blocking, `TCP_NODELAY`,
/// large buffers where the system allows them, keepalive and a user
/// timeout; with several lanes, a short unsent queue.
pub(crate) fn configure(sock: &TcpStream, framing: Framing) -> Result<()> {
    sock.set_nonblocking(true)
        .and_then(|_| sock.set_nodelay(true))
        .map_err(|e| Error::io("configuring a TCP link", e))?;
    let s = socket2::SockRef::from(sock);
    // An explicit size turns the kernel's buffer autotuning off and is
    // capped at net.core.{w,r}mem_max (often 208 KiB): ask only where the
    // cap allows the large buffer, else leave autotuning on.
    let (wmax, rmax) = buffer_caps();
    if wmax >= SOCKET_BUFFER {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
    if rmax >= SOCKET_BUFFER {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
    if framing.lanes > 1 {
        // A lane reports itself busy (EAGAIN) once this much is queued but
        // not yet sent, so that frames go to the lanes that move.
        let lowat: libc::c_int = (2 * framing.chunk).max(512 << 10) as libc::c_int;
        // SAFETY: setsockopt on a valid socket with a pointer to a c_int
        // and its size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                &lowat as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    // A peer whose host vanished sends no reset: data left unacknowledged
    // for 0.6 s fails the connection (at the next retransmission) (and the
    // failure then spreads to the other ranks at once); an idle connection
    // is probed after a second of silence. A live peer's kernel
    // acknowledges even while its process is busy, so slowness is not
    // mistaken for death.
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(1))
        .with_interval(Duration::from_secs(1))
        .with_retries(1);
    let _ = s.set_tcp_keepalive(&ka);
    let _ = s.set_tcp_user_timeout(Some(Duration::from_millis(600)));
    Ok(())
}

/// net.core.wmem_max and rmem_max (0 if unreadable), read once per process.
fn buffer_caps() -> (usize, usize) {
    static CAPS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *CAPS.get_or_init(|| {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        (
            read("/proc/sys/net/core/wmem_max"),
            read("/proc/sys/net/core/rmem_max"),
        )
    })
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
    /// Receiving: which frames of the current message have arrived.
    rx: FrameSet,
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
            super::sys::wait_readable(&open, Duration::from_millis(1));
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
        Ok(Lanes {
            framing,
            lanes: socks.into_iter().map(|s| Lane::new(s, hb)).collect(),
            tx_frames: 0,
            tx_next: 0,
            tx_turn: 0,
            rx: FrameSet::default(),
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
    /// `avail` are ready) headed by `hdr`. Returns whether anything moved.
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
                let m = unsafe { Self::tx_lane(l, fr, hb, ptr, len, avail)? };
                pass |= m;
            }
            moved |= pass;
            if !pass {
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
            let ready = avail.min(off + flen).saturating_sub(at);
            let hdr_left = hb - l.tx_hdr;
            if hdr_left == 0 && ready == 0 {
                break; // waiting for the bytes to become ready
            }
            // SAFETY: at + ready <= avail: the caller guarantees these bytes
            // are readable and stable.
            let payload = unsafe { std::slice::from_raw_parts(ptr.add(at), ready) };
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
        for l in &mut self.lanes {
            l.rx_frame = None;
            l.rx_read = 0;
        }
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
    pub(crate) fn rx(
        &mut self,
        ex: &Expect,
        sink: &mut impl Sink,
        heard: &mut bool,
    ) -> std::result::Result<bool, RxError> {
        let fr = self.framing;
        let hb = fr.hdr_bytes();
        let mut moved = false;
        let lanes = self.rx_lanes();
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
                        match (&l.sock).read(&mut l.rx_hbuf[l.rx_hdr_got..hb]) {
                            Ok(0) if l.rx_hdr_got == 0 => {
                                // Closed between frames: what is missing may
                                // still come on another lane (a peer that
                                // finished closes them all, each after the
                                // frames it carried).
                                l.rx_eof = true;
                                if self.lanes[..lanes].iter().all(|l| l.rx_eof || l.rx_stash) {
                                    return Err(RxError::Io(io::ErrorKind::UnexpectedEof.into()));
                                }
                                break;
                            }
                            Ok(0) => return Err(RxError::Io(io::ErrorKind::UnexpectedEof.into())),
                            Ok(n) => {
                                moved = true;
                                *heard = true;
                                l.rx_hdr_got += n;
                                if l.rx_hdr_got < hb {
                                    continue;
                                }
                                l.rx_hdr_got = 0;
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(RxError::Io(e)),
                        }
                    }
                    let h: Header = bytemuck::pod_read_unaligned(&l.rx_hbuf[..HEADER_BYTES]);
                    if h == NOP {
                        continue; // a peer's liveness probe
                    }
                    if !ex.matches(&h) {
                        if fr.lanes > 1 && h.flags & 1 == 0 && is_ahead(h.flags >> 1, ex.n) {
                            // A frame of a later message: this lane carried
                            // none of this message's remaining frames (they
                            // are on other lanes); keep it for its turn.
                            l.rx_stash = true;
                            l.rx_hdr_got = hb;
                            break;
                        }
                        return Err(RxError::Header(h));
                    }
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
                let (off, flen) = fr.frame(ex.len, j);
                if !l.rx_begun {
                    if !sink.frame_start(s, off, flen) {
                        break;
                    }
                    l.rx_begun = true;
                }
                if l.rx_read == flen {
                    sink.frame_done(s);
                    l.rx_frame = None;
                    self.rx.set(j);
                    moved = true;
                    continue;
                }
                let at = off + l.rx_read;
                let Some((p, room)) = sink.space(s, at, flen - l.rx_read) else {
                    break;
                };
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
    fn space(&mut self, _lane: usize, off: usize, want: usize) -> Option<(*mut u8, usize)> {
        // SAFETY: off + want <= the message length, for which dst is valid.
        Some((unsafe { self.dst.add(off) }, want))
    }
    fn commit(&mut self, _lane: usize, _off: usize, _k: usize) {}
}

/// Reads into the bounce buffer and reduces whole elements into the
/// destination, holding a partial element per lane for the next read.
struct Reducing<'a> {
    m: &'a RecvMsg,
    cx: &'a mut StepCx,
    carry: &'a mut [([u8; 8], usize); MAX_LANES],
}

impl Sink for Reducing<'_> {
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
    lanes: Lanes,
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
    /// Wraps connected sockets to `peer` (one per lane, in lane order).
    /// The link's sockets.
    pub(crate) fn lanes(&self) -> &Lanes {
        &self.lanes
    }

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
    /// so that a vanished host shows as a timed-out connection within about
    /// a second instead of after keepalive's two.
    pub(crate) fn probe(&mut self, cx: &StepCx) -> Result<()> {
        if self.last_heard.elapsed() >= PROBE_AFTER && self.last_probe.elapsed() >= PROBE_AFTER {
            self.last_probe = Instant::now();
            self.lanes.start_probe();
        }
        self.lanes.flush_probes().map_err(|e| self.broken(cx, e))
    }

    /// Sets every socket of this link to congestion control `name`
    /// (`TCP_CONGESTION`); the kernel's error if it refuses (an unknown
    /// name, or one an unprivileged process may not pick).
    pub(crate) fn set_congestion(&self, name: &str) -> std::io::Result<()> {
        for lane in &self.lanes.lanes {
            socket2::SockRef::from(&lane.sock).set_tcp_congestion(name.as_bytes())?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::{DataType, ReduceOp};
    use std::net::TcpListener;

    /// `k` connected socket pairs on loopback: (dialled ends, accepted ends).
    fn pairs(k: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..k {
            a.push(TcpStream::connect(addr).unwrap());
            b.push(l.accept().unwrap().0);
        }
        (a, b)
    }

    fn cx() -> StepCx {
        StepCx {
            rank: 0,
            seq: 0,
            coll_seq: P2P_SEQ,
            tag: 7,
            op_name: "send/recv",
            dtype: DataType::U8,
            op: ReduceOp::Sum,
            elem: 1,
            direct_bytes: usize::MAX,
            stream: false,
            bounce: vec![0; 4096],
        }
    }

    /// A frame of message `n` (total `len` bytes) at `off`, with `payload`.
    fn frame(n: u32, len: usize, off: usize, payload: &[u8]) -> Vec<u8> {
        let h = Header {
            seq: P2P_SEQ,
            tag: 7,
            flags: msg_flags(n),
            len: len as u64,
        };
        let mut v = bytemuck::bytes_of(&h).to_vec();
        v.extend_from_slice(&(off as u64).to_le_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn recv_all(link: &mut TcpLink, len: usize) -> Result<Vec<u8>> {
        let mut dst = vec![0u8; len];
        let mut m = RecvMsg::new(dst.as_mut_ptr(), None, len);
        let mut c = cx();
        let t = Instant::now();
        while !m.done {
            link.recv(&mut m, &mut c)?;
            assert!(t.elapsed() < Duration::from_secs(5), "no progress");
        }
        Ok(dst)
    }

    #[test]
    fn later_messages_may_overtake_on_other_lanes() {
        let chunk = 4096;
        let (mut tx, rx) = pairs(2);
        let mut link = TcpLink::new(rx, 1, chunk).unwrap();
        let big: Vec<u8> = (0..2 * chunk).map(|i| (i % 251) as u8).collect();
        // Message 0 (two frames) and message 1 (one frame) went entirely on
        // lane 0; message 2's second frame was written on lane 1 before its
        // first one on lane 0.
        tx[1]
            .write_all(&frame(2, 2 * chunk, chunk, &big[chunk..]))
            .unwrap();
        tx[0]
            .write_all(&frame(0, 2 * chunk, 0, &big[..chunk]))
            .unwrap();
        tx[0]
            .write_all(&frame(0, 2 * chunk, chunk, &big[chunk..]))
            .unwrap();
        tx[0].write_all(&frame(1, 3, 0, b"abc")).unwrap();
        tx[0]
            .write_all(&frame(2, 2 * chunk, 0, &big[..chunk]))
            .unwrap();
        assert_eq!(recv_all(&mut link, 2 * chunk).unwrap(), big);
        assert_eq!(recv_all(&mut link, 3).unwrap(), b"abc");
        assert_eq!(recv_all(&mut link, 2 * chunk).unwrap(), big);
    }

    /// A lane that has finished its frames of one message may already hold
    /// part of the next message's header while another lane still carries
    /// the rest of the first; the bytes of that header read so far must
    /// survive into the next receive. (Clearing them shifted lane 0's
    /// stream: "message 0 arrived where message 57 was expected", once, on
    /// the namespace cluster.)
    #[test]
    fn a_partly_read_header_survives_the_end_of_a_message() {
        let chunk = 4096;
        let a: Vec<u8> = (0..2 * chunk).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..2 * chunk).map(|i| (i % 241) as u8).collect();
        let next = frame(1, 2 * chunk, 0, &b[..chunk]);
        // 1 to 23 of the 24 bytes of a frame header.
        for cut in [1, 10, HEADER_BYTES + 7] {
            let (mut tx, rx) = pairs(2);
            let mut link = TcpLink::new(rx, 1, chunk).unwrap();
            // Message 0's first frame and the start of message 1's first
            // frame header on lane 0; lane 1 is still silent.
            tx[0]
                .write_all(&frame(0, 2 * chunk, 0, &a[..chunk]))
                .unwrap();
            tx[0].write_all(&next[..cut]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let mut dst = vec![0u8; 2 * chunk];
            let mut m = RecvMsg::new(dst.as_mut_ptr(), None, 2 * chunk);
            let mut c = cx();
            for _ in 0..4 {
                link.recv(&mut m, &mut c).unwrap();
            }
            assert!(!m.done, "cut {cut}");
            // Lane 1 brings message 0's second frame: message 0 is done.
            tx[1]
                .write_all(&frame(0, 2 * chunk, chunk, &a[chunk..]))
                .unwrap();
            let t = Instant::now();
            while !m.done {
                link.recv(&mut m, &mut c).unwrap();
                assert!(t.elapsed() < Duration::from_secs(5), "no progress");
            }
            assert_eq!(dst, a, "cut {cut}");
            // The rest of message 1.
            tx[0].write_all(&next[cut..]).unwrap();
            tx[1]
                .write_all(&frame(1, 2 * chunk, chunk, &b[chunk..]))
                .unwrap();
            assert_eq!(recv_all(&mut link, 2 * chunk).unwrap(), b, "cut {cut}");
        }
    }

    /// A link closed while its peer still has to take the end of what was
    /// sent on it, and while it holds a byte the peer sent that nobody read
    /// (a liveness probe): the peer still gets every byte, then the end of
    /// the stream, not a reset.
    #[test]
    fn closing_keeps_what_is_still_queued() {
        use std::io::Read;
        let (a, b) = pairs(1);
        let mut b = b.into_iter().next().unwrap();
        b.write_all(b"unread probe").unwrap();
        let total = 16 << 20;
        let reader = std::thread::spawn(move || {
            // The peer is busy for a while: what we send queues up.
            std::thread::sleep(Duration::from_millis(200));
            let mut got = 0usize;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match b.read(&mut buf) {
                    Ok(0) => return Ok(got),
                    Ok(n) => got += n,
                    Err(e) => return Err((got, e.to_string())),
                }
            }
        });
        let link = TcpLink::new(a, 1, DEFAULT_CHUNK).unwrap();
        let data = vec![7u8; total];
        let mut sent = 0;
        let t = Instant::now();
        while sent < total {
            match (&link.lanes.lanes[0].sock).write(&data[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no progress");
        }
        // Every byte is written into the socket, the end of them still
        // queued on this side.
        close_gracefully(&[link.lanes()]);
        drop(link);
        assert_eq!(reader.join().unwrap(), Ok(total));
    }

    #[test]
    fn a_closed_lane_does_not_hide_frames_on_another() {
        let chunk = 4096;
        let (mut tx, rx) = pairs(2);
        let mut link = TcpLink::new(rx, 1, chunk).unwrap();
        let big: Vec<u8> = (0..2 * chunk).map(|i| (i % 249) as u8).collect();
        tx[1]
            .write_all(&frame(0, 2 * chunk, 0, &big[..chunk]))
            .unwrap();
        tx[1]
            .write_all(&frame(0, 2 * chunk, chunk, &big[chunk..]))
            .unwrap();
        // The peer is done and gone: lane 0 only says so.
        drop(tx);
        assert_eq!(recv_all(&mut link, 2 * chunk).unwrap(), big);
        let r = recv_all(&mut link, 0);
        assert!(matches!(r, Err(Error::PeerLost { .. })), "{r:?}");
    }

    #[test]
    fn bad_frames_are_mismatches() {
        let chunk = 4096;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("off the grid", frame(0, 2 * chunk, 100, &[0; 100])),
            ("beyond the end", frame(0, 2 * chunk, 2 * chunk, &[])),
            (
                "an earlier message",
                frame(0x7fff, 2 * chunk, 0, &[0; 4096]),
            ),
            ("far ahead", frame(5000, 2 * chunk, 0, &[0; 4096])),
            ("another length", frame(0, 3 * chunk, 0, &[0; 4096])),
        ];
        for (what, bytes) in cases {
            let (mut tx, rx) = pairs(2);
            let mut link = TcpLink::new(rx, 1, chunk).unwrap();
            tx[0].write_all(&bytes).unwrap();
            let r = recv_all(&mut link, 2 * chunk);
            assert!(matches!(r, Err(Error::Mismatch { .. })), "{what}: {r:?}");
        }
        // A repeated frame.
        let (mut tx, rx) = pairs(2);
        let mut link = TcpLink::new(rx, 1, chunk).unwrap();
        tx[0]
            .write_all(&frame(0, 2 * chunk, 0, &[1; 4096]))
            .unwrap();
        tx[1]
            .write_all(&frame(0, 2 * chunk, 0, &[1; 4096]))
            .unwrap();
        let r = recv_all(&mut link, 2 * chunk);
        assert!(matches!(r, Err(Error::Mismatch { .. })), "repeat: {r:?}");
    }

    /// Messages of random lengths, with liveness probes between some, over
    /// 2 to 4 lanes whose bytes a relay passes on in pieces of random size
    /// (from 1 byte) with short random pauses: a header may arrive in any
    /// number of parts, on a lane that is ahead of or behind the others.
    /// Every message arrives whole and in order.
    #[test]
    fn lanes_survive_any_segmentation() {
        use std::io::Read;
        let chunk = 4096;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..6 {
            let k = 2 + round % 3;
            let (a, relay_in) = pairs(k);
            let (relay_out, b) = pairs(k);
            let relays: Vec<_> = relay_in
                .into_iter()
                .zip(relay_out)
                .map(|(mut from, to)| {
                    let mut r = next();
                    std::thread::spawn(move || {
                        let _ = to.set_nodelay(true);
                        let mut to = to;
                        let mut buf = vec![0u8; 8192];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let mut at = 0;
                            while at < n {
                                r = r.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
                                let piece = match r % 4 {
                                    0 => 1 + (r >> 8) as usize % 8,
                                    1 => 1 + (r >> 8) as usize % 40,
                                    _ => 1 + (r >> 8) as usize % 4096,
                                };
                                let end = (at + piece).min(n);
                                if to.write_all(&buf[at..end]).is_err() {
                                    return;
                                }
                                at = end;
                                if (r >> 20) % 8 == 0 {
                                    std::thread::sleep(Duration::from_micros((r >> 24) % 300));
                                }
                            }
                        }
                    })
                })
                .collect();
            let mut s = TcpLink::new(a, 1, chunk).unwrap();
            let mut rl = TcpLink::new(b, 0, chunk).unwrap();
            let msgs: Vec<Vec<u8>> = (0..24)
                .map(|m| {
                    let len = match next() % 4 {
                        0 => (next() % 64) as usize,
                        1 => chunk * (1 + (next() % 4) as usize),
                        _ => (next() % (6 * chunk as u64)) as usize,
                    };
                    (0..len).map(|i| ((i * 13 + m) % 251) as u8).collect()
                })
                .collect();
            let probes: Vec<bool> = msgs.iter().map(|_| next() % 3 == 0).collect();
            // The sender runs ahead: message m + 1 goes out while message m
            // may still be arriving.
            let (mut si, mut ri) = (0, 0);
            let mut sm = None;
            let mut dst = Vec::new();
            let mut rm = None;
            let (mut c1, mut c2) = (cx(), cx());
            let t = Instant::now();
            while ri < msgs.len() {
                if si < msgs.len() {
                    let m = sm.get_or_insert_with(|| {
                        if probes[si] {
                            s.lanes.start_probe();
                        }
                        SendMsg::new(msgs[si].as_ptr(), msgs[si].len(), msgs[si].len())
                    });
                    s.send(m, &mut c1).unwrap();
                    if m.done {
                        sm = None;
                        si += 1;
                    }
                }
                let len = msgs[ri].len();
                let m = rm.get_or_insert_with(|| {
                    dst = vec![0u8; len];
                    RecvMsg::new(dst.as_mut_ptr(), None, len)
                });
                if let Err(e) = rl.recv(m, &mut c2) {
                    panic!("round {round}, {k} lanes, message {ri} ({len} B): {e}");
                }
                if m.done {
                    rm = None;
                    assert_eq!(dst, msgs[ri], "round {round}, {k} lanes, message {ri}");
                    ri += 1;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "no progress");
            }
            drop(s);
            for r in relays {
                r.join().unwrap();
            }
        }
    }

    #[test]
    fn lanes_round_trip_with_probes() {
        let chunk = 4096;
        let (a, b) = pairs(3);
        let mut s = TcpLink::new(a, 1, chunk).unwrap();
        let mut r = TcpLink::new(b, 0, chunk).unwrap();
        for len in [0, 1, chunk - 1, chunk, chunk + 1, 10 * chunk + 17, 1 << 20] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            let mut dst = vec![0u8; len];
            let mut sm = SendMsg::new(src.as_ptr(), len, len);
            let mut rm = RecvMsg::new(dst.as_mut_ptr(), None, len);
            let (mut c1, mut c2) = (cx(), cx());
            s.lanes.start_probe();
            let t = Instant::now();
            while !(sm.done && rm.done) {
                if !sm.done {
                    s.send(&mut sm, &mut c1).unwrap();
                }
                if !rm.done {
                    r.recv(&mut rm, &mut c2).unwrap();
                }
                assert!(t.elapsed() < Duration::from_secs(5), "no progress");
            }
            assert_eq!(dst, src, "len {len}");
        }
    }
}
