//! The per-row arithmetic of VIFA's fused pass, vectorised across rows: W = 4 rows at once, each of the K
//! columns held as a W-lane array (the layout of `crate::engine::em_kernel`), in f64 whatever the storage
//! type. Every function here is `#[inline(always)]` so that it is compiled into each code path of
//! [`super::fused`] (portable or AVX2); every lane does the same operations in the same order on every
//! path and Rust never contracts a·b + c into an FMA, so the paths agree bit for bit.
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

use super::config::{ADAM_BETA1, ADAM_BETA2, ADAM_EPS};
use crate::scalar::{stored, Real};

/// Rows per group (one 256-bit vector of f64).
pub(super) const W: usize = 4;

/// One group of W rows: c, β, ψ^{1/2} (W each) and F (K columns of W). Lanes past the block's end hold
/// c = β = f = 0 and ψ^{1/2} = 1: they add exactly zero to B and are never written back.
pub(super) struct Lanes<const K: usize> {
    pub(super) c: [f64; W],
    pub(super) beta: [f64; W],
    pub(super) sqrt_psi: [f64; W],
    pub(super) f: [[f64; W]; K],
}

/// Load rows r0 … r0 + n − 1 (n ≤ W) of a block: c, β, ψ^{1/2} (one value per row), F (row-major, K wide).
#[inline(always)]
pub(super) fn load<T: Real, const K: usize>(
    c: &[T],
    f: &[T],
    beta: &[T],
    sqrt_psi: &[f64],
    r0: usize,
    n: usize,
) -> Lanes<K> {
    if n == W {
        // A whole group: constant bounds, so the lane-arrays are built in registers (no partial writes to
        // memory that a vector load would then wait for).
        let rows = &f[r0 * K..(r0 + W) * K];
        let mut x = Lanes {
            c: [0.0; W],
            beta: [0.0; W],
            sqrt_psi: [1.0; W],
            f: [[0.0; W]; K],
        };
        for l in 0..W {
            x.c[l] = c[r0 + l].to_f64();
            x.beta[l] = beta[r0 + l].to_f64();
            x.sqrt_psi[l] = sqrt_psi[r0 + l];
            for j in 0..K {
                x.f[j][l] = rows[l * K + j].to_f64();
            }
        }
        return x;
    }
    let mut x = Lanes {
        c: [0.0; W],
        beta: [0.0; W],
        sqrt_psi: [1.0; W],
        f: [[0.0; W]; K],
    };
    for l in 0..n {
        x.c[l] = c[r0 + l].to_f64();
        x.beta[l] = beta[r0 + l].to_f64();
        x.sqrt_psi[l] = sqrt_psi[r0 + l];
        let row = &f[(r0 + l) * K..(r0 + l + 1) * K];
        for j in 0..K {
            x.f[j][l] = row[j].to_f64();
        }
    }
    x
}

