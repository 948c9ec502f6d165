"""Weak scaling of the sharded online EM on this machine: fixed rows per rank, 1 and 2 ranks over gloo.

    python benches/sharded.py [--rows 200000] [--k 10] [--updates 30]

Each rank runs one rayon thread (RAYON_NUM_THREADS=1), so 2 ranks use the machine's 2 cores. Reported per
configuration (medians over the timed updates, rank 0): ms per update, ms of the one collective per update
measured alone with the same packet, its share of an update, the bytes each rank sends and receives per
sample, and the weak-scaling efficiency t(1 rank) / t(w ranks) (1.0 = perfect).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time


def worker(rank: int, world: int, tmp: str, rows: int, k: int, updates: int) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"
    import numpy as np
    import torch.distributed as dist

    from onlinefa.distributed import ShardedOnlineEM
    from onlinefa.distributed._comm import Communicator

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    rng = np.random.default_rng(rank)
    model = ShardedOnlineEM(rows, k, seed=0)
    warm = rng.standard_normal((model.n_warmup + 3, rows))
    model.update(warm)
    x = rng.standard_normal((updates, rows))
    update_ms = []
    for i in range(updates):
        start = time.perf_counter()
        model.update(x[i])
        update_ms.append(1e3 * (time.perf_counter() - start))
    comm = Communicator()
    packet = np.zeros(2 * world + k * k + k + 1)
    collective_ms = []
    for _ in range(5 * updates):
        start = time.perf_counter()
        comm.sum(packet, "bench")
        collective_ms.append(1e3 * (time.perf_counter() - start))
    if rank == 0:
        with open(f"{tmp}/result.txt", "w") as out:
            out.write(f"{statistics.median(update_ms)} {statistics.median(collective_ms)} {packet.size}\n")
    dist.destroy_process_group()


def measure(world: int, rows: int, k: int, updates: int) -> tuple[float, float, int]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(world, tmp, rows, k, updates), nprocs=world, join=True)
        update_ms, collective_ms, length = open(f"{tmp}/result.txt").read().split()
    return float(update_ms), float(collective_ms), int(length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows (features) per rank")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--updates", type=int, default=30)
    args = parser.parse_args()
    print(f"rows per rank {args.rows:,}, K = {args.k}, float64, {args.updates} timed updates, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| ranks | D total | ms/update | collective ms | collective share | bytes sent / received per rank "
          "per sample | weak-scaling efficiency |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for world in (1, 2):
        update_ms, collective_ms, length = measure(world, args.rows, args.k, args.updates)
        base = base or update_ms
        sent, received = 8 * length, 8 * length * (world - 1)
        print(f"| {world} | {world * args.rows:,} | {update_ms:.2f} | {collective_ms:.3f} | "
              f"{collective_ms / update_ms:.1%} | {sent:,} / {received:,} | {base / update_ms:.2f} |")


if __name__ == "__main__":
    main()
