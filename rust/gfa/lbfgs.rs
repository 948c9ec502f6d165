//! A small L-BFGS maximiser for the smooth objectives of GFA (the rotation of the latent space, the
//! low-rank ARD parameters): two-loop recursion with memory 8 and a backtracking Armijo line search.
//! Variables are one nalgebra matrix of any shape (treated as a flat vector).

use nalgebra::DMatrix;

/// L-BFGS memory.
const MEMORY: usize = 8;

/// Maximise `eval` (value and gradient, or None where undefined, e.g. a singular rotation) from `x0`.
/// Returns (x, f(x) − f(x0)); x = x0 (gain 0) when no ascent step is found. None when f(x0) is undefined.
pub(crate) fn maximise(
    x0: DMatrix<f64>,
    eval: impl Fn(&DMatrix<f64>) -> Option<(f64, DMatrix<f64>)>,
    max_iter: usize,
) -> Option<(DMatrix<f64>, f64)> {
    let (f0, mut g) = eval(&x0)?;
    let (mut x, mut f) = (x0.clone(), f0);
    let mut history: Vec<(DMatrix<f64>, DMatrix<f64>, f64)> = Vec::new(); // (s, y, 1/yᵀs) for −f
    for _ in 0..max_iter {
        let direction = direction(&g, &history);
        let slope = g.dot(&direction);
        if slope.is_nan() || slope <= 0.0 {
            break;
        }
        let Some((f_new, g_new, x_new)) = line_search(&eval, &x, &direction, f, slope) else {
            break;
        };
        let s = &x_new - &x;
        let y = &g - &g_new; // gradient of −f changes by −(g_new − g)
        let ys = y.dot(&s);
        if ys > 1e-300 {
            if history.len() == MEMORY {
                history.remove(0);
            }
            history.push((s, y, 1.0 / ys));
        }
        let gain = f_new - f;
        (x, f, g) = (x_new, f_new, g_new);
        if gain <= 1e-12 * f.abs().max(1.0) || g.amax() <= 1e-9 * f.abs().max(1.0) {
            break;
        }
    }
    if f > f0 {
        Some((x, f - f0))
    } else {
        Some((x0, 0.0))
    }
}

/// The L-BFGS ascent direction H·g (two-loop recursion on −f; H₀ = γ I with γ = sᵀy/yᵀy, or
/// 1/max(1, ‖g‖) before any curvature pair).
fn direction(g: &DMatrix<f64>, history: &[(DMatrix<f64>, DMatrix<f64>, f64)]) -> DMatrix<f64> {
    let mut q = g.clone();
    let mut alphas = Vec::with_capacity(history.len());
    for (s, y, rho) in history.iter().rev() {
        let a = rho * s.dot(&q);
        q -= y * a;
        alphas.push(a);
    }
    match history.last() {
        Some((s, y, _)) => q *= s.dot(y) / y.dot(y),
        None => q /= g.norm().max(1.0), // first step: at most unit length
    }
    for ((s, y, rho), a) in history.iter().zip(alphas.into_iter().rev()) {
        let b = rho * y.dot(&q);
        q += s * (a - b);
    }
    q
}

/// Backtracking from step 1 until f(x + t·dir) ≥ f(x) + 1e-4 t slope; (f, ∇f, x) or None.
fn line_search(
    eval: &impl Fn(&DMatrix<f64>) -> Option<(f64, DMatrix<f64>)>,
    x: &DMatrix<f64>,
    direction: &DMatrix<f64>,
    f: f64,
    slope: f64,
) -> Option<(f64, DMatrix<f64>, DMatrix<f64>)> {
    let mut t = 1.0;
    for _ in 0..60 {
        let candidate = x + direction * t;
        if let Some((f_new, g_new)) = eval(&candidate) {
            if f_new >= f + 1e-4 * t * slope {
                return Some((f_new, g_new, candidate));
            }
        }
        t *= 0.5;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_maximum_of_a_concave_quadratic() {
        // f(x) = −½ (x − a)ᵀ Q (x − a), Q = diag(1, 10, 100): maximum 0 at a.
        let a = DMatrix::from_column_slice(3, 1, &[1.0, -2.0, 0.5]);
        let q = DMatrix::from_diagonal(&nalgebra::DVector::from_vec(vec![1.0, 10.0, 100.0]));
        let eval = |x: &DMatrix<f64>| {
            let d = x - &a;
            Some((-0.5 * (d.transpose() * &q * &d)[(0, 0)], -(&q * d)))
        };
        let (x, gain) = maximise(DMatrix::zeros(3, 1), eval, 200).expect("defined");
        assert!((&x - &a).amax() < 1e-6);
        assert!((gain - 0.5 * (a.transpose() * &q * &a)[(0, 0)]).abs() < 1e-9);
    }
}
