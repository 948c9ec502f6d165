"""The ``swag`` experiment's CSV columns and markdown summary (mean ± s.e. over seeds, paired differences)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .linreg_iterates import format_mean_se, markdown_table, mean_and_standard_error

#: Methods in table order, with their labels.
METHODS: dict[str, str] = {
    "sgd": "SGD (final iterate)",
    "swa": "SWA",
    "swag_diag": "SWAG-diagonal",
    "swag": "SWAG (rank K)",
    "online_em": "OnlineEM (defaults)",
    "online_sga": "OnlineSGA (defaults)",
    "vifa": "VIFA (from SWAG)",
    "multiswag": "MultiSWAG",
}

#: Sampling scale of each posterior: SWAG's loadings/noise already hold its 1/2 factors; SWAG-diagonal is
#: drawn with the same 1/2 on Σ_diag as full SWAG; the FA models and VIFA are drawn as fitted.
SCALES: dict[str, float] = {"swag_diag": 0.5, "swag": 1.0, "online_em": 1.0, "online_sga": 1.0, "vifa": 1.0,
                            "multiswag": 1.0}


FIELDS = ["dataset", "seed", "method", "n_train", "n_test", "n_params", "n_snapshots", "every", "noise_variance",
          "nll", "accuracy", "rmse", "ece", "var_ratio", "var_ratio_median", "seconds_per_snapshot"]

#: The reference of the paired differences.
BASELINE = "swag_diag"


def _value(row: Mapping[str, Any], column: str) -> float:
    value = row.get(column, math.nan)
    return math.nan if value in ("", None) else float(value)


def paired_differences(rows: Sequence[Mapping[str, Any]], method: str, column: str) -> list[float]:
    """``method − SWAG-diagonal`` of ``column`` per seed; MultiSWAG's one value pairs with every seed."""
    baseline = {str(r["seed"]): _value(r, column) for r in rows if r["method"] == BASELINE}
    mine = {str(r["seed"]): _value(r, column) for r in rows if r["method"] == method}
    if "all" in mine:
        return [mine["all"] - base for base in baseline.values()]
    return [mine[seed] - baseline[seed] for seed in baseline if seed in mine]


def _cell(values: Sequence[float], digits: int) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "—"
    if len(finite) == 1:
        return f"{finite[0]:.{digits}f}"
    return format_mean_se(*mean_and_standard_error(finite), digits=digits)


def _dataset_table(rows: Sequence[Mapping[str, Any]], kind_column: str) -> str:
    header = ["method", "NLL", kind_column.upper() if kind_column == "rmse" else "accuracy", "ECE",
              "var ratio (mean)", "var ratio (median)", "µs / snapshot", "ΔNLL vs SWAG-diag",
              f"Δ{'RMSE' if kind_column == 'rmse' else 'accuracy'} vs SWAG-diag"]
    body = []
    for method, label in METHODS.items():
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue

        def column(name: str, digits: int, scale: float = 1.0) -> str:
            return _cell([scale * _value(r, name) for r in mine], digits)  # noqa: B023

        body.append([label, column("nll", 4), column(kind_column, 4), column("ece", 4), column("var_ratio", 3),
                     column("var_ratio_median", 3), column("seconds_per_snapshot", 1, 1e6),
                     _cell(paired_differences(rows, method, "nll"), 4),
                     _cell(paired_differences(rows, method, kind_column), 4)])
    return markdown_table(header, body)


def summary_markdown(args: argparse.Namespace, rows: Sequence[Mapping[str, Any]]) -> str:
    """The experiment's markdown report: settings, then one table per data set."""
    scales = ", ".join(f"{name} {scale:g}" for name, scale in SCALES.items())
    parts = [
        "# swag: SWAG baselines and onlinefa posteriors on small MLPs\n\n"
        f"{args.seeds} seeds (base {args.seed}); MLP hidden {args.hidden}, SGD batch {args.batch_size}, weight decay "
        f"{args.weight_decay:g}; {args.pretrain_epochs} pre-training epochs at lr {args.pretrain_lr:g}, then "
        f"{args.collect_epochs} epochs at lr {args.collect_lr:g} with {args.snapshots_per_epoch} snapshots per "
        f"epoch; K = {args.rank}; {args.n_draws} draws per posterior ({args.n_draws} per seed for MultiSWAG); "
        f"VIFA: {args.vifa_epochs} epochs of Adam (lr {args.vifa_lr:g}, log ψ {args.vifa_lr_log_noise:g}). "
        f"Sampling scales: {scales}.\n\n"
        "Cells: mean ± standard error over seeds; Δ = method − SWAG-diagonal paired by seed (MultiSWAG is one "
        "mixture over all seeds, paired with each seed's SWAG-diagonal). var ratio: posterior marginal "
        "variances scale·diag(FFᵀ+Ψ) over the snapshots' variances — ratio of the means over parameters, and "
        "the median of the per-parameter ratios. µs / snapshot: median cost of one snapshot (gather + update); "
        "VIFA: one training step (forward, backward, update).\n"
    ]
    for name in args.datasets:
        mine = [r for r in rows if r["dataset"] == name]
        kind_column = "rmse" if any(not math.isnan(_value(r, "rmse")) for r in mine) else "accuracy"
        first = mine[0]
        parts.append(f"\n## {name} (N_train = {first['n_train']}, N_test = {first['n_test']}, D = "
                     f"{first['n_params']}, {first['n_snapshots']} snapshots, one every {first['every']} steps)\n\n")
        parts.append(_dataset_table(mine, kind_column))
    return "".join(parts)
