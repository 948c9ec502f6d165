//! The online-SGA model's current Gaussian, read block by block of rows for the queries of `crate::query`.

use std::ops::Range;

use super::OnlineSga;
use crate::error::Result;
use crate::query::{widen, GaussianRows, RowVisitor};
use crate::scalar::Real;

impl<T: Real> GaussianRows for OnlineSga<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    fn visit_range(&self, rows: Range<usize>, visit: &mut RowVisitor<'_>) -> Result<()> {
        let mut mean = Vec::new();
        self.visit_current_in(rows, &mut |lo, f, psi| {
            widen(&self.mean[lo..lo + psi.len()], &mut mean);
            visit(lo, &mean, f, psi)
        })
    }
}
