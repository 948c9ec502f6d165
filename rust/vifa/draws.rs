//! Training draws θ = F h + c + ψ^{1/2} ⊙ z (4.50) with counter-based noise: draw j's h and z are
//! regenerated from (seed, j, row) alone, so the state keeps no noise and results do not depend on how
//! rows are split between threads or processes.
//!
//! For K ≤ `fused::MAX_K` a block of a draw (Algorithm 3, lines 5–7) runs vectorised across rows like the step
//! kernels (W rows at once, F as K lane-arrays), in f64 arithmetic whatever the storage type (the draw is
//! returned in f64 and equals the scalar loop bit for bit).
//!
//! Shapes: c, ψ^{1/2}, z and the output θ hold nb values, F is nb×K row-major, h holds K values. Per row
//! θ = (Σ_j f_j h_j, j ascending) + c + ψ^{1/2} z: the same operations in the same order as the scalar loop
//! of `Vifa::theta`, on every code path.

use ndarray::{Array1, Array2};

use super::fused::{code_paths, dispatch, for_k, Kernel};
use super::lanes;
use super::{fill_noise, latent_draw, Vifa, BLOCK_ROWS, TASK_ROWS};
use crate::engine::isa::Isa;
use crate::engine::{run_tasks, use_parallel};
use crate::error::Result;
use crate::scalar::Real;

impl<T: Real> Vifa<T> {
    /// The first pending draw's index.
    pub(super) fn first_pending(&self) -> u64 {
        self.kk_step.first_pending()
    }

    /// Draw θ = F h + c + ψ^{1/2} ⊙ z (4.50; Algorithm 3 lines 5–7) and remember it for the next step.
    /// Error if L = `n_grad_samples` draws are already waiting for their step.
    pub fn sample(&mut self) -> Result<Array1<f64>> {
        let mut next = self.kk_step.clone();
        let draw = next.begin_draw()?;
        let theta = self.theta(draw);
        self.kk_step = next;
        Ok(theta)
    }

    /// θ of draw `draw` at the current parameters (D).
    pub(super) fn theta(&self, draw: u64) -> Array1<f64> {
        let (d, k) = (self.n_features, self.n_components);
        let h = latent_draw(self.kk_step.seed, draw, k);
        let h_slice = h.as_slice().expect("a new vector is contiguous");
        let mut out = vec![0.0; d];
        let tasks: Vec<(usize, &mut [f64])> = out
            .chunks_mut(TASK_ROWS)
            .enumerate()
            .map(|(i, o)| (i * TASK_ROWS, o))
            .collect();
        run_tasks(tasks, use_parallel(d, k), |(lo, o): (usize, &mut [f64])| {
            let mut z = vec![0.0; BLOCK_ROWS];
            for (b, o_blk) in o.chunks_mut(BLOCK_ROWS).enumerate() {
                let row0 = lo + b * BLOCK_ROWS;
                let nb = o_blk.len();
                fill_noise(self.kk_step.seed, draw, self.kk_step.row_offset + row0, &mut z[..nb]);
                if let Kernel::Fused(isa) = self.kernel {
                    let rows = SampleRows {
                        c: &self.params.c[row0..row0 + nb],
                        f: &self.params.f[row0 * k..(row0 + nb) * k],
                        sqrt_psi: &self.sqrt_psi[row0..row0 + nb],
                    };
                    run_theta_block(isa, &rows, h_slice, &z[..nb], o_blk);
                    continue;
                }
                for (i, (t, z)) in o_blk.iter_mut().zip(z.iter()).enumerate() {
                    let r = row0 + i;
                    let f_row = &self.params.f[r * k..(r + 1) * k];
                    let fh: f64 = f_row.iter().zip(h.iter()).map(|(f, h)| f.to_f64() * h).sum();
                    *t = fh + self.params.c[r].to_f64() + self.sqrt_psi[r] * z;
                }
            }
        });
        Array1::from(out)
    }

    /// The noise (h, z) of the pending draws: h is n_pending×K, z is n_pending×D.
    pub fn pending_noise(&self) -> (Array2<f64>, Array2<f64>) {
        let (d, k) = (self.n_features, self.n_components);
        let first = self.first_pending();
        let mut h = Array2::zeros((self.kk_step.n_pending, k));
        let mut z = Array2::zeros((self.kk_step.n_pending, d));
        for l in 0..self.kk_step.n_pending {
            h.row_mut(l)
                .assign(&latent_draw(self.kk_step.seed, first + l as u64, k));
            let mut row = z.row_mut(l);
            let slice = row
                .as_slice_mut()
                .expect("rows of a standard-layout array are contiguous");
            for (b, blk) in slice.chunks_mut(BLOCK_ROWS).enumerate() {
                fill_noise(
                    self.kk_step.seed,
                    first + l as u64,
                    self.kk_step.row_offset + b * BLOCK_ROWS,
                    blk,
                );
            }
        }
        (h, z)
    }

    /// h of the pending draws (L×K).
    pub(super) fn pending_latents(&self) -> Array2<f64> {
        let k = self.n_components;
        let first = self.first_pending();
        let mut h = Array2::zeros((self.kk_step.n_pending, k));
        for (l, mut row) in h.rows_mut().into_iter().enumerate() {
            row.assign(&latent_draw(self.kk_step.seed, first + l as u64, k));
        }
        h
    }
}

/// One block's rows of the state (c, F, ψ^{1/2}).
pub(super) struct SampleRows<'a, T> {
    pub(super) c: &'a [T],
    pub(super) f: &'a [T],
    pub(super) sqrt_psi: &'a [f64],
}

#[inline(always)]
fn theta_block<T: Real, const K: usize, const W: usize, const AVX: bool>(
    rows: &SampleRows<'_, T>,
    h: &[f64],
    z: &[f64],
    out: &mut [f64],
) {
    let nb = out.len();
    let mut hk = [0.0; K];
    hk.copy_from_slice(&h[..K]);
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let f = lanes::load_rows::<T, K, W, AVX>(rows.f, r0, n);
        let c: [T; W] = lanes::load_values(rows.c, r0, n);
        let sp: [f64; W] = lanes::load_values(rows.sqrt_psi, r0, n);
        let zl: [f64; W] = lanes::load_values(z, r0, n);
        let mut fh = [-0.0; W];
        for j in 0..K {
            for l in 0..W {
                fh[l] += f[j][l].to_f64() * hk[j];
            }
        }
        let mut t = [0.0; W];
        for l in 0..W {
            t[l] = fh[l] + c[l].to_f64() + sp[l] * zl[l];
        }
        lanes::store_values(out, &t, r0, n);
        r0 += W;
    }
}

code_paths!(theta_block, theta_portable, theta_avx2, theta_avx512,
    (rows: &SampleRows<'_, T>, h: &[f64], z: &[f64], out: &mut [f64]) -> ());

/// θ of a block (K = `h.len()` ≤ `MAX_K`) on the path `isa`, written to `out` (nb values). Each lane does
/// the same f64 operations whatever W is, so every path gives the same bits.
pub(super) fn run_theta_block<T: Real>(isa: Isa, rows: &SampleRows<'_, T>, h: &[f64], z: &[f64], out: &mut [f64]) {
    dispatch!(
        isa,
        h.len(),
        theta_portable,
        theta_avx2,
        theta_avx512,
        (rows, h, z, out)
    )
}
