//! VIFA's fused block kernels for K ≤ [`MAX_K`], built from the lane arithmetic of [`super::lanes`]:
//!
//! * [`update_block`]: one step on a block of rows — gradient, optimiser, new ψ^{1/2}, and the block's
//!   share of B = Fᵀ Ψ⁻¹ F of the new values — reading and writing each row's state and moments once;
//! * [`norms_block`]: the squared gradient norms per group (the read-only pass of gradient clipping);
//! * [`gram_block`]: the block's share of B from the stored values, bit-identical to what
//!   [`update_block`] returns for the same values (a restored model has the same (I + B)⁻¹).
//!
//! Shapes: a block has nb ≤ `BLOCK_ROWS` rows; c, β, ψ^{1/2} hold nb values, F nb×K row-major; `gram` is
//! K×K row-major and accumulated. Each kernel is compiled for a portable, an AVX2 and an AVX-512 path, chosen at run time,
//! with W = vector bytes / size of T lanes (4 f64 or 8 f32 on the portable and AVX2 paths, 8 or 16 on AVX-512).

use super::lanes::{self, Draws, Lanes, RuleT};
use super::params::RowsMut;
use super::update::{UpdateRule, LOG_NOISE_LIMIT};
use crate::engine::isa::Isa;
use crate::engine::lane_syrk::LaneSyrk;
use crate::scalar::Real;

/// Largest K the fused kernels handle (larger K runs the blocked path of `update`).
pub(super) use crate::engine::k_dispatch::{for_k, MAX_K};

/// Which kernels a model's passes run; chosen once per model (at construction and restore).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// The fused lane kernels of this module (K ≤ [`MAX_K`]) on the given code path.
    Fused(Isa),
    /// Row blocks with register-tiled K×K products (`gradient`, `products`, `update`), any K, the products
    /// on the given code path.
    Blocked(Isa),
}

