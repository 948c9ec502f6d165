//! Engines of `onlinefa.OnlineEM` and `onlinefa.OnlineSGA` (one macro-generated method set) and the
//! seeded initial loadings.

use ndarray::{Array2, ArrayView2};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use super::state_arrays::{dict_to_state, state_to_dict};
use crate::engine::StreamingModel;
use crate::error::FaError;
use crate::fork::Mutex;
use crate::init::{orthonormal_loadings, orthonormal_rows};
use crate::online_em::{EmConfig, OnlineEm};
use crate::online_sga::{OnlineSga, SgaConfig, SgaRule};
use crate::scalar::Real;
use crate::scaling::Scaling;
use crate::state::{Checkpoint, StateValue};

/// Run `update` on a 2-D float32 or float64 array without copying it, with the GIL released (in the calling
/// thread's update pool, if one was set).
macro_rules! update_from_any {
    ($self:ident, $py:ident, $x:ident) => {{
        super::any_float::with_matrix($py, $x, "X", |view| {
            super::update_pool::in_update_pool(|| {
                let mut guard = lock(&$self.inner)?;
                match view {
                    super::any_float::AnyView2::F64(v) => with_model!(&mut *guard, m => m.update(v))?,
                    super::any_float::AnyView2::F32(v) => with_model!(&mut *guard, m => m.update(v))?,
                }
                Ok(())
            })
        })
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
                Ok(Self { inner: Mutex::new(inner?) })
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

            /// Log densities of the rows of X (n×D float64), streaming over the state under one lock. Every
            /// query reads the reported Gaussian: mapped by `transform` (K×K) if given, else as the model
            /// reports itself (crate::shrinkage::Reported).
            #[pyo3(signature = (x, transform=None))]
            fn log_prob<'py>(
                &self,
                py: Python<'py>,
                x: PyReadonlyArray2<'_, f64>,
                transform: Option<PyReadonlyArray2<'_, f64>>,
            ) -> PyResult<Bound<'py, PyArray1<f64>>> {
                query_log_prob(py, &self.inner, x, transform)
            }

            /// Posterior latent means E[h | x] of the rows of X (n×D float64), under one lock.
            #[pyo3(signature = (x, transform=None))]
            fn latent_mean<'py>(
                &self,
                py: Python<'py>,
                x: PyReadonlyArray2<'_, f64>,
                transform: Option<PyReadonlyArray2<'_, f64>>,
            ) -> PyResult<Bound<'py, PyArray2<f64>>> {
                query_latent_mean(py, &self.inner, x, transform)
            }

            /// Overwrite `out` (n×D, holding z) with c + F h + ψ^{1/2} ⊙ z, under one lock.
            #[pyo3(signature = (h, out, transform=None))]
            fn draw_into(
                &self,
                py: Python<'_>,
                h: PyReadonlyArray2<'_, f64>,
                out: &Bound<'_, PyAny>,
                transform: Option<PyReadonlyArray2<'_, f64>>,
            ) -> PyResult<()> {
                query_draw_into(py, &self.inner, h, out, transform)
            }

            /// Fᵀ Ψ⁻¹ F (K×K) of the rows as stored (before any reporting transform), under one lock.
            fn gram<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
                let g = py.detach(|| {
                    with_model!(&*lock(&self.inner)?, m => crate::shrinkage::gram(m)).map_err(PyErr::from)
                })?;
                Ok(g.into_pyarray(py))
            }

            /// Validate a batch X (n×D float32/float64) as `update` does, applying nothing.
            fn check_batch(&self, py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<()> {
                super::any_float::with_matrix(py, x, "X", |view| {
                    with_model!(&*lock(&self.inner)?, m => match view {
                        super::any_float::AnyView2::F64(v) => m.check_batch(v),
                        super::any_float::AnyView2::F32(v) => m.check_batch(v),
                    })
                    .map_err(PyErr::from)
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
                let sums = super::any_float::with_vector(py, x, "x", |view| {
                    let mut guard = lock(&self.inner)?;
                    with_model!(&mut *guard, m => match view {
                        super::any_float::AnyView1::F64(v) => m.local_sums(v),
                        super::any_float::AnyView1::F32(v) => m.local_sums(v),
                    })
                    .map_err(PyErr::from)
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
                let sums = crate::engine::StepSums { s: owned_copy(&s)?, u: owned_copy(&u)?, dsq_sum };
                py.detach(|| {
                    let mut guard = lock(&self.inner)?;
                    with_model!(&mut *guard, m => m.apply(&sums, n_features_total)).map_err(PyErr::from)
                })
            }

            /// The additive query sums of these rows for X (n×D float64), flat (see `crate::query::QuerySums`).
            #[pyo3(signature = (x, transform=None))]
            fn query_sums<'py>(
                &self,
                py: Python<'py>,
                x: PyReadonlyArray2<'_, f64>,
                transform: Option<PyReadonlyArray2<'_, f64>>,
            ) -> PyResult<Bound<'py, PyArray1<f64>>> {
                super::sharded::query_sums(py, &self.inner, x, transform)
            }

            /// (n_seen, mean, loadings, noise_variance) of the reported Gaussian read under one lock: one
            /// consistent state.
            #[allow(clippy::type_complexity)]
            #[pyo3(signature = (transform=None))]
            fn snapshot<'py>(
                &self,
                py: Python<'py>,
                transform: Option<PyReadonlyArray2<'_, f64>>,
            ) -> PyResult<(u64, Bound<'py, PyArray1<f64>>, Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<f64>>)> {
                let map = owned_transform(transform)?;
                let (t, (mean, f, psi), k) = py.detach(|| {
                    with_model!(&*lock(&self.inner)?, m => {
                        crate::shrinkage::Reported::of(m, map)
                            .and_then(|g| crate::query::rows_as::<f64, _>(&g))
                            .map(|rows| (m.n_seen(), rows, m.n_components()))
                    })
                    .map_err(PyErr::from)
                })?;
                let f = Array2::from_shape_vec((psi.len(), k), f).map_err(|e| FaError::InvalidState(e.to_string()))?;
                Ok((t, mean.into_pyarray(py), f.into_pyarray(py), psi.into_pyarray(py)))
            }
        }
    };
}

