//! The online-EM pass over one block of rows, fused into one loop and vectorised across rows, for K ≤ 16
//! after warm-up.
//!
//! **Ā-space sums.** With H̄⁻¹ = Uᵀ U (U upper triangular: the transposed Cholesky factor of H̄⁻¹; U = I in
//! the whitened basis), each loadings row is f = H̄⁻¹ a = Uᵀ z with z = U a (4.33), and f·a = |z|². So per row
//!
//! ```text
//!   z = U a                                  (K(K+1)/2 multiply-adds)
//!   ψ = max(d̄² − |z|², floor)                (4.35)
//!   S_z += z zᵀ / ψ   (upper triangle),   u_z += z d / ψ
//! ```
//!
//! and after the pass Fᵀ Ψ⁻¹ F = Uᵀ S_z U and Fᵀ Ψ⁻¹ d = Uᵀ u_z (the sums of (4.23)); see [`to_loadings_space`].
//! This is an identity, not an approximation; it never forms F, which saves K² multiply-adds per row.
//!
//! **SIMD across rows.** W rows are processed at once (W = 4 for f64, 8 for f32: one 256-bit vector; 8 for
//! both on AVX-512), each of the K columns held as a W-lane array, so every operation is lane-parallel over
//! rows whatever K is. A model whose kernel runs 8 lanes stores Ā packed as the lanes hold it
//! (`engine::packed`): each column of a group is one contiguous load and store, where row-major Ā needs a
//! gather or W scalar moves per column.
//!
//! **Arithmetic type.** The per-row K-dimensional arithmetic (pending line-12 update, z, the sums) runs
//! in the storage type T (|z|² in f64, since ψ = d̄² − |z|² may cancel), so float32 state does float32 arithmetic; the per-block partial sums are added in
//! f64. The running mean θ̄, d = x − θ̄ and d̄² (lines 5, 6, 14) are computed in f64 and rounded to T, as
//! everywhere else in the crate, and are written one pass late (see `engine::advance`). Every lane computes the same operations in the same order whichever code
//! path (portable or AVX2) runs, and Rust never contracts a·b + c into an FMA, so both paths agree bit for bit.

use super::advance;
pub(crate) use super::isa::Isa;
use super::lane_syrk::LaneSyrk;
use super::lane_times::lanes_times;
use super::packed::{Layout, PACK};
use super::prefetch::{Ahead, PREFETCH_GROUPS};
use crate::scalar::{stored, Real};

/// Inputs and outputs of one block (nb rows). State slices are the block's rows of the stored state.
pub(crate) struct EmBlockIo<'a, T> {
    /// Ā rows, nb×K (row-major), updated in place.
    pub(crate) a: &'a mut [T],
    /// θ̄, d̄², d_last rows (nb each), updated in place. d_last holds the previous sample's innovation e when
    /// `EmConsts::moments` is set (its moments are pending, see `engine::advance`), else its d; the pass
    /// stores this sample's innovation e there.
    pub(crate) mean: &'a mut [T],
    pub(crate) dsq: &'a mut [T],
    pub(crate) d_last: &'a mut [T],
    /// This sample's values for the block's rows, as f64 (nb).
    pub(crate) x: &'a [f64],
    /// Shared per-pass constants.
    pub(crate) consts: &'a EmConsts<T>,
    /// Outputs, accumulated: Σ d̄² after the update, u_z (K) and S_z (K×K row-major, upper triangle only).
    pub(crate) dsq_sum: &'a mut f64,
    pub(crate) u: &'a mut [f64],
    pub(crate) s: &'a mut [f64],
}

/// Per-pass constants of the kernel, in the arithmetic type T.
#[derive(Debug, Clone)]
pub(crate) struct EmConsts<T> {
    /// Pending lines 5, 6, 14 of the previous sample (its ρ', ρ), applied from the innovation in d_last.
    pub(crate) moments: Option<(f64, f64)>,
    /// Pending line-12 update (ρ_{t−1}, m_{t−1}), if any.
    pub(crate) pending: Option<(T, Vec<T>)>,
    /// Whitening transform W (K×K, row-major) applied after the pending update, if any.
    pub(crate) transform: Option<Vec<T>>,
    /// U (K×K row-major, upper triangular) with Uᵀ U = H̄⁻¹; None in the whitened basis (U = I).
    pub(crate) upper: Option<Vec<T>>,
    /// ρ_t of this sample, the running mean's step (1/t under `Scaling::Data`) and the noise floor.
    pub(crate) rho: f64,
    pub(crate) mean_rho: f64,
    pub(crate) floor: f64,
}

