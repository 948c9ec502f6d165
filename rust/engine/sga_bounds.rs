//! The bounds every online-SGA step keeps ψ inside, shared by the row kernels (`sga_kernel`, `sga_wide`) and
//! the model's scalar paths (`online_sga`).

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
