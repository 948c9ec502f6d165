//! Variational inference with a factor-analysis posterior (VIFA, thesis §4.3 and Algorithm 3).
//!
//! q(θ) = N(c, F Fᵀ + Ψ) with c (`mean`, D), F (`loadings`, D×K) and ψ = exp β (`log_noise` holds β, D).
//! The objective is the negative ELBO (4.37),
//!
//! ```text
//!   L(c, F, β) = E_q[log q(θ)] − E_q[log p(θ)] + E_q[NLL(θ)],   p(θ) = N(0, α⁻¹ I),
//! ```
//!
//! where NLL is the negative log-likelihood of the **whole** data set. Its gradient has a closed-form part
//! (entropy 4.42–4.45 in the Woodbury form 4.54–4.56, prior 4.47–4.49) and a reparameterised part
//! (4.50–4.53): with θ = F h + c + ψ^{1/2} ⊙ z and g = ∇θ NLL(θ), the likelihood contributes g, g hᵀ and
//! ½ g ⊙ ψ^{1/2} ⊙ z (4.51, 4.52, 4.61) to the gradients w.r.t. c, F and β.
//!
//! Protocol: [`Vifa::sample`] draws θ (4.50) and remembers the draw; after L = `n_grad_samples` draws,
//! [`Vifa::step`] takes the L gradients (an L×D matrix, row l the gradient at draw l), averages the L
//! reparameterised estimates and applies one SGD or Adam step to c, F and β (Algorithm 3, lines 9–20).
//! The caller's gradient must estimate ∇θ of the full-data NLL without bias (mini-batch mean × N; the
//! thesis's line 8 writes a plain mini-batch mean, which would weight the likelihood by 1/N); the prior
//! and entropy terms are not scaled.
//!
//! Noise is counter-based: draw j's h and z come from ChaCha8 stream j of a key derived from the seed, and
//! the z entries of row block b start at word (b + 1)·2³² of that stream. z can therefore be regenerated
//! for any block, in parallel, by the step: the state holds (seed, number of draws) instead of L·D noise
//! values, and results do not depend on the number of threads.
//!
//! One step is one pass over the D×K state (two with gradient clipping): the only cross-row quantity,
//! the K×K matrix B = Fᵀ Ψ⁻¹ F (line 11), is accumulated from the rows the pass has just written, ready
//! for the next step. Nothing D×D is ever formed.

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2};
use rayon::prelude::*;

use crate::error::{invalid, FaError, Result};
use crate::linalg::SpdFactor;
use crate::noise;
use crate::pass::{block_times, use_parallel, validate_batch};
use crate::scalar::{stored, Real};

/// Rows per rayon task.
const TASK_ROWS: usize = 8192;
/// Rows per block inside a task; also the row block of the counter-based noise z.
const BLOCK_ROWS: usize = 256;
const _: () = assert!(
    TASK_ROWS % BLOCK_ROWS == 0,
    "noise blocks must align with task boundaries"
);
/// Salt that separates the draw key from the key of the seeded initial loadings (`init.rs`).
const DRAW_SALT: u64 = 0x5649_4641_5f64_7261;

/// Adam's first-moment decay β₁ (PyTorch/Kingma & Ba default).
pub const ADAM_BETA1: f64 = 0.9;
/// Adam's second-moment decay β₂.
pub const ADAM_BETA2: f64 = 0.999;
/// Adam's ε, added to √v̂.
pub const ADAM_EPS: f64 = 1e-8;

/// How the gradient of the negative ELBO is turned into a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optimizer {
    /// p ← p − η g (Algorithm 3, lines 17–19).
    Sgd,
    /// Adam with bias correction and the defaults [`ADAM_BETA1`], [`ADAM_BETA2`], [`ADAM_EPS`].
    Adam,
}

impl Optimizer {
    /// Parse "sgd" / "adam".
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "sgd" => Ok(Optimizer::Sgd),
            "adam" => Ok(Optimizer::Adam),
            other => Err(invalid("optimizer", format!("must be 'sgd' or 'adam', got {other:?}"))),
        }
    }

    /// The name [`Optimizer::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adam => "adam",
        }
    }
}

/// Learning rates η_c, η_F, η_β of the three parameter groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearningRates {
    /// η_c (mean c).
    pub mean: f64,
    /// η_F (loadings F).
    pub loadings: f64,
    /// η_β (β = log ψ).
    pub log_noise: f64,
}

impl LearningRates {
    /// Each rate must be finite and ≥ 0 (0 freezes that group).
    pub fn validate(&self) -> Result<()> {
        for (name, lr) in [
            ("lr_mean", self.mean),
            ("lr_loadings", self.loadings),
            ("lr_log_noise", self.log_noise),
        ] {
            if !(lr.is_finite() && lr >= 0.0) {
                return Err(invalid(name, format!("must be finite and >= 0, got {lr}")));
            }
        }
        Ok(())
    }

    fn as_array(&self) -> [f64; 3] {
        [self.mean, self.loadings, self.log_noise]
    }
}

/// Hyper-parameters of [`Vifa`].
#[derive(Debug, Clone, PartialEq)]
pub struct VifaConfig {
    /// α ≥ 0, precision of the prior N(0, α⁻¹ I) (α = 0: flat prior).
    pub prior_precision: f64,
    /// η_c, η_F, η_β.
    pub lr: LearningRates,
    /// SGD or Adam.
    pub optimizer: Optimizer,
    /// L ≥ 1: draws (and gradients) averaged per step.
    pub n_grad_samples: usize,
    /// If set, each group's gradient (c, F, β separately) is rescaled to at most this Euclidean norm.
    pub clip_grad_norm: Option<f64>,
}

impl VifaConfig {
    /// Check every hyper-parameter.
    pub fn validate(&self) -> Result<()> {
        let alpha = self.prior_precision;
        if !(alpha.is_finite() && alpha >= 0.0) {
            return Err(invalid(
                "prior_precision",
                format!("must be finite and >= 0, got {alpha}"),
            ));
        }
        self.lr.validate()?;
        if self.n_grad_samples < 1 {
            return Err(invalid(
                "n_grad_samples",
                format!("must be >= 1, got {}", self.n_grad_samples),
            ));
        }
        if let Some(max) = self.clip_grad_norm {
            if !(max.is_finite() && max > 0.0) {
                return Err(invalid("clip_grad_norm", format!("must be finite and > 0, got {max}")));
            }
        }
        Ok(())
    }
}

/// Starting point of the variational parameters.
#[derive(Debug, Clone, Copy)]
pub struct VifaInit<'a> {
    /// F₀ (D×K), e.g. [`crate::init::orthonormal_loadings`] (§4.4).
    pub loadings: ArrayView2<'a, f64>,
    /// c₀ (D); None: 0 (Algorithm 3, line 1).
    pub mean: Option<ArrayView1<'a, f64>>,
    /// ψ₀ (D, > 0); None: 1 (line 1).
    pub noise_variance: Option<ArrayView1<'a, f64>>,
}

/// One value per row of c and β, K per row of F (row-major), stored in `T`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params<T> {
    pub(crate) c: Vec<T>,
    pub(crate) f: Vec<T>,
    pub(crate) beta: Vec<T>,
}

