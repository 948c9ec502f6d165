//! The Python binding (`onlinefa._core`). Each method borrows the NumPy input, releases the GIL, calls
//! the pure-Rust core and converts the result back. All the documentation users read lives in the Python
//! wrappers (python/onlinefa/_models.py); these classes are their engines.

use std::sync::{Mutex, MutexGuard};

use ndarray::{Array2, ArrayView2};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayDyn, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use crate::error::FaError;
use crate::init::{entropy_seed, orthonormal_loadings};
use crate::online_em::{EmConfig, OnlineEm};
use crate::online_sga::{OnlineSga, SgaConfig};
use crate::scalar::Real;
use crate::schedule::StepSize;
use crate::state::{Checkpoint, StateMap, StateValue};

fn to_py_err(err: FaError) -> PyErr {
    PyValueError::new_err(err.to_string())
}

fn lock<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.lock().map_err(|_| PyRuntimeError::new_err("model state is poisoned by an earlier internal panic"))
}

/// `init` if given, else orthonormal loadings drawn with `seed` (§4.4).
fn initial_loadings(
    init: Option<PyReadonlyArray2<'_, f64>>,
    n_features: usize,
    n_components: usize,
    seed: Option<u64>,
) -> PyResult<Array2<f64>> {
    match init {
        Some(a) => Ok(a.as_array().to_owned()),
        None => {
            if n_components < 1 || n_components >= n_features {
                // Leave the message to the core's validation (same wording for both paths).
                return Ok(Array2::zeros((n_features, n_components)));
            }
            orthonormal_loadings(n_features, n_components, seed.unwrap_or_else(entropy_seed)).map_err(to_py_err)
        }
    }
}

fn step_size(kind: &str, tau0: f64, kappa: f64, rho: f64) -> PyResult<StepSize> {
    match kind {
        "harmonic" => Ok(StepSize::Harmonic),
        "power" => Ok(StepSize::Power { tau0, kappa }),
        "constant" => Ok(StepSize::Constant(rho)),
        other => Err(PyValueError::new_err(format!(
            "schedule must be 'harmonic', 'power' or 'constant', got {other:?}"
        ))),
    }
}

/// Convert a checkpoint map to a dict of NumPy arrays and Python scalars.
fn state_to_dict<'py>(py: Python<'py>, state: StateMap) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in state {
        match value {
            StateValue::F32(shape, data) => {
                dict.set_item(key, PyArray1::from_vec(py, data).reshape(shape)?)?
            }
            StateValue::F64(shape, data) => {
                dict.set_item(key, PyArray1::from_vec(py, data).reshape(shape)?)?
            }
            StateValue::Int(v) => dict.set_item(key, v)?,
            StateValue::Float(v) => dict.set_item(key, v)?,
            StateValue::Bool(v) => dict.set_item(key, v)?,
            StateValue::Text(v) => dict.set_item(key, v)?,
        }
    }
    Ok(dict)
}

/// Convert a dict written by `state_to_dict` (or read back from a checkpoint file) into a map.
fn dict_to_state(dict: &Bound<'_, PyDict>) -> PyResult<StateMap> {
    let mut state = StateMap::new();
    for (key, value) in dict.iter() {
        let key: String = key.extract()?;
        let entry = if value.is_instance_of::<PyBool>() {
            StateValue::Bool(value.extract()?)
        } else if value.is_instance_of::<PyInt>() {
            StateValue::Int(value.extract()?)
        } else if value.is_instance_of::<PyFloat>() {
            StateValue::Float(value.extract()?)
        } else if value.is_instance_of::<PyString>() {
            StateValue::Text(value.extract()?)
        } else if let Ok(a) = value.cast::<PyArrayDyn<f64>>() {
            StateValue::F64(a.shape().to_vec(), a.readonly().as_array().iter().copied().collect())
        } else if let Ok(a) = value.cast::<PyArrayDyn<f32>>() {
            StateValue::F32(a.shape().to_vec(), a.readonly().as_array().iter().copied().collect())
        } else {
            return Err(PyValueError::new_err(format!(
                "invalid state: entry `{key}` must be a float32/float64 array or a Python scalar"
            )));
        };
        state.insert(key, entry);
    }
    Ok(state)
}

/// A model with f32 or f64 state.
enum Typed<A, B> {
    F32(A),
    F64(B),
}

macro_rules! with_model {
    ($typed:expr, $m:ident => $body:expr) => {
        match $typed {
            Typed::F32($m) => $body,
            Typed::F64($m) => $body,
        }
    };
}

