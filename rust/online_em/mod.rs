//! Online EM for factor analysis (thesis Algorithm 2), one streaming pass over the D×K state per sample.
//!
//! State (thesis names): θ̄ (`mean`, D), Ā (`a_bar`, D×K), d̄² (`dsq_bar`, D), B̄ (`b_bar`, K×K).
//! F and ψ are not stored: after warm-up they are functions of the statistics,
//! F = Ā H̄⁻¹ (4.33) and ψ = d̄² − rowsum(F ⊙ Ā) (4.35 with F H̄ = Ā), H̄ = Σ + B̄.
//!
//! One pass per sample: the rank-1 update Ā_t = Ā_{t−1} + ρ_t (d_t m_tᵀ − Ā_{t−1}) (line 12) is row-local,
//! so it is left *pending* and applied by the next pass while that pass reads the same row to build the
//! next E-step's sums S = C F and u = C d (4.23). The only cross-row quantities are S (K×K) and u (K).

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use crate::config_checks::{checked_init, checked_rows};
use crate::engine::block::{accumulate_estep, block_times, load_rows, rank_one_update, row_dots};
use crate::engine::driver::{self, Driven};
use crate::engine::em_kernel::{row_kernel_max, to_loadings_space, EmBlockIo, EmConsts, EmRowKernel, Isa};
use crate::engine::em_wide::{em_wide_block, WideConsts, WideIo, WideScratch};
use crate::engine::k_dispatch::for_k;
use crate::engine::model::hooks::Pass;
use crate::engine::packed::Layout;
use crate::engine::partition::{stream_pass, validate_batch, Block, Scratch, StateRows, BLOCK_ROWS};
use crate::engine::tiled::Tiled;
use crate::engine::{advance, Advanced};
pub use crate::engine::{StepSums, StreamingModel};
use crate::error::{checked_size, try_filled, Result};
use crate::linalg::SpdFactor;
use crate::scalar::{stored, Real};
use crate::scaling::Scaling;
use crate::schedule::StepSize;

/// Hyper-parameters of [`OnlineEm`].
#[derive(Debug, Clone, PartialEq)]
pub struct EmConfig {
    /// Samples during which F and ψ stay at their initial values while the averages are updated.
    pub n_warmup: u64,
    /// Lower bound on every ψ_d (absolute, in squared data units).
    pub noise_floor: f64,
    /// Step sizes ρ_t of the running averages.
    pub step_size: StepSize,
    /// Apply the whitening (PX-EM) step after every M-step: F ← F R, Ā ← Ā R⁻ᵀ, H̄ ← I (R Rᵀ = H̄).
    pub whiten: bool,
    /// Scale convention of the warm-up start, the noise floor and the mean (`Unit`: the thesis).
    pub scaling: Scaling,
    /// Report the fitted Gaussian with the spiked-model shrinkage of its factors (crate::shrinkage); the
    /// running statistics and the updates are the same either way.
    pub shrink: bool,
}

impl Default for EmConfig {
    fn default() -> Self {
        EmConfig {
            n_warmup: 100,
            noise_floor: 1e-10,
            step_size: StepSize::Harmonic,
            whiten: false,
            scaling: Scaling::Unit,
            shrink: false,
        }
    }
}

/// Online EM factor analysis with state stored in `T` (f32 or f64): the D-sized rows, and the K×K step
/// ([`EmStep`]) that every row store shares.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineEm<T: Real> {
    pub(crate) n_features: usize,
    pub(crate) n_components: usize,
    pub(crate) step: EmStep,
    pub(crate) mean: Vec<T>,
    /// Ā, D×K, stored in `layout`.
    pub(crate) a_bar: Vec<T>,
    pub(crate) dsq_bar: Vec<T>,
    /// d_t of the last sample, needed by the pending rank-1 update.
    pub(crate) d_last: Vec<T>,
    /// The initial loadings F₀ (D×K, row-major) while the step's basis is `Basis::Initial`; empty after.
    pub(crate) init: Vec<T>,
    /// The code path of the row kernels (detected once for this CPU; never saved).
    pub(crate) isa: Isa,
    /// The order of Ā's values in memory: the one its row kernel on `isa` reads fastest (never saved: a
    /// checkpoint holds Ā row-major).
    pub(crate) layout: Layout,
    /// The reporting map of the last query (crate::shrinkage), for the next query at the same sample count.
    pub(crate) report_cache: crate::shrinkage::ReportCache,
}

