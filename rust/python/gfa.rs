//! Engines of `onlinefa.GFA` and `onlinefa.OnlineGFA`.

use super::vbfa::VbfaVectorPair;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use super::state_arrays::{dict_to_state, state_to_dict};
use crate::fork::Mutex;
use crate::init::entropy_seed;
use crate::state::Checkpoint;

// Engine of `onlinefa.GFA` (python/onlinefa/gfa.py documents the behaviour users see). Names from
// crate::gfa are written in full so this section needs no change to the imports above.

/// Three NumPy arrays returned together (the fit history: bound, factors, seconds).
pub(crate) type GfaHistory<'py> = (
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
);

/// Two NumPy matrices (predictive means and variances; Gamma shapes and rates).
pub(crate) type GfaMatrixPair<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>);

/// The noise model named "group" or "feature".
pub(crate) fn gfa_noise(noise: &str) -> PyResult<crate::gfa::NoiseModel> {
    match noise {
        "group" => Ok(crate::gfa::NoiseModel::Group),
        "feature" => Ok(crate::gfa::NoiseModel::Feature),
        other => Err(PyValueError::new_err(format!(
            "noise must be 'group' or 'feature', got {other:?}"
        ))),
    }
}

/// Engine of `onlinefa.GFA` (batch VB group factor analysis of one data matrix, NaN = missing).
#[pyclass(frozen, module = "onlinefa._core")]
pub struct GFACore {
    inner: Mutex<crate::gfa::GfaBatch>,
}

impl GFACore {
    /// Run `f` on the model with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut crate::gfa::GfaBatch) -> crate::error::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| f(&mut *lock(&self.inner)?).map_err(PyErr::from))
    }
}

