//! Training draws θ = F h + c + ψ^{1/2} ⊙ z (4.50) with counter-based noise: draw j's h and z are
//! regenerated from (seed, j, row) alone, so the state keeps no noise and results do not depend on how
//! rows are split between threads or processes.

use ndarray::{Array1, Array2};

use super::fused::Kernel;
use super::sample_kernel::{run_theta_block, SampleRows};
use super::step::run_tasks;
use super::{Vifa, BLOCK_ROWS, TASK_ROWS};
use crate::engine::use_parallel;
use crate::error::{FaError, Result};
use crate::noise;
use crate::scalar::Real;

/// Salt that separates the draw key from the key of the seeded initial loadings (`init.rs`).
pub(super) const DRAW_SALT: u64 = 0x5649_4641_5f64_7261;

impl<T: Real> Vifa<T> {
    /// The first pending draw's index.
    pub(super) fn first_pending(&self) -> u64 {
        self.n_draws - self.n_pending as u64
    }

    /// Draw θ = F h + c + ψ^{1/2} ⊙ z (4.50; Algorithm 3 lines 5–7) and remember it for the next step.
    /// Error if L = `n_grad_samples` draws are already waiting for their step.
    pub fn sample(&mut self) -> Result<Array1<f64>> {
        self.m_inv()?;
        if self.n_pending >= self.config.n_grad_samples {
            return Err(FaError::CallOrder(format!(
                "{} draw(s) are already waiting for step() (n_grad_samples = {}); call step() with their \
                 gradients first",
                self.n_pending, self.config.n_grad_samples
            )));
        }
        let theta = self.theta(self.n_draws);
        self.n_draws += 1;
        self.n_pending += 1;
        Ok(theta)
    }

    /// θ of draw `draw` at the current parameters (D).
    pub(super) fn theta(&self, draw: u64) -> Array1<f64> {
        let (d, k) = (self.n_features, self.n_components);
        let h = latent_draw(self.seed, draw, k);
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
                fill_noise(self.seed, draw, self.row_offset + row0, &mut z[..nb]);
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
        let mut h = Array2::zeros((self.n_pending, k));
        let mut z = Array2::zeros((self.n_pending, d));
        for l in 0..self.n_pending {
            h.row_mut(l).assign(&latent_draw(self.seed, first + l as u64, k));
            let mut row = z.row_mut(l);
            let slice = row
                .as_slice_mut()
                .expect("rows of a standard-layout array are contiguous");
            for (b, blk) in slice.chunks_mut(BLOCK_ROWS).enumerate() {
                fill_noise(self.seed, first + l as u64, self.row_offset + b * BLOCK_ROWS, blk);
            }
        }
        (h, z)
    }

    /// h of the pending draws (L×K).
    pub(super) fn pending_latents(&self) -> Array2<f64> {
        let k = self.n_components;
        let first = self.first_pending();
        let mut h = Array2::zeros((self.n_pending, k));
        for (l, mut row) in h.rows_mut().into_iter().enumerate() {
            row.assign(&latent_draw(self.seed, first + l as u64, k));
        }
        h
    }
}

/// The key of the training draws of `seed` (counter-based noise, `crate::noise`).
pub(super) fn draw_key(seed: u64) -> u64 {
    seed ^ DRAW_SALT
}

/// h of draw `draw` (K standard normals).
pub(super) fn latent_draw(seed: u64, draw: u64, k: usize) -> Array1<f64> {
    noise::latent_draw(draw_key(seed), draw, k)
}

/// z of draw `draw` for the global features starting at `row0`, `out.len()` values.
pub(super) fn fill_noise(seed: u64, draw: u64, row0: usize, out: &mut [f64]) {
    noise::fill_noise(draw_key(seed), draw, row0, out)
}
