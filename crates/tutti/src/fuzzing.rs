//! Entry points for fuzzers and hostile-input tests: feed arbitrary bytes to
//! the decoders that face the network. Not part of the stable API.

use crate::error::Result;
use crate::reduce::{DataType, ReduceOp};
use crate::transport::tcp::TcpLink;
use crate::transport::{RecvMsg, StepCx};
use std::io::Write;
use std::net::{TcpListener, TcpStream};

pub use crate::bootstrap::store::{parse_request, read_frame, Request, MAX_FRAME};

/// Sends `bytes` over a real loopback TCP connection to a tutti TCP link that
/// expects one message of `expect_len` bytes of f32 (reduced into a buffer if
/// `reduce`), then closes the connection. Returns what the link made of it:
/// `Ok` only if the bytes were exactly a valid message for op 0.
pub fn tcp_receive(bytes: &[u8], expect_len: usize, reduce: bool) -> Result<()> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| crate::Error::io("bind", e))?;
    let addr = l.local_addr().map_err(|e| crate::Error::io("addr", e))?;
    let mut tx = TcpStream::connect(addr).map_err(|e| crate::Error::io("connect", e))?;
    let (rx, _) = l.accept().map_err(|e| crate::Error::io("accept", e))?;
    let _ = tx.write_all(bytes);
    drop(tx);
    let mut link = TcpLink::new(vec![rx], 1, crate::transport::tcp::DEFAULT_CHUNK)?;
    receive_one(&mut link, expect_len, reduce).map(|_| ())
}

/// Receives one message of `expect_len` bytes (rounded down to whole f32)
/// on `link`, reducing into zeros if `reduce`; gives up after 5 s without
/// completion.
fn receive_one(link: &mut TcpLink, expect_len: usize, reduce: bool) -> Result<Vec<u8>> {
    let expect_len = expect_len - expect_len % 4;
    let mut dst = vec![0u8; expect_len];
    let src = vec![0u8; expect_len];
    let mut cx = fuzz_cx();
    let mut m = RecvMsg::new(dst.as_mut_ptr(), reduce.then_some(src.as_ptr()), expect_len);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !m.done {
        link.recv(&mut m, &mut cx)?;
        if std::time::Instant::now() > deadline {
            return Err(crate::Error::arg("fuzz harness: no progress"));
        }
    }
    Ok(dst)
}