/// Everything a pass needs besides the rows.
struct PassCtx<'a, T: Real> {
    pending: Option<&'a Pending>,
    basis: &'a Basis,
    /// F₀ (D×K) while the basis is `Basis::Initial`.
    init: &'a [T],
    rho: f64,
    /// Step size of the running mean (1/t under `Scaling::Data`).
    mean_rho: f64,
    /// σ of the warm-up start F₀ σ, ψ₀ = σ².
    init_scale: f64,
    floor: f64,
    k: usize,
    /// How Ā is stored.
    layout: Layout,
    /// The fused row-SIMD kernel's constants and code path, when it runs this pass.
    fast: Option<(EmConsts<T>, EmRowKernel<T>)>,
    /// The wide kernel's constants (K > `row_kernel_max` of its path), when it runs this pass.
    wide: Option<WideConsts>,
}

/// Visitor of blocks of the fitted Gaussian: `(first_row, mean (nb), F (nb×K row-major), ψ (nb))`, f64.
pub(crate) type FittedRowsVisitor<'a> = dyn FnMut(usize, &[f64], &[f64], &[f64]) -> Result<()> + 'a;

/// How a model of K = `k` with state type T stores Ā on code path `isa`: as its row kernel there reads it
/// fastest (row-major where no row kernel runs).
pub(crate) fn layout_for<T: Real>(k: usize, isa: Isa) -> Layout {
    EmRowKernel::<T>::select(k, isa).map_or(Layout::Rows, |kernel| kernel.preferred_layout())
}

impl<T: Real> OnlineEm<T> {
    /// New model. `init` is F₀ (D×K); ψ starts at 1, θ̄ at 0.
    pub fn new(n_features: usize, n_components: usize, init: ArrayView2<f64>, config: EmConfig) -> Result<Self> {
        EmStep::checked::<T>(n_features, n_components, config.clone())?;
        let init = checked_init::<T>(init, n_features, n_components)?;
        Self::from_rows(n_features, n_components, init, config)
    }

    /// New model from F₀ already in the storage type (D·K values, row-major, finite and within
    /// `T::MAX_INPUT`), such as [`crate::init::orthonormal_rows`]: no f64 copy of it is made.
    pub fn from_rows(n_features: usize, n_components: usize, init: Vec<T>, config: EmConfig) -> Result<Self> {
        let step = EmStep::checked::<T>(n_features, n_components, config)?;
        let init = checked_rows(init, n_features, n_components)?;
        let k = n_components;
        Ok(OnlineEm {
            n_features,
            n_components,
            step,
            mean: try_filled(n_features, T::default(), "n_features")?,
            a_bar: try_filled(checked_size(n_features, k)?, T::default(), "n_features")?,
            dsq_bar: try_filled(n_features, T::default(), "n_features")?,
            d_last: try_filled(n_features, T::default(), "n_features")?,
            init,
            isa: Isa::detect(),
            layout: layout_for::<T>(k, Isa::detect()),
            report_cache: Default::default(),
        })
    }

    /// Number of samples applied so far.
    pub fn n_seen(&self) -> u64 {
        self.step.n_seen
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &EmConfig {
        &self.step.config
    }

    /// The K×K part of the model (B̄, Σ, the basis of F and the pending step).
    pub fn step(&self) -> &EmStep {
        &self.step
    }

    /// D.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// K.
    pub fn n_components(&self) -> usize {
        self.n_components
    }

    /// Apply the rows of `x` (n×D) in order. The whole batch is validated first, so a shape, NaN/Inf or
    /// magnitude error applies nothing. A numerical breakdown never leaves a torn state: up to
    /// `SNAPSHOT_MAX_ELEMENTS` (engine/partition.rs) the model is restored to its state before the call; for larger models
    /// it is left exactly as it was before the failing row (the rows before it stay applied), at no extra
    /// memory traffic — see [`OnlineEm::step`].
    pub fn update<X: Real>(&mut self, x: ArrayView2<X>) -> Result<()> {
        driver::update(self, x)
    }

    /// The pass, through the fused kernel on code path `isa` (or, for K > `row_kernel_max`, the wide kernel) when it
    /// applies (None: block-by-block path); returns whether a kernel ran.
    fn pass_on<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        rho: f64,
        mean_rho: f64,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        isa: Option<Isa>,
    ) -> bool {
        let floor = self.floor();
        let kernel = isa.and_then(|isa| EmRowKernel::select(self.n_components, isa));
        let fast = kernel.and_then(|kernel| self.kernel_consts(rho, mean_rho, floor).map(|c| (c, kernel)));
        let wide = isa.and_then(|isa| self.wide_consts(rho, mean_rho, floor, isa));
        self.pass_with(x, rho, mean_rho, scratch, sums, fast, wide)
    }

