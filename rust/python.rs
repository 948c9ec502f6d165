//! The Python binding (`onlinefa._core`). Each method borrows the NumPy input, releases the GIL, calls
//! the pure-Rust core and converts the result back. All the documentation users read lives in the Python
//! wrappers (python/onlinefa/_models.py); these classes are their engines.

use ndarray::{Array, Array2, ArrayView, ArrayView2, Dimension};
use numpy::{
    Element, IntoPyArray, PyArray, PyArray1, PyArray2, PyArrayDyn, PyArrayMethods, PyReadonlyArray, PyReadonlyArray1,
    PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use crate::error::FaError;
// The engines' locks: a mutex that, in a child process forked while another thread held it, fails at once
// instead of waiting forever (see rust/fork.rs).
use crate::fork::{LockFailure, Mutex, MutexGuard};
use crate::init::{entropy_seed, orthonormal_loadings};
use crate::online_em::{EmConfig, OnlineEm};
use crate::online_sga::{OnlineSga, SgaConfig};
use crate::query::GaussianRows;
use crate::scalar::Real;
use crate::scaling::Scaling;
use crate::schedule::StepSize;
use crate::state::{Adoptable, Checkpoint, StateMap, StateValue};

pyo3::create_exception!(
    onlinefa._core,
    NumericalBreakdownError,
    pyo3::exceptions::PyArithmeticError,
    "The algorithm broke down numerically (a matrix that must be positive definite is not); the model is unchanged."
);

/// The one conversion of core errors: numerical breakdown → `NumericalBreakdownError` (an
/// `ArithmeticError`), allocation failure → `MemoryError`, everything else (invalid input) → `ValueError`.
pub(crate) fn to_py_err(err: FaError) -> PyErr {
    match err {
        FaError::NotPositiveDefinite(_) | FaError::Diverged(_) => NumericalBreakdownError::new_err(err.to_string()),
        FaError::Allocation { .. } => PyMemoryError::new_err(err.to_string()),
        FaError::CallOrder(_) => PyRuntimeError::new_err(err.to_string()),
        _ => PyValueError::new_err(err.to_string()),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.lock().map_err(|failure| match failure {
        LockFailure::Poisoned => PyRuntimeError::new_err("model state is poisoned by an earlier internal panic"),
        LockFailure::HeldAtFork => PyRuntimeError::new_err(
            "this model was in use by another thread when the process was forked, so its state in this child \
             process may be half-updated and cannot be used; fork while no update is running, or create or \
             load the model in the child",
        ),
    })
}

/// Refuse arrays that an ndarray view (strides counted in items) cannot describe: a byte stride that is
/// not a multiple of the item size (e.g. a float field of a packed record array) or a data pointer not
/// aligned to the item. rust-numpy would divide such strides by the item size, rounding down, and read
/// the wrong addresses. The Python wrappers copy such arrays before they reach the engines
/// (`onlinefa._validation.core_readable`); this is the engines' own guard.
pub(crate) fn check_layout<T: Element, D: Dimension>(arr: &Bound<'_, PyArray<T, D>>, what: &str) -> PyResult<()> {
    if addressable(arr) {
        Ok(())
    } else {
        let item = std::mem::size_of::<T>();
        Err(PyValueError::new_err(format!(
            "{what} cannot be read in place: its byte strides {:?} are not multiples of the {item}-byte item \
             size or its data is not {item}-byte aligned; pass a copy, e.g. numpy.array({what}, order='C')",
            arr.strides()
        )))
    }
}

/// Whether an ndarray view (strides in items, aligned pointer) describes `arr` (see [`check_layout`]).
fn addressable<T: Element, D: Dimension>(arr: &Bound<'_, PyArray<T, D>>) -> bool {
    let item = std::mem::size_of::<T>();
    let strides_in_items = arr
        .shape()
        .iter()
        .zip(arr.strides())
        .all(|(&len, &stride)| len <= 1 || stride.unsigned_abs() % item == 0);
    strides_in_items && (arr.is_empty() || (arr.data() as usize) % std::mem::align_of::<T>() == 0)
}

/// An owned copy of an array of any layout (for inputs that are copied anyway: initial values, saved
/// states): read in place when a view can describe it, else through a C-contiguous copy made by NumPy.
pub(crate) fn owned_copy<T: Element + Copy, D: Dimension>(arr: &Bound<'_, PyArray<T, D>>) -> PyResult<Array<T, D>> {
    if addressable(arr) {
        return Ok(arr.readonly().as_array().to_owned());
    }
    let copy = arr.call_method1("copy", ("C",))?.cast_into::<PyArray<T, D>>()?;
    Ok(copy.readonly().as_array().to_owned())
}

/// The ndarray view of a borrowed NumPy array, after [`check_layout`].
pub(crate) fn checked_view<'a, T: Element, D: Dimension>(
    arr: &'a PyReadonlyArray<'_, T, D>,
    what: &str,
) -> PyResult<ArrayView<'a, T, D>> {
    check_layout(arr, what)?;
    Ok(arr.as_array())
}

