"""``onlinefa demo``: recover a synthetic factor-analysis model with both online algorithms."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ._models import OnlineEM, OnlineSGA
from .datasets import make_fa_model, sample_fa
from .metrics import relative_covariance_distance

CHECKPOINTS = (1_000, 5_000, 20_000)


def add_parser(commands: Any) -> None:
    """Register the ``demo`` sub-command."""
    p = commands.add_parser(
        "demo",
        help="fit a synthetic FA model (D=1000, K=10) with online EM and SGA and print the errors",
        description="Generate an FA model with thesis Algorithm 4 (D=1000, K=10, spectrum [1, 100]), stream "
        "20,000 samples through online EM and online SGA, and print the relative covariance error "
        "||S_hat - S||_F / ||S||_F after 1k, 5k and 20k samples, plus update throughput.",
    )
    p.add_argument("--features", type=int, default=1000, help="D (default 1000)")
    p.add_argument("--components", type=int, default=10, help="K (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of model, samples and initialisation")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its table; returns the exit code."""
    d, k, seed = args.features, args.components, args.seed
    c, loadings, psi = make_fa_model(d, k, spectrum=(1.0, 100.0), seed=seed)
    true_cov = loadings @ loadings.T + np.diag(psi)
    samples = sample_fa(c, loadings, psi, CHECKPOINTS[-1], seed=seed + 1)
    models: dict[str, OnlineEM | OnlineSGA] = {
        "online EM": OnlineEM(d, k, seed=seed),
        "online SGA": OnlineSGA(d, k, seed=seed),
        "Algorithm 2": OnlineEM.algorithm2(d, k, seed=seed),
        "Algorithm 1": OnlineSGA.algorithm1(d, k, seed=seed),
    }
    print(f"Synthetic FA model: D={d}, K={k}, spectrum [1, 100] (thesis Algorithm 4), seed {seed}")
    print("online EM / SGA: the defaults (whitened, scale-equivariant); Algorithm 2 / 1: the thesis's algorithms")
    print(f"{'method':<12}" + "".join(f"{f'T={t:,}':>12}" for t in CHECKPOINTS) + f"{'samples/s':>12}")
    for name, model in models.items():
        errors, elapsed, done = [], 0.0, 0
        for t in CHECKPOINTS:
            start = time.perf_counter()
            model.update(samples[done:t])
            elapsed += time.perf_counter() - start
            done = t
            errors.append(relative_covariance_distance(model.covariance(), true_cov))
        row = "".join(f"{e:>12.4f}" for e in errors)
        print(f"{name:<12}{row}{done / elapsed:>12,.0f}")
    print("relative covariance error ||S_hat - S||_F / ||S||_F (lower is better)")
    return 0
