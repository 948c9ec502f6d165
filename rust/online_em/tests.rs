use super::*;
use crate::engine::partition::{use_parallel, SNAPSHOT_MAX_ELEMENTS, TASK_ROWS};
use crate::error::FaError;
use crate::init::{fill_standard_normal, orthonormal_loadings};
use crate::linalg::lower_triangular_inverse;
use ndarray::s;

fn stream(n: usize, d: usize, seed: u64) -> Array2<f64> {
    let mut x = Array2::zeros((n, d));
    fill_standard_normal(x.view_mut(), seed);
    // Give the features different scales and a shared factor so F has something to find.
    for mut row in x.rows_mut() {
        let common = row[0];
        for (j, v) in row.iter_mut().enumerate() {
            *v = *v * (1.0 + j as f64 * 0.1) + common * 2.0 + j as f64;
        }
    }
    x
}

#[test]
fn batch_equals_row_by_row_and_mean_is_exact() {
    let (d, k) = (40, 3);
    let f0 = orthonormal_loadings(d, k, 1).expect("init");
    let x = stream(300, d, 2);
    let cfg = EmConfig {
        n_warmup: 20,
        ..EmConfig::default()
    };
    let mut batch = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
    batch.update(x.view()).expect("update");
    let mut single = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
    for row in x.rows() {
        single.update(row.insert_axis(ndarray::Axis(0))).expect("update");
    }
    assert_eq!(batch, single);
    let mean = x.mean_axis(ndarray::Axis(0)).expect("mean");
    for (a, b) in batch.mean().iter().zip(mean.iter()) {
        assert!((a - b).abs() < 1e-12 * b.abs().max(1.0));
    }
    assert!(batch.noise_variance().iter().all(|&p| p > 0.0));
}

#[test]
fn parallel_pass_equals_serial_pass() {
    let (d, k) = (40_000, 4);
    let f0 = orthonormal_loadings(d, k, 3).expect("init");
    let x = stream(6, d, 4);
    let cfg = EmConfig {
        n_warmup: 2,
        ..EmConfig::default()
    };
    let mut par = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
    par.update(x.view()).expect("update");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
    let mut ser = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
    pool.install(|| ser.update(x.view())).expect("update");
    assert_eq!(par, ser);
}

#[test]
fn bad_rows_leave_state_untouched() {
    let (d, k) = (10, 2);
    let f0 = orthonormal_loadings(d, k, 5).expect("init");
    let mut em = OnlineEm::<f64>::new(d, k, f0.view(), EmConfig::default()).expect("new");
    em.update(stream(5, d, 6).view()).expect("update");
    let before = em.clone();
    let mut x = stream(4, d, 7);
    x[[2, 3]] = f64::NAN;
    match em.update(x.view()) {
        Err(FaError::BadValue { row, .. }) => assert_eq!(row, 2),
        other => panic!("expected BadValue, got {other:?}"),
    }
    assert_eq!(em, before);
    let wrong = Array2::<f64>::zeros((2, d + 1));
    assert!(matches!(em.update(wrong.view()), Err(FaError::Shape { .. })));
    assert_eq!(em, before);
}

/// One pass through the fused kernel and through the block path (explicit F = Ā H̄⁻¹) from the same state.
fn both_paths<T: Real>(em: &OnlineEm<T>, x: ArrayView1<f64>, isa: Isa) -> [(OnlineEm<T>, StepSums); 2] {
    let rho = em.step.rates().rho;
    let run = |isa: Option<Isa>| {
        let mut m = em.clone();
        let mut scratch = Scratch::new(m.n_features, m.n_components);
        let mut sums = StepSums::zeros(m.n_components);
        m.pass_on(x, rho, rho, &mut scratch, &mut sums, isa);
        (m, sums)
    };
    [run(Some(isa)), run(None)]
}

