"""onlinefa.GFA against MOFA+ (``mofapy2``) on synthetic group factor data.

Two tables. (1) The synthetic groups of ``onlinefa experiment gfa`` (N = 300; three feature groups — MOFA's
"views" — of 10, 15 and 20 features; 4 true factors with a known group × factor pattern; noise precisions
4, 1, 9), K = 8 at the start. (2) ``--designs``: several designs (different group counts, sizes, noise
levels and N; ``DESIGNS``), 20 seeds each, with onlinefa's default, onlinefa without the bound-checked
pruning (``bound_pruning=False``, the fit before it existed), onlinefa with a larger initial noise ratio
(diagnostic), and MOFA+. Both fit with ARD over groups × factors and drop inactive factors. MOFA+ runs with
spike-and-slab off (so that its model is GFA's: per-view ARD on the weights, per-feature noise) and
``dropR2`` = onlinefa's ``drop_tol``; onlinefa runs with its defaults (and in table 1 with
``noise="feature"``, MOFA+'s per-feature noise). Reported per method: median seconds, factors kept (or how
often the true number), how many seeds recover the activity pattern (active = variance share > 2%, up to a
permutation of the factors), and in table 1 the median relative error of the per-group noise precision.

mofapy2 is never a dependency of onlinefa: install it at benchmark time, into this environment or a separate
one, and pass its interpreter (without ``--mofa-python`` the MOFA+ rows are left out),

    python -m venv /tmp/mofa && /tmp/mofa/bin/pip install mofapy2
    python experiments/studies/gfa_vs_mofa.py --mofa-python /tmp/mofa/bin/python [--designs]

MOFA+ runs in that interpreter as a subprocess (timed inside it, excluding its import).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from onlinefa import GFA
from onlinefa_experiments.gfa import PATTERN, SIZES, TAUS, pattern_recovered, synthetic

K = 8
DROP = 1e-3
SEEDS_PER_DESIGN = 20

#: name -> group sizes, noise precisions, N, true group x factor pattern, K at the start.
DESIGNS: dict[str, dict[str, object]] = {
    "A: 3 groups 25/35/20, tau 0.5/2/8, N = 300, K = 8": dict(
        sizes=(25, 35, 20), taus=(0.5, 2.0, 8.0), n=300, pattern=[[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 0]], k=8),
    "A12: design A with K = 12": dict(
        sizes=(25, 35, 20), taus=(0.5, 2.0, 8.0), n=300, pattern=[[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 0]], k=12),
    "B: 2 groups 50/50, tau 1/1, N = 200, K = 8": dict(
        sizes=(50, 50), taus=(1.0, 1.0), n=200, pattern=[[1, 1, 0], [1, 0, 1]], k=8),
    "C: 5 groups 10/20/30/15/25, tau 1/4/0.5/2/8, N = 500, K = 10": dict(
        sizes=(10, 20, 30, 15, 25), taus=(1.0, 4.0, 0.5, 2.0, 8.0), n=500,
        pattern=[[1, 1, 0, 0, 1], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [0, 0, 1, 1, 0], [1, 0, 0, 0, 1]], k=10),
    "D: 3 groups 30/30/30, tau 1/1/1, N = 100, K = 8": dict(
        sizes=(30, 30, 30), taus=(1.0, 1.0, 1.0), n=100, pattern=[[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 0]], k=8),
    "E: 3 groups 40/20/60, tau 0.25/1/4, N = 1000, K = 8": dict(
        sizes=(40, 20, 60), taus=(0.25, 1.0, 4.0), n=1000, pattern=[[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 0]], k=8),
}


def design_data(seed: int, sizes: tuple[int, ...], taus: tuple[float, ...], n: int, pattern: list[list[int]]) -> np.ndarray:
    """N rows: standard-normal factors, N(0, 1) loadings on the active (group, factor) cells, Gaussian noise
    of precision tau_m in group m."""
    active = np.asarray(pattern, dtype=float)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, active.shape[1]))
    blocks = []
    for m, d in enumerate(sizes):
        w = rng.standard_normal((active.shape[1], d)) * active[m][:, None]
        blocks.append(z @ w + rng.standard_normal((n, d)) / np.sqrt(taus[m]))
    return np.hstack(blocks)


def design_recovered(activity: np.ndarray, pattern: list[list[int]]) -> bool:
    """Active cells (share > 2%) equal the pattern up to a permutation of the factors."""
    truth = np.asarray(pattern, dtype=bool)
    found = np.asarray(activity) > 0.02
    if found.shape != truth.shape:
        return False
    return any(np.array_equal(found[:, list(p)], truth) for p in itertools.permutations(range(truth.shape[1])))

MOFA_DRIVER = r"""
import json, sys, time
import numpy as np
from mofapy2.run.entry_point import entry_point
x = np.load(sys.argv[1]); sizes = json.loads(sys.argv[2]); k = int(sys.argv[3]); drop = float(sys.argv[4])
seed = int(sys.argv[5])
views = np.split(x, np.cumsum(sizes)[:-1], axis=1)
start = time.perf_counter()
ent = entry_point()
ent.set_data_options(scale_views=False)
ent.set_data_matrix([[v] for v in views], likelihoods=["gaussian"] * len(views))
ent.set_model_options(factors=k, spikeslab_weights=False, ard_weights=True)
ent.set_train_options(iter=5000, convergence_mode="medium", dropR2=drop, seed=seed, quiet=True, verbose=False)
ent.build()
ent.run()
seconds = time.perf_counter() - start
nodes = ent.model.getNodes()
w = nodes["W"].getExpectation()          # list of (D_m, K)
w2 = nodes["W"].getExpectations()        # dicts with E and E2
z = nodes["Z"].getExpectation()          # (N, K)
tau = nodes["Tau"].getExpectation()      # list of (N, D_m) or (D_m,)
power = (z ** 2).mean(0)
activity = [list(power * np.asarray(e["E2"]).sum(0) / v.var(0).sum()) for e, v in zip(w2, views)]
tau_group = [float(np.mean(np.asarray(t))) for t in tau]
print(json.dumps(dict(seconds=seconds, activity=activity, tau=tau_group, kept=int(z.shape[1]),
                      iterations=int(len(ent.model.getTrainingStats()["elbo"])) if hasattr(ent.model, "getTrainingStats") else -1)))
