//! ln Γ and the digamma function ψ for positive arguments, and the Gamma-distribution expectations the
//! VB-FA bound needs. (The crate has no special-function dependency; these are the textbook recurrence +
//! Stirling/asymptotic series, accurate to a few ulps·|value| for x ≥ 1e-300.)

/// Shift the argument up to at least this value before using the asymptotic series.
const ASYMPTOTIC_FROM: f64 = 10.0;

/// ln Γ(x) for x > 0.
///
/// ln Γ(x) = ln Γ(x + n) − Σ_{i<n} ln(x + i) with x + n ≥ 10, then Stirling's series
/// ln Γ(z) = (z − ½) ln z − z + ½ ln 2π + 1/(12z) − 1/(360z³) + 1/(1260z⁵) − 1/(1680z⁷) + 1/(1188z⁹)
/// − 691/(360360z¹¹).
pub fn ln_gamma(x: f64) -> f64 {
    let mut z = x;
    let mut shift = 0.0;
    while z < ASYMPTOTIC_FROM {
        shift += z.ln();
        z += 1.0;
    }
    let inv = 1.0 / z;
    let inv2 = inv * inv;
    let series = inv
        * (1.0 / 12.0
            - inv2
                * (1.0 / 360.0
                    - inv2
                        * (1.0 / 1260.0 - inv2 * (1.0 / 1680.0 - inv2 * (1.0 / 1188.0 - inv2 * 691.0 / 360_360.0)))));
    (z - 0.5) * z.ln() - z + 0.5 * (2.0 * std::f64::consts::PI).ln() + series - shift
}

/// Digamma ψ(x) = d ln Γ(x)/dx for x > 0.
///
/// ψ(x) = ψ(x + n) − Σ_{i<n} 1/(x + i) with x + n ≥ 10, then
/// ψ(z) = ln z − 1/(2z) − 1/(12z²) + 1/(120z⁴) − 1/(252z⁶) + 1/(240z⁸) − 1/(132z¹⁰) + 691/(32760z¹²).
pub fn digamma(x: f64) -> f64 {
    let mut z = x;
    let mut shift = 0.0;
    while z < ASYMPTOTIC_FROM {
        shift += 1.0 / z;
        z += 1.0;
    }
    let inv = 1.0 / z;
    let inv2 = inv * inv;
    let series = inv2
        * (1.0 / 12.0
            - inv2
                * (1.0 / 120.0
                    - inv2 * (1.0 / 252.0 - inv2 * (1.0 / 240.0 - inv2 * (1.0 / 132.0 - inv2 * 691.0 / 32760.0)))));
    z.ln() - 0.5 * inv - series - shift
}

/// A Gamma(shape a, rate b) factor q(x) = G(x | a, b): ⟨x⟩ = a/b, ⟨ln x⟩ = ψ(a) − ln b.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GammaQ {
    /// Shape a > 0.
    pub shape: f64,
    /// Rate b > 0.
    pub rate: f64,
}

impl GammaQ {
    /// ⟨x⟩ = a/b.
    pub fn mean(&self) -> f64 {
        self.shape / self.rate
    }

    /// ⟨ln x⟩ = ψ(a) − ln b.
    pub fn mean_log(&self) -> f64 {
        digamma(self.shape) - self.rate.ln()
    }

    /// E_q[ln G(x | a₀, b₀)] + H[q]: the Gamma part of the bound for one precision with prior G(a₀, b₀).
    ///
    /// E_q ln G(x | a₀, b₀) = a₀ ln b₀ − ln Γ(a₀) + (a₀ − 1)(ψ(a) − ln b) − b₀ a/b,
    /// H[G(a, b)] = a − ln b + ln Γ(a) + (1 − a) ψ(a).
    pub fn prior_plus_entropy(&self, prior_shape: f64, prior_rate: f64) -> f64 {
        let (a, b) = (self.shape, self.rate);
        let expected_log_prior = prior_shape * prior_rate.ln() - ln_gamma(prior_shape)
            + (prior_shape - 1.0) * self.mean_log()
            - prior_rate * self.mean();
        let entropy = a - b.ln() + ln_gamma(a) + (1.0 - a) * digamma(a);
        expected_log_prior + entropy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_matches_known_values() {
        // Γ(n) = (n−1)!, Γ(½) = √π, and the reflection-free small-argument limit ln Γ(x) ≈ −ln x − γx.
        let cases = [
            (1.0, 0.0),
            (2.0, 0.0),
            (5.0, 24f64.ln()),
            (0.5, std::f64::consts::PI.sqrt().ln()),
            (30.0, 71.257_038_967_168_01),
        ];
        for (x, expected) in cases {
            assert!(
                (ln_gamma(x) - expected).abs() < 1e-13 * expected.abs().max(1.0),
                "lnΓ({x})"
            );
        }
        let euler = 0.577_215_664_901_532_9;
        let x = 1e-5;
        assert!((ln_gamma(x) - (-x.ln() - euler * x)).abs() < 1e-9);
    }

    #[test]
    fn digamma_matches_known_values_and_derivative() {
        let euler = 0.577_215_664_901_532_9;
        assert!((digamma(1.0) + euler).abs() < 1e-14);
        assert!((digamma(0.5) + euler + 2.0 * 2f64.ln()).abs() < 1e-14);
        // ψ(x + 1) = ψ(x) + 1/x and a central difference of ln Γ.
        for &x in &[1e-5, 0.3, 2.5, 17.0, 1e4] {
            assert!((digamma(x + 1.0) - digamma(x) - 1.0 / x).abs() < 1e-12 * (1.0 / x).max(1.0));
            let h = 1e-5 * x.max(1e-3);
            let numeric = (ln_gamma(x + h) - ln_gamma(x - h)) / (2.0 * h);
            assert!(
                (numeric - digamma(x)).abs() < 1e-6 * digamma(x).abs().max(1.0),
                "ψ({x})"
            );
        }
    }

    #[test]
    fn gamma_bound_is_minus_kl_and_zero_at_the_prior() {
        // E ln p + H = −KL(q‖p) ≤ 0, with equality when q = p.
        let q = GammaQ { shape: 3.0, rate: 2.0 };
        assert!(q.prior_plus_entropy(3.0, 2.0).abs() < 1e-13);
        assert!(q.prior_plus_entropy(1.0, 0.5) < 0.0);
    }
}
