//! Software prefetch for the row kernels: each update streams the state once, so the lines of the rows a few
//! groups ahead are requested while the current group computes.

/// Groups ahead of the current one whose rows are prefetched.
pub(crate) const PREFETCH_GROUPS: usize = 4;

/// The rows of one block a kernel streams: a row-major matrix of K values per row, three vectors of one value
/// per row and the sample's values x (f64). Only addresses inside the block are requested.
pub(crate) struct Ahead<T> {
    matrix: *const T,
    vectors: [*const T; 3],
    x: *const f64,
    distance: usize,
    end: usize,
}

impl<T> Ahead<T> {
    /// Prefetch `distance` rows ahead of the rows asked for, within the block's first `end` rows.
    pub(crate) fn new(matrix: &[T], vectors: [&[T]; 3], x: &[f64], distance: usize, end: usize) -> Self {
        Ahead {
            matrix: matrix.as_ptr(),
            vectors: vectors.map(<[T]>::as_ptr),
            x: x.as_ptr(),
            distance,
            end,
        }
    }

    /// Request rows `row + distance .. + n` (`k` values each in the matrix), when they are inside the block.
    #[inline(always)]
    pub(crate) fn prefetch(&self, row: usize, n: usize, k: usize) {
        let first = row + self.distance;
        if first + n > self.end {
            return;
        }
        let line = 64 / std::mem::size_of::<T>();
        for v in (first * k..(first + n) * k).step_by(line) {
            prefetch(self.matrix.wrapping_add(v));
        }
        let (line, x_line) = (line.max(1), 8);
        for vector in self.vectors {
            for v in (first..first + n).step_by(line) {
                prefetch(vector.wrapping_add(v));
            }
        }
        for v in (first..first + n).step_by(x_line) {
            prefetch(self.x.wrapping_add(v));
        }
    }
}

/// A hint to load the cache line holding `p` (no effect on results; never faults).
#[inline(always)]
fn prefetch<V>(p: *const V) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing architecturally and cannot fault, whatever the address;
    // SSE (which provides it) is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
