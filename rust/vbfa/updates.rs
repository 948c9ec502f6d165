//! The mean-field coordinate updates of VB-FA (Luttinen & Ilin §2.1, course notes §3), one row (latent
//! vector h_n or data column d) at a time, in project notation: x_nd = f_dᵀ h_n + c_d + noise of precision
//! τ_d, h_n ~ N(0, I_K), c_d ~ N(0, 1/β), f_dk ~ N(0, 1/α_k), α_k ~ G(a_α, b_α), τ_d ~ G(a_τ, b_τ).
//! Every kernel is the exact maximiser of the bound over its factor with the others fixed, so each
//! update can only raise the bound. Batch and online VB-FA share them; they differ only in where the
//! column statistics come from (see `stats.rs`).

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis};
use rayon::prelude::*;

use super::dense::SmallSpd;
use super::special::GammaQ;
use crate::error::Result;

/// Below this much work (items × K³) the per-row loops stay on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// `f(i)` for i in 0..n, on rayon when `n·k³` is large; the results keep their order (deterministic).
pub(crate) fn map_rows<T, F>(n: usize, k: usize, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(usize) -> Result<T> + Sync + Send,
{
    let work = n.saturating_mul(k.saturating_mul(k).saturating_mul(k));
    if work >= PARALLEL_MIN_WORK && crate::fork::parallel_allowed() {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// A Gaussian factor N(mean, cov) of one K-vector with ln|cov|.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GaussianRow {
    /// Mean (K).
    pub(crate) mean: Array1<f64>,
    /// Covariance (K×K).
    pub(crate) cov: Array2<f64>,
    /// ln |cov|.
    pub(crate) log_det: f64,
}

/// N(Λ⁻¹ u, Λ⁻¹) from a precision Λ (K×K) and a natural mean u (K), by Cholesky.
pub(crate) fn gaussian_from_natural(
    precision: ArrayView2<f64>,
    u: ArrayView1<f64>,
    what: &'static str,
) -> Result<GaussianRow> {
    let factor = SmallSpd::new(precision, what)?;
    Ok(GaussianRow {
        mean: factor.solve(u),
        cov: factor.inverse(),
        log_det: -factor.log_det(),
    })
}

/// q(h_n) (Luttinen & Ilin §2.1, first two lines; course notes K_n, μ_n):
/// Λ_n = I + Σ_{d∈O_n} ⟨τ_d⟩ ⟨f_d f_dᵀ⟩, h̄_n = Λ_n⁻¹ Σ_{d∈O_n} ⟨τ_d⟩ f̄_d (x_nd − c̄_d), Σ_{h_n} = Λ_n⁻¹.
///
/// `weighted_total` = Σ_d ⟨τ_d⟩⟨f_d f_dᵀ⟩ over all D columns (K×K), `weighted_rows[d]` its terms
/// (D×K×K), `missing` = M_n, `u` = the natural mean (K, computed by one GEMM for all rows). The sum over
/// O_n is formed as the total minus the missing terms, or directly when most of the row is missing.
pub(crate) fn latent_row(
    weighted_total: ArrayView2<f64>,
    weighted_rows: ndarray::ArrayView3<f64>,
    missing: &[usize],
    u: ArrayView1<f64>,
) -> Result<GaussianRow> {
    let k = u.len();
    let d_all = weighted_rows.len_of(Axis(0));
    let mut precision = Array2::<f64>::eye(k);
    if 2 * missing.len() <= d_all {
        precision += &weighted_total;
        for &d in missing {
            precision -= &weighted_rows.index_axis(Axis(0), d);
        }
    } else {
        let mut is_missing = vec![false; d_all];
        missing.iter().for_each(|&d| is_missing[d] = true);
        for d in (0..d_all).filter(|&d| !is_missing[d]) {
            precision += &weighted_rows.index_axis(Axis(0), d);
        }
    }
    gaussian_from_natural(precision.view(), u, "latent precision I + Σ_d ⟨τ_d⟩⟨f_d f_dᵀ⟩")
}

/// q(c_d) (§2.1, μ lines): c̃_d = 1/(β + n_d⟨τ_d⟩), c̄_d = c̃_d ⟨τ_d⟩ (Σ_{n∈O_d} x_nd − f̄_dᵀ m_d),
/// m_d = Σ_{n∈O_d} h̄_n. Returns (c̄_d, c̃_d).
pub(crate) fn bias_row(
    count: f64,
    sum_x: f64,
    sum_h: ArrayView1<f64>,
    f_mean: ArrayView1<f64>,
    tau: f64,
    beta: f64,
) -> (f64, f64) {
    let var = 1.0 / (beta + count * tau);
    (var * tau * (sum_x - f_mean.dot(&sum_h)), var)
}

/// q(f_d) (§2.1, w lines; course notes K_d, μ_d): Λ_d = diag⟨α⟩ + ⟨τ_d⟩ G_d,
/// f̄_d = Λ_d⁻¹ ⟨τ_d⟩ (p_d − c̄_d m_d), Σ_{f_d} = Λ_d⁻¹, with G_d = Σ_{O_d}⟨h hᵀ⟩, p_d = Σ_{O_d} x_nd h̄_n.
pub(crate) fn loading_row(
    gram: ArrayView2<f64>,
    sum_xh: ArrayView1<f64>,
    sum_h: ArrayView1<f64>,
    c_mean: f64,
    tau: f64,
    alpha_means: ArrayView1<f64>,
) -> Result<GaussianRow> {
    let mut precision = &gram * tau;
    precision.diag_mut().zip_mut_with(&alpha_means, |p, &a| *p += a);
    let u = (&sum_xh - &(&sum_h * c_mean)) * tau;
    gaussian_from_natural(
        precision.view(),
        u.view(),
        "loading precision diag⟨α⟩ + ⟨τ_d⟩ Σ_n⟨h hᵀ⟩",
    )
}

/// The per-column inputs of the expected squared error.
pub(crate) struct ColumnMoments<'a> {
    /// n_d.
    pub(crate) count: f64,
    /// Σ_{O_d} x_nd.
    pub(crate) sum_x: f64,
    /// Σ_{O_d} x_nd².
    pub(crate) sum_xx: f64,
    /// m_d = Σ_{O_d} h̄_n.
    pub(crate) sum_h: ArrayView1<'a, f64>,
    /// p_d = Σ_{O_d} x_nd h̄_n.
    pub(crate) sum_xh: ArrayView1<'a, f64>,
    /// G_d = Σ_{O_d} ⟨h_n h_nᵀ⟩.
    pub(crate) gram: ArrayView2<'a, f64>,
}

/// E_d = Σ_{n∈O_d} ⟨(x_nd − f_dᵀ h_n − c_d)²⟩
///     = Σx² − 2 c̄ Σx + n_d (c̄² + c̃) − 2 f̄ᵀ (p_d − c̄ m_d) + f̄ᵀ G_d f̄ + tr(Σ_f G_d)
/// (README "Full ELBO of VB-FA": e_mn summed over n; tr(⟨f fᵀ⟩ G_d) = f̄ᵀ G_d f̄ + tr(Σ_f G_d)).
/// Clamped at 0 against rounding (it is ≥ n_d c̃_d > 0 in exact arithmetic).
pub(crate) fn expected_squared_error(
    col: &ColumnMoments<'_>,
    c_mean: f64,
    c_var: f64,
    f_mean: ArrayView1<f64>,
    f_cov: ArrayView2<f64>,
) -> f64 {
    let cross = f_mean.dot(&(&col.sum_xh - &(&col.sum_h * c_mean)));
    let quad = f_mean.dot(&col.gram.dot(&f_mean));
    let trace: f64 = (&f_cov * &col.gram).sum();
    let e = col.sum_xx - 2.0 * c_mean * col.sum_x + col.count * (c_mean * c_mean + c_var) - 2.0 * cross + quad + trace;
    e.max(0.0)
}

/// q(τ_d) (§2.1, τ lines): G(a_τ + n_d/2, b_τ + E_d/2).
pub(crate) fn noise_row(count: f64, sq_error: f64, prior_shape: f64, prior_rate: f64) -> GammaQ {
    GammaQ {
        shape: prior_shape + 0.5 * count,
        rate: prior_rate + 0.5 * sq_error,
    }
}

/// q(α_k) (§2.1, α lines): G(a_α + D/2, b_α + ½ Σ_d ⟨f_dk²⟩) from diag⟨FᵀF⟩ (K).
pub(crate) fn ard_factors(
    loading_gram_diag: ArrayView1<f64>,
    n_cols: f64,
    prior_shape: f64,
    prior_rate: f64,
) -> Vec<GammaQ> {
    loading_gram_diag
        .iter()
        .map(|&w| GammaQ {
            shape: prior_shape + 0.5 * n_cols,
            rate: prior_rate + 0.5 * w,
        })
        .collect()
}

/// ⟨f fᵀ⟩ = f̄ f̄ᵀ + Σ_f (K×K).
pub(crate) fn second_moment(mean: ArrayView1<f64>, cov: ArrayView2<f64>) -> Array2<f64> {
    let col = mean.insert_axis(Axis(1));
    &col.dot(&col.t()) + &cov
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn squared_error_matches_direct_expectation_for_point_masses() {
        // With Σ_f = 0, c̃ = 0 and point-mass latents (Σ_h = 0), E_d is the plain residual sum of squares.
        let h = array![[1.0, 2.0], [0.5, -1.0], [-2.0, 0.0]];
        let x = array![3.0, -1.0, 0.5];
        let f = array![0.7, 1.1];
        let c = 0.2;
        let (sum_h, sum_xh, gram) = (h.sum_axis(Axis(0)), h.t().dot(&x), h.t().dot(&h));
        let col = ColumnMoments {
            count: 3.0,
            sum_x: x.sum(),
            sum_xx: x.dot(&x),
            sum_h: sum_h.view(),
            sum_xh: sum_xh.view(),
            gram: gram.view(),
        };
        let residual = &x - &h.dot(&f) - c;
        let e = expected_squared_error(&col, c, 0.0, f.view(), Array2::zeros((2, 2)).view());
        assert!((e - residual.dot(&residual)).abs() < 1e-12);
        // A bias variance c̃ adds n_d c̃; a loading covariance adds tr(Σ_f G_d).
        let cov = array![[0.1, 0.02], [0.02, 0.3]];
        let e2 = expected_squared_error(&col, c, 0.05, f.view(), cov.view());
        let extra = 3.0 * 0.05 + (&cov * &gram).sum();
        assert!((e2 - e - extra).abs() < 1e-12);
    }

    #[test]
    fn loading_row_solves_the_regularised_normal_equations() {
        let gram = array![[4.0, 1.0], [1.0, 3.0]];
        let sum_xh = array![2.0, -1.0];
        let sum_h = array![0.5, 0.25];
        let alpha = array![0.5, 2.0];
        let row = loading_row(gram.view(), sum_xh.view(), sum_h.view(), 0.4, 1.5, alpha.view()).expect("spd");
        let precision = &gram * 1.5 + &Array2::from_diag(&alpha);
        let residual = precision.dot(&row.mean) - (&sum_xh - &(&sum_h * 0.4)) * 1.5;
        assert!(residual.iter().all(|v| v.abs() < 1e-12));
        let identity = precision.dot(&row.cov);
        assert!((identity - Array2::<f64>::eye(2)).iter().all(|v| v.abs() < 1e-12));
    }
}
