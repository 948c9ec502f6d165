//! The online-SGA pass over one block of rows after warm-up (thesis Algorithm 1), fused into one loop and
//! vectorised across rows, for K ≤ 16.
//!
//! SGA's state is F and ψ themselves, so each row of the pass does, with the previous sample's m and
//! P = Σ + m mᵀ (K, K×K), its deviation d' (stored in `d_last`) and the learning rate α:
//!
//! ```text
//!   (F₀ σ, max(d̄², floor))          on the first pass of a data-scaled run only (the start)
//!   g  = f P                          (K² multiply-adds)
//!   ∇β = ½ ψ⁻¹ (d'² − 2 d' f·m + g·f) − ½                       (4.25, 4.26)
//!   f ← clip(f + α s (d' m − g)),     s = ψ⁻¹ (4.24), or 1 when preconditioned by ψ
//!   ψ ← clip(ψ · exp(clip(α ∇β)), floor, MAX_STATE)              (β = log ψ, lines 10–14)
//!   f ← clip(f, ±√(MAX_LOADING_RATIO · ψ)) with the new ψ         (Fᵀ Ψ⁻¹ F finite, see `sga_bounds`)
//!   whitened rule (`SgaRule::Whitened`): α is a_F, then f ← clip(f L) (K² multiply-adds, L lower
//!   triangular), and ψ ← clip(ψ + a (q − ψ), floor, MAX_STATE) with q = 2ψ ∇β + ψ instead of the exp
//!   θ̄ ← θ̄ + ρ (x − θ̄),   d = x − θ̄                              (lines 5, 6)
//!   S += f fᵀ / ψ   (upper triangle),   u += f d / ψ              (the sums of (4.23), K×K and K)
//! ```
//!
//! F and ψ are rounded to the storage type after their step, and the sums use the rounded values, exactly as
//! the model's queries see them. `overshoot` counts the rows whose ψ grew more than 10⁶-fold past both its
//! previous value and d'² (a diverged step, see `online_sga::overshooting_features`).
//!
//! **SIMD across rows.** W rows are processed at once (one 256-bit vector of lanes: W = 4 f64 / 8 f32), each
//! of the K columns held as a W-lane array, so every operation is lane-parallel over rows whatever K is. Per-lane minima, maxima and bounds are written as compare-and-select (with the NaN rule
//! of `f64::min`/`max` spelled out), so they vectorise like the rest.
//!
//! **Arithmetic type.** The per-row K-dimensional arithmetic (g = f P, f·m, g·f, the F step, y = f/ψ and the
//! sums S, u) runs in the storage type T, so float32 state does float32 arithmetic; the per-block partial sums
//! are added in f64. Rounding there is harmless: f·m and g·f enter ∇β as terms of the single-sample gradient,
//! whose sample-to-sample fluctuation is of the size of the terms themselves, so their relative rounding
//! error (≈ K·2⁻²⁴) is a ~10⁻⁶ perturbation of noise the stochastic step already carries. The per-row scalars
//! stay in f64: 1/ψ, ∇β (whose terms d'² − 2 d' f·m + g·f cancel when the fit is good), the exp and the ψ
//! step (ψ is rounded to T once, after the product ψ·exp), and, as everywhere in the crate, the running
//! mean θ̄ and d = x − θ̄ (computed in f64 and rounded to T). For float64 state every operation is the f64
//! operation it always was, in the same order.
//!
//! **Paths.** The same source is compiled for baseline x86-64 / any other target (portable) and with AVX2
//! enabled (which AVX-512 CPUs run too, see [`pick`]); [`SgaRowKernel::select`] picks one, once per model.
//! Every lane computes the same operations in the same order on every path, with the same W, and Rust never
//! contracts a·b + c into an FMA, so the paths agree bit for bit.

use crate::engine::sga_bounds::{loading_bound, MAX_LOG_PSI_STEP, MAX_PSI_OVERSHOOT};
use crate::scalar::{stored, Real};

use super::isa::Isa;
use super::lane_syrk::LaneSyrk;
use super::lane_times::{lanes_times, lanes_times_lower};
use super::lane_transpose::{self, transposes};
use super::prefetch::{Ahead, PREFETCH_GROUPS};

