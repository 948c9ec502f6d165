"""Whole-data-set fitting: onlinefa.fit_minibatch against scikit-learn's FactorAnalysis and NumPy.

Run by hand (needs scikit-learn, e.g. from the test extra)::

    python benches/minibatch.py            # 10^5 x 1000, K = 10; real data; out-of-core memory
    python benches/minibatch.py --quick    # 2*10^4 x 500

Prints three tables: (1) synthetic FA data: time and relative covariance error of scikit-learn's batch fit,
of ``fit_minibatch`` and of the same mini-batch algorithm in NumPy (single-threaded BLAS, as the core uses
its own products); (2) real data with no download (scikit-learn's digits, standardised breast cancer, the
UCI sets shipped in the package): held-out average log-likelihood and time at K = 5 and 10; (3) peak
resident memory of ``fit_minibatch(path)`` on .npy files of two sizes, to show it does not grow with the
number of rows. Times are medians over ``--repeats`` runs in one process.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import onlinefa

BATCH_SIZE = 1000


def fa_data(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((d, k))
    psi = rng.uniform(0.5, 1.5, d)
    x = rng.standard_normal(d) + rng.standard_normal((n, k)) @ loadings.T + rng.standard_normal((n, d)) * np.sqrt(psi)
    return x, loadings @ loadings.T + np.diag(psi)


def numpy_minibatch(x: np.ndarray, k: int, seed: int, passes: int) -> tuple[np.ndarray, np.ndarray]:
    """The mini-batch algorithm of onlinefa.fit_minibatch in NumPy: whitened stepwise EM with
    ρ_t = (t + 1)^-0.6, the statistics averaged over the last half of the passes (windows restarting at passes
    1, 2, 3, 5, 9, ...), the result the M-step of the averages with the current Σ."""
    rng = np.random.default_rng(seed)
    mean, var = x.mean(axis=0), x.var(axis=0)
    scale = var.mean()
    f = np.linalg.qr(rng.standard_normal((x.shape[1], k)))[0] * np.sqrt(scale)
    psi = var.copy()
    a, b, dsq, t = np.zeros_like(f), np.zeros((k, k)), var.copy(), 0
    for p in range(passes):
        if p & (p - 1) == 0:
            avg_a, avg_b, avg_dsq, count = np.zeros_like(f), np.zeros((k, k)), np.zeros_like(var), 0
        order = rng.permutation(x.shape[0])
        for start in range(0, x.shape[0], BATCH_SIZE):
            dev = x[np.sort(order[start:start + BATCH_SIZE])] - mean
            t += 1
            rho = max((t + 1.0) ** -0.6, 1.0 / t)
            scaled = f / psi[:, None]
            sigma = np.linalg.inv(np.eye(k) + scaled.T @ f)
            m = dev @ (scaled @ sigma)
            a = (1 - rho) * a + rho * (dev.T @ m) / len(dev)
            b = (1 - rho) * b + rho * (m.T @ m) / len(dev)
            dsq = (1 - rho) * dsq + rho * (dev**2).mean(axis=0)
            count += 1
            avg_a, avg_b, avg_dsq = (avg + (new - avg) / count for avg, new in ((avg_a, a), (avg_b, b), (avg_dsq, dsq)))
            r_inv = np.linalg.inv(np.linalg.cholesky(sigma + b))
            a, b = a @ r_inv.T, r_inv @ b @ r_inv.T
            avg_a, avg_b = avg_a @ r_inv.T, r_inv @ avg_b @ r_inv.T
            f = a
            psi = np.maximum(dsq - np.sum(f * a, axis=1), 1e-10 * scale)
    sigma = np.linalg.inv(np.eye(k) + (f / psi[:, None]).T @ f)
    r_inv = np.linalg.inv(np.linalg.cholesky(sigma + avg_b))
    f = avg_a @ r_inv.T
    return f, np.maximum(avg_dsq - np.sum(f * f, axis=1), 1e-10 * scale)


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def relative_error(loadings: np.ndarray, psi: np.ndarray, cov: np.ndarray) -> float:
    return float(np.linalg.norm(loadings @ loadings.T + np.diag(psi) - cov) / np.linalg.norm(cov))


def synthetic_table(n: int, d: int, k: int, repeats: int) -> None:
    from sklearn.decomposition import FactorAnalysis
    from threadpoolctl import threadpool_limits

    x, cov = fa_data(n, d, k, 0)
    print(f"\n## Synthetic FA data: {n} x {d}, K = {k} (batch {BATCH_SIZE})\n")
    print("| fit | time (s) | × faster than scikit-learn | rel. covariance error | × scikit-learn's error | passes |")
    print("| --- | --- | --- | --- | --- | --- |")
    # scikit-learn and onlinefa both use every core (BLAS threads; the core's rayon pool); the NumPy
    # transcription is run with one BLAS thread as the single-core reference of the same algorithm.
    t_sk, fa = timed(lambda: FactorAnalysis(k, random_state=0).fit(x), 1)
    e_sk = relative_error(fa.components_.T, fa.noise_variance_, cov)  # type: ignore[attr-defined]
    print(f"| scikit-learn FactorAnalysis({k}).fit | {t_sk:.2f} | 1.0 | {e_sk:.4f} | 1.00 | {fa.n_iter_} |")  # type: ignore[attr-defined]
    t_mb, (model, history) = timed(lambda: onlinefa.fit_minibatch(x, k, batch_size=BATCH_SIZE, random_state=0),
                                   repeats)  # type: ignore[misc]
    e_mb = relative_error(model.loadings, model.noise_variance, cov)
    print(f"| onlinefa.fit_minibatch | {t_mb:.2f} | {t_sk / t_mb:.1f} | {e_mb:.4f} | {e_mb / e_sk:.2f} | "
          f"{history.n_passes} |")
    with threadpool_limits(1):
        t_np, (f, psi) = timed(lambda: numpy_minibatch(x, k, 0, history.n_passes), 1)  # type: ignore[misc]
        e_np = relative_error(f, psi, cov)
        print(f"| same algorithm in NumPy (1 BLAS thread) | {t_np:.2f} | {t_sk / t_np:.1f} | {e_np:.4f} | "
              f"{e_np / e_sk:.2f} | {history.n_passes} |")


DEFAULT_FIT_SIZES = ((100_000, 1000, 10), (20_000, 500, 10), (5000, 200, 5), (2000, 50, 5), (1000, 30, 3))


def default_fit_table(sizes: tuple[tuple[int, int, int], ...], seeds: tuple[int, ...], batch_size: int = 256) -> None:
    """``OnlineFactorAnalysis(K, batch_size=B).fit(X)`` with its defaults (``max_iter="auto"``) against one
    pass (``max_iter=1``, the default before) and scikit-learn's ``FactorAnalysis(K).fit``, on FA-model data."""
    from sklearn.decomposition import FactorAnalysis

    print(f"\n### Default fit: OnlineFactorAnalysis(K, batch_size={batch_size}).fit(X), FA-model data, seeds {list(seeds)}\n")
    print("| N x D, K | scikit-learn error | one pass (max_iter=1): × sklearn | default: × sklearn (worst) | "
          "default passes | default time (s) | scikit-learn time (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, d, k in sizes:
        e_sk, r_one, r_def, passes, t_def, t_sk = [], [], [], [], [], []
        for seed in seeds:
            x, cov = fa_data(n, d, k, seed)
            start = time.perf_counter()
            fa = FactorAnalysis(k, random_state=seed).fit(x)
            t_sk.append(time.perf_counter() - start)
            e_sk.append(relative_error(fa.components_.T, fa.noise_variance_, cov))
            one = onlinefa.OnlineFactorAnalysis(k, batch_size=batch_size, max_iter=1, random_state=seed).fit(x)
            r_one.append(relative_error(one.components_.T, one.noise_variance_, cov) / e_sk[-1])
            start = time.perf_counter()
            default = onlinefa.OnlineFactorAnalysis(k, batch_size=batch_size, random_state=seed).fit(x)
            t_def.append(time.perf_counter() - start)
            r_def.append(relative_error(default.components_.T, default.noise_variance_, cov) / e_sk[-1])
            passes.append(default.n_iter_)
        print(f"| {n} x {d}, {k} | {np.mean(e_sk):.4f} | {np.mean(r_one):.2f} | {np.mean(r_def):.2f} ({max(r_def):.2f}) | "
              f"{'/'.join(map(str, passes))} | {np.median(t_def):.2f} | {np.median(t_sk):.2f} |", flush=True)


def real_sets() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_breast_cancer, load_digits

    from onlinefa._uci import UCI_DATASETS, load_uci

    cancer = load_breast_cancer().data
    sets = {"digits": load_digits().data.astype(np.float64),
            "breast_cancer (standardised)": (cancer - cancer.mean(0)) / cancer.std(0)}
    for name in UCI_DATASETS:
        features, _ = load_uci(name)
        sets[f"UCI {name} (standardised)"] = (features - features.mean(0)) / np.maximum(features.std(0), 1e-12)
    return sets


def real_table(repeats: int) -> None:
    from sklearn.decomposition import FactorAnalysis

    print("\n## Real data, held-out average log-likelihood (80/20 split, seed 0; onlinefa with seeds 0, 1, 2)\n")
    print("| data | K | scikit-learn score | onlinefa score (mean) | relative gap (mean) | worst gap | "
          "scikit-learn (s) | onlinefa (s) | passes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, data in real_sets().items():
        rng = np.random.default_rng(0)
        order = rng.permutation(len(data))
        cut = int(0.8 * len(data))
        train, test = data[order[:cut]], data[order[cut:]]
        # Features constant in the training rows (digits' border pixels) get ψ at each method's floor
        # (1e-12 absolute in scikit-learn, 1e-10 σ̂² here), and that arbitrary number then dominates both
        # scores; they are dropped so that the comparison is about the fitted model.
        keep = train.var(axis=0) > 0
        train, test = train[:, keep], test[:, keep]
        for k in (5, 10):
            if k >= data.shape[1]:
                continue
            t_sk, fa = timed(lambda: FactorAnalysis(k, random_state=0).fit(train), repeats)  # noqa: B023
            theirs = float(fa.score(test))  # type: ignore[attr-defined]
            batch = max(32, min(BATCH_SIZE, len(train) // 50))
            scores, times, passes = [], [], []
            for seed in range(3):
                t_mb, (model, history) = timed(lambda: onlinefa.fit_minibatch(  # noqa: B023
                    train, k, batch_size=batch, max_iter=100, random_state=seed), repeats)  # type: ignore[misc]  # noqa: B023
                scores.append(float(model.log_prob(test).mean()))
                times.append(t_mb)
                passes.append(history.n_passes)  # type: ignore[attr-defined]
            gaps = [(theirs - ours) / abs(theirs) for ours in scores]
            print(f"| {name} | {k} | {theirs:.3f} | {np.mean(scores):.3f} | {np.mean(gaps):+.2%} | "
                  f"{max(gaps):+.2%} | {t_sk:.3f} | {np.median(times):.3f} | {'/'.join(map(str, passes))} |")


def peak_memory_mib(path: Path) -> float:
    # VmHWM (this process's resident high-water mark, reset by exec) rather than ru_maxrss, which Linux
    # carries over from the parent across fork + exec.
    code = ("import onlinefa, sys; onlinefa.fit_minibatch(sys.argv[1], 10, max_iter=2, tol=0, random_state=0); "
            "print([int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0] / 1024)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


def memory_table(d: int, rows: tuple[int, ...]) -> None:
    print(f"\n## Out of core: peak resident memory of fit_minibatch(path), D = {d}, K = 10, 2 passes\n")
    print("| rows | file (MiB) | peak resident (MiB) |")
    print("| --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for n in rows:
            path = Path(tmp) / f"x{n}.npy"
            mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
            for start in range(0, n, 10_000):
                stop = min(n, start + 10_000)
                mapped[start:stop] = fa_data(stop - start, d, 10, start)[0]
            mapped.flush()
            del mapped
            print(f"| {n} | {path.stat().st_size / 2**20:.0f} | {peak_memory_mib(path):.0f} |")
            path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--default-fit-only", action="store_true", help="only the table of the default fit")
    args = parser.parse_args()
    if args.default_fit_only:
        default_fit_table(DEFAULT_FIT_SIZES, (0, 1, 2))
        return
    print(f"# onlinefa mini-batch benchmark — {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, numpy {np.__version__}")
    n, d = (20_000, 500) if args.quick else (100_000, 1000)
    synthetic_table(n, d, 10, args.repeats)
    real_table(args.repeats)
    memory_table(500, (50_000, 200_000) if args.quick else (100_000, 400_000))
    default_fit_table(DEFAULT_FIT_SIZES[1:] if args.quick else DEFAULT_FIT_SIZES, (0, 1, 2))


if __name__ == "__main__":
    main()
