//! Engine of `onlinefa.MiniBatchEM`.

use super::state_arrays::{adopted_f64, into_dim};
use ndarray::{Array2, ArrayView2, Axis};
use numpy::{Element, IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
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

/// Run `f` on the rows of `arr` (all, or those at `rows`, in that order) as row slices read in place, with
/// the GIL released. Indices are checked first; non-contiguous rows are copied (only the picked ones).
fn with_batch<X: Real + Element, R: Send>(
    py: Python<'_>,
    arr: &Bound<'_, PyArray2<X>>,
    rows: Option<&PyReadonlyArray1<'_, i64>>,
    f: impl FnOnce(&[&[X]]) -> PyResult<R> + Send,
) -> PyResult<R> {
    let ro = arr.readonly();
    let view: ArrayView2<X> = checked_view(&ro, "X")?;
    let n = view.nrows();
    let index: Vec<usize> = match rows {
        None => (0..n).collect(),
        Some(rows) => {
            let index = rows.as_array();
            if let Some(&bad) = index.iter().find(|&&i| i < 0 || i as u64 >= n as u64) {
                return Err(PyIndexError::new_err(format!(
                    "rows: index {bad} is out of bounds for X with {n} rows"
                )));
            }
            index.iter().map(|&i| i as usize).collect()
        }
    };
    let contiguous = view.ncols() == 0 || n == 0 || view.row(0).as_slice().is_some();
    let copy = (!contiguous).then(|| view.select(Axis(0), &index).as_standard_layout().into_owned());
    py.detach(|| {
        let slices: Vec<&[X]> = match &copy {
            Some(picked) => picked.rows().into_iter().filter_map(|r| r.to_slice()).collect(),
            None => index.iter().filter_map(|&i| view.row(i).to_slice()).collect(),
        };
        if slices.len() != index.len() {
            return Err(PyValueError::new_err("X: rows could not be read as contiguous slices"));
        }
        f(&slices)
    })
}

/// Dispatch `$body` (a closure over row slices of either float type) on a float64 or float32 2-D array.
macro_rules! on_float_batch {
    ($py:expr, $x:expr, $rows:expr, $what:literal, |$r:ident| $body:expr) => {
        if let Ok(arr) = $x.cast::<PyArray2<f64>>() {
            with_batch($py, arr, $rows, |$r: &[&[f64]]| $body)
        } else if let Ok(arr) = $x.cast::<PyArray2<f32>>() {
            with_batch($py, arr, $rows, |$r: &[&[f32]]| $body)
        } else {
            Err(PyTypeError::new_err(concat!(
                $what,
                " expects a 2-D float32 or float64 numpy array"
            )))
        }
    };
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
            inner: Mutex::new(inner?),
        })
    }

    /// Apply one mini-batch (2-D float32 or float64 array, or the rows `rows` of one), with the GIL released.
    #[pyo3(signature = (x, rows=None))]
    fn update(&self, py: Python<'_>, x: &Bound<'_, PyAny>, rows: Option<PyReadonlyArray1<'_, i64>>) -> PyResult<()> {
        on_float_batch!(py, x, rows.as_ref(), "update", |r| lock(&self.inner)?
            .update_rows(r)
            .map_err(PyErr::from))
    }

    /// The sums (A: D×K, B: K×K, q: D, n) of an exact E-step of the rows with the current F, Ψ.
    #[pyo3(signature = (x, rows=None))]
    #[allow(clippy::type_complexity)]
    fn exact_sums<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        rows: Option<PyReadonlyArray1<'_, i64>>,
    ) -> PyResult<(
        Bound<'py, PyArray2<f64>>,
        Bound<'py, PyArray2<f64>>,
        Bound<'py, PyArray1<f64>>,
        u64,
    )> {
        let sums = on_float_batch!(py, x, rows.as_ref(), "exact_sums", |r| lock(&self.inner)?
            .exact_sums(r)
            .map_err(PyErr::from))?;
        Ok((
            sums.a.into_pyarray(py),
            sums.b.into_pyarray(py),
            sums.squares.into_pyarray(py),
            sums.n,
        ))
    }

    /// Mean log density of the rows of x under this model (or, with `averaged`, the averaged one).
    #[pyo3(signature = (x, averaged=false))]
    fn mean_log_prob(&self, py: Python<'_>, x: &Bound<'_, PyAny>, averaged: bool) -> PyResult<f64> {
        on_float_batch!(py, x, None, "mean_log_prob", |r| lock(&self.inner)?
            .mean_log_prob(r, averaged)
            .map_err(PyErr::from))
    }

    /// One exact M-step from sums over the whole data set (see `exact_sums`).
    fn apply_exact(
        &self,
        py: Python<'_>,
        a: PyReadonlyArray2<'_, f64>,
        b: PyReadonlyArray2<'_, f64>,
        squares: PyReadonlyArray1<'_, f64>,
        n: u64,
    ) -> PyResult<()> {
        let sums = crate::minibatch::exact::ExactSums {
            a: owned_copy(&a)?,
            b: owned_copy(&b)?,
            squares: owned_copy(&squares)?,
            n,
        };
        py.detach(|| lock(&self.inner)?.apply_exact(&sums).map_err(PyErr::from))
    }

    /// Start averaging the statistics over the batches that follow.
    fn start_average(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            lock(&self.inner)?.start_average();
            Ok(())
        })
    }

    /// Replace the statistics by their averages and F, ψ by their M-step; stop averaging.
    fn apply_average(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| lock(&self.inner)?.apply_average().map_err(PyErr::from))
    }

    /// Stop averaging and forget the averages.
    fn discard_average(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            lock(&self.inner)?.discard_average();
            Ok(())
        })
    }

    /// Batches averaged since `start_average`, or None when not averaging.
    #[getter]
    fn n_averaged(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        py.detach(|| Ok(lock(&self.inner)?.n_averaged()))
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
        out.set_item("avg_count", p.average.as_ref().map(|a| a.count))?;
        if let Some(a) = p.average {
            out.set_item("avg_a_bar", a.a_bar.into_pyarray(py))?;
            out.set_item("avg_b_bar", a.b_bar.into_pyarray(py))?;
            out.set_item("avg_dsq", a.dsq.into_pyarray(py))?;
        }
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
            // Absent in checkpoints written before averaging existed: not averaging.
            average: match state
                .get_item("avg_count")?
                .map(|v| v.extract::<Option<u64>>())
                .transpose()
            {
                Ok(Some(Some(count))) => Some(crate::minibatch::average::StatAverage {
                    count,
                    a_bar: matrix(state, "avg_a_bar")?,
                    b_bar: matrix(state, "avg_b_bar")?,
                    dsq: vector(state, "avg_dsq")?,
                }),
                Ok(_) => None,
                Err(_) => {
                    return Err(PyValueError::new_err(
                        "mini-batch EM state: \"avg_count\" has the wrong type",
                    ))
                }
            },
        };
        let inner = py.detach(|| crate::minibatch::MiniBatchEm::from_parts(parts))?;
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
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Snapshot<'py>> {
        let parts = py.detach(|| Ok::<_, PyErr>(owned_snapshot(&*lock(&self.inner)?)))?;
        Ok(to_python(py, parts))
    }
}

