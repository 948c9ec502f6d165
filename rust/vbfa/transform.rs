//! The Luttinen–Ilin transformations of a factor model's latent space: translation (bias removal, their
//! §2.2.1 / App. A) and rotation (§2.2.2 / App. B–C), as a reusable component that works on K×K
//! statistics only.
//!
//! A factor model x = F h + c + noise is unchanged by h ← R⁻¹(h − b), F ← F R, c ← c + F b. The
//! transformations pick b and R to maximise the part of the variational bound (or, for point-estimated
//! loadings, of the EM free energy) that changes, given
//!
//! * `latent_gram`  S = Σ_n ⟨h_n h_nᵀ⟩ (K×K) over the N latent vectors, and N,
//! * `loading_gram` W = ⟨FᵀF⟩ = Σ_d ⟨f_d f_dᵀ⟩ (K×K) over the D loading rows, and D,
//! * how the loadings are treated ([`LoadingPrior`]).
//!
//! Users apply the result to their own state with the helpers of [`Rotation`]:
//! means h̄_n ← R⁻¹ h̄_n, covariances Σ_h ← R⁻¹ Σ_h R⁻ᵀ, rows f̄_d ← Rᵀ f̄_d, Σ_f ← Rᵀ Σ_f R.
//!
//! **Sharing with OnlineEM's whitening.** Online EM's H̄ = Σ + B̄ is (1/t) Σ_n ⟨h_n h_nᵀ⟩, so its
//! whitening step (R Rᵀ = H̄, F ← F R, Ā ← Ā R⁻ᵀ) is the [`LoadingPrior::PointEstimate`] rotation with
//! S = t H̄, N = t, up to the free orthogonal factor E: `optimal_rotation(t·H̄, t, FᵀF, D, PointEstimate)`
//! returns R = L E/√t with L the Cholesky factor of S, and E additionally rotates into the PCA basis
//! (orthogonal columns of F sorted by norm, the paper's §3). Either R leaves F H̄ Fᵀ unchanged.

use nalgebra::DMatrix;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use crate::error::{FaError, Result};
use crate::linalg::{lower_triangular_inverse, symmetric_eigen_desc, symmetrise, Rotation, SpdFactor};

/// How the loadings enter the bound, which decides the optimal rotation's scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadingPrior {
    /// Point-estimated F (EM / PX-EM, the paper's App. C): the bound terms that change are
    /// −½ tr(R⁻¹ S R⁻ᵀ) − N ln|R|, maximised by R Rᵀ = S/N.
    PointEstimate,
    /// q(F) Gaussian with a fixed prior f_dk ~ N(0, 1/α) (the "broad" prior): adds D ln|R| (entropy of
    /// q(F)) and −½ α Σ_k r_kᵀ W r_k.
    Fixed {
        /// Prior precision α > 0 of every loading.
        alpha: f64,
    },
    /// q(F) Gaussian with ARD precisions α_k ~ G(a, b) and q(α) re-optimised after the rotation (the
    /// paper's q*(α)): adds D ln|R| − (a + D/2) Σ_k ln(b + ½ r_kᵀ W r_k).
    Ard {
        /// Prior shape a ≥ 0.
        shape: f64,
        /// Prior rate b ≥ 0.
        rate: f64,
    },
}

/// The positive root of A s² + B s + C = 0 when there is exactly one (A ≥ 0, C ≤ 0), computed without
/// cancellation: s = (−B + √(B² − 4AC))/(2A) when B < 0, else s = −2C/(B + √(B² − 4AC)).
fn positive_root(a: f64, b: f64, c: f64) -> Option<f64> {
    let disc = b * b - 4.0 * a * c;
    if disc.is_nan() || disc < 0.0 {
        return None;
    }
    let sqrt_disc = disc.sqrt();
    let root = if b < 0.0 {
        (-b + sqrt_disc) / (2.0 * a)
    } else {
        -2.0 * c / (b + sqrt_disc)
    };
    (root.is_finite() && root > 0.0).then_some(root)
}

