//! Engine of `onlinefa.MiniBatchEM`.

use super::state_arrays::{adopted_f64, into_dim};
use ndarray::{Array2, ArrayView2};
use numpy::{Element, IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use crate::fork::Mutex;
use crate::scalar::Real;
use crate::schedule::StepSize;

// Engine of `onlinefa.MiniBatchEM` (python/onlinefa/minibatch.py documents the behaviour users see).

/// Engine of `onlinefa.MiniBatchEM`.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct MiniBatchEMCore {
    inner: Mutex<crate::minibatch::MiniBatchEm>,
}

impl MiniBatchEMCore {
    fn apply<X: Real + Element>(&self, py: Python<'_>, arr: &Bound<'_, PyArray2<X>>) -> PyResult<()> {
        let ro = arr.readonly();
        let view: ArrayView2<X> = checked_view(&ro, "X")?;
        py.detach(|| lock(&self.inner)?.update(view).map_err(to_py_err))
    }
}

#[pymethods]
impl MiniBatchEMCore {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, init, seed, noise_floor, schedule, tau0, kappa, rho,
                        whiten, mean=None, variance=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        n_features: usize,
        n_components: usize,
        init: Option<PyReadonlyArray2<'_, f64>>,
        seed: Option<u64>,
        noise_floor: f64,
        schedule: &str,
        tau0: f64,
        kappa: f64,
        rho: f64,
        whiten: bool,
        mean: Option<PyReadonlyArray1<'_, f64>>,
        variance: Option<PyReadonlyArray1<'_, f64>>,
    ) -> PyResult<Self> {
        let config = crate::minibatch::MiniBatchConfig {
            schedule: step_size(schedule, tau0, kappa, rho)?,
            whiten,
            noise_floor,
        };
        let moments = match (mean, variance) {
            (Some(m), Some(v)) => Some(crate::minibatch::Moments {
                mean: owned_copy(&m)?,
                variance: owned_copy(&v)?,
            }),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("mean and variance must be given together")),
        };
        let init = initial_loadings(init, n_features, n_components, seed)?;
        let init = if init.is_empty() {
            Array2::zeros((n_features, n_components))
        } else {
            init
        };
        let inner = py.detach(|| crate::minibatch::MiniBatchEm::new(init.view(), config, moments));
        Ok(MiniBatchEMCore {
            inner: Mutex::new(inner.map_err(to_py_err)?),
        })
    }

    /// Apply one mini-batch (2-D float32 or float64 array), with the GIL released.
    fn update(&self, py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(arr) = x.cast::<PyArray2<f64>>() {
            self.apply(py, arr)
        } else if let Ok(arr) = x.cast::<PyArray2<f32>>() {
            self.apply(py, arr)
        } else {
            Err(PyTypeError::new_err(
                "update expects a 2-D float32 or float64 numpy array",
            ))
        }
    }

    #[getter]
    fn n_seen(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| Ok(lock(&self.inner)?.n_seen()))
    }

    /// The complete state as a dict of arrays and scalars (pickling and checkpoints).
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = py.detach(|| Ok::<_, PyErr>(lock(&self.inner)?.to_parts()))?;
        let (kind, tau0, kappa, rho) = match p.config.schedule {
            StepSize::Harmonic => ("harmonic", 0.0, 0.9, 0.01),
            StepSize::Power { tau0, kappa } => ("power", tau0, kappa, 0.01),
            StepSize::Constant(rho) => ("constant", 0.0, 0.9, rho),
        };
        let out = PyDict::new(py);
        out.set_item("n_features", p.loadings.nrows())?;
        out.set_item("n_components", p.loadings.ncols())?;
        out.set_item("schedule", kind)?;
        out.set_item("tau0", tau0)?;
        out.set_item("kappa", kappa)?;
        out.set_item("rho", rho)?;
        out.set_item("whiten", p.config.whiten)?;
        out.set_item("noise_floor", p.config.noise_floor)?;
        out.set_item("fixed", p.fixed)?;
        out.set_item("started", p.started)?;
        out.set_item("n_seen", p.n_seen)?;
        out.set_item("n_batches", p.n_batches)?;
        out.set_item("mean", p.mean.into_pyarray(py))?;
        out.set_item("dsq", p.dsq.into_pyarray(py))?;
        out.set_item("psi", p.psi.into_pyarray(py))?;
        out.set_item("a_bar", p.a_bar.into_pyarray(py))?;
        out.set_item("b_bar", p.b_bar.into_pyarray(py))?;
        out.set_item("loadings", p.loadings.into_pyarray(py))?;
        Ok(out)
    }

    /// Rebuild an engine from `get_state()`'s output (validated; ValueError if inconsistent).
    #[staticmethod]
    fn from_state(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<Self> {
        fn item<'py, T: FromPyObjectOwned<'py>>(state: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
            state
                .get_item(key)?
                .ok_or_else(|| PyValueError::new_err(format!("mini-batch EM state: missing {key:?}")))?
                .extract::<T>()
                .map_err(|_| PyValueError::new_err(format!("mini-batch EM state: {key:?} has the wrong type")))
        }
        fn vector(state: &Bound<'_, PyDict>, key: &str) -> PyResult<ndarray::Array1<f64>> {
            match adopted_f64(state, key)? {
                Some(a) => into_dim(a, key),
                None => owned_copy(&item::<Bound<'_, PyArray1<f64>>>(state, key)?),
            }
        }
        fn matrix(state: &Bound<'_, PyDict>, key: &str) -> PyResult<Array2<f64>> {
            match adopted_f64(state, key)? {
                Some(a) => into_dim(a, key),
                None => owned_copy(&item::<Bound<'_, PyArray2<f64>>>(state, key)?),
            }
        }
        let schedule: String = item(state, "schedule")?;
        let config = crate::minibatch::MiniBatchConfig {
            schedule: step_size(
                &schedule,
                item(state, "tau0")?,
                item(state, "kappa")?,
                item(state, "rho")?,
            )?,
            whiten: item(state, "whiten")?,
            noise_floor: item(state, "noise_floor")?,
        };
        let parts = crate::minibatch::MiniBatchParts {
            config,
            fixed: item(state, "fixed")?,
            started: item(state, "started")?,
            n_seen: item(state, "n_seen")?,
            n_batches: item(state, "n_batches")?,
            mean: vector(state, "mean")?,
            dsq: vector(state, "dsq")?,
            psi: vector(state, "psi")?,
            a_bar: matrix(state, "a_bar")?,
            b_bar: matrix(state, "b_bar")?,
            loadings: matrix(state, "loadings")?,
        };
        let inner = py
            .detach(|| crate::minibatch::MiniBatchEm::from_parts(parts))
            .map_err(to_py_err)?;
        Ok(MiniBatchEMCore {
            inner: Mutex::new(inner),
        })
    }

    #[getter]
    fn n_batches(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| Ok(lock(&self.inner)?.n_batches()))
    }

    #[getter]
    fn is_fitted(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| Ok(lock(&self.inner)?.is_fitted()))
    }

    /// (n_seen, mean, loadings, noise_variance) read under one lock: one consistent state.
    #[allow(clippy::type_complexity)]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        u64,
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray2<f64>>,
        Bound<'py, PyArray1<f64>>,
    )> {
        let (t, mean, f, psi) = py.detach(|| {
            let m = lock(&self.inner)?;
            Ok::<_, PyErr>((
                m.n_seen(),
                m.mean().to_owned(),
                m.loadings().to_owned(),
                m.noise_variance().to_owned(),
            ))
        })?;
        Ok((t, mean.into_pyarray(py), f.into_pyarray(py), psi.into_pyarray(py)))
    }
}