/// One task's rows of a [`Params`].
struct RowsMut<'a, T> {
    c: &'a mut [T],
    f: &'a mut [T],
    beta: &'a mut [T],
}

impl<T: Real> Params<T> {
    fn zeros(d: usize, k: usize) -> Self {
        Params {
            c: vec![T::default(); d],
            f: vec![T::default(); d * k],
            beta: vec![T::default(); d],
        }
    }

    fn task_rows(&mut self, k: usize) -> impl Iterator<Item = RowsMut<'_, T>> {
        self.c
            .chunks_mut(TASK_ROWS)
            .zip(self.f.chunks_mut(TASK_ROWS * k))
            .zip(self.beta.chunks_mut(TASK_ROWS))
            .map(|((c, f), beta)| RowsMut { c, f, beta })
    }
}

/// Adam's first (m) and second (v) moment estimates, laid out like the parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Moments<T> {
    pub(crate) first: Params<T>,
    pub(crate) second: Params<T>,
}

/// VIFA with the D-sized state stored in `T` (f32 or f64); all K×K algebra and all sums are f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Vifa<T: Real> {
    pub(crate) n_features: usize,
    pub(crate) n_components: usize,
    pub(crate) config: VifaConfig,
    /// Seed of the draw key; with `n_draws` the whole random state.
    pub(crate) seed: u64,
    /// Training draws made so far; draw j uses stream j.
    pub(crate) n_draws: u64,
    /// Draws made since the last step: n_draws − n_pending … n_draws − 1.
    pub(crate) n_pending: usize,
    /// Optimiser steps applied so far (Adam's t).
    pub(crate) n_steps: u64,
    pub(crate) params: Params<T>,
    pub(crate) moments: Option<Moments<T>>,
    /// (I + B)⁻¹ with B = Fᵀ Ψ⁻¹ F of the current parameters (K×K); None once the parameters diverged.
    pub(crate) m_inv: Option<Array2<f64>>,
    /// Index of this model's first row in the whole vector when the rows are split across processes (0
    /// otherwise): the noise z of row r is that of global feature `row_offset + r`.
    pub(crate) row_offset: usize,
}

/// The hint carried by the error of a diverged model.
const DIVERGED: &str =
    "I + Fᵀ Ψ⁻¹ F (the VIFA parameters are no longer finite: lower the learning rates or set clip_grad_norm)";

/// Check (D, K): 1 ≤ K ≤ D (VI has no identifiability limit on K, but K > D adds nothing).
pub(crate) fn validate_vifa_dims(n_features: usize, n_components: usize) -> Result<()> {
    if n_features < 1 {
        return Err(invalid("n_features", format!("must be >= 1, got {n_features}")));
    }
    if n_components < 1 || n_components > n_features {
        return Err(invalid(
            "n_components",
            format!("must satisfy 1 <= n_components <= n_features = {n_features}, got {n_components}"),
        ));
    }
    Ok(())
}

fn checked_vector<T: Real>(v: ArrayView1<f64>, d: usize, what: &'static str, positive: bool) -> Result<Vec<T>> {
    if v.len() != d {
        return Err(FaError::Shape {
            what,
            expected: format!("({d},)"),
            got: v.shape().to_vec(),
        });
    }
    let acceptable = |x: f64| x.abs() <= T::MAX_INPUT && (!positive || x > 0.0);
    if !v.iter().all(|&x| acceptable(x)) {
        let rule = if positive { "finite and > 0" } else { "finite" };
        return Err(invalid(what, format!("must contain only {rule} values")));
    }
    Ok(v.iter().map(|&x| T::from_f64(x)).collect())
}

impl<T: Real> Vifa<T> {
    /// New model at `init` (F₀, c₀ = 0 and ψ₀ = 1 unless given); `seed` keys the training draws.
    pub fn new(
        n_features: usize,
        n_components: usize,
        init: VifaInit<'_>,
        seed: u64,
        config: VifaConfig,
    ) -> Result<Self> {
        validate_vifa_dims(n_features, n_components)?;
        config.validate()?;
        let (d, k) = (n_features, n_components);
        let f = crate::online_em::checked_init::<T>(init.loadings, d, k)?;
        let c = match init.mean {
            Some(m) => checked_vector::<T>(m, d, "init_mean", false)?,
            None => vec![T::default(); d],
        };
        let beta = match init.noise_variance {
            Some(psi) => {
                checked_vector::<f64>(psi, d, "init_noise_variance", true)?;
                let beta: Vec<T> = psi.iter().map(|p| T::from_f64(p.ln())).collect();
                if beta
                    .iter()
                    .any(|b| !b.to_f64().exp().is_finite() || b.to_f64().exp() <= 0.0)
                {
                    return Err(invalid(
                        "init_noise_variance",
                        "must be representable in the state dtype",
                    ));
                }
                beta
            }
            None => vec![T::default(); d],
        };
        let moments = match config.optimizer {
            Optimizer::Sgd => None,
            Optimizer::Adam => Some(Moments {
                first: Params::zeros(d, k),
                second: Params::zeros(d, k),
            }),
        };
        let mut model = Vifa {
            n_features: d,
            n_components: k,
            config,
            seed,
            n_draws: 0,
            n_pending: 0,
            n_steps: 0,
            params: Params { c, f, beta },
            moments,
            m_inv: None,
            row_offset: 0,
        };
        model.m_inv = Some(model.recompute_m_inv()?);
        Ok(model)
    }

