//! The fitted rows of an online-EM model for the queries, eight rows at a time: each group's Ā read from the
//! stored layout straight into lane arrays (one array of eight rows per column), the pending line 12 of
//! Algorithm 2 and the basis change applied, ψ formed, and the reporting map R applied, in one pass over the
//! group. Every value is computed by the same operations in the same order as the block path
//! (`apply_pending`, `block_times`, `row_dots` and `query::map_visited_rows`), so both give the same bits;
//! the lanes let one vector instruction serve eight rows, and each K×K product sums four output columns side
//! by side, where the block path's products run one row at a time. It serves K ≤ [`LANES_MAX_K`], where it
//! measured faster.
//!
//! Per row d (thesis names; a = Ā_d, d_prev the previous sample's d, m and ρ the pending step):
//! a ← (a + ρ (d_prev m − a)) W, rounded to the storage type (line 12, then the whitening W when pending);
//! F_d = a H̄⁻¹ (a when whitened); ψ_d = max(d̄²_d − F_d · a, floor) (4.35);
//! reported F'_d = F_d R and ψ'_d = ψ_d + max(‖F_d‖² − ‖F'_d‖², 0).

use crate::engine::em_kernel::{row_kernel_max, Isa};
use crate::engine::lane_times::lanes_times_blocked;
use crate::engine::packed::{Layout, PACK};
use crate::scalar::{stored, Real};

use super::OnlineEm;

/// Rows per group (lanes per array).
const W: usize = PACK;

/// The pending line 12 of Algorithm 2: m (K), ρ, and the whitening map W (K×K) if the step whitened.
pub(super) type PendingStep<'a> = (&'a [f64], f64, Option<&'a [f64]>);

/// The K×K maps of one query pass, row-major (K² values each), and the noise floor.
pub(super) struct LaneMaps<'a> {
    /// The pending line 12, if one is pending.
    pub pending: Option<PendingStep<'a>>,
    /// H̄⁻¹ when the basis is not whitened (F = Ā H̄⁻¹), else None (F = Ā).
    pub basis: Option<&'a [f64]>,
    /// The reporting map R, if the rows are reported mapped.
    pub report: Option<&'a [f64]>,
    pub floor: f64,
}

/// One block's outputs: mean (nb), F (nb×K row-major) and ψ (nb).
pub(super) struct LaneBlock<'a> {
    pub mean: &'a mut [f64],
    pub f: &'a mut [f64],
    pub psi: &'a mut [f64],
}

/// Largest K the lane path serves: measured against the block path on one thread at D = 2·10⁶ (AMD EPYC,
/// AVX-512), it took 0.7–0.9× the block path's time at K = 4 and 10 and 1.0–1.2× at K = 16 and 20, where the
/// block path's per-row products keep their K sums in registers as well.
const LANES_MAX_K: usize = 12;

/// Whether the lane path serves a K-factor model: K up to [`LANES_MAX_K`], where the block path's products run
/// the unrolled row loop (`block_times` below the wide kernels' K), so that both round alike.
pub(super) fn lanes_apply(k: usize) -> bool {
    (1..=row_kernel_max::<f64>(Isa::detect()).min(LANES_MAX_K)).contains(&k)
}