/// Fᵀ Ψ⁻¹ F = Uᵀ S_z U and Fᵀ Ψ⁻¹ d = Uᵀ u_z from the Ā-space sums (S_z given by its upper triangle,
/// K×K row-major; overwritten with the full loadings-space S). `upper` = None means U = I.
pub(crate) fn to_loadings_space(k: usize, upper: Option<&[f64]>, s: &mut [f64], u: &mut [f64]) {
    for i in 0..k {
        for j in 0..i {
            s[i * k + j] = s[j * k + i];
        }
    }
    let Some(up) = upper else { return };
    // t = S_z U, then S = Uᵀ t; u = Uᵀ u_z. U[i][j] = 0 for j < i.
    let mut t = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..k {
            t[i * k + j] = (0..=j).map(|l| s[i * k + l] * up[l * k + j]).sum();
        }
    }
    for i in 0..k {
        for j in 0..k {
            s[i * k + j] = (0..=i).map(|l| up[l * k + i] * t[l * k + j]).sum();
        }
    }
    let uz = u.to_vec();
    for (i, ui) in u.iter_mut().enumerate() {
        *ui = (0..=i).map(|l| up[l * k + i] * uz[l]).sum();
    }
}

/// Per-lane accumulators of one block: u_z (K), Σ d̄² after the update, and S_z (K×K, upper triangle) with
/// its kept z and y = z/ψ lanes (see [`LaneSyrk`]).
struct Acc<T, const K: usize, const W: usize> {
    su: [[T; W]; K],
    dsq: [f64; W],
    syrk: LaneSyrk<T, K, W>,
}

impl<T: Real, const K: usize, const W: usize> Acc<T, K, W> {
    fn new() -> Self {
        Acc {
            su: [[T::default(); W]; K],
            dsq: [0.0; W],
            syrk: LaneSyrk::new(),
        }
    }
}

/// One group of W rows of the state (Ā rows W×K row-major; θ̄, d̄², d_last and the sample W each).
struct GroupRows<'a, T> {
    a: &'a mut [T],
    mean: &'a mut [T],
    dsq: &'a mut [T],
    d_last: &'a mut [T],
    x: &'a [f64],
}

/// The block: full groups of W rows read and written in place, then the last n < W rows through a copy padded
/// with zero rows (they add exactly zero to every sum). Every loop of a group has a fixed trip count; with
/// `GATHER` (the AVX-512 path) the rows are moved into the lanes by gathers (see `lane_gather`). With `PACKED`
/// (W = 8) Ā is stored as `engine::packed` describes: each full group's columns are read and written whole, and
/// the last n < 8 rows of the state are row-major as in the other layout.
#[inline(always)]
fn em_block<T: Real, const K: usize, const W: usize, const GATHER: bool, const PACKED: bool>(
    io: &mut EmBlockIo<'_, T>,
    nb: usize,
) {
    const { assert!(!PACKED || W == PACK) };
    let zero = T::default();
    let c = io.consts;
    let mut acc = Acc::<T, K, W>::new();
    let full = nb / W * W;
    let ahead = Ahead::new(io.a, [io.mean, io.dsq, io.d_last], io.x, W * PREFETCH_GROUPS, full);
    let groups = io.a[..full * K]
        .chunks_exact_mut(W * K)
        .zip(io.mean[..full].chunks_exact_mut(W))
        .zip(io.dsq[..full].chunks_exact_mut(W))
        .zip(io.d_last[..full].chunks_exact_mut(W))
        .zip(io.x[..full].chunks_exact(W));
    for (g, ((((a, mean), dsq), d_last), x)) in groups.enumerate() {
        ahead.prefetch(g * W, W, K);
        em_group::<T, K, W, GATHER, PACKED>(
            c,
            GroupRows {
                a,
                mean,
                dsq,
                d_last,
                x,
            },
            &mut acc,
        );
        acc.syrk.flush_if_full();
    }
    let n = nb - full;
    if n > 0 {
        let mut a = [[zero; K]; W];
        let (mut mean, mut dsq, mut d_last, mut x) = ([zero; W], [zero; W], [zero; W], [0.0f64; W]);
        a.as_flattened_mut()[..n * K].copy_from_slice(&io.a[full * K..nb * K]);
        mean[..n].copy_from_slice(&io.mean[full..nb]);
        dsq[..n].copy_from_slice(&io.dsq[full..nb]);
        d_last[..n].copy_from_slice(&io.d_last[full..nb]);
        x[..n].copy_from_slice(&io.x[full..nb]);
        let rows = GroupRows {
            a: a.as_flattened_mut(),
            mean: &mut mean,
            dsq: &mut dsq,
            d_last: &mut d_last,
            x: &x,
        };
        em_group::<T, K, W, GATHER, false>(c, rows, &mut acc);
        io.a[full * K..nb * K].copy_from_slice(&a.as_flattened()[..n * K]);
        io.mean[full..nb].copy_from_slice(&mean[..n]);
        io.dsq[full..nb].copy_from_slice(&dsq[..n]);
        io.d_last[full..nb].copy_from_slice(&d_last[..n]);
    }
    acc.syrk.flush();
    // Per-block partials: lanes in order, then added to the f64 totals.
    let lanes = |v: &[T; W]| v.iter().fold(0.0f64, |acc, x| acc + x.to_f64());
    for i in 0..K {
        io.u[i] += lanes(&acc.su[i]);
        for j in i..K {
            io.s[i * K + j] += lanes(&acc.syrk.s[i][j]);
        }
    }
    *io.dsq_sum += acc.dsq.iter().sum::<f64>();
}