/// A streaming model's constructors: from (D, K, initial loadings F₀ as f64, hyper-parameters), and from
/// (D, K, F₀ in the storage type, hyper-parameters).
type NewModel<C, M> = fn(usize, usize, ArrayView2<'_, f64>, C) -> crate::error::Result<M>;
type FromRows<C, T, M> = fn(usize, usize, Vec<T>, C) -> crate::error::Result<M>;

/// The constructors of one model family in both storage types.
pub(crate) struct Constructors<C, M32, M64> {
    pub(crate) new32: NewModel<C, M32>,
    pub(crate) new64: NewModel<C, M64>,
    pub(crate) rows32: FromRows<C, f32, M32>,
    pub(crate) rows64: FromRows<C, f64, M64>,
}

/// A model of (D, K) = `shape` in the storage type `dtype` ("float32"/"float64"), from the given initial loadings
/// or, without them, an orthonormal draw from `seed` computed directly in the storage type (no f64 D×K copy
/// for a float32 model), built with the GIL released.
fn typed_model<C: Send, M32: Send, M64: Send>(
    py: Python<'_>,
    shape: (usize, usize),
    init: Option<PyReadonlyArray2<'_, f64>>,
    seed: Option<u64>,
    dtype: &str,
    config: C,
    build: Constructors<C, M32, M64>,
) -> PyResult<Mutex<Typed<M32, M64>>> {
    let (d, k) = shape;
    if !matches!(dtype, "float32" | "float64") {
        return Err(crate::error::invalid("dtype", format!("must be 'float32' or 'float64', got {dtype:?}")).into());
    }
    let inner = match init {
        Some(given) => {
            let init = initial_loadings(Some(given), d, k, seed)?;
            py.detach(|| match dtype {
                "float32" => (build.new32)(d, k, init.view(), config).map(Typed::F32),
                _ => (build.new64)(d, k, init.view(), config).map(Typed::F64),
            })
        }
        None => {
            crate::config_checks::check_components(d, k)?;
            let seed = seed.unwrap_or_else(crate::init::entropy_seed);
            py.detach(|| match dtype {
                "float32" => orthonormal_rows::<f32>(d, k, seed)
                    .and_then(|rows| (build.rows32)(d, k, rows, config))
                    .map(Typed::F32),
                _ => orthonormal_rows::<f64>(d, k, seed)
                    .and_then(|rows| (build.rows64)(d, k, rows, config))
                    .map(Typed::F64),
            })
        }
    };
    Ok(Mutex::new(inner?))
}

/// (schedule name, τ₀, κ, ρ): a step-size schedule as the Python classes pass it.
pub(crate) type ScheduleArgs<'a> = (&'a str, f64, f64, f64);

/// The online-EM configuration of the Python classes' arguments (each checked by the model or step built on it).
pub(crate) fn em_config(
    n_warmup: u64,
    noise_floor: f64,
    (schedule, tau0, kappa, rho): ScheduleArgs<'_>,
    whiten: bool,
    scaling: &str,
    shrink: bool,
) -> PyResult<EmConfig> {
    Ok(EmConfig {
        n_warmup,
        noise_floor,
        step_size: step_size(schedule, tau0, kappa, rho)?,
        whiten,
        scaling: Scaling::parse(scaling)?,
        shrink,
    })
}