/// A model with K = `k` > MAX_K past warm-up with a pending step, over several blocks, partial sub-blocks and
/// tiles (D = 2·BLOCK_ROWS + 3K + 7), and its stream; the last row is not applied yet. Returns (model, x, D).
fn wide_model<T: Real>(k: usize, whiten: bool) -> (OnlineEm<T>, Array2<f64>, usize) {
    let d = 2 * BLOCK_ROWS + 3 * k + 7;
    let f0 = orthonormal_loadings(d, k, k as u64).expect("init");
    let x = stream(k + 8, d, 40 + k as u64);
    let cfg = EmConfig {
        n_warmup: k as u64 + 4,
        whiten,
        ..EmConfig::default()
    };
    let mut em = OnlineEm::<T>::new(d, k, f0.view(), cfg).expect("new");
    em.update(x.slice(s![..x.nrows() - 1, ..])).expect("update");
    assert!(em.is_fitted() && em.step.pending.is_some());
    (em, x, d)
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (p, q)| m.max((p - q).abs() / scale))
}

#[test]
fn abar_space_sums_equal_explicit_loadings_sums() {
    // Fᵀ Ψ⁻¹ F = Uᵀ S_z U and Fᵀ Ψ⁻¹ d = Uᵀ u_z is an identity: both paths agree to rounding, for every K the
    // kernel handles (each K its own monomorphised kernel; K = 18 to 24: the row kernel on AVX-512, the wide
    // kernel for f64 state elsewhere), plain and whitened, with the pending update (and whitening transform)
    // applied in the pass.
    for k in 1..=crate::engine::k_dispatch::MAX_K_EXTENDED {
        for whiten in [false, true] {
            let d = 3 * k + 1001; // not a multiple of the lane width or the block size
            let f0 = orthonormal_loadings(d, k, k as u64).expect("init");
            let x = stream(2 * k + 8, d, 40 + k as u64);
            let cfg = EmConfig {
                n_warmup: 2 * k as u64 + 2,
                whiten,
                ..EmConfig::default()
            };
            let mut em = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
            let n = x.nrows();
            em.update(x.slice(s![..n - 1, ..])).expect("update");
            assert!(em.is_fitted() && em.step.pending.is_some());
            let [(fast, fs), (slow, ss)] = both_paths(&em, x.row(n - 1), Isa::detect());
            assert!(
                max_rel(fs.s.as_slice().unwrap(), ss.s.as_slice().unwrap()) < 1e-12,
                "S, K = {k}"
            );
            assert!(
                max_rel(fs.u.as_slice().unwrap(), ss.u.as_slice().unwrap()) < 1e-12,
                "u, K = {k}"
            );
            assert!((fs.dsq_sum - ss.dsq_sum).abs() < 1e-13 * ss.dsq_sum);
            assert_eq!(
                (&fast.mean, &fast.dsq_bar, &fast.d_last),
                (&slow.mean, &slow.dsq_bar, &slow.d_last)
            );
            assert!(max_rel(&fast.a_bar, &slow.a_bar) < 1e-15, "Ā, K = {k}");
        }
    }
}

