//! Shared-memory ring edge cases, made deterministic with the smallest ring
//! (4 KiB) and a small direct-read threshold: messages whose header, direct
//! descriptor or payload meet the ring's wrap point.

mod common;

use common::{procs, solo, threads_with, Transport};
use tutti::{Communicator, Config};

/// Rank 0 sends messages of `sizes` bytes to rank 1, in order; rank 1 checks them.
fn exchange(c: &Communicator, sizes: &[usize]) {
    for (k, &len) in sizes.iter().enumerate() {
        let fill = |i: usize| (i * 7 + k * 13) as u8;
        if c.rank() == 0 {
            let buf: Vec<u8> = (0..len).map(fill).collect();
            c.send(&buf, 1).expect("send");
        } else {
            let mut buf = vec![0u8; len];
            c.recv(&mut buf, 0).expect("recv");
            assert!(
                buf.iter().enumerate().all(|(i, &v)| v == fill(i)),
                "message {k} ({len} bytes) arrived wrong"
            );
        }
    }
}

/// With a 4 KiB ring, one 16-byte header plus 4064 bytes of payload fill the
/// ring up to 16 bytes before its end; the next message's header lands in
/// those last 16 bytes. Sizes around that point, below and above the 4 KiB
/// direct-read threshold.
fn wrap_sizes() -> Vec<usize> {
    let mut v = Vec::new();
    for first in [4064usize, 4048, 4032, 4063, 4049] {
        for second in [8192usize, 4096, 100, 1, 0] {
            v.push(first);
            v.push(second);
        }
    }
    v
}

fn small_rings() -> Config {
    Config {
        ring_bytes: 4096,
        direct_bytes: Some(4096),
        ..Config::default()
    }
}

/// Non-direct messages of every size class around the wrap point.
#[test]
fn wrap_local_copied_messages() {
    solo("wrap_local_copied_messages", &[], || {
        let cfg = Config {
            direct_bytes: Some(usize::MAX),
            ..small_rings()
        };
        let sizes: Vec<usize> = (0..300).map(|k| (k * 37) % 5000).collect();
        threads_with(
            Communicator::init_all_with(2, cfg).expect("init_all_with"),
            |c, _| exchange(c, &sizes),
        );
    });
}

/// A direct message whose header lands in the ring's last 16 bytes: the
/// sender writes the 16-byte descriptor past the ring's end (shm.rs, send:
/// `at.add(HEADER_BYTES)` without wrapping) while the receiver reads it from
/// the ring's start (`(t + HEADER_BYTES) % cap`), so it dereferences a stale
/// address. Threads: a crash (or wrong data); processes: `process_vm_readv`
/// fails and the op fails with PeerLost.
#[test]
fn wrap_local_direct_descriptor() {
    solo("wrap_local_direct_descriptor", &[], || {
        threads_with(
            Communicator::init_all_with(2, small_rings()).expect("init_all_with"),
            |c, _| exchange(c, &wrap_sizes()),
        );
    });
}

#[test]
fn wrap_shm_direct_descriptor() {
    procs(
        "wrap_shm_direct_descriptor",
        2,
        Transport::Shm,
        &[
            ("TUTTI_SHM_RING_BYTES", "4K"),
            ("TUTTI_SHM_DIRECT_BYTES", "4K"),
        ],
        |c, _| exchange(c, &wrap_sizes()),
    );
}

/// A 64 KiB ring moves messages in 8 KiB pieces, publishing each as it
/// goes: messages of many pieces, of a ring's length or a multiple of it
/// (the sizes where the two sides used to run in lockstep), and ones whose
/// pieces straddle the wrap point, copied and reduced (a reducing receive
/// cuts its pieces at element boundaries), between processes.
#[test]
fn pieces_across_the_wrap() {
    procs(
        "pieces_across_the_wrap",
        2,
        Transport::Shm,
        &[("TUTTI_SHM_RING_BYTES", "64K")],
        pieces,
    );
}

/// The same with the rings written by non-temporal stores
/// (`TUTTI_SHM_STREAM=1`), which must be fenced before each piece is
/// published.
#[test]
fn pieces_across_the_wrap_streamed() {
    procs(
        "pieces_across_the_wrap_streamed",
        2,
        Transport::Shm,
        &[("TUTTI_SHM_RING_BYTES", "64K"), ("TUTTI_SHM_STREAM", "1")],
        pieces,
    );
}

/// AllToAll whose buffers hold just over `STREAM_FOOTPRINT` a rank, so that
/// its received messages (a quarter of it) are written with non-temporal stores
/// (`tutti::reduce::copy::STREAM_FOOTPRINT`), through a 64 KiB ring whose
/// wrap point the pieces cross; then a call just under the footprint.
#[test]
fn received_messages_streamed_by_footprint() {
    procs(
        "received_messages_streamed_by_footprint",
        2,
        Transport::Shm,
        &[("TUTTI_SHM_RING_BYTES", "64K"), ("TUTTI_SHM_STREAM", "0")],
        |c: &Communicator, _: &common::Ctx| {
            let foot = tutti::reduce::copy::STREAM_FOOTPRINT;
            // Per rank: send + receive buffers of `per` f32 each; the first
            // call is over the footprint, the second under it.
            for per in [foot / 8 + 6, foot / 8 - 2] {
                let send: Vec<f32> = (0..per).map(|i| (i * 5 + c.rank() * 7919) as f32).collect();
                let mut recv = vec![0f32; per];
                c.all_to_all(&send, &mut recv).expect("all_to_all");
                let block = per / 2;
                let ok = recv.iter().enumerate().all(|(i, &v)| {
                    let (src, j) = (i / block, i % block);
                    v == ((c.rank() * block + j) * 5 + src * 7919) as f32
                });
                assert!(ok, "all_to_all of {per} f32 a rank arrived wrong");
            }
        },
    );
}

/// Messages of `pieces_across_the_wrap`, sent and all-reduced.
fn pieces(c: &Communicator, _: &common::Ctx) {
    let sizes = [
        65536usize, 131072, 8192, 8200, 70000, 65520, 196608, 12, 100_004,
    ];
    exchange(c, &sizes);
    for (k, &bytes) in sizes.iter().enumerate() {
        let n = bytes / 4;
        let input: Vec<f32> = (0..n)
            .map(|i| ((i * 3 + k + c.rank()) % 97) as f32)
            .collect();
        let mut out = vec![0f32; n];
        c.all_reduce_into(&input, &mut out, tutti::ReduceOp::Sum)
            .expect("all_reduce");
        let want = |i: usize| ((i * 3 + k) % 97 + (i * 3 + k + 1) % 97) as f32;
        assert!(
            out.iter().enumerate().all(|(i, &v)| v == want(i)),
            "all_reduce of {bytes} bytes arrived wrong"
        );
    }
}
