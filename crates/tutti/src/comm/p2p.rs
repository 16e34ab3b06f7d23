//! Point-to-point calls: send, receive, and batches of both. They run on
//! the communicator's point-to-point channel ([`crate::p2p`]), beside the
//! collectives and not behind them, and match per (peer, tag) in order.

use super::{Communicator, Work};
use crate::engine::Completion;
use crate::error::{Error, Result};
use crate::p2p::{Done, Post, PostKind, RecvStatus};
use crate::reduce::Element;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// One send or receive of a batch ([`Communicator::batch_isend_irecv`],
/// like an entry of torch's `batch_isend_irecv` or a call between NCCL's
/// group start and end). It borrows its buffer for the batch's duration.
#[derive(Debug)]
pub struct P2pOp<'a> {
    raw: RawP2p,
    _buf: PhantomData<&'a mut [u8]>,
}

impl<'a> P2pOp<'a> {
    /// Sends `buf` to `peer` with `tag`.
    pub fn send<T: Element>(buf: &'a [T], peer: usize, tag: u32) -> Self {
        P2pOp {
            raw: RawP2p {
                send: true,
                peer: Some(peer),
                ptr: buf.as_ptr() as *mut u8,
                len: std::mem::size_of_val(buf),
                tag,
                exact: true,
            },
            _buf: PhantomData,
        }
    }

    /// Receives a message of exactly `buf.len()` elements from `src` with `tag`.
    pub fn recv<T: Element>(buf: &'a mut [T], src: usize, tag: u32) -> Self {
        P2pOp {
            raw: RawP2p {
                send: false,
                peer: Some(src),
                ptr: buf.as_mut_ptr() as *mut u8,
                len: std::mem::size_of_val(buf),
                tag,
                exact: true,
            },
            _buf: PhantomData,
        }
    }

    /// Receives a message of at most `buf.len()` elements with `tag` from
    /// `src`, or from whichever rank's message arrives first (`None`); the
    /// batch's result says who sent it and how long it is.
    pub fn recv_from<T: Element>(buf: &'a mut [T], src: Option<usize>, tag: u32) -> Self {
        P2pOp {
            raw: RawP2p {
                send: false,
                peer: src,
                ptr: buf.as_mut_ptr() as *mut u8,
                len: std::mem::size_of_val(buf),
                tag,
                exact: false,
            },
            _buf: PhantomData,
        }
    }
}

/// An untyped send or receive, for the C and Python bindings
/// ([`Communicator::post_p2p_raw`]).
#[derive(Clone, Copy, Debug)]
pub struct RawP2p {
    /// A send (else a receive).
    pub send: bool,
    /// The peer: a send's destination, a receive's source (`None`: any rank;
    /// receives only).
    pub peer: Option<usize>,
    /// The buffer.
    pub ptr: *mut u8,
    /// Its length in bytes: a send's message, a receive's capacity.
    pub len: usize,
    /// The tag; messages match per (peer, tag) in order.
    pub tag: u32,
    /// Receives: the message must fill the buffer exactly (else: at most).
    pub exact: bool,
}

// SAFETY: RawP2p only carries an address; the unsafe entry point that uses
// it states the caller's obligations.
unsafe impl Send for RawP2p {}

/// A posted raw send or receive: its completion and, for a receive, what
/// arrived.
#[derive(Debug)]
pub struct P2pHandle {
    /// A receive's completion, which holds its status.
    recv: Option<Arc<Completion>>,
}

impl P2pHandle {
    /// What the receive got (`None` for sends, and before the op's
    /// [`Work`] completed). Read it after the op completed without error.
    pub fn status(&self) -> Option<RecvStatus> {
        self.recv.as_ref().and_then(|d| d.status())
    }
}

/// A message received by [`Communicator::recv_from_async`]: the buffer and
/// who sent what.
#[derive(Debug)]
pub struct Received<T> {
    /// The buffer; its first [`RecvStatus::bytes`] bytes hold the message.
    pub buf: Vec<T>,
    done: Arc<Completion>,
}

