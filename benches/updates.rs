//! One streaming update of OnlineEM, OnlineSGA and VIFA against the measured memory floor, in one run.
//!
//! `cargo bench --bench updates` prints, for D ∈ {10⁵, 10⁶}, K ∈ {1, 10, 50}, float64 and float32 state, the
//! median time of one update after warm-up and its multiple of two floors measured in the same loop
//! (interleaved with the updates, so a loaded machine slows both alike):
//!
//! * **floor**: in-place read+write passes (v ← v · 1) over as many values of the state's type as the model's
//!   D-sized state: (K + 3)·D for EM and SGA (Ā or F, plus three D-vectors); for VIFA (c, F, β and Adam's two
//!   moment estimates of each) three passes over (K + 2)·D values, the same bytes in a third of the memory;
//! * **floor + x**: the same plus reading the float64 sample (EM, SGA) or gradient (VIFA), D values, which
//!   every update must also read.
//!
//! The floors run on the same rayon pool as the updates (chunks of the buffer in parallel), so on several
//! threads each ratio compares like with like; `RAYON_NUM_THREADS=1` measures both on one thread.
//!
//! `EM` and `SGA` are the models as `onlinefa.OnlineEM` and `onlinefa.OnlineSGA` build them by default
//! (whitened, data scaling; SGA's `lr="auto"`); `EM-PLAIN` is online EM without whitening (`whiten=False`) and
//! `SGA-GRADIENT` online SGA's constant-step gradient rule (Algorithm 1). A third floor, **arith**, counts their
//! multiply-adds per row: K² + K(K + 1)/2 for whitened EM (the pending step's K×K map of Ā and the upper
//! triangle of S = Σ z zᵀ/ψ), K(K + 1) without whitening (z = U a, U triangular, and S), K² + K(K + 1)/2 for
//! SGA's gradient rule (g = f P and S) and K(K + 1)/2 more for its whitened rule (f ← f L), and for VIFA (one
//! draw) K² + K(K + 1)/2 + 2K (Ψ⁻¹F (I + B)⁻¹, the upper triangle of B = Fᵀ Ψ⁻¹ F of the new values, F h of the
//! draw and g hᵀ of its gradient; the optimiser's element-wise work is not counted), 2·D flops each, at
//! this machine's matrix-product rate measured in the same run on the same pool (a 256×256 product of the
//! state's type per thread, `ndarray`'s `dot`); "× max" is the update over the larger of the memory and the
//! arithmetic floor. **peak-arith** counts the same flops at this CPU's multiply-add peak (every thread running
//! register-resident FMA chains, AVX-512 or AVX2), which no kernel can beat, so "× max (peak)" cannot
//! flatter where a library's matrix product runs below the peak. "CPU ms" is the process's CPU time per update (all threads), which a loaded machine
//! inflates less than the wall clock.
//!
//! A VIFA update is `sample()` (θ = F h + c + ψ^{1/2} ⊙ z) then `step(g)` with one draw (L = 1) and Adam.
//! Each model is built, measured and dropped before the next, so D = 10⁷ with K = 50 fits in memory.
//!
//! Options (after `--`): `--d 1000000 10000000`, `--k 10`, `--models EM EM-PLAIN SGA SGA-GRADIENT VIFA`, `--repeats 9`.
//! NumPy ratios for the same grid: `python benches/engine.py`.

use std::hint::black_box;
use std::time::Instant;

use ndarray::{Array1, Array2};
use onlinefa::init::{fill_standard_normal, orthonormal_loadings};
use onlinefa::vifa::{LearningRates, Optimizer, Vifa, VifaConfig, VifaInit};
use onlinefa::{EmConfig, OnlineEm, OnlineSga, Real, Scaling, SgaConfig, SgaRule};
use rayon::prelude::*;