/// `init` if given, else orthonormal loadings drawn with `seed` (§4.4).
fn initial_loadings(
    init: Option<PyReadonlyArray2<'_, f64>>,
    n_features: usize,
    n_components: usize,
    seed: Option<u64>,
) -> PyResult<Array2<f64>> {
    match init {
        Some(a) => owned_copy(&a),
        None => {
            if n_components < 1 || n_components >= n_features {
                // Leave the message to the core's validation (same wording for both paths).
                return Ok(Array2::zeros((0, 0)));
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
            StateValue::F32(shape, data) => dict.set_item(key, PyArray1::from_vec(py, data).reshape(shape)?)?,
            StateValue::F64(shape, data) => dict.set_item(key, PyArray1::from_vec(py, data).reshape(shape)?)?,
            StateValue::Int(v) => dict.set_item(key, v)?,
            StateValue::Float(v) => dict.set_item(key, v)?,
            StateValue::Bool(v) => dict.set_item(key, v)?,
            StateValue::Text(v) => dict.set_item(key, v)?,
            StateValue::Adopted(_) => {
                return Err(PyValueError::new_err(format!("state entry `{key}` was not read out")));
            }
        }
    }
    Ok(dict)
}

/// The items of `a` in C order, reusing its buffer when it is laid out so (one copy of a state entry, not two).
fn into_vec<T: Clone, D: Dimension>(a: Array<T, D>) -> Vec<T> {
    if a.is_standard_layout() {
        let len = a.len();
        let (data, offset) = a.into_raw_vec_and_offset();
        if offset.unwrap_or(0) == 0 && data.len() == len {
            return data;
        }
        return data[offset.unwrap_or(0)..][..len].to_vec();
    }
    a.iter().cloned().collect()
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
        } else if let Ok(a) = value.cast::<StateArray>() {
            StateValue::Adopted(Adoptable::new(a.get().take(&key)?))
        } else if let Ok(a) = value.cast::<PyArrayDyn<f64>>() {
            // One copy, which the model then adopts (moves) instead of copying it again.
            StateValue::Adopted(Adoptable::new(StateValue::F64(
                a.shape().to_vec(),
                into_vec(owned_copy(a)?),
            )))
        } else if let Ok(a) = value.cast::<PyArrayDyn<f32>>() {
            StateValue::Adopted(Adoptable::new(StateValue::F32(
                a.shape().to_vec(),
                into_vec(owned_copy(a)?),
            )))
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
pub(crate) enum Typed<A, B> {
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

// ---- streaming queries (crate::query): one lock, one pass over the state, no D×K copy ----

/// Log densities of the rows of `x` (n×D float64) under the model's Gaussian, read under one lock.
fn query_log_prob<'py, A: GaussianRows + Send, B: GaussianRows + Send>(
    py: Python<'py>,
    inner: &Mutex<Typed<A, B>>,
    x: PyReadonlyArray2<'_, f64>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let xv = checked_view(&x, "X")?;
    let out = py.detach(|| {
        Ok::<_, PyErr>(with_model!(&*lock(inner)?, m => crate::query::log_prob(m, xv)).map_err(to_py_err)?)
    })?;
    Ok(out.into_pyarray(py))
}

/// Posterior latent means of the rows of `x` (n×D float64), read under one lock.
fn query_latent_mean<'py, A: GaussianRows + Send, B: GaussianRows + Send>(
    py: Python<'py>,
    inner: &Mutex<Typed<A, B>>,
    x: PyReadonlyArray2<'_, f64>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let xv = checked_view(&x, "X")?;
    let out = py.detach(|| {
        Ok::<_, PyErr>(with_model!(&*lock(inner)?, m => crate::query::latent_mean(m, xv)).map_err(to_py_err)?)
    })?;
    Ok(out.into_pyarray(py))
}

/// Overwrite `out` (n×D float32/float64, holding z) with draws c + F h + ψ^{1/2} ⊙ z, under one lock.
fn query_draw_into<A: GaussianRows + Send, B: GaussianRows + Send>(
    py: Python<'_>,
    inner: &Mutex<Typed<A, B>>,
    h: PyReadonlyArray2<'_, f64>,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let hv = checked_view(&h, "h")?;
    if let Ok(arr) = out.cast::<PyArray2<f64>>() {
        check_layout(arr, "out")?;
        let mut rw = arr.try_readwrite().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let view = rw.as_array_mut();
        py.detach(|| with_model!(&*lock(inner)?, m => crate::query::draw_in_place(m, hv, view)).map_err(to_py_err))
    } else if let Ok(arr) = out.cast::<PyArray2<f32>>() {
        check_layout(arr, "out")?;
        let mut rw = arr.try_readwrite().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let view = rw.as_array_mut();
        py.detach(|| with_model!(&*lock(inner)?, m => crate::query::draw_in_place(m, hv, view)).map_err(to_py_err))
    } else {
        Err(PyTypeError::new_err(
            "out must be a writable 2-D float32 or float64 numpy array",
        ))
    }
}

/// Run `update` on a 2-D float32 or float64 array without copying it, with the GIL released.
macro_rules! update_from_any {
    ($self:ident, $py:ident, $x:ident) => {{
        if let Ok(arr) = $x.cast::<PyArray2<f64>>() {
            let ro = arr.readonly();
            let view: ArrayView2<f64> = checked_view(&ro, "X")?;
            $py.detach(|| -> PyResult<()> {
                let mut guard = lock(&$self.inner)?;
                with_model!(&mut *guard, m => m.update(view)).map_err(to_py_err)
            })
        } else if let Ok(arr) = $x.cast::<PyArray2<f32>>() {
            let ro = arr.readonly();
            let view: ArrayView2<f32> = checked_view(&ro, "X")?;
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
                let is_f32 = map.get("mean").is_some_and(StateValue::is_f32);
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

            /// Warm-up length: queries answer once more than this many samples were seen.
            #[getter]
            fn n_warmup(&self, py: Python<'_>) -> PyResult<u64> {
                py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.n_warmup())))
            }

            /// Whether warm-up is over (loadings and noise variances fitted rather than initial).
            #[getter]
            fn is_fitted(&self, py: Python<'_>) -> PyResult<bool> {
                py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.is_fitted())))
            }

            /// Log densities of the rows of X (n×D float64), streaming over the state under one lock.
            fn log_prob<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray1<f64>>> {
                query_log_prob(py, &self.inner, x)
            }

            /// Posterior latent means E[h | x] of the rows of X (n×D float64), under one lock.
            fn latent_mean<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray2<f64>>> {
                query_latent_mean(py, &self.inner, x)
            }

            /// Overwrite `out` (n×D, holding z) with c + F h + ψ^{1/2} ⊙ z, under one lock.
            fn draw_into(&self, py: Python<'_>, h: PyReadonlyArray2<'_, f64>, out: &Bound<'_, PyAny>) -> PyResult<()> {
                query_draw_into(py, &self.inner, h, out)
            }

            /// Validate a batch X (n×D float32/float64) as `update` does, applying nothing.
            fn check_batch(&self, py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<()> {
                crate::python_sharded::with_matrix(py, x, "X", |view| {
                    with_model!(&*lock(&self.inner)?, m => match view {
                        crate::python_sharded::AnyView2::F64(v) => m.check_batch(v),
                        crate::python_sharded::AnyView2::F32(v) => m.check_batch(v),
                    })
                    .map_err(to_py_err)
                })
            }

            /// First half of one step of a model split across processes: (S (K×K), u (K), Σ d̄²) of these
            /// rows for sample x (this part's D entries, float32/float64).
            #[allow(clippy::type_complexity)]
            fn local_sums<'py>(
                &self,
                py: Python<'py>,
                x: &Bound<'py, PyAny>,
            ) -> PyResult<(Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<f64>>, f64)> {
                let sums = crate::python_sharded::with_vector(py, x, "x", |view| {
                    let mut guard = lock(&self.inner)?;
                    with_model!(&mut *guard, m => match view {
                        crate::python_sharded::AnyView1::F64(v) => m.local_sums(v),
                        crate::python_sharded::AnyView1::F32(v) => m.local_sums(v),
                    })
                    .map_err(to_py_err)
                })?;
                Ok((sums.s.into_pyarray(py), sums.u.into_pyarray(py), sums.dsq_sum))
            }

            /// Second half: finish the step from the sums of every part (`n_features_total` rows in all).
            fn apply_sums(
                &self,
                py: Python<'_>,
                s: PyReadonlyArray2<'_, f64>,
                u: PyReadonlyArray1<'_, f64>,
                dsq_sum: f64,
                n_features_total: usize,
            ) -> PyResult<()> {
                let sums = crate::online_em::StepSums { s: owned_copy(&s)?, u: owned_copy(&u)?, dsq_sum };
                py.detach(|| {
                    let mut guard = lock(&self.inner)?;
                    with_model!(&mut *guard, m => m.apply(&sums, n_features_total)).map_err(to_py_err)
                })
            }

            /// The additive query sums of these rows for X (n×D float64), flat (see `crate::query::QuerySums`).
            fn query_sums<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray1<f64>>> {
                crate::python_sharded::query_sums(py, &self.inner, x)
            }

            /// (n_seen, mean, loadings, noise_variance) read under one lock: one consistent state.
            #[allow(clippy::type_complexity)]
            fn snapshot<'py>(
                &self,
                py: Python<'py>,
            ) -> PyResult<(u64, Bound<'py, PyArray1<f64>>, Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<f64>>)> {
                let (t, mean, f, psi) = py.detach(|| {
                    Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => {
                        (m.n_seen(), m.mean(), m.loadings(), m.noise_variance())
                    }))
                })?;
                Ok((t, mean.into_pyarray(py), f.into_pyarray(py), psi.into_pyarray(py)))
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
                        schedule, tau0, kappa, rho, whiten, scaling))]
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
        scaling: &str,
    ) -> PyResult<Self> {
        let step_size = step_size(schedule, tau0, kappa, rho)?;
        let config = EmConfig {
            n_warmup,
            noise_floor,
            step_size,
            whiten,
            scaling: Scaling::parse(scaling).map_err(to_py_err)?,
        };
        let init = initial_loadings(init, n_features, n_components, seed)?;
        let inner = py.detach(|| match dtype {
            "float32" => OnlineEm::new(n_features, n_components, init.view(), config).map(Typed::F32),
            "float64" => OnlineEm::new(n_features, n_components, init.view(), config).map(Typed::F64),
            other => Err(crate::error::invalid(
                "dtype",
                format!("must be 'float32' or 'float64', got {other:?}"),
            )),
        });
        Ok(OnlineEMCore {
            inner: Mutex::new(inner.map_err(to_py_err)?),
        })
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
                        schedule, tau0, kappa, rho, scaling))]
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
        scaling: &str,
    ) -> PyResult<Self> {
        let step_size = step_size(schedule, tau0, kappa, rho)?;
        let config = SgaConfig {
            lr,
            n_warmup,
            noise_floor,
            step_size,
            scaling: Scaling::parse(scaling).map_err(to_py_err)?,
        };
        let init = initial_loadings(init, n_features, n_components, seed)?;
        let inner = py.detach(|| match dtype {
            "float32" => OnlineSga::new(n_features, n_components, init.view(), config).map(Typed::F32),
            "float64" => OnlineSga::new(n_features, n_components, init.view(), config).map(Typed::F64),
            other => Err(crate::error::invalid(
                "dtype",
                format!("must be 'float32' or 'float64', got {other:?}"),
            )),
        });
        Ok(OnlineSGACore {
            inner: Mutex::new(inner.map_err(to_py_err)?),
        })
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
    let q = py
        .detach(|| orthonormal_loadings(n_features, n_components, seed))
        .map_err(to_py_err)?;
    Ok(q.into_pyarray(py))
}

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::storage_snapshot;
    #[pymodule_export]
    use super::GFACore;
    #[pymodule_export]
    use super::MiniBatchEMCore;
    #[pymodule_export]
    use super::NumericalBreakdownError;
    #[pymodule_export]
    use super::OnlineGFACore;
    #[pymodule_export]
    use super::StateArray;
    #[pymodule_export]
    use super::{orthonormal_init, OnlineEMCore, OnlineSGACore, VIFACore};
    #[pymodule_export]
    use super::{vbfa_log_likelihood, OnlineVBFACore, VBFACore};
    #[pymodule_export]
    use crate::python_sharded::{
        fill_sample_noise, latent_mean_from_sums, log_prob_from_sums, snapshot_max_elements, standard_normal_rows,
    };
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
        let view: ArrayView2<f64> = checked_view(&ro, "grad")?;
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&core.inner)?;
            with_model!(&mut *guard, m => m.step(view)).map_err(to_py_err)
        })
    } else if let Ok(arr) = grads.cast::<PyArray2<f32>>() {
        let ro = arr.readonly();
        let view: ArrayView2<f32> = checked_view(&ro, "grad")?;
        py.detach(|| -> PyResult<()> {
            let mut guard = lock(&core.inner)?;
            with_model!(&mut *guard, m => m.step(view)).map_err(to_py_err)
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
            optimizer: Optimizer::parse(optimizer).map_err(to_py_err)?,
            n_grad_samples,
            clip_grad_norm,
        };
        let loadings = match init {
            Some(a) => owned_copy(&a)?,
            None => {
                validate_vifa_dims(n_features, n_components).map_err(to_py_err)?;
                py.detach(|| orthonormal_loadings(n_features, n_components, seed))
                    .map_err(to_py_err)?
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
            inner: Mutex::new(inner.map_err(to_py_err)?),
        })
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

    /// Phase 1 of a step split across processes: validate grads (L×D) and return these rows' part of the
    /// squared gradient norms (None without clipping). Changes nothing.
    fn local_gradient_norms(&self, py: Python<'_>, grads: &Bound<'_, PyAny>) -> PyResult<Option<[f64; 3]>> {
        crate::python_sharded::with_matrix(py, grads, "grad", |view| {
            with_model!(&*lock(&self.inner)?, m => match view {
                crate::python_sharded::AnyView2::F64(v) => m.local_gradient_norms(v),
                crate::python_sharded::AnyView2::F32(v) => m.local_gradient_norms(v),
            })
            .map_err(to_py_err)
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
        let (gram, finite) = crate::python_sharded::with_matrix(py, grads, "grad", |view| {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => match view {
                crate::python_sharded::AnyView2::F64(v) => m.local_step(v, sq_norms),
                crate::python_sharded::AnyView2::F32(v) => m.local_step(v, sq_norms),
            })
            .map_err(to_py_err)
        })?;
        Ok((gram.into_pyarray(py), finite))
    }

    /// Phase 3: (I + B)⁻¹ from the whole model's B (K×K); error if the step diverged on any part.
    fn finish_step(&self, py: Python<'_>, gram: PyReadonlyArray2<'_, f64>, finite: bool) -> PyResult<()> {
        let gram = owned_copy(&gram)?;
        py.detach(|| {
            let mut guard = lock(&self.inner)?;
            with_model!(&mut *guard, m => m.finish_step(gram.view(), finite)).map_err(to_py_err)
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
        crate::python_sharded::query_sums(py, &self.inner, x)
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
            with_model!(&mut *guard, m => m.set_learning_rates(lr)).map_err(to_py_err)
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
            inner: Mutex::new(inner.map_err(to_py_err)?),
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
        query_log_prob(py, &self.inner, x)
    }

    /// Posterior latent means E[h | x] of the rows of X (n×D float64), under one lock.
    fn latent_mean<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'_, f64>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        query_latent_mean(py, &self.inner, x)
    }

    /// Overwrite `out` (n×D, holding z) with c + F h + ψ^{1/2} ⊙ z, under one lock.
    fn draw_into(&self, py: Python<'_>, h: PyReadonlyArray2<'_, f64>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        query_draw_into(py, &self.inner, h, out)
    }

    fn log_noise_variance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let v = py.detach(|| Ok::<_, PyErr>(with_model!(&*lock(&self.inner)?, m => m.log_noise_variance())))?;
        Ok(v.into_pyarray(py))
    }
}
// ---- end of VIFA binding ----

// ---- VBFA binding ----
// Engines of `onlinefa.VBFA` and `onlinefa.OnlineVBFA` (python/onlinefa/vbfa.py documents the behaviour
// users see). Names from crate::vbfa are written in full so this section needs no change to the imports.

/// Two NumPy vectors (e.g. Gamma shapes and rates).
type VbfaVectorPair<'py> = (Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<f64>>);

/// The model settings shared by both VB-FA engines.
#[allow(clippy::too_many_arguments)]
fn vbfa_config(
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
        py.detach(|| f(&mut *lock(&self.inner)?).map_err(to_py_err))
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
        let model = py
            .detach(|| crate::vbfa::VbfaBatch::new(view, config))
            .map_err(to_py_err)?;
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
        let step = crate::vbfa::Step::parse(step).map_err(to_py_err)?;
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
        py.detach(|| f(&mut *lock(&self.inner)?).map_err(to_py_err))
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
        let engine = py
            .detach(|| crate::vbfa::VbfaOnline::new(n_features, config))
            .map_err(to_py_err)?;
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
fn vbfa_log_likelihood<'py>(
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
    let out = py
        .detach(|| crate::vbfa::plugin_log_likelihood(x, c, f, psi))
        .map_err(to_py_err)?;
    Ok(out.into_pyarray(py))
}

// ---- VB-FA checkpoints ----
// `get_state`/`from_state` of VBFACore and OnlineVBFACore: the core's `Checkpoint` map (crate::vbfa's
// checkpoint module lists every entry and the checks `from_state` applies) through the shared dict
// conversion, with the GIL released while the state is copied or validated.

/// The model's checkpoint map as a dict of NumPy arrays and Python scalars, read under its lock.
fn vbfa_get_state<'py, M: Checkpoint + Send>(py: Python<'py>, inner: &Mutex<M>) -> PyResult<Bound<'py, PyDict>> {
    let state = py.detach(|| Ok::<_, PyErr>(lock(inner)?.to_state()))?;
    state_to_dict(py, state)
}

