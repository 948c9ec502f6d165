"""The torch row stores on the CPU against a plain torch transcription of online EM's pass.

Run by hand (from a checkout whose ``onlinefa`` is installed; for a before/after comparison run it once per
checkout, alternating)::

    python benches/torch_rows.py                 # D = 10⁶, K = 10, one thread
    python benches/torch_rows.py --d 2000000 --k 20

Per state dtype, process-CPU medians over ``--repeats`` single-row updates after a short warm-up:

* **OnlineEM / OnlineSGA**: ``update`` of ``onlinefa.OnlineEM`` / ``OnlineSGA`` with ``device="cpu"`` (torch rows, the Rust
  core's K×K step);
* **plain EM pass**: the same operations of one online EM sample written out in torch (pending rank-one step,
  F = Ā H̄⁻¹, ψ, the moments, the sums, a K×K Cholesky solve), with no checks, locks or bookkeeping: the
  floor the torch row store is measured against.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

import onlinefa


def median_ms(step: Callable[[int], None], repeats: int) -> float:
    times = []
    for i in range(repeats):
        start = time.process_time()
        step(i)
        times.append(time.process_time() - start)
    return round(sorted(times)[repeats // 2] * 1e3, 1)


def model_ms(name: str, d: int, k: int, dtype: str, rows: torch.Tensor, repeats: int) -> float:
    model = getattr(onlinefa, name)(d, k, seed=0, dtype=dtype, n_warmup=2, device="cpu")
    model.update(rows[:5])
    return median_ms(lambda i: model.update(rows[5 + i]), repeats)


def plain_em_ms(d: int, k: int, dtype: str, rows: torch.Tensor, repeats: int) -> float:
    dt = getattr(torch, dtype)
    a = torch.randn(d, k, dtype=dt) * 0.1
    mean, dsq, d_last = torch.zeros(d, dtype=dt), torch.ones(d, dtype=dt), torch.zeros(d, dtype=dt)
    m, h_inv = torch.zeros(k, dtype=torch.float64), torch.eye(k, dtype=torch.float64)

    def step(i: int) -> None:
        nonlocal a, mean, dsq, d_last, m
        rho = 1.0 / (i + 10)
        a64 = torch.addr(a.to(torch.float64), d_last.to(torch.float64), m, beta=1 - rho, alpha=rho)
        a = a64.to(dt)
        f = a64 @ h_inv
        dsq64 = dsq.to(torch.float64)
        psi = (dsq64 - torch.linalg.vecdot(f, a64)).clamp(min=1e-6)
        e = rows[5 + i].to(torch.float64) - mean.to(torch.float64)
        dd = e - rho * e
        mean, d_last = (mean.to(torch.float64) + rho * e).to(dt), dd.to(dt)
        dsq = (dsq64 + rho * (dd * dd - dsq64)).to(dt)
        y = f / psi[:, None]
        lower = torch.linalg.cholesky(torch.eye(k, dtype=torch.float64) + y.T @ f)
        m = torch.cholesky_solve((y.T @ dd)[:, None], lower)[:, 0]

    return median_ms(step, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = torch.randn(args.repeats + 5, args.d, dtype=torch.float32)
    result = {}
    for dtype in ("float32", "float64"):
        for name in ("OnlineEM", "OnlineSGA"):
            result[f"{name} {dtype}"] = model_ms(name, args.d, args.k, dtype, rows, args.repeats)
        result[f"plain EM pass {dtype}"] = plain_em_ms(args.d, args.k, dtype, rows, args.repeats)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