/// Fill `out` with the fitted (and mapped) rows `first..first + nb` of `model` (K = `K`, which
/// [`lanes_apply`] accepts), on the model's code path (the same operations on every path).
pub(super) fn fill_block<T: Real, const K: usize>(
    model: &OnlineEm<T>,
    first: usize,
    maps: &LaneMaps<'_>,
    out: LaneBlock<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        match model.isa {
            // SAFETY: a model's code path is one this CPU has (Isa::available checked it).
            Isa::Avx512 => return unsafe { fill_block_avx512::<T, K>(model, first, maps, out) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { fill_block_avx2::<T, K>(model, first, maps, out) },
            Isa::Portable => {}
        }
    }
    fill_block_lanes::<T, K>(model, first, maps, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
unsafe fn fill_block_avx512<T: Real, const K: usize>(
    m: &OnlineEm<T>,
    first: usize,
    maps: &LaneMaps<'_>,
    out: LaneBlock<'_>,
) {
    fill_block_lanes::<T, K>(m, first, maps, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_block_avx2<T: Real, const K: usize>(
    m: &OnlineEm<T>,
    first: usize,
    maps: &LaneMaps<'_>,
    out: LaneBlock<'_>,
) {
    fill_block_lanes::<T, K>(m, first, maps, out)
}

#[inline(always)]
fn fill_block_lanes<T: Real, const K: usize>(
    model: &OnlineEm<T>,
    first: usize,
    maps: &LaneMaps<'_>,
    out: LaneBlock<'_>,
) {
    let nb = out.psi.len();
    // Three lane buffers, reused by every group; each product writes into another one (nothing moved by value).
    let mut bufs = [[[0.0f64; W]; K]; 3];
    for lo in (0..nb).step_by(W) {
        let n = (nb - lo).min(W);
        let (mut dsq, mut d_prev) = ([0.0f64; W], [0.0f64; W]);
        for l in 0..n {
            let moments = model.pending_moments(first + lo + l);
            (out.mean[lo + l], dsq[l], d_prev[l]) = (moments.mean.1, moments.dsq.1, moments.d);
        }
        let [x, y, z] = &mut bufs;
        let (a, other) = match group_rows::<T, K>(model, first + lo, n, maps, &d_prev, x, y) {
            true => (&*y, x),
            false => (&*x, y),
        };
        let f = match maps.basis {
            Some(h_inv) => {
                lanes_times_blocked::<f64, K, W>(a, h_inv, other);
                &*other
            }
            None => a,
        };
        let mut psi = [0.0f64; W];
        let dots = lane_dots::<K>(f, a);
        for l in 0..W {
            psi[l] = (dsq[l] - dots[l]).max(maps.floor);
        }
        let f = match maps.report {
            Some(r) => {
                lanes_times_blocked::<f64, K, W>(f, r, z);
                // ‖F‖²: when F = Ā it is ψ's dot product already (the same products in the same order).
                let before = if maps.basis.is_none() {
                    dots
                } else {
                    lane_dots::<K>(f, f)
                };
                let after = lane_dots::<K>(z, z);
                for l in 0..W {
                    psi[l] += (before[l] - after[l]).max(0.0);
                }
                &*z
            }
            None => f,
        };
        for l in 0..n {
            let row = &mut out.f[(lo + l) * K..(lo + l + 1) * K];
            for (j, v) in row.iter_mut().enumerate() {
                *v = f[j][l];
            }
            out.psi[lo + l] = psi[l];
        }
    }
}

/// Ā of rows `row0..row0 + n` (n ≤ W; the other lanes zero) with the pending line 12 applied and rounded to
/// the storage type, as K lane arrays: in `x`, or in `y` when the whitening product moved it there (true).
#[inline(always)]
fn group_rows<T: Real, const K: usize>(
    model: &OnlineEm<T>,
    row0: usize,
    n: usize,
    maps: &LaneMaps<'_>,
    d_prev: &[f64; W],
    x: &mut [[f64; W]; K],
    y: &mut [[f64; W]; K],
) -> bool {
    let (stored_a, d) = (&model.a_bar, model.n_features);
    let packed_group = model.layout == Layout::Packed && row0.is_multiple_of(W) && row0 + W <= d / W * W;
    if packed_group {
        // A full packed group: column j's eight rows are contiguous.
        let base = row0 * K;
        for (j, lanes) in x.iter_mut().enumerate() {
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = stored_a[base + j * W + l].to_f64();
            }
        }
    } else {
        for (j, lanes) in x.iter_mut().enumerate() {
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = if l < n {
                    stored_a[stored_index(model.layout, row0 + l, j, K, d)].to_f64()
                } else {
                    0.0
                };
            }
        }
    }
    let Some((m, rho, whiten)) = maps.pending else {
        return false;
    };
    for (lanes, &m_j) in x.iter_mut().zip(m) {
        for (v, &d) in lanes.iter_mut().zip(d_prev) {
            *v += rho * (d * m_j - *v);
        }
    }
    let a = match whiten {
        Some(w) => {
            lanes_times_blocked::<f64, K, W>(x, w, y);
            y
        }
        None => x,
    };
    for lanes in a.iter_mut() {
        for v in lanes.iter_mut() {
            *v = stored::<T>(*v).1;
        }
    }
    whiten.is_some()
}

/// Position of (row, column) in a stored Ā of `d` rows (the rule of `engine::packed`).
#[inline(always)]
fn stored_index(layout: Layout, row: usize, col: usize, k: usize, d: usize) -> usize {
    match layout {
        Layout::Packed if row < d / W * W => row / W * W * k + col * W + row % W,
        _ => row * k + col,
    }
}

/// Σ_j x_j y_j per lane, j ascending from 0 (the order of `row_dots`).
#[inline(always)]
fn lane_dots<const K: usize>(x: &[[f64; W]; K], y: &[[f64; W]; K]) -> [f64; W] {
    let mut acc = [0.0f64; W];
    for (xj, yj) in x.iter().zip(y) {
        for l in 0..W {
            acc[l] += xj[l] * yj[l];
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use ndarray::{s, Array2, ArrayView2};

    use super::*;
    use crate::init::{fill_standard_normal, orthonormal_loadings};
    use crate::online_em::EmConfig;
    use crate::query::{rows_as, GaussianRows, RowVisitor};
    use crate::shrinkage::Reported;
    use crate::state::{Checkpoint, StateReal};

    /// A model read through the block path only.
    struct BlockPath<'a, T: Real>(&'a OnlineEm<T>);

    impl<T: Real> GaussianRows for BlockPath<'_, T> {
        fn dims(&self) -> (usize, usize) {
            self.0.dims()
        }
        fn visit_range(&self, rows: std::ops::Range<usize>, visit: &mut RowVisitor<'_>) -> crate::error::Result<()> {
            self.0.visit_block_rows(rows, visit)
        }
    }

    /// Every (first row, mean, F, ψ) value a visit of `rows` gives, in order.
    fn visited(model: &dyn GaussianRows, rows: std::ops::Range<usize>, map: Option<ArrayView2<f64>>) -> Vec<u64> {
        let mut out = Vec::new();
        let mut record = |lo: usize, mean: &[f64], f: &[f64], psi: &[f64]| {
            out.push(lo as u64);
            out.extend(mean.iter().chain(f).chain(psi).map(|v| v.to_bits()));
            Ok(())
        };
        match map {
            Some(map) => model.visit_range_mapped(rows, map, &mut record),
            None => model.visit_range(rows, &mut record),
        }
        .expect("visit");
        out
    }

    /// A fitted model (D = 517: a tail after the last group of 8) in `layout`, with a pending step.
    fn fitted<T: StateReal>(k: usize, whiten: bool, layout: Layout) -> OnlineEm<T> {
        let d = 517;
        let f0 = orthonormal_loadings(d, k, 3).expect("init");
        let mut x = Array2::zeros((30, d));
        fill_standard_normal(x.view_mut(), 4);
        for (j, mut col) in x.columns_mut().into_iter().enumerate() {
            col.mapv_inplace(|v| v * (1.0 + (j % 7) as f64) + j as f64);
        }
        let cfg = EmConfig {
            n_warmup: 10,
            whiten,
            ..EmConfig::default()
        };
        let mut em = OnlineEm::<T>::new(d, k, f0.view(), cfg).expect("new");
        em.layout = layout; // Ā is all zeros here, so no rearrangement is due
        em.update(x.slice(s![..25, ..])).expect("update");
        em
    }

    fn lane_rows_equal_block_rows<T: StateReal>(k: usize, whiten: bool, layout: Layout) {
        let model = fitted::<T>(k, whiten, layout);
        let restored = OnlineEm::<T>::from_state(&model.to_state()).expect("restore");
        let mut map = Array2::zeros((k, k));
        fill_standard_normal(map.view_mut(), 5);
        let what = format!("K = {k}, whiten = {whiten}, {layout:?}, {}", std::any::type_name::<T>());
        let on_each_path = Isa::available().into_iter().flat_map(|isa| {
            [&model, &restored].map(|m| {
                let mut m = m.clone();
                m.isa = isa;
                m
            })
        });
        for m in on_each_path {
            let (m, what) = (&m, format!("{what}, {:?}", m.isa));
            assert!(m.step.pending.is_some(), "{what}");
            let block = BlockPath(m);
            for rows in [0..517, 3..517, 8..300, 512..517] {
                let got = visited(m, rows.clone(), None);
                assert_eq!(got, visited(&block, rows.clone(), None), "{what}, {rows:?}");
                let got = visited(m, rows.clone(), Some(map.view()));
                assert_eq!(
                    got,
                    visited(&block, rows.clone(), Some(map.view())),
                    "mapped, {what}, {rows:?}"
                );
            }
            let lanes = rows_as::<f64, _>(&Reported::new(m, Some(map.clone())).expect("reported")).expect("rows");
            let blocks = rows_as::<f64, _>(&Reported::new(&block, Some(map.clone())).expect("reported")).expect("rows");
            assert!(lanes == blocks, "{what}");
        }
    }

    #[test]
    fn lane_rows_equal_the_block_path_bit_for_bit() {
        let ks: Vec<usize> = [1usize, 3, 8, 10, 12, 13, 20]
            .into_iter()
            .filter(|&k| lanes_apply(k))
            .collect();
        assert!(ks.contains(&10) && !lanes_apply(0) && !lanes_apply(13));
        for k in ks {
            for whiten in [false, true] {
                for layout in [Layout::Packed, Layout::Rows] {
                    lane_rows_equal_block_rows::<f32>(k, whiten, layout);
                    lane_rows_equal_block_rows::<f64>(k, whiten, layout);
                }
            }
        }
    }
}