/// A model rebuilt from a `vbfa_get_state` dict; ValueError naming the first invalid entry.
fn vbfa_from_state<M: Checkpoint + Send>(py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<M> {
    let map = dict_to_state(state)?;
    py.detach(|| M::from_state(&map)).map_err(to_py_err)
}
// ---- end of VBFA binding ----

// ---- GFA binding ----
// Engine of `onlinefa.GFA` (python/onlinefa/gfa.py documents the behaviour users see). Names from
// crate::gfa are written in full so this section needs no change to the imports above.

/// Three NumPy arrays returned together (the fit history: bound, factors, seconds).
type GfaHistory<'py> = (
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
);

/// Two NumPy matrices (predictive means and variances; Gamma shapes and rates).
type GfaMatrixPair<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>);

/// The noise model named "group" or "feature".
fn gfa_noise(noise: &str) -> PyResult<crate::gfa::NoiseModel> {
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
        py.detach(|| f(&mut *lock(&self.inner)?).map_err(to_py_err))
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
        let model = py
            .detach(|| {
                let groups = crate::gfa::Groups::from_labels(&groups)?;
                crate::gfa::GfaBatch::new(view, groups, config)
            })
            .map_err(to_py_err)?;
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
        let step = crate::gfa::GfaStep::parse(step).map_err(to_py_err)?;
        self.with(py, |m| m.apply(step))
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
        let model = py
            .detach(|| crate::gfa::GfaBatch::from_state(&map))
            .map_err(to_py_err)?;
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
        let engine = py
            .detach(|| crate::gfa::GfaOnline::new(crate::gfa::Groups::from_labels(&groups)?, config))
            .map_err(to_py_err)?;
        Ok(OnlineGFACore {
            inner: Mutex::new(engine),
        })
    }

    /// Process one mini-batch of complete rows (atomic: an error leaves the model as it was).
    fn partial_fit(&self, py: Python<'_>, x: PyReadonlyArray2<'_, f64>) -> PyResult<()> {
        let view = checked_view(&x, "X")?;
        py.detach(|| lock(&self.inner)?.partial_fit(view).map_err(to_py_err))
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
        let model = py
            .detach(|| crate::gfa::GfaOnline::from_state(&map))
            .map_err(to_py_err)?;
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
// ---- end of GFA binding ----

// ---- Mini-batch EM binding ----
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

// ---- checkpoint arrays read straight into the engines' memory ----
// `onlinefa.checkpoint` streams each float array of a checkpoint into a `StateArray`; an engine's
// `from_state` then moves the vector into the model instead of copying it, so loading peaks at about
// 1× the state instead of 3× (Python copy, state-map copy, model copy).

/// A float32/float64 array of a checkpoint, filled in chunks by `write` and moved (not copied) into the
/// engine by the first `from_state` that reads it.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct StateArray {
    value: Mutex<Option<StateValue>>,
    shape: Vec<usize>,
    dtype: &'static str,
}