#[test]
fn wide_kernel_sums_equal_explicit_loadings_sums() {
    // K > MAX_K_EXTENDED (the row kernel's largest K on every path): the register-tiled Ā-space pass against
    // the explicit-F block path, plain and whitened, with the pending update (and whitening transform) applied
    // in the pass; both tiled code paths.
    for k in [25usize, 28, 32, 50, 64] {
        for whiten in [false, true] {
            let (em, x, d) = wide_model::<f64>(k, whiten);
            let n = x.nrows();
            let [(wide, ws), (slow, ss)] = both_paths(&em, x.row(n - 1), Isa::detect());
            assert!(
                max_rel(ws.s.as_slice().unwrap(), ss.s.as_slice().unwrap()) < 1e-12,
                "S, K = {k}"
            );
            assert!(
                max_rel(ws.u.as_slice().unwrap(), ss.u.as_slice().unwrap()) < 1e-12,
                "u, K = {k}"
            );
            assert!((ws.dsq_sum - ss.dsq_sum).abs() < 1e-13 * ss.dsq_sum);
            assert_eq!(
                (&wide.mean, &wide.dsq_bar, &wide.d_last),
                (&slow.mean, &slow.dsq_bar, &slow.d_last)
            );
            assert!(max_rel(&wide.a_bar, &slow.a_bar) < 1e-14, "Ā, K = {k}");
            // The portable tiled path agrees with the detected one to rounding.
            let rho = em.step.rates().rho;
            let consts = em.wide_consts(rho, rho, em.floor(), Isa::Portable).expect("wide");
            let mut portable = em.clone();
            let mut scratch = Scratch::new(d, k);
            let mut sums = StepSums::zeros(k);
            assert!(portable.pass_with(x.row(n - 1), rho, rho, &mut scratch, &mut sums, None, Some(consts)));
            assert!(max_rel(sums.s.as_slice().unwrap(), ws.s.as_slice().unwrap()) < 1e-12);
            assert!(max_rel(sums.u.as_slice().unwrap(), ws.u.as_slice().unwrap()) < 1e-12);
            assert!(max_rel(&portable.a_bar, &wide.a_bar) < 1e-14);
        }
    }
}

#[test]
fn wide_kernel_float32_arithmetic_matches_float64_arithmetic() {
    // float32 state: the wide pass (f32 scratch and tiled products) against the explicit-F block path (f64
    // arithmetic) from the same f32 state, plain and whitened, both tiled code paths. The state rows they
    // write come from the same f64 row-local arithmetic, so they are equal; Ā (rounded to f32 after line 12
    // and, when whitening, after the f32 product a W) within one f32 rounding of the product's terms. The sums
    // differ by the f32 rounding of z = aᵀL: each z carries at most (K + 1)·2⁻²⁴ ≈ 3e-6 (K = 50) of
    // Σ|a_i L_ij|, which ψ = d̄² − |z|² and the back transform Uᵀ S_z U carry into S and u (u sums terms of
    // both signs, so its relative error is the larger); measured ≤ 6e-7 (S) and ≤ 7.7e-6 (u, K = 50) relative
    // to the largest entry here, bound 1e-4 (that of the K ≤ 16 kernel's f32 sums against the same path).
    for k in [25usize, 28, 50] {
        for whiten in [false, true] {
            let (em, x, d) = wide_model::<f32>(k, whiten);
            let n = x.nrows();
            let [(wide, ws), (slow, ss)] = both_paths(&em, x.row(n - 1), Isa::detect());
            let rho = em.step.rates().rho;
            let consts = em.wide_consts(rho, rho, em.floor(), Isa::Portable).expect("wide");
            let mut portable = em.clone();
            let mut scratch = Scratch::new(d, k);
            let mut ps = StepSums::zeros(k);
            assert!(portable.pass_with(x.row(n - 1), rho, rho, &mut scratch, &mut ps, None, Some(consts)));
            for (path, state, sums) in [("detected", &wide, &ws), ("portable", &portable, &ps)] {
                let rel_s = max_rel(sums.s.as_slice().unwrap(), ss.s.as_slice().unwrap());
                let rel_u = max_rel(sums.u.as_slice().unwrap(), ss.u.as_slice().unwrap());
                assert!(rel_s < 1e-4, "S, K = {k}, whiten = {whiten}, {path}: {rel_s:e}");
                assert!(rel_u < 1e-4, "u, K = {k}, whiten = {whiten}, {path}: {rel_u:e}");
                assert!((sums.dsq_sum - ss.dsq_sum).abs() < 1e-13 * ss.dsq_sum);
                assert_eq!(
                    (&state.mean, &state.dsq_bar, &state.d_last),
                    (&slow.mean, &slow.dsq_bar, &slow.d_last)
                );
                let a_wide: Vec<f64> = state.a_bar.iter().map(|&v| f64::from(v)).collect();
                let a_slow: Vec<f64> = slow.a_bar.iter().map(|&v| f64::from(v)).collect();
                let bound = if whiten { (k as f64 + 2.0) * 6e-8 } else { 0.0 };
                assert!(max_rel(&a_wide, &a_slow) <= bound, "Ā, K = {k}, {path}");
            }
        }
    }
}

