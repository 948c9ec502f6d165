//! The bounds every online-SGA step keeps ψ inside, shared by the row kernels (`sga_kernel`, `sga_wide`) and
//! the model's scalar paths (`online_sga`).

use crate::scalar::Real;

/// Growth factor of ψ_d in one step, beyond both its previous value and the step's squared deviation d², that no
/// convergent run reaches. The step is ψ_new = ψ_old · exp(α ∇β) with ∇β ≈ ½ (r / ψ_old − 1) and r the
/// sample's squared residual, whose fixed point is ψ = E[r]; for data whose variance is many orders above ψ_old
/// (badly scaled features under unit scaling with a fixed α) the exponent is in the hundreds and ψ jumps far
/// past every scale of the data (to 10¹⁴⁹ in a fuzz), after which F and ψ never return. A convergent step
/// moves log ψ by O(α · r/ψ), far from ln 10⁶ ≈ 13.8 beyond ln(r/ψ); data scaling bounds the step to ±1 and
/// never meets the test. The engine's kernels count the features with ψ_new > 10⁶ · max(ψ_old, d²).
pub(crate) const MAX_PSI_OVERSHOOT: f64 = 1e6;

/// `v` kept inside [lo, hi], with NaN (an overflowing step: ∞ − ∞ in the gradient) sent to `hi`, so that
/// a divergent step leaves a finite (if useless) state instead of poisoning every later query.
#[inline(always)]
pub(crate) fn bounded(v: f64, lo: f64, hi: f64) -> f64 {
    // f64::min/max return the non-NaN operand: NaN.min(hi) = hi.
    v.min(hi).max(lo)
}

/// Largest change of log ψ in one data-scaled step: ψ moves by at most a factor e per sample.
pub(crate) const MAX_LOG_PSI_STEP: f64 = 1.0;

/// The step α ∇β applied to β = log ψ. Unit scaling (Algorithm 1) only caps it at 700 so exp stays finite.
/// Data scaling (`precondition`) bounds it to ±[`MAX_LOG_PSI_STEP`]: a feature whose warm-up variance was
/// zero starts at the floor, and its first non-zero deviation has d²/ψ up to 1e10, a step that would throw
/// ψ to the ceiling where the gradient (→ −½) can never bring it back. A stable run, where α ∇β is of order
/// α, never meets the bound.
#[inline(always)]
pub(crate) fn log_psi_step(step: f64, precondition: bool) -> f64 {
    if precondition {
        step.clamp(-MAX_LOG_PSI_STEP, MAX_LOG_PSI_STEP)
    } else {
        step.min(700.0)
    }
}

/// Largest f_j² / ψ an SGA step leaves in a row. F and ψ kept inside their own bounds (±`MAX_STATE`,
/// [floor, `MAX_STATE`]) can still hold loadings far above their noise: in float64, (10¹⁵⁰)² / 10⁻²⁰⁰ = 10⁵⁰⁰,
/// so Fᵀ Ψ⁻¹ F, which the queries and the next E-step form, overflows (an outlier of 10⁹⁸ after rows of 10⁻⁵⁶
/// under a constant step of 1 did it: F = 2·10¹⁴² with ψ = 5·10⁻⁴³). With f_j² ≤ 10²⁰⁰ ψ every entry of
/// Fᵀ Ψ⁻¹ F is below D · 10²⁰⁰. Float32 never meets the bound (ψ ≥ 10⁻³⁰ gives √(10¹⁷⁰) far above its
/// `MAX_STATE` of 10¹⁸), nor does any state of a convergent run.
pub(crate) const MAX_LOADING_RATIO: f64 = 1e200;

/// The bound of |f_j| in a row whose (stepped, stored) noise variance is `psi`:
/// min(`MAX_STATE`, √(`MAX_LOADING_RATIO` · ψ)).
#[inline(always)]
pub(crate) fn loading_bound<T: Real>(psi: f64) -> f64 {
    let bound = (MAX_LOADING_RATIO * psi).sqrt();
    if bound < T::MAX_STATE {
        bound
    } else {
        T::MAX_STATE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loading_bound_keeps_the_gram_terms_finite_and_float32_at_its_own_ceiling() {
        // float64 at its smallest floor: |f| ≤ 1, so f² / ψ = 1e200 at most (was (1e150)² / 1e-200 = 1e500).
        let tiny = <f64 as Real>::MIN_FLOOR;
        assert_eq!(loading_bound::<f64>(tiny), (MAX_LOADING_RATIO * tiny).sqrt());
        assert!(loading_bound::<f64>(tiny).powi(2) / tiny <= MAX_LOADING_RATIO * (1.0 + 1e-15));
        // a large ψ: MAX_STATE binds first
        assert_eq!(loading_bound::<f64>(1e120), <f64 as Real>::MAX_STATE);
        // float32: its floor already keeps f² / ψ ≤ (1e18)² / 1e-30 = 1e66, the bound is its MAX_STATE
        for psi in [<f32 as Real>::MIN_FLOOR, 1.0, 1e18] {
            assert_eq!(loading_bound::<f32>(psi), <f32 as Real>::MAX_STATE);
        }
    }
}
