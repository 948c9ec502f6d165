//! `VIFAStep`: the K×K part of VIFA (`vifa::VifaKkStep`) for row stores written in Python (the torch rows of
//! `onlinefa.VIFA(..., device=...)`). A store draws with the step's counter, steps its rows with the step's rule
//! and hands their B = Fᵀ Ψ⁻¹ F to `apply`; the counters, (I + B)⁻¹, the rule and the K×K state keys are the
//! same code as the Rust model's.

use numpy::{IntoPyArray, PyArray2, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use super::state_arrays::{dict_to_state, state_to_dict};
use crate::fork::Mutex;
use crate::state::{StateReader, StateWriter};
use crate::vifa::{LearningRates, VifaKkStep, ADAM_BETA1, ADAM_BETA2, ADAM_EPS};

/// The rule of one step as the binding hands it over: (η (3), clipping factors (3), η / (1 − β₁ᵗ) (3),
/// 1 / √(1 − β₂ᵗ), (β₁, β₂, ε)).
type RuleTuple = ([f64; 3], [f64; 3], [f64; 3], f64, (f64, f64, f64));

/// The K×K step of one VIFA model.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct VIFAStep {
    inner: Mutex<VifaKkStep>,
}

impl VIFAStep {
    fn wrap(step: VifaKkStep) -> Self {
        VIFAStep {
            inner: Mutex::new(step),
        }
    }

    fn read<R>(&self, f: impl FnOnce(&VifaKkStep) -> R) -> PyResult<R> {
        Ok(f(&*lock(&self.inner)?))
    }

    /// Run `f` on a copy and keep it only if `f` succeeds (a failed call leaves the step as it was).
    fn change<R>(&self, f: impl FnOnce(&mut VifaKkStep) -> crate::error::Result<R>) -> PyResult<R> {
        let mut step = lock(&self.inner)?;
        let mut next = step.clone();
        let out = f(&mut next)?;
        *step = next;
        Ok(out)
    }
}

/// B = Fᵀ Ψ⁻¹ F handed over from Python (K×K), owned.
fn gram_of(gram: &PyReadonlyArray2<'_, f64>) -> PyResult<ndarray::Array2<f64>> {
    owned_copy(gram)
}

#[pymethods]
impl VIFAStep {
    /// The step of a state map of D = `n_features` rows (checked; ValueError). (I + B)⁻¹ comes from
    /// :meth:`refresh` with the rows' B.
    #[staticmethod]
    fn from_state(state: &Bound<'_, PyDict>, n_features: usize) -> PyResult<Self> {
        let map = dict_to_state(state)?;
        Ok(Self::wrap(VifaKkStep::read_state(&StateReader(&map), n_features)?))
    }

