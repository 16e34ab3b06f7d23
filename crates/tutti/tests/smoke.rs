use tutti::{Communicator, ReduceOp};

#[test]
fn local_all_collectives() {
    for n in [1usize, 2, 3, 4] {
        let comms = Communicator::init_all(n).unwrap();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let r = c.rank();
                    for len in [0usize, 1, 7, 1000, 300_000] {
                        let mut x: Vec<f64> = (0..len).map(|i| (r * 1000 + i) as f64).collect();
                        c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                        for (i, v) in x.iter().enumerate() {
                            let want: f64 = (0..n).map(|q| (q * 1000 + i) as f64).sum();
                            assert_eq!(*v, want, "n={n} len={len} i={i}");
                        }
                        let send: Vec<i32> = (0..len).map(|i| (r * 7 + i) as i32).collect();
                        let mut recv = vec![0i32; len * n];
                        c.all_gather(&send, &mut recv).unwrap();
                        for q in 0..n {
                            for i in 0..len {
                                assert_eq!(recv[q * len + i], (q * 7 + i) as i32);
                            }
                        }
                        let mut out = vec![0i32; len];
                        let big: Vec<i32> = (0..len * n).map(|i| (i + r) as i32).collect();
                        c.reduce_scatter(&big, &mut out, ReduceOp::Sum).unwrap();
                        for i in 0..len {
                            let want: i32 = (0..n).map(|q| (r * len + i + q) as i32).sum();
                            assert_eq!(out[i], want);
                        }
                        let mut b: Vec<u8> = (0..len).map(|i| if r == n - 1 { (i % 251) as u8 } else { 0 }).collect();
                        c.broadcast(&mut b, n - 1).unwrap();
                        assert!(b.iter().enumerate().all(|(i, v)| *v == (i % 251) as u8));
                        c.barrier().unwrap();
                    }
                });
            }
        });
    }
}
