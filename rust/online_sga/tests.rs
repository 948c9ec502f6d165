use super::*;
use crate::engine::partition::{use_parallel, TASK_ROWS};
use crate::init::{fill_standard_normal, orthonormal_loadings};
use ndarray::Axis;

/// Every scaling and step rule the kernels run: Algorithm 1's, the data-scaled gradient rule and the whitened one.
const SETTINGS: [(Scaling, SgaRule); 3] = [
    (Scaling::Unit, SgaRule::Gradient),
    (Scaling::Data, SgaRule::Gradient),
    (Scaling::Data, SgaRule::Whitened),
];

#[test]
fn local_sums_then_apply_equals_update() {
    for (scaling, rule) in SETTINGS {
        let (d, k) = (40, 3);
        let f0 = orthonormal_loadings(d, k, 21).expect("init");
        let mut x = Array2::zeros((60, d));
        fill_standard_normal(x.view_mut(), 22);
        let cfg = SgaConfig {
            n_warmup: 10,
            lr: 0.01,
            scaling,
            rule,
            ..SgaConfig::default()
        };
        let mut whole = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
        let mut split = whole.clone();
        whole.update(x.view()).expect("update");
        for row in x.rows() {
            let sums = split.local_sums(row).expect("sums");
            split.apply(&sums, d).expect("apply");
        }
        assert_eq!(whole.loadings(), split.loadings());
        assert_eq!(whole.noise_variance(), split.noise_variance());
        assert_eq!(whole.mean(), split.mean());
    }
}

#[test]
fn batch_equals_row_by_row_and_psi_stays_positive() {
    let (d, k) = (25, 2);
    let f0 = orthonormal_loadings(d, k, 11).expect("init");
    let mut x = Array2::zeros((150, d));
    fill_standard_normal(x.view_mut(), 12);
    let cfg = SgaConfig {
        n_warmup: 10,
        lr: 0.05,
        ..SgaConfig::default()
    };
    let mut batch = OnlineSga::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
    batch.update(x.view()).expect("update");
    let mut single = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
    for row in x.rows() {
        single.update(row.insert_axis(Axis(0))).expect("update");
    }
    assert_eq!(batch, single);
    assert!(batch.noise_variance().iter().all(|&p| p > 0.0));
}

#[test]
fn warm_up_keeps_parameters_fixed() {
    let (d, k) = (12, 3);
    let f0 = orthonormal_loadings(d, k, 13).expect("init");
    let mut x = Array2::zeros((8, d));
    fill_standard_normal(x.view_mut(), 14);
    let cfg = SgaConfig {
        n_warmup: 8,
        ..SgaConfig::default()
    };
    let mut sga = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
    sga.update(x.view()).expect("update");
    assert_eq!(sga.loadings(), f0);
    assert!(sga.noise_variance().iter().all(|&p| p == 1.0));
}

use crate::engine::isa::Isa;
use crate::engine::sga_kernel::MAX_K;

fn stream(n: usize, d: usize, seed: u64) -> Array2<f64> {
    let mut x = Array2::zeros((n, d));
    fill_standard_normal(x.view_mut(), seed);
    // Different scales per feature and a shared factor, so F and ψ move.
    for mut row in x.rows_mut() {
        let common = row[0];
        for (j, v) in row.iter_mut().enumerate() {
            *v = *v * (1.0 + (j % 7) as f64 * 0.3) + common * 1.5;
        }
    }
    x
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (p, q)| m.max((p - q).abs() / scale))
}

/// The model after `x` with the given kernel path, and its F, ψ, θ̄ as f64.
fn run_with<T: Real>(model: &OnlineSga<T>, path: SgaPath<T>, x: ArrayView2<f64>) -> [Vec<f64>; 3] {
    let mut m = model.clone();
    m.path = path;
    m.update(x).expect("update");
    let to64 = |v: &[T]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    [to64(&m.f), to64(&m.psi), to64(&m.mean)]
}