use super::k_dispatch::for_k;
pub(crate) use super::k_dispatch::MAX_K;

/// The pending gradient step of the previous sample: m (K) and P = Σ + m mᵀ (K×K row-major), and the
/// whitening factor L (K×K row-major, lower triangular) of the whitened rule.
#[derive(Debug, Clone)]
pub(crate) struct SgaStep<'a> {
    pub(crate) m: &'a [f64],
    pub(crate) p: &'a [f64],
    pub(crate) whiten: Option<&'a [f64]>,
}

/// The data-scaled start: F ← σ F₀, ψ ← max(d̄², floor) (ψ's storage holds the warm-up's d̄²), or, when the
/// warm-up had no scale at all (`degenerate`), F₀ kept and ψ ← 1.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub(crate) sigma: f64,
    pub(crate) degenerate: bool,
}

/// Per-pass constants of an SGA pass (row kernel and wide kernel alike).
#[derive(Debug, Clone)]
pub(crate) struct SgaConsts<'a> {
    pub(crate) step: Option<SgaStep<'a>>,
    pub(crate) start: Option<Start>,
    /// Learning rate α (the F step's a_F under the whitened rule), noise floor, running mean's step ρ.
    pub(crate) lr: f64,
    /// The natural ψ step's rate a (whitened rule), or `None` for the log-ψ step.
    pub(crate) psi_rate: Option<f64>,
    pub(crate) floor: f64,
    pub(crate) rho: f64,
    /// F step preconditioned by ψ (`Scaling::Data`).
    pub(crate) precondition: bool,
}

/// The state rows of one block (nb rows) and the block's outputs.
pub(crate) struct SgaBlockIo<'a, T> {
    /// F rows, nb×K row-major; ψ, θ̄, d_last (nb each). Updated in place; d_last gets this sample's d.
    pub(crate) f: &'a mut [T],
    pub(crate) psi: &'a mut [T],
    pub(crate) mean: &'a mut [T],
    pub(crate) d_last: &'a mut [T],
    /// This sample's values for the block's rows (nb), as f64.
    pub(crate) x: &'a [f64],
    /// Outputs, accumulated: the number of diverged ψ steps, u (K), S (K×K row-major, upper triangle only).
    pub(crate) overshoot: &'a mut f64,
    pub(crate) u: &'a mut [f64],
    pub(crate) s: &'a mut [f64],
}

/// Whether T's lanes use the residual form of the step (see [`step_lanes`]): float32 arithmetic.
pub(crate) const fn residual_form<T: Real>() -> bool {
    T::SINGLE
}

/// The pending step in the arithmetic type T: m (K, also as f64) and, for the residual form, Σ = P − m mᵀ
/// (formed in f64, then rounded), else P (K×K, p[i][j]).
struct StepT<T, const K: usize> {
    m: [T; K],
    m64: [f64; K],
    p: [[T; K]; K],
    /// L (l[i][j], lower triangular) of the whitened rule.
    l: Option<[[T; K]; K]>,
}

impl<T: Real, const K: usize> StepT<T, K> {
    fn new(step: &SgaStep<'_>) -> Self {
        let mut m = [T::default(); K];
        let mut p = [[T::default(); K]; K];
        let mut m64 = [0.0f64; K];
        m64.copy_from_slice(&step.m[..K]);
        for i in 0..K {
            m[i] = T::from_f64(m64[i]);
            for j in 0..K {
                let pij = step.p[i * K + j];
                p[i][j] = T::from_f64(if residual_form::<T>() {
                    pij - m64[i] * m64[j]
                } else {
                    pij
                });
            }
        }
        let l = step.whiten.map(|w| {
            let mut l = [[T::default(); K]; K];
            for i in 0..K {
                for j in 0..=i {
                    l[i][j] = T::from_f64(w[i * K + j]);
                }
            }
            l
        });
        StepT { m, m64, p, l }
    }
}

/// F and ψ of one row group after the start and the pending step: f[j][l] is column j of lane l (in T), ψ the
/// stored values as f64.
#[derive(Clone, Copy)]
struct Group<T, const K: usize, const W: usize> {
    f: [[T; W]; K],
    psi: [f64; W],
}

