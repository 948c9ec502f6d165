"""Per-iteration time of VIFA (one training draw + one optimiser step) against its memory floor and NumPy.

Run by hand::

    python benches/vifa.py                         # D ∈ {10⁵, 10⁶}, K ∈ {1, 10, 50}, float64 and float32, Adam
    python benches/vifa.py --d 1000000 --k 10      # one size
    python benches/vifa.py --optimizer sgd         # plain SGD (no moment estimates in the state)
    python benches/vifa.py --no-numpy              # skip the NumPy column, e.g. to time an older build

``python benches/engine.py`` prints the same iteration (Adam) next to OnlineEM and OnlineSGA; this script adds
the sample/step split and the SGD variant.

One iteration is ``sample()`` (θ = F h + c + ψ^{1/2} ⊙ z, 4.50) followed by ``step(g)`` (Algorithm 3,
lines 9–20) with L = 1 draw, the thesis's setting. Everything is measured in one process, interleaved, on
the same gradient; the table reports medians and ratios.

* **floor**: one in-place read+write pass (``np.multiply(buf, c, out=buf)``) over an array as large as
  VIFA's state: c, F, β ((K + 2)·D values of the state's dtype) and, with Adam, the two moment estimates of
  each (3·(K + 2)·D values, timed as three passes over (K + 2)·D); **floor + g** adds reading the float64 gradient (D values), which every step
  must also do.
* **NumPy**: the same iteration written with NumPy (in-place where it helps, no D×D): sampling, the
  gradient of lines 9–16, the optimiser, and B = Fᵀ Ψ⁻¹ F for the next step.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import onlinefa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import median_seconds  # noqa: E402

ALPHA = 1e-2
LRS = (1e-3, 1e-3, 1e-3)


class NumpyVIFA:
    """Algorithm 3 with L = 1 in NumPy: state in ``dtype``, K×K algebra in float64."""

    def __init__(self, f0: npt.NDArray[Any], dtype: type, optimizer: str, seed: int) -> None:
        d, k = f0.shape
        self.f = f0.astype(dtype)
        self.c = np.zeros(d, dtype)
        self.beta = np.zeros(d, dtype)
        self.params = [self.c, self.f, self.beta]
        self.adam = optimizer == "adam"
        self.first = [np.zeros_like(p) for p in self.params]
        self.second = [np.zeros_like(p) for p in self.params]
        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.m_inv = self._m_inv()
        self.h = np.zeros(k)
        self.z = np.zeros(d, dtype)

    def _m_inv(self) -> npt.NDArray[np.float64]:
        """(I + Fᵀ Ψ⁻¹ F)⁻¹ (line 11), K×K."""
        b = self.f.T @ (self.f * np.exp(-self.beta)[:, None])
        return np.linalg.inv(np.eye(self.f.shape[1]) + b.astype(np.float64))

    def sample(self) -> npt.NDArray[Any]:
        """θ = F h + c + ψ^{1/2} ⊙ z (4.50)."""
        self.h = self.rng.standard_normal(self.f.shape[1])
        self.z = self.rng.standard_normal(self.c.shape[0], dtype=self.c.dtype)
        theta: npt.NDArray[Any] = self.f @ self.h.astype(self.f.dtype)
        theta += self.c
        theta += np.exp(0.5 * self.beta) * self.z
        return theta

    def step(self, g: npt.NDArray[Any]) -> None:
        """Lines 9–20 with the gradient g at the last draw."""
        dtype = self.c.dtype
        g = g.astype(dtype, copy=False)
        psi = np.exp(self.beta)
        a = self.f / psi[:, None]  # line 10
        c_mat = a @ self.m_inv.astype(dtype)  # line 12
        g_c = ALPHA * self.c + g  # line 9
        g_f = ALPHA * self.f - c_mat  # lines 13–14 (−A + C Bᵀ = −C)
        g_f += np.outer(g, self.h.astype(dtype))
        g_b = 0.5 * psi * ((c_mat * a).sum(axis=1) + ALPHA) - 0.5  # lines 15–16
        g_b += 0.5 * np.sqrt(psi) * g * self.z
        self.t += 1
        for i, (grad, lr) in enumerate(zip((g_c, g_f, g_b), LRS)):
            if not self.adam:
                self.params[i] -= lr * grad
                continue
            m, v = self.first[i], self.second[i]
            m *= 0.9
            m += 0.1 * grad
            v *= 0.999
            v += 0.001 * grad * grad
            denom = np.sqrt(v / (1 - 0.999**self.t))
            denom += 1e-8
            self.params[i] -= (lr / (1 - 0.9**self.t)) * m / denom
        self.m_inv = self._m_inv()


def floors(d: int, k: int, dtype: type, optimizer: str, repeats: int) -> tuple[float, float]:
    """(in-place read+write of the state, the same plus reading a float64 D-vector), medians in seconds.
    With Adam the state is three arrays of (K + 2)·D values; the floor makes three passes over one of them
    (the same bytes in a third of the memory, so D = 10⁷ with K = 50 fits next to the model)."""
    passes = 3 if optimizer == "adam" else 1
    buf = np.ones((k + 2) * d, dtype)
    g = np.ones(d)
    scale = dtype(1.0)

    def state_pass(_: int) -> None:
        for _ in range(passes):
            np.multiply(buf, scale, out=buf)

    def state_and_g(_: int) -> None:
        state_pass(0)
        g.sum()

    return median_seconds(state_pass, repeats), median_seconds(state_and_g, repeats)


@dataclass
class Timing:
    """Medians in seconds of one iteration (sample + step), of sample and step alone, of the two floors, and
    of the NumPy iteration (None if not run)."""

    ours: float
    sample: float
    step: float
    floor: float
    floor_g: float
    numpy: float | None


def measure(d: int, k: int, dtype: type, optimizer: str, repeats: int, numpy: bool, split: bool = True) -> Timing:
    """Time one VIFA iteration (L = 1) at (D, K, dtype) against its floors and, if `numpy`, NumPy; `split`
    also times sample and step alone (else they are NaN)."""
    name = np.dtype(dtype).name
    rng = np.random.default_rng(k)
    f0 = np.linalg.qr(rng.standard_normal((d, k)))[0]
    grad = 1e-3 * rng.standard_normal(d)
    model = onlinefa.VIFA(
        d, k, prior_precision=ALPHA, lr_mean=LRS[0], lr_loadings=LRS[1], lr_log_noise=LRS[2],
        optimizer=optimizer, seed=0, init=f0, dtype=name,
    )

    def sample(_: int, m: onlinefa.VIFA = model) -> None:
        m.sample()

    def step(_: int, m: onlinefa.VIFA = model) -> None:
        m.step(grad)

    def iteration(_: int, m: onlinefa.VIFA = model) -> None:
        m.sample()
        m.step(grad)

    iteration(0)
    ours = median_seconds(iteration, repeats)
    sample_s, step_s = [], []
    for _ in range(repeats if split else 0):
        sample_s.append(median_seconds(sample, 1))
        step_s.append(median_seconds(step, 1))
    del model, sample, step, iteration  # free the D-sized state before NumPy's run
    theirs = None
    if numpy:
        ref = NumpyVIFA(f0, dtype, optimizer, 0)

        def ref_iteration(_: int) -> None:
            ref.sample()
            ref.step(grad)

        ref_iteration(0)
        theirs = median_seconds(ref_iteration, repeats)
        del ref
    del f0
    floor, floor_g = floors(d, k, dtype, optimizer, repeats)
    sample_t, step_t = (float(np.median(v)) if v else float("nan") for v in (sample_s, step_s))
    return Timing(ours, sample_t, step_t, floor, floor_g, theirs)


def row(d: int, k: int, dtype: type, optimizer: str, repeats: int, numpy: bool) -> str:
    t = measure(d, k, dtype, optimizer, repeats, numpy)
    numpy_cells = "– | –" if t.numpy is None else f"{t.numpy * 1e3:.1f} | {t.numpy / t.ours:.1f}×"
    return (
        f"| {d:,} | {k} | {np.dtype(dtype).name} | {t.ours * 1e3:.2f} | {t.sample * 1e3:.2f} | "
        f"{t.step * 1e3:.2f} | {t.floor * 1e3:.2f} | {t.ours / t.floor:.2f}× | {t.ours / t.floor_g:.2f}× | "
        f"{numpy_cells} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy implementation")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# onlinefa VIFA benchmark ({args.optimizer}, L = 1) — {date.today()}, {platform.machine()}, "
          f"{os.cpu_count()} cores, numpy {np.__version__}, load average at start {load:.1f}")
    print()
    print("| D | K | state | ms/iteration | sample ms | step ms | floor ms | × floor | × (floor + g) | "
          "NumPy ms | NumPy / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        for k in args.k:
            for dtype in args.dtype:
                print(row(d, k, np.dtype(dtype).type, args.optimizer, args.repeats, not args.no_numpy), flush=True)
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
