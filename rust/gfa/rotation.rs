//! The Luttinen–Ilin rotation generalised to groups: h_n ← R⁻¹ h_n, f_d ← Rᵀ f_d for every feature (all
//! groups share R), then q(α) re-optimised. With q(α_mk) = G(a_α + D_m/2, b_α + ½ (Rᵀ W_m R)_kk) the part
//! of the bound that depends on R is (S = Σ_n ⟨h_n h_nᵀ⟩, W_m = Σ_{d∈m} ⟨f_d f_dᵀ⟩, D = Σ_m D_m)
//!
//! f(R) = −½ tr(R⁻¹ S R⁻ᵀ) + (D − N) ln|det R| − Σ_m (a_α + D_m/2) Σ_k ln(b_α + ½ (Rᵀ W_m R)_kk),
//! ∇f(R) = R⁻ᵀ R⁻¹ S R⁻ᵀ + (D − N) R⁻ᵀ − Σ_m (a_α + D_m/2) W_m R diag(1 / (b_α + ½ diag(Rᵀ W_m R))).
//!
//! For one group it is VB-FA's ARD rotation objective (`crate::vbfa::rotation_objective`), maximised in
//! closed form; for M > 1 there is no closed form and it is maximised by L-BFGS from R = I. The
//! maximiser is accepted only if f(R) ≥ f(I), so the rotation never lowers the bound.

use nalgebra::DMatrix;
use ndarray::{Array2, ArrayView2};

use super::lbfgs::maximise;
use crate::error::{FaError, Result};
use crate::linalg::Rotation;

/// Maximum number of L-BFGS iterations per rotation.
const MAX_ITER: usize = 200;

/// The inputs of the rotation objective: S (K×K), N, the W_m (M of K×K), D_m, and the ARD prior (a, b).
#[derive(Debug, Clone)]
struct Problem {
    s: DMatrix<f64>,
    n_rows: f64,
    w: Vec<DMatrix<f64>>,
    sizes: Vec<f64>,
    shape: f64,
    rate: f64,
    /// Fixed point-estimated α (M×K, the low-rank ARD) instead of the re-optimised q(α).
    fixed_alpha: Option<DMatrix<f64>>,
}

fn to_na(a: ArrayView2<f64>) -> DMatrix<f64> {
    DMatrix::from_fn(a.nrows(), a.ncols(), |i, j| a[[i, j]])
}

fn to_nd(a: &DMatrix<f64>) -> Array2<f64> {
    Array2::from_shape_fn((a.nrows(), a.ncols()), |(i, j)| a[(i, j)])
}

impl Problem {
    fn new(s: ArrayView2<f64>, n_rows: f64, w: &[Array2<f64>], sizes: &[f64], shape: f64, rate: f64) -> Self {
        Problem {
            s: to_na(s),
            n_rows,
            w: w.iter().map(|m| to_na(m.view())).collect(),
            sizes: sizes.to_vec(),
            shape,
            rate,
            fixed_alpha: None,
        }
    }

    /// (f(R), ∇f(R)), or None when R is singular (f = −∞ there).
    fn eval(&self, r: &DMatrix<f64>) -> Option<(f64, DMatrix<f64>)> {
        let lu = r.clone().lu();
        let det = lu.determinant();
        if !(det.is_finite() && det != 0.0) {
            return None;
        }
        let r_inv = lu.try_inverse()?;
        let r_inv_t = r_inv.transpose();
        let d_total: f64 = self.sizes.iter().sum();
        let c1 = d_total - self.n_rows;
        let a = &r_inv * &self.s * &r_inv_t; // R⁻¹ S R⁻ᵀ
        let mut value = -0.5 * a.trace() + c1 * det.abs().ln();
        let mut grad = &r_inv_t * &a + &r_inv_t * c1;
        for (m, (w, &d_m)) in self.w.iter().zip(&self.sizes).enumerate() {
            let c_m = self.shape + 0.5 * d_m;
            let wr = w * r;
            for k in 0..r.ncols() {
                let energy = r.column(k).dot(&wr.column(k));
                if let Some(alpha) = &self.fixed_alpha {
                    // −½ α_mk (RᵀW_mR)_kk, gradient −α_mk W_m r_k.
                    value -= 0.5 * alpha[(m, k)] * energy;
                    let col = wr.column(k) * alpha[(m, k)];
                    let mut g = grad.column_mut(k);
                    g -= col;
                    continue;
                }
                let q = self.rate + 0.5 * energy;
                if q.is_nan() || q <= 0.0 {
                    return None;
                }
                value -= c_m * q.ln();
                let col = wr.column(k) * (c_m / q);
                let mut g = grad.column_mut(k);
                g -= col;
            }
        }
        value.is_finite().then_some((value, grad))
    }
}

