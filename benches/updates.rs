//! One streaming update of OnlineEM and OnlineSGA against the measured memory floor, in one run.
//!
//! `cargo bench` prints, for D ∈ {10⁵, 10⁶}, K ∈ {1, 10, 50}, float64 and float32 state, the median time of one
//! update after warm-up and its multiple of two floors measured in the same loop (interleaved with the
//! updates, so a loaded machine slows both alike):
//!
//! * **floor**: one in-place read+write pass over (K + 3)·D values of the state's type, as many bytes as either
//!   model's D-sized state (Ā or F, plus three D-vectors);
//! * **floor + x**: the same plus reading the float64 sample (D values), which every update must also do.
//!
//! Options (after `--`): `--d 1000000 10000000`, `--k 10`, `--repeats 9`. NumPy ratios: `benches/compare.py`.

use std::hint::black_box;
use std::time::Instant;

use ndarray::{s, Array2};
use onlinefa::init::{fill_standard_normal, orthonormal_loadings};
use onlinefa::{EmConfig, OnlineEm, OnlineSga, Real, SgaConfig};

struct Args {
    sizes: Vec<usize>,
    components: Vec<usize>,
    repeats: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        sizes: vec![100_000, 1_000_000],
        components: vec![1, 10, 50],
        repeats: 9,
    };
    let mut current: Option<String> = None;
    for arg in std::env::args().skip(1) {
        if arg.starts_with("--") {
            if matches!(arg.as_str(), "--d" | "--k") {
                match arg.as_str() {
                    "--d" => args.sizes.clear(),
                    _ => args.components.clear(),
                }
            }
            current = Some(arg);
            continue;
        }
        let Ok(value) = arg.parse::<usize>() else { continue };
        match current.as_deref() {
            Some("--d") => args.sizes.push(value),
            Some("--k") => args.components.push(value),
            Some("--repeats") => args.repeats = value.max(1),
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

/// One in-place read+write pass over `buf`: buf ← buf · c.
fn floor_pass<T: Real>(buf: &mut [T], c: T) {
    for v in buf.iter_mut() {
        *v = *v * c;
    }
    black_box(buf);
}

/// Reading the sample: Σ x.
fn read_x(x: &[f64]) -> f64 {
    x.iter().fold(0.0, |acc, v| acc + v)
}

/// Medians (seconds) of: floor, floor + x, one EM update, one SGA update.
fn measure<T: Real>(d: usize, k: usize, x: &Array2<f64>, repeats: usize) -> [f64; 4] {
    let warm = k + 3;
    let f0 = orthonormal_loadings(d, k, 1).expect("init");
    let mut em = OnlineEm::<T>::new(
        d,
        k,
        f0.view(),
        EmConfig {
            n_warmup: k as u64 + 2,
            ..EmConfig::default()
        },
    )
    .expect("em");
    let mut sga = OnlineSga::<T>::new(
        d,
        k,
        f0.view(),
        SgaConfig {
            n_warmup: k as u64 + 2,
            ..SgaConfig::default()
        },
    )
    .expect("sga");
    em.update(x.slice(s![..warm, ..])).expect("update");
    sga.update(x.slice(s![..warm, ..])).expect("update");
    let mut buf = vec![T::from_f64(1.0); (k + 3) * d];
    let c = black_box(T::from_f64(1.0));
    let mut times: [Vec<f64>; 4] = Default::default();
    for i in 0..repeats {
        let row = x.slice(s![warm + i..warm + i + 1, ..]);
        let x_row = x.row(warm + i);
        let x_flat = x_row.as_slice().expect("rows are contiguous");
        times[0].push(timed(|| floor_pass(&mut buf, c)));
        times[1].push(timed(|| {
            floor_pass(&mut buf, c);
            black_box(read_x(x_flat));
        }));
        times[2].push(timed(|| em.update(row).expect("em update")));
        times[3].push(timed(|| sga.update(row).expect("sga update")));
    }
    times.map(median)
}

fn main() {
    let args = parse_args();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# one update vs the memory floor — {threads} hardware threads, load average at start: {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!();
    println!("| model | D | K | state | ms/update | floor ms | × floor | floor + x ms | × (floor + x) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &d in &args.sizes {
        let mut x = Array2::zeros((args.components.iter().max().copied().unwrap_or(1) + 3 + args.repeats, d));
        fill_standard_normal(x.view_mut(), 7);
        for &k in &args.components {
            if k >= d {
                continue;
            }
            for_dtype::<f64>(d, k, &x, args.repeats);
            for_dtype::<f32>(d, k, &x, args.repeats);
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\nload average at end: {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
}

fn for_dtype<T: Real>(d: usize, k: usize, x: &Array2<f64>, repeats: usize) {
    let [floor, floor_x, em, sga] = measure::<T>(d, k, x, repeats);
    for (name, t) in [("EM", em), ("SGA", sga)] {
        println!(
            "| {name} | {d} | {k} | {} | {:.2} | {:.2} | {:.2}× | {:.2} | {:.2}× |",
            T::NAME,
            t * 1e3,
            floor * 1e3,
            t / floor,
            floor_x * 1e3,
            t / floor_x
        );
    }
}