    /// D.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// K.
    pub fn n_components(&self) -> usize {
        self.n_components
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &VifaConfig {
        &self.config
    }

    /// Seed of the training draws.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Optimiser steps applied so far.
    pub fn n_steps(&self) -> u64 {
        self.n_steps
    }

    /// Training draws made so far.
    pub fn n_draws(&self) -> u64 {
        self.n_draws
    }

    /// Draws waiting for their gradients.
    pub fn n_pending(&self) -> usize {
        self.n_pending
    }

    /// Replace the learning rates (for schedules); takes effect at the next step.
    pub fn set_learning_rates(&mut self, lr: LearningRates) -> Result<()> {
        lr.validate()?;
        self.config.lr = lr;
        Ok(())
    }

    /// Mean c (D).
    pub fn mean(&self) -> Array1<f64> {
        self.params.c.iter().map(|v| v.to_f64()).collect()
    }

    /// Loadings F (D×K).
    pub fn loadings(&self) -> Array2<f64> {
        let k = self.n_components;
        Array2::from_shape_fn((self.n_features, k), |(i, j)| self.params.f[i * k + j].to_f64())
    }

    /// Noise variances ψ = exp β (D).
    pub fn noise_variance(&self) -> Array1<f64> {
        self.params.beta.iter().map(|b| b.to_f64().exp()).collect()
    }

    /// β = log ψ (D), the parameter the optimiser updates.
    pub fn log_noise_variance(&self) -> Array1<f64> {
        self.params.beta.iter().map(|b| b.to_f64()).collect()
    }

    fn m_inv(&self) -> Result<&Array2<f64>> {
        self.m_inv.as_ref().ok_or(FaError::NotPositiveDefinite(DIVERGED))
    }

    /// (I + Fᵀ Ψ⁻¹ F)⁻¹ from the stored parameters, by the same block kernel the step uses.
    fn recompute_m_inv(&self) -> Result<Array2<f64>> {
        let (d, k) = (self.n_features, self.n_components);
        let partials = run_tasks(
            (0..d.div_ceil(TASK_ROWS)).collect(),
            use_parallel(d, k),
            |task: usize| {
                let lo = task * TASK_ROWS;
                let hi = (lo + TASK_ROWS).min(d);
                let mut s = Scratch::new(k);
                let mut gram = Array2::zeros((k, k));
                for b0 in (lo..hi).step_by(BLOCK_ROWS) {
                    let nb = (hi - b0).min(BLOCK_ROWS);
                    s.load(&self.params, b0, nb);
                    accumulate_gram(&mut s, nb, &mut gram);
                }
                gram
            },
        );
        precision_inverse(k, partials)
    }

    /// The first pending draw's index.
    fn first_pending(&self) -> u64 {
        self.n_draws - self.n_pending as u64
    }

    /// Draw θ = F h + c + ψ^{1/2} ⊙ z (4.50; Algorithm 3 lines 5–7) and remember it for the next step.
    /// Error if L = `n_grad_samples` draws are already waiting for their step.
    pub fn sample(&mut self) -> Result<Array1<f64>> {
        self.m_inv()?;
        if self.n_pending >= self.config.n_grad_samples {
            return Err(FaError::CallOrder(format!(
                "{} draw(s) are already waiting for step() (n_grad_samples = {}); call step() with their \
                 gradients first",
                self.n_pending, self.config.n_grad_samples
            )));
        }
        let theta = self.theta(self.n_draws);
        self.n_draws += 1;
        self.n_pending += 1;
        Ok(theta)
    }

    /// θ of draw `draw` at the current parameters (D).
    fn theta(&self, draw: u64) -> Array1<f64> {
        let (d, k) = (self.n_features, self.n_components);
        let h = latent_draw(self.seed, draw, k);
        let mut out = vec![0.0; d];
        let tasks: Vec<(usize, &mut [f64])> = out
            .chunks_mut(TASK_ROWS)
            .enumerate()
            .map(|(i, o)| (i * TASK_ROWS, o))
            .collect();
        run_tasks(tasks, use_parallel(d, k), |(lo, o): (usize, &mut [f64])| {
            let mut z = vec![0.0; BLOCK_ROWS];
            for (b, o_blk) in o.chunks_mut(BLOCK_ROWS).enumerate() {
                let row0 = lo + b * BLOCK_ROWS;
                let nb = o_blk.len();
                fill_noise(self.seed, draw, self.row_offset + row0, &mut z[..nb]);
                for (i, (t, z)) in o_blk.iter_mut().zip(z.iter()).enumerate() {
                    let r = row0 + i;
                    let f_row = &self.params.f[r * k..(r + 1) * k];
                    let fh: f64 = f_row.iter().zip(h.iter()).map(|(f, h)| f.to_f64() * h).sum();
                    let beta = self.params.beta[r].to_f64();
                    *t = fh + self.params.c[r].to_f64() + (0.5 * beta).exp() * z;
                }
            }
        });
        Array1::from(out)
    }

    /// The noise (h, z) of the pending draws: h is n_pending×K, z is n_pending×D.
    pub fn pending_noise(&self) -> (Array2<f64>, Array2<f64>) {
        let (d, k) = (self.n_features, self.n_components);
        let first = self.first_pending();
        let mut h = Array2::zeros((self.n_pending, k));
        let mut z = Array2::zeros((self.n_pending, d));
        for l in 0..self.n_pending {
            h.row_mut(l).assign(&latent_draw(self.seed, first + l as u64, k));
            let mut row = z.row_mut(l);
            let slice = row
                .as_slice_mut()
                .expect("rows of a standard-layout array are contiguous");
            for (b, blk) in slice.chunks_mut(BLOCK_ROWS).enumerate() {
                fill_noise(self.seed, first + l as u64, self.row_offset + b * BLOCK_ROWS, blk);
            }
        }
        (h, z)
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
        self.m_inv()?;
        self.check_grads(&grads)?;
        if self.config.clip_grad_norm.is_none() {
            return Ok(None);
        }
        let h = self.pending_latents();
        let m_inv = self.m_inv()?.clone();
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
        let m_inv = self.m_inv()?.clone();
        self.check_grads(&grads)?;
        let scale = match (self.config.clip_grad_norm, sq_norms) {
            (Some(max), Some(sq)) => clip_scales(sq, max),
            (None, _) => [1.0; 3],
            (Some(_), None) => return Err(invalid("sq_norms", "gradient clipping needs the gradient norms")),
        };
        let h = self.pending_latents();
        let ctx = self.grad_ctx(h.view(), grads, m_inv.view());
        let t = self.n_steps + 1;
        let rule = UpdateRule {
            lr: self.config.lr.as_array(),
            scale,
            bias1: 1.0 - ADAM_BETA1.powf(t as f64),
            bias2: 1.0 - ADAM_BETA2.powf(t as f64),
        };
        let (gram, finite) = self.update_pass(&ctx, &rule);
        self.n_steps = t;
        self.n_pending = 0;
        self.m_inv = None;
        Ok((gram, finite))
    }

    /// Last phase: (I + B)⁻¹ from B = Fᵀ Ψ⁻¹ F of the whole model (K×K) and whether every part's new
    /// parameters are finite; error (the model is then diverged) if they are not.
    pub fn finish_step(&mut self, gram: ArrayView2<f64>, finite: bool) -> Result<()> {
        let k = self.n_components;
        if gram.dim() != (k, k) {
            return Err(FaError::Shape {
                what: "gram",
                expected: format!("({k}, {k})"),
                got: gram.shape().to_vec(),
            });
        }
        self.m_inv = if finite && gram.iter().all(|v| v.is_finite()) {
            precision_inverse(k, vec![gram.to_owned()]).ok()
        } else {
            None
        };
        self.m_inv().map(|_| ())
    }

    /// h of the pending draws (L×K).
    fn pending_latents(&self) -> Array2<f64> {
        let k = self.n_components;
        let first = self.first_pending();
        let mut h = Array2::zeros((self.n_pending, k));
        for (l, mut row) in h.rows_mut().into_iter().enumerate() {
            row.assign(&latent_draw(self.seed, first + l as u64, k));
        }
        h
    }

    fn grad_ctx<'a, X: Real>(
        &self,
        h: ArrayView2<'a, f64>,
        grads: ArrayView2<'a, X>,
        m_inv: ArrayView2<'a, f64>,
    ) -> GradCtx<'a, X> {
        GradCtx {
            k: self.n_components,
            seed: self.seed,
            first_draw: self.first_pending(),
            h,
            grads,
            m_inv,
            alpha: self.config.prior_precision,
            row_offset: self.row_offset,
        }
    }

    /// Place this model's rows at `row_offset` in a vector split across processes (its noise then equals
    /// that of the whole model's rows there).
    pub fn set_row_offset(&mut self, row_offset: usize) {
        self.row_offset = row_offset;
    }

    /// Index of this model's first row in the whole vector.
    pub fn row_offset(&self) -> usize {
        self.row_offset
    }

    fn check_grads<X: Real>(&self, grads: &ArrayView2<X>) -> Result<()> {
        let l = self.config.n_grad_samples;
        if self.n_pending < l {
            return Err(FaError::CallOrder(format!(
                "step() needs gradients at n_grad_samples = {l} draw(s) from sample(); {} pending — call \
                 sample() first",
                self.n_pending
            )));
        }
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
    fn gradient_norms<X: Real>(&self, ctx: &GradCtx<X>) -> [f64; 3] {
        let (d, k) = (self.n_features, self.n_components);
        let partials = run_tasks(
            (0..d.div_ceil(TASK_ROWS)).collect(),
            use_parallel(d, k),
            |task: usize| {
                let lo = task * TASK_ROWS;
                let hi = (lo + TASK_ROWS).min(d);
                let mut s = Scratch::new(k);
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
            },
        );
        partials
            .iter()
            .fold([0.0; 3], |acc, p| [acc[0] + p[0], acc[1] + p[1], acc[2] + p[2]])
    }

    /// The fused pass: gradients, optimiser update, and B of the new parameters. Returns (B, all finite).
    fn update_pass<X: Real>(&mut self, ctx: &GradCtx<X>, rule: &UpdateRule) -> (Array2<f64>, bool) {
        let (d, k) = (self.n_features, self.n_components);
        let n_tasks = d.div_ceil(TASK_ROWS);
        let moments: Vec<Option<(RowsMut<T>, RowsMut<T>)>> = match &mut self.moments {
            Some(m) => m.first.task_rows(k).zip(m.second.task_rows(k)).map(Some).collect(),
            None => (0..n_tasks).map(|_| None).collect(),
        };
        let tasks: Vec<StepTask<T>> = self
            .params
            .task_rows(k)
            .zip(moments)
            .enumerate()
            .map(|(i, (p, m))| StepTask {
                lo: i * TASK_ROWS,
                p,
                m,
            })
            .collect();
        let partials = run_tasks(tasks, use_parallel(d, k), |task| update_task(task, ctx, rule));
        let finite = partials.iter().all(|(_, ok)| *ok);
        let gram = partials.into_iter().fold(Array2::zeros((k, k)), |acc, (g, _)| acc + g);
        (gram, finite)
    }
}

