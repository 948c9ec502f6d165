//! The one dispatch on K of every kernel specialised for K ≤ [`MAX_K`] (the EM and SGA row kernels, the block
//! products, VIFA's fused kernels; the EM row kernel up to [`MAX_K_EXTENDED`]): a run-time K becomes a
//! compile-time constant once, when a model picks its kernel, so no kernel branches on K per row.

/// Largest K with kernels specialised on K; larger K run the register-tiled wide paths.
pub(crate) const MAX_K: usize = 16;

/// Largest K of the extended dispatch (`for_k!(extended ...)`), used by the online-EM row kernel alone: at
/// K = 17–20 (SWAG's rank 20 among them) it measured faster than the wide path. The other kernels stop at
/// [`MAX_K`], so the extra expansions cost compile time only where they pay.
pub(crate) const MAX_K_EXTENDED: usize = 20;

/// Expand `$body` once per K = 1 … [`MAX_K`] with the const `$k` bound to the value of `$n`, and evaluate
/// `$other` for any other value (without it, any other value is a bug of the caller).
macro_rules! for_k {
    ($n:expr, $k:ident => $body:expr, _ => $other:expr) => {
        match $n {
            1 => {
                const $k: usize = 1;
                $body
            }
            2 => {
                const $k: usize = 2;
                $body
            }
            3 => {
                const $k: usize = 3;
                $body
            }
            4 => {
                const $k: usize = 4;
                $body
            }
            5 => {
                const $k: usize = 5;
                $body
            }
            6 => {
                const $k: usize = 6;
                $body
            }
            7 => {
                const $k: usize = 7;
                $body
            }
            8 => {
                const $k: usize = 8;
                $body
            }
            9 => {
                const $k: usize = 9;
                $body
            }
            10 => {
                const $k: usize = 10;
                $body
            }
            11 => {
                const $k: usize = 11;
                $body
            }
            12 => {
                const $k: usize = 12;
                $body
            }
            13 => {
                const $k: usize = 13;
                $body
            }
            14 => {
                const $k: usize = 14;
                $body
            }
            15 => {
                const $k: usize = 15;
                $body
            }
            16 => {
                const $k: usize = 16;
                $body
            }
            _ => $other,
        }
    };
    (extended $n:expr, $k:ident => $body:expr, _ => $other:expr) => {
        match $n {
            17 => {
                const $k: usize = 17;
                $body
            }
            18 => {
                const $k: usize = 18;
                $body
            }
            19 => {
                const $k: usize = 19;
                $body
            }
            20 => {
                const $k: usize = 20;
                $body
            }
            n => $crate::engine::k_dispatch::for_k!(n, $k => $body, _ => $other),
        }
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