impl<T> Received<T> {
    /// Who sent the message, its tag and its length.
    pub fn status(&self) -> RecvStatus {
        self.done
            .status()
            .expect("a message received without error has its status")
    }
}

impl Communicator {
    /// Checks `op` and makes its post, completing through `done` (or the
    /// error it completes with).
    fn post_of(&self, op: &RawP2p, timeout: Option<Duration>, done: Done) -> Result<Post> {
        self.check_op(op)?;
        Ok(Post {
            kind: if op.send {
                PostKind::Send {
                    peer: op.peer.expect("checked above"),
                }
            } else {
                PostKind::Recv {
                    src: op.peer,
                    exact: op.exact,
                }
            },
            ptr: op.ptr,
            len: op.len,
            tag: op.tag,
            timeout: timeout.unwrap_or(self.config().timeout),
            done,
        })
    }

    /// The error of a malformed op, if it is.
    fn check_op(&self, op: &RawP2p) -> Result<()> {
        let n = self.size();
        let what = if op.send { "send" } else { "recv" };
        match op.peer {
            Some(p) if p >= n => {
                return Err(Error::arg(format!(
                    "{what}: peer {p} is out of range for a communicator of {n} ranks"
                )))
            }
            None if op.send => {
                return Err(Error::arg("send: a send needs a destination rank"));
            }
            _ => {}
        }
        if op.ptr.is_null() && op.len > 0 {
            return Err(Error::arg(format!(
                "{what}: null buffer of {} bytes",
                op.len
            )));
        }
        Ok(())
    }

    /// A blocking call of at most one send and one receive, each with its
    /// peer, by the lean lane ([`crate::p2p::LeanOp`]); `None` where it
    /// does not take it (nothing was done).
    fn run_lean(
        &self,
        ops: &[RawP2p],
        timeout: Option<Duration>,
    ) -> Option<Result<Vec<Option<RecvStatus>>>> {
        if ops.is_empty() {
            return None;
        }
        let (mut si, mut ri) = (None, None);
        for (i, o) in ops.iter().enumerate() {
            let slot = if o.send { &mut si } else { &mut ri };
            if slot.replace(i).is_some() || o.peer.is_none() || self.check_op(o).is_err() {
                return None;
            }
        }
        let timeout = timeout.unwrap_or(self.config().timeout);
        let side = |i: usize| {
            let o = &ops[i];
            crate::p2p::LeanOp {
                peer: o.peer.expect("checked above"),
                ptr: o.ptr,
                len: o.len,
                tag: o.tag,
                exact: o.exact,
                timeout,
            }
        };
        let (s, r) = (si.map(side), ri.map(side));
        let post = |done| {
            let ro = &ops[ri.expect("a receive goes the usual way")];
            self.post_of(ro, Some(timeout), done)
                .expect("checked above")
        };
        let got = match self.p2p.lean(s.as_ref(), r.as_ref(), post)? {
            crate::p2p::Lean::Done(r) => r,
            crate::p2p::Lean::Posted(done) => self
                .p2p
                .wait_all(std::slice::from_ref(&*done))
                .and_then(|()| {
                    done.status()
                        .map(Some)
                        .ok_or_else(|| Error::Internal("a receive done without its status".into()))
                }),
        };
        Some(got.map(|status| {
            let mut out = vec![None; ops.len()];
            if let Some(i) = ri {
                out[i] = status;
            }
            out
        }))
    }

    /// A blocking call with this rank itself as its peer could never
    /// complete (nothing else would post its match): an argument error.
    pub(super) fn not_self(&self, what: &str, peer: Option<usize>) -> Result<()> {
        match peer {
            Some(p) if p == self.rank() => Err(Error::arg(format!(
                "{what}: peer {p} is this rank itself, and a blocking {what} to or from \
                 oneself never completes; post it together with its match through \
                 batch_isend_irecv (or the _async calls)"
            ))),
            _ => Ok(()),
        }
    }

