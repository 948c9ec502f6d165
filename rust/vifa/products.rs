//! The two K×K products of VIFA's blocked path (any K; the path models with K > 16 run) on the engine's
//! register-tiled kernels (`crate::engine::tiled`), in the arithmetic type of the state:
//!
//! ```text
//!   C = A (I + B)⁻¹                      (line 12; nb×K times K×K: K² multiply-adds per row)
//!   B_upper += Aᵀ F                      (line 11; upper triangle only: K(K+1)/2 per row)
//! ```
//!
//! Shapes: A, F and C are a block's nb ≤ `BLOCK_ROWS` rows, row-major K wide, in f64 (the block scratch of
//! `gradient`); they are copied into nbp×kp padded buffers of the arithmetic type (nbp = nb rounded up to the
//! tile height, kp = K padded to the tile width, padding zero), multiplied there, and C copied back. The
//! copies cost O(K) per row against the products' O(K²).
//!
//! **Arithmetic.** float64 state: f64 throughout. float32 state: A, F and (I + B)⁻¹ are rounded to f32 and the
//! products run in f32 (eight lanes per 256-bit vector); each block's f32 tile sums of B (at most
//! `BLOCK_ROWS` rows) are added into the f64 total. On the FMA path the products fuse multiply-adds, on the
//! portable one they do not, so the two agree to rounding.

use super::BLOCK_ROWS;
use crate::engine::isa::Isa;
use crate::engine::tiled::{padded_width, TileElem, Tiled, TILE_ROWS};

/// Padded scratch for the products of one task, and the arithmetic type (f32 for float32 state).
pub(super) struct Products {
    k: usize,
    isa: Isa,
    single: bool,
    a: Vec<f64>,
    b: Vec<f64>,
    out: Vec<f64>,
}

impl Products {
    /// For K = `k` on code path `isa`, in f32 when `single` (float32 state), else f64.
    pub(super) fn new(k: usize, isa: Isa, single: bool) -> Self {
        let len = BLOCK_ROWS.div_ceil(TILE_ROWS) * TILE_ROWS * padded_width(k);
        Products {
            k,
            isa,
            single,
            a: vec![0.0; len],
            b: vec![0.0; len],
            out: vec![0.0; len],
        }
    }

    /// out = a · M for `nb` rows (a, out: nb×K row-major f64; M: K×K tiled).
    pub(super) fn times(&mut self, a: &[f64], m: &Tiled, out: &mut [f64], nb: usize) {
        if self.single {
            self.times_in::<f32>(a, m, out, nb)
        } else {
            self.times_in::<f64>(a, m, out, nb)
        }
    }

    /// gram += aᵀ f over `nb` rows, upper triangle only (a, f: nb×K row-major f64; gram: K×K row-major, the
    /// entries below the diagonal untouched).
    pub(super) fn gram_upper_add(&mut self, a: &[f64], f: &[f64], nb: usize, gram: &mut [f64]) {
        if self.single {
            self.gram_in::<f32>(a, f, nb, gram)
        } else {
            self.gram_in::<f64>(a, f, nb, gram)
        }
    }

    fn times_in<E: TileElem>(&mut self, a: &[f64], m: &Tiled, out: &mut [f64], nb: usize) {
        let (k, kp) = (self.k, padded_width(self.k));
        let nbp = pack::<E>(a, k, nb, E::scratch(&mut self.a));
        let (a_p, out_p) = (E::scratch(&mut self.a), E::scratch(&mut self.out));
        E::rows_times(self.isa, a_p, m, out_p, nbp);
        for (dst, src) in out[..nb * k].chunks_exact_mut(k).zip(out_p.chunks_exact(kp)) {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s.to_f64();
            }
        }
    }

    fn gram_in<E: TileElem>(&mut self, a: &[f64], f: &[f64], nb: usize, gram: &mut [f64]) {
        let k = self.k;
        let nbp = pack::<E>(a, k, nb, E::scratch(&mut self.a));
        pack::<E>(f, k, nb, E::scratch(&mut self.b));
        E::syrk_upper_add(self.isa, E::scratch(&mut self.a), E::scratch(&mut self.b), nbp, k, gram);
    }
}

/// Copy `nb` rows of `src` (row-major, K wide, f64) into `dst` as nbp×kp padded rows of E (padding zero);
/// returns nbp.
fn pack<E: TileElem>(src: &[f64], k: usize, nb: usize, dst: &mut [E]) -> usize {
    let kp = padded_width(k);
    let nbp = nb.div_ceil(TILE_ROWS) * TILE_ROWS;
    for (r, row) in dst[..nbp * kp].chunks_exact_mut(kp).enumerate() {
        if r < nb {
            for (d, &s) in row[..k].iter_mut().zip(&src[r * k..(r + 1) * k]) {
                *d = E::from_f64(s);
            }
            row[k..].fill(E::default());
        } else {
            row.fill(E::default());
        }
    }
    nbp
}

/// Copy the upper triangle of a K×K row-major matrix into its lower one.
pub(super) fn mirror_upper(k: usize, m: &mut [f64]) {
    for i in 0..k {
        for j in i + 1..k {
            m[j * k + i] = m[i * k + j];
        }
    }
}
