//! The engine: one per communicator. It orders ops (every op gets a ticket
//! when it is issued and runs in ticket order), runs blocking ops on the
//! caller's thread and asynchronous ones on a progress thread, picks and
//! caches schedules, and poisons the communicator after a failure so that
//! every later op fails fast with the same error.
//!
//! Each concern has its room: `call` holds the untyped call ([`RawCall`],
//! [`Options`]) and its check, which makes it an [`OpCall`]; this file
//! holds the op, the core's state and an op's run, and the [`Engine`] that
//! hands out tickets; `turns` orders ops (tickets, turns, completions);
//! `rescue` keeps the recovery listener drained; `plan` caches plans
//! and runs a schedule through `executor`; `oneshot` runs small calls
//! through the mailboxes, and `repeat` lets a call that repeats the last
//! one skip the checks and the tuner; `online` is online tuning's glue;
//! `recorder` is the flight recorder, `explain` reads timed traces.

mod call;
mod completion;
mod convert;
pub(crate) mod executor;
pub mod explain;
pub(crate) mod oneshot;
mod online;
mod plan;
pub mod recorder;
mod repeat;
mod rescue;
mod turns;

use crate::algo::{Algorithm, Collective, Problem, VCounts};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::reduce::{DataType, ReduceOp};
use crate::transport::mailbox::Mailbox;
use crate::transport::shm::Doorbell;
use crate::transport::tcp_io::IoSet;
use crate::transport::{Link, LinkOps};
pub use call::{Options, RawCall};
pub use completion::RecvStatus;
pub(crate) use completion::{Completion, Driver};
use executor::Scratchpad;
use online::{shape_of, Shape, ShapeKey};
use plan::{op_tag, Planned};
use repeat::Repeat;
pub(crate) use rescue::keep_rescue;
use rustc_hash::FxHashMap;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use turns::{Job, Turns};

/// One collective call, with raw buffers (checked by [`Engine::check`]).
pub(crate) struct OpCall {
    pub coll: Collective,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub count: usize,
    pub vcounts: Option<VCounts>,
    pub in_place: bool,
    pub input: *mut u8,
    pub input_len: usize,
    pub output: *mut u8,
    pub output_len: usize,
    pub algorithm: Option<Algorithm>,
    pub timeout: Option<Duration>,
    /// The 16-bit wire type (checked: an f32 Sum or Avg reduction).
    pub wire: Option<crate::algo::Wire>,
    /// Run by the progress thread while the caller computes: poll briefly
    /// before sleeping, so as not to take the CPU from the computation.
    pub background: bool,
}

// SAFETY: the pointers refer to buffers the caller keeps alive (and does not
// touch) until the op completes; the op moves to the progress thread whole.
unsafe impl Send for OpCall {}