/// Run `kernel` on every task (on rayon if `parallel`) and return the results in task order.
fn run_tasks<W: Send, R: Send>(tasks: Vec<W>, parallel: bool, kernel: impl Fn(W) -> R + Sync + Send) -> Vec<R> {
    if parallel {
        tasks.into_par_iter().map(kernel).collect()
    } else {
        tasks.into_iter().map(kernel).collect()
    }
}

/// (I + B)⁻¹ with B the sum of the per-task partial Gram matrices, added in task order.
fn precision_inverse(k: usize, partials: Vec<Array2<f64>>) -> Result<Array2<f64>> {
    let gram = partials
        .into_iter()
        .fold(Array2::<f64>::zeros((k, k)), |acc, g| acc + g);
    let precision = Array2::<f64>::eye(k) + &gram;
    Ok(SpdFactor::new(precision.view(), DIVERGED)?.inverse())
}

/// The key of the training draws of `seed` (counter-based noise, `crate::noise`).
fn draw_key(seed: u64) -> u64 {
    seed ^ DRAW_SALT
}

/// h of draw `draw` (K standard normals).
fn latent_draw(seed: u64, draw: u64, k: usize) -> Array1<f64> {
    noise::latent_draw(draw_key(seed), draw, k)
}

/// z of draw `draw` for the global features starting at `row0`, `out.len()` values.
fn fill_noise(seed: u64, draw: u64, row0: usize, out: &mut [f64]) {
    noise::fill_noise(draw_key(seed), draw, row0, out)
}

/// Everything the gradient of one block needs besides its rows.
struct GradCtx<'a, X> {
    k: usize,
    seed: u64,
    first_draw: u64,
    /// h of the L draws (L×K).
    h: ArrayView2<'a, f64>,
    /// g_l = ∇θ NLL at draw l (L×D).
    grads: ArrayView2<'a, X>,
    /// (I + B)⁻¹ (K×K).
    m_inv: ArrayView2<'a, f64>,
    alpha: f64,
    /// Global index of row 0 (for the noise).
    row_offset: usize,
}

/// Learning rates, clipping factors and Adam bias corrections (1 − β₁ᵗ, 1 − β₂ᵗ) of one step.
struct UpdateRule {
    lr: [f64; 3],
    scale: [f64; 3],
    bias1: f64,
    bias2: f64,
}

/// Per-group factor min(1, max / ‖g‖).
fn clip_scales(sq_norms: [f64; 3], max: f64) -> [f64; 3] {
    sq_norms.map(|sq| {
        let norm = sq.sqrt();
        if norm > max {
            max / norm
        } else {
            1.0
        }
    })
}

/// One block of rows in f64. Vectors hold BLOCK_ROWS values, matrices BLOCK_ROWS×K (row-major).
struct Scratch {
    k: usize,
    c: Vec<f64>,
    beta: Vec<f64>,
    psi: Vec<f64>,
    sqrt_psi: Vec<f64>,
    z: Vec<f64>,
    g_mean: Vec<f64>,
    gz: Vec<f64>,
    grad_c: Vec<f64>,
    grad_b: Vec<f64>,
    f: Vec<f64>,
    a: Vec<f64>,
    cr: Vec<f64>,
    gh: Vec<f64>,
    grad_f: Vec<f64>,
}

impl Scratch {
    fn new(k: usize) -> Self {
        let v = || vec![0.0; BLOCK_ROWS];
        let m = || vec![0.0; BLOCK_ROWS * k];
        Scratch {
            k,
            c: v(),
            beta: v(),
            psi: v(),
            sqrt_psi: v(),
            z: v(),
            g_mean: v(),
            gz: v(),
            grad_c: v(),
            grad_b: v(),
            f: m(),
            a: m(),
            cr: m(),
            gh: m(),
            grad_f: m(),
        }
    }

    /// Load rows row0 … row0 + nb − 1 of the parameters.
    fn load<T: Real>(&mut self, p: &Params<T>, row0: usize, nb: usize) {
        let k = self.k;
        self.load_rows(
            &p.c[row0..row0 + nb],
            &p.f[row0 * k..(row0 + nb) * k],
            &p.beta[row0..row0 + nb],
        );
    }

    fn load_rows<T: Real>(&mut self, c: &[T], f: &[T], beta: &[T]) {
        for (dst, src) in self.c.iter_mut().zip(c) {
            *dst = src.to_f64();
        }
        for (dst, src) in self.f.iter_mut().zip(f) {
            *dst = src.to_f64();
        }
        for (dst, src) in self.beta.iter_mut().zip(beta) {
            *dst = src.to_f64();
        }
    }

    /// ψ^{1/2} = exp(β/2) and ψ = (ψ^{1/2})² for the loaded rows: one exp per row.
    fn derive_noise(&mut self, nb: usize) {
        for ((psi, sqrt_psi), beta) in self.psi[..nb].iter_mut().zip(&mut self.sqrt_psi[..nb]).zip(&self.beta) {
            *sqrt_psi = (0.5 * beta).exp();
            *psi = *sqrt_psi * *sqrt_psi;
        }
    }
}

/// View the first `nb` rows of a row-major K-wide buffer as an nb×K matrix.
fn rows(buf: &[f64], nb: usize, k: usize) -> ArrayView2<'_, f64> {
    ArrayView2::from_shape((nb, k), &buf[..nb * k]).expect("buffer holds nb rows of K")
}

