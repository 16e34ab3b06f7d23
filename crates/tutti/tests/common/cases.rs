//! One function per collective that builds inputs from the value formula,
//! runs the collective (through the typed API, or through `run_raw` with a
//! forced algorithm) and checks every output element, and that the send
//! buffer was left alone. Failures are recorded, not panicked on, so that all
//! ranks keep issuing the same sequence of collectives and the report lists
//! every failing case.

use super::data::{check, reduce_want, val, Flavor, TElem, Want};
use super::Ctx;
use std::collections::BTreeMap;
use tutti::algo::{Problem, VCounts};
use tutti::{Algorithm, Collective, Communicator, Element, Options, RawCall, ReduceOp};

/// How collectives are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The typed API; the tuner (or `TUTTI_ALGO`) picks the algorithm.
    Default,
    /// `run_raw` / `all_reduce_with` with `Options { algorithm: Some(a) }`.
    Forced(Algorithm),
}

/// Runs cases on one rank and keeps the score.
pub struct Runner<'a> {
    pub comm: &'a Communicator,
    pub ctx: &'a Ctx,
    pub mode: Mode,
    salt: u64,
    barriers: usize,
    /// Cases run, per collective.
    pub counts: BTreeMap<&'static str, usize>,
    /// Cases skipped because the forced algorithm does not implement them.
    pub skipped: usize,
    pub failures: Vec<String>,
    pub failed: usize,
    start: std::time::Instant,
}

/// Elements of AllToAllV's block from rank `q` to rank `p` when the base count is `c`.
pub fn v_count(q: usize, p: usize, c: usize) -> usize {
    if c == 0 {
        0
    } else {
        (super::data::mix64((q * 64 + p) as u64) % (c as u64 + 1)) as usize
    }
}

/// Counts and displacements of rank `r`'s AllToAllV: send blocks in reverse
/// peer order with one element of gap, receive blocks in peer order with two.
pub fn v_layout(n: usize, r: usize, c: usize) -> (VCounts, usize, usize) {
    let send_counts: Vec<usize> = (0..n).map(|p| v_count(r, p, c)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|q| v_count(q, r, c)).collect();
    let mut send_displs = vec![0; n];
    let mut at = 0;
    for p in (0..n).rev() {
        send_displs[p] = at;
        at += send_counts[p] + 1;
    }
    let send_len = at;
    let mut recv_displs = vec![0; n];
    let mut at = 1;
    for q in 0..n {
        recv_displs[q] = at;
        at += recv_counts[q] + 2;
    }
    (
        VCounts {
            send_counts,
            send_displs,
            recv_counts,
            recv_displs,
        },
        send_len,
        at,
    )
}

/// Position of `r` in its cycle of the permutation `x -> x + s (mod n)`,
/// counted in the sending direction from the cycle's smallest member. Every
/// rank of a cycle computes the same numbering.
fn cycle_pos(r: usize, s: usize, n: usize) -> usize {
    let mut members = vec![r];
    let mut x = (r + s) % n;
    while x != r {
        members.push(x);
        x = (x + s) % n;
    }
    let start = *members.iter().min().expect("non-empty");
    let mut pos = 0;
    let mut y = start;
    while y != r {
        y = (y + s) % n;
        pos += 1;
    }
    pos
}

impl<'a> Runner<'a> {
    pub fn new(comm: &'a Communicator, ctx: &'a Ctx, mode: Mode) -> Self {
        Runner {
            comm,
            ctx,
            mode,
            salt: 0,
            barriers: 0,
            counts: BTreeMap::new(),
            skipped: 0,
            failures: Vec::new(),
            failed: 0,
            start: std::time::Instant::now(),
        }
    }

    fn n(&self) -> usize {
        self.comm.size()
    }

    fn r(&self) -> usize {
        self.comm.rank()
    }

