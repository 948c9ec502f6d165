"""Per-update time of the streaming models (online EM, online SGA, VIFA) against the measured memory floor and
a NumPy transcription, in one run.

Run by hand::

    python benches/engine.py                       # D ∈ {10⁵, 10⁶}, K ∈ {1, 10, 50}, float64 and float32
    python benches/engine.py --d 1000000 --k 50    # one size
    python benches/engine.py --models EM VIFA      # some of the models
    python benches/engine.py --no-numpy            # skip the (slow) NumPy column, e.g. to time an older build
    python benches/engine.py --d 10000000 --k 1 10 # D = 10⁷: the NumPy VIFA at K = 50 needs more than 24 GiB

Everything is measured in one process, interleaved, on the same data; the table reports medians and ratios.

* **floor**: one in-place read+write pass (``np.multiply(buf, c, out=buf)``) over an array as large as the
  model's state (Ā or F plus three D-vectors: (K + 3)·D values of the state's dtype, for EM and SGA alike);
  **floor + x** adds reading the float64 sample (D values), which every update must also do.
* **NumPy**: Algorithm 2 (EM) or 1 (SGA) written with in-place NumPy operations and no D×D
  (``benches/compare.py``).
* **VIFA**: one update is ``sample()`` then ``step(g)`` (Adam, L = 1 draw) against its own floor (c, F, β and
  Adam's two moments: three passes over (K + 2)·D values) and reading g, and the NumPy Algorithm 3 of
  ``benches/vifa.py`` (which also splits the time into sample and step).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import date
from pathlib import Path

import numpy as np

import onlinefa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import NumpyOnlineEM, NumpyOnlineSGA, floors, median_seconds  # noqa: E402
import vifa  # noqa: E402


MODELS = ["EM", "SGA", "VIFA"]


def vifa_row(d: int, k: int, dtype: type, repeats: int, numpy: bool) -> str:
    t = vifa.measure(d, k, dtype, "adam", repeats, numpy, split=False)
    numpy_cells = "– | –" if t.numpy is None else f"{t.numpy * 1e3:.2f} | {t.numpy / t.ours:.1f}×"
    return (
        f"| VIFA | {d:,} | {k} | {np.dtype(dtype).name} | {t.ours * 1e3:.2f} | {t.floor * 1e3:.2f} | "
        f"{t.ours / t.floor:.2f}× | {t.ours / t.floor_g:.2f}× | {numpy_cells} |"
    )


def row(algo: str, d: int, k: int, dtype: type, repeats: int, rng: np.random.Generator, numpy: bool) -> str:
    name = np.dtype(dtype).name
    n_warm = k + 3
    stream = rng.standard_normal((n_warm + repeats, d))
    f0 = np.linalg.qr(rng.standard_normal((d, k)))[0]
    cls = onlinefa.OnlineEM.algorithm2 if algo == "EM" else onlinefa.OnlineSGA.algorithm1
    model = cls(d, k, n_warmup=k + 2, init=f0, dtype=name)
    model.update(stream[:n_warm])
    ours = median_seconds(lambda i, m=model: m.update(stream[n_warm + i]), repeats)
    del model
    numpy_cells = "– | –"
    if numpy:
        # No warm-up for the NumPy transcription: every update then does the post-warm-up work being timed.
        ref = NumpyOnlineEM(f0, 0, dtype) if algo == "EM" else NumpyOnlineSGA(f0, 0, 1e-3, dtype)
        data = stream.astype(dtype)
        ref.update(data[0])
        theirs = median_seconds(lambda i: ref.update(data[n_warm + i]), repeats)
        del ref, data
        numpy_cells = f"{theirs * 1e3:.2f} | {theirs / ours:.1f}×"
    floor, floor_x = floors(d, k, dtype, repeats)
    return (
        f"| {algo} | {d:,} | {k} | {name} | {ours * 1e3:.2f} | {floor * 1e3:.2f} | {ours / floor:.2f}× | "
        f"{ours / floor_x:.2f}× | {numpy_cells} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy transcription")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# onlinefa engine benchmark — {date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"numpy {np.__version__}, load average at start {load:.1f}")
    print()
    print("| model | D | K | state | ms/update | floor ms | × floor | × (floor + x) | NumPy ms | NumPy / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        for k in args.k:
            for dtype in (np.float64, np.float32):
                for algo in args.models:
                    if algo == "VIFA":
                        line = vifa_row(d, k, dtype, args.repeats, not args.no_numpy)
                    else:
                        line = row(algo, d, k, dtype, args.repeats, rng, not args.no_numpy)
                    print(line, flush=True)
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
