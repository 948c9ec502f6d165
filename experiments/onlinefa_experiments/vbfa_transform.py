"""``vbfa-transform``: Luttinen & Ilin §4.1 — how much the transformations speed VB-FA up.

Three artificial data sets of N = 200 points in 50 dimensions, means drawn from N(0, 1), covariance
eigenvalues (1) ten 5² and forty 1s, (2) 2², 3², …, 11² and forty 1s, (3) 1², 2², …, 50², with random
eigenvectors; 20 % of the entries removed (held out for the reconstruction RMSE). VB-FA with the
hierarchical (ARD) prior, noise precisions initialised large, K ∈ {2, 5, 10, 20, 30}, is run three ways
on every data set and trial: without transformations, with translation + rotation after every sweep from
sweep 5 on (``start5``), and from the first sweep (``start1``, the paper's warning case for pruning).

For each run the sweeps and seconds until the bound is within 1e-3 (and 1e-4) relative of the best
final bound of the three runs are reported (paper: about 10× fewer sweeps on data sets 1–2, growing
with K; little effect on data set 3), together with the final bound, the number of components left
active by ARD and the held-out RMSE (the pruning measurement).
"""

from __future__ import annotations

import argparse
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ._common import append_rows, output_dir, progress, read_rows

if TYPE_CHECKING:  # imported where a model is built: the CLI lists this experiment without scikit-learn
    from onlinefa.vbfa import VBFA

NAME = "vbfa-transform"
HELP = "Luttinen & Ilin §4.1: sweeps/seconds of VB-FA to converge with and without the transformations"

FloatArray = NDArray[np.float64]

DEFAULT_COMPONENTS = (2, 5, 10, 20, 30)
QUICK_COMPONENTS = (5, 20)
DEFAULT_TRIALS = 5
QUICK_TRIALS = 2
DEFAULT_MAX_ITER = 5000
QUICK_MAX_ITER = 800
#: Initial noise variance / column variance: small (the paper's "τ large") and large (its pruning-risk case).
DEFAULT_NOISE_RATIOS = (1e-2, 1.0)
#: Run names → transform_start (None = no transformations).
VARIANTS: dict[str, int | None] = {"none": None, "start5": 5, "start1": 1}
#: Relative distances to the best final bound at which sweeps and seconds are reported.
THRESHOLDS = (1e-3, 1e-4)
#: A component counts as active when ‖f̄_k‖² exceeds this fraction of the largest one (ARD drives pruned
#: columns of F̄ to ~0: 1e-39 and below in practice, against O(1)–O(10³) for active ones).
ACTIVE_FRACTION = 1e-8

_KEY_FIELDS = ["dataset", "n_components", "prior", "variant", "trial", "seed", "n_samples", "n_features",
               "missing_fraction", "max_iter", "tol", "init_noise_ratio"]
_FIELDS = [*_KEY_FIELDS, "n_sweeps", "converged", "final_elbo", "seconds", "active_components", "test_rmse",
           "trace_file"]


@dataclass(frozen=True)
class Config:
    """The grid of one run of the experiment (resolved from the command line)."""

    datasets: tuple[int, ...]
    components: tuple[int, ...]
    priors: tuple[str, ...]
    trials: int
    seed: int
    max_iter: int
    tol: float
    n_samples: int
    n_features: int
    missing_fraction: float
    init_noise_ratios: tuple[float, ...]
    out: Path


@dataclass(frozen=True)
class PaperData:
    """One artificial data set of §4.1.

    Attributes
    ----------
    observed : ndarray of shape (N, D)
        The data with the held-out entries set to NaN.
    complete : ndarray of shape (N, D)
        The data before removal.
    held_out : ndarray of shape (N, D), bool
        Which entries were removed.
    """

    observed: FloatArray
    complete: FloatArray
    held_out: NDArray[np.bool_]


