//! Momentum correction for Top-K buckets: the momentum of Deep Gradient
//! Compression (Lin et al. 2018), applied on each rank before the
//! selection instead of by the optimizer after the exchange.
//!
//! Plain error feedback holds gradients back and later releases them in a
//! burst, which an SGD optimizer with momentum then amplifies as if it were
//! a fresh gradient. DGC moves the momentum in front of the sparsification:
//! each rank keeps a velocity `u` per bucket element, and each
//! synchronisation, with this step's (accumulated) gradients `g` and the
//! residual `v` (what was not sent yet):
//!
//! ```text
//! u = m * u + g          the local momentum (velocity)
//! v = v + u              the accumulated residual
//! send the top k of v;   v = 0 and u = 0 where sent (momentum factor masking)
//! ```
//!
//! The optimizer then applies the averaged update with plain SGD (no
//! momentum of its own). Masking `u` where `v` was sent keeps a stale
//! velocity from pushing a coordinate again and again after its update has
//! been applied. With ratio 1 every coordinate is sent, and masked, at
//! every synchronisation, so the result is the plain average of `g`.
//!
//! During a dense warm-up ([`BucketOptions::top_k_warmup`]) the bucket
//! sends everything as before (the residual added in, nothing held back),
//! and what it adds in is the velocity: `u = m * u + g; v = v + u`, all of
//! `v` sent, `u` not masked (nothing is stale when everything is sent). So
//! the warm-up is dense SGD with momentum `m`, bit for bit the average of
//! each rank's velocity, and Top-K continues from that velocity.
//!
//! On a step that fails, what was sent goes back into the residual and
//! the velocity masked at the sent coordinates is put back: nothing is
//! lost, as without momentum.

use super::bucket::BucketOptions;
use super::GradSync;
use crate::error::{Error, Result};

/// One Top-K bucket's velocity (DGC's `u`), one entry per bucket element.
#[derive(Debug)]
pub(super) struct Momentum {
    /// The momentum factor `m`, in `[0, 1)`.
    factor: f32,
    pub velocity: Vec<f32>,
}

impl Momentum {
    pub fn new(len: usize, m: f64) -> Momentum {
        Momentum {
            factor: m as f32,
            velocity: vec![0.0; len],
        }
    }

    /// Zeroes the velocity at `idx` (momentum factor masking) and returns
    /// what was there, to put back if the step fails.
    pub fn mask(&mut self, idx: &[u32]) -> Vec<f32> {
        idx.iter()
            .map(|&i| std::mem::take(&mut self.velocity[i as usize]))
            .collect()
    }

    /// The velocity and the factor, for a pass that folds gradients in
    /// itself (`sparse::add_and_select`).
    pub fn parts(&mut self) -> (&mut [f32], f32) {
        (&mut self.velocity, self.factor)
    }

    /// Puts back what [`mask`](Momentum::mask) took (a failed step).
    pub fn unmask(&mut self, idx: &[u32], kept: &[f32]) {
        for (&i, &u) in idx.iter().zip(kept) {
            self.velocity[i as usize] = u;
        }
    }
}

/// Folds this step's gradients `g` into the residual `v` and leaves the
/// new residual in `g` too (what may be sent). Without momentum `v += g`
/// (error feedback); with it `u = m * u + g; v += u`.
pub(super) fn fold(momentum: Option<&mut Momentum>, g: &mut [f32], v: &mut [f32]) {
    match momentum {
        None => {
            for (g, v) in g.iter_mut().zip(v) {
                *v += *g;
                *g = *v;
            }
        }
        Some(mo) => {
            let m = mo.factor;
            for ((g, v), u) in g.iter_mut().zip(v).zip(&mut mo.velocity) {
                *u = m * *u + *g;
                *v += *u;
                *g = *v;
            }
        }
    }
}

/// The momentum rules: `m` in `[0, 1)`, and only with Top-K.
pub(super) fn check(opts: &BucketOptions, k: usize) -> Result<()> {
    let Some(m) = opts.top_k_momentum else {
        return Ok(());
    };
    if opts.top_k.is_none() {
        return Err(Error::arg(format!(
            "GradSync: bucket {k}: momentum correction (top_k_momentum {m}) needs Top-K on the \
             same bucket: set top_k(ratio) too, or use the optimizer's momentum"
        )));
    }
    if !(0.0..1.0).contains(&m) {
        return Err(Error::arg(format!(
            "GradSync: bucket {k}: Top-K momentum {m} must be in [0, 1)"
        )));
    }
    Ok(())
}

