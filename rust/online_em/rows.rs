//! The online-EM model's fitted Gaussian, read block by block of rows for the queries of `crate::query`.

use std::ops::Range;

use ndarray::{Array2, ArrayView2};

use super::{Basis, OnlineEm};
use crate::error::Result;
use crate::query::{map_visited_rows, GaussianRows, RowVisitor, QUERY_BLOCK_ROWS};
use crate::scalar::Real;

impl<T: Real> GaussianRows for OnlineEm<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    /// F = Ā H̄⁻¹ (Ā when whitened), ψ = max(d̄² − rowsum(F ⊙ Ā), floor); during warm-up F₀ σ and σ².
    fn visit_range(&self, rows: Range<usize>, visit: &mut RowVisitor<'_>) -> Result<()> {
        let k = self.n_components;
        let (mut mean, mut f, mut psi) = (Vec::new(), Vec::new(), Vec::new());
        if let Basis::Initial = &self.step.basis {
            let (f0, scale) = (&self.init, self.step.warmup_scale());
            for lo in rows.clone().step_by(QUERY_BLOCK_ROWS) {
                let hi = (lo + QUERY_BLOCK_ROWS).min(rows.end);
                mean.clear();
                mean.extend((lo..hi).map(|i| self.pending_moments(i).mean.1));
                f.clear();
                f.extend(f0[lo * k..hi * k].iter().map(|v| v.to_f64() * scale));
                psi.clear();
                psi.resize(hi - lo, scale.powi(2));
                visit(lo, &mean, &f, &psi)?;
            }
            return Ok(());
        }
        self.visit_fitted_rows(rows, visit)
    }

    /// Fitted rows mapped in the pass that builds them (the lane path), where it applies.
    fn visit_range_mapped(&self, rows: Range<usize>, map: ArrayView2<f64>, visit: &mut RowVisitor<'_>) -> Result<()> {
        match map.as_slice().and_then(|report| self.lane_maps(Some(report))) {
            Some(maps) => self.visit_lane_rows(rows, &maps, visit),
            None => map_visited_rows(self, rows, map, visit),
        }
    }

    /// The spiked-model shrinkage (crate::shrinkage) when the configuration asks for it and the model is fitted.
    fn report_transform(&self) -> Result<Option<Array2<f64>>> {
        if !self.step.config.shrink || !self.is_fitted() {
            return Ok(None);
        }
        if let Some(map) = self.report_cache.get(self.step.n_seen) {
            return Ok(Some(map));
        }
        let gram = crate::shrinkage::gram(self)?;
        let map = crate::shrinkage::spiked_transform(gram.view(), self.n_features, self.effective_samples())?;
        self.report_cache.put(self.step.n_seen, &map);
        Ok(Some(map))
    }
}
