//! The variational parameters c, F, β and Adam's moment estimates, stored row-major in `T`.

use ndarray::ArrayView1;

use super::TASK_ROWS;
use crate::error::{invalid, FaError, Result};
use crate::scalar::Real;

/// One value per row of c and β, K per row of F (row-major), stored in `T`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params<T> {
    pub(crate) c: Vec<T>,
    pub(crate) f: Vec<T>,
    pub(crate) beta: Vec<T>,
}

/// One task's rows of a [`Params`].
pub(super) struct RowsMut<'a, T> {
    pub(super) c: &'a mut [T],
    pub(super) f: &'a mut [T],
    pub(super) beta: &'a mut [T],
}

impl<T: Real> Params<T> {
    pub(super) fn zeros(d: usize, k: usize) -> Self {
        Params {
            c: vec![T::default(); d],
            f: vec![T::default(); d * k],
            beta: vec![T::default(); d],
        }
    }

    pub(super) fn task_rows(&mut self, k: usize) -> impl Iterator<Item = RowsMut<'_, T>> {
        self.c
            .chunks_mut(TASK_ROWS)
            .zip(self.f.chunks_mut(TASK_ROWS * k))
            .zip(self.beta.chunks_mut(TASK_ROWS))
            .map(|((c, f), beta)| RowsMut { c, f, beta })
    }
}

impl<T> RowsMut<'_, T> {
    /// Rows b0 … b0 + nb − 1 of these rows (F K wide).
    pub(super) fn block(&mut self, k: usize, b0: usize, nb: usize) -> RowsMut<'_, T> {
        RowsMut {
            c: &mut self.c[b0..b0 + nb],
            f: &mut self.f[b0 * k..(b0 + nb) * k],
            beta: &mut self.beta[b0..b0 + nb],
        }
    }
}

/// ψ^{1/2} = exp(β/2) of each stored β (as f64): the state's cache of the square-root noise.
pub(super) fn sqrt_noise<T: Real>(beta: &[T]) -> Vec<f64> {
    beta.iter().map(|b| (0.5 * b.to_f64()).exp()).collect()
}

/// Adam's first (m) and second (v) moment estimates, laid out like the parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Moments<T> {
    pub(crate) first: Params<T>,
    pub(crate) second: Params<T>,
}

pub(super) fn checked_vector<T: Real>(
    v: ArrayView1<f64>,
    d: usize,
    what: &'static str,
    positive: bool,
) -> Result<Vec<T>> {
    if v.len() != d {
        return Err(FaError::Shape {
            what,
            expected: format!("({d},)"),
            got: v.shape().to_vec(),
        });
    }
    let acceptable = |x: f64| x.abs() <= T::MAX_INPUT && (!positive || x > 0.0);
    if !v.iter().all(|&x| acceptable(x)) {
        let rule = if positive { "finite and > 0" } else { "finite" };
        return Err(invalid(what, format!("must contain only {rule} values")));
    }
    Ok(v.iter().map(|&x| T::from_f64(x)).collect())
}
