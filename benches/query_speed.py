"""Speed of the queries of a fitted OnlineEM at large D, against the memory floor and other implementations.

For each state dtype: median seconds of ``log_prob`` and ``transform`` of 2 rows, ``sample(30)`` and
``snapshot()`` (repeated at one sample count, so they reuse the reporting map of the shrinkage), and of the
Gram pass that the first query after each update adds for that map; "unshrunk s" is the same query on the same
state with ``shrink=False``. Each query's floor ("× floor" divides by it) is its memory traffic at memory speed
(reading the state once by a BLAS matrix-vector product over as many values, plus reading the query rows or
writing its outputs into fresh arrays, page faults included) plus its multiply-adds at the BLAS rate of a 1024²
product (``measure_dtype`` lists them). Beside them, the same queries by NumPy on the model's arrays (the
library's pre-streaming path) and PyTorch's ``LowRankMultivariateNormal.log_prob`` on the same Gaussian
(when PyTorch is installed), measured in the same run.

Usage: ``python benches/query_speed.py [D] [K] [repeats]`` (default D = 2,000,000, K = 10, 5 repeats).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import onlinefa
from onlinefa import _gaussian


def median_seconds(call: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fitted_model(d: int, k: int, dtype: str, shrink: bool = True) -> onlinefa.OnlineEM:
    rng = np.random.default_rng(0)
    model = onlinefa.OnlineEM(d, k, seed=0, dtype=dtype, shrink=shrink)
    for _ in range(k + 4):
        model.update(rng.standard_normal(d, dtype=np.float32))
    return model


def torch_log_prob(model: onlinefa.OnlineEM, x: np.ndarray) -> Callable[[], Any] | None:
    try:
        import torch
    except ImportError:
        return None
    mean, loadings, psi = (np.array(a, dtype=np.float64) for a in model.snapshot())
    dist = torch.distributions.LowRankMultivariateNormal(
        torch.from_numpy(mean), torch.from_numpy(loadings), torch.from_numpy(psi))
    rows = torch.from_numpy(x)
    return lambda: dist.log_prob(rows)


def main() -> None:
    d = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    n_draws = 30
    x = np.random.default_rng(1).standard_normal((2, d))
    print(f"OnlineEM, D = {d:,}, K = {k}; median of {repeats}; {onlinefa._core.__name__}")
    print(f"{'state':<8}{'query':<22}{'seconds':>10}{'memory s':>10}{'arith s':>10}{'× floor':>10}{'unshrunk s':>11}"
          f"{'NumPy s':>10}{'torch s':>10}")
    for dtype in ("float32", "float64"):
        measure_dtype(d, k, dtype, x, n_draws, repeats)


def read_seconds(values: int, dtype: str, repeats: int) -> float:
    """One read of ``values`` numbers of ``dtype`` at memory speed: a matrix-vector product over them (BLAS,
    64 columns), which reads the array once and writes 1/64 of it."""
    array = np.ones((values // 64, 64), dtype=dtype)
    ones = np.ones(64, dtype=dtype)
    return median_seconds(lambda: array @ ones, repeats)


def write_seconds(values: int, repeats: int) -> float:
    """One write of ``values`` float64 numbers into a fresh array, page faults included (as the queries pay)."""
    return median_seconds(lambda: np.empty(values).fill(1.0), repeats)


def multiply_add_rate(dtype: str, repeats: int) -> float:
    """Multiply-adds per second of this machine's BLAS (NumPy's 1024² product in ``dtype``, one call)."""
    a = np.ones((1024, 1024), dtype=dtype)
    return 1024.0**3 / median_seconds(lambda: a @ a, repeats)


def measure_dtype(d: int, k: int, dtype: str, x: np.ndarray, n_draws: int, repeats: int) -> None:
    """Print the rows of one state dtype.

    Each query's floor: reading the state once ((K + 4)·D values of the state's dtype) and what it must read or
    write besides (the 2 query rows, the draws, or the snapshot's c, F and ψ in float64), plus its multiply-adds
    at the BLAS rate: rebuilding each row of the reported F (the pending step's map and the reporting map, 2K²
    per row), the Gram Σ F_d F_dᵀ/ψ_d for ``log_prob`` and ``transform`` (K(K + 1)/2 per row), and K per row and
    query row or draw.
    """
    model = fitted_model(d, k, dtype)
    unshrunk = fitted_model(d, k, dtype, shrink=False)
    state = read_seconds((k + 4) * d, dtype, repeats)
    rate = multiply_add_rate(dtype, repeats)
    rebuild = 2 * k * k * d / rate

    def arrays() -> tuple[np.ndarray, ...]:
        return tuple(np.asarray(a, dtype=np.float64) for a in model.snapshot())

    gram = k * (k + 1) / 2 * d / rate
    rows = [
        ("log_prob(2 rows)", lambda m: m.log_prob(x), state + read_seconds(2 * d, "float64", repeats),
         rebuild + gram + 2 * k * d / rate, lambda: _gaussian.log_prob(x, *arrays()), torch_log_prob(model, x)),
        ("transform(2 rows)", lambda m: m.transform(x), state + read_seconds(2 * d, "float64", repeats),
         rebuild + gram + 2 * k * d / rate, None, None),
        (f"sample({n_draws})", lambda m: m.sample(n_draws, seed=1), state + write_seconds(n_draws * d, repeats),
         rebuild + n_draws * k * d / rate, lambda: _gaussian.draw(n_draws, *arrays(), 1), None),
        ("snapshot()", lambda m: m._core.snapshot(), state + write_seconds((k + 2) * d, repeats), rebuild, None,
         None),
        # what the first query after an update adds (the spiked-shrinkage map, then reused at that count)
        ("reporting map", lambda m: m._core.gram(), state, rebuild / 2 + gram, None, None),
    ]
    for name, query, memory, arithmetic, numpy_call, torch_call in rows:
        seconds = median_seconds(lambda: query(model), repeats)
        plain = f"{median_seconds(lambda: query(unshrunk), repeats):>11.3f}" if name != "reporting map" else f"{'-':>11}"
        numpy_s = f"{median_seconds(numpy_call, repeats):>10.3f}" if numpy_call else f"{'-':>10}"
        torch_s = f"{median_seconds(torch_call, repeats):>10.3f}" if torch_call else f"{'-':>10}"
        floor = memory + arithmetic
        print(f"{dtype:<8}{name:<22}{seconds:>10.3f}{memory:>10.3f}{arithmetic:>10.3f}{seconds / floor:>9.1f}×"
              f"{plain}{numpy_s}{torch_s}")


if __name__ == "__main__":
    main()
