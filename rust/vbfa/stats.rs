//! Expected sufficient statistics of q(H) and the data: everything the global factors q(c), q(F), q(τ)
//! and the transformations need from the N latent vectors, as sums over the observed rows of each column.
//!
//! Batch VB-FA recomputes them after every q(H) update; online VB-FA keeps their per-sample averages
//! (count_d = 1 when nothing is missing) and rebuilds the global factors from the averages scaled by the
//! effective sample size. Both apply the translation and rotation to them, so they always describe the
//! current (transformed) q(H).

use ndarray::{Array1, Array2, Array3, ArrayView1, ArrayView2, Axis};

use crate::linalg::Rotation;
use crate::scalar::Real;

/// Σ_{n∈O_d} ⟨h_n h_nᵀ⟩ for every column d: one K×K matrix when no value is missing, else D of them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LatentGram {
    /// The same matrix for every column (complete data).
    Shared(Array2<f64>),
    /// One matrix per column (D×K×K).
    PerColumn(Array3<f64>),
}

impl LatentGram {
    /// G_d (K×K).
    pub(crate) fn column(&self, d: usize) -> ArrayView2<'_, f64> {
        match self {
            LatentGram::Shared(g) => g.view(),
            LatentGram::PerColumn(g) => g.index_axis(Axis(0), d),
        }
    }

    fn map(&mut self, f: impl Fn(ArrayView2<f64>, usize) -> Array2<f64>) {
        match self {
            LatentGram::Shared(g) => *g = f(g.view(), 0),
            LatentGram::PerColumn(g) => {
                for (d, mut slice) in g.outer_iter_mut().enumerate() {
                    let new = f(slice.view(), d);
                    slice.assign(&new);
                }
            }
        }
    }
}

/// The covariances Σ_{h_n} of q(h_n): one for all rows (complete data, where every row has the same
/// precision I + Σ_d ⟨τ_d⟩⟨f_d f_dᵀ⟩) or one per row, with their log-determinants.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LatentCovs {
    /// Σ shared by all N rows.
    Shared {
        /// Σ (K×K).
        cov: Array2<f64>,
        /// ln|Σ|.
        log_det: f64,
        /// N.
        n_rows: usize,
    },
    /// Σ_{h_n} per row.
    PerRow {
        /// N×K×K.
        cov: Array3<f64>,
        /// ln|Σ_{h_n}| (N).
        log_det: Array1<f64>,
    },
}

impl LatentCovs {
    /// Σ_{h_n} (K×K).
    pub(crate) fn row(&self, i: usize) -> ArrayView2<'_, f64> {
        match self {
            LatentCovs::Shared { cov, .. } => cov.view(),
            LatentCovs::PerRow { cov, .. } => cov.index_axis(Axis(0), i),
        }
    }

    /// Σ_n Σ_{h_n} (K×K).
    pub(crate) fn sum(&self) -> Array2<f64> {
        match self {
            LatentCovs::Shared { cov, n_rows, .. } => cov * *n_rows as f64,
            LatentCovs::PerRow { cov, .. } => cov.sum_axis(Axis(0)),
        }
    }

    /// Σ_n ln|Σ_{h_n}|.
    pub(crate) fn log_det_sum(&self) -> f64 {
        match self {
            LatentCovs::Shared { log_det, n_rows, .. } => log_det * *n_rows as f64,
            LatentCovs::PerRow { log_det, .. } => log_det.sum(),
        }
    }

    /// Σ_{h_n} ← R⁻¹ Σ_{h_n} R⁻ᵀ, ln|Σ_{h_n}| ← ln|Σ_{h_n}| − 2 ln|det R|.
    pub(crate) fn rotate(&mut self, rot: &Rotation) {
        match self {
            LatentCovs::Shared { cov, log_det, .. } => {
                *cov = rot.latent_moment(cov.view());
                *log_det -= 2.0 * rot.log_abs_det;
            }
            LatentCovs::PerRow { cov, log_det } => {
                for mut c in cov.outer_iter_mut() {
                    let new = rot.latent_moment(c.view());
                    c.assign(&new);
                }
                *log_det -= 2.0 * rot.log_abs_det;
            }
        }
    }

    /// All N covariances as an N×K×K array.
    pub(crate) fn to_array(&self) -> Array3<f64> {
        match self {
            LatentCovs::Shared { cov, n_rows, .. } => {
                let k = cov.nrows();
                let mut out = Array3::zeros((*n_rows, k, k));
                out.outer_iter_mut().for_each(|mut c| c.assign(cov));
                out
            }
            LatentCovs::PerRow { cov, .. } => cov.clone(),
        }
    }
}