#[test]
fn ended_warmup_equals_a_model_whose_warmup_ended_there() {
    // Ending the warm-up early is the first M-step on the statistics so far: the same model built with
    // n_warmup = t − 1 and fed the same t samples has done exactly that, so the two are equal bit for bit
    // (both dtypes, plain and whitened, K below and above the fused kernel's limit). `self` is unchanged.
    fn check<T: Real>(k: usize, whiten: bool, t: usize, scaling: Scaling) {
        let d = 83;
        let f0 = orthonormal_loadings(d, k, 5).expect("init");
        let x = stream(t, d, 6);
        let cfg = EmConfig {
            n_warmup: k as u64 + 2,
            whiten,
            scaling,
            ..EmConfig::default()
        };
        let mut warm = OnlineEm::<T>::new(d, k, f0.view(), cfg.clone()).expect("new");
        warm.update(x.view()).expect("update");
        let before = warm.clone();
        let ended = warm.ended_warmup().expect("two or more samples");
        assert_eq!(warm, before);
        let early_cfg = EmConfig {
            n_warmup: t as u64 - 1,
            ..cfg
        };
        let mut early = OnlineEm::<T>::new(d, k, f0.view(), early_cfg).expect("new");
        early.update(x.view()).expect("update");
        assert!(ended.is_fitted() && early.is_fitted());
        assert_eq!(ended, early, "k {k} whiten {whiten} t {t} {scaling:?}");
    }
    for (k, t) in [(3, 2), (3, 5), (20, 2), (20, 13), (20, 22)] {
        for (whiten, scaling) in [(false, Scaling::Unit), (true, Scaling::Data), (true, Scaling::Unit)] {
            check::<f64>(k, whiten, t, scaling);
            check::<f32>(k, whiten, t, scaling);
        }
    }
}

#[test]
fn ended_warmup_needs_two_samples_and_an_unfinished_warmup() {
    let d = 40;
    let f0 = orthonormal_loadings(d, 2, 1).expect("init");
    let x = stream(6, d, 2);
    let mut em = OnlineEm::<f64>::new(
        d,
        2,
        f0.view(),
        EmConfig {
            n_warmup: 4,
            ..EmConfig::default()
        },
    )
    .expect("new");
    assert!(matches!(em.ended_warmup(), Err(FaError::CallOrder(_))));
    em.update(x.slice(s![..1, ..])).expect("update");
    assert!(matches!(em.ended_warmup(), Err(FaError::CallOrder(_))));
    em.update(x.slice(s![1..2, ..])).expect("update");
    assert!(em.ended_warmup().is_ok());
    em.update(x.slice(s![2.., ..])).expect("update");
    assert!(em.is_fitted() && matches!(em.ended_warmup(), Err(FaError::CallOrder(_))));
    let data = EmConfig {
        scaling: Scaling::Data,
        ..EmConfig::default()
    };
    let mut same = OnlineEm::<f64>::new(d, 2, f0.view(), data).expect("new");
    same.update(x.slice(s![..1, ..])).expect("update");
    same.update(x.slice(s![..1, ..])).expect("update");
    assert!(
        matches!(same.ended_warmup(), Err(FaError::CallOrder(_))),
        "identical samples have no scale"
    );
}

