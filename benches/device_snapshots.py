"""The parts of ``benches/device.py`` beyond one model's update: the cost of a per-step snapshot of a ResNet-50-sized
network against its training step, and OnlineEM sharded over NCCL with one rank per GPU."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import onlinefa
import onlinefa.distributed
import onlinefa.torch


def _synchronised_seconds(call: Callable[[], object], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Bottleneck(torch.nn.Module):
    """ResNet's bottleneck block: 1×1 down to ``width``, 3×3 (with ``stride``), 1×1 up to 4·width, plus the skip."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(inputs, width, 1, bias=False), torch.nn.BatchNorm2d(width), torch.nn.ReLU(),
            torch.nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), torch.nn.BatchNorm2d(width),
            torch.nn.ReLU(), torch.nn.Conv2d(width, out, 1, bias=False), torch.nn.BatchNorm2d(out))
        self.skip: torch.nn.Module = torch.nn.Identity()
        if stride != 1 or inputs != out:
            self.skip = torch.nn.Sequential(torch.nn.Conv2d(inputs, out, 1, stride=stride, bias=False),
                                            torch.nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(classes: int = 1000) -> torch.nn.Module:
    """ResNet-50 (He et al., "Deep residual learning for image recognition", 2016): stages of 3, 4, 6 and 3
    bottleneck blocks, 25.6 million parameters for 1000 classes."""
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                     torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)]
    inputs = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for block in range(blocks):
            layers.append(Bottleneck(inputs, width, stride if block == 0 else 1))
            inputs = 4 * width
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(inputs, classes)]
    return torch.nn.Sequential(*layers)


def snapshot_cost_rows(ks: list[int], repeats: int, batch: int = 64) -> None:
    """Per K: one training step of ResNet-50 (batch of ``batch`` 224×224 images, SGD with momentum) and one
    ``SnapshotCollector.collect()`` into a float32 ``OnlineEM`` on the same device (the gather of θ and the
    update), medians over ``repeats`` after warm-up."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    net = resnet50().to(device)
    d = sum(p.numel() for p in net.parameters())
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    step_s = _synchronised_seconds(step, repeats, device)
    print(f"ResNet-50 built in code: D = {d:,} parameters, batch {batch} of 224×224, {device}")
    print()
    print("| K | state | train step ms | snapshot ms | snapshot / step |")
    print("|---|---|---|---|---|")
    for k in ks:
        posterior = onlinefa.OnlineEM(d, k, seed=0, dtype="float32", device=device)
        collector = onlinefa.torch.SnapshotCollector(posterior, net)
        for _ in range(k + 3):  # past the warm-up
            step()
            collector.collect()
        snapshot_s = _synchronised_seconds(collector.collect, repeats, device)
        print(f"| {k} | float32 | {step_s * 1e3:.1f} | {snapshot_s * 1e3:.2f} | {snapshot_s / step_s:.3f} |",
              flush=True)
        del collector, posterior
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _sharded_rank(rank: int, world: int, port: int, d: int, ks: list[int], repeats: int) -> None:
    cuda = torch.cuda.is_available()
    backend, device = ("nccl", torch.device("cuda", rank)) if cuda else ("gloo", torch.device("cpu"))
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        local = d // world + (1 if rank < d % world else 0)
        gen = torch.Generator(device=device).manual_seed(rank)
        pool = torch.randn(8, local, generator=gen, device=device) * 1e-2
        for k in ks:
            model = onlinefa.distributed.ShardedOnlineEM(local, k, seed=0, dtype="float32", device=device)
            for i in range(k + 3):
                model.update(pool[i % 8])
            at = iter(range(repeats))
            seconds = _synchronised_seconds(lambda: model.update(pool[next(at) % 8]), repeats, device)
            if rank == 0:
                print(f"| {world} | {backend} | {d:,} | {k} | float32 | {seconds * 1e3:.2f} |", flush=True)
    finally:
        dist.destroy_process_group()


def sharded_rows(d: int, ks: list[int], repeats: int) -> None:
    """OnlineEM over NCCL with one rank per GPU (D split evenly), medians of one update on rank 0. With fewer than
    two GPUs there is nothing to shard across: ``ONLINEFA_BENCH_RANKS=N`` runs N gloo ranks on the CPU instead
    (a check of this script, not a measurement)."""
    world = torch.cuda.device_count()
    if world < 2:
        world = int(os.environ.get("ONLINEFA_BENCH_RANKS", "0"))
        if world < 2:
            print("sharded run: fewer than two GPUs, not run")
            return
    print("| ranks | backend | D | K | state | update ms (rank 0) |")
    print("|---|---|---|---|---|---|")
    mp.spawn(_sharded_rank, args=(world, _free_port(), d, ks, repeats), nprocs=world, join=True)
