//! [`Completion`]: how an op's result reaches the thread waiting for it.
//!
//! The op's side calls [`Completion::complete`] once; waiters read the
//! result (and, for a receive, what it got: [`RecvStatus`]). Completing costs a store and, only when a waiter is actually
//! asleep, one futex wake: an op finished while its waiter is still
//! polling (the usual case for small messages) makes no system call.
//!
//! A completion may name a [`Driver`]: then the waiting thread moves the op
//! itself (polls the links, matches messages) before it sleeps, instead of
//! sleeping at once and being woken by a progress thread; that hand-off
//! costs two context switches, more than a small message takes.

use crate::error::Result;
use crate::transport::sys;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Weak;
use std::time::{Duration, Instant};

/// `state`: the op is running and nobody sleeps on it.
const RUNNING: u32 = 0;
/// `state`: the op is running and a waiter sleeps (or is about to) on the
/// word: completing must wake it.
const SLEEPING: u32 = 1;
/// `state`: the result is set.
const DONE: u32 = 2;
/// `state` bit: the completer is writing the result (set over RUNNING or
/// SLEEPING, which it keeps: completing wakes a sleeper).
const WRITING: u32 = 4;

/// The longest a waiter sleeps between two looks at its driver: a driver
/// that stopped (its spin ran out) gets another turn this often.
const DRIVEN_NAP: Duration = Duration::from_millis(2);

/// What moves ops forward for a waiter ([`Completion::driven`]).
pub(crate) trait Driver: Send + Sync {
    /// Makes progress until `done` completes, `deadline` passes, or
    /// polling stops paying (`first`: a full spin; later calls poll
    /// briefly). Returns at once if another thread is driving.
    fn drive(&self, done: &Completion, deadline: Option<Instant>, first: bool);
}

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

/// Completion state shared between an async op and its [`Work`](crate::Work) handle.
#[derive(Default)]
pub(crate) struct Completion {
    /// RUNNING, SLEEPING or DONE (a futex word), or WRITING with either
    /// of the first two.
    state: AtomicU32,
    /// Written once, by the completer that set WRITING; read only once
    /// `state` is DONE.
    result: UnsafeCell<Option<Result<()>>>,
    /// A receive's status, written and read as `result` is. (Here rather
    /// than in a cell of its own: that would cost an allocation and a
    /// lock per receive.)
    status: UnsafeCell<Option<RecvStatus>>,
    driver: Option<Weak<dyn Driver>>,
}

// `result` and `status` are written by one thread only (the one whose
// exchange set WRITING, which no other completer can then do) before the
// Release store of DONE, and read only after an Acquire load sees DONE,
// after which nobody writes them; every other field is Sync.
// SAFETY: so sharing a Completion between threads never races on them.
unsafe impl Sync for Completion {}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("done", &self.is_done())
            .finish()
    }
}

impl Completion {
    /// A completion whose waiters drive `driver` while they wait.
    pub(crate) fn driven(driver: Weak<dyn Driver>) -> Completion {
        Completion {
            driver: Some(driver),
            ..Completion::default()
        }
    }

    /// Sets the result (the first one counts) and wakes sleeping waiters.
    pub(crate) fn complete(&self, r: Result<()>) {
        self.complete_with(r, None)
    }

    /// [`complete`](Completion::complete), with what a receive got.
    pub(crate) fn complete_with(&self, r: Result<()>, status: Option<RecvStatus>) {
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            if cur == DONE || cur & WRITING != 0 {
                // Completed (or being completed) already: the first counts.
                return;
            }
            match self.state.compare_exchange_weak(
                cur,
                cur | WRITING,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        // SAFETY: this thread alone set WRITING, so it alone writes, and no
        // reader reads before DONE below.
        unsafe {
            *self.result.get() = Some(r);
            *self.status.get() = status;
        }
        // While WRITING, a waiter cannot announce a sleep (its exchange
        // expects RUNNING), so `cur` says whether one sleeps. Release: a
        // waiter that sees DONE sees the result.
        self.state.store(DONE, Ordering::Release);
        if cur == SLEEPING {
            sys::futex_wake_all(&self.state);
        }
    }

    /// Waits up to `timeout` (forever if `None`); `None` if still running.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        // Done already (an eager send, say): no clock, no driver.
        if let Some(r) = self.result() {
            return Some(r);
        }
        let driver = self.driver.as_ref().and_then(|d| d.upgrade());
        self.wait_driving(driver.as_deref(), timeout)
    }

    /// [`wait`](Completion::wait), driving `driver` (instead of the
    /// completion's own, if any) while it waits.
    pub(crate) fn wait_driving(
        &self,
        driver: Option<&dyn Driver>,
        timeout: Option<Duration>,
    ) -> Option<Result<()>> {
        // A timeout too long to add to now (Duration::MAX, say) waits forever.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut first = true;
        loop {
            if let Some(r) = self.result() {
                return Some(r);
            }
            if let Some(d) = driver {
                d.drive(self, deadline, first);
                first = false;
                if let Some(r) = self.result() {
                    return Some(r);
                }
            }
            let mut nap = if driver.is_some() {
                DRIVEN_NAP
            } else {
                Duration::from_secs(3600)
            };
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return None;
                }
                nap = nap.min(d - now);
            }
            // Announce the sleep; a completion between the look above and
            // this exchange leaves DONE, which the exchange fails on.
            match self.state.compare_exchange(
                RUNNING,
                SLEEPING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) | Err(SLEEPING) => sys::futex_wait(&self.state, SLEEPING, nap),
                // Being completed: done in a moment.
                Err(s) if s & WRITING != 0 => std::hint::spin_loop(),
                Err(_) => {}
            }
        }
    }

    fn result(&self) -> Option<Result<()>> {
        if self.state.load(Ordering::Acquire) == DONE {
            // SAFETY: DONE is stored (Release) after the only write.
            unsafe { (*self.result.get()).clone() }
        } else {
            None
        }
    }

    /// What a receive got, once it is done (`None` before, and for ops
    /// that are not receives or failed before they matched a message).
    pub(crate) fn status(&self) -> Option<RecvStatus> {
        if self.is_done() {
            // SAFETY: DONE is stored (Release) after the only write.
            unsafe { *self.status.get() }
        } else {
            None
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }
}
