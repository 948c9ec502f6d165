//! The affine map of a draw, θ = c + F h + ψ^{1/2} ⊙ z (4.50), over one block of rows, with each row's
//! (F h)_d = Σ_a F_da h_a held in a register across its K terms.
//!
//! Eight rows at a time (a vector's lanes), the K products of each row are added to one accumulator, from −0
//! and in a = 0, 1, …, K − 1 order, and the result goes straight into the row's draw: F is read once per draw
//! and nothing of length nb is written and read back K times. The same operations in the same order run on
//! every code path (multiply and add kept separate), so the draws are bit for bit those of a plain loop.

use crate::engine::isa::Isa;
use crate::scalar::Real;

/// Rows per group: one AVX-512 vector of f64, two AVX2 vectors.
const LANES: usize = 8;

/// z_d ← (c_d + (F h)_d) + z_d σ_d for the nb rows of a block, on code path `isa`.
///
/// `f_t` is Fᵀ of the block (K×nb, row-major: column a of F at `a * nb`), `h` the K latent values of this draw,
/// `mean` c (nb), `sd` σ = ψ^{1/2} (nb), and `draw` (nb) holds z on entry and θ on return.
pub(super) fn affine_draw<T: Real>(isa: Isa, f_t: &[f64], h: &[f64], mean: &[f64], sd: &[f64], draw: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa != Isa::Portable {
            // SAFETY: every path but the portable one is chosen only on CPUs with AVX2 (`Isa::allowed`).
            return unsafe { affine_draw_avx2(f_t, h, mean, sd, draw) };
        }
    }
    let _ = isa;
    affine_draw_rows(f_t, h, mean, sd, draw)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn affine_draw_avx2<T: Real>(f_t: &[f64], h: &[f64], mean: &[f64], sd: &[f64], draw: &mut [T]) {
    affine_draw_rows(f_t, h, mean, sd, draw)
}

/// [`affine_draw`]'s loop: full groups of [`LANES`] rows, then the rest one by one (the same sums).
#[inline(always)]
fn affine_draw_rows<T: Real>(f_t: &[f64], h: &[f64], mean: &[f64], sd: &[f64], draw: &mut [T]) {
    let nb = sd.len();
    let full = nb / LANES * LANES;
    for start in (0..full).step_by(LANES) {
        let mut fh = [-0.0f64; LANES];
        for (a, &h_a) in h.iter().enumerate() {
            let column = &f_t[a * nb + start..a * nb + start + LANES];
            for (s, &v) in fh.iter_mut().zip(column) {
                *s += v * h_a;
            }
        }
        let rows = start..start + LANES;
        for (((z, &c), &s), &sd) in draw[rows.clone()]
            .iter_mut()
            .zip(&mean[rows.clone()])
            .zip(&fh)
            .zip(&sd[rows])
        {
            *z = T::from_f64((c + s) + z.to_f64() * sd);
        }
    }
    for r in full..nb {
        let mut s = -0.0f64;
        for (a, &h_a) in h.iter().enumerate() {
            s += f_t[a * nb + r] * h_a;
        }
        draw[r] = T::from_f64((mean[r] + s) + draw[r].to_f64() * sd[r]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The column-at-a-time loop the grouped one replaced: (F h) for all rows, factor by factor, then the map.
    fn reference<T: Real>(f_t: &[f64], h: &[f64], mean: &[f64], sd: &[f64], draw: &mut [T]) {
        let nb = sd.len();
        let mut fh = vec![-0.0f64; nb];
        for (column, &h_a) in f_t.chunks_exact(nb).zip(h) {
            fh.iter_mut().zip(column).for_each(|(s, &v)| *s += v * h_a);
        }
        for (z, ((&c, &s), &sd)) in draw.iter_mut().zip(mean.iter().zip(&fh).zip(sd)) {
            *z = T::from_f64((c + s) + z.to_f64() * sd);
        }
    }

    /// Values with long mantissas and mixed signs and magnitudes, so that any change of order shows.
    fn values(n: usize, salt: u64) -> Vec<f64> {
        (0..n as u64)
            .map(|i| {
                let x = ((i.wrapping_mul(2_654_435_761).wrapping_add(salt)) % 1_000_003) as f64 / 1_000_003.0;
                (x - 0.37) * 10f64.powi((i % 7) as i32 - 3)
            })
            .collect()
    }

    fn check<T: Real + PartialEq + std::fmt::Debug>(k: usize, nb: usize) {
        let (f_t, h) = (values(k * nb, 1), values(k, 2));
        let mean = values(nb, 3);
        let sd: Vec<f64> = values(nb, 4).iter().map(|v| v.abs().sqrt()).collect();
        let z: Vec<T> = values(nb, 5).into_iter().map(T::from_f64).collect();
        let mut expected = z.clone();
        reference(&f_t, &h, &mean, &sd, &mut expected);
        for isa in Isa::available() {
            let mut got = z.clone();
            affine_draw(isa, &f_t, &h, &mean, &sd, &mut got);
            assert_eq!(got, expected, "K = {k}, nb = {nb}, {isa:?}");
        }
    }

    #[test]
    fn every_path_draws_the_bits_of_the_plain_loop() {
        for k in 1..=25 {
            for nb in [1, 7, 8, 9, 23, 1024] {
                check::<f64>(k, nb);
                check::<f32>(k, nb);
            }
        }
    }
}
