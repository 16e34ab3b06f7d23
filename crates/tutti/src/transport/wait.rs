//! The waiting contract: how every loop that waits for a peer waits (the
//! executor's run loop, the mailboxes, the TCP I/O thread, the
//! point-to-point progress thread).
//!
//! 1. **Poll** while polling is cheap and likely to pay: [`Backoff`] spins
//!    (or yields the core, where ranks outnumber cores) for the first
//!    rounds and then for the spin time, reading the clock only now and
//!    then, so that a wait that ends quickly pays for nothing else.
//! 2. **Check the world** once polling has run out ([`Watch`]): the abort
//!    flag, the deadline (the wait's timeout, counted from its first
//!    check), and, at an interval, the peers' liveness (what liveness
//!    means is the waiter's: a peer's abort flag, its process, a silent
//!    socket to probe).
//! 3. **Sleep** a bounded while ([`MAX_NAP`], never past the deadline), the
//!    way the links waited on say ([`Sleep`], combined by a [`Waiter`]): on
//!    the rank's doorbell, which whoever moves a counter the sleeper may
//!    wait for rings, or in `poll()` on sockets. Then poll again.
//!
//! Anything that moves resets the backoff; every sleep is bounded, so an
//! abort, a dead peer and the deadline are noticed promptly.

use super::shm::{self, Doorbell};
use super::{sys, Link, LinkOps};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The polling policy of every waiting loop (executor, mailboxes, TCP I/O
/// thread, point-to-point thread): poll, spinning (or yielding the core
/// when ranks outnumber cores) for the first rounds and then for
/// `spin_for`, reading the clock only every 64 rounds after the first 256,
/// so that a wait that ends quickly never pays for it; then the caller
/// checks the world (abort, deadline, liveness) and sleeps a bounded while.
///
/// Once the spin time has run out, the wait is one that spinning does not
/// shorten (the data comes at the network's pace, or from a peer that is
/// not running): from then on every idle spell, after a sleep or after
/// something moved, polls only [`SPENT_ROUNDS`] rounds before sleeping
/// again, until [`Backoff::restore`] (or a new `Backoff`, one per op). A
/// stream of TCP frames then costs a wake-up per burst, not a core: on 2
/// namespace hosts x 4 ranks sharing 2 cores, a 16 MiB AllToAll over
/// 1 Gbit/s links kept the cores 80-95% busy (mostly in system calls
/// that found nothing), and 23-32% after, at the same speed.
pub(crate) struct Backoff {
    idle: u32,
    since: Option<Instant>,
    spin_for: Duration,
    yield_while_polling: bool,
    /// Idle rounds that spin before the yields begin.
    yield_after: u32,
    spent: bool,
}

/// Rounds an idle spell polls before sleeping once the spin time of the
/// wait has run out.
const SPENT_ROUNDS: u32 = 8;

impl Backoff {
    /// A fresh policy: `spin` is (how long to poll, whether to yield).
    pub(crate) fn new(spin: (Duration, bool)) -> Self {
        Backoff {
            idle: 0,
            since: None,
            spin_for: spin.0,
            yield_while_polling: spin.1,
            yield_after: 8,
            spent: false,
        }
    }

    /// Yields (where it yields at all) from the `n`-th idle round on.
    pub(crate) fn yield_after(mut self, n: u32) -> Self {
        self.yield_after = n;
        self
    }

    /// Something moved, or a sleep woke with work to do: poll afresh (a
    /// few rounds only, once the spin time has run out).
    #[inline]
    pub(crate) fn reset(&mut self) {
        self.idle = 0;
        self.since = None;
    }

    /// A new wait begins (a long-lived loop, between ops): the full spin
    /// time again.
    #[inline]
    pub(crate) fn restore(&mut self) {
        self.idle = 0;
        self.since = None;
        self.spent = false;
    }

    /// Idle rounds since the last reset.
    #[inline]
    pub(crate) fn rounds(&self) -> u32 {
        self.idle
    }

    /// One idle round. While polling goes on it spins or yields and returns
    /// true; false means: check the world and sleep.
    #[inline]
    pub(crate) fn keep_polling(&mut self) -> bool {
        self.idle += 1;
        let polling = if self.spent {
            self.idle < SPENT_ROUNDS
        } else {
            self.idle < 256
                || !self.idle.is_multiple_of(64)
                || self.since.get_or_insert_with(Instant::now).elapsed() < self.spin_for
        };
        if !polling {
            self.spent = true;
        } else if self.yield_while_polling && self.idle > self.yield_after {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        polling
    }
}

/// How many rounds in a row that moved something a loop runs between
/// looks at abort and the deadline ([`Watch::check_busy`]): a clock read
/// per this many rounds costs nothing measurable.
pub(crate) const BUSY_CHECK_EVERY: u32 = 1024;

/// The longest sleep of a wait: an abort, a dead peer or the deadline is
/// noticed at most this late.
pub(crate) const MAX_NAP: Duration = Duration::from_millis(20);

/// The sleep in `poll()` of a wait that also waits for something `poll()`
/// does not hear (a doorbell): short, and a `ppoll()`, so that it is not
/// rounded up to a millisecond.
pub(crate) const BRIEF_NAP: Duration = Duration::from_micros(200);

/// Why a wait ended without its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The communicator was aborted.
    Aborted,
    /// The deadline passed; the caller names whom it waited for.
    Deadline,
}

/// What a [`Watch`] found the world to be.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked {
    /// How long to sleep: at most [`MAX_NAP`], never past the deadline.
    pub nap: Duration,
    /// The interval has passed: check the peers' liveness now.
    pub liveness: bool,
}

