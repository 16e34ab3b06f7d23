//! Who moves the point-to-point state, and when: a thread waiting for one
//! of its ops, or the channel's progress thread.
//!
//! The state machine ([`State`]) sits behind one lock. A thread that waits
//! on a send or receive ([`Completion::wait`]) takes it and polls the links
//! itself ([`Driver::drive`]) for as long as its spin lasts, then sleeps on
//! its completion; meanwhile the progress thread stands aside (it sees
//! `drivers`), and takes over when the waiter stops. So a small message
//! is sent, matched and copied by the very threads that wait for it,
//! with no wake-up of another thread on its path. The progress thread
//! moves what nobody waits for (a send posted and not yet waited on, a
//! peer's message into a receive whose owner is busy elsewhere), and
//! never sleeps with the lock held.
//!
//! A post is taken in at once by the posting thread when the lock is free
//! (an eager message leaves before the post returns), else queued for
//! whoever holds it; the holder takes queued posts in before anything
//! else, so posts keep their order.

use super::lean::{Lean, LeanOp, Look};
use super::progress::State;
use super::{Done, Post};
use crate::engine::{Completion, Driver};
use crate::error::Error;
use crate::transport::shm::{self, Segment};
use crate::transport::wait::{self, Backoff, Waiter};
use crate::transport::LinkOps;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// Idle rounds of a driver between looks at the deadlines.
const CHECK_EVERY: u32 = 64;

/// How many times a waiter tries the lock (held briefly by the progress
/// thread, or long by another waiter) before it sleeps instead.
const LOCK_TRIES: u32 = 64;

/// The posts waiting for the holder of the state.
#[derive(Default)]
struct Queue {
    posts: Vec<Post>,
    /// The progress thread waits on the condition variable.
    idle: bool,
    stop: bool,
}

/// What the posting threads, the waiters and the progress thread share.
pub(super) struct Shared {
    state: Mutex<State>,
    queue: Mutex<Queue>,
    /// Whether `queue.posts` may hold posts (a hint read without the lock).
    queued: AtomicBool,
    /// `queue.stop`, read without the lock.
    stopping: AtomicBool,
    cv: Condvar,
    /// Waiters driving (or about to): the progress thread stands aside.
    drivers: AtomicUsize,
    abort: Arc<AtomicBool>,
    /// This rank's doorbell, where the progress thread sleeps while ops are
    /// in flight (ring writes from peers ring it; posts ring it too).
    bell: Option<(Arc<Segment>, usize)>,
    spin: (Duration, bool),
    /// Idle rounds a waiter that yields its core spins first.
    yield_after: u32,
}

impl Shared {
    pub fn new(
        st: State,
        waits: super::Waits,
        bell: Option<(Arc<Segment>, usize)>,
        abort: Arc<AtomicBool>,
    ) -> Shared {
        Shared {
            state: Mutex::new(st),
            queue: Mutex::new(Queue::default()),
            queued: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            cv: Condvar::new(),
            drivers: AtomicUsize::new(0),
            abort,
            bell,
            spin: waits.spin,
            yield_after: waits.yield_after,
        }
    }

