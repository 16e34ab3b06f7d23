//! Ordering and turns: every op takes a ticket when it is issued and runs
//! in its turn, the only one then to touch the core; an asynchronous op's
//! result reaches its waiter through a [`Completion`](super::Completion).

use super::{Completion, Core, OpCall};
use crate::error::{Error, Result};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub(super) struct Job {
    pub(super) call: OpCall,
    pub(super) ticket: u64,
    pub(super) done: Arc<Completion>,
}

/// The core plus what orders access to it: ops run in ticket order, and
/// only the op whose turn it is touches the core. Taking a free turn is one
/// load, passing it on one store: no lock on the path of a small op.
pub(crate) struct Turns {
    pub(super) core: UnsafeCell<Core>,
    /// The ticket whose turn it is.
    pub(super) next_turn: AtomicU64,
    /// Where threads wait for their turn (with `cv`), and how many do, so
    /// that passing the turn on skips the wake-up call when none waits.
    pub(super) lock: Mutex<()>,
    pub(super) cv: Condvar,
    pub(super) waiters: AtomicU64,
}

// The core is reached only through a `Turn`, and only the thread whose
// ticket equals `next_turn` holds one (tickets are unique, and the turn
// moves on only when its holder gives it up); the SeqCst store that passes
// the turn on and the load that finds it order one holder's accesses
// before the next's.
// SAFETY: one thread at a time touches the core (above); `Core` is `Send`.
unsafe impl Sync for Turns {}

/// Exclusive access to the core for the op whose turn it is. Dropping it
/// passes the turn on, also when the op panics: then the core is poisoned
/// first (it may be half-way through a schedule), so that every later op
/// fails with [`Error::Internal`] and the peers are told, instead of every
/// later op waiting for a turn that never comes.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    ticket: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let core: &mut Core = self;
            let e = Error::Internal(format!(
                "an op panicked on rank {} (a bug in tutti: please report it); this \
                 communicator is unusable, destroy it",
                core.rank
            ));
            core.poison(&e);
        }
        let t = self.turns;
        t.next_turn.store(self.ticket + 1, Ordering::SeqCst);
        if t.waiters.load(Ordering::SeqCst) > 0 {
            t.wake_all();
        }
    }
}

impl std::ops::Deref for Turn<'_> {
    type Target = Core;
    fn deref(&self) -> &Core {
        // SAFETY: this thread holds the turn (see `Turns`' Sync).
        unsafe { &*self.turns.core.get() }
    }
}

impl std::ops::DerefMut for Turn<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        // SAFETY: this thread holds the turn, and `&mut self` makes this
        // the only reference made through it.
        unsafe { &mut *self.turns.core.get() }
    }
}

impl Turns {
    #[inline]
    pub(super) fn lock_turn(&self, ticket: u64, abort: Option<&AtomicBool>) -> Result<Turn<'_>> {
        if self.next_turn.load(Ordering::SeqCst) == ticket {
            return Ok(Turn {
                turns: self,
                ticket,
            });
        }
        self.wait_turn(ticket, abort)
    }

    #[cold]
    fn wait_turn(&self, ticket: u64, abort: Option<&AtomicBool>) -> Result<Turn<'_>> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // Pairs with `end_turn`: it stores the turn and then reads
        // `waiters`, this thread counts itself and then reads the turn
        // (under the lock it notifies under), so one of them sees the other.
        while self.next_turn.load(Ordering::SeqCst) != ticket {
            if abort.is_some_and(|a| a.load(Ordering::Relaxed)) {
                drop(g);
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                return Err(Error::Aborted);
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        Ok(Turn {
            turns: self,
            ticket,
        })
    }

    /// Passes the turn on (what dropping `g` does; see [`Turn`]).
    #[inline]
    pub(super) fn end_turn(&self, g: Turn<'_>) {
        debug_assert!(std::ptr::eq(g.turns, self));
        drop(g);
    }

    /// Wakes every thread waiting for its turn (to find it, or an abort).
    #[cold]
    pub(super) fn wake_all(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }
}
