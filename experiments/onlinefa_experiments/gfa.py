"""``gfa``: group factor analysis on synthetic groups with a known activity pattern, and on digit images.

(a) Synthetic: N = 300 samples of 3 groups (10, 15, 20 features) from 4 factors with the group × factor
activity pattern [[1,1,0,1],[1,0,1,0],[1,1,1,0]] and noise precisions τ = (4, 1, 9); GFA with K = 8
(ARD prunes the rest), with and without the rotation. Reported per seed: factors kept, whether the active
cells (variance share > 2%) equal the true pattern up to a permutation of the factors, E[τ_m] against the
truth, and the sweeps/seconds until the bound is within 1e-4 relative of its best final value.

(b) scikit-learn's 8×8 digits split into the top and bottom halves (two groups of 32 pixels): GFA fitted
on the training images predicts the bottom half of test images from their top half, against
scikit-learn's CCA and ridge regression (RidgeCV) on the same split. Reported: test mean squared error
per pixel and R², and for GFA the calibration of its predictive variance (mean of squared error /
variance, 1 for calibrated).

(c) Groups = the parameter tensors of a small network: the SGD iterates of an MLP (the ``swag``
experiment's training loop) grouped by tensor, streamed through OnlineGFA and fitted by batch GFA; which
factors are shared across tensors (``_gfa_layers.py``). Needs PyTorch (the ``torch`` extra); without it
this part is skipped with a message.

Outputs in ``--out``: ``gfa.md`` (the tables), ``gfa_activity.png`` (heat maps of the share of each
group's variance explained by each factor: true and recovered synthetic pattern, digit halves) and, with
PyTorch, ``gfa_layers.png`` (the same for the network's tensors).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ._common import output_dir

if TYPE_CHECKING:  # imported where a model is built: the CLI lists this experiment without scikit-learn
    from onlinefa.gfa import GFA

NAME = "gfa"
HELP = "group factor analysis: synthetic activity pattern, rotation speed-up, digits halves vs CCA/ridge"

FloatArray = NDArray[np.float64]

PATTERN = np.array([[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 0]], dtype=float)
TAUS = np.array([4.0, 1.0, 9.0])
SIZES = (10, 15, 20)
ACTIVE_SHARE = 0.02
THRESHOLD = 1e-4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the experiment's options."""
    parser.add_argument("--out", default="results/gfa", help="output directory (default: results/gfa)")
    parser.add_argument("--seeds", type=int, default=5, help="synthetic data sets (default: 5)")
    parser.add_argument("--n-components", type=int, default=8, help="initial K of the synthetic fits (default: 8)")
    parser.add_argument("--digits-components", type=int, default=32, help="initial K for the digits (default: 32)")
    parser.add_argument("--max-iter", type=int, default=5000, help="sweep limit of the synthetic fits (default: 5000)")
    parser.add_argument("--quick", action="store_true",
                        help="2 seeds, 300 sweeps, K = 8 and one CCA for the digits, a short network run (smoke test)")  # fmt: skip


