"""``uci-bnn``: the standard UCI regression benchmark for Bayesian neural networks, with its published splits.

The protocol of Hernández-Lobato and Adams (ICML 2015) as cleaned by Gal and Ghahramani (ICML 2016):
the published 20 train/test splits (5 for protein) regenerated exactly (:mod:`._splits`), one hidden
layer of 50 ReLU units (100 for protein), inputs and target standardised with the training rows,
hyper-parameters chosen per split on an 80/20 split of the training rows only with the same grid size for
every method (:mod:`._tuning`), a refit on all training rows, then the test log-likelihood per point in
the target's original units (the Gaussian mixture over draws) and the RMSE of the predictive mean.

Methods (:mod:`._methods`): MAP, SWA, SWAG-diagonal, SWAG, SWAG-FA (``OnlineEM``), ``OnlineSGA``, VIFA,
MultiSWAG-FA, deep ensembles, MC dropout and SLANG (when its module is present). Results go to
``uci_bnn.csv`` (one row per data set, split and method; rows already present are skipped, so an
interrupted run resumes), ``uci_bnn_choices.csv`` (the chosen grid point and σ² per row) and
``uci_bnn.md`` (tables beside the published numbers). Needs the ``experiments`` and ``torch`` extras.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from onlinefa.errors import CommandError
from .._common import append_rows, output_dir, progress, read_rows, write_rows

NAME = "uci-bnn"
HELP = "the 20-split UCI regression benchmark (MAP, SWAG family, SWAG-FA, VIFA, ensembles, MC dropout, SLANG)"

#: Data sets run when ``--datasets`` is not given (the packaged ones; the others need ``--data-dir``).
DEFAULT_DATASETS = ("boston", "yacht", "energy", "concrete")

#: ``--quick``: a tiny budget for the test suite (two splits, a 1 × 2 grid, a few epochs).
QUICK: dict[str, Any] = {"splits": 2, "epochs": 8, "collect_epochs": 3, "snapshots_per_epoch": 4, "rank": 3,
                         "n_draws": 5, "vifa_epochs": 1, "slang_epochs": 2, "weight_decays": [1e-3],
                         "epoch_fractions": [0.5, 1.0], "collect_lrs": [0.01, 0.03], "dropout_rates": [0.01, 0.05],
                         "slang_lrs": [0.01, 0.03]}


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    from ._names import METHODS

    parser.add_argument("--out", type=Path, default=Path("results") / "uci_bnn", help="output folder")
    parser.add_argument("--datasets", type=lambda s: [v for v in s.split(",") if v],
                        default=list(DEFAULT_DATASETS), help="comma-separated names (packaged, or in --data-dir)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder of data sets in the layout <DIR>/<name>/data/{data.txt,index_*.txt,n_*.txt}")
    parser.add_argument("--methods", type=lambda s: [v for v in s.split(",") if v], default=list(METHODS),
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--splits", type=int, default=None, help="first N published splits (default: all)")
    parser.add_argument("--first-split", type=int, default=0,
                        help="skip the splits before this one (to run disjoint parts in separate processes, "
                             "each with its own --out)")
    parser.add_argument("--batch-size", type=int, default=128, help="as MC dropout's benchmark code")
    parser.add_argument("--epochs", type=int, default=None,
                        help="Adam epochs E (default: 10 × the data set's n_epochs, as MC dropout's protocol)")
    parser.add_argument("--collect-epochs", type=int, default=50, help="constant-rate SGD epochs C (SWAG family)")
    parser.add_argument("--snapshots-per-epoch", type=int, default=4)
    parser.add_argument("--rank", type=int, default=10, help="K of SWAG, SWAG-FA, OnlineSGA and VIFA")
    parser.add_argument("--n-draws", type=int, default=30, help="predictive draws per posterior")
    parser.add_argument("--vifa-epochs", type=int, default=50)
    parser.add_argument("--slang-epochs", type=int, default=120)
    parser.add_argument("--adam-lr", type=float, default=1e-2,
                        help="Adam's rate (1e-3 under-fits Yacht in 400 epochs of batch 128)")
    parser.add_argument("--weight-decays", type=_floats, default=[1e-4, 1e-3, 1e-2], help="λ grid")
    parser.add_argument("--epoch-fractions", type=_floats, default=[0.5, 1.0], help="MAP/ensemble stopping grid")
    parser.add_argument("--collect-lrs", type=_floats, default=[0.005, 0.02], help="SWAG-family η grid")
    parser.add_argument("--dropout-rates", type=_floats, default=[0.01, 0.05], help="MC dropout p grid")
    parser.add_argument("--slang-lrs", type=_floats, default=[0.01, 0.03], help="SLANG learning-rate grid")
    parser.add_argument("--seed", type=int, default=0, help="base seed of initialisations and shuffles")
    parser.add_argument("--quick", action="store_true", help="tiny budget (2 splits, few epochs, 1 × 2 grid)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite uci_bnn.md from the rows already in --out (e.g. while a run goes on)")
    parser.add_argument("--select-from", type=lambda s: [Path(v) for v in s.split(",") if v], default=None,
                        help="comma-separated output folders of runs of the same splits under other budgets: write "
                             "to --out, per data set, split and method, the row of the run whose chosen grid point "
                             "scored best on validation (the test rows are not compared)")


#: The options that decide a row's numbers: recorded in ``uci_bnn_budget.json``, and a rerun into the same
#: ``--out`` with other values is refused (its rows would be skipped as done, or mixed with the others).
BUDGET_OPTIONS = ("batch_size", "epochs", "collect_epochs", "snapshots_per_epoch", "rank", "n_draws", "vifa_epochs",
                  "slang_epochs", "adam_lr", "weight_decays", "epoch_fractions", "collect_lrs", "dropout_rates",
                  "slang_lrs", "seed")
BUDGET_FILE = "uci_bnn_budget.json"


def _check_budget(args: argparse.Namespace, out: Path) -> None:
    """Record this run's budget in ``out``, or refuse (CommandError) one that differs from the recorded."""
    budget = {name: getattr(args, name) for name in BUDGET_OPTIONS}
    path = out / BUDGET_FILE
    if path.exists():
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise CommandError(f"{path} is not readable JSON ({err}); use another --out") from err
        differ = [f"--{n.replace('_', '-')} {recorded.get(n)!r} there, {budget[n]!r} here"
                  for n in BUDGET_OPTIONS if recorded.get(n) != budget[n]]
        if differ:
            raise CommandError(f"{out} holds rows of another budget ({'; '.join(differ)}): use another --out, "
                               "or the recorded options")
        return
    if read_rows(out / "uci_bnn.csv"):
        raise CommandError(f"{out} holds rows without a record of their budget ({BUDGET_FILE}): use another --out")
    temporary = out / f".{BUDGET_FILE}.tmp"
    temporary.write_text(json.dumps(budget, indent=1, sort_keys=True) + "\n")
    temporary.replace(path)


