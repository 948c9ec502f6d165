"""Per-update time of the torch streaming models (OnlineEM, OnlineSGA, VIFA) on every device present, against the
device's own memory floor, the Rust core fed through a host copy, and one training step of a network with as many
parameters.

Run by hand::

    python benches/device.py                    # D = 10⁶, K = 10, float32 and float64, every device
    python benches/device.py --d 2000000 --k 10,20
    python benches/device.py --devices cuda --d 100000000 --k 10,20 --dtypes float32 --passes plain,triton \
        --no-host --models OnlineEM           # what benches/gpu_check.sh runs
    python benches/device.py --snapshot-cost    # a per-step snapshot of a ResNet-50-sized network
    python benches/device.py --sharded          # the same over NCCL, one rank per GPU (two GPUs or more)

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

``--passes plain,triton`` times each CUDA row twice: with the plain torch pass (``ONLINEFA_TRITON=0``) and with
the fused Triton pass (K ≤ 16; above it the plain pass runs and the row says so). The updates cycle through 8
rows drawn once on the device, so that D = 10⁸ needs no host memory for the stream.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

import onlinefa
import onlinefa.torch
from onlinefa.torch._triton_common import SWITCH, available as fused_available
from device_snapshots import sharded_rows, snapshot_cost_rows


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


#: Rows drawn once per bench row on the device; the timed updates cycle through them.
POOL_ROWS = 8


def row(kind: str, device: torch.device, d: int, k: int, dtype: torch.dtype, repeats: int, step_s: float,
        fused: bool | None, host: bool) -> str:
    """One table row. ``fused``: None leaves the pass to the model (CPU rows), False / True force the plain or the
    Triton pass on CUDA. ``host``: also time the host copy + Rust core column."""
    if fused is not None:
        os.environ[SWITCH] = "1" if fused else "0"
    ours, host_s = update_seconds(kind, device, d, k, dtype, repeats, host)
    floor = floor_seconds(streaming_vectors(kind, k) * d, dtype, device, repeats)
    name = str(dtype).removeprefix("torch.")
    passes = {None: "auto", False: "plain", True: "triton" if fused_available(device, k) else "plain (K > 16)"}
    host_cells = (f"{host_s * 1e3:.1f} | {ours / host_s:.2f}×" if host else "– | –")
    return (f"| {kind} | {device} | {passes[fused]} | {d:,} | {k} | {name} | {ours * 1e3:.2f} | {floor * 1e3:.2f} | "
            f"{ours / floor:.1f}× | {host_cells} | {step_s * 1e3:.1f} | {ours / step_s:.2f} |")


def update_seconds(kind: str, device: torch.device, d: int, k: int, dtype: torch.dtype, repeats: int,
                   host: bool) -> tuple[float, float]:
    """Median seconds of one update of the device model and (``host``; else NaN) of the Rust model fed through a
    host copy, cycling through ``POOL_ROWS`` rows drawn once on the device."""
    gen = torch.Generator(device=device).manual_seed(0)
    pool = torch.randn(POOL_ROWS, d, generator=gen, dtype=dtype, device=device) * 1e-2
    models = streaming(kind, d, k, dtype, device)
    warm = k + 3  # past any warm-up
    for i in range(warm):
        models.update_ours(models.ours, pool[i % POOL_ROWS])
        if host:
            models.update_rust(models.rust, pool[i % POOL_ROWS].cpu().numpy())
    at = iter(range(warm, warm + repeats))
    ours = median_seconds(lambda: models.update_ours(models.ours, pool[next(at) % POOL_ROWS]), repeats, device)
    if not host:
        return ours, float("nan")
    at_host = iter(range(warm, warm + repeats))
    return ours, median_seconds(
        lambda: models.update_rust(models.rust, pool[next(at_host) % POOL_ROWS].cpu().numpy()), repeats, device)


def floor_seconds(n_values: int, dtype: torch.dtype, device: torch.device, repeats: int) -> float:
    """Median seconds of one in-place read+write of ``n_values`` values on the device."""
    buf = torch.ones(n_values, dtype=dtype, device=device)
    return median_seconds(lambda: buf.mul_(1.0000001), repeats, device)


def streaming_vectors(kind: str, k: int) -> int:
    """D-sized vectors of state: (K + 3) for OnlineEM and OnlineSGA, (K + 2) for VIFA with SGD."""
    return k + 2 if kind == "VIFA" else k + 3


def update_rows(args: argparse.Namespace) -> None:
    devices = [torch.device(name) for name in args.devices] if args.devices else (
        [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())])
    print("| model | device | pass | D | K | state | torch ms | floor ms | × floor | host copy + Rust ms | "
          "torch / Rust | train step ms | snapshot in steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for device in devices:
        net, n_params = mlp_with(args.d, device)
        step_s = train_step_seconds(net, device, args.repeats)
        del net
        passes: list[bool | None] = [None]
        if device.type == "cuda":
            passes = [name == "triton" for name in args.passes]
        for kind in args.models:
            for k in args.k:
                for dtype in args.dtypes:
                    for fused in passes:
                        print(row(kind, device, n_params, k, dtype, args.repeats, step_s, fused, args.host),
                              flush=True)
                        if device.type == "cuda":
                            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--k", type=lambda v: [int(x) for x in v.split(",")], default=[10])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", type=lambda v: v.split(","), default=["OnlineEM", "OnlineSGA", "VIFA"])
    parser.add_argument("--devices", type=lambda v: v.split(","), default=None,
                        help="e.g. cuda or cpu,cuda:0 (default: the CPU and every GPU)")
    parser.add_argument("--dtypes", type=lambda v: [getattr(torch, x) for x in v.split(",")],
                        default=[torch.float32, torch.float64])
    parser.add_argument("--passes", type=lambda v: v.split(","), default=["plain", "triton"],
                        help="CUDA rows: plain, triton or both (default both)")
    parser.add_argument("--no-host", dest="host", action="store_false",
                        help="leave out the host copy + Rust column (slow at D = 10⁸)")
    parser.add_argument("--snapshot-cost", action="store_true",
                        help="instead: a per-step snapshot of a ResNet-50-sized network against its training step")
    parser.add_argument("--sharded", action="store_true", help="instead: OnlineEM sharded over NCCL, one rank per GPU")
    args = parser.parse_args()
    cards = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none"
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} CPU threads; GPUs: {cards}")
    print()
    if args.snapshot_cost:
        snapshot_cost_rows(args.k, args.repeats)
    elif args.sharded:
        sharded_rows(args.d, args.k, args.repeats)
    else:
        update_rows(args)


if __name__ == "__main__":
    main()
