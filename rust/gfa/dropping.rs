//! Factor dropping: the share of each group's variance explained by each factor, and the removal of the
//! factors below `drop_tol` in every group from q(H), q(F) and q(α).

use ndarray::{Array1, Array2, Array3, ArrayView2, Axis};

use super::batch::GfaBatch;
use crate::error::{invalid, Result};
use crate::vbfa::dense::SmallSpd;
use crate::vbfa::stats::{ColumnStats, LatentCovs};

/// The sub-covariance of the kept factors with its log-determinant.
fn select_cov(cov: ArrayView2<f64>, keep: &[usize]) -> Result<(Array2<f64>, f64)> {
    let sub = cov.select(Axis(0), keep).select(Axis(1), keep);
    let log_det = SmallSpd::new(sub.view(), "covariance of the kept factors")?.log_det();
    Ok((sub, log_det))
}

impl GfaBatch {
    /// Share of group m's total variance explained by factor k: (S_kk/N) Σ_{d∈m}⟨f_dk²⟩ / Σ_{d∈m} v_d (M×K).
    pub fn activity(&self) -> Array2<f64> {
        let k = self.f_mean.ncols();
        let latent_power = self.stats.total_gram.diag().mapv(|s| s / self.stats.n_rows);
        Array2::from_shape_fn((self.groups.n_groups(), k), |(m, j)| {
            let sq: f64 = self
                .groups
                .members(m)
                .iter()
                .map(|&d| self.f_mean[[d, j]].powi(2) + self.f_cov[[d, j, j]])
                .sum();
            latent_power[j] * sq / self.group_variance[m]
        })
    }

    /// Remove the factors whose activity is below `drop_tol` in every group (at least one factor stays):
    /// their columns of q(H), q(F) and q(α) and the matching rows/columns of the covariances. Returns the
    /// original indices of the dropped factors.
    pub fn drop_inactive(&mut self) -> Result<Vec<usize>> {
        let activity = self.activity();
        let k = self.f_mean.ncols();
        let peak: Vec<f64> = (0..k)
            .map(|j| activity.column(j).iter().cloned().fold(0.0, f64::max))
            .collect();
        let mut keep: Vec<usize> = (0..k).filter(|&j| peak[j] >= self.config.drop_tol).collect();
        if keep.is_empty() {
            let best = (0..k).max_by(|&a, &b| peak[a].total_cmp(&peak[b])).unwrap_or(0);
            keep.push(best);
        }
        self.retain_factors(&keep)
    }

    /// Remove the factors at the given current indices (0..K, K − 1 at most, so at least one stays) from
    /// q(H), q(F) and q(α), as [`GfaBatch::drop_inactive`] does; the caller judges the change (e.g. by the
    /// lower bound). Returns the original indices of the dropped factors.
    pub fn drop_components(&mut self, indices: &[usize]) -> Result<Vec<usize>> {
        let k = self.f_mean.ncols();
        if let Some(&bad) = indices.iter().find(|&&j| j >= k) {
            return Err(invalid("indices", format!("factor {bad} does not exist (K = {k})")));
        }
        let keep: Vec<usize> = (0..k).filter(|j| !indices.contains(j)).collect();
        if keep.is_empty() {
            return Err(invalid("indices", "at least one factor must stay".to_string()));
        }
        self.retain_factors(&keep)
    }

    /// Keep only the factors `keep` (current indices, increasing, non-empty).
    fn retain_factors(&mut self, keep: &[usize]) -> Result<Vec<usize>> {
        let k = self.f_mean.ncols();
        if keep.len() == k {
            return Ok(Vec::new());
        }
        let dropped: Vec<usize> = (0..k).filter(|j| !keep.contains(j)).map(|j| self.kept[j]).collect();
        let d = self.f_mean.nrows();
        let kk = keep.len();
        let mut f_cov = Array3::zeros((d, kk, kk));
        for j in 0..d {
            let (sub, log_det) = select_cov(self.f_cov.index_axis(Axis(0), j), keep)?;
            f_cov.index_axis_mut(Axis(0), j).assign(&sub);
            self.f_log_det[j] = log_det;
        }
        self.h_cov = match &self.h_cov {
            LatentCovs::Shared { cov, n_rows, .. } => {
                let (sub, log_det) = select_cov(cov.view(), keep)?;
                LatentCovs::Shared {
                    cov: sub,
                    log_det,
                    n_rows: *n_rows,
                }
            }
            LatentCovs::PerRow { cov, .. } => {
                let n = cov.len_of(Axis(0));
                let mut out = Array3::zeros((n, kk, kk));
                let mut log_det = Array1::zeros(n);
                for i in 0..n {
                    let (sub, ld) = select_cov(cov.index_axis(Axis(0), i), keep)?;
                    out.index_axis_mut(Axis(0), i).assign(&sub);
                    log_det[i] = ld;
                }
                LatentCovs::PerRow { cov: out, log_det }
            }
        };
        self.f_cov = f_cov;
        self.f_mean = self.f_mean.select(Axis(1), keep);
        self.h_mean = self.h_mean.select(Axis(1), keep);
        self.kept = keep.iter().map(|&j| self.kept[j]).collect();
        if let Some(lr) = self.low_rank.as_mut() {
            lr.select_factors(keep);
        }
        self.stats = ColumnStats::from_latents(self.x.view(), &self.missing, self.h_mean.view(), &self.h_cov);
        self.update_ard();
        Ok(dropped)
    }
}
