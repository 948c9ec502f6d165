//! ln of f64 in plain multiplies, adds and bit operations: no library call and no fused multiply-add, so a loop
//! over it runs in vector lanes and gives the same bits on every code path (the library's function is one call
//! per value and may differ between builds). It is within a few units in the last place of the library's
//! (tested).

/// 1.0's bits: f64::from_bits(ONE | f) − 1 = f·2⁻⁵² for f < 2⁵².
pub(crate) const ONE: u64 = 0x3ff0_0000_0000_0000;
/// The fraction field of an f64.
pub(crate) const FRACTION: u64 = (1 << 52) - 1;
/// ln 2 = LN2_HI + LN2_LO, the high part ln 2 with the low 21 bits of its fraction cleared, so that e · LN2_HI is
/// exact for |e| < 2²¹ (Cody and Waite's reduction), the low part the rest rounded to f64.
pub(crate) const LN2_HI: f64 = 0.693_147_180_369_123_8;
pub(crate) const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
const SQRT_2: f64 = std::f64::consts::SQRT_2;
/// 1/(2j + 3), j = 0 … 9: ln m = 2s (1 + s²/3 + s⁴/5 + … + s²⁰/21) with s = (m − 1)/(m + 1) (the atanh series).
const ATANH: [f64; 10] = [
    1.0 / 3.0,
    1.0 / 5.0,
    1.0 / 7.0,
    1.0 / 9.0,
    1.0 / 11.0,
    1.0 / 13.0,
    1.0 / 15.0,
    1.0 / 17.0,
    1.0 / 19.0,
    1.0 / 21.0,
];

/// Σ_j c[j] x^j by Horner's rule (highest power first).
#[inline(always)]
pub(crate) fn horner(x: f64, c: &[f64]) -> f64 {
    c.iter().rev().fold(0.0, |acc, &cj| acc * x + cj)
}

/// ln u for a positive normal u: u = 2ᵉ m with m ∈ [√½, √2), ln u = e ln 2 + 2 atanh s, s = (m − 1)/(m + 1),
/// |s| < 0.172, the series to s²¹.
#[inline(always)]
pub(crate) fn ln(u: f64) -> f64 {
    let bits = u.to_bits();
    // The exponent as a float (2⁵² + e + 1023 − 2⁵² − 1023), without an integer-to-float conversion.
    let biased = f64::from_bits(0x4330_0000_0000_0000 | (bits >> 52)) - 4_503_599_627_370_496.0;
    let mantissa = f64::from_bits(ONE | (bits & FRACTION));
    let high = mantissa > SQRT_2;
    let m = if high { mantissa * 0.5 } else { mantissa };
    let e = (biased - 1023.0) + if high { 1.0 } else { 0.0 };
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let atanh = s + s * (s2 * horner(s2, &ATANH));
    e * LN2_HI + (e * LN2_LO + 2.0 * atanh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_2_splits_into_an_exact_high_part_and_the_rest() {
        assert_eq!(LN2_HI.to_bits() & ((1 << 21) - 1), 0);
        assert_eq!(LN2_HI + LN2_LO, std::f64::consts::LN_2);
        assert!((LN2_LO / std::f64::consts::LN_2).abs() < 1e-9);
    }

    #[test]
    fn ln_is_within_a_few_units_of_the_library_logarithm() {
        let mut worst: f64 = 0.0;
        for i in 0..200_000u64 {
            // Fractions of every size from 2⁻⁵² to 1, around 1 and around √½, and large values.
            let u = 2.0 - f64::from_bits(ONE | (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 12));
            let near_one = 1.0 - (i + 1) as f64 * f64::EPSILON;
            for v in [
                u,
                u.powi(7).max(1e-300),
                near_one,
                SQRT_2 / 2.0 + i as f64 * 1e-12,
                1.0 / u,
            ] {
                let want = v.ln();
                // Absolute error near ln = 0, relative elsewhere.
                worst = worst.max((ln(v) - want).abs() / (want.abs().max(1.0) * f64::EPSILON));
            }
        }
        assert_eq!(ln(1.0), 0.0);
        assert!(worst < 4.0, "worst error {worst} units");
    }
}