    /// Each rank's host, as the engine passes it to the algorithms (only
    /// for processes on more than one host).
    fn hosts(&self) -> Option<std::sync::Arc<[usize]>> {
        let t = self.comm.topology();
        (t.hosts.len() > 1 && self.ctx.transport != super::Transport::Local)
            .then(|| t.host_of.clone().into())
    }

    fn next_salt(&mut self) -> u64 {
        self.salt += 1;
        self.salt
    }

    fn mode_name(&self) -> String {
        match self.mode {
            Mode::Default => "default".into(),
            Mode::Forced(a) => format!("forced {a}"),
        }
    }

    /// True if the case can run in the current mode (a forced algorithm must implement it).
    fn applies(
        &mut self,
        coll: Collective,
        count: usize,
        in_place: bool,
        v: Option<&VCounts>,
    ) -> bool {
        let Mode::Forced(a) = self.mode else {
            return true;
        };
        let mut p = Problem::new(coll, self.n(), self.r(), count);
        p.in_place = in_place;
        p.vcounts = v.cloned();
        p.hosts = self.hosts();
        let ok = a.build(&p).is_some();
        if !ok {
            self.skipped += 1;
        }
        ok
    }

    fn record(&mut self, what: &'static str, label: String, r: Result<(), String>) {
        *self.counts.entry(what).or_default() += 1;
        if let Err(e) = r {
            self.failed += 1;
            let line = format!("rank {} [{}] {label}: {e}", self.r(), self.mode_name());
            // Into the rank's log at once, with the time: a job that goes on
            // after a failure (each later op waiting out its timeout, say)
            // and is killed at the hard timeout still shows the first one.
            eprintln!("FAILED after {:.2?}: {line}", self.start.elapsed());
            if self.failures.len() < 40 {
                self.failures.push(line);
            }
        }
    }

    /// Logs (on rank 0) how long the cases so far took.
    pub fn phase(&self, what: &str) {
        if self.r() == 0 {
            println!(
                "{what}: {} cases after {:.2?}",
                self.total(),
                self.start.elapsed()
            );
        }
    }

    /// Total cases run.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }

    /// A one-line summary of the cases run.
    pub fn summary(&self) -> String {
        let per: Vec<String> = self
            .counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!(
            "{} cases, {} skipped (algorithm does not implement), {} failed: {}",
            self.total(),
            self.skipped,
            self.failed,
            per.join(", ")
        )
    }

    /// Panics with every recorded failure, if any.
    pub fn finish(&self, title: &str) {
        let line = format!("{title}: {}", self.summary());
        if self.r() == 0 {
            println!("{line} ({:.1?})", self.start.elapsed());
            // The job's directory (whose summary the parent prints), also
            // for threads running in a harness child.
            let dir = std::env::var_os(super::DIR_VAR).map_or(self.ctx.dir.clone(), Into::into);
            let p = dir.join("summary.txt");
            let mut old = std::fs::read_to_string(&p).unwrap_or_default();
            old += &line;
            old.push('\n');
            let _ = std::fs::write(p, old);
        }
        assert!(
            self.failures.is_empty(),
            "{} case(s) failed:\n{}",
            self.failed,
            self.failures.join("\n")
        );
    }

    /// Issues `c` through `run_raw` with the forced algorithm.
    #[allow(clippy::too_many_arguments)]
    fn raw<T: Element>(
        &self,
        coll: Collective,
        op: ReduceOp,
        count: usize,
        send: *const T,
        send_len: usize,
        recv: *mut T,
        recv_len: usize,
        vcounts: Option<VCounts>,
    ) -> tutti::Result<()> {
        let Mode::Forced(a) = self.mode else {
            unreachable!("raw calls are for forced algorithms")
        };
        let c = RawCall {
            coll,
            dtype: T::DTYPE,
            op,
            count,
            send: send as *const u8,
            send_len: send_len * size_of::<T>(),
            recv: recv as *mut u8,
            recv_len: recv_len * size_of::<T>(),
            vcounts,
        };
        let opts = Options {
            algorithm: Some(a),
            timeout: None,
            wire: None,
        };
        // SAFETY: every caller passes pointers of live vectors of the given
        // lengths that nothing else touches until this blocking call returns.
        unsafe { self.comm.run_raw(&c, &opts) }
    }