struct Args {
    sizes: Vec<usize>,
    components: Vec<usize>,
    models: Vec<String>,
    repeats: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        sizes: vec![100_000, 1_000_000],
        components: vec![1, 10, 50],
        models: ["EM", "SGA", "VIFA"].map(String::from).to_vec(),
        repeats: 9,
    };
    let mut current = String::new();
    let mut seen: Vec<String> = Vec::new();
    for arg in std::env::args().skip(1) {
        if arg.starts_with("--") {
            current = arg;
            continue;
        }
        // The first value of a list option replaces its default.
        if !seen.contains(&current) {
            seen.push(current.clone());
            match current.as_str() {
                "--d" => args.sizes.clear(),
                "--k" => args.components.clear(),
                "--models" => args.models.clear(),
                _ => {}
            }
        }
        match (current.as_str(), arg.parse::<usize>()) {
            ("--d", Ok(v)) => args.sizes.push(v),
            ("--k", Ok(v)) => args.components.push(v),
            ("--repeats", Ok(v)) => args.repeats = v.max(1),
            ("--models", _) => args.models.push(arg.to_uppercase()),
            _ => {}
        }
    }
    args
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Seconds taken by `f`.
fn timed(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

/// CPU seconds used so far by this process, every thread (NaN where the clock is not available).
fn process_cpu_seconds() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    f64::NAN
}

/// Side of the square products that measure the matrix-product rate.
const GEMM_SIDE: usize = 256;

/// Flops per second of this machine's matrix products in `T` (f32 or f64) on the rayon pool: one
/// GEMM_SIDE² product per thread at once, the median of `repeats`.
fn gemm_rate<T: ndarray::LinalgScalar + Send + Sync>(repeats: usize) -> f64 {
    let threads = rayon::current_num_threads();
    let a = Array2::<T>::from_elem((GEMM_SIDE, GEMM_SIDE), T::one());
    let seconds = median(
        (0..repeats.max(3))
            .map(|_| {
                timed(|| {
                    (0..threads).into_par_iter().for_each(|_| {
                        black_box(a.dot(black_box(&a)));
                    })
                })
            })
            .collect(),
    );
    2.0 * (GEMM_SIDE as f64).powi(3) * threads as f64 / seconds
}

/// Independent multiply-add chains per thread: 12 vector registers, enough to keep two FMA ports busy through
/// the instruction's latency.
const FMA_CHAINS: usize = 12;

/// `iterations` rounds of acc ← acc·x + y on FMA_CHAINS independent vector registers of one instruction set
/// (`$vec` of `$lanes` lanes): no memory traffic, only multiply-adds. Returns the lanes' sum (kept observable).
macro_rules! fma_loop {
    ($name:ident, $features:literal, $t:ty, $vec:ty, $set1:ident, $fmadd:ident, $store:ident, $lanes:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        fn $name(iterations: usize, x: $t, y: $t) -> $t {
            use std::arch::x86_64::*;
            let (xv, yv) = ($set1(x), $set1(y));
            let mut acc: [$vec; FMA_CHAINS] = [$set1(0.0); FMA_CHAINS];
            for _ in 0..iterations {
                for a in acc.iter_mut() {
                    *a = $fmadd(*a, xv, yv);
                }
            }
            let mut lanes = [0.0 as $t; $lanes];
            let mut total = 0.0;
            for a in acc {
                // SAFETY: `lanes` holds exactly one vector of this type.
                unsafe { $store(lanes.as_mut_ptr(), a) };
                total += lanes.iter().sum::<$t>();
            }
            total
        }
    };
}
fma_loop!(
    fma_f64_avx512,
    "avx512f",
    f64,
    __m512d,
    _mm512_set1_pd,
    _mm512_fmadd_pd,
    _mm512_storeu_pd,
    8
);
fma_loop!(
    fma_f32_avx512,
    "avx512f",
    f32,
    __m512,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_storeu_ps,
    16
);
fma_loop!(
    fma_f64_avx2,
    "avx2,fma",
    f64,
    __m256d,
    _mm256_set1_pd,
    _mm256_fmadd_pd,
    _mm256_storeu_pd,
    4
);
fma_loop!(
    fma_f32_avx2,
    "avx2,fma",
    f32,
    __m256,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_storeu_ps,
    8
);

