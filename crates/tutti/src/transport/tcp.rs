//! The TCP transport: one non-blocking socket per peer pair, driven by the
//! executor. Payloads are read straight into the destination buffer; a
//! reducing receive reads into the bounce buffer and reduces whole elements,
//! carrying a partial element over to the next read.

use super::{msg_flags, Header, RecvMsg, SendMsg, StepCx, HEADER_BYTES};
use crate::error::{Error, Result};
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

/// A connected, non-blocking socket to one peer.
pub(crate) struct TcpLink {
    sock: TcpStream,
    peer: usize,
    /// Header being written, and how much of it has gone.
    out_hdr: [u8; HEADER_BYTES],
    out_hdr_sent: usize,
    /// Header being read, and how much of it has arrived.
    in_hdr: [u8; HEADER_BYTES],
    in_hdr_got: usize,
    /// Bytes of a partial element left over from the previous read.
    carry: [u8; 8],
    carry_len: usize,
    /// Messages sent and received on this link.
    sent_msgs: u32,
    recv_msgs: u32,
    /// A liveness probe being written (`nop_sent < HEADER_BYTES`).
    nop_sent: usize,
    /// True between the first and last byte of an outgoing message.
    in_msg: bool,
    /// When bytes last arrived, and when we last probed.
    last_heard: Instant,
    last_probe: Instant,
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
const PROBE_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

impl TcpLink {
    /// Wraps a connected socket (sets it non-blocking with TCP_NODELAY).
    pub(crate) fn new(sock: TcpStream, peer: usize) -> Result<Self> {
        sock.set_nonblocking(true)
            .and_then(|_| sock.set_nodelay(true))
            .map_err(|e| Error::io("configuring a TCP link", e))?;
        let s = socket2::SockRef::from(&sock);
        let _ = s.set_send_buffer_size(4 << 20);
        let _ = s.set_recv_buffer_size(4 << 20);
        // A peer whose host vanished sends no reset: data left unacknowledged
        // for 0.6 s fails the connection (at the next retransmission) (and the failure then spreads to
        // the other ranks at once); an idle connection is probed after a
        // second of silence. A live peer's kernel acknowledges even while
        // its process is busy, so slowness is not mistaken for death.
        let ka = socket2::TcpKeepalive::new()
            .with_time(std::time::Duration::from_secs(1))
            .with_interval(std::time::Duration::from_secs(1))
            .with_retries(1);
        let _ = s.set_tcp_keepalive(&ka);
        let _ = s.set_tcp_user_timeout(Some(std::time::Duration::from_millis(600)));
        Ok(TcpLink {
            sock,
            peer,
            out_hdr: [0; HEADER_BYTES],
            out_hdr_sent: 0,
            in_hdr: [0; HEADER_BYTES],
            in_hdr_got: 0,
            carry: [0; 8],
            carry_len: 0,
            sent_msgs: 0,
            recv_msgs: 0,
            nop_sent: HEADER_BYTES,
            in_msg: false,
            last_heard: Instant::now(),
            last_probe: Instant::now(),
        })
    }

    /// Closes the connection so that the peer notices at once.
    pub(crate) fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// The socket's descriptor, for poll().
    pub(crate) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn broken(&self, cx: &StepCx, e: io::Error) -> Error {
        cx.lost(self.peer, format!("TCP connection failed: {e}"))
    }

    /// While we wait on a silent peer, sends a probe (between messages
    /// only) so that a vanished host shows as a timed-out connection within
    /// about a second instead of after keepalive's two.
    pub(crate) fn probe(&mut self, cx: &StepCx) -> Result<()> {
        if self.in_msg || self.nop_sent < HEADER_BYTES {
            return self.flush_probe(cx);
        }
        if self.last_heard.elapsed() < PROBE_AFTER || self.last_probe.elapsed() < PROBE_AFTER {
            return Ok(());
        }
        self.last_probe = Instant::now();
        self.nop_sent = 0;
        self.flush_probe(cx)
    }

    fn flush_probe(&mut self, cx: &StepCx) -> Result<()> {
        while self.nop_sent < HEADER_BYTES {
            match self.sock.write(&bytemuck::bytes_of(&NOP)[self.nop_sent..]) {
                Ok(0) => return Err(self.broken(cx, io::ErrorKind::WriteZero.into())),
                Ok(k) => self.nop_sent += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.broken(cx, e)),
            }
        }
        Ok(())
    }