    /// The pass with the given kernel constants (both None: block-by-block path).
    #[allow(clippy::too_many_arguments)]
    fn pass_with<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        rho: f64,
        mean_rho: f64,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        fast: Option<(EmConsts<T>, EmRowKernel<T>)>,
        wide: Option<WideConsts>,
    ) -> bool {
        let k = self.n_components;
        let floor = self.floor();
        let ctx = PassCtx {
            pending: self.step.pending.as_ref(),
            basis: &self.step.basis,
            init: &self.init,
            rho,
            mean_rho,
            init_scale: self.step.warmup_scale(),
            floor,
            k,
            layout: self.layout,
            fast,
            wide,
        };
        let state = StateRows {
            matrix: &mut self.a_bar,
            mean: &mut self.mean,
            var: &mut self.dsq_bar,
            d_last: &mut self.d_last,
        };
        stream_pass(state, k, &x, scratch, sums, |row0, rows, x, blk, part| {
            em_block(row0, rows, x, &ctx, blk, part)
        });
        if let Some((consts, _)) = &ctx.fast {
            let upper: Option<Vec<f64>> = consts.upper.as_ref().map(|u| u.iter().map(|v| v.to_f64()).collect());
            let s = sums.s.as_slice_mut().expect("sums are allocated contiguous");
            let u = sums.u.as_slice_mut().expect("sums are allocated contiguous");
            to_loadings_space(k, upper.as_deref(), s, u);
            return true;
        }
        if let Some(consts) = &ctx.wide {
            // U = Lᵀ (Uᵀ U = L Lᵀ = H̄⁻¹).
            let upper = consts.factor.as_ref().map(|l| {
                let kp = l.kp;
                (0..k * k).map(|ij| l.m[(ij % k) * kp + ij / k]).collect::<Vec<f64>>()
            });
            let s = sums.s.as_slice_mut().expect("sums are allocated contiguous");
            let u = sums.u.as_slice_mut().expect("sums are allocated contiguous");
            to_loadings_space(k, upper.as_deref(), s, u);
            return true;
        }
        false
    }

    /// Constants of the wide kernel (engine/em_wide.rs) for this pass, or None when another path runs (warm-up,
    /// K <= `row_kernel_max`). L is the lower Cholesky factor of H̄⁻¹.
    fn wide_consts(&self, rho: f64, mean_rho: f64, floor: f64, isa: Isa) -> Option<WideConsts> {
        let k = self.n_components;
        if k <= row_kernel_max::<T>(isa) {
            return None;
        }
        let tiled = |m: &Array2<f64>| Tiled::new(k, &m.iter().copied().collect::<Vec<f64>>());
        let factor = match &self.step.basis {
            Basis::Initial => return None,
            Basis::Stats(h_inv) => Some(tiled(&SpdFactor::new(h_inv.view(), "H̄⁻¹").ok()?.lower())),
            Basis::Whitened => None,
        };
        let pending = self.step.pending.as_ref();
        Some(WideConsts {
            k,
            moments: pending.and_then(|p| p.moments),
            pending: pending.map(|p| (p.rho, p.m.to_vec())),
            transform: pending.and_then(|p| p.transform.as_ref()).map(tiled),
            factor,
            rho,
            mean_rho,
            floor,
            isa,
        })
    }

    /// Constants of the fused kernel (engine/em_kernel.rs, which `EmRowKernel::select` picked for this K and
    /// path) for this pass, or None during warm-up. U is the transposed Cholesky factor of H̄⁻¹ (Uᵀ U = H̄⁻¹).
    fn kernel_consts(&self, rho: f64, mean_rho: f64, floor: f64) -> Option<EmConsts<T>> {
        let to_t = |m: &Array2<f64>| -> Vec<T> { m.iter().map(|&v| T::from_f64(v)).collect() };
        let upper = match &self.step.basis {
            Basis::Initial => return None,
            Basis::Stats(h_inv) => Some(to_t(&SpdFactor::new(h_inv.view(), "H̄⁻¹").ok()?.lower().reversed_axes())),
            Basis::Whitened => None,
        };
        let pending = self.step.pending.as_ref();
        Some(EmConsts {
            moments: pending.and_then(|p| p.moments),
            pending: pending.map(|p| (T::from_f64(p.rho), p.m.iter().map(|&v| T::from_f64(v)).collect())),
            transform: pending.and_then(|p| p.transform.as_ref()).map(to_t),
            upper,
            rho,
            mean_rho,
            floor,
        })
    }

    /// The K×K part of Algorithm 2 (lines 8–11, 13) after the pass has produced S = C F and u = C d
    /// ([`EmStep::finish`]); F₀ is freed once the warm-up basis is left.
    fn finish_step(&mut self, sums: &StepSums, n_total: usize) -> Result<()> {
        self.step.finish::<T>(sums, n_total)?;
        if self.step.is_fitted() && !self.init.is_empty() {
            self.init = Vec::new();
        }
        Ok(())
    }

    /// The model as it would be had its warm-up ended with the last sample: the first M-step (lines 11
    /// and 13) applied to the statistics gathered so far, without changing `self`. It equals, bit for bit,
    /// the same model built with `n_warmup = n_seen − 1` and fed the same samples, so its Gaussian has
    /// rank at most n_seen − 1 (d₁ = 0). One clone of the rows (D·K + 4·D values).
    ///
    /// Errors with [`crate::error::FaError::CallOrder`] when warm-up is already over, fewer than two samples were seen,
    /// or every sample so far was identical (no scale to fit).
    pub fn ended_warmup(&self) -> Result<Self> {
        let step = self.step.ended_warmup()?;
        Ok(OnlineEm {
            n_features: self.n_features,
            n_components: self.n_components,
            step,
            mean: self.mean.clone(),
            a_bar: self.a_bar.clone(),
            dsq_bar: self.dsq_bar.clone(),
            d_last: self.d_last.clone(),
            init: Vec::new(),
            isa: self.isa,
            layout: self.layout,
            report_cache: Default::default(),
        })
    }

    /// Ā with the pending update applied, as the next pass will store it (D×K, f64).
    #[cfg(test)]
    fn current_a_bar(&self) -> Array2<f64> {
        let k = self.n_components;
        let mut blk = Block::new(k);
        let mut out = Vec::with_capacity(self.n_features * k);
        for first in (0..self.n_features).step_by(BLOCK_ROWS) {
            let nb = (self.n_features - first).min(BLOCK_ROWS);
            for (r, d) in blk.d_prev[..nb].iter_mut().enumerate() {
                *d = self.pending_moments(first + r).d;
            }
            self.layout
                .read_rows(&self.a_bar, self.n_features, k, first..first + nb, &mut blk.a);
            apply_pending::<T>(&mut blk, self.step.pending.as_ref(), nb);
            out.extend_from_slice(&blk.a[..nb * k]);
        }
        Array2::from_shape_vec((self.n_features, k), out).expect("D·K values collected")
    }

    /// Call `visit(first_row, mean (nb), F (nb×K), ψ (nb))` for consecutive blocks of the fitted Gaussian in
    /// `rows`, in f64, as the next E-step will use it (pending update applied): F = Ā H̄⁻¹ (Ā when whitened),
    /// ψ = max(d̄² − rowsum(F ⊙ Ā), floor). Each row's pending moments are computed once. After warm-up only.
    pub(crate) fn visit_fitted_rows(
        &self,
        rows: std::ops::Range<usize>,
        visit: &mut FittedRowsVisitor<'_>,
    ) -> Result<()> {
        match self.lane_maps(None) {
            Some(maps) => self.visit_lane_rows(rows, &maps, visit),
            None => self.visit_block_rows(rows, visit),
        }
    }

    /// [`Self::visit_fitted_rows`] through the block path: explicit products of each block of rows (for the K
    /// the lane path does not take).
    pub(crate) fn visit_block_rows(
        &self,
        rows: std::ops::Range<usize>,
        visit: &mut FittedRowsVisitor<'_>,
    ) -> Result<()> {
        let k = self.n_components;
        let floor = self.floor();
        let h_inv = match &self.step.basis {
            Basis::Stats(h_inv) => Some(h_inv.view()),
            _ => None,
        };
        let mut blk = Block::new(k);
        let (mut mean, mut dsq) = (vec![0.0; BLOCK_ROWS], vec![0.0; BLOCK_ROWS]);
        for first in rows.clone().step_by(BLOCK_ROWS) {
            let nb = (rows.end - first).min(BLOCK_ROWS);
            for r in 0..nb {
                let moments = self.pending_moments(first + r);
                (mean[r], dsq[r], blk.d_prev[r]) = (moments.mean.1, moments.dsq.1, moments.d);
            }
            self.layout
                .read_rows(&self.a_bar, self.n_features, k, first..first + nb, &mut blk.a);
            apply_pending::<T>(&mut blk, self.step.pending.as_ref(), nb);
            let f: &[f64] = match h_inv {
                Some(h_inv) => {
                    block_times(&blk.a, h_inv, &mut blk.f, nb);
                    &blk.f[..nb * k]
                }
                None => &blk.a[..nb * k],
            };
            row_dots(f, &blk.a, k, nb, &mut blk.psi);
            for (psi, &d) in blk.psi[..nb].iter_mut().zip(&dsq[..nb]) {
                *psi = (d - *psi).max(floor);
            }
            visit(first, &mean[..nb], f, &blk.psi[..nb])?;
        }
        Ok(())
    }

    /// The maps of the lane path (`lane_rows`) with the rows mapped by `report` (K×K row-major) when given, or
    /// None where it does not apply: a K it does not take, or a K×K map of the step not stored contiguous.
    fn lane_maps<'a>(&'a self, report: Option<&'a [f64]>) -> Option<lane_rows::LaneMaps<'a>> {
        if !lane_rows::lanes_apply(self.n_components) {
            return None;
        }
        let basis = match &self.step.basis {
            Basis::Stats(h_inv) => Some(h_inv.as_slice()?),
            Basis::Whitened => None,
            Basis::Initial => return None,
        };
        let pending = match self.step.pending.as_ref() {
            Some(p) => {
                let whiten = match &p.transform {
                    Some(w) => Some(w.as_slice()?),
                    None => None,
                };
                Some((p.m.as_slice()?, p.rho, whiten))
            }
            None => None,
        };
        Some(lane_rows::LaneMaps {
            pending,
            basis,
            report,
            floor: self.floor(),
        })
    }

    /// [`Self::visit_fitted_rows`] through the lane path with `maps` ([`Self::lane_maps`]): F' = F R and
    /// ψ' = ψ + max(‖F‖² − ‖F'‖², 0) when they hold a reporting map R.
    fn visit_lane_rows(
        &self,
        rows: std::ops::Range<usize>,
        maps: &lane_rows::LaneMaps<'_>,
        visit: &mut FittedRowsVisitor<'_>,
    ) -> Result<()> {
        let k = self.n_components;
        let (mut mean, mut f, mut psi) = (vec![0.0; BLOCK_ROWS], vec![0.0; BLOCK_ROWS * k], vec![0.0; BLOCK_ROWS]);
        for first in rows.clone().step_by(BLOCK_ROWS) {
            let nb = (rows.end - first).min(BLOCK_ROWS);
            let out = lane_rows::LaneBlock {
                mean: &mut mean[..nb],
                f: &mut f[..nb * k],
                psi: &mut psi[..nb],
            };
            for_k!(extended k, K => lane_rows::fill_block::<T, K>(self, first, maps, out),
                _ => unreachable!("lanes_apply accepts K <= MAX_K_EXTENDED only"));
            visit(first, &mean[..nb], &f[..nb * k], &psi[..nb])?;
        }
        Ok(())
    }

    /// The noise floor the next pass applies (absolute, or relative to σ̂² under `Scaling::Data`).
    pub fn floor(&self) -> f64 {
        self.step.floor::<T>()
    }

    /// σ̂² = (1/D) Σ_d d̄²_d, the mean squared deviation of the features after the last sample.
    pub fn scale_sq(&self) -> f64 {
        self.step.scale_sq
    }

    /// Whether warm-up is over, i.e. the loadings and noise variances are fitted rather than initial.
    /// Warm-up length: the fitted Gaussian exists once more than this many samples were seen.
    pub fn n_warmup(&self) -> u64 {
        self.step.config.n_warmup
    }

    /// Effective number of samples behind the running averages (crate::shrinkage::effective_samples).
    pub fn effective_samples(&self) -> f64 {
        self.step.effective_samples()
    }

    pub fn is_fitted(&self) -> bool {
        self.step.is_fitted()
    }

    /// Loadings F (D×K) as the next E-step will use them.
    pub fn loadings(&self) -> Array2<f64> {
        match &self.step.basis {
            Basis::Initial => {
                let scale = self.step.warmup_scale();
                Array2::from_shape_fn((self.n_features, self.n_components), |(i, j)| {
                    self.init[i * self.n_components + j].to_f64() * scale
                })
            }
            Basis::Stats(_) | Basis::Whitened => self.fitted_rows().0,
        }
    }

    /// Noise variances ψ (D) as the next E-step will use them: ψ = max(d̄² − rowsum(F ⊙ Ā), floor).
    pub fn noise_variance(&self) -> Array1<f64> {
        match &self.step.basis {
            Basis::Initial => Array1::from_elem(self.n_features, self.step.warmup_scale().powi(2)),
            Basis::Stats(_) | Basis::Whitened => self.fitted_rows().1,
        }
    }

    /// F (D×K) and ψ (D) of the fitted model, from [`Self::visit_fitted_rows`].
    fn fitted_rows(&self) -> (Array2<f64>, Array1<f64>) {
        let (mut f, mut psi) = (Vec::with_capacity(self.n_features * self.n_components), Vec::new());
        self.visit_fitted_rows(0..self.n_features, &mut |_, _, rows, p| {
            f.extend_from_slice(rows);
            psi.extend_from_slice(p);
            Ok(())
        })
        .expect("collecting never fails");
        let f = Array2::from_shape_vec((self.n_features, self.n_components), f).expect("D·K values collected");
        (f, Array1::from(psi))
    }

    /// Running mean θ̄ (D).
    pub fn mean(&self) -> Array1<f64> {
        (0..self.n_features).map(|i| self.pending_moments(i).mean.1).collect()
    }

    /// Row i's θ̄ and d̄² with the pending moments applied, and the d the pending Ā update uses.
    pub(crate) fn pending_moments(&self, i: usize) -> Advanced<T> {
        let (mean, dsq, last) = (self.mean[i], self.dsq_bar[i], self.d_last[i].to_f64());
        match self.step.pending.as_ref().and_then(|p| p.moments) {
            Some((mean_rho, rho)) => advance::<T>(mean.to_f64(), dsq.to_f64(), last, mean_rho, rho),
            None => Advanced {
                mean: (mean, mean.to_f64()),
                dsq: (dsq, dsq.to_f64()),
                d: last,
            },
        }
    }

    /// Σ of the last E-step (K×K).
    pub fn latent_covariance(&self) -> &Array2<f64> {
        &self.step.sigma
    }
}

