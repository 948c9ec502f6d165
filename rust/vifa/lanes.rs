//! The per-row arithmetic of VIFA's fused pass, vectorised across rows: W rows at once (one vector of the
//! storage type T: W = vector bytes / size of T, so 4 f64 or 8 f32 on AVX2, 8 or 16 on AVX-512), each of the
//! K columns of F held as a W-lane array (the layout of `crate::engine::em_kernel`). Every function here is
//! `#[inline(always)]` so that it is compiled into each code path of [`super::fused`]; every lane does the
//! same operations in the same order on every path and Rust never contracts a·b + c into an FMA, so paths
//! with the same W agree bit for bit (a different W only changes the order in which lanes are summed).
//!
//! Per row, with ψ^{1/2} from the state's cache, ψ = (ψ^{1/2})² and a = f/ψ (Algorithm 3, line 10):
//!
//! ```text
//!   cr = (I + B)⁻¹ a                                   (line 12; K² multiply-adds, (I + B)⁻¹ symmetric)
//!   ∇c = α c + ḡ                                        (line 9)
//!   ∇f = −cr + α f + mean_l g_l h_l                     (lines 13–14; −a + cr B = −cr)
//!   ∇β = −½ + ½ ψ (cr·a) + ½ α ψ + ½ ψ^{1/2} mean_l g_l z_l   (lines 15–16)
//! ```
//!
//! (see `gradient::block_gradients` for the derivation), and from a row's new values
//! B += a' f'ᵀ with a' = f'/ψ' (line 11 of the next step; upper triangle, K(K+1)/2 multiply-adds).
//!
//! **Arithmetic type.** The K-wide work (a, cr, ∇f, the optimiser on F, the share of B) runs in T, so float32
//! state does float32 arithmetic on W = 8 or 16 lanes; each block's partial sums of B are added in f64. The
//! per-row scalars stay f64 whatever T is (they are 2 values of K + 2 and cost little): ψ, 1/ψ and ψ^{1/2}
//! (ψ = exp β ranges over e^{±700}, far outside float32), ∇β and the update of β (∇β carries ψ·α/2 and feeds
//! the exp of the next ψ), and c with its update (as before). For T = f64 every operation is the one the
//! f64 kernel always did, in the same order, so float64 results are unchanged bit for bit. float32 range:
//! 1/ψ and the products a = f/ψ, a·f are float32 numbers, finite while ψ ≳ 1e-38·|f| (a non-finite value
//! is reported as divergence).

use super::config::{ADAM_BETA1, ADAM_BETA2, ADAM_EPS};
use crate::engine::lane_syrk::LaneSyrk;
use crate::engine::lane_times::lanes_times;
use crate::engine::lane_transpose;
use crate::scalar::{stored, Real};

/// −x in T (exact; written through f64 because `Real` has no negation: LLVM folds it to one sign flip).
#[inline(always)]
fn neg<T: Real>(x: T) -> T {
    T::from_f64(-x.to_f64())
}

/// a / b correctly rounded in T: the f64 quotient of two float32 numbers rounded to float32 is the float32
/// quotient (53 ≥ 2·24 + 2 bits), and LLVM emits the float32 division for it.
#[inline(always)]
fn div<T: Real>(a: T, b: T) -> T {
    T::from_f64(a.to_f64() / b.to_f64())
}

/// √x correctly rounded in T (the same argument as [`div`]).
#[inline(always)]
fn sqrt<T: Real>(x: T) -> T {
    T::from_f64(x.to_f64().sqrt())
}

/// One group of W rows: c, β, ψ^{1/2} (W each, f64) and F (K columns of W, in T). Lanes past the block's
/// end hold c = β = f = 0 and ψ^{1/2} = 1: they add exactly zero to B and are never written back.
pub(super) struct Lanes<T, const K: usize, const W: usize> {
    pub(super) c: [f64; W],
    pub(super) beta: [f64; W],
    pub(super) sqrt_psi: [f64; W],
    pub(super) f: [[T; W]; K],
}

