//! Queries of a fitted factor-analysis Gaussian N(c, F Fᵀ + diag ψ) that stream over the D rows of a
//! model's state in blocks: F (D×K) is never materialised, so a query on n samples needs
//! O(n·K + block·K) memory besides its input and output. With M = I + Fᵀ Ψ⁻¹ F (K×K):
//!
//! * Woodbury (thesis 4.54): (F Fᵀ + Ψ)⁻¹ = Ψ⁻¹ − Ψ⁻¹ F M⁻¹ Fᵀ Ψ⁻¹,
//! * matrix determinant lemma: log|F Fᵀ + Ψ| = log|M| + Σ_d log ψ_d,
//! * latent posterior mean (4.23): E[h | x] = M⁻¹ Fᵀ Ψ⁻¹ (x − c),
//! * draws (4.50): θ = c + F h + ψ^{1/2} ⊙ z.
//!
//! M, Σ_d log ψ_d, Σ_d r_d²/ψ_d and Fᵀ Ψ⁻¹ r (r = x − c) are all sums over rows d, so one pass over the
//! state computes every query; the model is read once, under the caller's lock (one consistent state).

use std::ops::Range;

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};

use crate::engine::block::{block_times, row_dots};
use crate::engine::isa::Isa;
use crate::engine::k_dispatch::for_k;
use crate::engine::tiled::{padded_width, syrk_upper_add, TILE_ROWS};
use crate::engine::{run_tasks, task_ranges, use_parallel};
use crate::error::{FaError, Result};
use crate::linalg::SpdFactor;
use crate::scalar::Real;

mod draw;

/// Rows per block when a model has no block structure of its own.
pub const QUERY_BLOCK_ROWS: usize = 1024;

/// Visitor over blocks of rows: `(first_row, mean (nb), F (nb×K row-major), ψ (nb))`, all f64.
pub type RowVisitor<'a> = dyn FnMut(usize, &[f64], &[f64], &[f64]) -> Result<()> + 'a;

/// A model whose fitted Gaussian can be read block by block of rows.
pub trait GaussianRows: Sync {
    /// (D, K).
    fn dims(&self) -> (usize, usize);
    /// Visit consecutive blocks of rows covering `rows` in order. A row's values do not depend on the range
    /// it is read in, so disjoint ranges can be read by different threads.
    fn visit_range(&self, rows: Range<usize>, visit: &mut RowVisitor<'_>) -> Result<()>;
    /// Visit consecutive blocks of rows covering 0..D in order.
    fn visit_rows(&self, visit: &mut RowVisitor<'_>) -> Result<()> {
        self.visit_range(0..self.dims().0, visit)
    }
    /// [`GaussianRows::visit_range`] with the loadings mapped by a K×K `map` R, the marginal variances kept:
    /// F' = F R and ψ' = ψ + max(‖F_d‖² − ‖F'_d‖², 0) (see [`crate::shrinkage::Reported`]). A model may
    /// override it to map its rows in the same pass that builds them; the values must be those of the default,
    /// [`map_visited_rows`].
    fn visit_range_mapped(&self, rows: Range<usize>, map: ArrayView2<f64>, visit: &mut RowVisitor<'_>) -> Result<()> {
        map_visited_rows(self, rows, map, visit)
    }
    /// The K×K map R by which the model reports its loadings (F' = F R, marginal variances kept; see
    /// [`crate::shrinkage::Reported`]), or None to report the rows as visited.
    fn report_transform(&self) -> Result<Option<Array2<f64>>> {
        Ok(None)
    }
}

/// The rows of `model` in `rows`, each block's loadings mapped by `map` (R, K×K) through the engine's row
/// product (no per-block allocation or packing): F' = F R, and ψ' = ψ + max(‖F_d‖² − ‖F'_d‖², 0) row by row.
pub fn map_visited_rows<G: GaussianRows + ?Sized>(
    model: &G,
    rows: Range<usize>,
    map: ArrayView2<f64>,
    visit: &mut RowVisitor<'_>,
) -> Result<()> {
    let k = map.nrows();
    let (mut f_new, mut before, mut psi_new) = (Vec::new(), Vec::new(), Vec::new());
    model.visit_range(rows, &mut |lo, mean, f, psi| {
        // The buffers only grow (no zeroing per block): every value a block reads is written first.
        let nb = psi.len();
        f_new.resize(f_new.len().max(nb * k), 0.0);
        block_times(f, map, &mut f_new, nb);
        before.resize(before.len().max(nb), 0.0);
        row_dots(f, f, k, nb, &mut before); // ‖F_d‖²
        psi_new.resize(psi_new.len().max(nb), 0.0);
        row_dots(&f_new, &f_new, k, nb, &mut psi_new); // ‖F'_d‖², then ψ'
        for ((out, &norm), &p) in psi_new[..nb].iter_mut().zip(&before).zip(psi) {
            *out = p + (norm - *out).max(0.0);
        }
        visit(lo, mean, &f_new[..nb * k], &psi_new[..nb])
    })
}

/// Rows per task of a query: the tasks are fixed ranges of rows whatever the number of threads, and their
/// results are combined in range order, so every query gives the same bits on any number of threads.
pub const QUERY_TASK_ROWS: usize = 16 * 1024;

/// `task` on each range of [`QUERY_TASK_ROWS`] rows of 0..`d`, on the thread pool when the state is large
/// (`d`·`k` elements), and the results in range order (the first error, in range order, if any).
pub(crate) fn per_task<R: Send>(d: usize, k: usize, task: impl Fn(Range<usize>) -> Result<R> + Sync) -> Result<Vec<R>> {
    run_tasks(task_ranges(d, QUERY_TASK_ROWS), use_parallel(d, k), task)
        .into_iter()
        .collect()
}

/// `values` widened to f64 into `out` (cleared first).
pub(crate) fn widen<T: Real>(values: &[T], out: &mut Vec<f64>) {
    out.clear();
    out.extend(values.iter().map(|v| v.to_f64()));
}

/// A Gaussian given by its arrays — mean (D), F (D×K, K = 0 allowed: a diagonal Gaussian), ψ (D) — such as a
/// model's exported parameters or a VB-FA posterior mean: the queries below then serve every model family
/// through one implementation.
pub struct DenseGaussian<'a> {
    pub mean: ArrayView1<'a, f64>,
    pub loadings: ArrayView2<'a, f64>,
    pub noise_variance: ArrayView1<'a, f64>,
}