/// Like [`tcp_receive`], for the point-to-point link (one socket), whose
/// messages have variable length: `bytes` arrive (written by a thread of
/// their own, then the socket closes) and up to `count` messages of at
/// most `max_len` bytes each are received from them, one after the other,
/// as point-to-point receives them. Returns the messages received, and the
/// error that stopped the stream before `count` if any.
pub fn tcp_receive_var_len(
    bytes: &[u8],
    max_len: usize,
    count: usize,
) -> (Vec<Vec<u8>>, Option<crate::Error>) {
    let setup = || -> Result<(TcpStream, TcpStream)> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| crate::Error::io("bind", e))?;
        let addr = l.local_addr().map_err(|e| crate::Error::io("addr", e))?;
        let tx = TcpStream::connect(addr).map_err(|e| crate::Error::io("connect", e))?;
        let (rx, _) = l.accept().map_err(|e| crate::Error::io("accept", e))?;
        Ok((tx, rx))
    };
    let (tx, rx) = match setup() {
        Ok(p) => p,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let bytes = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        let mut tx = tx;
        let _ = tx.write_all(&bytes);
    });
    let mut got = Vec::new();
    let err = match TcpLink::new(vec![rx], 1, crate::transport::tcp::DEFAULT_CHUNK) {
        Err(e) => Some(e),
        Ok(mut link) => {
            let mut cx = p2p_cx();
            let mut dst = vec![0u8; max_len];
            let mut err = None;
            for _ in 0..count {
                let mut m = RecvMsg::new(dst.as_mut_ptr(), None, max_len);
                m.var_len = true;
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                let r = loop {
                    if let Err(e) = crate::transport::LinkOps::recv(&mut link, &mut m, &mut cx) {
                        break Err(e);
                    }
                    if m.done {
                        break Ok(());
                    }
                    if std::time::Instant::now() > deadline {
                        break Err(crate::Error::arg("fuzz harness: no progress"));
                    }
                };
                match r {
                    Ok(()) if m.len > max_len => {
                        err = Some(crate::Error::Internal(format!(
                            "the link took a message of {} bytes into a receive of {max_len}",
                            m.len
                        )));
                        break;
                    }
                    Ok(()) => got.push(dst[..m.len].to_vec()),
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            err
        }
    };
    let _ = writer.join();
    (got, err)
}

/// The 16-byte header of message `n` (counted from 0 on its link) of the
/// point-to-point channel, `len` bytes long ([`tcp_receive_var_len`]).
pub fn p2p_header(len: usize, n: u32) -> [u8; 16] {
    let h = crate::transport::Header {
        seq: crate::transport::P2P_SEQ,
        tag: p2p_cx().tag,
        flags: crate::transport::msg_flags(n),
        len: len as u64,
    };
    bytemuck::cast(h)
}

fn p2p_cx() -> StepCx {
    StepCx::point_to_point(0, usize::MAX, Vec::new())
}

/// Frame size of the multi-lane harness ([`tcp_receive_lanes`]).
pub const LANES_CHUNK: usize = 4096;

/// Like [`tcp_receive`], for a link of `lanes.len()` sockets (2 to 8) with
/// frames of [`LANES_CHUNK`] bytes: `lanes[i]` is what arrives on socket
/// `i`, after which every socket is closed. Returns the received message
/// (the reduced one for `reduce`, whose local operand is zeros), or what the
/// link made of the bytes.
pub fn tcp_receive_lanes(lanes: &[Vec<u8>], expect_len: usize, reduce: bool) -> Result<Vec<u8>> {
    assert!((2..=crate::transport::tcp::MAX_LANES).contains(&lanes.len()));
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| crate::Error::io("bind", e))?;
    let addr = l.local_addr().map_err(|e| crate::Error::io("addr", e))?;
    let mut rx = Vec::new();
    let mut writers = Vec::new();
    for bytes in lanes {
        let tx = TcpStream::connect(addr).map_err(|e| crate::Error::io("connect", e))?;
        rx.push(l.accept().map_err(|e| crate::Error::io("accept", e))?.0);
        let bytes = bytes.clone();
        // A writer per socket: a lane's bytes may exceed its buffers.
        writers.push(std::thread::spawn(move || {
            let mut tx = tx;
            let _ = tx.write_all(&bytes);
        }));
    }
    let mut link = TcpLink::new(rx, 1, LANES_CHUNK)?;
    let r = receive_one(&mut link, expect_len, reduce);
    drop(link);
    for w in writers {
        let _ = w.join();
    }
    r
}

/// The 24-byte frame header of a multi-lane link: [`valid_header`]`(len)`
/// followed by the frame's offset.
pub fn lane_frame_header(len: usize, off: usize) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[..16].copy_from_slice(&valid_header(len));
    h[16..].copy_from_slice(&(off as u64).to_le_bytes());
    h
}

fn fuzz_cx() -> StepCx {
    StepCx {
        rank: 0,
        seq: 0,
        coll_seq: 0,
        tag: crate::transport::make_tag(
            crate::CollKind::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            0,
        ),
        op_name: "all_reduce",
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        elem: 4,
        direct_bytes: usize::MAX,
        stream: false,
        bounce: vec![0u8; 4096],
    }
}

/// The 16 bytes of a TCP liveness probe, which receivers skip.
pub fn probe_header() -> [u8; 16] {
    bytemuck::cast(crate::transport::tcp::NOP)
}

/// The 16-byte header a valid op-0 f32 all_reduce message of `len` bytes starts with.
pub fn valid_header(len: usize) -> [u8; 16] {
    let h = crate::transport::Header {
        seq: 0,
        tag: crate::transport::make_tag(
            crate::CollKind::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            0,
        ),
        flags: 0,
        len: len as u64,
    };
    bytemuck::cast(h)
}
