//! S += Σ_rows y zᵀ (upper triangle) accumulated per lane by the row kernels (online EM's S_z, online SGA's S,
//! VIFA's next Fᵀ Ψ⁻¹ F), in register tiles.
//!
//! A row kernel holds W rows per lane group and, per group, K lane-vectors z (and y = z/ψ). Adding y zᵀ to
//! K(K+1)/2 per-lane accumulators group by group reads and writes every accumulator once per group: with K = 10
//! that is 55 vectors, far more than the registers, so each multiply-add becomes a load and a store. Instead
//! the kernel keeps the z and y lanes of up to [`CHUNK_GROUPS`] groups and adds them tile by tile
//! ([`TILE_I`] × [`TILE_J`] accumulators held in registers across all kept groups). Each lane still adds its
//! groups in order, so the sums are exactly those of the group-by-group update.

use crate::scalar::Real;

/// Groups whose z and y lanes are kept for one tiled update.
pub(crate) const CHUNK_GROUPS: usize = 8;

/// Rows × columns of S's register tile: 2 × 4 lane-vectors of accumulators plus the operands fit the 16
/// vector registers of AVX2.
const TILE_I: usize = 2;
const TILE_J: usize = 4;
// `LaneSyrk::flush` names every clipped tile shape of this tile size.
const _: () = assert!(TILE_I == 2 && TILE_J == 4);

/// Per-lane S (K×K, upper triangle used; shapes [i][j][lane]) and the kept z, y lanes ([group][column][lane]).
pub(crate) struct LaneSyrk<T, const K: usize, const W: usize> {
    pub(crate) s: [[[T; W]; K]; K],
    pub(crate) z: [[[T; W]; K]; CHUNK_GROUPS],
    pub(crate) y: [[[T; W]; K]; CHUNK_GROUPS],
    /// Groups kept in `z`, `y` (the next group writes slot `kept`).
    pub(crate) kept: usize,
}

impl<T: Real, const K: usize, const W: usize> LaneSyrk<T, K, W> {
    pub(crate) fn new() -> Self {
        let zero = T::default();
        LaneSyrk {
            s: [[[zero; W]; K]; K],
            z: [[[zero; W]; K]; CHUNK_GROUPS],
            y: [[[zero; W]; K]; CHUNK_GROUPS],
            kept: 0,
        }
    }

    /// [`LaneSyrk::flush`] once every slot is used.
    #[inline(always)]
    pub(crate) fn flush_if_full(&mut self) {
        if self.kept == CHUNK_GROUPS {
            self.flush();
        }
    }

    /// S += Σ_g y_g z_gᵀ over the kept groups (upper triangle, per lane): each tile of S (TILE_I × TILE_J,
    /// smaller at the edges of S) is loaded once, takes every kept group in order, and is stored once. The
    /// tile's shape is a compile-time constant, so its inner loop carries no bounds or edge tests.
    #[inline(always)]
    pub(crate) fn flush(&mut self) {
        for i0 in (0..K).step_by(TILE_I) {
            for j0 in ((i0 / TILE_J) * TILE_J..K).step_by(TILE_J) {
                match ((K - i0).min(TILE_I), (K - j0).min(TILE_J)) {
                    (2, 4) => self.tile::<2, 4>(i0, j0),
                    (2, 3) => self.tile::<2, 3>(i0, j0),
                    (2, 2) => self.tile::<2, 2>(i0, j0),
                    (2, 1) => self.tile::<2, 1>(i0, j0),
                    (1, 4) => self.tile::<1, 4>(i0, j0),
                    (1, 3) => self.tile::<1, 3>(i0, j0),
                    (1, 2) => self.tile::<1, 2>(i0, j0),
                    _ => self.tile::<1, 1>(i0, j0),
                }
            }
        }
        self.kept = 0;
    }

    /// The NI × NJ tile of S at (i0, j0): S[i][j] += Σ_g y_g[i] z_g[j] per lane, the kept groups in order.
    #[inline(always)]
    fn tile<const NI: usize, const NJ: usize>(&mut self, i0: usize, j0: usize) {
        // The tile lies inside S (the caller clips it); stated once so that no index below is checked again.
        assert!(i0 + NI <= K && j0 + NJ <= K);
        let mut t = [[[T::default(); W]; NJ]; NI];
        for (ii, row) in t.iter_mut().enumerate() {
            for (jj, acc) in row.iter_mut().enumerate() {
                *acc = self.s[i0 + ii][j0 + jj];
            }
        }
        for (y, z) in self.y[..self.kept].iter().zip(&self.z[..self.kept]) {
            for (ii, row) in t.iter_mut().enumerate() {
                let yi = &y[i0 + ii];
                for (jj, acc) in row.iter_mut().enumerate() {
                    let zj = &z[j0 + jj];
                    for l in 0..W {
                        acc[l] = acc[l] + yi[l] * zj[l];
                    }
                }
            }
        }
        for (ii, row) in t.iter().enumerate() {
            for (jj, acc) in row.iter().enumerate() {
                self.s[i0 + ii][j0 + jj] = *acc;
            }
        }
    }
}