impl<'a> DenseGaussian<'a> {
    /// Check the shapes: mean and ψ of length D, F of shape (D, K).
    pub fn new(
        mean: ArrayView1<'a, f64>,
        loadings: ArrayView2<'a, f64>,
        noise_variance: ArrayView1<'a, f64>,
    ) -> Result<Self> {
        let (d, k) = loadings.dim();
        if mean.len() != d || noise_variance.len() != d {
            return Err(FaError::Shape {
                what: "mean, loadings, noise_variance",
                expected: format!("(D,), (D, K), (D,) for D = {d}"),
                got: vec![mean.len(), d, k, noise_variance.len()],
            });
        }
        Ok(DenseGaussian {
            mean,
            loadings,
            noise_variance,
        })
    }
}

impl GaussianRows for DenseGaussian<'_> {
    fn dims(&self) -> (usize, usize) {
        self.loadings.dim()
    }

    fn visit_range(&self, rows: Range<usize>, visit: &mut RowVisitor<'_>) -> Result<()> {
        let (mut mean, mut f, mut psi) = (Vec::new(), Vec::new(), Vec::new());
        for lo in rows.clone().step_by(QUERY_BLOCK_ROWS) {
            let hi = (lo + QUERY_BLOCK_ROWS).min(rows.end);
            mean.clear();
            mean.extend(self.mean.slice(ndarray::s![lo..hi]).iter().copied());
            f.clear();
            f.extend(self.loadings.slice(ndarray::s![lo..hi, ..]).iter().copied());
            psi.clear();
            psi.extend(self.noise_variance.slice(ndarray::s![lo..hi]).iter().copied());
            visit(lo, &mean, &f, &psi)?;
        }
        Ok(())
    }
}

/// One task's part of the outputs of [`rows_as`]: rows `first..first + mean.len()`.
struct RowsOut<'a, T> {
    first: usize,
    mean: &'a mut [T],
    f: &'a mut [T],
    psi: &'a mut [T],
}

/// (mean (D), F (D×K row-major), ψ (D)) of `model`, each value rounded once from the float64 the queries use
/// to `T`: one pass over the model, tasks of [`QUERY_TASK_ROWS`] rows filling disjoint parts of the outputs (on
/// the thread pool for a large model, so the first writes to the fresh pages are spread over the threads too).
pub fn rows_as<T: Real, G: GaussianRows + ?Sized>(model: &G) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let (d, k) = model.dims();
    let size = crate::error::checked_size(d, k)?;
    let zeroed = |len: usize| crate::scalar::try_zeros::<T>(len, "n_features");
    let (mut mean, mut f, mut psi) = (zeroed(d)?, zeroed(size)?, zeroed(d)?);
    let parts: Vec<RowsOut<'_, T>> = mean
        .chunks_mut(QUERY_TASK_ROWS)
        .zip(
            f.chunks_mut(QUERY_TASK_ROWS * k.max(1))
                .chain(std::iter::repeat_with(|| &mut [][..])),
        )
        .zip(psi.chunks_mut(QUERY_TASK_ROWS))
        .enumerate()
        .map(|(i, ((mean, f), psi))| RowsOut {
            first: i * QUERY_TASK_ROWS,
            mean,
            f,
            psi,
        })
        .collect();
    let fill = |out: RowsOut<'_, T>| -> Result<()> {
        let first = out.first;
        model.visit_range(first..first + out.mean.len(), &mut |lo, m, rows, p| {
            let at = lo - first;
            for (o, &v) in out.mean[at..at + m.len()].iter_mut().zip(m) {
                *o = T::from_f64(v);
            }
            for (o, &v) in out.f[at * k..at * k + rows.len()].iter_mut().zip(rows) {
                *o = T::from_f64(v);
            }
            for (o, &v) in out.psi[at..at + p.len()].iter_mut().zip(p) {
                *o = T::from_f64(v);
            }
            Ok(())
        })
    };
    run_tasks(parts, use_parallel(d, k), fill)
        .into_iter()
        .collect::<Result<()>>()?;
    Ok((mean, f, psi))
}