/// f(R) of the module doc (shapes: R, S K×K; `loading_grams` M matrices W_m K×K; `group_sizes` D_m).
pub fn group_rotation_objective(
    r: ArrayView2<f64>,
    latent_gram: ArrayView2<f64>,
    n_rows: f64,
    loading_grams: &[Array2<f64>],
    group_sizes: &[f64],
    a_alpha: f64,
    b_alpha: f64,
) -> Result<f64> {
    let p = Problem::new(latent_gram, n_rows, loading_grams, group_sizes, a_alpha, b_alpha);
    p.eval(&to_na(r))
        .map(|(v, _)| v)
        .ok_or(FaError::NotPositiveDefinite("rotation matrix (singular)"))
}

/// ∇f(R) of the module doc (K×K).
pub fn group_rotation_gradient(
    r: ArrayView2<f64>,
    latent_gram: ArrayView2<f64>,
    n_rows: f64,
    loading_grams: &[Array2<f64>],
    group_sizes: &[f64],
    a_alpha: f64,
    b_alpha: f64,
) -> Result<Array2<f64>> {
    let p = Problem::new(latent_gram, n_rows, loading_grams, group_sizes, a_alpha, b_alpha);
    p.eval(&to_na(r))
        .map(|(_, g)| to_nd(&g))
        .ok_or(FaError::NotPositiveDefinite("rotation matrix (singular)"))
}

/// Maximise f(R) by L-BFGS from R = I (two-loop recursion, backtracking Armijo line search); returns the
/// rotation and the gain f(R) − f(I) ≥ 0 (R = I when no ascent step is found).
pub fn maximise_group_rotation(
    latent_gram: ArrayView2<f64>,
    n_rows: f64,
    loading_grams: &[Array2<f64>],
    group_sizes: &[f64],
    a_alpha: f64,
    b_alpha: f64,
) -> Result<(Rotation, f64)> {
    let p = Problem::new(latent_gram, n_rows, loading_grams, group_sizes, a_alpha, b_alpha);
    let k = latent_gram.nrows();
    let (r, gain) = maximise(DMatrix::identity(k, k), |r| p.eval(r), MAX_ITER)
        .ok_or(FaError::NotPositiveDefinite("the rotation objective at R = I"))?;
    rotation_from(r, gain)
}

/// The rotation with the ARD precisions held fixed at `alpha` (M×K; the low-rank ARD, whose α is a point
/// estimate): f(R) = −½ tr(R⁻¹SR⁻ᵀ) + (D − N) ln|det R| − ½ Σ_{m,k} α_mk (RᵀW_mR)_kk, maximised by L-BFGS
/// from R = I. Returns the rotation and the gain f(R) − f(I) ≥ 0.
pub fn maximise_group_rotation_fixed(
    latent_gram: ArrayView2<f64>,
    n_rows: f64,
    loading_grams: &[Array2<f64>],
    group_sizes: &[f64],
    alpha: ArrayView2<f64>,
) -> Result<(Rotation, f64)> {
    let mut p = Problem::new(latent_gram, n_rows, loading_grams, group_sizes, 0.0, 0.0);
    p.fixed_alpha = Some(to_na(alpha));
    let k = latent_gram.nrows();
    let (r, gain) = maximise(DMatrix::identity(k, k), |r| p.eval(r), MAX_ITER)
        .ok_or(FaError::NotPositiveDefinite("the rotation objective at R = I"))?;
    rotation_from(r, gain)
}