/// The optimal squared scale s of one whitened direction with loading-energy ε (see [`optimal_rotation`]):
/// the maximiser of h(s) = −1/(2s) + ½ c₁ ln s + prior(s ε), c₁ = D − N (−N for point estimates).
///
/// * point estimate: s = 1/N;
/// * fixed α:  α ε s² − (D − N) s − 1 = 0;
/// * ARD (a, b): (N + 2a) ε s² − (ε + 2b(D − N)) s − 2b = 0  (→ s = 1/N as a, b → 0, the paper's (12)).
fn optimal_scale(epsilon: f64, n: f64, d: f64, prior: LoadingPrior) -> Option<f64> {
    match prior {
        LoadingPrior::PointEstimate => Some(1.0 / n),
        LoadingPrior::Fixed { alpha } => positive_root(alpha * epsilon, -(d - n), -1.0),
        LoadingPrior::Ard { shape, rate } => positive_root(
            (n + 2.0 * shape) * epsilon,
            -(epsilon + 2.0 * rate * (d - n)),
            -2.0 * rate,
        ),
    }
}

/// The rotation that maximises the bound over all invertible R (shapes: S, W K×K; N, D counts).
///
/// The R-dependent part of the bound is
/// g(R) = −½ tr(R⁻¹ S R⁻ᵀ) + c₁ ln|det R| + prior(diag(Rᵀ W R)) (see [`rotation_objective`]).
/// Every stationary point makes both R⁻¹ S R⁻ᵀ and Rᵀ W R diagonal, so R = L E diag(√s) with
/// S = L Lᵀ (Cholesky), Lᵀ W L = E diag(ε) Eᵀ and one scalar problem per column for s_k (solved in
/// closed form by `optimal_scale`). Then (1/N) R⁻¹ S R⁻ᵀ = diag(1/(N s_k)) and Rᵀ W R = diag(s_k ε_k);
/// columns are ordered by decreasing s_k ε_k (the paper's (16)–(17)). With a, b → 0 (ARD) this is exactly
/// the paper's R = U Λ V of (12)–(13); with a, b > 0 the whitening is corrected by the hyper-parameters
/// (visible only for components whose loadings have almost been pruned).
pub fn optimal_rotation(
    latent_gram: ArrayView2<f64>,
    n_rows: f64,
    loading_gram: ArrayView2<f64>,
    n_cols: f64,
    prior: LoadingPrior,
) -> Result<Rotation> {
    let k = latent_gram.nrows();
    let l = SpdFactor::new(latent_gram, "latent second moment Σ_n⟨h hᵀ⟩")?.lower();
    let l_inv = lower_triangular_inverse(l.view())?;
    let whitened_w = symmetrise(l.t().dot(&loading_gram).dot(&l));
    let (eps, e) = symmetric_eigen_desc(whitened_w.view());
    let mut columns: Vec<(f64, f64, usize)> = Vec::with_capacity(k); // (s ε, s, index)
    for (j, &epsilon) in eps.iter().enumerate() {
        let epsilon = epsilon.max(0.0);
        let s = optimal_scale(epsilon, n_rows, n_cols, prior).ok_or(FaError::NotPositiveDefinite(
            "the rotation objective (it has no maximum)",
        ))?;
        columns.push((s * epsilon, s, j));
    }
    columns.sort_by(|x, y| y.0.total_cmp(&x.0));
    let le = l.dot(&e);
    let e_t_l_inv = e.t().dot(&l_inv);
    let mut r = Array2::zeros((k, k));
    let mut r_inv = Array2::zeros((k, k));
    let mut log_abs_det = l.diag().iter().map(|v| v.ln()).sum::<f64>();
    for (col, &(_, s, j)) in columns.iter().enumerate() {
        let root = s.sqrt();
        r.column_mut(col).assign(&(&le.column(j) * root));
        r_inv.row_mut(col).assign(&(&e_t_l_inv.row(j) / root));
        log_abs_det += 0.5 * s.ln();
    }
    Ok(Rotation { r, r_inv, log_abs_det })
}

