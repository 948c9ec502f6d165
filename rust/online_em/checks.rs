//! The semantic checks of a restored online EM state (the generic checks are in `crate::state_checks`).

use super::{OnlineEm, Source};
use crate::error::Result;
use crate::scalar::Real;
use crate::state_checks::{bounded_symmetric, positive_diagonal, sample_count, step_size, within};

/// Every value of a restored online EM state that Algorithm 2 relies on (see the module docs).
pub(crate) fn check_state<T: Real>(em: &OnlineEm<T>) -> Result<()> {
    sample_count("n_seen", em.n_seen)?;
    within("mean", &em.mean, -T::MAX_INPUT, T::MAX_INPUT)?;
    within("d_last", &em.d_last, -2.0 * T::MAX_INPUT, 2.0 * T::MAX_INPUT)?;
    within("dsq_bar", &em.dsq_bar, 0.0, f64::MAX)?;
    bounded_symmetric("b_bar", em.b_bar.view())?;
    bounded_symmetric("sigma", em.sigma.view())?;
    positive_diagonal("sigma", em.sigma.view())?;
    if let Source::Stats(h_inv) = &em.source {
        bounded_symmetric("h_inv", h_inv.view())?;
        positive_diagonal("h_inv", h_inv.view())?;
    }
    if let Some(pending) = &em.pending {
        step_size("pending_rho", pending.rho)?;
    }
    Ok(())
}
