//! The plan cache and running a schedule: how a call shape runs (its
//! algorithm and schedule, built once per shape and remembered), and the
//! run of one schedule over the links by the executor.

use super::executor::{self, Buffers, Env};
use super::online::Watched;
use super::{Core, OpCall};
use crate::algo::{Algorithm, Collective, Problem, Schedule, Wire};
use crate::error::{Error, Result};
use crate::reduce::{DataType, ReduceOp};
use crate::transport::shm::Doorbell;
use crate::transport::{make_tag, StepCx};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// How a call shape runs: its algorithm, the schedule built for it, and
/// whether online tuning chose streaming ring stores for it
/// ([`crate::tune::Choice::stream`]; `TUTTI_SHM_STREAM=0|1` overrides it
/// where the call runs, in `run_schedule`) or direct reads of its large
/// messages ([`crate::tune::Choice::cma`]).
#[derive(Clone)]
pub(super) struct Planned {
    pub(super) alg: Algorithm,
    pub(super) sched: Arc<Schedule>,
    pub(super) stream: bool,
    pub(super) cma: bool,
    /// Online tuning's watch over its shape, where it decided this plan
    /// and watches the shape ([`tune::online::Watch`](crate::tune::online::Watch)).
    pub(super) watch: Option<Arc<Watched>>,
    /// Where the plan is a candidate that online tuning tries, the element
    /// type of its shape (the problem is the one it is remembered with in
    /// `Core::last`): calls that reuse it count in the trial.
    pub(super) trial: Option<DataType>,
}

impl Core {
    /// The schedule for a call shape: cached per (problem, forced algorithm),
    /// so the tuner prices each shape once.
    pub(super) fn schedule_for(
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

    pub(super) fn run_schedule(
        &mut self,
        c: &OpCall,
        seq: u64,
        coll_seq: u32,
        plan: &Planned,
        abort: &AtomicBool,
    ) -> Result<()> {
        let sched = &*plan.sched;
        let esz = c.dtype.size();
        // The wire staging follows the scratch in the same allocation.
        let (scratch_len, wire_len) = (sched.scratch * esz, sched.staging * 2);
        if self.scratch.len() < scratch_len + wire_len {
            self.scratch.resize(scratch_len + wire_len, 0);
        }
        let base = self.scratch.as_mut_ptr();
        let bufs = Buffers {
            input: c.input,
            input_len: c.input_len,
            output: c.output,
            output_len: c.output_len,
            scratch: base,
            scratch_len,
            // SAFETY: scratch_len <= the allocation's length (above).
            wire: unsafe { base.add(scratch_len) },
            wire_len,
        };
        let wire = sched
            .wire
            .map(|w| (wire_type(w), w.scale_shift(self.nranks)));
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
                crate::tune::cma_direct_bytes(c.coll)
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
                wire,
            };
            executor::execute(sched, &bufs, &mut env, &mut self.pad)
        };
        self.bounce = cx.bounce;
        r
    }
}

/// The element type of wire type `w`.
pub(super) fn wire_type(w: Wire) -> DataType {
    match w {
        Wire::Bf16 => DataType::Bf16,
        Wire::F16 => DataType::F16,
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
pub(super) fn op_tag(c: &OpCall) -> u16 {
    make_tag(
        c.coll.kind(),
        c.dtype,
        if reduces(c.coll) { c.op } else { ReduceOp::Sum },
        c.coll.root().unwrap_or(0),
    )
}