/// Lower Cholesky factor L of M = I + Fᵀ Ψ⁻¹ F (K×K; the smallest jitter that makes it factorise is added
/// when rounding alone breaks it), from one pass over the rows.
pub fn precision_cholesky<G: GaussianRows + ?Sized>(model: &G) -> Result<Array2<f64>> {
    let d = model.dims().0;
    let sums = query_sums(model, Array2::<f64>::zeros((0, d)).view())?;
    Ok(precision_factor(&sums.gram)?.lower())
}

/// The error of a query on a model whose state is not a finite Gaussian (an earlier breakdown).
fn not_finite(row: usize) -> FaError {
    FaError::InvalidState(format!(
        "the model's loadings or noise variance at feature {row} are not finite and positive (a numerical \
         breakdown in an earlier update); restore a checkpoint"
    ))
}

/// Every ψ of the block finite and positive and every loading finite, else the error naming the first row that
/// is not: one branch-free (vectorised) pass over the block, and the row looked for only when it fails.
fn check_block(lo: usize, f: &[f64], psi: &[f64], k: usize) -> Result<()> {
    let psi_ok = psi.iter().fold(true, |ok, p| ok & p.is_finite() & (*p > 0.0));
    if psi_ok && f.iter().fold(true, |ok, v| ok & v.is_finite()) {
        return Ok(());
    }
    for (i, p) in psi.iter().enumerate() {
        if !(p.is_finite() && *p > 0.0) || f[i * k..(i + 1) * k].iter().any(|v| !v.is_finite()) {
            return Err(not_finite(lo + i));
        }
    }
    Ok(())
}

/// Sums over rows for the queries on x (n×D): M − I = Σ_d F_d F_dᵀ/ψ_d (K×K), Σ_d log ψ_d,
/// quad_n = Σ_d r_nd²/ψ_d and proj_n = Σ_d r_nd F_d/ψ_d (n×K), r = x − c. Sums over disjoint sets of
/// rows (the shards of a model split across processes) add.
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySums {
    pub gram: Array2<f64>,
    pub log_det_psi: f64,
    pub quad: Array1<f64>,
    pub proj: Array2<f64>,
}

impl QuerySums {
    /// Flat form [gram (K², row-major), Σ log ψ, quad (n), proj (n·K, row-major)], for an all-reduce.
    pub fn to_flat(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.gram.len() + 1 + self.quad.len() + self.proj.len());
        out.extend(self.gram.iter());
        out.push(self.log_det_psi);
        out.extend(self.quad.iter());
        out.extend(self.proj.iter());
        out
    }

    /// Inverse of [`QuerySums::to_flat`] for n samples and K factors.
    pub fn from_flat(flat: &[f64], n: usize, k: usize) -> Result<Self> {
        let want = k * k + 1 + n + n * k;
        if flat.len() != want {
            return Err(FaError::Shape {
                what: "query sums",
                expected: format!("({want},) for n = {n}, K = {k}"),
                got: vec![flat.len()],
            });
        }
        let (gram, rest) = flat.split_at(k * k);
        let (quad, proj) = rest[1..].split_at(n);
        let shape_err = |e: ndarray::ShapeError| FaError::InvalidState(e.to_string());
        Ok(QuerySums {
            gram: Array2::from_shape_vec((k, k), gram.to_vec()).map_err(shape_err)?,
            log_det_psi: rest[0],
            quad: Array1::from(quad.to_vec()),
            proj: Array2::from_shape_vec((n, k), proj.to_vec()).map_err(shape_err)?,
        })
    }
}

/// The query sums of the model's rows for the rows of x (n×D): each task of [`QUERY_TASK_ROWS`] rows sums its
/// blocks, and the task sums are added in row order.
pub fn query_sums<G: GaussianRows + ?Sized>(model: &G, x: ArrayView2<f64>) -> Result<QuerySums> {
    let (d, k) = model.dims();
    let n = x.nrows();
    if x.ncols() != d {
        return Err(FaError::Shape {
            what: "X",
            expected: format!("(n_samples, {d})"),
            got: x.shape().to_vec(),
        });
    }
    let zero = || QuerySums {
        gram: Array2::zeros((k, k)),
        log_det_psi: 0.0,
        quad: Array1::zeros(n),
        proj: Array2::zeros((n, k)),
    };
    let parts = per_task(d, k, |rows| {
        let mut sums = zero();
        let (isa, mut bufs) = (Isa::detect(), BlockBufs::default());
        model.visit_range(rows, &mut |lo, mean, f, psi| {
            check_block(lo, f, psi, k)?;
            add_block_sums(
                isa,
                &mut sums,
                x.slice(ndarray::s![.., lo..lo + psi.len()]),
                mean,
                f,
                psi,
                &mut bufs,
            );
            Ok(())
        })?;
        Ok(sums)
    })?;
    let mut total = zero();
    for part in parts {
        total.gram += &part.gram;
        total.log_det_psi += part.log_det_psi;
        total.quad += &part.quad;
        total.proj += &part.proj;
    }
    mirror_upper(&mut total.gram);
    Ok(total)
}

