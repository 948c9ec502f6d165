"""``calibration``: onlinefa's single-network posterior against the peers people pick instead.

Per task and seed, every method gets the same MLP, the same training rows, the same mini-batch order and
the same number of epochs. A tenth of the training rows (per seed) is held out as validation rows, used
only to choose (onlinefa's covariance scale and temperature), never to fit weights. Methods: ``map``, ``swa``,
``swa_temp`` (classification: SWA with temperature scaling), ``swag_fa``, ``onlinefa`` (the recommended
recipe), ``multiswag_fa`` and ``deep_ensemble`` (``--members`` runs), and, where their libraries are
installed, ``laplace``, ``laplace_all``, ``ivon``, ``swag_peer``. Metrics:
accuracy, NLL, ECE (15 bins), Brier on the clean and shifted test sets, and the AUROC of telling OOD
inputs from clean test inputs by predictive entropy. Outputs in ``--out``: ``calibration.csv`` (one row per
dataset, seed, method and evaluation), ``costs.csv`` (seconds as ratios to plain training of the same
network), ``calibration.md`` and ``calibration.png``. Resumable: seeds already in the CSV are skipped.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from onlinefa.errors import CommandError
from ._common import append_rows, output_dir, progress, read_rows

NAME = "calibration"
HELP = "single-network posteriors against laplace-torch, IVON, a third-party SWAG and deep ensembles"

#: Output columns of calibration.csv and costs.csv.
FIELDS = ["dataset", "seed", "method", "evaluation", "accuracy", "nll", "ece", "brier", "auroc", "rmse"]
COST_FIELDS = ["dataset", "seed", "method", "train", "posthoc", "predict"]
#: Every method, in the order of the tables.
METHODS = ["map", "swa", "swa_temp", "swag_fa", "onlinefa", "multiswag_fa", "deep_ensemble", "laplace", "laplace_all",
           "ivon", "swag_peer"]
#: Built-in tasks of ``--datasets``: classification, then the packaged UCI regression sets.
CLASSIFICATION_TASKS = ("digits", "breast_cancer")
BUILT_IN = (*CLASSIFICATION_TASKS, "energy", "boston", "concrete", "yacht")
#: Fraction of the training rows held out for validation.
VALIDATION_FRACTION = 0.1
#: Defaults of the options that ``--quick`` changes, and its settings (an option given explicitly wins).
FULL: dict[str, Any] = {"seeds": 3, "hidden": "200,200", "epochs": 150, "collect_epochs": 50, "n_draws": 30,
                        "members": 5, "rank": 20}
QUICK: dict[str, Any] = {"seeds": 2, "hidden": "32,32", "epochs": 6, "collect_epochs": 3, "n_draws": 4,
                         "members": 2, "rank": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    parser.add_argument("--data", type=Path, default=None,
                        help="a classification .npz (x_train, y_train, x_test, y_test, x_shift_*, y_shift_*, "
                             "x_ood_*) instead of the built-in digits tasks")
    parser.add_argument("--datasets", nargs="+", choices=BUILT_IN, default=["digits"],
                        help="built-in tasks (digits: 10 classes with shifts and noise OOD, plus digits04: "
                             "digits 0-4 with 5-9 as OOD)")
    parser.add_argument("--out", type=Path, default=Path("results") / NAME, help="output folder")
    parser.add_argument("--seeds", type=int, default=None, help="training seeds (>= 1; default 3)")
    parser.add_argument("--hidden", default=None, help="MLP hidden widths, comma-separated (default 200,200)")
    parser.add_argument("--epochs", type=int, default=None, help="SGD epochs of every network (default 150)")
    parser.add_argument("--collect-epochs", type=int, default=None,
                        help="last epochs whose iterates are collected (default 50)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--snapshots-per-epoch", type=int, default=5)
    parser.add_argument("--rank", type=int, default=None, help="K of OnlineEM (default 20)")
    parser.add_argument("--n-draws", type=int, default=None, help="posterior draws per prediction (default 30)")
    parser.add_argument("--members", type=int, default=None,
                        help="runs of multiswag_fa and deep_ensemble (default 5)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS)
    parser.add_argument("--quick", action="store_true",
                        help="tiny run: 2 seeds, 6 epochs, small MLP (options given explicitly still apply)")


def _hidden(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(part) for part in str(text).split(","))
    except ValueError as err:
        raise CommandError(f"--hidden must be comma-separated integers, got {text!r}") from err
    if not widths or min(widths) < 1:
        raise CommandError(f"--hidden widths must be >= 1, got {text!r}")
    return widths


def _budget(args: argparse.Namespace) -> Any:
    """The training budget every method of a run shares."""
    from ._calibration_runs import Budget

    return Budget(_hidden(args.hidden), args.epochs, args.collect_epochs, args.lr, args.batch_size,
                  args.snapshots_per_epoch, args.rank, args.n_draws)


def _check(args: argparse.Namespace) -> None:
    if args.seeds < 1 or args.members < 2 or args.n_draws < 1 or args.rank < 1:
        raise CommandError("need --seeds >= 1, --members >= 2, --n-draws >= 1 and --rank >= 1")
    if not 1 <= args.collect_epochs <= args.epochs:
        raise CommandError("need 1 <= --collect-epochs <= --epochs")
    if args.lr <= 0 or args.batch_size < 1 or args.snapshots_per_epoch < 1:
        raise CommandError("need --lr > 0, --batch-size >= 1 and --snapshots-per-epoch >= 1")


def _tasks(args: argparse.Namespace) -> list[Any]:
    from ._calibration_data import DataFileError, breast_cancer_set, digits_sets, load_npz

    from ._calibration_regression import uci_set

    if args.data is None:
        built: dict[str, Callable[[], list[Any]]] = {"digits": digits_sets, "breast_cancer": lambda: [breast_cancer_set()]}
        return [task for name in args.datasets for task in (built[name]() if name in built else [uci_set(name)])]
    try:
        return [load_npz(args.data)]
    except DataFileError as err:
        raise CommandError(f"--data {args.data}: {err}") from err


def _metrics(probabilities: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from ._calibration import accuracy, brier_score, classification_nll, expected_calibration_error

    return {"accuracy": accuracy(probabilities, labels), "nll": classification_nll(probabilities, labels),
            "ece": expected_calibration_error(probabilities, labels, 15), "brier": brier_score(probabilities, labels)}


def evaluate(predict: Callable[[Any], np.ndarray], task: Any) -> tuple[list[dict[str, Any]], float, np.ndarray]:
    """Rows of every evaluation of one predictor, the seconds it took, and its clean test probabilities."""
    import torch

    from ._calibration import auroc, predictive_entropy

    def run(x: np.ndarray) -> np.ndarray:
        return predict(torch.as_tensor(x, dtype=torch.float32))

    start = time.perf_counter()
    clean = run(task.x_test)
    rows = [{"evaluation": "clean", **_metrics(clean, task.y_test), "auroc": "", "rmse": ""}]
    for name, (x, y) in task.shifts.items():
        rows.append({"evaluation": f"shift:{name}", **_metrics(run(x), y), "auroc": "", "rmse": ""})
    clean_entropy = predictive_entropy(clean)
    for name, x in task.ood.items():
        rows.append({"evaluation": f"ood:{name}", "accuracy": "", "nll": "", "ece": "", "brier": "",
                     "auroc": auroc(clean_entropy, predictive_entropy(run(x))), "rmse": ""})
    return rows, time.perf_counter() - start, clean


def _split(task: Any, seed: int) -> Any:
    import torch

    from ._calibration_runs import Split

    order = np.random.default_rng([seed, 7]).permutation(task.x_train.shape[0])
    n_val = max(1, int(round(VALIDATION_FRACTION * order.size)))
    val, train = order[:n_val], order[n_val:]
    x = torch.as_tensor(task.x_train, dtype=torch.float32)
    y = torch.as_tensor(task.y_train, dtype=torch.int64)
    return Split(x[train], y[train], x[val], y[val])


class _SeedRun:
    """Everything of one (task, seed): trains, times and evaluates each requested method."""

    def __init__(self, args: argparse.Namespace, task: Any, seed: int, methods: list[str]) -> None:
        from ._calibration_runs import batch_orders

        self.args, self.task, self.seed, self.methods = args, task, seed, methods
        self.budget = _budget(args)
        self.split = _split(task, seed)
        self.orders = batch_orders(self.split.x_train.shape[0], self.budget, seed)
        self.rows: list[dict[str, Any]] = []
        self.costs: list[dict[str, Any]] = []
        self.clean: dict[str, np.ndarray] = {}

    def _record(self, method: str, predict: Any, train: float, posthoc: float) -> None:
        rows, seconds, clean = evaluate(predict, self.task)
        base = {"dataset": self.task.name, "seed": self.seed, "method": method}
        self.rows += [{**base, **row} for row in rows]
        unit = self.plain_seconds
        self.costs.append({**base, "train": train / unit, "posthoc": posthoc / unit, "predict": seconds / unit})
        self.clean[method] = clean

    def run(self) -> None:
        from . import _calibration_runs as ours

        n_classes, draws = self.task.n_classes, self.budget.n_draws
        want = set(self.methods)
        members = self.args.members if want & {"multiswag_fa", "deep_ensemble"} else 1
        runs = [ours.train_sgd(self.split, n_classes, self.budget, self.orders, init_seed=1000 * self.seed + m)
                for m in range(members)]
        first = runs[0]
        plain = ours.train_sgd(self.split, n_classes, self.budget, self.orders, 1000 * self.seed, collect=False)
        self.plain_seconds = plain.seconds  # the unit of every cost: the same network trained without collection
        collected = first.seconds
        seed = 1000 * self.seed + 17
        if "map" in want:
            self._record("map", ours.map_predictor(plain), plain.seconds, 0.0)
        if "swa" in want:
            self._record("swa", ours.swa_predictor(first), collected, 0.0)
        if "swa_temp" in want:
            start = time.perf_counter()
            predict = ours.tempered_swa_predictor(first, self.split)
            self._record("swa_temp", predict, collected, time.perf_counter() - start)
        if "swag_fa" in want:
            self._record("swag_fa", ours.bma_predictor(first.module, first.posterior, draws, seed), collected, 0.0)
        if "onlinefa" in want:
            start = time.perf_counter()
            chosen = ours.recipe_scale(first.module, first.posterior, self.split, draws, seed + 1)
            self._record("onlinefa", ours.linearized_predictor(first.module, first.posterior, chosen, draws, seed),
                         collected, time.perf_counter() - start)
        if "multiswag_fa" in want:
            from onlinefa.torch import MultiSWAG

            mixture = MultiSWAG([run.posterior for run in runs])
            start = time.perf_counter()
            chosen = ours.recipe_scale(first.module, mixture, self.split, draws, seed + 1)
            self._record("multiswag_fa", ours.linearized_predictor(first.module, mixture, chosen, draws, seed),
                         sum(r.seconds for r in runs), time.perf_counter() - start)
        if "deep_ensemble" in want:
            self._record("deep_ensemble", ours.ensemble_predictor(runs), sum(r.seconds for r in runs), 0.0)
        self._peers(plain)

    def _peers(self, plain: Any) -> None:
        from . import _calibration_peers as peers

        n_classes, seed = self.task.n_classes, 1000 * self.seed
        for method in ("laplace", "laplace_all"):
            if method in self.methods:
                predict, seconds = peers.laplace_predictor(plain.module, self.split, self.budget,
                                                           all_weights=method == "laplace_all")
                self._record(method, predict, plain.seconds, seconds)
        if "ivon" in self.methods:
            outputs, seconds = peers.ivon_outputs(self.split, n_classes, self.budget, self.orders, seed)
            self._record("ivon", peers.mean_softmax(outputs), seconds, 0.0)
        if "swag_peer" in self.methods:
            outputs, seconds = peers.swag_peer_outputs(self.split, n_classes, self.budget, self.orders, seed)
            self._record("swag_peer", peers.mean_softmax(outputs), seconds, 0.0)


def _job(args: argparse.Namespace, task: Any, seed: int, methods: list[str]) -> Any:
    """The runner of one (task, seed): classification or, for a UCI set, regression."""
    from ._calibration_regression import RegressionSeed, RegressionSet

    if isinstance(task, RegressionSet):
        return RegressionSeed(task, seed, _budget(args), [m for m in methods if m not in ("laplace_all", "swa_temp")], args.members,
                              VALIDATION_FRACTION)
    return _SeedRun(args, task, seed, methods)


def _done(path: Path) -> set[tuple[str, str]]:
    return {(row["dataset"], row["seed"]) for row in read_rows(path)}


def _methods(args: argparse.Namespace) -> list[str]:
    from ._calibration_peers import missing_peers

    missing = missing_peers(list(args.methods))
    for method, package in missing.items():
        print(f"calibration: skipping {method}: its library is not installed (pip install {package})")
    return [m for m in args.methods if m not in missing]


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and write its CSVs, table and plot to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options (see :func:`add_arguments`).

    Returns
    -------
    int
        0 on success.
    """
    for key in FULL:
        if getattr(args, key) is None:
            setattr(args, key, (QUICK if args.quick else FULL)[key])
    _check(args)
    _hidden(args.hidden)
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as err:
        raise CommandError("the calibration experiment needs PyTorch (pip install \".[torch]\")") from err
    tasks = _tasks(args)
    methods = _methods(args)
    out = output_dir(args.out)
    csv_path, cost_path = out / "calibration.csv", out / "costs.csv"
    done = _done(csv_path)
    jobs = [(task, seed) for task in tasks for seed in range(args.seeds) if (task.name, str(seed)) not in done]
    for task, seed in progress(jobs, total=len(jobs), desc=NAME):
        job = _job(args, task, seed, methods)
        job.run()
        if isinstance(job, _SeedRun):
            np.savez(out / f"clean_{task.name}_seed{seed}.npz", **{"labels": task.y_test, **job.clean})
        append_rows(cost_path, job.costs, COST_FIELDS)
        append_rows(csv_path, job.rows, FIELDS)  # last: a seed counts as done once its metrics are on disk
    from ._calibration_report import plot, summary_markdown

    rows = read_rows(csv_path)
    summary = summary_markdown(rows, read_rows(cost_path), methods, args)
    (out / "calibration.md").write_text(summary)
    plot(rows, out, out / "calibration.png")
    print(summary)
    return 0
