//! Which instruction set the row kernels run on, detected once at run time.
//!
//! Every row kernel is one generic source compiled several times: without target features (the portable
//! path, for any x86-64 and for aarch64), and on x86-64 with AVX2 or with AVX-512F enabled. A kernel picks its
//! lane count from the vector width (W = vector bytes / size of the storage type) and is resolved once per
//! model to a plain function, so no per-call dispatch remains.

/// A code path of the row kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The best path this CPU supports.
    pub(crate) fn detect() -> Self {
        Self::available().last().copied().unwrap_or(Isa::Portable)
    }

    /// Every path this CPU can run, from the portable one up (tests compare them against each other).
    pub(crate) fn available() -> Vec<Self> {
        let mut paths = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                paths.push(Isa::Avx2);
                if std::arch::is_x86_feature_detected!("avx512f") {
                    paths.push(Isa::Avx512);
                }
            }
        }
        paths
    }

    /// Bytes per vector register on this path: the lane count of a kernel is this over the size of its type.
    /// The portable path uses 32 bytes, the width LLVM vectorises to on most targets.
    #[allow(dead_code)] // kernels may pick fewer lanes than this, see `em_kernel::EmRowKernel`
    pub(crate) fn vector_bytes(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => 64,
            _ => 32,
        }
    }
}