    /// Posts `ops` at once; each gets its completion (a receive's holds
    /// its status).
    fn post_all(&self, ops: &[RawP2p], timeout: Option<Duration>) -> Vec<Arc<Completion>> {
        let mut posts = Vec::with_capacity(ops.len());
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let done = Arc::new(self.p2p.completion());
            out.push(done.clone());
            match self.post_of(op, timeout, Done::One(done)) {
                Ok(p) => posts.push(p),
                Err(e) => out.last().expect("pushed").complete(Err(e)),
            }
        }
        self.p2p.post(posts);
        out
    }

    /// Posts `ops` and waits for all of them; the first error, if any.
    /// Their completions are one batch, waited on here: no allocation,
    /// reference count or driver per op, which a small exchange would
    /// feel (atomic read-modify-writes cost 5 ns or more each here).
    fn run_p2p(
        &self,
        ops: &[RawP2p],
        timeout: Option<Duration>,
    ) -> Result<Vec<Option<RecvStatus>>> {
        if let Some(r) = self.run_lean(ops, timeout) {
            return r;
        }
        let batch: Arc<[Completion]> = ops.iter().map(|_| Completion::default()).collect();
        let mut posts = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match self.post_of(op, timeout, Done::Batch(batch.clone(), i)) {
                Ok(p) => posts.push(p),
                Err(e) => batch[i].complete(Err(e)),
            }
        }
        self.p2p.post(posts);
        self.p2p.wait_all(&batch)?;
        Ok(batch.iter().map(Completion::status).collect())
    }

    /// [`batch_isend_irecv`](Communicator::batch_isend_irecv) over untyped
    /// buffers: posts `ops` at once and returns once all of them have
    /// ended (what each receive got; the first error, if any). `timeout`:
    /// the ops' deadline (`None`: the communicator's).
    ///
    /// # Safety
    /// Each op's buffer must be valid for `len` bytes (reads for sends,
    /// writes for receives), and no receive's buffer may overlap another
    /// op's, until this returns.
    pub unsafe fn run_p2p_raw(
        &self,
        ops: &[RawP2p],
        timeout: Option<Duration>,
    ) -> Result<Vec<Option<RecvStatus>>> {
        self.run_p2p(ops, timeout)
    }

    /// Posts untyped sends and receives at once, like torch's
    /// `batch_isend_irecv`: each returns its [`Work`] (which completes when
    /// the op does) and a handle that reads a receive's status. `timeout`:
    /// the ops' deadline (`None`: the communicator's).
    ///
    /// # Safety
    /// Each op's buffer must be valid for `len` bytes (reads for sends,
    /// writes for receives) and must not be touched by anything else, nor
    /// be a receive's buffer overlapping another op's, until its `Work`
    /// reports completion.
    pub unsafe fn post_p2p_raw(
        &self,
        ops: &[RawP2p],
        timeout: Option<Duration>,
    ) -> Vec<(Work<()>, P2pHandle)> {
        self.post_all(ops, timeout)
            .into_iter()
            .zip(ops)
            .map(|(done, op)| {
                let recv = (!op.send).then(|| done.clone());
                (Work::new(done, ()), P2pHandle { recv })
            })
            .collect()
    }

    /// Posts a batch of sends and receives at once and waits for all of
    /// them (torch's `batch_isend_irecv` followed by waits; NCCL's group
    /// calls). No order of the ops within a batch, or of the batches of
    /// two ranks, can deadlock: every op progresses on its own. Returns,
    /// per op, what a receive got (`None` for sends); the first error if
    /// any op failed (after all of them ended).
    ///
    /// ```
    /// use tutti::{Communicator, P2pOp};
    ///
    /// // A ring shift: every rank sends to the next and receives from the
    /// // previous, both at once.
    /// let comms = Communicator::init_all(3).unwrap();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let (r, n) = (c.rank(), c.size());
    ///             let out = vec![r as u32; 1 << 20];
    ///             let mut inp = vec![0u32; 1 << 20];
    ///             c.batch_isend_irecv(vec![
    ///                 P2pOp::send(&out, (r + 1) % n, 0),
    ///                 P2pOp::recv(&mut inp, (r + n - 1) % n, 0),
    ///             ])
    ///             .unwrap();
    ///             assert!(inp.iter().all(|&x| x as usize == (r + n - 1) % n));
    ///         });
    ///     }
    /// });
    /// ```
    pub fn batch_isend_irecv(&self, ops: Vec<P2pOp<'_>>) -> Result<Vec<Option<RecvStatus>>> {
        let raw: Vec<RawP2p> = ops.iter().map(|o| o.raw).collect();
        // The ops borrow their buffers until this returns, and it returns
        // only once every op has completed.
        self.run_p2p(&raw, None)
    }

    /// Sends `buf` to `peer` (tag 0), which receives it with
    /// [`recv`](Communicator::recv) (or any receive of tag 0). Returns once
    /// the message is delivered, or, for a message of at most
    /// [`EAGER_BYTES`](crate::EAGER_BYTES) (128 KiB, eager), once it has
    /// left and `buf` may be reused, as MPI's `send`.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.send_tagged(buf, peer, 0)
    }

    /// [`send`](Communicator::send) with a tag.
    pub fn send_tagged<T: Element>(&self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.not_self("send", Some(peer))?;
        self.batch_isend_irecv(vec![P2pOp::send(buf, peer, tag)])
            .map(|_| ())
    }

    /// Receives a message of exactly `buf.len()` elements from `peer` (tag 0).
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.recv_tagged(buf, peer, 0)
    }

    /// [`recv`](Communicator::recv) with a tag.
    pub fn recv_tagged<T: Element>(&self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.not_self("recv", Some(peer))?;
        self.batch_isend_irecv(vec![P2pOp::recv(buf, peer, tag)])
            .map(|_| ())
    }

    /// Receives a message of at most `buf.len()` elements with `tag` from
    /// `src`, or from any rank (`None`): returns who sent it and its length.
    /// A message longer than `buf` fails with [`Error::SizeMismatch`] (the
    /// send too when the message is over
    /// [`EAGER_BYTES`](crate::EAGER_BYTES); a smaller one has completed
    /// once it left), and nothing is written.
    pub fn recv_from<T: Element>(
        &self,
        buf: &mut [T],
        src: Option<usize>,
        tag: u32,
    ) -> Result<RecvStatus> {
        self.not_self("recv", src)?;
        let s = self.batch_isend_irecv(vec![P2pOp::recv_from(buf, src, tag)])?;
        Ok(s[0].expect("a receive has a status"))
    }

    /// Asynchronous [`send`](Communicator::send).
    pub fn send_async<T: Element>(&self, buf: Vec<T>, peer: usize) -> Work<Vec<T>> {
        self.send_tagged_async(buf, peer, 0)
    }

    /// Asynchronous [`send_tagged`](Communicator::send_tagged).
    pub fn send_tagged_async<T: Element>(
        &self,
        buf: Vec<T>,
        peer: usize,
        tag: u32,
    ) -> Work<Vec<T>> {
        let op = P2pOp::send(&buf, peer, tag).raw;
        let done = self.post_all(&[op], None).pop().expect("one op");
        // The vector's heap memory does not move when it moves into Work,
        // and Work keeps it alive (and blocks in drop) until the op is done.
        Work::new(done, buf)
    }

    /// Asynchronous [`recv`](Communicator::recv).
    pub fn recv_async<T: Element>(&self, buf: Vec<T>, peer: usize) -> Work<Vec<T>> {
        self.recv_tagged_async(buf, peer, 0)
    }

    /// Asynchronous [`recv_tagged`](Communicator::recv_tagged).
    pub fn recv_tagged_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        peer: usize,
        tag: u32,
    ) -> Work<Vec<T>> {
        let op = P2pOp::recv(&mut buf, peer, tag).raw;
        let done = self.post_all(&[op], None).pop().expect("one op");
        Work::new(done, buf)
    }

    /// Asynchronous [`recv_from`](Communicator::recv_from).
    pub fn recv_from_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        src: Option<usize>,
        tag: u32,
    ) -> Work<Received<T>> {
        let op = P2pOp::recv_from(&mut buf, src, tag).raw;
        let done = self.post_all(&[op], None).pop().expect("one op");
        Work::new(done.clone(), Received { buf, done })
    }
}