/// One group of W rows: the previous sample's pending moments and line 12, then this sample's z, ψ and sums.
/// `a` of the group's rows is row-major, or with `PACKED` its K columns of W values each.
#[inline(always)]
fn em_group<T: Real, const K: usize, const W: usize, const GATHER: bool, const PACKED: bool>(
    c: &EmConsts<T>,
    g: GroupRows<'_, T>,
    acc: &mut Acc<T, K, W>,
) {
    let zero = T::default();
    let (a_rows, x_rows) = (&mut g.a[..W * K], &g.x[..W]);
    let (mean_rows, dsq_rows, d_last_rows) = (&mut g.mean[..W], &mut g.dsq[..W], &mut g.d_last[..W]);
    // Ā rows, transposed to K lane-arrays, one column at a time (each lane-array can be assembled in a
    // register and stored whole).
    let mut a = [[zero; W]; K];
    if PACKED {
        move_packed::<T, K, W, GATHER>(a_rows, &mut a, true);
    } else {
        // SAFETY: GATHER is set only by the AVX-512 entry point, which runs on CPUs with AVX-512F.
        unsafe { super::lane_gather::load_columns::<T, K, W, GATHER>(a_rows, &mut a) };
    }
    // The previous sample's pending moments (lines 5, 6, 14), then its line 12.
    let mut m0 = [0.0f64; W];
    let mut dsq0 = [0.0f64; W];
    let mut d_prev = [0.0f64; W];
    for l in 0..W {
        m0[l] = mean_rows[l].to_f64();
        dsq0[l] = dsq_rows[l].to_f64();
        d_prev[l] = d_last_rows[l].to_f64();
    }
    if let Some((mean_rho, rho)) = c.moments {
        // The stored values go to lane arrays first and then to the rows in one copy each, so the stores
        // are whole vectors (stored lane by lane, they compiled to one extract-and-store per value).
        let (mut mean_s, mut dsq_s) = ([zero; W], [zero; W]);
        for l in 0..W {
            let adv = advance::<T>(m0[l], dsq0[l], d_prev[l], mean_rho, rho);
            (mean_s[l], m0[l]) = adv.mean;
            (dsq_s[l], dsq0[l]) = adv.dsq;
            d_prev[l] = adv.d;
        }
        mean_rows.copy_from_slice(&mean_s);
        dsq_rows.copy_from_slice(&dsq_s);
    }
    if let Some((rho_p, m)) = &c.pending {
        // Line 12 of the previous sample: Ā ← Ā + ρ (d mᵀ − Ā), then Ā ← Ā W when whitening.
        let mut dp = [zero; W];
        for l in 0..W {
            dp[l] = T::from_f64(d_prev[l]);
        }
        for j in 0..K {
            for l in 0..W {
                a[j][l] = a[j][l] + *rho_p * (dp[l] * m[j] - a[j][l]);
            }
        }
        if let Some(w) = &c.transform {
            a = whiten::<T, K, W, GATHER>(&a, w);
        }
        if PACKED {
            move_packed::<T, K, W, GATHER>(a_rows, &mut a, false);
        } else {
            for l in 0..W {
                for j in 0..K {
                    a_rows[l * K + j] = a[j][l];
                }
            }
        }
    }
    // z goes straight into the chunk's slot (no copy of the K×W lanes).
    let slot = acc.syrk.kept;
    let z = &mut acc.syrk.z[slot];
    match &c.upper {
        Some(u) => upper_times::<T, K, W>(&a, u, z),
        None => *z = a,
    }
    let z = &acc.syrk.z[slot];
    // |z|² in f64: ψ = d̄² − |z|² cancels when ψ ≪ d̄², and float32 would lose ψ entirely there.
    let mut fa = [0.0f64; W];
    for zj in z {
        for l in 0..W {
            let v = zj[l].to_f64();
            fa[l] += v * v;
        }
    }
    // This sample: innovation e = x − θ̄_{t−1} (stored), d_t and d̄²_t in registers (ψ uses d̄²_{t−1}).
    let mut inv_psi = [zero; W];
    let mut dv = [zero; W];
    let mut e_s = [zero; W];
    for l in 0..W {
        // ψ = max(d̄² − |z|², floor), written as a select (a NaN difference gives the floor, as f64::max does).
        let diff = dsq0[l] - fa[l];
        let psi = if diff > c.floor { diff } else { c.floor };
        let (es, e) = stored::<T>(x_rows[l] - m0[l]);
        let adv = advance::<T>(m0[l], dsq0[l], e, c.mean_rho, c.rho);
        acc.dsq[l] += adv.dsq.1;
        e_s[l] = es;
        dv[l] = T::from_f64(adv.d);
        inv_psi[l] = T::from_f64(1.0 / psi);
    }
    d_last_rows.copy_from_slice(&e_s);
    // E-step sums in Ā space: u_z += z d/ψ here; S_z += z zᵀ/ψ (upper triangle) from the kept y = z/ψ and z
    // when the chunk is full (`LaneSyrk::flush`).
    for i in 0..K {
        for l in 0..W {
            let y = acc.syrk.z[slot][i][l] * inv_psi[l];
            acc.su[i][l] = acc.su[i][l] + y * dv[l];
            acc.syrk.y[slot][i][l] = y;
        }
    }
    acc.syrk.kept += 1;
}