/// g(R) = −½ tr(R⁻¹ S R⁻ᵀ) + c₁ ln|det R| + prior(diag(Rᵀ W R)) for any invertible R, with
/// c₁ = D − N (N for point estimates, c₁ = −N) and prior = 0, −½ α Σ_k w_k or −(a + D/2) Σ_k ln(b + ½ w_k),
/// w = diag(Rᵀ W R). g(R) − g(I) is the change of the bound caused by the rotation (for the ARD prior,
/// including the re-optimised q(α)). Used by the tests and as a diagnostic.
pub fn rotation_objective(
    r: ArrayView2<f64>,
    latent_gram: ArrayView2<f64>,
    n_rows: f64,
    loading_gram: ArrayView2<f64>,
    n_cols: f64,
    prior: LoadingPrior,
) -> Result<f64> {
    let k = r.nrows();
    let rm = DMatrix::from_fn(k, k, |i, j| r[[i, j]]);
    let lu = rm.clone().lu();
    let det = lu.determinant();
    let r_inv = lu
        .try_inverse()
        .ok_or(FaError::NotPositiveDefinite("rotation matrix"))?;
    let sm = DMatrix::from_fn(k, k, |i, j| latent_gram[[i, j]]);
    let wm = DMatrix::from_fn(k, k, |i, j| loading_gram[[i, j]]);
    let trace_term = -0.5 * (&r_inv * sm * r_inv.transpose()).trace();
    let w_diag = (rm.transpose() * wm * &rm).diagonal();
    let (c1, prior_term) = match prior {
        LoadingPrior::PointEstimate => (-n_rows, 0.0),
        LoadingPrior::Fixed { alpha } => (n_cols - n_rows, -0.5 * alpha * w_diag.sum()),
        LoadingPrior::Ard { shape, rate } => (
            n_cols - n_rows,
            -(shape + 0.5 * n_cols) * w_diag.iter().map(|w| (rate + 0.5 * w).ln()).sum::<f64>(),
        ),
    };
    Ok(trace_term + c1 * det.abs().ln() + prior_term)
}

/// The approximate translation of the paper (§2.2.1, App. A): b = (1/N) Σ_n h̄_n.
pub fn mean_translation(latent_sum: ArrayView1<f64>, n_rows: f64) -> Array1<f64> {
    &latent_sum / n_rows
}

/// The exact translation (App. A, eq. (18), plus the prior of the bias): the maximiser of the quadratic
/// Q(b) = bᵀ v − ½ bᵀ P b, with
/// P = Σ_n Ψ_n + β Σ_d f̄_d f̄_dᵀ, v = Σ_n Ψ_n h̄_n − β Σ_d c̄_d f̄_d and Ψ_n = I + Σ_{d∈O_n} ⟨τ_d⟩ Σ_{f_d}
/// (per-dimension precisions: the paper's App. A writes a scalar ⟨τ⟩).
#[derive(Debug, Clone, PartialEq)]
pub struct TranslationSystem {
    /// P (K×K, symmetric positive definite).
    pub precision: Array2<f64>,
    /// v (K).
    pub rhs: Array1<f64>,
}

impl TranslationSystem {
    /// b = P⁻¹ v.
    pub fn solve(&self) -> Result<Array1<f64>> {
        Ok(SpdFactor::new(self.precision.view(), "translation system Σ_n Ψ_n")?.solve(self.rhs.view()))
    }

