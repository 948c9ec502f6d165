"""``linreg-iterates``: are SGD iterates samples from the posterior? (thesis Table 6.1 and Figure 6.1).

Per trial: 1000 inputs x ~ N(0, [[1, .5], [.5, 1]]), theta ~ N(0, 100 I), y = theta^T x + eps with
beta = 0.1; the true posterior (alpha = 0.01) in closed form; SGD pre-training (500 epochs, lr 0.001,
batch 100, no weight decay) from a ``torch.nn.Linear``-style initialisation; then 100 epochs at
lr in {0.1, 0.01} and weight decay lambda in {0.1, 0.001}, collecting the parameter vector after every
update (1000 iterates). The iterates' empirical Gaussian is compared with the posterior: relative mean
distance, relative covariance distance, and the 2-Wasserstein distance W2 together with W2^2 (the
thesis's "Wasserstein" column behaves like W2^2: its values match the squared distance, not W2).

The module also holds the helpers the other synthetic linear-regression experiments (``linreg-window``,
``linreg-vifa``) share: the per-trial problem, seeds, distances, summaries and the contour plot.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from onlinefa import linreg
from onlinefa.metrics import relative_covariance_distance, relative_mean_distance, wasserstein2
from onlinefa.errors import CommandError
from ._common import append_rows, output_dir, progress, read_rows

if TYPE_CHECKING:
    from matplotlib.axes import Axes

NAME = "linreg-iterates"
HELP = "Table 6.1 / Figure 6.1: SGD iterates of linear regression vs the true posterior"

FloatArray = NDArray[np.float64]

#: Thesis Table 6.1: (lr, lambda) -> (relative mean, relative covariance, "Wasserstein"), each (mean, s.e.).
THESIS_TABLE_6_1: dict[tuple[float, float], tuple[tuple[float, float], ...]] = {
    (0.1, 0.1): ((0.0666, 0.0078), (0.6200, 0.0750), (1.3480, 0.5087)),
    (0.1, 0.001): ((0.0006, 0.0001), (0.8065, 0.0101), (0.0078, 0.0004)),
    (0.01, 0.1): ((0.0620, 0.0070), (1.7110, 0.6187), (1.1776, 0.4434)),
    (0.01, 0.001): ((0.0010, 0.0002), (0.9870, 0.0042), (0.0219, 0.0006)),
}

#: Columns of every per-trial distance record.
DISTANCE_FIELDS: list[str] = ["rel_mean", "rel_cov", "w2", "w2_squared"]

_FEATURE_COVARIANCE = ((1.0, 0.5), (0.5, 1.0))

#: Options of :func:`add_synthetic_arguments` that determine a trial's data (CSV key columns).
DATA_KEY_FIELDS: list[str] = ["seed", "n_samples", "prior_precision", "noise_precision"]

#: The same plus the pre-training options (``pretrain=True``).
SYNTHETIC_KEY_FIELDS: list[str] = [
    *DATA_KEY_FIELDS,
    "pretrain_epochs",
    "pretrain_lr",
    "pretrain_weight_decay",
    "pretrain_batch_size",
]


# ---------------------------------------------------------------------------------------------------
# Shared by the synthetic linear-regression experiments
# ---------------------------------------------------------------------------------------------------


class SyntheticProblem(NamedTuple):
    """One trial's data and its exact posterior."""

    X: FloatArray
    y: FloatArray
    posterior: linreg.LinearRegressionPosterior


class TrialSeeds(NamedTuple):
    """Independent generators for the parts of one trial."""

    data: np.random.Generator
    init: np.random.Generator
    pretrain: np.random.Generator
    method: np.random.Generator


def trial_seeds(base_seed: int, trial: int) -> TrialSeeds:
    """Independent generators for trial ``trial`` (a pure function of ``(base_seed, trial)``).

    Parameters
    ----------
    base_seed : int
        The experiment's ``--seed``.
    trial : int
        Trial index.

    Returns
    -------
    TrialSeeds
        Generators for the data, the initial parameters, the pre-training shuffles and the method.
    """
    children = np.random.SeedSequence([int(base_seed), int(trial)]).spawn(4)
    data, init, pretrain, method = (np.random.default_rng(child) for child in children)
    return TrialSeeds(data=data, init=init, pretrain=pretrain, method=method)