/// Run `update` on a 2-D float32 or float64 array without copying it, with the GIL released.
macro_rules! update_from_any {
    ($self:ident, $py:ident, $x:ident) => {{
        if let Ok(arr) = $x.cast::<PyArray2<f64>>() {
            let ro = arr.readonly();
            let view: ArrayView2<f64> = ro.as_array();
            $py.detach(|| -> PyResult<()> {
                let mut guard = lock(&$self.inner)?;
                with_model!(&mut *guard, m => m.update(view)).map_err(to_py_err)
            })
        } else if let Ok(arr) = $x.cast::<PyArray2<f32>>() {
            let ro = arr.readonly();
            let view: ArrayView2<f32> = ro.as_array();
            $py.detach(|| -> PyResult<()> {
                let mut guard = lock(&$self.inner)?;
                with_model!(&mut *guard, m => m.update(view)).map_err(to_py_err)
            })
        } else {
            Err(PyTypeError::new_err("update expects a 2-D float32 or float64 numpy array"))
        }
    }};
}

/// Shared read-only accessors (mean, loadings, noise_variance, n_seen) computed with the GIL released.
macro_rules! model_methods {
    ($ty:ident, { $($ctor:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($ctor)*

            fn update(&self, py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<()> {
                update_from_any!(self, py, x)
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
                let is_f32 = matches!(map.get("mean"), Some(StateValue::F32(..)));
                let inner = py.detach(|| {
                    if is_f32 {
                        Checkpoint::from_state(&map).map(Typed::F32)
                    } else {
                        Checkpoint::from_state(&map).map(Typed::F64)
                    }
                });
                Ok(Self { inner: Mutex::new(inner.map_err(to_py_err)?) })
            }

            #[getter]
            fn n_seen(&self, py: Python<'_>) -> PyResult<u64> {
                py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.n_seen())))
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
                let v =
                    py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.noise_variance())))?;
                Ok(v.into_pyarray(py))
            }
        }
    };
}

/// Engine of `onlinefa.OnlineEM`.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct OnlineEMCore {
    inner: Mutex<Typed<OnlineEm<f32>, OnlineEm<f64>>>,
}

model_methods!(OnlineEMCore, {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, init, seed, n_warmup, noise_floor, dtype,
                        schedule, tau0, kappa, rho, whiten))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        n_features: usize,
        n_components: usize,
        init: Option<PyReadonlyArray2<'_, f64>>,
        seed: Option<u64>,
        n_warmup: u64,
        noise_floor: f64,
        dtype: &str,
        schedule: &str,
        tau0: f64,
        kappa: f64,
        rho: f64,
        whiten: bool,
    ) -> PyResult<Self> {
        let step_size = step_size(schedule, tau0, kappa, rho)?;
        let config = EmConfig { n_warmup, noise_floor, step_size, whiten };
        let init = initial_loadings(init, n_features, n_components, seed)?;
        let inner = py.detach(|| match dtype {
            "float32" => OnlineEm::new(n_features, n_components, init.view(), config).map(Typed::F32),
            "float64" => OnlineEm::new(n_features, n_components, init.view(), config).map(Typed::F64),
            other => Err(crate::error::invalid("dtype", format!("must be 'float32' or 'float64', got {other:?}"))),
        });
        Ok(OnlineEMCore { inner: Mutex::new(inner.map_err(to_py_err)?) })
    }
});

/// Engine of `onlinefa.OnlineSGA`.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct OnlineSGACore {
    inner: Mutex<Typed<OnlineSga<f32>, OnlineSga<f64>>>,
}

model_methods!(OnlineSGACore, {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, init, seed, lr, n_warmup, noise_floor, dtype,
                        schedule, tau0, kappa, rho))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        n_features: usize,
        n_components: usize,
        init: Option<PyReadonlyArray2<'_, f64>>,
        seed: Option<u64>,
        lr: f64,
        n_warmup: u64,
        noise_floor: f64,
        dtype: &str,
        schedule: &str,
        tau0: f64,
        kappa: f64,
        rho: f64,
    ) -> PyResult<Self> {
        let step_size = step_size(schedule, tau0, kappa, rho)?;
        let config = SgaConfig { lr, n_warmup, noise_floor, step_size };
        let init = initial_loadings(init, n_features, n_components, seed)?;
        let inner = py.detach(|| match dtype {
            "float32" => OnlineSga::new(n_features, n_components, init.view(), config).map(Typed::F32),
            "float64" => OnlineSga::new(n_features, n_components, init.view(), config).map(Typed::F64),
            other => Err(crate::error::invalid("dtype", format!("must be 'float32' or 'float64', got {other:?}"))),
        });
        Ok(OnlineSGACore { inner: Mutex::new(inner.map_err(to_py_err)?) })
    }
});

/// Draw an orthonormal D×K matrix (§4.4 initialisation) with a seed; exposed for tests and tools.
#[pyfunction]
#[pyo3(signature = (n_features, n_components, seed))]
fn orthonormal_init<'py>(
    py: Python<'py>,
    n_features: usize,
    n_components: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    if n_components < 1 || n_components > n_features {
        return Err(PyValueError::new_err("need 1 <= n_components <= n_features"));
    }
    let q = py.detach(|| orthonormal_loadings(n_features, n_components, seed)).map_err(to_py_err)?;
    Ok(q.into_pyarray(py))
}

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::{orthonormal_init, OnlineEMCore, OnlineSGACore, VIFACore};
}

