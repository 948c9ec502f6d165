//! `OnlineSGAStep`: the K×K part of online SGA (`online_sga::SgaKkStep`) for row stores written in Python (the
//! torch rows of `onlinefa.torch.OnlineSGA`). A store runs its pass with the step's plan and pending step, then
//! hands the pass's sums to `apply`; the E-step and the rule's step sizes are the same code as the Rust model's.

use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::common::*;
use super::kk_step::{is_single, pass_sums};
use super::streaming::sga_config;
use crate::online_sga::SgaKkStep;

/// (m (K,), P (K, K), L (K, K) or None) of a pending step.
type PendingArrays<'py> = (
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray2<f64>>,
    Option<Bound<'py, PyArray2<f64>>>,
);

kk_step_class!(OnlineSGAStep, SgaKkStep, "OnlineSGA", {
    #[new]
    #[pyo3(signature = (n_features, n_components, *, lr, rule, n_warmup, noise_floor, dtype, schedule, tau0,
                        kappa, rho, scaling))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        n_features: usize,
        n_components: usize,
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
        let single = is_single(dtype)?;
        let config = sga_config(lr, rule, n_warmup, noise_floor, (schedule, tau0, kappa, rho), scaling)?;
        let step = if single {
            SgaKkStep::checked::<f32>(n_features, n_components, config)
        } else {
            SgaKkStep::checked::<f64>(n_features, n_components, config)
        }?;
        Ok(Self::wrap(step, single))
    }

    /// (t, ρ'_t, active, start, lr, ψ rate or None) of the next sample t = n_seen + 1: whether its pass is past
    /// warm-up, whether it begins with the data-scaled start, and the rates of the pending step.
    #[allow(clippy::type_complexity)]
    fn plan(&self) -> PyResult<(u64, f64, bool, bool, f64, Option<f64>)> {
        self.read(|s| {
            let p = s.plan();
            (p.t, p.mean_rho, p.active, p.start, p.lr, p.psi_rate)
        })
    }

    /// (m (K,), P = Σ + m mᵀ (K, K), L (K, K) of the whitened rule or None) of the step the next pass applies.
    fn pending<'py>(&self, py: Python<'py>) -> PyResult<Option<PendingArrays<'py>>> {
        let pending = self.read(|s| s.pending().cloned())?;
        Ok(pending.map(|p| {
            (
                p.m.into_pyarray(py),
                p.p.into_pyarray(py),
                p.rates.whiten.map(|l| l.into_pyarray(py)),
            )
        }))
    }

    /// Finish the step of sample n_seen + 1 from its pass's sums over all `n_total` rows: S (K, K), u (K,) and,
    /// during a data-scaled warm-up, Σ d̄² (after it, the number of rows whose ψ step diverged: > 0 fails).
    /// NumericalBreakdownError (nothing changed) when the step fails.
    fn apply(
        &self,
        py: Python<'_>,
        s: PyReadonlyArray2<'_, f64>,
        u: PyReadonlyArray1<'_, f64>,
        dsq_sum: f64,
        n_total: usize,
    ) -> PyResult<()> {
        let sums = pass_sums(s, u, dsq_sum)?;
        py.detach(|| {
            let mut step = lock(&self.inner)?;
            let mut next = step.clone();
            next.finish(&sums, n_total)?;
            *step = next;
            Ok(())
        })
    }

    #[getter]
    fn lr(&self) -> PyResult<f64> {
        self.read(|s| s.config().lr)
    }

    #[getter]
    fn rule(&self) -> PyResult<&'static str> {
        self.read(|s| s.config().rule.name())
    }
});
