//! `OnlineEMStep`: the K×K part of online EM (`online_em::EmStep`) for row stores written in Python (the torch
//! rows of `onlinefa.torch.OnlineEM`). A store runs its pass with the step's rates, basis and pending step,
//! then hands the pass's sums to `apply`; the K×K algebra is the same code as the Rust model's.

use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::common::*;
use super::kk_step::{is_single, pass_sums};
use super::streaming::em_config;
use crate::online_em::{Basis, EmStep};

/// (pending ρ, m (K,), W (K, K) or None) of a pending step.
type PendingArrays<'py> = (f64, Bound<'py, PyArray1<f64>>, Option<Bound<'py, PyArray2<f64>>>);

kk_step_class!(OnlineEMStep, EmStep, "OnlineEM", {
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
        let config = em_config(
            n_warmup,
            noise_floor,
            (schedule, tau0, kappa, rho),
            whiten,
            scaling,
            shrink,
        )?;
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
    /// Σ d̄². A Python row store adopts θ̄_t, d̄²_t and d_t with its pass, so the pending step carries no moments.
    /// NumericalBreakdownError (nothing changed) when the K×K algebra fails.
    fn apply(
        &self,
        py: Python<'_>,
        s: PyReadonlyArray2<'_, f64>,
        u: PyReadonlyArray1<'_, f64>,
        dsq_sum: f64,
        n_total: usize,
    ) -> PyResult<()> {
        let sums = pass_sums(s, u, dsq_sum)?;
        let single = self.single;
        py.detach(|| {
            let mut step = lock(&self.inner)?;
            let mut next = step.clone();
            if single {
                next.finish::<f32>(&sums, n_total)
            } else {
                next.finish::<f64>(&sums, n_total)
            }?;
            next.moments_applied();
            *step = next;
            Ok(())
        })
    }

    /// A new step: this one with its warm-up ended at the last sample (the first M-step on the statistics so
    /// far); RuntimeError when warm-up is over or fewer than two distinct samples were seen.
    fn ended_warmup(&self) -> PyResult<Self> {
        let ended = self.read(|s| s.ended_warmup())??;
        Ok(Self::wrap(ended, self.single))
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
    fn whiten(&self) -> PyResult<bool> {
        self.read(|s| s.config().whiten)
    }

    #[getter]
    fn shrink(&self) -> PyResult<bool> {
        self.read(|s| s.config().shrink)
    }

    /// σ of the warm-up start F₀ σ, ψ₀ = σ².
    #[getter]
    fn warmup_scale(&self) -> PyResult<f64> {
        self.read(EmStep::warmup_scale)
    }

    #[getter]
    fn effective_samples(&self) -> PyResult<f64> {
        self.read(EmStep::effective_samples)
    }
});
