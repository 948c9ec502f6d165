"""Smoke test of an installed onlinefa wheel (run by .ci/run in a fresh virtualenv with only the wheel and
NumPy installed, and no Rust toolchain on PATH).

Checks that the compiled core is the stable-ABI (abi3) extension of the installed wheel, not a file of a
source tree; that ``import onlinefa`` pulls in neither torch, SciPy nor scikit-learn; fits a small
``OnlineEM`` and the scikit-learn-style estimator on data from a known factor model and compares their log
densities with a dense NumPy evaluation of the same Gaussian; round-trips both through ``save``/``load``
and ``onlinefa.load``; imports every module; prints the versions. Usage: ``python wheel_smoke.py WORKDIR`` (checkpoints go there).
"""

from __future__ import annotations

import importlib
import pkgutil
import platform
import sys
import sysconfig
from pathlib import Path

import numpy as np

import onlinefa
from onlinefa import _core

D, K, T = 40, 3, 2000


def dense_log_density(X: np.ndarray, mean: np.ndarray, loadings: np.ndarray, psi: np.ndarray) -> np.ndarray:
    """log N(x | c, F Fᵀ + diag ψ) by a Cholesky factor of the dense D×D covariance (an independent path)."""
    chol = np.linalg.cholesky(loadings @ loadings.T + np.diag(psi))
    z = np.linalg.solve(chol, (X - mean).T)
    log_det = 2.0 * np.log(np.diag(chol)).sum()
    return -0.5 * (X.shape[1] * np.log(2 * np.pi) + log_det + (z * z).sum(axis=0))


def check_installed_core() -> None:
    core = Path(_core.__file__).resolve()
    site = Path(sysconfig.get_paths()["platlib"]).resolve()
    assert core.name.endswith(".abi3.so") or core.suffix == ".pyd", f"not a stable-ABI extension: {core}"
    assert site in core.parents, f"onlinefa._core comes from {core}, not from this environment's {site}"
    heavy = sorted({"torch", "scipy", "sklearn"} & set(sys.modules))
    assert not heavy, f"import onlinefa imported {heavy}"


#: Optional dependencies (extras) that this NumPy-only environment lacks on purpose.
OPTIONAL = {"torch", "scipy", "sklearn", "matplotlib", "tqdm"}


def check_every_module_imports() -> None:
    """Import every module of the package (catches syntax or standard-library use newer than the oldest
    supported Python); a module may fail only for want of an optional dependency."""
    for module in pkgutil.walk_packages(onlinefa.__path__, "onlinefa."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as err:
            if (err.name or "").split(".")[0] not in OPTIONAL:
                raise


def factor_data(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((D, K))
    psi = rng.uniform(0.2, 1.0, D)
    return 3.0 + rng.standard_normal((T, K)) @ loadings.T + np.sqrt(psi) * rng.standard_normal((T, D))


def check_online_em(X: np.ndarray, workdir: Path) -> None:
    em = onlinefa.OnlineEM(D, K, seed=0)
    for batch in np.array_split(X, 20):
        em.update(batch)
    assert em.n_seen == T
    mean, loadings, psi = em.snapshot()
    np.testing.assert_allclose(mean, X.mean(axis=0), rtol=1e-10, atol=1e-10)  # the exact running mean
    np.testing.assert_allclose(em.log_prob(X[:50]), dense_log_density(X[:50], mean, loadings, psi), rtol=1e-8)
    path = workdir / "em.npz"
    em.save(path)
    for loaded in (onlinefa.OnlineEM.load(path), onlinefa.load(path)):
        assert type(loaded) is onlinefa.OnlineEM and loaded.n_seen == T
        for got, want in zip(loaded.snapshot(), (mean, loadings, psi)):
            np.testing.assert_array_equal(got, want)
    print(f"OnlineEM: {T} samples, D = {D}, K = {K}, mean log density {em.log_prob(X).mean():.3f}")


def check_estimator(X: np.ndarray, workdir: Path) -> None:
    fa = onlinefa.OnlineFactorAnalysis(K, random_state=0).fit(X)
    assert fa.components_.shape == (K, D) and fa.transform(X[:5]).shape == (5, K)
    dense = dense_log_density(X[:50], fa.mean_, fa.components_.T, fa.noise_variance_)
    np.testing.assert_allclose(fa.score_samples(X[:50]), dense, rtol=1e-8)
    path = workdir / "estimator.npz"
    fa.save(path)
    loaded = onlinefa.load(path)
    assert type(loaded) is onlinefa.OnlineFactorAnalysis
    np.testing.assert_array_equal(loaded.components_, fa.components_)
    print(f"OnlineFactorAnalysis: score {fa.score(X):.3f}")


def main() -> int:
    workdir = Path(sys.argv[1])
    check_installed_core()
    X = factor_data(seed=1)
    check_online_em(X, workdir)
    check_estimator(X, workdir)
    check_every_module_imports()
    print(f"onlinefa {onlinefa.__version__} ({Path(_core.__file__).name}), numpy {np.__version__}, "
          f"Python {platform.python_version()} ({sys.executable})")
    print("wheel smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