    pub(crate) fn send(&mut self, m: &mut SendMsg, cx: &mut StepCx) -> Result<bool> {
        let mut moved = false;
        if self.nop_sent < HEADER_BYTES {
            // Finish a probe before a message starts.
            self.flush_probe(cx)?;
            if self.nop_sent < HEADER_BYTES {
                return Ok(false);
            }
        }
        self.in_msg = true;
        if !m.header_sent && self.out_hdr_sent == 0 {
            let h = Header {
                seq: cx.coll_seq,
                tag: cx.tag,
                flags: msg_flags(self.sent_msgs),
                len: m.len as u64,
            };
            self.sent_msgs = self.sent_msgs.wrapping_add(1);
            self.out_hdr.copy_from_slice(bytemuck::bytes_of(&h));
        }
        loop {
            let hdr_left = if m.header_sent {
                0
            } else {
                HEADER_BYTES - self.out_hdr_sent
            };
            let pay_left = m.avail - m.sent;
            if hdr_left == 0 && pay_left == 0 {
                break;
            }
            // SAFETY: ptr+sent..ptr+avail lies in the sender's buffer, whose
            // first `avail` bytes are ready and stay untouched until done.
            let payload = unsafe { std::slice::from_raw_parts(m.ptr.add(m.sent), pay_left) };
            let r = if hdr_left > 0 {
                let bufs = [
                    IoSlice::new(&self.out_hdr[self.out_hdr_sent..]),
                    IoSlice::new(payload),
                ];
                self.sock.write_vectored(&bufs)
            } else {
                self.sock.write(payload)
            };
            match r {
                Ok(0) => return Err(self.broken(cx, io::ErrorKind::WriteZero.into())),
                Ok(mut k) => {
                    moved = true;
                    if hdr_left > 0 {
                        let h = k.min(hdr_left);
                        self.out_hdr_sent += h;
                        k -= h;
                        if self.out_hdr_sent == HEADER_BYTES {
                            m.header_sent = true;
                            self.out_hdr_sent = 0;
                        }
                    }
                    m.sent += k;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.broken(cx, e)),
            }
        }
        if m.header_sent && m.sent == m.len {
            m.done = true;
            self.in_msg = false;
        }
        Ok(moved)
    }

    pub(crate) fn recv(&mut self, m: &mut RecvMsg, cx: &mut StepCx) -> Result<bool> {
        let mut moved = false;
        while !m.header_seen {
            match self.sock.read(&mut self.in_hdr[self.in_hdr_got..]) {
                Ok(0) => return Err(self.broken(cx, io::ErrorKind::UnexpectedEof.into())),
                Ok(k) => {
                    moved = true;
                    self.last_heard = Instant::now();
                    self.in_hdr_got += k;
                    if self.in_hdr_got == HEADER_BYTES {
                        let h: Header = bytemuck::pod_read_unaligned(&self.in_hdr);
                        if h == NOP {
                            // A peer's liveness probe: nothing to deliver.
                            self.in_hdr_got = 0;
                            continue;
                        }
                        cx.check_header(&h, m.len, self.peer, self.recv_msgs)?;
                        self.recv_msgs = self.recv_msgs.wrapping_add(1);
                        self.in_hdr_got = 0;
                        m.header_seen = true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.broken(cx, e)),
            }
        }
        while m.got < m.len {
            let left = m.len - m.got;
            let r = if m.reduce_src.is_none() {
                // SAFETY: dst+got..dst+len lies in the receiver's buffer.
                let dst = unsafe { std::slice::from_raw_parts_mut(m.dst.add(m.got), left) };
                self.sock.read(dst).inspect(|&k| m.got += k)
            } else {
                let esz = cx.elem;
                let cl = self.carry_len;
                cx.bounce[..cl].copy_from_slice(&self.carry[..cl]);
                // Never read past this message: `left` counts the carried bytes too.
                let room = (left - cl).min(cx.bounce.len() - cl);
                match self.sock.read(&mut cx.bounce[cl..cl + room]) {
                    Ok(k) if k > 0 => {
                        let have = cl + k;
                        let whole = have - have % esz;
                        let b = cx.bounce.as_ptr();
                        // SAFETY: the bounce buffer holds `whole` received
                        // bytes, a whole number of elements, not overlapping dst.
                        unsafe { m.deliver(b, whole, cx) };
                        let rest = have - whole;
                        self.carry[..rest].copy_from_slice(&cx.bounce[whole..have]);
                        self.carry_len = rest;
                        Ok(k)
                    }
                    other => other,
                }
            };
            match r {
                Ok(0) => return Err(self.broken(cx, io::ErrorKind::UnexpectedEof.into())),
                Ok(_) => moved = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.broken(cx, e)),
            }
        }
        if m.got == m.len {
            m.done = true;
        }
        Ok(moved)
    }
}
