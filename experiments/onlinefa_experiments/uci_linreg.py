"""``uci-linreg``: linear-regression predictions on four UCI datasets (thesis Figure 6.4 / Table A.1).

For each dataset and each fold of a shuffled 10-fold cross-validation: inputs standardised with the
training part's mean and standard deviation, a constant-1 input as the bias; SGD on the mean-squared
error with weight decay 0.001 and batches of ``floor(N_train / 10)`` rows (the last, smaller batch of an
epoch dropped, so an epoch is exactly 10 updates); 500 pre-training epochs at lr 0.001, then 100 epochs at
lr 0.1 whose 1000 iterates stream into online SGA (lr 0.001) and online EM, both K = 3 with warm-up 100,
and into a running mean (theta_SWA). Test MSE of the pre-trained vector, theta_SWA, and the two ensembles
that average the predictions of 30 parameter vectors drawn from each FA model.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from onlinefa import linreg
from onlinefa._uci import UCI_DATASETS, load_uci
from onlinefa.errors import CommandError
from ._common import append_rows, output_dir, progress, read_rows
from .linreg_iterates import format_mean_se, markdown_table, mean_and_standard_error, rows_matching

NAME = "uci-linreg"
HELP = "Table A.1 / Figure 6.4: linear-regression test MSE on UCI data (pre-trained, SWA, SGA-FA, EM-FA)"

FloatArray = NDArray[np.float64]

#: Prediction methods, in the thesis's column order, with their labels.
METHODS: dict[str, str] = {
    "mse_pretrained": "Pre-trained",
    "mse_swa": "SWA",
    "mse_sga_fa": "SGA-FA",
    "mse_em_fa": "EM-FA",
}

#: Thesis Table A.1 (mean ± s.e. over 10 folds), in the order of :data:`METHODS`.
THESIS_TABLE_A_1: dict[str, tuple[tuple[float, float], ...]] = {
    "energy": ((10.13, 0.55), (8.74, 0.54), (8.93, 0.53), (8.73, 0.54)),
    "boston": ((23.69, 2.25), (23.27, 2.07), (23.69, 2.06), (23.46, 2.06)),
    "concrete": ((112.44, 6.93), (109.83, 6.44), (109.84, 6.30), (109.79, 6.41)),
    "yacht": ((82.43, 7.28), (82.54, 7.27), (83.35, 7.78), (82.83, 7.42)),
}

_LABELS = {"energy": "Energy Efficiency", "boston": "Boston Housing", "concrete": "Concrete Strength",
           "yacht": "Yacht Hydro."}
_SETTING_FIELDS = ["seed", "folds", "batches_per_epoch", "pretrain_epochs", "pretrain_lr", "epochs", "lr",
                   "weight_decay", "n_components", "n_warmup", "sga_lr", "n_ensemble"]
_FIELDS = ["dataset", "repeat", "fold", *_SETTING_FIELDS, "n_train", "n_test", "batch_size", "n_iterates",
           *METHODS]


class RunningMean:
    """Running mean of a stream of vectors (the SWA solution), fed through :meth:`update`.

    Parameters
    ----------
    n_features : int
        Length of the vectors.
    """

    def __init__(self, n_features: int) -> None:
        self._total = np.zeros(int(n_features))
        self._count = 0

    def update(self, vector: FloatArray) -> None:
        """Add one vector.

        Parameters
        ----------
        vector : ndarray of shape (n_features,)
        """
        self._total += vector
        self._count += 1

    @property
    def mean(self) -> FloatArray:
        """The mean of the vectors seen so far (raises if none)."""
        if self._count == 0:
            raise ValueError("no vectors seen yet")
        return self._total / self._count


def standardise(X_train: FloatArray, X_test: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Standardise both parts with the training part's mean and (population) s.d.; add a bias column.

    Parameters
    ----------
    X_train : ndarray of shape (n_train, D)
    X_test : ndarray of shape (n_test, D)

    Returns
    -------
    (ndarray of shape (n_train, D + 1), ndarray of shape (n_test, D + 1))
        Constant columns are only centred (their s.d. is taken as 1).
    """
    centre = X_train.mean(axis=0)
    scale = X_train.std(axis=0)
    scale[scale == 0.0] = 1.0
    return linreg.add_bias_column((X_train - centre) / scale), linreg.add_bias_column((X_test - centre) / scale)


def ensemble_mse(model: Any, X_test: FloatArray, y_test: FloatArray, n_members: int, seed: int) -> float:
    """Test MSE of the mean prediction of ``n_members`` parameter vectors drawn from an FA model.

    Parameters
    ----------
    model : OnlineEM or OnlineSGA
        Anything with ``sample(n, seed=...)`` returning (n, D) parameter vectors.
    X_test : ndarray of shape (n_test, D)
    y_test : ndarray of shape (n_test,)
    n_members : int
    seed : int

    Returns
    -------
    float
    """
    members = np.asarray(model.sample(n_members, seed=seed), dtype=np.float64)
    prediction = (X_test @ members.T).mean(axis=1)
    return float(np.mean((prediction - y_test) ** 2))