/// A packed group's K columns of W values into the lanes (`into_lanes`) or back into the state. float64 groups
/// on the AVX-512 path go by volatile 512-bit moves (`lane_gather::load_packed_f64`): plain copies of a group
/// above 768 bytes (float64 at K ≥ 13) compiled to calls of `memcpy`, slower than the gathers they replace.
/// float32 groups (at most 768 bytes, K ≤ 24) are plain copies, which compile to vector moves.
#[inline(always)]
fn move_packed<T: Real, const K: usize, const W: usize, const AVX512: bool>(
    stored: &mut [T],
    lanes: &mut [[T; W]; K],
    into_lanes: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 && !T::SINGLE && std::mem::size_of::<T>() == 8 && W == 8 {
        // SAFETY: T is f64 and W = 8 here, so both views keep the element type and the length; AVX512 is set
        // only by the AVX-512 entry point, which runs on CPUs with AVX-512F.
        unsafe {
            let values = std::slice::from_raw_parts_mut(stored.as_mut_ptr().cast::<f64>(), stored.len());
            let cols = &mut *(lanes as *mut [[T; W]; K]).cast::<[[f64; 8]; K]>();
            if into_lanes {
                super::lane_gather::load_packed_f64::<K>(values, cols);
            } else {
                super::lane_gather::store_packed_f64::<K>(cols, values);
            }
        }
        return;
    }
    for (col, values) in lanes.iter_mut().zip(stored.chunks_exact_mut(W)) {
        if into_lanes {
            col.copy_from_slice(values);
        } else {
            values.copy_from_slice(col);
        }
    }
}

/// The least K at which float32's whitening product on the AVX-512 path runs in 256-bit operations: with the 32
/// registers of AVX-512VL measured faster at K = 6 to 24, level at K = 2 and slower at K = 4 (docs/performance.md,
/// "Why the kernels are chosen").
const F32X8_MIN_K: usize = 6;

