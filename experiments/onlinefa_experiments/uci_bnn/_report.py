"""Markdown tables of the ``uci-bnn`` experiment: ours (mean ± s.e. over splits) beside the published."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ._metrics import mean_and_standard_error
from ._names import METHODS
from ._published import PUBLISHED_LL, PUBLISHED_METHODS, PUBLISHED_RMSE

#: Columns of the results CSV.
FIELDS = ["dataset", "split", "method", "test_ll", "rmse", "fit_seconds"]
#: Columns of the CSV of per-split choices.
CHOICE_FIELDS = ["dataset", "split", "method", "weight_decay", "setting", "noise_variance", "validation_ll",
                 "tuning_seconds"]

#: Table order of data sets.
DATASET_ORDER = ("boston", "concrete", "energy", "yacht", "naval", "protein")


def _cell(values: Sequence[float], digits: int) -> str:
    mean, se = mean_and_standard_error(list(values))
    if math.isnan(mean):
        return "–"
    se_text = "n/a" if math.isnan(se) else f"{se:.{digits}f}"
    return f"{mean:.{digits}f} ± {se_text} ({len(values)})"


def column_digits(means: Sequence[float], digits: int) -> int:
    """Decimals for a column of means: at least ``digits``, and enough for two significant digits of its smallest
    non-zero magnitude (Naval's RMSE is ~4e-4: two decimals would print every method as 0.00)."""
    magnitudes = [abs(v) for v in means if v != 0 and math.isfinite(v)]
    if not magnitudes:
        return digits
    return max(digits, 1 - math.floor(math.log10(min(magnitudes))))


def _table(rows: Sequence[Mapping[str, str]], column: str, published: Mapping[str, Sequence[object]],
           datasets: list[str], digits: int) -> list[str]:
    header = "| method | " + " | ".join(datasets) + " |"
    lines = [header, "|---|" + "---|" * len(datasets)]
    values_of = {(method, name): [float(r[column]) for r in rows if r["method"] == method and r["dataset"] == name]
                 for method in METHODS for name in datasets}
    decimals = {name: column_digits([sum(v) / len(v) for (_, n), v in values_of.items() if n == name and v], digits)
                for name in datasets}
    for method, label in METHODS.items():
        cells = []
        for name in datasets:
            cells.append(_cell(values_of[method, name], decimals[name]))
        if any(c != "–" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for index, label in enumerate(PUBLISHED_METHODS):
        cells = []
        for name in datasets:
            entry = published.get(name, (None,) * len(PUBLISHED_METHODS))[index]
            cells.append("–" if entry is None else f"{entry[0]:.2f} ± {entry[1]:.2f}")  # type: ignore[index]
        lines.append(f"| *published:* {label} | " + " | ".join(cells) + " |")
    return lines


def summary_markdown(rows: Sequence[Mapping[str, str]], notes: Sequence[str]) -> str:
    """Test log-likelihood and RMSE tables (ours: mean ± s.e. (number of splits))."""
    present = {r["dataset"] for r in rows}
    datasets = [d for d in DATASET_ORDER if d in present] + sorted(present - set(DATASET_ORDER))
    lines = ["# UCI regression benchmark (`onlinefa experiment uci-bnn`)", ""]
    lines += [f"- {note}" for note in notes]
    lines += ["", "## Test log-likelihood per point (higher is better)", "",
              "Ours: mean ± standard error over splits (number of splits done).", ""]
    lines += _table(rows, "test_ll", PUBLISHED_LL, datasets, 2)
    lines += ["", "## Test RMSE (lower is better)", ""]
    lines += _table(rows, "rmse", PUBLISHED_RMSE, datasets, 2)
    lines += ["", "## Mean fit seconds per split (refit on the whole training part)", ""]
    lines += ["| method | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
    for method, label in METHODS.items():
        cells = []
        for name in datasets:
            values = [float(r["fit_seconds"]) for r in rows if r["method"] == method and r["dataset"] == name]
            cells.append(f"{sum(values) / len(values):.1f}" if values else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
