//! The bodies of tutti's fuzz targets, as plain functions so that the same
//! checks run under libFuzzer (`fuzz/run.sh`) and, on stable Rust without
//! cargo-fuzz, from `crates/tutti/tests/hostile.rs` over seeded random
//! inputs. Each one panics when tutti's answer to the bytes is wrong; no
//! input may make tutti itself panic, hang or allocate what a length field
//! claims.

use std::io::Cursor;
use tutti::fuzzing::{
    lane_frame_header, p2p_header, parse_request, probe_header, read_frame, tcp_receive,
    tcp_receive_lanes, tcp_receive_var_len, valid_header, Request, LANES_CHUNK, MAX_FRAME,
};

/// `data` as a store request payload, then as a stream of `[u32 len][payload]`
/// frames, each decoded as a request.
pub fn store_request(data: &[u8]) {
    check_request(data);
    let mut cur = Cursor::new(data);
    loop {
        let before = cur.position();
        match read_frame(&mut cur) {
            Ok(frame) => {
                assert!(
                    frame.len() <= MAX_FRAME,
                    "read_frame returned {} bytes",
                    frame.len()
                );
                assert_eq!(
                    cur.position(),
                    before + 4 + frame.len() as u64,
                    "frame length and bytes consumed disagree"
                );
                check_request(&frame);
            }
            Err(_) => break,
        }
    }
}

/// `parse_request` never panics, and what it decodes re-encodes to the same bytes.
fn check_request(req: &[u8]) {
    match parse_request(req) {
        Ok(Request::Put(k, v)) => {
            let mut enc = vec![b'P'];
            enc.extend_from_slice(&(k.len() as u16).to_le_bytes());
            enc.extend_from_slice(k);
            enc.extend_from_slice(v);
            assert_eq!(enc, req, "put does not round-trip");
        }
        Ok(Request::Get(k)) => assert!(req[0] == b'G' && &req[1..] == k),
        Ok(Request::Add(k)) => assert!(req[0] == b'A' && &req[1..] == k),
        Err(_) => {}
    }
}

/// Largest payload the TCP target expects (keeps each run fast).
const MAX_TCP_LEN: usize = 1 << 16;

/// `data[0]`: bit 0 = reducing receive; `data[1..3]`: expected payload length
/// (a multiple of 4, at most 64 KiB); `data[3] % 4` picks how the rest
/// becomes the bytes on the wire:
/// 0: as is; 1: a valid header, then the rest as payload (maybe short);
/// 2: a valid header whose length field is the next 8 bytes; 3: a valid
/// header with seq, tag and flags xored with the next 8 bytes.
/// tutti must accept exactly the well-formed messages.
pub fn tcp_message(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let reduce = data[0] & 1 == 1;
    let len = (u16::from_le_bytes([data[1], data[2]]) as usize * 4) % (MAX_TCP_LEN + 4);
    let rest = &data[4..];
    let hdr = valid_header(len);
    let wire: Vec<u8> = match data[3] % 4 {
        0 => rest.to_vec(),
        1 => [&hdr[..], rest].concat(),
        2 => {
            let mut h = hdr;
            let n = rest.len().min(8);
            h[8..8 + n].copy_from_slice(&rest[..n]);
            [&h[..], &rest[n..]].concat()
        }
        _ => {
            let mut h = hdr;
            for (i, b) in rest.iter().take(8).enumerate() {
                h[i] ^= b;
            }
            [&h[..], &rest[rest.len().min(8)..]].concat()
        }
    };
    // The header: seq (u32; the op's collective number, 0 here, or the
    // send/recv marker u32::MAX), tag (u16), flags (u16: bit 0 is the shm
    // direct-read flag, bits 1.. the message's number on its link, 0 here),
    // payload length (u64).
    // Liveness probes in front of the message are skipped by the receiver.
    let probe = probe_header();
    let sent = wire.clone();
    let mut body = &wire[..];
    while body.len() >= 16 && body[..16] == probe {
        body = &body[16..];
    }
    let wire = body;
    let seq = u32::from_le_bytes(wire.get(..4).map_or([1; 4], |b| b.try_into().unwrap()));
    let flags = wire
        .get(6..8)
        .map_or(2, |b| u16::from_le_bytes([b[0], b[1]]));
    let well_formed = wire.len() >= 16 + len
        && (seq == 0 || seq == u32::MAX)
        && wire[4..6] == hdr[4..6]
        && flags & !1 == 0
        && wire[8..16] == hdr[8..16];
    match tcp_receive(&sent, len, reduce) {
        Ok(()) => assert!(
            well_formed,
            "accepted a malformed message: {:02x?}",
            &wire[..wire.len().min(32)]
        ),
        // The harness's own sockets failing is not a verdict on the bytes.
        Err(tutti::Error::Io { ctx, .. })
            if ["bind", "addr", "connect", "accept"].contains(&ctx.as_str()) => {}
        Err(e) => assert!(
            !well_formed,
            "refused a well-formed message of {len} bytes: {e}"
        ),
    }
}

