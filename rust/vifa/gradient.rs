//! The gradient of the negative ELBO for one block of rows (4.42–4.61), and the block's share of
//! B = Fᵀ Ψ⁻¹ F (Algorithm 3, line 11).

use ndarray::{s, Array2, ArrayView2};

use super::fill_noise;
use super::params::Params;
use super::products::Products;
use super::{Vifa, BLOCK_ROWS};
use crate::engine::isa::Isa;
use crate::engine::tiled::Tiled;
use crate::scalar::Real;

/// Everything the gradient of one block needs besides its rows.
pub(super) struct GradCtx<'a, X> {
    pub(super) k: usize,
    pub(super) seed: u64,
    pub(super) first_draw: u64,
    /// h of the L draws (L×K).
    pub(super) h: ArrayView2<'a, f64>,
    /// g_l = ∇θ NLL at draw l (L×D).
    pub(super) grads: ArrayView2<'a, X>,
    /// (I + B)⁻¹ (K×K), and tiled for the blocked path's products.
    pub(super) m_inv: ArrayView2<'a, f64>,
    pub(super) m_inv_tiled: Tiled,
    pub(super) alpha: f64,
    /// Global index of row 0 (for the noise).
    pub(super) row_offset: usize,
}

impl<T: Real> Vifa<T> {
    pub(super) fn grad_ctx<'a, X: Real>(
        &self,
        h: ArrayView2<'a, f64>,
        grads: ArrayView2<'a, X>,
        m_inv: ArrayView2<'a, f64>,
    ) -> GradCtx<'a, X> {
        GradCtx {
            k: self.n_components,
            seed: self.kk_step.seed,
            first_draw: self.first_pending(),
            h,
            grads,
            m_inv_tiled: Tiled::new(self.n_components, &m_inv.iter().copied().collect::<Vec<f64>>()),
            m_inv,
            alpha: self.kk_step.config.prior_precision,
            row_offset: self.kk_step.row_offset,
        }
    }
}

/// One block of rows in f64 (vectors hold BLOCK_ROWS values, matrices BLOCK_ROWS×K row-major), and the padded
/// buffers of the block's K×K products.
pub(super) struct Scratch {
    pub(super) k: usize,
    pub(super) c: Vec<f64>,
    pub(super) beta: Vec<f64>,
    pub(super) psi: Vec<f64>,
    pub(super) sqrt_psi: Vec<f64>,
    pub(super) z: Vec<f64>,
    pub(super) g_mean: Vec<f64>,
    pub(super) gz: Vec<f64>,
    pub(super) grad_c: Vec<f64>,
    pub(super) grad_b: Vec<f64>,
    pub(super) f: Vec<f64>,
    pub(super) a: Vec<f64>,
    pub(super) cr: Vec<f64>,
    pub(super) gh: Vec<f64>,
    pub(super) grad_f: Vec<f64>,
    pub(super) products: Products,
}

impl Scratch {
    /// For state of type T (whose type the products compute in) on the products' code path `isa`.
    pub(super) fn new<T: Real>(k: usize, isa: Isa) -> Self {
        let v = || vec![0.0; BLOCK_ROWS];
        let m = || vec![0.0; BLOCK_ROWS * k];
        Scratch {
            k,
            c: v(),
            beta: v(),
            psi: v(),
            sqrt_psi: v(),
            z: v(),
            g_mean: v(),
            gz: v(),
            grad_c: v(),
            grad_b: v(),
            f: m(),
            a: m(),
            cr: m(),
            gh: m(),
            grad_f: m(),
            products: Products::new(k, isa, T::SINGLE),
        }
    }

    /// Load rows row0 … row0 + nb − 1 of the parameters.
    pub(super) fn load<T: Real>(&mut self, p: &Params<T>, row0: usize, nb: usize) {
        let k = self.k;
        self.load_rows(
            &p.c[row0..row0 + nb],
            &p.f[row0 * k..(row0 + nb) * k],
            &p.beta[row0..row0 + nb],
        );
    }

    #[inline(always)]
    pub(super) fn load_rows<T: Real>(&mut self, c: &[T], f: &[T], beta: &[T]) {
        for (dst, src) in self.c.iter_mut().zip(c) {
            *dst = src.to_f64();
        }
        for (dst, src) in self.f.iter_mut().zip(f) {
            *dst = src.to_f64();
        }
        for (dst, src) in self.beta.iter_mut().zip(beta) {
            *dst = src.to_f64();
        }
    }

    /// ψ^{1/2} = exp(β/2) and ψ = (ψ^{1/2})² for the loaded rows: one exp per row.
    #[inline(always)]
    pub(super) fn derive_noise(&mut self, nb: usize) {
        for ((psi, sqrt_psi), beta) in self.psi[..nb].iter_mut().zip(&mut self.sqrt_psi[..nb]).zip(&self.beta) {
            *sqrt_psi = (0.5 * beta).exp();
            *psi = *sqrt_psi * *sqrt_psi;
        }
    }
}

/// A = Ψ⁻¹ F (line 10) and gram += Aᵀ F, the block's share of B = Fᵀ Ψ⁻¹ F (line 11; upper triangle only,
/// see `products::mirror_upper`), for the loaded rows. Overwrites ψ, ψ^{1/2} and A. The same kernel serves
/// the step and `recompute_m_inv`, so a restored model has bit-identical (I + B)⁻¹.
#[inline(always)]
pub(super) fn accumulate_gram(s: &mut Scratch, nb: usize, gram: &mut Array2<f64>) {
    s.derive_noise(nb);
    scaled_rows(s, nb);
    let gram = gram.as_slice_mut().expect("gram is allocated contiguous");
    s.products.gram_upper_add(&s.a, &s.f, nb, gram);
}