    /// Float AllReduce results must be bitwise the same on every rank (every
    /// algorithm reduces each element once, in a fixed order, and copies the
    /// result). Checked up to 64 KiB by gathering every rank's bytes.
    fn same_everywhere<T: TElem>(&self, got: &[T]) -> Result<(), String> {
        let bytes: &[u8] = bytemuck::cast_slice(got);
        if !T::is_float() || bytes.len() > 64 << 10 || self.n() == 1 {
            return Ok(());
        }
        let mut all = vec![0u8; bytes.len() * self.n()];
        self.comm
            .all_gather(bytes, &mut all)
            .map_err(|e| format!("gathering results: {e}"))?;
        let differ: Vec<usize> = (0..self.n())
            .filter(|&q| &all[q * bytes.len()..][..bytes.len()] != bytes)
            .collect();
        if differ.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the result differs bitwise from rank(s) {differ:?}'s"
            ))
        }
    }

    fn input<T: TElem>(fl: Flavor, salt: u64, r: usize, len: usize) -> Vec<T> {
        (0..len).map(|i| val(fl, salt, r, i)).collect()
    }

    fn unchanged<T: TElem>(send: &[T], fl: Flavor, salt: u64, r: usize) -> Result<(), String> {
        check(send, |i| Want::Exact(val(fl, salt, r, i)))
            .map_err(|e| format!("the send buffer was modified: {e}"))
    }

    // ---- the collectives ----

    /// AllReduce of `count` elements, in place or not.
    pub fn all_reduce<T: TElem>(&mut self, op: ReduceOp, count: usize, in_place: bool) {
        if !self.applies(Collective::AllReduce, count, in_place, None) {
            return;
        }
        let (n, r, salt, fl) = (self.n(), self.r(), self.next_salt(), Flavor::for_op(op));
        let mut send: Vec<T> = Self::input(fl, salt, r, count);
        let res = if in_place {
            let res = match self.mode {
                Mode::Default => self.comm.all_reduce(&mut send, op),
                Mode::Forced(a) => self.comm.all_reduce_with(
                    &mut send,
                    op,
                    &Options {
                        algorithm: Some(a),
                        timeout: None,
                        wire: None,
                    },
                ),
            };
            res.map_err(|e| e.to_string())
                .and_then(|_| {
                    check(&send, |i| {
                        reduce_want(op, (0..n).map(|q| val::<T>(fl, salt, q, i)))
                    })
                })
                .and_then(|_| self.same_everywhere(&send))
        } else {
            let mut recv = vec![T::sentinel(); count];
            let res = match self.mode {
                Mode::Default => self.comm.all_reduce_into(&send, &mut recv, op),
                Mode::Forced(_) => self.raw(
                    Collective::AllReduce,
                    op,
                    count,
                    send.as_ptr(),
                    count,
                    recv.as_mut_ptr(),
                    count,
                    None,
                ),
            };
            res.map_err(|e| e.to_string())
                .and_then(|_| {
                    check(&recv, |i| {
                        reduce_want(op, (0..n).map(|q| val::<T>(fl, salt, q, i)))
                    })
                })
                .and_then(|_| Self::unchanged(&send, fl, salt, r))
                .and_then(|_| self.same_everywhere(&recv))
        };
        let what = if in_place {
            "all_reduce"
        } else {
            "all_reduce_into"
        };
        self.record(what, format!("{what} {} {op} count={count}", T::DTYPE), res);
    }

    /// Reduce to `root`.
    pub fn reduce<T: TElem>(&mut self, op: ReduceOp, count: usize, root: usize) {
        let coll = Collective::Reduce { root };
        if !self.applies(coll, count, false, None) {
            return;
        }
        let (n, r, salt, fl) = (self.n(), self.r(), self.next_salt(), Flavor::for_op(op));
        let send: Vec<T> = Self::input(fl, salt, r, count);
        let mut recv = if r == root {
            vec![T::sentinel(); count]
        } else {
            Vec::new()
        };
        let res = match self.mode {
            Mode::Default => self.comm.reduce(&send, &mut recv, op, root),
            Mode::Forced(_) => self.raw(
                coll,
                op,
                count,
                send.as_ptr(),
                count,
                recv.as_mut_ptr(),
                recv.len(),
                None,
            ),
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| {
                check(&recv, |i| {
                    reduce_want(op, (0..n).map(|q| val::<T>(fl, salt, q, i)))
                })
            })
            .and_then(|_| Self::unchanged(&send, fl, salt, r));
        self.record(
            "reduce",
            format!("reduce {} {op} count={count} root={root}", T::DTYPE),
            res,
        );
    }

    /// ReduceScatter: `count` elements per rank.
    pub fn reduce_scatter<T: TElem>(&mut self, op: ReduceOp, count: usize) {
        if !self.applies(Collective::ReduceScatter, count, false, None) {
            return;
        }
        let (n, r, salt, fl) = (self.n(), self.r(), self.next_salt(), Flavor::for_op(op));
        let send: Vec<T> = Self::input(fl, salt, r, n * count);
        let mut recv = vec![T::sentinel(); count];
        let res = match self.mode {
            Mode::Default => self.comm.reduce_scatter(&send, &mut recv, op),
            Mode::Forced(_) => self.raw(
                Collective::ReduceScatter,
                op,
                count,
                send.as_ptr(),
                send.len(),
                recv.as_mut_ptr(),
                count,
                None,
            ),
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| {
                check(&recv, |i| {
                    reduce_want(op, (0..n).map(|q| val::<T>(fl, salt, q, r * count + i)))
                })
            })
            .and_then(|_| Self::unchanged(&send, fl, salt, r));
        self.record(
            "reduce_scatter",
            format!("reduce_scatter {} {op} count={count}", T::DTYPE),
            res,
        );
    }

    /// Broadcast from `root`.
    pub fn broadcast<T: TElem>(&mut self, count: usize, root: usize) {
        let coll = Collective::Broadcast { root };
        if !self.applies(coll, count, false, None) {
            return;
        }
        let (r, salt) = (self.r(), self.next_salt());
        let fl = Flavor::Plain;
        let mut buf: Vec<T> = if r == root {
            Self::input(fl, salt, root, count)
        } else {
            vec![T::sentinel(); count]
        };
        let res = match self.mode {
            Mode::Default => self.comm.broadcast(&mut buf, root),
            Mode::Forced(_) => {
                let p = buf.as_mut_ptr();
                self.raw(coll, ReduceOp::Sum, count, p, count, p, count, None)
            }
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| check(&buf, |i| Want::Exact(val(fl, salt, root, i))));
        self.record(
            "broadcast",
            format!("broadcast {} count={count} root={root}", T::DTYPE),
            res,
        );
    }

    /// AllGather of `count` elements per rank.
    pub fn all_gather<T: TElem>(&mut self, count: usize) {
        if !self.applies(Collective::AllGather, count, false, None) {
            return;
        }
        let (n, r, salt, fl) = (self.n(), self.r(), self.next_salt(), Flavor::Plain);
        let send: Vec<T> = Self::input(fl, salt, r, count);
        let mut recv = vec![T::sentinel(); n * count];
        let res = match self.mode {
            Mode::Default => self.comm.all_gather(&send, &mut recv),
            Mode::Forced(_) => self.raw(
                Collective::AllGather,
                ReduceOp::Sum,
                count,
                send.as_ptr(),
                count,
                recv.as_mut_ptr(),
                recv.len(),
                None,
            ),
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| check(&recv, |j| Want::Exact(val(fl, salt, j / count, j % count))))
            .and_then(|_| Self::unchanged(&send, fl, salt, r));
        self.record(
            "all_gather",
            format!("all_gather {} count={count}", T::DTYPE),
            res,
        );
    }

    /// AllToAll with blocks of `count` elements.
    pub fn all_to_all<T: TElem>(&mut self, count: usize) {
        if !self.applies(Collective::AllToAll, count, false, None) {
            return;
        }
        let (n, r, salt, fl) = (self.n(), self.r(), self.next_salt(), Flavor::Plain);
        let send: Vec<T> = Self::input(fl, salt, r, n * count);
        let mut recv = vec![T::sentinel(); n * count];
        let res = match self.mode {
            Mode::Default => self.comm.all_to_all(&send, &mut recv),
            Mode::Forced(_) => self.raw(
                Collective::AllToAll,
                ReduceOp::Sum,
                count,
                send.as_ptr(),
                send.len(),
                recv.as_mut_ptr(),
                recv.len(),
                None,
            ),
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| {
                check(&recv, |j| {
                    Want::Exact(val(fl, salt, j / count, r * count + j % count))
                })
            })
            .and_then(|_| Self::unchanged(&send, fl, salt, r));
        self.record(
            "all_to_all",
            format!("all_to_all {} count={count}", T::DTYPE),
            res,
        );
    }

    /// AllToAllV with per-pair counts in 0..=count, gaps between blocks, and
    /// send blocks in reverse order. Gaps must keep their sentinel.
    pub fn all_to_all_v<T: TElem>(&mut self, count: usize) {
        let (n, r) = (self.n(), self.r());
        let (v, send_len, recv_len) = v_layout(n, r, count);
        if !self.applies(Collective::AllToAllV, 0, false, Some(&v)) {
            return;
        }
        let (salt, fl) = (self.next_salt(), Flavor::Plain);
        // Block for peer p holds keys p * (count + 1) + i; gaps hold the sentinel.
        let key = |p: usize, i: usize| p * (count + 1) + i;
        let mut send = vec![T::sentinel(); send_len];
        for p in 0..n {
            for i in 0..v.send_counts[p] {
                send[v.send_displs[p] + i] = val(fl, salt, r, key(p, i));
            }
        }
        let before = send.clone();
        let mut recv = vec![T::sentinel(); recv_len];
        let res = match self.mode {
            Mode::Default => self.comm.all_to_all_v(
                &send,
                &v.send_counts,
                &v.send_displs,
                &mut recv,
                &v.recv_counts,
                &v.recv_displs,
            ),
            Mode::Forced(_) => self.raw(
                Collective::AllToAllV,
                ReduceOp::Sum,
                0,
                send.as_ptr(),
                send.len(),
                recv.as_mut_ptr(),
                recv.len(),
                Some(v.clone()),
            ),
        };
        let mut want: Vec<Want<T>> = vec![Want::Exact(T::sentinel()); recv_len];
        for q in 0..n {
            for i in 0..v.recv_counts[q] {
                want[v.recv_displs[q] + i] = Want::Exact(val(fl, salt, q, key(r, i)));
            }
        }
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| check(&recv, |j| want[j]))
            .and_then(|_| {
                check(&send, |j| Want::Exact(before[j]))
                    .map_err(|e| format!("the send buffer was modified: {e}"))
            });
        self.record(
            "all_to_all_v",
            format!("all_to_all_v {} max_count={count}", T::DTYPE),
            res,
        );
    }

    /// Gather to `root`.
    pub fn gather<T: TElem>(&mut self, count: usize, root: usize) {
        let coll = Collective::Gather { root };
        if !self.applies(coll, count, false, None) {
            return;
        }
        let (n, r, salt, fl) = (self.n(), self.r(), self.next_salt(), Flavor::Plain);
        let send: Vec<T> = Self::input(fl, salt, r, count);
        let mut recv = if r == root {
            vec![T::sentinel(); n * count]
        } else {
            Vec::new()
        };
        let res = match self.mode {
            Mode::Default => self.comm.gather(&send, &mut recv, root),
            Mode::Forced(_) => self.raw(
                coll,
                ReduceOp::Sum,
                count,
                send.as_ptr(),
                count,
                recv.as_mut_ptr(),
                recv.len(),
                None,
            ),
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| check(&recv, |j| Want::Exact(val(fl, salt, j / count, j % count))))
            .and_then(|_| Self::unchanged(&send, fl, salt, r));
        self.record(
            "gather",
            format!("gather {} count={count} root={root}", T::DTYPE),
            res,
        );
    }

    /// Scatter from `root`.
    pub fn scatter<T: TElem>(&mut self, count: usize, root: usize) {
        let coll = Collective::Scatter { root };
        if !self.applies(coll, count, false, None) {
            return;
        }
        let (n, r, salt, fl) = (self.n(), self.r(), self.next_salt(), Flavor::Plain);
        let send: Vec<T> = if r == root {
            Self::input(fl, salt, root, n * count)
        } else {
            Vec::new()
        };
        let mut recv = vec![T::sentinel(); count];
        let res = match self.mode {
            Mode::Default => self.comm.scatter(&send, &mut recv, root),
            Mode::Forced(_) => self.raw(
                coll,
                ReduceOp::Sum,
                count,
                send.as_ptr(),
                send.len(),
                recv.as_mut_ptr(),
                count,
                None,
            ),
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| check(&recv, |i| Want::Exact(val(fl, salt, root, r * count + i))))
            .and_then(|_| Self::unchanged(&send, fl, salt, root));
        self.record(
            "scatter",
            format!("scatter {} count={count} root={root}", T::DTYPE),
            res,
        );
    }

    /// Every rank sends `count` elements to rank r+shift and receives from
    /// rank r-shift, blocking calls ordered so that no cycle of blocking
    /// sends can form (even cycle positions send first, odd ones receive first).
    pub fn send_recv<T: TElem>(&mut self, count: usize, shift: usize) {
        let (n, r) = (self.n(), self.r());
        if n < 2 || shift.is_multiple_of(n) {
            return;
        }
        let (to, from) = ((r + shift) % n, (r + n - shift % n) % n);
        let (sc, rc) = (
            Collective::Send { peer: to },
            Collective::Recv { peer: from },
        );
        // Both sides of every pair must agree on whether to skip.
        let all_apply = (0..n).all(|q| {
            let Mode::Forced(a) = self.mode else {
                return true;
            };
            let p = |coll| {
                let mut p = Problem::new(coll, n, q, count);
                p.hosts = self.hosts();
                p
            };
            a.build(&p(Collective::Send {
                peer: (q + shift) % n,
            }))
            .is_some()
                && a.build(&p(Collective::Recv {
                    peer: (q + n - shift % n) % n,
                }))
                .is_some()
        });
        if !all_apply {
            self.skipped += 1;
            return;
        }
        let (salt, fl) = (self.next_salt(), Flavor::Plain);
        let send: Vec<T> = Self::input(fl, salt, r, count);
        let mut recv = vec![T::sentinel(); count];
        let pos = cycle_pos(r, shift % n, n);
        let do_send = |s: &Self| match s.mode {
            Mode::Default => s.comm.send(&send, to),
            Mode::Forced(_) => s.raw(
                sc,
                ReduceOp::Sum,
                count,
                send.as_ptr(),
                count,
                std::ptr::null_mut::<T>(),
                0,
                None,
            ),
        };
        let res = if pos.is_multiple_of(2) {
            do_send(self).and_then(|_| self.recv_into(&mut recv, from, rc))
        } else {
            self.recv_into(&mut recv, from, rc)
                .and_then(|_| do_send(self))
        };
        let res = res
            .map_err(|e| e.to_string())
            .and_then(|_| check(&recv, |i| Want::Exact(val(fl, salt, from, i))))
            .and_then(|_| Self::unchanged(&send, fl, salt, r));
        self.record(
            "send_recv",
            format!("send/recv {} count={count} shift={shift}", T::DTYPE),
            res,
        );
    }

    fn recv_into<T: TElem>(
        &self,
        recv: &mut [T],
        from: usize,
        rc: Collective,
    ) -> tutti::Result<()> {
        match self.mode {
            Mode::Default => self.comm.recv(recv, from),
            Mode::Forced(_) => {
                let len = recv.len();
                self.raw(
                    rc,
                    ReduceOp::Sum,
                    len,
                    std::ptr::null::<T>(),
                    0,
                    recv.as_mut_ptr(),
                    len,
                    None,
                )
            }
        }
    }

    /// A barrier, checked out of band: every rank creates a marker file
    /// before entering; after leaving, every rank's marker must exist.
    pub fn barrier(&mut self) {
        let (n, r) = (self.n(), self.r());
        self.barriers += 1;
        let tag = format!("{}-{}", self.mode_name().replace(' ', "-"), self.barriers);
        if !self.applies(Collective::Barrier, 0, false, None) {
            return;
        }
        self.ctx.mark(&format!("barrier-{tag}-{r}"));
        let res = match self.mode {
            Mode::Default => self.comm.barrier(),
            Mode::Forced(_) => self.raw::<u8>(
                Collective::Barrier,
                ReduceOp::Sum,
                0,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                0,
                None,
            ),
        };
        let res = res.map_err(|e| e.to_string()).and_then(|_| {
            let missing: Vec<usize> = (0..n)
                .filter(|q| !self.ctx.marked(&format!("barrier-{tag}-{q}")))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "left the barrier before rank(s) {missing:?} entered it"
                ))
            }
        });
        self.record("barrier", "barrier".into(), res);
    }

    // ---- groups of cases ----

    /// Every collective for element type `T` at `count`, every reduction in
    /// `ops`, roots rotating with the case number.
    pub fn every_collective<T: TElem>(&mut self, count: usize, ops: &[ReduceOp]) {
        let n = self.n();
        for &op in ops {
            self.all_reduce::<T>(op, count, true);
            self.all_reduce::<T>(op, count, false);
            let root = (self.salt as usize) % n;
            self.reduce::<T>(op, count, root);
            self.reduce_scatter::<T>(op, count);
        }
        let root = |s: &Self, k: usize| (s.salt as usize + k) % n;
        self.broadcast::<T>(count, root(self, 0));
        self.all_gather::<T>(count);
        self.all_to_all::<T>(count);
        self.all_to_all_v::<T>(count);
        self.gather::<T>(count, root(self, 1));
        self.scatter::<T>(count, root(self, 2));
        self.send_recv::<T>(count, 1);
    }

    /// Rooted collectives from every root and send/recv at every shift.
    pub fn every_root<T: TElem>(&mut self, count: usize) {
        let n = self.n();
        for root in 0..n {
            self.broadcast::<T>(count, root);
            self.reduce::<T>(ReduceOp::Sum, count, root);
            self.gather::<T>(count, root);
            self.scatter::<T>(count, root);
        }
        for shift in 1..n {
            self.send_recv::<T>(count, shift);
        }
    }

    /// Large counts for one (type, reduction): every collective, blocks of
    /// `count / n` elements for the collectives whose buffers grow with n.
    pub fn large<T: TElem>(&mut self, op: ReduceOp, count: usize) {
        let n = self.n();
        let block = count / n;
        self.all_reduce::<T>(op, count, true);
        self.all_reduce::<T>(op, count, false);
        self.reduce::<T>(op, count, n - 1);
        self.reduce_scatter::<T>(op, block);
        self.broadcast::<T>(count, n / 2);
        self.all_gather::<T>(block);
        self.all_to_all::<T>(block);
        self.all_to_all_v::<T>(block);
        self.gather::<T>(block, 0);
        self.scatter::<T>(block, n - 1);
        self.send_recv::<T>(count, 1);
    }
}