/// Whether a data entry is unusable: ±Inf or |x| > 1e100 (squares and K×K sums must stay finite), or NaN
/// when missing values are not allowed. NaN marks a missing value otherwise.
pub(crate) fn is_bad_entry(v: f64, allow_missing: bool) -> bool {
    if v.is_nan() {
        !allow_missing
    } else {
        v.abs() > f64::MAX_INPUT
    }
}

/// Which entries of an N×D data matrix are missing, by row and by column.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MissingPattern {
    /// For each row n, the columns d with x_nd missing (M_n).
    pub(crate) by_row: Vec<Vec<usize>>,
    /// For each column d, the rows n with x_nd missing (M_d).
    pub(crate) by_col: Vec<Vec<usize>>,
}

impl MissingPattern {
    /// The pattern of NaN entries of `x` (N×D).
    pub(crate) fn of(x: ArrayView2<f64>) -> Self {
        let (n, d) = x.dim();
        let mut by_row = vec![Vec::new(); n];
        let mut by_col = vec![Vec::new(); d];
        for ((i, j), v) in x.indexed_iter() {
            if v.is_nan() {
                by_row[i].push(j);
                by_col[j].push(i);
            }
        }
        MissingPattern { by_row, by_col }
    }

    /// Whether any value is missing.
    pub(crate) fn any(&self) -> bool {
        self.by_row.iter().any(|r| !r.is_empty())
    }
}

/// Sums over the observed entries of each column d (O_d) of data and latent moments, plus totals over all
/// N latent vectors. Shapes: D for the per-column scalars, D×K for `sum_h`/`sum_xh`, K and K×K totals.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ColumnStats {
    /// n_d = |O_d|.
    pub(crate) count: Array1<f64>,
    /// Σ_{n∈O_d} x_nd.
    pub(crate) sum_x: Array1<f64>,
    /// Σ_{n∈O_d} x_nd².
    pub(crate) sum_xx: Array1<f64>,
    /// m_d = Σ_{n∈O_d} h̄_n (row d).
    pub(crate) sum_h: Array2<f64>,
    /// p_d = Σ_{n∈O_d} x_nd h̄_n (row d).
    pub(crate) sum_xh: Array2<f64>,
    /// G_d = Σ_{n∈O_d} ⟨h_n h_nᵀ⟩.
    pub(crate) gram: LatentGram,
    /// N.
    pub(crate) n_rows: f64,
    /// Σ_n h̄_n over all rows.
    pub(crate) total_h: Array1<f64>,
    /// S = Σ_n ⟨h_n h_nᵀ⟩ = Σ_n (h̄_n h̄_nᵀ + Σ_{h_n}) over all rows.
    pub(crate) total_gram: Array2<f64>,
}

/// G_d = S − Σ_{n∈M_d} ⟨h_n h_nᵀ⟩ for every column (D×K×K), or the direct sum over O_d when most of
/// the column is missing. The moments ⟨h_n h_nᵀ⟩ = h̄_n h̄_nᵀ + Σ_{h_n} are formed once as N rows of K²
/// numbers, so each missing entry costs one contiguous K²-long subtraction.
fn per_column_grams(
    total_gram: &Array2<f64>,
    missing: &MissingPattern,
    h_mean: ArrayView2<f64>,
    h_cov: &LatentCovs,
) -> Array3<f64> {
    let (n, k) = h_mean.dim();
    let kk = k * k;
    let mut moments = vec![0.0; n * kk];
    for (i, chunk) in moments.chunks_exact_mut(kk).enumerate() {
        let h = h_mean.row(i);
        for ((idx, v), c) in chunk.iter_mut().enumerate().zip(h_cov.row(i).iter()) {
            *v = h[idx / k] * h[idx % k] + c;
        }
    }
    let total: Vec<f64> = total_gram.iter().copied().collect();
    let d = missing.by_col.len();
    let mut out = vec![0.0; d * kk];
    for (g, missing_rows) in out.chunks_exact_mut(kk).zip(&missing.by_col) {
        if 2 * missing_rows.len() <= n {
            g.copy_from_slice(&total);
            for &i in missing_rows {
                g.iter_mut()
                    .zip(&moments[i * kk..(i + 1) * kk])
                    .for_each(|(a, m)| *a -= m);
            }
        } else {
            let mut is_missing = vec![false; n];
            missing_rows.iter().for_each(|&i| is_missing[i] = true);
            for i in (0..n).filter(|&i| !is_missing[i]) {
                g.iter_mut()
                    .zip(&moments[i * kk..(i + 1) * kk])
                    .for_each(|(a, m)| *a += m);
            }
        }
    }
    Array3::from_shape_fn((d, k, k), |(j, a, b)| out[j * kk + a * k + b])
}

