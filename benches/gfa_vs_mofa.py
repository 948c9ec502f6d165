"""onlinefa.GFA against MOFA+ (``mofapy2``) on the synthetic groups of ``onlinefa experiment gfa``.

Both fit the same data (N = 300; three feature groups — MOFA's "views" — of 10, 15 and 20 features; 4 true
factors with a known group × factor pattern; noise precisions 4, 1, 9) with K = 8 at the start, ARD over
groups × factors and inactive factors dropped. MOFA+ runs with spike-and-slab off (so that its model is
GFA's: per-view ARD on the weights, per-feature noise) and ``dropR2`` = onlinefa's ``drop_tol``; onlinefa
runs with its defaults and with ``noise="feature"`` (MOFA+'s per-feature noise). Reported per method: median
seconds over the seeds, the ratio to onlinefa, factors kept, how many seeds recover the activity pattern
(active = variance share > 2%), and the median relative error of the per-group noise precision.

mofapy2 is never a dependency of onlinefa: install it in a separate environment and pass its interpreter,

    python -m venv /tmp/mofa && /tmp/mofa/bin/pip install mofapy2
    python benches/gfa_vs_mofa.py --mofa-python /tmp/mofa/bin/python

MOFA+ runs in that interpreter as a subprocess (timed inside it, excluding its import).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from onlinefa import GFA
from onlinefa.experiments.gfa import PATTERN, SIZES, TAUS, pattern_recovered, synthetic

K = 8
DROP = 1e-3

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


def run_mofa(python: str, x: np.ndarray, seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.npy"
        np.save(path, x)
        args = [python, "-c", MOFA_DRIVER, str(path), json.dumps(list(SIZES)), str(K), str(DROP), str(seed)]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    result["activity"] = np.array(result["activity"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mofa-python", required=True, help="interpreter of an environment with mofapy2")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    rows: dict[str, list[dict[str, object]]] = {"onlinefa GFA": [], "onlinefa GFA (noise='feature')": [], "MOFA+ (mofapy2)": []}
    for seed in range(args.seeds):
        x = synthetic(seed)
        rows["onlinefa GFA"].append(run_onlinefa(x, seed, "group"))
        rows["onlinefa GFA (noise='feature')"].append(run_onlinefa(x, seed, "feature"))
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