/// Load rows r0 … r0 + n − 1 (n ≤ W) of a block: c, β, ψ^{1/2} (one value per row), F (row-major, K wide).
#[inline(always)]
pub(super) fn load<T: Real, const K: usize, const W: usize, const AVX: bool>(
    c: &[T],
    f: &[T],
    beta: &[T],
    sqrt_psi: &[f64],
    r0: usize,
    n: usize,
) -> Lanes<T, K, W> {
    let mut x = Lanes {
        c: [0.0; W],
        beta: [0.0; W],
        sqrt_psi: [1.0; W],
        f: load_rows::<T, K, W, AVX>(f, r0, n),
    };
    if n == W {
        // A whole group: constant bounds, so the lane-arrays are built in registers (no partial writes to
        // memory that a vector load would then wait for).
        for l in 0..W {
            x.c[l] = c[r0 + l].to_f64();
            x.beta[l] = beta[r0 + l].to_f64();
            x.sqrt_psi[l] = sqrt_psi[r0 + l];
        }
        return x;
    }
    for l in 0..n {
        x.c[l] = c[r0 + l].to_f64();
        x.beta[l] = beta[r0 + l].to_f64();
        x.sqrt_psi[l] = sqrt_psi[r0 + l];
    }
    x
}

/// Transpose K lane-arrays back into n row-major rows (K wide) of `dst` starting at row r0 (as [`load_rows`]).
#[inline(always)]
pub(super) fn store_rows<T: Real, const K: usize, const W: usize, const AVX: bool>(
    dst: &mut [T],
    cols: &[[T; W]; K],
    r0: usize,
    n: usize,
) {
    if n == W {
        // SAFETY: as in `load_rows`.
        unsafe { lane_transpose::store_columns::<T, K, W, AVX>(cols, &mut dst[r0 * K..(r0 + W) * K]) };
        return;
    }
    for l in 0..n {
        let row = &mut dst[(r0 + l) * K..(r0 + l + 1) * K];
        for j in 0..K {
            row[j] = cols[j][l];
        }
    }
}

/// Write the first n lanes of `vals` to `dst[r0 …]`.
#[inline(always)]
pub(super) fn store_values<T: Copy, const W: usize>(dst: &mut [T], vals: &[T; W], r0: usize, n: usize) {
    if n == W {
        dst[r0..r0 + W].copy_from_slice(vals);
    } else {
        dst[r0..r0 + n].copy_from_slice(&vals[..n]);
    }
}

/// n values of `src` starting at r0 as one lane-array (zeros past n).
#[inline(always)]
pub(super) fn load_values<T: Real, const W: usize>(src: &[T], r0: usize, n: usize) -> [T; W] {
    let mut out = [T::default(); W];
    if n == W {
        out.copy_from_slice(&src[r0..r0 + W]);
    } else {
        out[..n].copy_from_slice(&src[r0..r0 + n]);
    }
    out
}

/// K lane-arrays of n row-major rows (K wide) of `src` starting at row r0 (zeros past n). A full group is
/// transposed in registers on the AVX code paths (`AVX`, see `crate::engine::lane_transpose`), else moved value
/// by value; the lanes hold the same numbers either way.
#[inline(always)]
pub(super) fn load_rows<T: Real, const K: usize, const W: usize, const AVX: bool>(
    src: &[T],
    r0: usize,
    n: usize,
) -> [[T; W]; K] {
    let mut cols = [[T::default(); W]; K];
    if n == W {
        // SAFETY: AVX is set only on the code paths compiled with AVX2 (`fused::code_paths`).
        unsafe { lane_transpose::load_columns::<T, K, W, AVX>(&src[r0 * K..(r0 + W) * K], &mut cols) };
        return cols;
    }
    for l in 0..n {
        let row = &src[(r0 + l) * K..(r0 + l + 1) * K];
        for j in 0..K {
            cols[j][l] = row[j];
        }
    }
    cols
}

/// The gradient of one group: c and β in f64, F (K columns) in T.
pub(super) struct Grads<T, const K: usize, const W: usize> {
    pub(super) c: [f64; W],
    pub(super) f: [[T; W]; K],
    pub(super) beta: [f64; W],
}