impl ColumnStats {
    /// Statistics of q(H) = Π_n N(h̄_n, Σ_{h_n}) for data `x_zeroed` (N×D, 0 where missing).
    ///
    /// Totals: S = H̄ᵀ H̄ + Σ_n Σ_{h_n}; m_d = Σ_n h̄_n − Σ_{n∈M_d} h̄_n; p = Xᵀ H̄ (GEMM, missing x = 0);
    /// G_d = S − Σ_{n∈M_d} ⟨h_n h_nᵀ⟩, or the direct sum over O_d when most of the column is missing.
    pub(crate) fn from_latents(
        x_zeroed: ArrayView2<f64>,
        missing: &MissingPattern,
        h_mean: ArrayView2<f64>,
        h_cov: &LatentCovs,
    ) -> Self {
        let (n, d) = x_zeroed.dim();
        let k = h_mean.ncols();
        let total_h = h_mean.sum_axis(Axis(0));
        let total_gram = h_mean.t().dot(&h_mean) + h_cov.sum();
        let count = Array1::from_iter(missing.by_col.iter().map(|m| (n - m.len()) as f64));
        let sum_x = x_zeroed.sum_axis(Axis(0));
        let sum_xx = x_zeroed.mapv(|v| v * v).sum_axis(Axis(0));
        let sum_xh = x_zeroed.t().dot(&h_mean);
        let mut sum_h = Array2::zeros((d, k));
        for (j, mut row) in sum_h.outer_iter_mut().enumerate() {
            row.assign(&total_h);
            for &i in &missing.by_col[j] {
                row -= &h_mean.row(i);
            }
        }
        let gram = if missing.any() {
            LatentGram::PerColumn(per_column_grams(&total_gram, missing, h_mean, h_cov))
        } else {
            LatentGram::Shared(total_gram.clone())
        };
        ColumnStats {
            count,
            sum_x,
            sum_xx,
            sum_h,
            sum_xh,
            gram,
            n_rows: n as f64,
            total_h,
            total_gram,
        }
    }

    /// Per-sample means of one complete mini-batch (online VB-FA): n_d = 1, N = 1,
    /// x̄, mean x², mean h̄ (every row of `sum_h`), (1/B) Xᵀ H̄ and (1/B) H̄ᵀ H̄ + Σ_h (one Σ_h for all rows).
    pub(crate) fn batch_means(x: ArrayView2<f64>, h_mean: ArrayView2<f64>, h_cov: ArrayView2<f64>) -> Self {
        let (b, d) = x.dim();
        let inv_b = 1.0 / b as f64;
        let total_h = h_mean.sum_axis(Axis(0)) * inv_b;
        let total_gram = h_mean.t().dot(&h_mean) * inv_b + h_cov;
        let mut sum_h = Array2::zeros((d, h_mean.ncols()));
        sum_h.rows_mut().into_iter().for_each(|mut r| r.assign(&total_h));
        ColumnStats {
            count: Array1::ones(d),
            sum_x: x.sum_axis(Axis(0)) * inv_b,
            sum_xx: x.mapv(|v| v * v).sum_axis(Axis(0)) * inv_b,
            sum_h,
            sum_xh: x.t().dot(&h_mean) * inv_b,
            gram: LatentGram::Shared(total_gram.clone()),
            n_rows: 1.0,
            total_h,
            total_gram,
        }
    }

