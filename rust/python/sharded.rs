//! Binding helpers for models whose rows are split across processes (`onlinefa.distributed`): borrowed
//! float32/float64 inputs, the additive query sums, counter-based sample noise and the rows of the seeded
//! initial draw. The split-step methods themselves live with each engine class (`streaming.rs`, `vifa.rs`).

use ndarray::Axis;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::common::{check_layout, checked_view, lock, owned_transform, Typed};
use crate::fork::Mutex;
use crate::noise::{latent_draw, SAMPLE_SALT};
use crate::query::{GaussianRows, QuerySums};
use crate::scalar::Real;
use crate::shrinkage::Reported;

/// The flat query sums of a model's rows for X (n×D), read under one lock.
pub(crate) fn query_sums<'py, A: GaussianRows + Send, B: GaussianRows + Send>(
    py: Python<'py>,
    inner: &Mutex<Typed<A, B>>,
    x: PyReadonlyArray2<'_, f64>,
    transform: Option<PyReadonlyArray2<'_, f64>>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let xv = checked_view(&x, "X")?;
    let map = owned_transform(transform)?;
    let flat = py.detach(|| -> PyResult<Vec<f64>> {
        let sums = match &*lock(inner)? {
            Typed::F32(m) => Reported::of(m, map).and_then(|g| crate::query::query_sums(&g, xv)),
            Typed::F64(m) => Reported::of(m, map).and_then(|g| crate::query::query_sums(&g, xv)),
        };
        Ok(sums?.to_flat())
    })?;
    Ok(flat.into_pyarray(py))
}

/// Log densities of n samples under a model of `n_features` rows in all, from the query sums of every part.
#[pyfunction]
pub(crate) fn log_prob_from_sums<'py>(
    py: Python<'py>,
    sums: PyReadonlyArray1<'_, f64>,
    n_samples: usize,
    n_components: usize,
    n_features: usize,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let flat = sums.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
    let parsed = QuerySums::from_flat(flat, n_samples, n_components)?;
    let out = crate::query::log_prob_from_sums(&parsed, n_features)?;
    Ok(out.into_pyarray(py))
}

/// Posterior latent means (n×K) from the query sums of every part.
#[pyfunction]
pub(crate) fn latent_mean_from_sums<'py>(
    py: Python<'py>,
    sums: PyReadonlyArray1<'_, f64>,
    n_samples: usize,
    n_components: usize,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let flat = sums.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
    let parsed = QuerySums::from_flat(flat, n_samples, n_components)?;
    let out = crate::query::latent_mean_from_sums(parsed)?;
    Ok(out.into_pyarray(py))
}

/// The noise of `sample`: h_j (row j of `latent`, n×K) and z_j for the features row0 … row0 + D' − 1 (row j
/// of `noise`, n×D', float32 or float64), draw j from stream j of the seed's key (`crate::noise`). The values
/// of a feature do not depend on where the vector is split.
#[pyfunction]
pub(crate) fn fill_sample_noise(
    py: Python<'_>,
    seed: u64,
    row0: usize,
    latent: &Bound<'_, PyArray2<f64>>,
    noise: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let key = seed ^ SAMPLE_SALT;
    check_layout(latent, "latent")?;
    let mut latent_rw = latent
        .try_readwrite()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut latent_view = latent_rw.as_array_mut();
    let k = latent_view.ncols();
    py.detach(|| {
        for (j, mut row) in latent_view.axis_iter_mut(Axis(0)).enumerate() {
            row.assign(&latent_draw(key, j as u64, k));
        }
    });
    if let Ok(arr) = noise.cast::<PyArray2<f64>>() {
        check_layout(arr, "noise")?;
        let mut rw = arr.try_readwrite().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut view = rw.as_array_mut();
        py.detach(|| fill_noise_array(key, row0, view.view_mut()));
        Ok(())
    } else if let Ok(arr) = noise.cast::<PyArray2<f32>>() {
        check_layout(arr, "noise")?;
        let mut rw = arr.try_readwrite().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut view = rw.as_array_mut();
        py.detach(|| fill_noise_array(key, row0, view.view_mut()));
        Ok(())
    } else {
        Err(PyTypeError::new_err(
            "noise must be a writable 2-D float32 or float64 numpy array",
        ))
    }
}

/// The noise z of draws 0 … n − 1 for features row0 … written over `view` (n×D): in parallel tasks when the
/// array is one contiguous block, row by row otherwise (the same values either way).
fn fill_noise_array<T: Real>(key: u64, row0: usize, mut view: ndarray::ArrayViewMut2<'_, T>) {
    let d = view.ncols();
    if let Some(flat) = view.as_slice_mut() {
        crate::noise::fill_noise_rows(key, row0, flat, d);
        return;
    }
    let mut buf = vec![T::default(); d];
    for (j, mut row) in view.axis_iter_mut(Axis(0)).enumerate() {
        crate::noise::fill_noise(key, j as u64, row0, &mut buf);
        row.assign(&ndarray::ArrayView1::from(&buf[..]));
    }
}

/// Rows row0 … row0 + n_rows − 1 of the standard-normal D×K matrix that the seeded initial loadings are
/// computed from (`crate::init`), shape (n_rows, n_components).
#[pyfunction]
pub(crate) fn standard_normal_rows<'py>(
    py: Python<'py>,
    seed: u64,
    row0: usize,
    n_rows: usize,
    n_components: usize,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let size = crate::error::checked_size(n_rows, n_components)?;
    let buffer = crate::error::try_filled(size, 0.0, "n_rows")?;
    let mut out = ndarray::Array2::from_shape_vec((n_rows, n_components), buffer)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.detach(|| crate::init::fill_standard_normal_rows(out.view_mut(), seed, row0));
    Ok(out.into_pyarray(py))
}

/// Largest D·K for which a failed batch update is rolled back to the state before the batch (larger
/// models keep the samples before the failing one, see `OnlineEm::update`).
#[pyfunction]
pub(crate) fn snapshot_max_elements() -> usize {
    crate::engine::partition::SNAPSHOT_MAX_ELEMENTS
}
