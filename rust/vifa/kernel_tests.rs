//! The kernels against each other: fused against blocked (to rounding), the AVX2 path against the
//! portable one (bit for bit), and results against the thread count and a restore (bit for bit).

use ndarray::{Array1, Axis};

use super::fused::Kernel;
use super::tests::{config, model};
use super::{LearningRates, Optimizer, Vifa, VifaConfig};
use crate::engine::isa::Isa;
use crate::scalar::Real;
use crate::state::{Checkpoint, StateReal};

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
            blocked.kernel = Kernel::Blocked(Isa::detect());
            blocked.kk_step.m_inv = Some(blocked.recompute_m_inv().expect("m_inv"));
            train(&mut fused, 4);
            train(&mut blocked, 4);
            let diff = max_relative_difference(&fused, &blocked);
            assert!(diff < 1e-12, "K = {k}, {optimizer:?}: max relative difference {diff:e}");
            assert!(
                diff > 0.0 || k == 1,
                "K = {k}: the two paths should not be the same code"
            );
            let (a, b) = (
                fused.kk_step.m_inv.expect("finite"),
                blocked.kk_step.m_inv.expect("finite"),
            );
            assert!(a
                .iter()
                .zip(b.iter())
                .all(|(x, y)| (x - y).abs() < 1e-12 * y.abs().max(1.0)));
        }
    }
}

/// Every code path this CPU has against the portable one after 3 Adam steps with clipping: bit for bit when
/// the lane count W is the same (AVX2), else within `tol` (AVX-512: the lanes of B and of the clipping norms
/// are added in another order, so (I + B)⁻¹ and the clip scales differ by rounding).
fn paths_agree_with_portable<T: Real>(tol: f64) {
    for k in [1, 5, 10, 16] {
        let start = model::<T>(611, k, settings(Optimizer::Adam, true), 5);
        let mut portable = start.clone();
        portable.kernel = Kernel::Fused(Isa::Portable);
        portable.kk_step.m_inv = Some(portable.recompute_m_inv().expect("m_inv"));
        train(&mut portable, 3);
        for isa in Isa::available() {
            let mut other = start.clone();
            other.kernel = Kernel::Fused(isa);
            other.kk_step.m_inv = Some(other.recompute_m_inv().expect("m_inv"));
            train(&mut other, 3);
            if isa.vector_bytes() == Isa::Portable.vector_bytes() {
                other.kernel = portable.kernel;
                assert_eq!(other, portable, "K = {k}, {}, {isa:?}", T::NAME);
            } else {
                let diff = max_relative_difference(&other, &portable);
                assert!(diff <= tol, "K = {k}, {}, {isa:?}: {diff:e}", T::NAME);
            }
        }
    }
}

#[test]
fn code_paths_agree_with_the_portable_one() {
    // float64: rounding of (I + B)⁻¹ moves the parameters by far less than 1e-12 relative.
    paths_agree_with_portable::<f64>(1e-12);
    // float32: a float32 partial sum of B over 256 / W rows per lane has relative error up to
    // (256 / W)·2⁻²⁴ ≈ 2e-6, which moves each step's gradient by as much relative to its size; with steps of
    // at most 0.05 the parameters (|x| ≲ 1) move by a few float32 ulps (2⁻²³ ≈ 1.2e-7 at 1): 1e-6 is ~8 ulps.
    paths_agree_with_portable::<f32>(1e-6);
}

