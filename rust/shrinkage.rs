//! Shrinkage of a fitted factor model's reported Gaussian to what n samples in D dimensions support, from the
//! spiked covariance model (Donoho, Gavish & Johnstone, "Optimal shrinkage of eigenvalues in the spiked
//! covariance model", Annals of Statistics 46(4), 2018, §2 and the Frobenius-loss shrinker of Table 2).
//!
//! Whitened by ψ, the fitted covariance Ψ^{−½} (F Fᵀ + Ψ) Ψ^{−½} = I + G Gᵀ (G = Ψ^{−½} F) has the spikes
//! λ_k = 1 + m_k, with m_k the eigenvalues of the K×K Gram Fᵀ Ψ⁻¹ F. Maximum likelihood sets them to the top
//! eigenvalues of the samples, which overstate the population spikes when γ = D/n is not small: with white
//! noise of level σ², a population spike ℓ > 1 + √γ gives the sample spike λ/σ² = ℓ + γ ℓ/(ℓ − 1), whose
//! direction has squared cosine c² = (1 − γ/(ℓ − 1)²)/(1 + γ/(ℓ − 1)) with the population one; a spike at or
//! below the edge (1 + √γ)² cannot be told from the noise. The loss-optimal estimate (Frobenius norm of the
//! covariance) keeps the direction and sets the spike to σ² (ℓ − 1) c², zero below the edge. σ² is solved from
//! the trace, which the fit reproduces: D + Σ_k m_k = σ² (D + Σ_k (ℓ_k − 1)).
//!
//! With Fᵀ Ψ⁻¹ F = V diag(m) Vᵀ the shrunk loadings are F' = F R, R = V diag(√(m'_k/m_k)) Vᵀ (symmetric, its
//! eigenvalues in [0, 1]), and the variance a spike gives up moves to ψ so that every marginal variance stays
//! the fitted one: ψ' = ψ + rowsum((F (I − R²)) ⊙ F). As n grows (γ → 0) R → I.

use std::ops::Range;

use ndarray::{Array1, Array2, ArrayView2};

use crate::engine::isa::Isa;
use crate::error::{invalid, Result};
use crate::linalg::symmetric_eigen_desc;
use crate::query::{add_block_gram, mirror_upper, per_task, BlockBufs, GaussianRows, RowVisitor};
use crate::schedule::StepSize;

/// Iterations of the fixed point for σ² (it converges in a few; the bound only guards pathological input).
const NOISE_LEVEL_ITERATIONS: usize = 200;
/// Samples beyond which [`effective_samples`] uses the stationary value of its recursion.
const EXACT_SAMPLES: u64 = 1 << 22;

/// Population spike ℓ and squared cosine c² of a sample spike λ (in units of the noise level) at aspect ratio γ
/// (ℓ = 1, c² = 0 at or below the detection edge (1 + √γ)²).
fn population_spike(lambda: f64, gamma: f64) -> (f64, f64) {
    let edge = (1.0 + gamma.sqrt()).powi(2);
    if lambda <= edge {
        return (1.0, 0.0);
    }
    // λ = ℓ + γ ℓ/(ℓ − 1) ⇔ ℓ² − (λ + 1 − γ) ℓ + λ = 0, the larger root.
    let b = lambda + 1.0 - gamma;
    let ell = 0.5 * (b + (b * b - 4.0 * lambda).max(0.0).sqrt());
    let excess = ell - 1.0;
    let cos_sq = ((1.0 - gamma / (excess * excess)) / (1.0 + gamma / excess)).clamp(0.0, 1.0);
    (ell, cos_sq)
}

/// The K×K map R of the shrunk loadings F' = F R, from the Gram Fᵀ Ψ⁻¹ F (K×K) of a model with `n_features`
/// rows fitted to `n_samples` effective samples (the sample covariance's degrees of freedom are n − 1).
pub fn spiked_transform(gram: ArrayView2<f64>, n_features: usize, n_samples: f64) -> Result<Array2<f64>> {
    let k = gram.nrows();
    if gram.ncols() != k || gram.iter().any(|v| !v.is_finite()) {
        return Err(invalid("gram", "must be a finite square matrix"));
    }
    if n_features == 0 || !(n_samples.is_finite() && n_samples > 0.0) {
        return Err(invalid(
            "n_samples",
            format!("must be > 0 with D > 0, got {n_samples} and D = {n_features}"),
        ));
    }
    let (values, vectors) = symmetric_eigen_desc(gram);
    let m: Array1<f64> = values.mapv(|v| v.max(0.0));
    let gamma = n_features as f64 / (n_samples - 1.0).max(1.0);
    let d = n_features as f64;
    let mut sigma_sq = 1.0;
    for _ in 0..NOISE_LEVEL_ITERATIONS {
        let excess: f64 = m
            .iter()
            .map(|&mk| population_spike((1.0 + mk) / sigma_sq, gamma).0 - 1.0)
            .sum();
        let next = (d + m.sum()) / (d + excess);
        let done = (next - sigma_sq).abs() <= 1e-12 * sigma_sq;
        sigma_sq = next;
        if done {
            break;
        }
    }
    let scale = Array1::from_iter(m.iter().map(|&mk| {
        let (ell, cos_sq) = population_spike((1.0 + mk) / sigma_sq, gamma);
        let shrunk = sigma_sq * (ell - 1.0) * cos_sq;
        if mk > 0.0 {
            (shrunk / mk).clamp(0.0, 1.0).sqrt()
        } else {
            0.0
        }
    }));
    // R = V diag(scale) Vᵀ.
    let scaled = &vectors * &scale.view().insert_axis(ndarray::Axis(0));
    Ok(scaled.dot(&vectors.t()))
}