/// Multiply-add rounds of one rate measurement (FMA_CHAINS vectors · lanes · 2 flops each round).
const FMA_ROUNDS: usize = 4_000_000;

/// Flops per second of this CPU's fused multiply-adds in float64 and float32 on the rayon pool (every thread at
/// once, the median of `repeats`): the arithmetic ceiling no kernel can pass, so an arithmetic floor at this
/// rate cannot flatter. NaN where neither AVX-512 nor AVX2 with FMA is available.
fn fma_peak(repeats: usize) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma");
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if !(avx512 || avx2) {
            return (f64::NAN, f64::NAN);
        }
        let threads = rayon::current_num_threads();
        let rate = |run: &(dyn Fn() + Sync), lanes: usize| {
            let seconds = median(
                (0..repeats.max(3))
                    .map(|_| timed(|| (0..threads).into_par_iter().for_each(|_| run())))
                    .collect(),
            );
            2.0 * (FMA_ROUNDS * FMA_CHAINS * lanes * threads) as f64 / seconds
        };
        // SAFETY: each function is called only where the CPU has the features it was compiled for.
        let f64_run = move || {
            let out = if avx512 {
                unsafe { fma_f64_avx512(FMA_ROUNDS, black_box(0.999), black_box(1e-3)) }
            } else {
                unsafe { fma_f64_avx2(FMA_ROUNDS, black_box(0.999), black_box(1e-3)) }
            };
            black_box(out);
        };
        let f32_run = move || {
            let out = if avx512 {
                unsafe { fma_f32_avx512(FMA_ROUNDS, black_box(0.999), black_box(1e-3)) }
            } else {
                unsafe { fma_f32_avx2(FMA_ROUNDS, black_box(0.999), black_box(1e-3)) }
            };
            black_box(out);
        };
        let (lanes64, lanes32) = if avx512 { (8, 16) } else { (4, 8) };
        (rate(&f64_run, lanes64), rate(&f32_run, lanes32))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = repeats;
        (f64::NAN, f64::NAN)
    }
}

/// One standard-normal D-vector per `seed` (a 1×D row).
fn normal_row(d: usize, seed: u64) -> Array2<f64> {
    let mut x = Array2::zeros((1, d));
    fill_standard_normal(x.view_mut(), seed);
    x
}

/// The memory floor of a model: `passes` in-place read+write passes over `values` values of type T, and
/// the same plus reading a float64 D-vector.
struct Floor<T> {
    buf: Vec<T>,
    passes: usize,
}

impl<T: Real> Floor<T> {
    fn new(values: usize, passes: usize) -> Self {
        Floor {
            buf: vec![T::from_f64(1.0); values],
            passes,
        }
    }

    /// buf ← buf · 1, `passes` times, in chunks on the rayon pool the models use.
    fn pass(&mut self) {
        let c = black_box(T::from_f64(1.0));
        for _ in 0..self.passes {
            self.buf.par_chunks_mut(FLOOR_CHUNK).for_each(|chunk| {
                for v in chunk.iter_mut() {
                    *v = *v * c;
                }
            });
            black_box(&mut self.buf);
        }
    }

    /// Seconds of (floor, floor + reading x).
    fn time(&mut self, x: &[f64]) -> (f64, f64) {
        let floor = timed(|| self.pass());
        let floor_x = timed(|| {
            self.pass();
            black_box(read(x));
        });
        (floor, floor_x)
    }
}

/// Values per parallel task of the floors: large enough that scheduling costs nothing, small enough to spread.
const FLOOR_CHUNK: usize = 1 << 16;

