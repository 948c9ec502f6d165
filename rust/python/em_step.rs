//! `OnlineEMStep`: the K×K part of online EM (`online_em::EmStep`) for row stores written in Python (the torch
//! rows of `onlinefa.torch.OnlineEM`). A store runs its pass with the step's rates, basis and pending step,
//! then hands the pass's sums to `apply`; the K×K algebra is the same code as the Rust model's.

use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use super::state_arrays::{dict_to_state, state_to_dict};
use crate::engine::StepSums;
use crate::fork::Mutex;
use crate::online_em::{Basis, EmConfig, EmStep};
use crate::scaling::Scaling;
use crate::state::{StateReader, StateWriter};

/// The K×K step of one online-EM model and the storage type of its rows (the floor and the latent-mean bound
/// depend on it).
#[pyclass(frozen, module = "onlinefa._core")]
pub struct OnlineEMStep {
    inner: Mutex<EmStep>,
    single: bool,
}

/// (pending ρ, m (K,), W (K, K) or None) of a pending step.
type PendingArrays<'py> = (f64, Bound<'py, PyArray1<f64>>, Option<Bound<'py, PyArray2<f64>>>);

fn is_single(dtype: &str) -> PyResult<bool> {
    match dtype {
        "float32" => Ok(true),
        "float64" => Ok(false),
        other => Err(crate::error::invalid("dtype", format!("must be 'float32' or 'float64', got {other:?}")).into()),
    }
}

impl OnlineEMStep {
    fn wrap(step: EmStep, single: bool) -> Self {
        OnlineEMStep {
            inner: Mutex::new(step),
            single,
        }
    }

    fn read<R>(&self, f: impl FnOnce(&EmStep) -> R) -> PyResult<R> {
        Ok(f(&*lock(&self.inner)?))
    }
}

