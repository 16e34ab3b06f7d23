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
//! order. Messages are matched per (peer, tag) in order ([`progress`]) and
//! move by rendezvous ([`wire`]): a payload only travels into a buffer
//! that a receive has matched, so a receive too small for its message
//! fails on both sides before a byte moves, and the link stays usable.
//!
//! Every op has a deadline (the communicator's timeout); a peer that dies
//! fails the ops that involve it, naming it; [`Communicator::abort`](crate::Communicator::abort)
//! fails them all.

mod progress;
mod wire;

pub(crate) use progress::StatusCell;

use crate::engine::Completion;
use crate::error::Error;
use crate::transport::shm::{self, Segment};
use crate::transport::wait::{self, Backoff, Waiter};
use crate::transport::{Link, LinkOps};
use progress::State;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a receive got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvStatus {
    /// The rank that sent the message.
    pub source: usize,
    /// Its tag.
    pub tag: u32,
    /// Its length in bytes (at most the receive buffer's).
    pub bytes: usize,
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
    pub done: Arc<Completion>,
    /// Receives: filled when the receive matches a message.
    pub status: Option<Arc<StatusCell>>,
}

// SAFETY: the buffer behind `ptr` stays valid and untouched by its owner
// until `done` completes (the poster's promise); the post moves to the
// progress thread whole and is used there alone.
unsafe impl Send for Post {}

/// What the progress thread needs, kept until it starts.
struct Setup {
    links: Vec<Option<Link>>,
    pids: Vec<Option<i32>>,
    rank: usize,
    direct_bytes: usize,
    spin: (Duration, bool),
}

/// The posts waiting for the progress thread.
#[derive(Default)]
struct Queue {
    posts: Vec<Post>,
    /// The thread waits on the condition variable (nothing in flight).
    idle: bool,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
    abort: Arc<AtomicBool>,
    /// This rank's doorbell, where the thread sleeps while ops are in
    /// flight (ring writes from peers ring it; posts ring it too).
    bell: Option<(Arc<Segment>, usize)>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the thread, idle or asleep on the doorbell.
    fn wake(&self, q: &Queue) {
        if q.idle {
            self.cv.notify_one();
        } else if let Some((seg, i)) = &self.bell {
            shm::notify(seg.bell(*i));
        }
    }
}

/// A communicator's point-to-point channel.
pub(crate) struct P2p {
    shared: Arc<Shared>,
    setup: Mutex<Option<Setup>>,
    thread: Mutex<Option<JoinHandle<()>>>,
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
        spin: (Duration, bool),
        bell: Option<(Arc<Segment>, usize)>,
        abort: Arc<AtomicBool>,
    ) -> P2p {
        P2p {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                cv: Condvar::new(),
                abort,
                bell,
            }),
            setup: Mutex::new(Some(Setup {
                links,
                pids,
                rank,
                direct_bytes,
                spin,
            })),
            thread: Mutex::new(None),
        }
    }

    /// Hands `posts` to the progress thread, all at once.
    pub(crate) fn post(&self, posts: Vec<Post>) {
        if posts.is_empty() {
            return;
        }
        if let Err(e) = self.start() {
            for p in posts {
                p.done.complete(Err(e.clone()));
            }
            return;
        }
        let mut q = self.shared.lock();
        if q.stop {
            drop(q);
            for p in posts {
                p.done.complete(Err(Error::Aborted));
            }
            return;
        }
        q.posts.extend(posts);
        self.shared.wake(&q);
    }

    /// Wakes the thread to see an abort.
    pub(crate) fn wake(&self) {
        let q = self.shared.lock();
        self.shared.wake(&q);
        self.shared.cv.notify_one();
    }

    fn start(&self) -> crate::Result<()> {
        let mut setup = self.setup.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = setup.take() else {
            return Ok(());
        };
        let shared = self.shared.clone();
        let h = std::thread::Builder::new()
            .name("tutti-p2p".into())
            .spawn(move || run(shared, s))
            .map_err(|e| Error::io("starting the point-to-point thread", e))?;
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        Ok(())
    }
}

impl Drop for P2p {
    fn drop(&mut self) {
        {
            let mut q = self.shared.lock();
            q.stop = true;
            self.shared.wake(&q);
            self.shared.cv.notify_one();
        }
        let h = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

/// The progress thread: takes posts, moves every link, and waits as every
/// wait does ([`crate::transport::wait`]) when nothing moves: it polls,
/// checks abort, its ops' deadlines and its peers' liveness, and sleeps
/// the way its links say (on the doorbell, or polling sockets).
fn run(shared: Arc<Shared>, s: Setup) {
    let mut st = State::new(s.links, s.pids, s.rank, s.direct_bytes);
    let mut backoff = Backoff::new(s.spin);
    // A post rings the doorbell, which a poll does not hear: a waiter that
    // polls naps briefly.
    let mut waiter = Waiter::new().with_doorbell();
    for (l, _) in st.links() {
        waiter.add(l);
    }
    let mut fds = Vec::new();
    loop {
        let posts = {
            let mut q = shared.lock();
            if q.stop {
                // Ops still queued or in flight fail; a clean shutdown (all
                // done) leaves the links alone and says nothing.
                let posts = std::mem::take(&mut q.posts);
                drop(q);
                if !posts.is_empty() || !st.idle() {
                    st.accept(posts);
                    st.fail_all(Error::Internal(
                        "the communicator was destroyed while a send or receive was pending".into(),
                    ));
                }
                return;
            }
            if q.posts.is_empty() && st.idle() {
                q.idle = true;
                let (mut q, _) = shared
                    .cv
                    .wait_timeout(q, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner());
                q.idle = false;
                backoff.restore();
                continue;
            }
            std::mem::take(&mut q.posts)
        };
        let fresh = !posts.is_empty();
        st.accept(posts);
        if shared.abort.load(Ordering::Relaxed) {
            st.fail_all(Error::Aborted);
            continue;
        }
        let moved = st.progress() || fresh;
        if moved {
            backoff.reset();
            continue;
        }
        if backoff.keep_polling() {
            continue;
        }
        if shared.abort.load(Ordering::Relaxed) {
            st.fail_all(Error::Aborted);
            continue;
        }
        let now = Instant::now();
        st.check(now);
        let nap = st
            .next_deadline()
            .map_or(wait::MAX_NAP, |d| d.saturating_duration_since(now))
            .min(wait::MAX_NAP);
        if waiter.polls() {
            fds.clear();
            for (l, send) in st.links() {
                l.pollfds(send, true, &mut fds);
            }
        }
        let bell = shared.bell.as_ref().map(|(seg, i)| seg.bell(*i));
        waiter.sleep(nap, bell, &mut fds, || {
            shared.lock().posts.is_empty() && !st.links().any(|(l, _)| l.has_message())
        });
    }
}
