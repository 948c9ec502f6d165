//! The online-EM pass over one block of rows fused into a single loop for K ≤ 16 (after warm-up).
//!
//! Per row, in registers: the pending line-12 update Ā ← Ā + ρ(d mᵀ − Ā) (optionally followed by the
//! whitening transform W), F = Ā H̄⁻¹ (4.33; F = Ā when whitened), ψ = max(d̄² − F·Ā, floor) (4.35), the
//! running averages θ̄, d, d̄² (lines 5, 6, 14), and y = F/ψ with u += y d (4.23). Only F and y are written to
//! the L1 block buffers, for the K×K sum S += Σ y Fᵀ that follows. The arithmetic is the same, in the same
//! order, as the block-by-block path in online_em.rs, so both give bit-identical results.

use crate::scalar::{stored, Real};

/// Inputs and outputs of one fused block (nb rows). State slices are the block's rows of the stored state.
pub(crate) struct EmBlockIo<'a, T> {
    /// Ā rows, nb×K (row-major), updated in place.
    pub(crate) a: &'a mut [T],
    /// θ̄, d̄², d_last rows (nb each), updated in place.
    pub(crate) mean: &'a mut [T],
    pub(crate) dsq: &'a mut [T],
    pub(crate) d_last: &'a mut [T],
    /// This sample's values for the block's rows, as f64 (nb).
    pub(crate) x: &'a [f64],
    /// Pending update (ρ_{t−1}, m_{t−1}), if any.
    pub(crate) pending: Option<(f64, &'a [f64])>,
    /// Whitening transform W (K×K, row-major) applied after the pending update, if any.
    pub(crate) transform: Option<&'a [f64]>,
    /// H̄⁻¹ (K×K, row-major); None in the whitened basis (F = Ā).
    pub(crate) h_inv: Option<&'a [f64]>,
    /// ρ_t of this sample, the running mean's step (1/t under `Scaling::Data`) and the noise floor.
    pub(crate) rho: f64,
    pub(crate) mean_rho: f64,
    pub(crate) floor: f64,
    /// Σ d̄² over the block's rows after the update (accumulated).
    pub(crate) dsq_sum: &'a mut f64,
    /// Outputs: F rows and y = F/ψ rows (nb×K), and the K-vector u (accumulated).
    pub(crate) f: &'a mut [f64],
    pub(crate) y: &'a mut [f64],
    pub(crate) u: &'a mut [f64],
}

/// row · M for a K-row and a K×K row-major M (sum over i in order, as `small_k::rows_times`).
#[inline(always)]
fn row_times<const K: usize>(row: &[f64; K], m: &[f64]) -> [f64; K] {
    let mut acc = [0.0f64; K];
    for i in 0..K {
        let ri = row[i];
        for j in 0..K {
            acc[j] += ri * m[i * K + j];
        }
    }
    acc
}

#[inline(always)]
fn em_block<T: Real, const K: usize>(io: &mut EmBlockIo<'_, T>, nb: usize) {
    let mut uu = [0.0f64; K];
    let mut dsq_sum = 0.0;
    for r in 0..nb {
        let a_row = &mut io.a[r * K..(r + 1) * K];
        let mut ar = [0.0f64; K];
        for j in 0..K {
            ar[j] = a_row[j].to_f64();
        }
        if let Some((rho_p, m)) = io.pending {
            let dp = io.d_last[r].to_f64();
            for j in 0..K {
                ar[j] += rho_p * (dp * m[j] - ar[j]);
            }
            if let Some(w) = io.transform {
                ar = row_times::<K>(&ar, w);
            }
            for j in 0..K {
                let (s, v) = stored::<T>(ar[j]);
                a_row[j] = s;
                ar[j] = v;
            }
        }
        let fr = match io.h_inv {
            Some(h) => row_times::<K>(&ar, h),
            None => ar,
        };
        let mut prod = [0.0f64; K];
        for j in 0..K {
            prod[j] = fr[j] * ar[j];
        }
        let mut fa = 0.0;
        for p in prod {
            fa += p;
        }
        let psi = (io.dsq[r].to_f64() - fa).max(io.floor);
        let xi = io.x[r];
        let m0 = io.mean[r].to_f64();
        let (mean_s, m1) = stored::<T>(m0 + io.mean_rho * (xi - m0));
        io.mean[r] = mean_s;
        let d = xi - m1;
        let dsq0 = io.dsq[r].to_f64();
        let (dsq_s, dsq1) = stored::<T>(dsq0 + io.rho * (d * d - dsq0));
        io.dsq[r] = dsq_s;
        dsq_sum += dsq1;
        io.d_last[r] = T::from_f64(d);
        let inv_psi = 1.0 / psi;
        for j in 0..K {
            let yj = fr[j] * inv_psi;
            io.y[r * K + j] = yj;
            io.f[r * K + j] = fr[j];
            uu[j] += yj * d;
        }
    }
    for j in 0..K {
        io.u[j] += uu[j];
    }
    *io.dsq_sum += dsq_sum;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn em_block_avx2<T: Real, const K: usize>(io: &mut EmBlockIo<'_, T>, nb: usize) {
    em_block::<T, K>(io, nb)
}

fn em_block_dispatch<T: Real, const K: usize>(io: &mut EmBlockIo<'_, T>, nb: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { em_block_avx2::<T, K>(io, nb) };
        }
    }
    em_block::<T, K>(io, nb)
}

/// Run the fused block when K ≤ 16; returns false (doing nothing) for larger K.
pub(crate) fn try_em_block<T: Real>(k: usize, io: &mut EmBlockIo<'_, T>, nb: usize) -> bool {
    match k {
        1 => em_block_dispatch::<T, 1>(io, nb),
        2 => em_block_dispatch::<T, 2>(io, nb),
        3 => em_block_dispatch::<T, 3>(io, nb),
        4 => em_block_dispatch::<T, 4>(io, nb),
        5 => em_block_dispatch::<T, 5>(io, nb),
        6 => em_block_dispatch::<T, 6>(io, nb),
        7 => em_block_dispatch::<T, 7>(io, nb),
        8 => em_block_dispatch::<T, 8>(io, nb),
        9 => em_block_dispatch::<T, 9>(io, nb),
        10 => em_block_dispatch::<T, 10>(io, nb),
        11 => em_block_dispatch::<T, 11>(io, nb),
        12 => em_block_dispatch::<T, 12>(io, nb),
        13 => em_block_dispatch::<T, 13>(io, nb),
        14 => em_block_dispatch::<T, 14>(io, nb),
        15 => em_block_dispatch::<T, 15>(io, nb),
        16 => em_block_dispatch::<T, 16>(io, nb),
        _ => return false,
    }
    true
}
