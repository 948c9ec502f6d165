"""Batch maximum-likelihood factor analysis of a sample covariance, in NumPy (the demo's reference).

The EM algorithm for factor analysis (Rubin and Thayer, "EM algorithms for ML factor analysis", 1982;
Ghahramani and Hinton, "The EM algorithm for mixtures of factor analyzers", 1996, eqs. 5-6) needs the data
only through their covariance S, so one D×D matrix is formed once and every iteration costs O(D²K):

    M = I + Fᵀ Ψ⁻¹ F,   β = M⁻¹ Fᵀ Ψ⁻¹ (= Fᵀ C⁻¹, C = F Fᵀ + Ψ),
    F ← S βᵀ (I − β F + β S βᵀ)⁻¹,   ψ ← diag(S) − rowsum(F ⊙ S βᵀ).

It starts from probabilistic PCA (Tipping and Bishop 1999, eq. 7) on the top-K eigenpairs of S, found by
subspace iteration, and stops when ten iterations raise the average log-likelihood L by less than
``10 · tol · |L|`` nats per sample (the likelihood is evaluated every tenth iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["BatchFA", "batch_fa", "fa_log_likelihood"]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class BatchFA:
    """Result of :func:`batch_fa`: the fitted F and ψ, the average log-likelihood, the iterations run."""

    loadings: FloatArray
    noise_variance: FloatArray
    log_likelihood: float
    n_iter: int
    converged: bool

    def covariance(self) -> FloatArray:
        """F Fᵀ + Ψ, shape (D, D)."""
        cov = self.loadings @ self.loadings.T
        cov[np.diag_indices_from(cov)] += self.noise_variance
        return cov


def _top_eigenpairs(cov: FloatArray, k: int, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
    """Top-``k`` eigenpairs of the symmetric PSD ``cov`` by subspace iteration with Rayleigh-Ritz."""
    d = cov.shape[0]
    width = min(d, k + 10)
    q = np.linalg.qr(rng.standard_normal((d, width)))[0]
    for _ in range(30):
        q = np.linalg.qr(cov @ q)[0]
    values, vectors = np.linalg.eigh(q.T @ cov @ q)
    order = np.argsort(values)[::-1][:k]
    return values[order], q @ vectors[:, order]


def fa_log_likelihood(cov: FloatArray, loadings: FloatArray, noise_variance: FloatArray) -> float:
    """Average Gaussian log-likelihood of samples with covariance ``cov`` under N(·, F Fᵀ + Ψ) (Woodbury).

    Parameters
    ----------
    cov : ndarray of shape (D, D)
        The samples' covariance (about their own mean, divided by the number of samples).
    loadings : ndarray of shape (D, K)
    noise_variance : ndarray of shape (D,)

    Returns
    -------
    float
        −½ (D log 2π + log det C + tr(C⁻¹ S)) with C = F Fᵀ + Ψ.
    """
    d, k = loadings.shape
    scaled = loadings / noise_variance[:, None]
    m = np.eye(k) + loadings.T @ scaled
    chol = np.linalg.cholesky(m)
    logdet = float(np.sum(np.log(noise_variance)) + 2.0 * np.sum(np.log(np.diag(chol))))
    # tr(C⁻¹ S) = tr(Ψ⁻¹ S) − tr(M⁻¹ Fᵀ Ψ⁻¹ S Ψ⁻¹ F)
    w = np.linalg.solve(chol, (cov @ scaled).T @ scaled)
    trace = float(np.sum(np.diag(cov) / noise_variance) - np.trace(np.linalg.solve(chol.T, w)))
    return float(-0.5 * (d * np.log(2.0 * np.pi) + logdet + trace))


def batch_fa(cov: FloatArray, n_components: int, *, max_iter: int = 500, tol: float = 1e-8,
             seed: int = 0) -> BatchFA:
    """Maximum-likelihood factor analysis of the sample covariance ``cov`` by batch EM.

    Parameters
    ----------
    cov : ndarray of shape (D, D)
        Sample covariance (divided by the number of samples: the ML normalisation).
    n_components : int
        K.
    max_iter : int, default=500
        Largest number of EM iterations.
    tol : float, default=1e-8
        Relative tolerance: stop when ten iterations raise the average log-likelihood L by less than
        ``10 · tol · |L|``.
    seed : int, default=0
        Seed of the subspace iteration's start.

    Returns
    -------
    BatchFA
    """
    d = cov.shape[0]
    k = n_components
    diag = np.diag(cov).copy()
    floor = 1e-12 * float(np.mean(diag))
    values, vectors = _top_eigenpairs(cov, k, np.random.default_rng(seed))
    sigma2 = max((float(np.sum(diag)) - float(np.sum(values))) / max(d - k, 1), floor)
    loadings = vectors * np.sqrt(np.maximum(values - sigma2, 0.0))
    psi = np.maximum(diag - np.sum(loadings**2, axis=1), floor)
    previous = fa_log_likelihood(cov, loadings, psi)
    converged = False
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        scaled = loadings / psi[:, None]
        m = np.eye(k) + loadings.T @ scaled
        beta = np.linalg.solve(m, scaled.T)  # K×D
        s_beta = cov @ beta.T  # D×K
        ezz = np.eye(k) - beta @ loadings + beta @ s_beta
        loadings = np.linalg.solve(ezz, s_beta.T).T
        psi = np.maximum(diag - np.sum(loadings * s_beta, axis=1), floor)
        if n_iter % 10 == 0 or n_iter == max_iter:
            current = fa_log_likelihood(cov, loadings, psi)
            gain, previous = current - previous, current
            if gain < 10.0 * tol * abs(current):
                converged = True
                break
    return BatchFA(loadings, psi, previous, n_iter, converged)