def synthetic_problem(
    seeds: TrialSeeds, *, n_samples: int, prior_precision: float, noise_precision: float
) -> SyntheticProblem:
    """Draw the thesis's synthetic data (Section 6.1.1) and compute its posterior.

    Parameters
    ----------
    seeds : TrialSeeds
        ``seeds.data`` draws the inputs, the true parameter and the noise.
    n_samples : int
        Number of rows (thesis: 1000).
    prior_precision : float
        alpha (thesis: 0.01), used both to draw theta and for the posterior.
    noise_precision : float
        beta (thesis: 0.1).

    Returns
    -------
    SyntheticProblem
    """
    X, y, _ = linreg.make_synthetic_regression(
        n_samples,
        feature_covariance=_FEATURE_COVARIANCE,
        prior_precision=prior_precision,
        noise_precision=noise_precision,
        seed=seeds.data,
    )
    exact = linreg.posterior(X, y, prior_precision=prior_precision, noise_precision=noise_precision)
    return SyntheticProblem(X=X, y=y, posterior=exact)


def pretrain(problem: SyntheticProblem, seeds: TrialSeeds, args: argparse.Namespace) -> FloatArray:
    """Pre-train from a ``torch.nn.Linear``-style start with the ``--pretrain-*`` options.

    Parameters
    ----------
    problem : SyntheticProblem
        The trial's data.
    seeds : TrialSeeds
        ``init`` and ``pretrain`` generators are used.
    args : argparse.Namespace
        ``pretrain_epochs``, ``pretrain_lr``, ``pretrain_weight_decay``, ``pretrain_batch_size``.

    Returns
    -------
    ndarray of shape (D,)
        The pre-trained parameter vector.
    """
    start = linreg.init_parameters(problem.X.shape[1], seeds.init)
    phase = linreg.SGDPhase(
        lr=args.pretrain_lr,
        weight_decay=args.pretrain_weight_decay,
        batch_size=args.pretrain_batch_size,
        n_epochs=args.pretrain_epochs,
    )
    return linreg.run_sgd(problem.X, problem.y, start, phase, seed=seeds.pretrain).theta


def gaussian_distances(
    mean: FloatArray, covariance: FloatArray, exact: linreg.LinearRegressionPosterior
) -> dict[str, float]:
    """Distances of N(mean, covariance) from the exact posterior.

    Parameters
    ----------
    mean : ndarray of shape (D,)
    covariance : ndarray of shape (D, D)
    exact : LinearRegressionPosterior

    Returns
    -------
    dict
        ``rel_mean``, ``rel_cov``, ``w2`` (the 2-Wasserstein distance) and ``w2_squared``.
    """
    distance = wasserstein2(exact.mean, exact.covariance, mean, covariance)
    return {
        "rel_mean": relative_mean_distance(mean, exact.mean),
        "rel_cov": relative_covariance_distance(covariance, exact.covariance),
        "w2": distance,
        "w2_squared": distance**2,
    }


def empirical_gaussian(samples: Sequence[FloatArray]) -> tuple[FloatArray, FloatArray]:
    """Mean and unbiased covariance of a list of vectors.

    Parameters
    ----------
    samples : sequence of ndarray of shape (D,)
        At least two vectors.

    Returns
    -------
    mean : ndarray of shape (D,)
    covariance : ndarray of shape (D, D)
    """
    if len(samples) < 2:
        raise ValueError(f"need at least two samples for an empirical covariance, got {len(samples)}")
    stacked = np.asarray(samples, dtype=np.float64)
    return stacked.mean(axis=0), np.atleast_2d(np.cov(stacked, rowvar=False))


