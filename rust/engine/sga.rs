//! The online-SGA pass on the engine: the code path chosen once per model ([`SgaPath`]), resolved per pass
//! with that pass's constants ([`SgaPass`]), and run over blocks of rows.

use super::isa::Isa;
use super::sga_kernel::{SgaBlockIo, SgaConsts, SgaRowKernel, SgaStep};
use super::sga_wide::{SgaWide, SgaWideScratch};
use crate::scalar::Real;

/// Which kernel runs a model's passes after warm-up: the row kernel (K ≤ 16) or the wide one, each on a code
/// path chosen for this CPU. A function of (K, CPU) only, so it is not part of a model's value: any two paths
/// compare equal.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SgaPath<T: Real> {
    Rows(SgaRowKernel<T>),
    Wide(Isa),
}

impl<T: Real> PartialEq for SgaPath<T> {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl<T: Real> SgaPath<T> {
    /// The best path on this CPU for K = `k`.
    pub(crate) fn detect(k: usize) -> Self {
        Self::with(k, Isa::detect())
    }

    /// The path for K = `k` on code path `isa` (the row kernel for K ≤ 16, else the wide kernel).
    pub(crate) fn with(k: usize, isa: Isa) -> Self {
        match SgaRowKernel::select(k, isa) {
            Some(kernel) => SgaPath::Rows(kernel),
            None => SgaPath::Wide(isa),
        }
    }

    /// Resolve for one pass of K = `k` with the pending step, if any.
    pub(crate) fn for_pass(&self, k: usize, step: Option<&SgaStep<'_>>) -> SgaPass<T> {
        match self {
            SgaPath::Rows(kernel) => SgaPass::Rows(*kernel),
            SgaPath::Wide(isa) => SgaPass::Wide(SgaWide::new::<T>(k, step, *isa)),
        }
    }
}

/// One pass's kernel, with the constants it prepares once per pass (P tiled for the wide kernel).
pub(crate) enum SgaPass<T: Real> {
    Rows(SgaRowKernel<T>),
    Wide(SgaWide),
}

impl<T: Real> SgaPass<T> {
    /// Run the pass on the rows of `io` (nb = `io.mean.len()` rows); `wide` is the wide kernel's scratch
    /// (three f64 buffers of equal length, used as f32 buffers for f32 state; the wide kernel sizes its
    /// sub-blocks to them).
    pub(crate) fn run(&self, c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, wide: &mut SgaWideScratch<'_>) {
        match self {
            SgaPass::Rows(kernel) => {
                let nb = io.mean.len();
                kernel.run(c, io, nb)
            }
            SgaPass::Wide(kernel) => kernel.run(c, io, wide),
        }
    }
}
