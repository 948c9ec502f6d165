//! S += Σ_rows y zᵀ (upper triangle) accumulated per lane by the online-EM row kernel, in register tiles.
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

    /// S += Σ_g y_g z_gᵀ over the kept groups (upper triangle, per lane): each TILE_I × TILE_J tile of S is
    /// loaded once, takes every kept group in order, and is stored once.
    #[inline(always)]
    pub(crate) fn flush(&mut self) {
        let zero = T::default();
        for i0 in (0..K).step_by(TILE_I) {
            for j0 in ((i0 / TILE_J) * TILE_J..K).step_by(TILE_J) {
                let inside = |ii: usize, jj: usize| i0 + ii < K && j0 + jj < K;
                let mut t = [[[zero; W]; TILE_J]; TILE_I];
                for ii in 0..TILE_I {
                    for jj in 0..TILE_J {
                        if inside(ii, jj) {
                            t[ii][jj] = self.s[i0 + ii][j0 + jj];
                        }
                    }
                }
                for g in 0..self.kept {
                    for ii in 0..TILE_I {
                        for jj in 0..TILE_J {
                            if inside(ii, jj) {
                                let (y, z) = (&self.y[g][i0 + ii], &self.z[g][j0 + jj]);
                                for l in 0..W {
                                    t[ii][jj][l] = t[ii][jj][l] + y[l] * z[l];
                                }
                            }
                        }
                    }
                }
                for ii in 0..TILE_I {
                    for jj in 0..TILE_J {
                        if inside(ii, jj) {
                            self.s[i0 + ii][j0 + jj] = t[ii][jj];
                        }
                    }
                }
            }
        }
        self.kept = 0;
    }
}
