//! The optimiser rules (Algorithm 3, lines 17–19: SGD or Adam), per-group gradient clipping, and the fused
//! update of one task's rows (gradient, update, B of the new rows).

use ndarray::Array2;

use super::config::{ADAM_BETA1, ADAM_BETA2};
use super::gradient::{accumulate_gram, block_gradients, GradCtx, Scratch};
use super::lanes::{adam, adam_column, sgd, sgd_column, RuleT};
use super::params::RowsMut;
use super::products::mirror_upper;
use super::BLOCK_ROWS;
use crate::engine::isa::Isa;
use crate::scalar::Real;

/// Learning rates η, clipping factors and Adam's bias corrections of one step (per group c, F, β).
pub(crate) struct UpdateRule {
    pub(crate) lr: [f64; 3],
    pub(crate) scale: [f64; 3],
    /// η / (1 − β₁ᵗ): Adam's step on m (m̂ = m / (1 − β₁ᵗ)).
    pub(crate) adam_lr: [f64; 3],
    /// 1 / √(1 − β₂ᵗ): √v̂ = √v / √(1 − β₂ᵗ).
    pub(crate) inv_sqrt_bias2: f64,
}

impl UpdateRule {
    /// The rule of step t (t ≥ 1).
    pub(super) fn new(lr: [f64; 3], scale: [f64; 3], t: u64) -> Self {
        let bias1 = 1.0 - ADAM_BETA1.powf(t as f64);
        let bias2 = 1.0 - ADAM_BETA2.powf(t as f64);
        UpdateRule {
            lr,
            scale,
            adam_lr: lr.map(|eta| eta / bias1),
            inv_sqrt_bias2: 1.0 / bias2.sqrt(),
        }
    }
}

/// Per-group factor min(1, max / ‖g‖).
pub(super) fn clip_scales(sq_norms: [f64; 3], max: f64) -> [f64; 3] {
    sq_norms.map(|sq| {
        let norm = sq.sqrt();
        if norm > max {
            max / norm
        } else {
            1.0
        }
    })
}

/// One task's rows of the parameters and (for Adam) of the two moment estimates.
pub(super) struct StepTask<'a, T> {
    pub(super) lo: usize,
    pub(super) p: RowsMut<'a, T>,
    /// ψ^{1/2} of the rows (the state's cache), rewritten from the new β.
    pub(super) sqrt_psi: &'a mut [f64],
    pub(super) m: Option<(RowsMut<'a, T>, RowsMut<'a, T>)>,
}

/// Largest |β| a step may produce: ψ = exp β stays within [1e-304, 1e304]; beyond it the model has
/// diverged (ψ would overflow, or Ψ⁻¹ F would).
pub(super) const LOG_NOISE_LIMIT: f64 = 700.0;

/// Lines 17–19 for one parameter group's rows (`group`: 0 c, 1 F, 2 β): with g = scale · grad,
/// SGD p ← p − η g, or Adam (moments `m`, `v` updated in place) p ← p − η m̂ / (√v̂ + ε). New values are
/// rounded to the storage type and written to `stored_vals` and (as used) `vals`. Returns whether all
/// new values are finite.
#[inline(always)]
pub(super) fn apply_group<T: Real>(
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
                let (new_s, new) = sgd::<T>(*p, *g, lr, scale);
                finite &= new.is_finite();
                *p_s = new_s;
                *p = new;
            }
        }
        Some((first, second)) => {
            for (((p_s, p), g), (m, v)) in params.zip(first.iter_mut().zip(second.iter_mut())) {
                let (new_s, new) = adam::<T>(*p, *g, m, v, rule.adam_lr[group], scale, rule.inv_sqrt_bias2);
                finite &= new.is_finite();
                *p_s = new_s;
                *p = new;
            }
        }
    }
    finite
}

