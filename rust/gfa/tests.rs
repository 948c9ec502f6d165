//! Unit tests of batch GFA: monotone bound, rotation gain, parity with VB-FA, dropping, low-rank ARD, bad input.

use super::batch::{GfaBatch, GfaStep};
use super::{GfaConfig, Groups, NoiseModel};
use crate::error::FaError;
use crate::init::fill_standard_normal;
use crate::vbfa::{Prior, Step, VbfaBatch, VbfaConfig};
use ndarray::s;
use ndarray::Array2;

/// N×D data: 3 factors, with factor 0 shared, 1 only in group 0, 2 only in group 1; groups of 6 and
/// 8 features with noise sd 0.3 and 0.6; optionally every 5th entry missing.
fn data(n: usize, missing: bool) -> (Array2<f64>, Groups) {
    let (d0, d1) = (6, 8);
    let mut h = Array2::zeros((n, 3));
    let mut f = Array2::zeros((d0 + d1, 3));
    let mut e = Array2::zeros((n, d0 + d1));
    fill_standard_normal(h.view_mut(), 21);
    fill_standard_normal(f.view_mut(), 22);
    fill_standard_normal(e.view_mut(), 23);
    f.slice_mut(s![d0.., 1]).fill(0.0);
    f.slice_mut(s![..d0, 2]).fill(0.0);
    e.slice_mut(s![.., ..d0]).mapv_inplace(|v| v * 0.3);
    e.slice_mut(s![.., d0..]).mapv_inplace(|v| v * 0.6);
    let mut x = h.dot(&f.t()) + e + 1.0;
    if missing {
        for (i, v) in x.iter_mut().enumerate() {
            if i % 5 == 3 {
                *v = f64::NAN;
            }
        }
    }
    let labels: Vec<usize> = (0..d0 + d1).map(|j| usize::from(j >= d0)).collect();
    (x, Groups::from_labels(&labels).expect("groups"))
}

fn config(k: usize, noise: NoiseModel) -> GfaConfig {
    GfaConfig {
        n_components: k,
        noise,
        seed: 5,
        ..GfaConfig::default()
    }
}

#[test]
fn every_update_and_transformation_raises_the_bound() {
    for (noise, missing, ard_rank) in [
        (NoiseModel::Group, true, None),
        (NoiseModel::Feature, true, None),
        (NoiseModel::Group, false, None),
        (NoiseModel::Group, true, Some(1)),
        (NoiseModel::Feature, false, Some(2)),
    ] {
        let (x, groups) = data(60, missing);
        let cfg = GfaConfig {
            ard_rank,
            ..config(5, noise)
        };
        let mut m = GfaBatch::new(x.view(), groups, cfg).expect("model");
        let mut last = m.elbo();
        for _ in 0..8 {
            for step in [
                GfaStep::Latents,
                GfaStep::Bias,
                GfaStep::Loadings,
                GfaStep::Noise,
                GfaStep::Ard,
                GfaStep::Translate,
                GfaStep::Rotate,
            ] {
                m.apply(step).expect("step");
                let now = m.elbo();
                assert!(
                    now >= last - 1e-10 * last.abs(),
                    "{noise:?} {ard_rank:?} {step:?}: {last} -> {now}"
                );
                last = now;
            }
        }
    }
}

#[test]
fn rotation_gain_equals_the_change_of_the_bound() {
    let (x, groups) = data(50, true);
    let mut m = GfaBatch::new(
        x.view(),
        groups,
        GfaConfig {
            rotate: false,
            ..config(4, NoiseModel::Group)
        },
    )
    .expect("model");
    for _ in 0..3 {
        m.sweep().expect("sweep");
    }
    let before = m.elbo();
    let (_, gain) = m.rotate().expect("rotate");
    assert!(gain > 0.0);
    assert!(((m.elbo() - before) - gain).abs() < 1e-8 * before.abs());
}

#[test]
fn one_group_per_feature_noise_reproduces_vbfa() {
    let (x, _) = data(40, true);
    let one = Groups::from_labels(&vec![0; x.ncols()]).expect("groups");
    let cfg = GfaConfig {
        rotate: false,
        drop_factors: false,
        ..config(4, NoiseModel::Feature)
    };
    let mut gfa = GfaBatch::new(x.view(), one, cfg).expect("gfa");
    let vcfg = VbfaConfig {
        n_components: 4,
        prior: Prior::Ard,
        transform: false,
        seed: 5,
        ..VbfaConfig::default()
    };
    let mut vbfa = VbfaBatch::new(x.view(), vcfg).expect("vbfa");
    assert!((gfa.elbo() - vbfa.elbo()).abs() < 1e-9 * vbfa.elbo().abs());
    for _ in 0..5 {
        gfa.sweep().expect("gfa sweep");
        for step in [Step::Latents, Step::Bias, Step::Loadings, Step::Noise, Step::Ard] {
            vbfa.apply(step).expect("vbfa step");
        }
        assert!((gfa.elbo() - vbfa.elbo()).abs() < 1e-9 * vbfa.elbo().abs());
    }
    assert!((gfa.loading_mean() - vbfa.loading_mean())
        .iter()
        .all(|v| v.abs() < 1e-9));
    assert!((gfa.noise_variance() - vbfa.noise_variance())
        .iter()
        .all(|v| v.abs() < 1e-9));
    assert!((gfa.latent_mean() - vbfa.latent_mean()).iter().all(|v| v.abs() < 1e-9));
}

