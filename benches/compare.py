"""Benchmark onlinefa against a competent NumPy implementation and the memory-bandwidth floor.

Run by hand (needs scikit-learn for its comparison, e.g. from the test extra)::

    python benches/compare.py            # full table (several minutes)
    python benches/compare.py --quick    # smaller sizes

Everything is measured in one process on the same data; the table reports medians and ratios. The per-update
grid of every streaming model (EM, SGA, VIFA; D ∈ {10⁵, 10⁶, 10⁷}, K ∈ {1, 10, 50}, float64 and float32) with
its floors and NumPy ratio is ``benches/engine.py``, whose NumPy transcriptions live here and in
``benches/vifa.py``; ``cargo bench --bench updates`` measures the same grid against a Rust floor.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from datetime import date

import numpy as np

import onlinefa


class NumpyOnlineEM:
    """Algorithm 2 in NumPy, written to be fast: no D×D, ψ = d̄² − rowsum(F ⊙ Ā), in-place updates."""

    def __init__(self, f0: np.ndarray, n_warmup: int, dtype: type = np.float64) -> None:
        d, k = f0.shape
        self.f = f0.astype(dtype)
        self.psi = np.ones(d, dtype)
        self.mean = np.zeros(d, dtype)
        self.a = np.zeros((d, k), dtype)
        self.b = np.zeros((k, k))
        self.d2 = np.zeros(d, dtype)
        self.t = 0
        self.n_warmup = n_warmup
        self.scaled = np.empty((d, k), dtype)

    def update(self, x: np.ndarray) -> None:
        self.t += 1
        rho = 1.0 / self.t
        self.mean += (x - self.mean) * rho
        d = x - self.mean
        np.divide(self.f, self.psi[:, None], out=self.scaled)  # C = (F ⊙ ψ⁻¹)ᵀ
        k = self.f.shape[1]
        sigma = np.linalg.inv(np.eye(k) + self.scaled.T @ self.f)
        m = sigma @ (self.scaled.T @ d)
        self.b += (np.outer(m, m) - self.b) * rho
        h = sigma + self.b
        self.a *= 1.0 - rho
        self.a += np.outer(d * rho, m)
        self.d2 += (d * d - self.d2) * rho
        if self.t > self.n_warmup:
            np.matmul(self.a, np.linalg.inv(h), out=self.f)
            np.multiply(self.f, self.a, out=self.scaled)
            np.subtract(self.d2, self.scaled.sum(axis=1), out=self.psi)
            np.maximum(self.psi, 1e-10, out=self.psi)


class NumpyOnlineSGA:
    """Algorithm 1 in NumPy with in-place updates and no D×D."""

    def __init__(self, f0: np.ndarray, n_warmup: int, lr: float, dtype: type = np.float64) -> None:
        d, k = f0.shape
        self.f = f0.astype(dtype)
        self.beta = np.zeros(d, dtype)
        self.psi = np.ones(d, dtype)
        self.mean = np.zeros(d, dtype)
        self.t = 0
        self.n_warmup = n_warmup
        self.lr = lr
        self.scaled = np.empty((d, k), dtype)
        self.fp = np.empty((d, k), dtype)

    def update(self, x: np.ndarray) -> None:
        self.t += 1
        self.mean += (x - self.mean) / self.t
        if self.t <= self.n_warmup:
            return
        d = x - self.mean
        k = self.f.shape[1]
        np.divide(self.f, self.psi[:, None], out=self.scaled)
        sigma = np.linalg.inv(np.eye(k) + self.scaled.T @ self.f)
        m = sigma @ (self.scaled.T @ d)
        np.matmul(self.f, sigma + np.outer(m, m), out=self.fp)
        fm = self.f @ m
        quad = np.einsum("dk,dk->d", self.fp, self.f)
        grad_beta = 0.5 * (d * d - 2.0 * d * fm + quad) / self.psi - 0.5
        self.fp -= np.outer(d, m)  # now F P − d mᵀ = −ψ ∇F
        self.fp /= self.psi[:, None]
        self.f -= self.lr * self.fp
        self.beta += self.lr * grad_beta
        np.exp(self.beta, out=self.psi)


def median_seconds(fn: Callable[[int], None], repeats: int) -> float:
    """Median wall time of ``fn(i)`` over ``repeats`` calls."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


STATE_PROBE = """
import os, resource, sys
import numpy as np
import onlinefa

def rss():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

algo, d, k, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = np.zeros((1, d), dtype=dtype)
base = rss()
cls = onlinefa.OnlineEM if algo == "EM" else onlinefa.OnlineSGA
model = cls(d, k, n_warmup=1, seed=0, dtype=dtype)
model.update(x)
model.update(x)
print(rss() - base)
"""


