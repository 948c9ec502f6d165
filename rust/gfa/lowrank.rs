//! The low-rank ARD of the GFA notes: log α = U Vᵀ + μ_u 1ᵀ + 1 μ_vᵀ (U: M×R, V: K×R, μ_u: M, μ_v: K),
//! u_mr, v_kr ~ N(0, 1/λ), point estimates (q(U), q(V) are deltas) found by L-BFGS on the notes'
//! objective with their errata applied (−λ, not −2λ, in front of the norms):
//!
//! L(U, V, μ_u, μ_v) = Σ_{m,k} (D_m ln α_mk − B_mk α_mk) − λ(‖U‖_F² + ‖V‖_F²),   B_mk = Σ_{d∈m} ⟨f_dk²⟩,
//! ∇_U = A V − 2λU,  ∇_V = Aᵀ U − 2λV,  ∇_μu = A 1,  ∇_μv = Aᵀ 1,   A = D 1ᵀ − B ∘ α.
//!
//! L is twice the part of the bound that depends on (U, V, μ): ½ Σ (D_m ln α − B α) + ln p(U) + ln p(V)
//! up to constants, so every L-BFGS step (accepted only when it raises L) raises the bound.

use nalgebra::DMatrix;
use ndarray::{Array2, ArrayView2};

use super::lbfgs::maximise;
use crate::init::fill_standard_normal;

/// Maximum number of L-BFGS iterations per q(α) update.
const MAX_ITER: usize = 500;

/// The low-rank ARD parameters, packed as one column (U by rows, V by rows, μ_u, μ_v).
#[derive(Debug, Clone, PartialEq)]
pub struct LowRankArd {
    x: DMatrix<f64>,
    m: usize,
    k: usize,
    r: usize,
    /// λ, the precision of the prior of U and V.
    pub lambda: f64,
}

impl LowRankArd {
    /// U, V ~ N(0, 0.01) (seeded; U = V = 0 is a saddle point), μ_u = 0, μ_v = 0.
    pub fn new(m: usize, k: usize, r: usize, lambda: f64, seed: u64) -> Self {
        let mut noise = Array2::zeros(((m + k) * r, 1));
        fill_standard_normal(noise.view_mut(), seed);
        let mut x = DMatrix::zeros((m + k) * r + m + k, 1);
        for i in 0..(m + k) * r {
            x[i] = 0.1 * noise[[i, 0]];
        }
        LowRankArd { x, m, k, r, lambda }
    }

    fn unpack(&self, x: &DMatrix<f64>) -> (DMatrix<f64>, DMatrix<f64>, DMatrix<f64>, DMatrix<f64>) {
        let (m, k, r) = (self.m, self.k, self.r);
        let u = DMatrix::from_row_slice(m, r, &x.as_slice()[..m * r]);
        let v = DMatrix::from_row_slice(k, r, &x.as_slice()[m * r..(m + k) * r]);
        let mu_u = DMatrix::from_column_slice(m, 1, &x.as_slice()[(m + k) * r..(m + k) * r + m]);
        let mu_v = DMatrix::from_column_slice(k, 1, &x.as_slice()[(m + k) * r + m..]);
        (u, v, mu_u, mu_v)
    }

    fn pack(u: &DMatrix<f64>, v: &DMatrix<f64>, mu_u: &DMatrix<f64>, mu_v: &DMatrix<f64>) -> DMatrix<f64> {
        let mut out: Vec<f64> = u.transpose().as_slice().to_vec();
        out.extend_from_slice(v.transpose().as_slice());
        out.extend_from_slice(mu_u.as_slice());
        out.extend_from_slice(mu_v.as_slice());
        DMatrix::from_column_slice(out.len(), 1, &out)
    }

    fn log_alpha_of(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        let (u, v, mu_u, mu_v) = self.unpack(x);
        let mut log_alpha = &u * v.transpose();
        for i in 0..self.m {
            for j in 0..self.k {
                log_alpha[(i, j)] += mu_u[i] + mu_v[j];
            }
        }
        log_alpha
    }

    /// ln α (M×K).
    pub fn log_alpha(&self) -> Array2<f64> {
        let la = self.log_alpha_of(&self.x);
        Array2::from_shape_fn((self.m, self.k), |(i, j)| la[(i, j)])
    }

    /// (L, ∇L) at packed parameters `x` for the loading energies B (M×K) and group sizes D_m.
    fn objective(&self, x: &DMatrix<f64>, b: &DMatrix<f64>, sizes: &[f64]) -> Option<(f64, DMatrix<f64>)> {
        let (u, v, _, _) = self.unpack(x);
        let log_alpha = self.log_alpha_of(x);
        let mut a = DMatrix::zeros(self.m, self.k);
        let mut value = -self.lambda * (u.norm_squared() + v.norm_squared());
        for i in 0..self.m {
            for j in 0..self.k {
                let alpha = log_alpha[(i, j)].exp();
                value += sizes[i] * log_alpha[(i, j)] - b[(i, j)] * alpha;
                a[(i, j)] = sizes[i] - b[(i, j)] * alpha;
            }
        }
        if !value.is_finite() {
            return None;
        }
        let grad_u = &a * &v - &u * (2.0 * self.lambda);
        let grad_v = a.transpose() * &u - &v * (2.0 * self.lambda);
        let grad_mu_u = a.column_sum();
        let grad_mu_v = a.row_sum().transpose();
        let grad = Self::pack(
            &grad_u,
            &grad_v,
            &DMatrix::from_column_slice(self.m, 1, grad_mu_u.as_slice()),
            &DMatrix::from_column_slice(self.k, 1, grad_mu_v.as_slice()),
        );
        Some((value, grad))
    }