/// (n_seen, mean, loadings, noise_variance) as NumPy arrays.
type Snapshot<'py> = (
    u64,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray2<f64>>,
    Bound<'py, PyArray1<f64>>,
);

/// (n_seen, mean, loadings, noise_variance) copied out of a model.
fn owned_snapshot(m: &crate::minibatch::MiniBatchEm) -> (u64, ndarray::Array1<f64>, Array2<f64>, ndarray::Array1<f64>) {
    (
        m.n_seen(),
        m.mean().to_owned(),
        m.loadings().to_owned(),
        m.noise_variance().to_owned(),
    )
}

fn to_python<'py>(
    py: Python<'py>,
    (t, mean, f, psi): (u64, ndarray::Array1<f64>, Array2<f64>, ndarray::Array1<f64>),
) -> Snapshot<'py> {
    (t, mean.into_pyarray(py), f.into_pyarray(py), psi.into_pyarray(py))
}

/// Column moments of row slices, a bad value reported as row `row_offset` + its index.
fn moments_of<X: Real>(rows: &[&[X]], row_offset: usize) -> PyResult<(Vec<f64>, Vec<f64>)> {
    match crate::minibatch::moments::column_moments(rows) {
        Err(crate::error::FaError::BadValue { row, .. }) => Err(PyValueError::new_err(format!(
            "row {} contains NaN, infinity or a value with magnitude above {:e}",
            row_offset + row,
            X::MAX_INPUT
        ))),
        other => other.map_err(PyErr::from),
    }
}

/// Per-feature mean and sum of squared deviations of a 2-D float32/float64 array, in one parallel read
/// (ValueError naming row `row_offset` + i for a bad value in row i).
#[pyfunction]
#[pyo3(signature = (x, row_offset=0))]
#[allow(clippy::type_complexity)]
pub fn column_moments<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    row_offset: usize,
) -> PyResult<(Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<f64>>)> {
    let (mean, squares) = on_float_batch!(py, x, None, "column_moments", |r| moments_of(r, row_offset))?;
    Ok((mean.into_pyarray(py), squares.into_pyarray(py)))
}
