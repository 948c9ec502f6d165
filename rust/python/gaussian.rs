//! The queries of a Gaussian given by its arrays (mean, F, ψ): the one implementation behind the Python
//! helpers of models without a streaming engine (VB-FA posteriors, exported parameters).

use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::common::checked_view;
use crate::query::DenseGaussian;

/// Run a query on the Gaussian of three borrowed arrays and the samples `x`, with the GIL released.
fn with_gaussian<R: Send>(
    py: Python<'_>,
    arrays: (
        PyReadonlyArray1<'_, f64>,
        PyReadonlyArray2<'_, f64>,
        PyReadonlyArray1<'_, f64>,
    ),
    x: PyReadonlyArray2<'_, f64>,
    query: impl FnOnce(&DenseGaussian<'_>, ndarray::ArrayView2<'_, f64>) -> crate::error::Result<R> + Send,
) -> PyResult<R> {
    let (mean, loadings, noise_variance) = arrays;
    let m = checked_view(&mean, "mean")?;
    let f = checked_view(&loadings, "loadings")?;
    let psi = checked_view(&noise_variance, "noise_variance")?;
    let xv = checked_view(&x, "X")?;
    py.detach(|| query(&DenseGaussian::new(m, f, psi)?, xv))
        .map_err(PyErr::from)
}

/// Log densities of the rows of `x` (n×D) under N(mean, F Fᵀ + diag ψ).
#[pyfunction]
pub(crate) fn gaussian_log_prob<'py>(
    py: Python<'py>,
    mean: PyReadonlyArray1<'_, f64>,
    loadings: PyReadonlyArray2<'_, f64>,
    noise_variance: PyReadonlyArray1<'_, f64>,
    x: PyReadonlyArray2<'_, f64>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let out = with_gaussian(py, (mean, loadings, noise_variance), x, |g, xv| {
        crate::query::log_prob(g, xv)
    })?;
    Ok(out.into_pyarray(py))
}

/// Posterior latent means E[h | x] (n×K) of the rows of `x`.
#[pyfunction]
pub(crate) fn gaussian_latent_mean<'py>(
    py: Python<'py>,
    mean: PyReadonlyArray1<'_, f64>,
    loadings: PyReadonlyArray2<'_, f64>,
    noise_variance: PyReadonlyArray1<'_, f64>,
    x: PyReadonlyArray2<'_, f64>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let out = with_gaussian(py, (mean, loadings, noise_variance), x, |g, xv| {
        crate::query::latent_mean(g, xv)
    })?;
    Ok(out.into_pyarray(py))
}

/// Lower Cholesky factor of M = I + Fᵀ Ψ⁻¹ F (K×K).
#[pyfunction]
pub(crate) fn gaussian_precision_cholesky<'py>(
    py: Python<'py>,
    loadings: PyReadonlyArray2<'_, f64>,
    noise_variance: PyReadonlyArray1<'_, f64>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let (f, psi) = (
        checked_view(&loadings, "loadings")?,
        checked_view(&noise_variance, "noise_variance")?,
    );
    let zeros = ndarray::Array1::<f64>::zeros(f.nrows());
    let out = py.detach(|| crate::query::precision_cholesky(&DenseGaussian::new(zeros.view(), f, psi)?))?;
    Ok(out.into_pyarray(py))
}

/// The K×K map R of the spiked-model shrinkage (crate::shrinkage) from the Gram Fᵀ Ψ⁻¹ F (K×K) of a model with
/// `n_features` rows in all, fitted to `n_samples` effective samples.
#[pyfunction]
pub(crate) fn spiked_transform<'py>(
    py: Python<'py>,
    gram: PyReadonlyArray2<'_, f64>,
    n_features: usize,
    n_samples: f64,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let g = gram.as_array().to_owned();
    let out = py.detach(|| crate::shrinkage::spiked_transform(g.view(), n_features, n_samples))?;
    Ok(out.into_pyarray(py))
}

/// Effective number of samples 1/Σ w² of running averages with the given schedule after `n_seen` samples.
#[pyfunction]
#[pyo3(signature = (n_seen, schedule, tau0, kappa, rho))]
pub(crate) fn effective_samples(n_seen: u64, schedule: &str, tau0: f64, kappa: f64, rho: f64) -> PyResult<f64> {
    let step = super::common::step_size(schedule, tau0, kappa, rho)?;
    Ok(crate::shrinkage::effective_samples(&step, n_seen))
}