    /// Re-fit (U, V, μ) to the loading energies B (M×K) from the current values; returns the gain of L.
    pub fn fit(&mut self, b: ArrayView2<f64>, sizes: &[f64]) -> f64 {
        let b = DMatrix::from_fn(self.m, self.k, |i, j| b[[i, j]]);
        match maximise(self.x.clone(), |x| self.objective(x, &b, sizes), MAX_ITER) {
            Some((x, gain)) => {
                self.x = x;
                gain
            }
            None => 0.0,
        }
    }

    /// ln p(U) + ln p(V) = −λ/2 (‖U‖² + ‖V‖²) + (M + K) R/2 · ln(λ/2π).
    pub fn log_prior(&self) -> f64 {
        let (u, v, _, _) = self.unpack(&self.x);
        let count = ((self.m + self.k) * self.r) as f64;
        -0.5 * self.lambda * (u.norm_squared() + v.norm_squared())
            + 0.5 * count * (self.lambda / (2.0 * std::f64::consts::PI)).ln()
    }

    /// The packed parameters (U rows, V rows, μ_u, μ_v) and R, for checkpoints.
    pub(super) fn packed(&self) -> (&[f64], usize) {
        (self.x.as_slice(), self.r)
    }

    /// Rebuild from [`LowRankArd::packed`]'s output; None if the length is not (M + K) R + M + K.
    pub(super) fn from_packed(m: usize, k: usize, r: usize, lambda: f64, values: &[f64]) -> Option<Self> {
        ((m + k) * r + m + k == values.len()).then(|| LowRankArd {
            x: DMatrix::from_column_slice(values.len(), 1, values),
            m,
            k,
            r,
            lambda,
        })
    }

    /// Keep only the factors `keep` (rows of V and μ_v).
    pub fn select_factors(&mut self, keep: &[usize]) {
        let (u, v, mu_u, mu_v) = self.unpack(&self.x);
        let v = DMatrix::from_fn(keep.len(), self.r, |i, j| v[(keep[i], j)]);
        let mu_v = DMatrix::from_fn(keep.len(), 1, |i, _| mu_v[keep[i]]);
        self.k = keep.len();
        self.x = Self::pack(&u, &v, &mu_u, &mu_v);
    }

    /// The objective L and its gradient for tests (packed layout: U rows, V rows, μ_u, μ_v).
    #[cfg(test)]
    fn objective_at(&self, x: &[f64], b: &DMatrix<f64>, sizes: &[f64]) -> Option<(f64, Vec<f64>)> {
        self.objective(&DMatrix::from_column_slice(x.len(), 1, x), b, sizes)
            .map(|(v, g)| (v, g.as_slice().to_vec()))
    }
}

/// ln α of the full-rank point estimate D_m / B_mk (M×K), for comparisons.
pub fn full_rank_point_estimate(b: ArrayView2<f64>, sizes: &[f64]) -> Array2<f64> {
    Array2::from_shape_fn(b.dim(), |(m, k)| (sizes[m] / b[[m, k]]).ln())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn energies(m: usize, k: usize) -> DMatrix<f64> {
        let mut raw = Array2::zeros((m, k));
        fill_standard_normal(raw.view_mut(), 31);
        DMatrix::from_fn(m, k, |i, j| 0.5 + raw[[i, j]].abs() * 3.0)
    }

    #[test]
    fn gradient_matches_central_differences() {
        let (m, k, r) = (3, 5, 2);
        let model = LowRankArd::new(m, k, r, 0.1, 4);
        let b = energies(m, k);
        let sizes = [4.0, 7.0, 2.0];
        let x: Vec<f64> = model
            .x
            .as_slice()
            .iter()
            .enumerate()
            .map(|(i, v)| v + 0.05 * i as f64 / 10.0)
            .collect();
        let (_, grad) = model.objective_at(&x, &b, &sizes).expect("finite");
        let h = 1e-6;
        for i in 0..x.len() {
            let (mut up, mut down) = (x.clone(), x.clone());
            up[i] += h;
            down[i] -= h;
            let numeric = (model.objective_at(&up, &b, &sizes).expect("f").0
                - model.objective_at(&down, &b, &sizes).expect("f").0)
                / (2.0 * h);
            assert!(
                (numeric - grad[i]).abs() < 1e-5 * grad[i].abs().max(1.0),
                "{i}: {numeric} vs {}",
                grad[i]
            );
        }
    }

    #[test]
    fn full_rank_with_tiny_lambda_reaches_the_point_estimate() {
        // R = min(M, K) and λ → 0: the maximiser is α_mk = D_m / B_mk (the notes' full-rank solution).
        let (m, k) = (2, 4);
        let b = energies(m, k);
        let sizes = [5.0, 9.0];
        let mut model = LowRankArd::new(m, k, 2, 1e-8, 5);
        let b_nd = Array2::from_shape_fn((m, k), |(i, j)| b[(i, j)]);
        assert!(model.fit(b_nd.view(), &sizes) > 0.0);
        let target = full_rank_point_estimate(b_nd.view(), &sizes);
        assert!(
            (model.log_alpha() - &target).iter().all(|v| v.abs() < 1e-3),
            "{:?} vs {target:?}",
            model.log_alpha()
        );
    }
}
