"""Tables and the plot of the ``calibration`` experiment (mean ± standard error over seeds, paired
differences against the ``onlinefa`` recipe)."""

from __future__ import annotations

import argparse
import math
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
import numpy as np

#: The method every paired difference is taken against.
REFERENCE = "onlinefa"


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return math.nan, math.nan
    se = float(array.std(ddof=1) / math.sqrt(array.size)) if array.size > 1 else math.nan
    return float(array.mean()), se


def _cell(values: Sequence[float], digits: int = 4) -> str:
    mean, se = _mean_se(values)
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" if math.isnan(se) else f"{mean:.{digits}f} ± {se:.{digits}f}"


def per_seed(rows: Sequence[Mapping[str, str]], dataset: str, method: str, column: str, evaluation: str
             ) -> dict[str, float]:
    """``{seed: value}`` of one column; ``evaluation="shift"`` averages over every shifted set of a seed."""
    values: dict[str, list[float]] = {}
    for row in rows:
        if row["dataset"] != dataset or row["method"] != method or row[column] == "":
            continue
        matches = row["evaluation"].startswith("shift:") if evaluation == "shift" else row["evaluation"] == evaluation
        if matches:
            values.setdefault(row["seed"], []).append(float(row[column]))
    return {seed: float(np.mean(v)) for seed, v in values.items()}


def _paired(rows: Sequence[Mapping[str, str]], dataset: str, method: str, column: str, evaluation: str
            ) -> list[float]:
    mine, reference = (per_seed(rows, dataset, m, column, evaluation) for m in (method, REFERENCE))
    return [mine[seed] - reference[seed] for seed in sorted(mine) if seed in reference]


def _evaluations(rows: Sequence[Mapping[str, str]], dataset: str) -> tuple[bool, list[str]]:
    names = {row["evaluation"] for row in rows if row["dataset"] == dataset}
    return any(n.startswith("shift:") for n in names), sorted(n for n in names if n.startswith("ood:"))


def _is_regression(rows: Sequence[Mapping[str, str]], dataset: str) -> bool:
    return any(row["dataset"] == dataset and row.get("rmse", "") != "" for row in rows)


def _regression_tables(rows: Sequence[Mapping[str, str]], dataset: str, present: Sequence[str]) -> list[str]:
    lines = [f"### {dataset} (regression)", "", "| method | test log-likelihood | RMSE |", "|---|---|---|"]
    for method in present:
        log_likelihood = [-v for v in per_seed(rows, dataset, method, "nll", "clean").values()]
        rmse = list(per_seed(rows, dataset, method, "rmse", "clean").values())
        lines.append(f"| {method} | {_cell(log_likelihood, 3)} | {_cell(rmse, 3)} |")
    if REFERENCE in present:
        lines += ["", f"Paired differences against `{REFERENCE}` (method − {REFERENCE}; positive log-likelihood "
                  "and negative RMSE differences favour the method):", "", "| method | Δ log-likelihood | Δ RMSE |",
                  "|---|---|---|"]
        for method in (m for m in present if m != REFERENCE):
            delta = [-v for v in _paired(rows, dataset, method, "nll", "clean")]
            lines.append(f"| {method} | {_cell(delta, 3)} | {_cell(_paired(rows, dataset, method, 'rmse', 'clean'), 3)} |")
    return lines


