"""``onlinefa demo``: the library's job in two tables, with the core install only (NumPy).

1. *Synthetic*: stream samples of a known factor-analysis model through the default online EM and SGA and the
   thesis's Algorithms 2 and 1, and print the relative covariance error at T = 1k/5k/20k beside the exact
   maximum-likelihood (batch) FA of the same samples.
2. *Real*: train a small NumPy network by SGD on a packaged UCI data set, feed its SGD iterates to the default
   :class:`onlinefa.OnlineEM`, and compare Bayesian model averaging on the test split under that posterior,
   SWAG-diagonal and the SWA point, with each posterior's width relative to the iterates' spread.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from . import _demo_mlp as mlp
from ._demo_batch import batch_fa
from .streaming import OnlineEM, OnlineSGA
from ._uci import UCI_DATASETS
from .errors import CommandError
from .datasets import make_fa_model, sample_fa
from .metrics import relative_covariance_distance

CHECKPOINTS = (1_000, 5_000, 20_000)
#: Label width of the rows of both tables (tests parse the rows by it).
LABEL = 22

_DESCRIPTION = """\
Show the job the library exists for, in two tables (NumPy only; about half a minute on two cores).

Synthetic: generate an FA model with thesis Algorithm 4 (D=1000, K=10, spectrum [1, 100]), stream 20,000 \
samples through the default online EM and SGA and the thesis's Algorithms 2 and 1, and print the relative \
covariance error ||S_hat - S||_F / ||S||_F after 1k, 5k and 20k samples and the update throughput, beside the \
exact maximum-likelihood FA of the same samples (batch EM on their sample covariance, run to convergence).

Real: train a one-hidden-layer tanh network (NumPy, manual backprop) by SGD on a packaged UCI regression data \
set (fixed 90/10 train/test split, standardised with the training split), then keep SGD at the same constant \
learning rate and record one snapshot of the weights per epoch; fit the default OnlineEM(D, K) to the \
snapshots and print the test NLL and RMSE of Bayesian model averaging under it, under SWAG-diagonal and at the \
SWA point, with each posterior's width ratio (mean over weights of its marginal variance over the snapshots' \
empirical variance)."""


def add_parser(commands: Any, summary: str) -> None:
    """Register the ``demo`` sub-command."""
    p = commands.add_parser(
        "demo",
        help=summary,
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--only", choices=("synthetic", "real"), help="run one of the two tables (default: both)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    syn = p.add_argument_group("synthetic table")
    syn.add_argument("--features", type=int, default=1000, help="D (default 1000)")
    syn.add_argument("--components", type=int, default=10, help="K (default 10)")
    real = p.add_argument_group("real table")
    real.add_argument("--dataset", choices=tuple(UCI_DATASETS), default="energy",
                      help="packaged UCI data set (default energy)")
    real.add_argument("--hidden", type=int, default=50, help="hidden units of the network (default 50)")
    real.add_argument("--pretrain-epochs", type=int, default=500, help="SGD epochs before the first snapshot "
                      "(default 500)")
    real.add_argument("--snapshots", type=int, default=200, help="T, snapshots (one per epoch) fed to the "
                      "posterior (default 200)")
    real.add_argument("--rank", type=int, default=10, help="K of the OnlineEM posterior (default 10)")
    real.add_argument("--learning-rate", type=float, default=0.05, help="constant SGD step size (default 0.05)")
    real.add_argument("--batch-size", type=int, default=32, help="rows per SGD step (default 32)")
    real.add_argument("--draws", type=int, default=30, help="posterior draws averaged by BMA (default 30)")
    p.set_defaults(handler=run)


def _at_least(args: argparse.Namespace, minimum: int, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value < minimum:
            raise CommandError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def _check(args: argparse.Namespace) -> None:
    """Refuse bad options with a clear message before any work is done."""
    if args.only != "real":
        _at_least(args, 2, "features")
        _at_least(args, 1, "components")
        if args.components >= args.features:
            raise CommandError(f"--components must be < --features, got {args.components} >= {args.features}")
    if args.only != "synthetic":
        _at_least(args, 1, "hidden", "rank", "batch_size", "draws")
        _at_least(args, 0, "pretrain_epochs")
        _at_least(args, 2, "snapshots")
        if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
            raise CommandError(f"--learning-rate must be a finite number > 0, got {args.learning_rate}")


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its tables; returns the exit code."""
    _check(args)
    if args.only != "real":
        run_synthetic(args)
    if args.only is None:
        print()
    if args.only != "synthetic":
        run_real(args)
    return 0