/// The block's per-lane partial sums: u (K lanes) and S (upper triangle, K×K lanes, through its kept terms).
struct LaneSums<T, const K: usize, const W: usize> {
    u: [[T; W]; K],
    /// S (upper triangle) with the kept f and y = f/ψ lanes of the last groups (z = f in [`LaneSyrk`]).
    syrk: LaneSyrk<T, K, W>,
}

/// `v.min(hi)` as a compare and select (NaN gives `hi`, as `f64::min` does).
#[inline(always)]
fn min_of<T: PartialOrd>(v: T, hi: T) -> T {
    if v < hi {
        v
    } else {
        hi
    }
}

/// `v.max(lo)` as a compare and select (NaN gives `lo`, as `f64::max` does).
#[inline(always)]
fn max_of<T: PartialOrd>(v: T, lo: T) -> T {
    if v > lo {
        v
    } else {
        lo
    }
}

/// `online_sga::bounded` (v kept in [lo, hi], NaN sent to hi) as compares and selects.
#[inline(always)]
pub(crate) fn bounded_lane<T: PartialOrd>(v: T, lo: T, hi: T) -> T {
    max_of(min_of(v, hi), lo)
}

/// `online_sga::log_psi_step` as compares and selects: `clamp` (NaN stays NaN) or `min(700)` (NaN gives 700).
#[inline(always)]
fn log_psi_step_lane(v: f64, precondition: bool) -> f64 {
    if precondition {
        let v = if v < -MAX_LOG_PSI_STEP { -MAX_LOG_PSI_STEP } else { v };
        if v > MAX_LOG_PSI_STEP {
            MAX_LOG_PSI_STEP
        } else {
            v
        }
    } else {
        min_of(v, 700.0)
    }
}

/// The start, in place on the lanes (in f64, rounded to T).
#[inline(always)]
fn start_lanes<T: Real, const K: usize, const W: usize>(g: &mut Group<T, K, W>, start: Start, floor: f64) {
    if start.degenerate {
        g.psi = [1.0; W];
        return;
    }
    for col in g.f.iter_mut() {
        for v in col.iter_mut() {
            *v = T::from_f64(v.to_f64() * start.sigma);
        }
    }
    for v in g.psi.iter_mut() {
        *v = stored::<T>(max_of(*v, floor)).1;
    }
}