/// Step 2 of the contract: checks abort, the deadline and when liveness is
/// due, once polling has run out.
pub(crate) struct Watch<'a> {
    abort: &'a AtomicBool,
    timeout: Duration,
    /// Check liveness at most this often.
    every: Duration,
    last: Option<Instant>,
}

impl<'a> Watch<'a> {
    /// A watch for a wait of `timeout` (its deadline starts at the first
    /// check unless the caller's is set already), ended by `abort`, with
    /// liveness checked at most `every`.
    pub(crate) fn new(abort: &'a AtomicBool, timeout: Duration, every: Duration) -> Self {
        Watch {
            abort,
            timeout,
            every,
            last: None,
        }
    }

    /// For a loop that keeps moving: whether the op was aborted or its
    /// deadline (set here if no wait set it yet) has passed. Called every
    /// [`BUSY_CHECK_EVERY`] rounds that moved something, so that an op
    /// whose rounds always move a little but never end (a bug: nothing
    /// legitimate does that for longer than the timeout) still fails with
    /// the typed error instead of hanging with no word.
    pub(crate) fn check_busy(&self, deadline: &mut Option<Instant>) -> Result<(), Ended> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Ended::Aborted);
        }
        let now = Instant::now();
        if now >= *deadline.get_or_insert(crate::config::deadline_after(now, self.timeout)) {
            return Err(Ended::Deadline);
        }
        Ok(())
    }

    /// Checks the world: `deadline` is set at the first check (now +
    /// timeout) and kept by the caller across the waits of one op.
    pub(crate) fn check(&mut self, deadline: &mut Option<Instant>) -> Result<Checked, Ended> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Ended::Aborted);
        }
        let now = Instant::now();
        let deadline = *deadline.get_or_insert(crate::config::deadline_after(now, self.timeout));
        if now >= deadline {
            return Err(Ended::Deadline);
        }
        let liveness = self.last.is_none_or(|t| now.duration_since(t) > self.every);
        if liveness {
            self.last = Some(now);
        }
        Ok(Checked {
            nap: (deadline - now).min(MAX_NAP),
            liveness,
        })
    }
}