/// A message striped over 2 or 3 sockets. `data[0]`: bit 0 = reducing
/// receive, bit 1 = 3 lanes instead of 2; `data[1]`: the expected length in
/// 1 KiB steps plus `data[2] % 4 * 4` bytes (at most 64 KiB, so up to 16
/// frames); `data[3] % 4` picks how the rest becomes the bytes on the
/// sockets:
/// 0: raw: the rest, dealt out to the lanes in pieces whose sizes follow from it;
/// 1: the message: frame `j` on the lane `rest[j] % lanes`, in order on
///    each lane, a probe in front when `rest[j]` has bit 7 set; the payload
///    bytes are the frame numbers (well formed unless it is a single frame
///    that is not on lane 0);
/// 2: as 1, then one byte of one frame's header xored with a nonzero value
///    (`rest[16]` picks the frame, `rest[17]` the byte, `rest[18]` the value);
/// 3: as 1 with the frames of each lane in reverse order (still well formed:
///    order across lanes is free, and each lane carries whole frames).
/// tutti must accept exactly the well-formed messages (a flipped bit 0 of
/// the flags byte is still well formed: it is not part of the check) and
/// return their payload in place; raw bytes must not crash or hang it.
pub fn tcp_lanes(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let reduce = data[0] & 1 == 1;
    let k = if data[0] & 2 != 0 { 3 } else { 2 };
    let len = ((data[1] as usize % 65) * 1024 + (data[2] as usize % 4) * 4).min(1 << 16);
    let rest = &data[4..];
    let mut lanes: Vec<Vec<u8>> = vec![Vec::new(); k];
    let mode = data[3] % 4;
    let frames = if len <= LANES_CHUNK {
        1
    } else {
        len.div_ceil(LANES_CHUNK)
    };
    let byte = |i: usize| rest.get(i).copied().unwrap_or(i as u8);
    let mut well_formed = true;
    if mode == 0 {
        let mut i = 0;
        let mut lane = 0;
        while i < rest.len() {
            let n = (rest[i] as usize % 64 + 1).min(rest.len() - i);
            lanes[lane % k].extend_from_slice(&rest[i..i + n]);
            i += n;
            lane += 1;
        }
        well_formed = false; // not judged: random bytes
    } else {
        let mut per_lane: Vec<Vec<Vec<u8>>> = vec![Vec::new(); k];
        for j in 0..frames {
            let off = j * LANES_CHUNK;
            let flen = LANES_CHUNK.min(len - off.min(len));
            let c = byte(j);
            let mut f = Vec::new();
            if c & 0x80 != 0 {
                f.extend_from_slice(&probe_header());
                f.extend_from_slice(&[0u8; 8]);
            }
            let mut h = lane_frame_header(len, off);
            if mode == 2 && j == byte(16) as usize % frames {
                let (at, x) = (byte(17) as usize % 24, byte(18) | 1);
                h[at] ^= x;
                well_formed &= at == 6 && x == 1;
            }
            f.extend_from_slice(&h);
            f.extend(std::iter::repeat_n(j as u8, flen));
            if frames == 1 && !(c as usize).is_multiple_of(k) {
                // A message of one frame travels on lane 0 only.
                well_formed = false;
            }
            per_lane[c as usize % k].push(f);
        }
        for (lane, fs) in lanes.iter_mut().zip(per_lane.iter_mut()) {
            if mode == 3 {
                fs.reverse();
            }
            for f in fs.iter() {
                lane.extend_from_slice(f);
            }
        }
    }
    match tcp_receive_lanes(&lanes, len, reduce) {
        Ok(got) => {
            if mode != 0 {
                assert!(well_formed, "accepted a malformed striped message");
                if !reduce {
                    for (i, b) in got.iter().enumerate() {
                        assert_eq!(*b, (i / LANES_CHUNK) as u8, "byte {i} misplaced");
                    }
                }
            }
        }
        Err(tutti::Error::Io { ctx, .. })
            if ["bind", "addr", "connect", "accept"].contains(&ctx.as_str()) => {}
        Err(e) => assert!(
            mode == 0 || !well_formed,
            "refused a well-formed striped message of {len} bytes: {e}"
        ),
    }
}

