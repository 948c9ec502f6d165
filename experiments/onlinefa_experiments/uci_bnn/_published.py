"""Published results of the UCI regression benchmark (test log-likelihood and RMSE, mean ± s.e.).

Sources:

* SLANG (L = 1) and Bayes by backprop: Mishkin, Kunstner, Nielsen, Schmidt and Khan, "SLANG: Fast
  Structured Covariance Approximations for Bayesian Deep Learning with Natural Gradient" (NeurIPS 2018),
  the UCI results of the paper's public code;
* MC dropout: Gal and Ghahramani, "Dropout as a Bayesian Approximation: Representing Model Uncertainty
  in Deep Learning" (ICML 2016), the "grid search" results of the authors' public experiment code;
* deep ensembles (5 networks) and PBP: Lakshminarayanan, Pritzel and Blundell, "Simple and Scalable
  Predictive Uncertainty Estimation using Deep Ensembles" (NeurIPS 2017), Table 1 (whose ± mixes
  standard deviations and standard errors); PBP there from Hernández-Lobato and Adams (ICML 2015).

Values are (mean, ±) per data set; ``None`` where a source reports nothing.
"""

from __future__ import annotations

#: Column labels, in table order.
PUBLISHED_METHODS: tuple[str, ...] = ("SLANG (L=1)", "Bayes by backprop", "MC dropout (grid)",
                                      "Deep ensembles (5)", "PBP")

Entry = tuple[float, float] | None

#: Test log-likelihood per point (higher is better).
PUBLISHED_LL: dict[str, tuple[Entry, ...]] = {
    "boston": ((-2.58, 0.05), (-2.66, 0.06), (-2.40, 0.04), (-2.41, 0.25), (-2.57, 0.09)),
    "concrete": ((-3.13, 0.03), (-3.25, 0.02), (-2.93, 0.02), (-3.06, 0.18), (-3.16, 0.02)),
    "energy": ((-1.12, 0.01), (-1.45, 0.10), (-1.21, 0.01), (-1.38, 0.22), (-2.04, 0.02)),
    "yacht": ((-1.88, 0.01), (-1.56, 0.02), (-1.25, 0.01), (-1.18, 0.21), (-1.63, 0.02)),
    "naval": ((4.76, 0.00), (4.61, 0.01), (4.45, 0.00), (5.63, 0.05), (3.73, 0.01)),
}

#: Test RMSE in the target's units (lower is better).
PUBLISHED_RMSE: dict[str, tuple[Entry, ...]] = {
    "boston": ((3.21, 0.19), (3.43, 0.20), (2.90, 0.18), (3.28, 1.00), (3.01, 0.18)),
    "concrete": ((5.58, 0.19), (6.16, 0.13), (4.82, 0.16), (6.03, 0.58), (5.67, 0.09)),
    "energy": ((0.64, 0.03), (0.97, 0.09), (0.54, 0.06), (2.09, 0.29), (1.80, 0.05)),
    "yacht": ((1.08, 0.06), (1.13, 0.06), (0.67, 0.05), (1.58, 0.48), (1.02, 0.05)),
}
