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
//!   θ̄ ← θ̄ + ρ (x − θ̄),   d = x − θ̄                              (lines 5, 6)
//!   S += f fᵀ / ψ   (upper triangle),   u += f d / ψ              (the sums of (4.23), K×K and K)
//! ```
//!
//! F and ψ are rounded to the storage type after their step, and the sums use the rounded values, exactly as
//! the model's queries see them. `overshoot` counts the rows whose ψ grew more than 10⁶-fold past both its
//! previous value and d'² (a diverged step, see `online_sga::overshooting_features`).
//!
//! **SIMD across rows.** W = 4 rows are processed at once, each of the K columns held as a W-lane array, so
//! every operation is lane-parallel over rows whatever K is; the per-lane exp is the one scalar call.
//! Arithmetic is f64 for both storage types.
//!
//! **Paths.** The same source is compiled twice, for baseline x86-64 / any other target (portable) and with
//! AVX2 enabled; [`SgaRowKernel::select`] picks one, once per model. Every lane computes the same operations
//! in the same order on both paths, and Rust never contracts a·b + c into an FMA, so they agree bit for bit.

use crate::online_sga::{bounded, log_psi_step, MAX_PSI_OVERSHOOT};
use crate::scalar::{stored, Real};

use super::em_kernel::Isa;

/// Lanes (rows) per group.
const W: usize = 4;

/// Largest K the row kernel handles.
pub(crate) const MAX_K: usize = 16;

/// The pending gradient step of the previous sample: m (K) and P = Σ + m mᵀ (K×K row-major).
#[derive(Debug, Clone)]
pub(crate) struct SgaStep<'a> {
    pub(crate) m: &'a [f64],
    pub(crate) p: &'a [f64],
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
    /// Learning rate α, noise floor, running mean's step ρ.
    pub(crate) lr: f64,
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

/// F and ψ of one row group after the start and the pending step: f[j][l] is column j of lane l.
#[derive(Clone, Copy)]
struct Group<const K: usize> {
    f: [[f64; W]; K],
    psi: [f64; W],
}

/// The start, in place on the lanes.
#[inline(always)]
fn start_lanes<T: Real, const K: usize>(g: &mut Group<K>, start: Start, floor: f64) {
    if start.degenerate {
        g.psi = [1.0; W];
        return;
    }
    for col in g.f.iter_mut() {
        for v in col.iter_mut() {
            *v = stored::<T>(*v * start.sigma).1;
        }
    }
    for v in g.psi.iter_mut() {
        *v = stored::<T>(v.max(floor)).1;
    }
}