/// Ā rows of the block ← ((1 − ρ) Ā + ρ d mᵀ) W, rounded to storage precision (line 12 of Algorithm 2,
/// plus the optional whitening transform). `blk.a[..nb·K]` holds the stored rows on entry.
/// `blk.d_prev[..nb]` holds the previous sample's d.
fn apply_pending<T: Real>(blk: &mut Block, pending: Option<&Pending>, nb: usize) {
    let Some(p) = pending else { return };
    let k = blk.k;
    let m = p.m.as_slice().expect("m is contiguous");
    rank_one_update(&mut blk.a, &blk.d_prev, m, p.rho, nb);
    if let Some(w) = &p.transform {
        block_times(&blk.a, w.view(), &mut blk.tmp, nb);
        std::mem::swap(&mut blk.a, &mut blk.tmp);
    }
    for v in blk.a[..nb * k].iter_mut() {
        *v = stored::<T>(*v).1;
    }
}

/// The pass over one block of rows (first row `row0`; x: this sample's values for them): through the row-SIMD
/// kernel or the wide kernel when one runs this pass, else the block path with explicit F. Shapes: rows.matrix
/// (Ā) is nb×K in `ctx.layout`, the other rows and x are nb.
fn em_block<T: Real>(
    row0: usize,
    rows: StateRows<'_, T>,
    x: &[f64],
    ctx: &PassCtx<T>,
    blk: &mut Block,
    sums: &mut StepSums,
) {
    if let Some((consts, kernel)) = &ctx.fast {
        let nb = rows.mean.len();
        let mut io = EmBlockIo {
            a: rows.matrix,
            mean: rows.mean,
            dsq: rows.var,
            d_last: rows.d_last,
            x,
            consts,
            dsq_sum: &mut sums.dsq_sum,
            u: sums.u.as_slice_mut().expect("sums are allocated contiguous"),
            s: sums.s.as_slice_mut().expect("sums are allocated contiguous"),
        };
        kernel.run(&mut io, nb, ctx.layout);
        return;
    }
    // The wide kernel and the block path read row-major Ā: a packed block is rearranged for them and back.
    let StateRows {
        matrix,
        mean,
        var,
        d_last,
    } = rows;
    ctx.layout.restore_rows(matrix, mean.len(), ctx.k);
    let rows = StateRows {
        matrix: &mut *matrix,
        mean,
        var,
        d_last,
    };
    let nb = rows.mean.len();
    em_block_rows(ctx, (row0, rows, x), blk, sums);
    ctx.layout.arrange(matrix, nb, ctx.k);
}

