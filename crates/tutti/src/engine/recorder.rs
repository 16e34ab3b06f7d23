//! The flight recorder: each communicator remembers its last ops (sequence
//! number, kind, size, type, algorithm, state, timestamps). When an op
//! fails, the record is logged and, if `TUTTI_TRACE_DIR` is set, written as
//! `tutti-trace-rank<R>.json` there; [`analyze`] reads every rank's file and
//! says which rank is behind, at which op.
//!
//! With `TUTTI_TRACE_DIR` set, the recorder also times ops (their start
//! and end, from a raw cycle counter: two reads of it per op, no system
//! call) and keeps the last [`TIMED_CAPACITY`] of them; a communicator
//! destroyed healthy writes its trace too, for `tutti explain`
//! ([`crate::explain`]). Every op of [`TIME_ALL_BYTES`] or more is timed;
//! smaller ones one in [`SAMPLE`], by sequence number (so every rank times
//! the same ones), which keeps the cost of timing a small call under 1%.
//! Without it, no clock is read on an op's path.

use crate::tune::{CostModel, LinkClass, TuneCtx};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How many ops each communicator remembers.
pub const CAPACITY: usize = 64;

/// How many ops each communicator remembers when it times them
/// (`TUTTI_TRACE_DIR` set): a power of two.
pub const TIMED_CAPACITY: usize = 4096;

/// Ops of at least this many bytes are all timed (a call of 64 KiB takes
/// microseconds: two counter reads are well under 1% of it).
pub const TIME_ALL_BYTES: usize = 64 << 10;

/// Of the smaller ops, those whose sequence number is a multiple of this
/// are timed.
pub const SAMPLE: u64 = 16;

/// The state of a recorded op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Started, not finished.
    Running,
    /// Finished successfully.
    Done,
    /// Failed, with the error message.
    Failed(String),
}

/// One recorded op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRecord {
    /// Sequence number on the communicator.
    pub seq: u64,
    /// Collective name (`all_reduce`, ...).
    pub op: String,
    /// Root or peer, for rooted and point-to-point ops.
    pub root_or_peer: Option<usize>,
    /// Element count.
    pub count: usize,
    /// Element type.
    pub dtype: String,
    /// Reduction.
    pub redop: String,
    /// Algorithm used (empty if it failed before one was picked).
    pub algorithm: String,
    /// State.
    pub state: OpState,
    /// Start, microseconds since the Unix epoch (0 where ops were not
    /// timed).
    pub start_us: u64,
    /// End (success or failure), microseconds since the Unix epoch (0 if
    /// not known: untimed and not failed, or still running).
    pub end_us: u64,
    /// Bytes of the call: `count` times the element size.
    #[serde(default)]
    pub bytes: u64,
    /// The algorithm was forced (by the call or `TUTTI_ALGO`), not Auto's pick.
    #[serde(default)]
    pub forced: bool,
    /// Start, nanoseconds since the Unix epoch (0 where ops were not
    /// timed): when the op's turn came on this rank, after every op issued
    /// before it. Ranks of one host read one clock; across hosts, the
    /// clocks are as close as the hosts keep them (NTP: tens of
    /// microseconds to milliseconds).
    #[serde(default)]
    pub start_ns: u64,
    /// End, nanoseconds since the Unix epoch (0 if not known).
    #[serde(default)]
    pub end_ns: u64,
}

/// A rank's trace file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trace {
    /// The rank.
    pub rank: usize,
    /// Communicator size.
    pub size: usize,
    /// The last ops, oldest first.
    pub ops: Vec<OpRecord>,
    /// Ops were timed (`TUTTI_TRACE_DIR` set when the communicator was
    /// made): every op of [`TIME_ALL_BYTES`] or more, and the smaller
    /// ones whose sequence number is a multiple of [`SAMPLE`].
    #[serde(default)]
    pub timed: bool,
    /// The host index of every rank of the communicator (empty in traces
    /// written before it was recorded).
    #[serde(default)]
    pub host_of: Vec<usize>,
    /// Ranks are threads of one process.
    #[serde(default)]
    pub threads: bool,
    /// The links from this rank to its peers: `shm`, `tcp`, `local`, or
    /// several joined by `+`.
    #[serde(default)]
    pub links: String,
    /// The cost model's parameters this communicator's tuner used
    /// (calibrated, or the defaults).
    #[serde(default)]
    pub model: Option<CostModel>,
}