/// A = Ψ⁻¹ F (line 10) and gram += Aᵀ F, the block's share of B = Fᵀ Ψ⁻¹ F (line 11), for the loaded
/// rows. Overwrites ψ, ψ^{1/2} and A. The same kernel serves the step and `recompute_m_inv`, so a
/// restored model has bit-identical (I + B)⁻¹.
fn accumulate_gram(s: &mut Scratch, nb: usize, gram: &mut Array2<f64>) {
    s.derive_noise(nb);
    scaled_rows(s, nb);
    let (a, f) = (rows(&s.a, nb, s.k), rows(&s.f, nb, s.k));
    general_mat_mul(1.0, &a.t(), &f, 1.0, gram);
}

/// A = Ψ⁻¹ F for the loaded rows (ψ already derived): one reciprocal per row.
fn scaled_rows(s: &mut Scratch, nb: usize) {
    let k = s.k;
    for ((a_row, f_row), psi) in s.a[..nb * k].chunks_exact_mut(k).zip(s.f.chunks_exact(k)).zip(&s.psi) {
        let inv_psi = 1.0 / psi;
        for (a, f) in a_row.iter_mut().zip(f_row) {
            *a = f * inv_psi;
        }
    }
}

/// Gradient of the negative ELBO for the loaded rows (global rows row0 …), into grad_c, grad_f, grad_b:
///
/// ```text
///   ∇c = α c + ḡ                                             (4.42, 4.47, 4.51; line 9)
///   ∇F = −A (I + B)⁻¹ + α F + mean_l g_l h_lᵀ                (4.55, 4.48, 4.52; lines 12–14)
///   ∇β = −½ + ½ ψ ⊙ rowsum(C ⊙ A) + ½ α ψ
///        + ½ ψ^{1/2} ⊙ mean_l g_l ⊙ z_l                      (4.59, 4.60, 4.61; lines 15–16)
/// ```
///
/// with A = Ψ⁻¹ F, C = A (I + B)⁻¹ and ḡ = mean_l g_l. Line 13's −A + C Bᵀ equals −C exactly, because
/// (I + B)⁻¹ B = I − (I + B)⁻¹ (i.e. (F Fᵀ + Ψ)⁻¹ F = Ψ⁻¹ F (I + B)⁻¹); −C avoids the cancellation.
fn block_gradients<X: Real>(ctx: &GradCtx<X>, s: &mut Scratch, row0: usize, nb: usize) {
    let k = ctx.k;
    s.derive_noise(nb);
    scaled_rows(s, nb);
    // Line 12: C = A (I + B)⁻¹, this block's rows (nb×K times K×K).
    block_times(&s.a, ctx.m_inv, &mut s.cr, nb);
    likelihood_terms(ctx, s, row0, nb);
    let alpha = ctx.alpha;
    for i in 0..nb {
        s.grad_c[i] = alpha * s.c[i] + s.g_mean[i];
        let span = i * k..(i + 1) * k;
        let (f, a, cr, gh) = (
            &s.f[span.clone()],
            &s.a[span.clone()],
            &s.cr[span.clone()],
            &s.gh[span.clone()],
        );
        let mut c_dot_a = 0.0;
        for (j, g) in s.grad_f[span].iter_mut().enumerate() {
            *g = -cr[j] + alpha * f[j] + gh[j];
            c_dot_a += cr[j] * a[j];
        }
        let psi = s.psi[i];
        s.grad_b[i] = -0.5 + 0.5 * psi * c_dot_a + 0.5 * alpha * psi + 0.5 * s.sqrt_psi[i] * s.gz[i];
    }
}

/// The reparameterised likelihood terms averaged over the L draws: ḡ, mean g hᵀ, mean g ⊙ z.
fn likelihood_terms<X: Real>(ctx: &GradCtx<X>, s: &mut Scratch, row0: usize, nb: usize) {
    let k = ctx.k;
    let n_draws = ctx.grads.nrows();
    s.g_mean[..nb].fill(0.0);
    s.gz[..nb].fill(0.0);
    s.gh[..nb * k].fill(0.0);
    for l in 0..n_draws {
        fill_noise(
            ctx.seed,
            ctx.first_draw + l as u64,
            ctx.row_offset + row0,
            &mut s.z[..nb],
        );
        let h = ctx.h.row(l);
        let g_block = ctx.grads.row(l).slice_move(s![row0..row0 + nb]);
        let per_row = s.g_mean[..nb]
            .iter_mut()
            .zip(&mut s.gz[..nb])
            .zip(s.gh[..nb * k].chunks_exact_mut(k));
        for (((g_sum, gz), gh_row), (g, z)) in per_row.zip(g_block.iter().zip(&s.z)) {
            let g = g.to_f64();
            *g_sum += g;
            *gz += g * z;
            for (gh, h) in gh_row.iter_mut().zip(h.iter()) {
                *gh += g * h;
            }
        }
    }
    let inv_l = 1.0 / n_draws as f64;
    for v in s.g_mean[..nb]
        .iter_mut()
        .chain(&mut s.gz[..nb])
        .chain(&mut s.gh[..nb * k])
    {
        *v *= inv_l;
    }
}

/// One task's rows of the parameters and (for Adam) of the two moment estimates.
struct StepTask<'a, T> {
    lo: usize,
    p: RowsMut<'a, T>,
    m: Option<(RowsMut<'a, T>, RowsMut<'a, T>)>,
}

/// Largest |β| a step may produce: ψ = exp β stays within [1e-304, 1e304]; beyond it the model has
/// diverged (ψ would overflow, or Ψ⁻¹ F would).
const LOG_NOISE_LIMIT: f64 = 700.0;

/// Lines 17–19 for one parameter group's rows (`group`: 0 c, 1 F, 2 β): with g = scale · grad,
/// SGD p ← p − η g, or Adam (moments `m`, `v` updated in place) p ← p − η m̂ / (√v̂ + ε). New values are
/// rounded to the storage type and written to `stored_vals` and (as used) `vals`. Returns whether all
/// new values are finite.
fn apply_group<T: Real>(
    stored_vals: &mut [T],
    vals: &mut [f64],
    grads: &[f64],
    group: usize,
    rule: &UpdateRule,
    moments: Option<(&mut [T], &mut [T])>,
) -> bool {
    let (lr, scale) = (rule.lr[group], rule.scale[group]);
    let mut finite = true;
    let params = stored_vals.iter_mut().zip(vals.iter_mut()).zip(grads);
    match moments {
        None => {
            for ((p_s, p), g) in params {
                let (new_s, new) = stored::<T>(*p - lr * (scale * g));
                finite &= new.is_finite();
                *p_s = new_s;
                *p = new;
            }
        }
        Some((first, second)) => {
            for (((p_s, p), g), (m, v)) in params.zip(first.iter_mut().zip(second.iter_mut())) {
                let g = scale * g;
                let (m_s, m1) = stored::<T>(ADAM_BETA1 * m.to_f64() + (1.0 - ADAM_BETA1) * g);
                let (v_s, v1) = stored::<T>(ADAM_BETA2 * v.to_f64() + (1.0 - ADAM_BETA2) * g * g);
                *m = m_s;
                *v = v_s;
                let (new_s, new) = stored::<T>(*p - lr * (m1 / rule.bias1) / ((v1 / rule.bias2).sqrt() + ADAM_EPS));
                finite &= new.is_finite();
                *p_s = new_s;
                *p = new;
            }
        }
    }
    finite
}