/// The [`Rotation`] of a matrix R (with R⁻¹ and ln|det R|), paired with `gain`.
fn rotation_from(r: DMatrix<f64>, gain: f64) -> Result<(Rotation, f64)> {
    let lu = r.clone().lu();
    let log_abs_det = lu.determinant().abs().ln();
    let r_inv = lu
        .try_inverse()
        .ok_or(FaError::NotPositiveDefinite("rotation matrix (singular)"))?;
    Ok((
        Rotation {
            r: to_nd(&r),
            r_inv: to_nd(&r_inv),
            log_abs_det,
        },
        gain,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::fill_standard_normal;
    use crate::vbfa::{optimal_rotation, rotation_objective, LoadingPrior};

    fn random_spd(k: usize, seed: u64, scale: f64) -> Array2<f64> {
        let mut a = Array2::zeros((k, k + 3));
        fill_standard_normal(a.view_mut(), seed);
        a.dot(&a.t()) * scale + Array2::<f64>::eye(k) * 0.1
    }

    #[test]
    fn one_group_equals_the_vbfa_objective_and_its_closed_form_maximum() {
        let (k, n, d) = (4, 50.0, 12.0);
        let s = random_spd(k, 1, 10.0);
        let w = random_spd(k, 2, 1.0);
        let (a, b) = (0.5, 2.0);
        let prior = LoadingPrior::Ard { shape: a, rate: b };
        let mut r = Array2::zeros((k, k));
        fill_standard_normal(r.view_mut(), 3);
        let ours = group_rotation_objective(r.view(), s.view(), n, std::slice::from_ref(&w), &[d], a, b).expect("f");
        let theirs = rotation_objective(r.view(), s.view(), n, w.view(), d, prior).expect("g");
        assert!((ours - theirs).abs() < 1e-10 * theirs.abs());
        let (rot, gain) = maximise_group_rotation(s.view(), n, std::slice::from_ref(&w), &[d], a, b).expect("max");
        let closed = optimal_rotation(s.view(), n, w.view(), d, prior).expect("closed");
        let at_identity = rotation_objective(Array2::eye(k).view(), s.view(), n, w.view(), d, prior).expect("g");
        let best = rotation_objective(closed.r.view(), s.view(), n, w.view(), d, prior).expect("g");
        assert!(
            (gain - (best - at_identity)).abs() < 1e-7 * best.abs(),
            "{gain} vs {}",
            best - at_identity
        );
        let reached = rotation_objective(rot.r.view(), s.view(), n, w.view(), d, prior).expect("g");
        assert!((reached - best).abs() < 1e-7 * best.abs());
    }

    #[test]
    fn gradient_matches_central_differences() {
        let (k, n) = (3, 40.0);
        let s = random_spd(k, 4, 8.0);
        let ws = vec![random_spd(k, 5, 1.0), random_spd(k, 6, 0.3), random_spd(k, 7, 2.0)];
        let sizes = [5.0, 9.0, 3.0];
        let mut r = Array2::<f64>::eye(k);
        let mut noise = Array2::zeros((k, k));
        fill_standard_normal(noise.view_mut(), 8);
        r += &(noise * 0.3);
        let grad = group_rotation_gradient(r.view(), s.view(), n, &ws, &sizes, 1e-3, 0.5).expect("g");
        let h = 1e-6;
        for i in 0..k {
            for j in 0..k {
                let (mut up, mut down) = (r.clone(), r.clone());
                up[[i, j]] += h;
                down[[i, j]] -= h;
                let fu = group_rotation_objective(up.view(), s.view(), n, &ws, &sizes, 1e-3, 0.5).expect("f");
                let fd = group_rotation_objective(down.view(), s.view(), n, &ws, &sizes, 1e-3, 0.5).expect("f");
                let numeric = (fu - fd) / (2.0 * h);
                assert!(
                    (numeric - grad[[i, j]]).abs() < 1e-5 * grad[[i, j]].abs().max(1.0),
                    "({i},{j})"
                );
            }
        }
    }

    #[test]
    fn several_groups_never_lose_and_reach_a_stationary_point() {
        let (k, n) = (5, 100.0);
        let s = random_spd(k, 9, 20.0);
        let ws = vec![random_spd(k, 10, 1.0), random_spd(k, 11, 0.5)];
        let sizes = [10.0, 20.0];
        let (rot, gain) = maximise_group_rotation(s.view(), n, &ws, &sizes, 1e-5, 1e-5).expect("max");
        assert!(gain > 0.0);
        let g = group_rotation_gradient(rot.r.view(), s.view(), n, &ws, &sizes, 1e-5, 1e-5).expect("g");
        // Scale-free stationarity: ∇f(R) Rᵀ (the gradient in the tangent space at R) is ~0.
        let tangent = g.dot(&rot.r.t());
        assert!(tangent.iter().all(|v| v.abs() < 1e-4 * n), "{tangent:?}");
        assert!((rot.r.dot(&rot.r_inv) - Array2::<f64>::eye(k))
            .iter()
            .all(|v| v.abs() < 1e-9));
    }
}
