//! Group factor analysis (GFA) by variational Bayes: several groups ("views") of features share the
//! latent factors, and a group × factor ARD prior learns which factor is active in which group.
//!
//! Model (project notation; the GFA notes' names in brackets): features d = 1..D split into M groups,
//! g(d) the group of feature d, D_m the size of group m, latents h_n ∈ R^K [z_i], loadings F (D×K,
//! row f_d) [W^(m)ᵀ stacked], bias c_d (as in VB-FA), noise precision τ_m per group (or τ_d per feature in
//! the per-feature variant, which with one group is the VB-FA model of Luttinen & Ilin):
//!
//! x_nd ~ N(f_dᵀ h_n + c_d, 1/τ_{g(d)}) for observed (n, d),   h_n ~ N(0, I_K),   c_d ~ N(0, 1/β),
//! f_dk ~ N(0, 1/α_{g(d),k}),   α_mk ~ G(a_α, b_α),   τ_m ~ G(a_τ, b_τ).
//!
//! q = Π_n q(h_n) Π_d q(c_d) q(f_d) Π_m q(τ_m) Π_{m,k} q(α_mk): the full-rank q(α) of the notes
//! (their "Full Rank Model Inference"), with the errata applied: the mean of q(h_n) sums over the groups,
//! and the rate of q(τ_m) carries the factor ½ (b_τ + ½ Σ_{d∈m} Σ_n ⟨(x_nd − f_dᵀh_n − c_d)²⟩).
//! The coordinate updates reuse the VB-FA kernels (`crate::vbfa::updates`); `bound.rs` is the full lower
//! bound; `rotation.rs` is the Luttinen–Ilin rotation generalised to groups (no closed form for M > 1,
//! maximised numerically from R = I); `lowrank.rs` is the notes' low-rank ARD
//! log α = U Vᵀ + μ_u 1ᵀ + 1 μ_vᵀ (point estimates, `GfaConfig::ard_rank`); `lbfgs.rs` the maximiser both use.

mod batch;
mod bound;
mod dropping;
mod lbfgs;
mod lowrank;
mod online;
mod predict;
mod rotation;
mod state;
#[cfg(test)]
mod tests;

pub use batch::{GfaBatch, GfaStep, GfaSweep};
pub use bound::GfaBoundTerms;
pub use lowrank::{full_rank_point_estimate, LowRankArd};
pub use online::{GfaOnline, GfaOnlineConfig};
pub use rotation::{
    group_rotation_gradient, group_rotation_objective, maximise_group_rotation, maximise_group_rotation_fixed,
};

use crate::error::{invalid, Result};
use crate::vbfa::Hyper;

/// Which noise precisions the model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseModel {
    /// One isotropic precision τ_m per group (the GFA notes' model).
    Group,
    /// One precision τ_d per feature (the thesis's diagonal Ψ), ARD still per group and factor.
    Feature,
}

/// Settings of a GFA model.
#[derive(Debug, Clone, PartialEq)]
pub struct GfaConfig {
    /// K, the number of latent factors at the start (unneeded ones are pruned by the ARD prior).
    pub n_components: usize,
    /// Noise model.
    pub noise: NoiseModel,
    /// `None`: the full-rank q(α) (Gamma factors); `Some(R)`: the low-rank ARD log α = U Vᵀ + μ_u 1ᵀ + 1 μ_vᵀ
    /// with U: M×R, V: K×R (point estimates).
    pub ard_rank: Option<usize>,
    /// λ, the prior precision of U and V in the low-rank ARD (the notes use 0.1).
    pub ard_lambda: f64,
    /// Prior hyper-parameters (`broad_alpha` is unused).
    pub hyper: Hyper,
    /// Apply the translation and the group rotation after each sweep from `rotate_start` on.
    pub rotate: bool,
    /// First sweep (counted from 1) after which the transformations run.
    pub rotate_start: u64,
    /// Drop factors whose share of every group's variance is below `drop_tol` (before each sweep).
    pub drop_factors: bool,
    /// Threshold of the factor-dropping rule (fraction of a group's total variance).
    pub drop_tol: f64,
    /// Initial noise variance as a fraction of each feature's variance.
    pub init_noise_ratio: f64,
    /// Seed of the random initial loadings.
    pub seed: u64,
}

