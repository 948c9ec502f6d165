//! The models driven part by part through [`StreamingModel`] (local sums of each part added, then applied to
//! every part) equal the whole model: the contract the sharded models build on. These tests live beside the
//! models, not in the engine, which names no model.

use crate::engine::{StepSums, StreamingModel};
use crate::init::{fill_standard_normal, orthonormal_loadings};
use crate::{EmConfig, OnlineEm, OnlineSga, Scaling, SgaConfig};
use ndarray::{s, Array2, ArrayView2, Axis};

/// Run `x` through two parts (rows ..split and split..) with local sums added and applied to both, and
/// through `whole` with `update`; return the largest relative difference of the per-row fields of `state`
/// (each field's parts concatenated, relative to the field's largest entry).
fn split_vs_whole<M: StreamingModel + Clone>(
    make: impl Fn(ArrayView2<f64>) -> M,
    update: impl Fn(&mut M, ArrayView2<f64>),
    state: impl Fn(&M) -> [Vec<f64>; 3],
    f0: &Array2<f64>,
    x: &Array2<f64>,
    split: usize,
) -> f64 {
    let d = f0.nrows();
    let mut whole = make(f0.view());
    update(&mut whole, x.view());
    let mut parts = [make(f0.slice(s![..split, ..])), make(f0.slice(s![split.., ..]))];
    for row in x.rows() {
        let rows = [row.slice(s![..split]), row.slice(s![split..])];
        let sums: Vec<StepSums> = parts
            .iter_mut()
            .zip(rows)
            .map(|(p, r)| p.local_sums(r).expect("sums"))
            .collect();
        let total = StepSums {
            s: &sums[0].s + &sums[1].s,
            u: &sums[0].u + &sums[1].u,
            dsq_sum: sums[0].dsq_sum + sums[1].dsq_sum,
        };
        for p in parts.iter_mut() {
            p.apply(&total, d).expect("apply");
        }
    }
    let (a, b) = (state(&whole), state(&parts[0]));
    let c = state(&parts[1]);
    let mut worst = 0.0f64;
    for (whole_field, (p0, p1)) in a.iter().zip(b.iter().zip(&c)) {
        let scale = whole_field.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (p, q) in whole_field.iter().zip(p0.iter().chain(p1)) {
            worst = worst.max((p - q).abs() / scale);
        }
    }
    worst
}

#[test]
fn parts_through_the_trait_equal_the_whole_model() {
    let (d, k, split) = (90, 4, 37);
    let f0 = orthonormal_loadings(d, k, 1).expect("init");
    let mut x = Array2::zeros((30, d));
    fill_standard_normal(x.view_mut(), 2);
    x.slice_mut(s![.., ..10]).mapv_inplace(|v| 3.0 * v + 1.0);
    for scaling in [Scaling::Unit, Scaling::Data] {
        let em = EmConfig {
            n_warmup: 8,
            scaling,
            ..EmConfig::default()
        };
        let em_state = |m: &OnlineEm<f64>| {
            let f = m.loadings();
            [
                f.iter().copied().collect(),
                m.noise_variance().to_vec(),
                m.mean().to_vec(),
            ]
        };
        let make_em = |f: ArrayView2<f64>| OnlineEm::<f64>::new(f.nrows(), k, f, em.clone()).expect("new");
        let upd_em = |m: &mut OnlineEm<f64>, x: ArrayView2<f64>| m.update(x).expect("update");
        let e = split_vs_whole(make_em, upd_em, em_state, &f0, &x, split);
        assert!(e < 1e-12, "EM {scaling:?}: {e}");
        let sga = SgaConfig {
            n_warmup: 8,
            lr: 0.02,
            scaling,
            ..SgaConfig::default()
        };
        let sga_state = |m: &OnlineSga<f64>| {
            let f = m.loadings();
            [
                f.iter().copied().collect(),
                m.noise_variance().to_vec(),
                m.mean().to_vec(),
            ]
        };
        let make_sga = |f: ArrayView2<f64>| OnlineSga::<f64>::new(f.nrows(), k, f, sga.clone()).expect("new");
        let upd_sga = |m: &mut OnlineSga<f64>, x: ArrayView2<f64>| {
            for row in x.rows() {
                m.update(row.insert_axis(Axis(0))).expect("update");
            }
        };
        let e = split_vs_whole(make_sga, upd_sga, sga_state, &f0, &x, split);
        assert!(e < 1e-12, "SGA {scaling:?}: {e}");
    }
}