    /// Sleeps marked idle until a post or a driver wakes the thread, or
    /// `wait::MAX_NAP` passes.
    fn nap(&self, mut q: MutexGuard<'_, Queue>) {
        q.idle = true;
        let (mut q, _) = self
            .cv
            .wait_timeout(q, wait::MAX_NAP)
            .unwrap_or_else(|e| e.into_inner());
        q.idle = false;
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_state(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// See [`super::P2p::post`].
    pub fn post(&self, posts: Vec<Post>) {
        // Nobody holds the state and nothing waits in the queue: the posts
        // go straight in (the usual case for a thread that posts and then
        // waits), without the queue's lock.
        if !self.queued.load(Ordering::Acquire) {
            if let Some(mut st) = self.try_state() {
                if !self.queued.load(Ordering::Acquire) && !self.stopping.load(Ordering::Acquire) {
                    st.accept(posts);
                    self.round(&mut st);
                    return;
                }
                drop(st);
            }
        }
        let mut q = self.queue();
        if q.stop {
            drop(q);
            for p in posts {
                p.done.get().complete(Err(Error::Aborted));
            }
            return;
        }
        q.posts.extend(posts);
        self.queued.store(true, Ordering::Release);
        drop(q);
        // Taken in here, the posts need nobody else: their waiters drive
        // them, and the progress thread (idle, or asleep on the links)
        // looks again within [`wait::MAX_NAP`] for those nobody waits on.
        // Waking it for every post would cost a context switch per message.
        match self.try_state() {
            Some(mut st) => {
                self.round(&mut st);
            }
            None => self.wake(),
        }
    }

    /// See [`super::P2p::lean`].
    pub fn lean(
        &self,
        s: Option<&LeanOp>,
        r: Option<&LeanOp>,
        post: impl FnOnce(Done) -> Post,
    ) -> Option<Lean> {
        if self.queued.load(Ordering::Acquire) {
            return None;
        }
        // The progress thread stands aside meanwhile, as for any driver.
        self.drivers.fetch_add(1, Ordering::AcqRel);
        let out = self.lean_locked(s, r, post);
        self.drivers.fetch_sub(1, Ordering::AcqRel);
        out
    }

    fn lean_locked(
        &self,
        s: Option<&LeanOp>,
        r: Option<&LeanOp>,
        post: impl FnOnce(Done) -> Post,
    ) -> Option<Lean> {
        let mut st = self.try_state()?;
        if self.queued.load(Ordering::Acquire)
            || self.stopping.load(Ordering::Acquire)
            || self.abort.load(Ordering::Relaxed)
            || !st.lean_fits(s, r)
        {
            return None;
        }
        if let Some(s) = s {
            if let Err(e) = st.lean_send(s) {
                st.break_peer(s.peer, e.clone());
                return Some(Lean::Done(Err(e)));
            }
        }
        let Some(r) = r else {
            return Some(Lean::Done(Ok(None)));
        };
        let mut backoff = Backoff::new(self.spin).yield_after(self.yield_after);
        let last = loop {
            match st.lean_look(r) {
                Look::Got(status) => return Some(Lean::Done(Ok(Some(status)))),
                Look::Nothing => {}
                other => break other,
            }
            // Another thread's posts wait for the state, an abort, or a
            // wait longer than a spin: the usual way (which sleeps, and
            // watches the deadline and the peer).
            if self.queued.load(Ordering::Acquire)
                || self.abort.load(Ordering::Relaxed)
                || !backoff.keep_polling()
            {
                break Look::Nothing;
            }
        };
        let done = Arc::new(Completion::default());
        st.lean_post(r, post(Done::One(done.clone())), last);
        self.round(&mut st);
        Some(Lean::Posted(done))
    }

    /// Wakes the progress thread, idle or asleep on the doorbell.
    pub fn wake(&self) {
        let q = self.queue();
        if q.idle {
            self.cv.notify_one();
        } else if let Some((seg, i)) = &self.bell {
            shm::notify(seg.bell(*i));
        }
    }

    /// Tells the progress thread to finish.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.queue().stop = true;
        self.wake();
        self.cv.notify_one();
    }

    /// Fails what is still queued or in flight (a clean shutdown, all
    /// done, leaves the links alone and says nothing).
    ///
    /// An eager send completes once its message has left, so a rank may
    /// destroy its communicator before the peer has received it; the
    /// message must still arrive (over TCP, closing the sockets first
    /// would fail the peer). So a clean shutdown first waits until every
    /// peer has taken this rank's eager messages (each peer gives their
    /// credit back at once when asked, `Flush`, or when it closes too),
    /// as long as the longest op deadline, while the peer lives and
    /// nobody aborts; and it gives back the credit of the peers' messages
    /// it holds, which no receive will take now.
    pub fn shut_down(&self) {
        let mut st = self.state();
        // Frames still queued (an Ack for a message this rank received,
        // giving the peer its credit back) leave first.
        // (A timeout too long to add to now, Duration::MAX say, waits as
        // long as the ops would.)
        let until =
            crate::config::deadline_after(Instant::now(), st.longest.max(Duration::from_secs(1)));
        while st.ops.is_empty() && !self.abort.load(Ordering::Relaxed) {
            st.eager_release();
            let waiting = st.eager_unsettled();
            let moved = self.round(&mut st);
            if !st.sending() && !waiting {
                break;
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            st.check_closing(now);
            if !moved {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let posts = std::mem::take(&mut self.queue().posts);
        if !posts.is_empty() || !st.idle() {
            st.accept(posts);
            st.fail_all(Error::Internal(
                "the communicator was destroyed while a send or receive was pending".into(),
            ));
        }
    }

    /// One round under the lock: queued posts in, then every link moved.
    /// Returns whether anything moved.
    fn round(&self, st: &mut State) -> bool {
        let mut fresh = false;
        // Loaded first: a locked swap at every polling round would cost more
        // than the round.
        if self.queued.load(Ordering::Acquire) && self.queued.swap(false, Ordering::AcqRel) {
            let posts = std::mem::take(&mut self.queue().posts);
            fresh = !posts.is_empty();
            st.accept(posts);
        }
        if self.abort.load(Ordering::Relaxed) {
            st.fail_all(Error::Aborted);
            return true;
        }
        st.progress() || fresh
    }

    /// The progress thread: moves every link while no waiter does, and
    /// sleeps as every wait does ([`crate::transport::wait`]) when nothing
    /// moves: it checks abort, its ops' deadlines and its peers'
    /// liveness, and sleeps the way its links say (on the doorbell, or
    /// polling sockets), without the lock.
    pub fn run(&self) {
        // Waiters spin; this thread, which moves only what nobody waits
        // for, polls a few rounds and sleeps.
        let mut backoff = Backoff::new((Duration::ZERO, true));
        // A post rings the doorbell, which a poll does not hear: a waiter
        // that polls naps briefly.
        let mut waiter = Waiter::new().with_doorbell();
        for (l, _) in self.state().links() {
            waiter.add(l);
        }
        let mut fds = Vec::new();
        loop {
            if self.queue().stop {
                return self.shut_down();
            }
            if self.drivers.load(Ordering::Acquire) > 0 {
                self.nap(self.queue());
                backoff.restore();
                continue;
            }
            let mut st = self.state();
            if self.round(&mut st) {
                backoff.reset();
                continue;
            }
            if st.idle() {
                let q = self.queue();
                if q.posts.is_empty() && !q.stop && self.drivers.load(Ordering::Acquire) == 0 {
                    drop(st);
                    self.nap(q);
                    backoff.restore();
                }
                continue;
            }
            if backoff.keep_polling() {
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
            drop(st);
            let bell = self.bell.as_ref().map(|(seg, i)| seg.bell(*i));
            waiter.sleep(nap, bell, &mut fds, || {
                !self.queued.load(Ordering::Acquire)
                    && self.drivers.load(Ordering::Acquire) == 0
                    && self
                        .try_state()
                        .is_some_and(|st| !st.links().any(|(l, _)| l.has_message()))
            });
        }
    }
}

impl Driver for Shared {
    fn drive(&self, done: &Completion, deadline: Option<Instant>, first: bool) {
        self.drivers.fetch_add(1, Ordering::AcqRel);
        self.drive_locked(done, deadline, first);
        self.drivers.fetch_sub(1, Ordering::AcqRel);
        // A waiter that stops before its op is done sleeps: the progress
        // thread takes over. (One whose op is done wakes nobody: other ops
        // left in flight are the progress thread's within MAX_NAP, or
        // their own waiters'.)
        if !done.is_done() && self.queue().idle {
            self.cv.notify_one();
        }
    }
}

impl Shared {
    fn drive_locked(&self, done: &Completion, deadline: Option<Instant>, first: bool) {
        let mut st = None;
        for i in 0..LOCK_TRIES {
            st = self.try_state();
            if st.is_some() || done.is_done() {
                break;
            }
            if i == 0 {
                // The progress thread may be about to sleep holding it.
                if let Some((seg, i)) = &self.bell {
                    shm::notify(seg.bell(*i));
                }
            }
            std::thread::yield_now();
        }
        let Some(mut st) = st else {
            return;
        };
        let spin = if first {
            self.spin
        } else {
            (Duration::ZERO, self.spin.1)
        };
        let mut backoff = Backoff::new(spin).yield_after(self.yield_after);
        while !done.is_done() {
            if self.round(&mut st) {
                backoff.reset();
                continue;
            }
            let polling = backoff.keep_polling();
            if !polling || backoff.rounds().is_multiple_of(CHECK_EVERY) {
                let now = Instant::now();
                st.check(now);
                if deadline.is_some_and(|d| now >= d) {
                    return;
                }
            }
            if !polling {
                return;
            }
        }
    }
}
