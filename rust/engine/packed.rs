//! How online EM stores Ā (D×K): row-major, or packed in groups of [`PACK`] rows as the 8-lane row kernel reads
//! them.
//!
//! Packed, the rows of group g (rows 8g … 8g + 7) are stored column by column: value (row r, column j) of a full
//! group sits at 8K·(r / 8) + 8j + r mod 8, so the kernel loads a column's 8 lanes with one contiguous load
//! instead of a gather of 8 values at stride K. The rows after the last full group (D mod 8 of them) stay
//! row-major after the packed part. Both layouts hold the same D·K numbers; only their order differs, so the
//! arithmetic, and every result, is the same bit for bit whichever layout a model uses. Checkpoints and every
//! reader outside the pass see row-major values.
//!
//! A slice of the state that starts at a multiple of 8 rows and ends at a multiple of 8 or at row D (every
//! block of the streaming pass) follows the same rule on its own: its first ⌊n / 8⌋ · 8 rows packed, the rest
//! row-major.

use std::ops::Range;

use crate::scalar::Real;

/// Rows per packed group: the lane count of the row kernels that read the packed layout.
pub(crate) const PACK: usize = 8;

/// The order of Ā's values in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Row-major D×K.
    Rows,
    /// Groups of [`PACK`] rows column by column, the last D mod 8 rows row-major.
    Packed,
}

impl Layout {
    /// Position of (row, column) in a state (or block) of `n` rows, K = `k` (the definition the tests hold the
    /// rearrangements to).
    #[cfg(test)]
    pub(crate) fn index(self, row: usize, col: usize, k: usize, n: usize) -> usize {
        match self {
            Layout::Packed if row < n / PACK * PACK => row / PACK * PACK * k + col * PACK + row % PACK,
            _ => row * k + col,
        }
    }

    /// Rows `rows` of a stored state of `n` rows (K = `k`), row-major and widened to f64, into `out`.
    pub(crate) fn read_rows<T: Real>(self, stored: &[T], n: usize, k: usize, rows: Range<usize>, out: &mut [f64]) {
        if self == Layout::Rows {
            for (dst, src) in out.iter_mut().zip(&stored[rows.start * k..rows.end * k]) {
                *dst = src.to_f64();
            }
            return;
        }
        let full = n / PACK * PACK;
        for (r, row) in rows.zip(out.chunks_exact_mut(k)) {
            if r < full {
                let first = r / PACK * PACK * k + r % PACK;
                for (j, dst) in row.iter_mut().enumerate() {
                    *dst = stored[first + j * PACK].to_f64();
                }
            } else {
                for (dst, src) in row.iter_mut().zip(&stored[r * k..(r + 1) * k]) {
                    *dst = src.to_f64();
                }
            }
        }
    }

    /// The stored values of `n` rows (K = `k`) in row-major order.
    pub(crate) fn to_rows<T: Copy + Default>(self, stored: &[T], n: usize, k: usize) -> Vec<T> {
        let mut out = stored.to_vec();
        self.restore_rows(&mut out, n, k);
        out
    }

    /// Rearrange row-major values of `n` rows (K = `k`) into this layout, in place (no copy of the state).
    pub(crate) fn arrange<T: Copy + Default>(self, values: &mut [T], n: usize, k: usize) {
        self.permute_groups(values, n, k, |l, j| (l * k + j, j * PACK + l));
    }

    /// Rearrange values stored in this layout back to row-major order, in place.
    pub(crate) fn restore_rows<T: Copy + Default>(self, values: &mut [T], n: usize, k: usize) {
        self.permute_groups(values, n, k, |l, j| (j * PACK + l, l * k + j));
    }

    /// For every full group of a packed state: value `from` of the group's old order moves to `to`, for
    /// `(from, to) = moves(lane, column)`. Nothing moves in the row-major layout.
    fn permute_groups<T: Copy + Default>(
        self,
        values: &mut [T],
        n: usize,
        k: usize,
        moves: impl Fn(usize, usize) -> (usize, usize),
    ) {
        if self == Layout::Rows {
            return;
        }
        let mut group = vec![T::default(); PACK * k];
        for g in (0..n / PACK * PACK).step_by(PACK) {
            let rows = &mut values[g * k..(g + PACK) * k];
            group.copy_from_slice(rows);
            for l in 0..PACK {
                for j in 0..k {
                    let (from, to) = moves(l, j);
                    rows[to] = group[from];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (row, column) of the packed order holds the row-major value, for D below, at and around multiples
    /// of 8, and the two rearrangements invert each other.
    #[test]
    fn packed_order_holds_every_row_major_value() {
        for (n, k) in [(0, 3), (5, 2), (8, 1), (8, 3), (13, 4), (16, 10), (27, 7)] {
            let rows: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut packed = rows.clone();
            Layout::Packed.arrange(&mut packed, n, k);
            for r in 0..n {
                for j in 0..k {
                    assert_eq!(
                        packed[Layout::Packed.index(r, j, k, n)],
                        rows[r * k + j],
                        "n = {n}, k = {k}"
                    );
                }
            }
            // A full group's column is contiguous.
            if n >= PACK && k > 1 {
                assert_eq!(packed[PACK], rows[1], "column 1's first lane follows column 0's eight");
            }
            assert_eq!(Layout::Packed.to_rows(&packed, n, k), rows);
            let mut read = vec![0.0; n * k];
            Layout::Packed.read_rows(&packed, n, k, 0..n, &mut read);
            assert!(read.iter().zip(&rows).all(|(a, &b)| *a == f64::from(b)));
            if n > 3 {
                let mut part = vec![0.0; 2 * k];
                Layout::Packed.read_rows(&packed, n, k, n - 3..n - 1, &mut part);
                assert!(part.iter().zip(&rows[(n - 3) * k..]).all(|(a, &b)| *a == f64::from(b)));
            }
            Layout::Packed.restore_rows(&mut packed, n, k);
            assert_eq!(packed, rows);
            let mut same = rows.clone();
            Layout::Rows.arrange(&mut same, n, k);
            assert_eq!(same, rows);
        }
    }
}