    /// The step's entries of the model's state map (every key but the rows and `n_features`).
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let map = self.read(|s| {
            let mut w = StateWriter::new("VIFA");
            s.write_state(&mut w);
            w.0
        })?;
        state_to_dict(py, map)
    }

    /// An independent copy ((I + B)⁻¹ included).
    fn copy(&self) -> PyResult<Self> {
        Ok(Self::wrap(self.read(|s| s.clone())?))
    }

    /// Count a training draw and return its index; RuntimeError while L draws wait for their step,
    /// NumericalBreakdownError once the model diverged. Nothing changes on an error.
    fn begin_draw(&self) -> PyResult<u64> {
        self.change(VifaKkStep::begin_draw)
    }

    /// RuntimeError unless L draws wait for their gradients.
    fn check_ready(&self) -> PyResult<()> {
        Ok(self.read(VifaKkStep::check_ready)??)
    }

    /// The rule of the next step (η, clipping factors, Adam's η / (1 − β₁ᵗ) and 1 / √(1 − β₂ᵗ), (β₁, β₂, ε))
    /// from the whole model's squared gradient norms (required exactly when clipping is on; ValueError).
    fn rule(&self, sq_norms: Option<[f64; 3]>) -> PyResult<RuleTuple> {
        let rule = self.read(|s| s.rule(sq_norms))??;
        Ok((
            rule.lr,
            rule.scale,
            rule.adam_lr,
            rule.inv_sqrt_bias2,
            (ADAM_BETA1, ADAM_BETA2, ADAM_EPS),
        ))
    }

    /// The rows took the next step and their new parameters' B (the whole model's, K×K) is `gram`: count the
    /// step and form (I + B)⁻¹. NumericalBreakdownError (nothing changed) when I + B does not factorise or B is
    /// not finite.
    fn apply(&self, py: Python<'_>, gram: PyReadonlyArray2<'_, f64>) -> PyResult<()> {
        let gram = gram_of(&gram)?;
        py.detach(|| {
            self.change(|s| {
                s.stepped();
                s.finish(gram.view(), true)
            })
        })
    }

    /// (I + B)⁻¹ of the current parameters from their B (the whole model's, K×K), no step counted (a new or
    /// restored model, or rows split across processes). NumericalBreakdownError (nothing changed) as `apply`.
    fn refresh(&self, py: Python<'_>, gram: PyReadonlyArray2<'_, f64>) -> PyResult<()> {
        let gram = gram_of(&gram)?;
        py.detach(|| self.change(|s| s.finish(gram.view(), true)))
    }

    /// Put back (I + B)⁻¹ read from a copy of this step's model (`m_inv`; K×K and finite, else ValueError):
    /// for a pickled model's rows, whose B may be the sum over rows held by other processes.
    fn set_m_inv(&self, m_inv: PyReadonlyArray2<'_, f64>) -> PyResult<()> {
        let m_inv = owned_copy(&m_inv)?;
        let mut step = lock(&self.inner)?;
        let k = step.n_components;
        if m_inv.dim() != (k, k) || !m_inv.iter().all(|v| v.is_finite()) {
            return Err(crate::error::invalid("m_inv", format!("must be a finite ({k}, {k}) matrix")).into());
        }
        step.m_inv = Some(m_inv);
        Ok(())
    }

    /// (I + B)⁻¹ (K, K); NumericalBreakdownError once the model diverged.
    fn m_inv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        Ok(self.read(|s| s.m_inv().cloned())??.into_pyarray(py))
    }

    /// Replace the learning rates η_c, η_F, η_β (finite, >= 0; ValueError, nothing changed).
    fn set_learning_rates(&self, mean: f64, loadings: f64, log_noise: f64) -> PyResult<()> {
        self.change(|s| {
            s.set_learning_rates(LearningRates {
                mean,
                loadings,
                log_noise,
            })
        })
    }

    /// Replace the prior precision α (finite, >= 0; ValueError, nothing changed).
    fn set_prior_precision(&self, alpha: f64) -> PyResult<()> {
        self.change(|s| s.set_prior_precision(alpha))
    }

    #[getter]
    fn n_components(&self) -> PyResult<usize> {
        self.read(|s| s.n_components)
    }

    #[getter]
    fn n_steps(&self) -> PyResult<u64> {
        self.read(|s| s.n_steps)
    }

    #[getter]
    fn n_draws(&self) -> PyResult<u64> {
        self.read(|s| s.n_draws)
    }

    #[getter]
    fn n_pending(&self) -> PyResult<usize> {
        self.read(|s| s.n_pending)
    }

    #[getter]
    fn seed(&self) -> PyResult<u64> {
        self.read(|s| s.seed)
    }

    #[getter]
    fn row_offset(&self) -> PyResult<usize> {
        self.read(|s| s.row_offset)
    }

    #[getter]
    fn n_grad_samples(&self) -> PyResult<usize> {
        self.read(|s| s.config.n_grad_samples)
    }

    #[getter]
    fn optimizer(&self) -> PyResult<&'static str> {
        self.read(|s| s.config.optimizer.name())
    }

    #[getter]
    fn prior_precision(&self) -> PyResult<f64> {
        self.read(|s| s.config.prior_precision)
    }

    /// (η_c, η_F, η_β).
    #[getter]
    fn lr(&self) -> PyResult<(f64, f64, f64)> {
        self.read(|s| (s.config.lr.mean, s.config.lr.loadings, s.config.lr.log_noise))
    }

    #[getter]
    fn clip_grad_norm(&self) -> PyResult<Option<f64>> {
        self.read(|s| s.config.clip_grad_norm)
    }
}