#[test]
fn large_k_passes_are_thread_count_independent() {
    // Two rayon tasks (D > TASK_ROWS) and D·K above the parallel gate: pool of 1 thread = default pool. float32
    // state runs the row kernel at K = 20 and the wide kernel at K = 24.
    for (whiten, k) in [false, true].into_iter().flat_map(|w| [(w, 20), (w, 24)]) {
        let d = TASK_ROWS + 2 * BLOCK_ROWS + 5;
        assert!(use_parallel(d, k));
        let f0 = orthonormal_loadings(d, k, 3).expect("init");
        let x = stream(k + 6, d, 4);
        let cfg = EmConfig {
            n_warmup: k as u64 + 2,
            whiten,
            ..EmConfig::default()
        };
        let mut par = OnlineEm::<f32>::new(d, k, f0.view(), cfg.clone()).expect("new");
        par.update(x.view()).expect("update");
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            let mut other = OnlineEm::<f32>::new(d, k, f0.view(), cfg.clone()).expect("new");
            pool.install(|| other.update(x.view())).expect("update");
            assert_eq!(par, other, "{threads} threads");
        }
    }
}

#[test]
fn every_code_path_equals_the_portable_path() {
    // Each row's arithmetic is the same on every path, so the state after the pass is equal bit for bit.
    // The sums agree bit for bit where the lane count matches (AVX2 and portable: 4 f64 / 8 f32 lanes). With
    // AVX-512's 8 f64 / 16 f32 lanes each lane sums other rows, so the sums differ by reassociation only: a
    // lane adds at most 256 / W terms, so in f64 the difference is below 64 · 2⁻⁵³ ≈ 7e-15 of the summed
    // magnitudes (bound 1e-12), in f32 below 64 · 2⁻²⁴ ≈ 3.8e-6 (bound 1e-5; S's diagonal dominates its scale).
    // f64 state at K = 16–24 is compared only on paths where both it and the portable path run the row kernel:
    // elsewhere one of them runs the wide kernel (`row_kernel_max`), whose paths agree to rounding
    // (`wide_kernel_sums_equal_explicit_loadings_sums`).
    // Every K the row kernel is compiled for (each is its own monomorphised kernel), whitened and not.
    let paths = Isa::available();
    let cases = (1..=crate::engine::k_dispatch::MAX_K_EXTENDED).flat_map(|k| [(k, false), (k, true)]);
    for (k, whiten) in cases {
        let d = 517;
        let f0 = orthonormal_loadings(d, k, 11).expect("init");
        let x = stream(40, d, 12);
        let cfg = EmConfig {
            n_warmup: 20,
            whiten,
            ..EmConfig::default()
        };
        let mut em64 = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
        em64.update(x.slice(s![..39, ..])).expect("update");
        let mut em32 = OnlineEm::<f32>::new(d, k, f0.view(), cfg).expect("new");
        em32.update(x.slice(s![..39, ..])).expect("update");
        let [(portable64, ps64), _] = both_paths(&em64, x.row(39), Isa::Portable);
        let [(portable32, ps32), (_, slow32)] = both_paths(&em32, x.row(39), Isa::Portable);
        let lanes = |isa: Isa, f32_state: bool| {
            let kernel = |k| {
                if f32_state {
                    EmRowKernel::<f32>::select(k, isa).map(|e| e.lanes())
                } else {
                    EmRowKernel::<f64>::select(k, isa).map(|e| e.lanes())
                }
            };
            kernel(k).expect("K <= MAX_K_EXTENDED")
        };
        for &isa in &paths {
            let row_kernel_f64 = [isa, Isa::Portable]
                .iter()
                .all(|&p| k <= super::row_kernel_max::<f64>(p));
            let [(path64, s64), _] = both_paths(&em64, x.row(39), isa);
            if row_kernel_f64 {
                assert_eq!(path64, portable64, "{isa:?}, K = {k}, whiten = {whiten}");
            }
            let [(path32, s32), _] = both_paths(&em32, x.row(39), isa);
            assert_eq!(path32, portable32, "{isa:?}, K = {k}, whiten = {whiten}");
            let cases = [(false, &s64, &ps64, 1e-12), (true, &s32, &ps32, 1e-5)];
            for (f32_state, got, want, bound) in cases.into_iter().filter(|c| c.0 || row_kernel_f64) {
                if lanes(isa, f32_state) == lanes(Isa::Portable, f32_state) {
                    assert_eq!(
                        (&got.s, &got.u, got.dsq_sum),
                        (&want.s, &want.u, want.dsq_sum),
                        "{isa:?}"
                    );
                } else {
                    assert!(max_rel(got.s.as_slice().unwrap(), want.s.as_slice().unwrap()) < bound);
                    assert!(max_rel(got.u.as_slice().unwrap(), want.u.as_slice().unwrap()) < bound);
                    assert!((got.dsq_sum - want.dsq_sum).abs() <= bound * want.dsq_sum);
                }
            }
            // float32 arithmetic against the float64-arithmetic block path on the same float32 state.
            assert!(
                max_rel(s32.s.as_slice().unwrap(), slow32.s.as_slice().unwrap()) < 1e-4,
                "S, K = {k}"
            );
            assert!(
                max_rel(s32.u.as_slice().unwrap(), slow32.u.as_slice().unwrap()) < 1e-4,
                "u, K = {k}"
            );
        }
    }
}