/// Lines 10–14 of Algorithm 1 on the lanes (see the module documentation), rounded to T; returns the number
/// of the first `n` lanes whose ψ step diverged. `d` is d' as stored (T, and as f64).
///
/// float64 lanes compute g = f P, q = d'² − 2 d' f·m + g·f and the F step's d' m − g as written in the module
/// documentation. float32 lanes use the same quantities in residual form: with Σ = P − m mᵀ, r = d' − f·m,
/// g = f Σ + (f·m) m gives q = r² + (f Σ)·f and d' m − g = r m − f Σ. In a good fit d' ≈ f·m, and the
/// first form subtracts terms of size |d'||m| to get a step of size |r||m|: in float32 that cancellation
/// costs K·2⁻²⁴·|d'||m| per step (measured: F 70× further from the float64 model than float32 storage
/// alone puts it). In the residual form only r = d' − f·m cancels, and it is computed in f64 (f·m summed in
/// f64, K multiply-adds), so every float32 term is of the size of the result.
#[inline(always)]
fn step_lanes<T: Real, const K: usize, const W: usize>(
    g: &mut Group<T, K, W>,
    d: (&[T; W], &[f64; W]),
    st: &StepT<T, K>,
    c: &SgaConsts<'_>,
    n: usize,
) -> usize {
    let zero = T::default();
    let (dt, d) = d;
    // g = f P (or f Σ): gp_j = Σ_i f_i P[i][j], i ascending.
    let fp = lanes_times::<T, K, W>(&g.f, st.p.as_flattened());
    // q (f64) and the vector the F step multiplies by m: d' (f64 form) or r (residual form).
    let mut q = [0.0f64; W];
    let mut coef = *dt;
    if residual_form::<T>() {
        // Two separate loops: one in T, one in f64 (mixed in one loop, LLVM vectorised neither cleanly).
        let mut fs_f = [zero; W];
        for j in 0..K {
            for l in 0..W {
                fs_f[l] = fs_f[l] + fp[j][l] * g.f[j][l];
            }
        }
        let mut f_m = [0.0f64; W];
        for j in 0..K {
            for l in 0..W {
                f_m[l] += g.f[j][l].to_f64() * st.m64[j];
            }
        }
        for l in 0..W {
            let r = d[l] - f_m[l];
            q[l] = r * r + fs_f[l].to_f64();
            coef[l] = T::from_f64(r);
        }
    } else {
        let mut f_m = [zero; W];
        let mut fp_f = [zero; W];
        for j in 0..K {
            for l in 0..W {
                f_m[l] = f_m[l] + g.f[j][l] * st.m[j];
                fp_f[l] = fp_f[l] + fp[j][l] * g.f[j][l];
            }
        }
        for l in 0..W {
            let dl = d[l];
            q[l] = dl * dl - 2.0 * dl * f_m[l].to_f64() + fp_f[l].to_f64();
        }
    }
    // Per-lane scalars in f64 (see the module documentation): 1/ψ, α ∇β bounded (`log_psi_step`), and the
    // F step's scale: ψ⁻¹ (4.24), or 1 when preconditioned (ψ ⊙ ∇F = d mᵀ − F P).
    let mut inv_psi = [0.0f64; W];
    let mut log_step = [0.0f64; W];
    for l in 0..W {
        inv_psi[l] = 1.0 / g.psi[l];
        log_step[l] = log_psi_step_lane(c.lr * (0.5 * inv_psi[l] * q[l] - 0.5), c.precondition);
    }
    let mut scale = [T::from_f64(1.0); W];
    if !c.precondition {
        for l in 0..W {
            scale[l] = T::from_f64(inv_psi[l]);
        }
    }
    let (lr, lo, hi) = (T::from_f64(c.lr), T::from_f64(-T::MAX_STATE), T::from_f64(T::MAX_STATE));
    for j in 0..K {
        for l in 0..W {
            let grad_f = scale[l] * (coef[l] * st.m[j] - fp[j][l]);
            g.f[j][l] = bounded_lane(g.f[j][l] + lr * grad_f, lo, hi);
        }
    }
    if let Some(lw) = &st.l {
        whiten_lanes(&mut g.f, lw, lo, hi);
    }
    let new_psi = match c.psi_rate {
        // ψ + a (q − ψ), in f64.
        Some(a) => {
            let mut v = [0.0f64; W];
            for l in 0..W {
                v[l] = g.psi[l] + a * (q[l] - g.psi[l]);
            }
            v
        }
        None => {
            let growth = exp_lanes(log_step);
            let mut v = [0.0f64; W];
            for l in 0..W {
                v[l] = g.psi[l] * growth[l];
            }
            v
        }
    };
    let mut overshoot = 0;
    for l in 0..W {
        let old = g.psi[l];
        g.psi[l] = stored::<T>(bounded_lane(new_psi[l], c.floor, T::MAX_STATE)).1;
        // old.max(d²) with f64::max's rule (d² is never NaN: d is a stored, validated deviation).
        let dd = d[l] * d[l];
        let reach = if dd > old { dd } else { old };
        // The natural step ψ + a (q − ψ) lies between ψ and q ≥ 0: it cannot diverge, so it is not checked.
        overshoot += usize::from(l < n && c.psi_rate.is_none() && g.psi[l] > MAX_PSI_OVERSHOOT * reach);
    }
    // f ← clip(f, ±min(MAX_STATE, √(MAX_LOADING_RATIO · ψ))) with the new ψ: Fᵀ Ψ⁻¹ F stays finite.
    for l in 0..W {
        let bound = loading_bound::<T>(g.psi[l]);
        let (lo, hi) = (T::from_f64(-bound), T::from_f64(bound));
        for fj in g.f.iter_mut() {
            fj[l] = bounded_lane(fj[l], lo, hi);
        }
    }
    overshoot
}