/// A raw cycle counter: the time-stamp counter on x86-64 (about 10 ns a
/// read, no system call), nanoseconds of a monotonic clock elsewhere.
#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no preconditions: it reads the time-stamp
        // counter, which every x86-64 CPU has.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
    }
}

/// Turns [`ticks`] into nanoseconds since the Unix epoch: anchored at the
/// recorder's birth (the counter, a monotonic and the wall clock read
/// together), its rate measured against the monotonic clock when a trace
/// is written.
#[derive(Clone, Copy, Debug)]
struct Clock {
    ticks0: u64,
    mono0: Instant,
    epoch0_ns: u64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            ticks0: ticks(),
            mono0: Instant::now(),
            epoch0_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        }
    }

    /// Nanoseconds per tick, measured now.
    fn rate(&self) -> f64 {
        let dt = ticks().wrapping_sub(self.ticks0);
        let ns = self.mono0.elapsed().as_nanos() as f64;
        if dt == 0 || ns <= 0.0 {
            1.0
        } else {
            ns / dt as f64
        }
    }

    /// `t` (from [`ticks`], 0: not read) as nanoseconds since the epoch.
    fn epoch_ns(&self, t: u64, rate: f64) -> u64 {
        if t == 0 {
            return 0;
        }
        let d = t.wrapping_sub(self.ticks0) as i64 as f64 * rate;
        (self.epoch0_ns as f64 + d).max(0.0) as u64
    }
}

/// The state of a [`Rec`]: [`OpState`] without the message, so that a
/// record is plain data (the messages of failures are kept aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecState {
    Running,
    Done,
    Failed,
}

/// What the hot path records: plain data, no allocation per op.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rec {
    pub seq: u64,
    pub op: &'static str,
    pub root_or_peer: Option<usize>,
    pub count: usize,
    pub dtype: &'static str,
    pub redop: &'static str,
    pub algorithm: &'static str,
    pub state: RecState,
    /// Bytes of the call.
    pub bytes: usize,
    /// The call forced its algorithm.
    pub forced: bool,
    /// Start, in [`ticks`] (0: not read).
    pub t0: u64,
    /// End, in [`ticks`] (0: not read).
    pub t1: u64,
}

impl Rec {
    fn record(&self, failures: &VecDeque<(u64, String)>, clock: &Clock, rate: f64) -> OpRecord {
        let (s, e) = (clock.epoch_ns(self.t0, rate), clock.epoch_ns(self.t1, rate));
        let state = match self.state {
            RecState::Running => OpState::Running,
            RecState::Done => OpState::Done,
            RecState::Failed => OpState::Failed(
                failures
                    .iter()
                    .find(|(s, _)| *s == self.seq)
                    .map_or_else(String::new, |(_, m)| m.clone()),
            ),
        };
        OpRecord {
            seq: self.seq,
            op: self.op.into(),
            root_or_peer: self.root_or_peer,
            count: self.count,
            dtype: self.dtype.into(),
            redop: self.redop.into(),
            algorithm: self.algorithm.into(),
            state,
            start_us: s / 1000,
            end_us: e / 1000,
            bytes: self.bytes as u64,
            forced: self.forced,
            start_ns: s,
            end_ns: e,
        }
    }
}

/// The recorder itself: a ring of the last [`CAPACITY`] ops
/// ([`TIMED_CAPACITY`] when it times them).
pub(crate) struct Recorder {
    ring: Box<[Option<Rec>]>,
    /// `ring.len() - 1` (the length is a power of two).
    mask: usize,
    /// Ops recorded so far; the newest is at `(started - 1) & mask`.
    started: usize,
    /// Messages of the failed ops still in the ring, by sequence number.
    failures: VecDeque<(u64, String)>,
    /// Every op's start and end are read.
    timed: bool,
    clock: Clock,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new(false)
    }
}

impl Recorder {
    /// A recorder; `timed`: read the clock at ops' start and end (see the
    /// module's comment).
    pub(crate) fn new(timed: bool) -> Recorder {
        let cap = if timed { TIMED_CAPACITY } else { CAPACITY };
        Recorder {
            ring: vec![None; cap].into_boxed_slice(),
            mask: cap - 1,
            started: 0,
            failures: VecDeque::new(),
            timed,
            clock: Clock::new(),
        }
    }

