//! Queries of a fitted factor-analysis Gaussian N(c, F Fᵀ + diag ψ) that stream over the D rows of a
//! model's state in blocks: F (D×K) is never materialised, so a query on n samples needs
//! O(n·K + block·K) memory besides its input and output. With M = I + Fᵀ Ψ⁻¹ F (K×K):
//!
//! * Woodbury (thesis 4.54): (F Fᵀ + Ψ)⁻¹ = Ψ⁻¹ − Ψ⁻¹ F M⁻¹ Fᵀ Ψ⁻¹,
//! * matrix determinant lemma: log|F Fᵀ + Ψ| = log|M| + Σ_d log ψ_d,
//! * latent posterior mean (4.23): E[h | x] = M⁻¹ Fᵀ Ψ⁻¹ (x − c),
//! * draws (4.50): θ = c + F h + ψ^{1/2} ⊙ z.
//!
//! M, Σ_d log ψ_d, Σ_d r_d²/ψ_d and Fᵀ Ψ⁻¹ r (r = x − c) are all sums over rows d, so one pass over the
//! state computes every query; the model is read once, under the caller's lock (one consistent state).

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};

use crate::error::{FaError, Result};
use crate::linalg::SpdFactor;
use crate::online_em::{OnlineEm, Source};
use crate::online_sga::OnlineSga;
use crate::scalar::Real;
use crate::vifa::Vifa;

/// Rows per block when a model has no block structure of its own.
pub const QUERY_BLOCK_ROWS: usize = 1024;

/// Visitor over blocks of rows: `(first_row, mean (nb), F (nb×K row-major), ψ (nb))`, all f64.
pub type RowVisitor<'a> = dyn FnMut(usize, &[f64], &[f64], &[f64]) -> Result<()> + 'a;

/// A model whose fitted Gaussian can be read block by block of rows.
pub trait GaussianRows {
    /// (D, K).
    fn dims(&self) -> (usize, usize);
    /// Visit consecutive blocks of rows covering 0..D in order.
    fn visit_rows(&self, visit: &mut RowVisitor<'_>) -> Result<()>;
}

fn widen<T: Real>(values: &[T], out: &mut Vec<f64>) {
    out.clear();
    out.extend(values.iter().map(|v| v.to_f64()));
}

impl<T: Real> GaussianRows for OnlineEm<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    /// F = Ā H̄⁻¹ (Ā when whitened), ψ = max(d̄² − rowsum(F ⊙ Ā), floor); during warm-up F₀ σ and σ².
    fn visit_rows(&self, visit: &mut RowVisitor<'_>) -> Result<()> {
        let k = self.n_components;
        let (mut mean, mut f, mut psi) = (Vec::new(), Vec::new(), Vec::new());
        if let Source::Initial(f0) = &self.source {
            let scale = self.config.scaling.warmup_scale(self.scale_sq);
            for lo in (0..self.n_features).step_by(QUERY_BLOCK_ROWS) {
                let hi = (lo + QUERY_BLOCK_ROWS).min(self.n_features);
                mean.clear();
                mean.extend((lo..hi).map(|i| self.pending_moments(i).mean.1));
                f.clear();
                f.extend(f0[lo * k..hi * k].iter().map(|v| v.to_f64() * scale));
                psi.clear();
                psi.resize(hi - lo, scale.powi(2));
                visit(lo, &mean, &f, &psi)?;
            }
            return Ok(());
        }
        let h_inv = match &self.source {
            Source::Stats(h_inv) => Some(h_inv),
            _ => None,
        };
        let floor = self.floor();
        self.visit_a_bar(&mut |lo, a| {
            let nb = a.len() / k;
            let a_rows = ArrayView2::from_shape((nb, k), a).map_err(|e| FaError::InvalidState(e.to_string()))?;
            let f_rows = match h_inv {
                Some(h_inv) => a_rows.dot(h_inv),
                None => a_rows.to_owned(),
            };
            psi.clear();
            mean.clear();
            for i in 0..nb {
                // θ̄ and d̄² with the pending (deferred) moment update applied, as the next pass stores them.
                let moments = self.pending_moments(lo + i);
                let fa: f64 = f_rows.row(i).dot(&a_rows.row(i));
                psi.push((moments.dsq.1 - fa).max(floor));
                mean.push(moments.mean.1);
            }
            f.clear();
            f.extend(f_rows.iter().copied());
            visit(lo, &mean, &f, &psi)
        })
    }
}

