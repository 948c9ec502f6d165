//! Which instruction set the row kernels run on, detected once at run time.
//!
//! Every row kernel is one generic source compiled several times: without target features (the portable
//! path, for any x86-64 and for aarch64), and on x86-64 with AVX2 or with AVX-512 (F and VL) enabled. A kernel picks its
//! lane count from the vector width (W = vector bytes / size of the storage type) and is resolved once per
//! model to a plain function, so no per-call dispatch remains.
//!
//! The environment variable `ONLINEFA_ISA` (`portable`, `avx2` or `avx512`), read once, caps the path chosen
//! (for comparing paths on one machine, or to avoid AVX-512 where it lowers the clock); results on every path
//! agree to rounding, and bit for bit where the lane counts match.

/// The `ONLINEFA_ISA` cap, read on first use.
static CAP: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();

/// A code path of the row kernels, ordered from the portable one up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The best path this CPU supports, within the `ONLINEFA_ISA` cap (found once: both are fixed for the
    /// process, and the block path asks for it per block).
    pub(crate) fn detect() -> Self {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| Self::allowed().last().copied().unwrap_or(Isa::Portable))
    }

    /// The paths this CPU supports up to the `ONLINEFA_ISA` cap (all of them without it).
    pub(crate) fn allowed() -> Vec<Self> {
        let cap = *CAP.get_or_init(|| std::env::var("ONLINEFA_ISA").ok().and_then(|name| Self::parse(&name)));
        Self::available()
            .into_iter()
            .filter(|isa| cap.is_none_or(|c| *isa <= c))
            .collect()
    }

    /// The path named `name` (case-insensitive), if this build knows it.
    fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "portable" => Some(Isa::Portable),
            #[cfg(target_arch = "x86_64")]
            "avx2" => Some(Isa::Avx2),
            #[cfg(target_arch = "x86_64")]
            "avx512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// Every path this CPU can run, from the portable one up (tests compare them against each other).
    pub(crate) fn available() -> Vec<Self> {
        let mut paths = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            // The tiled products of the wide paths fuse multiply-adds on both vector paths: they need FMA too.
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                paths.push(Isa::Avx2);
                // VL gives the 256-bit operations of the AVX-512 kernels the 32 vector registers (every AVX-512
                // CPU has it but the Xeon Phi, which then runs the AVX2 path).
                if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vl") {
                    paths.push(Isa::Avx512);
                }
            }
        }
        paths
    }

    /// Bytes per vector register on this path; a kernel runs at most this over the size of its type lanes (the
    /// online-EM kernel runs fewer on AVX-512, see `em_kernel::EmRowKernel`).
    /// The portable path uses 32 bytes, the width LLVM vectorises to on most targets.
    pub(crate) fn vector_bytes(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => 64,
            _ => 32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_paths_are_ordered() {
        assert_eq!(Isa::parse(" Portable "), Some(Isa::Portable));
        assert_eq!(Isa::parse("sse9"), None);
        let paths = Isa::available();
        assert_eq!(paths[0], Isa::Portable);
        assert!(paths.windows(2).all(|w| w[0] < w[1]));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(Isa::parse("AVX512"), Some(Isa::Avx512));
    }
}
