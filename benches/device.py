"""Per-update time of the torch streaming models (OnlineEM, OnlineSGA, VIFA) on every device present, against the
device's own memory floor, the Rust core fed through a host copy, and one training step of a network with as many
parameters.

Run by hand::

    python benches/device.py                    # D = 10⁶, K = 10, float32 and float64
    python benches/device.py --d 2000000 --k 20

Per device and state dtype, medians over ``--repeats`` updates after warm-up:

* **floor**: one in-place read+write (``buf.mul_(c)``) of as many bytes as the model's D-sized state
  ((K + 3)·D values for OnlineEM (Ā, θ̄, d̄², d) and OnlineSGA (F, θ̄, ψ, d), (K + 2)·D for VIFA with SGD (F, c,
  β)), on that device, synchronised;
* **torch**: ``update`` of the model with ``device=`` and the snapshot already on the device (VIFA: one
  training draw and one ``step`` with a gradient already on the device);
* **host copy + Rust**: the snapshot (gradient) copied to the host (``.cpu().numpy()``) and fed to the Rust
  core's model (the path without a device model);
* **train step**: forward, backward and an SGD step of an MLP with ≈ D parameters on a batch of 64, on that
  device: the cost of one snapshot in training steps is torch / train step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

import onlinefa
import onlinefa.torch


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(call: Callable[[], object], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        synchronise(device)
        start = time.perf_counter()
        call()
        synchronise(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mlp_with(n_parameters: int, device: torch.device) -> tuple[torch.nn.Module, int]:
    """An MLP 256 → h → h → 1 with about ``n_parameters`` parameters."""
    h = max(8, int((-(257 + 1) + np.sqrt((257 + 1) ** 2 + 4 * n_parameters)) / 2))
    net = torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                              torch.nn.Linear(h, 1)).to(device)
    return net, sum(p.numel() for p in net.parameters())


def train_step_seconds(net: torch.nn.Module, device: torch.device, repeats: int) -> float:
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256, device=device), torch.randn(64, 1, device=device)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()

    step()
    return median_seconds(step, repeats, device)


class Models(NamedTuple):
    """One family: the device model, the Rust model (same options), one update of each, the state's size."""

    ours: Any
    rust: Any
    update_ours: Callable[[Any, torch.Tensor], object]
    update_rust: Callable[[Any, np.ndarray], object]
    state_vectors: int  #: D-sized vectors of state (K + 3 or K + 2)


def streaming(kind: str, d: int, k: int, dtype: torch.dtype, device: torch.device) -> Models:
    name = str(dtype).removeprefix("torch.")
    if kind == "VIFA":
        options: dict[str, Any] = {"prior_precision": 1.0, "lr_mean": 1e-4, "lr_loadings": 1e-4,
                                   "lr_log_noise": 1e-4, "seed": 0}
        return Models(onlinefa.VIFA(d, k, dtype=name, device=device, **options),
                      onlinefa.VIFA(d, k, dtype=name, **options),
                      lambda m, g: (m.sample(), m.step(g)), lambda m, g: (m.sample(), m.step(g)), k + 2)
    model_class = {"OnlineEM": onlinefa.OnlineEM, "OnlineSGA": onlinefa.OnlineSGA}[kind]
    return Models(model_class(d, k, seed=0, dtype=name, device=device), model_class(d, k, seed=0, dtype=name),
                  lambda m, x: m.update(x), lambda m, x: m.update(x), k + 3)


def row(kind: str, device: torch.device, d: int, k: int, dtype: torch.dtype, repeats: int, step_s: float) -> str:
    gen = torch.Generator(device="cpu").manual_seed(0)
    stream = (torch.randn(k + 3 + repeats, d, generator=gen, dtype=torch.float64) * 1e-2).to(device)
    models = streaming(kind, d, k, dtype, device)
    for i in range(k + 3):  # past any warm-up
        models.update_ours(models.ours, stream[i])
        models.update_rust(models.rust, stream[i].cpu().numpy())
    at = iter(range(k + 3, k + 3 + repeats))
    ours = median_seconds(lambda: models.update_ours(models.ours, stream[next(at)]), repeats, device)
    at_host = iter(range(k + 3, k + 3 + repeats))
    host = median_seconds(lambda: models.update_rust(models.rust, stream[next(at_host)].cpu().numpy()), repeats,
                          device)
    buf = torch.ones(models.state_vectors * d, dtype=dtype, device=device)
    floor = median_seconds(lambda: buf.mul_(1.0000001), repeats, device)
    name = str(dtype).removeprefix("torch.")
    return (f"| {kind} | {device} | {d:,} | {k} | {name} | {ours * 1e3:.1f} | {floor * 1e3:.2f} | "
            f"{ours / floor:.0f}× | {host * 1e3:.1f} | {ours / host:.2f}× | {step_s * 1e3:.1f} | "
            f"{ours / step_s:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", type=lambda v: v.split(","), default=["OnlineEM", "OnlineSGA", "VIFA"])
    args = parser.parse_args()
    devices = [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    cards = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none"
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} CPU threads; GPUs: {cards}")
    print()
    print("| model | device | D | K | state | torch ms | floor ms | × floor | host copy + Rust ms | torch / Rust | "
          "train step ms | snapshot in steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for device in devices:
        net, n_params = mlp_with(args.d, device)
        step_s = train_step_seconds(net, device, args.repeats)
        for kind in args.models:
            for dtype in (torch.float32, torch.float64):
                print(row(kind, device, n_params, args.k, dtype, args.repeats, step_s), flush=True)


if __name__ == "__main__":
    main()