/// A zero-filled vector of `len` items; MemoryError instead of an abort when it cannot be allocated.
fn zeroed_vec<T: Clone + Default>(len: usize) -> PyResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| PyMemoryError::new_err(format!("cannot allocate a state array of {len} items")))?;
    v.resize(len, T::default());
    Ok(v)
}

/// The bytes of a float vector (every bit pattern is a valid float).
fn float_bytes_mut<T: Real>(v: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(v);
    // SAFETY: f32/f64 are plain old data without padding; any byte pattern is a valid value, and the
    // returned slice borrows `v` mutably for its whole lifetime.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) }
}

impl StateArray {
    /// Move the filled array out (converted from little-endian); ValueError if it was taken already.
    fn take(&self, key: &str) -> PyResult<StateValue> {
        let value = lock(&self.value)?.take();
        let value = value.ok_or_else(|| {
            PyValueError::new_err(format!(
                "invalid state: entry `{key}` was already used by another model"
            ))
        })?;
        Ok(match value {
            StateValue::F32(s, d) if cfg!(target_endian = "big") => StateValue::F32(
                s,
                d.into_iter()
                    .map(|v| f32::from_bits(u32::from_le(v.to_bits())))
                    .collect(),
            ),
            StateValue::F64(s, d) if cfg!(target_endian = "big") => StateValue::F64(
                s,
                d.into_iter()
                    .map(|v| f64::from_bits(u64::from_le(v.to_bits())))
                    .collect(),
            ),
            other => other,
        })
    }
}

