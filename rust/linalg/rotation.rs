//! A rotation of a factor model's latent space and its inverse, with the helpers that apply it to
//! loadings, latent vectors and their second moments. K×K only.
//!
//! A factor model x = F h + c + noise is unchanged by h ← R⁻¹ h, F ← F R. Online EM's whitening step
//! (PX-EM) is the rotation R = L with L Lᵀ = H̄ (Cholesky), which makes the latent second moment the
//! identity; the Luttinen–Ilin transformations of VB-FA and group FA choose other R's and apply them with
//! the same helpers.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use super::lower_triangular_inverse;
use crate::error::Result;

/// A rotation R of the latent space with its inverse: h ← R⁻¹ h, F ← F R.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    /// R (K×K).
    pub r: Array2<f64>,
    /// R⁻¹ (K×K).
    pub r_inv: Array2<f64>,
    /// ln |det R|.
    pub log_abs_det: f64,
}

impl Rotation {
    /// The whitening rotation R = L of a latent second moment M = L Lᵀ (L lower-triangular, K×K, e.g. the
    /// Cholesky factor of OnlineEM's H̄ = Σ + B̄): afterwards R⁻¹ M R⁻ᵀ = I. This is OnlineEM's
    /// `whiten=True` step (PX-EM; the point-estimate rotation without the orthogonal factor E).
    pub fn whitening(lower: ArrayView2<f64>) -> Result<Self> {
        let r_inv = lower_triangular_inverse(lower)?;
        let log_abs_det = lower.diag().iter().map(|v| v.abs().ln()).sum();
        Ok(Rotation {
            r: lower.to_owned(),
            r_inv,
            log_abs_det,
        })
    }

    /// The row-major K×K matrix W = R⁻ᵀ that maps row vectors of a cross-moment with the latents, e.g.
    /// Ā = avg(d mᵀ) ← Ā W (D×K rows times W).
    pub fn cross_moment_map(&self) -> Array2<f64> {
        self.r_inv.t().as_standard_layout().into_owned()
    }

    /// Rows f̄_d ← Rᵀ f̄_d, i.e. F ← F R (D×K in, D×K out).
    pub fn loadings(&self, f: ArrayView2<f64>) -> Array2<f64> {
        f.dot(&self.r)
    }

    /// Rows h̄_n ← R⁻¹ h̄_n, i.e. H ← H R⁻ᵀ (N×K in, N×K out).
    pub fn latents(&self, h: ArrayView2<f64>) -> Array2<f64> {
        h.dot(&self.r_inv.t())
    }

    /// One latent vector h ← R⁻¹ h (K).
    pub fn latent(&self, h: ArrayView1<f64>) -> Array1<f64> {
        self.r_inv.dot(&h)
    }

    /// Σ_f ← Rᵀ Σ_f R for a K×K second moment of a loading row (or a sum of them, e.g. ⟨FᵀF⟩).
    pub fn loading_moment(&self, m: ArrayView2<f64>) -> Array2<f64> {
        symmetrise(self.r.t().dot(&m).dot(&self.r))
    }

    /// Σ_h ← R⁻¹ Σ_h R⁻ᵀ for a K×K second moment of a latent vector (or a sum of them).
    pub fn latent_moment(&self, m: ArrayView2<f64>) -> Array2<f64> {
        symmetrise(self.r_inv.dot(&m).dot(&self.r_inv.t()))
    }
}

/// (M + Mᵀ)/2.
pub(crate) fn symmetrise(m: Array2<f64>) -> Array2<f64> {
    (&m + &m.t()) * 0.5
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn whitening_maps_the_second_moment_to_the_identity() {
        // M = L Lᵀ with L lower-triangular; whitening by L gives R⁻¹ M R⁻ᵀ = I and ln|det R| = Σ ln|L_ii|.
        let lower = array![[2.0, 0.0, 0.0], [0.5, 1.5, 0.0], [-1.0, 0.25, 0.8]];
        let m = lower.dot(&lower.t());
        let rot = Rotation::whitening(lower.view()).expect("invertible");
        let whitened = rot.latent_moment(m.view());
        for ((i, j), v) in whitened.indexed_iter() {
            let expected = if i == j { 1.0 } else { 0.0 };
            assert!((v - expected).abs() < 1e-14, "({i}, {j}): {v}");
        }
        assert!((rot.log_abs_det - (2.0f64 * 1.5 * 0.8).ln()).abs() < 1e-14);
        // The model is unchanged: (F R)(R⁻¹ h) = F h, and Ā W with W = R⁻ᵀ maps a cross-moment d hᵀ.
        let f = array![[1.0, -2.0, 0.5], [0.3, 0.0, 4.0]];
        let h = array![0.7, -1.1, 2.0];
        let fh = f.dot(&h);
        let moved = rot.loadings(f.view()).dot(&rot.latent(h.view()));
        assert!(fh.iter().zip(moved.iter()).all(|(a, b)| (a - b).abs() < 1e-13));
        let d = array![[0.2], [-0.4]];
        let cross = d.dot(&h.view().insert_axis(ndarray::Axis(0)));
        let mapped = cross.dot(&rot.cross_moment_map());
        let expected = d.dot(&rot.latent(h.view()).view().insert_axis(ndarray::Axis(0)));
        assert!(mapped.iter().zip(expected.iter()).all(|(a, b)| (a - b).abs() < 1e-13));
    }

    #[test]
    fn a_singular_factor_is_an_error() {
        let lower = array![[1.0, 0.0], [3.0, 0.0]];
        assert!(Rotation::whitening(lower.view()).is_err());
    }
}