impl Default for GfaConfig {
    fn default() -> Self {
        GfaConfig {
            n_components: 2,
            noise: NoiseModel::Group,
            ard_rank: None,
            ard_lambda: 0.1,
            hyper: Hyper::default(),
            rotate: true,
            rotate_start: 1,
            drop_factors: true,
            drop_tol: 1e-3,
            init_noise_ratio: 1e-2,
            seed: 0,
        }
    }
}

impl GfaConfig {
    /// Check the settings (K ≥ 1, rotate_start ≥ 1, positive finite hyper-parameters, 0 ≤ drop_tol < 1).
    pub fn validate(&self) -> Result<()> {
        if self.n_components < 1 {
            return Err(invalid(
                "n_components",
                format!("must be >= 1, got {}", self.n_components),
            ));
        }
        if self.rotate_start < 1 {
            return Err(invalid("rotate_start", "must be >= 1 (1 = after the first sweep)"));
        }
        if !(self.drop_tol.is_finite() && (0.0..1.0).contains(&self.drop_tol)) {
            return Err(invalid("drop_tol", format!("must be in [0, 1), got {}", self.drop_tol)));
        }
        if self.ard_rank == Some(0) {
            return Err(invalid("ard_rank", "must be >= 1 (or None for the full-rank q(α))"));
        }
        if !(self.ard_lambda.is_finite() && self.ard_lambda > 0.0) {
            return Err(invalid(
                "ard_lambda",
                format!("must be finite and > 0, got {}", self.ard_lambda),
            ));
        }
        let h = &self.hyper;
        for (name, value) in [
            ("a_alpha", h.a_alpha),
            ("b_alpha", h.b_alpha),
            ("a_tau", h.a_tau),
            ("b_tau", h.b_tau),
            ("beta", h.beta),
            ("init_noise_ratio", self.init_noise_ratio),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(invalid(name, format!("must be finite and > 0, got {value}")));
            }
        }
        Ok(())
    }
}

/// The partition of the D features into M groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    /// g(d) for every feature (D).
    of_feature: Vec<usize>,
    /// The features of each group, in increasing order (M lists).
    members: Vec<Vec<usize>>,
}

impl Groups {
    /// Groups from one label in 0..M per feature; every label in 0..M must occur (no empty group).
    pub fn from_labels(labels: &[usize]) -> Result<Self> {
        if labels.is_empty() {
            return Err(invalid("groups", "no feature has a group (got 0 labels)"));
        }
        let n_groups = labels.iter().max().map_or(0, |m| m + 1);
        let mut members = vec![Vec::new(); n_groups];
        for (d, &m) in labels.iter().enumerate() {
            members[m].push(d);
        }
        if let Some(empty) = members.iter().position(Vec::is_empty) {
            return Err(invalid(
                "groups",
                format!("group {empty} has no feature (labels must be 0..M-1, each used at least once)"),
            ));
        }
        Ok(Groups {
            of_feature: labels.to_vec(),
            members,
        })
    }

    /// M.
    pub fn n_groups(&self) -> usize {
        self.members.len()
    }

    /// D.
    pub fn n_features(&self) -> usize {
        self.of_feature.len()
    }

    /// g(d).
    pub fn of(&self, d: usize) -> usize {
        self.of_feature[d]
    }

    /// The features of group m.
    pub fn members(&self, m: usize) -> &[usize] {
        &self.members[m]
    }

    /// D_m for every group (M).
    pub fn sizes(&self) -> Vec<f64> {
        self.members.iter().map(|v| v.len() as f64).collect()
    }
}

#[cfg(test)]
mod send_sync {
    #[test]
    fn gfa_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::GfaBatch>();
        assert_send_sync::<super::Groups>();
        assert_send_sync::<super::GfaOnline>();
    }
}
