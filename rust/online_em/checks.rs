//! The semantic checks of a restored online EM model's rows (its step checks itself when read, see
//! `step::EmStep::read_state`; the generic checks are in `crate::state_checks`).

use super::OnlineEm;
use crate::error::Result;
use crate::scalar::Real;
use crate::state_checks::within;

/// Every row value of a restored online EM state that Algorithm 2 relies on (see the module docs).
pub(crate) fn check_state<T: Real>(em: &OnlineEm<T>) -> Result<()> {
    within("mean", &em.mean, -T::MAX_INPUT, T::MAX_INPUT)?;
    within("d_last", &em.d_last, -2.0 * T::MAX_INPUT, 2.0 * T::MAX_INPUT)?;
    within("dsq_bar", &em.dsq_bar, 0.0, f64::MAX)?;
    Ok(())
}