def run_synthetic(args: argparse.Namespace) -> None:
    """Print the synthetic table: online methods at T = 1k/5k/20k beside batch maximum-likelihood FA."""
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
    print(f"{'method':<{LABEL}}" + "".join(f"{f'T={t:,}':>12}" for t in CHECKPOINTS) + f"{'samples/s':>12}")
    for name, model in models.items():
        errors, elapsed, done = [], 0.0, 0
        for t in CHECKPOINTS:
            start = time.perf_counter()
            model.update(samples[done:t])
            elapsed += time.perf_counter() - start
            done = t
            errors.append(relative_covariance_distance(model.covariance(), true_cov))
        row = "".join(f"{e:>12.4f}" for e in errors)
        print(f"{name:<{LABEL}}{row}{done / elapsed:>12,.0f}")
    # The reference: exact ML factor analysis of the same first T samples (their covariance about their mean).
    scatter, total, done = np.zeros((d, d)), np.zeros(d), 0
    errors, iterations = [], []
    for t in CHECKPOINTS:
        block = samples[done:t]
        scatter += block.T @ block
        total += block.sum(axis=0)
        done = t
        mean = total / t
        fit = batch_fa(scatter / t - np.outer(mean, mean), k, seed=seed)
        errors.append(relative_covariance_distance(fit.covariance(), true_cov))
        iterations.append(f"{fit.n_iter}{'' if fit.converged else ' (not converged)'}")
    print(f"{'batch FA (ML)':<{LABEL}}" + "".join(f"{e:>12.4f}" for e in errors) + f"{'-':>12}")
    print("relative covariance error ||S_hat - S||_F / ||S||_F (lower is better)")
    print("batch FA (ML): the exact maximum-likelihood FA of the same first T samples, by batch EM on their "
          f"covariance in NumPy ({' / '.join(iterations)} iterations, relative tolerance 1e-8)")


def run_real(args: argparse.Namespace) -> None:
    """Print the real table: BMA on the test split under SWA, SWAG-diagonal and the default OnlineEM."""
    seed, h = args.seed, args.hidden
    split = mlp.load_split(args.dataset, seed)
    n_inputs = split.x_train.shape[1]
    d = mlp.n_parameters(n_inputs, h)
    if args.rank >= d:
        raise CommandError(f"--rank must be < D = {d} (the network's parameters), got {args.rank}")
    model = OnlineEM(d, args.rank, seed=seed)
    start = time.perf_counter()
    iterates = mlp.sgd_iterates(
        split, n_hidden=h, pretrain_epochs=args.pretrain_epochs, n_snapshots=args.snapshots,
        learning_rate=args.learning_rate, batch_size=args.batch_size, seed=seed,
    )
    train_seconds = time.perf_counter() - start
    run = mlp.RealRun(split, h, iterates)
    swa = iterates.mean(axis=0)
    residual = mlp.mlp_predict(swa, split.x_train, h) - split.y_train
    noise_variance = float(np.mean(residual**2))
    model.update(iterates)
    _, loadings, psi = model.snapshot()
    # One set of standard normals for both posteriors (common random numbers): z_s (D) for the diagonal part,
    # then h_s (K) for the factors.
    rng = np.random.default_rng(seed + 2)
    noise = rng.standard_normal((args.draws, d))
    latent = rng.standard_normal((args.draws, args.rank))
    rows = {
        "SWA (point)": (mlp.bma_scores(swa[None, :], run, noise_variance), 0.0),
        "SWAG-diagonal": (mlp.bma_scores(mlp.draw_swag_diagonal(iterates, noise), run, noise_variance),
                          mlp.width_ratio(iterates.var(axis=0), iterates)),
        "online EM (default)": (mlp.bma_scores(mlp.draw_online_em(model, noise, latent), run, noise_variance),
                                mlp.width_ratio(np.sum(loadings**2, axis=1) + psi, iterates)),
    }
    n_train, n_test = split.x_train.shape[0], split.x_test.shape[0]
    print(f"Real job: UCI {args.dataset} ({n_train} train / {n_test} test rows, split seed {seed}), "
          f"tanh MLP {n_inputs}-{h}-1 (D={d}) trained by SGD in NumPy ({train_seconds:.1f} s)")
    print(f"SGD: batch {args.batch_size}, constant learning rate {args.learning_rate:g}, weight decay "
          f"{mlp.WEIGHT_DECAY:g}; {args.pretrain_epochs} pre-training epochs, then T={args.snapshots} snapshots "
          f"(one per epoch) -> OnlineEM(D, K={args.rank}) with its defaults")
    print(f"{'method':<{LABEL}}{'test NLL':>12}{'test RMSE':>12}{'width ratio':>12}")
    for name, ((nll, rmse), ratio) in rows.items():
        print(f"{name:<{LABEL}}{nll:>12.4f}{rmse:>12.4f}{ratio:>12.4f}")
    print(f"BMA over {args.draws} draws (SWA: the running mean alone); Gaussian likelihood with noise variance "
          "the training mean squared residual at the SWA point; NLL (nats per test row) and RMSE in the "
          "target's units (lower is better)")
    print("width ratio: mean over weights of the posterior's marginal variance (SWAG-diagonal: the snapshots' "
          "variance; online EM: diag(F F^T) + psi) divided by the snapshots' empirical variance")