impl Kernel {
    /// The fastest kernel for K on this CPU: the fused kernels on the best 256-bit path. The AVX-512 path
    /// (`Kernel::Fused(Isa::Avx512)`, tested against the others) is not chosen: its 8- and 16-lane
    /// transpositions between rows and lanes compile to gathers and stack spills, which make it slower than
    /// AVX2 (docs/performance.md, "Why the kernels are chosen as they are").
    pub(super) fn choose(k: usize) -> Self {
        if k <= MAX_K {
            let best_256 = Isa::allowed()
                .into_iter()
                .rfind(|isa| isa.vector_bytes() == 32)
                .unwrap_or(Isa::Portable);
            Kernel::Fused(best_256)
        } else {
            Kernel::Blocked(Isa::detect())
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
// `v − v` is the finiteness probe (NaN for NaN or ±∞, +0 otherwise), not a mistake.
#[allow(clippy::eq_op)]
fn update_block<T: Real, const K: usize, const W: usize, const AVX: bool>(
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
    let rule_f = RuleT::<T>::new(lr[1], adam_lr[1], scale[1], isb2);
    let m_inv = lanes::square::<T, K>(consts.m_inv);
    let mut s = LaneSyrk::<T, K, W>::new();
    let (mut nan_scalars, mut beta_max, mut nan_f) = ([0.0; W], [0.0; W], [T::default(); W]);
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let x: Lanes<T, K, W> = lanes::load::<T, K, W, AVX>(p.c, p.f, p.beta, sqrt_psi, r0, n);
        let g = lanes::gradient::<T, K, W>(&x, draws, &m_inv, consts.alpha, r0, n);
        // Lines 17–19 on c, β (f64) and each column of F (in T).
        let (c_new, b_new);
        let mut f_new = [[T::default(); W]; K];
        match moments.as_deref_mut() {
            None => {
                c_new = lanes::sgd_lanes::<T, W>(&x.c, &g.c, lr[0], scale[0]);
                b_new = lanes::sgd_lanes::<T, W>(&x.beta, &g.beta, lr[2], scale[2]);
                for j in 0..K {
                    f_new[j] = lanes::sgd_column(&x.f[j], &g.f[j], &rule_f);
                }
            }
            Some((first, second)) => {
                let mut m_c = lanes::load_values(first.c, r0, n);
                let mut v_c = lanes::load_values(second.c, r0, n);
                let mut m_b = lanes::load_values(first.beta, r0, n);
                let mut v_b = lanes::load_values(second.beta, r0, n);
                let mut m_f = lanes::load_rows::<T, K, W, AVX>(first.f, r0, n);
                let mut v_f = lanes::load_rows::<T, K, W, AVX>(second.f, r0, n);
                c_new = lanes::adam_lanes(&x.c, &g.c, &mut m_c, &mut v_c, adam_lr[0], scale[0], isb2);
                b_new = lanes::adam_lanes(&x.beta, &g.beta, &mut m_b, &mut v_b, adam_lr[2], scale[2], isb2);
                for j in 0..K {
                    f_new[j] = lanes::adam_column(&x.f[j], &g.f[j], &mut m_f[j], &mut v_f[j], &rule_f);
                }
                lanes::store_values(first.c, &m_c, r0, n);
                lanes::store_values(second.c, &v_c, r0, n);
                lanes::store_values(first.beta, &m_b, r0, n);
                lanes::store_values(second.beta, &v_b, r0, n);
                lanes::store_rows::<T, K, W, AVX>(first.f, &m_f, r0, n);
                lanes::store_rows::<T, K, W, AVX>(second.f, &v_f, r0, n);
            }
        }
        // Finiteness, checked once per block from lane-parallel sums (padded lanes, with zero state and zero
        // gradient, always give finite values): v − v is +0 for a finite v and NaN otherwise.
        for l in 0..W {
            let (c_v, b_v) = (c_new.vals[l], b_new.vals[l]);
            nan_scalars[l] += (c_v - c_v) + (b_v - b_v);
            let b_abs = b_v.abs();
            beta_max[l] = if b_abs > beta_max[l] { b_abs } else { beta_max[l] };
        }
        for col in &f_new {
            for l in 0..W {
                nan_f[l] = nan_f[l] + (col[l] - col[l]);
            }
        }
        // ψ'^{1/2} = exp(β'/2) of the stored β' (one exp per row).
        let mut sqrt_new = [1.0; W];
        for l in 0..n {
            sqrt_new[l] = (0.5 * b_new.vals[l]).exp();
        }
        lanes::store_values(p.c, &c_new.stored, r0, n);
        lanes::store_values(p.beta, &b_new.stored, r0, n);
        lanes::store_values(sqrt_psi, &sqrt_new, r0, n);
        lanes::store_rows::<T, K, W, AVX>(p.f, &f_new, r0, n);
        // Line 11 for the next step, from the values just stored.
        lanes::accumulate_gram::<T, K, W>(&f_new, &sqrt_new, &mut s);
        r0 += W;
    }
    lanes::fold_gram::<T, K, W>(&mut s, gram);
    (0..W).all(|l| nan_scalars[l] == 0.0 && beta_max[l] <= LOG_NOISE_LIMIT && nan_f[l].to_f64() == 0.0)
}

/// ‖∇_c‖², ‖∇_F‖², ‖∇_β‖² over a block (read-only).
#[inline(always)]
fn norms_block<T: Real, const K: usize, const W: usize, const AVX: bool>(
    p: (&[T], &[T], &[T]),
    sqrt_psi: &[f64],
    draws: &Draws<'_>,
    m_inv: &[f64],
    alpha: f64,
) -> [f64; 3] {
    let (c, f, beta) = p;
    let nb = c.len();
    let m_inv = lanes::square::<T, K>(m_inv);
    let mut sq = [[0.0; W]; 3];
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let x: Lanes<T, K, W> = lanes::load::<T, K, W, AVX>(c, f, beta, sqrt_psi, r0, n);
        let g = lanes::gradient::<T, K, W>(&x, draws, &m_inv, alpha, r0, n);
        for l in 0..n {
            sq[0][l] += g.c[l] * g.c[l];
            sq[2][l] += g.beta[l] * g.beta[l];
            for col in &g.f {
                let v = col[l].to_f64();
                sq[1][l] += v * v;
            }
        }
        r0 += W;
    }
    sq.map(|lanes| lanes.iter().sum())
}

/// The block's share of B = Fᵀ Ψ⁻¹ F from the stored F (nb×K) and ψ^{1/2} (nb), added to `gram`: the
/// same operations, lanes and order as [`update_block`] (a restored model has the same (I + B)⁻¹).
#[inline(always)]
fn gram_block<T: Real, const K: usize, const W: usize>(f: &[T], sqrt_psi: &[f64], gram: &mut [f64]) {
    let nb = sqrt_psi.len();
    let mut s = LaneSyrk::<T, K, W>::new();
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let vals = lanes::load_rows::<T, K, W, false>(f, r0, n);
        let mut sp = [1.0; W];
        sp[..n].copy_from_slice(&sqrt_psi[r0..r0 + n]);
        lanes::accumulate_gram::<T, K, W>(&vals, &sp, &mut s);
        r0 += W;
    }
    lanes::fold_gram::<T, K, W>(&mut s, gram);
}

