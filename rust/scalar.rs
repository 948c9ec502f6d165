//! Storage scalars: the D-sized state may be `f32` or `f64`; all K×K algebra and all sums are `f64`.

/// A floating-point type the D-sized state (and input samples) can be stored in.
pub trait Real:
    Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + 'static
{
    /// Largest magnitude accepted in an input sample for state of this type: squares of
    /// deviations (the running `d̄²`) and the K×K sums must stay finite.
    const MAX_INPUT: f64;
    /// Largest magnitude a stored loading or variance may take (products of two stay finite).
    const MAX_STATE: f64;
    /// Smallest value a relative noise floor may reach (keeps 1/ψ finite in this type's range).
    const MIN_FLOOR: f64;
    /// Largest finite value of this type (as f64).
    const MAX_FINITE: f64;
    /// Short dtype name ("float32"/"float64").
    const NAME: &'static str;
    /// True for single precision (`f32`): the kernels that have a float32-arithmetic form choose it by this.
    const SINGLE: bool;
    /// Widen to `f64` (exact).
    fn to_f64(self) -> f64;
    /// Round from `f64` to this type.
    fn from_f64(v: f64) -> Self;
    /// `values` themselves when this type is `f64` (no conversion needed), else None.
    #[inline(always)]
    fn as_f64_slice(values: &[Self]) -> Option<&[f64]> {
        let _ = values;
        None
    }
}

impl Real for f64 {
    const MAX_INPUT: f64 = 1e100;
    const MAX_STATE: f64 = 1e150;
    const MIN_FLOOR: f64 = 1e-200;
    const MAX_FINITE: f64 = f64::MAX;
    const NAME: &'static str = "float64";
    const SINGLE: bool = false;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn as_f64_slice(values: &[Self]) -> Option<&[f64]> {
        Some(values)
    }
}

impl Real for f32 {
    const MAX_INPUT: f64 = 1e18;
    const MAX_STATE: f64 = 1e18;
    const MIN_FLOOR: f64 = 1e-30;
    const MAX_FINITE: f64 = f32::MAX as f64;
    const NAME: &'static str = "float32";
    const SINGLE: bool = true;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

/// Round `v` to the storage type and back, so that a value used in this step equals the stored one.
#[inline(always)]
pub(crate) fn stored<T: Real>(v: f64) -> (T, f64) {
    let s = T::from_f64(v);
    (s, s.to_f64())
}

/// Bytes from which an allocation asks the kernel for transparent huge pages (one 2 MiB page).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Ask Linux to back the whole 2 MiB pages inside `[ptr, ptr + bytes)` with transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`, which the kernel honours in its default `madvise` mode), before they are first
/// touched: a D×K array then takes one page fault per 2 MiB instead of one per 4 KiB, and fewer TLB misses
/// on every pass. Advice only: a refusal changes nothing, and no value changes.
fn ask_for_huge_pages(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= 2 * HUGE_PAGE_BYTES {
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE_BYTES);
        let end = (ptr as usize + bytes) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
        if end > start {
            // SAFETY: [start, end) lies inside the live allocation of `bytes` bytes at `ptr`; madvise with
            // MADV_HUGEPAGE only changes how the kernel backs those pages, never their contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// `len` zeros of a storage type, or an error (never an abort) when they cannot be allocated. The memory
/// comes zeroed from the allocator (for large sizes, fresh pages the kernel zeroes on first touch), so a
/// caller that overwrites every value pays one pass over it, not two. Large allocations ask for
/// transparent huge pages ([`ask_for_huge_pages`]).
pub(crate) fn try_zeros<T: Real>(len: usize, what: &'static str) -> crate::error::Result<Vec<T>> {
    use std::any::TypeId;
    let allocation_error = || crate::error::FaError::Allocation { what, len };
    let float = TypeId::of::<T>() == TypeId::of::<f64>() || TypeId::of::<T>() == TypeId::of::<f32>();
    if len == 0 || !float {
        return crate::error::try_filled(len, T::default(), what);
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| allocation_error())?;
    // SAFETY: `layout` has a non-zero size (len > 0 and T is f32 or f64, checked above); the pointer is checked for null; it
    // was allocated by the global allocator with T's layout for exactly `len` values, which is what
    // `Vec::from_raw_parts` requires; all-zero bits are the value 0.0 of both storage types, so every one
    // of the `len` values is initialised.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<T>();
        if ptr.is_null() {
            return Err(allocation_error());
        }
        ask_for_huge_pages(ptr.cast::<u8>(), layout.size());
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}

#[cfg(test)]
mod tests {
    use super::try_zeros;

    #[test]
    fn try_zeros_gives_len_zeros_and_refuses_impossible_sizes() {
        for len in [0usize, 1, 3, 1 << 20] {
            assert!(try_zeros::<f64>(len, "x")
                .expect("zeros")
                .iter()
                .all(|v| v.to_bits() == 0));
            let v = try_zeros::<f32>(len, "x").expect("zeros");
            assert_eq!((v.len(), v.iter().all(|v| v.to_bits() == 0)), (len, true));
        }
        assert!(try_zeros::<f64>(usize::MAX / 4, "x").is_err());
    }
}
