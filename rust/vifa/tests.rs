use super::*;
use crate::error::FaError;
use crate::init::{fill_standard_normal, orthonormal_loadings};
use nalgebra::DMatrix;

pub(super) fn config(optimizer: Optimizer, n_grad_samples: usize) -> VifaConfig {
    VifaConfig {
        prior_precision: 0.3,
        lr: LearningRates {
            mean: 1.0,
            loadings: 1.0,
            log_noise: 1.0,
        },
        optimizer,
        n_grad_samples,
        clip_grad_norm: None,
    }
}

/// A model with non-trivial c, F, ψ.
pub(super) fn model<T: Real>(d: usize, k: usize, cfg: VifaConfig, seed: u64) -> Vifa<T> {
    let f = orthonormal_loadings(d, k, seed).expect("init") * 1.3;
    let mut c = Array1::zeros(d);
    fill_standard_normal(c.view_mut().insert_axis(ndarray::Axis(1)), seed + 1);
    let psi = Array1::from_shape_fn(d, |i| 0.4 + 0.1 * (i % 7) as f64);
    let init = VifaInit {
        loadings: f.view(),
        mean: Some(c.view()),
        noise_variance: Some(psi.view()),
    };
    Vifa::new(d, k, init, seed, cfg).expect("new")
}

/// E_q[log q] − E_q[log p] up to constants: −½ log|F Fᵀ + Ψ| + (α/2)(tr(F Fᵀ + Ψ) + cᵀc) (4.41, 4.46).
fn entropy_prior(c: &[f64], f: &DMatrix<f64>, beta: &[f64], alpha: f64) -> f64 {
    let s = f * f.transpose()
        + DMatrix::from_diagonal(&nalgebra::DVector::from_iterator(
            beta.len(),
            beta.iter().map(|b| b.exp()),
        ));
    let chol = nalgebra::Cholesky::new(s.clone()).expect("spd");
    let log_det: f64 = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    -0.5 * log_det + 0.5 * alpha * (s.trace() + c.iter().map(|v| v * v).sum::<f64>())
}

#[test]
fn deterministic_gradient_matches_finite_differences() {
    let (d, k) = (5, 2);
    let mut vi = model::<f64>(d, k, config(Optimizer::Sgd, 1), 3);
    let (c0, f0, b0) = (vi.mean(), vi.loadings(), vi.log_noise_variance());
    vi.sample().expect("sample");
    vi.step(Array2::<f64>::zeros((1, d)).view()).expect("step");
    // SGD with η = 1: the applied gradient is old − new.
    let (gc, gf, gb) = (&c0 - &vi.mean(), &f0 - &vi.loadings(), &b0 - &vi.log_noise_variance());
    let fm = DMatrix::from_fn(d, k, |i, j| f0[[i, j]]);
    let objective = |c: &[f64], f: &DMatrix<f64>, b: &[f64]| entropy_prior(c, f, b, 0.3);
    let (c, b) = (c0.to_vec(), b0.to_vec());
    let eps = 1e-6;
    for i in 0..d {
        let (mut cp, mut cm) = (c.clone(), c.clone());
        cp[i] += eps;
        cm[i] -= eps;
        let fd = (objective(&cp, &fm, &b) - objective(&cm, &fm, &b)) / (2.0 * eps);
        assert!((fd - gc[i]).abs() < 1e-7, "c[{i}]: fd {fd} vs {}", gc[i]);
        let (mut bp, mut bm) = (b.clone(), b.clone());
        bp[i] += eps;
        bm[i] -= eps;
        let fd = (objective(&c, &fm, &bp) - objective(&c, &fm, &bm)) / (2.0 * eps);
        assert!((fd - gb[i]).abs() < 1e-7, "beta[{i}]: fd {fd} vs {}", gb[i]);
        for j in 0..k {
            let (mut fp, mut fmm) = (fm.clone(), fm.clone());
            fp[(i, j)] += eps;
            fmm[(i, j)] -= eps;
            let fd = (objective(&c, &fp, &b) - objective(&c, &fmm, &b)) / (2.0 * eps);
            assert!((fd - gf[[i, j]]).abs() < 1e-7, "F[{i},{j}]: fd {fd} vs {}", gf[[i, j]]);
        }
    }
}

