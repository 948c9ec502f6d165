"""What collecting snapshots costs a training loop: synchronous against asynchronous ``SnapshotCollector``.

An MLP of D ≈ 2·10⁶ parameters (digits-sized inputs) is trained by SGD on random mini-batches, PyTorch on one
thread; a default ``OnlineEM(D, K)`` with float32 state collects a snapshot every ``--every`` optimiser steps.
Printed per mode: wall seconds of ``--steps`` steps (median of ``--repeats`` runs, modes interleaved),
the slowdown against the same loop without collection, the collector's median snapshot cost in optimiser
steps, and whether the posteriors of both modes are bit-identical.

    python benches/collector.py --steps 400 --every 20 --rank 20
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch

import onlinefa
from onlinefa.torch import SlowCollectionWarning, SnapshotCollector

N_INPUTS, N_HIDDEN, BATCH = 64, 1400, 64


def network(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(N_INPUTS, N_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(N_HIDDEN, N_HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(N_HIDDEN, 10),
    )


def run(mode: str, steps: int, every: int, rank: int) -> tuple[float, float, dict[str, np.ndarray] | None]:
    """Wall seconds of the loop, the snapshot cost in steps, and the posterior's final state (None without one)."""
    net = network(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, N_INPUTS, generator=g), torch.randint(0, 10, (BATCH,), generator=g)) for _ in range(8)]
    collector = None
    em = None
    if mode != "none":
        d = sum(p.numel() for p in net.parameters())
        em = onlinefa.OnlineEM(d, rank, seed=0, dtype="float32")
        collector = SnapshotCollector(em, net, every=every, asynchronous=mode == "asynchronous").attach(opt)
    start = time.perf_counter()
    for step in range(steps):
        x, y = data[step % len(data)]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    cost = float("nan")
    if collector is not None:
        collector.close()  # the asynchronous worker's backlog counts: the posterior is complete here
        cost = collector.snapshot_cost_in_steps
    seconds = time.perf_counter() - start
    state = em._core.get_state() if em is not None else None
    return seconds, cost, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--rank", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", SlowCollectionWarning)
    d = sum(p.numel() for p in network(0).parameters())
    print(f"D = {d:,}, K = {args.rank}, float32 state, a snapshot every {args.every} steps, {args.steps} steps, "
          f"PyTorch threads 1; median of {args.repeats} interleaved runs")
    modes = ("none", "synchronous", "asynchronous")
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    costs: dict[str, list[float]] = {m: [] for m in modes}
    states: dict[str, dict[str, np.ndarray] | None] = {}
    for _ in range(args.repeats):
        for mode in modes:
            wall, cost, states[mode] = run(mode, args.steps, args.every, args.rank)
            seconds[mode].append(wall)
            costs[mode].append(cost)
    base = statistics.median(seconds["none"])
    print(f"{'collection':<14}{'seconds':>10}{'slowdown':>10}{'snapshot cost (steps)':>24}")
    for mode in modes:
        wall = statistics.median(seconds[mode])
        cost = statistics.median(costs[mode])
        print(f"{mode:<14}{wall:>10.2f}{wall / base:>9.2f}x{cost:>24.2f}")
    sync, asynchronous = states["synchronous"], states["asynchronous"]
    assert sync is not None and asynchronous is not None
    identical = all(
        np.array_equal(asynchronous[k], v) if isinstance(v, np.ndarray) else asynchronous[k] == v for k, v in sync.items()
    )
    print(f"posteriors bit-identical: {identical}")


if __name__ == "__main__":
    main()
