//! The TCP transport.
//!
//! # Lanes and frames
//!
//! A link to a peer is `K` connected sockets, its *lanes* (`K` is chosen at
//! set-up by the rank that dials, see [`Framing`]). A message of `L` bytes
//! is cut into frames of at most `chunk` bytes; frame `j` travels on lane
//! `j % K`, so a large message is striped over every lane while a message
//! of at most one chunk (and every message when `K` = 1) is a single frame
//! on lane 0 and pays no extra latency. Every frame starts with the
//! message's 16-byte [`Header`] (the same one on every frame: collective
//! sequence number, tag, the message's number on the link, and the total
//! length `L`), so the receiver checks each frame as it checked whole
//! messages before, and a frame of another message, another op or another
//! length on any lane is a [`Error::Mismatch`]. Both sides derive the frame
//! boundaries from `L`; the first frame a receiver checks carries the
//! sender's `L`, so the sender and receiver cannot disagree on the cut
//! without the receiver noticing.
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
}

/// A liveness probe: a header with no message, which the receiver skips. It
/// gives the kernel unacknowledged data to time out on when the peer's host
/// has vanished without a word. Its sequence number and tag are reserved
/// values no message carries.
pub const NOP: Header = Header {
    seq: u32::MAX - 1,
    tag: u16::MAX,
    flags: 1,
    len: 0,
};

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
}

impl From<io::Error> for RxError {
    fn from(e: io::Error) -> Self {
        RxError::Io(e)
    }
}

/// Where received payload goes.
pub(crate) trait Sink {
    /// Room for up to `want` payload bytes of lane `lane` that belong at
    /// message offset `off`: a pointer and how many bytes may be written
    /// there, or `None` when there is no room now.
    fn space(&mut self, lane: usize, off: usize, want: usize) -> Option<(*mut u8, usize)>;
    /// `k` bytes were written to the last space given for `lane`.
    fn commit(&mut self, lane: usize, off: usize, k: usize);
    /// The frame `lane` was receiving is complete.
    fn frame_done(&mut self, _lane: usize) {}
}

/// One socket of a link and where each direction stands on it.
pub(crate) struct Lane {
    pub(crate) sock: TcpStream,
    /// Sending: the frame this lane sends next, and how much of its header
    /// and payload have gone.
    tx_next: usize,
    tx_hdr: usize,
    tx_off: usize,
    /// A liveness probe being written (`nop_sent < HEADER_BYTES`).
    nop_sent: usize,
    /// Receiving: the frame this lane receives next, its header so far,
    /// whether the header was checked, and payload bytes read.
    rx_next: usize,
    rx_hdr: [u8; HEADER_BYTES],
    rx_hdr_got: usize,
    rx_hdr_ok: bool,
    rx_read: usize,
}

impl Lane {
    fn new(sock: TcpStream) -> Lane {
        Lane {
            sock,
            tx_next: usize::MAX,
            tx_hdr: 0,
            tx_off: 0,
            nop_sent: HEADER_BYTES,
            rx_next: usize::MAX,
            rx_hdr: [0; HEADER_BYTES],
            rx_hdr_got: 0,
            rx_hdr_ok: false,
            rx_read: 0,
        }
    }