def mean_and_standard_error(values: Iterable[float]) -> tuple[float, float]:
    """Mean and standard error (sample s.d. / sqrt(n); 0 for a single value).

    Parameters
    ----------
    values : iterable of float

    Returns
    -------
    (float, float)
    """
    array = np.asarray(list(values), dtype=np.float64)
    if array.size == 0:
        return math.nan, math.nan
    if array.size == 1:
        return float(array[0]), 0.0
    return float(array.mean()), float(array.std(ddof=1) / math.sqrt(array.size))


def format_mean_se(mean: float, standard_error: float, digits: int = 4) -> str:
    """``"m ± se"`` with ``digits`` decimals."""
    return f"{mean:.{digits}f} ± {standard_error:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table.

    Parameters
    ----------
    header : sequence of str
    rows : iterable of sequences of str

    Returns
    -------
    str
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines) + "\n"


def rows_matching(rows: Iterable[Mapping[str, str]], key: Mapping[str, Any]) -> list[Mapping[str, str]]:
    """Rows of a CSV whose columns equal ``key`` (values compared as ``str``; None as the empty string)."""
    wanted = {name: "" if value is None else str(value) for name, value in key.items()}
    return [row for row in rows if all(row.get(name) == value for name, value in wanted.items())]


def add_synthetic_arguments(parser: argparse.ArgumentParser, *, name: str, pretrain: bool = True) -> None:
    """Options shared by the synthetic linear-regression experiments (data, trials, pre-training).

    Parameters
    ----------
    parser : argparse.ArgumentParser
    name : str
        The experiment's name (default output folder ``results/<name>``).
    pretrain : bool, default True
        Also add the ``--pretrain-*`` options.
    """
    parser.add_argument("--out", type=Path, default=Path("results") / name, help="output folder")
    parser.add_argument("--trials", type=int, default=None, help="trials (default 10; 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer trials (3)")
    parser.add_argument("--seed", type=int, default=0, help="base seed; trial t uses (seed, t)")
    parser.add_argument("--n-samples", type=int, default=1000, help="data points per trial")
    parser.add_argument("--prior-precision", type=float, default=0.01, help="alpha")
    parser.add_argument("--noise-precision", type=float, default=0.1, help="beta")
    if not pretrain:
        return
    parser.add_argument("--pretrain-epochs", type=int, default=500)
    parser.add_argument("--pretrain-lr", type=float, default=0.001)
    parser.add_argument(
        "--pretrain-weight-decay",
        type=float,
        default=0.0,
        help="weight decay while pre-training (default 0, as the thesis's code did)",
    )
    parser.add_argument("--pretrain-batch-size", type=int, default=100)


def synthetic_key(args: argparse.Namespace) -> dict[str, Any]:
    """The data (and, if present, pre-training) settings of a synthetic experiment, as CSV key columns."""
    return {name: getattr(args, name) for name in SYNTHETIC_KEY_FIELDS if hasattr(args, name)}


def number_of_trials(args: argparse.Namespace) -> int:
    """``--trials``, defaulting to 10 (3 with ``--quick``); at least 1."""
    trials = args.trials if args.trials is not None else (3 if args.quick else 10)
    if trials < 1:
        raise CommandError(f"--trials must be >= 1, got {trials}")
    return int(trials)


def make_problem(args: argparse.Namespace, trial: int) -> tuple[SyntheticProblem, TrialSeeds]:
    """The trial's seeds and synthetic problem from the command-line settings."""
    seeds = trial_seeds(args.seed, trial)
    problem = synthetic_problem(
        seeds,
        n_samples=args.n_samples,
        prior_precision=args.prior_precision,
        noise_precision=args.noise_precision,
    )
    return problem, seeds