#[test]
fn failed_step_leaves_a_large_model_as_before_the_row() {
    // D·K > SNAPSHOT_MAX_ELEMENTS: no copy of the state is kept. A NaN B̄ makes the K×K step fail (H̄ is
    // not positive definite) after the pass, whatever the data; the D-sized state must be as before.
    // K = 20 runs the row kernel on AVX-512 and the wide pass elsewhere (f64 state, `row_kernel_max`).
    for (whiten, (d, k)) in [false, true]
        .into_iter()
        .flat_map(|w| [(w, (70_000, 4)), (w, (13_200, 20))])
    {
        assert!(d * k > SNAPSHOT_MAX_ELEMENTS);
        let f0 = orthonormal_loadings(d, k, 21).expect("init");
        let x = stream(10, d, 22);
        let cfg = EmConfig {
            n_warmup: 4,
            whiten,
            ..EmConfig::default()
        };
        let mut em = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
        em.update(x.slice(s![..7, ..])).expect("update");
        let healthy_b_bar = em.step.b_bar.clone();
        em.step.b_bar.fill(f64::NAN);
        let before = (em.mean(), em.loadings(), em.noise_variance(), em.step.n_seen);
        let twin = em.clone();
        assert!(matches!(
            em.update(x.slice(s![7..8, ..])),
            Err(FaError::NotPositiveDefinite(_))
        ));
        assert_eq!((em.mean(), em.loadings(), em.noise_variance(), em.step.n_seen), before);
        // Same future as the twin that never saw the row.
        let (mut em, mut twin) = (em, twin);
        em.step.b_bar.assign(&healthy_b_bar);
        twin.step.b_bar.assign(&healthy_b_bar);
        em.update(x.slice(s![8.., ..])).expect("update");
        twin.update(x.slice(s![8.., ..])).expect("update");
        assert_eq!(em, twin);
    }
}

