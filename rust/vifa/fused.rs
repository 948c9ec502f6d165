//! VIFA's fused block kernels for K ≤ [`MAX_K`], built from the lane arithmetic of [`super::lanes`]:
//!
//! * [`update_block`]: one step on a block of rows — gradient, optimiser, new ψ^{1/2}, and the block's
//!   share of B = Fᵀ Ψ⁻¹ F of the new values — reading and writing each row's state and moments once;
//! * [`norms_block`]: the squared gradient norms per group (the read-only pass of gradient clipping);
//! * [`gram_block`]: the block's share of B from the stored values, bit-identical to what
//!   [`update_block`] returns for the same values (a restored model has the same (I + B)⁻¹).
//!
//! Shapes: a block has nb ≤ `BLOCK_ROWS` rows; c, β, ψ^{1/2} hold nb values, F nb×K row-major; `gram` is
//! K×K row-major and accumulated. Each kernel is compiled for a portable and an AVX2 path, chosen at run time.

use super::lanes::{self, Draws, Lanes, W};
use super::params::RowsMut;
use super::update::{UpdateRule, LOG_NOISE_LIMIT};
use crate::engine::em_kernel::Isa;
use crate::scalar::Real;

/// Largest K the fused kernels handle (larger K runs the blocked GEMM path of `update`).
pub(super) const MAX_K: usize = 16;

/// Which kernels a model's passes run; chosen once per model (at construction and restore).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// The fused lane kernels of this module (K ≤ [`MAX_K`]) on the given code path.
    Fused(Isa),
    /// Blocked GEMMs over row blocks (`gradient`, `update`), any K.
    Blocked,
}

impl Kernel {
    /// The fastest kernel for K on this CPU.
    pub(super) fn choose(k: usize) -> Self {
        if k <= MAX_K {
            Kernel::Fused(Isa::detect())
        } else {
            Kernel::Blocked
        }
    }
}

/// Constants of one step pass: K, (I + B)⁻¹ (K×K row-major), α, and the optimiser rule.
pub(super) struct StepConsts<'a> {
    pub(super) k: usize,
    pub(super) m_inv: &'a [f64],
    pub(super) alpha: f64,
    pub(super) rule: &'a UpdateRule,
}

