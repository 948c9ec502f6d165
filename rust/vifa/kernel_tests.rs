//! The kernels against each other: fused against blocked (to rounding), the AVX2 path against the
//! portable one (bit for bit), and results against the thread count and a restore (bit for bit).

use ndarray::{Array1, Axis};

use super::fused::Kernel;
use super::tests::{config, model};
use super::{LearningRates, Optimizer, Vifa, VifaConfig};
use crate::engine::em_kernel::Isa;
use crate::scalar::Real;
use crate::state::Checkpoint;

/// Small rates and, if `clip`, clipping that is active (so the norm pass runs and matters).
fn settings(optimizer: Optimizer, clip: bool) -> VifaConfig {
    VifaConfig {
        lr: LearningRates {
            mean: 0.05,
            loadings: 0.02,
            log_noise: 0.03,
        },
        clip_grad_norm: clip.then_some(0.5),
        ..config(optimizer, 2)
    }
}

/// `steps` sample/step cycles with the gradient 0.5 θ + 0.1 · step at each draw.
fn train<T: Real>(vi: &mut Vifa<T>, steps: usize) {
    for step in 0..steps {
        let draws: Vec<Array1<f64>> = (0..vi.config().n_grad_samples)
            .map(|_| vi.sample().expect("sample"))
            .collect();
        let views: Vec<_> = draws.iter().map(|d| d.view()).collect();
        let mut g = ndarray::stack(Axis(0), &views).expect("stack");
        g.mapv_inplace(|v| 0.5 * v + 0.1 * step as f64);
        vi.step(g.view()).expect("step");
    }
}

/// Largest |a − b| / max(1, |b|) over c, F, β.
fn max_relative_difference<T: Real>(a: &Vifa<T>, b: &Vifa<T>) -> f64 {
    let pairs = [
        (a.mean().into_dyn(), b.mean().into_dyn()),
        (a.loadings().into_dyn(), b.loadings().into_dyn()),
        (a.log_noise_variance().into_dyn(), b.log_noise_variance().into_dyn()),
    ];
    pairs
        .iter()
        .flat_map(|(x, y)| x.iter().zip(y.iter()).map(|(p, q)| (p - q).abs() / q.abs().max(1.0)))
        .fold(0.0, f64::max)
}

#[test]
fn fused_kernels_equal_the_blocked_path_to_rounding() {
    // D not a multiple of the 4-row groups nor of the 256-row blocks.
    let d = 1037;
    for k in [1, 3, 10, 16] {
        for (optimizer, clip) in [(Optimizer::Sgd, false), (Optimizer::Adam, true)] {
            let mut fused = model::<f64>(d, k, settings(optimizer, clip), 3);
            assert!(
                matches!(fused.kernel, Kernel::Fused(_)),
                "K = {k} runs the fused kernels"
            );
            let mut blocked = fused.clone();
            blocked.kernel = Kernel::Blocked;
            blocked.m_inv = Some(blocked.recompute_m_inv().expect("m_inv"));
            train(&mut fused, 4);
            train(&mut blocked, 4);
            let diff = max_relative_difference(&fused, &blocked);
            assert!(diff < 1e-12, "K = {k}, {optimizer:?}: max relative difference {diff:e}");
            assert!(
                diff > 0.0 || k == 1,
                "K = {k}: the two paths should not be the same code"
            );
            let (a, b) = (fused.m_inv.expect("finite"), blocked.m_inv.expect("finite"));
            assert!(a
                .iter()
                .zip(b.iter())
                .all(|(x, y)| (x - y).abs() < 1e-12 * y.abs().max(1.0)));
        }
    }
}

fn avx2_equals_portable<T: Real>() {
    for k in [1, 5, 16] {
        let mut best = model::<T>(611, k, settings(Optimizer::Adam, true), 5);
        let mut portable = best.clone();
        portable.kernel = Kernel::Fused(Isa::Portable);
        train(&mut best, 3);
        train(&mut portable, 3);
        portable.kernel = best.kernel;
        assert_eq!(best, portable, "K = {k}, {}", T::NAME);
    }
}

#[test]
fn avx2_and_portable_paths_agree_bit_for_bit() {
    // On a CPU without AVX2 both models run the portable path and agree trivially.
    avx2_equals_portable::<f64>();
    avx2_equals_portable::<f32>();
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Large enough to run on rayon (D·K ≥ 2¹⁷): the fused path (K = 10) and the blocked one (K = 20).
    let d = 40_000;
    for k in [10, 20] {
        let run = |vi: &mut Vifa<f64>| train(vi, 2);
        let mut par = model::<f64>(d, k, settings(Optimizer::Adam, true), 2);
        let mut ser = par.clone();
        run(&mut par);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        pool.install(|| run(&mut ser));
        assert_eq!(par, ser, "K = {k}");
    }
}

#[test]
fn wide_k_runs_the_blocked_path_and_restores_bit_identically() {
    let mut vi = model::<f32>(300, 20, settings(Optimizer::Adam, true), 8);
    assert_eq!(vi.kernel, Kernel::Blocked);
    train(&mut vi, 2);
    let restored = Vifa::<f32>::from_state(&vi.to_state()).expect("restore");
    assert_eq!(vi, restored);
}

#[test]
fn fused_restore_is_bit_identical_in_float64() {
    let mut vi = model::<f64>(1037, 7, settings(Optimizer::Sgd, false), 9);
    train(&mut vi, 3);
    let restored = Vifa::<f64>::from_state(&vi.to_state()).expect("restore");
    assert_eq!(vi, restored);
}

#[test]
fn vectorised_draws_equal_the_scalar_loop() {
    for k in [1, 6, 16] {
        let mut fused = model::<f32>(1037, k, settings(Optimizer::Sgd, false), 4);
        let mut scalar = fused.clone();
        scalar.kernel = Kernel::Blocked;
        let mut portable = fused.clone();
        portable.kernel = Kernel::Fused(Isa::Portable);
        let theta = fused.sample().expect("sample");
        assert_eq!(theta, scalar.sample().expect("sample"), "K = {k}");
        assert_eq!(theta, portable.sample().expect("sample"), "K = {k}");
    }
}