/// The likelihood gradients and noise of the block's rows: `g[l·stride + r]` and `z[l·stride + r]` for
/// draw l and block row r; `h` the L×K latent draws (row-major).
pub(super) struct Draws<'a> {
    pub(super) g: &'a [f64],
    pub(super) z: &'a [f64],
    pub(super) h: &'a [f64],
    pub(super) n_draws: usize,
    pub(super) stride: usize,
}

/// ∇c, ∇F, ∇β of the negative ELBO for one group (equations in the module documentation); `m_inv` is
/// (I + B)⁻¹ rounded to T, `alpha` is α. Lanes past n read g = z = 0.
#[inline(always)]
pub(super) fn gradient<T: Real, const K: usize, const W: usize>(
    x: &Lanes<T, K, W>,
    draws: &Draws<'_>,
    m_inv: &[[T; K]; K],
    alpha: f64,
    r0: usize,
    n: usize,
) -> Grads<T, K, W> {
    let mut psi = [0.0; W];
    let mut inv_psi = [T::default(); W];
    for l in 0..W {
        psi[l] = x.sqrt_psi[l] * x.sqrt_psi[l];
        inv_psi[l] = T::from_f64(1.0 / psi[l]);
    }
    let mut a = [[T::default(); W]; K];
    for j in 0..K {
        for l in 0..W {
            a[j][l] = x.f[j][l] * inv_psi[l];
        }
    }
    // Line 12: cr_j = Σ_i a_i M[i][j], i ascending.
    let cr = lanes_times::<T, K, W>(&a, m_inv.as_flattened());
    // The reparameterised likelihood terms averaged over the draws: ḡ, mean g ⊙ z (f64, per row) and
    // mean g hᵀ (in T, K per row).
    let mut g_mean = [0.0; W];
    let mut gz = [0.0; W];
    let mut gh = [[T::default(); W]; K];
    for d in 0..draws.n_draws {
        let base = d * draws.stride + r0;
        let (g, z): ([f64; W], [f64; W]) = (load_values(draws.g, base, n), load_values(draws.z, base, n));
        let h = &draws.h[d * K..(d + 1) * K];
        let mut g_t = [T::default(); W];
        for l in 0..W {
            g_mean[l] += g[l];
            gz[l] += g[l] * z[l];
            g_t[l] = T::from_f64(g[l]);
        }
        for j in 0..K {
            let h_j = T::from_f64(h[j]);
            for l in 0..W {
                gh[j][l] = gh[j][l] + g_t[l] * h_j;
            }
        }
    }
    let inv_l = 1.0 / draws.n_draws as f64;
    let (alpha_t, inv_l_t) = (T::from_f64(alpha), T::from_f64(inv_l));
    let mut out = Grads {
        c: [0.0; W],
        f: [[T::default(); W]; K],
        beta: [0.0; W],
    };
    let mut c_dot_a = [T::default(); W];
    for j in 0..K {
        for l in 0..W {
            out.f[j][l] = neg(cr[j][l]) + alpha_t * x.f[j][l] + gh[j][l] * inv_l_t;
            c_dot_a[l] = c_dot_a[l] + cr[j][l] * a[j][l];
        }
    }
    for l in 0..W {
        out.c[l] = alpha * x.c[l] + g_mean[l] * inv_l;
        out.beta[l] =
            -0.5 + 0.5 * psi[l] * c_dot_a[l].to_f64() + 0.5 * alpha * psi[l] + 0.5 * x.sqrt_psi[l] * (gz[l] * inv_l);
    }
    out
}

/// SGD (lines 17–19): p ← p − η (scale · g), rounded to T. Returns (stored, its f64 value).
#[inline(always)]
pub(super) fn sgd<T: Real>(p: f64, g: f64, lr: f64, scale: f64) -> (T, f64) {
    stored::<T>(p - lr * (scale * g))
}