    #[inline]
    pub(crate) fn start(&mut self, mut r: Rec) {
        if self.timed && (r.bytes >= TIME_ALL_BYTES || r.seq.is_multiple_of(SAMPLE)) {
            r.t0 = ticks();
        }
        self.ring[self.started & self.mask] = Some(r);
        self.started += 1;
    }

    fn newest(&mut self) -> Option<&mut Rec> {
        let i = self.started.checked_sub(1)?;
        self.ring[i & self.mask].as_mut()
    }

    pub(crate) fn set_algorithm(&mut self, alg: &'static str) {
        if let Some(r) = self.newest() {
            r.algorithm = alg;
        }
    }

    /// Ends the newest op successfully.
    #[inline]
    pub(crate) fn done(&mut self) {
        if let Some(r) = self.newest() {
            r.state = RecState::Done;
            if r.t0 != 0 {
                r.t1 = ticks();
            }
        }
    }

    /// Ends the newest op as failed with `msg`. Failures are always
    /// timestamped (untimed, the clock is not read on an op's path).
    pub(crate) fn failed(&mut self, msg: String) {
        let Some(r) = self.newest() else { return };
        r.state = RecState::Failed;
        r.t1 = ticks();
        let seq = r.seq;
        if self.failures.len() == CAPACITY {
            self.failures.pop_front();
        }
        self.failures.push_back((seq, msg));
    }

    /// The recorded ops, oldest first.
    fn ops(&self) -> impl Iterator<Item = &Rec> {
        let n = self.started.min(self.ring.len());
        (self.started - n..self.started).filter_map(|i| self.ring[i & self.mask].as_ref())
    }

    /// The trace of rank `rank` of `ctx`'s communicator.
    fn trace(&self, rank: usize, size: usize, ctx: &TuneCtx) -> Trace {
        let rate = self.clock.rate();
        let mut links: Vec<&str> = Vec::new();
        for peer in (0..size).filter(|&p| p != rank) {
            let l = match ctx.class(rank, peer) {
                LinkClass::Local => "local",
                LinkClass::Shm => "shm",
                LinkClass::Tcp => "tcp",
            };
            if !links.contains(&l) {
                links.push(l);
            }
        }
        Trace {
            rank,
            size,
            ops: self
                .ops()
                .map(|r| r.record(&self.failures, &self.clock, rate))
                .collect(),
            timed: self.timed,
            host_of: ctx.host_of.clone(),
            threads: ctx.threads,
            links: links.join("+"),
            model: Some(ctx.model),
        }
    }

    /// Writes the trace of a communicator destroyed healthy, if its ops
    /// were timed, to `dir` ([`Config::trace_dir`](crate::Config::trace_dir)).
    /// A trace there from a larger communicator of the same rank (this
    /// process's world, where this one is a split of it) is kept.
    pub(crate) fn dump_at_end(&self, rank: usize, size: usize, dir: Option<&Path>, ctx: &TuneCtx) {
        let Some(dir) = dir.filter(|_| self.timed && self.started > 0) else {
            return;
        };
        let path = dir.join(format!("tutti-trace-rank{rank}.json"));
        #[derive(Deserialize)]
        struct Size {
            size: usize,
        }
        let larger = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Size>(&b).ok())
            .is_some_and(|s| s.size > size);
        if !larger {
            write(dir, &path, &self.trace(rank, size, ctx));
        }
    }

    /// Logs the record and writes it to `dir`
    /// ([`Config::trace_dir`](crate::Config::trace_dir), `TUTTI_TRACE_DIR`), if any.
    pub(crate) fn dump(&self, rank: usize, size: usize, dir: Option<&Path>, ctx: &TuneCtx) {
        let t = self.trace(rank, size, ctx);
        let shown = t.ops.len().saturating_sub(8);
        for r in &t.ops[shown..] {
            tracing::error!(
                rank,
                "flight recorder: #{} {} count {} {} {} via {}: {:?}",
                r.seq,
                r.op,
                r.count,
                r.dtype,
                r.redop,
                r.algorithm,
                r.state
            );
        }
        if let Some(dir) = dir {
            write(dir, &dir.join(format!("tutti-trace-rank{rank}.json")), &t);
        }
    }
}