fn thread_count_independent<T: Real>() {
    // Large enough to run on rayon (D·K ≥ 2¹⁷): the fused path (K = 10) and the blocked one (K = 20).
    // The fused path on every code path this CPU has.
    let d = 40_000;
    let mut cases: Vec<(usize, Kernel)> = Isa::available()
        .into_iter()
        .map(|isa| (10, Kernel::Fused(isa)))
        .collect();
    cases.push((20, Kernel::Blocked(Isa::detect())));
    for (k, kernel) in cases {
        let run = |vi: &mut Vifa<T>| train(vi, 2);
        let mut par = model::<T>(d, k, settings(Optimizer::Adam, true), 2);
        par.kernel = kernel;
        par.kk_step.m_inv = Some(par.recompute_m_inv().expect("m_inv"));
        let mut ser = par.clone();
        run(&mut par);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        pool.install(|| run(&mut ser));
        assert_eq!(par, ser, "K = {k}, {}, {kernel:?}", T::NAME);
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    thread_count_independent::<f64>();
    thread_count_independent::<f32>();
}

#[test]
fn wide_k_runs_the_blocked_path_and_restores_bit_identically() {
    let mut vi = model::<f32>(300, 20, settings(Optimizer::Adam, true), 8);
    assert!(matches!(vi.kernel, Kernel::Blocked(_)));
    train(&mut vi, 2);
    let restored = Vifa::<f32>::from_state(&vi.to_state()).expect("restore");
    assert_eq!(vi, restored);
}

fn restores_bit_identically<T: StateReal>() {
    let mut vi = model::<T>(1037, 7, settings(Optimizer::Sgd, false), 9);
    train(&mut vi, 3);
    let restored = Vifa::<T>::from_state(&vi.to_state()).expect("restore");
    assert_eq!(vi, restored, "{}", T::NAME);
}

#[test]
fn fused_restore_is_bit_identical() {
    // The restore recomputes (I + B)⁻¹ with `gram_block`, which must add B's lanes as the step did.
    restores_bit_identically::<f64>();
    restores_bit_identically::<f32>();
}

#[test]
fn vectorised_draws_equal_the_scalar_loop() {
    for k in [1, 6, 16] {
        let mut fused = model::<f32>(1037, k, settings(Optimizer::Sgd, false), 4);
        let mut scalar = fused.clone();
        scalar.kernel = Kernel::Blocked(Isa::detect());
        let mut portable = fused.clone();
        portable.kernel = Kernel::Fused(Isa::Portable);
        let theta = fused.sample().expect("sample");
        assert_eq!(theta, scalar.sample().expect("sample"), "K = {k}");
        assert_eq!(theta, portable.sample().expect("sample"), "K = {k}");
    }
}

/// float32 state runs the fused kernels (K ≤ 16) and the blocked path's products and F update (K = 20) in float32
/// arithmetic. Against float64 from the same start and draws, after 4 steps with clipping (D = 1037: several
/// 256-row blocks and a partial group):
///
/// * SGD: each step rounds every stored value (≤ 2⁻²⁴ ≈ 6e-8 relative) and moves it by η·∇ with ∇ computed
///   from K + 3 float32 terms (relative error ≲ (K + 3)·2⁻²⁴ of their size, times η ≤ 0.05): 4 steps stay
///   below 1e-6;
/// * Adam: m̂/√v̂ is ±1 per entry in the first steps whatever |∇| is, so an entry whose gradient terms cancel to
///   ~1e-3 of their size amplifies their float32 rounding a thousandfold: η·(K + 3)·2⁻²⁴·1e3 ≈ 2e-5 per step
///   at K = 16; bound 1e-4 (measured 1.6e-7, 1.2e-6, 1.2e-5, 1.9e-7 at K = 1, 10, 16, 20; SGD 1.7–2.2e-7).
///
/// A wrong term in either path would differ at O(η) = 1e-2.
#[test]
fn float32_arithmetic_tracks_float64() {
    for (optimizer, bound) in [(Optimizer::Sgd, 1e-6), (Optimizer::Adam, 1e-4)] {
        for k in [1, 10, 16, 20] {
            let mut wide = model::<f64>(1037, k, settings(optimizer, true), 6);
            let mut narrow = model::<f32>(1037, k, settings(optimizer, true), 6);
            train(&mut wide, 4);
            train(&mut narrow, 4);
            let pairs = [
                (wide.mean().into_dyn(), narrow.mean().into_dyn()),
                (wide.loadings().into_dyn(), narrow.loadings().into_dyn()),
                (
                    wide.log_noise_variance().into_dyn(),
                    narrow.log_noise_variance().into_dyn(),
                ),
            ];
            let diff = pairs
                .iter()
                .flat_map(|(x, y)| x.iter().zip(y.iter()).map(|(p, q)| (p - q).abs() / p.abs().max(1.0)))
                .fold(0.0, f64::max);
            assert!(diff < bound, "{optimizer:?}, K = {k}: max relative difference {diff:e}");
        }
    }
}
