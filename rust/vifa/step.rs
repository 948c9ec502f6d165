//! One optimiser step, split in three phases so that a model whose rows are sharded across processes can
//! add up the cross-row quantities in between: [`Vifa::local_gradient_norms`] (clipping norms),
//! [`Vifa::local_step`] (update this model's rows, return its share of B) and [`Vifa::finish_step`]
//! ((I + B)⁻¹ from the whole B).

use ndarray::{Array2, ArrayView2};

use super::fused::{Kernel, StepConsts};
use super::fused_tasks;
use super::gradient::{accumulate_gram, block_gradients, GradCtx, Scratch};
use super::kk_step::precision_inverse;
use super::params::RowsMut;
use super::products::mirror_upper;
use super::update::{update_task, StepTask, UpdateRule};
use super::{Vifa, BLOCK_ROWS, TASK_ROWS};
use crate::engine::{run_tasks, task_ranges, use_parallel, validate_batch};
use crate::error::{FaError, Result};
use crate::scalar::Real;

impl<T: Real> Vifa<T> {
    /// (I + Fᵀ Ψ⁻¹ F)⁻¹ from the stored parameters, by the same block kernel the step uses (a restored
    /// model has bit-identical (I + B)⁻¹).
    pub(super) fn recompute_m_inv(&self) -> Result<Array2<f64>> {
        precision_inverse(self.n_components, vec![self.local_gram()])
    }

    /// B = Fᵀ Ψ⁻¹ F (K×K) of these rows from the stored parameters, formed and summed as the step forms the B
    /// it returns (`local_step`), so that a model split across processes and restored from a checkpoint sums
    /// the same B its uninterrupted twin does.
    pub fn local_gram(&self) -> Array2<f64> {
        let (d, k) = (self.n_features, self.n_components);
        let tasks: Vec<(usize, usize)> = task_ranges(d, TASK_ROWS)
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect();
        let kernel = self.kernel;
        let partials = run_tasks(tasks, use_parallel(d, k), |(lo, hi)| {
            let isa = match kernel {
                Kernel::Fused(isa) => {
                    let gram = fused_tasks::gram_task(isa, k, &self.params, &self.sqrt_psi, (lo, hi));
                    return square(k, gram);
                }
                Kernel::Blocked(isa) => isa,
            };
            let mut s = Scratch::new::<T>(k, isa);
            let mut gram = Array2::zeros((k, k));
            for b0 in (lo..hi).step_by(BLOCK_ROWS) {
                let nb = (hi - b0).min(BLOCK_ROWS);
                s.load(&self.params, b0, nb);
                accumulate_gram(&mut s, nb, &mut gram);
            }
            mirror_upper(k, gram.as_slice_mut().expect("gram is allocated contiguous"));
            gram
        });
        partials.into_iter().fold(Array2::zeros((k, k)), |acc, g| acc + g)
    }

    /// One optimiser step (Algorithm 3, lines 9–20) from the gradients `grads` (L×D, row l the gradient
    /// of the full-data negative log-likelihood at pending draw l). The input is validated first: on a
    /// validation error nothing changes. If the step makes a parameter non-finite the model is marked
    /// diverged and this and every later call return an error.
    pub fn step<X: Real>(&mut self, grads: ArrayView2<X>) -> Result<()> {
        let sq_norms = self.local_gradient_norms(grads.view())?;
        let (gram, finite) = self.local_step(grads, sq_norms)?;
        self.finish_step(gram.view(), finite)
    }

    /// First phase of a step for a model whose rows are split across processes (and of [`Vifa::step`]):
    /// validate `grads` (L×D, this model's rows) and, when gradient clipping is on, return this model's
    /// part of ‖∇_c‖², ‖∇_F‖², ‖∇_β‖² (sums over rows: the parts of every process add up to the norms of
    /// the whole model). Changes nothing.
    pub fn local_gradient_norms<X: Real>(&self, grads: ArrayView2<X>) -> Result<Option<[f64; 3]>> {
        self.kk_step.m_inv()?;
        self.check_grads(&grads)?;
        if self.kk_step.config.clip_grad_norm.is_none() {
            return Ok(None);
        }
        let h = self.pending_latents();
        let m_inv = self.kk_step.m_inv()?.clone();
        Ok(Some(self.gradient_norms(&self.grad_ctx(h.view(), grads, m_inv.view()))))
    }

    /// Second phase: apply the optimiser step to this model's rows with the clipping norms `sq_norms` of
    /// the whole model (from [`Vifa::local_gradient_norms`], summed over every part; None without
    /// clipping) and return this part of B = Fᵀ Ψ⁻¹ F of the new parameters (K×K) and whether they are all
    /// finite. Until [`Vifa::finish_step`] receives the sum of every part's B, the model answers no query.
    pub fn local_step<X: Real>(
        &mut self,
        grads: ArrayView2<X>,
        sq_norms: Option<[f64; 3]>,
    ) -> Result<(Array2<f64>, bool)> {
        let m_inv = self.kk_step.m_inv()?.clone();
        self.check_grads(&grads)?;
        let rule = self.kk_step.rule(sq_norms)?;
        let h = self.pending_latents();
        let ctx = self.grad_ctx(h.view(), grads, m_inv.view());
        let (gram, finite) = self.update_pass(&ctx, &rule);
        self.kk_step.stepped();
        Ok((gram, finite))
    }