/// Adam with g = scale · grad: m ← β₁ m + (1 − β₁) g, v ← β₂ v + (1 − β₂) g² (both rounded to T), then
///
/// ```text
///   p ← p − η m̂ / (√v̂ + ε) = p − (η / (1 − β₁ᵗ)) m / (√v / √(1 − β₂ᵗ) + ε)
/// ```
///
/// with `adam_lr` = η / (1 − β₁ᵗ) and `inv_sqrt_bias2` = 1 / √(1 − β₂ᵗ) (one division and one square root
/// per value). Returns (stored p, its f64 value).
#[inline(always)]
pub(super) fn adam<T: Real>(
    p: f64,
    grad: f64,
    m: &mut T,
    v: &mut T,
    adam_lr: f64,
    scale: f64,
    inv_sqrt_bias2: f64,
) -> (T, f64) {
    let g = scale * grad;
    let (m_s, m1) = stored::<T>(ADAM_BETA1 * m.to_f64() + (1.0 - ADAM_BETA1) * g);
    let (v_s, v1) = stored::<T>(ADAM_BETA2 * v.to_f64() + (1.0 - ADAM_BETA2) * g * g);
    *m = m_s;
    *v = v_s;
    stored::<T>(p - adam_lr * m1 / (v1.sqrt() * inv_sqrt_bias2 + ADAM_EPS))
}

/// New values of one W-lane f64 parameter array (c or β): stored in T and as the f64 value of the stored
/// number.
pub(super) struct NewLanes<T, const W: usize> {
    pub(super) stored: [T; W],
    pub(super) vals: [f64; W],
}

/// [`sgd`] on W lanes of an f64 parameter (c or β).
#[inline(always)]
pub(super) fn sgd_lanes<T: Real, const W: usize>(p: &[f64; W], g: &[f64; W], lr: f64, scale: f64) -> NewLanes<T, W> {
    let mut out = NewLanes {
        stored: [T::default(); W],
        vals: [0.0; W],
    };
    for l in 0..W {
        (out.stored[l], out.vals[l]) = sgd::<T>(p[l], g[l], lr, scale);
    }
    out
}

/// [`adam`] on W lanes of an f64 parameter (c or β; `m`, `v` updated in place), written one lane-parallel
/// operation at a time so that each becomes one vector instruction: the same operations as [`adam`].
#[inline(always)]
pub(super) fn adam_lanes<T: Real, const W: usize>(
    p: &[f64; W],
    g: &[f64; W],
    m: &mut [T; W],
    v: &mut [T; W],
    adam_lr: f64,
    scale: f64,
    inv_sqrt_bias2: f64,
) -> NewLanes<T, W> {
    let mut out = NewLanes {
        stored: [T::default(); W],
        vals: [0.0; W],
    };
    let (mut m1, mut v1) = ([0.0; W], [0.0; W]);
    for l in 0..W {
        let gs = scale * g[l];
        (m[l], m1[l]) = stored::<T>(ADAM_BETA1 * m[l].to_f64() + (1.0 - ADAM_BETA1) * gs);
        (v[l], v1[l]) = stored::<T>(ADAM_BETA2 * v[l].to_f64() + (1.0 - ADAM_BETA2) * gs * gs);
    }
    let mut denom = [0.0; W];
    for l in 0..W {
        denom[l] = v1[l].sqrt() * inv_sqrt_bias2 + ADAM_EPS;
    }
    for l in 0..W {
        (out.stored[l], out.vals[l]) = stored::<T>(p[l] - adam_lr * m1[l] / denom[l]);
    }
    out
}

/// The optimiser constants of one step, rounded to T for the K-wide arithmetic on F.
#[derive(Clone, Copy)]
pub(super) struct RuleT<T> {
    pub(super) lr: T,
    pub(super) adam_lr: T,
    pub(super) scale: T,
    pub(super) inv_sqrt_bias2: T,
}

impl<T: Real> RuleT<T> {
    #[inline(always)]
    pub(super) fn new(lr: f64, adam_lr: f64, scale: f64, inv_sqrt_bias2: f64) -> Self {
        RuleT {
            lr: T::from_f64(lr),
            adam_lr: T::from_f64(adam_lr),
            scale: T::from_f64(scale),
            inv_sqrt_bias2: T::from_f64(inv_sqrt_bias2),
        }
    }
}

