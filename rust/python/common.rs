//! What every engine class shares: the error conversion, the model lock, borrowed NumPy inputs, the
//! f32/f64 dispatch and the streaming queries.

use ndarray::{Array, Array2, ArrayView, Dimension};
use numpy::{
    Element, IntoPyArray, PyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::error::FaError;
// The engines' locks: a mutex that, in a child process forked while another thread held it, fails at once
// instead of waiting forever (see rust/fork.rs).
use crate::fork::{LockFailure, Mutex, MutexGuard};
use crate::init::{entropy_seed, orthonormal_loadings};
use crate::query::GaussianRows;
use crate::schedule::StepSize;
use crate::shrinkage::Reported;

pyo3::create_exception!(
    onlinefa._core,
    NumericalBreakdownError,
    pyo3::exceptions::PyArithmeticError,
    "The algorithm broke down numerically (a matrix that must be positive definite is not); the model is unchanged."
);

/// The one conversion of core errors: numerical breakdown → `NumericalBreakdownError` (an
/// `ArithmeticError`), allocation failure → `MemoryError`, everything else (invalid input) → `ValueError`.
impl From<FaError> for PyErr {
    /// The Python exception of each error kind: numerical breakdowns raise `NumericalBreakdownError`,
    /// allocation failures `MemoryError`, calls out of order `RuntimeError`, everything else `ValueError`.
    fn from(err: FaError) -> PyErr {
        to_py_err(err)
    }
}

/// See `From<FaError> for PyErr`.
fn to_py_err(err: FaError) -> PyErr {
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
pub(crate) fn addressable<T: Element, D: Dimension>(arr: &Bound<'_, PyArray<T, D>>) -> bool {
    let item = std::mem::size_of::<T>();
    let strides_in_items = arr
        .shape()
        .iter()
        .zip(arr.strides())
        .all(|(&len, &stride)| len <= 1 || stride.unsigned_abs() % item == 0);
    strides_in_items && (arr.is_empty() || (arr.data() as usize).is_multiple_of(std::mem::align_of::<T>()))
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
pub(crate) fn initial_loadings(
    init: Option<PyReadonlyArray2<'_, f64>>,
    n_features: usize,
    n_components: usize,
    seed: Option<u64>,
) -> PyResult<Array2<f64>> {
    match init {
        Some(a) => owned_copy(&a),
        None => {
            crate::config_checks::check_components(n_features, n_components)?;
            orthonormal_loadings(n_features, n_components, seed.unwrap_or_else(entropy_seed)).map_err(PyErr::from)
        }
    }
}

pub(crate) fn step_size(kind: &str, tau0: f64, kappa: f64, rho: f64) -> PyResult<StepSize> {
    match kind {
        "harmonic" => Ok(StepSize::Harmonic),
        "power" => Ok(StepSize::Power { tau0, kappa }),
        "constant" => Ok(StepSize::Constant(rho)),
        other => Err(PyValueError::new_err(format!(
            "schedule must be 'harmonic', 'power' or 'constant', got {other:?}"
        ))),
    }
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
// Each query reads the model as it reports itself (crate::shrinkage::Reported): mapped by `transform` (K×K)
// when given — the map a model split across processes computes over all its rows — else by the model's own.

/// An optional K×K transform from Python as an owned array.
pub(crate) fn owned_transform(transform: Option<PyReadonlyArray2<'_, f64>>) -> PyResult<Option<Array2<f64>>> {
    transform.map(|t| Ok(t.as_array().to_owned())).transpose()
}

/// Log densities of the rows of `x` (n×D float64) under the model's Gaussian, read under one lock.
pub(crate) fn query_log_prob<'py, A: GaussianRows + Send, B: GaussianRows + Send>(
    py: Python<'py>,
    inner: &Mutex<Typed<A, B>>,
    x: PyReadonlyArray2<'_, f64>,
    transform: Option<PyReadonlyArray2<'_, f64>>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let xv = checked_view(&x, "X")?;
    let map = owned_transform(transform)?;
    let out = py.detach(|| -> PyResult<_> {
        with_model!(&*lock(inner)?, m => Reported::of(m, map).and_then(|g| crate::query::log_prob(&g, xv)))
            .map_err(PyErr::from)
    })?;
    Ok(out.into_pyarray(py))
}

/// Posterior latent means of the rows of `x` (n×D float64), read under one lock.
pub(crate) fn query_latent_mean<'py, A: GaussianRows + Send, B: GaussianRows + Send>(
    py: Python<'py>,
    inner: &Mutex<Typed<A, B>>,
    x: PyReadonlyArray2<'_, f64>,
    transform: Option<PyReadonlyArray2<'_, f64>>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let xv = checked_view(&x, "X")?;
    let map = owned_transform(transform)?;
    let out = py.detach(|| -> PyResult<_> {
        with_model!(&*lock(inner)?, m => Reported::of(m, map).and_then(|g| crate::query::latent_mean(&g, xv)))
            .map_err(PyErr::from)
    })?;
    Ok(out.into_pyarray(py))
}

/// Overwrite `out` (n×D float32/float64, holding z) with draws c + F h + ψ^{1/2} ⊙ z, under one lock.
pub(crate) fn query_draw_into<A: GaussianRows + Send, B: GaussianRows + Send>(
    py: Python<'_>,
    inner: &Mutex<Typed<A, B>>,
    h: PyReadonlyArray2<'_, f64>,
    out: &Bound<'_, PyAny>,
    transform: Option<PyReadonlyArray2<'_, f64>>,
) -> PyResult<()> {
    let hv = checked_view(&h, "h")?;
    let map = owned_transform(transform)?;
    if let Ok(arr) = out.cast::<PyArray2<f64>>() {
        check_layout(arr, "out")?;
        let mut rw = arr.try_readwrite().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let view = rw.as_array_mut();
        py.detach(|| {
            with_model!(&*lock(inner)?, m => Reported::of(m, map).and_then(|g| crate::query::draw_in_place(&g, hv, view)))
                .map_err(PyErr::from)
        })
    } else if let Ok(arr) = out.cast::<PyArray2<f32>>() {
        check_layout(arr, "out")?;
        let mut rw = arr.try_readwrite().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let view = rw.as_array_mut();
        py.detach(|| {
            with_model!(&*lock(inner)?, m => Reported::of(m, map).and_then(|g| crate::query::draw_in_place(&g, hv, view)))
                .map_err(PyErr::from)
        })
    } else {
        Err(PyTypeError::new_err(
            "out must be a writable 2-D float32 or float64 numpy array",
        ))
    }
}