    /// Last phase: (I + B)⁻¹ from B = Fᵀ Ψ⁻¹ F of the whole model (K×K) and whether every part's new
    /// parameters are finite; error (the model is then diverged) if they are not.
    pub fn finish_step(&mut self, gram: ArrayView2<f64>, finite: bool) -> Result<()> {
        self.kk_step.finish(gram, finite)
    }

    pub(super) fn check_grads<X: Real>(&self, grads: &ArrayView2<X>) -> Result<()> {
        self.kk_step.check_ready()?;
        let l = self.kk_step.config.n_grad_samples;
        if grads.dim() != (l, self.n_features) {
            let expected = if l == 1 {
                format!("({},) or (1, {})", self.n_features, self.n_features)
            } else {
                format!("({l}, {})", self.n_features)
            };
            return Err(FaError::Shape {
                what: "grad",
                expected,
                got: grads.shape().to_vec(),
            });
        }
        validate_batch::<T, X>(grads, self.n_features)
    }

    /// ‖∇_c‖², ‖∇_F‖², ‖∇_β‖² of the averaged negative-ELBO gradient (a read-only pass).
    pub(super) fn gradient_norms<X: Real>(&self, ctx: &GradCtx<X>) -> [f64; 3] {
        let (d, k) = (self.n_features, self.n_components);
        let tasks: Vec<(usize, usize)> = task_ranges(d, TASK_ROWS)
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect();
        let (kernel, h, m_inv) = (self.kernel, flat(ctx.h), flat(ctx.m_inv));
        let partials = run_tasks(tasks, use_parallel(d, k), |(lo, hi)| {
            let isa = match kernel {
                Kernel::Fused(isa) => {
                    return fused_tasks::norms_task(isa, &self.params, &self.sqrt_psi, (lo, hi), ctx, &h, &m_inv)
                }
                Kernel::Blocked(isa) => isa,
            };
            let mut s = Scratch::new::<T>(k, isa);
            let mut sq = [0.0; 3];
            for b0 in (lo..hi).step_by(BLOCK_ROWS) {
                let nb = (hi - b0).min(BLOCK_ROWS);
                s.load(&self.params, b0, nb);
                block_gradients(ctx, &mut s, b0, nb);
                sq[0] += s.grad_c[..nb].iter().map(|g| g * g).sum::<f64>();
                sq[1] += s.grad_f[..nb * k].iter().map(|g| g * g).sum::<f64>();
                sq[2] += s.grad_b[..nb].iter().map(|g| g * g).sum::<f64>();
            }
            sq
        });
        partials
            .iter()
            .fold([0.0; 3], |acc, p| [acc[0] + p[0], acc[1] + p[1], acc[2] + p[2]])
    }

    /// The step pass: gradients, optimiser update, and B of the new parameters, in one read and one write
    /// of each row (the model's `kernel`: fused for K ≤ 16, blocked above). Returns (B, all finite).
    pub(super) fn update_pass<X: Real>(&mut self, ctx: &GradCtx<X>, rule: &UpdateRule) -> (Array2<f64>, bool) {
        let (d, k) = (self.n_features, self.n_components);
        let n_tasks = d.div_ceil(TASK_ROWS);
        let moments: Vec<Option<(RowsMut<T>, RowsMut<T>)>> = match &mut self.moments {
            Some(m) => m.first.task_rows(k).zip(m.second.task_rows(k)).map(Some).collect(),
            None => (0..n_tasks).map(|_| None).collect(),
        };
        let tasks: Vec<StepTask<T>> = self
            .params
            .task_rows(k)
            .zip(self.sqrt_psi.chunks_mut(TASK_ROWS))
            .zip(moments)
            .enumerate()
            .map(|(i, ((p, sqrt_psi), m))| StepTask {
                lo: i * TASK_ROWS,
                p,
                sqrt_psi,
                m,
            })
            .collect();
        let (kernel, h, m_inv) = (self.kernel, flat(ctx.h), flat(ctx.m_inv));
        let consts = StepConsts {
            k,
            m_inv: &m_inv,
            alpha: ctx.alpha,
            rule,
        };
        let partials = run_tasks(tasks, use_parallel(d, k), |task| match kernel {
            Kernel::Fused(isa) => {
                let (gram, finite) = fused_tasks::update_task(isa, task, ctx, &h, &consts);
                (square(k, gram), finite)
            }
            Kernel::Blocked(isa) => update_task(task, ctx, rule, isa),
        });
        let finite = partials.iter().all(|(_, ok)| *ok);
        let gram = partials.into_iter().fold(Array2::zeros((k, k)), |acc, (g, _)| acc + g);
        (gram, finite)
    }
}

/// A K×K row-major vector as a matrix.
fn square(k: usize, v: Vec<f64>) -> Array2<f64> {
    Array2::from_shape_vec((k, k), v).expect("K×K values")
}

/// The values of a small matrix, row-major.
fn flat(m: ArrayView2<f64>) -> Vec<f64> {
    m.iter().copied().collect()
}
