//! Point-to-point: sends and receives that progress on their own channel.
//!
//! Collectives run one at a time in issue order ([`crate::engine`]); sends
//! and receives do not. Each communicator has a second set of links for
//! them (rings on the segment's [`P2P_CHANNEL`](crate::transport::shm::P2P_CHANNEL),
//! a TCP socket of its own per peer), and one progress thread that moves
//! every posted send and receive at once, started at the first one. So a
//! posted receive never waits for a collective or for a send to another
//! peer, both neighbours of a ring can send before they receive, and a
//! batch (`batch_isend_irecv`, NCCL's group calls) cannot deadlock in any
//! order. Messages are matched per (peer, tag) in order ([`progress`]).
//! A small one travels at once into the receiver's keeping ([`eager`]),
//! within a credit per pair; a large one (or one without credit) by
//! rendezvous ([`wire`]): its payload only travels into a buffer that a
//! receive has matched. An eager send completes once its message has left
//! (as MPI's does), a rendezvous send when its receive has taken the
//! message. A receive too small for its message fails (a rendezvous send
//! too, an eager one has completed already), and the link stays usable.
//!
//! A blocking call of one eager send and one receive (or either alone)
//! over shared memory, while nothing else is under way on the channel,
//! skips posts and ops altogether: the calling thread writes and reads
//! the rings itself ([`lean`]).
//!
//! Whoever waits moves things ([`driver`]): a thread in `wait` polls the
//! links itself while it would otherwise sleep, so a small message costs
//! no wake-up of another thread; the progress thread moves what nobody
//! waits for.
//!
//! Every op has a deadline (the communicator's timeout); a peer that dies
//! fails the ops that involve it, naming it; [`Communicator::abort`](crate::Communicator::abort)
//! fails them all.

mod driver;
mod eager;
mod failure;
mod lean;
mod peer;
mod progress;
mod wire;

pub use crate::engine::RecvStatus;
pub use eager::EAGER_BYTES;
pub(crate) use lean::{Lean, LeanOp};

use crate::engine::{Completion, Driver};
use crate::error::Error;
use crate::transport::shm::Segment;
use crate::transport::Link;
use driver::Shared;
use progress::State;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the channel's waiters poll: (how long before sleeping, whether to
/// yield the core while polling), and, where they yield, after how many
/// idle rounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waits {
    /// How long to poll before sleeping, and whether to yield meanwhile.
    pub spin: (Duration, bool),
    /// Idle rounds of polling before the yields begin.
    pub yield_after: u32,
}

/// What a post does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PostKind {
    /// Send `len` bytes to `peer`.
    Send { peer: usize },
    /// Receive from `src` (`None`: any rank) into a buffer of `len` bytes;
    /// `exact`: the message must fill it.
    Recv { src: Option<usize>, exact: bool },
}

/// A send or receive handed to the progress thread.
pub(crate) struct Post {
    pub kind: PostKind,
    pub ptr: *mut u8,
    pub len: usize,
    pub tag: u32,
    pub timeout: Duration,
    /// Completes the op; a receive's also says what it got.
    pub done: Done,
}

/// Where a post's completion lives.
pub(crate) enum Done {
    /// Its own, shared with the op's [`Work`](crate::Work).
    One(Arc<Completion>),
    /// Entry `i` of its batch's, which a blocking call waits on
    /// ([`P2p::wait_all`]): one allocation for the batch, and no driver to
    /// take at each wait.
    Batch(Arc<[Completion]>, usize),
}

impl Done {
    /// The completion.
    pub(crate) fn get(&self) -> &Completion {
        match self {
            Done::One(c) => c,
            Done::Batch(b, i) => &b[*i],
        }
    }
}

// SAFETY: the buffer behind `ptr` stays valid and untouched by its owner
// until `done` completes (the poster's promise); the post moves to the
// progress thread whole and is used there alone.
unsafe impl Send for Post {}