/// Reused buffers of a query task: one block's F and Ψ⁻¹F (nbp×kp, rows padded with zeros to the layout of
/// the engine's tiled products, nbp = nb rounded up to whole tiles) and the K sums of one sample's projection.
#[derive(Default)]
pub(crate) struct BlockBufs {
    loadings: Vec<f64>,
    scaled: Vec<f64>,
    proj: Vec<f64>,
}

/// Add one block's Σ_d F_d F_dᵀ/ψ_d (F: nb×K row-major, ψ: nb) to the upper triangle of `gram` (K×K) by the
/// engine's register-tiled rank-nb update on code path `isa` (the caller mirrors it), and leave Ψ⁻¹F in
/// `bufs.scaled`. The sum runs over the block's rows in order, so the result does not depend on the threads.
pub(crate) fn add_block_gram(isa: Isa, gram: &mut Array2<f64>, f: &[f64], psi: &[f64], bufs: &mut BlockBufs) {
    let (nb, k) = (psi.len(), gram.nrows());
    if k == 0 {
        return;
    }
    let kp = padded_width(k);
    let nbp = nb.div_ceil(TILE_ROWS) * TILE_ROWS;
    // Rows nb..nbp and columns k..kp are the padding, zero; every other entry is written below.
    for buf in [&mut bufs.loadings, &mut bufs.scaled] {
        if buf.len() != nbp * kp {
            buf.clear();
            buf.resize(nbp * kp, 0.0);
        }
        buf[nb * kp..].fill(0.0);
    }
    for (r, (row, &p)) in f.chunks_exact(k).zip(psi).enumerate() {
        let inv = 1.0 / p;
        bufs.loadings[r * kp..r * kp + k].copy_from_slice(row);
        for (out, &v) in bufs.scaled[r * kp..r * kp + k].iter_mut().zip(row) {
            *out = v * inv; // Ψ⁻¹ F
        }
    }
    let sums = gram.as_slice_mut().expect("the Gram is allocated contiguous");
    syrk_upper_add(isa, &bufs.scaled, &bufs.loadings, nbp, k, sums);
}

/// `gram` made exactly symmetric from its upper triangle (a product's two triangles may differ in the last bit).
pub(crate) fn mirror_upper(gram: &mut Array2<f64>) {
    for a in 0..gram.nrows() {
        for b in 0..a {
            gram[[a, b]] = gram[[b, a]];
        }
    }
}

/// Add one block's rows to `sums`: Σ F_d F_dᵀ/ψ_d (upper triangle; [`query_sums`] mirrors it), Σ log ψ_d, and
/// for each sample r = x − c on these rows Σ r_d²/ψ_d and Σ_d r_d (Ψ⁻¹F)_d, the rows in order. `x` holds the
/// samples' entries of the block's rows (n×nb); `bufs` are reused buffers.
fn add_block_sums(
    isa: Isa,
    sums: &mut QuerySums,
    x: ArrayView2<f64>,
    mean: &[f64],
    f: &[f64],
    psi: &[f64],
    bufs: &mut BlockBufs,
) {
    let k = sums.gram.nrows();
    add_block_gram(isa, &mut sums.gram, f, psi, bufs);
    sums.log_det_psi += sum_of_logs(psi);
    let kp = padded_width(k);
    for (j, sample) in x.axis_iter(Axis(0)).enumerate() {
        bufs.proj.clear();
        bufs.proj.resize(k, 0.0);
        let scaled = &bufs.scaled[..psi.len() * kp];
        if k > 0 {
            for_k!(extended k, K => sample_proj::<K>(sample, mean, scaled, kp, &mut bufs.proj),
                _ => add_projection(sample, mean, scaled, kp, &mut bufs.proj));
        }
        let quad = sample_quad(sample, mean, psi);
        sums.quad[j] += quad;
        for (out, &acc) in sums.proj.row_mut(j).iter_mut().zip(&bufs.proj) {
            *out += acc;
        }
    }
}

/// Partial sums of [`sample_quad`]: row r of a block goes to sum r mod `LANES`, so that the sums are independent
/// chains rather than one chain of additions each waiting on the last, and they are added in a fixed order (the
/// same bits on any number of threads, since a block's rows do not depend on them).
const LANES: usize = 8;

/// One sample's Σ_r res_r²/ψ_r over a block's rows, res = x − c, in [`LANES`] partial sums.
#[inline(always)]
fn sample_quad(sample: ArrayView1<f64>, mean: &[f64], psi: &[f64]) -> f64 {
    let mut lanes = [0.0; LANES];
    if let Some(x) = sample.as_slice() {
        for ((x, c), p) in x.chunks(LANES).zip(mean.chunks(LANES)).zip(psi.chunks(LANES)) {
            for (lane, ((&xv, &c), &p)) in lanes.iter_mut().zip(x.iter().zip(c).zip(p)) {
                let res = xv - c;
                *lane += res * res / p;
            }
        }
    } else {
        for (r, ((&xv, &c), &p)) in sample.iter().zip(mean).zip(psi).enumerate() {
            let res = xv - c;
            lanes[r % LANES] += res * res / p;
        }
    }
    lanes.iter().sum() // in lane order
}