/// [`em_block`] through the wide kernel or the block path, with the block's Ā row-major.
fn em_block_rows<T: Real>(
    ctx: &PassCtx<T>,
    (row0, rows, x): (usize, StateRows<'_, T>, &[f64]),
    blk: &mut Block,
    sums: &mut StepSums,
) {
    let nb = rows.mean.len();
    let u = sums.u.as_slice_mut().expect("sums are allocated contiguous");
    let s = sums.s.as_slice_mut().expect("sums are allocated contiguous");
    if let Some(consts) = &ctx.wide {
        let mut io = WideIo {
            a: rows.matrix,
            mean: rows.mean,
            dsq: rows.var,
            d_last: rows.d_last,
            x,
            dsq_sum: &mut sums.dsq_sum,
            u,
            s,
        };
        let mut scratch = WideScratch {
            a: &mut blk.a,
            z: &mut blk.f,
            y: &mut blk.tmp,
            d_prev: &mut blk.d_prev,
        };
        em_wide_block(consts, &mut io, &mut scratch);
        return;
    }
    // 1. The previous sample's pending moments (lines 5, 6, 14) and line 12: θ̄_{t−1}, d̄²_{t−1} and Ā_{t−1}
    //    from the stored values; write them back.
    pending_moments_block(rows.mean, rows.var, rows.d_last, ctx.pending, &mut blk.d_prev);
    load_rows(rows.matrix, &mut blk.a);
    if ctx.pending.is_some() {
        apply_pending::<T>(blk, ctx.pending, nb);
        for (dst, src) in rows.matrix.iter_mut().zip(blk.a.iter()) {
            *dst = T::from_f64(*src);
        }
    }
    // 2. F and ψ of the previous sample (lines 13, 15), or F₀ and ψ = 1 during warm-up.
    loadings_block(blk, rows.var, row0, ctx, nb);
    // 3. This sample: innovation e = x_t − θ̄_{t−1} (stored in d_last), d_t and d̄²_t (registers only).
    let state = rows.mean.iter().zip(rows.var.iter()).zip(rows.d_last.iter_mut());
    let mut dsq_sum = 0.0;
    for ((((mean, dsq), d_last), &xi), d_out) in state.zip(x).zip(blk.d.iter_mut()) {
        let m0 = mean.to_f64();
        let (e_s, e) = stored::<T>(xi - m0);
        let adv = advance::<T>(m0, dsq.to_f64(), e, ctx.mean_rho, ctx.rho);
        dsq_sum += adv.dsq.1;
        *d_last = e_s;
        *d_out = adv.d;
    }
    sums.dsq_sum += dsq_sum;
    // 4. E-step sums (4.23): S += Fᵀ Ψ⁻¹ F, u += Fᵀ Ψ⁻¹ d over this block.
    accumulate_estep(blk, nb, sums);
}

/// Apply the previous sample's pending moments to rows (θ̄, d̄², d_last: nb each; writing θ̄, d̄²) and put the d its
/// line-12 update uses into `d_prev`.
fn pending_moments_block<T: Real>(
    mean: &mut [T],
    dsq: &mut [T],
    d_last: &[T],
    pending: Option<&Pending>,
    d_prev: &mut [f64],
) {
    let moments = pending.and_then(|p| p.moments);
    let state = mean.iter_mut().zip(dsq.iter_mut()).zip(d_last.iter());
    for (((mean, dsq), last), out) in state.zip(d_prev.iter_mut()) {
        *out = last.to_f64();
        if let Some((mean_rho, rho)) = moments {
            let adv = advance::<T>(mean.to_f64(), dsq.to_f64(), *out, mean_rho, rho);
            (*mean, *dsq, *out) = (adv.mean.0, adv.dsq.0, adv.d);
        }
    }
}

/// blk.f[..nb] and blk.psi[..nb] for rows starting at global row `row0`:
/// F = Ā H̄⁻¹ and ψ = max(d̄² − rowsum(F ⊙ Ā), floor) (4.33, 4.35), or F₀ σ and σ² during warm-up.
fn loadings_block<T: Real>(blk: &mut Block, dsq: &[T], row0: usize, ctx: &PassCtx<T>, nb: usize) {
    let k = ctx.k;
    match ctx.basis {
        Basis::Initial => {
            // F₀ σ and ψ₀ = σ² (σ = 1 under `Scaling::Unit`: exactly the thesis's F₀, ψ = 1).
            load_rows(&ctx.init[row0 * k..(row0 + nb) * k], &mut blk.f);
            if ctx.init_scale != 1.0 {
                blk.f[..nb * k].iter_mut().for_each(|v| *v *= ctx.init_scale);
            }
            blk.psi[..nb].fill(ctx.init_scale * ctx.init_scale);
            return;
        }
        Basis::Stats(h_inv) => block_times(&blk.a, h_inv.view(), &mut blk.f, nb),
        Basis::Whitened => blk.f[..nb * k].copy_from_slice(&blk.a[..nb * k]),
    }
    row_dots(&blk.f, &blk.a, k, nb, &mut blk.psi);
    for (psi, dsq) in blk.psi[..nb].iter_mut().zip(dsq.iter()) {
        *psi = (dsq.to_f64() - *psi).max(ctx.floor);
    }
}

impl<T: Real> Pass for OnlineEm<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    fn validate<X: Real>(&self, x: ArrayView2<X>) -> Result<()> {
        validate_batch::<T, X>(&x, self.n_features)
    }

    /// The pass writes only the previous sample's pending row-local step, now applied: until the K×K step the
    /// model is the one before `x` (another pass recomputes the same sums).
    fn pass_sums<X: Real>(&mut self, x: ArrayView1<X>) -> StepSums {
        let rates = self.step.rates();
        let mut scratch = Scratch::new(self.n_features, self.n_components);
        let mut sums = StepSums::zeros(self.n_components);
        self.pass_on(x, rates.rho, rates.mean_rho, &mut scratch, &mut sums, Some(self.isa));
        sums
    }

    fn drop_pending(&mut self) {
        self.step.drop_pending();
    }

    /// The K×K part of Algorithm 2 from the sums, with σ̂² = Σ d̄² / `n_total`.
    fn finish(&mut self, sums: &StepSums, n_total: usize) -> Result<()> {
        self.finish_step(sums, n_total)
    }
}