def state_bytes(algo: str, d: int, k: int, dtype: str) -> int:
    """Resident memory added by one model (constructed from a seed, after two updates), measured in a
    fresh interpreter so nothing else allocated in this process distorts it."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", STATE_PROBE, algo, str(d), str(k), dtype],
        check=True, capture_output=True, text=True,
    )
    return int(out.stdout.strip())


def floors(d: int, k: int, dtype: type, repeats: int) -> tuple[float, float]:
    """The memory floor of one update, medians in seconds: one in-place read+write pass
    (``np.multiply(buf, c, out=buf)``) over (K + 3)·D values of the state's dtype — as many bytes as either
    model's D-sized state (Ā or F, plus three D-vectors) — and the same plus reading the float64 sample x.
    (``cargo bench`` measures the same two floors with a Rust loop.)"""
    buf = np.ones((k + 3) * d, dtype)
    x = np.ones(d)
    scale = dtype(1.0)

    def state_pass(_: int) -> None:
        np.multiply(buf, scale, out=buf)

    def state_and_x(_: int) -> None:
        np.multiply(buf, scale, out=buf)
        x.sum()

    return median_seconds(state_pass, repeats), median_seconds(state_and_x, repeats)


def per_update_rows(d: int, k: int, repeats: int, rng: np.random.Generator) -> list[str]:
    """Table rows: onlinefa vs NumPy vs floor, per update, at one (D, K)."""
    n_warm = 2 * k + 5
    stream = rng.standard_normal((n_warm + repeats, d))
    f0 = np.linalg.qr(rng.standard_normal((d, k)))[0]
    rows = []
    for algo in ("EM", "SGA"):
        for dtype in (np.float64, np.float32):
            name = np.dtype(dtype).name
            if algo == "EM":
                model: onlinefa.OnlineEM | onlinefa.OnlineSGA = onlinefa.OnlineEM.algorithm2(
                    d, k, n_warmup=k + 2, init=f0, dtype=name
                )
                ref: NumpyOnlineEM | NumpyOnlineSGA = NumpyOnlineEM(f0, k + 2, dtype)
            else:
                model = onlinefa.OnlineSGA.algorithm1(d, k, n_warmup=k + 2, init=f0, dtype=name)
                ref = NumpyOnlineSGA(f0, k + 2, 1e-3, dtype)
            data = stream.astype(dtype)
            model.update(data[:n_warm])
            resident = state_bytes(algo, d, k, name)
            for i in range(n_warm):
                ref.update(data[i])
            ours = median_seconds(lambda i, m=model: m.update(data[n_warm + i]), repeats)
            theirs = median_seconds(lambda i, r=ref: r.update(data[n_warm + i]), repeats)
            floor, floor_x = floors(d, k, dtype, repeats)
            dk_bytes = d * k * np.dtype(dtype).itemsize
            rows.append(
                f"| {algo} | {d:,} | {k} | {name} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | "
                f"{theirs / ours:.1f}× | {floor * 1e3:.2f} | {ours / floor:.2f}× | {ours / floor_x:.2f}× | "
                f"{resident / dk_bytes:.2f} |"
            )
            del model, ref
    return rows


def stream_vs_sklearn(n_samples: int, d: int, k: int, rng: np.random.Generator) -> str:
    """Time to stream n_samples through OnlineEM vs sklearn FactorAnalysis.fit on the same matrix."""
    from sklearn.decomposition import FactorAnalysis

    x = rng.standard_normal((n_samples, k)) @ rng.standard_normal((k, d)) + rng.standard_normal((n_samples, d))
    start = time.perf_counter()
    onlinefa.OnlineEM(d, k, seed=0).update(x)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    FactorAnalysis(n_components=k, random_state=0).fit(x)
    theirs = time.perf_counter() - start
    return (
        f"| stream {n_samples:,} samples, D={d}, K={k} | {ours:.2f} s | sklearn FactorAnalysis.fit "
        f"{theirs:.2f} s | {theirs / ours:.1f}× |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sizes = [(100_000, 10), (1_000_000, 10)] if not args.quick else [(100_000, 10)]
    if not args.quick:
        sizes += [(1_000_000, 1), (1_000_000, 50)]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# onlinefa benchmark — {date.today()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, numpy {np.__version__}, load average at start {load:.1f}")
    print()
    print("| algorithm | D | K | state | onlinefa ms/update | NumPy ms/update | speed-up | "
          "floor ms | × floor | × (floor + x) | state RSS / (D·K·size) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d, k in sizes:
        for row in per_update_rows(d, k, args.repeats, rng):
            print(row, flush=True)
    print()
    n = 20_000 if args.quick else 100_000
    print("| workload | onlinefa | baseline | speed-up |")
    print("|---|---|---|---|")
    print(stream_vs_sklearn(n, 1000, 10, rng), flush=True)


if __name__ == "__main__":
    main()
