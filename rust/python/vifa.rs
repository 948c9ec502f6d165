//! Engine of `onlinefa.VIFA`.

use ndarray::ArrayView2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray2};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use super::state_arrays::{dict_to_state, state_to_dict};
use crate::fork::Mutex;
use crate::init::{entropy_seed, orthonormal_loadings};
use crate::scalar::Real;
use crate::state::{Checkpoint, StateValue};

// Engine of `onlinefa.VIFA` (python/onlinefa/vifa.py documents the behaviour users see). Names from
// crate::vifa are written in full so this section needs no change to the imports above.

/// Engine of `onlinefa.VIFA`.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct VIFACore {
    pub(crate) inner: Mutex<Typed<crate::vifa::Vifa<f32>, crate::vifa::Vifa<f64>>>,
}

/// Run `step` on a 2-D float32 or float64 gradient array, read in place, with the GIL released.
pub(crate) fn vifa_step_any(core: &VIFACore, py: Python<'_>, grads: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(arr) = grads.cast::<PyArray2<f64>>() {
        let ro = arr.readonly();
        let view: ArrayView2<f64> = checked_view(&ro, "grad")?;
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&core.inner)?;
            with_model!(&mut *guard, m => m.step(view)).map_err(PyErr::from)
        })
    } else if let Ok(arr) = grads.cast::<PyArray2<f32>>() {
        let ro = arr.readonly();
        let view: ArrayView2<f32> = checked_view(&ro, "grad")?;
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&core.inner)?;
            with_model!(&mut *guard, m => m.step(view)).map_err(PyErr::from)
        })
    } else {
        Err(PyTypeError::new_err(
            "step expects a 2-D float32 or float64 numpy array",
        ))
    }
}