/// Point-to-point messages of variable length on one socket, received one
/// after the other as point-to-point does (the header says each one's
/// length, at most the receive's; a read may take the start of the next
/// messages, which must then come out as themselves). `data[0]`: the
/// largest message, `(data[0] % 64 + 1) * 256` bytes (256 B to 16 KiB);
/// `data[1] % 4` picks how the rest becomes the bytes on the wire:
/// 0: raw (judged only by the limit: no message over it, no panic, no hang);
/// 1: messages, two bytes of the rest each: their length is the two as a
///    u16 modulo the largest plus one, a probe goes in front when the two
///    xor to an odd value, and the payload bytes follow from the message's
///    number and place (up to 16 messages);
/// 2: as 1, with one header byte of message `rest[0] % count` xored with a
///    nonzero value: the messages before it must still come out whole;
/// 3: as 1, the last message one byte over the largest: the ones before it
///    come out whole, then a mismatch.
pub fn tcp_stream(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let max = (data[0] as usize % 64 + 1) * 256;
    let mode = data[1] % 4;
    let rest = &data[2..];
    if mode == 0 {
        let (got, _) = tcp_receive_var_len(rest, max, 8);
        assert!(got.len() <= 8 && got.iter().all(|m| m.len() <= max));
        return;
    }
    let count = (rest.len() / 2).min(16);
    if count == 0 {
        return;
    }
    let mut msgs: Vec<Vec<u8>> = Vec::new();
    let mut wire = Vec::new();
    let mut starts = Vec::new();
    for j in 0..count {
        let (a, b) = (rest[2 * j], rest[2 * j + 1]);
        let mut len = u16::from_le_bytes([a, b]) as usize % (max + 1);
        if mode == 3 && j + 1 == count {
            len = max + 1;
        }
        let payload: Vec<u8> = (0..len).map(|i| (j * 31 + i * 7) as u8).collect();
        if (a ^ b) & 1 == 1 {
            wire.extend_from_slice(&probe_header());
        }
        starts.push(wire.len());
        wire.extend_from_slice(&p2p_header(len, j as u32));
        wire.extend_from_slice(&payload);
        msgs.push(payload);
    }
    let mut whole = count;
    if mode == 2 {
        let k = rest[0] as usize % count;
        let at = starts[k] + rest[1] as usize % 16;
        let x = rest.get(2 * count).copied().unwrap_or(0x5a) | 1;
        wire[at] ^= x;
        whole = k;
    }
    if mode == 3 {
        whole = count - 1;
    }
    let (got, err) = tcp_receive_var_len(&wire, max, count);
    if let Some(tutti::Error::Io { ctx, .. }) = &err {
        if ["bind", "addr", "connect", "accept"].contains(&ctx.as_str()) {
            return;
        }
    }
    assert!(got.len() <= count && got.iter().all(|m| m.len() <= max));
    assert!(
        got.len() >= whole && got[..whole] == msgs[..whole],
        "mode {mode}: {} of the first {whole} messages came out whole (error: {err:?})",
        got.iter().zip(&msgs).take_while(|(g, m)| g == m).count()
    );
    match mode {
        1 => assert!(err.is_none() && got.len() == count, "{err:?}"),
        3 => assert!(
            matches!(err, Some(tutti::Error::Mismatch { .. })),
            "a message over the limit: {err:?}"
        ),
        _ => {}
    }
}
