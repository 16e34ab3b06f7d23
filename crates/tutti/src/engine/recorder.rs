//! The flight recorder: each communicator remembers its last ops (sequence
//! number, kind, size, type, algorithm, state, timestamps). When an op
//! fails, the record is logged and, if `TUTTI_TRACE_DIR` is set, written as
//! `tutti-trace-rank<R>.json` there; [`analyze`] reads every rank's file and
//! says which rank is behind, at which op.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// How many ops each communicator remembers.
pub const CAPACITY: usize = 64;

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
    /// Start, microseconds since the Unix epoch (recorded when the op first
    /// had to wait; 0 if it never did).
    pub start_us: u64,
    /// When it failed, microseconds since the Unix epoch (0 if it did not).
    pub end_us: u64,
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
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
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
    pub start_us: u64,
    pub end_us: u64,
}

impl Rec {
    fn record(&self, failures: &VecDeque<(u64, String)>) -> OpRecord {
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
            start_us: self.start_us,
            end_us: self.end_us,
        }
    }
}

/// The recorder itself: a ring of the last [`CAPACITY`] ops.
pub(crate) struct Recorder {
    ring: [Option<Rec>; CAPACITY],
    /// Ops recorded so far; the newest is at `(started - 1) % CAPACITY`.
    started: usize,
    /// Messages of the failed ops still in the ring, by sequence number.
    failures: VecDeque<(u64, String)>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            ring: [None; CAPACITY],
            started: 0,
            failures: VecDeque::new(),
        }
    }
}

impl Recorder {
    pub(crate) fn start(&mut self, r: Rec) {
        self.ring[self.started % CAPACITY] = Some(r);
        self.started += 1;
    }

    fn newest(&mut self) -> Option<&mut Rec> {
        let i = self.started.checked_sub(1)?;
        self.ring[i % CAPACITY].as_mut()
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
        }
    }

    /// Ends the newest op as failed with `msg`. Only failures are
    /// timestamped (the clock is not read on the hot path of every small op).
    pub(crate) fn failed(&mut self, msg: String) {
        let Some(r) = self.newest() else { return };
        r.state = RecState::Failed;
        r.end_us = now_us();
        let seq = r.seq;
        if self.failures.len() == CAPACITY {
            self.failures.pop_front();
        }
        self.failures.push_back((seq, msg));
    }

    /// The recorded ops, oldest first.
    fn ops(&self) -> impl Iterator<Item = &Rec> {
        let n = self.started.min(CAPACITY);
        (self.started - n..self.started).filter_map(|i| self.ring[i % CAPACITY].as_ref())
    }

    /// Logs the record and writes it to `dir`
    /// ([`Config::trace_dir`](crate::Config::trace_dir), `TUTTI_TRACE_DIR`), if any.
    pub(crate) fn dump(&self, rank: usize, size: usize, dir: Option<&Path>) {
        let t = Trace {
            rank,
            size,
            ops: self.ops().map(|r| r.record(&self.failures)).collect(),
        };
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
            let path = dir.join(format!("tutti-trace-rank{rank}.json"));
            let _ = std::fs::create_dir_all(dir);
            match serde_json::to_vec_pretty(&t) {
                Ok(b) => {
                    // Write aside, then rename: a rank killed mid-write
                    // leaves no half file for `analyze` to trip on.
                    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
                    if let Err(e) =
                        std::fs::write(&tmp, b).and_then(|_| std::fs::rename(&tmp, &path))
                    {
                        tracing::error!("cannot write {}: {e}", path.display());
                        let _ = std::fs::remove_file(&tmp);
                    }
                }
                Err(e) => tracing::error!("cannot serialise the flight recorder: {e}"),
            }
        }
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
