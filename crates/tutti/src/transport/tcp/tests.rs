//! Tests of the TCP link over loopback sockets: framing, lanes, probes,
//! malformed frames and the graceful close.

use super::{close_gracefully, TcpLink, DEFAULT_CHUNK};
use crate::error::{Error, Result};
use crate::transport::LinkOps;
use crate::transport::{msg_flags, Header, RecvMsg, SendMsg, StepCx, HEADER_BYTES, P2P_SEQ};
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

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
    StepCx::point_to_point(0, usize::MAX, vec![0; 4096])
}

/// A frame of message `n` (total `len` bytes) at `off`, with `payload`.
fn frame(n: u32, len: usize, off: usize, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        seq: P2P_SEQ,
        tag: cx().tag,
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

/// A xorshift generator from `seed` (not 0).
fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// `k` socket pairs whose bytes a relay thread per lane passes on in
/// pieces of random size (from 1 byte), with short random pauses: (the
/// sending ends, the receiving ends, the relays, which end once the
/// sending ends close).
#[allow(clippy::type_complexity)]
fn relayed(
    k: usize,
    next: &mut impl FnMut() -> u64,
) -> (
    Vec<TcpStream>,
    Vec<TcpStream>,
    Vec<std::thread::JoinHandle<()>>,
) {
    use std::io::Read;
    let (a, relay_in) = pairs(k);
    let (relay_out, b) = pairs(k);
    let relays = relay_in
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
                        if (r >> 20).is_multiple_of(8) {
                            std::thread::sleep(Duration::from_micros((r >> 24) % 300));
                        }
                    }
                }
            })
        })
        .collect();
    (a, b, relays)
}

/// Messages of random lengths, with liveness probes between some, over
/// 1 to 4 lanes whose bytes a relay passes on in pieces of random size
/// (from 1 byte) with short random pauses: a header may arrive in any
/// number of parts, on a lane that is ahead of or behind the others, and a
/// header read may take payload with it (`READ_AHEAD`), or a probe and the
/// start of the next frame. Every message arrives whole and in order.
#[test]
fn lanes_survive_any_segmentation() {
    let chunk = 4096;
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
    for round in 0..8 {
        let k = 1 + round % 4;
        let (a, b, relays) = relayed(k, &mut next);
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
        let probes: Vec<bool> = msgs.iter().map(|_| next().is_multiple_of(3)).collect();
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

/// Messages of variable length on one lane (the point-to-point link's
/// frames): each receive expects at most a given length and learns the
/// message's from its header. The sender runs far ahead, so a header read
/// (which asks for `READ_AHEAD` bytes beyond the header, not knowing where
/// the message ends) takes bytes of the messages after it, in any
/// segmentation; they stay for those messages. Every message arrives
/// whole, in order, with its own length.
#[test]
fn var_len_messages_survive_any_segmentation() {
    let chunk = 4096;
    let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
    const MAX: usize = 3 * super::lanes::READ_AHEAD;
    for round in 0..6 {
        let (a, b, relays) = relayed(1, &mut next);
        let mut s = TcpLink::new(a, 1, chunk).unwrap();
        let mut rl = TcpLink::new(b, 0, chunk).unwrap();
        assert!(rl.takes_var_len());
        let msgs: Vec<Vec<u8>> = (0..200)
            .map(|m| {
                let len = match next() % 4 {
                    0 => (next() % 40) as usize,
                    1 => MAX - (next() % 2) as usize,
                    _ => (next() % MAX as u64) as usize,
                };
                (0..len).map(|i| ((i * 31 + m) % 253) as u8).collect()
            })
            .collect();
        let probes: Vec<bool> = msgs.iter().map(|_| next().is_multiple_of(7)).collect();
        let (mut si, mut ri) = (0, 0);
        let mut sm = None;
        let mut dst = vec![0u8; MAX];
        let mut rm = None;
        let (mut c1, mut c2) = (cx(), cx());
        let t = Instant::now();
        while ri < msgs.len() {
            // Several messages out for each receive step, while they fit.
            for _ in 0..3 {
                if si == msgs.len() {
                    break;
                }
                let m = sm.get_or_insert_with(|| {
                    if probes[si] {
                        s.lanes.start_probe();
                    }
                    SendMsg::new(msgs[si].as_ptr(), msgs[si].len(), msgs[si].len())
                });
                s.send(m, &mut c1).unwrap();
                if !m.done {
                    break;
                }
                sm = None;
                si += 1;
            }
            let m = rm.get_or_insert_with(|| {
                let mut m = RecvMsg::new(dst.as_mut_ptr(), None, MAX);
                m.var_len = true;
                m
            });
            if let Err(e) = rl.recv(m, &mut c2) {
                panic!("round {round}, message {ri}: {e}");
            }
            if m.done {
                let len = m.len;
                rm = None;
                assert_eq!(len, msgs[ri].len(), "round {round}, message {ri}: length");
                assert_eq!(&dst[..len], &msgs[ri][..], "round {round}, message {ri}");
                ri += 1;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "no progress");
        }
        drop(s);
        for r in relays {
            r.join().unwrap();
        }
    }
}

/// A message of variable length longer than the receive allows is a
/// mismatch, not an overrun; a link of several lanes takes none.
#[test]
fn var_len_messages_longer_than_the_receive_are_mismatches() {
    let chunk = 4096;
    let (mut tx, rx) = pairs(1);
    let mut link = TcpLink::new(rx, 1, chunk).unwrap();
    let h = Header {
        seq: P2P_SEQ,
        tag: cx().tag,
        flags: msg_flags(0),
        len: 101,
    };
    let mut bytes = bytemuck::bytes_of(&h).to_vec();
    bytes.extend_from_slice(&[5; 101]);
    tx[0].write_all(&bytes).unwrap();
    let mut dst = vec![0u8; 100];
    let mut m = RecvMsg::new(dst.as_mut_ptr(), None, 100);
    m.var_len = true;
    let mut c = cx();
    let t = Instant::now();
    let r = loop {
        match link.recv(&mut m, &mut c) {
            Err(e) => break e,
            Ok(_) => assert!(
                !m.done && t.elapsed() < Duration::from_secs(5),
                "taken ({} B)",
                m.len
            ),
        }
    };
    assert!(matches!(r, Error::Mismatch { .. }), "{r:?}");
    assert!(!TcpLink::new(pairs(2).1, 1, chunk).unwrap().takes_var_len());
}