"""


def run_onlinefa(x: np.ndarray, seed: int, noise: str) -> dict[str, object]:
    start = time.perf_counter()
    fit = GFA(K, list(SIZES), noise=noise, drop_tol=DROP, max_iter=5000, tol=1e-8, random_state=seed).fit(x)
    seconds = time.perf_counter() - start
    groups = np.repeat(np.arange(len(SIZES)), SIZES)
    tau = [float(np.mean(fit.noise_precision_[groups == m])) for m in range(len(SIZES))] if noise == "feature" \
        else fit.noise_precision_.tolist()  # fmt: skip
    return dict(seconds=seconds, activity=fit.activity_, tau=tau, kept=fit.n_components_, iterations=fit.n_iter_)


def run_mofa(python: str, x: np.ndarray, seed: int, sizes: tuple[int, ...] = SIZES, k: int = K) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.npy"
        np.save(path, x)
        args = [python, "-c", MOFA_DRIVER, str(path), json.dumps(list(sizes)), str(k), str(DROP), str(seed)]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    result["activity"] = np.array(result["activity"])
    return result


def designs_table(mofa_python: str | None, seeds: int, mofa_seeds: int) -> None:
    """Table (2): factor count and pattern recovery over ``seeds`` seeds of every design (MOFA+, much slower,
    on the first ``mofa_seeds`` of them)."""
    methods: dict[str, dict[str, object] | None] = {
        "onlinefa GFA (default)": {},
        "onlinefa GFA, bound_pruning=False": {"bound_pruning": False},
        "onlinefa GFA, bound_pruning=False, init_noise_ratio=0.5": {"bound_pruning": False, "init_noise_ratio": 0.5},
    }
    if mofa_python is not None:
        methods["MOFA+ (mofapy2)"] = None
    print(f"\n{seeds} seeds per design; 'K right' = seeds ending with the true number of factors, "
          "'pattern' = seeds recovering the group x factor pattern")
    print("| design | method | K right | K too large | K too small | pattern | median seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, design in DESIGNS.items():
        sizes, k, pattern = design["sizes"], int(design["k"]), design["pattern"]  # type: ignore[call-overload]
        truth = len(pattern[0])  # type: ignore[index]
        for label, options in methods.items():
            kept, found, seconds = [], 0, []
            n_seeds = seeds if options is not None else min(seeds, mofa_seeds)
            for seed in range(n_seeds):
                x = design_data(seed, sizes, design["taus"], int(design["n"]), pattern)  # type: ignore[arg-type, call-overload]
                if options is None:
                    result = run_mofa(mofa_python, x, seed, tuple(sizes), k)  # type: ignore[arg-type]
                    kept.append(int(result["kept"]))  # type: ignore[call-overload]
                    activity = np.asarray(result["activity"])
                    seconds.append(float(result["seconds"]))  # type: ignore[arg-type]
                else:
                    start = time.perf_counter()
                    fit = GFA(k, list(sizes), random_state=seed, **options).fit(x)  # type: ignore[call-overload, arg-type]
                    seconds.append(time.perf_counter() - start)
                    kept.append(fit.n_components_)
                    activity = fit.activity_
                found += design_recovered(activity, pattern)  # type: ignore[arg-type]
            right = sum(c == truth for c in kept)
            over = sum(c > truth for c in kept)
            print(f"| {name} | {label} | {right}/{n_seeds} | {over} | {n_seeds - right - over} | {found}/{n_seeds} | "
                  f"{np.median(seconds):.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mofa-python", default=None, help="interpreter of an environment with mofapy2")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--designs", action="store_true", help=f"table (2): the designs, {SEEDS_PER_DESIGN} seeds each")
    parser.add_argument("--mofa-seeds", type=int, default=SEEDS_PER_DESIGN, help="seeds per design for MOFA+ in (2)")
    args = parser.parse_args()
    if args.designs:
        designs_table(args.mofa_python, SEEDS_PER_DESIGN, args.mofa_seeds)
        return
    rows: dict[str, list[dict[str, object]]] = {"onlinefa GFA": [], "onlinefa GFA (noise='feature')": []}
    if args.mofa_python is not None:
        rows["MOFA+ (mofapy2)"] = []
    for seed in range(args.seeds):
        x = synthetic(seed)
        rows["onlinefa GFA"].append(run_onlinefa(x, seed, "group"))
        rows["onlinefa GFA (noise='feature')"].append(run_onlinefa(x, seed, "feature"))
        if args.mofa_python is not None:
            rows["MOFA+ (mofapy2)"].append(run_mofa(args.mofa_python, x, seed))
    base = float(np.median([r["seconds"] for r in rows["onlinefa GFA"]]))  # type: ignore[misc]
    print(f"synthetic GFA data, {args.seeds} seeds, K = {K} at the start (truth: 4 factors, pattern {PATTERN.astype(int).tolist()}, tau {TAUS.tolist()})")
    print("| method | median seconds | ratio to onlinefa | iterations (median) | factors kept | pattern recovered | median rel. error of tau_m |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, runs in rows.items():
        seconds = float(np.median([r["seconds"] for r in runs]))  # type: ignore[misc]
        kept = sorted({int(r["kept"]) for r in runs})  # type: ignore[call-overload]
        found = sum(pattern_recovered(np.asarray(r["activity"])) for r in runs)
        err = float(np.median([np.abs(np.asarray(r["tau"]) / TAUS - 1).max() for r in runs]))
        its = float(np.median([float(r["iterations"]) for r in runs]))  # type: ignore[arg-type]
        print(f"| {name} | {seconds:.3f} | {seconds / base:.1f} | {its:.0f} | {kept} | {found}/{len(runs)} | {err:.3f} |")


if __name__ == "__main__":
    main()