/// Effective number of samples 1/Σ_s w_s² of running averages with steps ρ_t (w_s the weight of sample s after
/// `n_seen` samples): n for ρ_t = 1/t; for other schedules from the recursion S_t = (1 − ρ_t)² S_{t−1} + ρ_t²,
/// beyond 2²² samples its stationary value ρ/(2 − ρ) at the last step.
pub fn effective_samples(step: &StepSize, n_seen: u64) -> f64 {
    if matches!(step, StepSize::Harmonic) || n_seen == 0 {
        return n_seen as f64;
    }
    if n_seen > EXACT_SAMPLES {
        let rho = step.rho(n_seen);
        return (2.0 - rho) / rho;
    }
    let mut sum_sq = 0.0;
    for t in 1..=n_seen {
        let rho = step.rho(t);
        sum_sq = (1.0 - rho).powi(2) * sum_sq + rho * rho;
    }
    1.0 / sum_sq
}

/// The last reporting map of a model and the sample count it was computed at (the model's state changes only
/// with its sample count, or through a copy, which starts with an empty cache). Not part of the model's value:
/// copies start empty and every cache compares equal.
#[derive(Default)]
pub struct ReportCache(std::sync::Mutex<Option<(u64, Array2<f64>)>>);

impl ReportCache {
    /// The map cached for `n_seen`, if any (None too when the lock is busy or poisoned: then it is recomputed).
    pub fn get(&self, n_seen: u64) -> Option<Array2<f64>> {
        let guard = self.0.try_lock().ok()?;
        match &*guard {
            Some((seen, map)) if *seen == n_seen => Some(map.clone()),
            _ => None,
        }
    }

    /// Remember `map` as the map at `n_seen` (skipped when the lock is busy or poisoned).
    pub fn put(&self, n_seen: u64, map: &Array2<f64>) {
        if let Ok(mut guard) = self.0.try_lock() {
            *guard = Some((n_seen, map.clone()));
        }
    }
}

impl Clone for ReportCache {
    fn clone(&self) -> Self {
        ReportCache::default()
    }
}

impl PartialEq for ReportCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for ReportCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReportCache")
    }
}

/// Fᵀ Ψ⁻¹ F (K×K) of a model's rows: per block of rows one tiled rank-nb update (the query sums' own), summed
/// task by task in row order (the same bits on any thread count), exactly symmetric.
pub fn gram<G: GaussianRows + ?Sized>(model: &G) -> Result<Array2<f64>> {
    let (d, k) = model.dims();
    let parts = per_task(d, k, |rows| {
        let mut sum = Array2::<f64>::zeros((k, k));
        let (isa, mut bufs) = (Isa::detect(), BlockBufs::default());
        model.visit_range(rows, &mut |_, _, f, psi| {
            add_block_gram(isa, &mut sum, f, psi, &mut bufs);
            Ok(())
        })?;
        Ok(sum)
    })?;
    let mut total = parts.into_iter().fold(Array2::zeros((k, k)), |acc, p| acc + p);
    mirror_upper(&mut total);
    Ok(total)
}

/// A model's reported Gaussian: its rows as stored, or with the loadings mapped by a K×K R (F' = F R) and the
/// marginal variances kept, ψ' = ψ + ‖F_d‖² − ‖F'_d‖² (= ψ + rowsum((F (I − R Rᵀ)) ⊙ F)). Shapes: R is K×K.
pub struct Reported<'a, G: ?Sized> {
    inner: &'a G,
    map: Option<Array2<f64>>,
}

impl<'a, G: GaussianRows + ?Sized> Reported<'a, G> {
    /// `inner` with its loadings mapped by `map` (K×K), or as stored (None).
    pub fn new(inner: &'a G, map: Option<Array2<f64>>) -> Result<Self> {
        let k = inner.dims().1;
        if let Some(r) = &map {
            if r.dim() != (k, k) || r.iter().any(|v| !v.is_finite()) {
                return Err(invalid("transform", format!("must be a finite {k}×{k} matrix")));
            }
        }
        Ok(Reported { inner, map })
    }

    /// `inner` as it reports itself: mapped by `explicit` if given (a transform computed over all the rows of a
    /// model split across processes), else by the model's own [`GaussianRows::report_transform`].
    pub fn of(inner: &'a G, explicit: Option<Array2<f64>>) -> Result<Self> {
        let map = match explicit {
            Some(r) => Some(r),
            None => inner.report_transform()?,
        };
        Self::new(inner, map)
    }
}