#[pymethods]
impl GFACore {
    #[new]
    #[pyo3(signature = (x, groups, n_components, *, noise, rotate, rotate_start, drop_factors, drop_tol, init_noise_ratio, seed, ard_rank=None, ard_lambda=0.1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f64>,
        groups: Vec<usize>,
        n_components: usize,
        noise: &str,
        rotate: bool,
        rotate_start: u64,
        drop_factors: bool,
        drop_tol: f64,
        init_noise_ratio: f64,
        seed: Option<u64>,
        ard_rank: Option<usize>,
        ard_lambda: f64,
    ) -> PyResult<Self> {
        let config = crate::gfa::GfaConfig {
            n_components,
            noise: gfa_noise(noise)?,
            ard_rank,
            ard_lambda,
            hyper: crate::vbfa::Hyper::default(),
            rotate,
            rotate_start,
            drop_factors,
            drop_tol,
            init_noise_ratio,
            seed: seed.unwrap_or_else(entropy_seed),
        };
        let view = checked_view(&x, "X")?;
        let model = py.detach(|| {
            let groups = crate::gfa::Groups::from_labels(&groups)?;
            crate::gfa::GfaBatch::new(view, groups, config)
        })?;
        Ok(GFACore {
            inner: Mutex::new(model),
        })
    }

    /// Up to `max_iter` sweeps; returns the number run.
    fn fit(&self, py: Python<'_>, max_iter: usize, tol: f64) -> PyResult<usize> {
        self.with(py, |m| m.fit(max_iter, tol))
    }

    /// One sweep (dropping, updates, transformations as configured).
    fn sweep(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |m| m.sweep())
    }

    /// One named coordinate update or transformation.
    fn apply(&self, py: Python<'_>, step: &str) -> PyResult<()> {
        let step = crate::gfa::GfaStep::parse(step)?;
        self.with(py, |m| m.apply(step))
    }

    /// Remove the factors at these current indices (at least one must stay); returns their original indices.
    fn drop_components(&self, py: Python<'_>, indices: Vec<usize>) -> PyResult<Vec<usize>> {
        self.with(py, |m| m.drop_components(&indices))
    }

    /// Apply the group rotation; returns (R, gain of the bound).
    fn rotate<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyArray2<f64>>, f64)> {
        let (rot, gain) = self.with(py, |m| m.rotate())?;
        Ok((rot.r.into_pyarray(py), gain))
    }

    fn elbo(&self, py: Python<'_>) -> PyResult<f64> {
        self.with(py, |m| Ok(m.elbo()))
    }

    /// The bound split by factor.
    fn bound_terms<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = self.with(py, |m| Ok(m.bound_terms()))?;
        let dict = PyDict::new(py);
        for (name, value) in [
            ("likelihood", t.likelihood),
            ("latents", t.latents),
            ("bias", t.bias),
            ("loadings", t.loadings),
            ("ard", t.ard),
            ("noise", t.noise),
        ] {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }

    /// (L, K, seconds) after each sweep of `fit`.
    fn history<'py>(&self, py: Python<'py>) -> PyResult<GfaHistory<'py>> {
        let rows: Vec<(f64, u64, f64)> = self.with(py, |m| {
            Ok(m.history()
                .iter()
                .map(|r| (r.elbo, r.n_components as u64, r.seconds))
                .collect())
        })?;
        let elbo = rows.iter().map(|r| r.0).collect();
        let k = rows.iter().map(|r| r.1).collect();
        let seconds = rows.iter().map(|r| r.2).collect();
        Ok((
            PyArray1::from_vec(py, elbo),
            PyArray1::from_vec(py, k),
            PyArray1::from_vec(py, seconds),
        ))
    }

    #[getter]
    fn n_sweeps(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |m| Ok(m.n_sweeps()))
    }

    #[getter]
    fn converged(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |m| Ok(m.converged()))
    }

    fn kept_components(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        self.with(py, |m| Ok(m.kept_components().to_vec()))
    }

    fn latent_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.with(py, |m| Ok(m.latent_mean().clone()))?.into_pyarray(py))
    }

    fn latent_cov<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray3<f64>>> {
        Ok(self.with(py, |m| Ok(m.latent_cov()))?.into_pyarray(py))
    }

    fn bias_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| Ok(m.bias_mean().clone()))?.into_pyarray(py))
    }

    fn bias_var<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| Ok(m.bias_var().clone()))?.into_pyarray(py))
    }

    fn loading_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.with(py, |m| Ok(m.loading_mean().clone()))?.into_pyarray(py))
    }

    fn loading_cov<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray3<f64>>> {
        Ok(self.with(py, |m| Ok(m.loading_cov().clone()))?.into_pyarray(py))
    }

    /// ⟨α_mk⟩ (M×K; α itself for the low-rank ARD).
    fn alpha_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.with(py, |m| Ok(m.alpha_means()))?.into_pyarray(py))
    }

    /// (shapes, rates) of q(α_mk), each M×K (full-rank q(α); unused by the low-rank ARD).
    fn ard<'py>(&self, py: Python<'py>) -> PyResult<GfaMatrixPair<'py>> {
        let (shape, rate) = self.with(py, |m| Ok((m.ard().mapv(|q| q.shape), m.ard().mapv(|q| q.rate))))?;
        Ok((shape.into_pyarray(py), rate.into_pyarray(py)))
    }

    /// (shapes, rates) of q(τ) (M per group, or D per feature).
    fn noise<'py>(&self, py: Python<'py>) -> PyResult<VbfaVectorPair<'py>> {
        let (shape, rate): (Vec<f64>, Vec<f64>) =
            self.with(py, |m| Ok(m.noise().iter().map(|g| (g.shape, g.rate)).unzip()))?;
        Ok((PyArray1::from_vec(py, shape), PyArray1::from_vec(py, rate)))
    }

    fn noise_variance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| Ok(m.noise_variance()))?.into_pyarray(py))
    }

    /// Share of each group's variance explained by each factor (M×K).
    fn activity<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.with(py, |m| Ok(m.activity()))?.into_pyarray(py))
    }

    /// (predictive means, predictive variances) of every entry of new rows given their non-NaN entries.
    fn predict<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<GfaMatrixPair<'py>> {
        let view = checked_view(&x, "X")?;
        let (mean, var) = self.with(py, |m| m.predict(view))?;
        Ok((mean.into_pyarray(py), var.into_pyarray(py)))
    }

    /// E_q[h] of new rows given their non-NaN entries.
    fn latent_means<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let view = checked_view(&x, "X")?;
        Ok(self.with(py, |m| m.latent_means(view))?.into_pyarray(py))
    }

    /// Everything needed to predict and continue exactly (q, statistics, data, history), as a dict.
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = self.with(py, |m| Ok(m.to_state()))?;
        state_to_dict(py, state)
    }

    /// Rebuild an engine from `get_state()`'s output (validated; ValueError if inconsistent).
    #[staticmethod]
    fn from_state(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<Self> {
        let map = dict_to_state(state)?;
        let model = py.detach(|| crate::gfa::GfaBatch::from_state(&map))?;
        Ok(GFACore {
            inner: Mutex::new(model),
        })
    }
}