#[pymethods]
impl StateArray {
    /// A zero-filled array of `dtype` ("float32" or "float64") and `shape`.
    #[new]
    fn new(dtype: &str, shape: Vec<usize>) -> PyResult<Self> {
        let len = shape
            .iter()
            .try_fold(1usize, |acc, &n| acc.checked_mul(n))
            .ok_or_else(|| PyValueError::new_err(format!("state array shape {shape:?} is too large")))?;
        let (value, dtype) = match dtype {
            "float32" => (StateValue::F32(shape.clone(), zeroed_vec(len)?), "float32"),
            "float64" => (StateValue::F64(shape.clone(), zeroed_vec(len)?), "float64"),
            other => {
                return Err(PyValueError::new_err(format!(
                    "state arrays are float32 or float64, got {other:?}"
                )))
            }
        };
        Ok(StateArray {
            value: Mutex::new(Some(value)),
            shape,
            dtype,
        })
    }

    /// Copy `data` (little-endian item bytes) to byte `offset` of the array.
    fn write(&self, offset: usize, data: &[u8]) -> PyResult<()> {
        let mut guard = lock(&self.value)?;
        let bytes = match guard.as_mut() {
            Some(StateValue::F32(_, v)) => float_bytes_mut(v),
            Some(StateValue::F64(_, v)) => float_bytes_mut(v),
            _ => return Err(PyValueError::new_err("the state array was already used")),
        };
        let end = offset
            .checked_add(data.len())
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| PyValueError::new_err("write past the end of the state array"))?;
        bytes[offset..end].copy_from_slice(data);
        Ok(())
    }

    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype
    }

    /// Size of the data in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        let item = if self.dtype == "float32" { 4 } else { 8 };
        self.shape.iter().product::<usize>() * item
    }
}