/// One step on a block (see the module documentation). Returns whether every new value is finite and
/// |β| ≤ [`LOG_NOISE_LIMIT`].
#[inline(always)]
fn update_block<T: Real, const K: usize>(
    p: &mut RowsMut<'_, T>,
    sqrt_psi: &mut [f64],
    mut moments: Option<&mut (RowsMut<'_, T>, RowsMut<'_, T>)>,
    draws: &Draws<'_>,
    consts: &StepConsts<'_>,
    gram: &mut [f64],
) -> bool {
    let nb = p.c.len();
    let rule = consts.rule;
    let (lr, adam_lr, scale, isb2) = (rule.lr, rule.adam_lr, rule.scale, rule.inv_sqrt_bias2);
    let m_inv = lanes::square::<K>(consts.m_inv);
    let mut s = [[[0.0; W]; K]; K];
    let mut finite = true;
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let x: Lanes<K> = lanes::load(p.c, p.f, p.beta, sqrt_psi, r0, n);
        let g = lanes::gradient::<K>(&x, draws, &m_inv, consts.alpha, r0, n);
        // Lines 17–19 on c, β and each column of F.
        let (c_new, b_new);
        let mut f_vals = [[0.0; W]; K];
        let mut f_stored = [[T::default(); W]; K];
        match moments.as_deref_mut() {
            None => {
                c_new = lanes::sgd_lanes::<T>(&x.c, &g.c, lr[0], scale[0]);
                b_new = lanes::sgd_lanes::<T>(&x.beta, &g.beta, lr[2], scale[2]);
                for j in 0..K {
                    let col = lanes::sgd_lanes::<T>(&x.f[j], &g.f[j], lr[1], scale[1]);
                    (f_stored[j], f_vals[j]) = (col.stored, col.vals);
                }
            }
            Some((first, second)) => {
                let mut m_c = lanes::load_values(first.c, r0, n);
                let mut v_c = lanes::load_values(second.c, r0, n);
                let mut m_b = lanes::load_values(first.beta, r0, n);
                let mut v_b = lanes::load_values(second.beta, r0, n);
                let mut m_f = lanes::load_rows::<T, K>(first.f, r0, n);
                let mut v_f = lanes::load_rows::<T, K>(second.f, r0, n);
                c_new = lanes::adam_lanes(&x.c, &g.c, &mut m_c, &mut v_c, adam_lr[0], scale[0], isb2);
                b_new = lanes::adam_lanes(&x.beta, &g.beta, &mut m_b, &mut v_b, adam_lr[2], scale[2], isb2);
                for j in 0..K {
                    let col = lanes::adam_lanes(&x.f[j], &g.f[j], &mut m_f[j], &mut v_f[j], adam_lr[1], scale[1], isb2);
                    (f_stored[j], f_vals[j]) = (col.stored, col.vals);
                }
                lanes::store_values(first.c, &m_c, r0, n);
                lanes::store_values(second.c, &v_c, r0, n);
                lanes::store_values(first.beta, &m_b, r0, n);
                lanes::store_values(second.beta, &v_b, r0, n);
                lanes::store_rows::<T, K>(first.f, &m_f, r0, n);
                lanes::store_rows::<T, K>(second.f, &v_f, r0, n);
            }
        }
        // Write the new values; ψ'^{1/2} = exp(β'/2) of the stored β' (one exp per row).
        let mut sqrt_new = [1.0; W];
        for l in 0..n {
            let (c_v, b_v) = (c_new.vals[l], b_new.vals[l]);
            finite &= c_v.is_finite() && b_v.is_finite() && b_v.abs() <= LOG_NOISE_LIMIT;
            for col in &f_vals {
                finite &= col[l].is_finite();
            }
            sqrt_new[l] = (0.5 * b_v).exp();
        }
        lanes::store_values(p.c, &c_new.stored, r0, n);
        lanes::store_values(p.beta, &b_new.stored, r0, n);
        lanes::store_values(sqrt_psi, &sqrt_new, r0, n);
        lanes::store_rows::<T, K>(p.f, &f_stored, r0, n);
        // Line 11 for the next step, from the values just stored.
        lanes::accumulate_gram::<K>(&f_vals, &sqrt_new, &mut s);
        r0 += W;
    }
    lanes::fold_gram::<K>(&s, gram);
    finite
}

/// ‖∇_c‖², ‖∇_F‖², ‖∇_β‖² over a block (read-only).
#[inline(always)]
fn norms_block<T: Real, const K: usize>(
    c: &[T],
    f: &[T],
    beta: &[T],
    sqrt_psi: &[f64],
    draws: &Draws<'_>,
    m_inv: &[f64],
    alpha: f64,
) -> [f64; 3] {
    let nb = c.len();
    let m_inv = lanes::square::<K>(m_inv);
    let mut sq = [[0.0; W]; 3];
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let x: Lanes<K> = lanes::load(c, f, beta, sqrt_psi, r0, n);
        let g = lanes::gradient::<K>(&x, draws, &m_inv, alpha, r0, n);
        for l in 0..n {
            sq[0][l] += g.c[l] * g.c[l];
            sq[2][l] += g.beta[l] * g.beta[l];
            for col in &g.f {
                sq[1][l] += col[l] * col[l];
            }
        }
        r0 += W;
    }
    sq.map(|lanes| lanes.iter().sum())
}

/// The block's share of B = Fᵀ Ψ⁻¹ F from the stored F (nb×K) and ψ^{1/2} (nb), added to `gram`.
#[inline(always)]
fn gram_block<T: Real, const K: usize>(f: &[T], sqrt_psi: &[f64], gram: &mut [f64]) {
    let nb = sqrt_psi.len();
    let mut s = [[[0.0; W]; K]; K];
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let stored = lanes::load_rows::<T, K>(f, r0, n);
        let mut vals = [[0.0; W]; K];
        for j in 0..K {
            for l in 0..W {
                vals[j][l] = stored[j][l].to_f64();
            }
        }
        let mut sp = [1.0; W];
        sp[..n].copy_from_slice(&sqrt_psi[r0..r0 + n]);
        lanes::accumulate_gram::<K>(&vals, &sp, &mut s);
        r0 += W;
    }
    lanes::fold_gram::<K>(&s, gram);
}

