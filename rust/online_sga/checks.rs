//! The semantic checks of a restored online SGA model's rows (its step checks itself when read, see
//! `step::SgaKkStep::read_state`; the generic checks are in `crate::state_checks`).

use super::OnlineSga;
use crate::error::Result;
use crate::scalar::Real;
use crate::state_checks::within;

/// Every row value of a restored online SGA state that Algorithm 1 relies on (see the module docs).
pub(crate) fn check_state<T: Real>(sga: &OnlineSga<T>) -> Result<()> {
    within("mean", &sga.mean, -T::MAX_INPUT, T::MAX_INPUT)?;
    within("d_last", &sga.d_last, -2.0 * T::MAX_INPUT, 2.0 * T::MAX_INPUT)?;
    within("psi", &sga.psi, 0.0, T::MAX_STATE)?;
    within("loadings", &sga.f, -T::MAX_STATE, T::MAX_STATE)?;
    Ok(())
}