impl<T: Real> GaussianRows for OnlineSga<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    fn visit_rows(&self, visit: &mut RowVisitor<'_>) -> Result<()> {
        let mut mean = Vec::new();
        self.visit_current(&mut |lo, f, psi| {
            widen(&self.mean[lo..lo + psi.len()], &mut mean);
            visit(lo, &mean, f, psi)
        })
    }
}

impl<T: Real> GaussianRows for Vifa<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    /// c, F and ψ = exp β as stored.
    fn visit_rows(&self, visit: &mut RowVisitor<'_>) -> Result<()> {
        let k = self.n_components;
        let (mut mean, mut f, mut psi) = (Vec::new(), Vec::new(), Vec::new());
        for lo in (0..self.n_features).step_by(QUERY_BLOCK_ROWS) {
            let hi = (lo + QUERY_BLOCK_ROWS).min(self.n_features);
            widen(&self.params.c[lo..hi], &mut mean);
            widen(&self.params.f[lo * k..hi * k], &mut f);
            psi.clear();
            psi.extend(self.params.beta[lo..hi].iter().map(|b| b.to_f64().exp()));
            visit(lo, &mean, &f, &psi)?;
        }
        Ok(())
    }
}

/// A Gaussian given by its arrays — mean (D), F (D×K, K = 0 allowed: a diagonal Gaussian), ψ (D) — such as a
/// model's exported parameters or a VB-FA posterior mean: the queries below then serve every model family
/// through one implementation.
pub struct DenseGaussian<'a> {
    pub mean: ArrayView1<'a, f64>,
    pub loadings: ArrayView2<'a, f64>,
    pub noise_variance: ArrayView1<'a, f64>,
}

impl<'a> DenseGaussian<'a> {
    /// Check the shapes: mean and ψ of length D, F of shape (D, K).
    pub fn new(
        mean: ArrayView1<'a, f64>,
        loadings: ArrayView2<'a, f64>,
        noise_variance: ArrayView1<'a, f64>,
    ) -> Result<Self> {
        let (d, k) = loadings.dim();
        if mean.len() != d || noise_variance.len() != d {
            return Err(FaError::Shape {
                what: "mean, loadings, noise_variance",
                expected: format!("(D,), (D, K), (D,) for D = {d}"),
                got: vec![mean.len(), d, k, noise_variance.len()],
            });
        }
        Ok(DenseGaussian {
            mean,
            loadings,
            noise_variance,
        })
    }
}

impl GaussianRows for DenseGaussian<'_> {
    fn dims(&self) -> (usize, usize) {
        self.loadings.dim()
    }

    fn visit_rows(&self, visit: &mut RowVisitor<'_>) -> Result<()> {
        let d = self.mean.len();
        let (mut mean, mut f, mut psi) = (Vec::new(), Vec::new(), Vec::new());
        for lo in (0..d).step_by(QUERY_BLOCK_ROWS) {
            let hi = (lo + QUERY_BLOCK_ROWS).min(d);
            mean.clear();
            mean.extend(self.mean.slice(ndarray::s![lo..hi]).iter().copied());
            f.clear();
            f.extend(self.loadings.slice(ndarray::s![lo..hi, ..]).iter().copied());
            psi.clear();
            psi.extend(self.noise_variance.slice(ndarray::s![lo..hi]).iter().copied());
            visit(lo, &mean, &f, &psi)?;
        }
        Ok(())
    }
}

