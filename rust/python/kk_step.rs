//! What the K×K step classes of the binding (`OnlineEMStep`, `OnlineSGAStep`) share: the storage type of the
//! rows they serve, the lock, copies, the state keys they own and the common getters. Each class adds its
//! constructor and the methods its row store needs (`kk_step_class!`'s block).

use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::common::owned_copy;
use crate::engine::StepSums;
use crate::error::{invalid, FaError};

/// Whether rows stored in `dtype` ("float32" or "float64", else ValueError) are single precision.
pub(crate) fn is_single(dtype: &str) -> PyResult<bool> {
    match dtype {
        "float32" => Ok(true),
        "float64" => Ok(false),
        other => Err(invalid("dtype", format!("must be 'float32' or 'float64', got {other:?}")).into()),
    }
}

/// The sums of a pass handed over from Python, refused (NumericalBreakdownError) when not finite.
pub(crate) fn pass_sums(
    s: PyReadonlyArray2<'_, f64>,
    u: PyReadonlyArray1<'_, f64>,
    dsq_sum: f64,
) -> PyResult<StepSums> {
    let sums = StepSums {
        s: owned_copy(&s)?,
        u: owned_copy(&u)?,
        dsq_sum,
    };
    if !sums.s.iter().chain(sums.u.iter()).all(|v| v.is_finite()) || !dsq_sum.is_finite() {
        return Err(FaError::Diverged("the sums of the pass are not finite").into());
    }
    Ok(sums)
}

/// A `#[pyclass]` `$class` over the K×K step type `$step` of checkpoints of kind `$kind`, with the shared methods
/// and those of `$extra` (its constructor among them).
macro_rules! kk_step_class {
    ($class:ident, $step:ty, $kind:literal, { $($extra:tt)* }) => {
        /// The K×K step of one model and the storage type of its rows (the floor depends on it).
        #[pyclass(frozen, module = "onlinefa._core")]
        pub struct $class {
            inner: crate::fork::Mutex<$step>,
            single: bool,
        }

        impl $class {
            fn wrap(step: $step, single: bool) -> Self {
                $class {
                    inner: crate::fork::Mutex::new(step),
                    single,
                }
            }

            fn read<R>(&self, f: impl FnOnce(&$step) -> R) -> PyResult<R> {
                Ok(f(&*super::common::lock(&self.inner)?))
            }
        }

        #[pymethods]
        impl $class {
            $($extra)*

            /// Forget the pending step (the store's pass applied it).
            fn drop_pending(&self) -> PyResult<()> {
                super::common::lock(&self.inner)?.drop_pending();
                Ok(())
            }

            /// An independent copy.
            fn copy(&self) -> PyResult<Self> {
                Ok(Self::wrap(self.read(|s| s.clone())?, self.single))
            }

            /// The step's entries of the model's state map (every key but the rows and `n_features`).
            fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
                let map = self.read(|s| {
                    let mut w = crate::state::StateWriter::new($kind);
                    s.write_state(&mut w);
                    w.0
                })?;
                super::state_arrays::state_to_dict(py, map)
            }

            /// The step of a state map of D = `n_features` rows stored in `dtype` (checked; ValueError).
            #[staticmethod]
            fn from_state(state: &Bound<'_, pyo3::types::PyDict>, n_features: usize, dtype: &str) -> PyResult<Self> {
                let single = super::kk_step::is_single(dtype)?;
                let map = super::state_arrays::dict_to_state(state)?;
                let r = crate::state::StateReader(&map);
                let step = if single {
                    <$step>::read_state::<f32>(&r, n_features)
                } else {
                    <$step>::read_state::<f64>(&r, n_features)
                }?;
                Ok(Self::wrap(step, single))
            }

            #[getter]
            fn n_seen(&self) -> PyResult<u64> {
                self.read(|s| s.n_seen())
            }

            #[getter]
            fn n_components(&self) -> PyResult<usize> {
                self.read(|s| s.n_components())
            }

            #[getter]
            fn n_warmup(&self) -> PyResult<u64> {
                self.read(|s| s.config().n_warmup)
            }

            #[getter]
            fn scaling(&self) -> PyResult<&'static str> {
                self.read(|s| match s.config().scaling {
                    crate::scaling::Scaling::Unit => "unit",
                    crate::scaling::Scaling::Data => "data",
                })
            }

            /// "float32" or "float64": the storage of the rows this step is for.
            #[getter]
            fn dtype(&self) -> &'static str {
                if self.single {
                    "float32"
                } else {
                    "float64"
                }
            }

            /// σ̂², the data's scale.
            #[getter]
            fn scale_sq(&self) -> PyResult<f64> {
                self.read(|s| s.scale_sq())
            }

            /// The noise floor of the next pass.
            #[getter]
            fn floor(&self) -> PyResult<f64> {
                let single = self.single;
                self.read(|s| if single { s.floor::<f32>() } else { s.floor::<f64>() })
            }

            /// Whether warm-up is over.
            #[getter]
            fn is_fitted(&self) -> PyResult<bool> {
                self.read(|s| s.is_fitted())
            }
        }
    };
}
