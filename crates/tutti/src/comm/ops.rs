//! The collectives: a typed API over slices, asynchronous variants over owned
//! vectors, and the untyped entry points ([`RawCall`]) for the C and Python
//! bindings. All of them end in one place, the engine's check
//! (`engine/call.rs`), which validates lengths, roots and peers before
//! anything is sent.

use super::{Communicator, Options, RawCall, Work};
use crate::algo::{Collective, VCounts};
use crate::engine::Completion;
use crate::error::{Error, Result};
use crate::reduce::{Element, ReduceOp};
use std::sync::Arc;

fn ptr<T>(s: &[T]) -> *const u8 {
    s.as_ptr() as *const u8
}

fn mptr<T>(s: &mut [T]) -> *mut u8 {
    s.as_mut_ptr() as *mut u8
}

/// A call whose send and receive buffer are one slice (in place).
fn in_place<T: Element>(coll: Collective, op: ReduceOp, buf: &mut [T]) -> RawCall {
    let p = mptr(buf);
    RawCall {
        coll,
        dtype: T::DTYPE,
        op,
        count: buf.len(),
        send: p,
        send_len: std::mem::size_of_val(buf),
        recv: p,
        recv_len: std::mem::size_of_val(buf),
        vcounts: None,
    }
}

fn call<T: Element>(
    coll: Collective,
    op: ReduceOp,
    count: usize,
    send: &[T],
    recv: &mut [T],
) -> RawCall {
    RawCall {
        coll,
        dtype: T::DTYPE,
        op,
        count,
        send: ptr(send),
        send_len: std::mem::size_of_val(send),
        recv: mptr(recv),
        recv_len: std::mem::size_of_val(recv),
        vcounts: None,
    }
}

impl Communicator {
    /// Runs an untyped call to completion.
    ///
    /// # Safety
    /// `send` must be valid for reads of `send_len` bytes and `recv` for
    /// writes of `recv_len` bytes, and neither may be accessed by anything
    /// else until this returns.
    pub unsafe fn run_raw(&self, c: &RawCall, opts: &Options) -> Result<()> {
        if let Some(p) = p2p_of(c) {
            let p = p?;
            self.not_self(if p.send { "send" } else { "recv" }, p.peer)?;
            // SAFETY: the caller's promise covers the buffer for this call.
            let (w, _) = unsafe { self.post_p2p_raw(&[p], opts.timeout) }
                .pop()
                .expect("one op");
            return w.wait();
        }
        self.engine.run_raw(c, opts)
    }

    /// Issues an untyped call asynchronously.
    ///
    /// # Safety
    /// As for [`run_raw`](Communicator::run_raw), and the buffers must stay
    /// valid and untouched until the returned [`Work`] reports completion.
    pub unsafe fn submit_raw(&self, c: &RawCall, opts: &Options) -> Work<()> {
        let done = Arc::new(Completion::default());
        match p2p_of(c) {
            // SAFETY: the caller's promise covers the buffer until the Work completes.
            Some(Ok(p)) => {
                return unsafe { self.post_p2p_raw(&[p], opts.timeout) }
                    .pop()
                    .expect("one op")
                    .0
            }
            Some(Err(e)) => {
                done.complete(Err(e));
                return Work::new(done, ());
            }
            None => {}
        }
        match self.engine.check(c, opts) {
            Ok(op) => self.engine.submit(op, done.clone()),
            Err(e) => done.complete(Err(e)),
        }
        Work::new(done, ())
    }

    /// `coll` of `count` elements from `send` into `recv` with `opts`: the
    /// typed calls' common path, for callers inside the crate that need a
    /// collective and options no public method pairs (the calibration).
    pub(crate) fn run_slices<T: Element>(
        &self,
        coll: Collective,
        op: ReduceOp,
        count: usize,
        send: &[T],
        recv: &mut [T],
        opts: &Options,
    ) -> Result<()> {
        self.blocking(call(coll, op, count, send, recv), opts)
    }

    fn blocking(&self, c: RawCall, opts: &Options) -> Result<()> {
        // SAFETY: every typed caller builds `c` from slices it borrows for
        // the duration of this call (shared for send, exclusive for recv).
        unsafe { self.run_raw(&c, opts) }
    }

    fn issue<B>(&self, c: RawCall, bufs: B) -> Work<B> {
        self.issue_with(c, bufs, &Options::default())
    }