#[test]
fn likelihood_terms_use_the_remembered_draws() {
    let (d, k, l) = (7, 3, 4);
    let base = model::<f64>(d, k, config(Optimizer::Sgd, l), 5);
    let mut with_g = base.clone();
    let mut thetas = Vec::new();
    for _ in 0..l {
        thetas.push(with_g.sample().expect("sample"));
    }
    let (h, z) = with_g.pending_noise();
    let psi = base.noise_variance();
    for (li, theta) in thetas.iter().enumerate() {
        // (4.50): θ = F h + c + ψ^{1/2} ⊙ z with the reported noise.
        let expect = base.loadings().dot(&h.row(li)) + base.mean() + psi.mapv(f64::sqrt) * z.row(li);
        for (a, b) in theta.iter().zip(expect.iter()) {
            assert!((a - b).abs() < 1e-13);
        }
    }
    let mut without = with_g.clone();
    let mut g = Array2::zeros((l, d));
    fill_standard_normal(g.view_mut(), 9);
    with_g.step(g.view()).expect("step");
    without.step(Array2::<f64>::zeros((l, d)).view()).expect("step");
    // Difference of the two SGD steps (η = 1) = the averaged likelihood terms (4.51, 4.52, 4.61).
    let dc = &without.mean() - &with_g.mean();
    let df = &without.loadings() - &with_g.loadings();
    let db = &without.log_noise_variance() - &with_g.log_noise_variance();
    let lf = l as f64;
    let want_c = g.sum_axis(ndarray::Axis(0)) / lf;
    let want_f = g.t().dot(&h) / lf;
    let want_b = (&g * &z).sum_axis(ndarray::Axis(0)) * psi.mapv(f64::sqrt) * 0.5 / lf;
    for (a, b) in dc
        .iter()
        .chain(df.iter())
        .chain(db.iter())
        .zip(want_c.iter().chain(want_f.iter()).chain(want_b.iter()))
    {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

#[test]
fn protocol_errors_leave_the_state_unchanged() {
    let d = 6;
    let mut vi = model::<f64>(d, 2, config(Optimizer::Adam, 2), 1);
    let before = vi.clone();
    assert!(matches!(
        vi.step(Array2::<f64>::zeros((2, d)).view()),
        Err(FaError::CallOrder(_))
    ));
    assert_eq!(vi, before);
    vi.sample().expect("sample");
    vi.sample().expect("sample");
    let pending = vi.clone();
    assert!(
        matches!(vi.sample(), Err(FaError::CallOrder(_))),
        "a third draw with n_grad_samples = 2 is a call-order error"
    );
    assert!(matches!(
        vi.step(Array2::<f64>::zeros((1, d)).view()),
        Err(FaError::Shape { .. })
    ));
    let mut bad = Array2::<f64>::zeros((2, d));
    bad[[1, 4]] = f64::NAN;
    assert!(matches!(vi.step(bad.view()), Err(FaError::BadValue { row: 1, .. })));
    assert_eq!(vi, pending);
    vi.step(Array2::<f64>::zeros((2, d)).view()).expect("step");
    assert_eq!((vi.n_steps(), vi.n_pending(), vi.n_draws()), (1, 0, 2));
}

#[test]
fn invalid_configurations_are_rejected() {
    let f = Array2::<f64>::zeros((4, 2));
    let init = VifaInit {
        loadings: f.view(),
        mean: None,
        noise_variance: None,
    };
    let ok = config(Optimizer::Sgd, 1);
    assert!(Vifa::<f64>::new(4, 2, init, 0, ok.clone()).is_ok());
    let bad = [
        VifaConfig {
            prior_precision: -1.0,
            ..ok.clone()
        },
        VifaConfig {
            prior_precision: f64::NAN,
            ..ok.clone()
        },
        VifaConfig {
            lr: LearningRates { mean: -0.1, ..ok.lr },
            ..ok.clone()
        },
        VifaConfig {
            n_grad_samples: 0,
            ..ok.clone()
        },
        VifaConfig {
            clip_grad_norm: Some(0.0),
            ..ok.clone()
        },
    ];
    for cfg in bad {
        assert!(Vifa::<f64>::new(4, 2, init, 0, cfg).is_err());
    }
    assert!(Vifa::<f64>::new(4, 5, init, 0, ok.clone()).is_err());
    let psi = Array1::from(vec![1.0, 0.0, 1.0, 1.0]);
    let init_bad = VifaInit {
        noise_variance: Some(psi.view()),
        ..init
    };
    assert!(Vifa::<f64>::new(4, 2, init_bad, 0, ok).is_err());
}

#[test]
fn parallel_pass_equals_serial_pass() {
    let (d, k) = (40_000, 4);
    let mut cfg = config(Optimizer::Adam, 2);
    cfg.lr = LearningRates {
        mean: 1e-2,
        loadings: 1e-3,
        log_noise: 1e-2,
    };
    cfg.clip_grad_norm = Some(50.0);
    let run = |vi: &mut Vifa<f32>| {
        for step in 0..3 {
            let a = vi.sample().expect("sample");
            let b = vi.sample().expect("sample");
            let mut g = ndarray::stack(ndarray::Axis(0), &[a.view(), b.view()]).expect("stack");
            g.mapv_inplace(|v| 0.5 * v + step as f64);
            vi.step(g.view()).expect("step");
        }
    };
    let mut par = model::<f32>(d, k, cfg.clone(), 2);
    run(&mut par);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
    let mut ser = model::<f32>(d, k, cfg, 2);
    pool.install(|| run(&mut ser));
    assert_eq!(par, ser);
}

#[test]
fn clipping_bounds_each_group_norm() {
    let (d, k) = (6, 2);
    let mut cfg = config(Optimizer::Sgd, 1);
    cfg.clip_grad_norm = Some(0.01);
    let mut clipped = model::<f64>(d, k, cfg, 4);
    let mut plain = model::<f64>(d, k, config(Optimizer::Sgd, 1), 4);
    let g = Array2::from_elem((1, d), 3.0);
    for vi in [&mut clipped, &mut plain] {
        vi.sample().expect("sample");
    }
    let (c0, f0, b0) = (plain.mean(), plain.loadings(), plain.log_noise_variance());
    clipped.step(g.view()).expect("step");
    plain.step(g.view()).expect("step");
    let norm = |v: ndarray::ArrayViewD<f64>| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let pairs = [
        ((&c0 - &clipped.mean()).into_dyn(), (&c0 - &plain.mean()).into_dyn()),
        (
            (&f0 - &clipped.loadings()).into_dyn(),
            (&f0 - &plain.loadings()).into_dyn(),
        ),
        (
            (&b0 - &clipped.log_noise_variance()).into_dyn(),
            (&b0 - &plain.log_noise_variance()).into_dyn(),
        ),
    ];
    for (clip, full) in pairs {
        let (nc, nf) = (norm(clip.view()), norm(full.view()));
        assert!(nf > 0.01 && (nc - 0.01).abs() < 1e-12, "clipped norm {nc}, full {nf}");
        // Same direction: clip = full · 0.01 / ‖full‖.
        for (a, b) in clip.iter().zip(full.iter()) {
            assert!((a - b * 0.01 / nf).abs() < 1e-12);
        }
    }
}

#[test]
fn vifa_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Vifa<f32>>();
    assert_send_sync::<Vifa<f64>>();
}

#[test]
fn divergence_is_reported_and_sticky() {
    let d = 4;
    let mut cfg = config(Optimizer::Sgd, 1);
    cfg.lr = LearningRates {
        mean: 1.0,
        loadings: 1.0,
        log_noise: 1e3,
    };
    let mut vi = model::<f64>(d, 1, cfg, 7);
    vi.sample().expect("sample");
    // ∇β ≈ ½ ψ^{1/2} g z with g = 1e6: a step of 1e3 · O(1e6) makes ψ = exp β overflow (or vanish).
    let g = Array2::from_elem((1, d), 1e6);
    assert!(matches!(vi.step(g.view()), Err(FaError::NotPositiveDefinite(_))));
    assert!(vi.sample().is_err());
}