/// Σ_r ln ψ_r over a block (ψ > 0, finite): each run of `LOG_RUN` normal values as ln(Π m_r) + ln 2 · Σ e_r with
/// ψ_r = m_r 2^{e_r}, m_r ∈ [1, 2) (the product stays below 2^LOG_RUN), one logarithm per run; a run holding a
/// subnormal value takes the logarithm of each. The product rounds LOG_RUN times, so each run's logarithm is off
/// by about LOG_RUN·2⁻⁵³ ≈ 4·10⁻¹⁵ at most (absolute), against 2⁻⁵³|ln ψ_r| per term when each is taken.
#[inline(always)]
fn sum_of_logs(psi: &[f64]) -> f64 {
    const LOG_RUN: usize = 32;
    let mut total = 0.0;
    for run in psi.chunks(LOG_RUN) {
        if !run.iter().fold(true, |ok, p| ok & p.is_normal()) {
            total += run.iter().map(|p| p.ln()).sum::<f64>();
            continue;
        }
        let (mut product, mut exponents) = (1.0f64, 0i64);
        for p in run {
            let bits = p.to_bits();
            exponents += ((bits >> 52) & 0x7ff) as i64 - 1023;
            product *= f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
        }
        total += product.ln() + exponents as f64 * std::f64::consts::LN_2;
    }
    total
}

/// One sample's Σ_r res_r (Ψ⁻¹F)_r over a block's rows added to `acc` (K = its length), res = x − c, the rows in
/// order; `scaled` holds Ψ⁻¹F with rows `kp` apart.
#[inline(always)]
fn add_projection(sample: ArrayView1<f64>, mean: &[f64], scaled: &[f64], kp: usize, acc: &mut [f64]) {
    let k = acc.len();
    for ((&xv, &c), y) in sample.iter().zip(mean).zip(scaled.chunks_exact(kp)) {
        let res = xv - c;
        for (a, &y) in acc.iter_mut().zip(&y[..k]) {
            *a += res * y;
        }
    }
}

/// [`add_projection`] into `proj` (K, zero on entry) through a local array of a K known at compile time, which
/// stays in registers; the same additions in the same order.
#[inline(always)]
fn sample_proj<const K: usize>(sample: ArrayView1<f64>, mean: &[f64], scaled: &[f64], kp: usize, proj: &mut [f64]) {
    let mut acc = [0.0; K];
    add_projection(sample, mean, scaled, kp, &mut acc);
    proj[..K].copy_from_slice(&acc);
}

fn precision_factor(gram: &Array2<f64>) -> Result<SpdFactor> {
    let m = Array2::<f64>::eye(gram.nrows()) + gram;
    SpdFactor::new_jittered(m.view(), "I + Fᵀ Ψ⁻¹ F")
}

/// Log density of each row of x (n×D) under N(c, F Fᵀ + diag ψ), shape (n):
/// −½ (D log 2π + log|M| + Σ log ψ + rᵀΨ⁻¹r − ‖L⁻¹ Fᵀ Ψ⁻¹ r‖²), M = L Lᵀ.
pub fn log_prob<G: GaussianRows + ?Sized>(model: &G, x: ArrayView2<f64>) -> Result<Array1<f64>> {
    log_prob_from_sums(&query_sums(model, x)?, x.ncols())
}

/// [`log_prob`] from the query sums over all `n_features` rows of the model.
pub fn log_prob_from_sums(sums: &QuerySums, n_features: usize) -> Result<Array1<f64>> {
    let factor = precision_factor(&sums.gram)?;
    let l_inv = crate::linalg::lower_triangular_inverse(factor.lower().view())?;
    let log_det = factor.log_det() + sums.log_det_psi;
    let constant = n_features as f64 * (2.0 * std::f64::consts::PI).ln() + log_det;
    Ok(Array1::from_shape_fn(sums.quad.len(), |j| {
        let projected = l_inv.dot(&sums.proj.row(j));
        -0.5 * (constant + sums.quad[j] - projected.dot(&projected))
    }))
}

/// E[h | x] = M⁻¹ Fᵀ Ψ⁻¹ (x − c) for each row of x (n×D), shape (n, K).
pub fn latent_mean<G: GaussianRows + ?Sized>(model: &G, x: ArrayView2<f64>) -> Result<Array2<f64>> {
    latent_mean_from_sums(query_sums(model, x)?)
}

/// [`latent_mean`] from the query sums over all rows of the model.
pub fn latent_mean_from_sums(sums: QuerySums) -> Result<Array2<f64>> {
    let factor = precision_factor(&sums.gram)?;
    let mut out = sums.proj;
    for mut row in out.axis_iter_mut(Axis(0)) {
        let solved = factor.solve(row.view());
        row.assign(&solved);
    }
    Ok(out)
}