/// Engine of `onlinefa.OnlineGFA` (stochastic VI over mini-batches of complete rows).
#[pyclass(frozen, module = "onlinefa._core")]
pub struct OnlineGFACore {
    inner: Mutex<crate::gfa::GfaOnline>,
}

#[pymethods]
impl OnlineGFACore {
    #[new]
    #[pyo3(signature = (groups, n_components, *, noise, rotate, rotate_start, init_noise_ratio, seed, ard_rank,
                        ard_lambda, schedule, tau0, kappa, rho, n_effective))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        groups: Vec<usize>,
        n_components: usize,
        noise: &str,
        rotate: bool,
        rotate_start: u64,
        init_noise_ratio: f64,
        seed: Option<u64>,
        ard_rank: Option<usize>,
        ard_lambda: f64,
        schedule: &str,
        tau0: f64,
        kappa: f64,
        rho: f64,
        n_effective: Option<f64>,
    ) -> PyResult<Self> {
        let model = crate::gfa::GfaConfig {
            n_components,
            noise: gfa_noise(noise)?,
            ard_rank,
            ard_lambda,
            hyper: crate::vbfa::Hyper::default(),
            rotate,
            rotate_start,
            drop_factors: false,
            drop_tol: 1e-3,
            init_noise_ratio,
            seed: seed.unwrap_or_else(entropy_seed),
        };
        let config = crate::gfa::GfaOnlineConfig {
            model,
            step_size: step_size(schedule, tau0, kappa, rho)?,
            n_effective,
        };
        let engine = py.detach(|| crate::gfa::GfaOnline::new(crate::gfa::Groups::from_labels(&groups)?, config))?;
        Ok(OnlineGFACore {
            inner: Mutex::new(engine),
        })
    }

    /// Process one mini-batch of complete rows (atomic: an error leaves the model as it was).
    fn partial_fit(&self, py: Python<'_>, x: PyReadonlyArray2<'_, f64>) -> PyResult<()> {
        let view = checked_view(&x, "X")?;
        py.detach(|| lock(&self.inner)?.partial_fit(view).map_err(PyErr::from))
    }

    #[getter]
    fn n_seen(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| Ok(lock(&self.inner)?.n_seen()))
    }

    #[getter]
    fn n_batches(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| Ok(lock(&self.inner)?.n_batches()))
    }

    #[getter]
    fn n_features(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| Ok(lock(&self.inner)?.n_features()))
    }

    /// The current global factors as a data-free `GFACore` (queries, predictions), or None before the
    /// first mini-batch.
    fn snapshot(&self, py: Python<'_>) -> PyResult<Option<GFACore>> {
        let globals = py.detach(|| Ok::<_, PyErr>(lock(&self.inner)?.globals().cloned()))?;
        Ok(globals.map(|g| GFACore { inner: Mutex::new(g) }))
    }

    /// Everything needed to continue exactly (settings, counters, globals, running averages), as a dict.
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = py.detach(|| Ok::<_, PyErr>(lock(&self.inner)?.to_state()))?;
        state_to_dict(py, state)
    }

    /// Rebuild an engine from `get_state()`'s output (validated; ValueError if inconsistent).
    #[staticmethod]
    fn from_state(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<Self> {
        let map = dict_to_state(state)?;
        let model = py.detach(|| crate::gfa::GfaOnline::from_state(&map))?;
        Ok(OnlineGFACore {
            inner: Mutex::new(model),
        })
    }

    /// Running average of ⟨h hᵀ⟩ over the samples seen (K×K), or None before the first mini-batch.
    fn latent_second_moment<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray2<f64>>>> {
        let m = py.detach(|| Ok::<_, PyErr>(lock(&self.inner)?.latent_second_moment()))?;
        Ok(m.map(|a| a.into_pyarray(py)))
    }
}