/// f ← clip(f L) on the lanes (the whitened rule; L lower triangular): new f_j = Σ_{i ≥ j} f_i L[i][j], i
/// ascending.
#[inline(always)]
fn whiten_lanes<T: Real, const K: usize, const W: usize>(f: &mut [[T; W]; K], l: &[[T; K]; K], lo: T, hi: T) {
    let out = lanes_times_lower::<T, K, W>(f, l.as_flattened());
    for j in 0..K {
        for v in 0..W {
            f[j][v] = bounded_lane(out[j][v], lo, hi);
        }
    }
}

/// e^x on every lane, in lane-parallel operations only (no calls, so it vectorises like the rest of the
/// kernel): x = n ln 2 + r with |r| ≤ ½ ln 2 (Cody–Waite, ln 2 split in a high part with 21 trailing zero bits
/// and a low part, so n·ln2_hi is exact), e^r by its Taylor series to r¹³ (truncation below 10⁻¹⁷ relative)
/// evaluated by Estrin's scheme,
/// and 2ⁿ applied as two exact power-of-two factors so that a subnormal result is rounded once. Within a few ulp
/// of the correctly rounded value (tested against `f64::exp`); NaN stays NaN, x ≤ −746 gives 0 and
/// x ≥ 709 gives e^709 (callers pass x ≤ 700: see `log_psi_step`).
#[inline(always)]
pub(crate) fn exp_lanes<const W: usize>(x: [f64; W]) -> [f64; W] {
    use crate::lane_math::{LN2_HI, LN2_LO};
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // Adding and subtracting 1.5·2⁵² rounds to the nearest integer (ties to even) for |v| < 2⁵¹.
    const ROUND: f64 = 6_755_399_441_055_744.0;
    // 2⁵² + 1023: (n + BIAS).to_bits() << 52 is the bit pattern of 2ⁿ for −1022 ≤ n ≤ 1023.
    const BIAS: f64 = 4_503_599_627_371_519.0;
    // c_j = 1/j! for j = 0, 1, …, 13.
    const C: [f64; 14] = [
        1.0,
        1.0,
        0.5,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5_040.0,
        1.0 / 40_320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
        1.0 / 6_227_020_800.0,
    ];
    // One stage at a time over the lanes, so each loop is a vector operation.
    let mut n = [0.0f64; W];
    let mut r = [0.0f64; W];
    for l in 0..W {
        // x.max(−746).min(709) as selects (NaN gives −746 here; it is restored at the end).
        let xc = min_of(max_of(x[l], -746.0), 709.0);
        n[l] = (xc * LOG2E + ROUND) - ROUND;
        r[l] = (xc - n[l] * LN2_HI) - n[l] * LN2_LO;
    }
    // Σ c_j r^j by Estrin's scheme (pairs, then powers r², r⁴, r⁸): 8 dependent operations instead of Horner's
    // 26, which would make the polynomial's latency the kernel's bottleneck.
    let mut p = [0.0f64; W];
    for l in 0..W {
        let r1 = r[l];
        let r2 = r1 * r1;
        let r4 = r2 * r2;
        let r8 = r4 * r4;
        let q = |j: usize| C[j] + C[j + 1] * r1;
        let s0 = q(0) + q(2) * r2;
        let s1 = q(4) + q(6) * r2;
        let s2 = q(8) + q(10) * r2;
        let s3 = q(12);
        p[l] = (s0 + s1 * r4) + (s2 + s3 * r4) * r8;
    }
    let mut out = [0.0f64; W];
    for l in 0..W {
        let n1 = (n[l] * 0.5 + ROUND) - ROUND;
        let n2 = n[l] - n1;
        let s1 = f64::from_bits((n1 + BIAS).to_bits() << 52);
        let s2 = f64::from_bits((n2 + BIAS).to_bits() << 52);
        // NaN in, NaN out: all-ones bits (a NaN) or'ed in on NaN lanes, as arithmetic rather than a select,
        // which LLVM turned into a branch around the whole polynomial (scalarising it).
        let nan = 0u64.wrapping_sub(u64::from(x[l].is_nan()));
        out[l] = f64::from_bits(((p[l] * s1) * s2).to_bits() | nan);
    }
    out
}

