//! The draw θ = F h + c + ψ^{1/2} ⊙ z (4.50; Algorithm 3, lines 5–7) over one block of rows for
//! K ≤ `fused::MAX_K`, vectorised across rows like the step kernels (W rows at once, F as K lane-arrays).
//!
//! Shapes: c, ψ^{1/2}, z and the output θ hold nb values, F is nb×K row-major, h holds K values. Per row
//! θ = (Σ_j f_j h_j, j ascending) + c + ψ^{1/2} z: the same operations in the same order as the scalar loop
//! of `Vifa::theta`, on every code path.

use super::fused::for_k;
use super::lanes::{self, Lanes, W};
use crate::engine::em_kernel::Isa;
use crate::scalar::Real;

/// One block's rows of the state (c, F, β, ψ^{1/2}).
pub(super) struct SampleRows<'a, T> {
    pub(super) c: &'a [T],
    pub(super) f: &'a [T],
    pub(super) beta: &'a [T],
    pub(super) sqrt_psi: &'a [f64],
}

#[inline(always)]
fn theta_block<T: Real, const K: usize>(rows: &SampleRows<'_, T>, h: &[f64], z: &[f64], out: &mut [f64]) {
    let nb = out.len();
    let mut hk = [0.0; K];
    hk.copy_from_slice(&h[..K]);
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let x: Lanes<K> = lanes::load(rows.c, rows.f, rows.beta, rows.sqrt_psi, r0, n);
        let zl = lanes::load_values(z, r0, n);
        let mut fh = [-0.0; W];
        for j in 0..K {
            for l in 0..W {
                fh[l] += x.f[j][l] * hk[j];
            }
        }
        let mut t = [0.0; W];
        for l in 0..W {
            t[l] = fh[l] + x.c[l] + x.sqrt_psi[l] * zl[l];
        }
        lanes::store_values(out, &t, r0, n);
        r0 += W;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn theta_block_avx2<T: Real, const K: usize>(rows: &SampleRows<'_, T>, h: &[f64], z: &[f64], out: &mut [f64]) {
    theta_block::<T, K>(rows, h, z, out)
}

/// θ of a block (K = `h.len()` ≤ `MAX_K`) on the path `isa`, written to `out` (nb values).
pub(super) fn run_theta_block<T: Real>(isa: Isa, rows: &SampleRows<'_, T>, h: &[f64], z: &[f64], out: &mut [f64]) {
    for_k!(h.len(), K => match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after `is_x86_feature_detected!("avx2")`.
        Isa::Avx2 | Isa::Avx512 => unsafe { theta_block_avx2::<T, K>(rows, h, z, out) },
        Isa::Portable => theta_block::<T, K>(rows, h, z, out),
    })
}
