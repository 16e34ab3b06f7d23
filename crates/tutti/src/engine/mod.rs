//! The engine: one per communicator. It orders ops (every op gets a ticket
//! when it is issued and runs in ticket order), runs blocking ops on the
//! caller's thread and asynchronous ones on a progress thread, picks and
//! caches schedules, and poisons the communicator after a failure so that
//! every later op fails fast with the same error.

pub(crate) mod executor;
pub(crate) mod oneshot;
pub mod recorder;

use crate::algo::{Algorithm, Collective, Problem, Schedule, VCounts};
use crate::comm::{Options, RawCall};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::reduce::{self, DataType, ReduceOp};
use crate::transport::mailbox::{Mailbox, MBOX_BYTES};
use crate::transport::shm::Doorbell;
use crate::transport::tcp_io::IoSet;
use crate::transport::{make_tag, Link, StepCx};
use crate::tune::online::{Trials, Watch};
use executor::{Buffers, Env, Scratchpad};
use rustc_hash::FxHashMap;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a busy communicator drains its recovery listener. A probe
/// waits in the listener's queue (and counts as an answer) until then; the
/// queue holds far more than one probe per rank per drain.
const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// One collective call, with raw buffers (the comm layer checked them).
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
    /// Run by the progress thread while the caller computes: poll briefly
    /// before sleeping, so as not to take the CPU from the computation.
    pub background: bool,
}

// SAFETY: the pointers refer to buffers the caller keeps alive (and does not
// touch) until the op completes; the op moves to the progress thread whole.
unsafe impl Send for OpCall {}

/// A checked call that ran through the mailboxes, less its buffers.
#[derive(Clone, Copy, Debug)]
struct Repeat {
    coll: Collective,
    dtype: DataType,
    op: ReduceOp,
    count: usize,
    send_len: usize,
    recv_len: usize,
    in_place: bool,
    input_len: usize,
    output_len: usize,
    algorithm: Option<Algorithm>,
    timeout: Option<Duration>,
    /// What the flight recorder keeps of each repeat.
    rec: recorder::Rec,
}

impl Repeat {
    fn new(c: &RawCall, opts: &Options, call: &OpCall) -> Repeat {
        Repeat {
            coll: c.coll,
            dtype: c.dtype,
            op: c.op,
            count: c.count,
            send_len: c.send_len,
            recv_len: c.recv_len,
            in_place: call.in_place,
            input_len: call.input_len,
            output_len: call.output_len,
            algorithm: opts.algorithm,
            timeout: opts.timeout,
            rec: recorder::Rec {
                algorithm: Algorithm::Direct.name(),
                ..Core::record_of(call, 0)
            },
        }
    }

