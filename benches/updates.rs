//! Criterion benchmarks of one streaming update: D ∈ {10⁴, 10⁵, 10⁶}, K ∈ {1, 10, 50}, online EM and SGA,
//! float64 and float32 state. Run with `cargo bench` (the D = 10⁶, K = 50 cases need ~1 GB).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::Array2;
use onlinefa::init::{fill_standard_normal, orthonormal_loadings};
use onlinefa::{EmConfig, OnlineEm, OnlineSga, Real, SgaConfig};

const SIZES: [usize; 3] = [10_000, 100_000, 1_000_000];
const COMPONENTS: [usize; 3] = [1, 10, 50];
const STREAM: usize = 4;

fn samples(d: usize) -> Array2<f64> {
    let mut x = Array2::zeros((STREAM, d));
    fill_standard_normal(x.view_mut(), 7);
    x
}

fn bench_em<T: Real>(c: &mut Criterion) {
    let mut group = c.benchmark_group(format!("online_em_{}", T::NAME));
    group.sample_size(10);
    for &d in &SIZES {
        let x = samples(d);
        for &k in &COMPONENTS {
            let Ok(f0) = orthonormal_loadings(d, k, 1) else {
                continue;
            };
            let cfg = EmConfig {
                n_warmup: 1,
                ..EmConfig::default()
            };
            let Ok(mut em) = OnlineEm::<T>::new(d, k, f0.view(), cfg) else {
                continue;
            };
            let _ = em.update(x.view());
            group.throughput(Throughput::Elements((d * k) as u64));
            group.bench_with_input(BenchmarkId::new(format!("K={k}"), d), &d, |b, _| {
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) % STREAM;
                    em.update(x.slice(ndarray::s![i..i + 1, ..]))
                })
            });
        }
    }
    group.finish();
}

fn bench_sga<T: Real>(c: &mut Criterion) {
    let mut group = c.benchmark_group(format!("online_sga_{}", T::NAME));
    group.sample_size(10);
    for &d in &SIZES {
        let x = samples(d);
        for &k in &COMPONENTS {
            let Ok(f0) = orthonormal_loadings(d, k, 1) else {
                continue;
            };
            let cfg = SgaConfig {
                n_warmup: 1,
                ..SgaConfig::default()
            };
            let Ok(mut sga) = OnlineSga::<T>::new(d, k, f0.view(), cfg) else {
                continue;
            };
            let _ = sga.update(x.view());
            group.throughput(Throughput::Elements((d * k) as u64));
            group.bench_with_input(BenchmarkId::new(format!("K={k}"), d), &d, |b, _| {
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) % STREAM;
                    sga.update(x.slice(ndarray::s![i..i + 1, ..]))
                })
            });
        }
    }
    group.finish();
}

fn all(c: &mut Criterion) {
    bench_em::<f64>(c);
    bench_em::<f32>(c);
    bench_sga::<f64>(c);
    bench_sga::<f32>(c);
}

criterion_group!(benches, all);
criterion_main!(benches);