/// The float64 array of a `StateArray` entry `key`, taken without a copy (None for any other value).
fn adopted_f64(state: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<ndarray::ArrayD<f64>>> {
    let Some(value) = state.get_item(key)? else {
        return Ok(None);
    };
    let Ok(array) = value.cast::<StateArray>() else {
        return Ok(None);
    };
    match array.get().take(key)? {
        StateValue::F64(shape, data) => ndarray::ArrayD::from_shape_vec(shape, data)
            .map(Some)
            .map_err(|e| PyValueError::new_err(format!("invalid state: entry `{key}`: {e}"))),
        _ => Err(PyValueError::new_err(format!(
            "invalid state: entry `{key}` must be float64"
        ))),
    }
}

/// `a` with `D` dimensions (ValueError naming `key` otherwise).
fn into_dim<D: Dimension>(a: ndarray::ArrayD<f64>, key: &str) -> PyResult<Array<f64, D>> {
    a.into_dimensionality::<D>().map_err(|_| {
        PyValueError::new_err(format!(
            "invalid state: entry `{key}` has the wrong number of dimensions"
        ))
    })
}

// ---- the fitted Gaussian in the storage dtype ----
// The scikit-learn exports of a float32 model (`components_`, `noise_variance_`, `mean_`) are float32,
// built from this snapshot without a float64 D×K intermediate.

/// (mean, F, ψ) of `model`, each value rounded once from the float64 the queries use to the storage type
/// `T`, gathered block by block (no float64 D×K copy). Shapes: D, D×K, D.
fn rows_as<T: Real, G: GaussianRows + ?Sized>(model: &G) -> crate::error::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let (d, k) = model.dims();
    let (mut mean, mut f, mut psi) = (Vec::new(), Vec::new(), Vec::new());
    for (v, len) in [(&mut mean, d), (&mut f, d.saturating_mul(k)), (&mut psi, d)] {
        v.try_reserve_exact(len).map_err(|_| FaError::Allocation {
            what: "n_features",
            len,
        })?;
    }
    model.visit_rows(&mut |_, m, rows, p| {
        mean.extend(m.iter().map(|&v| T::from_f64(v)));
        f.extend(rows.iter().map(|&v| T::from_f64(v)));
        psi.extend(p.iter().map(|&v| T::from_f64(v)));
        Ok(())
    })?;
    Ok((mean, f, psi))
}

