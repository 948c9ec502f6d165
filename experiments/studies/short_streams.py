"""Accuracy of the default OnlineEM on short streams, with and without its reporting shrinkage (``shrink``).

Two tables of the relative covariance error ||Σ̂ − Σ||_F / ||Σ||_F (lower is better):

1. the synthetic stream of ``onlinefa demo`` (D = 1000, K = 10, spectrum [1, 100], seed 0) at T = 20 … 20,000:
   the default OnlineEM, the same with ``shrink=False`` (the fit as it is), thesis Algorithm 2, and the
   exact maximum-likelihood FA of the same first T samples (batch EM, to T = 1,000);
2. mean over seeds 0–9 at T = 1,000 and 2,000 for D = 1000 and the spectra [1, 100] and [1, 1000], the cells
   where the unshrunk fit loses to Algorithm 2.

Run: ``python experiments/studies/short_streams.py`` (a few minutes on two cores).
"""

from __future__ import annotations

import argparse

import numpy as np

import onlinefa
from onlinefa._demo_batch import batch_fa
from onlinefa.datasets import make_fa_model, sample_fa
from onlinefa.metrics import relative_covariance_distance

STREAM_T = (20, 50, 100, 200, 500, 1_000, 5_000, 20_000)
BATCH_T_MAX = 1_000
SEED_T = (1_000, 2_000)


def _models(d: int, k: int, seed: int) -> dict[str, onlinefa.OnlineEM]:
    return {
        "default (shrink=True)": onlinefa.OnlineEM(d, k, seed=seed),
        "shrink=False": onlinefa.OnlineEM(d, k, seed=seed, shrink=False),
        "Algorithm 2": onlinefa.OnlineEM.algorithm2(d, k, seed=seed),
    }


def _errors(d: int, k: int, spectrum: tuple[float, float], seed: int, checkpoints: tuple[int, ...],
            with_batch: bool) -> dict[str, list[float]]:
    c, f, psi = make_fa_model(d, k, spectrum=spectrum, seed=seed)
    truth = f @ f.T + np.diag(psi)
    x = sample_fa(c, f, psi, checkpoints[-1], seed=seed + 1)
    models = _models(d, k, seed)
    out: dict[str, list[float]] = {name: [] for name in models}
    out["batch ML FA"] = []
    done = 0
    for t in checkpoints:
        for name, model in models.items():
            model.update(x[done:t])
            out[name].append(relative_covariance_distance(model.covariance(), truth))
        done = t
        if with_batch and t <= BATCH_T_MAX:
            first = x[:t]
            fit = batch_fa(np.cov(first, rowvar=False, bias=True), k, seed=seed)
            out["batch ML FA"].append(relative_covariance_distance(fit.covariance(), truth))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="seeds of the second table (default 10)")
    args = parser.parse_args()

    print("Demo stream: D=1000, K=10, spectrum [1, 100], seed 0")
    print(f"{'method':<24}" + "".join(f"{f'T={t:,}':>10}" for t in STREAM_T))
    for name, errors in _errors(1000, 10, (1.0, 100.0), 0, STREAM_T, True).items():
        cells = [f"{e:>10.3f}" for e in errors] + [f"{'-':>10}"] * (len(STREAM_T) - len(errors))
        print(f"{name:<24}" + "".join(cells))

    print(f"\nD=1000, K=10, mean over seeds 0-{args.seeds - 1}")
    print(f"{'spectrum':<12}{'method':<24}" + "".join(f"{f'T={t:,}':>10}" for t in SEED_T))
    for spectrum in ((1.0, 100.0), (1.0, 1000.0)):
        runs = [_errors(1000, 10, spectrum, s, SEED_T, False) for s in range(args.seeds)]
        for name in runs[0]:
            if name == "batch ML FA":
                continue
            mean = np.mean([r[name] for r in runs], axis=0)
            label = f"[1, {spectrum[1]:g}]"
            print(f"{label:<12}{name:<24}" + "".join(f"{e:>10.4f}" for e in mean))


if __name__ == "__main__":
    main()