/// Draws θ_j = c + F h_j + ψ^{1/2} ⊙ z_j (4.50) written over `out` (n×D), which holds z on entry;
/// h is n×K. One pass over the model (tasks of [`QUERY_TASK_ROWS`] columns of `out` on the thread pool for a
/// large model; every entry is computed the same way on any number of threads), O(block·K) extra memory.
pub fn draw_in_place<G: GaussianRows + ?Sized, T: Real>(
    model: &G,
    h: ArrayView2<f64>,
    mut out: ArrayViewMut2<T>,
) -> Result<()> {
    let (d, k) = model.dims();
    if out.ncols() != d || h.ncols() != k || h.nrows() != out.nrows() {
        return Err(FaError::Shape {
            what: "draw buffers",
            expected: format!("z of shape (n, {d}) and h of shape (n, {k})"),
            got: vec![out.nrows(), out.ncols(), h.nrows(), h.ncols()],
        });
    }
    let parts: Vec<(usize, ArrayViewMut2<T>)> = out
        .axis_chunks_iter_mut(Axis(1), QUERY_TASK_ROWS)
        .enumerate()
        .map(|(i, part)| (i * QUERY_TASK_ROWS, part))
        .collect();
    let isa = Isa::detect();
    let h = h.as_standard_layout(); // each draw's K latent values contiguous, read in place by every block
    let draw_part = |(first, mut part): (usize, ArrayViewMut2<T>)| -> Result<()> {
        let rows = first..first + part.ncols();
        let (mut f_t, mut sd, mut strided) = (Vec::new(), Vec::new(), Vec::new());
        model.visit_range(rows, &mut |lo, mean, f, psi| {
            check_block(lo, f, psi, k)?;
            let (at, nb) = (lo - first, psi.len());
            // Fᵀ of the block (K×nb): each row's K products then read a column at a time, lanes across rows.
            f_t.clear();
            f_t.extend((0..k).flat_map(|a| f.iter().skip(a).step_by(k).copied()));
            sd.clear();
            sd.extend(psi.iter().map(|p| p.sqrt()));
            for (mut row, h_row) in part.axis_iter_mut(Axis(0)).zip(h.axis_iter(Axis(0))) {
                let latent = h_row.to_slice().expect("h is in standard layout");
                let mut block = row.slice_mut(ndarray::s![at..at + nb]);
                if let Some(draw) = block.as_slice_mut() {
                    draw::affine_draw(isa, &f_t, latent, mean, &sd, draw);
                } else {
                    strided.clear();
                    strided.extend(block.iter().copied());
                    draw::affine_draw(isa, &f_t, latent, mean, &sd, &mut strided);
                    block.iter_mut().zip(&strided).for_each(|(z, &v)| *z = v);
                }
            }
            Ok(())
        })
    };
    run_tasks(parts, use_parallel(d, k), draw_part).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vifa::{LearningRates, Optimizer, Vifa, VifaConfig, VifaInit};
    use ndarray::{array, Array2};

    /// A tiny VIFA model with known c, F, ψ (its parameters are stored as given).
    fn model() -> Vifa<f64> {
        let f = array![[1.0, 0.0], [0.5, 2.0], [0.0, -1.0]];
        let c = array![1.0, -1.0, 0.5];
        let psi = array![0.5, 1.0, 2.0];
        let init = VifaInit {
            loadings: f.view(),
            mean: Some(c.view()),
            noise_variance: Some(psi.view()),
        };
        let config = VifaConfig {
            prior_precision: 1.0,
            lr: LearningRates {
                mean: 0.0,
                loadings: 0.0,
                log_noise: 0.0,
            },
            optimizer: Optimizer::Sgd,
            n_grad_samples: 1,
            clip_grad_norm: None,
        };
        Vifa::new(3, 2, init, 0, config).expect("model")
    }

    fn dense(model: &Vifa<f64>) -> (Array1<f64>, Array2<f64>) {
        let f = model.loadings();
        let mut cov = f.dot(&f.t());
        for (i, p) in model.noise_variance().iter().enumerate() {
            cov[[i, i]] += p;
        }
        (model.mean(), cov)
    }

    #[test]
    fn log_prob_matches_the_dense_formula() {
        let m = model();
        let (c, cov) = dense(&m);
        let x = array![[0.3, 0.2, -1.0], [2.0, -3.0, 1.0]];
        let got = log_prob(&m, x.view()).expect("log_prob");
        let factor = SpdFactor::new(cov.view(), "cov").expect("spd");
        for (j, row) in x.axis_iter(Axis(0)).enumerate() {
            let r = &row - &c;
            let expected =
                -0.5 * (3.0 * (2.0 * std::f64::consts::PI).ln() + factor.log_det() + r.dot(&factor.solve(r.view())));
            assert!((got[j] - expected).abs() < 1e-12 * expected.abs());
        }
    }

    #[test]
    fn sum_of_logs_equals_the_sum_of_each_logarithm() {
        // Runs of normal values (one logarithm per run), a run holding a subnormal value (each logarithm), and
        // exponents far from zero: within 10⁻¹⁴ of the term-by-term sum, relative to Σ |ln ψ|.
        let mut values = Array2::zeros((1, 1000));
        crate::init::fill_standard_normal(values.view_mut(), 11);
        let mut psi: Vec<f64> = values.iter().map(|v| (3.0 * v).exp()).collect();
        psi[40] = 1e-310; // subnormal
        psi[41] = f64::MIN_POSITIVE;
        psi[500] = 1e300;
        psi[501] = 1e-300;
        for len in [0usize, 1, 31, 32, 33, 1000] {
            let part = &psi[..len];
            let naive: f64 = part.iter().map(|p| p.ln()).sum();
            let scale: f64 = part.iter().map(|p| p.ln().abs()).sum::<f64>().max(1.0);
            let got = sum_of_logs(part);
            assert!((got - naive).abs() <= 1e-14 * scale, "{len}: {got} against {naive}");
        }
        assert_eq!(sum_of_logs(&[1.0; 100]), 0.0);
    }

    #[test]
    fn quadratic_form_of_a_strided_sample_equals_the_contiguous_one() {
        // The partial sums give the same bits whether the sample's row is contiguous or strided.
        let mut values = Array2::zeros((3, 77));
        crate::init::fill_standard_normal(values.view_mut(), 12);
        let psi: Vec<f64> = values.row(2).iter().map(|v| 0.5 + v * v).collect();
        let mean = values.row(1).to_vec();
        let strided = Array2::from_shape_fn((77, 3), |(r, c)| values[[c, r]]); // column 0: stride 3
        let contiguous = sample_quad(values.row(0), &mean, &psi);
        assert!(strided.column(0).as_slice().is_none());
        assert_eq!(
            contiguous.to_bits(),
            sample_quad(strided.column(0), &mean, &psi).to_bits()
        );
        let naive: f64 = (0..77).map(|r| (values[[0, r]] - mean[r]).powi(2) / psi[r]).sum();
        assert!((contiguous - naive).abs() < 1e-13 * naive);
    }

    #[test]
    fn non_finite_or_non_positive_rows_are_an_error_naming_the_feature() {
        assert!(check_block(10, &[1.0, 2.0], &[0.5], 2).is_ok());
        for (f, psi) in [([1.0, f64::INFINITY], 0.5), ([1.0, 2.0], 0.0), ([1.0, 2.0], f64::NAN)] {
            let err = check_block(10, &f, &[psi], 2).expect_err("refused");
            assert!(err.to_string().contains("feature 10"));
        }
        // In a longer block the first bad row is named, whichever value is bad.
        let good = || (vec![1.0; 10], vec![0.5; 5]);
        for bad in [f64::NAN, f64::NEG_INFINITY, -1.0] {
            let (mut f, mut psi) = good();
            assert!(check_block(10, &f, &psi, 2).is_ok());
            psi[3] = bad;
            f[9] = bad / 0.0;
            let err = check_block(10, &f, &psi, 2).expect_err("refused");
            assert!(err.to_string().contains("feature 13"), "{err}");
            let (mut f, psi) = good();
            f[5] = bad / 0.0;
            let err = check_block(10, &f, &psi, 2).expect_err("refused");
            assert!(err.to_string().contains("feature 12"), "{err}");
        }
    }

    #[test]
    fn draw_in_place_is_the_affine_map() {
        let m = model();
        let h = array![[1.0, -2.0]];
        let mut out = array![[0.5, -1.0, 2.0]];
        draw_in_place(&m, h.view(), out.view_mut()).expect("draw");
        let f = m.loadings();
        for d in 0..3 {
            let expected = m.mean()[d] + f.row(d).dot(&h.row(0)) + [0.5, -1.0, 2.0][d] * m.noise_variance()[d].sqrt();
            assert!((out[[0, d]] - expected).abs() < 1e-14);
        }
    }

    /// A random Gaussian spanning several query tasks (D not a multiple of the task or block size).
    /// Four tasks, the last of a full block and a shorter one (whose padded tail follows a longer block's).
    fn large(k: usize) -> (Array1<f64>, Array2<f64>, Array1<f64>, Array2<f64>) {
        let d = 3 * QUERY_TASK_ROWS + QUERY_BLOCK_ROWS + 1001;
        let mut f = Array2::zeros((d, k));
        crate::init::fill_standard_normal(f.view_mut(), 3);
        let mut c = Array2::zeros((1, d));
        crate::init::fill_standard_normal(c.view_mut(), 4);
        let mut p = Array2::zeros((1, d));
        crate::init::fill_standard_normal(p.view_mut(), 5);
        let psi = p.row(0).mapv(|v| 0.1 + v * v);
        let mut x = Array2::zeros((3, d));
        crate::init::fill_standard_normal(x.view_mut(), 6);
        (c.row(0).to_owned(), f, psi, x)
    }

    /// The sums of [`query_sums`] by one loop over the rows in order (the definition).
    fn naive_sums(c: &Array1<f64>, f: &Array2<f64>, psi: &Array1<f64>, x: &Array2<f64>) -> QuerySums {
        let k = f.ncols();
        let mut sums = QuerySums {
            gram: Array2::zeros((k, k)),
            log_det_psi: 0.0,
            quad: Array1::zeros(x.nrows()),
            proj: Array2::zeros((x.nrows(), k)),
        };
        for d in 0..f.nrows() {
            let fd = f.row(d);
            sums.gram += &(fd.insert_axis(Axis(1)).dot(&fd.insert_axis(Axis(0))) / psi[d]);
            sums.log_det_psi += psi[d].ln();
            for j in 0..x.nrows() {
                let r = x[[j, d]] - c[d];
                sums.quad[j] += r * r / psi[d];
                sums.proj.row_mut(j).scaled_add(r / psi[d], &fd);
            }
        }
        sums
    }

    fn max_rel(a: ArrayView1<f64>, b: ArrayView1<f64>) -> f64 {
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        a.iter().zip(b).fold(0.0f64, |m, (p, q)| m.max((p - q).abs() / scale))
    }

    #[test]
    fn task_sums_equal_the_row_by_row_definition_on_any_thread_count() {
        for k in [0usize, 1, 7, 20, 30] {
            let (c, f, psi, x) = large(k);
            let g = DenseGaussian::new(c.view(), f.view(), psi.view()).expect("gaussian");
            let naive = naive_sums(&c, &f, &psi, &x);
            let got = query_sums(&g, x.view()).expect("sums");
            let flat = |s: &QuerySums| Array1::from(s.to_flat());
            assert!(max_rel(flat(&got).view(), flat(&naive).view()) < 1e-12, "K = {k}");
            for a in 0..k {
                for b in 0..k {
                    assert_eq!(got.gram[[a, b]].to_bits(), got.gram[[b, a]].to_bits(), "symmetric");
                }
            }
            let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
            let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
            let serial = one.install(|| query_sums(&g, x.view()).expect("sums"));
            let parallel = three.install(|| query_sums(&g, x.view()).expect("sums"));
            assert_eq!(serial, got);
            assert_eq!(parallel, got);
            let rows1 = one.install(|| rows_as::<f64, _>(&g).expect("rows"));
            let rows3 = three.install(|| rows_as::<f32, _>(&g).expect("rows"));
            assert_eq!(rows1, (c.to_vec(), f.iter().copied().collect(), psi.to_vec()));
            assert_eq!(rows3.1, f.iter().map(|&v| v as f32).collect::<Vec<f32>>());
        }
    }

    #[test]
    fn projections_of_every_compiled_k_equal_the_loop_for_any_k_bit_for_bit() {
        // The register accumulators of a K known at compile time run the same additions in the same order.
        for k in 1..=crate::engine::k_dispatch::MAX_K_EXTENDED {
            let (nb, kp) = (37, padded_width(k));
            let mut values = Array2::zeros((3, nb * kp));
            crate::init::fill_standard_normal(values.view_mut(), k as u64);
            let (sample, mean, scaled) = (
                values.slice(ndarray::s![0, ..nb]),
                values.row(1).to_vec(),
                values.row(2).to_vec(),
            );
            let (mut fixed, mut any) = (vec![0.0; k], vec![0.0; k]);
            for_k!(extended k, K => sample_proj::<K>(sample, &mean, &scaled, kp, &mut fixed),
                _ => unreachable!("K is in the extended range"));
            add_projection(sample, &mean, &scaled, kp, &mut any);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
            assert_eq!(bits(&fixed), bits(&any), "K = {k}");
            assert!(fixed.iter().all(|v| *v != 0.0));
        }
    }

    #[test]
    fn draws_of_a_large_model_are_the_affine_map_on_any_thread_count() {
        let (c, f, psi, z) = large(5);
        let g = DenseGaussian::new(c.view(), f.view(), psi.view()).expect("gaussian");
        let mut h = Array2::zeros((3, 5));
        crate::init::fill_standard_normal(h.view_mut(), 9);
        let draw_with = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            let mut out = z.clone();
            pool.install(|| draw_in_place(&g, h.view(), out.view_mut()))
                .expect("draw");
            out
        };
        let got = draw_with(3);
        assert_eq!(got, draw_with(1));
        for j in 0..3 {
            for d in [
                0,
                QUERY_TASK_ROWS - 1,
                QUERY_TASK_ROWS,
                2 * QUERY_TASK_ROWS + 17,
                f.nrows() - 1,
            ] {
                let fh = f.row(d).iter().zip(h.row(j)).fold(-0.0, |s, (a, b)| s + a * b);
                assert_eq!(
                    got[[j, d]],
                    (c[d] + fh) + z[[j, d]] * psi[d].sqrt(),
                    "draw {j}, feature {d}"
                );
            }
        }
        // The same draws into a non-contiguous view (each draw's entries two apart): the strided fallback.
        let mut wide = Array2::zeros((3, 2 * f.nrows()));
        wide.slice_mut(ndarray::s![.., ..;2]).assign(&z);
        let mut strided = wide.slice_mut(ndarray::s![.., ..;2]);
        draw_in_place(&g, h.view(), strided.view_mut()).expect("strided draw");
        assert_eq!(strided, got);
        // And with h in column-major order (a draw's K latent values n apart in memory).
        let h_columns = h.t().as_standard_layout().into_owned().reversed_axes();
        assert!(h_columns.as_slice().is_none());
        let mut again = z.clone();
        draw_in_place(&g, h_columns.view(), again.view_mut()).expect("draw with column-major h");
        assert_eq!(again, got);
    }
}
