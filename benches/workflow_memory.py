"""Resident memory of the PyTorch workflow, per phase, against the documented state (Linux only).

A 64-1000-1000-10 MLP (D = 1,076,010 float32 weights, 4.3 MB) trains by SGD while an asynchronous
``SnapshotCollector`` feeds ``OnlineEM(D, K)`` one snapshot per step; then ``bayesian_model_average`` predicts
with 30 posterior draws. Each configuration runs in a fresh process, which measures after building the
network (its baseline) and at the end of each phase:

- **collection** (``--snapshots`` steps, then ``collector.close()``): the peak resident memory above the
  baseline during the phase, and what stays resident after it;
- **draws** (``bayesian_model_average`` with 30 draws on one batch): the peak above the memory before the
  phase, and what stays resident after it.

Every figure is given as a multiple of the documented state, D·(K + 4)·itemsize (Ā or F, and four
D-vectors: ``docs/guide/usage.md``) and of the network's float32 weights (D·4 bytes). The peak counter is
reset between phases (``/proc/self/clear_refs``).

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
for step in range(snapshots):
    batch = slice(32 * (step % 8), 32 * (step % 8 + 1))
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
    optimizer.step()
    collector.collect()
collector.close()
collection = {"peak": rss("VmHWM:") - baseline, "after": rss("VmRSS:") - baseline}
reset_peak()
before = rss("VmRSS:")
bayesian_model_average(net, posterior, [(x[:32],)], n_samples=30, seed=0)
draws = {"peak": rss("VmHWM:") - before, "after": rss("VmRSS:") - before}
itemsize = 4 if dtype == "float32" else 8
print(json.dumps({"d": d, "state": d * (k + 4) * itemsize, "network": d * 4, "collection": collection,
                  "draws": draws}))
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
    print(f"K = {args.k}, {args.snapshots} snapshots, 30 draws; resident memory as multiples of the documented "
          "state D·(K + 4)·itemsize (and of the network's float32 weights)")
    print()
    print("| state | documented state | collection peak | after collection | draws peak | after draws |")
    print("|---|---|---|---|---|---|")
    for dtype in ("float32", "float64"):
        r = measure(dtype, args.k, args.snapshots)
        state, network = float(r["state"]), float(r["network"])

        def cell(value: float) -> str:
            return f"{value / state:.2f}× ({value / network:.0f}×)"

        collection, draws = r["collection"], r["draws"]
        print(f"| {dtype} | {state / 1e6:.0f} MB ({state / network:.0f}×) | {cell(collection['peak'])} | "
              f"{cell(collection['after'])} | {cell(draws['peak'])} | {cell(draws['after'])} |")


if __name__ == "__main__":
    main()