def synthetic(seed: int, n: int = 300) -> FloatArray:
    """Data of part (a): 4 factors with the activity PATTERN and noise precisions TAUS."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, PATTERN.shape[1]))
    blocks = []
    for m, d in enumerate(SIZES):
        w = rng.standard_normal((PATTERN.shape[1], d)) * PATTERN[m][:, None]
        blocks.append(z @ w + rng.standard_normal((n, d)) / np.sqrt(TAUS[m]))
    return np.hstack(blocks)


def pattern_recovered(activity: FloatArray) -> bool:
    """Active cells equal PATTERN up to a permutation of the factors."""
    found = activity > ACTIVE_SHARE
    if found.shape != PATTERN.shape:
        return False
    return any(np.array_equal(found[:, list(p)], PATTERN.astype(bool)) for p in itertools.permutations(range(4)))


def sweeps_to(model: GFA, best: float) -> tuple[int, float]:
    """First sweep (and its time) whose bound is within THRESHOLD relative of ``best``."""
    close = np.flatnonzero(best - model.elbo_ <= THRESHOLD * abs(best))
    if close.size == 0:
        return -1, float("nan")
    return int(close[0]) + 1, float(model.fit_time_[close[0]])


def run_synthetic(seeds: int, k: int, max_iter: int) -> tuple[list[dict[str, Any]], GFA]:
    """Part (a); returns the rows and the rotated fit of seed 0."""
    from onlinefa.gfa import GFA

    rows, first = [], None
    for seed in range(seeds):
        x = synthetic(seed)
        fits = {rot: GFA(k, list(SIZES), rotate=rot, max_iter=max_iter, tol=1e-9, random_state=seed).fit(x) for rot in (True, False)}
        best = max(float(f.elbo_[-1]) for f in fits.values())
        for rot, f in fits.items():
            n_sweeps, seconds = sweeps_to(f, best)
            rows.append(dict(seed=seed, rotate=rot, kept=f.n_components_, pattern=pattern_recovered(f.activity_),
                             tau=f.noise_precision_, sweeps=n_sweeps, seconds=seconds, total_sweeps=f.n_iter_,
                             elbo=float(f.elbo_[-1])))  # fmt: skip
        first = first or fits[True]
    assert first is not None
    return rows, first


def digits_halves() -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Top and bottom halves of scikit-learn's digits (pixels / 16), first 1200 images train, rest test."""
    from sklearn.datasets import load_digits

    images = load_digits().data / 16.0
    top, bottom = images[:, :32], images[:, 32:]
    return top[:1200], bottom[:1200], top[1200:], bottom[1200:]


def run_digits(k: int, cca_sizes: tuple[int, ...] = (5, 10, 20)) -> tuple[list[dict[str, Any]], GFA]:
    """Part (b): predict the bottom half from the top half."""
    from sklearn.cross_decomposition import CCA
    from sklearn.linear_model import RidgeCV

    from onlinefa.gfa import GFA

    top, bottom, top_test, bottom_test = digits_halves()
    rows = []

    def record(name: str, pred: FloatArray, seconds: float, extra: str = "") -> None:
        mse = float(np.mean((bottom_test - pred) ** 2))
        r2 = 1.0 - mse / float(np.mean((bottom_test - bottom[...].mean(0)) ** 2))
        rows.append(dict(method=name, mse=mse, r2=r2, seconds=seconds, note=extra))

    start = time.perf_counter()
    gfa = GFA(k, [32, 32], max_iter=3000, tol=1e-7, random_state=0).fit(np.hstack([top, bottom]))
    mean, var = gfa.predict_group(top_test, 1, return_var=True)
    calib = float(np.mean((bottom_test - mean) ** 2 / var))
    record("GFA", mean, time.perf_counter() - start,
           f"K kept {gfa.n_components_}, mean (error²/variance) = {calib:.2f}")  # fmt: skip
    for n_cca in cca_sizes:
        start = time.perf_counter()
        cca = CCA(n_components=n_cca, max_iter=2000).fit(top, bottom)
        record(f"CCA ({n_cca} components)", cca.predict(top_test), time.perf_counter() - start)
    start = time.perf_counter()
    ridge = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(top, bottom)
    record("ridge (RidgeCV)", ridge.predict(top_test), time.perf_counter() - start, f"alpha = {ridge.alpha_:g}")
    return rows, gfa


def aligned(activity: FloatArray) -> FloatArray:
    """The recovered activity with its factors permuted to best match PATTERN (then by total share)."""
    k = activity.shape[1]
    rest = [int(j) for j in np.argsort(-activity.sum(0))]
    best, best_score = list(range(min(k, 4))), -1.0
    for p in itertools.permutations(range(k), min(k, 4)):
        score = float((activity[:, list(p)] * (2 * PATTERN[:, : len(p)] - 1)).sum())
        if score > best_score:
            best, best_score = list(p), score
    return activity[:, best + [j for j in rest if j not in best]]