/// Ā W per lane (`lanes_times`); on the AVX-512 path, float32 lanes of 8 at K ≥ [`F32X8_MIN_K`] in 256-bit
/// operations (`lanes_times_f32x8`), where LLVM would join pairs of columns into 512-bit registers.
#[inline(always)]
fn whiten<T: Real, const K: usize, const W: usize, const AVX512: bool>(a: &[[T; W]; K], w: &[T]) -> [[T; W]; K] {
    #[cfg(target_arch = "x86_64")]
    if AVX512 && K >= F32X8_MIN_K && T::SINGLE && std::mem::size_of::<T>() == 4 && W == 8 {
        // SAFETY: T is f32 and W = 8, so the casts keep the element type and lengths; AVX512 is set only by the
        // AVX-512 entry point, whose CPUs have AVX.
        unsafe {
            let a32 = &*(a as *const [[T; W]; K]).cast::<[[f32; 8]; K]>();
            let w32 = std::slice::from_raw_parts(w.as_ptr().cast::<f32>(), w.len());
            let out = super::lane_times::lanes_times_f32x8::<K>(a32, w32);
            return *(&out as *const [[f32; 8]; K]).cast::<[[T; W]; K]>();
        }
    }
    lanes_times::<T, K, W>(a, w)
}

/// z = U a per lane, written to `z` (U upper triangular, row-major): z_i = Σ_{j ≥ i} U[i][j] a_j.
#[inline(always)]
fn upper_times<T: Real, const K: usize, const W: usize>(a: &[[T; W]; K], u: &[T], z: &mut [[T; W]; K]) {
    for i in 0..K {
        let mut zi = [T::default(); W];
        for j in i..K {
            let uij = u[i * K + j];
            for l in 0..W {
                zi[l] = zi[l] + uij * a[j][l];
            }
        }
        z[i] = zi;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn em_block_avx2<T: Real, const K: usize, const W: usize, const PACKED: bool>(
    io: &mut EmBlockIo<'_, T>,
    nb: usize,
) {
    em_block::<T, K, W, false, PACKED>(io, nb)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
unsafe fn em_block_avx512<T: Real, const K: usize, const W: usize, const PACKED: bool>(
    io: &mut EmBlockIo<'_, T>,
    nb: usize,
) {
    em_block::<T, K, W, true, PACKED>(io, nb)
}

fn em_block_portable<T: Real, const K: usize, const W: usize, const PACKED: bool>(
    io: &mut EmBlockIo<'_, T>,
    nb: usize,
) {
    em_block::<T, K, W, false, PACKED>(io, nb)
}

#[cfg(target_arch = "x86_64")]
fn em_block_avx2_entry<T: Real, const K: usize, const W: usize, const PACKED: bool>(
    io: &mut EmBlockIo<'_, T>,
    nb: usize,
) {
    // SAFETY: only handed out by `EmRowKernel::select` for `Isa::Avx2`, which `Isa::available` constructs
    // only after `is_x86_feature_detected!("avx2")`.
    unsafe { em_block_avx2::<T, K, W, PACKED>(io, nb) }
}

#[cfg(target_arch = "x86_64")]
fn em_block_avx512_entry<T: Real, const K: usize, const W: usize, const PACKED: bool>(
    io: &mut EmBlockIo<'_, T>,
    nb: usize,
) {
    // SAFETY: only handed out by `EmRowKernel::select` for `Isa::Avx512`, which `Isa::available` constructs
    // only after detecting avx2, avx512f and avx512vl.
    unsafe { em_block_avx512::<T, K, W, PACKED>(io, nb) }
}

/// One block of the EM pass: (rows, number of rows).
type BlockFn<T> = for<'a, 'b> fn(&'a mut EmBlockIo<'b, T>, usize);

use super::k_dispatch::for_k;
pub(crate) use super::k_dispatch::MAX_K_EXTENDED;

/// Largest K the row kernel (this module) runs for online-EM state of type T on code path `isa`; larger K run the
/// wide kernel (engine/em_wide.rs). With the 32 registers of AVX-512, or with float32 state, the row kernel beats
/// the wide kernel up to [`MAX_K_EXTENDED`]; float64 on a path with 16 registers up to [`ROW_MAX_F64_16_REGISTERS`]
/// (the measurements behind this choice: docs/performance.md, "Why the kernels are chosen as they are").
pub(crate) fn row_kernel_max<T: Real>(isa: Isa) -> usize {
    if T::SINGLE || isa.vector_bytes() >= 64 {
        MAX_K_EXTENDED
    } else {
        ROW_MAX_F64_16_REGISTERS
    }
}

/// Largest K of the float64 row kernel on a path with 16 vector registers: level with the wide kernel at K = 18,
/// behind it from there on.
const ROW_MAX_F64_16_REGISTERS: usize = 17;

/// The kernel for one K, one storage type and one code path, resolved to a plain function. The choice depends
/// only on (K, T, CPU), so a model runs the same kernel for its whole life.
#[derive(Clone, Copy)]
pub(crate) struct EmRowKernel<T: Real> {
    run: BlockFn<T>,
    /// The same kernel reading Ā in the packed layout (8 lanes only).
    run_packed: Option<BlockFn<T>>,
    isa: Isa,
    lanes: usize,
}

impl<T: Real> std::fmt::Debug for EmRowKernel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EmRowKernel({:?}, {} lanes)", self.isa, self.lanes)
    }
}

/// The function for K = `$kk` on path `$isa`, its lane count W and, for W = 8, its packed-layout twin: 4 f64 /
/// 8 f32 lanes (one 256-bit vector) on every path. AVX-512 runs 8 lanes for both types: at 16 f32 lanes the
/// per-lane accumulators no longer fit the registers, while its 32 registers and masked moves help at 8.
macro_rules! em_pick {
    ($isa:expr, $kk:ident) => {{
        let f32_state = T::SINGLE;
        match ($isa, f32_state) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, _) => (
                em_block_avx512_entry::<T, $kk, 8, false> as BlockFn<T>,
                8,
                Some(em_block_avx512_entry::<T, $kk, 8, true> as BlockFn<T>),
            ),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, true) => (
                em_block_avx2_entry::<T, $kk, 8, false> as BlockFn<T>,
                8,
                Some(em_block_avx2_entry::<T, $kk, 8, true> as BlockFn<T>),
            ),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, false) => (em_block_avx2_entry::<T, $kk, 4, false> as BlockFn<T>, 4, None),
            (Isa::Portable, true) => (
                em_block_portable::<T, $kk, 8, false> as BlockFn<T>,
                8,
                Some(em_block_portable::<T, $kk, 8, true> as BlockFn<T>),
            ),
            (Isa::Portable, false) => (em_block_portable::<T, $kk, 4, false> as BlockFn<T>, 4, None),
        }
    }};
}

