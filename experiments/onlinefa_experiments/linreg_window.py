"""``linreg-window``: finite-window iterate averaging (thesis Figure 6.2, Mandt, Hoffman & Blei 2017).

Same synthetic problem and pre-training as ``linreg-iterates``; then 100 epochs of SGD at lr 0.1 and
weight decay 0.001 whose iterates are averaged over disjoint windows, each window mean being one
"posterior sample". Two (batch size, window size) settings as in the thesis: (100, 10), the window
suggested by theory (N / batch), and (10, 50), the tuned one. The thesis shows only the figure; this
experiment also reports the distances of the window means' empirical Gaussian from the true posterior.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from onlinefa import linreg
from onlinefa.errors import CommandError
from ._common import append_rows, output_dir, progress, read_rows
from .linreg_iterates import (
    DISTANCE_FIELDS,
    SYNTHETIC_KEY_FIELDS,
    FloatArray,
    SyntheticProblem,
    add_synthetic_arguments,
    empirical_gaussian,
    format_mean_se,
    gaussian_distances,
    make_problem,
    markdown_table,
    mean_and_standard_error,
    number_of_trials,
    plot_over_posterior,
    pretrain,
    rows_matching,
    synthetic_key,
)

NAME = "linreg-window"
HELP = "Figure 6.2: finite-window iterate averaging of linear-regression SGD vs the true posterior"

_KEY_FIELDS = ["batch_size", "window_size", "lr", "weight_decay", "epochs", *SYNTHETIC_KEY_FIELDS]
_FIELDS = [*_KEY_FIELDS, "trial", "n_window_means", *DISTANCE_FIELDS]


def _batch_window_pair(text: str) -> tuple[int, int]:
    """Parse ``"BATCH:WINDOW"`` (two positive integers)."""
    try:
        batch, window = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BATCH:WINDOW with two integers, got {text!r}") from None
    if batch < 1 or window < 1:
        raise argparse.ArgumentTypeError(f"batch and window sizes must be >= 1, got {text!r}")
    return batch, window


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    add_synthetic_arguments(parser, name=NAME)
    parser.add_argument(
        "--settings",
        type=_batch_window_pair,
        nargs="+",
        default=[(100, 10), (10, 50)],
        metavar="BATCH:WINDOW",
        help="(batch size, window size) pairs (default 100:10 10:50)",
    )
    parser.add_argument("--lr", type=float, default=0.1, help="collection learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.001, help="collection weight decay lambda")
    parser.add_argument("--epochs", type=int, default=100, help="collection epochs")


def window_samples(
    problem: SyntheticProblem,
    start: FloatArray,
    phase: linreg.SGDPhase,
    window_size: int,
    seed: np.random.Generator,
) -> list[FloatArray]:
    """Run the collection phase and return the window means.

    Parameters
    ----------
    problem : SyntheticProblem
    start : ndarray of shape (D,)
        Pre-trained parameters.
    phase : SGDPhase
    window_size : int
        Iterates per disjoint window.
    seed : numpy.random.Generator

    Returns
    -------
    list of ndarray of shape (D,)
    """
    means: list[FloatArray] = []
    linreg.run_sgd(problem.X, problem.y, start, phase, seed=seed, window_size=window_size, consumers=[means.append])
    return means


def _cell_key(args: argparse.Namespace, batch_size: int, window_size: int) -> dict[str, Any]:
    """CSV key columns of one (batch, window) setting."""
    return {"batch_size": batch_size, "window_size": window_size, "lr": args.lr,
            "weight_decay": args.weight_decay, "epochs": args.epochs, **synthetic_key(args)}


def _phase(args: argparse.Namespace, batch_size: int) -> linreg.SGDPhase:
    """The collection phase for ``batch_size``."""
    return linreg.SGDPhase(lr=args.lr, weight_decay=args.weight_decay, batch_size=batch_size, n_epochs=args.epochs)


def _run_trial(args: argparse.Namespace, batch_size: int, window_size: int, trial: int) -> dict[str, Any]:
    """One trial of one setting: distances of the window means' Gaussian from the posterior."""
    problem, seeds = make_problem(args, trial)
    start = pretrain(problem, seeds, args)
    means = window_samples(problem, start, _phase(args, batch_size), window_size, seeds.method)
    mean, covariance = empirical_gaussian(means)
    return {**_cell_key(args, batch_size, window_size), "trial": trial, "n_window_means": len(means),
            **gaussian_distances(mean, covariance, problem.posterior)}