fn model<T: Real>(d: usize, k: usize, (scaling, rule): (Scaling, SgaRule)) -> OnlineSga<T> {
    let f0 = orthonormal_loadings(d, k, k as u64 + 3).expect("init");
    let cfg = SgaConfig {
        n_warmup: 3,
        lr: 0.02,
        scaling,
        rule,
        ..SgaConfig::default()
    };
    OnlineSga::<T>::new(d, k, f0.view(), cfg).expect("new")
}

#[test]
fn simd_paths_equal_portable_path() {
    // Every code path this CPU runs against the portable one; warm-up, the data-scaled start and pending
    // steps all run. The row kernel (K ≤ 16) runs the same W on every path, so it is bit-identical in
    // both storage types; the wide kernel's FMA path agrees to rounding (float64).
    for k in [1usize, 3, 10, 16, 17, 24] {
        for setting in SETTINGS {
            let d = 2 * BLOCK_ROWS + 3 * k + 5;
            let x = stream(8, d, 50 + k as u64);
            let sga = model::<f64>(d, k, setting);
            let sga32 = model::<f32>(d, k, setting);
            let portable = run_with(&sga, SgaPath::with(k, Isa::Portable), x.view());
            let portable32 = run_with(&sga32, SgaPath::with(k, Isa::Portable), x.view());
            for isa in Isa::available() {
                let got = run_with(&sga, SgaPath::with(k, isa), x.view());
                for (a, b) in got.iter().zip(&portable) {
                    if k <= MAX_K {
                        assert_eq!(a, b, "K = {k}, {isa:?}");
                    } else {
                        assert!(max_rel(a, b) < 1e-12, "K = {k}, {isa:?}: {}", max_rel(a, b));
                    }
                }
                if k > MAX_K {
                    continue;
                }
                let got32 = run_with(&sga32, SgaPath::with(k, isa), x.view());
                assert_eq!(got32, portable32, "K = {k}, {isa:?} f32");
            }
        }
    }
}

#[test]
fn row_kernel_equals_wide_kernel() {
    // Two implementations of the same pass (row-SIMD with per-lane sums; tiled block products): for K the
    // row kernel handles they agree to rounding, in f64 and in f32 state. In f32 the row kernel does f32
    // arithmetic (the wide one f64): its per-lane partial sums over up to BLOCK_ROWS / 8 = 32 rows carry a
    // relative error up to 32·2⁻²⁴ ≈ 2·10⁻⁶, which the K×K step and 7 active samples amplify by the
    // conditioning of I + Fᵀ Ψ⁻¹ F with 10 factors fitted to one (measured worst: 1.7·10⁻⁵ relative in F at
    // K = 10, data-scaled; f32 storage alone with f64 arithmetic: 2·10⁻⁷).
    for k in [1usize, 2, 5, 10, 16] {
        for setting in SETTINGS {
            let d = BLOCK_ROWS + 2 * k + 101;
            let x = stream(10, d, 70 + k as u64);
            let sga = model::<f64>(d, k, setting);
            let rows = run_with(&sga, SgaPath::detect(k), x.view());
            let wide = run_with(&sga, SgaPath::Wide(Isa::Portable), x.view());
            for (a, b) in rows.iter().zip(&wide) {
                assert!(max_rel(a, b) < 1e-12, "K = {k}: {}", max_rel(a, b));
            }
            let sga = model::<f32>(d, k, setting);
            let rows = run_with(&sga, SgaPath::detect(k), x.view());
            let wide = run_with(&sga, SgaPath::Wide(Isa::detect()), x.view());
            for (a, b) in rows.iter().zip(&wide) {
                assert!(max_rel(a, b) < 1e-4, "K = {k} f32: {}", max_rel(a, b));
            }
        }
    }
}

