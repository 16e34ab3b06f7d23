//! Direct (one-shot) algorithms: every rank talks to the ranks it needs
//! directly, all messages in flight at once.
//!
//! ```text
//!   r0 <--> r1
//!    ^ \  / ^      every pair exchanges its data once
//!    |  \/  |
//!    v  /\  v
//!   r3 <--> r2
//! ```
//!
//! * **AllReduce**: every rank sends its whole input to every other rank and
//!   reduces the n inputs itself, in rank order 0, 1, ..., n-1, so every rank
//!   computes bitwise the same result. One latency step, but (n-1) times the
//!   data on every link: for small messages.
//! * **Broadcast / Scatter**: the root sends to each rank.
//! * **Reduce / Gather**: each rank sends to the root, which reduces (in rank
//!   order) or places the blocks.
//! * **ReduceScatter**: every rank sends block q of its input to rank q,
//!   which reduces the n blocks in rank order.
//! * **AllGather / AllToAll(V)**: every rank sends its block(s) to every rank.
//! * **Barrier**: dissemination: in round k, rank r signals `r + 2^k` and
//!   waits for `r - 2^k`; after ceil(log2 n) rounds everybody has heard,
//!   transitively, from everybody.
//! * **Send / Recv**: one message.

use super::{Collective, Loc, Problem, Step};

/// Builds the direct schedule, or `None` for collectives it does not do.
pub(super) fn build(p: &Problem) -> Option<Vec<Step>> {
    let n = p.nranks;
    let r = p.rank;
    let c = p.count;
    let mut s = Vec::new();
    let others = || (1..n).map(move |k| (r + k) % n);
    match p.coll {
        Collective::AllReduce => {
            for q in others() {
                s.push(Step::Send {
                    peer: q,
                    src: Loc::input(0),
                    len: c,
                });
            }
            if p.in_place {
                // Receiving into the buffer we are still sending from would
                // make every rank wait for its own sends: accumulate aside.
                reduce_in_rank_order(&mut s, n, r, c, Loc::input(0), Loc::scratch(0));
                s.push(Step::Copy {
                    src: Loc::scratch(0),
                    dst: Loc::output(0),
                    len: c,
                });
            } else {
                reduce_in_rank_order(&mut s, n, r, c, Loc::input(0), Loc::output(0));
            }
        }
        Collective::Reduce { root } => {
            if r == root {
                reduce_in_rank_order(&mut s, n, r, c, Loc::input(0), Loc::output(0));
            } else {
                s.push(Step::Send {
                    peer: root,
                    src: Loc::input(0),
                    len: c,
                });
            }
        }
        Collective::Broadcast { root } => {
            if r == root {
                for q in others() {
                    s.push(Step::Send {
                        peer: q,
                        src: Loc::output(0),
                        len: c,
                    });
                }
            } else {
                s.push(Step::Recv {
                    peer: root,
                    dst: Loc::output(0),
                    len: c,
                });
            }
        }
        Collective::AllGather => {
            for q in others() {
                s.push(Step::Send {
                    peer: q,
                    src: Loc::output(r * c),
                    len: c,
                });
                let from = (r + n - (q + n - r) % n) % n;
                s.push(Step::Recv {
                    peer: from,
                    dst: Loc::output(from * c),
                    len: c,
                });
            }
        }
        Collective::AllToAll => {
            s.push(Step::Copy {
                src: Loc::input(r * c),
                dst: Loc::output(r * c),
                len: c,
            });
            for q in others() {
                s.push(Step::Send {
                    peer: q,
                    src: Loc::input(q * c),
                    len: c,
                });
                let from = (r + n - (q + n - r) % n) % n;
                s.push(Step::Recv {
                    peer: from,
                    dst: Loc::output(from * c),
                    len: c,
                });
            }
        }
        Collective::AllToAllV => {
            let v = p.vcounts.as_ref()?;
            s.push(Step::Copy {
                src: Loc::input(v.send_displs[r]),
                dst: Loc::output(v.recv_displs[r]),
                len: v.send_counts[r],
            });
            for q in others() {
                s.push(Step::Send {
                    peer: q,
                    src: Loc::input(v.send_displs[q]),
                    len: v.send_counts[q],
                });
                let from = (r + n - (q + n - r) % n) % n;
                s.push(Step::Recv {
                    peer: from,
                    dst: Loc::output(v.recv_displs[from]),
                    len: v.recv_counts[from],
                });
            }
        }
        Collective::Gather { root } => {
            if r == root {
                s.push(Step::Copy {
                    src: Loc::input(0),
                    dst: Loc::output(r * c),
                    len: c,
                });
                for q in others() {
                    s.push(Step::Recv {
                        peer: q,
                        dst: Loc::output(q * c),
                        len: c,
                    });
                }
            } else {
                s.push(Step::Send {
                    peer: root,
                    src: Loc::input(0),
                    len: c,
                });
            }
        }
        Collective::Scatter { root } => {
            if r == root {
                s.push(Step::Copy {
                    src: Loc::input(r * c),
                    dst: Loc::output(0),
                    len: c,
                });
                for q in others() {
                    s.push(Step::Send {
                        peer: q,
                        src: Loc::input(q * c),
                        len: c,
                    });
                }
            } else {
                s.push(Step::Recv {
                    peer: root,
                    dst: Loc::output(0),
                    len: c,
                });
            }
        }
        Collective::Barrier => {
            let mut k = 1;
            while k < n {
                s.push(Step::Send {
                    peer: (r + k) % n,
                    src: Loc::input(0),
                    len: 0,
                });
                s.push(Step::Recv {
                    peer: (r + n - k) % n,
                    dst: Loc::output(0),
                    len: 0,
                });
                s.push(Step::Fence);
                k *= 2;
            }
        }
        Collective::Send { peer } => s.push(Step::Send {
            peer,
            src: Loc::input(0),
            len: c,
        }),
        Collective::Recv { peer } => s.push(Step::Recv {
            peer,
            dst: Loc::output(0),
            len: c,
        }),
        Collective::ReduceScatter => {
            for q in others() {
                s.push(Step::Send {
                    peer: q,
                    src: Loc::input(q * c),
                    len: c,
                });
            }
            reduce_in_rank_order(&mut s, n, r, c, Loc::input(r * c), Loc::output(0));
        }
    }
    Some(s)
}

/// `acc = x_0 (op) x_1 (op) ... (op) x_{n-1}` into `acc`, in rank order, with
/// this rank's own part taken locally from `own` and the others received
/// (`c` elements; two-shot's reduce-scatter shot is the same).
pub(super) fn reduce_in_rank_order(
    s: &mut Vec<Step>,
    n: usize,
    r: usize,
    c: usize,
    own: Loc,
    acc: Loc,
) {
    if r == 0 {
        s.push(Step::Copy {
            src: own,
            dst: acc,
            len: c,
        });
    } else {
        s.push(Step::Recv {
            peer: 0,
            dst: acc,
            len: c,
        });
    }
    for q in 1..n {
        if q == r {
            s.push(Step::Reduce {
                src: own,
                dst: acc,
                len: c,
            });
        } else {
            s.push(Step::RecvReduce {
                peer: q,
                src: acc,
                dst: acc,
                len: c,
            });
        }
    }
}