/// [`sgd`] on one column of F in T: p ← p − η (scale · g).
#[inline(always)]
pub(super) fn sgd_column<T: Real, const W: usize>(p: &[T; W], g: &[T; W], rule: &RuleT<T>) -> [T; W] {
    let mut out = [T::default(); W];
    for l in 0..W {
        out[l] = p[l] - rule.lr * (rule.scale * g[l]);
    }
    out
}

/// [`adam`] on one column of F in T (`m`, `v` updated in place): the same operations in the same order,
/// each lane-parallel over the W lanes.
#[inline(always)]
pub(super) fn adam_column<T: Real, const W: usize>(
    p: &[T; W],
    g: &[T; W],
    m: &mut [T; W],
    v: &mut [T; W],
    rule: &RuleT<T>,
) -> [T; W] {
    let (b1, c1) = (T::from_f64(ADAM_BETA1), T::from_f64(1.0 - ADAM_BETA1));
    let (b2, c2) = (T::from_f64(ADAM_BETA2), T::from_f64(1.0 - ADAM_BETA2));
    let eps = T::from_f64(ADAM_EPS);
    let mut out = [T::default(); W];
    for l in 0..W {
        let gs = rule.scale * g[l];
        m[l] = b1 * m[l] + c1 * gs;
        v[l] = b2 * v[l] + c2 * gs * gs;
    }
    let mut denom = [T::default(); W];
    for l in 0..W {
        denom[l] = sqrt(v[l]) * rule.inv_sqrt_bias2 + eps;
    }
    for l in 0..W {
        out[l] = p[l] - div(rule.adam_lr * m[l], denom[l]);
    }
    out
}

/// Keeps the group's terms of S += a' f'ᵀ (upper triangle, one W-lane partial sum per entry, in T) with
/// a' = f' / ψ', ψ' = (ψ'^{1/2})², and adds the kept groups into S tile by tile once its slots are full
/// (`LaneSyrk`: each lane adds the groups in order, so S is the same bits as adding group by group).
#[inline(always)]
pub(super) fn accumulate_gram<T: Real, const K: usize, const W: usize>(
    f: &[[T; W]; K],
    sqrt_psi: &[f64; W],
    s: &mut LaneSyrk<T, K, W>,
) {
    let mut inv_psi = [T::default(); W];
    for l in 0..W {
        inv_psi[l] = T::from_f64(1.0 / (sqrt_psi[l] * sqrt_psi[l]));
    }
    let slot = s.kept;
    for j in 0..K {
        for l in 0..W {
            s.y[slot][j][l] = f[j][l] * inv_psi[l];
        }
        s.z[slot][j] = f[j];
    }
    s.kept += 1;
    s.flush_if_full();
}

/// A K×K row-major f64 matrix as an array of rows, rounded to T.
#[inline(always)]
pub(super) fn square<T: Real, const K: usize>(m: &[f64]) -> [[T; K]; K] {
    let mut out = [[T::default(); K]; K];
    for (i, row) in out.iter_mut().enumerate() {
        for (o, v) in row.iter_mut().zip(&m[i * K..(i + 1) * K]) {
            *o = T::from_f64(*v);
        }
    }
    out
}

/// Add the W-lane partial sums of S (upper triangle, one block's worth, its kept groups added first) into `gram` (K×K row-major, both
/// triangles) in f64: float32 lanes sum at most `BLOCK_ROWS` / W rows each before being widened.
pub(super) fn fold_gram<T: Real, const K: usize, const W: usize>(syrk: &mut LaneSyrk<T, K, W>, gram: &mut [f64]) {
    syrk.flush();
    let s = &syrk.s;
    for i in 0..K {
        for j in i..K {
            let v = s[i][j].iter().map(|x| x.to_f64()).sum::<f64>();
            gram[i * K + j] += v;
            if j != i {
                gram[j * K + i] += v;
            }
        }
    }
}
