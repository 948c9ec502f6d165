//! The draw θ = F h + c + ψ^{1/2} ⊙ z (4.50; Algorithm 3, lines 5–7) over one block of rows for
//! K ≤ `fused::MAX_K`, vectorised across rows like the step kernels (W rows at once, F as K lane-arrays), in f64 arithmetic
//! whatever the storage type (the draw is returned in f64 and equals the scalar loop bit for bit).
//!
//! Shapes: c, ψ^{1/2}, z and the output θ hold nb values, F is nb×K row-major, h holds K values. Per row
//! θ = (Σ_j f_j h_j, j ascending) + c + ψ^{1/2} z: the same operations in the same order as the scalar loop
//! of `Vifa::theta`, on every code path.

use super::fused::{code_paths, dispatch, for_k};
use super::lanes;
use crate::engine::isa::Isa;
use crate::scalar::Real;

/// One block's rows of the state (c, F, ψ^{1/2}).
pub(super) struct SampleRows<'a, T> {
    pub(super) c: &'a [T],
    pub(super) f: &'a [T],
    pub(super) sqrt_psi: &'a [f64],
}

#[inline(always)]
fn theta_block<T: Real, const K: usize, const W: usize>(
    rows: &SampleRows<'_, T>,
    h: &[f64],
    z: &[f64],
    out: &mut [f64],
) {
    let nb = out.len();
    let mut hk = [0.0; K];
    hk.copy_from_slice(&h[..K]);
    let mut r0 = 0;
    while r0 < nb {
        let n = (nb - r0).min(W);
        let f = lanes::load_rows::<T, K, W>(rows.f, r0, n);
        let c: [T; W] = lanes::load_values(rows.c, r0, n);
        let sp: [f64; W] = lanes::load_values(rows.sqrt_psi, r0, n);
        let zl: [f64; W] = lanes::load_values(z, r0, n);
        let mut fh = [-0.0; W];
        for j in 0..K {
            for l in 0..W {
                fh[l] += f[j][l].to_f64() * hk[j];
            }
        }
        let mut t = [0.0; W];
        for l in 0..W {
            t[l] = fh[l] + c[l].to_f64() + sp[l] * zl[l];
        }
        lanes::store_values(out, &t, r0, n);
        r0 += W;
    }
}

code_paths!(theta_block, theta_portable, theta_avx2, theta_avx512,
    (rows: &SampleRows<'_, T>, h: &[f64], z: &[f64], out: &mut [f64]) -> ());

/// θ of a block (K = `h.len()` ≤ `MAX_K`) on the path `isa`, written to `out` (nb values). Each lane does
/// the same f64 operations whatever W is, so every path gives the same bits.
pub(super) fn run_theta_block<T: Real>(isa: Isa, rows: &SampleRows<'_, T>, h: &[f64], z: &[f64], out: &mut [f64]) {
    dispatch!(
        isa,
        h.len(),
        theta_portable,
        theta_avx2,
        theta_avx512,
        (rows, h, z, out)
    )
}