/// The mutable state of a communicator's data path.
pub(crate) struct Core {
    pub links: Vec<Option<Link>>,
    pub peer_pids: Vec<Option<i32>>,
    pub rank: usize,
    pub nranks: usize,
    pub config: Config,
    pub spin: (Duration, bool),
    /// Keeps the shared segment (and so the doorbell) alive.
    pub bell_owner: Option<Arc<crate::transport::shm::Segment>>,
    /// The TCP I/O thread serving this communicator's TCP links, if any
    /// (its doorbell is the one to sleep on when there is no segment).
    pub io: Option<Arc<IoSet>>,
    pub local_index: usize,
    seq: u64,
    /// Collectives run (send/recv excluded): what headers carry.
    coll_seq: u32,
    /// Collectives run with the algorithm left to the tuner (send/recv
    /// excluded), not wrapping: online tuning's reviews are due by it.
    /// Calls that force an algorithm do not count, so that a review's
    /// calls stay the fraction of Auto's calls they are meant to be where
    /// forced calls run between (a bench timing Auto against each algorithm
    /// forced ran 6 forced calls to each of Auto's: reviews came 7 times as
    /// often, and Auto timed 1.09x its own pick where it ran without them).
    auto_colls: u64,
    /// The least collective number at which a shape's review is due
    /// ([`Core::start_reviews`]).
    review_from: u64,
    scratch: Vec<u8>,
    bounce: Vec<u8>,
    pad: Scratchpad,
    /// Plans by problem and forced algorithm. The engine's maps hash with
    /// FxHash: their keys are the engine's own, and a call's lookups with
    /// SipHash took a third of a 2-rank tuning trial's CPU time.
    cache: FxHashMap<(Problem, Option<Algorithm>), Planned>,
    /// What the tuner knows (set by the communicator after connecting).
    pub tune: crate::tune::TuneCtx,
    /// The last call's problem, forced algorithm and plan.
    last: Option<(Problem, Option<Algorithm>, Planned)>,
    /// Online tuning's state per call shape ([`crate::tune::online`]).
    shapes: FxHashMap<ShapeKey, Shape>,
    /// One-shot mailboxes, when every peer shares this rank's segment.
    mailbox: Option<Mailbox>,
    /// The last blocking call that went through the mailboxes, as its
    /// caller passed it: a call that repeats it skips the checks and the
    /// tuner ([`Engine::run_raw`]).
    repeat: Option<Repeat>,
    /// Whether the last op ran through the mailboxes.
    oneshot_ran: bool,
    poisoned: Option<Error>,
    /// Test hook: the next op panics inside its turn.
    #[cfg(test)]
    pub(crate) panic_next: bool,
    /// The recovery listener (see `shrink`), drained now and then so that
    /// probes never fill its queue.
    pub(crate) rescue: Option<std::net::TcpListener>,
    /// When the recovery listener is next drained. A drain costs a
    /// non-blocking `accept` (a few microseconds: the kernel builds a socket
    /// before it finds the queue empty), so it runs at most every
    /// [`DRAIN_EVERY`](rescue::DRAIN_EVERY), not every so many ops: at 64 ops it was a third of
    /// an 8-byte broadcast's time.
    rescue_due: Instant,
    /// The last ops, for diagnosis after a failure.
    recorder: recorder::Recorder,
    /// The first failure, readable without waiting for a turn.
    pub(crate) first_error: Arc<Mutex<Option<Error>>>,
}

impl Core {
    pub(crate) fn new(
        links: Vec<Option<Link>>,
        peer_pids: Vec<Option<i32>>,
        rank: usize,
        config: Config,
        ranks_here: usize,
        bell_owner: Option<(Arc<crate::transport::shm::Segment>, usize)>,
        io: Option<Arc<IoSet>>,
    ) -> Core {
        let nranks = links.len();
        // With an I/O thread each rank runs two busy threads.
        let spin = config.spin_for(if io.is_some() {
            2 * ranks_here
        } else {
            ranks_here
        });
        let (bell_owner, local_index) = match bell_owner {
            Some((s, i)) => (Some(s), i),
            None => (None, 0),
        };
        let mailbox = bell_owner
            .as_ref()
            .filter(|_| config.mailbox)
            .and_then(|seg| Mailbox::new(&links, rank, seg, local_index));
        let timed = config.trace_dir.is_some();
        Core {
            links,
            peer_pids,
            rank,
            nranks,
            config,
            spin,
            bell_owner,
            io,
            local_index,
            seq: 0,
            coll_seq: 0,
            scratch: Vec::new(),
            bounce: vec![0u8; 256 << 10],
            pad: Scratchpad::default(),
            cache: FxHashMap::default(),
            tune: crate::tune::TuneCtx::single_host(nranks),
            last: None,
            shapes: FxHashMap::default(),
            auto_colls: 0,
            review_from: u64::MAX,
            mailbox,
            repeat: None,
            oneshot_ran: false,
            poisoned: None,
            #[cfg(test)]
            panic_next: false,
            recorder: recorder::Recorder::new(timed),
            rescue: None,
            rescue_due: Instant::now(),
            first_error: Arc::new(Mutex::new(None)),
        }
    }

    fn bell(&self) -> Option<&Doorbell> {
        match (&self.bell_owner, &self.io) {
            (Some(s), _) => Some(s.bell(self.local_index)),
            (None, Some(io)) => Some(io.bell()),
            (None, None) => None,
        }
    }