def _completed(out: Path) -> set[tuple[str, str, str]]:
    """The (data set, split, method) of the rows present in both result files; rows in only one of them (a
    run killed between its two appends) are removed, so that the pair is written again."""
    from ._report import CHOICE_FIELDS, FIELDS

    def key(row: dict[str, str]) -> tuple[str, str, str]:
        return row["dataset"], row["split"], row["method"]

    files = ((out / "uci_bnn.csv", FIELDS), (out / "uci_bnn_choices.csv", CHOICE_FIELDS))
    tables = [read_rows(path) for path, _ in files]
    both = {key(r) for r in tables[0]} & {key(r) for r in tables[1]}
    for (path, fields), rows in zip(files, tables):
        kept = [r for r in rows if key(r) in both]
        if path.exists() and (len(kept) < len(rows) or path.read_bytes()[-1:] not in (b"", b"\n")):
            write_rows(path, kept, fields)
    return both


def _dataset_seed(args: argparse.Namespace, name: str, split: int, stage: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([args.seed, zlib.crc32(name.encode()), split, stage])


def _noise_and_score(result: Any, y_val: Any) -> tuple[float, float]:
    """The predictive σ² of a validation fit and its validation log-likelihood (standardised units): tuned on
    the validation rows, unless the method predicts with its own noise."""
    from ._metrics import mixture_log_likelihood, tune_noise_variance

    if result.noise_variance is None:
        return tune_noise_variance(result.draws, y_val)
    return result.noise_variance, mixture_log_likelihood(result.draws, y_val, result.noise_variance, 0.0, 1.0)


def _run_split(args: argparse.Namespace, dataset: Any, split: int, train: Any, test: Any, methods: list[str],
               grid: Any, out: Path) -> None:
    """Tune every method of ``methods`` on the training rows of one split, refit, evaluate, append rows."""
    from ._data import standardise
    from ._methods import Budget, Stage
    from ._metrics import mixture_log_likelihood, rmse
    from ._report import CHOICE_FIELDS, FIELDS
    from ._splits import validation_split

    epochs = args.epochs if args.epochs is not None else 10 * dataset.n_epochs
    budget = Budget(args.batch_size, epochs, args.collect_epochs, args.snapshots_per_epoch, args.rank,
                    args.n_draws, args.vifa_epochs, args.slang_epochs, args.adam_lr)
    fractions = tuple(grid.epoch_fractions)
    X_train, y_train = dataset.X[train], dataset.y[train]
    # 1. validation stage: the training rows only.
    fit, val = validation_split(len(train), int(_dataset_seed(args, dataset.name, split, 0).generate_state(1)[0]))
    x_mean, x_std, y_mean, y_std = standardise(X_train[fit], y_train[fit])
    stage = Stage((X_train[fit] - x_mean) / x_std, (y_train[fit] - y_mean) / y_std, (X_train[val] - x_mean) / x_std,
                  dataset.n_hidden, budget, _dataset_seed(args, dataset.name, split, 1), fractions,
                  dataset.name, float(y_std))
    y_val = (y_train[val] - y_mean) / y_std
    chosen: dict[str, tuple[Any, float, float, float]] = {}
    for method in methods:
        best: tuple[Any, float, float, float] | None = None
        tuning_seconds = 0.0
        for config in grid.configs(method, dataset.name):
            result = stage.run(method, config)
            tuning_seconds += result.seconds
            noise, score = _noise_and_score(result, y_val)
            if best is None or score > best[2]:
                best = (config, noise, score, 0.0)
        assert best is not None
        chosen[method] = (best[0], best[1], best[2], tuning_seconds)
    # 2. refit on all training rows; the test rows are used only here.
    x_mean, x_std, y_mean, y_std = standardise(X_train, y_train)
    final = Stage((X_train - x_mean) / x_std, (y_train - y_mean) / y_std, (dataset.X[test] - x_mean) / x_std,
                  dataset.n_hidden, budget, _dataset_seed(args, dataset.name, split, 2), fractions,
                  dataset.name, float(y_std))
    for method in methods:
        config, noise, score, tuning_seconds = chosen[method]
        result = final.run(method, config)
        if result.noise_variance is not None:  # the method's own noise, from the refit's standardisation
            noise = result.noise_variance
        row = {"dataset": dataset.name, "split": split, "method": method,
               "test_ll": mixture_log_likelihood(result.draws, dataset.y[test], noise, y_mean, y_std),
               "rmse": rmse(result.draws, dataset.y[test], y_mean, y_std), "fit_seconds": round(result.seconds, 3)}
        choice = {"dataset": dataset.name, "split": split, "method": method, "weight_decay": config[0],
                  "setting": config[1], "noise_variance": noise, "validation_ll": score,
                  "tuning_seconds": round(tuning_seconds, 3)}
        # The choice first: a kill between the two appends leaves a choice without its result, which the
        # next run removes and writes again (see _completed).
        append_rows(out / "uci_bnn_choices.csv", [choice], CHOICE_FIELDS)
        append_rows(out / "uci_bnn.csv", [row], FIELDS)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; write ``uci_bnn.csv``, ``uci_bnn_choices.csv`` and ``uci_bnn.md`` to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options (see :func:`add_arguments`).

    Returns
    -------
    int
        0 on success.
    """
    if args.quick:
        for key, value in QUICK.items():
            if key != "splits" or args.splits is None:
                setattr(args, key, value)
    try:
        import torch
    except ModuleNotFoundError as err:
        raise CommandError(
            "the uci-bnn experiment needs the optional package 'torch', which is not installed (pip install "
            "torch, or pip install \".[torch]\" in onlinefa's source tree)"
        ) from err
    # Networks of 50-100 units: one thread is faster than several (no thread hand-offs per tiny kernel).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    from ._data import load_dataset
    from ._methods import load_slang
    from ._names import METHODS
    from ._report import summary_markdown
    from ._splits import published_splits
    from ._tuning import Grid, check_grid

    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise CommandError(f"unknown methods {unknown}; expected a subset of {', '.join(METHODS)}")
    if args.splits is not None and args.splits < 1:
        raise CommandError("--splits must be >= 1")
    if args.first_split < 0:
        raise CommandError("--first-split must be >= 0")
    grid = Grid(tuple(args.weight_decays), tuple(args.epoch_fractions), tuple(args.collect_lrs),
                tuple(args.dropout_rates), tuple(args.slang_lrs))
    try:
        check_grid(grid)
    except ValueError as err:
        raise CommandError(str(err)) from err
    if args.collect_epochs * args.snapshots_per_epoch < args.rank + 3:
        raise CommandError("too few snapshots for --rank: raise --collect-epochs or --snapshots-per-epoch")
    methods = list(args.methods)
    notes: list[str] = []
    if load_slang() is None and {"slang", "slang_recipe"} & set(methods):
        methods = [m for m in methods if m not in ("slang", "slang_recipe")]
        notes.append("SLANG skipped: its module (onlinefa_experiments.uci_bnn._slang) is not installed.")
        print(notes[-1])
    if args.select_from is not None:
        return _write_selection(args.select_from, args.out)
    out = output_dir(args.out)
    if args.report_only:
        notes.append("Report of the rows present; runs may still be in progress (numbers of splits in brackets).")
        summary = summary_markdown(read_rows(out / "uci_bnn.csv"), notes)
        (out / "uci_bnn.md").write_text(summary)
        print(summary)
        return 0
    datasets = [load_dataset(name, args.data_dir) for name in args.datasets]
    _check_budget(args, out)
    done = _completed(out)
    tasks = []
    for dataset in datasets:
        n_splits = dataset.n_splits if args.splits is None else min(args.splits, dataset.n_splits)
        for split, (train, test) in enumerate(published_splits(dataset.y.size, n_splits)):
            todo = [m for m in methods if (dataset.name, str(split), m) not in done]
            if todo and split >= args.first_split:
                tasks.append((dataset, split, train, test, todo))
    start = time.perf_counter()
    for dataset, split, train, test, todo in progress(tasks, total=len(tasks), desc=NAME):
        _run_split(args, dataset, split, train, test, todo, grid, out)
    notes += [f"Grid (same size for every method): {grid.describe()}.",
              f"Budget: batch {args.batch_size}, Adam rate {args.adam_lr}, E = "
              f"{args.epochs if args.epochs is not None else '10 × n_epochs'} epochs, SWAG collection "
              f"{args.collect_epochs} epochs × {args.snapshots_per_epoch} snapshots, K = {args.rank}, "
              f"{args.n_draws} draws, VIFA {args.vifa_epochs} epochs, SLANG {args.slang_epochs} epochs.",
              f"This invocation: {len(tasks)} (data set, split) tasks in {time.perf_counter() - start:.0f} s."]
    summary = summary_markdown(read_rows(out / "uci_bnn.csv"), notes)
    (out / "uci_bnn.md").write_text(summary)
    print(summary)
    return 0


def _write_selection(folders: list[Path], out_path: Path) -> int:
    """``--select-from``: the best-validated run's row per (data set, split, method) into ``out_path``."""
    from ._report import CHOICE_FIELDS, FIELDS, summary_markdown
    from ._select import SOURCE_FIELDS, select_by_validation

    if any(Path(f).resolve() == Path(out_path).resolve() for f in folders):
        raise CommandError("--out must not be one of the --select-from folders")
    if (out_path / "uci_bnn.csv").exists() and not (out_path / "uci_bnn_selected.csv").exists():
        raise CommandError(f"{out_path} holds the rows of a run; --select-from writes only to a new folder or to "
                           "the folder of an earlier selection")
    try:
        rows, choices, sources = select_by_validation(folders)
    except ValueError as err:
        raise CommandError(str(err)) from err
    out = output_dir(out_path)
    for name, fields, table in (("uci_bnn.csv", FIELDS, rows), ("uci_bnn_choices.csv", CHOICE_FIELDS, choices),
                                ("uci_bnn_selected.csv", SOURCE_FIELDS, sources)):
        (out / name).unlink(missing_ok=True)
        append_rows(out / name, table, fields)
    counts = {Path(f).name: sum(s["run"] == Path(f).name for s in sources) for f in folders}
    note = ("Rows chosen per data set, split and method by validation log-likelihood among the runs "
            + ", ".join(f"{name} ({n} rows)" for name, n in counts.items()) + ".")
    summary = summary_markdown(rows, [note])
    (out / "uci_bnn.md").write_text(summary)
    print(summary)
    return 0