    fn issue_with<B>(&self, c: RawCall, bufs: B, opts: &Options) -> Work<B> {
        let done = Arc::new(Completion::default());
        match self.engine.check(&c, opts) {
            Ok(op) => self.engine.submit(op, done.clone()),
            Err(e) => done.complete(Err(e)),
        }
        // The vectors' heap memory does not move when they move into Work,
        // and Work keeps them alive (and blocks in drop) until the op is done.
        Work::new(done, bufs)
    }

    // ---- AllReduce ----

    /// Reduces `buf` across all ranks, in place: every rank ends with the result.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_with(buf, op, &Options::default())
    }

    /// [`all_reduce`](Communicator::all_reduce) with per-call options
    /// (algorithm, timeout, a 16-bit wire for f32: [`Options::wire`]).
    ///
    /// ```
    /// use tutti::{Communicator, DataType, Options, ReduceOp};
    ///
    /// let comms = Communicator::init_all(2)?;
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let mut g = vec![0.5f32 + c.rank() as f32; 1000];
    ///             let bf16 = Options::default().wire(DataType::Bf16);
    ///             c.all_reduce_with(&mut g, ReduceOp::Sum, &bf16).unwrap();
    ///             assert!(g.iter().all(|&x| x == 2.0)); // 0.5 + 1.5, exact in bf16
    ///         });
    ///     }
    /// });
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn all_reduce_with<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        opts: &Options,
    ) -> Result<()> {
        let c = in_place(Collective::AllReduce, op, buf);
        self.blocking(c, opts)
    }

    /// Reduces `send` across all ranks into `recv` (same length).
    pub fn all_reduce_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.blocking(
            call(Collective::AllReduce, op, send.len(), send, recv),
            &Options::default(),
        )
    }

    /// Asynchronous in-place AllReduce; `wait()` returns the vector with the result.
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.all_reduce_async_with(buf, op, &Options::default())
    }

    /// [`all_reduce_async`](Communicator::all_reduce_async) with per-call
    /// options (the timeout, an algorithm, [`Options::wire`]).
    pub fn all_reduce_async_with<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
        opts: &Options,
    ) -> Work<Vec<T>> {
        let c = in_place(Collective::AllReduce, op, &mut buf);
        self.issue_with(c, buf, opts)
    }

    // ---- Broadcast ----

    /// Copies the root's `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let c = in_place(Collective::Broadcast { root }, ReduceOp::Sum, buf);
        self.blocking(c, &Options::default())
    }

    /// Asynchronous [`broadcast`](Communicator::broadcast).
    pub fn broadcast_async<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        let c = in_place(Collective::Broadcast { root }, ReduceOp::Sum, &mut buf);
        self.issue(c, buf)
    }

    // ---- Reduce ----

    /// Reduces every rank's `send` into the root's `recv` (same length as
    /// `send` on the root; ignored, and may be empty, elsewhere).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.reduce_with(send, recv, op, root, &Options::default())
    }

    /// [`reduce`](Communicator::reduce) with per-call options
    /// ([`Options::wire`] among them).
    pub fn reduce_with<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
        opts: &Options,
    ) -> Result<()> {
        let recv = if self.rank() == root { recv } else { &mut [] };
        self.blocking(
            call(Collective::Reduce { root }, op, send.len(), send, recv),
            opts,
        )
    }

    /// Asynchronous [`reduce`](Communicator::reduce); returns `(send, recv)`.
    pub fn reduce_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let c = {
            let r: &mut [T] = if self.rank() == root {
                &mut recv
            } else {
                &mut []
            };
            call(Collective::Reduce { root }, op, send.len(), &send, r)
        };
        self.issue(c, (send, recv))
    }

    // ---- AllGather ----

    /// Every rank's `send` (all the same length) lands in every rank's `recv`,
    /// in rank order; `recv.len() == size() * send.len()`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.blocking(
            call(Collective::AllGather, ReduceOp::Sum, send.len(), send, recv),
            &Options::default(),
        )
    }

    /// Asynchronous [`all_gather`](Communicator::all_gather); returns `(send, recv)`.
    pub fn all_gather_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let c = call(
            Collective::AllGather,
            ReduceOp::Sum,
            send.len(),
            &send,
            &mut recv,
        );
        self.issue(c, (send, recv))
    }

    // ---- ReduceScatter ----

    /// Reduces `send` (`size() * recv.len()` elements) across ranks; rank r
    /// receives block r of the result.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_with(send, recv, op, &Options::default())
    }

    /// [`reduce_scatter`](Communicator::reduce_scatter) with per-call
    /// options ([`Options::wire`] among them).
    pub fn reduce_scatter_with<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        opts: &Options,
    ) -> Result<()> {
        self.blocking(
            call(Collective::ReduceScatter, op, recv.len(), send, recv),
            opts,
        )
    }

    /// Asynchronous [`reduce_scatter`](Communicator::reduce_scatter); returns `(send, recv)`.
    pub fn reduce_scatter_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
        op: ReduceOp,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let c = call(Collective::ReduceScatter, op, recv.len(), &send, &mut recv);
        self.issue(c, (send, recv))
    }

    // ---- AllToAll ----

    /// Block p of `send` goes to rank p, where it becomes block r (this
    /// rank) of `recv`. Both hold `size()` equal blocks.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        if !send.len().is_multiple_of(n) {
            return Err(Error::arg(format!(
                "all_to_all: the send buffer has {} elements, not a multiple of the {n} ranks",
                send.len()
            )));
        }
        self.blocking(
            call(
                Collective::AllToAll,
                ReduceOp::Sum,
                send.len() / n,
                send,
                recv,
            ),
            &Options::default(),
        )
    }

    /// Asynchronous [`all_to_all`](Communicator::all_to_all); returns `(send, recv)`.
    pub fn all_to_all_async<T: Element>(
        &self,
        send: Vec<T>,
        mut recv: Vec<T>,
    ) -> Work<(Vec<T>, Vec<T>)> {
        let n = self.size();
        let c = call(
            Collective::AllToAll,
            ReduceOp::Sum,
            send.len() / n,
            &send,
            &mut recv,
        );
        if !send.len().is_multiple_of(n) {
            let done = Arc::new(Completion::default());
            done.complete(Err(Error::arg(
                "all_to_all: send length is not a multiple of the rank count",
            )));
            return Work::new(done, (send, recv));
        }
        self.issue(c, (send, recv))
    }

    /// AllToAll with per-peer counts and displacements (in elements): this
    /// rank sends `send[send_displs[p]..][..send_counts[p]]` to rank p and
    /// receives rank p's block into `recv[recv_displs[p]..][..recv_counts[p]]`.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let mut c = call(Collective::AllToAllV, ReduceOp::Sum, 0, send, recv);
        c.vcounts = Some(VCounts {
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.to_vec(),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.to_vec(),
        });
        self.blocking(c, &Options::default())
    }

    // ---- Gather / Scatter ----

    /// Every rank's `send` lands in the root's `recv` (`size() * send.len()`
    /// elements, in rank order; ignored elsewhere).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let recv = if self.rank() == root { recv } else { &mut [] };
        self.blocking(
            call(
                Collective::Gather { root },
                ReduceOp::Sum,
                send.len(),
                send,
                recv,
            ),
            &Options::default(),
        )
    }

    /// Block p of the root's `send` (`size() * recv.len()` elements; ignored
    /// elsewhere) lands in rank p's `recv`.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let send = if self.rank() == root { send } else { &[] };
        self.blocking(
            call(
                Collective::Scatter { root },
                ReduceOp::Sum,
                recv.len(),
                send,
                recv,
            ),
            &Options::default(),
        )
    }

    // ---- Barrier (Send and Recv: see p2p.rs) ----

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.blocking(
            call::<u8>(Collective::Barrier, ReduceOp::Sum, 0, &[], &mut []),
            &Options::default(),
        )
    }

    /// Asynchronous [`barrier`](Communicator::barrier).
    pub fn barrier_async(&self) -> Work<()> {
        self.issue(
            call::<u8>(Collective::Barrier, ReduceOp::Sum, 0, &[], &mut []),
            (),
        )
    }
}

/// A raw Send or Recv as a point-to-point op (tag 0, exact length), after
/// checking its buffer; `None` for collectives.
fn p2p_of(c: &RawCall) -> Option<Result<super::RawP2p>> {
    let (send, peer) = match c.coll {
        Collective::Send { peer } => (true, peer),
        Collective::Recv { peer } => (false, peer),
        _ => return None,
    };
    let (ptr, have) = if send {
        (c.send as *mut u8, c.send_len)
    } else {
        (c.recv, c.recv_len)
    };
    let what = if send { "send" } else { "recv" };
    Some(
        c.count
            .checked_mul(c.dtype.size())
            .filter(|&len| len <= have)
            .map(|len| super::RawP2p {
                send,
                peer: Some(peer),
                ptr,
                len,
                tag: 0,
                exact: true,
            })
            .ok_or_else(|| {
                Error::arg(format!(
                    "{what}: {} elements of {} do not fit its buffer of {have} bytes",
                    c.count, c.dtype
                ))
            }),
    )
}