/// Expand `$body` once per K = 1 … [`MAX_K`] with the const `$k` bound to the value of `$n`.
macro_rules! for_k {
    ($n:expr, $k:ident => $body:expr) => {
        match $n {
            1 => {
                const $k: usize = 1;
                $body
            }
            2 => {
                const $k: usize = 2;
                $body
            }
            3 => {
                const $k: usize = 3;
                $body
            }
            4 => {
                const $k: usize = 4;
                $body
            }
            5 => {
                const $k: usize = 5;
                $body
            }
            6 => {
                const $k: usize = 6;
                $body
            }
            7 => {
                const $k: usize = 7;
                $body
            }
            8 => {
                const $k: usize = 8;
                $body
            }
            9 => {
                const $k: usize = 9;
                $body
            }
            10 => {
                const $k: usize = 10;
                $body
            }
            11 => {
                const $k: usize = 11;
                $body
            }
            12 => {
                const $k: usize = 12;
                $body
            }
            13 => {
                const $k: usize = 13;
                $body
            }
            14 => {
                const $k: usize = 14;
                $body
            }
            15 => {
                const $k: usize = 15;
                $body
            }
            16 => {
                const $k: usize = 16;
                $body
            }
            _ => unreachable!("the caller checks K <= MAX_K"),
        }
    };
}

pub(super) use for_k;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn update_block_avx2<T: Real, const K: usize>(
    p: &mut RowsMut<'_, T>,
    sqrt_psi: &mut [f64],
    moments: Option<&mut (RowsMut<'_, T>, RowsMut<'_, T>)>,
    draws: &Draws<'_>,
    consts: &StepConsts<'_>,
    gram: &mut [f64],
) -> bool {
    update_block::<T, K>(p, sqrt_psi, moments, draws, consts, gram)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn norms_block_avx2<T: Real, const K: usize>(
    p: (&[T], &[T], &[T]),
    sqrt_psi: &[f64],
    draws: &Draws<'_>,
    m_inv: &[f64],
    alpha: f64,
) -> [f64; 3] {
    norms_block::<T, K>(p.0, p.1, p.2, sqrt_psi, draws, m_inv, alpha)
}

/// [`update_block`] for K = `consts.k` ≤ [`MAX_K`] on the path `isa`.
pub(super) fn run_update_block<T: Real>(
    isa: Isa,
    p: &mut RowsMut<'_, T>,
    sqrt_psi: &mut [f64],
    moments: Option<&mut (RowsMut<'_, T>, RowsMut<'_, T>)>,
    draws: &Draws<'_>,
    consts: &StepConsts<'_>,
    gram: &mut [f64],
) -> bool {
    for_k!(consts.k, K => match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after `is_x86_feature_detected!("avx2")`.
        Isa::Avx2 | Isa::Avx512 => unsafe { update_block_avx2::<T, K>(p, sqrt_psi, moments, draws, consts, gram) },
        Isa::Portable => update_block::<T, K>(p, sqrt_psi, moments, draws, consts, gram),
    })
}

/// [`norms_block`] for K = `k` ≤ [`MAX_K`] on the path `isa`; `p` = (c, F, β) of the block.
pub(super) fn run_norms_block<T: Real>(
    isa: Isa,
    k: usize,
    p: (&[T], &[T], &[T]),
    sqrt_psi: &[f64],
    draws: &Draws<'_>,
    m_inv: &[f64],
    alpha: f64,
) -> [f64; 3] {
    for_k!(k, K => match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after `is_x86_feature_detected!("avx2")`.
        Isa::Avx2 | Isa::Avx512 => unsafe { norms_block_avx2::<T, K>(p, sqrt_psi, draws, m_inv, alpha) },
        Isa::Portable => norms_block::<T, K>(p.0, p.1, p.2, sqrt_psi, draws, m_inv, alpha),
    })
}

/// [`gram_block`] for K = `k` ≤ [`MAX_K`] (portable path: it runs once per restore, and every path gives
/// the same bits).
pub(super) fn run_gram_block<T: Real>(k: usize, f: &[T], sqrt_psi: &[f64], gram: &mut [f64]) {
    for_k!(k, K => gram_block::<T, K>(f, sqrt_psi, gram))
}