impl<T: Real> StreamingModel for OnlineEm<T> {}

/// A failed step needs no undo: the pass writes only what is the same model as before the sample — the previous
/// sample's pending θ̄, d̄² and Ā, now applied — plus the sample's innovation e in `d_last`, which only a pending
/// step reads. If the K×K step then fails, dropping the (consumed) pending step leaves the model exactly as it
/// was before the sample: same mean, loadings and noise variances, bit for bit, and the same future under the
/// same data. float32 state runs the kernels in float32 arithmetic, and a failed step is redone once with the
/// f64 block path before a breakdown is reported.
impl<T: Real> Driven for OnlineEm<T> {
    type Storage = T;
    type Reused = ();
    type RowUndo = ();
    const PRIVATE_ROWS: bool = false;
    const RETRY_IN_F64: bool = true;

    /// The fused pass (pending row-local step + E-step sums), then the K×K step.
    fn try_step<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        kernels: bool,
    ) -> Result<()> {
        let rates = self.step.rates();
        let isa = kernels.then_some(self.isa);
        self.pass_on(x, rates.rho, rates.mean_rho, scratch, sums, isa);
        self.finish_step(sums, self.n_features)
    }

    fn take_reused(&mut self) {}

    fn put_reused(&mut self, _: ()) {}

    fn row_copy(_: &mut ()) -> &mut Vec<f64> {
        unreachable!("online EM reads the caller's rows (PRIVATE_ROWS is false)")
    }

    fn prepare_undo(&mut self, _: &mut ()) {}

    fn undo_row(&mut self, _: (), _: &()) {}
}

mod checkpoint;
mod checks;
mod lane_rows;
mod rows;
mod step;

pub use step::{Basis, EmStep, Pending, Rates};
#[cfg(test)]
mod tests;