// ---- VIFA binding ----
// Engine of `onlinefa.VIFA` (python/onlinefa/vifa.py documents the behaviour users see). Names from
// crate::vifa are written in full so this section needs no change to the imports above.

/// Engine of `onlinefa.VIFA`.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct VIFACore {
    inner: Mutex<Typed<crate::vifa::Vifa<f32>, crate::vifa::Vifa<f64>>>,
}

/// Run `step` on a 2-D float32 or float64 gradient array, read in place, with the GIL released.
fn vifa_step_any(core: &VIFACore, py: Python<'_>, grads: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(arr) = grads.cast::<PyArray2<f64>>() {
        let ro = arr.readonly();
        let view: ArrayView2<f64> = ro.as_array();
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&core.inner)?;
            with_model!(&mut *guard, m => m.step(view)).map_err(to_py_err)
        })
    } else if let Ok(arr) = grads.cast::<PyArray2<f32>>() {
        let ro = arr.readonly();
        let view: ArrayView2<f32> = ro.as_array();
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&core.inner)?;
            with_model!(&mut *guard, m => m.step(view)).map_err(to_py_err)
        })
    } else {
        Err(PyTypeError::new_err("step expects a 2-D float32 or float64 numpy array"))
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
            lr: LearningRates { mean: lr_mean, loadings: lr_loadings, log_noise: lr_log_noise },
            optimizer: Optimizer::parse(optimizer).map_err(to_py_err)?,
            n_grad_samples,
            clip_grad_norm,
        };
        let loadings = match init {
            Some(a) => a.as_array().to_owned(),
            None => {
                validate_vifa_dims(n_features, n_components).map_err(to_py_err)?;
                py.detach(|| orthonormal_loadings(n_features, n_components, seed)).map_err(to_py_err)?
            }
        };
        let mean = init_mean.as_ref().map(|a| a.as_array());
        let noise_variance = init_noise_variance.as_ref().map(|a| a.as_array());
        let inner = py.detach(|| {
            let start = VifaInit { loadings: loadings.view(), mean, noise_variance };
            match dtype {
                "float32" => Vifa::new(n_features, n_components, start, seed, config).map(Typed::F32),
                "float64" => Vifa::new(n_features, n_components, start, seed, config).map(Typed::F64),
                other => Err(crate::error::invalid("dtype", format!("must be 'float32' or 'float64', got {other:?}"))),
            }
        });
        Ok(VIFACore { inner: Mutex::new(inner.map_err(to_py_err)?) })
    }

    /// Training draw θ = F h + c + ψ^{1/2} ⊙ z (4.50), remembered for the next step.
    fn sample<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let theta = py.detach(|| -> PyResult<_> {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => m.sample()).map_err(to_py_err)
        })?;
        Ok(theta.into_pyarray(py))
    }

    /// One optimiser step from the (L, D) gradients of the full-data NLL at the pending draws.
    fn step(&self, py: Python<'_>, grads: &Bound<'_, PyAny>) -> PyResult<()> {
        vifa_step_any(self, py, grads)
    }

    /// (h, z) of the pending draws: (n_pending, K) and (n_pending, D).
    #[allow(clippy::type_complexity)]
    fn pending_noise<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>)> {
        let (h, z) = py.detach(|| -> PyResult<_> { Ok(with_model!(&*lock(&self.inner)?, m => m.pending_noise())) })?;
        Ok((h.into_pyarray(py), z.into_pyarray(py)))
    }

    /// Replace η_c, η_F, η_β (finite, >= 0).
    fn set_learning_rates(&self, py: Python<'_>, lr_mean: f64, lr_loadings: f64, lr_log_noise: f64) -> PyResult<()> {
        let lr = crate::vifa::LearningRates { mean: lr_mean, loadings: lr_loadings, log_noise: lr_log_noise };
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => m.set_learning_rates(lr)).map_err(to_py_err)
        })
    }

    /// The hyper-parameters and the seed, as a dict of Python scalars.
    fn hyper_parameters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (config, seed) =
            py.detach(|| -> PyResult<_> { Ok(with_model!(&*lock(&self.inner)?, m => (m.config().clone(), m.seed()))) })?;
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
        let is_f32 = matches!(map.get("mean"), Some(StateValue::F32(..)));
        let inner = py.detach(|| {
            if is_f32 {
                Checkpoint::from_state(&map).map(Typed::F32)
            } else {
                Checkpoint::from_state(&map).map(Typed::F64)
            }
        });
        Ok(Self { inner: Mutex::new(inner.map_err(to_py_err)?) })
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

    fn log_noise_variance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let v = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.log_noise_variance())))?;
        Ok(v.into_pyarray(py))
    }
}
// ---- end of VIFA binding ----