    /// Drops cached algorithm decisions (after the cost model changed).
    pub(crate) fn forget_decisions(&mut self) {
        self.cache.clear();
        self.last = None;
        self.repeat = None;
        self.shapes.clear();
    }

    /// The number of ops this communicator has run.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// What the flight recorder keeps of `c`, op `seq`, as it starts.
    fn record_of(c: &OpCall, seq: u64) -> recorder::Rec {
        recorder::Rec {
            seq,
            op: c.coll.kind().name(),
            root_or_peer: match c.coll {
                Collective::Send { peer } | Collective::Recv { peer } => Some(peer),
                other => other.root(),
            },
            count: c.count,
            dtype: c.dtype.name(),
            redop: c.op.name(),
            algorithm: "",
            state: recorder::RecState::Running,
            bytes: c.count * c.dtype.size(),
            forced: c.algorithm.is_some(),
            t0: 0,
            t1: 0,
        }
    }

    /// Runs `c`; `repeat`: it repeats [`Core::repeat`], so it runs through
    /// the mailboxes without asking the tuner.
    fn run(&mut self, c: &OpCall, abort: &AtomicBool, repeat: bool) -> Result<()> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        #[cfg(test)]
        if std::mem::take(&mut self.panic_next) {
            panic!("a panic injected by a test, inside op {}", self.seq);
        }
        if abort.load(Ordering::Relaxed) {
            // Aborted while idle: no op saw it fail, so tell the peers now,
            // or TCP peers would wait for their timeout.
            self.poison(&Error::Aborted);
            return Err(Error::Aborted);
        }
        if self.seq.is_multiple_of(64) {
            if let Some(l) = &self.rescue {
                let now = Instant::now();
                if now >= self.rescue_due {
                    rescue::drain(l);
                    self.rescue_due = now + rescue::DRAIN_EVERY;
                }
            }
        }
        match &self.repeat {
            // A repeat is recorded like the call it repeats.
            Some(k) if repeat => self.recorder.start(recorder::Rec {
                seq: self.seq,
                ..k.rec
            }),
            _ => self.recorder.start(Self::record_of(c, self.seq)),
        }
        match self.run_inner(c, abort, repeat) {
            Ok(()) => {
                self.recorder.done();
                Ok(())
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// After op failed with `e`: records it and, for a failure that leaves
    /// the ranks out of step, poisons the communicator and tells the peers.
    #[cold]
    #[inline(never)]
    fn failed(&mut self, e: Error) -> Error {
        self.recorder.failed(e.to_string());
        if matches!(
            e,
            Error::Timeout { .. }
                | Error::PeerLost { .. }
                | Error::Mismatch { .. }
                | Error::Aborted
        ) {
            tracing::error!(rank = self.rank, "{e}");
            self.poison(&e);
            let dir = self.config.trace_dir.as_deref();
            self.recorder.dump(self.rank, self.nranks, dir, &self.tune);
        }
        e
    }

    /// Marks the communicator failed with `e` (every later op returns it)
    /// and tells the peers, so that they fail fast instead of waiting for us.
    fn poison(&mut self, e: &Error) {
        self.poisoned = Some(e.clone());
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(e.clone());
        for l in self.links.iter().flatten() {
            l.announce_failure(e);
        }
    }

    fn run_inner(&mut self, c: &OpCall, abort: &AtomicBool, repeat: bool) -> Result<()> {
        // A trial's block runs on the paths that skip the tuner, as its
        // candidate would once decided: its calls are timed from here, so
        // that what those paths cost counts as it will then.
        let entered = self
            .last
            .as_ref()
            .is_some_and(|l| l.2.trial.is_some())
            .then(Instant::now);
        let seq = self.seq;
        self.seq += 1;
        let esz = c.dtype.size();
        let n = self.nranks;
        let bytes = c.count * esz;
        // A review is due: the shapes due leave the paths that skip the tuner.
        let repeat = repeat && self.auto_colls < self.review_from;
        if self.auto_colls >= self.review_from {
            self.start_reviews();
        }
        if repeat {
            let coll_seq = self.next_coll_seq(c);
            // The last call's plan (a repeat follows a call that ran in
            // one shot on its plan, a decision's or a trial's).
            let planned = self.last.as_ref().is_some_and(|l| l.2.stream);
            let stream = self.config.shm_stream.unwrap_or(planned);
            self.run_oneshot(c, seq, op_tag(c), coll_seq, stream, abort)?;
            if let (Some(t0), Some((p, ..))) = (entered, &self.last) {
                // A trial's block: this call counts in it, as on every rank
                // (some take this path, some not, by their buffers).
                let key = shape_of(p, c.dtype);
                self.trial_done(key, t0.elapsed().as_secs_f64(), abort)?;
            }
            return Ok(());
        }
        self.oneshot_ran = false;
        let problem = Problem {
            coll: c.coll,
            nranks: n,
            rank: self.rank,
            count: c.count,
            // Whether this rank's input already lies where the schedule
            // would copy it (`Problem::in_place`).
            in_place: match c.coll {
                Collective::AllGather => {
                    std::ptr::eq(c.input, c.output.wrapping_add(self.rank * c.count * esz))
                }
                Collective::Broadcast { .. } => std::ptr::eq(c.input, c.output),
                _ => c.in_place,
            },
            // Avg's division is the schedule's last step (`algo::frame`).
            avg: c.op == ReduceOp::Avg && c.coll.reduces(),
            vcounts: c.vcounts.clone(),
            chunks: 1,
            hosts: self.tune.hosts(),
            wire: c.wire,
        };
        // Training loops repeat the same call: remember the last plan, a
        // decision or a trial's candidate (until its block ends: then
        // `trial_done` forgets it, and the shape's next call asks the
        // tuner for the next candidate).
        let mut trial = None;
        let plan = match &self.last {
            Some((p, a, plan))
                if *a == c.algorithm
                    && *p == problem
                    && plan.trial.is_none_or(|d| d == c.dtype) =>
            {
                self.recorder.set_algorithm(plan.alg.name());
                if plan.trial.is_some() {
                    trial = Some(shape_of(&problem, c.dtype));
                }
                plan.clone()
            }
            _ => {
                let key = (problem, c.algorithm);
                let plan = match self.cache.get(&key) {
                    // Forced, or a shape online tuning has decided: one
                    // lookup, as a loop over several shapes needs.
                    Some(plan) => {
                        self.recorder.set_algorithm(plan.alg.name());
                        plan.clone()
                    }
                    None => {
                        let online = self.online_choice(&key.0, c, bytes)?;
                        let tuned = online.choice;
                        trial = online.trial;
                        let forced = tuned.map_or(c.algorithm, |d| Some(d.algorithm));
                        let (alg, sched) = self.schedule_for(key.0.clone(), forced, c)?;
                        let plan = Planned {
                            alg,
                            sched,
                            stream: tuned.is_some_and(|d| d.stream),
                            cma: tuned.is_some_and(|d| d.cma),
                            watch: online.watch,
                            trial: trial.as_ref().map(|k| k.1),
                        };
                        if trial.is_none() && forced != c.algorithm {
                            // Decided online: remember it under the call's key.
                            self.cache.insert(key.clone(), plan.clone());
                        }
                        plan
                    }
                };
                self.last = Some((key.0, key.1, plan.clone()));
                plan
            }
        };
        let alg = plan.alg;
        let coll_seq = self.next_coll_seq(c);
        // The clock is read only where online tuning wants the time (a
        // read costs 20-40 ns here, a fifth of a small call).
        let start = (plan.watch.is_some() || trial.is_some()).then(Instant::now);
        if alg == Algorithm::Direct
            && c.wire.is_none()
            && self.mailbox.is_some()
            && c.vcounts.is_none()
            && oneshot::fits(c.coll, n, bytes)
        {
            self.oneshot_ran = true;
            let stream = self.config.shm_stream.unwrap_or(plan.stream);
            self.run_oneshot(c, seq, op_tag(c), coll_seq, stream, abort)?;
        } else {
            self.run_schedule(c, seq, coll_seq, &plan, abort)?;
        }
        // Online tuning's AllReduce (agreeing on a watch window's mean or
        // on trial times) runs inside this call: afterwards the flight
        // recorder shows this call's algorithm, and whether this call ran
        // through the mailboxes (a repeat may) is this call's alone; the
        // last call of a trial's block is never a repeat to skip the tuner
        // for (every rank asks the tuner for the next candidate).
        if let Some(start) = start {
            let secs = start.elapsed().as_secs_f64();
            let mut ran = self.oneshot_ran;
            if let Some(w) = &plan.watch {
                if w.lock().add(secs) {
                    self.watch_done(w, abort)?;
                }
            }
            if let Some(key) = trial {
                let secs = entered.map_or(secs, |t0| t0.elapsed().as_secs_f64());
                ran &= !self.trial_done(key, secs, abort)?;
            }
            self.recorder.set_algorithm(alg.name());
            self.oneshot_ran = ran;
        }
        Ok(())
    }

    /// What ring headers of the next op carry: the collective number (which
    /// this advances), or [`P2P_SEQ`](crate::transport::P2P_SEQ).
    fn next_coll_seq(&mut self, c: &OpCall) -> u32 {
        if c.coll.kind() == crate::algo::CollKind::SendRecv {
            crate::transport::P2P_SEQ
        } else {
            let s = self.coll_seq;
            self.coll_seq = self.coll_seq.wrapping_add(1) % crate::transport::P2P_SEQ;
            self.auto_colls += u64::from(c.algorithm.is_none());
            s
        }
    }
}

/// Orders and runs a communicator's ops.
pub(crate) struct Engine {
    core: Arc<Turns>,
    /// This rank and the rank count, for checking calls outside a turn.
    rank: usize,
    nranks: usize,
    tickets: AtomicU64,
    pub(crate) abort: Arc<AtomicBool>,
    /// The first asynchronous error (shared with the core).
    pub(crate) first_error: Arc<Mutex<Option<Error>>>,
    /// This rank's doorbell, to wake a sleeping op on abort.
    bell: Option<(Arc<crate::transport::shm::Segment>, usize)>,
    /// The TCP I/O set, whose doorbell an op sleeps on when there is no segment.
    io: Option<Arc<IoSet>>,
    worker: Mutex<Option<(mpsc::Sender<Job>, JoinHandle<()>)>>,
}

impl Engine {
    pub(crate) fn new(core: Core) -> Engine {
        let bell = core.bell_owner.clone().map(|s| (s, core.local_index));
        let io = core.io.clone();
        Engine {
            io,
            rank: core.rank,
            nranks: core.nranks,
            first_error: core.first_error.clone(),
            bell,
            core: Arc::new(Turns {
                core: UnsafeCell::new(core),
                next_turn: AtomicU64::new(0),
                lock: Mutex::new(()),
                cv: Condvar::new(),
                waiters: AtomicU64::new(0),
            }),
            tickets: AtomicU64::new(0),
            abort: Arc::new(AtomicBool::new(false)),
            worker: Mutex::new(None),
        }
    }

    /// Runs `call` in its turn. `done`, if given, is completed before the
    /// turn passes on, so a later op never finishes before this one reports.
    fn run_turn(
        t: &Turns,
        ticket: u64,
        call: &OpCall,
        abort: &AtomicBool,
        done: Option<&Completion>,
    ) -> Result<()> {
        let mut g = match t.lock_turn(ticket, Some(abort)) {
            Ok(g) => g,
            Err(e) => {
                // Still take (and pass on) the turn so later ops are not stuck.
                let g = t.lock_turn(ticket, None)?;
                if let Some(d) = done {
                    d.complete(Err(e.clone()));
                }
                t.end_turn(g);
                return Err(e);
            }
        };
        let r = g.run(call, abort, false);
        if let Some(d) = done {
            d.complete(r.clone());
        }
        t.end_turn(g);
        r
    }

    /// Runs a call on this thread, after every op issued before it. It is
    /// checked against the communicator ([`Engine::check`]) and made an op,
    /// unless `c` repeats the last mailbox call in all but its buffers: a
    /// training loop's small AllReduce then costs a few compares before
    /// its data moves, not a check, a tuner lookup and a dispatch.
    // Inline, as it was while it took the check as a closure (and so was
    // instantiated beside its caller): the repeat path is a few compares.
    #[inline]
    pub(crate) fn run_raw(&self, c: &RawCall, opts: &Options) -> Result<()> {
        let check = || self.check(c, opts);
        let t = self.tickets.fetch_add(1, Ordering::SeqCst);
        let mut g = match self.core.lock_turn(t, Some(&self.abort)) {
            Ok(g) => g,
            Err(e) => {
                // Pass the turn on; a bad argument is still reported as such.
                let g = self.core.lock_turn(t, None)?;
                self.core.end_turn(g);
                check()?;
                return Err(e);
            }
        };
        let r = match g.repeat.as_ref().and_then(|k| k.of(c, opts)) {
            Some(call) => g.run(&call, &self.abort, true),
            None => check().and_then(|call| {
                let r = g.run(&call, &self.abort, false);
                g.repeat = (r.is_ok() && g.oneshot_ran).then(|| Repeat::new(c, opts, &call));
                r
            }),
        };
        self.core.end_turn(g);
        r
    }

    /// Queues `call` for the progress thread; `done` completes with its result.
    pub(crate) fn submit(&self, call: OpCall, done: Arc<Completion>) {
        let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.tickets.fetch_add(1, Ordering::SeqCst);
        if w.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let core = self.core.clone();
            let abort = self.abort.clone();
            let h = std::thread::Builder::new()
                .name("tutti-progress".into())
                .spawn(move || {
                    while let Ok(mut job) = rx.recv() {
                        job.call.background = true;
                        // An op that panics has poisoned the core and passed
                        // the turn on (`Turn`); its waiter gets the error, and
                        // this thread serves the ops after it (which fail).
                        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            Self::run_turn(&core, job.ticket, &job.call, &abort, Some(&job.done))
                        }));
                        if ran.is_err() {
                            job.done.complete(Err(Error::Internal(
                                "an asynchronous op panicked (a bug in tutti: please report \
                                 it); this communicator is unusable, destroy it"
                                    .into(),
                            )));
                        }
                    }
                })
                .expect("spawning the progress thread");
            *w = Some((tx, h));
        }
        let job = Job {
            call,
            ticket: t,
            done,
        };
        if let Err(mpsc::SendError(job)) = w.as_ref().expect("worker started").0.send(job) {
            job.done.complete(Err(Error::Aborted));
        }
    }

    /// Runs `f` on the core once every issued op has finished.
    pub(crate) fn with_core<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let t = self.tickets.fetch_add(1, Ordering::SeqCst);
        let mut g = self
            .core
            .lock_turn(t, None)
            .expect("waiting without abort cannot fail");
        let r = f(&mut g);
        self.core.end_turn(g);
        r
    }

    /// Aborts: every waiting and later op fails with [`Error::Aborted`].
    pub(crate) fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(Error::Aborted);
        let code = crate::transport::shm::failure::code(&Error::Aborted);
        if let Some((seg, i)) = &self.bell {
            crate::transport::shm::abort_wake(seg.bell(*i), code);
        } else if let Some(io) = &self.io {
            crate::transport::shm::abort_wake(io.bell(), code);
        }
        self.core.wake_all();
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // A communicator that ends healthy lets its TCP peers take the end
        // of what it sent before the sockets close; one that failed closes
        // them at once (its peers are failing too, and may read nothing).
        let healthy = self.poisoned.is_none();
        if healthy {
            let dir = self.config.trace_dir.as_deref();
            self.recorder
                .dump_at_end(self.rank, self.nranks, dir, &self.tune);
        }
        if let Some(io) = &self.io {
            io.close_gracefully_on_stop(healthy);
        }
        if healthy {
            let lanes: Vec<&crate::transport::tcp::Lanes> = self
                .links
                .iter()
                .flatten()
                .filter_map(|l| match l {
                    Link::Tcp(t) => Some(t.lanes()),
                    _ => None,
                })
                .collect();
            crate::transport::tcp::close_gracefully(&lanes);
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let w = self
            .worker
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((tx, h)) = w {
            drop(tx);
            let _ = h.join();
        }
    }
}
