//! Borrowed float32/float64 NumPy inputs for every engine class: one branch on the dtype, the array read in
//! place (no copy) with the GIL released.

use ndarray::{ArrayView1, ArrayView2};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::common::checked_view;

/// A borrowed float32 or float64 vector.
pub(crate) enum AnyView1<'a> {
    F32(ArrayView1<'a, f32>),
    F64(ArrayView1<'a, f64>),
}

/// A borrowed float32 or float64 matrix.
pub(crate) enum AnyView2<'a> {
    F32(ArrayView2<'a, f32>),
    F64(ArrayView2<'a, f64>),
}

/// Run `body` on a 1-D float32/float64 array read in place, with the GIL released.
pub(crate) fn with_vector<R: Send>(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    what: &str,
    body: impl FnOnce(AnyView1<'_>) -> PyResult<R> + Send,
) -> PyResult<R> {
    if let Ok(arr) = x.cast::<PyArray1<f64>>() {
        let ro = arr.readonly();
        let view = checked_view(&ro, what)?;
        py.detach(|| body(AnyView1::F64(view)))
    } else if let Ok(arr) = x.cast::<PyArray1<f32>>() {
        let ro = arr.readonly();
        let view = checked_view(&ro, what)?;
        py.detach(|| body(AnyView1::F32(view)))
    } else {
        Err(PyTypeError::new_err(format!(
            "{what} must be a 1-D float32 or float64 numpy array"
        )))
    }
}

/// Run `body` on a 2-D float32/float64 array read in place, with the GIL released.
pub(crate) fn with_matrix<R: Send>(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    what: &str,
    body: impl FnOnce(AnyView2<'_>) -> PyResult<R> + Send,
) -> PyResult<R> {
    if let Ok(arr) = x.cast::<PyArray2<f64>>() {
        let ro = arr.readonly();
        let view = checked_view(&ro, what)?;
        py.detach(|| body(AnyView2::F64(view)))
    } else if let Ok(arr) = x.cast::<PyArray2<f32>>() {
        let ro = arr.readonly();
        let view = checked_view(&ro, what)?;
        py.detach(|| body(AnyView2::F32(view)))
    } else {
        Err(PyTypeError::new_err(format!(
            "{what} must be a 2-D float32 or float64 numpy array"
        )))
    }
}