/// The online-SGA configuration of the Python classes' arguments.
pub(crate) fn sga_config(
    lr: f64,
    rule: &str,
    n_warmup: u64,
    noise_floor: f64,
    (schedule, tau0, kappa, rho): ScheduleArgs<'_>,
    scaling: &str,
) -> PyResult<SgaConfig> {
    Ok(SgaConfig {
        lr,
        rule: SgaRule::parse(rule)?,
        n_warmup,
        noise_floor,
        step_size: step_size(schedule, tau0, kappa, rho)?,
        scaling: Scaling::parse(scaling)?,
    })
}

/// Engine of `onlinefa.OnlineEM`.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct OnlineEMCore {
    pub(crate) inner: Mutex<Typed<OnlineEm<f32>, OnlineEm<f64>>>,
}

model_methods!(OnlineEMCore, {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, init, seed, n_warmup, noise_floor, dtype,
                        schedule, tau0, kappa, rho, whiten, scaling, shrink))]
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
        shrink: bool,
    ) -> PyResult<Self> {
        let config = em_config(
            n_warmup,
            noise_floor,
            (schedule, tau0, kappa, rho),
            whiten,
            scaling,
            shrink,
        )?;
        let shape = (n_features, n_components);
        let build = Constructors {
            new32: OnlineEm::new,
            new64: OnlineEm::new,
            rows32: OnlineEm::from_rows,
            rows64: OnlineEm::from_rows,
        };
        let inner = typed_model(py, shape, init, seed, dtype, config, build)?;
        Ok(OnlineEMCore { inner })
    }

    /// Effective number of samples behind the running averages (n under the harmonic schedule).
    #[getter]
    fn effective_samples(&self, py: Python<'_>) -> PyResult<f64> {
        py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.effective_samples())))
    }

    /// Whether queries report the spiked-model shrinkage of the factors.
    #[getter]
    fn shrink(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| Ok(with_model!(&*lock(&self.inner)?, m => m.config().shrink)))
    }

    /// A new engine: this one with its warm-up ended at the last sample (the first M-step applied to
    /// the statistics so far); this one is unchanged. RuntimeError when warm-up is over or fewer than
    /// two distinct samples were seen.
    fn ended_warmup(&self, py: Python<'_>) -> PyResult<Self> {
        let ended = py.detach(|| -> PyResult<_> {
            Ok(match &*lock(&self.inner)? {
                Typed::F32(m) => m.ended_warmup().map(Typed::F32),
                Typed::F64(m) => m.ended_warmup().map(Typed::F64),
            })
        })?;
        Ok(OnlineEMCore {
            inner: Mutex::new(ended?),
        })
    }
});

/// Engine of `onlinefa.OnlineSGA`.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct OnlineSGACore {
    pub(crate) inner: Mutex<Typed<OnlineSga<f32>, OnlineSga<f64>>>,
}

model_methods!(OnlineSGACore, {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, init, seed, lr, rule, n_warmup, noise_floor, dtype,
                        schedule, tau0, kappa, rho, scaling))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        n_features: usize,
        n_components: usize,
        init: Option<PyReadonlyArray2<'_, f64>>,
        seed: Option<u64>,
        lr: f64,
        rule: &str,
        n_warmup: u64,
        noise_floor: f64,
        dtype: &str,
        schedule: &str,
        tau0: f64,
        kappa: f64,
        rho: f64,
        scaling: &str,
    ) -> PyResult<Self> {
        let config = sga_config(lr, rule, n_warmup, noise_floor, (schedule, tau0, kappa, rho), scaling)?;
        let shape = (n_features, n_components);
        let build = Constructors {
            new32: OnlineSga::new,
            new64: OnlineSga::new,
            rows32: OnlineSga::from_rows,
            rows64: OnlineSga::from_rows,
        };
        let inner = typed_model(py, shape, init, seed, dtype, config, build)?;
        Ok(OnlineSGACore { inner })
    }
});

/// Draw an orthonormal D×K matrix (§4.4 initialisation) with a seed; exposed for tests and tools.
#[pyfunction]
#[pyo3(signature = (n_features, n_components, seed))]
pub(crate) fn orthonormal_init<'py>(
    py: Python<'py>,
    n_features: usize,
    n_components: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    if n_components < 1 || n_components > n_features {
        return Err(PyValueError::new_err("need 1 <= n_components <= n_features"));
    }
    let q = py.detach(|| orthonormal_loadings(n_features, n_components, seed))?;
    Ok(q.into_pyarray(py))
}