/// Why a peer is known to be lost: it announced a failure (`link`), its
/// host stopped acknowledging what we sent it ([`LinkOps::host_silent`]),
/// or its process (`pid`, for peers on this host) is gone.
pub(crate) fn peer_lost(q: usize, link: Option<&Link>, pid: Option<i32>) -> Option<String> {
    if let Some(code) = link.and_then(|l| l.peer_failed()) {
        return Some(crate::transport::shm::failure::describe(q, code));
    }
    if let Some(why) = link.and_then(|l| l.host_silent()) {
        return Some(format!("rank {q}: {why}"));
    }
    pid.filter(|&pid| !sys::process_alive(pid))
        .map(|pid| format!("process {pid} is gone"))
}

/// How the owner of a link sleeps until the link may move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sleep {
    /// On the rank's doorbell, which the peer (or the I/O thread that
    /// serves the link) rings after moving something.
    Doorbell,
    /// In `poll()` on the link's sockets ([`Link::pollfds`]).
    Poll,
}

/// How one wait sleeps, combined from the links it waits on: in `poll()`
/// if any link needs it (briefly, if others ring the doorbell, which
/// `poll()` does not hear), else on the doorbell.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Waiter {
    poll: bool,
    bell: bool,
}

impl Waiter {
    /// A waiter for no link yet.
    pub(crate) fn new() -> Self {
        Waiter::default()
    }

    /// Waits on `link` too.
    #[inline]
    pub(crate) fn add(&mut self, link: &Link) {
        match link.sleep() {
            Sleep::Poll => self.poll = true,
            Sleep::Doorbell => self.bell = true,
        }
    }

    /// Something else rings the doorbell too (posts from other threads).
    pub(crate) fn with_doorbell(mut self) -> Self {
        self.bell = true;
        self
    }

    /// Whether [`sleep`](Self::sleep) sleeps in `poll()`: then the caller
    /// passes the descriptors of its links ([`Link::pollfds`]).
    #[inline]
    pub(crate) fn polls(&self) -> bool {
        self.poll
    }

    /// Sleeps at most `nap`: in `poll()` on `fds`, or on `bell` unless
    /// `still_idle` (run after announcing the sleep) finds work, or, with
    /// neither, briefly.
    pub(crate) fn sleep(
        &self,
        nap: Duration,
        bell: Option<&Doorbell>,
        fds: &mut [libc::pollfd],
        still_idle: impl FnOnce() -> bool,
    ) {
        if self.poll {
            let nap = if self.bell { nap.min(BRIEF_NAP) } else { nap };
            poll(fds, nap);
        } else if let Some(bell) = bell {
            shm::sleep_on(bell, nap, still_idle);
        } else {
            std::thread::sleep(nap.min(BRIEF_NAP));
        }
    }
}

/// Sleeps in `ppoll()` on `fds` for at most `nap` (a bare sleep of at
/// most a millisecond when there are none).
pub(crate) fn poll(fds: &mut [libc::pollfd], nap: Duration) {
    if fds.is_empty() {
        std::thread::sleep(nap.min(Duration::from_millis(1)));
    } else {
        sys::ppoll(fds, nap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_sees_the_deadline_and_abort() {
        let abort = AtomicBool::new(false);
        let w = Watch::new(&abort, Duration::from_secs(3600), Duration::ZERO);
        let mut d = None;
        assert!(w.check_busy(&mut d).is_ok());
        assert!(d.is_some(), "the first look sets the deadline");
        // A deadline set by an earlier wait is kept, and once past, ends it.
        let mut past = Some(Instant::now() - Duration::from_millis(1));
        assert!(matches!(w.check_busy(&mut past), Err(Ended::Deadline)));
        abort.store(true, Ordering::Relaxed);
        assert!(matches!(w.check_busy(&mut d), Err(Ended::Aborted)));
        let zero = AtomicBool::new(false);
        let w = Watch::new(&zero, Duration::ZERO, Duration::ZERO);
        assert!(matches!(w.check_busy(&mut None), Err(Ended::Deadline)));
    }
}
