//! The one dispatch on K of every kernel specialised for K ≤ [`MAX_K`] (the EM and SGA row kernels, the block
//! products, VIFA's fused kernels; the EM row kernel and the queries' projections up to [`MAX_K_EXTENDED`]): a
//! run-time K becomes a compile-time constant once, when a model picks its kernel (or once per block of a
//! query), so no kernel branches on K per row.

/// Largest K with kernels specialised on K; larger K run the register-tiled wide paths.
pub(crate) const MAX_K: usize = 16;

/// Largest K of the extended dispatch (`for_k!(extended ...)`), used by the online-EM row kernel (at K = 17–24,
/// SWAG's rank 20 among them, it beats the wide path) and by the queries' per-sample projections (K
/// accumulators in registers). The other kernels stop at [`MAX_K`], so the extra expansions cost compile time
/// only where they pay.
pub(crate) const MAX_K_EXTENDED: usize = 24;

/// Expand `$body` once per K = 1 … [`MAX_K`] with the const `$k` bound to the value of `$n`, and evaluate
/// `$other` for any other value (without it, any other value is a bug of the caller). `for_k!(extended ...)`
/// expands K = 1 … [`MAX_K_EXTENDED`] instead.
macro_rules! for_k {
    (@arms $n:expr, $k:ident => $body:expr, _ => $other:expr; $($value:literal)*) => {
        match $n {
            $(
                $value => {
                    const $k: usize = $value;
                    $body
                }
            )*
            _ => $other,
        }
    };
    (extended $n:expr, $k:ident => $body:expr, _ => $other:expr) => {
        $crate::engine::k_dispatch::for_k!(@arms $n, $k => $body, _ => $other;
            1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
    };
    ($n:expr, $k:ident => $body:expr, _ => $other:expr) => {
        $crate::engine::k_dispatch::for_k!(@arms $n, $k => $body, _ => $other;
            1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    };
    ($n:expr, $k:ident => $body:expr) => {
        $crate::engine::k_dispatch::for_k!($n, $k => $body, _ => unreachable!("the caller checks K <= MAX_K"))
    };
}

pub(crate) use for_k;

#[cfg(test)]
mod tests {
    #[test]
    fn every_k_up_to_max_k_becomes_its_constant() {
        for n in 0..=super::MAX_K_EXTENDED + 2 {
            let got = for_k!(n, K => Some(K), _ => None);
            assert_eq!(got, (1..=super::MAX_K).contains(&n).then_some(n));
            let extended = for_k!(extended n, K => Some(K), _ => None);
            assert_eq!(extended, (1..=super::MAX_K_EXTENDED).contains(&n).then_some(n));
        }
    }
}