/// One group of rows r0..r0 + n (n ≤ W; lanes n.. are zero rows: f = 0, ψ = 1, d = 0, which add exactly zero
/// to every sum). Inlined twice by [`sga_block`], with n = W a constant for the full groups. Returns the
/// number of diverged ψ steps.
#[inline(always)]
fn sga_group<T: Real, const K: usize, const W: usize, const GATHER: bool, const AVX: bool>(
    c: &SgaConsts<'_>,
    st: Option<&StepT<T, K>>,
    io: &mut SgaBlockIo<'_, T>,
    r0: usize,
    n: usize,
    acc: &mut LaneSums<T, K, W>,
) -> usize {
    let zero = T::default();
    let mut g = Group::<T, K, W> {
        f: [[zero; W]; K],
        psi: [1.0; W],
    };
    // The group's rows as slices of length n (W for full groups, so every index below is in bounds at
    // compile time); full groups are moved into lanes by `load_columns`, the last one value by value.
    let f_rows = &mut io.f[r0 * K..(r0 + n) * K];
    let (psi_rows, d_last_rows) = (&mut io.psi[r0..r0 + n], &mut io.d_last[r0..r0 + n]);
    let (mean_rows, x_rows) = (&mut io.mean[r0..r0 + n], &io.x[r0..r0 + n]);
    let mut d_prev = [zero; W];
    if n == W {
        if AVX && transposes::<T, K, W>() {
            // SAFETY: AVX is set only on the AVX2 code (see `pick`), which runs on CPUs with AVX2.
            unsafe { lane_transpose::load_columns::<T, K, W, AVX>(f_rows, &mut g.f) };
        } else {
            // SAFETY: GATHER is set only for CPUs with AVX-512 (so AVX2 as well), see `SgaRowKernel::select`.
            unsafe { super::lane_gather::load_columns::<T, K, W, GATHER>(f_rows, &mut g.f) };
        }
    }
    for l in 0..n {
        if n < W {
            for j in 0..K {
                g.f[j][l] = f_rows[l * K + j];
            }
        }
        g.psi[l] = psi_rows[l].to_f64();
        d_prev[l] = d_last_rows[l];
    }
    if let Some(start) = c.start {
        start_lanes::<T, K, W>(&mut g, start, c.floor);
    }
    let mut overshoot = 0;
    if let Some(st) = st {
        let d64 = d_prev.map(|v| v.to_f64());
        overshoot = step_lanes::<T, K, W>(&mut g, (&d_prev, &d64), st, c, n);
    }
    if st.is_some() || c.start.is_some() {
        if n == W {
            // SAFETY: as for the load above.
            unsafe { lane_transpose::store_columns::<T, K, W, AVX>(&g.f, f_rows) };
        } else {
            for l in 0..n {
                for j in 0..K {
                    f_rows[l * K + j] = g.f[j][l];
                }
            }
        }
        for l in 0..n {
            psi_rows[l] = T::from_f64(g.psi[l]);
        }
    }
    // Lines 5, 6: θ̄_t and d_t = x_t − θ̄_t in f64, stored rounded; the sums use the stored d.
    let mut x = [0.0f64; W];
    let mut m0 = [0.0f64; W];
    for l in 0..n {
        x[l] = x_rows[l];
        m0[l] = mean_rows[l].to_f64();
    }
    let mut mean_s = [zero; W];
    let mut d = [zero; W];
    for l in 0..W {
        let (ms, m1) = stored::<T>(m0[l] + c.rho * (x[l] - m0[l]));
        mean_s[l] = ms;
        d[l] = T::from_f64(x[l] - m1);
    }
    mean_rows.copy_from_slice(&mean_s[..n]);
    d_last_rows.copy_from_slice(&d[..n]);
    // The sums of (4.23): y = f/ψ, u += y d, S += y fᵀ (upper triangle).
    let mut inv_psi = [zero; W];
    for l in 0..W {
        inv_psi[l] = T::from_f64(1.0 / g.psi[l]);
    }
    // S's terms are kept and added tile by tile when the chunk is full (`LaneSyrk::flush`), in group order.
    let slot = acc.syrk.kept;
    for i in 0..K {
        let mut y = [zero; W];
        for l in 0..W {
            y[l] = g.f[i][l] * inv_psi[l];
            acc.u[i][l] = acc.u[i][l] + y[l] * d[l];
        }
        acc.syrk.y[slot][i] = y;
        acc.syrk.z[slot][i] = g.f[i];
    }
    acc.syrk.kept += 1;
    overshoot
}

