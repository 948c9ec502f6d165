"""Resident memory of the PyTorch workflow, per phase, against the documented state (Linux only).

A 64-1000-1000-10 MLP (D = 1,076,010 float32 weights, 4.3 MB) trains by SGD while an asynchronous
``SnapshotCollector`` feeds ``OnlineEM(D, K)`` one snapshot per step; then ``bayesian_model_average`` predicts
with 30 posterior draws. Each configuration runs in a fresh process, which measures after building the
network (its baseline) and at the end of each phase:

- **warm-up** (the first ``n_warmup + 1`` snapshots, then ``collector.flush()``: the model's first M-step frees
  the initial loadings F₀): the peak resident memory above the baseline during the phase;
- **collection** (the other snapshots of ``--snapshots``, then ``collector.close()``): the peak above the
  baseline during the phase, and what stays resident after it;
- **draws** (``bayesian_model_average`` with 30 draws on one batch): the peak above the memory before the
  phase, and what stays resident after it.

Every figure is given as a multiple of the state documented for its phase (``docs/guide/swag.md``, "Memory at
scale"): D·(K + 4)·itemsize (Ā and four D-vectors), plus D·K·itemsize for F₀ during the warm-up; and of the
network's float32 weights (D·4 bytes). The peak counter is reset between phases (``/proc/self/clear_refs``).

Usage: ``python benches/workflow_memory.py [--k 20] [--snapshots 40]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from peak_rss import PRELUDE


CHILD = PRELUDE + r"""
import json, sys
import torch
import onlinefa
from onlinefa.torch import SnapshotCollector, bayesian_model_average


dtype, k, snapshots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1000), torch.nn.ReLU(),
                          torch.nn.Linear(1000, 10))
d = sum(p.numel() for p in net.parameters())
x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
loss = torch.nn.functional.cross_entropy(net(x), y)  # warm PyTorch's allocator before the baseline
loss.backward()
optimizer.zero_grad()
reset_peak()
baseline = rss("VmRSS:")
posterior = onlinefa.OnlineEM(d, k, seed=0, dtype=dtype)
collector = SnapshotCollector(posterior, net, asynchronous=True)
warmup_snapshots = posterior.n_warmup + 1  # the last of them ends the warm-up and frees F0
if snapshots <= warmup_snapshots:
    raise SystemExit(f"--snapshots must exceed the warm-up's {warmup_snapshots} snapshots")


def train(steps):
    for step in steps:
        batch = slice(32 * (step % 8), 32 * (step % 8 + 1))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
        optimizer.step()
        collector.collect()


train(range(warmup_snapshots))
collector.flush()
assert posterior.is_fitted
warmup = {"peak": rss("VmHWM:") - baseline}
reset_peak()
train(range(warmup_snapshots, snapshots))
collector.close()
collection = {"peak": rss("VmHWM:") - baseline, "after": rss("VmRSS:") - baseline}
reset_peak()
before = rss("VmRSS:")
bayesian_model_average(net, posterior, [(x[:32],)], n_samples=30, seed=0)
draws = {"peak": rss("VmHWM:") - before, "after": rss("VmRSS:") - before}
itemsize = 4 if dtype == "float32" else 8
print(json.dumps({"d": d, "state": d * (k + 4) * itemsize, "warmup_state": d * (2 * k + 4) * itemsize,
                  "network": d * 4, "warmup": warmup, "collection": collection, "draws": draws}))
"""


def measure(dtype: str, k: int, snapshots: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, dtype, str(k), str(snapshots)], check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--snapshots", type=int, default=40)
    args = parser.parse_args()
    print(f"K = {args.k}, {args.snapshots} snapshots, 30 draws; resident memory as multiples of the state "
          "documented for the phase, D·(2K + 4)·itemsize during the warm-up and D·(K + 4)·itemsize after it "
          "(and of the network's float32 weights)")
    print()
    print("| state | documented state (warm-up / after) | warm-up peak | collection peak | after collection | "
          "draws peak | after draws |")
    print("|---|---|---|---|---|---|---|")
    for dtype in ("float32", "float64"):
        r = measure(dtype, args.k, args.snapshots)
        state, warmup_state, network = float(r["state"]), float(r["warmup_state"]), float(r["network"])

        def cell(value: float, documented: float = state) -> str:
            return f"{value / documented:.2f}× ({value / network:.0f}×)"

        warmup, collection, draws = r["warmup"], r["collection"], r["draws"]
        print(f"| {dtype} | {warmup_state / 1e6:.0f} / {state / 1e6:.0f} MB | "
              f"{cell(warmup['peak'], warmup_state)} | {cell(collection['peak'])} | "
              f"{cell(collection['after'])} | {cell(draws['peak'])} | {cell(draws['after'])} |")


if __name__ == "__main__":
    main()