/// Lines 10–14 of Algorithm 1 on the lanes (see the module documentation), rounded to T; returns the number
/// of the first `n` lanes whose ψ step diverged.
#[inline(always)]
fn step_lanes<T: Real, const K: usize>(
    g: &mut Group<K>,
    d: &[f64; W],
    step: &SgaStep<'_>,
    c: &SgaConsts<'_>,
    n: usize,
) -> usize {
    let (m, p) = (&step.m[..K], &step.p[..K * K]);
    // g = f P: gp_j = Σ_i f_i P[i][j], i ascending.
    let mut fp = [[0.0f64; W]; K];
    for i in 0..K {
        for j in 0..K {
            let pij = p[i * K + j];
            for l in 0..W {
                fp[j][l] += g.f[i][l] * pij;
            }
        }
    }
    let mut f_m = [0.0f64; W];
    let mut fp_f = [0.0f64; W];
    for j in 0..K {
        for l in 0..W {
            f_m[l] += g.f[j][l] * m[j];
            fp_f[l] += fp[j][l] * g.f[j][l];
        }
    }
    // Per-lane scalars first, then lane-parallel loops (the exp is the one per-lane call).
    let max_state = T::MAX_STATE;
    let mut inv_psi = [0.0f64; W];
    let mut log_step = [0.0f64; W];
    for l in 0..W {
        inv_psi[l] = 1.0 / g.psi[l];
        let dl = d[l];
        log_step[l] = c.lr * (0.5 * inv_psi[l] * (dl * dl - 2.0 * dl * f_m[l] + fp_f[l]) - 0.5);
    }
    // α ∇β bounded (`log_psi_step`), and the F step's scale: ∇F (4.24), or ψ ⊙ ∇F = d mᵀ − F P when
    // preconditioned. One branch per group, so each loop stays lane-parallel.
    let scale = if c.precondition {
        for v in log_step.iter_mut() {
            *v = log_psi_step(*v, true);
        }
        [1.0; W]
    } else {
        for v in log_step.iter_mut() {
            *v = log_psi_step(*v, false);
        }
        inv_psi
    };
    for j in 0..K {
        for l in 0..W {
            let grad_f = scale[l] * (d[l] * m[j] - fp[j][l]);
            g.f[j][l] = stored::<T>(bounded(g.f[j][l] + c.lr * grad_f, -max_state, max_state)).1;
        }
    }
    let growth = exp_lanes(log_step);
    let mut overshoot = 0;
    for l in 0..W {
        let old = g.psi[l];
        g.psi[l] = stored::<T>(bounded(old * growth[l], c.floor, max_state)).1;
        if l < n && g.psi[l] > MAX_PSI_OVERSHOOT * old.max(d[l] * d[l]) {
            overshoot += 1;
        }
    }
    overshoot
}

/// e^x on every lane, in lane-parallel operations only (no calls, so it vectorises like the rest of the
/// kernel): x = n ln 2 + r with |r| ≤ ½ ln 2 (Cody–Waite, ln 2 split in a high part with 21 trailing zero bits
/// and a low part, so n·ln2_hi is exact), e^r by its Taylor series to r¹³ (truncation below 10⁻¹⁷ relative)
/// evaluated by Estrin's scheme,
/// and 2ⁿ applied as two exact power-of-two factors so that a subnormal result is rounded once. Within a few ulp
/// of the correctly rounded value (tested against `f64::exp`); NaN stays NaN, x ≤ −746 gives 0 and
/// x ≥ 709 gives e^709 (callers pass x ≤ 700: see `log_psi_step`).
#[inline(always)]
pub(crate) fn exp_lanes(x: [f64; W]) -> [f64; W] {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
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
        let xc = x[l].max(-746.0).min(709.0);
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
        out[l] = (p[l] * s1) * s2;
    }
    for l in 0..W {
        if x[l].is_nan() {
            out[l] = x[l];
        }
    }
    out
}