#[test]
fn dropping_removes_inactive_factors_and_keeps_the_bound_consistent() {
    let (x, groups) = data(200, false);
    let mut m = GfaBatch::new(x.view(), groups, config(8, NoiseModel::Group)).expect("model");
    m.fit(300, 1e-7).expect("fit");
    assert_eq!(m.loading_mean().ncols(), 3, "kept {:?}", m.kept_components());
    assert_eq!(m.alpha_means().dim(), (2, 3));
    // The bound is monotone between drops.
    for pair in m.history().windows(2) {
        if pair[0].n_components == pair[1].n_components {
            assert!(pair[1].elbo >= pair[0].elbo - 1e-9 * pair[0].elbo.abs());
        }
    }
}

#[test]
fn low_rank_ard_recovers_the_pattern_and_drops_factors() {
    let (x, groups) = data(200, false);
    let cfg = GfaConfig {
        ard_rank: Some(1),
        ..config(8, NoiseModel::Group)
    };
    let mut m = GfaBatch::new(x.view(), groups, cfg).expect("model");
    m.fit(300, 1e-7).expect("fit");
    assert_eq!(m.loading_mean().ncols(), 3, "kept {:?}", m.kept_components());
    // One shared factor and one private factor per group: exactly one inactive cell per private factor.
    let active = m.activity().mapv(|v| v > 0.02);
    let per_factor: Vec<usize> = active
        .columns()
        .into_iter()
        .map(|c| c.iter().filter(|&&a| a).count())
        .collect();
    let mut sorted = per_factor.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![1, 1, 2], "{active:?}");
    for pair in m.history().windows(2) {
        if pair[0].n_components == pair[1].n_components {
            assert!(pair[1].elbo >= pair[0].elbo - 1e-9 * pair[0].elbo.abs());
        }
    }
}

#[test]
fn bad_input_is_rejected() {
    let (x, groups) = data(10, false);
    let short = Groups::from_labels(&[0, 1, 1]).expect("groups");
    assert!(GfaBatch::new(x.view(), short, config(2, NoiseModel::Group)).is_err());
    assert!(Groups::from_labels(&[0, 2, 2]).is_err());
    let mut y = x.clone();
    y.slice_mut(s![.., ..6]).fill(f64::NAN);
    let err = GfaBatch::new(y.view(), groups.clone(), config(2, NoiseModel::Group)).unwrap_err();
    assert!(err.to_string().contains("group 0"), "{err}");
    assert!(GfaBatch::new(x.view(), groups.clone(), config(11, NoiseModel::Group)).is_err());
    let mut z = x.clone();
    z[[1, 1]] = f64::INFINITY;
    assert!(matches!(
        GfaBatch::new(z.view(), groups, config(2, NoiseModel::Group)),
        Err(FaError::BadValue { row: 1, .. })
    ));
}

mod checkpoint {
    use super::{config, data};
    use crate::gfa::{GfaBatch, GfaConfig, NoiseModel};
    use crate::state::{Checkpoint, StateValue};

    #[test]
    fn round_trip_is_exact_and_continues_identically() {
        for (noise, missing, ard_rank) in [(NoiseModel::Group, true, None), (NoiseModel::Feature, false, Some(1))] {
            let (x, groups) = data(40, missing);
            let cfg = GfaConfig {
                ard_rank,
                ..config(5, noise)
            };
            let mut m = GfaBatch::new(x.view(), groups, cfg).expect("model");
            m.fit(6, 0.0).expect("fit");
            let mut back = GfaBatch::from_state(&m.to_state()).expect("restore");
            assert_eq!(back, m);
            m.fit(3, 0.0).expect("fit");
            back.fit(3, 0.0).expect("fit");
            assert_eq!(back.loading_mean(), m.loading_mean());
            assert_eq!(back.elbo(), m.elbo());
        }
    }

    #[test]
    fn inconsistent_states_are_refused() {
        let (x, groups) = data(30, true);
        let mut m = GfaBatch::new(x.view(), groups, config(4, NoiseModel::Group)).expect("model");
        m.fit(3, 0.0).expect("fit");
        let good = m.to_state();
        let edits: Vec<(&str, Edit)> = vec![
            ("tau_rate", Box::new(|v| set_first(v, -1.0))),
            ("alpha_shape", Box::new(|v| set_first(v, 0.0))),
            ("f_cov", Box::new(|v| set_at(v, 1, 5.0))),
            ("kept", Box::new(|v| set_first(v, 9.0))),
            ("groups", Box::new(|v| set_first(v, 0.5))),
            ("missing", Box::new(|v| set_first(v, 1e9))),
            ("stats_n_rows", Box::new(|v| *v = StateValue::Float(29.0))),
            ("n_components", Box::new(|v| *v = StateValue::Int(0))),
            ("noise", Box::new(|v| *v = StateValue::Text("none".into()))),
        ];
        for (key, edit) in edits {
            let mut state = good.clone();
            edit(state.get_mut(key).expect(key));
            assert!(GfaBatch::from_state(&state).is_err(), "{key} accepted");
        }
        let mut state = good.clone();
        state.remove("c_var");
        assert!(GfaBatch::from_state(&state).is_err());
    }

    /// A change to one state entry.
    type Edit = Box<dyn Fn(&mut StateValue)>;

    fn set_first(v: &mut StateValue, value: f64) {
        set_at(v, 0, value);
    }

    fn set_at(v: &mut StateValue, i: usize, value: f64) {
        match v {
            StateValue::F64(_, data) => data[i] = value,
            other => panic!("not an array: {other:?}"),
        }
    }
}