def _dataset_tables(rows: Sequence[Mapping[str, str]], costs: Sequence[Mapping[str, str]], dataset: str,
                    methods: Sequence[str]) -> list[str]:
    shifted, oods = _evaluations(rows, dataset)
    present = [m for m in methods if per_seed(rows, dataset, m, "nll", "clean")]
    if _is_regression(rows, dataset):
        return _regression_tables(rows, dataset, present) + _cost_table(costs, dataset, present)
    head = ["method", "accuracy", "NLL", "ECE", "Brier"] + (["shifted NLL"] if shifted else []) + [
        f"AUROC {o.removeprefix('ood:')}" for o in oods]
    lines = [f"### {dataset}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in present:
        cells = [_cell(list(per_seed(rows, dataset, method, c, "clean").values())) for c in ("accuracy", "nll", "ece", "brier")]
        if shifted:
            cells.append(_cell(list(per_seed(rows, dataset, method, "nll", "shift").values())))
        cells += [_cell(list(per_seed(rows, dataset, method, "auroc", o).values()), 3) for o in oods]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if REFERENCE in present:
        diff_head = ["method", "Δ clean NLL"] + (["Δ shifted NLL"] if shifted else []) + [
            f"Δ AUROC {o.removeprefix('ood:')}" for o in oods]
        lines += ["", f"Paired differences against `{REFERENCE}` (method − {REFERENCE}; negative NLL and positive "
                  "AUROC differences favour the method):", "", "| " + " | ".join(diff_head) + " |",
                  "|" + "---|" * len(diff_head)]
        for method in (m for m in present if m != REFERENCE):
            cells = [_cell(_paired(rows, dataset, method, "nll", "clean"))]
            if shifted:
                cells.append(_cell(_paired(rows, dataset, method, "nll", "shift")))
            cells += [_cell(_paired(rows, dataset, method, "auroc", o), 3) for o in oods]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + _cost_table(costs, dataset, present)


def _cost_table(costs: Sequence[Mapping[str, str]], dataset: str, present: Sequence[str]) -> list[str]:
    lines = ["", "Costs as multiples of plain SGD training of one network (mean over seeds):", "",
             "| method | training | post-hoc | prediction (every evaluation set) |", "|---|---|---|---|"]
    for method in present:
        picked = [row for row in costs if row["dataset"] == dataset and row["method"] == method]
        means = [np.mean([float(row[c]) for row in picked]) if picked else math.nan
                 for c in ("train", "posthoc", "predict")]
        lines.append(f"| {method} | " + " | ".join(f"{v:.2f}" for v in means) + " |")
    return lines + [""]


def _versions(methods: Sequence[str]) -> str:
    from importlib.metadata import PackageNotFoundError, version

    packages = ["onlinefa", "torch", "laplace-torch", "ivon-opt", "torch-uncertainty"]
    found = []
    for package in packages:
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return ", ".join(found) + f"; Python {platform.python_version()}"


def summary_markdown(rows: Sequence[Mapping[str, str]], costs: Sequence[Mapping[str, str]], methods: Sequence[str],
                     args: argparse.Namespace) -> str:
    """The markdown report: per dataset, the metrics, the paired differences and the costs."""
    datasets = list(dict.fromkeys(row["dataset"] for row in rows))
    seeds = len({row["seed"] for row in rows})
    lines = ["## calibration", "",
             f"MLP {args.hidden}, {args.epochs} epochs of SGD (lr {args.lr}, batch {args.batch_size}), the last "
             f"{args.collect_epochs} collected at {args.snapshots_per_epoch} snapshots per epoch (K = {args.rank}), "
             f"{args.n_draws} draws per prediction, {args.members} runs per ensemble; {seeds} seed(s), mean ± s.e. "
             f"NLL and Brier: lower is better; shifted NLL: the mean over the shifted test sets; AUROC: OOD inputs "
             f"against the clean test inputs by predictive entropy.", "", f"Versions: {_versions(methods)}.", ""]
    for dataset in datasets:
        lines += _dataset_tables(rows, costs, dataset, methods)
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, str]], folder: Path, path: Path) -> None:
    """Reliability diagrams (clean test set, seed 0) and NLL over the evaluation sets, one row per dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ._calibration import reliability_bins

    datasets = [d for d in dict.fromkeys(row["dataset"] for row in rows) if not _is_regression(rows, d)]
    if not datasets:
        return
    palette = plt.get_cmap("tab20")
    every = list(dict.fromkeys(row["method"] for row in rows))
    # One colour per method in both panels (the dark tab20 shades first), the recipe drawn heavier.
    style = {m: {"color": palette((2 * i) % 20 + (2 * i) // 20), "linewidth": 2.5 if m == REFERENCE else 1.2}
             for i, m in enumerate(every)}
    fig, axes = plt.subplots(len(datasets), 2, figsize=(12, 4.2 * len(datasets)), squeeze=False)
    for (left, right), dataset in zip(axes, datasets):
        stored = folder / f"clean_{dataset}_seed0.npz"
        if stored.exists():
            with np.load(stored) as probabilities:
                labels = probabilities["labels"]
                for method in (m for m in probabilities.files if m != "labels"):
                    bins = reliability_bins(probabilities[method], labels, 10)
                    shown = bins.counts >= 10
                    left.plot(bins.confidence[shown], (bins.accuracy - bins.confidence)[shown], marker="o",
                              markersize=3, label=method, **style.get(method, {}))
        left.axhline(0.0, color="black", linewidth=0.8)
        left.set(xlabel="confidence (bin mean)", ylabel="accuracy − confidence",
                 title=f"{dataset}: reliability, clean test set, seed 0 (below 0: over-confident)")
        left.legend(fontsize=7)
        evaluations = ["clean"] + sorted({r["evaluation"] for r in rows if r["dataset"] == dataset
                                          and r["evaluation"].startswith("shift:")}, key=_severity)
        methods = list(dict.fromkeys(r["method"] for r in rows if r["dataset"] == dataset))
        for method in methods:
            means = [np.mean(list(per_seed(rows, dataset, method, "nll", e).values()) or [math.nan])
                     for e in evaluations]
            right.plot(range(len(evaluations)), means, marker="o", markersize=3, label=method, **style[method])
        right.set_xticks(range(len(evaluations)), [e.removeprefix("shift:") for e in evaluations], rotation=30,
                         fontsize=8)
        right.set(ylabel="test NLL (mean over seeds)", title=f"{dataset}: NLL on clean and shifted test sets")
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _severity(evaluation: str) -> tuple[int, float, str]:
    """Pixel-noise sets first in increasing s.d., then the others by name."""
    name = evaluation.removeprefix("shift:")
    if name.startswith("noise"):
        try:
            return (0, float(name.removeprefix("noise")), name)
        except ValueError:
            pass
    return (1, 0.0, name)