/// Apply the update to one task's rows block by block, then accumulate B of the new (stored) rows.
/// Returns this task's share of B and whether every new value is finite (and |β| ≤ 700).
fn update_task<T: Real, X: Real>(task: StepTask<T>, ctx: &GradCtx<X>, rule: &UpdateRule) -> (Array2<f64>, bool) {
    let k = ctx.k;
    let StepTask { lo, p, mut m } = task;
    let n = p.c.len();
    let mut s = Scratch::new(k);
    let mut gram = Array2::zeros((k, k));
    let mut finite = true;
    for b0 in (0..n).step_by(BLOCK_ROWS) {
        let nb = (n - b0).min(BLOCK_ROWS);
        let (rows, rows_k) = (b0..b0 + nb, b0 * k..(b0 + nb) * k);
        let (c, f, beta) = (
            &mut p.c[rows.clone()],
            &mut p.f[rows_k.clone()],
            &mut p.beta[rows.clone()],
        );
        s.load_rows(c, f, beta);
        block_gradients(ctx, &mut s, lo + b0, nb);
        let [m_c, m_f, m_b] = match m.as_mut() {
            Some((first, second)) => [
                Some((&mut first.c[rows.clone()], &mut second.c[rows.clone()])),
                Some((&mut first.f[rows_k.clone()], &mut second.f[rows_k.clone()])),
                Some((&mut first.beta[rows.clone()], &mut second.beta[rows.clone()])),
            ],
            None => [None, None, None],
        };
        finite &= apply_group(c, &mut s.c[..nb], &s.grad_c[..nb], 0, rule, m_c);
        finite &= apply_group(f, &mut s.f[..nb * k], &s.grad_f[..nb * k], 1, rule, m_f);
        finite &= apply_group(beta, &mut s.beta[..nb], &s.grad_b[..nb], 2, rule, m_b);
        finite &= s.beta[..nb].iter().all(|b| b.abs() <= LOG_NOISE_LIMIT);
        // Line 11 for the next step: B += Aᵀ F over the rows just written (as stored).
        accumulate_gram(&mut s, nb, &mut gram);
    }
    (gram, finite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::{fill_standard_normal, orthonormal_loadings};
    use nalgebra::DMatrix;

    fn config(optimizer: Optimizer, n_grad_samples: usize) -> VifaConfig {
        VifaConfig {
            prior_precision: 0.3,
            lr: LearningRates {
                mean: 1.0,
                loadings: 1.0,
                log_noise: 1.0,
            },
            optimizer,
            n_grad_samples,
            clip_grad_norm: None,
        }
    }

    /// A model with non-trivial c, F, ψ.
    fn model<T: Real>(d: usize, k: usize, cfg: VifaConfig, seed: u64) -> Vifa<T> {
        let f = orthonormal_loadings(d, k, seed).expect("init") * 1.3;
        let mut c = Array1::zeros(d);
        fill_standard_normal(c.view_mut().insert_axis(ndarray::Axis(1)), seed + 1);
        let psi = Array1::from_shape_fn(d, |i| 0.4 + 0.1 * (i % 7) as f64);
        let init = VifaInit {
            loadings: f.view(),
            mean: Some(c.view()),
            noise_variance: Some(psi.view()),
        };
        Vifa::new(d, k, init, seed, cfg).expect("new")
    }

    /// E_q[log q] − E_q[log p] up to constants: −½ log|F Fᵀ + Ψ| + (α/2)(tr(F Fᵀ + Ψ) + cᵀc) (4.41, 4.46).
    fn entropy_prior(c: &[f64], f: &DMatrix<f64>, beta: &[f64], alpha: f64) -> f64 {
        let s = f * f.transpose()
            + DMatrix::from_diagonal(&nalgebra::DVector::from_iterator(
                beta.len(),
                beta.iter().map(|b| b.exp()),
            ));
        let chol = nalgebra::Cholesky::new(s.clone()).expect("spd");
        let log_det: f64 = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
        -0.5 * log_det + 0.5 * alpha * (s.trace() + c.iter().map(|v| v * v).sum::<f64>())
    }

    #[test]
    fn deterministic_gradient_matches_finite_differences() {
        let (d, k) = (5, 2);
        let mut vi = model::<f64>(d, k, config(Optimizer::Sgd, 1), 3);
        let (c0, f0, b0) = (vi.mean(), vi.loadings(), vi.log_noise_variance());
        vi.sample().expect("sample");
        vi.step(Array2::<f64>::zeros((1, d)).view()).expect("step");
        // SGD with η = 1: the applied gradient is old − new.
        let (gc, gf, gb) = (&c0 - &vi.mean(), &f0 - &vi.loadings(), &b0 - &vi.log_noise_variance());
        let fm = DMatrix::from_fn(d, k, |i, j| f0[[i, j]]);
        let objective = |c: &[f64], f: &DMatrix<f64>, b: &[f64]| entropy_prior(c, f, b, 0.3);
        let (c, b) = (c0.to_vec(), b0.to_vec());
        let eps = 1e-6;
        for i in 0..d {
            let (mut cp, mut cm) = (c.clone(), c.clone());
            cp[i] += eps;
            cm[i] -= eps;
            let fd = (objective(&cp, &fm, &b) - objective(&cm, &fm, &b)) / (2.0 * eps);
            assert!((fd - gc[i]).abs() < 1e-7, "c[{i}]: fd {fd} vs {}", gc[i]);
            let (mut bp, mut bm) = (b.clone(), b.clone());
            bp[i] += eps;
            bm[i] -= eps;
            let fd = (objective(&c, &fm, &bp) - objective(&c, &fm, &bm)) / (2.0 * eps);
            assert!((fd - gb[i]).abs() < 1e-7, "beta[{i}]: fd {fd} vs {}", gb[i]);
            for j in 0..k {
                let (mut fp, mut fmm) = (fm.clone(), fm.clone());
                fp[(i, j)] += eps;
                fmm[(i, j)] -= eps;
                let fd = (objective(&c, &fp, &b) - objective(&c, &fmm, &b)) / (2.0 * eps);
                assert!((fd - gf[[i, j]]).abs() < 1e-7, "F[{i},{j}]: fd {fd} vs {}", gf[[i, j]]);
            }
        }
    }

    #[test]
    fn likelihood_terms_use_the_remembered_draws() {
        let (d, k, l) = (7, 3, 4);
        let base = model::<f64>(d, k, config(Optimizer::Sgd, l), 5);
        let mut with_g = base.clone();
        let mut thetas = Vec::new();
        for _ in 0..l {
            thetas.push(with_g.sample().expect("sample"));
        }
        let (h, z) = with_g.pending_noise();
        let psi = base.noise_variance();
        for (li, theta) in thetas.iter().enumerate() {
            // (4.50): θ = F h + c + ψ^{1/2} ⊙ z with the reported noise.
            let expect = base.loadings().dot(&h.row(li)) + base.mean() + psi.mapv(f64::sqrt) * z.row(li);
            for (a, b) in theta.iter().zip(expect.iter()) {
                assert!((a - b).abs() < 1e-13);
            }
        }
        let mut without = with_g.clone();
        let mut g = Array2::zeros((l, d));
        fill_standard_normal(g.view_mut(), 9);
        with_g.step(g.view()).expect("step");
        without.step(Array2::<f64>::zeros((l, d)).view()).expect("step");
        // Difference of the two SGD steps (η = 1) = the averaged likelihood terms (4.51, 4.52, 4.61).
        let dc = &without.mean() - &with_g.mean();
        let df = &without.loadings() - &with_g.loadings();
        let db = &without.log_noise_variance() - &with_g.log_noise_variance();
        let lf = l as f64;
        let want_c = g.sum_axis(ndarray::Axis(0)) / lf;
        let want_f = g.t().dot(&h) / lf;
        let want_b = (&g * &z).sum_axis(ndarray::Axis(0)) * psi.mapv(f64::sqrt) * 0.5 / lf;
        for (a, b) in dc
            .iter()
            .chain(df.iter())
            .chain(db.iter())
            .zip(want_c.iter().chain(want_f.iter()).chain(want_b.iter()))
        {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    fn protocol_errors_leave_the_state_unchanged() {
        let d = 6;
        let mut vi = model::<f64>(d, 2, config(Optimizer::Adam, 2), 1);
        let before = vi.clone();
        assert!(matches!(
            vi.step(Array2::<f64>::zeros((2, d)).view()),
            Err(FaError::CallOrder(_))
        ));
        assert_eq!(vi, before);
        vi.sample().expect("sample");
        vi.sample().expect("sample");
        let pending = vi.clone();
        assert!(
            matches!(vi.sample(), Err(FaError::CallOrder(_))),
            "a third draw with n_grad_samples = 2 is a call-order error"
        );
        assert!(matches!(
            vi.step(Array2::<f64>::zeros((1, d)).view()),
            Err(FaError::Shape { .. })
        ));
        let mut bad = Array2::<f64>::zeros((2, d));
        bad[[1, 4]] = f64::NAN;
        assert!(matches!(vi.step(bad.view()), Err(FaError::BadValue { row: 1, .. })));
        assert_eq!(vi, pending);
        vi.step(Array2::<f64>::zeros((2, d)).view()).expect("step");
        assert_eq!((vi.n_steps(), vi.n_pending(), vi.n_draws()), (1, 0, 2));
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        let f = Array2::<f64>::zeros((4, 2));
        let init = VifaInit {
            loadings: f.view(),
            mean: None,
            noise_variance: None,
        };
        let ok = config(Optimizer::Sgd, 1);
        assert!(Vifa::<f64>::new(4, 2, init, 0, ok.clone()).is_ok());
        let bad = [
            VifaConfig {
                prior_precision: -1.0,
                ..ok.clone()
            },
            VifaConfig {
                prior_precision: f64::NAN,
                ..ok.clone()
            },
            VifaConfig {
                lr: LearningRates { mean: -0.1, ..ok.lr },
                ..ok.clone()
            },
            VifaConfig {
                n_grad_samples: 0,
                ..ok.clone()
            },
            VifaConfig {
                clip_grad_norm: Some(0.0),
                ..ok.clone()
            },
        ];
        for cfg in bad {
            assert!(Vifa::<f64>::new(4, 2, init, 0, cfg).is_err());
        }
        assert!(Vifa::<f64>::new(4, 5, init, 0, ok.clone()).is_err());
        let psi = Array1::from(vec![1.0, 0.0, 1.0, 1.0]);
        let init_bad = VifaInit {
            noise_variance: Some(psi.view()),
            ..init
        };
        assert!(Vifa::<f64>::new(4, 2, init_bad, 0, ok).is_err());
    }

    #[test]
    fn parallel_pass_equals_serial_pass() {
        let (d, k) = (40_000, 4);
        let mut cfg = config(Optimizer::Adam, 2);
        cfg.lr = LearningRates {
            mean: 1e-2,
            loadings: 1e-3,
            log_noise: 1e-2,
        };
        cfg.clip_grad_norm = Some(50.0);
        let run = |vi: &mut Vifa<f32>| {
            for step in 0..3 {
                let a = vi.sample().expect("sample");
                let b = vi.sample().expect("sample");
                let mut g = ndarray::stack(ndarray::Axis(0), &[a.view(), b.view()]).expect("stack");
                g.mapv_inplace(|v| 0.5 * v + step as f64);
                vi.step(g.view()).expect("step");
            }
        };
        let mut par = model::<f32>(d, k, cfg.clone(), 2);
        run(&mut par);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        let mut ser = model::<f32>(d, k, cfg, 2);
        pool.install(|| run(&mut ser));
        assert_eq!(par, ser);
    }

    #[test]
    fn clipping_bounds_each_group_norm() {
        let (d, k) = (6, 2);
        let mut cfg = config(Optimizer::Sgd, 1);
        cfg.clip_grad_norm = Some(0.01);
        let mut clipped = model::<f64>(d, k, cfg, 4);
        let mut plain = model::<f64>(d, k, config(Optimizer::Sgd, 1), 4);
        let g = Array2::from_elem((1, d), 3.0);
        for vi in [&mut clipped, &mut plain] {
            vi.sample().expect("sample");
        }
        let (c0, f0, b0) = (plain.mean(), plain.loadings(), plain.log_noise_variance());
        clipped.step(g.view()).expect("step");
        plain.step(g.view()).expect("step");
        let norm = |v: ndarray::ArrayViewD<f64>| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let pairs = [
            ((&c0 - &clipped.mean()).into_dyn(), (&c0 - &plain.mean()).into_dyn()),
            (
                (&f0 - &clipped.loadings()).into_dyn(),
                (&f0 - &plain.loadings()).into_dyn(),
            ),
            (
                (&b0 - &clipped.log_noise_variance()).into_dyn(),
                (&b0 - &plain.log_noise_variance()).into_dyn(),
            ),
        ];
        for (clip, full) in pairs {
            let (nc, nf) = (norm(clip.view()), norm(full.view()));
            assert!(nf > 0.01 && (nc - 0.01).abs() < 1e-12, "clipped norm {nc}, full {nf}");
            // Same direction: clip = full · 0.01 / ‖full‖.
            for (a, b) in clip.iter().zip(full.iter()) {
                assert!((a - b * 0.01 / nf).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn vifa_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Vifa<f32>>();
        assert_send_sync::<Vifa<f64>>();
    }

    #[test]
    fn divergence_is_reported_and_sticky() {
        let d = 4;
        let mut cfg = config(Optimizer::Sgd, 1);
        cfg.lr = LearningRates {
            mean: 1.0,
            loadings: 1.0,
            log_noise: 1e3,
        };
        let mut vi = model::<f64>(d, 1, cfg, 7);
        vi.sample().expect("sample");
        // ∇β ≈ ½ ψ^{1/2} g z with g = 1e6: a step of 1e3 · O(1e6) makes ψ = exp β overflow (or vanish).
        let g = Array2::from_elem((1, d), 1e6);
        assert!(matches!(vi.step(g.view()), Err(FaError::NotPositiveDefinite(_))));
        assert!(vi.sample().is_err());
    }
}

mod checkpoint {
    use super::*;
    use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

    const GROUPS: [&str; 3] = ["mean", "loadings", "log_noise"];

    fn write_params<T: StateReal>(w: &mut StateWriter, prefix: &str, p: &Params<T>, d: usize, k: usize) {
        w.array(&format!("{prefix}{}", GROUPS[0]), vec![d], &p.c);
        w.array(&format!("{prefix}{}", GROUPS[1]), vec![d, k], &p.f);
        w.array(&format!("{prefix}{}", GROUPS[2]), vec![d], &p.beta);
    }

    fn read_params<T: StateReal>(r: &StateReader, prefix: &str, d: usize, k: usize) -> Result<Params<T>> {
        Ok(Params {
            c: r.array::<T>(&format!("{prefix}{}", GROUPS[0]), &[d])?,
            f: r.array::<T>(&format!("{prefix}{}", GROUPS[1]), &[d, k])?,
            beta: r.array::<T>(&format!("{prefix}{}", GROUPS[2]), &[d])?,
        })
    }

    impl<T: StateReal> Checkpoint for Vifa<T> {
        const KIND: &'static str = "VIFA";

        fn to_state(&self) -> StateMap {
            let (d, k) = (self.n_features, self.n_components);
            let mut w = StateWriter::new(Self::KIND);
            w.put("n_features", StateValue::Int(d as u64));
            w.put("n_components", StateValue::Int(k as u64));
            w.put("prior_precision", StateValue::Float(self.config.prior_precision));
            w.put("lr_mean", StateValue::Float(self.config.lr.mean));
            w.put("lr_loadings", StateValue::Float(self.config.lr.loadings));
            w.put("lr_log_noise", StateValue::Float(self.config.lr.log_noise));
            w.put("optimizer", StateValue::Text(self.config.optimizer.name().into()));
            w.put("n_grad_samples", StateValue::Int(self.config.n_grad_samples as u64));
            if let Some(max) = self.config.clip_grad_norm {
                w.put("clip_grad_norm", StateValue::Float(max));
            }
            w.put("seed", StateValue::Int(self.seed));
            w.put("n_draws", StateValue::Int(self.n_draws));
            w.put("n_pending", StateValue::Int(self.n_pending as u64));
            w.put("n_steps", StateValue::Int(self.n_steps));
            w.put("diverged", StateValue::Bool(self.m_inv.is_none()));
            if self.row_offset != 0 {
                w.put("row_offset", StateValue::Int(self.row_offset as u64));
            }
            write_params(&mut w, "", &self.params, d, k);
            if let Some(m) = &self.moments {
                write_params(&mut w, "adam_m_", &m.first, d, k);
                write_params(&mut w, "adam_v_", &m.second, d, k);
            }
            w.0
        }

        fn from_state(state: &StateMap) -> Result<Self> {
            expect_kind(state, Self::KIND)?;
            let r = StateReader(state);
            let bad = |e: FaError| FaError::InvalidState(e.to_string());
            let (d, k) = (r.usize("n_features")?, r.usize("n_components")?);
            validate_vifa_dims(d, k).map_err(bad)?;
            let config = VifaConfig {
                prior_precision: r.float("prior_precision")?,
                lr: LearningRates {
                    mean: r.float("lr_mean")?,
                    loadings: r.float("lr_loadings")?,
                    log_noise: r.float("lr_log_noise")?,
                },
                optimizer: Optimizer::parse(r.text("optimizer")?).map_err(bad)?,
                n_grad_samples: r.usize("n_grad_samples")?,
                clip_grad_norm: if r.has("clip_grad_norm") {
                    Some(r.float("clip_grad_norm")?)
                } else {
                    None
                },
            };
            config.validate().map_err(bad)?;
            let (n_draws, n_pending) = (r.int("n_draws")?, r.usize("n_pending")?);
            if n_pending > config.n_grad_samples || n_pending as u64 > n_draws {
                return Err(FaError::InvalidState(format!(
                    "n_pending = {n_pending} exceeds n_grad_samples or n_draws = {n_draws}"
                )));
            }
            if r.bool("diverged")? {
                return Err(FaError::InvalidState("the checkpointed VIFA had diverged".into()));
            }
            let moments = match config.optimizer {
                Optimizer::Sgd => None,
                Optimizer::Adam => Some(Moments {
                    first: read_params::<T>(&r, "adam_m_", d, k)?,
                    second: read_params::<T>(&r, "adam_v_", d, k)?,
                }),
            };
            let mut model = Vifa {
                n_features: d,
                n_components: k,
                config,
                seed: r.int("seed")?,
                n_draws,
                n_pending,
                n_steps: r.int("n_steps")?,
                params: read_params(&r, "", d, k)?,
                moments,
                m_inv: None,
                row_offset: if r.has("row_offset") { r.usize("row_offset")? } else { 0 },
            };
            if model
                .params
                .beta
                .iter()
                .any(|b| b.to_f64().is_nan() || b.to_f64().abs() > LOG_NOISE_LIMIT)
            {
                return Err(FaError::InvalidState(format!(
                    "entry `log_noise` has |β| > {LOG_NOISE_LIMIT}"
                )));
            }
            model.m_inv = Some(model.recompute_m_inv().map_err(bad)?);
            Ok(model)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn adam_model(d: usize, seed: u64) -> Vifa<f32> {
            let f = crate::init::orthonormal_loadings(d, 2, seed).expect("init");
            let cfg = VifaConfig {
                prior_precision: 0.1,
                lr: LearningRates {
                    mean: 1e-2,
                    loadings: 1e-3,
                    log_noise: 1e-2,
                },
                optimizer: Optimizer::Adam,
                n_grad_samples: 2,
                clip_grad_norm: Some(10.0),
            };
            Vifa::new(
                d,
                2,
                VifaInit {
                    loadings: f.view(),
                    mean: None,
                    noise_variance: None,
                },
                seed,
                cfg,
            )
            .expect("new")
        }

        /// Quadratic NLL ½‖θ − 1‖²: gradient θ − 1.
        fn cycle(vi: &mut Vifa<f32>) {
            while vi.n_pending() < vi.config().n_grad_samples {
                vi.sample().expect("sample");
            }
            let (h, z) = vi.pending_noise();
            let thetas = h.dot(&vi.loadings().t()) + vi.mean() + &(z * vi.noise_variance().mapv(f64::sqrt));
            vi.step((thetas - 1.0).view()).expect("step");
        }

        #[test]
        fn resume_from_state_is_bit_identical() {
            let d = 300;
            let mut a = adam_model(d, 11);
            for _ in 0..3 {
                cycle(&mut a);
            }
            a.sample().expect("sample"); // one draw pending in the checkpoint
            let mut b = Vifa::<f32>::from_state(&a.to_state()).expect("restore");
            assert_eq!(a, b);
            for _ in 0..3 {
                cycle(&mut a);
                cycle(&mut b);
            }
            assert_eq!(a, b);
            assert!(
                Vifa::<f64>::from_state(&a.to_state()).is_err(),
                "dtype mismatch must be rejected"
            );
            let mut broken = a.to_state();
            broken.insert("n_pending".into(), StateValue::Int(5));
            assert!(Vifa::<f32>::from_state(&broken).is_err());
            let mut broken = a.to_state();
            broken.remove("adam_v_loadings");
            assert!(Vifa::<f32>::from_state(&broken).is_err());
        }
    }
}