/// Transpose K lane-arrays back into n row-major rows (K wide) of `dst` starting at row r0.
#[inline(always)]
pub(super) fn store_rows<T: Copy + Default, const K: usize>(dst: &mut [T], cols: &[[T; W]; K], r0: usize, n: usize) {
    if n == W {
        let rows = &mut dst[r0 * K..(r0 + W) * K];
        for l in 0..W {
            for j in 0..K {
                rows[l * K + j] = cols[j][l];
            }
        }
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
pub(super) fn store_values<T: Copy>(dst: &mut [T], vals: &[T; W], r0: usize, n: usize) {
    if n == W {
        dst[r0..r0 + W].copy_from_slice(vals);
    } else {
        dst[r0..r0 + n].copy_from_slice(&vals[..n]);
    }
}

/// n values of `src` starting at r0 as one lane-array (zeros past n).
#[inline(always)]
pub(super) fn load_values<T: Real>(src: &[T], r0: usize, n: usize) -> [T; W] {
    if n == W {
        let mut out = [T::default(); W];
        out.copy_from_slice(&src[r0..r0 + W]);
        return out;
    }
    let mut out = [T::default(); W];
    out[..n].copy_from_slice(&src[r0..r0 + n]);
    out
}

/// K lane-arrays of n row-major rows (K wide) of `src` starting at row r0 (zeros past n).
#[inline(always)]
pub(super) fn load_rows<T: Real, const K: usize>(src: &[T], r0: usize, n: usize) -> [[T; W]; K] {
    if n == W {
        let rows = &src[r0 * K..(r0 + W) * K];
        let mut cols = [[T::default(); W]; K];
        for l in 0..W {
            for j in 0..K {
                cols[j][l] = rows[l * K + j];
            }
        }
        return cols;
    }
    let mut cols = [[T::default(); W]; K];
    for l in 0..n {
        let row = &src[(r0 + l) * K..(r0 + l + 1) * K];
        for j in 0..K {
            cols[j][l] = row[j];
        }
    }
    cols
}

/// The gradient of one group (c, F as K columns, β).
pub(super) struct Grads<const K: usize> {
    pub(super) c: [f64; W],
    pub(super) f: [[f64; W]; K],
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
/// (I + B)⁻¹. Lanes past n read g = z = 0.
#[inline(always)]
pub(super) fn gradient<const K: usize>(
    x: &Lanes<K>,
    draws: &Draws<'_>,
    m_inv: &[[f64; K]; K],
    alpha: f64,
    r0: usize,
    n: usize,
) -> Grads<K> {
    let mut psi = [0.0; W];
    let mut a = [[0.0; W]; K];
    for l in 0..W {
        psi[l] = x.sqrt_psi[l] * x.sqrt_psi[l];
        let inv_psi = 1.0 / psi[l];
        for j in 0..K {
            a[j][l] = x.f[j][l] * inv_psi;
        }
    }
    // Line 12: cr_j = Σ_i a_i M[i][j], i ascending.
    let mut cr = [[0.0; W]; K];
    for i in 0..K {
        for j in 0..K {
            let mij = m_inv[i][j];
            for l in 0..W {
                cr[j][l] += a[i][l] * mij;
            }
        }
    }
    // The reparameterised likelihood terms averaged over the draws: ḡ, mean g hᵀ, mean g ⊙ z.
    let mut g_mean = [0.0; W];
    let mut gz = [0.0; W];
    let mut gh = [[0.0; W]; K];
    for d in 0..draws.n_draws {
        let base = d * draws.stride + r0;
        let (g, z) = (load_values(draws.g, base, n), load_values(draws.z, base, n));
        let h = &draws.h[d * K..(d + 1) * K];
        for l in 0..W {
            g_mean[l] += g[l];
            gz[l] += g[l] * z[l];
        }
        for j in 0..K {
            for l in 0..W {
                gh[j][l] += g[l] * h[j];
            }
        }
    }
    let inv_l = 1.0 / draws.n_draws as f64;
    let mut out = Grads {
        c: [0.0; W],
        f: [[0.0; W]; K],
        beta: [0.0; W],
    };
    let mut c_dot_a = [0.0; W];
    for j in 0..K {
        for l in 0..W {
            out.f[j][l] = -cr[j][l] + alpha * x.f[j][l] + gh[j][l] * inv_l;
            c_dot_a[l] += cr[j][l] * a[j][l];
        }
    }
    for l in 0..W {
        out.c[l] = alpha * x.c[l] + g_mean[l] * inv_l;
        out.beta[l] = -0.5 + 0.5 * psi[l] * c_dot_a[l] + 0.5 * alpha * psi[l] + 0.5 * x.sqrt_psi[l] * (gz[l] * inv_l);
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

/// New values of one W-lane parameter array: stored in T and as the f64 value of the stored number.
pub(super) struct NewLanes<T> {
    pub(super) stored: [T; W],
    pub(super) vals: [f64; W],
}

/// [`sgd`] on W lanes.
#[inline(always)]
pub(super) fn sgd_lanes<T: Real>(p: &[f64; W], g: &[f64; W], lr: f64, scale: f64) -> NewLanes<T> {
    let mut out = NewLanes {
        stored: [T::default(); W],
        vals: [0.0; W],
    };
    for l in 0..W {
        (out.stored[l], out.vals[l]) = sgd::<T>(p[l], g[l], lr, scale);
    }
    out
}

/// [`adam`] on W lanes (`m`, `v` updated in place), written one lane-parallel operation at a time so that
/// each becomes one vector instruction: the same operations in the same order as [`adam`].
#[inline(always)]
pub(super) fn adam_lanes<T: Real>(
    p: &[f64; W],
    g: &[f64; W],
    m: &mut [T; W],
    v: &mut [T; W],
    adam_lr: f64,
    scale: f64,
    inv_sqrt_bias2: f64,
) -> NewLanes<T> {
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

/// S += a' f'ᵀ over the group (upper triangle, S[i][j] for j ≥ i, one W-lane partial sum each) with
/// a' = f' / ψ', ψ' = (ψ'^{1/2})².
#[inline(always)]
pub(super) fn accumulate_gram<const K: usize>(f: &[[f64; W]; K], sqrt_psi: &[f64; W], s: &mut [[[f64; W]; K]; K]) {
    let mut a = [[0.0; W]; K];
    for l in 0..W {
        let inv_psi = 1.0 / (sqrt_psi[l] * sqrt_psi[l]);
        for j in 0..K {
            a[j][l] = f[j][l] * inv_psi;
        }
    }
    for i in 0..K {
        for j in i..K {
            for l in 0..W {
                s[i][j][l] += a[i][l] * f[j][l];
            }
        }
    }
}

/// A K×K row-major matrix as an array of rows.
#[inline(always)]
pub(super) fn square<const K: usize>(m: &[f64]) -> [[f64; K]; K] {
    let mut out = [[0.0; K]; K];
    for (i, row) in out.iter_mut().enumerate() {
        row.copy_from_slice(&m[i * K..(i + 1) * K]);
    }
    out
}

/// Add the W-lane partial sums of S (upper triangle) into `gram` (K×K row-major, both triangles).
pub(super) fn fold_gram<const K: usize>(s: &[[[f64; W]; K]; K], gram: &mut [f64]) {
    for i in 0..K {
        for j in i..K {
            let v = s[i][j].iter().sum::<f64>();
            gram[i * K + j] += v;
            if j != i {
                gram[j * K + i] += v;
            }
        }
    }
}