#[test]
fn float32_state_stays_finite_or_refuses_the_batch() {
    // Two rows of float32-subnormal/tiny values make σ̂² tiny (ψ of the unseen features floored near 0);
    // then ±1e18 in three features (the float32 input limit) gives latent means near 1e38, whose rank-one
    // step d mᵀ overflowed the float32 Ā during warm-up (a pass that does not read Ā), leaving a state no
    // query and no checkpoint could use. The step must be refused and the model left as before the batch.
    let tiny: [[f64; 11]; 2] = [
        [
            3.1446194631882834e-24,
            -5.219789161783768e-21,
            -2.0333025516147277e-23,
            -1.9249777134276445e-40,
            1.3570949797327994e-27,
            1.401298464324817e-45,
            4.203895392974451e-45,
            2.4957222040761096e-24,
            -6.260587148044698e-21,
            7.294519632945647e-34,
            2.2858051693425515e-27,
        ],
        [
            -2.3554144405085283e-27,
            -2.6484540975739043e-43,
            -2.4102333586386854e-43,
            1.5193228274825748e-39,
            -2.0489046259768312e-36,
            -4.920514118526228e-27,
            3.9784032331729333e-35,
            1.906947206087177e-39,
            -2.4256476417462583e-41,
            -7.119977364454257e-33,
            -2.5409072627641856e-34,
        ],
    ];
    let big = 9.999999843067494e17; // 1e18 rounded to float32
    let mut huge = Array2::<f32>::zeros((2, 11));
    for (i, signs) in [[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0]].iter().enumerate() {
        for (j, &col) in [0usize, 4, 7].iter().enumerate() {
            huge[[i, col]] = (signs[j] * big) as f32;
        }
    }
    let tiny = Array2::from_shape_fn((2, 11), |(i, j)| tiny[i][j] as f32);
    let cfg = EmConfig {
        n_warmup: 3,
        whiten: true,
        step_size: StepSize::Power { tau0: 0.0, kappa: 0.9 },
        scaling: Scaling::Data,
        ..EmConfig::default()
    };
    let f0 = orthonormal_loadings(11, 2, 659).expect("init");
    let mut em = OnlineEm::<f32>::new(11, 2, f0.view(), cfg).expect("new");
    em.update(tiny.view()).expect("tiny rows are accepted");
    let before = em.clone();
    match em.update(huge.view()) {
        Ok(()) => {
            let a = em.current_a_bar();
            assert!(a.iter().all(|v| v.is_finite()) && em.a_bar.iter().all(|v| v.to_f64().is_finite()));
        }
        Err(err) => {
            assert!(matches!(err, FaError::Diverged(_)), "{err}");
            assert_eq!(em, before);
        }
    }
}

#[test]
fn local_sums_then_apply_equals_update() {
    for k in [3usize, 20] {
        let d = 300;
        let f0 = orthonormal_loadings(d, k, 31).expect("init");
        let x = stream(40, d, 32);
        let cfg = EmConfig {
            n_warmup: 25,
            whiten: k == 3,
            ..EmConfig::default()
        };
        let mut whole = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
        let mut split = whole.clone();
        whole.update(x.view()).expect("update");
        for row in x.rows() {
            let sums = split.local_sums(row).expect("sums");
            let again = split.local_sums(row).expect("idempotent");
            assert_eq!(sums, again);
            split.apply(&sums, d).expect("apply");
        }
        assert_eq!(whole, split);
    }
}

#[test]
fn invalid_hyper_parameters_are_rejected() {
    let f0 = Array2::<f64>::zeros((5, 2));
    assert!(OnlineEm::<f64>::new(5, 5, Array2::zeros((5, 5)).view(), EmConfig::default()).is_err());
    assert!(OnlineEm::<f64>::new(5, 0, Array2::zeros((5, 0)).view(), EmConfig::default()).is_err());
    assert!(OnlineEm::<f64>::new(6, 2, f0.view(), EmConfig::default()).is_err());
    let bad_floor = EmConfig {
        noise_floor: 0.0,
        ..EmConfig::default()
    };
    assert!(OnlineEm::<f64>::new(5, 2, f0.view(), bad_floor).is_err());
}

