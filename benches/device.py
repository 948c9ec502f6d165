"""Per-update time of the torch OnlineEM on every device present, against the device's own memory floor, the
Rust core fed through a host copy, and one training step of a network with as many parameters.

Run by hand::

    python benches/device.py                    # D = 10⁶, K = 10, float32 and float64
    python benches/device.py --d 2000000 --k 20

Per device and state dtype, medians over ``--repeats`` updates after warm-up:

* **floor**: one in-place read+write (``buf.mul_(c)``) of as many bytes as the model's D-sized state
  ((K + 3)·D values: Ā, θ̄, d̄², d), on that device, synchronised;
* **torch**: ``onlinefa.torch.OnlineEM.update`` with the snapshot already on the device;
* **host copy + Rust**: the snapshot copied to the host (``.cpu().numpy()``) and fed to ``onlinefa.OnlineEM``
  (the path without a device model);
* **train step**: forward, backward and an SGD step of an MLP with ≈ D parameters on a batch of 64, on that
  device: the cost of one snapshot in training steps is torch / train step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

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


def row(device: torch.device, d: int, k: int, dtype: torch.dtype, repeats: int, step_s: float) -> str:
    gen = torch.Generator(device="cpu").manual_seed(0)
    stream = (torch.randn(k + 3 + repeats, d, generator=gen, dtype=torch.float64) * 1e-2).to(device)
    model = onlinefa.torch.OnlineEM(d, k, seed=0, dtype=dtype, device=device)
    model.update(stream[: k + 3])
    at = iter(range(k + 3, k + 3 + repeats))
    ours = median_seconds(lambda: model.update(stream[next(at)]), repeats, device)
    rust = onlinefa.OnlineEM(d, k, seed=0, dtype=str(dtype).removeprefix("torch."))
    rust.update(stream[: k + 3].cpu().numpy())
    at_host = iter(range(k + 3, k + 3 + repeats))
    host = median_seconds(lambda: rust.update(stream[next(at_host)].cpu().numpy()), repeats, device)
    buf = torch.ones((k + 3) * d, dtype=dtype, device=device)
    floor = median_seconds(lambda: buf.mul_(1.0000001), repeats, device)
    name = str(dtype).removeprefix("torch.")
    return (f"| {device} | {d:,} | {k} | {name} | {ours * 1e3:.1f} | {floor * 1e3:.2f} | {ours / floor:.0f}× | "
            f"{host * 1e3:.1f} | {ours / host:.2f}× | {step_s * 1e3:.1f} | {ours / step_s:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    devices = [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    cards = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none"
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} CPU threads; GPUs: {cards}")
    print()
    print("| device | D | K | state | torch ms | floor ms | × floor | host copy + Rust ms | torch / Rust | "
          "train step ms | snapshot in steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for device in devices:
        net, n_params = mlp_with(args.d, device)
        step_s = train_step_seconds(net, device, args.repeats)
        for dtype in (torch.float32, torch.float64):
            print(row(device, n_params, args.k, dtype, args.repeats, step_s), flush=True)


if __name__ == "__main__":
    main()