def _summary_markdown(args: argparse.Namespace, rows: list[dict[str, str]], n_trials: int) -> str:
    """Markdown table of the distances per setting (the thesis gives only Figure 6.2)."""
    body = []
    for batch_size, window_size in args.settings:
        cell = [row for row in rows_matching(rows, _cell_key(args, batch_size, window_size))
                if int(row["trial"]) < n_trials]
        stats = {name: mean_and_standard_error(float(row[name]) for row in cell) for name in DISTANCE_FIELDS}
        n_means = cell[0]["n_window_means"] if cell else "–"
        body.append([str(batch_size), str(window_size), n_means, str(len(cell)),
                     *(format_mean_se(*stats[name]) for name in DISTANCE_FIELDS)])
    header = ["batch", "window", "window means", "trials", "rel. mean", "rel. cov", "W2", "W2²"]
    intro = (
        f"# linreg-window: thesis Figure 6.2 (finite-window iterate averaging)\n\n"
        f"lr {args.lr:g}, weight decay {args.weight_decay:g}, {args.epochs} collection epochs after "
        f"{args.pretrain_epochs} pre-training epochs (lr {args.pretrain_lr:g}, weight decay "
        f"{args.pretrain_weight_decay:g}, batch {args.pretrain_batch_size}); {n_trials} trials (seed {args.seed}). "
        f"Distances of the window means' empirical Gaussian from the true posterior, mean ± s.e. The thesis "
        f"reports no numbers for this experiment, only that (10, 50) looks much better than (100, 10).\n\n"
    )
    return intro + markdown_table(header, body)


def _plot_figure(args: argparse.Namespace, path: Path) -> None:
    """Figure 6.2: the window means of trial 0 for every setting over the posterior's contours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_panels = len(args.settings)
    fig, axes = plt.subplots(1, n_panels, figsize=(5 * n_panels, 4.2), squeeze=False)
    for ax, (batch_size, window_size) in zip(axes.flat, args.settings):
        problem, seeds = make_problem(args, 0)
        start = pretrain(problem, seeds, args)
        means = np.asarray(window_samples(problem, start, _phase(args, batch_size), window_size, seeds.method))
        plot_over_posterior(ax, problem.posterior, points=means, pretrained=start,
                            title=f"batch {batch_size}, window {window_size}")
    axes.flat[0].legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Run the experiment (resuming from the CSV in ``--out``) and write CSV, markdown and PNG.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options (see :func:`add_arguments`).

    Returns
    -------
    int
        0 on success.
    """
    n_trials = number_of_trials(args)
    for batch_size, window_size in args.settings:
        updates = args.epochs * math.ceil(args.n_samples / batch_size)
        if updates < 2 * window_size:
            raise CommandError(
                f"setting {batch_size}:{window_size} gives only {updates // window_size} window mean(s); "
                "need at least 2 (more epochs or a smaller window)"
            )
    out = output_dir(args.out)
    csv_path = out / "linreg_window.csv"
    done = read_rows(csv_path)
    todo = [
        (batch, window, trial)
        for batch, window in args.settings
        for trial in range(n_trials)
        if not rows_matching(done, {**_cell_key(args, batch, window), "trial": trial})
    ]
    for batch_size, window_size, trial in progress(todo, total=len(todo), desc=NAME):
        append_rows(csv_path, [_run_trial(args, batch_size, window_size, trial)], _FIELDS)
    summary = _summary_markdown(args, read_rows(csv_path), n_trials)
    (out / "figure_6_2.md").write_text(summary)
    _plot_figure(args, out / "figure_6_2.png")
    print(summary)
    return 0