/// Lower Cholesky factor L of M = I + Fᵀ Ψ⁻¹ F (K×K; the smallest jitter that makes it factorise is added
/// when rounding alone breaks it), from one pass over the rows.
pub fn precision_cholesky<G: GaussianRows + ?Sized>(model: &G) -> Result<Array2<f64>> {
    let d = model.dims().0;
    let sums = query_sums(model, Array2::<f64>::zeros((0, d)).view())?;
    Ok(precision_factor(&sums.gram)?.lower())
}

/// The error of a query on a model whose state is not a finite Gaussian (an earlier breakdown).
fn not_finite(row: usize) -> FaError {
    FaError::InvalidState(format!(
        "the model's loadings or noise variance at feature {row} are not finite and positive (a numerical \
         breakdown in an earlier update); restore a checkpoint"
    ))
}

fn check_block(lo: usize, f: &[f64], psi: &[f64], k: usize) -> Result<()> {
    for (i, p) in psi.iter().enumerate() {
        if !(p.is_finite() && *p > 0.0) || f[i * k..(i + 1) * k].iter().any(|v| !v.is_finite()) {
            return Err(not_finite(lo + i));
        }
    }
    Ok(())
}

/// Sums over rows for the queries on x (n×D): M − I = Σ_d F_d F_dᵀ/ψ_d (K×K), Σ_d log ψ_d,
/// quad_n = Σ_d r_nd²/ψ_d and proj_n = Σ_d r_nd F_d/ψ_d (n×K), r = x − c. Sums over disjoint sets of
/// rows (the shards of a model split across processes) add.
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySums {
    pub gram: Array2<f64>,
    pub log_det_psi: f64,
    pub quad: Array1<f64>,
    pub proj: Array2<f64>,
}

impl QuerySums {
    /// Flat form [gram (K², row-major), Σ log ψ, quad (n), proj (n·K, row-major)], for an all-reduce.
    pub fn to_flat(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.gram.len() + 1 + self.quad.len() + self.proj.len());
        out.extend(self.gram.iter());
        out.push(self.log_det_psi);
        out.extend(self.quad.iter());
        out.extend(self.proj.iter());
        out
    }

    /// Inverse of [`QuerySums::to_flat`] for n samples and K factors.
    pub fn from_flat(flat: &[f64], n: usize, k: usize) -> Result<Self> {
        let want = k * k + 1 + n + n * k;
        if flat.len() != want {
            return Err(FaError::Shape {
                what: "query sums",
                expected: format!("({want},) for n = {n}, K = {k}"),
                got: vec![flat.len()],
            });
        }
        let (gram, rest) = flat.split_at(k * k);
        let (quad, proj) = rest[1..].split_at(n);
        let shape_err = |e: ndarray::ShapeError| FaError::InvalidState(e.to_string());
        Ok(QuerySums {
            gram: Array2::from_shape_vec((k, k), gram.to_vec()).map_err(shape_err)?,
            log_det_psi: rest[0],
            quad: Array1::from(quad.to_vec()),
            proj: Array2::from_shape_vec((n, k), proj.to_vec()).map_err(shape_err)?,
        })
    }
}