/// Compile `$kernel` (an `#[inline(always)]` block kernel generic over T, K, W and AVX, which says whether the
/// rows may be moved by AVX instructions) for each code path: `$portable` without target features, `$avx2` and
/// `$avx512` with them enabled.
macro_rules! code_paths {
    ($kernel:ident, $portable:ident, $avx2:ident, $avx512:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        fn $portable<T: Real, const K: usize, const W: usize>($($arg: $ty),*) -> $ret {
            $kernel::<T, K, W, false>($($arg),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        unsafe fn $avx2<T: Real, const K: usize, const W: usize>($($arg: $ty),*) -> $ret {
            $kernel::<T, K, W, true>($($arg),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512vl,avx2")]
        unsafe fn $avx512<T: Real, const K: usize, const W: usize>($($arg: $ty),*) -> $ret {
            $kernel::<T, K, W, true>($($arg),*)
        }
    };
}

/// Call the code path `$isa` of a kernel made by [`code_paths`] for K = `$k` with W = vector bytes / size of
/// T lanes (the portable path uses the AVX2 width, so the two agree bit for bit).
macro_rules! dispatch {
    ($isa:expr, $k:expr, $portable:ident, $avx2:ident, $avx512:ident, ($($arg:expr),*)) => {
        for_k!($k, K => {
            let f32_state = T::SINGLE;
            match ($isa, f32_state) {
                // SAFETY (both AVX arms): `Isa::Avx2` and `Isa::Avx512` are only constructed by `Isa::available`
                // after detecting the features they enable.
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx512, true) => unsafe { $avx512::<T, K, 16>($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx512, false) => unsafe { $avx512::<T, K, 8>($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx2, true) => unsafe { $avx2::<T, K, 8>($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx2, false) => unsafe { $avx2::<T, K, 4>($($arg),*) },
                (Isa::Portable, true) => $portable::<T, K, 8>($($arg),*),
                (Isa::Portable, false) => $portable::<T, K, 4>($($arg),*),
            }
        })
    };
}

pub(super) use {code_paths, dispatch};

code_paths!(update_block, update_portable, update_avx2, update_avx512,
    (p: &mut RowsMut<'_, T>, sqrt_psi: &mut [f64], moments: Option<&mut (RowsMut<'_, T>, RowsMut<'_, T>)>,
     draws: &Draws<'_>, consts: &StepConsts<'_>, gram: &mut [f64]) -> bool);
code_paths!(norms_block, norms_portable, norms_avx2, norms_avx512,
    (p: (&[T], &[T], &[T]), sqrt_psi: &[f64], draws: &Draws<'_>, m_inv: &[f64], alpha: f64) -> [f64; 3]);

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
    dispatch!(
        isa,
        consts.k,
        update_portable,
        update_avx2,
        update_avx512,
        (p, sqrt_psi, moments, draws, consts, gram)
    )
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
    dispatch!(
        isa,
        k,
        norms_portable,
        norms_avx2,
        norms_avx512,
        (p, sqrt_psi, draws, m_inv, alpha)
    )
}

/// [`gram_block`] for K = `k` ≤ [`MAX_K`] with the lanes of path `isa` (it runs once per restore; the
/// portable code with the same W gives the same bits as the step's kernel).
pub(super) fn run_gram_block<T: Real>(isa: Isa, k: usize, f: &[T], sqrt_psi: &[f64], gram: &mut [f64]) {
    for_k!(k, K => match isa.vector_bytes() / std::mem::size_of::<T>() {
        16 => gram_block::<T, K, 16>(f, sqrt_psi, gram),
        8 => gram_block::<T, K, 8>(f, sqrt_psi, gram),
        _ => gram_block::<T, K, 4>(f, sqrt_psi, gram),
    })
}
