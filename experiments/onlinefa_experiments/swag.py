"""``swag``: SWAG baselines against onlinefa's posteriors on small MLPs trained with SGD (PyTorch).

Per data set (scikit-learn's ``digits`` / ``breast_cancer``, the packaged UCI regression sets) and seed:
a ReLU MLP is pre-trained with plain SGD, then trained on at a constant learning rate while snapshots
stream into SWA, SWAG-diagonal, SWAG (rank K), ``onlinefa.OnlineEM`` and ``onlinefa.OnlineSGA`` (both
with their default arguments). VIFA then starts from SWAG's Gaussian (mean θ_SWA) and optimises the
ELBO; MultiSWAG mixes the seeds' SWAG posteriors. Every posterior predicts by Bayesian model averaging
over parameter draws. Results: ``swag.csv`` (one row per data set, seed and method), ``swag.md`` (mean ±
standard error over seeds and paired differences against SWAG-diagonal), ``reliability.png`` and the
SWA vectors ``swa_<data set>_seed<k>.npy``. Needs the ``experiments`` and ``torch`` extras.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from onlinefa.errors import CommandError
from ._common import append_rows, output_dir, progress
from ._swag_data import CLASSIFICATION_SETS, REGRESSION_SETS, load_task

NAME = "swag"
HELP = "SWAG / SWAG-diagonal / MultiSWAG against OnlineEM, OnlineSGA and VIFA on MLPs (digits, UCI)"

#: Settings of ``--short``: one data set, a few epochs, few draws, two seeds (well under a minute).
SHORT: dict[str, Any] = {"datasets": ["digits"], "seeds": 2, "pretrain_epochs": 4, "collect_epochs": 4,
                         "snapshots_per_epoch": 10, "n_draws": 4, "vifa_epochs": 1, "rank": 5}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    names = (*CLASSIFICATION_SETS, *REGRESSION_SETS)
    parser.add_argument("--out", type=Path, default=Path("results") / NAME, help="output folder")
    parser.add_argument("--datasets", nargs="+", choices=names,
                        default=["digits", "breast_cancer", "energy", "concrete"])
    parser.add_argument("--seeds", type=int, default=5, help="training seeds (>= 2)")
    parser.add_argument("--seed", type=int, default=0, help="base seed")
    parser.add_argument("--hidden", type=int, nargs="+", default=[50, 50], help="hidden layer widths")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--pretrain-epochs", type=int, default=100)
    parser.add_argument("--pretrain-lr", type=float, default=0.05)
    parser.add_argument("--collect-epochs", type=int, default=50, help="constant-learning-rate epochs")
    parser.add_argument("--collect-lr", type=float, default=0.05)
    parser.add_argument("--snapshots-per-epoch", type=int, default=5)
    parser.add_argument("--rank", type=int, default=20, help="K of SWAG, OnlineEM, OnlineSGA and VIFA")
    parser.add_argument("--n-draws", type=int, default=30, help="parameter draws per posterior")
    parser.add_argument("--vifa-epochs", type=int, default=10)
    parser.add_argument("--vifa-lr", type=float, default=1e-4, help="Adam rate of VIFA's mean and loadings")
    parser.add_argument("--vifa-lr-log-noise", type=float, default=1e-2, help="Adam rate of VIFA's log ψ")
    parser.add_argument("--short", action="store_true", help="tiny run (digits, 2 seeds, few epochs)")


def _settings(args: argparse.Namespace, n_train: int) -> Any:
    from ._swag_train import TrainSettings

    steps_per_epoch = math.ceil(n_train / args.batch_size)
    every = max(1, steps_per_epoch // args.snapshots_per_epoch)
    return TrainSettings(tuple(args.hidden), args.batch_size, args.weight_decay, args.pretrain_epochs,
                         args.pretrain_lr, args.collect_epochs, args.collect_lr, every)


def _check(args: argparse.Namespace) -> None:
    if args.seeds < 2 or args.rank < 2 or args.n_draws < 1 or args.snapshots_per_epoch < 1:
        raise CommandError("need --seeds >= 2, --rank >= 2, --n-draws >= 1 and --snapshots-per-epoch >= 1")
    if args.collect_epochs * args.snapshots_per_epoch < args.rank:
        raise CommandError("fewer snapshots than --rank: raise --collect-epochs or --snapshots-per-epoch")


def _run_dataset(args: argparse.Namespace, name: str, out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All seeds of one data set plus MultiSWAG; returns CSV rows and pooled test probabilities."""
    from ._swag_run import VifaSettings, evaluate_multiswag, run_seed
    from ._swag_train import build_mlp

    task = load_task(name)
    settings = _settings(args, task.X_train.shape[0])
    vifa_settings = VifaSettings(args.vifa_epochs, args.vifa_lr, args.vifa_lr_log_noise)
    index = (*CLASSIFICATION_SETS, *REGRESSION_SETS).index(name)
    rows: list[dict[str, Any]] = []
    results = []
    for seed in progress(range(args.seeds), total=args.seeds, desc=f"{NAME} {name}"):
        result, noise = run_seed(task, settings, vifa_settings, args.rank, args.n_draws,
                                 np.random.SeedSequence([args.seed, index, seed]))
        np.save(out / f"swa_{name}_seed{seed}.npy", result.swa)
        rows += [{"dataset": name, "seed": seed, "noise_variance": noise, **row} for row in result.rows]
        results.append(result)
    model = build_mlp(task.X_train.shape[1], settings.hidden, task.n_outputs)
    multi_seed = int(np.random.SeedSequence([args.seed, index, 10**6]).generate_state(1)[0])
    multi_row, multi_outputs = evaluate_multiswag(model, results, task, float(np.mean([r["noise_variance"]
                                                  for r in rows])), args.n_draws, multi_seed)
    rows.append({"dataset": name, "seed": "all", "noise_variance": math.nan, **multi_row})
    pooled: dict[str, Any] = {}
    if task.kind == "classification":
        labels = np.tile(task.y_test.astype(np.int64), args.seeds)
        for method in results[0].probabilities:
            pooled[method] = (np.concatenate([r.probabilities[method] for r in results]), labels)
        pooled["multiswag"] = (multi_outputs, task.y_test.astype(np.int64))
    common = {"n_train": task.X_train.shape[0], "n_test": task.X_test.shape[0], "every": settings.every,
              "n_params": results[0].swa.size, "n_snapshots": results[0].swag.n_seen}
    return [{**common, **row} for row in rows], pooled


def run(args: argparse.Namespace) -> int:
    """Run the experiment and write ``swag.csv``, ``swag.md``, ``reliability.png`` to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options (see :func:`add_arguments`).

    Returns
    -------
    int
        0 on success.
    """
    if args.short:
        for key, value in SHORT.items():
            setattr(args, key, value)
    _check(args)
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as err:
        raise CommandError(
            "the swag experiment needs PyTorch (pip install torch, or pip install \".[torch]\" in onlinefa's source tree)"
        ) from err
    from ._calibration import plot_reliability
    from ._swag_report import FIELDS, METHODS, summary_markdown

    out = output_dir(args.out)
    csv_path = out / "swag.csv"
    csv_path.unlink(missing_ok=True)
    panels: dict[str, Any] = {}
    all_rows: list[dict[str, Any]] = []
    for name in args.datasets:
        rows, pooled = _run_dataset(args, name, out)
        append_rows(csv_path, rows, FIELDS)
        all_rows += rows
        if pooled:
            panels[name] = {METHODS[method]: value for method, value in pooled.items()}
    summary = summary_markdown(args, all_rows)
    (out / "swag.md").write_text(summary)
    plot_reliability(panels, out / "reliability.png")
    print(summary)
    return 0