/// The query sums of the model's rows for the rows of x (n×D).
pub fn query_sums<G: GaussianRows + ?Sized>(model: &G, x: ArrayView2<f64>) -> Result<QuerySums> {
    let (d, k) = model.dims();
    let n = x.nrows();
    if x.ncols() != d {
        return Err(FaError::Shape {
            what: "X",
            expected: format!("(n_samples, {d})"),
            got: x.shape().to_vec(),
        });
    }
    let mut sums = QuerySums {
        gram: Array2::zeros((k, k)),
        log_det_psi: 0.0,
        quad: Array1::zeros(n),
        proj: Array2::zeros((n, k)),
    };
    let mut scaled = vec![0.0; k];
    model.visit_rows(&mut |lo, mean, f, psi| {
        check_block(lo, f, psi, k)?;
        for (i, (&c, &p)) in mean.iter().zip(psi).enumerate() {
            let row = &f[i * k..(i + 1) * k];
            let w = 1.0 / p;
            sums.log_det_psi += p.ln();
            for (s, v) in scaled.iter_mut().zip(row) {
                *s = v * w; // Ψ⁻¹ F, row d
            }
            for a in 0..k {
                for b in 0..k {
                    sums.gram[[a, b]] += row[a] * scaled[b];
                }
            }
            for (j, sample) in x.axis_iter(Axis(0)).enumerate() {
                let r = sample[lo + i] - c;
                sums.quad[j] += r * r * w;
                for (a, s) in scaled.iter().enumerate() {
                    sums.proj[[j, a]] += r * s;
                }
            }
        }
        Ok(())
    })?;
    Ok(sums)
}

fn precision_factor(gram: &Array2<f64>) -> Result<SpdFactor> {
    let m = Array2::<f64>::eye(gram.nrows()) + gram;
    SpdFactor::new_jittered(m.view(), "I + Fᵀ Ψ⁻¹ F")
}

/// Log density of each row of x (n×D) under N(c, F Fᵀ + diag ψ), shape (n):
/// −½ (D log 2π + log|M| + Σ log ψ + rᵀΨ⁻¹r − ‖L⁻¹ Fᵀ Ψ⁻¹ r‖²), M = L Lᵀ.
pub fn log_prob<G: GaussianRows + ?Sized>(model: &G, x: ArrayView2<f64>) -> Result<Array1<f64>> {
    log_prob_from_sums(&query_sums(model, x)?, x.ncols())
}

/// [`log_prob`] from the query sums over all `n_features` rows of the model.
pub fn log_prob_from_sums(sums: &QuerySums, n_features: usize) -> Result<Array1<f64>> {
    let factor = precision_factor(&sums.gram)?;
    let l_inv = crate::linalg::lower_triangular_inverse(factor.lower().view())?;
    let log_det = factor.log_det() + sums.log_det_psi;
    let constant = n_features as f64 * (2.0 * std::f64::consts::PI).ln() + log_det;
    Ok(Array1::from_shape_fn(sums.quad.len(), |j| {
        let projected = l_inv.dot(&sums.proj.row(j));
        -0.5 * (constant + sums.quad[j] - projected.dot(&projected))
    }))
}

/// E[h | x] = M⁻¹ Fᵀ Ψ⁻¹ (x − c) for each row of x (n×D), shape (n, K).
pub fn latent_mean<G: GaussianRows + ?Sized>(model: &G, x: ArrayView2<f64>) -> Result<Array2<f64>> {
    latent_mean_from_sums(query_sums(model, x)?)
}

/// [`latent_mean`] from the query sums over all rows of the model.
pub fn latent_mean_from_sums(sums: QuerySums) -> Result<Array2<f64>> {
    let factor = precision_factor(&sums.gram)?;
    let mut out = sums.proj;
    for mut row in out.axis_iter_mut(Axis(0)) {
        let solved = factor.solve(row.view());
        row.assign(&solved);
    }
    Ok(out)
}