/// Lines 17–19 for F's rows in the arithmetic of the storage type T, as the fused kernels do: each gradient is
/// rounded to T and the rule ([`sgd_column`], [`adam_column`], one value at a time in a loop the compiler
/// vectorises) runs in T. For float64 state these are the operations of [`apply_group`], in the same order (bit
/// for bit); float32 state does float32 arithmetic. Writes the new values to `stored_vals` and (as f64) `vals`;
/// returns whether all are finite.
#[inline(always)]
pub(super) fn apply_loadings<T: Real>(
    stored_vals: &mut [T],
    vals: &mut [f64],
    grads: &[f64],
    rule: &UpdateRule,
    moments: Option<(&mut [T], &mut [T])>,
) -> bool {
    let rule_t = RuleT::<T>::new(rule.lr[1], rule.adam_lr[1], rule.scale[1], rule.inv_sqrt_bias2);
    let mut finite = true;
    let params = stored_vals.iter_mut().zip(vals.iter_mut()).zip(grads);
    match moments {
        None => {
            for ((p_s, p), &g) in params {
                let [new] = sgd_column(&[*p_s], &[T::from_f64(g)], &rule_t);
                finite &= new.to_f64().is_finite();
                (*p_s, *p) = (new, new.to_f64());
            }
        }
        Some((first, second)) => {
            for (((p_s, p), &g), (m, v)) in params.zip(first.iter_mut().zip(second.iter_mut())) {
                let (mut m1, mut v1) = ([*m], [*v]);
                let [new] = adam_column(&[*p_s], &[T::from_f64(g)], &mut m1, &mut v1, &rule_t);
                (*m, *v) = (m1[0], v1[0]);
                finite &= new.to_f64().is_finite();
                (*p_s, *p) = (new, new.to_f64());
            }
        }
    }
    finite
}

/// Apply the update to one task's rows block by block, then accumulate B of the new (stored) rows.
/// Returns this task's share of B and whether every new value is finite (and |β| ≤ 700).
///
/// The row-local loops are compiled for AVX2 when the products run on the FMA path (same operations in the
/// same order: Rust never contracts a·b + c, so both builds give the same bits).
pub(super) fn update_task<T: Real, X: Real>(
    task: StepTask<T>,
    ctx: &GradCtx<X>,
    rule: &UpdateRule,
    isa: Isa,
) -> (Array2<f64>, bool) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512 => unsafe { update_task_avx2(task, ctx, rule, isa) },
        Isa::Portable => update_task_with(task, ctx, rule, isa),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn update_task_avx2<T: Real, X: Real>(
    task: StepTask<T>,
    ctx: &GradCtx<X>,
    rule: &UpdateRule,
    isa: Isa,
) -> (Array2<f64>, bool) {
    update_task_with(task, ctx, rule, isa)
}

#[inline(always)]
fn update_task_with<T: Real, X: Real>(
    task: StepTask<T>,
    ctx: &GradCtx<X>,
    rule: &UpdateRule,
    isa: Isa,
) -> (Array2<f64>, bool) {
    let k = ctx.k;
    let StepTask { lo, p, sqrt_psi, mut m } = task;
    let n = p.c.len();
    let mut s = Scratch::new::<T>(k, isa);
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
        finite &= apply_loadings(f, &mut s.f[..nb * k], &s.grad_f[..nb * k], rule, m_f);
        finite &= apply_group(beta, &mut s.beta[..nb], &s.grad_b[..nb], 2, rule, m_b);
        finite &= s.beta[..nb].iter().all(|b| b.abs() <= LOG_NOISE_LIMIT);
        // Line 11 for the next step: B += Aᵀ F over the rows just written (as stored).
        accumulate_gram(&mut s, nb, &mut gram);
        sqrt_psi[b0..b0 + nb].copy_from_slice(&s.sqrt_psi[..nb]);
    }
    mirror_upper(k, gram.as_slice_mut().expect("gram is allocated contiguous"));
    (gram, finite)
}