/// Writes `t` to `path` in `dir`: pretty when short (a failure's record, to
/// be read by people), compact when long (a timed run's, for `explain`).
fn write(dir: &Path, path: &Path, t: &Trace) {
    let _ = std::fs::create_dir_all(dir);
    let b = if t.ops.len() <= CAPACITY {
        serde_json::to_vec_pretty(t)
    } else {
        serde_json::to_vec(t)
    };
    match b {
        Ok(b) => {
            // Write aside, then rename: a rank killed mid-write
            // leaves no half file for `analyze` to trip on.
            let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
            if let Err(e) = std::fs::write(&tmp, b).and_then(|_| std::fs::rename(&tmp, path)) {
                tracing::error!("cannot write {}: {e}", path.display());
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Err(e) => tracing::error!("cannot serialise the flight recorder: {e}"),
    }
}

/// What [`analyze`] concludes.
#[derive(Clone, Debug)]
pub struct Analysis {
    /// Traces read, by rank.
    pub traces: Vec<Trace>,
    /// Ranks whose trace file is missing.
    pub missing: Vec<usize>,
    /// A human-readable diagnosis.
    pub summary: String,
}

/// Reads every `tutti-trace-rank*.json` in `dir` and finds the rank that is behind.
pub fn analyze(dir: &Path) -> std::io::Result<Analysis> {
    let mut traces = Vec::new();
    let mut unreadable = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("tutti-trace-rank") && name.ends_with(".json") {
            let b = std::fs::read(&p)?;
            match serde_json::from_slice::<Trace>(&b) {
                Ok(t) => traces.push(t),
                // A file that cannot be read counts as missing, with a note.
                Err(e) => unreadable.push(format!("{}: {e}", p.display())),
            }
        }
    }
    traces.sort_by_key(|t| t.rank);
    let size = traces.iter().map(|t| t.size).max().unwrap_or(0);
    let missing: Vec<usize> = (0..size)
        .filter(|r| !traces.iter().any(|t| t.rank == *r))
        .collect();
    let mut lines = Vec::new();
    let last_done = |t: &Trace| {
        t.ops
            .iter()
            .filter(|o| o.state == OpState::Done)
            .map(|o| o.seq)
            .max()
    };
    let furthest = traces.iter().filter_map(last_done).max();
    for t in &traces {
        let cur = t.ops.last();
        let d = last_done(t);
        let status = match cur {
            Some(o) => format!(
                "last op #{} {} ({} x {}) {:?}",
                o.seq, o.op, o.count, o.dtype, o.state
            ),
            None => "no ops recorded".into(),
        };
        let behind = match (d, furthest) {
            (Some(a), Some(b)) if a < b => format!("  <-- behind: {} op(s) fewer completed", b - a),
            (None, Some(_)) => "  <-- behind: no op completed".into(),
            _ => String::new(),
        };
        lines.push(format!("rank {}: {status}{behind}", t.rank));
    }
    for u in &unreadable {
        lines.push(format!("unreadable trace file (ignored): {u}"));
    }
    if !missing.is_empty() {
        lines.push(format!(
            "no trace from rank(s) {missing:?}: they died, hung before the first failure, or ran without TUTTI_TRACE_DIR"
        ));
    }
    // Ops in flight that disagree between ranks point to a mismatch.
    let running: Vec<(usize, &OpRecord)> = traces
        .iter()
        .filter_map(|t| {
            t.ops
                .iter()
                .find(|o| o.state != OpState::Done)
                .map(|o| (t.rank, o))
        })
        .collect();
    if let Some((r0, first)) = running.first() {
        for (r, o) in &running[1..] {
            if o.seq == first.seq
                && (o.op != first.op || o.count != first.count || o.dtype != first.dtype)
            {
                lines.push(format!(
                    "mismatch at op #{}: rank {r0} ran {} ({} x {}), rank {r} ran {} ({} x {})",
                    o.seq, first.op, first.count, first.dtype, o.op, o.count, o.dtype
                ));
            }
        }
    }
    Ok(Analysis {
        traces,
        missing,
        summary: lines.join("\n"),
    })
}