    /// The op for `c` if it repeats this call in all but its buffers and its
    /// buffers pass the comm layer's checks (`None`: check it in full).
    #[inline]
    fn of(&self, c: &RawCall, opts: &Options) -> Option<OpCall> {
        let in_place = c.coll == Collective::AllReduce && std::ptr::eq(c.send, c.recv);
        let same = c.coll == self.coll
            && c.dtype == self.dtype
            && c.op == self.op
            && c.count == self.count
            && c.send_len == self.send_len
            && c.recv_len == self.recv_len
            && c.vcounts.is_none()
            && in_place == self.in_place
            && opts.algorithm == self.algorithm
            && opts.timeout == self.timeout;
        // The comm layer's overlap rule: input and output bytes are the
        // checked lengths (input_len is 0 exactly where no input is read).
        let overlap = !in_place
            && self.input_len > 0
            && self.output_len > 0
            && c.coll != Collective::AllGather
            && (c.send as usize) < c.recv as usize + self.output_len
            && (c.recv as usize) < c.send as usize + self.input_len;
        (same && !overlap).then_some(OpCall {
            coll: c.coll,
            dtype: c.dtype,
            op: c.op,
            count: c.count,
            vcounts: None,
            in_place,
            input: crate::comm::ops::input_of(c),
            input_len: self.input_len,
            output: c.recv,
            output_len: self.output_len,
            algorithm: opts.algorithm,
            timeout: opts.timeout,
            background: false,
        })
    }
}

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
    /// The last blocking call that went through the mailboxes, as the comm
    /// layer passed it: a call that repeats it skips the checks and the
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
    /// [`DRAIN_EVERY`], not every so many ops: at 64 ops it was a third of
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
            recorder: recorder::Recorder::default(),
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

    /// The shape online tuning files calls of `p` (with this communicator's
    /// hosts) and `dtype` under.
    fn shape_key(&self, p: &Problem, dtype: DataType) -> ShapeKey {
        (
            Problem {
                in_place: false,
                hosts: self.tune.hosts(),
                ..p.clone()
            },
            dtype,
        )
    }

    /// Online tuning's state for calls of `p` (with this communicator's
    /// hosts) and `dtype`: `None` before the first such call, and where it
    /// does not tune; `Err(())` while it tries candidates; its decision.
    pub(crate) fn online_state(
        &self,
        p: &Problem,
        dtype: DataType,
    ) -> Option<std::result::Result<crate::tune::Choice, ()>> {
        let key = self.shape_key(p, dtype);
        match self.shapes.get(&key)? {
            Shape::Fixed(c) => Some(Ok(*c)),
            Shape::Tuned(t) => t.trials.decided().ok_or(()).into(),
        }
    }

    /// How many times online tuning has reviewed its decision for calls of
    /// `p` and `dtype` (0 where it does not tune them).
    pub(crate) fn online_reviews(&self, p: &Problem, dtype: DataType) -> usize {
        let key = self.shape_key(p, dtype);
        match self.shapes.get(&key) {
            Some(Shape::Tuned(t)) => t.trials.reviews(),
            _ => 0,
        }
    }

    /// The candidates online tuning times for `p`'s shape (the model's
    /// pick first); empty where it has none to try, or has not seen the
    /// shape yet.
    pub(crate) fn online_candidates(
        &self,
        p: &Problem,
        dtype: DataType,
    ) -> Vec<crate::tune::Choice> {
        let key = self.shape_key(p, dtype);
        match self.shapes.get(&key) {
            Some(Shape::Tuned(t)) => t.trials.candidates().to_vec(),
            _ => Vec::new(),
        }
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
            start_us: 0,
            end_us: 0,
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
                    crate::comm::drain_listener(l);
                    self.rescue_due = now + DRAIN_EVERY;
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
            self.recorder
                .dump(self.rank, self.nranks, self.config.trace_dir.as_deref());
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
            l.announce_failure();
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
        // Put this rank's own data where the schedule expects it.
        match c.coll {
            Collective::AllGather => {
                let off = self.rank * c.count * esz;
                // SAFETY: the comm layer checked input_len == count*esz and
                // output_len == n*count*esz; `copy` tolerates aliasing.
                unsafe {
                    if !std::ptr::eq(c.input, c.output.add(off)) {
                        crate::reduce::copy::copy_overlapping(
                            c.input,
                            c.output.add(off),
                            c.count * esz,
                        );
                    }
                }
            }
            Collective::Broadcast { root } if root == self.rank && c.input != c.output => {
                // SAFETY: both hold count*esz bytes (checked by the comm layer).
                unsafe { crate::reduce::copy::copy_overlapping(c.input, c.output, c.count * esz) };
            }
            _ => {}
        }
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
            self.finish_avg(c)?;
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
            in_place: c.in_place,
            vcounts: c.vcounts.clone(),
            chunks: 1,
            hosts: self.tune.hosts(),
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
        let start = Instant::now();
        if alg == Algorithm::Direct
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
        self.finish_avg(c)?;
        // Online tuning's AllReduce (agreeing on a watch window's mean or
        // on trial times) runs inside this call: afterwards the flight
        // recorder shows this call's algorithm, and whether this call ran
        // through the mailboxes (a repeat may) is this call's alone; the
        // last call of a trial's block is never a repeat to skip the tuner
        // for (every rank asks the tuner for the next candidate).
        if plan.watch.is_some() || trial.is_some() {
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

    /// Online tuning's choice for `c` (algorithm and twin): its shape's
    /// decision, or (while the shape is being tuned) the candidate to try,
    /// with the shape's key; `None` where online tuning has no say (an
    /// algorithm forced for the call, which then runs as forced, or
    /// tuning off: the cost model's pick).
    fn online_choice(&mut self, problem: &Problem, c: &OpCall, bytes: usize) -> Result<Online> {
        let none = Online {
            choice: None,
            trial: None,
            watch: None,
        };
        if c.algorithm.is_some()
            || !self.config.online
            || c.vcounts.is_some()
            || c.coll.kind() == crate::algo::CollKind::SendRecv
            || self.nranks < 2
        {
            return Ok(none);
        }
        let key = shape_of(problem, c.dtype);
        if !self.shapes.contains_key(&key) {
            // Never forget a shape: every rank must agree on which shapes
            // are being tuned (one that repeats a call skips the tuner), so
            // past the bound new shapes get the cost model's pick.
            if self.shapes.len() >= MAX_SHAPES {
                return Ok(none);
            }
            let cands = crate::tune::candidates(&key.0, c.dtype, &self.config.algo, &self.tune)?;
            let shape = if cands.len() < 2 {
                Shape::Fixed(cands[0])
            } else {
                let watched = self.config.review && bytes >= crate::tune::online::WATCH_MIN_BYTES;
                Shape::Tuned(Tuning {
                    trials: Trials::new(cands, bytes),
                    review_at: None,
                    gap: crate::tune::online::REVIEW_GAP,
                    stretch_from: 0,
                    watch: watched.then(|| {
                        Arc::new(Watched {
                            key: key.clone(),
                            watch: Mutex::new(Watch::new(bytes, self.tune.cpu_share)),
                        })
                    }),
                })
            };
            self.shapes.insert(key.clone(), shape);
        }
        let colls = self.auto_colls;
        Ok(match self.shapes.get_mut(&key).expect("inserted above") {
            Shape::Fixed(d) => Online {
                choice: Some(*d),
                ..none
            },
            Shape::Tuned(t) => match (t.review_at, t.trials.decided()) {
                (Some(_), Some(d)) => Online {
                    choice: Some(d),
                    watch: t.watch.clone(),
                    ..none
                },
                _ => {
                    if t.trials.fresh() {
                        t.stretch_from = colls;
                    }
                    let next = t.trials.next().0;
                    Online {
                        choice: Some(next),
                        trial: Some(key),
                        ..none
                    }
                }
            },
        })
    }

    /// Online tuning's reviews that are due start: their shapes' next
    /// calls try the candidates again, so the paths that skip the tuner
    /// (the last call's schedule, the cache of decided shapes, the repeat
    /// of a mailbox call) are cleared, and the next review due is found.
    /// Every rank gets here at the same collective.
    #[cold]
    fn start_reviews(&mut self) {
        let now = self.auto_colls;
        let mut next = u64::MAX;
        for s in self.shapes.values_mut() {
            if let Shape::Tuned(t) = s {
                match t.review_at {
                    Some(at) if at <= now => t.review_at = None,
                    Some(at) => next = next.min(at),
                    None => {}
                }
            }
        }
        self.review_from = next;
        self.last = None;
        self.repeat = None;
        self.cache.retain(|k, _| k.1.is_some());
    }

    /// After a trial call of `key`'s shape that took `secs` here: once every
    /// candidate has its timed calls, the ranks agree on each candidate's
    /// time (the maximum over ranks of each rank's mean) and the shape
    /// is decided. Returns whether the call ended a block (the last plan
    /// is then forgotten, so that the next call asks for its candidate).
    fn trial_done(&mut self, key: ShapeKey, secs: f64, abort: &AtomicBool) -> Result<bool> {
        let Some(Shape::Tuned(t)) = self.shapes.get_mut(&key) else {
            return Ok(false);
        };
        let done = t.trials.record(secs);
        // The block ended (or the trials did): the shape's next call asks
        // the tuner, on every rank alike.
        let ended = t.trials.at_block_start();
        if ended {
            self.last = None;
            self.repeat = None;
        }
        if !done {
            return Ok(ended);
        }
        let cands = t.trials.candidates().to_vec();
        let mut us = t.trials.means_us();
        self.all_max(&mut us, abort)?;
        let colls = self.auto_colls;
        let Some(Shape::Tuned(t)) = self.shapes.get_mut(&key) else {
            unreachable!("a shape is never forgotten");
        };
        let crate::tune::online::Agreed {
            pick: d,
            turns,
            changed,
            moved,
            unsettled,
        } = t.trials.agreed(&us);
        if let Some(w) = &t.watch {
            w.lock().restart(d.us, !changed, unsettled);
        }
        let reviews = t.trials.reviews();
        // The next review: REVIEW_GAP times a turn's span in Auto's
        // collectives (the same count on every rank), doubling while
        // reviews keep the pick or change it for little (where ranks share
        // cores, a shape too small to watch waits at least
        // REVIEW_MIN_SECS_SHARED of its pick's calls); at the shape's next
        // call where the decision is unsettled (the gap then stays).
        let (first, most) = crate::tune::online::review_gaps(self.tune.cpu_share, d.stream);
        t.gap = if reviews == 0 || moved {
            first
        } else if unsettled {
            t.gap
        } else {
            (t.gap * 2).min(most)
        };
        let span = (colls - t.stretch_from) / turns as u64;
        let at = if !self.config.review {
            u64::MAX
        } else if unsettled {
            colls
        } else {
            let pace = t.trials.pace_us().unwrap_or(d.us);
            let floor = crate::tune::online::review_floor(
                t.watch.is_some(),
                t.trials.turn_calls(),
                pace,
                self.tune.cpu_share,
            );
            colls.saturating_add(t.gap.max(floor).saturating_mul(span.max(1)))
        };
        t.review_at = Some(at);
        self.review_from = self.review_from.min(at);
        tracing::debug!(
            rank = self.rank,
            coll = key.0.coll.kind().name(),
            count = key.0.count,
            dtype = key.1.name(),
            tried = ?cands
                .iter()
                .enumerate()
                .map(|(c, x)| {
                    let per_turn: Vec<f64> = us.iter().skip(c).step_by(cands.len()).copied().collect();
                    (plan_name(x), per_turn)
                })
                .collect::<Vec<_>>(),
            picked = plan_name(&d),
            reviews,
            changed,
            unsettled,
            "online tuning"
        );
        Ok(true)
    }

    /// After a call of a watched shape's decision that filled its window:
    /// the ranks agree on the window's mean (the maximum over ranks), and
    /// where it moved from the baseline the shape's review is due now (at
    /// its next call, on every rank alike).
    #[cold]
    fn watch_done(&mut self, w: &Watched, abort: &AtomicBool) -> Result<()> {
        let mut us = [w.lock().mean_us()];
        self.all_max(&mut us, abort)?;
        if !w.lock().agreed(us[0]) {
            return Ok(());
        }
        let now = self.auto_colls;
        if let Some(Shape::Tuned(t)) = self.shapes.get_mut(&w.key) {
            if t.review_at.is_some() {
                t.review_at = Some(now);
                t.trials.stale();
                t.gap = crate::tune::online::review_gaps(self.tune.cpu_share, false).0;
                self.review_from = now;
                tracing::debug!(
                    rank = self.rank,
                    coll = w.key.0.coll.kind().name(),
                    count = w.key.0.count,
                    us = us[0],
                    "online tuning: the pick's time moved, review"
                );
            }
        }
        Ok(())
    }

    /// AllReduce (max) of `v` among the ranks, inside the current op (every
    /// rank makes it at the same point), with the cost model's algorithm.
    fn all_max(&mut self, v: &mut [f64], abort: &AtomicBool) -> Result<()> {
        let count = v.len();
        let p = Problem {
            hosts: self.tune.hosts(),
            ..Problem::new(Collective::AllReduce, self.nranks, self.rank, count)
        };
        let alg = crate::tune::select(&p, DataType::F64, None, &self.config.algo, &self.tune)?;
        let bytes = count * DataType::F64.size();
        let call = OpCall {
            coll: Collective::AllReduce,
            dtype: DataType::F64,
            op: ReduceOp::Max,
            count,
            vcounts: None,
            in_place: true,
            input: v.as_mut_ptr().cast(),
            input_len: bytes,
            output: v.as_mut_ptr().cast(),
            output_len: bytes,
            algorithm: Some(alg.algorithm),
            timeout: None,
            background: false,
        };
        self.run_inner(&call, abort, false)
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

    /// Divides the result of an Avg reduction by the rank count.
    fn finish_avg(&self, c: &OpCall) -> Result<()> {
        if c.op == ReduceOp::Avg {
            let finish = match c.coll {
                Collective::AllReduce | Collective::ReduceScatter => true,
                Collective::Reduce { root } => root == self.rank,
                _ => false,
            };
            if finish {
                // SAFETY: output holds output_len bytes, checked by the comm layer.
                let out = unsafe { std::slice::from_raw_parts_mut(c.output, c.output_len) };
                reduce::scale_avg(c.dtype, out, self.nranks);
            }
        }
        Ok(())
    }

    /// The schedule for a call shape: cached per (problem, forced algorithm),
    /// so the tuner prices each shape once.
    fn schedule_for(
        &mut self,
        problem: Problem,
        forced: Option<Algorithm>,
        c: &OpCall,
    ) -> Result<(Algorithm, Arc<Schedule>)> {
        let key = (problem, forced);
        if let Some(plan) = self.cache.get(&key) {
            self.recorder.set_algorithm(plan.alg.name());
            return Ok((plan.alg, plan.sched.clone()));
        }
        let choice = crate::tune::select(&key.0, c.dtype, forced, &self.config.algo, &self.tune)?;
        let alg = choice.algorithm;
        let built = Problem {
            chunks: choice.chunks,
            ..key.0.clone()
        };
        let s = Arc::new(alg.build(&built).ok_or_else(|| {
            Error::arg(format!(
                "algorithm {alg} does not implement {}",
                c.coll.kind()
            ))
        })?);
        if self.cache.len() > 512 {
            self.cache.clear();
        }
        self.cache.insert(
            key,
            Planned {
                alg,
                sched: s.clone(),
                stream: false,
                cma: false,
                watch: None,
                trial: None,
            },
        );
        self.recorder.set_algorithm(alg.name());
        Ok((alg, s))
    }

    fn run_schedule(
        &mut self,
        c: &OpCall,
        seq: u64,
        coll_seq: u32,
        plan: &Planned,
        abort: &AtomicBool,
    ) -> Result<()> {
        let sched = &*plan.sched;
        let esz = c.dtype.size();
        let need = sched.scratch * esz;
        if self.scratch.len() < need {
            self.scratch.resize(need, 0);
        }
        let bufs = Buffers {
            input: c.input,
            input_len: c.input_len,
            output: c.output,
            output_len: c.output_len,
            scratch: self.scratch.as_mut_ptr(),
            scratch_len: self.scratch.len(),
        };
        let timeout = c.timeout.unwrap_or(self.config.timeout);
        let op = if reduces(c.coll) {
            c.op.step_op()
        } else {
            ReduceOp::Sum
        };
        let mut cx = StepCx {
            rank: self.rank,
            seq,
            tag: op_tag(c),
            coll_seq,
            op_name: c.coll.kind().name(),
            dtype: c.dtype,
            op,
            elem: esz,
            direct_bytes: if plan.cma {
                crate::tune::CMA_TWIN_BYTES
            } else {
                self.config.direct_bytes.unwrap_or(usize::MAX)
            },
            // TUTTI_SHM_STREAM=0|1 overrides what the plan says.
            stream: self.config.shm_stream.unwrap_or(plan.stream),
            bounce: std::mem::take(&mut self.bounce),
        };
        let bell_ptr = self.bell().map(|b| b as *const Doorbell);
        let spin = if c.background {
            (self.spin.0.min(Duration::from_micros(20)), true)
        } else {
            self.spin
        };
        let r = {
            let mut env = Env {
                links: &mut self.links,
                cx: &mut cx,
                deadline: None,
                timeout,
                abort,
                // SAFETY: the doorbell lives in the segment that `bell_owner`
                // (or in the I/O set that `io`) keeps alive for the whole
                // life of this Core.
                bell: bell_ptr.map(|p| unsafe { &*p }),
                peer_pids: &self.peer_pids,
                spin,
                mailbox: self.mailbox.as_ref(),
            };
            executor::execute(sched, &bufs, &mut env, &mut self.pad)
        };
        self.bounce = cx.bounce;
        r
    }
}

/// True for the collectives that reduce.
fn reduces(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllReduce | Collective::Reduce { .. } | Collective::ReduceScatter
    )
}

/// What identifies `c` in message headers: collective, type, the user's
/// reduction (Avg, not the Sum it reduces with, so Sum and Avg do not mix;
/// Sum for collectives that do not reduce) and root.
fn op_tag(c: &OpCall) -> u16 {
    make_tag(
        c.coll.kind(),
        c.dtype,
        if reduces(c.coll) { c.op } else { ReduceOp::Sum },
        c.coll.root().unwrap_or(0),
    )
}

/// A call shape as online tuning tells them apart: the problem priced out
/// of place (whether a rank runs in place is its own affair), and the type.
type ShapeKey = (Problem, DataType);

/// The shape of a call of `p` (as the engine builds it, hosts included)
/// and `dtype`.
fn shape_of(p: &Problem, dtype: DataType) -> ShapeKey {
    (
        Problem {
            in_place: false,
            ..p.clone()
        },
        dtype,
    )
}

/// A candidate's name in the debug log: its algorithm and its twin
/// ([`crate::tune::Choice::twin`]).
fn plan_name(c: &crate::tune::Choice) -> String {
    format!("{}{}", c.algorithm.name(), c.twin())
}

/// How a call shape runs: its algorithm, the schedule built for it, and
/// whether online tuning chose streaming ring stores for it
/// ([`crate::tune::Choice::stream`]; `TUTTI_SHM_STREAM=0|1` overrides it
/// where the call runs, in `run_schedule`) or direct reads of its large
/// messages ([`crate::tune::Choice::cma`]).
#[derive(Clone)]
struct Planned {
    alg: Algorithm,
    sched: Arc<Schedule>,
    stream: bool,
    cma: bool,
    /// Online tuning's watch over its shape, where it decided this plan
    /// and watches the shape ([`tune::online::Watch`](crate::tune::online::Watch)).
    watch: Option<Arc<Watched>>,
    /// Where the plan is a candidate that online tuning tries, the element
    /// type of its shape (the problem is the one it is remembered with in
    /// `Core::last`): calls that reuse it count in the trial.
    trial: Option<DataType>,
}

/// Every rank times a watched shape's calls alike, so they fill a window at
/// the same call: watched calls never take the mailbox repeat path, which
/// skips the clock and is taken by some ranks and not others.
const _: () = assert!(crate::tune::online::WATCH_MIN_BYTES > MBOX_BYTES);

/// A tuned shape's [`Watch`], shared by the shape and the plans that run
/// its decision, so that a call that skips the tuner still counts.
struct Watched {
    key: ShapeKey,
    watch: Mutex<Watch>,
}

impl Watched {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Online tuning's say in a call ([`Core::online_choice`]).
struct Online {
    /// The decision, or the candidate to try; `None` where online tuning
    /// has no say.
    choice: Option<crate::tune::Choice>,
    /// The shape, while its trials run (the call is a trial).
    trial: Option<ShapeKey>,
    /// The shape's watch, where the call runs its decision.
    watch: Option<Arc<Watched>>,
}

/// Online tuning's state for one call shape.
enum Shape {
    /// The only candidate: nothing to try.
    Fixed(crate::tune::Choice),
    /// Candidates timed, decided on, and reviewed.
    Tuned(Tuning),
}

/// A tuned shape's trials and when they run.
struct Tuning {
    trials: Trials,
    /// `None` while its trials run (the first, or a review); else the
    /// collective number from which its next review is due (`u64::MAX`:
    /// never).
    review_at: Option<u64>,
    /// Turn spans from one review to the next ([`tune::online::REVIEW_GAP`](crate::tune::online::REVIEW_GAP)).
    gap: u64,
    /// The collective number at the current stretch's first call.
    stretch_from: u64,
    /// Times the decision's calls between reviews (calls of at least
    /// [`WATCH_MIN_BYTES`](crate::tune::online::WATCH_MIN_BYTES), reviews
    /// on).
    watch: Option<Arc<Watched>>,
}

/// Shapes online tuning keeps apart; calls of further shapes get the cost
/// model's pick. A training loop has a few dozen; `tutti perf`'s widest
/// sweep (every collective, 1 B to 4 GiB) about 330.
const MAX_SHAPES: usize = 4096;

/// Completion state shared between an async op and its [`Work`](crate::Work) handle.
#[derive(Default)]
pub(crate) struct Completion {
    state: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

impl Completion {
    pub(crate) fn complete(&self, r: Result<()>) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.cv.notify_all();
    }

    /// Waits up to `timeout` (forever if `None`); `None` if still running.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // A timeout too long to add to now (Duration::MAX, say) waits forever.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(r) = g.as_ref() {
                return Some(r.clone());
            }
            match deadline {
                None => g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    g = self
                        .cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

struct Job {
    call: OpCall,
    ticket: u64,
    done: Arc<Completion>,
}

/// The core plus what orders access to it: ops run in ticket order, and
/// only the op whose turn it is touches the core. Taking a free turn is one
/// load, passing it on one store: no lock on the path of a small op.
pub(crate) struct Turns {
    core: UnsafeCell<Core>,
    /// The ticket whose turn it is.
    next_turn: AtomicU64,
    /// Where threads wait for their turn (with `cv`), and how many do, so
    /// that passing the turn on skips the wake-up call when none waits.
    lock: Mutex<()>,
    cv: Condvar,
    waiters: AtomicU64,
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
    fn lock_turn(&self, ticket: u64, abort: Option<&AtomicBool>) -> Result<Turn<'_>> {
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
    fn end_turn(&self, g: Turn<'_>) {
        debug_assert!(std::ptr::eq(g.turns, self));
        drop(g);
    }

    /// Wakes every thread waiting for its turn (to find it, or an abort).
    #[cold]
    fn wake_all(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }
}

/// Orders and runs a communicator's ops.
pub(crate) struct Engine {
    core: Arc<Turns>,
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

    /// Runs a call on this thread, after every op issued before it. `check`
    /// checks `c` against the communicator and makes the op, unless `c`
    /// repeats the last mailbox call in all but its buffers: a training
    /// loop's small AllReduce then costs a few compares before its data
    /// moves, not a check, a tuner lookup and a dispatch.
    pub(crate) fn run_raw(
        &self,
        c: &RawCall,
        opts: &Options,
        check: impl FnOnce() -> Result<OpCall>,
    ) -> Result<()> {
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
        if let Some((seg, i)) = &self.bell {
            crate::transport::shm::abort_wake(seg.bell(*i));
        } else if let Some(io) = &self.io {
            crate::transport::shm::abort_wake(io.bell());
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