/// The block: groups of W rows, the last one padded with zero rows (f = 0, ψ = 1, d = 0: they add exactly
/// zero to every sum).
#[inline(always)]
fn sga_block<T: Real, const K: usize>(c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, nb: usize) {
    let mut su = [[0.0f64; W]; K];
    let mut ss = [[[0.0f64; W]; K]; K];
    let mut overshoot = 0usize;
    let writes = c.step.is_some() || c.start.is_some();
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let mut g = Group::<K> {
            f: [[0.0; W]; K],
            psi: [1.0; W],
        };
        let mut d_prev = [0.0f64; W];
        for l in 0..n {
            let row = &io.f[(r0 + l) * K..(r0 + l + 1) * K];
            for j in 0..K {
                g.f[j][l] = row[j].to_f64();
            }
            g.psi[l] = io.psi[r0 + l].to_f64();
            d_prev[l] = io.d_last[r0 + l].to_f64();
        }
        if let Some(start) = c.start {
            start_lanes::<T, K>(&mut g, start, c.floor);
        }
        if let Some(step) = &c.step {
            overshoot += step_lanes::<T, K>(&mut g, &d_prev, step, c, n);
        }
        if writes {
            for l in 0..n {
                let row = &mut io.f[(r0 + l) * K..(r0 + l + 1) * K];
                for j in 0..K {
                    row[j] = T::from_f64(g.f[j][l]);
                }
                io.psi[r0 + l] = T::from_f64(g.psi[l]);
            }
        }
        // Lines 5, 6: θ̄_t and d_t = x_t − θ̄_t (stored rounded; the sums use the f64 value).
        let mut d = [0.0f64; W];
        for l in 0..n {
            let x = io.x[r0 + l];
            let m0 = io.mean[r0 + l].to_f64();
            let (mean_s, m1) = stored::<T>(m0 + c.rho * (x - m0));
            io.mean[r0 + l] = mean_s;
            d[l] = x - m1;
            io.d_last[r0 + l] = T::from_f64(d[l]);
        }
        // The sums of (4.23): y = f/ψ, u += y d, S += y fᵀ (upper triangle).
        let mut inv_psi = [0.0f64; W];
        for l in 0..W {
            inv_psi[l] = 1.0 / g.psi[l];
        }
        for i in 0..K {
            let mut y = [0.0f64; W];
            for l in 0..W {
                y[l] = g.f[i][l] * inv_psi[l];
                su[i][l] += y[l] * d[l];
            }
            for j in i..K {
                for l in 0..W {
                    ss[i][j][l] += y[l] * g.f[j][l];
                }
            }
        }
        r0 += W;
    }
    // Per-block partials: lanes in order, then added to the totals.
    let lanes = |v: &[f64; W]| v.iter().fold(0.0f64, |acc, x| acc + x);
    for i in 0..K {
        io.u[i] += lanes(&su[i]);
        for j in i..K {
            io.s[i * K + j] += lanes(&ss[i][j]);
        }
    }
    *io.overshoot += overshoot as f64;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sga_block_avx2<T: Real, const K: usize>(c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, nb: usize) {
    sga_block::<T, K>(c, io, nb)
}

fn sga_block_portable<T: Real, const K: usize>(c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, nb: usize) {
    sga_block::<T, K>(c, io, nb)
}

#[cfg(target_arch = "x86_64")]
fn sga_block_avx2_entry<T: Real, const K: usize>(c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, nb: usize) {
    // SAFETY: this function is only handed out by `SgaRowKernel::select` with `Isa::Avx2`, which is only
    // constructed after `is_x86_feature_detected!("avx2")`.
    unsafe { sga_block_avx2::<T, K>(c, io, nb) }
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

macro_rules! by_k {
    ($k:expr, $isa:expr, $portable:ident, $avx:ident) => {{
        macro_rules! pick {
            ($kk:literal) => {
                match $isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 | Isa::Avx512 => $avx::<T, $kk> as BlockFn<T>,
                    Isa::Portable => $portable::<T, $kk> as BlockFn<T>,
                }
            };
        }
        match $k {
            1 => Some(pick!(1)),
            2 => Some(pick!(2)),
            3 => Some(pick!(3)),
            4 => Some(pick!(4)),
            5 => Some(pick!(5)),
            6 => Some(pick!(6)),
            7 => Some(pick!(7)),
            8 => Some(pick!(8)),
            9 => Some(pick!(9)),
            10 => Some(pick!(10)),
            11 => Some(pick!(11)),
            12 => Some(pick!(12)),
            13 => Some(pick!(13)),
            14 => Some(pick!(14)),
            15 => Some(pick!(15)),
            16 => Some(pick!(16)),
            _ => None,
        }
    }};
}

impl<T: Real> SgaRowKernel<T> {
    /// The kernel for K = `k` on code path `isa`; None when K > [`MAX_K`].
    pub(crate) fn select(k: usize, isa: Isa) -> Option<Self> {
        if k > MAX_K {
            return None;
        }
        by_k!(k, isa, sga_block_portable, sga_block_avx2_entry).map(|run| SgaRowKernel { run, isa })
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
}
