//! Engines of `onlinefa.VBFA` and `onlinefa.OnlineVBFA`.

use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use super::state_arrays::{dict_to_state, state_to_dict};
use crate::fork::Mutex;
use crate::init::entropy_seed;
use crate::state::Checkpoint;

// Engines of `onlinefa.VBFA` and `onlinefa.OnlineVBFA` (python/onlinefa/vbfa.py documents the behaviour
// users see). Names from crate::vbfa are written in full so this section needs no change to the imports.

/// Two NumPy vectors (e.g. Gamma shapes and rates).
pub(crate) type VbfaVectorPair<'py> = (Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<f64>>);

/// The model settings shared by both VB-FA engines.
#[allow(clippy::too_many_arguments)]
pub(crate) fn vbfa_config(
    n_components: usize,
    prior: &str,
    transform: bool,
    transform_start: u64,
    translation: &str,
    init_noise_ratio: f64,
    seed: Option<u64>,
) -> PyResult<crate::vbfa::VbfaConfig> {
    let prior = match prior {
        "ard" => crate::vbfa::Prior::Ard,
        "broad" => crate::vbfa::Prior::Broad,
        other => {
            return Err(PyValueError::new_err(format!(
                "prior must be 'ard' or 'broad', got {other:?}"
            )))
        }
    };
    let translation = match translation {
        "mean" => crate::vbfa::Translation::Mean,
        "exact" => crate::vbfa::Translation::Exact,
        other => {
            return Err(PyValueError::new_err(format!(
                "translation must be 'mean' or 'exact', got {other:?}"
            )))
        }
    };
    Ok(crate::vbfa::VbfaConfig {
        n_components,
        prior,
        hyper: crate::vbfa::Hyper::default(),
        transform,
        transform_start,
        translation,
        init_noise_ratio,
        seed: seed.unwrap_or_else(entropy_seed),
    })
}

/// Engine of `onlinefa.VBFA` (batch VB-FA of one data matrix, NaN = missing).
#[pyclass(frozen, module = "onlinefa._core")]
pub struct VBFACore {
    inner: Mutex<crate::vbfa::VbfaBatch>,
}

impl VBFACore {
    /// Run `f` on the model with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut crate::vbfa::VbfaBatch) -> crate::error::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| f(&mut *lock(&self.inner)?).map_err(PyErr::from))
    }
}