impl<T: Real> EmRowKernel<T> {
    /// The kernel for K = `k` on code path `isa`; None when K > [`row_kernel_max`] (the wide kernel's range).
    pub(crate) fn select(k: usize, isa: Isa) -> Option<Self> {
        if k > row_kernel_max::<T>(isa) {
            return None;
        }
        let (run, lanes, run_packed) = for_k!(extended k, K => em_pick!(isa, K), _ => return None);
        Some(EmRowKernel {
            run,
            run_packed,
            isa,
            lanes,
        })
    }

    /// The layout of Ā this kernel reads fastest: packed where it runs [`PACK`] lanes, else row-major.
    pub(crate) fn preferred_layout(&self) -> Layout {
        match self.run_packed {
            Some(_) => Layout::Packed,
            None => Layout::Rows,
        }
    }

    /// Rows per lane group (W).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn lanes(&self) -> usize {
        self.lanes
    }

    /// Run the pass on the `nb` rows of `io`, whose Ā is stored in `layout`. A kernel of 4 lanes reads row-major
    /// Ā only: a packed block is rearranged for it and back (the same numbers, so the same results).
    #[inline]
    pub(crate) fn run(&self, io: &mut EmBlockIo<'_, T>, nb: usize, layout: Layout) {
        match (layout, self.run_packed) {
            (Layout::Rows, _) => (self.run)(io, nb),
            (Layout::Packed, Some(packed)) => packed(io, nb),
            (Layout::Packed, None) => {
                let k = io.u.len();
                layout.restore_rows(io.a, nb, k);
                (self.run)(io, nb);
                layout.arrange(io.a, nb, k);
            }
        }
    }
}