#[pymethods]
impl OnlineEMStep {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, n_warmup, noise_floor, dtype, schedule, tau0, kappa, rho,
                        whiten, scaling, shrink))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        n_features: usize,
        n_components: usize,
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
        let single = is_single(dtype)?;
        let config = EmConfig {
            n_warmup,
            noise_floor,
            step_size: step_size(schedule, tau0, kappa, rho)?,
            whiten,
            scaling: Scaling::parse(scaling)?,
            shrink,
        };
        let step = if single {
            EmStep::checked::<f32>(n_features, n_components, config)
        } else {
            EmStep::checked::<f64>(n_features, n_components, config)
        }?;
        Ok(Self::wrap(step, single))
    }

    /// (t, ρ_t, ρ'_t) of the next sample t = n_seen + 1.
    fn rates(&self) -> PyResult<(u64, f64, f64)> {
        self.read(|s| {
            let r = s.rates();
            (r.t, r.rho, r.mean_rho)
        })
    }

    /// ("initial", None), ("stats", H̄⁻¹ (K, K)) or ("whitened", None): where the next pass reads F from.
    fn basis<'py>(&self, py: Python<'py>) -> PyResult<(&'static str, Option<Bound<'py, PyArray2<f64>>>)> {
        let basis = self.read(|s| s.basis().clone())?;
        Ok(match basis {
            Basis::Initial => ("initial", None),
            Basis::Stats(h_inv) => ("stats", Some(h_inv.into_pyarray(py))),
            Basis::Whitened => ("whitened", None),
        })
    }

    /// (ρ, m (K,), W (K, K) or None) of the step the next pass applies to Ā, or None.
    fn pending<'py>(&self, py: Python<'py>) -> PyResult<Option<PendingArrays<'py>>> {
        let pending = self.read(|s| s.pending().cloned())?;
        Ok(pending.map(|p| (p.rho, p.m.into_pyarray(py), p.transform.map(|w| w.into_pyarray(py)))))
    }

    /// Finish the step of sample n_seen + 1 from its pass's sums over all `n_total` rows: S (K, K), u (K,) and
    /// Σ d̄². `moments_applied`: the store adopted θ̄_t, d̄²_t and d_t with the pass (else the next pass applies
    /// them, as the Rust rows do). NumericalBreakdownError (nothing changed) when the K×K algebra fails.
    #[pyo3(signature = (s, u, dsq_sum, n_total, *, moments_applied))]
    fn apply(
        &self,
        py: Python<'_>,
        s: PyReadonlyArray2<'_, f64>,
        u: PyReadonlyArray1<'_, f64>,
        dsq_sum: f64,
        n_total: usize,
        moments_applied: bool,
    ) -> PyResult<()> {
        let sums = StepSums {
            s: owned_copy(&s)?,
            u: owned_copy(&u)?,
            dsq_sum,
        };
        if !sums.s.iter().chain(sums.u.iter()).all(|v| v.is_finite()) || !dsq_sum.is_finite() {
            return Err(crate::error::FaError::Diverged("the sums of the pass are not finite").into());
        }
        let single = self.single;
        py.detach(|| {
            let mut step = lock(&self.inner)?;
            let mut next = step.clone();
            if single {
                next.finish::<f32>(&sums, n_total)
            } else {
                next.finish::<f64>(&sums, n_total)
            }?;
            if moments_applied {
                next.moments_applied();
            }
            *step = next;
            Ok(())
        })
    }

    /// Forget the pending step (the store's pass applied it).
    fn drop_pending(&self) -> PyResult<()> {
        lock(&self.inner)?.drop_pending();
        Ok(())
    }

    /// A new step: this one with its warm-up ended at the last sample (the first M-step on the statistics so
    /// far); RuntimeError when warm-up is over or fewer than two distinct samples were seen.
    fn ended_warmup(&self) -> PyResult<Self> {
        let ended = self.read(|s| s.ended_warmup())??;
        Ok(Self::wrap(ended, self.single))
    }

    /// An independent copy.
    fn copy(&self) -> PyResult<Self> {
        Ok(Self::wrap(self.read(|s| s.clone())?, self.single))
    }

    /// The step's entries of an `OnlineEM` state map (every key but the rows, `n_features` and F₀).
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let map = self.read(|s| {
            let mut w = StateWriter::new("OnlineEM");
            s.write_state(&mut w);
            w.0
        })?;
        state_to_dict(py, map)
    }

    /// The step of an `OnlineEM` state map of D = `n_features` rows stored in `dtype` (checked; ValueError).
    #[staticmethod]
    fn from_state(state: &Bound<'_, PyDict>, n_features: usize, dtype: &str) -> PyResult<Self> {
        let single = is_single(dtype)?;
        let map = dict_to_state(state)?;
        let r = StateReader(&map);
        let step = if single {
            EmStep::read_state::<f32>(&r, n_features)
        } else {
            EmStep::read_state::<f64>(&r, n_features)
        }?;
        Ok(Self::wrap(step, single))
    }

    /// B̄ (K, K).
    fn b_bar<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.read(|s| s.b_bar().clone())?.into_pyarray(py))
    }

    /// Σ of the last E-step (K, K).
    fn sigma<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.read(|s| s.sigma().clone())?.into_pyarray(py))
    }

    #[getter]
    fn n_seen(&self) -> PyResult<u64> {
        self.read(EmStep::n_seen)
    }

    #[getter]
    fn n_components(&self) -> PyResult<usize> {
        self.read(EmStep::n_components)
    }

    #[getter]
    fn n_warmup(&self) -> PyResult<u64> {
        self.read(|s| s.config().n_warmup)
    }

    #[getter]
    fn whiten(&self) -> PyResult<bool> {
        self.read(|s| s.config().whiten)
    }

    #[getter]
    fn shrink(&self) -> PyResult<bool> {
        self.read(|s| s.config().shrink)
    }

    #[getter]
    fn scaling(&self) -> PyResult<&'static str> {
        self.read(|s| match s.config().scaling {
            Scaling::Unit => "unit",
            Scaling::Data => "data",
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

    /// σ̂² after the last sample.
    #[getter]
    fn scale_sq(&self) -> PyResult<f64> {
        self.read(EmStep::scale_sq)
    }

    /// The noise floor of the next pass.
    #[getter]
    fn floor(&self) -> PyResult<f64> {
        let single = self.single;
        self.read(|s| if single { s.floor::<f32>() } else { s.floor::<f64>() })
    }

    /// σ of the warm-up start F₀ σ, ψ₀ = σ².
    #[getter]
    fn warmup_scale(&self) -> PyResult<f64> {
        self.read(EmStep::warmup_scale)
    }

    #[getter]
    fn is_fitted(&self) -> PyResult<bool> {
        self.read(EmStep::is_fitted)
    }

    #[getter]
    fn effective_samples(&self) -> PyResult<f64> {
        self.read(EmStep::effective_samples)
    }
}