/// A communicator's point-to-point channel.
pub(crate) struct P2p {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The thread is running (read without the lock at every post).
    started: AtomicBool,
    /// Per rank: its link is a shared-memory ring (the lean lane's).
    rings: Vec<bool>,
}

impl P2p {
    /// The channel over `links` (one per rank; `None` for this rank).
    /// `direct_bytes`: messages this large are read straight from the
    /// sender's memory on shared-memory links (`usize::MAX`: never).
    pub(crate) fn new(
        links: Vec<Option<Link>>,
        pids: Vec<Option<i32>>,
        rank: usize,
        direct_bytes: usize,
        waits: Waits,
        bell: Option<(Arc<Segment>, usize)>,
        abort: Arc<AtomicBool>,
    ) -> P2p {
        let rings = links
            .iter()
            .map(|l| matches!(l, Some(Link::Ring(_))))
            .collect();
        let st = State::new(links, pids, rank, direct_bytes);
        P2p {
            shared: Arc::new(Shared::new(st, waits, bell, abort)),
            thread: Mutex::new(None),
            started: AtomicBool::new(false),
            rings,
        }
    }

    /// A completion for a post, whose waiters drive this channel.
    pub(crate) fn completion(&self) -> Completion {
        let d: Weak<dyn Driver> = Arc::downgrade(&self.shared) as Weak<dyn Driver>;
        Completion::driven(d)
    }

    /// Hands `posts` over, all at once: taken in (and the eager ones sent)
    /// right here if no other thread is moving the channel, else queued
    /// for the thread that is.
    pub(crate) fn post(&self, posts: Vec<Post>) {
        if posts.is_empty() {
            return;
        }
        if let Err(e) = self.start() {
            for p in posts {
                p.done.get().complete(Err(e.clone()));
            }
            return;
        }
        self.shared.post(posts);
    }

    /// A blocking exchange of send `s` and receive `r` (at least one of
    /// them) by the lean lane ([`lean`]): `None` if it does not take them
    /// (nothing was done); else the send has completed (or failed: the
    /// error), and the receive has too, or went the usual way as
    /// `post(done)` makes it.
    pub(crate) fn lean(
        &self,
        s: Option<&LeanOp>,
        r: Option<&LeanOp>,
        post: impl FnOnce(Done) -> Post,
    ) -> Option<Lean> {
        // What it can never take costs nothing more than these looks.
        // Before the first post the progress thread is not there to stand
        // aside: the usual way starts it.
        let ring = |q: usize| self.rings.get(q).copied().unwrap_or(false);
        let send_ok = s.is_none_or(|s| (1..=lean::LEAN_BYTES).contains(&s.len) && ring(s.peer));
        if !send_ok || !r.is_none_or(|r| ring(r.peer)) || !self.started.load(Ordering::Acquire) {
            return None;
        }
        self.shared.lean(s, r, post)
    }

    /// Waits for every completion of `batch` (whose posts went in with
    /// [`post`](P2p::post)), moving the channel meanwhile as any waiter
    /// does; the first error, if any, once all have ended.
    pub(crate) fn wait_all(&self, batch: &[Completion]) -> crate::Result<()> {
        let mut first = None;
        for c in batch {
            let r = c
                .wait_driving(Some(&*self.shared), None)
                .expect("waiting without a deadline returns");
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Wakes the thread to see an abort.
    pub(crate) fn wake(&self) {
        self.shared.wake();
    }

    /// Starts the progress thread, at the first post.
    fn start(&self) -> crate::Result<()> {
        if self.started.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_some() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let h = std::thread::Builder::new()
            .name("tutti-p2p".into())
            .spawn(move || shared.run())
            .map_err(|e| Error::io("starting the point-to-point thread", e))?;
        *t = Some(h);
        self.started.store(true, Ordering::Release);
        Ok(())
    }
}

impl Drop for P2p {
    fn drop(&mut self) {
        self.shared.stop();
        let h = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match h {
            Some(h) => {
                let _ = h.join();
            }
            None => self.shared.shut_down(),
        }
    }
}
