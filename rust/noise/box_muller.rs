//! Standard normals from uniform 64-bit words by the Box–Muller transform (Box and Muller, "A Note on the
//! Generation of Random Normal Deviates", Annals of Mathematical Statistics 29(2), 1958):
//!
//! ```text
//!   z₀ = r cos θ,  z₁ = r sin θ,  r = √(−2 ln u),  u ∈ (0, 1] and θ uniform over a period
//! ```
//!
//! give two independent standard normals. Word pair (a, b) gives u = 1 − 2⁻⁵² ⌊a / 2¹²⌋ ∈ (0, 1] (so |z| ≤
//! √(104 ln 2) ≈ 8.49) and θ = q π/2 + (t − ½) π/2, uniform over [−π/4, 7π/4), from the quadrant q = ⌊b / 2⁶²⌋
//! and t = 2⁻⁵² (b mod 2⁵²) ∈ [0, 1); the quadrant turns (cos φ, sin φ) of φ ∈ [−π/4, π/4) exactly.
//!
//! ln (`crate::lane_math`), sin and cos are polynomials of plain multiplies and adds (no library call, no fused
//! multiply-add), so the loop runs in vector lanes and every code path gives the same bits; their error is a few
//! units in the last place. sin and cos are their Taylor series to φ¹⁷ and φ¹⁶ on |φ| ≤ π/4 (next term
//! < 3·10⁻¹⁸).

use crate::lane_math::{horner, ln, FRACTION, ONE};

const FRAC_PI_2: f64 = std::f64::consts::FRAC_PI_2;

/// (−1)ʲ/(2j + 1)!, j = 1 … 8: sin φ = φ (1 + Σ_j SIN[j−1] φ²ʲ).
const SIN: [f64; 8] = [
    -1.0 / 6.0,
    1.0 / 120.0,
    -1.0 / 5_040.0,
    1.0 / 362_880.0,
    -1.0 / 39_916_800.0,
    1.0 / 6_227_020_800.0,
    -1.0 / 1_307_674_368_000.0,
    1.0 / 355_687_428_096_000.0,
];
/// (−1)ʲ/(2j)!, j = 1 … 8: cos φ = 1 + Σ_j COS[j−1] φ²ʲ.
const COS: [f64; 8] = [
    -1.0 / 2.0,
    1.0 / 24.0,
    -1.0 / 720.0,
    1.0 / 40_320.0,
    -1.0 / 3_628_800.0,
    1.0 / 479_001_600.0,
    -1.0 / 87_178_291_200.0,
    1.0 / 20_922_789_888_000.0,
];

/// (cos θ, sin θ) for θ = q π/2 + φ, q the top two bits of `b` and φ = (t − ½) π/2 from its low 52.
#[inline(always)]
fn cos_sin(b: u64) -> (f64, f64) {
    let t = f64::from_bits(ONE | (b & FRACTION)) - 1.0;
    let phi = (t - 0.5) * FRAC_PI_2;
    let p2 = phi * phi;
    let sin = phi + phi * (p2 * horner(p2, &SIN));
    let cos = 1.0 + p2 * horner(p2, &COS);
    // cos(qπ/2 + φ), sin(qπ/2 + φ): (c, s), (−s, c), (−c, −s), (s, −c) for q = 0 … 3.
    let q = b >> 62;
    let (c, s) = if q & 1 == 0 { (cos, sin) } else { (-sin, cos) };
    if q & 2 == 0 {
        (c, s)
    } else {
        (-c, -s)
    }
}

/// The two normals of word pair (a, b).
#[inline(always)]
pub(super) fn pair(a: u64, b: u64) -> (f64, f64) {
    let u = 2.0 - f64::from_bits(ONE | (a >> 12));
    let r = (-2.0 * ln(u)).sqrt();
    let (c, s) = cos_sin(b);
    (r * c, r * s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative error in units of 2⁻⁵² of `got` against `want` (absolute below 1).
    fn ulps(got: f64, want: f64) -> f64 {
        (got - want).abs() / (want.abs().max(1.0) * f64::EPSILON)
    }

    #[test]
    fn cos_sin_are_within_a_few_units_of_the_library_functions_in_every_quadrant() {
        let mut worst: f64 = 0.0;
        for i in 0..100_000u64 {
            let b = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let t = (b & FRACTION) as f64 / (1u64 << 52) as f64;
            let theta = (b >> 62) as f64 * FRAC_PI_2 + (t - 0.5) * FRAC_PI_2;
            let (c, s) = cos_sin(b);
            worst = worst.max(ulps(c, theta.cos())).max(ulps(s, theta.sin()));
        }
        assert!(worst < 4.0, "worst error {worst} units");
    }

    #[test]
    fn the_radius_runs_from_zero_to_its_largest_value() {
        // The extremes: u = 1 gives r = 0, u = 2⁻⁵² the largest radius.
        assert_eq!(pair(0, 0), (0.0, 0.0));
        let largest = pair(u64::MAX, 1 << 62).0.hypot(pair(u64::MAX, 1 << 62).1);
        assert!((largest - (104.0 * std::f64::consts::LN_2).sqrt()).abs() < 1e-14);
    }
}
