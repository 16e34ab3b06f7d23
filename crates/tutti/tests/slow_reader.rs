//! A live rank that is busy elsewhere (computing, saving a checkpoint) and
//! does not read its TCP sockets for a while must not lose its connections:
//! its peers' data waits in the kernel (the receiver's window closes) until
//! it reads again. Until 2026-12-06 every socket had a 0.6 s
//! `TCP_USER_TIMEOUT`, which Linux also applies to a closed window, so a
//! peer that sent a few MiB to a rank busy for more than about a second
//! had its connection cut ("Connection timed out"), and the job failed.

mod common;

use common::{Ctx, Transport};
use tutti::{Communicator, ReduceOp};

/// How long the busy rank stays away from its sockets: well past the old
/// cut-off (0.6 s of a closed window, found after the first window probe).
const BUSY: std::time::Duration = std::time::Duration::from_millis(2500);

/// 64 MiB: far more than the kernel buffers of a socket pair take before
/// the receiver reads (the window closes).
const COUNT: usize = 16 << 20;

/// The last rank is busy before it joins an AllReduce and a receive that
/// the others start at once; both must complete, with the right data.
fn busy_receiver(comm: &Communicator, _ctx: &Ctx) {
    let (n, r) = (comm.size(), comm.rank());
    let busy = n - 1;
    if r == busy {
        std::thread::sleep(BUSY);
    }
    let mut v: Vec<f32> = (0..COUNT).map(|i| (i % 1000) as f32 + r as f32).collect();
    comm.all_reduce(&mut v, ReduceOp::Sum)
        .expect("all_reduce beside a rank that was busy");
    let ranks: f32 = (0..n).map(|q| q as f32).sum();
    for (i, x) in v.iter().enumerate().step_by(4097) {
        assert_eq!(*x, n as f32 * (i % 1000) as f32 + ranks, "element {i}");
    }
    // Point-to-point: rank 0 sends 64 MiB to the busy rank, which only
    // posts its receive after being busy again.
    if r == 0 {
        let data: Vec<u8> = (0..COUNT * 4).map(|i| (i % 251) as u8).collect();
        comm.send(&data, busy).expect("send to a rank that is busy");
    } else if r == busy {
        std::thread::sleep(BUSY);
        let mut got = vec![0u8; COUNT * 4];
        comm.recv(&mut got, 0).expect("recv after being busy");
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
    comm.barrier().expect("barrier");
}

rank_test!(busy_receiver_tcp_2, Transport::Tcp, 2, busy_receiver);
rank_test!(busy_receiver_tcp_3, Transport::Tcp, 3, busy_receiver);