#[pymethods]
impl VBFACore {
    #[new]
    #[pyo3(signature = (x, n_components, *, prior, transform, transform_start, translation, init_noise_ratio, seed))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f64>,
        n_components: usize,
        prior: &str,
        transform: bool,
        transform_start: u64,
        translation: &str,
        init_noise_ratio: f64,
        seed: Option<u64>,
    ) -> PyResult<Self> {
        let config = vbfa_config(
            n_components,
            prior,
            transform,
            transform_start,
            translation,
            init_noise_ratio,
            seed,
        )?;
        let view = checked_view(&x, "X")?;
        let model = py.detach(|| crate::vbfa::VbfaBatch::new(view, config))?;
        Ok(VBFACore {
            inner: Mutex::new(model),
        })
    }

    /// Up to `max_iter` sweeps; returns the number run.
    fn fit(&self, py: Python<'_>, max_iter: usize, tol: f64) -> PyResult<usize> {
        self.with(py, |m| m.fit(max_iter, tol))
    }

    /// One sweep (with the transformations when due).
    fn sweep(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |m| m.sweep())
    }

    /// One named coordinate update or transformation.
    fn apply(&self, py: Python<'_>, step: &str) -> PyResult<()> {
        let step = crate::vbfa::Step::parse(step)?;
        self.with(py, |m| m.apply(step))
    }

    /// Apply the translation; returns b.
    fn translate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| m.translate())?.into_pyarray(py))
    }

    /// Apply the rotation; returns R.
    fn rotate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.with(py, |m| m.rotate())?.r.into_pyarray(py))
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

    /// (L after each sweep of `fit`, seconds since the start of that `fit`).
    fn history<'py>(&self, py: Python<'py>) -> PyResult<VbfaVectorPair<'py>> {
        let (elbo, seconds): (Vec<f64>, Vec<f64>) =
            self.with(py, |m| Ok(m.history().iter().map(|r| (r.elbo, r.seconds)).unzip()))?;
        Ok((PyArray1::from_vec(py, elbo), PyArray1::from_vec(py, seconds)))
    }

    #[getter]
    fn n_sweeps(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |m| Ok(m.n_sweeps()))
    }

    #[getter]
    fn converged(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |m| Ok(m.converged()))
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

    fn alpha_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| Ok(m.alpha_mean()))?.into_pyarray(py))
    }

    /// (shapes, rates) of q(α_k), or None for the broad prior.
    fn ard<'py>(&self, py: Python<'py>) -> PyResult<Option<VbfaVectorPair<'py>>> {
        let q = self.with(py, |m| Ok(m.ard()))?;
        Ok(q.map(|q| {
            let (shape, rate): (Vec<f64>, Vec<f64>) = q.iter().map(|g| (g.shape, g.rate)).unzip();
            (PyArray1::from_vec(py, shape), PyArray1::from_vec(py, rate))
        }))
    }

    /// (shapes, rates) of q(τ_d).
    fn noise<'py>(&self, py: Python<'py>) -> PyResult<VbfaVectorPair<'py>> {
        let (shape, rate): (Vec<f64>, Vec<f64>) =
            self.with(py, |m| Ok(m.noise().iter().map(|g| (g.shape, g.rate)).unzip()))?;
        Ok((PyArray1::from_vec(py, shape), PyArray1::from_vec(py, rate)))
    }

    fn noise_variance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| Ok(m.noise_variance()))?.into_pyarray(py))
    }

    /// E_q[h] of new rows (NaN = missing).
    fn latent_means<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let view = checked_view(&x, "X")?;
        Ok(self.with(py, |m| m.latent_means(view))?.into_pyarray(py))
    }

    /// Everything needed to resume exactly, as a dict of arrays and scalars (see "VB-FA checkpoints").
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        vbfa_get_state(py, &self.inner)
    }

    /// Rebuild an engine from `get_state()`'s output (validated; ValueError if inconsistent).
    #[staticmethod]
    fn from_state(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<Self> {
        Ok(VBFACore {
            inner: Mutex::new(vbfa_from_state(py, state)?),
        })
    }
}

/// Engine of `onlinefa.OnlineVBFA` (online VB-FA on complete mini-batches).
#[pyclass(frozen, module = "onlinefa._core")]
pub struct OnlineVBFACore {
    inner: Mutex<crate::vbfa::VbfaOnline>,
}

impl OnlineVBFACore {
    /// Run `f` on the model with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut crate::vbfa::VbfaOnline) -> crate::error::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| f(&mut *lock(&self.inner)?).map_err(PyErr::from))
    }
}