impl<G: GaussianRows + ?Sized> GaussianRows for Reported<'_, G> {
    fn dims(&self) -> (usize, usize) {
        self.inner.dims()
    }

    /// The inner model's rows mapped by R ([`GaussianRows::visit_range_mapped`]), or as stored.
    fn visit_range(&self, rows: Range<usize>, visit: &mut RowVisitor<'_>) -> Result<()> {
        match self.map.as_ref().filter(|m| m.nrows() > 0) {
            Some(map) => self.inner.visit_range_mapped(rows, map.view(), visit),
            None => self.inner.visit_range(rows, visit), // no map, or K = 0: nothing to map
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::{rows_as, DenseGaussian};
    use ndarray::{array, Array1};

    #[test]
    fn a_diagonal_gram_shrinks_each_spike_by_the_closed_form() {
        // D = 1000, n − 1 = 999: γ = 1.001 ≈ 1, edge ≈ 4. Spikes 50 and 1 (λ = 51, 2): the second is below the edge.
        let gram = array![[50.0, 0.0], [0.0, 1.0]];
        let r = spiked_transform(gram.view(), 1000, 1000.0).expect("transform");
        assert!(r[(1, 1)].abs() < 1e-12 && r[(0, 1)].abs() < 1e-12);
        // σ² from the trace with ℓ(σ²), then m' = σ² (ℓ − 1) c², checked by its defining identities.
        let shrunk = r[(0, 0)].powi(2) * 50.0;
        assert!(shrunk > 40.0 && shrunk < 50.0, "{shrunk}");
        let gamma = 1000.0 / 999.0;
        // The trace equation D + Σ m = σ² (D + Σ (ℓ − 1)), solved by its fixed point (the weak spike has ℓ = 1).
        let mut sigma_sq = 1.0;
        for _ in 0..100 {
            sigma_sq = (1000.0 + 51.0) / (1000.0 + population_spike(51.0 / sigma_sq, gamma).0 - 1.0);
        }
        assert!(sigma_sq > 1.0 && sigma_sq < 1.01, "{sigma_sq}");
        let ell = population_spike(51.0 / sigma_sq, gamma).0;
        assert!((ell + gamma * ell / (ell - 1.0) - 51.0 / sigma_sq).abs() < 1e-9);
        let cos_sq = (1.0 - gamma / (ell - 1.0).powi(2)) / (1.0 + gamma / (ell - 1.0));
        assert!((shrunk - sigma_sq * (ell - 1.0) * cos_sq).abs() < 1e-6 * shrunk);
    }

    #[test]
    fn many_samples_leave_the_model_almost_unchanged_and_few_remove_weak_spikes() {
        let gram = array![[30.0, 4.0], [4.0, 8.0]];
        let r = spiked_transform(gram.view(), 100, 1e9).expect("transform");
        assert!((&r - &Array2::<f64>::eye(2)).iter().all(|v| v.abs() < 1e-5));
        let r = spiked_transform(gram.view(), 100_000, 20.0).expect("transform");
        assert!(r.iter().all(|v| v.abs() < 1e-12), "{r}");
    }

    #[test]
    fn effective_samples_of_the_schedules() {
        assert_eq!(effective_samples(&StepSize::Harmonic, 37), 37.0);
        // Constant ρ = 0.5 for t ≥ 2 (ρ_1 = 1): S_1 = 1, S_t = S_{t−1}/4 + 1/4 → 1/3.
        let n = effective_samples(&StepSize::Constant(0.5), 60);
        assert!((n - 3.0).abs() < 1e-12, "{n}");
        let power = effective_samples(&StepSize::Power { tau0: 0.0, kappa: 0.9 }, 1000);
        assert!(power > 500.0 && power < 1000.0, "{power}");
    }

    #[test]
    fn reported_rows_keep_every_marginal_variance() {
        let mean = Array1::from_vec(vec![0.5, -1.0, 2.0]);
        let f = array![[1.0, 0.5], [0.2, -0.3], [2.0, 1.0]];
        let psi = Array1::from_vec(vec![0.1, 0.4, 0.9]);
        let model = DenseGaussian::new(mean.view(), f.view(), psi.view()).expect("model");
        let map = array![[0.6, 0.1], [0.1, 0.2]];
        let reported = Reported::new(&model, Some(map.clone())).expect("reported");
        let (c2, f2, p2) = rows_as::<f64, _>(&reported).expect("rows");
        let f2 = Array2::from_shape_vec((3, 2), f2).expect("shape");
        let expected = f.dot(&map);
        assert!((&f2 - &expected).iter().all(|v| v.abs() < 1e-14));
        for i in 0..3 {
            let before = f.row(i).dot(&f.row(i)) + psi[i];
            let after = f2.row(i).dot(&f2.row(i)) + p2[i];
            assert!((before - after).abs() < 1e-12 && (c2[i] - mean[i]).abs() == 0.0);
        }
        assert!(Reported::new(&model, Some(Array2::eye(3))).is_err());
    }
}