/// A = Ψ⁻¹ F for the loaded rows (ψ already derived): one reciprocal per row.
#[inline(always)]
pub(super) fn scaled_rows(s: &mut Scratch, nb: usize) {
    let k = s.k;
    for ((a_row, f_row), psi) in s.a[..nb * k].chunks_exact_mut(k).zip(s.f.chunks_exact(k)).zip(&s.psi) {
        let inv_psi = 1.0 / psi;
        for (a, f) in a_row.iter_mut().zip(f_row) {
            *a = f * inv_psi;
        }
    }
}

/// Gradient of the negative ELBO for the loaded rows (global rows row0 …), into grad_c, grad_f, grad_b:
///
/// ```text
///   ∇c = α c + ḡ                                             (4.42, 4.47, 4.51; line 9)
///   ∇F = −A (I + B)⁻¹ + α F + mean_l g_l h_lᵀ                (4.55, 4.48, 4.52; lines 12–14)
///   ∇β = −½ + ½ ψ ⊙ rowsum(C ⊙ A) + ½ α ψ
///        + ½ ψ^{1/2} ⊙ mean_l g_l ⊙ z_l                      (4.59, 4.60, 4.61; lines 15–16)
/// ```
///
/// with A = Ψ⁻¹ F, C = A (I + B)⁻¹ and ḡ = mean_l g_l. Line 13's −A + C Bᵀ equals −C exactly, because
/// (I + B)⁻¹ B = I − (I + B)⁻¹ (i.e. (F Fᵀ + Ψ)⁻¹ F = Ψ⁻¹ F (I + B)⁻¹); −C avoids the cancellation.
#[inline(always)]
pub(super) fn block_gradients<X: Real>(ctx: &GradCtx<X>, s: &mut Scratch, row0: usize, nb: usize) {
    let k = ctx.k;
    s.derive_noise(nb);
    scaled_rows(s, nb);
    // Line 12: C = A (I + B)⁻¹, this block's rows (nb×K times K×K).
    s.products.times(&s.a, &ctx.m_inv_tiled, &mut s.cr, nb);
    likelihood_terms(ctx, s, row0, nb);
    let alpha = ctx.alpha;
    for i in 0..nb {
        s.grad_c[i] = alpha * s.c[i] + s.g_mean[i];
        let span = i * k..(i + 1) * k;
        let (f, a, cr, gh) = (
            &s.f[span.clone()],
            &s.a[span.clone()],
            &s.cr[span.clone()],
            &s.gh[span.clone()],
        );
        for (j, g) in s.grad_f[span].iter_mut().enumerate() {
            *g = -cr[j] + alpha * f[j] + gh[j];
        }
        let c_dot_a = dot(cr, a);
        let psi = s.psi[i];
        s.grad_b[i] = -0.5 + 0.5 * psi * c_dot_a + 0.5 * alpha * psi + 0.5 * s.sqrt_psi[i] * s.gz[i];
    }
}

/// a·b in four partial sums over j ≡ 0, 1, 2, 3 (mod 4), added in that order (a fixed order whose four
/// independent chains pipeline, where one chain of K dependent additions would not).
#[inline(always)]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (a4, b4) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = a4.remainder().iter().zip(b4.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a4.zip(b4) {
        for l in 0..4 {
            acc[l] += x[l] * y[l];
        }
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + tail
}

/// The reparameterised likelihood terms averaged over the L draws: ḡ, mean g hᵀ, mean g ⊙ z.
#[inline(always)]
pub(super) fn likelihood_terms<X: Real>(ctx: &GradCtx<X>, s: &mut Scratch, row0: usize, nb: usize) {
    let k = ctx.k;
    let n_draws = ctx.grads.nrows();
    s.g_mean[..nb].fill(0.0);
    s.gz[..nb].fill(0.0);
    s.gh[..nb * k].fill(0.0);
    for l in 0..n_draws {
        fill_noise(
            ctx.seed,
            ctx.first_draw + l as u64,
            ctx.row_offset + row0,
            &mut s.z[..nb],
        );
        let h_row = ctx.h.row(l);
        let h_owned;
        let h: &[f64] = match h_row.as_slice() {
            Some(h) => h,
            None => {
                h_owned = h_row.to_vec();
                &h_owned
            }
        };
        let g_block = ctx.grads.row(l).slice_move(s![row0..row0 + nb]);
        let per_row = s.g_mean[..nb]
            .iter_mut()
            .zip(&mut s.gz[..nb])
            .zip(s.gh[..nb * k].chunks_exact_mut(k));
        for (((g_sum, gz), gh_row), (g, z)) in per_row.zip(g_block.iter().zip(&s.z)) {
            let g = g.to_f64();
            *g_sum += g;
            *gz += g * z;
            for (gh, h) in gh_row.iter_mut().zip(h) {
                *gh += g * h;
            }
        }
    }
    let inv_l = 1.0 / n_draws as f64;
    for buf in [&mut s.g_mean[..nb], &mut s.gz[..nb], &mut s.gh[..nb * k]] {
        for v in buf.iter_mut() {
            *v *= inv_l;
        }
    }
}