impl BucketOptions {
    /// These options with DGC's momentum correction, factor `m` in `[0, 1)`
    /// (see [`GradSync::top_k_momentum`]): the bucket keeps a velocity
    /// `u = m * u + g` per element, adds it to the residual, sends the
    /// top `k` of the residual and zeroes both the residual and the
    /// velocity where it sent. The optimizer then uses plain SGD. Needs
    /// [`top_k`](BucketOptions::top_k); checked at first use.
    ///
    /// ```
    /// let o = tutti::BucketOptions::dense().top_k(0.01).top_k_momentum(0.9);
    /// assert_eq!(o.top_k_momentum, Some(0.9));
    /// ```
    pub fn top_k_momentum(self, m: f64) -> Self {
        BucketOptions {
            top_k_momentum: Some(m),
            ..self
        }
    }
}

impl GradSync<'_> {
    /// This reducer with Deep Gradient Compression's momentum correction
    /// on every Top-K bucket ([`BucketOptions::top_k_momentum`]): each
    /// rank applies the momentum `m` locally before the selection,
    /// `u = m * u + g` (the velocity, see [`velocity`](GradSync::velocity)),
    /// `v = v + u` (the residual, see [`residual`](GradSync::residual)),
    /// sends the top `k` of `v` and zeroes `u` and `v` where it sent
    /// (momentum factor masking). `wait` leaves the average of what the
    /// ranks sent, to be applied by plain SGD (`w -= lr * grad`, no
    /// momentum in the optimizer). With
    /// [`top_k_warmup`](GradSync::top_k_warmup) the warm-up stays dense,
    /// sending the whole of `v` with `u` kept: dense SGD with momentum `m`.
    /// `m` must be in `[0, 1)` and the bucket must use
    /// [`top_k`](GradSync::top_k): checked at first use.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]).top_k(0.25).top_k_momentum(0.5);
    /// let w = gs.register("w", 4)?;
    /// gs.set_grad(w, &[1.0, -4.0, 3.0, 2.0])?;
    /// gs.mark_ready(w)?;
    /// gs.wait()?;
    /// assert_eq!(gs.grad(w)?, &[0.0, -4.0, 0.0, 0.0]); // 1 of 4 sent
    /// assert_eq!(gs.velocity(w)?, &[1.0, 0.0, 3.0, 2.0]); // masked where sent
    /// gs.zero_grad()?;
    /// gs.set_grad(w, &[1.0, 0.0, 0.0, 0.0])?;
    /// gs.mark_ready(w)?;
    /// gs.wait()?;
    /// // u = 0.5 * u + g = [1.5, 0, 1.5, 1]; v = v + u = [2.5, 0, 4.5, 3].
    /// assert_eq!(gs.grad(w)?, &[0.0, 0.0, 4.5, 0.0]);
    /// assert_eq!(gs.velocity(w)?, &[1.5, 0.0, 0.0, 1.0]);
    /// assert_eq!(gs.residual(w)?, &[2.5, 0.0, 0.0, 3.0]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn top_k_momentum(mut self, m: f64) -> Self {
        self.all.top_k_momentum = Some(m);
        self
    }

    /// Gradient `i`'s share of its bucket's velocity (the local momentum
    /// of [`top_k_momentum`](GradSync::top_k_momentum), zero where the
    /// last synchronisation sent), or an error if its bucket has no
    /// momentum correction or is in flight.
    ///
    /// ```
    /// # let comms = tutti::Communicator::init_all(1)?;
    /// let mut gs = tutti::GradSync::new(&comms[0]).top_k(0.5).top_k_momentum(0.9);
    /// let w = gs.register("w", 2)?;
    /// gs.set_grad(w, &[1.0, -4.0])?;
    /// gs.mark_ready(w)?;
    /// gs.wait()?;
    /// assert_eq!(gs.velocity(w)?, &[1.0, 0.0]);
    /// # Ok::<(), tutti::Error>(())
    /// ```
    pub fn velocity(&mut self, i: usize) -> Result<&[f32]> {
        self.topk_part(
            i,
            "velocity",
            "has no Top-K momentum correction (top_k_momentum)",
            |b| {
                let m = b.topk.as_ref()?.momentum.as_ref()?;
                Some(&m.velocity[..])
            },
        )
    }
}