/// Draws θ_j = c + F h_j + ψ^{1/2} ⊙ z_j (4.50) written over `out` (n×D), which holds z on entry;
/// h is n×K. One pass over the model, O(block·K) extra memory.
pub fn draw_in_place<G: GaussianRows + ?Sized, T: Real>(
    model: &G,
    h: ArrayView2<f64>,
    mut out: ArrayViewMut2<T>,
) -> Result<()> {
    let (d, k) = model.dims();
    if out.ncols() != d || h.ncols() != k || h.nrows() != out.nrows() {
        return Err(FaError::Shape {
            what: "draw buffers",
            expected: format!("z of shape (n, {d}) and h of shape (n, {k})"),
            got: vec![out.nrows(), out.ncols(), h.nrows(), h.ncols()],
        });
    }
    model.visit_rows(&mut |lo, mean, f, psi| {
        check_block(lo, f, psi, k)?;
        for (i, (&c, &p)) in mean.iter().zip(psi).enumerate() {
            let row = &f[i * k..(i + 1) * k];
            let sd = p.sqrt();
            for (j, latent) in h.axis_iter(Axis(0)).enumerate() {
                let fh: f64 = row.iter().zip(latent.iter()).map(|(a, b)| a * b).sum();
                let z = out[[j, lo + i]].to_f64();
                out[[j, lo + i]] = T::from_f64((c + fh) + z * sd);
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vifa::{LearningRates, Optimizer, VifaConfig, VifaInit};
    use ndarray::{array, Array2};

    /// A tiny VIFA model with known c, F, ψ (its parameters are stored as given).
    fn model() -> Vifa<f64> {
        let f = array![[1.0, 0.0], [0.5, 2.0], [0.0, -1.0]];
        let c = array![1.0, -1.0, 0.5];
        let psi = array![0.5, 1.0, 2.0];
        let init = VifaInit {
            loadings: f.view(),
            mean: Some(c.view()),
            noise_variance: Some(psi.view()),
        };
        let config = VifaConfig {
            prior_precision: 1.0,
            lr: LearningRates {
                mean: 0.0,
                loadings: 0.0,
                log_noise: 0.0,
            },
            optimizer: Optimizer::Sgd,
            n_grad_samples: 1,
            clip_grad_norm: None,
        };
        Vifa::new(3, 2, init, 0, config).expect("model")
    }

    fn dense(model: &Vifa<f64>) -> (Array1<f64>, Array2<f64>) {
        let f = model.loadings();
        let mut cov = f.dot(&f.t());
        for (i, p) in model.noise_variance().iter().enumerate() {
            cov[[i, i]] += p;
        }
        (model.mean(), cov)
    }

    #[test]
    fn log_prob_matches_the_dense_formula() {
        let m = model();
        let (c, cov) = dense(&m);
        let x = array![[0.3, 0.2, -1.0], [2.0, -3.0, 1.0]];
        let got = log_prob(&m, x.view()).expect("log_prob");
        let factor = SpdFactor::new(cov.view(), "cov").expect("spd");
        for (j, row) in x.axis_iter(Axis(0)).enumerate() {
            let r = &row - &c;
            let expected =
                -0.5 * (3.0 * (2.0 * std::f64::consts::PI).ln() + factor.log_det() + r.dot(&factor.solve(r.view())));
            assert!((got[j] - expected).abs() < 1e-12 * expected.abs());
        }
    }

    #[test]
    fn non_finite_or_non_positive_rows_are_an_error_naming_the_feature() {
        assert!(check_block(10, &[1.0, 2.0], &[0.5], 2).is_ok());
        for (f, psi) in [([1.0, f64::INFINITY], 0.5), ([1.0, 2.0], 0.0), ([1.0, 2.0], f64::NAN)] {
            let err = check_block(10, &f, &[psi], 2).expect_err("refused");
            assert!(err.to_string().contains("feature 10"));
        }
    }

    #[test]
    fn draw_in_place_is_the_affine_map() {
        let m = model();
        let h = array![[1.0, -2.0]];
        let mut out = array![[0.5, -1.0, 2.0]];
        draw_in_place(&m, h.view(), out.view_mut()).expect("draw");
        let f = m.loadings();
        for d in 0..3 {
            let expected = m.mean()[d] + f.row(d).dot(&h.row(0)) + [0.5, -1.0, 2.0][d] * m.noise_variance()[d].sqrt();
            assert!((out[[0, d]] - expected).abs() < 1e-14);
        }
    }
}
