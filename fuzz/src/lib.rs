//! The bodies of tutti's fuzz targets, as plain functions so that the same
//! checks run under libFuzzer (`fuzz/run.sh`) and, on stable Rust without
//! cargo-fuzz, from `crates/tutti/tests/hostile.rs` over seeded random
//! inputs. Each one panics when tutti's answer to the bytes is wrong; no
//! input may make tutti itself panic, hang or allocate what a length field
//! claims.

use std::io::Cursor;
use tutti::fuzzing::{
    parse_request, probe_header, read_frame, tcp_receive, valid_header, Request, MAX_FRAME,
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