#[test]
fn whitening_is_a_change_of_latent_basis() {
    let (d, k) = (30, 3);
    let f0 = orthonormal_loadings(d, k, 8).expect("init");
    let x = stream(200, d, 9);
    let cfg = EmConfig {
        n_warmup: 50,
        ..EmConfig::default()
    };
    let mut plain = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
    plain.update(x.view()).expect("update");
    // Whiten the current statistics by hand: R Rᵀ = H̄, Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ, Σ ← R⁻¹ Σ R⁻ᵀ.
    let mut white = plain.clone();
    let h_bar = &white.step.sigma + &white.step.b_bar;
    let r = SpdFactor::new(h_bar.view(), "h").expect("spd").lower();
    let w = lower_triangular_inverse(r.view()).expect("inv").reversed_axes();
    let a = white.current_a_bar().dot(&w);
    white.a_bar = a.iter().copied().collect();
    white.layout.arrange(&mut white.a_bar, d, k);
    for i in 0..d {
        let adv = white.pending_moments(i);
        (white.mean[i], white.dsq_bar[i]) = (adv.mean.0, adv.dsq.0);
    }
    white.step.pending = None;
    white.step.basis = Basis::Whitened;
    white.step.b_bar = w.t().dot(&white.step.b_bar).dot(&w);
    white.step.sigma = w.t().dot(&white.step.sigma).dot(&w);
    // The expanded model's covariance F H̄ Fᵀ + Ψ is what the step preserves: F' = F R, so
    // F' F'ᵀ = F H̄ Fᵀ, and ψ = d̄² − rowsum(F ⊙ Ā) is unchanged; afterwards H̄ = I.
    let f = plain.loadings();
    let expanded = f.dot(&h_bar).dot(&f.t());
    let f_white = white.loadings();
    let whitened = f_white.dot(&f_white.t());
    let scale = expanded.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (p, q) in expanded.iter().zip(whitened.iter()) {
        assert!((p - q).abs() < 1e-10 * scale);
    }
    for (p, q) in plain.noise_variance().iter().zip(white.noise_variance().iter()) {
        assert!((p - q).abs() < 1e-10 * p.abs().max(1.0));
    }
    let h_after = &white.step.sigma + &white.step.b_bar;
    for ((i, j), v) in h_after.indexed_iter() {
        assert!((v - if i == j { 1.0 } else { 0.0 }).abs() < 1e-12);
    }
}

/// The same model with Ā stored packed and row-major: further updates on every code path (the 8-lane row
/// kernels reading either layout, the 4-lane ones and the wide kernel and block path on a rearranged block)
/// leave bit-identical models, checkpoints and fitted rows.
fn same_model_in_both_layouts<T: crate::state::StateReal>(k: usize, whiten: bool) {
    use crate::engine::packed::Layout;
    use crate::state::Checkpoint;
    let d = 517; // two blocks and a 5-row tail after the last group of 8
    let f0 = orthonormal_loadings(d, k, 13).expect("init");
    let x = stream(32, d, 14);
    let cfg = EmConfig {
        n_warmup: 10,
        whiten,
        ..EmConfig::default()
    };
    let fresh = |layout| {
        let mut em = OnlineEm::<T>::new(d, k, f0.view(), cfg.clone()).expect("new");
        em.layout = layout; // Ā is all zeros here, so no rearrangement is due
        em.update(x.slice(s![..20, ..])).expect("update");
        em
    };
    let (packed, rows) = (fresh(Layout::Packed), fresh(Layout::Rows));
    assert_eq!(packed.to_state(), rows.to_state(), "K = {k}");
    assert!(
        k == 1 || packed.a_bar != rows.a_bar,
        "the layouts differ in memory (K = {k})"
    );
    for isa in Isa::available() {
        let run = |model: &OnlineEm<T>| {
            let mut model = model.clone();
            model.isa = isa;
            model.update(x.slice(s![20.., ..])).expect("update");
            model
        };
        let (p, r) = (run(&packed), run(&rows));
        let what = format!("{isa:?}, K = {k}, whiten = {whiten}, {}", std::any::type_name::<T>());
        assert_eq!(p.to_state(), r.to_state(), "{what}");
        let (pc, pf, pp) = crate::query::rows_as::<f64, _>(&p).expect("rows");
        let (rc, rf, rp) = crate::query::rows_as::<f64, _>(&r).expect("rows");
        assert!(pc == rc && pf == rf && pp == rp, "fitted rows, {what}");
        let restored = OnlineEm::<T>::from_state(&p.to_state()).expect("restore");
        assert_eq!(restored.to_state(), p.to_state(), "{what}");
    }
}

#[test]
fn packed_and_row_major_a_bar_give_the_same_model() {
    for k in [1usize, 3, 10, 17, 24, 25] {
        for whiten in [false, true] {
            same_model_in_both_layouts::<f32>(k, whiten);
            same_model_in_both_layouts::<f64>(k, whiten);
        }
    }
}