def _mse(theta: FloatArray, X_test: FloatArray, y_test: FloatArray) -> float:
    """Test MSE of one parameter vector."""
    return float(np.mean((X_test @ theta - y_test) ** 2))


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that determine a fold's result (CSV key columns)."""
    return {name: getattr(args, name) for name in _SETTING_FIELDS}


def run_fold(
    args: argparse.Namespace,
    data: tuple[FloatArray, FloatArray],
    split: tuple[NDArray[np.intp], NDArray[np.intp]],
    seed: np.random.SeedSequence,
) -> dict[str, Any]:
    """Train, collect iterates into the FA models and evaluate on one cross-validation fold.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options.
    data : (X, y)
        The whole dataset.
    split : (train_index, test_index)
    seed : numpy.random.SeedSequence
        The fold's seed.

    Returns
    -------
    dict
        ``n_train``, ``n_test``, ``batch_size``, ``n_iterates`` and the four test MSEs.
    """
    import onlinefa

    X, y = data
    train, test = split
    X_train, X_test = standardise(X[train], X[test])
    y_train, y_test = y[train], y[test]
    init_seed, pretrain_seed, collect_seed, model_seed = seed.spawn(4)
    model_seeds = model_seed.generate_state(4)
    n_params = X_train.shape[1]
    batch_size = max(1, X_train.shape[0] // args.batches_per_epoch)

    start = linreg.init_parameters(n_params, np.random.default_rng(init_seed))
    pretrain = linreg.SGDPhase(args.pretrain_lr, args.weight_decay, batch_size, args.pretrain_epochs, drop_last=True)
    pretrained = linreg.run_sgd(X_train, y_train, start, pretrain, seed=np.random.default_rng(pretrain_seed)).theta

    # The thesis's algorithms (this experiment reproduces its chapter 6).
    em = onlinefa.OnlineEM.algorithm2(n_params, args.n_components, n_warmup=args.n_warmup, seed=int(model_seeds[0]))
    sga = onlinefa.OnlineSGA.algorithm1(n_params, args.n_components, lr=args.sga_lr, n_warmup=args.n_warmup,
                                        seed=int(model_seeds[1]))
    swa = RunningMean(n_params)
    collect = linreg.SGDPhase(args.lr, args.weight_decay, batch_size, args.epochs, drop_last=True)
    result = linreg.run_sgd(X_train, y_train, pretrained, collect, seed=np.random.default_rng(collect_seed),
                            consumers=[em.update, sga.update, swa.update])
    return {
        "n_train": X_train.shape[0],
        "n_test": X_test.shape[0],
        "batch_size": batch_size,
        "n_iterates": result.n_delivered,
        "mse_pretrained": _mse(pretrained, X_test, y_test),
        "mse_swa": _mse(swa.mean, X_test, y_test),
        "mse_sga_fa": ensemble_mse(sga, X_test, y_test, args.n_ensemble, int(model_seeds[2])),
        "mse_em_fa": ensemble_mse(em, X_test, y_test, args.n_ensemble, int(model_seeds[3])),
    }


def _dataset_name(text: str) -> str:
    """Canonical dataset name (accepts ``bostonHousing``)."""
    key = {"bostonhousing": "boston"}.get(text.lower(), text.lower())
    if key not in UCI_DATASETS:
        raise argparse.ArgumentTypeError(f"unknown dataset {text!r}; choose from {', '.join(UCI_DATASETS)}")
    return key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    parser.add_argument("--out", type=Path, default=Path("results") / NAME, help="output folder")
    parser.add_argument("--datasets", type=_dataset_name, nargs="+", default=list(UCI_DATASETS),
                        help="datasets (default: energy boston concrete yacht)")
    parser.add_argument("--trials", type=int, default=1,
                        help="repetitions of the k-fold cross-validation with different shuffles (default 1)")
    parser.add_argument("--quick", action="store_true", help="run only the first 3 folds of each split")
    parser.add_argument("--seed", type=int, default=0, help="base seed (fold shuffles, initialisation, models)")
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--batches-per-epoch", type=int, default=10, help="batch size = floor(N_train / this)")
    parser.add_argument("--pretrain-epochs", type=int, default=500)
    parser.add_argument("--pretrain-lr", type=float, default=0.001)
    parser.add_argument("--epochs", type=int, default=100, help="collection epochs")
    parser.add_argument("--lr", type=float, default=0.1, help="collection learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.001, help="weight decay in both phases")
    parser.add_argument("--n-components", type=int, default=3, help="latent dimension K of both FA models")
    parser.add_argument("--n-warmup", type=int, default=100)
    parser.add_argument("--sga-lr", type=float, default=0.001)
    parser.add_argument("--n-ensemble", type=int, default=30, help="parameter vectors per FA ensemble")


def _fold_cells(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """All (dataset, repeat, fold) cells this run covers."""
    n_folds = min(3, args.folds) if args.quick else args.folds
    return [(name, repeat, fold) for name in args.datasets for repeat in range(args.trials)
            for fold in range(n_folds)]


def _fold_splits(
    n_samples: int, args: argparse.Namespace, dataset_index: int, repeat: int
) -> list[tuple[NDArray[np.intp], NDArray[np.intp]]]:
    """The shuffled k-fold splits of one repetition."""
    from sklearn.model_selection import KFold

    state = np.random.SeedSequence([args.seed, dataset_index, repeat]).generate_state(1)[0]
    splitter = KFold(n_splits=args.folds, shuffle=True, random_state=int(state))
    return list(splitter.split(np.zeros((n_samples, 1))))


def _summary_markdown(args: argparse.Namespace, rows: list[dict[str, str]]) -> str:
    """Ours beside the thesis's Table A.1, mean ± s.e. over folds."""
    body = []
    for name in args.datasets:
        cell = rows_matching(rows, {"dataset": name, **_settings(args)})
        cell = [row for row in cell if int(row["repeat"]) < args.trials]
        ours = [mean_and_standard_error(float(row[column]) for row in cell) for column in METHODS]
        body.append([_LABELS[name], f"ours ({len(cell)} folds)", *(format_mean_se(*v, digits=2) for v in ours)])
        body.append(["", "thesis (10 folds)", *(format_mean_se(*v, digits=2) for v in THESIS_TABLE_A_1[name])])
    intro = (
        "# uci-linreg: thesis Table A.1 (test MSE, mean ± standard error over folds)\n\n"
        f"{args.folds}-fold CV × {args.trials} repetition(s), seed {args.seed}; batch = floor(N_train / "
        f"{args.batches_per_epoch}) with the last partial batch dropped; pre-training {args.pretrain_epochs} "
        f"epochs at lr {args.pretrain_lr:g}, then {args.epochs} epochs at lr {args.lr:g}; weight decay "
        f"{args.weight_decay:g}; online EM / SGA (lr {args.sga_lr:g}) with K = {args.n_components}, warm-up "
        f"{args.n_warmup}; ensembles of {args.n_ensemble} draws.\n\n"
    )
    return intro + markdown_table(["Dataset", "source", *METHODS.values()], body)


def _plot_figure(args: argparse.Namespace, rows: list[dict[str, str]], path: Path) -> None:
    """Figure 6.4: mean test MSE ± s.e. per method, ours (filled) beside the thesis's (open)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.datasets), figsize=(3.6 * len(args.datasets), 3.4), squeeze=False)
    positions = np.arange(len(METHODS))
    for ax, name in zip(axes.flat, args.datasets):
        cell = [row for row in rows_matching(rows, {"dataset": name, **_settings(args)})
                if int(row["repeat"]) < args.trials]
        ours = np.array([mean_and_standard_error(float(row[c]) for row in cell) for c in METHODS])
        thesis = np.array(THESIS_TABLE_A_1[name])
        ax.errorbar(positions - 0.1, ours[:, 0], yerr=ours[:, 1], fmt="o", capsize=3, label="ours")
        ax.errorbar(positions + 0.1, thesis[:, 0], yerr=thesis[:, 1], fmt="o", mfc="none", capsize=3,
                    label="thesis")
        ax.set_xticks(positions, list(METHODS.values()), rotation=30, fontsize=8)
        ax.set_title(_LABELS[name], fontsize=9)
        ax.set_ylabel("test MSE")
    axes.flat[0].legend(fontsize=7)
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
    if args.trials < 1 or args.folds < 2 or args.batches_per_epoch < 1:
        raise CommandError("need --trials >= 1, --folds >= 2 and --batches-per-epoch >= 1")
    out = output_dir(args.out)
    csv_path = out / "uci_linreg.csv"
    done = read_rows(csv_path)
    todo = [cell for cell in _fold_cells(args)
            if not rows_matching(done, {"dataset": cell[0], "repeat": cell[1], "fold": cell[2], **_settings(args)})]
    datasets: dict[str, tuple[FloatArray, FloatArray]] = {}
    for name, repeat, fold in progress(todo, total=len(todo), desc=NAME):
        data = datasets.setdefault(name, load_uci(name))
        dataset_index = list(UCI_DATASETS).index(name)
        split = _fold_splits(data[0].shape[0], args, dataset_index, repeat)[fold]
        seed = np.random.SeedSequence([args.seed, dataset_index, repeat, fold, 1])
        row = {"dataset": name, "repeat": repeat, "fold": fold, **_settings(args), **run_fold(args, data, split, seed)}
        append_rows(csv_path, [row], _FIELDS)
    rows = read_rows(csv_path)
    summary = _summary_markdown(args, rows)
    (out / "table_a_1.md").write_text(summary)
    _plot_figure(args, rows, out / "figure_6_4.png")
    print(summary)
    return 0