def plot_over_posterior(
    ax: Axes,
    exact: linreg.LinearRegressionPosterior,
    *,
    points: FloatArray | None = None,
    pretrained: FloatArray | None = None,
    approximation: tuple[FloatArray, FloatArray] | None = None,
    title: str = "",
) -> None:
    """Draw the posterior pdf's contours with optional samples, pre-trained point and a second Gaussian.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    exact : LinearRegressionPosterior
        Two-dimensional posterior whose pdf is drawn as filled contours.
    points : ndarray of shape (n, 2), optional
        Red dots (iterates or window means); their mean is drawn as a black star.
    pretrained : ndarray of shape (2,), optional
        White dot.
    approximation : (mean, covariance), optional
        An approximate Gaussian drawn as black contour lines.
    title : str
    """
    from scipy.stats import multivariate_normal

    spread = np.sqrt(np.diag(exact.covariance))
    corners = [exact.mean - 3.5 * spread, exact.mean + 3.5 * spread]
    if points is not None:
        corners.extend([points.min(axis=0), points.max(axis=0)])
    if pretrained is not None:
        corners.append(pretrained)
    low, high = np.min(corners, axis=0), np.max(corners, axis=0)
    pad = 0.05 * (high - low)
    grid_x, grid_y = np.meshgrid(
        np.linspace(low[0] - pad[0], high[0] + pad[0], 200), np.linspace(low[1] - pad[1], high[1] + pad[1], 200)
    )
    grid = np.dstack([grid_x, grid_y])
    ax.contourf(grid_x, grid_y, multivariate_normal(exact.mean, exact.covariance).pdf(grid), levels=12, cmap="Blues")
    if approximation is not None:
        density = multivariate_normal(approximation[0], approximation[1]).pdf(grid)
        ax.contour(grid_x, grid_y, density, levels=6, colors="black", linewidths=0.8)
    if points is not None:
        ax.scatter(points[:, 0], points[:, 1], s=4, c="red", alpha=0.5, label="samples")
        centre = points.mean(axis=0)
        ax.scatter([centre[0]], [centre[1]], marker="*", s=150, c="black", label="sample mean")
    if pretrained is not None:
        ax.scatter([pretrained[0]], [pretrained[1]], s=60, c="white", edgecolors="black", label="pre-trained")
    ax.set_xlabel(r"$\theta_1$")
    ax.set_ylabel(r"$\theta_2$")
    ax.set_title(title, fontsize=9)


# ---------------------------------------------------------------------------------------------------
# This experiment
# ---------------------------------------------------------------------------------------------------

_KEY_FIELDS = ["lr", "weight_decay", "batch_size", "epochs", *SYNTHETIC_KEY_FIELDS]
_FIELDS = [*_KEY_FIELDS, "trial", "n_iterates", *DISTANCE_FIELDS]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    add_synthetic_arguments(parser, name=NAME)
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.1, 0.01], help="collection learning rates")
    parser.add_argument("--weight-decays", type=float, nargs="+", default=[0.1, 0.001], help="lambda values")
    parser.add_argument("--epochs", type=int, default=100, help="collection epochs")
    parser.add_argument("--batch-size", type=int, default=100, help="collection batch size")


def collect_iterates(
    problem: SyntheticProblem, start: FloatArray, phase: linreg.SGDPhase, seed: np.random.Generator
) -> list[FloatArray]:
    """Run the collection phase and return every iterate.

    Parameters
    ----------
    problem : SyntheticProblem
    start : ndarray of shape (D,)
        The pre-trained parameters.
    phase : SGDPhase
    seed : numpy.random.Generator

    Returns
    -------
    list of ndarray of shape (D,)
    """
    iterates: list[FloatArray] = []
    linreg.run_sgd(problem.X, problem.y, start, phase, seed=seed, consumers=[iterates.append])
    return iterates


def _cell_key(args: argparse.Namespace, lr: float, weight_decay: float) -> dict[str, Any]:
    """CSV key columns of one (lr, lambda) cell."""
    return {"lr": lr, "weight_decay": weight_decay, "batch_size": args.batch_size, "epochs": args.epochs,
            **synthetic_key(args)}


def _run_trial(args: argparse.Namespace, lr: float, weight_decay: float, trial: int) -> dict[str, Any]:
    """One trial of one cell: distances of the iterates' Gaussian from the posterior."""
    problem, seeds = make_problem(args, trial)
    start = pretrain(problem, seeds, args)
    phase = linreg.SGDPhase(lr=lr, weight_decay=weight_decay, batch_size=args.batch_size, n_epochs=args.epochs)
    iterates = collect_iterates(problem, start, phase, seeds.method)
    mean, covariance = empirical_gaussian(iterates)
    return {**_cell_key(args, lr, weight_decay), "trial": trial, "n_iterates": len(iterates),
            **gaussian_distances(mean, covariance, problem.posterior)}