#[pymethods]
impl OnlineVBFACore {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, prior, transform, transform_start, translation,
                        init_noise_ratio, seed, schedule, tau0, kappa, rho, n_effective))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        n_features: usize,
        n_components: usize,
        prior: &str,
        transform: bool,
        transform_start: u64,
        translation: &str,
        init_noise_ratio: f64,
        seed: Option<u64>,
        schedule: &str,
        tau0: f64,
        kappa: f64,
        rho: f64,
        n_effective: Option<f64>,
    ) -> PyResult<Self> {
        let model = vbfa_config(
            n_components,
            prior,
            transform,
            transform_start,
            translation,
            init_noise_ratio,
            seed,
        )?;
        let config = crate::vbfa::OnlineConfig {
            model,
            step_size: step_size(schedule, tau0, kappa, rho)?,
            n_effective,
        };
        let engine = py.detach(|| crate::vbfa::VbfaOnline::new(n_features, config))?;
        Ok(OnlineVBFACore {
            inner: Mutex::new(engine),
        })
    }

    /// Process one mini-batch of complete rows.
    fn partial_fit(&self, py: Python<'_>, x: PyReadonlyArray2<'_, f64>) -> PyResult<()> {
        let view = checked_view(&x, "X")?;
        self.with(py, |m| m.partial_fit(view))
    }

    #[getter]
    fn n_seen(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |m| Ok(m.n_seen()))
    }

    #[getter]
    fn n_features(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |m| Ok(m.n_features()))
    }

    #[getter]
    fn n_batches(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |m| Ok(m.n_batches()))
    }

    fn bias_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| m.bias_mean())?.into_pyarray(py))
    }

    fn loading_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.with(py, |m| m.loading_mean())?.into_pyarray(py))
    }

    fn noise_variance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| m.noise_variance())?.into_pyarray(py))
    }

    fn alpha_mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(self.with(py, |m| m.alpha_mean())?.into_pyarray(py))
    }

    fn loading_gram<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.with(py, |m| m.loading_gram())?.into_pyarray(py))
    }

    /// (running mean of ⟨h hᵀ⟩, running mean of h̄).
    #[allow(clippy::type_complexity)]
    fn latent_moments<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<f64>>)> {
        let (gram, mean) = self.with(py, |m| m.latent_moments())?;
        Ok((gram.into_pyarray(py), mean.into_pyarray(py)))
    }

    /// E_q[h] of complete rows.
    fn latent_means<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let view = checked_view(&x, "X")?;
        Ok(self.with(py, |m| m.latent_means(view))?.into_pyarray(py))
    }

    /// Everything needed to resume exactly, as a dict of arrays and scalars (see "VB-FA checkpoints").
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        vbfa_get_state(py, &self.inner)
    }

    /// Rebuild an engine from `get_state()`'s output (validated; ValueError if inconsistent).
    #[staticmethod]
    fn from_state(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<Self> {
        Ok(OnlineVBFACore {
            inner: Mutex::new(vbfa_from_state(py, state)?),
        })
    }
}

/// log N(x_O | c_O, F_O F_Oᵀ + diag ψ_O) of every row (NaN = missing, marginalised out).
#[pyfunction]
pub(crate) fn vbfa_log_likelihood<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'_, f64>,
    mean: numpy::PyReadonlyArray1<'_, f64>,
    loadings: PyReadonlyArray2<'_, f64>,
    noise_variance: numpy::PyReadonlyArray1<'_, f64>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let (x, c, f, psi) = (
        checked_view(&x, "X")?,
        checked_view(&mean, "mean")?,
        checked_view(&loadings, "loadings")?,
        checked_view(&noise_variance, "noise_variance")?,
    );
    let out = py.detach(|| crate::vbfa::plugin_log_likelihood(x, c, f, psi))?;
    Ok(out.into_pyarray(py))
}

// ---- VB-FA checkpoints ----
// `get_state`/`from_state` of VBFACore and OnlineVBFACore: the core's `Checkpoint` map (crate::vbfa's
// checkpoint module lists every entry and the checks `from_state` applies) through the shared dict
// conversion, with the GIL released while the state is copied or validated.

/// The model's checkpoint map as a dict of NumPy arrays and Python scalars, read under its lock.
pub(crate) fn vbfa_get_state<'py, M: Checkpoint + Send>(
    py: Python<'py>,
    inner: &Mutex<M>,
) -> PyResult<Bound<'py, PyDict>> {
    let state = py.detach(|| Ok::<_, PyErr>(lock(inner)?.to_state()))?;
    state_to_dict(py, state)
}

/// A model rebuilt from a `vbfa_get_state` dict; ValueError naming the first invalid entry.
pub(crate) fn vbfa_from_state<M: Checkpoint + Send>(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<M> {
    let map = dict_to_state(state)?;
    py.detach(|| M::from_state(&map)).map_err(PyErr::from)
}