def heat_maps(synthetic_fit: GFA, digits_fit: GFA, path: Path) -> None:
    """PNG: true pattern and recovered synthetic activity (top), digit-halves activity (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    digits_order = np.argsort(-digits_fit.activity_.sum(0))
    groups = [f"group {m + 1} ({d})" for m, d in enumerate(SIZES)]
    panels = [
        ("synthetic: true active factors", PATTERN, groups, "{:.0f}"),
        ("synthetic: recovered share of group variance", aligned(synthetic_fit.activity_), groups, "{:.2f}"),
        ("digits: share of each half's variance per factor (sorted)", digits_fit.activity_[:, digits_order],
         ["top half", "bottom half"], "{:.2f}"),
    ]  # fmt: skip
    fig = plt.figure(figsize=(12, 6))
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 2])
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    for ax, (title, values, rows, fmt) in zip(axes, panels):
        im = ax.imshow(values, cmap="viridis", vmin=0, aspect="auto")
        ax.set_title(title, fontsize=10)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xticks(range(values.shape[1]), [str(i + 1) for i in range(values.shape[1])])
        ax.set_xlabel("factor")
        for (i, j), v in np.ndenumerate(values):
            color = "w" if v < 0.6 * values.max() else "k"
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7, color=color)
        fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(synth: list[dict[str, Any]], digits: list[dict[str, Any]]) -> str:
    """The markdown tables."""
    lines = ["## (a) synthetic: 3 groups, 4 true factors, K = 8 at the start", "",
             "| seed | rotation | factors kept | pattern recovered | E[τ] (truth 4, 1, 9) | sweeps to 1e-4 | seconds to 1e-4 | sweeps run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in synth:
        tau = ", ".join(f"{t:.3f}" for t in r["tau"])
        lines.append(f"| {r['seed']} | {'on' if r['rotate'] else 'off'} | {r['kept']} | {r['pattern']} | {tau} | "
                     f"{r['sweeps']} | {r['seconds']:.3f} | {r['total_sweeps']} |")  # fmt: skip
    # A run that never got within 1e-4 counts as its total sweeps (a lower bound).
    on, off = ([r["sweeps"] if r["sweeps"] > 0 else r["total_sweeps"] for r in synth if r["rotate"] is flag]
               for flag in (True, False))  # fmt: skip
    ratio = np.median(np.array(off, dtype=float) / np.array(on, dtype=float))
    lines += ["", f"Median sweeps to a 1e-4-relative bound: {np.median(on):.0f} with the rotation, {np.median(off):.0f} "
              f"without (median ratio {ratio:.1f}×; a run that never got there counts as its total sweeps).", "",
              "## (b) digits: predict the bottom half (32 pixels) from the top half, 597 test images", "",
              "| method | test MSE per pixel | R² | seconds | note |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in digits:
        lines.append(f"| {r['method']} | {r['mse']:.4f} | {r['r2']:.3f} | {r['seconds']:.2f} | {r['note']} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run the experiment; writes gfa.md and gfa_activity.png."""
    out = output_dir(args.out)
    seeds, max_iter, k_digits = (2, 300, 8) if args.quick else (args.seeds, args.max_iter, args.digits_components)
    synth, synthetic_fit = run_synthetic(seeds, args.n_components, max_iter)
    digits, digits_fit = run_digits(k_digits, (10,) if args.quick else (5, 10, 20))
    text = report(synth, digits)
    heat_maps(synthetic_fit, digits_fit, out / "gfa_activity.png")
    if importlib.util.find_spec("torch") is None:
        print("part (c), groups = network layers, skipped: PyTorch is not installed (pip install torch)")
    else:
        from . import _gfa_layers as layers

        names, sizes, n_iterates, fits = layers.fit_layers(pretrain=20, collect=10) if args.quick else layers.fit_layers()
        text += "\n" + layers.report(names, sizes, n_iterates, fits)
        layers.heat_map(names, sizes, fits, out / "gfa_layers.png")
    (out / "gfa.md").write_text(text)
    print(text)
    print(f"wrote {out / 'gfa.md'} and the heat maps in {out}")
    return 0
