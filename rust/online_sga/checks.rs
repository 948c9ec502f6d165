//! The semantic checks of a restored online SGA state (the generic checks are in `crate::state_checks`).

use super::OnlineSga;
use crate::error::Result;
use crate::scalar::Real;
use crate::state_checks::{bounded_symmetric, positive_diagonal, sample_count, within};

/// Every value of a restored online SGA state that Algorithm 1 relies on (see the module docs).
pub(crate) fn check_state<T: Real>(sga: &OnlineSga<T>) -> Result<()> {
    sample_count("n_seen", sga.n_seen)?;
    within("mean", &sga.mean, -T::MAX_INPUT, T::MAX_INPUT)?;
    within("d_last", &sga.d_last, -2.0 * T::MAX_INPUT, 2.0 * T::MAX_INPUT)?;
    within("psi", &sga.psi, 0.0, T::MAX_STATE)?;
    within("loadings", &sga.f, -T::MAX_STATE, T::MAX_STATE)?;
    if let Some(pending) = &sga.pending {
        bounded_symmetric("pending_p", pending.p.view())?;
        positive_diagonal("pending_p", pending.p.view())?;
    }
    Ok(())
}
