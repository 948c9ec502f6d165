//! The VIFA posterior q, read block by block of rows for the queries of `crate::query`.

use std::ops::Range;

use super::Vifa;
use crate::error::Result;
use crate::query::{widen, GaussianRows, RowVisitor, QUERY_BLOCK_ROWS};
use crate::scalar::Real;

impl<T: Real> GaussianRows for Vifa<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    /// c, F and ψ = exp β as stored.
    fn visit_range(&self, rows: Range<usize>, visit: &mut RowVisitor<'_>) -> Result<()> {
        let k = self.n_components;
        let (mut mean, mut f, mut psi) = (Vec::new(), Vec::new(), Vec::new());
        for lo in rows.clone().step_by(QUERY_BLOCK_ROWS) {
            let hi = (lo + QUERY_BLOCK_ROWS).min(rows.end);
            widen(&self.params.c[lo..hi], &mut mean);
            widen(&self.params.f[lo * k..hi * k], &mut f);
            psi.clear();
            psi.extend(self.params.beta[lo..hi].iter().map(|b| b.to_f64().exp()));
            visit(lo, &mean, &f, &psi)?;
        }
        Ok(())
    }
}