def covariance_eigenvalues(dataset: int, n_features: int = 50) -> FloatArray:
    """Eigenvalues of the covariance of data set 1, 2 or 3 of §4.1 (for D = 50 as in the paper).

    Parameters
    ----------
    dataset : {1, 2, 3}
        (1) ten 5² and the rest 1; (2) 2², …, 11² and the rest 1; (3) 1², 2², …, D².
    n_features : int
        D (at least 10 for data sets 1 and 2).

    Returns
    -------
    ndarray of shape (n_features,)
    """
    if dataset == 1:
        return np.concatenate([np.full(10, 25.0), np.ones(n_features - 10)])
    if dataset == 2:
        return np.concatenate([np.arange(2.0, 12.0) ** 2, np.ones(n_features - 10)])
    if dataset == 3:
        return np.arange(1.0, n_features + 1.0) ** 2
    raise ValueError(f"dataset must be 1, 2 or 3, got {dataset}")


def paper_dataset(
    dataset: int, seed: int, *, n_samples: int = 200, n_features: int = 50, missing_fraction: float = 0.2
) -> PaperData:
    """Draw one of the three artificial data sets of Luttinen & Ilin §4.1.

    x_n ~ N(μ, Q diag(λ) Qᵀ) with μ_d ~ N(0, 1), Q a uniformly random orthogonal matrix and λ from
    :func:`covariance_eigenvalues`; each entry is then held out independently with probability
    ``missing_fraction`` (re-drawn if a column would lose every value).

    Parameters
    ----------
    dataset : {1, 2, 3}
    seed : int
    n_samples, n_features : int
    missing_fraction : float in [0, 1)

    Returns
    -------
    PaperData
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, dataset]))
    eigenvalues = covariance_eigenvalues(dataset, n_features)
    q, r = np.linalg.qr(rng.standard_normal((n_features, n_features)))
    q *= np.sign(np.diag(r))  # Haar-distributed
    mean = rng.standard_normal(n_features)
    complete = mean + (rng.standard_normal((n_samples, n_features)) * np.sqrt(eigenvalues)) @ q.T
    held_out = rng.random((n_samples, n_features)) < missing_fraction
    while np.any(held_out.all(axis=0)):
        held_out = rng.random((n_samples, n_features)) < missing_fraction
    observed = np.where(held_out, np.nan, complete)
    return PaperData(observed=observed, complete=complete, held_out=held_out)


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    parser.add_argument("--out", type=Path, default=Path("results") / NAME, help="output folder (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"K in {QUICK_COMPONENTS}, {QUICK_TRIALS} trials, at most {QUICK_MAX_ITER} sweeps "
                             "(explicit options override)")
    parser.add_argument("--trials", type=_positive_int, help=f"trials per setting (default {DEFAULT_TRIALS})")
    parser.add_argument("--seed", type=int, default=0, help="base seed; trial t uses seed + t (default 0)")
    parser.add_argument("--datasets", type=int, nargs="+", choices=(1, 2, 3), default=[1, 2, 3],
                        help="data sets of §4.1 (default 1 2 3)")
    parser.add_argument("--components", type=_positive_int, nargs="+",
                        help=f"latent dimensions K (default {' '.join(map(str, DEFAULT_COMPONENTS))})")
    parser.add_argument("--priors", nargs="+", choices=("ard", "broad"), default=["ard"],
                        help="loading priors (default ard, the paper's hierarchical prior)")
    parser.add_argument("--max-iter", type=_positive_int, help=f"sweeps per run (default {DEFAULT_MAX_ITER})")
    parser.add_argument("--tol", type=float, default=1e-9,
                        help="stop a run when the bound changes by at most this, relative (default %(default)s)")
    parser.add_argument("--n-samples", type=_positive_int, default=200, help="N (default %(default)s)")
    parser.add_argument("--n-features", type=_positive_int, default=50, help="D (default %(default)s)")
    parser.add_argument("--missing-fraction", type=float, default=0.2,
                        help="fraction of entries held out (default %(default)s)")
    parser.add_argument("--init-noise-ratios", type=float, nargs="+", default=list(DEFAULT_NOISE_RATIOS),
                        help="initial noise variance / column variance; small = the paper's τ large, large = its "
                             "pruning-risk case (default %(default)s)")


def config_from_args(args: argparse.Namespace) -> Config:
    """Resolve the parsed options (and ``--quick``) into a :class:`Config`.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    Config

    Raises
    ------
    ValueError
        Inconsistent options (D < 10 for data sets 1–2, bad fractions or tolerances).
    """
    if args.n_features < 10 and set(args.datasets) & {1, 2}:
        raise ValueError("data sets 1 and 2 need --n-features >= 10")
    if not 0.0 <= args.missing_fraction < 1.0:
        raise ValueError(f"--missing-fraction must lie in [0, 1), got {args.missing_fraction}")
    if not (math.isfinite(args.tol) and args.tol >= 0.0):
        raise ValueError(f"--tol must be finite and >= 0, got {args.tol}")
    if not all(math.isfinite(r) and r > 0.0 for r in args.init_noise_ratios):
        raise ValueError(f"--init-noise-ratios must be finite and > 0, got {args.init_noise_ratios}")
    components = tuple(args.components) if args.components else (QUICK_COMPONENTS if args.quick else DEFAULT_COMPONENTS)
    return Config(
        datasets=tuple(dict.fromkeys(args.datasets)),
        components=tuple(dict.fromkeys(components)),
        priors=tuple(dict.fromkeys(args.priors)),
        trials=args.trials or (QUICK_TRIALS if args.quick else DEFAULT_TRIALS),
        seed=args.seed,
        max_iter=args.max_iter or (QUICK_MAX_ITER if args.quick else DEFAULT_MAX_ITER),
        tol=float(args.tol),
        n_samples=args.n_samples,
        n_features=args.n_features,
        missing_fraction=float(args.missing_fraction),
        init_noise_ratios=tuple(dict.fromkeys(float(r) for r in args.init_noise_ratios)),
        out=Path(args.out),
    )


@dataclass(frozen=True)
class Cell:
    """One (data set, K, prior, initial noise ratio, trial): the three variants run on the same data and seed."""

    dataset: int
    k: int
    prior: str
    noise_ratio: float
    trial: int


def _cells(config: Config) -> list[Cell]:
    """Every cell of the grid, in the order they are run."""
    return [Cell(dataset, k, prior, ratio, trial)
            for ratio in config.init_noise_ratios for prior in config.priors for dataset in config.datasets
            for k in config.components for trial in range(config.trials)]


def _cell_key(config: Config, cell: Cell, variant: str) -> dict[str, Any]:
    """CSV key columns of one run (the model seed is the trial's seed)."""
    dataset, k, prior, ratio, trial = cell.dataset, cell.k, cell.prior, cell.noise_ratio, cell.trial
    return {"dataset": dataset, "n_components": k, "prior": prior, "variant": variant, "trial": trial,
            "seed": config.seed + trial, "n_samples": config.n_samples, "n_features": config.n_features,
            "missing_fraction": config.missing_fraction, "max_iter": config.max_iter, "tol": config.tol,
            "init_noise_ratio": ratio}


def _same_key(row: dict[str, str], key: dict[str, Any]) -> bool:
    """Whether a CSV row was written for ``key`` (values compared as the CSV writes them)."""
    return all(row.get(name) == str(value) for name, value in key.items())


def _belongs(config: Config, row: dict[str, str]) -> bool:
    """Whether a CSV row is one of this configuration's runs (resumed files may hold others)."""
    return any(_same_key(row, _cell_key(config, cell, variant)) for cell in _cells(config) for variant in VARIANTS)


def fit_run(config: Config, data: PaperData, cell: Cell, variant: str) -> VBFA:
    """Fit one VB-FA run of the experiment.

    Parameters
    ----------
    config : Config
    data : PaperData
    cell : Cell
        K, prior, initial noise ratio and trial (the seed of the initial loadings is the trial's seed,
        shared by the three variants).
    variant : {"none", "start5", "start1"}

    Returns
    -------
    VBFA
        The fitted model (``elbo_``/``fit_time_`` hold the traces).
    """
    start = VARIANTS[variant]
    from onlinefa.vbfa import VBFA

    model = VBFA(cell.k, prior="ard" if cell.prior == "ard" else "broad", transformations=start is not None,
                 transformations_start=start or 1, max_iter=config.max_iter, tol=config.tol,
                 init_noise_ratio=cell.noise_ratio, random_state=config.seed + cell.trial)
    return model.fit(data.observed)


def held_out_rmse(model: VBFA, data: PaperData) -> float:
    """RMSE of the posterior-mean reconstruction f̄_dᵀ h̄_n + c̄_d on the held-out entries (NaN if none)."""
    if not data.held_out.any():
        return math.nan
    reconstruction = model.posterior().latent_mean @ model.components_ + model.mean_
    errors = reconstruction[data.held_out] - data.complete[data.held_out]
    return float(np.sqrt(np.mean(errors**2)))


def active_components(model: VBFA) -> int:
    """Number of columns of F̄ whose squared norm exceeds ACTIVE_FRACTION of the largest."""
    norms = np.sum(model.components_**2, axis=1)
    return int(np.sum(norms > ACTIVE_FRACTION * norms.max()))


def _trace_name(key: dict[str, Any]) -> str:
    """File name of a run's trace, unique for its key."""
    digest = hashlib.sha1(repr(sorted(key.items())).encode()).hexdigest()[:12]
    return f"d{key['dataset']}_k{key['n_components']}_{key['prior']}_{key['variant']}_t{key['trial']}_{digest}.npz"


def _run_cell(config: Config, traces: Path, cell: Cell) -> list[dict[str, Any]]:
    """The three variants of one cell; saves their traces."""
    data = paper_dataset(cell.dataset, config.seed + cell.trial, n_samples=config.n_samples,
                         n_features=config.n_features, missing_fraction=config.missing_fraction)
    rows = []
    for variant in VARIANTS:
        key = _cell_key(config, cell, variant)
        model = fit_run(config, data, cell, variant)
        name = _trace_name(key)
        np.savez(traces / name, elbo=model.elbo_, seconds=model.fit_time_)
        rows.append({**key, "n_sweeps": model.n_iter_, "converged": model.converged_,
                     "final_elbo": float(model.elbo_[-1]), "seconds": float(model.fit_time_[-1]),
                     "active_components": active_components(model), "test_rmse": held_out_rmse(model, data),
                     "trace_file": name})
    return rows


def first_within(elbo: FloatArray, best: float, threshold: float) -> int | None:
    """1-based index of the first sweep with (best − L_t)/|best| ≤ threshold, or None.

    Parameters
    ----------
    elbo : ndarray of shape (n_sweeps,)
    best : float
        The best final bound of the cell.
    threshold : float

    Returns
    -------
    int or None
    """
    hits = np.flatnonzero((best - elbo) / abs(best) <= threshold)
    return int(hits[0]) + 1 if hits.size else None


def convergence_rows(rows: list[dict[str, str]], traces: Path) -> list[dict[str, Any]]:
    """Per run: sweeps and seconds to each threshold relative to the best final bound of its cell.

    Parameters
    ----------
    rows : list of dict
        CSV rows of complete cells (all variants present).
    traces : Path
        Folder of the trace files.

    Returns
    -------
    list of dict
        One dict per run with the key columns, ``sweeps_<thr>``/``seconds_<thr>`` (NaN when never
        reached), ``final_gap`` (relative distance of its final bound to the best) and the run's row.
    """
    cells: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for row in rows:
        cell = tuple(row[name] for name in _KEY_FIELDS if name != "variant")
        cells.setdefault(cell, []).append(row)
    out = []
    for members in cells.values():
        if len(members) < len(VARIANTS):
            continue
        best = max(float(row["final_elbo"]) for row in members)
        for row in members:
            with np.load(traces / row["trace_file"]) as trace:
                elbo, seconds = trace["elbo"], trace["seconds"]
            entry: dict[str, Any] = {**row, "final_gap": (best - float(row["final_elbo"])) / abs(best)}
            for threshold in THRESHOLDS:
                hit = first_within(elbo, best, threshold)
                entry[f"sweeps_{threshold:g}"] = math.nan if hit is None else hit
                entry[f"seconds_{threshold:g}"] = math.nan if hit is None else float(seconds[hit - 1])
            out.append(entry)
    return out


def _median(values: list[float]) -> float:
    """Median ignoring NaN (NaN if nothing is left)."""
    finite = [v for v in values if not math.isnan(v)]
    return float(np.median(finite)) if finite else math.nan


def _fmt(value: float, digits: int = 0) -> str:
    """A number for the tables; '–' for NaN."""
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def _ratio_text(slow: list[float], fast: list[float]) -> str:
    """Median of per-trial ratios slow/fast; '>' when the slow run never got there within max_iter."""
    ratios = [s / f for s, f in zip(slow, fast) if not (math.isnan(s) or math.isnan(f))]
    unreached = sum(1 for s, f in zip(slow, fast) if math.isnan(s) and not math.isnan(f))
    text = _fmt(float(np.median(ratios)), 1) + "×" if ratios else "–"
    return text + (f" ({unreached} never)" if unreached else "")


def _group(
    entries: list[dict[str, Any]], dataset: int, k: int, prior: str, ratio: float, variant: str
) -> list[dict[str, Any]]:
    """The runs of one (data set, K, prior, noise ratio, variant), ordered by trial."""
    chosen = [e for e in entries if e["dataset"] == str(dataset) and e["n_components"] == str(k)
              and e["prior"] == prior and e["init_noise_ratio"] == str(ratio) and e["variant"] == variant]
    return sorted(chosen, key=lambda e: int(e["trial"]))


_SUMMARY_METRICS = ("sweeps_0.001", "seconds_0.001", "sweeps_0.0001", "seconds_0.0001", "active_components",
                    "final_gap", "test_rmse")


def _cell_lines(entries: list[dict[str, Any]], dataset: int, k: int, prior: str, ratio: float) -> tuple[str, str] | None:
    """The speed-table and pruning-table lines of one (data set, K, prior, noise ratio), or None if incomplete."""
    groups = {v: _group(entries, dataset, k, prior, ratio, v) for v in VARIANTS}
    if not all(groups.values()):
        return None
    col = {v: {f: [float(e[f]) for e in g] for f in _SUMMARY_METRICS} for v, g in groups.items()}
    med = {v: {f: _median(vals) for f, vals in c.items()} for v, c in col.items()}
    fewer = sum(a < b for a, b in zip(col["start1"]["active_components"], col["start5"]["active_components"]))
    head = f"| {dataset} | {k} | {prior} | {ratio:g} |"
    speed = (f"{head} {len(groups['none'])} | {' / '.join(_fmt(med[v]['sweeps_0.001']) for v in VARIANTS)} | "
             f"{_ratio_text(col['none']['sweeps_0.001'], col['start5']['sweeps_0.001'])} | "
             f"{_fmt(med['none']['seconds_0.001'], 3)} / {_fmt(med['start5']['seconds_0.001'], 3)} | "
             f"{_fmt(med['none']['sweeps_0.0001'])} / {_fmt(med['start5']['sweeps_0.0001'])} | "
             f"{_fmt(med['none']['seconds_0.0001'], 3)} / {_fmt(med['start5']['seconds_0.0001'], 3)} |")
    prune = (f"{head} {' / '.join(_fmt(med[v]['active_components'], 1) for v in VARIANTS)} | "
             f"{' / '.join(_fmt(1e4 * med[v]['final_gap'], 2) for v in VARIANTS)} | "
             f"{' / '.join(_fmt(med[v]['test_rmse'], 3) for v in VARIANTS)} | {fewer} of {len(groups['start1'])} |")
    return speed, prune


def summary_markdown(config: Config, entries: list[dict[str, Any]]) -> str:
    """Markdown with the speed table and the pruning table.

    Parameters
    ----------
    config : Config
    entries : list of dict
        Output of :func:`convergence_rows`.

    Returns
    -------
    str
    """
    speed = ["| data set | K | prior | init noise | trials | sweeps to 1e-3: none / start5 / start1 | "
             "speed-up (start5) | seconds to 1e-3: none / start5 | sweeps to 1e-4: none / start5 | "
             "seconds to 1e-4: none / start5 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    prune = ["| data set | K | prior | init noise | active: none / start5 / start1 | "
             "final gap ×1e4: none / start5 / start1 | RMSE: none / start5 / start1 | start1 fewer active than start5 |",
             "|---|---|---|---|---|---|---|---|"]
    for ratio in config.init_noise_ratios:
        for prior in config.priors:
            for dataset in config.datasets:
                for k in config.components:
                    lines = _cell_lines(entries, dataset, k, prior, ratio)
                    if lines is not None:
                        speed.append(lines[0])
                        prune.append(lines[1])
    intro = (
        f"# vbfa-transform: Luttinen & Ilin §4.1\n\n"
        f"N = {config.n_samples}, D = {config.n_features}, {100 * config.missing_fraction:g} % held out; "
        f"{config.trials} trials (seeds {config.seed}…{config.seed + config.trials - 1}); at most "
        f"{config.max_iter} sweeps, stop at relative change ≤ {config.tol:g}. \"init noise\" = initial noise "
        f"variance / column variance (small = the paper's \"τ large\"). Medians over trials. \"1e-3\" = first "
        f"sweep whose bound is within 1e-3 (relative) of the best final bound of the three runs of the trial; "
        f"\"–\" = never within the sweep budget. Speed-up = median over trials of sweeps(none)/sweeps(start5). "
        f"Paper: about 10× on data sets 1–2, growing with K, little effect on data set 3.\n\n"
        f"## Convergence speed\n\n"
    )
    pruning = (
        "\n\n## Early transformations and pruning\n\n"
        "Active components = columns of F̄ not pruned by ARD; final gap = relative distance of the run's final "
        "bound to the best of its trial (×1e4); RMSE on the held-out entries.\n\n"
    )
    return intro + "\n".join(speed) + pruning + "\n".join(prune) + "\n"


def _plot_band(ax: Any, config: Config, entries: list[dict[str, Any]], dataset: int, field: str) -> None:
    """Median and min–max over trials of ``field`` against K, one line per variant (first prior and ratio)."""
    styles = {"none": ("k", ":"), "start5": ("tab:red", "-"), "start1": ("tab:blue", "--")}
    prior, ratio = config.priors[0], config.init_noise_ratios[0]
    for variant, (color, style) in styles.items():
        ks, meds, lows, highs = [], [], [], []
        for k in config.components:
            values = [float(e[field]) for e in _group(entries, dataset, k, prior, ratio, variant)]
            finite = [v for v in values if not math.isnan(v)]
            if finite:
                ks.append(k)
                meds.append(float(np.median(finite)))
                lows.append(min(finite))
                highs.append(max(finite))
        if ks:
            ax.plot(ks, meds, color=color, linestyle=style, marker="o", label=variant)
            ax.fill_between(ks, lows, highs, color=color, alpha=0.15)
    ax.set_yscale("log")
    ax.set_xlabel("K")
    ax.set_title(f"data set {dataset} ({prior}, init noise {ratio:g})")


def plot_summary(config: Config, entries: list[dict[str, Any]], path: Path) -> None:
    """Sweeps and seconds to 1e-3 against K per data set (median and range over trials), like the paper's Fig. 2.

    Parameters
    ----------
    config : Config
    entries : list of dict
    path : Path
        PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(config.datasets), figsize=(4.4 * len(config.datasets), 6.5), squeeze=False)
    for col, dataset in enumerate(config.datasets):
        for row, (field, label) in enumerate((("sweeps_0.001", "sweeps to 1e-3"), ("seconds_0.001", "seconds to 1e-3"))):
            _plot_band(axes[row][col], config, entries, dataset, field)
            axes[row][col].set_ylabel(label)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
    from onlinefa.errors import CommandError

    try:
        config = config_from_args(args)
    except ValueError as err:
        raise CommandError(str(err)) from None
    out = output_dir(config.out)
    traces = output_dir(out / "traces")
    csv_path = out / "vbfa_transform.csv"
    done = read_rows(csv_path)
    todo = [cell for cell in _cells(config)
            if not all(any(_same_key(row, _cell_key(config, cell, v)) for row in done) for v in VARIANTS)]
    for cell in progress(todo, total=len(todo), desc=NAME):
        append_rows(csv_path, _run_cell(config, traces, cell), _FIELDS)
    mine = [row for row in read_rows(csv_path) if _belongs(config, row)]
    entries = convergence_rows(mine, traces)
    summary_fields = [*_FIELDS, "final_gap", *(f"{m}_{t:g}" for t in THRESHOLDS for m in ("sweeps", "seconds"))]
    summary_path = out / "vbfa_transform_summary.csv"
    summary_path.unlink(missing_ok=True)
    append_rows(summary_path, entries, summary_fields)
    text = summary_markdown(config, entries)
    (out / "vbfa_transform.md").write_text(text)
    plot_summary(config, entries, out / "vbfa_transform.png")
    print(text)
    return 0