type StorageSnapshot<'py> = (u64, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// NumPy arrays of (mean, F, ψ) in the storage type, F reshaped to D×K.
fn storage_arrays<'py, T: Element + Real>(
    py: Python<'py>,
    t: u64,
    (mean, f, psi): (Vec<T>, Vec<T>, Vec<T>),
    k: usize,
) -> PyResult<StorageSnapshot<'py>> {
    let rows = psi.len();
    Ok((
        t,
        PyArray1::from_vec(py, mean).into_any(),
        PyArray1::from_vec(py, f).reshape([rows, k])?.into_any(),
        PyArray1::from_vec(py, psi).into_any(),
    ))
}

/// (n_seen, mean, F, ψ) of an `OnlineEMCore` or `OnlineSGACore` in its storage dtype (float32 or float64),
/// read under one lock: one consistent fitted state, the float64 `snapshot()` rounded to the storage type.
#[pyfunction]
fn storage_snapshot<'py>(py: Python<'py>, core: &Bound<'py, PyAny>) -> PyResult<StorageSnapshot<'py>> {
    macro_rules! read {
        ($inner:expr) => {{
            let inner = $inner;
            let k = with_model!(&*lock(inner)?, m => m.n_components());
            let rows = py.detach(|| {
                let guard = lock(inner)?;
                match &*guard {
                    Typed::F32(m) => rows_as::<f32, _>(m).map(|r| (m.n_seen(), Typed::F32(r))),
                    Typed::F64(m) => rows_as::<f64, _>(m).map(|r| (m.n_seen(), Typed::F64(r))),
                }
                .map_err(to_py_err)
            })?;
            match rows {
                (t, Typed::F32(r)) => storage_arrays(py, t, r, k),
                (t, Typed::F64(r)) => storage_arrays(py, t, r, k),
            }
        }};
    }
    if let Ok(c) = core.cast::<OnlineEMCore>() {
        read!(&c.get().inner)
    } else if let Ok(c) = core.cast::<OnlineSGACore>() {
        read!(&c.get().inner)
    } else {
        Err(PyTypeError::new_err(
            "storage_snapshot expects an OnlineEMCore or OnlineSGACore",
        ))
    }
}