    /// self ← (1 − ρ) self + ρ other (online averaging; both must be complete-data statistics).
    pub(crate) fn blend(&mut self, other: &ColumnStats, rho: f64) {
        let keep = 1.0 - rho;
        let mix1 = |a: &mut Array1<f64>, b: &Array1<f64>| a.zip_mut_with(b, |x, &y| *x = keep * *x + rho * y);
        let mix2 = |a: &mut Array2<f64>, b: &Array2<f64>| a.zip_mut_with(b, |x, &y| *x = keep * *x + rho * y);
        mix1(&mut self.count, &other.count);
        mix1(&mut self.sum_x, &other.sum_x);
        mix1(&mut self.sum_xx, &other.sum_xx);
        mix2(&mut self.sum_h, &other.sum_h);
        mix2(&mut self.sum_xh, &other.sum_xh);
        mix1(&mut self.total_h, &other.total_h);
        mix2(&mut self.total_gram, &other.total_gram);
        self.n_rows = keep * self.n_rows + rho * other.n_rows;
        self.gram = LatentGram::Shared(self.total_gram.clone());
    }

    /// Every statistic multiplied by `weight` (the effective sample size of online VB-FA).
    pub(crate) fn scaled(&self, weight: f64) -> ColumnStats {
        let gram = match &self.gram {
            LatentGram::Shared(g) => LatentGram::Shared(g * weight),
            LatentGram::PerColumn(g) => LatentGram::PerColumn(g * weight),
        };
        ColumnStats {
            count: &self.count * weight,
            sum_x: &self.sum_x * weight,
            sum_xx: &self.sum_xx * weight,
            sum_h: &self.sum_h * weight,
            sum_xh: &self.sum_xh * weight,
            gram,
            n_rows: self.n_rows * weight,
            total_h: &self.total_h * weight,
            total_gram: &self.total_gram * weight,
        }
    }

    /// The statistics after h̄_n ← h̄_n − b for every n (Σ_{h_n} unchanged):
    /// m_d ← m_d − n_d b, p_d ← p_d − (Σ x_nd) b, G_d ← G_d − b m_dᵀ − m_d bᵀ + n_d b bᵀ (old m_d).
    pub(crate) fn translate(&mut self, b: ArrayView1<f64>) {
        let shift_gram = |g: ArrayView2<f64>, m: ArrayView1<f64>, count: f64| -> Array2<f64> {
            let bm = b.insert_axis(Axis(1)).dot(&m.insert_axis(Axis(0)));
            let bb = b.insert_axis(Axis(1)).dot(&b.insert_axis(Axis(0)));
            &g - &bm - bm.t() + &(bb * count)
        };
        // A shared G (complete data) has m_d = Σ_n h̄_n and n_d = N for every d, so column 0 stands for all.
        let (sum_h, count) = (&self.sum_h, &self.count);
        self.gram.map(|g, d| shift_gram(g, sum_h.row(d), count[d]));
        self.total_gram = shift_gram(self.total_gram.view(), self.total_h.view(), self.n_rows);
        for ((mut m, mut p), (&n_d, &sx)) in self
            .sum_h
            .rows_mut()
            .into_iter()
            .zip(self.sum_xh.rows_mut())
            .zip(self.count.iter().zip(&self.sum_x))
        {
            m.scaled_add(-n_d, &b);
            p.scaled_add(-sx, &b);
        }
        self.total_h.scaled_add(-self.n_rows, &b);
    }

    /// The statistics after h̄_n ← R⁻¹ h̄_n, Σ_{h_n} ← R⁻¹ Σ_{h_n} R⁻ᵀ for every n.
    pub(crate) fn rotate(&mut self, rot: &Rotation) {
        self.sum_h = rot.latents(self.sum_h.view());
        self.sum_xh = rot.latents(self.sum_xh.view());
        self.total_h = rot.latent(self.total_h.view());
        self.total_gram = rot.latent_moment(self.total_gram.view());
        self.gram.map(|g, _| rot.latent_moment(g));
    }

    /// Number of columns D.
    pub(crate) fn n_cols(&self) -> usize {
        self.count.len()
    }

    /// Row d of `sum_h`, `sum_xh` as views.
    pub(crate) fn column_latents(&self, d: usize) -> (ArrayView1<'_, f64>, ArrayView1<'_, f64>) {
        (self.sum_h.row(d), self.sum_xh.row(d))
    }
}