/// The block: groups of W rows, the last one padded (see [`sga_group`]); the per-lane partial sums in T,
/// added to the f64 totals lane by lane at the end.
#[inline(always)]
fn sga_block<T: Real, const K: usize, const W: usize, const GATHER: bool, const AVX: bool>(
    c: &SgaConsts<'_>,
    io: &mut SgaBlockIo<'_, T>,
    nb: usize,
) {
    let zero = T::default();
    let st = c.step.as_ref().map(StepT::<T, K>::new);
    let mut acc = LaneSums::<T, K, W> {
        u: [[zero; W]; K],
        syrk: LaneSyrk::new(),
    };
    let mut overshoot = 0usize;
    let full = nb / W * W;
    let ahead = Ahead::new(io.f, [io.psi, io.mean, io.d_last], io.x, W * PREFETCH_GROUPS, full);
    let mut r0 = 0;
    while r0 < nb {
        ahead.prefetch(r0, W, K);
        if nb - r0 >= W {
            overshoot += sga_group::<T, K, W, GATHER, AVX>(c, st.as_ref(), io, r0, W, &mut acc);
        } else {
            overshoot += sga_group::<T, K, W, GATHER, AVX>(c, st.as_ref(), io, r0, nb - r0, &mut acc);
        }
        acc.syrk.flush_if_full();
        r0 += W;
    }
    acc.syrk.flush();
    let lanes = |v: &[T; W]| v.iter().fold(0.0f64, |acc, x| acc + x.to_f64());
    for i in 0..K {
        io.u[i] += lanes(&acc.u[i]);
        for j in i..K {
            io.s[i * K + j] += lanes(&acc.syrk.s[i][j]);
        }
    }
    *io.overshoot += overshoot as f64;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sga_block_avx2<T: Real, const K: usize, const W: usize, const GATHER: bool>(
    c: &SgaConsts<'_>,
    io: &mut SgaBlockIo<'_, T>,
    nb: usize,
) {
    sga_block::<T, K, W, GATHER, true>(c, io, nb)
}

fn sga_block_portable<T: Real, const K: usize, const W: usize>(
    c: &SgaConsts<'_>,
    io: &mut SgaBlockIo<'_, T>,
    nb: usize,
) {
    sga_block::<T, K, W, false, false>(c, io, nb)
}

/// The AVX2 code: rows moved into lanes and back by in-register transposes where K has a whole tile
/// (`lane_transpose`), else gathered when `GATHER` (see `lane_gather`; for CPUs with AVX-512).
#[cfg(target_arch = "x86_64")]
fn sga_block_avx2_entry<T: Real, const K: usize, const W: usize, const GATHER: bool>(
    c: &SgaConsts<'_>,
    io: &mut SgaBlockIo<'_, T>,
    nb: usize,
) {
    // SAFETY: this function is only handed out by `SgaRowKernel::select` with `Isa::Avx2` or `Isa::Avx512`,
    // which `Isa::available` constructs only after `is_x86_feature_detected!("avx2")`, and with GATHER only
    // for `Isa::Avx512`, constructed only after detecting avx512f as well.
    unsafe { sga_block_avx2::<T, K, W, GATHER>(c, io, nb) }
}

/// One block of the SGA pass: (constants, rows, number of rows).
type BlockFn<T> = for<'a, 'b, 'c> fn(&'a SgaConsts<'b>, &'a mut SgaBlockIo<'c, T>, usize);

/// The row kernel for one K and one code path, resolved once (when the model is built) to a plain function.
#[derive(Clone, Copy)]
pub(crate) struct SgaRowKernel<T: Real> {
    run: BlockFn<T>,
    isa: Isa,
}

impl<T: Real> std::fmt::Debug for SgaRowKernel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SgaRowKernel({:?})", self.isa)
    }
}