    /// Q(b) − Q(0) = bᵀ v − ½ bᵀ P b: the change of the bound caused by translating by b.
    pub fn gain(&self, b: ArrayView1<f64>) -> f64 {
        b.dot(&self.rhs) - 0.5 * b.dot(&self.precision.dot(&b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::fill_standard_normal;
    use ndarray::Array2;

    fn random_spd(k: usize, seed: u64, scale: f64) -> Array2<f64> {
        let mut a = Array2::zeros((k, k + 3));
        fill_standard_normal(a.view_mut(), seed);
        a.dot(&a.t()) * scale + Array2::<f64>::eye(k) * 0.1
    }

    fn priors() -> [LoadingPrior; 4] {
        [
            LoadingPrior::PointEstimate,
            LoadingPrior::Fixed { alpha: 0.3 },
            LoadingPrior::Ard {
                shape: 1e-5,
                rate: 1e-5,
            },
            LoadingPrior::Ard { shape: 2.0, rate: 3.0 },
        ]
    }

    #[test]
    fn optimal_rotation_beats_identity_and_every_perturbation() {
        let k = 4;
        let s = random_spd(k, 1, 30.0);
        let w = random_spd(k, 2, 5.0);
        for prior in priors() {
            let rot = optimal_rotation(s.view(), 120.0, w.view(), 20.0, prior).expect("rotation");
            let best = rotation_objective(rot.r.view(), s.view(), 120.0, w.view(), 20.0, prior).expect("g");
            let at_identity =
                rotation_objective(Array2::eye(k).view(), s.view(), 120.0, w.view(), 20.0, prior).expect("g");
            assert!(best >= at_identity, "{prior:?}");
            for seed in 0..20 {
                let mut e = Array2::zeros((k, k));
                fill_standard_normal(e.view_mut(), 100 + seed);
                let perturbed = rot.r.dot(&(Array2::<f64>::eye(k) + e * 1e-3));
                let g = rotation_objective(perturbed.view(), s.view(), 120.0, w.view(), 20.0, prior).expect("g");
                assert!(g <= best + 1e-9 * best.abs(), "{prior:?}: perturbation improved g");
            }
            let identity = rot.r.dot(&rot.r_inv);
            assert!((identity - Array2::<f64>::eye(k)).iter().all(|v| v.abs() < 1e-10));
            assert!((rot.log_abs_det - log_abs_det_lu(&rot.r)).abs() < 1e-10);
        }
    }

    #[test]
    fn ard_rotation_with_vanishing_hyperparameters_is_the_papers_whitening() {
        // a, b → 0: (1/N) R⁻¹ S R⁻ᵀ = I and Rᵀ W R diagonal with decreasing entries ((10), (11), (17)).
        let k = 5;
        let n = 200.0;
        let s = random_spd(k, 3, 40.0);
        let w = random_spd(k, 4, 2.0);
        let rot = optimal_rotation(s.view(), n, w.view(), 50.0, LoadingPrior::Ard { shape: 0.0, rate: 0.0 })
            .expect("rotation");
        let whitened = rot.latent_moment(s.view()) / n;
        let rotated_w = rot.loading_moment(w.view());
        for i in 0..k {
            for j in 0..k {
                let expected = if i == j { 1.0 } else { 0.0 };
                assert!((whitened[[i, j]] - expected).abs() < 1e-10);
                if i != j {
                    assert!(rotated_w[[i, j]].abs() < 1e-9 * rotated_w[[0, 0]]);
                }
            }
            if i > 0 {
                assert!(rotated_w[[i, i]] <= rotated_w[[i - 1, i - 1]]);
            }
        }
    }

    fn log_abs_det_lu(r: &Array2<f64>) -> f64 {
        let k = r.nrows();
        DMatrix::from_fn(k, k, |i, j| r[[i, j]]).determinant().abs().ln()
    }

    #[test]
    fn translation_system_solution_maximises_gain() {
        let p = random_spd(3, 5, 1.0);
        let v = ndarray::array![0.3, -1.0, 2.0];
        let sys = TranslationSystem { precision: p, rhs: v };
        let b = sys.solve().expect("spd");
        let best = sys.gain(b.view());
        assert!(best > 0.0);
        for delta in [ndarray::array![1e-3, 0.0, 0.0], ndarray::array![0.0, -1e-3, 1e-3]] {
            assert!(sys.gain((&b + &delta).view()) < best);
        }
    }
}