    /// Writes what is left of a probe; true when it is all out.
    fn flush_nop(&mut self) -> io::Result<bool> {
        while self.nop_sent < HEADER_BYTES {
            match (&self.sock).write(&bytemuck::bytes_of(&NOP)[self.nop_sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => self.nop_sent += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// True if this lane is between frames on the sending side.
    fn tx_between_frames(&self) -> bool {
        self.tx_hdr == 0 && self.nop_sent == HEADER_BYTES
    }
}

/// Configures a connected socket for a lane: non-blocking, `TCP_NODELAY`,
/// large buffers where the system allows them, keepalive and a user timeout.
pub(crate) fn configure(sock: &TcpStream) -> Result<()> {
    sock.set_nonblocking(true)
        .and_then(|_| sock.set_nodelay(true))
        .map_err(|e| Error::io("configuring a TCP link", e))?;
    let s = socket2::SockRef::from(sock);
    // An explicit size turns the kernel's buffer autotuning off and is
    // capped at net.core.{w,r}mem_max (often 208 KiB): ask only where the
    // cap allows the large buffer, else leave autotuning on.
    if sysctl_usize("/proc/sys/net/core/wmem_max").is_some_and(|m| m >= SOCKET_BUFFER) {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
    if sysctl_usize("/proc/sys/net/core/rmem_max").is_some_and(|m| m >= SOCKET_BUFFER) {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
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

fn sysctl_usize(path: &str) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The lanes of one link and the frame machinery over them. Each method
/// moves as much as the sockets take without blocking.
pub(crate) struct Lanes {
    pub(crate) lanes: Vec<Lane>,
    pub(crate) framing: Framing,
}

impl Lanes {
    /// Wraps connected sockets (lane `i` is `socks[i]`), configuring each.
    pub(crate) fn new(socks: Vec<TcpStream>, chunk: usize) -> Result<Lanes> {
        assert!(!socks.is_empty() && socks.len() <= MAX_LANES);
        for s in &socks {
            configure(s)?;
        }
        Ok(Lanes {
            framing: Framing {
                lanes: socks.len(),
                chunk,
            },
            lanes: socks.into_iter().map(Lane::new).collect(),
        })
    }

    /// Prepares to send a new message.
    pub(crate) fn tx_start(&mut self) {
        for (s, l) in self.lanes.iter_mut().enumerate() {
            l.tx_next = s;
            l.tx_hdr = 0;
            l.tx_off = 0;
        }
    }

    /// True once every frame of the message of `len` bytes has been written.
    pub(crate) fn tx_done(&self, len: usize) -> bool {
        let f = self.framing.frames(len);
        self.lanes.iter().all(|l| l.tx_next >= f)
    }

    /// Bytes of the message (from its start) whose frames are fully written.
    pub(crate) fn tx_prefix(&self, len: usize) -> usize {
        let f = self.framing.frames(len);
        let j = self.lanes.iter().map(|l| l.tx_next).min().unwrap_or(f);
        if j >= f {
            return len;
        }
        let (off, _) = self.framing.frame(len, j);
        off + self.lanes[j % self.lanes.len()].tx_off
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
        let frames = fr.frames(len);
        let k = self.lanes.len();
        let mut moved = false;
        for l in self.lanes.iter_mut() {
            loop {
                if l.nop_sent < HEADER_BYTES {
                    // A probe goes out whole before the next frame starts.
                    if !l.flush_nop()? {
                        break;
                    }
                    moved = true;
                }
                if l.tx_next >= frames {
                    break;
                }
                let (off, flen) = fr.frame(len, l.tx_next);
                if l.tx_hdr == HEADER_BYTES && l.tx_off == flen {
                    l.tx_next += k;
                    l.tx_hdr = 0;
                    l.tx_off = 0;
                    continue;
                }
                let at = off + l.tx_off;
                let ready = avail.min(off + flen).saturating_sub(at);
                let hdr_left = HEADER_BYTES - l.tx_hdr;
                if hdr_left == 0 && ready == 0 {
                    break; // waiting for the bytes to become ready
                }
                // SAFETY: at + ready <= avail: the caller guarantees these
                // bytes are readable and stable.
                let payload = unsafe { std::slice::from_raw_parts(ptr.add(at), ready) };
                let r = if hdr_left > 0 {
                    let bufs = [IoSlice::new(&hdr[l.tx_hdr..]), IoSlice::new(payload)];
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
        }
        Ok(moved)
    }

    /// Whether lane `i` has something to write now (for `poll`).
    pub(crate) fn tx_wants_write(&self, i: usize, len: usize, avail: usize) -> bool {
        let l = &self.lanes[i];
        if l.nop_sent < HEADER_BYTES {
            return true;
        }
        if l.tx_next >= self.framing.frames(len) {
            return false;
        }
        let (off, flen) = self.framing.frame(len, l.tx_next);
        l.tx_hdr < HEADER_BYTES || (l.tx_off < flen && avail > off + l.tx_off)
    }

    /// Prepares to receive a new message.
    pub(crate) fn rx_start(&mut self) {
        for (s, l) in self.lanes.iter_mut().enumerate() {
            l.rx_next = s;
            l.rx_hdr_got = 0;
            l.rx_hdr_ok = false;
            l.rx_read = 0;
        }
    }

    /// True once every frame of the message of `len` bytes has been read.
    pub(crate) fn rx_done(&self, len: usize) -> bool {
        let f = self.framing.frames(len);
        self.lanes.iter().all(|l| l.rx_next >= f)
    }

    /// Whether lane `i` still expects frames of the message of `len` bytes.
    pub(crate) fn rx_pending(&self, i: usize, len: usize) -> bool {
        self.lanes[i].rx_next < self.framing.frames(len)
    }

    /// Whether lane `i` has a probe to finish writing.
    pub(crate) fn nop_pending(&self, i: usize) -> bool {
        self.lanes[i].nop_sent < HEADER_BYTES
    }

    /// The longest prefix of the message delivered so far: whole frames,
    /// then the first incomplete frame's bytes minus `held(lane)` (bytes a
    /// sink holds back, such as a partial element).
    pub(crate) fn rx_prefix(&self, len: usize, held: impl Fn(usize) -> usize) -> usize {
        let f = self.framing.frames(len);
        let j = self.lanes.iter().map(|l| l.rx_next).min().unwrap_or(f);
        if j >= f {
            return len;
        }
        let (off, _) = self.framing.frame(len, j);
        let s = j % self.lanes.len();
        off + self.lanes[s].rx_read - held(s)
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
        let frames = fr.frames(ex.len);
        let k = self.lanes.len();
        let mut moved = false;
        for (s, l) in self.lanes.iter_mut().enumerate() {
            loop {
                if l.rx_next >= frames {
                    break;
                }
                if !l.rx_hdr_ok {
                    match (&l.sock).read(&mut l.rx_hdr[l.rx_hdr_got..]) {
                        Ok(0) => return Err(RxError::Io(io::ErrorKind::UnexpectedEof.into())),
                        Ok(n) => {
                            moved = true;
                            *heard = true;
                            l.rx_hdr_got += n;
                            if l.rx_hdr_got == HEADER_BYTES {
                                l.rx_hdr_got = 0;
                                let h: Header = bytemuck::pod_read_unaligned(&l.rx_hdr);
                                if h == NOP {
                                    continue; // a peer's liveness probe
                                }
                                if !ex.matches(&h) {
                                    return Err(RxError::Header(h));
                                }
                                l.rx_hdr_ok = true;
                            }
                            continue;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(RxError::Io(e)),
                    }
                }
                let (off, flen) = fr.frame(ex.len, l.rx_next);
                if l.rx_read == flen {
                    sink.frame_done(s);
                    l.rx_next += k;
                    l.rx_hdr_ok = false;
                    l.rx_read = 0;
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

    /// Starts a liveness probe on a lane that is between frames, preferring
    /// one the receiving side reads now (`rx_len`: the length of the message
    /// being received), so that a timed-out connection shows in that read.
    /// Returns false if no lane could take one.
    pub(crate) fn start_probe(&mut self, rx_len: Option<usize>) -> bool {
        let f = rx_len.map(|len| self.framing.frames(len));
        let reading = |l: &Lane| f.is_some_and(|f| l.rx_next < f);
        let pick = self
            .lanes
            .iter()
            .position(|l| l.tx_between_frames() && reading(l))
            .or_else(|| self.lanes.iter().position(|l| l.tx_between_frames()));
        match pick {
            Some(i) => {
                self.lanes[i].nop_sent = 0;
                true
            }
            None => false,
        }
    }

    /// Writes what is left of any started probe.
    pub(crate) fn flush_probes(&mut self) -> io::Result<()> {
        for l in &mut self.lanes {
            l.flush_nop()?;
        }
        Ok(())
    }

    /// Closes every lane so that the peer notices at once.
    pub(crate) fn shutdown(&self) {
        for l in &self.lanes {
            let _ = l.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The descriptor of lane `i`.
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
    /// Length of the message being received (`Some` while one is).
    rx_len: Option<usize>,
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
    pub(crate) fn new(socks: Vec<TcpStream>, peer: usize, chunk: usize) -> Result<Self> {
        Ok(TcpLink {
            lanes: Lanes::new(socks, chunk)?,
            peer,
            tx_hdr: [0; HEADER_BYTES],
            tx_active: false,
            rx_len: None,
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
            self.lanes.start_probe(self.rx_len);
        }
        self.lanes.flush_probes().map_err(|e| self.broken(cx, e))
    }

    /// Adds to `out` the descriptors (and events) to wait on while `send`
    /// (the head outgoing message, if started) and the head incoming message
    /// (`recv`, `Some(started)` if there is one) cannot move.
    pub(crate) fn pollfds(
        &self,
        send: Option<&SendMsg>,
        recv: Option<bool>,
        out: &mut Vec<libc::pollfd>,
    ) {
        for i in 0..self.lanes.lanes.len() {
            let mut events = 0;
            match (recv, self.rx_len) {
                (Some(_), Some(len)) if self.lanes.rx_pending(i, len) => events |= libc::POLLIN,
                (Some(_), None) if i == 0 => events |= libc::POLLIN,
                _ => {}
            }
            if let Some(m) = send {
                let wants = if self.tx_active {
                    self.lanes.tx_wants_write(i, m.len, m.avail)
                } else {
                    i < self.lanes.framing.frames(m.len)
                };
                if wants {
                    events |= libc::POLLOUT;
                }
            } else if self.lanes.lanes[i].nop_sent < HEADER_BYTES {
                events |= libc::POLLOUT;
            }
            if events != 0 {
                out.push(libc::pollfd {
                    fd: self.lanes.fd(i),
                    events,
                    revents: 0,
                });
            }
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
            self.lanes.tx_start();
            self.tx_active = true;
            m.header_sent = true;
        }
        // SAFETY: ptr..ptr+avail lies in the sender's buffer, whose first
        // `avail` bytes are ready and stay untouched until the message is done.
        let moved = unsafe { self.lanes.tx(m.ptr, m.len, m.avail, &self.tx_hdr) }
            .map_err(|e| self.broken(cx, e))?;
        m.sent = self.lanes.tx_prefix(m.len);
        if self.lanes.tx_done(m.len) {
            m.done = true;
            self.tx_active = false;
        }
        Ok(moved)
    }

    pub(crate) fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        if self.rx_len.is_none() {
            self.lanes.rx_start();
            self.rx_len = Some(m.len);
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
        let moved = match r {
            Ok(moved) => moved,
            Err(RxError::Io(e)) => return Err(self.broken(cx, e)),
            Err(RxError::Header(h)) => {
                return Err(header_error(cx, &h, m.len, self.peer, self.recv_msgs))
            }
        };
        m.header_seen = true;
        let carry = &self.carry;
        m.got = self.lanes.rx_prefix(m.len, |s| carry[s].1);
        if self.lanes.rx_done(m.len) {
            m.done = true;
            self.rx_len = None;
            self.recv_msgs = self.recv_msgs.wrapping_add(1);
        }
        Ok(moved)
    }
}

/// The error for a frame header `h` that does not belong to the message
/// number `n` of `len` bytes from `peer`.
pub(crate) fn header_error(cx: &StepCx, h: &Header, len: usize, peer: usize, n: u32) -> Error {
    match cx.check_header(h, len, peer, n) {
        Err(e) => e,
        Ok(()) => Error::Mismatch {
            rank: cx.rank,
            peer,
            seq: cx.seq,
            msg: format!("unexpected frame header from rank {peer}: {h:?}"),
        },
    }
}