/// The block function for K = `$kk` (a const of [`for_k`]) on `isa`: 4 f64 / 8 f32 lanes (one 256-bit vector)
/// on every path, so all paths agree bit for bit. AVX-512 CPUs run the AVX2 build (with the rows gathered into
/// lanes where K has no whole transpose tile): the same source compiled for avx512f (8 f64 / 8 or 16 f32 lanes)
/// is slower, its time going to the masked gathers, scatters and 256/512-bit lane inserts LLVM generates for the
/// row-to-lane transposition and the lane loops (docs/performance.md, "Why the kernels are chosen as they are").
macro_rules! pick {
    ($isa:expr, $kk:ident) => {
        match ($isa, T::SINGLE) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, true) => sga_block_avx2_entry::<T, $kk, 8, true> as BlockFn<T>,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, false) => sga_block_avx2_entry::<T, $kk, 4, true> as BlockFn<T>,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, true) => sga_block_avx2_entry::<T, $kk, 8, false> as BlockFn<T>,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, false) => sga_block_avx2_entry::<T, $kk, 4, false> as BlockFn<T>,
            (Isa::Portable, true) => sga_block_portable::<T, $kk, 8> as BlockFn<T>,
            (Isa::Portable, false) => sga_block_portable::<T, $kk, 4> as BlockFn<T>,
        }
    };
}

impl<T: Real> SgaRowKernel<T> {
    /// The kernel for K = `k` on code path `isa`; None when K > [`MAX_K`].
    pub(crate) fn select(k: usize, isa: Isa) -> Option<Self> {
        if k > MAX_K {
            return None;
        }
        let run = for_k!(k, K => pick!(isa, K), _ => return None);
        Some(SgaRowKernel { run, isa })
    }

    /// Run the pass on the `nb` rows of `io`.
    #[inline]
    pub(crate) fn run(&self, c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, nb: usize) {
        (self.run)(c, io, nb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_lanes_matches_libm() {
        // Within 2 ulp of f64::exp over the whole range the kernel uses, including subnormal results.
        let mut worst = 0.0f64;
        let mut x = -745.0;
        while x < 700.0 {
            let lanes = exp_lanes([x, x * 1e-3, -x * 1e-7, x + 0.3]);
            for (&got, v) in lanes.iter().zip([x, x * 1e-3, -x * 1e-7, x + 0.3]) {
                let want = v.exp();
                if want > f64::MIN_POSITIVE {
                    worst = worst.max((got - want).abs() / want);
                } else {
                    assert!((got - want).abs() <= 2.0 * 4.9e-324, "x = {v}: {got} vs {want}");
                }
            }
            x += 0.0137;
        }
        assert!(worst <= 2.0 * f64::EPSILON, "worst relative error {worst:e}");
        let special = exp_lanes([f64::NAN, f64::NEG_INFINITY, -800.0, 0.0]);
        assert!(special[0].is_nan());
        assert_eq!(&special[1..], &[0.0, 0.0, 1.0]);
    }

    #[test]
    fn lane_bounds_follow_f64_min_max() {
        // The compare-and-select forms give what `bounded` and `log_psi_step` give, NaN and infinities included.
        use crate::engine::sga_bounds::{bounded, log_psi_step};
        let values = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -2.0,
            -1.0,
            -0.5,
            0.0,
            -0.0,
            0.5,
            1.0,
            3.0,
            701.0,
        ];
        for &v in &values {
            for (lo, hi) in [(-1e150, 1e150), (1e-10, 1e18), (0.25, 2.0)] {
                assert_eq!(bounded_lane(v, lo, hi).to_bits(), bounded(v, lo, hi).to_bits(), "{v}");
            }
            for pre in [false, true] {
                let (a, b) = (log_psi_step_lane(v, pre), log_psi_step(v, pre));
                assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{v} {pre}");
            }
            assert_eq!(max_of(v, 0.5).to_bits(), v.max(0.5).to_bits(), "{v}");
        }
    }
}