#[test]
fn queries_see_what_the_next_pass_stores() {
    // `loadings`/`noise_variance` apply the pending step with the pass's own kernel: after the next pass
    // (which applies it), the stored F and ψ equal what the queries returned before it, bit for bit.
    for k in [4usize, 20] {
        for setting in SETTINGS {
            let d = 300;
            let mut sga = model::<f32>(d, k, setting);
            let x = stream(9, d, 90 + k as u64);
            for row in x.rows() {
                let (f, psi) = (sga.loadings(), sga.noise_variance());
                let mut probe = sga.clone();
                probe.pass(row, &mut Scratch::new(d, k), &mut StepSums::zeros(k));
                if sga.step.n_seen >= sga.step.config.n_warmup {
                    let stored_f: Vec<f64> = probe.f.iter().map(|v| v.to_f64()).collect();
                    let stored_psi: Vec<f64> = probe.psi.iter().map(|v| v.to_f64()).collect();
                    assert_eq!(f.as_slice().expect("c"), &stored_f[..]);
                    assert_eq!(psi.as_slice().expect("c"), &stored_psi[..]);
                }
                sga.update(row.insert_axis(Axis(0))).expect("update");
            }
        }
    }
}

#[test]
fn kernels_are_thread_count_independent() {
    // Several rayon tasks (D > TASK_ROWS) and D·K above the parallel gate: 1 and 3 threads = default pool.
    for k in [16usize, 20] {
        for setting in SETTINGS {
            thread_count_independent(model::<f64>(TASK_ROWS + 2 * BLOCK_ROWS + 5, k, setting));
        }
    }
    // float32 state (float32 arithmetic in the row kernel).
    thread_count_independent(model::<f32>(TASK_ROWS + 2 * BLOCK_ROWS + 5, 16, SETTINGS[2]));
}

fn thread_count_independent<T: Real>(fresh: OnlineSga<T>) {
    let (d, k) = (fresh.n_features, fresh.n_components);
    assert!(use_parallel(d, k));
    let x = stream(6, d, 7);
    let mut par = fresh.clone();
    par.update(x.view()).expect("update");
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        let mut other = fresh.clone();
        pool.install(|| other.update(x.view())).expect("update");
        assert_eq!(par, other, "K = {k}, {}, {threads} threads", T::NAME);
    }
}

#[test]
fn rejects_bad_learning_rate() {
    let f0 = Array2::<f64>::zeros((5, 2));
    for lr in [0.0, -1.0, f64::NAN] {
        let cfg = SgaConfig {
            lr,
            ..SgaConfig::default()
        };
        assert!(OnlineSga::<f64>::new(5, 2, f0.view(), cfg).is_err());
    }
}

#[test]
fn whitened_rule_needs_data_scaling_and_round_trips() {
    let (d, k) = (30, 4);
    let f0 = orthonormal_loadings(d, k, 5).expect("init");
    let whitened = SgaConfig {
        n_warmup: 6,
        rule: SgaRule::Whitened,
        ..SgaConfig::default()
    };
    let err = OnlineSga::<f64>::new(d, k, f0.view(), whitened.clone()).expect_err("unit scaling");
    assert!(err.to_string().contains("scaling='data'"), "{err}");
    let cfg = SgaConfig {
        scaling: Scaling::Data,
        ..whitened
    };
    let x = stream(40, d, 6);
    let mut a = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
    a.update(x.slice(ndarray::s![..20, ..])).expect("update");
    let state = crate::state::Checkpoint::to_state(&a);
    let mut b: OnlineSga<f64> = crate::state::Checkpoint::from_state(&state).expect("restore");
    a.update(x.slice(ndarray::s![20.., ..])).expect("update");
    b.update(x.slice(ndarray::s![20.., ..])).expect("update");
    assert_eq!(a, b);
    // A checkpoint without the entry (written before the rule existed) is the gradient rule.
    let mut old = state.clone();
    old.remove("rule");
    old.insert("scaling".into(), crate::state::StateValue::Text("unit".into()));
    let restored: OnlineSga<f64> = crate::state::Checkpoint::from_state(&old).expect("restore");
    assert_eq!(restored.config().rule, SgaRule::Gradient);
    let mut bad = state;
    bad.insert("rule".into(), crate::state::StateValue::Text("newton".into()));
    assert!(<OnlineSga<f64> as crate::state::Checkpoint>::from_state(&bad).is_err());
}