#[pymethods]
impl VIFACore {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, init, init_mean, init_noise_variance, seed,
                        prior_precision, lr_mean, lr_loadings, lr_log_noise, optimizer, n_grad_samples,
                        clip_grad_norm, dtype))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        n_features: usize,
        n_components: usize,
        init: Option<PyReadonlyArray2<'_, f64>>,
        init_mean: Option<numpy::PyReadonlyArray1<'_, f64>>,
        init_noise_variance: Option<numpy::PyReadonlyArray1<'_, f64>>,
        seed: Option<u64>,
        prior_precision: f64,
        lr_mean: f64,
        lr_loadings: f64,
        lr_log_noise: f64,
        optimizer: &str,
        n_grad_samples: usize,
        clip_grad_norm: Option<f64>,
        dtype: &str,
    ) -> PyResult<Self> {
        use crate::vifa::{validate_vifa_dims, LearningRates, Optimizer, Vifa, VifaConfig, VifaInit};
        let seed = seed.unwrap_or_else(entropy_seed);
        let config = VifaConfig {
            prior_precision,
            lr: LearningRates {
                mean: lr_mean,
                loadings: lr_loadings,
                log_noise: lr_log_noise,
            },
            optimizer: Optimizer::parse(optimizer)?,
            n_grad_samples,
            clip_grad_norm,
        };
        let loadings = match init {
            Some(a) => owned_copy(&a)?,
            None => {
                validate_vifa_dims(n_features, n_components)?;
                py.detach(|| orthonormal_loadings(n_features, n_components, seed))?
            }
        };
        let init_mean = init_mean.as_ref().map(|a| owned_copy(a)).transpose()?;
        let init_noise_variance = init_noise_variance.as_ref().map(|a| owned_copy(a)).transpose()?;
        let mean = init_mean.as_ref().map(|a| a.view());
        let noise_variance = init_noise_variance.as_ref().map(|a| a.view());
        let inner = py.detach(|| {
            let start = VifaInit {
                loadings: loadings.view(),
                mean,
                noise_variance,
            };
            match dtype {
                "float32" => Vifa::new(n_features, n_components, start, seed, config).map(Typed::F32),
                "float64" => Vifa::new(n_features, n_components, start, seed, config).map(Typed::F64),
                other => Err(crate::error::invalid(
                    "dtype",
                    format!("must be 'float32' or 'float64', got {other:?}"),
                )),
            }
        });
        Ok(VIFACore {
            inner: Mutex::new(inner?),
        })
    }

    /// Training draw θ = F h + c + ψ^{1/2} ⊙ z (4.50), remembered for the next step.
    fn sample<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let theta = py.detach(|| -> PyResult<_> {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => m.sample()).map_err(PyErr::from)
        })?;
        Ok(theta.into_pyarray(py))
    }

    /// One optimiser step from the (L, D) gradients of the full-data NLL at the pending draws.
    fn step(&self, py: Python<'_>, grads: &Bound<'_, PyAny>) -> PyResult<()> {
        vifa_step_any(self, py, grads)
    }

    /// Phase 1 of a step split across processes: validate grads (L×D) and return these rows' part of the
    /// squared gradient norms (None without clipping). Changes nothing.
    fn local_gradient_norms(&self, py: Python<'_>, grads: &Bound<'_, PyAny>) -> PyResult<Option<[f64; 3]>> {
        super::any_float::with_matrix(py, grads, "grad", |view| {
            with_model!(&*lock(&self.inner)?, m => match view {
                super::any_float::AnyView2::F64(v) => m.local_gradient_norms(v),
                super::any_float::AnyView2::F32(v) => m.local_gradient_norms(v),
            })
            .map_err(PyErr::from)
        })
    }

    /// Phase 2: apply the step to these rows with the whole model's squared norms; returns (this part of
    /// B = Fᵀ Ψ⁻¹ F, all finite).
    fn local_step<'py>(
        &self,
        py: Python<'py>,
        grads: &Bound<'py, PyAny>,
        sq_norms: Option<[f64; 3]>,
    ) -> PyResult<(Bound<'py, PyArray2<f64>>, bool)> {
        let (gram, finite) = super::any_float::with_matrix(py, grads, "grad", |view| {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => match view {
                super::any_float::AnyView2::F64(v) => m.local_step(v, sq_norms),
                super::any_float::AnyView2::F32(v) => m.local_step(v, sq_norms),
            })
            .map_err(PyErr::from)
        })?;
        Ok((gram.into_pyarray(py), finite))
    }

    /// These rows' part of B = Fᵀ Ψ⁻¹ F (K×K) from the stored parameters, summed as `local_step` sums it.
    fn local_gram<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let gram = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.local_gram())))?;
        Ok(gram.into_pyarray(py))
    }

    /// Phase 3: (I + B)⁻¹ from the whole model's B (K×K); error if the step diverged on any part.
    fn finish_step(&self, py: Python<'_>, gram: PyReadonlyArray2<'_, f64>, finite: bool) -> PyResult<()> {
        let gram = owned_copy(&gram)?;
        py.detach(|| {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => m.finish_step(gram.view(), finite)).map_err(PyErr::from)
        })
    }

    /// Index of this model's first row in a vector split across processes (its noise is that of those rows).
    #[getter]
    fn row_offset(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.row_offset())))
    }

    #[setter]
    fn set_row_offset(&self, py: Python<'_>, row_offset: usize) -> PyResult<()> {
        py.detach(|| {
            with_model!(&mut *lock(&self.inner)?, m => m.set_row_offset(row_offset));
            Ok(())
        })
    }

    /// The additive query sums of these rows for X (n×D float64), flat (see `crate::query::QuerySums`).
    fn query_sums<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        super::sharded::query_sums(py, &self.inner, x, None)
    }

    /// (h, z) of the pending draws: (n_pending, K) and (n_pending, D).
    #[allow(clippy::type_complexity)]
    fn pending_noise<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>)> {
        let (h, z) = py.detach(|| -> PyResult<_> { Ok(with_model!(&*lock(&self.inner)?, m => m.pending_noise())) })?;
        Ok((h.into_pyarray(py), z.into_pyarray(py)))
    }

    /// Replace η_c, η_F, η_β (finite, >= 0).
    fn set_learning_rates(&self, py: Python<'_>, lr_mean: f64, lr_loadings: f64, lr_log_noise: f64) -> PyResult<()> {
        let lr = crate::vifa::LearningRates {
            mean: lr_mean,
            loadings: lr_loadings,
            log_noise: lr_log_noise,
        };
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => m.set_learning_rates(lr)).map_err(PyErr::from)
        })
    }

    /// Replace the prior precision α (finite, >= 0).
    fn set_prior_precision(&self, py: Python<'_>, alpha: f64) -> PyResult<()> {
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => m.set_prior_precision(alpha)).map_err(PyErr::from)
        })
    }

    /// The hyper-parameters and the seed, as a dict of Python scalars.
    fn hyper_parameters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (config, seed) = py
            .detach(|| -> PyResult<_> { Ok(with_model!(&*lock(&self.inner)?, m => (m.config().clone(), m.seed()))) })?;
        let dict = PyDict::new(py);
        dict.set_item("prior_precision", config.prior_precision)?;
        dict.set_item("lr_mean", config.lr.mean)?;
        dict.set_item("lr_loadings", config.lr.loadings)?;
        dict.set_item("lr_log_noise", config.lr.log_noise)?;
        dict.set_item("optimizer", config.optimizer.name())?;
        dict.set_item("n_grad_samples", config.n_grad_samples)?;
        dict.set_item("clip_grad_norm", config.clip_grad_norm)?;
        dict.set_item("seed", seed)?;
        Ok(dict)
    }

    /// Everything needed to resume exactly, as a dict of arrays and scalars.
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.to_state())))?;
        state_to_dict(py, state)
    }

    /// Rebuild an engine from `get_state()`'s output (validated; ValueError if inconsistent).
    #[staticmethod]
    fn from_state(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<Self> {
        let map = dict_to_state(state)?;
        let is_f32 = map.get("mean").is_some_and(StateValue::is_f32);
        let inner = py.detach(|| {
            if is_f32 {
                Checkpoint::from_state(&map).map(Typed::F32)
            } else {
                Checkpoint::from_state(&map).map(Typed::F64)
            }
        });
        Ok(Self {
            inner: Mutex::new(inner?),
        })
    }

    #[getter]
    fn n_steps(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.n_steps())))
    }

    #[getter]
    fn n_draws(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.n_draws())))
    }

    #[getter]
    fn n_pending(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.n_pending())))
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<&'static str> {
        py.detach(|| {
            Ok(match &*lock(&self.inner)? {
                Typed::F32(_) => f32::NAME,
                Typed::F64(_) => f64::NAME,
            })
        })
    }

    fn mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let v = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.mean())))?;
        Ok(v.into_pyarray(py))
    }

    fn loadings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let v = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.loadings())))?;
        Ok(v.into_pyarray(py))
    }

    fn noise_variance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let v = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.noise_variance())))?;
        Ok(v.into_pyarray(py))
    }

    /// (mean, loadings, noise_variance) read under one lock: one consistent state.
    #[allow(clippy::type_complexity)]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray2<f64>>,
        Bound<'py, PyArray1<f64>>,
    )> {
        let (mean, f, psi) = py.detach(|| {
            Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => (m.mean(), m.loadings(), m.noise_variance())))
        })?;
        Ok((mean.into_pyarray(py), f.into_pyarray(py), psi.into_pyarray(py)))
    }

    /// Log densities of the rows of X (n×D float64), streaming over the state under one lock.
    fn log_prob<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        query_log_prob(py, &self.inner, x, None)
    }

    /// Posterior latent means E[h | x] of the rows of X (n×D float64), under one lock.
    fn latent_mean<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        query_latent_mean(py, &self.inner, x, None)
    }

    /// Overwrite `out` (n×D, holding z) with c + F h + ψ^{1/2} ⊙ z, under one lock.
    fn draw_into(&self, py: Python<'_>, h: PyReadonlyArray2<'_, f64>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        query_draw_into(py, &self.inner, h, out, None)
    }

    fn log_noise_variance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let v = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.log_noise_variance())))?;
        Ok(v.into_pyarray(py))
    }
}
