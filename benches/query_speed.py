"""Speed of the queries of a fitted OnlineEM at large D, against the memory floor and other implementations.

For each state dtype: median seconds of ``log_prob`` and ``transform`` of 2 rows, ``sample(30)`` and
``snapshot()`` (repeated at one sample count, so they reuse the reporting map of the shrinkage), and of the
Gram pass that the first query after each update adds for that map; "unshrunk s" is the same query on the same
state with ``shrink=False``; "× F pass" divides by one NumPy pass over a D×K array of the state's dtype (``sum``), and for
``sample`` "× floor" divides by that pass plus writing the 30×D float64 draws (``fill`` of a fresh array, page
faults included, as ``sample`` pays them). Beside them, the same queries by NumPy on the model's arrays (the
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
    print(f"{'state':<8}{'query':<22}{'seconds':>10}{'× F pass':>10}{'× floor':>10}{'unshrunk s':>11}{'NumPy s':>10}"
          f"{'torch s':>10}")
    for dtype in ("float32", "float64"):
        measure_dtype(d, k, dtype, x, n_draws, repeats)


def measure_dtype(d: int, k: int, dtype: str, x: np.ndarray, n_draws: int, repeats: int) -> None:
    """Print the rows of one state dtype."""
    model = fitted_model(d, k, dtype)
    unshrunk = fitted_model(d, k, dtype, shrink=False)
    factors = np.ones((d, k), dtype=dtype)
    f_pass = median_seconds(lambda: factors.sum(), repeats)
    write_draws = median_seconds(lambda: np.empty((n_draws, d)).fill(1.0), repeats)

    def arrays() -> tuple[np.ndarray, ...]:
        return tuple(np.asarray(a, dtype=np.float64) for a in model.snapshot())

    rows = [
        ("log_prob(2 rows)", lambda m: m.log_prob(x), f_pass,
         lambda: _gaussian.log_prob(x, *arrays()), torch_log_prob(model, x)),
        ("transform(2 rows)", lambda m: m.transform(x), f_pass, None, None),
        (f"sample({n_draws})", lambda m: m.sample(n_draws, seed=1), f_pass + write_draws,
         lambda: _gaussian.draw(n_draws, *arrays(), 1), None),
        ("snapshot()", lambda m: m._core.snapshot(), f_pass, None, None),
        # what the first query after an update adds (the spiked-shrinkage map, then reused at that count)
        ("reporting map", lambda m: m._core.gram(), f_pass, None, None),
    ]
    for name, query, floor, numpy_call, torch_call in rows:
        seconds = median_seconds(lambda: query(model), repeats)
        plain = f"{median_seconds(lambda: query(unshrunk), repeats):>11.3f}" if name != "reporting map" else f"{'-':>11}"
        numpy_s = f"{median_seconds(numpy_call, repeats):>10.3f}" if numpy_call else f"{'-':>10}"
        torch_s = f"{median_seconds(torch_call, repeats):>10.3f}" if torch_call else f"{'-':>10}"
        print(f"{dtype:<8}{name:<22}{seconds:>10.3f}{seconds / f_pass:>9.1f}×{seconds / floor:>9.1f}×"
              f"{plain}{numpy_s}{torch_s}")

if __name__ == "__main__":
    main()