def _summary_markdown(args: argparse.Namespace, rows: list[dict[str, str]], n_trials: int) -> str:
    """Markdown table of ours (mean ± s.e.) beside the thesis's Table 6.1."""
    body = []
    for lr in args.lrs:
        for weight_decay in args.weight_decays:
            cell = rows_matching(rows, _cell_key(args, lr, weight_decay))
            cell = [row for row in cell if int(row["trial"]) < n_trials]
            ours = {name: mean_and_standard_error(float(row[name]) for row in cell) for name in DISTANCE_FIELDS}
            thesis = THESIS_TABLE_6_1.get((lr, weight_decay))
            body.append([
                f"{lr:g}", f"{weight_decay:g}", str(len(cell)),
                format_mean_se(*ours["rel_mean"]), format_mean_se(*thesis[0]) if thesis else "–",
                format_mean_se(*ours["rel_cov"]), format_mean_se(*thesis[1]) if thesis else "–",
                format_mean_se(*ours["w2"]), format_mean_se(*ours["w2_squared"]),
                format_mean_se(*thesis[2]) if thesis else "–",
            ])
    header = ["lr", "λ", "trials", "rel. mean (ours)", "rel. mean (thesis)", "rel. cov (ours)",
              "rel. cov (thesis)", "W2 (ours)", "W2² (ours)", "thesis \"Wasserstein\" (≈ W2²)"]
    intro = (
        f"# linreg-iterates: thesis Table 6.1\n\n"
        f"{n_trials} trials (seed {args.seed}); pre-training {args.pretrain_epochs} epochs, lr {args.pretrain_lr:g}, "
        f"weight decay {args.pretrain_weight_decay:g}, batch {args.pretrain_batch_size}; collection {args.epochs} "
        f"epochs, batch {args.batch_size}. Mean ± standard error over trials.\n\n"
    )
    return intro + markdown_table(header, body)


def _plot_figure(args: argparse.Namespace, path: Path) -> None:
    """Figure 6.1: the iterates of trial 0 for every (lr, lambda) over the posterior's contours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [(lr, wd) for lr in args.lrs for wd in args.weight_decays]
    n_cols = min(2, len(cells))
    n_rows = math.ceil(len(cells) / n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(5 * n_cols, 4.2 * n_rows), squeeze=False)
    for ax, (lr, weight_decay) in zip(axes.flat, cells):
        problem, seeds = make_problem(args, 0)
        start = pretrain(problem, seeds, args)
        phase = linreg.SGDPhase(lr=lr, weight_decay=weight_decay, batch_size=args.batch_size, n_epochs=args.epochs)
        iterates = np.asarray(collect_iterates(problem, start, phase, seeds.method))
        plot_over_posterior(ax, problem.posterior, points=iterates, pretrained=start,
                            title=f"lr = {lr:g}, λ = {weight_decay:g}")
    for ax in list(axes.flat)[len(cells):]:
        ax.set_visible(False)
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
    out = output_dir(args.out)
    csv_path = out / "linreg_iterates.csv"
    done = read_rows(csv_path)
    todo = [
        (lr, wd, trial)
        for lr in args.lrs
        for wd in args.weight_decays
        for trial in range(n_trials)
        if not rows_matching(done, {**_cell_key(args, lr, wd), "trial": trial})
    ]
    for lr, weight_decay, trial in progress(todo, total=len(todo), desc=NAME):
        append_rows(csv_path, [_run_trial(args, lr, weight_decay, trial)], _FIELDS)
    summary = _summary_markdown(args, read_rows(csv_path), n_trials)
    (out / "table_6_1.md").write_text(summary)
    _plot_figure(args, out / "figure_6_1.png")
    print(summary)
    return 0
