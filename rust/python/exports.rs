//! The fitted Gaussian in the storage dtype (float32 exports without a float64 copy).

use super::streaming::{OnlineEMCore, OnlineSGACore};
use numpy::{Element, PyArray1, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::common::*;
use crate::query::rows_as;
use crate::scalar::Real;
use crate::shrinkage::Reported;

// ---- the fitted Gaussian in the storage dtype ----
// The scikit-learn exports of a float32 model (`components_`, `noise_variance_`, `mean_`) are float32,
// built from this snapshot without a float64 D×K intermediate.

pub(crate) type StorageSnapshot<'py> = (u64, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// NumPy arrays of (mean, F, ψ) in the storage type, F reshaped to D×K.
pub(crate) fn storage_arrays<'py, T: Element + Real>(
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
/// read under one lock: one consistent fitted state (as the model reports itself), the float64 `snapshot()`
/// rounded to the storage type.
#[pyfunction]
pub(crate) fn storage_snapshot<'py>(py: Python<'py>, core: &Bound<'py, PyAny>) -> PyResult<StorageSnapshot<'py>> {
    macro_rules! read {
        ($inner:expr) => {{
            let inner = $inner;
            let k = with_model!(&*lock(inner)?, m => m.n_components());
            let rows = py.detach(|| {
                let guard = lock(inner)?;
                match &*guard {
                    Typed::F32(m) => Reported::of(m, None)
                        .and_then(|g| rows_as::<f32, _>(&g))
                        .map(|r| (m.n_seen(), Typed::F32(r))),
                    Typed::F64(m) => Reported::of(m, None)
                        .and_then(|g| rows_as::<f64, _>(&g))
                        .map(|r| (m.n_seen(), Typed::F64(r))),
                }
                .map_err(PyErr::from)
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