/// Σ x, chunks on the rayon pool, each with eight independent partial sums (limited by memory, not by the
/// latency of one chain of additions).
fn read(x: &[f64]) -> f64 {
    x.par_chunks(FLOOR_CHUNK).map(read_chunk).sum()
}

/// Σ x with eight independent partial sums.
fn read_chunk(x: &[f64]) -> f64 {
    let mut acc = [0.0; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for (a, v) in acc.iter_mut().zip(chunk) {
            *a += v;
        }
    }
    acc.iter().sum::<f64>() + chunks.remainder().iter().sum::<f64>()
}

/// Medians (seconds) of: floor, floor + x, one update (wall clock), one update (process CPU time).
/// `update(i)` runs update i (after warm-up).
fn interleaved<T: Real>(floor: &mut Floor<T>, x: &[f64], repeats: usize, mut update: impl FnMut(usize)) -> [f64; 4] {
    let mut times: [Vec<f64>; 4] = Default::default();
    for i in 0..repeats {
        let (f, fx) = floor.time(x);
        times[0].push(f);
        times[1].push(fx);
        let cpu = process_cpu_seconds();
        times[2].push(timed(|| update(i)));
        times[3].push(process_cpu_seconds() - cpu);
    }
    times.map(median)
}

/// One update of a streaming model with one sample (a 1×D matrix).
type UpdateFn = Box<dyn FnMut(&Array2<f64>)>;

/// An OnlineEM or OnlineSGA after warm-up (K + 3 samples), one fresh sample per timed update.
fn measure_stream<T: Real>(model: &str, d: usize, k: usize, repeats: usize) -> [f64; 4] {
    let f0 = orthonormal_loadings(d, k, 1).expect("init");
    let warm = k + 3;
    let mut update: UpdateFn = if model.starts_with("EM") {
        // The Python class's defaults (whitened, data scaling); `EM-PLAIN` without whitening.
        let config = EmConfig {
            n_warmup: k as u64 + 2,
            whiten: model == "EM",
            scaling: Scaling::Data,
            shrink: true,
            ..EmConfig::default()
        };
        let mut em = OnlineEm::<T>::new(d, k, f0.view(), config).expect("em");
        Box::new(move |x| em.update(x.view()).expect("em update"))
    } else {
        // The Python class's default step (`lr="auto"`: the whitened rule, data scaling); `SGA-GRADIENT` the
        // constant-step gradient rule of Algorithm 1.
        let config = SgaConfig {
            n_warmup: k as u64 + 2,
            rule: if model == "SGA" {
                SgaRule::Whitened
            } else {
                SgaRule::Gradient
            },
            scaling: if model == "SGA" { Scaling::Data } else { Scaling::Unit },
            ..SgaConfig::default()
        };
        let mut sga = OnlineSga::<T>::new(d, k, f0.view(), config).expect("sga");
        Box::new(move |x| sga.update(x.view()).expect("sga update"))
    };
    drop(f0);
    for i in 0..warm {
        update(&normal_row(d, 100 + i as u64));
    }
    let samples: Vec<Array2<f64>> = (0..repeats).map(|i| normal_row(d, 1000 + i as u64)).collect();
    let mut floor = Floor::<T>::new((k + 3) * d, 1);
    let x0 = samples[0].as_slice().expect("contiguous");
    interleaved(&mut floor, x0, repeats, |i| update(&samples[i]))
}

/// VIFA with Adam and L = 1 after one iteration; a timed update is `sample()` then `step(g)`.
fn measure_vifa<T: Real>(d: usize, k: usize, repeats: usize) -> [f64; 4] {
    let f0 = orthonormal_loadings(d, k, 1).expect("init");
    let init = VifaInit {
        loadings: f0.view(),
        mean: None,
        noise_variance: None,
    };
    let config = VifaConfig {
        prior_precision: 1e-2,
        lr: LearningRates {
            mean: 1e-3,
            loadings: 1e-3,
            log_noise: 1e-3,
        },
        optimizer: Optimizer::Adam,
        n_grad_samples: 1,
        clip_grad_norm: None,
    };
    let mut vi = Vifa::<T>::new(d, k, init, 0, config).expect("vifa");
    drop(f0);
    let g: Array1<f64> = normal_row(d, 7).row(0).mapv(|v| 1e-3 * v);
    let g2 = g.view().insert_axis(ndarray::Axis(0));
    let mut iteration = || {
        black_box(vi.sample().expect("sample"));
        vi.step(g2).expect("step");
    };
    iteration();
    let mut floor = Floor::<T>::new((k + 2) * d, 3);
    interleaved(&mut floor, g.as_slice().expect("contiguous"), repeats, |_| iteration())
}

fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn main() {
    let args = parse_args();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "# one update vs the memory floor — {threads} hardware threads, load average at start: {}",
        load_average()
    );
    let rates = (gemm_rate::<f64>(args.repeats), gemm_rate::<f32>(args.repeats));
    let peaks = fma_peak(args.repeats);
    println!(
        "# on {} rayon threads: matrix-product rate float64 {:.1} GFLOP/s, float32 {:.1} GFLOP/s; \
         multiply-add peak float64 {:.1} GFLOP/s, float32 {:.1} GFLOP/s",
        rayon::current_num_threads(),
        rates.0 * 1e-9,
        rates.1 * 1e-9,
        peaks.0 * 1e-9,
        peaks.1 * 1e-9
    );
    println!();
    println!(
        "| model | D | K | state | ms/update | CPU ms | floor ms | × floor | floor + x ms | × (floor + x) | arith ms | \
         × max | peak-arith ms | × max (peak) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &d in &args.sizes {
        for &k in args.components.iter().filter(|&&k| k < d) {
            for model in &args.models {
                row::<f64>(model, d, k, args.repeats, (rates.0, peaks.0));
                row::<f32>(model, d, k, args.repeats, (rates.1, peaks.1));
            }
        }
    }
    println!("\nload average at end: {}", load_average());
}

/// Seconds of a model's per-row K-sized arithmetic at `rate` flops/s, 2·D times the multiply-adds per row of the
/// module documentation.
fn arithmetic_floor(model: &str, d: usize, k: usize, rate: f64) -> Option<f64> {
    let per_row = match model {
        "EM" | "SGA-GRADIENT" => k * k + k * (k + 1) / 2,
        "EM-PLAIN" => k * (k + 1),
        "SGA" => k * k + k * (k + 1),
        "VIFA" => k * k + k * (k + 1) / 2 + 2 * k,
        _ => return None,
    };
    Some(2.0 * d as f64 * per_row as f64 / rate)
}

fn row<T: Real>(model: &str, d: usize, k: usize, repeats: usize, (rate, peak): (f64, f64)) {
    let [floor, floor_x, t, cpu] = match model {
        "EM" | "EM-PLAIN" | "SGA" | "SGA-GRADIENT" => measure_stream::<T>(model, d, k, repeats),
        "VIFA" => measure_vifa::<T>(d, k, repeats),
        other => panic!("unknown model {other:?} (EM, EM-PLAIN, SGA, SGA-GRADIENT or VIFA)"),
    };
    let against = |rate: f64| match arithmetic_floor(model, d, k, rate).filter(|a| a.is_finite()) {
        Some(a) => (format!("{:.2}", a * 1e3), format!("{:.2}×", t / a.max(floor))),
        None => ("–".into(), "–".into()),
    };
    let ((arith_ms, over_max), (peak_ms, over_peak)) = (against(rate), against(peak));
    println!(
        "| {model} | {d} | {k} | {} | {:.2} | {:.2} | {:.2} | {:.2}× | {:.2} | {:.2}× | {arith_ms} | {over_max} | \
         {peak_ms} | {over_peak} |",
        T::NAME,
        t * 1e3,
        cpu * 1e3,
        floor * 1e3,
        t / floor,
        floor_x * 1e3,
        t / floor_x
    );
}
